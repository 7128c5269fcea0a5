/* cli_config.c — configuration files for the service binaries: one
 * "key = value" per line, keys being the long flags without "--". */
#include "ie_cli.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

static int push(char ***v, int *n, int *cap, const char *s)
{
    if (*n + 2 > *cap) {
        int c = *cap ? *cap * 2 : 32;
        char **p = realloc(*v, (size_t)c * sizeof *p);
        if (!p) return -1;
        *v = p;
        *cap = c;
    }
    if (!((*v)[(*n)++] = strdup(s))) return -1;
    (*v)[*n] = NULL;
    return 0;
}

int ie_cli_config_expand(int argc, char **argv, int *argc_out, char ***argv_out, char *err, size_t errcap)
{
    char **v = NULL;
    int n = 0, cap = 0, rc = -1;
    const char *path = NULL;
    FILE *f = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) {
                snprintf(err, errcap, "--config needs a file");
                return -1;
            }
            path = argv[i + 1];
        } else if (!strncmp(argv[i], "--config=", 9)) {
            path = argv[i] + 9;
        }
    }
    if (push(&v, &n, &cap, argc > 0 ? argv[0] : "ie") != 0) goto oom;
    if (path) {
        if (!(f = fopen(path, "r"))) {
            snprintf(err, errcap, "cannot read config file '%s'", path);
            goto cleanup;
        }
        char line[4096];
        int ln = 0;
        while (fgets(line, sizeof line, f)) {
            ln++;
            if (!strchr(line, '\n') && !feof(f)) {
                snprintf(err, errcap, "%s:%d: line too long", path, ln);
                goto cleanup;
            }
            char *hash = strchr(line, '#');
            if (hash) *hash = '\0';
            char *s = trim(line);
            if (!*s) continue;
            char *eq = strchr(s, '=');
            char *key = s, *val = NULL;
            if (eq) {
                *eq = '\0';
                key = trim(s);
                val = trim(eq + 1);
                size_t vl = strlen(val);
                if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') { /* "quoted value" */
                    val[vl - 1] = '\0';
                    val++;
                }
            }
            if (!*key || strspn(key, "abcdefghijklmnopqrstuvwxyz0123456789-_") != strlen(key)) {
                snprintf(err, errcap, "%s:%d: bad key '%s'", path, ln, key);
                goto cleanup;
            }
            char flag[256];
            snprintf(flag, sizeof flag, "--%s", key);
            for (char *p = flag; *p; p++)
                if (*p == '_') *p = '-';
            if (push(&v, &n, &cap, flag) != 0) goto oom;
            if (val && push(&v, &n, &cap, val) != 0) goto oom;
        }
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            i++;
            continue;
        }
        if (!strncmp(argv[i], "--config=", 9)) continue;
        if (push(&v, &n, &cap, argv[i]) != 0) goto oom;
    }
    *argc_out = n;
    *argv_out = v;
    v = NULL;
    rc = 0;
    goto cleanup;
oom:
    snprintf(err, errcap, "out of memory");
cleanup:
    if (f) fclose(f);
    if (v) ie_cli_config_free(n, v);
    return rc;
}

void ie_cli_config_free(int argc, char **argv)
{
    for (int i = 0; i < argc; i++) free(argv[i]);
    free(argv);
}

static volatile sig_atomic_t *g_stop_flag;
static void on_stop_signal(int sig)
{
    (void)sig;
    if (g_stop_flag) *g_stop_flag = 1;
}

void ie_cli_stop_on_signals(volatile sig_atomic_t *flag)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    g_stop_flag = flag;
    sa.sa_handler = on_stop_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* keygen_main.c — `ie-keygen`: make a CURVE key pair for the distributed
 * service (docs/PROTOCOL.md, "Security").
 *
 *     ie-keygen --dir DIR --name NAME [--force]
 *
 * Writes DIR/NAME.pub (public Z85 key, 0644) and DIR/NAME.key (secret Z85
 * key, 0600), creating DIR with mode 0700 when missing, and prints the
 * public key on stdout. Existing files are kept unless --force. A key's
 * role (worker or client) is where its .pub goes in the peers' authorized
 * directory (workers/ or clients/), as --help says.
 *
 * Exit codes: 0 ok, 1 failure (one line on stderr), 2 bad usage.
 */
#include "ie_status.h"
#include "ie_transport.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static int usage(const char *why)
{
    if (why) fprintf(stderr, "ie-keygen: %s\n", why);
    fprintf(stderr, "usage: ie-keygen --dir DIR --name NAME [--force]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *name = NULL;
    int force = 0;
    char path[4096], pub[41];

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) dir = argv[++i];
        else if (strcmp(argv[i], "--name") == 0 && i + 1 < argc) name = argv[++i];
        else if (strcmp(argv[i], "--force") == 0) force = 1;
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: ie-keygen --dir DIR --name NAME [--force]\n"
                   "Writes DIR/NAME.pub (public, 0644) and DIR/NAME.key (secret, 0600) and prints the public key.\n"
                   "Keys have roles, given by where the .pub is put in an --authorized directory:\n"
                   "  AUTH/workers/NAME.pub  may join the cluster as a worker (and reach other workers)\n"
                   "  AUTH/clients/NAME.pub  may send requests to the coordinator's client port\n"
                   "The coordinator's own .pub is what workers pass as --coordinator-key and clients as their\n"
                   "server key (docs/OPERATIONS.md, \"CURVE keys\").\n");
            return 0;
        } else {
            return usage("unknown or incomplete option");
        }
    }
    if (!dir || !*dir || !name || !*name) return usage("--dir and --name are required");
    if (strchr(name, '/') || name[0] == '.') return usage("--name must be a plain file name");

    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "ie-keygen: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    if (ie_keys_generate(dir, name, force) != IE_OK) {
        fprintf(stderr, "ie-keygen: %s\n", ie_error_last());
        return 1;
    }
    if ((size_t)snprintf(path, sizeof path, "%s/%s.pub", dir, name) >= sizeof path ||
        ie_keys_load(path, pub) != IE_OK) {
        fprintf(stderr, "ie-keygen: %s\n", ie_error_last());
        return 1;
    }
    printf("%s\n", pub);
    return 0;
}

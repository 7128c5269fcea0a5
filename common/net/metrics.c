/* metrics.c — the metrics registry and its Prometheus text rendering
 * (exposition format 0.0.4; see ie_metrics.h).
 *
 * Layout. A registry is a list of metrics in registration order; a metric is
 * a list of series, one per label value (a metric without a label has one
 * series, made at registration, so it renders as 0 before its first
 * update). Label values are few (status codes, worker ids), so series are
 * found by a linear scan.
 *
 * Locking. The registry mutex guards the metric list; each metric has its
 * own mutex guarding its series. Updates take only their metric's mutex, so
 * two hot counters never contend. Rendering takes the registry mutex, then
 * each metric's in turn (the only nesting: registry before metric).
 *
 * Duplicate registration returns the existing metric only when kind, label
 * key and (histograms) bounds all match: a caller that asked for another
 * label or other buckets would otherwise get series it did not expect.
 */
#define _GNU_SOURCE
#include "ie_metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef enum { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM } metric_kind_t;

static const char *const KIND_NAME[] = {"counter", "gauge", "histogram"};

typedef struct series {
    char *label;       /* label value; NULL for the metric without a label */
    double value;      /* counter / gauge                                  */
    uint64_t *buckets; /* histogram: [n_bounds + 1] per-bucket counts, not
                              cumulative (the last is (bound[n-1], +Inf])     */
    double sum;        /* histogram: sum of observations                   */
    uint64_t count;    /* histogram: number of observations                */
    struct series *next;
} series_t;

struct ie_metric {
    metric_kind_t kind;
    char *name, *help, *label_key; /* label_key NULL: no label */
    double *bounds;                /* histogram: [n_bounds] increasing, finite */
    int n_bounds;
    pthread_mutex_t mu; /* guards the series list and values */
    series_t *series, *series_tail;
    struct ie_metric *next;
};

struct ie_metrics {
    pthread_mutex_t mu; /* guards the metric list */
    ie_metric_t *head, *tail;
    double start_time; /* process start, seconds since the epoch */
};

/* ------------------------------------------------------------ helpers */

static int valid_name(const char *s, int allow_colon)
{
    if (!s || !*s) return 0;
    for (const char *p = s; *p; p++) {
        const char c = *p;
        const int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':');
        if (!alpha && !(p != s && c >= '0' && c <= '9')) return 0;
    }
    return 1;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static int str_eq(const char *a, const char *b) { return (!a && !b) || (a && b && strcmp(a, b) == 0); }

/* The process's start time from /proc: starttime (clock ticks after boot,
 * field 22 of /proc/self/stat) plus btime of /proc/stat. Falls back to
 * "now" (the registry's creation) where /proc is not there. */
static double process_start_time(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    double fallback = (double)now.tv_sec + (double)now.tv_nsec * 1e-9;

    double result = fallback;
    char line[1024];
    unsigned long long start_ticks = 0, btime = 0;
    int have_start = 0, have_btime = 0;
    FILE *f = fopen("/proc/self/stat", "r");
    if (f) {
        size_t n = fread(line, 1, sizeof line - 1, f);
        line[n] = '\0';
        fclose(f);
        /* comm (field 2) may hold spaces and parentheses: start after the last ')' */
        char *p = strrchr(line, ')');
        if (p) {
            p++;
            int field = 2;
            char *save = NULL;
            for (char *tok = strtok_r(p, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
                if (++field == 22) {
                    start_ticks = strtoull(tok, NULL, 10);
                    have_start = 1;
                    break;
                }
            }
        }
    }
    f = fopen("/proc/stat", "r");
    if (f) {
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "btime %llu", &btime) == 1) {
                have_btime = 1;
                break;
            }
        fclose(f);
    }
    const long hz = sysconf(_SC_CLK_TCK);
    if (have_start && have_btime && hz > 0) result = (double)btime + (double)start_ticks / (double)hz;
    return result;
}

static double resident_bytes(void)
{
    unsigned long long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    if (fscanf(f, "%llu %llu", &size, &resident) != 2) resident = 0;
    fclose(f);
    const long page = sysconf(_SC_PAGESIZE);
    return (double)resident * (double)(page > 0 ? page : 4096);
}

/* A Prometheus float: integers plainly, otherwise the shortest %g that
 * reads back as the same double (0.005, not 0.0050000000000000001). */
static void fmt_double(char *out, size_t cap, double v)
{
    if (isnan(v)) {
        snprintf(out, cap, "NaN");
    } else if (isinf(v)) {
        snprintf(out, cap, v > 0 ? "+Inf" : "-Inf");
    } else if (v == floor(v) && fabs(v) < 9007199254740992.0) { /* 2^53 */
        snprintf(out, cap, "%.0f", v);
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(out, cap, "%.*g", prec, v);
            if (strtod(out, NULL) == v) break;
        }
    }
}

/* Escape for HELP (backslash, newline) or, when quote is set, for a label
 * value (backslash, double quote, newline). */
static int append_escaped(ie_buf_t *b, const char *s, int quote)
{
    for (const char *p = s; *p; p++) {
        const char *esc = NULL;
        if (*p == '\\') esc = "\\\\";
        else if (*p == '\n') esc = "\\n";
        else if (quote && *p == '"') esc = "\\\"";
        int rc = esc ? ie_buf_append(b, esc, 2) : ie_buf_append(b, p, 1);
        if (rc != 0) return -1;
    }
    return 0;
}

/* "name{key="value"" plus, for buckets, ",le="x"", then "} v\n". The
 * braces are left out when there are no labels at all. */
static int append_sample(ie_buf_t *b, const char *name, const char *suffix, const char *key, const char *label,
                         const char *le, double v)
{
    char num[64];
    fmt_double(num, sizeof num, v);
    if (ie_buf_printf(b, "%s%s", name, suffix) != 0) return -1;
    if (key || le) {
        if (ie_buf_append(b, "{", 1) != 0) return -1;
        if (key) {
            if (ie_buf_printf(b, "%s=\"", key) != 0) return -1;
            if (append_escaped(b, label ? label : "", 1) != 0) return -1;
            if (ie_buf_append(b, "\"", 1) != 0) return -1;
        }
        if (le && ie_buf_printf(b, "%sle=\"%s\"", key ? "," : "", le) != 0) return -1;
        if (ie_buf_append(b, "}", 1) != 0) return -1;
    }
    return ie_buf_printf(b, " %s\n", num);
}

static int append_header(ie_buf_t *b, const char *name, const char *help, const char *type)
{
    if (ie_buf_printf(b, "# HELP %s ", name) != 0) return -1;
    if (append_escaped(b, help, 0) != 0) return -1;
    return ie_buf_printf(b, "\n# TYPE %s %s\n", name, type);
}

/* ------------------------------------------------------------ series */

static void series_free(series_t *s)
{
    while (s) {
        series_t *next = s->next;
        free(s->label);
        free(s->buckets);
        free(s);
        s = next;
    }
}

/* Make a series and append it to m (m->mu held or m not yet shared). NULL
 * when out of memory. */
static series_t *series_add(ie_metric_t *m, const char *label)
{
    series_t *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (label && !(s->label = strdup(label))) goto fail;
    if (m->kind == KIND_HISTOGRAM && !(s->buckets = calloc((size_t)m->n_bounds + 1, sizeof *s->buckets))) goto fail;
    if (m->series_tail) m->series_tail->next = s;
    else m->series = s;
    m->series_tail = s;
    return s;
fail:
    series_free(s);
    return NULL;
}

/* The series for `label` (m->mu held), made on first use. A metric without
 * a label ignores `label`; one with a label takes NULL as "". NULL only when
 * out of memory. */
static series_t *series_get(ie_metric_t *m, const char *label)
{
    if (!m->label_key) return m->series;
    if (!label) label = "";
    for (series_t *s = m->series; s; s = s->next)
        if (strcmp(s->label, label) == 0) return s;
    return series_add(m, label);
}

/* ------------------------------------------------------------ registry */

/* Contract: *out receives a new empty registry the caller owns (free with
 * ie_metrics_destroy). IE_ERR_NOMEM on failure (*out NULL). */
ie_status_t ie_metrics_new(ie_metrics_t **out)
{
    ie_status_t st = IE_OK;
    ie_metrics_t *m = NULL;
    if (!out) return ie_error_set(IE_ERR_INVAL, "ie_metrics_new: out is NULL");
    *out = NULL;
    m = calloc(1, sizeof *m);
    if (!m) {
        st = ie_error_set(IE_ERR_NOMEM, "metrics: out of memory");
        goto cleanup;
    }
    pthread_mutex_init(&m->mu, NULL);
    m->start_time = process_start_time();
    *out = m;
    m = NULL;
cleanup:
    free(m);
    return st;
}

static void metric_free(ie_metric_t *x)
{
    if (!x) return;
    series_free(x->series);
    pthread_mutex_destroy(&x->mu);
    free(x->name);
    free(x->help);
    free(x->label_key);
    free(x->bounds);
    free(x);
}

/* Contract: frees the registry and every metric it holds (their pointers
 * become invalid); *m_p is set to NULL. Accepts NULL and *m_p == NULL. No
 * server may still be serving it. */
void ie_metrics_destroy(ie_metrics_t **m_p)
{
    if (!m_p || !*m_p) return;
    ie_metrics_t *m = *m_p;
    for (ie_metric_t *x = m->head; x;) {
        ie_metric_t *next = x->next;
        metric_free(x);
        x = next;
    }
    pthread_mutex_destroy(&m->mu);
    free(m);
    *m_p = NULL;
}

static int same_bounds(const ie_metric_t *x, const double *bounds, int n)
{
    if (x->n_bounds != n) return 0;
    for (int i = 0; i < n; i++)
        if (x->bounds[i] != bounds[i]) return 0;
    return 1;
}

/* Validate and register (or find) a metric. For histograms, bounds/n_bounds
 * have already been checked and a trailing +Inf dropped. */
static ie_status_t metric_register(ie_metrics_t *m, metric_kind_t kind, const char *name, const char *help,
                                   const char *label_key, const double *bounds, int n_bounds, ie_metric_t **out)
{
    ie_status_t st = IE_OK;
    ie_metric_t *x = NULL;
    int locked = 0;

    if (!m || !out) return ie_error_set(IE_ERR_INVAL, "metrics: registry or out is NULL");
    *out = NULL;
    if (!valid_name(name, 1)) {
        st = ie_error_set(IE_ERR_INVAL, "metrics: bad metric name '%s'", name ? name : "(null)");
        goto cleanup;
    }
    if (strcmp(name, "process_resident_memory_bytes") == 0 || strcmp(name, "process_start_time_seconds") == 0) {
        st = ie_error_set(IE_ERR_INVAL, "metrics: %s is exported by every registry already", name);
        goto cleanup;
    }
    if (label_key && (!valid_name(label_key, 0) || strncmp(label_key, "__", 2) == 0 ||
                      (kind == KIND_HISTOGRAM && strcmp(label_key, "le") == 0))) {
        st = ie_error_set(IE_ERR_INVAL, "metrics: bad label name '%s' for %s", label_key, name);
        goto cleanup;
    }

    pthread_mutex_lock(&m->mu);
    locked = 1;
    for (ie_metric_t *e = m->head; e; e = e->next) {
        if (strcmp(e->name, name) != 0) continue;
        if (e->kind != kind || !str_eq(e->label_key, label_key) ||
            (kind == KIND_HISTOGRAM && !same_bounds(e, bounds, n_bounds))) {
            st = ie_error_set(IE_ERR_INVAL, "metrics: %s is already registered as a %s with label '%s'%s", name,
                              KIND_NAME[e->kind], e->label_key ? e->label_key : "(none)",
                              e->kind == KIND_HISTOGRAM ? " and other buckets" : "");
            goto cleanup;
        }
        *out = e;
        goto cleanup;
    }

    x = calloc(1, sizeof *x);
    if (!x) goto nomem;
    pthread_mutex_init(&x->mu, NULL);
    x->kind = kind;
    x->n_bounds = n_bounds;
    if (!(x->name = strdup(name)) || !(x->help = strdup(help ? help : ""))) goto nomem;
    if (label_key && !(x->label_key = dup_or_null(label_key))) goto nomem;
    if (n_bounds > 0) {
        if (!(x->bounds = malloc((size_t)n_bounds * sizeof *x->bounds))) goto nomem;
        memcpy(x->bounds, bounds, (size_t)n_bounds * sizeof *x->bounds);
    }
    if (!label_key && !series_add(x, NULL)) goto nomem;

    if (m->tail) m->tail->next = x;
    else m->head = x;
    m->tail = x;
    *out = x;
    x = NULL;
    goto cleanup;

nomem:
    st = ie_error_set(IE_ERR_NOMEM, "metrics: out of memory registering %s", name);
cleanup:
    if (locked) pthread_mutex_unlock(&m->mu);
    metric_free(x);
    return st;
}

/* Contract: see ie_metrics.h. *out is owned by the registry (valid until
 * ie_metrics_destroy). IE_ERR_INVAL for a bad name or label, or a name taken
 * by another kind / label key. */
ie_status_t ie_metrics_counter(ie_metrics_t *m, const char *name, const char *help, const char *label_key,
                               ie_metric_t **out)
{
    return metric_register(m, KIND_COUNTER, name, help, label_key, NULL, 0, out);
}

/* Contract: as ie_metrics_counter, for a gauge. */
ie_status_t ie_metrics_gauge(ie_metrics_t *m, const char *name, const char *help, const char *label_key,
                             ie_metric_t **out)
{
    return metric_register(m, KIND_GAUGE, name, help, label_key, NULL, 0, out);
}

/* Contract: as ie_metrics_counter, for a histogram with n_bounds (>= 0)
 * finite, strictly increasing upper bounds (a trailing +Inf is accepted and
 * dropped: it is always implied). The bounds are copied. */
ie_status_t ie_metrics_histogram(ie_metrics_t *m, const char *name, const char *help, const char *label_key,
                                 const double *bounds, int n_bounds, ie_metric_t **out)
{
    if (out) *out = NULL;
    if (n_bounds < 0 || (n_bounds > 0 && !bounds))
        return ie_error_set(IE_ERR_INVAL, "metrics: %s: bad bucket list", name ? name : "(null)");
    if (n_bounds > 0 && isinf(bounds[n_bounds - 1]) && bounds[n_bounds - 1] > 0) n_bounds--;
    for (int i = 0; i < n_bounds; i++) {
        if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
            return ie_error_set(IE_ERR_INVAL,
                                "metrics: %s: bucket bounds must be finite and strictly increasing "
                                "(bound %d)",
                                name ? name : "(null)", i);
    }
    return metric_register(m, KIND_HISTOGRAM, name, help, label_key, bounds, n_bounds, out);
}

/* ------------------------------------------------------------ updates */

/* Contract: adds v (>= 0; negative or NaN is ignored) to the counter's
 * series for `label`. On a gauge it adds any finite v (gauges go both ways).
 * Ignores NULL metrics and histograms. Out of memory for a new series drops
 * the update. */
void ie_metric_add(ie_metric_t *c, const char *label, double v)
{
    if (!c || c->kind == KIND_HISTOGRAM || isnan(v)) return;
    if (c->kind == KIND_COUNTER && v < 0) return;
    pthread_mutex_lock(&c->mu);
    series_t *s = series_get(c, label);
    if (s) s->value += v;
    pthread_mutex_unlock(&c->mu);
}

/* Contract: sets the gauge's series for `label` to v. Ignores NULL metrics
 * and anything but gauges. */
void ie_metric_set(ie_metric_t *g, const char *label, double v)
{
    if (!g || g->kind != KIND_GAUGE) return;
    pthread_mutex_lock(&g->mu);
    series_t *s = series_get(g, label);
    if (s) s->value = v;
    pthread_mutex_unlock(&g->mu);
}

/* Contract: records one observation v in the histogram's series for
 * `label` (the first bucket with v <= bound, else +Inf). NaN is ignored.
 * Ignores NULL metrics and anything but histograms. */
void ie_metric_observe(ie_metric_t *h, const char *label, double v)
{
    if (!h || h->kind != KIND_HISTOGRAM || isnan(v)) return;
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    pthread_mutex_lock(&h->mu);
    series_t *s = series_get(h, label);
    if (s) {
        s->buckets[i]++;
        s->sum += v;
        s->count++;
    }
    pthread_mutex_unlock(&h->mu);
}

/* ------------------------------------------------------------ rendering */

static int render_metric(ie_buf_t *b, ie_metric_t *x)
{
    if (append_header(b, x->name, x->help, KIND_NAME[x->kind]) != 0) return -1;
    for (series_t *s = x->series; s; s = s->next) {
        if (x->kind != KIND_HISTOGRAM) {
            if (append_sample(b, x->name, "", x->label_key, s->label, NULL, s->value) != 0) return -1;
            continue;
        }
        uint64_t cum = 0;
        char le[64];
        for (int i = 0; i <= x->n_bounds; i++) {
            cum += s->buckets[i];
            if (i < x->n_bounds) fmt_double(le, sizeof le, x->bounds[i]);
            else snprintf(le, sizeof le, "+Inf");
            if (append_sample(b, x->name, "_bucket", x->label_key, s->label, le, (double)cum) != 0) return -1;
        }
        if (append_sample(b, x->name, "_sum", x->label_key, s->label, NULL, s->sum) != 0) return -1;
        if (append_sample(b, x->name, "_count", x->label_key, s->label, NULL, (double)s->count) != 0) return -1;
    }
    return 0;
}

/* Contract: replaces out's contents with the exposition text of every
 * metric (registration order), then process_resident_memory_bytes and
 * process_start_time_seconds. out stays the caller's. IE_ERR_NOMEM when the
 * text does not fit in memory (out is then partial). */
ie_status_t ie_metrics_render(ie_metrics_t *m, ie_buf_t *out)
{
    ie_status_t st = IE_OK;
    if (!m || !out) return ie_error_set(IE_ERR_INVAL, "ie_metrics_render: NULL argument");
    ie_buf_reset(out);

    pthread_mutex_lock(&m->mu);
    for (ie_metric_t *x = m->head; x; x = x->next) {
        pthread_mutex_lock(&x->mu);
        int rc = render_metric(out, x);
        pthread_mutex_unlock(&x->mu);
        if (rc != 0) {
            st = ie_error_set(IE_ERR_NOMEM, "metrics: out of memory rendering %s", x->name);
            goto cleanup;
        }
    }
    if (append_header(out, "process_resident_memory_bytes", "Resident memory size in bytes.", "gauge") != 0 ||
        append_sample(out, "process_resident_memory_bytes", "", NULL, NULL, NULL, resident_bytes()) != 0 ||
        append_header(out, "process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                      "gauge") != 0 ||
        append_sample(out, "process_start_time_seconds", "", NULL, NULL, NULL, m->start_time) != 0) {
        st = ie_error_set(IE_ERR_NOMEM, "metrics: out of memory rendering process metrics");
        goto cleanup;
    }
cleanup:
    pthread_mutex_unlock(&m->mu);
    return st;
}

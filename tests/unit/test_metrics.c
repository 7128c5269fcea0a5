/* test_metrics.c — the metrics registry (ie_metrics.h): exact exposition
 * text, label escaping, registration rules, concurrent updates, the HTTP
 * server (a raw-socket GET), and `promtool check metrics` on the rendered
 * text. Meant to run under ThreadSanitizer too (make tsan). promtool comes
 * from the Debian prometheus package (scripts/setup.sh): missing is a
 * failure, not a skip.
 */
#define _GNU_SOURCE
#include "ie_metrics.h"

#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */

/* A registry shaped like the coordinator's: a labelled counter, a gauge, a
 * histogram, all with exactly representable values. Caller owns it. */
static ie_metrics_t *sample_registry(void)
{
    ie_metrics_t *m = NULL;
    ie_metric_t *req = NULL, *kv = NULL, *step = NULL;
    static const double bounds[] = {0.005, 0.25, 1};
    if (ie_metrics_new(&m) != IE_OK) return NULL;
    if (ie_metrics_counter(m, "ie_requests_total", "Requests finished, by status.", "status", &req) != IE_OK ||
        ie_metrics_gauge(m, "ie_kv_used_ratio", "KV cache slots in use.", NULL, &kv) != IE_OK ||
        ie_metrics_histogram(m, "ie_step_seconds", "Step time.", NULL, bounds, 3, &step) != IE_OK) {
        ie_metrics_destroy(&m);
        return NULL;
    }
    ie_metric_add(req, "ok", 1);
    ie_metric_add(req, "error", 1);
    ie_metric_add(req, "ok", 2);
    ie_metric_set(kv, NULL, 0.25);
    ie_metric_observe(step, NULL, 0.001953125); /* 2^-9: first bucket */
    ie_metric_observe(step, NULL, 0.125);
    ie_metric_observe(step, NULL, 0.125);
    ie_metric_observe(step, NULL, 4); /* +Inf only */
    return m;
}

static const char SAMPLE_TEXT[] = "# HELP ie_requests_total Requests finished, by status.\n"
                                  "# TYPE ie_requests_total counter\n"
                                  "ie_requests_total{status=\"ok\"} 3\n"
                                  "ie_requests_total{status=\"error\"} 1\n"
                                  "# HELP ie_kv_used_ratio KV cache slots in use.\n"
                                  "# TYPE ie_kv_used_ratio gauge\n"
                                  "ie_kv_used_ratio 0.25\n"
                                  "# HELP ie_step_seconds Step time.\n"
                                  "# TYPE ie_step_seconds histogram\n"
                                  "ie_step_seconds_bucket{le=\"0.005\"} 1\n"
                                  "ie_step_seconds_bucket{le=\"0.25\"} 3\n"
                                  "ie_step_seconds_bucket{le=\"1\"} 3\n"
                                  "ie_step_seconds_bucket{le=\"+Inf\"} 4\n"
                                  "ie_step_seconds_sum 4.251953125\n"
                                  "ie_step_seconds_count 4\n";

/* The value on the line that starts with `prefix` (after a newline or at
 * the start of text); -1 when there is no such line. */
static double line_value(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, prefix, n) == 0) return strtod(p + n, NULL);
    return -1;
}

/* ------------------------------------------------------------ exposition */

static void test_exposition_exact(void)
{
    ie_metrics_t *m = sample_registry();
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    ie_buf_t b = {0};
    CU_ASSERT_EQUAL_FATAL(ie_metrics_render(m, &b), IE_OK);
    CU_ASSERT_EQUAL(strncmp(b.data, SAMPLE_TEXT, strlen(SAMPLE_TEXT)), 0);
    if (strncmp(b.data, SAMPLE_TEXT, strlen(SAMPLE_TEXT)) != 0) fprintf(stderr, "\n--- got:\n%s", b.data);

    /* the process metrics follow, with plausible values */
    const char *rest = b.data + strlen(SAMPLE_TEXT);
    CU_ASSERT_PTR_NOT_NULL(strstr(rest, "# HELP process_resident_memory_bytes "));
    CU_ASSERT_PTR_NOT_NULL(strstr(rest, "# TYPE process_resident_memory_bytes gauge\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(rest, "# TYPE process_start_time_seconds gauge\n"));
    double rss = line_value(rest, "process_resident_memory_bytes ");
    CU_ASSERT(rss > 100 * 1024 && rss < 64.0 * 1024 * 1024 * 1024);
    double start = line_value(rest, "process_start_time_seconds ");
    double now = (double)time(NULL);
    CU_ASSERT(start > now - 3600 && start <= now + 1);

    /* rendering again replaces, not appends; the text ends with a newline */
    size_t len = b.len;
    CU_ASSERT_EQUAL(ie_metrics_render(m, &b), IE_OK);
    CU_ASSERT(b.len >= len - 8 && b.len <= len + 8); /* only the RSS digits may differ */
    CU_ASSERT_EQUAL(b.data[b.len - 1], '\n');
    ie_buf_free(&b);
    ie_metrics_destroy(&m);
    CU_ASSERT_PTR_NULL(m);
    ie_metrics_destroy(&m); /* NULL is fine */
    ie_metrics_destroy(NULL);
}

static void test_unlabelled_defaults(void)
{
    ie_metrics_t *m = NULL;
    ie_metric_t *c = NULL, *g = NULL, *h = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_metrics_new(&m), IE_OK);
    CU_ASSERT_EQUAL(ie_metrics_counter(m, "ie_tokens_generated_total", "Tokens.", NULL, &c), IE_OK);
    CU_ASSERT_EQUAL(ie_metrics_gauge(m, "g", "", NULL, &g), IE_OK);
    CU_ASSERT_EQUAL(ie_metrics_histogram(m, "h_seconds", "H.", NULL, NULL, 0, &h), IE_OK);
    ie_buf_t b = {0};
    CU_ASSERT_EQUAL(ie_metrics_render(m, &b), IE_OK);
    /* unlabelled series exist (as 0) before the first update */
    CU_ASSERT_PTR_NOT_NULL(strstr(b.data, "\nie_tokens_generated_total 0\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(b.data, "# HELP g \n# TYPE g gauge\ng 0\n"));
    CU_ASSERT_PTR_NOT_NULL(
        strstr(b.data, "\nh_seconds_bucket{le=\"+Inf\"} 0\nh_seconds_sum 0\nh_seconds_count 0\n"));

    ie_metric_add(c, NULL, 5);
    ie_metric_add(c, NULL, -3);  /* counters never go down */
    ie_metric_add(c, "x", 1.5);  /* a label on an unlabelled metric is ignored */
    ie_metric_set(c, NULL, 100); /* set is for gauges only */
    ie_metric_set(g, NULL, -2.5);
    ie_metric_add(g, NULL, 1); /* gauges may add either way */
    ie_metric_add(g, NULL, -0.25);
    ie_metric_observe(h, NULL, 1e9);
    ie_metric_observe(c, NULL, 1); /* wrong kind: ignored */
    ie_metric_add(NULL, NULL, 1);  /* NULL metric: ignored */
    CU_ASSERT_EQUAL(ie_metrics_render(m, &b), IE_OK);
    CU_ASSERT_PTR_NOT_NULL(strstr(b.data, "\nie_tokens_generated_total 6.5\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(b.data, "\ng -1.75\n"));
    CU_ASSERT_PTR_NOT_NULL(
        strstr(b.data, "\nh_seconds_bucket{le=\"+Inf\"} 1\nh_seconds_sum 1000000000\nh_seconds_count 1\n"));
    ie_buf_free(&b);
    ie_metrics_destroy(&m);
}

static void test_labelled_histogram(void)
{
    ie_metrics_t *m = NULL;
    ie_metric_t *h = NULL, *g = NULL;
    static const double bounds[] = {0.1, 0.5, INFINITY}; /* a trailing +Inf is implied anyway */
    CU_ASSERT_EQUAL_FATAL(ie_metrics_new(&m), IE_OK);
    CU_ASSERT_EQUAL(ie_metrics_histogram(m, "ie_worker_step_seconds", "Per worker.", "worker", bounds, 3, &h),
                    IE_OK);
    CU_ASSERT_EQUAL(ie_metrics_gauge(m, "ie_worker_up", "Up.", "worker", &g), IE_OK);
    ie_buf_t b = {0};
    CU_ASSERT_EQUAL(ie_metrics_render(m, &b), IE_OK);
    /* a labelled metric has no series until a label value is used */
    CU_ASSERT_PTR_NOT_NULL(strstr(b.data, "# TYPE ie_worker_step_seconds histogram\n# HELP ie_worker_up Up.\n"));
    ie_metric_observe(h, "1", 0.1); /* le is inclusive */
    ie_metric_observe(h, "1", 0.3);
    ie_metric_observe(h, "0", 0.75);
    ie_metric_set(g, "1", 1);
    ie_metric_set(g, "0", 0);
    ie_metric_set(g, NULL, 1); /* NULL label value = "" */
    CU_ASSERT_EQUAL(ie_metrics_render(m, &b), IE_OK);
    const char *want = "# HELP ie_worker_step_seconds Per worker.\n"
                       "# TYPE ie_worker_step_seconds histogram\n"
                       "ie_worker_step_seconds_bucket{worker=\"1\",le=\"0.1\"} 1\n"
                       "ie_worker_step_seconds_bucket{worker=\"1\",le=\"0.5\"} 2\n"
                       "ie_worker_step_seconds_bucket{worker=\"1\",le=\"+Inf\"} 2\n"
                       "ie_worker_step_seconds_sum{worker=\"1\"} 0.4\n"
                       "ie_worker_step_seconds_count{worker=\"1\"} 2\n"
                       "ie_worker_step_seconds_bucket{worker=\"0\",le=\"0.1\"} 0\n"
                       "ie_worker_step_seconds_bucket{worker=\"0\",le=\"0.5\"} 0\n"
                       "ie_worker_step_seconds_bucket{worker=\"0\",le=\"+Inf\"} 1\n"
                       "ie_worker_step_seconds_sum{worker=\"0\"} 0.75\n"
                       "ie_worker_step_seconds_count{worker=\"0\"} 1\n"
                       "# HELP ie_worker_up Up.\n"
                       "# TYPE ie_worker_up gauge\n"
                       "ie_worker_up{worker=\"1\"} 1\n"
                       "ie_worker_up{worker=\"0\"} 0\n"
                       "ie_worker_up{worker=\"\"} 1\n";
    CU_ASSERT_EQUAL(strncmp(b.data, want, strlen(want)), 0);
    if (strncmp(b.data, want, strlen(want)) != 0) fprintf(stderr, "\n--- got:\n%s", b.data);
    ie_buf_free(&b);
    ie_metrics_destroy(&m);
}

static void test_escaping(void)
{
    ie_metrics_t *m = NULL;
    ie_metric_t *c = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_metrics_new(&m), IE_OK);
    CU_ASSERT_EQUAL(ie_metrics_counter(m, "esc_total", "Back\\slash, \"quotes\" and\na newline.", "v", &c), IE_OK);
    ie_metric_add(c, "a\"b\\c\nd", 1);
    ie_metric_add(c, "plain \xc3\xa9t\xc3\xa9", 2); /* UTF-8 passes through */
    ie_buf_t b = {0};
    CU_ASSERT_EQUAL(ie_metrics_render(m, &b), IE_OK);
    /* HELP escapes backslash and newline only; label values also the quote */
    CU_ASSERT_PTR_NOT_NULL(strstr(b.data, "# HELP esc_total Back\\\\slash, \"quotes\" and\\na newline.\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(b.data, "\nesc_total{v=\"a\\\"b\\\\c\\nd\"} 1\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(b.data, "\nesc_total{v=\"plain \xc3\xa9t\xc3\xa9\"} 2\n"));
    ie_buf_free(&b);
    ie_metrics_destroy(&m);
}

static void test_registration_rules(void)
{
    ie_metrics_t *m = NULL;
    ie_metric_t *a = NULL, *b = NULL, *h = NULL, *x = (ie_metric_t *)1;
    static const double bounds[] = {1, 2};
    static const double other[] = {1, 3};
    static const double unsorted[] = {2, 1};
    static const double dup[] = {1, 1};
    static const double nan_b[] = {NAN};
    CU_ASSERT_EQUAL_FATAL(ie_metrics_new(&m), IE_OK);
    CU_ASSERT_EQUAL(ie_metrics_counter(m, "c_total", "C.", "status", &a), IE_OK);
    /* same name, kind and label: the same metric */
    CU_ASSERT_EQUAL(ie_metrics_counter(m, "c_total", "other help", "status", &b), IE_OK);
    CU_ASSERT_PTR_EQUAL(a, b);
    /* same name, other kind or other label: refused, *out NULL, a reason */
    ie_error_clear();
    CU_ASSERT_EQUAL(ie_metrics_gauge(m, "c_total", "C.", "status", &x), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(x);
    CU_ASSERT(strlen(ie_error_last()) > 0);
    CU_ASSERT_EQUAL(ie_metrics_histogram(m, "c_total", "C.", "status", bounds, 2, &x), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_counter(m, "c_total", "C.", NULL, &x), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_counter(m, "c_total", "C.", "worker", &x), IE_ERR_INVAL);
    /* histograms: the same bounds find it, other bounds are refused */
    CU_ASSERT_EQUAL(ie_metrics_histogram(m, "h", "H.", NULL, bounds, 2, &h), IE_OK);
    CU_ASSERT_EQUAL(ie_metrics_histogram(m, "h", "H.", NULL, bounds, 2, &x), IE_OK);
    CU_ASSERT_PTR_EQUAL(h, x);
    CU_ASSERT_EQUAL(ie_metrics_histogram(m, "h", "H.", NULL, other, 2, &x), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_histogram(m, "h", "H.", NULL, bounds, 1, &x), IE_ERR_INVAL);
    /* bad bucket lists */
    CU_ASSERT_EQUAL(ie_metrics_histogram(m, "h2", "H.", NULL, unsorted, 2, &x), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_histogram(m, "h2", "H.", NULL, dup, 2, &x), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_histogram(m, "h2", "H.", NULL, nan_b, 1, &x), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_histogram(m, "h2", "H.", NULL, NULL, 2, &x), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_histogram(m, "h2", "H.", NULL, bounds, -1, &x), IE_ERR_INVAL);
    /* bad names and labels */
    const char *bad_names[] = {"", "1abc", "a-b", "a b", "é", NULL};
    for (int i = 0; i < 6; i++) CU_ASSERT_EQUAL(ie_metrics_counter(m, bad_names[i], "", NULL, &x), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_counter(m, "ns:sub_total", "", NULL, &x), IE_OK);     /* colons are fine */
    CU_ASSERT_EQUAL(ie_metrics_counter(m, "l1_total", "", "a:b", &x), IE_ERR_INVAL); /* not in labels */
    CU_ASSERT_EQUAL(ie_metrics_counter(m, "l2_total", "", "__reserved", &x), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_counter(m, "l3_total", "", "", &x), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_histogram(m, "l4", "", "le", bounds, 2, &x), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_gauge(m, "l5", "", "le", &x), IE_OK); /* le is only reserved in histograms */
    /* the built-in process metrics cannot be registered again */
    CU_ASSERT_EQUAL(ie_metrics_gauge(m, "process_resident_memory_bytes", "", NULL, &x), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_gauge(m, "process_start_time_seconds", "", NULL, &x), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_counter(NULL, "n_total", "", NULL, &x), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_counter(m, "n_total", "", NULL, NULL), IE_ERR_INVAL);
    /* nothing refused made it into the text */
    ie_buf_t buf = {0};
    CU_ASSERT_EQUAL(ie_metrics_render(m, &buf), IE_OK);
    CU_ASSERT_PTR_NULL(strstr(buf.data, "h2"));
    CU_ASSERT_PTR_NULL(strstr(buf.data, "l4"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf.data, "# HELP c_total C.\n")); /* first help wins */
    ie_buf_free(&buf);
    ie_metrics_destroy(&m);
}

/* ------------------------------------------------------------ threads */

#define N_THREADS 4
#define N_ITERS 20000

typedef struct {
    ie_metric_t *c, *cl, *g, *h;
    ie_metrics_t *m;
    int id;
} thread_arg_t;

static void *update_thread(void *p)
{
    thread_arg_t *a = p;
    char label[8];
    snprintf(label, sizeof label, "t%d", a->id % 2);
    for (int i = 0; i < N_ITERS; i++) {
        ie_metric_add(a->c, NULL, 1);
        ie_metric_add(a->cl, label, 0.5);
        ie_metric_add(a->g, NULL, a->id % 2 ? 1 : -1);
        ie_metric_observe(a->h, label, (double)(i % 4)); /* 0,1 -> le 1; 2 -> le 2; 3 -> +Inf */
    }
    return NULL;
}

static void *render_thread(void *p)
{
    thread_arg_t *a = p;
    ie_buf_t b = {0};
    for (int i = 0; i < 200; i++) ie_metrics_render(a->m, &b);
    ie_buf_free(&b);
    return NULL;
}

static void test_concurrent_updates(void)
{
    ie_metrics_t *m = NULL;
    static const double bounds[] = {1, 2};
    thread_arg_t base = {0};
    CU_ASSERT_EQUAL_FATAL(ie_metrics_new(&m), IE_OK);
    base.m = m;
    CU_ASSERT_EQUAL_FATAL(ie_metrics_counter(m, "conc_total", "C.", NULL, &base.c), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_metrics_counter(m, "conc_labelled_total", "C.", "t", &base.cl), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_metrics_gauge(m, "conc_gauge", "G.", NULL, &base.g), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_metrics_histogram(m, "conc_seconds", "H.", "t", bounds, 2, &base.h), IE_OK);

    pthread_t th[N_THREADS + 1];
    thread_arg_t args[N_THREADS + 1];
    for (int i = 0; i <= N_THREADS; i++) {
        args[i] = base;
        args[i].id = i;
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, i < N_THREADS ? update_thread : render_thread, &args[i]),
                              0);
    }
    for (int i = 0; i <= N_THREADS; i++) pthread_join(th[i], NULL);

    ie_buf_t b = {0};
    CU_ASSERT_EQUAL(ie_metrics_render(m, &b), IE_OK);
    CU_ASSERT_EQUAL(line_value(b.data, "conc_total "), (double)N_THREADS * N_ITERS);
    CU_ASSERT_EQUAL(line_value(b.data, "conc_labelled_total{t=\"t0\"} "), N_THREADS / 2 * N_ITERS * 0.5);
    CU_ASSERT_EQUAL(line_value(b.data, "conc_labelled_total{t=\"t1\"} "), N_THREADS / 2 * N_ITERS * 0.5);
    CU_ASSERT_EQUAL(line_value(b.data, "conc_gauge "), 0);
    const double per_label = N_THREADS / 2 * N_ITERS;
    CU_ASSERT_EQUAL(line_value(b.data, "conc_seconds_count{t=\"t0\"} "), per_label);
    CU_ASSERT_EQUAL(line_value(b.data, "conc_seconds_bucket{t=\"t1\",le=\"1\"} "), per_label / 2);
    CU_ASSERT_EQUAL(line_value(b.data, "conc_seconds_bucket{t=\"t1\",le=\"2\"} "), per_label * 3 / 4);
    CU_ASSERT_EQUAL(line_value(b.data, "conc_seconds_bucket{t=\"t1\",le=\"+Inf\"} "), per_label);
    CU_ASSERT_EQUAL(line_value(b.data, "conc_seconds_sum{t=\"t1\"} "), per_label / 4 * (0 + 1 + 2 + 3));
    ie_buf_free(&b);
    ie_metrics_destroy(&m);
}

/* ------------------------------------------------------------ HTTP */

/* Send `request` to 127.0.0.1:port and read the whole answer (the request
 * asks the server to close). Caller frees the result; NULL on failure. */
static char *http_raw(int port, const char *request)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return NULL;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    char *out = NULL;
    size_t len = 0, cap = 0;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) goto cleanup;
    size_t sent = 0, n = strlen(request);
    while (sent < n) {
        ssize_t w = send(fd, request + sent, n - sent, MSG_NOSIGNAL);
        if (w <= 0) goto cleanup;
        sent += (size_t)w;
    }
    for (;;) {
        if (cap - len < 4097) {
            cap = cap ? cap * 2 : 8192;
            char *p = realloc(out, cap);
            if (!p) goto cleanup;
            out = p;
        }
        ssize_t r = recv(fd, out + len, cap - len - 1, 0);
        if (r <= 0) break;
        len += (size_t)r;
    }
    if (out) out[len] = '\0';
cleanup:
    close(fd);
    return out;
}

static char *http_get(int port, const char *method, const char *path)
{
    char req[256];
    snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
             method, path);
    return http_raw(port, req);
}

static void test_http_server(void)
{
    ie_metrics_t *m = sample_registry();
    ie_metrics_server_t *s = NULL;
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL_FATAL(ie_metrics_serve(m, NULL, 0, &s), IE_OK);
    int port = ie_metrics_server_port(s);
    CU_ASSERT(port > 0 && port < 65536);

    char *r = http_get(port, "GET", "/metrics");
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    CU_ASSERT_EQUAL(strncmp(r, "HTTP/1.1 200", 12), 0);
    CU_ASSERT_PTR_NOT_NULL(strcasestr(r, "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
    const char *body = strstr(r, "\r\n\r\n");
    CU_ASSERT_PTR_NOT_NULL_FATAL(body);
    body += 4;
    CU_ASSERT_EQUAL(strncmp(body, SAMPLE_TEXT, strlen(SAMPLE_TEXT)), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(body, "\nprocess_resident_memory_bytes "));
    free(r);

    /* every scrape renders afresh */
    ie_metric_t *req = NULL;
    CU_ASSERT_EQUAL(ie_metrics_counter(m, "ie_requests_total", "", "status", &req), IE_OK);
    ie_metric_add(req, "ok", 1);
    r = http_get(port, "GET", "/metrics");
    CU_ASSERT(r && strstr(r, "\nie_requests_total{status=\"ok\"} 4\n"));
    free(r);

    r = http_get(port, "GET", "/");
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    CU_ASSERT_EQUAL(strncmp(r, "HTTP/1.1 404", 12), 0);
    free(r);
    r = http_get(port, "GET", "/metrics/x");
    CU_ASSERT(r && strncmp(r, "HTTP/1.1 404", 12) == 0);
    free(r);
    r = http_get(port, "POST", "/metrics");
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    CU_ASSERT_EQUAL(strncmp(r, "HTTP/1.1 405", 12), 0);
    CU_ASSERT_PTR_NOT_NULL(strcasestr(r, "\r\nAllow: GET, HEAD\r\n"));
    free(r);
    r = http_get(port, "DELETE", "/");
    CU_ASSERT(r && strncmp(r, "HTTP/1.1 405", 12) == 0);
    free(r);
    r = http_get(port, "HEAD", "/metrics"); /* headers only */
    CU_ASSERT(r && strncmp(r, "HTTP/1.1 200", 12) == 0 && !strstr(r, "# HELP"));
    free(r);
    /* HTTP/1.0 works too */
    r = http_raw(port, "GET /metrics HTTP/1.0\r\n\r\n");
    CU_ASSERT(r && strncmp(r, "HTTP/1.", 7) == 0 && strncmp(r + 8, " 200", 4) == 0 &&
              strstr(r, "# TYPE ie_step_seconds histogram\n"));
    free(r);

    /* the port is taken now: a second server on it fails cleanly */
    ie_metrics_server_t *s2 = NULL;
    fprintf(stderr, "\n(an 'address already in use' message from libmicrohttpd follows; it is expected)\n");
    CU_ASSERT_EQUAL(ie_metrics_serve(m, "127.0.0.1", port, &s2), IE_ERR_IO);
    CU_ASSERT_PTR_NULL(s2);

    ie_metrics_server_stop(&s);
    CU_ASSERT_PTR_NULL(s);
    ie_metrics_server_stop(&s); /* NULL is fine */
    ie_metrics_server_stop(NULL);
    CU_ASSERT_EQUAL(ie_metrics_server_port(NULL), -1);
    ie_metrics_destroy(&m);
}

static void test_http_bad_args(void)
{
    ie_metrics_t *m = NULL;
    ie_metrics_server_t *s = (ie_metrics_server_t *)1;
    CU_ASSERT_EQUAL_FATAL(ie_metrics_new(&m), IE_OK);
    CU_ASSERT_EQUAL(ie_metrics_serve(m, "localhost", 0, &s), IE_ERR_INVAL); /* a literal, not a name */
    CU_ASSERT_PTR_NULL(s);
    CU_ASSERT_EQUAL(ie_metrics_serve(m, "127.0.0.256", 0, &s), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_serve(m, NULL, -1, &s), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_serve(m, NULL, 65536, &s), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_metrics_serve(NULL, NULL, 0, &s), IE_ERR_INVAL);
    /* an explicit IPv4 address with port 0 */
    CU_ASSERT_EQUAL(ie_metrics_serve(m, "127.0.0.1", 0, &s), IE_OK);
    CU_ASSERT(ie_metrics_server_port(s) > 0);
    char *r = http_get(ie_metrics_server_port(s), "GET", "/metrics");
    CU_ASSERT(r && strncmp(r, "HTTP/1.1 200", 12) == 0);
    free(r);
    ie_metrics_server_stop(&s);
    ie_metrics_destroy(&m);
}

/* ------------------------------------------------------------ promtool */

static void test_promtool(void)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        CU_FAIL("promtool not found: install the prometheus package (scripts/setup.sh)");
        return;
    }
    ie_metrics_t *m = sample_registry();
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    ie_metric_t *c = NULL, *h = NULL, *g = NULL;
    static const double bounds[] = {0.001, 0.01, 0.1, 1, 10};
    CU_ASSERT_EQUAL(ie_metrics_counter(m, "ie_worker_compute_seconds_total", "Compute time per worker.", "worker",
                                       &c),
                    IE_OK);
    CU_ASSERT_EQUAL(ie_metrics_histogram(m, "ie_request_queue_seconds", "Queue wait.", "priority", bounds, 5, &h),
                    IE_OK);
    CU_ASSERT_EQUAL(ie_metrics_gauge(m, "ie_escape_test_ratio", "Odd \\ help\nover two lines.", "v", &g), IE_OK);
    ie_metric_add(c, "0", 1.25);
    ie_metric_add(c, "1", 3e-7);
    ie_metric_observe(h, "high", 0.05);
    ie_metric_observe(h, "low", 12);
    ie_metric_set(g, "a\"b\\c\nd", 0.5);
    ie_metric_set(g, "tiny", 1e-300);
    ie_metric_set(g, "huge", 1.5e300);

    ie_buf_t b = {0};
    CU_ASSERT_EQUAL_FATAL(ie_metrics_render(m, &b), IE_OK);
    char path[] = "/tmp/ie_metrics_XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_EQUAL(write(fd, b.data, b.len), (ssize_t)b.len);
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s", path);
    int rc = system(cmd);
    CU_ASSERT_EQUAL(rc, 0);
    if (rc != 0) fprintf(stderr, "\npromtool refused:\n%s", b.data);
    unlink(path);
    ie_buf_free(&b);
    ie_metrics_destroy(&m);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("metrics", NULL, NULL);
    CU_add_test(s, "exact exposition text", test_exposition_exact);
    CU_add_test(s, "unlabelled series and update rules", test_unlabelled_defaults);
    CU_add_test(s, "labelled histogram and gauge", test_labelled_histogram);
    CU_add_test(s, "HELP and label escaping", test_escaping);
    CU_add_test(s, "registration rules", test_registration_rules);
    CU_add_test(s, "4 threads update, 1 renders", test_concurrent_updates);
    CU_add_test(s, "HTTP server: /metrics, 404, 405", test_http_server);
    CU_add_test(s, "HTTP server: bad arguments", test_http_bad_args);
    CU_add_test(s, "promtool check metrics", test_promtool);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

/* ie_metrics.h — Prometheus metrics: a registry and a /metrics server.
 *
 * A registry holds counters, gauges and histograms (optionally with one
 * label, e.g. worker="1"); updates are thread-safe and cheap (atomics or a
 * short mutex). ie_metrics_render writes the Prometheus text exposition
 * format 0.0.4 (HELP/TYPE lines, _bucket{le=..}/_sum/_count for
 * histograms), which `promtool check metrics` accepts. Every registry also
 * exports process_resident_memory_bytes and process_start_time_seconds.
 *
 * ie_metrics_serve starts an HTTP server (libmicrohttpd, its own thread)
 * answering GET /metrics with the rendered registry (and 404 otherwise);
 * port 0 picks a free port (ie_metrics_server_port tells which).
 */
#ifndef IE_METRICS_H
#define IE_METRICS_H

#include "ie_buf.h"
#include "ie_status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ie_metrics ie_metrics_t;
typedef struct ie_metric ie_metric_t; /* owned by the registry */

ie_status_t ie_metrics_new(ie_metrics_t **out);
void ie_metrics_destroy(ie_metrics_t **m_p); /* accepts NULL */

/* Register a metric (name [a-zA-Z_:][a-zA-Z0-9_:]*, help text). label_key
 * NULL: no label; else each distinct label value is its own series, made on
 * first use. Histograms take n_bounds increasing upper bounds (+Inf is
 * implied). Registering a name twice returns the existing metric when the
 * kind matches, IE_ERR_INVAL otherwise. */
ie_status_t ie_metrics_counter(ie_metrics_t *m, const char *name, const char *help, const char *label_key,
                               ie_metric_t **out);
ie_status_t ie_metrics_gauge(ie_metrics_t *m, const char *name, const char *help, const char *label_key,
                             ie_metric_t **out);
ie_status_t ie_metrics_histogram(ie_metrics_t *m, const char *name, const char *help, const char *label_key,
                                 const double *bounds, int n_bounds, ie_metric_t **out);

/* Updates. label is the label's value (NULL when the metric has none).
 * Counters only grow (a negative add is ignored). */
void ie_metric_add(ie_metric_t *c, const char *label, double v);
void ie_metric_set(ie_metric_t *g, const char *label, double v);
void ie_metric_observe(ie_metric_t *h, const char *label, double v);

/* Write the exposition text into out (replacing it). */
ie_status_t ie_metrics_render(ie_metrics_t *m, ie_buf_t *out);

typedef struct ie_metrics_server ie_metrics_server_t;

/* Serve GET /metrics on addr:port ("127.0.0.1" or "0.0.0.0"; NULL =
 * loopback). The registry must outlive the server. */
ie_status_t ie_metrics_serve(ie_metrics_t *m, const char *addr, int port, ie_metrics_server_t **out);
int ie_metrics_server_port(const ie_metrics_server_t *s);
void ie_metrics_server_stop(ie_metrics_server_t **s_p); /* accepts NULL */

#endif

/* metrics_http.c — GET /metrics over HTTP with libmicrohttpd (see
 * ie_metrics.h).
 *
 * The daemon runs its own polling thread; every request renders the
 * registry afresh (a scrape every few seconds costs far less than keeping a
 * cached copy coherent). GET and HEAD on /metrics answer 200 with the
 * Prometheus text type, any other path 404, any other method 405 with an
 * Allow header. HEAD is accepted because HTTP requires it wherever GET is
 * (MHD leaves the body out by itself).
 */
#define _GNU_SOURCE
#include "ie_metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define IE_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct ie_metrics_server {
    struct MHD_Daemon *daemon;
    ie_metrics_t *reg; /* borrowed: must outlive the server */
    int port;
};

/* Queue a fixed text reply with `code`. */
static enum MHD_Result reply_text(struct MHD_Connection *conn, unsigned code, const char *text, int allow)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    ie_metrics_server_t *s = cls;
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)con_cls;

    /* Answered on the first call: a body (POST, PUT) is never read. */
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n", 1);
    if (strcmp(url, "/metrics") != 0) return reply_text(conn, MHD_HTTP_NOT_FOUND, "not found\n", 0);

    ie_buf_t buf = {0};
    if (ie_metrics_render(s->reg, &buf) != IE_OK || !buf.data) {
        ie_buf_free(&buf);
        return reply_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "rendering failed\n", 0);
    }
    /* MUST_FREE hands buf.data (malloc'd) to MHD, which free()s it. */
    struct MHD_Response *r = MHD_create_response_from_buffer(buf.len, buf.data, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        ie_buf_free(&buf);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, IE_METRICS_CONTENT_TYPE);
    enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* Contract: starts a server for `m` on addr:port (addr an IPv4 or IPv6
 * literal, NULL = 127.0.0.1; port 0..65535, 0 = any free port). *out
 * receives the server, owned by the caller (stop it with
 * ie_metrics_server_stop before destroying m). IE_ERR_INVAL for a bad
 * address or port, IE_ERR_IO when the daemon cannot start (port taken). */
ie_status_t ie_metrics_serve(ie_metrics_t *m, const char *addr, int port, ie_metrics_server_t **out)
{
    ie_status_t st = IE_OK;
    ie_metrics_server_t *s = NULL;
    struct sockaddr_storage ss;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;

    if (!out) return ie_error_set(IE_ERR_INVAL, "ie_metrics_serve: out is NULL");
    *out = NULL;
    if (!m) return ie_error_set(IE_ERR_INVAL, "ie_metrics_serve: registry is NULL");
    if (port < 0 || port > 65535) return ie_error_set(IE_ERR_INVAL, "metrics server: bad port %d", port);
    if (!addr || !*addr) addr = "127.0.0.1";

    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, addr, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
    } else if (inet_pton(AF_INET6, addr, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        flags |= MHD_USE_IPv6;
    } else {
        return ie_error_set(IE_ERR_INVAL, "metrics server: '%s' is not an IP address", addr);
    }

    s = calloc(1, sizeof *s);
    if (!s) {
        st = ie_error_set(IE_ERR_NOMEM, "metrics server: out of memory");
        goto cleanup;
    }
    s->reg = m;
    s->daemon = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
                                 (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (!s->daemon) {
        st = ie_error_set(IE_ERR_IO, "metrics server: cannot listen on %s:%d", addr, port);
        goto cleanup;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? (int)info->port : port;
    if (s->port == 0) {
        st = ie_error_set(IE_ERR_IO, "metrics server: cannot tell which port it bound");
        goto cleanup;
    }
    *out = s;
    s = NULL;
cleanup:
    if (s) {
        if (s->daemon) MHD_stop_daemon(s->daemon);
        free(s);
    }
    return st;
}

/* Contract: the TCP port the server listens on (the chosen one when it was
 * started with port 0); -1 for NULL. */
int ie_metrics_server_port(const ie_metrics_server_t *s) { return s ? s->port : -1; }

/* Contract: stops the daemon (waits for its thread and open connections),
 * frees the server and sets *s_p to NULL. Accepts NULL and *s_p == NULL. */
void ie_metrics_server_stop(ie_metrics_server_t **s_p)
{
    if (!s_p || !*s_p) return;
    MHD_stop_daemon((*s_p)->daemon);
    free(*s_p);
    *s_p = NULL;
}

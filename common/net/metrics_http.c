/* metrics_http.c — GET /metrics over HTTP (see ie_metrics.h).
 *
 * A scrape endpoint needs a sliver of HTTP: one request per connection, no
 * body, a text reply. Answering it on plain sockets keeps an HTTP server
 * library out of every process that exports metrics (ie-worker links none;
 * only the coordinator's OpenAI API uses libmicrohttpd).
 *
 * One thread polls the listening socket and a wake-up pipe; it answers each
 * connection in turn (scrapes come every few seconds; a client that sends
 * nothing is dropped after IE_METRICS_IO_TIMEOUT_S) and closes it. Every
 * request renders the registry afresh (a scrape costs far less than keeping
 * a cached copy coherent). GET and HEAD on /metrics answer 200 with the
 * Prometheus text type, any other path 404, any other method 405 with an
 * Allow header. HEAD is accepted because HTTP requires it wherever GET is;
 * its reply carries the headers only.
 */
#define _GNU_SOURCE
#include "ie_metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define IE_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define IE_METRICS_IO_TIMEOUT_S 10 /* a connection's read/write deadline */
#define IE_METRICS_HEAD_MAX 8192   /* request line + headers we accept    */

struct ie_metrics_server {
    ie_metrics_t *reg; /* borrowed: must outlive the server */
    int listen_fd;
    int wake[2]; /* pipe: a byte in wake[0] stops the thread */
    pthread_t thread;
    int port;
};

/* Send all n bytes (the peer may read slowly); 0 ok, -1 on error/timeout. */
static int send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Write one reply and its headers; the body is left out for HEAD. */
static void reply(int fd, int head_only, int code, const char *reason, const char *type, int allow,
                  const char *body, size_t body_len)
{
    char hdr[512];
    int n = snprintf(hdr, sizeof hdr,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n",
                     code, reason, type, body_len, allow ? "Allow: GET, HEAD\r\n" : "");
    if (n < 0 || (size_t)n >= sizeof hdr) return;
    if (send_all(fd, hdr, (size_t)n) != 0) return;
    if (!head_only && body_len) send_all(fd, body, body_len);
}

/* Read one request's head, answer it, close the connection. */
static void serve_one(ie_metrics_server_t *s, int fd)
{
    char req[IE_METRICS_HEAD_MAX + 1];
    size_t len = 0;
    struct timeval tv = { IE_METRICS_IO_TIMEOUT_S, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);

    /* The head ends at the first blank line; a body (POST, PUT) is never read. */
    while (len < IE_METRICS_HEAD_MAX) {
        ssize_t r = recv(fd, req + len, IE_METRICS_HEAD_MAX - len, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
        req[len] = '\0';
        if (strstr(req, "\r\n\r\n") || strstr(req, "\n\n")) break;
    }
    req[len] = '\0';
    char *sp1 = strchr(req, ' ');
    char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    char *eol = strchr(req, '\n');
    if (!sp1 || !sp2 || !eol || sp2 > eol) {
        static const char bad[] = "bad request\n";
        if (len > 0) reply(fd, 0, 400, "Bad Request", "text/plain; charset=utf-8", 0, bad, sizeof bad - 1);
        return;
    }
    *sp1 = '\0';
    *sp2 = '\0';
    const char *method = req, *path = sp1 + 1;
    char *query = strchr(sp1 + 1, '?'); /* the path is matched without its query */
    if (query) *query = '\0';
    int head_only = !strcmp(method, "HEAD");

    if (strcmp(method, "GET") != 0 && !head_only) {
        static const char body[] = "method not allowed\n";
        reply(fd, 0, 405, "Method Not Allowed", "text/plain; charset=utf-8", 1, body, sizeof body - 1);
        return;
    }
    if (strcmp(path, "/metrics") != 0) {
        static const char body[] = "not found\n";
        reply(fd, head_only, 404, "Not Found", "text/plain; charset=utf-8", 0, body, sizeof body - 1);
        return;
    }
    ie_buf_t buf = { 0 };
    if (ie_metrics_render(s->reg, &buf) != IE_OK || !buf.data) {
        static const char body[] = "rendering failed\n";
        reply(fd, head_only, 500, "Internal Server Error", "text/plain; charset=utf-8", 0, body, sizeof body - 1);
    } else {
        reply(fd, head_only, 200, "OK", IE_METRICS_CONTENT_TYPE, 0, (const char *)buf.data, buf.len);
    }
    ie_buf_free(&buf);
}

/* The server thread: accept and answer until a byte arrives on the pipe. */
static void *server_main(void *arg)
{
    ie_metrics_server_t *s = arg;
    for (;;) {
        struct pollfd p[2] = { { s->listen_fd, POLLIN, 0 }, { s->wake[0], POLLIN, 0 } };
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (p[1].revents) break;
        if (!(p[0].revents & POLLIN)) continue;
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue; /* the peer went away, or fds ran out for now */
        serve_one(s, fd);
        /* Half-close, then let the peer read the reply before the socket
         * goes: closing with unread request bytes would reset it. */
        shutdown(fd, SHUT_WR);
        struct timeval tv = { 0, 200 * 1000 };
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char sink[1024];
        for (int i = 0; i < 64 && recv(fd, sink, sizeof sink, 0) > 0; i++) {}
        close(fd);
    }
    return NULL;
}

/* Contract: starts a server for `m` on addr:port (addr an IPv4 or IPv6
 * literal, NULL = 127.0.0.1; port 0..65535, 0 = any free port). *out
 * receives the server, owned by the caller (stop it with
 * ie_metrics_server_stop before destroying m). IE_ERR_INVAL for a bad
 * address or port, IE_ERR_IO when the server cannot start (port taken). */
ie_status_t ie_metrics_serve(ie_metrics_t *m, const char *addr, int port, ie_metrics_server_t **out)
{
    ie_status_t st = IE_OK;
    ie_metrics_server_t *s = NULL;
    struct sockaddr_storage ss;
    socklen_t ss_len;

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
        ss_len = sizeof *in4;
    } else if (inet_pton(AF_INET6, addr, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        ss_len = sizeof *in6;
    } else {
        return ie_error_set(IE_ERR_INVAL, "metrics server: '%s' is not an IP address", addr);
    }

    s = calloc(1, sizeof *s);
    if (!s) return ie_error_set(IE_ERR_NOMEM, "metrics server: out of memory");
    s->reg = m;
    s->listen_fd = -1;
    s->wake[0] = s->wake[1] = -1;
    int one = 1;
    s->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s->listen_fd < 0 || setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(s->listen_fd, (struct sockaddr *)&ss, ss_len) != 0 || listen(s->listen_fd, 16) != 0) {
        st = ie_error_set(IE_ERR_IO, "metrics server: cannot listen on %s:%d: %s", addr, port, strerror(errno));
        goto cleanup;
    }
    struct sockaddr_storage bound;
    socklen_t bound_len = sizeof bound;
    if (getsockname(s->listen_fd, (struct sockaddr *)&bound, &bound_len) != 0) {
        st = ie_error_set(IE_ERR_IO, "metrics server: cannot tell which port it bound");
        goto cleanup;
    }
    s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    if (pipe2(s->wake, O_CLOEXEC) != 0) {
        st = ie_error_set(IE_ERR_IO, "metrics server: pipe: %s", strerror(errno));
        goto cleanup;
    }
    if (pthread_create(&s->thread, NULL, server_main, s) != 0) {
        st = ie_error_set(IE_ERR_IO, "metrics server: cannot start its thread");
        goto cleanup;
    }
    *out = s;
    s = NULL;
cleanup:
    if (s) {
        if (s->listen_fd >= 0) close(s->listen_fd);
        if (s->wake[0] >= 0) close(s->wake[0]);
        if (s->wake[1] >= 0) close(s->wake[1]);
        free(s);
    }
    return st;
}

/* Contract: the TCP port the server listens on (the chosen one when it was
 * started with port 0); -1 for NULL. */
int ie_metrics_server_port(const ie_metrics_server_t *s)
{
    return s ? s->port : -1;
}

/* Contract: stops the server (waits for its thread, which finishes the
 * connection it is answering), frees it and sets *s_p to NULL. Accepts NULL
 * and *s_p == NULL. */
void ie_metrics_server_stop(ie_metrics_server_t **s_p)
{
    if (!s_p || !*s_p) return;
    ie_metrics_server_t *s = *s_p;
    ssize_t w;
    do {
        w = write(s->wake[1], "x", 1);
    } while (w < 0 && errno == EINTR);
    pthread_join(s->thread, NULL);
    close(s->listen_fd);
    close(s->wake[0]);
    close(s->wake[1]);
    free(s);
    *s_p = NULL;
}

/* serve_http_gate.c — the acceptor in front of libmicrohttpd (see
 * serve_http_gate.h for why). One thread, one epoll set: the listening
 * socket (level-triggered), an eventfd to stop, and the connections whose
 * first request head is not complete yet. Those are edge-triggered: their
 * bytes are peeked (MSG_PEEK) and stay in the socket, so a level-triggered
 * set would report them readable forever; an edge comes with every new
 * segment, which is exactly when the head may have grown. */
#define _GNU_SOURCE
#include "serve_http_gate.h"

#include "ie_clock.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define GATE_TICK_MS 100          /* deadline checks                               */
#define GATE_LINGER_MS 1000       /* after a refusal: drain the client's bytes ... */
#define GATE_LINGER_MAX (1 << 20) /* ... at most this many                   */

/* ------------------------------------------------------------ the check */

static void head_err(ie_http_head_err_t *e, int status, const char *code, const char *fmt, const char *arg)
{
    e->status = status;
    e->code = code;
    snprintf(e->message, sizeof e->message, fmt, arg);
}

/* 1 when c may appear in a method (an RFC 9110 token). */
static int tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* Checks one complete request line l[0..n) (no line end); 0 or -1 (*e). */
static int check_request_line(const char *l, size_t n, int *v11, ie_http_head_err_t *e)
{
    const char *sp1 = memchr(l, ' ', n);
    size_t last = n;
    while (last > 0 && l[last - 1] != ' ') last--;
    if (!sp1 || sp1 == l) {
        head_err(e, 400, "malformed_request", "malformed request line: expected 'METHOD /path HTTP/1.1'%s", "");
        return -1;
    }
    for (const char *c = l; c < sp1; c++)
        if (!tchar((unsigned char)*c)) {
            head_err(e, 400, "malformed_request", "malformed request line: bad character in the method%s", "");
            return -1;
        }
    const char *ver = l + last;
    size_t vn = n - last;
    const char *t = sp1;
    while (t < ver && *t == ' ') t++;
    if (ver - 1 <= sp1 || t >= ver) { /* one space only, or no target between */
        head_err(e, 400, "malformed_request",
                 "malformed request line: expected 'METHOD /path HTTP/1.1' (the HTTP version is missing)%s", "");
        return -1;
    }
    if (vn == 8 && !memcmp(ver, "HTTP/1.", 7) && (ver[7] == '0' || ver[7] == '1')) {
        *v11 = ver[7] == '1';
        return 0;
    }
    if (vn >= 6 && !memcmp(ver, "HTTP/", 5)) {
        char v[16];
        snprintf(v, sizeof v, "%.*s", (int)(vn < 15 ? vn : 15), ver);
        for (char *c = v; *c; c++)
            if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e) *c = '?';
        head_err(e, 505, "http_version_not_supported", "HTTP version %s is not supported (HTTP/1.0 and 1.1 are)",
                 v);
        return -1;
    }
    head_err(e, 400, "malformed_request",
             "malformed request line: expected 'METHOD /path HTTP/1.1' (no HTTP version at its end)%s", "");
    return -1;
}

/* 1 when the header line l[0..n) is named name (case-insensitively). */
static int header_is(const char *l, size_t n, const char *name)
{
    size_t k = strlen(name);
    return n > k && l[k] == ':' && !strncasecmp(l, name, k);
}

/* Contract: see serve_http_gate.h. */
int ie_http_head_check(const char *p, size_t n, int full, int max_uri, int max_headers, ie_http_head_err_t *e)
{
    size_t i = 0;
    int line_no = 0, v11 = 0, host = 0;
    while (i < n && (p[i] == '\r' || p[i] == '\n')) i++; /* empty lines before a request are ignored */
    for (;;) {
        const char *nl = memchr(p + i, '\n', n - i);
        if (!nl) break;
        size_t len = (size_t)(nl - (p + i));
        const char *l = p + i;
        if (len > 0 && l[len - 1] == '\r') len--;
        i = (size_t)(nl - p) + 1;
        if (line_no++ == 0) {
            if (check_request_line(l, len, &v11, e) != 0) return -1;
            continue;
        }
        if (len == 0) { /* the end of the head */
            if (v11 && !host) {
                head_err(e, 400, "malformed_request", "an HTTP/1.1 request needs a Host header%s", "");
                return -1;
            }
            return 1;
        }
        if (l[0] == ' ' || l[0] == '\t') continue; /* a folded continuation line */
        const char *colon = memchr(l, ':', len);
        if (!colon || colon == l) {
            head_err(e, 400, "malformed_request", "malformed header line (no 'Name: value')%s", "");
            return -1;
        }
        if (header_is(l, len, "host")) host = 1;
        if (header_is(l, len, "content-length")) {
            const char *v = colon + 1, *end = l + len;
            while (v < end && (*v == ' ' || *v == '\t')) v++;
            while (end > v && (end[-1] == ' ' || end[-1] == '\t')) end--;
            int ok = v < end && end - v <= 18;
            for (const char *c = v; ok && c < end; c++) ok = *c >= '0' && *c <= '9';
            if (!ok) {
                head_err(e, 400, "malformed_request", "the Content-Length header is not a number%s", "");
                return -1;
            }
        }
    }
    if (!full) return 0;
    char lim[16];
    if (line_no == 0) {
        snprintf(lim, sizeof lim, "%d", max_uri);
        head_err(e, 414, "uri_too_long", "the request line is over its limit; at most %s bytes of URI are accepted",
                 lim);
    } else {
        snprintf(lim, sizeof lim, "%d", max_headers);
        head_err(e, 431, "headers_too_large",
                 "the request headers are over their limit; at most %s bytes are accepted", lim);
    }
    return -1;
}

static const char *reason(int status)
{
    switch (status) {
    case 400: return "Bad Request";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

/* Contract: see serve_http_gate.h. */
size_t ie_http_head_answer(const ie_http_head_err_t *e, char *buf, size_t cap)
{
    char body[320];
    /* the message is ours (no client bytes but a sanitized version): no
     * character needs escaping but these */
    char msg[sizeof e->message];
    size_t k = 0;
    for (const char *c = e->message; *c && k + 1 < sizeof msg; c++) msg[k++] = (*c == '"' || *c == '\\') ? '?' : *c;
    msg[k] = 0;
    int bn = snprintf(body, sizeof body,
                      "{\"error\": {\"message\": \"%s\", \"type\": \"invalid_request_error\", \"param\": null, "
                      "\"code\": \"%s\"}}",
                      msg, e->code);
    if (bn < 0 || (size_t)bn >= sizeof body) return 0;
    int n = snprintf(buf, cap,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     "Connection: close\r\n\r\n%s",
                     e->status, reason(e->status), bn, body);
    return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

/* ------------------------------------------------------------ the acceptor */

typedef struct slot {
    int fd;        /* -1: free */
    int lingering; /* answered: draining until EOF or the deadline */
    double t;      /* accepted (or, lingering: the answer went out) */
    size_t drained;
    struct sockaddr_storage sa;
    socklen_t len;
} slot_t;

struct ie_http_gate {
    ie_http_gate_opts_t o;
    int lfd, efd, ep;
    slot_t *slots;
    int n_slots, n_used;
    pthread_t th;
    int running;
    char peek[IE_HTTP_GATE_PEEK];
};

static int same_addr(const struct sockaddr_storage *a, const struct sockaddr *b)
{
    if (a->ss_family != b->sa_family) return 0;
    if (a->ss_family == AF_INET)
        return !memcmp(&((const struct sockaddr_in *)a)->sin_addr, &((const struct sockaddr_in *)b)->sin_addr,
                       sizeof(struct in_addr));
    if (a->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                       sizeof(struct in6_addr));
    return 0;
}

static void slot_close(ie_http_gate_t *g, slot_t *s)
{
    epoll_ctl(g->ep, EPOLL_CTL_DEL, s->fd, NULL);
    close(s->fd);
    s->fd = -1;
    g->n_used--;
}

/* Answer e, stop sending, and drain what the client still sends for a
 * moment: closing a socket with unread bytes resets the connection, and
 * the reset can destroy the answer before the client reads it. */
static void slot_refuse(ie_http_gate_t *g, slot_t *s, const ie_http_head_err_t *e)
{
    char buf[640];
    size_t n = ie_http_head_answer(e, buf, sizeof buf);
    if (n) (void)!send(s->fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL); /* small: fits the empty send buffer */
    if (g->o.on_answer) g->o.on_answer(g->o.ctx, e->status);
    if (g->o.verbose) fprintf(stderr, "http: refused a request head: %d %s\n", e->status, e->message);
    shutdown(s->fd, SHUT_WR);
    s->lingering = 1;
    s->t = ie_now_ms();
    s->drained = 0;
}

static void slot_drain(ie_http_gate_t *g, slot_t *s)
{
    for (;;) {
        ssize_t r = recv(s->fd, g->peek, sizeof g->peek, MSG_DONTWAIT);
        if (r > 0 && (s->drained += (size_t)r) < GATE_LINGER_MAX) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        slot_close(g, s); /* EOF, an error, or enough */
        return;
    }
}

/* New bytes on a connection whose head is not complete. */
static void slot_peek(ie_http_gate_t *g, slot_t *s)
{
    ssize_t r = recv(s->fd, g->peek, sizeof g->peek, MSG_PEEK | MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (r <= 0) { /* gone before its request */
        slot_close(g, s);
        return;
    }
    ie_http_head_err_t e = {0};
    int rc = ie_http_head_check(g->peek, (size_t)r, (size_t)r >= sizeof g->peek, g->o.max_uri, g->o.max_headers,
                                &e);
    if (rc < 0) {
        slot_refuse(g, s, &e);
        slot_drain(g, s);
    } else if (rc > 0) {
        int fd = s->fd;
        epoll_ctl(g->ep, EPOLL_CTL_DEL, fd, NULL);
        s->fd = -1;
        g->n_used--;
        g->o.admit(g->o.ctx, fd, (struct sockaddr *)&s->sa, s->len, s->t);
    }
}

static void accept_all(ie_http_gate_t *g)
{
    for (;;) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        int fd = accept4(g->lfd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return; /* EAGAIN, or out of descriptors: the next tick retries */
        }
        int n_addr = 0, total = g->o.held ? g->o.held(g->o.ctx, (struct sockaddr *)&sa, &n_addr) : 0;
        total += g->n_used;
        for (int i = 0; i < g->n_slots; i++)
            if (g->slots[i].fd >= 0 && same_addr(&g->slots[i].sa, (struct sockaddr *)&sa)) n_addr++;
        slot_t *s = NULL;
        if (total < g->o.max_conns && n_addr < g->o.max_conns_per_addr)
            for (int i = 0; i < g->n_slots && !s; i++)
                if (g->slots[i].fd < 0) s = &g->slots[i];
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET};
        if (s) ev.data.u64 = (uint64_t)(s - g->slots) + 2;
        if (!s || epoll_ctl(g->ep, EPOLL_CTL_ADD, fd, &ev) != 0) { /* over a limit: closed unanswered */
            close(fd);
            continue;
        }
        s->fd = fd;
        s->lingering = 0;
        s->t = ie_now_ms();
        s->sa = sa;
        s->len = len;
        g->n_used++;
        slot_peek(g, s); /* the request may be there already */
    }
}

static void *gate_main(void *arg)
{
    ie_http_gate_t *g = arg;
    struct epoll_event evs[64];
    for (;;) {
        int n = epoll_wait(g->ep, evs, 64, GATE_TICK_MS);
        int stop = 0;
        for (int i = 0; i < n; i++) {
            uint64_t k = evs[i].data.u64;
            if (k == 0) accept_all(g);
            else if (k == 1) stop = 1;
            else {
                slot_t *s = &g->slots[k - 2];
                if (s->fd < 0) continue;
                if (s->lingering) slot_drain(g, s);
                else slot_peek(g, s);
            }
        }
        if (stop) break;
        double now = ie_now_ms();
        for (int i = 0; i < g->n_slots; i++) {
            slot_t *s = &g->slots[i];
            if (s->fd < 0) continue;
            if (s->lingering && now - s->t >= GATE_LINGER_MS) slot_close(g, s);
            else if (!s->lingering && now - s->t >= g->o.read_timeout_ms) {
                slot_close(g, s);
                if (g->o.on_slow) g->o.on_slow(g->o.ctx);
                if (g->o.verbose)
                    fprintf(stderr, "http: a connection sent no whole request within %d ms: closed\n",
                            g->o.read_timeout_ms);
            }
        }
    }
    return NULL;
}

/* Contract: see serve_http_gate.h. */
ie_status_t ie_http_gate_start(int listen_fd, const ie_http_gate_opts_t *o, ie_http_gate_t **out)
{
    ie_status_t st = IE_OK;
    ie_http_gate_t *g = NULL;
    if (!out || !o || !o->admit || listen_fd < 0 || o->max_conns <= 0 || o->max_conns_per_addr <= 0)
        return ie_error_set(IE_ERR_INVAL, "http gate: bad arguments");
    *out = NULL;
    if ((g = calloc(1, sizeof *g))) g->efd = g->ep = -1;
    if (!g || !(g->slots = calloc((size_t)o->max_conns, sizeof *g->slots))) {
        st = ie_error_set(IE_ERR_NOMEM, "http gate: out of memory");
        goto cleanup;
    }
    g->o = *o;
    g->lfd = listen_fd;
    g->n_slots = o->max_conns;
    for (int i = 0; i < g->n_slots; i++) g->slots[i].fd = -1;
    g->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    g->ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event le = {.events = EPOLLIN, .data.u64 = 0}, ee = {.events = EPOLLIN, .data.u64 = 1};
    int fl = fcntl(listen_fd, F_GETFL);
    if (g->efd < 0 || g->ep < 0 || fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) != 0 ||
        epoll_ctl(g->ep, EPOLL_CTL_ADD, listen_fd, &le) != 0 || epoll_ctl(g->ep, EPOLL_CTL_ADD, g->efd, &ee) != 0) {
        st = ie_error_set(IE_ERR_IO, "http gate: %s", strerror(errno));
        goto cleanup;
    }
    if (pthread_create(&g->th, NULL, gate_main, g) != 0) {
        st = ie_error_set(IE_ERR_NOMEM, "http gate: cannot start a thread");
        goto cleanup;
    }
    g->running = 1;
    *out = g;
    g = NULL;
cleanup:
    if (g) ie_http_gate_stop(&g);
    return st;
}

/* Contract: see serve_http_gate.h. */
void ie_http_gate_stop(ie_http_gate_t **gp)
{
    if (!gp || !*gp) return;
    ie_http_gate_t *g = *gp;
    *gp = NULL;
    if (g->running) {
        uint64_t one = 1;
        (void)!write(g->efd, &one, sizeof one);
        pthread_join(g->th, NULL);
    }
    if (g->slots)
        for (int i = 0; i < g->n_slots; i++)
            if (g->slots[i].fd >= 0) close(g->slots[i].fd);
    if (g->ep >= 0) close(g->ep);
    if (g->efd >= 0) close(g->efd);
    free(g->slots);
    free(g);
}

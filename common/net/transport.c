/* transport.c — ZeroMQ sockets, CURVE security and key files behind
 * ie_transport.h. The only file of clocher that includes zmq.h.
 *
 * Sockets carry multipart messages of plain frames. Every socket gets the
 * same safety options: linger 0 (closing never blocks on a dead peer),
 * 1000-message high-water marks, 1 GiB frame limit, and ROUTER_MANDATORY on
 * routers, so a reply to a peer that is gone is an error (IE_ERR_UNAVAILABLE)
 * instead of a silent drop.
 *
 * CURVE: ie_net_curve binds a ZAP handler (ZAP 1.0, RFC 27) on
 * inproc://zeromq.zap.01 of the net's context and serves it from its own
 * thread. libzmq asks it about every CURVE handshake on a socket with a ZAP
 * domain; it answers 200 for authorized client keys and 400 otherwise. The
 * handler socket is bound before ie_net_curve returns, so no secure socket
 * can exist while the handler is missing (libzmq would then accept anyone).
 * inproc:// endpoints bypass ZeroMQ's security mechanisms altogether (no
 * handshake happens inside a process), so CURVE options are not applied to
 * them: inproc is trusted by construction.
 *
 * Handshake failures: libzmq retries a failed handshake for ever and says
 * nothing. Every socket with a tcp/ipc endpoint is watched (a socket
 * monitor, read by the net's monitor thread), and a failed handshake is
 * logged to stderr with what probably went wrong (a wrong server key, a
 * peer without CURVE, a key the server does not authorize), once per 10 s
 * per socket and kind.
 */
#define _GNU_SOURCE
#include "ie_transport.h"
#include "ie_clock.h"

#include <zmq.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NET_HWM 1000
#define NET_MAX_MSG (1ll << 30) /* per frame (ZMQ_MAXMSGSIZE) and per message */
#define NET_MAX_FRAMES 64
#define NET_ALIGN 64 /* received frames: cache-line aligned (>= 16 promised) */
#define NET_ZAP_ENDPOINT "inproc://zeromq.zap.01"
/* A binding socket's role is its ZAP domain: the handler accepts only keys
 * authorized for that role (index = ie_role_t). */
static const char *const k_role_domain[] = {"", "ie-worker", "ie-client"};
static const char *const k_role_name[] = {"", "worker", "client"};
#define NET_ROLES 3
#define NET_REFUSE_QUIET_S 10 /* the same refused key+address is logged once per this */
#define Z85_LEN 40
#define NET_MON_EVENTS \
    (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)

/* A watched socket: the PAIR end of its monitor (the monitor thread's). */
typedef struct net_mon {
    void *pair;
    const void *owner; /* the ie_sock_t, until it is destroyed (then NULL) */
    int bound;         /* a server socket (bind), else a client (connect) */
    int router;        /* a ROUTER: a client port, which nothing of ours probes */
    char endpoint[256];
    time_t last_at[4]; /* per kind (mon_report): the last line's time */
} net_mon_t;

struct ie_net {
    void *ctx;
    int secure;
    char public_z85[Z85_LEN + 1];
    char secret_z85[Z85_LEN + 1];
    void *zap; /* REP socket, owned by the ZAP thread once it runs */
    pthread_t zap_thread;
    int zap_running;
    pthread_mutex_t mu; /* guards the authorized set and the refusal log */
    char (*keys)[Z85_LEN + 1];
    unsigned *roles; /* per key: bit (1 << ie_role_t) per role it has */
    size_t n_keys, cap_keys;
    char last_refused[Z85_LEN + 1 + 64];
    time_t last_refused_at;
    /* handshake monitor: entries under mu; the thread starts with the first */
    net_mon_t *mons;
    int n_mons, cap_mons, mon_seq;
    pthread_t mon_thread;
    int mon_running;
    volatile int mon_stop; /* read under mu */
};

struct ie_sock {
    ie_net_t *net;
    void *zs;
    ie_sock_type_t type;
    int sndtimeo;    /* the ZMQ_SNDTIMEO currently set */
    int64_t max_msg; /* bytes per message at most (ie_sock_set_max_msg) */
    int last_fd;     /* the connection the last message came over (-1: unknown) */
    ie_role_t role;  /* whom a binding socket accepts on a secure net */
    int monitored;   /* a monitor entry of the net watches it */
    /* ie_sock_watch_peers: the PAIR reading this socket's own monitor, or
     * NULL. ZeroMQ keeps one monitor per socket, so a watched socket's
     * handshake failures come through it too and are reported from
     * ie_sock_peers_gone with pmon's endpoint and rate limits. */
    void *mon;
    net_mon_t pmon;
};

/* ------------------------------------------------------------ helpers */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static ie_status_t zmq_fail(ie_status_t st, const char *what)
{
    return ie_error_set(st, "transport: %s: %s", what, zmq_strerror(zmq_errno()));
}

/* 1 when s is 40 characters of the Z85 alphabet that decode to 32 bytes. */
static int z85_valid(const char *s)
{
    uint8_t raw[32];
    if (!s || strnlen(s, Z85_LEN + 1) != Z85_LEN) return 0;
    return zmq_z85_decode(raw, s) != NULL;
}

static int is_inproc(const char *endpoint) { return strncmp(endpoint, "inproc://", 9) == 0; }

/* ------------------------------------------------------------ parts */

void ie_parts_free(ie_parts_t *p)
{
    if (!p) return;
    for (int i = 0; i < p->cap_n; i++) free(p->data[i]);
    free(p->data);
    free(p->size);
    free(p->cap);
    memset(p, 0, sizeof *p);
}

/* Make room for frame i of `size` bytes (contents need not survive). */
static ie_status_t parts_slot(ie_parts_t *p, int i, size_t size)
{
    if (i >= p->cap_n) {
        const int nc = p->cap_n ? p->cap_n * 2 : 4;
        void **d = realloc(p->data, (size_t)nc * sizeof *d);
        if (!d) return ie_error_set(IE_ERR_NOMEM, "transport: out of memory");
        p->data = d;
        size_t *s = realloc(p->size, (size_t)nc * sizeof *s);
        if (!s) return ie_error_set(IE_ERR_NOMEM, "transport: out of memory");
        p->size = s;
        size_t *c = realloc(p->cap, (size_t)nc * sizeof *c);
        if (!c) return ie_error_set(IE_ERR_NOMEM, "transport: out of memory");
        p->cap = c;
        for (int j = p->cap_n; j < nc; j++) {
            p->data[j] = NULL;
            p->size[j] = p->cap[j] = 0;
        }
        p->cap_n = nc;
    }
    if (!p->data[i] || p->cap[i] < size) {
        size_t c = NET_ALIGN;
        while (c < size) c *= 2;
        void *b = NULL;
        if (posix_memalign(&b, NET_ALIGN, c) != 0) return ie_error_set(IE_ERR_NOMEM, "transport: out of memory");
        free(p->data[i]);
        p->data[i] = b;
        p->cap[i] = c;
    }
    p->size[i] = size;
    return IE_OK;
}

/* ------------------------------------------------------------ ZAP */

/* A received ZAP request: at most 8 short frames (longer frames are cut; a
 * real request's frames are short, and a cut one fails the checks anyway). */
typedef struct zap_req {
    int n;
    char f[8][256];
    size_t len[8];
} zap_req_t;

static int zap_frame_is(const zap_req_t *r, int i, const char *s)
{
    return i < r->n && r->len[i] == strlen(s) && memcmp(r->f[i], s, r->len[i]) == 0;
}

/* The roles key (Z85) is authorized for (bit 1 << ie_role_t; 0: none). */
static unsigned net_key_roles(ie_net_t *net, const char *z85)
{
    unsigned roles = 0;
    pthread_mutex_lock(&net->mu);
    for (size_t i = 0; i < net->n_keys; i++)
        if (strcmp(net->keys[i], z85) == 0) roles = net->roles[i];
    pthread_mutex_unlock(&net->mu);
    return roles;
}

/* The role a ZAP domain names (0: none of ours). */
static int zap_role(const zap_req_t *r)
{
    for (int k = 1; k < NET_ROLES; k++)
        if (zap_frame_is(r, 2, k_role_domain[k])) return k;
    return 0;
}

/* One refusal line, not repeated for the same client while it keeps
 * retrying (libzmq reconnects every 100 ms). */
static void net_log_refusal(ie_net_t *net, const char *z85, const char *addr, int role, unsigned roles)
{
    char tag[sizeof net->last_refused];
    const time_t now = time(NULL);
    snprintf(tag, sizeof tag, "%s %s", z85, addr);
    pthread_mutex_lock(&net->mu);
    const int repeat = strcmp(tag, net->last_refused) == 0 && now - net->last_refused_at < NET_REFUSE_QUIET_S;
    if (!repeat) {
        snprintf(net->last_refused, sizeof net->last_refused, "%s", tag);
        net->last_refused_at = now;
    }
    pthread_mutex_unlock(&net->mu);
    if (!repeat && roles)
        ie_log("transport: refused CURVE client %s from %s: it is authorized as a %s, not as a %s\n", z85, addr,
               k_role_name[(roles >> IE_ROLE_WORKER) & 1 ? IE_ROLE_WORKER : IE_ROLE_CLIENT], k_role_name[role]);
    else if (!repeat)
        ie_log("transport: refused CURVE client %s from %s: not an authorized %s key\n", z85, addr,
               k_role_name[role]);
}

static void zap_reply(void *zs, const zap_req_t *r, const char *code, const char *text, const char *user)
{
    const char *reqid = r->n > 1 ? r->f[1] : "";
    const size_t reqid_len = r->n > 1 ? r->len[1] : 0;
    zmq_send(zs, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(zs, reqid, reqid_len, ZMQ_SNDMORE);
    zmq_send(zs, code, strlen(code), ZMQ_SNDMORE);
    zmq_send(zs, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(zs, user, strlen(user), ZMQ_SNDMORE);
    zmq_send(zs, "", 0, 0);
}

/* Request frames (REP strips the envelope): version, request id, domain,
 * address, routing id, mechanism, credentials... */
static void zap_handle(ie_net_t *net, void *zs, const zap_req_t *r)
{
    if (!zap_frame_is(r, 0, "1.0") || r->n < 6) {
        zap_reply(zs, r, "500", "bad ZAP request", "");
        return;
    }
    char addr[64];
    snprintf(addr, sizeof addr, "%.*s", (int)(r->len[3] < 63 ? r->len[3] : 63), r->f[3]);
    if (zap_frame_is(r, 5, "CURVE") && r->n == 7 && r->len[6] == 32) {
        char z85[Z85_LEN + 1];
        zmq_z85_encode(z85, (const uint8_t *)r->f[6], 32);
        const int role = zap_role(r);
        const unsigned roles = net_key_roles(net, z85);
        if (role && (roles >> role) & 1) {
            zap_reply(zs, r, "200", "OK", z85);
            return;
        }
        net_log_refusal(net, z85, addr, role ? role : IE_ROLE_WORKER, roles);
        zap_reply(zs, r, "400", "unknown key", "");
        return;
    }
    /* NULL (or PLAIN) on a secure net: this handler only runs when CURVE is
     * on, and then every binding socket must be a CURVE server. */
    ie_log("transport: refused %.*s client from %s (CURVE required)\n", (int)(r->len[5] < 16 ? r->len[5] : 16),
           r->f[5], addr);
    zap_reply(zs, r, "400", "CURVE required", "");
}

static void *zap_main(void *arg)
{
    ie_net_t *net = arg;
    void *zs = net->zap;
    zap_req_t r;
    for (;;) {
        int more = 1;
        r.n = 0;
        while (more) {
            zmq_msg_t msg;
            zmq_msg_init(&msg);
            int rc;
            while ((rc = zmq_msg_recv(&msg, zs, 0)) < 0 && zmq_errno() == EINTR) {}
            if (rc < 0) { /* ETERM: the net is shutting down */
                zmq_msg_close(&msg);
                goto done;
            }
            if (r.n < 8) {
                /* a cut frame keeps len = sizeof f[0], which no check accepts */
                const size_t sz = zmq_msg_size(&msg);
                const size_t n = sz < sizeof r.f[0] - 1 ? sz : sizeof r.f[0] - 1;
                memcpy(r.f[r.n], zmq_msg_data(&msg), n);
                r.f[r.n][n] = '\0';
                r.len[r.n] = sz == n ? n : sizeof r.f[0];
                r.n++;
            }
            more = zmq_msg_more(&msg);
            zmq_msg_close(&msg);
        }
        zap_handle(net, zs, &r);
    }
done:
    zmq_close(zs);
    return NULL;
}

/* ------------------------------------------------------------ monitor */

/* One failed handshake, said in words an operator can act on. */
static void mon_report(ie_net_t *net, net_mon_t *m, uint16_t ev, uint32_t value)
{
    /* kinds, each rate-limited on its own: no detail, protocol, auth, and
     * the mechanism mismatch (a peer with or without CURVE) */
    const int kind = ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL            ? 0
                     : ev != ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL           ? 2
                     : value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ? 3
                                                                           : 1;
    const time_t now = time(NULL);
    /* ZAP logs its own refusals; a client that leaves mid-handshake is
     * said only on ROUTERs (workers probe each other's PULL sockets, see
     * ie_endpoint_probe, and that must not read as an attack) */
    if (m->bound && (kind == 2 || (kind == 0 && (!m->router || !net->secure)))) return;
    if (m->last_at[kind] && now - m->last_at[kind] < NET_REFUSE_QUIET_S) return;
    m->last_at[kind] = now;
    if (m->bound) {
        /* A client without CURVE sees our CURVE greeting as we see its NULL
         * one; when it hangs up first we get no detail, only the close */
        if (kind == 0)
            ie_log("transport: refused a client on %s that closed the connection during the handshake (CURVE "
                   "required: a client without CURVE keys does this; so does a plain TCP probe)\n",
                   m->endpoint);
        else if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
            ie_log("transport: refused a client on %s (%s)\n", m->endpoint,
                   net->secure ? "CURVE required: it connected without CURVE keys"
                               : "it uses CURVE, this process has no keys");
        else if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
            ie_log(
                "transport: a client on %s failed the CURVE handshake (cryptographic error): it was given another "
                "server key than this process's %s\n",
                m->endpoint, net->public_z85);
        else
            ie_log("transport: a client on %s failed the handshake (protocol error 0x%x)\n", m->endpoint,
                   (unsigned)value);
        return;
    }
    if (kind == 2)
        ie_log("transport: %s refused this process's CURVE key %s (ZAP status %u): it is not authorized there for "
               "this role\n",
               m->endpoint, net->public_z85, (unsigned)value);
    else if (kind == 3)
        ie_log("transport: %s %s\n", m->endpoint,
               net->secure ? "does not use CURVE, this process does" : "uses CURVE, this process has no keys");
    else if (net->secure)
        ie_log("transport: CURVE handshake with %s failed (%s): the server key this process was given for it "
               "(--coordinator-key, or a peer's key) is probably not that server's\n",
               m->endpoint, kind == 0 ? "the server closed the connection" : "protocol error");
    else
        ie_log("transport: handshake with %s failed (%s): does the server require CURVE?\n", m->endpoint,
               kind == 0 ? "the server closed the connection" : "protocol error");
}

/* Read one monitor event (2 frames: 6 bytes of event + value, the
 * endpoint) from m's pair and report it. */
static void mon_read(ie_net_t *net, net_mon_t *m)
{
    zmq_msg_t f;
    uint8_t head[6] = {0};
    int more = 1, i = 0;
    while (more) {
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, m->pair, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            return;
        }
        if (i == 0 && zmq_msg_size(&f) >= sizeof head) memcpy(head, zmq_msg_data(&f), sizeof head);
        more = zmq_msg_more(&f);
        zmq_msg_close(&f);
        i++;
    }
    uint16_t ev;
    uint32_t value;
    memcpy(&ev, head, 2);
    memcpy(&value, head + 2, 4);
    if (ev & NET_MON_EVENTS) mon_report(net, m, ev, value);
}

static void *mon_main(void *arg)
{
    ie_net_t *net = arg;
    zmq_pollitem_t items[64];
    int idx[64];
    for (;;) {
        int n = 0;
        pthread_mutex_lock(&net->mu);
        const int stop = net->mon_stop;
        for (int i = 0; i < net->n_mons;) { /* drop the entries of destroyed sockets */
            if (!net->mons[i].owner || stop) {
                zmq_close(net->mons[i].pair);
                net->mons[i] = net->mons[--net->n_mons];
                continue;
            }
            if (n < 64) {
                items[n] = (zmq_pollitem_t){net->mons[i].pair, 0, ZMQ_POLLIN, 0};
                idx[n++] = i;
            }
            i++;
        }
        pthread_mutex_unlock(&net->mu);
        if (stop) break;
        /* entries change only in this thread (removal) or at the end (append) */
        const int rc = n ? zmq_poll(items, n, 100) : (usleep(100000), 0);
        if (rc <= 0) continue;
        pthread_mutex_lock(&net->mu);
        for (int k = 0; k < n; k++)
            if (items[k].revents & ZMQ_POLLIN) mon_read(net, &net->mons[idx[k]]);
        pthread_mutex_unlock(&net->mu);
    }
    return NULL;
}

/* Watch s (owning thread, at its first tcp/ipc bind or connect). A socket
 * that cannot be watched still works: the failure is only not logged. */
static void mon_watch(ie_sock_t *s, const char *endpoint, int bound)
{
    ie_net_t *net = s->net;
    char ep[96];
    void *pair = NULL;
    if (s->monitored || is_inproc(endpoint)) return;
    if (s->mon) { /* its own monitor (ie_sock_watch_peers) reports these */
        s->pmon.bound = bound;
        s->pmon.router = s->type == IE_SOCK_ROUTER;
        snprintf(s->pmon.endpoint, sizeof s->pmon.endpoint, "%s", endpoint);
        return;
    }
    pthread_mutex_lock(&net->mu);
    const int seq = net->mon_seq++;
    pthread_mutex_unlock(&net->mu);
    snprintf(ep, sizeof ep, "inproc://ie-monitor-%p-%d", (void *)net, seq);
    if (zmq_socket_monitor(s->zs, ep, NET_MON_EVENTS) != 0) return;
    pair = zmq_socket(net->ctx, ZMQ_PAIR);
    const int linger = 0;
    if (!pair || zmq_setsockopt(pair, ZMQ_LINGER, &linger, sizeof linger) != 0 || zmq_connect(pair, ep) != 0)
        goto fail;
    pthread_mutex_lock(&net->mu);
    if (net->n_mons == net->cap_mons) {
        const int nc = net->cap_mons ? net->cap_mons * 2 : 8;
        net_mon_t *m = realloc(net->mons, (size_t)nc * sizeof *m);
        if (!m) {
            pthread_mutex_unlock(&net->mu);
            goto fail;
        }
        net->mons = m;
        net->cap_mons = nc;
    }
    net_mon_t *m = &net->mons[net->n_mons++];
    memset(m, 0, sizeof *m);
    m->pair = pair; /* the monitor thread's from here (the mutex is the barrier ZeroMQ asks for) */
    m->owner = s;
    m->bound = bound;
    m->router = s->type == IE_SOCK_ROUTER;
    snprintf(m->endpoint, sizeof m->endpoint, "%s", endpoint);
    if (!net->mon_running && pthread_create(&net->mon_thread, NULL, mon_main, net) == 0) net->mon_running = 1;
    pthread_mutex_unlock(&net->mu);
    s->monitored = 1;
    return;
fail:
    if (pair) zmq_close(pair);
    zmq_socket_monitor(s->zs, NULL, 0);
}

/* s is going away: stop its monitor, let the thread close the pair. */
static void mon_forget(ie_sock_t *s)
{
    if (!s->monitored) return;
    zmq_socket_monitor(s->zs, NULL, 0);
    pthread_mutex_lock(&s->net->mu);
    for (int i = 0; i < s->net->n_mons; i++)
        if (s->net->mons[i].owner == s) s->net->mons[i].owner = NULL;
    pthread_mutex_unlock(&s->net->mu);
}

/* ------------------------------------------------------------ net */

ie_status_t ie_net_new(ie_net_t **out)
{
    ie_status_t st = IE_OK;
    ie_net_t *net = NULL;

    if (!out) return ie_error_set(IE_ERR_INVAL, "ie_net_new: NULL out");
    *out = NULL;
    net = calloc(1, sizeof *net);
    if (!net) return ie_error_set(IE_ERR_NOMEM, "transport: out of memory");
    pthread_mutex_init(&net->mu, NULL);
    net->ctx = zmq_ctx_new();
    if (!net->ctx) {
        st = zmq_fail(IE_ERR_INTERNAL, "zmq_ctx_new");
        goto cleanup;
    }
    /* Terminating the context never waits for unsent messages. */
    zmq_ctx_set(net->ctx, ZMQ_BLOCKY, 0);
    *out = net;
    net = NULL;

cleanup:
    if (net) {
        pthread_mutex_destroy(&net->mu);
        free(net);
    }
    return st;
}

static ie_status_t net_add_key(ie_net_t *net, ie_role_t role, const char *z85)
{
    ie_status_t st = IE_OK;
    pthread_mutex_lock(&net->mu);
    for (size_t i = 0; i < net->n_keys; i++)
        if (strcmp(net->keys[i], z85) == 0) {
            net->roles[i] |= 1u << role;
            goto cleanup;
        }
    if (net->n_keys == net->cap_keys) {
        const size_t nc = net->cap_keys ? net->cap_keys * 2 : 16;
        char(*k)[Z85_LEN + 1] = realloc(net->keys, nc * sizeof *k);
        if (!k) {
            st = ie_error_set(IE_ERR_NOMEM, "transport: out of memory");
            goto cleanup;
        }
        net->keys = k;
        unsigned *ro = realloc(net->roles, nc * sizeof *ro);
        if (!ro) {
            st = ie_error_set(IE_ERR_NOMEM, "transport: out of memory");
            goto cleanup;
        }
        net->roles = ro;
        net->cap_keys = nc;
    }
    net->roles[net->n_keys] = 1u << role;
    memcpy(net->keys[net->n_keys++], z85, Z85_LEN + 1);

cleanup:
    pthread_mutex_unlock(&net->mu);
    return st;
}

ie_status_t ie_net_authorize(ie_net_t *net, ie_role_t role, const char *public_z85)
{
    if (!net) return ie_error_set(IE_ERR_INVAL, "ie_net_authorize: NULL net");
    if (role != IE_ROLE_WORKER && role != IE_ROLE_CLIENT)
        return ie_error_set(IE_ERR_INVAL, "ie_net_authorize: bad role %d", (int)role);
    if (!z85_valid(public_z85)) return ie_error_set(IE_ERR_INVAL, "transport: not a Z85 CURVE public key");
    return net_add_key(net, role, public_z85);
}

/* Every DIR/NAME.pub as a key of `role`; a missing directory is no key when
 * `optional`. */
static ie_status_t net_load_dir(ie_net_t *net, const char *dir, ie_role_t role, int optional)
{
    ie_status_t st = IE_OK;
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[4096], key[Z85_LEN + 1];

    if (!d && optional && errno == ENOENT) return IE_OK;
    if (!d)
        return ie_error_set(IE_ERR_IO, "transport: cannot open authorized keys dir %s: %s", dir, strerror(errno));
    while ((e = readdir(d)) != NULL) {
        const size_t n = strlen(e->d_name);
        if (n < 5 || e->d_name[0] == '.' || strcmp(e->d_name + n - 4, ".pub") != 0) continue;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path) {
            st = ie_error_set(IE_ERR_IO, "transport: path too long in %s", dir);
            goto cleanup;
        }
        if ((st = ie_keys_load(path, key)) != IE_OK) goto cleanup;
        if ((st = net_add_key(net, role, key)) != IE_OK) goto cleanup;
    }

cleanup:
    closedir(d);
    return st;
}

/* The authorized layout (ie_transport.h): the .pub files of DIR and of
 * DIR/workers are worker keys, those of DIR/clients client keys. */
static ie_status_t net_load_authorized(ie_net_t *net, const char *dir)
{
    ie_status_t st;
    char sub[4096];
    if ((st = net_load_dir(net, dir, IE_ROLE_WORKER, 0)) != IE_OK) return st;
    if ((size_t)snprintf(sub, sizeof sub, "%s/workers", dir) >= sizeof sub)
        return ie_error_set(IE_ERR_IO, "transport: path too long in %s", dir);
    if ((st = net_load_dir(net, sub, IE_ROLE_WORKER, 1)) != IE_OK) return st;
    snprintf(sub, sizeof sub, "%s/clients", dir);
    return net_load_dir(net, sub, IE_ROLE_CLIENT, 1);
}

ie_status_t ie_net_curve(ie_net_t *net, const char *public_z85, const char *secret_z85, const char *authorized_dir)
{
    ie_status_t st = IE_OK;
    void *zap = NULL;
    char derived[Z85_LEN + 1];

    if (!net) return ie_error_set(IE_ERR_INVAL, "ie_net_curve: NULL net");
    if (net->secure) return ie_error_set(IE_ERR_INVAL, "transport: CURVE is already on");
    if (!zmq_has("curve")) return ie_error_set(IE_ERR_UNSUPPORTED, "transport: this libzmq has no CURVE support");
    if (!z85_valid(public_z85) || !z85_valid(secret_z85))
        return ie_error_set(IE_ERR_INVAL, "transport: CURVE keys must be 40-character Z85 strings");
    if (zmq_curve_public(derived, secret_z85) != 0 || strcmp(derived, public_z85) != 0)
        return ie_error_set(IE_ERR_INVAL, "transport: the CURVE public key does not belong to the secret key");
    if (authorized_dir && (st = net_load_authorized(net, authorized_dir)) != IE_OK) goto cleanup;

    zap = zmq_socket(net->ctx, ZMQ_REP);
    if (!zap) {
        st = zmq_fail(IE_ERR_INTERNAL, "ZAP socket");
        goto cleanup;
    }
    const int linger = 0;
    zmq_setsockopt(zap, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(zap, NET_ZAP_ENDPOINT) != 0) {
        st = zmq_fail(IE_ERR_INTERNAL, "bind " NET_ZAP_ENDPOINT);
        goto cleanup;
    }
    memcpy(net->public_z85, public_z85, Z85_LEN + 1);
    memcpy(net->secret_z85, secret_z85, Z85_LEN + 1);
    net->zap = zap;
    if (pthread_create(&net->zap_thread, NULL, zap_main, net) != 0) {
        net->zap = NULL;
        st = ie_error_set(IE_ERR_INTERNAL, "transport: cannot start the ZAP thread");
        goto cleanup;
    }
    zap = NULL; /* the thread owns it now */
    net->zap_running = 1;
    net->secure = 1;

cleanup:
    if (zap) zmq_close(zap);
    if (st != IE_OK) {
        explicit_bzero(net->secret_z85, sizeof net->secret_z85);
        net->public_z85[0] = '\0';
    }
    return st;
}

int ie_net_is_secure(const ie_net_t *net, const char **public_z85)
{
    if (!net || !net->secure) return 0;
    if (public_z85) *public_z85 = net->public_z85;
    return 1;
}

void ie_net_destroy(ie_net_t **net_p)
{
    if (!net_p || !*net_p) return;
    ie_net_t *net = *net_p;
    if (net->mon_running) { /* it closes its pairs, so the context can end */
        pthread_mutex_lock(&net->mu);
        net->mon_stop = 1;
        pthread_mutex_unlock(&net->mu);
        pthread_join(net->mon_thread, NULL);
    }
    free(net->mons);
    /* Shutdown wakes the ZAP thread with ETERM; it closes its socket, then
     * the context can terminate (every other socket is already closed). */
    zmq_ctx_shutdown(net->ctx);
    if (net->zap_running) pthread_join(net->zap_thread, NULL);
    while (zmq_ctx_term(net->ctx) != 0 && zmq_errno() == EINTR) {}
    explicit_bzero(net->secret_z85, sizeof net->secret_z85);
    free(net->keys);
    free(net->roles);
    pthread_mutex_destroy(&net->mu);
    free(net);
    *net_p = NULL;
}

/* ------------------------------------------------------------ sockets */

ie_status_t ie_sock_new(ie_net_t *net, ie_sock_type_t type, ie_sock_t **out)
{
    ie_status_t st = IE_OK;
    ie_sock_t *s = NULL;
    int ztype;

    if (!out) return ie_error_set(IE_ERR_INVAL, "ie_sock_new: NULL out");
    *out = NULL;
    if (!net) return ie_error_set(IE_ERR_INVAL, "ie_sock_new: NULL net");
    switch (type) {
    case IE_SOCK_ROUTER: ztype = ZMQ_ROUTER; break;
    case IE_SOCK_DEALER: ztype = ZMQ_DEALER; break;
    case IE_SOCK_PUSH: ztype = ZMQ_PUSH; break;
    case IE_SOCK_PULL: ztype = ZMQ_PULL; break;
    default: return ie_error_set(IE_ERR_INVAL, "ie_sock_new: bad socket type %d", (int)type);
    }
    s = calloc(1, sizeof *s);
    if (!s) return ie_error_set(IE_ERR_NOMEM, "transport: out of memory");
    s->net = net;
    s->type = type;
    s->sndtimeo = -1;
    s->max_msg = NET_MAX_MSG;
    s->last_fd = -1;
    s->role = IE_ROLE_WORKER;
    s->zs = zmq_socket(net->ctx, ztype);
    if (!s->zs) {
        st = zmq_fail(IE_ERR_INTERNAL, "zmq_socket");
        goto cleanup;
    }
    const int linger = 0, hwm = NET_HWM, one = 1;
    const int64_t maxmsg = NET_MAX_MSG;
    if (zmq_setsockopt(s->zs, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(s->zs, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(s->zs, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(s->zs, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0 ||
        (type == IE_SOCK_ROUTER && zmq_setsockopt(s->zs, ZMQ_ROUTER_MANDATORY, &one, sizeof one) != 0)) {
        st = zmq_fail(IE_ERR_INTERNAL, "socket options");
        goto cleanup;
    }
    *out = s;
    s = NULL;

cleanup:
    if (s) {
        if (s->zs) zmq_close(s->zs);
        free(s);
    }
    return st;
}

void ie_sock_destroy(ie_sock_t **s_p)
{
    if (!s_p || !*s_p) return;
    if ((*s_p)->mon) {
        zmq_socket_monitor((*s_p)->zs, NULL, 0); /* stop the monitor before closing its reader */
        zmq_close((*s_p)->mon);
    }
    mon_forget(*s_p);
    zmq_close((*s_p)->zs);
    free(*s_p);
    *s_p = NULL;
}

ie_status_t ie_sock_set_role(ie_sock_t *s, ie_role_t role)
{
    if (!s || (role != IE_ROLE_WORKER && role != IE_ROLE_CLIENT))
        return ie_error_set(IE_ERR_INVAL, "ie_sock_set_role: bad socket or role");
    s->role = role;
    return IE_OK;
}

ie_status_t ie_sock_set_identity(ie_sock_t *s, const void *id, size_t n)
{
    if (!s || !id || n < 1 || n > 255)
        return ie_error_set(IE_ERR_INVAL, "ie_sock_set_identity: an identity is 1..255 bytes");
    if (((const uint8_t *)id)[0] == 0)
        return ie_error_set(IE_ERR_INVAL, "ie_sock_set_identity: an identity must not start with a zero byte");
    if (zmq_setsockopt(s->zs, ZMQ_ROUTING_ID, id, n) != 0) return zmq_fail(IE_ERR_INVAL, "set identity");
    return IE_OK;
}

static ie_status_t endpoint_status(void)
{
    switch (zmq_errno()) {
    case EADDRINUSE:
    case EADDRNOTAVAIL:
    case ENODEV: return IE_ERR_UNAVAILABLE;
    case ENOMEM: return IE_ERR_NOMEM;
    default: return IE_ERR_INVAL;
    }
}

/* An IPv6 literal (tcp://[::1]:5556, tcp://[::]:0) needs ZMQ_IPV6 on the
 * socket (libzmq's sockets are IPv4-only by default and fail with "No such
 * device"); other endpoints keep the default, so "*" stays IPv4. */
static ie_status_t want_ipv6(ie_sock_t *s, const char *endpoint)
{
    const int one = 1;
    if (strncmp(endpoint, "tcp://", 6) != 0 || !strchr(endpoint, '[')) return IE_OK;
    return zmq_setsockopt(s->zs, ZMQ_IPV6, &one, sizeof one) == 0 ? IE_OK : IE_ERR_INTERNAL;
}

/* "tcp://0.0.0.0:41234" -> "tcp://127.0.0.1:41234": the wildcard is where
 * we listen, not an address anyone can connect to. */
static ie_status_t connectable(const char *last, char *bound, size_t cap)
{
    static const struct {
        const char *from, *to;
    } k_wild[] = {{"tcp://0.0.0.0:", "tcp://127.0.0.1:"}, {"tcp://[::]:", "tcp://[::1]:"}};
    const char *to = NULL, *rest = last;
    for (size_t i = 0; i < sizeof k_wild / sizeof k_wild[0]; i++) {
        const size_t n = strlen(k_wild[i].from);
        if (strncmp(last, k_wild[i].from, n) == 0) {
            to = k_wild[i].to;
            rest = last + n;
        }
    }
    const int w = snprintf(bound, cap, "%s%s", to ? to : "", rest);
    if (w < 0 || (size_t)w >= cap)
        return ie_error_set(IE_ERR_RANGE, "transport: bound endpoint %s does not fit", last);
    return IE_OK;
}

ie_status_t ie_sock_bind(ie_sock_t *s, const char *endpoint, char *bound, size_t bound_cap)
{
    ie_status_t st = IE_OK;
    char last[512];
    size_t last_len = sizeof last;

    if (!s || !endpoint) return ie_error_set(IE_ERR_INVAL, "ie_sock_bind: NULL argument");
    if (bound && bound_cap) bound[0] = '\0';
    if (s->net->secure && !is_inproc(endpoint)) {
        const int one = 1;
        if (zmq_setsockopt(s->zs, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
            zmq_setsockopt(s->zs, ZMQ_CURVE_SECRETKEY, s->net->secret_z85, Z85_LEN) != 0 ||
            zmq_setsockopt(s->zs, ZMQ_ZAP_DOMAIN, k_role_domain[s->role], strlen(k_role_domain[s->role])) != 0) {
            st = zmq_fail(IE_ERR_INTERNAL, "CURVE server options");
            goto cleanup;
        }
    }
    if (want_ipv6(s, endpoint) != IE_OK) {
        st = zmq_fail(IE_ERR_INTERNAL, "ZMQ_IPV6");
        goto cleanup;
    }
    if (zmq_bind(s->zs, endpoint) != 0) {
        st = ie_error_set(endpoint_status(), "transport: cannot bind %s: %s", endpoint, zmq_strerror(zmq_errno()));
        goto cleanup;
    }
    mon_watch(s, endpoint, 1);
    if (!bound) goto cleanup;
    if (zmq_getsockopt(s->zs, ZMQ_LAST_ENDPOINT, last, &last_len) != 0) {
        st = zmq_fail(IE_ERR_INTERNAL, "ZMQ_LAST_ENDPOINT");
        goto cleanup;
    }
    last[sizeof last - 1] = '\0';
    st = connectable(last, bound, bound_cap);
    if (st != IE_OK) zmq_unbind(s->zs, last);

cleanup:
    return st;
}

ie_status_t ie_sock_connect(ie_sock_t *s, const char *endpoint, const char *server_z85)
{
    if (!s || !endpoint) return ie_error_set(IE_ERR_INVAL, "ie_sock_connect: NULL argument");
    if (s->net->secure && !is_inproc(endpoint)) {
        if (!z85_valid(server_z85))
            return ie_error_set(IE_ERR_INVAL,
                                "transport: connecting to %s on a secure net needs the server's Z85 key", endpoint);
        if (zmq_setsockopt(s->zs, ZMQ_CURVE_SERVERKEY, server_z85, Z85_LEN) != 0 ||
            zmq_setsockopt(s->zs, ZMQ_CURVE_PUBLICKEY, s->net->public_z85, Z85_LEN) != 0 ||
            zmq_setsockopt(s->zs, ZMQ_CURVE_SECRETKEY, s->net->secret_z85, Z85_LEN) != 0)
            return zmq_fail(IE_ERR_INTERNAL, "CURVE client options");
    }
    mon_watch(s, endpoint, 0); /* before connect: the first handshake's failure is seen too */
    if (want_ipv6(s, endpoint) != IE_OK) return ie_error_set(IE_ERR_INTERNAL, "transport: cannot enable IPv6");
    if (zmq_connect(s->zs, endpoint) != 0)
        return ie_error_set(endpoint_status(), "transport: cannot connect to %s: %s", endpoint,
                            zmq_strerror(zmq_errno()));
    return IE_OK;
}

ie_status_t ie_sock_disconnect(ie_sock_t *s, const char *endpoint)
{
    if (!s || !endpoint) return ie_error_set(IE_ERR_INVAL, "ie_sock_disconnect: NULL argument");
    if (zmq_disconnect(s->zs, endpoint) != 0)
        return ie_error_set(IE_ERR_INVAL, "transport: cannot disconnect %s: %s", endpoint,
                            zmq_strerror(zmq_errno()));
    return IE_OK;
}

ie_status_t ie_sock_send(ie_sock_t *s, const ie_frame_t *frames, int n, int timeout_ms)
{
    if (!s || !frames || n < 1) return ie_error_set(IE_ERR_INVAL, "ie_sock_send: no frames");
    for (int i = 0; i < n; i++)
        if (!frames[i].data && frames[i].size)
            return ie_error_set(IE_ERR_INVAL, "ie_sock_send: frame %d has no data", i);
    const int tmo = timeout_ms < 0 ? -1 : timeout_ms;
    if (tmo != s->sndtimeo) {
        if (zmq_setsockopt(s->zs, ZMQ_SNDTIMEO, &tmo, sizeof tmo) != 0)
            return zmq_fail(IE_ERR_INTERNAL, "SNDTIMEO");
        s->sndtimeo = tmo;
    }
    /* Only the first frame can wait or fail for lack of room: libzmq counts
     * whole messages against the high-water mark, and once a message has
     * started the rest of its frames are always accepted. */
    for (int i = 0; i < n; i++) {
        const int flags = i + 1 < n ? ZMQ_SNDMORE : 0;
        int rc;
        while ((rc = zmq_send(s->zs, frames[i].data, frames[i].size, flags)) < 0 && zmq_errno() == EINTR) {}
        if (rc >= 0) continue;
        switch (zmq_errno()) {
        case EAGAIN: return ie_error_set(IE_ERR_TIMEOUT, "transport: send timed out after %d ms", timeout_ms);
        case EHOSTUNREACH: return ie_error_set(IE_ERR_UNAVAILABLE, "transport: no peer with that identity");
        default: return zmq_fail(IE_ERR_UNAVAILABLE, "send");
        }
    }
    return IE_OK;
}

/* Wait until s is readable or the deadline (ms on now_ms's clock; < 0:
 * none) passes: 1 ready, 0 timed out, -1 error. Signals only shorten a
 * wait, never end it early. */
static int wait_readable(void *zs, int64_t deadline)
{
    for (;;) {
        zmq_pollitem_t it = {zs, 0, ZMQ_POLLIN, 0};
        long wait = -1;
        if (deadline >= 0) {
            const int64_t left = deadline - now_ms();
            wait = left > 0 ? (long)left : 0;
        }
        const int rc = zmq_poll(&it, 1, wait);
        if (rc > 0) return 1;
        if (rc == 0) {
            if (deadline >= 0) return 0;
            continue;
        }
        if (zmq_errno() != EINTR) return -1;
    }
}

ie_status_t ie_sock_recv(ie_sock_t *s, ie_parts_t *p, int timeout_ms)
{
    ie_status_t st = IE_OK;
    zmq_msg_t msg;
    int n = 0, more = 1, too_big = 0;
    size_t total = 0;

    if (!s || !p) return ie_error_set(IE_ERR_INVAL, "ie_sock_recv: NULL argument");
    p->n = 0;
    zmq_msg_init(&msg);
    const int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    for (;;) {
        const int w = wait_readable(s->zs, deadline);
        if (w == 0) {
            st = ie_error_set(IE_ERR_TIMEOUT, "transport: nothing arrived in %d ms", timeout_ms);
            goto cleanup;
        }
        if (w < 0) {
            st = zmq_fail(IE_ERR_UNAVAILABLE, "poll");
            goto cleanup;
        }
        if (zmq_msg_recv(&msg, s->zs, ZMQ_DONTWAIT) >= 0) break;
        if (zmq_errno() != EAGAIN && zmq_errno() != EINTR) {
            st = zmq_fail(IE_ERR_UNAVAILABLE, "recv");
            goto cleanup;
        }
        /* readable but gone (another poll raced us): wait again */
    }
    /* The rest of a message is always there once its first frame is. */
    while (more) {
        const size_t sz = zmq_msg_size(&msg);
        total += sz;
        if (n == 0) s->last_fd = -1;
        if (s->last_fd < 0) { /* a ROUTER's identity frame may lack it (made by the router): the next has it */
            const int fd = zmq_msg_get(&msg, ZMQ_SRCFD); /* -1 for inproc */
            s->last_fd = fd >= 0 ? fd : -1;
        }
        if (n >= NET_MAX_FRAMES || total > (size_t)s->max_msg) too_big = 1;
        if (!too_big && st == IE_OK) {
            st = parts_slot(p, n, sz);
            if (st == IE_OK && sz) memcpy(p->data[n], zmq_msg_data(&msg), sz);
        }
        n++;
        more = zmq_msg_more(&msg);
        if (!more) break;
        int rc;
        while ((rc = zmq_msg_recv(&msg, s->zs, 0)) < 0 && zmq_errno() == EINTR) {}
        if (rc < 0) {
            st = zmq_fail(IE_ERR_UNAVAILABLE, "recv");
            goto cleanup;
        }
    }
    if (st != IE_OK) goto cleanup; /* out of memory: the message is drained and lost */
    if (too_big) {
        st = ie_error_set(IE_ERR_FORMAT, "transport: dropped a message of %d frames / %zu bytes (limits %d / %lld)",
                          n, total, NET_MAX_FRAMES, (long long)s->max_msg);
        goto cleanup;
    }
    p->n = n;

cleanup:
    zmq_msg_close(&msg);
    if (st != IE_OK) p->n = 0;
    return st;
}

ie_status_t ie_sock_set_max_msg(ie_sock_t *s, int64_t bytes)
{
    if (!s || bytes < 1 || bytes > NET_MAX_MSG)
        return ie_error_set(IE_ERR_INVAL, "ie_sock_set_max_msg: %lld bytes (1..%lld)", (long long)bytes,
                            (long long)NET_MAX_MSG);
    if (zmq_setsockopt(s->zs, ZMQ_MAXMSGSIZE, &bytes, sizeof bytes) != 0)
        return zmq_fail(IE_ERR_INTERNAL, "MAXMSGSIZE");
    s->max_msg = bytes;
    return IE_OK;
}

/* Why a monitor and not ZMQ_ROUTER_NOTIFY: the router's own disconnect
 * notification is a DRAFT option that stable libzmq builds refuse. The
 * monitor's DISCONNECTED event carries the connection's file descriptor,
 * and every message carries the descriptor it came over (ZMQ_SRCFD), so a
 * caller can tie a peer's messages to the end of its connection. */
ie_status_t ie_sock_watch_peers(ie_sock_t *s, int heartbeat_ms)
{
    char ep[64];
    if (!s || heartbeat_ms < 0) return ie_error_set(IE_ERR_INVAL, "ie_sock_watch_peers: bad arguments");
    if (s->mon) return IE_OK;
    mon_forget(s); /* one monitor per socket: this one takes over the net's */
    s->monitored = 0;
    if (heartbeat_ms > 0) { /* a peer whose host vanished never closes: ZMTP pings find it */
        const int ivl = heartbeat_ms, tmo = 3 * heartbeat_ms;
        if (zmq_setsockopt(s->zs, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl) != 0 ||
            zmq_setsockopt(s->zs, ZMQ_HEARTBEAT_TIMEOUT, &tmo, sizeof tmo) != 0 ||
            zmq_setsockopt(s->zs, ZMQ_HEARTBEAT_TTL, &tmo, sizeof tmo) != 0)
            return zmq_fail(IE_ERR_INTERNAL, "heartbeat options");
    }
    snprintf(ep, sizeof ep, "inproc://ie-monitor-%p", (void *)s);
    if (zmq_socket_monitor(s->zs, ep, ZMQ_EVENT_DISCONNECTED | NET_MON_EVENTS) != 0)
        return zmq_fail(IE_ERR_INTERNAL, "monitor");
    void *m = zmq_socket(s->net->ctx, ZMQ_PAIR);
    const int linger = 0;
    if (!m || zmq_setsockopt(m, ZMQ_LINGER, &linger, sizeof linger) != 0 || zmq_connect(m, ep) != 0) {
        ie_status_t st = zmq_fail(IE_ERR_INTERNAL, "monitor socket");
        zmq_socket_monitor(s->zs, NULL, 0);
        if (m) zmq_close(m);
        return st;
    }
    s->mon = m;
    return IE_OK;
}

int ie_sock_last_peer(const ie_sock_t *s) { return s ? s->last_fd : -1; }

int ie_sock_peers_gone(ie_sock_t *s, int *fds, int cap)
{
    int n = 0;
    if (!s || !s->mon) return 0;
    for (;;) { /* an event is two frames: (u16 event, u32 value), the endpoint */
        zmq_msg_t a, b;
        zmq_msg_init(&a);
        if (zmq_msg_recv(&a, s->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&a);
            break;
        }
        int more = zmq_msg_more(&a);
        uint16_t ev = 0;
        uint32_t fd = 0;
        if (zmq_msg_size(&a) >= 6) {
            memcpy(&ev, zmq_msg_data(&a), 2);
            memcpy(&fd, (const char *)zmq_msg_data(&a) + 2, 4);
        }
        zmq_msg_close(&a);
        while (more) {
            zmq_msg_init(&b);
            if (zmq_msg_recv(&b, s->mon, 0) < 0) more = 0;
            else more = zmq_msg_more(&b);
            zmq_msg_close(&b);
        }
        if (ev == ZMQ_EVENT_DISCONNECTED && n < cap) fds[n++] = (int)fd;
        else if (ev & NET_MON_EVENTS) mon_report(s->net, &s->pmon, ev, fd); /* fd: the event's value */
    }
    return n;
}

int ie_sock_poll(ie_sock_t *const *socks, int n, int *ready, int timeout_ms)
{
    zmq_pollitem_t stack[16], *items = stack;
    int rc;

    if (!socks || !ready || n < 1) {
        ie_error_set(IE_ERR_INVAL, "ie_sock_poll: no sockets");
        return -1;
    }
    if (n > (int)(sizeof stack / sizeof stack[0])) {
        items = calloc((size_t)n, sizeof *items);
        if (!items) {
            ie_error_set(IE_ERR_NOMEM, "transport: out of memory");
            return -1;
        }
    }
    for (int i = 0; i < n; i++) {
        items[i] = (zmq_pollitem_t){socks[i]->zs, 0, ZMQ_POLLIN, 0};
        ready[i] = 0;
    }
    rc = zmq_poll(items, n, timeout_ms < 0 ? -1 : (long)timeout_ms);
    if (rc < 0) {
        if (zmq_errno() == EINTR) rc = 0;
        else zmq_fail(IE_ERR_UNAVAILABLE, "poll");
    }
    for (int i = 0; rc > 0 && i < n; i++) ready[i] = (items[i].revents & ZMQ_POLLIN) != 0;
    if (items != stack) free(items);
    return rc;
}

/* ------------------------------------------------------------ endpoints */

/* "tcp://HOST:PORT" (HOST may be "[v6]") -> host[], port[]; 0 when the
 * endpoint is not tcp or has no port. */
static int tcp_split(const char *ep, char *host, size_t host_cap, char *port, size_t port_cap)
{
    if (!ep || strncmp(ep, "tcp://", 6) != 0) return 0;
    const char *h = ep + 6, *colon = strrchr(h, ':');
    if (!colon || colon == h || !colon[1]) return 0;
    size_t hn = (size_t)(colon - h);
    if (h[0] == '[' && hn >= 2 && h[hn - 1] == ']') {
        h++;
        hn -= 2;
    }
    const char *semi = strchr(h, ';'); /* "tcp://src;dst": only the destination matters here */
    if (semi && semi < colon) return 0;
    if (hn >= host_cap || strlen(colon + 1) >= port_cap) return 0;
    memcpy(host, h, hn);
    host[hn] = '\0';
    snprintf(port, port_cap, "%s", colon + 1);
    return 1;
}

ie_status_t ie_endpoint_probe(const char *endpoint, int timeout_ms)
{
    char host[256], port[32];
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    ie_status_t st = IE_OK;
    int err = 0;

    if (!tcp_split(endpoint, host, sizeof host, port, sizeof port)) return IE_OK; /* inproc, ipc: nothing to try */
    const int gai = getaddrinfo(host, port, &hints, &res);
    if (gai != 0) return ie_error_set(IE_ERR_UNAVAILABLE, "cannot resolve %s: %s", endpoint, gai_strerror(gai));
    err = ETIMEDOUT;
    for (const struct addrinfo *ai = res; ai && err; ai = ai->ai_next) {
        const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            err = 0;
        } else if (errno != EINPROGRESS) {
            err = errno;
        } else {
            struct pollfd pf = {fd, POLLOUT, 0};
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            int rc;
            while ((rc = poll(&pf, 1, timeout_ms)) < 0 && errno == EINTR) {}
            if (rc == 0) err = ETIMEDOUT;
            else if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0) err = errno;
            else err = soerr;
        }
        close(fd);
    }
    freeaddrinfo(res);
    if (err) st = ie_error_set(IE_ERR_UNAVAILABLE, "%s is unreachable: %s", endpoint, strerror(err));
    return st;
}

ie_status_t ie_endpoint_local_addr(const char *endpoint, char *out, size_t cap)
{
    char host[256], port[32], addr[INET6_ADDRSTRLEN];
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    ie_status_t st = IE_OK;
    int fd = -1;

    if (!out || !cap) return ie_error_set(IE_ERR_INVAL, "ie_endpoint_local_addr: no room");
    out[0] = '\0';
    if (!tcp_split(endpoint, host, sizeof host, port, sizeof port))
        return ie_error_set(IE_ERR_INVAL, "%s is not a tcp://HOST:PORT endpoint", endpoint ? endpoint : "(null)");
    const int gai = getaddrinfo(host, port, &hints, &res);
    if (gai != 0) return ie_error_set(IE_ERR_UNAVAILABLE, "cannot resolve %s: %s", endpoint, gai_strerror(gai));
    /* a connected UDP socket sends nothing; the kernel only picks the route */
    fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        st = ie_error_set(IE_ERR_UNAVAILABLE, "no route to %s: %s", endpoint, strerror(errno));
        goto cleanup;
    }
    const void *a = ss.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                             : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
    if (!inet_ntop(ss.ss_family, a, addr, sizeof addr)) {
        st = ie_error_set(IE_ERR_INTERNAL, "inet_ntop: %s", strerror(errno));
        goto cleanup;
    }
    if ((size_t)snprintf(out, cap, ss.ss_family == AF_INET6 ? "[%s]" : "%s", addr) >= cap)
        st = ie_error_set(IE_ERR_RANGE, "address %s does not fit", addr);

cleanup:
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return st;
}

/* ------------------------------------------------------------ keys */

/* Write text to path, created fresh with mode (O_EXCL: never through an
 * existing file or link), synced to disk. */
static ie_status_t write_key_file(const char *path, const char *text, mode_t mode)
{
    ie_status_t st = IE_OK;
    const size_t n = strlen(text);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);

    if (fd < 0) {
        return ie_error_set(IE_ERR_IO, "keys: cannot create %s: %s%s", path, strerror(errno),
                            errno == EEXIST ? " (use --force to replace it)" : "");
    }
    if (fchmod(fd, mode) != 0) { /* the umask may have narrowed .pub; widen it to what we promise */
        st = ie_error_set(IE_ERR_IO, "keys: chmod %s: %s", path, strerror(errno));
        goto cleanup;
    }
    for (size_t off = 0; off < n;) {
        const ssize_t w = write(fd, text + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            st = ie_error_set(IE_ERR_IO, "keys: write %s: %s", path, strerror(errno));
            goto cleanup;
        }
        off += (size_t)w;
    }
    if (fsync(fd) != 0) st = ie_error_set(IE_ERR_IO, "keys: fsync %s: %s", path, strerror(errno));

cleanup:
    if (close(fd) != 0 && st == IE_OK) st = ie_error_set(IE_ERR_IO, "keys: close %s: %s", path, strerror(errno));
    if (st != IE_OK) unlink(path);
    return st;
}

ie_status_t ie_keys_generate(const char *dir, const char *name, int force)
{
    ie_status_t st = IE_OK;
    char pub[Z85_LEN + 1], sec[Z85_LEN + 1], text[Z85_LEN + 2];
    char pub_path[4096], key_path[4096];
    int wrote_key = 0;

    if (!dir || !name || !*name || strchr(name, '/') || name[0] == '.')
        return ie_error_set(IE_ERR_INVAL, "keys: a key name must be a plain file name");
    if ((size_t)snprintf(pub_path, sizeof pub_path, "%s/%s.pub", dir, name) >= sizeof pub_path ||
        (size_t)snprintf(key_path, sizeof key_path, "%s/%s.key", dir, name) >= sizeof key_path)
        return ie_error_set(IE_ERR_INVAL, "keys: path too long");
    if (!zmq_has("curve")) return ie_error_set(IE_ERR_UNSUPPORTED, "keys: this libzmq has no CURVE support");
    if (!force) { /* refuse before writing either file, so a pair is never half replaced */
        struct stat sb;
        if (lstat(pub_path, &sb) == 0 || lstat(key_path, &sb) == 0)
            return ie_error_set(IE_ERR_IO, "keys: %s/%s.{pub,key} exists (use --force to replace it)", dir, name);
    } else {
        /* --force: remove, then still create with O_EXCL, so the new secret
         * never inherits an old file's mode or follows a planted link */
        if ((unlink(key_path) != 0 && errno != ENOENT) || (unlink(pub_path) != 0 && errno != ENOENT))
            return ie_error_set(IE_ERR_IO, "keys: cannot replace %s/%s: %s", dir, name, strerror(errno));
    }
    if (zmq_curve_keypair(pub, sec) != 0) return zmq_fail(IE_ERR_INTERNAL, "zmq_curve_keypair");

    snprintf(text, sizeof text, "%s\n", sec);
    if ((st = write_key_file(key_path, text, 0600)) != IE_OK) goto cleanup;
    wrote_key = 1;
    snprintf(text, sizeof text, "%s\n", pub);
    if ((st = write_key_file(pub_path, text, 0644)) != IE_OK) goto cleanup;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* make the new names durable too */
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }

cleanup:
    if (st != IE_OK && wrote_key) unlink(key_path);
    explicit_bzero(sec, sizeof sec);
    explicit_bzero(text, sizeof text);
    return st;
}

ie_status_t ie_keys_load(const char *path, char out[41])
{
    ie_status_t st = IE_OK;
    char buf[256];
    size_t n = 0;
    struct stat sb;
    int fd = -1;

    if (!path || !out) return ie_error_set(IE_ERR_INVAL, "ie_keys_load: NULL argument");
    out[0] = '\0';
    const size_t plen = strlen(path);
    const int secret = plen >= 4 && strcmp(path + plen - 4, ".key") == 0;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ie_error_set(IE_ERR_IO, "keys: cannot open %s: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = ie_error_set(IE_ERR_IO, "keys: %s is not a regular file", path);
        goto cleanup;
    }
    if (secret && (sb.st_mode & 077)) {
        st = ie_error_set(IE_ERR_INVAL,
                          "keys: secret key %s is accessible by group or others (mode %03o); run chmod 600 %s",
                          path, (unsigned)(sb.st_mode & 0777), path);
        goto cleanup;
    }
    while (n < sizeof buf) {
        const ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            st = ie_error_set(IE_ERR_IO, "keys: read %s: %s", path, strerror(errno));
            goto cleanup;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    int ok = n >= Z85_LEN && n < sizeof buf;
    for (size_t i = Z85_LEN; ok && i < n; i++)
        ok = buf[i] == '\n' || buf[i] == '\r' || buf[i] == ' ' || buf[i] == '\t';
    if (ok) {
        memcpy(out, buf, Z85_LEN);
        out[Z85_LEN] = '\0';
        ok = z85_valid(out);
    }
    if (!ok) {
        out[0] = '\0';
        st = ie_error_set(IE_ERR_FORMAT, "keys: %s does not hold one Z85 key (40 characters)", path);
    }

cleanup:
    explicit_bzero(buf, sizeof buf);
    close(fd);
    return st;
}

ie_status_t ie_net_curve_from_dir(ie_net_t *net, const char *dir, const char *name, const char *authorized_dir)
{
    char path[4096], pub[41], sec[41];
    ie_status_t st;
    if (!dir || !name) return ie_error_set(IE_ERR_INVAL, "transport: CURVE needs a key directory and a key name");
    snprintf(path, sizeof path, "%s/%s.pub", dir, name);
    if ((st = ie_keys_load(path, pub)) != IE_OK) return st;
    snprintf(path, sizeof path, "%s/%s.key", dir, name);
    if ((st = ie_keys_load(path, sec)) != IE_OK) return st;
    st = ie_net_curve(net, pub, sec, authorized_dir);
    explicit_bzero(sec, sizeof sec); /* the secret leaves only through ie_net_curve */
    return st;
}

/* test_transport.c — ie_transport over inproc, ipc and tcp: DEALER<->ROUTER
 * and PUSH<->PULL with a 4 MB frame, alignment of received frames, timeouts,
 * poll, ROUTER_MANDATORY, the frame-count limit, the ends of a watched
 * router's connections, the message-size cap, CURVE with the ZAP handler
 * (authorized client gets through, unknown key gets nothing and is logged,
 * run-time authorization), and key files (modes, refusal of an open secret).
 */
#define _GNU_SOURCE
#include "ie_transport.h"

#include <CUnit/Basic.h>

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BIG (4u << 20)

static char g_tmp[64]; /* mkdtemp dir for ipc sockets and key files */

static int64_t ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static uint8_t *big_frame(void)
{
    uint8_t *b = malloc(BIG);
    for (size_t i = 0; i < BIG; i++) b[i] = (uint8_t)(i * 2654435761u >> 13);
    return b;
}

/* Endpoint to bind for transport t ("inproc", "ipc", "tcp"). */
static void endpoint(const char *t, const char *name, char *out, size_t cap)
{
    if (strcmp(t, "inproc") == 0) snprintf(out, cap, "inproc://%s", name);
    else if (strcmp(t, "ipc") == 0) snprintf(out, cap, "ipc://%s/%s.sock", g_tmp, name);
    else snprintf(out, cap, "tcp://127.0.0.1:0");
}

/* ------------------------------------------------------------ plain transports */

static void router_dealer(const char *t)
{
    ie_net_t *net = NULL;
    ie_sock_t *r = NULL, *d = NULL;
    ie_parts_t in = {0};
    char ep[256], bound[256];
    uint8_t *big = big_frame();

    CU_ASSERT_EQUAL_FATAL(ie_net_new(&net), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_ROUTER, &r), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_DEALER, &d), IE_OK);
    endpoint(t, "rd", ep, sizeof ep);
    CU_ASSERT_EQUAL_FATAL(ie_sock_bind(r, ep, bound, sizeof bound), IE_OK);
    if (strcmp(t, "tcp") == 0) {
        CU_ASSERT_EQUAL(strncmp(bound, "tcp://127.0.0.1:", 16), 0);
        CU_ASSERT_NOT_EQUAL(strcmp(bound, "tcp://127.0.0.1:0"), 0);
    } else {
        CU_ASSERT_STRING_EQUAL(bound, ep);
    }
    CU_ASSERT_EQUAL(ie_sock_set_identity(d, "w1", 2), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_connect(d, bound, NULL), IE_OK);

    const ie_frame_t out[3] = {{"hdr", 3}, {big, BIG}, {"", 0}};
    CU_ASSERT_EQUAL(ie_sock_send(d, out, 3, 2000), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_recv(r, &in, 5000), IE_OK);
    CU_ASSERT_EQUAL_FATAL(in.n, 4); /* identity + 3 */
    CU_ASSERT(in.size[0] == 2 && memcmp(in.data[0], "w1", 2) == 0);
    CU_ASSERT(in.size[1] == 3 && memcmp(in.data[1], "hdr", 3) == 0);
    CU_ASSERT(in.size[2] == BIG && memcmp(in.data[2], big, BIG) == 0);
    CU_ASSERT_EQUAL(in.size[3], 0);
    for (int i = 0; i < in.n; i++) CU_ASSERT(aligned16(in.data[i]));

    /* reply by identity; the receive buffers are reused */
    void *kept = in.data[2];
    const ie_frame_t rep[2] = {{"w1", 2}, {big, BIG}};
    CU_ASSERT_EQUAL(ie_sock_send(r, rep, 2, 2000), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_recv(d, &in, 5000), IE_OK);
    CU_ASSERT_EQUAL_FATAL(in.n, 1);
    CU_ASSERT(in.size[0] == BIG && memcmp(in.data[0], big, BIG) == 0 && aligned16(in.data[0]));
    CU_ASSERT_PTR_EQUAL(in.data[2], kept);

    /* ROUTER_MANDATORY: a reply to nobody is an error, not a silent drop */
    const ie_frame_t lost[2] = {{"nobody", 6}, {"x", 1}};
    CU_ASSERT_EQUAL(ie_sock_send(r, lost, 2, 100), IE_ERR_UNAVAILABLE);

    ie_parts_free(&in);
    ie_sock_destroy(&d);
    ie_sock_destroy(&r);
    CU_ASSERT_PTR_NULL(r);
    ie_net_destroy(&net);
    CU_ASSERT_PTR_NULL(net);
    free(big);
}

static void push_pull(const char *t)
{
    ie_net_t *net = NULL;
    ie_sock_t *pull = NULL, *push = NULL;
    ie_parts_t in = {0};
    char ep[256], bound[256];
    uint8_t *big = big_frame();

    CU_ASSERT_EQUAL_FATAL(ie_net_new(&net), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_PULL, &pull), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_PUSH, &push), IE_OK);
    endpoint(t, "pp", ep, sizeof ep);
    CU_ASSERT_EQUAL_FATAL(ie_sock_bind(pull, ep, bound, sizeof bound), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_connect(push, bound, NULL), IE_OK);
    for (int k = 0; k < 3; k++) {
        const int32_t tok[3] = {k, 1, 2};
        const ie_frame_t out[3] = {{"step", 4}, {tok, sizeof tok}, {big, BIG}};
        CU_ASSERT_EQUAL(ie_sock_send(push, out, 3, 2000), IE_OK);
    }
    for (int k = 0; k < 3; k++) {
        CU_ASSERT_EQUAL_FATAL(ie_sock_recv(pull, &in, 5000), IE_OK);
        CU_ASSERT_EQUAL_FATAL(in.n, 3);
        CU_ASSERT_EQUAL(in.size[1], 12);
        CU_ASSERT(aligned16(in.data[1]));
        CU_ASSERT_EQUAL(((const int32_t *)in.data[1])[0], k); /* read in place */
        CU_ASSERT(in.size[2] == BIG && memcmp(in.data[2], big, BIG) == 0);
    }
    ie_parts_free(&in);
    ie_sock_destroy(&push);
    ie_sock_destroy(&pull);
    ie_net_destroy(&net);
    free(big);
}

static void test_rd_inproc(void) { router_dealer("inproc"); }
static void test_rd_ipc(void) { router_dealer("ipc"); }
static void test_rd_tcp(void) { router_dealer("tcp"); }
static void test_pp_inproc(void) { push_pull("inproc"); }
static void test_pp_ipc(void) { push_pull("ipc"); }
static void test_pp_tcp(void) { push_pull("tcp"); }

static void test_timeouts_and_poll(void)
{
    ie_net_t *net = NULL;
    ie_sock_t *a = NULL, *b = NULL, *push = NULL, *lonely = NULL;
    ie_parts_t in = {0};
    int ready[2] = {-1, -1};

    CU_ASSERT_EQUAL_FATAL(ie_net_new(&net), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_PULL, &a), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_PULL, &b), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_PUSH, &push), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_bind(a, "inproc://a", NULL, 0), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_bind(b, "inproc://b", NULL, 0), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_bind(b, "inproc://b", NULL, 0), IE_ERR_UNAVAILABLE); /* in use */

    int64_t t0 = ms_now();
    CU_ASSERT_EQUAL(ie_sock_recv(a, &in, 80), IE_ERR_TIMEOUT);
    int64_t dt = ms_now() - t0;
    CU_ASSERT(dt >= 70 && dt < 1000);
    CU_ASSERT_EQUAL(in.n, 0);
    t0 = ms_now();
    CU_ASSERT_EQUAL(ie_sock_recv(a, &in, 0), IE_ERR_TIMEOUT);
    CU_ASSERT(ms_now() - t0 < 100);

    ie_sock_t *const socks[2] = {a, b};
    CU_ASSERT_EQUAL(ie_sock_poll(socks, 2, ready, 30), 0);
    CU_ASSERT(ready[0] == 0 && ready[1] == 0);
    CU_ASSERT_EQUAL_FATAL(ie_sock_connect(push, "inproc://b", NULL), IE_OK);
    const ie_frame_t f = {"ping", 4};
    CU_ASSERT_EQUAL(ie_sock_send(push, &f, 1, 1000), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_poll(socks, 2, ready, 2000), 1);
    CU_ASSERT(ready[0] == 0 && ready[1] == 1);
    CU_ASSERT_EQUAL(ie_sock_recv(b, &in, 0), IE_OK);
    CU_ASSERT(in.n == 1 && in.size[0] == 4 && memcmp(in.data[0], "ping", 4) == 0);

    /* a PUSH with no peer cannot queue: the send times out */
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_PUSH, &lonely), IE_OK);
    t0 = ms_now();
    CU_ASSERT_EQUAL(ie_sock_send(lonely, &f, 1, 50), IE_ERR_TIMEOUT);
    CU_ASSERT(ms_now() - t0 < 1000);

    /* more than 64 frames: dropped whole, the next message is fine */
    ie_frame_t many[65];
    for (int i = 0; i < 65; i++) many[i] = (ie_frame_t){"f", 1};
    CU_ASSERT_EQUAL(ie_sock_send(push, many, 65, 1000), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_send(push, many, 64, 1000), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_recv(b, &in, 2000), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(in.n, 0);
    CU_ASSERT_EQUAL(ie_sock_recv(b, &in, 2000), IE_OK);
    CU_ASSERT_EQUAL(in.n, 64);

    /* argument checks */
    CU_ASSERT_EQUAL(ie_sock_send(push, many, 0, 10), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_sock_set_identity(push, "\0x", 2), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_sock_bind(a, "bogus://x", NULL, 0), IE_ERR_INVAL);
    ie_sock_t *none = (ie_sock_t *)&in;
    CU_ASSERT_EQUAL(ie_sock_new(net, (ie_sock_type_t)99, &none), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(none);

    ie_parts_free(&in);
    ie_sock_destroy(&lonely);
    ie_sock_destroy(&push);
    ie_sock_destroy(&a);
    ie_sock_destroy(&b);
    ie_sock_destroy(&b); /* NULL is fine */
    ie_net_destroy(&net);
    ie_net_destroy(NULL);
}

/* A watched ROUTER learns which connection a message came over and when
 * that connection ends; a message-size cap drops a larger frame (and its
 * connection) without delivering it, while smaller ones still pass. */
static void test_watch_peers_and_max_msg(void)
{
    ie_net_t *net = NULL;
    ie_sock_t *r = NULL, *d = NULL, *d2 = NULL;
    ie_parts_t in = {0};
    char bound[64];
    int fds[8], n = 0;

    CU_ASSERT_EQUAL_FATAL(ie_net_new(&net), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_ROUTER, &r), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_set_max_msg(r, 0), IE_ERR_INVAL);
    CU_ASSERT_EQUAL_FATAL(ie_sock_set_max_msg(r, 1024), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_watch_peers(r, 1000), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_bind(r, "tcp://127.0.0.1:0", bound, sizeof bound), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_peers_gone(r, fds, 8), 0);
    CU_ASSERT_EQUAL(ie_sock_last_peer(r), -1);

    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_DEALER, &d), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_connect(d, bound, NULL), IE_OK);
    const ie_frame_t f = {"hi", 2};
    CU_ASSERT_EQUAL(ie_sock_send(d, &f, 1, 1000), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_recv(r, &in, 5000), IE_OK);
    const int peer = ie_sock_last_peer(r);
    CU_ASSERT(peer >= 0);
    ie_sock_destroy(&d); /* the connection ends: reported with the same number */
    for (int64_t end = ms_now() + 5000; n == 0 && ms_now() < end; usleep(10000)) n = ie_sock_peers_gone(r, fds, 8);
    CU_ASSERT_EQUAL(n, 1);
    CU_ASSERT_EQUAL(fds[0], peer);

    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_DEALER, &d2), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_connect(d2, bound, NULL), IE_OK);
    static char big[4096];
    const ie_frame_t fb = {big, sizeof big};
    CU_ASSERT_EQUAL(ie_sock_send(d2, &fb, 1, 1000), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_recv(r, &in, 500), IE_ERR_TIMEOUT); /* never delivered */
    ie_sock_destroy(&d2);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_DEALER, &d2), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_connect(d2, bound, NULL), IE_OK);
    const ie_frame_t fs = {big, 1000};
    CU_ASSERT_EQUAL(ie_sock_send(d2, &fs, 1, 1000), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_recv(r, &in, 5000), IE_OK);
    CU_ASSERT(in.n == 2 && in.size[1] == 1000);
    ie_parts_free(&in);
    ie_sock_destroy(&d2);
    ie_sock_destroy(&r);
    ie_net_destroy(&net);
}

static void test_bind_wildcard(void)
{
    ie_net_t *net = NULL;
    ie_sock_t *r = NULL, *d = NULL;
    ie_parts_t in = {0};
    char bound[64], tiny[8];

    CU_ASSERT_EQUAL_FATAL(ie_net_new(&net), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_ROUTER, &r), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_DEALER, &d), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_bind(r, "tcp://*:0", tiny, sizeof tiny), IE_ERR_RANGE);
    CU_ASSERT_EQUAL_FATAL(ie_sock_bind(r, "tcp://*:0", bound, sizeof bound), IE_OK);
    CU_ASSERT_EQUAL(strncmp(bound, "tcp://127.0.0.1:", 16), 0);
    CU_ASSERT_EQUAL(ie_sock_connect(d, bound, NULL), IE_OK);
    const ie_frame_t f = {"hi", 2};
    CU_ASSERT_EQUAL(ie_sock_send(d, &f, 1, 1000), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_recv(r, &in, 5000), IE_OK);
    CU_ASSERT_EQUAL(in.n, 2);
    CU_ASSERT_EQUAL(ie_sock_disconnect(d, bound), IE_OK);
    CU_ASSERT_NOT_EQUAL(ie_sock_disconnect(d, "tcp://127.0.0.1:1"), IE_OK);
    ie_parts_free(&in);
    ie_sock_destroy(&d);
    ie_sock_destroy(&r);
    ie_net_destroy(&net);
}

/* ------------------------------------------------------------ CURVE */

typedef struct keypair {
    char pub[41], sec[41];
} keypair_t;

static void make_keys(const char *dir, const char *name, keypair_t *k)
{
    char path[512];
    mkdir(dir, 0700);
    CU_ASSERT_EQUAL_FATAL(ie_keys_generate(dir, name, 1), IE_OK);
    snprintf(path, sizeof path, "%s/%s.pub", dir, name);
    CU_ASSERT_EQUAL_FATAL(ie_keys_load(path, k->pub), IE_OK);
    snprintf(path, sizeof path, "%s/%s.key", dir, name);
    CU_ASSERT_EQUAL_FATAL(ie_keys_load(path, k->sec), IE_OK);
}

/* A secure net with keys k, one DEALER connected to server `ep` (key srv). */
static void curve_client(const keypair_t *k, const char *ep, const char *srv, ie_net_t **net, ie_sock_t **d)
{
    CU_ASSERT_EQUAL_FATAL(ie_net_new(net), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_net_curve(*net, k->pub, k->sec, NULL), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(*net, IE_SOCK_DEALER, d), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_connect(*d, ep, srv), IE_OK);
}

static int file_has(const char *path, const char *needle)
{
    char buf[8192];
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

static void test_curve(void)
{
    char auth[128], other[128], ep[64], log_path[160], line[160];
    keypair_t srv, cli, stranger;
    ie_net_t *snet = NULL, *cnet = NULL, *xnet = NULL, *pnet = NULL;
    ie_sock_t *r = NULL, *d = NULL, *x = NULL, *p = NULL;
    ie_parts_t in = {0};
    const char *mine = NULL;

    snprintf(auth, sizeof auth, "%s/authorized", g_tmp);
    snprintf(other, sizeof other, "%s/other", g_tmp);
    make_keys(other, "server", &srv);
    make_keys(auth, "client", &cli);
    make_keys(other, "stranger", &stranger);

    CU_ASSERT_EQUAL_FATAL(ie_net_new(&snet), IE_OK);
    CU_ASSERT_EQUAL(ie_net_is_secure(snet, NULL), 0);
    CU_ASSERT_EQUAL(ie_net_curve(snet, srv.pub, cli.sec, auth), IE_ERR_INVAL); /* not a pair */
    CU_ASSERT_EQUAL(ie_net_curve(snet, "short", srv.sec, auth), IE_ERR_INVAL);
    CU_ASSERT_EQUAL_FATAL(ie_net_curve(snet, srv.pub, srv.sec, auth), IE_OK);
    CU_ASSERT_EQUAL(ie_net_curve(snet, srv.pub, srv.sec, auth), IE_ERR_INVAL); /* once */
    CU_ASSERT_EQUAL(ie_net_is_secure(snet, &mine), 1);
    CU_ASSERT_STRING_EQUAL(mine, srv.pub);
    CU_ASSERT_EQUAL(ie_net_authorize(snet, IE_ROLE_WORKER, "not a key"), IE_ERR_INVAL);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(snet, IE_SOCK_ROUTER, &r), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_bind(r, "tcp://127.0.0.1:0", ep, sizeof ep), IE_OK);

    /* an authorized client talks both ways */
    curve_client(&cli, ep, srv.pub, &cnet, &d);
    CU_ASSERT_EQUAL(ie_sock_connect(d, ep, NULL), IE_ERR_INVAL); /* secure net: server key needed */
    const ie_frame_t hello = {"hello", 5};
    CU_ASSERT_EQUAL(ie_sock_send(d, &hello, 1, 2000), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_recv(r, &in, 5000), IE_OK);
    CU_ASSERT_EQUAL_FATAL(in.n, 2);
    CU_ASSERT(in.size[1] == 5 && memcmp(in.data[1], "hello", 5) == 0);
    const ie_frame_t back[2] = {{in.data[0], in.size[0]}, {"welcome", 7}};
    CU_ASSERT_EQUAL(ie_sock_send(r, back, 2, 2000), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_recv(d, &in, 5000), IE_OK);
    CU_ASSERT(in.n == 1 && in.size[0] == 7);

    /* an unknown key gets nothing through, and the refusal is logged */
    snprintf(log_path, sizeof log_path, "%s/stderr.log", g_tmp);
    fflush(stderr);
    const int saved = dup(2), fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CU_ASSERT_FATAL(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    curve_client(&stranger, ep, srv.pub, &xnet, &x);
    CU_ASSERT_EQUAL(ie_sock_send(x, &hello, 1, 2000), IE_OK); /* queued locally */
    CU_ASSERT_EQUAL(ie_sock_recv(r, &in, 700), IE_ERR_TIMEOUT);
    /* a plain (NULL mechanism) client is refused as well */
    CU_ASSERT_EQUAL_FATAL(ie_net_new(&pnet), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(pnet, IE_SOCK_DEALER, &p), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_connect(p, ep, NULL), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_send(p, &hello, 1, 2000), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_recv(r, &in, 500), IE_ERR_TIMEOUT);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    snprintf(line, sizeof line, "transport: refused CURVE client %s from 127.0.0.1: not an authorized worker key",
             stranger.pub);
    CU_ASSERT(file_has(log_path, line));
    if (!file_has(log_path, line)) fprintf(stderr, "\n  no line \"%s\" in %s\n", line, log_path);

    /* authorized at run time: a new connection gets through (libzmq never
     * retries a connection whose handshake was refused) */
    CU_ASSERT_EQUAL(ie_net_authorize(snet, IE_ROLE_WORKER, stranger.pub), IE_OK);
    ie_sock_destroy(&x);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(xnet, IE_SOCK_DEALER, &x), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_connect(x, ep, srv.pub), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_send(x, &hello, 1, 2000), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_recv(r, &in, 5000), IE_OK);
    CU_ASSERT(in.n == 2 && in.size[1] == 5);

    ie_parts_free(&in);
    ie_sock_destroy(&p);
    ie_sock_destroy(&x);
    ie_sock_destroy(&d);
    ie_sock_destroy(&r);
    ie_net_destroy(&pnet);
    ie_net_destroy(&xnet);
    ie_net_destroy(&cnet);
    ie_net_destroy(&snet);
}

/* inproc skips CURVE on a secure net (no handshake inside a process). */
static void test_curve_inproc(void)
{
    keypair_t k;
    char dir[128];
    ie_net_t *net = NULL;
    ie_sock_t *a = NULL, *b = NULL;
    ie_parts_t in = {0};
    snprintf(dir, sizeof dir, "%s/inproc", g_tmp);
    make_keys(dir, "self", &k);
    CU_ASSERT_EQUAL_FATAL(ie_net_new(&net), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_net_curve(net, k.pub, k.sec, NULL), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_PULL, &a), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_sock_new(net, IE_SOCK_PUSH, &b), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_bind(a, "inproc://secure", NULL, 0), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_connect(b, "inproc://secure", NULL), IE_OK);
    const ie_frame_t f = {"x", 1};
    CU_ASSERT_EQUAL(ie_sock_send(b, &f, 1, 1000), IE_OK);
    CU_ASSERT_EQUAL(ie_sock_recv(a, &in, 2000), IE_OK);
    ie_parts_free(&in);
    ie_sock_destroy(&a);
    ie_sock_destroy(&b);
    ie_net_destroy(&net);
}

/* ------------------------------------------------------------ keys */

static void test_keys(void)
{
    char dir[128], pub[192], key[192], k1[41], k2[41], s[41];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s/keys", g_tmp);
    CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0700), 0);
    snprintf(pub, sizeof pub, "%s/node.pub", dir);
    snprintf(key, sizeof key, "%s/node.key", dir);

    const mode_t old = umask(077); /* the .pub is still 0644: widened on purpose */
    CU_ASSERT_EQUAL_FATAL(ie_keys_generate(dir, "node", 0), IE_OK);
    umask(old);
    CU_ASSERT_EQUAL(stat(key, &sb), 0);
    CU_ASSERT_EQUAL(sb.st_mode & 0777, 0600);
    CU_ASSERT_EQUAL(sb.st_size, 41);
    CU_ASSERT_EQUAL(stat(pub, &sb), 0);
    CU_ASSERT_EQUAL(sb.st_mode & 0777, 0644);
    CU_ASSERT_EQUAL(ie_keys_load(pub, k1), IE_OK);
    CU_ASSERT_EQUAL(strlen(k1), 40);
    CU_ASSERT_EQUAL(ie_keys_load(key, s), IE_OK);

    CU_ASSERT_EQUAL(ie_keys_generate(dir, "node", 0), IE_ERR_IO); /* exists */
    CU_ASSERT_EQUAL(ie_keys_load(pub, k2), IE_OK);
    CU_ASSERT_STRING_EQUAL(k1, k2); /* untouched */
    CU_ASSERT_EQUAL(ie_keys_generate(dir, "node", 1), IE_OK);
    CU_ASSERT_EQUAL(ie_keys_load(pub, k2), IE_OK);
    CU_ASSERT_STRING_NOT_EQUAL(k1, k2);
    CU_ASSERT_EQUAL(stat(key, &sb), 0);
    CU_ASSERT_EQUAL(sb.st_mode & 0777, 0600);
    CU_ASSERT_EQUAL(ie_keys_generate(dir, "../evil", 0), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_keys_generate(dir, "", 0), IE_ERR_INVAL);

    /* a secret others can read is refused with a line that says what to do */
    CU_ASSERT_EQUAL(chmod(key, 0644), 0);
    CU_ASSERT_EQUAL(ie_keys_load(key, s), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "chmod 600"));
    CU_ASSERT_EQUAL(chmod(key, 0640), 0);
    CU_ASSERT_EQUAL(ie_keys_load(key, s), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(chmod(key, 0400), 0);
    CU_ASSERT_EQUAL(ie_keys_load(key, s), IE_OK);

    /* malformed key files */
    char bad[192];
    snprintf(bad, sizeof bad, "%s/bad.pub", dir);
    FILE *f = fopen(bad, "w");
    fputs("this is not a z85 key at all, not at all\n", f);
    fclose(f);
    CU_ASSERT_EQUAL(ie_keys_load(bad, s), IE_ERR_FORMAT);
    f = fopen(bad, "w");
    fprintf(f, "%s trailing\n", k1);
    fclose(f);
    CU_ASSERT_EQUAL(ie_keys_load(bad, s), IE_ERR_FORMAT);
    f = fopen(bad, "w");
    fprintf(f, "%s  \r\n\n", k1);
    fclose(f);
    CU_ASSERT_EQUAL(ie_keys_load(bad, s), IE_OK);
    CU_ASSERT_STRING_EQUAL(s, k1);
    snprintf(bad, sizeof bad, "%s/missing.pub", dir);
    CU_ASSERT_EQUAL(ie_keys_load(bad, s), IE_ERR_IO);
    CU_ASSERT_EQUAL(ie_keys_load(dir, s), IE_ERR_IO); /* a directory */

    /* a bad file among the authorized keys stops ie_net_curve with its name */
    {
        keypair_t kp;
        ie_net_t *net = NULL;
        char adir[128];
        snprintf(adir, sizeof adir, "%s/auth2", g_tmp);
        make_keys(adir, "ok", &kp);
        snprintf(bad, sizeof bad, "%s/broken.pub", adir);
        f = fopen(bad, "w");
        fputs("nope\n", f);
        fclose(f);
        CU_ASSERT_EQUAL_FATAL(ie_net_new(&net), IE_OK);
        CU_ASSERT_EQUAL(ie_net_curve(net, kp.pub, kp.sec, adir), IE_ERR_FORMAT);
        CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "broken.pub"));
        CU_ASSERT_EQUAL(ie_net_is_secure(net, NULL), 0);
        CU_ASSERT_EQUAL(ie_net_curve(net, kp.pub, kp.sec, NULL), IE_OK);
        ie_net_destroy(&net);
    }
}

static void rm_rf(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void)
{
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ie-transport-XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("transport", NULL, NULL);
    CU_add_test(s, "ROUTER<->DEALER inproc", test_rd_inproc);
    CU_add_test(s, "ROUTER<->DEALER ipc", test_rd_ipc);
    CU_add_test(s, "ROUTER<->DEALER tcp", test_rd_tcp);
    CU_add_test(s, "PUSH->PULL inproc", test_pp_inproc);
    CU_add_test(s, "PUSH->PULL ipc", test_pp_ipc);
    CU_add_test(s, "PUSH->PULL tcp", test_pp_tcp);
    CU_add_test(s, "timeouts, poll, frame limit", test_timeouts_and_poll);
    CU_add_test(s, "bind tcp://*:0", test_bind_wildcard);
    CU_add_test(s, "watched peers, message cap", test_watch_peers_and_max_msg);
    CU_add_test(s, "CURVE + ZAP", test_curve);
    CU_add_test(s, "CURVE net over inproc", test_curve_inproc);
    CU_add_test(s, "key files", test_keys);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    rm_rf(g_tmp);
    return fails ? 1 : 0;
}

/* test_lora_cache.c — the adapter registry (coordinator/src/lora_cache.c)
 * over a fake backend that records what is attached, and ie_lora_concat:
 *   - concat: y of the concatenated set == sum of the parts' scaled
 *     separate applications (f32 and bf16 parts, negative weights);
 *   - LRU: under a budget the least recently used unpinned idle adapter
 *     goes, a pinned one never, and a leased one never;
 *   - refcount: unloading a leased adapter takes its name at once and
 *     detaches it only after the release and the next step_begin;
 *   - sets: an equal set (any order) reuses its id and salt; salts are
 *     never 0 and never repeat, also for a name reloaded from disk;
 *   - reload: an evicted adapter is read again on acquire (loads count);
 *   - detached salts: every set detached (unload, deferred or not) is
 *     handed over once by ie_lora_cache_take_detached;
 *   - stepping thread: other threads' attaches and detaches wait for its
 *     step_begin and run there, errors and messages reach the caller;
 *   - budget: a real in-process backend's copies of a set (the worker's
 *     int8 copy on a quantized base, the sum of several parts) are charged
 *     to it, to the byte expected from the shapes, and evict; a load
 *     that would not fit with its copy is refused.
 */
#include "ie_backend.h"
#include "ie_lora_cache.h"
#include "ie_model_src.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#define LORA IE_TEST_DATA "/lora"

static ie_model_src_t *g_src;
static const ie_hparams_t *g_hp;

/* ---------------------------------------------------------- fake backend */
typedef struct fake {
    int attached[64];
    int n_parts[64];
    int adds, removes;
    pthread_t last_caller; /* the thread of the last add / remove */
    int begun;             /* async: the id begun (-1: none)         */
    int answer;            /* async: 0 owed, 1 ok, 2 refused (the
                              next attach's answer, used up by it)   */
    int polls;
} fake_t;

static ie_status_t f_step(void *self, const ie_batch_t *b, float *out)
{
    (void)self, (void)b, (void)out;
    return IE_OK;
}
static void f_clear(void *self, int seq) { (void)self, (void)seq; }
static ie_status_t f_set_len(void *self, int seq, int n)
{
    (void)self, (void)seq, (void)n;
    return IE_OK;
}
static ie_status_t f_bind(void *self, int seq, int first, const int32_t *pb, int n)
{
    (void)self, (void)seq, (void)first, (void)pb, (void)n;
    return IE_OK;
}
static ie_status_t f_add(void *self, const ie_backend_lora_part_t *parts, int n, int *id_out)
{
    fake_t *f = self;
    for (int i = 0; i < 64; i++)
        if (!f->attached[i]) {
            f->attached[i] = 1;
            f->n_parts[i] = n;
            f->adds++;
            f->last_caller = pthread_self();
            *id_out = i;
            (void)parts;
            return IE_OK;
        }
    return ie_error_set(IE_ERR_RANGE, "full");
}
static ie_status_t f_remove(void *self, int id)
{
    fake_t *f = self;
    if (id < 0 || id >= 64 || !f->attached[id]) return ie_error_set(IE_ERR_RANGE, "not attached");
    f->attached[id] = 0;
    f->removes++;
    f->last_caller = pthread_self();
    return IE_OK;
}
static ie_status_t f_add_begin(void *self, const ie_backend_lora_part_t *parts, int n, int *id_out)
{
    fake_t *f = self;
    ie_status_t st = f_add(self, parts, n, id_out);
    if (st == IE_OK) f->begun = *id_out;
    return st;
}
/* the ranks answer when the test sets f->answer */
static int f_add_poll(void *self, int id, int timeout_ms, ie_status_t *st)
{
    fake_t *f = self;
    (void)timeout_ms;
    f->polls++;
    *st = IE_OK;
    if (id != f->begun || !f->answer) return 0;
    if (f->answer == 2) {
        f->attached[id] = 0;
        *st = ie_error_set(IE_ERR_FORMAT, "worker rank 1: adapter differs");
    }
    f->begun = -1;
    f->answer = 0; /* one answer per attach */
    return 1;
}
static void f_destroy(void *self) { free(self); }
static const ie_backend_ops_t k_fake = {.name = "fake",
                                        .step = f_step,
                                        .seq_clear = f_clear,
                                        .seq_set_len = f_set_len,
                                        .kv_bind = f_bind,
                                        .lora_add = f_add,
                                        .lora_remove = f_remove,
                                        .destroy = f_destroy};

static const ie_backend_ops_t k_fake_async = {.name = "fake-async",
                                              .step = f_step,
                                              .seq_clear = f_clear,
                                              .seq_set_len = f_set_len,
                                              .kv_bind = f_bind,
                                              .lora_add = f_add,
                                              .lora_remove = f_remove,
                                              .lora_add_begin = f_add_begin,
                                              .lora_add_poll = f_add_poll,
                                              .destroy = f_destroy};

static fake_t *g_fake;

static ie_backend_t *fake_new_ops(const ie_backend_ops_t *ops)
{
    ie_backend_t *b = NULL;
    ie_backend_geom_t g = {
        .n_seq = 1, .n_ctx = 64, .max_batch = 8, .kv_block = 16, .kv_blocks = 4, .n_vocab = 512, .upkeep_ms = 50};
    g_fake = calloc(1, sizeof *g_fake);
    g_fake->begun = -1;
    CU_ASSERT_EQUAL_FATAL(ie_backend_new(ops, g_fake, &g, &b), IE_OK);
    return b;
}

static ie_backend_t *fake_new(void) { return fake_new_ops(&k_fake); }

static int n_attached(void)
{
    int n = 0;
    for (int i = 0; i < 64; i++) n += g_fake->attached[i];
    return n;
}

static int resident(ie_lora_cache_t *c, const char *name)
{
    ie_lora_info_t info[16];
    int n = ie_lora_cache_list(c, info, 16);
    for (int i = 0; i < n && i < 16; i++)
        if (!strcmp(info[i].name, name)) return info[i].resident;
    return -1;
}

static ie_lora_lease_t lease1(ie_lora_cache_t *c, const char *name)
{
    ie_lora_lease_t l;
    const ie_lora_use_t u = {name, NAN};
    CU_ASSERT_EQUAL(ie_lora_cache_acquire(c, &u, 1, &l), IE_OK);
    return l;
}

/* ------------------------------------------------------------------ concat */
static void apply(const ie_lora_mat_t *m, const float *x, float *y)
{
    for (int j = 0; j < m->rank; j++) {
        double t = 0;
        for (int64_t i = 0; i < m->n_in; i++) {
            float a = m->a ? m->a[j * m->n_in + i] : 0;
            if (!m->a) {
                uint32_t u = (uint32_t)m->a16[j * m->n_in + i] << 16;
                memcpy(&a, &u, 4);
            }
            t += (double)a * x[i];
        }
        for (int64_t o = 0; o < m->n_out; o++) {
            float b = m->bt ? m->bt[j * m->n_out + o] : 0;
            if (!m->bt) {
                uint32_t u = (uint32_t)m->bt16[j * m->n_out + o] << 16;
                memcpy(&b, &u, 4);
            }
            y[o] += (float)(m->scale * t * b);
        }
    }
}

static void test_concat_is_sum(void)
{
    ie_lora_t *p[3] = {0}, *cat = NULL;
    const char *names[3] = {LORA "/qv8", LORA "/mlp8bf16", LORA "/all16"};
    const float w[3] = {0.5f, -1.25f, 0.75f};
    for (int i = 0; i < 3; i++) CU_ASSERT_EQUAL_FATAL(ie_lora_load(names[i], g_hp, &p[i]), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_lora_concat((const ie_lora_t *const *)p, w, 3, &cat), IE_OK);
    CU_ASSERT_STRING_EQUAL(cat->format, "concat");
    double worst = 0;
    int checked = 0;
    for (int l = 0; l < cat->n_layer; l++)
        for (int m = 0; m < IE_LORA_NMOD; m++) {
            const ie_lora_mat_t *c = ie_lora_mat(cat, l, (ie_lora_mod_t)m);
            if (!c || !c->rank) continue;
            float x[256], want[512] = {0}, got[512] = {0};
            for (int64_t i = 0; i < c->n_in; i++) x[i] = sinf(0.37f * (float)i + (float)m) * 0.5f;
            int rank = 0;
            for (int k = 0; k < 3; k++) {
                const ie_lora_mat_t *pm = ie_lora_mat(p[k], l, (ie_lora_mod_t)m);
                if (!pm || !pm->rank) continue;
                float y[512] = {0};
                apply(pm, x, y);
                for (int64_t o = 0; o < c->n_out; o++) want[o] += w[k] * y[o];
                rank += pm->rank;
            }
            CU_ASSERT_EQUAL(c->rank, rank); /* ranks add up */
            apply(c, x, got);
            double mx = 1e-30;
            for (int64_t o = 0; o < c->n_out; o++) mx = fmax(mx, fabs(want[o]));
            for (int64_t o = 0; o < c->n_out; o++) worst = fmax(worst, fabs(got[o] - want[o]) / mx);
            checked++;
        }
    CU_ASSERT(checked == 2 * IE_LORA_NMOD); /* all16 adapts all seven, both layers */
    CU_ASSERT(worst < 1e-5);
    /* refusals */
    const float bad[2] = {1.0f, NAN};
    ie_lora_t *none = NULL;
    CU_ASSERT_EQUAL(ie_lora_concat((const ie_lora_t *const *)p, bad, 2, &none), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_lora_concat((const ie_lora_t *const *)p, w, 0, &none), IE_ERR_INVAL);
    ie_lora_destroy(&cat);
    for (int i = 0; i < 3; i++) ie_lora_destroy(&p[i]);
}

/* --------------------------------------------------------------- registry */
static void test_lru_pin_busy(void)
{
    ie_backend_t *b = fake_new();
    ie_lora_cache_t *c = NULL;
    /* in memory: qv8 14336 B, all16 131072, o4f16 7168, mlp8bf16 18432;
     * the budget holds qv8 + all16 + mlp8bf16, not all four */
    ie_lora_cache_opts_t o = {.backend = b, .hp = g_hp, .budget_bytes = 14336 + 131072 + 18432};
    CU_ASSERT_EQUAL_FATAL(ie_lora_cache_new(&o, &c), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "qv8", LORA "/qv8", 1.0f, 1), IE_OK); /* pinned */
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "all16", LORA "/all16", 1.0f, 0), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "o4", LORA "/o4f16", 1.0f, 0), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "o4", LORA "/o4f16", 1.0f, 0), IE_ERR_INVAL); /* taken */
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "a,b", LORA "/o4f16", 1.0f, 0), IE_ERR_INVAL);
    ie_lora_cache_stats_t s;
    ie_lora_cache_stats(c, &s);
    CU_ASSERT_EQUAL(s.resident, 3);
    CU_ASSERT_EQUAL(s.evictions, 0);
    /* use o4, then all16: o4 becomes the least recently used */
    ie_lora_lease_t l = lease1(c, "o4");
    ie_lora_cache_release(c, &l, 3);
    l = lease1(c, "all16");
    ie_lora_cache_release(c, &l, 3);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "mlp", LORA "/mlp8bf16", 1.0f, 0), IE_OK);
    CU_ASSERT_EQUAL(resident(c, "o4"), 0); /* LRU: evicted */
    CU_ASSERT_EQUAL(resident(c, "all16"), 1);
    CU_ASSERT_EQUAL(resident(c, "qv8"), 1);
    CU_ASSERT_EQUAL(resident(c, "mlp"), 1);
    ie_lora_cache_stats(c, &s);
    CU_ASSERT_EQUAL(s.evictions, 1);
    CU_ASSERT(s.bytes <= o.budget_bytes);
    /* o4 comes back from disk on use; all16 is then the LRU unpinned one
     * (mlp used after it), but it is leased: mlp goes instead, qv8 never */
    ie_lora_lease_t busy = lease1(c, "all16");
    l = lease1(c, "mlp");
    ie_lora_cache_release(c, &l, 1);
    ie_lora_cache_stats(c, &s);
    const uint64_t loads = s.loads;
    l = lease1(c, "o4");
    ie_lora_cache_stats(c, &s);
    CU_ASSERT_EQUAL(s.loads, loads + 1);
    CU_ASSERT_EQUAL(resident(c, "o4"), 1);
    CU_ASSERT_EQUAL(resident(c, "all16"), 1);
    CU_ASSERT_EQUAL(resident(c, "mlp"), 0);
    CU_ASSERT_EQUAL(resident(c, "qv8"), 1);
    ie_lora_cache_release(c, &l, 0);
    /* unload a leased adapter: the name goes now, the attachment later */
    int deferred = 0;
    const int before = n_attached();
    CU_ASSERT_EQUAL(ie_lora_cache_unload(c, "all16", &deferred), IE_OK);
    CU_ASSERT_EQUAL(deferred, 1);
    CU_ASSERT_EQUAL(ie_lora_cache_index(c, "all16"), -1);
    CU_ASSERT_EQUAL(ie_lora_cache_unload(c, "all16", NULL), IE_ERR_RANGE);
    const ie_lora_use_t u = {"all16", NAN};
    ie_lora_lease_t none;
    CU_ASSERT_EQUAL(ie_lora_cache_acquire(c, &u, 1, &none), IE_ERR_RANGE);
    CU_ASSERT(g_fake->attached[busy.id]);
    ie_lora_cache_step_begin(c); /* still leased: stays */
    ie_lora_cache_step_end(c);
    CU_ASSERT(g_fake->attached[busy.id]);
    ie_lora_cache_release(c, &busy, 7);
    CU_ASSERT(g_fake->attached[busy.id]); /* release never touches the backend */
    uint64_t gone[IE_LORA_SET_MAX];
    while (ie_lora_cache_take_detached(c, gone, 1) > 0) {} /* the evictions' sets */
    ie_lora_cache_step_begin(c);
    ie_lora_cache_step_end(c);
    CU_ASSERT(!g_fake->attached[busy.id]);
    CU_ASSERT_EQUAL(ie_lora_cache_take_detached(c, gone, IE_LORA_SET_MAX), 1); /* the deferred detach */
    CU_ASSERT_EQUAL(gone[0], busy.salt);
    CU_ASSERT_EQUAL(n_attached(), before - 1);
    ie_lora_cache_release(c, &busy, 7); /* a stale lease: no-op */
    /* an idle adapter unloads at once */
    CU_ASSERT_EQUAL(ie_lora_cache_unload(c, "o4", &deferred), IE_OK);
    CU_ASSERT_EQUAL(deferred, 0);
    ie_lora_cache_destroy(&c);
    CU_ASSERT_EQUAL(n_attached(), 0); /* destroy detaches everything */
    ie_backend_destroy(&b);
}

static void test_sets_and_salts(void)
{
    ie_backend_t *b = fake_new();
    ie_lora_cache_t *c = NULL;
    ie_lora_cache_opts_t o = {.backend = b, .hp = g_hp};
    CU_ASSERT_EQUAL_FATAL(ie_lora_cache_new(&o, &c), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "a", LORA "/qv8", 1.0f, 0), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "b", LORA "/all16", 1.0f, 0), IE_OK);
    const ie_lora_use_t ab[2] = {{"a", 0.5f}, {"b", 0.75f}}, ba[2] = {{"b", 0.75f}, {"a", 0.5f}},
                        ab2[2] = {{"a", 0.5f}, {"b", 0.7f}}, aa[2] = {{"a", 1}, {"a", 2}};
    ie_lora_lease_t l1, l2, l3, l4;
    CU_ASSERT_EQUAL(ie_lora_cache_acquire(c, ab, 2, &l1), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_acquire(c, ba, 2, &l2), IE_OK);
    CU_ASSERT_EQUAL(l1.id, l2.id);
    CU_ASSERT_EQUAL(l1.salt, l2.salt);
    CU_ASSERT_EQUAL(g_fake->n_parts[l1.id], 2);
    CU_ASSERT_EQUAL(ie_lora_cache_acquire(c, ab2, 2, &l3), IE_OK);
    CU_ASSERT_NOT_EQUAL(l3.id, l1.id);
    CU_ASSERT_NOT_EQUAL(l3.salt, l1.salt);
    CU_ASSERT_EQUAL(ie_lora_cache_acquire(c, aa, 2, &l4), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_lora_cache_acquire(c, ab, 9, &l4), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_lora_cache_salt(c, l1.id), l1.salt);
    CU_ASSERT_EQUAL(ie_lora_cache_salt(c, -1), 0);
    ie_lora_cache_release(c, &l1, 0);
    ie_lora_cache_release(c, &l2, 0);
    ie_lora_cache_release(c, &l3, 0);
    /* a: unloaded, then a different file loaded under its name: the sets
     * of the old one go, and the new one's set has a salt never seen */
    uint64_t seen[8] = {l1.salt, l3.salt};
    int n_seen = 2;
    ie_lora_lease_t la = lease1(c, "a");
    seen[n_seen++] = la.salt;
    ie_lora_cache_release(c, &la, 0);
    uint64_t gone[8];
    CU_ASSERT_EQUAL(ie_lora_cache_take_detached(c, gone, 8), 0); /* nothing detached yet */
    CU_ASSERT_EQUAL(ie_lora_cache_unload(c, "a", NULL), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_salt(c, la.id), 0); /* detached now: it was idle */
    /* the three sets holding a are handed over for their prefix blocks,
     * once each (a take of 2 leaves the third for the next) */
    int n_gone = ie_lora_cache_take_detached(c, gone, 2);
    CU_ASSERT_EQUAL(n_gone, 2);
    n_gone += ie_lora_cache_take_detached(c, gone + n_gone, 8 - n_gone);
    CU_ASSERT_EQUAL(n_gone, 3);
    CU_ASSERT_EQUAL(ie_lora_cache_take_detached(c, gone, 8), 0);
    for (int i = 0; i < 3; i++) {
        int found = 0;
        for (int j = 0; j < n_gone; j++) found += gone[j] == seen[i];
        CU_ASSERT_EQUAL(found, 1);
    }
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "a", LORA "/o4f16", 1.0f, 0), IE_OK);
    ie_lora_lease_t lb = lease1(c, "a");
    CU_ASSERT(lb.id == l1.id || lb.id == l3.id || lb.id == la.id);          /* a freed id again ... */
    for (int i = 0; i < n_seen; i++) CU_ASSERT_NOT_EQUAL(lb.salt, seen[i]); /* ... never the salt */
    CU_ASSERT_NOT_EQUAL(lb.salt, 0);
    ie_lora_cache_release(c, &lb, 0);
    /* the base's lease */
    ie_lora_lease_t base;
    CU_ASSERT_EQUAL(ie_lora_cache_acquire(c, NULL, 0, &base), IE_OK);
    CU_ASSERT_EQUAL(base.id, -1);
    CU_ASSERT_EQUAL(base.salt, 0);
    ie_lora_cache_release(c, &base, 0);
    ie_lora_cache_destroy(&c);
    ie_backend_destroy(&b);
}

/* ------------------------------------------------------ stepping thread */
typedef struct asker {
    ie_lora_cache_t *c;
    const char *name;
    int unload;
    ie_lora_lease_t lease;
    ie_status_t st;
    char err[512];
    atomic_int done;
} asker_t;

static void *asker_main(void *arg)
{
    asker_t *a = arg;
    if (a->unload) {
        a->st = ie_lora_cache_unload(a->c, a->name, NULL);
    } else {
        const ie_lora_use_t u = {a->name, NAN};
        a->st = ie_lora_cache_acquire(a->c, &u, 1, &a->lease);
    }
    snprintf(a->err, sizeof a->err, "%s", a->st == IE_OK ? "" : ie_error_last());
    atomic_store(&a->done, 1);
    return NULL;
}

static atomic_int g_wakes;
static void count_wake(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&g_wakes, 1);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Wait up to 5 s for a->done; 1 when it came. */
static int wait_done(asker_t *a)
{
    for (int i = 0; i < 500 && !atomic_load(&a->done); i++) sleep_ms(10);
    return atomic_load(&a->done);
}

/* With a stepping thread registered, another thread's attach / detach
 * waits for that thread's step_begin and runs there (the backend is
 * called from the stepping thread only); a failure's status and message
 * reach the asking thread; unregistering runs what is queued, and later
 * calls attach at once again. */
static void test_stepper_queue(void)
{
    ie_backend_t *b = fake_new();
    ie_lora_cache_t *c = NULL;
    ie_lora_cache_opts_t o = {.backend = b, .hp = g_hp};
    CU_ASSERT_EQUAL_FATAL(ie_lora_cache_new(&o, &c), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "a", LORA "/qv8", 1.0f, 0), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "b", LORA "/o4f16", 1.0f, 0), IE_OK);
    atomic_store(&g_wakes, 0);
    ie_lora_cache_stepper(c, 1, count_wake, NULL);

    asker_t a = {.c = c, .name = "a"};
    pthread_t t;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, asker_main, &a), 0);
    sleep_ms(100);
    CU_ASSERT(!atomic_load(&a.done)); /* queued: no step yet */
    CU_ASSERT_EQUAL(g_fake->adds, 0);
    CU_ASSERT(atomic_load(&g_wakes) >= 1);
    ie_lora_cache_step_begin(c); /* runs it, on this thread */
    ie_lora_cache_step_end(c);
    CU_ASSERT(wait_done(&a));
    pthread_join(t, NULL);
    CU_ASSERT_EQUAL(a.st, IE_OK);
    CU_ASSERT_EQUAL(g_fake->adds, 1);
    CU_ASSERT(pthread_equal(g_fake->last_caller, pthread_self()));
    CU_ASSERT(a.lease.id >= 0 && g_fake->attached[a.lease.id]);
    ie_lora_cache_release(c, &a.lease, 0);

    /* a refusal travels back with its message */
    asker_t u = {.c = c, .name = "nope", .unload = 1};
    CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, asker_main, &u), 0);
    sleep_ms(50);
    CU_ASSERT(!atomic_load(&u.done));
    ie_lora_cache_step_begin(c);
    ie_lora_cache_step_end(c);
    CU_ASSERT(wait_done(&u));
    pthread_join(t, NULL);
    CU_ASSERT_EQUAL(u.st, IE_ERR_RANGE);
    CU_ASSERT_STRING_EQUAL(u.err, "The lora adapter 'nope' cannot be found.");

    /* the stepping thread's own calls run at once (the ZeroMQ front end) */
    ie_lora_lease_t l = lease1(c, "b");
    CU_ASSERT_EQUAL(g_fake->adds, 2);
    ie_lora_cache_release(c, &l, 0);

    /* an unload queued, then the loop ends: it runs at unregistering */
    asker_t d = {.c = c, .name = "a", .unload = 1};
    CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, asker_main, &d), 0);
    sleep_ms(50);
    CU_ASSERT(!atomic_load(&d.done));
    ie_lora_cache_stepper(c, 0, NULL, NULL);
    CU_ASSERT(wait_done(&d));
    pthread_join(t, NULL);
    CU_ASSERT_EQUAL(d.st, IE_OK);
    CU_ASSERT(!g_fake->attached[a.lease.id]);
    CU_ASSERT(pthread_equal(g_fake->last_caller, pthread_self()));
    /* no stepping thread: another thread's call attaches at once */
    asker_t e = {.c = c, .name = "b", .unload = 1};
    CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, asker_main, &e), 0);
    CU_ASSERT(wait_done(&e));
    pthread_join(t, NULL);
    CU_ASSERT_EQUAL(e.st, IE_OK);
    CU_ASSERT(!pthread_equal(g_fake->last_caller, pthread_self()));
    ie_lora_cache_destroy(&c);
    ie_backend_destroy(&b);
}

static void step(ie_lora_cache_t *c)
{
    ie_lora_cache_step_begin(c);
    ie_lora_cache_step_end(c);
}

/* A backend whose ranks answer an attach later (a cluster): the stepping
 * thread keeps stepping while the requester waits; other jobs wait behind
 * the attach (one at a time) and so do deferred detaches; the answer
 * finishes it at the next step (a lease), a refusal reaches the requester
 * with its message and leaves nothing attached. */
static void test_stepper_async_attach(void)
{
    ie_backend_t *b = fake_new_ops(&k_fake_async);
    ie_lora_cache_t *c = NULL;
    ie_lora_cache_opts_t o = {.backend = b, .hp = g_hp};
    CU_ASSERT_EQUAL_FATAL(ie_lora_cache_new(&o, &c), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "a", LORA "/qv8", 1.0f, 0), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "b", LORA "/o4f16", 1.0f, 0), IE_OK);
    ie_lora_cache_stepper(c, 1, NULL, NULL);

    asker_t a = {.c = c, .name = "a"}, u = {.c = c, .name = "b", .unload = 1};
    pthread_t ta, tu;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&ta, NULL, asker_main, &a), 0);
    sleep_ms(50);
    step(c); /* begins it */
    CU_ASSERT_EQUAL(g_fake->begun, 0);
    CU_ASSERT_EQUAL_FATAL(pthread_create(&tu, NULL, asker_main, &u), 0);
    for (int i = 0; i < 5; i++) { /* steps go on; both wait */
        sleep_ms(20);
        step(c);
    }
    CU_ASSERT(g_fake->polls >= 5);
    CU_ASSERT(!atomic_load(&a.done));
    CU_ASSERT(!atomic_load(&u.done));
    CU_ASSERT_EQUAL(ie_lora_cache_index(c, "b"), 1); /* the unload waits behind the attach */
    CU_ASSERT_EQUAL(ie_lora_cache_salt(c, 0), 0);    /* not live before the answer */
    g_fake->answer = 1;
    step(c); /* finishes it, then runs the unload */
    CU_ASSERT(wait_done(&a));
    CU_ASSERT(wait_done(&u));
    pthread_join(ta, NULL);
    pthread_join(tu, NULL);
    CU_ASSERT_EQUAL(a.st, IE_OK);
    CU_ASSERT_EQUAL(a.lease.id, 0);
    CU_ASSERT_NOT_EQUAL(a.lease.salt, 0);
    CU_ASSERT_EQUAL(ie_lora_cache_salt(c, 0), a.lease.salt);
    CU_ASSERT_EQUAL(u.st, IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_index(c, "b"), -1);
    ie_lora_cache_release(c, &a.lease, 0);

    /* a refusal */
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "b", LORA "/o4f16", 1.0f, 0), IE_OK);
    asker_t r = {.c = c, .name = "b"};
    CU_ASSERT_EQUAL_FATAL(pthread_create(&ta, NULL, asker_main, &r), 0);
    sleep_ms(50);
    step(c);
    step(c);
    CU_ASSERT(!atomic_load(&r.done));
    g_fake->answer = 2;
    step(c);
    CU_ASSERT(wait_done(&r));
    pthread_join(ta, NULL);
    CU_ASSERT_EQUAL(r.st, IE_ERR_FORMAT);
    CU_ASSERT_STRING_EQUAL(r.err, "worker rank 1: adapter differs");
    ie_lora_cache_stats_t cs;
    ie_lora_cache_stats(c, &cs);
    CU_ASSERT_EQUAL(cs.sets, 1); /* a's alone */
    CU_ASSERT_EQUAL(n_attached(), 1);

    /* the stepping thread's own attach (ZeroMQ) waits for its answer */
    g_fake->answer = 1; /* answered at the first poll */
    ie_lora_lease_t l = lease1(c, "b");
    CU_ASSERT(l.id >= 0 && g_fake->attached[l.id]);
    ie_lora_cache_release(c, &l, 0);
    ie_lora_cache_stepper(c, 0, NULL, NULL);
    ie_lora_cache_destroy(&c);
    CU_ASSERT_EQUAL(n_attached(), 0);
    ie_backend_destroy(&b);
}

/* ------------------------------------------- the backend's copies, charged */
/* The bytes an int8 copy (ie_lora_quantize_int8) of the sum of n parts
 * takes, from the ranks and shapes alone: per projection rank r (the
 * parts' ranks added) codes of A (r x n_in) and of B^T in groups of four
 * ranks (r rounded up to 4, x n_out), and an f32 scale per column of
 * each. f32: the bytes of their f32 sum (ie_lora_concat) instead. */
static uint64_t copy_bytes(ie_lora_t *const *parts, int n, int f32)
{
    uint64_t b = 0;
    for (int l = 0; l < parts[0]->n_layer; l++)
        for (int m = 0; m < IE_LORA_NMOD; m++) {
            int64_t r = 0, n_in = 0, n_out = 0;
            for (int k = 0; k < n; k++) {
                const ie_lora_mat_t *x = ie_lora_mat(parts[k], l, (ie_lora_mod_t)m);
                if (x && x->rank) r += x->rank, n_in = x->n_in, n_out = x->n_out;
            }
            if (r)
                b += f32 ? (uint64_t)(r * (n_in + n_out) * 4)
                         : (uint64_t)(r * n_in + ((r + 3) & ~3) * n_out + 4 * (n_in + n_out));
        }
    return b;
}

static uint64_t cache_bytes(ie_lora_cache_t *c)
{
    ie_lora_cache_stats_t s;
    ie_lora_cache_stats(c, &s);
    return s.bytes;
}

/* One run on a real in-process backend over the model at `model`: the
 * bytes charged for sets of qv8, all16 and {qv8, all16} (q: 1 when the base
 * is quantized, so the worker holds int8 copies), then a budget that holds
 * three adapters' weights and two int8 copies: a fourth copy evicts. */
static void budget_on(const char *model, int q)
{
    ie_model_src_t *src = NULL;
    ie_backend_t *b = NULL;
    ie_lora_cache_t *c = NULL;
    ie_lora_t *qv = NULL, *all = NULL, *mlp = NULL;
    ie_worker_opts_t wo;
    ie_worker_opts_default(&wo);
    wo.n_seq = 1, wo.n_ctx = 32, wo.max_batch = 8, wo.n_threads = 1, wo.pin_threads = 0;
    CU_ASSERT_EQUAL_FATAL(ie_model_src_open(model, &src), IE_OK);
    const ie_hparams_t *hp = ie_model_src_hparams(src);
    CU_ASSERT_EQUAL_FATAL(ie_backend_worker_new(src, &wo, &b), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_lora_load(LORA "/qv8", hp, &qv), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_lora_load(LORA "/all16", hp, &all), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_lora_load(LORA "/mlp8bf16", hp, &mlp), IE_OK);
    ie_lora_t *both[2] = {qv, all};
    /* by hand from the shapes (d 64, kv 32, ff 128, 2 layers): qv8 r 8 on
     * q (64 x 64) and v (32 x 64), all16 r 16 on all seven */
    CU_ASSERT_EQUAL(copy_bytes(&qv, 1, 0), 2 * (8 * 224 + 4 * 224));
    CU_ASSERT_EQUAL(copy_bytes(&all, 1, 0), 2 * (16 * 1024 + 4 * 1024));
    const uint64_t w_qv = qv->bytes, w_all = all->bytes, w_mlp = mlp->bytes;
    const uint64_t i_qv = q ? copy_bytes(&qv, 1, 0) : 0, i_all = q ? copy_bytes(&all, 1, 0) : 0,
                   i_mlp = q ? copy_bytes(&mlp, 1, 0) : 0;
    const uint64_t cat = copy_bytes(both, 2, 1), i_cat = q ? copy_bytes(both, 2, 0) : 0;

    /* charged per set, released when the set goes */
    ie_lora_cache_opts_t o = {.backend = b, .hp = hp};
    CU_ASSERT_EQUAL_FATAL(ie_lora_cache_new(&o, &c), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "qv8", LORA "/qv8", 1.0f, 0), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "all16", LORA "/all16", 1.0f, 0), IE_OK);
    CU_ASSERT_EQUAL(cache_bytes(c), w_qv + w_all); /* nothing attached yet */
    ie_lora_lease_t l = lease1(c, "qv8");
    CU_ASSERT_EQUAL(ie_backend_lora_bytes(b, l.id), i_qv);
    ie_lora_cache_release(c, &l, 0);
    CU_ASSERT_EQUAL(cache_bytes(c), w_qv + w_all + i_qv);
    l = lease1(c, "all16");
    ie_lora_cache_release(c, &l, 0);
    CU_ASSERT_EQUAL(cache_bytes(c), w_qv + w_all + i_qv + i_all);
    const ie_lora_use_t set[2] = {{"qv8", 1.0f}, {"all16", 0.5f}};
    CU_ASSERT_EQUAL(ie_lora_cache_acquire(c, set, 2, &l), IE_OK);
    CU_ASSERT_EQUAL(ie_backend_lora_bytes(b, l.id), cat + i_cat);
    ie_lora_cache_release(c, &l, 0);
    CU_ASSERT_EQUAL(cache_bytes(c), w_qv + w_all + i_qv + i_all + cat + i_cat);
    CU_ASSERT_EQUAL(ie_lora_cache_unload(c, "qv8", NULL), IE_OK); /* its set and the pair go */
    CU_ASSERT_EQUAL(cache_bytes(c), w_all + i_all);
    CU_ASSERT_EQUAL(ie_backend_lora_bytes(b, l.id), 0);
    ie_lora_cache_destroy(&c);

    /* a budget of the three adapters' weights plus qv8's and all16's
     * copies: using mlp8bf16 too goes over only when its copy counts, and
     * evicts the least recently used (qv8, with its copy) */
    o.budget_bytes = w_qv + w_all + w_mlp + copy_bytes(&qv, 1, 0) + copy_bytes(&all, 1, 0);
    CU_ASSERT_EQUAL_FATAL(ie_lora_cache_new(&o, &c), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "qv8", LORA "/qv8", 1.0f, 0), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "all16", LORA "/all16", 1.0f, 0), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "mlp", LORA "/mlp8bf16", 1.0f, 0), IE_OK);
    const char *order[3] = {"qv8", "all16", "mlp"};
    for (int k = 0; k < 3; k++) {
        l = lease1(c, order[k]);
        ie_lora_cache_release(c, &l, 0);
    }
    ie_lora_cache_stats_t s;
    ie_lora_cache_stats(c, &s);
    CU_ASSERT_EQUAL(s.evictions, (uint64_t)q);
    CU_ASSERT_EQUAL(resident(c, "qv8"), !q);
    CU_ASSERT_EQUAL(s.bytes, q ? w_all + w_mlp + i_all + i_mlp : w_qv + w_all + w_mlp);
    CU_ASSERT(s.bytes <= o.budget_bytes);
    ie_lora_cache_destroy(&c);

    /* the load refuses an adapter whose weights fit the budget but not
     * with the copy the worker would make of it (foretold: lora_cost) */
    CU_ASSERT_EQUAL(ie_backend_lora_cost(b, qv), i_qv);
    CU_ASSERT_EQUAL(ie_backend_lora_cost(b, all), i_all);
    o.budget_bytes = w_all + copy_bytes(&all, 1, 0) - 1;
    CU_ASSERT_EQUAL_FATAL(ie_lora_cache_new(&o, &c), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "all16", LORA "/all16", 1.0f, 0), q ? IE_ERR_RANGE : IE_OK);
    ie_lora_cache_destroy(&c);
    o.budget_bytes++; /* exactly its weights and copy: taken, and used within it */
    CU_ASSERT_EQUAL_FATAL(ie_lora_cache_new(&o, &c), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "all16", LORA "/all16", 1.0f, 0), IE_OK);
    l = lease1(c, "all16");
    ie_lora_cache_release(c, &l, 0);
    CU_ASSERT_EQUAL(cache_bytes(c), w_all + i_all);
    ie_lora_cache_destroy(&c);

    ie_lora_destroy(&qv);
    ie_lora_destroy(&all);
    ie_lora_destroy(&mlp);
    ie_backend_destroy(&b);
    ie_model_src_destroy(&src);
}

/* On a quantized base the worker's int8 copies count; on an f32 base
 * there are none; a backend without lora_bytes (as a cluster, whose ranks
 * hold their copies) charges the parts' weights alone, even for a sum. */
static void test_budget_counts_backend_copies(void)
{
    unsetenv("IE_LORA_DTYPE"); /* the base decides */
    budget_on(IE_TEST_DATA "/tiny_llama_q4_0.gguf", 1);
    budget_on(IE_TEST_DATA "/tiny_llama", 0);

    ie_backend_t *b = fake_new();
    ie_lora_cache_t *c = NULL;
    ie_lora_cache_opts_t o = {.backend = b, .hp = g_hp};
    CU_ASSERT_EQUAL_FATAL(ie_lora_cache_new(&o, &c), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "qv8", LORA "/qv8", 1.0f, 0), IE_OK);
    CU_ASSERT_EQUAL(ie_lora_cache_load(c, "all16", LORA "/all16", 1.0f, 0), IE_OK);
    const ie_lora_use_t set[2] = {{"qv8", 1.0f}, {"all16", 0.5f}};
    ie_lora_lease_t l;
    CU_ASSERT_EQUAL(ie_lora_cache_acquire(c, set, 2, &l), IE_OK);
    ie_lora_cache_release(c, &l, 0);
    CU_ASSERT_EQUAL(cache_bytes(c), 14336 + 131072);
    ie_lora_cache_destroy(&c);
    ie_backend_destroy(&b);
}

static int suite_init(void)
{
    if (ie_model_src_open(IE_TEST_DATA "/tiny_llama", &g_src) != IE_OK) return -1;
    g_hp = ie_model_src_hparams(g_src);
    return 0;
}

static int suite_clean(void)
{
    ie_model_src_destroy(&g_src);
    return 0;
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("lora_cache", suite_init, suite_clean);
    CU_add_test(s, "ie_lora_concat == sum of the parts", test_concat_is_sum);
    CU_add_test(s, "registry: LRU, pin, leased never evicted, deferred unload", test_lru_pin_busy);
    CU_add_test(s, "registry: set reuse, salts unique across reloads", test_sets_and_salts);
    CU_add_test(s, "registry: attaches queue for the stepping thread", test_stepper_queue);
    CU_add_test(s, "registry: a slow attach lets the steps go on", test_stepper_async_attach);
    CU_add_test(s, "registry: the budget charges the backend's int8 and summed copies",
                test_budget_counts_backend_copies);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

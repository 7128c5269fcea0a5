/* test_kvring.c — GPT-OSS sliding-window layers keep a ring of their
 * window (worker/src/attention.c, ie_worker.h "paged KV"), on the tiny
 * GPT-OSS fixture (window 8, even layers sliding, sinks):
 *  - decoded far past the window (200 positions), the ring gives the bits
 *    of the sliding layers kept whole in the pool (kv_swa_full), for a
 *    prefill in steps larger than the ring takes at a time and token by
 *    token, f32 and q8 caches, block sizes 3 and 16;
 *  - token by token stays within 1e-4 of the largest logit of the prefill;
 *  - two slots in one batch give each slot's own run;
 *  - memory: the ring is the window and W - 1 more positions, whole blocks,
 *    per slot, the pool holds only the full layers, and a byte budget pays
 *    for the rings before the pool's blocks;
 *  - the engine's /metrics gauges and figures say the same. */
#include "ie_buf.h"
#include "ie_engine.h"
#include "ie_metrics.h"
#include "ie_model_src.h"
#include "ie_worker.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GPTOSS IE_TEST_DATA "/tiny_gptoss.gguf"
#define N_CTX 256
#define NTOK 200

static ie_model_src_t *g_src;

static int suite_init(void) { return ie_model_src_open(GPTOSS, &g_src) == IE_OK ? 0 : -1; }
static int suite_clean(void)
{
    ie_model_src_destroy(&g_src);
    return 0;
}

static ie_worker_t *make(ie_kv_type_t t, int kv_block, int swa_full, int n_seq, uint64_t mem)
{
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_ctx = N_CTX;
    o.n_seq = n_seq;
    o.max_batch = 64;
    o.precision = IE_PREC_F32;
    o.n_threads = 2;
    o.pin_threads = 0;
    o.kv_type_k = o.kv_type_v = t;
    o.kv_block = kv_block;
    o.kv_swa_full = swa_full;
    o.kv_mem_bytes = mem;
    ie_worker_t *w = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_worker_new(g_src, &o, &w), IE_OK);
    return w;
}

/* logits of NTOK positions of a fixed text in each of n_slot slots (slot
 * s's text shifted by s), `chunk` tokens of every slot a step (the slots
 * side by side in one batch) */
static float *run(ie_worker_t *w, int chunk, int n_slot)
{
    const int nv = ie_worker_hparams(w)->n_vocab;
    float *out = malloc((size_t)n_slot * NTOK * nv * sizeof(float));
    float *lg = malloc((size_t)n_slot * chunk * nv * sizeof(float));
    int32_t ids[2 * NTOK], pos[2 * NTOK], sq[2 * NTOK];
    uint8_t want[2 * NTOK];
    CU_ASSERT_FATAL(out && lg && n_slot <= 2);
    for (int s = 0; s < n_slot; s++) ie_worker_seq_clear(w, s);
    for (int i = 0; i < NTOK; i += chunk) {
        const int m = NTOK - i < chunk ? NTOK - i : chunk;
        int n = 0;
        for (int s = 0; s < n_slot; s++)
            for (int k = 0; k < m; k++, n++)
                ids[n] = ((i + k + 5 * s) * 37 + 11) % nv, pos[n] = i + k, sq[n] = s, want[n] = 1;
        ie_batch_t b = {n, ids, pos, sq, want, NULL, NULL};
        CU_ASSERT_EQUAL_FATAL(ie_worker_step(w, &b, lg), IE_OK);
        for (int s = 0; s < n_slot; s++)
            memcpy(out + ((size_t)s * NTOK + i) * nv, lg + (size_t)s * m * nv, (size_t)m * nv * sizeof(float));
    }
    free(lg);
    return out;
}

static double max_abs(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
    return m;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* The ring against the whole context in the pool: the same bits for every
 * step size (a prefill of 40 tokens a step is cut into the ring's chunks),
 * and token by token within matmul rounding of the prefill. */
static void test_ring_equals_pool(void)
{
    static const ie_kv_type_t types[] = {IE_KV_F32, IE_KV_Q8};
    static const int blocks[] = {3, 16};
    const size_t nv = (size_t)ie_model_src_hparams(g_src)->n_vocab, n = NTOK * nv;
    CU_ASSERT_FATAL(ie_model_src_hparams(g_src)->sliding_window * 4 < NTOK);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t kb = 0; kb < sizeof blocks / sizeof blocks[0]; kb++) {
            ie_worker_t *full = make(types[t], blocks[kb], 1, 1, 0);
            ie_worker_t *ring = make(types[t], blocks[kb], 0, 1, 0);
            CU_ASSERT_EQUAL(ie_worker_kv_ring_len(full), 0);
            CU_ASSERT(ie_worker_kv_ring_len(ring) > 0 && ie_worker_kv_ring_len(ring) < 40);
            static const int chunks[] = {40, 16, 1};
            float *pre = NULL;
            for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
                float *want = run(full, chunks[c], 1);
                float *got = run(ring, chunks[c], 1);
                const int same = memcmp(got, want, n * sizeof(float)) == 0;
                CU_ASSERT(same);
                if (!same)
                    fprintf(stderr, "  %s block %d chunk %d: ring != pool, max diff %.3g\n",
                            ie_kv_type_name(types[t]), blocks[kb], chunks[c], max_diff(got, want, n));
                if (!pre) pre = got;
                else {
                    const double d = max_diff(got, pre, n), lmax = max_abs(pre, n);
                    CU_ASSERT(d < 1e-4 * lmax);
                    if (!(d < 1e-4 * lmax))
                        fprintf(stderr, "  %s chunk %d vs prefill: %.3g of %.3g\n", ie_kv_type_name(types[t]),
                                chunks[c], d, lmax);
                    free(got);
                }
                free(want);
            }
            free(pre);
            ie_worker_destroy(&full);
            ie_worker_destroy(&ring);
        }
}

/* Two slots side by side in every step give each slot's own run. */
static void test_ring_two_slots(void)
{
    const size_t nv = (size_t)ie_model_src_hparams(g_src)->n_vocab, n = NTOK * nv;
    ie_worker_t *one = make(IE_KV_Q8, 5, 0, 2, 0);
    float *a = run(one, 24, 1);
    ie_worker_destroy(&one);
    ie_worker_t *two = make(IE_KV_Q8, 5, 0, 2, 0);
    float *ab = run(two, 24, 2);
    CU_ASSERT(memcmp(ab, a, n * sizeof(float)) == 0);
    /* slot 1's text is slot 0's shifted: a different stream, not a copy */
    CU_ASSERT(memcmp(ab + n, a, n * sizeof(float)) != 0);
    free(a);
    free(ab);
    ie_worker_destroy(&two);
}

/* Memory: ring, pool and budget. */
static void test_ring_memory(void)
{
    const ie_hparams_t *hp = ie_model_src_hparams(g_src);
    int n_swa = 0;
    for (int l = 0; l < hp->n_layer; l++) n_swa += hp->layer_swa[l] != 0;
    CU_ASSERT_FATAL(n_swa > 0 && n_swa < hp->n_layer);
    const size_t head = (size_t)hp->head_dim * 4 * 2 * hp->n_head_kv; /* f32, K and V */
    const int W = hp->sliding_window;
    for (int kb = 1; kb <= 16; kb += 5) {
        ie_worker_t *w = make(IE_KV_F32, kb, 0, 3, 0);
        const int len = (2 * W - 1 + kb - 1) / kb * kb;
        CU_ASSERT_EQUAL(ie_worker_kv_ring_len(w), len);
        CU_ASSERT_EQUAL(ie_worker_kv_bytes_per_pos(w), (size_t)(hp->n_layer - n_swa) * head);
        CU_ASSERT_EQUAL(ie_worker_kv_ring_bytes(w), (uint64_t)3 * len * n_swa * head);
        /* what a coordinator computes for a plan's rank: the worker's */
        ie_worker_opts_t o;
        ie_worker_opts_default(&o);
        o.n_ctx = N_CTX;
        o.n_seq = 3;
        o.kv_block = kb;
        ie_kv_layout_t ly;
        CU_ASSERT_EQUAL_FATAL(ie_worker_kv_layout(hp, NULL, &o, &ly), IE_OK);
        CU_ASSERT_EQUAL(ly.ring_len, len);
        CU_ASSERT_EQUAL(ly.ring_bytes, ie_worker_kv_ring_bytes(w));
        CU_ASSERT_EQUAL(ly.block_bytes, ie_worker_kv_bytes_per_pos(w) * kb);
        ie_worker_destroy(&w);
        w = make(IE_KV_F32, kb, 1, 3, 0);
        CU_ASSERT_EQUAL(ie_worker_kv_ring_len(w), 0);
        CU_ASSERT_EQUAL(ie_worker_kv_ring_bytes(w), 0);
        CU_ASSERT_EQUAL(ie_worker_kv_bytes_per_pos(w), (size_t)hp->n_layer * head);
        ie_worker_destroy(&w);
    }
    /* a budget: the rings first, then whole blocks of the full layers */
    const uint64_t budget = 60000;
    ie_worker_t *w = make(IE_KV_Q8, 4, 0, 3, budget);
    const uint64_t ring = ie_worker_kv_ring_bytes(w), per = ie_worker_kv_bytes_per_pos(w) * 4;
    CU_ASSERT(ring > 0 && ring < budget);
    CU_ASSERT(per > 0 && (budget - ring) / per < (uint64_t)3 * N_CTX / 4); /* not capped */
    CU_ASSERT_EQUAL(ie_worker_kv_blocks(w), (int)((budget - ring) / per));
    ie_worker_destroy(&w);
    /* a budget the rings alone take: refused, named */
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_ctx = N_CTX;
    o.n_seq = 3;
    o.pin_threads = 0;
    o.kv_block = 4;
    o.kv_mem_bytes = ring;
    w = NULL;
    CU_ASSERT_EQUAL(ie_worker_new(g_src, &o, &w), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "after the sliding layers' rings"));
    /* the whole context in a ring is no ring */
    o.kv_mem_bytes = 0;
    o.n_ctx = 2 * W - 1;
    CU_ASSERT_EQUAL_FATAL(ie_worker_new(g_src, &o, &w), IE_OK);
    CU_ASSERT_EQUAL(ie_worker_kv_ring_len(w), 0);
    ie_worker_destroy(&w);
}

/* The engine reports the pool's bytes a token (the full layer only) and
 * the rings' bytes, in its accessors and its /metrics gauges. */
static void test_engine_metrics(void)
{
    ie_metrics_t *m = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_metrics_new(&m), IE_OK);
    ie_engine_opts_t o;
    ie_engine_opts_default(&o);
    o.model_path = GPTOSS;
    o.no_tokenizer = 1;
    o.pin_threads = 0;
    o.n_seq = 2;
    o.n_ctx = N_CTX;
    o.metrics = m;
    ie_engine_t *e = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_engine_open(&o, &e), IE_OK);
    const size_t layer = 2 * 16 * 4 * 2; /* 2 KV heads of 16, f32 K and V */
    CU_ASSERT_EQUAL(ie_engine_kv_bytes_per_token(e), layer);
    CU_ASSERT_EQUAL(ie_engine_kv_ring_positions(e), 16);
    CU_ASSERT_EQUAL(ie_engine_kv_ring_bytes(e), (uint64_t)2 * 16 * 2 * layer);
    ie_buf_t b = {0};
    CU_ASSERT_EQUAL_FATAL(ie_metrics_render(m, &b), IE_OK);
    char want[128];
    snprintf(want, sizeof want, "\nie_kv_cache_bytes_per_token %zu\n", layer);
    CU_ASSERT_PTR_NOT_NULL(strstr(b.data, want));
    snprintf(want, sizeof want, "\nie_kv_cache_ring_bytes %zu\n", (size_t)2 * 16 * 2 * layer);
    CU_ASSERT_PTR_NOT_NULL(strstr(b.data, want));
    if (!strstr(b.data, want)) fprintf(stderr, "\n%s", b.data);
    ie_buf_free(&b);
    ie_engine_destroy(&e);
    ie_metrics_destroy(&m);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("kvring", suite_init, suite_clean);
    CU_add_test(s, "ring == whole context in the pool, far past the window", test_ring_equals_pool);
    CU_add_test(s, "two slots in one batch", test_ring_two_slots);
    CU_add_test(s, "ring, pool and budget sizes", test_ring_memory);
    CU_add_test(s, "engine figures and /metrics", test_engine_metrics);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

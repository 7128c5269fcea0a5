/* test_kvattn.c — the attention loops over a typed KV cache (ie_kvcache.h,
 * ie_kernels_t.kv_scores / kv_values) on every ISA against the scalar
 * oracle: every type, head sizes with and without a SIMD-wide tail (16, 40,
 * 64, 72, 80, 96, 128, 256), head counts 1..9, lengths around the
 * 16-position tiles, a window starting inside a block (j0 > 0). q8 K scores
 * are the oracle's bits (exact int32 dots of the int16 query and the int8
 * row, then the same two products); on integer-valued heads they are the
 * exact dot itself. Other types agree within float rounding. Paged views
 * (blocks of 1, 5, 16, 17 rows, scrambled) give the bits of the contiguous
 * view on each ISA, and nothing is written outside the outputs.
 */
#include <CUnit/Basic.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/src/ie_kernels_isa.h" /* ie_kv_*_ref: the oracle */
#include "ie_kernels.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

#define GUARD 8
#define GUARD_VAL 12345.0f

/* n rows of hd random values (one outlier channel, as RoPE'd K has),
 * encoded in type t: contiguous at `flat` (rb bytes apart) and, when
 * block > 0, in a pool of blocks of `block` rows placed in scrambled order
 * (tab). */
typedef struct cache {
    unsigned char *flat, *pool;
    int32_t tab[512];
    size_t rb;
    int nb;
} cache_t;

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

static void cache_make(cache_t *c, ie_kv_type_t t, int hd, int n, int block)
{
    c->rb = ie_kv_head_bytes(t, hd) + 3; /* rows not aligned to anything */
    c->flat = malloc(c->rb * (size_t)n);
    float x[IE_KV_MAX_HD];
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < hd; i++) x[i] = frand() * (i == 5 ? 8.0f : 1.0f);
        ie_kv_encode(t, x, hd, c->flat + (size_t)j * c->rb);
    }
    c->pool = NULL;
    if (block <= 0) return;
    c->nb = (n + block - 1) / block;
    c->pool = calloc((size_t)c->nb * block, c->rb);
    int k = 7; /* a step coprime to nb: a permutation of the blocks */
    while (gcd(k, c->nb) != 1) k += 2;
    for (int b = 0; b < c->nb; b++) c->tab[b] = (int32_t)(((int64_t)b * k + 3) % c->nb);
    for (int j = 0; j < n; j++)
        memcpy(c->pool + ((size_t)c->tab[j / block] * block + j % block) * c->rb, c->flat + (size_t)j * c->rb,
               c->rb);
}

static void cache_free(cache_t *c)
{
    free(c->flat);
    free(c->pool);
}

static int g_bad_scores, g_bad_values, g_bad_paged, g_bad_guard;

static void check(const ie_kernels_t *ops, ie_kv_type_t t, int hd, int nh, int n, int j0, int block)
{
    const int total = j0 + n;
    cache_t kc, vc;
    cache_make(&kc, t, hd, total, block);
    cache_make(&vc, t, hd, total, block);
    const size_t qs = (size_t)hd + 3, ld = (size_t)n + 5, os = (size_t)hd + 7;
    float *q = malloc(sizeof(float) * qs * nh), *p = malloc(sizeof(float) * ld * nh);
    float *s = malloc(sizeof(float) * (ld * nh + GUARD)), *sr = malloc(sizeof(float) * ld * nh);
    float *sp = malloc(sizeof(float) * ld * nh);
    float *o = malloc(sizeof(float) * (os * nh + GUARD)), *orf = malloc(sizeof(float) * os * nh);
    float *op = malloc(sizeof(float) * os * nh);
    for (size_t i = 0; i < qs * nh; i++) q[i] = frand() * 2.0f;
    for (size_t i = 0; i < ld * nh; i++) p[i] = 0.5f * (frand() + 1.0f) / (float)n;
    for (size_t i = 0; i < ld * nh + GUARD; i++) s[i] = GUARD_VAL;
    for (size_t i = 0; i < os * nh + GUARD; i++) o[i] = GUARD_VAL;
    const ie_kv_rows_t kr = {kc.flat, kc.rb, NULL, 0, 0}, vr = {vc.flat, vc.rb, NULL, 0, 0};
    ops->kv_scores(t, q, qs, nh, &kr, j0, n, hd, 0.125f, s, ld);
    ie_kv_scores_ref(t, q, qs, nh, &kr, j0, n, hd, 0.125f, sr, ld);
    ops->kv_values(t, p, ld, nh, &vr, j0, n, hd, o, os);
    ie_kv_values_ref(t, p, ld, nh, &vr, j0, n, hd, orf, os);
    float kf[IE_KV_MAX_HD];
    for (int h = 0; h < nh; h++) {
        for (int j = 0; j < n; j++) {
            const float got = s[(size_t)h * ld + j], want = sr[(size_t)h * ld + j];
            if (t == IE_KV_Q8) {
                if (memcmp(&got, &want, sizeof got)) g_bad_scores++;
                continue;
            }
            ie_kv_decode_ref(t, kc.flat + (size_t)(j0 + j) * kc.rb, hd, kf);
            double mag = 0;
            for (int i = 0; i < hd; i++) mag += fabs((double)q[(size_t)h * qs + i] * kf[i]);
            if (fabs((double)got - want) > 2e-6 * mag * 0.125 + 1e-30) g_bad_scores++;
        }
        for (int i = 0; i < hd; i++) {
            double mag = 0;
            for (int j = 0; j < n; j++) {
                ie_kv_decode_ref(t, vc.flat + (size_t)(j0 + j) * vc.rb, hd, kf);
                mag += fabs((double)p[(size_t)h * ld + j] * kf[i]);
            }
            if (fabs((double)o[(size_t)h * os + i] - orf[(size_t)h * os + i]) > 2e-6 * mag + 1e-30) g_bad_values++;
        }
        /* nothing written between rows of the outputs */
        for (size_t j = (size_t)n; j < ld && h + 1 < nh; j++)
            if (s[(size_t)h * ld + j] != GUARD_VAL) g_bad_guard++;
        for (size_t i = (size_t)hd; i < os && h + 1 < nh; i++)
            if (o[(size_t)h * os + i] != GUARD_VAL) g_bad_guard++;
    }
    for (size_t i = ld * (nh - 1) + n; i < ld * nh + GUARD; i++)
        if (s[i] != GUARD_VAL) g_bad_guard++;
    for (size_t i = os * (nh - 1) + hd; i < os * nh + GUARD; i++)
        if (o[i] != GUARD_VAL) g_bad_guard++;
    if (block > 0) { /* the paged view: the contiguous view's bits */
        const ie_kv_rows_t kp = {kc.pool, kc.rb, kc.tab, block, kc.rb * block};
        const ie_kv_rows_t vp = {vc.pool, vc.rb, vc.tab, block, vc.rb * block};
        ops->kv_scores(t, q, qs, nh, &kp, j0, n, hd, 0.125f, sp, ld);
        ops->kv_values(t, p, ld, nh, &vp, j0, n, hd, op, os);
        for (int h = 0; h < nh; h++)
            if (memcmp(sp + (size_t)h * ld, s + (size_t)h * ld, (size_t)n * sizeof(float)) ||
                memcmp(op + (size_t)h * os, o + (size_t)h * os, (size_t)hd * sizeof(float)))
                g_bad_paged++;
    }
    free(q), free(p), free(s), free(sr), free(sp), free(o), free(orf), free(op);
    cache_free(&kc);
    cache_free(&vc);
}

static void test_against_ref(void)
{
    static const int hds[] = {16, 40, 64, 72, 80, 96, 128, 256};
    static const int nhs[] = {1, 3, 4, 9};
    static const int ns[] = {1, 15, 16, 17, 40};
    static const int blocks[] = {0, 1, 5, 16, 17};
    int runs = 0;
    for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        const ie_kernels_t *ops = ie_kernels_get((ie_isa_t)isa);
        if (!ops) continue;
        g_bad_scores = g_bad_values = g_bad_paged = g_bad_guard = 0;
        for (int t = 0; t < IE_KV_TYPE_COUNT; t++)
            for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++) {
                if (!ie_kv_head_bytes((ie_kv_type_t)t, hds[a])) continue;
                for (size_t b = 0; b < sizeof nhs / sizeof nhs[0]; b++)
                    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
                        /* j0 inside a block (a sliding window's start) */
                        const int j0 = (int)((a + b + c) % 3) * 7;
                        check(ops, (ie_kv_type_t)t, hds[a], nhs[b], ns[c], j0, blocks[(a + b + c) % 5]);
                        runs++;
                    }
            }
        if (g_bad_scores + g_bad_values + g_bad_paged + g_bad_guard)
            fprintf(stderr, "\n  %s: bad scores %d values %d paged %d guard %d\n", ie_isa_name((ie_isa_t)isa),
                    g_bad_scores, g_bad_values, g_bad_paged, g_bad_guard);
        CU_ASSERT_EQUAL(g_bad_scores, 0);
        CU_ASSERT_EQUAL(g_bad_values, 0);
        CU_ASSERT_EQUAL(g_bad_paged, 0);
        CU_ASSERT_EQUAL(g_bad_guard, 0);
    }
    CU_ASSERT(runs > 1000);
}

/* Integer-valued heads: query amax 32767 and row amax 127 make both scales
 * exactly 1, so a q8 score is the exact integer dot (times scale 1) on
 * every ISA: the int32 sums are exact, not rounded float sums. */
static void test_q8_exact_dots(void)
{
    static const int hds[] = {40, 64, 72, 128, 256};
    for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        const ie_kernels_t *ops = ie_kernels_get((ie_isa_t)isa);
        if (!ops) continue;
        for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++) {
            const int hd = hds[a], n = 37;
            float q[IE_KV_MAX_HD], x[IE_KV_MAX_HD], s[64];
            unsigned char *rows = malloc((size_t)n * (hd + 4));
            int8_t kv[64][IE_KV_MAX_HD];
            for (int i = 0; i < hd; i++) q[i] = (float)((int)(frand() * 32767.0f));
            q[1] = 32767.0f;
            for (int j = 0; j < n; j++) {
                for (int i = 0; i < hd; i++) x[i] = (float)(kv[j][i] = (int8_t)(frand() * 127.0f));
                x[j % hd] = -127.0f; /* amax 127: the row's scale is 1 */
                kv[j][j % hd] = -127;
                ie_kv_encode(IE_KV_Q8, x, hd, rows + (size_t)j * (hd + 4));
            }
            const ie_kv_rows_t kr = {rows, (size_t)hd + 4, NULL, 0, 0};
            ops->kv_scores(IE_KV_Q8, q, (size_t)hd, 1, &kr, 0, n, hd, 1.0f, s, 64);
            int bad = 0;
            for (int j = 0; j < n; j++) {
                int64_t dot = 0;
                for (int i = 0; i < hd; i++) dot += (int64_t)q[i] * kv[j][i];
                if (s[j] != (float)dot) bad++;
            }
            CU_ASSERT_EQUAL(bad, 0);
            free(rows);
        }
    }
}

/* The integer query: absmax maps to 32767, zeros past hd up to 32. */
static void test_quantize_q16(void)
{
    float q[40];
    int16_t qi[64];
    float d;
    for (int i = 0; i < 40; i++) q[i] = (float)i - 20.0f;
    memset(qi, 0x55, sizeof qi);
    ie_kv_quantize_q16(q, 40, qi, &d);
    CU_ASSERT_EQUAL(qi[0], -32767);
    CU_ASSERT_DOUBLE_EQUAL(d, 20.0 / 32767.0, 1e-12);
    for (int i = 40; i < 64; i++) CU_ASSERT_EQUAL(qi[i], 0);
    for (int i = 0; i < 40; i++) q[i] = 0.0f;
    ie_kv_quantize_q16(q, 40, qi, &d);
    CU_ASSERT_EQUAL(d, 0.0f);
    CU_ASSERT_EQUAL(qi[7], 0);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("kvattn", NULL, NULL);
    CU_add_test(s, "every ISA, type, head size vs ref; paged == contiguous", test_against_ref);
    CU_add_test(s, "q8 scores: exact int32 dots", test_q8_exact_dots);
    CU_add_test(s, "int16 query quantization", test_quantize_q16);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

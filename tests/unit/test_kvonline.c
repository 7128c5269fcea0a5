/* test_kvonline.c — the fused online-softmax attention (ie_kernels_t.kv_attend)
 * and the merge / finish of its partial states (ie_attn_state_merge /
 * _finish) on every ISA against the scalar oracle: every K type x V type
 * pair (f32 included), head sizes with and without a SIMD-wide tail (16 ..
 * 256, odd ones where the type allows), 1..20 heads (more than a pass of
 * the SIMD kernels), 1..130 rows around the 16-row tiles and the 64-row
 * steps, windows starting
 * inside a block, with and without the additive constant, the softcap and
 * a sink. Key rows grow along the range, so the running max grows from
 * tile to tile and the rescale is exercised. Checked: the state against
 * the oracle's; a paged view gives the contiguous view's bits; states of a
 * range split at tile edges merge to the one range's result within 2e-6
 * relative (split anywhere: within the scores' rounding); the normalized
 * result equals the two-pass softmax (kv_scores, softmax, kv_values) of
 * the same ISA; nothing is written outside the outputs.
 */
#include <CUnit/Basic.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/src/ie_kernels_isa.h" /* ie_kv_*_ref: the oracle */
#include "ie_kernels.h"
#include "ie_test_rng.h"

#define GUARD_VAL 12345.0f
#define MAXH 20
#define MAXN 160 /* rows of a cache, j0 included */

/* n rows of hd values in type t, row j scaled by 1 + j/8 when `ramp`
 * (scores grow along the range): contiguous at flat (rb bytes apart, not
 * aligned) and, when block > 0, in blocks of `block` rows placed in
 * scrambled order (tab). */
typedef struct cache {
    unsigned char *flat, *pool;
    int32_t tab[MAXN];
    size_t rb;
} cache_t;

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

static void cache_make(cache_t *c, ie_kv_type_t t, int hd, int n, int block, int ramp)
{
    c->rb = ie_kv_head_bytes(t, hd) + 3;
    c->flat = malloc(c->rb * (size_t)n);
    float x[IE_KV_MAX_HD];
    for (int j = 0; j < n; j++) {
        const float g = ramp ? 1.0f + (float)j / 8.0f : 1.0f;
        for (int i = 0; i < hd; i++) x[i] = rng_f() * g * (i == 5 ? 4.0f : 1.0f);
        ie_kv_encode(t, x, hd, c->flat + (size_t)j * c->rb);
    }
    c->pool = NULL;
    if (block <= 0) return;
    const int nb = (n + block - 1) / block;
    c->pool = calloc((size_t)nb * block, c->rb);
    int k = 7;
    while (gcd(k, nb) != 1) k += 2;
    for (int b = 0; b < nb; b++) c->tab[b] = (int32_t)(((int64_t)b * k + 3) % nb);
    for (int j = 0; j < n; j++)
        memcpy(c->pool + ((size_t)c->tab[j / block] * block + j % block) * c->rb, c->flat + (size_t)j * c->rb,
               c->rb);
}

static void cache_free(cache_t *c)
{
    free(c->flat);
    free(c->pool);
}

/* A state of MAXH heads, outputs os floats apart, guards past the last. */
typedef struct state {
    float m[MAXH], l[MAXH], *o;
    size_t os;
    ie_attn_state_t st;
} state_t;

static void state_new(state_t *s, int hd)
{
    s->os = (size_t)hd + 5;
    s->o = malloc(sizeof(float) * (s->os * MAXH + 8));
    for (size_t i = 0; i < s->os * MAXH + 8; i++) s->o[i] = GUARD_VAL;
    s->st = (ie_attn_state_t){s->m, s->l, s->o, s->os};
}

static int g_bad_ref, g_bad_paged, g_bad_merge, g_bad_split, g_bad_twopass, g_bad_guard, g_runs;

/* |a - b| <= tol * mag + 1e-30 for each value of nh heads. */
static int count_bad(const float *a, const float *b, size_t os, int nh, int hd, const double *mag, double tol)
{
    int bad = 0;
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < hd; i++)
            if (!(fabs((double)a[(size_t)h * os + i] - b[(size_t)h * os + i]) <=
                  tol * mag[h * IE_KV_MAX_HD + i] + 1e-30))
                bad++;
    return bad;
}

static void check(const ie_kernels_t *ops, ie_kv_type_t kt, ie_kv_type_t vt, int hd, int nh, int n, int j0,
                  int block, int flags)
{
    const int total = j0 + n, use_add = flags & 1, use_cap = flags & 2, use_sink = flags & 4;
    cache_t kc, vc;
    cache_make(&kc, kt, hd, total, block, 1);
    cache_make(&vc, vt, hd, total, block, 0);
    const size_t qs = (size_t)hd + 3;
    float *q = malloc(sizeof(float) * qs * nh), add[MAXH], sink[MAXH];
    for (size_t i = 0; i < qs * nh; i++) q[i] = rng_f() * 2.0f;
    for (int h = 0; h < nh; h++) add[h] = rng_f() * 3.0f, sink[h] = rng_f() * 4.0f;
    const float scale = 0.25f, cap = use_cap ? 6.0f : 0.0f;
    const ie_kv_rows_t kr = {kc.flat, kc.rb, NULL, 0, 0}, vr = {vc.flat, vc.rb, NULL, 0, 0};
    ie_kv_attend_t a = {kt, vt, &kr, &vr, j0, j0, n, hd, nh, q, qs, scale, cap, use_add ? add : NULL};
    state_t s, sr, sp, s1, s2, s3;
    state_new(&s, hd), state_new(&sr, hd), state_new(&sp, hd);
    state_new(&s1, hd), state_new(&s2, hd), state_new(&s3, hd);
    ops->kv_attend(&a, &s.st);
    ie_kv_attend_ref(&a, &sr.st);

    /* the oracle's probabilities (sink included when used) and per value
     * the scale of its sum, sum_j p_j |v_j[i]|; the scores' rounding
     * bound dmax (kv_scores' test: 2e-6 of sum |q k| scale; q8: exact) */
    float *sc = malloc(sizeof(float) * (size_t)n * nh), vf[IE_KV_MAX_HD], kf[IE_KV_MAX_HD];
    double *mag = calloc((size_t)MAXH * IE_KV_MAX_HD, sizeof(double)), dmax = 0.0;
    ie_kv_scores_ref(kt, q, qs, nh, &kr, j0, n, hd, scale, sc, (size_t)n);
    for (int h = 0; h < nh; h++) {
        double mx = use_sink ? sink[h] : -INFINITY, z = 0.0;
        for (int j = 0; j < n; j++) {
            float x = sc[(size_t)h * n + j] + (use_add ? add[h] : 0.0f);
            if (use_cap) x = cap * tanhf(x / cap);
            sc[(size_t)h * n + j] = x;
            mx = x > mx ? x : mx;
            if (kt != IE_KV_Q8) {
                ie_kv_decode_ref(kt, kc.flat + (size_t)(j0 + j) * kc.rb, hd, kf);
                double sm = 0.0;
                for (int i = 0; i < hd; i++) sm += fabs((double)q[(size_t)h * qs + i] * kf[i]);
                dmax = 2e-6 * sm * scale > dmax ? 2e-6 * sm * scale : dmax;
            }
        }
        for (int j = 0; j < n; j++) z += exp(sc[(size_t)h * n + j] - mx);
        if (use_sink) z += exp(sink[h] - mx);
        for (int j = 0; j < n; j++) {
            const double p = exp(sc[(size_t)h * n + j] - mx) / z;
            ie_kv_decode_ref(vt, vc.flat + (size_t)(j0 + j) * vc.rb, hd, vf);
            for (int i = 0; i < hd; i++) mag[h * IE_KV_MAX_HD + i] += p * fabs((double)vf[i]);
        }
    }
    const double tol = 2.0 * dmax + 1e-5; /* p_j moves by e^(+-dmax); exp and sums round */

    /* against the oracle: the normalized outputs, and l in the oracle's frame */
    float *y = malloc(sizeof(float) * s.os * MAXH), *yr = malloc(sizeof(float) * s.os * MAXH);
    const float *sk = use_sink ? sink : NULL;
    ie_attn_state_finish(&s.st, nh, hd, sk, y, s.os);
    ie_attn_state_finish(&sr.st, nh, hd, sk, yr, s.os);
    g_bad_ref += count_bad(y, yr, s.os, nh, hd, mag, tol);
    for (int h = 0; h < nh; h++) {
        if (!(fabs((double)s.m[h] - sr.m[h]) <= dmax + 1e-30)) g_bad_ref++;
        const double lr = (double)s.l[h] * exp((double)s.m[h] - sr.m[h]);
        if (!(fabs(lr - sr.l[h]) <= tol * sr.l[h])) g_bad_ref++;
    }
    /* nothing past a head's hd values nor past the last head */
    for (int h = 0; h < nh; h++)
        for (size_t i = (size_t)hd; i < (h + 1 < nh ? s.os : s.os * (MAXH - nh + 1) + 8); i++)
            if (s.o[(size_t)h * s.os + i] != GUARD_VAL) g_bad_guard++;

    if (block > 0) { /* a paged view: the contiguous view's bits */
        const ie_kv_rows_t kp = {kc.pool, kc.rb, kc.tab, block, kc.rb * block};
        const ie_kv_rows_t vp = {vc.pool, vc.rb, vc.tab, block, vc.rb * block};
        ie_kv_attend_t ap = a;
        ap.k = &kp, ap.v = &vp;
        ops->kv_attend(&ap, &sp.st);
        for (int h = 0; h < nh; h++)
            if (memcmp(&sp.m[h], &s.m[h], 4) || memcmp(&sp.l[h], &s.l[h], 4) ||
                memcmp(sp.o + (size_t)h * s.os, s.o + (size_t)h * s.os, (size_t)hd * 4))
                g_bad_paged++;
    }

    /* split into three ranges (the middle one empty when n < 2), merged
     * in the order middle, last, first: the one range's result. At tile
     * edges (multiples of 16 from the start) every row has the one call's
     * score bits: within 1e-6; elsewhere within the scores' rounding. */
    for (int edge = 0; edge < 2; edge++) {
        const int c1 = edge ? n / 3 / 16 * 16 : n / 3;
        int c2 = edge ? (2 * n / 3 + 15) / 16 * 16 : 2 * n / 3;
        c2 = c2 > n ? n : c2;
        ie_kv_attend_t p1 = a, p2 = a, p3 = a;
        p1.n = c1;
        p2.kj = p2.vj = j0 + c1, p2.n = c2 - c1;
        p3.kj = p3.vj = j0 + c2, p3.n = n - c2;
        ops->kv_attend(&p2, &s1.st);
        ops->kv_attend(&p3, &s2.st);
        ops->kv_attend(&p1, &s3.st);
        ie_attn_state_merge(&s1.st, &s2.st, nh, hd);
        ie_attn_state_merge(&s1.st, &s3.st, nh, hd);
        ie_attn_state_finish(&s1.st, nh, hd, sk, yr, s.os);
        /* 2e-6: the f32 sums of the two orders (each up to n FMA roundings
         * of 6e-8) measured up to 1.0e-6 apart at 47 rows, 1.5e-6 at 130 */
        const int bad = count_bad(yr, y, s.os, nh, hd, mag, edge ? 2e-6 : tol);
        if (edge) g_bad_merge += bad;
        else g_bad_split += bad;
    }

    /* the two-pass softmax of the same ISA */
    {
        float *p = malloc(sizeof(float) * (size_t)n * nh);
        ops->kv_scores(kt, q, qs, nh, &kr, j0, n, hd, scale, p, (size_t)n);
        for (int h = 0; h < nh; h++) {
            for (int j = 0; j < n; j++) {
                float *x = p + (size_t)h * n + j;
                if (use_add) *x += add[h];
                if (use_cap) *x = cap * tanhf(*x * (1.0f / cap));
            }
            ops->softmax(p + (size_t)h * n, n, sk ? &sink[h] : NULL);
        }
        ops->kv_values(vt, p, (size_t)n, nh, &vr, j0, n, hd, yr, s.os);
        g_bad_twopass += count_bad(y, yr, s.os, nh, hd, mag, tol);
        free(p);
    }
    g_runs++;
    free(q), free(sc), free(mag), free(y), free(yr);
    free(s.o), free(sr.o), free(sp.o), free(s1.o), free(s2.o), free(s3.o);
    cache_free(&kc);
    cache_free(&vc);
}

static void test_against_ref(void)
{
    static const int hds[] = {16, 33, 40, 64, 72, 96, 128, 256};
    static const int nhs[] = {1, 3, 4, 9, 20};
    static const int ns[] = {1, 15, 16, 17, 47, 70, 130};
    static const int blocks[] = {0, 1, 5, 16, 17};
    for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        const ie_kernels_t *ops = ie_kernels_get((ie_isa_t)isa);
        if (!ops) continue;
        g_bad_ref = g_bad_paged = g_bad_merge = g_bad_split = g_bad_twopass = g_bad_guard = g_runs = 0;
        int pick = 0;
        for (int kt = 0; kt < IE_KV_TYPE_COUNT; kt++)
            for (int vt = 0; vt < IE_KV_TYPE_COUNT; vt++)
                for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++) {
                    if (!ie_kv_head_bytes((ie_kv_type_t)kt, hds[a]) || !ie_kv_head_bytes((ie_kv_type_t)vt, hds[a]))
                        continue;
                    for (int rep = 0; rep < 3; rep++, pick++) {
                        const int nh = nhs[pick % 5], n = ns[(pick / 5 + rep) % 7];
                        const int j0 = (pick % 3) * 7; /* inside a block */
                        check(ops, (ie_kv_type_t)kt, (ie_kv_type_t)vt, hds[a], nh, n, j0, blocks[pick % 5],
                              pick % 8);
                    }
                }
        if (g_bad_ref + g_bad_paged + g_bad_merge + g_bad_split + g_bad_twopass + g_bad_guard)
            fprintf(stderr, "\n  %s (%d runs): bad ref %d paged %d merge %d split %d two-pass %d guard %d\n",
                    ie_isa_name((ie_isa_t)isa), g_runs, g_bad_ref, g_bad_paged, g_bad_merge, g_bad_split,
                    g_bad_twopass, g_bad_guard);
        CU_ASSERT_EQUAL(g_bad_ref, 0);
        CU_ASSERT_EQUAL(g_bad_paged, 0);
        CU_ASSERT_EQUAL(g_bad_merge, 0);
        CU_ASSERT_EQUAL(g_bad_split, 0);
        CU_ASSERT_EQUAL(g_bad_twopass, 0);
        CU_ASSERT_EQUAL(g_bad_guard, 0);
        CU_ASSERT(g_runs > 600);
    }
}

/* The merge by hand: an empty side changes nothing; two one-row states of
 * scores 0 and ln 3 (weights 1 and 3) give 1/4 and 3/4 of the rows; the
 * finish with a sink adds exp(sink - m) to the denominator. */
static void test_merge_finish(void)
{
    float m1 = 0.0f, l1 = 1.0f, o1[2] = {1.0f, 0.0f};
    float m2 = logf(3.0f), l2 = 1.0f, o2[2] = {0.0f, 2.0f};
    float me = -INFINITY, le = 0.0f, oe[2] = {0.0f, 0.0f};
    ie_attn_state_t a = {&m1, &l1, o1, 2}, b = {&m2, &l2, o2, 2}, e = {&me, &le, oe, 2};
    ie_attn_state_merge(&a, &e, 1, 2);
    CU_ASSERT_EQUAL(m1, 0.0f);
    CU_ASSERT_EQUAL(l1, 1.0f);
    ie_attn_state_merge(&e, &a, 1, 2); /* into an empty one: a copy */
    CU_ASSERT_EQUAL(me, 0.0f);
    CU_ASSERT_EQUAL(oe[0], 1.0f);
    ie_attn_state_merge(&a, &b, 1, 2);
    CU_ASSERT_DOUBLE_EQUAL(m1, logf(3.0f), 1e-7);
    CU_ASSERT_DOUBLE_EQUAL(l1, 4.0 / 3.0, 1e-6);
    float y[2];
    ie_attn_state_finish(&a, 1, 2, NULL, y, 2);
    CU_ASSERT_DOUBLE_EQUAL(y[0], 0.25, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(y[1], 0.75 * 2.0, 1e-6);
    const float sink = 0.0f; /* weight 1 beside 1 + 3 */
    ie_attn_state_finish(&a, 1, 2, &sink, y, 2);
    CU_ASSERT_DOUBLE_EQUAL(y[0], 0.2, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(y[1], 0.6 * 2.0, 1e-6);
    const float big = 200.0f; /* a sink far above every score: no overflow, weights ~0 */
    ie_attn_state_finish(&a, 1, 2, &big, y, 2);
    CU_ASSERT(y[0] >= 0.0f && y[0] < 1e-30f);
}

int main(void)
{
    rng_seed(0x2545f491);
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("kvonline", NULL, NULL);
    CU_add_test(s, "every ISA and K x V type pair vs ref, paged, merge, two-pass", test_against_ref);
    CU_add_test(s, "state merge and finish by hand", test_merge_finish);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

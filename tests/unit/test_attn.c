/* test_attn.c — CUnit suite for the attention loops (ie_attn.h): every ISA's
 * scores/values against the double-precision ref on odd shapes (head
 * counts 1..9, head sizes with and without a SIMD path, cache lengths
 * around the 16-position blocks, strided rows), no writes outside the
 * outputs, and paged views: rows scattered in blocks of any size (1, 3, 5,
 * 16, 17, 32) over a pool in scrambled order, read from any start j0 (a
 * sliding window starting inside a block), give the very bits (memcmp) of
 * the same rows read contiguously, for every ISA.
 */
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ie_attn.h"
#include "../../kernels/src/ie_kernels_isa.h" /* ie_attn_*_ref: the oracle */
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

static void check_isa(const ie_kernels_t *ops, int nh, int hd, int n)
{
    const size_t qs = (size_t)hd + 3, ks = (size_t)hd * 2 + 5, ld = (size_t)n + 7, os = (size_t)hd + 9;
    float *q = malloc(sizeof(float) * qs * nh);
    float *k = malloc(sizeof(float) * ks * n);
    float *v = malloc(sizeof(float) * ks * n);
    float *p = malloc(sizeof(float) * ld * nh);
    float *s = malloc(sizeof(float) * (ld * nh + GUARD)), *sr = malloc(sizeof(float) * ld * nh);
    float *o = malloc(sizeof(float) * (os * nh + GUARD)), *orf = malloc(sizeof(float) * os * nh);
    CU_ASSERT_FATAL(q && k && v && p && s && sr && o && orf);
    for (size_t i = 0; i < qs * nh; i++) q[i] = frand();
    for (size_t i = 0; i < ks * n; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    for (size_t i = 0; i < ld * nh; i++) p[i] = 0.5f * (frand() + 1.0f) / (float)n;
    for (size_t i = 0; i < ld * nh + GUARD; i++) s[i] = GUARD_VAL;
    for (size_t i = 0; i < os * nh + GUARD; i++) o[i] = GUARD_VAL;

    const ie_attn_rows_t kr = {k, ks, NULL, 0, 0}, vr = {v, ks, NULL, 0, 0};
    ops->attn_scores(q, qs, nh, &kr, 0, n, hd, 0.125f, s, ld);
    ie_attn_scores_ref(q, qs, nh, &kr, 0, n, hd, 0.125f, sr, ld);
    ops->attn_values(p, ld, nh, &vr, 0, n, hd, o, os);
    ie_attn_values_ref(p, ld, nh, &vr, 0, n, hd, orf, os);
    int bad = 0;
    for (int h = 0; h < nh; h++) {
        for (int j = 0; j < n; j++) {
            /* |sum| <= sum |q k| <= hd: bound the error by the terms */
            double tol = 1e-6 * hd * 0.125 + 1e-7;
            if (fabs((double)s[h * ld + j] - sr[h * ld + j]) > tol) bad++;
        }
        for (size_t j = (size_t)n; j < ld; j++)
            if (s[h * ld + j] != GUARD_VAL) bad++;
        for (int i = 0; i < hd; i++)
            if (fabs((double)o[h * os + i] - orf[h * os + i]) > 2e-6 + 6e-8 * n) bad++; /* p sums to <= 1 */
        for (size_t i = (size_t)hd; i < os; i++)
            if (o[h * os + i] != GUARD_VAL) bad++;
    }
    for (int g = 0; g < GUARD; g++) {
        if (s[ld * nh + g] != GUARD_VAL) bad++;
        if (o[os * nh + g] != GUARD_VAL) bad++;
    }
    if (bad) fprintf(stderr, "\n  %s nh %d hd %d n %d: %d mismatches\n", ie_isa_name(ops->isa), nh, hd, n, bad);
    CU_ASSERT_EQUAL(bad, 0);
    free(q);
    free(k);
    free(v);
    free(p);
    free(s);
    free(sr);
    free(o);
    free(orf);
}

static void test_shapes(void)
{
    static const int hds[] = {16, 24, 48, 64, 80, 128, 256, 272};
    static const int ns[] = {1, 2, 15, 16, 17, 31, 32, 33, 100, 257};
    int ran = 0;
    for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        const ie_kernels_t *ops = ie_kernels_get((ie_isa_t)isa);
        if (!ops) continue;
        for (int nh = 1; nh <= 9; nh += (nh < 4 ? 1 : 4))
            for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
                for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
                    check_isa(ops, nh, hds[a], ns[b]);
                    ran++;
                }
    }
    CU_ASSERT(ran >= 400);
}

/* A one-hot probability row picks exactly that value row; equal keys give
 * equal scores (exactness checks that do not depend on tolerances). */
static void test_exact(void)
{
    for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        const ie_kernels_t *ops = ie_kernels_get((ie_isa_t)isa);
        if (!ops) continue;
        enum { HD = 64, N = 40 };
        float q[HD], k[N * HD], v[N * HD], p[N], s[N], o[HD];
        for (int i = 0; i < HD; i++) q[i] = (float)(i % 5) - 2.0f;
        for (int j = 0; j < N; j++)
            for (int i = 0; i < HD; i++) {
                k[j * HD + i] = (float)((i + j) % 3);
                v[j * HD + i] = (float)(j * 100 + i);
            }
        const ie_attn_rows_t kr = {k, HD, NULL, 0, 0}, vr = {v, HD, NULL, 0, 0};
        ops->attn_scores(q, HD, 1, &kr, 0, N, HD, 1.0f, s, N);
        for (int j = 0; j < N; j++) {
            double want = 0;
            for (int i = 0; i < HD; i++) want += q[i] * k[j * HD + i];
            CU_ASSERT_EQUAL(s[j], (float)want); /* small integers: exact in any order */
        }
        memset(p, 0, sizeof p);
        p[23] = 1.0f;
        ops->attn_values(p, N, 1, &vr, 0, N, HD, o, HD);
        for (int i = 0; i < HD; i++) CU_ASSERT_EQUAL(o[i], v[23 * HD + i]);
    }
}

/* A head's scores and outputs do not depend on how many heads share the
 * call (the worker groups 1..group heads per call depending on the batch):
 * nh heads at once == nh calls of one head, bit for bit. */
static void test_head_grouping(void)
{
    static const int hds[] = {16, 48, 64, 128};
    int bad = 0, ran = 0;
    for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        const ie_kernels_t *ops = ie_kernels_get((ie_isa_t)isa);
        if (!ops) continue;
        for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++) {
            enum { NH = 8, N = 75 };
            const int hd = hds[a];
            float *q = malloc(sizeof(float) * NH * hd), *k = malloc(sizeof(float) * N * hd);
            float *v = malloc(sizeof(float) * N * hd), *p = malloc(sizeof(float) * NH * N);
            float *s1 = malloc(sizeof(float) * NH * N), *s2 = malloc(sizeof(float) * NH * N);
            float *o1 = malloc(sizeof(float) * NH * hd), *o2 = malloc(sizeof(float) * NH * hd);
            for (int i = 0; i < NH * hd; i++) q[i] = frand();
            for (int i = 0; i < N * hd; i++) k[i] = frand(), v[i] = frand();
            for (int i = 0; i < NH * N; i++) p[i] = 0.5f * (frand() + 1.0f) / N;
            const ie_attn_rows_t kr = {k, (size_t)hd, NULL, 0, 0}, vr = {v, (size_t)hd, NULL, 0, 0};
            ops->attn_scores(q, (size_t)hd, NH, &kr, 0, N, hd, 0.125f, s1, N);
            ops->attn_values(p, N, NH, &vr, 0, N, hd, o1, (size_t)hd);
            for (int h = 0; h < NH; h++) {
                ops->attn_scores(q + h * hd, (size_t)hd, 1, &kr, 0, N, hd, 0.125f, s2 + h * N, N);
                ops->attn_values(p + h * N, N, 1, &vr, 0, N, hd, o2 + h * hd, (size_t)hd);
            }
            bad += memcmp(s1, s2, sizeof(float) * NH * N) != 0;
            bad += memcmp(o1, o2, sizeof(float) * NH * hd) != 0;
            ran++;
            free(q), free(k), free(v), free(p), free(s1), free(s2), free(o1), free(o2);
        }
    }
    CU_ASSERT(ran >= 8);
    CU_ASSERT_EQUAL(bad, 0);
}

/* One paged layout: positions j0 .. j0+n-1 in blocks of B rows placed in a
 * pool in scrambled order (a block table like the worker's); the kernels
 * on the paged view must give the bits of the kernels on the same rows
 * laid out contiguously. */
static int check_paged(const ie_kernels_t *ops, int nh, int hd, int n, int B, int j0)
{
    const size_t row = (size_t)hd + 5, qs = (size_t)hd + 3, ld = (size_t)n + 3, os = (size_t)hd + 1;
    const int nb = (j0 + n + B - 1) / B; /* logical blocks touched */
    const int pool = nb + 3;             /* some blocks unused */
    float *q = malloc(sizeof(float) * qs * nh), *p = malloc(sizeof(float) * ld * nh);
    float *k = malloc(sizeof(float) * row * n), *v = malloc(sizeof(float) * row * n);
    float *kp = malloc(sizeof(float) * row * B * pool), *vp = malloc(sizeof(float) * row * B * pool);
    float *s1 = malloc(sizeof(float) * ld * nh), *s2 = malloc(sizeof(float) * ld * nh);
    float *o1 = malloc(sizeof(float) * os * nh), *o2 = malloc(sizeof(float) * os * nh);
    int32_t *tab = malloc(sizeof(int32_t) * (nb + 1));
    int bad = 0;
    CU_ASSERT_FATAL(q && p && k && v && kp && vp && s1 && s2 && o1 && o2 && tab);
    for (size_t i = 0; i < qs * nh; i++) q[i] = frand();
    for (size_t i = 0; i < ld * nh; i++) p[i] = 0.5f * (frand() + 1.0f) / (float)n;
    for (size_t i = 0; i < row * n; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    for (size_t i = 0; i < row * B * pool; i++) kp[i] = vp[i] = GUARD_VAL;      /* unused rows: poison */
    for (int b = 0; b < nb; b++) tab[b] = (int32_t)(pool - 1 - (b * 5) % pool); /* scattered, back to front */
    for (int b = 0; b < nb; b++)
        for (int c = 0; c < b; c++)
            if (tab[c] == tab[b]) {
                tab[b] = (tab[b] + 1) % pool;
                c = -1;
            }
    tab[nb] = -1; /* the block after the last: never looked up */
    for (int j = 0; j < n; j++) {
        const int lp = j0 + j;
        memcpy(kp + ((size_t)tab[lp / B] * B + lp % B) * row, k + (size_t)j * row, row * sizeof(float));
        memcpy(vp + ((size_t)tab[lp / B] * B + lp % B) * row, v + (size_t)j * row, row * sizeof(float));
    }
    const ie_attn_rows_t kc = {k, row, NULL, 0, 0}, vc = {v, row, NULL, 0, 0};
    const ie_attn_rows_t kpg = {kp, row, tab, B, (size_t)B * row}, vpg = {vp, row, tab, B, (size_t)B * row};
    for (size_t i = 0; i < ld * nh; i++) s2[i] = GUARD_VAL;
    ops->attn_scores(q, qs, nh, &kc, 0, n, hd, 0.25f, s1, ld);
    ops->attn_scores(q, qs, nh, &kpg, j0, n, hd, 0.25f, s2, ld);
    ops->attn_values(p, ld, nh, &vc, 0, n, hd, o1, os);
    ops->attn_values(p, ld, nh, &vpg, j0, n, hd, o2, os);
    for (int h = 0; h < nh; h++) {
        if (memcmp(s2 + (size_t)h * ld, s1 + (size_t)h * ld, (size_t)n * sizeof(float)) != 0) bad++;
        if (memcmp(o2 + (size_t)h * os, o1 + (size_t)h * os, (size_t)hd * sizeof(float)) != 0) bad++;
        if (s2[(size_t)h * ld + n] != GUARD_VAL) bad++;
    }
    if (bad)
        fprintf(stderr, "\n  %s nh %d hd %d n %d block %d start %d: paged != contiguous\n", ie_isa_name(ops->isa),
                nh, hd, n, B, j0);
    free(q);
    free(p);
    free(k);
    free(v);
    free(kp);
    free(vp);
    free(s1);
    free(s2);
    free(o1);
    free(o2);
    free(tab);
    return bad;
}

static void test_paged(void)
{
    static const int hds[] = {16, 24, 64, 80, 128, 272};
    static const int ns[] = {1, 5, 15, 16, 17, 33, 100};
    static const int bs[] = {1, 3, 5, 16, 17, 32};
    static const int nhs[] = {1, 3, 8};
    int ran = 0, bad = 0;
    for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        const ie_kernels_t *ops = ie_kernels_get((ie_isa_t)isa);
        if (!ops) continue;
        for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
            for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
                for (size_t c = 0; c < sizeof bs / sizeof bs[0]; c++)
                    for (size_t h = 0; h < sizeof nhs / sizeof nhs[0]; h++)
                        for (int st = 0; st < 3; st++) {
                            /* start at a block boundary, inside the first block, or blocks later */
                            const int j0 = st == 0 ? 0 : st == 1 ? (bs[c] * 2) / 3 : 2 * bs[c] + 1;
                            bad += check_paged(ops, nhs[h], hds[a], ns[b], bs[c], j0);
                            ran++;
                        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(ran >= 1500);
}

/* SwiGLU of every ISA vs the libm-based scalar definition: a few ulps,
 * on odd lengths (masked tails), wide input ranges, out aliasing g. */
static void test_swiglu(void)
{
    static const int64_t ns[] = {1, 7, 15, 16, 17, 100, 1000};
    static const float ranges[] = {1.0f, 10.0f, 100.0f, 1000.0f};
    for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        const ie_kernels_t *ops = ie_kernels_get((ie_isa_t)isa);
        if (!ops) continue;
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (size_t b = 0; b < sizeof ranges / sizeof ranges[0]; b++) {
                int64_t n = ns[a];
                float *g = malloc(sizeof(float) * (n + 1)), *u = malloc(sizeof(float) * n);
                float *want = malloc(sizeof(float) * n);
                CU_ASSERT_FATAL(g && u && want);
                for (int64_t i = 0; i < n; i++) {
                    g[i] = ranges[b] * frand();
                    u[i] = frand();
                }
                g[n] = GUARD_VAL;
                ie_swiglu_f32(want, g, u, n);
                ops->swiglu(g, g, u, n); /* in place */
                int bad = 0;
                for (int64_t i = 0; i < n; i++) {
                    double tol = 1e-6 * fabs((double)want[i]) + 1e-30;
                    if (!(fabs((double)g[i] - want[i]) <= tol)) bad++;
                }
                if (g[n] != GUARD_VAL) bad++;
                if (bad)
                    fprintf(stderr, "\n  %s n %lld range %g: %d bad\n", ie_isa_name((ie_isa_t)isa), (long long)n,
                            ranges[b], bad);
                CU_ASSERT_EQUAL(bad, 0);
                free(g);
                free(u);
                free(want);
            }
    }
}

/* Softmax (with and without a sink) of every ISA — the scalar
 * ie_softmax_sink_f32 is the REF entry — against the definition evaluated
 * in double here; rows sum to 1 (minus the sink's share). */
static void test_softmax(void)
{
    static const int64_t ns[] = {1, 2, 15, 16, 17, 33, 1000};
    for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        const ie_kernels_t *ops = ie_kernels_get((ie_isa_t)isa);
        if (!ops) continue;
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (int with_sink = 0; with_sink < 2; with_sink++) {
                int64_t n = ns[a];
                float *x = malloc(sizeof(float) * (n + 1));
                double *want = malloc(sizeof(double) * n);
                CU_ASSERT_FATAL(x && want);
                for (int64_t i = 0; i < n; i++) x[i] = 20.0f * frand();
                x[n] = GUARD_VAL;
                const float sink = 3.0f;
                double m = with_sink ? sink : x[0], z = 0;
                for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
                for (int64_t i = 0; i < n; i++) z += want[i] = exp((double)x[i] - m);
                if (with_sink) z += exp((double)sink - m);
                for (int64_t i = 0; i < n; i++) want[i] /= z;
                ops->softmax(x, n, with_sink ? &sink : NULL);
                int bad = x[n] != GUARD_VAL;
                double sum = 0;
                for (int64_t i = 0; i < n; i++) {
                    if (!(fabs((double)x[i] - want[i]) <= 2e-6 * want[i] + 1e-12)) bad++; /* a few ulps */
                    sum += x[i];
                }
                if (!with_sink) {
                    CU_ASSERT(fabs(sum - 1.0) < 1e-5);
                } else {
                    CU_ASSERT(sum <= 1.0 + 1e-5 && sum > 0.0); /* the sink keeps a share (tiny for long rows) */
                }
                if (bad)
                    fprintf(stderr, "\n  %s softmax n %lld sink %d: %d bad\n", ie_isa_name((ie_isa_t)isa),
                            (long long)n, with_sink, bad);
                CU_ASSERT_EQUAL(bad, 0);
                free(x);
                free(want);
            }
    }
}

/* rmsnorm of every ISA — the scalar ie_rmsnorm_f32 is the REF entry —
 * against the definition in double: odd lengths (masked and scalar
 * tails), small and large magnitudes, out aliasing x, nothing written past
 * n. The SIMD sums add the same double squares in another order, so an
 * output may differ from the scalar's by an ulp of the scale, no more. */
static void test_rmsnorm(void)
{
    static const int64_t ns[] = {1, 7, 8, 15, 16, 17, 31, 32, 33, 100, 2048, 2049, 5632};
    static const float mags[] = {1e-3f, 1.0f, 1e3f};
    int bad = 0, ran = 0;
    for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        const ie_kernels_t *ops = ie_kernels_get((ie_isa_t)isa);
        if (!ops) continue;
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (size_t b = 0; b < sizeof mags / sizeof mags[0]; b++)
                for (int alias = 0; alias < 2; alias++) {
                    const int64_t n = ns[a];
                    float *x = malloc(sizeof(float) * (n + 1)), *w = malloc(sizeof(float) * n);
                    float *o = malloc(sizeof(float) * (n + 1)), *want = malloc(sizeof(float) * n);
                    CU_ASSERT_FATAL(x && w && o && want);
                    for (int64_t i = 0; i < n; i++) {
                        x[i] = mags[b] * frand();
                        w[i] = 1.0f + 0.5f * frand();
                    }
                    x[n] = o[n] = GUARD_VAL;
                    ie_rmsnorm_f32(want, x, w, n, 1e-5f);
                    double ss = 0;
                    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
                    const double sc = 1.0 / sqrt(ss / (double)n + 1e-5);
                    float *out = alias ? x : o;
                    ops->rmsnorm(out, x, w, n, 1e-5f);
                    int e = out[n] != GUARD_VAL;
                    for (int64_t i = 0; i < n; i++)
                        if (!(fabs((double)out[i] - want[i]) <= 3e-7 * fabs((double)want[i]))) e++;
                    /* the definition (x intact when not aliased): 1e-6 relative */
                    if (!alias)
                        for (int64_t i = 0; i < n; i++)
                            if (!(fabs((double)o[i] - (double)x[i] * sc * w[i]) <=
                                  1e-6 * fabs((double)x[i] * sc * w[i]) + 1e-30))
                                e++;
                    if (e)
                        fprintf(stderr, "\n  %s rmsnorm n %lld mag %g alias %d: %d bad\n",
                                ie_isa_name((ie_isa_t)isa), (long long)n, mags[b], alias, e);
                    bad += e;
                    ran++;
                    free(x);
                    free(w);
                    free(o);
                    free(want);
                }
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(ran >= 3 * 13 * 3 * 2 - 13 * 3 * 2); /* ref and AVX-512 at least */
}

/* ie_stream_read (the oracle) against a word-by-word xor, and every ISA's
 * stream_read against the oracle, at every start offset 0..63 and lengths
 * around the 64- and 128-byte steps (the tail paths). */
static void test_stream_read(void)
{
    enum { CAP = 1200 };
    unsigned char *buf = malloc(CAP + 64);
    CU_ASSERT_FATAL(buf != NULL);
    for (int i = 0; i < CAP + 64; i++) buf[i] = (unsigned char)(i * 131 + (i >> 3) * 7 + 1);
    static const size_t ns[] = {0, 1, 7, 8, 9, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 1100};
    int bad = 0;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (int off = 0; off < 64; off++) {
            const size_t n = ns[a];
            uint64_t want = 0;
            for (size_t i = 0; i < n; i += 8) {
                uint64_t w = 0;
                memcpy(&w, buf + off + i, n - i < 8 ? n - i : 8);
                want ^= w;
            }
            if (ie_stream_read(buf + off, n) != want) bad++;
            for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
                const ie_kernels_t *ops = ie_kernels_get((ie_isa_t)isa);
                if (ops && ops->stream_read(buf + off, n) != want) bad++;
            }
        }
    /* one changed byte changes the result (the bytes are really read) */
    const uint64_t before = ie_stream_read(buf, 1000);
    buf[999] ^= 0x40;
    CU_ASSERT_NOT_EQUAL(ie_stream_read(buf, 1000), before);
    CU_ASSERT_EQUAL(bad, 0);
    free(buf);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return (int)CU_get_error();
    CU_pSuite suite = CU_add_suite("attn", NULL, NULL);
    if (!suite) {
        CU_cleanup_registry();
        return (int)CU_get_error();
    }
    CU_add_test(suite, "every ISA vs ref on odd shapes", test_shapes);
    CU_add_test(suite, "exact cases", test_exact);
    CU_add_test(suite, "heads per call do not change the bits", test_head_grouping);
    CU_add_test(suite, "paged views == contiguous, bit for bit", test_paged);
    CU_add_test(suite, "swiglu vs scalar", test_swiglu);
    CU_add_test(suite, "softmax vs scalar", test_softmax);
    CU_add_test(suite, "rmsnorm vs scalar and the definition", test_rmsnorm);
    CU_add_test(suite, "stream read: xor of the words, any offset and length", test_stream_read);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}

/* test_kquant.c — the k-quant family in ROWS layout (kernels/ref/kquant_ref.c).
 *
 * What is checked, and against what:
 *   dequantize : ie_dequantize_row equals gguf.quants' dequantization bit for
 *                bit (memcmp of the floats) on the fixtures of
 *                tests/data/kquant (tests/reference/gen_kquant_ref.py: random
 *                blocks with finite f16 scales, all-zero and all-0xff blocks,
 *                scales 65504 / -65504 / the smallest subnormal, and blocks
 *                that use every sub-block scale and min code; the test checks
 *                that coverage itself).
 *   codes      : ie_kq_decode then ie_kq_encode gives every fixture block and
 *                2000 random blocks per type back byte for byte (every bit of
 *                these layouts is a field).
 *   matmul     : the ROWS references against a double-precision dot of the
 *                dequantized weights and the dequantized activations (d*q in
 *                double): |y - dot| <= 1e-6 * sum_k |a_k| (|w_k| + |o_k|),
 *                o_k the offset part of w_k's formula (m, dmin*mn, 16d, 4d*sc,
 *                32d*sc): the kernels' integer sums are exact and only a few
 *                f32 roundings (2^-24 each) of per-block terms remain. Odd row
 *                counts, sub-ranges, 1-3 and 19 tokens, n_in 256/512/768 (and
 *                32/96/160 for the 32-element types), every ISA's table.
 *   Q8_K       : ie_quantize_row_q8_k_ref equals a scalar restatement of
 *                ggml's quantize_row_q8_K (rintf for nearest_int) byte for
 *                byte; every ISA's act_quantize writes the same bytes.
 *   quantize   : Q5_0 / Q5_1 byte for byte gguf.quants' quantize (fixtures);
 *                every type's round trip within the bounds stated at
 *                test_quantize_bounds (random, tiny, all-zero, constant,
 *                one-outlier data); -1 for n that does not fit the blocks.
 *   nonfinite  : ie_quant_find_nonfinite finds a NaN / inf d, dmin, m (or
 *                Q8_1's s, Q8_K's f32 d) in block k of every block type, -1
 *                for finite rows, MXFP4 and the float types.
 */
#include "ie_kernels.h"
#include "../../kernels/src/ie_kernels_isa.h"
#include "ie_test_rng.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef IE_TEST_DATA
#define IE_TEST_DATA "tests/data"
#endif

static const ie_dtype_t KQ[] = {IE_DTYPE_Q5_0, IE_DTYPE_Q5_1, IE_DTYPE_IQ4_NL, IE_DTYPE_Q2_K,  IE_DTYPE_Q3_K,
                                IE_DTYPE_Q4_K, IE_DTYPE_Q5_K, IE_DTYPE_Q6_K,   IE_DTYPE_IQ4_XS};
#define N_KQ (sizeof KQ / sizeof KQ[0])

/* ------------------------------------------------------------- helpers */

/* The whole file at path (malloc'd) and its size; NULL if unreadable. */
static void *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(n > 0 ? (size_t)n : 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return p;
}

static void *read_fixture(const char *name, const char *ext, size_t *size)
{
    char path[512];
    snprintf(path, sizeof path, "%s/kquant/%s.%s", IE_TEST_DATA, name, ext);
    void *p = read_file(path, size);
    if (!p) printf("\n  cannot read %s", path);
    return p;
}

/* A finite f16 with a random sign and exponent field below max_exp. */
static ie_f16_t rand_f16(int max_exp)
{
    const unsigned e = rng_u32() % (unsigned)max_exp, m = rng_u32() & 0x3ff, s = rng_u32() & 1;
    return (ie_f16_t)(s << 15 | e << 10 | m);
}

/* n random blocks of t with finite f16 scale fields (exponents below
 * max_exp), through ie_kq_encode from random codes. */
static void random_blocks(ie_dtype_t t, void *dst, int64_t nblocks, int max_exp)
{
    ie_kq_codes_t c;
    const size_t bb = ie_dtype_block_bytes(t);
    for (int64_t b = 0; b < nblocks; b++) {
        for (int k = 0; k < IE_QK_K; k++) c.u[k] = (uint8_t)rng_u32();
        for (int j = 0; j < 16; j++) {
            c.sc[j] = (int8_t)rng_u32();
            c.mn[j] = (int8_t)rng_u32();
        }
        c.d = rand_f16(max_exp);
        c.dmin = rand_f16(max_exp);
        CU_ASSERT_EQUAL(ie_kq_encode(t, &c, (uint8_t *)dst + (size_t)b * bb), 0);
    }
}

/* ------------------------------------------------------------- info */

static void test_info(void)
{
    ie_kq_info_t in;
    for (size_t i = 0; i < N_KQ; i++) {
        CU_ASSERT_EQUAL(ie_kq_info(KQ[i], &in), 0);
        CU_ASSERT_EQUAL(in.qk, ie_dtype_block_elems(KQ[i]));
        /* the panel formula's field bytes add up to a ggml block's payload */
        const size_t bits = (size_t)in.qk * (size_t)in.bits / 8;
        CU_ASSERT(bits < ie_dtype_block_bytes(KQ[i]));
    }
    CU_ASSERT_EQUAL(ie_kq_info(IE_DTYPE_Q4_0, &in), -1);
    CU_ASSERT_EQUAL(ie_kq_info(IE_DTYPE_Q8_K, &in), -1);
    ie_kq_codes_t c;
    uint8_t blk[256] = {0};
    CU_ASSERT_EQUAL(ie_kq_decode(IE_DTYPE_Q8_0, blk, &c), -1);
    CU_ASSERT_EQUAL(ie_kq_encode(IE_DTYPE_F32, &c, blk), -1);
}

/* ------------------------------------------------- dequantize fixtures */

static void test_dequant_fixtures(void)
{
    for (size_t i = 0; i < N_KQ; i++) {
        const ie_dtype_t t = KQ[i];
        const char *name = ie_dtype_name(t);
        size_t nb = 0, nf = 0;
        uint8_t *blocks = read_fixture(name, "blocks", &nb);
        float *want = read_fixture(name, "f32", &nf);
        CU_ASSERT_FATAL(blocks && want);
        const size_t bb = ie_dtype_block_bytes(t);
        const int qk = ie_dtype_block_elems(t);
        const int64_t nblk = (int64_t)(nb / bb);
        CU_ASSERT_EQUAL(nb % bb, 0);
        CU_ASSERT_EQUAL(nf, (size_t)nblk * (size_t)qk * sizeof(float));
        CU_ASSERT(nblk >= 10);
        float *got = malloc(nf);
        ie_dequantize_row(t, blocks, got, nblk * qk);
        int bad = 0;
        for (int64_t k = 0; k < nblk * qk; k++)
            if (memcmp(&got[k], &want[k], sizeof(float)) != 0) {
                if (bad < 3)
                    printf("\n  %s block %lld elem %lld: %.9g, gguf.quants %.9g", name, (long long)(k / qk),
                           (long long)(k % qk), got[k], want[k]);
                bad++;
            }
        CU_ASSERT_EQUAL(bad, 0);

        /* decode -> encode gives every block back; and the fixtures use
         * every scale / min code (the generator's promise) */
        ie_kq_info_t in;
        (void)ie_kq_info(t, &in);
        int seen_sc[256] = {0}, seen_mn[256] = {0}, rt_bad = 0;
        uint8_t back[256];
        for (int64_t b = 0; b < nblk; b++) {
            ie_kq_codes_t c;
            CU_ASSERT_EQUAL(ie_kq_decode(t, blocks + (size_t)b * bb, &c), 0);
            CU_ASSERT_EQUAL(ie_kq_encode(t, &c, back), 0);
            if (memcmp(back, blocks + (size_t)b * bb, bb) != 0) rt_bad++;
            for (int j = 0; j < in.nsub; j++) {
                seen_sc[(uint8_t)c.sc[j]] = 1;
                seen_mn[(uint8_t)c.mn[j]] = 1;
            }
        }
        CU_ASSERT_EQUAL(rt_bad, 0);
        if (in.nsub) {
            /* the signed code range of each type's scales */
            int lo = 0, hi = (1 << (t == IE_DTYPE_Q2_K ? 4 : 6)) - 1;
            if (t == IE_DTYPE_Q3_K || t == IE_DTYPE_IQ4_XS) lo = -32, hi = 31;
            if (t == IE_DTYPE_Q6_K) lo = -128, hi = 127;
            int missing = 0;
            for (int v = lo; v <= hi; v++) {
                missing += !seen_sc[(uint8_t)v];
                if (in.has_mn) missing += !seen_mn[(uint8_t)v];
            }
            if (missing) printf("\n  %s: %d scale/min codes not covered", name, missing);
            CU_ASSERT_EQUAL(missing, 0);
        }
        free(got);
        free(blocks);
        free(want);
    }
}

/* Random bytes: decode -> encode -> the same bytes; and the codes decode
 * into their ranges. */
static void test_codes_roundtrip(void)
{
    for (size_t i = 0; i < N_KQ; i++) {
        const ie_dtype_t t = KQ[i];
        const size_t bb = ie_dtype_block_bytes(t);
        ie_kq_info_t in;
        (void)ie_kq_info(t, &in);
        uint8_t blk[256], back[256];
        int bad = 0, range = 0;
        rng_seed(77 + i);
        for (int r = 0; r < 2000; r++) {
            for (size_t j = 0; j < bb; j++) blk[j] = (uint8_t)rng_u32();
            ie_kq_codes_t c;
            (void)ie_kq_decode(t, blk, &c);
            for (int k = 0; k < in.qk; k++) range += c.u[k] >> in.bits;
            for (int k = in.qk; k < IE_QK_K; k++) range += c.u[k] != 0;
            (void)ie_kq_encode(t, &c, back);
            bad += memcmp(blk, back, bb) != 0;
        }
        CU_ASSERT_EQUAL(bad, 0);
        CU_ASSERT_EQUAL(range, 0);
    }
}

/* ------------------------------------------------------------- Q8_K */

/* ggml's quantize_row_q8_K restated: the value of largest magnitude (the
 * first on ties), iscale = -127/max, q = min(127, nearest(iscale*x)) with
 * ties to even (rintf), d = 1/iscale, bsums; an all-zero block (and, the
 * engine's rule, one whose 127/max overflows) is d 0 and codes 0. */
static void q8k_restated(const float *x, ie_block_q8_k_t *y)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
    memset(y, 0, sizeof *y);
    if (amax == 0.0f) return;
    const float iscale = -127.0f / max;
    if (isinf(iscale)) return;
    for (int j = 0; j < 256; j++) {
        const long v = lrintf(iscale * x[j]);
        y->q[j] = (int8_t)(v > 127 ? 127 : v);
        y->bsums[j / 16] = (int16_t)(y->bsums[j / 16] + y->q[j]);
    }
    y->d = 1.0f / iscale;
}

static void test_q8_k(void)
{
    enum { NB = 12 };
    float x[NB * 256];
    ie_block_q8_k_t got[NB], want[NB], isa_out[NB];
    for (int round = 0; round < 20; round++) {
        rng_seed(900 + (uint64_t)round);
        rng_fill(x, NB * 256);
        memset(x + 256, 0, 256 * sizeof(float));          /* block 1: all zero */
        for (int j = 0; j < 256; j++) x[512 + j] = 0.25f; /* block 2: constant */
        x[768 + 17] = -40.0f;                             /* block 3: one (negative) outlier */
        for (int j = 0; j < 256; j++) x[1024 + j] = 1e-40f * (float)(j % 7 - 3); /* subnormals */
        for (int j = 0; j < 256; j++) x[1280 + j] = (float)(j - 128) * 0.5f;     /* exact ties */
        for (int j = 0; j < 256; j++) x[1536 + j] *= 0.01f;
        x[1536] = 3.0f, x[1537] = -3.0f; /* equal magnitudes: the first wins (max = +3) */
        ie_quantize_row_q8_k_ref(x, got, NB * 256);
        for (int b = 0; b < NB; b++) q8k_restated(x + b * 256, &want[b]);
        CU_ASSERT_EQUAL(memcmp(got, want, sizeof got), 0);
        for (int i = IE_ISA_REF; i <= IE_ISA_AVX512; i++) {
            const ie_kernels_t *k = ie_kernels_get((ie_isa_t)i);
            if (!k) continue;
            memset(isa_out, 0x5a, sizeof isa_out);
            k->act_quantize(IE_DTYPE_Q8_K, x, isa_out, NB * 256);
            CU_ASSERT_EQUAL(memcmp(isa_out, want, sizeof want), 0);
            memset(isa_out, 0x5a, sizeof isa_out);
            k->act_quantize_stream(IE_DTYPE_Q8_K, x, isa_out, NB * 256);
            CU_ASSERT_EQUAL(memcmp(isa_out, want, sizeof want), 0);
        }
    }
    CU_ASSERT_EQUAL(got[1].d, 0.0f);
    CU_ASSERT(got[3].q[17] == -127 && got[3].d > 0.0f);
    CU_ASSERT(got[6].q[0] == -127 && got[6].q[1] == 127);
    CU_ASSERT_EQUAL(ie_quant_find_nonfinite(IE_DTYPE_Q8_K, got, NB * 256), -1);
}

/* ------------------------------------------------------------- matmul */

/* Activation row (ie_matmul_act_dtype(t): Q8_P or Q8_K) dequantized in
 * double: d*q. */
static void act_values(ie_dtype_t at, const uint8_t *a, int64_t n, double *out)
{
    if (at == IE_DTYPE_Q8_P) {
        for (int64_t k = 0; k < n; k++) {
            float d;
            memcpy(&d, a + n + 4 * (k / 32), sizeof d);
            out[k] = (double)d * (int8_t)a[k];
        }
    } else {
        for (int64_t b = 0; b < n / 256; b++) {
            ie_block_q8_k_t blk;
            memcpy(&blk, a + (size_t)b * sizeof blk, sizeof blk);
            for (int j = 0; j < 256; j++) out[b * 256 + j] = (double)blk.d * blk.q[j];
        }
    }
}

/* |offset part| of element k's formula (see the header comment). */
static double offset_mag(ie_dtype_t t, const ie_kq_codes_t *c, int k)
{
    const double d = ie_f16_to_f32(c->d), dm = ie_f16_to_f32(c->dmin);
    switch (t) {
    case IE_DTYPE_Q5_0: return 16 * fabs(d);
    case IE_DTYPE_Q5_1: return fabs(dm);
    case IE_DTYPE_Q2_K: return fabs(dm * c->mn[k / 16]);
    case IE_DTYPE_Q4_K:
    case IE_DTYPE_Q5_K: return fabs(dm * c->mn[k / 32]);
    case IE_DTYPE_Q3_K: return 4 * fabs(d * c->sc[k / 16]);
    case IE_DTYPE_Q6_K: return 32 * fabs(d * c->sc[k / 16]);
    default: return 0.0;
    }
}

static int check_matmul(ie_isa_t isa, ie_dtype_t t, int64_t n_in, int64_t n_out, int64_t r0, int64_t n_tok,
                        uint64_t seed)
{
    const ie_dtype_t at = ie_matmul_act_dtype(t);
    const size_t wb = ie_dtype_row_bytes(t, n_in), as = ie_dtype_row_bytes(at, n_in) + 20;
    const int qk = ie_dtype_block_elems(t);
    const int64_t ldy = n_out + 3;
    uint8_t *w = malloc(wb * (size_t)n_out), *a = malloc(as * (size_t)n_tok);
    float *x = malloc(sizeof(float) * (size_t)n_in), *wf = malloc(sizeof(float) * (size_t)n_in);
    double *av = malloc(sizeof(double) * (size_t)n_in), *om = malloc(sizeof(double) * (size_t)n_in);
    float *y = malloc(sizeof(float) * (size_t)(ldy * n_tok));
    rng_seed(seed);
    random_blocks(t, w, n_out * (n_in / qk), 19); /* |d| < 2^4: no inf in f32 sums */
    for (int64_t tk = 0; tk < n_tok; tk++) {
        rng_fill(x, n_in);
        ie_act_quantize_ref(at, x, a + (size_t)tk * as, n_in);
    }
    for (int64_t i = 0; i < ldy * n_tok; i++) y[i] = -777.0f;
    CU_ASSERT_EQUAL(ie_kernels_matmul(ie_kernels_get(isa), t, w, n_in, r0, n_out, a, as, n_tok, y, ldy), IE_OK);
    int bad = 0;
    for (int64_t r = 0; r < n_out; r++) {
        const uint8_t *wr = w + (size_t)r * wb;
        ie_dequantize_row(t, wr, wf, n_in);
        for (int64_t b = 0; b < n_in / qk; b++) {
            ie_kq_codes_t c;
            (void)ie_kq_decode(t, wr + (size_t)b * ie_dtype_block_bytes(t), &c);
            for (int k = 0; k < qk; k++) om[b * qk + k] = offset_mag(t, &c, k);
        }
        for (int64_t tk = 0; tk < n_tok; tk++) {
            const float v = y[tk * ldy + r];
            if (r < r0) {
                bad += v != -777.0f;
                continue;
            }
            act_values(at, a + (size_t)tk * as, n_in, av);
            double dot = 0.0, mag = 0.0;
            for (int64_t k = 0; k < n_in; k++) {
                dot += (double)wf[k] * av[k];
                mag += fabs(av[k]) * (fabs((double)wf[k]) + om[k]);
            }
            if (!(fabs((double)v - dot) <= 1e-6 * mag + 1e-30)) {
                if (bad < 3)
                    printf("\n  %s %s n_in=%lld r=%lld t=%lld: %.9g vs %.9g (mag %.3g)", ie_isa_name(isa),
                           ie_dtype_name(t), (long long)n_in, (long long)r, (long long)tk, v, dot, mag);
                bad++;
            }
        }
    }
    for (int64_t tk = 0; tk < n_tok; tk++)
        for (int64_t r = n_out; r < ldy; r++) bad += y[tk * ldy + r] != -777.0f;
    free(w);
    free(a);
    free(x);
    free(wf);
    free(av);
    free(om);
    free(y);
    return bad;
}

static void test_matmul_rows(void)
{
    static const int64_t nin_k[] = {256, 512, 768}, nin_32[] = {32, 96, 160, 256};
    static const int64_t nouts[] = {1, 5, 13};
    int cases = 0;
    for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        if (!ie_kernels_get((ie_isa_t)isa)) continue;
        for (size_t i = 0; i < N_KQ; i++) {
            const ie_dtype_t t = KQ[i];
            const int big = ie_dtype_block_elems(t) == IE_QK_K;
            const int64_t *nins = big ? nin_k : nin_32;
            const int nn = big ? 3 : 4;
            for (int a = 0; a < nn; a++)
                for (int b = 0; b < 3; b++) {
                    const int64_t n_tok = 1 + (a + b) % 3, r0 = nouts[b] > 4 ? 2 : 0;
                    CU_ASSERT_EQUAL(check_matmul((ie_isa_t)isa, t, nins[a], nouts[b], r0, n_tok,
                                                 5000 + 97 * i + 13 * (uint64_t)a + (uint64_t)b),
                                    0);
                    cases++;
                }
            /* more tokens than the kernel's token group (16) */
            CU_ASSERT_EQUAL(check_matmul((ie_isa_t)isa, t, big ? 512 : 96, 3, 1, 19, 7100 + i), 0);
            cases++;
        }
    }
    printf("\n  %d matmul cases ", cases);
}

/* ---------------------------------------------------------- quantizers */

/* Q5_0 / Q5_1: ggml's reference rule, byte for byte what gguf.quants'
 * quantize wrote for the fixture inputs (random floats at four scales, an
 * all-zero, a constant, a one-outlier and a linear block). */
static void test_quantize_q5_exact(void)
{
    static const ie_dtype_t ts[] = {IE_DTYPE_Q5_0, IE_DTYPE_Q5_1};
    for (int i = 0; i < 2; i++) {
        size_t nx = 0, nq = 0;
        float *x = read_fixture(ie_dtype_name(ts[i]), "qin.f32", &nx);
        uint8_t *want = read_fixture(ie_dtype_name(ts[i]), "qout", &nq);
        CU_ASSERT_FATAL(x && want);
        const int64_t n = (int64_t)(nx / sizeof(float));
        CU_ASSERT_EQUAL(nq, ie_dtype_row_bytes(ts[i], n));
        uint8_t *got = malloc(nq);
        CU_ASSERT_EQUAL(ie_quantize_row(ts[i], x, got, n), 0);
        int bad = 0;
        for (size_t b = 0; b < nq / ie_dtype_block_bytes(ts[i]); b++) {
            const size_t bb = ie_dtype_block_bytes(ts[i]);
            if (memcmp(got + b * bb, want + b * bb, bb) != 0) {
                if (bad < 3) printf("\n  %s block %zu differs from gguf.quants", ie_dtype_name(ts[i]), b);
                bad++;
            }
        }
        CU_ASSERT_EQUAL(bad, 0);
        free(got);
        free(x);
        free(want);
    }
}

/* Round-trip bounds of ie_quantize_row -> ie_dequantize_row, per block,
 * R = max |x| over the block (the block's range up to a factor 2):
 *   max |x - x'| <= cmax * R and rms(x - x') <= crms * R
 * with (cmax, crms) per type below: Q5_0 1/16 + 2^-11 (its rule clips +R
 * to code 31 = 15/16 R: one full step; plus the f16 rounding of d) and
 * Q5_1 1/31 + 2^-10 + 2^-11 (half a step of (max-min)/31 <= 2R/31, plus
 * the f16 roundings of d and m); for the search quantizers the observed worst over these
 * data sets (uniform, varying-scale, tiny) times ~1.2. Edge blocks: all
 * zero -> exactly zero; a constant block -> within 2e-3 R (f16 rounding of
 * the scales); one outlier of 50 among 0.01-noise -> within 0.02 R. */
static void test_quantize_bounds(void)
{
    static const struct {
        ie_dtype_t t;
        double cmax, crms;
    } B[] = {{IE_DTYPE_Q5_0, 0.0630, 0.030}, {IE_DTYPE_Q5_1, 0.034, 0.025},  {IE_DTYPE_IQ4_NL, 0.165, 0.060},
             {IE_DTYPE_Q2_K, 0.56, 0.17},    {IE_DTYPE_Q3_K, 0.32, 0.090},   {IE_DTYPE_Q4_K, 0.15, 0.041},
             {IE_DTYPE_Q5_K, 0.068, 0.021},  {IE_DTYPE_Q6_K, 0.030, 0.0098}, {IE_DTYPE_IQ4_XS, 0.20, 0.050}};
    enum { N = 256 * 24 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    uint8_t *q = malloc(ie_dtype_row_bytes(IE_DTYPE_Q6_K, N) + ie_dtype_row_bytes(IE_DTYPE_Q5_1, N));
    for (size_t i = 0; i < sizeof B / sizeof B[0]; i++) {
        const ie_dtype_t t = B[i].t;
        const int qk = ie_dtype_block_elems(t);
        double worst_max = 0, worst_rms = 0;
        int bad = 0;
        for (int ds = 0; ds < 7; ds++) {
            rng_seed(4000 + 10 * i + (uint64_t)ds);
            for (int k = 0; k < N; k++) {
                switch (ds) {
                case 0: x[k] = rng_f(); break;                      /* uniform */
                case 1: x[k] = rng_f() + rng_f() + rng_f(); break;  /* bell-shaped */
                case 2: x[k] = 1e-3f * rng_f(); break;              /* tiny: subnormal f16 d */
                case 3: x[k] = 0.0f; break;                         /* all zero */
                case 4: x[k] = (k / qk) % 2 ? 0.75f : -0.3f; break; /* constant */
                case 5: x[k] = 0.01f * rng_f() + (k % qk == 37 % qk ? 50.0f : 0.0f); break; /* one outlier */
                default: x[k] = 0.0f; break;
                }
            }
            if (ds == 6) rng_fill(x, N); /* scales over three decades per 32 */
            CU_ASSERT_EQUAL_FATAL(ie_quantize_row(t, x, q, N), 0);
            ie_dequantize_row(t, q, y, N);
            CU_ASSERT_EQUAL(ie_quant_find_nonfinite(t, q, N), -1);
            for (int b = 0; b < N / qk; b++) {
                double R = 0, me = 0, se = 0;
                for (int k = b * qk; k < (b + 1) * qk; k++) {
                    const double e = fabs((double)x[k] - y[k]);
                    R = fmax(R, fabs(x[k]));
                    me = fmax(me, e);
                    se += e * e;
                }
                const double rms = sqrt(se / qk);
                if (ds == 3) {
                    bad += me != 0.0;
                    continue;
                }
                const double cm = ds == 4 ? 2e-3 : ds == 5 ? 0.02 : B[i].cmax;
                const double cr = ds == 4 ? 2e-3 : ds == 5 ? 0.02 : B[i].crms;
                if (ds != 4 && ds != 5) worst_max = fmax(worst_max, me / R), worst_rms = fmax(worst_rms, rms / R);
                if (!(me <= cm * R) || !(rms <= cr * R)) {
                    if (bad < 3)
                        printf("\n  %s data %d block %d: max err %.4g rms %.4g (R %.4g)", ie_dtype_name(t), ds, b,
                               me, rms, R);
                    bad++;
                }
            }
        }
        printf("\n  %-7s worst max/R %.4f rms/R %.4f", ie_dtype_name(t), worst_max, worst_rms);
        CU_ASSERT_EQUAL(bad, 0);
        /* n that does not fit the blocks */
        CU_ASSERT_EQUAL(ie_quantize_row(t, x, q, qk + 16), -1);
        CU_ASSERT_EQUAL(ie_quantize_row(t, x, q, -qk), -1);
        CU_ASSERT_EQUAL(ie_quantize_row(t, x, q, 0), 0);
    }
    free(x);
    free(y);
    free(q);
}

/* ---------------------------------------------------- nonfinite scales */

static void test_find_nonfinite(void)
{
    static const ie_dtype_t all[] = {IE_DTYPE_Q8_0, IE_DTYPE_Q8_1,   IE_DTYPE_Q4_0,  IE_DTYPE_Q4_1, IE_DTYPE_Q5_0,
                                     IE_DTYPE_Q5_1, IE_DTYPE_IQ4_NL, IE_DTYPE_Q2_K,  IE_DTYPE_Q3_K, IE_DTYPE_Q4_K,
                                     IE_DTYPE_Q5_K, IE_DTYPE_Q6_K,   IE_DTYPE_IQ4_XS};
    uint8_t row[6 * 292];
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const ie_dtype_t t = all[i];
        const int qk = ie_dtype_block_elems(t);
        const size_t bb = ie_dtype_block_bytes(t);
        float x[6 * 256];
        rng_seed(31 + i);
        rng_fill(x, 6 * qk);
        /* a finite row: quantized where a quantizer exists, else random codes */
        if (ie_dtype_is_kquant(t)) random_blocks(t, row, 6, 31);
        else CU_ASSERT_EQUAL(ie_quantize_row(t, x, row, 6 * qk), 0);
        CU_ASSERT_EQUAL(ie_quant_find_nonfinite(t, row, 6 * qk), -1);
        /* the offsets of the f16 scale fields: d, and the second (dmin, m, s) */
        size_t od = 0, o2 = (size_t)-1;
        switch (t) {
        case IE_DTYPE_Q8_1:
        case IE_DTYPE_Q4_1:
        case IE_DTYPE_Q5_1:
        case IE_DTYPE_Q4_K:
        case IE_DTYPE_Q5_K: o2 = 2; break;
        case IE_DTYPE_Q2_K: od = 80, o2 = 82; break;
        case IE_DTYPE_Q3_K: od = 108; break;
        case IE_DTYPE_Q6_K: od = 208; break;
        default: break;
        }
        static const ie_f16_t bad16[] = {0x7c00, 0xfc00, 0x7e00, 0xfe01};
        for (int k = 0; k < 6; k++)
            for (int v = 0; v < 4; v++)
                for (int which = 0; which < 2; which++) {
                    const size_t o = which ? o2 : od;
                    if (o == (size_t)-1) continue;
                    uint8_t save[2];
                    uint8_t *p = row + (size_t)k * bb + o;
                    memcpy(save, p, 2);
                    p[0] = (uint8_t)bad16[v], p[1] = (uint8_t)(bad16[v] >> 8);
                    CU_ASSERT_EQUAL(ie_quant_find_nonfinite(t, row, 6 * qk), k);
                    /* a second bad block later does not change the answer */
                    if (k < 5) {
                        uint8_t *p2 = row + (size_t)5 * bb + od, s2[2];
                        memcpy(s2, p2, 2);
                        p2[0] = 0x00, p2[1] = 0x7c;
                        CU_ASSERT_EQUAL(ie_quant_find_nonfinite(t, row, 6 * qk), k);
                        memcpy(p2, s2, 2);
                    }
                    memcpy(p, save, 2);
                }
        CU_ASSERT_EQUAL(ie_quant_find_nonfinite(t, row, 6 * qk), -1);
    }
    /* Q8_K: f32 d */
    ie_block_q8_k_t q8k[3];
    float x[3 * 256];
    rng_fill(x, 3 * 256);
    ie_quantize_row_q8_k_ref(x, q8k, 3 * 256);
    CU_ASSERT_EQUAL(ie_quant_find_nonfinite(IE_DTYPE_Q8_K, q8k, 3 * 256), -1);
    q8k[2].d = NAN;
    CU_ASSERT_EQUAL(ie_quant_find_nonfinite(IE_DTYPE_Q8_K, q8k, 3 * 256), 2);
    q8k[1].d = -INFINITY;
    CU_ASSERT_EQUAL(ie_quant_find_nonfinite(IE_DTYPE_Q8_K, q8k, 3 * 256), 1);
    /* MXFP4 (every e is a finite scale), float types: always -1 */
    memset(row, 0xff, sizeof row);
    CU_ASSERT_EQUAL(ie_quant_find_nonfinite(IE_DTYPE_MXFP4, row, 6 * 32), -1);
    CU_ASSERT_EQUAL(ie_quant_find_nonfinite(IE_DTYPE_F16, row, 64), -1);
    CU_ASSERT_EQUAL(ie_quant_find_nonfinite(IE_DTYPE_BF16, row, 64), -1);
    CU_ASSERT_EQUAL(ie_quant_find_nonfinite(IE_DTYPE_F32, row, 64), -1);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("kquant", NULL, NULL);
    CU_add_test(s, "ie_kq_info / bad types", test_info);
    CU_add_test(s, "dequantize == gguf.quants (fixtures), codes round trip", test_dequant_fixtures);
    CU_add_test(s, "decode -> encode of random blocks", test_codes_roundtrip);
    CU_add_test(s, "Q8_K == ggml's rule restated, every ISA", test_q8_k);
    CU_add_test(s, "ROWS ref matmuls vs double dot, every ISA table", test_matmul_rows);
    CU_add_test(s, "ie_quant_find_nonfinite, every block type", test_find_nonfinite);
    CU_add_test(s, "Q5_0/Q5_1 quantize == gguf.quants (fixtures)", test_quantize_q5_exact);
    CU_add_test(s, "quantize -> dequantize within the stated bounds", test_quantize_bounds);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

/* test_kernels.c — every compiled ISA against the scalar reference.
 *
 * Tolerances (stated once, used below):
 *   matmul, float weights: |y - y_ref| <= 1e-5 * sum_k |w_k * x_k|
 *       (y_ref accumulates in double; the SIMD kernels' f32 lanes add at most
 *       a few dozen roundings of 2^-24 each). BF16 weights take BF16
 *       activations (the oracle multiplies the two bf16 rows exactly); the
 *       vdpbf16ps lanes round twice per pair of products, still well inside.
 *   act_quantize BF16: bit-for-bit ie_f32_to_bf16 on every ISA, including
 *       denormals (which vcvtne2ps2bf16 would flush), inf and NaN.
 *   matmul, block weights: |y - y_ref| <= 1e-5 * sum_b |d_w*d_a| sum_j |q_w*q_a|
 *       (+|m_w*s_a|): integer partial sums must be exact, only their f32
 *       scaling and accumulation may round (the kernels, like ggml's, convert
 *       per-lane partial sums of 4-8 products to f32, so the rounding scales
 *       with sum |q_w*q_a|); test_matmul_integer_exact checks exactness
 *       directly (scales 1.0 make every result an exact integer < 2^24, so
 *       SIMD must equal the reference bit-for-bit).
 *   act_quantize Q8_0/Q8_1: bit-for-bit equal to the reference (SIMD uses
 *       the same f32 operations and roundf's ties-away rounding).
 *   quantize -> dequantize: per element, q8: 0.5*d + 127*d*2^-11 (f16 scale);
 *       q4_0: |d| (one step, the clipped end) + 2^-10*8|d|; q4_1:
 *       0.5*d + 2^-10*(|min| + 16*d); f16: 2^-11 relative; bf16: 2^-8 relative;
 *       mxfp4 (s = 2^(e-127), the E2M1 unit, amax/s in [4, 8)): half the
 *       grid spacing at |x| (0.25s below 2s, 0.5s below 4s, s up to 6s), and
 *       |x| - 6s above 6s (saturation), + 1e-6*amax.
 *   mxfp4 dequantize: bit-exact against E2M1(code) * 2^(e-127) computed
 *       from the code's bits in double (inf where f32 overflows).
 *   softmax / rmsnorm / swiglu: 2e-6 relative to double-precision formulas
 *       (softmax: plus |x - max|*2^-24, the f32 rounding of x - max).
 *   rope: 1e-6 absolute vs the direct formula with the documented f32 angles;
 *       pos*2^-22 absolute vs angles in double; rope_apply == rope bit-for-bit.
 */
#include "ie_kernels.h"
#include "../../kernels/src/ie_kernels_isa.h"
#include "ie_test_rng.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------- helpers */


static int n_isas(ie_isa_t *isas)
{
    int n = 0;
    for (int i = IE_ISA_REF; i <= IE_ISA_AVX512; i++)
        if (ie_kernels_get((ie_isa_t)i)) isas[n++] = (ie_isa_t)i;
    return n;
}

static const ie_dtype_t WTYPES[] = {IE_DTYPE_F32,  IE_DTYPE_F16,  IE_DTYPE_BF16, IE_DTYPE_Q8_0,
                                    IE_DTYPE_Q4_0, IE_DTYPE_Q4_1, IE_DTYPE_MXFP4};

static int is_block(ie_dtype_t t) { return ie_dtype_block_elems(t) == IE_QK; }

/* Scale of the result for the tolerance: sum of |terms| of the exact product
 * (for block types sum_b |d_w*d_a| * sum_j |q_w*q_a| (+ |m_w*s_a|): kernels
 * convert partial integer sums of a few elements to f32, like ggml's, so
 * their rounding scales with the partial sums, not with the block total). */
static double term_scale(ie_dtype_t wt, const void *wrow, const void *arow, int64_t n_in)
{
    double s = 0.0;
    if (!is_block(wt)) { /* f32 activations, or bf16 ones for bf16 weights */
        float *wf = malloc((size_t)n_in * sizeof(float)), *af = malloc((size_t)n_in * sizeof(float));
        ie_dequantize_row(wt, wrow, wf, n_in);
        ie_dequantize_row(ie_matmul_act_dtype(wt), arow, af, n_in);
        for (int64_t k = 0; k < n_in; k++) s += fabs((double)wf[k] * af[k]);
        free(wf);
        free(af);
        return s;
    }
    for (int64_t b = 0; b < n_in / IE_QK; b++) {
        double dw, da, m = 0, sa = 0;
        int64_t sumi = 0;
        const int8_t *qa;
        if (wt == IE_DTYPE_Q4_1) {
            const ie_block_q8_1_t *ab = (const ie_block_q8_1_t *)arow + b;
            da = ie_f16_to_f32(ab->d);
            sa = ie_f16_to_f32(ab->s);
            qa = ab->q;
        } else {
            const ie_block_q8_0_t *ab = (const ie_block_q8_0_t *)arow + b;
            da = ie_f16_to_f32(ab->d);
            qa = ab->q;
        }
        if (wt == IE_DTYPE_Q8_0) {
            const ie_block_q8_0_t *wb = (const ie_block_q8_0_t *)wrow + b;
            dw = ie_f16_to_f32(wb->d);
            for (int j = 0; j < 32; j++) sumi += abs(wb->q[j] * qa[j]);
        } else if (wt == IE_DTYPE_Q4_0) {
            const ie_block_q4_0_t *wb = (const ie_block_q4_0_t *)wrow + b;
            dw = ie_f16_to_f32(wb->d);
            for (int j = 0; j < 16; j++)
                sumi += abs(((wb->qs[j] & 15) - 8) * qa[j]) + abs(((wb->qs[j] >> 4) - 8) * qa[j + 16]);
        } else if (wt == IE_DTYPE_MXFP4) {
            const ie_block_mxfp4_t *wb = (const ie_block_mxfp4_t *)wrow + b;
            dw = ldexp(1.0, wb->e - 128);
            for (int j = 0; j < 16; j++)
                sumi += abs(ie_mxfp4_kvalues[wb->qs[j] & 15] * qa[j]) +
                        abs(ie_mxfp4_kvalues[wb->qs[j] >> 4] * qa[j + 16]);
        } else {
            const ie_block_q4_1_t *wb = (const ie_block_q4_1_t *)wrow + b;
            dw = ie_f16_to_f32(wb->d);
            m = ie_f16_to_f32(wb->m);
            for (int j = 0; j < 16; j++) sumi += abs((wb->qs[j] & 15) * qa[j]) + abs((wb->qs[j] >> 4) * qa[j + 16]);
        }
        s += fabs(dw * da * (double)sumi) + fabs(m * sa);
    }
    return s;
}

/* ------------------------------------------------------------- matmul */

/* Activation rows as_ bytes apart (0: a row + 12, larger than a row and not
 * a multiple of 64). */
static int check_matmul_case_as(ie_isa_t isa, ie_dtype_t wt, int64_t n_in, int64_t n_out, int64_t n_tok, int64_t r0,
                                uint64_t seed, size_t as_)
{
    const ie_kernels_t *ops = ie_kernels_get(isa);
    const ie_dtype_t at = ie_matmul_act_dtype(wt);
    const size_t wb = ie_dtype_row_bytes(wt, n_in);
    const size_t abytes = ie_dtype_row_bytes(at, n_in);
    const size_t as = as_ ? as_ : abytes + 12;
    const int64_t ldy = n_out + 5;
    rng_seed(seed);
    float *xf = malloc((size_t)n_in * sizeof(float));
    uint8_t *w = malloc(wb * (size_t)n_out);
    uint8_t *a = malloc(as * (size_t)n_tok);
    float *y = malloc(sizeof(float) * (size_t)(ldy * n_tok));
    float *yr = malloc(sizeof(float) * (size_t)(ldy * n_tok));
    for (int64_t r = 0; r < n_out; r++) {
        rng_fill(xf, n_in);
        CU_ASSERT_EQUAL_FATAL(ie_quantize_row(wt, xf, w + (size_t)r * wb, n_in), 0);
    }
    for (int64_t t = 0; t < n_tok; t++) {
        rng_fill(xf, n_in);
        ie_act_quantize_ref(at, xf, a + (size_t)t * as, n_in);
    }
    for (int64_t i = 0; i < ldy * n_tok; i++) y[i] = yr[i] = -12345.0f; /* sentinel */
    CU_ASSERT_EQUAL(ie_kernels_matmul(ie_kernels_get(IE_ISA_REF), wt, w, n_in, r0, n_out, a, as, n_tok, yr, ldy),
                    0);
    CU_ASSERT_EQUAL(ie_kernels_matmul(ops, wt, w, n_in, r0, n_out, a, as, n_tok, y, ldy), 0);
    int bad = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        for (int64_t r = 0; r < ldy; r++) {
            const float v = y[t * ldy + r], vr = yr[t * ldy + r];
            if (r < r0 || r >= n_out) { /* must be untouched */
                if (v != -12345.0f) bad++;
                continue;
            }
            const double tol = 1e-5 * term_scale(wt, w + (size_t)r * wb, a + (size_t)t * as, n_in) + 1e-30;
            if (!(fabs((double)v - vr) <= tol)) {
                if (bad < 5)
                    printf(
                        "\n  %s %s n_in=%lld n_out=%lld n_tok=%lld r0=%lld: y[%lld][%lld]=%.9g ref=%.9g tol=%.3g",
                        ie_isa_name(isa), ie_dtype_name(wt), (long long)n_in, (long long)n_out, (long long)n_tok,
                        (long long)r0, (long long)t, (long long)r, v, vr, tol);
                bad++;
            }
        }
    }
    free(xf);
    free(w);
    free(a);
    free(y);
    free(yr);
    return bad;
}

static int check_matmul_case(ie_isa_t isa, ie_dtype_t wt, int64_t n_in, int64_t n_out, int64_t n_tok, int64_t r0,
                             uint64_t seed)
{
    return check_matmul_case_as(isa, wt, n_in, n_out, n_tok, r0, seed, 0);
}

static void test_matmul_vs_ref(void)
{
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    static const int64_t nin_blk[] = {32, 64, 96, 576, 1536, 2080};
    static const int64_t nin_flt[] = {1, 3, 17, 31, 33, 64, 100, 576};
    static const int64_t nouts[] = {1, 3, 7, 33};
    static const int64_t ntoks[] = {1, 2, 3, 4, 5, 7, 9, 17};
    int cases = 0, bad_cases = 0;
    for (int i = 0; i < ni; i++) {
        for (size_t wi = 0; wi < sizeof WTYPES / sizeof WTYPES[0]; wi++) {
            const ie_dtype_t wt = WTYPES[wi];
            const int64_t *nins = is_block(wt) ? nin_blk : nin_flt;
            const size_t nn = is_block(wt) ? 6 : 8;
            for (size_t a = 0; a < nn; a++)
                for (size_t b = 0; b < 4; b++)
                    for (size_t c = 0; c < 8; c++) {
                        const int64_t n_out = nouts[b];
                        /* alternate full ranges and subranges starting past 0 */
                        const int64_t r0 = (c % 2 == 1 && n_out > 1) ? 1 + n_out / 3 : 0;
                        const uint64_t seed = 1000003u * (wi + 1) + 7919u * a + 131u * b + c;
                        int bad = check_matmul_case(isas[i], wt, nins[a], n_out, ntoks[c], r0, seed);
                        cases++;
                        if (bad) bad_cases++;
                        CU_ASSERT_EQUAL(bad, 0);
                    }
        }
    }
    printf("\n  matmul: %d cases over %d ISA(s), %d failing ", cases, ni, bad_cases);
}

/* A large shape that crosses the AVX-512 k-chunk (256 blocks) and the row
 * panel logic: n_in = 8320 (260 blocks), 70 rows, 13 tokens. */
static void test_matmul_large(void)
{
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    for (int i = 1; i < ni; i++)
        for (size_t wi = 0; wi < sizeof WTYPES / sizeof WTYPES[0]; wi++) {
            CU_ASSERT_EQUAL(check_matmul_case(isas[i], WTYPES[wi], 8320, 70, 13, 3, 77 + wi), 0);
            CU_ASSERT_EQUAL(check_matmul_case(isas[i], WTYPES[wi], 8320, 9, 1, 0, 99 + wi), 0);
        }
}

/* BF16 prefill shapes (n_tok >= 48: on AVX-512 with AVX512_BF16, the
 * repacked-panel path): odd and short n_in (the last pair half empty),
 * row counts and starts that are not multiples of 16 or 32, token counts
 * that split into uneven blocks, activation strides that are multiples of
 * 2048 (copied activations) or not, several row panels (n_in 2051: 128 rows
 * a panel), a row too long to copy (8200) and one too long to repack
 * (16500, the tiles of the decode path). */
static void test_matmul_bf16_prefill(void)
{
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    static const struct {
        int64_t n_in, n_out, n_tok, r0;
    } cs[] = {{1, 17, 48, 0},     {3, 45, 61, 3},    {31, 1, 48, 0},    {33, 17, 53, 1},
              {77, 45, 49, 0},    {64, 32, 60, 0},   {2051, 45, 50, 7}, {2048, 64, 61, 0},
              {2051, 300, 61, 5}, {8200, 33, 48, 2}, {16500, 3, 48, 0}};
    int bad = 0;
    for (int i = 0; i < ni; i++)
        for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++)
            for (int s2048 = 0; s2048 < 2; s2048++) {
                const size_t row = ie_dtype_row_bytes(IE_DTYPE_BF16, cs[c].n_in);
                const size_t as = s2048 ? (row + 2047) / 2048 * 2048 : 0;
                const int b = check_matmul_case_as(isas[i], IE_DTYPE_BF16, cs[c].n_in, cs[c].n_out, cs[c].n_tok,
                                                   cs[c].r0, 4242 + 17 * c + (uint64_t)s2048, as);
                if (b) printf("\n  bf16 prefill case %zu (stride %zu) failed", c, as);
                bad += b;
            }
    CU_ASSERT_EQUAL(bad, 0);
}

/* Weights and activations that end exactly at an inaccessible page: no
 * kernel may read past the last byte of either (masked tails, group loads). */
static void test_matmul_guard_page(void)
{
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), span = 16 * pg;
    uint8_t *wreg = mmap(NULL, span + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *areg = mmap(NULL, span + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CU_ASSERT_FATAL(wreg != MAP_FAILED && areg != MAP_FAILED);
    CU_ASSERT_FATAL(mprotect(wreg + span, pg, PROT_NONE) == 0 && mprotect(areg + span, pg, PROT_NONE) == 0);
    static const int64_t nin_blk[] = {32, 64, 96, 160}, nin_flt[] = {1, 3, 17, 33};
    float xf[160], y[5 * 9], yr[5 * 9];
    int bad = 0;
    for (size_t wi = 0; wi < sizeof WTYPES / sizeof WTYPES[0]; wi++)
        for (int c = 0; c < 4; c++)
            for (int64_t n_tok = 1; n_tok <= 5; n_tok += 2) {
                const ie_dtype_t wt = WTYPES[wi], at = ie_matmul_act_dtype(wt);
                const int64_t n_in = is_block(wt) ? nin_blk[c] : nin_flt[c], n_out = 9;
                const size_t wb = ie_dtype_row_bytes(wt, n_in), as = ie_dtype_row_bytes(at, n_in);
                uint8_t *w = wreg + span - wb * (size_t)n_out, *a = areg + span - as * (size_t)n_tok;
                rng_seed(5150 + wi * 16 + (uint64_t)c);
                for (int64_t r = 0; r < n_out; r++) {
                    rng_fill(xf, n_in);
                    ie_quantize_row(wt, xf, w + r * wb, n_in);
                }
                for (int64_t t = 0; t < n_tok; t++) {
                    rng_fill(xf, n_in);
                    ie_act_quantize_ref(at, xf, a + t * as, n_in);
                }
                ie_kernels_matmul(ie_kernels_get(IE_ISA_REF), wt, w, n_in, 0, n_out, a, as, n_tok, yr, n_out);
                for (int i = 0; i < ni; i++) {
                    ie_kernels_matmul(ie_kernels_get(isas[i]), wt, w, n_in, 0, n_out, a, as, n_tok, y, n_out);
                    for (int64_t k = 0; k < n_out * n_tok; k++)
                        if (!(fabsf(y[k] - yr[k]) <= 1e-4f * fabsf(yr[k]) + 1e-3f)) bad++;
                }
            }
    CU_ASSERT_EQUAL(bad, 0); /* reaching here at all means no fault */
    munmap(wreg, span + pg);
    munmap(areg, span + pg);
}

/* Block scales of 1.0 (and integer m, s for Q4_1): every block product and
 * every partial sum is an integer below 2^24, so any rounding-free kernel
 * must reproduce the exact integer, bit for bit. */
static void test_matmul_integer_exact(void)
{
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    const ie_f16_t one = ie_f32_to_f16(1.0f);
    static const ie_dtype_t bt[] = {IE_DTYPE_Q8_0, IE_DTYPE_Q4_0, IE_DTYPE_Q4_1, IE_DTYPE_MXFP4};
    static const int64_t nins[] = {32, 96, 160, 2080, 8320};
    for (size_t ti = 0; ti < sizeof bt / sizeof bt[0]; ti++) {
        for (size_t ni_ = 0; ni_ < 5; ni_++) {
            const ie_dtype_t wt = bt[ti];
            const int64_t n_in = nins[ni_], nb = n_in / 32, n_out = 6, n_tok = 5;
            const size_t wb = ie_dtype_row_bytes(wt, n_in);
            const size_t as = ie_dtype_row_bytes(ie_matmul_act_dtype(wt), n_in);
            uint8_t *w = calloc(wb, (size_t)n_out), *a = calloc(as, (size_t)n_tok);
            double *exact = calloc((size_t)(n_out * n_tok), sizeof(double));
            float *y = malloc(sizeof(float) * (size_t)(n_out * n_tok));
            rng_seed(4242 + ti * 10 + ni_);
            const int qmax = wt == IE_DTYPE_Q8_0 ? 64 : 60; /* keeps |sums| < 2^24, |s| <= 2048 */
            for (int64_t t = 0; t < n_tok; t++)
                for (int64_t b = 0; b < nb; b++) {
                    int8_t *q;
                    if (wt == IE_DTYPE_Q4_1) {
                        ie_block_q8_1_t *blk = (ie_block_q8_1_t *)(a + t * as) + b;
                        blk->d = one;
                        q = blk->q;
                    } else {
                        ie_block_q8_0_t *blk = (ie_block_q8_0_t *)(a + t * as) + b;
                        blk->d = one;
                        q = blk->q;
                    }
                    int s = 0;
                    for (int j = 0; j < 32; j++) {
                        q[j] = (int8_t)((int)(rng_u32() % (2 * qmax + 1)) - qmax);
                        s += q[j];
                    }
                    if (wt == IE_DTYPE_Q4_1) ((ie_block_q8_1_t *)(a + t * as) + b)->s = ie_f32_to_f16((float)s);
                }
            for (int64_t r = 0; r < n_out; r++)
                for (int64_t b = 0; b < nb; b++) {
                    if (wt == IE_DTYPE_Q8_0) {
                        ie_block_q8_0_t *blk = (ie_block_q8_0_t *)(w + r * wb) + b;
                        blk->d = one;
                        for (int j = 0; j < 32; j++) blk->q[j] = (int8_t)((int)(rng_u32() % 255) - 127);
                    } else if (wt == IE_DTYPE_Q4_0) {
                        ie_block_q4_0_t *blk = (ie_block_q4_0_t *)(w + r * wb) + b;
                        blk->d = one;
                        for (int j = 0; j < 16; j++) blk->qs[j] = (uint8_t)rng_u32();
                    } else if (wt == IE_DTYPE_MXFP4) {
                        ie_block_mxfp4_t *blk = (ie_block_mxfp4_t *)(w + r * wb) + b;
                        blk->e = 128; /* 2^(e-128) = 1: elements are the integers 2*E2M1 */
                        for (int j = 0; j < 16; j++) blk->qs[j] = (uint8_t)rng_u32();
                    } else {
                        ie_block_q4_1_t *blk = (ie_block_q4_1_t *)(w + r * wb) + b;
                        blk->d = one;
                        blk->m = ie_f32_to_f16((float)((int)(rng_u32() % 9) - 4));
                        for (int j = 0; j < 16; j++) blk->qs[j] = (uint8_t)rng_u32();
                    }
                }
            /* exact integer results, from the dequantized rows */
            float *wf = malloc((size_t)n_in * sizeof(float)), *af = malloc((size_t)n_in * sizeof(float));
            for (int64_t t = 0; t < n_tok; t++) {
                ie_dequantize_row(ie_matmul_act_dtype(wt), a + t * as, af, n_in);
                for (int64_t r = 0; r < n_out; r++) {
                    ie_dequantize_row(wt, w + r * wb, wf, n_in);
                    double s = 0;
                    for (int64_t k = 0; k < n_in; k++) s += (double)wf[k] * af[k];
                    exact[t * n_out + r] = s;
                }
            }
            CU_ASSERT(fabs(exact[0]) < 16777216.0);
            for (int i = 0; i < ni; i++) {
                memset(y, 0, sizeof(float) * (size_t)(n_out * n_tok));
                ie_kernels_matmul(ie_kernels_get(isas[i]), wt, w, n_in, 0, n_out, a, as, n_tok, y, n_out);
                int bad = 0;
                for (int64_t k = 0; k < n_out * n_tok; k++)
                    if ((double)y[k] != exact[k]) {
                        if (!bad)
                            printf("\n  %s %s n_in=%lld: y[%lld]=%.1f exact=%.1f", ie_isa_name(isas[i]),
                                   ie_dtype_name(wt), (long long)n_in, (long long)k, y[k], exact[k]);
                        bad++;
                    }
                CU_ASSERT_EQUAL(bad, 0);
            }
            free(w);
            free(a);
            free(exact);
            free(y);
            free(wf);
            free(af);
        }
    }
}

/* ------------------------------------------------------------- mxfp4 */

/* E2M1 from the code's bits, independently of ie_mxfp4_kvalues: sign bit 3,
 * exponent bits 2-1 (bias 1), mantissa bit 0; exponent 0 is subnormal. */
static double e2m1_value(int code)
{
    const int sgn = (code >> 3) & 1, ex = (code >> 1) & 3, m = code & 1;
    const double mag = ex == 0 ? 0.5 * m : (1.0 + 0.5 * m) * ldexp(1.0, ex - 1);
    return sgn ? -mag : mag;
}

static int same_float(float a, float b) { return a == b || (isnan(a) && isnan(b)); }

/* Every byte value in both nibble positions, at scales across the whole
 * exponent range (0 and 255 included), against the direct formula; then
 * ggml's quantizer rule on crafted values; then matmul at the extreme
 * exponents on every ISA. */
static void test_mxfp4_values(void)
{
    CU_ASSERT_STRING_EQUAL(ie_dtype_name(IE_DTYPE_MXFP4), "mxfp4");
    CU_ASSERT_EQUAL(ie_dtype_block_elems(IE_DTYPE_MXFP4), 32);
    CU_ASSERT_EQUAL(ie_dtype_block_bytes(IE_DTYPE_MXFP4), 17);
    CU_ASSERT_EQUAL(ie_dtype_row_bytes(IE_DTYPE_MXFP4, 2880), 90 * 17);
    CU_ASSERT_EQUAL(ie_dtype_row_bytes(IE_DTYPE_MXFP4, 33), 0);
    for (int c = 0; c < 16; c++) CU_ASSERT_EQUAL((double)ie_mxfp4_kvalues[c], 2.0 * e2m1_value(c));

    static const int es[] = {0, 1, 2, 3, 100, 126, 127, 128, 129, 200, 253, 254, 255};
    ie_block_mxfp4_t blk[16];
    float y[16 * 32];
    int bad = 0;
    for (size_t ei = 0; ei < sizeof es / sizeof es[0]; ei++) {
        for (int b = 0; b < 16; b++) {
            blk[b].e = (uint8_t)es[ei];
            for (int j = 0; j < 16; j++) blk[b].qs[j] = (uint8_t)(16 * b + j); /* all 256 bytes */
        }
        ie_dequantize_row(IE_DTYPE_MXFP4, blk, y, 16 * 32);
        for (int b = 0; b < 16; b++)
            for (int j = 0; j < 16; j++) {
                const uint8_t byte = (uint8_t)(16 * b + j);
                const float lo = (float)(e2m1_value(byte & 15) * ldexp(1.0, es[ei] - 127));
                const float hi = (float)(e2m1_value(byte >> 4) * ldexp(1.0, es[ei] - 127));
                if (!same_float(y[b * 32 + j], lo) || !same_float(y[b * 32 + j + 16], hi)) {
                    if (bad < 3)
                        printf("\n  mxfp4 e=%d byte 0x%02x: %g %g vs %g %g", es[ei], byte, y[b * 32 + j],
                               y[b * 32 + j + 16], lo, hi);
                    bad++;
                }
                if (isnan(y[b * 32 + j]) || isnan(y[b * 32 + j + 16])) bad++; /* never NaN */
                if ((byte & 15) == 8 && signbit(y[b * 32 + j])) bad++;        /* -0 code -> +0 */
            }
    }
    CU_ASSERT_EQUAL(bad, 0);
    /* the edges, spelled out: e = 0 -> 2^-128 per table unit (subnormal),
     * e = 255 -> 2^127 per unit, a plain exponent: 0.5 * 2^128 is finite,
     * 1.0 * 2^128 overflows f32 to inf */
    blk[0].e = 0;
    blk[0].qs[0] = 0x71; /* element 0: code 1 (0.5), element 16: code 7 (6.0) */
    ie_dequantize_row(IE_DTYPE_MXFP4, blk, y, 32);
    CU_ASSERT(y[0] == 0x1p-128f && y[16] == 12.0f * 0x1p-128f);
    blk[0].e = 255;
    blk[0].qs[0] = 0xa1; /* code 1 (0.5), code 10 (-1.0) */
    ie_dequantize_row(IE_DTYPE_MXFP4, blk, y, 32);
    CU_ASSERT(y[0] == 0x1p127f && isinf(y[16]) && y[16] < 0);
    CU_ASSERT_EQUAL(ie_e8m0_half_to_f32(0), 0x1p-128f);
    CU_ASSERT_EQUAL(ie_e8m0_half_to_f32(1), 0x1p-127f);
    CU_ASSERT_EQUAL(ie_e8m0_half_to_f32(128), 1.0f);
    CU_ASSERT_EQUAL(ie_e8m0_half_to_f32(255), 0x1p127f);

    /* quantizer: amax 6 -> e = floor(log2 6) + 125 = 127 (unit 1); ties go to
     * the smaller magnitude, above 6 saturates, -tiny -> +0 (code 0) */
    static const struct {
        float x;
        int code;
    } qc[] = {
        {0.0f, 0},   {0.25f, 0}, {0.26f, 1},  {1.25f, 2},  {1.3f, 3},   {2.5f, 4},    {3.5f, 5},
        {5.0f, 6},   {5.1f, 7},  {6.0f, 7},   {-0.25f, 0}, {-0.01f, 0}, {-1.25f, 10}, {-5.0f, 14},
        {-6.0f, 15}, {0.75f, 1}, {-0.75f, 9}, {1.75f, 3},  {2.9f, 5},
    };
    const int nqc = (int)(sizeof qc / sizeof qc[0]);
    float xq[32] = {0};
    for (int j = 0; j < nqc; j++) xq[j] = qc[j].x;
    xq[31] = 7.9f; /* amax 7.9: still unit 1 (floor(log2 7.9) = 2), saturates to 6 */
    ie_block_mxfp4_t qb;
    CU_ASSERT_EQUAL(ie_quantize_row(IE_DTYPE_MXFP4, xq, &qb, 32), 0);
    CU_ASSERT_EQUAL(qb.e, 127);
    for (int j = 0; j < nqc; j++) {
        const int code = j < 16 ? qb.qs[j] & 15 : qb.qs[j - 16] >> 4;
        if (code != qc[j].code) printf("\n  mxfp4 quantize %g: code %d, want %d", qc[j].x, code, qc[j].code);
        CU_ASSERT_EQUAL(code, qc[j].code);
    }
    CU_ASSERT_EQUAL(qb.qs[15] >> 4, 7);
    /* all zero -> e = 0, codes 0; tiny amax clamps e at 0; 2^127 -> e = 252 */
    for (int j = 0; j < 32; j++) xq[j] = 0.0f;
    ie_quantize_row(IE_DTYPE_MXFP4, xq, &qb, 32);
    CU_ASSERT(qb.e == 0 && qb.qs[0] == 0 && qb.qs[15] == 0);
    xq[3] = 1e-40f;
    ie_quantize_row(IE_DTYPE_MXFP4, xq, &qb, 32);
    CU_ASSERT_EQUAL(qb.e, 0);
    xq[3] = 0x1p127f;
    ie_quantize_row(IE_DTYPE_MXFP4, xq, &qb, 32);
    CU_ASSERT(qb.e == 252 && (qb.qs[3] & 15) == 6); /* 2^127 = 4.0 * 2^(252-127) */

    /* matmul at e = 0 and e = 255 (with activations small enough that the
     * result stays finite): every ISA against ref */
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    for (int edge = 0; edge < 2; edge++) {
        const int64_t n_in = 160, n_out = 9, n_tok = 3;
        const size_t wb = ie_dtype_row_bytes(IE_DTYPE_MXFP4, n_in), as = ie_dtype_row_bytes(IE_DTYPE_Q8_0, n_in);
        uint8_t *w = malloc(wb * n_out), *a = malloc(as * n_tok);
        float xf[160], yr[27], yg[27];
        rng_seed(600 + edge);
        for (int64_t r = 0; r < n_out; r++) {
            ie_block_mxfp4_t *bl = (ie_block_mxfp4_t *)(w + r * wb);
            for (int b = 0; b < 5; b++) {
                bl[b].e = edge ? (b % 2 ? 255 : 254) : (b % 2 ? 0 : 1);
                for (int j = 0; j < 16; j++) bl[b].qs[j] = (uint8_t)rng_u32();
            }
        }
        for (int64_t t = 0; t < n_tok; t++) {
            for (int k = 0; k < 160; k++) xf[k] = rng_f() * (edge ? 1e-5f : 1.0f);
            ie_act_quantize_ref(IE_DTYPE_Q8_0, xf, a + t * as, n_in);
        }
        ie_kernels_matmul(ie_kernels_get(IE_ISA_REF), IE_DTYPE_MXFP4, w, n_in, 0, n_out, a, as, n_tok, yr, n_out);
        for (int i = 0; i < ni; i++) {
            ie_kernels_matmul(ie_kernels_get(isas[i]), IE_DTYPE_MXFP4, w, n_in, 0, n_out, a, as, n_tok, yg, n_out);
            for (int k = 0; k < 27; k++) {
                const int t = k / 9, r = k % 9;
                const double tol = 1e-5 * term_scale(IE_DTYPE_MXFP4, w + r * wb, a + t * as, n_in);
                CU_ASSERT(isfinite(yr[k]) && fabs((double)yg[k] - yr[k]) <= tol);
            }
        }
        free(w);
        free(a);
    }
}

static void test_matmul_unsupported(void)
{
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    float y[1];
    uint8_t buf[64] = {0};
    for (int i = 0; i < ni; i++) {
        const ie_kernels_t *ops = ie_kernels_get(isas[i]);
        CU_ASSERT_PTR_NOT_NULL_FATAL(ops);
        CU_ASSERT_EQUAL(ops->isa, isas[i]);
        CU_ASSERT_EQUAL(ie_kernels_matmul(ops, IE_DTYPE_Q8_1, buf, 32, 0, 1, buf, 36, 1, y, 1), IE_ERR_UNSUPPORTED);
        CU_ASSERT_EQUAL(ie_kernels_matmul(ops, IE_DTYPE_INVALID, buf, 32, 0, 1, buf, 36, 1, y, 1),
                        IE_ERR_UNSUPPORTED);
    }
    CU_ASSERT_EQUAL(ie_matmul_act_dtype(IE_DTYPE_F16), IE_DTYPE_F32);
    CU_ASSERT_EQUAL(ie_matmul_act_dtype(IE_DTYPE_BF16), IE_DTYPE_BF16);
    CU_ASSERT_EQUAL(ie_matmul_act_dtype(IE_DTYPE_F32), IE_DTYPE_F32);
    CU_ASSERT_EQUAL(ie_matmul_act_dtype(IE_DTYPE_Q4_0), IE_DTYPE_Q8_0);
    CU_ASSERT_EQUAL(ie_matmul_act_dtype(IE_DTYPE_Q8_0), IE_DTYPE_Q8_0);
    CU_ASSERT_EQUAL(ie_matmul_act_dtype(IE_DTYPE_Q4_1), IE_DTYPE_Q8_1);
    CU_ASSERT_EQUAL(ie_matmul_act_dtype(IE_DTYPE_MXFP4), IE_DTYPE_Q8_0);
}

/* ------------------------------------------------------- act_quantize */

static void test_act_quantize_bitexact(void)
{
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    const int64_t n = 32 * 67;
    float *x = malloc((size_t)n * sizeof(float));
    uint8_t *ref = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
    for (int round = 0; round < 4; round++) {
        rng_seed(555 + round);
        rng_fill(x, n);
        if (round == 1) {
            /* exact ties: amax 127 makes d = 1, id = 1, so k + 0.5 must round away */
            for (int64_t i = 0; i < n; i++)
                x[i] = (i % 32 == 0) ? 127.0f : (float)((int)(rng_u32() % 253) - 126) + 0.5f;
        }
        if (round == 2)
            for (int64_t i = 64; i < 128; i++) x[i] = 0.0f; /* all-zero blocks */
        if (round == 3)
            for (int64_t i = 0; i < n; i++)
                x[i] *= (i < 320 ? 1e-38f : 1e-30f); /* tiny: f16 d underflows, 1/d overflows */
        for (int at = 0; at < 4; at++) {
            const ie_dtype_t act = at == 0   ? IE_DTYPE_F32
                                   : at == 1 ? IE_DTYPE_Q8_0
                                   : at == 2 ? IE_DTYPE_Q8_1
                                             : IE_DTYPE_BF16;
            const size_t nb = ie_dtype_row_bytes(act, n);
            ie_act_quantize_ref(act, x, ref, n);
            for (int i = 0; i < ni; i++) {
                memset(got, 0xab, nb);
                ie_kernels_get(isas[i])->act_quantize(act, x, got, n);
                const int same = memcmp(ref, got, nb) == 0;
                if (!same)
                    printf("\n  act_quantize %s %s round %d differs", ie_isa_name(isas[i]), ie_dtype_name(act),
                           round);
                CU_ASSERT(same);
            }
        }
    }
    /* ggml's definition, spelled out: d = amax/127, q = roundf(x/d), s = d*sum(q) */
    float xb[32];
    for (int j = 0; j < 32; j++) xb[j] = (float)j - 10.0f;
    ie_block_q8_1_t blk;
    ie_act_quantize_ref(IE_DTYPE_Q8_1, xb, &blk, 32);
    const float d = 21.0f / 127.0f;
    CU_ASSERT_EQUAL(blk.d, ie_f32_to_f16(d));
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        CU_ASSERT_EQUAL(blk.q[j], (int8_t)roundf(xb[j] * (1.0f / d)));
        sum += blk.q[j];
    }
    CU_ASSERT_EQUAL(blk.q[31], 127);
    CU_ASSERT_EQUAL(blk.s, ie_f32_to_f16((float)sum * d));
    free(x);
    free(ref);
    free(got);
}

/* BF16 activations: every ISA equals ie_f32_to_bf16 element by element,
 * bit for bit, on every length 0..70 (vector bodies and tails) and on the
 * special values (ties, denormals, inf, NaN, overflow to inf). */
static void test_act_bf16_bitexact(void)
{
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x80008000u, 0x00018000u,
                                       0x007fffffu, 0x00800000u, 0x3f808000u, 0x3f818000u, 0x3f817fffu,
                                       0x7f7fffffu, 0xff7f8000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                       0xffc00001u, 0x7f800001u, 0xff810000u, 0x7fffffffu, 0x477fe000u};
    const int ns = (int)(sizeof special / sizeof special[0]);
    float x[96];
    ie_bf16_t got[96 + 8];
    int bad = 0;
    for (int n = 0; n <= 70; n++) {
        rng_seed(9000 + (uint64_t)n);
        for (int j = 0; j < n; j++) {
            const uint32_t u = (j % 3 == 0) ? special[rng_u32() % (uint32_t)ns] : rng_u32() * 65537u;
            memcpy(&x[j], &u, sizeof u);
        }
        for (int i = 0; i < ni; i++) {
            for (int j = 0; j < n + 8; j++) got[j] = 0xdead;
            ie_kernels_get(isas[i])->act_quantize(IE_DTYPE_BF16, x, got, n);
            for (int j = 0; j < n; j++)
                if (got[j] != ie_f32_to_bf16(x[j])) {
                    uint32_t u;
                    memcpy(&u, &x[j], sizeof u);
                    if (bad < 5)
                        printf("\n  %s bf16 act n=%d x=%08x: %04x, want %04x", ie_isa_name(isas[i]), n, u, got[j],
                               ie_f32_to_bf16(x[j]));
                    bad++;
                }
            for (int j = n; j < n + 8; j++) bad += got[j] != 0xdead; /* nothing written past n */
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* The AVX-512 bf16 x bf16 matmul without vdpbf16ps (CPUs lacking
 * AVX512_BF16 widen both operands and use FMA), on the odd sizes of
 * test_matmul_vs_ref; skipped where AVX-512 is not available. */
static void test_matmul_bf16_no_dpbf16(void)
{
    if (!ie_kernels_get(IE_ISA_AVX512)) return;
    const int had = ie_avx512_use_dpbf16(1);
    ie_avx512_use_dpbf16(0);
    static const int64_t nins[] = {1, 3, 17, 31, 33, 64, 100, 576, 8320};
    int bad = 0;
    for (size_t a = 0; a < sizeof nins / sizeof nins[0]; a++)
        for (int64_t n_tok = 1; n_tok <= 13; n_tok += 4)
            bad += check_matmul_case(IE_ISA_AVX512, IE_DTYPE_BF16, nins[a], 11, n_tok, a % 2, 31337 + a);
    ie_avx512_use_dpbf16(had);
    CU_ASSERT_EQUAL(bad, 0);
}

/* ------------------------------------------------ quantize/dequantize */

static void test_quant_roundtrip(void)
{
    const int64_t n = 32 * 40;
    float *x = malloc((size_t)n * sizeof(float)), *x2 = malloc((size_t)n * sizeof(float));
    uint8_t *q = malloc((size_t)n * 4);
    static const ie_dtype_t ts[] = {IE_DTYPE_F32,  IE_DTYPE_F16,  IE_DTYPE_BF16, IE_DTYPE_Q8_0,
                                    IE_DTYPE_Q8_1, IE_DTYPE_Q4_0, IE_DTYPE_Q4_1, IE_DTYPE_MXFP4};
    rng_seed(31337);
    rng_fill(x, n);
    for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
        const ie_dtype_t t = ts[ti];
        CU_ASSERT_EQUAL_FATAL(ie_quantize_row(t, x, q, n), 0);
        ie_dequantize_row(t, q, x2, n);
        int bad = 0;
        for (int64_t b = 0; b < n / 32; b++) {
            float amax = 0, mx = 0, mn = 1e30f, vmax = 0;
            for (int j = 0; j < 32; j++) {
                const float v = x[b * 32 + j];
                if (fabsf(v) > amax) {
                    amax = fabsf(v);
                    vmax = v;
                }
                mx = fmaxf(mx, v);
                mn = fminf(mn, v);
            }
            (void)vmax;
            for (int j = 0; j < 32; j++) {
                const float v = x[b * 32 + j], e = fabsf(v - x2[b * 32 + j]);
                float bound;
                switch (t) {
                case IE_DTYPE_F32: bound = 0; break;
                case IE_DTYPE_F16: bound = fabsf(v) * 0x1p-11f + 0x1p-24f; break;
                case IE_DTYPE_BF16: bound = fabsf(v) * 0x1p-8f; break;
                case IE_DTYPE_Q8_0:
                case IE_DTYPE_Q8_1: {
                    const float d = amax / 127.0f;
                    bound = 0.5f * d + 127.0f * d * 0x1p-11f + 1e-7f * amax;
                    break;
                }
                case IE_DTYPE_Q4_0: {
                    const float d = amax / 8.0f;
                    bound = d + 8.0f * d * 0x1p-10f + 1e-7f * amax;
                    break;
                }
                case IE_DTYPE_MXFP4: {
                    const uint8_t e8 = ((const ie_block_mxfp4_t *)q)[b].e;
                    const float sc = ldexpf(1.0f, e8 - 127), av = fabsf(v);
                    /* the documented exponent rule; amax/s in [4, 8) */
                    if (e8 != (uint8_t)((int)floorf(log2f(amax)) + 125) || amax < 4 * sc || amax >= 8 * sc) bad++;
                    bound = av > 6 * sc ? av - 6 * sc : av < 2 * sc ? 0.25f * sc : av < 4 * sc ? 0.5f * sc : sc;
                    bound += 1e-6f * amax;
                    break;
                }
                default: { /* Q4_1 */
                    const float d = (mx - mn) / 15.0f;
                    bound = 0.5f * d + 0x1p-10f * (fabsf(mn) + 16.0f * d) + 1e-7f * (mx - mn);
                    break;
                }
                }
                if (!(e <= bound)) {
                    if (bad < 3)
                        printf("\n  %s: x=%g back=%g err=%g bound=%g", ie_dtype_name(t), v, x2[b * 32 + j], e,
                               bound);
                    bad++;
                }
            }
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
    CU_ASSERT_EQUAL(ie_quantize_row(IE_DTYPE_Q4_0, x, q, 33), -1);
    CU_ASSERT_EQUAL(ie_quantize_row(IE_DTYPE_INVALID, x, q, 32), -1);
    free(x);
    free(x2);
    free(q);
}

/* f16 / bf16: all 65536 bit patterns. Scalar round trip, and the SIMD
 * widening (through a 65536 x 1 matmul with x = 1, in the activation format
 * of the type) equals the scalar one; except that vdpbf16ps (AVX-512 with
 * AVX512_BF16) reads bf16 subnormals as zero, as documented there. */
static void test_half_conversions(void)
{
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    uint16_t *h = malloc(65536 * 2);
    float *y = malloc(65536 * sizeof(float));
    for (int kind = 0; kind < 2; kind++) {
        const ie_dtype_t t = kind == 0 ? IE_DTYPE_F16 : IE_DTYPE_BF16;
        int bad_rt = 0;
        for (uint32_t i = 0; i < 65536; i++) {
            h[i] = (uint16_t)i;
            const float f = kind == 0 ? ie_f16_to_f32((uint16_t)i) : ie_bf16_to_f32((uint16_t)i);
            const uint16_t back = kind == 0 ? ie_f32_to_f16(f) : ie_f32_to_bf16(f);
            if (isnan(f)) {
                const float f2 = kind == 0 ? ie_f16_to_f32(back) : ie_bf16_to_f32(back);
                if (!isnan(f2)) bad_rt++;
            } else if (back != i) {
                bad_rt++;
            }
        }
        CU_ASSERT_EQUAL(bad_rt, 0);
        const float one = 1.0f;
        float one_act[1];
        ie_act_quantize_ref(ie_matmul_act_dtype(t), &one, one_act, 1);
        for (int i = 0; i < ni; i++) {
            ie_kernels_matmul(ie_kernels_get(isas[i]), t, h, 1, 0, 65536, one_act, sizeof one_act, 1, y, 65536);
            const int daz = t == IE_DTYPE_BF16 && isas[i] == IE_ISA_AVX512 && ie_avx512_use_dpbf16(1);
            int bad = 0;
            for (uint32_t k = 0; k < 65536; k++) {
                float f = kind == 0 ? ie_f16_to_f32((uint16_t)k) : ie_bf16_to_f32((uint16_t)k);
                if (daz && fpclassify(f) == FP_SUBNORMAL) f = 0.0f;
                if (isnan(f) ? !isnan(y[k]) : y[k] != f) {
                    if (bad < 3)
                        printf("\n  %s %s 0x%04x: %g vs %g", ie_isa_name(isas[i]), ie_dtype_name(t), k, y[k], f);
                    bad++;
                }
            }
            CU_ASSERT_EQUAL(bad, 0);
        }
    }
    /* Rounding down: ties to even, overflow, subnormals. */
    CU_ASSERT_EQUAL(ie_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     /* tie -> even */
    CU_ASSERT_EQUAL(ie_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie -> even */
    CU_ASSERT_EQUAL(ie_f32_to_f16(65520.0f), 0x7c00);
    CU_ASSERT_EQUAL(ie_f32_to_f16(65519.0f), 0x7bff);
    CU_ASSERT_EQUAL(ie_f32_to_f16(0x1p-24f), 0x0001);
    CU_ASSERT_EQUAL(ie_f32_to_f16(0x1p-25f), 0x0000);        /* tie -> even (0) */
    CU_ASSERT_EQUAL(ie_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie -> even */
    CU_ASSERT_EQUAL(ie_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    free(h);
    free(y);
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f)
{
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
#endif

/* The scalar f32 -> f16 rounding agrees with the F16C instruction. */
static void test_f16_vs_hardware(void)
{
#if defined(__x86_64__)
    if (!ie_isa_supported(IE_ISA_AVX2)) return;
    int bad = 0;
    rng_seed(9);
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = rng_u32();
        if (i & 1) u = (u & 0x80000000u) | ((0x60u + (u >> 24) % 0x30u) << 23) | (u & 0x7fffffu); /* f16 range */
        float f;
        memcpy(&f, &u, 4);
        if (isnan(f)) continue;
        if (ie_f32_to_f16(f) != hw_f32_to_f16(f)) {
            if (bad < 3) printf("\n  f32->f16 0x%08x: %04x vs hw %04x", u, ie_f32_to_f16(f), hw_f32_to_f16(f));
            bad++;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
#endif
}

/* ---------------------------------------------------- element-wise ops */

static void test_softmax_rmsnorm_swiglu(void)
{
    const int64_t ns[] = {1, 5, 64, 1000};
    for (size_t c = 0; c < 4; c++) {
        const int64_t n = ns[c];
        float *x = malloc((size_t)n * 4), *w = malloc((size_t)n * 4), *o = malloc((size_t)n * 4),
              *u = malloc((size_t)n * 4);
        rng_seed(100 + c);
        for (int64_t i = 0; i < n; i++) {
            x[i] = rng_f() * 20.0f;
            w[i] = rng_f();
            u[i] = rng_f() * 3;
        }
        /* softmax */
        memcpy(o, x, (size_t)n * 4);
        ie_softmax_f32(o, n);
        double mx = -1e300, sum = 0;
        for (int64_t i = 0; i < n; i++) mx = fmax(mx, x[i]);
        for (int64_t i = 0; i < n; i++) sum += exp((double)x[i] - mx);
        for (int64_t i = 0; i < n; i++) {
            const double e = exp((double)x[i] - mx) / sum;
            /* + the f32 rounding of x - max, which exp turns into relative error */
            CU_ASSERT(fabs(o[i] - e) <= (2e-6 + fabs(x[i] - mx) * 0x1p-24) * e + 1e-30);
        }
        /* rmsnorm, also in place */
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
        const double sc = 1.0 / sqrt(ss / n + 1e-5);
        ie_rmsnorm_f32(o, x, w, n, 1e-5f);
        for (int64_t i = 0; i < n; i++) {
            const double e = x[i] * sc * w[i];
            CU_ASSERT(fabs(o[i] - e) <= 2e-6 * fabs(e) + 1e-30);
        }
        memcpy(u, x, (size_t)n * 4);
        ie_rmsnorm_f32(u, u, w, n, 1e-5f);
        CU_ASSERT(memcmp(u, o, (size_t)n * 4) == 0);
        /* swiglu */
        for (int64_t i = 0; i < n; i++) u[i] = rng_f() * 3;
        ie_swiglu_f32(o, x, u, n);
        for (int64_t i = 0; i < n; i++) {
            const double g = x[i], e = g / (1.0 + exp(-g)) * u[i];
            CU_ASSERT(fabs(o[i] - e) <= 2e-6 * fabs(e) + 1e-30);
        }
        /* dot, axpy */
        double dd = 0, sa = 0;
        for (int64_t i = 0; i < n; i++) {
            dd += (double)x[i] * w[i];
            sa += fabs((double)x[i] * w[i]);
        }
        CU_ASSERT(fabs(ie_dot_f32(x, w, n) - dd) <= 1e-6 * sa + 1e-30);
        memcpy(o, u, (size_t)n * 4);
        ie_axpy_f32(o, 0.75f, x, n);
        for (int64_t i = 0; i < n; i++) CU_ASSERT(o[i] == u[i] + 0.75f * x[i]);
        free(x);
        free(w);
        free(o);
        free(u);
    }
    /* softmax stays finite for large inputs (max subtracted) */
    float big[3] = {1000.0f, 999.0f, -1000.0f};
    ie_softmax_f32(big, 3);
    CU_ASSERT(fabs(big[0] - 1.0 / (1.0 + exp(-1.0))) < 1e-6);
    CU_ASSERT(big[2] == 0.0f);
    float neg = -100.0f, one = 1.0f, o1;
    ie_swiglu_f32(&o1, &neg, &one, 1);
    CU_ASSERT(o1 <= 0.0f && o1 > -1e-40f); /* silu(-100) = -3.7e-42, no NaN */
}

static void test_rope(void)
{
    const int64_t head_dim = 72, pos_list[] = {0, 1, 7, 100, 4095};
    const int64_t rots[] = {72, 32}; /* full and partial rotary */
    const float theta = 10000.0f;
    for (int layout = 0; layout < 2; layout++)
        for (size_t ri = 0; ri < 2; ri++)
            for (size_t pi = 0; pi < 5; pi++) {
                const int64_t rot = rots[ri], pos = pos_list[pi], half = rot / 2;
                float x[72], xr[72], xa[72], ct[64], st[64];
                rng_seed(7 + pi);
                for (int i = 0; i < head_dim; i++) x[i] = rng_f();
                memcpy(xr, x, sizeof x);
                ie_rope_f32(xr, head_dim, rot, pos, theta, (ie_rope_layout_t)layout);
                /* table + apply gives the same bits */
                ie_rope_table_f32(ct, st, rot, pos, theta);
                memcpy(xa, x, sizeof x);
                ie_rope_apply_f32(xa, head_dim, rot, ct, st, (ie_rope_layout_t)layout);
                CU_ASSERT(memcmp(xa, xr, sizeof x) == 0);
                for (int64_t i = 0; i < half; i++) {
                    const int64_t i0 = layout == IE_ROPE_NEOX ? i : 2 * i;
                    const int64_t i1 = layout == IE_ROPE_NEOX ? i + half : 2 * i + 1;
                    /* the documented f32 angle (HF): inv_freq in f32, angle in f32 */
                    const float inv = 1.0f / powf(theta, (float)(2 * i) / (float)rot);
                    const double ang = (double)((float)pos * inv);
                    const double e0 = x[i0] * cos(ang) - x[i1] * sin(ang);
                    const double e1 = x[i1] * cos(ang) + x[i0] * sin(ang);
                    CU_ASSERT(fabs(xr[i0] - e0) <= 1e-6 && fabs(xr[i1] - e1) <= 1e-6);
                    /* the textbook angle in double: differs by the f32 angle rounding only */
                    const double angd = (double)pos * pow((double)theta, -2.0 * (double)i / (double)rot);
                    const double d0 = x[i0] * cos(angd) - x[i1] * sin(angd);
                    CU_ASSERT(fabs(xr[i0] - d0) <= (double)pos * 0x1p-22 + 1e-6);
                }
                for (int64_t i = rot; i < head_dim; i++) CU_ASSERT(xr[i] == x[i]); /* untouched */
            }
}

/* ------------------------------------------------------------ dispatch */

/* Every table has every entry: no NULL where REF has one, for every ISA
 * compiled in (read from the tables themselves, so a CPU without AVX-512
 * still checks its table), and the dense matmul slots filled for exactly
 * the weight types REF has. */
static void test_table_complete(void)
{
    const ie_kernels_t *ref = ie_kernels_table(IE_ISA_REF);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ref);
    CU_ASSERT_PTR_NULL(ie_kernels_table((ie_isa_t)4));
    CU_ASSERT_PTR_NULL(ie_kernels_get((ie_isa_t)4));
    CU_ASSERT_PTR_NULL(ie_kernels_get((ie_isa_t)-1));
    for (int i = IE_ISA_REF; i <= IE_ISA_AMX; i++) {
        const ie_kernels_t *k = ie_kernels_table((ie_isa_t)i);
        CU_ASSERT_PTR_NOT_NULL_FATAL(k);
        CU_ASSERT_EQUAL(k->isa, (ie_isa_t)i);
        if (ie_isa_supported((ie_isa_t)i)) CU_ASSERT_PTR_EQUAL(ie_kernels_get((ie_isa_t)i), k);
#define HAS(f) CU_ASSERT(k->f != NULL && ref->f != NULL)
        HAS(act_quantize);
        HAS(act_quantize_stream);
        HAS(matmul_packed);
        HAS(matmul_packed_ranges);
        HAS(matmul_bsr);
        HAS(dot_f32);
        HAS(axpy_f32);
        HAS(attn_scores);
        HAS(attn_values);
        HAS(swiglu);
        HAS(softmax);
        HAS(rmsnorm);
        HAS(stream_read);
#undef HAS
        for (int t = 0; t < IE_MATMUL_SLOTS; t++) CU_ASSERT_EQUAL(k->matmul[t] != NULL, ref->matmul[t] != NULL);
    }
    /* the slots REF fills are the weight types the tests sweep, the
     * k-quants (ROWS references on every ISA, checked by test_kquant) and
     * the i-quants (checked by test_iquant) */
    int filled = 0;
    for (int t = 0; t < IE_MATMUL_SLOTS; t++)
        filled += ref->matmul[t] != NULL && !ie_dtype_is_kquant((ie_dtype_t)t) &&
                  !ie_dtype_is_iquant((ie_dtype_t)t);
    CU_ASSERT_EQUAL(filled, (int)(sizeof WTYPES / sizeof WTYPES[0]));
    for (int t = 0; t < IE_MATMUL_SLOTS; t++)
        if (ie_dtype_is_kquant((ie_dtype_t)t) || ie_dtype_is_iquant((ie_dtype_t)t))
            CU_ASSERT_PTR_NOT_NULL(ref->matmul[t]);
    for (size_t j = 0; j < sizeof WTYPES / sizeof WTYPES[0]; j++) CU_ASSERT_PTR_NOT_NULL(ref->matmul[WTYPES[j]]);
}

/* A packed matmul that fails on its second range (ie_packed_ranges_by_calls
 * must hand that status back and run no range after it). */
static int g_fake_calls;
static ie_status_t fake_packed(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                               int64_t n_tok, float *y, int64_t ldy)
{
    (void)m, (void)a, (void)a_stride, (void)n_tok, (void)ldy;
    if (++g_fake_calls == 2) return IE_ERR_UNSUPPORTED;
    for (int64_t r = r0; r < r1; r++) y[r] = 1.0f;
    return IE_OK;
}

typedef struct {
    int64_t r[4][2];
    int n, at;
} ranges_t;
static int ranges_next(void *ctx, int64_t *p0, int64_t *p1)
{
    ranges_t *s = ctx;
    if (s->at == s->n) return 0;
    *p0 = s->r[s->at][0];
    *p1 = s->r[s->at][1];
    s->at++;
    return 1;
}

/* A kernel that cannot do what it is asked says so with a status, on every
 * ISA, and writes nothing. */
static void test_kernel_status(void)
{
    const float SENTINEL = -12345.0f;
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    uint8_t buf[256] = {0};
    float y[64];
    for (int i = 0; i < ni; i++) {
        const ie_kernels_t *k = ie_kernels_get(isas[i]);
        for (int j = 0; j < 64; j++) y[j] = SENTINEL;
        /* dense matmul of a type with no dense kernel: the packed types, an
         * activation-only type, nonsense */
        const ie_dtype_t none[] = {IE_DTYPE_I8W,   IE_DTYPE_I4W,     IE_DTYPE_Q8_1,
                                   IE_DTYPE_Q16_P, IE_DTYPE_INVALID, (ie_dtype_t)1000};
        for (size_t j = 0; j < sizeof none / sizeof none[0]; j++)
            CU_ASSERT_EQUAL(ie_kernels_matmul(k, none[j], buf, 32, 0, 1, buf, 36, 1, y, 1), IE_ERR_UNSUPPORTED);
        /* a supported type with nothing to do succeeds */
        CU_ASSERT_EQUAL(ie_kernels_matmul(k, IE_DTYPE_Q8_0, buf, 32, 1, 1, buf, 34, 1, y, 1), IE_OK);
        CU_ASSERT_EQUAL(ie_kernels_matmul(k, IE_DTYPE_F32, buf, 8, 0, 1, buf, 32, 0, y, 1), IE_OK);
        /* packed: a matrix ie_pack_check refuses, a range off the panels */
        const ie_pmat_t bad = {IE_DTYPE_I4W, 48, 64, 16, buf};
        CU_ASSERT_EQUAL(k->matmul_packed(&bad, 0, 16, buf, 80, 1, y, 16), IE_ERR_INVAL);
        CU_ASSERT_EQUAL(k->matmul_packed(NULL, 0, 16, buf, 80, 1, y, 16), IE_ERR_INVAL);
        ranges_t off = {{{5, 6}}, 1, 0}; /* panel 5 of a 1-panel matrix */
        const ie_pmat_t one = {IE_DTYPE_I4W, 32, 64, 16, buf};
        CU_ASSERT_EQUAL(k->matmul_packed_ranges(&one, ranges_next, &off, buf, 80, 1, y, 16), IE_ERR_INVAL);
        off.at = 0;
        CU_ASSERT_EQUAL(k->matmul_packed_ranges(&bad, ranges_next, &off, buf, 80, 1, y, 16), IE_ERR_INVAL);
        int touched = 0;
        for (int j = 0; j < 64; j++) touched += y[j] != SENTINEL;
        CU_ASSERT_EQUAL(touched, 0);
    }
    /* the per-range driver stops at the first failing range with its status */
    const ie_pmat_t m = {IE_DTYPE_I4W, 32, 64, 64, buf};
    ranges_t three = {{{0, 1}, {1, 2}, {2, 4}}, 3, 0};
    for (int j = 0; j < 64; j++) y[j] = 0.0f;
    g_fake_calls = 0;
    CU_ASSERT_EQUAL(ie_packed_ranges_by_calls(fake_packed, &m, ranges_next, &three, buf, 80, 1, y, 64),
                    IE_ERR_UNSUPPORTED);
    CU_ASSERT_EQUAL(g_fake_calls, 2);
    CU_ASSERT_EQUAL(y[0], 1.0f);  /* the range before it ran */
    CU_ASSERT_EQUAL(y[32], 0.0f); /* the one after it did not */
}


static void test_dispatch(void)
{
    CU_ASSERT(ie_isa_supported(IE_ISA_REF));
    CU_ASSERT_PTR_NOT_NULL(ie_kernels_get(IE_ISA_REF));
    CU_ASSERT_STRING_EQUAL(ie_isa_name(IE_ISA_AVX512), "avx512");
    const char *old = getenv("IE_ISA");
    char *saved = old ? strdup(old) : NULL;
    unsetenv("IE_ISA");
    const ie_isa_t best = ie_isa_best();
    CU_ASSERT(ie_isa_supported(best));
    if (ie_isa_supported(IE_ISA_AMX)) {
        CU_ASSERT_EQUAL(best, IE_ISA_AMX);
    } else if (ie_isa_supported(IE_ISA_AVX512)) {
        CU_ASSERT_EQUAL(best, IE_ISA_AVX512);
    }
    setenv("IE_ISA", "ref", 1);
    CU_ASSERT_EQUAL(ie_isa_best(), IE_ISA_REF);
    setenv("IE_ISA", "avx2", 1);
    CU_ASSERT_EQUAL(ie_isa_best(), ie_isa_supported(IE_ISA_AVX2) ? IE_ISA_AVX2 : IE_ISA_REF);
    setenv("IE_ISA", "avx512", 1);
    CU_ASSERT_EQUAL(ie_isa_best(), best < IE_ISA_AVX512 ? best : IE_ISA_AVX512);
    if (saved) {
        setenv("IE_ISA", saved, 1);
        free(saved);
    } else unsetenv("IE_ISA");
    printf("\n  best ISA: %s (avx2 %s, avx512 %s) ", ie_isa_name(best),
           ie_isa_supported(IE_ISA_AVX2) ? "yes" : "no", ie_isa_supported(IE_ISA_AVX512) ? "yes" : "no");
}

/* Each ISA's dot/axpy against ref on every length 1..130 (tails of every
 * width) and at attention's head sizes: within 1e-6 of sum|a*b| (only the
 * summation order differs). */
/* ie_argmax_f32 against a scalar "first strict maximum" scan: sizes around
 * the 16-lane blocks, few distinct values (ties across lanes and blocks),
 * NaN, -inf and +inf sprinkled in, nothing usable, n = 0. */
static void test_argmax(void)
{
    static const int sizes[] = {0, 1, 2, 3, 15, 16, 17, 31, 32, 33, 47, 64, 65, 100, 24576, 49157};
    float *x = malloc(sizeof(float) * 49157);
    int bad = 0, ran = 0;
    rng_seed(77);
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
        for (int trial = 0; trial < 40; trial++) {
            const int n = sizes[z];
            for (int i = 0; i < n; i++) {
                const uint32_t r = rng_u32();
                x[i] = (float)(r % 7) - 3.0f;
                if (trial % 3 == 1 && r % 11 == 0) x[i] = NAN;
                if (trial % 3 == 2 && r % 13 == 0) x[i] = -INFINITY;
                if (trial % 20 == 19 && r % 97 == 0) x[i] = INFINITY;
                if (trial == 5) x[i] = i % 2 ? NAN : -INFINITY; /* nothing usable */
            }
            int64_t want = -1;
            float best = -INFINITY;
            for (int i = 0; i < n; i++)
                if (x[i] > best) best = x[i], want = i;
            float got_max = 0.0f;
            const int64_t got = ie_argmax_f32(x, n, &got_max);
            bad += got != want || !(got_max == best);
            ran++;
        }
    free(x);
    CU_ASSERT_EQUAL(ran, 40 * (int)(sizeof sizes / sizeof sizes[0]));
    CU_ASSERT_EQUAL(bad, 0);
    float one = 2.0f;
    CU_ASSERT_EQUAL(ie_argmax_f32(&one, 1, NULL), 0); /* max_out may be NULL */
}

static void test_vec_ops_vs_ref(void)
{
    ie_isa_t isas[3];
    int ni = n_isas(isas);
    float a[200], b[200], y0[200], y1[200];
    rng_seed(77);
    for (int k = 0; k < ni; k++) {
        const ie_kernels_t *ops = ie_kernels_get(isas[k]);
        CU_ASSERT_PTR_NOT_NULL_FATAL(ops);
        for (int n = 0; n <= 130; n++) {
            rng_fill(a, n);
            rng_fill(b, n);
            double mag = 0;
            for (int i = 0; i < n; i++) mag += fabs((double)a[i] * b[i]);
            float r = ie_dot_f32(a, b, n), g = ops->dot_f32(a, b, n);
            CU_ASSERT(fabs((double)r - g) <= 1e-6 * mag + 1e-30);
            float alpha = rng_f();
            for (int i = 0; i < n + 5; i++) y0[i] = y1[i] = rng_f();
            ie_axpy_f32(y0, alpha, a, n);
            ops->axpy_f32(y1, alpha, a, n);
            for (int i = 0; i < n; i++)
                CU_ASSERT(fabsf(y0[i] - y1[i]) <= 1e-6f * (fabsf(y0[i]) + fabsf(alpha * a[i])));
            for (int i = n; i < n + 5; i++) CU_ASSERT(y0[i] == y1[i]); /* nothing past n */
        }
    }
}

/* ie_kernel_scratch: 64-byte aligned, writable to its size, kept while
 * big enough, grown (keeping the alignment) when asked for more, refused
 * for sizes that cannot be had; another thread gets its own. */
static void *scratch_other(void *p)
{
    *(void **)p = ie_kernel_scratch(64);
    return NULL;
}
static void test_kernel_scratch(void)
{
    uint8_t *a = ie_kernel_scratch(1000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_EQUAL((uintptr_t)a % 64, 0);
    memset(a, 1, 1000);
    CU_ASSERT_PTR_EQUAL(ie_kernel_scratch(10), a); /* big enough: the same block */
    uint8_t *b = ie_kernel_scratch(3u << 20);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_EQUAL((uintptr_t)b % 64, 0);
    memset(b, 2, 3u << 20);
    CU_ASSERT_PTR_EQUAL(ie_kernel_scratch(1000), b);
    CU_ASSERT_PTR_NULL(ie_kernel_scratch(SIZE_MAX));
    CU_ASSERT_PTR_EQUAL(ie_kernel_scratch(1), b); /* a refusal keeps the block */
    void *o = NULL;
    pthread_t th;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, scratch_other, &o), 0);
    pthread_join(th, NULL);
    CU_ASSERT_PTR_NOT_NULL(o);
    CU_ASSERT_PTR_NOT_EQUAL(o, b);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("kernels", NULL, NULL);
    CU_add_test(s, "dispatch", test_dispatch);
    CU_add_test(s, "matmul vs ref (all ISAs, types, odd sizes)", test_matmul_vs_ref);
    CU_add_test(s, "matmul large (k-chunks, panels)", test_matmul_large);
    CU_add_test(s, "bf16 matmul, prefill shapes (repacked panels)", test_matmul_bf16_prefill);
    CU_add_test(s, "matmul integer part exact", test_matmul_integer_exact);
    CU_add_test(s, "matmul reads nothing past its inputs", test_matmul_guard_page);
    CU_add_test(s, "matmul unsupported types", test_matmul_unsupported);
    CU_add_test(s, "every ISA's table has every entry REF has", test_table_complete);
    CU_add_test(s, "a kernel that cannot run returns its status", test_kernel_status);
    CU_add_test(s, "act_quantize bit-exact", test_act_quantize_bitexact);
    CU_add_test(s, "bf16 activations bit-exact (all ISAs, specials, tails)", test_act_bf16_bitexact);
    CU_add_test(s, "bf16 x bf16 matmul, AVX-512 without vdpbf16ps", test_matmul_bf16_no_dpbf16);
    CU_add_test(s, "quantize/dequantize bounds", test_quant_roundtrip);
    CU_add_test(s, "mxfp4 values, edges, quantizer rule", test_mxfp4_values);
    CU_add_test(s, "f16/bf16 all 65536 values", test_half_conversions);
    CU_add_test(s, "f32->f16 vs F16C", test_f16_vs_hardware);
    CU_add_test(s, "softmax rmsnorm swiglu dot axpy", test_softmax_rmsnorm_swiglu);
    CU_add_test(s, "rope", test_rope);
    CU_add_test(s, "dot/axpy vs ref (all ISAs, every tail)", test_vec_ops_vs_ref);
    CU_add_test(s, "arg max == a scalar first-maximum scan (odd sizes, NaN, inf)", test_argmax);
    CU_add_test(s, "kernel scratch: aligned, kept, grown, per thread", test_kernel_scratch);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

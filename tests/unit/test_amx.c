/* test_amx.c — the AMX-INT8 GEMM (kernels/x86/amx/amx_gemm_body.h) and the
 * AMX dispatch.
 *
 *   test_amx        the tile emulator against hand-computed tdpb*d results
 *                   and its fault checks; the GEMM compiled over the
 *                   emulator (ie_amx_gemm_emu) against ie_matmul_packed_ref
 *                   and an independent oracle on odd shapes and tails:
 *                   block dot products exactly equal, y within the f32
 *                   rounding of the quantized path; the per-thread tile
 *                   configuration; the dispatch (IE_ISA=amx, the AMX table).
 *   test_amx --hw   the same GEMM checks on the real instructions
 *                   (ie_amx_gemm_hw and the AMX table's matmul_packed);
 *                   exits 77 (ctest: skipped) with the reason where the CPU
 *                   or OS cannot run AMX.
 */
#include "ie_kernels.h"
#include "ie_test_panel.h"
#include "../../kernels/src/ie_kernels_isa.h"
#include "ie_test_rng.h"
#include "ie_test_kq.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef ie_status_t (*gemm_fn)(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                               int64_t n_tok, float *y, int64_t ldy, int32_t *isums);

typedef ie_status_t (*gemm_bf16_fn)(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                    int64_t n_tok, float *y, int64_t ldy);

/* The GEMMs the shape tests run: the emulated ones, or the real ones (--hw). */
static gemm_fn g_gemm = ie_amx_gemm_emu;
static gemm_bf16_fn g_gemm_bf16 = ie_amx_gemm_bf16_emu;
static int g_hw;

static void *xmalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    CU_ASSERT_FATAL(p != NULL);
    memset(p, 0xa5, (n + 63) / 64 * 64);
    return p;
}

/* ------------------------------------------------------------ emulator */

/* Write a palette-1 config: tiles 0..n-1 with rows[t] x colsb[t]. */
static void make_cfg(uint8_t cfg[64], int n, const int *rows, const int *colsb)
{
    memset(cfg, 0, 64);
    cfg[0] = 1;
    for (int t = 0; t < n; t++) {
        const uint16_t cb = (uint16_t)colsb[t];
        memcpy(cfg + 16 + 2 * t, &cb, 2);
        cfg[48 + t] = (uint8_t)rows[t];
    }
}

/* C (2 x 2 int32) += A (2 x 8 bytes) . B (2 quads x 8 bytes), worked by
 * hand for each signedness (bytes 0xff and 0x80 tell them apart):
 *   A0 = 1 2 3 4 | ff 0 0 0     B0 = 1 1 1 1 | 2 0 0 ff   (quad 0)
 *   A1 = 80 1 0 0 | 2 2 2 2     B1 = 3 0 0 0 | 0 0 0 1    (quad 1)
 *   C  = 10 20 / 30 40
 * bssd: C00 = 10 + (1+2+3+4) + (-1)*3 = 17; C01 = 20 + (1*2 + 4*-1) + 0 = 18;
 *       C10 = 30 + (-128+1) + 2*3 = -91;   C11 = 40 + (-128*2) + 2*1 = -214
 * buud: 255 for ff, 128 for 80: 785, 1042, 165, 298
 * bsud: (A signed, B unsigned) 17, 1042, -91, -214
 * busd: (A unsigned, B signed) 785, 18, 165, 298 */
static void test_emu_hand(void)
{
    static const uint8_t A[2][8] = {{1, 2, 3, 4, 0xff, 0, 0, 0}, {0x80, 1, 0, 0, 2, 2, 2, 2}};
    static const uint8_t B[2][8] = {{1, 1, 1, 1, 2, 0, 0, 0xff}, {3, 0, 0, 0, 0, 0, 0, 1}};
    static const int32_t C0[2][2] = {{10, 20}, {30, 40}};
    static const int32_t want[4][2][2] = {{{17, 18}, {-91, -214}},
                                          {{785, 1042}, {165, 298}},
                                          {{17, 1042}, {-91, -214}},
                                          {{785, 18}, {165, 298}}};
    static const int sign[4][2] = {{1, 1}, {0, 0}, {1, 0}, {0, 1}};
    const int rows[3] = {2, 2, 2}, colsb[3] = {8, 8, 8};
    uint8_t cfg[64];
    make_cfg(cfg, 3, rows, colsb);
    ie_amx_emu_faults();
    for (int v = 0; v < 4; v++) {
        ie_amx_emu_ldtilecfg(cfg);
        int32_t c[2][4]; /* 16-byte rows: the store must leave bytes 8..15 alone */
        for (int r = 0; r < 2; r++) {
            memcpy(c[r], C0[r], 8);
            c[r][2] = c[r][3] = 0x5a5a5a5a;
        }
        ie_amx_emu_tileloadd(0, c, 16);
        ie_amx_emu_tileloadd(1, A, 8);
        ie_amx_emu_tileloadd(2, B, 8);
        ie_amx_emu_tdp(0, 1, 2, sign[v][0], sign[v][1]);
        ie_amx_emu_tilestored(0, c, 16);
        for (int r = 0; r < 2; r++) {
            CU_ASSERT_EQUAL(c[r][0], want[v][r][0]);
            CU_ASSERT_EQUAL(c[r][1], want[v][r][1]);
            CU_ASSERT_EQUAL(c[r][2], 0x5a5a5a5a);
            CU_ASSERT_EQUAL(c[r][3], 0x5a5a5a5a);
        }
    }
    CU_ASSERT_EQUAL(ie_amx_emu_faults(), 0);

    /* int32 accumulation wraps (no saturation): INT32_MAX + 1*1 */
    const int r1[3] = {1, 1, 1}, c4[3] = {4, 4, 4};
    make_cfg(cfg, 3, r1, c4);
    ie_amx_emu_ldtilecfg(cfg);
    int32_t big = INT32_MAX;
    const uint8_t one[4] = {1, 0, 0, 0};
    ie_amx_emu_tileloadd(0, &big, 4);
    ie_amx_emu_tileloadd(1, one, 4);
    ie_amx_emu_tileloadd(2, one, 4);
    ie_amx_emu_tdp(0, 1, 2, 1, 1);
    ie_amx_emu_tilestored(0, &big, 4);
    CU_ASSERT_EQUAL(big, INT32_MIN);
    CU_ASSERT_EQUAL(ie_amx_emu_faults(), 0);
}

static uint16_t bf(float x) { return ie_f32_to_bf16(x); }

/* tdpbf16ps by hand: C (1 x 1) += A (2 pairs) . B (2 rows of 1 pair).
 *   10 + 1*4 + 2*0.25 + 3*1 + 0.5*-8 = 13.5;
 *   2^24 + 1*1 + 1*1 = 2^24: one rounding per product (to even), not per
 *     pair (2^24 + 2 would be exact);
 *   a subnormal bf16 input counts as 0 (DAZ): 0 + 2^-133 * 2^127 = 0. */
static void test_emu_bf16_hand(void)
{
    const int rows[3] = {1, 1, 2}, colsb[3] = {4, 8, 4};
    uint8_t cfg[64];
    make_cfg(cfg, 3, rows, colsb);
    static const float cs[3] = {10.0f, 16777216.0f, 0.0f};
    const uint16_t as[3][4] = {{bf(1), bf(2), bf(3), bf(0.5f)}, {bf(1), bf(1), 0, 0}, {0x0001, 0, 0, 0}};
    const uint16_t bs[3][4] = {{bf(4), bf(0.25f), bf(1), bf(-8)}, {bf(1), bf(1), 0, 0}, {0x7f00, 0, 0, 0}};
    static const float want[3] = {13.5f, 16777216.0f, 0.0f};
    ie_amx_emu_faults();
    for (int v = 0; v < 3; v++) {
        ie_amx_emu_ldtilecfg(cfg);
        float c = cs[v];
        ie_amx_emu_tileloadd(0, &c, 4);
        ie_amx_emu_tileloadd(1, as[v], 8);
        ie_amx_emu_tileloadd(2, bs[v], 4);
        ie_amx_emu_tdpbf16ps(0, 1, 2);
        ie_amx_emu_tilestored(0, &c, 4);
        CU_ASSERT_EQUAL(c, want[v]);
    }
    CU_ASSERT_EQUAL(ie_amx_emu_faults(), 0);
}

/* What the hardware refuses, the emulator counts. */
static void test_emu_faults(void)
{
    uint8_t cfg[64], buf[1024] = {0};
    ie_amx_emu_faults();
    ie_amx_emu_tilerelease();
    ie_amx_emu_tilezero(0); /* no configuration */
    CU_ASSERT_EQUAL(ie_amx_emu_faults(), 1);
    const int rows[3] = {4, 4, 2}, colsb[3] = {16, 8, 16};
    make_cfg(cfg, 3, rows, colsb);
    ie_amx_emu_ldtilecfg(cfg);
    ie_amx_emu_tileloadd(5, buf, 64); /* unconfigured tile */
    CU_ASSERT_EQUAL(ie_amx_emu_faults(), 1);
    ie_amx_emu_tdp(0, 1, 2, 1, 1); /* A 8 bytes = 2 quads = B's 2 rows: chains */
    CU_ASSERT_EQUAL(ie_amx_emu_faults(), 0);
    ie_amx_emu_tdp(0, 2, 1, 1, 1); /* A rows 2 != C rows 4 */
    CU_ASSERT_EQUAL(ie_amx_emu_faults(), 1);
    ie_amx_emu_tdp(0, 0, 2, 1, 1); /* one tile twice */
    CU_ASSERT_EQUAL(ie_amx_emu_faults(), 1);
    cfg[48] = 17; /* 17 rows */
    ie_amx_emu_ldtilecfg(cfg);
    CU_ASSERT_EQUAL(ie_amx_emu_faults(), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_amx_emu_last_fault(), "#GP"));
    ie_amx_emu_tilerelease();
}

/* ------------------------------------------------------------ GEMM */

static int a_q(int wide, const uint8_t *row, int64_t k)
{
    if (!wide) return (int8_t)row[k];
    int16_t v;
    memcpy(&v, row + 2 * k, 2);
    return v;
}
static double a_f(int wide, const uint8_t *row, int64_t n_in, int64_t b, int which)
{
    float f;
    memcpy(&f, row + (wide ? 2 : 1) * (size_t)n_in + 4 * (size_t)(n_in / 32) * (size_t)which + 4 * b, 4);
    return f;
}

typedef struct {
    ie_dtype_t t;
    int group;
    int64_t n_in, n_out, n_tok, r0, r1;
    int extreme; /* activations at the format's limits, weights all at one end */
    uint64_t seed;
} gcase_t;

/* One shape: the GEMM's block sums exactly equal the oracle's integer dot
 * products; y within 1e-5 of the sum of |terms| of the oracle (double, from
 * those exact sums) and of ie_matmul_packed_ref; rows outside [r0, r1) and
 * columns past ldy untouched. Returns the number of bad values. */
static int check_case(const gcase_t *c)
{
    const int wide = c->t == IE_DTYPE_I8W;
    const ie_dtype_t at = ie_matmul_act_dtype(c->t);
    const int64_t n_in = c->n_in, nb = n_in / 32, nr = c->r1 - c->r0, ldy = c->n_out + 3;
    float *wf = xmalloc(sizeof(float) * (size_t)(n_in * c->n_out));
    float *x = xmalloc(sizeof(float) * (size_t)(n_in * c->n_tok));
    rng_seed(c->seed);
    rng_fill(wf, n_in * c->n_out);
    rng_fill(x, n_in * c->n_tok);
    if (c->extreme) {
        for (int64_t i = 0; i < n_in * c->n_out; i++) wf[i] = c->t == IE_DTYPE_I4W ? -1.0f : 1.0f;
        for (int64_t i = 0; i < n_in * c->n_tok; i++) x[i] = (i % 3) ? 1.0f : -1.0f;
    }
    const size_t wb = ie_pack_bytes(c->t, c->group, n_in, c->n_out);
    void *wd = xmalloc(wb);
    CU_ASSERT_FATAL(ie_pack_quantize(c->t, c->group, IE_QSCALE_ABSMAX, wf, n_in, 0, c->n_out, c->n_out, wd) == 0);
    const ie_pmat_t m = {c->t, c->group, n_in, c->n_out, wd};
    const size_t as = ie_dtype_row_bytes(at, n_in) + 32; /* rows farther apart than they need */
    uint8_t *a = xmalloc(as * (size_t)c->n_tok);
    for (int64_t t = 0; t < c->n_tok; t++)
        ie_kernels_table(IE_ISA_REF)->act_quantize(at, x + t * n_in, a + t * as, n_in);
    float *y = xmalloc(sizeof(float) * (size_t)(ldy * c->n_tok)),
          *yr = xmalloc(sizeof(float) * (size_t)(ldy * c->n_tok));
    int32_t *is = xmalloc(sizeof(int32_t) * (size_t)(c->n_tok * nr * nb));
    for (int64_t i = 0; i < ldy * c->n_tok; i++) y[i] = yr[i] = NAN;
    ie_amx_emu_faults();
    CU_ASSERT_EQUAL_FATAL(g_gemm(&m, c->r0, c->r1, a, as, c->n_tok, y, ldy, is), IE_OK);
    if (!g_hw) CU_ASSERT_EQUAL(ie_amx_emu_faults(), 0);
    CU_ASSERT_EQUAL_FATAL(ie_matmul_packed_ref(&m, c->r0, c->r1, a, as, c->n_tok, yr, ldy), IE_OK);
    int bad = 0;
    for (int64_t t = 0; t < c->n_tok; t++) {
        const uint8_t *ar = a + t * as;
        for (int64_t r = 0; r < ldy; r++) {
            const float v = y[t * ldy + r];
            if (r < c->r0 || r >= c->r1) {
                bad += !isnan(v);
                continue;
            }
            double s = 0.0, T = 0.0;
            for (int64_t g = 0; g < n_in / c->group; g++) {
                const double dw = p_scale(&m, r, g, 0), mw = c->t == IE_DTYPE_I4WA ? p_scale(&m, r, g, 1) : 0.0;
                for (int64_t b = g * c->group / 32; b < (g + 1) * c->group / 32; b++) {
                    int64_t dot = 0, adot = 0;
                    for (int j = 0; j < 32; j++) {
                        const int64_t p = (int64_t)p_value(&m, r, 32 * b + j) * a_q(wide, ar, 32 * b + j);
                        dot += p;
                        adot += p < 0 ? -p : p;
                    }
                    const int32_t got = is[(t * nr + (r - c->r0)) * nb + b];
                    if (got != dot) {
                        if (bad < 5)
                            fprintf(stderr, "\n  %s G%d %lldx%lld tok %lld row %lld block %lld: int %d != %lld",
                                    ie_dtype_name(c->t), c->group, (long long)c->n_out, (long long)n_in,
                                    (long long)t, (long long)r, (long long)b, got, (long long)dot);
                        bad++;
                    }
                    const double da = a_f(wide, ar, n_in, b, 0), sa = a_f(wide, ar, n_in, b, 1);
                    s += dw * da * (double)dot + mw * sa;
                    T += fabs(dw * da) * (double)adot + fabs(mw * sa);
                }
            }
            const double tol = 1e-5 * T + 1e-30;
            if (!(fabs(v - s) <= tol && fabs(v - (double)yr[t * ldy + r]) <= 2 * tol)) {
                if (bad < 5)
                    fprintf(stderr, "\n  %s G%d %lldx%lld tok %lld row %lld: y %.9g oracle %.9g ref %.9g tol %.3g",
                            ie_dtype_name(c->t), c->group, (long long)c->n_out, (long long)n_in, (long long)t,
                            (long long)r, v, s, yr[t * ldy + r], tol);
                bad++;
            }
        }
    }
    free(wf), free(x), free(wd), free(a), free(y), free(yr), free(is);
    return bad;
}

/* Odd sizes and tails: tokens 1..33 around the 16-row tiles, rows around
 * the 16-row panels (r0 > 0 too), one block, blocks across the 48-block
 * k-chunk, groups of 32 (repacked ggml) and wider. */
static void test_gemm_shapes(void)
{
    static const ie_dtype_t types[] = {IE_DTYPE_I8W, IE_DTYPE_I4W, IE_DTYPE_I4WA};
    static const int64_t nins[] = {32, 96, 1600, 3200};
    static const int64_t nouts[] = {1, 15, 16, 17, 40};
    static const int64_t ntoks[] = {1, 5, 16, 17, 33};
    int bad = 0, n = 0;
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t ii = 0; ii < 4; ii++)
            for (size_t oi = 0; oi < 5; oi++)
                for (size_t ki = 0; ki < 5; ki++) {
                    const int64_t n_in = nins[ii], n_out = nouts[oi], n_tok = ntoks[ki];
                    if (n_in == 3200 && (n_out != 17 || n_tok != 17)) continue; /* big: one shape */
                    const int group = (oi + ki) % 2 && n_in % 64 == 0 ? 64 : n_in == 96 && ki == 3 ? 96 : 32;
                    const int64_t r0 = n_out > 16 && ki % 2 ? 16 : 0;
                    const gcase_t c = {types[ti], group, n_in, n_out, n_tok, r0, n_out, 0, 1000 + n++};
                    bad += check_case(&c);
                }
    CU_ASSERT_EQUAL(bad, 0);
    printf("\n  %d shapes (%s) ", n, g_hw ? "AMX tiles" : "emulated tiles");
}

/* Activations at the limits of their format (Q16_P: +-32767, the high
 * byte at +127 / -128) and weights at one end of theirs: the widest int32
 * sums, the I8W split a = 256*hi + lo at its extremes. */
static void test_gemm_extremes(void)
{
    static const ie_dtype_t types[] = {IE_DTYPE_I8W, IE_DTYPE_I4W, IE_DTYPE_I4WA};
    int bad = 0;
    for (int ti = 0; ti < 3; ti++) {
        const gcase_t c = {types[ti], 32, 256, 33, 18, 0, 33, 1, 7 + ti};
        bad += check_case(&c);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* A BF16 PANEL16 copy of m (an int type): every value of
 * ie_pack_dequant_row rounded to bf16, what the bf16 route's B tiles hold
 * (so ie_matmul_packed_ref on it is that route's reference). */
static void *bf16_copy(const ie_pmat_t *m)
{
    float *wf = xmalloc(sizeof(float) * (size_t)(m->n_in * m->n_out));
    for (int64_t r = 0; r < m->n_out; r++) {
        ie_pack_dequant_row(m, r, wf + r * m->n_in);
        for (int64_t k = 0; k < m->n_in; k++)
            wf[r * m->n_in + k] = ie_bf16_to_f32(ie_f32_to_bf16(wf[r * m->n_in + k]));
    }
    void *wd = xmalloc(ie_pack_bytes(IE_DTYPE_BF16, 32, m->n_in, m->n_out));
    CU_ASSERT_FATAL(ie_pack_quantize(IE_DTYPE_BF16, 32, IE_QSCALE_ABSMAX, wf, m->n_in, 0, m->n_out, m->n_out, wd) ==
                    0);
    free(wf);
    return wd;
}

/* An n_out x n_in PANEL16 matrix of type t: a k-quant's or MXFP4's from
 * random ggml blocks (its group is its block), the others' quantized from
 * wf in groups of g. Caller frees. */
static void *pack_any(ie_dtype_t t, int g, const float *wf, int64_t n_in, int64_t n_out)
{
    if (ie_dtype_is_kq_panel(t)) {
        void *wd = ie_test_kq_random(t, n_in, n_out);
        CU_ASSERT_PTR_NOT_NULL_FATAL(wd);
        return wd;
    }
    void *wd = xmalloc(ie_pack_bytes(t, g, n_in, n_out));
    CU_ASSERT_FATAL(ie_pack_quantize(t, g, IE_QSCALE_ABSMAX, wf, n_in, 0, n_out, n_out, wd) == 0);
    return wd;
}

/* wt (BF16, or an int type in group g or a k-quant: the bf16 route) PANEL16 x BF16
 * rows: y within n_in * 2^-24 (f32 accumulation) of the sum of |terms| of
 * ie_matmul_packed_ref (on the bf16 copy for an int type); rows outside
 * [r0, r1) untouched. Returns the number of bad values. */
static int check_bf16_case(ie_dtype_t wt, int g, int64_t n_in, int64_t n_out, int64_t n_tok, int64_t r0,
                           uint64_t seed)
{
    const int64_t ldy = n_out + 3;
    float *wf = xmalloc(sizeof(float) * (size_t)(n_in * n_out)),
          *x = xmalloc(sizeof(float) * (size_t)(n_in * n_tok));
    float *wrow = xmalloc(sizeof(float) * (size_t)n_in);
    rng_seed(seed);
    rng_fill(wf, n_in * n_out);
    rng_fill(x, n_in * n_tok);
    void *wd = pack_any(wt, g, wf, n_in, n_out); /* a k-quant: g is its block size */
    const ie_pmat_t m = {wt, g, n_in, n_out, wd};
    void *wb = wt == IE_DTYPE_BF16 ? NULL : bf16_copy(&m);
    const ie_pmat_t mb = wb ? (ie_pmat_t){IE_DTYPE_BF16, 32, n_in, n_out, wb} : m;
    const size_t as = 2 * (size_t)n_in + 64;
    uint8_t *a = xmalloc(as * (size_t)n_tok);
    for (int64_t t = 0; t < n_tok; t++) ie_act_quantize_ref(IE_DTYPE_BF16, x + t * n_in, a + t * as, n_in);
    float *y = xmalloc(sizeof(float) * (size_t)(ldy * n_tok)), *yr = xmalloc(sizeof(float) * (size_t)(ldy * n_tok));
    for (int64_t i = 0; i < ldy * n_tok; i++) y[i] = yr[i] = NAN;
    ie_amx_emu_faults();
    CU_ASSERT_EQUAL_FATAL(g_gemm_bf16(&m, r0, n_out, a, as, n_tok, y, ldy), IE_OK);
    if (!g_hw) CU_ASSERT_EQUAL(ie_amx_emu_faults(), 0);
    CU_ASSERT_EQUAL_FATAL(ie_matmul_packed_ref(&mb, r0, n_out, a, as, n_tok, yr, ldy), IE_OK);
    int bad = 0;
    for (int64_t r = 0; r < ldy; r++) {
        if (r < n_out) ie_pack_dequant_row(&mb, r, wrow);
        for (int64_t t = 0; t < n_tok; t++) {
            const float v = y[t * ldy + r];
            if (r < r0 || r >= n_out) {
                bad += !isnan(v);
                continue;
            }
            double T = 0.0;
            for (int64_t k = 0; k < n_in; k++) {
                ie_bf16_t h;
                memcpy(&h, a + t * as + 2 * k, 2);
                T += fabs((double)wrow[k] * ie_bf16_to_f32(h));
            }
            const double tol = (double)n_in * ldexp(1.0, -24) * T + 1e-30;
            if (!(fabs(v - (double)yr[t * ldy + r]) <= tol)) {
                if (bad < 5)
                    fprintf(stderr, "\n  %s g%d %lldx%lld tok %lld row %lld: y %.9g ref %.9g tol %.3g",
                            ie_dtype_name(wt), g, (long long)n_out, (long long)n_in, (long long)t, (long long)r, v,
                            yr[t * ldy + r], tol);
                bad++;
            }
        }
    }
    free(wf), free(x), free(wrow), free(wd), free(wb), free(a), free(y), free(yr);
    return bad;
}

static void test_gemm_bf16_shapes(void)
{
    static const int64_t nins[] = {32, 96, 1024};
    static const int64_t nouts[] = {1, 15, 16, 17, 40};
    /* token tiles: one, a full and a tail pair, two full, a pair and a tail */
    static const int64_t ntoks[] = {1, 5, 16, 17, 32, 45};
    int bad = 0, n = 0;
    for (size_t ii = 0; ii < 3; ii++)
        for (size_t oi = 0; oi < 5; oi++)
            for (size_t ki = 0; ki < 6; ki++) {
                const int64_t r0 = nouts[oi] > 16 && ki % 2 ? 16 : 0;
                bad += check_bf16_case(IE_DTYPE_BF16, 32, nins[ii], nouts[oi], ntoks[ki], r0, 4000 + n++);
            }
    CU_ASSERT_EQUAL(bad, 0);
    printf("\n  %d shapes ", n);
}

/* The int types on the bf16 tiles: odd shapes, tails, groups 32 / 64,
 * row blocks of several panels (n_in 1024: 32 KiB a panel) and of one
 * pair (n_in 32768: 1 MiB a panel, the block grows to two); the k-quants
 * (random blocks: every code, sub-block code and sign of d, dmin). */
static void test_gemm_int_bf16_shapes(void)
{
    static const ie_dtype_t types[] = {IE_DTYPE_I8W, IE_DTYPE_I4W, IE_DTYPE_I4WA};
    static const int64_t nins[] = {64, 192, 1024};
    static const int64_t nouts[] = {1, 17, 40};
    static const int64_t ntoks[] = {1, 16, 19, 32};
    int bad = 0, n = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int g = 32; g <= 64; g += 32)
            for (size_t ii = 0; ii < 3; ii++)
                for (size_t oi = 0; oi < 3; oi++)
                    for (size_t ki = 0; ki < 4; ki++) {
                        const int64_t r0 = nouts[oi] > 16 && ki % 2 ? 16 : 0;
                        bad += check_bf16_case(types[ti], g, nins[ii], nouts[oi], ntoks[ki], r0, 5000 + n++);
                    }
    for (int ti = 0; ti < 3; ti++) bad += check_bf16_case(types[ti], 32, 32768, 70, 2, 0, 5000 + n++);
    for (int ti = 0; ti < IE_TEST_N_KTYPES; ti++) { /* the k-quants: their blocks, sub-blocks, offsets */
        const ie_dtype_t t = IE_TEST_KTYPES[ti];
        const int qk = ie_dtype_block_elems(t);
        for (size_t oi = 0; oi < 3; oi++)
            for (size_t ki = 0; ki < 4; ki++)
                bad += check_bf16_case(t, qk, 3 * qk, nouts[oi], ntoks[ki], nouts[oi] > 16 && ki % 2 ? 16 : 0,
                                       5000 + n++);
    }
    CU_ASSERT_EQUAL(bad, 0);
    printf("\n  %d shapes ", n);
}

/* The dequantization itself, exactly: token t is one-hot at k = t (bf16
 * 1.0), so y[t][r] is the bf16 value of weight (r, t) and nothing else;
 * it must be ie_pack_dequant_row's, rounded as ie_f32_to_bf16, bit for
 * bit, for every code of every row (tails included). */
static void test_gemm_int_bf16_exact(void)
{
    int bad = 0;
    for (int ti = 0; ti < 3 + IE_TEST_N_KTYPES; ti++)
        for (int g = 32; g <= 64; g += 32) {
            static const ie_dtype_t types[] = {IE_DTYPE_I8W, IE_DTYPE_I4W, IE_DTYPE_I4WA};
            const ie_dtype_t t = ti < 3 ? types[ti] : IE_TEST_KTYPES[ti - 3];
            const int kq = ti >= 3;
            if (kq && g == 64) continue; /* a k-quant's group is its block */
            const int gg = kq ? ie_dtype_block_elems(t) : g;
            const int64_t n_in = gg > 128 ? gg : 128, n_out = 37, n_tok = n_in;
            float *wf = xmalloc(sizeof(float) * n_in * n_out), *wrow = xmalloc(sizeof(float) * n_in);
            rng_seed(91 + ti + g);
            rng_fill(wf, n_in * n_out);
            for (int64_t i = 0; i < n_out; i++) wf[i * n_in + 3] *= 100.0f; /* scales of another size */
            void *wd = pack_any(t, gg, wf, n_in, n_out);
            const ie_pmat_t m = {t, gg, n_in, n_out, wd};
            const size_t as = 2 * (size_t)n_in;
            uint8_t *a = xmalloc(as * n_tok);
            memset(a, 0, as * n_tok);
            const ie_bf16_t one = ie_f32_to_bf16(1.0f);
            for (int64_t t = 0; t < n_tok; t++) memcpy(a + t * as + 2 * t, &one, 2);
            float *y = xmalloc(sizeof(float) * n_out * n_tok);
            CU_ASSERT_EQUAL_FATAL(g_gemm_bf16(&m, 0, n_out, a, as, n_tok, y, n_out), IE_OK);
            for (int64_t r = 0; r < n_out; r++) {
                ie_pack_dequant_row(&m, r, wrow);
                for (int64_t k = 0; k < n_in; k++) {
                    const float want = ie_bf16_to_f32(ie_f32_to_bf16(wrow[k])), got = y[k * n_out + r];
                    if (!(want == got)) { /* -0 from u = 8 meets the +0 of C's start */
                        if (bad < 5)
                            fprintf(stderr, "\n  %s g%d row %lld k %lld: %.9g want %.9g", ie_dtype_name(types[ti]),
                                    g, (long long)r, (long long)k, got, want);
                        bad++;
                    }
                }
            }
            free(wf), free(wrow), free(wd), free(a), free(y);
        }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---------------------------------------------- MXFP4 on the bf16 tiles */

/* The MXFP4 GEMM under test: the emulated one, or the real one (--hw). */
static ie_status_t mxfp4_gemm(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                              int64_t n_tok, float *y, int64_t ldy)
{
    if (g_hw) return ie_amx_mxfp4_hw(w, n_in, r0, r1, a, as, n_tok, y, ldy);
    ie_amx_mxfp4_emu(w, n_in, r0, r1, a, as, n_tok, y, ldy);
    return IE_OK;
}

/* y (ldy apart) of MXFP4 rows w [r0, r1) x BF16 rows a (as apart) against
 * the exact sums (double) of ref's weight values times the activations:
 * within n_in * 2^-24 of the sum of |terms| (f32 accumulation; every
 * weight is exact in bf16, no subnormal ones here), rows outside [r0, r1)
 * still NaN. Returns the number of bad values. */
static int check_mxfp4_y(const uint8_t *w, int64_t n_in, int64_t r0, int64_t r1, const uint8_t *a, size_t as,
                         int64_t n_tok, const float *y, int64_t ldy)
{
    const size_t rb = ie_dtype_row_bytes(IE_DTYPE_MXFP4, n_in);
    float *wrow = xmalloc(sizeof(float) * (size_t)n_in);
    int bad = 0;
    for (int64_t r = 0; r < ldy; r++) {
        const int in = r >= r0 && r < r1;
        if (in) ie_dequantize_row(IE_DTYPE_MXFP4, w + (size_t)r * rb, wrow, n_in);
        for (int64_t t = 0; t < n_tok; t++) {
            const float v = y[t * ldy + r];
            if (!in) {
                bad += !isnan(v);
                continue;
            }
            double S = 0.0, T = 0.0;
            for (int64_t k = 0; k < n_in; k++) {
                ie_bf16_t h;
                memcpy(&h, a + t * as + 2 * k, 2);
                const double p = (double)wrow[k] * ie_bf16_to_f32(h);
                S += p;
                T += fabs(p);
            }
            const double tol = (double)n_in * ldexp(1.0, -24) * T + 1e-30;
            if (!(fabs(v - S) <= tol)) {
                if (bad < 5)
                    fprintf(stderr,
                            "\n  mxfp4 rows [%lld, %lld) x %lld tok %lld row %lld: y %.9g want %.9g tol %.3g",
                            (long long)r0, (long long)r1, (long long)n_in, (long long)t, (long long)r, v, S, tol);
                bad++;
            }
        }
    }
    free(wrow);
    return bad;
}

/* MXFP4 rows x BF16 rows on the tiles: odd row counts and starts (r0 need
 * not be a panel's), token tails, rows of one k-chunk (64 blocks), of two
 * with a one-block tail (65) and GPT-OSS's 2880 (90 blocks: C carried
 * through y between chunks). */
static void test_gemm_mxfp4_shapes(void)
{
    static const int64_t nins[] = {32, 96, 2048, 2080, 2880};
    static const int64_t nouts[] = {1, 17, 40};
    static const int64_t ntoks[] = {1, 16, 19, 45};
    int bad = 0, n = 0;
    for (size_t ii = 0; ii < 5; ii++)
        for (size_t oi = 0; oi < 3; oi++)
            for (size_t ki = 0; ki < 4; ki++) {
                const int64_t n_in = nins[ii], n_out = nouts[oi], n_tok = ntoks[ki], ldy = n_out + 3;
                const int64_t r0 = n_out > 16 && ki % 2 ? 5 : 0, r1 = n_out > 16 && ki == 2 ? n_out - 3 : n_out;
                rng_seed(9000 + n);
                uint8_t *w = ie_test_mxfp4_random(n_in, n_out, 112, 130);
                CU_ASSERT_PTR_NOT_NULL_FATAL(w);
                float *x = xmalloc(sizeof(float) * (size_t)(n_in * n_tok));
                rng_fill(x, n_in * n_tok);
                const size_t as = 2 * (size_t)n_in + 64;
                uint8_t *a = xmalloc(as * (size_t)n_tok);
                for (int64_t t = 0; t < n_tok; t++)
                    ie_act_quantize_ref(IE_DTYPE_BF16, x + t * n_in, a + t * as, n_in);
                float *y = xmalloc(sizeof(float) * (size_t)(ldy * n_tok));
                for (int64_t i = 0; i < ldy * n_tok; i++) y[i] = NAN;
                ie_amx_emu_faults();
                CU_ASSERT_EQUAL_FATAL(mxfp4_gemm(w, n_in, r0, r1, a, as, n_tok, y, ldy), IE_OK);
                if (!g_hw) CU_ASSERT_EQUAL(ie_amx_emu_faults(), 0);
                bad += check_mxfp4_y(w, n_in, r0, r1, a, as, n_tok, y, ldy);
                n++;
                free(w), free(x), free(a), free(y);
            }
    CU_ASSERT_EQUAL(bad, 0);
    printf("\n  %d shapes ", n);
}

/* The dequantized values, exactly: one-hot tokens (bf16 1.0 at k = t) make
 * y[t][r] the bf16 weight (r, t); it must be ie_dequantize_row's value,
 * subnormals zero, for every code and block exponents from 0 (2^-128:
 * subnormal products) to 252 (the largest with every product finite). */
static void test_gemm_mxfp4_exact(void)
{
    static const uint8_t es[] = {0, 1, 2, 3, 100, 127, 128, 200, 252};
    const int64_t n_in = 128, n_out = 37, n_tok = n_in;
    rng_seed(93);
    uint8_t *w = ie_test_mxfp4_random(n_in, n_out, 0, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(w);
    const size_t rb = ie_dtype_row_bytes(IE_DTYPE_MXFP4, n_in);
    for (int64_t r = 0; r < n_out; r++)
        for (int64_t b = 0; b < n_in / 32; b++)
            w[(size_t)r * rb + sizeof(ie_block_mxfp4_t) * (size_t)b] = es[(r * 4 + b) % 9];
    const size_t as = 2 * (size_t)n_in;
    uint8_t *a = xmalloc(as * n_tok);
    memset(a, 0, as * n_tok);
    const ie_bf16_t one = ie_f32_to_bf16(1.0f);
    for (int64_t t = 0; t < n_tok; t++) memcpy(a + t * as + 2 * t, &one, 2);
    float *y = xmalloc(sizeof(float) * n_out * n_tok), *wrow = xmalloc(sizeof(float) * n_in);
    CU_ASSERT_EQUAL_FATAL(mxfp4_gemm(w, n_in, 0, n_out, a, as, n_tok, y, n_out), IE_OK);
    int bad = 0, sub = 0;
    for (int64_t r = 0; r < n_out; r++) {
        ie_dequantize_row(IE_DTYPE_MXFP4, w + (size_t)r * rb, wrow, n_in);
        for (int64_t k = 0; k < n_in; k++) {
            const int tiny = fpclassify(wrow[k]) == FP_SUBNORMAL;
            const float want = tiny ? 0.0f : wrow[k], got = y[k * n_out + r];
            sub += tiny;
            if (!(want == got) || ie_bf16_to_f32(ie_f32_to_bf16(want)) != want) {
                if (bad < 5)
                    fprintf(stderr, "\n  mxfp4 row %lld k %lld: %.9g want %.9g", (long long)r, (long long)k, got,
                            want);
                bad++;
            }
        }
    }
    CU_ASSERT(sub > 0); /* the subnormal case was met */
    CU_ASSERT_EQUAL(bad, 0);
    free(w), free(a), free(y), free(wrow);
}

/* Another dtype: IE_ERR_UNSUPPORTED; bad shapes: IE_ERR_INVAL. */
static void test_gemm_bad_args(void)
{
    static uint8_t w[2048];
    float y[32];
    uint8_t a[64] = {0};
    const ie_pmat_t bf = {IE_DTYPE_BF16, 32, 32, 16, w}, iw = {IE_DTYPE_I4W, 32, 32, 16, w};
    CU_ASSERT_EQUAL(g_gemm(&bf, 0, 16, a, 64, 1, y, 16, NULL), IE_ERR_UNSUPPORTED);
    CU_ASSERT_EQUAL(g_gemm(&iw, 1, 16, a, 64, 1, y, 16, NULL), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(g_gemm(&iw, 0, 17, a, 64, 1, y, 16, NULL), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(g_gemm(NULL, 0, 16, a, 64, 1, y, 16, NULL), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(g_gemm(&iw, 0, 16, a, 64, 0, y, 16, NULL), IE_OK);
    const ie_pmat_t hw = {IE_DTYPE_F16, 32, 32, 16, w};
    CU_ASSERT_EQUAL(g_gemm_bf16(&hw, 0, 16, a, 64, 1, y, 16), IE_ERR_UNSUPPORTED);
    CU_ASSERT_EQUAL(g_gemm_bf16(&bf, 0, 17, a, 64, 1, y, 16), IE_ERR_INVAL);
}

/* The tile configuration is per thread, made on a thread's first call:
 * a new thread runs the GEMM with no set-up of its own. */
static void *thread_case(void *arg)
{
    const gcase_t c = {IE_DTYPE_I4W, 32, 160, 40, 21, 0, 40, 0, 555};
    *(int *)arg = check_case(&c) + (g_hw ? 0 : ie_amx_emu_faults());
    return NULL;
}
static void test_gemm_threads(void)
{
    pthread_t th[2];
    int bad[2] = {-1, -1};
    for (int i = 0; i < 2; i++) CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, thread_case, &bad[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CU_ASSERT_EQUAL(bad[0], 0);
    CU_ASSERT_EQUAL(bad[1], 0);
}

/* Why the configuration is never released: the kernel keeps a per-thread
 * "configured" mark, so tiles released behind its back fault (here, in
 * the emulator; #UD on the hardware) until the mark is cleared. */
static void test_emu_release_behind_back(void)
{
    const gcase_t c = {IE_DTYPE_I8W, 32, 64, 16, 16, 0, 16, 0, 99};
    CU_ASSERT_EQUAL(check_case(&c), 0);
    ie_amx_emu_tilerelease();
    uint8_t w[2 * 16 * 80], a[16 * 160];
    float y[16 * 16];
    memset(w, 0, sizeof w), memset(a, 0, sizeof a);
    const ie_pmat_t m = {IE_DTYPE_I8W, 32, 64, 16, w};
    ie_amx_emu_faults();
    CU_ASSERT_EQUAL(ie_amx_gemm_emu(&m, 0, 16, a, 160, 16, y, 16, NULL), IE_OK);
    CU_ASSERT(ie_amx_emu_faults() > 0);
    ie_amx_emu_forget_config();
    CU_ASSERT_EQUAL(check_case(&c), 0);
}

/* ------------------------------------------------------------ dispatch */

/* The AMX table is AVX-512's but for the packed matmul and the MXFP4 slot;
 * "amx" is its name;
 * IE_ISA=amx returns AMX even where it cannot run (the worker then fails
 * with the reason), IE_ISA=avx512 still picks AVX-512. */
static void test_dispatch(void)
{
    CU_ASSERT_STRING_EQUAL(ie_isa_name(IE_ISA_AMX), "amx");
    const ie_kernels_t *x = ie_kernels_table(IE_ISA_AVX512), *k = ie_kernels_table(IE_ISA_AMX);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k);
    CU_ASSERT_EQUAL(k->isa, IE_ISA_AMX);
    CU_ASSERT(k->matmul_packed == ie_matmul_packed_amx);
    CU_ASSERT(k->matmul_packed_ranges == ie_matmul_packed_ranges_amx);
    ie_kernels_t same = *k;
    same.isa = x->isa;
    same.matmul_packed = x->matmul_packed;
    same.matmul_packed_ranges = x->matmul_packed_ranges;
    same.act_dtype = x->act_dtype;
    same.matmul[IE_DTYPE_MXFP4] = x->matmul[IE_DTYPE_MXFP4];
    CU_ASSERT(k->act_dtype == ie_act_dtype_amx);
    CU_ASSERT(k->matmul[IE_DTYPE_MXFP4] == ie_matmul_mxfp4_amx);
    CU_ASSERT(memcmp(&same, x, sizeof same) == 0);

    const int amx = ie_isa_supported(IE_ISA_AMX);
    const char *why = ie_isa_unsupported_reason(IE_ISA_AMX);
    CU_ASSERT_EQUAL(amx, why == NULL);
    CU_ASSERT_EQUAL(ie_kernels_get(IE_ISA_AMX) != NULL, amx);
    const char *old = getenv("IE_ISA");
    char *saved = old ? strdup(old) : NULL;
    unsetenv("IE_ISA");
    CU_ASSERT_NOT_EQUAL(ie_isa_best(), IE_ISA_AMX); /* opt-in (IE_ISA=amx) for now */
    setenv("IE_ISA", "amx", 1);
    CU_ASSERT_EQUAL(ie_isa_best(), IE_ISA_AMX);
    setenv("IE_ISA", "avx512", 1);
    if (ie_isa_supported(IE_ISA_AVX512)) CU_ASSERT_EQUAL(ie_isa_best(), IE_ISA_AVX512);
    if (saved) {
        setenv("IE_ISA", saved, 1);
        free(saved);
    } else unsetenv("IE_ISA");
    /* the real GEMM refuses to run without AMX (or when it is emulated),
     * touching nothing */
    if (!amx || ie_amx_emulated()) {
        float y = 1.0f;
        uint8_t w[1024] = {0}, a[64] = {0};
        const ie_pmat_t m = {IE_DTYPE_I4W, 32, 32, 1, w};
        CU_ASSERT_EQUAL(ie_amx_gemm_hw(&m, 0, 1, a, 64, 1, &y, 1, NULL), IE_ERR_UNSUPPORTED);
        CU_ASSERT_EQUAL(ie_amx_gemm_bf16_hw(&m, 0, 1, a, 64, 1, &y, 1), IE_ERR_UNSUPPORTED);
        CU_ASSERT_EQUAL(ie_amx_peak_run(64, 1), IE_ERR_UNSUPPORTED);
        CU_ASSERT_EQUAL(ie_amx_mxfp4_hw(w, 32, 0, 1, a, 64, 1, &y, 1), IE_ERR_UNSUPPORTED);
        CU_ASSERT_EQUAL(y, 1.0f);
    }
    printf("\n  amx: %s ", ie_amx_emulated() ? "emulated (IE_AMX_EMULATE=1)" : amx ? "supported" : why);
}

/* Below ie_amx_min_tok() tokens (and for other dtypes) the AMX table's
 * packed matmul is AVX-512's, bit for bit. Needs AVX-512 (the fallback's
 * own instructions); no tile instruction runs. */
static void test_small_steps_avx512(void)
{
    if (!ie_isa_supported(IE_ISA_AVX512)) return;
    const int64_t n_in = 256, n_out = 40, n_tok = ie_amx_min_tok() - 1;
    if (n_tok < 1) return; /* IE_AMX_MIN_TOK=1: no step is below it */
    float *wf = xmalloc(sizeof(float) * n_in * n_out), *x = xmalloc(sizeof(float) * n_in * n_tok);
    rng_seed(31);
    rng_fill(wf, n_in * n_out);
    rng_fill(x, n_in * n_tok);
    const size_t as = ie_dtype_row_bytes(IE_DTYPE_Q8_P, n_in);
    uint8_t *a = xmalloc(as * n_tok);
    void *wd = xmalloc(ie_pack_bytes(IE_DTYPE_I4W, 32, n_in, n_out));
    CU_ASSERT_FATAL(ie_pack_quantize(IE_DTYPE_I4W, 32, IE_QSCALE_ABSMAX, wf, n_in, 0, n_out, n_out, wd) == 0);
    for (int64_t t = 0; t < n_tok; t++) ie_act_quantize_ref(IE_DTYPE_Q8_P, x + t * n_in, a + t * as, n_in);
    const ie_pmat_t m = {IE_DTYPE_I4W, 32, n_in, n_out, wd};
    float *y1 = xmalloc(sizeof(float) * n_out * n_tok), *y2 = xmalloc(sizeof(float) * n_out * n_tok);
    CU_ASSERT_EQUAL(ie_matmul_packed_amx(&m, 0, n_out, a, as, n_tok, y1, n_out), IE_OK);
    CU_ASSERT_EQUAL(ie_matmul_packed_avx512(&m, 0, n_out, a, as, n_tok, y2, n_out), IE_OK);
    CU_ASSERT(memcmp(y1, y2, sizeof(float) * n_out * n_tok) == 0);
    free(wf), free(x), free(a), free(wd), free(y1), free(y2);
}

/* The sum of |each term| of y[t][r] (block dot products scaled, and I4WA's
 * m*s): the size float rounding is relative to, where the terms cancel. */
static double term_mag(const ie_pmat_t *m, const uint8_t *ar, int64_t r)
{
    const int wide = m->dtype == IE_DTYPE_I8W;
    double T = 0.0;
    for (int64_t b = 0; b < m->n_in / 32; b++) {
        const int64_t g = b * 32 / m->group;
        int64_t adot = 0;
        for (int j = 0; j < 32; j++) {
            const int64_t p = (int64_t)p_value(m, r, 32 * b + j) * a_q(wide, ar, 32 * b + j);
            adot += p < 0 ? -p : p;
        }
        const double mw = m->dtype == IE_DTYPE_I4WA ? p_scale(m, r, g, 1) : 0.0;
        T += fabs(p_scale(m, r, g, 0) * a_f(wide, ar, m->n_in, b, 0)) * (double)adot +
             fabs(mw * a_f(wide, ar, m->n_in, b, 1));
    }
    return T;
}

/* The AMX table's matmul_packed (int types on the int8 tiles with
 * IE_AMX_INT=1, which main sets unless the environment says otherwise, or
 * on the bf16 route with IE_AMX_INT=bf16: BF16 rows, as
 * ie_kernels_act_dtype says, against ref on their bf16 copy; and bf16)
 * against ref at 1, 5, 16 and 37 tokens: the tiles at and above
 * ie_amx_min_tok() (--hw: the real ones; IE_AMX_EMULATE=1: the emulator),
 * AVX-512 below it. */
static void test_hw_table(void)
{
    const ie_kernels_t *k = ie_kernels_get(IE_ISA_AMX);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k);
    /* the k-quants and packed MXFP4 only on the bf16 route (elsewhere they are AVX-512's, tested in
     * test_kquant_pack) */
    static const ie_dtype_t types[] = {IE_DTYPE_I8W,  IE_DTYPE_I4W,  IE_DTYPE_I4WA, IE_DTYPE_BF16,
                                       IE_DTYPE_Q4_K, IE_DTYPE_Q6_K, IE_DTYPE_MXFP4};
    const int n_types = ie_amx_int_tiles() == IE_AMX_ROUTE_BF16 ? 7 : 4;
    static const int64_t toks[] = {1, 5, 16, 37};
    int bad = 0;
    for (int ti = 0; ti < n_types; ti++)
        for (int ni = 0; ni < 4; ni++) {
            const int64_t n_in = 2048, n_out = 100, n_tok = toks[ni];
            const int kq = ie_dtype_is_kq_panel(types[ti]), g = kq ? ie_dtype_block_elems(types[ti]) : 32;
            const ie_dtype_t at = ie_kernels_act_dtype(k, types[ti], 1, n_tok);
            const int half = at == IE_DTYPE_BF16; /* BF16, or an int type on the bf16 route */
            float *wf = xmalloc(sizeof(float) * n_in * n_out), *x = xmalloc(sizeof(float) * n_in * n_tok);
            rng_seed(77 + ti + 10 * ni);
            rng_fill(wf, n_in * n_out);
            rng_fill(x, n_in * n_tok);
            const size_t as = ie_dtype_row_bytes(at, n_in);
            uint8_t *a = xmalloc(as * n_tok);
            void *wd = pack_any(types[ti], g, wf, n_in, n_out);
            for (int64_t t = 0; t < n_tok; t++) ie_act_quantize_ref(at, x + t * n_in, a + t * as, n_in);
            const ie_pmat_t m = {types[ti], g, n_in, n_out, wd};
            for (int64_t r = 0; r < n_out; r++) ie_pack_dequant_row(&m, r, wf + r * n_in); /* the weights' values */
            float *y1 = xmalloc(sizeof(float) * n_out * n_tok), *y2 = xmalloc(sizeof(float) * n_out * n_tok);
            CU_ASSERT_EQUAL(k->matmul_packed(&m, 0, n_out, a, as, n_tok, y1, n_out), IE_OK);
            void *wb = half && types[ti] != IE_DTYPE_BF16 ? bf16_copy(&m) : NULL; /* the route's reference */
            CU_ASSERT_FATAL(half || !kq);
            const ie_pmat_t mr = wb ? (ie_pmat_t){IE_DTYPE_BF16, 32, n_in, n_out, wb} : m;
            CU_ASSERT_EQUAL(ie_matmul_packed_ref(&mr, 0, n_out, a, as, n_tok, y2, n_out), IE_OK);
            free(wb);
            for (int64_t t = 0; t < n_tok; t++)
                for (int64_t r = 0; r < n_out; r++) {
                    const float v = y1[t * n_out + r], w = y2[t * n_out + r];
                    double tol;
                    if (half) { /* f32 sums in another order: n_in roundings of at most sum |w a| (w, a rounded
                                 to bf16 move it by far less than 2x) */
                        double T = 0.0;
                        for (int64_t i = 0; i < n_in; i++) T += fabs((double)wf[r * n_in + i] * x[t * n_in + i]);
                        tol = 2.0 * (double)n_in * ldexp(1.0, -24) * T;
                    } else {
                        tol = 1e-5 * term_mag(&m, a + t * as, r);
                    }
                    if (!(fabs((double)v - (double)w) <= tol)) {
                        if (bad < 5)
                            fprintf(stderr, "\n  %s %lld tokens, tok %lld row %lld: amx %.9g ref %.9g tol %.3g",
                                    ie_dtype_name(types[ti]), (long long)n_tok, (long long)t, (long long)r, v, w,
                                    tol);
                        bad++;
                    }
                }
            free(wf), free(x), free(a), free(wd), free(y1), free(y2);
        }
    CU_ASSERT_EQUAL(bad, 0);
}

/* The AMX table's MXFP4 slot (ROWS) with the activation rows its
 * act_dtype names, at 1, 5, 16 and 37 tokens: on the bf16 route (BF16
 * rows) against the exact sums, else (Q8_0 rows) equal to the AVX-512
 * kernel bit for bit. */
static void test_table_mxfp4(void)
{
    const ie_kernels_t *k = ie_kernels_get(IE_ISA_AMX);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k);
    static const int64_t toks[] = {1, 5, 16, 37};
    int bad = 0, tiles = 0;
    for (int ni = 0; ni < 4; ni++) {
        const int64_t n_in = 2880, n_out = 100, n_tok = toks[ni];
        const ie_dtype_t at = ie_kernels_act_dtype(k, IE_DTYPE_MXFP4, 0, n_tok);
        const int route = ie_amx_route(IE_DTYPE_MXFP4, n_tok) == IE_AMX_ROUTE_BF16;
        CU_ASSERT_EQUAL(at, route ? IE_DTYPE_BF16 : IE_DTYPE_Q8_0);
        tiles += route;
        rng_seed(177 + ni);
        uint8_t *w = ie_test_mxfp4_random(n_in, n_out, 115, 128);
        CU_ASSERT_PTR_NOT_NULL_FATAL(w);
        float *x = xmalloc(sizeof(float) * n_in * n_tok);
        rng_fill(x, n_in * n_tok);
        const size_t as = ie_dtype_row_bytes(at, n_in);
        uint8_t *a = xmalloc(as * n_tok);
        for (int64_t t = 0; t < n_tok; t++) ie_act_quantize_ref(at, x + t * n_in, a + t * as, n_in);
        float *y1 = xmalloc(sizeof(float) * n_out * n_tok), *y2 = xmalloc(sizeof(float) * n_out * n_tok);
        CU_ASSERT_EQUAL(ie_kernels_matmul(k, IE_DTYPE_MXFP4, w, n_in, 0, n_out, a, as, n_tok, y1, n_out), IE_OK);
        if (route) {
            bad += check_mxfp4_y(w, n_in, 0, n_out, a, as, n_tok, y1, n_out);
        } else {
            ie_matmul_mxfp4_q8_0_avx512(w, n_in, 0, n_out, a, as, n_tok, y2, n_out);
            bad += memcmp(y1, y2, sizeof(float) * n_out * n_tok) != 0;
        }
        free(w), free(x), free(a), free(y1), free(y2);
    }
    CU_ASSERT_EQUAL(bad, 0);
    printf("\n  %d of 4 steps on the tiles ", tiles);
}

int main(int argc, char **argv)
{
    const int hw = argc > 1 && strcmp(argv[1], "--hw") == 0;
    setenv("IE_AMX_INT", "1", 0); /* the table's int types on the tiles too (read once, below); =bf16 kept */
    if (hw) {
        const char *why = ie_amx_emulated() ? "IE_AMX_EMULATE=1 (the tiles are emulated, not real)"
                                            : ie_isa_unsupported_reason(IE_ISA_AMX);
        if (why) {
            /* not a pass: ctest shows this test as skipped (exit 77) */
            printf("SKIPPED: the AMX tile tests need a CPU and OS with AMX: %s\n", why);
            return 77;
        }
        g_gemm = ie_amx_gemm_hw;
        g_gemm_bf16 = ie_amx_gemm_bf16_hw;
        g_hw = 1;
    }
    const int bf16 = !hw || (ie_cpu_features() & IE_CPU_AMX_BF16);
    if (!bf16) printf("AMX-BF16 absent (CPUID.(7,0):EDX bit 22): its tests are not run\n");
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite(hw ? "amx (tiles)" : "amx (emulated)", NULL, NULL);
    if (!hw) {
        CU_add_test(s, "emulator: tdpb{ss,uu,su,us}d by hand, wrap, store width", test_emu_hand);
        CU_add_test(s, "emulator: tdpbf16ps by hand, rounding per product, DAZ", test_emu_bf16_hand);
        CU_add_test(s, "emulator: #UD/#GP cases counted", test_emu_faults);
    }
    CU_add_test(s, "gemm vs ref: odd shapes, tails, exact block sums", test_gemm_shapes);
    CU_add_test(s, "gemm vs ref: extreme values", test_gemm_extremes);
    if (bf16) {
        CU_add_test(s, "bf16 gemm vs ref: odd shapes, tails", test_gemm_bf16_shapes);
        CU_add_test(s, "int types, k-quants on bf16 tiles vs ref: odd shapes, tails", test_gemm_int_bf16_shapes);
        CU_add_test(s, "int types, k-quants on bf16 tiles: the dequantized values, exactly",
                    test_gemm_int_bf16_exact);
        CU_add_test(s, "mxfp4 rows on bf16 tiles vs exact sums: odd shapes, k-chunks", test_gemm_mxfp4_shapes);
        CU_add_test(s, "mxfp4 rows on bf16 tiles: the values, exactly (subnormals zero)", test_gemm_mxfp4_exact);
    }
    CU_add_test(s, "gemm bad args", test_gemm_bad_args);
    CU_add_test(s, "gemm on new threads (lazy per-thread config)", test_gemm_threads);
    if (!hw) {
        CU_add_test(s, "tiles released behind the kernel's back fault", test_emu_release_behind_back);
        CU_add_test(s, "dispatch: table, names, IE_ISA=amx", test_dispatch);
        CU_add_test(s, "small steps: AMX table == AVX-512 bit for bit", test_small_steps_avx512);
        if (ie_amx_emulated()) {
            CU_add_test(s, "AMX table matmul_packed (emulated) vs ref (1-37 tokens)", test_hw_table);
            CU_add_test(s, "AMX table mxfp4 slot (emulated), its activation rows (1-37 tokens)", test_table_mxfp4);
        }
    } else {
        CU_add_test(s, "AMX table matmul_packed vs ref (1-37 tokens)", test_hw_table);
        if (bf16) CU_add_test(s, "AMX table mxfp4 slot, its activation rows (1-37 tokens)", test_table_mxfp4);
    }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

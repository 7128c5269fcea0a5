/* test_pack.c — engine-native packed weights (ie_pack.h): quantizers,
 * PANEL16 repacking, Q8_P / Q16_P activations and matmul_packed of every
 * ISA (I8W weights take Q16_P activations, I4W/I4WA Q8_P).
 *
 * Tolerances (stated once, used below):
 *   repack of Q8_0/Q4_0/Q4_1: lossless, dequantized bit for bit.
 *   ie_pack_quantize with group 32 (absmax): the same bytes as
 *       ie_quantize_row(Q8_0/Q4_0/Q4_1) + repack (ggml's rules exactly).
 *   ROWS vs PANEL16 quantization: identical dequantized bits, every group.
 *   quantize -> dequantize, per element (d, m the group's f32 parameters):
 *       I8W 0.5|d| + amax*2^-11; I4W |d| + 8|d|*2^-10 (the clipped end);
 *       I4WA 0.5d + 2^-10*(|min| + 16d).
 *   IE_QSCALE_MSE: total squared error <= absmax's (x (1 + 1e-12)).
 *   Q8_P / Q16_P act_quantize: the definition (ie_pack.h) exactly, and bit
 *       for bit equal across ISAs.
 *   matmul_packed: |y - oracle| <= 1e-5 * T + 1e-30 where the oracle sums
 *       W[r][k]*A[t][k] in double from dequantized weights and activations,
 *       and T is the sum of |terms| the kernels form: per block
 *       |d_w*d_a| sum_j |c_j*qa_j| + off*|d_w*s_b| (+|m_w*s_b|), with c the
 *       stored code and off 128 (I8W) / 8 (I4W) / 0 (I4WA): kernels take
 *       the exact integer dot of the stored codes and subtract off*s_b
 *       (s_b the f32 block sum of Q8_P/Q16_P), so rounding scales with those.
 *       With unit scales (every partial sum an integer < 2^24) every ISA
 *       must give the exact result, bit for bit.
 */
#include "ie_kernels.h"
#include "ie_test_panel.h"
#include "../../kernels/src/ie_kernels_isa.h"
#include "ie_test_rng.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------- helpers */


/* Gaussian (Box-Muller) with ~1% outliers 6-10x larger. */
static void fill_gauss(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const double u1 = ((double)rng_u32() + 1.0) / 4294967297.0, u2 = (double)rng_u32() / 4294967296.0;
        double v = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        if (rng_u32() % 100 == 0) v *= 6.0 + 4.0 * (rng_f() + 1.0) / 2.0;
        x[i] = (float)v;
    }
}

static int n_isas(ie_isa_t *isas)
{
    int n = 0;
    for (int i = IE_ISA_REF; i <= IE_ISA_AMX; i++)
        if (ie_kernels_get((ie_isa_t)i)) isas[n++] = (ie_isa_t)i;
    return n;
}

static const ie_dtype_t ITYPES[] = {IE_DTYPE_I8W, IE_DTYPE_I4W, IE_DTYPE_I4WA};

/* The ggml type a group-32 I-type is byte-identical to. */
static ie_dtype_t ggml_twin(ie_dtype_t t)
{
    return t == IE_DTYPE_I8W ? IE_DTYPE_Q8_0 : t == IE_DTYPE_I4W ? IE_DTYPE_Q4_0 : IE_DTYPE_Q4_1;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    CU_ASSERT_FATAL(p != NULL);
    return p;
}

/* 64-byte aligned, filled with a pattern so that unwritten bytes show. */
static void *palloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    CU_ASSERT_FATAL(p != NULL);
    memset(p, 0xa5, (n + 63) / 64 * 64);
    return p;
}


/* Fields of one activation row of format at (Q8_P: int8 quants, Q16_P:
 * int16), read independently of the kernels from the ie_pack.h layout. */
static size_t a_qbytes(ie_dtype_t at) { return at == IE_DTYPE_Q16_P ? 2 : 1; }
static int a_q(ie_dtype_t at, const uint8_t *row, int64_t k)
{
    if (at == IE_DTYPE_Q8_P) return (int8_t)row[k];
    int16_t v;
    memcpy(&v, row + 2 * k, 2);
    return v;
}
static float a_d(ie_dtype_t at, const uint8_t *row, int64_t n_in, int64_t b)
{
    float f;
    memcpy(&f, row + a_qbytes(at) * (size_t)n_in + 4 * b, 4);
    return f;
}
static float a_s(ie_dtype_t at, const uint8_t *row, int64_t n_in, int64_t b)
{
    float f;
    memcpy(&f, row + a_qbytes(at) * (size_t)n_in + 4 * (n_in / 32) + 4 * b, 4);
    return f;
}

/* ------------------------------------------------------------ repack */

/* Q8_0 / Q4_0 / Q4_1 rows repacked to PANEL16 dequantize to the same bits;
 * repacking in 16-row pieces writes the same bytes as in one go; padding
 * rows are zeros. */
static void test_repack_lossless(void)
{
    static const int64_t nins[] = {32, 96, 256}, nouts[] = {1, 16, 17, 40};
    int bad = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 4; b++) {
                const ie_dtype_t gt = ggml_twin(ITYPES[ti]);
                const int64_t n_in = nins[a], n_out = nouts[b];
                CU_ASSERT_EQUAL(ie_pack_target(gt), ITYPES[ti]);
                const size_t rb = ie_dtype_row_bytes(gt, n_in), pb = ie_pack_bytes(ITYPES[ti], 32, n_in, n_out);
                const int64_t n_pad = (n_out + 15) / 16 * 16;
                float *x = xmalloc(sizeof(float) * (size_t)n_in), *x1 = xmalloc(sizeof(float) * (size_t)n_in),
                      *x2 = xmalloc(sizeof(float) * (size_t)n_in);
                uint8_t *w = xmalloc(rb * (size_t)n_out), *p = palloc(pb), *p2 = palloc(pb);
                rng_seed(100 + (uint64_t)(ti * 16 + a * 4 + b));
                for (int64_t r = 0; r < n_out; r++) {
                    rng_fill(x, n_in);
                    ie_quantize_row(gt, x, w + (size_t)r * rb, n_in);
                }
                CU_ASSERT_EQUAL(ie_pack_repack(gt, 32, w, n_in, 0, n_out, n_out, p), 0);
                for (int64_t r0 = 0; r0 < n_out; r0 += 16) {
                    const int64_t r1 = r0 + 16 < n_out ? r0 + 16 : n_out;
                    CU_ASSERT_EQUAL(ie_pack_repack(gt, 0, w, n_in, r0, r1, n_out, p2), 0);
                }
                CU_ASSERT(memcmp(p, p2, pb) == 0);
                const ie_pmat_t m = {ITYPES[ti], 32, n_in, n_out, p};
                const ie_pmat_t mp = {ITYPES[ti], 32, n_in, n_pad, p}; /* sees the padding rows */
                for (int64_t r = 0; r < n_pad; r++) {
                    if (r < n_out) {
                        ie_dequantize_row(gt, w + (size_t)r * rb, x1, n_in);
                        ie_pack_dequant_row(&m, r, x2);
                        if (memcmp(x1, x2, sizeof(float) * (size_t)n_in) != 0) bad++;
                    } else {
                        ie_pack_dequant_row(&mp, r, x2);
                        for (int64_t k = 0; k < n_in; k++)
                            if (x2[k] != 0.0f) bad++;
                    }
                }
                free(x);
                free(x1);
                free(x2);
                free(w);
                free(p);
                free(p2);
            }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(ie_pack_target(IE_DTYPE_I4W), IE_DTYPE_I4W);
    CU_ASSERT_EQUAL(ie_pack_target(IE_DTYPE_F32), IE_DTYPE_INVALID);
    CU_ASSERT_EQUAL(ie_pack_target(IE_DTYPE_MXFP4), IE_DTYPE_MXFP4); /* IQ4_NL's panels (test_kquant_pack) */
    CU_ASSERT_EQUAL(ie_pack_target(IE_DTYPE_Q8_P), IE_DTYPE_INVALID);
}

/* ---------------------------------------------------------- quantizers */

/* Group 32, absmax: ROWS bytes equal ggml's Q8_0/Q4_0/Q4_1, and the panel
 * equals quantize-to-ggml + repack, byte for byte. */
static void test_quantize_matches_ggml(void)
{
    const int64_t n_in = 256, n_out = 37;
    float *x = xmalloc(sizeof(float) * (size_t)(n_in * n_out));
    for (int ti = 0; ti < 3; ti++) {
        const ie_dtype_t t = ITYPES[ti], gt = ggml_twin(t);
        const size_t rb = ie_dtype_row_bytes(gt, n_in), pb = ie_pack_bytes(t, 32, n_in, n_out);
        CU_ASSERT_EQUAL(ie_qrow_bytes(t, 32, n_in), rb);
        uint8_t *g = xmalloc(rb * (size_t)n_out), *q = xmalloc(rb * (size_t)n_out), *p1 = palloc(pb),
                *p2 = palloc(pb);
        rng_seed(200 + (uint64_t)ti);
        rng_fill(x, n_in * n_out);
        for (int64_t i = 0; i < 32; i++) x[3 * n_in + i] = 0.0f; /* an all-zero block */
        for (int64_t r = 0; r < n_out; r++) {
            ie_quantize_row(gt, x + r * n_in, g + (size_t)r * rb, n_in);
            CU_ASSERT_EQUAL(ie_qrow_quantize(t, 32, IE_QSCALE_ABSMAX, x + r * n_in, n_in, q + (size_t)r * rb), 0);
        }
        CU_ASSERT(memcmp(g, q, rb * (size_t)n_out) == 0);
        CU_ASSERT_EQUAL(ie_pack_repack(gt, 32, g, n_in, 0, n_out, n_out, p1), 0);
        CU_ASSERT_EQUAL(ie_pack_quantize(t, 32, IE_QSCALE_ABSMAX, x, n_in, 0, n_out, n_out, p2), 0);
        CU_ASSERT(memcmp(p1, p2, pb) == 0);
        free(g);
        free(q);
        free(p1);
        free(p2);
    }
    free(x);
}

/* Error bound of one element (see the header), from the group's values. */
static double elem_bound(ie_dtype_t t, const float *xg, int G)
{
    float amax = 0.0f, max = 0.0f, mn = xg[0], mx = xg[0];
    for (int j = 0; j < G; j++) {
        if (fabsf(xg[j]) > amax) {
            amax = fabsf(xg[j]);
            max = xg[j];
        }
        if (xg[j] < mn) mn = xg[j];
        if (xg[j] > mx) mx = xg[j];
    }
    if (t == IE_DTYPE_I8W) return 0.5 * amax / 127.0 * (1 + 1e-6) + amax * ldexp(1.0, -11);
    if (t == IE_DTYPE_I4W) return fabs(max / 8.0) * (1 + 8 * ldexp(1.0, -10)) * (1 + 1e-6);
    const double d = (mx - mn) / 15.0;
    return 0.5 * d * (1 + 1e-6) + ldexp(1.0, -10) * (fabs(mn) + 16 * d);
}

/* Every group size: ROWS quantize/dequantize agrees bit for bit with the
 * panel (ie_pack_quantize, and ie_pack_repack of the ROWS bytes), for both
 * scale rules; absmax errors stay within the bound; quantizing a matrix in
 * 16-row pieces writes the same bytes as in one go. */
static void test_rows_vs_panel(void)
{
    static const int64_t nins[] = {128, 384};
    int bad = 0, bad_bound = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int a = 0; a < 2; a++)
            for (int gi = 0; gi < 4; gi++)
                for (int how = 0; how < 2; how++) {
                    const ie_dtype_t t = ITYPES[ti];
                    const int64_t n_in = nins[a], n_out = 35;
                    const int G = gi < 3 ? 32 << gi : (int)n_in;
                    if (n_in % G) continue;
                    const size_t rb = ie_qrow_bytes(t, G, n_in), pb = ie_pack_bytes(t, G, n_in, n_out);
                    CU_ASSERT_FATAL(rb > 0 && pb > 0);
                    CU_ASSERT_EQUAL(ie_tensor_bytes(t, IE_LAYOUT_PANEL16, G, n_in, n_out), pb);
                    float *x = xmalloc(sizeof(float) * (size_t)(n_in * n_out));
                    float *x1 = xmalloc(sizeof(float) * (size_t)n_in), *x2 = xmalloc(sizeof(float) * (size_t)n_in);
                    uint8_t *rows = xmalloc(rb * (size_t)n_out), *p = palloc(pb), *p2 = palloc(pb),
                            *p3 = palloc(pb);
                    rng_seed(300 + (uint64_t)(ti * 64 + a * 16 + gi * 2 + how));
                    rng_fill(x, n_in * n_out);
                    const ie_qscale_t qs = how ? IE_QSCALE_MSE : IE_QSCALE_ABSMAX;
                    for (int64_t r = 0; r < n_out; r++)
                        CU_ASSERT_EQUAL(ie_qrow_quantize(t, G, qs, x + r * n_in, n_in, rows + (size_t)r * rb), 0);
                    CU_ASSERT_EQUAL(ie_pack_quantize(t, G, qs, x, n_in, 0, n_out, n_out, p), 0);
                    CU_ASSERT_EQUAL(ie_pack_quantize(t, G, qs, x, n_in, 16, 32, n_out, p2), 0);
                    CU_ASSERT_EQUAL(ie_pack_quantize(t, G, qs, x, n_in, 32, n_out, n_out, p2), 0);
                    CU_ASSERT_EQUAL(ie_pack_quantize(t, G, qs, x, n_in, 0, 16, n_out, p2), 0);
                    CU_ASSERT(memcmp(p, p2, pb) == 0);
                    CU_ASSERT_EQUAL(ie_pack_repack(t, G, rows, n_in, 0, n_out, n_out, p3), 0);
                    CU_ASSERT(memcmp(p, p3, pb) == 0);
                    const ie_pmat_t m = {t, G, n_in, n_out, p};
                    for (int64_t r = 0; r < n_out; r++) {
                        ie_qrow_dequantize(t, G, rows + (size_t)r * rb, x1, n_in);
                        ie_pack_dequant_row(&m, r, x2);
                        if (memcmp(x1, x2, sizeof(float) * (size_t)n_in) != 0) bad++;
                        if (how == 0)
                            for (int64_t k = 0; k < n_in; k++) {
                                const float *xg = x + r * n_in + k / G * G;
                                if (!(fabs((double)x1[k] - x[r * n_in + k]) <= elem_bound(t, xg, G))) {
                                    if (bad_bound < 3)
                                        printf("\n  %s G=%d r=%lld k=%lld x=%g deq=%g bound=%g", ie_dtype_name(t),
                                               G, (long long)r, (long long)k, x[r * n_in + k], x1[k],
                                               elem_bound(t, xg, G));
                                    bad_bound++;
                                }
                            }
                    }
                    free(x);
                    free(x1);
                    free(x2);
                    free(rows);
                    free(p);
                    free(p2);
                    free(p3);
                }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(bad_bound, 0);
}

/* Bad shapes and ranges are refused. */
static void test_quantize_bad_args(void)
{
    float x[256] = {0};
    uint8_t buf[8192];
    CU_ASSERT_EQUAL(ie_qrow_quantize(IE_DTYPE_I8W, 48, IE_QSCALE_ABSMAX, x, 96, buf), -1);
    CU_ASSERT_EQUAL(ie_qrow_quantize(IE_DTYPE_I8W, 64, IE_QSCALE_ABSMAX, x, 96, buf), -1);
    CU_ASSERT_EQUAL(ie_qrow_quantize(IE_DTYPE_Q8_0, 32, IE_QSCALE_ABSMAX, x, 96, buf), -1);
    CU_ASSERT_EQUAL(ie_pack_quantize(IE_DTYPE_I4W, 32, IE_QSCALE_ABSMAX, x, 32, 8, 8, 8, buf), -1);   /* r0 % 16 */
    CU_ASSERT_EQUAL(ie_pack_quantize(IE_DTYPE_I4W, 32, IE_QSCALE_ABSMAX, x, 32, 0, 20, 40, buf), -1); /* r1 */
    CU_ASSERT_EQUAL(ie_pack_quantize(IE_DTYPE_I4W, 32, IE_QSCALE_ABSMAX, x, 32, 0, 48, 40, buf),
                    -1); /* r1 > n_out */
    CU_ASSERT_EQUAL(ie_pack_quantize(IE_DTYPE_I4W, 32, IE_QSCALE_ABSMAX, x, 32, 32, 16, 40, buf), -1);
    CU_ASSERT_EQUAL(ie_pack_quantize(IE_DTYPE_F32, 32, IE_QSCALE_ABSMAX, x, 32, 0, 1, 1, buf), -1);
    CU_ASSERT_EQUAL(ie_pack_quantize(IE_DTYPE_I4W, 32, IE_QSCALE_ABSMAX, x, 32, 0, 8, 8, buf), 0);
    CU_ASSERT_EQUAL(ie_pack_repack(IE_DTYPE_F32, 32, buf, 32, 0, 1, 1, buf + 4096), -1);
    CU_ASSERT_EQUAL(ie_pack_repack(IE_DTYPE_F16, 32, buf, 48, 0, 1, 1, buf + 4096), -1); /* n_in % 32 */
    CU_ASSERT_EQUAL(ie_pack_repack(IE_DTYPE_Q8_0, 32, buf, 48, 0, 1, 1, buf + 4096), -1);
    CU_ASSERT_EQUAL(ie_pack_repack(IE_DTYPE_Q8_0, 32, buf, 32, 16, 17, 20, buf + 4096), -1);
}

/* MSE scales never lose to absmax, and help clearly on 4-bit data with
 * outliers. */
static void test_mse_scales(void)
{
    const int64_t n_in = 512, n_out = 48;
    float *x = xmalloc(sizeof(float) * (size_t)(n_in * n_out)), *xr = xmalloc(sizeof(float) * (size_t)n_in);
    rng_seed(400);
    fill_gauss(x, n_in * n_out);
    for (int ti = 0; ti < 3; ti++)
        for (int gi = 0; gi < 3; gi++) {
            const ie_dtype_t t = ITYPES[ti];
            const int G = 32 << (gi * 2); /* 32, 128, 512 */
            const size_t pb = ie_pack_bytes(t, G, n_in, n_out);
            uint8_t *pa = palloc(pb), *pm = palloc(pb);
            CU_ASSERT_EQUAL(ie_pack_quantize(t, G, IE_QSCALE_ABSMAX, x, n_in, 0, n_out, n_out, pa), 0);
            CU_ASSERT_EQUAL(ie_pack_quantize(t, G, IE_QSCALE_MSE, x, n_in, 0, n_out, n_out, pm), 0);
            const ie_pmat_t ma = {t, G, n_in, n_out, pa}, mm = {t, G, n_in, n_out, pm};
            double ea = 0, em = 0;
            int worse_rows = 0;
            for (int64_t r = 0; r < n_out; r++) {
                double ra = 0, rm = 0;
                ie_pack_dequant_row(&ma, r, xr);
                for (int64_t k = 0; k < n_in; k++)
                    ra += ((double)xr[k] - x[r * n_in + k]) * ((double)xr[k] - x[r * n_in + k]);
                ie_pack_dequant_row(&mm, r, xr);
                for (int64_t k = 0; k < n_in; k++)
                    rm += ((double)xr[k] - x[r * n_in + k]) * ((double)xr[k] - x[r * n_in + k]);
                if (rm > ra * (1 + 1e-12)) worse_rows++;
                ea += ra;
                em += rm;
            }
            CU_ASSERT_EQUAL(worse_rows, 0);
            CU_ASSERT(em <= ea * (1 + 1e-12));
            if (t != IE_DTYPE_I8W) CU_ASSERT(em < 0.98 * ea); /* 4-bit: clipping pays */
            printf("\n    %s G=%d: mse/absmax squared error %.3f", ie_dtype_name(t), G, em / ea);
            free(pa);
            free(pm);
        }
    free(x);
    free(xr);
}

/* ----------------------------------------------- Q8_P / Q16_P activations */

/* One activation format (Q8_P: qmax 127, Q16_P: 32767): the reference
 * matches the definition spelled out here (d = amax/qmax, q = roundf(x *
 * (1/d)) with ties away from zero, zeros when d = 0 or 1/d overflows,
 * s = (float)sum(q)*d), and every ISA's act_quantize writes the same bytes.
 * Rounds: random; exact ties (d = 1, x = k + 0.5); all-zero blocks; tiny
 * values (1/d overflowing, subnormal d); values whose amax is qmax times a
 * power of two (d exact, every x*(1/d) an integer or a tie); near-ties just
 * below/above k + 0.5. */
static void check_act_format(ie_dtype_t at, int64_t n)
{
    ie_isa_t isas[4];
    const int ni = n_isas(isas);
    const int wide = at == IE_DTYPE_Q16_P;
    const float qmax = wide ? 32767.0f : 127.0f;
    const size_t nb = ie_dtype_row_bytes(at, n);
    CU_ASSERT_EQUAL(nb, a_qbytes(at) * (size_t)n + 8 * (size_t)(n / 32));
    float *x = xmalloc(sizeof(float) * (size_t)n);
    uint8_t *ref = xmalloc(nb), *got = xmalloc(nb);
    const int qm = (int)qmax;
    for (int round = 0; round < 7; round++) {
        rng_seed(555 + (uint64_t)round + (wide ? 100 : 0));
        rng_fill(x, n);
        if (round == 1) /* exact ties: amax qmax makes d = 1, so k + 0.5 must round away */
            for (int64_t i = 0; i < n; i++)
                x[i] = (i % 32 == 0) ? (i % 64 ? -qmax : qmax)
                                     : (float)((int)(rng_u32() % (uint32_t)(2 * qm - 1)) - (qm - 1)) + 0.5f;
        if (round == 2)
            for (int64_t i = 64 < n ? 64 : 0; i < 128 && i < n; i++) x[i] = 0.0f;
        if (round == 3)
            for (int64_t i = 0; i < n; i++)
                x[i] *= (i < 320 ? 1e-38f : i < 640 ? 1e-36f : i < 960 ? 1e-34f : 1e-30f);
        if (round == 4) /* amax = qmax * 2^e: d = 2^e exactly, integer multiples and ties of it */
            for (int64_t i = 0; i < n; i++) {
                const float p2 = ldexpf(1.0f, (int)(i / 32 % 40) - 20);
                x[i] = p2 * ((i % 32 == 7)
                                 ? qmax
                                 : (float)((int)(rng_u32() % (uint32_t)(2 * qm + 1)) - qm) * (i % 3 ? 1.0f : 0.5f));
            }
        if (round == 5) /* one value per block is amax; the rest near ties */
            for (int64_t i = 0; i < n; i++)
                x[i] = (i % 32 == 3)
                           ? qmax
                           : nextafterf((float)((int)(rng_u32() % 200) - 100) + 0.5f, (i & 1) ? 1e9f : -1e9f);
        if (round == 6)
            for (int64_t i = 0; i < n; i++) x[i] = (i % 32 == 0) ? 1e-3f : 0.0f; /* single non-zero */
        memset(ref, 0xcd, nb);
        ie_act_quantize_ref(at, x, ref, n);
        /* the definition, spelled out */
        int bad = 0;
        for (int64_t b = 0; b < n / 32; b++) {
            float amax = 0.0f;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
            const float d = amax / qmax, id = d != 0.0f && !isinf(1.0f / d) ? 1.0f / d : 0.0f;
            int sum = 0;
            for (int j = 0; j < 32; j++) {
                const int q = (int)roundf(x[b * 32 + j] * id);
                if (q < -qm || q > qm || a_q(at, ref, b * 32 + j) != q) bad++;
                sum += q;
            }
            if (a_d(at, ref, n, b) != d || a_s(at, ref, n, b) != (float)sum * d) bad++;
        }
        if (bad) printf("\n  %s round %d: %d values off the definition", ie_dtype_name(at), round, bad);
        CU_ASSERT_EQUAL(bad, 0);
        for (int i = 0; i < ni; i++) {
            memset(got, 0xab, nb);
            ie_kernels_get(isas[i])->act_quantize(at, x, got, n);
            const int same = memcmp(ref, got, nb) == 0;
            if (!same)
                printf("\n  act_quantize %s %s round %d differs", ie_isa_name(isas[i]), ie_dtype_name(at), round);
            CU_ASSERT(same);
        }
    }
    free(x);
    free(ref);
    free(got);
}

static void test_act_formats(void)
{
    CU_ASSERT_EQUAL(ie_matmul_act_dtype(IE_DTYPE_I8W), IE_DTYPE_Q16_P);
    CU_ASSERT_EQUAL(ie_matmul_act_dtype(IE_DTYPE_I4W), IE_DTYPE_Q8_P);
    CU_ASSERT_EQUAL(ie_matmul_act_dtype(IE_DTYPE_I4WA), IE_DTYPE_Q8_P);
    /* 67 blocks: AVX-512 quantizes 16 blocks at a time, then a part of 3;
     * also a single block, a part alone, and exactly 16 and 32 */
    static const int64_t blocks[] = {67, 1, 5, 16, 32};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
        check_act_format(IE_DTYPE_Q8_P, 32 * blocks[i]);
        check_act_format(IE_DTYPE_Q16_P, 32 * blocks[i]);
    }
}

/* act_quantize_stream writes act_quantize's bytes (the reference's) on
 * every ISA, for the formats that stream on AVX-512 (BF16, Q8_P, Q16_P)
 * and one that does not (Q8_0): output at 64-byte aligned, 32-byte
 * aligned and odd-by-8 addresses (the streaming paths and their plain
 * fallbacks), lengths with whole and partial 16-block groups; nothing
 * is written outside the row. */
static void test_act_stream(void)
{
    ie_isa_t isas[4];
    const int ni = n_isas(isas);
    static const ie_dtype_t acts[] = {IE_DTYPE_BF16, IE_DTYPE_Q8_P, IE_DTYPE_Q16_P, IE_DTYPE_Q8_0};
    static const int64_t ns[] = {32, 160, 512, 2080, 5632};
    static const size_t offs[] = {0, 32, 8};
    float *x = xmalloc(sizeof(float) * 5632);
    uint8_t *ref = xmalloc(16384), *buf = aligned_alloc(64, 16384 + 128);
    CU_ASSERT_FATAL(buf != NULL);
    int bad = 0, ran = 0;
    for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            const int64_t n = ns[k];
            const size_t nb = ie_dtype_row_bytes(acts[a], n);
            rng_seed(900 + a * 10 + k);
            rng_fill(x, n);
            ie_act_quantize_ref(acts[a], x, ref, n);
            for (int i = 0; i < ni; i++)
                for (size_t o = 0; o < sizeof offs / sizeof offs[0]; o++) {
                    memset(buf, 0xab, 16384 + 128);
                    ie_kernels_get(isas[i])->act_quantize_stream(acts[a], x, buf + offs[o], n);
                    int e = memcmp(buf + offs[o], ref, nb) != 0;
                    for (size_t j = 0; j < offs[o]; j++) e |= buf[j] != 0xab;
                    for (size_t j = offs[o] + nb; j < offs[o] + nb + 64; j++) e |= buf[j] != 0xab;
                    if (e)
                        printf("\n  act_quantize_stream %s %s n %lld offset %zu differs", ie_isa_name(isas[i]),
                               ie_dtype_name(acts[a]), (long long)n, offs[o]);
                    bad += e;
                    ran++;
                }
        }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(ran >= 4 * 5 * 3);
    free(x);
    free(ref);
    free(buf);
}

/* Q16_P rounding on every ISA: d = 1 (amax 32767 in each block), and x =
 * k + 0.5 and its float neighbours (up to 2 ulps either way), k over the
 * whole range and densely near 0: ties and near-ties. */
static void test_q16p_rounding_sweep(void)
{
    ie_isa_t isas[4];
    const int ni = n_isas(isas);
    const int64_t n = 32 * 1024;
    const size_t nb = ie_dtype_row_bytes(IE_DTYPE_Q16_P, n);
    float *x = xmalloc(sizeof(float) * (size_t)n);
    uint8_t *ref = xmalloc(nb), *got = xmalloc(nb);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) {
            x[i] = 32767.0f;
            continue;
        }
        /* odd i: k anywhere in [-32766, 32766]; even i: |k| < 64, where
         * the sum k + 0.5 crosses binades (a naive +0.5 rounds wrong) */
        const int k = i & 1 ? (int)((i * 2654435761u) % 65533u) - 32766 : (int)((i * 40503u) % 127u) - 63;
        float v = (float)k + 0.5f;
        for (int s = (int)(i % 5) - 2; s < 0; s++) v = nextafterf(v, 0.0f);
        for (int s = (int)(i % 5) - 2; s > 0; s--) v = nextafterf(v, 1e9f);
        x[i] = v;
    }
    ie_act_quantize_ref(IE_DTYPE_Q16_P, x, ref, n);
    for (int64_t i = 0; i < n; i++)
        if (a_q(IE_DTYPE_Q16_P, ref, i) != (int)roundf(x[i])) bad++;
    CU_ASSERT_EQUAL(bad, 0);
    for (int i = 0; i < ni; i++) {
        memset(got, 0xab, nb);
        ie_kernels_get(isas[i])->act_quantize(IE_DTYPE_Q16_P, x, got, n);
        CU_ASSERT(memcmp(ref, got, nb) == 0);
    }
    free(x);
    free(ref);
    free(got);
}

/* ------------------------------------------------------ matmul_packed */

/* Memory whose last byte is followed by an inaccessible page. */
typedef struct {
    uint8_t *base;
    size_t len;
} guarded_t;

static void *guarded_alloc(guarded_t *g, size_t n, size_t align)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    const size_t rn = (n + align - 1) / align * align;
    g->len = (rn + pg - 1) / pg * pg + pg;
    g->base = mmap(NULL, g->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CU_ASSERT_FATAL(g->base != MAP_FAILED);
    CU_ASSERT_FATAL(mprotect(g->base + g->len - pg, pg, PROT_NONE) == 0);
    return g->base + g->len - pg - rn;
}

static void guarded_free(guarded_t *g) { munmap(g->base, g->len); }

#define SENTINEL (-12345.0f)
#define GUARD_FLOATS 32

typedef struct {
    ie_dtype_t t;
    int G;
    int64_t n_in, n_out, n_tok, r0, r1;
    int mse, ldy_extra, as_extra;
    uint64_t seed;
} mcase_t;

/* One matmul case on every ISA; returns the number of bad values. */
static int check_packed_case(const mcase_t *c)
{
    ie_isa_t isas[4];
    const int ni = n_isas(isas);
    const int64_t n_in = c->n_in, n_out = c->n_out, n_tok = c->n_tok, nb = n_in / 32;
    const int64_t ldy = n_out + c->ldy_extra;
    const size_t pb = ie_pack_bytes(c->t, c->G, n_in, n_out);
    const ie_dtype_t at = ie_matmul_act_dtype(c->t); /* I8W: Q16_P, else Q8_P */
    const size_t arow = ie_dtype_row_bytes(at, n_in), as = arow + (size_t)c->as_extra;
    const size_t ny = (size_t)(ldy * n_tok) + GUARD_FLOATS;
    const double off = c->t == IE_DTYPE_I8W ? 128.0 : c->t == IE_DTYPE_I4W ? 8.0 : 0.0;
    guarded_t gw, ga;
    uint8_t *w = guarded_alloc(&gw, pb, 64);
    uint8_t *a = guarded_alloc(&ga, as * (size_t)(n_tok - 1) + arow, 4);
    float *x = xmalloc(sizeof(float) * (size_t)(n_in * (n_out > n_tok ? n_out : n_tok)));
    float *wf = xmalloc(sizeof(float) * (size_t)(n_in * n_out));
    double *af = xmalloc(sizeof(double) * (size_t)(n_in * n_tok));
    double *yo = xmalloc(sizeof(double) * (size_t)(n_out * n_tok)),
           *tol = xmalloc(sizeof(double) * (size_t)(n_out * n_tok));
    float *y = xmalloc(sizeof(float) * ny), *yref = xmalloc(sizeof(float) * ny);
    rng_seed(c->seed);
    rng_fill(x, n_in * n_out);
    CU_ASSERT_EQUAL_FATAL(ie_pack_quantize(c->t, c->G, c->mse ? IE_QSCALE_MSE : IE_QSCALE_ABSMAX, x, n_in, 0, n_out,
                                           n_out, w),
                          0);
    rng_fill(x, n_in * n_tok);
    for (int64_t t = 0; t < n_tok; t++) ie_act_quantize_ref(at, x + t * n_in, a + (size_t)t * as, n_in);
    const ie_pmat_t m = {c->t, c->G, n_in, n_out, w};
    for (int64_t r = 0; r < n_out; r++) ie_pack_dequant_row(&m, r, wf + r * n_in);
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t k = 0; k < n_in; k++) {
            const uint8_t *ar = a + (size_t)t * as;
            af[t * n_in + k] = (double)a_d(at, ar, n_in, k / 32) * a_q(at, ar, k);
        }
    /* oracle and tolerance */
    for (int64_t t = 0; t < n_tok; t++) {
        const uint8_t *ar = a + (size_t)t * as;
        for (int64_t r = c->r0; r < c->r1; r++) {
            double s = 0.0, T = 0.0;
            for (int64_t k = 0; k < n_in; k++) s += (double)wf[r * n_in + k] * af[t * n_in + k];
            for (int64_t b = 0; b < nb; b++) {
                const double dw = p_scale(&m, r, b * 32 / c->G, 0);
                const double mw = c->t == IE_DTYPE_I4WA ? p_scale(&m, r, b * 32 / c->G, 1) : 0.0;
                const double da = a_d(at, ar, n_in, b), sa = a_s(at, ar, n_in, b);
                double si = 0.0;
                for (int64_t k = b * 32; k < b * 32 + 32; k++)
                    si += fabs((double)p_code(&m, r, k) * a_q(at, ar, k));
                T += fabs(dw * da) * si + off * fabs(dw * sa) + fabs(mw * sa);
            }
            yo[t * n_out + r] = s;
            tol[t * n_out + r] = 1e-5 * T + 1e-30;
        }
    }
    int bad = 0;
    for (int i = 0; i < ni; i++) {
        float *yy = i == 0 ? yref : y;
        for (size_t j = 0; j < ny; j++) yy[j] = SENTINEL;
        const int rc = ie_kernels_get(isas[i])->matmul_packed(&m, c->r0, c->r1, a, as, n_tok, yy, ldy);
        CU_ASSERT_EQUAL(rc, 0);
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < ldy; r++) {
                const float v = yy[t * ldy + r];
                if (r < c->r0 || r >= c->r1) {
                    if (v != SENTINEL) bad++;
                    continue;
                }
                const double e = fabs((double)v - yo[t * n_out + r]);
                /* vs the oracle, and (SIMD) vs ref within twice that */
                const int ok = e <= tol[t * n_out + r] &&
                               (i == 0 || fabs((double)v - yref[t * ldy + r]) <= 2 * tol[t * n_out + r]);
                if (!ok) {
                    if (bad < 4)
                        printf("\n  %s %s G=%d n_in=%lld n_out=%lld n_tok=%lld [%lld,%lld): y[%lld][%lld]=%.9g "
                               "oracle=%.9g ref=%.9g tol=%.3g",
                               ie_isa_name(isas[i]), ie_dtype_name(c->t), c->G, (long long)n_in, (long long)n_out,
                               (long long)n_tok, (long long)c->r0, (long long)c->r1, (long long)t, (long long)r, v,
                               yo[t * n_out + r], yref[t * ldy + r], tol[t * n_out + r]);
                    bad++;
                }
            }
        for (size_t j = (size_t)(ldy * n_tok); j < ny; j++)
            if (yy[j] != SENTINEL) bad++;
    }
    guarded_free(&gw);
    guarded_free(&ga);
    free(x);
    free(wf);
    free(af);
    free(yo);
    free(tol);
    free(y);
    free(yref);
    return bad;
}

/* Odd shapes: every (type, n_in, valid group), n_out and n_tok cycling
 * through their lists, whole and sub-ranges, ldy > n_out and a_stride >
 * row bytes. */
static void test_matmul_packed_shapes(void)
{
    static const int64_t nouts[] = {1, 15, 16, 17, 33, 100, 130};
    static const int64_t nins[] = {32, 64, 96, 160, 512, 576, 1024};
    static const int64_t ntoks[] = {1, 2, 3, 5, 7, 8, 13, 19, 33};
    int bad = 0, cases = 0, k = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int a = 0; a < 7; a++)
            for (int gi = 0; gi < 4; gi++) {
                const int64_t n_in = nins[a];
                const int G = gi < 3 ? 32 << gi : (int)n_in;
                if (n_in % G || (gi == 3 && (G == 32 || G == 64 || G == 128))) continue;
                for (int rep = 0; rep < 3; rep++, k++) {
                    mcase_t c = {
                        ITYPES[ti],   G,         n_in,        nouts[k % 7],      ntoks[(k * 4 + rep) % 9], 0, 0,
                        (k % 5) == 0, 1 + k % 7, 4 * (k % 5), 1000 + (uint64_t)k};
                    if (n_in >= 512 && c.n_tok > 13) c.n_tok = 13; /* keep the oracle quick */
                    c.r1 = c.n_out;
                    if (rep > 0 && c.n_out > 16) { /* a sub-range */
                        const int64_t np = (c.n_out + 15) / 16;
                        c.r0 = 16 * (k % np);
                        c.r1 = (k & 2) ? c.n_out : c.r0 + 16 * (1 + k % 2);
                        if (c.r1 > c.n_out) c.r1 = c.n_out;
                    }
                    bad += check_packed_case(&c);
                    cases++;
                }
            }
    /* every n_tok with every type on a mid shape */
    for (int ti = 0; ti < 3; ti++)
        for (int j = 0; j < 9; j++, k++) {
            mcase_t c = {ITYPES[ti], 64, 192, 33, ntoks[j], 16, 33, 0, 3, 12, 5000 + (uint64_t)k};
            bad += check_packed_case(&c);
            cases++;
        }
    printf("\n    %d cases", cases);
    CU_ASSERT_EQUAL(bad, 0);
}

/* matmul_packed_ranges == matmul_packed, bit for bit, on every ISA: the
 * panels handed out as shuffled ranges of 1-5 panels, on decode-sized token
 * counts (one pack for all ranges), on more tokens than a tile and on more
 * k than one pass (one call per range). A bad range is refused. */
typedef struct {
    int64_t r[64][2];
    int n, at;
} rsrc_t;

static int rsrc_next(void *ctx, int64_t *p0, int64_t *p1)
{
    rsrc_t *s = ctx;
    if (s->at >= s->n) return 0;
    *p0 = s->r[s->at][0];
    *p1 = s->r[s->at][1];
    s->at++;
    return 1;
}

static void test_matmul_packed_ranges(void)
{
    static const int64_t nouts[] = {1, 17, 130, 200};
    static const int64_t nins[] = {64, 2048, 6400};
    static const int64_t ntoks[] = {1, 2, 3, 8, 9};
    ie_isa_t isas[4];
    const int ni = n_isas(isas);
    int bad = 0, cases = 0;
    uint64_t seed = 77;
    for (int ti = 0; ti < 3; ti++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 4; b++) {
                const ie_dtype_t t = ITYPES[ti];
                const int64_t n_in = nins[a], n_out = nouts[b], n_tok = ntoks[(ti + a + b) % 5];
                const int G = 64;
                const ie_dtype_t at = ie_matmul_act_dtype(t);
                const size_t arow = ie_dtype_row_bytes(at, n_in);
                uint8_t *w = xmalloc(ie_pack_bytes(t, G, n_in, n_out));
                uint8_t *act = xmalloc(arow * (size_t)n_tok);
                float *x = xmalloc(sizeof(float) * (size_t)(n_in * (n_out > n_tok ? n_out : n_tok)));
                float *y0 = xmalloc(sizeof(float) * (size_t)(n_out * n_tok)),
                      *y1 = xmalloc(sizeof(float) * (size_t)(n_out * n_tok));
                rng_seed(seed++);
                rng_fill(x, n_in * n_out);
                CU_ASSERT_EQUAL_FATAL(ie_pack_quantize(t, G, IE_QSCALE_ABSMAX, x, n_in, 0, n_out, n_out, w), 0);
                rng_fill(x, n_in * n_tok);
                for (int64_t k = 0; k < n_tok; k++)
                    ie_act_quantize_ref(at, x + k * n_in, act + (size_t)k * arow, n_in);
                const ie_pmat_t m = {t, G, n_in, n_out, w};
                /* ranges of 1..5 panels, then shuffled */
                const int64_t np = (n_out + 15) / 16;
                rsrc_t src = {.n = 0};
                for (int64_t p = 0; p < np;) {
                    const int64_t len = 1 + (int64_t)(rng_u32() % 5);
                    src.r[src.n][0] = p;
                    src.r[src.n][1] = p + len < np ? p + len : np;
                    p = src.r[src.n][1];
                    src.n++;
                }
                for (int k = src.n - 1; k > 0; k--) {
                    const int j = (int)(rng_u32() % (uint32_t)(k + 1));
                    int64_t t0 = src.r[k][0], t1 = src.r[k][1];
                    src.r[k][0] = src.r[j][0];
                    src.r[k][1] = src.r[j][1];
                    src.r[j][0] = t0;
                    src.r[j][1] = t1;
                }
                for (int i = 0; i < ni; i++) {
                    const ie_kernels_t *ops = ie_kernels_get(isas[i]);
                    for (int64_t k = 0; k < n_out * n_tok; k++) y0[k] = y1[k] = SENTINEL;
                    CU_ASSERT_EQUAL(ops->matmul_packed(&m, 0, n_out, act, arow, n_tok, y0, n_out), 0);
                    src.at = 0;
                    CU_ASSERT_EQUAL(ops->matmul_packed_ranges(&m, rsrc_next, &src, act, arow, n_tok, y1, n_out), 0);
                    if (memcmp(y0, y1, sizeof(float) * (size_t)(n_out * n_tok)) != 0) {
                        printf("\n  %s %s n_in=%lld n_out=%lld n_tok=%lld: ranges differ", ie_isa_name(isas[i]),
                               ie_dtype_name(t), (long long)n_in, (long long)n_out, (long long)n_tok);
                        bad++;
                    }
                    /* a range past the matrix is refused */
                    rsrc_t badr = {.r = {{np, np + 1}}, .n = 1};
                    CU_ASSERT_EQUAL(ops->matmul_packed_ranges(&m, rsrc_next, &badr, act, arow, n_tok, y1, n_out),
                                    IE_ERR_INVAL);
                    cases++;
                }
                free(w);
                free(act);
                free(x);
                free(y0);
                free(y1);
            }
    printf("\n    %d cases", cases);
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---------------------------------------------- BF16 and F16 in PANEL16 */

/* Element k of row r of a BF16 / F16 PANEL16 matrix, read from the
 * ie_pack.h layout independently of the kernels: BF16 chunk k/2, dword
 * r%16, half k&1; F16 slice k, word r%16. */
static uint16_t half_panel_elem(const ie_pmat_t *m, int64_t r, int64_t k)
{
    uint16_t v;
    const size_t in = m->dtype == IE_DTYPE_BF16 ? (size_t)(k / 2) * 64 + 4 * (size_t)(r % 16) + 2 * (size_t)(k & 1)
                                                : (size_t)k * 32 + 2 * (size_t)(r % 16);
    memcpy(&v, (const uint8_t *)m->data + (size_t)(r / 16) * 32 * (size_t)m->n_in + in, 2);
    return v;
}

static float half_to_f32(ie_dtype_t t, uint16_t h)
{
    return t == IE_DTYPE_BF16 ? ie_bf16_to_f32(h) : ie_f16_to_f32(h);
}

/* Shapes, quantize == repack == the layout, padding, sub-ranges, dequant
 * and slices, for BF16 and F16. */
static void test_half_panel_layout(void)
{
    CU_ASSERT_EQUAL(ie_pack_check(IE_DTYPE_BF16, 32, 96), 0);
    CU_ASSERT_EQUAL(ie_pack_check(IE_DTYPE_BF16, 64, 128), -1); /* group is 32 */
    CU_ASSERT_EQUAL(ie_pack_check(IE_DTYPE_BF16, 32, 48), -1);
    CU_ASSERT_EQUAL(ie_pack_check(IE_DTYPE_F16, 32, 64), 0);
    CU_ASSERT_EQUAL(ie_pack_check(IE_DTYPE_F16, 64, 64), -1);
    CU_ASSERT_EQUAL(ie_pack_check(IE_DTYPE_F32, 32, 64), -1);
    CU_ASSERT_EQUAL(ie_pack_target(IE_DTYPE_F16), IE_DTYPE_F16);
    CU_ASSERT_EQUAL(ie_pack_target(IE_DTYPE_F32), IE_DTYPE_INVALID);
    CU_ASSERT_EQUAL(ie_pack_panel_bytes(IE_DTYPE_BF16, 32, 96), 32u * 96u);
    CU_ASSERT_EQUAL(ie_pack_bytes(IE_DTYPE_BF16, 32, 96, 17), 2u * 32u * 96u);
    CU_ASSERT_EQUAL(ie_qrow_bytes(IE_DTYPE_BF16, 32, 96), 0u);
    CU_ASSERT_EQUAL(ie_tensor_bytes(IE_DTYPE_BF16, IE_LAYOUT_PANEL16, 32, 96, 17), 2u * 32u * 96u);
    CU_ASSERT_EQUAL(ie_pack_target(IE_DTYPE_BF16), IE_DTYPE_BF16);
    static const int64_t shapes[][2] = {{32, 1}, {64, 16}, {96, 17}, {160, 33}, {2048, 40}};
    int bad = 0;
    for (int hi = 0; hi < 2; hi++)
        for (int si = 0; si < 5; si++) {
            const ie_dtype_t ht = hi ? IE_DTYPE_F16 : IE_DTYPE_BF16;
            const int64_t n_in = shapes[si][0], n_out = shapes[si][1];
            const size_t pb = ie_pack_bytes(ht, 32, n_in, n_out);
            float *x = xmalloc(sizeof(float) * (size_t)(n_in * n_out)), *d = xmalloc(sizeof(float) * (size_t)n_in);
            uint16_t *rows = xmalloc(2 * (size_t)(n_in * n_out));
            uint8_t *q = palloc(pb), *rp = palloc(pb), *pieces = palloc(pb);
            rng_seed(900 + (uint64_t)si + 10 * (uint64_t)hi);
            fill_gauss(x, n_in * n_out);
            CU_ASSERT_EQUAL(ie_quantize_row(ht, x, rows, n_in * n_out), 0);
            CU_ASSERT_EQUAL(ie_pack_quantize(ht, 32, IE_QSCALE_MSE, x, n_in, 0, n_out, n_out, q), 0);
            CU_ASSERT_EQUAL(ie_pack_repack(ht, 32, rows, n_in, 0, n_out, n_out, rp), 0);
            for (int64_t r0 = 0; r0 < n_out; r0 += 16) /* one panel at a time, last first */
                CU_ASSERT_EQUAL(ie_pack_repack(ht, 32, rows, n_in, (n_out - 1) / 16 * 16 - r0,
                                               (n_out - 1) / 16 * 16 - r0 + 16 < n_out
                                                   ? (n_out - 1) / 16 * 16 - r0 + 16
                                                   : n_out,
                                               n_out, pieces),
                                0);
            CU_ASSERT(memcmp(q, rp, pb) == 0);
            CU_ASSERT(memcmp(q, pieces, pb) == 0);
            const ie_pmat_t m = {ht, 32, n_in, n_out, q};
            for (int64_t r = 0; r < (n_out + 15) / 16 * 16; r++)
                for (int64_t k = 0; k < n_in; k++)
                    if (half_panel_elem(&m, r, k) != (r < n_out ? rows[r * n_in + k] : 0)) bad++;
            for (int64_t r = 0; r < n_out; r++) {
                ie_pack_dequant_row(&m, r, d);
                for (int64_t k = 0; k < n_in; k++)
                    if (memcmp(&d[k], &(float){half_to_f32(ht, rows[r * n_in + k])}, 4) != 0) bad++;
            }
            /* a slice: rows [16, n_out) or [0, n_out), columns [32, n_in) or all */
            const int64_t sr0 = n_out > 16 ? 16 : 0, sc0 = n_in > 32 ? 32 : 0;
            const size_t sb = ie_tensor_bytes(ht, IE_LAYOUT_PANEL16, 32, n_in - sc0, n_out - sr0);
            uint8_t *sl = palloc(sb), *want = palloc(sb);
            float *xs = xmalloc(sizeof(float) * (size_t)((n_in - sc0) * (n_out - sr0)));
            for (int64_t r = sr0; r < n_out; r++)
                memcpy(xs + (r - sr0) * (n_in - sc0), x + r * n_in + sc0, sizeof(float) * (size_t)(n_in - sc0));
            CU_ASSERT_EQUAL(ie_tensor_slice(ht, IE_LAYOUT_PANEL16, 32, q, n_in, n_out, sr0, n_out, sc0, n_in, sl),
                            0);
            CU_ASSERT_EQUAL(ie_pack_quantize(ht, 32, IE_QSCALE_ABSMAX, xs, n_in - sc0, 0, n_out - sr0, n_out - sr0,
                                             want),
                            0);
            CU_ASSERT(memcmp(sl, want, sb) == 0);
            if (n_in > 32) /* not on a 32-column boundary */
                CU_ASSERT_EQUAL(ie_tensor_slice(ht, IE_LAYOUT_PANEL16, 32, q, n_in, n_out, 0, n_out, 16, n_in, sl),
                                -1);
            free(x);
            free(d);
            free(rows);
            free(q);
            free(rp);
            free(pieces);
            free(sl);
            free(want);
            free(xs);
        }
    CU_ASSERT_EQUAL(bad, 0);
    /* bad shapes and ranges are refused */
    float f[64] = {0};
    uint8_t buf[32 * 64 * 2];
    CU_ASSERT_EQUAL(ie_pack_quantize(IE_DTYPE_BF16, 32, IE_QSCALE_ABSMAX, f, 48, 0, 1, 1, buf), -1);
    CU_ASSERT_EQUAL(ie_pack_quantize(IE_DTYPE_BF16, 32, IE_QSCALE_ABSMAX, f, 64, 8, 17, 17, buf), -1);
    CU_ASSERT_EQUAL(ie_qrow_quantize(IE_DTYPE_BF16, 32, IE_QSCALE_ABSMAX, f, 64, buf), -1);
}

/* matmul_packed on BF16 panels (BF16 activations) and F16 panels (F32
 * activations), every ISA (AVX-512 BF16 with and without vdpbf16ps),
 * against the double oracle: |y - oracle| <= 2^-20 * sum |w a| (products
 * of bf16 are exact in f32 and f16 x f32 ones are fused; the sums run in
 * f32 accumulators of at most n_in terms; vdpbf16ps flushes bf16
 * denormals, which these values never are), against the ROWS matmul of the
 * same values within twice that, sentinels outside the range untouched;
 * and matmul_packed_ranges == matmul_packed bit for bit. Token counts cover
 * the decode tiles (1..12), the GEMMs (13+) and the BF16 one's activation
 * copies (row stride a multiple of 2048 bytes). */
static void test_half_panel_matmul(void)
{
    typedef struct {
        int64_t n_in, n_out, n_tok, r0, r1;
        size_t as_extra;
        int ldy_extra;
    } bcase_t;
    static const bcase_t cases[] = {{32, 1, 1, 0, 1, 0, 0},          {64, 17, 2, 0, 17, 6, 3},
                                    {96, 33, 3, 16, 33, 0, 0},       {160, 100, 5, 32, 64, 2, 1},
                                    {2048, 48, 1, 0, 48, 0, 0},      {2048, 40, 12, 16, 40, 0, 5},
                                    {576, 130, 13, 0, 130, 4, 0},    {1024, 70, 47, 0, 70, 0, 0},
                                    {1024, 64, 60, 16, 64, 1024, 2}, {5632, 20, 8, 0, 20, 0, 0},
                                    {2048, 200, 1, 64, 200, 0, 0}};
    ie_isa_t isas[4];
    const int ni = n_isas(isas);
    int bad = 0, runs = 0;
    for (int hi = 0; hi < 2; hi++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const bcase_t *c = &cases[ci];
            const ie_dtype_t ht = hi ? IE_DTYPE_F16 : IE_DTYPE_BF16, at = ie_matmul_act_dtype(ht);
            const size_t ab = ie_dtype_row_bytes(at, 1); /* bf16 activations, or f32 for f16 */
            const int64_t n_in = c->n_in, n_out = c->n_out, n_tok = c->n_tok, ldy = n_out + c->ldy_extra;
            /* f32 rows stay 4-byte aligned (the ROWS f16 reference reads floats) */
            const size_t pb = ie_pack_bytes(ht, 32, n_in, n_out),
                         as = ab * (size_t)n_in + (c->as_extra + ab - 1) / ab * ab;
            const size_t ny = (size_t)(ldy * n_tok) + GUARD_FLOATS;
            guarded_t gw, ga;
            uint8_t *w = guarded_alloc(&gw, pb, 64);
            uint8_t *a = guarded_alloc(&ga, as * (size_t)(n_tok - 1) + ab * (size_t)n_in, ab);
            float *x = xmalloc(sizeof(float) * (size_t)(n_in * (n_out > n_tok ? n_out : n_tok)));
            uint16_t *rows = xmalloc(2 * (size_t)(n_in * n_out));
            float *y = xmalloc(sizeof(float) * ny), *yr = xmalloc(sizeof(float) * ny),
                  *yq = xmalloc(sizeof(float) * ny);
            rng_seed(4000 + ci + 100 * (size_t)hi);
            fill_gauss(x, n_in * n_out);
            CU_ASSERT_EQUAL_FATAL(ie_pack_quantize(ht, 32, IE_QSCALE_ABSMAX, x, n_in, 0, n_out, n_out, w), 0);
            CU_ASSERT_EQUAL(ie_quantize_row(ht, x, rows, n_in * n_out), 0);
            fill_gauss(x, n_in * n_tok);
            for (int64_t t = 0; t < n_tok; t++) ie_act_quantize_ref(at, x + t * n_in, a + (size_t)t * as, n_in);
            const ie_pmat_t m = {ht, 32, n_in, n_out, w};
            for (int i = 0; i < ni; i++)
                for (int nobf = 0; nobf < (isas[i] == IE_ISA_AVX512 && !hi ? 2 : 1); nobf++) {
                    const ie_kernels_t *ops = ie_kernels_get(isas[i]);
                    const int had = isas[i] == IE_ISA_AVX512 ? ie_avx512_use_dpbf16(1) : 0;
                    if (nobf) ie_avx512_use_dpbf16(0);
                    for (size_t j = 0; j < ny; j++) y[j] = yr[j] = yq[j] = SENTINEL;
                    CU_ASSERT_EQUAL(ops->matmul_packed(&m, c->r0, c->r1, a, as, n_tok, y, ldy), 0);
                    CU_ASSERT_EQUAL(ie_kernels_matmul(ops, ht, rows, n_in, c->r0, c->r1, a, as, n_tok, yr, ldy), 0);
                    /* ranges over the same panels, one or two at a time, last first */
                    rsrc_t src = {.n = 0};
                    for (int64_t p1 = (c->r1 + 15) / 16; p1 > c->r0 / 16; src.n++) {
                        const int64_t p0 = p1 - 1 - (src.n & 1) > c->r0 / 16 ? p1 - 1 - (src.n & 1) : c->r0 / 16;
                        src.r[src.n][0] = p0;
                        src.r[src.n][1] = p1;
                        p1 = p0;
                    }
                    CU_ASSERT_EQUAL(ops->matmul_packed_ranges(&m, rsrc_next, &src, a, as, n_tok, yq, ldy), 0);
                    if (isas[i] == IE_ISA_AVX512) ie_avx512_use_dpbf16(had);
                    for (int64_t t = 0; t < n_tok; t++)
                        for (int64_t r = 0; r < ldy; r++) {
                            const float v = y[t * ldy + r];
                            if (r < c->r0 || r >= c->r1) {
                                bad += v != SENTINEL || yr[t * ldy + r] != SENTINEL;
                                continue;
                            }
                            /* ranges cover the panels of [r0, r1): whole panels */
                            bad += memcmp(&v, &yq[t * ldy + r], 4) != 0;
                            double s = 0.0, T = 0.0;
                            for (int64_t k = 0; k < n_in; k++) {
                                float xa;
                                if (hi) {
                                    memcpy(&xa, a + (size_t)t * as + 4 * (size_t)k, 4);
                                } else {
                                    uint16_t h;
                                    memcpy(&h, a + (size_t)t * as + 2 * (size_t)k, 2);
                                    xa = ie_bf16_to_f32(h);
                                }
                                const double p = (double)half_to_f32(ht, rows[r * n_in + k]) * xa;
                                s += p;
                                T += fabs(p);
                            }
                            const double tol = T * 0x1p-20 + 1e-30;
                            if (!(fabs(v - s) <= tol && fabs((double)v - yr[t * ldy + r]) <= 2 * tol)) {
                                if (bad < 4)
                                    printf("\n  %s %s%s n_in=%lld n_out=%lld n_tok=%lld: y[%lld][%lld]=%.9g "
                                           "oracle=%.9g "
                                           "rows=%.9g",
                                           ie_dtype_name(ht), ie_isa_name(isas[i]), nobf ? "(no bf16)" : "",
                                           (long long)n_in, (long long)n_out, (long long)n_tok, (long long)t,
                                           (long long)r, v, s, yr[t * ldy + r]);
                                bad++;
                            }
                        }
                    for (size_t j = (size_t)(ldy * n_tok); j < ny; j++) bad += y[j] != SENTINEL;
                    runs++;
                }
            guarded_free(&gw);
            guarded_free(&ga);
            free(x);
            free(rows);
            free(y);
            free(yr);
            free(yq);
        }
    printf("\n    %d runs", runs);
    CU_ASSERT_EQUAL(bad, 0);
}

/* Bigger GEMM/GEMV shapes: panels larger than L1, many token tiles. */
static void test_matmul_packed_large(void)
{
    int bad = 0;
    for (int ti = 0; ti < 3; ti++) {
        mcase_t c1 = {ITYPES[ti], 128, 4096, 64, 1, 0, 64, 1, 0, 0, 7000 + (uint64_t)ti};
        mcase_t c2 = {ITYPES[ti], 32, 2048, 48, 37, 0, 48, 0, 5, 8, 7100 + (uint64_t)ti};
        bad += check_packed_case(&c1);
        bad += check_packed_case(&c2);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* Unit scales: every block product and partial sum is an integer below
 * 2^24, so every ISA must return the exact integer. I8W x Q16_P: d = 1
 * needs amax 32767 per activation block; that element meets a weight in
 * [-1, 1] and the others stay in [-400, 400], so a row's partial sums stay
 * below 8 * (32767 + 31*127*400) < 2^24. */
static void test_matmul_packed_exact(void)
{
    ie_isa_t isas[4];
    const int ni = n_isas(isas);
    const int64_t n_in = 256, n_out = 35, n_tok = 6;
    float *x = xmalloc(sizeof(float) * (size_t)(n_in * n_out)),
          *y = xmalloc(sizeof(float) * (size_t)(n_out * n_tok));
    float *wf = xmalloc(sizeof(float) * (size_t)n_in);
    const size_t asmax = ie_dtype_row_bytes(IE_DTYPE_Q16_P, n_in);
    uint8_t *a = xmalloc(asmax * (size_t)n_tok);
    int bad = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int gi = 0; gi < 4; gi++) {
            const ie_dtype_t t = ITYPES[ti], at = ie_matmul_act_dtype(t);
            const size_t as = ie_dtype_row_bytes(at, n_in);
            const int G = 32 << gi;
            rng_seed(800 + (uint64_t)(ti * 4 + gi));
            /* integer weights with d = 1: I8W amax 127; I4W max -8 (values -8..7);
             * I4WA min -3, max 12 (d = 1, m = -3) */
            for (int64_t i = 0; i < n_in * n_out; i++) {
                const int64_t kk = i % G;
                if (t == IE_DTYPE_I8W)
                    x[i] = kk == 0        ? 127.0f
                           : kk % 32 == 5 ? (float)((int)(rng_u32() % 3) - 1)
                                          : (float)((int)(rng_u32() % 255) - 127);
                else if (t == IE_DTYPE_I4W) x[i] = kk == 0 ? -8.0f : (float)((int)(rng_u32() % 16) - 8);
                else x[i] = kk == 0 ? -3.0f : kk == 1 ? 12.0f : (float)((int)(rng_u32() % 16) - 3);
            }
            const size_t pb = ie_pack_bytes(t, G, n_in, n_out);
            uint8_t *w = palloc(pb);
            CU_ASSERT_EQUAL(ie_pack_quantize(t, G, IE_QSCALE_ABSMAX, x, n_in, 0, n_out, n_out, w), 0);
            const ie_pmat_t m = {t, G, n_in, n_out, w};
            /* activations: integers with amax qmax per block -> d = 1 */
            float xa[256];
            for (int64_t tt = 0; tt < n_tok; tt++) {
                for (int64_t k = 0; k < n_in; k++) {
                    if (at == IE_DTYPE_Q16_P)
                        xa[k] = k % 32 == 5 ? (k % 64 ? -32767.0f : 32767.0f)
                                            : (float)((int)(rng_u32() % 801) - 400);
                    else xa[k] = k % 32 == 5 ? -127.0f : (float)((int)(rng_u32() % 255) - 127);
                }
                ie_act_quantize_ref(at, xa, a + (size_t)tt * as, n_in);
                for (int64_t b = 0; b < n_in / 32; b++)
                    CU_ASSERT_EQUAL(a_d(at, a + (size_t)tt * as, n_in, b), 1.0f);
            }
            for (int i = 0; i < ni; i++) {
                ie_kernels_get(isas[i])->matmul_packed(&m, 0, n_out, a, as, n_tok, y, n_out);
                for (int64_t r = 0; r < n_out; r++) {
                    ie_pack_dequant_row(&m, r, wf);
                    for (int64_t tt = 0; tt < n_tok; tt++) {
                        int64_t s = 0;
                        for (int64_t k = 0; k < n_in; k++) s += (int64_t)wf[k] * a_q(at, a + (size_t)tt * as, k);
                        if (y[tt * n_out + r] != (float)s) {
                            if (bad < 4)
                                printf("\n  %s %s G=%d y[%lld][%lld]=%.9g exact=%lld", ie_isa_name(isas[i]),
                                       ie_dtype_name(t), G, (long long)tt, (long long)r, y[tt * n_out + r],
                                       (long long)s);
                            bad++;
                        }
                    }
                }
            }
            free(w);
        }
    CU_ASSERT_EQUAL(bad, 0);
    free(x);
    free(y);
    free(wf);
    free(a);
}

/* I8W x Q16_P at the extremes of both codes (weights +-127, i.e. stored
 * bytes 255 and 1; activations +-32767), one block (n_in = 32, G = 32) so
 * the only rounding is the final int -> float: every ISA must give
 * (float) of the exact dot product (up to 32*127*32767 in magnitude). */
static void test_matmul_packed_i8w_extremes(void)
{
    ie_isa_t isas[4];
    const int ni = n_isas(isas);
    const int64_t n_in = 32, n_out = 20, n_tok = 9;
    float x[32 * 20], xa[32], y[20 * 9], wf[32];
    const size_t as = ie_dtype_row_bytes(IE_DTYPE_Q16_P, n_in);
    uint8_t *a = xmalloc(as * (size_t)n_tok);
    uint8_t *w = palloc(ie_pack_bytes(IE_DTYPE_I8W, 32, n_in, n_out));
    rng_seed(900);
    for (int64_t r = 0; r < n_out; r++)
        for (int64_t k = 0; k < n_in; k++) {
            const int pat = (int)(r % 5);
            x[r * n_in + k] = pat == 0   ? 127.0f
                              : pat == 1 ? -127.0f
                              : pat == 2 ? (k & 1 ? 127.0f : -127.0f)
                              : pat == 3 ? (rng_u32() & 1 ? 127.0f : -127.0f)
                                         : (k == 0 ? 127.0f : -1.0f);
        }
    CU_ASSERT_EQUAL(ie_pack_quantize(IE_DTYPE_I8W, 32, IE_QSCALE_ABSMAX, x, n_in, 0, n_out, n_out, w), 0);
    const ie_pmat_t m = {IE_DTYPE_I8W, 32, n_in, n_out, w};
    for (int64_t tt = 0; tt < n_tok; tt++) {
        const int pat = (int)(tt % 4);
        for (int64_t k = 0; k < n_in; k++)
            xa[k] = pat == 0   ? 32767.0f
                    : pat == 1 ? -32767.0f
                    : pat == 2 ? (k & 1 ? 32767.0f : -32767.0f)
                               : (rng_u32() & 1 ? 32767.0f : -32767.0f);
        ie_act_quantize_ref(IE_DTYPE_Q16_P, xa, a + (size_t)tt * as, n_in);
    }
    int bad = 0;
    for (int i = 0; i < ni; i++) {
        for (int64_t j = 0; j < n_out * n_tok; j++) y[j] = SENTINEL;
        CU_ASSERT_EQUAL(ie_kernels_get(isas[i])->matmul_packed(&m, 0, n_out, a, as, n_tok, y, n_out), 0);
        for (int64_t r = 0; r < n_out; r++) {
            ie_pack_dequant_row(&m, r, wf);
            for (int64_t tt = 0; tt < n_tok; tt++) {
                int64_t s = 0;
                for (int64_t k = 0; k < n_in; k++)
                    s += (int64_t)wf[k] * a_q(IE_DTYPE_Q16_P, a + (size_t)tt * as, k);
                if (y[tt * n_out + r] != (float)s) {
                    if (bad < 4)
                        printf("\n  %s y[%lld][%lld]=%.9g exact=%lld", ie_isa_name(isas[i]), (long long)tt,
                               (long long)r, y[tt * n_out + r], (long long)s);
                    bad++;
                }
            }
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    free(a);
    free(w);
}

/* Bad matrices and ranges: IE_ERR_INVAL from every ISA, y untouched. */
static void test_matmul_packed_bad_args(void)
{
    ie_isa_t isas[4];
    const int ni = n_isas(isas);
    const int64_t n_in = 64, n_out = 40;
    float x[64 * 40] = {0}, y[40 * 2];
    uint8_t *w = palloc(ie_pack_bytes(IE_DTYPE_I4W, 32, n_in, n_out));
    uint8_t a[2 * 80] = {0};
    CU_ASSERT_EQUAL(ie_pack_quantize(IE_DTYPE_I4W, 32, IE_QSCALE_ABSMAX, x, n_in, 0, n_out, n_out, w), 0);
    const ie_pmat_t ok = {IE_DTYPE_I4W, 32, n_in, n_out, w};
    const ie_pmat_t badg = {IE_DTYPE_I4W, 48, n_in, n_out, w}, badt = {IE_DTYPE_Q4_0, 32, n_in, n_out, w};
    for (int i = 0; i < ni; i++) {
        const ie_kernels_t *ops = ie_kernels_get(isas[i]);
        for (int j = 0; j < 80; j++) y[j] = SENTINEL;
        CU_ASSERT_EQUAL(ops->matmul_packed(&ok, 8, 40, a, 80, 2, y, 40), IE_ERR_INVAL);  /* r0 % 16 */
        CU_ASSERT_EQUAL(ops->matmul_packed(&ok, 0, 20, a, 80, 2, y, 40), IE_ERR_INVAL);  /* r1 */
        CU_ASSERT_EQUAL(ops->matmul_packed(&ok, 0, 48, a, 80, 2, y, 40), IE_ERR_INVAL);  /* r1 > n_out */
        CU_ASSERT_EQUAL(ops->matmul_packed(&ok, 32, 16, a, 80, 2, y, 40), IE_ERR_INVAL); /* r0 > r1 */
        CU_ASSERT_EQUAL(ops->matmul_packed(&badg, 0, 40, a, 80, 2, y, 40), IE_ERR_INVAL);
        CU_ASSERT_EQUAL(ops->matmul_packed(&badt, 0, 40, a, 80, 2, y, 40), IE_ERR_INVAL);
        int touched = 0;
        for (int j = 0; j < 80; j++) touched += y[j] != SENTINEL;
        CU_ASSERT_EQUAL(touched, 0);
        CU_ASSERT_EQUAL(ops->matmul_packed(&ok, 16, 16, a, 80, 2, y, 40), 0); /* empty range */
        CU_ASSERT_EQUAL(ops->matmul_packed(&ok, 32, 40, a, 80, 2, y, 40), 0);
        CU_ASSERT_EQUAL(ops->matmul_packed(&ok, 0, 40, a, 80, 0, y, 40), 0); /* no tokens */
    }
    free(w);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("pack", NULL, NULL);
    CU_add_test(s, "repack q8_0/q4_0/q4_1 lossless", test_repack_lossless);
    CU_add_test(s, "group-32 quantize == ggml rules", test_quantize_matches_ggml);
    CU_add_test(s, "rows vs panel, every group, bounds", test_rows_vs_panel);
    CU_add_test(s, "quantize bad args", test_quantize_bad_args);
    CU_add_test(s, "mse scales <= absmax", test_mse_scales);
    CU_add_test(s, "q8_p/q16_p act_quantize: definition, bit-exact", test_act_formats);
    CU_add_test(s, "q16_p rounding sweep (all ISAs)", test_q16p_rounding_sweep);
    CU_add_test(s, "act_quantize_stream == act_quantize (all ISAs, alignments)", test_act_stream);
    CU_add_test(s, "matmul_packed odd shapes (all ISAs)", test_matmul_packed_shapes);
    CU_add_test(s, "matmul_packed large", test_matmul_packed_large);
    CU_add_test(s, "matmul_packed integer exact", test_matmul_packed_exact);
    CU_add_test(s, "matmul_packed i8w x q16_p extremes", test_matmul_packed_i8w_extremes);
    CU_add_test(s, "matmul_packed bad args", test_matmul_packed_bad_args);
    CU_add_test(s, "matmul_packed_ranges == matmul_packed (all ISAs)", test_matmul_packed_ranges);
    CU_add_test(s, "bf16/f16 panel16: quantize == repack == layout, dequant, slice", test_half_panel_layout);
    CU_add_test(s, "bf16/f16 panel16 matmul_packed vs oracle and rows (all ISAs)", test_half_panel_matmul);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

/* test_kquant_pack.c — the k-quants (Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K,
 * IQ4_XS) and MXFP4 in PANEL16 (ie_pack.h "K-QUANTS in PANEL16"): sizes, the
 * lossless repack, dequantization, slicing, and matmul_packed of every ISA
 * against the packed reference (the acceptance test of the SIMD k-quant
 * kernels); MXFP4's exponents at and past the ends of its panel form.
 *
 * Weights are random valid ggml blocks: ie_kq_encode of random codes,
 * sub-block scale / min codes over their whole range and random finite f16
 * d / dmin (moderate ones, and in some rows extreme ones: 65504, the
 * smallest subnormal, 0, negative; MXFP4: powers of two 2^-24 .. 2^15, and
 * 0), and some matrices quantized from
 * Gaussian floats by ie_quantize_row (the route floats take to a k-quant:
 * ie_pack_quantize refuses them). Activations: ie_quantize_row_q8_p_ref
 * (Q5_0, Q5_1, IQ4_NL) or ie_quantize_row_q8_k_ref (the rest) of Gaussian
 * rows with outliers, and some all-zero or constant rows.
 *
 * What must hold, and how close:
 *   repack, dequant_row: bit for bit ie_dequantize_row of the source row;
 *       the fields read back by an independent reader of the ie_pack.h
 *       spec equal ie_kq_decode's; padding rows all zero; repacking in
 *       panel pieces writes the same bytes as in one go.
 *   slice: the same bytes as repacking the sliced ROWS; bad cuts -1 and
 *       dst untouched.
 *   ie_matmul_packed_ref: bit for bit ie_matmul_<t>_q8_{p,k}_ref on the
 *       source rows (MXFP4 has none: its ROWS kernels read Q8_0; both scale each block in f32 in the same order and
 *       sum the blocks in double), and within 1e-5*T + 2^-23*sum|w*a| of
 *       the double sum of dequantized weights w x dequantized activations
 *       a (the second term: w itself is rounded to f32, e.g. d*u + m with
 *       a large m, where T counts m only through the activation sum).
 *   every ISA's matmul_packed (and _ranges): |y - ref| <= 1e-5 * T + 1e-30
 *       per output, with T the sum of |terms| a kernel may form, as in
 *       test_pack.c: per block |d_w*d_a| * sum_j |sc_j| * (sum_k |c_k*q_k|
 *       + off*|bs_j|) (+ |dmin_w*d_a| * sum_j |mn_j*bs_j|) for the 256
 *       types (c the stored code, or kv[c] for IQ4_XS; off 4 Q3_K, 32 Q6_K,
 *       bs_j the activation sum over sub-block j) and |d_w*d_a| * sum_k
 *       |c_k*q_k| + off*|d_w*s_b| (+ |m_w*s_b|) for the 32 types (off 16
 *       for Q5_0): SIMD kernels sum the same exact integers but may scale
 *       and add them in f32 in another order. Rows outside [r0, r1) and y
 *       past the last row stay untouched; ranges == the same ISA's
 *       matmul_packed bit for bit.
 */
#include "ie_kernels.h"
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

static const ie_dtype_t KTYPES[] = {IE_DTYPE_Q5_0, IE_DTYPE_Q5_1, IE_DTYPE_IQ4_NL, IE_DTYPE_Q2_K,   IE_DTYPE_Q3_K,
                                    IE_DTYPE_Q4_K, IE_DTYPE_Q5_K, IE_DTYPE_Q6_K,   IE_DTYPE_IQ4_XS, IE_DTYPE_MXFP4};
#define N_KTYPES ((int)(sizeof KTYPES / sizeof KTYPES[0]))

/* The spec's table (ie_pack.h), written out independently of ie_kq_info. */
typedef struct {
    ie_dtype_t t;
    int qk, nsub, bits, dmin, mn;
} spec_t;
static const spec_t SPEC[] = {
    {IE_DTYPE_Q5_0, 32, 0, 5, 0, 0},   {IE_DTYPE_Q5_1, 32, 0, 5, 1, 0},   {IE_DTYPE_IQ4_NL, 32, 0, 4, 0, 0},
    {IE_DTYPE_Q2_K, 256, 16, 2, 1, 1}, {IE_DTYPE_Q3_K, 256, 16, 3, 0, 0}, {IE_DTYPE_Q4_K, 256, 8, 4, 1, 1},
    {IE_DTYPE_Q5_K, 256, 8, 5, 1, 1},  {IE_DTYPE_Q6_K, 256, 16, 6, 0, 0}, {IE_DTYPE_IQ4_XS, 256, 8, 4, 0, 0},
    {IE_DTYPE_MXFP4, 32, 0, 4, 0, 0},
};

static const spec_t *spec_of(ie_dtype_t t)
{
    for (int i = 0; i < N_KTYPES; i++)
        if (SPEC[i].t == t) return &SPEC[i];
    return NULL;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    CU_ASSERT_FATAL(p != NULL);
    return p;
}

/* 64-byte aligned, filled with `fill` so that unwritten bytes show. */
static void *palloc(size_t n, int fill)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    CU_ASSERT_FATAL(p != NULL);
    memset(p, fill, (n + 63) / 64 * 64);
    return p;
}

static int n_isas(ie_isa_t *isas)
{
    int n = 0;
    for (int i = IE_ISA_REF; i <= IE_ISA_AVX512; i++)
        if (ie_kernels_get((ie_isa_t)i)) isas[n++] = (ie_isa_t)i;
    return n;
}

/* A random finite f16: mode 0 moderate (|x| ~ 2^-12 .. 2^-2, the scales
 * real files hold), mode 1 any finite bits (subnormals to 65504, either
 * sign), mode 2 one of the extremes. */
static ie_f16_t rand_f16(int mode)
{
    static const ie_f16_t ext[] = {0x7bff, 0xfbff, 0x0001, 0x8001, 0x0000, 0x8000, 0x0400, 0x3c00};
    if (mode == 2) return ext[rng_u32() % 8];
    const unsigned sign = rng_u32() & 1u, man = rng_u32() & 0x3ffu;
    const unsigned ex = mode == 0 ? 3u + rng_u32() % 11u : rng_u32() % 31u;
    return (ie_f16_t)(sign << 15 | ex << 10 | man);
}

/* Random valid fields of one block of type t: codes over their range, sc /
 * mn codes over theirs (Q2_K 4 bits, Q4_K/Q5_K 6 bits unsigned; Q3_K and
 * IQ4_XS 6-bit codes minus 32; Q6_K any int8). extreme: d/dmin extremes and
 * the codes at their ends. */
static void rand_codes(ie_dtype_t t, int extreme, ie_kq_codes_t *c)
{
    const spec_t *s = spec_of(t);
    memset(c, 0, sizeof *c);
    const unsigned umax = (1u << s->bits) - 1;
    for (int k = 0; k < s->qk; k++)
        c->u[k] = (uint8_t)(extreme ? ((rng_u32() & 1) ? umax : 0) : rng_u32() % (umax + 1));
    for (int j = 0; j < s->nsub; j++) {
        int sc, mn = 0;
        switch (t) {
        case IE_DTYPE_Q2_K:
            sc = (int)(rng_u32() % 16);
            mn = (int)(rng_u32() % 16);
            break;
        case IE_DTYPE_Q4_K:
        case IE_DTYPE_Q5_K:
            sc = (int)(rng_u32() % 64);
            mn = (int)(rng_u32() % 64);
            break;
        case IE_DTYPE_Q6_K: sc = (int)(rng_u32() % 256) - 128; break;
        default: sc = (int)(rng_u32() % 64) - 32; break; /* Q3_K, IQ4_XS */
        }
        if (extreme) { /* the ends of the range */
            const int lo = t == IE_DTYPE_Q6_K ? -128 : (t == IE_DTYPE_Q3_K || t == IE_DTYPE_IQ4_XS) ? -32 : 0;
            const int hi = t == IE_DTYPE_Q6_K ? 127 : t == IE_DTYPE_Q2_K ? 15 : lo + 63;
            sc = (rng_u32() & 1) ? hi : lo;
            mn = s->mn ? ((rng_u32() & 1) ? (t == IE_DTYPE_Q2_K ? 15 : 63) : 0) : 0;
        }
        c->sc[j] = (int8_t)sc;
        c->mn[j] = (int8_t)mn;
    }
    const int mode = extreme ? 2 : (rng_u32() % 10 == 0 ? 1 : 0);
    c->d = rand_f16(mode);
    if (s->dmin) c->dmin = rand_f16(mode);
    if (t == IE_DTYPE_MXFP4) { /* 2^(e-128): 2^-12 .. 2^-2, or its whole f16 range, or the ends */
        static const int ends[] = {-24, 15, -14, -15};
        const int x = mode == 2   ? ends[rng_u32() % 4]
                      : mode == 1 ? -24 + (int)(rng_u32() % 40)
                                  : -12 + (int)(rng_u32() % 11);
        c->d = ie_f32_to_f16(ldexpf(1.0f, x));
    }
    if (!extreme && rng_u32() % 50 == 0) c->d = 0; /* an all-zero scale now and then */
    if (t == IE_DTYPE_MXFP4 && c->d == 0)          /* MXFP4's only zero scale: +-0 codes (e = 0) */
        for (int k = 0; k < s->qk; k++) c->u[k] = (uint8_t)(rng_u32() & 8);
}

static void fill_gauss(float *x, int64_t n);

/* n_out rows of n_in elements of type t quantized by ie_quantize_row from
 * Gaussian floats: the weights real files hold (caller frees). */
static uint8_t *quant_rows(ie_dtype_t t, int64_t n_in, int64_t n_out)
{
    const size_t rb = ie_dtype_row_bytes(t, n_in);
    uint8_t *w = xmalloc(rb * (size_t)n_out);
    float *x = xmalloc(sizeof(float) * (size_t)n_in);
    for (int64_t r = 0; r < n_out; r++) {
        fill_gauss(x, n_in);
        for (int64_t k = 0; k < n_in; k++) x[k] *= 0.02f;
        CU_ASSERT_FATAL(ie_quantize_row(t, x, w + (size_t)r * rb, n_in) == 0);
    }
    free(x);
    return w;
}

/* n_out random ROWS of n_in elements of type t (caller frees). Rows with
 * r % 7 == 3 get extreme blocks. */
static uint8_t *rand_rows(ie_dtype_t t, int64_t n_in, int64_t n_out)
{
    const size_t rb = ie_dtype_row_bytes(t, n_in), bb = ie_dtype_block_bytes(t);
    const int qk = ie_dtype_block_elems(t);
    uint8_t *w = xmalloc(rb * (size_t)n_out);
    ie_kq_codes_t c;
    for (int64_t r = 0; r < n_out; r++)
        for (int64_t b = 0; b < n_in / qk; b++) {
            rand_codes(t, r % 7 == 3, &c);
            CU_ASSERT_FATAL(ie_kq_encode(t, &c, w + (size_t)r * rb + (size_t)b * bb) == 0);
        }
    return w;
}

/* Independent reader of the PANEL16 spec (ie_pack.h) from its text: the
 * start of block b of panel p, then each field of panel row i. */
static size_t sp_hdr(const spec_t *s)
{
    return 32 * (size_t)(1 + s->dmin) + 16 * (size_t)s->nsub * (size_t)(1 + s->mn);
}
static size_t sp_block(const spec_t *s) { return sp_hdr(s) + 16 * (size_t)s->qk * (size_t)s->bits / 8; }
static const uint8_t *sp_at(const spec_t *s, const void *base, int64_t n_in, int64_t p, int64_t b)
{
    return (const uint8_t *)base + ((size_t)p * (size_t)(n_in / s->qk) + (size_t)b) * sp_block(s);
}
static ie_f16_t sp_f16(const uint8_t *blk, int which, int i) /* 0: d, 1: dmin */
{
    ie_f16_t h;
    memcpy(&h, blk + 32 * which + 2 * i, 2);
    return h;
}
static int sp_sc(const spec_t *s, const uint8_t *blk, int which, int j, int i) /* 0: sc, 1: mn */
{
    return (int8_t)blk[32 * (1 + s->dmin) + 16 * s->nsub * which + 16 * j + i];
}
static int sp_code(const spec_t *s, const uint8_t *blk, int i, int k)
{
    const uint8_t *slab = blk + sp_hdr(s) + (size_t)(k / 32) * 64 * (size_t)s->bits;
    const int kk = k % 32, j = kk % 4;
    int u = 0, plane = 0; /* plane: 64-byte chunks before the current plane */
    if (s->bits >= 4) {
        const int c = kk / 8, hi = (kk % 8) >= 4;
        u = (slab[64 * c + 4 * i + j] >> (4 * hi)) & 15;
        plane = 4;
    }
    if (s->bits == 2 || s->bits == 3 || s->bits == 6) {
        const int c = kk / 16, t = (kk % 16) / 4;
        const int v = (slab[64 * (plane + c) + 4 * i + j] >> (2 * t)) & 3;
        u |= v << (s->bits == 6 ? 4 : 0);
        plane += 2;
    }
    if (s->bits == 3 || s->bits == 5) {
        const int t = kk / 4;
        u |= ((slab[64 * plane + 4 * i + j] >> t) & 1) << (s->bits == 3 ? 2 : 4);
    }
    return u;
}

/* ---------------------------------------------------- shapes and sizes */

static void test_check_sizes(void)
{
    for (int ti = 0; ti < N_KTYPES; ti++) {
        const spec_t *s = &SPEC[ti];
        const ie_dtype_t t = s->t;
        ie_kq_panel_t g;
        CU_ASSERT_EQUAL_FATAL(ie_kq_panel(t, &g), 0);
        CU_ASSERT_EQUAL(g.block, sp_block(s));
        CU_ASSERT_EQUAL(g.codes, sp_hdr(s));
        CU_ASSERT_EQUAL(ie_pack_target(t), t);
        CU_ASSERT_EQUAL(ie_pack_check(t, s->qk, s->qk), 0);
        CU_ASSERT_EQUAL(ie_pack_check(t, s->qk, 7 * (int64_t)s->qk), 0);
        CU_ASSERT_EQUAL(ie_pack_check(t, s->qk, s->qk + s->qk / 2), -1);   /* n_in not whole blocks */
        CU_ASSERT_EQUAL(ie_pack_check(t, s->qk == 32 ? 64 : 32, 512), -1); /* group != block size */
        CU_ASSERT_EQUAL(ie_pack_check(t, s->qk, 0), -1);
        CU_ASSERT_EQUAL(ie_pack_panel_bytes(t, s->qk, 3 * (int64_t)s->qk), 3 * sp_block(s));
        CU_ASSERT_EQUAL(ie_pack_bytes(t, s->qk, 3 * (int64_t)s->qk, 17), 2 * 3 * sp_block(s));
        CU_ASSERT_EQUAL(ie_tensor_bytes(t, IE_LAYOUT_PANEL16, s->qk, 2 * (int64_t)s->qk, 33), 3 * 2 * sp_block(s));
        CU_ASSERT_EQUAL(ie_tensor_bytes(t, IE_LAYOUT_PANEL16, 32 + s->qk, 2 * (int64_t)s->qk, 33), 0);
        CU_ASSERT_EQUAL(ie_tensor_bytes(t, IE_LAYOUT_ROWS, 0, 2 * (int64_t)s->qk, 5),
                        5 * 2 * ie_dtype_block_bytes(t));
        CU_ASSERT_EQUAL(ie_tensor_bytes(t, IE_LAYOUT_ROWS, 0, s->qk + 32 * (s->qk > 32), 5),
                        s->qk > 32 ? 0 : 5 * ie_dtype_block_bytes(t));
        /* not I-types: no ROWS I-type rows, no float quantization to them */
        float x[256] = {0};
        uint8_t buf[4096];
        CU_ASSERT_EQUAL(ie_qrow_bytes(t, s->qk, s->qk), 0);
        CU_ASSERT_EQUAL(ie_qrow_quantize(t, s->qk, IE_QSCALE_ABSMAX, x, s->qk, buf), -1);
        CU_ASSERT_EQUAL(ie_pack_quantize(t, s->qk, IE_QSCALE_ABSMAX, x, s->qk, 0, 1, 1, buf), -1);
        CU_ASSERT_EQUAL(ie_matmul_packed_act_dtype(t), s->qk == 32 ? IE_DTYPE_Q8_P : IE_DTYPE_Q8_K);
        CU_ASSERT_EQUAL(ie_matmul_act_dtype(t),
                        t == IE_DTYPE_MXFP4 ? IE_DTYPE_Q8_0 : ie_matmul_packed_act_dtype(t));
    }
    CU_ASSERT_EQUAL(ie_kq_panel(IE_DTYPE_Q4_0, &(ie_kq_panel_t){0}), -1);
    CU_ASSERT_EQUAL(ie_kq_panel(IE_DTYPE_Q8_K, &(ie_kq_panel_t){0}), -1);
}

/* ------------------------------------------------- repack and dequant */

static void test_repack_lossless(void)
{
    static const int64_t nouts[] = {1, 15, 16, 17, 33, 48};
    static const int nblocks[] = {1, 2, 3, 5};
    int bad = 0, cases = 0;
    rng_seed(11);
    for (int ti = 0; ti < N_KTYPES; ti++)
        for (int a = 0; a < 4; a++)
            for (int o = 0; o < 6; o++) {
                const spec_t *s = &SPEC[ti];
                const ie_dtype_t t = s->t;
                const int64_t n_in = (int64_t)nblocks[a] * s->qk, n_out = nouts[o];
                const int64_t np = (n_out + 15) / 16, padded = np * 16;
                const size_t pb = ie_pack_bytes(t, s->qk, n_in, n_out), rb = ie_dtype_row_bytes(t, n_in);
                CU_ASSERT_FATAL(pb == (size_t)np * (size_t)nblocks[a] * sp_block(s));
                uint8_t *w = a == 2 ? quant_rows(t, n_in, n_out) : rand_rows(t, n_in, n_out);
                uint8_t *p0 = palloc(pb, 0x00), *p1 = palloc(pb, 0xff), *p2 = palloc(pb, 0x5a);
                /* group is ignored for the k-quants (0 here) */
                CU_ASSERT_EQUAL(ie_pack_repack(t, 0, w, n_in, 0, n_out, n_out, p0), 0);
                CU_ASSERT_EQUAL(ie_pack_repack(t, s->qk, w, n_in, 0, n_out, n_out, p1), 0);
                /* in panel pieces, last first */
                for (int64_t p = np - 1; p >= 0; p--) {
                    const int64_t r1 = (p + 1) * 16 < n_out ? (p + 1) * 16 : n_out;
                    CU_ASSERT_EQUAL(ie_pack_repack(t, 32, w, n_in, p * 16, r1, n_out, p2), 0);
                }
                if (memcmp(p0, p1, pb) != 0 || memcmp(p0, p2, pb) != 0) {
                    printf("\n  %s n_in=%lld n_out=%lld: repack bytes depend on the fill or the pieces",
                           ie_dtype_name(t), (long long)n_in, (long long)n_out);
                    bad++;
                }
                const ie_pmat_t m = {t, s->qk, n_in, n_out, p0};
                float *got = xmalloc(sizeof(float) * (size_t)n_in), *want = xmalloc(sizeof(float) * (size_t)n_in);
                for (int64_t r = 0; r < padded; r++) {
                    const int i = (int)(r % 16);
                    for (int64_t b = 0; b < n_in / s->qk; b++) {
                        const uint8_t *blk = sp_at(s, p0, n_in, r / 16, b);
                        ie_kq_codes_t c;
                        if (r < n_out)
                            ie_kq_decode(t, w + (size_t)r * rb + (size_t)b * ie_dtype_block_bytes(t), &c);
                        else memset(&c, 0, sizeof c); /* padding: every field 0 */
                        int fb = sp_f16(blk, 0, i) != c.d || (s->dmin && sp_f16(blk, 1, i) != c.dmin);
                        for (int j = 0; j < s->nsub; j++)
                            fb += sp_sc(s, blk, 0, j, i) != c.sc[j] || (s->mn && sp_sc(s, blk, 1, j, i) != c.mn[j]);
                        for (int k = 0; k < s->qk; k++) fb += sp_code(s, blk, i, k) != c.u[k];
                        if (fb) {
                            if (bad < 5)
                                printf("\n  %s n_in=%lld n_out=%lld row %lld block %lld: %d fields differ from the "
                                       "spec%s",
                                       ie_dtype_name(t), (long long)n_in, (long long)n_out, (long long)r,
                                       (long long)b, fb, r >= n_out ? " (padding row)" : "");
                            bad++;
                        }
                    }
                    if (r >= n_out) continue;
                    ie_dequantize_row(t, w + (size_t)r * rb, want, n_in);
                    for (int64_t k = 0; k < n_in; k++) got[k] = -7.0f;
                    ie_pack_dequant_row(&m, r, got);
                    if (memcmp(got, want, sizeof(float) * (size_t)n_in) != 0) {
                        if (bad < 5)
                            printf("\n  %s n_in=%lld n_out=%lld row %lld: dequant_row != ie_dequantize_row",
                                   ie_dtype_name(t), (long long)n_in, (long long)n_out, (long long)r);
                        bad++;
                    }
                }
                /* a range writes its panels only */
                if (np > 1) {
                    memset(p2, 0x5a, pb);
                    CU_ASSERT_EQUAL(ie_pack_repack(t, 0, w, n_in, 16, 32 < n_out ? 32 : n_out, n_out, p2), 0);
                    const size_t ppb = pb / (size_t)np;
                    int outside = 0;
                    for (size_t j = 0; j < pb; j++)
                        if ((j < ppb || j >= 2 * ppb) && p2[j] != 0x5a) outside++;
                    if (outside || memcmp(p2 + ppb, p0 + ppb, ppb) != 0) {
                        printf("\n  %s n_in=%lld n_out=%lld: repack of rows [16, 32) wrong or outside its panel",
                               ie_dtype_name(t), (long long)n_in, (long long)n_out);
                        bad++;
                    }
                }
                /* bad ranges / shapes refused */
                CU_ASSERT_EQUAL(ie_pack_repack(t, 0, w, n_in, 1, n_out, n_out, p0), -1);
                CU_ASSERT_EQUAL(ie_pack_repack(t, 0, w, n_in, 0, n_out + 1, n_out, p0), -1);
                CU_ASSERT_EQUAL(ie_pack_repack(t, 0, w, n_in + s->qk / 2, 0, n_out, n_out, p0), -1);
                CU_ASSERT_EQUAL(ie_pack_repack(IE_DTYPE_Q8_K, 0, w, n_in, 0, n_out, n_out, p0), -1);
                free(got);
                free(want);
                free(w);
                free(p0);
                free(p1);
                free(p2);
                cases++;
            }
    printf("\n    %d cases", cases);
    CU_ASSERT_EQUAL(bad, 0);
}

/* MXFP4's panel form (ie_pack.h): d = 2^(e-128) as f16 for e in [104, 143]
 * (each end repacks, and dequantizes to ie_dequantize_row's bits), d = 0
 * for a block of +-0 codes whatever its e; one block outside both makes
 * ie_pack_repack refuse the matrix (-1) whichever row it sits in. And
 * ie_kq_encode's inverse: the e of a power-of-two d, -1 for any other d. */
static void test_mxfp4_range(void)
{
    const ie_dtype_t t = IE_DTYPE_MXFP4;
    const int64_t n_in = 64, n_out = 20;
    const size_t rb = ie_dtype_row_bytes(t, n_in), pb = ie_pack_bytes(t, 32, n_in, n_out);
    uint8_t *w = xmalloc(rb * (size_t)n_out), *pw = palloc(pb, 0);
    float *got = xmalloc(sizeof(float) * (size_t)n_in), *want = xmalloc(sizeof(float) * (size_t)n_in);
    rng_seed(41);
    static const struct {
        int e, zero_codes, ok;
    } C[] = {{104, 0, 1}, {143, 0, 1}, {127, 0, 1}, {103, 0, 0}, {144, 0, 0}, {0, 0, 0},
             {255, 0, 0}, {0, 1, 1},   {103, 1, 1}, {255, 1, 1}, {1, 1, 1}};
    int bad = 0;
    for (int ci = 0; ci < (int)(sizeof C / sizeof C[0]); ci++)
        for (int64_t row = 0; row < n_out; row += 19) { /* in the first and the last (padded) panel */
            for (size_t i = 0; i < rb * (size_t)n_out; i++) w[i] = (uint8_t)rng_u32();
            for (size_t i = 0; i < rb * (size_t)n_out; i += sizeof(ie_block_mxfp4_t))
                w[i] = (uint8_t)(110 + rng_u32() % 30);
            uint8_t *blk = w + (size_t)row * rb + sizeof(ie_block_mxfp4_t); /* the row's second block */
            blk[0] = (uint8_t)C[ci].e;
            blk[1] = 0x12; /* codes 2 and 1: nonzero (overwritten below for the +-0 case) */
            if (C[ci].zero_codes)
                for (int k = 1; k <= 16; k++) blk[k] = (uint8_t)((rng_u32() & 0x88));
            const int rc = ie_pack_repack(t, 32, w, n_in, 0, n_out, n_out, pw);
            if (rc != (C[ci].ok ? 0 : -1)) {
                printf("\n  e=%d zero codes %d row %lld: repack %d", C[ci].e, C[ci].zero_codes, (long long)row, rc);
                bad++;
                continue;
            }
            if (rc != 0) continue;
            const ie_pmat_t m = {t, 32, n_in, n_out, pw};
            for (int64_t r = 0; r < n_out; r++) {
                ie_dequantize_row(t, w + (size_t)r * rb, want, n_in);
                ie_pack_dequant_row(&m, r, got);
                if (memcmp(got, want, sizeof(float) * (size_t)n_in) != 0) {
                    printf("\n  e=%d row %lld: dequant_row != ie_dequantize_row", C[ci].e, (long long)r);
                    bad++;
                }
            }
        }
    /* encode: the exponent of a power-of-two d; refusals */
    ie_kq_codes_t c;
    memset(&c, 0, sizeof c);
    c.u[3] = 7;
    uint8_t b[sizeof(ie_block_mxfp4_t)];
    for (int e = 104; e <= 143; e++) {
        c.d = ie_f32_to_f16(ldexpf(1.0f, e - 128));
        ie_kq_codes_t back;
        if (ie_kq_encode(t, &c, b) != 0 || b[0] != e || ie_kq_decode(t, b, &back) != 0 || back.d != c.d ||
            back.u[3] != 7 || back.u[0] != 0)
            bad++;
    }
    static const float nope[] = {0.75f, -1.0f, 65536.0f, 0x1p-25f, 3.0f};
    for (int i = 0; i < 5; i++) {
        c.d = ie_f32_to_f16(nope[i]);
        if (c.d != 0 && ie_kq_encode(t, &c, b) != -1) bad++;
    }
    c.d = 0; /* zero scale: only with +-0 codes */
    CU_ASSERT_EQUAL(ie_kq_encode(t, &c, b), -1);
    c.u[3] = 8;
    CU_ASSERT_EQUAL(ie_kq_encode(t, &c, b), 0);
    CU_ASSERT_EQUAL(b[0], 0);
    free(w);
    free(pw);
    free(got);
    free(want);
    CU_ASSERT_EQUAL(bad, 0);
}

/* --------------------------------------------------------------- slice */

static void test_slice(void)
{
    int bad = 0, cases = 0;
    rng_seed(23);
    for (int ti = 0; ti < N_KTYPES; ti++) {
        const spec_t *s = &SPEC[ti];
        const ie_dtype_t t = s->t;
        const int64_t nb = 4, n_in = nb * s->qk, n_out = 40;
        const size_t rb = ie_dtype_row_bytes(t, n_in), bb = ie_dtype_block_bytes(t);
        uint8_t *w = rand_rows(t, n_in, n_out);
        const size_t pb = ie_pack_bytes(t, s->qk, n_in, n_out);
        uint8_t *pw = palloc(pb, 0);
        CU_ASSERT_EQUAL_FATAL(ie_pack_repack(t, 0, w, n_in, 0, n_out, n_out, pw), 0);
        static const int64_t cuts[][2] = {{0, 40},  {0, 16}, {16, 32}, {16, 40},
                                          {32, 40}, {0, 1},  {16, 17}, {0, 33}};
        for (int ci = 0; ci < 8; ci++)
            for (int64_t b0 = 0; b0 < nb; b0++)
                for (int64_t b1 = b0 + 1; b1 <= nb; b1++) {
                    const int64_t r0 = cuts[ci][0], r1 = cuts[ci][1], c0 = b0 * s->qk, c1 = b1 * s->qk;
                    const int64_t rows = r1 - r0, cols = c1 - c0;
                    /* ROWS: whole blocks of each row */
                    const size_t srb = ie_tensor_bytes(t, IE_LAYOUT_ROWS, 0, cols, rows);
                    uint8_t *sr = palloc(srb, 0x33);
                    CU_ASSERT_EQUAL_FATAL(ie_tensor_slice(t, IE_LAYOUT_ROWS, 0, w, n_in, n_out, r0, r1, c0, c1, sr),
                                          0);
                    for (int64_t r = 0; r < rows; r++)
                        if (memcmp(sr + (size_t)r * (size_t)(b1 - b0) * bb,
                                   w + (size_t)(r0 + r) * rb + (size_t)b0 * bb, (size_t)(b1 - b0) * bb) != 0)
                            bad++;
                    /* PANEL16: == repacking the sliced rows, padding included */
                    const size_t spb = ie_tensor_bytes(t, IE_LAYOUT_PANEL16, s->qk, cols, rows);
                    uint8_t *sp = palloc(spb, 0x77), *want = palloc(spb, 0x00);
                    CU_ASSERT_EQUAL_FATAL(ie_tensor_slice(t, IE_LAYOUT_PANEL16, s->qk, pw, n_in, n_out, r0, r1, c0,
                                                          c1, sp),
                                          0);
                    CU_ASSERT_EQUAL_FATAL(ie_pack_repack(t, 0, sr, cols, 0, rows, rows, want), 0);
                    if (memcmp(sp, want, spb) != 0) {
                        if (bad < 5)
                            printf("\n  %s slice rows [%lld,%lld) cols [%lld,%lld) != repack of the sliced rows",
                                   ie_dtype_name(t), (long long)r0, (long long)r1, (long long)c0, (long long)c1);
                        bad++;
                    }
                    free(sr);
                    free(sp);
                    free(want);
                    cases++;
                }
        /* bad cuts: not on block boundaries, rows not on panels, out of range */
        uint8_t *dst = palloc(pb + rb * (size_t)n_out, 0x44), *ref = palloc(pb + rb * (size_t)n_out, 0x44);
        const size_t nd = pb + rb * (size_t)n_out;
        const int64_t q = s->qk;
        const int64_t badc[][4] = {{0, 16, 32, q},       {0, 16, 0, q + 32}, {0, 16, q / 2, q},
                                   {0, 16, 0, n_in + q}, {0, 16, -q, q},     {0, 16, q, q},
                                   {0, 41, 0, q},        {-16, 16, 0, q},    {16, 16, 0, q}};
        for (int k = 0; k < 9; k++) {
            const int64_t *c = badc[k];
            if (q == 32 && (k == 0 || k == 1)) continue; /* multiples of 32 are block boundaries there */
            CU_ASSERT_EQUAL(ie_tensor_slice(t, IE_LAYOUT_ROWS, 0, w, n_in, n_out, c[0], c[1], c[2], c[3], dst), -1);
            CU_ASSERT_EQUAL(ie_tensor_slice(t, IE_LAYOUT_PANEL16, s->qk, pw, n_in, n_out, c[0], c[1], c[2], c[3],
                                            dst),
                            -1);
        }
        /* PANEL16 only: r0 off a panel; a group that is not the block size */
        CU_ASSERT_EQUAL(ie_tensor_slice(t, IE_LAYOUT_PANEL16, s->qk, pw, n_in, n_out, 8, 24, 0, q, dst), -1);
        CU_ASSERT_EQUAL(ie_tensor_slice(t, IE_LAYOUT_PANEL16, 32 + s->qk, pw, n_in, n_out, 0, 16, 0, q, dst), -1);
        if (memcmp(dst, ref, nd) != 0) {
            printf("\n  %s: a refused slice wrote into dst", ie_dtype_name(t));
            bad++;
        }
        free(dst);
        free(ref);
        free(w);
        free(pw);
    }
    printf("\n    %d cases", cases);
    CU_ASSERT_EQUAL(bad, 0);
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

/* Activation rows for weights of type t: n_tok rows of n_in, as bytes
 * apart. Row 2 (if any) is all zeros, row 4 constant (every q at +-127),
 * the rest Gaussian. */
static void make_acts(ie_dtype_t t, int64_t n_in, int64_t n_tok, uint8_t *a, size_t as)
{
    float *x = xmalloc(sizeof(float) * (size_t)n_in);
    for (int64_t k = 0; k < n_tok; k++) {
        if (k == 2) memset(x, 0, sizeof(float) * (size_t)n_in);
        else if (k == 4)
            for (int64_t j = 0; j < n_in; j++) x[j] = 1.5f;
        else fill_gauss(x, n_in);
        if (ie_matmul_packed_act_dtype(t) == IE_DTYPE_Q8_P) ie_quantize_row_q8_p_ref(x, a + (size_t)k * as, n_in);
        else ie_quantize_row_q8_k_ref(x, (ie_block_q8_k_t *)(void *)(a + (size_t)k * as), n_in);
    }
    free(x);
}

/* Activation block b of a row: its quants and, per format, d, s (Q8_P) or
 * bsums (Q8_K), read from the ie_pack.h / ie_dtype.h layouts. */
static const int8_t *act_q(ie_dtype_t t, const uint8_t *row, int64_t n_in, int64_t b, float *d, float *s,
                           int16_t *bsums)
{
    if (ie_matmul_packed_act_dtype(t) == IE_DTYPE_Q8_P) {
        memcpy(d, row + n_in + 4 * b, 4);
        memcpy(s, row + n_in + 4 * (n_in / 32) + 4 * b, 4);
        return (const int8_t *)row + 32 * b;
    }
    const uint8_t *blk = row + (size_t)b * sizeof(ie_block_q8_k_t);
    memcpy(d, blk + offsetof(ie_block_q8_k_t, d), 4);
    memcpy(bsums, blk + offsetof(ie_block_q8_k_t, bsums), 32);
    *s = 0.0f;
    return (const int8_t *)(blk + offsetof(ie_block_q8_k_t, q));
}

/* The double-precision truth (dequantized weights x dequantized
 * activations) and the tolerance scale T of the header, for one weight
 * row (ROWS, row bytes wr) and one activation row. */
static void truth_and_T(ie_dtype_t t, const uint8_t *wr, const uint8_t *ar, int64_t n_in, double *truth, double *T,
                        double *abs_sum)
{
    const spec_t *s = spec_of(t);
    const size_t bb = ie_dtype_block_bytes(t);
    float wf[256];
    double sum = 0.0, tt = 0.0, as = 0.0;
    const int8_t *book = ie_kq_book(t); /* codes index it (IQ4_NL, IQ4_XS, MXFP4) */
    for (int64_t b = 0; b < n_in / s->qk; b++) {
        ie_kq_codes_t c;
        float da, sa;
        int16_t bs[16];
        ie_kq_decode(t, wr + (size_t)b * bb, &c);
        ie_dequantize_row(t, wr + (size_t)b * bb, wf, s->qk);
        const int8_t *q = act_q(t, ar, n_in, b, &da, &sa, bs);
        for (int k = 0; k < s->qk; k++) {
            sum += (double)wf[k] * ((double)da * q[k]);
            as += fabs((double)wf[k] * ((double)da * q[k]));
        }
        const double dw = ie_f16_to_f32(c.d), dm = ie_f16_to_f32(c.dmin);
        if (s->qk == 32) {
            double si = 0.0;
            for (int k = 0; k < 32; k++) si += fabs((double)(book ? book[c.u[k]] : c.u[k]) * q[k]);
            tt += fabs(dw * da) * si + (t == IE_DTYPE_Q5_0 ? 16.0 : 0.0) * fabs(dw * sa) + fabs(dm * sa);
            continue;
        }
        const int len = 256 / s->nsub, off = t == IE_DTYPE_Q3_K ? 4 : t == IE_DTYPE_Q6_K ? 32 : 0;
        for (int j = 0; j < s->nsub; j++) {
            double si = 0.0, bsj = 0.0;
            for (int k = j * len; k < (j + 1) * len; k++) {
                si += fabs((double)(book ? book[c.u[k]] : c.u[k]) * q[k]);
                bsj += q[k];
            }
            tt += fabs(dw * da * c.sc[j]) * (si + off * fabs(bsj)) + fabs(dm * da * c.mn[j] * bsj);
        }
    }
    *truth = sum;
    *T = tt;
    *abs_sum = as;
}

/* The ROWS reference of type t that reads the packed kernels' activations
 * (kquant_ref.c); NULL for MXFP4 (its ROWS kernels read Q8_0). */
static ie_matmul_fn rows_ref(ie_dtype_t t)
{
    switch (t) {
    case IE_DTYPE_Q5_0: return ie_matmul_q5_0_q8_p_ref;
    case IE_DTYPE_Q5_1: return ie_matmul_q5_1_q8_p_ref;
    case IE_DTYPE_IQ4_NL: return ie_matmul_iq4_nl_q8_p_ref;
    case IE_DTYPE_Q2_K: return ie_matmul_q2_k_q8_k_ref;
    case IE_DTYPE_Q3_K: return ie_matmul_q3_k_q8_k_ref;
    case IE_DTYPE_Q4_K: return ie_matmul_q4_k_q8_k_ref;
    case IE_DTYPE_Q5_K: return ie_matmul_q5_k_q8_k_ref;
    case IE_DTYPE_Q6_K: return ie_matmul_q6_k_q8_k_ref;
    case IE_DTYPE_IQ4_XS: return ie_matmul_iq4_xs_q8_k_ref;
    default: return NULL;
    }
}

#define SENTINEL (-12345.0f)
#define GUARD_FLOATS 32

typedef struct {
    int64_t r[64][2];
    int n, at;
} rsrc_t;

/* Ranges of 1-3 panels, shuffled. */
static int rsrc_next(void *ctx, int64_t *p0, int64_t *p1)
{
    rsrc_t *s = ctx;
    if (s->at >= s->n) return 0;
    *p0 = s->r[s->at][0];
    *p1 = s->r[s->at][1];
    s->at++;
    return 1;
}

static void rsrc_make(rsrc_t *src, int64_t np)
{
    src->n = src->at = 0;
    for (int64_t p = 0; p < np && src->n < 64;) {
        const int64_t len = 1 + (int64_t)(rng_u32() % 3);
        src->r[src->n][0] = p;
        src->r[src->n][1] = p + len < np ? p + len : np;
        p = src->r[src->n][1];
        src->n++;
    }
    for (int k = src->n - 1; k > 0; k--) {
        const int j = (int)(rng_u32() % (uint32_t)(k + 1));
        const int64_t t0 = src->r[k][0], t1 = src->r[k][1];
        src->r[k][0] = src->r[j][0];
        src->r[k][1] = src->r[j][1];
        src->r[j][0] = t0;
        src->r[j][1] = t1;
    }
}

typedef struct {
    ie_dtype_t t;
    int64_t n_in, n_out, n_tok, r0, r1;
    int ldy_extra, as_extra;
    uint64_t seed;
    int real; /* weights from ie_quantize_row of floats, not random codes */
} mcase_t;

/* One case: the packed ref against the ROWS ref (bits) and the truth
 * (1e-5*T), then every ISA's matmul_packed on [r0, r1) and its _ranges on
 * the whole matrix against the packed ref. Returns the bad values. */
static int check_case(const mcase_t *c)
{
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    const ie_dtype_t t = c->t;
    const int qk = ie_dtype_block_elems(t);
    const int64_t n_in = c->n_in, n_out = c->n_out, n_tok = c->n_tok, ldy = n_out + c->ldy_extra;
    const size_t rb = ie_dtype_row_bytes(t, n_in), pb = ie_pack_bytes(t, qk, n_in, n_out);
    const size_t arow = ie_dtype_row_bytes(ie_matmul_packed_act_dtype(t), n_in), as = arow + (size_t)c->as_extra;
    const size_t ny = (size_t)(ldy * n_tok) + GUARD_FLOATS;
    rng_seed(c->seed);
    uint8_t *w = c->real ? quant_rows(t, n_in, n_out) : rand_rows(t, n_in, n_out);
    guarded_t gw, ga;
    uint8_t *pw = guarded_alloc(&gw, pb, 64);
    uint8_t *a = guarded_alloc(&ga, as * (size_t)(n_tok - 1) + arow, 4);
    CU_ASSERT_EQUAL_FATAL(ie_pack_repack(t, 0, w, n_in, 0, n_out, n_out, pw), 0);
    make_acts(t, n_in, n_tok, a, as);
    const ie_pmat_t m = {t, qk, n_in, n_out, pw};
    float *yref = xmalloc(sizeof(float) * ny), *yrows = xmalloc(sizeof(float) * ny),
          *y = xmalloc(sizeof(float) * ny);
    double *tol = xmalloc(sizeof(double) * (size_t)(n_out * n_tok));
    int bad = 0;
#define SHAPE_FMT "%s n_in=%lld n_out=%lld n_tok=%lld rows [%lld,%lld)"
#define SHAPE_ARGS \
    ie_dtype_name(t), (long long)n_in, (long long)n_out, (long long)n_tok, (long long)c->r0, (long long)c->r1
    /* the oracle on the whole matrix; the ROWS ref on the same rows */
    for (size_t j = 0; j < ny; j++) yref[j] = yrows[j] = SENTINEL;
    CU_ASSERT_EQUAL(ie_matmul_packed_ref(&m, 0, n_out, a, as, n_tok, yref, ldy), IE_OK);
    if (rows_ref(t)) rows_ref(t)(w, n_in, 0, n_out, a, as, n_tok, yrows, ldy);
    if (rows_ref(t) && memcmp(yref, yrows, sizeof(float) * ny) != 0) {
        printf("\n  ref " SHAPE_FMT ": packed ref != ROWS ref (bits)", SHAPE_ARGS);
        bad++;
    }
    for (int64_t k = 0; k < n_tok; k++)
        for (int64_t r = 0; r < n_out; r++) {
            double truth, T, S;
            truth_and_T(t, w + (size_t)r * rb, a + (size_t)k * as, n_in, &truth, &T, &S);
            tol[k * n_out + r] = 1e-5 * T + 1e-30;
            /* the truth's own weights are rounded to f32 ((d*sc)*u - dmin*mn,
             * d*u + m): 2^-23 of sum |w*a| on top */
            if (!(fabs((double)yref[k * ldy + r] - truth) <= tol[k * n_out + r] + 0x1p-23 * S)) {
                if (bad < 4)
                    printf("\n  ref " SHAPE_FMT ": y[%lld][%lld]=%.9g truth=%.9g tol=%.3g", SHAPE_ARGS,
                           (long long)k, (long long)r, yref[k * ldy + r], truth, tol[k * n_out + r]);
                bad++;
            }
        }
    for (int i = 0; i < ni; i++) {
        const ie_kernels_t *ops = ie_kernels_get(isas[i]);
        const char *isa = ie_isa_name(isas[i]);
        for (int pass = 0; pass < 2; pass++) { /* 0: matmul_packed on [r0, r1); 1: _ranges, whole */
            const int64_t r0 = pass ? 0 : c->r0, r1 = pass ? n_out : c->r1;
            for (size_t j = 0; j < ny; j++) y[j] = SENTINEL;
            ie_status_t rc;
            rsrc_t src;
            if (pass) {
                rsrc_make(&src, (n_out + 15) / 16);
                rc = ops->matmul_packed_ranges(&m, rsrc_next, &src, a, as, n_tok, y, ldy);
            } else {
                rc = ops->matmul_packed(&m, r0, r1, a, as, n_tok, y, ldy);
            }
            if (rc != IE_OK) {
                printf("\n  %s %s " SHAPE_FMT ": status %d", isa, pass ? "ranges" : "matmul_packed", SHAPE_ARGS,
                       (int)rc);
                bad++;
                continue;
            }
            for (int64_t k = 0; k < n_tok; k++)
                for (int64_t r = 0; r < ldy; r++) {
                    const float v = y[k * ldy + r];
                    if (r < r0 || r >= r1) {
                        if (v != SENTINEL) {
                            if (bad < 4)
                                printf("\n  %s %s " SHAPE_FMT ": wrote y[%lld][%lld] outside its rows", isa,
                                       pass ? "ranges" : "matmul_packed", SHAPE_ARGS, (long long)k, (long long)r);
                            bad++;
                        }
                        continue;
                    }
                    const double e = fabs((double)v - yref[k * ldy + r]);
                    if (!(e <= tol[k * n_out + r])) {
                        if (bad < 4)
                            printf("\n  %s %s " SHAPE_FMT ": y[%lld][%lld]=%.9g ref=%.9g |diff|=%.3g tol=%.3g", isa,
                                   pass ? "ranges" : "matmul_packed", SHAPE_ARGS, (long long)k, (long long)r, v,
                                   yref[k * ldy + r], e, tol[k * n_out + r]);
                        bad++;
                    }
                }
            for (size_t j = (size_t)(ldy * n_tok); j < ny; j++)
                if (y[j] != SENTINEL) {
                    printf("\n  %s " SHAPE_FMT ": wrote past y", isa, SHAPE_ARGS);
                    bad++;
                    break;
                }
            if (pass) { /* ranges == the same ISA's matmul_packed, bit for bit */
                float *yp = xmalloc(sizeof(float) * ny);
                for (size_t j = 0; j < ny; j++) yp[j] = SENTINEL;
                CU_ASSERT_EQUAL(ops->matmul_packed(&m, 0, n_out, a, as, n_tok, yp, ldy), IE_OK);
                if (memcmp(yp, y, sizeof(float) * ny) != 0) {
                    printf("\n  %s " SHAPE_FMT ": matmul_packed_ranges != matmul_packed (bits)", isa, SHAPE_ARGS);
                    bad++;
                }
                free(yp);
            }
        }
    }
#undef SHAPE_FMT
#undef SHAPE_ARGS
    guarded_free(&gw);
    guarded_free(&ga);
    free(w);
    free(yref);
    free(yrows);
    free(y);
    free(tol);
    return bad;
}

/* Every type x n_in (one block, several, odd counts) x n_out x n_tok, the
 * token counts cycling so that each type meets each; whole and sub-ranges,
 * ldy > n_out and a_stride > row bytes on some. */
static void test_matmul_shapes(void)
{
    static const int64_t ntoks[] = {1, 2, 3, 5, 8, 17, 64};
    static const int64_t nouts[] = {1, 15, 16, 33, 100};
    static const int nblk32[] = {1, 2, 3, 7, 24}, nblk256[] = {1, 2, 3, 5};
    int bad = 0, cases = 0, k = 0;
    for (int ti = 0; ti < N_KTYPES; ti++) {
        const ie_dtype_t t = KTYPES[ti];
        const int qk = ie_dtype_block_elems(t), nn = qk == 32 ? 5 : 4;
        for (int a = 0; a < nn; a++)
            for (int o = 0; o < 5; o++, k++) {
                const int64_t n_in = (int64_t)(qk == 32 ? nblk32[a] : nblk256[a]) * qk, n_out = nouts[o];
                mcase_t c = {t,     n_in,  n_out,       ntoks[(k + a) % 7], 0,
                             n_out, k % 3, 4 * (k % 4), 900 + (uint64_t)k,  o == 4};
                if (c.n_tok == 64 && n_in * n_out > 100 * 768) c.n_tok = 17; /* keep the scalar oracle quick */
                if (n_out > 16 && k % 2) {                                   /* a sub-range */
                    const int64_t np = (n_out + 15) / 16;
                    c.r0 = 16 * (k % np);
                    c.r1 = (k & 2) ? n_out : c.r0 + 16 * (1 + k % 2);
                    if (c.r1 > n_out) c.r1 = n_out;
                }
                bad += check_case(&c);
                cases++;
            }
        /* every token count on a mid shape with a sub-range */
        for (int j = 0; j < 7; j++, k++) {
            mcase_t c = {t,    (qk == 32 ? 5 : 2) * (int64_t)qk, 33, ntoks[j], 16, 33, 3, 8, 5000 + (uint64_t)k,
                         j % 2};
            bad += check_case(&c);
            cases++;
        }
    }
    printf("\n    %d cases", cases);
    CU_ASSERT_EQUAL(bad, 0);
}

/* Long rows (more k than one pass of a blocked kernel: 131 blocks of 32,
 * 43 of 256 — odd counts) and more panels, at decode and prefill token
 * counts (23: more tokens than one token block of the GEMMs at this row
 * length), whole and sub-ranges. */
static void test_matmul_large(void)
{
    static const int64_t ntoks[] = {1, 3, 9, 23};
    int bad = 0, cases = 0, k = 0;
    for (int ti = 0; ti < N_KTYPES; ti++)
        for (int j = 0; j < 4; j++, k++) {
            const ie_dtype_t t = KTYPES[ti];
            const int64_t n_in = ie_dtype_block_elems(t) == 32 ? 131 * 32 : 43 * 256, n_out = 72;
            mcase_t c = {t, n_in, n_out, ntoks[j], 0, n_out, j, 4 * j, 7000 + (uint64_t)k, 0};
            if (j == 1) { /* rows [16, 48) */
                c.r0 = 16;
                c.r1 = 48;
            }
            c.real = j == 2;
            bad += check_case(&c);
            cases++;
        }
    /* prefill past one pass of the kernels' token tiles (AVX-512 unpacks
     * the merged-plane types' codes once for 16 tiles of 8 tokens: 137 =
     * 128 + 9 tokens, the second pass two tiles) over 11 blocks of 256
     * (one k-chunk of 8 and a tail of 3), a partial last panel */
    for (int ti = 0; ti < N_KTYPES; ti++, k++) {
        const ie_dtype_t t = KTYPES[ti];
        if (ie_dtype_block_elems(t) != 256) continue;
        mcase_t c = {t, 11 * 256, 40, 137, 0, 40, 5, 0, 7500 + (uint64_t)k, ti % 2};
        bad += check_case(&c);
        cases++;
    }
    printf("\n    %d cases", cases);
    CU_ASSERT_EQUAL(bad, 0);
}

/* Bad matrices and ranges are refused by every ISA with IE_ERR_INVAL. */
static void test_matmul_bad_args(void)
{
    ie_isa_t isas[3];
    const int ni = n_isas(isas);
    rng_seed(5);
    for (int ti = 0; ti < N_KTYPES; ti++) {
        const ie_dtype_t t = KTYPES[ti];
        const int qk = ie_dtype_block_elems(t);
        const int64_t n_in = qk, n_out = 40;
        uint8_t *w = rand_rows(t, n_in, n_out);
        uint8_t *pw = palloc(ie_pack_bytes(t, qk, n_in, n_out), 0);
        CU_ASSERT_EQUAL_FATAL(ie_pack_repack(t, 0, w, n_in, 0, n_out, n_out, pw), 0);
        const size_t arow = ie_dtype_row_bytes(ie_matmul_packed_act_dtype(t), n_in);
        uint8_t *a = palloc(arow * 2, 0);
        make_acts(t, n_in, 2, a, arow);
        float y[80];
        for (int i = 0; i < ni; i++) {
            const ie_kernels_t *ops = ie_kernels_get(isas[i]);
            const ie_pmat_t ok = {t, qk, n_in, n_out, pw}, g32 = {t, qk == 32 ? 64 : 32, n_in, n_out, pw},
                            odd = {t, qk, n_in + qk / 2, n_out, pw};
            CU_ASSERT_EQUAL(ops->matmul_packed(&g32, 0, 40, a, arow, 2, y, 40), IE_ERR_INVAL);
            CU_ASSERT_EQUAL(ops->matmul_packed(&odd, 0, 40, a, arow, 2, y, 40), IE_ERR_INVAL);
            CU_ASSERT_EQUAL(ops->matmul_packed(&ok, 8, 40, a, arow, 2, y, 40), IE_ERR_INVAL);
            CU_ASSERT_EQUAL(ops->matmul_packed(&ok, 0, 41, a, arow, 2, y, 40), IE_ERR_INVAL);
            CU_ASSERT_EQUAL(ops->matmul_packed(&ok, 0, 20, a, arow, 2, y, 40), IE_ERR_INVAL);
            CU_ASSERT_EQUAL(ops->matmul_packed(&ok, 32, 40, a, arow, 2, y, 40), IE_OK);
            rsrc_t badr = {.r = {{3, 4}}, .n = 1};
            CU_ASSERT_EQUAL(ops->matmul_packed_ranges(&ok, rsrc_next, &badr, a, arow, 2, y, 40), IE_ERR_INVAL);
        }
        free(w);
        free(pw);
        free(a);
    }
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("kquant_pack", NULL, NULL);
    CU_add_test(s, "k-quant panel sizes, checks, refusals", test_check_sizes);
    CU_add_test(s, "repack lossless: spec fields, dequant_row == ie_dequantize_row", test_repack_lossless);
    CU_add_test(s, "MXFP4 panel form: exponent range, +-0 blocks, refusals", test_mxfp4_range);
    CU_add_test(s, "slice rows/panels == repack of the cut; bad cuts refused", test_slice);
    CU_add_test(s, "matmul_packed: ref == rows ref; every ISA vs ref, ranges", test_matmul_shapes);
    CU_add_test(s, "matmul_packed long rows, more panels (all ISAs)", test_matmul_large);
    CU_add_test(s, "matmul_packed bad args (all ISAs)", test_matmul_bad_args);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

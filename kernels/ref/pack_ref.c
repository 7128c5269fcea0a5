/* pack_ref.c — engine-native quantized weights (ie_pack.h): quantizers,
 * the PANEL16 repacker, dequantization, the Q8_P and Q16_P activation
 * quantizers and the reference (oracle) packed matmul.
 *
 * Everything here is scalar and allocation-free. A group is quantized in
 * two steps: choose its parameters (scale d, offset m and the f32 inverse
 * scale used for rounding) and then map each element to its code with
 * code_of(); both the ROWS and the PANEL16 writers call the same two
 * functions, so the two layouts hold identical values by construction.
 *
 * Codes: I8W q in [-127, 127] (stored as q + 128 in PANEL16, as int8 in
 * ROWS); I4W and I4WA u in [0, 15].
 *
 * The k-quants (Q5_0 .. IQ4_XS) come from files, never from floats here:
 * they are repacked from their ggml blocks through ie_kq_decode (the one
 * reader of ggml's bit layouts) and read back into an ie_kq_codes_t, whose
 * values ie_kq_value computes, so a packed row is the source row bit for
 * bit by construction.
 */
#include "ie_kernels.h"
#include "../src/ie_kernels_isa.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ------------------------------------------------------------- helpers */

static inline float ld_f16(const void *p)
{
    ie_f16_t h;
    memcpy(&h, p, sizeof h);
    return ie_f16_to_f32(h);
}

static inline void st_f16(void *p, ie_f16_t h) { memcpy(p, &h, sizeof h); }

static inline float ld_f32(const void *p)
{
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

static inline void st_f32(void *p, float f) { memcpy(p, &f, sizeof f); }

/* Bytes of one group's scales (d, and m for affine) per row. */
static size_t scale_bytes(ie_dtype_t t) { return t == IE_DTYPE_I4WA ? 4 : 2; }

/* Bytes of one group's quants per row. */
static size_t quant_bytes(ie_dtype_t t, int group) { return t == IE_DTYPE_I8W ? (size_t)group : (size_t)group / 2; }

/* Bytes of one group inside a panel: 16 rows of scales, then 16 rows of quants. */
static size_t panel_group_bytes(ie_dtype_t t, int group)
{
    return IE_PANEL * (scale_bytes(t) + quant_bytes(t, group));
}

/* ------------------------------------------------- group quantization */

/* Parameters of one quantized group. id, lo: what code_of() uses (f32,
 * before the f16 rounding of the stored values, as in ggml); d, m: the
 * stored f16 scale and offset (m only for I4WA). */
typedef struct {
    float id, lo;
    ie_f16_t d, m;
} qparams_t;

/* The code of x under p. The rules are ggml's: I8W q = roundf(x*id)
 * (Q8_0), I4W u = trunc(x*id + 8.5) (Q4_0), I4WA u = trunc((x-lo)*id + 0.5)
 * (Q4_1), each clamped to its range (with the absmax scale clamping only
 * ever bites at the top, exactly where ggml clamps; clipped MSE scales need
 * the other ends too). */
static inline int code_of(ie_dtype_t t, const qparams_t *p, float x)
{
    if (t == IE_DTYPE_I8W) {
        float v = roundf(x * p->id);
        if (v > 127.0f) v = 127.0f;
        if (v < -127.0f) v = -127.0f;
        return (int)v;
    }
    float v = t == IE_DTYPE_I4W ? x * p->id + 8.5f : (x - p->lo) * p->id + 0.5f;
    if (!(v >= 0.0f)) v = 0.0f;
    if (v > 15.0f) v = 15.0f;
    return (int)v; /* truncation, as ggml's (int8_t) cast */
}

/* The value code q stands for (exactly what the dequantizers compute). */
static inline float value_of(ie_dtype_t t, float d, float m, int q)
{
    switch (t) {
    case IE_DTYPE_I8W: return d * (float)q;
    case IE_DTYPE_I4W: return d * (float)(q - 8);
    default: return d * (float)q + m;
    }
}

/* Parameters for a group of n values with its absmax-style scale shrunk by
 * `ratio` (1.0: exactly ggml's rule for the type). */
static qparams_t group_params(ie_dtype_t t, const float *x, int n, float ratio)
{
    qparams_t p = {0.0f, 0.0f, 0, 0};
    if (t == IE_DTYPE_I4WA) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < n; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        float lo = min, d = (max - min) / 15.0f;
        if (ratio != 1.0f) { /* shrink the range around its centre */
            const float c = 0.5f * (max + min), h = 0.5f * (max - min) * ratio;
            lo = c - h;
            d = 2.0f * h / 15.0f;
        }
        p.id = ie_inv_scale(d);
        p.lo = lo;
        p.d = ie_f32_to_f16(d);
        p.m = ie_f32_to_f16(lo);
        return p;
    }
    float amax = 0.0f, max = 0.0f; /* max: the value of largest magnitude */
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    float d = t == IE_DTYPE_I8W ? amax / 127.0f : max / -8.0f;
    if (ratio != 1.0f) d *= ratio;
    p.id = t == IE_DTYPE_I8W ? ie_inv_scale(d) : (d != 0.0f ? 1.0f / d : 0.0f);
    if (isinf(p.id)) p.id = 0.0f;
    p.d = ie_f32_to_f16(d);
    return p;
}

/* Squared reconstruction error of the group under p (what the stored f16
 * values reproduce), in double. */
static double group_error(ie_dtype_t t, const qparams_t *p, const float *x, int n)
{
    const float d = ie_f16_to_f32(p->d), m = ie_f16_to_f32(p->m);
    double e = 0.0;
    for (int j = 0; j < n; j++) {
        const double r = (double)x[j] - (double)value_of(t, d, m, code_of(t, p, x[j]));
        e += r * r;
    }
    return e;
}

#define IE_MSE_STEPS 16 /* clip ratios 1.00, 0.98, ..., 0.70 */

/* Parameters for one group of n floats under rule `how`. IE_QSCALE_MSE
 * starts from ratio 1.0 (the absmax parameters) and only switches on a
 * strictly smaller error, so it is never worse than IE_QSCALE_ABSMAX. */
static qparams_t choose_params(ie_dtype_t t, ie_qscale_t how, const float *x, int n)
{
    qparams_t best = group_params(t, x, n, 1.0f);
    if (how != IE_QSCALE_MSE) return best;
    double best_err = group_error(t, &best, x, n);
    for (int i = 1; i < IE_MSE_STEPS && best_err > 0.0; i++) {
        const qparams_t p = group_params(t, x, n, 1.0f - 0.02f * (float)i);
        const double e = group_error(t, &p, x, n);
        if (e < best_err) {
            best = p;
            best_err = e;
        }
    }
    return best;
}

/* --------------------------------------------------------- ROWS layout */

/* Quantize one group of G floats into its ROWS-layout bytes. */
static void qrow_group(ie_dtype_t t, ie_qscale_t how, const float *x, int G, uint8_t *out)
{
    const qparams_t p = choose_params(t, how, x, G);
    st_f16(out, p.d);
    if (t == IE_DTYPE_I4WA) st_f16(out + 2, p.m);
    uint8_t *q = out + scale_bytes(t);
    if (t == IE_DTYPE_I8W) {
        for (int j = 0; j < G; j++) q[j] = (uint8_t)(int8_t)code_of(t, &p, x[j]);
    } else {
        for (int j = 0; j < G / 2; j++) q[j] = (uint8_t)(code_of(t, &p, x[j]) | code_of(t, &p, x[j + G / 2]) << 4);
    }
}

/* Quantize one row of n_in floats to the ROWS layout of an I-type
 * (n_in/G groups { f16 d; [f16 m]; codes }); with G = 32 byte-identical to
 * Q8_0 / Q4_0 / Q4_1 as ie_quantize_row writes them (absmax rule).
 * Returns 0, or -1 on an invalid (dtype, group, n_in) or NULL pointers. */
int ie_qrow_quantize(ie_dtype_t dtype, int group, ie_qscale_t how, const float *src, int64_t n_in, void *dst)
{
    if (!ie_dtype_is_intw(dtype) || ie_pack_check(dtype, group, n_in) != 0 || !src || !dst) return -1;
    const size_t gb = scale_bytes(dtype) + quant_bytes(dtype, group);
    for (int64_t g = 0; g < n_in / group; g++)
        qrow_group(dtype, how, src + g * group, group, (uint8_t *)dst + (size_t)g * gb);
    return 0;
}

/* Dequantize one ROWS-layout row of an I-type: x = d*q (I8W), d*(u-8)
 * (I4W), d*u + m (I4WA), computed in f32. Does nothing on an invalid shape. */
void ie_qrow_dequantize(ie_dtype_t dtype, int group, const void *src, float *dst, int64_t n_in)
{
    if (!ie_dtype_is_intw(dtype) || ie_pack_check(dtype, group, n_in) != 0) return;
    const size_t gb = scale_bytes(dtype) + quant_bytes(dtype, group);
    const int G = group;
    for (int64_t g = 0; g < n_in / G; g++) {
        const uint8_t *blk = (const uint8_t *)src + (size_t)g * gb;
        const float d = ld_f16(blk), m = dtype == IE_DTYPE_I4WA ? ld_f16(blk + 2) : 0.0f;
        const uint8_t *q = blk + scale_bytes(dtype);
        float *o = dst + g * G;
        if (dtype == IE_DTYPE_I8W) {
            for (int j = 0; j < G; j++) o[j] = value_of(dtype, d, m, (int8_t)q[j]);
        } else {
            for (int j = 0; j < G / 2; j++) {
                o[j] = value_of(dtype, d, m, q[j] & 0x0f);
                o[j + G / 2] = value_of(dtype, d, m, q[j] >> 4);
            }
        }
    }
}

/* ------------------------------------------------------ PANEL16 layout */

/* Start of group g of panel p. */
static uint8_t *panel_group(ie_dtype_t t, int G, int64_t n_in, void *base, int64_t p, int64_t g)
{
    return (uint8_t *)base + (size_t)p * ie_pack_panel_bytes(t, G, n_in) + (size_t)g * panel_group_bytes(t, G);
}

/* Byte of the quants of a panel group holding element kk (0 <= kk < G) of
 * panel row i, and for 4-bit types whether it is the high nibble. */
static inline size_t panel_quant_pos(ie_dtype_t t, int i, int kk, int *hi)
{
    if (t == IE_DTYPE_I8W) {
        *hi = 0;
        return (size_t)(kk / 4) * 64 + (size_t)(4 * i + kk % 4);
    }
    *hi = (kk % 8) >= 4;
    return (size_t)(kk / 8) * 64 + (size_t)(4 * i + kk % 4);
}

/* Write the scales and codes of panel row i of one group. x: the group's G
 * floats, or NULL for a padding row (all-zero values: d = m = 0 and the
 * code of 0.0f). Nibbles are or-ed in: the caller zeroes the quants first. */
static void panel_put_row(ie_dtype_t t, ie_qscale_t how, const float *x, int G, uint8_t *grp, int i)
{
    qparams_t p = {0.0f, 0.0f, 0, 0};
    if (x) p = choose_params(t, how, x, G);
    st_f16(grp + 2 * i, p.d);
    if (t == IE_DTYPE_I4WA) st_f16(grp + 2 * IE_PANEL + 2 * i, p.m);
    uint8_t *q = grp + IE_PANEL * scale_bytes(t);
    for (int kk = 0; kk < G; kk++) {
        int hi;
        const size_t pos = panel_quant_pos(t, i, kk, &hi);
        const int c = code_of(t, &p, x ? x[kk] : 0.0f);
        if (t == IE_DTYPE_I8W) q[pos] = (uint8_t)(c + 128);
        else q[pos] |= (uint8_t)(hi ? c << 4 : c);
    }
}

/* Common range check of the panel writers and the matmuls. */
static int range_ok(int64_t r0, int64_t r1, int64_t n_out)
{
    if (n_out <= 0 || r0 < 0 || r0 > r1 || r1 > n_out) return 0;
    if (r0 % IE_PANEL != 0) return 0;
    if (r1 != n_out && r1 % IE_PANEL != 0) return 0;
    return 1;
}

/* Rows [r0, r1) of the panels (padding included when r1 = n_out): calls
 * put(row or -1 for padding, panel row i, group start) for every panel row
 * and group, after zeroing each group's quants. */
static void panel_fill(ie_dtype_t t, int G, int64_t n_in, int64_t r0, int64_t r1, int64_t n_out, void *dst,
                       void (*put)(const void *ctx, int64_t r, int64_t g, uint8_t *grp, int i), const void *ctx)
{
    const int64_t p0 = r0 / IE_PANEL, p1 = (r1 + IE_PANEL - 1) / IE_PANEL;
    for (int64_t p = p0; p < p1; p++) {
        for (int64_t g = 0; g < n_in / G; g++) {
            uint8_t *grp = panel_group(t, G, n_in, dst, p, g);
            memset(grp + IE_PANEL * scale_bytes(t), 0, IE_PANEL * quant_bytes(t, G));
            for (int i = 0; i < IE_PANEL; i++) {
                const int64_t r = p * IE_PANEL + i;
                put(ctx, r < n_out ? r : -1, g, grp, i);
            }
        }
    }
}

/* ---- 16-bit float panels (ie_pack.h): BF16 chunk c of panel p, dword i =
 * (w[16p+i][2c], w[16p+i][2c+1]); F16 slice k, word i = w[16p+i][k]. */

/* Byte of element k of panel row i inside a BF16 / F16 panel. */
static inline size_t half_pos(ie_dtype_t t, int i, int64_t k)
{
    if (t == IE_DTYPE_F16) return (size_t)k * 32 + 2 * (size_t)i;
    return (size_t)(k / 2) * 64 + 4 * (size_t)i + 2 * (size_t)(k & 1);
}

/* Panels of rows [r0, r1) of a BF16 / F16 PANEL16 matrix from f32 rows
 * (f32 set, rounded to nearest even) or rows of the same type (h16 set,
 * copied); rows past n_out are zeros. */
static void half_fill(ie_dtype_t t, const float *f32, const uint16_t *h16, int64_t n_in, int64_t r0, int64_t r1,
                      int64_t n_out, void *dst)
{
    const size_t pb = ie_pack_panel_bytes(t, IE_QK, n_in);
    for (int64_t p = r0 / IE_PANEL; p < (r1 + IE_PANEL - 1) / IE_PANEL; p++) {
        uint8_t *pan = (uint8_t *)dst + (size_t)p * pb;
        for (int i = 0; i < IE_PANEL; i++) {
            const int64_t r = p * IE_PANEL + i;
            for (int64_t k = 0; k < n_in; k++) {
                uint16_t v = 0;
                if (r < n_out && f32)
                    v = t == IE_DTYPE_BF16 ? ie_f32_to_bf16(f32[r * n_in + k]) : ie_f32_to_f16(f32[r * n_in + k]);
                else if (r < n_out) v = h16[r * n_in + k];
                memcpy(pan + half_pos(t, i, k), &v, sizeof v);
            }
        }
    }
}

/* The panel of a BF16 / F16 PANEL16 matrix that holds row r. */
static inline const uint8_t *half_panel(const ie_pmat_t *m, int64_t r)
{
    return (const uint8_t *)m->data + (size_t)(r / IE_PANEL) * ie_pack_panel_bytes(m->dtype, IE_QK, m->n_in);
}

/* Element k of panel row i of the BF16 / F16 panel pan. */
static inline float half_at(ie_dtype_t t, const uint8_t *pan, int i, int64_t k)
{
    uint16_t v;
    memcpy(&v, pan + half_pos(t, i, k), sizeof v);
    return t == IE_DTYPE_BF16 ? ie_bf16_to_f32(v) : ie_f16_to_f32(v);
}

/* ---- k-quants in PANEL16 (ie_pack.h; offsets from ie_kq_panel). */

/* Block b of panel p of a k-quant PANEL16 matrix of rows of n_in. */
static inline uint8_t *kq_block(const ie_kq_panel_t *g, const void *base, int64_t n_in, int64_t p, int64_t b)
{
    const size_t per_panel = (size_t)(n_in / g->info.qk) * g->block;
    return (uint8_t *)(uintptr_t)base + (size_t)p * per_panel + (size_t)b * g->block;
}

/* Write the fields c of panel row i into the panel block blk: the f16 d,
 * dmin, the sc / mn codes and row i's bytes of every code chunk (row i
 * owns bytes 4i..4i+3 of each chunk, so rows are written independently). */
static void kq_put_row(const ie_kq_panel_t *g, uint8_t *blk, int i, const ie_kq_codes_t *c)
{
    const ie_kq_info_t *in = &g->info;
    st_f16(blk + g->d + 2 * (size_t)i, c->d);
    if (in->has_dmin) st_f16(blk + g->dmin + 2 * (size_t)i, c->dmin);
    for (int j = 0; j < in->nsub; j++) {
        blk[g->sc + (size_t)(IE_PANEL * j + i)] = (uint8_t)c->sc[j];
        if (in->has_mn) blk[g->mn + (size_t)(IE_PANEL * j + i)] = (uint8_t)c->mn[j];
    }
    const int b = in->bits, crumb_shift = b == 6 ? 4 : 0, bit_pos = b == 3 ? 2 : 4;
    for (int s = 0; s < in->qk / 32; s++) {
        const uint8_t *u = c->u + 32 * s;
        uint8_t *slab = blk + g->codes + (size_t)s * g->slab + 4 * (size_t)i;
        for (int j = 0; j < 4; j++) {
            if (b >= 4)
                for (int ch = 0; ch < 4; ch++)
                    slab[g->nib + 64 * (size_t)ch + (size_t)j] = (uint8_t)((u[8 * ch + j] & 15) |
                                                                           (u[8 * ch + 4 + j] & 15) << 4);
            if (b == 2 || b == 3 || b == 6)
                for (int ch = 0; ch < 2; ch++) {
                    unsigned v = 0;
                    for (int t = 0; t < 4; t++)
                        v |= ((unsigned)(u[16 * ch + 4 * t + j] >> crumb_shift) & 3u) << (2 * t);
                    slab[g->crumb + 64 * (size_t)ch + (size_t)j] = (uint8_t)v;
                }
            if (b == 3 || b == 5) {
                unsigned v = 0;
                for (int t = 0; t < 8; t++) v |= ((unsigned)(u[4 * t + j] >> bit_pos) & 1u) << t;
                slab[g->bit + (size_t)j] = (uint8_t)v;
            }
        }
    }
}

/* Read panel row i of the panel block blk back into c (the inverse of
 * kq_put_row; fields the type lacks are 0). */
static void kq_get_row(const ie_kq_panel_t *g, const uint8_t *blk, int i, ie_kq_codes_t *c)
{
    const ie_kq_info_t *in = &g->info;
    memset(c, 0, sizeof *c);
    memcpy(&c->d, blk + g->d + 2 * (size_t)i, sizeof c->d);
    if (in->has_dmin) memcpy(&c->dmin, blk + g->dmin + 2 * (size_t)i, sizeof c->dmin);
    for (int j = 0; j < in->nsub; j++) {
        c->sc[j] = (int8_t)blk[g->sc + (size_t)(IE_PANEL * j + i)];
        if (in->has_mn) c->mn[j] = (int8_t)blk[g->mn + (size_t)(IE_PANEL * j + i)];
    }
    const int b = in->bits, crumb_shift = b == 6 ? 4 : 0, bit_pos = b == 3 ? 2 : 4;
    for (int s = 0; s < in->qk / 32; s++) {
        uint8_t *u = c->u + 32 * s;
        const uint8_t *slab = blk + g->codes + (size_t)s * g->slab + 4 * (size_t)i;
        for (int j = 0; j < 4; j++) {
            if (b >= 4)
                for (int ch = 0; ch < 4; ch++) {
                    const uint8_t v = slab[g->nib + 64 * (size_t)ch + (size_t)j];
                    u[8 * ch + j] = v & 15;
                    u[8 * ch + 4 + j] = v >> 4;
                }
            if (b == 2 || b == 3 || b == 6)
                for (int ch = 0; ch < 2; ch++) {
                    const unsigned v = slab[g->crumb + 64 * (size_t)ch + (size_t)j];
                    for (int t = 0; t < 4; t++)
                        u[16 * ch + 4 * t + j] |= (uint8_t)(((v >> (2 * t)) & 3u) << crumb_shift);
                }
            if (b == 3 || b == 5) {
                const unsigned v = slab[g->bit + (size_t)j];
                for (int t = 0; t < 8; t++) u[4 * t + j] |= (uint8_t)(((v >> t) & 1u) << bit_pos);
            }
        }
    }
}

/* kq_repack for IQ4_NL and MXFP4 (one slab of nibbles and d, ie_pack.h):
 * each block's bytes moved straight into place, not decoded code by code
 * (GPT-OSS-20B binds 12 GB of MXFP4 experts this way at every load). The
 * source keeps element k < 16 in the low nibble of qs[k] and k >= 16 in the
 * high nibble of qs[k - 16]; nibble chunk c, byte 4i + j holds the codes
 * of k = 8c + j (low) and 8c + 4 + j (high). */
static int kq_repack_nib32(ie_dtype_t t, const ie_kq_panel_t *g, const uint8_t *src, int64_t n_in, int64_t r0,
                           int64_t r1, int64_t n_out, void *dst)
{
    const size_t rb = ie_dtype_row_bytes(t, n_in), bb = ie_dtype_block_bytes(t), hdr = bb - IE_QK / 2;
    const int64_t nb = n_in / IE_QK;
    for (int64_t p = r0 / IE_PANEL; p < (r1 + IE_PANEL - 1) / IE_PANEL; p++)
        for (int i = 0; i < IE_PANEL; i++) {
            const int64_t r = p * IE_PANEL + i;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *blk = kq_block(g, dst, n_in, p, b), *q = blk + g->codes + g->nib + 4 * (size_t)i;
                ie_f16_t d = 0;
                if (r >= n_out) { /* padding: every field 0 */
                    for (int c = 0; c < 4; c++) memset(q + 64 * c, 0, 4);
                } else {
                    const uint8_t *s = src + (size_t)r * rb + (size_t)b * bb, *qs = s + hdr;
                    if (t == IE_DTYPE_MXFP4) {
                        if (ie_mxfp4_panel_d(s, &d) != 0) return -1;
                    } else {
                        memcpy(&d, s, sizeof d);
                    }
                    for (int j = 0; j < 4; j++) {
                        q[j] = (uint8_t)((qs[j] & 15) | (qs[4 + j] & 15) << 4);
                        q[64 + j] = (uint8_t)((qs[8 + j] & 15) | (qs[12 + j] & 15) << 4);
                        q[128 + j] = (uint8_t)(qs[j] >> 4 | (qs[4 + j] & 0xf0));
                        q[192 + j] = (uint8_t)(qs[8 + j] >> 4 | (qs[12 + j] & 0xf0));
                    }
                }
                st_f16(blk + g->d + 2 * (size_t)i, d);
            }
        }
    return 0;
}

/* Panels of rows [r0, r1) of the k-quant PANEL16 matrix dst from ggml
 * ROWS src (row r at src + r * row bytes): every block decoded and its
 * fields put in place; rows past n_out (the last panel's padding) get
 * all-zero fields: d = dmin = 0, sc = mn = 0, codes 0. Returns 0, or -1 at
 * the first block with no panel form (MXFP4's, ie_pack.h). */
static int kq_repack(ie_dtype_t t, const ie_kq_panel_t *g, const uint8_t *src, int64_t n_in, int64_t r0, int64_t r1,
                     int64_t n_out, void *dst)
{
    if (t == IE_DTYPE_IQ4_NL || t == IE_DTYPE_MXFP4) return kq_repack_nib32(t, g, src, n_in, r0, r1, n_out, dst);
    const size_t rb = ie_dtype_row_bytes(t, n_in), bb = ie_dtype_block_bytes(t);
    const int64_t nb = n_in / g->info.qk;
    ie_kq_codes_t c;
    for (int64_t p = r0 / IE_PANEL; p < (r1 + IE_PANEL - 1) / IE_PANEL; p++)
        for (int i = 0; i < IE_PANEL; i++) {
            const int64_t r = p * IE_PANEL + i;
            for (int64_t b = 0; b < nb; b++) {
                if (r >= n_out) memset(&c, 0, sizeof c);
                else if (ie_kq_decode(t, src + (size_t)r * rb + (size_t)b * bb, &c) != 0) return -1;
                kq_put_row(g, kq_block(g, dst, n_in, p, b), i, &c);
            }
        }
    return 0;
}

typedef struct {
    ie_dtype_t t;
    int G;
    ie_qscale_t how;
    const float *src;
    int64_t n_in;
} quant_ctx_t;

static void put_quant(const void *ctx, int64_t r, int64_t g, uint8_t *grp, int i)
{
    const quant_ctx_t *c = ctx;
    panel_put_row(c->t, c->how, r < 0 ? NULL : c->src + r * c->n_in + g * c->G, c->G, grp, i);
}

/* Quantize float rows [r0, r1) into the PANEL16 matrix dst (ie_pack.h).
 * Padding rows of the last panel (when r1 = n_out) are written as zero rows:
 * d = m = 0 and the codes of 0.0f (I8W 128, I4W 8, I4WA 0). Only the panels
 * of [r0, r1) are written, so disjoint ranges may run concurrently.
 * The k-quants and MXFP4 are refused (-1): they come from files, and
 * floats reach them through ie_quantize_row and ie_pack_repack.
 * Returns 0, or -1 on an invalid shape/range or NULL pointers. */
int ie_pack_quantize(ie_dtype_t dtype, int group, ie_qscale_t how, const float *src, int64_t n_in, int64_t r0,
                     int64_t r1, int64_t n_out, void *dst)
{
    if (ie_dtype_is_kq_panel(dtype)) return -1;
    if (ie_pack_check(dtype, group, n_in) != 0 || !range_ok(r0, r1, n_out) || !src || !dst) return -1;
    if (ie_dtype_is_half(dtype)) {
        half_fill(dtype, src, NULL, n_in, r0, r1, n_out, dst);
        return 0;
    }
    const quant_ctx_t c = {dtype, group, how, src, n_in};
    panel_fill(dtype, group, n_in, r0, r1, n_out, dst, put_quant, &c);
    return 0;
}

/* Q8_0 -> I8W, Q4_0 -> I4W, Q4_1 -> I4WA, I-types, BF16, F16, the
 * k-quants and MXFP4 -> themselves. */
ie_dtype_t ie_pack_target(ie_dtype_t rows_dtype)
{
    if (ie_dtype_is_kq_panel(rows_dtype)) return rows_dtype;
    switch (rows_dtype) {
    case IE_DTYPE_Q8_0:
    case IE_DTYPE_I8W: return IE_DTYPE_I8W;
    case IE_DTYPE_Q4_0:
    case IE_DTYPE_I4W: return IE_DTYPE_I4W;
    case IE_DTYPE_Q4_1:
    case IE_DTYPE_I4WA: return IE_DTYPE_I4WA;
    case IE_DTYPE_BF16: return IE_DTYPE_BF16;
    case IE_DTYPE_F16: return IE_DTYPE_F16;
    default: return IE_DTYPE_INVALID;
    }
}

typedef struct {
    ie_dtype_t t;
    int G;
    const uint8_t *src;
    size_t row_bytes, group_bytes;
} repack_ctx_t;

/* Copy one ROWS-layout group (row r, group g) into panel row i, codes
 * untouched; padding rows as in ie_pack_quantize. */
static void put_repack(const void *ctx, int64_t r, int64_t g, uint8_t *grp, int i)
{
    const repack_ctx_t *c = ctx;
    const ie_dtype_t t = c->t;
    if (r < 0) {
        panel_put_row(t, IE_QSCALE_ABSMAX, NULL, c->G, grp, i);
        return;
    }
    const uint8_t *blk = c->src + (size_t)r * c->row_bytes + (size_t)g * c->group_bytes;
    memcpy(grp + 2 * i, blk, 2);
    if (t == IE_DTYPE_I4WA) memcpy(grp + 2 * IE_PANEL + 2 * i, blk + 2, 2);
    const uint8_t *qs = blk + scale_bytes(t);
    uint8_t *q = grp + IE_PANEL * scale_bytes(t) + 4 * i;
    const int G = c->G, H = G / 2;
    if (t == IE_DTYPE_I8W) { /* 4 k per chunk: int8 q -> q + 128 */
        for (int ch = 0; ch < G / 4; ch++)
            for (int j = 0; j < 4; j++) q[ch * 64 + j] = (uint8_t)(qs[4 * ch + j] ^ 0x80);
        return;
    }
    /* 8 k per chunk: byte j holds k = 8ch+j (low nibble) and 8ch+4+j (high);
     * the source row keeps element e < G/2 in qs[e]'s low nibble and
     * e >= G/2 in qs[e - G/2]'s high nibble */
    for (int ch = 0; ch < G / 8; ch++)
        for (int j = 0; j < 4; j++) {
            const int lo = 8 * ch + j, hi = lo + 4;
            const int ul = lo < H ? qs[lo] & 0x0f : qs[lo - H] >> 4;
            const int uh = hi < H ? qs[hi] & 0x0f : qs[hi - H] >> 4;
            q[ch * 64 + j] = (uint8_t)(ul | uh << 4);
        }
}

/* Repack rows [r0, r1) of a ROWS-layout matrix into PANEL16 without
 * changing any value. For Q8_0/Q4_0/Q4_1, BF16 and F16 the group is 32 and
 * for the k-quants their block size (32 or 256), whatever `group` says;
 * for I-types it is `group`. Padding rows as in ie_pack_quantize (the
 * k-quants: all fields 0). src points at row 0 of the ROWS matrix.
 * Returns 0, or -1 on an unsupported type, invalid shape/range or NULL. */
int ie_pack_repack(ie_dtype_t rows_dtype, int group, const void *src, int64_t n_in, int64_t r0, int64_t r1,
                   int64_t n_out, void *dst)
{
    const ie_dtype_t t = ie_pack_target(rows_dtype);
    if (t == IE_DTYPE_INVALID || !src || !dst) return -1;
    if (!ie_dtype_is_intw(rows_dtype)) group = ie_dtype_is_kq_panel(t) ? ie_dtype_block_elems(t) : IE_QK;
    if (ie_pack_check(t, group, n_in) != 0 || !range_ok(r0, r1, n_out)) return -1;
    if (ie_dtype_is_half(t)) {
        half_fill(t, NULL, src, n_in, r0, r1, n_out, dst);
        return 0;
    }
    ie_kq_panel_t g;
    if (ie_kq_panel(t, &g) == 0) return kq_repack(t, &g, src, n_in, r0, r1, n_out, dst);
    const repack_ctx_t c = {t, group, src, ie_qrow_bytes(t, group, n_in), scale_bytes(t) + quant_bytes(t, group)};
    panel_fill(t, group, n_in, r0, r1, n_out, dst, put_repack, &c);
    return 0;
}

/* Dequantize row r (0 <= r < m->n_out) of a packed matrix into n_in floats,
 * with the same f32 formulas as ie_qrow_dequantize (so a repacked Q8_0 /
 * Q4_0 / Q4_1 row dequantizes to the bits ie_dequantize_row gives); a
 * k-quant row through its codes and ie_kq_value, so it equals
 * ie_dequantize_row on the source row bit for bit. Does nothing on an
 * invalid matrix or row. */
void ie_pack_dequant_row(const ie_pmat_t *m, int64_t r, float *dst)
{
    if (!m || !m->data || ie_pack_check(m->dtype, m->group, m->n_in) != 0 || r < 0 || r >= m->n_out) return;
    if (ie_dtype_is_half(m->dtype)) {
        const uint8_t *pan = half_panel(m, r);
        for (int64_t k = 0; k < m->n_in; k++) dst[k] = half_at(m->dtype, pan, (int)(r % IE_PANEL), k);
        return;
    }
    ie_kq_panel_t kg;
    if (ie_kq_panel(m->dtype, &kg) == 0) {
        const int qk = kg.info.qk;
        ie_kq_codes_t c;
        for (int64_t b = 0; b < m->n_in / qk; b++) {
            kq_get_row(&kg, kq_block(&kg, m->data, m->n_in, r / IE_PANEL, b), (int)(r % IE_PANEL), &c);
            for (int k = 0; k < qk; k++) dst[b * qk + k] = ie_kq_value(m->dtype, &c, k);
        }
        return;
    }
    const ie_dtype_t t = m->dtype;
    const int G = m->group, i = (int)(r % IE_PANEL);
    for (int64_t g = 0; g < m->n_in / G; g++) {
        const uint8_t *grp = panel_group(t, G, m->n_in, (void *)(uintptr_t)m->data, r / IE_PANEL, g);
        const float d = ld_f16(grp + 2 * i);
        const float mm = t == IE_DTYPE_I4WA ? ld_f16(grp + 2 * IE_PANEL + 2 * i) : 0.0f;
        const uint8_t *q = grp + IE_PANEL * scale_bytes(t);
        for (int kk = 0; kk < G; kk++) {
            int hi;
            const uint8_t byte = q[panel_quant_pos(t, i, kk, &hi)];
            const int c = t == IE_DTYPE_I8W ? (int)byte - 128 : (hi ? byte >> 4 : byte & 0x0f);
            dst[g * G + kk] = value_of(t, d, mm, c);
        }
    }
}

/* ------------------------------------------------ Q16_P activations */

/* One row of n floats (n a multiple of 32) to Q16_P: int16 q[n], then f32
 * d[n/32], then f32 s[n/32]; per block d = amax/32767, q = roundf(x * (1/d))
 * (ties away from zero; 1/d overflowing or d = 0 give zeros, as for Q8_P)
 * and s = (float)sum(q) * d in f32. |x * (1/d)| <= 32767 + 0.01, so q never
 * leaves [-32767, 32767]; the clamp only keeps the conversion defined.
 * The ISA quantizers (ie_act_quantize_drive) give the same bytes. */
void ie_quantize_row_q16_p_ref(const float *x, void *out, int64_t n)
{
    int16_t *q = out;
    uint8_t *dp = (uint8_t *)out + 2 * n, *sp = dp + 4 * (n / IE_QK);
    for (int64_t b = 0; b < n / IE_QK; b++) {
        const float *xb = x + b * IE_QK;
        float amax = 0.0f;
        for (int j = 0; j < IE_QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 32767.0f;
        const float id = ie_inv_scale(d);
        int sum = 0;
        for (int j = 0; j < IE_QK; j++) {
            const float v = fminf(fmaxf(roundf(xb[j] * id), -32767.0f), 32767.0f);
            q[b * IE_QK + j] = (int16_t)v;
            sum += q[b * IE_QK + j];
        }
        st_f32(dp + 4 * b, d);
        st_f32(sp + 4 * b, (float)sum * d);
    }
}

/* --------------------------------------------------- reference matmul */

/* Quant k of an activation row: int16 (Q16_P, wide) or int8 (Q8_P). */
static inline int act_q(const uint8_t *row, int wide, int64_t k)
{
    if (!wide) return (int8_t)row[k];
    int16_t v;
    memcpy(&v, row + 2 * k, sizeof v);
    return v;
}

/* 1 if (m, r0, r1, n_tok, ldy) describe a valid packed matmul. */
static int packed_args_ok(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, int64_t n_tok, const float *y)
{
    if (!m || !m->data || ie_pack_check(m->dtype, m->group, m->n_in) != 0) return 0;
    if (!range_ok(r0, r1, m->n_out) || n_tok < 0) return 0;
    if (n_tok > 0 && r1 > r0 && (!a || !y)) return 0;
    return 1;
}

/* One k-quant block (codes c of one weight row) against block b of one
 * activation row (ie_matmul_packed_act_dtype: Q8_P or Q8_K): the f32 term
 * the row sum adds. The order is the ROWS reference's (kquant_ref.c), so a
 * packed and a ROWS matrix of a k-quant give the same bits:
 *   32-element types x Q8_P (q, da, s of block b): isum = sum v*q exactly
 *   (v = u; IQ4_NL, MXFP4: their code book's kv[u]), then in f32
 *       Q5_0  : dw * (da*isum - 16*s)
 *       Q5_1  : (dw*da)*isum + m*s
 *       IQ4_NL, MXFP4: (dw*da)*isum
 *   256-element types x Q8_K (q, da, bsums of block b), in int32 (the
 *   largest, Q6_K's, is below 2^31):
 *       isum = sum_j sc_j * (sum_{k in j} v_k*q_k - off*bs_j)
 *       msum = sum_j mn_j * bs_j               (Q2_K, Q4_K, Q5_K)
 *   with v = u (IQ4_XS kv[u]), off = 4 (Q3_K), 32 (Q6_K), else 0, bs_j the
 *   sum of the bsums inside sub-block j; then in f32
 *       (da*d)*isum - (da*dmin)*msum           (no msum term without mn). */
static float kq_block_term(ie_dtype_t t, const ie_kq_info_t *in, const ie_kq_codes_t *c, const uint8_t *arow,
                           int64_t b, int64_t n_in)
{
    const int8_t *book = ie_kq_book(t); /* codes index the code book */
    if (in->qk == IE_QK) {
        const int8_t *q = (const int8_t *)arow + b * IE_QK;
        int32_t isum = 0;
        for (int k = 0; k < IE_QK; k++) isum += (book ? book[c->u[k] & 15] : (int32_t)c->u[k]) * q[k];
        const float dw = ie_f16_to_f32(c->d), da = ld_f32(arow + n_in + 4 * b),
                    sa = ld_f32(arow + n_in + 4 * (n_in / IE_QK) + 4 * b);
        switch (t) {
        case IE_DTYPE_Q5_0: return dw * (da * (float)isum - 16.0f * sa);
        case IE_DTYPE_Q5_1: return (dw * da) * (float)isum + ie_f16_to_f32(c->dmin) * sa;
        default: return (dw * da) * (float)isum;
        }
    }
    ie_block_q8_k_t a;
    memcpy(&a, arow + (size_t)b * sizeof a, sizeof a);
    const int len = IE_QK_K / in->nsub, per = len / 16; /* elements, bsums per sub-block */
    const int32_t off = t == IE_DTYPE_Q3_K ? 4 : t == IE_DTYPE_Q6_K ? 32 : 0;
    int32_t isum = 0, msum = 0;
    for (int j = 0; j < in->nsub; j++) {
        int32_t sj = 0, bs = 0;
        for (int k = j * len; k < (j + 1) * len; k++)
            sj += (book ? book[c->u[k] & 15] : (int32_t)c->u[k]) * (int32_t)a.q[k];
        for (int i = 0; i < per; i++) bs += a.bsums[j * per + i];
        isum += c->sc[j] * (sj - off * bs);
        msum += c->mn[j] * bs;
    }
    const float d = ie_f16_to_f32(c->d);
    if (!in->has_mn) return (a.d * d) * (float)isum;
    return (a.d * d) * (float)isum - (a.d * ie_f16_to_f32(c->dmin)) * (float)msum;
}

#define KQ_TOK_CHUNK 64 /* tokens whose row sums are kept while the blocks of one row pass */

/* matmul_packed for a checked k-quant matrix: per row, each block's codes
 * read from the panel once per chunk of tokens, its kq_block_term per
 * token summed over the blocks in order, in double. */
static void kq_matmul(const ie_pmat_t *m, const ie_kq_panel_t *g, int64_t r0, int64_t r1, const void *a,
                      size_t a_stride, int64_t n_tok, float *y, int64_t ldy)
{
    const ie_dtype_t t = m->dtype;
    const int64_t n_in = m->n_in, nb = n_in / g->info.qk;
    ie_kq_codes_t c;
    double acc[KQ_TOK_CHUNK];
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t0 = 0; t0 < n_tok; t0 += KQ_TOK_CHUNK) {
            const int64_t nt = n_tok - t0 < KQ_TOK_CHUNK ? n_tok - t0 : KQ_TOK_CHUNK;
            for (int64_t k = 0; k < nt; k++) acc[k] = 0.0;
            for (int64_t b = 0; b < nb; b++) {
                kq_get_row(g, kq_block(g, m->data, n_in, r / IE_PANEL, b), (int)(r % IE_PANEL), &c);
                for (int64_t k = 0; k < nt; k++)
                    acc[k] += (double)kq_block_term(t, &g->info, &c,
                                                    (const uint8_t *)a + (size_t)(t0 + k) * a_stride, b, n_in);
            }
            for (int64_t k = 0; k < nt; k++) y[(t0 + k) * ldy + r] = (float)acc[k];
        }
}

/* Y[t*ldy + r] = dot(W row r, A row t) for r in [r0, r1), t < n_tok, the
 * oracle of matmul_packed. A rows are Q16_P for I8W, Q8_P for I4W/I4WA
 * (ie_matmul_act_dtype). Per 32-element block b (within group g) the
 * integer sum isum = sum_j c_j*qa_j of the stored codes c (I8W: q + 128,
 * I4W/I4WA: u) is exact in int64 (I8W x Q16_P: |isum| <= 32*255*32767
 * < 2^28); then, in double,
 *     I8W : y += d_g * (ad_b*isum - 128*s_b)
 *     I4W : y += d_g * (ad_b*isum -   8*s_b)
 *     I4WA: y += d_g *  ad_b*isum + m_g*s_b
 * (from x_w = d*(c - off) or d*c + m, x_a = ad*qa and s_b = ad*sum(qa)).
 * BF16 x BF16 rows and F16 x F32 rows: the exact products summed in
 * double, as ie_matmul_bf16_bf16_ref / the f16 ROWS reference. The
 * k-quants (Q8_P rows for Q5_0/Q5_1/IQ4_NL/MXFP4, Q8_K rows of ggml blocks
 * for the rest): per block the exact integer sums, then the f32 term of
 * kq_block_term, summed over blocks in double — the same bits as the
 * ROWS reference ie_matmul_<t>_q8_{p,k}_ref on the source rows (MXFP4's
 * ROWS kernels read Q8_0 rows instead). Returns
 * IE_OK, or IE_ERR_INVAL on an invalid matrix/range. */
ie_status_t ie_matmul_packed_ref(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                 int64_t n_tok, float *y, int64_t ldy)
{
    if (!packed_args_ok(m, r0, r1, a, n_tok, y)) return IE_ERR_INVAL;
    ie_kq_panel_t kg;
    if (ie_kq_panel(m->dtype, &kg) == 0) {
        kq_matmul(m, &kg, r0, r1, a, a_stride, n_tok, y, ldy);
        return IE_OK;
    }
    if (ie_dtype_is_half(m->dtype)) {
        const int bf = m->dtype == IE_DTYPE_BF16; /* BF16 activations, else F32 */
        for (int64_t tok = 0; tok < n_tok; tok++) {
            const uint8_t *arow = (const uint8_t *)a + (size_t)tok * a_stride;
            for (int64_t r = r0; r < r1; r++) {
                const uint8_t *pan = half_panel(m, r);
                double s = 0.0;
                for (int64_t k = 0; k < m->n_in; k++) {
                    float x;
                    if (bf) {
                        ie_bf16_t h;
                        memcpy(&h, arow + 2 * k, sizeof h);
                        x = ie_bf16_to_f32(h);
                    } else {
                        memcpy(&x, arow + 4 * k, sizeof x);
                    }
                    s += (double)half_at(m->dtype, pan, (int)(r % IE_PANEL), k) * x;
                }
                y[tok * ldy + r] = (float)s;
            }
        }
        return IE_OK;
    }
    const ie_dtype_t t = m->dtype;
    const int G = m->group;
    const int64_t n_in = m->n_in, nb = n_in / IE_QK;
    const double off = t == IE_DTYPE_I8W ? 128.0 : t == IE_DTYPE_I4W ? 8.0 : 0.0;
    const int wide = t == IE_DTYPE_I8W; /* Q16_P activations */
    for (int64_t tok = 0; tok < n_tok; tok++) {
        const uint8_t *arow = (const uint8_t *)a + (size_t)tok * a_stride;
        const uint8_t *ad = arow + (wide ? 2 : 1) * n_in, *as = ad + 4 * nb;
        for (int64_t r = r0; r < r1; r++) {
            const int i = (int)(r % IE_PANEL);
            double s = 0.0;
            for (int64_t g = 0; g < n_in / G; g++) {
                const uint8_t *grp = panel_group(t, G, n_in, (void *)(uintptr_t)m->data, r / IE_PANEL, g);
                const double wd = ld_f16(grp + 2 * i);
                const double wm = t == IE_DTYPE_I4WA ? ld_f16(grp + 2 * IE_PANEL + 2 * i) : 0.0;
                const uint8_t *q = grp + IE_PANEL * scale_bytes(t);
                for (int kb = 0; kb < G; kb += IE_QK) {
                    const int64_t b = (g * G + kb) / IE_QK;
                    int64_t isum = 0;
                    for (int j = 0; j < IE_QK; j++) {
                        int hi;
                        const uint8_t byte = q[panel_quant_pos(t, i, kb + j, &hi)];
                        const int c = t == IE_DTYPE_I8W ? byte : (hi ? byte >> 4 : byte & 0x0f);
                        isum += (int64_t)c * act_q(arow, wide, b * IE_QK + j);
                    }
                    const double dA = ld_f32(ad + 4 * b), sA = ld_f32(as + 4 * b);
                    if (t == IE_DTYPE_I4WA) s += wd * dA * (double)isum + wm * sA;
                    else s += wd * (dA * (double)isum - off * sA);
                }
            }
            y[tok * ldy + r] = (float)s;
        }
    }
    return IE_OK;
}

/* Contract of ie_kernels_t.matmul_packed_ranges: one call per range. */
ie_status_t ie_matmul_packed_ranges_ref(const ie_pmat_t *m, ie_panel_next_fn next, void *ctx, const void *a,
                                        size_t a_stride, int64_t n_tok, float *y, int64_t ldy)
{
    return ie_packed_ranges_by_calls(ie_matmul_packed_ref, m, next, ctx, a, a_stride, n_tok, y, ldy);
}

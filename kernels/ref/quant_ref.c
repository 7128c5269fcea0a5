/* quant_ref.c — scalar quantizers and dequantizers (the reference twins).
 *
 * The block formats and rounding rules are ggml's (quantize_row_*_ref in
 * ggml-quants.c), so that activations quantized here pair with GGUF weights
 * exactly as they do in llama.cpp, and weights quantized here are what
 * llama.cpp's quantizer would have written.
 */
#include "ie_kernels.h"
#include "../src/ie_kernels_isa.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ------------------------------------------------------------ activations */

int ie_q8_block_ref(const float *x, int8_t *q, float *d_out)
{
    float amax = 0.0f;
    for (int j = 0; j < IE_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = ie_inv_scale(d);
    int sum = 0;
    for (int j = 0; j < IE_QK; j++) {
        q[j] = (int8_t)roundf(x[j] * id);
        sum += q[j];
    }
    *d_out = d;
    return sum;
}

void ie_quantize_row_q8_0_ref(const float *x, ie_block_q8_0_t *y, int64_t n)
{
    for (int64_t b = 0; b < n / IE_QK; b++) {
        float d;
        (void)ie_q8_block_ref(x + b * IE_QK, y[b].q, &d);
        y[b].d = ie_f32_to_f16(d);
    }
}

void ie_quantize_row_q8_1_ref(const float *x, ie_block_q8_1_t *y, int64_t n)
{
    for (int64_t b = 0; b < n / IE_QK; b++) {
        float d;
        const int sum = ie_q8_block_ref(x + b * IE_QK, y[b].q, &d);
        y[b].d = ie_f32_to_f16(d);
        y[b].s = ie_f32_to_f16((float)sum * d);
    }
}

/* One row of n floats (n a multiple of 32) to Q8_P: int8 q[n], then f32
 * d[n/32], then f32 s[n/32], s = (float)sum(q) * d (ie_pack.h). */
void ie_quantize_row_q8_p_ref(const float *x, void *out, int64_t n)
{
    int8_t *q = out;
    uint8_t *dp = (uint8_t *)out + n, *sp = dp + 4 * (n / IE_QK);
    for (int64_t b = 0; b < n / IE_QK; b++) {
        float d;
        const float s = (float)ie_q8_block_ref(x + b * IE_QK, q + b * IE_QK, &d) * d;
        memcpy(dp + 4 * b, &d, sizeof d);
        memcpy(sp + 4 * b, &s, sizeof s);
    }
}

void ie_act_quantize_ref(ie_dtype_t act, const float *x, void *out, int64_t n)
{
    switch (act) {
    case IE_DTYPE_F32: memcpy(out, x, (size_t)n * sizeof(float)); break;
    case IE_DTYPE_BF16: /* round to nearest even, any n */
        for (int64_t i = 0; i < n; i++) ((ie_bf16_t *)out)[i] = ie_f32_to_bf16(x[i]);
        break;
    case IE_DTYPE_Q8_0: ie_quantize_row_q8_0_ref(x, out, n); break;
    case IE_DTYPE_Q8_1: ie_quantize_row_q8_1_ref(x, out, n); break;
    case IE_DTYPE_Q8_P: ie_quantize_row_q8_p_ref(x, out, n); break;
    case IE_DTYPE_Q16_P: ie_quantize_row_q16_p_ref(x, out, n); break;
    case IE_DTYPE_Q8_K: ie_quantize_row_q8_k_ref(x, out, n); break;
    default: break; /* not an activation format: nothing to do */
    }
}

/* ---------------------------------------------------------------- weights */

static void quantize_row_q4_0(const float *x, ie_block_q4_0_t *y, int64_t n)
{
    for (int64_t b = 0; b < n / IE_QK; b++) {
        const float *xb = x + b * IE_QK;
        float amax = 0.0f, max = 0.0f; /* max: the value of largest magnitude */
        for (int j = 0; j < IE_QK; j++) {
            if (amax < fabsf(xb[j])) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = ie_f32_to_f16(d);
        for (int j = 0; j < IE_QK / 2; j++) {
            int q0 = (int8_t)(xb[j] * id + 8.5f);
            int q1 = (int8_t)(xb[j + IE_QK / 2] * id + 8.5f);
            if (q0 > 15) q0 = 15;
            if (q1 > 15) q1 = 15;
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void quantize_row_q4_1(const float *x, ie_block_q4_1_t *y, int64_t n)
{
    for (int64_t b = 0; b < n / IE_QK; b++) {
        const float *xb = x + b * IE_QK;
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < IE_QK; j++) {
            if (xb[j] < min) min = xb[j];
            if (xb[j] > max) max = xb[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = ie_f32_to_f16(d);
        y[b].m = ie_f32_to_f16(min);
        for (int j = 0; j < IE_QK / 2; j++) {
            int q0 = (int8_t)((xb[j] - min) * id + 0.5f);
            int q1 = (int8_t)((xb[j + IE_QK / 2] - min) * id + 0.5f);
            if (q0 > 15) q0 = 15;
            if (q1 > 15) q1 = 15;
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* ggml's quantize_row_mxfp4_ref rule (see ie_kernels.h): the shared
 * exponent makes amax/2^(e-127) fall in [4, 8), so the block maximum may
 * saturate at 6 (ggml's choice, kept so files match llama.cpp's). Each
 * element takes the code whose value kv*2^(e-128) is nearest, scanning
 * codes 0..15 with a strict < so the first (smaller magnitude, +0 before
 * -0) wins ties. floorf(log2f()) rather than the exact exponent bits, as in
 * ggml: for amax just below a power of two log2f may round up, and the
 * files we must match were written that way. */
static void quantize_row_mxfp4(const float *x, ie_block_mxfp4_t *y, int64_t n)
{
    for (int64_t b = 0; b < n / IE_QK; b++) {
        const float *xb = x + b * IE_QK;
        float amax = 0.0f;
        for (int j = 0; j < IE_QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        int e = 0;
        if (amax > 0.0f) {
            e = (int)floorf(log2f(amax)) - 2 + 127;
            if (e < 0) e = 0; /* amax < 2^-125: ggml's uint8 cast is undefined here */
            if (e > 255) e = 255;
        }
        const float d = ie_e8m0_half_to_f32((uint8_t)e);
        y[b].e = (uint8_t)e;
        for (int j = 0; j < IE_QK / 2; j++) {
            int code[2];
            for (int h = 0; h < 2; h++) {
                const float v = xb[j + h * IE_QK / 2];
                int best = 0;
                float best_err = fabsf((float)ie_mxfp4_kvalues[0] * d - v);
                for (int c = 1; c < 16; c++) {
                    const float err = fabsf((float)ie_mxfp4_kvalues[c] * d - v);
                    if (err < best_err) {
                        best = c;
                        best_err = err;
                    }
                }
                code[h] = best;
            }
            y[b].qs[j] = (uint8_t)(code[0] | (code[1] << 4));
        }
    }
}

int ie_quantize_row(ie_dtype_t t, const float *src, void *dst, int64_t n)
{
    if (n < 0 || ie_dtype_block_elems(t) == 0 || n % ie_dtype_block_elems(t) != 0) return -1;
    switch (t) {
    case IE_DTYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); return 0;
    case IE_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) ((ie_f16_t *)dst)[i] = ie_f32_to_f16(src[i]);
        return 0;
    case IE_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) ((ie_bf16_t *)dst)[i] = ie_f32_to_bf16(src[i]);
        return 0;
    case IE_DTYPE_Q8_0: ie_quantize_row_q8_0_ref(src, dst, n); return 0;
    case IE_DTYPE_Q8_1: ie_quantize_row_q8_1_ref(src, dst, n); return 0;
    case IE_DTYPE_Q4_0: quantize_row_q4_0(src, dst, n); return 0;
    case IE_DTYPE_Q4_1: quantize_row_q4_1(src, dst, n); return 0;
    case IE_DTYPE_MXFP4: quantize_row_mxfp4(src, dst, n); return 0;
    default: return ie_dtype_is_kquant(t) ? ie_kq_quantize_row(t, src, dst, n) : -1;
    }
}

/* ------------------------------------------------------------- dequantize */

void ie_dequantize_row(ie_dtype_t t, const void *src, float *dst, int64_t n)
{
    switch (t) {
    case IE_DTYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case IE_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = ie_f16_to_f32(((const ie_f16_t *)src)[i]);
        break;
    case IE_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = ie_bf16_to_f32(((const ie_bf16_t *)src)[i]);
        break;
    case IE_DTYPE_Q8_0:
        for (int64_t b = 0; b < n / IE_QK; b++) {
            const ie_block_q8_0_t *blk = (const ie_block_q8_0_t *)src + b;
            const float d = ie_f16_to_f32(blk->d);
            for (int j = 0; j < IE_QK; j++) dst[b * IE_QK + j] = d * (float)blk->q[j];
        }
        break;
    case IE_DTYPE_Q8_1:
        for (int64_t b = 0; b < n / IE_QK; b++) {
            const ie_block_q8_1_t *blk = (const ie_block_q8_1_t *)src + b;
            const float d = ie_f16_to_f32(blk->d);
            for (int j = 0; j < IE_QK; j++) dst[b * IE_QK + j] = d * (float)blk->q[j];
        }
        break;
    case IE_DTYPE_Q4_0:
        for (int64_t b = 0; b < n / IE_QK; b++) {
            const ie_block_q4_0_t *blk = (const ie_block_q4_0_t *)src + b;
            const float d = ie_f16_to_f32(blk->d);
            for (int j = 0; j < IE_QK / 2; j++) {
                dst[b * IE_QK + j] = d * (float)((blk->qs[j] & 0x0f) - 8);
                dst[b * IE_QK + j + IE_QK / 2] = d * (float)((blk->qs[j] >> 4) - 8);
            }
        }
        break;
    case IE_DTYPE_Q4_1:
        for (int64_t b = 0; b < n / IE_QK; b++) {
            const ie_block_q4_1_t *blk = (const ie_block_q4_1_t *)src + b;
            const float d = ie_f16_to_f32(blk->d), m = ie_f16_to_f32(blk->m);
            for (int j = 0; j < IE_QK / 2; j++) {
                dst[b * IE_QK + j] = d * (float)(blk->qs[j] & 0x0f) + m;
                dst[b * IE_QK + j + IE_QK / 2] = d * (float)(blk->qs[j] >> 4) + m;
            }
        }
        break;
    case IE_DTYPE_MXFP4:
        for (int64_t b = 0; b < n / IE_QK; b++) {
            const ie_block_mxfp4_t *blk = (const ie_block_mxfp4_t *)src + b;
            const float d = ie_e8m0_half_to_f32(blk->e); /* kv * d: exact, or +-inf past FLT_MAX */
            for (int j = 0; j < IE_QK / 2; j++) {
                dst[b * IE_QK + j] = (float)ie_mxfp4_kvalues[blk->qs[j] & 0x0f] * d;
                dst[b * IE_QK + j + IE_QK / 2] = (float)ie_mxfp4_kvalues[blk->qs[j] >> 4] * d;
            }
        }
        break;
    case IE_DTYPE_Q8_K: /* activations; dequantized for tests and tools */
        for (int64_t b = 0; b < n / IE_QK_K; b++) {
            const ie_block_q8_k_t *blk = (const ie_block_q8_k_t *)src + b;
            for (int j = 0; j < IE_QK_K; j++) dst[b * IE_QK_K + j] = blk->d * (float)blk->q[j];
        }
        break;
    default:
        if (ie_dtype_is_kquant(t)) { /* the one decoder of ggml's layouts, the formulas of ie_dtype.h */
            const int qk = ie_dtype_block_elems(t);
            const size_t bb = ie_dtype_block_bytes(t);
            ie_kq_codes_t c;
            for (int64_t b = 0; b < n / qk; b++) {
                (void)ie_kq_decode(t, (const uint8_t *)src + (size_t)b * bb, &c);
                for (int k = 0; k < qk; k++) dst[b * qk + k] = ie_kq_value(t, &c, k);
            }
        } else if (ie_dtype_is_iquant(t)) {
            const size_t bb = ie_dtype_block_bytes(t);
            ie_iq_codes_t c;
            for (int64_t b = 0; b < n / IE_QK_K; b++) {
                (void)ie_iq_decode(t, (const uint8_t *)src + (size_t)b * bb, &c);
                for (int k = 0; k < IE_QK_K; k++)
                    dst[b * IE_QK_K + k] = (c.d * (float)c.sc[k / 16]) * (float)c.q[k];
            }
        }
        break;
    }
}

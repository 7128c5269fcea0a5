/* drive.c — ISA-independent drivers shared by the x86 kernel files.
 *
 * The AVX2 and AVX-512 files differ only in their tiles (the register-
 * blocked inner kernels, compiled with their own flags); how rows are cut
 * into L2 panels, how a matmul walks its tiles and how activations are
 * quantized block by block is the same and lives here once. */
#include "ie_kernels_isa.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static int g_scratch_ok;
static void scratch_free(void *p) { free(p); }
static void scratch_key_init(void) { g_scratch_ok = pthread_key_create(&g_scratch_key, scratch_free) == 0; }

/* Contract (ie_kernels_isa.h). The block's first 64 bytes hold its size. */
void *ie_kernel_scratch(size_t n)
{
    pthread_once(&g_scratch_once, scratch_key_init);
    if (!g_scratch_ok || n > SIZE_MAX - 128) return NULL;
    size_t *h = pthread_getspecific(g_scratch_key);
    if (!h || h[0] < n) {
        size_t *nh = aligned_alloc(64, 64 + (n + 63) / 64 * 64);
        if (!nh) return NULL;
        nh[0] = n;
        if (pthread_setspecific(g_scratch_key, nh) != 0) {
            free(nh);
            return NULL;
        }
        free(h);
        h = nh;
    }
    return (char *)h + 64;
}

int64_t ie_panel_rows(int64_t n_rows, size_t row_bytes, int64_t n_tok, int tile_tok, int tile_rows)
{
    if (n_tok <= tile_tok) return n_rows;
    int64_t p = (int64_t)((256u << 10) / (row_bytes ? row_bytes : 1));
    p -= p % tile_rows;
    return p < tile_rows ? tile_rows : p;
}

void ie_matmul_float_drive(ie_dtype_t wt, const ie_ftile_fn *tiles1, const ie_ftile_fn *tilesR, int tile_rows,
                           int tile_tok, const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a,
                           size_t as, int64_t n_tok, float *y, int64_t ldy)
{
    const size_t wb = ie_dtype_row_bytes(wt, n_in);
    const int64_t P = ie_panel_rows(r1 - r0, wb, n_tok, tile_tok, tile_rows);
    for (int64_t p0 = r0; p0 < r1; p0 += P) {
        const int64_t p1 = p0 + P < r1 ? p0 + P : r1;
        for (int64_t t0 = 0; t0 < n_tok; t0 += tile_tok) {
            const int tt = (int)(n_tok - t0 < tile_tok ? n_tok - t0 : tile_tok);
            const char *at = (const char *)a + (size_t)t0 * as;
            float *yt = y + t0 * ldy;
            int64_t r = p0;
            for (; r + tile_rows <= p1; r += tile_rows)
                tilesR[tt]((const char *)w + (size_t)r * wb, wb, n_in, at, as, yt + r, ldy);
            for (; r < p1; r++) tiles1[tt]((const char *)w + (size_t)r * wb, wb, n_in, at, as, yt + r, ldy);
        }
    }
}

/* One row of n floats to Q16_P (ie_pack.h): int16 q[n], f32 d[n/32], f32
 * s[n/32]. Per block d = amax/32767, id = 1/d (0 when d is 0 or 1/d
 * overflows), q = round-half-away(x * id) and s = (float)sum(q) * d: the
 * definition ie_quantize_row_q16_p_ref spells with roundf. Here the rounding
 * is trunc(v + copysignf(0.5 - 2^-25, v)) (v + 0.49999997 rounds up to the
 * next integer exactly when frac(|v|) >= 0.5; equal to roundf for every
 * |v| <= 32768, checked over all such floats), which the compiler can keep
 * inline (and vectorize) where roundf is a library call. |v| never exceeds
 * 32767 + 0.01 (three f32 roundings of amax * 32767/amax), so the clamp
 * below never changes a value; it keeps the conversion defined. */
static void quantize_row_q16_p(const float *x, void *out, int64_t n)
{
    int16_t *q = out;
    uint8_t *dp = (uint8_t *)out + 2 * (size_t)n, *sp = dp + 4 * (size_t)(n / IE_QK);
    for (int64_t b = 0; b < n / IE_QK; b++) {
        const float *xb = x + b * IE_QK;
        int16_t *qb = q + b * IE_QK;
        float amax = 0.0f;
        for (int j = 0; j < IE_QK; j++) {
            const float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        const float d = amax / 32767.0f;
        const float id = ie_inv_scale(d);
        int sum = 0;
        for (int j = 0; j < IE_QK; j++) {
            float v = xb[j] * id;
            v = v + copysignf(0x1.fffffep-2f, v);
            v = v > 32767.0f ? 32767.0f : v < -32767.0f ? -32767.0f : v;
            const int qi = (int)v; /* truncation */
            qb[j] = (int16_t)qi;
            sum += qi;
        }
        const float s = (float)sum * d;
        memcpy(dp + 4 * b, &d, sizeof d);
        memcpy(sp + 4 * b, &s, sizeof s);
    }
}

void ie_act_quantize_drive(ie_dtype_t act, const float *x, void *out, int64_t n, ie_q8_block_fn q8)
{
    switch (act) {
    case IE_DTYPE_F32: memcpy(out, x, (size_t)n * sizeof(float)); break;
    case IE_DTYPE_BF16: /* the x86 act_quantize convert these themselves, vectorized */
        for (int64_t i = 0; i < n; i++) ((ie_bf16_t *)out)[i] = ie_f32_to_bf16(x[i]);
        break;
    case IE_DTYPE_Q8_0: {
        ie_block_q8_0_t *y = out;
        for (int64_t b = 0; b < n / IE_QK; b++) {
            float d;
            (void)q8(x + b * IE_QK, y[b].q, &d);
            y[b].d = ie_f32_to_f16(d);
        }
        break;
    }
    case IE_DTYPE_Q8_1: {
        ie_block_q8_1_t *y = out;
        for (int64_t b = 0; b < n / IE_QK; b++) {
            float d;
            const int sum = q8(x + b * IE_QK, y[b].q, &d);
            y[b].d = ie_f32_to_f16(d);
            y[b].s = ie_f32_to_f16((float)sum * d);
        }
        break;
    }
    case IE_DTYPE_Q8_P: { /* int8 q[n]; f32 d[n/32]; f32 s[n/32] (ie_pack.h) */
        int8_t *q = out;
        uint8_t *dp = (uint8_t *)out + n, *sp = dp + 4 * (size_t)(n / IE_QK);
        for (int64_t b = 0; b < n / IE_QK; b++) {
            float d;
            const int sum = q8(x + b * IE_QK, q + b * IE_QK, &d);
            const float s = (float)sum * d;
            memcpy(dp + 4 * b, &d, sizeof d);
            memcpy(sp + 4 * b, &s, sizeof s);
        }
        break;
    }
    case IE_DTYPE_Q16_P: quantize_row_q16_p(x, out, n); break;
    /* Q8_K (the 256-element k-quants' activations): the scalar reference
     * on every ISA, so every table writes the same bytes */
    case IE_DTYPE_Q8_K: ie_quantize_row_q8_k_ref(x, out, n); break;
    default: break;
    }
}

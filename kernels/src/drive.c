/* drive.c — ISA-independent drivers shared by the x86 kernel files.
 *
 * The AVX2 and AVX-512 files differ only in their tiles (the register-
 * blocked inner kernels, compiled with their own flags); how rows are cut
 * into L2 panels, how a matmul walks its tiles and how activations are
 * quantized block by block is the same and lives here once. */
#include "ie_kernels_impl.h"

#include <string.h>

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

void ie_act_quantize_drive(ie_dtype_t act, const float *x, void *out, int64_t n, ie_q8_block_fn q8)
{
    switch (act) {
    case IE_DTYPE_F32: memcpy(out, x, (size_t)n * sizeof(float)); break;
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
    default: break;
    }
}

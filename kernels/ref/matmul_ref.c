/* matmul_ref.c — the reference matmul: the oracle every SIMD kernel is
 * tested against.
 *
 * Deliberately plain: one weight row times one activation row at a time,
 * integer block sums computed exactly in int, everything else accumulated in
 * double so that the oracle is more accurate than any kernel it judges.
 * Y[t*ldy + r] = sum_k W[r][k] * A[t][k]; for block formats the block product
 * is d_w*d_a*sum(q_w*q_a) (+ m_w*s_a for Q4_1 x Q8_1), as in ggml; for
 * MXFP4 q_w is the doubled E2M1 value and d_w = 2^(e-128).
 */
#include "ie_kernels.h"
#include "../src/ie_kernels_isa.h"

#define ROW(base, r, bytes) ((const char *)(base) + (size_t)(r) * (bytes))

void ie_matmul_f32_f32_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                           int64_t n_tok, float *y, int64_t ldy)
{
    const size_t wb = ie_dtype_row_bytes(IE_DTYPE_F32, n_in);
    for (int64_t t = 0; t < n_tok; t++) {
        const float *x = (const float *)ROW(a, t, a_stride);
        for (int64_t r = r0; r < r1; r++) {
            const float *wr = (const float *)ROW(w, r, wb);
            double s = 0.0;
            for (int64_t k = 0; k < n_in; k++) s += (double)wr[k] * x[k];
            y[t * ldy + r] = (float)s;
        }
    }
}

void ie_matmul_f16_f32_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                           int64_t n_tok, float *y, int64_t ldy)
{
    const size_t wb = ie_dtype_row_bytes(IE_DTYPE_F16, n_in);
    for (int64_t t = 0; t < n_tok; t++) {
        const float *x = (const float *)ROW(a, t, a_stride);
        for (int64_t r = r0; r < r1; r++) {
            const ie_f16_t *wr = (const ie_f16_t *)ROW(w, r, wb);
            double s = 0.0;
            for (int64_t k = 0; k < n_in; k++) s += (double)ie_f16_to_f32(wr[k]) * x[k];
            y[t * ldy + r] = (float)s;
        }
    }
}

void ie_matmul_bf16_f32_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                            int64_t n_tok, float *y, int64_t ldy)
{
    const size_t wb = ie_dtype_row_bytes(IE_DTYPE_BF16, n_in);
    for (int64_t t = 0; t < n_tok; t++) {
        const float *x = (const float *)ROW(a, t, a_stride);
        for (int64_t r = r0; r < r1; r++) {
            const ie_bf16_t *wr = (const ie_bf16_t *)ROW(w, r, wb);
            double s = 0.0;
            for (int64_t k = 0; k < n_in; k++) s += (double)ie_bf16_to_f32(wr[k]) * x[k];
            y[t * ldy + r] = (float)s;
        }
    }
}

/* BF16 weights x BF16 activations (both plain bf16 rows, any n_in): every
 * product of two bf16 values is exact in double, summed in double. */
void ie_matmul_bf16_bf16_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy)
{
    const size_t wb = ie_dtype_row_bytes(IE_DTYPE_BF16, n_in);
    for (int64_t t = 0; t < n_tok; t++) {
        const ie_bf16_t *x = (const ie_bf16_t *)ROW(a, t, a_stride);
        for (int64_t r = r0; r < r1; r++) {
            const ie_bf16_t *wr = (const ie_bf16_t *)ROW(w, r, wb);
            double s = 0.0;
            for (int64_t k = 0; k < n_in; k++) s += (double)ie_bf16_to_f32(wr[k]) * ie_bf16_to_f32(x[k]);
            y[t * ldy + r] = (float)s;
        }
    }
}

void ie_matmul_q8_0_q8_0_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy)
{
    const size_t wb = ie_dtype_row_bytes(IE_DTYPE_Q8_0, n_in);
    const int64_t nb = n_in / IE_QK;
    for (int64_t t = 0; t < n_tok; t++) {
        const ie_block_q8_0_t *x = (const ie_block_q8_0_t *)ROW(a, t, a_stride);
        for (int64_t r = r0; r < r1; r++) {
            const ie_block_q8_0_t *wr = (const ie_block_q8_0_t *)ROW(w, r, wb);
            double s = 0.0;
            for (int64_t b = 0; b < nb; b++) {
                int sumi = 0;
                for (int j = 0; j < IE_QK; j++) sumi += wr[b].q[j] * x[b].q[j];
                s += (double)ie_f16_to_f32(wr[b].d) * ie_f16_to_f32(x[b].d) * sumi;
            }
            y[t * ldy + r] = (float)s;
        }
    }
}

void ie_matmul_q4_0_q8_0_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy)
{
    const size_t wb = ie_dtype_row_bytes(IE_DTYPE_Q4_0, n_in);
    const int64_t nb = n_in / IE_QK;
    for (int64_t t = 0; t < n_tok; t++) {
        const ie_block_q8_0_t *x = (const ie_block_q8_0_t *)ROW(a, t, a_stride);
        for (int64_t r = r0; r < r1; r++) {
            const ie_block_q4_0_t *wr = (const ie_block_q4_0_t *)ROW(w, r, wb);
            double s = 0.0;
            for (int64_t b = 0; b < nb; b++) {
                int sumi = 0;
                for (int j = 0; j < IE_QK / 2; j++) {
                    sumi += ((wr[b].qs[j] & 0x0f) - 8) * x[b].q[j];
                    sumi += ((wr[b].qs[j] >> 4) - 8) * x[b].q[j + IE_QK / 2];
                }
                s += (double)ie_f16_to_f32(wr[b].d) * ie_f16_to_f32(x[b].d) * sumi;
            }
            y[t * ldy + r] = (float)s;
        }
    }
}

void ie_matmul_q4_1_q8_1_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                             int64_t n_tok, float *y, int64_t ldy)
{
    const size_t wb = ie_dtype_row_bytes(IE_DTYPE_Q4_1, n_in);
    const int64_t nb = n_in / IE_QK;
    for (int64_t t = 0; t < n_tok; t++) {
        const ie_block_q8_1_t *x = (const ie_block_q8_1_t *)ROW(a, t, a_stride);
        for (int64_t r = r0; r < r1; r++) {
            const ie_block_q4_1_t *wr = (const ie_block_q4_1_t *)ROW(w, r, wb);
            double s = 0.0;
            for (int64_t b = 0; b < nb; b++) {
                int sumi = 0;
                for (int j = 0; j < IE_QK / 2; j++) {
                    sumi += (wr[b].qs[j] & 0x0f) * x[b].q[j];
                    sumi += (wr[b].qs[j] >> 4) * x[b].q[j + IE_QK / 2];
                }
                s += (double)ie_f16_to_f32(wr[b].d) * ie_f16_to_f32(x[b].d) * sumi;
                s += (double)ie_f16_to_f32(wr[b].m) * ie_f16_to_f32(x[b].s);
            }
            y[t * ldy + r] = (float)s;
        }
    }
}

/* MXFP4 x Q8_0: sum_j kv_j*q_j exact in int (|.| <= 32*12*127), scaled by
 * d_a * 2^(e-128) in double (no overflow or underflow for any e). */
void ie_matmul_mxfp4_q8_0_ref(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                              int64_t n_tok, float *y, int64_t ldy)
{
    const size_t wb = ie_dtype_row_bytes(IE_DTYPE_MXFP4, n_in);
    const int64_t nb = n_in / IE_QK;
    for (int64_t t = 0; t < n_tok; t++) {
        const ie_block_q8_0_t *x = (const ie_block_q8_0_t *)ROW(a, t, a_stride);
        for (int64_t r = r0; r < r1; r++) {
            const ie_block_mxfp4_t *wr = (const ie_block_mxfp4_t *)ROW(w, r, wb);
            double s = 0.0;
            for (int64_t b = 0; b < nb; b++) {
                int sumi = 0;
                for (int j = 0; j < IE_QK / 2; j++) {
                    sumi += ie_mxfp4_kvalues[wr[b].qs[j] & 0x0f] * x[b].q[j];
                    sumi += ie_mxfp4_kvalues[wr[b].qs[j] >> 4] * x[b].q[j + IE_QK / 2];
                }
                s += (double)ie_e8m0_half_to_f32(wr[b].e) * ie_f16_to_f32(x[b].d) * sumi;
            }
            y[t * ldy + r] = (float)s;
        }
    }
}

/* ie_test_kq.h — random k-quant matrices in PANEL16 (and MXFP4 ones in
 * ROWS) for the tests of the GEMMs (test-only, header: each suite is its own executable).
 * Needs ie_test_rng.h and kernels/src/ie_kernels_isa.h included first. */
#ifndef IE_TEST_KQ_H
#define IE_TEST_KQ_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ie_dtype.h"
#include "ie_pack.h"

/* The k-quant types and MXFP4: the k-quant panels' types (ie_dtype_is_kq_panel). */
static const ie_dtype_t IE_TEST_KTYPES[] = {IE_DTYPE_Q5_0,   IE_DTYPE_Q5_1, IE_DTYPE_IQ4_NL, IE_DTYPE_Q2_K,
                                            IE_DTYPE_Q3_K,   IE_DTYPE_Q4_K, IE_DTYPE_Q5_K,   IE_DTYPE_Q6_K,
                                            IE_DTYPE_IQ4_XS, IE_DTYPE_MXFP4};
#define IE_TEST_N_KTYPES ((int)(sizeof IE_TEST_KTYPES / sizeof IE_TEST_KTYPES[0]))

/* An n_out x n_in matrix of type t (n_in a multiple of its block) in
 * PANEL16, 64-byte aligned (free()), from ggml blocks of random fields
 * (ie_kq_encode: codes and sub-block codes over their whole range, d and
 * dmin of either sign, 2^-9 .. 2^-3 in f16; MXFP4 the powers of two there)
 * repacked; NULL on failure. */
static inline void *ie_test_kq_random(ie_dtype_t t, int64_t n_in, int64_t n_out)
{
    ie_kq_info_t in;
    if (ie_kq_info(t, &in) != 0 || n_in % in.qk != 0) return NULL;
    const size_t rb = ie_dtype_row_bytes(t, n_in), bb = ie_dtype_block_bytes(t);
    uint8_t *rows = malloc(rb * (size_t)n_out);
    const size_t pbytes = (ie_pack_bytes(t, in.qk, n_in, n_out) + 63) / 64 * 64;
    void *dst = aligned_alloc(64, pbytes);
    if (!rows || !dst) {
        free(rows), free(dst);
        return NULL;
    }
    for (int64_t r = 0; r < n_out; r++)
        for (int64_t b = 0; b < n_in / in.qk; b++) {
            ie_kq_codes_t c;
            memset(&c, 0, sizeof c);
            for (int k = 0; k < in.qk; k++) c.u[k] = (uint8_t)(rng_u32() & ((1u << in.bits) - 1u));
            for (int j = 0; j < 16; j++) {
                c.sc[j] = (int8_t)rng_u32();
                c.mn[j] = (int8_t)rng_u32();
            }
            const float sd = (rng_u32() & 1 ? -1.0f : 1.0f) *
                             ldexpf(1.0f + rng_f() * 0.5f, -3 - (int)(rng_u32() % 7));
            const float sm = (rng_u32() & 1 ? -1.0f : 1.0f) *
                             ldexpf(1.0f + rng_f() * 0.5f, -3 - (int)(rng_u32() % 7));
            c.d = ie_f32_to_f16(t == IE_DTYPE_MXFP4 ? ldexpf(1.0f, -3 - (int)(rng_u32() % 7)) : sd);
            c.dmin = ie_f32_to_f16(sm);
            if (ie_kq_encode(t, &c, rows + (size_t)r * rb + (size_t)b * bb) != 0) {
                free(rows), free(dst);
                return NULL;
            }
        }
    const int ok = ie_pack_repack(t, in.qk, rows, n_in, 0, n_out, n_out, dst) == 0;
    free(rows);
    if (!ok) {
        free(dst);
        return NULL;
    }
    return dst;
}

/* An n_out x n_in MXFP4 matrix (ROWS, ggml blocks; malloc, free()) of
 * random bytes: every code, block exponents e uniform in [e_lo, e_hi]. */
static inline uint8_t *ie_test_mxfp4_random(int64_t n_in, int64_t n_out, int e_lo, int e_hi)
{
    const size_t n = ie_dtype_row_bytes(IE_DTYPE_MXFP4, n_in) * (size_t)n_out;
    uint8_t *w = malloc(n + 1);
    if (!w) return NULL;
    for (size_t i = 0; i < n; i++) w[i] = (uint8_t)rng_u32();
    for (size_t i = 0; i < n; i += sizeof(ie_block_mxfp4_t))
        w[i] = (uint8_t)(e_lo + (int)(rng_u32() % (uint32_t)(e_hi - e_lo + 1)));
    return w;
}

#endif

/* ie_attn.h — attention inner loops over a KV cache (grouped-query aware).
 *
 * One call handles nh query heads that share one KV head (GQA: the K and V
 * rows are read once for all of them). Positions are rows of the cache,
 * k_stride / v_stride floats apart; head vectors have hd floats. Pure
 * functions over caller memory, no allocation; a scalar ref and an AVX-512
 * variant (hd a multiple of 16; other sizes fall back to ref).
 *
 * Paged caches call both loops once per block of positions (rows of one
 * block are contiguous, blocks are not). Both are written so that splitting
 * the positions into segments changes no bit:
 *   scores  every score is computed the same way wherever it sits in the
 *           call (no dependence on which 16-position group it falls in);
 *   values  accumulates in float, position by position in order, and with
 *           `acc` set continues from the sums already in out — so segment
 *           calls (the first with acc 0, the rest with acc 1) equal one
 *           call over all positions bit for bit.
 */
#ifndef IE_ATTN_H
#define IE_ATTN_H

#include "ie_kernels.h"

#include <stddef.h>

typedef struct ie_attn_ops {
    ie_isa_t isa;
    /* s[h*ld + j] = scale * dot(q + h*q_stride, k + j*k_stride, hd)
     * for h < nh, j < n. */
    void (*scores)(const float *q, size_t q_stride, int nh, const float *k, size_t k_stride, int n, int hd,
                   float scale, float *s, size_t ld);
    /* out[h*o_stride + i] (acc ? += : =) sum_j p[h*ld + j] * v[j*v_stride + i]
     * for h < nh, i < hd; the sum runs over j = 0..n-1 in order, in float,
     * starting from out's value when acc != 0 (from 0 otherwise). */
    void (*values)(const float *p, size_t ld, int nh, const float *v, size_t v_stride, int n, int hd, float *out,
                   size_t o_stride, int acc);
} ie_attn_ops_t;

/* Attention loops for `isa` (REF always; AVX2 uses the portable C loops),
 * or NULL if the ISA is not supported by this CPU. */
const ie_attn_ops_t *ie_attn_get(ie_isa_t isa);

/* The scalar loops: scores accumulate each dot product in double; values
 * accumulate in float in position order (the contract above: a paged cache
 * needs the running sums to live in out between segment calls). The
 * double-precision definition of values is the test's own oracle. */
void ie_attn_scores_ref(const float *q, size_t q_stride, int nh, const float *k, size_t k_stride, int n, int hd,
                        float scale, float *s, size_t ld);
void ie_attn_values_ref(const float *p, size_t ld, int nh, const float *v, size_t v_stride, int n, int hd,
                        float *out, size_t o_stride, int acc);

#endif

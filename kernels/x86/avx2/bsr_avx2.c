/* bsr_avx2.c — STUB, replaced by the block-sparse work. */
#include "../../src/ie_kernels_impl.h"
void ie_bsr_matmul_avx2(const ie_bsr_t *m, int64_t r0, int64_t r1, const float *x, size_t xs, int64_t n_tok,
                        float *y, int64_t ldy) { ie_bsr_matmul_ref(m, r0, r1, x, xs, n_tok, y, ldy); }

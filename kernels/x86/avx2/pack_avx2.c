/* pack_avx2.c — STUB, replaced by the packed-kernels work. */
#include "../../src/ie_kernels_impl.h"
int ie_matmul_packed_avx2(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                          int64_t n_tok, float *y, int64_t ldy)
{ return ie_matmul_packed_ref(m, r0, r1, a, a_stride, n_tok, y, ldy); }

/* pack_ref.c — STUB, replaced by the packed-kernels work. */
#include "../src/ie_kernels_impl.h"
#include <string.h>
int ie_matmul_packed_ref(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                         int64_t n_tok, float *y, int64_t ldy) { return -1; }
void ie_quantize_row_q8_p_ref(const float *x, void *out, int64_t n) { }

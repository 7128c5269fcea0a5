/* ie_bsr.h — block-sparse weights (BSR: block compressed sparse rows).
 *
 * An n_out x n_in matrix cut into br x bc blocks (br divides n_out, bc
 * divides n_in); only non-zero blocks are stored, block-row by block-row,
 * with their block-column indices ascending. Values are f32, each block
 * row-major (br rows of bc floats).
 *
 * Serialized form (one blob, little-endian; what IEBIN stores for a tensor
 * with layout "bsr", and what ie_bsr_from_dense returns):
 *     offset 0   char     magic[4] = "BSR1"
 *            4   uint32   br, bc
 *           12   uint32   reserved (0)
 *           16   uint64   n_blocks
 *           24   uint32   rowptr[n_out/br + 1]   rowptr[0] = 0, non-decreasing,
 *                                                rowptr[last] = n_blocks
 *                uint32   colidx[n_blocks]       < n_in/bc, strictly ascending
 *                                                within a block row
 *                (zero padding to a multiple of 64 bytes from the blob start)
 *                float    values[n_blocks][br][bc]
 * Blob bytes: ie_bsr_bytes(). The blob must be 64-byte aligned in memory.
 */
#ifndef IE_BSR_H
#define IE_BSR_H

#include <stddef.h>
#include <stdint.h>

typedef struct ie_bsr {
    int64_t n_in, n_out;
    int br, bc;
    int64_t n_blocks;
    const uint32_t *rowptr; /* n_out/br + 1 */
    const uint32_t *colidx; /* n_blocks     */
    const float *values;    /* n_blocks*br*bc */
} ie_bsr_t;

/* Bytes of a serialized BSR blob. */
size_t ie_bsr_bytes(int64_t n_out, int br, int bc, int64_t n_blocks);

/* Validate a serialized blob of `bytes` bytes for an n_out x n_in matrix and
 * fill *out with pointers into it. Checks magic, block sizes (1..64, dividing
 * the shape), size, rowptr monotonic, column indices in range and ascending.
 * Returns 0, or -1 with a one-line reason in err (may be NULL). */
int ie_bsr_view(const void *blob, size_t bytes, int64_t n_in, int64_t n_out, ie_bsr_t *out, char *err,
                size_t err_cap);

/* Convert a dense f32 matrix (rows n_in floats apart) to a new serialized
 * blob, dropping every block whose largest |value| is <= threshold (0: keep
 * every block with a non-zero). *blob is malloc'd (64-byte aligned, free()
 * it), *bytes its size. Returns 0, or -1 (bad shape / out of memory). */
int ie_bsr_from_dense(const float *w, int64_t n_in, int64_t n_out, int br, int bc, float threshold, void **blob,
                      size_t *bytes);

/* The matmul over such a matrix is ie_kernels_t.matmul_bsr (ie_kernels.h):
 * Y[t*ldy + r] = sum_k W[r][k] * X[t][k] for rows r in [r0, r1) (multiples
 * of br, or r1 = n_out) and tokens t < n_tok; X rows xs floats apart. */

#endif

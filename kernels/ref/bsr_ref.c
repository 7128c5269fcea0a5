/* bsr_ref.c — block-sparse (BSR) blobs: size, validation, conversion from
 * dense, and the scalar reference matmul (the oracle of the SIMD twins in
 * kernels/x86/{avx2,avx512}/bsr_*.c).
 *
 * ie_bsr_view is fed untrusted file data: it reads nothing before checking
 * that the bytes it is about to read lie inside [blob, blob + bytes), and
 * every size computation is overflow-checked before use.
 */
#include "ie_bsr.h"
#include "../src/ie_kernels_isa.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BSR_HDR 24u   /* magic, br, bc, reserved, n_blocks */
#define BSR_ALIGN 64u /* values start and blob alignment  */
#define BSR_MAX_BLK 64

static void set_err(char *err, size_t cap, const char *fmt, ...)
{
    if (!err || cap == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

/* Bytes of header + rowptr + colidx + padding (the offset of values), or 0
 * on overflow. nbr = block rows, nb = blocks (both already range-checked
 * to fit uint32 by the callers that need it). */
static size_t meta_bytes(uint64_t nbr, uint64_t nb)
{
    /* nbr + 1 and nb are each < 2^62 here, so the sum cannot wrap in u64. */
    if (nbr >= (UINT64_C(1) << 60) || nb >= (UINT64_C(1) << 60)) return 0;
    const uint64_t m = (uint64_t)BSR_HDR + 4u * (nbr + 1u) + 4u * nb;
    const uint64_t padded = (m + (BSR_ALIGN - 1)) & ~(uint64_t)(BSR_ALIGN - 1);
    if (padded > SIZE_MAX) return 0;
    return (size_t)padded;
}

size_t ie_bsr_bytes(int64_t n_out, int br, int bc, int64_t n_blocks)
{
    /* 0 for invalid arguments or a size that does not fit size_t. */
    if (br < 1 || bc < 1 || br > BSR_MAX_BLK || bc > BSR_MAX_BLK || n_out < 0 || n_blocks < 0) return 0;
    const size_t meta = meta_bytes((uint64_t)(n_out / br), (uint64_t)n_blocks);
    if (meta == 0) return 0;
    const uint64_t per_block = (uint64_t)br * (uint64_t)bc * sizeof(float); /* <= 16 KiB */
    if ((uint64_t)n_blocks > (UINT64_MAX - meta) / per_block) return 0;
    const uint64_t total = meta + (uint64_t)n_blocks * per_block;
    if (total > SIZE_MAX) return 0;
    return (size_t)total;
}

static uint32_t rd_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd_u64(const unsigned char *p) { return (uint64_t)rd_u32(p) | (uint64_t)rd_u32(p + 4) << 32; }

int ie_bsr_view(const void *blob, size_t bytes, int64_t n_in, int64_t n_out, ie_bsr_t *out, char *err,
                size_t err_cap)
{
    if (!blob || !out) {
        set_err(err, err_cap, "bsr: NULL blob or output");
        return -1;
    }
    if (((uintptr_t)blob & (BSR_ALIGN - 1)) != 0) {
        set_err(err, err_cap, "bsr: blob not 64-byte aligned");
        return -1;
    }
    if (n_in < 1 || n_out < 1) {
        set_err(err, err_cap, "bsr: bad shape %" PRId64 "x%" PRId64, n_out, n_in);
        return -1;
    }
    if (bytes < BSR_HDR) {
        set_err(err, err_cap, "bsr: blob of %zu bytes shorter than its header", bytes);
        return -1;
    }
    const unsigned char *p = blob;
    if (memcmp(p, "BSR1", 4) != 0) {
        set_err(err, err_cap, "bsr: bad magic");
        return -1;
    }
    const uint32_t br = rd_u32(p + 4), bc = rd_u32(p + 8), reserved = rd_u32(p + 12);
    const uint64_t nb = rd_u64(p + 16);
    if (br < 1 || br > BSR_MAX_BLK || bc < 1 || bc > BSR_MAX_BLK) {
        set_err(err, err_cap, "bsr: block size %ux%u outside 1..64", br, bc);
        return -1;
    }
    if (n_out % br != 0 || n_in % bc != 0) {
        set_err(err, err_cap, "bsr: block %ux%u does not divide the shape %" PRId64 "x%" PRId64, br, bc, n_out,
                n_in);
        return -1;
    }
    if (reserved != 0) {
        set_err(err, err_cap, "bsr: reserved header field is %u, not 0", reserved);
        return -1;
    }
    const uint64_t nbr = (uint64_t)(n_out / br), nbc = (uint64_t)(n_in / bc);
    /* rowptr and colidx are uint32: more block rows/columns than that cannot
     * be indexed; n_blocks cannot exceed nbr*nbc (distinct ascending columns). */
    if (nbr >= UINT32_MAX || nbc > (uint64_t)UINT32_MAX + 1) {
        set_err(err, err_cap, "bsr: shape %" PRId64 "x%" PRId64 " too large for 32-bit block indices", n_out, n_in);
        return -1;
    }
    if (nb > UINT32_MAX || (nbc != 0 && nb / nbc > nbr) || (nb / nbc == nbr && nb % nbc != 0)) {
        set_err(err, err_cap, "bsr: n_blocks %" PRIu64 " exceeds the %" PRIu64 "x%" PRIu64 " block grid", nb, nbr,
                nbc);
        return -1;
    }
    const size_t want = ie_bsr_bytes(n_out, (int)br, (int)bc, (int64_t)nb);
    if (want == 0) {
        set_err(err, err_cap, "bsr: size overflows");
        return -1;
    }
    if (bytes != want) {
        set_err(err, err_cap, "bsr: blob has %zu bytes, %" PRIu64 " blocks of %ux%u need %zu", bytes, nb, br, bc,
                want);
        return -1;
    }
    /* From here on every offset below `want` is readable. The blob is 64-byte
     * aligned and header (24) is a multiple of 4, so the uint32 arrays are
     * naturally aligned; values start at a multiple of 64. */
    const uint32_t *rowptr = (const uint32_t *)(p + BSR_HDR);
    const uint32_t *colidx = rowptr + nbr + 1;
    const float *values = (const float *)(p + meta_bytes(nbr, nb));
    if (rd_u32((const unsigned char *)&rowptr[0]) != 0) {
        set_err(err, err_cap, "bsr: rowptr[0] = %u, not 0", rd_u32((const unsigned char *)&rowptr[0]));
        return -1;
    }
    for (uint64_t i = 0; i < nbr; i++) {
        const uint32_t b = rd_u32((const unsigned char *)&rowptr[i]);
        const uint32_t e = rd_u32((const unsigned char *)&rowptr[i + 1]);
        if (e < b || e > nb) {
            set_err(err, err_cap, "bsr: rowptr[%" PRIu64 "] = %u %s", i + 1, e,
                    e < b ? "decreases" : "exceeds n_blocks");
            return -1;
        }
        if (e - b > nbc) {
            set_err(err, err_cap, "bsr: block row %" PRIu64 " has %u blocks, more than %" PRIu64 " columns", i,
                    e - b, nbc);
            return -1;
        }
        for (uint32_t j = b; j < e; j++) {
            const uint32_t c = rd_u32((const unsigned char *)&colidx[j]);
            if (c >= nbc) {
                set_err(err, err_cap, "bsr: colidx[%u] = %u out of range (%" PRIu64 " block columns)", j, c, nbc);
                return -1;
            }
            if (j > b && c <= rd_u32((const unsigned char *)&colidx[j - 1])) {
                set_err(err, err_cap, "bsr: colidx[%u] = %u not ascending in block row %" PRIu64, j, c, i);
                return -1;
            }
        }
    }
    if (rd_u32((const unsigned char *)&rowptr[nbr]) != nb) {
        set_err(err, err_cap, "bsr: rowptr[last] = %u, n_blocks = %" PRIu64,
                rd_u32((const unsigned char *)&rowptr[nbr]), nb);
        return -1;
    }
    out->n_in = n_in;
    out->n_out = n_out;
    out->br = (int)br;
    out->bc = (int)bc;
    out->n_blocks = (int64_t)nb;
    out->rowptr = rowptr;
    out->colidx = colidx;
    out->values = values;
    return 0;
}

/* 1 if the br x bc block at (bi, bj) is kept: some |value| > threshold (a NaN
 * compares false, so a block holding one is kept). */
static int block_kept(const float *w, int64_t n_in, int br, int bc, int64_t bi, int64_t bj, float threshold)
{
    for (int i = 0; i < br; i++) {
        const float *row = w + (size_t)(bi * br + i) * (size_t)n_in + (size_t)(bj * bc);
        for (int j = 0; j < bc; j++) {
            const float a = row[j] < 0 ? -row[j] : row[j];
            if (!(a <= threshold)) return 1;
        }
    }
    return 0;
}

int ie_bsr_from_dense(const float *w, int64_t n_in, int64_t n_out, int br, int bc, float threshold, void **blob,
                      size_t *bytes)
{
    if (blob) *blob = NULL;
    if (bytes) *bytes = 0;
    if (!w || !blob || !bytes || n_in < 1 || n_out < 1 || br < 1 || bc < 1 || br > BSR_MAX_BLK ||
        bc > BSR_MAX_BLK || n_out % br != 0 || n_in % bc != 0)
        return -1;
    const int64_t nbr = n_out / br, nbc = n_in / bc;
    if ((uint64_t)nbr >= UINT32_MAX || (uint64_t)nbc > (uint64_t)UINT32_MAX + 1) return -1;

    /* Pass 1: count kept blocks. */
    uint64_t nb = 0;
    for (int64_t bi = 0; bi < nbr; bi++)
        for (int64_t bj = 0; bj < nbc; bj++) nb += (uint64_t)block_kept(w, n_in, br, bc, bi, bj, threshold);
    if (nb > UINT32_MAX) return -1;
    const size_t total = ie_bsr_bytes(n_out, br, bc, (int64_t)nb);
    if (total == 0) return -1;
    void *mem = NULL;
    if (posix_memalign(&mem, BSR_ALIGN, total) != 0) return -1;

    unsigned char *p = mem;
    const size_t meta = meta_bytes((uint64_t)nbr, nb);
    memset(p, 0, meta); /* header, reserved and padding */
    memcpy(p, "BSR1", 4);
    const uint32_t hb = (uint32_t)br, hc = (uint32_t)bc;
    memcpy(p + 4, &hb, 4); /* little-endian host (x86); the format is LE */
    memcpy(p + 8, &hc, 4);
    const uint64_t hn = nb;
    memcpy(p + 16, &hn, 8);
    uint32_t *rowptr = (uint32_t *)(p + BSR_HDR);
    uint32_t *colidx = rowptr + nbr + 1;
    float *values = (float *)(p + meta);

    /* Pass 2: fill. */
    uint32_t k = 0;
    rowptr[0] = 0;
    for (int64_t bi = 0; bi < nbr; bi++) {
        for (int64_t bj = 0; bj < nbc; bj++) {
            if (!block_kept(w, n_in, br, bc, bi, bj, threshold)) continue;
            colidx[k] = (uint32_t)bj;
            float *dst = values + (size_t)k * (size_t)br * (size_t)bc;
            for (int i = 0; i < br; i++)
                memcpy(dst + (size_t)i * bc, w + (size_t)(bi * br + i) * (size_t)n_in + (size_t)(bj * bc),
                       (size_t)bc * sizeof(float));
            k++;
        }
        rowptr[bi + 1] = k;
    }
    *blob = mem;
    *bytes = total;
    return 0;
}

void ie_bsr_matmul_ref(const ie_bsr_t *m, int64_t r0, int64_t r1, const float *x, size_t xs, int64_t n_tok,
                       float *y, int64_t ldy)
{
    /* Any r0 <= r1 <= n_out works here (the SIMD versions call this for
     * ranges that do not start on a block row). */
    const int br = m->br, bc = m->bc;
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xt = x + (size_t)t * xs;
        for (int64_t r = r0; r < r1; r++) {
            const int64_t bi = r / br;
            const int i = (int)(r % br);
            double acc = 0.0;
            for (uint32_t b = m->rowptr[bi]; b < m->rowptr[bi + 1]; b++) {
                const float *wr = m->values + ((size_t)b * (size_t)br + (size_t)i) * (size_t)bc;
                const float *xb = xt + (size_t)m->colidx[b] * (size_t)bc;
                for (int j = 0; j < bc; j++) acc += (double)wr[j] * (double)xb[j];
            }
            y[t * ldy + r] = (float)acc;
        }
    }
}

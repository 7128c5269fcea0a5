/* slice.c — sub-matrices of dense weight tensors (ie_tensor_slice), the
 * kernel-side half of tensor-parallel sharding: a worker cuts its rows
 * (q/k/v, gate/up, head) or columns (o, down) out of the full tensor in the
 * tensor's own encoding, so that every later step (conversion, repacking,
 * the matmuls) sees an ordinary, smaller matrix.
 *
 * Cuts never split a block: ROWS copies whole blocks (ggml block — 256
 * columns for the K types and IQ4_XS — or one I-type group with its
 * scales) of each row; PANEL16 copies whole groups of whole panels (a BF16 /
 * F16 group: 32 columns, 1 KiB; a k-quant group: one block's header and
 * codes), which are contiguous inside a panel, and rewrites the padding
 * rows of the last panel the way ie_pack_quantize / ie_pack_repack write
 * them. */
#include "ie_pack.h"
#include "ie_kernels_isa.h"

#include <string.h>

/* Elements and bytes of one indivisible unit of a ROWS row. 0 when the
 * dtype is not a dense weight type. */
static int rows_block(ie_dtype_t t, int group, int64_t *elems, size_t *bytes)
{
    if (ie_dtype_is_intw(t)) {
        if (group < 32 || group % 32 != 0) return 0;
        *elems = group;
        *bytes = ie_qrow_bytes(t, group, group);
        return *bytes != 0;
    }
    switch (t) {
    case IE_DTYPE_F32:
    case IE_DTYPE_F16:
    case IE_DTYPE_BF16:
    case IE_DTYPE_Q8_0:
    case IE_DTYPE_Q8_1:
    case IE_DTYPE_Q4_0:
    case IE_DTYPE_Q4_1:
    case IE_DTYPE_MXFP4:
        *elems = ie_dtype_block_elems(t);
        *bytes = ie_dtype_block_bytes(t);
        return *elems > 0 && *bytes > 0;
    default:
        if (!ie_dtype_is_kquant(t) && !ie_dtype_is_iquant(t)) return 0;
        *elems = ie_dtype_block_elems(t);
        *bytes = ie_dtype_block_bytes(t);
        return *elems > 0 && *bytes > 0;
    }
}

/* Write panel row i of one PANEL16 group as padding: scales 0 and the code
 * of 0.0f (I8W 128, I4W 8, I4WA 0), as ie_pack_quantize does; BF16 and
 * F16: its G values 0; a k-quant: every field 0 (d, dmin, sc, mn and the
 * codes), as ie_pack_repack does. */
static void pad_row(ie_dtype_t t, int G, uint8_t *grp, int i)
{
    ie_kq_panel_t kp;
    if (ie_kq_panel(t, &kp) == 0) {
        memset(grp + kp.d + 2 * (size_t)i, 0, 2);
        if (kp.info.has_dmin) memset(grp + kp.dmin + 2 * (size_t)i, 0, 2);
        for (int j = 0; j < kp.info.nsub; j++) {
            grp[kp.sc + (size_t)(IE_PANEL * j + i)] = 0;
            if (kp.info.has_mn) grp[kp.mn + (size_t)(IE_PANEL * j + i)] = 0;
        }
        const size_t chunks = (kp.block - kp.codes) / 64; /* every code chunk of the block */
        for (size_t ch = 0; ch < chunks; ch++) memset(grp + kp.codes + ch * 64 + 4 * (size_t)i, 0, 4);
        return;
    }
    if (t == IE_DTYPE_BF16) {
        for (int c = 0; c < G / 2; c++) memset(grp + (size_t)c * 64 + 4 * (size_t)i, 0, 4);
        return;
    }
    if (t == IE_DTYPE_F16) {
        for (int k = 0; k < G; k++) memset(grp + (size_t)k * 32 + 2 * (size_t)i, 0, 2);
        return;
    }
    const size_t sb = t == IE_DTYPE_I4WA ? 4 : 2; /* scale bytes per row */
    memset(grp + 2 * i, 0, 2);
    if (t == IE_DTYPE_I4WA) memset(grp + 2 * IE_PANEL + 2 * i, 0, 2);
    uint8_t *q = grp + IE_PANEL * sb;
    const int chunks = t == IE_DTYPE_I8W ? G / 4 : G / 8;
    const uint8_t code = t == IE_DTYPE_I8W ? 0x80 : t == IE_DTYPE_I4W ? 0x88 : 0x00;
    for (int ch = 0; ch < chunks; ch++) memset(q + (size_t)ch * 64 + 4 * (size_t)i, code, 4);
}

int ie_tensor_slice(ie_dtype_t dtype, ie_layout_t layout, int group, const void *src, int64_t n_in, int64_t n_out,
                    int64_t r0, int64_t r1, int64_t c0, int64_t c1, void *dst)
{
    if (!src || !dst || n_in <= 0 || n_out <= 0 || r0 < 0 || r0 >= r1 || r1 > n_out || c0 < 0 || c0 >= c1 ||
        c1 > n_in)
        return -1;
    if (layout == IE_LAYOUT_ROWS) {
        int64_t be;
        size_t bb;
        if (!rows_block(dtype, group, &be, &bb) || n_in % be != 0 || c0 % be != 0 || c1 % be != 0) return -1;
        const size_t rb = (size_t)(n_in / be) * bb, off = (size_t)(c0 / be) * bb,
                     len = (size_t)((c1 - c0) / be) * bb;
        for (int64_t r = r0; r < r1; r++)
            memcpy((char *)dst + (size_t)(r - r0) * len, (const char *)src + (size_t)r * rb + off, len);
        return 0;
    }
    if (layout != IE_LAYOUT_PANEL16 || ie_pack_check(dtype, group, n_in) != 0 || r0 % IE_PANEL != 0 ||
        c0 % group != 0 || c1 % group != 0)
        return -1;
    const int64_t ng = n_in / group, g0 = c0 / group, g1 = c1 / group;
    const size_t spb = ie_pack_panel_bytes(dtype, group, n_in), gb = spb / (size_t)ng;
    const size_t dpb = gb * (size_t)(g1 - g0);
    const int64_t rows = r1 - r0, np = (rows + IE_PANEL - 1) / IE_PANEL;
    for (int64_t p = 0; p < np; p++) {
        uint8_t *dp = (uint8_t *)dst + (size_t)p * dpb;
        memcpy(dp, (const uint8_t *)src + (size_t)(r0 / IE_PANEL + p) * spb + (size_t)g0 * gb, dpb);
        const int64_t live = rows - p * IE_PANEL; /* rows of this panel inside the cut */
        if (live >= IE_PANEL) continue;
        for (int64_t g = 0; g < g1 - g0; g++)
            for (int i = (int)live; i < IE_PANEL; i++) pad_row(dtype, group, dp + (size_t)g * gb, i);
    }
    return 0;
}

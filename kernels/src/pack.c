/* pack.c — sizes of the engine-native quantized layouts (ie_pack.h), and
 * where each field of a k-quant block sits in a PANEL16 panel. */
#include "ie_pack.h"
#include "ie_kernels_isa.h"

/* Bytes of scales per row per group (d, and m for affine). */
static size_t scale_bytes(ie_dtype_t t) { return t == IE_DTYPE_I4WA ? 4 : 2; }

/* Bytes of G quantized elements. */
static size_t quant_bytes(ie_dtype_t t, int group) { return t == IE_DTYPE_I8W ? (size_t)group : (size_t)group / 2; }

int ie_pack_check(ie_dtype_t dtype, int group, int64_t n_in)
{
    if (!ie_dtype_is_packable(dtype) || group <= 0 || group % 32 != 0 || n_in <= 0 || n_in % group != 0) return -1;
    if (ie_dtype_is_half(dtype) && group != IE_QK) return -1;
    if (ie_dtype_is_kq_panel(dtype) && group != ie_dtype_block_elems(dtype)) return -1;
    return 0;
}

int ie_kq_panel(ie_dtype_t t, ie_kq_panel_t *g)
{
    ie_kq_info_t in;
    if (ie_kq_info(t, &in) != 0) return -1;
    ie_kq_panel_t p = {.info = in};
    size_t o = 2 * IE_PANEL; /* after d[16] */
    if (in.has_dmin) {
        p.dmin = o;
        o += 2 * IE_PANEL;
    }
    if (in.nsub > 0) {
        p.sc = o;
        o += (size_t)IE_PANEL * (size_t)in.nsub;
    }
    if (in.has_mn) {
        p.mn = o;
        o += (size_t)IE_PANEL * (size_t)in.nsub;
    }
    p.codes = o;
    p.slab = 64 * (size_t)in.bits;
    /* planes: nibbles (bits >= 4), crumbs (2, 3: bits 0-1; 6: bits 4-5), bit (3: bit 2; 5: bit 4) */
    const int nib = in.bits >= 4, crumb = in.bits == 2 || in.bits == 3 || in.bits == 6;
    p.nib = 0;
    p.crumb = nib ? 4 * 64 : 0;
    p.bit = (size_t)(4 * nib + 2 * crumb) * 64;
    p.block = p.codes + (size_t)(in.qk / 32) * p.slab;
    *g = p;
    return 0;
}

size_t ie_pack_panel_bytes(ie_dtype_t dtype, int group, int64_t n_in)
{
    if (ie_pack_check(dtype, group, n_in) != 0) return 0;
    if (ie_dtype_is_half(dtype)) return (size_t)n_in * IE_PANEL * 2;
    ie_kq_panel_t kp;
    if (ie_kq_panel(dtype, &kp) == 0) return (size_t)(n_in / group) * kp.block;
    return (size_t)(n_in / group) * IE_PANEL * (scale_bytes(dtype) + quant_bytes(dtype, group));
}

size_t ie_pack_bytes(ie_dtype_t dtype, int group, int64_t n_in, int64_t n_out)
{
    if (n_out <= 0) return 0;
    size_t p = ie_pack_panel_bytes(dtype, group, n_in);
    size_t n_panels = (size_t)((n_out + IE_PANEL - 1) / IE_PANEL), total;
    if (__builtin_mul_overflow(p, n_panels, &total)) return 0;
    return total;
}

size_t ie_qrow_bytes(ie_dtype_t dtype, int group, int64_t n_in)
{
    if (!ie_dtype_is_intw(dtype) || ie_pack_check(dtype, group, n_in) != 0) return 0;
    return (size_t)(n_in / group) * (scale_bytes(dtype) + quant_bytes(dtype, group));
}

size_t ie_tensor_bytes(ie_dtype_t dtype, ie_layout_t layout, int group, int64_t n_in, int64_t n_rows)
{
    size_t row, total;
    if (n_in <= 0 || n_rows <= 0) return 0;
    switch (layout) {
    case IE_LAYOUT_ROWS:
        row = ie_dtype_is_intw(dtype)
                  ? ie_qrow_bytes(dtype, group, n_in)
                  : (dtype == IE_DTYPE_Q8_P || dtype == IE_DTYPE_Q16_P ? 0 : ie_dtype_row_bytes(dtype, n_in));
        if (row == 0 || __builtin_mul_overflow(row, (size_t)n_rows, &total)) return 0;
        return total;
    case IE_LAYOUT_PANEL16: return ie_pack_bytes(dtype, group, n_in, n_rows);
    default: return 0;
    }
}

/* pack.c — sizes of the engine-native quantized layouts (ie_pack.h). */
#include "ie_pack.h"

/* Bytes of scales per row per group (d, and m for affine). */
static size_t scale_bytes(ie_dtype_t t) { return t == IE_DTYPE_I4WA ? 4 : 2; }

/* Bytes of G quantized elements. */
static size_t quant_bytes(ie_dtype_t t, int group) { return t == IE_DTYPE_I8W ? (size_t)group : (size_t)group / 2; }

int ie_pack_check(ie_dtype_t dtype, int group, int64_t n_in)
{
    if (!ie_dtype_is_packable(dtype) || group <= 0 || group % 32 != 0 || n_in <= 0 || n_in % group != 0) return -1;
    if (ie_dtype_is_half(dtype) && group != IE_QK) return -1;
    if (ie_dtype_is_kquant(dtype)) return -1; /* no packed k-quant kernels yet */
    return 0;
}

size_t ie_pack_panel_bytes(ie_dtype_t dtype, int group, int64_t n_in)
{
    if (ie_pack_check(dtype, group, n_in) != 0) return 0;
    if (ie_dtype_is_half(dtype)) return (size_t)n_in * IE_PANEL * 2;
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

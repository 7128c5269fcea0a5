/* ie_kvcache.h — the KV cache's storage types and the attention loops that
 * read them without a decoded copy (docs/KVCACHE.md).
 *
 * One KV head of hd values is encoded on its own (ie_kv_encode), so a head
 * is read without its neighbours and every block layout works unchanged.
 * The loops (ie_kernels_t.kv_scores / kv_values) take the cache rows as
 * bytes through a view like ie_attn.h's (contiguous or paged), convert each
 * row in registers as it is read (f16 by vcvtph2ps, bf16 by a shift, FP8
 * through f16, q4 nibbles widened) and score a q8 K cache on integers: the
 * query head is quantized once per call to int16 (its absmax / 32767) and
 * each q·k is an exact int32 sum (AVX-512 VNNI vpdpwssd, AVX2 vpmaddwd),
 * scaled by the row's and the query's scales after. Groups of 16 positions
 * are counted from j0, so a paged view gives the bits of a contiguous one
 * whatever its blocks.
 */
#ifndef IE_KVCACHE_H
#define IE_KVCACHE_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* How the KV cache stores K or V. Per (position, KV head): f32; f16 / bf16
 * (2 bytes a value); q8: one f32 scale (absmax / 127) then hd int8 values;
 * q4: groups of 32 along the head dimension, each an f16 scale and 32 4-bit
 * values (llama.cpp's q4_0 layout, 18 bytes: value i of a group in the low
 * nibble of byte i, value i + 16 in its high nibble); fp8_e4m3 / fp8_e5m2:
 * one byte a value (OCP FP8, saturating, no scale). */
typedef enum ie_kv_type {
    IE_KV_F32 = 0,
    IE_KV_F16,
    IE_KV_BF16,
    IE_KV_Q8,
    IE_KV_Q4,
    IE_KV_FP8_E4M3,
    IE_KV_FP8_E5M2,
    IE_KV_TYPE_COUNT
} ie_kv_type_t;

/* The largest head size the loops take (scratch sizes depend on it). */
#define IE_KV_MAX_HD 256

/* Bytes of one encoded head of hd values, or 0 if type t cannot hold it
 * (q4: hd a multiple of 32; every type but f32: hd <= IE_KV_MAX_HD). */
size_t ie_kv_head_bytes(ie_kv_type_t t, int hd);

/* Encode hd floats into ie_kv_head_bytes(t, hd) bytes at dst: f16 / FP8
 * rounded to nearest even and saturated, bf16 rounded to nearest even, q8
 * round(x / d) with d = absmax / 127, q4 llama.cpp's q4_0 (d = the signed
 * value of largest magnitude / -8, in f16). Scalar on every ISA: one head a
 * token and layer is written, the reads are what attention pays for. */
void ie_kv_encode(ie_kv_type_t t, const float *x, int hd, void *dst);

/* Rows of one head's cache as bytes. tab NULL: row j at base +
 * j*row_stride. Else row j in physical block tab[j / block], at base +
 * tab[j / block]*block_stride + (j % block)*row_stride; every block a call
 * touches must be bound (the caller checks). */
typedef struct ie_kv_rows {
    const unsigned char *base;
    size_t row_stride;   /* bytes between consecutive rows of a block */
    const int32_t *tab;  /* logical block -> physical block, or NULL  */
    int block;           /* rows per block (tab != NULL)              */
    size_t block_stride; /* bytes between physical blocks             */
} ie_kv_rows_t;

/* Row j of a view. */
static inline const unsigned char *ie_kv_row(const ie_kv_rows_t *r, int j)
{
    if (!r->tab) return r->base + (size_t)j * r->row_stride;
    return r->base + (size_t)r->tab[j / r->block] * r->block_stride + (size_t)(j % r->block) * r->row_stride;
}

/* Walks a view's rows in order, one table lookup per block. */
typedef struct ie_kv_cursor {
    const unsigned char *row;
    int left; /* rows left in this block (0: look up the next) */
    int lb;
    ie_kv_rows_t v;
} ie_kv_cursor_t;

static inline void ie_kv_cursor_init(ie_kv_cursor_t *c, const ie_kv_rows_t *r, int j)
{
    c->v = *r;
    if (!r->tab) {
        c->row = r->base + (size_t)j * r->row_stride;
        c->left = INT_MAX;
        c->lb = 0;
        return;
    }
    c->lb = j / r->block;
    c->row = r->base + (size_t)r->tab[c->lb] * r->block_stride + (size_t)(j % r->block) * r->row_stride;
    c->left = r->block - j % r->block;
}

/* The next row (the table is read only when a new block starts). */
static inline const unsigned char *ie_kv_cursor_next(ie_kv_cursor_t *c)
{
    if (c->left == 0) {
        c->lb++;
        c->row = c->v.base + (size_t)c->v.tab[c->lb] * c->v.block_stride;
        c->left = c->v.block;
    }
    const unsigned char *r = c->row;
    c->row += c->v.row_stride;
    c->left--;
    return r;
}

/* A query head for a q8 K cache: qi[i] = round(q[i] / d) (nearest even),
 * d = absmax(q) / 32767 (*d_out; 0 and zeros for a zero head), and zeros
 * from hd up to hd rounded up to 32 (the SIMD loops read whole chunks).
 * |qi| <= 32767 and |k| <= 127, so a head's int32 dot of up to
 * IE_KV_MAX_HD products is exact. */
void ie_kv_quantize_q16(const float *q, int hd, int16_t *qi, float *d_out);

/* One fused attention call (ie_kernels_t.kv_attend): nh query heads that
 * share one KV head against n rows, K row kj + r paired with V row vj + r
 * (a K copy of its own, say f32 rows of an open block, pairs with the
 * cache's V rows). Score s = scale * q.k (the kv_scores expression, a q8 K
 * on integers), then + add[h] (NULL: nothing; a smoothed K's scale * q.m),
 * then cap tanh(s / cap) when cap != 0 (Gemma 2's softcap). */
typedef struct ie_kv_attend {
    ie_kv_type_t kt, vt;
    const ie_kv_rows_t *k, *v;
    int kj, vj, n, hd, nh;
    const float *q; /* head h at q + h*q_stride */
    size_t q_stride;
    float scale, cap;
    const float *add; /* [nh] or NULL */
} ie_kv_attend_t;

#endif

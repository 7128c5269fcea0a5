/* ie_attn.h — attention inner loops over a KV cache (grouped-query aware).
 *
 * One call handles nh query heads that share one KV head (GQA: the K and V
 * rows are read once for all of them) over positions j0 .. j0+n-1 of one
 * sequence. The cache rows come through a view (ie_attn_rows_t): contiguous,
 * or paged — fixed-size blocks of rows placed anywhere in a pool, found
 * through the sequence's block table. A kernel computes position j0+j of a
 * paged view with exactly the arithmetic it uses for row j of a contiguous
 * view (the same sums in the same order, the same 16-position groups
 * counted from j0), so a paged cache gives the bits of a contiguous one
 * whatever the block size, the placement of the blocks or j0 (a sliding
 * window). Head vectors have hd floats. The loops themselves are
 * ie_kernels_t.attn_scores / attn_values (ie_kernels.h): pure functions
 * over caller memory, no allocation; a scalar ref, portable float loops for
 * AVX2 and an AVX-512 variant (hd a multiple of 16; other sizes fall back
 * to ref).
 */
#ifndef IE_ATTN_H
#define IE_ATTN_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* Rows of one head's K or V cache. tab NULL: row j at base + j*row_stride.
 * Else row j lives in physical block tab[j / block], at
 * base + tab[j / block]*block_stride + (j % block)*row_stride; every block
 * a call touches must be bound (tab >= 0): the caller checks. */
typedef struct ie_attn_rows {
    const float *base;
    size_t row_stride;   /* floats between consecutive rows of a block   */
    const int32_t *tab;  /* logical block -> physical block, or NULL     */
    int block;           /* rows per block (tab != NULL)                 */
    size_t block_stride; /* floats between physical blocks               */
} ie_attn_rows_t;

/* Walks the rows of a view in position order, one table lookup per block
 * (a division per row would cost more than the row's dot product). The
 * view's fields are copied in, so the walk lives in registers. */
typedef struct ie_attn_cursor {
    const float *row; /* the next row                                 */
    int left;         /* rows left in its block (0: look up the next) */
    int lb;           /* its logical block                            */
    const float *base;
    const int32_t *tab;
    size_t row_stride, block_stride;
    int block;
} ie_attn_cursor_t;

static inline void ie_attn_cursor_init(ie_attn_cursor_t *c, const ie_attn_rows_t *r, int j)
{
    c->base = r->base;
    c->tab = r->tab;
    c->row_stride = r->row_stride;
    c->block_stride = r->block_stride;
    c->block = r->block;
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

/* Rows that follow each other in memory from the cursor on (>= 1), the
 * first at *row. The table is read only when a row of a new block is
 * needed, so a walk never looks past the blocks it uses. */
static inline int ie_attn_cursor_run(ie_attn_cursor_t *c, const float **row)
{
    if (c->left == 0) {
        c->lb++;
        c->row = c->base + (size_t)c->tab[c->lb] * c->block_stride;
        c->left = c->block;
    }
    *row = c->row;
    return c->left;
}

/* Move past m rows of the current run (m <= what ie_attn_cursor_run said). */
static inline void ie_attn_cursor_skip(ie_attn_cursor_t *c, int m)
{
    c->row += (size_t)m * c->row_stride;
    c->left -= m;
}

/* The next row. */
static inline const float *ie_attn_cursor_next(ie_attn_cursor_t *c)
{
    const float *row;
    ie_attn_cursor_run(c, &row);
    ie_attn_cursor_skip(c, 1);
    return row;
}

/* Row j of a view (for loops that cannot walk in order). */
static inline const float *ie_attn_row(const ie_attn_rows_t *r, int j)
{
    if (!r->tab) return r->base + (size_t)j * r->row_stride;
    return r->base + (size_t)r->tab[j / r->block] * r->block_stride + (size_t)(j % r->block) * r->row_stride;
}

/* The online-softmax state of nh query heads over a range of rows (the
 * flash-decoding partial result): per head h, m[h] the largest score,
 * l[h] = sum_j exp(s_j - m[h]) and o[h*os + i] = sum_j exp(s_j - m[h])
 * v_j[i], unnormalized. An empty range: m = -INFINITY, l = 0, o = 0.
 * States of disjoint ranges merge exactly (in real arithmetic) in any
 * order, so a caller splits a row range anywhere and normalizes once. */
typedef struct ie_attn_state {
    float *m, *l, *o;
    size_t os; /* floats between heads' outputs */
} ie_attn_state_t;

/* a <- the state of a's rows and b's (a and b of the same nh heads of hd
 * values): m = max(ma, mb), each side's l and o scaled by exp(m_side - m)
 * and added. An empty side leaves the other unchanged. */
void ie_attn_state_merge(const ie_attn_state_t *a, const ie_attn_state_t *b, int nh, int hd);

/* out[h*out_stride + i] = o / (l + exp(sink[h] - m)) (all in the frame of
 * max(m, sink[h])): the softmax-weighted sum of the rows, the sink logit
 * one more term of the denominator (GPT-OSS; sink NULL: none). Needs l > 0
 * or a sink. out may be the state's o (same stride). */
void ie_attn_state_finish(const ie_attn_state_t *a, int nh, int hd, const float *sink, float *out,
                          size_t out_stride);

#endif

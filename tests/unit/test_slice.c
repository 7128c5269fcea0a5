/* test_slice.c — ie_tensor_slice (ie_pack.h): a sub-matrix cut out of a
 * dense weight tensor dequantizes to exactly (bit for bit) the matching
 * sub-block of the dequantized whole, for every dense dtype in ROWS layout
 * (f32, f16, bf16, q8_0, q4_0, q4_1, mxfp4, and i8w/i4w/i4wa with groups
 * 32, 64 and one per row) and for I-types in PANEL16 layout (same groups);
 * a PANEL16 slice is also byte-identical to packing the sub-matrix directly
 * (padding rows of a partial last panel included). Odd row counts (37: the
 * last panel partial) and cuts off the block/group/panel boundaries, out of
 * range or empty, are rejected with -1 and leave dst untouched. */
#include "ie_kernels.h"
#include "ie_pack.h"
#include "ie_test_rng.h"

#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>

#define N_OUT 37
#define N_IN 192

typedef struct cut {
    int64_t r0, r1, c0, c1;
} cut_t;

static void *xcalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    CU_ASSERT_FATAL(p != NULL);
    memset(p, 0xA5, (n + 63) / 64 * 64);
    return p;
}

/* Dequantize row r of a matrix in (dtype, layout, group) of n_out rows of n_in. */
static void deq_row(ie_dtype_t t, ie_layout_t lay, int g, const void *m, int64_t n_in, int64_t n_out, int64_t r,
                    float *out)
{
    if (lay == IE_LAYOUT_PANEL16) {
        ie_pmat_t pm = {t, g, n_in, n_out, m};
        ie_pack_dequant_row(&pm, r, out);
    } else if (ie_dtype_is_intw(t)) {
        ie_qrow_dequantize(t, g, (const char *)m + (size_t)r * ie_qrow_bytes(t, g, n_in), out, n_in);
    } else {
        ie_dequantize_row(t, (const char *)m + (size_t)r * ie_dtype_row_bytes(t, n_in), out, n_in);
    }
}

/* Build the full matrix from x, cut, compare the dequantized slice to the
 * dequantized whole's sub-block; PANEL16 also against packing directly. */
static void check_cut(ie_dtype_t t, ie_layout_t lay, int g, const float *x, const cut_t *c)
{
    const size_t full_b = ie_tensor_bytes(t, lay, g, N_IN, N_OUT);
    CU_ASSERT_FATAL(full_b > 0);
    void *full = xcalloc(full_b);
    if (lay == IE_LAYOUT_PANEL16) {
        CU_ASSERT_EQUAL_FATAL(ie_pack_quantize(t, g, IE_QSCALE_ABSMAX, x, N_IN, 0, N_OUT, N_OUT, full), 0);
    } else {
        for (int r = 0; r < N_OUT; r++) {
            void *row = (char *)full + (size_t)r * (full_b / N_OUT);
            const int rc = ie_dtype_is_intw(t)
                               ? ie_qrow_quantize(t, g, IE_QSCALE_ABSMAX, x + (size_t)r * N_IN, N_IN, row)
                               : ie_quantize_row(t, x + (size_t)r * N_IN, row, N_IN);
            CU_ASSERT_EQUAL_FATAL(rc, 0);
        }
    }
    const int64_t ni = c->c1 - c->c0, no = c->r1 - c->r0;
    const size_t sb = ie_tensor_bytes(t, lay, g, ni, no);
    CU_ASSERT_FATAL(sb > 0);
    void *sl = xcalloc(sb);
    CU_ASSERT_EQUAL_FATAL(ie_tensor_slice(t, lay, g, full, N_IN, N_OUT, c->r0, c->r1, c->c0, c->c1, sl), 0);
    float whole[N_IN], part[N_IN];
    int bad = 0;
    for (int64_t r = 0; r < no; r++) {
        deq_row(t, lay, g, full, N_IN, N_OUT, c->r0 + r, whole);
        deq_row(t, lay, g, sl, ni, no, r, part);
        bad |= memcmp(whole + c->c0, part, (size_t)ni * sizeof(float)) != 0;
    }
    CU_ASSERT_EQUAL(bad, 0);
    if (bad)
        printf("\n  %s/%s g%d rows [%lld,%lld) cols [%lld,%lld) differ", ie_dtype_name(t), ie_layout_name(lay), g,
               (long long)c->r0, (long long)c->r1, (long long)c->c0, (long long)c->c1);
    if (lay == IE_LAYOUT_PANEL16) {
        /* as if the smaller matrix had been packed directly */
        float *sub = malloc((size_t)no * ni * sizeof(float));
        CU_ASSERT_FATAL(sub != NULL);
        for (int64_t r = 0; r < no; r++)
            memcpy(sub + r * ni, x + (size_t)(c->r0 + r) * N_IN + c->c0, (size_t)ni * sizeof(float));
        void *direct = xcalloc(sb);
        CU_ASSERT_EQUAL_FATAL(ie_pack_quantize(t, g, IE_QSCALE_ABSMAX, sub, ni, 0, no, no, direct), 0);
        CU_ASSERT_EQUAL(memcmp(direct, sl, sb), 0);
        free(direct);
        free(sub);
    }
    free(sl);
    free(full);
}

static float *make_data(uint64_t seed)
{
    float *x = malloc((size_t)N_OUT * N_IN * sizeof(float));
    CU_ASSERT_FATAL(x != NULL);
    rng_seed(seed);
    rng_fill(x, (int64_t)N_OUT * N_IN);
    return x;
}

/* Cuts on `step`-element column boundaries (step divides N_IN) and on
 * panel row boundaries, plus one whole-matrix cut. */
static int make_cuts(int64_t step, int rows_any, cut_t *cuts)
{
    const int64_t rs[][2] = {{0, N_OUT}, {0, 16}, {16, 37}, {32, 37}, {16, 32}, {5, 22}, {36, 37}};
    int n = 0;
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) {
        if (!rows_any && rs[i][0] % 16 != 0) continue;
        cuts[n++] = (cut_t){rs[i][0], rs[i][1], 0, N_IN};
        cuts[n++] = (cut_t){rs[i][0], rs[i][1], step, N_IN};
        cuts[n++] = (cut_t){rs[i][0], rs[i][1], 0, N_IN - step};
        if (N_IN / step >= 3) cuts[n++] = (cut_t){rs[i][0], rs[i][1], step, 2 * step};
    }
    return n;
}

static void test_rows_ggml(void)
{
    static const ie_dtype_t types[] = {IE_DTYPE_F32,  IE_DTYPE_F16,  IE_DTYPE_BF16, IE_DTYPE_Q8_0,
                                       IE_DTYPE_Q4_0, IE_DTYPE_Q4_1, IE_DTYPE_MXFP4};
    float *x = make_data(11);
    cut_t cuts[64];
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const int be = ie_dtype_block_elems(types[i]);
        int n = make_cuts(be == 1 ? 3 : be, 1, cuts); /* f32 & co: any column */
        for (int k = 0; k < n; k++) check_cut(types[i], IE_LAYOUT_ROWS, 0, x, &cuts[k]);
        /* a single odd column of a float type */
        if (be == 1) check_cut(types[i], IE_LAYOUT_ROWS, 0, x, &(cut_t){3, 4, 101, 102});
    }
    free(x);
}

static void test_intw(void)
{
    static const ie_dtype_t types[] = {IE_DTYPE_I8W, IE_DTYPE_I4W, IE_DTYPE_I4WA};
    static const int groups[] = {32, 64, N_IN};
    float *x = make_data(12);
    cut_t cuts[64];
    for (size_t i = 0; i < 3; i++)
        for (size_t gi = 0; gi < 3; gi++) {
            int n = make_cuts(groups[gi] == N_IN ? N_IN : groups[gi], 1, cuts);
            for (int k = 0; k < n; k++) {
                if (cuts[k].c0 >= cuts[k].c1) continue;
                check_cut(types[i], IE_LAYOUT_ROWS, groups[gi], x, &cuts[k]);
                if (cuts[k].r0 % 16 == 0) check_cut(types[i], IE_LAYOUT_PANEL16, groups[gi], x, &cuts[k]);
            }
        }
    free(x);
}

static void test_bad_cuts(void)
{
    float *x = make_data(13);
    const size_t pb = ie_pack_bytes(IE_DTYPE_I8W, 64, N_IN, N_OUT);
    void *pk = xcalloc(pb), *dst = xcalloc(pb);
    CU_ASSERT_EQUAL_FATAL(ie_pack_quantize(IE_DTYPE_I8W, 64, IE_QSCALE_ABSMAX, x, N_IN, 0, N_OUT, N_OUT, pk), 0);
    const size_t rb = ie_dtype_row_bytes(IE_DTYPE_Q8_0, N_IN) * N_OUT;
    void *q8 = xcalloc(rb);
    for (int r = 0; r < N_OUT; r++)
        ie_quantize_row(IE_DTYPE_Q8_0, x + (size_t)r * N_IN, (char *)q8 + (size_t)r * (rb / N_OUT), N_IN);
    void *before = malloc(pb);
    memcpy(before, dst, pb);
    /* PANEL16: row start off a panel, columns off the group, out of range, empty */
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_I8W, IE_LAYOUT_PANEL16, 64, pk, N_IN, N_OUT, 8, 37, 0, 64, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_I8W, IE_LAYOUT_PANEL16, 64, pk, N_IN, N_OUT, 0, 16, 32, 128, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_I8W, IE_LAYOUT_PANEL16, 64, pk, N_IN, N_OUT, 0, 16, 0, 96, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_I8W, IE_LAYOUT_PANEL16, 64, pk, N_IN, N_OUT, 0, 38, 0, 64, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_I8W, IE_LAYOUT_PANEL16, 64, pk, N_IN, N_OUT, 0, 16, 0, 256, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_I8W, IE_LAYOUT_PANEL16, 64, pk, N_IN, N_OUT, 16, 16, 0, 64, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_I8W, IE_LAYOUT_PANEL16, 64, pk, N_IN, N_OUT, 0, 16, 64, 64, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_I8W, IE_LAYOUT_PANEL16, 48, pk, N_IN, N_OUT, 0, 16, 0, 48, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_F32, IE_LAYOUT_PANEL16, 64, pk, N_IN, N_OUT, 0, 16, 0, 64, dst), -1);
    /* ROWS: columns off a block, negative, past the end; odd rows are fine */
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_Q8_0, IE_LAYOUT_ROWS, 0, q8, N_IN, N_OUT, 0, 5, 16, 64, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_Q8_0, IE_LAYOUT_ROWS, 0, q8, N_IN, N_OUT, 0, 5, 0, 48, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_Q8_0, IE_LAYOUT_ROWS, 0, q8, N_IN, N_OUT, -1, 5, 0, 64, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_Q8_0, IE_LAYOUT_ROWS, 0, q8, N_IN, N_OUT, 0, 5, 0, 224, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_I4W, IE_LAYOUT_ROWS, 64, q8, N_IN, N_OUT, 0, 5, 32, 96, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_Q8_P, IE_LAYOUT_ROWS, 0, q8, N_IN, N_OUT, 0, 5, 0, 64, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_F32, IE_LAYOUT_BSR, 0, q8, N_IN, N_OUT, 0, 5, 0, 64, dst), -1);
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_Q8_0, IE_LAYOUT_ROWS, 0, NULL, N_IN, N_OUT, 0, 5, 0, 64, dst), -1);
    CU_ASSERT_EQUAL(memcmp(before, dst, pb), 0); /* dst untouched by every refusal */
    CU_ASSERT_EQUAL(ie_tensor_slice(IE_DTYPE_Q8_0, IE_LAYOUT_ROWS, 0, q8, N_IN, N_OUT, 3, 8, 32, 64, dst), 0);
    free(before);
    free(q8);
    free(dst);
    free(pk);
    free(x);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("slice", NULL, NULL);
    CU_add_test(s, "rows: f32/f16/bf16/q8_0/q4_0/q4_1/mxfp4", test_rows_ggml);
    CU_add_test(s, "i8w/i4w/i4wa rows + panel16, groups 32/64/row", test_intw);
    CU_add_test(s, "bad cuts rejected, dst untouched", test_bad_cuts);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

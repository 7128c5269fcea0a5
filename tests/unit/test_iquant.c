/* test_iquant.c — ggml's grid i-quants in ROWS layout (kernels/ref/iquant_ref.c
 * and every ISA's matmul).
 *
 * What is checked, and against what:
 *   dequantize : ie_dequantize_row equals gguf.quants' dequantization bit for
 *                bit (memcmp of the floats) on the fixtures of tests/data/iquant
 *                (tests/reference/gen_iquant_ref.py: random blocks with finite
 *                f16 d, blocks that use every grid entry in order, all-zero and
 *                all-0xff blocks, d 65504 / -65504 / the smallest subnormal).
 *   decode     : ie_iq_decode's fields stay in their stated ranges (odd scales
 *                1..31, |q| <= 62, IQ1's q = 8g +- 1) on every fixture block.
 *   matmul     : every ISA's kernel against a double-precision dot of the
 *                dequantized weights and the dequantized Q8_K activations:
 *                |y - dot| <= 1e-6 * sum_k |w_k a_k| (the integer sums are
 *                exact; a few f32 roundings of per-block terms remain); odd row
 *                counts and sub-ranges, n_in 256..1792, 1..70 tokens (across the
 *                kernels' row and token blockings), rows outside [r0, r1) and
 *                columns past n_out untouched.
 *   nonfinite  : ie_quant_find_nonfinite finds a NaN / inf d in block k (IQ1_M's
 *                d gathered from its four scale words), -1 for finite rows.
 *   table      : every ISA's table has a matmul for each i-quant, and the
 *                activation type is Q8_K.
 */
#include "ie_kernels.h"
#include "../../kernels/src/ie_kernels_isa.h"
#include "ie_test_rng.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef IE_TEST_DATA
#define IE_TEST_DATA "tests/data"
#endif

static const ie_dtype_t IQ[] = {IE_DTYPE_IQ2_XXS, IE_DTYPE_IQ2_XS, IE_DTYPE_IQ2_S, IE_DTYPE_IQ3_XXS,
                                IE_DTYPE_IQ3_S,   IE_DTYPE_IQ1_S,  IE_DTYPE_IQ1_M};
#define N_IQ (sizeof IQ / sizeof IQ[0])

static void *read_fixture(const char *name, const char *ext, size_t *size)
{
    char path[512];
    snprintf(path, sizeof path, "%s/iquant/%s.%s", IE_TEST_DATA, name, ext);
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("\n  cannot read %s", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(n > 0 ? (size_t)n : 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return p;
}

/* Store f16 bits h as block's d (IQ1_M: the top nibbles of its scale words). */
static void set_d(ie_dtype_t t, uint8_t *blk, uint16_t h)
{
    if (t != IE_DTYPE_IQ1_M) {
        blk[0] = (uint8_t)h;
        blk[1] = (uint8_t)(h >> 8);
        return;
    }
    for (int i = 0; i < 4; i++) {
        uint8_t *w = blk + 48 + 2 * i;
        w[1] = (uint8_t)((w[1] & 0x0f) | (((h >> (4 * i)) & 15) << 4));
    }
}

/* n random blocks with finite f16 d of exponent field below max_exp. */
static void random_blocks(ie_dtype_t t, uint8_t *dst, int64_t n, int max_exp)
{
    const size_t bb = ie_dtype_block_bytes(t);
    for (int64_t b = 0; b < n; b++) {
        uint8_t *p = dst + (size_t)b * bb;
        for (size_t i = 0; i < bb; i++) p[i] = (uint8_t)rng_u32();
        const unsigned e = rng_u32() % (unsigned)max_exp, m = rng_u32() & 0x3ff, s = rng_u32() & 1;
        set_d(t, p, (uint16_t)(s << 15 | e << 10 | m));
    }
}

/* ----------------------------------------------------------- fixtures */

static void test_dequant_fixtures(void)
{
    for (size_t i = 0; i < N_IQ; i++) {
        const ie_dtype_t t = IQ[i];
        size_t nb = 0, nf = 0;
        uint8_t *blocks = read_fixture(ie_dtype_name(t), "blocks", &nb);
        float *want = read_fixture(ie_dtype_name(t), "f32", &nf);
        CU_ASSERT_PTR_NOT_NULL_FATAL(blocks);
        CU_ASSERT_PTR_NOT_NULL_FATAL(want);
        const size_t bb = ie_dtype_block_bytes(t), n_blk = nb / bb;
        CU_ASSERT_EQUAL(nb % bb, 0);
        CU_ASSERT_EQUAL(nf, n_blk * IE_QK_K * sizeof(float));
        float *got = malloc(nf);
        ie_dequantize_row(t, blocks, got, (int64_t)(n_blk * IE_QK_K));
        const int same = memcmp(got, want, nf) == 0;
        if (!same)
            for (size_t k = 0; k < n_blk * IE_QK_K; k++)
                if (memcmp(&got[k], &want[k], sizeof(float)) != 0) {
                    printf("\n  %s element %zu (block %zu): %.9g, gguf.quants %.9g", ie_dtype_name(t), k,
                           k / IE_QK_K, got[k], want[k]);
                    break;
                }
        CU_ASSERT(same);
        /* decoded fields in range */
        int bad = 0;
        for (size_t b = 0; b < n_blk; b++) {
            ie_iq_codes_t c;
            CU_ASSERT_EQUAL(ie_iq_decode(t, blocks + b * bb, &c), 0);
            const int iq1 = t == IE_DTYPE_IQ1_S || t == IE_DTYPE_IQ1_M;
            for (int j = 0; j < 16; j++) bad += c.sc[j] < 1 || c.sc[j] > 31 || c.sc[j] % 2 == 0;
            for (int k = 0; k < IE_QK_K; k++) {
                const int q = c.q[k];
                bad += q < -62 || q > 62;
                if (iq1) bad += !(q == -9 || q == -7 || q == -1 || q == 1 || q == 7 || q == 9);
            }
        }
        CU_ASSERT_EQUAL(bad, 0);
        printf("\n  %s: %zu blocks equal", ie_dtype_name(t), n_blk);
        free(got);
        free(blocks);
        free(want);
    }
    ie_iq_codes_t c;
    uint8_t blk[128] = {0};
    CU_ASSERT_EQUAL(ie_iq_decode(IE_DTYPE_Q4_K, blk, &c), -1);
    CU_ASSERT(!ie_dtype_is_iquant(IE_DTYPE_IQ4_XS));
    CU_ASSERT(!ie_dtype_is_kquant(IE_DTYPE_IQ2_XXS));
}

/* ------------------------------------------------------------- matmul */

static int check_matmul(ie_isa_t isa, ie_dtype_t t, int64_t n_in, int64_t n_out, int64_t r0, int64_t r1,
                        int64_t n_tok, uint64_t seed)
{
    const size_t wb = ie_dtype_row_bytes(t, n_in), as = ie_dtype_row_bytes(IE_DTYPE_Q8_K, n_in) + 36;
    const int64_t ldy = n_out + 3;
    uint8_t *w = malloc(wb * (size_t)n_out), *a = malloc(as * (size_t)n_tok);
    float *x = malloc(sizeof(float) * (size_t)n_in), *wf = malloc(sizeof(float) * (size_t)n_in);
    float *af = malloc(sizeof(float) * (size_t)n_in);
    float *y = malloc(sizeof(float) * (size_t)(ldy * n_tok));
    rng_seed(seed);
    random_blocks(t, w, n_out * (n_in / IE_QK_K), 19); /* |d| < 2^4 */
    for (int64_t tk = 0; tk < n_tok; tk++) {
        rng_fill(x, n_in);
        ie_act_quantize_ref(IE_DTYPE_Q8_K, x, a + (size_t)tk * as, n_in);
    }
    for (int64_t i = 0; i < ldy * n_tok; i++) y[i] = -777.0f;
    CU_ASSERT_EQUAL(ie_kernels_matmul(ie_kernels_get(isa), t, w, n_in, r0, r1, a, as, n_tok, y, ldy), IE_OK);
    int bad = 0;
    for (int64_t r = 0; r < n_out; r++) {
        ie_dequantize_row(t, w + (size_t)r * wb, wf, n_in);
        for (int64_t tk = 0; tk < n_tok; tk++) {
            const float v = y[tk * ldy + r];
            if (r < r0 || r >= r1) {
                bad += v != -777.0f;
                continue;
            }
            ie_dequantize_row(IE_DTYPE_Q8_K, a + (size_t)tk * as, af, n_in);
            double dot = 0.0, mag = 0.0;
            for (int64_t k = 0; k < n_in; k++) {
                dot += (double)wf[k] * (double)af[k];
                mag += fabs((double)wf[k] * (double)af[k]);
            }
            if (!(fabs((double)v - dot) <= 1e-6 * mag + 1e-30)) {
                if (bad < 3)
                    printf("\n  %s %s n_in=%lld r=%lld t=%lld: %.9g vs %.9g (mag %.3g)", ie_isa_name(isa),
                           ie_dtype_name(t), (long long)n_in, (long long)r, (long long)tk, v, dot, mag);
                bad++;
            }
        }
    }
    for (int64_t tk = 0; tk < n_tok; tk++)
        for (int64_t r = n_out; r < ldy; r++) bad += y[tk * ldy + r] != -777.0f;
    free(w);
    free(a);
    free(x);
    free(wf);
    free(af);
    free(y);
    return bad;
}

static void test_matmul(void)
{
    static const int64_t nins[] = {256, 768, 1792};
    static const int64_t nouts[] = {1, 5, 13};
    static const int64_t ntoks[] = {1, 2, 3, 5, 19, 70};
    int cases = 0;
    for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        if (!ie_isa_supported((ie_isa_t)isa)) {
            printf("\n  %s: skipped (this CPU lacks it)", ie_isa_name((ie_isa_t)isa));
            continue;
        }
        for (size_t i = 0; i < N_IQ; i++)
            for (int a = 0; a < 3; a++)
                for (int b = 0; b < 3; b++) {
                    const int64_t n_tok = ntoks[(a + 2 * b + (int)i) % 6], n_out = nouts[b];
                    const int64_t r0 = n_out > 4 ? 2 : 0, r1 = n_out > 4 ? n_out - 1 : n_out;
                    CU_ASSERT_EQUAL(check_matmul((ie_isa_t)isa, IQ[i], nins[a], n_out, r0, r1, n_tok,
                                                 9000 + 97 * i + 13 * (uint64_t)a + (uint64_t)b),
                                    0);
                    cases++;
                }
    }
    printf("\n  %d matmul cases ", cases);
}

/* ---------------------------------------------------------- nonfinite */

static void test_find_nonfinite(void)
{
    for (size_t i = 0; i < N_IQ; i++) {
        const ie_dtype_t t = IQ[i];
        const size_t bb = ie_dtype_block_bytes(t);
        uint8_t row[6 * 110];
        rng_seed(40 + i);
        random_blocks(t, row, 6, 30);
        CU_ASSERT_EQUAL(ie_quant_find_nonfinite(t, row, 6 * IE_QK_K), -1);
        static const uint16_t bad[] = {0x7c00, 0xfc00, 0x7e00, 0xfd01};
        for (int k = 0; k < 6; k++)
            for (int v = 0; v < 4; v++) {
                uint8_t save[110];
                memcpy(save, row + k * bb, bb);
                set_d(t, row + k * bb, bad[v]);
                CU_ASSERT_EQUAL(ie_quant_find_nonfinite(t, row, 6 * IE_QK_K), k);
                memcpy(row + k * bb, save, bb);
            }
    }
}

static void test_tables(void)
{
    for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        const ie_kernels_t *k = ie_kernels_get((ie_isa_t)isa);
        if (!k) continue;
        for (size_t i = 0; i < N_IQ; i++) {
            CU_ASSERT_PTR_NOT_NULL(k->matmul[IQ[i]]);
            CU_ASSERT_EQUAL(ie_matmul_act_dtype(IQ[i]), IE_DTYPE_Q8_K);
            CU_ASSERT_EQUAL(ie_dtype_block_elems(IQ[i]), IE_QK_K);
        }
    }
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("iquant", NULL, NULL);
    CU_add_test(s, "dequantize == gguf.quants (fixtures), decoded ranges", test_dequant_fixtures);
    CU_add_test(s, "every ISA's matmul vs double dot", test_matmul);
    CU_add_test(s, "ie_quant_find_nonfinite", test_find_nonfinite);
    CU_add_test(s, "kernel tables", test_tables);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

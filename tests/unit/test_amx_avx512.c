/* test_amx_avx512.c — the AMX GEMM body's AVX-512 parts (the I4 path's
 * unpack and its register epilogue, IE_AMX_AVX512), which pack_amx.c
 * compiles over the real tiles only: here the same body is built over the
 * tile emulator with them switched on (this file is compiled with the
 * AVX-512 flags), so they are checked against ref on any AVX-512 CPU;
 * and the bf16 route's AVX-512 dequantization against its plain-C twin.
 * Skipped (exit 77, with the reason) without AVX-512. */
#include "ie_kernels.h"
#include "ie_pack.h"
#include "../../kernels/src/ie_kernels_isa.h"
#include "ie_test_rng.h"
#include "ie_test_kq.h"

#include <CUnit/Basic.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IE_AMX_GEMM_NAME emu512_gemm
#define IE_AMX_GEMM_BF16_NAME emu512_gemm_bf16
#define IE_AMX_MXFP4_NAME emu512_mxfp4
#define IE_AMX_AVX512 1
#include "../../kernels/src/amx_emu_ops.h"
static ie_status_t emu512_gemm(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                               int64_t n_tok, float *y, int64_t ldy, int32_t *isums);
static ie_status_t emu512_gemm_bf16(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                    int64_t n_tok, float *y, int64_t ldy);
static void emu512_mxfp4(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                         int64_t n_tok, float *y, int64_t ldy);
#include "../../kernels/x86/amx/amx_gemm_body.h"

/* I4W / I4WA (and I8W, its own path) x groups 32 / 64 x odd shapes, full
 * 16-token tiles (the register epilogue) and tails (the plain one): y
 * against ie_matmul_packed_ref within 1e-5 of the sum of |terms| (the
 * activation and weight quants times their scales, and I4WA's m*s). */
static void test_i4_avx512_vs_ref(void)
{
    static const ie_dtype_t types[] = {IE_DTYPE_I4W, IE_DTYPE_I4WA, IE_DTYPE_I8W};
    static const int64_t nis[] = {32, 64, 1024, 2048, 97 * 32}, nos[] = {16, 100, 160, 300};
    static const int64_t nts[] = {1, 5, 16, 32, 37, 48};
    static const int groups[] = {32, 64};
    int bad = 0, cases = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int gi = 0; gi < 2; gi++)
            for (int ii = 0; ii < 5; ii++)
                for (int oi = 0; oi < 4; oi++)
                    for (int ki = 0; ki < 6; ki++) {
                        const int64_t n_in = nis[ii], n_out = nos[oi], n_tok = nts[ki];
                        const int g = groups[gi];
                        if (n_in % g) continue;
                        const ie_dtype_t at = ie_matmul_act_dtype(types[ti]);
                        const size_t as = ie_dtype_row_bytes(at, n_in);
                        float *wf = malloc(sizeof(float) * n_in * n_out), *x = malloc(sizeof(float) * n_in * n_tok);
                        float *y1 = malloc(sizeof(float) * n_out * n_tok),
                              *y2 = malloc(sizeof(float) * n_out * n_tok);
                        uint8_t *a = malloc(as * n_tok);
                        void *wd = aligned_alloc(64, (ie_pack_bytes(types[ti], g, n_in, n_out) + 63) / 64 * 64);
                        CU_ASSERT_FATAL(wf && x && y1 && y2 && a && wd);
                        rng_seed(1000 + cases);
                        rng_fill(wf, n_in * n_out);
                        rng_fill(x, n_in * n_tok);
                        CU_ASSERT_FATAL(
                            ie_pack_quantize(types[ti], g, IE_QSCALE_ABSMAX, wf, n_in, 0, n_out, n_out, wd) == 0);
                        for (int64_t t = 0; t < n_tok; t++) ie_act_quantize_ref(at, x + t * n_in, a + t * as, n_in);
                        const ie_pmat_t m = {types[ti], g, n_in, n_out, wd};
                        CU_ASSERT_EQUAL(emu512_gemm(&m, 0, n_out, a, as, n_tok, y1, n_out, NULL), IE_OK);
                        CU_ASSERT_EQUAL(ie_matmul_packed_ref(&m, 0, n_out, a, as, n_tok, y2, n_out), IE_OK);
                        CU_ASSERT_EQUAL(ie_amx_emu_faults(), 0);
                        /* ref on |w| and |a|: the sum of |terms| each y[t][r] is rounded against */
                        for (int64_t i = 0; i < n_in * n_out; i++) wf[i] = fabsf(wf[i]);
                        for (int64_t i = 0; i < n_in * n_tok; i++) x[i] = fabsf(x[i]);
                        float *ym = malloc(sizeof(float) * n_out * n_tok);
                        CU_ASSERT_FATAL(ym != NULL);
                        for (int64_t t = 0; t < n_tok; t++)
                            for (int64_t r = 0; r < n_out; r++) {
                                double T = 0.0;
                                for (int64_t i = 0; i < n_in; i++) T += (double)wf[r * n_in + i] * x[t * n_in + i];
                                ym[t * n_out + r] = (float)T;
                            }
                        for (int64_t i = 0; i < n_out * n_tok; i++) {
                            /* quantization moves |terms| by far less than 2x */
                            const double tol = 1e-5 * 2.0 * ym[i] + 1e-6;
                            if (!(fabs((double)y1[i] - (double)y2[i]) <= tol)) {
                                if (bad < 5)
                                    fprintf(stderr, "\n  %s g%d %lldx%lldx%lld [%lld]: %.9g ref %.9g tol %.3g",
                                            ie_dtype_name(types[ti]), g, (long long)n_out, (long long)n_in,
                                            (long long)n_tok, (long long)i, y1[i], y2[i], tol);
                                bad++;
                            }
                        }
                        cases++;
                        free(wf), free(x), free(y1), free(y2), free(a), free(wd), free(ym);
                    }
    printf("\n  %d shapes ", cases);
    CU_ASSERT_EQUAL(bad, 0);
}

/* 1 if the bf16 GEMM built here (the AVX-512 dequantization) gives y bit
 * for bit equal to the emulator build's (plain C) on m and n_tok random
 * BF16 activation rows, with no emulator fault. */
static int same_as_plain(const ie_pmat_t *m, int64_t n_tok)
{
    const int64_t n_in = m->n_in, n_out = m->n_out;
    const size_t as = ie_dtype_row_bytes(IE_DTYPE_BF16, n_in);
    float *x = malloc(sizeof(float) * n_in * n_tok), *y1 = malloc(sizeof(float) * n_out * n_tok),
          *y2 = malloc(sizeof(float) * n_out * n_tok);
    uint8_t *a = malloc(as * n_tok);
    CU_ASSERT_FATAL(x && y1 && y2 && a);
    rng_fill(x, n_in * n_tok);
    for (int64_t t = 0; t < n_tok; t++) ie_act_quantize_ref(IE_DTYPE_BF16, x + t * n_in, a + t * as, n_in);
    CU_ASSERT_EQUAL(emu512_gemm_bf16(m, 0, n_out, a, as, n_tok, y1, n_out), IE_OK);
    CU_ASSERT_EQUAL(ie_amx_gemm_bf16_emu(m, 0, n_out, a, as, n_tok, y2, n_out), IE_OK);
    const int same = ie_amx_emu_faults() == 0 && memcmp(y1, y2, sizeof(float) * n_out * n_tok) == 0;
    free(x), free(y1), free(y2), free(a);
    return same;
}

/* The bf16 route's AVX-512 dequantization (amx_unpack_bf16 with
 * IE_AMX_AVX512) against the plain-C one of the emulator build
 * (ie_amx_gemm_bf16_emu, itself checked value by value in test_amx): the
 * same tiles over the same emulator, so y must be equal bit for bit. I8W /
 * I4W / I4WA, groups 32 / 64, several row blocks and tails. */
static void test_int_bf16_unpack_vs_plain(void)
{
    static const ie_dtype_t types[] = {IE_DTYPE_I4W, IE_DTYPE_I4WA, IE_DTYPE_I8W};
    static const int64_t nis[] = {64, 2048, 97 * 64}, nos[] = {16, 300}, nts[] = {1, 17};
    int bad = 0, cases = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int g = 32; g <= 64; g += 32)
            for (int ii = 0; ii < 3; ii++)
                for (int oi = 0; oi < 2; oi++)
                    for (int ki = 0; ki < 2; ki++) {
                        const int64_t n_in = nis[ii], n_out = nos[oi];
                        float *wf = malloc(sizeof(float) * n_in * n_out);
                        void *wd = aligned_alloc(64, (ie_pack_bytes(types[ti], g, n_in, n_out) + 63) / 64 * 64);
                        CU_ASSERT_FATAL(wf && wd);
                        rng_seed(7000 + cases);
                        rng_fill(wf, n_in * n_out);
                        for (int64_t r = 0; r < n_out; r++) wf[r * n_in + r % n_in] *= 1000.0f; /* odd scales */
                        CU_ASSERT_FATAL(
                            ie_pack_quantize(types[ti], g, IE_QSCALE_ABSMAX, wf, n_in, 0, n_out, n_out, wd) == 0);
                        const ie_pmat_t m = {types[ti], g, n_in, n_out, wd};
                        if (!same_as_plain(&m, nts[ki])) {
                            if (bad < 5)
                                fprintf(stderr, "\n  %s g%d %lldx%lldx%lld: AVX-512 unpack != plain",
                                        ie_dtype_name(types[ti]), g, (long long)n_out, (long long)n_in,
                                        (long long)nts[ki]);
                            bad++;
                        }
                        cases++;
                        free(wf), free(wd);
                    }
    printf("\n  %d shapes ", cases);
    CU_ASSERT_EQUAL(bad, 0);
}

/* The same for the k-quants' AVX-512 dequantization (their planes of
 * nibbles, crumbs and bits, sub-block factors, offsets, IQ4's table):
 * random blocks over every field's range, several blocks and panels, a
 * tail panel; y equal to the plain build's bit for bit. */
static void test_kq_bf16_unpack_vs_plain(void)
{
    int bad = 0, cases = 0;
    for (int ti = 0; ti < IE_TEST_N_KTYPES; ti++)
        for (int ii = 0; ii < 2; ii++)
            for (int oi = 0; oi < 2; oi++) {
                const ie_dtype_t t = IE_TEST_KTYPES[ti];
                const int qk = ie_dtype_block_elems(t);
                const int64_t n_in = ii ? 3 * qk : (qk == 32 ? 96 : 256), n_out = oi ? 37 : 16;
                rng_seed(8000 + cases);
                void *wd = ie_test_kq_random(t, n_in, n_out);
                CU_ASSERT_FATAL(wd != NULL);
                const ie_pmat_t m = {t, qk, n_in, n_out, wd};
                if (!same_as_plain(&m, 17)) {
                    if (bad < 5)
                        fprintf(stderr, "\n  %s %lldx%lld: AVX-512 dequant != plain", ie_dtype_name(t),
                                (long long)n_out, (long long)n_in);
                    bad++;
                }
                cases++;
                free(wd);
            }
    printf("\n  %d shapes ", cases);
    CU_ASSERT_EQUAL(bad, 0);
}

/* MXFP4 rows on the bf16 tiles: the AVX-512 dequantization (table lookup,
 * power-of-two scale, vcvtne2ps2bf16, the 16 x 16 transpose into pairs)
 * against the plain build's (ie_dequantize_row, rounded, subnormals
 * zero): y equal bit for bit over random codes, block exponents over
 * their whole range (0: subnormal products; up to 252: all finite), odd
 * starts and row tails, several k-chunks. */
static void test_mxfp4_bf16_vs_plain(void)
{
    static const int64_t nis[] = {32, 2080, 2880}, nos[] = {5, 16, 37};
    static const int64_t nts[] = {1, 17};
    int bad = 0, cases = 0;
    for (int ii = 0; ii < 3; ii++)
        for (int oi = 0; oi < 3; oi++)
            for (int ki = 0; ki < 2; ki++) {
                const int64_t n_in = nis[ii], n_out = nos[oi], n_tok = nts[ki], r0 = oi == 2 ? 3 : 0;
                const size_t as = ie_dtype_row_bytes(IE_DTYPE_BF16, n_in);
                rng_seed(9500 + cases);
                uint8_t *w = ie_test_mxfp4_random(n_in, n_out, 0, 252);
                float *x = malloc(sizeof(float) * n_in * n_tok), *y1 = malloc(sizeof(float) * n_out * n_tok),
                      *y2 = malloc(sizeof(float) * n_out * n_tok);
                uint8_t *a = malloc(as * n_tok);
                CU_ASSERT_FATAL(w && x && y1 && y2 && a);
                /* activations of ~2^-120: products of the large weights stay finite */
                for (int64_t i = 0; i < n_in * n_tok; i++) x[i] = ldexpf(rng_f(), -120);
                for (int64_t t = 0; t < n_tok; t++)
                    ie_act_quantize_ref(IE_DTYPE_BF16, x + t * n_in, a + t * as, n_in);
                memset(y1, 0, sizeof(float) * n_out * n_tok);
                memset(y2, 0, sizeof(float) * n_out * n_tok);
                emu512_mxfp4(w, n_in, r0, n_out, a, as, n_tok, y1, n_out);
                ie_amx_mxfp4_emu(w, n_in, r0, n_out, a, as, n_tok, y2, n_out);
                if (ie_amx_emu_faults() != 0 || memcmp(y1, y2, sizeof(float) * n_out * n_tok) != 0) {
                    if (bad < 5)
                        fprintf(stderr, "\n  mxfp4 %lldx%lld, %lld tokens: AVX-512 dequant != plain",
                                (long long)n_out, (long long)n_in, (long long)n_tok);
                    bad++;
                }
                cases++;
                free(w), free(x), free(y1), free(y2), free(a);
            }
    printf("\n  %d shapes ", cases);
    CU_ASSERT_EQUAL(bad, 0);
}

int main(void)
{
    if (!ie_isa_supported(IE_ISA_AVX512)) {
        printf("SKIPPED: needs AVX-512: %s\n", ie_isa_unsupported_reason(IE_ISA_AVX512));
        return 77;
    }
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("amx body, AVX-512 parts over the emulator", NULL, NULL);
    CU_add_test(s, "I4/I8 gemm (AVX-512 unpack + epilogue) vs ref", test_i4_avx512_vs_ref);
    if (ie_cpu_features() & IE_CPU_AVX512_BF16) {
        CU_add_test(s, "int types on bf16 tiles: AVX-512 dequant == plain C", test_int_bf16_unpack_vs_plain);
        CU_add_test(s, "k-quants on bf16 tiles: AVX-512 dequant == plain C", test_kq_bf16_unpack_vs_plain);
        CU_add_test(s, "mxfp4 rows on bf16 tiles: AVX-512 dequant == plain C", test_mxfp4_bf16_vs_plain);
    } else printf("AVX512_BF16 absent (vcvtne2ps2bf16): the bf16 route's dequantization is not checked here\n");
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

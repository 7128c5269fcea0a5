/* pack_amx.c — the AMX table's packed matmul: AMX-BF16 tiles (tdpbf16ps)
 * for BF16 PANEL16 weights where the CPU has them (CPUID.(7,0):EDX bit 22)
 * in steps of at least ie_amx_min_tok() tokens, the AVX-512 kernels for
 * everything else (decode, the int types, the k-quants, f16). The int
 * types (I8W = repacked Q8_0, I4W = Q4_0, I4WA = Q4_1) have two tile
 * routes, taken only when IE_AMX_INT asks (ie_amx_int_tiles): AMX-INT8
 * GEMMs on their codes (=1; measured slower than AVX-512 VNNI,
 * amx_gemm_body.h), and the BF16 GEMM over their values dequantized to
 * bf16 (=bf16; BF16 activation rows, ie_kernels_act_dtype), which takes
 * the k-quants too, and MXFP4 (GPT-OSS's experts, ROWS: the table's MXFP4
 * slot). The GEMMs themselves are
 * amx_gemm_body.h, compiled here over the real instructions and in
 * kernels/src/amx_emu.c over the scalar emulator the tests run anywhere.
 * Under IE_AMX_EMULATE=1 (ie_amx_emulated) the table's tile calls run the
 * emulated GEMMs and the _hw entry points refuse.
 *
 * Reached only through the AMX table, which ie_kernels_get hands out after
 * dispatch.c has seen AMX-TILE/AMX-INT8 in CPUID, the tile state in XCR0
 * and the kernel's permission for it (ARCH_REQ_XCOMP_PERM); ie_amx_gemm_hw
 * checks the same before its first tile instruction, so a direct call on
 * another CPU returns IE_ERR_UNSUPPORTED instead of dying on SIGILL.
 */
#include "ie_kernels.h"
#include "../../src/ie_kernels_isa.h"

#include <immintrin.h>

#include "amx_inl.h"

#define IE_AMX_GEMM_NAME amx_gemm_tiles
#define IE_AMX_CFG(cfg) AMX_LDTILECFG(cfg)
#define IE_AMX_ZERO(t) _tile_zero(t)
#define IE_AMX_LOAD(t, p, s) AMX_TILELOADD(t, p, s)
#define IE_AMX_STORE(t, p, s) _tile_stored(t, p, (long)(s))
#define IE_AMX_DPBSUD(c, a, b) _tile_dpbsud(c, a, b)
#define IE_AMX_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#define IE_AMX_AVX512 1
#define IE_AMX_DPBUUD(c, a, b) _tile_dpbuud(c, a, b)
#define IE_AMX_GEMM_BF16_NAME amx_gemm_bf16_tiles
#define IE_AMX_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
static ie_status_t amx_gemm_tiles(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                  int64_t n_tok, float *y, int64_t ldy, int32_t *isums);
static ie_status_t amx_gemm_bf16_tiles(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                       int64_t n_tok, float *y, int64_t ldy);
#define IE_AMX_MXFP4_NAME amx_mxfp4_tiles
static void amx_mxfp4_tiles(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                            int64_t n_tok, float *y, int64_t ldy);
#include "amx_gemm_body.h"

/* Contract (ie_kernels_isa.h). */
ie_status_t ie_amx_gemm_hw(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                           int64_t n_tok, float *y, int64_t ldy, int32_t *isums)
{
    if (!ie_isa_supported(IE_ISA_AMX) || ie_amx_emulated()) return IE_ERR_UNSUPPORTED;
    return amx_gemm_tiles(m, r0, r1, a, a_stride, n_tok, y, ldy, isums);
}

/* Contract (ie_kernels_isa.h). */
ie_status_t ie_amx_gemm_bf16_hw(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                int64_t n_tok, float *y, int64_t ldy)
{
    if (!ie_isa_supported(IE_ISA_AMX) || ie_amx_emulated() || !(ie_cpu_features() & IE_CPU_AMX_BF16))
        return IE_ERR_UNSUPPORTED;
    return amx_gemm_bf16_tiles(m, r0, r1, a, a_stride, n_tok, y, ldy);
}

/* Contract (ie_kernels_isa.h). */
ie_status_t ie_amx_mxfp4_hw(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                            int64_t n_tok, float *y, int64_t ldy)
{
    if (!ie_isa_supported(IE_ISA_AMX) || ie_amx_emulated() || !(ie_cpu_features() & IE_CPU_AMX_BF16))
        return IE_ERR_UNSUPPORTED;
    amx_mxfp4_tiles(w, n_in, r0, r1, a, a_stride, n_tok, y, ldy);
    return IE_OK;
}

/* Contract of ie_matmul_fn, the table's MXFP4 slot: the tiles where
 * ie_amx_route gives the bf16 route (BF16 activation rows: ie_act_dtype_amx
 * asks the same rule), else the AVX-512 kernel (Q8_0 rows). */
void ie_matmul_mxfp4_amx(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                         int64_t n_tok, float *y, int64_t ldy)
{
    if (ie_amx_route(IE_DTYPE_MXFP4, n_tok) != IE_AMX_ROUTE_BF16)
        ie_matmul_mxfp4_q8_0_avx512(w, n_in, r0, r1, a, a_stride, n_tok, y, ldy);
    else if (ie_amx_emulated()) ie_amx_mxfp4_emu(w, n_in, r0, r1, a, a_stride, n_tok, y, ldy);
    else amx_mxfp4_tiles(w, n_in, r0, r1, a, a_stride, n_tok, y, ldy);
}

/* Contract of ie_kernels_t.matmul_packed: the route ie_amx_route gives
 * (the one ie_act_dtype_amx, the table's act_dtype, shares, so the
 * activation rows are in the format the route reads). */
ie_status_t ie_matmul_packed_amx(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                                 int64_t n_tok, float *y, int64_t ldy)
{
    const int route = m ? ie_amx_route(m->dtype, n_tok) : IE_AMX_ROUTE_AVX512;
    if (route == IE_AMX_ROUTE_AVX512) return ie_matmul_packed_avx512(m, r0, r1, a, a_stride, n_tok, y, ldy);
    const int bf16 = route == IE_AMX_ROUTE_BF16;
    if (ie_amx_emulated())
        return bf16 ? ie_amx_gemm_bf16_emu(m, r0, r1, a, a_stride, n_tok, y, ldy)
                    : ie_amx_gemm_emu(m, r0, r1, a, a_stride, n_tok, y, ldy, NULL);
    return bf16 ? amx_gemm_bf16_tiles(m, r0, r1, a, a_stride, n_tok, y, ldy)
                : amx_gemm_tiles(m, r0, r1, a, a_stride, n_tok, y, ldy, NULL);
}

/* Contract of ie_kernels_t.act_dtype: BF16 rows where matmul_packed, or
 * the MXFP4 slot (ROWS), takes the bf16 route with weights that are not
 * BF16 already. */
ie_dtype_t ie_act_dtype_amx(ie_dtype_t wtype, int packed, int64_t n_tok)
{
    if ((packed ? wtype != IE_DTYPE_BF16 : wtype == IE_DTYPE_MXFP4) &&
        ie_amx_route(wtype, n_tok) == IE_AMX_ROUTE_BF16)
        return IE_DTYPE_BF16;
    return packed ? ie_matmul_packed_act_dtype(wtype) : ie_matmul_act_dtype(wtype);
}

/* Contract of ie_kernels_t.matmul_packed_ranges: one tile GEMM per range
 * (each packs its tokens again: a cost of ~1/(16 x panels per range) of
 * the range's work), else the AVX-512 version. */
ie_status_t ie_matmul_packed_ranges_amx(const ie_pmat_t *m, ie_panel_next_fn next, void *ctx, const void *a,
                                        size_t a_stride, int64_t n_tok, float *y, int64_t ldy)
{
    if (!m || ie_amx_route(m->dtype, n_tok) == IE_AMX_ROUTE_AVX512)
        return ie_matmul_packed_ranges_avx512(m, next, ctx, a, a_stride, n_tok, y, ldy);
    return ie_packed_ranges_by_calls(ie_matmul_packed_amx, m, next, ctx, a, a_stride, n_tok, y, ldy);
}

/* Contract (ie_kernels_isa.h). Four independent accumulators (tmm0..3)
 * over two A (tmm4, 5) and two B (tmm6, 7) tiles: throughput, not latency.
 * Replaces this thread's tile configuration, so the GEMM's mark is reset
 * and its next call configures again. */
ie_status_t ie_amx_peak_run(int k_bytes, int64_t iters)
{
    if (k_bytes != 32 && k_bytes != 64) return IE_ERR_INVAL;
    if (!ie_isa_supported(IE_ISA_AMX) || ie_amx_emulated()) return IE_ERR_UNSUPPORTED;
    _Alignas(64) uint8_t cfg[64], buf[16 * 64];
    memset(cfg, 0, sizeof cfg);
    memset(buf, 1, sizeof buf);
    cfg[0] = 1;
    for (int t = 0; t < 8; t++) {
        const uint16_t cb = t >= 4 && t < 6 ? (uint16_t)k_bytes : 64;
        memcpy(cfg + 16 + 2 * t, &cb, 2);
        cfg[48 + t] = (uint8_t)(t >= 6 ? k_bytes / 4 : 16);
    }
    AMX_LDTILECFG(cfg);
    amx_cfg_rows = 0;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    AMX_TILELOADD(4, buf, 64);
    AMX_TILELOADD(5, buf, 64);
    AMX_TILELOADD(6, buf, 64);
    AMX_TILELOADD(7, buf, 64);
    for (int64_t i = 0; i < iters; i++) {
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, buf, 64);
    return IE_OK;
}

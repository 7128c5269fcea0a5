/* amx_emu_ops.h — the tile macros amx_gemm_body.h is written over, mapped
 * to the scalar emulator (amx_emu.c; declared in ie_kernels_isa.h). Its
 * includers: amx_emu.c (the emulated GEMMs) and test_amx_avx512.c (the
 * body's AVX-512 parts over the emulator); each names its GEMMs
 * (IE_AMX_GEMM_NAME, IE_AMX_GEMM_BF16_NAME) before including the body. */
#ifndef IE_AMX_EMU_OPS_H
#define IE_AMX_EMU_OPS_H

#define IE_AMX_CFG(cfg) ie_amx_emu_ldtilecfg(cfg)
#define IE_AMX_ZERO(t) ie_amx_emu_tilezero(t)
#define IE_AMX_LOAD(t, p, s) ie_amx_emu_tileloadd(t, p, s)
#define IE_AMX_STORE(t, p, s) ie_amx_emu_tilestored(t, p, s)
#define IE_AMX_DPBSUD(c, a, b) ie_amx_emu_tdp(c, a, b, 1, 0)
#define IE_AMX_DPBSSD(c, a, b) ie_amx_emu_tdp(c, a, b, 1, 1)
#define IE_AMX_DPBUUD(c, a, b) ie_amx_emu_tdp(c, a, b, 0, 0)
#define IE_AMX_DPBF16PS(c, a, b) ie_amx_emu_tdpbf16ps(c, a, b)

#endif

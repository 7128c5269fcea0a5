/* amx_emu.c — a scalar emulator of the AMX tile instructions the int8 GEMM
 * uses, and that GEMM (amx_gemm_body.h) compiled over it: the AMX kernel's
 * own code, run and tested on any CPU (this project's build machines have
 * no AMX; Intel SDE is not available to them).
 *
 * State per thread, as the hardware's: 8 tiles of 16 rows x 64 bytes and
 * the palette-1 configuration (rows and bytes per row of each tile).
 * Semantics follow Intel's SDM pseudo-code: a load fills the configured
 * rows x colsb and zeroes the rest of the tile; tdpb*d adds, for each
 * configured C[m][n] (int32, wrapping), the 4 byte products
 * A[m][4k+i] * B[k][4n+i] over k < colsb(A)/4, with the signedness of the
 * instruction, and zeroes what lies beyond C's configuration; tdpbf16ps
 * adds the bf16 pair products in f32 in the SDM's order, one rounding
 * (to nearest even) per product, subnormal inputs and results flushed to
 * zero. What the
 * hardware refuses (#UD: a tile op without a configuration, an
 * unconfigured tile, shapes that do not chain, one tile named twice;
 * #GP: a bad configuration) is counted as a fault and the operation is
 * skipped: tests read ie_amx_emu_faults() and require 0.
 */
#include "ie_kernels.h"
#include "ie_kernels_isa.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    int palette; /* 0: released (no tile op allowed) */
    uint8_t rows[8];
    uint16_t colsb[8];
    uint8_t t[8][16][64];
} emu_state_t;

static _Thread_local emu_state_t g_emu;
static _Thread_local int g_faults;
static _Thread_local char g_fault_msg[96];

static void fault(const char *what, int t)
{
    g_faults++;
    snprintf(g_fault_msg, sizeof g_fault_msg, "%s (tmm%d)", what, t);
}

/* 1 if tile t may be used: configured palette, a configured shape. */
static int usable(int t)
{
    if (g_emu.palette != 1) {
        fault("#UD: tile op without ldtilecfg", t);
        return 0;
    }
    if (t < 0 || t > 7 || g_emu.rows[t] == 0 || g_emu.colsb[t] == 0) {
        fault("#UD: unconfigured tile", t);
        return 0;
    }
    return 1;
}

/* Zero what lies outside tile t's rows x colsb. */
static void zero_upper(int t)
{
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 64; c++)
            if (r >= g_emu.rows[t] || c >= g_emu.colsb[t]) g_emu.t[t][r][c] = 0;
}

void ie_amx_emu_ldtilecfg(const void *cfg)
{
    const uint8_t *c = cfg;
    if (c[0] == 0) { /* palette 0: back to the init state */
        memset(&g_emu, 0, sizeof g_emu);
        return;
    }
    int bad = c[0] != 1 || c[1] != 0;
    for (int i = 2; i < 16; i++) bad |= c[i] != 0;
    for (int t = 0; t < 16; t++) {
        uint16_t cb;
        memcpy(&cb, c + 16 + 2 * t, 2);
        const uint8_t r = c[48 + t];
        if (t >= 8) bad |= cb != 0 || r != 0;
        else bad |= cb > 64 || r > 16 || ((cb == 0) != (r == 0));
    }
    if (bad) {
        fault("#GP: invalid tile configuration", -1);
        return;
    }
    memset(&g_emu, 0, sizeof g_emu);
    g_emu.palette = 1;
    for (int t = 0; t < 8; t++) {
        memcpy(&g_emu.colsb[t], c + 16 + 2 * t, 2);
        g_emu.rows[t] = c[48 + t];
    }
}

void ie_amx_emu_tilerelease(void) { memset(&g_emu, 0, sizeof g_emu); }

void ie_amx_emu_tilezero(int t)
{
    if (usable(t)) memset(g_emu.t[t], 0, sizeof g_emu.t[t]);
}

void ie_amx_emu_tileloadd(int t, const void *base, size_t stride)
{
    if (!usable(t)) return;
    memset(g_emu.t[t], 0, sizeof g_emu.t[t]);
    for (int r = 0; r < g_emu.rows[t]; r++)
        memcpy(g_emu.t[t][r], (const uint8_t *)base + r * stride, g_emu.colsb[t]);
}

void ie_amx_emu_tilestored(int t, void *base, size_t stride)
{
    if (!usable(t)) return;
    for (int r = 0; r < g_emu.rows[t]; r++) memcpy((uint8_t *)base + r * stride, g_emu.t[t][r], g_emu.colsb[t]);
}

/* Whether a tdp* on tiles c += a . b may run (else the fault is counted):
 * three distinct usable tiles whose shapes chain (c: M x 4N bytes, a: M x
 * 4K, b: K x 4N). */
static int tdp_ok(int c, int a, int b)
{
    if (!usable(c) || !usable(a) || !usable(b)) return 0;
    if (c == a || c == b || a == b) {
        fault("#UD: tdp names one tile twice", c);
        return 0;
    }
    if (g_emu.rows[c] != g_emu.rows[a] || g_emu.colsb[c] != g_emu.colsb[b] || g_emu.colsb[a] % 4 != 0 ||
        g_emu.colsb[a] / 4 != g_emu.rows[b] || g_emu.colsb[c] % 4 != 0) {
        fault("#UD: tdp shapes do not chain", c);
        return 0;
    }
    return 1;
}

void ie_amx_emu_tdp(int c, int a, int b, int sa, int sb)
{
    if (!tdp_ok(c, a, b)) return;
    const int M = g_emu.rows[c], N = g_emu.colsb[c] / 4, K = g_emu.colsb[a] / 4;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            uint32_t acc;
            memcpy(&acc, &g_emu.t[c][m][4 * n], 4);
            for (int k = 0; k < K; k++)
                for (int i = 0; i < 4; i++) {
                    const uint8_t x = g_emu.t[a][m][4 * k + i], w = g_emu.t[b][k][4 * n + i];
                    const int32_t xv = sa ? (int8_t)x : x, wv = sb ? (int8_t)w : w;
                    acc += (uint32_t)(xv * wv); /* wraps, as the hardware's */
                }
            memcpy(&g_emu.t[c][m][4 * n], &acc, 4);
        }
    zero_upper(c);
}

/* A subnormal f32 as zero of its sign (the instruction's DAZ and FTZ). */
static float flush(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }

static float bf16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return flush(ie_bf16_to_f32(h));
}

void ie_amx_emu_tdpbf16ps(int c, int a, int b)
{
    if (!tdp_ok(c, a, b)) return;
    const int M = g_emu.rows[c], N = g_emu.colsb[c] / 4, K = g_emu.colsb[a] / 4;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc;
            memcpy(&acc, &g_emu.t[c][m][4 * n], 4);
            acc = flush(acc);
            /* the SDM's order: k ascending, the even pair element first,
             * each step one f32 rounding (the bf16 product itself is exact) */
            for (int k = 0; k < K; k++) {
                acc = flush(acc + bf16_at(&g_emu.t[a][m][4 * k]) * bf16_at(&g_emu.t[b][k][4 * n]));
                acc = flush(acc + bf16_at(&g_emu.t[a][m][4 * k + 2]) * bf16_at(&g_emu.t[b][k][4 * n + 2]));
            }
            memcpy(&g_emu.t[c][m][4 * n], &acc, 4);
        }
    zero_upper(c);
}

int ie_amx_emu_faults(void)
{
    const int n = g_faults;
    g_faults = 0;
    return n;
}

const char *ie_amx_emu_last_fault(void) { return g_fault_msg; }

/* ---- the GEMM over the emulator */
#define IE_AMX_GEMM_NAME ie_amx_gemm_emu
#define IE_AMX_GEMM_BF16_NAME ie_amx_gemm_bf16_emu
#define IE_AMX_MXFP4_NAME ie_amx_mxfp4_emu
#include "amx_emu_ops.h"
#include "../x86/amx/amx_gemm_body.h"

/* Contract (ie_kernels_isa.h). */
void ie_amx_emu_forget_config(void) { amx_cfg_rows = 0; }

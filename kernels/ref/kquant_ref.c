/* kquant_ref.c — the ggml k-quant family (Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K,
 * IQ4_XS): the one decoder of their bit layouts (ie_kq_decode / encode /
 * value), the Q8_K activation quantizer, the ROWS reference matmuls, and
 * the scale check ie_quant_find_nonfinite for every block type.
 *
 * Where each code lives in a ggml block (element k of the block, sub-block
 * j; verified against gguf.quants' dequantize_blocks by test_kquant's
 * fixtures):
 *   Q5_0/Q5_1 : low 4 bits: k < 16 qs[k] & 15, else qs[k-16] >> 4; bit 4:
 *               bit k of qh read as a little-endian uint32.
 *   IQ4_NL    : as the low 4 bits of Q5_0; the value is kv[u].
 *   MXFP4     : { e, qs[16] }, codes as IQ4_NL's; d is 2^(e-128) as f16
 *               where that is exact (ie_pack.h), the value kv_mxfp4[u]*d.
 *   Q2_K      : u = (qs[32h + l] >> 2s) & 3 with h = k/128, s = (k%128)/32,
 *               l = k%32; scales[j] = sc | mn << 4 (j = k/16).
 *   Q3_K      : low 2 bits as Q2_K; bit 2 = (hmask[k%32] >> (k/32)) & 1
 *               (ggml subtracts 4 when that bit is 0, i.e. u-4 with the bit
 *               as u's bit 2); 6-bit scale j: low 4 bits from scales[j%8]
 *               (nibble j/8), high 2 from scales[8 + j%4] bits 2(j/4).
 *   Q4_K/Q5_K : low 4 bits (qs[32c + l] >> 4n) & 15 with c = k/64,
 *               n = (k%64)/32, l = k%32; Q5_K's bit 4 is
 *               (qh[k%32] >> (k/32)) & 1. Scales (j = k/32), 12 bytes:
 *               j < 4: sc = s[j] & 63, mn = s[j+4] & 63; j >= 4:
 *               sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4,
 *               mn = (s[j+4] >> 4) | (s[j] >> 6) << 4.
 *   Q6_K      : low 4 bits (ql[64h + l] >> 4n) & 15 with h = k/128,
 *               n = (k%128)/64, l = k%64; bits 4-5 (qh[32h + l'] >> 2s) & 3
 *               with s = (k%128)/32, l' = k%32; scales int8, j = k/16.
 *   IQ4_XS    : u = (qs[16j + i%16] >> 4(i/16)) & 15 with j = k/32,
 *               i = k%32; 6-bit scale j: low 4 bits nibble j%2 of
 *               scales_l[j/2], high 2 bits (scales_h >> 2j) & 3.
 * Every block bit is one of these fields, so decode then encode gives the
 * block back byte for byte.
 */
#include "ie_kernels.h"
#include "../src/ie_kernels_isa.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* ----------------------------------------------------------- small helpers */

static ie_f16_t ld16(const uint8_t *p) { return (ie_f16_t)(p[0] | (p[1] << 8)); }
static void st16(uint8_t *p, ie_f16_t v)
{
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

/* The MXFP4 exponents whose scale 2^(e-128) an f16 holds exactly: 2^-24
 * (the least f16 subnormal) .. 2^15. */
#define MXFP4_E_MIN 104
#define MXFP4_E_MAX 143

/* 1 when the binary16 bits h are inf or NaN (exponent all ones). */
static int f16_nonfinite(ie_f16_t h) { return (h & 0x7c00) == 0x7c00; }

/* ------------------------------------------------------------------ info */

int ie_kq_info(ie_dtype_t t, ie_kq_info_t *info)
{
    ie_kq_info_t i = {0, 0, 0, 0, 0};
    switch (t) {
    case IE_DTYPE_Q5_0: i = (ie_kq_info_t){IE_QK, 0, 5, 0, 0}; break;
    case IE_DTYPE_Q5_1: i = (ie_kq_info_t){IE_QK, 0, 5, 1, 0}; break;
    case IE_DTYPE_IQ4_NL:
    case IE_DTYPE_MXFP4: i = (ie_kq_info_t){IE_QK, 0, 4, 0, 0}; break;
    case IE_DTYPE_Q2_K: i = (ie_kq_info_t){IE_QK_K, 16, 2, 1, 1}; break;
    case IE_DTYPE_Q3_K: i = (ie_kq_info_t){IE_QK_K, 16, 3, 0, 0}; break;
    case IE_DTYPE_Q4_K: i = (ie_kq_info_t){IE_QK_K, 8, 4, 1, 1}; break;
    case IE_DTYPE_Q5_K: i = (ie_kq_info_t){IE_QK_K, 8, 5, 1, 1}; break;
    case IE_DTYPE_Q6_K: i = (ie_kq_info_t){IE_QK_K, 16, 6, 0, 0}; break;
    case IE_DTYPE_IQ4_XS: i = (ie_kq_info_t){IE_QK_K, 8, 4, 0, 0}; break;
    default: return -1;
    }
    if (info) *info = i;
    return 0;
}

/* ------------------------------------------------- 12-byte 6-bit scales */

/* Q4_K / Q5_K: 8 scale and 8 min codes of 6 bits in 12 bytes. */
static void k4_scales_decode(const uint8_t *s, int8_t *sc, int8_t *mn)
{
    for (int j = 0; j < 4; j++) {
        sc[j] = (int8_t)(s[j] & 63);
        mn[j] = (int8_t)(s[j + 4] & 63);
    }
    for (int j = 4; j < 8; j++) {
        sc[j] = (int8_t)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        mn[j] = (int8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

static void k4_scales_encode(const int8_t *sc, const int8_t *mn, uint8_t *s)
{
    for (int j = 0; j < 4; j++) {
        const unsigned a = (unsigned)sc[j] & 63, b = (unsigned)mn[j] & 63;
        const unsigned ah = (unsigned)sc[j + 4] & 63, bh = (unsigned)mn[j + 4] & 63;
        s[j] = (uint8_t)(a | (ah >> 4) << 6);
        s[j + 4] = (uint8_t)(b | (bh >> 4) << 6);
        s[j + 8] = (uint8_t)((ah & 15) | (bh & 15) << 4);
    }
}

/* Q3_K: 16 codes of 6 bits in 12 bytes (unsigned, 0..63). */
static void k3_scales_decode(const uint8_t *s, int *code)
{
    for (int j = 0; j < 16; j++) {
        const int lo = (s[j % 8] >> (4 * (j / 8))) & 15;
        const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        code[j] = lo | hi << 4;
    }
}

static void k3_scales_encode(const int *code, uint8_t *s)
{
    memset(s, 0, 12);
    for (int j = 0; j < 16; j++) {
        const unsigned v = (unsigned)code[j] & 63;
        s[j % 8] |= (uint8_t)((v & 15) << (4 * (j / 8)));
        s[8 + j % 4] |= (uint8_t)((v >> 4) << (2 * (j / 4)));
    }
}

/* ------------------------------------------------------------ decode */

/* Low 4 bits of a 32-element block's code k: k < 16 low nibble of qs[k],
 * else high nibble of qs[k-16] (Q4_0's arrangement, kept by the 32-element
 * k-quants). */
static int nib32(const uint8_t *qs, int k) { return k < 16 ? qs[k] & 15 : qs[k - 16] >> 4; }

static uint32_t ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int ie_kq_decode(ie_dtype_t t, const void *block, ie_kq_codes_t *c)
{
    const uint8_t *b = block;
    if (ie_kq_info(t, NULL) != 0) return -1;
    memset(c, 0, sizeof *c);
    switch (t) {
    case IE_DTYPE_Q5_0:
    case IE_DTYPE_Q5_1: {
        const size_t o = t == IE_DTYPE_Q5_1 ? 4 : 2; /* qh after d (and m) */
        c->d = ld16(b);
        if (t == IE_DTYPE_Q5_1) c->dmin = ld16(b + 2);
        const uint32_t qh = ld32(b + o);
        for (int k = 0; k < IE_QK; k++) c->u[k] = (uint8_t)(nib32(b + o + 4, k) | ((qh >> k) & 1) << 4);
        break;
    }
    case IE_DTYPE_IQ4_NL:
        c->d = ld16(b);
        for (int k = 0; k < IE_QK; k++) c->u[k] = (uint8_t)nib32(b + 2, k);
        break;
    case IE_DTYPE_MXFP4:
        for (int k = 0; k < IE_QK; k++) c->u[k] = (uint8_t)nib32(b + 1, k);
        if (ie_mxfp4_panel_d(b, &c->d) != 0) return -1;
        break;
    case IE_DTYPE_Q2_K: {
        const ie_block_q2_k_t *q = block;
        for (int k = 0; k < IE_QK_K; k++)
            c->u[k] = (uint8_t)((q->qs[32 * (k / 128) + k % 32] >> (2 * ((k % 128) / 32))) & 3);
        for (int j = 0; j < 16; j++) {
            c->sc[j] = (int8_t)(q->scales[j] & 15);
            c->mn[j] = (int8_t)(q->scales[j] >> 4);
        }
        c->d = ld16(b + offsetof(ie_block_q2_k_t, d));
        c->dmin = ld16(b + offsetof(ie_block_q2_k_t, dmin));
        break;
    }
    case IE_DTYPE_Q3_K: {
        const ie_block_q3_k_t *q = block;
        for (int k = 0; k < IE_QK_K; k++) {
            const int lo = (q->qs[32 * (k / 128) + k % 32] >> (2 * ((k % 128) / 32))) & 3;
            const int hi = (q->hmask[k % 32] >> (k / 32)) & 1;
            c->u[k] = (uint8_t)(lo | hi << 2);
        }
        int code[16];
        k3_scales_decode(q->scales, code);
        for (int j = 0; j < 16; j++) c->sc[j] = (int8_t)(code[j] - 32);
        c->d = ld16(b + offsetof(ie_block_q3_k_t, d));
        break;
    }
    case IE_DTYPE_Q4_K:
    case IE_DTYPE_Q5_K: {
        const uint8_t *scales = b + 4;
        const uint8_t *qh = b + 16;                             /* Q5_K only */
        const uint8_t *qs = b + (t == IE_DTYPE_Q5_K ? 48 : 16); /* after qh for Q5_K */
        c->d = ld16(b);
        c->dmin = ld16(b + 2);
        k4_scales_decode(scales, c->sc, c->mn);
        for (int k = 0; k < IE_QK_K; k++) {
            int u = (qs[32 * (k / 64) + k % 32] >> (4 * ((k % 64) / 32))) & 15;
            if (t == IE_DTYPE_Q5_K) u |= ((qh[k % 32] >> (k / 32)) & 1) << 4;
            c->u[k] = (uint8_t)u;
        }
        break;
    }
    case IE_DTYPE_Q6_K: {
        const ie_block_q6_k_t *q = block;
        for (int k = 0; k < IE_QK_K; k++) {
            const int h = k / 128, r = k % 128;
            const int lo = (q->ql[64 * h + r % 64] >> (4 * (r / 64))) & 15;
            const int hi = (q->qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
            c->u[k] = (uint8_t)(lo | hi << 4);
        }
        for (int j = 0; j < 16; j++) c->sc[j] = q->scales[j];
        c->d = ld16(b + offsetof(ie_block_q6_k_t, d));
        break;
    }
    case IE_DTYPE_IQ4_XS: {
        const ie_block_iq4_xs_t *q = block;
        const unsigned sh = ld16(b + 2);
        c->d = ld16(b);
        for (int j = 0; j < 8; j++) {
            const int lo = (q->scales_l[j / 2] >> (4 * (j % 2))) & 15;
            const int hi = (int)(sh >> (2 * j)) & 3;
            c->sc[j] = (int8_t)((lo | hi << 4) - 32);
        }
        for (int k = 0; k < IE_QK_K; k++) {
            const int j = k / 32, i = k % 32;
            c->u[k] = (uint8_t)((q->qs[16 * j + i % 16] >> (4 * (i / 16))) & 15);
        }
        break;
    }
    default: return -1;
    }
    return 0;
}

/* Contract (ie_kernels_isa.h). */
int ie_mxfp4_panel_d(const void *block, ie_f16_t *d)
{
    const uint8_t *b = block;
    if (b[0] >= MXFP4_E_MIN && b[0] <= MXFP4_E_MAX) { /* 2^x, x = e - 128 in [-24, 15]: normal from -14 */
        const int x = b[0] - 128;
        *d = (ie_f16_t)(x >= -14 ? (x + 15) << 10 : 1 << (x + 24));
        return 0;
    }
    int any = 0; /* a code other than +-0 (magnitude bits 0-2 of either nibble) */
    for (int k = 1; k <= IE_QK / 2; k++) any |= b[k] & 0x77;
    *d = 0;
    return any ? -1 : 0; /* 2^(e-128) is not an f16 */
}

/* ------------------------------------------------------------ encode */

int ie_kq_encode(ie_dtype_t t, const ie_kq_codes_t *c, void *block)
{
    uint8_t *b = block;
    ie_kq_info_t in;
    if (ie_kq_info(t, &in) != 0) return -1;
    memset(b, 0, ie_dtype_block_bytes(t));
    switch (t) {
    case IE_DTYPE_Q5_0:
    case IE_DTYPE_Q5_1: {
        const size_t o = t == IE_DTYPE_Q5_1 ? 4 : 2;
        st16(b, c->d);
        if (t == IE_DTYPE_Q5_1) st16(b + 2, c->dmin);
        uint32_t qh = 0;
        for (int k = 0; k < IE_QK; k++) {
            const unsigned u = c->u[k] & 31u;
            qh |= (uint32_t)(u >> 4) << k;
            b[o + 4 + k % 16] |= (uint8_t)((u & 15) << (4 * (k / 16)));
        }
        for (int i = 0; i < 4; i++) b[o + i] = (uint8_t)(qh >> (8 * i));
        break;
    }
    case IE_DTYPE_IQ4_NL:
        st16(b, c->d);
        for (int k = 0; k < IE_QK; k++) b[2 + k % 16] |= (uint8_t)((c->u[k] & 15u) << (4 * (k / 16)));
        break;
    case IE_DTYPE_MXFP4: {
        int e = 0, any = 0;
        for (int k = 0; k < IE_QK; k++) any |= (c->u[k] & 7) != 0;
        if (c->d == 0 && any) return -1; /* no e gives exact zeros but +-0 codes */
        if (c->d != 0) {
            const float d = ie_f16_to_f32(c->d);
            int x;
            if (!(d > 0.0f) || frexpf(d, &x) != 0.5f || x - 1 + 128 < MXFP4_E_MIN || x - 1 + 128 > MXFP4_E_MAX)
                return -1; /* not 2^(e-128) for an e the panels hold */
            e = x - 1 + 128;
        }
        b[0] = (uint8_t)e;
        for (int k = 0; k < IE_QK; k++) b[1 + k % 16] |= (uint8_t)((c->u[k] & 15u) << (4 * (k / 16)));
        break;
    }
    case IE_DTYPE_Q2_K: {
        ie_block_q2_k_t *q = block;
        for (int k = 0; k < IE_QK_K; k++)
            q->qs[32 * (k / 128) + k % 32] |= (uint8_t)((c->u[k] & 3u) << (2 * ((k % 128) / 32)));
        for (int j = 0; j < 16; j++)
            q->scales[j] = (uint8_t)(((unsigned)c->sc[j] & 15) | ((unsigned)c->mn[j] & 15) << 4);
        st16(b + offsetof(ie_block_q2_k_t, d), c->d);
        st16(b + offsetof(ie_block_q2_k_t, dmin), c->dmin);
        break;
    }
    case IE_DTYPE_Q3_K: {
        ie_block_q3_k_t *q = block;
        for (int k = 0; k < IE_QK_K; k++) {
            q->qs[32 * (k / 128) + k % 32] |= (uint8_t)((c->u[k] & 3u) << (2 * ((k % 128) / 32)));
            q->hmask[k % 32] |= (uint8_t)(((c->u[k] >> 2) & 1u) << (k / 32));
        }
        int code[16];
        for (int j = 0; j < 16; j++) code[j] = c->sc[j] + 32;
        k3_scales_encode(code, q->scales);
        st16(b + offsetof(ie_block_q3_k_t, d), c->d);
        break;
    }
    case IE_DTYPE_Q4_K:
    case IE_DTYPE_Q5_K: {
        uint8_t *qh = b + 16, *qs = b + (t == IE_DTYPE_Q5_K ? 48 : 16);
        st16(b, c->d);
        st16(b + 2, c->dmin);
        k4_scales_encode(c->sc, c->mn, b + 4);
        for (int k = 0; k < IE_QK_K; k++) {
            qs[32 * (k / 64) + k % 32] |= (uint8_t)((c->u[k] & 15u) << (4 * ((k % 64) / 32)));
            if (t == IE_DTYPE_Q5_K) qh[k % 32] |= (uint8_t)(((c->u[k] >> 4) & 1u) << (k / 32));
        }
        break;
    }
    case IE_DTYPE_Q6_K: {
        ie_block_q6_k_t *q = block;
        for (int k = 0; k < IE_QK_K; k++) {
            const int h = k / 128, r = k % 128;
            q->ql[64 * h + r % 64] |= (uint8_t)((c->u[k] & 15u) << (4 * (r / 64)));
            q->qh[32 * h + r % 32] |= (uint8_t)(((c->u[k] >> 4) & 3u) << (2 * (r / 32)));
        }
        for (int j = 0; j < 16; j++) q->scales[j] = c->sc[j];
        st16(b + offsetof(ie_block_q6_k_t, d), c->d);
        break;
    }
    case IE_DTYPE_IQ4_XS: {
        ie_block_iq4_xs_t *q = block;
        unsigned sh = 0;
        st16(b, c->d);
        for (int j = 0; j < 8; j++) {
            const unsigned v = (unsigned)(c->sc[j] + 32) & 63;
            q->scales_l[j / 2] |= (uint8_t)((v & 15) << (4 * (j % 2)));
            sh |= (v >> 4) << (2 * j);
        }
        st16(b + 2, (ie_f16_t)sh);
        for (int k = 0; k < IE_QK_K; k++) {
            const int j = k / 32, i = k % 32;
            q->qs[16 * j + i % 16] |= (uint8_t)((c->u[k] & 15u) << (4 * (i / 16)));
        }
        break;
    }
    default: return -1;
    }
    return 0;
}

/* ------------------------------------------------------------- values */

/* Each product in parentheses is exact in f32 (an f16 times codes of at
 * most 8 bits), so the result rounds at most once, like gguf.quants. */
float ie_kq_value(ie_dtype_t t, const ie_kq_codes_t *c, int k)
{
    const float d = ie_f16_to_f32(c->d), dm = ie_f16_to_f32(c->dmin);
    const int u = c->u[k];
    switch (t) {
    case IE_DTYPE_Q5_0: return d * (float)(u - 16);
    case IE_DTYPE_Q5_1: return d * (float)u + dm;
    case IE_DTYPE_IQ4_NL: return d * (float)ie_iq4nl_kvalues[u & 15];
    case IE_DTYPE_MXFP4: return d * (float)ie_mxfp4_kvalues[u & 15];
    case IE_DTYPE_Q2_K: return (d * (float)c->sc[k / 16]) * (float)u - dm * (float)c->mn[k / 16];
    case IE_DTYPE_Q3_K: return (d * (float)c->sc[k / 16]) * (float)(u - 4);
    case IE_DTYPE_Q4_K:
    case IE_DTYPE_Q5_K: return (d * (float)c->sc[k / 32]) * (float)u - dm * (float)c->mn[k / 32];
    case IE_DTYPE_Q6_K: return (d * (float)c->sc[k / 16]) * (float)(u - 32);
    case IE_DTYPE_IQ4_XS: return (d * (float)c->sc[k / 32]) * (float)ie_iq4nl_kvalues[u & 15];
    default: return 0.0f;
    }
}

/* ------------------------------------------------------ scale checking */

int64_t ie_quant_find_nonfinite(ie_dtype_t t, const void *src, int64_t n)
{
    /* byte offsets of the f16 scale fields of each block (-1: none) */
    int o1 = -1, o2 = -1;
    switch (t) {
    case IE_DTYPE_Q8_0:
    case IE_DTYPE_Q4_0:
    case IE_DTYPE_Q5_0:
    case IE_DTYPE_IQ4_NL:
    case IE_DTYPE_IQ4_XS: o1 = 0; break;
    case IE_DTYPE_Q8_1: /* d, s */
    case IE_DTYPE_Q4_1: /* d, m */
    case IE_DTYPE_Q5_1: /* d, m */
    case IE_DTYPE_Q4_K: /* d, dmin */
    case IE_DTYPE_Q5_K: o1 = 0, o2 = 2; break;
    case IE_DTYPE_Q2_K: o1 = (int)offsetof(ie_block_q2_k_t, d), o2 = (int)offsetof(ie_block_q2_k_t, dmin); break;
    case IE_DTYPE_Q3_K: o1 = (int)offsetof(ie_block_q3_k_t, d); break;
    case IE_DTYPE_Q6_K: o1 = (int)offsetof(ie_block_q6_k_t, d); break;
    case IE_DTYPE_Q8_K: { /* f32 d */
        const ie_block_q8_k_t *q = src;
        for (int64_t b = 0; b < n / IE_QK_K; b++) {
            float d;
            memcpy(&d, &q[b].d, sizeof d);
            if (!isfinite(d)) return b;
        }
        return -1;
    }
    default:
        if (ie_dtype_is_iquant(t)) {
            const size_t bb = ie_dtype_block_bytes(t);
            for (int64_t b = 0; b < n / IE_QK_K; b++)
                if (f16_nonfinite(ie_iq_block_d(t, (const uint8_t *)src + (size_t)b * bb))) return b;
        }
        return -1; /* f32/f16/bf16, MXFP4 (every e is a finite scale), unknown */
    }
    const int qk = ie_dtype_block_elems(t);
    const size_t bb = ie_dtype_block_bytes(t);
    for (int64_t b = 0; b < n / qk; b++) {
        const uint8_t *p = (const uint8_t *)src + (size_t)b * bb;
        if (f16_nonfinite(ld16(p + o1)) || (o2 >= 0 && f16_nonfinite(ld16(p + o2)))) return b;
    }
    return -1;
}

/* ------------------------------------------------------------ Q8_K */

/* ggml's nearest_int: round half to even via the 1.5*2^23 trick, valid for
 * |v| < 2^22 (here |v| <= 127 + rounding). */
static int nearest_int(float v)
{
    const float f = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

void ie_quantize_row_q8_k_ref(const float *x, ie_block_q8_k_t *y, int64_t n)
{
    for (int64_t b = 0; b < n / IE_QK_K; b++) {
        const float *xb = x + b * IE_QK_K;
        ie_block_q8_k_t *o = y + b;
        float amax = 0.0f, max = 0.0f; /* max: the value of largest magnitude, first one on ties */
        for (int j = 0; j < IE_QK_K; j++) {
            const float ax = fabsf(xb[j]);
            if (ax > amax) {
                amax = ax;
                max = xb[j];
            }
        }
        const float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
        /* an all-zero block, or one so tiny that 127/max overflows (ggml
         * would convert inf*x to int): d = 0 and zero codes */
        if (iscale == 0.0f || isinf(iscale)) {
            memset(o, 0, sizeof *o);
            continue;
        }
        for (int j = 0; j < IE_QK_K; j++) {
            const int v = nearest_int(iscale * xb[j]);
            o->q[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < IE_QK_K / 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += o->q[16 * j + i];
            o->bsums[j] = (int16_t)s;
        }
        o->d = 1.0f / iscale;
    }
}

/* -------------------------------------------------- ROWS ref matmuls */

/* Q8_P activations of a row of n_in: q at arow, d and s after them. */
static float q8p_d(const uint8_t *arow, int64_t b, int64_t n_in)
{
    float v;
    memcpy(&v, arow + n_in + 4 * b, sizeof v);
    return v;
}
static float q8p_s(const uint8_t *arow, int64_t b, int64_t n_in)
{
    float v;
    memcpy(&v, arow + n_in + 4 * (n_in / IE_QK) + 4 * b, sizeof v);
    return v;
}

/* 32-element types x Q8_P, block b of the decoded weight block c: isum =
 * sum u*q (IQ4_NL: kv[u]*q) exactly, then in f32
 *   Q5_0  : dw * (da*isum - 16*s)
 *   Q5_1  : (dw*da)*isum + m*s
 *   IQ4_NL: (dw*da)*isum
 * (s = da*sum(q), the activation block's stored sum). */
static float dot_q8p(ie_dtype_t t, const ie_kq_codes_t *c, const uint8_t *arow, int64_t b, int64_t n_in)
{
    const int8_t *q = (const int8_t *)arow + b * IE_QK;
    int32_t isum = 0;
    for (int k = 0; k < IE_QK; k++)
        isum += (t == IE_DTYPE_IQ4_NL ? ie_iq4nl_kvalues[c->u[k]] : (int32_t)c->u[k]) * (int32_t)q[k];
    const float dw = ie_f16_to_f32(c->d), da = q8p_d(arow, b, n_in), s = q8p_s(arow, b, n_in);
    switch (t) {
    case IE_DTYPE_Q5_0: return dw * (da * (float)isum - 16.0f * s);
    case IE_DTYPE_Q5_1: return (dw * da) * (float)isum + ie_f16_to_f32(c->dmin) * s;
    default: return (dw * da) * (float)isum;
    }
}

/* 256-element types x Q8_K, super-block b (int32 throughout; the largest
 * magnitude, Q6_K's 16*16*32*128*128, is below 2^31):
 *   isum = sum_j sc_j * sum_{k in j} (v_k * q_k)   with v_k = u (Q2_K, Q4_K,
 *          Q5_K), u - 4 (Q3_K), u - 32 (Q6_K), kv[u] (IQ4_XS); the offsets
 *          enter through bsums: sum (u-o)*q = sum u*q - o*bsum
 *   msum = sum_j mn_j * bsum_j (Q2_K, Q4_K, Q5_K; bsum_j over sub-block j)
 * then in f32: (da*d)*isum - (da*dmin)*msum. */
static float dot_q8k(ie_dtype_t t, const ie_kq_info_t *in, const ie_kq_codes_t *c, const uint8_t *arow, int64_t b)
{
    ie_block_q8_k_t a;
    memcpy(&a, arow + (size_t)b * sizeof a, sizeof a);
    const int len = IE_QK_K / in->nsub, per = len / 16; /* bsums per sub-block */
    const int off = t == IE_DTYPE_Q3_K ? 4 : t == IE_DTYPE_Q6_K ? 32 : 0;
    int32_t isum = 0, msum = 0;
    for (int j = 0; j < in->nsub; j++) {
        int32_t sj = 0, bs = 0;
        for (int k = j * len; k < (j + 1) * len; k++)
            sj += (t == IE_DTYPE_IQ4_XS ? ie_iq4nl_kvalues[c->u[k]] : (int32_t)c->u[k]) * (int32_t)a.q[k];
        for (int i = 0; i < per; i++) bs += a.bsums[j * per + i];
        isum += c->sc[j] * (sj - off * bs);
        msum += c->mn[j] * bs;
    }
    const float d = ie_f16_to_f32(c->d), dmin = ie_f16_to_f32(c->dmin);
    if (!in->has_mn) return (a.d * d) * (float)isum;
    return (a.d * d) * (float)isum - (a.d * dmin) * (float)msum;
}

/* Rows [r0, r1) x n_tok tokens: each block's f32 term summed in double,
 * blocks in order. A weight block is decoded once per group of up to
 * TOK_GROUP tokens (the accumulators live on the stack: no allocation). */
#define TOK_GROUP 16
static void matmul_rows(ie_dtype_t t, const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as,
                        int64_t n_tok, float *y, int64_t ldy)
{
    ie_kq_info_t in;
    ie_kq_codes_t c;
    (void)ie_kq_info(t, &in);
    const size_t wrow = ie_dtype_row_bytes(t, n_in), bb = ie_dtype_block_bytes(t);
    const int64_t nb = n_in / in.qk;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * wrow;
        for (int64_t t0 = 0; t0 < n_tok; t0 += TOK_GROUP) {
            const int nt = (int)(n_tok - t0 < TOK_GROUP ? n_tok - t0 : TOK_GROUP);
            double acc[TOK_GROUP] = {0};
            for (int64_t b = 0; b < nb; b++) {
                (void)ie_kq_decode(t, wr + (size_t)b * bb, &c);
                for (int i = 0; i < nt; i++) {
                    const uint8_t *arow = (const uint8_t *)a + (size_t)(t0 + i) * as;
                    acc[i] += in.qk == IE_QK ? (double)dot_q8p(t, &c, arow, b, n_in)
                                             : (double)dot_q8k(t, &in, &c, arow, b);
                }
            }
            for (int i = 0; i < nt; i++) y[(t0 + i) * ldy + r] = (float)acc[i];
        }
    }
}

#define IE_KQ_MATMUL(name, type)                                                                                  \
    void name(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t a_stride, int64_t n_tok, \
              float *y, int64_t ldy)                                                                              \
    {                                                                                                             \
        matmul_rows(type, w, n_in, r0, r1, a, a_stride, n_tok, y, ldy);                                           \
    }

IE_KQ_MATMUL(ie_matmul_q5_0_q8_p_ref, IE_DTYPE_Q5_0)
IE_KQ_MATMUL(ie_matmul_q5_1_q8_p_ref, IE_DTYPE_Q5_1)
IE_KQ_MATMUL(ie_matmul_iq4_nl_q8_p_ref, IE_DTYPE_IQ4_NL)
IE_KQ_MATMUL(ie_matmul_q2_k_q8_k_ref, IE_DTYPE_Q2_K)
IE_KQ_MATMUL(ie_matmul_q3_k_q8_k_ref, IE_DTYPE_Q3_K)
IE_KQ_MATMUL(ie_matmul_q4_k_q8_k_ref, IE_DTYPE_Q4_K)
IE_KQ_MATMUL(ie_matmul_q5_k_q8_k_ref, IE_DTYPE_Q5_K)
IE_KQ_MATMUL(ie_matmul_q6_k_q8_k_ref, IE_DTYPE_Q6_K)
IE_KQ_MATMUL(ie_matmul_iq4_xs_q8_k_ref, IE_DTYPE_IQ4_XS)

/* ---------------------------------------------------------- quantizers
 *
 * Q5_0 and Q5_1 follow ggml's reference rule exactly (quantize_row_q5_0_ref
 * / _q5_1_ref, equal to gguf.quants' quantize): Q5_0 d = max/-16 with max
 * the value of largest magnitude (the first on ties), u = min(31,
 * trunc(x/d + 16.5)); Q5_1 d = (max-min)/31, m = min, u = trunc((x-min)/d
 * + 0.5). The only difference: a scale whose inverse overflows f32 gives
 * zero codes (ie_inv_scale) where ggml would convert inf to int.
 *
 * The others are this engine's own search quantizers, in the spirit of
 * ggml's reference ones (no importance matrix: every element weighs the
 * same, the squared error is what is minimized):
 *   1. each sub-block gets a float scale (and min) by trying a few
 *      candidate inverse scales around the one that maps the sub-block's
 *      extreme onto the code range's end, assigning nearest codes, solving
 *      the least-squares scale (and offset) for those codes, and keeping
 *      the candidate with the smallest squared error (for the affine and
 *      code book fits one candidate clips nothing; the symmetric one, like
 *      ggml's, maps the extreme to -nmax and may clip the other side at
 *      nmax-1);
 *        affine (Q2_K, Q4_K, Q5_K): x ~ s*u - m with s >= 0, m >= 0 (the
 *          sub-block's minimum is clamped to <= 0, as the formula needs);
 *        symmetric (Q3_K, Q6_K): x ~ s*q, q in [-nmax, nmax-1], the
 *          extreme mapped to -nmax (the longer side) so s is signed;
 *        code book (IQ4_NL, IQ4_XS): x ~ s*kv[u], the extreme mapped to
 *          either end of the book (-127 or 113);
 *   2. the super-block's f16 d (and dmin) quantize those scales to the
 *      type's scale codes: affine d = max(s)/cmax, dmin = max(m)/cmax
 *      (cmax 15 for Q2_K, 63 otherwise); signed, like ggml, d = -S/c with
 *      S the scale of largest magnitude (c = 128 for Q6_K's int8, 32 for
 *      Q3_K's and IQ4_XS's 6-bit codes), so that S's code is -c;
 *   3. each sub-block's scale (and min) code is the best of the rounded
 *      code and its two neighbours (3 or 3x3 tries) by the squared error
 *      of the block as stored, every element taking the code nearest to
 *      it under that (f16, code-quantized) scale and min.
 * f16 fields saturate at +-65504 (inputs whose scales overflow f16 lose
 * range instead of producing an infinite scale). */

/* f16 of v, saturated to the largest finite f16. */
static ie_f16_t f16_sat(float v)
{
    if (v > 65504.0f) v = 65504.0f;
    if (v < -65504.0f) v = -65504.0f;
    return ie_f32_to_f16(v);
}

/* f16 of v rounded away from zero (saturated): a super-block scale that
 * is never smaller than the one the scale codes were sized for, so the
 * largest sub-block scale's code stays in range even where f16 is coarse
 * (subnormal d for tiny blocks). */
static ie_f16_t f16_up(float v)
{
    ie_f16_t h = f16_sat(v);
    if (fabsf(ie_f16_to_f32(h)) < fabsf(v) && (h & 0x7fff) < 0x7bff) h = (ie_f16_t)(h + 1);
    return h;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Nearest integer of v, clamped to [lo, hi] (a NaN gives lo): the clamp
 * first, then ggml's nearest_int (ties to even, no libm call: these
 * searches round tens of times per element). */
static int qround(float v, int lo, int hi)
{
    if (!(v > (float)lo)) return lo;
    if (v > (float)hi) return hi;
    return clampi(nearest_int(v), lo, hi);
}

/* Index of the code book entry nearest v (the lower one on ties): the
 * number of midpoints of the sorted book below v, counted without
 * branches (a search's unpredictable branches cost more than the 15
 * compares; the searches call this ~30 times per element). */
static int nearest_kv(float v)
{
    static const float cut[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                                  7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f};
    int n = 0;
    for (int i = 0; i < 15; i++) n += v > cut[i];
    return n;
}

/* Affine fit of x[0..n) ~ s*u - m (u in [0, nmax], s >= 0, m >= 0). */
static void fit_affine(const float *x, int n, int nmax, float *s_out, float *m_out)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    if (lo > 0.0f) lo = 0.0f;
    *s_out = 0.0f;
    *m_out = -lo;
    if (!(hi > lo)) return; /* every x equal to lo <= 0: s = 0, m = -lo */
    double best = INFINITY;
    const double range = (double)hi - lo;
    for (int k = -10; k <= 10; k++) {
        const double is = (nmax + 0.1 * k) / range; /* k = 0: the extremes on 0 and nmax, nothing clipped */
        double sl = 0, sll = 0, sx = 0, slx = 0;
        for (int i = 0; i < n; i++) {
            const double L = qround((float)(is * ((double)x[i] - lo)), 0, nmax);
            sl += L, sll += L * L, sx += x[i], slx += L * x[i];
        }
        const double det = n * sll - sl * sl;
        double s, c; /* x ~ s*L + c */
        if (det > 1e-9 * n * sll) {
            s = (n * slx - sl * sx) / det;
            c = (sll * sx - sl * slx) / det;
        } else { /* every code equal (a constant sub-block): the scale alone */
            s = sll > 0 ? slx / sll : 0, c = sll > 0 ? 0 : sx / n;
        }
        if (c > 0) c = 0, s = sll > 0 ? slx / sll : 0; /* the min must not be positive */
        if (s < 0) continue;
        /* sum (s*L + c - x)^2 from the sums, less the constant sum x^2 */
        const double e = s * s * sll + n * c * c + 2 * s * c * sl - 2 * s * slx - 2 * c * sx;
        if (e < best) best = e, *s_out = (float)s, *m_out = (float)-c;
    }
}

/* Symmetric fit of x[0..n) ~ s*q (q in [-nmax, nmax-1]); s may be
 * negative (the extreme goes to -nmax). */
static float fit_symmetric(const float *x, int n, int nmax)
{
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), max = x[i];
    if (amax == 0.0f) return 0.0f;
    double best = INFINITY, bs = 0.0;
    for (int k = -9; k <= 9; k++) {
        const double is = -(nmax + 0.1 * k) / (double)max;
        double sqx = 0, sqq = 0;
        for (int i = 0; i < n; i++) {
            const double q = qround((float)(is * x[i]), -nmax, nmax - 1);
            sqx += q * x[i], sqq += q * q;
        }
        if (sqq <= 0) continue;
        /* the least-squares s = sqx/sqq leaves sum x^2 - sqx^2/sqq */
        const double e = -sqx * sqx / sqq;
        if (e < best) best = e, bs = sqx / sqq;
    }
    return (float)bs;
}

/* Code book fit of x[0..n) ~ s*kv[u]. */
static float fit_codebook(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), max = x[i];
    if (amax == 0.0f) return 0.0f;
    double best = INFINITY, bs = 0.0;
    for (int end = 0; end < 2; end++)
        for (int k = -7; k <= 7; k++) {
            const double kend = end ? ie_iq4nl_kvalues[15] : ie_iq4nl_kvalues[0];
            const double is = (kend + 0.1 * k * (end ? 1 : -1)) / (double)max;
            double sqx = 0, sqq = 0;
            for (int i = 0; i < n; i++) {
                const double v = ie_iq4nl_kvalues[nearest_kv((float)(is * x[i]))];
                sqx += v * x[i], sqq += v * v;
            }
            /* sqq > 0 (the book has no 0); the least-squares s = sqx/sqq
             * leaves sum x^2 - sqx^2/sqq */
            const double e = -sqx * sqx / sqq;
            if (e < best) best = e, bs = sqx / sqq;
        }
    return (float)bs;
}

/* The nearest codes u (to u, when not NULL) of x[0..n) under the stored
 * sub-block scale ds and min dm (x ~ ds*u - dm, u in [0, nmax]), and
 * their squared error, every product rounded to f32 as ie_kq_value
 * computes it. */
static double codes_affine(const float *x, int n, int nmax, float ds, float dm, uint8_t *u)
{
    const float ids = ie_inv_scale(ds);
    double e = 0;
    for (int k = 0; k < n; k++) {
        const int q = qround((x[k] + dm) * ids, 0, nmax);
        const double r = (double)(ds * (float)q - dm) - x[k];
        e += r * r;
        if (u) u[k] = (uint8_t)q;
    }
    return e;
}

/* The same for the signed formulas: x ~ ds*(u - nmax) (Q3_K, Q6_K) or
 * ds*kv[u] (book: IQ4_XS). */
static double codes_signed(const float *x, int n, int book, int nmax, float ds, uint8_t *u)
{
    const float ids = ie_inv_scale(ds);
    double e = 0;
    for (int k = 0; k < n; k++) {
        const int q = book ? nearest_kv(x[k] * ids) : qround(x[k] * ids, -nmax, nmax - 1) + nmax;
        const double r = (double)(ds * (float)(book ? ie_iq4nl_kvalues[q] : q - nmax)) - x[k];
        e += r * r;
        if (u) u[k] = (uint8_t)q;
    }
    return e;
}

/* One block of t (qk = 32 or 256 floats) into codes c (ie_kq_encode
 * writes them). */
static void quantize_block(ie_dtype_t t, const float *x, ie_kq_codes_t *c)
{
    ie_kq_info_t in;
    (void)ie_kq_info(t, &in);
    memset(c, 0, sizeof *c);
    switch (t) {
    case IE_DTYPE_Q5_0: {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < IE_QK; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
        const float d = max / -16.0f, id = ie_inv_scale(d);
        c->d = ie_f32_to_f16(d);
        for (int j = 0; j < IE_QK; j++) {
            const int v = (int8_t)(x[j] * id + 16.5f);
            c->u[j] = (uint8_t)(v < 31 ? v : 31);
        }
        return;
    }
    case IE_DTYPE_Q5_1: {
        float lo = x[0], hi = x[0];
        for (int j = 1; j < IE_QK; j++) lo = x[j] < lo ? x[j] : lo, hi = x[j] > hi ? x[j] : hi;
        const float d = (hi - lo) / 31.0f, id = ie_inv_scale(d);
        c->d = ie_f32_to_f16(d);
        c->dmin = ie_f32_to_f16(lo);
        for (int j = 0; j < IE_QK; j++) {
            const int v = (int)((x[j] - lo) * id + 0.5f); /* in [0, 31.5]: truncation */
            c->u[j] = (uint8_t)(v < 31 ? v : 31);
        }
        return;
    }
    case IE_DTYPE_IQ4_NL: {
        c->d = f16_sat(fit_codebook(x, IE_QK));
        const float df = ie_f16_to_f32(c->d), id = ie_inv_scale(df);
        for (int j = 0; j < IE_QK; j++) c->u[j] = (uint8_t)nearest_kv(x[j] * id);
        return;
    }
    default: break;
    }
    const int len = IE_QK_K / in.nsub;
    float s[16], m[16];
    if (in.has_mn) { /* Q2_K, Q4_K, Q5_K */
        const int nmax = (1 << in.bits) - 1, cmax = t == IE_DTYPE_Q2_K ? 15 : 63;
        float smax = 0.0f, mmax = 0.0f;
        for (int j = 0; j < in.nsub; j++) {
            fit_affine(x + j * len, len, nmax, &s[j], &m[j]);
            smax = fmaxf(smax, s[j]), mmax = fmaxf(mmax, m[j]);
        }
        c->d = f16_up(smax / (float)cmax);
        c->dmin = f16_up(mmax / (float)cmax);
        const float df = ie_f16_to_f32(c->d), dmf = ie_f16_to_f32(c->dmin);
        const float id = ie_inv_scale(df), idm = ie_inv_scale(dmf);
        for (int j = 0; j < in.nsub; j++) {
            const int sc0 = qround(s[j] * id, 0, cmax), mn0 = qround(m[j] * idm, 0, cmax);
            double best = INFINITY;
            for (int a = sc0 - 1; a <= sc0 + 1; a++)
                for (int b = mn0 - 1; b <= mn0 + 1; b++) {
                    if (a < 0 || a > cmax || b < 0 || b > cmax) continue;
                    const double e = codes_affine(x + j * len, len, nmax, df * (float)a, dmf * (float)b, NULL);
                    if (e < best) best = e, c->sc[j] = (int8_t)a, c->mn[j] = (int8_t)b;
                }
            (void)codes_affine(x + j * len, len, nmax, df * (float)c->sc[j], dmf * (float)c->mn[j], c->u + j * len);
        }
        return;
    }
    /* symmetric and code book super-blocks: Q3_K, Q6_K, IQ4_XS */
    const int nmax = t == IE_DTYPE_Q3_K ? 4 : 32;   /* q in [-nmax, nmax-1] */
    const int cneg = t == IE_DTYPE_Q6_K ? 128 : 32; /* scale codes in [-cneg, cneg-1] */
    float smax = 0.0f, sbig = 0.0f;                 /* the scale of largest magnitude */
    for (int j = 0; j < in.nsub; j++) {
        s[j] = t == IE_DTYPE_IQ4_XS ? fit_codebook(x + j * len, len) : fit_symmetric(x + j * len, len, nmax);
        if (fabsf(s[j]) > smax) smax = fabsf(s[j]), sbig = s[j];
    }
    c->d = f16_up(sbig / (float)-cneg);
    const float df = ie_f16_to_f32(c->d), id = ie_inv_scale(df);
    const int book = t == IE_DTYPE_IQ4_XS;
    for (int j = 0; j < in.nsub; j++) {
        const int sc0 = qround(s[j] * id, -cneg, cneg - 1);
        double best = INFINITY;
        for (int a = sc0 - 1; a <= sc0 + 1; a++) {
            if (a < -cneg || a > cneg - 1) continue;
            const double e = codes_signed(x + j * len, len, book, nmax, df * (float)a, NULL);
            if (e < best) best = e, c->sc[j] = (int8_t)a;
        }
        (void)codes_signed(x + j * len, len, book, nmax, df * (float)c->sc[j], c->u + j * len);
    }
}

/* Contract (ie_kernels_isa.h). */
int ie_kq_quantize_row(ie_dtype_t t, const float *src, void *dst, int64_t n)
{
    ie_kq_info_t in;
    if (!ie_dtype_is_kquant(t) || ie_kq_info(t, &in) != 0 || n < 0 || n % in.qk != 0) return -1;
    const size_t bb = ie_dtype_block_bytes(t);
    ie_kq_codes_t c;
    for (int64_t b = 0; b < n / in.qk; b++) {
        quantize_block(t, src + b * in.qk, &c);
        (void)ie_kq_encode(t, &c, (uint8_t *)dst + (size_t)b * bb);
    }
    return 0;
}

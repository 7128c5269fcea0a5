/* iquant_ref.c — ggml's grid i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS,
 * IQ2_S, IQ3_XXS, IQ3_S): the one decoder of their bit layouts
 * (ie_iq_decode) and the ROWS reference matmuls against Q8_K activations.
 *
 * Where each field lives in a block (bytes, little-endian; group g = 8
 * elements 8g..8g+7, sub-block j = 32 elements; verified against
 * gguf.quants' dequantize_blocks by test_iquant's fixtures):
 *   IQ2_XXS: d @0; sub-block j: u32 grid indices @2+8j (byte l: group
 *            4j+l), u32 w @6+8j: sign code of group 4j+l (w >> 7l) & 127,
 *            scale s = w >> 28 (x = d*(0.5+s)/4 * grid * sign).
 *   IQ2_XS : d @0; u16 v[32] @2: group g index v & 511, sign code v >> 9;
 *            scales @66: nibble i%2 of byte i/2 for elements 16i..16i+15.
 *   IQ2_S  : d @0; qs[32] @2, signs[32] @34 (a full sign byte a group),
 *            qh[8] @66 (index bits 8-9 of group g: (qh[g/4] >> 2(g%4)) & 3),
 *            scales @74 as IQ2_XS's.
 *   IQ3_XXS: d @0; qs[64] @2 (one 4-value grid entry each); u32 w @66+4j:
 *            sign codes (w >> 7l) & 127 of group 4j+l, s = w >> 28
 *            (x = d*(0.5+s)/2 * grid * sign).
 *   IQ3_S  : d @0; qs[64] @2 with index bit 8 in qh[8] @66 (bit i%8 of
 *            qh[i/8] for entry i), signs[32] @74, scales[4] @106 (nibble
 *            j%2 of byte j/2: x = d*(1+2s) * grid * sign).
 *   IQ1_S  : d @0; qs[32] @2; u16 h[8] @34: group 4j+l's index is
 *            qs[4j+l] | ((h[j] >> 3l) & 7) << 8, s = (h[j] >> 12) & 7,
 *            delta -1/8 if bit 15 else +1/8 (x = d*(2s+1) * (grid+delta)).
 *   IQ1_M  : qs[32] @0; qh[16] @32: nibble n of group g = qh[g/2] >> 4(g%2),
 *            index qs[g] | (n & 7) << 8, delta -1/8 if n & 8; u16 sc[4] @48:
 *            3-bit scale i (elements 16i..) (sc[i/4] >> 3(i%4)) & 7, the f16
 *            d made of the four top nibbles (sc[0] lowest).
 */
#include "ie_kernels.h"
#include "../src/ie_kernels_isa.h"

#include <string.h>

static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Group g's 8 values from a grid entry and a sign byte. */
static void put8(int8_t *q, uint64_t grid, unsigned signs)
{
    for (int i = 0; i < 8; i++) {
        const int v = (int)((grid >> (8 * i)) & 0xff);
        q[i] = (int8_t)((signs >> i) & 1 ? -v : v);
    }
}

/* The same from two 4-value entries (IQ3). */
static void put8_2x4(int8_t *q, uint32_t g0, uint32_t g1, unsigned signs)
{
    put8(q, (uint64_t)g0 | (uint64_t)g1 << 32, signs);
}

/* IQ1: 8 * grid value (-1, 0, 1) + delta (+-1). */
static void put8_iq1(int8_t *q, uint64_t grid, int delta)
{
    for (int i = 0; i < 8; i++) q[i] = (int8_t)(8 * (int8_t)((grid >> (8 * i)) & 0xff) + delta);
}

/* f16 bits at p times 2^-e, exact (an f16 is a normal f32). */
static float d_scaled(uint16_t h, float mul) { return ie_f16_to_f32(h) * mul; }

int ie_iq_decode(ie_dtype_t t, const void *block, ie_iq_codes_t *c)
{
    const uint8_t *b = block;
    switch (t) {
    case IE_DTYPE_IQ2_XXS:
        c->d = d_scaled(ld16(b), 0.125f);
        for (int j = 0; j < 8; j++) {
            const uint32_t idx = ld32(b + 2 + 8 * j), w = ld32(b + 6 + 8 * j);
            c->sc[2 * j] = c->sc[2 * j + 1] = (int8_t)(2 * (w >> 28) + 1);
            for (int l = 0; l < 4; l++)
                put8(c->q + 32 * j + 8 * l, ie_iq2xxs_grid[(idx >> (8 * l)) & 0xff], ie_iq_signs(w >> (7 * l)));
        }
        return 0;
    case IE_DTYPE_IQ2_XS:
        c->d = d_scaled(ld16(b), 0.125f);
        for (int g = 0; g < 32; g++) {
            const unsigned v = ld16(b + 2 + 2 * g);
            put8(c->q + 8 * g, ie_iq2xs_grid[v & 511], ie_iq_signs(v >> 9));
        }
        for (int i = 0; i < 16; i++) c->sc[i] = (int8_t)(2 * ((b[66 + i / 2] >> (4 * (i % 2))) & 15) + 1);
        return 0;
    case IE_DTYPE_IQ2_S:
        c->d = d_scaled(ld16(b), 0.125f);
        for (int g = 0; g < 32; g++) {
            const unsigned idx = b[2 + g] | ((b[66 + g / 4] >> (2 * (g % 4))) & 3u) << 8;
            put8(c->q + 8 * g, ie_iq2s_grid[idx], b[34 + g]);
        }
        for (int i = 0; i < 16; i++) c->sc[i] = (int8_t)(2 * ((b[74 + i / 2] >> (4 * (i % 2))) & 15) + 1);
        return 0;
    case IE_DTYPE_IQ3_XXS:
        c->d = d_scaled(ld16(b), 0.25f);
        for (int j = 0; j < 8; j++) {
            const uint32_t w = ld32(b + 66 + 4 * j);
            c->sc[2 * j] = c->sc[2 * j + 1] = (int8_t)(2 * (w >> 28) + 1);
            for (int l = 0; l < 4; l++) {
                const uint8_t *qs = b + 2 + 8 * j + 2 * l;
                put8_2x4(c->q + 32 * j + 8 * l, ie_iq3xxs_grid[qs[0]], ie_iq3xxs_grid[qs[1]],
                         ie_iq_signs(w >> (7 * l)));
            }
        }
        return 0;
    case IE_DTYPE_IQ3_S:
        c->d = d_scaled(ld16(b), 1.0f);
        for (int g = 0; g < 32; g++) {
            const int i0 = 2 * g, i1 = 2 * g + 1;
            const unsigned x0 = b[2 + i0] | ((b[66 + i0 / 8] >> (i0 % 8)) & 1u) << 8;
            const unsigned x1 = b[2 + i1] | ((b[66 + i1 / 8] >> (i1 % 8)) & 1u) << 8;
            put8_2x4(c->q + 8 * g, ie_iq3s_grid[x0], ie_iq3s_grid[x1], b[74 + g]);
        }
        for (int i = 0; i < 16; i++) c->sc[i] = (int8_t)(2 * ((b[106 + i / 4] >> (4 * ((i / 2) % 2))) & 15) + 1);
        return 0;
    case IE_DTYPE_IQ1_S:
        c->d = d_scaled(ld16(b), 0.125f);
        for (int j = 0; j < 8; j++) {
            const unsigned h = ld16(b + 34 + 2 * j);
            const int delta = h & 0x8000u ? -1 : 1;
            c->sc[2 * j] = c->sc[2 * j + 1] = (int8_t)(2 * ((h >> 12) & 7) + 1);
            for (int l = 0; l < 4; l++)
                put8_iq1(c->q + 32 * j + 8 * l, ie_iq1s_grid[b[2 + 4 * j + l] | ((h >> (3 * l)) & 7u) << 8], delta);
        }
        return 0;
    case IE_DTYPE_IQ1_M: {
        uint16_t s[4];
        for (int i = 0; i < 4; i++) s[i] = ld16(b + 48 + 2 * i);
        c->d = d_scaled(ie_iq_block_d(t, b), 0.125f); /* d: the four scale words' top nibbles */
        for (int g = 0; g < 32; g++) {
            const unsigned n = (b[32 + g / 2] >> (4 * (g % 2))) & 15u;
            put8_iq1(c->q + 8 * g, ie_iq1s_grid[b[g] | (n & 7u) << 8], n & 8u ? -1 : 1);
        }
        for (int i = 0; i < 16; i++) c->sc[i] = (int8_t)(2 * ((s[i / 4] >> (3 * (i % 4))) & 7) + 1);
        return 0;
    }
    default: return -1;
    }
}

/* The f16 d of block b (IQ1_M's assembled from its nibbles). */
uint16_t ie_iq_block_d(ie_dtype_t t, const void *block)
{
    const uint8_t *b = block;
    if (t != IE_DTYPE_IQ1_M) return ld16(b);
    uint16_t s[4];
    for (int i = 0; i < 4; i++) s[i] = ld16(b + 48 + 2 * i);
    return (uint16_t)((s[0] >> 12) | ((s[1] >> 8) & 0x00f0) | ((s[2] >> 4) & 0x0f00) | (s[3] & 0xf000));
}

/* ------------------------------------------------------------ matmul */

#define TOK_GROUP 16

void ie_matmul_iq_q8_k_ref(ie_dtype_t t, const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a,
                           size_t as, int64_t n_tok, float *y, int64_t ldy)
{
    const size_t wrow = ie_dtype_row_bytes(t, n_in), bb = ie_dtype_block_bytes(t);
    const int64_t nb = n_in / IE_QK_K;
    ie_iq_codes_t c;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * wrow;
        for (int64_t t0 = 0; t0 < n_tok; t0 += TOK_GROUP) {
            const int nt = (int)(n_tok - t0 < TOK_GROUP ? n_tok - t0 : TOK_GROUP);
            double acc[TOK_GROUP] = {0};
            for (int64_t b = 0; b < nb; b++) {
                (void)ie_iq_decode(t, wr + (size_t)b * bb, &c);
                for (int i = 0; i < nt; i++) {
                    ie_block_q8_k_t q8;
                    memcpy(&q8, (const uint8_t *)a + (size_t)(t0 + i) * as + (size_t)b * sizeof q8, sizeof q8);
                    int32_t isum = 0; /* |.| <= 16 * 31 * 16 * 62 * 127: far below 2^31 */
                    for (int j = 0; j < IE_QK_K / 16; j++) {
                        int32_t sj = 0;
                        for (int k = 16 * j; k < 16 * j + 16; k++) sj += (int32_t)c.q[k] * (int32_t)q8.q[k];
                        isum += c.sc[j] * sj;
                    }
                    acc[i] += (double)((q8.d * c.d) * (float)isum);
                }
            }
            for (int i = 0; i < nt; i++) y[(t0 + i) * ldy + r] = (float)acc[i];
        }
    }
}

#define IE_IQ_MATMUL(name, type)                                                                            \
    void name(const void *w, int64_t n_in, int64_t r0, int64_t r1, const void *a, size_t as, int64_t n_tok, \
              float *y, int64_t ldy)                                                                        \
    {                                                                                                       \
        ie_matmul_iq_q8_k_ref(type, w, n_in, r0, r1, a, as, n_tok, y, ldy);                                 \
    }

IE_IQ_MATMUL(ie_matmul_iq2_xxs_q8_k_ref, IE_DTYPE_IQ2_XXS)
IE_IQ_MATMUL(ie_matmul_iq2_xs_q8_k_ref, IE_DTYPE_IQ2_XS)
IE_IQ_MATMUL(ie_matmul_iq2_s_q8_k_ref, IE_DTYPE_IQ2_S)
IE_IQ_MATMUL(ie_matmul_iq3_xxs_q8_k_ref, IE_DTYPE_IQ3_XXS)
IE_IQ_MATMUL(ie_matmul_iq3_s_q8_k_ref, IE_DTYPE_IQ3_S)
IE_IQ_MATMUL(ie_matmul_iq1_s_q8_k_ref, IE_DTYPE_IQ1_S)
IE_IQ_MATMUL(ie_matmul_iq1_m_q8_k_ref, IE_DTYPE_IQ1_M)

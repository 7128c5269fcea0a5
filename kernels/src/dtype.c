/* dtype.c — element-type table and scalar f16/bf16 conversions. */
#include "ie_dtype.h"

#include <string.h>

const int8_t ie_mxfp4_kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
const int8_t ie_iq4nl_kvalues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

int ie_dtype_is_kquant(ie_dtype_t t)
{
    switch (t) {
    case IE_DTYPE_Q5_0:
    case IE_DTYPE_Q5_1:
    case IE_DTYPE_IQ4_NL:
    case IE_DTYPE_Q2_K:
    case IE_DTYPE_Q3_K:
    case IE_DTYPE_Q4_K:
    case IE_DTYPE_Q5_K:
    case IE_DTYPE_Q6_K:
    case IE_DTYPE_IQ4_XS: return 1;
    default: return 0;
    }
}

int ie_dtype_is_iquant(ie_dtype_t t)
{
    switch (t) {
    case IE_DTYPE_IQ2_XXS:
    case IE_DTYPE_IQ2_XS:
    case IE_DTYPE_IQ2_S:
    case IE_DTYPE_IQ3_XXS:
    case IE_DTYPE_IQ3_S:
    case IE_DTYPE_IQ1_S:
    case IE_DTYPE_IQ1_M: return 1;
    default: return 0;
    }
}

const char *ie_dtype_name(ie_dtype_t t)
{
    switch (t) {
    case IE_DTYPE_F32: return "f32";
    case IE_DTYPE_F16: return "f16";
    case IE_DTYPE_BF16: return "bf16";
    case IE_DTYPE_Q4_0: return "q4_0";
    case IE_DTYPE_Q4_1: return "q4_1";
    case IE_DTYPE_Q8_0: return "q8_0";
    case IE_DTYPE_Q8_1: return "q8_1";
    case IE_DTYPE_MXFP4: return "mxfp4";
    case IE_DTYPE_Q5_0: return "q5_0";
    case IE_DTYPE_Q5_1: return "q5_1";
    case IE_DTYPE_IQ4_NL: return "iq4_nl";
    case IE_DTYPE_Q2_K: return "q2_K";
    case IE_DTYPE_Q3_K: return "q3_K";
    case IE_DTYPE_Q4_K: return "q4_K";
    case IE_DTYPE_Q5_K: return "q5_K";
    case IE_DTYPE_Q6_K: return "q6_K";
    case IE_DTYPE_Q8_K: return "q8_K";
    case IE_DTYPE_IQ4_XS: return "iq4_xs";
    case IE_DTYPE_IQ2_XXS: return "iq2_xxs";
    case IE_DTYPE_IQ2_XS: return "iq2_xs";
    case IE_DTYPE_IQ2_S: return "iq2_s";
    case IE_DTYPE_IQ3_XXS: return "iq3_xxs";
    case IE_DTYPE_IQ3_S: return "iq3_s";
    case IE_DTYPE_IQ1_S: return "iq1_s";
    case IE_DTYPE_IQ1_M: return "iq1_m";
    case IE_DTYPE_I8W: return "int8w";
    case IE_DTYPE_I4W: return "int4w";
    case IE_DTYPE_I4WA: return "int4w_affine";
    case IE_DTYPE_Q8_P: return "q8_p";
    case IE_DTYPE_Q16_P: return "q16_p";
    default: return "invalid";
    }
}

int ie_dtype_block_elems(ie_dtype_t t)
{
    switch (t) {
    case IE_DTYPE_F32:
    case IE_DTYPE_F16:
    case IE_DTYPE_BF16: return 1;
    case IE_DTYPE_Q4_0:
    case IE_DTYPE_Q4_1:
    case IE_DTYPE_Q8_0:
    case IE_DTYPE_Q8_1:
    case IE_DTYPE_MXFP4:
    case IE_DTYPE_Q5_0:
    case IE_DTYPE_Q5_1:
    case IE_DTYPE_IQ4_NL: return IE_QK;
    case IE_DTYPE_Q2_K:
    case IE_DTYPE_Q3_K:
    case IE_DTYPE_Q4_K:
    case IE_DTYPE_Q5_K:
    case IE_DTYPE_Q6_K:
    case IE_DTYPE_Q8_K:
    case IE_DTYPE_IQ4_XS: return IE_QK_K;
    default: return ie_dtype_is_iquant(t) ? IE_QK_K : 0;
    }
}

size_t ie_dtype_block_bytes(ie_dtype_t t)
{
    switch (t) {
    case IE_DTYPE_F32: return 4;
    case IE_DTYPE_F16:
    case IE_DTYPE_BF16: return 2;
    case IE_DTYPE_Q4_0: return sizeof(ie_block_q4_0_t);
    case IE_DTYPE_Q4_1: return sizeof(ie_block_q4_1_t);
    case IE_DTYPE_Q8_0: return sizeof(ie_block_q8_0_t);
    case IE_DTYPE_Q8_1: return sizeof(ie_block_q8_1_t);
    case IE_DTYPE_MXFP4: return sizeof(ie_block_mxfp4_t);
    case IE_DTYPE_Q5_0: return sizeof(ie_block_q5_0_t);
    case IE_DTYPE_Q5_1: return sizeof(ie_block_q5_1_t);
    case IE_DTYPE_IQ4_NL: return sizeof(ie_block_iq4_nl_t);
    case IE_DTYPE_Q2_K: return sizeof(ie_block_q2_k_t);
    case IE_DTYPE_Q3_K: return sizeof(ie_block_q3_k_t);
    case IE_DTYPE_Q4_K: return sizeof(ie_block_q4_k_t);
    case IE_DTYPE_Q5_K: return sizeof(ie_block_q5_k_t);
    case IE_DTYPE_Q6_K: return sizeof(ie_block_q6_k_t);
    case IE_DTYPE_Q8_K: return sizeof(ie_block_q8_k_t);
    case IE_DTYPE_IQ4_XS: return sizeof(ie_block_iq4_xs_t);
    case IE_DTYPE_IQ2_XXS: return 66;
    case IE_DTYPE_IQ2_XS: return 74;
    case IE_DTYPE_IQ2_S: return 82;
    case IE_DTYPE_IQ3_XXS: return 98;
    case IE_DTYPE_IQ3_S: return 110;
    case IE_DTYPE_IQ1_S: return 50;
    case IE_DTYPE_IQ1_M: return 56;
    default: return 0;
    }
}

const char *ie_layout_name(ie_layout_t l)
{
    switch (l) {
    case IE_LAYOUT_ROWS: return "rows";
    case IE_LAYOUT_PANEL16: return "panel16";
    case IE_LAYOUT_BSR: return "bsr";
    }
    return "invalid";
}

size_t ie_dtype_row_bytes(ie_dtype_t t, int64_t n)
{
    if (t == IE_DTYPE_Q8_P) return (n < 0 || n % IE_QK) ? 0 : (size_t)n + (size_t)(n / IE_QK) * 8;
    if (t == IE_DTYPE_Q16_P) return (n < 0 || n % IE_QK) ? 0 : (size_t)n * 2 + (size_t)(n / IE_QK) * 8;
    int be = ie_dtype_block_elems(t);
    if (be == 0 || n < 0 || n % be != 0) return 0;
    return (size_t)(n / be) * ie_dtype_block_bytes(t);
}

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float ie_f16_to_f32(ie_f16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

ie_f16_t ie_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (ie_f16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (ie_f16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* below smallest normal 2^-14: subnormal or 0 */
        /* value in units of 2^-24, rounded to nearest even */
        float v = bits_f32(ax) * 16777216.0f;
        uint32_t q = (uint32_t)v;
        float rem = v - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1))) q++;
        return (ie_f16_t)(sign | q);
    }
    uint32_t exp = ((ax >> 23) - 112) << 10;
    uint32_t man = (ax >> 13) & 0x3ff;
    uint32_t h = exp | man;
    uint32_t rest = ax & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (ie_f16_t)(sign | h);
}

float ie_bf16_to_f32(ie_bf16_t h) { return bits_f32((uint32_t)h << 16); }

ie_bf16_t ie_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (ie_bf16_t)((x >> 16) | 0x40); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1);
    return (ie_bf16_t)(x >> 16);
}

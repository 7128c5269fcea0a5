/* kvquant.c — the KV cache's storage types and the Walsh-Hadamard rotation.
 *
 * One KV head of hd values is encoded on its own (a position's row holds
 * its heads one after the other), so a head is read without touching its
 * neighbours and every block layout works unchanged. The minifloat codecs
 * (f16, fp8) are portable C: x86 has no FP8 instructions, and attention
 * decodes a head at a time into f32 (attention.c), where the wide loads of
 * the cache rather than the conversion set the cost.
 */
#include "worker_internal.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

static const char *const KV_NAMES[IE_KV_TYPE_COUNT] = {"f32", "f16", "bf16", "q8", "q4", "fp8_e4m3", "fp8_e5m2"};

/* Contract (ie_worker.h). */
const char *ie_kv_type_name(ie_kv_type_t t) { return (unsigned)t < IE_KV_TYPE_COUNT ? KV_NAMES[t] : "?"; }

/* Contract (ie_worker.h): llama.cpp's q8_0 / q4_0 spellings name ours. */
ie_status_t ie_kv_type_parse(const char *s, ie_kv_type_t *out)
{
    ie_status_t st = IE_ERR_INVAL;
    for (int i = 0; s && i < IE_KV_TYPE_COUNT; i++)
        if (!strcmp(s, KV_NAMES[i])) {
            *out = (ie_kv_type_t)i;
            st = IE_OK;
        }
    if (s && !strcmp(s, "q8_0")) *out = IE_KV_Q8, st = IE_OK;
    if (s && !strcmp(s, "q4_0")) *out = IE_KV_Q4, st = IE_OK;
    if (st != IE_OK)
        ie_error_set(IE_ERR_INVAL,
                     "unknown KV cache type '%s' (expected f32, f16, bf16, q8 (q8_0), q4 (q4_0), fp8_e4m3 or "
                     "fp8_e5m2)",
                     s ? s : "(null)");
    return st;
}

/* Contract (ie_worker.h). */
ie_status_t ie_kv_rotate_parse(const char *s, ie_kv_rotate_t *out)
{
    if (s && !strcmp(s, "auto")) *out = IE_KV_ROTATE_AUTO;
    else if (s && !strcmp(s, "on")) *out = IE_KV_ROTATE_ON;
    else if (s && !strcmp(s, "off")) *out = IE_KV_ROTATE_OFF;
    else return ie_error_set(IE_ERR_INVAL, "bad KV rotation '%s' (expected on, off or auto)", s ? s : "(null)");
    return IE_OK;
}

#define Q4_GROUP 32
#define Q4_GROUP_BYTES (2 + Q4_GROUP / 2) /* f16 scale, 32 nibbles */

/* Contract (ie_worker.h). */
size_t ie_kv_head_bytes(ie_kv_type_t t, int hd)
{
    if (hd <= 0) return 0;
    switch (t) {
    case IE_KV_F32: return (size_t)hd * 4;
    case IE_KV_F16:
    case IE_KV_BF16: return (size_t)hd * 2;
    case IE_KV_Q8: return (size_t)hd + 4;
    case IE_KV_Q4: return hd % Q4_GROUP ? 0 : (size_t)(hd / Q4_GROUP) * Q4_GROUP_BYTES;
    case IE_KV_FP8_E4M3:
    case IE_KV_FP8_E5M2: return (size_t)hd;
    default: return 0;
    }
}

/* Contract (worker_internal.h). */
int kvq_rotates(ie_kv_type_t t, ie_kv_rotate_t r)
{
    if (r == IE_KV_ROTATE_OFF) return 0;
    if (r == IE_KV_ROTATE_ON) return 1;
    return t == IE_KV_Q8 || t == IE_KV_Q4 || t == IE_KV_FP8_E4M3 || t == IE_KV_FP8_E5M2;
}

/* ----------------------------------------------------------- minifloats */

/* A binary float of 1 sign, eb exponent and mb mantissa bits (bias
 * 2^(eb-1) - 1), rounded to nearest even and saturated to the largest
 * finite code maxc (e4m3 has no infinity; saturating e5m2 and f16 too keeps
 * a stray large value finite in the softmax). NaN stays NaN only where the
 * format has one at all; the cache never holds one from a finite model. */
static uint32_t mini_encode(float x, int eb, int mb, uint32_t maxc)
{
    const int bias = (1 << (eb - 1)) - 1;
    const uint32_t sign = signbit(x) ? 1u << (eb + mb) : 0;
    const float a = fabsf(x);
    if (!(a == a)) return sign | maxc; /* NaN: the format's largest */
    /* smallest normal 2^(1-bias); below it steps of 2^(1-bias-mb) */
    const float min_norm = ldexpf(1.0f, 1 - bias);
    uint32_t code;
    if (a < min_norm) {
        /* a count of the subnormal step; one step past the last subnormal
         * is the first normal's code (exponent 1, mantissa 0) */
        code = (uint32_t)rintf(ldexpf(a, bias - 1 + mb));
    } else {
        int e;
        const float f = frexpf(a, &e); /* a = f 2^e, f in [0.5, 1) */
        uint32_t m = (uint32_t)rintf((2.0f * f - 1.0f) * (float)(1 << mb));
        int be = e - 1 + bias;
        if (m == (1u << mb)) m = 0, be++;
        code = be >= (1 << eb) ? maxc : ((uint32_t)be << mb) | m;
    }
    return sign | (code > maxc ? maxc : code);
}

static float mini_decode(uint32_t c, int eb, int mb)
{
    const int bias = (1 << (eb - 1)) - 1;
    const uint32_t e = (c >> mb) & ((1u << eb) - 1), m = c & ((1u << mb) - 1);
    const float a = e == 0 ? ldexpf((float)m, 1 - bias - mb)
                           : ldexpf(1.0f + (float)m / (float)(1 << mb), (int)e - bias);
    return (c >> (eb + mb)) & 1 ? -a : a;
}

static float fp8_tab[2][256]; /* e4m3, e5m2 */
static pthread_once_t fp8_once = PTHREAD_ONCE_INIT;
static void fp8_init(void)
{
    for (int c = 0; c < 256; c++) {
        fp8_tab[0][c] = mini_decode((uint32_t)c, 4, 3);
        fp8_tab[1][c] = mini_decode((uint32_t)c, 5, 2);
    }
}

static inline float f16_decode(uint16_t h)
{
    uint32_t e = (h >> 10) & 31, m = h & 1023, s = (uint32_t)(h >> 15) << 31, u;
    float f;
    if (e == 0) {
        f = (float)m * (1.0f / 16777216.0f); /* m 2^-24 */
        return s ? -f : f;
    }
    u = s | ((e + 112) << 23) | (m << 13); /* 112 = 127 - 15; e 31 only saturated codes never made */
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t bf16_encode(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static inline float bf16_decode(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ------------------------------------------------------------- encode */

/* Contract (worker_internal.h). */
void kvq_encode(ie_kv_type_t t, const float *x, int hd, void *dst)
{
    unsigned char *o = dst;
    switch (t) {
    case IE_KV_F32: memcpy(o, x, (size_t)hd * 4); break;
    case IE_KV_F16:
        for (int i = 0; i < hd; i++) {
            const uint16_t h = (uint16_t)mini_encode(x[i], 5, 10, 0x7bff);
            memcpy(o + 2 * i, &h, 2);
        }
        break;
    case IE_KV_BF16:
        for (int i = 0; i < hd; i++) {
            const uint16_t h = bf16_encode(x[i]);
            memcpy(o + 2 * i, &h, 2);
        }
        break;
    case IE_KV_Q8: {
        float amax = 0.0f;
        for (int i = 0; i < hd; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        memcpy(o, &d, 4);
        for (int i = 0; i < hd; i++) o[4 + i] = (unsigned char)(int8_t)lrintf(x[i] * id);
        break;
    }
    case IE_KV_Q4:
        /* q4_0: d = (the value of largest magnitude) / -8, codes
         * round(x / d) + 8 clamped to 0..15 */
        for (int g = 0; g < hd / Q4_GROUP; g++, o += Q4_GROUP_BYTES) {
            const float *xg = x + g * Q4_GROUP;
            float amax = 0.0f, mx = 0.0f;
            for (int i = 0; i < Q4_GROUP; i++)
                if (fabsf(xg[i]) > amax) amax = fabsf(xg[i]), mx = xg[i];
            const uint16_t dh = (uint16_t)mini_encode(mx / -8.0f, 5, 10, 0x7bff);
            const float d = f16_decode(dh), id = d != 0.0f ? 1.0f / d : 0.0f;
            memcpy(o, &dh, 2);
            for (int i = 0; i < Q4_GROUP / 2; i++) {
                const float a = xg[i] * id + 8.5f, b = xg[i + Q4_GROUP / 2] * id + 8.5f;
                const int qa = a < 0.0f ? 0 : a > 15.0f ? 15 : (int)a;
                const int qb = b < 0.0f ? 0 : b > 15.0f ? 15 : (int)b;
                o[2 + i] = (unsigned char)(qa | qb << 4);
            }
        }
        break;
    case IE_KV_FP8_E4M3:
        for (int i = 0; i < hd; i++) o[i] = (unsigned char)mini_encode(x[i], 4, 3, 0x7e);
        break;
    case IE_KV_FP8_E5M2:
        for (int i = 0; i < hd; i++) o[i] = (unsigned char)mini_encode(x[i], 5, 2, 0x7b);
        break;
    default: break;
    }
}

/* ------------------------------------------------------------- decode */

/* Contract (worker_internal.h). */
void kvq_decode(ie_kv_type_t t, const void *src, int hd, float *y)
{
    const unsigned char *s = src;
    switch (t) {
    case IE_KV_F32: memcpy(y, s, (size_t)hd * 4); break;
    case IE_KV_F16:
        for (int i = 0; i < hd; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            y[i] = f16_decode(h);
        }
        break;
    case IE_KV_BF16:
        for (int i = 0; i < hd; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            y[i] = bf16_decode(h);
        }
        break;
    case IE_KV_Q8: {
        float d;
        memcpy(&d, s, 4);
        const int8_t *q = (const int8_t *)(s + 4);
        for (int i = 0; i < hd; i++) y[i] = d * (float)q[i];
        break;
    }
    case IE_KV_Q4:
        for (int g = 0; g < hd / Q4_GROUP; g++, s += Q4_GROUP_BYTES, y += Q4_GROUP) {
            uint16_t dh;
            memcpy(&dh, s, 2);
            const float d = f16_decode(dh);
            for (int i = 0; i < Q4_GROUP / 2; i++) {
                y[i] = d * (float)((s[2 + i] & 15) - 8);
                y[i + Q4_GROUP / 2] = d * (float)((s[2 + i] >> 4) - 8);
            }
        }
        break;
    case IE_KV_FP8_E4M3:
    case IE_KV_FP8_E5M2: {
        pthread_once(&fp8_once, fp8_init);
        const float *tab = fp8_tab[t == IE_KV_FP8_E5M2];
        for (int i = 0; i < hd; i++) y[i] = tab[s[i]];
        break;
    }
    default: break;
    }
}

/* ------------------------------------------------------------- rotation */

/* Contract (worker_internal.h): in-place butterflies, log2(p) passes over
 * each block of p = the largest power of two dividing hd; scaled by
 * 1/sqrt(p) so the transform is orthonormal (and its own inverse). */
void kvq_fwht(float *x, int hd)
{
    const int p = hd & -hd;
    const float norm = 1.0f / sqrtf((float)p);
    for (int b = 0; b < hd; b += p) {
        float *v = x + b;
        for (int len = 1; len < p; len <<= 1)
            for (int i = 0; i < p; i += 2 * len)
                for (int j = i; j < i + len; j++) {
                    const float a = v[j], c = v[j + len];
                    v[j] = a + c;
                    v[j + len] = a - c;
                }
        for (int i = 0; i < p; i++) v[i] *= norm;
    }
}

/* ------------------------------------------------ AVX-512 decode (twins) */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVQ_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,avx2,fma")))

/* Contract (worker_internal.h): kvq_decode's bits, 16 values a step (f16
 * and the FP8 table are exact conversions, q8/q4 the same product). */
KVQ_AVX512 void kvq_decode_avx512(ie_kv_type_t t, const void *src, int hd, float *y)
{
    const unsigned char *s = src;
    int i = 0;
    switch (t) {
    case IE_KV_F16:
        for (; i + 16 <= hd; i += 16)
            _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 2 * i))));
        break;
    case IE_KV_BF16:
        for (; i + 16 <= hd; i += 16) {
            const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + 2 * i)));
            _mm512_storeu_ps(y + i, _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)));
        }
        break;
    case IE_KV_Q8: {
        float d;
        memcpy(&d, s, 4);
        const __m512 vd = _mm512_set1_ps(d);
        for (; i + 16 <= hd; i += 16) {
            const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + 4 + i)));
            _mm512_storeu_ps(y + i, _mm512_mul_ps(vd, _mm512_cvtepi32_ps(q)));
        }
        for (; i < hd; i++) y[i] = d * (float)(int8_t)s[4 + i];
        return;
    }
    case IE_KV_Q4: {
        const __m512i eight = _mm512_set1_epi32(8), lo4 = _mm512_set1_epi32(15);
        for (int g = 0; g < hd / Q4_GROUP; g++, s += Q4_GROUP_BYTES, y += Q4_GROUP) {
            uint16_t dh;
            memcpy(&dh, s, 2);
            const __m512 vd = _mm512_set1_ps(f16_decode(dh));
            const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(s + 2)));
            const __m512i qa = _mm512_sub_epi32(_mm512_and_si512(b, lo4), eight);
            const __m512i qb = _mm512_sub_epi32(_mm512_srli_epi32(b, 4), eight);
            _mm512_storeu_ps(y, _mm512_mul_ps(vd, _mm512_cvtepi32_ps(qa)));
            _mm512_storeu_ps(y + Q4_GROUP / 2, _mm512_mul_ps(vd, _mm512_cvtepi32_ps(qb)));
        }
        return;
    }
    case IE_KV_FP8_E4M3:
    case IE_KV_FP8_E5M2: {
        pthread_once(&fp8_once, fp8_init);
        const float *tab = fp8_tab[t == IE_KV_FP8_E5M2];
        for (; i + 16 <= hd; i += 16) {
            const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
            _mm512_storeu_ps(y + i, _mm512_i32gather_ps(c, tab, 4));
        }
        break;
    }
    default: break;
    }
    if (i < hd) { /* the tail (hd not a multiple of 16): the scalar loop */
        float tail[16];
        const size_t per = t == IE_KV_F16 || t == IE_KV_BF16 ? 2 : t == IE_KV_F32 ? 4 : 1;
        if (t == IE_KV_F32) {
            memcpy(y, s, (size_t)hd * 4);
            return;
        }
        kvq_decode(t, s + per * (size_t)i, hd - i, tail);
        memcpy(y + i, tail, (size_t)(hd - i) * sizeof(float));
    }
}
#else
void kvq_decode_avx512(ie_kv_type_t t, const void *src, int hd, float *y) { kvq_decode(t, src, hd, y); }
#endif

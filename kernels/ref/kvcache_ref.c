/* kvcache_ref.c — the KV cache codecs and the scalar loops over a typed
 * cache (ie_kvcache.h), the oracle of the SIMD twins.
 *
 * The minifloat codecs (f16, fp8) are portable C: x86 has no FP8
 * instructions. Scores and values sum in double over the decoded values,
 * except a q8 K cache, whose scores are defined on integers (the int16
 * query against the int8 row, an exact int32 sum, then
 * ((float)dot * row scale) * (query scale * scale)): every ISA computes
 * that same expression, so q8 scores agree bit for bit.
 */
#include "../src/ie_kernels_isa.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#define Q4_GROUP 32
#define Q4_GROUP_BYTES (2 + Q4_GROUP / 2) /* f16 scale, 32 nibbles */

/* Contract (ie_kvcache.h). */
size_t ie_kv_head_bytes(ie_kv_type_t t, int hd)
{
    if (hd <= 0 || (t != IE_KV_F32 && hd > IE_KV_MAX_HD)) return 0;
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

/* ----------------------------------------------------------- minifloats */

/* A binary float of 1 sign, eb exponent and mb mantissa bits (bias
 * 2^(eb-1) - 1), rounded to nearest even and saturated to the largest
 * finite code maxc (e4m3 has no infinity; saturating e5m2 and f16 too keeps
 * a stray large value finite in the softmax). NaN becomes the largest code:
 * the cache never holds one from a finite model. */
static uint32_t mini_encode(float x, int eb, int mb, uint32_t maxc)
{
    const int bias = (1 << (eb - 1)) - 1;
    const uint32_t sign = signbit(x) ? 1u << (eb + mb) : 0;
    const float a = fabsf(x);
    if (!(a == a)) return sign | maxc;
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

/* Contract (ie_kvcache.h). */
void ie_kv_encode(ie_kv_type_t t, const float *x, int hd, void *dst)
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
        const float d = amax / 127.0f, id = ie_inv_scale(d);
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
            const float d = f16_decode(dh), id = ie_inv_scale(d);
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

/* Contract (ie_kernels_isa.h). */
void ie_kv_decode_ref(ie_kv_type_t t, const void *src, int hd, float *y)
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

/* Contract (ie_kvcache.h). */
void ie_kv_quantize_q16(const float *q, int hd, int16_t *qi, float *d_out)
{
    float amax = 0.0f;
    for (int i = 0; i < hd; i++) amax = fabsf(q[i]) > amax ? fabsf(q[i]) : amax;
    const float d = amax / 32767.0f, id = ie_inv_scale(d);
    for (int i = 0; i < hd; i++) {
        const long v = lrintf(q[i] * id);
        qi[i] = (int16_t)(v > 32767 ? 32767 : v < -32767 ? -32767 : v);
    }
    for (int i = hd; i < (hd + 31) / 32 * 32; i++) qi[i] = 0;
    *d_out = d;
}

/* The exact int32 dot of a quantized query head and a q8 row. */
static int32_t q8_dot(const int16_t *qi, const int8_t *k, int hd)
{
    int32_t acc = 0;
    for (int i = 0; i < hd; i++) acc += (int32_t)qi[i] * (int32_t)k[i];
    return acc;
}

/* Contract (ie_kernels_t.kv_scores). */
void ie_kv_scores_ref(ie_kv_type_t t, const float *q, size_t q_stride, int nh, const ie_kv_rows_t *k, int j0, int n,
                      int hd, float scale, float *s, size_t ld)
{
    float kf[IE_KV_MAX_HD];
    int16_t qi[IE_KV_MAX_HD];
    for (int h = 0; h < nh; h++) {
        const float *qh = q + (size_t)h * q_stride;
        float dq = 0.0f;
        if (t == IE_KV_Q8) ie_kv_quantize_q16(qh, hd, qi, &dq);
        const float qs = dq * scale;
        ie_kv_cursor_t c;
        ie_kv_cursor_init(&c, k, j0);
        for (int j = 0; j < n; j++) {
            const unsigned char *row = ie_kv_cursor_next(&c);
            if (t == IE_KV_Q8) {
                float dk;
                memcpy(&dk, row, 4);
                s[(size_t)h * ld + j] = ((float)q8_dot(qi, (const int8_t *)(row + 4), hd) * dk) * qs;
                continue;
            }
            ie_kv_decode_ref(t, row, hd, kf);
            double acc = 0.0;
            for (int i = 0; i < hd; i++) acc += (double)qh[i] * (double)kf[i];
            s[(size_t)h * ld + j] = (float)acc * scale;
        }
    }
}

/* Contract (ie_kernels_t.kv_values). */
void ie_kv_values_ref(ie_kv_type_t t, const float *p, size_t ld, int nh, const ie_kv_rows_t *v, int j0, int n,
                      int hd, float *out, size_t o_stride)
{
    double acc[IE_KV_MAX_HD];
    float vf[IE_KV_MAX_HD];
    for (int h = 0; h < nh; h++) {
        const float *ph = p + (size_t)h * ld;
        for (int i = 0; i < hd; i++) acc[i] = 0.0;
        ie_kv_cursor_t c;
        ie_kv_cursor_init(&c, v, j0);
        for (int j = 0; j < n; j++) {
            ie_kv_decode_ref(t, ie_kv_cursor_next(&c), hd, vf);
            for (int i = 0; i < hd; i++) acc[i] += (double)ph[j] * (double)vf[i];
        }
        for (int i = 0; i < hd; i++) out[(size_t)h * o_stride + i] = (float)acc[i];
    }
}

/* Contract (ie_kernels_t.kv_attend): a head at a time, tiles of 16 rows,
 * each score as kv_scores_ref makes it, exp and the sums in double. */
void ie_kv_attend_ref(const ie_kv_attend_t *a, const ie_attn_state_t *st)
{
    const int hd = a->hd;
    float kf[IE_KV_MAX_HD], vf[IE_KV_MAX_HD], s[16];
    int16_t qi[IE_KV_MAX_HD];
    double acc[IE_KV_MAX_HD];
    for (int h = 0; h < a->nh; h++) {
        const float *qh = a->q + (size_t)h * a->q_stride;
        float dq = 0.0f;
        if (a->kt == IE_KV_Q8) ie_kv_quantize_q16(qh, hd, qi, &dq);
        const float qs = dq * a->scale;
        double m = -INFINITY, l = 0.0;
        for (int i = 0; i < hd; i++) acc[i] = 0.0;
        ie_kv_cursor_t ck, cv;
        ie_kv_cursor_init(&ck, a->k, a->kj);
        ie_kv_cursor_init(&cv, a->v, a->vj);
        for (int t = 0; t < a->n; t += 16) {
            const int nr = a->n - t < 16 ? a->n - t : 16;
            double tmax = -INFINITY;
            for (int r = 0; r < nr; r++) {
                const unsigned char *row = ie_kv_cursor_next(&ck);
                if (a->kt == IE_KV_Q8) {
                    float dk;
                    memcpy(&dk, row, 4);
                    s[r] = ((float)q8_dot(qi, (const int8_t *)(row + 4), hd) * dk) * qs;
                } else {
                    ie_kv_decode_ref(a->kt, row, hd, kf);
                    double d = 0.0;
                    for (int i = 0; i < hd; i++) d += (double)qh[i] * (double)kf[i];
                    s[r] = (float)d * a->scale;
                }
                if (a->add) s[r] += a->add[h];
                if (a->cap != 0.0f) s[r] = a->cap * tanhf(s[r] * (1.0f / a->cap));
                tmax = s[r] > tmax ? s[r] : tmax;
            }
            const double mn = tmax > m ? tmax : m, c = l > 0.0 ? exp(m - mn) : 0.0;
            l *= c;
            for (int i = 0; i < hd; i++) acc[i] *= c;
            for (int r = 0; r < nr; r++) {
                const double p = exp((double)s[r] - mn);
                l += p;
                ie_kv_decode_ref(a->vt, ie_kv_cursor_next(&cv), hd, vf);
                for (int i = 0; i < hd; i++) acc[i] += p * (double)vf[i];
            }
            m = mn;
        }
        st->m[h] = (float)m;
        st->l[h] = (float)l;
        for (int i = 0; i < hd; i++) st->o[(size_t)h * st->os + i] = (float)acc[i];
    }
}

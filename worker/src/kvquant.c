/* kvquant.c — the KV cache types' names and the Walsh-Hadamard rotation.
 *
 * The codecs and the attention loops over a typed cache are kernels
 * (kernels/include/ie_kvcache.h, kernels/ref/kvcache_ref.c and its SIMD
 * twins); this file holds what the worker and the CLI parse and the
 * rotation applied before a head is encoded.
 */
#include "worker_internal.h"

#include <math.h>
#include <stdlib.h>
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

/* Contract (worker_internal.h). */
int kvq_rotates(ie_kv_type_t t, ie_kv_rotate_t r)
{
    if (r == IE_KV_ROTATE_OFF) return 0;
    if (r == IE_KV_ROTATE_ON) return 1;
    return t == IE_KV_Q8 || t == IE_KV_Q4 || t == IE_KV_FP8_E4M3 || t == IE_KV_FP8_E5M2;
}

/* Contract (worker_internal.h). */
int kvq_smooths(ie_kv_type_t t, int c)
{
    const char *e = getenv("IE_KV_SMOOTH");
    const int q4 = t == IE_KV_Q4, fp8 = t == IE_KV_FP8_E4M3 || t == IE_KV_FP8_E5M2;
    if (!e || !*e) return c == 0 && q4;
    if (!strcmp(e, "k")) return c == 0 && (q4 || fp8);
    if (!strcmp(e, "kv")) return q4 || fp8;
    return 0;
}

/* Contract (worker_internal.h). */
int kvq_recent(ie_kv_type_t t)
{
    const char *e = getenv("IE_KV_RECENT");
    if (e && !strcmp(e, "all")) return t != IE_KV_F32;
    return (t == IE_KV_Q4 || t == IE_KV_FP8_E4M3) && !(e && !strcmp(e, "0"));
}

/* Contract (worker_internal.h). */
int kvq_recent_len(void)
{
    const char *e = getenv("IE_KV_RECENT_W");
    char *end = NULL;
    const long n = e && *e ? strtol(e, &end, 10) : 0;
    return end && !*end && n >= 1 && n <= 4096 ? (int)n : KVQ_RECENT;
}

/* Contract (worker_internal.h). */
int kvq_sinks(void)
{
    const char *e = getenv("IE_KV_SINKS");
    char *end = NULL;
    const long n = e && *e ? strtol(e, &end, 10) : -1;
    return end && !*end && n >= 0 && n <= 256 ? (int)n : KVQ_SINKS;
}

/* Contract (worker_internal.h). */
void kvq_mean(const ie_kernels_t *ops, ie_kv_type_t t, const ie_kv_rows_t *rows, int hd, float *m)
{
    double acc[IE_KV_MAX_HD];
    float row[IE_KV_MAX_HD];
    for (int i = 0; i < hd; i++) acc[i] = 0.0;
    ie_kv_cursor_t c;
    ie_kv_cursor_init(&c, rows, 0);
    for (int j = 0; j < KVQ_SMOOTH_ROWS; j++) {
        ops->kv_decode(t, ie_kv_cursor_next(&c), hd, row);
        for (int i = 0; i < hd; i++) acc[i] += row[i];
    }
    for (int i = 0; i < hd; i++) m[i] = (float)(acc[i] / KVQ_SMOOTH_ROWS);
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

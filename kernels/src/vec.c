/* vec.c — the portable arg max and memory stream. */
#include "ie_kernels_isa.h"

#include <math.h>
#include <string.h>

typedef float argmax_v4 __attribute__((vector_size(16)));
typedef int32_t argmax_m4 __attribute__((vector_size(16)));

/* Contract (ie_kernels.h). A lane takes x only when x > its value, so NaN
 * never enters and -inf never replaces; the first index equal to the
 * maximum is what a scalar "first strict maximum" scan returns. */
int64_t ie_argmax_f32(const float *x, int64_t n, float *max_out)
{
    const argmax_v4 ninf = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    argmax_v4 m[4] = {ninf, ninf, ninf, ninf};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; k++) {
            argmax_v4 v;
            memcpy(&v, x + i + 4 * k, sizeof v);
            const argmax_m4 gt = v > m[k];
            m[k] = (argmax_v4)(((argmax_m4)v & gt) | ((argmax_m4)m[k] & ~gt));
        }
    float best = -INFINITY;
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 4; j++)
            if (m[k][j] > best) best = m[k][j];
    for (; i < n; i++)
        if (x[i] > best) best = x[i];
    int64_t at = -1;
    if (best > -INFINITY)
        for (int64_t j = 0; j < n; j++)
            if (x[j] == best) {
                at = j;
                break;
            }
    if (max_out) *max_out = best;
    return at;
}

typedef uint64_t stream_v2 __attribute__((vector_size(16)));

/* Contract (ie_kernels.h). Four independent accumulators keep the loads free
 * of a dependency chain. */
uint64_t ie_stream_read(const void *p, size_t n)
{
    const unsigned char *b = p;
    stream_v2 a[4] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int k = 0; k < 4; k++) {
            stream_v2 v;
            memcpy(&v, b + i + 16 * k, sizeof v);
            a[k] ^= v;
        }
    const stream_v2 s = a[0] ^ a[1] ^ a[2] ^ a[3];
    uint64_t r = s[0] ^ s[1];
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        r ^= w;
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, b + i, n - i);
        r ^= w;
    }
    return r;
}

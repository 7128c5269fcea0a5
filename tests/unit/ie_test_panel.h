/* ie_test_panel.h — an independent reading of the PANEL16 weight layout
 * (ie_pack.h) for the packed-GEMM oracles of test_pack and test_amx
 * (test-only, header: each suite is its own executable). */
#ifndef IE_TEST_PANEL_H
#define IE_TEST_PANEL_H

#include <stdint.h>
#include <string.h>

#include "ie_dtype.h"
#include "ie_pack.h"

/* Group g of row r's panel: its f16 scales (and offsets) then codes. */
static inline const uint8_t *pgroup(const ie_pmat_t *m, int64_t r, int64_t g)
{
    const size_t sb = m->dtype == IE_DTYPE_I4WA ? 4 : 2;
    const size_t qb = m->dtype == IE_DTYPE_I8W ? (size_t)m->group : (size_t)m->group / 2;
    return (const uint8_t *)m->data + (size_t)(r / 16) * ie_pack_panel_bytes(m->dtype, m->group, m->n_in) +
           (size_t)g * 16 * (sb + qb);
}

/* The f16 scale (which 0) or offset (which 1, I4WA) of row r, group g. */
static inline float p_scale(const ie_pmat_t *m, int64_t r, int64_t g, int which)
{
    ie_f16_t h;
    memcpy(&h, pgroup(m, r, g) + 32 * which + 2 * (r % 16), 2);
    return ie_f16_to_f32(h);
}

/* The stored code of element k of row r (I8W: q + 128; 4-bit: the nibble). */
static inline int p_code(const ie_pmat_t *m, int64_t r, int64_t k)
{
    const int64_t g = k / m->group, kk = k % m->group, i = r % 16;
    const uint8_t *q = pgroup(m, r, g) + (m->dtype == IE_DTYPE_I4WA ? 64 : 32);
    if (m->dtype == IE_DTYPE_I8W) return q[(kk / 4) * 64 + 4 * i + kk % 4];
    const uint8_t b = q[(kk / 8) * 64 + 4 * i + kk % 4];
    return (kk % 8) < 4 ? (b & 15) : (b >> 4);
}

/* The signed value of that code (I8W byte - 128, I4W nibble - 8, I4WA
 * the nibble). */
static inline int p_value(const ie_pmat_t *m, int64_t r, int64_t k)
{
    const int u = p_code(m, r, k);
    return m->dtype == IE_DTYPE_I8W ? u - 128 : m->dtype == IE_DTYPE_I4W ? u - 8 : u;
}

#endif

/* tokenizer_nfc.c — Unicode Normalization Form C for tokenizer.json's
 * "NFC" normalizer (Qwen2, Command-R, MPT / GPT-NeoX).
 *
 * The standard three steps (UAX #15): full canonical decomposition,
 * canonical ordering of combining marks, canonical composition; Hangul
 * syllables algorithmically, everything else from the tables that
 * scripts/gen_nfc_table.py generates (tokenizer_nfc_table.h). Text whose
 * code points are all below U+0300 is already NFC (nothing there has a
 * decomposition, a combining class or a composition partner), which is
 * the common case and costs one scan.
 */
#include "tokenizer_internal.h"
#include "tokenizer_nfc_table.h"

#include <stdlib.h>
#include <string.h>

enum {
    S_BASE = 0xAC00,
    L_BASE = 0x1100,
    V_BASE = 0x1161,
    T_BASE = 0x11A7,
    L_COUNT = 19,
    V_COUNT = 21,
    T_COUNT = 28,
    N_COUNT = V_COUNT * T_COUNT,
    S_COUNT = L_COUNT * N_COUNT
};

static int ccc_of(uint32_t cp)
{
    if (cp < 0x300) { return 0; }
    size_t lo = 0, hi = sizeof NFC_CCC / sizeof NFC_CCC[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (NFC_CCC[mid][0] < cp) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < sizeof NFC_CCC / sizeof NFC_CCC[0] && NFC_CCC[lo][0] == cp ? (int)NFC_CCC[lo][1] : 0;
}

/* Full canonical decomposition of cp into out[0..4); returns the count. */
static size_t decompose(uint32_t cp, uint32_t *out)
{
    if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
        uint32_t si = cp - S_BASE;
        out[0] = L_BASE + si / N_COUNT;
        out[1] = V_BASE + (si % N_COUNT) / T_COUNT;
        if (si % T_COUNT == 0) { return 2; }
        out[2] = T_BASE + si % T_COUNT;
        return 3;
    }
    if (cp >= 0xC0) {
        size_t lo = 0, hi = sizeof NFC_DECOMP / sizeof NFC_DECOMP[0];
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (NFC_DECOMP[mid][0] < cp) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if (lo < sizeof NFC_DECOMP / sizeof NFC_DECOMP[0] && NFC_DECOMP[lo][0] == cp) {
            size_t n = 0;
            while (n < 4 && NFC_DECOMP[lo][1 + n]) {
                out[n] = NFC_DECOMP[lo][1 + n];
                n++;
            }
            return n;
        }
    }
    out[0] = cp;
    return 1;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT) {
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    }
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT) {
        return a + (b - T_BASE);
    }
    size_t lo = 0, hi = sizeof NFC_COMP / sizeof NFC_COMP[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (NFC_COMP[mid][0] < a || (NFC_COMP[mid][0] == a && NFC_COMP[mid][1] < b)) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo < sizeof NFC_COMP / sizeof NFC_COMP[0] && NFC_COMP[lo][0] == a && NFC_COMP[lo][1] == b) {
        return NFC_COMP[lo][2];
    }
    return 0;
}

/* Decode one code point of valid UTF-8 at s[*i], advancing *i. */
static uint32_t next_cp(const unsigned char *s, size_t *i)
{
    unsigned char c = s[*i];
    int n = ie_tok_utf8_len(c);
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1Fu : n == 3 ? c & 0x0Fu : c & 0x07u;
    for (int k = 1; k < n; k++) { cp = (cp << 6) | (s[*i + (size_t)k] & 0x3Fu); }
    *i += (size_t)n;
    return cp;
}

static size_t put_cp(char *d, uint32_t cp)
{
    unsigned char *o = (unsigned char *)d;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

int ie_tok_nfc_needed(const char *s, size_t len)
{
    /* U+0300 is the first code point NFC can touch; its lead byte is 0xCC
     * and every larger code point's lead byte is >= 0xCC too */
    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)s[i] >= 0xCC) { return 1; }
    }
    return 0;
}

ie_status_t ie_tok_nfc(const char *src, size_t len, char **buf, size_t *cap, size_t *out_len)
{
    ie_status_t st = IE_OK;
    uint32_t *cps = NULL;
    *out_len = 0;
    /* at most len code points, each decomposing to at most 4 */
    if (len > SIZE_MAX / (4 * sizeof *cps) - 1) { return ie_error_set(IE_ERR_RANGE, "tokenizer: text too long"); }
    cps = malloc((4 * len + 1) * sizeof *cps);
    if (!cps) { return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory"); }

    /* 1. decompose */
    const unsigned char *s = (const unsigned char *)src;
    size_t m = 0;
    for (size_t i = 0; i < len;) { m += decompose(next_cp(s, &i), cps + m); }

    /* 2. canonical ordering: stable insertion sort of each run of marks */
    for (size_t i = 1; i < m; i++) {
        int c = ccc_of(cps[i]);
        if (c == 0) { continue; }
        uint32_t x = cps[i];
        size_t j = i;
        while (j > 0) {
            int p = ccc_of(cps[j - 1]);
            if (p == 0 || p <= c) { break; }
            cps[j] = cps[j - 1];
            j--;
        }
        cps[j] = x;
    }

    /* 3. compose: a mark joins the last starter unless something between
     * them is a starter or has a class >= its own (it is "blocked") */
    size_t o = 0;
    long starter = -1;
    int last_ccc = 0;
    for (size_t i = 0; i < m; i++) {
        uint32_t c = cps[i];
        int cc = ccc_of(c);
        if (starter >= 0) {
            int adjacent = (size_t)starter == o - 1;
            if (adjacent || (last_ccc != 0 && last_ccc < cc)) {
                uint32_t p = compose(cps[starter], c);
                if (p) {
                    cps[starter] = p;
                    continue;
                }
            }
        }
        if (cc == 0) { starter = (long)o; }
        last_ccc = cc;
        cps[o++] = c;
    }

    /* 4. encode */
    size_t need = 4 * o + 1;
    if (need > *cap) {
        char *nb = realloc(*buf, need);
        if (!nb) {
            st = ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
            goto cleanup;
        }
        *buf = nb;
        *cap = need;
    }
    size_t w = 0;
    for (size_t i = 0; i < o; i++) { w += put_cp(*buf + w, cps[i]); }
    *out_len = w;

cleanup:
    free(cps);
    return st;
}

/* tokenizer_pretok.c — pre-tokenizer steps, UTF-8 and byte-level helpers.
 *
 * A pre-tokenizer is a list of steps; each step splits every current piece
 * with one PCRE2 regex and a Hugging Face SplitDelimiterBehavior. GPT-2's
 * ByteLevel is the GPT-2 regex with "Isolated"; Digits is \p{N} (or \p{N}+);
 * tokenizer.json Split steps carry their own pattern. New pre-tokenizers
 * (llama3, o200k) are new regexes, not new code.
 *
 * Regexes run per piece, exactly as HF runs them, so a lookahead such as
 * GPT-2's \s+(?!\S) sees the end of the piece as end of subject.
 */
#include "tokenizer_internal.h"

#include "ie_array.h"

#include <stdlib.h>
#include <string.h>

const char *const IE_TOK_RE_GPT2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* o200k: words are an optional non-letter prefix, then upper-case-ish and
 * lower-case-ish runs (so "HelloWorld" splits in two) with case-insensitive
 * English contractions; numbers in groups of at most 3 digits; punctuation
 * runs keep trailing newlines and slashes. */
const char *const IE_TOK_RE_O200K =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* ---------------------------------------------------------------- spans */

ie_status_t ie_tok_spans_push(ie_tok_spans_t *s, uint32_t off, uint32_t len)
{
    if (ie_array_grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v) != 0) {
        return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
    return IE_OK;
}

/* ---------------------------------------------------------------- regex */

/* Oniguruma's \s is the Unicode White_Space set (it includes U+0085, which
 * PCRE2's UCP \s may not); spell it out so both engines agree. */
static const char WS_POS[] = "\\p{White_Space}";
static const char WS_NEG[] = "\\P{White_Space}";

ie_status_t ie_tok_regex_compile(const char *pattern, size_t len, int literal, pcre2_code **out)
{
    ie_status_t st = IE_OK;
    char *rewritten = NULL;
    pcre2_code *re = NULL;
    *out = NULL;

    const char *pat = pattern;
    size_t plen = len;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP;
    if (literal) {
        opts = PCRE2_UTF | PCRE2_LITERAL; /* PCRE2 rejects UCP with LITERAL */
    } else {
        /* worst case every 2-byte escape grows to sizeof(WS_POS)-1 bytes */
        if (len > (SIZE_MAX - 1) / sizeof WS_POS) {
            st = ie_error_set(IE_ERR_RANGE, "tokenizer: regex too long");
            goto cleanup;
        }
        rewritten = malloc(len * (sizeof WS_POS) + 1);
        if (!rewritten) {
            st = ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
            goto cleanup;
        }
        size_t o = 0;
        int quoted = 0; /* inside \Q ... \E */
        for (size_t i = 0; i < len; i++) {
            char c = pattern[i];
            if (c == '\\' && i + 1 < len) {
                char n = pattern[i + 1];
                if (quoted) {
                    if (n == 'E') { quoted = 0; }
                    rewritten[o++] = c;
                    rewritten[o++] = n;
                } else if (n == 's' || n == 'S') {
                    const char *r = n == 's' ? WS_POS : WS_NEG;
                    memcpy(rewritten + o, r, sizeof WS_POS - 1);
                    o += sizeof WS_POS - 1;
                } else {
                    if (n == 'Q') { quoted = 1; }
                    rewritten[o++] = c;
                    rewritten[o++] = n;
                }
                i++;
            } else {
                rewritten[o++] = c;
            }
        }
        rewritten[o] = '\0';
        pat = rewritten;
        plen = o;
    }

    int err = 0;
    PCRE2_SIZE erroff = 0;
    re = pcre2_compile((PCRE2_SPTR)pat, plen, opts, &err, &erroff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        st = ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: cannot compile pre-tokenizer regex (%s at offset %zu)",
                          (const char *)msg, (size_t)erroff);
        goto cleanup;
    }
    /* JIT is an optimisation only: without it pcre2_match interprets. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    re = NULL;

cleanup:
    pcre2_code_free(re);
    free(rewritten);
    return st;
}

/* One (start, end, is_match) entry of HF's find_matches. */
typedef struct split_ent {
    uint32_t s, e;
    int m;
} split_ent_t;

typedef struct split_list {
    split_ent_t *v;
    size_t n, cap;
} split_list_t;

static ie_status_t split_push(split_list_t *l, uint32_t s, uint32_t e, int m)
{
    if (l->n == l->cap) {
        size_t ncap = l->cap ? l->cap * 2 : 64;
        split_ent_t *nv = realloc(l->v, ncap * sizeof *nv);
        if (!nv) { return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory"); }
        l->v = nv;
        l->cap = ncap;
    }
    l->v[l->n].s = s;
    l->v[l->n].e = e;
    l->v[l->n].m = m;
    l->n++;
    return IE_OK;
}

/* Every match of re in subj[0..len), with the gaps between them, covering
 * the whole subject (HF Pattern::find_matches). */
static ie_status_t find_matches(const pcre2_code *re, const char *subj, size_t len, pcre2_match_data *md,
                                pcre2_match_context *mctx, split_list_t *l)
{
    ie_status_t st = IE_OK;
    l->n = 0;
    if (len == 0) { return split_push(l, 0, 0, 0); }
    size_t prev = 0, pos = 0;
    while (pos <= len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)subj, len, pos, PCRE2_NO_UTF_CHECK, md, mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
            /* the JIT's small machine stack ran out: the interpreter keeps
             * its backtracking state on the heap */
            rc = pcre2_match(re, (PCRE2_SPTR)subj, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, mctx);
        }
        if (rc == PCRE2_ERROR_NOMATCH) { break; }
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ie_error_set(IE_ERR_INTERNAL, "tokenizer: regex match failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t s = ov[0], e = ov[1];
        if (e < s) { /* \K games; not produced by tokenizer regexes */
            e = s;
        }
        if (prev != s) {
            if ((st = split_push(l, (uint32_t)prev, (uint32_t)s, 0)) != IE_OK) { return st; }
        }
        if ((st = split_push(l, (uint32_t)s, (uint32_t)e, 1)) != IE_OK) { return st; }
        prev = e;
        if (e == s) {
            /* empty match: step over one character */
            if (e >= len) { break; }
            pos = e + (size_t)ie_tok_utf8_len((unsigned char)subj[e]);
        } else {
            pos = e;
        }
    }
    if (prev < len) { st = split_push(l, (uint32_t)prev, (uint32_t)len, 0); }
    return st;
}

/* find_matches on the byte-level form of subj: every byte becomes the
 * UTF-8 of its GPT-2 code point (1 or 2 bytes) in *mapped, and the split
 * offsets are translated back to raw offsets (a match can only start or
 * end at a mapped character, which is one raw byte). *mapped and *raw_of
 * are scratch grown as needed. */
static ie_status_t find_matches_bytelevel(const pcre2_code *re, const char *subj, size_t len, pcre2_match_data *md,
                                          pcre2_match_context *mctx, split_list_t *l, char **mapped,
                                          uint32_t **raw_of, size_t *cap)
{
    if (2 * len + 1 > *cap) {
        size_t ncap = 2 * len + 1;
        char *nm = realloc(*mapped, ncap);
        if (nm) { *mapped = nm; }
        uint32_t *nr = realloc(*raw_of, ncap * sizeof *nr);
        if (nr) { *raw_of = nr; }
        if (!nm || !nr) { return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory"); }
        *cap = ncap;
    }
    char *m = *mapped;
    uint32_t *ro = *raw_of;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t cp = ie_tok_byte_to_cp((unsigned char)subj[i]);
        ro[o] = (uint32_t)i;
        if (cp < 0x80) {
            m[o++] = (char)cp;
        } else { /* every mapped code point is below U+0800 */
            m[o] = (char)(0xC0 | (cp >> 6));
            ro[o + 1] = (uint32_t)i;
            m[o + 1] = (char)(0x80 | (cp & 0x3F));
            o += 2;
        }
    }
    ro[o] = (uint32_t)len;
    ie_status_t st = find_matches(re, m, o, md, mctx, l);
    for (size_t i = 0; i < l->n && st == IE_OK; i++) {
        l->v[i].s = ro[l->v[i].s];
        l->v[i].e = ro[l->v[i].e];
    }
    return st;
}

ie_status_t ie_tok_pretok_apply(const ie_tok_pretok_step_t *step, const char *buf, const ie_tok_spans_t *in,
                                ie_tok_spans_t *out, pcre2_match_data *md, pcre2_match_context *mctx)
{
    ie_status_t st = IE_OK;
    split_list_t l = {0};
    split_list_t r = {0};
    char *mapped = NULL;
    uint32_t *raw_of = NULL;
    size_t map_cap = 0;

    for (size_t k = 0; k < in->n; k++) {
        const ie_tok_span_t *sp = &in->v[k];
        if (step->on_bytelevel) {
            st = find_matches_bytelevel(step->re, buf + sp->off, sp->len, md, mctx, &l, &mapped, &raw_of, &map_cap);
        } else {
            st = find_matches(step->re, buf + sp->off, sp->len, md, mctx, &l);
        }
        if (st != IE_OK) { goto cleanup; }
        if (step->invert) {
            for (size_t i = 0; i < l.n; i++) { l.v[i].m = !l.v[i].m; }
        }
        r.n = 0;
        int prev_match = 0;
        switch (step->behavior) {
        case IE_SPLIT_ISOLATED:
            for (size_t i = 0; i < l.n && st == IE_OK; i++) { st = split_push(&r, l.v[i].s, l.v[i].e, 0); }
            break;
        case IE_SPLIT_REMOVED:
            for (size_t i = 0; i < l.n && st == IE_OK; i++) {
                if (!l.v[i].m) { st = split_push(&r, l.v[i].s, l.v[i].e, 0); }
            }
            break;
        case IE_SPLIT_CONTIGUOUS:
            for (size_t i = 0; i < l.n && st == IE_OK; i++) {
                if (l.v[i].m == prev_match && r.n > 0) {
                    r.v[r.n - 1].e = l.v[i].e;
                } else {
                    st = split_push(&r, l.v[i].s, l.v[i].e, 0);
                }
                prev_match = l.v[i].m;
            }
            break;
        case IE_SPLIT_MERGED_WITH_PREVIOUS:
            for (size_t i = 0; i < l.n && st == IE_OK; i++) {
                if (l.v[i].m && !prev_match && r.n > 0) {
                    r.v[r.n - 1].e = l.v[i].e;
                } else {
                    st = split_push(&r, l.v[i].s, l.v[i].e, 0);
                }
                prev_match = l.v[i].m;
            }
            break;
        case IE_SPLIT_MERGED_WITH_NEXT:
            /* walk backwards, then reverse */
            for (size_t i = l.n; i-- > 0 && st == IE_OK;) {
                if (l.v[i].m && !prev_match && r.n > 0) {
                    r.v[r.n - 1].s = l.v[i].s;
                } else {
                    st = split_push(&r, l.v[i].s, l.v[i].e, 0);
                }
                prev_match = l.v[i].m;
            }
            for (size_t i = 0; i < r.n / 2; i++) {
                split_ent_t t = r.v[i];
                r.v[i] = r.v[r.n - 1 - i];
                r.v[r.n - 1 - i] = t;
            }
            break;
        default: st = ie_error_set(IE_ERR_INTERNAL, "tokenizer: bad split behavior %d", (int)step->behavior); break;
        }
        if (st != IE_OK) { goto cleanup; }
        for (size_t i = 0; i < r.n; i++) {
            if (r.v[i].e > r.v[i].s) {
                st = ie_tok_spans_push(out, sp->off + r.v[i].s, r.v[i].e - r.v[i].s);
                if (st != IE_OK) { goto cleanup; }
            }
        }
    }

cleanup:
    free(l.v);
    free(r.v);
    free(mapped);
    free(raw_of);
    return st;
}

/* ---------------------------------------------------------------- UTF-8 */

int ie_tok_utf8_len(unsigned char c)
{
    if (c < 0x80) { return 1; }
    if (c >= 0xC2 && c <= 0xDF) { return 2; }
    if (c >= 0xE0 && c <= 0xEF) { return 3; }
    if (c >= 0xF0 && c <= 0xF4) { return 4; }
    return 1;
}

size_t ie_tok_utf8_valid_prefix(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int n = ie_tok_utf8_len(c);
        if (n == 1 || i + (size_t)n > len) { return i; }
        unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the 2nd byte */
        if (c == 0xE0) {
            lo = 0xA0; /* no overlongs */
        } else if (c == 0xED) {
            hi = 0x9F; /* no surrogates */
        } else if (c == 0xF0) {
            lo = 0x90;
        } else if (c == 0xF4) {
            hi = 0x8F; /* <= U+10FFFF */
        }
        if (s[i + 1] < lo || s[i + 1] > hi) { return i; }
        for (int k = 2; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) { return i; }
        }
        i += (size_t)n;
    }
    return i;
}

/* ---------------------------------------------------------------- byte level */

/* GPT-2 maps the printable bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF to the
 * same code point and the remaining 68 bytes, in order, to U+0100.. */
static int byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t ie_tok_byte_to_cp(unsigned char b)
{
    if (byte_is_printable(b)) { return b; }
    if (b <= 0x20) { return 256u + b; /* U+0100..U+0120 */ }
    if (b >= 0x7F && b <= 0xA0) { return 256u + 33u + (b - 0x7Fu); /* U+0121..U+0142 */ }
    return 256u + 67u; /* 0xAD -> U+0143 */
}

int ie_tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256) { return byte_is_printable(cp) ? (int)cp : -1; }
    uint32_t n = cp - 256;
    if (n <= 32) { return (int)n; }
    if (n <= 66) { return (int)(0x7F + (n - 33)); }
    if (n == 67) { return 0xAD; }
    return -1;
}

long ie_tok_bytelevel_decode(const char *str, size_t len, char *dst)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0, o = 0;
    while (i < len) {
        uint32_t cp;
        unsigned char c = s[i];
        if (c < 0x80) {
            cp = c;
            i++;
        } else if ((c & 0xE0) == 0xC0 && i + 1 < len) {
            cp = ((uint32_t)(c & 0x1F) << 6) | (s[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1; /* every mapped code point is below U+0800 */
        }
        int b = ie_tok_cp_to_byte(cp);
        if (b < 0) { return -1; }
        dst[o++] = (char)b;
    }
    return (long)o;
}

/* jinja.c — a Jinja interpreter for chat templates (see ie_jinja.h).
 *
 * Three stages: the lexer turns the template into tokens (text, tag
 * delimiters, expression tokens) applying Jinja's whitespace control with
 * transformers' settings; a recursive-descent parser builds an AST; the
 * evaluator walks it with Python value semantics.
 *
 * Errors unwind with longjmp to the public entry point. That is safe here
 * because everything allocated after the jump buffer is set lives in an
 * arena (the template's for parsing, the render's for rendering) that the
 * entry point frees, and no other resource is held across an evaluation.
 *
 * Filters: trim length count tojson upper lower capitalize title first last
 * join default d items selectattr rejectattr select reject map replace
 * string safe int float list reverse abs unique.
 * Tests: defined undefined none string mapping iterable sequence number
 * integer float boolean true false equalto eq == ne != sameas odd even
 * divisibleby in lower upper callable gt ge lt le greaterthan lessthan.
 * String methods: startswith endswith strip lstrip rstrip split rsplit
 * (without maxsplit) replace upper lower title capitalize find count join.
 * Dict methods: get items keys values. Globals: raise_exception,
 * strftime_now, namespace, dict, range. Not supported (an error naming
 * it): call blocks, filter blocks, include/import/extends, recursive loops,
 * loop.cycle, string % formatting and .format, other filters, integers
 * beyond int64 (Python's are unbounded: overflow is an error here), case
 * mapping beyond ASCII (upper/lower/title keep other letters as they are).
 */
#include "ie_jinja.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NEST 128      /* parser nesting (expressions and blocks) */
#define MAX_CALL_DEPTH 64 /* macro recursion                          */
#define MAX_ARGS 16

/* ------------------------------------------------------------------ arena */

typedef struct achunk {
    struct achunk *next;
    size_t used, cap, pad_; /* header is 32 bytes, so data stays 16-aligned */
} achunk_t;

typedef struct arena {
    achunk_t *head;
    size_t total, limit;
} arena_t;

static void *ar_try(arena_t *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->total + cap > a->limit) return NULL;
        achunk_t *c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
        a->total += cap;
    }
    void *p = (unsigned char *)(a->head + 1) + a->head->used;
    a->head->used += n;
    return p;
}

static void ar_free(arena_t *a)
{
    while (a->head) {
        achunk_t *n = a->head->next;
        free(a->head);
        a->head = n;
    }
    a->total = 0;
}

/* ----------------------------------------------------------------- errors */

typedef struct jerr {
    jmp_buf jb;
    ie_status_t st;
    int raised;
    arena_t *ar;
    char msg[320];
} jerr_t;

static _Noreturn void jfail_st(jerr_t *e, ie_status_t st, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static _Noreturn void jfail_st(jerr_t *e, ie_status_t st, int line, const char *fmt, ...)
{
    int k = line > 0 ? snprintf(e->msg, sizeof e->msg, "chat template line %d: ", line)
                     : snprintf(e->msg, sizeof e->msg, "chat template: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg + k, sizeof e->msg - (size_t)k, fmt, ap);
    va_end(ap);
    e->st = st;
    longjmp(e->jb, 1);
}
#define jfail(e, line, ...) jfail_st((e), IE_ERR_INVAL, (line), __VA_ARGS__)

static void *jalloc(jerr_t *e, size_t n)
{
    void *p = ar_try(e->ar, n);
    if (!p) {
        if (e->ar->total + n + 65536 > e->ar->limit) jfail(e, 0, "memory limit reached");
        jfail_st(e, IE_ERR_NOMEM, 0, "out of memory");
    }
    return p;
}

/* ----------------------------------------------------------------- values */

typedef struct jstr {
    const char *p;
    const uint8_t *m; /* NULL: no content byte */
    size_t n;
} jstr_t;

typedef enum {
    V_UNDEF,
    V_NONE,
    V_BOOL,
    V_INT,
    V_FLOAT,
    V_STR,
    V_LIST,
    V_DICT,
    V_MACRO,
    V_METHOD /* a bound method read as an attribute, not called */
} vtype_t;

struct jlist;
struct jdict;
struct node;

typedef struct jv {
    vtype_t t;
    bool ns;  /* V_DICT that is a namespace() */
    bool tup; /* V_LIST that is a tuple: prints as (a, b), never equals a list */
    union {
        int64_t i;
        double f;
        jstr_t s; /* V_STR; V_UNDEF: the name read, for messages (p may be NULL) */
        struct jlist *l;
        struct jdict *d;
        const struct node *mac;
    };
} jv_t;

typedef struct jlist {
    jv_t *v;
    size_t n, cap;
} jlist_t;

typedef struct jdict {
    jv_t *k, *v;
    size_t n, cap;
} jdict_t;

static const jv_t UNDEF = {.t = V_UNDEF};
static const jv_t NONE = {.t = V_NONE};

static jv_t v_bool(bool b) { return (jv_t){.t = V_BOOL, .i = b}; }
static jv_t v_int(int64_t i) { return (jv_t){.t = V_INT, .i = i}; }
static jv_t v_float(double f) { return (jv_t){.t = V_FLOAT, .f = f}; }
static jv_t v_str(jstr_t s) { return (jv_t){.t = V_STR, .s = s}; }

static jstr_t js_lit(const char *s) { return (jstr_t){s, NULL, strlen(s)}; }

static jstr_t js_copy(jerr_t *e, const char *p, size_t n, int content)
{
    char *d = jalloc(e, n + 1);
    memcpy(d, p, n);
    d[n] = '\0';
    uint8_t *m = NULL;
    if (content && n) {
        m = jalloc(e, n);
        memset(m, 1, n);
    }
    return (jstr_t){d, m, n};
}

static bool js_eq(jstr_t a, const char *b) { return a.n == strlen(b) && memcmp(a.p, b, a.n) == 0; }
static bool js_same(jstr_t a, jstr_t b) { return a.n == b.n && memcmp(a.p, b.p, a.n) == 0; }

static jlist_t *list_new(jerr_t *e, size_t cap)
{
    jlist_t *l = jalloc(e, sizeof *l);
    l->n = 0;
    l->cap = cap ? cap : 4;
    l->v = jalloc(e, l->cap * sizeof *l->v);
    return l;
}

static void list_push(jerr_t *e, jlist_t *l, jv_t v)
{
    if (l->n == l->cap) {
        jv_t *nv = jalloc(e, l->cap * 2 * sizeof *nv);
        memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap *= 2;
    }
    l->v[l->n++] = v;
}

static jv_t v_list(jlist_t *l) { return (jv_t){.t = V_LIST, .l = l}; }
static jv_t v_dict(jdict_t *d) { return (jv_t){.t = V_DICT, .d = d}; }

static jdict_t *dict_new(jerr_t *e, size_t cap)
{
    jdict_t *d = jalloc(e, sizeof *d);
    d->n = 0;
    d->cap = cap ? cap : 4;
    d->k = jalloc(e, d->cap * sizeof *d->k);
    d->v = jalloc(e, d->cap * sizeof *d->v);
    return d;
}

static bool v_eq(jv_t a, jv_t b);

static jv_t *dict_find(const jdict_t *d, jv_t k)
{
    for (size_t i = 0; i < d->n; i++)
        if (v_eq(d->k[i], k)) return &d->v[i];
    return NULL;
}

static jv_t *dict_find_s(const jdict_t *d, jstr_t k)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == V_STR && js_same(d->k[i].s, k)) return &d->v[i];
    return NULL;
}

/* Python dict assignment: an existing key keeps its place. */
static void dict_set(jerr_t *e, jdict_t *d, jv_t k, jv_t v)
{
    jv_t *slot = dict_find(d, k);
    if (slot) {
        *slot = v;
        return;
    }
    if (d->n == d->cap) {
        jv_t *nk = jalloc(e, d->cap * 2 * sizeof *nk), *nv = jalloc(e, d->cap * 2 * sizeof *nv);
        memcpy(nk, d->k, d->n * sizeof *nk);
        memcpy(nv, d->v, d->n * sizeof *nv);
        d->k = nk;
        d->v = nv;
        d->cap *= 2;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

static bool is_num(jv_t v) { return v.t == V_INT || v.t == V_BOOL || v.t == V_FLOAT; }
static double num_f(jv_t v) { return v.t == V_FLOAT ? v.f : (double)v.i; }

static bool v_eq(jv_t a, jv_t b)
{
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT) return a.i == b.i;
        return num_f(a) == num_f(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case V_UNDEF:
    case V_NONE: return true;
    case V_STR: return js_same(a.s, b.s);
    case V_LIST:
        if (a.l->n != b.l->n || a.tup != b.tup) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!v_eq(a.l->v[i], b.l->v[i])) return false;
        return true;
    case V_DICT:
        if (a.d == b.d) return true;
        if (a.ns || b.ns || a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            jv_t *o = dict_find(b.d, a.d->k[i]);
            if (!o || !v_eq(a.d->v[i], *o)) return false;
        }
        return true;
    case V_MACRO: return a.mac == b.mac;
    default: return false;
    }
}

static bool v_truthy(jv_t v)
{
    switch (v.t) {
    case V_UNDEF:
    case V_NONE: return false;
    case V_BOOL:
    case V_INT: return v.i != 0;
    case V_FLOAT: return v.f != 0.0;
    case V_STR: return v.s.n > 0;
    case V_LIST: return v.l->n > 0;
    case V_DICT: return v.ns || v.d->n > 0;
    default: return true;
    }
}

static const char *type_name(jv_t v)
{
    static const char *const names[] = {"undefined", "NoneType", "bool", "int",   "float",
                                        "str",       "list",     "dict", "macro", "method"};
    return v.t == V_DICT && v.ns ? "Namespace" : names[v.t];
}

/* ------------------------------------------------------------------ UTF-8 */

/* Length of the code point starting at s[0] (1 for an invalid byte, which
 * then counts as one code point). */
static size_t u8_len(const char *s, size_t n)
{
    unsigned char c = (unsigned char)s[0];
    size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (k > n) return 1;
    for (size_t i = 1; i < k; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) return 1;
    return k;
}

static uint32_t u8_dec(const char *s, size_t k)
{
    const unsigned char *u = (const unsigned char *)s;
    switch (k) {
    case 2: return ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
    case 3: return ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    case 4:
        return ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) |
               (u[3] & 0x3F);
    default: return u[0];
    }
}

static size_t u8_enc(uint32_t c, char *o)
{
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

static size_t u8_count(jstr_t s)
{
    size_t c = 0;
    for (size_t i = 0; i < s.n; i += u8_len(s.p + i, s.n - i)) c++;
    return c;
}

/* Python's str.isspace for one code point. */
static bool cp_space(uint32_t c)
{
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ------------------------------------------------------------------ lexer */

typedef enum {
    T_EOF,
    T_TEXT,
    T_VBEGIN, /* {{ */
    T_VEND,
    T_BBEGIN, /* {% */
    T_BEND,
    T_NAME,
    T_STR,
    T_INT,
    T_FLOAT,
    T_OP
} ttype_t;

typedef struct tok {
    ttype_t t;
    int line;
    jstr_t s;  /* text, name, string value, operator */
    int64_t i; /* T_INT */
    double f;  /* T_FLOAT */
} tok_t;

typedef struct lexer {
    jerr_t *e;
    const char *src;
    size_t n, pos;
    int line;
    tok_t *toks;
    size_t nt, cap;
} lexer_t;

static void lx_push(lexer_t *L, tok_t t)
{
    if (L->nt == L->cap) {
        size_t c = L->cap ? L->cap * 2 : 256;
        tok_t *nt = jalloc(L->e, c * sizeof *nt);
        if (L->nt) memcpy(nt, L->toks, L->nt * sizeof *nt);
        L->toks = nt;
        L->cap = c;
    }
    L->toks[L->nt++] = t;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_id0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_dig(char c) { return c >= '0' && c <= '9'; }
static bool is_id(char c) { return is_id0(c) || is_dig(c); }

static int count_nl(const char *p, size_t n)
{
    int c = 0;
    for (size_t i = 0; i < n; i++) c += p[i] == '\n';
    return c;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* A string literal body with Python's escapes (jinja decodes literals with
 * "unicode-escape"). */
static jstr_t lx_unescape(lexer_t *L, const char *p, size_t n, int line)
{
    char *o = jalloc(L->e, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\\' || i + 1 >= n) {
            o[k++] = p[i];
            continue;
        }
        char c = p[++i];
        int hex = 0;
        switch (c) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case 'a': o[k++] = '\a'; break;
        case '0': o[k++] = '\0'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case '\n': break;
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        default: o[k++] = '\\'; o[k++] = c;
        }
        if (hex) {
            uint32_t cp = 0;
            for (int j = 0; j < hex; j++) {
                int h = i + 1 + (size_t)j < n ? hexval(p[i + 1 + (size_t)j]) : -1;
                if (h < 0) jfail_st(L->e, IE_ERR_FORMAT, line, "truncated \\%c escape in a string literal", c);
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10FFFF) jfail_st(L->e, IE_ERR_FORMAT, line, "invalid \\U escape in a string literal");
            i += (size_t)hex;
            k += u8_enc(cp, o + k); /* escapes are at least 4 bytes, so it fits */
        }
    }
    o[k] = '\0';
    return (jstr_t){o, NULL, k};
}

/* Tokens of one {{ }} or {% %} tag starting at L->pos (after the opener and
 * its sign). Returns the closing sign ('-', '+' or 0); L->pos is after the
 * closer. */
static char lx_tag(lexer_t *L, bool block, int open_line)
{
    const char *s = L->src;
    const char close = block ? '%' : '}';
    for (;;) {
        while (L->pos < L->n && is_ws(s[L->pos])) L->line += s[L->pos++] == '\n';
        if (L->pos >= L->n)
            jfail_st(L->e, IE_ERR_FORMAT, open_line, "unclosed %s", block ? "'{%' tag" : "'{{' expression");
        size_t p = L->pos;
        char c = s[p];
        if ((c == '-' || c == '+') && p + 2 < L->n && s[p + 1] == close && s[p + 2] == '}') {
            L->pos = p + 3;
            return c;
        }
        if (c == close && p + 1 < L->n && s[p + 1] == '}') {
            L->pos = p + 2;
            return 0;
        }
        tok_t t = {.line = L->line};
        if (is_id0(c)) {
            while (p < L->n && is_id(s[p])) p++;
            t.t = T_NAME;
            t.s = (jstr_t){s + L->pos, NULL, p - L->pos};
        } else if (is_dig(c)) {
            while (p < L->n && (is_dig(s[p]) || s[p] == '_')) p++;
            bool fl = false;
            if (p + 1 < L->n && s[p] == '.' && is_dig(s[p + 1])) {
                fl = true;
                p++;
                while (p < L->n && is_dig(s[p])) p++;
            }
            if (p < L->n && (s[p] == 'e' || s[p] == 'E')) {
                size_t q = p + 1;
                if (q < L->n && (s[q] == '+' || s[q] == '-')) q++;
                if (q < L->n && is_dig(s[q])) {
                    fl = true;
                    p = q;
                    while (p < L->n && is_dig(s[p])) p++;
                }
            }
            char buf[64];
            size_t k = 0;
            for (size_t i = L->pos; i < p && k + 1 < sizeof buf; i++)
                if (s[i] != '_') buf[k++] = s[i];
            buf[k] = '\0';
            if (fl) {
                t.t = T_FLOAT;
                t.f = strtod(buf, NULL);
            } else {
                t.t = T_INT;
                char *end;
                unsigned long long u = strtoull(buf, &end, 10);
                if (k >= sizeof buf - 1 || u > INT64_MAX)
                    jfail_st(L->e, IE_ERR_FORMAT, L->line, "integer literal too large");
                t.i = (int64_t)u;
            }
        } else if (c == '\'' || c == '"') {
            size_t q = p + 1;
            while (q < L->n && s[q] != c) q += s[q] == '\\' ? 2 : 1;
            if (q >= L->n) jfail_st(L->e, IE_ERR_FORMAT, L->line, "unterminated string literal");
            t.t = T_STR;
            t.s = lx_unescape(L, s + p + 1, q - p - 1, L->line);
            L->line += count_nl(s + p, q - p);
            p = q + 1;
        } else {
            static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
            static const char ops1[] = "+-*/%~<>=()[]{},.:|";
            t.t = T_OP;
            size_t k = 0;
            for (int j = 0; ops2[j]; j++)
                if (p + 1 < L->n && s[p] == ops2[j][0] && s[p + 1] == ops2[j][1]) k = 2;
            if (!k && strchr(ops1, c)) k = 1;
            if (!k) jfail_st(L->e, IE_ERR_FORMAT, L->line, "unexpected character '%c'", c);
            t.s = (jstr_t){s + p, NULL, k};
            p += k;
        }
        L->pos = p;
        lx_push(L, t);
    }
}

static void lx_text(lexer_t *L, const char *p, size_t n, int line)
{
    if (n) lx_push(L, (tok_t){.t = T_TEXT, .line = line, .s = {p, NULL, n}});
}

/* Whitespace control as jinja's lexer does it with trim_blocks and
 * lstrip_blocks on and keep_trailing_newline off:
 *   "{%-", "{{-", "{#-" strip all whitespace before the tag;
 *   "-%}", "-}}", "-#}" strip all whitespace after it;
 *   lstrip_blocks: spaces/tabs between the line start and "{%" or "{#" go
 *   (not for "{{", not with "{%+"); trim_blocks: one newline after "%}" or
 *   "#}" goes (not after "+%}"); one newline at the end of the template goes. */
static void lx_run(lexer_t *L)
{
    const char *s = L->src;
    if (L->n && s[L->n - 1] == '\n') L->n--;
    bool strip_next = false;
    while (L->pos <= L->n) {
        size_t start = L->pos;
        if (strip_next)
            while (start < L->n && is_ws(s[start])) L->line += s[start++] == '\n';
        strip_next = false;
        size_t q = start;
        while (q + 1 < L->n && !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#'))) q++;
        if (q + 1 >= L->n) {
            lx_text(L, s + start, L->n - start, L->line);
            break;
        }
        char kind = s[q + 1], sign = q + 2 < L->n ? s[q + 2] : 0;
        if (sign != '-' && sign != '+') sign = 0;
        size_t tend = q; /* text is s[start..tend) */
        if (sign == '-') {
            while (tend > start && is_ws(s[tend - 1])) tend--;
        } else if (sign != '+' && kind != '{') {
            size_t l = tend;
            while (l > start && s[l - 1] != '\n') l--;
            bool line_start = l > start || l == 0 || s[l - 1] == '\n';
            size_t k = l;
            while (k < tend && (s[k] == ' ' || s[k] == '\t' || s[k] == '\f' || s[k] == '\v' || s[k] == '\r')) k++;
            if (line_start && k == tend && l < tend) tend = l;
        }
        int text_line = L->line;
        lx_text(L, s + start, tend - start, text_line);
        L->line += count_nl(s + start, q - start);
        int open_line = L->line;
        L->pos = q + 2 + (sign ? 1 : 0);
        char close_sign;
        if (kind == '#') {
            const char *e = NULL;
            for (size_t i = L->pos; i + 1 < L->n; i++)
                if (s[i] == '#' && s[i + 1] == '}') {
                    e = s + i;
                    break;
                }
            if (!e) jfail_st(L->e, IE_ERR_FORMAT, open_line, "unclosed comment");
            close_sign = e > s + L->pos && e[-1] == '-' ? '-' : 0;
            L->line += count_nl(s + L->pos, (size_t)(e - s) - L->pos);
            L->pos = (size_t)(e - s) + 2;
        } else {
            bool block = kind == '%';
            lx_push(L, (tok_t){.t = block ? T_BBEGIN : T_VBEGIN, .line = open_line});
            close_sign = lx_tag(L, block, open_line);
            lx_push(L, (tok_t){.t = block ? T_BEND : T_VEND, .line = L->line});
        }
        if (close_sign == '-') strip_next = true;
        else if (kind != '{' && close_sign != '+' && L->pos < L->n && s[L->pos] == '\n') {
            L->pos++;
            L->line++;
        }
    }
    lx_push(L, (tok_t){.t = T_EOF, .line = L->line});
}

/* ----------------------------------------------------------------- parser */

typedef enum {
    /* statements */
    N_TEXT,
    N_OUT,
    N_IF,
    N_FOR,
    N_SET,
    N_MACRO,
    N_BREAK,
    N_CONTINUE,
    N_WRAP, /* {% generation %}: renders its body */
    /* expressions */
    E_LIT,
    E_NAME,
    E_ATTR,
    E_ITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_BIN,
    E_NOT,
    E_NEG,
    E_POS,
    E_COND,
    E_LIST,
    E_TUPLE,
    E_DICT,
    E_KW
} nkind_t;

typedef enum {
    OP_OR,
    OP_AND,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN,
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FDIV,
    OP_MOD,
    OP_POW,
    OP_CAT
} op_t;

/* One AST node; what a, b, c, d and args mean depends on the kind:
 *   N_TEXT name=text; N_OUT a=expr; N_IF a=cond b=then c=else;
 *   N_FOR args=targets a=iterable b=body c=else d=filter; N_SET args=targets
 *   a=value (NULL: block set, body b); N_MACRO name, args=E_KW params (b =
 *   default), b=body; N_WRAP b=body; E_ATTR a.name; E_ITEM a[b]; E_SLICE
 *   a[b:c:d]; E_CALL a(args); E_FILTER a|name(args); E_TEST a is [not]
 *   name(args); E_BIN a op b; E_COND a if b else c; E_LIST/E_TUPLE/E_DICT args
 *   (E_DICT: E_KW with key a, value b); E_KW name=b. Lists are linked by
 *   next. */
typedef struct node {
    nkind_t k;
    int line;
    int op; /* op_t; E_TEST: negated */
    struct node *a, *b, *c, *d, *args, *next;
    jstr_t name;
    jv_t lit;
} node_t;

typedef struct parser {
    jerr_t *e;
    tok_t *t;
    size_t i;
    int depth;
} parser_t;

static tok_t *pk(parser_t *P) { return &P->t[P->i]; }
static tok_t *nx(parser_t *P) { return &P->t[P->i++]; }

static bool is_op(const tok_t *t, const char *op) { return t->t == T_OP && js_eq(t->s, op); }
static bool is_kw(const tok_t *t, const char *kw) { return t->t == T_NAME && js_eq(t->s, kw); }

static _Noreturn void perr(parser_t *P, const char *what)
{
    tok_t *t = pk(P);
    const char *got = t->t == T_EOF ? "end of template" : t->t == T_BEND ? "'%}'" : t->t == T_VEND ? "'}}'" : NULL;
    if (got) jfail_st(P->e, IE_ERR_FORMAT, t->line, "expected %s, got %s", what, got);
    jfail_st(P->e, IE_ERR_FORMAT, t->line, "expected %s, got '%.*s'", what, (int)(t->s.n > 40 ? 40 : t->s.n),
             t->t == T_STR ? "string"
             : t->s.p      ? t->s.p
                           : "?");
}

static void expect_op(parser_t *P, const char *op)
{
    if (!is_op(pk(P), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        perr(P, w);
    }
    P->i++;
}

static node_t *mk(parser_t *P, nkind_t k, int line)
{
    node_t *n = jalloc(P->e, sizeof *n);
    memset(n, 0, sizeof *n);
    n->k = k;
    n->line = line;
    return n;
}

static void enter(parser_t *P)
{
    if (++P->depth > MAX_NEST) jfail_st(P->e, IE_ERR_FORMAT, pk(P)->line, "nesting deeper than %d", MAX_NEST);
}

static node_t *p_expr(parser_t *P);
static node_t *p_or(parser_t *P);
static node_t *p_unary(parser_t *P, bool with_filter);
static node_t *p_primary(parser_t *P);
static node_t *p_postfix(parser_t *P, node_t *n);

static const char *const FILTERS[] = {"trim",       "length",  "count",      "tojson",     "upper",  "lower",
                                      "capitalize", "title",   "first",      "last",       "join",   "default",
                                      "d",          "items",   "selectattr", "rejectattr", "select", "reject",
                                      "map",        "replace", "string",     "safe",       "int",    "float",
                                      "list",       "reverse", "abs",        "unique",     NULL};
static const char *const TESTS[] = {"defined",     "undefined", "none",    "string",      "mapping", "iterable",
                                    "sequence",    "number",    "integer", "float",       "boolean", "true",
                                    "false",       "equalto",   "eq",      "==",          "ne",      "!=",
                                    "sameas",      "odd",       "even",    "divisibleby", "in",      "lower",
                                    "upper",       "callable",  "gt",      "ge",          "lt",      "le",
                                    "greaterthan", "lessthan",  NULL};

static bool in_table(const char *const *tab, jstr_t s)
{
    for (int i = 0; tab[i]; i++)
        if (js_eq(s, tab[i])) return true;
    return false;
}

/* Call arguments after '(' up to ')': positional expressions and name=expr. */
static node_t *p_args(parser_t *P)
{
    node_t *head = NULL, **tail = &head;
    expect_op(P, "(");
    while (!is_op(pk(P), ")")) {
        if (head) {
            expect_op(P, ",");
            if (is_op(pk(P), ")")) break;
        }
        node_t *a;
        if (pk(P)->t == T_NAME && is_op(&P->t[P->i + 1], "=")) {
            a = mk(P, E_KW, pk(P)->line);
            a->name = pk(P)->s;
            P->i += 2;
            a->b = p_expr(P);
        } else {
            if (is_op(pk(P), "*") || is_op(pk(P), "**"))
                jfail_st(P->e, IE_ERR_FORMAT, pk(P)->line, "*args / **kwargs calls are not supported");
            a = p_expr(P);
        }
        *tail = a;
        tail = &a->next;
    }
    P->i++;
    return head;
}

static node_t *p_filters(parser_t *P, node_t *n)
{
    for (;;) {
        tok_t *t = pk(P);
        if (is_op(t, "|")) {
            P->i++;
            if (pk(P)->t != T_NAME) perr(P, "a filter name");
            node_t *f = mk(P, E_FILTER, pk(P)->line);
            f->name = nx(P)->s;
            if (!in_table(FILTERS, f->name))
                jfail_st(P->e, IE_ERR_FORMAT, f->line, "unsupported filter '%.*s'", (int)f->name.n, f->name.p);
            f->a = n;
            if (is_op(pk(P), "(")) f->args = p_args(P);
            n = f;
        } else if (is_kw(t, "is")) {
            P->i++;
            node_t *f = mk(P, E_TEST, pk(P)->line);
            if (is_kw(pk(P), "not")) {
                f->op = 1;
                P->i++;
            }
            tok_t *nm = pk(P);
            if (nm->t == T_NAME || (nm->t == T_OP && (js_eq(nm->s, "==") || js_eq(nm->s, "!="))))
                f->name = nx(P)->s;
            else perr(P, "a test name");
            if (!in_table(TESTS, f->name))
                jfail_st(P->e, IE_ERR_FORMAT, f->line, "unsupported test '%.*s'", (int)f->name.n, f->name.p);
            f->a = n;
            tok_t *c = pk(P);
            if (is_op(c, "(")) f->args = p_args(P);
            else if ((c->t == T_NAME || c->t == T_STR || c->t == T_INT || c->t == T_FLOAT || is_op(c, "[") ||
                      is_op(c, "{")) &&
                     !is_kw(c, "else") && !is_kw(c, "or") && !is_kw(c, "and")) {
                if (is_kw(c, "is")) jfail_st(P->e, IE_ERR_FORMAT, c->line, "tests cannot be chained with 'is'");
                f->args = p_postfix(P, p_primary(P));
            }
            n = f;
        } else if (is_op(t, "(")) {
            node_t *c = mk(P, E_CALL, t->line);
            c->a = n;
            c->args = p_args(P);
            n = c;
        } else return n;
    }
}

static node_t *p_postfix(parser_t *P, node_t *n)
{
    for (;;) {
        tok_t *t = pk(P);
        if (is_op(t, ".")) {
            P->i++;
            tok_t *a = nx(P);
            if (a->t == T_NAME) {
                node_t *x = mk(P, E_ATTR, a->line);
                x->a = n;
                x->name = a->s;
                n = x;
            } else if (a->t == T_INT) {
                node_t *x = mk(P, E_ITEM, a->line), *l = mk(P, E_LIT, a->line);
                l->lit = v_int(a->i);
                x->a = n;
                x->b = l;
                n = x;
            } else {
                P->i--;
                perr(P, "an attribute name");
            }
        } else if (is_op(t, "[")) {
            P->i++;
            node_t *parts[3] = {NULL, NULL, NULL};
            int k = 0;
            bool slice = false;
            for (;;) {
                if (is_op(pk(P), ":")) {
                    if (++k > 2) perr(P, "']'");
                    slice = true;
                    P->i++;
                } else if (is_op(pk(P), "]")) {
                    P->i++;
                    break;
                } else {
                    if (parts[k]) perr(P, "':' or ']'");
                    parts[k] = p_expr(P);
                }
            }
            if (!slice && !parts[0]) jfail_st(P->e, IE_ERR_FORMAT, t->line, "empty subscript");
            node_t *x = mk(P, slice ? E_SLICE : E_ITEM, t->line);
            x->a = n;
            x->b = parts[0];
            x->c = parts[1];
            x->d = parts[2];
            n = x;
        } else if (is_op(t, "(")) {
            node_t *c = mk(P, E_CALL, t->line);
            c->a = n;
            c->args = p_args(P);
            n = c;
        } else return n;
    }
}

static node_t *p_primary(parser_t *P)
{
    tok_t *t = nx(P);
    node_t *n;
    switch (t->t) {
    case T_NAME:
        n = mk(P, E_LIT, t->line);
        if (js_eq(t->s, "true") || js_eq(t->s, "True")) n->lit = v_bool(true);
        else if (js_eq(t->s, "false") || js_eq(t->s, "False")) n->lit = v_bool(false);
        else if (js_eq(t->s, "none") || js_eq(t->s, "None")) n->lit = NONE;
        else {
            n->k = E_NAME;
            n->name = t->s;
        }
        return n;
    case T_STR: {
        n = mk(P, E_LIT, t->line);
        jstr_t s = t->s;
        while (pk(P)->t == T_STR) { /* adjacent literals concatenate */
            jstr_t s2 = nx(P)->s;
            char *d = jalloc(P->e, s.n + s2.n + 1);
            memcpy(d, s.p, s.n);
            memcpy(d + s.n, s2.p, s2.n);
            d[s.n + s2.n] = '\0';
            s = (jstr_t){d, NULL, s.n + s2.n};
        }
        n->lit = v_str(s);
        return n;
    }
    case T_INT:
        n = mk(P, E_LIT, t->line);
        n->lit = v_int(t->i);
        return n;
    case T_FLOAT:
        n = mk(P, E_LIT, t->line);
        n->lit = v_float(t->f);
        return n;
    case T_OP:
        if (js_eq(t->s, "(")) {
            enter(P);
            if (is_op(pk(P), ")")) {
                P->i++;
                P->depth--;
                return mk(P, E_TUPLE, t->line); /* () */
            }
            node_t *first = p_expr(P);
            if (is_op(pk(P), ",")) {
                n = mk(P, E_TUPLE, t->line);
                n->args = first;
                node_t **tail = &first->next;
                while (is_op(pk(P), ",")) {
                    P->i++;
                    if (is_op(pk(P), ")")) break;
                    *tail = p_expr(P);
                    tail = &(*tail)->next;
                }
                first = n;
            }
            expect_op(P, ")");
            P->depth--;
            return first;
        }
        if (js_eq(t->s, "[") || js_eq(t->s, "{")) {
            enter(P);
            bool dict = t->s.p[0] == '{';
            n = mk(P, dict ? E_DICT : E_LIST, t->line);
            node_t **tail = &n->args;
            const char *close = dict ? "}" : "]";
            while (!is_op(pk(P), close)) {
                if (n->args) {
                    expect_op(P, ",");
                    if (is_op(pk(P), close)) break;
                }
                node_t *x;
                if (dict) {
                    x = mk(P, E_KW, pk(P)->line);
                    x->a = p_expr(P);
                    expect_op(P, ":");
                    x->b = p_expr(P);
                } else x = p_expr(P);
                *tail = x;
                tail = &x->next;
            }
            P->i++;
            P->depth--;
            return n;
        }
        break;
    default: break;
    }
    P->i--;
    perr(P, "an expression");
}

static node_t *p_unary(parser_t *P, bool with_filter)
{
    tok_t *t = pk(P);
    node_t *n;
    enter(P);
    if (is_op(t, "-") || is_op(t, "+")) {
        P->i++;
        n = mk(P, t->s.p[0] == '-' ? E_NEG : E_POS, t->line);
        n->a = p_unary(P, false);
    } else n = p_primary(P);
    n = p_postfix(P, n);
    if (with_filter) n = p_filters(P, n);
    P->depth--;
    return n;
}

static node_t *bin(parser_t *P, int op, node_t *a, node_t *b, int line)
{
    node_t *n = mk(P, E_BIN, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static node_t *p_pow(parser_t *P)
{
    node_t *n = p_unary(P, true);
    while (is_op(pk(P), "**")) {
        int line = nx(P)->line;
        n = bin(P, OP_POW, n, p_unary(P, true), line);
    }
    return n;
}

static node_t *p_math2(parser_t *P)
{
    node_t *n = p_pow(P);
    for (;;) {
        tok_t *t = pk(P);
        int op = is_op(t, "*")    ? OP_MUL
                 : is_op(t, "/")  ? OP_DIV
                 : is_op(t, "//") ? OP_FDIV
                 : is_op(t, "%")  ? OP_MOD
                                  : -1;
        if (op < 0) return n;
        P->i++;
        n = bin(P, op, n, p_pow(P), t->line);
    }
}

static node_t *p_concat(parser_t *P)
{
    node_t *n = p_math2(P);
    while (is_op(pk(P), "~")) {
        int line = nx(P)->line;
        n = bin(P, OP_CAT, n, p_math2(P), line);
    }
    return n;
}

static node_t *p_math1(parser_t *P)
{
    node_t *n = p_concat(P);
    for (;;) {
        tok_t *t = pk(P);
        int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : -1;
        if (op < 0) return n;
        P->i++;
        n = bin(P, op, n, p_concat(P), t->line);
    }
}

/* Chained comparisons (a < b < c) are rare in templates and mean
 * a < b and b < c in Jinja; they are refused rather than misread. */
static node_t *p_compare(parser_t *P)
{
    node_t *n = p_math1(P);
    int count = 0;
    for (;;) {
        tok_t *t = pk(P);
        int op = is_op(t, "==")   ? OP_EQ
                 : is_op(t, "!=") ? OP_NE
                 : is_op(t, "<")  ? OP_LT
                 : is_op(t, "<=") ? OP_LE
                 : is_op(t, ">")  ? OP_GT
                 : is_op(t, ">=") ? OP_GE
                 : is_kw(t, "in") ? OP_IN
                                  : -1;
        if (op < 0 && is_kw(t, "not") && is_kw(&P->t[P->i + 1], "in")) {
            op = OP_NOTIN;
            P->i++;
        }
        if (op < 0) return n;
        if (++count > 1) jfail_st(P->e, IE_ERR_FORMAT, t->line, "chained comparisons are not supported");
        P->i++;
        n = bin(P, op, n, p_math1(P), t->line);
    }
}

static node_t *p_not(parser_t *P)
{
    if (is_kw(pk(P), "not")) {
        node_t *n = mk(P, E_NOT, nx(P)->line);
        enter(P);
        n->a = p_not(P);
        P->depth--;
        return n;
    }
    return p_compare(P);
}

static node_t *p_and(parser_t *P)
{
    node_t *n = p_not(P);
    while (is_kw(pk(P), "and")) {
        int line = nx(P)->line;
        n = bin(P, OP_AND, n, p_not(P), line);
    }
    return n;
}

static node_t *p_or(parser_t *P)
{
    node_t *n = p_and(P);
    while (is_kw(pk(P), "or")) {
        int line = nx(P)->line;
        n = bin(P, OP_OR, n, p_and(P), line);
    }
    return n;
}

static node_t *p_expr(parser_t *P)
{
    enter(P);
    node_t *n = p_or(P);
    while (is_kw(pk(P), "if")) {
        node_t *c = mk(P, E_COND, nx(P)->line);
        c->a = n;
        c->b = p_or(P);
        if (is_kw(pk(P), "else")) {
            P->i++;
            c->c = p_expr(P);
        }
        n = c;
    }
    P->depth--;
    return n;
}

static void expect_bend(parser_t *P)
{
    if (pk(P)->t != T_BEND) perr(P, "'%}'");
    P->i++;
}

/* Target list of for / set: name, name, ... (set also takes name.attr). */
static node_t *p_targets(parser_t *P, bool allow_attr)
{
    node_t *head = NULL, **tail = &head;
    bool paren = is_op(pk(P), "(");
    if (paren) P->i++;
    do {
        if (head) P->i++;
        if (pk(P)->t != T_NAME) perr(P, "a variable name");
        node_t *n = mk(P, E_NAME, pk(P)->line);
        n->name = nx(P)->s;
        if (allow_attr && is_op(pk(P), ".")) {
            P->i++;
            if (pk(P)->t != T_NAME) perr(P, "an attribute name");
            node_t *a = mk(P, E_ATTR, n->line);
            a->a = n;
            a->name = nx(P)->s;
            n = a;
        }
        *tail = n;
        tail = &n->next;
    } while (is_op(pk(P), ","));
    if (paren) expect_op(P, ")");
    return head;
}

static node_t *p_body(parser_t *P, const char *const *ends, jstr_t *end_out);

static node_t *p_if(parser_t *P, int line)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    enter(P); /* an elif chain nests */
    node_t *n = mk(P, N_IF, line);
    n->a = p_expr(P);
    expect_bend(P);
    jstr_t end;
    n->b = p_body(P, ends, &end);
    if (js_eq(end, "elif")) {
        n->c = p_if(P, pk(P)->line);
        P->depth--;
        return n; /* the nested if consumed endif */
    }
    if (js_eq(end, "else")) {
        static const char *const endif[] = {"endif", NULL};
        expect_bend(P);
        n->c = p_body(P, endif, &end);
    }
    expect_bend(P);
    P->depth--;
    return n;
}

static node_t *p_stmt(parser_t *P, jstr_t kw, int line)
{
    node_t *n;
    jstr_t end;
    if (js_eq(kw, "if")) return p_if(P, line);
    if (js_eq(kw, "for")) {
        static const char *const ends[] = {"else", "endfor", NULL};
        static const char *const endfor[] = {"endfor", NULL};
        n = mk(P, N_FOR, line);
        n->args = p_targets(P, false);
        if (!is_kw(pk(P), "in")) perr(P, "'in'");
        P->i++;
        n->a = p_or(P);
        if (is_op(pk(P), ",")) jfail_st(P->e, IE_ERR_FORMAT, line, "for over a tuple literal is not supported");
        if (is_kw(pk(P), "if")) {
            P->i++;
            n->d = p_expr(P);
        }
        if (is_kw(pk(P), "recursive")) jfail_st(P->e, IE_ERR_FORMAT, line, "recursive for loops are not supported");
        expect_bend(P);
        n->b = p_body(P, ends, &end);
        if (js_eq(end, "else")) {
            expect_bend(P);
            n->c = p_body(P, endfor, &end);
        }
        expect_bend(P);
        return n;
    }
    if (js_eq(kw, "set")) {
        n = mk(P, N_SET, line);
        n->args = p_targets(P, true);
        if (is_op(pk(P), "=")) {
            P->i++;
            n->a = p_expr(P);
            if (is_op(pk(P), ",")) { /* set a, b = x, y */
                node_t *l = mk(P, E_TUPLE, line);
                l->args = n->a;
                node_t **tail = &n->a->next;
                while (is_op(pk(P), ",")) {
                    P->i++;
                    *tail = p_expr(P);
                    tail = &(*tail)->next;
                }
                n->a = l;
            }
            expect_bend(P);
        } else {
            static const char *const endset[] = {"endset", NULL};
            if (n->args->next || n->args->k != E_NAME)
                jfail_st(P->e, IE_ERR_FORMAT, line, "a block set takes one variable name");
            expect_bend(P);
            n->b = p_body(P, endset, &end);
            expect_bend(P);
        }
        return n;
    }
    if (js_eq(kw, "macro")) {
        static const char *const ends[] = {"endmacro", NULL};
        n = mk(P, N_MACRO, line);
        if (pk(P)->t != T_NAME) perr(P, "a macro name");
        n->name = nx(P)->s;
        expect_op(P, "(");
        node_t **tail = &n->args;
        while (!is_op(pk(P), ")")) {
            if (n->args) expect_op(P, ",");
            if (pk(P)->t != T_NAME) perr(P, "a parameter name");
            node_t *p = mk(P, E_KW, pk(P)->line);
            p->name = nx(P)->s;
            if (is_op(pk(P), "=")) {
                P->i++;
                p->b = p_expr(P);
            }
            *tail = p;
            tail = &p->next;
        }
        P->i++;
        expect_bend(P);
        n->b = p_body(P, ends, &end);
        if (pk(P)->t == T_NAME) P->i++; /* {% endmacro name %} */
        expect_bend(P);
        return n;
    }
    if (js_eq(kw, "break") || js_eq(kw, "continue")) {
        n = mk(P, kw.p[0] == 'b' ? N_BREAK : N_CONTINUE, line);
        expect_bend(P);
        return n;
    }
    if (js_eq(kw, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        n = mk(P, N_WRAP, line);
        expect_bend(P);
        n->b = p_body(P, ends, &end);
        expect_bend(P);
        return n;
    }
    jfail_st(P->e, IE_ERR_FORMAT, line, "unsupported tag '%.*s'", (int)(kw.n > 40 ? 40 : kw.n), kw.p);
}

/* Statements up to one of the end keywords (ends may be NULL: up to the end
 * of the template). The end keyword is consumed and returned in *end_out;
 * its tag's '%}' is left for the caller. */
static node_t *p_body(parser_t *P, const char *const *ends, jstr_t *end_out)
{
    node_t *head = NULL, **tail = &head;
    enter(P);
    for (;;) {
        tok_t *t = pk(P);
        node_t *n = NULL;
        if (t->t == T_EOF) {
            if (ends) {
                int last = 0;
                while (ends[last + 1]) last++;
                jfail_st(P->e, IE_ERR_FORMAT, t->line, "missing '{%% %s %%}'", ends[last]);
            }
            break;
        }
        if (t->t == T_TEXT) {
            n = mk(P, N_TEXT, t->line);
            n->name = t->s;
            P->i++;
        } else if (t->t == T_VBEGIN) {
            P->i++;
            n = mk(P, N_OUT, t->line);
            n->a = p_expr(P);
            if (pk(P)->t != T_VEND) perr(P, "'}}'");
            P->i++;
        } else if (t->t == T_BBEGIN) {
            P->i++;
            tok_t *kw = pk(P);
            if (kw->t != T_NAME) perr(P, "a tag name");
            for (int i = 0; ends && ends[i]; i++)
                if (js_eq(kw->s, ends[i])) {
                    P->i++;
                    *end_out = kw->s;
                    P->depth--;
                    return head;
                }
            if (kw->s.n >= 3 && (memcmp(kw->s.p, "end", 3) == 0 || js_eq(kw->s, "elif") || js_eq(kw->s, "else")))
                jfail_st(P->e, IE_ERR_FORMAT, kw->line, "unexpected '%.*s'", (int)(kw->s.n > 40 ? 40 : kw->s.n),
                         kw->s.p);
            P->i++;
            n = p_stmt(P, kw->s, kw->line);
        } else perr(P, "text or a tag");
        *tail = n;
        tail = &n->next;
    }
    P->depth--;
    return head;
}

/* ------------------------------------------------------------- evaluation */

typedef struct var {
    jstr_t name;
    jv_t v;
} var_t;

typedef struct frame {
    struct frame *parent;
    var_t *vars;
    size_t n, cap;
} frame_t;

/* Text with its content mask, growing in the render arena. */
typedef struct sb {
    char *p;
    uint8_t *m;
    size_t n, cap;
    bool any; /* some byte is content */
} sb_t;

typedef struct jx {
    jerr_t e;
    arena_t ar;
    frame_t *root;
    uint64_t steps, max_steps;
    size_t max_out;
    int depth, calls;
    time_t now;
} jx_t;

#define MAX_EVAL_DEPTH 3000

typedef struct jargs {
    jv_t pos[MAX_ARGS];
    size_t np;
    jstr_t kwn[MAX_ARGS];
    jv_t kwv[MAX_ARGS];
    size_t nk;
} jargs_t;

static jv_t eval(jx_t *x, const node_t *n, frame_t *f);
static int exec(jx_t *x, const node_t *n, frame_t *f, sb_t *out);

static void sb_add(jx_t *x, sb_t *b, const char *p, const uint8_t *m, size_t n)
{
    if (n > x->max_out || b->n + n > x->max_out) jfail(&x->e, 0, "output larger than %zu bytes", x->max_out);
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 64;
        while (c < b->n + n + 1) c *= 2;
        char *np = jalloc(&x->e, c);
        uint8_t *nm = jalloc(&x->e, c);
        if (b->n) {
            memcpy(np, b->p, b->n);
            memcpy(nm, b->m, b->n);
        }
        b->p = np;
        b->m = nm;
        b->cap = c;
    }
    memcpy(b->p + b->n, p, n);
    if (m) {
        memcpy(b->m + b->n, m, n);
        if (memchr(m, 1, n)) b->any = true;
    } else memset(b->m + b->n, 0, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_s(jx_t *x, sb_t *b, jstr_t s) { sb_add(x, b, s.p, s.m, s.n); }
static void sb_c(jx_t *x, sb_t *b, const char *s) { sb_add(x, b, s, NULL, strlen(s)); }

/* Add s with every byte marked content when mark is set. */
static void sb_mark(jx_t *x, sb_t *b, const char *s, size_t n, bool mark)
{
    size_t at = b->n;
    sb_add(x, b, s, NULL, n);
    if (mark && n) {
        memset(b->m + at, 1, n);
        b->any = true;
    }
}

static jstr_t sb_str(sb_t *b)
{
    if (!b->p) return (jstr_t){"", NULL, 0};
    return (jstr_t){b->p, b->any ? b->m : NULL, b->n};
}

static jstr_t js_sub(jstr_t s, size_t off, size_t n) { return (jstr_t){s.p + off, s.m ? s.m + off : NULL, n}; }
static bool js_content(jstr_t s) { return s.m && memchr(s.m, 1, s.n); }

static jstr_t js_cat(jx_t *x, jstr_t a, jstr_t b)
{
    sb_t o = {0};
    sb_s(x, &o, a);
    sb_s(x, &o, b);
    return sb_str(&o);
}

static void step(jx_t *x, int line)
{
    if (++x->steps > x->max_steps) jfail(&x->e, line, "evaluation step limit reached");
}

/* ----- frames */

static frame_t *frame_new(jx_t *x, frame_t *parent)
{
    frame_t *f = jalloc(&x->e, sizeof *f);
    memset(f, 0, sizeof *f);
    f->parent = parent;
    return f;
}

static jv_t *lookup(frame_t *f, jstr_t name)
{
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (js_same(f->vars[i].name, name)) return &f->vars[i].v;
    return NULL;
}

static void fset(jx_t *x, frame_t *f, jstr_t name, jv_t v)
{
    for (size_t i = 0; i < f->n; i++)
        if (js_same(f->vars[i].name, name)) {
            f->vars[i].v = v;
            return;
        }
    if (f->n == f->cap) {
        size_t c = f->cap ? f->cap * 2 : 8;
        var_t *nv = jalloc(&x->e, c * sizeof *nv);
        if (f->n) memcpy(nv, f->vars, f->n * sizeof *nv);
        f->vars = nv;
        f->cap = c;
    }
    f->vars[f->n++] = (var_t){name, v};
}

/* ----- str(), repr(), json */

static void fmt_float(double d, char *buf, size_t cap)
{
    if (isnan(d)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(buf, cap, d < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    /* tmp = [-]D[.DDD]e[+-]XX: Python's repr uses the same shortest digits */
    char digits[24];
    size_t nd = 0;
    const char *q = tmp;
    bool neg = *q == '-';
    if (neg) q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int ex = atoi(q + 1);
    char *o = buf;
    size_t left = cap;
#define PUT(...)                                  \
    do {                                          \
        int k_ = snprintf(o, left, __VA_ARGS__);  \
        if (k_ < 0 || (size_t)k_ >= left) return; \
        o += k_;                                  \
        left -= (size_t)k_;                       \
    } while (0)
    if (neg) PUT("-");
    if (ex >= -4 && ex < 16) {
        if (ex < 0) {
            PUT("0.");
            for (int i = 0; i < -ex - 1; i++) PUT("0");
            PUT("%s", digits);
        } else if ((size_t)ex >= nd - 1) {
            PUT("%s", digits);
            for (size_t i = nd - 1; i < (size_t)ex; i++) PUT("0");
            PUT(".0");
        } else PUT("%.*s.%s", ex + 1, digits, digits + ex + 1);
    } else {
        PUT("%c", digits[0]);
        if (nd > 1) PUT(".%s", digits + 1);
        PUT("e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    }
#undef PUT
}

static void repr(jx_t *x, sb_t *b, jv_t v, bool top, int level);

static void repr_str(jx_t *x, sb_t *b, jstr_t s)
{
    bool has_sq = memchr(s.p, '\'', s.n) != NULL, has_dq = memchr(s.p, '"', s.n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    bool mark = js_content(s);
    sb_add(x, b, &q, NULL, 1);
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        char e[8];
        if (c == '\\' || c == (unsigned char)q) snprintf(e, sizeof e, "\\%c", c);
        else if (c == '\n') snprintf(e, sizeof e, "\\n");
        else if (c == '\r') snprintf(e, sizeof e, "\\r");
        else if (c == '\t') snprintf(e, sizeof e, "\\t");
        else if (c < 0x20 || c == 0x7f) snprintf(e, sizeof e, "\\x%02x", c);
        else {
            e[0] = (char)c;
            e[1] = '\0';
        }
        sb_mark(x, b, e, strlen(e), mark);
    }
    sb_add(x, b, &q, NULL, 1);
}

static void repr(jx_t *x, sb_t *b, jv_t v, bool top, int level)
{
    char buf[48];
    /* a namespace can hold itself; Python prints [...], we refuse */
    if (level > 200) jfail(&x->e, 0, "value nested too deeply to print");
    switch (v.t) {
    case V_UNDEF: return;
    case V_NONE: sb_c(x, b, "None"); return;
    case V_BOOL: sb_c(x, b, v.i ? "True" : "False"); return;
    case V_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v.i);
        sb_c(x, b, buf);
        return;
    case V_FLOAT:
        fmt_float(v.f, buf, sizeof buf);
        sb_c(x, b, buf);
        return;
    case V_STR:
        if (top) sb_s(x, b, v.s);
        else repr_str(x, b, v.s);
        return;
    case V_LIST:
        sb_c(x, b, v.tup ? "(" : "[");
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) sb_c(x, b, ", ");
            repr(x, b, v.l->v[i], false, level + 1);
        }
        sb_c(x, b, v.tup ? (v.l->n == 1 ? ",)" : ")") : "]");
        return;
    case V_DICT:
        sb_c(x, b, v.ns ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) sb_c(x, b, ", ");
            repr(x, b, v.d->k[i], false, level + 1);
            sb_c(x, b, ": ");
            repr(x, b, v.d->v[i], false, level + 1);
        }
        sb_c(x, b, v.ns ? "}>" : "}");
        return;
    case V_MACRO: sb_c(x, b, "<Macro>"); return;
    case V_METHOD: sb_c(x, b, "<built-in method>"); return;
    }
}

/* Python str(v). */
static jstr_t to_str(jx_t *x, jv_t v)
{
    if (v.t == V_STR) return v.s;
    sb_t b = {0};
    repr(x, &b, v, true, 0);
    return sb_str(&b);
}

typedef struct jsonfmt {
    int indent; /* <0: none */
    jstr_t item_sep, key_sep;
    bool sort, ascii;
} jsonfmt_t;

static void json_str(jx_t *x, sb_t *b, jstr_t s, bool ascii)
{
    bool mark = js_content(s);
    sb_c(x, b, "\"");
    for (size_t i = 0; i < s.n;) {
        unsigned char c = (unsigned char)s.p[i];
        char e[16];
        size_t k = 1;
        if (c == '"') snprintf(e, sizeof e, "\\\"");
        else if (c == '\\') snprintf(e, sizeof e, "\\\\");
        else if (c == '\n') snprintf(e, sizeof e, "\\n");
        else if (c == '\r') snprintf(e, sizeof e, "\\r");
        else if (c == '\t') snprintf(e, sizeof e, "\\t");
        else if (c == '\b') snprintf(e, sizeof e, "\\b");
        else if (c == '\f') snprintf(e, sizeof e, "\\f");
        else if (c < 0x20) snprintf(e, sizeof e, "\\u%04x", c);
        else if (c >= 0x80 && ascii) {
            k = u8_len(s.p + i, s.n - i);
            uint32_t cp = u8_dec(s.p + i, k);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else snprintf(e, sizeof e, "\\u%04x", cp);
        } else {
            e[0] = (char)c;
            e[1] = '\0';
        }
        sb_mark(x, b, e, strlen(e), mark);
        i += k;
    }
    sb_c(x, b, "\"");
}

static void json_indent(jx_t *x, sb_t *b, const jsonfmt_t *fm, int level)
{
    sb_c(x, b, "\n");
    for (int i = 0; i < fm->indent * level; i++) sb_c(x, b, " ");
}

static int json_key_cmp(jv_t a, jv_t b)
{
    if (a.t == V_STR && b.t == V_STR) {
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        int c = memcmp(a.s.p, b.s.p, n);
        return c ? c : (a.s.n > b.s.n) - (a.s.n < b.s.n);
    }
    return 0;
}

static void json(jx_t *x, sb_t *b, jv_t v, const jsonfmt_t *fm, int level, int line)
{
    char buf[48];
    if (level > 200) jfail(&x->e, line, "tojson: value nested too deeply");
    switch (v.t) {
    case V_NONE: sb_c(x, b, "null"); return;
    case V_BOOL: sb_c(x, b, v.i ? "true" : "false"); return;
    case V_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v.i);
        sb_c(x, b, buf);
        return;
    case V_FLOAT:
        if (isnan(v.f)) sb_c(x, b, "NaN");
        else if (isinf(v.f)) sb_c(x, b, v.f < 0 ? "-Infinity" : "Infinity");
        else {
            fmt_float(v.f, buf, sizeof buf);
            sb_c(x, b, buf);
        }
        return;
    case V_STR: json_str(x, b, v.s, fm->ascii); return;
    case V_LIST:
        if (!v.l->n) {
            sb_c(x, b, "[]");
            return;
        }
        sb_c(x, b, "[");
        if (fm->indent >= 0) json_indent(x, b, fm, level + 1);
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) {
                sb_s(x, b, fm->item_sep);
                if (fm->indent >= 0) json_indent(x, b, fm, level + 1);
            }
            json(x, b, v.l->v[i], fm, level + 1, line);
        }
        if (fm->indent >= 0) json_indent(x, b, fm, level);
        sb_c(x, b, "]");
        return;
    case V_DICT: {
        if (v.ns) break;
        if (!v.d->n) {
            sb_c(x, b, "{}");
            return;
        }
        size_t *ord = jalloc(&x->e, v.d->n * sizeof *ord);
        for (size_t i = 0; i < v.d->n; i++) {
            ord[i] = i;
            for (size_t j = i; fm->sort && j > 0 && json_key_cmp(v.d->k[ord[j - 1]], v.d->k[ord[j]]) > 0; j--) {
                size_t t = ord[j];
                ord[j] = ord[j - 1];
                ord[j - 1] = t;
            }
        }
        sb_c(x, b, "{");
        if (fm->indent >= 0) json_indent(x, b, fm, level + 1);
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) {
                sb_s(x, b, fm->item_sep);
                if (fm->indent >= 0) json_indent(x, b, fm, level + 1);
            }
            jv_t k = v.d->k[ord[i]];
            if (k.t == V_STR) json_str(x, b, k.s, fm->ascii);
            else if (k.t == V_NONE || k.t == V_BOOL || k.t == V_INT || k.t == V_FLOAT) {
                sb_t kb = {0};
                json(x, &kb, k, fm, level + 1, line);
                sb_c(x, b, "\"");
                sb_s(x, b, sb_str(&kb));
                sb_c(x, b, "\"");
            } else jfail(&x->e, line, "tojson: keys must be str, int, float, bool or None");
            sb_s(x, b, fm->key_sep);
            json(x, b, v.d->v[ord[i]], fm, level + 1, line);
        }
        if (fm->indent >= 0) json_indent(x, b, fm, level);
        sb_c(x, b, "}");
        return;
    }
    default: break;
    }
    jfail(&x->e, line, "tojson: object of type '%s' is not JSON serializable", type_name(v));
}

/* ----- strings */

/* Code points of s: offsets[i] is the byte offset of code point i,
 * offsets[count] == s.n. */
static size_t *cp_offsets(jx_t *x, jstr_t s, size_t *count)
{
    size_t n = u8_count(s), k = 0;
    size_t *o = jalloc(&x->e, (n + 1) * sizeof *o);
    for (size_t i = 0; i < s.n; i += u8_len(s.p + i, s.n - i)) o[k++] = i;
    o[k] = s.n;
    *count = n;
    return o;
}

static bool cp_in(uint32_t c, const jstr_t *chars)
{
    if (!chars) return cp_space(c);
    for (size_t i = 0; i < chars->n;) {
        size_t k = u8_len(chars->p + i, chars->n - i);
        if (u8_dec(chars->p + i, k) == c) return true;
        i += k;
    }
    return false;
}

/* Python str.strip / lstrip / rstrip (chars NULL: whitespace). */
static jstr_t s_strip(jx_t *x, jstr_t s, const jstr_t *chars, bool left, bool right)
{
    size_t n;
    size_t *o = cp_offsets(x, s, &n);
    size_t a = 0, b = n;
    while (left && a < b && cp_in(u8_dec(s.p + o[a], o[a + 1] - o[a]), chars)) a++;
    while (right && b > a && cp_in(u8_dec(s.p + o[b - 1], o[b] - o[b - 1]), chars)) b--;
    return js_sub(s, o[a], o[b] - o[a]);
}

static size_t js_find(jstr_t s, jstr_t sub, size_t from)
{
    if (sub.n == 0) return from <= s.n ? from : SIZE_MAX;
    for (size_t i = from; i + sub.n <= s.n; i++)
        if (memcmp(s.p + i, sub.p, sub.n) == 0) return i;
    return SIZE_MAX;
}

/* Python str.split(sep, maxsplit); sep NULL: runs of whitespace. */
static jv_t s_split(jx_t *x, jstr_t s, const jstr_t *sep, int64_t maxsplit, int line)
{
    jlist_t *l = list_new(&x->e, 4);
    if (sep) {
        if (sep->n == 0) jfail(&x->e, line, "split: empty separator");
        size_t at = 0;
        for (int64_t k = 0; maxsplit < 0 || k < maxsplit; k++) {
            size_t p = js_find(s, *sep, at);
            if (p == SIZE_MAX) break;
            list_push(&x->e, l, v_str(js_sub(s, at, p - at)));
            at = p + sep->n;
        }
        list_push(&x->e, l, v_str(js_sub(s, at, s.n - at)));
        return v_list(l);
    }
    size_t n;
    size_t *o = cp_offsets(x, s, &n);
    size_t i = 0;
#define SP(j) cp_space(u8_dec(s.p + o[j], o[(j) + 1] - o[j]))
    for (int64_t k = 0;; k++) {
        while (i < n && SP(i)) i++;
        if (i == n) break;
        if (maxsplit >= 0 && k >= maxsplit) {
            size_t e = n;
            while (e > i && SP(e - 1)) e--;
            list_push(&x->e, l, v_str(js_sub(s, o[i], o[e] - o[i])));
            break;
        }
        size_t j = i;
        while (j < n && !SP(j)) j++;
        list_push(&x->e, l, v_str(js_sub(s, o[i], o[j] - o[i])));
        i = j;
    }
#undef SP
    return v_list(l);
}

static jstr_t s_replace(jx_t *x, jstr_t s, jstr_t old, jstr_t rep, int64_t count)
{
    sb_t b = {0};
    size_t at = 0;
    if (old.n == 0) { /* Python inserts rep between every code point */
        size_t n;
        size_t *o = cp_offsets(x, s, &n);
        for (size_t i = 0; i <= n; i++) {
            if (count < 0 || (int64_t)i < count) sb_s(x, &b, rep);
            if (i < n) sb_s(x, &b, js_sub(s, o[i], o[i + 1] - o[i]));
        }
        return sb_str(&b);
    }
    for (int64_t k = 0; count < 0 || k < count; k++) {
        size_t p = js_find(s, old, at);
        if (p == SIZE_MAX) break;
        sb_s(x, &b, js_sub(s, at, p - at));
        sb_s(x, &b, rep);
        at = p + old.n;
    }
    sb_s(x, &b, js_sub(s, at, s.n - at));
    return sb_str(&b);
}

/* ASCII case mapping, as the templates need it for role names and the
 * like; other code points are kept. mode: 'u' upper, 'l' lower, 't' title,
 * 'c' capitalize. */
static jstr_t s_case(jx_t *x, jstr_t s, char mode)
{
    char *d = jalloc(&x->e, s.n + 1);
    bool prev_alpha = false;
    for (size_t i = 0; i < s.n; i++) {
        char c = s.p[i];
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        bool up = mode == 'u' || (mode == 't' && !prev_alpha) || (mode == 'c' && i == 0);
        if (alpha) c = up ? (char)(c & ~0x20) : mode == 'u' ? c : (char)(c | 0x20);
        if (mode == 't') prev_alpha = alpha || (unsigned char)c >= 0x80 || (c >= '0' && c <= '9');
        d[i] = c;
    }
    d[s.n] = '\0';
    return (jstr_t){d, s.m, s.n};
}

/* ----- collections */

static jlist_t *iter_list(jx_t *x, jv_t v, int line)
{
    jlist_t *l;
    switch (v.t) {
    case V_UNDEF: return list_new(&x->e, 1);
    case V_LIST: return v.l;
    case V_DICT:
        if (v.ns) break;
        l = list_new(&x->e, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) list_push(&x->e, l, v.d->k[i]);
        return l;
    case V_STR: {
        size_t n;
        size_t *o = cp_offsets(x, v.s, &n);
        l = list_new(&x->e, n);
        for (size_t i = 0; i < n; i++) list_push(&x->e, l, v_str(js_sub(v.s, o[i], o[i + 1] - o[i])));
        return l;
    }
    default: break;
    }
    jfail(&x->e, line, "'%s' object is not iterable", type_name(v));
}

static int64_t v_len(jx_t *x, jv_t v, int line)
{
    switch (v.t) {
    case V_UNDEF: return 0;
    case V_STR: return (int64_t)u8_count(v.s);
    case V_LIST: return (int64_t)v.l->n;
    case V_DICT:
        if (!v.ns) return (int64_t)v.d->n;
        break;
    default: break;
    }
    jfail(&x->e, line, "object of type '%s' has no len()", type_name(v));
}

static jv_t items_of(jx_t *x, jv_t d)
{
    jlist_t *l = list_new(&x->e, d.d->n);
    for (size_t i = 0; i < d.d->n; i++) {
        jlist_t *p = list_new(&x->e, 2);
        list_push(&x->e, p, d.d->k[i]);
        list_push(&x->e, p, d.d->v[i]);
        jv_t pair = v_list(p);
        pair.tup = true;
        list_push(&x->e, l, pair);
    }
    return v_list(l);
}

static bool contains(jx_t *x, jv_t hay, jv_t needle, int line)
{
    switch (hay.t) {
    case V_UNDEF: return false;
    case V_STR:
        if (needle.t != V_STR) jfail(&x->e, line, "'in <string>' requires string as left operand");
        return js_find(hay.s, needle.s, 0) != SIZE_MAX;
    case V_LIST:
        for (size_t i = 0; i < hay.l->n; i++)
            if (v_eq(hay.l->v[i], needle)) return true;
        return false;
    case V_DICT: return !hay.ns && dict_find(hay.d, needle) != NULL;
    default: jfail(&x->e, line, "argument of type '%s' is not iterable", type_name(hay));
    }
}

static int v_cmp(jx_t *x, jv_t a, jv_t b, int line)
{
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT) return (a.i > b.i) - (a.i < b.i);
        double p = num_f(a), q = num_f(b);
        return (p > q) - (p < q);
    }
    if (a.t == V_STR && b.t == V_STR) {
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        int c = memcmp(a.s.p, b.s.p, n);
        return c ? (c > 0) - (c < 0) : (a.s.n > b.s.n) - (a.s.n < b.s.n);
    }
    if (a.t == V_LIST && b.t == V_LIST) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (v_eq(a.l->v[i], b.l->v[i])) continue;
            return v_cmp(x, a.l->v[i], b.l->v[i], line);
        }
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    jfail(&x->e, line, "comparison not supported between '%s' and '%s'", type_name(a), type_name(b));
}

/* A slice bound as Python's slice.indices clamps it. */
static int64_t slice_norm(jv_t v, int64_t n, int64_t dflt, int64_t stepv, int line, jx_t *x)
{
    if (v.t == V_NONE || v.t == V_UNDEF) return dflt;
    if (v.t != V_INT && v.t != V_BOOL) jfail(&x->e, line, "slice indices must be integers or None");
    int64_t i = v.i;
    if (i < 0) {
        i += n;
        if (i < 0) i = stepv < 0 ? -1 : 0;
    } else if (i >= n) i = stepv < 0 ? n - 1 : n;
    return i;
}

static jv_t do_slice(jx_t *x, jv_t o, jv_t a, jv_t b, jv_t c, int line)
{
    int64_t stepv = 1;
    if (c.t == V_INT || c.t == V_BOOL) stepv = c.i;
    else if (c.t != V_NONE && c.t != V_UNDEF) jfail(&x->e, line, "slice step must be an integer");
    if (stepv == 0) jfail(&x->e, line, "slice step cannot be zero");
    size_t ncp = 0, *off = NULL;
    int64_t n;
    if (o.t == V_STR) {
        off = cp_offsets(x, o.s, &ncp);
        n = (int64_t)ncp;
    } else if (o.t == V_LIST) n = (int64_t)o.l->n;
    else jfail(&x->e, line, "'%s' object is not subscriptable", type_name(o));
    int64_t s = slice_norm(a, n, stepv > 0 ? 0 : n - 1, stepv, line, x);
    int64_t e = slice_norm(b, n, stepv > 0 ? n : -1, stepv, line, x);
    if (o.t == V_LIST) {
        jlist_t *l = list_new(&x->e, 4);
        for (int64_t i = s; stepv > 0 ? i < e : i > e; i += stepv) {
            list_push(&x->e, l, o.l->v[i]);
            if (stepv > 0 ? i > INT64_MAX - stepv : i < INT64_MIN - stepv) break;
        }
        return v_list(l);
    }
    if (stepv == 1) return v_str(js_sub(o.s, off[s < e ? s : e], s < e ? off[e] - off[s] : 0));
    sb_t r = {0};
    for (int64_t i = s; stepv > 0 ? i < e : i > e; i += stepv) {
        sb_s(x, &r, js_sub(o.s, off[i], off[i + 1] - off[i]));
        if (stepv > 0 ? i > INT64_MAX - stepv : i < INT64_MIN - stepv) break;
    }
    return v_str(sb_str(&r));
}

static const char *const STR_METHODS[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split",
                                          "rsplit",     "replace",  "upper", "lower",  "title",  "capitalize",
                                          "find",       "count",    "join",  NULL};
static const char *const DICT_METHODS[] = {"get",  "items",      "keys",  "values",  "pop", "update",
                                           "copy", "setdefault", "clear", "popitem", NULL};
static const char *const LIST_METHODS[] = {"append", "extend", "pop",     "insert", "remove", "index",
                                           "count",  "sort",   "reverse", "copy",   "clear",  NULL};

static const char *const GLOBALS[] = {"raise_exception", "strftime_now", "namespace", "dict", "range", NULL};

static _Noreturn void fail_undef(jx_t *x, jv_t v, int line, const char *what, jstr_t name)
{
    if (v.s.p)
        jfail(&x->e, line, "'%.*s' is undefined (reading %s '%.*s')", (int)(v.s.n > 60 ? 60 : v.s.n), v.s.p, what,
              (int)(name.n > 60 ? 60 : name.n), name.p ? name.p : "");
    jfail(&x->e, line, "undefined value has no %s '%.*s'", what, (int)(name.n > 60 ? 60 : name.n),
          name.p ? name.p : "");
}

static jv_t get_attr(jx_t *x, jv_t o, jstr_t name, int line)
{
    switch (o.t) {
    case V_UNDEF: fail_undef(x, o, line, "attribute", name);
    case V_DICT: {
        if (!o.ns && in_table(DICT_METHODS, name)) return (jv_t){.t = V_METHOD};
        jv_t *v = dict_find_s(o.d, name);
        return v ? *v : (jv_t){.t = V_UNDEF, .s = name};
    }
    case V_STR:
        if (in_table(STR_METHODS, name)) return (jv_t){.t = V_METHOD};
        break;
    case V_LIST:
        if (in_table(LIST_METHODS, name)) return (jv_t){.t = V_METHOD};
        break;
    default: break;
    }
    return (jv_t){.t = V_UNDEF, .s = name};
}

static jv_t get_item(jx_t *x, jv_t o, jv_t k, int line)
{
    switch (o.t) {
    case V_UNDEF: fail_undef(x, o, line, "item", k.t == V_STR ? k.s : js_lit("?"));
    case V_DICT: {
        jv_t *v = dict_find(o.d, k);
        if (v) return *v;
        if (k.t == V_STR) return get_attr(x, o, k.s, line);
        return UNDEF;
    }
    case V_LIST:
        if (k.t == V_INT || k.t == V_BOOL) {
            int64_t i = k.i < 0 ? k.i + (int64_t)o.l->n : k.i;
            return i >= 0 && i < (int64_t)o.l->n ? o.l->v[i] : UNDEF;
        }
        break;
    case V_STR:
        if (k.t == V_INT || k.t == V_BOOL) {
            size_t n;
            size_t *off = cp_offsets(x, o.s, &n);
            int64_t i = k.i < 0 ? k.i + (int64_t)n : k.i;
            return i >= 0 && i < (int64_t)n ? v_str(js_sub(o.s, off[i], off[i + 1] - off[i])) : UNDEF;
        }
        break;
    default: break;
    }
    if (k.t == V_STR) return get_attr(x, o, k.s, line);
    return UNDEF;
}

/* ----- arguments */

static void eval_args(jx_t *x, const node_t *args, frame_t *f, jargs_t *a, int line)
{
    a->np = a->nk = 0;
    for (const node_t *n = args; n; n = n->next) {
        if (n->k == E_KW) {
            if (a->nk == MAX_ARGS) jfail(&x->e, line, "more than %d keyword arguments", MAX_ARGS);
            a->kwn[a->nk] = n->name;
            a->kwv[a->nk++] = eval(x, n->b, f);
        } else {
            if (a->nk) jfail(&x->e, line, "positional argument after keyword argument");
            if (a->np == MAX_ARGS) jfail(&x->e, line, "more than %d arguments", MAX_ARGS);
            a->pos[a->np++] = eval(x, n, f);
        }
    }
}

/* Argument i, or the keyword argument `name`; NULL if absent. */
static const jv_t *arg(const jargs_t *a, size_t i, const char *name)
{
    if (i < a->np) return &a->pos[i];
    for (size_t k = 0; name && k < a->nk; k++)
        if (js_eq(a->kwn[k], name)) return &a->kwv[k];
    return NULL;
}

static jstr_t arg_str(jx_t *x, const jargs_t *a, size_t i, const char *name, const char *dflt, const char *fn,
                      int line)
{
    const jv_t *v = arg(a, i, name);
    if (!v || (dflt && v->t == V_NONE)) {
        if (!dflt) jfail(&x->e, line, "%s: missing argument '%s'", fn, name ? name : "");
        return js_lit(dflt);
    }
    if (v->t != V_STR)
        jfail(&x->e, line, "%s: argument '%s' must be a string, not %s", fn, name ? name : "", type_name(*v));
    return v->s;
}

static int64_t arg_int(jx_t *x, const jargs_t *a, size_t i, const char *name, int64_t dflt, const char *fn,
                       int line)
{
    const jv_t *v = arg(a, i, name);
    if (!v || v->t == V_NONE) return dflt;
    if (v->t != V_INT && v->t != V_BOOL)
        jfail(&x->e, line, "%s: argument '%s' must be an integer", fn, name ? name : "");
    return v->i;
}

/* ----- tests */

static bool apply_test(jx_t *x, jstr_t name, jv_t v, const jargs_t *a, int line)
{
    const jv_t *o = arg(a, 0, NULL);
#define NEED_ARG \
    if (!o) jfail(&x->e, line, "test '%.*s' needs an argument", (int)name.n, name.p)
    if (js_eq(name, "defined")) return v.t != V_UNDEF;
    if (js_eq(name, "undefined")) return v.t == V_UNDEF;
    if (js_eq(name, "none")) return v.t == V_NONE;
    if (js_eq(name, "string")) return v.t == V_STR;
    if (js_eq(name, "mapping")) return v.t == V_DICT && !v.ns;
    if (js_eq(name, "iterable")) return v.t == V_UNDEF || v.t == V_STR || v.t == V_LIST || (v.t == V_DICT && !v.ns);
    if (js_eq(name, "sequence")) return v.t == V_UNDEF || v.t == V_STR || v.t == V_LIST || (v.t == V_DICT && !v.ns);
    if (js_eq(name, "number")) return is_num(v);
    if (js_eq(name, "integer")) return v.t == V_INT;
    if (js_eq(name, "float")) return v.t == V_FLOAT;
    if (js_eq(name, "boolean")) return v.t == V_BOOL;
    if (js_eq(name, "true")) return v.t == V_BOOL && v.i;
    if (js_eq(name, "false")) return v.t == V_BOOL && !v.i;
    if (js_eq(name, "callable")) return v.t == V_MACRO || v.t == V_METHOD;
    if (js_eq(name, "lower") || js_eq(name, "upper")) {
        if (v.t != V_STR) return false;
        jstr_t c = s_case(x, v.s, name.p[0] == 'l' ? 'l' : 'u');
        bool cased = false;
        for (size_t i = 0; i < v.s.n; i++) cased |= (v.s.p[i] | 0x20) >= 'a' && (v.s.p[i] | 0x20) <= 'z';
        return cased && memcmp(c.p, v.s.p, v.s.n) == 0;
    }
    if (js_eq(name, "odd") || js_eq(name, "even")) {
        if (v.t != V_INT && v.t != V_BOOL) jfail(&x->e, line, "test '%.*s' needs an integer", (int)name.n, name.p);
        return (v.i % 2 != 0) == (name.p[0] == 'o');
    }
    NEED_ARG;
    if (js_eq(name, "equalto") || js_eq(name, "eq") || js_eq(name, "==")) return v_eq(v, *o);
    if (js_eq(name, "ne") || js_eq(name, "!=")) return !v_eq(v, *o);
    if (js_eq(name, "sameas")) {
        if (v.t != o->t) return false;
        if (v.t == V_STR) return v.s.p == o->s.p && v.s.n == o->s.n;
        if (v.t == V_LIST) return v.l == o->l;
        if (v.t == V_DICT) return v.d == o->d;
        return v_eq(v, *o);
    }
    if (js_eq(name, "in")) return contains(x, *o, v, line);
    if (js_eq(name, "divisibleby")) {
        if (!is_num(v) || !is_num(*o)) jfail(&x->e, line, "divisibleby needs numbers");
        if (v.t != V_FLOAT && o->t != V_FLOAT) {
            if (o->i == 0) jfail(&x->e, line, "integer division or modulo by zero");
            return v.i % o->i == 0;
        }
        return num_f(*o) != 0 && fmod(num_f(v), num_f(*o)) == 0;
    }
    int c = v_cmp(x, v, *o, line);
    if (js_eq(name, "gt") || js_eq(name, "greaterthan")) return c > 0;
    if (js_eq(name, "ge")) return c >= 0;
    if (js_eq(name, "lt") || js_eq(name, "lessthan")) return c < 0;
    if (js_eq(name, "le")) return c <= 0;
#undef NEED_ARG
    jfail(&x->e, line, "unsupported test '%.*s'", (int)name.n, name.p);
}

/* ----- filters */

static jv_t apply_filter(jx_t *x, jstr_t name, jv_t v, const jargs_t *a, int line);

/* selectattr / rejectattr / select / reject: keep the items whose (attribute)
 * passes the test named by the next argument, or is truthy without one. */
static jv_t filter_select(jx_t *x, jv_t v, const jargs_t *a, bool by_attr, bool keep, int line)
{
    jlist_t *in = iter_list(x, v, line), *out = list_new(&x->e, in->n);
    size_t first = by_attr ? 1 : 0;
    jstr_t attr = by_attr ? arg_str(x, a, 0, NULL, NULL, "selectattr", line) : js_lit("");
    jargs_t ta = {0};
    for (size_t i = first + 1; i < a->np; i++) ta.pos[ta.np++] = a->pos[i];
    const jv_t *tn = first < a->np ? &a->pos[first] : NULL;
    if (tn && tn->t != V_STR) jfail(&x->e, line, "select: the test name must be a string");
    if (tn && !in_table(TESTS, tn->s))
        jfail(&x->e, line, "unsupported test '%.*s'", (int)(tn->s.n > 40 ? 40 : tn->s.n), tn->s.p);
    for (size_t i = 0; i < in->n; i++) {
        jv_t it = in->v[i];
        if (by_attr) it = get_attr(x, it, attr, line);
        bool pass = tn ? apply_test(x, tn->s, it, &ta, line) : v_truthy(it);
        if (pass == keep) list_push(&x->e, out, in->v[i]);
    }
    return v_list(out);
}

static jv_t apply_filter(jx_t *x, jstr_t name, jv_t v, const jargs_t *a, int line)
{
    if (js_eq(name, "trim")) {
        jstr_t chars;
        const jv_t *c = arg(a, 0, "chars");
        if (c && c->t == V_STR) chars = c->s;
        return v_str(s_strip(x, to_str(x, v), c && c->t == V_STR ? &chars : NULL, true, true));
    }
    if (js_eq(name, "length") || js_eq(name, "count")) return v_int(v_len(x, v, line));
    if (js_eq(name, "tojson")) {
        jsonfmt_t fm = {.indent = -1};
        const jv_t *ind = arg(a, 1, "indent"), *sep = arg(a, 2, "separators"), *srt = arg(a, 3, "sort_keys"),
                   *asc = arg(a, 0, "ensure_ascii");
        if (ind && ind->t != V_NONE) {
            if (ind->t != V_INT) jfail(&x->e, line, "tojson: indent must be an integer");
            fm.indent = ind->i < 0 ? 0 : ind->i > 64 ? 64 : (int)ind->i;
        }
        fm.item_sep = js_lit(fm.indent >= 0 ? "," : ", ");
        fm.key_sep = js_lit(": ");
        if (sep && sep->t != V_NONE) {
            if (sep->t != V_LIST || sep->l->n != 2 || sep->l->v[0].t != V_STR || sep->l->v[1].t != V_STR)
                jfail(&x->e, line, "tojson: separators must be a pair of strings");
            fm.item_sep = sep->l->v[0].s;
            fm.key_sep = sep->l->v[1].s;
        }
        fm.sort = srt && v_truthy(*srt);
        fm.ascii = asc && v_truthy(*asc);
        sb_t b = {0};
        json(x, &b, v, &fm, 0, line);
        return v_str(sb_str(&b));
    }
    if (js_eq(name, "upper")) return v_str(s_case(x, to_str(x, v), 'u'));
    if (js_eq(name, "lower")) return v_str(s_case(x, to_str(x, v), 'l'));
    if (js_eq(name, "capitalize")) return v_str(s_case(x, s_case(x, to_str(x, v), 'l'), 'c'));
    if (js_eq(name, "title")) return v_str(s_case(x, to_str(x, v), 't'));
    if (js_eq(name, "first") || js_eq(name, "last")) {
        jlist_t *l = iter_list(x, v, line);
        if (!l->n) return UNDEF;
        return l->v[name.p[0] == 'f' ? 0 : l->n - 1];
    }
    if (js_eq(name, "join")) {
        jstr_t sep = arg_str(x, a, 0, "d", "", "join", line);
        const jv_t *at = arg(a, 1, "attribute");
        jlist_t *l = iter_list(x, v, line);
        sb_t b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i) sb_s(x, &b, sep);
            jv_t it = l->v[i];
            if (at && at->t == V_STR) it = get_attr(x, it, at->s, line);
            sb_s(x, &b, to_str(x, it));
        }
        return v_str(sb_str(&b));
    }
    if (js_eq(name, "default") || js_eq(name, "d")) {
        const jv_t *dv = arg(a, 0, "default_value"), *bo = arg(a, 1, "boolean");
        bool use = v.t == V_UNDEF || (bo && v_truthy(*bo) && !v_truthy(v));
        return use ? (dv ? *dv : v_str(js_lit(""))) : v;
    }
    if (js_eq(name, "items")) {
        if (v.t == V_UNDEF) return v_list(list_new(&x->e, 1));
        if (v.t != V_DICT || v.ns) jfail(&x->e, line, "items: '%s' is not a mapping", type_name(v));
        return items_of(x, v);
    }
    if (js_eq(name, "selectattr")) return filter_select(x, v, a, true, true, line);
    if (js_eq(name, "rejectattr")) return filter_select(x, v, a, true, false, line);
    if (js_eq(name, "select")) return filter_select(x, v, a, false, true, line);
    if (js_eq(name, "reject")) return filter_select(x, v, a, false, false, line);
    if (js_eq(name, "map")) {
        jlist_t *in = iter_list(x, v, line), *out = list_new(&x->e, in->n);
        const jv_t *at = arg(a, SIZE_MAX, "attribute"), *dflt = arg(a, SIZE_MAX, "default");
        jargs_t fa = {0};
        if (!at) {
            if (a->np < 1 || a->pos[0].t != V_STR) jfail(&x->e, line, "map: needs a filter name or attribute=");
            if (!in_table(FILTERS, a->pos[0].s) || js_eq(a->pos[0].s, "map"))
                jfail(&x->e, line, "map: unsupported filter '%.*s'", (int)(a->pos[0].s.n > 40 ? 40 : a->pos[0].s.n),
                      a->pos[0].s.p);
            for (size_t i = 1; i < a->np; i++) fa.pos[fa.np++] = a->pos[i];
        } else if (at->t != V_STR) jfail(&x->e, line, "map: attribute must be a string");
        for (size_t i = 0; i < in->n; i++) {
            jv_t r;
            if (at) {
                r = get_attr(x, in->v[i], at->s, line);
                if (r.t == V_UNDEF && dflt) r = *dflt;
            } else r = apply_filter(x, a->pos[0].s, in->v[i], &fa, line);
            list_push(&x->e, out, r);
        }
        return v_list(out);
    }
    if (js_eq(name, "replace")) {
        jstr_t old = arg_str(x, a, 0, "old", NULL, "replace", line),
               rep = arg_str(x, a, 1, "new", NULL, "replace", line);
        return v_str(s_replace(x, to_str(x, v), old, rep, arg_int(x, a, 2, "count", -1, "replace", line)));
    }
    if (js_eq(name, "string") || js_eq(name, "safe")) return v_str(to_str(x, v));
    if (js_eq(name, "int") || js_eq(name, "float")) {
        bool fl = name.p[0] == 'f';
        const jv_t *dv = arg(a, 0, "default");
        jv_t dflt = dv ? *dv : fl ? v_float(0.0) : v_int(0);
        if (v.t == V_INT || v.t == V_BOOL) return fl ? v_float((double)v.i) : v_int(v.i);
        if (v.t == V_FLOAT) {
            if (fl) return v;
            if (!isfinite(v.f) || fabs(v.f) >= 9.2e18) return dflt;
            return v_int((int64_t)v.f);
        }
        if (v.t != V_STR || v.s.n > 60) return dflt;
        char buf[64];
        jstr_t t = s_strip(x, v.s, NULL, true, true);
        memcpy(buf, t.p, t.n);
        buf[t.n] = '\0';
        char *end;
        if (!fl) {
            long long i = strtoll(buf, &end, 10);
            if (t.n && *end == '\0') return v_int(i);
        }
        double d = strtod(buf, &end);
        if (!t.n || *end != '\0') return dflt;
        if (fl) return v_float(d);
        if (!isfinite(d) || fabs(d) >= 9.2e18) return dflt;
        return v_int((int64_t)d);
    }
    if (js_eq(name, "list")) {
        jlist_t *in = iter_list(x, v, line), *out = list_new(&x->e, in->n);
        for (size_t i = 0; i < in->n; i++) list_push(&x->e, out, in->v[i]);
        return v_list(out);
    }
    if (js_eq(name, "reverse")) {
        if (v.t == V_STR) return do_slice(x, v, NONE, NONE, v_int(-1), line);
        jlist_t *in = iter_list(x, v, line), *out = list_new(&x->e, in->n);
        for (size_t i = in->n; i-- > 0;) list_push(&x->e, out, in->v[i]);
        return v_list(out);
    }
    if (js_eq(name, "abs")) {
        if (v.t == V_FLOAT) return v_float(fabs(v.f));
        if ((v.t == V_INT || v.t == V_BOOL) && v.i != INT64_MIN) return v_int(v.i < 0 ? -v.i : v.i);
        jfail(&x->e, line, "abs: bad operand type '%s'", type_name(v));
    }
    if (js_eq(name, "unique")) {
        jlist_t *in = iter_list(x, v, line), *out = list_new(&x->e, in->n);
        for (size_t i = 0; i < in->n; i++) {
            bool seen = false;
            for (size_t j = 0; j < out->n && !seen; j++) seen = v_eq(out->v[j], in->v[i]);
            if (!seen) list_push(&x->e, out, in->v[i]);
        }
        return v_list(out);
    }
    jfail(&x->e, line, "unsupported filter '%.*s'", (int)name.n, name.p);
}

/* ----- methods and globals */

static bool starts_ends(jx_t *x, jstr_t s, jv_t p, bool end, int line)
{
    if (p.t == V_LIST) {
        for (size_t i = 0; i < p.l->n; i++)
            if (starts_ends(x, s, p.l->v[i], end, line)) return true;
        return false;
    }
    if (p.t != V_STR)
        jfail(&x->e, line, "%s: argument must be a string or a tuple", end ? "endswith" : "startswith");
    if (p.s.n > s.n) return false;
    return memcmp(s.p + (end ? s.n - p.s.n : 0), p.s.p, p.s.n) == 0;
}

static jv_t call_method(jx_t *x, jv_t o, jstr_t m, const jargs_t *a, int line)
{
    if (o.t == V_STR) {
        jstr_t s = o.s;
        if (js_eq(m, "startswith") || js_eq(m, "endswith")) {
            const jv_t *p = arg(a, 0, NULL);
            if (!p) jfail(&x->e, line, "%.*s: missing argument", (int)m.n, m.p);
            return v_bool(starts_ends(x, s, *p, m.p[0] == 'e', line));
        }
        if (js_eq(m, "strip") || js_eq(m, "lstrip") || js_eq(m, "rstrip")) {
            const jv_t *c = arg(a, 0, NULL);
            jstr_t chars;
            if (c && c->t == V_STR) chars = c->s;
            else if (c && c->t != V_NONE) jfail(&x->e, line, "%.*s: argument must be a string", (int)m.n, m.p);
            return v_str(s_strip(x, s, c && c->t == V_STR ? &chars : NULL, m.p[0] != 'r', m.p[0] != 'l'));
        }
        if (js_eq(m, "split") || js_eq(m, "rsplit")) {
            const jv_t *sep = arg(a, 0, "sep");
            int64_t maxsplit = arg_int(x, a, 1, "maxsplit", -1, "split", line);
            if (m.p[0] == 'r' && maxsplit >= 0) jfail(&x->e, line, "rsplit with maxsplit is not supported");
            if (sep && sep->t != V_NONE && sep->t != V_STR) jfail(&x->e, line, "split: separator must be a string");
            return s_split(x, s, sep && sep->t == V_STR ? &sep->s : NULL, maxsplit, line);
        }
        if (js_eq(m, "replace")) {
            jstr_t old = arg_str(x, a, 0, NULL, NULL, "replace", line),
                   rep = arg_str(x, a, 1, NULL, NULL, "replace", line);
            return v_str(s_replace(x, s, old, rep, arg_int(x, a, 2, "count", -1, "replace", line)));
        }
        if (js_eq(m, "upper")) return v_str(s_case(x, s, 'u'));
        if (js_eq(m, "lower")) return v_str(s_case(x, s, 'l'));
        if (js_eq(m, "title")) return v_str(s_case(x, s, 't'));
        if (js_eq(m, "capitalize")) return v_str(s_case(x, s_case(x, s, 'l'), 'c'));
        if (js_eq(m, "find") || js_eq(m, "count")) {
            jstr_t sub = arg_str(x, a, 0, NULL, NULL, "find", line);
            if (m.p[0] == 'f') {
                size_t p = js_find(s, sub, 0);
                return v_int(p == SIZE_MAX ? -1 : (int64_t)u8_count(js_sub(s, 0, p)));
            }
            if (!sub.n) return v_int((int64_t)u8_count(s) + 1);
            int64_t c = 0;
            for (size_t p = js_find(s, sub, 0); p != SIZE_MAX; p = js_find(s, sub, p + sub.n)) c++;
            return v_int(c);
        }
        if (js_eq(m, "join")) {
            const jv_t *it = arg(a, 0, NULL);
            if (!it) jfail(&x->e, line, "join: missing argument");
            jlist_t *l = iter_list(x, *it, line);
            sb_t b = {0};
            for (size_t i = 0; i < l->n; i++) {
                if (l->v[i].t != V_STR) jfail(&x->e, line, "join: sequence item %zu: expected str", i);
                if (i) sb_s(x, &b, s);
                sb_s(x, &b, l->v[i].s);
            }
            return v_str(sb_str(&b));
        }
    } else if (o.t == V_DICT && !o.ns) {
        if (js_eq(m, "get")) {
            const jv_t *k = arg(a, 0, NULL), *d = arg(a, 1, NULL);
            if (!k) jfail(&x->e, line, "get: missing argument");
            jv_t *v = dict_find(o.d, *k);
            return v ? *v : d ? *d : NONE;
        }
        if (js_eq(m, "items")) return items_of(x, o);
        if (js_eq(m, "keys") || js_eq(m, "values")) {
            jlist_t *l = list_new(&x->e, o.d->n);
            for (size_t i = 0; i < o.d->n; i++) list_push(&x->e, l, m.p[0] == 'k' ? o.d->k[i] : o.d->v[i]);
            return v_list(l);
        }
        if (in_table(DICT_METHODS, m))
            jfail(&x->e, line, "dict.%.*s() is not allowed: templates cannot modify data", (int)m.n, m.p);
    } else if (o.t == V_LIST && in_table(LIST_METHODS, m)) {
        jfail(&x->e, line, "list.%.*s() is not supported", (int)m.n, m.p);
    } else if (o.t == V_UNDEF) fail_undef(x, o, line, "method", m);
    jfail(&x->e, line, "unsupported method '%.*s' on %s", (int)(m.n > 40 ? 40 : m.n), m.p, type_name(o));
}

static jv_t call_macro(jx_t *x, const node_t *mac, const jargs_t *a, int line)
{
    if (++x->calls > MAX_CALL_DEPTH) jfail(&x->e, line, "macro recursion deeper than %d", MAX_CALL_DEPTH);
    frame_t *f = frame_new(x, x->root);
    size_t i = 0;
    for (const node_t *p = mac->args; p; p = p->next, i++) {
        const jv_t *v = i < a->np ? &a->pos[i] : NULL;
        for (size_t k = 0; !v && k < a->nk; k++)
            if (js_same(a->kwn[k], p->name)) v = &a->kwv[k];
        fset(x, f, p->name, v ? *v : p->b ? eval(x, p->b, f) : (jv_t){.t = V_UNDEF, .s = p->name});
    }
    if (a->np > i)
        jfail(&x->e, line, "macro '%.*s' takes no more than %zu argument(s)", (int)mac->name.n, mac->name.p, i);
    for (size_t k = 0; k < a->nk; k++) {
        bool known = false;
        for (const node_t *p = mac->args; p && !known; p = p->next) known = js_same(p->name, a->kwn[k]);
        if (!known)
            jfail(&x->e, line, "macro '%.*s' takes no keyword argument '%.*s'", (int)mac->name.n, mac->name.p,
                  (int)(a->kwn[k].n > 40 ? 40 : a->kwn[k].n), a->kwn[k].p);
    }
    sb_t out = {0};
    exec(x, mac->b, f, &out);
    x->calls--;
    return v_str(sb_str(&out));
}

static jv_t call_global(jx_t *x, jstr_t name, const jargs_t *a, int line)
{
    if (js_eq(name, "raise_exception")) {
        const jv_t *m = arg(a, 0, "message");
        jstr_t s = m ? to_str(x, *m) : js_lit("");
        snprintf(x->e.msg, sizeof x->e.msg, "chat template raised: %.*s", (int)(s.n > 280 ? 280 : s.n), s.p);
        x->e.st = IE_ERR_INVAL;
        x->e.raised = 1;
        longjmp(x->e.jb, 1);
    }
    if (js_eq(name, "strftime_now")) {
        jstr_t fmt = arg_str(x, a, 0, "format", NULL, "strftime_now", line);
        if (fmt.n > 200) jfail(&x->e, line, "strftime_now: format too long");
        char f[256], out[1024];
        memcpy(f, fmt.p, fmt.n);
        f[fmt.n] = '\0';
        struct tm tm;
        localtime_r(&x->now, &tm);
        size_t n = fmt.n ? strftime(out, sizeof out, f, &tm) : 0;
        return v_str(js_copy(&x->e, out, n, 0));
    }
    if (js_eq(name, "namespace") || js_eq(name, "dict")) {
        jdict_t *d = dict_new(&x->e, a->nk + 4);
        if (a->np > 1) jfail(&x->e, line, "%.*s: at most one positional argument", (int)name.n, name.p);
        if (a->np) {
            if (a->pos[0].t != V_DICT || a->pos[0].ns)
                jfail(&x->e, line, "%.*s: the positional argument must be a mapping", (int)name.n, name.p);
            for (size_t i = 0; i < a->pos[0].d->n; i++) dict_set(&x->e, d, a->pos[0].d->k[i], a->pos[0].d->v[i]);
        }
        for (size_t i = 0; i < a->nk; i++) dict_set(&x->e, d, v_str(a->kwn[i]), a->kwv[i]);
        jv_t r = v_dict(d);
        r.ns = name.p[0] == 'n';
        return r;
    }
    if (js_eq(name, "range")) {
        int64_t s = 0, e, st = 1;
        if (a->np == 1) e = arg_int(x, a, 0, NULL, 0, "range", line);
        else {
            s = arg_int(x, a, 0, NULL, 0, "range", line);
            e = arg_int(x, a, 1, NULL, 0, "range", line);
            st = arg_int(x, a, 2, NULL, 1, "range", line);
        }
        if (a->np < 1 || a->np > 3) jfail(&x->e, line, "range takes 1 to 3 integer arguments");
        if (st == 0) jfail(&x->e, line, "range: step must not be zero");
        jlist_t *l = list_new(&x->e, 4);
        for (int64_t i = s; st > 0 ? i < e : i > e; i += st) {
            if (l->n >= 1000000) jfail(&x->e, line, "range: more than a million items");
            step(x, line);
            list_push(&x->e, l, v_int(i));
            if (st > 0 ? i > INT64_MAX - st : i < INT64_MIN - st) break;
        }
        return v_list(l);
    }
    jfail(&x->e, line, "'%.*s' is undefined or not a supported function", (int)(name.n > 40 ? 40 : name.n), name.p);
}

/* ----- expressions */

static jv_t arith(jx_t *x, int op, jv_t a, jv_t b, int line)
{
    static const char *const sym[] = {[OP_ADD] = "+",   [OP_SUB] = "-", [OP_MUL] = "*", [OP_DIV] = "/",
                                      [OP_FDIV] = "//", [OP_MOD] = "%", [OP_POW] = "**"};
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR) return v_str(js_cat(x, a.s, b.s));
    if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST) {
        jlist_t *l = list_new(&x->e, a.l->n + b.l->n);
        for (size_t i = 0; i < a.l->n; i++) list_push(&x->e, l, a.l->v[i]);
        for (size_t i = 0; i < b.l->n; i++) list_push(&x->e, l, b.l->v[i]);
        return v_list(l);
    }
    if (op == OP_MUL &&
        ((a.t == V_STR && (b.t == V_INT || b.t == V_BOOL)) || (b.t == V_STR && (a.t == V_INT || a.t == V_BOOL)))) {
        jstr_t s = a.t == V_STR ? a.s : b.s;
        int64_t k = a.t == V_STR ? b.i : a.i;
        if (k > 0 && s.n && (uint64_t)k > x->max_out / s.n) jfail(&x->e, line, "string repetition too large");
        sb_t o = {0};
        for (int64_t i = 0; i < k; i++) sb_s(x, &o, s);
        return v_str(sb_str(&o));
    }
    if (!is_num(a) || !is_num(b)) {
        if (a.t == V_UNDEF || b.t == V_UNDEF)
            fail_undef(x, a.t == V_UNDEF ? a : b, line, "operand of", js_lit(sym[op]));
        jfail(&x->e, line, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op], type_name(a),
              type_name(b));
    }
    bool fl = a.t == V_FLOAT || b.t == V_FLOAT || op == OP_DIV;
    if (op == OP_POW && !fl && b.i < 0) fl = true;
    if (fl) {
        double p = num_f(a), q = num_f(b);
        if ((op == OP_DIV || op == OP_FDIV || op == OP_MOD) && q == 0) jfail(&x->e, line, "float division by zero");
        switch (op) {
        case OP_ADD: return v_float(p + q);
        case OP_SUB: return v_float(p - q);
        case OP_MUL: return v_float(p * q);
        case OP_DIV: return v_float(p / q);
        case OP_FDIV: return v_float(floor(p / q));
        case OP_MOD: {
            double r = fmod(p, q);
            if (r != 0 && ((r < 0) != (q < 0))) r += q;
            return v_float(r);
        }
        default: return v_float(pow(p, q));
        }
    }
    int64_t p = a.i, q = b.i, r;
    bool ovf = false;
    switch (op) {
    case OP_ADD: ovf = __builtin_add_overflow(p, q, &r); break;
    case OP_SUB: ovf = __builtin_sub_overflow(p, q, &r); break;
    case OP_MUL: ovf = __builtin_mul_overflow(p, q, &r); break;
    case OP_FDIV:
    case OP_MOD:
        if (q == 0) jfail(&x->e, line, "integer division or modulo by zero");
        if (p == INT64_MIN && q == -1) {
            ovf = true;
            break;
        }
        r = op == OP_FDIV ? p / q : p % q;
        if (op == OP_FDIV && (p % q != 0) && ((p < 0) != (q < 0))) r--;
        if (op == OP_MOD && r != 0 && ((r < 0) != (q < 0))) r += q;
        break;
    default: /* OP_POW, q >= 0: by squaring, so a huge exponent of 0, 1, -1 is quick */
        r = 1;
        for (int64_t base = p, e = q; e > 0 && !ovf; e >>= 1) {
            if (e & 1) ovf = __builtin_mul_overflow(r, base, &r);
            if (e > 1 && !ovf) ovf = __builtin_mul_overflow(base, base, &base);
        }
        break;
    }
    if (ovf) jfail(&x->e, line, "integer overflow");
    return v_int(r);
}

static jv_t eval(jx_t *x, const node_t *n, frame_t *f)
{
    step(x, n->line);
    if (++x->depth > MAX_EVAL_DEPTH) jfail(&x->e, n->line, "evaluation nested too deeply");
    jv_t r;
    jargs_t *ar;
    switch (n->k) {
    case E_LIT: r = n->lit; break;
    case E_NAME: {
        jv_t *v = lookup(f, n->name);
        /* the global functions are defined values too ("strftime_now is
         * defined" is how Llama 3 templates probe for the clock) */
        r = v                            ? *v
            : in_table(GLOBALS, n->name) ? (jv_t){.t = V_METHOD, .s = n->name}
                                         : (jv_t){.t = V_UNDEF, .s = n->name};
        break;
    }
    case E_ATTR: r = get_attr(x, eval(x, n->a, f), n->name, n->line); break;
    case E_ITEM: {
        jv_t o = eval(x, n->a, f);
        r = get_item(x, o, eval(x, n->b, f), n->line);
        break;
    }
    case E_SLICE: {
        jv_t o = eval(x, n->a, f);
        jv_t a = n->b ? eval(x, n->b, f) : NONE, b = n->c ? eval(x, n->c, f) : NONE,
             c = n->d ? eval(x, n->d, f) : NONE;
        if (o.t == V_UNDEF) fail_undef(x, o, n->line, "slice", js_lit(""));
        r = do_slice(x, o, a, b, c, n->line);
        break;
    }
    case E_CALL:
        ar = jalloc(&x->e, sizeof *ar);
        if (n->a->k == E_ATTR) {
            jv_t o = eval(x, n->a->a, f);
            jv_t *mv = o.t == V_DICT ? dict_find_s(o.d, n->a->name) : NULL;
            eval_args(x, n->args, f, ar, n->line);
            if (mv && mv->t == V_MACRO) r = call_macro(x, mv->mac, ar, n->line);
            else r = call_method(x, o, n->a->name, ar, n->line);
        } else if (n->a->k == E_NAME) {
            jv_t *v = lookup(f, n->a->name);
            eval_args(x, n->args, f, ar, n->line);
            if (v && v->t == V_MACRO) r = call_macro(x, v->mac, ar, n->line);
            else if (v && v->t != V_UNDEF && !(v->t == V_METHOD && in_table(GLOBALS, v->s)))
                jfail(&x->e, n->line, "'%.*s' is not callable", (int)n->a->name.n, n->a->name.p);
            else r = call_global(x, v && v->t == V_METHOD ? v->s : n->a->name, ar, n->line);
        } else {
            jv_t c = eval(x, n->a, f);
            if (c.t != V_MACRO) jfail(&x->e, n->line, "'%s' object is not callable", type_name(c));
            eval_args(x, n->args, f, ar, n->line);
            r = call_macro(x, c.mac, ar, n->line);
        }
        break;
    case E_FILTER: {
        jv_t v = eval(x, n->a, f);
        ar = jalloc(&x->e, sizeof *ar);
        eval_args(x, n->args, f, ar, n->line);
        r = apply_filter(x, n->name, v, ar, n->line);
        break;
    }
    case E_TEST: {
        jv_t v = eval(x, n->a, f);
        ar = jalloc(&x->e, sizeof *ar);
        eval_args(x, n->args, f, ar, n->line);
        r = v_bool(apply_test(x, n->name, v, ar, n->line) != (n->op != 0));
        break;
    }
    case E_BIN: {
        jv_t a = eval(x, n->a, f);
        if (n->op == OP_OR) {
            r = v_truthy(a) ? a : eval(x, n->b, f);
            break;
        }
        if (n->op == OP_AND) {
            r = !v_truthy(a) ? a : eval(x, n->b, f);
            break;
        }
        jv_t b = eval(x, n->b, f);
        switch (n->op) {
        case OP_EQ: r = v_bool(v_eq(a, b)); break;
        case OP_NE: r = v_bool(!v_eq(a, b)); break;
        case OP_LT: r = v_bool(v_cmp(x, a, b, n->line) < 0); break;
        case OP_LE: r = v_bool(v_cmp(x, a, b, n->line) <= 0); break;
        case OP_GT: r = v_bool(v_cmp(x, a, b, n->line) > 0); break;
        case OP_GE: r = v_bool(v_cmp(x, a, b, n->line) >= 0); break;
        case OP_IN: r = v_bool(contains(x, b, a, n->line)); break;
        case OP_NOTIN: r = v_bool(!contains(x, b, a, n->line)); break;
        case OP_CAT: r = v_str(js_cat(x, to_str(x, a), to_str(x, b))); break;
        default: r = arith(x, n->op, a, b, n->line); break;
        }
        break;
    }
    case E_NOT: r = v_bool(!v_truthy(eval(x, n->a, f))); break;
    case E_NEG:
    case E_POS: {
        jv_t a = eval(x, n->a, f);
        if (!is_num(a))
            jfail(&x->e, n->line, "bad operand type for unary %c: '%s'", n->k == E_NEG ? '-' : '+', type_name(a));
        if (n->k == E_POS) r = a.t == V_BOOL ? v_int(a.i) : a;
        else if (a.t == V_FLOAT) r = v_float(-a.f);
        else if (a.i == INT64_MIN) jfail(&x->e, n->line, "integer overflow");
        else r = v_int(-a.i);
        break;
    }
    case E_COND:
        if (v_truthy(eval(x, n->b, f))) r = eval(x, n->a, f);
        else r = n->c ? eval(x, n->c, f) : UNDEF;
        break;
    case E_LIST:
    case E_TUPLE: {
        jlist_t *l = list_new(&x->e, 4);
        for (const node_t *e = n->args; e; e = e->next) list_push(&x->e, l, eval(x, e, f));
        r = v_list(l);
        r.tup = n->k == E_TUPLE;
        break;
    }
    case E_DICT: {
        jdict_t *d = dict_new(&x->e, 4);
        for (const node_t *e = n->args; e; e = e->next) {
            jv_t k = eval(x, e->a, f);
            if (k.t == V_LIST || k.t == V_DICT || k.t == V_UNDEF) jfail(&x->e, e->line, "unhashable dict key");
            dict_set(&x->e, d, k, eval(x, e->b, f));
        }
        r = v_dict(d);
        break;
    }
    default: jfail(&x->e, n->line, "internal: statement where an expression was expected");
    }
    x->depth--;
    return r;
}

/* ----- statements */

enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

static void bind_targets(jx_t *x, const node_t *targets, frame_t *f, jv_t v, int line)
{
    if (!targets->next) {
        fset(x, f, targets->name, v);
        return;
    }
    jlist_t *l = iter_list(x, v, line);
    size_t want = 0;
    for (const node_t *t = targets; t; t = t->next) want++;
    if (l->n != want) jfail(&x->e, line, "cannot unpack %zu values into %zu names", l->n, want);
    size_t i = 0;
    for (const node_t *t = targets; t; t = t->next) fset(x, f, t->name, l->v[i++]);
}

static jv_t loop_var(jx_t *x, jlist_t *items, size_t i)
{
    jdict_t *d = dict_new(&x->e, 12);
    size_t n = items->n;
    dict_set(&x->e, d, v_str(js_lit("index")), v_int((int64_t)i + 1));
    dict_set(&x->e, d, v_str(js_lit("index0")), v_int((int64_t)i));
    dict_set(&x->e, d, v_str(js_lit("revindex")), v_int((int64_t)(n - i)));
    dict_set(&x->e, d, v_str(js_lit("revindex0")), v_int((int64_t)(n - i - 1)));
    dict_set(&x->e, d, v_str(js_lit("first")), v_bool(i == 0));
    dict_set(&x->e, d, v_str(js_lit("last")), v_bool(i + 1 == n));
    dict_set(&x->e, d, v_str(js_lit("length")), v_int((int64_t)n));
    dict_set(&x->e, d, v_str(js_lit("depth")), v_int(1));
    dict_set(&x->e, d, v_str(js_lit("depth0")), v_int(0));
    dict_set(&x->e, d, v_str(js_lit("previtem")), i > 0 ? items->v[i - 1] : UNDEF);
    dict_set(&x->e, d, v_str(js_lit("nextitem")), i + 1 < n ? items->v[i + 1] : UNDEF);
    jv_t r = v_dict(d);
    r.ns = true; /* attribute access only; not a mapping to the template */
    return r;
}

static int exec_for(jx_t *x, const node_t *n, frame_t *f, sb_t *out)
{
    jlist_t *items = iter_list(x, eval(x, n->a, f), n->line);
    if (n->d) { /* {% for x in xs if cond %}: loop.* counts the kept items */
        jlist_t *kept = list_new(&x->e, items->n);
        for (size_t i = 0; i < items->n; i++) {
            frame_t *tf = frame_new(x, f);
            bind_targets(x, n->args, tf, items->v[i], n->line);
            if (v_truthy(eval(x, n->d, tf))) list_push(&x->e, kept, items->v[i]);
        }
        items = kept;
    }
    if (!items->n) return n->c ? exec(x, n->c, f, out) : FLOW_NEXT;
    static const char loop_name[] = "loop";
    for (size_t i = 0; i < items->n; i++) {
        frame_t *lf = frame_new(x, f);
        fset(x, lf, (jstr_t){loop_name, NULL, 4}, loop_var(x, items, i));
        bind_targets(x, n->args, lf, items->v[i], n->line);
        if (exec(x, n->b, lf, out) == FLOW_BREAK) break;
    }
    return FLOW_NEXT;
}

static void exec_set(jx_t *x, const node_t *n, frame_t *f)
{
    jv_t v;
    if (n->a) v = eval(x, n->a, f);
    else {
        sb_t b = {0};
        exec(x, n->b, f, &b);
        v = v_str(sb_str(&b));
    }
    const node_t *t = n->args;
    if (t->k == E_ATTR && !t->next) {
        jv_t *ns = lookup(f, t->a->name);
        if (!ns || ns->t != V_DICT || !ns->ns || ns->d == NULL)
            jfail(&x->e, n->line, "cannot assign attribute on '%.*s': not a namespace", (int)t->a->name.n,
                  t->a->name.p);
        dict_set(&x->e, ns->d, v_str(t->name), v);
        return;
    }
    for (const node_t *k = t; k; k = k->next)
        if (k->k != E_NAME) jfail(&x->e, n->line, "namespace attributes cannot be assigned in a tuple");
    bind_targets(x, t, f, v, n->line);
}

static int exec(jx_t *x, const node_t *n, frame_t *f, sb_t *out)
{
    if (++x->depth > MAX_EVAL_DEPTH) jfail(&x->e, n ? n->line : 0, "evaluation nested too deeply");
    int flow = FLOW_NEXT;
    for (; n && flow == FLOW_NEXT; n = n->next) {
        step(x, n->line);
        switch (n->k) {
        case N_TEXT: sb_s(x, out, n->name); break;
        case N_OUT: sb_s(x, out, to_str(x, eval(x, n->a, f))); break;
        case N_IF: flow = exec(x, v_truthy(eval(x, n->a, f)) ? n->b : n->c, f, out); break;
        case N_FOR: flow = exec_for(x, n, f, out); break;
        case N_SET: exec_set(x, n, f); break;
        case N_MACRO: fset(x, f, n->name, (jv_t){.t = V_MACRO, .mac = n}); break;
        case N_BREAK: flow = FLOW_BREAK; break;
        case N_CONTINUE: flow = FLOW_CONTINUE; break;
        case N_WRAP: flow = exec(x, n->b, f, out); break;
        default: jfail(&x->e, n->line, "internal: expression where a statement was expected");
        }
    }
    x->depth--;
    return flow;
}

/* ------------------------------------------------------------ public API */

struct ie_jinja {
    arena_t ar;
    node_t *body;
    const char *src; /* the template text (in ar): callers read it for markers (ie_jinja_source) */
};

ie_status_t ie_jinja_parse(const char *src, size_t len, ie_jinja_t **out)
{
    *out = NULL;
    if (!src) return ie_error_set(IE_ERR_INVAL, "chat template: NULL text");
    ie_jinja_t *t = calloc(1, sizeof *t);
    jerr_t *e = calloc(1, sizeof *e);
    if (!t || !e) {
        free(t);
        free(e);
        return ie_error_set(IE_ERR_NOMEM, "out of memory");
    }
    t->ar.limit = (size_t)64 << 20;
    if (len > ((size_t)4 << 20)) t->ar.limit += len * 16;
    e->ar = &t->ar;
    if (setjmp(e->jb)) {
        ie_status_t st = ie_error_set(e->st, "%s", e->msg);
        ar_free(&t->ar);
        free(t);
        free(e);
        return st;
    }
    char *copy = jalloc(e, len + 1); /* tokens point into the text */
    memcpy(copy, src, len);
    copy[len] = '\0';
    lexer_t L = {.e = e, .src = copy, .n = len, .line = 1};
    lx_run(&L);
    parser_t P = {.e = e, .t = L.toks};
    jstr_t end;
    t->body = p_body(&P, NULL, &end);
    t->src = copy;
    free(e);
    *out = t;
    return IE_OK;
}

const char *ie_jinja_source(const ie_jinja_t *t) { return t ? t->src : NULL; }

void ie_jinja_destroy(ie_jinja_t **t)
{
    if (!t || !*t) return;
    ar_free(&(*t)->ar);
    free(*t);
    *t = NULL;
}

static jv_t from_json(jx_t *x, const cJSON *j, bool content)
{
    if (cJSON_IsNull(j)) return NONE;
    if (cJSON_IsTrue(j)) return v_bool(true);
    if (cJSON_IsFalse(j)) return v_bool(false);
    if (cJSON_IsString(j)) return v_str(js_copy(&x->e, j->valuestring, strlen(j->valuestring), content));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        /* cJSON keeps no int/float distinction: an integral value within
         * int64 becomes an int, as JSON integers do in Python */
        if (d == floor(d) && fabs(d) < 9.2e18) return v_int((int64_t)d);
        return v_float(d);
    }
    if (cJSON_IsArray(j)) {
        jlist_t *l = list_new(&x->e, 4);
        for (const cJSON *c = j->child; c; c = c->next) list_push(&x->e, l, from_json(x, c, content));
        return v_list(l);
    }
    jdict_t *d = dict_new(&x->e, 4);
    for (const cJSON *c = j->child; c; c = c->next)
        dict_set(&x->e, d, v_str(js_copy(&x->e, c->string, strlen(c->string), content)), from_json(x, c, content));
    return v_dict(d);
}

ie_status_t ie_jinja_render(const ie_jinja_t *t, const char *vars_json, const char *trusted_json,
                            const ie_jinja_opts_t *opts, char **text_out, uint8_t **mask_out, size_t *len_out,
                            int *raised)
{
    *text_out = NULL;
    if (mask_out) *mask_out = NULL;
    *len_out = 0;
    if (raised) *raised = 0;
    if (!t || !vars_json) return ie_error_set(IE_ERR_INVAL, "chat template: NULL template or variables");
    cJSON *vars = cJSON_Parse(vars_json), *trusted = trusted_json ? cJSON_Parse(trusted_json) : NULL;
    jx_t *x = calloc(1, sizeof *x);
    ie_status_t st = IE_OK;
    if (!cJSON_IsObject(vars) || (trusted_json && !cJSON_IsObject(trusted))) {
        st = ie_error_set(IE_ERR_FORMAT, "chat template: the variables must be a JSON object");
        goto cleanup;
    }
    if (!x) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    x->e.ar = &x->ar;
    x->ar.limit = opts && opts->max_memory ? opts->max_memory : (size_t)256 << 20;
    x->max_out = opts && opts->max_output ? opts->max_output : (size_t)16 << 20;
    x->max_steps = opts && opts->max_steps ? opts->max_steps : 50000000u;
    x->now = opts && opts->has_now ? opts->now : time(NULL);
    if (setjmp(x->e.jb)) {
        if (raised) *raised = x->e.raised;
        st = ie_error_set(x->e.st, "%s", x->e.msg);
        goto cleanup;
    }
    x->root = frame_new(x, NULL);
    for (const cJSON *c = vars->child; c; c = c->next)
        fset(x, x->root, js_copy(&x->e, c->string, strlen(c->string), 0), from_json(x, c, true));
    for (const cJSON *c = trusted ? trusted->child : NULL; c; c = c->next)
        fset(x, x->root, js_copy(&x->e, c->string, strlen(c->string), 0), from_json(x, c, false));
    sb_t out = {0};
    exec(x, t->body, x->root, &out);
    char *text = malloc(out.n + 1);
    uint8_t *mask = mask_out ? malloc(out.n + 1) : NULL;
    if (!text || (mask_out && !mask)) {
        free(text);
        free(mask);
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    if (out.n) memcpy(text, out.p, out.n);
    text[out.n] = '\0';
    if (mask) {
        if (out.n) memcpy(mask, out.m, out.n);
        *mask_out = mask;
    }
    *text_out = text;
    *len_out = out.n;

cleanup:
    cJSON_Delete(vars);
    cJSON_Delete(trusted);
    if (x) ar_free(&x->ar);
    free(x);
    return st;
}

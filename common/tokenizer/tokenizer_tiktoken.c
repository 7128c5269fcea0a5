/* tokenizer_tiktoken.c — build a tokenizer from a tiktoken ranks file
 * (o200k_base.tiktoken, cl100k_base.tiktoken, ...) plus an optional table
 * of special tokens (o200k_harmony_special_tokens.json).
 *
 * A ranks file is one "BASE64 RANK" line per token: the token's raw bytes
 * and its rank, which is also its id. There is no merge list. tiktoken's
 * rule is: start from single bytes and repeatedly join the adjacent pair
 * whose concatenation has the lowest rank (leftmost on a tie); a piece that
 * is a whole token is emitted at once. In the core that is
 * IE_TOK_MERGE_TIKTOKEN (the concatenation's id is the priority) plus
 * ignore_merges, with the same heap as the other BPE flavours.
 *
 * The special-token table is a JSON object
 *   {"n_vocab": 201088, "special_tokens": {"<|start|>": 200006, ...},
 *    "pattern": "..."}
 * where n_vocab and pattern are optional (the pattern defaults to o200k's,
 * the only one our tiktoken files use); a bare {"<|x|>": id, ...} object is
 * accepted too. Special tokens are control tokens: matched in the text
 * only with IE_TOK_PARSE_SPECIAL, hidden by the detokenizer unless asked.
 */
#include "ie_mmap.h"
#include "tokenizer_internal.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int b64_val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') { return c - 'A'; }
    if (c >= 'a' && c <= 'z') { return c - 'a' + 26; }
    if (c >= '0' && c <= '9') { return c - '0' + 52; }
    if (c == '+') { return 62; }
    if (c == '/') { return 63; }
    return -1;
}

/* Standard base64 with '=' padding (as Python's base64.b64encode writes
 * it). dst needs len * 3 / 4 bytes. Returns the decoded length, or -1. */
static long b64_decode(const char *s, size_t len, unsigned char *dst)
{
    if (len == 0 || len % 4 != 0) { return -1; }
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)s[i + k];
            if (c == '=' && i + 4 == len && k >= 2) {
                v[k] = 0;
                pad++;
            } else if (pad) {
                return -1; /* data after padding */
            } else if ((v[k] = b64_val(c)) < 0) {
                return -1;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        dst[o++] = (unsigned char)(w >> 16);
        if (pad < 2) { dst[o++] = (unsigned char)(w >> 8); }
        if (pad < 1) { dst[o++] = (unsigned char)w; }
    }
    return (long)o;
}

/* One parsed ranks line. */
typedef struct rank_line {
    const char *b64;
    size_t b64_len;
    int32_t rank;
} rank_line_t;

/* Split the ranks file into lines; *max_rank_out = highest rank (-1 if
 * none). Caller frees *lines_out. Line numbers in errors are 1-based. */
static ie_status_t parse_ranks(const char *path, const char *buf, size_t len, rank_line_t **lines_out,
                               size_t *n_out, int32_t *max_rank_out)
{
    ie_status_t st = IE_OK;
    rank_line_t *v = NULL;
    size_t n = 0, cap = 0, lineno = 0;
    int32_t max_rank = -1;
    *lines_out = NULL;
    *n_out = 0;

    for (size_t i = 0; i < len;) {
        size_t e = i;
        while (e < len && buf[e] != '\n') { e++; }
        lineno++;
        size_t le = e;
        if (le > i && buf[le - 1] == '\r') { le--; }
        if (le > i) {
            const char *sp = memchr(buf + i, ' ', le - i);
            if (!sp || sp == buf + i || sp + 1 == buf + le) {
                st = ie_error_set(IE_ERR_FORMAT, "tokenizer: %s:%zu: expected 'BASE64 RANK'", path, lineno);
                goto cleanup;
            }
            long long r = 0;
            for (const char *p = sp + 1; p < buf + le; p++) {
                if (*p < '0' || *p > '9' || r > (1 << 24)) {
                    st = ie_error_set(IE_ERR_FORMAT, "tokenizer: %s:%zu: bad rank (want 0..16777215)", path,
                                      lineno);
                    goto cleanup;
                }
                r = r * 10 + (*p - '0');
            }
            if (r >= (1 << 24)) {
                st = ie_error_set(IE_ERR_FORMAT, "tokenizer: %s:%zu: bad rank (want 0..16777215)", path, lineno);
                goto cleanup;
            }
            if (n == cap) {
                size_t ncap = cap ? cap * 2 : 4096;
                rank_line_t *nv = realloc(v, ncap * sizeof *nv);
                if (!nv) {
                    st = ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
                    goto cleanup;
                }
                v = nv;
                cap = ncap;
            }
            v[n].b64 = buf + i;
            v[n].b64_len = (size_t)(sp - (buf + i));
            v[n].rank = (int32_t)r;
            if (v[n].rank > max_rank) { max_rank = v[n].rank; }
            n++;
        }
        i = e + 1;
    }
    if (n == 0) {
        st = ie_error_set(IE_ERR_FORMAT, "tokenizer: '%s' holds no tokens", path);
        goto cleanup;
    }
    *lines_out = v;
    *n_out = n;
    *max_rank_out = max_rank;
    v = NULL;

cleanup:
    free(v);
    return st;
}

/* The special-token object and optional n_vocab / pattern of the table. */
static ie_status_t parse_specials(const char *path, const cJSON *root, const cJSON **map_out, int32_t *n_vocab_out,
                                  const char **pattern_out)
{
    *map_out = NULL;
    *n_vocab_out = -1;
    *pattern_out = NULL;
    if (!cJSON_IsObject(root)) { return ie_error_set(IE_ERR_FORMAT, "tokenizer: '%s' is not a JSON object", path); }
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "special_tokens");
    if (!map) {
        map = root; /* bare {"<|x|>": id} */
    } else {
        const cJSON *nv = cJSON_GetObjectItemCaseSensitive(root, "n_vocab");
        if (nv) {
            if (!cJSON_IsNumber(nv) || nv->valuedouble < 1 || nv->valuedouble > (1 << 24) ||
                nv->valuedouble != (double)(int32_t)nv->valuedouble) {
                return ie_error_set(IE_ERR_FORMAT, "tokenizer: '%s': n_vocab must be an integer in 1..16777216",
                                    path);
            }
            *n_vocab_out = (int32_t)nv->valuedouble;
        }
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(root, "pattern");
        if (pat) {
            if (!cJSON_IsString(pat)) {
                return ie_error_set(IE_ERR_FORMAT, "tokenizer: '%s': pattern must be a string", path);
            }
            *pattern_out = pat->valuestring;
        }
    }
    if (!cJSON_IsObject(map)) {
        return ie_error_set(IE_ERR_FORMAT, "tokenizer: '%s': special_tokens must be an object", path);
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, map)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= (1 << 24) ||
            it->valuedouble != (double)(int32_t)it->valuedouble) {
            return ie_error_set(IE_ERR_FORMAT, "tokenizer: '%s': special token '%.40s' needs an id in 0..16777215",
                                path, it->string ? it->string : "");
        }
        if (!it->string || !*it->string) {
            return ie_error_set(IE_ERR_FORMAT, "tokenizer: '%s': empty special token", path);
        }
    }
    *map_out = map;
    return IE_OK;
}

static int32_t find_special(const ie_tokenizer_t *t, const char *text)
{
    return ie_tokenizer_find(t, text, strlen(text));
}

ie_status_t ie_tokenizer_load_tiktoken(const char *ranks_path, const char *specials_path, ie_tokenizer_t **out)
{
    ie_status_t st = IE_OK;
    char *buf = NULL, *sbuf = NULL;
    size_t len = 0, slen = 0;
    rank_line_t *lines = NULL;
    size_t n_lines = 0;
    cJSON *sroot = NULL;
    const cJSON *smap = NULL;
    unsigned char *raw = NULL;
    size_t raw_cap = 0;
    ie_tokenizer_t *t = NULL;
    const char *pattern = NULL;
    int32_t n_vocab_decl = -1;

    if (!out) { return ie_error_set(IE_ERR_INVAL, "ie_tokenizer_load_tiktoken: out is NULL"); }
    *out = NULL;
    if (!ranks_path || !*ranks_path) {
        return ie_error_set(IE_ERR_INVAL, "ie_tokenizer_load_tiktoken: empty path");
    }

    int32_t max_rank = -1;
    if ((st = ie_file_read("tokenizer", ranks_path, IE_TOK_FILE_MAX, &buf, &len)) != IE_OK ||
        (st = parse_ranks(ranks_path, buf, len, &lines, &n_lines, &max_rank)) != IE_OK) {
        goto cleanup;
    }
    int32_t n_vocab = max_rank + 1;
    if (specials_path) {
        if ((st = ie_file_read("tokenizer", specials_path, IE_TOK_FILE_MAX, &sbuf, &slen)) != IE_OK) {
            goto cleanup;
        }
        const char *end = NULL;
        sroot = cJSON_ParseWithLengthOpts(sbuf, slen, &end, 0);
        if (!sroot) {
            size_t at = end && end >= sbuf && end <= sbuf + slen ? (size_t)(end - sbuf) : 0;
            st = ie_error_set(IE_ERR_FORMAT, "tokenizer: '%s' is not valid JSON (near byte %zu)", specials_path,
                              at);
            goto cleanup;
        }
        if ((st = parse_specials(specials_path, sroot, &smap, &n_vocab_decl, &pattern)) != IE_OK) { goto cleanup; }
        const cJSON *it;
        cJSON_ArrayForEach(it, smap)
        {
            if ((int32_t)it->valuedouble + 1 > n_vocab) { n_vocab = (int32_t)it->valuedouble + 1; }
        }
        if (n_vocab_decl > 0) {
            if (n_vocab_decl < n_vocab) {
                st = ie_error_set(IE_ERR_FORMAT, "tokenizer: '%s': n_vocab %d is below the highest id %d",
                                  specials_path, (int)n_vocab_decl, (int)(n_vocab - 1));
                goto cleanup;
            }
            n_vocab = n_vocab_decl;
        }
    }
    if ((st = ie_tok_alloc(n_vocab, &t)) != IE_OK) { goto cleanup; }
    t->algo = IE_TOK_ALGO_BYTE_BPE;
    t->merge_mode = IE_TOK_MERGE_TIKTOKEN;
    t->ignore_merges = 1; /* tiktoken looks a whole piece up before merging */

    /* ---- ranked tokens: raw bytes, match text == piece */
    for (size_t i = 0; i < n_lines; i++) {
        const rank_line_t *l = &lines[i];
        size_t need = l->b64_len / 4 * 3 + 3;
        if (need > raw_cap) {
            unsigned char *nr = realloc(raw, need);
            if (!nr) {
                st = ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
                goto cleanup;
            }
            raw = nr;
            raw_cap = need;
        }
        long rl = b64_decode(l->b64, l->b64_len, raw);
        if (rl <= 0) {
            st = ie_error_set(IE_ERR_FORMAT, "tokenizer: %s: bad base64 for rank %d", ranks_path, (int)l->rank);
            goto cleanup;
        }
        ie_tok_token_t *tk = &t->tokens[l->rank];
        if (tk->type == IE_TOKT_NORMAL) {
            st = ie_error_set(IE_ERR_FORMAT, "tokenizer: %s: rank %d appears twice", ranks_path, (int)l->rank);
            goto cleanup;
        }
        if ((st = ie_tok_set_token(t, l->rank, (const char *)raw, (size_t)rl, (const char *)raw, (size_t)rl)) !=
            IE_OK) {
            goto cleanup;
        }
        tk->type = IE_TOKT_NORMAL;
        tk->in_bpe = 1;
    }

    /* ---- special tokens */
    {
        const cJSON *it;
        cJSON_ArrayForEach(it, smap)
        {
            int32_t id = (int32_t)it->valuedouble;
            ie_tok_token_t *tk = &t->tokens[id];
            if (tk->type != IE_TOKT_UNUSED) {
                st = ie_error_set(IE_ERR_FORMAT, "tokenizer: special token '%.40s' reuses id %d", it->string,
                                  (int)id);
                goto cleanup;
            }
            size_t sl = strlen(it->string);
            if ((st = ie_tok_set_token(t, id, it->string, sl, it->string, sl)) != IE_OK) { goto cleanup; }
            tk->type = IE_TOKT_CONTROL;
            tk->special = 1;
            tk->in_bpe = 0;
            tk->flags = IE_TOKF_MATCHABLE;
        }
    }
    if ((st = ie_tok_build_text_map(t)) != IE_OK) { goto cleanup; }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        if (ie_tok_strmap_get(&t->text_map, &c, 1) < 0) {
            st = ie_error_set(IE_ERR_FORMAT, "tokenizer: %s: no token for the single byte 0x%02x", ranks_path, b);
            goto cleanup;
        }
    }

    /* ---- pre-tokenizer */
    {
        const char *pat = pattern ? pattern : IE_TOK_RE_O200K;
        pcre2_code *re = NULL;
        if ((st = ie_tok_regex_compile(pat, strlen(pat), 0, &re)) != IE_OK ||
            (st = ie_tok_add_step(t, re, IE_SPLIT_ISOLATED, 0)) != IE_OK) {
            goto cleanup;
        }
    }

    /* ---- special ids. Harmony (gpt-oss): a turn of generation ends with
     * <|return|> (final answer) or <|call|> (tool call); <|end|> only ends
     * one message and the model goes on with the next, so it is not an
     * end-of-generation token here. */
    t->bos = find_special(t, "<|startoftext|>");
    t->eos = find_special(t, "<|endoftext|>");
    t->add_bos = 0;
    t->add_eos = 0;
    if ((st = ie_tok_finalize(t)) != IE_OK || (st = ie_tok_add_eog(t, find_special(t, "<|return|>"))) != IE_OK ||
        (st = ie_tok_add_eog(t, find_special(t, "<|call|>"))) != IE_OK) {
        goto cleanup;
    }
    *out = t;
    t = NULL;

cleanup:
    ie_tokenizer_destroy(&t);
    cJSON_Delete(sroot);
    free(raw);
    free(lines);
    free(sbuf);
    free(buf);
    return st;
}

/* tokenizer_gguf.c — build a tokenizer from GGUF tokenizer.ggml.* metadata.
 *
 *   tokenizer.ggml.model   "gpt2"  -> byte-level BPE, merges by rank
 *                          "llama" -> SentencePiece-style BPE, merges by score
 *   tokenizer.ggml.pre     gpt2 only: "gpt-2" (or absent), "smollm", "gpt-4o"/"o200k"
 *   tokenizer.ggml.tokens / scores / token_type / merges
 *   tokenizer.ggml.{bos,eos,eot,eom,unknown,padding}_token_id
 *   tokenizer.ggml.add_bos_token / add_eos_token / add_space_prefix
 *
 * Token types follow llama.cpp: CONTROL and UNKNOWN tokens are split out of
 * the text only with IE_TOK_PARSE_SPECIAL, USER_DEFINED ones always. Byte-
 * level NORMAL tokens are stored decoded (raw bytes); control and user-
 * defined tokens are stored as written, which is how converters emit them.
 */
#include "ie_gguf.h"
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

/* Pre-tokenizers known for byte-level GGUF vocabularies. Adding one (llama3,
 * o200k, ...) means adding its regex list here. */
typedef struct pre_def {
    const char *name;
    const char *regex[4]; /* applied in order, each with "Isolated" */
    int own_regex;        /* 1: regex[] replaces the GPT-2 regex, and a
                             piece that is a whole token skips BPE (HF
                             ignore_merges, as tiktoken does) */
} pre_def_t;

static const pre_def_t PRE_DEFS[] = {
    {"gpt-2", {NULL}, 0},                                   /* NULL first entry: GPT-2 regex only */
    {"gpt2", {NULL}, 0},   {"smollm", {"\\p{N}", NULL}, 0}, /* HF Digits(individual_digits) + ByteLevel */
    {"gpt-4o", {NULL}, 1},                                  /* o200k (GPT-4o, gpt-oss): IE_TOK_RE_O200K */
    {"o200k", {NULL}, 1},
};

static int key_present(const ie_gguf_t *g, const char *key) { return ie_gguf_find_key(g, key) >= 0; }

/* Optional token id: -1 when absent; must fit the vocabulary. */
static ie_status_t get_id(const ie_gguf_t *g, const char *key, int32_t n_vocab, int32_t *out)
{
    *out = -1;
    if (!key_present(g, key)) { return IE_OK; }
    int64_t v = 0;
    ie_status_t st = ie_gguf_get_i64(g, key, &v);
    if (st != IE_OK) { return st; }
    if (v < 0 || v >= n_vocab) {
        return ie_error_set(IE_ERR_FORMAT, "tokenizer: %s = %lld is outside the vocabulary (%d tokens)", key,
                            (long long)v, (int)n_vocab);
    }
    *out = (int32_t)v;
    return IE_OK;
}

static ie_status_t get_bool_default(const ie_gguf_t *g, const char *key, int dflt, int *out)
{
    *out = dflt;
    if (!key_present(g, key)) { return IE_OK; }
    return ie_gguf_get_bool(g, key, out);
}

static int str_eq(ie_gguf_str_t s, const char *lit)
{
    size_t n = strlen(lit);
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

/* Copy s with every U+2581 replaced by ' ' into dst (room for s.len). */
static size_t unescape_spm(const char *s, size_t len, char *dst)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        if (i + 3 <= len && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
            dst[o++] = ' ';
            i += 3;
        } else {
            dst[o++] = s[i++];
        }
    }
    return o;
}

static ie_status_t grow(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap) { return IE_OK; }
    size_t ncap = *cap ? *cap : 256;
    while (ncap < need) { ncap *= 2; }
    char *nb = realloc(*buf, ncap);
    if (!nb) { return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory"); }
    *buf = nb;
    *cap = ncap;
    return IE_OK;
}

static const char *const EOG_NAMES[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>",
                                        "<|end|>",    "<|return|>",    "<|call|>"};

ie_status_t ie_tok_load_gguf(const char *path, ie_tokenizer_t **out)
{
    ie_status_t st = IE_OK;
    ie_gguf_t *g = NULL;
    ie_tokenizer_t *t = NULL;
    char *scratch = NULL;
    size_t scratch_cap = 0;
    *out = NULL;

    if ((st = ie_gguf_open(path, &g)) != IE_OK) { goto cleanup; }
    ie_gguf_str_t model;
    if (!key_present(g, "tokenizer.ggml.model")) {
        st = ie_error_set(IE_ERR_FORMAT, "tokenizer: '%s' has no tokenizer.ggml.model", path);
        goto cleanup;
    }
    if ((st = ie_gguf_get_str(g, "tokenizer.ggml.model", &model)) != IE_OK) { goto cleanup; }
    ie_tok_algo_t algo;
    if (str_eq(model, "gpt2")) {
        algo = IE_TOK_ALGO_BYTE_BPE;
    } else if (str_eq(model, "llama")) {
        algo = IE_TOK_ALGO_SPM;
    } else {
        st = ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: tokenizer.ggml.model '%.*s' not supported (gpt2, llama)",
                          (int)(model.len > 64 ? 64 : model.len), model.ptr);
        goto cleanup;
    }

    ie_gguf_type_t et;
    uint64_t n_tok = 0;
    if (!key_present(g, "tokenizer.ggml.tokens")) {
        st = ie_error_set(IE_ERR_FORMAT, "tokenizer: '%s' has no tokenizer.ggml.tokens", path);
        goto cleanup;
    }
    if ((st = ie_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n_tok)) != IE_OK) { goto cleanup; }
    if (et != IE_GGUF_STRING) {
        st = ie_error_set(IE_ERR_FORMAT, "tokenizer: tokenizer.ggml.tokens is not a string array");
        goto cleanup;
    }
    if (n_tok == 0 || n_tok > (1u << 24)) {
        st = ie_error_set(IE_ERR_FORMAT, "tokenizer: %llu tokens is out of range", (unsigned long long)n_tok);
        goto cleanup;
    }
    int32_t n = (int32_t)n_tok;
    if ((st = ie_tok_alloc(n, &t)) != IE_OK) { goto cleanup; }
    t->algo = algo;

    int has_scores = key_present(g, "tokenizer.ggml.scores");
    int has_types = key_present(g, "tokenizer.ggml.token_type");
    uint64_t alen = 0;
    if (has_scores) {
        if ((st = ie_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &alen)) != IE_OK) { goto cleanup; }
        if (et != IE_GGUF_FLOAT32 || alen != n_tok) {
            st = ie_error_set(IE_ERR_FORMAT, "tokenizer: tokenizer.ggml.scores must be %llu float32 values",
                              (unsigned long long)n_tok);
            goto cleanup;
        }
    }
    if (has_types) {
        if ((st = ie_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &alen)) != IE_OK) { goto cleanup; }
        if (alen != n_tok || et == IE_GGUF_STRING || et == IE_GGUF_ARRAY || et == IE_GGUF_FLOAT32 ||
            et == IE_GGUF_FLOAT64 || et == IE_GGUF_BOOL) {
            st = ie_error_set(IE_ERR_FORMAT, "tokenizer: tokenizer.ggml.token_type must be %llu integers",
                              (unsigned long long)n_tok);
            goto cleanup;
        }
    }

    for (int32_t i = 0; i < n; i++) {
        ie_gguf_str_t s;
        if ((st = ie_gguf_arr_str(g, "tokenizer.ggml.tokens", (uint64_t)i, &s)) != IE_OK) { goto cleanup; }
        int64_t type = IE_TOKT_NORMAL;
        if (has_types && (st = ie_gguf_arr_i64(g, "tokenizer.ggml.token_type", (uint64_t)i, &type)) != IE_OK) {
            goto cleanup;
        }
        if (type == 0) { type = IE_TOKT_NORMAL; /* "undefined" */ }
        if (type < IE_TOKT_NORMAL || type > IE_TOKT_BYTE) {
            st = ie_error_set(IE_ERR_FORMAT, "tokenizer: token %d has unknown type %lld", (int)i, (long long)type);
            goto cleanup;
        }
        float score = 0.0f;
        if (has_scores && (st = ie_gguf_arr_f32(g, "tokenizer.ggml.scores", (uint64_t)i, &score)) != IE_OK) {
            goto cleanup;
        }
        if (s.len > (1u << 20)) {
            st = ie_error_set(IE_ERR_FORMAT, "tokenizer: token %d is %llu bytes long", (int)i,
                              (unsigned long long)s.len);
            goto cleanup;
        }
        if ((st = grow(&scratch, &scratch_cap, (size_t)s.len + 1)) != IE_OK) { goto cleanup; }
        ie_tok_token_t *tk = &t->tokens[i];
        tk->type = (uint8_t)type;
        tk->score = score;
        if (type == IE_TOKT_CONTROL || type == IE_TOKT_UNKNOWN || type == IE_TOKT_USER_DEFINED) {
            st = ie_tok_set_token(t, i, s.ptr, s.len, s.ptr, s.len);
            tk->flags = IE_TOKF_MATCHABLE;
            tk->special = type != IE_TOKT_USER_DEFINED;
        } else if (algo == IE_TOK_ALGO_BYTE_BPE) {
            long raw = ie_tok_bytelevel_decode(s.ptr, s.len, scratch);
            if (raw >= 0) {
                st = ie_tok_set_token(t, i, scratch, (size_t)raw, scratch, (size_t)raw);
                tk->in_bpe = 1;
            } else {
                /* not byte-level text: unreachable by BPE, decodes as written */
                st = ie_tok_set_token(t, i, s.ptr, s.len, s.ptr, s.len);
            }
        } else if (type == IE_TOKT_BYTE) {
            int b = ie_tok_parse_byte_token(s.ptr, s.len);
            if (b < 0) {
                st = ie_error_set(IE_ERR_FORMAT, "tokenizer: byte token %d is not of the form <0xXX>", (int)i);
                goto cleanup;
            }
            char c = (char)b;
            st = ie_tok_set_token(t, i, s.ptr, s.len, &c, 1);
        } else {
            size_t pl = unescape_spm(s.ptr, s.len, scratch);
            st = ie_tok_set_token(t, i, s.ptr, s.len, scratch, pl);
            tk->in_bpe = type == IE_TOKT_NORMAL;
        }
        if (st != IE_OK) { goto cleanup; }
    }

    if ((st = get_id(g, "tokenizer.ggml.bos_token_id", n, &t->bos)) != IE_OK ||
        (st = get_id(g, "tokenizer.ggml.eos_token_id", n, &t->eos)) != IE_OK ||
        (st = get_id(g, "tokenizer.ggml.eot_token_id", n, &t->eot)) != IE_OK ||
        (st = get_id(g, "tokenizer.ggml.unknown_token_id", n, &t->unk)) != IE_OK ||
        (st = get_id(g, "tokenizer.ggml.padding_token_id", n, &t->pad)) != IE_OK) {
        goto cleanup;
    }
    int32_t eom = -1;
    if ((st = get_id(g, "tokenizer.ggml.eom_token_id", n, &eom)) != IE_OK) { goto cleanup; }
    if ((st = get_bool_default(g, "tokenizer.ggml.add_bos_token", algo == IE_TOK_ALGO_SPM, &t->add_bos)) != IE_OK ||
        (st = get_bool_default(g, "tokenizer.ggml.add_eos_token", 0, &t->add_eos)) != IE_OK) {
        goto cleanup;
    }

    if ((st = ie_tok_build_text_map(t)) != IE_OK) { goto cleanup; }

    if (algo == IE_TOK_ALGO_SPM) {
        int space_prefix = 1;
        if ((st = get_bool_default(g, "tokenizer.ggml.add_space_prefix", 1, &space_prefix)) != IE_OK) {
            goto cleanup;
        }
        t->merge_mode = IE_TOK_MERGE_SCORE;
        t->byte_fallback = 1;
        t->escape_spaces = 1;
        t->prepend = space_prefix ? IE_TOK_PREPEND_ALWAYS : IE_TOK_PREPEND_NEVER;
        memcpy(t->prefix, "\xE2\x96\x81", 3);
        t->prefix_len = 3;
        t->strip_leading_space = space_prefix;
        t->bpe_unk = t->unk;
    } else {
        /* bytes missing from a byte-level vocabulary are dropped, as HF
         * does without an unk_token: the GGUF "unknown" id of such models
         * is usually <|endoftext|>, which must not appear inside text */
        t->merge_mode = IE_TOK_MERGE_RANK;

        /* pre-tokenizer */
        const pre_def_t *pre = &PRE_DEFS[0];
        if (key_present(g, "tokenizer.ggml.pre")) {
            ie_gguf_str_t p;
            if ((st = ie_gguf_get_str(g, "tokenizer.ggml.pre", &p)) != IE_OK) { goto cleanup; }
            pre = NULL;
            for (size_t k = 0; k < sizeof PRE_DEFS / sizeof PRE_DEFS[0]; k++) {
                if (str_eq(p, PRE_DEFS[k].name)) { pre = &PRE_DEFS[k]; }
            }
            if (!pre) {
                st = ie_error_set(
                    IE_ERR_UNSUPPORTED,
                    "tokenizer: pre-tokenizer tokenizer.ggml.pre = '%.*s' not supported (gpt-2, smollm, gpt-4o)",
                    (int)(p.len > 64 ? 64 : p.len), p.ptr);
                goto cleanup;
            }
        }
        for (size_t k = 0; k < 4 && pre->regex[k]; k++) {
            pcre2_code *re = NULL;
            if ((st = ie_tok_regex_compile(pre->regex[k], strlen(pre->regex[k]), 0, &re)) != IE_OK ||
                (st = ie_tok_add_step(t, re, IE_SPLIT_ISOLATED, 0)) != IE_OK) {
                goto cleanup;
            }
        }
        pcre2_code *re = NULL;
        const char *main_re = pre->own_regex ? IE_TOK_RE_O200K : IE_TOK_RE_GPT2;
        t->ignore_merges = pre->own_regex;
        if ((st = ie_tok_regex_compile(main_re, strlen(main_re), 0, &re)) != IE_OK ||
            (st = ie_tok_add_step(t, re, IE_SPLIT_ISOLATED, 0)) != IE_OK) {
            goto cleanup;
        }

        /* merges: "left right", byte-level encoded, rank = position */
        uint64_t n_merges = 0;
        if (!key_present(g, "tokenizer.ggml.merges")) {
            st = ie_error_set(IE_ERR_FORMAT, "tokenizer: gpt2 vocabulary without tokenizer.ggml.merges");
            goto cleanup;
        }
        if ((st = ie_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n_merges)) != IE_OK) { goto cleanup; }
        if (et != IE_GGUF_STRING || n_merges > (1u << 24)) {
            st = ie_error_set(IE_ERR_FORMAT, "tokenizer: tokenizer.ggml.merges must be a string array");
            goto cleanup;
        }
        if ((st = ie_tok_pairmap_init(&t->merges, (size_t)n_merges)) != IE_OK) { goto cleanup; }
        for (uint64_t m = 0; m < n_merges; m++) {
            ie_gguf_str_t s;
            if ((st = ie_gguf_arr_str(g, "tokenizer.ggml.merges", m, &s)) != IE_OK) { goto cleanup; }
            /* split at the first space after the first byte (a part never
             * starts with a raw space in byte-level text) */
            const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
            if (!sp) {
                st = ie_error_set(IE_ERR_FORMAT, "tokenizer: merge %llu is not 'left right'",
                                  (unsigned long long)m);
                goto cleanup;
            }
            size_t ll = (size_t)(sp - s.ptr), rl = s.len - ll - 1;
            if ((st = grow(&scratch, &scratch_cap, (size_t)s.len + 1)) != IE_OK) { goto cleanup; }
            long a = ie_tok_bytelevel_decode(s.ptr, ll, scratch);
            long b = a < 0 ? -1 : ie_tok_bytelevel_decode(sp + 1, rl, scratch + a);
            int32_t left = -1, right = -1, merged = -1;
            if (a > 0 && b > 0) {
                left = ie_tok_strmap_get(&t->text_map, scratch, (size_t)a);
                right = ie_tok_strmap_get(&t->text_map, scratch + a, (size_t)b);
                merged = ie_tok_strmap_get(&t->text_map, scratch, (size_t)(a + b));
            }
            if (left < 0 || right < 0 || merged < 0) {
                st = ie_error_set(IE_ERR_FORMAT,
                                  "tokenizer: merge %llu ('%.*s') refers to a token not in the vocabulary",
                                  (unsigned long long)m, (int)(s.len > 64 ? 64 : s.len), s.ptr);
                goto cleanup;
            }
            if ((st = ie_tok_pairmap_put(&t->merges, left, right, (int32_t)m, merged)) != IE_OK) { goto cleanup; }
        }
    }

    if ((st = ie_tok_finalize(t)) != IE_OK || (st = ie_tok_add_eog(t, eom)) != IE_OK) { goto cleanup; }
    if (algo == IE_TOK_ALGO_BYTE_BPE) {
        for (size_t k = 0; k < sizeof EOG_NAMES / sizeof EOG_NAMES[0]; k++) {
            int32_t id = ie_tokenizer_find(t, EOG_NAMES[k], strlen(EOG_NAMES[k]));
            if ((st = ie_tok_add_eog(t, id)) != IE_OK) { goto cleanup; }
        }
    }
    *out = t;
    t = NULL;

cleanup:
    free(scratch);
    ie_tokenizer_destroy(&t);
    ie_gguf_destroy(&g);
    return st;
}

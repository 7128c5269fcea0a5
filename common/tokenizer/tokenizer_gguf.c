/* tokenizer_gguf.c — build a tokenizer from GGUF tokenizer.ggml.* metadata.
 *
 *   tokenizer.ggml.model   "gpt2"  -> byte-level BPE, merges by rank
 *                          "llama" -> SentencePiece-style BPE, merges by score
 *   tokenizer.ggml.pre     gpt2 only: one of PRE_DEFS (gpt-2 when absent): gpt-2, mpt,
 *                          smollm/starcoder/refact/command-r, falcon, deepseek-coder,
 *                          deepseek-llm, llama-bpe, qwen2, gpt-4o, ...; qwen2, command-r
 *                          and mpt also NFC-normalise, as their tokenizer.json do
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

/* Pre-tokenizers known for byte-level GGUF vocabularies, by the names
 * llama.cpp's converter writes to tokenizer.ggml.pre. Each is the list of
 * regex splits ("Isolated", applied in order) that the model's Hugging Face
 * tokenizer.json pre_tokenizer performs; the GGUF vocabularies' test
 * vectors come from HF, so HF's behaviour is the reference. Adding one
 * means adding its regex list here. */
#define PRE_MAX_STEPS 6

typedef struct pre_def {
    const char *name;
    const char *regex[PRE_MAX_STEPS]; /* NULL-terminated when shorter */
    int ignore_merges;                /* a piece that is a whole token skips
                                         BPE (HF ignore_merges; tiktoken) */
    int nfc;                          /* the model's tokenizer.json NFC-
                                         normalises first (llama.cpp skips
                                         this; HF, the reference, does not) */
} pre_def_t;

/* Llama 3: Split(regex, Isolated) + ByteLevel(use_regex false). The
 * contractions are case-insensitive; numbers come in groups of <= 3. */
static const char RE_LLAMA3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                                "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen2: Llama 3's regex with single digits. */
static const char RE_QWEN2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                               "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* DeepSeek (LLM and Coder): CJK runs (U+4E00-U+9FA5, U+0800-U+4E00,
 * U+AC00-U+D7FF) split apart from everything else. */
#define RE_DEEPSEEK_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
/* DeepSeek LLM: the letters are an explicit list of cased-letter ranges
 * (Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee, ... as the
 * model's tokenizer.json spells them), punctuation an explicit ASCII /
 * full-width / quote list. */
static const char RE_DEEPSEEK_LLM_LETTERS[] =
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}"
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"
    "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}"
    "\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}"
    "\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}"
    "\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
    "\\x{1E900}-\\x{1E943}]+";
static const char RE_DEEPSEEK_LLM_PUNCT[] =
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+";
/* Falcon: HF Punctuation (Unicode P plus the ASCII symbols Rust counts as
 * punctuation), then GPT-2's ByteLevel regex, Digits, and groups of three
 * ASCII digits. */
static const char RE_FALCON_PUNCT[] = "[\\p{P}\\$\\+<=>\\^~\\|`]+";

/* Stand-ins for the shared regexes (extern, so not usable in a static
 * initializer): compared by address. */
static const char USE_RE_GPT2[] = "<gpt-2>";
static const char USE_RE_O200K[] = "<o200k>";

static const pre_def_t PRE_DEFS[] = {
    /* GPT-2's ByteLevel regex only */
    {"gpt-2", {USE_RE_GPT2}, 0, 0},
    {"gpt2", {USE_RE_GPT2}, 0, 0},
    {"mpt", {USE_RE_GPT2}, 0, 1},      /* MPT, GPT-NeoX tokenizer */
    {"gpt-neox", {USE_RE_GPT2}, 0, 1}, /* not a llama.cpp name; same pre-tokenizer */
    {"olmo", {USE_RE_GPT2}, 0, 0},
    {"phi-2", {USE_RE_GPT2}, 0, 0},
    /* HF Digits(individual_digits) + ByteLevel */
    {"smollm", {"\\p{N}", USE_RE_GPT2}, 0, 0},
    {"starcoder", {"\\p{N}", USE_RE_GPT2}, 0, 0},
    {"refact", {"\\p{N}", USE_RE_GPT2}, 0, 0},
    {"command-r", {"\\p{N}", USE_RE_GPT2}, 0, 1},
    {"codeshell", {"\\p{N}", USE_RE_GPT2}, 0, 0},
    {"falcon", {RE_FALCON_PUNCT, USE_RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, 0, 0},
    {"deepseek-coder", {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DEEPSEEK_CJK, "\\p{N}"}, 0, 0},
    {"deepseek-llm",
     {"[\\r\\n]", RE_DEEPSEEK_LLM_LETTERS, RE_DEEPSEEK_LLM_PUNCT, "\\s+$", RE_DEEPSEEK_CJK, "\\p{N}+"},
     0,
     0},
    {"llama-bpe", {RE_LLAMA3}, 1, 0},
    {"llama3", {RE_LLAMA3}, 1, 0},
    {"llama-v3", {RE_LLAMA3}, 1, 0},
    {"dbrx", {RE_LLAMA3}, 0, 0},
    {"smaug-bpe", {RE_LLAMA3}, 0, 0},
    {"qwen2", {RE_QWEN2}, 0, 1},
    {"deepseek-r1-qwen", {RE_QWEN2}, 0, 1},
    {"stablelm2", {RE_QWEN2}, 0, 0},
    {"gpt-4o", {USE_RE_O200K}, 1, 0}, /* GPT-4o, gpt-oss */
    {"o200k", {USE_RE_O200K}, 1, 0},
};

/* "gpt-2, gpt2, ..." into buf (cap > 0) for error messages. */
static const char *known_pre_names(char *buf, size_t cap)
{
    size_t o = 0;
    for (size_t k = 0; k < sizeof PRE_DEFS / sizeof PRE_DEFS[0]; k++) {
        size_t n = strlen(PRE_DEFS[k].name);
        if (o + n + 3 >= cap) { break; }
        if (o > 0) {
            buf[o++] = ',';
            buf[o++] = ' ';
        }
        memcpy(buf + o, PRE_DEFS[k].name, n);
        o += n;
    }
    buf[o] = '\0';
    return buf;
}

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

/* Tokens that end a turn wherever a vocabulary has them (ChatML, Llama 3,
 * Phi-3, gpt-oss, Gemma), whatever the tokenizer's algorithm. */
static const char *const EOG_NAMES[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>",   "<|end|>",
                                        "<|return|>", "<|call|>",      "<end_of_turn>"};

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
    if ((st = get_id(g, "tokenizer.ggml.fim_pre_token_id", n, &t->fim_pre)) != IE_OK ||
        (st = get_id(g, "tokenizer.ggml.fim_suf_token_id", n, &t->fim_suf)) != IE_OK ||
        (st = get_id(g, "tokenizer.ggml.fim_mid_token_id", n, &t->fim_mid)) != IE_OK) {
        goto cleanup;
    }
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
                char names[512];
                st = ie_error_set(IE_ERR_UNSUPPORTED,
                                  "tokenizer: pre-tokenizer tokenizer.ggml.pre = '%.*s' not supported (known: %s)",
                                  (int)(p.len > 64 ? 64 : p.len), p.ptr, known_pre_names(names, sizeof names));
                goto cleanup;
            }
        }
        int after_bytelevel = 0;
        for (size_t k = 0; k < PRE_MAX_STEPS && pre->regex[k]; k++) {
            const char *rx = pre->regex[k];
            int is_bytelevel = rx == USE_RE_GPT2;
            if (is_bytelevel) {
                rx = IE_TOK_RE_GPT2;
            } else if (rx == USE_RE_O200K) {
                rx = IE_TOK_RE_O200K;
            }
            pcre2_code *re = NULL;
            if ((st = ie_tok_regex_compile(rx, strlen(rx), 0, &re)) != IE_OK ||
                (st = ie_tok_add_step(t, re, IE_SPLIT_ISOLATED, 0)) != IE_OK) {
                goto cleanup;
            }
            /* GPT-2's regex is HF's ByteLevel(use_regex): what follows it
             * there sees byte-level text */
            t->steps[t->n_steps - 1].on_bytelevel = after_bytelevel;
            if (is_bytelevel) { after_bytelevel = 1; }
        }
        t->ignore_merges = pre->ignore_merges;
        t->nfc = pre->nfc;

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
    for (size_t k = 0; k < sizeof EOG_NAMES / sizeof EOG_NAMES[0]; k++) {
        int32_t id = ie_tokenizer_find(t, EOG_NAMES[k], strlen(EOG_NAMES[k]));
        if ((st = ie_tok_add_eog(t, id)) != IE_OK) { goto cleanup; }
    }
    *out = t;
    t = NULL;

cleanup:
    free(scratch);
    ie_tokenizer_destroy(&t);
    ie_gguf_destroy(&g);
    return st;
}

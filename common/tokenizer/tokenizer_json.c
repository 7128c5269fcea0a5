/* tokenizer_json.c — build a tokenizer from a Hugging Face tokenizer.json.
 *
 * Supported: model.type "BPE" in two flavours, told apart by the pipeline:
 *   byte-level  — a ByteLevel pre-tokenizer or decoder (GPT-2, SmolLM2,
 *                 o200k); the vocabulary is stored decoded to raw bytes;
 *   SentencePiece-style — normalizer Prepend("▁") / Replace(" " -> "▁")
 *                 (Llama-2) or a Metaspace pre-tokenizer; byte_fallback
 *                 <0xXX> tokens, unk, fuse_unk.
 * Normalizers: Prepend("▁"), Replace(" " -> "▁"), NFC (tokenizer_nfc.c), Sequence.
 * Pre-tokenizers: Sequence, Split{Regex|String, behavior, invert},
 * ByteLevel{use_regex, add_prefix_space}, Digits{individual_digits},
 * Punctuation{behavior},
 * Metaspace{replacement "▁", prepend_scheme, split}.
 * Post-processors (for BOS/EOS): TemplateProcessing, ByteLevel, Bert,
 * Roberta, Sequence. tokenizer_config.json (bos_token, eos_token,
 * add_bos_token, add_eos_token) overrides what the template implies.
 * Anything else is IE_ERR_UNSUPPORTED naming the component; malformed
 * input is IE_ERR_FORMAT. Nothing here trusts an id or a length.
 */
#include "ie_mmap.h"
#include "tokenizer_internal.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SPM_SPACE "\xE2\x96\x81" /* U+2581 */

/* A pre-tokenizer step before compilation. */
typedef struct step_def {
    const char *pattern; /* borrowed from the JSON tree or a literal */
    size_t len;
    int literal;
    ie_tok_split_behavior_t behavior;
    int invert;
    int on_bytelevel; /* after a ByteLevel pre-tokenizer */
} step_def_t;

/* What the pipeline parts say, gathered before the tokenizer exists. */
typedef struct pipeline {
    step_def_t steps[16];
    size_t n_steps;
    int bytelevel;       /* ByteLevel pre-tokenizer or decoder */
    int bl_pretok_seen;  /* a ByteLevel pre-tokenizer was parsed: later
                            steps see byte-level text */
    int bl_prefix_space; /* ByteLevel add_prefix_space */
    int norm_prepend;    /* normalizer Prepend("▁") */
    int norm_replace;    /* normalizer Replace(" " -> "▁") */
    int norm_nfc;        /* normalizer NFC */
    int metaspace;       /* Metaspace pre-tokenizer */
    ie_tok_prepend_t ms_prepend;
    int strip_leading; /* decoder drops the leading space */
    /* post-processor */
    int pp_seen;
    const char *pp_bos, *pp_eos;  /* token text */
    int32_t pp_bos_id, pp_eos_id; /* or ids (-1 if unknown) */
} pipeline_t;

static const char *type_of(const cJSON *o)
{
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

static int bool_field(const cJSON *o, const char *key, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsBool(v)) { return cJSON_IsTrue(v); }
    return dflt;
}

static const char *str_field(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int is_null_or_absent(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return !v || cJSON_IsNull(v);
}

/* Exact integer in [0, 2^24), else -1. */
static int32_t id_value(const cJSON *v)
{
    if (!cJSON_IsNumber(v)) { return -1; }
    double d = v->valuedouble;
    if (!(d >= 0.0 && d < (double)(1 << 24)) || d != (double)(int32_t)d) { return -1; }
    return (int32_t)d;
}

static ie_status_t parse_json(const char *path, const char *buf, size_t len, cJSON **out)
{
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!*out) {
        size_t at = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : 0;
        return ie_error_set(IE_ERR_FORMAT, "tokenizer: '%s' is not valid JSON (near byte %zu)", path, at);
    }
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return ie_error_set(IE_ERR_FORMAT, "tokenizer: '%s' is not a JSON object", path);
    }
    return IE_OK;
}

/* ---------------------------------------------------------------- pipeline */

static ie_status_t add_step_def(pipeline_t *p, const char *pat, size_t len, int literal,
                                ie_tok_split_behavior_t behavior, int invert)
{
    if (p->n_steps == sizeof p->steps / sizeof p->steps[0]) {
        return ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: more than 16 pre-tokenizer steps");
    }
    step_def_t *s = &p->steps[p->n_steps++];
    s->pattern = pat;
    s->len = len;
    s->literal = literal;
    s->behavior = behavior;
    s->invert = invert;
    s->on_bytelevel = p->bl_pretok_seen;
    return IE_OK;
}

static ie_status_t parse_normalizer(const cJSON *n, pipeline_t *p, int depth)
{
    if (!n || cJSON_IsNull(n)) { return IE_OK; }
    const char *ty = type_of(n);
    if (!cJSON_IsObject(n) || !ty) { return ie_error_set(IE_ERR_FORMAT, "tokenizer: normalizer without a type"); }
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list) || depth > 4) {
            return ie_error_set(IE_ERR_FORMAT, "tokenizer: normalizer Sequence without a normalizers list");
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, list)
        {
            ie_status_t st = parse_normalizer(it, p, depth + 1);
            if (st != IE_OK) { return st; }
        }
        return IE_OK;
    }
    if (strcmp(ty, "Prepend") == 0) {
        const char *s = str_field(n, "prepend");
        if (!s || strcmp(s, SPM_SPACE) != 0) {
            return ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: normalizer Prepend supports only U+2581");
        }
        p->norm_prepend = 1;
        return IE_OK;
    }
    if (strcmp(ty, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *from = pat ? str_field(pat, "String") : NULL;
        const char *to = str_field(n, "content");
        if (!from || !to || strcmp(from, " ") != 0 || strcmp(to, SPM_SPACE) != 0) {
            return ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: normalizer Replace supports only \" \" -> U+2581");
        }
        p->norm_replace = 1;
        return IE_OK;
    }
    if (strcmp(ty, "NFC") == 0) {
        p->norm_nfc = 1;
        return IE_OK;
    }
    return ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: normalizer '%s' not supported", ty);
}

static ie_status_t parse_behavior(const cJSON *o, ie_tok_split_behavior_t *out)
{
    const char *b = str_field(o, "behavior");
    static const struct {
        const char *name;
        ie_tok_split_behavior_t v;
    } names[] = {{"Removed", IE_SPLIT_REMOVED},
                 {"Isolated", IE_SPLIT_ISOLATED},
                 {"MergedWithPrevious", IE_SPLIT_MERGED_WITH_PREVIOUS},
                 {"MergedWithNext", IE_SPLIT_MERGED_WITH_NEXT},
                 {"Contiguous", IE_SPLIT_CONTIGUOUS}};
    if (!b) { return ie_error_set(IE_ERR_FORMAT, "tokenizer: Split pre-tokenizer without a behavior"); }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(b, names[i].name) == 0) {
            *out = names[i].v;
            return IE_OK;
        }
    }
    return ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: Split behavior '%s' not supported", b);
}

static ie_status_t parse_pretok(const cJSON *n, pipeline_t *p, int depth)
{
    ie_status_t st = IE_OK;
    if (!n || cJSON_IsNull(n)) { return IE_OK; }
    const char *ty = type_of(n);
    if (!cJSON_IsObject(n) || !ty) {
        return ie_error_set(IE_ERR_FORMAT, "tokenizer: pre_tokenizer without a type");
    }
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "pretokenizers");
        if (!cJSON_IsArray(list) || depth > 4) {
            return ie_error_set(IE_ERR_FORMAT, "tokenizer: pre_tokenizer Sequence without a pretokenizers list");
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, list)
        {
            if ((st = parse_pretok(it, p, depth + 1)) != IE_OK) { return st; }
        }
        return IE_OK;
    }
    if (strcmp(ty, "ByteLevel") == 0) {
        if (bool_field(n, "add_prefix_space", 1)) {
            /* HF prepends to each piece present at that point: only the
             * whole segment when ByteLevel comes first */
            if (p->n_steps > 0 || p->metaspace) {
                return ie_error_set(IE_ERR_UNSUPPORTED,
                                    "tokenizer: ByteLevel add_prefix_space after another pre-tokenizer");
            }
            p->bl_prefix_space = 1;
        }
        p->bytelevel = 1;
        if (bool_field(n, "use_regex", 1)) {
            st = add_step_def(p, IE_TOK_RE_GPT2, strlen(IE_TOK_RE_GPT2), 0, IE_SPLIT_ISOLATED, 0);
        }
        p->bl_pretok_seen = 1;
        return st;
    }
    if (strcmp(ty, "Digits") == 0) {
        if (bool_field(n, "individual_digits", 0)) { return add_step_def(p, "\\p{N}", 5, 0, IE_SPLIT_ISOLATED, 0); }
        return add_step_def(p, "\\p{N}+", 6, 0, IE_SPLIT_ISOLATED, 0);
    }
    if (strcmp(ty, "Punctuation") == 0) {
        /* HF: each char that is Unicode punctuation or ASCII punctuation
         * (which adds the symbols $ + < = > ^ ` | ~), split with the
         * behavior (Falcon: Contiguous) */
        static const char punct[] = "[\\p{P}\\$\\+<=>\\^`\\|~]";
        ie_tok_split_behavior_t b = IE_SPLIT_ISOLATED;
        if (!is_null_or_absent(n, "behavior") && (st = parse_behavior(n, &b)) != IE_OK) { return st; }
        return add_step_def(p, punct, strlen(punct), 0, b, 0);
    }
    if (strcmp(ty, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const cJSON *re = pat ? cJSON_GetObjectItemCaseSensitive(pat, "Regex") : NULL;
        const cJSON *lit = pat ? cJSON_GetObjectItemCaseSensitive(pat, "String") : NULL;
        ie_tok_split_behavior_t b = IE_SPLIT_ISOLATED;
        if ((st = parse_behavior(n, &b)) != IE_OK) { return st; }
        int invert = bool_field(n, "invert", 0);
        if (cJSON_IsString(re)) { return add_step_def(p, re->valuestring, strlen(re->valuestring), 0, b, invert); }
        if (cJSON_IsString(lit)) {
            if (lit->valuestring[0] == '\0') { return IE_OK; /* HF: an empty string never matches */ }
            return add_step_def(p, lit->valuestring, strlen(lit->valuestring), 1, b, invert);
        }
        return ie_error_set(IE_ERR_FORMAT, "tokenizer: Split pre-tokenizer without a Regex or String pattern");
    }
    if (strcmp(ty, "Metaspace") == 0) {
        const char *rep = str_field(n, "replacement");
        if (rep && strcmp(rep, SPM_SPACE) != 0) {
            return ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: Metaspace replacement other than U+2581");
        }
        if (p->n_steps > 0 || p->metaspace) {
            return ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: Metaspace after another pre-tokenizer");
        }
        const char *scheme = str_field(n, "prepend_scheme");
        if (!scheme) {
            p->ms_prepend = bool_field(n, "add_prefix_space", 1) ? IE_TOK_PREPEND_ALWAYS : IE_TOK_PREPEND_NEVER;
        } else if (strcmp(scheme, "always") == 0) {
            p->ms_prepend = IE_TOK_PREPEND_ALWAYS;
        } else if (strcmp(scheme, "first") == 0) {
            p->ms_prepend = IE_TOK_PREPEND_FIRST;
        } else if (strcmp(scheme, "never") == 0) {
            p->ms_prepend = IE_TOK_PREPEND_NEVER;
        } else {
            return ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: Metaspace prepend_scheme '%s'", scheme);
        }
        p->metaspace = 1;
        if (bool_field(n, "split", 1)) { st = add_step_def(p, SPM_SPACE, 3, 1, IE_SPLIT_MERGED_WITH_NEXT, 0); }
        return st;
    }
    return ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: pre_tokenizer '%s' not supported", ty);
}

/* Decoders only tell us the flavour and whether a leading space goes. */
static void parse_decoder(const cJSON *n, pipeline_t *p, int depth)
{
    const char *ty = type_of(n);
    if (!ty || depth > 4) { return; }
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(n, "decoders")) { parse_decoder(it, p, depth + 1); }
    } else if (strcmp(ty, "ByteLevel") == 0) {
        p->bytelevel = 1;
    } else if (strcmp(ty, "Strip") == 0) {
        const char *c = str_field(n, "content");
        const cJSON *start = cJSON_GetObjectItemCaseSensitive(n, "start");
        if (c && strcmp(c, " ") == 0 && cJSON_IsNumber(start) && start->valuedouble >= 1) { p->strip_leading = 1; }
    } else if (strcmp(ty, "Metaspace") == 0) {
        const char *scheme = str_field(n, "prepend_scheme");
        int add = scheme ? strcmp(scheme, "never") != 0 : bool_field(n, "add_prefix_space", 1);
        if (add) { p->strip_leading = 1; }
    }
}

static ie_status_t pp_special(const cJSON *special_tokens, const char *name, const char **text_out, int32_t *id_out)
{
    *text_out = name;
    *id_out = -1;
    const cJSON *ent = special_tokens ? cJSON_GetObjectItemCaseSensitive(special_tokens, name) : NULL;
    const cJSON *ids = ent ? cJSON_GetObjectItemCaseSensitive(ent, "ids") : NULL;
    if (cJSON_IsArray(ids)) {
        if (cJSON_GetArraySize(ids) != 1) {
            return ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: post-processor special '%s' with several ids",
                                name);
        }
        *id_out = id_value(cJSON_GetArrayItem(ids, 0));
        if (*id_out < 0) {
            return ie_error_set(IE_ERR_FORMAT, "tokenizer: post-processor special '%s' has a bad id", name);
        }
    }
    return IE_OK;
}

static ie_status_t parse_post(const cJSON *n, pipeline_t *p, int depth)
{
    ie_status_t st = IE_OK;
    if (!n || cJSON_IsNull(n)) { return IE_OK; }
    const char *ty = type_of(n);
    if (!ty || depth > 4) { return ie_error_set(IE_ERR_FORMAT, "tokenizer: post_processor without a type"); }
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(n, "processors"))
        {
            if ((st = parse_post(it, p, depth + 1)) != IE_OK) { return st; }
        }
        return IE_OK;
    }
    if (strcmp(ty, "ByteLevel") == 0) { return IE_OK; /* offsets only */ }
    if (strcmp(ty, "TemplateProcessing") == 0) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(n, "single");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(n, "special_tokens");
        if (!cJSON_IsArray(single)) {
            return ie_error_set(IE_ERR_FORMAT, "tokenizer: TemplateProcessing without a 'single' template");
        }
        int seen_seq = 0, n_before = 0, n_after = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, single)
        {
            const cJSON *tok = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
            if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) {
                seen_seq = 1;
            } else if (tok) {
                const char *name = str_field(tok, "id");
                if (!name) {
                    return ie_error_set(IE_ERR_FORMAT, "tokenizer: TemplateProcessing special without an id");
                }
                if (!seen_seq) {
                    n_before++;
                    st = pp_special(sp, name, &p->pp_bos, &p->pp_bos_id);
                } else {
                    n_after++;
                    st = pp_special(sp, name, &p->pp_eos, &p->pp_eos_id);
                }
                if (st != IE_OK) { return st; }
            } else {
                return ie_error_set(IE_ERR_FORMAT,
                                    "tokenizer: TemplateProcessing item is neither Sequence nor SpecialToken");
            }
        }
        if (n_before > 1 || n_after > 1) {
            return ie_error_set(IE_ERR_UNSUPPORTED,
                                "tokenizer: TemplateProcessing with more than one special token per side");
        }
        p->pp_seen = 1;
        return IE_OK;
    }
    if (strcmp(ty, "BertProcessing") == 0 || strcmp(ty, "RobertaProcessing") == 0) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(n, "cls");
        const cJSON *sep = cJSON_GetObjectItemCaseSensitive(n, "sep");
        if (!cJSON_IsArray(cls) || !cJSON_IsArray(sep) || cJSON_GetArraySize(cls) != 2 ||
            cJSON_GetArraySize(sep) != 2 || !cJSON_IsString(cJSON_GetArrayItem(cls, 0)) ||
            !cJSON_IsString(cJSON_GetArrayItem(sep, 0))) {
            return ie_error_set(IE_ERR_FORMAT, "tokenizer: %s needs cls and sep as [text, id]", ty);
        }
        p->pp_bos = cJSON_GetArrayItem(cls, 0)->valuestring;
        p->pp_bos_id = id_value(cJSON_GetArrayItem(cls, 1));
        p->pp_eos = cJSON_GetArrayItem(sep, 0)->valuestring;
        p->pp_eos_id = id_value(cJSON_GetArrayItem(sep, 1));
        p->pp_seen = 1;
        return IE_OK;
    }
    return ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: post_processor '%s' not supported", ty);
}

/* ---------------------------------------------------------------- helpers */

/* Token text for a bos_token / eos_token config value: "x" or {"content": "x"}. */
static const char *config_token(const cJSON *cfg, const char *key)
{
    const cJSON *v = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, key) : NULL;
    if (cJSON_IsString(v)) { return v->valuestring; }
    if (cJSON_IsObject(v)) { return str_field(v, "content"); }
    return NULL;
}

/* Added tokens are looked up by their content, vocabulary tokens by text. */
static int32_t find_token(const ie_tokenizer_t *t, const char *text)
{
    return text ? ie_tokenizer_find(t, text, strlen(text)) : -1;
}

static int32_t resolve_special(const ie_tokenizer_t *t, const char *text, int32_t id)
{
    if (id >= 0 && id < t->n_vocab) { return id; }
    return find_token(t, text);
}

/* Split a merge entry into its two parts. */
static ie_status_t merge_parts(const cJSON *m, size_t rank, const char **a, size_t *al, const char **b, size_t *bl)
{
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring;
        const char *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ')) {
            return ie_error_set(IE_ERR_FORMAT, "tokenizer: merge %zu is not 'left right'", rank);
        }
        *a = s;
        *al = (size_t)(sp - s);
        *b = sp + 1;
        *bl = strlen(sp + 1);
        return IE_OK;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
        cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
        *a = cJSON_GetArrayItem(m, 0)->valuestring;
        *al = strlen(*a);
        *b = cJSON_GetArrayItem(m, 1)->valuestring;
        *bl = strlen(*b);
        return IE_OK;
    }
    return ie_error_set(IE_ERR_FORMAT, "tokenizer: merge %zu is neither \"a b\" nor [a, b]", rank);
}

/* Tokens that end a turn wherever a vocabulary has them (ChatML, Llama 3,
 * Phi-3, gpt-oss, Gemma), whatever the tokenizer's algorithm. */
static const char *const EOG_NAMES[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>",   "<|end|>",
                                        "<|return|>", "<|call|>",      "<end_of_turn>"};

/* ---------------------------------------------------------------- loader */

ie_status_t ie_tok_load_json(const char *json_path, const char *config_path, ie_tokenizer_t **out)
{
    ie_status_t st = IE_OK;
    char *buf = NULL, *cbuf = NULL, *scratch = NULL;
    size_t len = 0, clen = 0;
    cJSON *root = NULL, *cfg = NULL;
    ie_tokenizer_t *t = NULL;
    pipeline_t p;
    memset(&p, 0, sizeof p);
    p.pp_bos_id = p.pp_eos_id = -1;
    *out = NULL;

    if ((st = ie_file_read("tokenizer", json_path, IE_TOK_FILE_MAX, &buf, &len)) != IE_OK ||
        (st = parse_json(json_path, buf, len, &root)) != IE_OK) {
        goto cleanup;
    }
    /* tokenizer_config.json is optional: a missing one is no error */
    if (config_path && (access(config_path, F_OK) == 0 || errno != ENOENT)) {
        if ((st = ie_file_read("tokenizer", config_path, IE_TOK_FILE_MAX, &cbuf, &clen)) != IE_OK) { goto cleanup; }
        if (cbuf && (st = parse_json(config_path, cbuf, clen, &cfg)) != IE_OK) { goto cleanup; }
    }

    /* ---- model */
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) {
        st = ie_error_set(IE_ERR_FORMAT, "tokenizer: '%s' has no model object", json_path);
        goto cleanup;
    }
    const char *mtype = type_of(model);
    if (mtype && strcmp(mtype, "BPE") != 0) {
        st = ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: model type '%s' not supported (only BPE)", mtype);
        goto cleanup;
    }
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab)) {
        st = ie_error_set(IE_ERR_FORMAT, "tokenizer: model.vocab missing or not an object");
        goto cleanup;
    }
    if (merges && !cJSON_IsArray(merges) && !cJSON_IsNull(merges)) {
        st = ie_error_set(IE_ERR_FORMAT, "tokenizer: model.merges is not an array");
        goto cleanup;
    }
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0)) {
        st = ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: BPE dropout not supported");
        goto cleanup;
    }
    const char *csp = str_field(model, "continuing_subword_prefix");
    const char *eow = str_field(model, "end_of_word_suffix");
    if ((csp && *csp) || (eow && *eow) || (!is_null_or_absent(model, "continuing_subword_prefix") && !csp) ||
        (!is_null_or_absent(model, "end_of_word_suffix") && !eow)) {
        st = ie_error_set(IE_ERR_UNSUPPORTED,
                          "tokenizer: BPE continuing_subword_prefix / end_of_word_suffix not supported");
        goto cleanup;
    }

    /* ---- pipeline */
    if ((st = parse_normalizer(cJSON_GetObjectItemCaseSensitive(root, "normalizer"), &p, 0)) != IE_OK ||
        (st = parse_pretok(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), &p, 0)) != IE_OK ||
        (st = parse_post(cJSON_GetObjectItemCaseSensitive(root, "post_processor"), &p, 0)) != IE_OK) {
        goto cleanup;
    }
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (cJSON_IsObject(dec)) { parse_decoder(dec, &p, 0); }
    int spm = p.norm_replace || p.norm_prepend || p.metaspace;
    if (p.bytelevel && spm) {
        st = ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: both ByteLevel and U+2581 space handling");
        goto cleanup;
    }
    if (!p.bytelevel && !spm) {
        st = ie_error_set(
            IE_ERR_UNSUPPORTED,
            "tokenizer: BPE that is neither byte-level nor SentencePiece-style (U+2581) is not supported");
        goto cleanup;
    }
    if (p.norm_prepend && !p.norm_replace) {
        st = ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: Prepend(U+2581) without Replace(\" \" -> U+2581)");
        goto cleanup;
    }
    if (spm && (p.norm_replace || p.norm_prepend) && p.metaspace) {
        st = ie_error_set(IE_ERR_UNSUPPORTED, "tokenizer: both a U+2581 normalizer and Metaspace");
        goto cleanup;
    }

    /* ---- vocabulary size: the largest id of vocab and added_tokens */
    int32_t max_id = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab)
    {
        int32_t id = id_value(it);
        if (id < 0) {
            st = ie_error_set(IE_ERR_FORMAT, "tokenizer: vocab entry has a bad id");
            goto cleanup;
        }
        if (id > max_id) { max_id = id; }
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added)) {
        st = ie_error_set(IE_ERR_FORMAT, "tokenizer: added_tokens is not an array");
        goto cleanup;
    }
    cJSON_ArrayForEach(it, added)
    {
        int32_t id = id_value(cJSON_GetObjectItemCaseSensitive(it, "id"));
        if (id < 0 || !str_field(it, "content")) {
            st = ie_error_set(IE_ERR_FORMAT, "tokenizer: added token without a valid id and content");
            goto cleanup;
        }
        if (id > max_id) { max_id = id; }
    }
    if (max_id < 0) {
        st = ie_error_set(IE_ERR_FORMAT, "tokenizer: empty vocabulary");
        goto cleanup;
    }
    if ((st = ie_tok_alloc(max_id + 1, &t)) != IE_OK) { goto cleanup; }
    t->algo = p.bytelevel ? IE_TOK_ALGO_BYTE_BPE : IE_TOK_ALGO_SPM;
    t->merge_mode = IE_TOK_MERGE_RANK;
    t->byte_fallback = bool_field(model, "byte_fallback", 0);
    t->fuse_unk = bool_field(model, "fuse_unk", 0);
    t->ignore_merges = bool_field(model, "ignore_merges", 0);

    /* ---- tokens */
    size_t scratch_cap = 0;
    cJSON_ArrayForEach(it, vocab)
    {
        int32_t id = id_value(it);
        const char *s = it->string;
        size_t sl = strlen(s);
        ie_tok_token_t *tk = &t->tokens[id];
        if (tk->type == IE_TOKT_NORMAL || tk->type == IE_TOKT_BYTE) {
            st = ie_error_set(IE_ERR_FORMAT, "tokenizer: id %d appears twice in model.vocab", (int)id);
            goto cleanup;
        }
        if (sl + 1 > scratch_cap) {
            char *ns = realloc(scratch, sl + 1);
            if (!ns) {
                st = ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
                goto cleanup;
            }
            scratch = ns;
            scratch_cap = sl + 1;
        }
        tk->type = IE_TOKT_NORMAL;
        if (t->algo == IE_TOK_ALGO_BYTE_BPE) {
            long raw = ie_tok_bytelevel_decode(s, sl, scratch);
            if (raw >= 0) {
                st = ie_tok_set_token(t, id, scratch, (size_t)raw, scratch, (size_t)raw);
                tk->in_bpe = 1;
            } else {
                st = ie_tok_set_token(t, id, s, sl, s, sl);
            }
        } else {
            int b = t->byte_fallback ? ie_tok_parse_byte_token(s, sl) : -1;
            if (b >= 0) {
                char c = (char)b;
                tk->type = IE_TOKT_BYTE;
                st = ie_tok_set_token(t, id, s, sl, &c, 1);
            } else {
                size_t o = 0;
                for (size_t i = 0; i < sl;) {
                    if (i + 3 <= sl && memcmp(s + i, SPM_SPACE, 3) == 0) {
                        scratch[o++] = ' ';
                        i += 3;
                    } else {
                        scratch[o++] = s[i++];
                    }
                }
                st = ie_tok_set_token(t, id, s, sl, scratch, o);
                tk->in_bpe = 1;
            }
        }
        if (st != IE_OK) { goto cleanup; }
    }
    cJSON_ArrayForEach(it, added)
    {
        int32_t id = id_value(cJSON_GetObjectItemCaseSensitive(it, "id"));
        const char *content = str_field(it, "content");
        int special = bool_field(it, "special", 0);
        ie_tok_token_t *tk = &t->tokens[id];
        if ((st = ie_tok_set_token(t, id, content, strlen(content), content, strlen(content))) != IE_OK) {
            goto cleanup;
        }
        tk->type = special ? IE_TOKT_CONTROL : IE_TOKT_USER_DEFINED;
        tk->special = (uint8_t)special;
        tk->in_bpe = 0;
        tk->flags = IE_TOKF_MATCHABLE | (bool_field(it, "lstrip", 0) ? IE_TOKF_LSTRIP : 0) |
                    (bool_field(it, "rstrip", 0) ? IE_TOKF_RSTRIP : 0) |
                    (bool_field(it, "single_word", 0) ? IE_TOKF_SINGLE_WORD : 0);
    }
    if ((st = ie_tok_build_text_map(t)) != IE_OK) { goto cleanup; }

    /* ---- merges, rank = position */
    size_t n_merges = cJSON_IsArray(merges) ? (size_t)cJSON_GetArraySize(merges) : 0;
    if ((st = ie_tok_pairmap_init(&t->merges, n_merges)) != IE_OK) { goto cleanup; }
    size_t rank = 0;
    const cJSON *merge_list = cJSON_IsArray(merges) ? merges : NULL;
    cJSON_ArrayForEach(it, merge_list)
    {
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        if ((st = merge_parts(it, rank, &a, &al, &b, &bl)) != IE_OK) { goto cleanup; }
        if (al + bl + 1 > scratch_cap) {
            char *ns = realloc(scratch, al + bl + 1);
            if (!ns) {
                st = ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
                goto cleanup;
            }
            scratch = ns;
            scratch_cap = al + bl + 1;
        }
        long ra, rb;
        if (t->algo == IE_TOK_ALGO_BYTE_BPE) {
            ra = ie_tok_bytelevel_decode(a, al, scratch);
            rb = ra < 0 ? -1 : ie_tok_bytelevel_decode(b, bl, scratch + ra);
        } else {
            memcpy(scratch, a, al);
            memcpy(scratch + al, b, bl);
            ra = (long)al;
            rb = (long)bl;
        }
        int32_t left = -1, right = -1, merged = -1;
        if (ra > 0 && rb > 0) {
            left = ie_tok_strmap_get(&t->text_map, scratch, (size_t)ra);
            right = ie_tok_strmap_get(&t->text_map, scratch + ra, (size_t)rb);
            merged = ie_tok_strmap_get(&t->text_map, scratch, (size_t)(ra + rb));
        }
        if (left < 0 || right < 0 || merged < 0) {
            st = ie_error_set(IE_ERR_FORMAT,
                              "tokenizer: merge %zu ('%.*s' + '%.*s') refers to a token not in model.vocab", rank,
                              (int)(al > 32 ? 32 : al), a, (int)(bl > 32 ? 32 : bl), b);
            goto cleanup;
        }
        if (rank > INT32_MAX - 1 ||
            (st = ie_tok_pairmap_put(&t->merges, left, right, (int32_t)rank, merged)) != IE_OK) {
            if (st == IE_OK) { st = ie_error_set(IE_ERR_FORMAT, "tokenizer: too many merges"); }
            goto cleanup;
        }
        rank++;
    }

    /* ---- pre-tokenizer and normalisation */
    t->nfc = p.norm_nfc;
    for (size_t k = 0; k < p.n_steps; k++) {
        pcre2_code *re = NULL;
        if ((st = ie_tok_regex_compile(p.steps[k].pattern, p.steps[k].len, p.steps[k].literal, &re)) != IE_OK ||
            (st = ie_tok_add_step(t, re, p.steps[k].behavior, p.steps[k].invert)) != IE_OK) {
            goto cleanup;
        }
        t->steps[t->n_steps - 1].on_bytelevel = p.steps[k].on_bytelevel;
    }
    if (t->algo == IE_TOK_ALGO_BYTE_BPE) {
        if (p.bl_prefix_space) {
            t->prepend = IE_TOK_PREPEND_ALWAYS;
            t->prefix_if_missing = 1;
            t->prefix[0] = ' ';
            t->prefix_len = 1;
        }
    } else {
        t->escape_spaces = 1;
        memcpy(t->prefix, SPM_SPACE, 3);
        t->prefix_len = 3;
        if (p.metaspace) {
            t->prepend = p.ms_prepend;
            t->prefix_if_missing = 1;
        } else {
            t->prepend = p.norm_prepend ? IE_TOK_PREPEND_ALWAYS : IE_TOK_PREPEND_NEVER;
        }
    }
    t->strip_leading_space = p.strip_leading;

    /* ---- special ids */
    const char *unk = str_field(model, "unk_token");
    t->unk = find_token(t, unk);
    if (t->unk >= 0 && t->tokens[t->unk].type == IE_TOKT_NORMAL) { t->tokens[t->unk].type = IE_TOKT_UNKNOWN; }
    t->bpe_unk = t->unk; /* HF BPE: unk_token if set, else drop */
    const char *cfg_bos = config_token(cfg, "bos_token");
    const char *cfg_eos = config_token(cfg, "eos_token");
    t->bos = cfg_bos ? find_token(t, cfg_bos) : resolve_special(t, p.pp_bos, p.pp_bos_id);
    t->eos = cfg_eos ? find_token(t, cfg_eos) : resolve_special(t, p.pp_eos, p.pp_eos_id);
    t->add_bos = bool_field(cfg, "add_bos_token", p.pp_bos != NULL);
    t->add_eos = bool_field(cfg, "add_eos_token", p.pp_eos != NULL);
    if (t->eos < 0) {
        /* no config and no template: the conventional end-of-text tokens */
        t->eos = find_token(t, t->algo == IE_TOK_ALGO_SPM ? "</s>" : "<|endoftext|>");
    }
    if (t->bos < 0 && t->algo == IE_TOK_ALGO_SPM) { t->bos = find_token(t, "<s>"); }

    if ((st = ie_tok_finalize(t)) != IE_OK) { goto cleanup; }
    {
        /* Harmony (gpt-oss, recognised by <|channel|>): <|end|> closes one
         * message and generation goes on with the next, so only <|return|>
         * and <|call|> end the turn there. */
        int harmony = find_token(t, "<|channel|>") >= 0;
        for (size_t k = 0; k < sizeof EOG_NAMES / sizeof EOG_NAMES[0]; k++) {
            if (harmony && strcmp(EOG_NAMES[k], "<|end|>") == 0) { continue; }
            if ((st = ie_tok_add_eog(t, find_token(t, EOG_NAMES[k]))) != IE_OK) { goto cleanup; }
        }
    }
    *out = t;
    t = NULL;

cleanup:
    ie_tokenizer_destroy(&t);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    free(buf);
    free(cbuf);
    free(scratch);
    return st;
}

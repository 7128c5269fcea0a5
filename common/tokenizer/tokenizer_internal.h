/* tokenizer_internal.h — private structures shared by the tokenizer sources.
 *
 *   tokenizer.c         core: tables, special-token split, BPE, encode, decode
 *   tokenizer_map.c     open-addressing hash maps (bytes -> id, id pair -> merge)
 *   tokenizer_pretok.c  pre-tokenizer steps (PCRE2 regex splits) and UTF-8 helpers
 *   tokenizer_gguf.c    loader for tokenizer.ggml.* metadata
 *   tokenizer_json.c    loader for Hugging Face tokenizer.json (+ tokenizer_config.json)
 *   tokenizer_tiktoken.c loader for tiktoken ranks files (+ special-token table)
 *   tokenizer_nfc.c     Unicode NFC (tables in tokenizer_nfc_table.h, generated)
 *
 * Loaders fill an ie_tokenizer_t through the ie_tok_* builder functions and
 * finish with ie_tok_finalize(), which builds every lookup structure. After
 * that the object is never written again, so one tokenizer may serve many
 * threads; encode allocates its scratch per call.
 */
#ifndef IE_TOKENIZER_INTERNAL_H
#define IE_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "ie_tokenizer.h"

#include <stddef.h>
#include <stdint.h>

/* Token kinds; the numbers are GGUF's tokenizer.ggml.token_type values. */
enum {
    IE_TOKT_NORMAL = 1,
    IE_TOKT_UNKNOWN = 2,
    IE_TOKT_CONTROL = 3,
    IE_TOKT_USER_DEFINED = 4,
    IE_TOKT_UNUSED = 5,
    IE_TOKT_BYTE = 6
};

/* Per-token flags for added tokens (tokenizer.json attributes). */
enum {
    IE_TOKF_LSTRIP = 1,      /* swallow whitespace to the left of a match  */
    IE_TOKF_RSTRIP = 2,      /* swallow whitespace to the right of a match */
    IE_TOKF_SINGLE_WORD = 4, /* match only when not inside a word          */
    IE_TOKF_MATCHABLE = 8    /* split out of the text before BPE           */
};

typedef enum ie_tok_algo {
    IE_TOK_ALGO_BYTE_BPE = 1, /* GPT-2 byte-level BPE, merges by rank          */
    IE_TOK_ALGO_SPM = 2       /* SentencePiece-style BPE over UTF-8 characters */
} ie_tok_algo_t;

/* How merges are prioritised: rank of the pair (lower first) or the score of
 * the merged token (higher first, SentencePiece / GGUF llama). */
typedef enum ie_tok_merge_mode {
    IE_TOK_MERGE_RANK = 1,
    IE_TOK_MERGE_SCORE = 2,
    IE_TOK_MERGE_TIKTOKEN = 3 /* no merge list: a pair joins when its
                                 concatenation is a token, lowest id first */
} ie_tok_merge_mode_t;

/* When a segment gets the prefix (U+2581 or ' '). */
typedef enum ie_tok_prepend {
    IE_TOK_PREPEND_NEVER = 0,
    IE_TOK_PREPEND_ALWAYS = 1, /* every non-empty text segment                   */
    IE_TOK_PREPEND_FIRST = 2   /* only a segment that starts at byte 0 of the input */
} ie_tok_prepend_t;

/* Hugging Face SplitDelimiterBehavior. */
typedef enum ie_tok_split_behavior {
    IE_SPLIT_REMOVED = 0,
    IE_SPLIT_ISOLATED,
    IE_SPLIT_MERGED_WITH_PREVIOUS,
    IE_SPLIT_MERGED_WITH_NEXT,
    IE_SPLIT_CONTIGUOUS
} ie_tok_split_behavior_t;

/* ---- hash maps (tokenizer_map.c) ------------------------------------- */

/* bytes -> int32. Keys are borrowed pointers that must outlive the map. */
typedef struct ie_tok_strmap {
    struct ie_tok_strslot *slots;
    size_t cap; /* power of two, 0 when empty */
    size_t count;
} ie_tok_strmap_t;

/* (left id, right id) -> (rank, merged id). */
typedef struct ie_tok_pairmap {
    struct ie_tok_pairslot *slots;
    size_t cap;
    size_t count;
} ie_tok_pairmap_t;

ie_status_t ie_tok_strmap_init(ie_tok_strmap_t *m, size_t expected);
void ie_tok_strmap_free(ie_tok_strmap_t *m);
/* Insert key -> value unless the key is present; *inserted_out (may be NULL)
 * tells which. The key bytes are not copied. */
ie_status_t ie_tok_strmap_put(ie_tok_strmap_t *m, const char *key, size_t len, int32_t value, int *inserted_out);
/* Value for key, or -1. */
int32_t ie_tok_strmap_get(const ie_tok_strmap_t *m, const char *key, size_t len);

ie_status_t ie_tok_pairmap_init(ie_tok_pairmap_t *m, size_t expected);
void ie_tok_pairmap_free(ie_tok_pairmap_t *m);
/* Insert unless present (the first, lowest-rank merge wins). */
ie_status_t ie_tok_pairmap_put(ie_tok_pairmap_t *m, int32_t left, int32_t right, int32_t rank, int32_t merged);
/* 1 and the rank/merged id if present, else 0. */
int ie_tok_pairmap_get(const ie_tok_pairmap_t *m, int32_t left, int32_t right, int32_t *rank_out,
                       int32_t *merged_out);

/* ---- pre-tokenizer (tokenizer_pretok.c) ------------------------------- */

typedef struct ie_tok_pretok_step {
    pcre2_code *re;
    ie_tok_split_behavior_t behavior;
    int invert;
    int on_bytelevel; /* the step comes after HF's ByteLevel pre-tokenizer,
                         so its regex sees the byte-level form of the text
                         (each byte one code point: ' ' is the letter U+0120,
                         the UTF-8 bytes of '½' are 'Â' and '½') */
} ie_tok_pretok_step_t;

/* A piece of the working buffer. */
typedef struct ie_tok_span {
    uint32_t off;
    uint32_t len;
} ie_tok_span_t;

/* Growable list of spans. */
typedef struct ie_tok_spans {
    ie_tok_span_t *v;
    size_t n, cap;
} ie_tok_spans_t;

/* The GPT-2 pre-tokenizer regex (the one HF's ByteLevel uses). */
extern const char *const IE_TOK_RE_GPT2;
/* The o200k (GPT-4o / gpt-oss) pre-tokenizer regex, as tiktoken and
 * gpt-oss's tokenizer.json spell it. */
extern const char *const IE_TOK_RE_O200K;

/* Compile `pattern` (Oniguruma/HF syntax; \s and \S are rewritten to the
 * Unicode White_Space property as Oniguruma defines them) or, when
 * `literal` is 1, the exact string. Caller owns *out (pcre2_code_free). */
ie_status_t ie_tok_regex_compile(const char *pattern, size_t len, int literal, pcre2_code **out);

/* Apply one split step to every span of `in`, appending the resulting
 * non-empty spans of `buf` to `out`. */
ie_status_t ie_tok_pretok_apply(const ie_tok_pretok_step_t *step, const char *buf, const ie_tok_spans_t *in,
                                ie_tok_spans_t *out, pcre2_match_data *md, pcre2_match_context *mctx);

ie_status_t ie_tok_spans_push(ie_tok_spans_t *s, uint32_t off, uint32_t len);

/* Length of the valid UTF-8 prefix; == len when all valid. Strict: no
 * overlongs, surrogates or code points above U+10FFFF. */
size_t ie_tok_utf8_valid_prefix(const char *s, size_t len);
/* Length of the UTF-8 sequence that starts with byte c (1 for invalid). */
int ie_tok_utf8_len(unsigned char c);

/* 1 when NFC could change s (some code point >= U+0300), else 0. */
int ie_tok_nfc_needed(const char *s, size_t len);
/* NFC of the valid UTF-8 src[0..len) into *buf (grown as needed, *cap its
 * size; the caller frees it); *out_len receives the length. */
ie_status_t ie_tok_nfc(const char *src, size_t len, char **buf, size_t *cap, size_t *out_len);

/* GPT-2 byte <-> code point mapping. */
uint32_t ie_tok_byte_to_cp(unsigned char b);
/* The byte for code point cp, or -1 when cp is not in the mapping. */
int ie_tok_cp_to_byte(uint32_t cp);
/* Decode a byte-level token string into raw bytes: dst needs len bytes.
 * Returns the raw length, or -1 if some character is not in the mapping. */
long ie_tok_bytelevel_decode(const char *s, size_t len, char *dst);

/* ---- the tokenizer ---------------------------------------------------- */

typedef struct ie_tok_token {
    uint32_t text_off, text_len;   /* match form: what BPE and the special-token
                                      split compare against (SPM: with U+2581,
                                      byte-level: raw bytes)                 */
    uint32_t piece_off, piece_len; /* decoded bytes for output               */
    float score;
    uint8_t type;    /* IE_TOKT_*                              */
    uint8_t flags;   /* IE_TOKF_*                              */
    uint8_t in_bpe;  /* text takes part in BPE lookups          */
    uint8_t special; /* needs IE_TOK_PARSE_SPECIAL to match     */
} ie_tok_token_t;

struct ie_tokenizer {
    ie_tok_algo_t algo;
    ie_tok_merge_mode_t merge_mode;

    int32_t n_vocab;
    ie_tok_token_t *tokens; /* [n_vocab]                                   */
    char *pool;             /* text and piece bytes of all tokens          */
    size_t pool_len, pool_cap;

    ie_tok_strmap_t text_map; /* match-form text -> id (tokens with in_bpe)  */
    ie_tok_pairmap_t merges;  /* rank mode only                              */
    int32_t byte_sym[256];    /* byte-level: id of each single byte          */
    int32_t byte_tok[256];    /* SPM: id of <0xXX>, -1 if missing            */

    int nfc; /* NFC-normalise text before everything else (HF normalizer) */

    /* SPM options */
    int byte_fallback;
    int fuse_unk;
    int escape_spaces;        /* ' ' -> U+2581                               */
    ie_tok_prepend_t prepend; /* when to prepend `prefix`                    */
    int prefix_if_missing;    /* only prepend when the segment does not
                                 already start with the prefix (HF ByteLevel) */
    char prefix[8];
    size_t prefix_len;
    int ignore_merges;       /* whole-word vocabulary hit skips BPE          */
    int spm_word_split;      /* SPM: no token has U+2581 after another
                                 character, so BPE may run word by word      */
    int strip_leading_space; /* detokenizer drops one leading ' '           */

    /* pre-tokenizer steps */
    ie_tok_pretok_step_t *steps;
    size_t n_steps;

    /* special-token matching: ids grouped by first byte, longest first */
    int32_t *match_ids;
    uint32_t match_start[257];
    size_t n_match;

    int32_t bos, eos, eot, unk, pad;
    int32_t fim_pre, fim_suf, fim_mid; /* from GGUF keys; -1: look the spellings up */
    int32_t bpe_unk;                   /* emitted for text BPE cannot represent; -1
                                 drops it (HF without unk_token; byte-level
                                 GGUFs, whose "unknown" id is often EOS)   */
    int add_bos, add_eos;
    int32_t *eog; /* sorted, unique */
    size_t n_eog;
};

/* Builder helpers used by the loaders. */
ie_status_t ie_tok_alloc(int32_t n_vocab, ie_tokenizer_t **out);
/* Append bytes to the pool; *off_out receives their offset. */
ie_status_t ie_tok_pool_add(ie_tokenizer_t *t, const char *s, size_t len, uint32_t *off_out);
/* Set token `id`'s match text and piece (both copied). */
ie_status_t ie_tok_set_token(ie_tokenizer_t *t, int32_t id, const char *text, size_t text_len, const char *piece,
                             size_t piece_len);
/* Append a pre-tokenizer step that owns `re`. On failure re is freed. */
ie_status_t ie_tok_add_step(ie_tokenizer_t *t, pcre2_code *re, ie_tok_split_behavior_t behavior, int invert);
/* Add an id to the end-of-generation set (ignores -1 and duplicates). */
ie_status_t ie_tok_add_eog(ie_tokenizer_t *t, int32_t id);
/* Build text_map from the tokens marked in_bpe (the first id wins for a
 * duplicated text). Loaders call it before adding merges. */
ie_status_t ie_tok_build_text_map(ie_tokenizer_t *t);
/* Build text_map if not built yet, byte tables, the special-token index and
 * the end-of-generation set; check the special ids. */
ie_status_t ie_tok_finalize(ie_tokenizer_t *t);

/* Largest tokenizer file read whole (ie_file_read's limit). */
#define IE_TOK_FILE_MAX ((size_t)1 << 30)

/* A byte-fallback token "<0xAB>" (hex digits of either case: HF writes
 * upper case, some GGUF vocabularies lower) -> 0xAB; anything else -> -1. */
int ie_tok_parse_byte_token(const char *s, size_t len);

ie_status_t ie_tok_load_gguf(const char *path, ie_tokenizer_t **out);
ie_status_t ie_tok_load_json(const char *json_path, const char *config_path, ie_tokenizer_t **out);

#endif

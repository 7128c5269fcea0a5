/* ie_tokenizer.h — text <-> token ids.
 *
 * Two algorithms, each loadable from GGUF metadata (tokenizer.ggml.*) and
 * from a Hugging Face tokenizer.json (byte-level BPE also from a tiktoken
 * ranks file):
 *   - byte-level BPE (GPT-2 style; SmolLM2, GPT-2, o200k): pre-tokenizer
 *     regexes run through PCRE2 with Unicode properties (UCP), bytes mapped to
 *     printable code points, merges applied by rank;
 *   - SentencePiece-style BPE (Llama-2): spaces become U+2581, an optional
 *     prefix space, merges by score (GGUF) or rank (tokenizer.json), and
 *     <0xXX> byte fallback for anything not in the vocabulary.
 * Special / added tokens are matched in the text before BPE only when the
 * caller asks (IE_TOK_PARSE_SPECIAL); otherwise they are plain text.
 * Exception, as in Hugging Face tokenizers and llama.cpp: non-special added
 * tokens (tokenizer.json "special": false, GGUF USER_DEFINED) are always
 * matched; the flag governs control tokens (CONTROL / UNKNOWN / special).
 *
 * A loaded tokenizer is immutable: any number of threads may encode and
 * query it at once. Each ie_detok_t belongs to one thread at a time.
 */
#ifndef IE_TOKENIZER_H
#define IE_TOKENIZER_H

#include "ie_status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ie_tokenizer ie_tokenizer_t;

enum {
    IE_TOK_ADD_SPECIAL = 1,  /* add BOS (and EOS) as the model's rules say */
    IE_TOK_PARSE_SPECIAL = 2 /* treat special-token strings as tokens      */
};

/* Load from a GGUF file (a vocab-only GGUF is enough), a tokenizer.json, or
 * a directory holding tokenizer.json (and tokenizer_config.json if any; for
 * a tokenizer.json path, a tokenizer_config.json beside it is read too).
 * Caller owns *out (ie_tokenizer_destroy). Errors: IE_ERR_IO (missing),
 * IE_ERR_FORMAT (malformed: bad JSON, ids out of range, merges naming
 * unknown tokens), IE_ERR_UNSUPPORTED (a model type, normalizer or
 * pre-tokenizer we do not implement; the message names it). */
ie_status_t ie_tokenizer_load(const char *path, ie_tokenizer_t **out);
/* A path ending in ".tiktoken" is a tiktoken ranks file (see below); the
 * special-token table IE_TIKTOKEN_SPECIALS in the same directory is read
 * with it when present. */
#include "ie_tokfile.h" /* IE_TIKTOKEN_SPECIALS */

/* Load a tiktoken ranks file ("BASE64 RANK" per line; rank = id; merges
 * implied: the adjacent pair whose concatenation has the lowest rank joins
 * first) with the o200k pre-tokenizer, plus an optional special-token table
 * (specials_path may be NULL): a JSON object {"special_tokens": {"<|x|>":
 * id, ...}, "n_vocab": N?, "pattern": "regex"?} or a bare {"<|x|>": id}.
 * Special tokens are control tokens; BOS is <|startoftext|>, EOS
 * <|endoftext|> (never added); <|return|> and <|call|> also end a turn.
 * Gives the same ids as gpt-oss's tokenizer.json. Caller owns *out.
 * Errors: IE_ERR_IO, IE_ERR_FORMAT (bad line, base64, rank, duplicate id,
 * a missing single byte, bad JSON), IE_ERR_UNSUPPORTED (pattern). */
ie_status_t ie_tokenizer_load_tiktoken(const char *ranks_path, const char *specials_path, ie_tokenizer_t **out);

/* Free the tokenizer and set *self_p to NULL. Accepts NULL. */
void ie_tokenizer_destroy(ie_tokenizer_t **self_p);

/* Encode `len` bytes of UTF-8. Invalid UTF-8 -> IE_ERR_INVAL ("invalid
 * UTF-8 at byte N"). On success *ids_out is a malloc'd array the caller
 * frees (non-NULL even when *n_out is 0), *n_out its length; on failure
 * *ids_out is NULL and *n_out 0. flags: IE_TOK_ADD_SPECIAL adds BOS / EOS
 * as ie_tokenizer_add_bos / _add_eos say; IE_TOK_PARSE_SPECIAL see above. */
ie_status_t ie_tokenizer_encode(const ie_tokenizer_t *tok, const char *text, size_t len, int flags,
                                int32_t **ids_out, size_t *n_out);

/* IE_OK if text[0..len) is valid UTF-8 (no overlongs, surrogates or code
 * points above U+10FFFF), else IE_ERR_INVAL "invalid UTF-8 at byte N". */
ie_status_t ie_tokenizer_check_utf8(const char *text, size_t len);

/* The raw bytes a token stands for (byte-level and <0xXX> decoded, U+2581 as
 * space). Special/control tokens give their text only if `special` is 1,
 * else nothing. Writes up to cap bytes; returns the full length, or -1 for
 * an out-of-range id. Bytes may be a partial UTF-8 sequence. */
int ie_tokenizer_token_bytes(const ie_tokenizer_t *tok, int32_t id, int special, char *buf, size_t cap);

int32_t ie_tokenizer_n_vocab(const ie_tokenizer_t *tok);
int32_t ie_tokenizer_bos(const ie_tokenizer_t *tok); /* -1 if none */
int32_t ie_tokenizer_eos(const ie_tokenizer_t *tok); /* -1 if none */
int32_t ie_tokenizer_eot(const ie_tokenizer_t *tok); /* -1 if none */
int32_t ie_tokenizer_unk(const ie_tokenizer_t *tok); /* -1 if none */
/* 1 if IE_TOK_ADD_SPECIAL prepends BOS / appends EOS for this model. */
int ie_tokenizer_add_bos(const ie_tokenizer_t *tok);
int ie_tokenizer_add_eos(const ie_tokenizer_t *tok);
/* 1 if generating `id` ends a turn (EOS, EOT, <|im_end|>, ...). */
int ie_tokenizer_is_eog(const ie_tokenizer_t *tok, int32_t id);
/* 1 if `id` is a control/unknown token (its text is hidden unless asked). */
int ie_tokenizer_is_special(const ie_tokenizer_t *tok, int32_t id);
/* Fill-in-the-middle: 1 and the prefix / suffix / middle token ids when the
 * model has them (the GGUF's tokenizer.ggml.fim_{pre,suf,mid}_token_id, else
 * one family of spellings found whole in the vocabulary: <|fim_prefix|>,
 * <fim_prefix>, <fim-prefix>, DeepSeek's <｜fim▁begin｜>, CodeLlama's <PRE>,
 * GLM's <|code_prefix|> and their suffix / middle), else 0 (outputs untouched). */
int ie_tokenizer_fim(const ie_tokenizer_t *tok, int32_t *pre, int32_t *suf, int32_t *mid);
/* Id of the token whose vocabulary text is exactly text[0..len) (e.g.
 * "<|im_start|>"), or -1. Linear scan: for set-up, not per token. */
int32_t ie_tokenizer_find(const ie_tokenizer_t *tok, const char *text, size_t len);

/* ---- streaming detokenizer: emits only complete UTF-8 ---------------- */
typedef struct ie_detok ie_detok_t;

/* Caller owns *out; the tokenizer must outlive it. Control tokens produce
 * no text unless ie_detok_set_special(d, 1). */
ie_status_t ie_detok_new(const ie_tokenizer_t *tok, ie_detok_t **out);
/* Free and set *self_p to NULL. Accepts NULL. */
void ie_detok_destroy(ie_detok_t **self_p);
/* 1: control tokens (BOS, <|im_end|>, ...) emit their text; 0 (default): not. */
void ie_detok_set_special(ie_detok_t *d, int special);

/* Push one token; appends the newly completed UTF-8 text (NUL-terminated)
 * to an internal buffer and returns a pointer to just that new text (valid
 * until the next call). A sequence that never completes is emitted as
 * U+FFFD by ie_detok_flush(); a byte that cannot continue the held sequence
 * turns it into one U+FFFD at once (the "maximal subpart" rule; HF's
 * ByteFallback instead turns every byte of an invalid run into U+FFFD, so
 * the two differ only on invalid byte sequences). SentencePiece's leading
 * space of the first token is dropped as HF does. Out-of-range ids produce
 * nothing. After a flush the stream continues; use a new ie_detok_t for a
 * new text. */
const char *ie_detok_push(ie_detok_t *d, int32_t id);
const char *ie_detok_flush(ie_detok_t *d);
/* Byte length of the text the last push/flush returned (it may contain NUL
 * bytes, e.g. from <0x00>, which strlen would stop at). */
size_t ie_detok_last_len(const ie_detok_t *d);

#endif

/* ie_grammar.h — structured output: a JSON Schema compiled into a byte
 * matcher, and the token mask it gives a sampler.
 *
 * No well-kept C library does this (Debian has JSON Schema *validators*
 * only; llguidance, xgrammar and outlines-core are Rust/C++ with Python
 * bindings), so grammar.c is our own: the schema becomes a graph of nodes
 * (object, array, string, number, integer, literal, alternatives), and the
 * matcher runs it as a set of explicit stacks (one per live alternative of
 * anyOf/oneOf/type lists/enum), fed one byte at a time.
 *
 * The language: compact-ish JSON with bounded whitespace. No whitespace
 * before or after the top-level value; inside containers at most
 * IE_GRAMMAR_MAX_WS whitespace bytes (space, \n, \t) in a row at each
 * place JSON allows them, so a model cannot loop on whitespace. Strings
 * are valid UTF-8 with JSON escapes (\u escapes of surrogates are refused:
 * non-BMP characters go as raw UTF-8, so lengths count code points
 * exactly). Numbers are at most IE_GRAMMAR_MAX_NUM bytes, exponents at
 * most 2 digits. Nesting is at most IE_GRAMMAR_MAX_DEPTH containers.
 *
 * Supported keywords: type (one or a list), properties (emitted in schema
 * order; required ones mandatory, optional ones may be skipped), required,
 * additionalProperties (with `properties`, extra keys are never generated,
 * whatever it says: stricter than the schema and always valid; without
 * `properties`: false = only {}, true/absent = any keys with any values, a
 * schema = any keys with values of that schema), items, prefixItems,
 * minItems, maxItems, minLength, maxLength, minimum / maximum /
 * exclusiveMinimum / exclusiveMaximum (type integer only), enum, const,
 * anyOf, oneOf (generated as anyOf: an output may match more than one
 * branch), $ref to any JSON pointer in the document ("#", "#/$defs/x",
 * "#/definitions/x"; recursion allowed), and the annotations title,
 * description, default, examples, $schema, $id, $comment, $defs,
 * definitions, deprecated, readOnly, writeOnly. Any other keyword fails
 * the compilation with IE_ERR_INVAL naming it; nothing is silently
 * ignored. Without `type`, object keywords imply "object", array keywords
 * "array", string keywords "string"; none: any JSON value.
 *
 * No dead ends: the compiler computes how deep each node's shallowest
 * instance nests, and the matcher never takes a byte after which the
 * value could not be finished within the limits (a schema none of whose
 * instances fits is refused at compile time). Done means complete: end of
 * text is allowed exactly then; for a top-level number more digits stay
 * allowed too. anyOf/$ref chains are followed at most 32 deep without a
 * byte in between (deeper alternatives are not offered).
 *
 * Typical use (the scheduler, sched.c):
 *     ie_grammar_compile(schema, &g);  ie_gmatch_new(g, &m);
 *     each step:  ie_gvocab_apply(v, m, logits);  sample id;
 *                 ie_gvocab_accept(v, m, id);
 */
#ifndef IE_GRAMMAR_H
#define IE_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "ie_status.h"
#include "ie_tokenizer.h"

#define IE_GRAMMAR_MAX_WS 8     /* whitespace bytes in a row          */
#define IE_GRAMMAR_MAX_NUM 24   /* bytes per number                   */
#define IE_GRAMMAR_MAX_DEPTH 48 /* nested containers + 1              */
#define IE_GRAMMAR_MAX_ALTS \
    16                          /* live alternatives; more are dropped
                                   (the output stays valid, the choice
                                   narrower)                          */
#define IE_GRAMMAR_MAX_PROPS 64 /* properties per object schema       */

typedef struct ie_grammar ie_grammar_t;
typedef struct ie_gmatch ie_gmatch_t;
typedef struct ie_gvocab ie_gvocab_t;

/* Compile a JSON Schema document (NUL-terminated). "" is any JSON object
 * (OpenAI's json_object). IE_ERR_INVAL with a message naming the keyword
 * for an unsupported keyword, a malformed value or a schema no finite JSON
 * value satisfies. Caller owns *out (ie_grammar_destroy); NULL on failure. */
ie_status_t ie_grammar_compile(const char *schema, ie_grammar_t **out);

/* A grammar whose language is exactly the strings choices[0..n) (raw
 * text, not JSON: vLLM's guided_choice), 1 <= n <= IE_GRAMMAR_MAX_ALTS,
 * none empty (IE_ERR_INVAL naming the problem). One choice that begins
 * another may end there or go on. Caller owns *out. */
ie_status_t ie_grammar_compile_choice(const char *const *choices, size_t n, ie_grammar_t **out);

/* Free a grammar; *self_p = NULL. Accepts NULL. Its matchers must be gone. */
void ie_grammar_destroy(ie_grammar_t **self_p);

/* A matcher at the start of a value of g. g must outlive it. Caller owns
 * *out (ie_gmatch_destroy). About 75 KiB (three states of up to
 * IE_GRAMMAR_MAX_ALTS stacks of IE_GRAMMAR_MAX_DEPTH frames). */
ie_status_t ie_gmatch_new(const ie_grammar_t *g, ie_gmatch_t **out);

/* Free a matcher; *self_p = NULL. Accepts NULL. */
void ie_gmatch_destroy(ie_gmatch_t **self_p);

/* Feed n bytes: 1 if the text so far is still a prefix of a value of the
 * grammar (the state advanced), 0 if not (the state is left unchanged). */
int ie_gmatch_feed(ie_gmatch_t *m, const char *bytes, size_t n);

/* 1 if the bytes fed so far are a complete value (end of text allowed). */
int ie_gmatch_done(const ie_gmatch_t *m);

/* A vocabulary as a byte trie for masking. kind[i]: 0 an ordinary token
 * with bytes[i][0..lens[i]), 1 never allowed (special tokens, empty
 * ones), 2 an end token (allowed exactly when the value is complete).
 * Copies everything. Caller owns *out (ie_gvocab_destroy). */
ie_status_t ie_gvocab_new(int32_t n_vocab, const char *const *bytes, const size_t *lens, const uint8_t *kind,
                          ie_gvocab_t **out);

/* The vocabulary of a tokenizer: its raw token bytes; special tokens
 * never; end-of-generation tokens (ie_tokenizer_is_eog, plus end_ids[0..n))
 * as end tokens. */
ie_status_t ie_gvocab_from_tokenizer(const ie_tokenizer_t *tok, const int32_t *end_ids, size_t n_end,
                                     ie_gvocab_t **out);

/* Free; *self_p = NULL. Accepts NULL. */
void ie_gvocab_destroy(ie_gvocab_t **self_p);

int32_t ie_gvocab_n(const ie_gvocab_t *v);

/* allow[0..n_vocab) = 1 for every token that keeps m's text a prefix of a
 * value (an end token: iff m is done), else 0. Returns how many are 1.
 * Walks the trie once, pruning at the first byte that leaves the language.
 * Uses v's scratch: one caller at a time per vocabulary. */
int32_t ie_gvocab_mask(ie_gvocab_t *v, const ie_gmatch_t *m, uint8_t *allow);

/* The mask applied: logits[i] = -inf for every token not allowed.
 * IE_ERR_INTERNAL if no token is allowed (cannot happen for a compiled
 * grammar whose matcher only took allowed tokens). */
ie_status_t ie_gvocab_apply(ie_gvocab_t *v, const ie_gmatch_t *m, float *logits);

/* Advance m by token id: its bytes, or for an end token a check that m is
 * done. IE_ERR_INVAL (state unchanged) if the token is not allowed. */
ie_status_t ie_gvocab_accept(const ie_gvocab_t *v, ie_gmatch_t *m, int32_t id);

#endif

/* ie_tokfile.h — names of the tokenizer files a model directory holds.
 *
 * Shared by the tokenizer (which reads them) and the IEBIN writer (which
 * copies them beside a converted model) without the formats depending on
 * the tokenizer.
 */
#ifndef IE_TOKFILE_H
#define IE_TOKFILE_H

/* The special-token table read with a tiktoken ranks file (same directory). */
#define IE_TIKTOKEN_SPECIALS "o200k_harmony_special_tokens.json"

#endif

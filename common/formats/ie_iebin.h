/* ie_iebin.h — IEBIN v1, the engine-native model format (docs/FORMAT.md).
 *
 * A model is a directory holding
 *   model.ie.json   format + version, architecture and hyper-parameters,
 *                   tokenizer reference, conversion record, and for every
 *                   tensor: name, dtype, layout, group, shape, byte offset,
 *                   size, quantization parameters and an XXH3-64 hash;
 *                   plus a content hash over the tensor table.
 *   model.ie.bin    the tensor blob: every tensor 64-byte aligned, tensors
 *                   of 64 KiB or more 4 KiB (page) aligned, mmap'd read-only.
 *   tokenizer.*     the tokenizer the json names (tokenizer.json, or
 *                   tokenizer.gguf: a GGUF with no tensors holding the source
 *                   GGUF's tokenizer.* and general.architecture keys).
 *
 * The reader validates everything before returning (JSON types, known
 * version, dtype/layout/group/shape consistency, offsets and sizes inside the
 * blob and aligned, no overlaps, unique names, tensor hashes unless
 * IE_IEBIN_VERIFY=0); any inconsistency is IE_ERR_FORMAT with a one-line
 * reason naming the field or tensor.
 */
#ifndef IE_IEBIN_H
#define IE_IEBIN_H

#include "ie_model_src.h"
#include "ie_status.h"

#include <stdint.h>

#define IE_IEBIN_VERSION 1
#define IE_IEBIN_JSON "model.ie.json"
#define IE_IEBIN_BIN "model.ie.bin"

/* ------------------------------------------------------------------ read */

typedef struct ie_iebin ie_iebin_t;

/* Open the IEBIN model at `path` (its directory or its model.ie.json).
 * Caller owns *out (ie_iebin_destroy). */
ie_status_t ie_iebin_open(const char *path, ie_iebin_t **out);

/* Same from a JSON text and a caller-owned blob (fuzzing, tests); the
 * tokenizer path is resolved against `dir` (may be NULL). */
ie_status_t ie_iebin_open_memory(const char *json, size_t json_len, const void *blob, size_t blob_len,
                                 const char *dir, ie_iebin_t **out);

void ie_iebin_destroy(ie_iebin_t **self_p);

/* 1 if `path` looks like an IEBIN model (a directory containing
 * model.ie.json, or a file named model.ie.json). */
int ie_iebin_detect(const char *path);

const ie_hparams_t *ie_iebin_hparams(const ie_iebin_t *m);
int64_t ie_iebin_n_tensors(const ie_iebin_t *m);
/* i-th tensor in file order; data points into the mapped blob. */
const ie_tensor_t *ie_iebin_tensor(const ie_iebin_t *m, int64_t i);
/* Path of the tokenizer file (joined with the model directory). */
const char *ie_iebin_tokenizer_path(const ie_iebin_t *m);
/* The content hash recorded in the json ("xxh3-128:<32 hex>"). */
const char *ie_iebin_content_hash(const ie_iebin_t *m);

/* ----------------------------------------------------------------- write */

typedef struct ie_iebin_writer ie_iebin_writer_t;

/* Start writing a model into directory `dir` (created if missing; files
 * are written under temporary names and renamed into place by finish, so a
 * failed conversion never leaves a half model). Caller owns *out. */
ie_status_t ie_iebin_writer_open(const char *dir, ie_iebin_writer_t **out);

/* Append one tensor (t->data, t->nbytes bytes; dtype/layout/group/ne as the
 * reader will return them). `quant_json`, if not NULL, is a JSON object text
 * stored as the tensor's "quant" field (e.g. {"scheme":"int4w","group":32,
 * "zero":"symmetric","scale":"absmax"}). Checks that nbytes matches the
 * shape (ie_tensor_bytes; BSR blobs via ie_bsr_view). */
ie_status_t ie_iebin_writer_add(ie_iebin_writer_t *w, const ie_tensor_t *t, const char *quant_json);

/* Copy the tokenizer: a GGUF source becomes tokenizer.gguf (its tokenizer.*
 * and general.architecture keys, no tensors); a tokenizer.json or .tiktoken
 * file is copied under its own name. */
ie_status_t ie_iebin_writer_set_tokenizer(ie_iebin_writer_t *w, const char *src_path);

/* Write model.ie.json (hparams, tokenizer, tensors, content hash and
 * `conversion_json` — a JSON object text stored as "conversion", may be
 * NULL), fsync, rename everything into place. Frees the writer in all
 * cases (*w_p = NULL); on failure the temporary files are removed. */
ie_status_t ie_iebin_writer_finish(ie_iebin_writer_t **w_p, const ie_hparams_t *hp, const char *conversion_json);

/* Give up: remove temporary files, free the writer. */
void ie_iebin_writer_abort(ie_iebin_writer_t **w_p);

#endif

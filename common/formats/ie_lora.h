/* ie_lora.h — LoRA adapters read from disk, checked against a base model.
 *
 * Two formats:
 *   PEFT directory   adapter_config.json + adapter_model.safetensors (what
 *                    peft's save_pretrained writes): tensors
 *                    base_model.model.model.layers.N.{self_attn,mlp}.
 *                    MOD.lora_{A,B}.weight, A [r][n_in], B [n_out][r];
 *                    scale lora_alpha / r (use_rslora: / sqrt(r))
 *   GGUF LoRA        general.type = "adapter", adapter.type = "lora",
 *                    adapter.lora.alpha; tensors blk.N.NAME.weight.lora_a
 *                    (ggml ne [n_in, r]: the same A) and .lora_b (ne [r,
 *                    n_out]) as llama.cpp's convert_lora_to_gguf.py writes
 *                    them; scale alpha / r (alpha 0: 1), llama.cpp's rule
 * Modules: the attention projections q, k, v, o and the dense MLP's gate,
 * up, down. Everything else a file may carry — DoRA magnitudes, embedding
 * or head adapters, modules_to_save, LoRA biases, per-module rank or alpha
 * patterns, a tensor of a layer or shape the base lacks — is refused with
 * IE_ERR_UNSUPPORTED / IE_ERR_FORMAT naming the tensor or key.
 *
 * The weights are held as bf16 when the file stores A and B as BF16, else
 * as f32 (f16 is widened), in the
 * base model's row order: llama.cpp's converter permutes the q/k rows of a
 * Llama GGUF (IE_ROPE_NORMAL) and of its GGUF LoRAs' B, so a PEFT adapter
 * on such a base gets its q/k B rows permuted the same way, and a GGUF
 * LoRA on an HF (IE_ROPE_NEOX) Llama base gets them un-permuted. Adapters
 * are never merged into the base weights: the worker adds
 * scale * B (A x) to each projection's output (ie_worker_lora_add).
 */
#ifndef IE_LORA_H
#define IE_LORA_H

#include "ie_model_src.h"
#include "ie_status.h"

#include <stddef.h>
#include <stdint.h>

#define IE_LORA_MAX_RANK 256

typedef enum ie_lora_mod {
    IE_LORA_Q = 0,
    IE_LORA_K,
    IE_LORA_V,
    IE_LORA_O,
    IE_LORA_GATE,
    IE_LORA_UP,
    IE_LORA_DOWN,
    IE_LORA_NMOD
} ie_lora_mod_t;

/* One adapted projection: y[n_out] += scale * B (A x[n_in]). rank 0: none.
 * B is held transposed (bt[j][o] = B[o][j]) so the kernels add rank
 * contiguous rows of n_out to y (ie_kernels_t.lora_f32). */
typedef struct ie_lora_mat {
    int rank;
    int64_t n_in, n_out;
    float scale;
    float *a;      /* [rank][n_in]  f32, or NULL when bf16  */
    float *bt;     /* [rank][n_out]                         */
    uint16_t *a16; /* the same as bf16 bits: a file storing both
                      A and B as BF16 is kept so (half the bytes
                      each decode step streams); else NULL   */
    uint16_t *bt16;
    int8_t *a8;  /* or int8 (ie_lora_quantize_int8): A[j][k] =  */
    int8_t *bt8; /* a8[j][k] * sa8[k], B^T[j][o] = bt8[         */
    float *sa8;  /* IE_LORA_BT8_AT(j, o, n_out)] * sbt8[o] (four */
    float *sbt8; /* ranks of a column side by side, ie_kernels.h):
                    a scale per column (over the rank), [n_in],
                    [n_out]; else all four NULL                 */
} ie_lora_mat_t;

typedef struct ie_lora {
    int n_layer;          /* the base's                              */
    int max_rank;         /* largest rank of any matrix              */
    unsigned mods;        /* bit m: some layer adapts module m       */
    int n_mats;           /* adapted projections                     */
    uint64_t bytes;       /* of the weights held: f32 / bf16, or int8
                             codes (padding included) and scales     */
    const char *format;   /* "peft" or "gguf"; "concat" for a set     */
    uint64_t fingerprint; /* XXH3-64 over the bytes of the files read
                             (PEFT: adapter_config.json, then
                             adapter_model.safetensors; GGUF: the
                             file); 0 from memory or ie_lora_concat   */
    ie_lora_mat_t *mats;  /* [n_layer][IE_LORA_NMOD]                 */
} ie_lora_t;

/* "q", "k", "v", "o", "gate", "up", "down" */
const char *ie_lora_mod_name(ie_lora_mod_t m);

/* Load the adapter at `path` (a PEFT directory, or a .gguf file) for the
 * base model hp. IE_ERR_IO (missing files), IE_ERR_FORMAT (a corrupted
 * file or config), IE_ERR_UNSUPPORTED (DoRA and the other refusals
 * above), IE_ERR_INVAL (a shape, layer or rank that does not fit hp),
 * IE_ERR_NOMEM; each message names the file and the tensor or key. Caller
 * owns *out (ie_lora_destroy). */
ie_status_t ie_lora_load(const char *path, const ie_hparams_t *hp, ie_lora_t **out);

/* A PEFT adapter from memory: config JSON (cfg_len bytes, need not be
 * NUL-terminated) and a safetensors image; same checks as ie_lora_load
 * (for tests and the fuzz target). */
ie_status_t ie_lora_load_peft_memory(const char *cfg, size_t cfg_len, const void *st, size_t st_len,
                                     const ie_hparams_t *hp, ie_lora_t **out);

/* Matrix of layer l, module m (rank 0 when not adapted); NULL when out of
 * range. */
const ie_lora_mat_t *ie_lora_mat(const ie_lora_t *a, int l, ie_lora_mod_t m);

/* One adapter equal to the sum of n weighted adapters (1 <= n <= 8, all
 * for the same base: same n_layer): for every projection any part adapts,
 * A is the parts' A stacked (each part's rows multiplied by scales[i] and
 * its own alpha scale) and B^T the parts' B^T stacked, so scale 1 times
 * B (A x) = sum_i scales[i] * scale_i * B_i (A_i x). Always f32 (bf16 parts
 * are widened exactly); the result owns its weights, the parts may be
 * destroyed after. Ranks add up (at most IE_LORA_MAX_RANK per projection:
 * IE_ERR_RANGE beyond). IE_ERR_INVAL for n out of range, NULL parts,
 * non-finite scales or parts of different layer counts; IE_ERR_NOMEM.
 * Caller owns *out (ie_lora_destroy). */
ie_status_t ie_lora_concat(const ie_lora_t *const *parts, const float *scales, int n, ie_lora_t **out);

/* The XXH3-64 fingerprint ie_lora_load records, computed for `path` alone
 * (a PEFT directory or a GGUF file) without parsing it: a worker compares
 * it with the coordinator's before loading. IE_ERR_IO when a file cannot
 * be read. */
ie_status_t ie_lora_fingerprint(const char *path, uint64_t *out);

/* A copy of `a` with every matrix in int8: each column of A and of B^T
 * (over the rank) gets one f32 scale, absmax / 127, and codes rounded to
 * nearest, so a column slice (a tensor-parallel rank's share) quantizes
 * exactly as the whole matrix does and every rank agrees. Half the bytes
 * of bf16 (a quarter of f32) for a decode step to stream; the error is
 * that of int8 rounding of each column (~0.3% of its largest weight, rms).
 * IE_ERR_INVAL for NULL, IE_ERR_NOMEM. Caller owns *out. */
ie_status_t ie_lora_quantize_int8(const ie_lora_t *a, ie_lora_t **out);

/* The bytes ie_lora_quantize_int8(a) allocates for its weights (its
 * result's `bytes`), without making it: a budget can refuse an adapter
 * before a worker copies it. 0 for NULL. */
uint64_t ie_lora_int8_bytes(const ie_lora_t *a);

/* Free *self_p and set it NULL; accepts NULL. */
void ie_lora_destroy(ie_lora_t **self_p);

#endif

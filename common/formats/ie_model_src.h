/* ie_model_src.h — one view over every model format we read.
 *
 * A model source exposes the architecture's hyper-parameters and its tensors
 * under canonical (GGUF/llama.cpp) names — "token_embd.weight",
 * "blk.%d.attn_q.weight", "output_norm.weight", "output.weight", ... —
 * whatever the file calls them. GPT-OSS uses llama.cpp's gpt-oss names and
 * layouts (docs/GPTOSS.md §3.3): attn_{q,k,v,output}.{weight,bias},
 * attn_sinks.weight, post_attention_norm.weight, ffn_gate_inp.{weight,bias},
 * ffn_{gate,up,down}_exps.{weight,bias} with experts as the outermost dim
 * (ne = [in, out, n_expert]), MXFP4 experts in ggml's block layout.
 * Tensor data stays memory-mapped; nothing is copied. HF directories are
 * mapped from their HF names (model.layers.N...).
 * Exception: GPT-OSS HF checkpoints store experts in another layout, so
 * ffn_{gate,up,down}_exps.weight and ffn_{gate,up}_exps.bias are converted
 * copies owned by the source (plain experts keep their F32/F16/BF16 dtype,
 * MXFP4 _blocks/_scales pairs become ggml block_mxfp4); the converted
 * sources' pages are then dropped from the mapping, so resident memory stays
 * about the file's size. Gemma 2/3 HF norms ("...norm.weight") are float32
 * copies holding w + 1, as llama.cpp's converter stores them (Gemma's
 * RMSNorm multiplies by 1 + w). Everything else is mapped.
 *
 * RoPE layout follows the file: GGUF llama stores Q/K permuted for the
 * NORMAL (interleaved-pair) rotation; HF checkpoints use NEOX (rotate_half).
 */
#ifndef IE_MODEL_SRC_H
#define IE_MODEL_SRC_H

#include "ie_dtype.h"
#include "ie_kernels.h"
#include "ie_status.h"

#include <stdint.h>

/* Ids are stored in IEBIN files and fingerprints: never renumber. */
typedef enum ie_arch {
    IE_ARCH_LLAMA = 0,    /* Llama 1/2/3.x, SmolLM2, TinyLlama, Mistral  */
    IE_ARCH_GPTOSS = 1,   /* GPT-OSS: MoE, sinks, sliding window, YaRN   */
    IE_ARCH_QWEN2 = 2,    /* Qwen2 / Qwen2.5: q/k/v biases               */
    IE_ARCH_QWEN3 = 3,    /* Qwen3: per-head q/k RMS norm                */
    IE_ARCH_QWEN3MOE = 4, /* Qwen3-MoE: q/k norm, softmax top-k experts  */
    IE_ARCH_PHI3 = 5,     /* Phi-3 / 3.5: fused qkv and gate_up          */
    IE_ARCH_GEMMA2 = 6,   /* Gemma 2: GeGLU, sandwich norms, soft-caps   */
    IE_ARCH_GEMMA3 = 7    /* Gemma 3 (text): + q/k norm, two RoPE bases  */
} ie_arch_t;

/* The architecture's name ("llama", "gpt-oss", as GGUF's
 * general.architecture and IEBIN's "arch" spell it), or NULL for an id
 * without one. */
const char *ie_arch_name(ie_arch_t id);
/* 1 and *out = the id if `name` is an architecture's name, else 0. */
int ie_arch_from_name(const char *name, ie_arch_t *out);

#define IE_MAX_LAYERS 512

typedef struct ie_hparams {
    char arch[32]; /* "llama" or "gpt-oss"                        */
    ie_arch_t arch_id;
    char name[128]; /* general.name or directory name              */
    int n_layer;
    int n_embd; /* hidden size                                 */
    int n_ff;   /* MLP intermediate size                       */
    int n_head;
    int n_head_kv;
    int head_dim; /* n_embd / n_head unless the file says        */
    int n_vocab;
    int n_ctx_train;
    int rope_dim; /* rotated dims per head (= head_dim usually)  */
    float rope_theta;
    float rms_eps;
    ie_rope_layout_t rope_layout;
    int tied_embeddings; /* 1: no output.weight, reuse token_embd       */

    /* ---- GPT-OSS (zero / unused for Llama); see docs/GPTOSS.md ---- */
    int n_expert;                     /* experts per MoE layer (0: dense MLP)        */
    int n_expert_used;                /* top-k                                       */
    int sliding_window;               /* W of sliding layers (0: none)               */
    uint8_t layer_swa[IE_MAX_LAYERS]; /* 1: layer l is sliding-window      */
    int attn_bias;                    /* q/k/v/o have biases                         */
    int attn_sinks;                   /* per-head sink logits (attn_sinks.weight)    */
    float swiglu_limit;               /* clamp of the experts' SwiGLU (7)            */
    float swiglu_alpha;               /* sigmoid slope of the experts' SwiGLU (1.702) */
    /* YaRN (rope_yarn_factor 0: plain RoPE) */
    float rope_yarn_factor;
    int rope_yarn_orig_ctx;
    float rope_yarn_beta_fast;
    float rope_yarn_beta_slow;
    int rope_yarn_truncate; /* floor/ceil the correction range (HF key)   */
    float rope_attn_factor; /* multiplies cos and sin (0.1 ln f + 1)       */

    /* ---- the other architectures' switches (0 = off unless said) ---- */
    int qkv_bias;          /* q/k/v have biases, o has none (Qwen2); attn_bias
                              is all four (GPT-OSS)                          */
    int qk_norm;           /* blk.N.attn_{q,k}_norm.weight [head_dim]: RMS
                              norm of each q / k head before RoPE (Qwen3,
                              Gemma 3), with rms_eps                        */
    float attn_scale;      /* scores = q.k * attn_scale; 0: 1/sqrt(head_dim)
                              (Gemma: query_pre_attn_scalar^-1/2)           */
    float attn_softcap;    /* scores = c tanh(scores / c); 0: off (Gemma 2) */
    float final_softcap;   /* logits = c tanh(logits / c); 0: off (Gemma 2) */
    float embd_scale;      /* x = embedding * embd_scale; 0: off (Gemma:
                              sqrt(n_embd), rounded to the model's dtype)   */
    int post_norms;        /* blk.N.post_attention_norm / post_ffw_norm on
                              each block's output before the residual add
                              (Gemma 2/3; their input norm of the MLP is
                              ffn_norm)                                     */
    int ffn_gelu;          /* MLP activation gelu (tanh approximation)
                              instead of silu (Gemma)                       */
    float rope_theta_swa;  /* RoPE base of sliding-window layers; 0: the
                              same as rope_theta (Gemma 3: 10000)           */
    float rope_freq_scale; /* linear RoPE scaling: position * scale; 0 or 1:
                              off (Gemma 3 global layers: 1/8)              */
    int rope_freqs;        /* rope_freqs.weight [rope_dim/2]: per-frequency
                              divisors (Llama 3.x "llama3" scaling; Phi-3
                              long/short factors chosen at load)            */
    int moe_norm_topk;     /* MoE: renormalize the top-k weights to sum 1
                              (Qwen3-MoE norm_topk_prob)                    */
    int moe_softmax_first; /* MoE: softmax over all experts, then top-k
                              (Qwen3-MoE) instead of top-k then softmax     */
} ie_hparams_t;

typedef struct ie_tensor {
    const char *name; /* canonical name, NUL-terminated              */
    ie_dtype_t dtype;
    int n_dims;
    int64_t ne[4];    /* ne[0] = row length (contiguous)             */
    const void *data; /* mapped, read-only                           */
    uint64_t nbytes;
    /* GGUF and HF sources always give ROWS and group 0; IEBIN may give
     * I8W/I4W/I4WA (group = G) in ROWS or PANEL16 layout, or BSR blobs. For
     * 3-D tensors (MoE experts) each ne[2] slice is one matrix laid out on
     * its own, slices back to back. */
    ie_layout_t layout;
    int group;
} ie_tensor_t;

typedef enum { IE_SRC_GGUF = 0, IE_SRC_HF_DIR = 1, IE_SRC_IEBIN = 2, IE_SRC_MEM = 3 } ie_src_kind_t;

typedef struct ie_model_src ie_model_src_t;

/* Open a GGUF file, an IEBIN directory (model.ie.json + model.ie.bin, see
 * docs/FORMAT.md and ie_iebin.h) or a Hugging Face directory (config.json +
 * *.safetensors [+ model.safetensors.index.json] + tokenizer.json). A path
 * to model.ie.json itself also opens IEBIN. Validates the
 * hyper-parameters (positive, consistent, bounded) and that every tensor
 * the architecture needs exists with the right shape; errors name the
 * tensor or field. Caller owns *out (ie_model_src_destroy). */
ie_status_t ie_model_src_open(const char *path, ie_model_src_t **out);

void ie_model_src_destroy(ie_model_src_t **self_p);

ie_src_kind_t ie_model_src_kind(const ie_model_src_t *src);
const ie_hparams_t *ie_model_src_hparams(const ie_model_src_t *src);

/* Tensor by canonical name, or NULL. Pointer valid while src lives. */
const ie_tensor_t *ie_model_src_tensor(const ie_model_src_t *src, const char *name);

/* Path the tokenizer should be loaded from: the GGUF file itself, or the
 * directory's tokenizer.json. */
const char *ie_model_src_tokenizer_path(const ie_model_src_t *src);

/* The underlying GGUF (NULL for other kinds). */
const struct ie_gguf *ie_model_src_gguf(const ie_model_src_t *src);

/* A 64-bit fingerprint of the model's shape (architecture and every
 * hyper-parameter except the name): a coordinator and its workers check
 * they hold the same model, whichever file format each one loads. */
uint64_t ie_model_src_fingerprint(const ie_model_src_t *src);

/* A 64-bit hash of the weights as stored: XXH3 over every tensor's name,
 * type, layout, shape and bytes, in name order (never 0). It reads every
 * mapped byte of the model (several GB/s once in the page cache), so a
 * coordinator and its workers can check they hold the same weights, not
 * only the same shapes; two files of one model in other formats or
 * quantizations hash differently. release: a process that will never
 * compute with the weights (the coordinator) drops each file-mapped
 * tensor's pages after hashing it (ie_file_release_pages), so they do not
 * stay resident; tensors in memory the source owns are left alone. */
uint64_t ie_model_src_weights_hash(const ie_model_src_t *src, int release);

/* Number of tensors and the i-th (name order), for converters. */
int64_t ie_model_src_n_tensors(const ie_model_src_t *src);
const ie_tensor_t *ie_model_src_tensor_at(const ie_model_src_t *src, int64_t i);

/* ---- in-memory sources (converter, calibration, tests) ----
 * ie_model_src_new_mem makes an empty source with hyper-parameters *hp and
 * the tokenizer at tokenizer_path (copied); add tensors with
 * ie_model_src_mem_add (name and ne copied; `data` is adopted when `owned`
 * is non-NULL — freed with free() on destroy — else borrowed and must
 * outlive the source), then ie_model_src_mem_finish validates like
 * ie_model_src_open (hyper-parameters, every required tensor and shape). */
ie_status_t ie_model_src_new_mem(const ie_hparams_t *hp, const char *tokenizer_path, ie_model_src_t **out);
ie_status_t ie_model_src_mem_add(ie_model_src_t *src, const ie_tensor_t *t, void *owned);
ie_status_t ie_model_src_mem_finish(ie_model_src_t *src);

#endif

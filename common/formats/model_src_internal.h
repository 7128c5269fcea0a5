/* model_src_internal.h — what the model source's files share: the source
 * itself, the per-architecture table and the readers every architecture's
 * file uses.
 *
 * model_src.c is the format side (GGUF, HF directories, IEBIN, in-memory
 * sources: opening, the tensor table, the common validation). Each
 * architecture lives in its own file, model_<arch>.c, as one msrc_arch_t:
 * its names, how its hyper-parameters are read from GGUF keys and from an HF
 * config.json, its HF tensor names, any HF tensors that need converted
 * copies, and the tensors it requires. model_arch.c lists them. Adding an
 * architecture is a new file plus one line in that list (and its entry in
 * worker/src/arch_desc.c for what the forward pass turns on).
 *
 * Not installed; nothing outside common/formats includes this.
 */
#ifndef IE_MODEL_SRC_INTERNAL_H
#define IE_MODEL_SRC_INTERNAL_H

#include "ie_gguf.h"
#include "ie_iebin.h"
#include "ie_model_src.h"
#include "ie_safetensors.h"

#include <cjson/cJSON.h>

#include <stddef.h>
#include <stdint.h>

#define HP_MAX (1 << 20) /* bound on every integer hyper-parameter */
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

typedef struct src_tensor {
    ie_tensor_t t;         /* must stay first: the public view            */
    char *name;            /* owned; t.name points here                   */
    const char *type_name; /* the file's name for the dtype, for errors   */
    void *owned;           /* converted copy t.data points into, or NULL  */
    int hidden;            /* split into views (msrc_split_rows): kept past
                              n_sorted, invisible to lookups and converters */
} src_tensor_t;

struct ie_model_src {
    ie_src_kind_t kind;
    ie_hparams_t hp;
    ie_gguf_t *gguf;
    ie_safetensors_t **shards;
    int n_shards;
    src_tensor_t *tensors; /* sorted by name */
    int64_t n_tensors;
    int64_t n_sorted;    /* leading entries sorted by name (searchable) */
    int64_t cap_tensors; /* entries allocated (zeroed beyond n_tensors) */
    char *tokenizer_path;
    ie_iebin_t *iebin;   /* IEBIN: owns the blob mapping tensors point into */
    int mem_finished;    /* in-memory source: mem_finish succeeded      */
    const cJSON *hf_cfg; /* HF: config.json while the directory opens (an
                            architecture's hf_convert reads its fields),
                            else NULL                                      */
};

/* Field names as each format spells them, for error messages. */
typedef struct hp_labels {
    const char *n_layer, *n_head, *n_head_kv, *head_dim, *rope_dim;
    const char *n_expert, *n_expert_used, *sliding_window; /* MoE, sliding window */
} hp_labels_t;

/* One HF tensor name (after "model.layers.N.") and its canonical name
 * (after "blk.N."). */
typedef struct name_pair {
    const char *hf, *canon;
    int hint_only; /* canonical tensor is a converted copy: HF name for error hints only */
} name_pair_t;

/* An architecture, as the model source sees it. */
typedef struct msrc_arch {
    ie_arch_t id;
    const char *name;               /* hp->arch, GGUF general.architecture, IEBIN "arch" */
    const char *hf_classes[4];      /* config.json "architectures" entries (NULL-ended) */
    const char *hf_model_type;      /* config.json "model_type"                */
    const name_pair_t *layer_names; /* HF <-> canonical names inside a layer */
    size_t n_layer_names;
    /* GGUF: read the "<name>.*" keys into hp (arch, arch_id and name are set) */
    ie_status_t (*gguf_hparams)(const ie_gguf_t *g, ie_hparams_t *hp);
    /* HF: read config.json into s->hp (arch, arch_id and name are set) */
    ie_status_t (*hf_hparams)(ie_model_src_t *s, const cJSON *cfg);
    /* HF: table entries hf_convert adds per layer (converted copies) */
    int hf_extra_per_layer;
    /* HF: table entries hf_convert adds once per model (rope_freqs.weight) */
    int hf_extra;
    /* HF: after the mapped tensors are in the sorted table, add converted
     * copies (msrc_add_owned) and re-sort; NULL: nothing to convert */
    ie_status_t (*hf_convert)(ie_model_src_t *s);
    /* GGUF and HF: table entries split_fused adds per layer and once (views) */
    int views_per_layer, views_extra;
    /* GGUF and HF: after the table is sorted (and hf_convert ran), present
     * fused tensors as the canonical separate ones (msrc_split_rows) and
     * re-sort; NULL: nothing fused */
    ie_status_t (*split_fused)(ie_model_src_t *s);
    /* every tensor the architecture needs, after the common checks */
    ie_status_t (*validate)(const ie_model_src_t *s, const hp_labels_t *lb);
} msrc_arch_t;

extern const msrc_arch_t msrc_arch_llama;
extern const msrc_arch_t msrc_arch_gptoss;
extern const msrc_arch_t msrc_arch_phi3;
extern const msrc_arch_t msrc_arch_qwen2;

/* The dense Llama tensors (embedding, norms, head unless tied; per layer
 * q/k/v/o and the SwiGLU MLP), which the Llama-shaped families share. */
ie_status_t msrc_llama_validate(const ie_model_src_t *s, const hp_labels_t *lb);
extern const msrc_arch_t msrc_arch_gemma2, msrc_arch_gemma3; /* model_gemma.c */
extern const msrc_arch_t msrc_arch_qwen3;
extern const msrc_arch_t msrc_arch_qwen3moe;

/* The entry for id / for the name (len bytes, not NUL-terminated), or NULL. */
const msrc_arch_t *msrc_arch_by_id(ie_arch_t id);
const msrc_arch_t *msrc_arch_by_name(const char *name, size_t len);
/* The entry whose HF class or model_type config.json names, or NULL. */
const msrc_arch_t *msrc_arch_by_hf(const cJSON *cfg);
/* "'llama', 'gpt-oss', ..." into buf (for error messages); returns buf */
const char *msrc_arch_list(char *buf, size_t cap);

/* ---- the tensor table */
const src_tensor_t *msrc_find(const ie_model_src_t *s, const char *name);
/* Sort the table (hidden entries last, past n_sorted) and reject visible
 * names that appear twice. */
ie_status_t msrc_sort_tensors(ie_model_src_t *s);
/* Present the visible 1-D or 2-D ROWS tensor `fused` as n parts without copying:
 * part i is a new entry names[i] of rows[i] rows (the rows sum to the
 * fused tensor's ne[1]) whose data points into the fused tensor's (a row
 * of every ROWS dtype, ggml blocks included, is contiguous: ne[0]
 * elements). The fused entry is hidden (still owned by the table, so its
 * data outlives the parts). Needs n free entries; the parts are found
 * after the next msrc_sort_tensors. The caller has checked the row count;
 * errors: a dtype without a row size, a full table, out of memory. */
ie_status_t msrc_split_rows(ie_model_src_t *s, const char *fused, int n, const char *const *names,
                            const int64_t *rows);
/* Next free table entry: a new tensor `name` backed by a fresh zeroed
 * buffer of `nbytes`, returned in *buf; the entry owns the buffer. */
ie_status_t msrc_add_owned(ie_model_src_t *s, const char *name, ie_dtype_t dt, const char *type_name, int n_dims,
                           int64_t ne0, int64_t ne1, int64_t ne2, uint64_t nbytes, uint8_t **buf);

/* ---- validation: the tensor must exist with exactly these dims and a
 * dtype the kernels compute with; errors name it (and its HF name) */
void msrc_fmt_shape(char *buf, size_t cap, int n_dims, const int64_t *ne);
ie_status_t msrc_need_ne(const ie_model_src_t *s, const char *name, int n_dims, const int64_t *want);
ie_status_t msrc_need(const ie_model_src_t *s, const char *name, int n_dims, int64_t ne0, int64_t ne1);
/* One tensor every layer needs: "blk.N.<suffix>" with n_dims dims of
 * sizes ne; skip non-zero: not this model's (a feature it lacks). */
typedef struct msrc_req {
    const char *suffix;
    int n_dims;
    int skip;
    int64_t ne[3];
} msrc_req_t;
/* msrc_need_ne for each entry of req that is not skipped, layer by layer
 * (layer 0's tensors in table order, then layer 1's...); the first failure. */
ie_status_t msrc_need_layers(const ie_model_src_t *s, const msrc_req_t *req, size_t n);
/* token_embd.weight [n_embd, n_vocab], output_norm.weight [n_embd] and,
 * where head is non-zero, output.weight [n_embd, n_vocab]. */
ie_status_t msrc_need_embd(const ie_model_src_t *s, int head);
/* The hyper-parameter checks several architectures share, errors naming
 * the fields as lb spells them: rope_dim must equal head_dim (no partial
 * rotary); some layer sliding -> a window of at least 1; n_expert_used at
 * most n_expert. */
ie_status_t msrc_check_full_rotary(const ie_hparams_t *hp, const hp_labels_t *lb);
ie_status_t msrc_check_swa(const ie_hparams_t *hp, const hp_labels_t *lb);
ie_status_t msrc_check_experts(const ie_hparams_t *hp, const hp_labels_t *lb);
/* v in [1, HP_MAX] -> *out, else an error naming field */
ie_status_t msrc_check_range(const char *field, int64_t v, int *out);

/* ---- GGUF keys */
ie_status_t msrc_gguf_int(const ie_gguf_t *g, const char *key, int required, int64_t def, int *out);
ie_status_t msrc_gguf_float(const ie_gguf_t *g, const char *key, int required, float def, float *out);
void msrc_str_copy(char *dst, size_t cap, ie_gguf_str_t s);
/* n_vocab from token_embd.weight's rows, checked against vocab_key if present */
ie_status_t msrc_gguf_vocab(const ie_gguf_t *g, const char *vocab_key, int *n_vocab);
/* "<arch>.<key>" */
ie_status_t msrc_gguf_arch_int(const ie_gguf_t *g, const char *arch, const char *key, int required, int64_t def,
                               int *out);
ie_status_t msrc_gguf_arch_float(const ie_gguf_t *g, const char *arch, const char *key, int required, float def,
                                 float *out);
int msrc_gguf_arch_has(const ie_gguf_t *g, const char *arch, const char *key);
/* The keys every architecture has under its prefix: shape, context, head
 * geometry, RoPE base and dimensions, norm epsilon. ff_key: the MLP width's
 * key; rope_base: the RoPE base when the file gives none. */
ie_status_t msrc_gguf_hparams_common(const ie_gguf_t *g, const char *a, const char *ff_key, float rope_base,
                                     ie_hparams_t *hp);

/* <a>.rope.scaling.type absent or "none": plain; "linear": factor (>= 1)
 * into hp->rope_freq_scale; "yarn": factor, original_context_length and
 * the optional yarn_* keys into hp->rope_yarn_* / rope_attn_factor, as
 * llama.cpp's converter writes them; anything else is refused naming the
 * key. */
ie_status_t msrc_gguf_rope_scaling(const ie_gguf_t *g, const char *a, ie_hparams_t *hp);
/* n_vocab (msrc_gguf_vocab with "<a>.vocab_size") and a tied head when the
 * file has no output.weight */
ie_status_t msrc_gguf_vocab_tied(const ie_gguf_t *g, const char *a, ie_hparams_t *hp);

/* ---- HF config.json */
/* member `key` of `o`, or NULL if absent or `o` is not an object */
const cJSON *msrc_obj_get(const cJSON *o, const char *key);
ie_status_t msrc_read_json(const char *path, cJSON **out);
/* integer field; absent or null -> def unless required; range-checked */
ie_status_t msrc_cfg_int(const cJSON *cfg, const char *field, int required, int64_t def, int *out);
ie_status_t msrc_cfg_float(const cJSON *cfg, const char *field, float def, float *out);
/* absent/null/false -> 0, true -> 1; anything else is an error */
ie_status_t msrc_cfg_bool(const cJSON *cfg, const char *field, int *out);
/* number member `key` of a rope object; absent, null or (zero_is_absent) 0 -> def */
ie_status_t msrc_rope_num(const cJSON *ro, const char *field, const char *key, int zero_is_absent, double def,
                          double *out);
/* The RoPE object of a Llama-shaped config (rope_parameters or
 * rope_scaling; its rope_theta overrides hp->rope_theta): "default",
 * "linear" (hp->rope_freq_scale = 1 / factor) and "yarn" (hp->rope_yarn_*,
 * rope_attn_factor: transformers' _compute_yarn_parameters) are computed;
 * "llama3" is left to the caller (*type, when llama3_ok); anything else,
 * "dynamic" included, is refused naming the field. *type: the type read. */
ie_status_t msrc_hf_rope_scaling(const cJSON *cfg, int llama3_ok, ie_hparams_t *hp, const char **type);
/* The config's RoPE object: rope_parameters (transformers 5) or
 * rope_scaling (older files), NULL if neither; *field names it. */
const cJSON *msrc_hf_rope_field(const cJSON *cfg, const char **field);
/* What every typed rope object `ro` (named field) is checked for: an
 * object; its rope_theta (absent: *theta kept) into *theta; a
 * partial_rotary_factor of 1; *type its rope_type / type ("default" when
 * not a string). */
ie_status_t msrc_rope_obj_base(const cJSON *ro, const char *field, double *theta, const char **type);
/* hidden_act absent or "silu", else refused */
ie_status_t msrc_cfg_silu(const cJSON *cfg);
/* bool `field` (msrc_cfg_bool) that must not be true: a feature we do not
 * implement ("config.json <field> = true is not supported") */
ie_status_t msrc_cfg_refuse_true(const cJSON *cfg, const char *field);
/* layer_types (one "sliding_attention" / "full_attention" per layer) into
 * hp->layer_swa; *given 0 and layer_swa untouched when absent or null.
 * n_layer above IE_MAX_LAYERS is refused first. */
ie_status_t msrc_hf_layer_types(const cJSON *cfg, ie_hparams_t *hp, int *given);
/* hidden/intermediate/layers/heads/kv heads/vocab/context/head_dim */
ie_status_t msrc_hf_dims(const cJSON *cfg, int default_ctx, ie_hparams_t *hp);
/* HF tensor `name` (HF shape order) or NULL if absent and not required;
 * want_u8: a U8 tensor, else F32/F16/BF16 */
ie_status_t msrc_hf_raw(const ie_model_src_t *s, const char *name, int required, int ndim, const int64_t *shape,
                        int want_u8, const src_tensor_t **out);
size_t msrc_float_size(ie_dtype_t t);
/* Layer l's SwiGLU experts stacked as the GGUF holds them,
 * blk.l.ffn_{gate,up,down}_exps.weight (ne = [in, out, n_expert], hp's
 * n_embd, n_ff, n_expert), converted copies in the HF dtype: from
 * transformers 5's fused "model.layers.l.<fused_prefix>.gate_up_proj"
 * [E][2I][H] (gate rows first) and ".down_proj" [E][H][I] when present,
 * else from one tensor per expert "model.layers.l.<prefix>.<e>.<proj[p]>"
 * for gate, up, down (HF [out][in]). Errors name the missing or misshapen
 * HF tensor, or an expert whose dtype differs from expert 0's. Needs three
 * free table entries. */
ie_status_t msrc_hf_stack_experts(ie_model_src_t *s, int l, const char *prefix, const char *const proj[3],
                                  const char *fused_prefix);

/* YaRN attention factor when the file gives none (transformers get_mscale) */
float msrc_yarn_mscale(float factor);

#endif

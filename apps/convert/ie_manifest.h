/* ie_manifest.h — the quantization manifest of `ie-convert` (docs/CONVERT.md).
 *
 * A manifest is a JSON object
 *   {"version": 1,
 *    "rules": [{"pattern": REGEX, "dtype": D, "group": 32|64|...|"row",
 *               "zero": Z, "scale": S, "method": "absmax"|"mse",
 *               "block": [br, bc], "threshold": T,
 *               "fallback": "keep"|"f32"|"f16"|"bf16"|"int8w"|GGML|"auto",
 *               "comment": "..."}, ...],
 *    "gate": {"min_layer_cosine": C, "max_kl": K, "max_ppl_increase_pct": P},
 *    "comment": "..."}
 * with D one of int8w, int4w, bf16, f16, f32, mxfp4, keep, bsr, or a ggml
 * block type GGML (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_K, q3_K, q4_K,
 * q5_K, q6_K, iq4_xs; the K may be spelled k) that this build can quantize
 * (ie_quantize_row). Z and S take the engine's words (zero symmetric /
 * affine, scale absmax / mse) and the seed README's (zero per-tensor / none
 * -> symmetric, asymmetric / per-group / per-channel / per-row -> affine;
 * scale per-channel / per-row -> one scale per row, or per group of "group"
 * within each row when "group" is given; per-group -> per "group" (32);
 * per-tensor is refused); docs/CONVERT.md lists every spelling. Patterns
 * are PCRE2 regular expressions searched in the canonical tensor name
 * (anchor them with ^...$). The first rule whose pattern matches decides;
 * tensors no rule matches and 1-D tensors (norms, biases, sinks; any tensor
 * with ne[1] == 1) are kept as stored. Unknown keys, wrong JSON types, bad
 * regexes, unknown dtypes and groups that are not positive multiples of 32
 * are errors naming the rule and key (IE_ERR_FORMAT).
 *
 * ie_manifest_decide() turns a rule and a tensor into a decision, checking
 * the shape: a group that does not divide the tensor's row length (or a row
 * length mxfp4 cannot block) is an IE_ERR_FORMAT naming rule and tensor,
 * unless the rule has a "fallback", which then applies to that tensor
 * ("int8w" as a fallback means one scale per row, group "row"; "auto", for
 * a ggml target, is llama-quantize's substitute: q2_K, q3_K -> q4_0,
 * iq4_xs -> iq4_nl, q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, and f16 where
 * even that does not fit).
 */
#ifndef IE_MANIFEST_H
#define IE_MANIFEST_H

#include "ie_dtype.h"
#include "ie_pack.h"
#include "ie_status.h"

#include <stddef.h>
#include <stdint.h>

/* What a rule converts matched tensors to. */
typedef enum ie_qtarget {
    IE_QT_KEEP = 0, /* bytes as stored                              */
    IE_QT_F32,
    IE_QT_F16,
    IE_QT_BF16,
    IE_QT_INT8W, /* IE_DTYPE_I8W                                 */
    IE_QT_INT4W, /* IE_DTYPE_I4W (symmetric) or I4WA (affine)    */
    IE_QT_MXFP4,
    IE_QT_BSR,       /* block-sparse f32 (ie_bsr.h)                  */
    IE_QT_INT8W_ROW, /* fallback only: int8w with one scale per row  */
    IE_QT_GGML,      /* a ggml block type (rule's gtype): q4_K, ...  */
    IE_QT_AUTO       /* fallback only: llama-quantize's substitute   */
} ie_qtarget_t;

/* "keep", "f32", ..., "int8w-row", "ggml", "auto". */
const char *ie_qtarget_name(ie_qtarget_t t);

#define IE_GROUP_ROW 0 /* "group": "row" — one scale per row (G = n_in) */

typedef struct ie_manifest_rule {
    char *pattern; /* as written                                */
    void *re;      /* compiled pcre2_code                       */
    ie_qtarget_t target;
    int group;  /* int types: G, or IE_GROUP_ROW             */
    int affine; /* int4w: 1 affine (zero point), 0 symmetric */
    ie_qscale_t scale;
    int br, bc;       /* bsr block (default 16 x 16)               */
    float threshold;  /* bsr: drop blocks with max|w| <= threshold */
    ie_dtype_t gtype; /* IE_QT_GGML: the block type                */
    int has_fallback;
    ie_qtarget_t fallback; /* KEEP/F32/F16/BF16/INT8W_ROW/GGML/AUTO     */
    ie_dtype_t fb_gtype;   /* fallback IE_QT_GGML: its block type        */
} ie_manifest_rule_t;

typedef struct ie_manifest_gate {
    int has_min_layer_cosine, has_max_kl, has_max_ppl_increase_pct;
    double min_layer_cosine;     /* every layer's mean cosine >= this  */
    double max_kl;               /* mean KL(ref || quant) <= this      */
    double max_ppl_increase_pct; /* 100 (ppl_q / ppl_ref - 1) <= this  */
} ie_manifest_gate_t;

typedef struct ie_manifest {
    int version;
    ie_manifest_rule_t *rules;
    size_t n_rules;
    ie_manifest_gate_t gate;
    char *json; /* the manifest text, normalized (cJSON print) */
} ie_manifest_t;

/* Parse a manifest from JSON text (len bytes, need not be NUL-terminated).
 * `what` names it in error messages (a path). Caller owns *out
 * (ie_manifest_destroy). Errors: IE_ERR_FORMAT (bad JSON, schema, regex),
 * IE_ERR_NOMEM. */
ie_status_t ie_manifest_parse(const char *text, size_t len, const char *what, ie_manifest_t **out);

/* Read and parse the file at path. IE_ERR_IO if it cannot be read. */
ie_status_t ie_manifest_load(const char *path, ie_manifest_t **out);

void ie_manifest_destroy(ie_manifest_t **self_p);

/* Index of the first rule whose pattern matches `name`, or -1. */
int ie_manifest_match(const ie_manifest_t *m, const char *name);

/* How --pretranspose selects the int8w/int4w matrices stored PANEL16. */
typedef enum ie_pretranspose {
    IE_PT_NONE = 0, /* no matrix: everything ROWS, packed at load          */
    IE_PT_WOH = 1,  /* attn_output ("W_o") and the output head             */
    IE_PT_WXH = 2,  /* every other per-layer projection (q/k/v, ffn, experts, router) */
    IE_PT_ALL = 3   /* every matrix                                        */
} ie_pretranspose_t;

/* "none" | "woh" | "wxh" | "all"; IE_ERR_INVAL otherwise. */
ie_status_t ie_pretranspose_parse(const char *s, ie_pretranspose_t *out);
const char *ie_pretranspose_name(ie_pretranspose_t p);

/* 1 if a 2-D/3-D int matrix called `name` is stored PANEL16 under mode p.
 * token_embd.weight is looked up row by row and is never packed, unless
 * `tied` (it is also the output head), then it counts as the head. */
int ie_pretranspose_selects(ie_pretranspose_t p, const char *name, int tied);

/* The decision for one tensor. */
typedef struct ie_qdecision {
    int rule;            /* matching rule index, -1: none             */
    ie_qtarget_t target; /* after any fallback                        */
    int fell_back;       /* 1: the rule's fallback applied            */
    ie_dtype_t dtype;    /* output dtype (src dtype for KEEP)         */
    ie_layout_t layout;  /* output layout                             */
    int group;           /* output group (I-types), else 0            */
    ie_qscale_t scale;
    int lossless; /* 1: a byte copy or a lossless repack       */
    int br, bc;   /* BSR                                       */
    float threshold;
} ie_qdecision_t;

/* llama-quantize's substitute for ggml type t when a row is not whole
 * blocks of it (as its logs under models/kquant show: "ncols 576 not
 * divisible by 256 ... falling back to"): q2_K, q3_K -> q4_0; iq4_xs ->
 * iq4_nl; q4_K -> q5_0; q5_K -> q5_1; q6_K -> q8_0; IE_DTYPE_INVALID for
 * any other type (then f16). */
ie_dtype_t ie_manifest_auto_fallback(ie_dtype_t t);

/* Decide what tensor `name` (dtype src_dtype, layout src_layout, src_group,
 * n_dims, ne) becomes. 1-D tensors and unmatched ones: KEEP. Int targets
 * get PANEL16 when ie_pretranspose_selects() says so, else ROWS; so do
 * ggml targets this build packs (ie_pack_check with group = block size),
 * the others ROWS. A ggml target is lossless from the same type. Shape
 * errors (group not dividing ne[0], mxfp4 row not a multiple of 32, BSR
 * block not dividing, BSR on a 3-D tensor) are IE_ERR_FORMAT naming the
 * rule and the tensor, unless the rule's fallback applies. */
ie_status_t ie_manifest_decide(const ie_manifest_t *m, ie_pretranspose_t pt, int tied, const char *name,
                               ie_dtype_t src_dtype, ie_layout_t src_layout, int src_group, int n_dims,
                               const int64_t ne[4], ie_qdecision_t *out);

#endif

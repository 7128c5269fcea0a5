/* ie_convert.h — `ie-convert`: GGUF / HF / IEBIN model -> IEBIN model with
 * per-tensor quantization chosen by a manifest (ie_manifest.h), optionally
 * gated by a calibration run (docs/CONVERT.md).
 */
#ifndef IE_CONVERT_H
#define IE_CONVERT_H

#include "ie_manifest.h"
#include "ie_model_src.h"
#include "ie_status.h"

#include <stdint.h>
#include <stdio.h>

/* Exit codes of ie-convert: those of inference-engine (ie_cli.h: 0 ok,
 * 1 runtime, 2 usage / bad input incl. a bad manifest, 3 model missing or
 * invalid, 6 out of memory) plus: */
enum { IE_EXIT_GATE = 4 /* calibration gate failed, model not written */ };

/* The command line: `ie-convert --in SRC --out-dir DIR [options]` (argv[0]
 * is the program). Prints one JSON line on stdout on success, progress and
 * the calibration report on stderr, errors as one "error: ..." line.
 * Returns the process exit code. */
int ie_convert_main(int argc, char **argv);

/* ------------------------------------------------------------ calibration */

typedef struct ie_calib_opts {
    int n_threads; /* worker threads (>= 1)                       */
    int chunk;     /* positions per chunk (<= 128 by default)     */
    int add_bos;   /* 1: the first token of each chunk becomes bos */
    int32_t bos;
} ie_calib_opts_t;

typedef struct ie_calib_report {
    int n_layer;
    double *layer_cos;     /* [n_layer] mean over tokens of cos(ref, quant)
                               of the residual stream after layer l        */
    double *layer_cos_min; /* [n_layer] smallest over tokens              */
    double kl_mean;        /* mean over tokens of KL(ref || quant), nats  */
    double kl_max;
    double ppl_ref, ppl_quant;
    double ppl_delta_pct; /* 100 (ppl_quant / ppl_ref - 1)                */
    double top1_agree;    /* fraction of tokens whose argmax agrees      */
    size_t n_tokens;      /* positions evaluated                          */
    size_t n_scored;      /* positions with a next token (ppl)            */
    size_t n_chunks;
    int chunk;
    /* gate outcome (ie_calib_gate) */
    int worst_layer; /* argmin of layer_cos                          */
    int fail_cos, fail_kl, fail_ppl;
    int pass;
} ie_calib_report_t;

/* Run ids[0..n) in chunks of o->chunk positions (fresh KV per chunk)
 * through a reference worker on `ref` (precision f32) and then a worker on
 * `quant` (native precision), one worker alive at a time, and fill *r
 * (caller clears it with ie_calib_report_clear). Needs n >= 2. */
ie_status_t ie_calib_run(const ie_model_src_t *ref, const ie_model_src_t *quant, const int32_t *ids, size_t n,
                         const ie_calib_opts_t *o, ie_calib_report_t *r);

/* Check r against gate; sets r->fail_* and r->pass (1 when every threshold
 * given is met; no thresholds: pass). */
void ie_calib_gate(ie_calib_report_t *r, const ie_manifest_gate_t *gate);

/* The report table (per-layer cosine, KL, perplexities, thresholds,
 * PASS/FAIL) as text. */
void ie_calib_report_print(FILE *f, const ie_calib_report_t *r, const ie_manifest_gate_t *gate);

/* The report as a JSON object text (malloc'd; NULL on out of memory). */
char *ie_calib_report_json(const ie_calib_report_t *r, const ie_manifest_gate_t *gate);

void ie_calib_report_clear(ie_calib_report_t *r);

#endif

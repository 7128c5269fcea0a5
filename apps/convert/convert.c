/* convert.c — `ie-convert` (ie_convert.h, docs/CONVERT.md).
 *
 *   1. open the source (GGUF, HF directory or IEBIN) and the manifest
 *      (--q4-map, else the architecture's default under configs/);
 *   2. plan: decide every tensor (ie_manifest_decide) before converting
 *      anything, so a manifest that does not fit the model fails at once;
 *   3. convert tensor by tensor on the thread pool: a byte copy or a
 *      lossless repack (Q8_0/Q4_0/Q4_1 -> int8w/int4w g32) where possible,
 *      else dequantize rows to floats and quantize to the target;
 *   4. with --calib: an in-memory source of the converted tensors runs the
 *      calibration text against the source at f32 (calib.c); a missed
 *      threshold stops here (exit 4) unless --force;
 *   5. write IEBIN (ie_iebin_writer_*): tensors in source order, each with
 *      its "quant" record, the tokenizer, and the "conversion" record.
 * Without --calib, tensors are written as they are converted and freed, so
 * memory stays about one tensor; with --calib every converted tensor is kept
 * until the gate has passed.
 */
#include "ie_cli.h"
#include "ie_clock.h"
#include "ie_mmap.h"
#include "ie_convert.h"
#include "ie_iebin.h"
#include "ie_threadpool.h"
#include "ie_tokenizer.h"

#include "ie_bsr.h"
#include "ie_kernels.h"
#include "ie_pack.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------- helpers */

static const char *kind_name(ie_src_kind_t k)
{
    switch (k) {
    case IE_SRC_GGUF: return "gguf";
    case IE_SRC_HF_DIR: return "hf";
    case IE_SRC_IEBIN: return "iebin";
    case IE_SRC_MEM: return "mem";
    }
    return "?";
}

static const char *scheme_name(ie_dtype_t t)
{
    switch (t) {
    case IE_DTYPE_I8W: return "int8w";
    case IE_DTYPE_I4W:
    case IE_DTYPE_I4WA: return "int4w";
    default: return ie_dtype_name(t);
    }
}

/* A canonical (GGUF) tensor name: blk.N.* or a top-level llama.cpp name
 * (rope_freqs_long.weight: Phi-3's long RoPE set, model_phi3.c). */
static int is_canonical(const char *name)
{
    return !strncmp(name, "blk.", 4) || !strcmp(name, "token_embd.weight") || !strcmp(name, "output.weight") ||
           !strcmp(name, "output_norm.weight") || !strcmp(name, "rope_freqs.weight") ||
           !strcmp(name, "rope_freqs_long.weight");
}

static void *alloc64(size_t bytes)
{
    size_t n = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, n ? n : 64);
}

/* Matrices of a tensor: n_in = ne[0], n_out = ne[1], slices = ne[2]*ne[3]. */
static int64_t n_slices(const ie_tensor_t *t)
{
    int64_t s = 1;
    for (int i = 2; i < t->n_dims && i < 4; i++) s *= t->ne[i];
    return s;
}

/* Bytes of one n_out x n_in matrix of t's dtype/layout/group (0: unknown). */
static size_t slice_bytes(ie_dtype_t dt, ie_layout_t lay, int group, int64_t n_in, int64_t n_out)
{
    return ie_tensor_bytes(dt, lay, group, n_in, n_out);
}

/* Row r of a source matrix (slice) as floats. */
static void src_row(const ie_tensor_t *t, const void *slice, int64_t n_in, int64_t n_out, int64_t r, float *dst)
{
    if (t->layout == IE_LAYOUT_PANEL16) {
        ie_pmat_t m = {t->dtype, t->group, n_in, n_out, slice};
        ie_pack_dequant_row(&m, r, dst);
    } else if (ie_dtype_is_intw(t->dtype)) {
        size_t rb = ie_qrow_bytes(t->dtype, t->group, n_in);
        ie_qrow_dequantize(t->dtype, t->group, (const char *)slice + (size_t)r * rb, dst, n_in);
    } else {
        size_t rb = ie_dtype_row_bytes(t->dtype, n_in);
        ie_dequantize_row(t->dtype, (const char *)slice + (size_t)r * rb, dst, n_in);
    }
}

/* --------------------------------------------------- per-tensor conversion */

typedef struct conv_item {
    const ie_tensor_t *src;
    ie_qdecision_t d;
    ie_tensor_t out;  /* what is written: data = buf or the source's bytes */
    void *buf;        /* owned converted bytes, NULL when borrowed          */
    char *quant_json; /* "quant" record, NULL for untouched tensors         */
} conv_item_t;

enum { OP_DEQUANT, OP_PACK, OP_QROWS, OP_ROWS, OP_REPACK };

/* One parallel pass over the rows (or 16-row panels) of one matrix. */
typedef struct job {
    int op;
    const ie_tensor_t *src;
    const void *src_slice;
    int64_t n_in, n_out;
    float *f;  /* n_out x n_in floats                       */
    void *dst; /* the output slice                          */
    const ie_qdecision_t *d;
    ie_dtype_t rp_dtype; /* OP_REPACK: the ROWS bytes' type ...      */
    int rp_group;        /* ... and group (a k-quant's: block size)  */
    atomic_int err;      /* 1: a kernel refused, 2: non-finite input  */
} job_t;

static void job_run(void *ctx, int ith, int nth)
{
    job_t *j = ctx;
    const ie_qdecision_t *d = j->d;
    long b, e;
    if (j->op == OP_PACK || j->op == OP_REPACK) {
        long n_panels = (long)((j->n_out + IE_PANEL - 1) / IE_PANEL);
        ie_split_range(n_panels, ith, nth, &b, &e);
        if (b >= e) return;
        int64_t r0 = (int64_t)b * IE_PANEL, r1 = (int64_t)e * IE_PANEL;
        if (r1 > j->n_out) r1 = j->n_out;
        int rc = j->op == OP_PACK
                     ? ie_pack_quantize(d->dtype, d->group, d->scale, j->f, j->n_in, r0, r1, j->n_out, j->dst)
                     : ie_pack_repack(j->rp_dtype, j->rp_group, j->src_slice, j->n_in, r0, r1, j->n_out, j->dst);
        if (rc != 0) atomic_store(&j->err, 1);
        return;
    }
    ie_split_range((long)j->n_out, ith, nth, &b, &e);
    for (long r = b; r < e; r++) {
        float *row = j->f + (size_t)r * j->n_in;
        if (j->op == OP_DEQUANT) {
            src_row(j->src, j->src_slice, j->n_in, j->n_out, r, row);
            for (int64_t k = 0; k < j->n_in; k++)
                if (!isfinite(row[k])) {
                    atomic_store(&j->err, 2);
                    return;
                }
        } else if (j->op == OP_QROWS) {
            size_t rb = ie_qrow_bytes(d->dtype, d->group, j->n_in);
            if (ie_qrow_quantize(d->dtype, d->group, d->scale, row, j->n_in, (char *)j->dst + (size_t)r * rb) != 0)
                atomic_store(&j->err, 1);
        } else { /* OP_ROWS: ggml float/block types */
            size_t rb = ie_dtype_row_bytes(d->dtype, j->n_in);
            if (ie_quantize_row(d->dtype, row, (char *)j->dst + (size_t)r * rb, j->n_in) != 0)
                atomic_store(&j->err, 1);
        }
    }
}

static ie_status_t run_job(ie_threadpool_t *tp, job_t *j, const char *name)
{
    atomic_store(&j->err, 0);
    ie_threadpool_run(tp, job_run, j);
    int err = atomic_load(&j->err);
    if (err == 2) return ie_error_set(IE_ERR_FORMAT, "tensor %s holds a non-finite value (NaN or inf)", name);
    if (err)
        return ie_error_set(IE_ERR_INTERNAL, "tensor %s: the %s quantizer refused the shape", name,
                            ie_dtype_name(j->d->dtype));
    return IE_OK;
}

/* The "quant" record of a converted tensor (malloc'd), NULL if untouched. */
static char *quant_json(const conv_item_t *it, const ie_manifest_t *m, size_t bsr_blocks)
{
    const ie_qdecision_t *d = &it->d;
    if (d->rule < 0) return NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "scheme", d->target == IE_QT_KEEP ? "keep" : scheme_name(d->dtype));
    if (ie_dtype_is_intw(d->dtype) && d->target != IE_QT_KEEP) {
        if (d->group == it->src->ne[0]) cJSON_AddStringToObject(o, "group", "row");
        cJSON_AddNumberToObject(o, d->group == it->src->ne[0] ? "group_size" : "group", d->group);
        cJSON_AddStringToObject(o, "zero", d->dtype == IE_DTYPE_I4WA ? "affine" : "symmetric");
        cJSON_AddStringToObject(o, "scale", d->lossless ? "source" : d->scale == IE_QSCALE_MSE ? "mse" : "absmax");
    }
    if (d->target == IE_QT_BSR) {
        cJSON *blk = cJSON_AddArrayToObject(o, "block");
        if (blk) {
            cJSON_AddItemToArray(blk, cJSON_CreateNumber(d->br));
            cJSON_AddItemToArray(blk, cJSON_CreateNumber(d->bc));
        }
        cJSON_AddNumberToObject(o, "threshold", d->threshold);
        int64_t total = (it->src->ne[1] / d->br) * (it->src->ne[0] / d->bc);
        cJSON_AddNumberToObject(o, "density", total ? (double)bsr_blocks / (double)total : 0.0);
    }
    cJSON_AddStringToObject(o, "from", ie_dtype_name(it->src->dtype));
    cJSON_AddBoolToObject(o, "lossless", d->lossless);
    cJSON_AddNumberToObject(o, "rule", d->rule);
    if (d->fell_back) cJSON_AddBoolToObject(o, "fallback", 1);
    (void)m;
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* Convert one tensor per its decision into it->out (+ it->buf). */
static ie_status_t convert_one(ie_threadpool_t *tp, const ie_manifest_t *m, conv_item_t *it)
{
    const ie_tensor_t *t = it->src;
    const ie_qdecision_t *d = &it->d;
    ie_status_t st = IE_OK;
    float *f = NULL;
    void *rows = NULL; /* a packed ggml target's rows before the repack */
    size_t bsr_blocks = 0;

    it->out = *t;
    it->out.dtype = d->dtype;
    it->out.layout = d->layout;
    it->out.group = ie_dtype_is_intw(d->dtype) || d->layout == IE_LAYOUT_PANEL16 ? d->group
                                                                                 : 0; /* packed k-quant: QK */
    if (d->target == IE_QT_KEEP) {
        it->out.group = t->group;
        it->quant_json = quant_json(it, m, 0);
        return d->rule >= 0 && !it->quant_json ? ie_error_set(IE_ERR_NOMEM, "out of memory") : IE_OK;
    }

    int64_t n_in = t->ne[0], n_out = t->ne[1], ns = n_slices(t);
    if (t->layout == IE_LAYOUT_BSR)
        return ie_error_set(IE_ERR_UNSUPPORTED, "tensor %s is block-sparse; only \"keep\" applies to it", t->name);
    size_t sb_in = slice_bytes(t->dtype, t->layout, t->group, n_in, n_out);
    if (sb_in == 0 || t->nbytes != sb_in * (uint64_t)ns)
        return ie_error_set(IE_ERR_FORMAT, "tensor %s: %llu bytes do not match its %s shape", t->name,
                            (unsigned long long)t->nbytes, ie_dtype_name(t->dtype));

    if (d->target == IE_QT_BSR) {
        /* 2-D only (checked by the decision) */
        if (!(f = malloc((size_t)n_in * n_out * sizeof(float))))
            return ie_error_set(IE_ERR_NOMEM, "out of memory converting %s", t->name);
        job_t j = {.op = OP_DEQUANT, .src = t, .src_slice = t->data, .n_in = n_in, .n_out = n_out, .f = f, .d = d};
        if ((st = run_job(tp, &j, t->name)) != IE_OK) goto done;
        void *blob = NULL;
        size_t bytes = 0;
        if (ie_bsr_from_dense(f, n_in, n_out, d->br, d->bc, d->threshold, &blob, &bytes) != 0) {
            st = ie_error_set(IE_ERR_NOMEM, "tensor %s: block-sparse conversion failed", t->name);
            goto done;
        }
        it->buf = blob;
        it->out.data = blob;
        it->out.nbytes = bytes;
        ie_bsr_t view;
        if (ie_bsr_view(blob, bytes, n_in, n_out, &view, NULL, 0) == 0) bsr_blocks = (size_t)view.n_blocks;
        goto record;
    }

    size_t sb_out = slice_bytes(d->dtype, d->layout, d->group, n_in, n_out);
    if (sb_out == 0)
        return ie_error_set(IE_ERR_INTERNAL, "tensor %s: no %s/%s layout for this shape", t->name,
                            ie_dtype_name(d->dtype), ie_layout_name(d->layout));
    if (!(it->buf = alloc64(sb_out * (size_t)ns)))
        return ie_error_set(IE_ERR_NOMEM, "out of memory converting %s (%zu bytes)", t->name, sb_out * (size_t)ns);
    it->out.data = it->buf;
    it->out.nbytes = sb_out * (uint64_t)ns;

    /* same bytes: a copy (ROWS g32 int types are byte-identical to Q8_0 /
     * Q4_0 / Q4_1; same dtype and layout) */
    if (d->lossless && (d->layout == t->layout && sb_out == sb_in)) {
        memcpy(it->buf, t->data, sb_out * (size_t)ns);
        goto record;
    }
    /* a ggml source's group is 0 in ROWS: its repack group is its block */
    int src_rp_group = ie_dtype_is_intw(t->dtype) ? (t->group ? t->group : 32) : ie_dtype_block_elems(t->dtype);
    if (d->lossless && d->layout == IE_LAYOUT_PANEL16 && t->layout == IE_LAYOUT_ROWS) {
        for (int64_t s = 0; s < ns; s++) {
            job_t j = {.op = OP_REPACK,
                       .src = t,
                       .src_slice = (const char *)t->data + (size_t)s * sb_in,
                       .n_in = n_in,
                       .n_out = n_out,
                       .dst = (char *)it->buf + (size_t)s * sb_out,
                       .d = d,
                       .rp_dtype = t->dtype,
                       .rp_group = src_rp_group};
            if ((st = run_job(tp, &j, t->name)) != IE_OK) goto done;
        }
        goto record;
    }

    /* through floats, one matrix at a time. A packed ggml target (a
     * k-quant) is quantized into ggml rows first, then repacked: the
     * quantizer is ggml's row quantizer, the repack lossless. */
    int ggml_packed = !ie_dtype_is_intw(d->dtype) && d->layout == IE_LAYOUT_PANEL16;
    size_t sb_rows = ggml_packed ? slice_bytes(d->dtype, IE_LAYOUT_ROWS, 0, n_in, n_out) : 0;
    if (!(f = malloc((size_t)n_in * n_out * sizeof(float))) || (ggml_packed && !(rows = alloc64(sb_rows)))) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory converting %s", t->name);
        goto done;
    }
    for (int64_t s = 0; s < ns; s++) {
        job_t j = {.op = OP_DEQUANT,
                   .src = t,
                   .src_slice = (const char *)t->data + (size_t)s * sb_in,
                   .n_in = n_in,
                   .n_out = n_out,
                   .f = f,
                   .dst = ggml_packed ? rows : (char *)it->buf + (size_t)s * sb_out,
                   .d = d};
        if ((st = run_job(tp, &j, t->name)) != IE_OK) goto done;
        j.op = ie_dtype_is_intw(d->dtype) ? (d->layout == IE_LAYOUT_PANEL16 ? OP_PACK : OP_QROWS) : OP_ROWS;
        if ((st = run_job(tp, &j, t->name)) != IE_OK) goto done;
        if (ggml_packed) {
            j.op = OP_REPACK;
            j.src_slice = rows;
            j.dst = (char *)it->buf + (size_t)s * sb_out;
            j.rp_dtype = d->dtype;
            j.rp_group = d->group;
            if ((st = run_job(tp, &j, t->name)) != IE_OK) goto done;
        }
    }

record:
    it->quant_json = quant_json(it, m, bsr_blocks);
    if (!it->quant_json) st = ie_error_set(IE_ERR_NOMEM, "out of memory");
done:
    free(f);
    free(rows);
    return st;
}

static void item_release(conv_item_t *it)
{
    free(it->buf);
    it->buf = NULL;
    cJSON_free(it->quant_json);
    it->quant_json = NULL;
}

/* ----------------------------------------------------------- progress bar */

typedef struct progress {
    int on;
    uint64_t total, done;
    double t0;
} progress_t;

static void progress_show(progress_t *p, const char *name)
{
    if (!p->on) return;
    const int W = 30;
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    int fill = (int)(frac * W + 0.5);
    char bar[64];
    for (int i = 0; i < W; i++) bar[i] = i < fill ? '#' : '.';
    bar[W] = '\0';
    fprintf(stderr, "\r[%s] %5.1f%% %6.1fs  %-40.40s", bar, 100.0 * frac, ie_now_s() - p->t0, name ? name : "");
    if (!name) fputc('\n', stderr);
    fflush(stderr);
}

/* --------------------------------------------------------- configuration */

static int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Path of default manifest `name`: $IE_CONFIG_DIR/name if IE_CONFIG_DIR is
 * set; else <exe dir>/../configs, <exe dir>/configs, then the source
 * tree's configs/ (from this file's compile-time path). */
static int find_config(const char *name, char *out, size_t cap)
{
    const char *env = getenv("IE_CONFIG_DIR");
    if (env && *env) {
        snprintf(out, cap, "%s/%s", env, name);
        return file_exists(out) ? 0 : -1;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *dir = dirname(exe);
        snprintf(out, cap, "%s/../configs/%s", dir, name);
        if (file_exists(out)) return 0;
        snprintf(out, cap, "%s/configs/%s", dir, name);
        if (file_exists(out)) return 0;
    }
    char src[PATH_MAX];
    snprintf(src, sizeof src, "%s", __FILE__); /* .../apps/convert/convert.c */
    char *d1 = dirname(src);                   /* .../apps/convert */
    snprintf(out, cap, "%s/../../configs/%s", d1, name);
    return file_exists(out) ? 0 : -1;
}


static void usage(FILE *f)
{
    fputs("usage: ie-convert --in SRC --out-dir DIR [options]\n"
          "  --in SRC, --hf-dir DIR       GGUF file, Hugging Face directory or IEBIN directory\n"
          "  --out-dir DIR                where model.ie.json / model.ie.bin / tokenizer go\n"
          "  --q4-map MANIFEST            quantization manifest (default: configs/quant-<arch>.json)\n"
          "  --pretranspose MODE          none|woh|wxh|all: int/k-quant matrices stored PANEL16 (all)\n"
          "  --calib TEXTFILE             run the calibration gate on this text\n"
          "  --calib-tokens N             tokens of it to use (512)\n"
          "  --threads N                  threads (online CPUs)\n"
          "  --force                      write even if the calibration gate fails\n"
          "  --quiet                      no progress bar, no report unless the gate fails\n"
          "exit: 0 ok, 1 runtime, 2 usage/bad manifest/bad calibration text, 3 model invalid,\n"
          "      4 calibration gate failed (model not written), 6 out of memory (docs/CONVERT.md)\n",
          f);
}

static int exit_for(ie_status_t st)
{
    switch (st) {
    case IE_ERR_NOMEM: return IE_EXIT_NOMEM;
    case IE_ERR_INVAL: return IE_EXIT_USAGE;
    case IE_ERR_IO:
    case IE_ERR_FORMAT:
    case IE_ERR_UNSUPPORTED: return IE_EXIT_MODEL;
    default: return IE_EXIT_RUNTIME;
    }
}

/* The "conversion" record (malloc'd JSON text). */
static char *conversion_json(const char *in, const ie_model_src_t *src, const char *manifest_path, int is_default,
                             const ie_manifest_t *m, ie_pretranspose_t pt, const conv_item_t *items, int64_t n,
                             const char *calib_path, const char *calib_json, const char *gate_result)
{
    cJSON *o = cJSON_CreateObject(), *s, *mf, *ts, *cal;
    char *out = NULL;
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "tool", "ie-convert");
    if (!(s = cJSON_AddObjectToObject(o, "source"))) goto done;
    cJSON_AddStringToObject(s, "path", in);
    cJSON_AddStringToObject(s, "kind", kind_name(ie_model_src_kind(src)));
    cJSON_AddStringToObject(s, "arch", ie_model_src_hparams(src)->arch);
    cJSON_AddStringToObject(s, "name", ie_model_src_hparams(src)->name);
    if (!(mf = cJSON_AddObjectToObject(o, "manifest"))) goto done;
    cJSON_AddStringToObject(mf, "path", manifest_path);
    cJSON_AddBoolToObject(mf, "default", is_default);
    cJSON *content = cJSON_Parse(m->json);
    if (content) cJSON_AddItemToObject(mf, "content", content);
    cJSON_AddStringToObject(o, "pretranspose", ie_pretranspose_name(pt));
    if (!(ts = cJSON_AddArrayToObject(o, "tensors"))) goto done;
    for (int64_t i = 0; i < n; i++) {
        const conv_item_t *it = &items[i];
        cJSON *e = cJSON_CreateObject();
        if (!e) goto done;
        cJSON_AddItemToArray(ts, e);
        cJSON_AddStringToObject(e, "name", it->src->name);
        cJSON_AddStringToObject(e, "from", ie_dtype_name(it->src->dtype));
        cJSON_AddStringToObject(e, "to",
                                it->d.target == IE_QT_KEEP ? ie_dtype_name(it->src->dtype)
                                                           : ie_dtype_name(it->d.dtype));
        cJSON_AddStringToObject(e, "layout", ie_layout_name(it->d.layout));
        if (ie_dtype_is_intw(it->d.dtype)) cJSON_AddNumberToObject(e, "group", it->d.group);
        cJSON_AddNumberToObject(e, "rule", it->d.rule);
        cJSON_AddStringToObject(e, "action",
                                it->d.target == IE_QT_KEEP ? "keep"
                                : it->d.lossless           ? "lossless"
                                                           : "quantize");
        if (it->d.fell_back) cJSON_AddBoolToObject(e, "fallback", 1);
    }
    if (calib_json && (cal = cJSON_Parse(calib_json))) {
        cJSON_AddStringToObject(cal, "text", calib_path);
        cJSON_AddItemToObject(o, "calibration", cal);
    } else {
        cJSON_AddNullToObject(o, "calibration");
    }
    cJSON_AddStringToObject(o, "gate", gate_result);
    out = cJSON_PrintUnformatted(o);
done:
    cJSON_Delete(o);
    return out;
}

/* ---------------------------------------------------------------- main */

int ie_convert_main(int argc, char **argv)
{
    static const struct option lo[] = {{"in", required_argument, 0, 'i'},
                                       {"hf-dir", required_argument, 0, 'i'},
                                       {"out-dir", required_argument, 0, 'o'},
                                       {"q4-map", required_argument, 0, 'm'},
                                       {"pretranspose", required_argument, 0, 'P'},
                                       {"calib", required_argument, 0, 'c'},
                                       {"calib-tokens", required_argument, 0, 'n'},
                                       {"force", no_argument, 0, 'f'},
                                       {"quiet", no_argument, 0, 'q'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    const char *in = NULL, *out_dir = NULL, *manifest_arg = NULL, *calib_path = NULL;
    long calib_tokens = 512, threads = sysconf(_SC_NPROCESSORS_ONLN);
    int force = 0, quiet = 0, c, rc = IE_EXIT_OK;
    ie_pretranspose_t pt = IE_PT_ALL;
    ie_status_t st;

    ie_model_src_t *src = NULL, *mem = NULL;
    ie_manifest_t *man = NULL;
    ie_tokenizer_t *tok = NULL;
    ie_threadpool_t *tp = NULL;
    ie_iebin_writer_t *w = NULL;
    conv_item_t *items = NULL;
    int64_t n_t = 0;
    char *calib_text = NULL, *calib_json = NULL, *conv_json = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char manifest_path[PATH_MAX] = "";
    int is_default = 0, created_dir = 0;
    ie_calib_report_t rep;
    memset(&rep, 0, sizeof rep);
    const char *gate_result = "none";

    if (threads < 1) threads = 1;
    const ie_cli_pick_t picks[] = {IE_CLI_PICK(IE_FLAG_THREADS, &threads)};
    ie_cli_parser_t fl;
    ie_cli_parser_init(&fl, argc, argv, picks, IE_CLI_NPICKS(picks), lo);
    while ((c = ie_cli_next(&fl)) != -1) {
        int bad = 0;
        switch (c) {
        case IE_CLI_ENGINE: break;
        case IE_CLI_BAD: bad = 1; break;
        case 'i': in = optarg; break;
        case 'o': out_dir = optarg; break;
        case 'm': manifest_arg = optarg; break;
        case 'P': bad = ie_pretranspose_parse(optarg, &pt) != IE_OK; break;
        case 'c': calib_path = optarg; break;
        case 'n': bad = ie_cli_parse_long(optarg, 2, 1 << 24, &calib_tokens); break;
        case 'f': force = 1; break;
        case 'q': quiet = 1; break;
        case 'h': usage(stdout); return IE_EXIT_OK;
        default:
            return ie_cli_fail(IE_EXIT_USAGE, "unknown or incomplete option '%s' (see --help)", argv[optind - 1]);
        }
        if (bad)
            return ie_cli_fail(IE_EXIT_USAGE, "bad value '%s' for %s", optarg,
                               argv[optind - 2 >= 0 ? optind - 2 : 0]);
    }
    if (optind < argc) return ie_cli_fail(IE_EXIT_USAGE, "unexpected argument '%s' (see --help)", argv[optind]);
    if (!in || !out_dir)
        return ie_cli_fail(IE_EXIT_USAGE, "usage: ie-convert --in SRC --out-dir DIR [options] (see --help)");
    int show_progress = !quiet && isatty(STDERR_FILENO);

    /* ---- source, manifest, calibration text */
    if ((st = ie_model_src_open(in, &src)) != IE_OK) {
        rc = ie_cli_fail(ie_cli_exit_for_load(st), "%s", ie_error_last());
        goto cleanup;
    }
    const ie_hparams_t *hp = ie_model_src_hparams(src);
    if (manifest_arg) {
        snprintf(manifest_path, sizeof manifest_path, "%s", manifest_arg);
    } else {
        /* the architecture's own manifest, else the Llama one: the dense
         * Llama-shaped families (Qwen3, ...) share its tensor names */
        char name[64];
        snprintf(name, sizeof name, "quant-%s.json", hp->arch);
        if (find_config(name, manifest_path, sizeof manifest_path) != 0)
            snprintf(name, sizeof name, "quant-llama.json");
        if (find_config(name, manifest_path, sizeof manifest_path) != 0) {
            rc = ie_cli_fail(IE_EXIT_USAGE, "default manifest %s not found (set IE_CONFIG_DIR or pass --q4-map)",
                             name);
            goto cleanup;
        }
        is_default = 1;
    }
    if ((st = ie_manifest_load(manifest_path, &man)) != IE_OK) {
        rc = ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_USAGE, "%s", ie_error_last());
        goto cleanup;
    }
    if (calib_path) {
        size_t len = 0;
        if ((st = ie_file_read("calibration text", calib_path, IE_CLI_MAX_TEXT, &calib_text, &len)) != IE_OK) {
            rc = ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_USAGE, "%s", ie_error_last());
            goto cleanup;
        }
        if ((st = ie_tokenizer_load(ie_model_src_tokenizer_path(src), &tok)) != IE_OK) {
            rc = ie_cli_fail(ie_cli_exit_for_load(st), "%s", ie_error_last());
            goto cleanup;
        }
        if ((st = ie_tokenizer_encode(tok, calib_text, len, 0, &ids, &n_ids)) != IE_OK) {
            rc = ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_USAGE, "calibration text '%s': %s",
                             calib_path, ie_error_last());
            goto cleanup;
        }
        if (n_ids < 2) {
            rc = ie_cli_fail(IE_EXIT_USAGE, "calibration text '%s' has %zu tokens; at least 2 are needed",
                             calib_path, n_ids);
            goto cleanup;
        }
        if (n_ids > (size_t)calib_tokens) n_ids = (size_t)calib_tokens;
    }

    /* ---- plan */
    n_t = ie_model_src_n_tensors(src);
    if (n_t <= 0) {
        rc = ie_cli_fail(IE_EXIT_MODEL, "source '%s' has no tensors", in);
        goto cleanup;
    }
    if (!(items = calloc((size_t)n_t, sizeof *items))) {
        rc = ie_cli_fail(IE_EXIT_NOMEM, "out of memory");
        goto cleanup;
    }
    uint64_t total_bytes = 0;
    int64_t n_in_table = n_t;
    n_t = 0;
    for (int64_t i = 0; i < n_in_table; i++) {
        const ie_tensor_t *t = ie_model_src_tensor_at(src, i);
        /* HF sources also list tensors under their HF names: ones the engine
         * does not use, and GPT-OSS expert tensors whose converted copies
         * are listed under canonical names. Only canonical tensors go. */
        if (ie_model_src_kind(src) == IE_SRC_HF_DIR && !is_canonical(t->name)) continue;
        conv_item_t *it = &items[n_t++];
        it->src = t;
        if ((st = ie_manifest_decide(man, pt, hp->tied_embeddings, t->name, t->dtype, t->layout, t->group,
                                     t->n_dims, t->ne, &it->d)) != IE_OK) {
            rc = ie_cli_fail(IE_EXIT_USAGE, "%s", ie_error_last());
            goto cleanup;
        }
        total_bytes += t->nbytes;
    }
    if (!quiet)
        fprintf(stderr, "ie-convert: %s (%s, %s, %lld tensors) -> %s; manifest %s; pretranspose %s%s\n", in,
                kind_name(ie_model_src_kind(src)), hp->arch, (long long)n_t, out_dir, manifest_path,
                ie_pretranspose_name(pt), calib_path ? "; calibration gate on" : "");

    if ((st = ie_threadpool_new((int)threads, 0, &tp)) != IE_OK) {
        rc = ie_cli_fail(exit_for(st), "%s", ie_error_last());
        goto cleanup;
    }
    struct stat sb;
    created_dir = stat(out_dir, &sb) != 0;
    if (!calib_path && (st = ie_iebin_writer_open(out_dir, &w)) != IE_OK) {
        rc = ie_cli_fail(exit_for(st) == IE_EXIT_MODEL ? IE_EXIT_RUNTIME : exit_for(st), "%s", ie_error_last());
        goto cleanup;
    }

    /* ---- convert (and, without calibration, write as we go) */
    progress_t prog = {show_progress, total_bytes, 0, ie_now_s()};
    double t_start = ie_now_s();
    uint64_t bytes_out = 0;
    int n_converted = 0;
    for (int64_t i = 0; i < n_t; i++) {
        conv_item_t *it = &items[i];
        progress_show(&prog, it->src->name);
        if ((st = convert_one(tp, man, it)) != IE_OK) {
            if (show_progress) fputc('\n', stderr);
            rc = ie_cli_fail(exit_for(st), "%s", ie_error_last());
            goto cleanup;
        }
        n_converted += it->d.target != IE_QT_KEEP;
        bytes_out += it->out.nbytes;
        if (w) {
            if ((st = ie_iebin_writer_add(w, &it->out, it->quant_json)) != IE_OK) {
                if (show_progress) fputc('\n', stderr);
                rc = ie_cli_fail(exit_for(st) == IE_EXIT_MODEL ? IE_EXIT_RUNTIME : exit_for(st), "%s",
                                 ie_error_last());
                goto cleanup;
            }
            free(it->buf); /* quant_json stays for nothing; the record needs only the decision */
            it->buf = NULL;
            it->out.data = NULL;
        }
        prog.done += it->src->nbytes;
    }
    progress_show(&prog, NULL);
    ie_threadpool_destroy(&tp);

    /* ---- calibration gate */
    if (calib_path) {
        if ((st = ie_model_src_new_mem(hp, ie_model_src_tokenizer_path(src), &mem)) != IE_OK) {
            rc = ie_cli_fail(exit_for(st), "%s", ie_error_last());
            goto cleanup;
        }
        for (int64_t i = 0; i < n_t && st == IE_OK; i++) st = ie_model_src_mem_add(mem, &items[i].out, NULL);
        if (st == IE_OK) st = ie_model_src_mem_finish(mem);
        if (st != IE_OK) {
            rc = ie_cli_fail(exit_for(st) == IE_EXIT_MODEL ? IE_EXIT_RUNTIME : exit_for(st), "converted model: %s",
                             ie_error_last());
            goto cleanup;
        }
        ie_calib_opts_t co = {(int)threads, 128, ie_tokenizer_add_bos(tok), ie_tokenizer_bos(tok)};
        if (!quiet) fprintf(stderr, "calibrating on %zu tokens of %s ...\n", n_ids, calib_path);
        if ((st = ie_calib_run(src, mem, ids, n_ids, &co, &rep)) != IE_OK) {
            rc = ie_cli_fail(st == IE_ERR_NOMEM ? IE_EXIT_NOMEM : IE_EXIT_RUNTIME, "calibration: %s",
                             ie_error_last());
            goto cleanup;
        }
        ie_model_src_destroy(&mem);
        ie_calib_gate(&rep, &man->gate);
        if (!quiet || !rep.pass) ie_calib_report_print(stderr, &rep, &man->gate);
        if (!(calib_json = ie_calib_report_json(&rep, &man->gate))) {
            rc = ie_cli_fail(IE_EXIT_NOMEM, "out of memory");
            goto cleanup;
        }
        gate_result = rep.pass ? "pass" : "fail-forced";
        if (!rep.pass && !force) {
            char what[96] = "";
            if (rep.fail_cos) strcat(what, "min_layer_cosine");
            if (rep.fail_kl) strcat(strcat(what, what[0] ? ", " : ""), "max_kl");
            if (rep.fail_ppl) strcat(strcat(what, what[0] ? ", " : ""), "max_ppl_increase_pct");
            rc = ie_cli_fail(IE_EXIT_GATE,
                             "calibration gate failed (%s); model not written (--force writes it anyway)", what);
            goto cleanup;
        }
        if (!rep.pass) fprintf(stderr, "warning: calibration gate failed; writing the model anyway (--force)\n");
        /* write everything now */
        if ((st = ie_iebin_writer_open(out_dir, &w)) != IE_OK) {
            rc = ie_cli_fail(exit_for(st) == IE_EXIT_MODEL ? IE_EXIT_RUNTIME : exit_for(st), "%s", ie_error_last());
            goto cleanup;
        }
        for (int64_t i = 0; i < n_t; i++)
            if ((st = ie_iebin_writer_add(w, &items[i].out, items[i].quant_json)) != IE_OK) {
                rc = ie_cli_fail(exit_for(st) == IE_EXIT_MODEL ? IE_EXIT_RUNTIME : exit_for(st), "%s",
                                 ie_error_last());
                goto cleanup;
            }
    }

    /* ---- finish */
    if ((st = ie_iebin_writer_set_tokenizer(w, ie_model_src_tokenizer_path(src))) != IE_OK) {
        rc = ie_cli_fail(exit_for(st) == IE_EXIT_MODEL ? IE_EXIT_RUNTIME : exit_for(st), "tokenizer: %s",
                         ie_error_last());
        goto cleanup;
    }
    if (!(conv_json = conversion_json(in, src, manifest_path, is_default, man, pt, items, n_t, calib_path,
                                      calib_json, gate_result))) {
        rc = ie_cli_fail(IE_EXIT_NOMEM, "out of memory");
        goto cleanup;
    }
    if ((st = ie_iebin_writer_finish(&w, hp, conv_json)) != IE_OK) {
        rc = ie_cli_fail(exit_for(st) == IE_EXIT_MODEL ? IE_EXIT_RUNTIME : exit_for(st), "%s", ie_error_last());
        goto cleanup;
    }
    double secs = ie_now_s() - t_start;
    if (!quiet)
        fprintf(stderr, "wrote %s: %lld tensors (%d converted), %.1f MiB from %.1f MiB in %.1fs\n", out_dir,
                (long long)n_t, n_converted, (double)bytes_out / 1048576.0, (double)total_bytes / 1048576.0, secs);
    {
        cJSON *res = cJSON_CreateObject();
        char *line = NULL;
        if (res) {
            cJSON_AddStringToObject(res, "out_dir", out_dir);
            cJSON_AddNumberToObject(res, "tensors", (double)n_t);
            cJSON_AddNumberToObject(res, "converted", n_converted);
            cJSON_AddNumberToObject(res, "bytes_in", (double)total_bytes);
            cJSON_AddNumberToObject(res, "bytes_out", (double)bytes_out);
            cJSON_AddStringToObject(res, "manifest", manifest_path);
            cJSON_AddStringToObject(res, "pretranspose", ie_pretranspose_name(pt));
            cJSON_AddStringToObject(res, "gate", gate_result);
            if (calib_path) {
                cJSON_AddNumberToObject(res, "min_layer_cosine", rep.layer_cos[rep.worst_layer]);
                cJSON_AddNumberToObject(res, "kl_mean", rep.kl_mean);
                cJSON_AddNumberToObject(res, "ppl_ref", rep.ppl_ref);
                cJSON_AddNumberToObject(res, "ppl_quant", rep.ppl_quant);
            }
            cJSON_AddNumberToObject(res, "seconds", secs);
            line = cJSON_PrintUnformatted(res);
            cJSON_Delete(res);
        }
        if (!line) {
            rc = ie_cli_fail(IE_EXIT_NOMEM, "out of memory");
            goto cleanup;
        }
        printf("%s\n", line);
        cJSON_free(line);
    }
    fflush(stdout);

cleanup:
    if (w) {
        ie_iebin_writer_abort(&w);
        if (created_dir) rmdir(out_dir); /* only if it is empty */
    }
    ie_model_src_destroy(&mem);
    ie_threadpool_destroy(&tp);
    if (items)
        for (int64_t i = 0; i < n_t; i++) item_release(&items[i]);
    free(items);
    ie_calib_report_clear(&rep);
    cJSON_free(calib_json);
    cJSON_free(conv_json);
    free(calib_text);
    free(ids);
    ie_tokenizer_destroy(&tok);
    ie_manifest_destroy(&man);
    ie_model_src_destroy(&src);
    return rc;
}

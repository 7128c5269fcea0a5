/* bind.c — weight binding: from the model source's tensors to the matrices
 * the kernels run.
 *
 * Each matrix (or stack of experts) is bound as the shard cuts it (rows,
 * columns, experts: cut_t), in the layout and type the precision asks for
 * (PANEL16 repacks, bf16/f16/int8w/int4w conversions), converted on the
 * thread pool a panel at a time. Converted stacks can be kept in an on-disk
 * repack cache keyed by a hash of the source bytes. Vectors (norms, biases,
 * sinks) are bound as floats. Which tensors, under which names, follows the
 * architecture descriptor (w->arch).
 */
#include "worker_internal.h"

#include "ie_mmap.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

static int dtype_computable(ie_dtype_t t)
{
    return t == IE_DTYPE_F32 || t == IE_DTYPE_F16 || t == IE_DTYPE_BF16 || t == IE_DTYPE_Q8_0 ||
           t == IE_DTYPE_Q4_0 || t == IE_DTYPE_Q4_1 || t == IE_DTYPE_MXFP4 || ie_dtype_is_intw(t) ||
           ie_dtype_is_kquant(t) || ie_dtype_is_iquant(t);
}

/* The group a ROWS tensor of ggml type t repacks into PANEL16 with
 * (ie_pack_target): a k-quant or MXFP4 keeps its own block (32 or 256
 * elements), Q8_0/Q4_0/Q4_1, bf16 and f16 go to groups of 32. */
static int repack_group(ie_dtype_t t) { return ie_dtype_is_kq_panel(t) ? ie_dtype_block_elems(t) : IE_QK; }

/* A NaN or infinite scale poisons every sum it enters (and in a repacked
 * panel, sixteen rows' worth of tiles): refuse the model at load, naming
 * the tensor. Reads only the scale fields of the ggml blocks (one or two
 * f16 per 18-292 bytes), so it costs a fraction of the read that binding
 * or the first step does anyway. Plain float and engine-native (int8w,
 * int4w) tensors are not checked here. */
static ie_status_t check_scales(const char *name, ie_dtype_t t, ie_layout_t layout, const void *data,
                                uint64_t nbytes, int64_t n_in)
{
    const int qk = ie_dtype_block_elems(t);
    const size_t bb = ie_dtype_block_bytes(t);
    if (layout != IE_LAYOUT_ROWS || qk <= 1 || bb == 0 || ie_dtype_is_intw(t)) return IE_OK;
    const int64_t nb = (int64_t)(nbytes / bb), per_row = n_in / qk;
    const int64_t bad = ie_quant_find_nonfinite(t, data, nb * qk);
    if (bad < 0) return IE_OK;
    return ie_error_set(IE_ERR_FORMAT,
                        "model: tensor '%s' (%s) has a NaN or infinite scale in block %lld (row %lld, "
                        "columns %lld..%lld)",
                        name, ie_dtype_name(t), (long long)bad, (long long)(per_row ? bad / per_row : 0),
                        (long long)(per_row ? bad % per_row * qk : 0),
                        (long long)(per_row ? bad % per_row * qk + qk - 1 : 0));
}

/* Row r of a dense matrix in any layout, as floats. */
void worker_mat_row(const wmat_t *m, int64_t r, float *out)
{
    if (m->layout == IE_LAYOUT_PANEL16) {
        ie_pmat_t pm = {m->dtype, m->group, m->n_in, m->n_out, m->data};
        ie_pack_dequant_row(&pm, r, out);
    } else if (ie_dtype_is_intw(m->dtype)) {
        size_t rb = ie_qrow_bytes(m->dtype, m->group, m->n_in);
        ie_qrow_dequantize(m->dtype, m->group, (const char *)m->data + (size_t)r * rb, out, m->n_in);
    } else {
        size_t rb = ie_dtype_row_bytes(m->dtype, m->n_in);
        ie_dequantize_row(m->dtype, (const char *)m->data + (size_t)r * rb, out, m->n_in);
    }
}

/* ------------------------------------------------- conversion on the pool */

/* Conversion of a stack of n_mat matrices (src, described as a wmat) into
 * `to`/`layout`, 16 rows (one panel) per unit of work. */
typedef struct convert_task {
    wmat_t src; /* slice 0; slices src_slice bytes apart          */
    size_t src_slice;
    int64_t n_mat;
    ie_dtype_t to;
    ie_layout_t layout;
    int group;
    ie_qscale_t how;
    void *dst;
    size_t dst_slice;
    _Atomic int failed;
    _Atomic int no_panel; /* a lossless repack met a block with no panel form (MXFP4's, ie_pack.h) */
} convert_task_t;

static void convert_run(void *ctx, int ith, int nth)
{
    convert_task_t *c = ctx;
    const int64_t n_in = c->src.n_in, n_out = c->src.n_out, np = (n_out + IE_PANEL - 1) / IE_PANEL;
    long b, e;
    ie_split_range((long)(np * c->n_mat), ith, nth, &b, &e);
    float *rows = NULL;
    if (b < e && !(rows = malloc((size_t)IE_PANEL * (size_t)n_in * sizeof(float)))) {
        c->failed = 1;
        return;
    }
    const int lossless = c->layout == IE_LAYOUT_PANEL16 && c->src.layout == IE_LAYOUT_ROWS &&
                         ie_pack_target(c->src.dtype) == c->to &&
                         (ie_dtype_is_intw(c->src.dtype) ? c->src.group : repack_group(c->src.dtype)) == c->group;
    for (long u = b; u < e && !c->no_panel; u++) { /* another thread's refusal ends the stack's conversion */
        const int64_t s = u / np, p = u % np, r0 = p * IE_PANEL;
        const int64_t cnt = n_out - r0 < IE_PANEL ? n_out - r0 : IE_PANEL;
        wmat_t sm = c->src;
        sm.data = (const char *)c->src.data + (size_t)s * c->src_slice;
        char *dslice = (char *)c->dst + (size_t)s * c->dst_slice;
        if (c->layout == IE_LAYOUT_PANEL16) {
            char *dp = dslice + (size_t)p * ie_pack_panel_bytes(c->to, c->group, n_in);
            int rc;
            if (lossless) {
                const size_t rb = ie_tensor_bytes(sm.dtype, IE_LAYOUT_ROWS, sm.group, n_in, 1);
                rc = ie_pack_repack(sm.dtype, c->group, (const char *)sm.data + (size_t)r0 * rb, n_in, 0, cnt, cnt,
                                    dp);
                if (rc != 0) { /* the arguments are checked: only such a block refuses */
                    c->no_panel = 1;
                    break;
                }
            } else {
                for (int64_t r = 0; r < cnt; r++) worker_mat_row(&sm, r0 + r, rows + (size_t)r * n_in);
                rc = ie_pack_quantize(c->to, c->group, c->how, rows, n_in, 0, cnt, cnt, dp);
            }
            if (rc != 0) c->failed = 1;
            continue;
        }
        /* ROWS of f32 / f16 / bf16 */
        const size_t drb = ie_dtype_row_bytes(c->to, n_in);
        for (int64_t r = 0; r < cnt; r++) {
            char *dst = dslice + (size_t)(r0 + r) * drb;
            float *f = c->to == IE_DTYPE_F32 ? (float *)dst : rows;
            worker_mat_row(&sm, r0 + r, f);
            if (c->to == IE_DTYPE_BF16)
                for (int64_t i = 0; i < n_in; i++) ((ie_bf16_t *)dst)[i] = ie_f32_to_bf16(f[i]);
            else if (c->to == IE_DTYPE_F16)
                for (int64_t i = 0; i < n_in; i++) ((ie_f16_t *)dst)[i] = ie_f32_to_f16(f[i]);
        }
    }
    free(rows);
}

/* ------------------------------------------------------- repack cache */

/* On-disk repack cache: converted stacks keyed by a hash of the source
 * bytes and everything that decides the result. Each file ends in a
 * trailer holding the XXH3 of its converted bytes, checked at every load:
 * the weights a worker computes with are then the conversion of the bytes
 * it hashed for the coordinator (ie_model_src_weights_hash), or converted
 * afresh — a damaged, truncated or edited cache file is never served. */
#define IE_PACK_MAGIC 0x4b504549u /* "IEPK" */

typedef struct pack_trailer {
    uint32_t magic, zero;
    uint64_t hash; /* XXH3-64 of the converted bytes */
} pack_trailer_t;

/* What a bind converts: a whole source tensor, or the slice of it a shard
 * holds (then data/nbytes are the cut's own bytes, so the cache key — the
 * hash of exactly the bytes converted plus the shapes after the cut — is
 * right for slices without naming the cut). */
typedef struct src_mat {
    ie_dtype_t dtype;
    ie_layout_t layout;
    int group;
    const void *data;
    uint64_t nbytes;
} src_mat_t;

static void cache_path(const ie_worker_t *w, const src_mat_t *t, const convert_task_t *c, char *out, size_t cap)
{
    char key[256];
    snprintf(key, sizeof key, "v2|%s|%s|%d|%s|%s|%d|%d|%lld|%lld|%lld", ie_dtype_name(t->dtype),
             ie_layout_name(t->layout), t->group, ie_dtype_name(c->to), ie_layout_name(c->layout), c->group,
             (int)c->how, (long long)c->src.n_in, (long long)c->src.n_out, (long long)c->n_mat);
    XXH3_state_t *st = XXH3_createState();
    unsigned long long h = 0;
    if (st) {
        XXH3_64bits_reset(st);
        XXH3_64bits_update(st, key, strlen(key));
        XXH3_64bits_update(st, t->data, (size_t)t->nbytes);
        h = XXH3_64bits_digest(st);
        XXH3_freeState(st);
    }
    snprintf(out, cap, "%s/%016llx-%s-%s-g%d.iepack", w->cache_dir, h, ie_dtype_name(c->to),
             ie_layout_name(c->layout), c->group);
}

static int cache_load(const char *path, void *dst, size_t bytes)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat sb;
    pack_trailer_t tr;
    int rc = -1;
    if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size == bytes + sizeof tr) {
        size_t got = 0;
        while (got < bytes) {
            ssize_t n = pread(fd, (char *)dst + got, bytes - got > (1u << 30) ? (1u << 30) : bytes - got,
                              (off_t)got);
            if (n <= 0) break;
            got += (size_t)n;
        }
        if (got == bytes && pread(fd, &tr, sizeof tr, (off_t)bytes) == (ssize_t)sizeof tr &&
            tr.magic == IE_PACK_MAGIC && tr.hash == XXH3_64bits(dst, bytes))
            rc = 0;
    }
    close(fd);
    return rc;
}

static void cache_store(const char *path, const void *src, size_t bytes)
{
    char tmp[PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    size_t put = 0;
    while (put < bytes) {
        ssize_t n = write(fd, (const char *)src + put, bytes - put > (1u << 30) ? (1u << 30) : bytes - put);
        if (n <= 0) break;
        put += (size_t)n;
    }
    const pack_trailer_t tr = {IE_PACK_MAGIC, 0, XXH3_64bits(src, bytes)};
    if (put == bytes && write(fd, &tr, sizeof tr) != (ssize_t)sizeof tr) put = 0;
    if (close(fd) == 0 && put == bytes && rename(tmp, path) == 0) return;
    unlink(tmp); /* the cache is best effort: a failed store only costs the next load */
}

/* After a matrix was copied or converted, its pages in the source's file
 * mapping are no longer needed: drop them from this process (a read-only
 * file mapping refaults from the file if anything reads them again), so a
 * repacked model does not stay resident twice. Only for sources whose
 * tensors all live in file mappings (GGUF, IEBIN). */
static void drop_source_pages(const ie_worker_t *w, const ie_tensor_t *t)
{
    if (t && w->src_file_mapped) ie_file_release_pages(t->data, (size_t)t->nbytes);
}

/* ---------------------------------------------- one matrix, one vector */

/* The part of a matrix stack a shard binds: rows [r0, r1), columns
 * [c0, c1) of matrices [e0, e1). */
typedef struct cut {
    int64_t r0, r1, c0, c1, e0, e1;
} cut_t;

static ie_status_t bind_src(ie_worker_t *w, const char *name, const src_mat_t *s, const ie_tensor_t *drop,
                            void **tmp, int64_t n_in, int64_t n_out, int64_t n_mat, wmat_t *m);

/* Bind the cut `c` of a 2-D weight matrix stack (ne = [n_in, n_out, n_mat])
 * in the layout the kernels run best, converting it when the precision asks
 * for another type. A cut of rows or columns is copied out in the source's
 * own encoding first (ie_tensor_slice), a cut of experts only is a byte
 * range of the stack; then both go through the same conversion as a whole
 * tensor. A cut off the source's block/group/panel boundaries is
 * IE_ERR_INVAL naming the tensor. keep_src: do not drop the source's pages
 * (the tied embedding, still read for lookups). */
static ie_status_t bind_cut(ie_worker_t *w, const ie_model_src_t *src, const char *name, int64_t n_in,
                            int64_t n_out, int64_t n_mat, const cut_t *c, int keep_src, wmat_t *m)
{
    const ie_tensor_t *t = ie_model_src_tensor(src, name);
    if (!t) return ie_error_set(IE_ERR_FORMAT, "model: missing tensor '%s'", name);
    if (t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n_mat || t->ne[3] != 1)
        return ie_error_set(IE_ERR_FORMAT,
                            "model: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]", name,
                            (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)n_in,
                            (long long)n_out, (long long)n_mat);
    const int whole_rc = c->r0 == 0 && c->r1 == n_out && c->c0 == 0 && c->c1 == n_in;
    const int whole = whole_rc && c->e0 == 0 && c->e1 == n_mat;
    memset(m, 0, sizeof *m);
    m->n_in = n_in;
    m->n_out = n_out;

    if (t->layout == IE_LAYOUT_BSR) {
        char err[160];
        if (n_mat != 1)
            return ie_error_set(IE_ERR_UNSUPPORTED,
                                "model: tensor '%s': block-sparse expert stacks are not supported", name);
        if (!whole)
            return ie_error_set(IE_ERR_UNSUPPORTED, "model: block-sparse tensor '%s' cannot be sharded", name);
        if (ie_bsr_view(t->data, (size_t)t->nbytes, n_in, n_out, &m->bsr, err, sizeof err) != 0)
            return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s': %s", name, err);
        m->dtype = IE_DTYPE_F32;
        m->layout = IE_LAYOUT_BSR;
        m->data = t->data;
        m->slice = (size_t)t->nbytes;
        m->n_mat = 1;
        return IE_OK; /* kept sparse whatever the precision */
    }
    if (!dtype_computable(t->dtype) || (t->layout == IE_LAYOUT_PANEL16 && !ie_dtype_is_packable(t->dtype)) ||
        (t->layout != IE_LAYOUT_ROWS && t->layout != IE_LAYOUT_PANEL16))
        return ie_error_set(IE_ERR_UNSUPPORTED,
                            "model: tensor '%s' has type %s in layout %s, which the engine cannot compute with",
                            name, ie_dtype_name(t->dtype), ie_layout_name(t->layout));
    const size_t src_slice = ie_tensor_bytes(t->dtype, t->layout, t->group, n_in, n_out);
    if (src_slice == 0)
        return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' row length %lld does not fit %s (group %d)", name,
                            (long long)n_in, ie_dtype_name(t->dtype), t->group);
    if ((uint64_t)src_slice * (uint64_t)n_mat > t->nbytes)
        return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' holds %llu bytes, its shape needs %llu", name,
                            (unsigned long long)t->nbytes, (unsigned long long)src_slice * (uint64_t)n_mat);

    src_mat_t s = {t->dtype, t->layout, t->group, t->data, t->nbytes};
    const int64_t ne = c->e1 - c->e0;
    if (whole) return bind_src(w, name, &s, keep_src ? NULL : t, NULL, n_in, n_out, n_mat, m);
    if (whole_rc) { /* experts only: a byte range of the stack */
        s.data = (const char *)t->data + (size_t)c->e0 * src_slice;
        s.nbytes = (uint64_t)src_slice * (uint64_t)ne;
        return bind_src(w, name, &s, keep_src ? NULL : t, NULL, n_in, n_out, ne, m);
    }
    const int64_t ni = c->c1 - c->c0, no = c->r1 - c->r0;
    const size_t sb = ie_tensor_bytes(t->dtype, t->layout, t->group, ni, no);
    void *tmp = sb ? worker_big_alloc(sb * (size_t)ne) : NULL;
    if (sb && !tmp) return ie_error_set(IE_ERR_NOMEM, "out of memory slicing '%s'", name);
    for (int64_t e = 0; e < ne; e++) {
        if (sb == 0 ||
            ie_tensor_slice(t->dtype, t->layout, t->group, (const char *)t->data + (size_t)(c->e0 + e) * src_slice,
                            n_in, n_out, c->r0, c->r1, c->c0, c->c1, (char *)tmp + (size_t)e * sb) != 0) {
            worker_big_free(tmp);
            return ie_error_set(IE_ERR_INVAL,
                                "tensor plan: cannot cut rows [%lld, %lld) x columns [%lld, %lld) out of '%s' "
                                "(%s/%s group %d): not on its block boundaries",
                                (long long)c->r0, (long long)c->r1, (long long)c->c0, (long long)c->c1, name,
                                ie_dtype_name(t->dtype), ie_layout_name(t->layout), t->group);
        }
    }
    s.data = tmp;
    s.nbytes = (uint64_t)sb * (uint64_t)ne;
    ie_status_t st = bind_src(w, name, &s, keep_src ? NULL : t, &tmp, ni, no, ne, m);
    worker_big_free(tmp); /* NULL when bind_src kept it */
    return st;
}

/* Bind the source stack s (n_mat matrices of n_out rows of n_in) into m:
 * as is, copied, or converted per the precision. tmp: NULL, or a buffer of
 * ours holding s's bytes, which bind_src takes over (and NULLs) when it
 * uses it as is. drop: the tensor whose file pages to release once the
 * bytes live elsewhere (NULL: none). */
static ie_status_t bind_src(ie_worker_t *w, const char *name, const src_mat_t *t, const ie_tensor_t *drop,
                            void **tmp, int64_t n_in, int64_t n_out, int64_t n_mat, wmat_t *m)
{
    memset(m, 0, sizeof *m);
    m->n_in = n_in;
    m->n_out = n_out;
    m->n_mat = n_mat;
    const size_t src_slice = ie_tensor_bytes(t->dtype, t->layout, t->group, n_in, n_out);
    ie_status_t st = check_scales(name, t->dtype, t->layout, t->data, (uint64_t)src_slice * (uint64_t)n_mat, n_in);
    if (st != IE_OK) return st;
    /* what the source is, as a matrix */
    wmat_t sm = {.dtype = t->dtype,
                 .layout = t->layout,
                 .group = t->group,
                 .data = t->data,
                 .n_in = n_in,
                 .n_out = n_out,
                 .slice = src_slice,
                 .n_mat = n_mat};

    /* what we want it to be; keep_rows: a repack met a block with no panel
     * form (an MXFP4 exponent outside f16's range, ie_pack.h), so the
     * stack runs in ROWS as it came */
    int keep_rows = 0;
retarget:;
    ie_dtype_t to = t->dtype;
    ie_layout_t lay = t->layout;
    int group = t->group;
    switch (w->opts.precision) {
    case IE_PREC_NATIVE:
        if (t->layout == IE_LAYOUT_ROWS && ie_dtype_is_intw(t->dtype)) {
            lay = IE_LAYOUT_PANEL16; /* engine-native rows always run packed */
        } else if (!keep_rows && t->layout == IE_LAYOUT_ROWS && w->repack &&
                   ie_pack_target(t->dtype) != IE_DTYPE_INVALID &&
                   ie_pack_check(ie_pack_target(t->dtype), repack_group(t->dtype), n_in) == 0) {
            /* bf16, f16 too: their decode GEMV reads panels; a k-quant or
             * MXFP4 in its own blocks (MXFP4 as IQ4_NL's panels: its ROWS
             * GEMM runs at ~0.4 of their rate). Packing off (IE_REPACK=0) or
             * a row length the blocks do not divide keeps ROWS, run by the
             * ROWS kernels. */
            to = ie_pack_target(t->dtype);
            lay = IE_LAYOUT_PANEL16;
            group = repack_group(t->dtype);
        }
        break;
    case IE_PREC_F32:
        to = IE_DTYPE_F32;
        lay = IE_LAYOUT_ROWS;
        group = 0;
        break;
    case IE_PREC_BF16:
    case IE_PREC_F16:
        to = w->opts.precision == IE_PREC_BF16 ? IE_DTYPE_BF16 : IE_DTYPE_F16;
        lay = w->repack && ie_pack_check(to, 32, n_in) == 0 ? IE_LAYOUT_PANEL16 : IE_LAYOUT_ROWS;
        group = lay == IE_LAYOUT_PANEL16 ? 32 : 0;
        break;
    case IE_PREC_INT8W:
    case IE_PREC_INT4W:
        /* int4w keeps the output head (the tied embedding) at 8 bits, as
         * llama.cpp's 4-bit mixes do: it is the most sensitive matrix */
        to = w->opts.precision == IE_PREC_INT8W || w->binding_head
                 ? IE_DTYPE_I8W
                 : (w->opts.quant_affine ? IE_DTYPE_I4WA : IE_DTYPE_I4W);
        lay = IE_LAYOUT_PANEL16;
        group = w->opts.quant_group > 0 ? w->opts.quant_group : 32;
        if (ie_pack_check(to, group, n_in) != 0)
            return ie_error_set(IE_ERR_INVAL, "model: %s group %d does not divide the row length %lld of '%s'",
                                ie_dtype_name(to), group, (long long)n_in, name);
        break;
    }
    m->dtype = to;
    m->layout = lay;
    m->group = lay == IE_LAYOUT_PANEL16 ? group : 0;
    m->slice = ie_tensor_bytes(to, lay, m->group, n_in, n_out);
    const size_t bytes = m->slice * (size_t)n_mat;

    if (to == t->dtype && lay == t->layout && group == t->group) {
        if (tmp && *tmp) { /* a slice already in our memory */
            if (worker_own(w, *tmp) != 0) return ie_error_set(IE_ERR_NOMEM, "out of memory");
            m->data = *tmp;
            *tmp = NULL;
            drop_source_pages(w, drop);
            return IE_OK;
        }
        if (!w->copy_weights) {
            m->data = t->data;
            return IE_OK;
        }
        /* same type: a plain copy into huge-page memory (file mappings use
         * 4 KiB pages, which cost a third of the read bandwidth) */
        void *dst = worker_big_alloc(bytes);
        if (!dst || worker_own(w, dst) != 0) {
            worker_big_free(dst);
            return ie_error_set(IE_ERR_NOMEM, "out of memory copying '%s' (%zu bytes)", name, bytes);
        }
        memcpy(dst, t->data, bytes);
        drop_source_pages(w, drop);
        m->data = dst;
        return IE_OK;
    }
    void *dst = worker_big_alloc(bytes);
    if (!dst)
        return ie_error_set(IE_ERR_NOMEM, "out of memory converting '%s' to %s (%zu bytes)", name,
                            ie_dtype_name(to), bytes);
    convert_task_t c = {.src = sm,
                        .src_slice = src_slice,
                        .n_mat = n_mat,
                        .to = to,
                        .layout = lay,
                        .group = m->group,
                        .how = w->opts.quant_scale,
                        .dst = dst,
                        .dst_slice = m->slice};
    char path[PATH_MAX];
    int cached = 0;
    if (w->cache_dir) {
        cache_path(w, t, &c, path, sizeof path);
        cached = cache_load(path, dst, bytes) == 0;
    }
    if (!cached) {
        ie_threadpool_run(w->tp, convert_run, &c);
        if (c.no_panel && !c.failed) {
            worker_big_free(dst);
            keep_rows = 1;
            goto retarget;
        }
        if (c.failed) {
            worker_big_free(dst);
            return ie_error_set(IE_ERR_NOMEM, "worker: converting '%s' to %s failed", name, ie_dtype_name(to));
        }
        if (w->cache_dir) cache_store(path, dst, bytes);
    }
    if (worker_own(w, dst) != 0) {
        worker_big_free(dst);
        return ie_error_set(IE_ERR_NOMEM, "out of memory converting '%s' (%zu bytes)", name, bytes);
    }
    drop_source_pages(w, drop);
    m->data = dst;
    return IE_OK;
}

/* Bind a vector of n floats (norms, biases, sinks; n1 > 1 for per-expert
 * biases of shape [n, n1]); F16/BF16 tensors (HF checkpoints) are
 * converted once. */
static ie_status_t bind_vec2(ie_worker_t *w, const ie_model_src_t *src, const char *name, int64_t n, int64_t n1,
                             const float **out)
{
    const ie_tensor_t *t = ie_model_src_tensor(src, name);
    if (!t) return ie_error_set(IE_ERR_FORMAT, "model: missing tensor '%s'", name);
    if (t->ne[0] != n || t->ne[1] != n1 || t->ne[2] != 1 || t->ne[3] != 1)
        return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", name,
                            (long long)t->ne[0], (long long)t->ne[1], (long long)n, (long long)n1);
    n *= n1;
    if (t->dtype != IE_DTYPE_F32 && t->dtype != IE_DTYPE_F16 && t->dtype != IE_DTYPE_BF16)
        return ie_error_set(IE_ERR_UNSUPPORTED, "model: vector tensor '%s' has type %s (expected f32, f16 or bf16)",
                            name, ie_dtype_name(t->dtype));
    /* copied, f32 too: read in place, each small vector keeps a page, or a
     * whole large folio, of the file resident (SmolLM2 under Linux 6.18,
     * ext4: its 31 f32 norms kept 63 MB of the 94 MB file) */
    float *f = worker_big_alloc((size_t)n * sizeof(float));
    if (!f || worker_own(w, f) != 0) {
        worker_big_free(f);
        return ie_error_set(IE_ERR_NOMEM, "out of memory");
    }
    if (t->dtype == IE_DTYPE_F32) memcpy(f, t->data, (size_t)n * sizeof(float));
    else ie_dequantize_row(t->dtype, t->data, f, n);
    drop_source_pages(w, t);
    *out = f;
    return IE_OK;
}

static ie_status_t bind_vec(ie_worker_t *w, const ie_model_src_t *src, const char *name, int64_t n,
                            const float **out)
{
    return bind_vec2(w, src, name, n, 1, out);
}


/* ------------------------------------------------------------ the model */

/* Copy the weights into our own huge-page memory? Measured here (TinyLlama
 * Q4_0, 2 threads, interleaved A/B): +2-3% decode for twice the resident
 * memory, so it is off unless asked for (opts or IE_WEIGHTS_COPY=1). */
static int resolve_copy(int want)
{
    const char *env = getenv("IE_WEIGHTS_COPY");
    if (env && (env[0] == '0' || env[0] == '1') && !env[1]) return env[0] == '1';
    return want > 0;
}

/* Contract (worker_internal.h). */
ie_status_t worker_bind_options(ie_worker_t *w, const ie_model_src_t *src)
{
    const ie_worker_opts_t *opts = &w->opts;
    w->copy_weights = resolve_copy(opts->copy_weights);
    w->src_file_mapped = ie_model_src_kind(src) == IE_SRC_GGUF || ie_model_src_kind(src) == IE_SRC_IEBIN;
    const char *env = getenv("IE_REPACK");
    w->repack = (env && (env[0] == '0' || env[0] == '1') && !env[1]) ? env[0] == '1' : opts->repack > 0;
    const char *g = getenv("IE_QUANT_GROUP");
    if (g && *g) {
        char *end;
        long v = strtol(g, &end, 10);
        if (*end || v < 32 || v > (1 << 20))
            return ie_error_set(IE_ERR_INVAL, "worker: IE_QUANT_GROUP='%s' is not a group size", g);
        w->opts.quant_group = (int)v;
    }
    const char *qs = getenv("IE_QUANT_SCALE");
    if (qs && *qs) {
        if (strcmp(qs, "absmax") == 0) w->opts.quant_scale = IE_QSCALE_ABSMAX;
        else if (strcmp(qs, "mse") == 0) w->opts.quant_scale = IE_QSCALE_MSE;
        else return ie_error_set(IE_ERR_INVAL, "worker: IE_QUANT_SCALE='%s' (expected absmax or mse)", qs);
    }
    const char *af = getenv("IE_QUANT_AFFINE");
    if (af && (af[0] == '0' || af[0] == '1') && !af[1]) w->opts.quant_affine = af[0] == '1';
    const char *dir = opts->repack_cache ? opts->repack_cache : getenv("IE_REPACK_CACHE");
    if (dir && *dir) {
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return ie_error_set(IE_ERR_IO, "worker: cannot create repack cache directory '%s': %s", dir,
                                strerror(errno));
        if (!(w->cache_dir = strdup(dir))) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    }
    return IE_OK;
}

/* Embeddings are read a row at a time (dequantized on lookup), so they keep
 * the file's type whatever the precision — unless they are tied and the
 * output head converted them whole, then lookups read the head. Only ranks
 * that embed (or whose head is the tied embedding) need them. */
static ie_status_t bind_embedding_and_head(ie_worker_t *w, const ie_model_src_t *src)
{
    const ie_hparams_t *hp = &w->hp;
    const ie_shard_range_t *sh = &w->sh;
    const int64_t d = hp->n_embd, nv_loc = sh->vocab_end - sh->vocab_begin;
    const int tied = w->arch.tied_output;
    const ie_tensor_t *te = NULL;
    ie_status_t st;

    if (sh->has_embed || (sh->has_head && tied)) {
        te = ie_model_src_tensor(src, "token_embd.weight");
        if (!te) return ie_error_set(IE_ERR_FORMAT, "model: missing tensor 'token_embd.weight'");
        if (!dtype_computable(te->dtype) || te->layout == IE_LAYOUT_BSR || te->ne[0] != d ||
            te->ne[1] != hp->n_vocab || ie_tensor_bytes(te->dtype, te->layout, te->group, d, hp->n_vocab) == 0 ||
            ie_tensor_bytes(te->dtype, te->layout, te->group, d, hp->n_vocab) > te->nbytes)
            return ie_error_set(
                IE_ERR_FORMAT,
                "model: tensor 'token_embd.weight' is %s/%s [%lld, %lld], expected a dense [%lld, %d]",
                ie_dtype_name(te->dtype), ie_layout_name(te->layout), (long long)te->ne[0], (long long)te->ne[1],
                (long long)d, hp->n_vocab);
        /* lookups read any row: check the whole table (a tied head bound
         * whole checks it again, a sliced one only its rows) */
        if (sh->has_embed &&
            (st = check_scales("token_embd.weight", te->dtype, te->layout, te->data,
                               ie_tensor_bytes(te->dtype, te->layout, te->group, d, hp->n_vocab), d)) != IE_OK)
            return st;
        if (sh->has_embed)
            w->tok_embd = (wmat_t){.dtype = te->dtype,
                                   .layout = te->layout,
                                   .group = te->group,
                                   .data = te->data,
                                   .n_in = d,
                                   .n_out = hp->n_vocab,
                                   .n_mat = 1,
                                   .slice = ie_tensor_bytes(te->dtype, te->layout, te->group, d, hp->n_vocab)};
    }
    if (!sh->has_head) return IE_OK;
    const cut_t hc = {sh->vocab_begin, sh->vocab_end, 0, d, 0, 1};
    const int whole_head = nv_loc == hp->n_vocab;
    w->binding_head = 1;
    /* a sliced tied head must not drop the pages the lookups read */
    st = bind_cut(w, src, tied ? "token_embd.weight" : "output.weight", d, hp->n_vocab, 1, &hc,
                  tied && sh->has_embed && !whole_head, &w->output);
    w->binding_head = 0;
    if (st != IE_OK) return st;
    if (tied && sh->has_embed && whole_head && w->output.data != te->data) w->tok_embd = w->output;
    return bind_vec(w, src, "output_norm.weight", d, &w->output_norm);
}

/* Layer l's tensors: norms, attention (with the descriptor's biases and
 * sinks), then the dense MLP or the MoE. */
static ie_status_t bind_layer(ie_worker_t *w, const ie_model_src_t *src, int l)
{
    const ie_hparams_t *hp = &w->hp;
    const ie_arch_desc_t *a = &w->arch;
    const ie_shard_range_t *sh = &w->sh;
    layer_t *L = &w->layers[l];
    const int hd = hp->head_dim;
    const int64_t d = hp->n_embd, ff = w->ff_loc;
    /* this rank's rows of q and of k/v; o takes the q range as columns */
    const int64_t q0 = (int64_t)sh->head_begin * hd, q1 = (int64_t)sh->head_end * hd;
    const int64_t kv0 = (int64_t)sh->kv_head_begin * hd, kv1 = (int64_t)sh->kv_head_end * hd;
    const int64_t qd = (int64_t)hp->n_head * hd, kvd = (int64_t)hp->n_head_kv * hd;
    const int moe = a->ffn == IE_FFN_MOE;
    const int64_t E = moe ? hp->n_expert : 1;
    const int64_t e0 = moe ? sh->expert_begin : 0, e1 = moe ? sh->expert_end : 1;
    char name[96];
    ie_status_t st = IE_OK;

#define BIND_CUT(field, suffix, nin, nout, nmat, ...)                                                       \
    snprintf(name, sizeof name, "blk.%d.%s.weight", l, suffix);                                             \
    if ((st = bind_cut(w, src, name, nin, nout, nmat, &(const cut_t){__VA_ARGS__}, 0, &L->field)) != IE_OK) \
        return st;
#define BIND_VEC(field, suffix, n, n1)                   \
    snprintf(name, sizeof name, "blk.%d.%s", l, suffix); \
    if ((st = bind_vec2(w, src, name, n, n1, &L->field)) != IE_OK) return st;
    BIND_VEC(attn_norm, "attn_norm.weight", d, 1);
    BIND_CUT(q, "attn_q", d, qd, 1, q0, q1, 0, d, 0, 1);
    BIND_CUT(k, "attn_k", d, kvd, 1, kv0, kv1, 0, d, 0, 1);
    BIND_CUT(v, "attn_v", d, kvd, 1, kv0, kv1, 0, d, 0, 1);
    BIND_CUT(o, "attn_output", qd, d, 1, 0, d, q0, q1, 0, 1);
    if (a->qkv_bias) {
        /* biases follow their matrices' rows */
        BIND_VEC(bq, "attn_q.bias", qd, 1);
        BIND_VEC(bk, "attn_k.bias", kvd, 1);
        BIND_VEC(bv, "attn_v.bias", kvd, 1);
        L->bq += q0;
        L->bk += kv0;
        L->bv += kv0;
    }
    if (a->o_bias && sh->head_begin == 0) {
        /* o's bias is added once, by the first rank, before the sum across ranks */
        BIND_VEC(bo, "attn_output.bias", d, 1);
    }
    if (a->qk_norm) {
        /* one weight for every head: whole on each rank */
        BIND_VEC(q_norm, "attn_q_norm.weight", hd, 1);
        BIND_VEC(k_norm, "attn_k_norm.weight", hd, 1);
    }
    if (a->sinks) {
        BIND_VEC(sinks, "attn_sinks.weight", hp->n_head, 1);
        L->sinks += sh->head_begin;
    }
    L->swa = a->sliding && hp->layer_swa[l];
    char norm[64];
    snprintf(norm, sizeof norm, "%s.weight", a->ffn_norm_name);
    BIND_VEC(ffn_norm, norm, d, 1);
    if (a->norm == IE_NORM_SANDWICH) {
        /* applied to each block's summed output: whole on every rank */
        BIND_VEC(post_attn_norm, "post_attention_norm.weight", d, 1);
        BIND_VEC(post_ffw_norm, "post_ffw_norm.weight", d, 1);
    }
    if (!moe) {
        BIND_CUT(gate, "ffn_gate", d, hp->n_ff, 1, sh->ff_begin, sh->ff_end, 0, d, 0, 1);
        BIND_CUT(up, "ffn_up", d, hp->n_ff, 1, sh->ff_begin, sh->ff_end, 0, d, 0, 1);
        BIND_CUT(down, "ffn_down", hp->n_ff, d, 1, 0, d, sh->ff_begin, sh->ff_end, 0, 1);
        return IE_OK;
    }
    /* the router stays whole (every rank selects the same top-k); the
     * expert stacks keep this rank's experts */
    BIND_CUT(router, "ffn_gate_inp", d, E, 1, 0, E, 0, d, 0, 1);
    if (a->router_bias) { BIND_VEC(router_b, "ffn_gate_inp.bias", E, 1); }
    BIND_CUT(gate, "ffn_gate_exps", d, ff, E, 0, ff, 0, d, e0, e1);
    BIND_CUT(up, "ffn_up_exps", d, ff, E, 0, ff, 0, d, e0, e1);
    BIND_CUT(down, "ffn_down_exps", ff, d, E, 0, d, 0, ff, e0, e1);
    if (a->expert_bias) {
        BIND_VEC(gate_b, "ffn_gate_exps.bias", ff, E);
        BIND_VEC(up_b, "ffn_up_exps.bias", ff, E);
        BIND_VEC(down_b, "ffn_down_exps.bias", d, E);
        L->gate_b += e0 * ff;
        L->up_b += e0 * ff;
        L->down_b += e0 * d;
    }
#undef BIND_CUT
#undef BIND_VEC
    return st;
}

/* Contract (worker_internal.h). */
ie_status_t worker_bind_weights(ie_worker_t *w, const ie_model_src_t *src)
{
    const ie_hparams_t *hp = &w->hp;
    ie_status_t st;
    if ((st = bind_embedding_and_head(w, src)) != IE_OK) return st;
    if (!(w->layers = calloc((size_t)hp->n_layer, sizeof *w->layers)))
        return ie_error_set(IE_ERR_NOMEM, "out of memory");
    if (w->arch.ffn == IE_FFN_MOE && (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert))
        return ie_error_set(IE_ERR_FORMAT, "model: %d experts used of %d", hp->n_expert_used, hp->n_expert);
    for (int l = w->sh.layer_begin; l < w->sh.layer_end; l++)
        if ((st = bind_layer(w, src, l)) != IE_OK) return st;
    /* RoPE frequency factors for the cos/sin tables (worker_kv_new), checked
     * here so a bad file fails at load naming the entry; a second, long set
     * (Phi-3 long RoPE) replaces the first when the context exceeds the
     * original one (model_phi3.c). Every rank that holds a layer rotates. */
    const char *freqs = "rope_freqs.weight";
    if (hp->rope_yarn_orig_ctx > 0 && w->opts.n_ctx > hp->rope_yarn_orig_ctx &&
        ie_model_src_tensor(src, "rope_freqs_long.weight"))
        freqs = "rope_freqs_long.weight";
    if (w->arch.rope_scaling == IE_ROPE_SCALING_FREQS &&
        (st = bind_vec(w, src, freqs, hp->rope_dim / 2, &w->rope_freqs)) != IE_OK)
        return st;
    if (w->rope_freqs)
        for (int i = 0; i < hp->rope_dim / 2; i++)
            if (!isfinite(w->rope_freqs[i]) || w->rope_freqs[i] <= 0.0f)
                return ie_error_set(IE_ERR_FORMAT, "model: tensor '%s' entry %d is %g (must be positive)", freqs, i,
                                    (double)w->rope_freqs[i]);
    return IE_OK;
}

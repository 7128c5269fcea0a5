/* test_worker.c — the worker's step API on the tiny random Llama fixture:
 * batching must not change results (one prefill step == token-by-token
 * decode; two sequences interleaved in one step == each alone), the batch is
 * validated before the cache is touched, and converted precisions stay
 * close to f32. The numerical reference (HF transformers) is checked by
 * tests/e2e/test_forward_tiny.py; this suite checks the engine against
 * itself. Also: a failing matmul kernel fails the step (and leaves the
 * caches as they were), the architecture descriptors, and RoPE frequency
 * factors (rope_freqs.weight) with the attention factor. */
#include "ie_arch_desc.h"
#include "ie_worker.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MODEL IE_TEST_DATA "/tiny_llama"

static ie_model_src_t *g_src;

static int suite_init(void) { return ie_model_src_open(MODEL, &g_src) == IE_OK ? 0 : -1; }
static int suite_clean(void)
{
    ie_model_src_destroy(&g_src);
    return 0;
}

/* repack: ie_worker_opts_t.repack (1 is the default) */
static ie_worker_t *make_worker_repack(int n_seq, int max_batch, ie_precision_t prec, int threads, int repack)
{
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_seq = n_seq;
    o.max_batch = max_batch;
    o.n_ctx = 64;
    o.precision = prec;
    o.n_threads = threads;
    o.pin_threads = 0;
    o.repack = repack;
    ie_worker_t *w = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_worker_new(g_src, &o, &w), IE_OK);
    return w;
}

static ie_worker_t *make_worker(int n_seq, int max_batch, ie_precision_t prec, int threads)
{
    return make_worker_repack(n_seq, max_batch, prec, threads, 1);
}

static const int32_t k_prompt_a[8] = {5, 17, 300, 42, 42, 7, 511, 0};
static const int32_t k_prompt_b[5] = {100, 200, 300, 400, 9};

/* logits of every position of ids in slot `seq`, fed `chunk` tokens a step */
static void run_seq(ie_worker_t *w, int seq, const int32_t *ids, int n, int chunk, float *out)
{
    int nv = ie_worker_hparams(w)->n_vocab;
    int32_t pos[64], sq[64];
    uint8_t want[64];
    ie_worker_seq_clear(w, seq);
    for (int i = 0; i < n; i += chunk) {
        int m = n - i < chunk ? n - i : chunk;
        for (int k = 0; k < m; k++) {
            pos[k] = i + k;
            sq[k] = seq;
            want[k] = 1;
        }
        ie_batch_t b = {m, ids + i, pos, sq, want, NULL, NULL};
        CU_ASSERT_EQUAL_FATAL(ie_worker_step(w, &b, out + (size_t)i * nv), IE_OK);
    }
}

static double max_rel(const float *a, const float *b, size_t n)
{
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        md = d > md ? d : md;
        mb = fabs(b[i]) > mb ? fabs(b[i]) : mb;
    }
    return md / (mb > 0 ? mb : 1);
}

static void test_prefill_equals_decode(void)
{
    ie_worker_t *w = make_worker(1, 16, IE_PREC_F32, 2);
    int nv = ie_worker_hparams(w)->n_vocab;
    float *pre = malloc(8 * nv * sizeof(float)), *dec = malloc(8 * nv * sizeof(float));
    run_seq(w, 0, k_prompt_a, 8, 8, pre);
    run_seq(w, 0, k_prompt_a, 8, 1, dec);
    CU_ASSERT(max_rel(pre, dec, 8 * (size_t)nv) < 1e-5);
    /* chunks of 3 as well (prefill continuing a non-empty cache) */
    run_seq(w, 0, k_prompt_a, 8, 3, dec);
    CU_ASSERT(max_rel(pre, dec, 8 * (size_t)nv) < 1e-5);
    free(pre);
    free(dec);
    ie_worker_destroy(&w);
    CU_ASSERT_PTR_NULL(w);
}

static void test_two_sequences_one_step(void)
{
    ie_worker_t *w = make_worker(3, 16, IE_PREC_F32, 2);
    int nv = ie_worker_hparams(w)->n_vocab;
    float *a = malloc(8 * nv * sizeof(float)), *b = malloc(5 * nv * sizeof(float));
    float *mix = malloc(13 * nv * sizeof(float));
    run_seq(w, 0, k_prompt_a, 8, 8, a);
    run_seq(w, 1, k_prompt_b, 5, 5, b);
    /* interleave: a0 b0 a1 b1 ... in slots 2 and 0 */
    int32_t tok[13], pos[13], seq[13];
    int n = 0, ia = 0, ib = 0;
    ie_worker_seq_clear(w, 0);
    ie_worker_seq_clear(w, 2);
    while (ia < 8 || ib < 5) {
        if (ia < 8) {
            tok[n] = k_prompt_a[ia];
            pos[n] = ia++;
            seq[n++] = 2;
        }
        if (ib < 5) {
            tok[n] = k_prompt_b[ib];
            pos[n] = ib++;
            seq[n++] = 0;
        }
    }
    ie_batch_t bt = {n, tok, pos, seq, NULL, NULL, NULL};
    /* logits == NULL asks for the last token only */
    float *last = malloc(nv * sizeof(float));
    CU_ASSERT_EQUAL(ie_worker_step(w, &bt, last), IE_OK);
    CU_ASSERT(max_rel(last, a + 7 * (size_t)nv, nv) < 1e-5); /* last entry is a7 */
    /* and every row, asked explicitly */
    uint8_t want[13];
    memset(want, 1, sizeof want);
    ie_worker_seq_clear(w, 0);
    ie_worker_seq_clear(w, 2);
    bt.logits = want;
    CU_ASSERT_EQUAL(ie_worker_step(w, &bt, mix), IE_OK);
    ia = ib = 0;
    for (int i = 0; i < n; i++) {
        const float *ref = seq[i] == 2 ? a + (size_t)(ia++) * nv : b + (size_t)(ib++) * nv;
        CU_ASSERT(max_rel(mix + (size_t)i * nv, ref, nv) < 1e-5);
    }
    free(a);
    free(b);
    free(mix);
    free(last);
    ie_worker_destroy(&w);
}

static void test_bad_batches(void)
{
    ie_worker_t *w = make_worker(2, 4, IE_PREC_NATIVE, 1);
    int nv = ie_worker_hparams(w)->n_vocab;
    float *lg = malloc(4 * nv * sizeof(float));
    int32_t tok[5] = {1, 2, 3, 4, 5}, pos[5] = {0, 1, 2, 3, 4}, seq[5] = {0};
    ie_batch_t b = {5, tok, pos, seq, NULL, NULL, NULL};
    CU_ASSERT_EQUAL(ie_worker_step(w, &b, lg), IE_ERR_INVAL); /* > max_batch */
    b.n = 0;
    CU_ASSERT_EQUAL(ie_worker_step(w, &b, lg), IE_ERR_INVAL);
    b.n = 2;
    tok[1] = nv;
    CU_ASSERT_EQUAL(ie_worker_step(w, &b, lg), IE_ERR_RANGE); /* token id */
    tok[1] = -1;
    CU_ASSERT_EQUAL(ie_worker_step(w, &b, lg), IE_ERR_RANGE);
    tok[1] = 2;
    seq[1] = 2;
    CU_ASSERT_EQUAL(ie_worker_step(w, &b, lg), IE_ERR_RANGE); /* slot */
    seq[1] = 0;
    pos[1] = 3;
    CU_ASSERT_EQUAL(ie_worker_step(w, &b, lg), IE_ERR_RANGE); /* skips ahead */
    pos[0] = 64;
    pos[1] = 65;
    CU_ASSERT_EQUAL(ie_worker_step(w, &b, lg), IE_ERR_RANGE); /* past n_ctx */
    pos[0] = 0;
    pos[1] = 1;
    CU_ASSERT_EQUAL(ie_worker_step(w, &b, lg), IE_OK); /* nothing was corrupted */
    free(lg);
    ie_worker_destroy(&w);
    ie_worker_destroy(&w); /* NULL is fine */
}

static void test_precisions_close(void)
{
    int nv;
    float *ref, *got;
    ie_worker_t *w = make_worker(1, 8, IE_PREC_F32, 1);
    nv = ie_worker_hparams(w)->n_vocab;
    ref = malloc(8 * nv * sizeof(float));
    got = malloc(8 * nv * sizeof(float));
    run_seq(w, 0, k_prompt_a, 8, 8, ref);
    ie_worker_destroy(&w);
    static const struct {
        ie_precision_t p;
        double tol;
    } cases[] = {{IE_PREC_NATIVE, 1e-6}, {IE_PREC_F16, 5e-3}, {IE_PREC_BF16, 3e-2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        w = make_worker(1, 8, cases[c].p, 2);
        run_seq(w, 0, k_prompt_a, 8, 8, got);
        double e = max_rel(got, ref, 8 * (size_t)nv);
        CU_ASSERT(e < cases[c].tol);
        if (e >= cases[c].tol) fprintf(stderr, "\nprecision %s: rel err %g\n", ie_precision_name(cases[c].p), e);
        ie_worker_destroy(&w);
    }
    /* bf16 runs in PANEL16 unless repacking is off: both layouts stay as
     * close, and their logits differ (the sums run in another order), which
     * shows the panel kernels ran */
    float *rows = malloc(8 * nv * sizeof(float));
    CU_ASSERT_FATAL(rows != NULL);
    w = make_worker_repack(1, 8, IE_PREC_BF16, 2, 0);
    run_seq(w, 0, k_prompt_a, 8, 8, rows);
    ie_worker_destroy(&w);
    CU_ASSERT(max_rel(rows, ref, 8 * (size_t)nv) < 3e-2);
    CU_ASSERT(memcmp(rows, got, 8 * nv * sizeof(float)) != 0);
    free(rows);
    free(ref);
    free(got);
}

static void test_precision_parse(void)
{
    ie_precision_t p;
    CU_ASSERT_EQUAL(ie_precision_parse("bf16", &p), IE_OK);
    CU_ASSERT_EQUAL(p, IE_PREC_BF16);
    CU_ASSERT_EQUAL(ie_precision_parse("int3", &p), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_precision_parse(NULL, &p), IE_ERR_INVAL);
}

/* ie_worker_stream_probe reads without changing what a step computes, in
 * both modes, at 1-3 threads, over row and panel layouts; NULL arguments
 * are refused. */
static void test_stream_probe(void)
{
    for (int threads = 1; threads <= 3; threads++) {
        /* rows (the fixture's f32) and panels (int4w) */
        ie_worker_t *w = make_worker(1, 8, threads == 2 ? IE_PREC_INT4W : IE_PREC_NATIVE, threads);
        const int nv = ie_worker_hparams(w)->n_vocab;
        float *a = malloc(sizeof(float) * 8 * nv), *b = malloc(sizeof(float) * 8 * nv);
        CU_ASSERT_FATAL(a && b);
        run_seq(w, 0, k_prompt_a, 8, 8, a);
        double s0 = -1, s1 = -1;
        CU_ASSERT_EQUAL(ie_worker_stream_probe(w, 0, &s0), IE_OK);
        CU_ASSERT_EQUAL(ie_worker_stream_probe(w, 1, &s1), IE_OK);
        CU_ASSERT(s0 > 0 && s1 > 0);
        run_seq(w, 0, k_prompt_a, 8, 8, b);
        CU_ASSERT_EQUAL(memcmp(a, b, sizeof(float) * 8 * nv), 0);
        CU_ASSERT_EQUAL(ie_worker_stream_probe(w, 0, NULL), IE_ERR_INVAL);
        CU_ASSERT_EQUAL(ie_worker_stream_probe(NULL, 0, &s0), IE_ERR_INVAL);
        free(a);
        free(b);
        ie_worker_destroy(&w);
    }
}

/* Both workers (destroyed here) run the same 8 tokens in steps of chunk
 * and give the same logits, bit for bit. */
static void check_same_logits(ie_worker_t *wa, ie_worker_t *wb, int chunk)
{
    const int nv = ie_worker_hparams(wa)->n_vocab;
    float *a = malloc(sizeof(float) * 8 * nv), *b = malloc(sizeof(float) * 8 * nv);
    CU_ASSERT_FATAL(a && b);
    run_seq(wa, 0, k_prompt_a, 8, chunk, a);
    run_seq(wb, 0, k_prompt_a, 8, chunk, b);
    CU_ASSERT_EQUAL(memcmp(a, b, sizeof(float) * 8 * nv), 0);
    free(a);
    free(b);
    ie_worker_destroy(&wa);
    ie_worker_destroy(&wb);
}

/* Balanced decode matmuls (threads claim and steal panels or 16-row
 * pieces) give the same bits as the static split, for panel types and row
 * types (the fixture's f32, bf16) at 2 and 3 threads, token by token and
 * in steps of 8 (the largest balanced batch). */
static void test_balanced_decode(void)
{
    static const ie_precision_t precs[] = {IE_PREC_INT4W, IE_PREC_INT8W, IE_PREC_NATIVE, IE_PREC_BF16};
    for (int pi = 0; pi < 4; pi++)
        for (int threads = 2; threads <= 3; threads++)
            for (int chunk = 1; chunk <= 8; chunk += 7) {
                setenv("IE_DECODE_BALANCE", "0", 1);
                ie_worker_t *ws = make_worker(1, 8, precs[pi], threads);
                unsetenv("IE_DECODE_BALANCE");
                check_same_logits(ws, make_worker(1, 8, precs[pi], threads), chunk);
            }
}

/* The decode options (streaming activation stores, idle prefetch,
 * balancing, KV-row prefetch) change no bits: a worker with all on and one switched off
 * through ie_worker_set_decode_option give the same logits, decode and
 * prefill, for the activation formats that stream (Q8_P, Q16_P, BF16);
 * bad arguments are refused. */
static void test_decode_options(void)
{
    static const ie_precision_t precs[] = {IE_PREC_INT4W, IE_PREC_INT8W, IE_PREC_BF16};
    for (int pi = 0; pi < 3; pi++)
        for (int chunk = 1; chunk <= 8; chunk += 7) {
            ie_worker_t *on = make_worker(1, 8, precs[pi], 2), *off = make_worker(1, 8, precs[pi], 2);
            CU_ASSERT_EQUAL(ie_worker_set_decode_option(off, "stream", 0), IE_OK);
            CU_ASSERT_EQUAL(ie_worker_set_decode_option(off, "prefetch", 0), IE_OK);
            CU_ASSERT_EQUAL(ie_worker_set_decode_option(off, "balance", 0), IE_OK);
            CU_ASSERT_EQUAL(ie_worker_set_decode_option(off, "kvprefetch", 0), IE_OK);
            check_same_logits(on, off, chunk);
        }
    ie_worker_t *w = make_worker(1, 8, IE_PREC_INT4W, 2);
    CU_ASSERT_EQUAL(ie_worker_set_decode_option(NULL, "stream", 1), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_worker_set_decode_option(w, NULL, 1), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_worker_set_decode_option(w, "turbo", 1), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "turbo"));
    ie_worker_destroy(&w);
}

/* Kernels that always fail, as a kernel does on a matrix it cannot run
 * (the dense matmul: an empty dtype slot, which ie_kernels_matmul refuses). */
static ie_status_t fail_packed(const ie_pmat_t *m, int64_t r0, int64_t r1, const void *a, size_t a_stride,
                               int64_t n_tok, float *y, int64_t ldy)
{
    return IE_ERR_INVAL;
}

static ie_status_t fail_ranges(const ie_pmat_t *m, ie_panel_next_fn next, void *ctx, const void *a, size_t a_stride,
                               int64_t n_tok, float *y, int64_t ldy)
{
    return IE_ERR_INVAL;
}

/* A step whose matmul kernel fails returns IE_ERR_INTERNAL naming the
 * kernel, counts no new positions, and the worker runs on once the kernels
 * work again: the same logits as a worker that never failed. Rows (f32)
 * and panels (int8w; balanced with two threads), prefill and decode. */
static void test_kernel_failure(void)
{
    static const ie_precision_t precs[] = {IE_PREC_F32, IE_PREC_INT8W};
    static const char *const what[] = {"f32/rows", "int8w/panel16"};
    /* the kernel's own status, named in the message: an empty dense slot,
     * the failing packed kernels below */
    static const char *const why[] = {"(IE_ERR_UNSUPPORTED)", "(IE_ERR_INVAL)"};
    for (int pi = 0; pi < 2; pi++)
        for (int threads = 1; threads <= 2; threads++)
            for (int n = 1; n <= 8; n += 7) {
                ie_worker_t *w = make_worker(1, 8, precs[pi], threads),
                            *ref = make_worker(1, 8, precs[pi], threads);
                const int nv = ie_worker_hparams(w)->n_vocab;
                const ie_kernels_t *good = ie_kernels_get(ie_worker_isa(w));
                ie_kernels_t bad = *good;
                memset(bad.matmul, 0, sizeof bad.matmul);
                bad.matmul_packed = fail_packed;
                bad.matmul_packed_ranges = fail_ranges;
                int32_t ids[9], pos[9], sq[9] = {0};
                for (int i = 0; i < 9; i++) {
                    ids[i] = k_prompt_a[i % 8];
                    pos[i] = i;
                }
                float *la = calloc((size_t)nv, sizeof(float)), *lb = calloc((size_t)nv, sizeof(float));
                ie_batch_t b = {n, ids, pos, sq, NULL, NULL, NULL};

                ie_worker_test_set_matmul_ops(w, &bad);
                CU_ASSERT_EQUAL(ie_worker_step(w, &b, la), IE_ERR_INTERNAL);
                CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "kernel failed"));
                CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), what[pi]));
                CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), why[pi]));
                /* nothing was counted: position n would skip ahead */
                ie_worker_test_set_matmul_ops(w, good);
                ie_batch_t next = {1, ids + n, pos + n, sq, NULL, NULL, NULL};
                CU_ASSERT_EQUAL(ie_worker_step(w, &next, la), IE_ERR_RANGE);
                /* and the step runs again as if it had never failed */
                CU_ASSERT_EQUAL(ie_worker_step(w, &b, la), IE_OK);
                CU_ASSERT_EQUAL(ie_worker_step(ref, &b, lb), IE_OK);
                CU_ASSERT_EQUAL(memcmp(la, lb, (size_t)nv * sizeof(float)), 0);
                free(la);
                free(lb);
                ie_worker_destroy(&w);
                ie_worker_destroy(&ref);
            }
}

/* The descriptor says what the fixture (a Llama) and a GPT-OSS shape need,
 * and refuses an architecture it has no entry for. */
/* The fixture as an in-memory source: RoPE frequency factors `freqs`
 * (NULL: none), cos/sin times attn_factor (0: off), q and k weights times
 * qk_scale. */
static ie_model_src_t *mem_variant(const float *freqs, float attn_factor, float qk_scale)
{
    ie_hparams_t hp = *ie_model_src_hparams(g_src);
    ie_model_src_t *m = NULL;
    const int half = hp.rope_dim / 2;
    hp.rope_freqs = freqs != NULL;
    hp.rope_attn_factor = attn_factor;
    CU_ASSERT_EQUAL_FATAL(ie_model_src_new_mem(&hp, ie_model_src_tokenizer_path(g_src), &m), IE_OK);
    for (int64_t i = 0; i < ie_model_src_n_tensors(g_src); i++) {
        ie_tensor_t t = *ie_model_src_tensor_at(g_src, i);
        float *copy = NULL;
        if (qk_scale != 1.0f && (strstr(t.name, "attn_q.weight") || strstr(t.name, "attn_k.weight"))) {
            CU_ASSERT_EQUAL_FATAL(t.dtype, IE_DTYPE_F32);
            copy = malloc(t.nbytes);
            CU_ASSERT_PTR_NOT_NULL_FATAL(copy);
            for (size_t j = 0; j < t.nbytes / sizeof(float); j++) copy[j] = ((const float *)t.data)[j] * qk_scale;
            t.data = copy;
        }
        CU_ASSERT_EQUAL_FATAL(ie_model_src_mem_add(m, &t, copy), IE_OK);
    }
    if (freqs) {
        float *f = malloc((size_t)half * sizeof(float));
        CU_ASSERT_PTR_NOT_NULL_FATAL(f);
        memcpy(f, freqs, (size_t)half * sizeof(float));
        ie_tensor_t t = {.name = "rope_freqs.weight",
                         .dtype = IE_DTYPE_F32,
                         .n_dims = 1,
                         .ne = {half, 1, 1, 1},
                         .data = f,
                         .nbytes = (uint64_t)half * sizeof(float),
                         .layout = IE_LAYOUT_ROWS};
        CU_ASSERT_EQUAL_FATAL(ie_model_src_mem_add(m, &t, f), IE_OK);
    }
    CU_ASSERT_EQUAL_FATAL(ie_model_src_mem_finish(m), IE_OK);
    return m;
}

/* Logits of k_prompt_a (8 positions) from src at f32, fed one token a step. */
static float *logits_of(const ie_model_src_t *src)
{
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_ctx = 64;
    o.precision = IE_PREC_F32;
    o.n_threads = 2;
    o.pin_threads = 0;
    ie_worker_t *w = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_worker_new(src, &o, &w), IE_OK);
    float *out = malloc(8 * (size_t)ie_worker_hparams(w)->n_vocab * sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    run_seq(w, 0, k_prompt_a, 8, 1, out);
    ie_worker_destroy(&w);
    return out;
}

/* rope_freqs.weight divides each pair's frequency (factors of 1 change no
 * bit; others change the logits); rope_attn_factor still multiplies cos and
 * sin, which scales every score like q and k weights scaled by it; a factor
 * that is not positive is refused naming its entry. */
static void test_rope_freqs(void)
{
    const ie_hparams_t *hp = ie_model_src_hparams(g_src);
    const size_t n = 8 * (size_t)hp->n_vocab;
    float ones[64], ramp[64];
    CU_ASSERT_FATAL(hp->rope_dim / 2 <= 64);
    for (int i = 0; i < hp->rope_dim / 2; i++) {
        ones[i] = 1.0f;
        ramp[i] = 1.0f + (float)i;
    }
    float *plain = logits_of(g_src);

    ie_model_src_t *m = mem_variant(ones, 0.0f, 1.0f);
    float *got = logits_of(m);
    CU_ASSERT(memcmp(got, plain, n * sizeof(float)) == 0);
    free(got);
    ie_model_src_destroy(&m);

    m = mem_variant(ramp, 0.0f, 1.0f);
    got = logits_of(m);
    CU_ASSERT(max_rel(got, plain, n) > 1e-3);
    free(got);
    ie_model_src_destroy(&m);

    m = mem_variant(ones, 1.5f, 1.0f);
    ie_model_src_t *ref_src = mem_variant(NULL, 0.0f, 1.5f);
    float *ref = logits_of(ref_src);
    got = logits_of(m);
    CU_ASSERT(max_rel(ref, plain, n) > 1e-3);
    CU_ASSERT(max_rel(got, ref, n) < 1e-5);
    free(got);
    free(ref);
    ie_model_src_destroy(&m);
    ie_model_src_destroy(&ref_src);

    ramp[2] = 0.0f;
    m = mem_variant(ramp, 0.0f, 1.0f);
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_ctx = 64;
    o.pin_threads = 0;
    ie_worker_t *w = NULL;
    CU_ASSERT_EQUAL(ie_worker_new(m, &o, &w), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "'rope_freqs.weight' entry 2"));
    CU_ASSERT_PTR_NULL(w);
    ie_model_src_destroy(&m);
    free(plain);
}

static void test_arch_desc(void)
{
    ie_arch_desc_t a;
    const ie_hparams_t *hp = ie_model_src_hparams(g_src);
    CU_ASSERT_EQUAL_FATAL(ie_arch_desc_init(hp, &a), IE_OK);
    CU_ASSERT_STRING_EQUAL(a.name, "llama");
    CU_ASSERT_EQUAL(a.ffn, IE_FFN_DENSE);
    CU_ASSERT_EQUAL(a.gating, IE_GATING_SWIGLU);
    CU_ASSERT_EQUAL(a.act, IE_ACT_SILU);
    CU_ASSERT_EQUAL(a.norm, IE_NORM_PRE);
    CU_ASSERT_EQUAL(a.rope_layout, hp->rope_layout);
    CU_ASSERT_EQUAL(a.rope_scaling, IE_ROPE_SCALING_NONE);
    CU_ASSERT_EQUAL(a.tied_output, hp->tied_embeddings != 0);
    CU_ASSERT(!a.qkv_bias && !a.o_bias && !a.sinks && !a.sliding && !a.qk_norm);
    CU_ASSERT(a.embd_scale == 0 && a.attn_softcap == 0 && a.final_softcap == 0);
    CU_ASSERT_STRING_EQUAL(a.ffn_norm_name, "ffn_norm");

    ie_hparams_t g = *hp;
    g.arch_id = IE_ARCH_GPTOSS;
    g.n_expert = 4;
    g.n_expert_used = 2;
    g.sliding_window = 16;
    g.attn_bias = 1;
    g.attn_sinks = 1;
    g.swiglu_limit = 7.0f;
    g.swiglu_alpha = 1.702f;
    g.rope_yarn_factor = 32.0f;
    g.rope_layout = IE_ROPE_NEOX;
    g.tied_embeddings = 0;
    CU_ASSERT_EQUAL_FATAL(ie_arch_desc_init(&g, &a), IE_OK);
    CU_ASSERT_STRING_EQUAL(a.name, "gpt-oss");
    CU_ASSERT_EQUAL(a.ffn, IE_FFN_MOE);
    CU_ASSERT_EQUAL(a.gating, IE_GATING_SWIGLU_CLAMP);
    CU_ASSERT_EQUAL(a.routing, IE_ROUTE_TOPK_SOFTMAX);
    CU_ASSERT_EQUAL(a.top_k, 2);
    CU_ASSERT(a.gate_limit == 7.0f && a.gate_alpha == 1.702f);
    CU_ASSERT(a.qkv_bias && a.o_bias && a.sinks && a.sliding && a.router_bias && a.expert_bias);
    CU_ASSERT_EQUAL(a.rope_layout, IE_ROPE_NEOX);
    CU_ASSERT_EQUAL(a.rope_scaling, IE_ROPE_SCALING_YARN);
    CU_ASSERT_EQUAL(a.tied_output, 0);
    CU_ASSERT_STRING_EQUAL(a.ffn_norm_name, "post_attention_norm");

    /* Llama 3.x frequency factors, a Mistral window on every layer */
    g = *hp;
    g.rope_freqs = 1;
    g.sliding_window = 8;
    memset(g.layer_swa, 1, (size_t)g.n_layer);
    CU_ASSERT_EQUAL_FATAL(ie_arch_desc_init(&g, &a), IE_OK);
    CU_ASSERT_EQUAL(a.rope_scaling, IE_ROPE_SCALING_FREQS);
    CU_ASSERT(a.sliding && !a.qkv_bias && !a.o_bias);
    /* Qwen2: biases on q/k/v only */
    g = *hp;
    g.arch_id = IE_ARCH_QWEN2;
    g.qkv_bias = 1;
    CU_ASSERT_EQUAL_FATAL(ie_arch_desc_init(&g, &a), IE_OK);
    CU_ASSERT_STRING_EQUAL(a.name, "qwen2");
    CU_ASSERT(a.qkv_bias && !a.o_bias && !a.sliding && a.ffn == IE_FFN_DENSE);
    /* Qwen3-MoE: softmax over all experts first, renormalized top-k, plain
     * SwiGLU experts, no biases anywhere */
    ie_hparams_t q = *hp;
    q.arch_id = IE_ARCH_QWEN3MOE;
    q.n_expert = 8;
    q.n_expert_used = 2;
    q.qk_norm = 1;
    q.moe_softmax_first = 1;
    q.moe_norm_topk = 1;
    CU_ASSERT_EQUAL_FATAL(ie_arch_desc_init(&q, &a), IE_OK);
    CU_ASSERT_STRING_EQUAL(a.name, "qwen3moe");
    CU_ASSERT_EQUAL(a.ffn, IE_FFN_MOE);
    CU_ASSERT_EQUAL(a.routing, IE_ROUTE_SOFTMAX_TOPK);
    CU_ASSERT_EQUAL(a.gating, IE_GATING_SWIGLU);
    CU_ASSERT(a.norm_topk && a.qk_norm && a.top_k == 2);
    CU_ASSERT(!a.router_bias && !a.expert_bias && !a.qkv_bias && !a.o_bias && !a.sinks);
    /* Mixtral: the llama architecture with experts gets its own entry,
     * Qwen3-MoE's routing without the q/k norm */
    ie_hparams_t m = *hp;
    m.n_expert = 8;
    m.n_expert_used = 2;
    m.moe_softmax_first = 1;
    m.moe_norm_topk = 1;
    CU_ASSERT_EQUAL_FATAL(ie_arch_desc_init(&m, &a), IE_OK);
    CU_ASSERT_STRING_EQUAL(a.name, "mixtral");
    CU_ASSERT_EQUAL(a.ffn, IE_FFN_MOE);
    CU_ASSERT_EQUAL(a.routing, IE_ROUTE_SOFTMAX_TOPK);
    CU_ASSERT_EQUAL(a.gating, IE_GATING_SWIGLU);
    CU_ASSERT(a.norm_topk && !a.qk_norm && a.top_k == 2);
    CU_ASSERT(!a.router_bias && !a.expert_bias && !a.qkv_bias && !a.o_bias && !a.sinks);
    CU_ASSERT_STRING_EQUAL(a.ffn_norm_name, "ffn_norm");

    g.arch_id = (ie_arch_t)99;
    CU_ASSERT_EQUAL(ie_arch_desc_init(&g, &a), IE_ERR_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "no descriptor"));
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("worker", suite_init, suite_clean);
    CU_add_test(s, "prefill equals decode", test_prefill_equals_decode);
    CU_add_test(s, "two sequences in one step", test_two_sequences_one_step);
    CU_add_test(s, "bad batches rejected", test_bad_batches);
    CU_add_test(s, "precisions close to f32", test_precisions_close);
    CU_add_test(s, "precision names", test_precision_parse);
    CU_add_test(s, "stream probe", test_stream_probe);
    CU_add_test(s, "balanced decode == static split", test_balanced_decode);
    CU_add_test(s, "decode options change no bits; bad names refused", test_decode_options);
    CU_add_test(s, "a failing kernel fails the step", test_kernel_failure);
    CU_add_test(s, "architecture descriptors", test_arch_desc);
    CU_add_test(s, "RoPE frequency factors and attention factor", test_rope_freqs);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

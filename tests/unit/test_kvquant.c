/* test_kvquant.c — the KV cache's storage types (worker/src/kvquant.c) and
 * a worker running on each: type names and the head sizes each type takes,
 * the Walsh-Hadamard rotation against a dense Hadamard matrix product, each
 * codec's round-trip error within its format's bound (and FP8's exact codes,
 * saturation, subnormals), and on the tiny Llama fixture: every cache type
 * gives logits close to the f32 cache's (f16/bf16 closer than the 8-bit and
 * those closer than nothing), the rotation changes an f32 cache's logits
 * only by rounding, a quantized cache gives the same bits whatever the
 * block size and with a batched prefill or token-by-token decode, and the
 * pool's bytes per position follow the types. */
#include "../../kernels/src/ie_kernels_isa.h" /* ie_kv_decode_ref */
#include "../../worker/src/worker_internal.h"

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

static unsigned g_rng = 12345;
static float frand(void) /* uniform in [-1, 1) */
{
    g_rng = g_rng * 1103515245u + 12345u;
    return (float)((g_rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void test_names(void)
{
    ie_kv_type_t t = IE_KV_F32;
    for (int i = 0; i < IE_KV_TYPE_COUNT; i++) {
        CU_ASSERT_EQUAL(ie_kv_type_parse(ie_kv_type_name((ie_kv_type_t)i), &t), IE_OK);
        CU_ASSERT_EQUAL(t, (ie_kv_type_t)i);
    }
    CU_ASSERT_EQUAL(ie_kv_type_parse("q8_0", &t), IE_OK);
    CU_ASSERT_EQUAL(t, IE_KV_Q8);
    CU_ASSERT_EQUAL(ie_kv_type_parse("q4_0", &t), IE_OK);
    CU_ASSERT_EQUAL(t, IE_KV_Q4);
    CU_ASSERT_EQUAL(ie_kv_type_parse("q5_1", &t), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "unknown KV cache type 'q5_1'"));
    CU_ASSERT_EQUAL(t, IE_KV_Q4); /* untouched */
    CU_ASSERT_EQUAL(ie_kv_type_parse(NULL, &t), IE_ERR_INVAL);
    ie_kv_rotate_t r;
    CU_ASSERT_EQUAL(ie_kv_rotate_parse("off", &r), IE_OK);
    CU_ASSERT_EQUAL(r, IE_KV_ROTATE_OFF);
    CU_ASSERT_EQUAL(ie_kv_rotate_parse("yes", &r), IE_ERR_INVAL);
    /* bytes per head; q4 takes multiples of 32 only */
    CU_ASSERT_EQUAL(ie_kv_head_bytes(IE_KV_F32, 64), 256);
    CU_ASSERT_EQUAL(ie_kv_head_bytes(IE_KV_BF16, 64), 128);
    CU_ASSERT_EQUAL(ie_kv_head_bytes(IE_KV_Q8, 64), 68);
    CU_ASSERT_EQUAL(ie_kv_head_bytes(IE_KV_Q4, 64), 36);
    CU_ASSERT_EQUAL(ie_kv_head_bytes(IE_KV_Q4, 80), 0);
    CU_ASSERT_EQUAL(ie_kv_head_bytes(IE_KV_FP8_E5M2, 80), 80);
    CU_ASSERT_EQUAL(ie_kv_head_bytes(IE_KV_TYPE_COUNT, 64), 0);
    /* auto rotates exactly the sub-16-bit types */
    CU_ASSERT(!kvq_rotates(IE_KV_F32, IE_KV_ROTATE_AUTO) && !kvq_rotates(IE_KV_BF16, IE_KV_ROTATE_AUTO));
    CU_ASSERT(kvq_rotates(IE_KV_Q8, IE_KV_ROTATE_AUTO) && kvq_rotates(IE_KV_FP8_E4M3, IE_KV_ROTATE_AUTO));
    CU_ASSERT(!kvq_rotates(IE_KV_Q4, IE_KV_ROTATE_OFF) && kvq_rotates(IE_KV_F16, IE_KV_ROTATE_ON));
}

/* Sylvester's H_p entry (i, j): (-1)^popcount(i & j). */
static int had(int i, int j) { return __builtin_popcount((unsigned)(i & j)) & 1 ? -1 : 1; }

/* The FWHT equals the dense product with blockdiag(H_p, ...)/sqrt(p), p
 * the largest power of two dividing hd; applied twice it is the identity. */
static void test_fwht_dense(void)
{
    static const int sizes[] = {1, 2, 16, 64, 128, 80, 96, 24};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int hd = sizes[s], p = hd & -hd;
        float x[128], y[128], ref[128];
        for (int i = 0; i < hd; i++) x[i] = y[i] = frand();
        for (int i = 0; i < hd; i++) {
            const int b = i / p * p;
            double acc = 0;
            for (int j = 0; j < p; j++) acc += had(i - b, j) * (double)x[b + j];
            ref[i] = (float)(acc / sqrt((double)p));
        }
        kvq_fwht(y, hd);
        double err = 0, back = 0;
        for (int i = 0; i < hd; i++) err = fmax(err, fabs((double)y[i] - ref[i]));
        kvq_fwht(y, hd);
        for (int i = 0; i < hd; i++) back = fmax(back, fabs((double)y[i] - x[i]));
        CU_ASSERT(err < 1e-5);
        CU_ASSERT(back < 1e-5);
    }
}

/* Round trip of random heads within each format's bound. */
static void test_codec_bounds(void)
{
    const int hd = 96;
    float x[96], y[96];
    unsigned char buf[512];
    for (int trial = 0; trial < 50; trial++) {
        const float mag = ldexpf(1.0f, trial % 12 - 4); /* 2^-4 .. 2^7 */
        for (int i = 0; i < hd; i++) x[i] = frand() * mag;
        float amax = 0;
        for (int i = 0; i < hd; i++) amax = fmaxf(amax, fabsf(x[i]));
        for (int t = 0; t < IE_KV_TYPE_COUNT; t++) {
            if (t == IE_KV_Q4) continue; /* below: its groups */
            memset(buf, 0xa5, sizeof buf);
            ie_kv_encode((ie_kv_type_t)t, x, hd, buf);
            CU_ASSERT_EQUAL(buf[ie_kv_head_bytes((ie_kv_type_t)t, hd)], 0xa5); /* no write past the head */
            ie_kv_decode_ref((ie_kv_type_t)t, buf, hd, y);
            for (int i = 0; i < hd; i++) {
                const double e = fabs((double)y[i] - x[i]), a = fabs((double)x[i]);
                double bound = 0;
                switch (t) {
                case IE_KV_F32: bound = 0; break;
                case IE_KV_F16: bound = fmax(a * 0x1p-11, 0x1p-25); break;
                case IE_KV_BF16: bound = a * 0x1p-8; break;
                case IE_KV_Q8: bound = amax / 254.0 * 1.0001; break;
                case IE_KV_FP8_E4M3: bound = fmax(a * 0x1p-4, 0x1p-10); break;
                case IE_KV_FP8_E5M2: bound = fmax(a * 0x1p-3, 0x1p-17); break;
                }
                if (e > bound) {
                    CU_FAIL("round trip outside its bound");
                    break;
                }
            }
        }
        /* q4: each group of 32 within half its step, d = max / 8 */
        ie_kv_encode(IE_KV_Q4, x, hd, buf);
        ie_kv_decode_ref(IE_KV_Q4, buf, hd, y);
        for (int g = 0; g < hd / 32; g++) {
            float gmax = 0;
            for (int i = 0; i < 32; i++) gmax = fmaxf(gmax, fabsf(x[g * 32 + i]));
            for (int i = 0; i < 32; i++) /* d = -(signed max) / 8: the far end clips at 7 steps, off by up to one */
                CU_ASSERT(fabs((double)y[g * 32 + i] - x[g * 32 + i]) <= gmax / 8.0 * 1.002 + 1e-7);
        }
    }
}

/* FP8 codes: exact values, saturation, subnormals, sign. */
static void test_fp8_codes(void)
{
    const float in[] = {448.0f, 1000.0f, -1e9f, 0x1p-9f, 0x1p-6f, 1.0f, 1.0625f, 1.1875f, -0.0f, 0.0f};
    const float e4[] = {448.0f, 448.0f, -448.0f, 0x1p-9f, 0x1p-6f, 1.0f, 1.0f, 1.25f, -0.0f, 0.0f};
    const int n = (int)(sizeof in / sizeof in[0]);
    unsigned char c[16];
    float y[16];
    ie_kv_encode(IE_KV_FP8_E4M3, in, n, c);
    ie_kv_decode_ref(IE_KV_FP8_E4M3, c, n, y);
    for (int i = 0; i < n; i++) CU_ASSERT_EQUAL(y[i], e4[i]);
    CU_ASSERT_EQUAL(c[0], 0x7e); /* the largest finite e4m3 */
    CU_ASSERT_EQUAL(c[2], 0xfe); /* saturated negative */
    CU_ASSERT_EQUAL(c[3], 0x01); /* the smallest subnormal */
    CU_ASSERT_EQUAL(c[4], 0x08); /* the smallest normal */
    CU_ASSERT_EQUAL(c[6], 0x38); /* 1.0625 ties to even: 1.0 */
    const float in5[] = {57344.0f, 1e6f, 0x1p-16f, 1.125f, 1.375f};
    const float e5[] = {57344.0f, 57344.0f, 0x1p-16f, 1.0f, 1.5f};
    ie_kv_encode(IE_KV_FP8_E5M2, in5, 5, c);
    ie_kv_decode_ref(IE_KV_FP8_E5M2, c, 5, y);
    for (int i = 0; i < 5; i++) CU_ASSERT_EQUAL(y[i], e5[i]);
    CU_ASSERT_EQUAL(c[0], 0x7b);
}

/* Every ISA's kv_decode gives the scalar decode's bits: every type, head
 * sizes with and without a tail of fewer than 16 (or 8) values, nothing
 * written past the head. */
static void test_decode_twin(void)
{
    static const int sizes[] = {16, 64, 80, 96, 128, 40, 72, 256, 8, 3};
    for (int isa = IE_ISA_REF; isa <= IE_ISA_AVX512; isa++) {
        const ie_kernels_t *ops = ie_kernels_get((ie_isa_t)isa);
        if (!ops) continue;
        for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
            const int hd = sizes[z];
            float x[272], a[272], b[272];
            unsigned char buf[1100];
            for (int i = 0; i < hd; i++) x[i] = frand() * 3.0f;
            x[hd > 3 ? 3 : 0] = 1e-7f; /* subnormal in f16 / fp8 */
            for (int t = 0; t < IE_KV_TYPE_COUNT; t++) {
                if (!ie_kv_head_bytes((ie_kv_type_t)t, hd)) continue;
                ie_kv_encode((ie_kv_type_t)t, x, hd, buf);
                ie_kv_decode_ref((ie_kv_type_t)t, buf, hd, a);
                memset(b, 0xff, sizeof b);
                ops->kv_decode((ie_kv_type_t)t, buf, hd, b);
                CU_ASSERT_EQUAL(memcmp(a, b, (size_t)hd * sizeof(float)), 0);
                CU_ASSERT_EQUAL(((uint32_t *)(void *)b)[hd], 0xffffffffu); /* nothing past the head */
            }
        }
    }
}

/* ------------------------------------------------------------ on a worker */

static ie_worker_t *make_src(ie_model_src_t *src, ie_kv_type_t k, ie_kv_type_t v, ie_kv_rotate_t rot, int kv_block,
                             int threads)
{
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_ctx = 64;
    o.max_batch = 16;
    o.precision = IE_PREC_F32;
    o.n_threads = threads;
    o.pin_threads = 0;
    o.kv_type_k = k;
    o.kv_type_v = v;
    o.kv_rotate = rot;
    o.kv_block = kv_block;
    ie_worker_t *w = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_worker_new(src, &o, &w), IE_OK);
    return w;
}

static ie_worker_t *make(ie_kv_type_t k, ie_kv_type_t v, ie_kv_rotate_t rot, int kv_block, int threads)
{
    return make_src(g_src, k, v, rot, kv_block, threads);
}

#define NTOK 40
/* logits of all NTOK positions of a fixed text, `chunk` tokens a step */
static float *run(ie_worker_t *w, int chunk)
{
    const int nv = ie_worker_hparams(w)->n_vocab;
    float *out = malloc((size_t)NTOK * nv * sizeof(float));
    int32_t ids[NTOK], pos[NTOK], sq[NTOK];
    uint8_t want[NTOK];
    for (int i = 0; i < NTOK; i++) ids[i] = (i * 37 + 11) % nv, pos[i] = i, sq[i] = 0, want[i] = 1;
    ie_worker_seq_clear(w, 0);
    for (int i = 0; i < NTOK; i += chunk) {
        const int m = NTOK - i < chunk ? NTOK - i : chunk;
        ie_batch_t b = {m, ids + i, pos + i, sq + i, want + i, NULL, NULL};
        CU_ASSERT_EQUAL_FATAL(ie_worker_step(w, &b, out + (size_t)i * nv), IE_OK);
    }
    return out;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static void test_worker_types(void)
{
    ie_worker_t *w = make(IE_KV_F32, IE_KV_F32, IE_KV_ROTATE_AUTO, 0, 2);
    const size_t nv = (size_t)ie_worker_hparams(w)->n_vocab, n = NTOK * nv;
    const int hd = ie_worker_hparams(w)->head_dim, kvh = ie_worker_hparams(w)->n_head_kv,
              nl = ie_worker_hparams(w)->n_layer;
    float *ref = run(w, 16);
    CU_ASSERT_EQUAL(ie_worker_kv_bytes_per_pos(w), (size_t)nl * kvh * hd * 4 * 2);
    ie_worker_destroy(&w);
    double lmax = 0;
    for (size_t i = 0; i < n; i++) lmax = fmax(lmax, fabs(ref[i]));

    /* the rotation alone (f32 cache): only rounding */
    w = make(IE_KV_F32, IE_KV_F32, IE_KV_ROTATE_ON, 0, 2);
    float *got = run(w, 16);
    CU_ASSERT(max_diff(got, ref, n) < 1e-4 * lmax);
    free(got);
    ie_worker_destroy(&w);

    /* each type: close to f32 within a bound of its precision */
    static const struct {
        ie_kv_type_t t;
        double tol;
    } types[] = {
        {IE_KV_F16, 2e-3}, {IE_KV_BF16, 2e-2}, {IE_KV_Q8, 3e-2}, {IE_KV_FP8_E4M3, 8e-2}, {IE_KV_FP8_E5M2, 1.5e-1}};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        w = make(types[t].t, types[t].t, IE_KV_ROTATE_AUTO, 0, 2);
        CU_ASSERT_EQUAL(ie_worker_kv_bytes_per_pos(w), (size_t)nl * kvh * ie_kv_head_bytes(types[t].t, hd) * 2);
        got = run(w, 16);
        const double d = max_diff(got, ref, n);
        CU_ASSERT(d > 0); /* the cache did change something */
        CU_ASSERT(d < types[t].tol * lmax);
        if (d >= types[t].tol * lmax)
            fprintf(stderr, "  %s: max diff %.3g of %.3g\n", ie_kv_type_name(types[t].t), d, lmax);
        free(got);
        ie_worker_destroy(&w);
    }
    free(ref);

    /* a head size q4 cannot take (the fixture's 16): refused, named */
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_ctx = 64;
    o.pin_threads = 0;
    o.kv_type_v = IE_KV_Q4;
    w = NULL;
    CU_ASSERT_EQUAL(ie_worker_new(g_src, &o, &w), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(w);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "q4 cannot hold a head of 16 values"));
    o.kv_type_v = (ie_kv_type_t)99;
    CU_ASSERT_EQUAL(ie_worker_new(g_src, &o, &w), IE_ERR_INVAL);
}

/* A quantized cache: the same bits whatever the block size and the
 * threads, and with a batched prefill or one token a step (each position
 * decodes to the same values, scored in the same chunks from its window's
 * start). K q8 rotated, V fp8 rotated: both paths at once. */
static void test_worker_layouts(void)
{
    ie_worker_t *w = make(IE_KV_Q8, IE_KV_FP8_E4M3, IE_KV_ROTATE_AUTO, 0, 1);
    const size_t n = NTOK * (size_t)ie_worker_hparams(w)->n_vocab;
    float *ref = run(w, 16);
    float *got = run(w, 16);
    CU_ASSERT_EQUAL(memcmp(got, ref, n * sizeof(float)), 0); /* a rerun over the old cache */
    free(got);
    ie_worker_destroy(&w);
    static const int blocks[] = {1, 3, 7, 64};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
        w = make(IE_KV_Q8, IE_KV_FP8_E4M3, IE_KV_ROTATE_AUTO, blocks[i], 2);
        got = run(w, 16);
        CU_ASSERT_EQUAL(memcmp(got, ref, n * sizeof(float)), 0);
        free(got);
        ie_worker_destroy(&w);
    }
    w = make(IE_KV_Q8, IE_KV_FP8_E4M3, IE_KV_ROTATE_AUTO, 5, 2);
    got = run(w, 1);
    CU_ASSERT(max_diff(got, ref, n) < 1e-4); /* decode vs prefill: matmul shapes differ */
    free(got);
    ie_worker_destroy(&w);
    free(ref);
}

/* GPT-OSS (sinks, sliding layers of window 8, head size 16... of the
 * fixture): an f16 cache stays within f16 rounding of the f32 cache, for
 * a prefill (the rows decoded once per step, read from the window's start)
 * and token by token (each token's own chunks), past the window's edge and
 * over blocks of 3 positions. */
static void test_worker_gptoss_window(void)
{
    ie_model_src_t *src = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_model_src_open(IE_TEST_DATA "/tiny_gptoss.gguf", &src), IE_OK);
    ie_worker_t *w = make_src(src, IE_KV_F32, IE_KV_F32, IE_KV_ROTATE_AUTO, 0, 2);
    const size_t n = NTOK * (size_t)ie_worker_hparams(w)->n_vocab;
    CU_ASSERT(ie_worker_hparams(w)->sliding_window < NTOK);
    float *ref = run(w, 16);
    ie_worker_destroy(&w);
    double lmax = 0;
    for (size_t i = 0; i < n; i++) lmax = fmax(lmax, fabs(ref[i]));
    static const int chunks[] = {16, 1, 5};
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        w = make_src(src, IE_KV_F16, IE_KV_F16, IE_KV_ROTATE_ON, 3, 2);
        float *got = run(w, chunks[c]);
        const double d = max_diff(got, ref, n);
        CU_ASSERT(d < 2e-3 * lmax);
        if (d >= 2e-3 * lmax) fprintf(stderr, "  chunk %d: max diff %.3g of %.3g\n", chunks[c], d, lmax);
        free(got);
        ie_worker_destroy(&w);
    }
    /* the quantized types through the typed kernels, one token a step
     * (and 5: a decode over the window's rows, past its edge, and the
     * sinks), against the same cache read by a prefill (16 a step: the
     * rows decoded once, the f32 kernels). The random fixture amplifies a
     * q8 V's rounding far beyond its bound of f32 (a max diff of ~2.3 of
     * 3.8, the same before the typed kernels), so each type is held to its
     * own prefill here, not to f32. */
    static const ie_kv_type_t qt[][2] = {{IE_KV_Q8, IE_KV_Q8},
                                         {IE_KV_FP8_E4M3, IE_KV_FP8_E5M2},
                                         {IE_KV_BF16, IE_KV_F16},
                                         {IE_KV_F32, IE_KV_Q8}};
    for (size_t t = 0; t < sizeof qt / sizeof qt[0]; t++) {
        /* the typed kernels sum as the f32 kernels do, a q8 K is scored on
         * integers in both (measured: 0 to 4e-6 of the largest logit) */
        const double tol = 1e-4;
        w = make_src(src, qt[t][0], qt[t][1], IE_KV_ROTATE_AUTO, 3, 2);
        float *pre = run(w, 16);
        for (size_t c = 1; c < sizeof chunks / sizeof chunks[0]; c++) {
            float *got = run(w, chunks[c]);
            const double d = max_diff(got, pre, n);
            CU_ASSERT(d < tol * lmax);
            if (!(d < tol * lmax))
                fprintf(stderr, "  %s/%s chunk %d: max diff %.3g of %.3g\n", ie_kv_type_name(qt[t][0]),
                        ie_kv_type_name(qt[t][1]), chunks[c], d, lmax);
            free(got);
        }
        free(pre);
        ie_worker_destroy(&w);
    }
    free(ref);
    ie_model_src_destroy(&src);
}

/* Smoothing (kvq_smooths: rows from KVQ_SMOOTH_ROWS on stored less the
 * mean of the first rows, the mean added back when read). The fixture's
 * head of 16 values takes no q4, so FP8 K and V are smoothed through
 * IE_KV_SMOOTH=kv (the same code for every type): the mean rebuilt from
 * paged rows gives the bits of the contiguous cache for any block size; a
 * decode (q.m added to the scores, the weight of the later rows times m
 * added to the output) agrees with a prefill (m added to the decoded
 * rows) within summation order; the cache stays within FP8's bound of the
 * f32 cache and differs from the unsmoothed one (it is on). */
static void test_worker_smooth(void)
{
    CU_ASSERT(kvq_smooths(IE_KV_Q4, 0) && !kvq_smooths(IE_KV_Q4, 1) && !kvq_smooths(IE_KV_FP8_E4M3, 0) &&
              !kvq_smooths(IE_KV_Q8, 0));
    ie_worker_t *w = make(IE_KV_F32, IE_KV_F32, IE_KV_ROTATE_AUTO, 0, 2);
    const size_t n = NTOK * (size_t)ie_worker_hparams(w)->n_vocab;
    float *f32 = run(w, 16);
    ie_worker_destroy(&w);
    double lmax = 0;
    for (size_t i = 0; i < n; i++) lmax = fmax(lmax, fabs(f32[i]));
    w = make(IE_KV_FP8_E4M3, IE_KV_FP8_E4M3, IE_KV_ROTATE_AUTO, 0, 2);
    CU_ASSERT(!w->kv_smooth[0] && !w->kv_smooth[1]);
    float *plain = run(w, 16);
    ie_worker_destroy(&w);

    setenv("IE_KV_SMOOTH", "0", 1);
    CU_ASSERT(!kvq_smooths(IE_KV_Q4, 0));
    setenv("IE_KV_SMOOTH", "kv", 1);
    CU_ASSERT(kvq_smooths(IE_KV_Q4, 1) && kvq_smooths(IE_KV_FP8_E5M2, 0) && !kvq_smooths(IE_KV_Q8, 0));
    w = make(IE_KV_FP8_E4M3, IE_KV_FP8_E4M3, IE_KV_ROTATE_AUTO, 0, 2);
    CU_ASSERT(w->kv_smooth[0] && w->kv_smooth[1]);
    /* the mean's channels: dim 0 (RoPE's fastest pair, 1 rad a position)
     * left out, the last (the slowest pair) kept over 64 positions */
    const int hd0 = ie_worker_hparams(w)->head_dim;
    CU_ASSERT_FATAL(w->kv_smooth_keep != NULL);
    CU_ASSERT(!w->kv_smooth_keep[0] && w->kv_smooth_keep[hd0 - 1]);
    float *ref = run(w, 16);
    ie_worker_destroy(&w);
    const double ds = max_diff(ref, f32, n), dp = max_diff(plain, f32, n);
    CU_ASSERT(ds < 8e-2 * lmax);
    CU_ASSERT(max_diff(ref, plain, n) > 0);
    if (!(ds < 8e-2 * lmax))
        fprintf(stderr, "  smoothed fp8: max diff %.3g (unsmoothed %.3g) of %.3g\n", ds, dp, lmax);
    static const int blocks[] = {1, 3, 7, 64};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
        w = make(IE_KV_FP8_E4M3, IE_KV_FP8_E4M3, IE_KV_ROTATE_AUTO, blocks[i], 2);
        float *got = run(w, 16);
        CU_ASSERT_EQUAL(memcmp(got, ref, n * sizeof(float)), 0);
        free(got);
        static const int chunks[] = {1, 5};
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
            got = run(w, chunks[c]);
            const double d = max_diff(got, ref, n);
            CU_ASSERT(d < 1e-4 * lmax);
            if (!(d < 1e-4 * lmax))
                fprintf(stderr, "  smoothed, block %d chunk %d: max diff %.3g of %.3g\n", blocks[i], chunks[c], d,
                        lmax);
            free(got);
        }
        ie_worker_destroy(&w);
    }
    setenv("IE_KV_SMOOTH_ALL", "1", 1); /* every channel: no mask, other logits */
    w = make(IE_KV_FP8_E4M3, IE_KV_FP8_E4M3, IE_KV_ROTATE_AUTO, 3, 2);
    CU_ASSERT(w->kv_smooth_keep == NULL);
    float *all = run(w, 16), *all1 = run(w, 1);
    CU_ASSERT(max_diff(all, ref, n) > 0 && max_diff(all, f32, n) < 8e-2 * lmax);
    CU_ASSERT(max_diff(all1, all, n) < 1e-4 * lmax);
    free(all);
    free(all1);
    ie_worker_destroy(&w);
    unsetenv("IE_KV_SMOOTH_ALL");
    /* GPT-OSS: its sliding layers are left unsmoothed, the others not */
    ie_model_src_t *src = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_model_src_open(IE_TEST_DATA "/tiny_gptoss.gguf", &src), IE_OK);
    w = make_src(src, IE_KV_FP8_E4M3, IE_KV_FP8_E5M2, IE_KV_ROTATE_AUTO, 3, 2);
    const size_t ng = NTOK * (size_t)ie_worker_hparams(w)->n_vocab;
    float *pre = run(w, 16), *dec = run(w, 1);
    double gmax = 0;
    for (size_t i = 0; i < ng; i++) gmax = fmax(gmax, fabs(pre[i]));
    CU_ASSERT(max_diff(dec, pre, ng) < 1e-4 * gmax);
    free(pre);
    free(dec);
    ie_worker_destroy(&w);
    ie_model_src_destroy(&src);
    unsetenv("IE_KV_SMOOTH");
    free(ref);
    free(plain);
    free(f32);
}

/* The recent window and the sinks in f32 (kvq_recent: each token reads
 * the K rows of its last kvq_recent_len() positions and of the first
 * kvq_sinks() in f32). The fixture's heads take no q4, so an FP8 K through
 * IE_KV_RECENT=all, V f32. A window of NTOK rows reads every K row in f32:
 * the f32 cache's logits (within summation order) where the plain FP8 K's
 * are not. A window of 16, no sinks: the first 16 positions are the f32
 * cache's, the later ones closer to it than the plain FP8 K's (a sliding
 * window, not a block) and within FP8's bound; with 4 sinks the first 20.
 * A decode (the slot's ring, which wraps 2.5 times, and its sink rows)
 * agrees with a prefill (the step's copy) for any block size and step. */
static void test_worker_recent(void)
{
    CU_ASSERT(kvq_recent(IE_KV_Q4) && kvq_recent(IE_KV_FP8_E4M3) && !kvq_recent(IE_KV_FP8_E5M2) &&
              !kvq_recent(IE_KV_F32));
    CU_ASSERT(kvq_recent_len() == KVQ_RECENT);
    ie_worker_t *w = make(IE_KV_F32, IE_KV_F32, IE_KV_ROTATE_AUTO, 0, 2);
    const size_t nv = (size_t)ie_worker_hparams(w)->n_vocab, n = NTOK * nv;
    enum { WIN = 16 };
    const size_t nr = WIN * nv;
    float *f32 = run(w, 16);
    ie_worker_destroy(&w);
    double lmax = 0;
    for (size_t i = 0; i < n; i++) lmax = fmax(lmax, fabs(f32[i]));
    setenv("IE_KV_RECENT", "0", 1);
    CU_ASSERT(!kvq_recent(IE_KV_Q4) && !kvq_recent(IE_KV_FP8_E4M3));
    w = make(IE_KV_FP8_E4M3, IE_KV_F32, IE_KV_ROTATE_AUTO, 0, 2);
    CU_ASSERT(!w->kv_recent);
    float *plain = run(w, 16);
    ie_worker_destroy(&w);
    CU_ASSERT(max_diff(plain, f32, nr) > 1e-3 * lmax); /* FP8 rounding shows */

    setenv("IE_KV_RECENT", "all", 1);
    setenv("IE_KV_RECENT_W", "40", 1); /* NTOK: every row */
    w = make(IE_KV_FP8_E4M3, IE_KV_F32, IE_KV_ROTATE_AUTO, 0, 2);
    CU_ASSERT(w->kv_recent && w->k_recent_len == NTOK);
    float *all = run(w, 16);
    ie_worker_destroy(&w);
    const double da = max_diff(all, f32, n);
    CU_ASSERT(da < 1e-4 * lmax);
    if (!(da < 1e-4 * lmax)) fprintf(stderr, "  window of every row: max diff %.3g of %.3g\n", da, lmax);
    free(all);

    setenv("IE_KV_RECENT_W", "16", 1);
    setenv("IE_KV_SINKS", "0", 1); /* the window alone */
    w = make(IE_KV_FP8_E4M3, IE_KV_F32, IE_KV_ROTATE_AUTO, 0, 2);
    CU_ASSERT(w->kv_recent && w->k_recent_len == WIN && w->k_sinks == 0);
    float *ref = run(w, 16);
    ie_worker_destroy(&w);
    const double d0 = max_diff(ref, f32, nr), d1 = max_diff(ref + nr, f32 + nr, n - nr);
    const double p1 = max_diff(plain + nr, f32 + nr, n - nr);
    CU_ASSERT(d0 < 1e-4 * lmax);
    CU_ASSERT(d1 > 0 && d1 < 8e-2 * lmax && d1 < p1);
    if (!(d0 < 1e-4 * lmax))
        fprintf(stderr, "  recent window in f32: first rows' max diff %.3g of %.3g\n", d0, lmax);
    if (!(d1 < p1)) fprintf(stderr, "  recent window: later rows %.3g, plain FP8 %.3g\n", d1, p1);
    /* a sliding window, not a block of WIN: positions WIN+1 .. WIN+3 still
     * read rows from before WIN in f32 (a block would read only its own
     * 1..3 rows: measured as far off as the plain FP8 K, 0.0169 of 3.03
     * against 0.0166; the window 0.0079) */
    const double ds = max_diff(ref + (WIN + 1) * nv, f32 + (WIN + 1) * nv, 3 * nv);
    const double ps = max_diff(plain + (WIN + 1) * nv, f32 + (WIN + 1) * nv, 3 * nv);
    CU_ASSERT(ds < 0.7 * ps);
    if (!(ds < 0.7 * ps)) fprintf(stderr, "  recent window past its first block: %.3g, plain FP8 %.3g\n", ds, ps);
    /* and SINKS sinks: positions up to WIN + SINKS - 1 read every row in
     * f32 (rows 0 .. SINKS-1 as sinks, the rest in the window), so they
     * are the f32 cache's; position WIN + SINKS reads row SINKS in FP8 */
    enum { SINKS = 4 };
    unsetenv("IE_KV_SINKS");
    CU_ASSERT(kvq_sinks() == KVQ_SINKS);
    setenv("IE_KV_SINKS", "4", 1);
    w = make(IE_KV_FP8_E4M3, IE_KV_F32, IE_KV_ROTATE_AUTO, 0, 2);
    CU_ASSERT(w->k_sinks == SINKS);
    float *sk = run(w, 16);
    ie_worker_destroy(&w);
    const size_t ns = (WIN + SINKS) * nv;
    const double s0 = max_diff(sk, f32, ns), s1 = max_diff(sk + ns, f32 + ns, nv);
    CU_ASSERT(s0 < 1e-4 * lmax && s1 > 1e-6 * lmax && max_diff(ref, f32, ns) > 1e-3 * lmax);
    if (!(s0 < 1e-4 * lmax)) fprintf(stderr, "  sinks in f32: first rows' max diff %.3g of %.3g\n", s0, lmax);
    free(ref);
    ref = sk; /* the layouts below: window and sinks */
    /* their f32 rows reported (ie_kv_layout_t.recent_bytes): every slot,
     * held layer and KV head, window and sinks; none without them */
    const ie_hparams_t *hp = ie_model_src_hparams(g_src);
    ie_worker_opts_t o;
    ie_worker_opts_default(&o);
    o.n_seq = 3;
    o.kv_type_k = IE_KV_FP8_E4M3;
    ie_kv_layout_t ly;
    CU_ASSERT_EQUAL_FATAL(ie_worker_kv_layout(hp, NULL, &o, &ly), IE_OK);
    CU_ASSERT_EQUAL(ly.recent_bytes, (uint64_t)3 * hp->n_layer * (WIN + SINKS) * hp->n_head_kv * hp->head_dim * 4);
    o.kv_type_v = IE_KV_Q8; /* V's rows too */
    CU_ASSERT_EQUAL_FATAL(ie_worker_kv_layout(hp, NULL, &o, &ly), IE_OK);
    CU_ASSERT_EQUAL(ly.recent_bytes, (uint64_t)6 * hp->n_layer * (WIN + SINKS) * hp->n_head_kv * hp->head_dim * 4);
    o.kv_type_k = IE_KV_F32;
    CU_ASSERT_EQUAL_FATAL(ie_worker_kv_layout(hp, NULL, &o, &ly), IE_OK);
    CU_ASSERT_EQUAL(ly.recent_bytes, 0);
    /* a quantized V: its window and sinks in f32 too (kv_recent_v), so a
     * window of every row is the f32 cache's where the V window's absence
     * (the K's alone) is not */
    float *kvref = NULL;
    {
        setenv("IE_KV_RECENT_W", "40", 1);
        w = make(IE_KV_FP8_E4M3, IE_KV_FP8_E4M3, IE_KV_ROTATE_AUTO, 0, 2);
        CU_ASSERT(w->kv_recent && w->kv_recent_v);
        float *kv = run(w, 16);
        w->kv_recent_v = 0; /* the K's window alone */
        float *konly = run(w, 16);
        ie_worker_destroy(&w);
        const double dk = max_diff(kv, f32, n), dko = max_diff(konly, f32, n);
        CU_ASSERT(dk < 1e-4 * lmax && dko > 1e-3 * lmax);
        if (!(dk < 1e-4 * lmax))
            fprintf(stderr, "  K and V windows of every row: max diff %.3g of %.3g\n", dk, lmax);
        free(kv);
        free(konly);
        setenv("IE_KV_RECENT_W", "16", 1);
        w = make(IE_KV_FP8_E4M3, IE_KV_FP8_E4M3, IE_KV_ROTATE_AUTO, 0, 2);
        kvref = run(w, 16);
        ie_worker_destroy(&w);
    }
    static const int blocks[] = {1, 3, 64};
    static const int chunks[] = {16, 1, 5};
    for (int vq = 0; vq < 2; vq++) /* V f32, then FP8 with its window */
        for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
            w = make(IE_KV_FP8_E4M3, vq ? IE_KV_FP8_E4M3 : IE_KV_F32, IE_KV_ROTATE_AUTO, blocks[i], 2);
            for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
                float *got = run(w, chunks[c]);
                const double d = max_diff(got, vq ? kvref : ref, n);
                CU_ASSERT(d < 1e-4 * lmax);
                if (!(d < 1e-4 * lmax))
                    fprintf(stderr, "  recent window, V %s, block %d chunk %d: max diff %.3g of %.3g\n",
                            vq ? "fp8" : "f32", blocks[i], chunks[c], d, lmax);
                free(got);
            }
            ie_worker_destroy(&w);
        }
    free(kvref);
    unsetenv("IE_KV_RECENT_W");
    unsetenv("IE_KV_RECENT");
    free(ref);
    free(plain);
    free(f32);
}

/* A byte budget sizes the pool in blocks of the chosen types: a q8 cache
 * gets (4 hd) / (hd + 4) times the f32 cache's blocks; a budget with room
 * for no block is refused, one past the full pool capped to it, and a
 * block count given wins over the budget. */
static void test_worker_mem_budget(void)
{
    ie_worker_opts_t o;
    int blocks[2] = {0, 0};
    size_t per[2] = {0, 0};
    static const ie_kv_type_t types[2] = {IE_KV_F32, IE_KV_Q8};
    for (int t = 0; t < 2; t++) {
        ie_worker_opts_default(&o);
        o.n_ctx = 4096;
        o.n_seq = 4;
        o.pin_threads = 0;
        o.kv_type_k = o.kv_type_v = types[t];
        o.kv_mem_bytes = 1u << 20;
        ie_worker_t *w = NULL;
        CU_ASSERT_EQUAL_FATAL(ie_worker_new(g_src, &o, &w), IE_OK);
        blocks[t] = ie_worker_kv_blocks(w);
        per[t] = ie_worker_kv_bytes_per_pos(w) * (size_t)ie_worker_kv_block(w);
        CU_ASSERT_EQUAL(blocks[t], (int)((1u << 20) / per[t]));
        ie_worker_destroy(&w);
    }
    const int hd = ie_model_src_hparams(g_src)->head_dim;
    CU_ASSERT(blocks[1] >= blocks[0] * (4 * hd) / (hd + 4) - 1 && blocks[1] > 3 * blocks[0]);
    /* no block fits */
    ie_worker_opts_default(&o);
    o.pin_threads = 0;
    o.kv_mem_bytes = per[0] - 1;
    ie_worker_t *w = NULL;
    CU_ASSERT_EQUAL(ie_worker_new(g_src, &o, &w), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "holds no block"));
    /* past the full pool: capped; a block count wins */
    o.n_ctx = 64;
    o.kv_mem_bytes = (uint64_t)1 << 30;
    CU_ASSERT_EQUAL_FATAL(ie_worker_new(g_src, &o, &w), IE_OK);
    CU_ASSERT_EQUAL(ie_worker_kv_blocks(w), 64 / ie_worker_kv_block(w));
    ie_worker_destroy(&w);
    o.kv_blocks = 3;
    CU_ASSERT_EQUAL_FATAL(ie_worker_new(g_src, &o, &w), IE_OK);
    CU_ASSERT_EQUAL(ie_worker_kv_blocks(w), 3);
    ie_worker_destroy(&w);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("kvquant", suite_init, suite_clean);
    CU_add_test(s, "type names, head sizes, rotation switch", test_names);
    CU_add_test(s, "FWHT == dense Hadamard product", test_fwht_dense);
    CU_add_test(s, "codec round trips within bounds", test_codec_bounds);
    CU_add_test(s, "FP8 codes", test_fp8_codes);
    CU_add_test(s, "every ISA's decode == scalar decode", test_decode_twin);
    CU_add_test(s, "worker: each cache type close to f32", test_worker_types);
    CU_add_test(s, "worker: quantized cache bits independent of layout", test_worker_layouts);
    CU_add_test(s, "worker: GPT-OSS window edges and sinks, f16 and quantized caches", test_worker_gptoss_window);
    CU_add_test(s, "worker: pool sized by a byte budget", test_worker_mem_budget);
    CU_add_test(s, "worker: smoothed cache (rows less the first rows' mean)", test_worker_smooth);
    CU_add_test(s, "worker: recent window and sinks of K and V read in f32", test_worker_recent);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

/* test_sampler.c — CUnit suite for coordinator/src/sampler.c.
 *
 * Support tests draw many times and compare the set of ids seen with the
 * set the documented rule predicts; frequency tests compare empirical
 * frequencies with the softmax at a fixed seed (deterministic, with a wide
 * margin: 200k draws give a standard error near 0.001, the bound is 0.01).
 */
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ie_sampler.h"

/* ------------------------------------------------------------ helpers */

static ie_sampler_t *make(const ie_sampler_params_t *p, int32_t n_vocab)
{
    ie_sampler_t *s = NULL;
    ie_status_t st = ie_sampler_new(p, n_vocab, &s);
    CU_ASSERT_EQUAL_FATAL(st, IE_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    return s;
}

/* Draw `draws` times from the same logits; counts[id]++. Fails the test on
 * any error or out-of-range id. The logits are copied before each draw
 * (the sampler writes penalties into them), except for big vocabularies,
 * whose tests use no penalties, so the copy would only cost time. */
static void draw_counts(ie_sampler_t *s, const float *logits, int32_t n, int draws, long *counts)
{
    float *work = malloc((size_t)n * sizeof *work);
    CU_ASSERT_PTR_NOT_NULL_FATAL(work);
    CU_ASSERT_FATAL(n <= 4096 || ie_sampler_params(s)->repeat_penalty == 1.0f);
    memset(counts, 0, (size_t)n * sizeof *counts);
    memcpy(work, logits, (size_t)n * sizeof *work);
    for (int d = 0; d < draws; d++) {
        if (n <= 4096) memcpy(work, logits, (size_t)n * sizeof *work);
        int32_t id = -7;
        ie_status_t st = ie_sampler_sample(s, work, &id);
        CU_ASSERT_EQUAL_FATAL(st, IE_OK);
        CU_ASSERT_FATAL(id >= 0 && id < n);
        counts[id]++;
    }
    free(work);
}

/* The support seen must be exactly expect[0..n) (1 = must appear, 0 = must
 * never appear). */
static void check_support(const long *counts, const int *expect, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        if (expect[i] && counts[i] == 0) {
            fprintf(stderr, "\n  id %d expected in support, never drawn\n", (int)i);
            CU_FAIL("token missing from support");
        }
        if (!expect[i] && counts[i] != 0) {
            fprintf(stderr, "\n  id %d outside support, drawn %ld times\n", (int)i, counts[i]);
            CU_FAIL("token outside support");
        }
    }
}

static void softmax_ref(const float *l, int n, double temp, double *p)
{
    double m = -INFINITY, z = 0;
    for (int i = 0; i < n; i++) m = l[i] > m ? l[i] : m;
    for (int i = 0; i < n; i++) {
        p[i] = exp((l[i] - m) / temp);
        z += p[i];
    }
    for (int i = 0; i < n; i++) p[i] /= z;
}

/* Deterministic pseudo-random logits for big-vocabulary tests (an LCG,
 * independent of the sampler's PRNG); roughly normal with sd `scale`. */
static void fill_logits(float *l, int32_t n, uint32_t seed, float scale)
{
    uint32_t x = seed * 2654435761u + 1;
    for (int32_t i = 0; i < n; i++) {
        float acc = 0;
        for (int k = 0; k < 4; k++) {
            x = x * 1664525u + 1013904223u;
            acc += (float)(x >> 8) / 16777216.0f;
        }
        l[i] = (acc - 2.0f) * 1.7320508f * scale;
    }
}

typedef struct {
    float l;
    int32_t id;
} ref_rank_t;

static int ref_rank_cmp(const void *a, const void *b)
{
    const ref_rank_t *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return x->id < y->id ? -1 : 1;
}

/* Reference ranking of logits (best first, ties by id), by a full sort. */
static ref_rank_t *ref_rank(const float *l, int32_t n)
{
    ref_rank_t *r = malloc((size_t)n * sizeof *r);
    for (int32_t i = 0; i < n; i++) {
        r[i].l = l[i];
        r[i].id = i;
    }
    qsort(r, (size_t)n, sizeof *r, ref_rank_cmp);
    return r;
}

/* ------------------------------------------------------------- greedy */

static void test_greedy_argmax_and_ties(void)
{
    ie_sampler_params_t p = ie_sampler_params_default();
    p.greedy = 1;
    ie_sampler_t *s = make(&p, 6);
    float l1[6] = {0.1f, 3.0f, -2.0f, 2.9f, 3.0f, 1.0f}; /* tie 1 and 4 */
    int32_t id = -1;
    CU_ASSERT_EQUAL(ie_sampler_sample(s, l1, &id), IE_OK);
    CU_ASSERT_EQUAL(id, 1);
    float l2[6] = {-5, -5, -5, -5, -5, -5};
    CU_ASSERT_EQUAL(ie_sampler_sample(s, l2, &id), IE_OK);
    CU_ASSERT_EQUAL(id, 0);
    float l3[6] = {-5, -5, -5, -5, -5, 7};
    CU_ASSERT_EQUAL(ie_sampler_sample(s, l3, &id), IE_OK);
    CU_ASSERT_EQUAL(id, 5);
    ie_sampler_destroy(&s);
    CU_ASSERT_PTR_NULL(s);

    /* temperature 0 is greedy too, whatever the filters say */
    p = ie_sampler_params_default();
    p.temperature = 0.0f;
    p.top_k = 3;
    p.top_p = 0.5f;
    p.min_p = 0.2f;
    s = make(&p, 6);
    for (int i = 0; i < 100; i++) {
        float l[6] = {0.1f, 3.0f, -2.0f, 2.9f, 3.0f, 1.0f};
        CU_ASSERT_EQUAL(ie_sampler_sample(s, l, &id), IE_OK);
        CU_ASSERT_EQUAL(id, 1);
    }
    ie_sampler_destroy(&s);
}

/* The vectorized arg max against a scalar "first strict maximum" scan on
 * vocabularies of every size around the 16-lane blocks and a large one,
 * with ties across lanes and blocks, NaN, -inf and +inf sprinkled in. */
static void test_greedy_matches_scalar_scan(void)
{
    static const int sizes[] = {1, 2, 3, 15, 16, 17, 31, 32, 33, 47, 64, 65, 100, 49157};
    uint64_t st = 12345;
    int bad = 0, ran = 0;
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        const int n = sizes[z];
        ie_sampler_params_t p = ie_sampler_params_default();
        p.greedy = 1;
        ie_sampler_t *s = make(&p, n);
        float *l = malloc(sizeof(float) * (size_t)n), *c = malloc(sizeof(float) * (size_t)n);
        for (int trial = 0; trial < 60; trial++) {
            for (int i = 0; i < n; i++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                const unsigned r = (unsigned)(st >> 33);
                l[i] = (float)(r % 7) - 3.0f; /* few values: many ties */
                if (trial % 3 == 1 && r % 11 == 0) l[i] = NAN;
                if (trial % 3 == 2 && r % 13 == 0) l[i] = -INFINITY;
                if (trial % 20 == 19 && r % 97 == 0) l[i] = INFINITY;
            }
            if (trial == 5)
                for (int i = 0; i < n; i++) l[i] = i % 2 ? NAN : -INFINITY; /* nothing usable */
            int want = -1;
            float best = -INFINITY;
            for (int i = 0; i < n; i++)
                if (l[i] > best) best = l[i], want = i;
            memcpy(c, l, sizeof(float) * (size_t)n);
            int32_t id = -7;
            const ie_status_t rc = ie_sampler_sample(s, c, &id);
            if (want < 0) bad += !(rc == IE_ERR_RANGE && id == -1);
            else bad += !(rc == IE_OK && id == want);
            ran++;
        }
        free(l), free(c);
        ie_sampler_destroy(&s);
    }
    CU_ASSERT(ran == 60 * (int)(sizeof sizes / sizeof sizes[0]));
    CU_ASSERT_EQUAL(bad, 0);
}

/* --------------------------------------------------------- determinism */

/* 1000 draws from fixed logits over 50 tokens; mode 0: defaults, 1: top-p
 * and min-p, 2: top-k and top-p. */
static void draw_seq(uint64_t seed, int mode, int32_t *seq, int n_draws)
{
    ie_sampler_params_t p = ie_sampler_params_default();
    p.seed = seed;
    if (mode == 1) {
        p.top_p = 0.9f;
        p.min_p = 0.02f;
    } else if (mode == 2) {
        p.top_k = 20;
        p.top_p = 0.95f;
        p.temperature = 0.7f;
    }
    enum { V = 50 };
    ie_sampler_t *s = make(&p, V);
    float base[V];
    for (int i = 0; i < V; i++) base[i] = (float)(i % 7) * 0.3f;
    for (int d = 0; d < n_draws; d++) {
        float l[V];
        memcpy(l, base, sizeof l);
        CU_ASSERT_EQUAL(ie_sampler_sample(s, l, &seq[d]), IE_OK);
    }
    ie_sampler_destroy(&s);
}

static void test_seed_reproducible(void)
{
    enum { N = 1000 };
    static int32_t a[N], b[N], c[N], z[N], z2[N];
    for (int mode = 0; mode < 3; mode++) {
        draw_seq(12345, mode, a, N);
        draw_seq(12345, mode, b, N);
        draw_seq(12346, mode, c, N);
        draw_seq(0, mode, z, N); /* seed 0 is an ordinary seed */
        draw_seq(0, mode, z2, N);
        CU_ASSERT_EQUAL(memcmp(a, b, sizeof a), 0);
        CU_ASSERT_EQUAL(memcmp(z, z2, sizeof z), 0);
        int diff_c = 0, diff_z = 0;
        for (int i = 0; i < N; i++) {
            diff_c += a[i] != c[i];
            diff_z += a[i] != z[i];
        }
        /* unrelated streams over >= 14 likely tokens differ most of the time */
        CU_ASSERT(diff_c > N / 2);
        CU_ASSERT(diff_z > N / 2);
    }

    /* random seeds differ from call to call */
    uint64_t r1 = ie_sampler_seed_random(), r2 = ie_sampler_seed_random();
    CU_ASSERT(r1 != r2);
}

static void test_reset_replays(void)
{
    ie_sampler_params_t p = ie_sampler_params_default();
    p.seed = 99;
    p.repeat_penalty = 1.3f;
    enum { V = 20, N = 200 };
    ie_sampler_t *s = make(&p, V);
    int32_t a[N], b[N];
    for (int pass = 0; pass < 2; pass++) {
        int32_t *seq = pass ? b : a;
        for (int d = 0; d < N; d++) {
            float l[V];
            for (int i = 0; i < V; i++) l[i] = (float)(i % 5);
            CU_ASSERT_EQUAL(ie_sampler_sample(s, l, &seq[d]), IE_OK);
            CU_ASSERT_EQUAL(ie_sampler_accept(s, seq[d]), IE_OK);
        }
        ie_sampler_reset(s);
    }
    CU_ASSERT_EQUAL(memcmp(a, b, sizeof a), 0);
    ie_sampler_destroy(&s);
}

/* ---------------------------------------------------------- frequencies */

static void test_frequencies_match_softmax(void)
{
    enum { V = 5, DRAWS = 200000 };
    const float logits[V] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
    const double temps[3] = {1.0, 0.7, 2.0};
    for (int t = 0; t < 3; t++) {
        ie_sampler_params_t p = ie_sampler_params_default();
        p.temperature = (float)temps[t];
        p.seed = 2024;
        ie_sampler_t *s = make(&p, V);
        long counts[V];
        double ref[V];
        draw_counts(s, logits, V, DRAWS, counts);
        softmax_ref(logits, V, temps[t], ref);
        for (int i = 0; i < V; i++) {
            double f = (double)counts[i] / DRAWS;
            CU_ASSERT_DOUBLE_EQUAL(f, ref[i], 0.01);
        }
        ie_sampler_destroy(&s);
    }
}

static void test_temperature_extremes(void)
{
    enum { V = 5, DRAWS = 100000 };
    /* near 0: behaves greedy */
    ie_sampler_params_t p = ie_sampler_params_default();
    p.temperature = 1e-4f;
    ie_sampler_t *s = make(&p, V);
    const float l[V] = {1.0f, 1.1f, 0.9f, 1.05f, -3.0f};
    long counts[V];
    draw_counts(s, l, V, 2000, counts);
    CU_ASSERT_EQUAL(counts[1], 2000);
    ie_sampler_destroy(&s);

    /* tinier still: (l - max)/T must not turn into NaN */
    p.temperature = 1e-38f;
    s = make(&p, V);
    draw_counts(s, l, V, 500, counts);
    CU_ASSERT_EQUAL(counts[1], 500);
    ie_sampler_destroy(&s);

    /* high temperature: nearly uniform */
    p.temperature = 1e4f;
    s = make(&p, V);
    const float l2[V] = {5.0f, -3.0f, 0.0f, 2.0f, 1.0f};
    draw_counts(s, l2, V, DRAWS, counts);
    for (int i = 0; i < V; i++) CU_ASSERT_DOUBLE_EQUAL((double)counts[i] / DRAWS, 0.2, 0.01);
    ie_sampler_destroy(&s);
}

/* --------------------------------------------------------------- top-k */

static void test_top_k_support(void)
{
    enum { V = 100 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)((i * 37) % V) * 0.01f; /* a permutation of 0..0.99 */
    ie_sampler_params_t p = ie_sampler_params_default();
    p.top_k = 5;
    p.temperature = 50.0f; /* flat, so all 5 show up */
    ie_sampler_t *s = make(&p, V);
    long counts[V];
    int expect[V];
    draw_counts(s, l, V, 5000, counts);
    for (int i = 0; i < V; i++) expect[i] = l[i] >= 0.95f - 1e-6f;
    check_support(counts, expect, V);
    ie_sampler_destroy(&s);

    /* all tied: the k lowest ids */
    float flat[V];
    for (int i = 0; i < V; i++) flat[i] = 0.25f;
    p.top_k = 3;
    p.temperature = 1.0f;
    s = make(&p, V);
    draw_counts(s, flat, V, 3000, counts);
    for (int i = 0; i < V; i++) expect[i] = i < 3;
    check_support(counts, expect, V);
    ie_sampler_destroy(&s);

    /* top_k = 1 is greedy; top_k >= V is off */
    p.top_k = 1;
    s = make(&p, V);
    draw_counts(s, l, V, 500, counts);
    for (int i = 0; i < V; i++) expect[i] = l[i] >= 0.99f - 1e-6f;
    check_support(counts, expect, V);
    ie_sampler_destroy(&s);
    p.top_k = 1000;
    p.temperature = 1000.0f;
    s = make(&p, V);
    draw_counts(s, l, V, 20000, counts);
    for (int i = 0; i < V; i++) expect[i] = 1;
    check_support(counts, expect, V);
    ie_sampler_destroy(&s);
}

static void test_top_k_large_vocab(void)
{
    const int32_t V = 200000;
    const int K = 40;
    float *l = malloc((size_t)V * sizeof *l);
    long *counts = malloc((size_t)V * sizeof *counts);
    int *expect = calloc((size_t)V, sizeof *expect);
    fill_logits(l, V, 7, 3.0f);
    /* plant ties at the top-k boundary */
    ref_rank_t *r = ref_rank(l, V);
    float boundary = r[K - 1].l;
    free(r);
    l[5] = boundary;
    l[V - 3] = boundary;
    r = ref_rank(l, V);
    for (int i = 0; i < K; i++) expect[r[i].id] = 1;
    free(r);

    ie_sampler_params_t p = ie_sampler_params_default();
    p.top_k = K;
    p.temperature = 100.0f;
    p.seed = 5;
    ie_sampler_t *s = make(&p, V);
    draw_counts(s, l, V, 4000, counts);
    check_support(counts, expect, V);
    ie_sampler_destroy(&s);
    free(l);
    free(counts);
    free(expect);
}

/* --------------------------------------------------------------- top-p */

/* Probabilities 0.5, 0.25, 0.125, 0.125 at temperature 1. */
static const float k_dyadic[4] = {1.38629436f, 0.69314718f, 0.0f, 0.0f};

static void support_for(const ie_sampler_params_t *p, const float *l, int32_t n, const int *expect)
{
    ie_sampler_t *s = make(p, n);
    long counts[64];
    CU_ASSERT_FATAL(n <= 64);
    draw_counts(s, l, n, 4000, counts);
    check_support(counts, expect, n);
    ie_sampler_destroy(&s);
}

static void test_top_p_boundaries(void)
{
    ie_sampler_params_t p = ie_sampler_params_default();
    struct {
        float top_p;
        int expect[4];
    } cases[] = {
        {0.01f, {1, 0, 0, 0}},   {0.5f, {1, 0, 0, 0}},  /* exactly reached by the first token */
        {0.5001f, {1, 1, 0, 0}}, {0.75f, {1, 1, 0, 0}}, /* exactly reached by two */
        {0.751f, {1, 1, 1, 0}},                         /* tie 2/3: lower id ranks first */
        {0.875f, {1, 1, 1, 0}},  {0.876f, {1, 1, 1, 1}}, {1.0f, {1, 1, 1, 1}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        p.top_p = cases[i].top_p;
        support_for(&p, k_dyadic, 4, cases[i].expect);
    }

    /* frequencies inside the kept set are renormalized: p=0.75 keeps
     * {0.5, 0.25} -> {2/3, 1/3} */
    p.top_p = 0.75f;
    p.seed = 77;
    ie_sampler_t *s = make(&p, 4);
    long counts[4];
    draw_counts(s, k_dyadic, 4, 100000, counts);
    CU_ASSERT_DOUBLE_EQUAL(counts[0] / 100000.0, 2.0 / 3.0, 0.01);
    CU_ASSERT_DOUBLE_EQUAL(counts[1] / 100000.0, 1.0 / 3.0, 0.01);
    ie_sampler_destroy(&s);

    /* top-p acts at the temperature: at T=2 probabilities are
     * ∝ 2, sqrt2, 1, 1 -> 0.3694, 0.2612, 0.1847, 0.1847; 0.6 needs two */
    p.temperature = 2.0f;
    p.top_p = 0.6f;
    int e2[4] = {1, 1, 0, 0};
    support_for(&p, k_dyadic, 4, e2);
    p.top_p = 0.64f;
    int e3[4] = {1, 1, 1, 0};
    support_for(&p, k_dyadic, 4, e3);
}

/* Large vocabulary: the sampler's histogram cuts must keep exactly the
 * prefix a full sort predicts. A block of ~500 boosted tokens holds most of
 * the mass, so the kept set is a few hundred tokens: more than one final
 * sort handles, with the boundary inside a dense region. */
static void test_top_p_large_vocab(void)
{
    const int32_t V = 200000;
    float *l = malloc((size_t)V * sizeof *l);
    long *counts = malloc((size_t)V * sizeof *counts);
    int *expect = calloc((size_t)V, sizeof *expect);
    fill_logits(l, V, 11, 2.5f);
    for (int32_t i = 7; i < V; i += 397) l[i] = 12.0f + 0.3f * l[i];
    const float top_p = 0.9f;

    ref_rank_t *r = ref_rank(l, V);
    double m = r[0].l, z = 0, cum = 0;
    for (int32_t i = 0; i < V; i++) z += exp(r[i].l - m);
    int32_t kept = 0;
    while (kept < V && cum < top_p * z) {
        cum += exp(r[kept].l - m);
        kept++;
    }
    for (int32_t i = 0; i < kept; i++) expect[r[i].id] = 1;
    CU_ASSERT(kept > 256);
    CU_ASSERT(kept < 500);

    ie_sampler_params_t p = ie_sampler_params_default();
    p.top_p = top_p;
    p.seed = 3;
    ie_sampler_t *s = make(&p, V);
    draw_counts(s, l, V, 4000, counts);
    /* Nothing outside the predicted set is ever drawn, and much of it is
     * seen (its rarest members are individually unlikely in 4000 draws). */
    long outside = 0, seen = 0;
    for (int32_t i = 0; i < V; i++) {
        if (!expect[i]) outside += counts[i];
        else seen += counts[i] > 0;
    }
    CU_ASSERT_EQUAL(outside, 0);
    CU_ASSERT(seen > kept / 2);
    ie_sampler_destroy(&s);

    /* all tied: the lower half of the ids carries exactly half the mass */
    for (int32_t i = 0; i < V; i++) l[i] = 1.5f;
    p.top_p = 0.5f;
    s = make(&p, V);
    draw_counts(s, l, V, 40, counts);
    long high = 0;
    for (int32_t i = V / 2; i < V; i++) high += counts[i];
    CU_ASSERT_EQUAL(high, 0);
    ie_sampler_destroy(&s);
    free(r);
    free(l);
    free(counts);
    free(expect);
}

/* top-k larger than the number of 64-token groups, and top-k when fewer
 * groups than k hold a usable logit: both take the histogram route. */
static void test_top_k_histogram_route(void)
{
    enum { V = 6400, K = 150 }; /* 100 groups */
    static float l[V];
    static long counts[V];
    static int expect[V];
    fill_logits(l, V, 21, 2.0f);
    ref_rank_t *r = ref_rank(l, V);
    memset(expect, 0, sizeof expect);
    for (int i = 0; i < K; i++) expect[r[i].id] = 1;
    free(r);
    ie_sampler_params_t p = ie_sampler_params_default();
    p.top_k = K;
    p.temperature = 1000.0f;
    ie_sampler_t *s = make(&p, V);
    draw_counts(s, l, V, 6000, counts);
    check_support(counts, expect, V);

    /* usable logits only in groups 0, 10 and 99 (60 of them); NaN and -inf
     * elsewhere; top-k 100 keeps all 60 */
    for (int i = 0; i < V; i++) l[i] = (i % 2) ? NAN : -INFINITY;
    memset(expect, 0, sizeof expect);
    const int groups[3] = {0, 10, 99};
    for (int g = 0; g < 3; g++) {
        for (int j = 0; j < 20; j++) {
            const int id = groups[g] * 64 + j * 3;
            l[id] = (float)(j % 5);
            expect[id] = 1;
        }
    }
    ie_sampler_destroy(&s);
    p.top_k = 100;
    p.temperature = 100.0f;
    s = make(&p, V);
    draw_counts(s, l, V, 3000, counts);
    check_support(counts, expect, V);
    ie_sampler_destroy(&s);
}

/* --------------------------------------------------------------- min-p */

static void test_min_p(void)
{
    ie_sampler_params_t p = ie_sampler_params_default();
    struct {
        float min_p;
        int expect[4];
    } cases[] = {
        {0.0f, {1, 1, 1, 1}},  {0.24f, {1, 1, 1, 1}}, {0.26f, {1, 1, 0, 0}},
        {0.49f, {1, 1, 0, 0}}, {0.51f, {1, 0, 0, 0}}, {1.0f, {1, 0, 0, 0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        p.min_p = cases[i].min_p;
        support_for(&p, k_dyadic, 4, cases[i].expect);
    }
    /* with top-p as well (min-p runs on the sorted top-p prefix) */
    p.top_p = 0.9f; /* keeps all four */
    p.min_p = 0.3f;
    int e1[4] = {1, 1, 0, 0};
    support_for(&p, k_dyadic, 4, e1);
    p.top_p = 0.6f; /* keeps two */
    p.min_p = 0.1f;
    support_for(&p, k_dyadic, 4, e1);
    /* with top-k */
    p = ie_sampler_params_default();
    p.top_k = 3;
    p.min_p = 0.2f;
    int e2[4] = {1, 1, 1, 0};
    support_for(&p, k_dyadic, 4, e2);
    /* min-p at the temperature: T=2 makes ratios 1, .707, .5, .5 */
    p = ie_sampler_params_default();
    p.temperature = 2.0f;
    p.min_p = 0.6f;
    support_for(&p, k_dyadic, 4, e1);
    p.min_p = 0.49f;
    int e4[4] = {1, 1, 1, 1};
    support_for(&p, k_dyadic, 4, e4);
}

/* ----------------------------------------------------------- penalties */

static void test_penalties_exact(void)
{
    ie_sampler_params_t p = ie_sampler_params_default();
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    ie_sampler_t *s = make(&p, 6);
    const int32_t hist[] = {0, 1, 1, 2, 5};
    for (size_t i = 0; i < sizeof hist / sizeof hist[0]; i++) CU_ASSERT_EQUAL(ie_sampler_accept(s, hist[i]), IE_OK);

    float l[6] = {2.0f, -2.0f, 0.5f, 3.0f, -1.0f, 0.0f};
    const float want[6] = {
        2.0f / 2 - (1 * 0.5f + 0.25f),  /* 0.25  */
        -2.0f * 2 - (2 * 0.5f + 0.25f), /* -5.25 */
        0.5f / 2 - (1 * 0.5f + 0.25f),  /* -0.5  */
        3.0f,                           /* not in history */
        -1.0f,                          /* not in history */
        0.0f * 2 - (1 * 0.5f + 0.25f),  /* -0.75: 0 counts as "not > 0" */
    };
    ie_sampler_apply_penalties(s, l);
    for (int i = 0; i < 6; i++) CU_ASSERT_EQUAL(l[i], want[i]);
    /* applying twice to fresh logits gives the same result: state intact */
    float l2[6] = {2.0f, -2.0f, 0.5f, 3.0f, -1.0f, 0.0f};
    ie_sampler_apply_penalties(s, l2);
    CU_ASSERT_EQUAL(memcmp(l, l2, sizeof l), 0);
    /* sample() writes the same penalized values back */
    float l3[6] = {2.0f, -2.0f, 0.5f, 3.0f, -1.0f, 0.0f};
    int32_t id = -1;
    CU_ASSERT_EQUAL(ie_sampler_sample(s, l3, &id), IE_OK);
    CU_ASSERT_EQUAL(memcmp(l, l3, sizeof l), 0);

    /* reset forgets history */
    ie_sampler_reset(s);
    float l4[6] = {2.0f, -2.0f, 0.5f, 3.0f, -1.0f, 0.0f};
    ie_sampler_apply_penalties(s, l4);
    CU_ASSERT_EQUAL(l4[0], 2.0f);
    CU_ASSERT_EQUAL(l4[1], -2.0f);
    ie_sampler_destroy(&s);

    /* frequency only and presence only */
    p = ie_sampler_params_default();
    p.frequency_penalty = 0.5f;
    s = make(&p, 3);
    ie_sampler_accept(s, 1);
    ie_sampler_accept(s, 1);
    ie_sampler_accept(s, 1);
    float f[3] = {1.0f, 1.0f, 1.0f};
    ie_sampler_apply_penalties(s, f);
    CU_ASSERT_EQUAL(f[0], 1.0f);
    CU_ASSERT_EQUAL(f[1], -0.5f);
    ie_sampler_destroy(&s);
    p = ie_sampler_params_default();
    p.presence_penalty = -0.5f; /* negative encourages repetition */
    s = make(&p, 3);
    ie_sampler_accept(s, 2);
    ie_sampler_accept(s, 2);
    float q[3] = {1.0f, 1.0f, 1.0f};
    ie_sampler_apply_penalties(s, q);
    CU_ASSERT_EQUAL(q[2], 1.5f);
    CU_ASSERT_EQUAL(q[0], 1.0f);
    ie_sampler_destroy(&s);
}

/* Logit bias (step 0): added before the penalties and written back; the
 * sampler keeps its own copy; greedy follows it, -inf bans, a sampled
 * distribution is the softmax of the biased logits; ids outside the
 * vocabulary and NaN biases are refused; any bias ends arg-max-only. */
static void test_logit_bias(void)
{
    enum { V = 5, DRAWS = 200000 };
    const float logits[V] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
    ie_logit_bias_t b[3] = {{3, 4.0f}, {1, -0.5f}, {1, -0.25f}}; /* id 1 twice: both add */
    ie_sampler_params_t p = ie_sampler_params_default();
    p.greedy = 1;
    ie_sampler_t *s = make(&p, V);
    CU_ASSERT_TRUE(ie_sampler_argmax_only(s));
    ie_sampler_destroy(&s);
    p.logit_bias = b;
    p.n_logit_bias = 3;
    s = make(&p, V);
    CU_ASSERT_FALSE(ie_sampler_argmax_only(s));
    b[0].bias = -100.0f; /* the caller's array may change after new */
    float l[V];
    memcpy(l, logits, sizeof l);
    int32_t id = -1;
    CU_ASSERT_EQUAL(ie_sampler_sample(s, l, &id), IE_OK);
    CU_ASSERT_EQUAL(id, 3); /* -1 + 4 = 3 beats 2 - 0.75 */
    CU_ASSERT_EQUAL(l[3], 3.0f);
    CU_ASSERT_EQUAL(l[1], 1.25f);
    CU_ASSERT_EQUAL(l[0], 1.0f);
    CU_ASSERT_EQUAL(ie_sampler_params(s)->n_logit_bias, 3);
    CU_ASSERT_EQUAL(ie_sampler_params(s)->logit_bias[0].bias, 4.0f);
    ie_sampler_destroy(&s);

    /* bias first, then the penalties (llama.cpp's and vLLM's order) */
    ie_logit_bias_t one = {0, 1.0f};
    p = ie_sampler_params_default();
    p.repeat_penalty = 2.0f;
    p.logit_bias = &one;
    p.n_logit_bias = 1;
    s = make(&p, V);
    ie_sampler_accept(s, 0);
    memcpy(l, logits, sizeof l);
    CU_ASSERT_EQUAL(ie_sampler_sample(s, l, &id), IE_OK);
    CU_ASSERT_EQUAL(l[0], (1.0f + 1.0f) / 2.0f);
    ie_sampler_destroy(&s);

    /* -inf bans the best token; sampled: the softmax of the biased row */
    ie_logit_bias_t ban[2] = {{1, -INFINITY}, {2, 1.0f}};
    p = ie_sampler_params_default();
    p.seed = 77;
    p.logit_bias = ban;
    p.n_logit_bias = 2;
    s = make(&p, V);
    long counts[V];
    double ref[V];
    float biased[V];
    memcpy(biased, logits, sizeof biased);
    biased[1] = -INFINITY;
    biased[2] += 1.0f;
    draw_counts(s, logits, V, DRAWS, counts);
    softmax_ref(biased, V, 1.0, ref);
    CU_ASSERT_EQUAL(counts[1], 0);
    for (int i = 0; i < V; i++) CU_ASSERT_DOUBLE_EQUAL((double)counts[i] / DRAWS, ref[i], 0.01);
    ie_sampler_destroy(&s);

    /* refused: an id outside the vocabulary (at new), a NaN bias, a count without entries */
    ie_logit_bias_t out = {V, 1.0f}, neg = {-1, 1.0f}, nan_b = {0, NAN};
    ie_sampler_t *bad = NULL;
    p = ie_sampler_params_default();
    p.logit_bias = &out;
    p.n_logit_bias = 1;
    CU_ASSERT_EQUAL(ie_sampler_new(&p, V, &bad), IE_ERR_RANGE);
    CU_ASSERT_PTR_NULL(bad);
    p.logit_bias = &neg;
    CU_ASSERT_EQUAL(ie_sampler_new(&p, V, &bad), IE_ERR_RANGE);
    p.logit_bias = &nan_b;
    CU_ASSERT_EQUAL(ie_sampler_params_validate(&p), IE_ERR_INVAL);
    p.logit_bias = NULL;
    CU_ASSERT_EQUAL(ie_sampler_params_validate(&p), IE_ERR_INVAL);
    p.n_logit_bias = -1;
    CU_ASSERT_EQUAL(ie_sampler_params_validate(&p), IE_ERR_INVAL);
}

/* llama.cpp's --logit-bias form. */
static void test_logit_bias_parse(void)
{
    ie_logit_bias_t b = {-7, 0};
    CU_ASSERT_EQUAL(ie_logit_bias_parse("15043+1", &b), IE_OK);
    CU_ASSERT(b.id == 15043 && b.bias == 1.0f);
    CU_ASSERT_EQUAL(ie_logit_bias_parse("0-2.5", &b), IE_OK);
    CU_ASSERT(b.id == 0 && b.bias == -2.5f);
    CU_ASSERT_EQUAL(ie_logit_bias_parse("7-inf", &b), IE_OK);
    CU_ASSERT(b.id == 7 && isinf(b.bias) && b.bias < 0);
    static const char *const bad[] = {
        "", "+1", "-3+1", "12", "12+", "12+x", "12+1x", "a+1", "12+nan", " 12+1", "99999999999999+1", "12*1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        b = (ie_logit_bias_t){-7, 0};
        CU_ASSERT_EQUAL(ie_logit_bias_parse(bad[i], &b), IE_ERR_INVAL);
        CU_ASSERT_EQUAL(b.id, -7);
    }
    CU_ASSERT_EQUAL(ie_logit_bias_parse(NULL, &b), IE_ERR_INVAL);
}

static void test_penalty_window(void)
{
    ie_sampler_params_t p = ie_sampler_params_default();
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 1.0f;
    p.repeat_last_n = 3;
    ie_sampler_t *s = make(&p, 5);
    const int32_t hist[] = {0, 1, 2, 2, 3}; /* window = {2, 2, 3} */
    for (size_t i = 0; i < sizeof hist / sizeof hist[0]; i++) CU_ASSERT_EQUAL(ie_sampler_accept(s, hist[i]), IE_OK);
    float l[5] = {4.0f, 4.0f, 4.0f, 4.0f, 4.0f};
    ie_sampler_apply_penalties(s, l);
    CU_ASSERT_EQUAL(l[0], 4.0f);
    CU_ASSERT_EQUAL(l[1], 4.0f);
    CU_ASSERT_EQUAL(l[2], 4.0f / 2 - 2 * 1.0f);
    CU_ASSERT_EQUAL(l[3], 4.0f / 2 - 1 * 1.0f);
    CU_ASSERT_EQUAL(l[4], 4.0f);
    ie_sampler_destroy(&s);

    /* window 0: no penalties at all */
    p.repeat_last_n = 0;
    s = make(&p, 5);
    CU_ASSERT_EQUAL(ie_sampler_accept(s, 1), IE_OK);
    float l2[5] = {4.0f, 4.0f, 4.0f, 4.0f, 4.0f};
    ie_sampler_apply_penalties(s, l2);
    CU_ASSERT_EQUAL(l2[1], 4.0f);
    ie_sampler_destroy(&s);

    /* penalty flips the greedy choice */
    p = ie_sampler_params_default();
    p.greedy = 1;
    p.repeat_penalty = 2.0f;
    s = make(&p, 2);
    float g[2] = {1.0f, 0.9f};
    int32_t id = -1;
    CU_ASSERT_EQUAL(ie_sampler_sample(s, g, &id), IE_OK);
    CU_ASSERT_EQUAL(id, 0);
    ie_sampler_accept(s, 0);
    float g2[2] = {1.0f, 0.9f};
    CU_ASSERT_EQUAL(ie_sampler_sample(s, g2, &id), IE_OK);
    CU_ASSERT_EQUAL(id, 1);
    ie_sampler_destroy(&s);
}

/* ---------------------------------------------------------- validation */

static void expect_inval(const ie_sampler_params_t *p)
{
    ie_sampler_t *s = (ie_sampler_t *)1;
    ie_error_clear();
    CU_ASSERT_EQUAL(ie_sampler_new(p, 10, &s), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(s);
    CU_ASSERT(strlen(ie_error_last()) > 0);
}

static void test_invalid_params(void)
{
    ie_sampler_params_t p;
    p = ie_sampler_params_default();
    p.temperature = -0.1f;
    expect_inval(&p);
    p = ie_sampler_params_default();
    p.temperature = NAN;
    expect_inval(&p);
    p = ie_sampler_params_default();
    p.temperature = INFINITY;
    expect_inval(&p);
    p = ie_sampler_params_default();
    p.top_k = -1;
    expect_inval(&p);
    p = ie_sampler_params_default();
    p.top_p = 0.0f;
    expect_inval(&p);
    p = ie_sampler_params_default();
    p.top_p = 1.01f;
    expect_inval(&p);
    p = ie_sampler_params_default();
    p.top_p = NAN;
    expect_inval(&p);
    p = ie_sampler_params_default();
    p.min_p = -0.01f;
    expect_inval(&p);
    p = ie_sampler_params_default();
    p.min_p = 1.5f;
    expect_inval(&p);
    p = ie_sampler_params_default();
    p.repeat_penalty = 0.0f;
    expect_inval(&p);
    p = ie_sampler_params_default();
    p.repeat_penalty = -1.0f;
    expect_inval(&p);
    p = ie_sampler_params_default();
    p.repeat_last_n = -1;
    expect_inval(&p);
    p = ie_sampler_params_default();
    p.frequency_penalty = NAN;
    expect_inval(&p);
    p = ie_sampler_params_default();
    p.presence_penalty = INFINITY;
    expect_inval(&p);
    expect_inval(NULL);

    p = ie_sampler_params_default();
    ie_sampler_t *s = NULL;
    CU_ASSERT_EQUAL(ie_sampler_new(&p, 0, &s), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(s);
    CU_ASSERT_EQUAL(ie_sampler_new(&p, 10, NULL), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_sampler_params_validate(&p), IE_OK);

    s = make(&p, 10);
    CU_ASSERT_EQUAL(ie_sampler_accept(s, 10), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_sampler_accept(s, -1), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_sampler_accept(s, 9), IE_OK);
    int32_t id = 3;
    CU_ASSERT_EQUAL(ie_sampler_sample(s, NULL, &id), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(id, -1);
    CU_ASSERT_EQUAL(ie_sampler_params(s)->repeat_last_n, 64);
    ie_sampler_destroy(&s);
    ie_sampler_destroy(&s); /* NULL is fine */
    ie_sampler_destroy(NULL);

    /* a one-token vocabulary works on every path */
    for (int mode = 0; mode < 4; mode++) {
        p = ie_sampler_params_default();
        p.greedy = mode == 0;
        p.top_k = mode == 2 ? 1 : 0;
        p.top_p = mode == 3 ? 0.5f : 1.0f;
        p.min_p = mode == 3 ? 0.5f : 0.0f;
        s = make(&p, 1);
        float one = -3.0f;
        id = -1;
        CU_ASSERT_EQUAL(ie_sampler_sample(s, &one, &id), IE_OK);
        CU_ASSERT_EQUAL(id, 0);
        ie_sampler_destroy(&s);
    }
}

/* ----------------------------------------------------------- non-finite */

static void test_nonfinite_logits(void)
{
    enum { V = 6 };
    for (int greedy = 0; greedy <= 1; greedy++) {
        ie_sampler_params_t p = ie_sampler_params_default();
        p.greedy = greedy;
        p.top_p = greedy ? 1.0f : 0.99f;
        ie_sampler_t *s = make(&p, V);
        long counts[V];

        /* NaN and -inf are never picked */
        const float a[V] = {NAN, 1.0f, -INFINITY, 0.5f, NAN, 0.9f};
        draw_counts(s, a, V, 2000, counts);
        CU_ASSERT_EQUAL(counts[0] + counts[2] + counts[4], 0);
        if (greedy) { CU_ASSERT_EQUAL(counts[1], 2000); }

        /* +inf takes all the mass; two of them share it */
        const float b[V] = {1.0f, INFINITY, 3.0f, NAN, INFINITY, -INFINITY};
        draw_counts(s, b, V, 2000, counts);
        CU_ASSERT_EQUAL(counts[1] + counts[4], 2000);
        if (greedy) {
            CU_ASSERT_EQUAL(counts[1], 2000);
        } else {
            CU_ASSERT(counts[1] > 500 && counts[4] > 500);
        }

        /* nothing usable: an error and id -1, no crash */
        float c[V] = {NAN, NAN, -INFINITY, NAN, NAN, -INFINITY};
        int32_t id = 0;
        CU_ASSERT_EQUAL(ie_sampler_sample(s, c, &id), IE_ERR_RANGE);
        CU_ASSERT_EQUAL(id, -1);

        /* huge finite logits of both signs */
        const float d[V] = {-3.4e38f, 3.4e38f, 0.0f, 3.3e38f, -1.0f, 1.0f};
        draw_counts(s, d, V, 500, counts);
        CU_ASSERT_EQUAL(counts[1], 500);
        ie_sampler_destroy(&s);
    }

    /* penalties on NaN/inf entries do not break anything */
    ie_sampler_params_t p = ie_sampler_params_default();
    p.repeat_penalty = 1.5f;
    p.frequency_penalty = 0.5f;
    ie_sampler_t *s = make(&p, V);
    for (int i = 0; i < V; i++) ie_sampler_accept(s, i);
    long counts[V];
    const float e[V] = {NAN, 2.0f, INFINITY, -INFINITY, 0.0f, NAN};
    draw_counts(s, e, V, 500, counts);
    CU_ASSERT_EQUAL(counts[2], 500);
    ie_sampler_destroy(&s);
}

/* ---------------------------------------------------------------- main */

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return (int)CU_get_error();
    CU_pSuite suite = CU_add_suite("sampler", NULL, NULL);
    if (!suite) {
        CU_cleanup_registry();
        return (int)CU_get_error();
    }
    CU_add_test(suite, "greedy argmax and ties", test_greedy_argmax_and_ties);
    CU_add_test(suite, "greedy == a scalar first-maximum scan (odd sizes, NaN, inf)",
                test_greedy_matches_scalar_scan);
    CU_add_test(suite, "seed reproducible", test_seed_reproducible);
    CU_add_test(suite, "reset replays", test_reset_replays);
    CU_add_test(suite, "frequencies match softmax", test_frequencies_match_softmax);
    CU_add_test(suite, "temperature extremes", test_temperature_extremes);
    CU_add_test(suite, "top-k support", test_top_k_support);
    CU_add_test(suite, "top-k large vocab", test_top_k_large_vocab);
    CU_add_test(suite, "top-k histogram route", test_top_k_histogram_route);
    CU_add_test(suite, "top-p boundaries", test_top_p_boundaries);
    CU_add_test(suite, "top-p large vocab", test_top_p_large_vocab);
    CU_add_test(suite, "min-p", test_min_p);
    CU_add_test(suite, "penalties exact", test_penalties_exact);
    CU_add_test(suite, "penalty window", test_penalty_window);
    CU_add_test(suite, "invalid params", test_invalid_params);
    CU_add_test(suite, "non-finite logits", test_nonfinite_logits);
    CU_add_test(suite, "logit bias", test_logit_bias);
    CU_add_test(suite, "logit bias parse", test_logit_bias_parse);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}

/* test_lora_cluster.c — LoRA adapter sets through the cluster backend
 * (coordinator/src/cluster.c, worker/src/node.c): an engine with in-process
 * workers on tensor:2 and pipeline:2 runs a weighted set of two adapters
 * (each rank loads, sums and slices them) like the embedded engine; a part
 * whose fingerprint the ranks do not match is refused naming a rank and
 * attached nowhere; removal detaches everywhere. A rank prepares an adapter
 * (read, check, slice, int8) on its adapter thread while it steps: with
 * that preparation slowed (IE_TEST_LORA_PREP_DELAY_MS) base steps go on
 * until the attach lands; a removal of a set still being prepared is
 * answered at once (it supersedes the load); an engine destroyed with a
 * load in flight stops at once and leaks nothing (ASan).
 *
 * Fixtures: tests/data/tiny_llama (f32 here) and tests/data/lora.
 */
#include "ie_backend.h"
#include "ie_engine.h"
#include "ie_lora.h"
#include "ie_model_src.h"

#include "ie_clock.h"
#include "ie_test_lora.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL IE_TEST_DATA "/tiny_llama"

static ie_engine_t *open_engine(const char *plan)
{
    ie_engine_opts_t o;
    ie_engine_opts_default(&o);
    o.model_path = MODEL;
    o.no_tokenizer = 1;
    o.n_threads = 2;
    o.pin_threads = 0;
    o.precision = IE_PREC_F32;
    o.n_seq = 2;
    o.max_batch = 16;
    o.n_ctx = 64;
    CU_ASSERT_EQUAL_FATAL(ie_engine_opts_plan(&o, plan), IE_OK);
    ie_engine_t *e = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_engine_open(&o, &e), IE_OK);
    return e;
}

static void test_sets_on_plans(void)
{
    ie_model_src_t *src = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_model_src_open(MODEL, &src), IE_OK);
    const ie_hparams_t *hp = ie_model_src_hparams(src);
    ie_lora_t *qv8 = NULL, *all16 = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_lora_load(QV8, hp, &qv8), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_lora_load(ALL16, hp, &all16), IE_OK);
    const size_t nv = (size_t)hp->n_vocab, n = NTOK * nv;
    float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got), *base = malloc(n * sizeof *base);
    CU_ASSERT_FATAL(want && got && base);
    /* a set of two, weighted (one negative): not any adapter as trained */
    const ie_backend_lora_part_t parts[2] = {{"qv8", QV8, qv8, 0.7f}, {"all16", ALL16, all16, -0.4f}};

    ie_engine_t *emb = open_engine("none");
    int id = -1;
    CU_ASSERT_EQUAL_FATAL(ie_backend_lora_add(ie_engine_backend(emb), parts, 2, &id), IE_OK);
    CU_ASSERT_EQUAL(run(ie_engine_backend(emb), id, want), IE_OK);
    CU_ASSERT_EQUAL(run(ie_engine_backend(emb), -1, base), IE_OK);
    CU_ASSERT(rel(want, base, n) > 1e-2); /* the set changes the logits */
    ie_engine_destroy(&emb);

    static const char *plans[] = {"tensor:2", "pipeline:2"};
    for (int k = 0; k < 2; k++) {
        ie_engine_t *e = open_engine(plans[k]);
        ie_backend_t *b = ie_engine_backend(e);
        int cid = -1, bad_id = -1;
        CU_ASSERT_EQUAL_FATAL(ie_backend_lora_add(b, parts, 2, &cid), IE_OK);
        CU_ASSERT_EQUAL(run(b, cid, got), IE_OK);
        const double r = rel(got, want, n);
        CU_ASSERT(r < 1e-4);
        if (r >= 1e-4) fprintf(stderr, "\n  %s: rel %.3g\n", plans[k], r);
        /* a part the ranks' files do not match: refused, naming a rank */
        const uint64_t fp = all16->fingerprint;
        all16->fingerprint ^= 0x5a5a;
        CU_ASSERT_NOT_EQUAL(ie_backend_lora_add(b, parts, 2, &bad_id), IE_OK);
        CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "worker rank "));
        CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "adapter 'all16'"));
        CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "differs"));
        CU_ASSERT_EQUAL(bad_id, -1);
        all16->fingerprint = fp;
        /* ... and attached nowhere: the next free id is the refused one's */
        CU_ASSERT_EQUAL(run(b, cid + 1, got), IE_ERR_RANGE);
        /* the base and the first set run on */
        CU_ASSERT_EQUAL(run(b, -1, got), IE_OK);
        CU_ASSERT(rel(got, base, n) < 1e-4);
        CU_ASSERT_EQUAL(run(b, cid, got), IE_OK);
        CU_ASSERT(rel(got, want, n) < 1e-4);
        /* removed: gone everywhere, its id free again */
        CU_ASSERT_EQUAL(ie_backend_lora_remove(b, cid), IE_OK);
        CU_ASSERT_EQUAL(run(b, cid, got), IE_ERR_RANGE);
        CU_ASSERT_EQUAL(ie_backend_lora_remove(b, cid), IE_ERR_RANGE);
        int again = -1;
        CU_ASSERT_EQUAL(ie_backend_lora_add(b, parts, 1, &again), IE_OK);
        CU_ASSERT_EQUAL(again, cid);
        ie_engine_destroy(&e);
    }
    free(want);
    free(got);
    free(base);
    ie_lora_destroy(&qv8);
    ie_lora_destroy(&all16);
    ie_model_src_destroy(&src);
}

#define PREP_DELAY_MS 2000

/* Steps go on while the ranks prepare an adapter: base steps run between
 * ie_backend_lora_add_begin and the attach's outcome, many of them (with
 * the preparation on the ranks' main loop, a step waits for it whole:
 * one or two). Then a set removed while still prepared, and an engine
 * destroyed with a load in flight. */
static void test_prepare_off_main_loop(void)
{
    ie_model_src_t *src = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_model_src_open(MODEL, &src), IE_OK);
    const ie_hparams_t *hp = ie_model_src_hparams(src);
    ie_lora_t *qv8 = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_lora_load(QV8, hp, &qv8), IE_OK);
    const size_t n = NTOK * (size_t)hp->n_vocab;
    float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    CU_ASSERT_FATAL(want && got);
    const ie_backend_lora_part_t part = {"qv8", QV8, qv8, 1.0f};
    ie_engine_t *emb = open_engine("none");
    int id = -1;
    CU_ASSERT_EQUAL_FATAL(ie_backend_lora_add(ie_engine_backend(emb), &part, 1, &id), IE_OK);
    CU_ASSERT_EQUAL(run(ie_engine_backend(emb), id, want), IE_OK);
    ie_engine_destroy(&emb);

    char delay[16];
    snprintf(delay, sizeof delay, "%d", PREP_DELAY_MS);
    setenv("IE_TEST_LORA_PREP_DELAY_MS", delay, 1); /* read once, as each in-process rank starts */
    ie_engine_t *e = open_engine("tensor:2");
    ie_backend_t *b = ie_engine_backend(e);
    int cid = -1, pending = 0, done = 0, steps = 0;
    ie_status_t st = IE_ERR_INTERNAL;
    double t0 = ie_now_ms();
    CU_ASSERT_EQUAL_FATAL(ie_backend_lora_add_begin(b, &part, 1, &cid, &pending), IE_OK);
    CU_ASSERT_EQUAL_FATAL(pending, 1);
    while (!(done = ie_backend_lora_add_poll(b, cid, 0, &st)) && ie_now_ms() - t0 < 60000)
        if (run(b, -1, got) == IE_OK) steps++;
    const double took = ie_now_ms() - t0;
    fprintf(stderr, "\n  attach %.0f ms, %d base steps meanwhile\n", took, steps);
    CU_ASSERT(done && st == IE_OK);
    CU_ASSERT(took >= PREP_DELAY_MS * 0.9); /* else the seam did not slow it: nothing tested */
    CU_ASSERT(steps >= 10);
    CU_ASSERT_EQUAL(run(b, cid, got), IE_OK);
    CU_ASSERT(rel(got, want, n) < 1e-4);

    /* removed while the ranks prepare it: the removal supersedes the
     * load (answered at once, not after the delay), nothing attached */
    int id2 = -1;
    CU_ASSERT_EQUAL_FATAL(ie_backend_lora_add_begin(b, &part, 1, &id2, &pending), IE_OK);
    CU_ASSERT_NOT_EQUAL(id2, cid);
    t0 = ie_now_ms();
    CU_ASSERT_EQUAL(ie_backend_lora_remove(b, id2), IE_OK);
    const double rm = ie_now_ms() - t0;
    fprintf(stderr, "  removal of a set being prepared: %.0f ms\n", rm);
    CU_ASSERT(rm < PREP_DELAY_MS / 2);
    CU_ASSERT_EQUAL(ie_backend_lora_add_poll(b, id2, 0, &st), 1);
    CU_ASSERT_NOT_EQUAL(st, IE_OK);
    CU_ASSERT_EQUAL(run(b, id2, got), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(run(b, cid, got), IE_OK); /* the attached one untouched */
    CU_ASSERT(rel(got, want, n) < 1e-4);

    /* destroyed with a load in flight: the adapter threads stop and are
     * joined at once; what they held is freed (ASan's leak check) */
    int id3 = -1;
    CU_ASSERT_EQUAL(ie_backend_lora_add_begin(b, &part, 1, &id3, &pending), IE_OK);
    t0 = ie_now_ms();
    ie_engine_destroy(&e);
    const double down = ie_now_ms() - t0;
    fprintf(stderr, "  destroyed with a load in flight: %.0f ms\n", down);
    CU_ASSERT(down < PREP_DELAY_MS / 2);
    unsetenv("IE_TEST_LORA_PREP_DELAY_MS");
    /* ... and not slowed: destroyed in whatever stage the load is (the
     * files read, summed, cut), a few times */
    for (int k = 0; k < 4; k++) {
        e = open_engine("tensor:2");
        CU_ASSERT_EQUAL(ie_backend_lora_add_begin(ie_engine_backend(e), &part, 1, &id3, &pending), IE_OK);
        ie_engine_destroy(&e);
    }
    free(want);
    free(got);
    ie_lora_destroy(&qv8);
    ie_model_src_destroy(&src);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("lora_cluster", NULL, NULL);
    CU_add_test(s, "adapter sets on tensor:2 / pipeline:2 == embedded; refusals; removal", test_sets_on_plans);
    CU_add_test(s, "ranks prepare adapters off their main loop; removal while prepared; destroy in flight",
                test_prepare_off_main_loop);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

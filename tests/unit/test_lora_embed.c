/* test_lora_embed.c — the in-process backend's attach in two halves
 * (coordinator/src/backend_worker.c: ops.lora_add_begin / lora_add_poll),
 * on the Q4_0 tiny base, where the worker runs an int8 copy of each set:
 *   - with the helper's preparation slowed (IE_TEST_LORA_PREP_DELAY_MS,
 *     read when the backend is made) base steps run between begin and the
 *     poll that returns 1, many of them (with the attach whole in begin:
 *     none), and the attached set gives the logits of a synchronous
 *     lora_add, with the same bytes charged (the sum and the int8 copy);
 *   - begin names the id the attach gets (the first free one); another
 *     begin or a lora_add meanwhile is refused (IE_ERR_BUSY);
 *   - the helper's failure reaches the polling thread with its message,
 *     and leaves the id free;
 *   - a backend destroyed with an attach in flight stops it at once and
 *     leaks nothing (ASan), also not slowed (destroyed at any stage).
 *
 * Fixtures: tests/data/tiny_llama_q4_0.gguf and tests/data/lora.
 */
#include "ie_backend.h"
#include "ie_lora.h"
#include "ie_model_src.h"

#include "ie_clock.h"
#include "ie_test_lora.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL IE_TEST_DATA "/tiny_llama_q4_0.gguf"
#define PREP_DELAY_MS 1000

static ie_backend_t *open_backend(const ie_model_src_t *src)
{
    ie_worker_opts_t wo;
    ie_worker_opts_default(&wo);
    wo.n_seq = 2, wo.n_ctx = 64, wo.max_batch = 16, wo.n_threads = 1, wo.pin_threads = 0;
    ie_backend_t *b = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_backend_worker_new(src, &wo, &b), IE_OK);
    return b;
}

static void test_attach_off_serving_thread(void)
{
    ie_model_src_t *src = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_model_src_open(MODEL, &src), IE_OK);
    const ie_hparams_t *hp = ie_model_src_hparams(src);
    ie_lora_t *qv8 = NULL, *all16 = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_lora_load(QV8, hp, &qv8), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_lora_load(ALL16, hp, &all16), IE_OK);
    const size_t n = NTOK * (size_t)hp->n_vocab;
    float *want1 = malloc(n * sizeof *want1), *want2 = malloc(n * sizeof *want2), *got = malloc(n * sizeof *got),
          *base = malloc(n * sizeof *base);
    CU_ASSERT_FATAL(want1 && want2 && got && base);
    /* one adapter at a scale, and a weighted set of two (one negative) */
    const ie_backend_lora_part_t one = {"all16", ALL16, all16, 0.8f};
    const ie_backend_lora_part_t pair[2] = {{"qv8", QV8, qv8, 0.7f}, {"all16", ALL16, all16, -0.4f}};

    /* the reference: synchronous lora_add, no delay */
    unsetenv("IE_TEST_LORA_PREP_DELAY_MS");
    unsetenv("IE_LORA_DTYPE"); /* the base decides: int8 copies */
    ie_backend_t *ref = open_backend(src);
    int r1 = -1, r2 = -1;
    CU_ASSERT_EQUAL_FATAL(ie_backend_lora_add(ref, &one, 1, &r1), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_backend_lora_add(ref, pair, 2, &r2), IE_OK);
    CU_ASSERT_EQUAL(run(ref, r1, want1), IE_OK);
    CU_ASSERT_EQUAL(run(ref, r2, want2), IE_OK);
    CU_ASSERT_EQUAL(run(ref, -1, base), IE_OK);
    CU_ASSERT(rel(want1, base, n) > 1e-2); /* the adapters change the logits */
    CU_ASSERT(rel(want2, base, n) > 1e-2);
    const uint64_t bytes1 = ie_backend_lora_bytes(ref, r1), bytes2 = ie_backend_lora_bytes(ref, r2);
    CU_ASSERT(bytes1 > 0);            /* the int8 copy */
    CU_ASSERT(bytes2 > all16->bytes); /* the f32 sum and its int8 copy */
    ie_backend_destroy(&ref);

    char delay[16];
    snprintf(delay, sizeof delay, "%d", PREP_DELAY_MS);
    setenv("IE_TEST_LORA_PREP_DELAY_MS", delay, 1); /* read once, as the backend is made */
    ie_backend_t *b = open_backend(src);
    unsetenv("IE_TEST_LORA_PREP_DELAY_MS");
    const ie_backend_lora_part_t *sets[2] = {&one, pair};
    const int nparts[2] = {1, 2};
    const float *wants[2] = {want1, want2};
    const uint64_t want_bytes[2] = {bytes1, bytes2};
    int ids[2] = {-1, -1};
    for (int k = 0; k < 2; k++) {
        int id = -1, pending = 0, done = 0, steps = 0, other = -1;
        ie_status_t st = IE_ERR_INTERNAL;
        double t0 = ie_now_ms();
        CU_ASSERT_EQUAL_FATAL(ie_backend_lora_add_begin(b, sets[k], nparts[k], &id, &pending), IE_OK);
        CU_ASSERT_EQUAL_FATAL(pending, 1);
        CU_ASSERT_EQUAL(id, k); /* the first free slot */
        /* one attach at a time: another begin or a whole add waits */
        CU_ASSERT_EQUAL(ie_backend_lora_add_begin(b, &one, 1, &other, &pending), IE_ERR_BUSY);
        CU_ASSERT_EQUAL(ie_backend_lora_add(b, &one, 1, &other), IE_ERR_BUSY);
        CU_ASSERT_EQUAL(other, -1);
        CU_ASSERT_EQUAL(run(b, id, got), IE_ERR_RANGE); /* not attached yet */
        while (!(done = ie_backend_lora_add_poll(b, id, 0, &st)) && ie_now_ms() - t0 < 60000)
            if (run(b, -1, got) == IE_OK) steps++;
        const double took = ie_now_ms() - t0;
        fprintf(stderr, "\n  set of %d: attach %.0f ms, %d base steps meanwhile", nparts[k], took, steps);
        CU_ASSERT(done && st == IE_OK);
        CU_ASSERT(took >= PREP_DELAY_MS * 0.9); /* else the seam did not slow it: nothing tested */
        CU_ASSERT(steps >= 10);
        CU_ASSERT(rel(got, base, n) < 1e-6); /* the base steps ran the base */
        CU_ASSERT_EQUAL(run(b, id, got), IE_OK);
        CU_ASSERT(rel(got, wants[k], n) < 1e-6);
        CU_ASSERT_EQUAL(ie_backend_lora_bytes(b, id), want_bytes[k]);
        ids[k] = id;
    }
    fprintf(stderr, "\n");

    /* the helper's failure: its message on this thread, nothing attached,
     * the id free for the next attach */
    {
        int id = -1, pending = 0, again = -1;
        ie_status_t st = IE_OK;
        const int nl = all16->n_layer;
        all16->n_layer = nl + 1; /* checked first, before any weight is read */
        CU_ASSERT_EQUAL_FATAL(ie_backend_lora_add_begin(b, &one, 1, &id, &pending), IE_OK);
        while (!ie_backend_lora_add_poll(b, id, 50, &st)) {}
        all16->n_layer = nl;
        CU_ASSERT_EQUAL(st, IE_ERR_INVAL);
        CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "adapter made for 3 layers"));
        CU_ASSERT_EQUAL(run(b, id, got), IE_ERR_RANGE);
        CU_ASSERT_EQUAL(ie_backend_lora_bytes(b, id), 0);
        CU_ASSERT_EQUAL(ie_backend_lora_add(b, &one, 1, &again), IE_OK); /* the whole add works as before */
        CU_ASSERT_EQUAL(again, id);
        CU_ASSERT_EQUAL(ie_backend_lora_bytes(b, again), bytes1);
        CU_ASSERT_EQUAL(run(b, again, got), IE_OK);
        CU_ASSERT(rel(got, want1, n) < 1e-6);
        /* removed: the id is free again, and its copies with it */
        CU_ASSERT_EQUAL(ie_backend_lora_remove(b, ids[0]), IE_OK);
        CU_ASSERT_EQUAL(ie_backend_lora_bytes(b, ids[0]), 0);
        CU_ASSERT_EQUAL(ie_backend_lora_add_begin(b, pair, 2, &id, &pending), IE_OK);
        CU_ASSERT_EQUAL(id, ids[0]);
        /* destroyed with this attach in flight: stopped and joined at once,
         * nothing it made leaks (ASan) */
        {
            const double t0 = ie_now_ms();
            ie_backend_destroy(&b);
            const double down = ie_now_ms() - t0;
            fprintf(stderr, "  destroyed with an attach in flight: %.0f ms\n", down);
            CU_ASSERT(down < PREP_DELAY_MS / 2);
        }
    }
    /* ... and not slowed: destroyed at whatever stage the helper is (the
     * sum, the int8 copy, done), a few times */
    for (int k = 0; k < 4; k++) {
        int id = -1, pending = 0;
        b = open_backend(src);
        CU_ASSERT_EQUAL(ie_backend_lora_add_begin(b, pair, 2, &id, &pending), IE_OK);
        ie_backend_destroy(&b);
    }
    free(want1);
    free(want2);
    free(got);
    free(base);
    ie_lora_destroy(&qv8);
    ie_lora_destroy(&all16);
    ie_model_src_destroy(&src);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("lora_embed", NULL, NULL);
    CU_add_test(s, "in-process attach off the serving thread (threads): steps go on, same logits, failure, destroy",
                test_attach_off_serving_thread);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

/* test_cli_batch.c — CUnit suite for the prompts batcher
 * (apps/cli/cli_batch.c): prompts come out in file order whatever the
 * threads and the ring's depth, empty lines are skipped, a bad line (invalid
 * UTF-8, over the line or token limit) comes out in its place with its
 * error, a single text works, and destroying it early (readers blocked on a
 * full ring) frees everything.
 */
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ie_cli_batch.h"

static ie_tokenizer_t *g_tok;

static int suite_init(void)
{
    return ie_tokenizer_load(IE_TEST_DATA "/smollm2_tokenizer.json", &g_tok) == IE_OK ? 0 : -1;
}
static int suite_clean(void)
{
    ie_tokenizer_destroy(&g_tok);
    return 0;
}

/* A temporary file holding `text`; the caller unlinks and frees the path. */
static char *temp_file(const char *text, size_t len)
{
    char *path = strdup("/tmp/ie_test_batch_XXXXXX");
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_FATAL(write(fd, text, len) == (ssize_t)len);
    close(fd);
    return path;
}

static ie_cli_batch_opts_t opts(const char *path, int threads, size_t depth)
{
    return (
        ie_cli_batch_opts_t){.path = path, .tok = g_tok, .max_tokens = 1000, .n_threads = threads, .depth = depth};
}

static void test_order_with_threads_and_depths(void)
{
    /* line i is "n<i>": its first token differs from its neighbours' */
    const int n = 2000;
    char *text = malloc((size_t)n * 16);
    size_t len = 0;
    for (int i = 0; i < n; i++) len += (size_t)sprintf(text + len, "%sn%d\n", i % 10 == 3 ? "\n" : "", i);
    char *path = temp_file(text, len);
    const int threads[] = {1, 3, 8};
    const size_t depths[] = {1, 2, 64};
    for (int t = 0; t < 3; t++)
        for (int d = 0; d < 3; d++) {
            ie_cli_batcher_t *b = NULL;
            ie_cli_batch_opts_t o = opts(path, threads[t], depths[d]);
            CU_ASSERT_EQUAL_FATAL(ie_cli_batcher_start(&o, &b), IE_OK);
            ie_cli_item_t it;
            int k = 0, got;
            double wait = 0;
            while ((got = ie_cli_batcher_next(b, &it, &wait, 1)) == 1) {
                char want[16];
                int32_t *ids = NULL;
                size_t n_ids = 0;
                snprintf(want, sizeof want, "n%d", k);
                CU_ASSERT_EQUAL(it.index, (size_t)k);
                CU_ASSERT_EQUAL(it.st, IE_OK);
                CU_ASSERT_EQUAL(ie_tokenizer_encode(g_tok, want, strlen(want), 0, &ids, &n_ids), IE_OK);
                CU_ASSERT(n_ids == it.n_ids && !memcmp(ids, it.ids, n_ids * sizeof *ids));
                free(ids);
                free(it.ids);
                k++;
            }
            CU_ASSERT_EQUAL(got, 0);
            CU_ASSERT_EQUAL(k, n);
            double ms;
            int used;
            ie_cli_batcher_stats(b, &ms, &used);
            CU_ASSERT(used >= 1 && used <= threads[t]);
            ie_cli_batcher_destroy(&b);
            CU_ASSERT_PTR_NULL(b);
        }
    unlink(path);
    free(path);
    free(text);
}

static void test_bad_lines_in_place(void)
{
    const char text[] = "good one\r\ncaf\xc3 bad\n\nthis line is far too long for the limit, really\ngood two\n"
                        "many many many many many many many words\nlast";
    char *path = temp_file(text, sizeof text - 1);
    ie_cli_batch_opts_t o = opts(path, 2, 2);
    o.max_line = 42;
    o.max_tokens = 5;
    ie_cli_batcher_t *b = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_cli_batcher_start(&o, &b), IE_OK);
    const ie_status_t want[] = {IE_OK, IE_ERR_INVAL, IE_ERR_RANGE, IE_OK, IE_ERR_RANGE, IE_OK};
    const size_t lines[] = {1, 2, 4, 5, 6, 7};
    const char *words[] = {NULL, "UTF-8", "bytes", NULL, "context", NULL};
    ie_cli_item_t it;
    int k = 0;
    while (ie_cli_batcher_next(b, &it, NULL, 1) == 1) {
        CU_ASSERT_FATAL(k < 6);
        CU_ASSERT_EQUAL(it.st, want[k]);
        CU_ASSERT_EQUAL(it.line, lines[k]);
        if (words[k]) CU_ASSERT_PTR_NOT_NULL(strstr(it.err, words[k]));
        CU_ASSERT((it.st == IE_OK) == (it.ids != NULL && it.n_ids > 0));
        free(it.ids);
        k++;
    }
    CU_ASSERT_EQUAL(k, 6);
    ie_cli_batcher_destroy(&b);
    unlink(path);
    free(path);
}

static void test_text_and_errors(void)
{
    ie_cli_batch_opts_t o = {.text = "hello world", .tok = g_tok, .max_tokens = 100, .n_threads = 3, .depth = 4};
    ie_cli_batcher_t *b = NULL;
    ie_cli_item_t it;
    CU_ASSERT_EQUAL_FATAL(ie_cli_batcher_start(&o, &b), IE_OK);
    CU_ASSERT_EQUAL(ie_cli_batcher_next(b, &it, NULL, 1), 1);
    CU_ASSERT(it.st == IE_OK && it.n_ids == 2 && it.line == 1);
    free(it.ids);
    CU_ASSERT_EQUAL(ie_cli_batcher_next(b, &it, NULL, 1), 0);
    CU_ASSERT_EQUAL(ie_cli_batcher_next(b, &it, NULL, 1), 0);
    ie_cli_batcher_destroy(&b);
    ie_cli_batcher_destroy(&b); /* accepts NULL */

    ie_cli_batch_opts_t bad = opts("/nonexistent/prompts.txt", 1, 1);
    CU_ASSERT_EQUAL(ie_cli_batcher_start(&bad, &b), IE_ERR_IO);
    CU_ASSERT_PTR_NULL(b);
    bad = opts(NULL, 1, 1);
    CU_ASSERT_EQUAL(ie_cli_batcher_start(&bad, &b), IE_ERR_INVAL);
    bad = opts("/dev/null", 1, 0);
    CU_ASSERT_EQUAL(ie_cli_batcher_start(&bad, &b), IE_ERR_INVAL);
    bad = opts("/dev/null", 1, 1); /* an empty file: the end at once */
    CU_ASSERT_EQUAL_FATAL(ie_cli_batcher_start(&bad, &b), IE_OK);
    CU_ASSERT_EQUAL(ie_cli_batcher_next(b, &it, NULL, 1), 0);
    ie_cli_batcher_destroy(&b);
}

static void test_destroy_with_full_ring(void)
{
    char text[4000];
    size_t len = 0;
    for (int i = 0; i < 300; i++) len += (size_t)sprintf(text + len, "p%d\n", i);
    char *path = temp_file(text, len);
    ie_cli_batch_opts_t o = opts(path, 4, 8);
    ie_cli_batcher_t *b = NULL;
    ie_cli_item_t it;
    CU_ASSERT_EQUAL_FATAL(ie_cli_batcher_start(&o, &b), IE_OK);
    CU_ASSERT_EQUAL(ie_cli_batcher_next(b, &it, NULL, 1), 1);
    free(it.ids);
    usleep(20000);              /* the readers fill the ring and block */
    ie_cli_batcher_destroy(&b); /* frees the 8 prompts not taken (ASan: no leak) */
    CU_ASSERT_PTR_NULL(b);
    unlink(path);
    free(path);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("cli_batch", suite_init, suite_clean);
    CU_add_test(s, "order with threads and depths", test_order_with_threads_and_depths);
    CU_add_test(s, "bad lines in place", test_bad_lines_in_place);
    CU_add_test(s, "one text, bad options", test_text_and_errors);
    CU_add_test(s, "destroy with a full ring", test_destroy_with_full_ring);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}

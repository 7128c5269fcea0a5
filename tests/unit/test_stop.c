/* test_stop.c — CUnit suite for coordinator/src/stop.c (stop strings over
 * streamed text): hand-written chunkings of tricky cases, then a property
 * test comparing random chunkings against a naive whole-text reference.
 */
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ie_stop.h"

/* Collects what the matcher releases. */
typedef struct {
    char out[16384];
    size_t len;
    int stopped;
} sink_t;

static ie_stop_t *make(const char *const *stops, size_t n)
{
    ie_stop_t *s = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_stop_new(stops, n, &s), IE_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    return s;
}

/* Feed one chunk; returns the bytes released by this call. */
static size_t feed(ie_stop_t *s, sink_t *k, const char *text)
{
    size_t n = 99;
    int stopped = -1;
    CU_ASSERT_EQUAL_FATAL(ie_stop_feed(s, text, strlen(text), &n, &stopped), IE_OK);
    CU_ASSERT_FATAL(k->len + n <= sizeof k->out);
    memcpy(k->out + k->len, ie_stop_emit_data(s), n);
    k->len += n;
    k->stopped = stopped;
    return n;
}

static size_t flush(ie_stop_t *s, sink_t *k)
{
    size_t n = 99;
    CU_ASSERT_EQUAL_FATAL(ie_stop_flush(s, &n), IE_OK);
    memcpy(k->out + k->len, ie_stop_emit_data(s), n);
    k->len += n;
    return n;
}

static void expect_out(const sink_t *k, const char *want)
{
    CU_ASSERT_EQUAL(k->len, strlen(want));
    if (k->len != strlen(want) || memcmp(k->out, want, k->len) != 0) {
        fprintf(stderr, "\n  released \"%.*s\", want \"%s\"\n", (int)k->len, k->out, want);
        CU_FAIL("released text differs");
    }
}

/* ------------------------------------------------------------- cases */

static void test_no_stops(void)
{
    ie_stop_t *s = make(NULL, 0);
    sink_t k = {0};
    CU_ASSERT_EQUAL(feed(s, &k, "hello "), 6);
    CU_ASSERT_EQUAL(feed(s, &k, "world"), 5);
    CU_ASSERT_EQUAL(k.stopped, 0);
    CU_ASSERT_EQUAL(flush(s, &k), 0);
    expect_out(&k, "hello world");
    CU_ASSERT_EQUAL(ie_stop_matched(s), -1);
    CU_ASSERT_EQUAL(ie_stop_emitted_total(s), 11);
    ie_stop_destroy(&s);
    CU_ASSERT_PTR_NULL(s);

    /* only empty strings: same as none */
    const char *empty[] = {"", ""};
    s = make(empty, 2);
    sink_t k2 = {0};
    CU_ASSERT_EQUAL(feed(s, &k2, "abc"), 3);
    CU_ASSERT_EQUAL(k2.stopped, 0);
    ie_stop_destroy(&s);
}

static void test_stop_in_one_chunk(void)
{
    const char *stops[] = {"</s>"};
    ie_stop_t *s = make(stops, 1);
    sink_t k = {0};
    feed(s, &k, "Hello</s>world");
    CU_ASSERT_EQUAL(k.stopped, 1);
    expect_out(&k, "Hello");
    CU_ASSERT_EQUAL(ie_stop_matched(s), 0);
    /* finished: more text and flush release nothing */
    CU_ASSERT_EQUAL(feed(s, &k, "more"), 0);
    CU_ASSERT_EQUAL(k.stopped, 1);
    CU_ASSERT_EQUAL(flush(s, &k), 0);
    expect_out(&k, "Hello");
    CU_ASSERT_EQUAL(ie_stop_emitted_total(s), 5);

    /* stop at the very start */
    ie_stop_reset(s);
    sink_t k2 = {0};
    feed(s, &k2, "</s>");
    CU_ASSERT_EQUAL(k2.stopped, 1);
    expect_out(&k2, "");
    ie_stop_destroy(&s);
}

static void test_stop_across_chunks(void)
{
    const char *stops[] = {"</s>"};
    ie_stop_t *s = make(stops, 1);
    sink_t k = {0};
    CU_ASSERT_EQUAL(feed(s, &k, "Hel"), 3);
    CU_ASSERT_EQUAL(feed(s, &k, "lo<"), 2); /* "<" held back */
    CU_ASSERT_EQUAL(feed(s, &k, "/"), 0);
    CU_ASSERT_EQUAL(feed(s, &k, "s"), 0);
    CU_ASSERT_EQUAL(k.stopped, 0);
    CU_ASSERT_EQUAL(feed(s, &k, ">tail"), 0);
    CU_ASSERT_EQUAL(k.stopped, 1);
    expect_out(&k, "Hello");
    ie_stop_destroy(&s);

    /* a long stop fed one byte at a time, after a long text */
    const char *im[] = {"<|im_end|>"};
    s = make(im, 1);
    sink_t k2 = {0};
    const char *text = "The answer is 42.<|im_end|>ignored";
    char one[2] = {0, 0};
    for (const char *c = text; *c && !k2.stopped; c++) {
        one[0] = *c;
        feed(s, &k2, one);
    }
    CU_ASSERT_EQUAL(k2.stopped, 1);
    expect_out(&k2, "The answer is 42.");
    ie_stop_destroy(&s);
}

static void test_false_start_released(void)
{
    const char *stops[] = {"abc"};
    ie_stop_t *s = make(stops, 1);
    sink_t k = {0};
    CU_ASSERT_EQUAL(feed(s, &k, "xab"), 1); /* "ab" might become "abc" */
    CU_ASSERT_EQUAL(feed(s, &k, "d"), 3);   /* it did not */
    CU_ASSERT_EQUAL(feed(s, &k, "a"), 0);
    CU_ASSERT_EQUAL(feed(s, &k, "b"), 0);
    CU_ASSERT_EQUAL(k.stopped, 0);
    CU_ASSERT_EQUAL(flush(s, &k), 2); /* end of stream: release "ab" */
    expect_out(&k, "xabdab");
    /* feeding after a flush still works */
    feed(s, &k, "zabc");
    CU_ASSERT_EQUAL(k.stopped, 1);
    expect_out(&k, "xabdabz");
    ie_stop_destroy(&s);

    /* self-overlapping stop: "aab" in "aaab" */
    const char *aab[] = {"aab"};
    s = make(aab, 1);
    sink_t k2 = {0};
    CU_ASSERT_EQUAL(feed(s, &k2, "a"), 0);
    CU_ASSERT_EQUAL(feed(s, &k2, "a"), 0);
    CU_ASSERT_EQUAL(feed(s, &k2, "a"), 1);
    CU_ASSERT_EQUAL(feed(s, &k2, "b"), 0);
    CU_ASSERT_EQUAL(k2.stopped, 1);
    expect_out(&k2, "a");
    ie_stop_destroy(&s);
}

static void test_overlapping_stops(void)
{
    /* "ab" completes before "abc" could */
    const char *s1[] = {"abc", "ab"};
    ie_stop_t *s = make(s1, 2);
    sink_t k = {0};
    feed(s, &k, "xa");
    feed(s, &k, "bc");
    CU_ASSERT_EQUAL(k.stopped, 1);
    expect_out(&k, "x");
    CU_ASSERT_EQUAL(ie_stop_matched(s), 1);
    CU_ASSERT_STRING_EQUAL(ie_stop_string(s, 1), "ab"); /* the caller's index, not the sorted order */
    CU_ASSERT_STRING_EQUAL(ie_stop_string(s, 0), "abc");
    CU_ASSERT_PTR_NULL(ie_stop_string(s, 2));
    CU_ASSERT_PTR_NULL(ie_stop_string(s, -1));
    ie_stop_destroy(&s);

    /* a short stop inside a longer one ends first */
    const char *s2[] = {"abcd", "bc"};
    s = make(s2, 2);
    sink_t k2 = {0};
    feed(s, &k2, "xabcd");
    CU_ASSERT_EQUAL(k2.stopped, 1);
    expect_out(&k2, "xa");
    CU_ASSERT_EQUAL(ie_stop_matched(s), 1);
    ie_stop_destroy(&s);

    /* both end on the same byte: the longer one wins */
    const char *s3[] = {"bc", "abc"};
    s = make(s3, 2);
    sink_t k3 = {0};
    feed(s, &k3, "xab");
    feed(s, &k3, "c");
    CU_ASSERT_EQUAL(k3.stopped, 1);
    expect_out(&k3, "x");
    CU_ASSERT_EQUAL(ie_stop_matched(s), 1);
    ie_stop_destroy(&s);

    /* empty stop strings are ignored, indices still refer to the input */
    const char *s4[] = {"", "END"};
    s = make(s4, 2);
    CU_ASSERT_PTR_NULL(ie_stop_string(s, 0));
    CU_ASSERT_STRING_EQUAL(ie_stop_string(s, 1), "END");
    sink_t k4 = {0};
    feed(s, &k4, "data E");
    feed(s, &k4, "ND");
    CU_ASSERT_EQUAL(k4.stopped, 1);
    expect_out(&k4, "data ");
    CU_ASSERT_EQUAL(ie_stop_matched(s), 1);
    ie_stop_destroy(&s);
}

static void test_big_chunks(void)
{
    const char *stops[] = {"STOP"};
    ie_stop_t *s = make(stops, 1);
    static char big[6001];
    memset(big, 'x', 6000);
    big[6000] = '\0';
    memcpy(big + 5000, "STOP", 4);
    sink_t k = {0};
    CU_ASSERT_EQUAL(feed(s, &k, big), 5000);
    CU_ASSERT_EQUAL(k.stopped, 1);
    ie_stop_destroy(&s);

    /* large chunks ending in a partial match, twice over the buffer size */
    s = make(stops, 1);
    memset(big, 'y', 6000);
    memcpy(big + 5997, "STO", 3);
    sink_t k2 = {0};
    CU_ASSERT_EQUAL(feed(s, &k2, big), 5997);
    memset(big, 'z', 6000);
    CU_ASSERT_EQUAL(feed(s, &k2, big), 6003);
    CU_ASSERT_EQUAL(k2.stopped, 0);
    ie_stop_destroy(&s);
}

static void test_bad_args(void)
{
    ie_stop_t *s = (ie_stop_t *)1;
    CU_ASSERT_EQUAL(ie_stop_new(NULL, 2, &s), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(s);
    const char *withnull[] = {"a", NULL};
    CU_ASSERT_EQUAL(ie_stop_new(withnull, 2, &s), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_stop_new(withnull, 1, NULL), IE_ERR_INVAL);

    const char *stops[] = {"a"};
    s = make(stops, 1);
    size_t n = 5;
    int stopped = 5;
    CU_ASSERT_EQUAL(ie_stop_feed(s, NULL, 3, &n, &stopped), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(n, 0);
    CU_ASSERT_EQUAL(stopped, 0);
    CU_ASSERT_EQUAL(ie_stop_feed(s, NULL, 0, &n, &stopped), IE_OK);
    CU_ASSERT_EQUAL(n, 0);
    CU_ASSERT_EQUAL(ie_stop_feed(s, "x", 1, NULL, &stopped), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_stop_flush(s, NULL), IE_ERR_INVAL);
    ie_stop_destroy(&s);
    ie_stop_destroy(&s);
    ie_stop_destroy(NULL);
}

/* ------------------------------------------------- property: chunking */

/* Reference: scan the whole text byte by byte; the first end position
 * with a match wins, the longest stop among those ending there. */
static void naive(const char *text, size_t len, const char *const *stops, size_t n, size_t *emit_out,
                  int *stopped_out, int *which_out)
{
    for (size_t e = 1; e <= len; e++) {
        size_t best_len = 0;
        int which = -1;
        for (size_t i = 0; i < n; i++) {
            size_t l = strlen(stops[i]);
            if (l == 0 || l > e || l <= best_len) continue;
            if (memcmp(text + e - l, stops[i], l) == 0) {
                best_len = l;
                which = (int)i;
            }
        }
        if (which >= 0) {
            *emit_out = e - best_len;
            *stopped_out = 1;
            *which_out = which;
            return;
        }
    }
    *emit_out = len;
    *stopped_out = 0;
    *which_out = -1;
}

static uint32_t rnd(uint32_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return *x;
}

static void test_random_chunkings(void)
{
    uint32_t x = 0x12345u;
    char pool[6][8];
    for (int iter = 0; iter < 3000; iter++) {
        /* 1-4 stops of length 1-5 over "abc"; text of 0-60 bytes over "abcd" */
        size_t n = 1 + rnd(&x) % 4;
        const char *stops[6];
        for (size_t i = 0; i < n; i++) {
            size_t l = 1 + rnd(&x) % 5;
            for (size_t j = 0; j < l; j++) pool[i][j] = (char)('a' + rnd(&x) % 3);
            pool[i][l] = '\0';
            stops[i] = pool[i];
        }
        char text[64];
        size_t len = rnd(&x) % 61;
        for (size_t j = 0; j < len; j++) text[j] = (char)('a' + rnd(&x) % 4);
        text[len] = '\0';

        size_t want_len;
        int want_stopped, want_which;
        naive(text, len, stops, n, &want_len, &want_stopped, &want_which);

        ie_stop_t *s = make(stops, n);
        sink_t k = {0};
        size_t pos = 0;
        while (pos < len && !k.stopped) {
            size_t c = 1 + rnd(&x) % 7;
            if (c > len - pos) c = len - pos;
            char chunk[16];
            memcpy(chunk, text + pos, c);
            chunk[c] = '\0';
            feed(s, &k, chunk);
            pos += c;
        }
        if (!k.stopped) flush(s, &k);
        int ok = k.stopped == want_stopped && k.len == want_len && memcmp(k.out, text, want_len) == 0 &&
                 ie_stop_matched(s) == want_which;
        if (!ok) {
            fprintf(stderr, "\n  iter %d text \"%s\": got %zu/%d/%d want %zu/%d/%d\n", iter, text, k.len, k.stopped,
                    ie_stop_matched(s), want_len, want_stopped, want_which);
            CU_FAIL("chunked result differs from reference");
            ie_stop_destroy(&s);
            break;
        }
        ie_stop_destroy(&s);
    }
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return (int)CU_get_error();
    CU_pSuite suite = CU_add_suite("stop", NULL, NULL);
    if (!suite) {
        CU_cleanup_registry();
        return (int)CU_get_error();
    }
    CU_add_test(suite, "no stops", test_no_stops);
    CU_add_test(suite, "stop in one chunk", test_stop_in_one_chunk);
    CU_add_test(suite, "stop across chunks", test_stop_across_chunks);
    CU_add_test(suite, "false start released", test_false_start_released);
    CU_add_test(suite, "overlapping stops", test_overlapping_stops);
    CU_add_test(suite, "big chunks", test_big_chunks);
    CU_add_test(suite, "bad args", test_bad_args);
    CU_add_test(suite, "random chunkings", test_random_chunkings);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}

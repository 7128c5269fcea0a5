/* test_logprobs.c — CUnit suite for coordinator/src/logprobs.c: the
 * log-softmax against a long-double reference, top-k against a full sort
 * (ties by id), and the non-finite rows.
 */
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "ie_logprobs.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0);
}

/* descending logit, ascending id */
static const float *g_row;
static int cmp_rank(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_row[x] != g_row[y]) return g_row[x] > g_row[y] ? -1 : 1;
    return x < y ? -1 : 1;
}

static void test_random_rows(void)
{
    enum { N = 5000 };
    static float row[N];
    static int32_t idx[N];
    ie_token_logprob_t top[IE_LOGPROBS_MAX_TOP];
    for (int trial = 0; trial < 20; trial++) {
        for (int i = 0; i < N; i++) {
            /* coarse values: many ties, so their order by id is checked */
            row[i] = trial % 2 ? (float)(int)(frand() * 40) - 20 : frand() * 30 - 15;
            idx[i] = i;
        }
        long double mx = row[0], sum = 0;
        for (int i = 1; i < N; i++) mx = row[i] > mx ? row[i] : mx;
        for (int i = 0; i < N; i++) sum += expl((long double)row[i] - mx);
        const double ref = (double)(mx + logl(sum));
        g_row = row;
        qsort(idx, N, sizeof *idx, cmp_rank);
        const int k = trial % (IE_LOGPROBS_MAX_TOP + 1);
        double lse = 0;
        const int m = ie_logprobs_row(row, N, k, &lse, top);
        CU_ASSERT_EQUAL(m, k);
        CU_ASSERT_DOUBLE_EQUAL(lse, ref, 1e-9);
        double mass = 0;
        for (int j = 0; j < N; j++) mass += exp((double)ie_logprobs_of(row[j], lse));
        CU_ASSERT_DOUBLE_EQUAL(mass, 1.0, 1e-5);
        for (int j = 0; j < m; j++) {
            CU_ASSERT_EQUAL(top[j].id, idx[j]);
            CU_ASSERT_DOUBLE_EQUAL(top[j].logprob, (double)row[idx[j]] - ref, 1e-5);
        }
    }
}

static void test_small_and_k_beyond_n(void)
{
    const float row[3] = {1.0f, 3.0f, 3.0f};
    ie_token_logprob_t top[IE_LOGPROBS_MAX_TOP];
    double lse = 0;
    int m = ie_logprobs_row(row, 3, 20, &lse, top);
    CU_ASSERT_EQUAL(m, 3);
    CU_ASSERT_EQUAL(top[0].id, 1); /* tie: lower id first */
    CU_ASSERT_EQUAL(top[1].id, 2);
    CU_ASSERT_EQUAL(top[2].id, 0);
    CU_ASSERT_DOUBLE_EQUAL(lse, log(exp(1.0) + 2 * exp(3.0)), 1e-9);
    CU_ASSERT_EQUAL(ie_logprobs_row(row, 3, 0, &lse, top), 0);
}

static void test_non_finite(void)
{
    const float row[4] = {NAN, -INFINITY, 2.0f, 0.0f};
    ie_token_logprob_t top[4];
    double lse = 0;
    int m = ie_logprobs_row(row, 4, 4, &lse, top);
    CU_ASSERT_EQUAL(m, 4);
    CU_ASSERT_DOUBLE_EQUAL(lse, log(exp(2.0) + 1.0), 1e-9);
    CU_ASSERT_EQUAL(top[0].id, 2);
    CU_ASSERT_EQUAL(top[1].id, 3);
    CU_ASSERT_EQUAL(top[2].id, 0); /* NaN ranks as -inf, ties by id */
    CU_ASSERT_EQUAL(top[3].id, 1);
    CU_ASSERT(isinf(top[2].logprob) && top[2].logprob < 0);
    CU_ASSERT(isinf(top[3].logprob) && top[3].logprob < 0);

    const float pinf[3] = {INFINITY, 1.0f, INFINITY};
    m = ie_logprobs_row(pinf, 3, 2, &lse, top);
    CU_ASSERT_EQUAL(m, 2);
    CU_ASSERT_EQUAL(top[0].id, 0);
    CU_ASSERT_EQUAL(top[1].id, 2);
    CU_ASSERT_EQUAL(top[0].logprob, 0.0f);
    CU_ASSERT(isinf(ie_logprobs_of(1.0f, lse)));

    const float none[2] = {-INFINITY, NAN};
    m = ie_logprobs_row(none, 2, 1, &lse, top);
    CU_ASSERT_EQUAL(m, 1);
    CU_ASSERT(isinf(lse) && lse < 0);
    CU_ASSERT(isinf(top[0].logprob) && !isnan(top[0].logprob));
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return (int)CU_get_error();
    CU_pSuite suite = CU_add_suite("logprobs", NULL, NULL);
    if (!suite) {
        CU_cleanup_registry();
        return (int)CU_get_error();
    }
    CU_add_test(suite, "random rows vs reference", test_random_rows);
    CU_add_test(suite, "small rows, k beyond n", test_small_and_k_beyond_n);
    CU_add_test(suite, "non-finite logits", test_non_finite);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}

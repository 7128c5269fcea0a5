/* test_cpulat.c — the PM QoS CPU latency request (ie_cpulat.h): the
 * setting (flag over environment, bad text refused), and holding it: when
 * /dev/cpu_dma_latency is writable the kernel's aggregate request reads
 * back at most the value held, and a new request replaces the old; when
 * it is not, the error names the device and nothing is held.
 */
#define _GNU_SOURCE
#include "ie_cpulat.h"

#include <CUnit/Basic.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_setting(void)
{
    long us = 99;
    unsetenv("IE_CPU_LATENCY_US");
    CU_ASSERT_EQUAL(ie_cpulat_setting(NULL, &us), IE_OK);
    CU_ASSERT_EQUAL(us, -1);
    CU_ASSERT_EQUAL(ie_cpulat_setting("0", &us), IE_OK);
    CU_ASSERT_EQUAL(us, 0);
    CU_ASSERT_EQUAL(ie_cpulat_setting("1000000", &us), IE_OK);
    CU_ASSERT_EQUAL(us, 1000000);
    setenv("IE_CPU_LATENCY_US", "25", 1);
    CU_ASSERT_EQUAL(ie_cpulat_setting(NULL, &us), IE_OK);
    CU_ASSERT_EQUAL(us, 25);
    CU_ASSERT_EQUAL(ie_cpulat_setting("3", &us), IE_OK); /* the flag wins */
    CU_ASSERT_EQUAL(us, 3);
    const char *bad[] = {"", "-1", "1000001", "x", "5us", " 5", "99999999999999999999", "0x10"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CU_ASSERT_EQUAL(ie_cpulat_setting(bad[i], &us), IE_ERR_INVAL);
        CU_ASSERT_EQUAL(us, -1);
        CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "--cpu-latency-us"));
    }
    setenv("IE_CPU_LATENCY_US", "abc", 1);
    CU_ASSERT_EQUAL(ie_cpulat_setting(NULL, &us), IE_ERR_INVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "IE_CPU_LATENCY_US 'abc'"));
    CU_ASSERT_EQUAL(ie_cpulat_apply(NULL, "test"), IE_ERR_INVAL); /* a bad value is an error */
    unsetenv("IE_CPU_LATENCY_US");
    CU_ASSERT_EQUAL(ie_cpulat_apply(NULL, "test"), IE_OK); /* nothing asked: nothing held */
    CU_ASSERT_EQUAL(ie_cpulat_held(), -1);
    CU_ASSERT_EQUAL(ie_cpulat_hold(-1), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_cpulat_hold(1000001), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_cpulat_held(), -1);
}

/* The kernel's current aggregate request (a binary s32), or -1. */
static long aggregate(void)
{
    int fd = open("/dev/cpu_dma_latency", O_RDONLY);
    int32_t v = -1;
    if (fd < 0) return -1;
    if (read(fd, &v, sizeof v) != (ssize_t)sizeof v) v = -1;
    close(fd);
    return v;
}

static void test_hold(void)
{
    if (access("/dev/cpu_dma_latency", W_OK) != 0) { /* not ours to change: a clear error */
        CU_ASSERT_EQUAL(ie_cpulat_hold(0), IE_ERR_IO);
        CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "/dev/cpu_dma_latency"));
        CU_ASSERT_EQUAL(ie_cpulat_held(), -1);
        return;
    }
    CU_ASSERT_EQUAL_FATAL(ie_cpulat_hold(7), IE_OK);
    CU_ASSERT_EQUAL(ie_cpulat_held(), 7);
    long a = aggregate();
    CU_ASSERT(a >= 0 && a <= 7);                     /* the smallest request wins; another process may hold less */
    CU_ASSERT_EQUAL_FATAL(ie_cpulat_hold(0), IE_OK); /* replaces it */
    CU_ASSERT_EQUAL(ie_cpulat_held(), 0);
    CU_ASSERT_EQUAL(aggregate(), 0);
    setenv("IE_CPU_LATENCY_US", "5", 1);
    CU_ASSERT_EQUAL(ie_cpulat_apply(NULL, "test"), IE_OK);
    CU_ASSERT_EQUAL(ie_cpulat_held(), 5);
    unsetenv("IE_CPU_LATENCY_US");
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("cpulat", NULL, NULL);
    CU_add_test(s, "setting: flag, environment, bad text", test_setting);
    CU_add_test(s, "holding a request", test_hold);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

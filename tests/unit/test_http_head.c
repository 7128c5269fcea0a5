/* test_http_head.c — CUnit suite for the first-request-head check of the
 * HTTP gate (coordinator/src/serve_http_gate.c): what is well formed,
 * incomplete, or refused with which status, every prefix of a good head
 * (incomplete, never refused), and the JSON answer's framing. */
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../coordinator/src/serve_http_gate.h"

static int check(const char *s, int full, ie_http_head_err_t *e)
{
    memset(e, 0, sizeof *e);
    return ie_http_head_check(s, strlen(s), full, 8192, 16384, e);
}

static void test_good_heads(void)
{
    ie_http_head_err_t e;
    CU_ASSERT_EQUAL(check("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 0, &e), 1);
    CU_ASSERT_EQUAL(check("GET / HTTP/1.0\r\n\r\n", 0, &e), 1); /* 1.0 needs no Host */
    CU_ASSERT_EQUAL(check("\r\nGET / HTTP/1.1\nhost: x\n\n", 0, &e), 1);
    CU_ASSERT_EQUAL(check("BREW  /x  HTTP/1.1\r\nHost: x\r\nX-F: a\r\n b\r\n\r\nbody", 0, &e), 1);
    CU_ASSERT_EQUAL(check("POST / HTTP/1.1\r\nHost: x\r\nContent-Length:  12 \r\n\r\n", 0, &e), 1);
}

static void test_every_prefix_is_incomplete(void)
{
    const char *h = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n";
    ie_http_head_err_t e;
    for (size_t n = 0; n < strlen(h); n++) {
        char *p = malloc(n + 1); /* exactly n bytes are readable */
        memcpy(p, h, n);
        CU_ASSERT_EQUAL(ie_http_head_check(p, n, 0, 8192, 16384, &e), 0);
        free(p);
    }
}

static void refused(const char *s, int full, int status, const char *code)
{
    ie_http_head_err_t e;
    CU_ASSERT_EQUAL(check(s, full, &e), -1);
    CU_ASSERT_EQUAL(e.status, status);
    CU_ASSERT_PTR_NOT_NULL_FATAL(e.code);
    CU_ASSERT_STRING_EQUAL(e.code, code);
    CU_ASSERT(e.message[0] != 0);
}

static void test_refused_heads(void)
{
    refused("GET /v1/models\r\nHost: x\r\n\r\n", 0, 400, "malformed_request");
    refused("GARBAGE\r\n", 0, 400, "malformed_request");
    refused(" GET / HTTP/1.1\r\n", 0, 400, "malformed_request");
    refused("G(T / HTTP/1.1\r\n", 0, 400, "malformed_request");
    refused("GET  HTTP/1.1\r\n", 0, 400, "malformed_request");
    refused("GET / HTTP/9.9\r\nHost: x\r\n\r\n", 0, 505, "http_version_not_supported");
    refused("GET / HTTP/1.1x\r\n", 0, 505, "http_version_not_supported");
    refused("GET / http/1.1\r\n", 0, 400, "malformed_request");
    refused("GET / HTTP/1.1\r\nHost: x\r\nNoColon\r\n", 0, 400, "malformed_request");
    refused("GET / HTTP/1.1\r\n: v\r\n", 0, 400, "malformed_request");
    refused("GET / HTTP/1.1\r\n\r\n", 0, 400, "malformed_request");
    refused("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 0, 400, "malformed_request");
    refused("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: \r\n\r\n", 0, 400, "malformed_request");
    /* a full peek buffer without the end of the head */
    refused("GET /aaaaaaaa", 1, 414, "uri_too_long");
    refused("GET / HTTP/1.1\r\nX: aaaa", 1, 431, "headers_too_large");
}

static void test_answer_framing(void)
{
    ie_http_head_err_t e = {.status = 505, .code = "http_version_not_supported"};
    snprintf(e.message, sizeof e.message, "say \"no\"");
    char buf[640];
    size_t n = ie_http_head_answer(&e, buf, sizeof buf);
    CU_ASSERT_FATAL(n > 0 && n < sizeof buf);
    CU_ASSERT(!strncmp(buf, "HTTP/1.1 505 HTTP Version Not Supported\r\n", 41));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "Connection: close\r\n"));
    const char *body = strstr(buf, "\r\n\r\n");
    CU_ASSERT_PTR_NOT_NULL_FATAL(body);
    body += 4;
    int len = -1;
    CU_ASSERT_EQUAL(sscanf(strstr(buf, "Content-Length: "), "Content-Length: %d", &len), 1);
    CU_ASSERT_EQUAL((size_t)len, strlen(body));
    CU_ASSERT_PTR_NOT_NULL(strstr(body, "\"code\": \"http_version_not_supported\""));
    CU_ASSERT_PTR_NULL(strstr(body, "\"no\"")); /* the quotes cannot break the JSON */
    CU_ASSERT_EQUAL(ie_http_head_answer(&e, buf, 40), 0);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return (int)CU_get_error();
    CU_pSuite suite = CU_add_suite("http_head", NULL, NULL);
    if (!suite) {
        CU_cleanup_registry();
        return (int)CU_get_error();
    }
    CU_add_test(suite, "good heads", test_good_heads);
    CU_add_test(suite, "every prefix is incomplete", test_every_prefix_is_incomplete);
    CU_add_test(suite, "refused heads", test_refused_heads);
    CU_add_test(suite, "answer framing", test_answer_framing);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}

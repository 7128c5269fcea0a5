/* test_safetensors.c — safetensors reader: a valid file with every supported
 * kind of entry (read from memory and from disk), every truncation, and one
 * case per validation rule (header length, JSON, dtype, shape, offsets,
 * tiling, duplicates). Inputs are exact-size heap copies so ASan sees
 * overreads.
 */
#include "ie_safetensors.h"
#include "ie_test_writer.h"

#include <CUnit/Basic.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void expect_fail_at(const void *p, size_t len, ie_status_t want, const char *sub, int line)
{
    uint8_t *copy = malloc(len ? len : 1);
    ie_safetensors_t *s = (ie_safetensors_t *)copy; /* must be reset to NULL */
    memcpy(copy, p, len);
    ie_status_t st = ie_safetensors_open_memory(copy, len, &s);
    int ok = st == want && s == NULL && strstr(ie_error_last(), sub) != NULL;
    if (!ok)
        fprintf(stderr, "\n  line %d: got %s \"%s\", want %s containing \"%s\"\n", line, ie_status_str(st),
                ie_error_last(), ie_status_str(want), sub);
    CU_ASSERT(ok);
    ie_safetensors_destroy(&s);
    free(copy);
}

/* A file with header `json` and `nbytes` bytes of data must fail. */
static void json_fail(const char *json, size_t nbytes, ie_status_t want, const char *sub, int line)
{
    uint8_t data[256] = {0};
    tbuf_t b;
    st_finish(json, data, nbytes, &b);
    expect_fail_at(b.p, b.n, want, sub, line);
    tb_free(&b);
}
#define JSON_FAIL(json, nbytes, want, sub) json_fail(json, nbytes, want, sub, __LINE__)

/* ---------------------------------------------------------------- valid */

static const float k_f32[6] = {1, 2, 3, 4, 5, 6};
static const uint16_t k_f16[4] = {0x3c00, 0x4000, 0xc000, 0x0000};
static const uint16_t k_bf16[4] = {0x3f80, 0x4000, 0xbf80, 0x0000};
static const int64_t k_i64[3] = {-1, 0, 1 << 30};
static const float k_scalar = 42.0f;

static void build_valid(tbuf_t *out)
{
    /* written by hand to exercise __metadata__, padding and key order */
    static const char json[] = "{\"__metadata__\":{\"format\":\"pt\"},"
                               "\"w.f32\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                               "\"w.f16\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                               "\"w.bf16\":{\"shape\":[2,2],\"dtype\":\"BF16\",\"data_offsets\":[32,40]},"
                               "\"w.i64\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[40,64]},"
                               "\"w.scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[64,68]},"
                               "\"w.empty\":{\"dtype\":\"U8\",\"shape\":[0,5],\"data_offsets\":[68,68]}}      ";
    tbuf_t data = {0};
    tb_put(&data, k_f32, sizeof k_f32);
    tb_put(&data, k_f16, sizeof k_f16);
    tb_put(&data, k_bf16, sizeof k_bf16);
    tb_put(&data, k_i64, sizeof k_i64);
    tb_put(&data, &k_scalar, 4);
    st_finish(json, data.p, data.n, out);
    tb_free(&data);
}

static void check_valid(const ie_safetensors_t *s)
{
    static const struct {
        const char *name, *dtype_str;
        ie_dtype_t dtype;
        int ndim;
        int64_t shape[2];
        const void *data;
        uint64_t nbytes;
    } want[] = {
        {"w.f32", "F32", IE_DTYPE_F32, 2, {2, 3}, k_f32, 24},
        {"w.f16", "F16", IE_DTYPE_F16, 1, {4}, k_f16, 8},
        {"w.bf16", "BF16", IE_DTYPE_BF16, 2, {2, 2}, k_bf16, 8},
        {"w.i64", "I64", IE_DTYPE_INVALID, 1, {3}, k_i64, 24},
        {"w.scalar", "F32", IE_DTYPE_F32, 0, {0}, &k_scalar, 4},
        {"w.empty", "U8", IE_DTYPE_INVALID, 2, {0, 5}, NULL, 0},
    };
    CU_ASSERT_EQUAL_FATAL(ie_safetensors_count(s), 6);
    for (int i = 0; i < 6; i++) {
        const ie_safetensors_tensor_t *t = ie_safetensors_get(s, i);
        CU_ASSERT_FATAL(t != NULL);
        CU_ASSERT_PTR_EQUAL(ie_safetensors_find(s, want[i].name), t);
        CU_ASSERT_STRING_EQUAL(t->name, want[i].name);
        CU_ASSERT_STRING_EQUAL(t->dtype_str, want[i].dtype_str);
        CU_ASSERT_EQUAL(t->dtype, want[i].dtype);
        CU_ASSERT_EQUAL(t->ndim, want[i].ndim);
        for (int d = 0; d < t->ndim; d++) CU_ASSERT_EQUAL(t->shape[d], want[i].shape[d]);
        CU_ASSERT_EQUAL(t->nbytes, want[i].nbytes);
        if (want[i].nbytes) CU_ASSERT(memcmp(t->data, want[i].data, want[i].nbytes) == 0);
    }
    CU_ASSERT_PTR_NULL(ie_safetensors_get(s, 6));
    CU_ASSERT_PTR_NULL(ie_safetensors_get(s, -1));
    CU_ASSERT_PTR_NULL(ie_safetensors_find(s, "__metadata__"));
    CU_ASSERT_PTR_NULL(ie_safetensors_find(s, "w"));
    CU_ASSERT_PTR_NULL(ie_safetensors_find(s, NULL));
}

static void test_valid_memory(void)
{
    tbuf_t b;
    ie_safetensors_t *s = NULL;
    build_valid(&b);
    CU_ASSERT_EQUAL_FATAL(ie_safetensors_open_memory(b.p, b.n, &s), IE_OK);
    check_valid(s);
    ie_safetensors_destroy(&s);
    CU_ASSERT_PTR_NULL(s);
    ie_safetensors_destroy(&s);
    ie_safetensors_destroy(NULL);
    tb_free(&b);
}

static void test_valid_writer_and_empty(void)
{
    st_w_t w = {0};
    tbuf_t b;
    ie_safetensors_t *s = NULL;
    const int64_t shape[4] = {1, 2, 3, 4};
    sw_tensor(&w, "x", "F32", 4, shape, NULL, 24 * 4);
    sw_tensor(&w, "y", "BOOL", 1, shape + 1, NULL, 2);
    sw_finish(&w, &b);
    CU_ASSERT_EQUAL(ie_safetensors_open_memory(b.p, b.n, &s), IE_OK);
    CU_ASSERT_EQUAL(ie_safetensors_count(s), 2);
    CU_ASSERT_EQUAL(ie_safetensors_find(s, "x")->shape[3], 4);
    ie_safetensors_destroy(&s);
    tb_free(&b);

    st_finish("{}", NULL, 0, &b);
    CU_ASSERT_EQUAL(ie_safetensors_open_memory(b.p, b.n, &s), IE_OK);
    CU_ASSERT_EQUAL(ie_safetensors_count(s), 0);
    ie_safetensors_destroy(&s);
    tb_free(&b);
}

static void test_open_file(void)
{
    tbuf_t b;
    ie_safetensors_t *s = NULL;
    char path[] = "/tmp/ie_test_st_XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    build_valid(&b);
    CU_ASSERT_FATAL(write_file(path, b.p, b.n) == 0);
    CU_ASSERT_EQUAL_FATAL(ie_safetensors_open(path, &s), IE_OK);
    check_valid(s);
    ie_safetensors_destroy(&s);

    CU_ASSERT_FATAL(write_file(path, "abc", 3) == 0);
    s = (ie_safetensors_t *)path;
    CU_ASSERT_EQUAL(ie_safetensors_open(path, &s), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NULL(s);
    unlink(path);
    CU_ASSERT_EQUAL(ie_safetensors_open(path, &s), IE_ERR_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), path));
    CU_ASSERT_EQUAL(ie_safetensors_open("/tmp", &s), IE_ERR_IO);
    CU_ASSERT_EQUAL(ie_safetensors_open(NULL, &s), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_safetensors_open_memory(NULL, 5, &s), IE_ERR_INVAL);
    tb_free(&b);
}

/* ---------------------------------------------------------------- bad input */

static void test_truncations(void)
{
    tbuf_t b;
    build_valid(&b);
    for (size_t len = 0; len < b.n; len++) expect_fail_at(b.p, len, IE_ERR_FORMAT, "safetensors: ", __LINE__);
    tb_free(&b);
}

static void test_bad_header_length(void)
{
    tbuf_t b;
    build_valid(&b);
    expect_fail_at(b.p, 7, IE_ERR_FORMAT, "too small", __LINE__);
    tb_set_u64(&b, 0, b.n - 8 + 1);
    expect_fail_at(b.p, b.n, IE_ERR_FORMAT, "header length", __LINE__);
    tb_set_u64(&b, 0, 200000000); /* over the 100 MB limit */
    expect_fail_at(b.p, b.n, IE_ERR_FORMAT, "header length 200000000 is invalid", __LINE__);
    tb_set_u64(&b, 0, UINT64_MAX);
    expect_fail_at(b.p, b.n, IE_ERR_FORMAT, "header length", __LINE__);
    tb_set_u64(&b, 0, 0);
    expect_fail_at(b.p, b.n, IE_ERR_FORMAT, "header length 0", __LINE__);
    tb_set_u64(&b, 0, 20); /* cuts the JSON short */
    expect_fail_at(b.p, b.n, IE_ERR_FORMAT, "not valid JSON", __LINE__);
    tb_free(&b);
}

static void test_bad_json(void)
{
    JSON_FAIL("{\"a\":", 0, IE_ERR_FORMAT, "not valid JSON");
    JSON_FAIL("not json at all", 0, IE_ERR_FORMAT, "not valid JSON");
    JSON_FAIL("[1, 2]", 0, IE_ERR_FORMAT, "not a JSON object");
    JSON_FAIL("\"text\"", 0, IE_ERR_FORMAT, "not a JSON object");
    JSON_FAIL("{} x", 0, IE_ERR_FORMAT, "trailing bytes");
    JSON_FAIL("{\"a\":5}", 0, IE_ERR_FORMAT, "entry 'a' is not an object");
    JSON_FAIL("{\"a\":[1]}", 0, IE_ERR_FORMAT, "entry 'a' is not an object");
}

static void test_bad_entries(void)
{
    /* dtype */
    JSON_FAIL("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, IE_ERR_FORMAT, "'a' has no string \"dtype\"");
    JSON_FAIL("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, IE_ERR_FORMAT, "dtype");
    JSON_FAIL("{\"a\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1, IE_ERR_UNSUPPORTED,
              "tensor 'a' has unsupported dtype 'F4'");
    JSON_FAIL("{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, IE_ERR_UNSUPPORTED, "'f32'");
    /* shape */
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, IE_ERR_FORMAT, "no \"shape\" array");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,4]}}", 4, IE_ERR_FORMAT, "\"shape\"");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, IE_ERR_FORMAT,
              "'a' shape[0] is not a non-negative integer");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1.5],\"data_offsets\":[0,4]}}", 4, IE_ERR_FORMAT, "shape[1]");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, IE_ERR_FORMAT, "shape[0]");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]}}", 4, IE_ERR_FORMAT, "shape[0]");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, IE_ERR_UNSUPPORTED,
              "'a' has rank 5");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
              IE_ERR_FORMAT, "element count overflows");
    JSON_FAIL("{\"a\":{\"dtype\":\"F64\",\"shape\":[9007199254740992,512],\"data_offsets\":[0,4]}}", 4,
              IE_ERR_FORMAT, "data_offsets span"); /* 2^62 elements fit; x8 bytes overflows */
    /* offsets */
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, IE_ERR_FORMAT, "\"data_offsets\": [begin, end]");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, IE_ERR_FORMAT,
              "data_offsets");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, IE_ERR_FORMAT, "begin <= end");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 4, IE_ERR_FORMAT,
              "data_offsets");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0,4\"}}", 4, IE_ERR_FORMAT,
              "data_offsets");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 4, IE_ERR_FORMAT,
              "'a' data_offsets [0, 8] extend past the data section (4 bytes)");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e30]}}", 4, IE_ERR_FORMAT,
              "data_offsets");
    /* size mismatch */
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20, IE_ERR_FORMAT,
              "'a' is 6 elements of F32 but data_offsets span 20 bytes");
    JSON_FAIL("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24, IE_ERR_FORMAT, "span 24");
}

static void test_bad_layout(void)
{
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
              12, IE_ERR_FORMAT, "'b' data_offsets [8, 12] leave a gap (expected begin 4)");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
              12, IE_ERR_FORMAT, "overlap another tensor");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, IE_ERR_FORMAT, "leave a gap");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, IE_ERR_FORMAT,
              "tensors cover 4 bytes but the data section has 8");
    JSON_FAIL("{}", 1, IE_ERR_FORMAT, "tensors cover 0 bytes");
    JSON_FAIL("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
              8, IE_ERR_FORMAT, "duplicate tensor name 'a'");
}

int main(void)
{
    unsigned failures;
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("safetensors", NULL, NULL);
    CU_add_test(s, "valid file from memory", test_valid_memory);
    CU_add_test(s, "writer output, empty file", test_valid_writer_and_empty);
    CU_add_test(s, "open from disk, IO errors", test_open_file);
    CU_add_test(s, "every truncation fails cleanly", test_truncations);
    CU_add_test(s, "bad header length", test_bad_header_length);
    CU_add_test(s, "bad JSON", test_bad_json);
    CU_add_test(s, "bad entries", test_bad_entries);
    CU_add_test(s, "gaps, overlaps, duplicates", test_bad_layout);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    failures = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failures ? 1 : 0;
}

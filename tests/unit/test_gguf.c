/* test_gguf.c — GGUF reader: every getter on in-memory v2/v3 images, every
 * kind of malformed input (including every truncation of a valid file), the
 * ggml type table, and the real SmolLM2 model through ie_model_src_open.
 *
 * Bad inputs are checked on exact-size heap copies so ASan catches any read
 * past the end.
 */
#include "ie_gguf.h"
#include "ie_model_src.h"
#include "ie_test_writer.h"

#include <CUnit/Basic.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL_PATH IE_TEST_DATA "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf"

enum { T_U8 = 0, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 };
enum { G_F32 = 0, G_F16 = 1, G_Q4_1 = 3, G_Q8_0 = 8, G_Q6_K = 14, G_F64 = 28, G_BF16 = 30 };

/* ---------------------------------------------------------------- fixture */

#define N_TENSORS 6
static const struct {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
    size_t nbytes;
    ie_dtype_t dtype;
} k_tensors[N_TENSORS] = {
    {"w.f32", G_F32, 2, {4, 3}, 48, IE_DTYPE_F32},         {"w.f16", G_F16, 1, {8}, 16, IE_DTYPE_F16},
    {"w.q8_0", G_Q8_0, 2, {64, 2}, 4 * 34, IE_DTYPE_Q8_0}, {"w.q4_1", G_Q4_1, 2, {32, 3}, 3 * 20, IE_DTYPE_Q4_1},
    {"w.q6_K", G_Q6_K, 1, {256}, 210, IE_DTYPE_Q6_K},      {"w.bf16", G_BF16, 4, {2, 2, 2, 2}, 32, IE_DTYPE_BF16},
};

/* Offsets (within their sections) of fields the bad-input tests corrupt. */
typedef struct fixture {
    gguf_w_t w;
    tbuf_t file;
    size_t kv_align, kv_u8, kv_str, kv_bool, kv_arr_i32, kv_arr_u64, kv_arr_str;
    size_t ti[N_TENSORS];
} fixture_t;

static uint8_t pattern(int t, size_t i) { return (uint8_t)(i * 7 + (size_t)t * 31 + 1); }

/* A file with all 13 value types, arrays and tensors of several ggml types.
 * align != 32 writes general.alignment. */
static void build(fixture_t *f, uint32_t version, uint32_t align)
{
    uint8_t buf[256];
    memset(f, 0, sizeof *f);
    gw_init(&f->w);
    f->w.align = align;
    if (align != 32) f->kv_align = gw_u32(&f->w, "general.alignment", align);
    f->kv_u8 = gw_key(&f->w, "t.u8", T_U8), tb_u8(&f->w.kv, 200);
    gw_key(&f->w, "t.i8", T_I8), tb_u8(&f->w.kv, (uint8_t)-100);
    gw_key(&f->w, "t.u16", T_U16), tb_u16(&f->w.kv, 60000);
    gw_key(&f->w, "t.i16", T_I16), tb_u16(&f->w.kv, (uint16_t)-30000);
    gw_u32(&f->w, "t.u32", 4000000000u);
    gw_i32(&f->w, "t.i32", -2000000000);
    gw_f32(&f->w, "t.f32", 1.5f);
    f->kv_bool = gw_bool(&f->w, "t.bool", 1);
    f->kv_str = gw_str(&f->w, "t.str", "hello");
    gw_u64(&f->w, "t.u64", 0x8000000000000005ull);
    gw_key(&f->w, "t.i64", T_I64), tb_u64(&f->w.kv, (uint64_t) - (1ll << 40));
    gw_key(&f->w, "t.f64", T_F64), tb_f64(&f->w.kv, 2.25);
    f->kv_arr_i32 = gw_arr(&f->w, "t.arr_i32", T_I32, 3);
    tb_u32(&f->w.kv, 1), tb_u32(&f->w.kv, (uint32_t)-2), tb_u32(&f->w.kv, 3);
    f->kv_arr_u64 = gw_arr(&f->w, "t.arr_u64", T_U64, 2);
    tb_u64(&f->w.kv, 7), tb_u64(&f->w.kv, 9);
    f->kv_arr_str = gw_arr(&f->w, "t.arr_str", T_STR, 3);
    tb_str(&f->w.kv, "a"), tb_str(&f->w.kv, "bc"), tb_str(&f->w.kv, "");
    gw_arr(&f->w, "t.arr_f32", T_F32, 2);
    tb_f32(&f->w.kv, 0.5f), tb_f32(&f->w.kv, -1.0f);
    gw_arr(&f->w, "t.arr_bool", T_BOOL, 2);
    tb_u8(&f->w.kv, 1), tb_u8(&f->w.kv, 0);
    gw_arr(&f->w, "t.arr_empty", T_U8, 0);
    gw_arr(&f->w, "t.arr_f64", T_F64, 1);
    tb_f64(&f->w.kv, 3.5);
    for (int t = 0; t < N_TENSORS; t++) {
        for (size_t i = 0; i < k_tensors[t].nbytes; i++) buf[i] = pattern(t, i);
        f->ti[t] = gw_tensor(&f->w, k_tensors[t].name, k_tensors[t].type, k_tensors[t].n_dims, k_tensors[t].ne, buf,
                             k_tensors[t].nbytes);
    }
    gw_finish(&f->w, version, &f->file);
}

static void fixture_free(fixture_t *f)
{
    gw_free(&f->w);
    tb_free(&f->file);
}

/* File offset of a field of tensor t's info record. */
static size_t ti_ndims(const fixture_t *f, int t)
{
    return gw_ti_at(&f->w, f->ti[t]) + gw_ti_ndims(k_tensors[t].name);
}
static size_t ti_dim(const fixture_t *f, int t, int d)
{
    return gw_ti_at(&f->w, f->ti[t]) + gw_ti_dim(k_tensors[t].name, d);
}
static size_t ti_type(const fixture_t *f, int t)
{
    return gw_ti_at(&f->w, f->ti[t]) + gw_ti_type(k_tensors[t].name, k_tensors[t].n_dims);
}
static size_t ti_offset(const fixture_t *f, int t)
{
    return gw_ti_at(&f->w, f->ti[t]) + gw_ti_offset(k_tensors[t].name, k_tensors[t].n_dims);
}
/* File offset of the value (after key and type) of the kv at section offset kv. */
static size_t kv_value(const fixture_t *f, size_t kv, const char *key)
{
    return gw_kv_at(&f->w, kv) + 8 + strlen(key) + 4;
}

/* Open an exact-size copy of `len` bytes of `p`; it must fail with `want`
 * and a reason containing `sub`. */
static void expect_fail_at(const void *p, size_t len, ie_status_t want, const char *sub, int line)
{
    uint8_t *copy = malloc(len ? len : 1);
    ie_gguf_t *g = (ie_gguf_t *)copy; /* must be reset to NULL */
    memcpy(copy, p, len);
    ie_status_t st = ie_gguf_open_memory(copy, len, &g);
    int ok = st == want && g == NULL && strstr(ie_error_last(), sub) != NULL;
    if (!ok)
        fprintf(stderr, "\n  line %d: got %s \"%s\", want %s containing \"%s\"\n", line, ie_status_str(st),
                ie_error_last(), ie_status_str(want), sub);
    CU_ASSERT(ok);
    ie_gguf_destroy(&g);
    free(copy);
}
#define EXPECT_FAIL(buf, want, sub) expect_fail_at((buf)->p, (buf)->n, want, sub, __LINE__)

/* ---------------------------------------------------------------- valid files */

static void check_full(const ie_gguf_t *g, uint32_t version, size_t align)
{
    int64_t i;
    float f;
    int b;
    ie_gguf_str_t s;
    ie_gguf_type_t et;
    uint64_t n;

    CU_ASSERT_EQUAL(ie_gguf_version(g), version);
    CU_ASSERT_EQUAL(ie_gguf_alignment(g), align);
    CU_ASSERT_EQUAL(ie_gguf_kv_count(g), 19 + (align != 32));
    CU_ASSERT_EQUAL(ie_gguf_tensor_count(g), N_TENSORS);

    /* keys in file order, types */
    s = ie_gguf_kv_key(g, align != 32);
    CU_ASSERT(s.len == 4 && memcmp(s.ptr, "t.u8", 4) == 0);
    CU_ASSERT_EQUAL(ie_gguf_kv_type(g, ie_gguf_find_key(g, "t.f64")), IE_GGUF_FLOAT64);
    CU_ASSERT_EQUAL(ie_gguf_kv_type(g, ie_gguf_find_key(g, "t.arr_str")), IE_GGUF_ARRAY);
    CU_ASSERT_EQUAL(ie_gguf_find_key(g, "t.nope"), -1);
    CU_ASSERT_EQUAL(ie_gguf_find_key(g, "t"), -1);
    CU_ASSERT_PTR_NULL(ie_gguf_kv_key(g, 999).ptr);
    CU_ASSERT_EQUAL((int)ie_gguf_kv_type(g, -1), -1);

    /* integers of every width convert */
    static const struct {
        const char *key;
        int64_t v;
    } ints[] = {
        {"t.u8", 200},           {"t.i8", -100},         {"t.u16", 60000},        {"t.i16", -30000},
        {"t.u32", 4000000000ll}, {"t.i32", -2000000000}, {"t.i64", -(1ll << 40)},
    };
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        i = 0;
        CU_ASSERT_EQUAL(ie_gguf_get_i64(g, ints[k].key, &i), IE_OK);
        CU_ASSERT_EQUAL(i, ints[k].v);
    }
    i = 77;
    CU_ASSERT_EQUAL(ie_gguf_get_i64(g, "t.u64", &i), IE_ERR_FORMAT); /* 2^63 + 5 does not fit */
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "t.u64"));
    CU_ASSERT_EQUAL(i, 77); /* untouched on failure */
    CU_ASSERT_EQUAL(ie_gguf_get_i64(g, "t.f32", &i), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "'t.f32' is float32"));
    CU_ASSERT_EQUAL(ie_gguf_get_i64(g, "t.bool", &i), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_gguf_get_i64(g, "t.arr_i32", &i), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_gguf_get_i64(g, "t.missing", &i), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "'t.missing' not found"));
    CU_ASSERT_EQUAL(i, 77);

    CU_ASSERT_EQUAL(ie_gguf_get_f32(g, "t.f32", &f), IE_OK);
    CU_ASSERT_EQUAL(f, 1.5f);
    CU_ASSERT_EQUAL(ie_gguf_get_f32(g, "t.f64", &f), IE_OK);
    CU_ASSERT_EQUAL(f, 2.25f);
    CU_ASSERT_EQUAL(ie_gguf_get_f32(g, "t.u32", &f), IE_ERR_FORMAT);

    CU_ASSERT_EQUAL(ie_gguf_get_bool(g, "t.bool", &b), IE_OK);
    CU_ASSERT_EQUAL(b, 1);
    CU_ASSERT_EQUAL(ie_gguf_get_bool(g, "t.u8", &b), IE_ERR_FORMAT);

    CU_ASSERT_EQUAL(ie_gguf_get_str(g, "t.str", &s), IE_OK);
    CU_ASSERT(s.len == 5 && memcmp(s.ptr, "hello", 5) == 0);
    CU_ASSERT_EQUAL(ie_gguf_get_str(g, "t.u8", &s), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_gguf_get_str(g, "t.arr_str", &s), IE_ERR_FORMAT);

    /* arrays */
    CU_ASSERT_EQUAL(ie_gguf_get_arr(g, "t.arr_i32", &et, &n), IE_OK);
    CU_ASSERT(et == IE_GGUF_INT32 && n == 3);
    CU_ASSERT_EQUAL(ie_gguf_get_arr(g, "t.arr_empty", &et, &n), IE_OK);
    CU_ASSERT(et == IE_GGUF_UINT8 && n == 0);
    CU_ASSERT_EQUAL(ie_gguf_get_arr(g, "t.u8", &et, &n), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_gguf_arr_i64(g, "t.arr_i32", 1, &i), IE_OK);
    CU_ASSERT_EQUAL(i, -2);
    CU_ASSERT_EQUAL(ie_gguf_arr_i64(g, "t.arr_u64", 1, &i), IE_OK);
    CU_ASSERT_EQUAL(i, 9);
    CU_ASSERT_EQUAL(ie_gguf_arr_i64(g, "t.arr_bool", 0, &i), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_gguf_arr_i64(g, "t.arr_i32", 3, &i), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_gguf_arr_i64(g, "t.arr_empty", 0, &i), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_gguf_arr_i64(g, "t.arr_str", 0, &i), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_gguf_arr_i64(g, "t.i32", 0, &i), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_gguf_arr_str(g, "t.arr_str", 1, &s), IE_OK);
    CU_ASSERT(s.len == 2 && memcmp(s.ptr, "bc", 2) == 0);
    CU_ASSERT_EQUAL(ie_gguf_arr_str(g, "t.arr_str", 2, &s), IE_OK);
    CU_ASSERT_EQUAL(s.len, 0);
    CU_ASSERT_EQUAL(ie_gguf_arr_str(g, "t.arr_str", 3, &s), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_gguf_arr_str(g, "t.arr_i32", 0, &s), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_gguf_arr_f32(g, "t.arr_f32", 1, &f), IE_OK);
    CU_ASSERT_EQUAL(f, -1.0f);
    CU_ASSERT_EQUAL(ie_gguf_arr_f32(g, "t.arr_f64", 0, &f), IE_OK);
    CU_ASSERT_EQUAL(f, 3.5f);
    CU_ASSERT_EQUAL(ie_gguf_arr_f32(g, "t.arr_str", 0, &f), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_gguf_arr_f32(g, "t.arr_i32", 0, &f), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_gguf_arr_f32(g, "t.nope", 0, &f), IE_ERR_FORMAT);
    {
        const int32_t want[3] = {1, -2, 3};
        const void *p = ie_gguf_arr_data(g, "t.arr_i32");
        CU_ASSERT(p && memcmp(p, want, sizeof want) == 0);
    }
    CU_ASSERT_PTR_NULL(ie_gguf_arr_data(g, "t.arr_str"));
    CU_ASSERT_PTR_NULL(ie_gguf_arr_data(g, "t.u8"));
    CU_ASSERT_PTR_NULL(ie_gguf_arr_data(g, "t.nope"));

    /* tensors */
    for (int t = 0; t < N_TENSORS; t++) {
        const ie_gguf_tensor_info_t *ti = ie_gguf_tensor(g, t);
        CU_ASSERT_FATAL(ti != NULL);
        CU_ASSERT_PTR_EQUAL(ie_gguf_find_tensor(g, k_tensors[t].name), ti);
        CU_ASSERT(ti->name.len == strlen(k_tensors[t].name) &&
                  !memcmp(ti->name.ptr, k_tensors[t].name, ti->name.len));
        CU_ASSERT_EQUAL(ti->ggml_type, k_tensors[t].type);
        CU_ASSERT_EQUAL(ti->dtype, k_tensors[t].dtype);
        CU_ASSERT_EQUAL(ti->n_dims, k_tensors[t].n_dims);
        for (uint32_t d = 0; d < 4; d++)
            CU_ASSERT_EQUAL(ti->ne[d], d < ti->n_dims ? (int64_t)k_tensors[t].ne[d] : 1);
        CU_ASSERT_EQUAL(ti->nbytes, k_tensors[t].nbytes);
        CU_ASSERT_EQUAL(ti->offset % align, 0);
        int same = 1;
        for (size_t k = 0; k < ti->nbytes; k++) same &= ((const uint8_t *)ti->data)[k] == pattern(t, k);
        CU_ASSERT(same);
    }
    CU_ASSERT_PTR_NULL(ie_gguf_tensor(g, N_TENSORS));
    CU_ASSERT_PTR_NULL(ie_gguf_tensor(g, -1));
    CU_ASSERT_PTR_NULL(ie_gguf_find_tensor(g, "w.nope"));
    CU_ASSERT_PTR_NULL(ie_gguf_find_tensor(g, "w"));
}

static void test_valid_versions(void)
{
    for (uint32_t version = 2; version <= 3; version++) {
        fixture_t f;
        ie_gguf_t *g = NULL;
        build(&f, version, 32);
        CU_ASSERT_EQUAL_FATAL(ie_gguf_open_memory(f.file.p, f.file.n, &g), IE_OK);
        check_full(g, version, 32);
        CU_ASSERT(((const uint8_t *)ie_gguf_tensor(g, 0)->data - f.file.p) % 32 == 0);
        ie_gguf_destroy(&g);
        CU_ASSERT_PTR_NULL(g);
        fixture_free(&f);
    }
}

static void test_valid_alignment(void)
{
    fixture_t f;
    ie_gguf_t *g = NULL;
    build(&f, 3, 256);
    CU_ASSERT_EQUAL_FATAL(ie_gguf_open_memory(f.file.p, f.file.n, &g), IE_OK);
    check_full(g, 3, 256);
    for (int t = 0; t < N_TENSORS; t++)
        CU_ASSERT(((const uint8_t *)ie_gguf_tensor(g, t)->data - f.file.p) % 256 == 0);
    ie_gguf_destroy(&g);
    fixture_free(&f);
}

static void test_empty_file_ok(void)
{
    gguf_w_t w;
    tbuf_t file;
    ie_gguf_t *g = NULL;
    gw_init(&w);
    gw_finish(&w, 3, &file);
    CU_ASSERT_EQUAL(ie_gguf_open_memory(file.p, file.n, &g), IE_OK);
    CU_ASSERT_EQUAL(ie_gguf_kv_count(g), 0);
    CU_ASSERT_EQUAL(ie_gguf_tensor_count(g), 0);
    CU_ASSERT_EQUAL(ie_gguf_find_key(g, "x"), -1);
    CU_ASSERT_PTR_NULL(ie_gguf_find_tensor(g, "x"));
    ie_gguf_destroy(&g);
    gw_free(&w);
    tb_free(&file);
}

static void test_open_file(void)
{
    fixture_t f;
    ie_gguf_t *g = NULL;
    char path[] = "/tmp/ie_test_gguf_XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    build(&f, 3, 32);
    CU_ASSERT_FATAL(write_file(path, f.file.p, f.file.n) == 0);
    CU_ASSERT_EQUAL_FATAL(ie_gguf_open(path, &g), IE_OK);
    check_full(g, 3, 32);
    ie_gguf_destroy(&g);

    /* an empty file and a non-GGUF file */
    CU_ASSERT_FATAL(write_file(path, "", 0) == 0);
    g = (ie_gguf_t *)path;
    CU_ASSERT_EQUAL(ie_gguf_open(path, &g), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NULL(g);
    CU_ASSERT_FATAL(write_file(path, "hello world, not gguf", 21) == 0);
    CU_ASSERT_EQUAL(ie_gguf_open(path, &g), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "not a GGUF file"));
    unlink(path);

    CU_ASSERT_EQUAL(ie_gguf_open(path, &g), IE_ERR_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), path));
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "No such file"));
    CU_ASSERT_EQUAL(ie_gguf_open("/tmp", &g), IE_ERR_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "not a regular file"));
    CU_ASSERT_EQUAL(ie_gguf_open(NULL, &g), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_gguf_open(path, NULL), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_gguf_open_memory(NULL, 10, &g), IE_ERR_INVAL);
    ie_gguf_destroy(NULL);
    ie_gguf_destroy(&g);
    fixture_free(&f);
}

/* ---------------------------------------------------------------- bad input */

static void test_truncations(void)
{
    for (uint32_t version = 2; version <= 3; version++) {
        fixture_t f;
        build(&f, version, version == 2 ? 32 : 64);
        for (size_t len = 0; len < f.file.n; len++)
            expect_fail_at(f.file.p, len, IE_ERR_FORMAT, "gguf: ", __LINE__);
        fixture_free(&f);
    }
}

static void test_bad_header(void)
{
    fixture_t f;
    build(&f, 3, 32);
    tbuf_t b = {0};
    tb_put(&b, f.file.p, f.file.n);

    b.p[0] = 'X';
    EXPECT_FAIL(&b, IE_ERR_FORMAT, "not a GGUF file");
    b.p[0] = 'G';
    tb_set_u32(&b, 4, 1);
    EXPECT_FAIL(&b, IE_ERR_UNSUPPORTED, "version 1 is not supported");
    tb_set_u32(&b, 4, 99);
    EXPECT_FAIL(&b, IE_ERR_UNSUPPORTED, "version 99");
    tb_set_u32(&b, 4, 0);
    EXPECT_FAIL(&b, IE_ERR_UNSUPPORTED, "version 0");
    tb_set_u32(&b, 4, 0x03000000);
    EXPECT_FAIL(&b, IE_ERR_UNSUPPORTED, "big-endian");
    tb_set_u32(&b, 4, 3);

    tb_set_u64(&b, 16, 1ull << 60); /* n_kv */
    EXPECT_FAIL(&b, IE_ERR_FORMAT, "more than fit");
    tb_set_u64(&b, 16, UINT64_MAX);
    EXPECT_FAIL(&b, IE_ERR_FORMAT, "more than fit");
    tb_set_u64(&b, 16, f.w.n_kv);
    tb_set_u64(&b, 8, 1ull << 40); /* n_tensors */
    EXPECT_FAIL(&b, IE_ERR_FORMAT, "more than fit");
    tb_set_u64(&b, 8, UINT64_MAX);
    EXPECT_FAIL(&b, IE_ERR_FORMAT, "more than fit");
    tb_set_u64(&b, 8, f.w.n_tensors + 1); /* one more tensor than written: runs out of bytes */
    EXPECT_FAIL(&b, IE_ERR_FORMAT, "gguf: ");
    tb_set_u64(&b, 8, f.w.n_tensors);
    tb_set_u64(&b, 16, f.w.n_kv + 1); /* one more kv: parses a tensor info as a kv, must fail */
    EXPECT_FAIL(&b, IE_ERR_FORMAT, "gguf: ");

    tb_free(&b);
    fixture_free(&f);
}

/* Patch a copy of the fixture file with one u32/u64 at `at` and expect failure. */
static void patch_fail(const fixture_t *f, size_t at, int width, uint64_t v, ie_status_t want, const char *sub,
                       int line)
{
    tbuf_t b = {0};
    tb_put(&b, f->file.p, f->file.n);
    if (width == 4) tb_set_u32(&b, at, (uint32_t)v);
    else tb_set_u64(&b, at, v);
    expect_fail_at(b.p, b.n, want, sub, line);
    tb_free(&b);
}
#define PATCH32(f, at, v, want, sub) patch_fail(f, at, 4, v, want, sub, __LINE__)
#define PATCH64(f, at, v, want, sub) patch_fail(f, at, 8, v, want, sub, __LINE__)

static void test_bad_metadata(void)
{
    fixture_t f;
    build(&f, 3, 32);
    size_t key_len = gw_kv_at(&f.w, f.kv_u8), type = key_len + 8 + 4;

    PATCH64(&f, key_len, 1ull << 40, IE_ERR_FORMAT, "metadata key");
    PATCH64(&f, key_len, UINT64_MAX, IE_ERR_FORMAT, "metadata key");
    PATCH64(&f, key_len, 0, IE_ERR_FORMAT, "length 0");
    PATCH32(&f, type, 13, IE_ERR_FORMAT, "key 't.u8' has unknown value type 13");
    PATCH32(&f, type, 0xffffffffu, IE_ERR_FORMAT, "unknown value type");
    PATCH64(&f, kv_value(&f, f.kv_str, "t.str"), 1ull << 50, IE_ERR_FORMAT, "string value");
    PATCH64(&f, kv_value(&f, f.kv_str, "t.str"), UINT64_MAX, IE_ERR_FORMAT, "string value");
    PATCH64(&f, kv_value(&f, f.kv_str, "t.str"), 6, IE_ERR_FORMAT, "gguf: "); /* one byte too long: misparses */
    {
        tbuf_t b = {0};
        tb_put(&b, f.file.p, f.file.n);
        b.p[kv_value(&f, f.kv_bool, "t.bool")] = 2;
        EXPECT_FAIL(&b, IE_ERR_FORMAT, "bool value 2");
        tb_free(&b);
    }
    size_t arr_i32 = kv_value(&f, f.kv_arr_i32, "t.arr_i32");
    PATCH32(&f, arr_i32, 13, IE_ERR_FORMAT, "unknown array element type 13");
    PATCH32(&f, arr_i32, IE_GGUF_ARRAY, IE_ERR_UNSUPPORTED, "array of arrays");
    size_t arr_u64 = kv_value(&f, f.kv_arr_u64, "t.arr_u64");
    PATCH64(&f, arr_u64 + 4, 1ull << 61, IE_ERR_FORMAT, "extends past end of file"); /* x8 wraps to 0 */
    PATCH64(&f, arr_u64 + 4, UINT64_MAX, IE_ERR_FORMAT, "extends past end of file");
    PATCH64(&f, arr_u64 + 4, 1ull << 40, IE_ERR_FORMAT, "extends past end of file");
    size_t arr_str = kv_value(&f, f.kv_arr_str, "t.arr_str");
    PATCH64(&f, arr_str + 4, 1ull << 60, IE_ERR_FORMAT, "claims");
    PATCH64(&f, arr_str + 4, UINT64_MAX, IE_ERR_FORMAT, "claims");
    PATCH64(&f, arr_str + 4 + 8, 1ull << 62, IE_ERR_FORMAT, "string array element");
    fixture_free(&f);

    /* general.alignment: power of two, nonzero, an integer */
    build(&f, 3, 64);
    size_t av = kv_value(&f, f.kv_align, "general.alignment");
    PATCH32(&f, av, 3, IE_ERR_FORMAT, "general.alignment 3 is not a nonzero power of two");
    PATCH32(&f, av, 0, IE_ERR_FORMAT, "general.alignment 0");
    PATCH32(&f, av, 96, IE_ERR_FORMAT, "power of two");
    PATCH32(&f, av - 4, T_F32, IE_ERR_FORMAT, "general.alignment must be");
    PATCH32(&f, av, 128, IE_ERR_FORMAT, "gguf: "); /* valid value, but the offsets no longer line up */
    fixture_free(&f);
}

static void test_bad_tensors(void)
{
    static const uint32_t unknown_types[] = {4, 5, 31, 32, 33, 36, 37, 38, 40, 41, 1000, 0xffffffffu};
    fixture_t f;
    build(&f, 3, 32);

    for (size_t k = 0; k < sizeof unknown_types / sizeof unknown_types[0]; k++)
        PATCH32(&f, ti_type(&f, 0), unknown_types[k], IE_ERR_FORMAT, "tensor 'w.f32' has unknown ggml type");
    PATCH64(&f, gw_ti_at(&f.w, f.ti[0]), 0, IE_ERR_FORMAT, "name has length 0");
    PATCH64(&f, gw_ti_at(&f.w, f.ti[0]), 1ull << 62, IE_ERR_FORMAT, "tensor name");
    PATCH32(&f, ti_ndims(&f, 0), 0, IE_ERR_FORMAT, "tensor 'w.f32' has n_dims 0");
    PATCH32(&f, ti_ndims(&f, 0), 5, IE_ERR_FORMAT, "tensor 'w.f32' has n_dims 5");
    PATCH32(&f, ti_ndims(&f, 0), 0xffffffffu, IE_ERR_FORMAT, "n_dims 4294967295");
    PATCH64(&f, ti_dim(&f, 0, 0), 0, IE_ERR_FORMAT, "'w.f32' dimension 0 is 0");
    PATCH64(&f, ti_dim(&f, 0, 1), (uint64_t)-3, IE_ERR_FORMAT, "'w.f32' dimension 1 is -3");
    PATCH64(&f, ti_dim(&f, 0, 0), 1ull << 32, IE_ERR_FORMAT, "extends past end of file");
    PATCH64(&f, ti_dim(&f, 2, 0), 48, IE_ERR_FORMAT, "row length 48 is not a multiple of the q8_0 block size 32");
    PATCH64(&f, ti_dim(&f, 4, 0), 32, IE_ERR_FORMAT, "q6_K block size 256");
    PATCH64(&f, ti_offset(&f, 1), 48 + 1, IE_ERR_FORMAT, "'w.f16' offset 49 is not a multiple of the alignment 32");
    PATCH64(&f, ti_offset(&f, 5), 1ull << 40, IE_ERR_FORMAT, "tensor 'w.bf16' data [offset");
    PATCH64(&f, ti_offset(&f, 5), UINT64_MAX - 31, IE_ERR_FORMAT, "extends past end of file");
    {
        /* a product past int64: dims 2^32 x 2^32 */
        tbuf_t b = {0};
        tb_put(&b, f.file.p, f.file.n);
        tb_set_u64(&b, ti_dim(&f, 0, 0), 1ull << 32);
        tb_set_u64(&b, ti_dim(&f, 0, 1), 1ull << 32);
        EXPECT_FAIL(&b, IE_ERR_FORMAT, "element count overflows int64");
        tb_set_u64(&b, ti_dim(&f, 0, 0), 1ull << 62);
        tb_set_u64(&b, ti_dim(&f, 0, 1), 2);
        EXPECT_FAIL(&b, IE_ERR_FORMAT, "element count overflows int64");
        /* 2^62 f64 elements: the element count fits, the byte count does not */
        tb_set_u64(&b, ti_dim(&f, 0, 1), 1);
        tb_set_u32(&b, ti_type(&f, 0), G_F64);
        EXPECT_FAIL(&b, IE_ERR_FORMAT, "byte size overflows");
        tb_free(&b);
    }
    {
        /* the data-past-end message carries name, absolute offset, size, file size */
        char want[160];
        tbuf_t b = {0};
        tb_put(&b, f.file.p, f.file.n);
        tb_set_u64(&b, ti_offset(&f, 5), 32 * 1000);
        size_t data_start = f.file.n - f.w.data.n;
        snprintf(want, sizeof want,
                 "gguf: tensor 'w.bf16' data [offset %zu, size 32] extends past end of file (%zu bytes)",
                 data_start + 32 * 1000, f.file.n);
        EXPECT_FAIL(&b, IE_ERR_FORMAT, want);
        tb_free(&b);
    }
    fixture_free(&f);
}

static void test_duplicates(void)
{
    gguf_w_t w;
    tbuf_t file;
    const uint64_t ne[1] = {4};

    gw_init(&w);
    gw_u32(&w, "t.dup", 1);
    gw_u32(&w, "t.other", 2);
    gw_str(&w, "t.dup", "again");
    gw_finish(&w, 3, &file);
    EXPECT_FAIL(&file, IE_ERR_FORMAT, "duplicate key 't.dup'");
    gw_free(&w);
    tb_free(&file);

    gw_init(&w);
    gw_tensor(&w, "w.x", G_F32, 1, ne, NULL, 16);
    gw_tensor(&w, "w.y", G_F32, 1, ne, NULL, 16);
    gw_tensor(&w, "w.x", G_F32, 1, ne, NULL, 16);
    gw_finish(&w, 3, &file);
    EXPECT_FAIL(&file, IE_ERR_FORMAT, "duplicate tensor name 'w.x'");
    gw_free(&w);
    tb_free(&file);
}

/* ---------------------------------------------------------------- ggml types */

static void test_ggml_types(void)
{
    static const struct {
        uint32_t id;
        const char *name;
        int64_t blck;
        size_t size;
    } known[] = {
        {0, "f32", 1, 4},         {1, "f16", 1, 2},         {2, "q4_0", 32, 18},      {3, "q4_1", 32, 20},
        {6, "q5_0", 32, 22},      {7, "q5_1", 32, 24},      {8, "q8_0", 32, 34},      {9, "q8_1", 32, 36},
        {10, "q2_K", 256, 84},    {11, "q3_K", 256, 110},   {12, "q4_K", 256, 144},   {13, "q5_K", 256, 176},
        {14, "q6_K", 256, 210},   {15, "q8_K", 256, 292},   {16, "iq2_xxs", 256, 66}, {17, "iq2_xs", 256, 74},
        {18, "iq3_xxs", 256, 98}, {19, "iq1_s", 256, 50},   {20, "iq4_nl", 32, 18},   {21, "iq3_s", 256, 110},
        {22, "iq2_s", 256, 82},   {23, "iq4_xs", 256, 136}, {24, "i8", 1, 1},         {25, "i16", 1, 2},
        {26, "i32", 1, 4},        {27, "i64", 1, 8},        {28, "f64", 1, 8},        {29, "iq1_m", 256, 56},
        {30, "bf16", 1, 2},       {34, "tq1_0", 256, 54},   {35, "tq2_0", 256, 66},   {39, "mxfp4", 32, 17},
    };
    int64_t blck;
    size_t size;
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
        CU_ASSERT_STRING_EQUAL(ie_gguf_ggml_type_name(known[k].id), known[k].name);
        CU_ASSERT_EQUAL(ie_gguf_ggml_type_block(known[k].id, &blck, &size), 1);
        CU_ASSERT(blck == known[k].blck && size == known[k].size);
    }
    for (uint32_t id = 0; id < 64; id++) {
        int is_known = 0;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) is_known |= known[k].id == id;
        CU_ASSERT_EQUAL(ie_gguf_ggml_type_block(id, NULL, NULL), is_known);
        if (!is_known) CU_ASSERT_STRING_EQUAL(ie_gguf_ggml_type_name(id), "unknown");
    }
    CU_ASSERT_STRING_EQUAL(ie_gguf_ggml_type_name(0xffffffffu), "unknown");
}

/* ---------------------------------------------------------------- real model */

static void test_real_model(void)
{
    ie_model_src_t *src = NULL;
    ie_status_t st = ie_model_src_open(MODEL_PATH, &src);
    if (st != IE_OK) fprintf(stderr, "\n  %s (run scripts/setup.sh)\n", ie_error_last());
    CU_ASSERT_EQUAL_FATAL(st, IE_OK); /* the model is part of the setup: absence is a failure */

    const ie_hparams_t *hp = ie_model_src_hparams(src);
    CU_ASSERT_EQUAL(ie_model_src_kind(src), IE_SRC_GGUF);
    CU_ASSERT_STRING_EQUAL(hp->arch, "llama");
    CU_ASSERT(strlen(hp->name) > 0);
    CU_ASSERT_EQUAL(hp->n_layer, 30);
    CU_ASSERT_EQUAL(hp->n_embd, 576);
    CU_ASSERT_EQUAL(hp->n_ff, 1536);
    CU_ASSERT_EQUAL(hp->n_head, 9);
    CU_ASSERT_EQUAL(hp->n_head_kv, 3);
    CU_ASSERT_EQUAL(hp->head_dim, 64);
    CU_ASSERT_EQUAL(hp->rope_dim, 64);
    CU_ASSERT_EQUAL(hp->n_vocab, 49152);
    CU_ASSERT_EQUAL(hp->n_ctx_train, 8192);
    CU_ASSERT_EQUAL(hp->rope_theta, 100000.0f);
    CU_ASSERT(hp->rms_eps > 0.9e-5f && hp->rms_eps < 1.1e-5f);
    CU_ASSERT_EQUAL(hp->rope_layout, IE_ROPE_NORMAL);
    CU_ASSERT_EQUAL(hp->tied_embeddings, 1);
    CU_ASSERT_STRING_EQUAL(ie_model_src_tokenizer_path(src), MODEL_PATH);

    const ie_tensor_t *emb = ie_model_src_tensor(src, "token_embd.weight");
    CU_ASSERT_FATAL(emb != NULL);
    CU_ASSERT(emb->dtype == IE_DTYPE_Q8_0 && emb->n_dims == 2 && emb->ne[0] == 576 && emb->ne[1] == 49152);
    CU_ASSERT_EQUAL(emb->nbytes, 49152ull * 576 / 32 * 34);
    const ie_tensor_t *down = ie_model_src_tensor(src, "blk.29.ffn_down.weight");
    CU_ASSERT_FATAL(down != NULL);
    CU_ASSERT(down->dtype == IE_DTYPE_Q4_1 && down->ne[0] == 1536 && down->ne[1] == 576);
    CU_ASSERT_STRING_EQUAL(down->name, "blk.29.ffn_down.weight");
    CU_ASSERT_PTR_NULL(ie_model_src_tensor(src, "output.weight"));

    const ie_gguf_t *g = ie_model_src_gguf(src);
    ie_gguf_type_t et;
    uint64_t n;
    ie_gguf_str_t s;
    CU_ASSERT_FATAL(g != NULL);
    CU_ASSERT_EQUAL(ie_gguf_version(g), 3);
    CU_ASSERT_EQUAL(ie_gguf_tensor_count(g), 272);
    CU_ASSERT_EQUAL(ie_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n), IE_OK);
    CU_ASSERT(et == IE_GGUF_STRING && n == 49152);
    CU_ASSERT_EQUAL(ie_gguf_arr_str(g, "tokenizer.ggml.tokens", 49151, &s), IE_OK);
    CU_ASSERT_EQUAL(ie_gguf_get_str(g, "tokenizer.ggml.model", &s), IE_OK);
    CU_ASSERT(s.len == 4 && memcmp(s.ptr, "gpt2", 4) == 0);
    ie_model_src_destroy(&src);
    CU_ASSERT_PTR_NULL(src);
}

int main(void)
{
    unsigned failures;
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("gguf", NULL, NULL);
    CU_add_test(s, "valid v2 and v3 images, every getter", test_valid_versions);
    CU_add_test(s, "general.alignment 256", test_valid_alignment);
    CU_add_test(s, "empty but valid file", test_empty_file_ok);
    CU_add_test(s, "open from disk, IO errors", test_open_file);
    CU_add_test(s, "every truncation fails cleanly", test_truncations);
    CU_add_test(s, "bad header", test_bad_header);
    CU_add_test(s, "bad metadata", test_bad_metadata);
    CU_add_test(s, "bad tensor infos", test_bad_tensors);
    CU_add_test(s, "duplicate keys and tensors", test_duplicates);
    CU_add_test(s, "ggml type table", test_ggml_types);
    CU_add_test(s, "SmolLM2 Q4_1 GGUF via ie_model_src_open", test_real_model);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    failures = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failures ? 1 : 0;
}

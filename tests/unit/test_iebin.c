/* test_iebin.c — IEBIN v1 (ie_iebin.h, docs/FORMAT.md): writer -> reader
 * round trips (a tiny llama with tensors of several dtypes and layouts:
 * f32/f16/bf16/q8_0/q4_0/q4_1 rows, int8w rows, int4w and int4w_affine
 * PANEL16, a BSR blob; GPT-OSS hyper-parameters), the GGUF tokenizer subset
 * (tokenizer.gguf gives the same ids as the source GGUF), one corruption per
 * validation rule (IE_ERR_FORMAT with the field or tensor named), writer
 * misuse, and the in-memory model source.
 */
#include "ie_bsr.h"
#include "ie_gguf.h"
#include "ie_iebin.h"
#include "ie_model_src.h"
#include "ie_pack.h"
#include "ie_tokenizer.h"

#include <CUnit/Basic.h>
#include <cjson/cJSON.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_root[64]; /* a temporary directory for the whole run */
static int g_seq;

/* ---------------------------------------------------------------- files */

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[512];
    while (d && (de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            if (unlink(p) != 0) rm_tree(p);
        }
    if (d) closedir(d);
    rmdir(dir);
}

/* A fresh sub-directory name under g_root (not created). */
static void new_dir(char *out, size_t cap) { snprintf(out, cap, "%s/m%d", g_root, g_seq++); }

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) abort();
    buf[n] = '\0';
    fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

static void spit(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) abort();
    fclose(f);
}

static int exists(const char *dir, const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    while (d && (de = readdir(d))) n += de->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

/* ---------------------------------------------------------------- model */

#define E 64  /* n_embd   */
#define F 128 /* n_ff     */
#define V 300 /* n_vocab: token_embd f32 is 76800 bytes, page aligned */

static ie_hparams_t tiny_hp(void)
{
    ie_hparams_t hp;
    memset(&hp, 0, sizeof hp);
    snprintf(hp.arch, sizeof hp.arch, "llama");
    hp.arch_id = IE_ARCH_LLAMA;
    snprintf(hp.name, sizeof hp.name, "tiny iebin");
    hp.n_layer = 1;
    hp.n_embd = E;
    hp.n_ff = F;
    hp.n_head = 4;
    hp.n_head_kv = 2;
    hp.head_dim = 16;
    hp.n_vocab = V;
    hp.n_ctx_train = 256;
    hp.rope_dim = 16;
    hp.rope_theta = 10000.0f;
    hp.rms_eps = 1e-5f;
    hp.rope_layout = IE_ROPE_NEOX;
    hp.rope_attn_factor = 1.0f;
    return hp;
}

typedef struct spec {
    const char *name;
    ie_dtype_t dt;
    ie_layout_t lay;
    int group, n_dims;
    int64_t ne0, ne1;
} spec_t;

static const spec_t k_specs[] = {
    {"token_embd.weight", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 2, E, V},
    {"output_norm.weight", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 1, E, 1},
    {"output.weight", IE_DTYPE_Q4_1, IE_LAYOUT_ROWS, 0, 2, E, V},
    {"blk.0.attn_norm.weight", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 1, E, 1},
    {"blk.0.attn_q.weight", IE_DTYPE_I4W, IE_LAYOUT_PANEL16, 32, 2, E, 64},
    {"blk.0.attn_k.weight", IE_DTYPE_I8W, IE_LAYOUT_ROWS, 64, 2, E, 32},
    {"blk.0.attn_v.weight", IE_DTYPE_Q8_0, IE_LAYOUT_ROWS, 0, 2, E, 32},
    {"blk.0.attn_output.weight", IE_DTYPE_Q4_0, IE_LAYOUT_ROWS, 0, 2, 64, E},
    {"blk.0.ffn_norm.weight", IE_DTYPE_F32, IE_LAYOUT_ROWS, 0, 1, E, 1},
    {"blk.0.ffn_gate.weight", IE_DTYPE_I4WA, IE_LAYOUT_PANEL16, 32, 2, E, F},
    {"blk.0.ffn_up.weight", IE_DTYPE_BF16, IE_LAYOUT_ROWS, 0, 2, E, F},
    {"blk.0.ffn_down.weight", IE_DTYPE_F16, IE_LAYOUT_ROWS, 0, 2, F, E},
    {"blk.0.extra_bsr.weight", IE_DTYPE_F32, IE_LAYOUT_BSR, 0, 2, 64, 32},
    {"blk.0.extra_i8p.weight", IE_DTYPE_I8W, IE_LAYOUT_PANEL16, 64, 2, 64, 20},
};
#define N_SPECS ((int)(sizeof k_specs / sizeof k_specs[0]))

typedef struct tdata {
    void *p;
    size_t n;
} tdata_t;

static tdata_t g_data[N_SPECS];

static uint32_t g_rng = 12345;
static uint8_t rnd8(void)
{
    g_rng = g_rng * 1664525u + 1013904223u;
    return (uint8_t)(g_rng >> 24);
}

/* Bytes for every spec (arbitrary content; BSR a real blob). */
static void make_data(void)
{
    for (int i = 0; i < N_SPECS; i++) {
        const spec_t *s = &k_specs[i];
        if (g_data[i].p) continue;
        if (s->lay == IE_LAYOUT_BSR) {
            float *w = calloc((size_t)(s->ne0 * s->ne1), sizeof *w);
            for (int64_t r = 0; r < s->ne1; r++)
                for (int64_t c = 0; c < s->ne0; c++)
                    if (((r / 16) + (c / 16)) % 2 == 0) w[r * s->ne0 + c] = (float)(rnd8() + 1) / 64.0f;
            if (ie_bsr_from_dense(w, s->ne0, s->ne1, 16, 16, 0.0f, &g_data[i].p, &g_data[i].n) != 0) abort();
            free(w);
            continue;
        }
        g_data[i].n = ie_tensor_bytes(s->dt, s->lay, s->group, s->ne0, s->ne1);
        if (!g_data[i].n) abort();
        g_data[i].p = malloc(g_data[i].n);
        for (size_t k = 0; k < g_data[i].n; k++) ((uint8_t *)g_data[i].p)[k] = rnd8();
    }
}

static ie_tensor_t spec_tensor(int i)
{
    const spec_t *s = &k_specs[i];
    ie_tensor_t t = {s->name, s->dt, s->n_dims, {s->ne0, s->ne1, 1, 1}, g_data[i].p, g_data[i].n, s->lay, s->group};
    return t;
}

/* Write the tiny model into `dir`, leaving out spec `skip` (-1: none). */
static ie_status_t write_model(const char *dir, int skip, const char *tokenizer)
{
    ie_iebin_writer_t *w = NULL;
    ie_hparams_t hp = tiny_hp();
    ie_status_t st;

    make_data();
    if ((st = ie_iebin_writer_open(dir, &w)) != IE_OK) return st;
    for (int i = 0; i < N_SPECS; i++) {
        ie_tensor_t t = spec_tensor(i);
        if (i == skip) continue;
        st = ie_iebin_writer_add(w, &t, t.dtype == IE_DTYPE_I4W ? "{\"scheme\":\"int4w\",\"group\":32}" : NULL);
        if (st != IE_OK) {
            ie_iebin_writer_abort(&w);
            return st;
        }
    }
    if ((st = ie_iebin_writer_set_tokenizer(w, tokenizer)) != IE_OK) {
        ie_iebin_writer_abort(&w);
        return st;
    }
    return ie_iebin_writer_finish(&w, &hp, "{\"tool\":\"test_iebin\",\"source\":\"synthetic\"}");
}

#define TOK_JSON IE_TEST_DATA "/tiny_llama/tokenizer.json"

/* Compare two tokenizers' ids on a few texts. */
static void same_ids(const char *path_a, const char *path_b)
{
    static const char *texts[] = {"Hello world", "  The quick brown fox, 12345!\n", "ünïcödé ✓ 漢字", ""};
    ie_tokenizer_t *a = NULL, *b = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_tokenizer_load(path_a, &a), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_tokenizer_load(path_b, &b), IE_OK);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ia = NULL, *ib = NULL;
        size_t na = 0, nb = 0;
        CU_ASSERT_EQUAL(ie_tokenizer_encode(a, texts[i], strlen(texts[i]), IE_TOK_ADD_SPECIAL, &ia, &na), IE_OK);
        CU_ASSERT_EQUAL(ie_tokenizer_encode(b, texts[i], strlen(texts[i]), IE_TOK_ADD_SPECIAL, &ib, &nb), IE_OK);
        CU_ASSERT_EQUAL(na, nb);
        CU_ASSERT(na == nb && (na == 0 || memcmp(ia, ib, na * sizeof *ia) == 0));
        CU_ASSERT(strlen(texts[i]) == 0 || na > 0);
        free(ia);
        free(ib);
    }
    ie_tokenizer_destroy(&a);
    ie_tokenizer_destroy(&b);
}

/* ---------------------------------------------------------------- round trip */

/* `mapped`: the data comes from an IEBIN blob, so its alignment is known. */
static void check_tensors(const ie_model_src_t *src, int mapped)
{
    for (int i = 0; i < N_SPECS; i++) {
        const spec_t *s = &k_specs[i];
        const ie_tensor_t *t = ie_model_src_tensor(src, s->name);
        CU_ASSERT_PTR_NOT_NULL_FATAL(t);
        CU_ASSERT_STRING_EQUAL(t->name, s->name);
        CU_ASSERT_EQUAL(t->dtype, s->dt);
        CU_ASSERT_EQUAL(t->layout, s->lay);
        CU_ASSERT_EQUAL(t->group, s->group);
        CU_ASSERT_EQUAL(t->n_dims, s->n_dims);
        CU_ASSERT_EQUAL(t->ne[0], s->ne0);
        CU_ASSERT_EQUAL(t->ne[1], s->ne1);
        CU_ASSERT_EQUAL(t->ne[2], 1);
        CU_ASSERT_EQUAL(t->nbytes, g_data[i].n);
        CU_ASSERT(memcmp(t->data, g_data[i].p, g_data[i].n) == 0);
        CU_ASSERT(!mapped || (uintptr_t)t->data % (t->nbytes >= 65536 ? 4096 : 64) == 0);
    }
}

static void test_roundtrip(void)
{
    char dir[128], path[256];
    ie_model_src_t *src = NULL;
    ie_iebin_t *m = NULL;
    ie_hparams_t hp = tiny_hp();
    const ie_hparams_t *got;

    new_dir(dir, sizeof dir);
    CU_ASSERT_EQUAL_FATAL(write_model(dir, -1, TOK_JSON), IE_OK);
    CU_ASSERT(exists(dir, "model.ie.json") && exists(dir, "model.ie.bin") && exists(dir, "tokenizer.json"));
    CU_ASSERT(exists(dir, "tokenizer_config.json"));
    CU_ASSERT_EQUAL(count_files(dir), 4); /* no temporaries left */
    CU_ASSERT(ie_iebin_detect(dir));
    snprintf(path, sizeof path, "%s/model.ie.json", dir);
    CU_ASSERT(ie_iebin_detect(path));
    CU_ASSERT(!ie_iebin_detect(IE_TEST_DATA "/tiny_llama"));
    CU_ASSERT(!ie_iebin_detect(IE_TEST_DATA "/tiny_llama_f32.gguf"));

    /* through the model source, by directory and by json path */
    for (int k = 0; k < 2; k++) {
        ie_status_t st = ie_model_src_open(k ? path : dir, &src);
        CU_ASSERT_EQUAL_FATAL(st, IE_OK);
        if (st != IE_OK) printf("\n%s\n", ie_error_last());
        CU_ASSERT_EQUAL(ie_model_src_kind(src), IE_SRC_IEBIN);
        got = ie_model_src_hparams(src);
        CU_ASSERT(memcmp(got, &hp, sizeof hp) == 0);
        CU_ASSERT_STRING_EQUAL(got->name, "tiny iebin");
        CU_ASSERT_EQUAL(got->rope_layout, IE_ROPE_NEOX);
        check_tensors(src, 1);
        CU_ASSERT_EQUAL(ie_model_src_n_tensors(src), N_SPECS);
        for (int64_t i = 1; i < ie_model_src_n_tensors(src); i++)
            CU_ASSERT(strcmp(ie_model_src_tensor_at(src, i - 1)->name, ie_model_src_tensor_at(src, i)->name) < 0);
        CU_ASSERT_PTR_NULL(ie_model_src_tensor_at(src, N_SPECS));
        CU_ASSERT_PTR_NULL(ie_model_src_gguf(src));
        CU_ASSERT(strstr(ie_model_src_tokenizer_path(src), "/tokenizer.json") != NULL);
        if (k == 0) same_ids(ie_model_src_tokenizer_path(src), TOK_JSON);
        ie_model_src_destroy(&src);
    }

    /* the reader on its own: file order, hash, quant ignored */
    CU_ASSERT_EQUAL_FATAL(ie_iebin_open(dir, &m), IE_OK);
    CU_ASSERT_EQUAL(ie_iebin_n_tensors(m), N_SPECS);
    for (int i = 0; i < N_SPECS; i++) CU_ASSERT_STRING_EQUAL(ie_iebin_tensor(m, i)->name, k_specs[i].name);
    CU_ASSERT_PTR_NULL(ie_iebin_tensor(m, N_SPECS));
    CU_ASSERT_EQUAL(strlen(ie_iebin_content_hash(m)), 9 + 32);
    CU_ASSERT(strncmp(ie_iebin_content_hash(m), "xxh3-128:", 9) == 0);
    ie_iebin_destroy(&m);
    ie_iebin_destroy(&m); /* NULL-safe */
    rm_tree(dir);
}

/* Every hyper-parameter survives, GPT-OSS ones and layer_swa included. */
static void test_hparams_gptoss(void)
{
    char dir[128];
    ie_iebin_writer_t *w = NULL;
    ie_iebin_t *m = NULL;
    ie_hparams_t hp = tiny_hp();

    snprintf(hp.arch, sizeof hp.arch, "gpt-oss");
    hp.arch_id = IE_ARCH_GPTOSS;
    hp.n_layer = 5;
    hp.n_expert = 8;
    hp.n_expert_used = 2;
    hp.sliding_window = 128;
    hp.layer_swa[0] = hp.layer_swa[2] = hp.layer_swa[4] = 1;
    hp.attn_bias = hp.attn_sinks = 1;
    hp.swiglu_limit = 7.0f;
    hp.swiglu_alpha = 1.702f;
    hp.rope_yarn_factor = 32.0f;
    hp.rope_yarn_orig_ctx = 4096;
    hp.rope_yarn_beta_fast = 32.0f;
    hp.rope_yarn_beta_slow = 1.0f;
    hp.rope_yarn_truncate = 1;
    hp.rope_attn_factor = 1.3465736f;
    hp.rope_theta = 150000.0f;
    hp.rms_eps = 1e-5f;
    hp.tied_embeddings = 1;
    hp.rope_layout = IE_ROPE_NORMAL;

    new_dir(dir, sizeof dir);
    CU_ASSERT_EQUAL_FATAL(ie_iebin_writer_open(dir, &w), IE_OK);
    CU_ASSERT_EQUAL(ie_iebin_writer_set_tokenizer(w, IE_TEST_DATA "/o200k_base.tiktoken"), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_iebin_writer_finish(&w, &hp, NULL), IE_OK);
    CU_ASSERT_PTR_NULL(w);
    CU_ASSERT(exists(dir, "o200k_base.tiktoken") && exists(dir, "o200k_harmony_special_tokens.json"));
    CU_ASSERT_EQUAL_FATAL(ie_iebin_open(dir, &m), IE_OK);
    CU_ASSERT(memcmp(ie_iebin_hparams(m), &hp, sizeof hp) == 0);
    CU_ASSERT_EQUAL(ie_iebin_n_tensors(m), 0);
    CU_ASSERT(strstr(ie_iebin_tokenizer_path(m), "o200k_base.tiktoken") != NULL);
    ie_iebin_destroy(&m);
    rm_tree(dir);
}

/* ---------------------------------------------------------------- GGUF tokenizer */

static void check_tok_gguf(const char *src_gguf)
{
    char dir[128], tok[256];
    ie_iebin_writer_t *w = NULL;
    ie_hparams_t hp = tiny_hp();
    ie_gguf_t *a = NULL, *b = NULL;
    int64_t n_want = 0;

    new_dir(dir, sizeof dir);
    CU_ASSERT_EQUAL_FATAL(ie_iebin_writer_open(dir, &w), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_iebin_writer_set_tokenizer(w, src_gguf), IE_OK);
    CU_ASSERT_EQUAL(ie_iebin_writer_set_tokenizer(w, src_gguf), IE_ERR_INVAL); /* once */
    CU_ASSERT_EQUAL_FATAL(ie_iebin_writer_finish(&w, &hp, NULL), IE_OK);
    snprintf(tok, sizeof tok, "%s/tokenizer.gguf", dir);

    CU_ASSERT_EQUAL_FATAL(ie_gguf_open(src_gguf, &a), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_gguf_open(tok, &b), IE_OK);
    CU_ASSERT_EQUAL(ie_gguf_version(b), 3);
    CU_ASSERT_EQUAL(ie_gguf_tensor_count(b), 0);
    for (int64_t i = 0; i < ie_gguf_kv_count(a); i++) {
        ie_gguf_str_t k = ie_gguf_kv_key(a, i);
        char key[256];
        int64_t j;
        if (!((k.len > 10 && !memcmp(k.ptr, "tokenizer.", 10)) ||
              (k.len == 20 && !memcmp(k.ptr, "general.architecture", 20))))
            continue;
        n_want++;
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        j = ie_gguf_find_key(b, key);
        CU_ASSERT(j >= 0);
        if (j < 0) continue;
        CU_ASSERT_EQUAL(ie_gguf_kv_type(b, j), ie_gguf_kv_type(a, i));
        if (ie_gguf_kv_type(a, i) == IE_GGUF_ARRAY) {
            ie_gguf_type_t ta, tb;
            uint64_t la, lb;
            ie_gguf_get_arr(a, key, &ta, &la);
            ie_gguf_get_arr(b, key, &tb, &lb);
            CU_ASSERT(ta == tb && la == lb);
            if (ta == IE_GGUF_STRING && la == lb && la > 0) {
                ie_gguf_str_t sa, sb;
                ie_gguf_arr_str(a, key, la - 1, &sa);
                ie_gguf_arr_str(b, key, la - 1, &sb);
                CU_ASSERT(sa.len == sb.len && memcmp(sa.ptr, sb.ptr, sa.len) == 0);
            }
        }
    }
    CU_ASSERT(n_want > 3);
    CU_ASSERT_EQUAL(ie_gguf_kv_count(b), n_want);
    ie_gguf_destroy(&a);
    ie_gguf_destroy(&b);
    same_ids(src_gguf, tok);
    rm_tree(dir);
}

static void test_tokenizer_gguf(void)
{
    check_tok_gguf(IE_TEST_DATA "/tiny_llama_f32.gguf");       /* gpt2 BPE + a model's tensors skipped */
    check_tok_gguf(IE_TEST_DATA "/ggml-vocab-llama-spm.gguf"); /* SPM: scores f32[], token_type i32[] */
}

/* ---------------------------------------------------------------- corruption */

static char g_base[128]; /* a valid model, copied per case */

static void copy_model(const char *from, const char *to)
{
    static const char *files[] = {"model.ie.json", "model.ie.bin", "tokenizer.json", "tokenizer_config.json"};
    char a[512], b[512];
    mkdir(to, 0755);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        size_t n;
        char *p;
        snprintf(a, sizeof a, "%s/%s", from, files[i]);
        snprintf(b, sizeof b, "%s/%s", to, files[i]);
        p = slurp(a, &n);
        spit(b, p, n);
        free(p);
    }
}

/* Open `dir` through the model source: expect `want` and `sub` in a one-line message. */
static void expect(const char *dir, ie_status_t want, const char *sub, int line)
{
    ie_model_src_t *src = NULL;
    ie_status_t st = ie_model_src_open(dir, &src);
    int ok = st == want &&
             (st == IE_OK || (src == NULL && strstr(ie_error_last(), sub) && !strchr(ie_error_last(), '\n')));
    if (!ok)
        printf("\nline %d: status %s, message '%s' (wanted %s with '%s')\n", line, ie_status_str(st),
               ie_error_last(), ie_status_str(want), sub);
    CU_ASSERT(ok);
    ie_model_src_destroy(&src);
}
#define EXPECT(dir, want, sub) expect(dir, want, sub, __LINE__)

typedef void (*json_edit_fn)(cJSON *root);

/* A copy of the base model with its json edited by fn; returns the dir. */
static void edited(char *dir, size_t cap, json_edit_fn fn)
{
    char path[256];
    cJSON *root;
    char *text;
    new_dir(dir, cap);
    copy_model(g_base, dir);
    snprintf(path, sizeof path, "%s/model.ie.json", dir);
    text = slurp(path, NULL);
    root = cJSON_Parse(text);
    free(text);
    fn(root);
    text = cJSON_Print(root);
    spit(path, text, strlen(text));
    free(text);
    cJSON_Delete(root);
}

static cJSON *tensor_j(cJSON *root, int i) { return cJSON_GetArrayItem(cJSON_GetObjectItem(root, "tensors"), i); }
static void set_num(cJSON *o, const char *k, double v) { cJSON_SetNumberValue(cJSON_GetObjectItem(o, k), v); }
static double get_num(cJSON *o, const char *k) { return cJSON_GetObjectItem(o, k)->valuedouble; }
static void set_str(cJSON *o, const char *k, const char *v)
{
    cJSON_ReplaceItemInObject(o, k, cJSON_CreateString(v));
}

static void ed_version(cJSON *r) { set_num(r, "version", 2); }
static void ed_format(cJSON *r) { set_str(r, "format", "gguf"); }
static void ed_overlap(cJSON *r) { set_num(tensor_j(r, 3), "offset", get_num(tensor_j(r, 1), "offset")); }
static void ed_misalign(cJSON *r) { set_num(tensor_j(r, 3), "offset", get_num(tensor_j(r, 3), "offset") + 8); }
static void ed_page(cJSON *r) { set_num(tensor_j(r, 0), "offset", 64); }
static void ed_size(cJSON *r) { set_num(tensor_j(r, 6), "size", get_num(tensor_j(r, 6), "size") + 34); }
static void ed_dtype(cJSON *r) { set_str(tensor_j(r, 6), "dtype", "q5_k"); }
static void ed_group(cJSON *r) { set_num(tensor_j(r, 4), "group", 48); }
static void ed_panel_f16(cJSON *r) { set_str(tensor_j(r, 11), "layout", "panel16"); }
static void ed_layout(cJSON *r) { set_str(tensor_j(r, 11), "layout", "cols"); }
static void ed_xxh3(cJSON *r) { set_str(tensor_j(r, 2), "xxh3", "0123456789abcdef"); }
static void ed_hash(cJSON *r) { set_str(r, "content_hash", "xxh3-128:00000000000000000000000000000000"); }
static void ed_dup(cJSON *r) { set_str(tensor_j(r, 3), "name", "output_norm.weight"); }
static void ed_range(cJSON *r)
{
    set_num(tensor_j(r, 13), "offset", ((long long)get_num(r, "blob_size") + 63) / 64 * 64);
}
static void ed_hp(cJSON *r) { set_num(cJSON_GetObjectItem(r, "hparams"), "n_head", 0); }
static void ed_hp_type(cJSON *r) { set_str(cJSON_GetObjectItem(r, "hparams"), "rms_eps", "small"); }
static void ed_rope(cJSON *r) { set_str(cJSON_GetObjectItem(r, "hparams"), "rope_layout", "sideways"); }
static void ed_swa(cJSON *r)
{
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(r, "hparams"), "layer_swa", cJSON_CreateIntArray((int[]){3}, 1));
}
static void ed_shape(cJSON *r) { cJSON_ReplaceItemInObject(tensor_j(r, 1), "shape", cJSON_CreateString("64")); }
static void ed_tok(cJSON *r) { set_str(cJSON_GetObjectItem(r, "tokenizer"), "file", "../etc/passwd"); }
static void ed_tok_kind(cJSON *r) { set_str(cJSON_GetObjectItem(r, "tokenizer"), "kind", "sentencepiece"); }
static void ed_arch(cJSON *r) { set_str(r, "arch", "mamba"); }
static void ed_bsr(cJSON *r) { set_str(tensor_j(r, 12), "dtype", "f16"); }
static void ed_nothing(cJSON *r) { (void)r; }

static void test_corruption(void)
{
    static const struct {
        json_edit_fn fn;
        const char *sub;
    } cases[] = {
        {ed_version, "version 2 is not supported"},
        {ed_format, "'format' is 'gguf'"},
        {ed_overlap, "overlap"},
        {ed_misalign, "is not a multiple of 64"},
        {ed_page, "'token_embd.weight': offset 64 is not a multiple of 4096"},
        {ed_size, "'blk.0.attn_v.weight': size"},
        {ed_dtype, "unknown dtype 'q5_k'"},
        {ed_group, "group 48 is not valid"},
        {ed_panel_f16, "layout panel16 needs dtype int8w"},
        {ed_layout, "unknown layout 'cols'"},
        {ed_xxh3, "content_hash"},
        {ed_hash, "does not match the tensor table"},
        {ed_dup, "'output_norm.weight' appears more than once"},
        {ed_range, "extend past the end of model.ie.bin"},
        {ed_hp, "'n_head' must be an integer in [1, 1048576]"},
        {ed_hp_type, "'rms_eps' must be a finite number"},
        {ed_rope, "'rope_layout' is 'sideways'"},
        {ed_swa, "'layer_swa' entries"},
        {ed_shape, "'shape' must be an array"},
        {ed_tok, "plain file name"},
        {ed_tok_kind, "'kind' is 'sentencepiece'"},
        {ed_arch, "'arch' is 'mamba'"},
        {ed_bsr, "layout bsr needs dtype f32"},
    };
    char dir[128], path[256];
    size_t n;
    char *p;

    new_dir(g_base, sizeof g_base);
    CU_ASSERT_EQUAL_FATAL(write_model(g_base, -1, TOK_JSON), IE_OK);
    EXPECT(g_base, IE_OK, "");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        edited(dir, sizeof dir, cases[i].fn);
        EXPECT(dir, IE_ERR_FORMAT, cases[i].sub);
        rm_tree(dir);
    }

    /* bad JSON */
    new_dir(dir, sizeof dir);
    copy_model(g_base, dir);
    snprintf(path, sizeof path, "%s/model.ie.json", dir);
    spit(path, "{\"format\": \"iebin\", ", 20);
    EXPECT(dir, IE_ERR_FORMAT, "not valid JSON");
    spit(path, "[1, 2]", 6);
    EXPECT(dir, IE_ERR_FORMAT, "must hold a JSON object");
    rm_tree(dir);

    /* truncated blob */
    new_dir(dir, sizeof dir);
    copy_model(g_base, dir);
    snprintf(path, sizeof path, "%s/model.ie.bin", dir);
    p = slurp(path, &n);
    spit(path, p, n - 100);
    EXPECT(dir, IE_ERR_FORMAT, "blob_size");
    /* a flipped data byte: the tensor's hash, unless IE_IEBIN_VERIFY=0 */
    p[n - 1] ^= 0x40;
    spit(path, p, n);
    EXPECT(dir, IE_ERR_FORMAT, "'blk.0.extra_i8p.weight': data hash");
    setenv("IE_IEBIN_VERIFY", "0", 1);
    EXPECT(dir, IE_OK, "");
    unsetenv("IE_IEBIN_VERIFY");
    free(p);
    rm_tree(dir);

    /* a corrupted BSR blob (rowptr) */
    new_dir(dir, sizeof dir);
    copy_model(g_base, dir);
    {
        ie_iebin_t *m = NULL;
        uint64_t off;
        setenv("IE_IEBIN_VERIFY", "0", 1);
        CU_ASSERT_EQUAL_FATAL(ie_iebin_open(dir, &m), IE_OK);
        off = (uint64_t)((const uint8_t *)ie_iebin_tensor(m, 12)->data -
                         (const uint8_t *)ie_iebin_tensor(m, 0)->data);
        ie_iebin_destroy(&m);
        snprintf(path, sizeof path, "%s/model.ie.bin", dir);
        p = slurp(path, &n);
        memset(p + off + 24, 0xff, 4); /* rowptr[0] */
        spit(path, p, n);
        free(p);
        EXPECT(dir, IE_ERR_FORMAT, "'blk.0.extra_bsr.weight': bad BSR blob");
        unsetenv("IE_IEBIN_VERIFY");
    }
    rm_tree(dir);

    /* missing tokenizer file */
    new_dir(dir, sizeof dir);
    copy_model(g_base, dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    EXPECT(dir, IE_ERR_FORMAT, "tokenizer file");
    rm_tree(dir);

    /* missing blob */
    new_dir(dir, sizeof dir);
    copy_model(g_base, dir);
    snprintf(path, sizeof path, "%s/model.ie.bin", dir);
    unlink(path);
    EXPECT(dir, IE_ERR_IO, "model.ie.bin");
    rm_tree(dir);

    /* a tensor the architecture needs is absent: same error as other formats */
    new_dir(dir, sizeof dir);
    CU_ASSERT_EQUAL_FATAL(write_model(dir, 11, TOK_JSON), IE_OK);
    EXPECT(dir, IE_ERR_FORMAT, "missing tensor 'blk.0.ffn_down.weight'");
    rm_tree(dir);

    edited(dir, sizeof dir, ed_nothing); /* cJSON re-print of a valid file still opens */
    EXPECT(dir, IE_OK, "");
    rm_tree(dir);
    rm_tree(g_base);
}

/* open_memory: the same checks without files (what the fuzzer drives). */
static void test_open_memory(void)
{
    char dir[128], path[256];
    size_t jn, bn;
    char *json, *blob, *p;
    ie_iebin_t *m = (ie_iebin_t *)dir;

    new_dir(dir, sizeof dir);
    CU_ASSERT_EQUAL_FATAL(write_model(dir, -1, TOK_JSON), IE_OK);
    snprintf(path, sizeof path, "%s/model.ie.json", dir);
    json = slurp(path, &jn);
    snprintf(path, sizeof path, "%s/model.ie.bin", dir);
    p = slurp(path, &bn);
    blob = aligned_alloc(64, (bn + 63) / 64 * 64); /* BSR blobs must be 64-byte aligned in memory */
    memcpy(blob, p, bn);
    free(p);
    p = aligned_alloc(64, (bn + 64 + 63) / 64 * 64); /* the same blob 16 bytes off alignment */
    memcpy(p + 16, blob, bn);
    CU_ASSERT_EQUAL(ie_iebin_open_memory(json, jn, p + 16, bn, NULL, &m), IE_ERR_FORMAT);
    CU_ASSERT(strstr(ie_error_last(), "'blk.0.extra_bsr.weight': BSR blob is not 64-byte aligned") != NULL);
    free(p);
    CU_ASSERT_EQUAL_FATAL(ie_iebin_open_memory(json, jn, blob, bn, NULL, &m), IE_OK);
    CU_ASSERT_STRING_EQUAL(ie_iebin_tokenizer_path(m), "tokenizer.json");
    ie_iebin_destroy(&m);
    m = (ie_iebin_t *)dir;
    CU_ASSERT_EQUAL(ie_iebin_open_memory(json, jn, blob, bn - 1, NULL, &m), IE_ERR_FORMAT);
    CU_ASSERT(strstr(ie_error_last(), "blob_size") != NULL);
    CU_ASSERT_PTR_NULL(m);
    /* every strict prefix of the json is rejected without crashing */
    for (size_t k = 0; k < jn; k += 97)
        CU_ASSERT_NOT_EQUAL(ie_iebin_open_memory(json, k, blob, bn, NULL, &m), IE_OK);
    CU_ASSERT_EQUAL(ie_iebin_open_memory(NULL, 0, NULL, 0, NULL, &m), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_iebin_open(IE_TEST_DATA "/tiny_llama", &m), IE_ERR_IO);
    free(json);
    free(blob);
    rm_tree(dir);
}

/* ---------------------------------------------------------------- writer misuse */

static void test_writer_errors(void)
{
    char dir[128];
    ie_iebin_writer_t *w = NULL;
    ie_hparams_t hp = tiny_hp();
    ie_tensor_t t;

    make_data();
    new_dir(dir, sizeof dir);
    CU_ASSERT_EQUAL_FATAL(ie_iebin_writer_open(dir, &w), IE_OK);
    t = spec_tensor(4);
    CU_ASSERT_EQUAL(ie_iebin_writer_add(w, &t, NULL), IE_OK);
    CU_ASSERT_EQUAL(ie_iebin_writer_add(w, &t, NULL), IE_ERR_INVAL); /* twice */
    t = spec_tensor(5);
    t.nbytes -= 1;
    CU_ASSERT_EQUAL(ie_iebin_writer_add(w, &t, NULL), IE_ERR_INVAL);
    CU_ASSERT(strstr(ie_error_last(), "blk.0.attn_k.weight") != NULL);
    t = spec_tensor(5);
    t.group = 40;
    CU_ASSERT_EQUAL(ie_iebin_writer_add(w, &t, NULL), IE_ERR_INVAL);
    t = spec_tensor(6);
    t.layout = IE_LAYOUT_PANEL16;
    CU_ASSERT_EQUAL(ie_iebin_writer_add(w, &t, NULL), IE_ERR_INVAL);
    t = spec_tensor(6);
    t.dtype = IE_DTYPE_Q8_P;
    CU_ASSERT_EQUAL(ie_iebin_writer_add(w, &t, NULL), IE_ERR_INVAL);
    t = spec_tensor(12);
    ((uint8_t *)g_data[12].p)[0] ^= 1; /* BSR magic */
    CU_ASSERT_EQUAL(ie_iebin_writer_add(w, &t, NULL), IE_ERR_INVAL);
    ((uint8_t *)g_data[12].p)[0] ^= 1;
    t = spec_tensor(6);
    CU_ASSERT_EQUAL(ie_iebin_writer_add(w, &t, "[1,2]"), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_iebin_writer_set_tokenizer(w, IE_TEST_DATA "/no_such_tokenizer.json"), IE_ERR_IO);
    ie_iebin_writer_abort(&w);
    CU_ASSERT_PTR_NULL(w);
    CU_ASSERT_EQUAL(count_files(dir), 0); /* temporaries removed */

    /* finish without a tokenizer, with bad hparams: fails, removes temporaries */
    CU_ASSERT_EQUAL_FATAL(ie_iebin_writer_open(dir, &w), IE_OK);
    CU_ASSERT_EQUAL(ie_iebin_writer_finish(&w, &hp, NULL), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(w);
    CU_ASSERT_EQUAL(count_files(dir), 0);
    CU_ASSERT_EQUAL_FATAL(ie_iebin_writer_open(dir, &w), IE_OK);
    CU_ASSERT_EQUAL(ie_iebin_writer_set_tokenizer(w, TOK_JSON), IE_OK);
    hp.n_head = 0;
    CU_ASSERT_EQUAL(ie_iebin_writer_finish(&w, &hp, NULL), IE_ERR_INVAL);
    CU_ASSERT(strstr(ie_error_last(), "n_head") != NULL);
    CU_ASSERT_EQUAL(count_files(dir), 0);
    hp = tiny_hp();
    CU_ASSERT_EQUAL_FATAL(ie_iebin_writer_open(dir, &w), IE_OK);
    CU_ASSERT_EQUAL(ie_iebin_writer_set_tokenizer(w, TOK_JSON), IE_OK);
    CU_ASSERT_EQUAL(ie_iebin_writer_finish(&w, &hp, "not json"), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(count_files(dir), 0);
    ie_iebin_writer_abort(&w); /* NULL-safe */
    rm_tree(dir);
}

/* ---------------------------------------------------------------- k-quants */

static const ie_dtype_t k_kq_types[] = {IE_DTYPE_Q5_0, IE_DTYPE_Q5_1, IE_DTYPE_IQ4_NL,
                                        IE_DTYPE_Q2_K, IE_DTYPE_Q3_K, IE_DTYPE_Q4_K,
                                        IE_DTYPE_Q5_K, IE_DTYPE_Q6_K, IE_DTYPE_IQ4_XS};
#define N_KQ ((int)(sizeof k_kq_types / sizeof k_kq_types[0]))

/* ie_iebin_open on dir: expect `want` and, on failure, `sub` in the message. */
static void expect_open(const char *dir, ie_status_t want, const char *sub, int line)
{
    ie_iebin_t *m = NULL;
    ie_status_t st = ie_iebin_open(dir, &m);
    int ok = st == want && (st == IE_OK || (m == NULL && strstr(ie_error_last(), sub)));
    if (!ok)
        printf("\nline %d: status %s, message '%s' (wanted %s with '%s')\n", line, ie_status_str(st),
               ie_error_last(), ie_status_str(want), sub);
    CU_ASSERT(ok);
    ie_iebin_destroy(&m);
}
#define EXPECT_OPEN(dir, want, sub) expect_open(dir, want, sub, __LINE__)

/* Rewrite dir's model.ie.json with tensor i's field `key` set to a string
 * (str != NULL) or a number. */
static void edit_tensor(const char *dir, int i, const char *key, const char *str, double num)
{
    char path[256];
    snprintf(path, sizeof path, "%s/model.ie.json", dir);
    char *text = slurp(path, NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (str) set_str(tensor_j(root, i), key, str);
    else set_num(tensor_j(root, i), key, num);
    text = cJSON_Print(root);
    spit(path, text, strlen(text));
    free(text);
    cJSON_Delete(root);
}

/* Every k-quant is named and sized by IEBIN: a 2-D (two super-blocks per
 * row) and a 3-D tensor of each round-trip byte for byte under
 * ie_dtype_name's spelling; a row length that is not a whole number of
 * blocks, a wrong byte count and a packed k-quant with the wrong group are
 * refused by the writer (IE_ERR_INVAL) and the reader (IE_ERR_FORMAT),
 * naming the tensor. */
static void test_kquant_tensors(void)
{
    char dir[128], name[64], path[256];
    ie_iebin_writer_t *w = NULL;
    ie_iebin_t *m = NULL;
    ie_hparams_t hp = tiny_hp();
    void *bytes[2 * N_KQ];
    size_t nb[2 * N_KQ];

    new_dir(dir, sizeof dir);
    CU_ASSERT_EQUAL_FATAL(ie_iebin_writer_open(dir, &w), IE_OK);
    for (int i = 0; i < 2 * N_KQ; i++) {
        ie_dtype_t dt = k_kq_types[i % N_KQ];
        int three = i >= N_KQ;
        int64_t n_in = 2 * IE_QK_K, n_out = 3;
        ie_tensor_t t = {NULL, dt, three ? 3 : 2, {n_in, n_out, three ? 2 : 1, 1}, NULL, 0, IE_LAYOUT_ROWS, 0};
        snprintf(name, sizeof name, "blk.0.kq%d_%s.weight", three ? 3 : 2, ie_dtype_name(dt));
        t.name = name;
        nb[i] = ie_dtype_row_bytes(dt, n_in) * (size_t)n_out * (three ? 2 : 1);
        CU_ASSERT_FATAL(nb[i] > 0);
        bytes[i] = malloc(nb[i]);
        for (size_t k = 0; k < nb[i]; k++) ((uint8_t *)bytes[i])[k] = rnd8();
        t.data = bytes[i];
        t.nbytes = nb[i];
        CU_ASSERT_EQUAL(ie_iebin_writer_add(w, &t, "{\"scheme\":\"ggml\"}"), IE_OK);
    }
    /* a packed k-quant: group = its block size, panels of 16 rows */
    void *packed = NULL;
    size_t packed_n = ie_tensor_bytes(IE_DTYPE_Q6_K, IE_LAYOUT_PANEL16, IE_QK_K, 2 * IE_QK_K, 20);
    CU_ASSERT_FATAL(packed_n == 2 * (size_t)ie_pack_panel_bytes(IE_DTYPE_Q6_K, IE_QK_K, 2 * IE_QK_K));
    packed = malloc(packed_n);
    for (size_t k = 0; k < packed_n; k++) ((uint8_t *)packed)[k] = rnd8();
    {
        ie_tensor_t t = {"blk.0.kq_packed.weight", IE_DTYPE_Q6_K, 2, {2 * IE_QK_K, 20, 1, 1}, packed, packed_n,
                         IE_LAYOUT_PANEL16,        IE_QK_K};
        CU_ASSERT_EQUAL(ie_iebin_writer_add(w, &t, NULL), IE_OK);
    }
    /* the writer refuses: partial block, wrong size, packed with group 0 */
    {
        static uint8_t junk[4096];
        ie_tensor_t t = {"blk.0.bad.weight", IE_DTYPE_Q4_K, 2, {288, 2, 1, 1}, junk, 288, IE_LAYOUT_ROWS, 0};
        CU_ASSERT_EQUAL(ie_iebin_writer_add(w, &t, NULL), IE_ERR_INVAL);
        CU_ASSERT(strstr(ie_error_last(), "'blk.0.bad.weight': row length 288 is not a multiple of q4_K's block "
                                          "of 256") != NULL);
        t.dtype = IE_DTYPE_Q5_0;
        t.ne[0] = 48;
        CU_ASSERT_EQUAL(ie_iebin_writer_add(w, &t, NULL), IE_ERR_INVAL);
        CU_ASSERT(strstr(ie_error_last(), "row length 48 is not a multiple of q5_0's block of 32") != NULL);
        t.dtype = IE_DTYPE_Q6_K;
        t.ne[0] = 256;
        t.nbytes = 2 * 210 - 1;
        CU_ASSERT_EQUAL(ie_iebin_writer_add(w, &t, NULL), IE_ERR_INVAL);
        CU_ASSERT(strstr(ie_error_last(), "'blk.0.bad.weight': 419 bytes given") != NULL);
        t.layout = IE_LAYOUT_PANEL16;
        CU_ASSERT_EQUAL(ie_iebin_writer_add(w, &t, NULL), IE_ERR_INVAL);
        CU_ASSERT(strstr(ie_error_last(), "panel16 q6_K needs group 256") != NULL);
    }
    CU_ASSERT_EQUAL(ie_iebin_writer_set_tokenizer(w, TOK_JSON), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_iebin_writer_finish(&w, &hp, NULL), IE_OK);

    CU_ASSERT_EQUAL_FATAL(ie_iebin_open(dir, &m), IE_OK);
    CU_ASSERT_EQUAL(ie_iebin_n_tensors(m), 2 * N_KQ + 1);
    {
        const ie_tensor_t *t = ie_iebin_tensor(m, 2 * N_KQ);
        CU_ASSERT_PTR_NOT_NULL_FATAL(t);
        CU_ASSERT(t->dtype == IE_DTYPE_Q6_K && t->layout == IE_LAYOUT_PANEL16 && t->group == IE_QK_K);
        CU_ASSERT(t->nbytes == packed_n && memcmp(t->data, packed, packed_n) == 0);
    }
    for (int i = 0; i < 2 * N_KQ && i < ie_iebin_n_tensors(m); i++) {
        const ie_tensor_t *t = ie_iebin_tensor(m, i);
        CU_ASSERT_EQUAL(t->dtype, k_kq_types[i % N_KQ]);
        CU_ASSERT_EQUAL(t->layout, IE_LAYOUT_ROWS);
        CU_ASSERT_EQUAL(t->group, 0);
        CU_ASSERT_EQUAL(t->n_dims, i >= N_KQ ? 3 : 2);
        CU_ASSERT_EQUAL(t->nbytes, nb[i]);
        CU_ASSERT(t->nbytes == nb[i] && memcmp(t->data, bytes[i], nb[i]) == 0);
    }
    ie_iebin_destroy(&m);
    /* the json names them as ie_dtype_name does */
    snprintf(path, sizeof path, "%s/model.ie.json", dir);
    {
        char *text = slurp(path, NULL);
        CU_ASSERT(strstr(text, "\"dtype\":\t\"q4_K\"") != NULL);
        CU_ASSERT(strstr(text, "\"dtype\":\t\"iq4_xs\"") != NULL);
        free(text);
    }

    /* the reader refuses edited entries (shape and size checks run before
     * the content hash, so each message is the field's own) */
    static const struct {
        int tensor;
        const char *key, *str;
        double num;
        const char *sub;
    } cases[] = {
        {5, "dtype", "q4_k", 0, "unknown dtype 'q4_k'"}, /* the spelling is ggml's: q4_K */
        {5, "dtype", "q8_K", 0, "unknown dtype 'q8_K'"}, /* activations only */
        {5, "size", NULL, 2 * 144 * 3 - 1, "'blk.0.kq2_q4_K.weight': size 863 does not match"},
        {7, "group", NULL, 256, "group 256 must be 0 for dtype q6_K"},
        {7, "layout", "panel16", 0, "panel16 q6_K needs group 256 (its block size), not 0"},
        {0, "dtype", "q4_K", 0, "'blk.0.kq2_q5_0.weight': size"}, /* q5_0's bytes are not q4_K's */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char d2[128];
        new_dir(d2, sizeof d2);
        copy_model(dir, d2);
        edit_tensor(d2, cases[c].tensor, cases[c].key, cases[c].str, cases[c].num);
        EXPECT_OPEN(d2, IE_ERR_FORMAT, cases[c].sub);
        rm_tree(d2);
    }
    /* a row length that is not whole super-blocks */
    {
        char d2[128];
        new_dir(d2, sizeof d2);
        copy_model(dir, d2);
        snprintf(path, sizeof path, "%s/model.ie.json", d2);
        char *text = slurp(path, NULL);
        cJSON *root = cJSON_Parse(text);
        free(text);
        cJSON_ReplaceItemInObject(tensor_j(root, 6), "shape", cJSON_CreateIntArray((int[]){320, 3}, 2));
        text = cJSON_Print(root);
        spit(path, text, strlen(text));
        free(text);
        cJSON_Delete(root);
        EXPECT_OPEN(d2, IE_ERR_FORMAT, "'blk.0.kq2_q5_K.weight': row length 320 is not a multiple of q5_K's block");
        rm_tree(d2);
    }
    /* a packed tensor whose group is not its block size */
    {
        char d2[128];
        new_dir(d2, sizeof d2);
        copy_model(dir, d2);
        edit_tensor(d2, 2 * N_KQ, "group", NULL, 32);
        EXPECT_OPEN(d2, IE_ERR_FORMAT,
                    "'blk.0.kq_packed.weight': panel16 q6_K needs group 256 (its block size), not 32");
        rm_tree(d2);
    }
    for (int i = 0; i < 2 * N_KQ; i++) free(bytes[i]);
    free(packed);
    rm_tree(dir);
}

/* ---------------------------------------------------------------- in-memory source */

static void test_mem_source(void)
{
    char dir[128];
    ie_model_src_t *src = NULL, *back = NULL;
    ie_iebin_writer_t *w = NULL;
    ie_hparams_t hp = tiny_hp();
    ie_tensor_t t;

    make_data();
    CU_ASSERT_EQUAL_FATAL(ie_model_src_new_mem(&hp, TOK_JSON, &src), IE_OK);
    CU_ASSERT_EQUAL(ie_model_src_kind(src), IE_SRC_MEM);
    for (int i = 0; i < N_SPECS; i++) {
        void *owned = NULL;
        t = spec_tensor(i);
        if (i % 2) { /* every other tensor adopted */
            owned = malloc(g_data[i].n);
            memcpy(owned, g_data[i].p, g_data[i].n);
            t.data = owned;
        }
        CU_ASSERT_EQUAL(ie_model_src_mem_add(src, &t, owned), IE_OK);
    }
    t = spec_tensor(6);
    t.nbytes--;
    CU_ASSERT_EQUAL(ie_model_src_mem_add(src, &t, NULL), IE_ERR_INVAL);
    CU_ASSERT_EQUAL_FATAL(ie_model_src_mem_finish(src), IE_OK);
    CU_ASSERT_EQUAL(ie_model_src_mem_finish(src), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_model_src_mem_add(src, &t, NULL), IE_ERR_INVAL);
    CU_ASSERT_STRING_EQUAL(ie_model_src_tokenizer_path(src), TOK_JSON);
    check_tensors(src, 0);
    CU_ASSERT_EQUAL(ie_model_src_n_tensors(src), N_SPECS);

    /* mem -> IEBIN -> open: the converter's path */
    new_dir(dir, sizeof dir);
    CU_ASSERT_EQUAL_FATAL(ie_iebin_writer_open(dir, &w), IE_OK);
    for (int64_t i = 0; i < ie_model_src_n_tensors(src); i++)
        CU_ASSERT_EQUAL(ie_iebin_writer_add(w, ie_model_src_tensor_at(src, i), NULL), IE_OK);
    CU_ASSERT_EQUAL(ie_iebin_writer_set_tokenizer(w, ie_model_src_tokenizer_path(src)), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_iebin_writer_finish(&w, ie_model_src_hparams(src), NULL), IE_OK);
    CU_ASSERT_EQUAL_FATAL(ie_model_src_open(dir, &back), IE_OK);
    check_tensors(back, 1);
    CU_ASSERT(memcmp(ie_model_src_hparams(back), &hp, sizeof hp) == 0);
    /* the weights hash covers the stored bytes, whatever the container */
    const uint64_t wh = ie_model_src_weights_hash(src, 0);
    CU_ASSERT_NOT_EQUAL(wh, 0);
    CU_ASSERT_EQUAL(ie_model_src_weights_hash(back, 0), wh);
    /* released pages come back from the file: the same bytes, the same hash */
    CU_ASSERT_EQUAL(ie_model_src_weights_hash(back, 1), wh);
    CU_ASSERT_EQUAL(ie_model_src_weights_hash(back, 1), wh);
    check_tensors(back, 1);
    CU_ASSERT_EQUAL(ie_model_src_fingerprint(back), ie_model_src_fingerprint(src));
    ie_model_src_destroy(&back);
    ie_model_src_destroy(&src);
    rm_tree(dir);

    /* one byte of one tensor changed: same shapes (fingerprint), other hash */
    {
        void *copy = malloc(g_data[6].n);
        CU_ASSERT_FATAL(copy != NULL);
        memcpy(copy, g_data[6].p, g_data[6].n);
        ((uint8_t *)copy)[g_data[6].n / 2] ^= 1;
        CU_ASSERT_EQUAL_FATAL(ie_model_src_new_mem(&hp, TOK_JSON, &src), IE_OK);
        for (int i = 0; i < N_SPECS; i++) {
            t = spec_tensor(i);
            if (i == 6) t.data = copy;
            CU_ASSERT_EQUAL(ie_model_src_mem_add(src, &t, i == 6 ? copy : NULL), IE_OK);
        }
        CU_ASSERT_EQUAL_FATAL(ie_model_src_mem_finish(src), IE_OK);
        CU_ASSERT_NOT_EQUAL(ie_model_src_weights_hash(src, 0), wh);
        ie_model_src_destroy(&src);
    }

    /* validation like ie_model_src_open */
    CU_ASSERT_EQUAL_FATAL(ie_model_src_new_mem(&hp, NULL, &src), IE_OK);
    for (int i = 0; i < N_SPECS; i++) {
        t = spec_tensor(i);
        if (i != 7) CU_ASSERT_EQUAL(ie_model_src_mem_add(src, &t, NULL), IE_OK);
    }
    CU_ASSERT_EQUAL(ie_model_src_mem_finish(src), IE_ERR_FORMAT);
    CU_ASSERT(strstr(ie_error_last(), "missing tensor 'blk.0.attn_output.weight'") != NULL);
    ie_model_src_destroy(&src);
    CU_ASSERT_EQUAL_FATAL(ie_model_src_new_mem(&hp, NULL, &src), IE_OK);
    for (int i = 0; i < N_SPECS; i++) {
        t = spec_tensor(i);
        if (i == 6) t.ne[0] = 32, t.ne[1] = 64; /* same bytes, wrong shape */
        CU_ASSERT_EQUAL(ie_model_src_mem_add(src, &t, NULL), IE_OK);
    }
    CU_ASSERT_EQUAL(ie_model_src_mem_finish(src), IE_ERR_FORMAT);
    CU_ASSERT(strstr(ie_error_last(), "'blk.0.attn_v.weight' has shape [32, 64], expected [64, 32]") != NULL);
    ie_model_src_destroy(&src);
    CU_ASSERT_EQUAL_FATAL(ie_model_src_new_mem(&hp, NULL, &src), IE_OK);
    t = spec_tensor(1);
    CU_ASSERT_EQUAL(ie_model_src_mem_add(src, &t, NULL), IE_OK);
    CU_ASSERT_EQUAL(ie_model_src_mem_add(src, &t, NULL), IE_OK);
    CU_ASSERT_EQUAL(ie_model_src_mem_finish(src), IE_ERR_FORMAT); /* duplicate name */
    ie_model_src_destroy(&src);
    ie_model_src_destroy(&src);
}

int main(void)
{
    unsigned failures;
    snprintf(g_root, sizeof g_root, "/tmp/ie_test_iebin_XXXXXX");
    if (!mkdtemp(g_root)) return 2;
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("iebin", NULL, NULL);
    CU_add_test(s, "round trip: dtypes, layouts, model source", test_roundtrip);
    CU_add_test(s, "GPT-OSS hparams, tiktoken tokenizer", test_hparams_gptoss);
    CU_add_test(s, "tokenizer.gguf from GGUF sources", test_tokenizer_gguf);
    CU_add_test(s, "corruption: one per rule", test_corruption);
    CU_add_test(s, "open_memory", test_open_memory);
    CU_add_test(s, "writer misuse and abort", test_writer_errors);
    CU_add_test(s, "in-memory model source", test_mem_source);
    CU_add_test(s, "k-quant dtypes: names, sizes, validation", test_kquant_tensors);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    failures = CU_get_number_of_failures();
    CU_cleanup_registry();
    for (int i = 0; i < N_SPECS; i++) free(g_data[i].p);
    rm_tree(g_root);
    return failures ? 1 : 0;
}

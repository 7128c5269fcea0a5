/* test_model_src.c — model sources: a tiny llama as a Hugging Face directory
 * (config.json + safetensors with F32/F16/BF16 tensors, single file, sharded
 * with an index, or found by directory scan) and as a GGUF file (F32/F16/
 * Q8_0/Q4_0/Q4_1 tensors). Checks hyper-parameters, canonical name mapping
 * and shapes, then one broken variant per validation rule, each with the
 * status and the field or tensor named in the message.
 */
#include "ie_gguf.h"
#include "ie_model_src.h"
#include "ie_safetensors.h"
#include "ie_test_writer.h"

#include <CUnit/Basic.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[64]; /* a fresh temporary directory per test case */

static void dir_clear(void)
{
    DIR *d = opendir(g_dir);
    struct dirent *de;
    char p[384];
    while (d && (de = readdir(d)))
        if (de->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", g_dir, de->d_name);
            unlink(p);
        }
    if (d) closedir(d);
}

static void dir_new(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/ie_test_src_XXXXXX");
    if (!mkdtemp(g_dir)) abort();
}

static void dir_remove(void)
{
    dir_clear();
    rmdir(g_dir);
}

static void put_file(const char *name, const void *p, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    if (write_file(path, p, n) != 0) abort();
}

/* Open `path`; expect `want` and, on failure, a reason containing `sub`. */
static ie_model_src_t *open_expect(const char *path, ie_status_t want, const char *sub, int line)
{
    ie_model_src_t *src = (ie_model_src_t *)g_dir; /* must be reset */
    ie_status_t st = ie_model_src_open(path, &src);
    int ok = st == want && (st == IE_OK ? src != NULL : src == NULL && strstr(ie_error_last(), sub) != NULL);
    if (!ok)
        fprintf(stderr, "\n  line %d: got %s \"%s\", want %s containing \"%s\"\n", line, ie_status_str(st),
                st == IE_OK ? "" : ie_error_last(), ie_status_str(want), sub);
    CU_ASSERT(ok);
    if (st != IE_OK) return NULL;
    return src;
}
#define EXPECT_FAIL(path, want, sub) open_expect(path, want, sub, __LINE__)

/* ================================================================ HF directory */

enum { E = 8, H = 2, KV = 1, HD = 4, FF = 12, L = 2, V = 16 };

typedef struct hf_opts {
    const char *drop_field; /* config field left out                     */
    const char *extra;      /* raw JSON members appended to config.json  */
    int n_kv;               /* num_key_value_heads (0: KV)               */
    const char *skip;       /* HF tensor name not written                */
    const char *bad_shape;  /* HF tensor written one row short           */
    const char *dtype_i32;  /* HF tensor written as I32                  */
    int tied;               /* tie_word_embeddings true, no lm_head      */
    int no_lm_head;         /* untied but lm_head missing                */
    int sharded;            /* two shards + model.safetensors.index.json */
    int misindexed;         /* index puts one tensor in the wrong shard  */
    const char *file_name;  /* single-file name (default model.safetensors) */
    int tokenizer;          /* write tokenizer.json                      */
    const char *arch;       /* architectures[0] (default LlamaForCausalLM) */
} hf_opts_t;

/* Fill value of element i of tensor k: distinct per tensor so mapping
 * mistakes show up in the data check, and exact in f16 and bf16. */
static float fill(int k, int i) { return (float)k + (float)(i % 4) * 0.25f; }

static void write_config(const hf_opts_t *o)
{
    char fields[1024], json[2048];
    int at = 0;
    const struct {
        const char *k;
        char v[64];
    } f[] = {
        {"hidden_size", "8"},       {"intermediate_size", "12"},
        {"num_hidden_layers", "2"}, {"num_attention_heads", "2"},
        {"vocab_size", "16"},       {"max_position_embeddings", "256"},
        {"rms_norm_eps", "1e-05"},  {"rope_theta", "500000.0"},
        {"hidden_act", "\"silu\""}, {"torch_dtype", "\"bfloat16\""},
        {"rope_scaling", "null"},   {"head_dim", "null"},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!o->drop_field || strcmp(o->drop_field, f[i].k) != 0)
            at += snprintf(fields + at, sizeof fields - (size_t)at, "\"%s\": %s, ", f[i].k, f[i].v);
    snprintf(json, sizeof json,
             "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", %s\"num_key_value_heads\": %d, "
             "\"tie_word_embeddings\": %s%s}\n",
             o->arch ? o->arch : "LlamaForCausalLM", o->arch ? "other" : "llama", fields, o->n_kv ? o->n_kv : KV,
             o->tied ? "true" : "false", o->extra ? o->extra : "");
    put_file("config.json", json, strlen(json));
}

/* Append one tensor (HF shape rows x cols, cols = 0 for 1-D) in dtype rotation. */
static void hf_tensor(const hf_opts_t *o, st_w_t *w, const char *name, int64_t rows, int64_t cols, int k)
{
    static const char *const dtypes[3] = {"F32", "F16", "BF16"};
    const char *dt = dtypes[k % 3];
    int64_t shape[2] = {rows, cols};
    int ndim = cols ? 2 : 1, n;
    uint8_t buf[4 * V * E * 4];
    if (o->skip && strcmp(o->skip, name) == 0) return;
    if (o->bad_shape && strcmp(o->bad_shape, name) == 0) shape[0]--;
    if (o->dtype_i32 && strcmp(o->dtype_i32, name) == 0) dt = "I32";
    n = (int)(shape[0] * (cols ? cols : 1));
    for (int i = 0; i < n; i++) {
        float x = fill(k, i);
        uint16_t h = dt[0] == 'B' ? ie_f32_to_bf16(x) : ie_f32_to_f16(x);
        if (dt[1] == '3') memcpy(buf + 4 * i, &x, 4); /* F32, and I32 (only its size matters) */
        else memcpy(buf + 2 * i, &h, 2);
    }
    sw_tensor(w, name, dt, ndim, shape, buf, (size_t)n * (dt[1] == '3' ? 4 : 2));
}

/* Where write_weights() is: the shard writers and the index being built. */
typedef struct weights_ctx {
    const hf_opts_t *o;
    st_w_t w[2];
    char index[8192];
    int at, k;
} weights_ctx_t;

static const char *const k_shards[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};

static void add(weights_ctx_t *c, int shard, const char *name, int64_t rows, int64_t cols)
{
    const hf_opts_t *o = c->o;
    hf_tensor(o, &c->w[o->sharded ? shard : 0], name, rows, cols, c->k++);
    if (!o->sharded || (o->skip && strcmp(o->skip, name) == 0)) return;
    if (o->misindexed && strcmp(name, "model.norm.weight") == 0) shard = 0;
    c->at += snprintf(c->index + c->at, sizeof c->index - (size_t)c->at, "%s\"%s\": \"%s\"", c->at ? ", " : "",
                      name, k_shards[shard]);
}

/* The whole model, HF names, into one file or two shards plus an index
 * (embeddings and layer 0 in the first shard, the rest in the second). */
static void write_weights(const hf_opts_t *o)
{
    static const struct {
        const char *suffix;
        int rows, cols;
    } layer[] = {
        {"input_layernorm.weight", E, 0},        {"self_attn.q_proj.weight", H * HD, E},
        {"self_attn.k_proj.weight", KV * HD, E}, {"self_attn.v_proj.weight", KV * HD, E},
        {"self_attn.o_proj.weight", E, H * HD},  {"post_attention_layernorm.weight", E, 0},
        {"mlp.gate_proj.weight", FF, E},         {"mlp.up_proj.weight", FF, E},
        {"mlp.down_proj.weight", E, FF},
    };
    weights_ctx_t c;
    tbuf_t file;
    char name[96], json[9000];

    memset(&c, 0, sizeof c);
    c.o = o;
    add(&c, 0, "model.embed_tokens.weight", V, E);
    for (int l = 0; l < L; l++)
        for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, layer[i].suffix);
            add(&c, l, name, layer[i].rows, layer[i].cols);
        }
    add(&c, 1, "model.norm.weight", E, 0);
    if (!o->tied && !o->no_lm_head) add(&c, 1, "lm_head.weight", V, E);

    for (int s = 0; s < (o->sharded ? 2 : 1); s++) {
        sw_finish(&c.w[s], &file);
        put_file(o->sharded ? k_shards[s] : o->file_name ? o->file_name : "model.safetensors", file.p, file.n);
        tb_free(&file);
    }
    if (o->sharded) {
        snprintf(json, sizeof json, "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {%s}}", c.index);
        put_file("model.safetensors.index.json", json, strlen(json));
    }
}

static void write_hf(const hf_opts_t *o)
{
    dir_clear();
    write_config(o);
    write_weights(o);
    if (o->tokenizer) put_file("tokenizer.json", "{}", 2);
}

static void check_hf_model(const ie_model_src_t *src, int tied)
{
    const ie_hparams_t *hp = ie_model_src_hparams(src);
    const char *base = strrchr(g_dir, '/') + 1;
    CU_ASSERT_EQUAL(ie_model_src_kind(src), IE_SRC_HF_DIR);
    CU_ASSERT_PTR_NULL(ie_model_src_gguf(src));
    CU_ASSERT_STRING_EQUAL(hp->arch, "llama");
    CU_ASSERT_STRING_EQUAL(hp->name, base);
    CU_ASSERT(hp->n_layer == L && hp->n_embd == E && hp->n_ff == FF && hp->n_head == H && hp->n_head_kv == KV);
    CU_ASSERT(hp->head_dim == HD && hp->rope_dim == HD && hp->n_vocab == V && hp->n_ctx_train == 256);
    CU_ASSERT_EQUAL(hp->rope_theta, 500000.0f);
    CU_ASSERT_EQUAL(hp->rms_eps, 1e-5f);
    CU_ASSERT_EQUAL(hp->rope_layout, IE_ROPE_NEOX);
    CU_ASSERT_EQUAL(hp->tied_embeddings, tied);

    /* canonical names, ne[] reversed from the HF shape, dtypes, data */
    static const struct {
        const char *name;
        int n_dims;
        int64_t ne0, ne1;
        int k;
        ie_dtype_t dtype;
    } want[] = {
        {"token_embd.weight", 2, E, V, 0, IE_DTYPE_F32},
        {"blk.0.attn_norm.weight", 1, E, 1, 1, IE_DTYPE_F16},
        {"blk.0.attn_q.weight", 2, E, H * HD, 2, IE_DTYPE_BF16},
        {"blk.0.attn_k.weight", 2, E, KV * HD, 3, IE_DTYPE_F32},
        {"blk.0.attn_v.weight", 2, E, KV * HD, 4, IE_DTYPE_F16},
        {"blk.0.attn_output.weight", 2, H * HD, E, 5, IE_DTYPE_BF16},
        {"blk.0.ffn_norm.weight", 1, E, 1, 6, IE_DTYPE_F32},
        {"blk.0.ffn_gate.weight", 2, E, FF, 7, IE_DTYPE_F16},
        {"blk.0.ffn_up.weight", 2, E, FF, 8, IE_DTYPE_BF16},
        {"blk.0.ffn_down.weight", 2, FF, E, 9, IE_DTYPE_F32},
        {"blk.1.ffn_down.weight", 2, FF, E, 18, IE_DTYPE_F32},
        {"output_norm.weight", 1, E, 1, 19, IE_DTYPE_F16},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const ie_tensor_t *t = ie_model_src_tensor(src, want[i].name);
        CU_ASSERT_FATAL(t != NULL);
        CU_ASSERT_STRING_EQUAL(t->name, want[i].name);
        CU_ASSERT(t->n_dims == want[i].n_dims && t->ne[0] == want[i].ne0 && t->ne[1] == want[i].ne1);
        CU_ASSERT(t->ne[2] == 1 && t->ne[3] == 1);
        CU_ASSERT_EQUAL(t->dtype, want[i].dtype);
        float x0, x1;
        if (t->dtype == IE_DTYPE_F32) {
            memcpy(&x0, t->data, 4), memcpy(&x1, (const float *)t->data + 1, 4);
            CU_ASSERT_EQUAL(t->nbytes, (uint64_t)(t->ne[0] * t->ne[1] * 4));
        } else {
            uint16_t h[2];
            memcpy(h, t->data, 4);
            x0 = t->dtype == IE_DTYPE_F16 ? ie_f16_to_f32(h[0]) : ie_bf16_to_f32(h[0]);
            x1 = t->dtype == IE_DTYPE_F16 ? ie_f16_to_f32(h[1]) : ie_bf16_to_f32(h[1]);
        }
        CU_ASSERT(x0 == fill(want[i].k, 0) && x1 == fill(want[i].k, 1));
    }
    CU_ASSERT((ie_model_src_tensor(src, "output.weight") != NULL) == !tied);
    CU_ASSERT_PTR_NULL(ie_model_src_tensor(src, "model.embed_tokens.weight"));
    CU_ASSERT_PTR_NULL(ie_model_src_tensor(src, "blk.2.attn_q.weight"));
}

static void test_hf_valid(void)
{
    hf_opts_t o = {.tokenizer = 1};
    char tok[128];
    ie_model_src_t *src;

    write_hf(&o);
    src = open_expect(g_dir, IE_OK, "", __LINE__);
    CU_ASSERT_FATAL(src != NULL);
    check_hf_model(src, 0);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", g_dir);
    CU_ASSERT_STRING_EQUAL(ie_model_src_tokenizer_path(src), tok);
    ie_model_src_destroy(&src);
    CU_ASSERT_PTR_NULL(src);
    ie_model_src_destroy(&src);
    ie_model_src_destroy(NULL);

    /* tied, no tokenizer.json, trailing slash in the path */
    o = (hf_opts_t){.tied = 1};
    write_hf(&o);
    snprintf(tok, sizeof tok, "%s/", g_dir);
    src = open_expect(tok, IE_OK, "", __LINE__);
    CU_ASSERT_FATAL(src != NULL);
    check_hf_model(src, 1);
    CU_ASSERT_PTR_NULL(ie_model_src_tokenizer_path(src));
    ie_model_src_destroy(&src);
}

/* transformers 5 moves rope_theta into rope_parameters */
static void test_hf_rope_parameters(void)
{
    hf_opts_t o = {.drop_field = "rope_theta",
                   .extra = ", \"rope_parameters\": {\"rope_theta\": 12345.0, \"rope_type\": \"default\"}"};
    ie_model_src_t *src;
    write_hf(&o);
    src = open_expect(g_dir, IE_OK, "", __LINE__);
    CU_ASSERT_FATAL(src != NULL);
    CU_ASSERT_EQUAL(ie_model_src_hparams(src)->rope_theta, 12345.0f);
    ie_model_src_destroy(&src);

    o = (hf_opts_t){.drop_field = "rope_theta"}; /* neither: the LlamaConfig default */
    write_hf(&o);
    src = open_expect(g_dir, IE_OK, "", __LINE__);
    CU_ASSERT_FATAL(src != NULL);
    CU_ASSERT_EQUAL(ie_model_src_hparams(src)->rope_theta, 10000.0f);
    ie_model_src_destroy(&src);

    /* YaRN: transformers' defaults (beta 32 / 1, 0.1 ln f + 1, truncate) */
    o = (hf_opts_t){.drop_field = "rope_theta",
                    .extra = ", \"rope_parameters\": {\"rope_theta\": 1e6, \"rope_type\": \"yarn\", "
                             "\"factor\": 4.0, \"original_max_position_embeddings\": 32768}"};
    write_hf(&o);
    src = open_expect(g_dir, IE_OK, "", __LINE__);
    CU_ASSERT_FATAL(src != NULL);
    const ie_hparams_t *hp = ie_model_src_hparams(src);
    CU_ASSERT_EQUAL(hp->rope_yarn_factor, 4.0f);
    CU_ASSERT_EQUAL(hp->rope_yarn_orig_ctx, 32768);
    CU_ASSERT(hp->rope_yarn_beta_fast == 32.0f && hp->rope_yarn_beta_slow == 1.0f && hp->rope_yarn_truncate == 1);
    CU_ASSERT_DOUBLE_EQUAL(hp->rope_attn_factor, 0.1 * log(4.0) + 1.0, 1e-6);
    CU_ASSERT_EQUAL(hp->rope_freq_scale, 0.0f);
    ie_model_src_destroy(&src);

    /* a top-level original_max_position_embeddings wins (transformers 5);
     * the mscale ratio; linear scaling */
    o.extra = ", \"original_max_position_embeddings\": 4096, \"rope_parameters\": {\"rope_type\": \"yarn\", "
              "\"factor\": 4.0, \"original_max_position_embeddings\": 32768, \"mscale\": 2.0, "
              "\"mscale_all_dim\": 1.0, \"truncate\": false}";
    write_hf(&o);
    src = open_expect(g_dir, IE_OK, "", __LINE__);
    CU_ASSERT_FATAL(src != NULL);
    hp = ie_model_src_hparams(src);
    CU_ASSERT_EQUAL(hp->rope_yarn_orig_ctx, 4096);
    CU_ASSERT_EQUAL(hp->rope_yarn_truncate, 0);
    CU_ASSERT_DOUBLE_EQUAL(hp->rope_attn_factor, (0.2 * log(4.0) + 1.0) / (0.1 * log(4.0) + 1.0), 1e-6);
    ie_model_src_destroy(&src);
    o = (hf_opts_t){.drop_field = "rope_scaling",
                    .extra = ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}"};
    write_hf(&o);
    src = open_expect(g_dir, IE_OK, "", __LINE__);
    CU_ASSERT_FATAL(src != NULL);
    CU_ASSERT_EQUAL(ie_model_src_hparams(src)->rope_freq_scale, 0.25f);
    CU_ASSERT_EQUAL(ie_model_src_hparams(src)->rope_yarn_factor, 0.0f);
    ie_model_src_destroy(&src);
}

static void test_hf_sharded(void)
{
    hf_opts_t o = {.sharded = 1};
    ie_model_src_t *src;
    write_hf(&o);
    src = open_expect(g_dir, IE_OK, "", __LINE__);
    CU_ASSERT_FATAL(src != NULL);
    check_hf_model(src, 0);
    ie_model_src_destroy(&src);

    /* no index, odd file name: found by scanning the directory */
    o = (hf_opts_t){.file_name = "weights.safetensors"};
    write_hf(&o);
    src = open_expect(g_dir, IE_OK, "", __LINE__);
    CU_ASSERT_FATAL(src != NULL);
    check_hf_model(src, 0);
    ie_model_src_destroy(&src);

    o = (hf_opts_t){.sharded = 1, .misindexed = 1};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "weight_map puts 'model.norm.weight' in 'model-00001-of-00002.safetensors'");
}

static void test_hf_bad_config(void)
{
    hf_opts_t o = {0};
    char path[128];

    o.drop_field = "hidden_size";
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "config.json is missing field 'hidden_size'");
    o.drop_field = "vocab_size";
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "'vocab_size'");

    o = (hf_opts_t){.n_kv = 3};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "num_attention_heads (2) is not a multiple of num_key_value_heads (3)");

    o = (hf_opts_t){.drop_field = "rope_scaling",
                    .extra = ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}"};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "rope_scaling (rope_type llama3) lacks 'low_freq_factor'");
    o.extra = ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0, "
              "\"high_freq_factor\": 1.0, \"original_max_position_embeddings\": 64}";
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "rope_scaling.low_freq_factor (4) must be below high_freq_factor (1)");
    o.extra = ", \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}";
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_UNSUPPORTED, "rope_scaling type 'dynamic'");
    o.extra = ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 0.5}";
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "rope_scaling.factor 0.5 must be at least 1");
    o.extra = ", \"rope_scaling\": {\"factor\": 2.0}";
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "rope_scaling has a factor but no 'rope_type'");
    o.extra = ", \"rope_scaling\": [1]";
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "config.json field 'rope_scaling' must be an object");

    o = (hf_opts_t){.extra = ", \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 1e6}"};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "rope_parameters (rope_type yarn) lacks 'original_max_position_embeddings'");
    o.extra = ", \"rope_parameters\": {\"partial_rotary_factor\": 0.5}";
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_UNSUPPORTED, "rope_parameters.partial_rotary_factor 0.5");

    o = (hf_opts_t){.drop_field = "num_hidden_layers", .extra = ", \"num_hidden_layers\": 0"};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "num_hidden_layers = 0 is out of range");
    o = (hf_opts_t){.drop_field = "hidden_size", .extra = ", \"hidden_size\": 8.5"};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "'hidden_size' must be an integer");
    o = (hf_opts_t){.drop_field = "hidden_size", .extra = ", \"hidden_size\": \"8\""};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "'hidden_size' must be an integer");
    o = (hf_opts_t){.drop_field = "intermediate_size", .extra = ", \"intermediate_size\": 1e12"};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "intermediate_size = 1000000000000 is out of range");
    o = (hf_opts_t){.drop_field = "rms_norm_eps", .extra = ", \"rms_norm_eps\": -1"};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "epsilon");
    o = (hf_opts_t){.extra = ", \"attention_bias\": true"};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_UNSUPPORTED, "attention_bias");
    o = (hf_opts_t){.drop_field = "hidden_act", .extra = ", \"hidden_act\": \"gelu\""};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_UNSUPPORTED, "hidden_act 'gelu'");

    o = (hf_opts_t){.arch = "FalconForCausalLM"};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_UNSUPPORTED,
                "architecture 'FalconForCausalLM' (model_type 'other') is not supported");

    /* head_dim given explicitly and inconsistent with the tensors */
    o = (hf_opts_t){.drop_field = "head_dim", .extra = ", \"head_dim\": 8"};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "model: tensor 'blk.0.attn_q.weight' has shape [8, 8], expected [8, 16]");

    /* config.json broken or missing */
    dir_clear();
    put_file("config.json", "{\"hidden_size\": ", 16);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "config.json' is not valid JSON");
    put_file("config.json", "[1, 2]", 6);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "config.json is not a JSON object");
    dir_clear();
    EXPECT_FAIL(g_dir, IE_ERR_IO, "config.json': No such file or directory");

    /* no weights at all */
    o = (hf_opts_t){0};
    write_config(&o);
    EXPECT_FAIL(g_dir, IE_ERR_IO, "no *.safetensors files");
    snprintf(path, sizeof path, "%s/nope", g_dir);
    EXPECT_FAIL(path, IE_ERR_IO, "No such file or directory");
}

static void test_hf_bad_tensors(void)
{
    hf_opts_t o = {.bad_shape = "model.layers.0.self_attn.k_proj.weight"};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT,
                "model: tensor 'blk.0.attn_k.weight' has shape [8, 3], expected [8, 4] "
                "(HF 'model.layers.0.self_attn.k_proj.weight')");

    o = (hf_opts_t){.bad_shape = "model.embed_tokens.weight"};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "tensor 'token_embd.weight' has shape [8, 15], expected [8, 16]");

    o = (hf_opts_t){.skip = "model.layers.1.mlp.up_proj.weight"};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT,
                "missing tensor 'blk.1.ffn_up.weight' (HF 'model.layers.1.mlp.up_proj.weight')");

    o = (hf_opts_t){.skip = "model.norm.weight"};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "missing tensor 'output_norm.weight'");

    o = (hf_opts_t){.no_lm_head = 1};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "missing tensor 'output.weight' (HF 'lm_head.weight')");

    o = (hf_opts_t){.dtype_i32 = "model.layers.1.input_layernorm.weight"};
    write_hf(&o);
    EXPECT_FAIL(g_dir, IE_ERR_UNSUPPORTED, "tensor 'blk.1.attn_norm.weight' has type I32");

    /* a corrupt shard is reported by the safetensors layer */
    o = (hf_opts_t){0};
    write_hf(&o);
    put_file("model.safetensors", "\x02\0\0\0\0\0\0\0[]", 10);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "safetensors: header is not a JSON object");
}

/* ================================================================ GGUF */

enum { GE = 32, GH = 4, GKV = 2, GHD = 8, GFF = 64, GL = 2, GV = 40 };
enum { G_F32 = 0, G_F16 = 1, G_Q4_0 = 2, G_Q4_1 = 3, G_Q8_0 = 8, G_Q8_1 = 9 };

typedef struct gg_opts {
    const char *arch;
    int drop_block_count;
    int n_kv;        /* head_count_kv key; 0: key absent (defaults to n_head) */
    int vocab_size;  /* llama.vocab_size key; 0: absent                      */
    uint32_t q_type; /* type of the attn_q tensors (default q8_0)            */
    uint64_t k_rows; /* ne[1] of blk.0.attn_k (default GKV*GHD)              */
    int rope_freqs;  /* entries of a rope_freqs.weight tensor; 0: none       */
    int tied;
    int defaults; /* leave out every optional key                         */
} gg_opts_t;

static void gg_tensor(gguf_w_t *w, const char *name, uint32_t type, uint64_t ne0, uint64_t ne1)
{
    uint64_t ne[2] = {ne0, ne1};
    int64_t blck;
    size_t bsize;
    ie_gguf_ggml_type_block(type, &blck, &bsize);
    gw_tensor(w, name, type, ne1 ? 2 : 1, ne, NULL, (size_t)((ne0 * (ne1 ? ne1 : 1)) / (uint64_t)blck * bsize));
}

static void write_gguf(const gg_opts_t *o, const char *file)
{
    gguf_w_t w;
    tbuf_t out;
    char name[64];
    gw_init(&w);
    gw_str(&w, "general.architecture", o->arch ? o->arch : "llama");
    if (!o->defaults) gw_str(&w, "general.name", "Tiny Llama");
    if (!o->drop_block_count) gw_u32(&w, "llama.block_count", GL);
    gw_u32(&w, "llama.embedding_length", GE);
    gw_u64(&w, "llama.feed_forward_length", GFF);
    gw_u32(&w, "llama.attention.head_count", GH);
    if (o->n_kv) gw_u32(&w, "llama.attention.head_count_kv", (uint32_t)o->n_kv);
    gw_u32(&w, "llama.context_length", 512);
    gw_f32(&w, "llama.attention.layer_norm_rms_epsilon", 1e-6f);
    if (!o->defaults) {
        gw_f32(&w, "llama.rope.freq_base", 100000.0f);
        gw_u32(&w, "llama.rope.dimension_count", GHD);
    }
    if (o->vocab_size) gw_u32(&w, "llama.vocab_size", (uint32_t)o->vocab_size);

    gg_tensor(&w, "token_embd.weight", G_Q8_0, GE, GV);
    for (int l = 0; l < GL; l++) {
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l), gg_tensor(&w, name, G_F32, GE, 0);
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", l),
            gg_tensor(&w, name, o->q_type ? o->q_type : G_Q8_0, GE, GH * GHD);
        snprintf(name, sizeof name, "blk.%d.attn_k.weight", l);
        gg_tensor(&w, name, G_Q4_0, GE, l == 0 && o->k_rows ? o->k_rows : GKV * GHD);
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", l), gg_tensor(&w, name, G_Q4_1, GE, GKV * GHD);
        snprintf(name, sizeof name, "blk.%d.attn_output.weight", l), gg_tensor(&w, name, G_F16, GH * GHD, GE);
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l), gg_tensor(&w, name, G_F32, GE, 0);
        snprintf(name, sizeof name, "blk.%d.ffn_gate.weight", l), gg_tensor(&w, name, G_Q4_1, GE, GFF);
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", l), gg_tensor(&w, name, G_Q4_1, GE, GFF);
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", l), gg_tensor(&w, name, G_Q8_0, GFF, GE);
    }
    gg_tensor(&w, "output_norm.weight", G_F32, GE, 0);
    if (!o->tied) gg_tensor(&w, "output.weight", G_Q8_0, GE, GV);
    if (o->rope_freqs) gg_tensor(&w, "rope_freqs.weight", G_F32, (uint64_t)o->rope_freqs, 0);
    gw_finish(&w, 3, &out);
    put_file(file, out.p, out.n);
    tb_free(&out);
    gw_free(&w);
}

static const char *gguf_path(void)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/tiny.gguf", g_dir);
    return path;
}

static void test_gguf_valid(void)
{
    gg_opts_t o = {.n_kv = GKV, .vocab_size = GV};
    ie_model_src_t *src;
    write_gguf(&o, "tiny.gguf");
    src = open_expect(gguf_path(), IE_OK, "", __LINE__);
    CU_ASSERT_FATAL(src != NULL);
    const ie_hparams_t *hp = ie_model_src_hparams(src);
    CU_ASSERT_EQUAL(ie_model_src_kind(src), IE_SRC_GGUF);
    CU_ASSERT_PTR_NOT_NULL(ie_model_src_gguf(src));
    CU_ASSERT_STRING_EQUAL(hp->name, "Tiny Llama");
    CU_ASSERT(hp->n_layer == GL && hp->n_embd == GE && hp->n_ff == GFF && hp->n_head == GH && hp->n_head_kv == GKV);
    CU_ASSERT(hp->head_dim == GHD && hp->rope_dim == GHD && hp->n_vocab == GV && hp->n_ctx_train == 512);
    CU_ASSERT_EQUAL(hp->rope_theta, 100000.0f);
    CU_ASSERT_EQUAL(hp->rms_eps, 1e-6f);
    CU_ASSERT_EQUAL(hp->rope_layout, IE_ROPE_NORMAL);
    CU_ASSERT_EQUAL(hp->tied_embeddings, 0);
    CU_ASSERT_STRING_EQUAL(ie_model_src_tokenizer_path(src), gguf_path());
    const ie_tensor_t *t = ie_model_src_tensor(src, "blk.1.attn_k.weight");
    CU_ASSERT_FATAL(t != NULL);
    CU_ASSERT(t->dtype == IE_DTYPE_Q4_0 && t->n_dims == 2 && t->ne[0] == GE && t->ne[1] == GKV * GHD);
    CU_ASSERT_EQUAL(t->nbytes, (uint64_t)GE * GKV * GHD / 32 * 18);
    CU_ASSERT_EQUAL(ie_model_src_tensor(src, "blk.0.attn_v.weight")->dtype, IE_DTYPE_Q4_1);
    CU_ASSERT_EQUAL(ie_model_src_tensor(src, "blk.0.attn_output.weight")->dtype, IE_DTYPE_F16);
    CU_ASSERT_EQUAL(ie_model_src_tensor(src, "output.weight")->dtype, IE_DTYPE_Q8_0);
    CU_ASSERT_PTR_EQUAL(ie_model_src_tensor(src, "output_norm.weight")->data,
                        ie_gguf_find_tensor(ie_model_src_gguf(src), "output_norm.weight")->data);
    ie_model_src_destroy(&src);

    /* defaults: kv heads = heads, theta 10000, rope dims = head_dim, name from the file; tied */
    o = (gg_opts_t){.defaults = 1, .tied = 1};
    write_gguf(&o, "tiny.gguf");
    EXPECT_FAIL(gguf_path(), IE_ERR_FORMAT, "tensor 'blk.0.attn_k.weight' has shape [32, 16], expected [32, 32]");
    o.k_rows = GH * GHD;
    write_gguf(&o, "tiny.gguf");
    /* attn_v still has GKV heads: caught next */
    EXPECT_FAIL(gguf_path(), IE_ERR_FORMAT, "tensor 'blk.0.attn_v.weight' has shape [32, 16], expected [32, 32]");
    o = (gg_opts_t){.defaults = 1, .tied = 1, .n_kv = GKV};
    write_gguf(&o, "tiny.gguf");
    src = open_expect(gguf_path(), IE_OK, "", __LINE__);
    CU_ASSERT_FATAL(src != NULL);
    hp = ie_model_src_hparams(src);
    CU_ASSERT_STRING_EQUAL(hp->name, "tiny.gguf");
    CU_ASSERT_EQUAL(hp->rope_theta, 10000.0f);
    CU_ASSERT_EQUAL(hp->rope_dim, GHD);
    CU_ASSERT_EQUAL(hp->tied_embeddings, 1);
    CU_ASSERT_PTR_NULL(ie_model_src_tensor(src, "output.weight"));
    ie_model_src_destroy(&src);
}

static void test_gguf_bad(void)
{
    gg_opts_t o = {.arch = "falcon", .n_kv = GKV};
    write_gguf(&o, "tiny.gguf");
    EXPECT_FAIL(gguf_path(), IE_ERR_UNSUPPORTED, "architecture 'falcon' is not supported");

    o = (gg_opts_t){.drop_block_count = 1, .n_kv = GKV};
    write_gguf(&o, "tiny.gguf");
    EXPECT_FAIL(gguf_path(), IE_ERR_FORMAT, "missing key 'llama.block_count'");

    o = (gg_opts_t){.n_kv = 3};
    write_gguf(&o, "tiny.gguf");
    EXPECT_FAIL(gguf_path(), IE_ERR_FORMAT,
                "llama.attention.head_count (4) is not a multiple of llama.attention.head_count_kv (3)");

    o = (gg_opts_t){.n_kv = GKV, .vocab_size = GV + 1};
    write_gguf(&o, "tiny.gguf");
    EXPECT_FAIL(gguf_path(), IE_ERR_FORMAT, "llama.vocab_size is 41 but token_embd.weight has 40 rows");

    o = (gg_opts_t){.n_kv = GKV, .q_type = G_Q8_1}; /* an activation-only type */
    write_gguf(&o, "tiny.gguf");
    EXPECT_FAIL(gguf_path(), IE_ERR_UNSUPPORTED, "tensor 'blk.0.attn_q.weight' has type q8_1");

    o = (gg_opts_t){.n_kv = GKV, .k_rows = 15};
    write_gguf(&o, "tiny.gguf");
    EXPECT_FAIL(gguf_path(), IE_ERR_FORMAT,
                "model: tensor 'blk.0.attn_k.weight' has shape [32, 15], expected [32, 16]");

    /* rope_freqs.weight: one factor per rotated pair (rope_freqs = n entries) */
    o = (gg_opts_t){.n_kv = GKV, .rope_freqs = GHD / 2 + 1};
    write_gguf(&o, "tiny.gguf");
    EXPECT_FAIL(gguf_path(), IE_ERR_FORMAT, "tensor 'rope_freqs.weight' has shape [5], expected [4]");
    o = (gg_opts_t){.n_kv = GKV, .rope_freqs = GHD / 2};
    write_gguf(&o, "tiny.gguf");
    {
        ie_model_src_t *rs = NULL;
        CU_ASSERT_EQUAL_FATAL(ie_model_src_open(gguf_path(), &rs), IE_OK);
        CU_ASSERT_EQUAL(ie_model_src_hparams(rs)->rope_freqs, 1);
        CU_ASSERT_PTR_NOT_NULL(ie_model_src_tensor(rs, "rope_freqs.weight"));
        ie_model_src_destroy(&rs);
    }

    /* not GGUF at all, and a missing file */
    put_file("tiny.gguf", "PK\3\4 this is a zip", 19);
    EXPECT_FAIL(gguf_path(), IE_ERR_FORMAT, "not a GGUF file");
    unlink(gguf_path());
    EXPECT_FAIL(gguf_path(), IE_ERR_IO, "tiny.gguf': No such file or directory");

    ie_model_src_t *src = NULL;
    CU_ASSERT_EQUAL(ie_model_src_open(NULL, &src), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_model_src_open(g_dir, NULL), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(ie_model_src_hparams(NULL));
    CU_ASSERT_PTR_NULL(ie_model_src_tensor(NULL, "x"));
}

/* ================================================================ GPT-OSS fixtures */

#define GPTOSS_DIR IE_TEST_DATA "/tiny_gptoss"
#define GPTOSS_BF16_DIR IE_TEST_DATA "/tiny_gptoss_e4_bf16"
#define GPTOSS_MXFP4_DIR IE_TEST_DATA "/tiny_gptoss_mxfp4"
#define GPTOSS_GGUF IE_TEST_DATA "/tiny_gptoss.gguf"

enum { GO_H = 32, GO_NH = 4, GO_NKV = 2, GO_D = 16, GO_I = 64, GO_V = 512, GO_L = 3 };

/* Tensor `name` must exist with ne = {ne0, ne1, ne2} (n_dims dims). */
static const ie_tensor_t *go_tensor(const ie_model_src_t *src, const char *name, int n_dims, int64_t ne0,
                                    int64_t ne1, int64_t ne2)
{
    const ie_tensor_t *t = ie_model_src_tensor(src, name);
    int ok = t && t->n_dims == n_dims && t->ne[0] == ne0 && (n_dims < 2 || t->ne[1] == ne1) &&
             (n_dims < 3 || t->ne[2] == ne2);
    if (!ok) fprintf(stderr, "\n  tensor %s missing or wrong shape\n", name);
    CU_ASSERT(ok);
    return ok ? t : NULL;
}

/* Hyper-parameters and canonical shapes common to every tiny GPT-OSS form. */
static void check_gptoss(const ie_model_src_t *src, int n_expert, int gguf)
{
    const ie_hparams_t *hp = ie_model_src_hparams(src);
    const int E = n_expert, q = GO_NH * GO_D, kv = GO_NKV * GO_D;
    char n[96];

    CU_ASSERT_STRING_EQUAL(hp->arch, "gpt-oss");
    CU_ASSERT_EQUAL(hp->arch_id, IE_ARCH_GPTOSS);
    CU_ASSERT_EQUAL(ie_model_src_kind(src), gguf ? IE_SRC_GGUF : IE_SRC_HF_DIR);
    CU_ASSERT_EQUAL(hp->n_layer, GO_L);
    CU_ASSERT_EQUAL(hp->n_embd, GO_H);
    CU_ASSERT_EQUAL(hp->n_ff, GO_I);
    CU_ASSERT_EQUAL(hp->n_head, GO_NH);
    CU_ASSERT_EQUAL(hp->n_head_kv, GO_NKV);
    CU_ASSERT_EQUAL(hp->head_dim, GO_D);
    CU_ASSERT_EQUAL(hp->rope_dim, GO_D);
    CU_ASSERT_EQUAL(hp->n_vocab, GO_V);
    CU_ASSERT_EQUAL(hp->n_ctx_train, 131072);
    CU_ASSERT_DOUBLE_EQUAL(hp->rope_theta, 150000.0, 1e-3);
    CU_ASSERT_DOUBLE_EQUAL(hp->rms_eps, 1e-5, 1e-9);
    CU_ASSERT_EQUAL(hp->rope_layout, IE_ROPE_NEOX);
    CU_ASSERT_EQUAL(hp->tied_embeddings, 0);
    CU_ASSERT_EQUAL(hp->n_expert, E);
    CU_ASSERT_EQUAL(hp->n_expert_used, 2);
    CU_ASSERT_EQUAL(hp->sliding_window, 8);
    CU_ASSERT(hp->layer_swa[0] == 1 && hp->layer_swa[1] == 0 && hp->layer_swa[2] == 1);
    CU_ASSERT(hp->attn_bias == 1 && hp->attn_sinks == 1);
    CU_ASSERT_DOUBLE_EQUAL(hp->swiglu_limit, 7.0, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(hp->swiglu_alpha, 1.702, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(hp->rope_yarn_factor, 32.0, 1e-6);
    CU_ASSERT_EQUAL(hp->rope_yarn_orig_ctx, 4096);
    CU_ASSERT_DOUBLE_EQUAL(hp->rope_yarn_beta_fast, 32.0, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(hp->rope_yarn_beta_slow, 1.0, 1e-6);
    CU_ASSERT_EQUAL(hp->rope_yarn_truncate, 0);
    CU_ASSERT_DOUBLE_EQUAL(hp->rope_attn_factor, 1.3465735902799727, 1e-6);

    go_tensor(src, "token_embd.weight", 2, GO_H, GO_V, 0);
    go_tensor(src, "output_norm.weight", 1, GO_H, 0, 0);
    go_tensor(src, "output.weight", 2, GO_H, GO_V, 0);
    for (int l = 0; l < GO_L; l++) {
        const struct {
            const char *suffix;
            int nd;
            int64_t ne[3];
        } req[] = {
            {"attn_norm.weight", 1, {GO_H}},
            {"attn_q.weight", 2, {GO_H, q}},
            {"attn_q.bias", 1, {q}},
            {"attn_k.weight", 2, {GO_H, kv}},
            {"attn_k.bias", 1, {kv}},
            {"attn_v.weight", 2, {GO_H, kv}},
            {"attn_v.bias", 1, {kv}},
            {"attn_output.weight", 2, {q, GO_H}},
            {"attn_output.bias", 1, {GO_H}},
            {"attn_sinks.weight", 1, {GO_NH}},
            {"post_attention_norm.weight", 1, {GO_H}},
            {"ffn_gate_inp.weight", 2, {GO_H, E}},
            {"ffn_gate_inp.bias", 1, {E}},
            {"ffn_gate_exps.weight", 3, {GO_H, GO_I, E}},
            {"ffn_up_exps.weight", 3, {GO_H, GO_I, E}},
            {"ffn_down_exps.weight", 3, {GO_I, GO_H, E}},
            {"ffn_gate_exps.bias", 2, {GO_I, E}},
            {"ffn_up_exps.bias", 2, {GO_I, E}},
            {"ffn_down_exps.bias", 2, {GO_H, E}},
        };
        for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
            const ie_tensor_t *t;
            snprintf(n, sizeof n, "blk.%d.%s", l, req[i].suffix);
            t = go_tensor(src, n, req[i].nd, req[i].ne[0], req[i].ne[1], req[i].ne[2]);
            if (t) {
                int64_t ne = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
                CU_ASSERT_EQUAL(t->nbytes, ie_dtype_row_bytes(t->dtype, ne));
            }
        }
    }
}

static void test_gptoss_fixtures(void)
{
    static const struct {
        const char *path;
        int E, gguf;
        ie_dtype_t exp_dt;
    } fx[] = {
        {GPTOSS_DIR, 8, 0, IE_DTYPE_F32},
        {GPTOSS_BF16_DIR, 4, 0, IE_DTYPE_BF16},
        {GPTOSS_MXFP4_DIR, 8, 0, IE_DTYPE_MXFP4},
        {GPTOSS_GGUF, 8, 1, IE_DTYPE_MXFP4},
    };
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        ie_model_src_t *src = EXPECT_FAIL(fx[i].path, IE_OK, "");
        if (!src) continue;
        check_gptoss(src, fx[i].E, fx[i].gguf);
        CU_ASSERT_EQUAL(ie_model_src_tensor(src, "blk.2.ffn_gate_exps.weight")->dtype, fx[i].exp_dt);
        CU_ASSERT_EQUAL(ie_model_src_tensor(src, "blk.0.ffn_down_exps.weight")->dtype, fx[i].exp_dt);
        if (!fx[i].gguf) CU_ASSERT_PTR_NOT_NULL(ie_model_src_tokenizer_path(src));
        ie_model_src_destroy(&src);
        CU_ASSERT_PTR_NULL(src);
    }
}

static float *go_f32(const ie_tensor_t *t)
{
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    float *f = malloc((size_t)n * sizeof *f);
    if (!f) abort();
    ie_dequantize_row(t->dtype, t->data, f, n);
    return f;
}

/* HF MXFP4 release and llama.cpp GGUF carry the same values: experts must
 * convert to byte-identical ggml blocks, everything else equal as f32. */
static void test_gptoss_mxfp4_vs_gguf(void)
{
    ie_model_src_t *hf = EXPECT_FAIL(GPTOSS_MXFP4_DIR, IE_OK, "");
    ie_model_src_t *gg = EXPECT_FAIL(GPTOSS_GGUF, IE_OK, "");
    static const char *const exps[] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
    static const char *const rest[] = {"attn_norm.weight",
                                       "attn_q.weight",
                                       "attn_q.bias",
                                       "attn_k.weight",
                                       "attn_k.bias",
                                       "attn_v.weight",
                                       "attn_v.bias",
                                       "attn_output.weight",
                                       "attn_output.bias",
                                       "attn_sinks.weight",
                                       "post_attention_norm.weight",
                                       "ffn_gate_inp.weight",
                                       "ffn_gate_inp.bias",
                                       "ffn_gate_exps.bias",
                                       "ffn_up_exps.bias",
                                       "ffn_down_exps.bias"};
    static const char *const glob[] = {"token_embd.weight", "output_norm.weight", "output.weight"};
    char n[96];
    int n_cmp = 0;

    if (!hf || !gg) goto done;
    for (int l = 0; l < GO_L; l++) {
        for (size_t i = 0; i < 3; i++) {
            const ie_tensor_t *a, *b;
            snprintf(n, sizeof n, "blk.%d.%s", l, exps[i]);
            a = ie_model_src_tensor(hf, n);
            b = ie_model_src_tensor(gg, n);
            CU_ASSERT_FATAL(a && b);
            CU_ASSERT(a->dtype == IE_DTYPE_MXFP4 && b->dtype == IE_DTYPE_MXFP4);
            CU_ASSERT_EQUAL(a->nbytes, b->nbytes);
            if (a->nbytes != b->nbytes || memcmp(a->data, b->data, a->nbytes) != 0) {
                fprintf(stderr, "\n  %s differs between HF MXFP4 and GGUF\n", n);
                CU_FAIL("expert bytes differ");
            }
            n_cmp++;
        }
    }
    for (int l = -1; l < GO_L; l++)
        for (size_t i = 0; i < (l < 0 ? 3 : sizeof rest / sizeof rest[0]); i++) {
            const ie_tensor_t *a, *b;
            float *fa, *fb;
            int64_t ne;
            if (l < 0) snprintf(n, sizeof n, "%s", glob[i]);
            else snprintf(n, sizeof n, "blk.%d.%s", l, rest[i]);
            a = ie_model_src_tensor(hf, n);
            b = ie_model_src_tensor(gg, n);
            CU_ASSERT_FATAL(a && b);
            CU_ASSERT(a->n_dims == b->n_dims && !memcmp(a->ne, b->ne, sizeof a->ne));
            CU_ASSERT(a->dtype == IE_DTYPE_BF16 && b->dtype == IE_DTYPE_F32);
            ne = a->ne[0] * a->ne[1] * a->ne[2] * a->ne[3];
            fa = go_f32(a);
            fb = go_f32(b);
            if (memcmp(fa, fb, (size_t)ne * sizeof *fa) != 0) {
                fprintf(stderr, "\n  %s differs between HF MXFP4 and GGUF\n", n);
                CU_FAIL("tensor values differ");
            }
            free(fa);
            free(fb);
            n_cmp++;
        }
    CU_ASSERT_EQUAL(n_cmp, 3 * GO_L + 3 + 16 * GO_L);
done:
    ie_model_src_destroy(&hf);
    ie_model_src_destroy(&gg);
}

/* Plain fp32 experts: converted values by index against the raw safetensors. */
static void test_gptoss_plain_values(void)
{
    ie_model_src_t *src = EXPECT_FAIL(GPTOSS_DIR, IE_OK, "");
    ie_safetensors_t *st = NULL;
    const int E = 8, I = GO_I, H = GO_H;
    char n[96];

    CU_ASSERT_EQUAL_FATAL(ie_safetensors_open(GPTOSS_DIR "/model.safetensors", &st), IE_OK);
    if (!src) goto done;
    for (int l = 0; l < GO_L; l++) {
        const ie_safetensors_tensor_t *gu, *dn, *gub, *dnb, *sk;
        const float *g, *u, *d, *gb, *ub, *db, *sc;
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj", l);
        gu = ie_safetensors_find(st, n);
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj", l);
        dn = ie_safetensors_find(st, n);
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
        gub = ie_safetensors_find(st, n);
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj_bias", l);
        dnb = ie_safetensors_find(st, n);
        snprintf(n, sizeof n, "model.layers.%d.self_attn.sinks", l);
        sk = ie_safetensors_find(st, n);
        CU_ASSERT_FATAL(gu && dn && gub && dnb && sk);
        snprintf(n, sizeof n, "blk.%d.ffn_gate_exps.weight", l);
        g = ie_model_src_tensor(src, n)->data;
        snprintf(n, sizeof n, "blk.%d.ffn_up_exps.weight", l);
        u = ie_model_src_tensor(src, n)->data;
        snprintf(n, sizeof n, "blk.%d.ffn_down_exps.weight", l);
        d = ie_model_src_tensor(src, n)->data;
        snprintf(n, sizeof n, "blk.%d.ffn_gate_exps.bias", l);
        gb = ie_model_src_tensor(src, n)->data;
        snprintf(n, sizeof n, "blk.%d.ffn_up_exps.bias", l);
        ub = ie_model_src_tensor(src, n)->data;
        snprintf(n, sizeof n, "blk.%d.ffn_down_exps.bias", l);
        db = ie_model_src_tensor(src, n)->data;
        snprintf(n, sizeof n, "blk.%d.attn_sinks.weight", l);
        sc = ie_model_src_tensor(src, n)->data;
        CU_ASSERT_EQUAL(memcmp(db, dnb->data, (size_t)E * H * sizeof(float)), 0); /* mapped as is */
        CU_ASSERT_EQUAL(memcmp(sc, sk->data, GO_NH * sizeof(float)), 0);
        {
            const float *raw = gu->data, *rd = dn->data, *rb = gub->data;
            int bad = 0;
            for (int e = 0; e < E; e++) {
                for (int j = 0; j < I; j++)
                    for (int i = 0; i < H; i++) {
                        /* gate of expert e, out j, in i == gate_up_proj[e][i][2j]; up: 2j+1 */
                        bad += g[((size_t)e * I + j) * H + i] != raw[((size_t)e * H + i) * 2 * I + 2 * j];
                        bad += u[((size_t)e * I + j) * H + i] != raw[((size_t)e * H + i) * 2 * I + 2 * j + 1];
                        /* down of expert e, out i (< H), in j == down_proj[e][j][i] */
                        bad += d[((size_t)e * H + i) * I + j] != rd[((size_t)e * I + j) * H + i];
                    }
                for (int j = 0; j < I; j++) {
                    bad += gb[e * I + j] != rb[e * 2 * I + 2 * j];
                    bad += ub[e * I + j] != rb[e * 2 * I + 2 * j + 1];
                }
            }
            CU_ASSERT_EQUAL(bad, 0);
            /* spot checks by hand */
            CU_ASSERT_EQUAL(g[(3 * I + 5) * H + 7], raw[(3 * H + 7) * 2 * I + 10]);
            CU_ASSERT_EQUAL(u[(7 * I + 63) * H + 31], raw[(7 * H + 31) * 2 * I + 127]);
            CU_ASSERT_EQUAL(d[(2 * H + 9) * I + 40], rd[(2 * I + 40) * H + 9]);
        }
    }
done:
    ie_safetensors_destroy(&st);
    ie_model_src_destroy(&src);
}

/* Copy tiny_gptoss into g_dir, replacing `from` by `to` in config.json, and
 * leaving out tensor `skip` / writing `shrink` one element short in its
 * innermost dim. */
static void gptoss_copy_from(const char *src_dir, const char *from, const char *to, const char *skip,
                             const char *shrink)
{
    ie_safetensors_t *st = NULL;
    st_w_t w;
    tbuf_t file;
    char cfg[8192], out[8192], *at;
    char path[256];
    FILE *f;
    size_t n;

    snprintf(path, sizeof path, "%s/config.json", src_dir);
    f = fopen(path, "rb");

    if (!f) abort();
    n = fread(cfg, 1, sizeof cfg - 1, f);
    fclose(f);
    cfg[n] = '\0';
    dir_clear();
    if (from && (at = strstr(cfg, from))) {
        snprintf(out, sizeof out, "%.*s%s%s", (int)(at - cfg), cfg, to, at + strlen(from));
        put_file("config.json", out, strlen(out));
    } else {
        put_file("config.json", cfg, n);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", src_dir);
    if (ie_safetensors_open(path, &st) != IE_OK) abort();
    memset(&w, 0, sizeof w);
    for (int64_t i = 0; i < ie_safetensors_count(st); i++) {
        const ie_safetensors_tensor_t *t = ie_safetensors_get(st, i);
        int64_t shape[4], elems = 1;
        uint64_t es;
        if (skip && strcmp(t->name, skip) == 0) continue;
        for (int d = 0; d < t->ndim; d++) elems *= (shape[d] = t->shape[d]);
        es = elems ? t->nbytes / (uint64_t)elems : 0;
        if (shrink && strcmp(t->name, shrink) == 0) {
            elems = elems / shape[t->ndim - 1] * (shape[t->ndim - 1] - 1);
            shape[t->ndim - 1]--;
        }
        sw_tensor(&w, t->name, t->dtype_str, t->ndim, shape, t->data, (size_t)elems * es);
    }
    sw_finish(&w, &file);
    put_file("model.safetensors", file.p, file.n);
    tb_free(&file);
    ie_safetensors_destroy(&st);
}

static void gptoss_copy(const char *from, const char *to, const char *skip, const char *shrink)
{
    gptoss_copy_from(GPTOSS_DIR, from, to, skip, shrink);
}

static void test_gptoss_bad(void)
{
    ie_model_src_t *src;

    gptoss_copy(NULL, NULL, NULL, NULL); /* the copy itself is valid */
    src = EXPECT_FAIL(g_dir, IE_OK, "");
    ie_model_src_destroy(&src);

    gptoss_copy("\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9", NULL, NULL);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "num_experts_per_tok (9) exceeds num_local_experts (8)");
    gptoss_copy("\"num_local_experts\": 8", "\"num_local_experts\": 0", NULL, NULL);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "num_local_experts = 0");
    gptoss_copy("\"sliding_window\": 8", "\"sliding_window\": null", NULL, NULL);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "sliding_window (0) must be at least 1");
    gptoss_copy("\"full_attention\"", "\"chunked_attention\"", NULL, NULL);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "layer_types[1]");
    gptoss_copy("\"sliding_attention\",\n    \"full_attention\",", "\"sliding_attention\",", NULL, NULL);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "'layer_types' must be an array of 3 strings");
    gptoss_copy("\"rope_type\": \"yarn\"", "\"rope_type\": \"longrope\"", NULL, NULL);
    EXPECT_FAIL(g_dir, IE_ERR_UNSUPPORTED, "rope_parameters type 'longrope'");
    gptoss_copy("\"factor\": 32.0", "\"factor\": \"x\"", NULL, NULL);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "'rope_parameters.factor' must be a number");
    gptoss_copy("\"num_hidden_layers\": 3", "\"num_hidden_layers\": 513", NULL, NULL);
    EXPECT_FAIL(g_dir, IE_ERR_UNSUPPORTED, "num_hidden_layers (513) exceeds");
    gptoss_copy("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", NULL, NULL);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "num_attention_heads (4) is not a multiple of num_key_value_heads (3)");
    gptoss_copy("\"attention_bias\": true", "\"attention_bias\": false", NULL, NULL);
    EXPECT_FAIL(g_dir, IE_ERR_UNSUPPORTED, "attention_bias = false");

    gptoss_copy(NULL, NULL, "model.layers.1.self_attn.sinks", NULL);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT,
                "missing tensor 'blk.1.attn_sinks.weight' (HF 'model.layers.1.self_attn.sinks')");
    gptoss_copy(NULL, NULL, NULL, "model.layers.2.mlp.experts.gate_up_proj");
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT,
                "tensor 'model.layers.2.mlp.experts.gate_up_proj' has shape [8, 32, 127], expected [8, 32, 128]");
    gptoss_copy(NULL, NULL, NULL, "model.layers.0.mlp.experts.down_proj");
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "'model.layers.0.mlp.experts.down_proj' has shape [8, 64, 31]");
    gptoss_copy(NULL, NULL, "model.layers.0.mlp.experts.gate_up_proj_bias", NULL);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "missing tensor 'model.layers.0.mlp.experts.gate_up_proj_bias'");
    gptoss_copy(NULL, NULL, NULL, "model.layers.0.mlp.experts.down_proj_bias");
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT,
                "tensor 'blk.0.ffn_down_exps.bias' has shape [31, 8], expected [32, 8] (HF "
                "'model.layers.0.mlp.experts.down_proj_bias')");
    gptoss_copy(NULL, NULL, NULL, "model.layers.0.mlp.router.weight");
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "'blk.0.ffn_gate_inp.weight' has shape [31, 8], expected [32, 8]");
    gptoss_copy(NULL, NULL, "lm_head.weight", NULL);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "missing tensor 'output.weight' (HF 'lm_head.weight')");

    /* MXFP4 release layout */
    gptoss_copy_from(GPTOSS_MXFP4_DIR, NULL, NULL, NULL, NULL);
    src = EXPECT_FAIL(g_dir, IE_OK, "");
    ie_model_src_destroy(&src);
    gptoss_copy_from(GPTOSS_MXFP4_DIR, NULL, NULL, NULL, "model.layers.1.mlp.experts.down_proj_scales");
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT,
                "tensor 'model.layers.1.mlp.experts.down_proj_scales' has shape [8, 32, 1], expected [8, 32, 2]");
    gptoss_copy_from(GPTOSS_MXFP4_DIR, NULL, NULL, "model.layers.2.mlp.experts.gate_up_proj_scales", NULL);
    EXPECT_FAIL(g_dir, IE_ERR_FORMAT, "missing tensor 'model.layers.2.mlp.experts.gate_up_proj_scales'");
    gptoss_copy_from(GPTOSS_MXFP4_DIR, "\"quant_method\": \"mxfp4\"", "\"quant_method\": \"gptq\"", NULL, NULL);
    EXPECT_FAIL(g_dir, IE_ERR_UNSUPPORTED, "quant_method 'gptq'");
}

int main(void)
{
    unsigned failures;
    dir_new();
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("model_src", NULL, NULL);
    CU_add_test(s, "HF dir: hparams, names, shapes, data", test_hf_valid);
    CU_add_test(s, "HF dir: sharded, scanned, misindexed", test_hf_sharded);
    CU_add_test(s, "HF dir: transformers 5 rope_parameters", test_hf_rope_parameters);
    CU_add_test(s, "HF dir: bad config.json", test_hf_bad_config);
    CU_add_test(s, "HF dir: bad tensors", test_hf_bad_tensors);
    CU_add_test(s, "GGUF: valid, defaults", test_gguf_valid);
    CU_add_test(s, "GGUF: bad files", test_gguf_bad);
    CU_add_test(s, "GPT-OSS: four fixture forms", test_gptoss_fixtures);
    CU_add_test(s, "GPT-OSS: HF MXFP4 == GGUF", test_gptoss_mxfp4_vs_gguf);
    CU_add_test(s, "GPT-OSS: plain experts by index", test_gptoss_plain_values);
    CU_add_test(s, "GPT-OSS: bad config and tensors", test_gptoss_bad);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    failures = CU_get_number_of_failures();
    CU_cleanup_registry();
    dir_remove();
    return failures ? 1 : 0;
}

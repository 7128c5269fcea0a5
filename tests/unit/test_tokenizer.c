/* test_tokenizer.c — CUnit suite for the tokenizer (common/tokenizer/tokenizer*.c).
 *
 * - llama.cpp's tokenizer test vectors (tests/data/ggml-vocab-*.gguf.inp /
 *   .out): every case must match, tokenized without BOS and without special
 *   parsing, as llama.cpp's test-tokenizer-0 does;
 * - the same SPM vectors through Llama-2's tokenizer.json;
 * - detokenizer round trips and streaming of split UTF-8;
 * - invalid UTF-8, special-token parsing on/off, BOS/EOS and EOG rules;
 * - malformed / unsupported tokenizer.json and GGUF input;
 * - several threads encoding with one tokenizer; encode speed on ~1 MB;
 * - o200k from a tiktoken ranks file + harmony special tokens: every
 *   o200k_base case of tiktoken's TestPlans.txt, specials, malformed input.
 */
#include "ie_tokenizer.h"

#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef IE_TEST_DATA
#define IE_TEST_DATA "tests/data"
#endif

#define GPT2_GGUF IE_TEST_DATA "/ggml-vocab-gpt-2.gguf"
#define SPM_GGUF IE_TEST_DATA "/ggml-vocab-llama-spm.gguf"
#define LLAMA2_JSON IE_TEST_DATA "/llama2_tokenizer.json"
#define SMOLLM2_JSON IE_TEST_DATA "/smollm2_tokenizer.json"
#define SMOLLM2_GGUF IE_TEST_DATA "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* ---------------------------------------------------------------- helpers */

static char *slurp(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (!f) { return NULL; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len_out = (size_t)n;
    }
    return buf;
}

static ie_tokenizer_t *load(const char *path)
{
    ie_tokenizer_t *t = NULL;
    ie_status_t st = ie_tokenizer_load(path, &t);
    if (st != IE_OK) { fprintf(stderr, "\nload %s: %s\n", path, ie_error_last()); }
    CU_ASSERT_EQUAL_FATAL(st, IE_OK);
    return t;
}

/* Encode a NUL-terminated string; returns the count, ids in *ids (caller frees). */
static size_t enc(const ie_tokenizer_t *t, const char *s, int flags, int32_t **ids)
{
    size_t n = 0;
    ie_status_t st = ie_tokenizer_encode(t, s, strlen(s), flags, ids, &n);
    CU_ASSERT_EQUAL(st, IE_OK);
    return n;
}

static int ids_eq(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* Decode ids through the streaming detokenizer. Caller frees. */
static char *detok_all(const ie_tokenizer_t *t, const int32_t *ids, size_t n)
{
    ie_detok_t *d = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_detok_new(t, &d), IE_OK);
    size_t cap = 64, len = 0;
    char *out = malloc(cap);
    for (size_t i = 0; i <= n; i++) {
        const char *p = i < n ? ie_detok_push(d, ids[i]) : ie_detok_flush(d);
        size_t k = strlen(p);
        while (len + k + 1 > cap) {
            cap *= 2;
            out = realloc(out, cap);
        }
        memcpy(out + len, p, k);
        len += k;
    }
    out[len] = '\0';
    ie_detok_destroy(&d);
    return out;
}

/* ---------------------------------------------------------------- vectors */

typedef struct vec_case {
    char *text;
    size_t len;
    int32_t *ids;
    size_t n;
} vec_case_t;

/* llama.cpp format: .inp holds the cases separated by
 * "\n__ggml_vocab_test__\n" (also after the last one); .out has one line
 * per case with the ids separated by spaces. */
static size_t read_vectors(const char *base, vec_case_t **out)
{
    char inp[512], outp[512];
    snprintf(inp, sizeof inp, "%s.inp", base);
    snprintf(outp, sizeof outp, "%s.out", base);
    size_t il = 0, ol = 0;
    char *ib = slurp(inp, &il), *ob = slurp(outp, &ol);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ib);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ob);
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t sl = strlen(sep);
    size_t n = 0, cap = 64;
    vec_case_t *v = calloc(cap, sizeof *v);
    size_t pos = 0;
    while (pos < il) {
        char *hit = strstr(ib + pos, sep);
        size_t end = hit ? (size_t)(hit - ib) : il;
        if (n == cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof *v);
        }
        v[n].len = end - pos;
        v[n].text = malloc(v[n].len + 1);
        memcpy(v[n].text, ib + pos, v[n].len);
        v[n].text[v[n].len] = '\0';
        v[n].ids = NULL;
        v[n].n = 0;
        n++;
        pos = hit ? end + sl : il;
    }
    /* ids */
    char *line = ob;
    for (size_t k = 0; k < n && line; k++) {
        char *nl = strchr(line, '\n');
        if (nl) { *nl = '\0'; }
        size_t icap = 16;
        v[k].ids = malloc(icap * sizeof(int32_t));
        char *p = line, *e;
        for (;;) {
            long x = strtol(p, &e, 10);
            if (e == p) { break; }
            if (v[k].n == icap) {
                icap *= 2;
                v[k].ids = realloc(v[k].ids, icap * sizeof(int32_t));
            }
            v[k].ids[v[k].n++] = (int32_t)x;
            p = e;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(ib);
    free(ob);
    *out = v;
    return n;
}

static void free_vectors(vec_case_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(v[i].text);
        free(v[i].ids);
    }
    free(v);
}

/* vec_base: the .inp/.out pair is vec_base + ".inp" / ".out" */
static void run_vectors(const char *tok_path, const char *vec_base, const char *label)
{
    ie_tokenizer_t *t = load(tok_path);
    vec_case_t *v = NULL;
    size_t n = read_vectors(vec_base, &v);
    size_t pass = 0, rt = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t *ids = NULL;
        size_t m = 0;
        ie_status_t st = ie_tokenizer_encode(t, v[i].text, v[i].len, 0, &ids, &m);
        CU_ASSERT_EQUAL(st, IE_OK);
        if (st == IE_OK && ids_eq(ids, m, v[i].ids, v[i].n)) {
            pass++;
        } else {
            fprintf(stderr, "\n%s case %zu mismatch: '%s'\n  got:", label, i, v[i].text);
            for (size_t k = 0; k < m; k++) { fprintf(stderr, " %d", ids[k]); }
            fprintf(stderr, "\n  exp:");
            for (size_t k = 0; k < v[i].n; k++) { fprintf(stderr, " %d", v[i].ids[k]); }
            fprintf(stderr, "\n");
        }
        /* detokenizing the expected ids gives back the text */
        char *back = detok_all(t, v[i].ids, v[i].n);
        if (strcmp(back, v[i].text) == 0) {
            rt++;
        } else {
            fprintf(stderr, "\n%s case %zu round trip: '%s' -> '%s'\n", label, i, v[i].text, back);
        }
        free(back);
        free(ids);
    }
    printf("\n    %s: vectors %zu/%zu, round trips %zu/%zu ", label, pass, n, rt, n);
    CU_ASSERT_EQUAL(pass, n);
    CU_ASSERT_EQUAL(rt, n);
    CU_ASSERT(n >= 40);
    free_vectors(v, n);
    ie_tokenizer_destroy(&t);
}

static void test_vectors_gpt2(void) { run_vectors(GPT2_GGUF, GPT2_GGUF, "gpt-2 gguf"); }

static void test_vectors_spm(void) { run_vectors(SPM_GGUF, SPM_GGUF, "llama-spm gguf"); }

/* Byte-level vocabularies whose tokenizer.ggml.pre names another
 * pre-tokenizer (llama.cpp's vectors, ids from HF `tokenizers`). */
#define VOCAB(name) IE_TEST_DATA "/ggml-vocab-" name ".gguf"
static void test_vectors_deepseek_coder(void)
{
    run_vectors(VOCAB("deepseek-coder"), VOCAB("deepseek-coder"), "deepseek-coder gguf");
}
static void test_vectors_falcon(void) { run_vectors(VOCAB("falcon"), VOCAB("falcon"), "falcon gguf"); }
static void test_vectors_mpt(void) { run_vectors(VOCAB("mpt"), VOCAB("mpt"), "mpt gguf"); }
static void test_vectors_refact(void) { run_vectors(VOCAB("refact"), VOCAB("refact"), "refact gguf"); }

/* tests/reference/gen_pretok_refs.py: each model's pre-tokenizer over a
 * small GPT-2 vocabulary (Gemma: its SentencePiece conventions over a
 * small Llama-2 vocabulary) as a GGUF with tokenizer.ggml.pre = the name;
 * ids from HF `tokenizers` on the model's tokenizer.json pipeline. */
static void test_vectors_pretok_refs(void)
{
    static const char *const names[] = {"llama-bpe", "qwen2",     "deepseek-llm", "deepseek-coder",
                                        "falcon",    "starcoder", "refact",       "command-r",
                                        "mpt",       "gemma"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char gguf[600], base[512], label[64];
        snprintf(base, sizeof base, "%s/pretok/%s", IE_TEST_DATA, names[i]);
        snprintf(gguf, sizeof gguf, "%s.gguf", base);
        snprintf(label, sizeof label, "%s ref gguf", names[i]);
        run_vectors(gguf, base, label);
    }
    /* Gemma's turn end is an end-of-generation token of the SPM GGUF */
    ie_tokenizer_t *t = load(IE_TEST_DATA "/pretok/gemma.gguf");
    int32_t eot = ie_tokenizer_find(t, "<end_of_turn>", 13);
    CU_ASSERT(eot >= 0);
    CU_ASSERT_TRUE(ie_tokenizer_is_eog(t, eot));
    CU_ASSERT_FALSE(ie_tokenizer_is_eog(t, ie_tokenizer_find(t, "<start_of_turn>", 15)));
    ie_tokenizer_destroy(&t);
}

/* The same cases with ids from HF `tokenizers` (tests/reference/
 * make_hf_vectors.py). Note llama2_tokenizer.json is not the vocabulary of
 * ggml-vocab-llama-spm.gguf (see tests/data/README.md). */
static void test_vectors_llama2_json(void) { run_vectors(LLAMA2_JSON, LLAMA2_JSON, "llama2 tokenizer.json"); }

static void test_vectors_smollm2_json(void) { run_vectors(SMOLLM2_JSON, SMOLLM2_JSON, "smollm2 tokenizer.json"); }

/* SmolLM2's GGUF (fetched by scripts/setup.sh) against the same HF ids */
static void test_vectors_smollm2_gguf(void)
{
    struct stat sb;
    if (stat(SMOLLM2_GGUF, &sb) != 0) {
        printf("\n    (skipped: %s missing; run scripts/setup.sh) ", SMOLLM2_GGUF);
        return;
    }
    run_vectors(SMOLLM2_GGUF, SMOLLM2_JSON, "smollm2 gguf");
}

/* ---------------------------------------------------------------- detok */

static int32_t find(const ie_tokenizer_t *t, const char *s)
{
    int32_t id = ie_tokenizer_find(t, s, strlen(s));
    CU_ASSERT(id >= 0);
    return id;
}

static void test_stream_spm_bytes(void)
{
    ie_tokenizer_t *t = load(SPM_GGUF);
    ie_detok_t *d = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_detok_new(t, &d), IE_OK);
    /* U+1F999 as four byte-fallback tokens: nothing until the last one */
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, find(t, "\xE2\x96\x81"
                                                    "a")),
                           "a"); /* leading space dropped */
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, find(t, "<0xF0>")), "");
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, find(t, "<0x9F>")), "");
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, find(t, "<0xA6>")), "");
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, find(t, "<0x99>")), "\xF0\x9F\xA6\x99");
    /* broken sequence: F0 9F then 'b' -> U+FFFD then " b" */
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, find(t, "<0xF0>")), "");
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, find(t, "<0x9F>")), "");
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, find(t, "\xE2\x96\x81"
                                                    "b")),
                           "\xEF\xBF\xBD b");
    /* a lone continuation byte and an invalid lead byte */
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, find(t, "<0x80>")), "\xEF\xBF\xBD");
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, find(t, "<0xFF>")), "\xEF\xBF\xBD");
    /* surrogate lead ED A0 is invalid at the second byte */
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, find(t, "<0xED>")), "");
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, find(t, "<0xA0>")), "\xEF\xBF\xBD\xEF\xBF\xBD");
    /* a NUL byte is text too; last_len sees past it */
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, find(t, "<0x00>")), "");
    CU_ASSERT_EQUAL(ie_detok_last_len(d), 1);
    /* an unfinished sequence comes out at flush */
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, find(t, "<0xE2>")), "");
    CU_ASSERT_STRING_EQUAL(ie_detok_flush(d), "\xEF\xBF\xBD");
    CU_ASSERT_STRING_EQUAL(ie_detok_flush(d), "");
    /* control tokens are silent by default, and out-of-range ids too */
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, ie_tokenizer_eos(t)), "");
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, -5), "");
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, ie_tokenizer_n_vocab(t)), "");
    ie_detok_set_special(d, 1);
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, ie_tokenizer_eos(t)), "</s>");
    ie_detok_destroy(&d);
    CU_ASSERT_PTR_NULL(d);
    ie_detok_destroy(&d);
    ie_detok_destroy(NULL);
    ie_tokenizer_destroy(&t);
}

static void test_stream_bytelevel(void)
{
    ie_tokenizer_t *t = load(GPT2_GGUF);
    int32_t *ids = NULL;
    size_t n = enc(t, " this is \xF0\x9F\xA6\x99.cpp", 0, &ids);
    const int32_t exp[] = {428, 318, 12520, 99, 247, 13, 20322};
    CU_ASSERT_TRUE(ids_eq(ids, n, exp, 7));
    ie_detok_t *d = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_detok_new(t, &d), IE_OK);
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, 428), " this"); /* byte-level keeps the space */
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, 318), " is");
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, 12520), " "); /* " \xF0\x9F": the space only */
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, 99), "");
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, 247), "\xF0\x9F\xA6\x99");
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, 13), ".");
    CU_ASSERT_STRING_EQUAL(ie_detok_flush(d), "");
    ie_detok_destroy(&d);

    /* token_bytes: raw bytes, partial UTF-8 allowed; cap respected */
    char buf[8];
    CU_ASSERT_EQUAL(ie_tokenizer_token_bytes(t, 12520, 0, buf, sizeof buf), 3);
    CU_ASSERT_EQUAL(memcmp(buf, " \xF0\x9F", 3), 0);
    CU_ASSERT_EQUAL(ie_tokenizer_token_bytes(t, 428, 0, buf, 2), 5); /* " this", truncated copy */
    CU_ASSERT_EQUAL(memcmp(buf, " t", 2), 0);
    CU_ASSERT_EQUAL(ie_tokenizer_token_bytes(t, 50256, 0, buf, sizeof buf), 0);
    CU_ASSERT_EQUAL(ie_tokenizer_token_bytes(t, 50256, 1, NULL, 0), 13); /* <|endoftext|> */
    CU_ASSERT_EQUAL(ie_tokenizer_token_bytes(t, -1, 1, buf, sizeof buf), -1);
    CU_ASSERT_EQUAL(ie_tokenizer_token_bytes(t, 50257, 1, buf, sizeof buf), -1);
    free(ids);
    ie_tokenizer_destroy(&t);
}

/* ---------------------------------------------------------------- UTF-8 */

static void test_invalid_utf8(void)
{
    ie_tokenizer_t *t = load(GPT2_GGUF);
    static const struct {
        const char *s;
        size_t len;
        size_t at;
    } bad[] = {
        {"ab\xFF", 3, 2},           /* never valid */
        {"\xC0\xAF", 2, 0},         /* overlong '/' */
        {"x\xE0\x80\xAF", 4, 1},    /* overlong 3-byte */
        {"ok \xED\xA0\x80", 6, 3},  /* surrogate U+D800 */
        {"\xF4\x90\x80\x80", 4, 0}, /* above U+10FFFF */
        {"abc\xE2\x82", 5, 3},      /* truncated at the end */
        {"\x80", 1, 0},             /* lone continuation */
        {"a\xC3(", 3, 1},           /* bad continuation */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = (int32_t *)1;
        size_t n = 99;
        ie_status_t st = ie_tokenizer_encode(t, bad[i].s, bad[i].len, 0, &ids, &n);
        CU_ASSERT_EQUAL(st, IE_ERR_INVAL);
        CU_ASSERT_PTR_NULL(ids);
        CU_ASSERT_EQUAL(n, 0);
        char want[64];
        snprintf(want, sizeof want, "invalid UTF-8 at byte %zu", bad[i].at);
        CU_ASSERT_STRING_EQUAL(ie_error_last(), want);
        CU_ASSERT_EQUAL(ie_tokenizer_check_utf8(bad[i].s, bad[i].len), IE_ERR_INVAL);
    }
    /* valid edge cases: U+10FFFF, U+FFFF, NUL inside the text */
    int32_t *ids = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(ie_tokenizer_encode(t, "\xF4\x8F\xBF\xBF\xEF\xBF\xBF", 7, 0, &ids, &n), IE_OK);
    free(ids);
    CU_ASSERT_EQUAL(ie_tokenizer_encode(t, "a\0b", 3, 0, &ids, &n), IE_OK);
    CU_ASSERT_EQUAL(n, 3);
    free(ids);
    /* empty text gives a freeable array of zero ids */
    CU_ASSERT_EQUAL(ie_tokenizer_encode(t, NULL, 0, 0, &ids, &n), IE_OK);
    CU_ASSERT_EQUAL(n, 0);
    free(ids);
    /* bad arguments */
    CU_ASSERT_EQUAL(ie_tokenizer_encode(NULL, "a", 1, 0, &ids, &n), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_tokenizer_encode(t, "a", 1, 0, NULL, &n), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_tokenizer_encode(t, "a", 1, 64, &ids, &n), IE_ERR_INVAL);
    ie_tokenizer_destroy(&t);
}

/* ---------------------------------------------------------------- special */

static void test_special_gpt2(void)
{
    ie_tokenizer_t *t = load(GPT2_GGUF);
    int32_t *ids = NULL;
    size_t n = enc(t, "a<|endoftext|>b", IE_TOK_PARSE_SPECIAL, &ids);
    const int32_t on[] = {64, 50256, 65};
    CU_ASSERT_TRUE(ids_eq(ids, n, on, 3));
    free(ids);
    n = enc(t, "a<|endoftext|>b", 0, &ids);
    CU_ASSERT(n > 3);
    for (size_t i = 0; i < n; i++) { CU_ASSERT_NOT_EQUAL(ids[i], 50256); }
    free(ids);
    /* GPT-2 adds no BOS; EOS/EOG is <|endoftext|> */
    n = enc(t, "hello", IE_TOK_ADD_SPECIAL, &ids);
    const int32_t hello[] = {31373};
    CU_ASSERT_TRUE(ids_eq(ids, n, hello, 1));
    free(ids);
    CU_ASSERT_EQUAL(ie_tokenizer_add_bos(t), 0);
    CU_ASSERT_EQUAL(ie_tokenizer_eos(t), 50256);
    CU_ASSERT_TRUE(ie_tokenizer_is_eog(t, 50256));
    CU_ASSERT_FALSE(ie_tokenizer_is_eog(t, 31373));
    CU_ASSERT_TRUE(ie_tokenizer_is_special(t, 50256));
    CU_ASSERT_EQUAL(ie_tokenizer_n_vocab(t), 50257);
    ie_tokenizer_destroy(&t);
}

/* Fill-in-the-middle ids by their spellings (these vocabularies carry no
 * tokenizer.ggml.fim_* keys): DeepSeek-Coder's begin / hole / end, Refact's
 * StarCoder names (listed prefix, middle, suffix: the roles, not the ids'
 * order, decide), none in GPT-2 or Llama 2; untouched outputs then. */
static void test_fim_ids(void)
{
    int32_t pre = -7, suf = -7, mid = -7;
    ie_tokenizer_t *t = load(VOCAB("deepseek-coder"));
    CU_ASSERT_EQUAL(ie_tokenizer_fim(t, &pre, &suf, &mid), 1);
    CU_ASSERT_EQUAL(pre, 32016);
    CU_ASSERT_EQUAL(suf, 32015);
    CU_ASSERT_EQUAL(mid, 32017);
    ie_tokenizer_destroy(&t);
    t = load(VOCAB("refact"));
    CU_ASSERT_EQUAL(ie_tokenizer_fim(t, &pre, &suf, &mid), 1);
    CU_ASSERT_EQUAL(pre, 1);
    CU_ASSERT_EQUAL(suf, 3);
    CU_ASSERT_EQUAL(mid, 2);
    ie_tokenizer_destroy(&t);
    pre = suf = mid = -7;
    t = load(GPT2_GGUF);
    CU_ASSERT_EQUAL(ie_tokenizer_fim(t, &pre, &suf, &mid), 0);
    ie_tokenizer_destroy(&t);
    t = load(SPM_GGUF);
    CU_ASSERT_EQUAL(ie_tokenizer_fim(t, &pre, &suf, &mid), 0);
    ie_tokenizer_destroy(&t);
    CU_ASSERT(pre == -7 && suf == -7 && mid == -7);
    CU_ASSERT_EQUAL(ie_tokenizer_fim(NULL, &pre, &suf, &mid), 0);
}

static void test_special_spm(const char *path)
{
    ie_tokenizer_t *t = load(path);
    int32_t *ids = NULL;
    /* parse on: <s> is a token and the text after it gets its own prefix space */
    size_t n = enc(t, "Hi<s>there", IE_TOK_PARSE_SPECIAL, &ids);
    int32_t hi = find(t, "\xE2\x96\x81Hi"), there = find(t, "\xE2\x96\x81there");
    const int32_t on[] = {hi, 1, there};
    CU_ASSERT_TRUE(ids_eq(ids, n, on, 3));
    free(ids);
    n = enc(t, "Hi<s>there", 0, &ids);
    CU_ASSERT(n > 3);
    for (size_t i = 0; i < n; i++) { CU_ASSERT_NOT_EQUAL(ids[i], 1); }
    free(ids);
    /* Llama adds BOS, not EOS */
    n = enc(t, "Hi", IE_TOK_ADD_SPECIAL, &ids);
    const int32_t bos[] = {1, hi};
    CU_ASSERT_TRUE(ids_eq(ids, n, bos, 2));
    free(ids);
    n = enc(t, "", IE_TOK_ADD_SPECIAL, &ids);
    CU_ASSERT_EQUAL(n, 1);
    free(ids);
    CU_ASSERT_EQUAL(ie_tokenizer_bos(t), 1);
    CU_ASSERT_EQUAL(ie_tokenizer_eos(t), 2);
    CU_ASSERT_EQUAL(ie_tokenizer_unk(t), 0);
    CU_ASSERT_TRUE(ie_tokenizer_is_eog(t, 2));
    CU_ASSERT_FALSE(ie_tokenizer_is_eog(t, 1));
    ie_tokenizer_destroy(&t);
}

static void test_special_spm_gguf(void) { test_special_spm(SPM_GGUF); }

static void test_special_spm_json(void) { test_special_spm(LLAMA2_JSON); }

/* SmolLM2 (generated by tests/reference/make_smollm2_tokenizer_json.py) */
static void test_smollm2_json(void)
{
    ie_tokenizer_t *t = load(SMOLLM2_JSON);
    int32_t *ids = NULL;
    size_t n = enc(t, "<|im_start|>user\nHi<|im_end|>", IE_TOK_PARSE_SPECIAL, &ids);
    CU_ASSERT(n >= 4);
    if (n >= 4) {
        CU_ASSERT_EQUAL(ids[0], 1);
        CU_ASSERT_EQUAL(ids[n - 1], 2);
    }
    free(ids);
    /* digits are split one by one */
    n = enc(t, "2024", 0, &ids);
    CU_ASSERT_EQUAL(n, 4);
    free(ids);
    CU_ASSERT_TRUE(ie_tokenizer_is_eog(t, 2)); /* <|im_end|> */
    CU_ASSERT_TRUE(ie_tokenizer_is_eog(t, 0)); /* <|endoftext|> */
    CU_ASSERT_EQUAL(ie_tokenizer_add_bos(t), 0);
    ie_tokenizer_destroy(&t);
}

/* ---------------------------------------------------------------- malformed */

static char g_tmpdir[256];

static const char *write_tmp(const char *name, const char *content)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_tmpdir, name);
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fwrite(content, 1, strlen(content), f);
    fclose(f);
    return path;
}

static ie_status_t load_str(const char *json)
{
    ie_tokenizer_t *t = NULL;
    const char *p = write_tmp("t.json", json);
    ie_status_t st = ie_tokenizer_load(p, &t);
    if (st == IE_OK) {
        CU_ASSERT_PTR_NOT_NULL(t);
    } else {
        CU_ASSERT_PTR_NULL(t);
        CU_ASSERT(strlen(ie_error_last()) > 0);
    }
    ie_tokenizer_destroy(&t);
    return st;
}

#define BL_PRE "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"
#define MODEL(v, m) "\"model\":{\"type\":\"BPE\",\"vocab\":" v ",\"merges\":" m "}"

static void test_malformed_json(void)
{
    static const struct {
        const char *json;
        ie_status_t want;
    } cases[] = {
        {"", IE_ERR_FORMAT},
        {"{", IE_ERR_FORMAT},
        {"[1,2]", IE_ERR_FORMAT},
        {"{\"model\": 5}", IE_ERR_FORMAT},
        {"{" BL_PRE "}", IE_ERR_FORMAT},
        {"{" BL_PRE ",\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", IE_ERR_UNSUPPORTED},
        {"{" BL_PRE ",\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", IE_ERR_UNSUPPORTED},
        {"{" BL_PRE "," MODEL("{\"a\":-1}", "[]") "}", IE_ERR_FORMAT},
        {"{" BL_PRE "," MODEL("{\"a\":1.5}", "[]") "}", IE_ERR_FORMAT},
        {"{" BL_PRE "," MODEL("{\"a\":\"x\"}", "[]") "}", IE_ERR_FORMAT},
        {"{" BL_PRE "," MODEL("{\"a\":99999999999}", "[]") "}", IE_ERR_FORMAT},
        {"{" BL_PRE "," MODEL("{\"a\":0,\"b\":0}", "[]") "}", IE_ERR_FORMAT},
        {"{" BL_PRE "," MODEL("{}", "[]") "}", IE_ERR_FORMAT},
        {"{" BL_PRE "," MODEL("{\"a\":0,\"b\":1}", "[\"a c\"]") "}", IE_ERR_FORMAT},
        {"{" BL_PRE "," MODEL("{\"a\":0,\"b\":1}", "[\"a b\"]") "}", IE_ERR_FORMAT}, /* no "ab" */
        {"{" BL_PRE "," MODEL("{\"a\":0,\"b\":1,\"ab\":2}", "[\"ab\"]") "}", IE_ERR_FORMAT},
        {"{" BL_PRE "," MODEL("{\"a\":0,\"b\":1,\"ab\":2}", "[[\"a\"]]") "}", IE_ERR_FORMAT},
        {"{" BL_PRE "," MODEL("{\"a\":0,\"b\":1,\"ab\":2}", "[7]") "}", IE_ERR_FORMAT},
        {"{" BL_PRE "," MODEL("{\"a\":0}", "{}") "}", IE_ERR_FORMAT},
        {"{" BL_PRE "," MODEL("{\"a\":0}", "[]") ",\"added_tokens\":[{\"id\":4000000000,\"content\":\"x\"}]}",
         IE_ERR_FORMAT},
        {"{" BL_PRE "," MODEL("{\"a\":0}", "[]") ",\"added_tokens\":[{\"id\":1}]}", IE_ERR_FORMAT},
        {"{" BL_PRE "," MODEL("{\"a\":0}", "[]") ",\"added_tokens\":7}", IE_ERR_FORMAT},
        {"{\"pre_tokenizer\":{\"type\":\"Whitespace\"}," MODEL("{\"a\":0}", "[]") "}", IE_ERR_UNSUPPORTED},
        {"{\"normalizer\":{\"type\":\"NFKC\"}," BL_PRE "," MODEL("{\"a\":0}", "[]") "}", IE_ERR_UNSUPPORTED},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"},"
         "\"decoder\":{\"type\":\"ByteLevel\"}," MODEL("{\"a\":0}", "[]") "}",
         IE_ERR_UNSUPPORTED},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\"},"
         "\"decoder\":{\"type\":\"ByteLevel\"}," MODEL("{\"a\":0}", "[]") "}",
         IE_ERR_UNSUPPORTED},
        {"{" MODEL("{\"a\":0}", "[]") "}", IE_ERR_UNSUPPORTED}, /* neither byte-level nor SPM */
        {"{" BL_PRE ",\"post_processor\":{\"type\":\"Mystery\"}," MODEL("{\"a\":0}", "[]") "}", IE_ERR_UNSUPPORTED},
        {"{" BL_PRE ",\"model\":{\"type\":\"BPE\",\"dropout\":0.1,\"vocab\":{\"a\":0},\"merges\":[]}}",
         IE_ERR_UNSUPPORTED},
        {"{" BL_PRE
         ",\"model\":{\"type\":\"BPE\",\"continuing_subword_prefix\":\"##\",\"vocab\":{\"a\":0},\"merges\":[]}}",
         IE_ERR_UNSUPPORTED},
        /* valid */
        {"{" BL_PRE "," MODEL("{\"a\":0,\"b\":1,\"ab\":2}", "[\"a b\"]") "}", IE_OK},
        {"{" BL_PRE "," MODEL("{\"a\":0,\"b\":1,\"ab\":2}", "[[\"a\",\"b\"]]") "}", IE_OK},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ie_status_t st = load_str(cases[i].json);
        if (st != cases[i].want) {
            fprintf(stderr, "\nmalformed case %zu: got %s (%s), want %s\n", i, ie_status_str(st), ie_error_last(),
                    ie_status_str(cases[i].want));
        }
        CU_ASSERT_EQUAL(st, cases[i].want);
    }

    /* the tiny valid one encodes with its merge; unknown bytes are dropped */
    ie_tokenizer_t *t = NULL;
    const char *p = write_tmp("t.json", "{" BL_PRE "," MODEL("{\"a\":0,\"b\":1,\"ab\":2}", "[\"a b\"]") "}");
    CU_ASSERT_EQUAL_FATAL(ie_tokenizer_load(p, &t), IE_OK);
    int32_t *ids = NULL;
    size_t n = enc(t, "abba", 0, &ids);
    const int32_t exp[] = {2, 1, 0};
    CU_ASSERT_TRUE(ids_eq(ids, n, exp, 3));
    free(ids);
    ie_tokenizer_destroy(&t);

    /* missing file / directory without tokenizer.json */
    CU_ASSERT_EQUAL(ie_tokenizer_load("/nonexistent/tokenizer.json", &t), IE_ERR_IO);
    CU_ASSERT_PTR_NULL(t);
    CU_ASSERT_EQUAL(ie_tokenizer_load(g_tmpdir, &t), IE_ERR_IO);
    CU_ASSERT_EQUAL(ie_tokenizer_load(NULL, &t), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_tokenizer_load("x", NULL), IE_ERR_INVAL);
    ie_tokenizer_destroy(NULL);
}

/* A directory with tokenizer.json + tokenizer_config.json */
static void test_dir_and_config(void)
{
    size_t len = 0;
    char *js = slurp(LLAMA2_JSON, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(js);
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_tmpdir);
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fwrite(js, 1, len, f);
    fclose(f);
    free(js);
    write_tmp("tokenizer_config.json",
              "{\"add_bos_token\": false, \"add_eos_token\": true, \"bos_token\": {\"content\": \"<s>\"},"
              " \"eos_token\": \"</s>\"}");
    ie_tokenizer_t *t = load(g_tmpdir);
    int32_t *ids = NULL;
    size_t n = enc(t, "Hi", IE_TOK_ADD_SPECIAL, &ids);
    const int32_t exp[] = {find(t, "\xE2\x96\x81Hi"), 2};
    CU_ASSERT_TRUE(ids_eq(ids, n, exp, 2));
    free(ids);
    ie_tokenizer_destroy(&t);

    /* a malformed config is an error, not silently ignored */
    write_tmp("tokenizer_config.json", "{not json");
    CU_ASSERT_EQUAL(ie_tokenizer_load(g_tmpdir, &t), IE_ERR_FORMAT);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", g_tmpdir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", g_tmpdir);
    unlink(path);
}

/* Byte-fallback tokens spelled in lower-case hex ("<0x0a>") are byte tokens
 * in a tokenizer.json as in a GGUF vocabulary: the loaders share one parser. */
static void test_lowercase_byte_token_json(void)
{
    size_t len = 0;
    char *js = slurp(LLAMA2_JSON, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(js);
    char *at = strstr(js, "\"<0x0A>\"");
    CU_ASSERT_PTR_NOT_NULL_FATAL(at);
    memcpy(at + 1, "<0x0a>", 6);
    char path[512];
    snprintf(path, sizeof path, "%s", write_tmp("tokenizer.json", js));
    free(js);
    ie_tokenizer_t *t = load(path);
    const int32_t nl = find(t, "<0x0a>");
    CU_ASSERT_EQUAL(nl, 13);
    int32_t *ids = NULL;
    size_t n = enc(t, "a\nb", 0, &ids);
    int found = 0;
    for (size_t i = 0; i < n; i++) found |= ids[i] == nl;
    CU_ASSERT_TRUE(found); /* '\n' encodes through the byte token */
    free(ids);
    ie_detok_t *d = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_detok_new(t, &d), IE_OK);
    CU_ASSERT_STRING_EQUAL(ie_detok_push(d, nl), "\n");
    ie_detok_destroy(&d);
    ie_tokenizer_destroy(&t);
    unlink(path);
}

static void test_malformed_gguf(void)
{
    size_t len = 0;
    char *g = slurp(GPT2_GGUF, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(g);
    char path[512];
    snprintf(path, sizeof path, "%s/bad.gguf", g_tmpdir);
    /* truncations at many points, and a flipped byte in the header */
    size_t cuts[] = {0, 3, 4, 8, 24, 100, 1000, len / 2, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        FILE *f = fopen(path, "wb");
        CU_ASSERT_PTR_NOT_NULL_FATAL(f);
        fwrite(g, 1, cuts[i], f);
        fclose(f);
        ie_tokenizer_t *t = NULL;
        ie_status_t st = ie_tokenizer_load(path, &t);
        CU_ASSERT_NOT_EQUAL(st, IE_OK);
        CU_ASSERT_PTR_NULL(t);
        ie_tokenizer_destroy(&t);
    }
    unlink(path);
    free(g);
}

/* ---------------------------------------------------------------- threads, speed */

typedef struct thr_arg {
    const ie_tokenizer_t *t;
    const char *text;
    size_t len;
    int32_t *ids;
    size_t n;
    ie_status_t st;
} thr_arg_t;

static void *thr_main(void *p)
{
    thr_arg_t *a = p;
    for (int r = 0; r < 3; r++) {
        free(a->ids);
        a->ids = NULL;
        a->st = ie_tokenizer_encode(a->t, a->text, a->len, IE_TOK_ADD_SPECIAL, &a->ids, &a->n);
    }
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_threads_and_speed(void)
{
    size_t len = 0;
    char *text = slurp(IE_TEST_DATA "/corpus/austen_1.txt", &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    const char *paths[] = {GPT2_GGUF, SPM_GGUF};
    for (int k = 0; k < 2; k++) {
        ie_tokenizer_t *t = load(paths[k]);
        int32_t *ref = NULL;
        size_t nref = 0;
        double t0 = now_s();
        CU_ASSERT_EQUAL(ie_tokenizer_encode(t, text, len, 0, &ref, &nref), IE_OK);
        double dt = now_s() - t0;
        printf("\n    %s: %zu bytes -> %zu tokens in %.3f s ", k ? "llama-spm" : "gpt-2", len, nref, dt);
        CU_ASSERT(dt < 5.0); /* generous for sanitizer builds; ~0.1-0.3 s in release */

        /* detokenize back */
        char *back = detok_all(t, ref, nref);
        CU_ASSERT_EQUAL(strlen(back), len);
        CU_ASSERT_TRUE(strcmp(back, text) == 0);
        free(back);

        thr_arg_t a[4];
        pthread_t th[4];
        size_t half = len / 2;
        while (half < len && text[half] != '\n') { half++; }
        for (int i = 0; i < 4; i++) {
            memset(&a[i], 0, sizeof a[i]);
            a[i].t = t;
            a[i].text = text;
            a[i].len = half;
            CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, thr_main, &a[i]), 0);
        }
        for (int i = 0; i < 4; i++) { pthread_join(th[i], NULL); }
        for (int i = 1; i < 4; i++) {
            CU_ASSERT_EQUAL(a[i].st, IE_OK);
            CU_ASSERT_TRUE(ids_eq(a[i].ids, a[i].n, a[0].ids, a[0].n));
        }
        for (int i = 0; i < 4; i++) { free(a[i].ids); }
        free(ref);
        ie_tokenizer_destroy(&t);
    }
    free(text);
}

/* ---------------------------------------------------------------- o200k / tiktoken */

#define O200K_TIKTOKEN IE_TEST_DATA "/o200k_base.tiktoken"
#define O200K_SPECIALS IE_TEST_DATA "/o200k_harmony_special_tokens.json"
#define TEST_PLANS IE_TEST_DATA "/TestPlans.txt"

/* TestPlans.txt (tiktoken's cross-implementation vectors): blocks of
 *   EncodingName: NAME\nSample: TEXT\nEncoded: [id, id, ...]\n
 * separated by blank lines; TEXT is the rest of the line (may be empty).
 * Returns the cases of encoding `name`. */
static size_t read_test_plans(const char *name, vec_case_t **out)
{
    size_t len = 0;
    char *buf = slurp(TEST_PLANS, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
    size_t n = 0, cap = 64;
    vec_case_t *v = calloc(cap, sizeof *v);
    char *cur_name = NULL;
    char *sample = NULL;
    size_t sample_len = 0;
    char *line = buf;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        if (nl) { *nl = '\0'; }
        if (strncmp(line, "EncodingName: ", 14) == 0) {
            cur_name = line + 14;
        } else if (strncmp(line, "Sample: ", 8) == 0) {
            sample = line + 8;
            sample_len = strlen(sample);
        } else if (strcmp(line, "Sample:") == 0) {
            sample = line + 7;
            sample_len = 0;
        } else if (strncmp(line, "Encoded: [", 10) == 0 && cur_name && sample && strcmp(cur_name, name) == 0) {
            if (n == cap) {
                cap *= 2;
                v = realloc(v, cap * sizeof *v);
            }
            v[n].text = malloc(sample_len + 1);
            memcpy(v[n].text, sample, sample_len);
            v[n].text[sample_len] = '\0';
            v[n].len = sample_len;
            size_t icap = 16;
            v[n].ids = malloc(icap * sizeof(int32_t));
            v[n].n = 0;
            char *p = line + 10, *e;
            for (;;) {
                while (*p == ',' || *p == ' ') { p++; }
                long x = strtol(p, &e, 10);
                if (e == p) { break; }
                if (v[n].n == icap) {
                    icap *= 2;
                    v[n].ids = realloc(v[n].ids, icap * sizeof(int32_t));
                }
                v[n].ids[v[n].n++] = (int32_t)x;
                p = e;
            }
            n++;
            sample = NULL;
        }
        line = nl ? nl + 1 : NULL;
    }
    /* the vectors point into buf only until copied above */
    free(buf);
    *out = v;
    return n;
}

/* Every o200k_base case of TestPlans.txt through the tiktoken loader:
 * ids equal, and the expected ids detokenize back to the sample. */
static void test_test_plans_o200k(void)
{
    ie_tokenizer_t *t = load(O200K_TIKTOKEN);
    vec_case_t *v = NULL;
    size_t n = read_test_plans("o200k_base", &v);
    size_t pass = 0, rt = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t *ids = NULL;
        size_t m = 0;
        ie_status_t st = ie_tokenizer_encode(t, v[i].text, v[i].len, 0, &ids, &m);
        CU_ASSERT_EQUAL(st, IE_OK);
        if (st == IE_OK && ids_eq(ids, m, v[i].ids, v[i].n)) {
            pass++;
        } else {
            fprintf(stderr, "\no200k case %zu mismatch: '%s'\n  got:", i, v[i].text);
            for (size_t k = 0; k < m; k++) { fprintf(stderr, " %d", ids[k]); }
            fprintf(stderr, "\n  exp:");
            for (size_t k = 0; k < v[i].n; k++) { fprintf(stderr, " %d", v[i].ids[k]); }
            fprintf(stderr, "\n");
        }
        char *back = detok_all(t, v[i].ids, v[i].n);
        rt += strcmp(back, v[i].text) == 0;
        free(back);
        free(ids);
    }
    printf("\n    TestPlans o200k_base: %zu/%zu, round trips %zu/%zu ", pass, n, rt, n);
    CU_ASSERT_EQUAL(n, 57);
    CU_ASSERT_EQUAL(pass, n);
    CU_ASSERT_EQUAL(rt, n);
    free_vectors(v, n);
    ie_tokenizer_destroy(&t);
}

/* The harmony special tokens: ids, parsing on/off, EOG, detok hiding;
 * the explicit API with and without the table. */
static void test_tiktoken_specials(void)
{
    ie_tokenizer_t *t = load(O200K_TIKTOKEN); /* picks up the table beside it */
    CU_ASSERT_EQUAL(ie_tokenizer_n_vocab(t), 201088);
    CU_ASSERT_EQUAL(ie_tokenizer_bos(t), 199998);
    CU_ASSERT_EQUAL(ie_tokenizer_eos(t), 199999);
    CU_ASSERT_EQUAL(ie_tokenizer_add_bos(t), 0);
    CU_ASSERT_TRUE(ie_tokenizer_is_eog(t, 200002));  /* <|return|> */
    CU_ASSERT_TRUE(ie_tokenizer_is_eog(t, 200012));  /* <|call|>   */
    CU_ASSERT_FALSE(ie_tokenizer_is_eog(t, 200007)); /* <|end|>: the next message follows */
    CU_ASSERT_TRUE(ie_tokenizer_is_special(t, 200006));
    CU_ASSERT_EQUAL(find(t, "<|channel|>"), 200005);
    CU_ASSERT_EQUAL(find(t, "<|reserved_201087|>"), 201087);

    const char *s = "<|start|>user<|message|>Hi<|end|>";
    int32_t *ids = NULL;
    size_t n = enc(t, s, IE_TOK_PARSE_SPECIAL | IE_TOK_ADD_SPECIAL, &ids);
    const int32_t exp[] = {200006, 1428, 200008, 12194, 200007};
    CU_ASSERT_TRUE(ids_eq(ids, n, exp, 5));
    free(ids);
    n = enc(t, s, 0, &ids); /* plain text: no special ids */
    for (size_t i = 0; i < n; i++) { CU_ASSERT(ids[i] < 199998); }
    char *back = detok_all(t, ids, n);
    CU_ASSERT_STRING_EQUAL(back, s);
    free(back);
    free(ids);
    char buf[32];
    CU_ASSERT_EQUAL(ie_tokenizer_token_bytes(t, 200005, 0, buf, sizeof buf), 0);
    CU_ASSERT_EQUAL(ie_tokenizer_token_bytes(t, 200005, 1, buf, sizeof buf), 11);
    ie_tokenizer_destroy(&t);

    /* no table: ranks only, special text is plain text */
    CU_ASSERT_EQUAL_FATAL(ie_tokenizer_load_tiktoken(O200K_TIKTOKEN, NULL, &t), IE_OK);
    CU_ASSERT_EQUAL(ie_tokenizer_n_vocab(t), 199998);
    CU_ASSERT_EQUAL(ie_tokenizer_bos(t), -1);
    n = enc(t, "<|start|>", IE_TOK_PARSE_SPECIAL, &ids);
    CU_ASSERT(n > 1);
    free(ids);
    ie_tokenizer_destroy(&t);
    CU_ASSERT_EQUAL(ie_tokenizer_load_tiktoken(O200K_TIKTOKEN, O200K_SPECIALS, &t), IE_OK);
    CU_ASSERT_EQUAL(ie_tokenizer_n_vocab(t), 201088);
    ie_tokenizer_destroy(&t);
}

/* A 256-line ranks file (every single byte) in base64, then `extra`. */
static const char *write_ranks(const char *name, const char *extra)
{
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t cap = 256 * 16 + strlen(extra) + 1;
    char *s = malloc(cap), *o = s;
    for (int b = 0; b < 256; b++) { o += sprintf(o, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b); }
    strcpy(o, extra);
    const char *p = write_tmp(name, s);
    free(s);
    return p;
}

static void test_malformed_tiktoken(void)
{
    static const struct {
        const char *extra;
        ie_status_t want;
    } cases[] = {
        {"", IE_OK},
        {"YWI= 256\n", IE_OK},         /* "ab" */
        {"YWI= 255\n", IE_ERR_FORMAT}, /* rank twice */
        {"YWI=\n", IE_ERR_FORMAT},     /* no rank */
        {"YWI= -3\n", IE_ERR_FORMAT},
        {"YWI= 99999999999\n", IE_ERR_FORMAT},
        {"YW= 256\n", IE_ERR_FORMAT},  /* base64 length */
        {"Y!I= 256\n", IE_ERR_FORMAT}, /* base64 alphabet */
        {"Y=I= 256\n", IE_ERR_FORMAT}, /* padding inside */
        {" 256\n", IE_ERR_FORMAT},
        {"YWI= 2x\n", IE_ERR_FORMAT},
    };
    ie_tokenizer_t *t = NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = write_ranks("t.tiktoken", cases[i].extra);
        ie_status_t st = ie_tokenizer_load(p, &t);
        if (st != cases[i].want) {
            fprintf(stderr, "\ntiktoken case %zu: got %d want %d (%s)\n", i, (int)st, (int)cases[i].want,
                    ie_error_last());
        }
        CU_ASSERT_EQUAL(st, cases[i].want);
        CU_ASSERT_EQUAL(st == IE_OK, t != NULL);
        if (t && i == 1) {
            /* the implied merge: "ab" is one token, "abc" two */
            int32_t *ids = NULL;
            size_t n = enc(t, "abc", 0, &ids);
            const int32_t exp[] = {256, 'c'};
            CU_ASSERT_TRUE(ids_eq(ids, n, exp, 2));
            free(ids);
        }
        ie_tokenizer_destroy(&t);
    }
    /* a byte missing */
    write_tmp("t.tiktoken", "YQ== 0\n");
    CU_ASSERT_EQUAL(ie_tokenizer_load_tiktoken(write_tmp("t.tiktoken", "YQ== 0\n"), NULL, &t), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_tokenizer_load_tiktoken(write_tmp("t.tiktoken", ""), NULL, &t), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_tokenizer_load_tiktoken(IE_TEST_DATA "/nope.tiktoken", NULL, &t), IE_ERR_IO);
    CU_ASSERT_EQUAL(ie_tokenizer_load_tiktoken(NULL, NULL, &t), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(t);

    /* special-token tables */
    static const struct {
        const char *json;
        ie_status_t want;
    } sp[] = {
        {"{\"special_tokens\": {\"<|x|>\": 256}}", IE_OK},
        {"{\"<|x|>\": 300}", IE_OK},
        {"{\"special_tokens\": {\"<|x|>\": 256}, \"n_vocab\": 1000}", IE_OK},
        {"{\"special_tokens\": {\"<|x|>\": 7}}", IE_ERR_FORMAT}, /* id of a byte */
        {"{\"special_tokens\": {\"<|x|>\": 256, \"<|y|>\": 256}}", IE_ERR_FORMAT},
        {"{\"special_tokens\": {\"<|x|>\": -1}}", IE_ERR_FORMAT},
        {"{\"special_tokens\": {\"<|x|>\": \"a\"}}", IE_ERR_FORMAT},
        {"{\"special_tokens\": {\"<|x|>\": 2.5}}", IE_ERR_FORMAT},
        {"{\"special_tokens\": {\"<|x|>\": 99999999}}", IE_ERR_FORMAT},
        {"{\"special_tokens\": {\"\": 256}}", IE_ERR_FORMAT},
        {"{\"special_tokens\": [1]}", IE_ERR_FORMAT},
        {"{\"special_tokens\": {}, \"n_vocab\": 10}", IE_ERR_FORMAT}, /* below the ranks */
        {"{\"special_tokens\": {}, \"pattern\": 5}", IE_ERR_FORMAT},
        {"{\"special_tokens\": {}, \"pattern\": \"(\"}", IE_ERR_UNSUPPORTED},
        {"{\"special_tokens\"", IE_ERR_FORMAT},
        {"[1]", IE_ERR_FORMAT},
    };
    char ranks[512];
    snprintf(ranks, sizeof ranks, "%s", write_ranks("t.tiktoken", ""));
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
        ie_status_t st = ie_tokenizer_load_tiktoken(ranks, write_tmp("sp.json", sp[i].json), &t);
        if (st != sp[i].want) {
            fprintf(stderr, "\nspecials case %zu: got %d want %d (%s)\n", i, (int)st, (int)sp[i].want,
                    ie_error_last());
        }
        CU_ASSERT_EQUAL(st, sp[i].want);
        if (t && i == 0) {
            int32_t *ids = NULL;
            size_t n = enc(t, "a<|x|>", IE_TOK_PARSE_SPECIAL, &ids);
            const int32_t exp[] = {'a', 256};
            CU_ASSERT_TRUE(ids_eq(ids, n, exp, 2));
            free(ids);
        }
        ie_tokenizer_destroy(&t);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/t.tiktoken", g_tmpdir);
    unlink(path);
    snprintf(path, sizeof path, "%s/sp.json", g_tmpdir);
    unlink(path);
}

/* Load time and encode speed of o200k on one Austen novel. */
static void test_tiktoken_speed(void)
{
    size_t len = 0;
    char *text = slurp(IE_TEST_DATA "/corpus/austen_1.txt", &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    double t0 = now_s();
    ie_tokenizer_t *t = load(O200K_TIKTOKEN);
    double t1 = now_s();
    int32_t *ids = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(ie_tokenizer_encode(t, text, len, 0, &ids, &n), IE_OK);
    double t2 = now_s();
    printf("\n    o200k: load %.3f s; %zu bytes -> %zu tokens in %.3f s ", t1 - t0, len, n, t2 - t1);
    CU_ASSERT(t2 - t1 < 5.0);
    char *back = detok_all(t, ids, n);
    CU_ASSERT_TRUE(strcmp(back, text) == 0);
    free(back);
    free(ids);
    ie_tokenizer_destroy(&t);
    free(text);
}

/* ---------------------------------------------------------------- main */

int main(void)
{
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/ie_test_tokenizer.XXXXXX");
    if (!mkdtemp(g_tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    if (CU_initialize_registry() != CUE_SUCCESS) { return 1; }
    CU_pSuite s = CU_add_suite("tokenizer", NULL, NULL);
    CU_add_test(s, "gpt-2 vectors (gguf)", test_vectors_gpt2);
    CU_add_test(s, "llama-spm vectors (gguf)", test_vectors_spm);
    CU_add_test(s, "deepseek-coder vectors (gguf)", test_vectors_deepseek_coder);
    CU_add_test(s, "fill-in-the-middle ids", test_fim_ids);
    CU_add_test(s, "falcon vectors (gguf)", test_vectors_falcon);
    CU_add_test(s, "mpt vectors (gguf)", test_vectors_mpt);
    CU_add_test(s, "refact vectors (gguf)", test_vectors_refact);
    CU_add_test(s, "pre-tokenizer references (gguf)", test_vectors_pretok_refs);
    CU_add_test(s, "llama2 tokenizer.json vs HF ids", test_vectors_llama2_json);
    CU_add_test(s, "smollm2 tokenizer.json vs HF ids", test_vectors_smollm2_json);
    CU_add_test(s, "smollm2 gguf vs HF ids", test_vectors_smollm2_gguf);
    CU_add_test(s, "streaming detok: SPM byte fallback", test_stream_spm_bytes);
    CU_add_test(s, "streaming detok: byte-level", test_stream_bytelevel);
    CU_add_test(s, "invalid UTF-8 rejected", test_invalid_utf8);
    CU_add_test(s, "special tokens: gpt-2", test_special_gpt2);
    CU_add_test(s, "special tokens: llama gguf", test_special_spm_gguf);
    CU_add_test(s, "special tokens: llama2 json", test_special_spm_json);
    CU_add_test(s, "smollm2 tokenizer.json", test_smollm2_json);
    CU_add_test(s, "malformed tokenizer.json", test_malformed_json);
    CU_add_test(s, "directory + tokenizer_config.json", test_dir_and_config);
    CU_add_test(s, "lower-case <0x0a> byte token (json)", test_lowercase_byte_token_json);
    CU_add_test(s, "malformed gguf", test_malformed_gguf);
    CU_add_test(s, "threads and speed", test_threads_and_speed);
    CU_add_test(s, "TestPlans o200k_base (tiktoken)", test_test_plans_o200k);
    CU_add_test(s, "tiktoken + harmony special tokens", test_tiktoken_specials);
    CU_add_test(s, "malformed tiktoken / special table", test_malformed_tiktoken);
    CU_add_test(s, "o200k load and encode speed", test_tiktoken_speed);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    char path[512];
    snprintf(path, sizeof path, "%s/t.json", g_tmpdir);
    unlink(path);
    rmdir(g_tmpdir);
    return fails ? 1 : 0;
}

/* api.c — include/clocher.h, the installed library's API, on top of the
 * internal engine (ie_engine.h), the tokenizer and the chat templates.
 *
 * The public ie_engine_t is the internal engine itself (ie_engine_destroy is
 * the engine's own). What the public API adds per engine — running totals
 * for ie_engine_get_metrics — lives in one malloc'd block that the engine
 * keeps for us (ie_engine_ext) and frees with itself.
 *
 * Every generation goes through ie_engine_generate_ids: the prompt is
 * tokenized here (or rendered and tokenized by ie_chat_encode), so the call
 * knows its prompt length even when the caller cancels it, which makes the
 * engine fail the call ("cancelled") and drop its result; the text is then
 * the streamed pieces, which add up to what the result would have held.
 */
#include "clocher.h"

#include "ie_chat.h"
#include "ie_clock.h"
#include "ie_engine.h"
#include "ie_proc.h"
#include "ie_status.h"
#include "ie_tokenizer.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define IE_API_VERSION "0.1.0"
/* Latency and TTFT samples kept for the percentiles: a uniform sample of
 * every value seen (reservoir sampling), so memory stays bounded over an
 * engine's whole life while the percentiles stay unbiased. */
#define IE_API_RESERVOIR 4096

const char *ie_version(void) { return IE_API_VERSION; }

void ie_free(void *p) { free(p); }

/* ------------------------------------------------------------------ params */

typedef struct ie_param {
    char *key, *value;
} ie_param_t;

struct ie_params {
    ie_param_t *kv;
    size_t n, cap;
};

ie_status_t ie_params_new(ie_params_t **out)
{
    if (!out) return ie_error_set(IE_ERR_INVAL, "ie_params_new: out is NULL");
    *out = calloc(1, sizeof **out);
    return *out ? IE_OK : ie_error_set(IE_ERR_NOMEM, "out of memory");
}

ie_status_t ie_params_set(ie_params_t *p, const char *key, const char *value)
{
    if (!p || !key || !value) return ie_error_set(IE_ERR_INVAL, "ie_params_set: NULL argument");
    char *v = strdup(value);
    if (!v) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    if (strcmp(key, "stop") != 0) /* "stop" adds; every other key replaces */
        for (size_t i = 0; i < p->n; i++)
            if (!strcmp(p->kv[i].key, key)) {
                free(p->kv[i].value);
                p->kv[i].value = v;
                return IE_OK;
            }
    char *k = strdup(key);
    if (!k) goto nomem;
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 8;
        ie_param_t *kv = realloc(p->kv, cap * sizeof *kv);
        if (!kv) goto nomem;
        p->kv = kv;
        p->cap = cap;
    }
    p->kv[p->n++] = (ie_param_t){k, v};
    return IE_OK;
nomem:
    free(k);
    free(v);
    return ie_error_set(IE_ERR_NOMEM, "out of memory");
}

void ie_params_destroy(ie_params_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_params_t *p = *self_p;
    for (size_t i = 0; i < p->n; i++) {
        free(p->kv[i].key);
        free(p->kv[i].value);
    }
    free(p->kv);
    free(p);
    *self_p = NULL;
}

/* Whole-string numbers only: "12x", "", " 4", "+4", "1e999" and NaN are bad
 * values (strto* would skip the space and take the sign). */
static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    if (!isdigit((unsigned char)*s) && !(*s == '-' && lo < 0)) return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (!isdigit((unsigned char)*s)) return -1; /* strtoull would wrap " -3" */
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static int parse_float(const char *s, float *out)
{
    char *end;
    if (isspace((unsigned char)*s)) return -1;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

static ie_status_t bad_value(const ie_param_t *kv)
{
    return ie_error_set(IE_ERR_INVAL, "bad value '%s' for option '%s'", kv->value, kv->key);
}


/* Engine options -> ie_engine_opts_t. Strings point into `p`. */
static ie_status_t engine_opts(const ie_params_t *p, ie_engine_opts_t *o)
{
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    o->n_threads = nproc > 0 ? (int)nproc : 1;
    for (size_t i = 0; p && i < p->n; i++) {
        const ie_param_t *kv = &p->kv[i];
        const char *k = kv->key, *v = kv->value;
        long n = 0;
        int bad = 0;
        if (!strcmp(k, "threads")) bad = parse_long(v, 1, 4096, &n), o->n_threads = (int)n;
        else if (!strcmp(k, "pin")) bad = parse_long(v, 0, 1, &n), o->pin_threads = (int)n;
        else if (!strcmp(k, "ctx")) bad = parse_long(v, 1, 1 << 24, &n), o->n_ctx = (int)n;
        else if (!strcmp(k, "seqs")) bad = parse_long(v, 1, 4096, &n), o->n_seq = (int)n;
        else if (!strcmp(k, "max_batch")) bad = parse_long(v, 1, 1 << 20, &n), o->max_batch = (int)n;
        else if (!strcmp(k, "kv_block")) bad = parse_long(v, 1, 1 << 20, &n), o->kv_block = (int)n;
        else if (!strcmp(k, "kv_blocks")) bad = parse_long(v, 1, 1 << 30, &n), o->kv_blocks = (int)n;
        else if (!strcmp(k, "cache_type_k")) bad = ie_kv_type_parse(v, &o->kv_type_k) != IE_OK;
        else if (!strcmp(k, "cache_type_v")) bad = ie_kv_type_parse(v, &o->kv_type_v) != IE_OK;
        else if (!strcmp(k, "kv_rotate")) bad = ie_kv_rotate_parse(v, &o->kv_rotate) != IE_OK;
        else if (!strcmp(k, "prefix_cache")) bad = parse_long(v, 0, 1, &n), o->prefix_cache = (int)n;
        else if (!strcmp(k, "kv_swa_full")) bad = parse_long(v, 0, 1, &n), o->kv_swa_full = (int)n;
        else if (!strcmp(k, "precision")) bad = ie_precision_parse(v, &o->precision) != IE_OK;
        else if (!strcmp(k, "plan")) bad = ie_engine_opts_plan(o, v) != IE_OK;
        else if (!strcmp(k, "tokenizer")) o->tokenizer_path = v;
        else return ie_error_set(IE_ERR_INVAL, "unknown engine option '%s'", k);
        if (bad) return bad_value(kv);
    }
    return IE_OK;
}

/* Generation options -> ie_gen_params_t; the stop strings point into `p`,
 * the arrays of stop strings and logit biases are one block (*own,
 * malloc'd, the caller's to free). */
static ie_status_t gen_params(const ie_params_t *p, ie_gen_params_t *g, void **own)
{
    ie_gen_params_default(g);
    *own = NULL;
    size_t n_stop = 0, n_bias = 0;
    for (size_t i = 0; p && i < p->n; i++) {
        n_stop += !strcmp(p->kv[i].key, "stop");
        n_bias += !strcmp(p->kv[i].key, "logit_bias");
    }
    /* the pointers first: the bias entries need no stricter alignment */
    if ((n_stop || n_bias) && !(*own = malloc(n_stop * sizeof(char *) + n_bias * sizeof(ie_logit_bias_t))))
        return ie_error_set(IE_ERR_NOMEM, "out of memory");
    const char **stops = *own;
    ie_logit_bias_t *bias = n_bias ? (ie_logit_bias_t *)((char *)*own + n_stop * sizeof(char *)) : NULL;
    ie_sampler_params_t *s = &g->sampling;
    for (size_t i = 0; p && i < p->n; i++) {
        const ie_param_t *kv = &p->kv[i];
        const char *k = kv->key, *v = kv->value;
        long n = 0;
        int bad = 0;
        if (!strcmp(k, "max_tokens")) bad = parse_long(v, 0, 1L << 30, &n), g->max_new = (int)n;
        else if (!strcmp(k, "temperature")) bad = parse_float(v, &s->temperature);
        else if (!strcmp(k, "top_k")) bad = parse_long(v, 0, 1L << 30, &n), s->top_k = (int32_t)n;
        else if (!strcmp(k, "top_p")) bad = parse_float(v, &s->top_p);
        else if (!strcmp(k, "min_p")) bad = parse_float(v, &s->min_p);
        else if (!strcmp(k, "repeat_penalty")) bad = parse_float(v, &s->repeat_penalty);
        else if (!strcmp(k, "repeat_last_n")) bad = parse_long(v, 0, 1L << 20, &n), s->repeat_last_n = (int32_t)n;
        else if (!strcmp(k, "frequency_penalty")) bad = parse_float(v, &s->frequency_penalty);
        else if (!strcmp(k, "presence_penalty")) bad = parse_float(v, &s->presence_penalty);
        else if (!strcmp(k, "seed")) bad = parse_u64(v, &s->seed);
        else if (!strcmp(k, "add_special")) bad = parse_long(v, 0, 1, &n), g->add_special = (int)n;
        else if (!strcmp(k, "parse_special")) bad = parse_long(v, 0, 1, &n), g->parse_special = (int)n;
        else if (!strcmp(k, "min_tokens")) bad = parse_long(v, 0, 1L << 30, &n), g->min_new = (int)n;
        else if (!strcmp(k, "ignore_eos")) bad = parse_long(v, 0, 1, &n), g->ignore_eos = (int)n;
        else if (!strcmp(k, "logit_bias")) bad = ie_logit_bias_parse(v, &bias[s->n_logit_bias++]) != IE_OK;
        else if (!strcmp(k, "stop")) {
            bad = !*v; /* an empty stop string would end every generation at once */
            stops[g->n_stop++] = v;
        } else return ie_error_set(IE_ERR_INVAL, "unknown generation option '%s'", k);
        if (bad) return bad_value(kv);
    }
    g->stop = stops;
    s->logit_bias = n_bias ? bias : NULL;
    /* the sampler's own ranges (top_p in (0, 1], ...), named by it */
    return ie_sampler_params_validate(s);
}

/* ------------------------------------------------------------------ engine */

/* What the public API keeps per engine (ie_engine_ext): running totals. */
typedef struct api_stats {
    uint64_t requests, tokens_in, tokens_out, kv_hits, kv_misses;
    double prefill_ms, decode_ms, gen_ms;
    uint64_t prefill_tokens, decode_tokens;
    uint64_t n_lat_seen, n_ttft_seen, rng;
    size_t n_lat, n_ttft;
    double lat[IE_API_RESERVOIR], ttft[IE_API_RESERVOIR];
} api_stats_t;

static uint64_t next_rand(uint64_t *s) /* xorshift64: deterministic, cheap */
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Algorithm R: the k-th value seen replaces a random slot with probability
 * cap / k, which keeps every value seen equally likely to be in the sample. */
static void reservoir_add(double *buf, size_t *n, uint64_t *seen, uint64_t *rng, double v)
{
    (*seen)++;
    if (*n < IE_API_RESERVOIR) {
        buf[(*n)++] = v;
        return;
    }
    uint64_t j = next_rand(rng) % *seen;
    if (j < IE_API_RESERVOIR) buf[j] = v;
}

ie_status_t ie_engine_create(const char *model_path, const ie_params_t *opts, ie_engine_t **out)
{
    ie_status_t st = IE_OK;
    ie_engine_t *e = NULL;
    ie_engine_opts_t o;
    if (out) *out = NULL;
    if (!model_path || !out) return ie_error_set(IE_ERR_INVAL, "ie_engine_create: NULL argument");
    ie_engine_opts_default(&o);
    o.model_path = model_path;
    o.keep_sched = 1; /* one call after another (a chat) reuses the prefix cache */
    if ((st = engine_opts(opts, &o)) != IE_OK) return st;
    if ((st = ie_engine_open(&o, &e)) != IE_OK) return st;
    api_stats_t *as = calloc(1, sizeof *as);
    if (!as) {
        ie_engine_destroy(&e);
        return ie_error_set(IE_ERR_NOMEM, "out of memory");
    }
    as->rng = 0x9e3779b97f4a7c15ull;
    *ie_engine_ext(e) = as;
    *out = e;
    return IE_OK;
}

size_t ie_engine_n_vocab(const ie_engine_t *e) { return e ? (size_t)ie_engine_hparams(e)->n_vocab : 0; }

/* One generation in flight: the caller's callback and what streaming saw. */
typedef struct gen_run {
    ie_token_fn on_token;
    void *user;
    volatile int cancel; /* the caller asked to stop                  */
    char *text;          /* the pieces so far (for a cancelled call)  */
    size_t len, cap;
    int nomem;
    size_t n_gen;
    double t0, t_last, ttft_ms;
    api_stats_t *as;
} gen_run_t;

static void on_piece(void *ctx, size_t index, int32_t id, const char *text, size_t len)
{
    gen_run_t *r = ctx;
    double now = ie_now_ms();
    (void)index;
    if (r->cancel) return; /* the step that was running when it was asked */
    if (r->n_gen == 0) r->ttft_ms = now - r->t0;
    else if (r->as) reservoir_add(r->as->lat, &r->as->n_lat, &r->as->n_lat_seen, &r->as->rng, now - r->t_last);
    r->t_last = now;
    r->n_gen++;
    if (r->len + len + 1 > r->cap) {
        size_t cap = 2 * (r->len + len + 1) + 64;
        char *t = realloc(r->text, cap);
        if (!t) {
            r->nomem = 1;
            r->cancel = 1;
            return;
        }
        r->text = t;
        r->cap = cap;
    }
    memcpy(r->text + r->len, text, len);
    r->len += len;
    r->text[r->len] = '\0';
    if (r->on_token && r->on_token(r->user, id, text, len) != 0) r->cancel = 1;
}

/* Generate from prompt ids with the parsed options g (the outputs are
 * already cleared; t0 is the call's start). */
static ie_status_t generate_ids(ie_engine_t *e, const int32_t *ids, size_t n_ids, ie_gen_params_t g,
                                ie_token_fn on_token, void *user, double t0, char **text_out,
                                ie_gen_info_t *info_out)
{
    ie_status_t st = IE_OK;
    ie_gen_result_t res = {0};
    ie_gen_stats_t stats = {0};
    gen_run_t run = {.on_token = on_token, .user = user, .t0 = t0, .as = *ie_engine_ext(e)};

    g.on_token = on_piece;
    g.on_token_ctx = &run;
    g.cancel = &run.cancel;
    st = ie_engine_generate_ids(e, &ids, &n_ids, 1, &g, &res, &stats);
    if (run.nomem) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    /* a cancelled call (the engine fails it with IE_ERR_INVAL "cancelled")
     * succeeds with what it streamed; any other failure stays one */
    if (st != IE_OK && !(run.cancel && st == IE_ERR_INVAL)) goto cleanup;
    st = IE_OK;
    double total_ms = ie_now_ms() - t0;
    const char *text = run.cancel ? (run.text ? run.text : "") : res.text;
    size_t n_gen = run.cancel ? run.n_gen : res.n_gen;
    if (text_out && !(*text_out = strdup(text))) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    if (info_out)
        *info_out = (ie_gen_info_t){.n_prompt = n_ids,
                                    .n_gen = n_gen,
                                    .finish = run.cancel ? "cancelled" : ie_finish_name(res.stop),
                                    .ttft_ms = run.n_gen ? run.ttft_ms : 0,
                                    .total_ms = total_ms};
    api_stats_t *as = run.as;
    if (as) {
        as->requests++;
        as->tokens_in += n_ids;
        as->tokens_out += n_gen;
        as->kv_hits += stats.prefix_hit_tokens;
        as->kv_misses += stats.prefix_miss_tokens;
        as->prefill_ms += stats.prefill_ms;
        as->decode_ms += stats.decode_ms;
        as->prefill_tokens += stats.prefill_tokens;
        as->decode_tokens += stats.decode_tokens;
        as->gen_ms += total_ms;
        if (run.n_gen) reservoir_add(as->ttft, &as->n_ttft, &as->n_ttft_seen, &as->rng, run.ttft_ms);
    }

cleanup:
    if (st != IE_OK && text_out) *text_out = NULL;
    if (st != IE_OK && info_out) memset(info_out, 0, sizeof *info_out);
    ie_gen_result_clear(&res);
    free(run.text);
    return st;
}

/* Reset the outputs so that every failure leaves them NULL / zero. */
static void clear_outputs(char **text_out, ie_gen_info_t *info_out)
{
    if (text_out) *text_out = NULL;
    if (info_out) memset(info_out, 0, sizeof *info_out);
}

ie_status_t ie_engine_generate(ie_engine_t *e, const char *prompt, const ie_params_t *gen, ie_token_fn on_token,
                               void *user, char **text_out, ie_gen_info_t *info_out)
{
    double t0 = ie_now_ms();
    ie_status_t st = IE_OK;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    ie_gen_params_t g;
    void *own = NULL; /* gen_params' arrays */

    clear_outputs(text_out, info_out);
    if (!e || !prompt) return ie_error_set(IE_ERR_INVAL, "ie_engine_generate: NULL argument");
    if (!ie_engine_tokenizer(e)) return ie_error_set(IE_ERR_INVAL, "the engine has no tokenizer");
    /* the options first: a bad key fails before any work */
    if ((st = gen_params(gen, &g, &own)) != IE_OK) goto cleanup;
    int flags = (g.add_special ? IE_TOK_ADD_SPECIAL : 0) | (g.parse_special ? IE_TOK_PARSE_SPECIAL : 0);
    if ((st = ie_tokenizer_encode(ie_engine_tokenizer(e), prompt, strlen(prompt), flags, &ids, &n_ids)) != IE_OK)
        goto cleanup;
    st = generate_ids(e, ids, n_ids, g, on_token, user, t0, text_out, info_out);

cleanup:
    free(own);
    free(ids);
    return st;
}

ie_status_t ie_engine_chat(ie_engine_t *e, const char *const *roles, const char *const *contents, size_t n,
                           const ie_params_t *gen, ie_token_fn on_token, void *user, char **text_out,
                           ie_gen_info_t *info_out)
{
    double t0 = ie_now_ms();
    ie_status_t st = IE_OK;
    cJSON *arr = NULL;
    char *json = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    ie_gen_params_t g;
    void *own = NULL; /* gen_params' arrays */

    clear_outputs(text_out, info_out);
    if (!e || (n && (!roles || !contents))) return ie_error_set(IE_ERR_INVAL, "ie_engine_chat: NULL argument");
    const ie_tokenizer_t *tok = ie_engine_tokenizer(e);
    if (!tok) return ie_error_set(IE_ERR_INVAL, "the engine has no tokenizer");
    ie_chat_opts_t co = {0};
    ie_engine_chat_opts(e, &co);
    if (ie_chat_format_for(tok, &co) == IE_CHAT_NONE)
        return ie_error_set(IE_ERR_UNSUPPORTED, "the model has no chat template clocher can render");
    if ((st = gen_params(gen, &g, &own)) != IE_OK) goto cleanup;
    /* the conversation as ie_chat_encode takes it (the CLI's --chat JSON) */
    if (!(arr = cJSON_CreateArray())) goto nomem;
    for (size_t i = 0; i < n; i++) {
        if (!roles[i] || !contents[i]) {
            st = ie_error_set(IE_ERR_INVAL, "message %zu: NULL role or content", i + 1);
            goto cleanup;
        }
        cJSON *m = cJSON_CreateObject();
        if (!m || !cJSON_AddItemToArray(arr, m)) {
            cJSON_Delete(m);
            goto nomem;
        }
        if (!cJSON_AddStringToObject(m, "role", roles[i]) || !cJSON_AddStringToObject(m, "content", contents[i]))
            goto nomem;
    }
    if (!(json = cJSON_PrintUnformatted(arr))) goto nomem;
    if ((st = ie_chat_encode(tok, json, &co, &ids, &n_ids, NULL)) != IE_OK) goto cleanup;
    st = generate_ids(e, ids, n_ids, g, on_token, user, t0, text_out, info_out);
    goto cleanup;

nomem:
    st = ie_error_set(IE_ERR_NOMEM, "out of memory");
cleanup:
    cJSON_Delete(arr);
    free(json);
    free(ids);
    free(own);
    return st;
}

ie_status_t ie_engine_tokenize(ie_engine_t *e, const char *text, int add_special, int32_t **ids_out, size_t *n_out)
{
    if (ids_out) *ids_out = NULL;
    if (n_out) *n_out = 0;
    if (!e || !text || !ids_out || !n_out) return ie_error_set(IE_ERR_INVAL, "ie_engine_tokenize: NULL argument");
    if (!ie_engine_tokenizer(e)) return ie_error_set(IE_ERR_INVAL, "the engine has no tokenizer");
    int flags = (add_special ? IE_TOK_ADD_SPECIAL : 0) | IE_TOK_PARSE_SPECIAL;
    return ie_tokenizer_encode(ie_engine_tokenizer(e), text, strlen(text), flags, ids_out, n_out);
}

ie_status_t ie_engine_detokenize(ie_engine_t *e, const int32_t *ids, size_t n, char **text_out)
{
    ie_status_t st = IE_OK;
    ie_detok_t *d = NULL;
    char *buf = NULL;
    size_t len = 0, cap = 64;

    if (text_out) *text_out = NULL;
    if (!e || (n && !ids) || !text_out) return ie_error_set(IE_ERR_INVAL, "ie_engine_detokenize: NULL argument");
    const ie_tokenizer_t *tok = ie_engine_tokenizer(e);
    if (!tok) return ie_error_set(IE_ERR_INVAL, "the engine has no tokenizer");
    int32_t nv = ie_tokenizer_n_vocab(tok);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv)
            return ie_error_set(IE_ERR_RANGE, "token %zu: id %d out of range (vocabulary %d)", i, (int)ids[i],
                                (int)nv);
    if ((st = ie_detok_new(tok, &d)) != IE_OK) goto cleanup;
    ie_detok_set_special(d, 1);
    if (!(buf = malloc(cap))) goto nomem;
    for (size_t i = 0; i <= n; i++) { /* i == n: the flush */
        const char *piece = i < n ? ie_detok_push(d, ids[i]) : ie_detok_flush(d);
        size_t pl = ie_detok_last_len(d);
        if (len + pl + 1 > cap) {
            cap = 2 * (len + pl + 1);
            char *t = realloc(buf, cap);
            if (!t) goto nomem;
            buf = t;
        }
        memcpy(buf + len, piece, pl);
        len += pl;
    }
    buf[len] = '\0';
    *text_out = buf;
    buf = NULL;
    goto cleanup;

nomem:
    st = ie_error_set(IE_ERR_NOMEM, "out of memory");
cleanup:
    free(buf);
    ie_detok_destroy(&d);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (nearest rank) of v[0..n), sorted in place; 0 if n is 0. */
static double quantile(double *v, size_t n, double q)
{
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t k = (size_t)ceil(q * (double)n);
    return v[k ? k - 1 : 0];
}

ie_status_t ie_engine_get_metrics(const ie_engine_t *e, ie_engine_metrics_t *out)
{
    if (out) memset(out, 0, sizeof *out);
    if (!e || !out) return ie_error_set(IE_ERR_INVAL, "ie_engine_get_metrics: NULL argument");
    const api_stats_t *as = *ie_engine_ext(e);
    out->rss_peak_mb = ie_rss_peak_mb();
    if (!as) return IE_OK; /* an engine not made by ie_engine_create: no totals */
    double *tmp = malloc((as->n_lat + as->n_ttft + 1) * sizeof *tmp);
    if (!tmp) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    out->requests = as->requests;
    out->tokens_in = as->tokens_in;
    out->tokens_out = as->tokens_out;
    out->kv_hits = as->kv_hits;
    out->kv_misses = as->kv_misses;
    out->prefill_tps = as->prefill_ms > 0 ? (double)as->prefill_tokens / (as->prefill_ms / 1e3) : 0;
    out->decode_tps = as->decode_ms > 0 ? (double)as->decode_tokens / (as->decode_ms / 1e3) : 0;
    out->tps = as->gen_ms > 0 ? (double)as->tokens_out / (as->gen_ms / 1e3) : 0;
    memcpy(tmp, as->lat, as->n_lat * sizeof *tmp); /* sorted copies: the engine is const here */
    out->latency_p50_ms = quantile(tmp, as->n_lat, 0.50);
    out->latency_p95_ms = quantile(tmp, as->n_lat, 0.95);
    memcpy(tmp, as->ttft, as->n_ttft * sizeof *tmp);
    out->ttft_p50_ms = quantile(tmp, as->n_ttft, 0.50);
    free(tmp);
    return IE_OK;
}

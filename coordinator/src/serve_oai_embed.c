/* serve_oai_embed.c — /v1/embeddings: the request parser, normalization,
 * base64, and the collector of a batch's answers (ie_embd.h). */
#include "ie_embd.h"

#include "ie_clock.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------- parsing */

static ie_status_t fail(ie_embd_err_t *err, unsigned status, const char *code, const char *param, ie_status_t st,
                        const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static ie_status_t fail(ie_embd_err_t *err, unsigned status, const char *code, const char *param, ie_status_t st,
                        const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    err->status = status;
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    return ie_error_set(st, "%s", msg);
}

/* 1 when a JSON text has a NUL character in it or escaped in a string
 * (cJSON would end the C string there: the input cut short). */
static int has_nul(const char *s, size_t n)
{
    if (memchr(s, 0, n)) return 1;
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '\\') continue;
        if (s[i + 1] == 'u' && i + 5 < n && !memcmp(s + i + 2, "0000", 4)) return 1;
        i++;
    }
    return 0;
}

/* A JSON array of token ids -> r's input k (malloc'd). */
static ie_status_t ids_of(const cJSON *arr, int32_t n_vocab, int n_ctx, ie_embd_req_t *r, size_t k,
                          ie_embd_err_t *err)
{
    const int n = cJSON_GetArraySize(arr);
    if (n == 0) return fail(err, 400, "invalid_value", "input", IE_ERR_INVAL, "'input': %s", "an input is empty");
    if (n > n_ctx) {
        char why[96];
        snprintf(why, sizeof why, "an input has %d tokens; the context holds %d", n, n_ctx);
        return fail(err, 400, "context_length_exceeded", "input", IE_ERR_RANGE, "'input': %s", why);
    }
    if (!(r->ids[k] = malloc((size_t)n * sizeof **r->ids)))
        return fail(err, 500, "internal", NULL, IE_ERR_NOMEM, "%s", "out of memory");
    const cJSON *it;
    size_t i = 0;
    cJSON_ArrayForEach(it, arr)
    {
        const double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!cJSON_IsNumber(it) || v != floor(v) || v < 0 || v >= n_vocab) {
            char why[96];
            snprintf(why, sizeof why, "token ids must be integers in [0, %d)", (int)n_vocab);
            return fail(err, 400, "invalid_value", "input", IE_ERR_INVAL, "'input': %s", why);
        }
        r->ids[k][i++] = (int32_t)v;
    }
    r->n_ids[k] = i;
    return IE_OK;
}

/* A string -> r's input k through the tokenizer. */
static ie_status_t ids_of_text(const char *s, const ie_tokenizer_t *tok, int n_ctx, ie_embd_req_t *r, size_t k,
                               ie_embd_err_t *err)
{
    if (!*s) return fail(err, 400, "invalid_value", "input", IE_ERR_INVAL, "'input': %s", "an input is empty");
    ie_status_t st = ie_tokenizer_encode(tok, s, strlen(s), IE_TOK_ADD_SPECIAL | IE_TOK_PARSE_SPECIAL, &r->ids[k],
                                         &r->n_ids[k]);
    if (st == IE_ERR_NOMEM) return fail(err, 500, "internal", NULL, st, "%s", "out of memory");
    if (st != IE_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", ie_error_last());
        return fail(err, 400, "invalid_value", "input", IE_ERR_INVAL, "'input': %s", why);
    }
    if (r->n_ids[k] == 0)
        return fail(err, 400, "invalid_value", "input", IE_ERR_INVAL, "'input': %s", "an input has no tokens");
    if (r->n_ids[k] > (size_t)n_ctx) {
        char why[96];
        snprintf(why, sizeof why, "an input has %zu tokens; the context holds %d", r->n_ids[k], n_ctx);
        return fail(err, 400, "context_length_exceeded", "input", IE_ERR_RANGE, "'input': %s", why);
    }
    return IE_OK;
}

/* The inputs: a string, [strings], [ids] or [[ids]] (one kind per array). */
static ie_status_t parse_input(const cJSON *in, const ie_tokenizer_t *tok, int32_t n_vocab, int n_ctx,
                               ie_embd_req_t *r, ie_embd_err_t *err)
{
    static const char *kinds = "'input' must be a string, an array of strings, an array of token ids or an array "
                               "of arrays of token ids";
    const int strings = cJSON_IsString(in);
    if (!strings && !cJSON_IsArray(in)) return fail(err, 400, "invalid_value", "input", IE_ERR_INVAL, "%s", kinds);
    const int n = strings ? 1 : cJSON_GetArraySize(in);
    if (n == 0) return fail(err, 400, "invalid_value", "input", IE_ERR_INVAL, "%s", "'input' is empty");
    const cJSON *first = strings ? in : cJSON_GetArrayItem(in, 0);
    /* an array of numbers is one input; otherwise each element is one */
    const int one = strings || cJSON_IsNumber(first);
    const size_t n_in = one ? 1 : (size_t)n;
    if (n_in > IE_EMBD_MAX_INPUTS) {
        char why[96];
        snprintf(why, sizeof why, "%zu inputs; at most %d are accepted", n_in, IE_EMBD_MAX_INPUTS);
        return fail(err, 400, "invalid_value", "input", IE_ERR_INVAL, "'input': %s", why);
    }
    if (!(r->ids = calloc(n_in, sizeof *r->ids)) || !(r->n_ids = calloc(n_in, sizeof *r->n_ids)))
        return fail(err, 500, "internal", NULL, IE_ERR_NOMEM, "%s", "out of memory");
    r->n_in = n_in;
    if (strings) return ids_of_text(in->valuestring, tok, n_ctx, r, 0, err);
    if (one) return ids_of(in, n_vocab, n_ctx, r, 0, err);
    size_t k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, in)
    {
        ie_status_t st;
        if (cJSON_IsString(first) && cJSON_IsString(it)) st = ids_of_text(it->valuestring, tok, n_ctx, r, k, err);
        else if (cJSON_IsArray(first) && cJSON_IsArray(it)) st = ids_of(it, n_vocab, n_ctx, r, k, err);
        else st = fail(err, 400, "invalid_value", "input", IE_ERR_INVAL, "%s", kinds);
        if (st != IE_OK) return st;
        k++;
    }
    return IE_OK;
}

ie_status_t ie_embd_parse(const char *body, size_t len, const ie_tokenizer_t *tok, int32_t n_vocab, int n_ctx,
                          ie_embd_req_t *out, ie_embd_err_t *err)
{
    ie_status_t st = IE_OK;
    cJSON *root = NULL;
    ie_embd_req_t r = {0};
    memset(out, 0, sizeof *out);
    if (!body) body = "";
    /* JSON is UTF-8 (RFC 8259); a NUL would cut a string short unseen */
    if (ie_tokenizer_check_utf8(body, len) != IE_OK) {
        char why[128];
        snprintf(why, sizeof why, "%s", ie_error_last());
        st = fail(err, 400, "invalid_json", NULL, IE_ERR_INVAL, "the body is not valid UTF-8 (%s)", why);
        goto cleanup;
    }
    if (has_nul(body, len)) {
        st = fail(err, 400, "invalid_value", NULL, IE_ERR_INVAL, "%s",
                  "a string in the body contains a NUL character (\\u0000), which is not accepted");
        goto cleanup;
    }
    if (!(root = cJSON_ParseWithLength(body, len)) || !cJSON_IsObject(root)) {
        st = fail(err, 400, "invalid_json", NULL, IE_ERR_INVAL, "%s", "the body must be a JSON object");
        goto cleanup;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model)) {
        st = fail(err, 400, "invalid_value", "model", IE_ERR_INVAL, "%s", "'model' must be a string");
        goto cleanup;
    }
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(root, "dimensions");
    if (dims && !cJSON_IsNull(dims)) {
        st = fail(err, 400, "invalid_value", "dimensions", IE_ERR_INVAL, "%s",
                  "'dimensions' is not supported: the embeddings have the model's own width");
        goto cleanup;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "encoding_format");
    if (fmt && !cJSON_IsNull(fmt)) {
        if (cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "base64")) {
            r.base64 = 1;
        } else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "float")) {
            st = fail(err, 400, "invalid_value", "encoding_format", IE_ERR_INVAL, "%s",
                      "'encoding_format' must be \"float\" or \"base64\"");
            goto cleanup;
        }
    }
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(root, "input");
    if (!in) {
        st = fail(err, 400, "invalid_value", "input", IE_ERR_INVAL, "%s", "'input' is required");
        goto cleanup;
    }
    if ((st = parse_input(in, tok, n_vocab, n_ctx, &r, err)) != IE_OK) goto cleanup;
    if (cJSON_IsString(model) && !(r.model = strdup(model->valuestring))) {
        st = fail(err, 500, "internal", NULL, IE_ERR_NOMEM, "%s", "out of memory");
        goto cleanup;
    }
    *out = r;
    memset(&r, 0, sizeof r);
cleanup:
    ie_embd_req_free(&r);
    cJSON_Delete(root);
    return st;
}

void ie_embd_req_free(ie_embd_req_t *r)
{
    if (!r) return;
    for (size_t i = 0; r->ids && i < r->n_in; i++) free(r->ids[i]);
    free(r->ids);
    free(r->n_ids);
    free(r->model);
    memset(r, 0, sizeof *r);
}

ie_pooling_t ie_pooling_parse(const char *s)
{
    if (!s) return IE_POOL_NONE;
    if (!strcmp(s, "mean")) return IE_POOL_MEAN;
    if (!strcmp(s, "last")) return IE_POOL_LAST;
    if (!strcmp(s, "cls")) return IE_POOL_CLS;
    return IE_POOL_NONE;
}

const char *ie_pooling_name(ie_pooling_t p)
{
    return p == IE_POOL_MEAN ? "mean" : p == IE_POOL_LAST ? "last" : p == IE_POOL_CLS ? "cls" : "none";
}

void ie_embd_normalize(float *v, int n, int norm)
{
    if (norm != IE_EMBD_NORM_L2) return;
    double ss = 0; /* in double: a long vector's sum of squares stays exact enough */
    for (int i = 0; i < n; i++) ss += (double)v[i] * v[i];
    if (ss <= 0) return;
    const double inv = 1.0 / sqrt(ss);
    for (int i = 0; i < n; i++) v[i] = (float)(v[i] * inv);
}

char *ie_embd_base64(const float *v, int n)
{
    static const char k[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const size_t nb = (size_t)n * 4;
    char *out = malloc((nb + 2) / 3 * 4 + 1);
    unsigned char *b = malloc(nb ? nb : 1);
    if (!out || !b) {
        free(out);
        free(b);
        return NULL;
    }
    for (int i = 0; i < n; i++) { /* little-endian bytes whatever the host */
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int j = 0; j < 4; j++) b[(size_t)i * 4 + j] = (unsigned char)(u >> (8 * j));
    }
    size_t o = 0;
    for (size_t i = 0; i < nb; i += 3) {
        const uint32_t t = (uint32_t)b[i] << 16 | (i + 1 < nb ? (uint32_t)b[i + 1] << 8 : 0) |
                           (i + 2 < nb ? (uint32_t)b[i + 2] : 0);
        out[o++] = k[t >> 18 & 63];
        out[o++] = k[t >> 12 & 63];
        out[o++] = i + 1 < nb ? k[t >> 6 & 63] : '=';
        out[o++] = i + 2 < nb ? k[t & 63] : '=';
    }
    out[o] = '\0';
    free(b);
    return out;
}

/* ------------------------------------------------------------ collector */

typedef struct slot {
    ie_embd_wait_t *w;
    size_t i;
} slot_t;

struct ie_embd_wait {
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t n, n_ended; /* n_ended under mu */
    int dim;
    slot_t *slots;
    float *vec;      /* [n][dim] */
    int *have;       /* [n] 1 once input i's vector is in */
    size_t *tokens;  /* [n] prompt tokens */
    ie_status_t err; /* the first error (under mu) */
    char code[32];
    char message[256];
    ie_lora_cache_t *lc;   /* the adapter set held (lease.set -1: none) */
    ie_lora_lease_t lease; /* given back with the last reference        */
};

ie_status_t ie_embd_wait_new(size_t n, int dim, ie_embd_wait_t **out)
{
    *out = NULL;
    ie_embd_wait_t *w = calloc(1, sizeof *w);
    if (!w) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    w->slots = calloc(n ? n : 1, sizeof *w->slots);
    w->vec = calloc((n ? n : 1) * (size_t)dim, sizeof *w->vec);
    w->have = calloc(n ? n : 1, sizeof *w->have);
    w->tokens = calloc(n ? n : 1, sizeof *w->tokens);
    if (!w->slots || !w->vec || !w->have || !w->tokens) {
        free(w->slots);
        free(w->vec);
        free(w->have);
        free(w->tokens);
        free(w);
        return ie_error_set(IE_ERR_NOMEM, "out of memory");
    }
    pthread_condattr_t ca; /* monotonic: a wall-clock jump cannot stretch a wait */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&w->refs, 1);
    w->n = n;
    w->dim = dim;
    w->lease = (ie_lora_lease_t){-1, 0, -1};
    for (size_t i = 0; i < n; i++) w->slots[i] = (slot_t){w, i};
    *out = w;
    return IE_OK;
}

void ie_embd_wait_ref(ie_embd_wait_t *w) { atomic_fetch_add(&w->refs, 1); }

void ie_embd_wait_hold(ie_embd_wait_t *w, ie_lora_cache_t *lc, ie_lora_lease_t lease)
{
    w->lc = lc;
    w->lease = lease;
}

void ie_embd_wait_unref(ie_embd_wait_t *w)
{
    if (!w || atomic_fetch_sub(&w->refs, 1) != 1) return;
    ie_lora_cache_release(w->lc, &w->lease, 0);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->slots);
    free(w->vec);
    free(w->have);
    free(w->tokens);
    free(w);
}

void *ie_embd_wait_slot(ie_embd_wait_t *w, size_t i) { return &w->slots[i]; }

void ie_embd_wait_on_event(void *ctx, const ie_sched_event_t *ev)
{
    if (ev->kind == IE_SCHED_TOKEN) return; /* none come for an embedding */
    slot_t *sl = ctx;
    ie_embd_wait_t *w = sl->w;
    pthread_mutex_lock(&w->mu);
    if (ev->kind == IE_SCHED_DONE && ev->embd && ev->n_embd == w->dim) {
        memcpy(w->vec + sl->i * (size_t)w->dim, ev->embd, (size_t)w->dim * sizeof *w->vec);
        w->have[sl->i] = 1;
        w->tokens[sl->i] = ev->n_prompt;
    } else if (w->err == IE_OK) {
        w->err = ev->kind == IE_SCHED_DONE ? IE_ERR_INTERNAL : ev->status != IE_OK ? ev->status : IE_ERR_INTERNAL;
        snprintf(w->code, sizeof w->code, "%s", ev->code ? ev->code : "internal");
        snprintf(w->message, sizeof w->message, "%s",
                 ev->message ? ev->message : "the embedding came back without a vector");
    }
    w->n_ended++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    ie_embd_wait_unref(w);
}

int ie_embd_wait_poll(ie_embd_wait_t *w, int timeout_ms, size_t *n_ended)
{
    pthread_mutex_lock(&w->mu);
    if (w->n_ended <= *n_ended && w->err == IE_OK) {
        const struct timespec ts = ie_deadline_ms(timeout_ms);
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    *n_ended = w->n_ended;
    const int failed = w->err != IE_OK;
    pthread_mutex_unlock(&w->mu);
    return failed;
}

ie_status_t ie_embd_wait_error(ie_embd_wait_t *w, const char **code, const char **message)
{
    pthread_mutex_lock(&w->mu);
    ie_status_t st = w->err;
    pthread_mutex_unlock(&w->mu);
    *code = w->code; /* written once, before err was set */
    *message = w->message;
    return st;
}

float *ie_embd_wait_vec(ie_embd_wait_t *w, size_t i)
{
    pthread_mutex_lock(&w->mu);
    const int have = w->have[i];
    pthread_mutex_unlock(&w->mu);
    return have ? w->vec + i * (size_t)w->dim : NULL;
}

size_t ie_embd_wait_tokens(const ie_embd_wait_t *w, size_t i) { return w->tokens[i]; }

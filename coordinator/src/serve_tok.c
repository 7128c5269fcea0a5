/* serve_tok.c — /tokenize and /detokenize bodies (serve_tok.h). */
#include "serve_tok.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(ie_tokapi_err_t *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(ie_tokapi_err_t *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    e->param = param;
    e->oom = 0;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

static int oom(ie_tokapi_err_t *e)
{
    fail(e, NULL, "out of memory");
    e->oom = 1;
    return -1;
}

/* An optional boolean field: *v keeps its default when absent or null. */
static int opt_flag(const cJSON *root, const char *k, int *v, ie_tokapi_err_t *e)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, k);
    if (!f || cJSON_IsNull(f)) return 0;
    if (!cJSON_IsBool(f)) return fail(e, k, "'%s' must be a boolean", k);
    *v = cJSON_IsTrue(f);
    return 0;
}

/* A token's text as llama-server's "piece": a string when its bytes are
 * valid UTF-8 (a byte-level token may hold part of a character), else the
 * bytes as numbers. NULL when out of memory. */
static cJSON *piece_json(const ie_tokenizer_t *tok, int32_t id)
{
    char small[256];
    int n = ie_tokenizer_token_bytes(tok, id, 1, small, sizeof small);
    char *buf = small;
    cJSON *p = NULL;
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof small) {
        if (!(buf = malloc((size_t)n + 1))) return NULL;
        ie_tokenizer_token_bytes(tok, id, 1, buf, (size_t)n + 1);
    }
    buf[n] = '\0';
    if (memchr(buf, '\0', (size_t)n) == NULL && ie_tokenizer_check_utf8(buf, (size_t)n) == IE_OK) {
        p = cJSON_CreateString(buf);
    } else if ((p = cJSON_CreateArray())) {
        for (int i = 0; i < n; i++) {
            cJSON *b = cJSON_CreateNumber((unsigned char)buf[i]);
            if (!b || !cJSON_AddItemToArray(p, b)) {
                cJSON_Delete(b);
                cJSON_Delete(p);
                p = NULL;
                break;
            }
        }
    }
    if (buf != small) free(buf);
    return p;
}

int ie_tokapi_tokenize(const ie_tokenizer_t *tok, int n_ctx, const cJSON *root, const int32_t *chat_ids,
                       size_t n_chat, cJSON **out, ie_tokapi_err_t *e)
{
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(root, "content");
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    const int llama = !chat_ids && content != NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    cJSON *o = NULL;
    int rc = -1;
    *out = NULL;

    if (chat_ids) {
        ids = (int32_t *)chat_ids;
        n = n_chat;
    } else {
        const cJSON *text = llama ? content : prompt;
        const char *name = llama ? "content" : "prompt";
        int add = !llama, parse = 1; /* llama-server: no BOS unless asked; vLLM: BOS */
        if (!text)
            return fail(e, "prompt", "the body needs 'content' (llama-server), 'prompt' or 'messages' (vLLM)");
        if (!cJSON_IsString(text)) return fail(e, name, "'%s' must be a string", name);
        if (opt_flag(root, llama ? "add_special" : "add_special_tokens", &add, e) != 0 ||
            opt_flag(root, "parse_special", &parse, e) != 0)
            return -1;
        ie_status_t st = ie_tokenizer_encode(tok, text->valuestring, strlen(text->valuestring),
                                             (add ? IE_TOK_ADD_SPECIAL : 0) | (parse ? IE_TOK_PARSE_SPECIAL : 0),
                                             &ids, &n);
        if (st == IE_ERR_NOMEM) return oom(e);
        if (st != IE_OK) return fail(e, name, "'%s': %s", name, ie_error_last());
    }
    int pieces = 0, strs = 0;
    if (opt_flag(root, "with_pieces", &pieces, e) != 0 || opt_flag(root, "return_token_strs", &strs, e) != 0)
        goto cleanup;
    if (!(o = cJSON_CreateObject())) goto nomem;
    if (!llama) {
        if (!cJSON_AddNumberToObject(o, "count", (double)n) || !cJSON_AddNumberToObject(o, "max_model_len", n_ctx))
            goto nomem;
    }
    cJSON *arr = cJSON_AddArrayToObject(o, "tokens");
    cJSON *sarr = !llama && strs ? cJSON_AddArrayToObject(o, "token_strs") : NULL;
    if (!arr || (!llama && strs && !sarr)) goto nomem;
    for (size_t i = 0; i < n; i++) {
        cJSON *t;
        if (llama && pieces) {
            cJSON *pc = piece_json(tok, ids[i]);
            if (!pc || !(t = cJSON_CreateObject())) {
                cJSON_Delete(pc);
                goto nomem;
            }
            cJSON_AddNumberToObject(t, "id", ids[i]);
            cJSON_AddItemToObject(t, "piece", pc);
        } else if (!(t = cJSON_CreateNumber(ids[i]))) {
            goto nomem;
        }
        cJSON_AddItemToArray(arr, t);
        if (sarr) {
            cJSON *pc = piece_json(tok, ids[i]);
            if (!pc) goto nomem;
            cJSON_AddItemToArray(sarr, pc);
        }
    }
    *out = o;
    o = NULL;
    rc = 0;
    goto cleanup;
nomem:
    rc = oom(e);
cleanup:
    cJSON_Delete(o);
    if (ids != chat_ids) free(ids);
    return rc;
}

int ie_tokapi_detokenize(const ie_tokenizer_t *tok, const cJSON *root, cJSON **out, ie_tokapi_err_t *e)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    const int32_t n_vocab = ie_tokenizer_n_vocab(tok);
    ie_detok_t *d = NULL;
    char *text = NULL;
    size_t len = 0, cap = 0;
    cJSON *o = NULL;
    int rc = -1, i = 0;
    const cJSON *it;
    *out = NULL;

    if (!cJSON_IsArray(arr)) return fail(e, "tokens", "'tokens' must be a list of token ids");
    cJSON_ArrayForEach(it, arr)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 ||
            it->valuedouble >= n_vocab)
            return fail(e, "tokens", "'tokens[%d]' is not a token id (an integer in [0, %d))", i, (int)n_vocab);
        i++;
    }
    if (ie_detok_new(tok, &d) != IE_OK) return oom(e);
    ie_detok_set_special(d, 1);
    for (it = arr->child;; it = it->next) {
        const char *piece = it ? ie_detok_push(d, (int32_t)it->valuedouble) : ie_detok_flush(d);
        size_t m = strlen(piece); /* a NUL byte (<0x00>) cannot travel in a JSON string from cJSON: it ends it */
        if (len + m + 1 > cap) {
            size_t c = cap ? cap * 2 : 256;
            while (c < len + m + 1) c *= 2;
            char *p = realloc(text, c);
            if (!p) goto nomem;
            text = p;
            cap = c;
        }
        memcpy(text + len, piece, m);
        len += m;
        text[len] = '\0';
        if (!it) break;
    }
    if (!(o = cJSON_CreateObject()) || !cJSON_AddStringToObject(o, "content", text ? text : "") ||
        !cJSON_AddStringToObject(o, "prompt", text ? text : ""))
        goto nomem;
    *out = o;
    o = NULL;
    rc = 0;
    goto cleanup;
nomem:
    rc = oom(e);
cleanup:
    cJSON_Delete(o);
    free(text);
    ie_detok_destroy(&d);
    return rc;
}

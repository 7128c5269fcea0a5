/* cli_batch.c — the prompts batcher (ie_cli_batch.h): reader threads that
 * tokenize into a bounded ring consumed in input order.
 *
 * Why readers both read and tokenize: reading a line is cheap and done
 * under the lock (so line order = sequence order), tokenizing is the cost
 * and runs outside it, on as many threads as asked. A reader takes
 * sequence number k only when slot k % depth is free (k < consumed +
 * depth), so the ring never holds more than depth prompts and a reader
 * waits — holding no line — while it is full.
 */
#define _GNU_SOURCE
#include "ie_cli_batch.h"

#include "ie_clock.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct reader {
    struct ie_cli_batcher *b;
    pthread_t th;
    int started;
    double tokenize_ms; /* written by this reader under b->mu */
    size_t n_done;
} reader_t;

struct ie_cli_batcher {
    ie_cli_batch_opts_t o;
    FILE *f;
    pthread_mutex_t file_mu; /* the file, line_no; taken before mu, never after */
    pthread_mutex_t mu;
    pthread_cond_t can_read; /* a slot was freed, or stop */
    pthread_cond_t can_take; /* a slot was filled, or the input ended */
    ie_cli_item_t *ring;
    unsigned char *full; /* ring[i] holds a prompt */
    size_t n_read;       /* sequence numbers handed out (prompts read)  */
    size_t n_taken;      /* prompts given to the consumer               */
    size_t line_no;      /* lines of the file consumed                  */
    int eof, stop, io_err;
    char io_msg[200];
    reader_t *readers;
    int n_readers;
};

/* Next line of the file (without \r\n) into buf (at most cap bytes kept;
 * the rest of a longer line is skipped); *len_out the line's full length.
 * Returns 1, or 0 at the end of the file. Caller holds b->file_mu. */
static int read_line(struct ie_cli_batcher *b, char *buf, size_t cap, size_t *len_out)
{
    size_t len = 0;
    int c, any = 0;
    while ((c = getc_unlocked(b->f)) != EOF) {
        any = 1;
        if (c == '\n') break;
        if (len < cap) buf[len] = (char)c;
        len++;
    }
    if (!any) return 0;
    size_t kept = len < cap ? len : cap;
    while (kept > 0 && buf[kept - 1] == '\r' && kept == len) kept = --len;
    *len_out = len;
    return 1;
}

/* Tokenize one prompt into *it (st, message on failure). */
static void tokenize(const ie_cli_batch_opts_t *o, const char *text, size_t len, ie_cli_item_t *it)
{
    it->st = IE_OK;
    it->err[0] = '\0';
    if (len > o->max_line) {
        it->st = IE_ERR_RANGE;
        snprintf(it->err, sizeof it->err, "line %zu is %zu bytes; the limit is %zu", it->line, len, o->max_line);
        return;
    }
    cJSON *js = NULL;
    ie_status_t st = IE_OK;
    if (o->jsonl) { /* {"prompt": str[, "adapter": str]}: the prompt's text and adapter set */
        const cJSON *p = NULL, *a = NULL;
        if (!(js = cJSON_ParseWithLength(text, len)) || !cJSON_IsObject(js) ||
            !cJSON_IsString(p = cJSON_GetObjectItemCaseSensitive(js, "prompt")) ||
            ((a = cJSON_GetObjectItemCaseSensitive(js, "adapter")) && !cJSON_IsNull(a) &&
             (!cJSON_IsString(a) || !*a->valuestring))) {
            it->st = IE_ERR_INVAL;
            snprintf(it->err, sizeof it->err,
                     "line %zu: not a JSON object {\"prompt\": string, \"adapter\": \"NAME[:SCALE],...\"}",
                     it->line);
            cJSON_Delete(js);
            return;
        }
        if (cJSON_IsString(a) && !(it->adapter = strdup(a->valuestring))) st = IE_ERR_NOMEM;
        text = p->valuestring;
        len = strlen(text);
    }
    if (st == IE_OK) st = ie_tokenizer_encode(o->tok, text, len, o->tok_flags, &it->ids, &it->n_ids);
    else ie_error_set(st, "out of memory");
    cJSON_Delete(js);
    if (st != IE_OK) {
        it->st = st;
        snprintf(it->err, sizeof it->err, "line %zu: %s", it->line, ie_error_last());
    } else if (it->n_ids == 0) {
        it->st = IE_ERR_INVAL;
        snprintf(it->err, sizeof it->err, "line %zu is empty after tokenization", it->line);
    } else if (it->n_ids > o->max_tokens) {
        it->st = IE_ERR_RANGE;
        snprintf(it->err, sizeof it->err, "line %zu has %zu tokens; the context holds %zu", it->line, it->n_ids,
                 o->max_tokens);
    }
    if (it->st != IE_OK) {
        free(it->ids);
        it->ids = NULL;
        it->n_ids = 0;
        free(it->adapter);
        it->adapter = NULL;
    }
}

static void *reader_main(void *arg)
{
    reader_t *r = arg;
    struct ie_cli_batcher *b = r->b;
    const size_t cap = b->o.max_line + 1; /* one byte more: "too long" is seen */
    char *buf = b->f ? malloc(cap) : NULL;
    pthread_mutex_lock(&b->mu);
    if (b->f && !buf && !b->io_err) {
        b->io_err = 1;
        snprintf(b->io_msg, sizeof b->io_msg, "out of memory");
        b->eof = 1;
        pthread_cond_broadcast(&b->can_take);
    }
    pthread_mutex_unlock(&b->mu);
    for (;;) {
        /* the file lock orders lines and sequence numbers; the ring's lock
         * is held only to check for room and to count, not while reading,
         * so the consumer is not kept waiting by a reader */
        pthread_mutex_lock(&b->file_mu);
        pthread_mutex_lock(&b->mu);
        while (!b->stop && !b->eof && b->n_read >= b->n_taken + b->o.depth) pthread_cond_wait(&b->can_read, &b->mu);
        const int quit = b->stop || b->eof;
        pthread_mutex_unlock(&b->mu);
        if (quit) {
            pthread_mutex_unlock(&b->file_mu);
            break;
        }
        const char *text = NULL;
        size_t len = 0;
        int got = 1, failed = 0;
        if (b->f) {
            do {
                got = read_line(b, buf, cap, &len);
                if (got) b->line_no++;
            } while (got && len == 0); /* empty lines are skipped */
            failed = !got && ferror(b->f);
            text = buf;
        } else {
            text = b->o.text;
            len = strlen(text);
            b->line_no = 1;
        }
        pthread_mutex_lock(&b->mu);
        ie_cli_item_t it = {.index = b->n_read, .line = b->line_no};
        if (!got) {
            if (failed) {
                b->io_err = 1;
                snprintf(b->io_msg, sizeof b->io_msg, "reading '%s': %s", b->o.path, strerror(errno));
            }
            b->eof = 1;
            pthread_cond_broadcast(&b->can_take);
            pthread_cond_broadcast(&b->can_read);
        } else {
            b->n_read++;
            if (!b->f) { /* the one prompt */
                b->eof = 1;
                pthread_cond_broadcast(&b->can_read);
            }
        }
        pthread_mutex_unlock(&b->mu);
        if (!got) {
            pthread_mutex_unlock(&b->file_mu);
            break;
        }
        pthread_mutex_unlock(&b->file_mu); /* buf is this reader's own: no copy needed */

        double t0 = ie_now_ms();
        tokenize(&b->o, text, len, &it);
        double dt = ie_now_ms() - t0;

        pthread_mutex_lock(&b->mu);
        r->tokenize_ms += dt;
        r->n_done++;
        const size_t slot = it.index % b->o.depth;
        b->ring[slot] = it;
        b->full[slot] = 1;
        pthread_cond_broadcast(&b->can_take);
        pthread_mutex_unlock(&b->mu);
    }
    free(buf);
    return NULL;
}

ie_status_t ie_cli_batcher_start(const ie_cli_batch_opts_t *o, ie_cli_batcher_t **out)
{
    ie_status_t st = IE_OK;
    *out = NULL;
    if (!o || !o->tok || (!o->path && !o->text) || o->n_threads < 1 || o->depth < 1)
        return ie_error_set(IE_ERR_INVAL, "batcher: bad options");
    struct ie_cli_batcher *b = calloc(1, sizeof *b);
    if (!b) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    b->o = *o;
    if (!b->o.max_line) b->o.max_line = (size_t)1 << 20;
    pthread_mutex_init(&b->file_mu, NULL);
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->can_read, NULL);
    pthread_cond_init(&b->can_take, NULL);
    if (o->path && !(b->f = fopen(o->path, "rb"))) {
        st = ie_error_set(IE_ERR_IO, "cannot read prompts file '%s': %s", o->path, strerror(errno));
        goto cleanup;
    }
    b->ring = calloc(o->depth, sizeof *b->ring);
    b->full = calloc(o->depth, 1);
    b->readers = calloc((size_t)o->n_threads, sizeof *b->readers);
    if (!b->ring || !b->full || !b->readers) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    for (int i = 0; i < o->n_threads; i++) {
        b->readers[i].b = b;
        if (pthread_create(&b->readers[i].th, NULL, reader_main, &b->readers[i]) != 0) {
            st = ie_error_set(IE_ERR_NOMEM, "batcher: cannot start a tokenizer thread");
            goto cleanup;
        }
        b->readers[i].started = 1;
        b->n_readers = i + 1;
    }
cleanup:
    if (st != IE_OK) {
        ie_cli_batcher_destroy(&b);
        return st;
    }
    *out = b;
    return IE_OK;
}

int ie_cli_batcher_next(ie_cli_batcher_t *b, ie_cli_item_t *it, double *wait_ms, int block)
{
    int rc;
    double t0 = block ? ie_now_ms() : 0;
    /* not waiting: a reader holding the lock means "not ready yet" (the
     * engine steps meanwhile rather than sleep on the lock) */
    if (!block && pthread_mutex_trylock(&b->mu) != 0) return 2;
    if (block) pthread_mutex_lock(&b->mu);
    const size_t slot = b->n_taken % b->o.depth;
    while (block && !b->full[slot] && !(b->eof && b->n_taken >= b->n_read)) pthread_cond_wait(&b->can_take, &b->mu);
    if (!b->full[slot] && !(b->eof && b->n_taken >= b->n_read)) {
        rc = 2; /* not ready, and not waiting for it */
    } else if (b->full[slot]) {
        *it = b->ring[slot];
        memset(&b->ring[slot], 0, sizeof b->ring[slot]);
        b->full[slot] = 0;
        b->n_taken++;
        /* readers blocked on a full ring wake when it is half empty, to
         * refill it in one burst: waking them per prompt taken would cost
         * a context switch per prompt on the engine's cores */
        if (b->n_read - b->n_taken <= b->o.depth / 2) pthread_cond_broadcast(&b->can_read);
        rc = 1;
    } else if (b->io_err) {
        ie_error_set(IE_ERR_IO, "%s", b->io_msg);
        rc = -1;
    } else {
        rc = 0;
    }
    pthread_mutex_unlock(&b->mu);
    if (wait_ms && block) *wait_ms += ie_now_ms() - t0;
    return rc;
}

void ie_cli_batcher_stats(const ie_cli_batcher_t *b, double *tokenize_ms, int *threads_used)
{
    struct ie_cli_batcher *m = (struct ie_cli_batcher *)b; /* the lock only */
    double ms = 0;
    int used = 0;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < b->n_readers; i++) {
        ms += b->readers[i].tokenize_ms;
        used += b->readers[i].n_done > 0;
    }
    pthread_mutex_unlock(&m->mu);
    *tokenize_ms = ms;
    *threads_used = used;
}

void ie_cli_batcher_destroy(ie_cli_batcher_t **bp)
{
    if (!bp || !*bp) return;
    struct ie_cli_batcher *b = *bp;
    pthread_mutex_lock(&b->mu);
    b->stop = 1;
    pthread_cond_broadcast(&b->can_read);
    pthread_cond_broadcast(&b->can_take);
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->n_readers; i++)
        if (b->readers[i].started) pthread_join(b->readers[i].th, NULL);
    for (size_t i = 0; b->ring && i < b->o.depth; i++) free(b->ring[i].ids), free(b->ring[i].adapter);
    free(b->ring);
    free(b->full);
    free(b->readers);
    if (b->f) fclose(b->f);
    pthread_cond_destroy(&b->can_read);
    pthread_cond_destroy(&b->can_take);
    pthread_mutex_destroy(&b->mu);
    pthread_mutex_destroy(&b->file_mu);
    free(b);
    *bp = NULL;
}

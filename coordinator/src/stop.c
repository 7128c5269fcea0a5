/* stop.c — stop-string matcher over streamed text (see ie_stop.h).
 *
 * State between calls is one buffer: buf[0, emit_len) are the bytes the
 * last call released (kept so the caller can read them), followed by
 * buf[emit_len, emit_len + held), the held-back tail. Each feed first drops
 * the released bytes, then appends the new chunk and scans only the new
 * end positions: every earlier end position was scanned by an earlier feed.
 * Stop lists are short (the OpenAI API allows 4), so the scan is a plain
 * per-end, per-stop comparison.
 */
#include "ie_stop.h"

#include <stdlib.h>
#include <string.h>

#define IE_STOP_MIN_CAP 256

typedef struct ie_stop_str {
    char *text;
    size_t len;
    int index; /* position in the caller's list */
} ie_stop_str_t;

struct ie_stop {
    ie_stop_str_t *stops; /* (n) non-empty stops, longest first            */
    size_t n;
    size_t max_len; /* longest stop; at most max_len - 1 held back   */
    char *buf;      /* (cap) released bytes, then held-back bytes    */
    size_t cap;
    size_t emit_len; /* bytes released by the last feed/flush         */
    size_t held;     /* bytes held back after them                    */
    size_t total;    /* bytes released since new/reset                */
    int stopped;
    int matched; /* caller's index of the stop that fired, or -1  */
};

static int stop_cmp_len_desc(const void *a, const void *b)
{
    const ie_stop_str_t *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? 1 : -1;
    return x->index - y->index; /* equal lengths: keep the caller's order */
}

ie_status_t ie_stop_new(const char *const *stops, size_t n, ie_stop_t **out)
{
    ie_status_t st = IE_OK;
    ie_stop_t *s = NULL;

    if (!out) return ie_error_set(IE_ERR_INVAL, "stop: out is NULL");
    *out = NULL;
    if (n > 0 && !stops) return ie_error_set(IE_ERR_INVAL, "stop: stops is NULL with n = %zu", n);
    for (size_t i = 0; i < n; i++) {
        if (!stops[i]) return ie_error_set(IE_ERR_INVAL, "stop: stops[%zu] is NULL", i);
    }
    if (n > (size_t)0x7fffffff) return ie_error_set(IE_ERR_INVAL, "stop: too many stop strings (%zu)", n);

    s = calloc(1, sizeof *s);
    if (!s) {
        st = ie_error_set(IE_ERR_NOMEM, "stop: out of memory");
        goto cleanup;
    }
    if (n > 0) {
        s->stops = calloc(n, sizeof *s->stops);
        if (!s->stops) {
            st = ie_error_set(IE_ERR_NOMEM, "stop: out of memory");
            goto cleanup;
        }
    }
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(stops[i]);
        if (len == 0) continue; /* an empty stop would match before any text: ignore */
        ie_stop_str_t *d = &s->stops[s->n];
        d->text = malloc(len + 1); /* NUL-terminated for ie_stop_string */
        if (!d->text) {
            st = ie_error_set(IE_ERR_NOMEM, "stop: out of memory");
            goto cleanup;
        }
        memcpy(d->text, stops[i], len + 1);
        d->len = len;
        d->index = (int)i;
        s->n++;
        if (len > s->max_len) s->max_len = len;
    }
    /* Longest first: at one end position the first hit is the longest. */
    if (s->n > 1) qsort(s->stops, s->n, sizeof *s->stops, stop_cmp_len_desc);

    s->cap = IE_STOP_MIN_CAP + s->max_len;
    s->buf = malloc(s->cap);
    if (!s->buf) {
        st = ie_error_set(IE_ERR_NOMEM, "stop: out of memory");
        goto cleanup;
    }
    ie_stop_reset(s);
    *out = s;
    s = NULL;
cleanup:
    ie_stop_destroy(&s);
    return st;
}

void ie_stop_destroy(ie_stop_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_stop_t *s = *self_p;
    for (size_t i = 0; i < s->n; i++) free(s->stops[i].text);
    free(s->stops);
    free(s->buf);
    free(s);
    *self_p = NULL;
}

void ie_stop_reset(ie_stop_t *s)
{
    if (!s) return;
    s->emit_len = 0;
    s->held = 0;
    s->total = 0;
    s->stopped = 0;
    s->matched = -1;
}

/* Drop the bytes released by the previous call: the held-back tail moves
 * to the front of buf. */
static void stop_compact(ie_stop_t *s)
{
    if (s->emit_len > 0 && s->held > 0) memmove(s->buf, s->buf + s->emit_len, s->held);
    s->emit_len = 0;
}

/* Length of the longest proper suffix of buf[0, len) that is a prefix of
 * some stop string (0 if none). */
static size_t stop_hold_len(const ie_stop_t *s, size_t len)
{
    size_t k = s->max_len > 0 ? s->max_len - 1 : 0;
    if (k > len) k = len;
    for (; k > 0; k--) {
        const char *tail = s->buf + len - k;
        for (size_t i = 0; i < s->n; i++) {
            if (s->stops[i].len > k && memcmp(s->stops[i].text, tail, k) == 0) return k;
        }
    }
    return 0;
}

ie_status_t ie_stop_feed(ie_stop_t *s, const char *text, size_t len, size_t *emit_len_out, int *stopped_out)
{
    ie_status_t st = IE_OK;
    size_t emit = 0;

    if (!s || !emit_len_out || !stopped_out || (!text && len > 0)) {
        st = ie_error_set(IE_ERR_INVAL, "stop: bad argument to feed");
        goto cleanup;
    }
    stop_compact(s);
    if (s->stopped) goto cleanup;

    size_t need = s->held + len;
    if (need < s->held) {
        st = ie_error_set(IE_ERR_RANGE, "stop: chunk too large");
        goto cleanup;
    }
    if (need > s->cap) {
        size_t cap = s->cap;
        while (cap < need) cap = cap * 2 > cap ? cap * 2 : need;
        char *nb = realloc(s->buf, cap);
        if (!nb) {
            st = ie_error_set(IE_ERR_NOMEM, "stop: out of memory for a %zu-byte chunk", len);
            goto cleanup;
        }
        s->buf = nb;
        s->cap = cap;
    }
    if (len > 0) memcpy(s->buf + s->held, text, len);

    /* Earliest end position among the new bytes; at one end, the longest
     * stop (they are sorted that way). A stop can never start before
     * buf[0]: its first bytes would have been held back. */
    for (size_t e = s->held + 1; e <= need; e++) {
        const char last = s->buf[e - 1];
        for (size_t i = 0; i < s->n; i++) {
            const ie_stop_str_t *d = &s->stops[i];
            if (d->len <= e && d->text[d->len - 1] == last && memcmp(s->buf + e - d->len, d->text, d->len) == 0) {
                emit = e - d->len;
                s->stopped = 1;
                s->matched = d->index;
                s->held = 0;
                goto cleanup;
            }
        }
    }

    size_t hold = stop_hold_len(s, need);
    emit = need - hold;
    s->held = hold;
cleanup:
    if (st == IE_OK) {
        s->emit_len = emit;
        s->total += emit;
    }
    if (emit_len_out) *emit_len_out = st == IE_OK ? emit : 0;
    if (stopped_out) *stopped_out = st == IE_OK ? s->stopped : 0;
    return st;
}

ie_status_t ie_stop_flush(ie_stop_t *s, size_t *emit_len_out)
{
    if (!s || !emit_len_out) {
        if (emit_len_out) *emit_len_out = 0;
        return ie_error_set(IE_ERR_INVAL, "stop: bad argument to flush");
    }
    stop_compact(s);
    s->emit_len = s->stopped ? 0 : s->held;
    s->held = 0;
    s->total += s->emit_len;
    *emit_len_out = s->emit_len;
    return IE_OK;
}

const char *ie_stop_emit_data(const ie_stop_t *s) { return s && s->buf ? s->buf : ""; }

int ie_stop_matched(const ie_stop_t *s) { return s ? s->matched : -1; }

const char *ie_stop_string(const ie_stop_t *s, int index)
{
    for (size_t i = 0; s && i < s->n; i++)
        if (s->stops[i].index == index) return s->stops[i].text;
    return NULL;
}

size_t ie_stop_emitted_total(const ie_stop_t *s) { return s ? s->total : 0; }

/* ie_stop.h — stop strings over streamed text.
 *
 * Generated text arrives in chunks (one decoded token at a time). Before a
 * chunk is sent to the client we must know that it is not the beginning of
 * a stop string, which only a later chunk may complete. The matcher holds
 * back the longest tail of the text that is a proper prefix of some stop
 * string and releases everything before it.
 *
 * The "stream" is the concatenation of every chunk fed since creation (or
 * the last reset). The matcher releases a prefix of it, in order, never
 * taking anything back:
 *   - while no stop string has completed, each feed releases all but the
 *     held-back tail (at most longest-stop-length - 1 bytes);
 *   - when a stop string completes, the stream is cut at its start: the
 *     rest of the text before it is released, the stop string and anything
 *     after it never are, and the matcher is finished.
 * Which stop wins: the occurrence that ends first in the stream (the one a
 * byte-by-byte reader would see first); among those ending on the same
 * byte, the longest (it starts earliest, so less text is released). The
 * result therefore does not depend on how the text is cut into chunks.
 *
 * Matching is on bytes. Empty stop strings are ignored. Holding back whole
 * UTF-8 characters is the detokenizer's job, not this module's.
 *
 * Typical loop:
 *     ie_stop_feed(st, piece, piece_len, &n, &stopped);
 *     send(ie_stop_emit_data(st), n);
 *     if (stopped) break;
 *   ... and when generation ends for another reason:
 *     ie_stop_flush(st, &n);  send(ie_stop_emit_data(st), n);
 */
#ifndef IE_STOP_H
#define IE_STOP_H

#include <stddef.h>

#include "ie_status.h"

typedef struct ie_stop ie_stop_t;

/* New matcher for stops[0..n) (copied; the caller keeps ownership of its
 * strings). n == 0 (stops may then be NULL) makes a matcher that holds
 * nothing back and never stops. IE_ERR_INVAL if stops is NULL with n > 0 or
 * any stops[i] is NULL. Caller owns *out and must destroy it; *out is NULL
 * on failure. */
ie_status_t ie_stop_new(const char *const *stops, size_t n, ie_stop_t **out);

/* Free the matcher; *self_p = NULL. Accepts NULL and *self_p == NULL. */
void ie_stop_destroy(ie_stop_t **self_p);

/* Append text[0..len) (text may be NULL when len == 0) to the stream.
 * *emit_len_out = how many further bytes of the stream are now final and
 * may be sent; the bytes themselves are at ie_stop_emit_data(s). They may
 * include bytes held back from earlier chunks. *stopped_out = 1 if a stop
 * string has completed (now or before), else 0. Once stopped, further feeds
 * release nothing. IE_ERR_NOMEM if the internal buffer cannot grow (the
 * matcher is then unchanged). On failure both outputs are 0. */
ie_status_t ie_stop_feed(ie_stop_t *s, const char *text, size_t len, size_t *emit_len_out, int *stopped_out);

/* End of stream without a stop: release every held-back byte. After a stop
 * releases nothing. *emit_len_out as for ie_stop_feed. Later feeds still
 * work (the held-back state is simply empty). */
ie_status_t ie_stop_flush(ie_stop_t *s, size_t *emit_len_out);

/* The bytes released by the most recent ie_stop_feed / ie_stop_flush
 * (*emit_len_out of them, not NUL-terminated). Owned by the matcher, valid
 * until the next call on it. Never NULL. */
const char *ie_stop_emit_data(const ie_stop_t *s);

/* Index into the stops given to ie_stop_new of the stop string that
 * completed, or -1 if none has. */
int ie_stop_matched(const ie_stop_t *s);

/* The matcher's copy of the stop string the caller gave at `index` (to
 * ie_stop_new), or NULL (out of range, or an empty string, which is
 * ignored). Valid until the matcher is destroyed. */
const char *ie_stop_string(const ie_stop_t *s, int index);

/* Total bytes of the stream released so far. */
size_t ie_stop_emitted_total(const ie_stop_t *s);

/* Start a new stream with the same stop strings (not stopped, nothing
 * held). */
void ie_stop_reset(ie_stop_t *s);

#endif

/* fuzz_http_head.c — libFuzzer target for the first-request-head check of
 * the HTTP gate (coordinator/src/serve_http_gate.c). The first byte picks
 * "full" (the peek buffer is full), the rest is the head. Checked: the
 * result is -1, 0 or 1; 0 never when full; a refusal names a status, a
 * code and a message, and its JSON answer fits the answer buffer. */
#include "../../coordinator/src/serve_http_gate.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int full = data[0] & 1;
    size_t n = size - 1;
    char *p = malloc(n ? n : 1); /* exactly n readable bytes: ASan sees any overread */
    if (!p) return 0;
    memcpy(p, data + 1, n);
    ie_http_head_err_t e;
    memset(&e, 0, sizeof e);
    int rc = ie_http_head_check(p, n, full, 8192, 16384, &e);
    if (rc < -1 || rc > 1 || (full && rc == 0)) abort();
    if (rc < 0) {
        char buf[640];
        if (!e.status || !e.code || !e.message[0] || !ie_http_head_answer(&e, buf, sizeof buf)) abort();
    }
    free(p);
    return 0;
}

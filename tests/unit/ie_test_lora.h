/* ie_test_lora.h — what the suites that run adapters through a backend
 * share (test-only, header: each suite is its own executable): the
 * fixture adapters, the prompt they prefill and how its logits compare. */
#ifndef IE_TEST_LORA_H
#define IE_TEST_LORA_H

#include "ie_backend.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define QV8 IE_TEST_DATA "/lora/qv8"
#define ALL16 IE_TEST_DATA "/lora/all16"
#define NTOK 12

static const int32_t k_ids[NTOK] = {433, 474, 249, 210, 449, 74, 9, 66, 465, 186, 281, 434};

/* The logits of k_ids prefilled in slot 0 of b under adapter id (-1:
 * none) into out[NTOK][n_vocab]; the step's status. */
static inline ie_status_t run(ie_backend_t *b, int id, float *out)
{
    int32_t pos[NTOK], seq[NTOK], ad[NTOK];
    uint8_t lg[NTOK];
    for (int i = 0; i < NTOK; i++) pos[i] = i, seq[i] = 0, ad[i] = id, lg[i] = 1;
    ie_backend_seq_clear(b, 0);
    ie_batch_t batch = {NTOK, k_ids, pos, seq, lg, id >= 0 ? ad : NULL, NULL};
    return ie_backend_step(b, &batch, out);
}

/* max |a - b| over max |b|. */
static inline double rel(const float *a, const float *b, size_t n)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return d / m;
}

#endif

/* logprobs.c — log-softmax and top-k of a logits row (ie_logprobs.h). */
#include "ie_logprobs.h"

#include <math.h>

float ie_logprobs_of(float logit, double lse)
{
    if (isnan(logit) || lse == -INFINITY) return -INFINITY;
    if (isinf(lse)) return logit == INFINITY ? 0.0f : -INFINITY; /* +inf tokens share everything */
    return (float)((double)logit - lse);
}

/* a ranks before b: larger logit, then lower id (NaN is -inf) */
static int ranks_before(float la, int32_t ia, float lb, int32_t ib)
{
    if (isnan(la)) la = -INFINITY;
    if (isnan(lb)) lb = -INFINITY;
    return la > lb || (la == lb && ia < ib);
}

int ie_logprobs_row(const float *logits, int32_t n, int k, double *lse_out, ie_token_logprob_t *top_out)
{
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (logits[i] > mx) mx = logits[i]; /* NaN compares false: skipped */
    double lse;
    if (mx == -INFINITY) {
        lse = -INFINITY;
    } else if (mx == INFINITY) {
        lse = INFINITY;
    } else {
        double sum = 0;
        for (int32_t i = 0; i < n; i++)
            if (logits[i] > -INFINITY) sum += exp((double)logits[i] - (double)mx);
        lse = (double)mx + log(sum);
    }
    *lse_out = lse;

    /* top-k: a sorted list of at most k, filled by insertion; a token
     * enters only when it beats the current k-th, which few do */
    if (k > n) k = (int)n;
    if (k < 0) k = 0;
    int m = 0;
    float lg[IE_LOGPROBS_MAX_TOP + 1];
    const int kk = k > IE_LOGPROBS_MAX_TOP ? IE_LOGPROBS_MAX_TOP : k;
    for (int32_t i = 0; i < n && kk > 0; i++) {
        const float l = logits[i];
        if (m == kk && !ranks_before(l, i, lg[m - 1], top_out[m - 1].id)) continue;
        int at = m < kk ? m : kk - 1;
        while (at > 0 && ranks_before(l, i, lg[at - 1], top_out[at - 1].id)) {
            lg[at] = lg[at - 1];
            top_out[at] = top_out[at - 1];
            at--;
        }
        lg[at] = l;
        top_out[at].id = i;
        if (m < kk) m++;
    }
    for (int j = 0; j < m; j++) top_out[j].logprob = ie_logprobs_of(lg[j], lse);
    return m;
}

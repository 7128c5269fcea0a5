/* ie_logprobs.h — log-probabilities of one logits row: the model's
 * log-softmax over its raw logits (before temperature, penalties, filters
 * and grammar masks: vLLM's default "raw" log-probabilities, and what the
 * OpenAI API reports), and the k most likely tokens.
 *
 * The scheduler (sched.c) calls ie_logprobs_row on a row before the
 * sampler sees it (the sampler writes its penalties into the row), for the
 * requests that ask (ie_gen_params_t.logprobs).
 */
#ifndef IE_LOGPROBS_H
#define IE_LOGPROBS_H

#include <stdint.h>

/* The most alternatives a request may ask for (OpenAI's top_logprobs
 * limit). */
#define IE_LOGPROBS_MAX_TOP 20

typedef struct ie_token_logprob {
    int32_t id;
    float logprob; /* ln p(id); -inf for a token that cannot occur */
} ie_token_logprob_t;

/* Log-softmax statistics of logits[0..n) (n >= 1): *lse_out = ln sum_i
 * exp(logits[i]) (accumulated in double around the max; NaN counts as
 * -inf, +inf tokens share all the mass), and top_out[0..k) = the k (0..n)
 * largest logits as (id, logit - lse), in descending order, ties by lower
 * id; k beyond IE_LOGPROBS_MAX_TOP counts as that. Returns how many
 * entries were written (min(k, n, IE_LOGPROBS_MAX_TOP)). A row with no
 * finite or +inf logit gives lse -inf and entries of -inf (NaN-free).
 * Logprob of any token t: ie_logprobs_of(logits[t], lse). Never allocates;
 * O(n + n·k) worst case, O(n) for a typical row. */
int ie_logprobs_row(const float *logits, int32_t n, int k, double *lse_out, ie_token_logprob_t *top_out);

/* logit - lse as a float, with the non-finite cases of ie_logprobs_row:
 * NaN logit or -inf lse -> -inf; +inf logit with +inf lse -> the +inf
 * tokens' share is reported as 0 (ln 1, since only +inf tokens count). */
float ie_logprobs_of(float logit, double lse);

#endif

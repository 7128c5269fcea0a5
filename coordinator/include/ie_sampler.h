/* ie_sampler.h — turns one row of logits into one token id.
 *
 * A sampler belongs to one generation stream (one request). It owns a
 * seeded PRNG, the recent token history used by the penalties, and all the
 * scratch memory it needs, so ie_sampler_sample() never allocates.
 *
 * The chain, in this fixed order (the order of HF transformers / vLLM:
 * filters act on the distribution *at* the chosen temperature; llama.cpp
 * instead filters at temperature 1 and applies temperature last):
 *
 *   0. logit bias  logit[id] += bias for each (id, bias) of logit_bias
 *                  (OpenAI's logit_bias; first, as in llama.cpp and vLLM),
 *                  written back into the caller's logits array.
 *   1. penalties   over the last repeat_last_n accepted tokens (the window),
 *                  for each distinct token t in the window, seen c times:
 *                    repeat (llama.cpp): logit > 0 ? logit / repeat_penalty
 *                                                  : logit * repeat_penalty
 *                    then (OpenAI):      logit -= c * frequency_penalty
 *                                               + (c > 0) * presence_penalty
 *                  written back into the caller's logits array.
 *   2. greedy      if greedy != 0 or temperature == 0: return the arg max of
 *                  the penalized logits, ties to the lowest id. Steps 3–6
 *                  are skipped and no random number is consumed.
 *   3. top-k       keep the top_k largest logits (0 = off). Ties are ranked
 *                  by id, lower id first, so the kept set is exact.
 *   4. softmax     p_i = exp((l_i - l_max) / temperature) / Z over the
 *                  surviving tokens.
 *   5. top-p       rank by p (ties by id), keep the smallest prefix whose
 *                  mass is >= top_p (1 = off). The comparison tolerates a
 *                  relative rounding error of 1e-6, so a prefix whose exact
 *                  mass equals top_p is kept as "reaching" it.
 *   6. min-p       keep tokens with p_i >= min_p * p_max (0 = off). The most
 *                  likely token always survives.
 *   7. draw        one uniform draw from the PRNG over the renormalized
 *                  survivors.
 *
 * Non-finite logits: NaN and -inf are never chosen (NaN counts as -inf);
 * +inf tokens share all the mass (greedy picks the lowest such id). If no
 * logit is finite-or-+inf, ie_sampler_sample() fails with IE_ERR_RANGE.
 *
 * Cost at vocabulary n: penalties O(window); everything else O(n) with
 * small constants and no full sort: top-k copies out only the tokens of a
 * few 64-token groups, top-p files tokens into histogram buckets and sorts
 * only the boundary bucket's tokens, min-p is a threshold. About 1 ms or
 * less per call at n = 200k (sampler.c has the measurements). Exact: the
 * kept sets are the ones the definitions above give, not approximations.
 * exp() is the sampler's own polynomial (relative error < 1e-7), identical
 * on every platform, so a seed reproduces its tokens across machines.
 *
 * Not thread-safe: one sampler per stream, used from one thread at a time.
 */
#ifndef IE_SAMPLER_H
#define IE_SAMPLER_H

#include <stdint.h>

#include "ie_status.h"

typedef struct ie_sampler ie_sampler_t;

/* One entry of a logit bias: logit[id] += bias. -inf bans the token. */
typedef struct ie_logit_bias {
    int32_t id;
    float bias;
} ie_logit_bias_t;

typedef struct ie_sampler_params {
    float temperature;                 /* >= 0, finite; 0 = greedy          (1.0)  */
    int greedy;                        /* nonzero = arg max, ignores the rest (0)  */
    int32_t top_k;                     /* >= 0; 0 = off                       (0)  */
    float top_p;                       /* in (0, 1]; 1 = off                  (1)  */
    float min_p;                       /* in [0, 1]; 0 = off                  (0)  */
    float repeat_penalty;              /* > 0, finite; 1 = off                (1)  */
    int32_t repeat_last_n;             /* window length in [0, 2^20]; 0 = no
                                penalties                           (64) */
    float frequency_penalty;           /* finite, may be < 0; 0 = off         (0)  */
    float presence_penalty;            /* finite, may be < 0; 0 = off         (0)  */
    uint64_t seed;                     /* PRNG seed; every value (0 too) is a fixed,
                                reproducible seed. For a random one put
                                ie_sampler_seed_random() here.       (0)  */
    const ie_logit_bias_t *logit_bias; /* n_logit_bias entries, copied by
                                ie_sampler_new (the caller keeps its
                                array); an id given twice adds both;
                                each bias not NaN                 (NULL) */
    int32_t n_logit_bias;              /* in [0, 2^20]                        (0)  */
} ie_sampler_params_t;

/* The defaults shown above: temperature 1 with every filter and penalty
 * off (the OpenAI API defaults), window 64, seed 0. */
ie_sampler_params_t ie_sampler_params_default(void);

/* A fresh unpredictable seed (getrandom(), falling back to the clock). The
 * caller stores it in params.seed, so the seed used can be reported and a
 * run replayed. */
uint64_t ie_sampler_seed_random(void);

/* Parse one logit-bias entry in llama.cpp's --logit-bias form: "ID+BIAS"
 * or "ID-BIAS" (ID a decimal token id >= 0, BIAS a number or "inf";
 * "15043-inf" bans token 15043). IE_ERR_INVAL naming the text if malformed
 * or the bias is NaN; the id is not checked against a vocabulary here. */
ie_status_t ie_logit_bias_parse(const char *text, ie_logit_bias_t *out);

/* IE_OK if every field of *params is in range, else IE_ERR_INVAL with a
 * message naming the field. */
ie_status_t ie_sampler_params_validate(const ie_sampler_params_t *params);

/* New sampler for a vocabulary of n_vocab (>= 1) tokens, seeded from
 * params->seed, empty history. Copies *params and its logit bias
 * (IE_ERR_RANGE naming the entry if an id is outside [0, n_vocab)). The
 * copy's logit_bias points at the sampler's own array. Allocates all scratch now
 * (about 24 bytes per vocabulary entry, plus 4 per window slot). Caller owns *out and must destroy
 * it; *out is NULL on failure. */
ie_status_t ie_sampler_new(const ie_sampler_params_t *params, int32_t n_vocab, ie_sampler_t **out);

/* Free the sampler; *self_p = NULL. Accepts NULL and *self_p == NULL. */
void ie_sampler_destroy(ie_sampler_t **self_p);

/* Pick the next token from logits[0..n_vocab) by the chain above. On
 * return logits holds the biased and penalized values (steps 0 and 1;
 * later steps do not write to it). Does not record the token: call ie_sampler_accept() with
 * whatever token the engine finally keeps. *id_out is in [0, n_vocab) on
 * success, -1 on failure. Never allocates. */
ie_status_t ie_sampler_sample(ie_sampler_t *s, float *logits, int32_t *id_out);

/* Step 1 alone: apply the penalties of the current window to
 * logits[0..n_vocab) in place. Leaves the sampler's state as it was (it
 * marks tokens in its own count table while it runs, hence non-const). */
void ie_sampler_apply_penalties(ie_sampler_t *s, float *logits);

/* Record id as the newest token of the history (the engine calls this for
 * every prompt token too, so the prompt is penalized like output). Tokens
 * older than repeat_last_n drop out of the window. IE_ERR_RANGE if id is
 * outside [0, n_vocab). */
ie_status_t ie_sampler_accept(ie_sampler_t *s, int32_t id);

/* Forget the history and reseed the PRNG from params.seed, so the sampler
 * behaves exactly as a new one. */
void ie_sampler_reset(ie_sampler_t *s);

/* The parameters the sampler was made with. */
const ie_sampler_params_t *ie_sampler_params(const ie_sampler_t *s);

/* 1 if ie_sampler_sample() returns the arg max of the raw logits whatever
 * the history: greedy (or temperature 0) with the penalties off and no
 * logit bias. Then only
 * the arg max has to be known (the cluster sends no logits rows); 0 for
 * NULL. */
int ie_sampler_argmax_only(const ie_sampler_t *s);

#endif

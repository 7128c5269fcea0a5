/* ie_gen.h — what a generation request asks for and how it ended: the
 * parameters, the finish reasons and the step timing, shared by the engine
 * (ie_engine.h) and the scheduler (ie_sched.h) so that neither needs the
 * other's header for them.
 */
#ifndef IE_GEN_H
#define IE_GEN_H

#include "ie_sampler.h"

#include <stddef.h>
#include <stdint.h>

typedef enum ie_finish {
    IE_FINISH_NONE = 0,
    IE_FINISH_EOS,    /* the model ended its turn             */
    IE_FINISH_STOP,   /* a stop string appeared               */
    IE_FINISH_LENGTH, /* max_new tokens generated             */
    IE_FINISH_CONTEXT /* the sequence filled its KV slot      */
} ie_finish_t;

/* "none", "eos", "stop", "length", "context": a static string. */
const char *ie_finish_name(ie_finish_t r);

typedef struct ie_gen_params {
    int max_new; /* tokens to generate at most (>= 0)  */
    /* End-of-generation control (vLLM's min_tokens and ignore_eos): the
     * first min_new tokens (>= 0) cannot be an end-of-generation token
     * (the tokenizer's EOS/EOT and the engine's stop ids: their logits are
     * -inf) and do not end on a stop string (their text is not matched);
     * ignore_eos != 0 masks those tokens for the whole request, so it runs
     * to max_new (or the context). A structured-output request whose
     * grammar allows nothing else still ends with EOS. */
    int min_new;
    int ignore_eos;
    ie_sampler_params_t sampling;
    const char *const *stop; /* stop strings (not part of output)  */
    size_t n_stop;
    int include_stop;        /* nonzero: the stop string that ended the
                         text is kept in it (vLLM's
                         include_stop_str_in_output)             */
    const int32_t *stop_ids; /* more ids that end the generation
                                like EOS (vLLM's stop_token_ids;
                                copied at submission)            */
    size_t n_stop_ids;
    int show_special;        /* nonzero: control tokens' text is in the
                         output (vLLM's skip_special_tokens false) */
    int add_special;         /* BOS/EOS per the tokenizer's rules  */
    int parse_special;       /* special-token text -> tokens       */
    const int32_t *adapters; /* NULL: every prompt on the base model;
                                else prompt i runs LoRA adapter id
                                adapters[i] (ie_engine_lora_find; -1:
                                the base)                          */
    /* Structured output (optional): NULL, free text; "" any one JSON
     * object (OpenAI response_format json_object); else a JSON Schema
     * document (response_format json_schema, and tool_choice required or
     * a named function) the output must be an instance of. The sampler
     * masks every token that would leave the language; copied at
     * submission; a schema that cannot be compiled fails the submission
     * with IE_ERR_INVAL naming the keyword. */
    const char *json_schema;
    /* Or one of these strings exactly (vLLM's guided_choice; raw text, at
     * most IE_GRAMMAR_MAX_ALTS, copied at submission); not with
     * json_schema. */
    const char *const *choice;
    size_t n_choice;
    /* Log-probabilities (optional): logprobs != 0 gives every sampled
     * token its log-probability under the model's raw logits (log-softmax
     * before temperature, penalties, filters and masks) and the
     * top_logprobs (0..IE_LOGPROBS_MAX_TOP, ie_logprobs.h) most likely
     * tokens, in the scheduler's TOKEN events. Such a request always gets
     * full logits rows (never the cluster's ARGMAX-only ones). */
    int logprobs;
    int top_logprobs;
    /* Prompt log-probabilities (optional; OpenAI completions' echo, vLLM's
     * prompt_logprobs): prompt_logprobs != 0 gives every prompt token
     * after the first its raw log-probability given the tokens before it,
     * and the top_logprobs most likely tokens at that position, in the
     * DONE event. Such a request computes its whole prompt (no prefix-cache
     * reuse) with a logits row per prompt token. */
    int prompt_logprobs;
    /* Streaming (optional): called after every sampled token of prompt
     * `index` with the token and the text it released (after stop-string
     * holding; may be empty, not NUL-terminated). */
    void (*on_token)(void *ctx, size_t index, int32_t id, const char *text, size_t len);
    void *on_token_ctx;
    /* Cancellation (optional): once *cancel is nonzero (on_token may set
     * it), every request of the call is cancelled before the next step
     * (ie_sched_cancel) and the call fails with IE_ERR_INVAL "cancelled". */
    const volatile int *cancel;
} ie_gen_params_t;

/* max_new 128, sampler defaults, no stop strings, add_special 1,
 * parse_special 1 (prompts are the user's own: chat markup works). */
void ie_gen_params_default(ie_gen_params_t *p);

/* Step timing. A step that holds any prompt tokens is a prefill step (its
 * time and prompt tokens count here, with any decode token riding along);
 * a step of decode tokens only is a decode step. Sampling and
 * detokenizing between steps count in neither. */
typedef struct ie_gen_stats {
    double prefill_ms;         /* time in prefill steps                   */
    double decode_ms;          /* time in decode-only steps               */
    size_t prefill_tokens;     /* prompt tokens                           */
    size_t decode_tokens;      /* tokens sampled after decode-only steps  */
    size_t prefix_hit_tokens;  /* prompt tokens whose KV came from the
                                 prefix cache (not computed)             */
    size_t prefix_miss_tokens; /* prompt tokens computed                  */
    size_t preemptions;        /* sequences preempted (KV pool full)      */
    double sample_ms;          /* sampling the logits (after the steps)   */
    double detok_ms;           /* detokenizing and stop-string matching   */
} ie_gen_stats_t;

#endif

/* ie_jinja.h — the Jinja subset that models' chat templates use.
 *
 * Renders a Hugging Face `chat_template` the way transformers'
 * apply_chat_template does (jinja2 ImmutableSandboxedEnvironment with
 * trim_blocks=True, lstrip_blocks=True, loop controls, and the globals
 * raise_exception, strftime_now, namespace, dict plus transformers' own
 * `tojson` filter: json.dumps with ensure_ascii=False). Values follow Python:
 * none/bool/int/float/string/list/dict, str() and repr() of them, Python
 * string methods (split, strip, startswith, ...), Jinja's undefined.
 *
 * Supported: {{ }}, {% %}, {# #} with "-" / "+" whitespace control; if /
 * elif / else, for (else, loop.*, inline if, tuple targets, break /
 * continue), set (names, tuples, ns.attr), macro with defaults and keyword
 * arguments, generation blocks (transparent); the filters and tests listed
 * in jinja.c. Anything else (an unknown tag, filter, test, method or global)
 * is an error naming it and its line, at parse time where it can be known
 * then, else when the template reaches it.
 *
 * Every string carries an optional per-byte mask: the variables' strings are
 * "content" (1), the template's literals are not (0), and operations carry
 * the mask along (concatenation, slices, strip, split, join, ...), so the
 * rendered prompt says which bytes came from the caller's data. ie_chat uses
 * it to keep a user's "<|im_end|>" from becoming a control token.
 *
 * All memory of a render lives in one arena freed at its end; the compiled
 * template owns its own. Bounded: nesting depth, recursion depth, evaluation
 * steps, output size and arena size (ie_jinja_opts_t).
 */
#ifndef IE_JINJA_H
#define IE_JINJA_H

#include "ie_status.h"

#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef struct ie_jinja ie_jinja_t;

typedef struct ie_jinja_opts {
    /* strftime_now's clock: used when has_now, else time(NULL); local time */
    int has_now;
    time_t now;
    size_t max_output;  /* bytes of rendered text; 0 = 16 MiB            */
    size_t max_memory;  /* bytes of arena per render; 0 = 256 MiB         */
    uint64_t max_steps; /* evaluation steps; 0 = 50 million             */
} ie_jinja_opts_t;

/* Compile template text src[0..len). On success *out is the template
 * (ie_jinja_destroy frees it). Errors: IE_ERR_FORMAT with "chat template line
 * N: ..." (syntax error, unknown tag / filter / test, nesting too deep),
 * IE_ERR_NOMEM. */
ie_status_t ie_jinja_parse(const char *src, size_t len, ie_jinja_t **out);

/* The text the template was compiled from (NUL-terminated, valid as long
 * as t), e.g. to detect a model's tool-call markup; NULL for NULL t. */
const char *ie_jinja_source(const ie_jinja_t *t);

/* Free a template; *t becomes NULL. NULL and *t == NULL are fine. */
void ie_jinja_destroy(ie_jinja_t **t);

/* Render with the variables of vars_json (a JSON object, NUL-terminated;
 * its strings, keys included, are marked as content) and of trusted_json
 * (a JSON object or NULL; its strings are template text, for special tokens
 * such as bos_token; it wins on a name in both). On success *text_out is a malloc'd
 * NUL-terminated string of *len_out bytes and, if mask_out is not NULL,
 * *mask_out a malloc'd array of *len_out bytes, 1 where the byte came from a
 * variable's string (the caller frees both). opts may be NULL.
 * Errors: IE_ERR_INVAL "chat template raised: <message>" when the template
 * calls raise_exception (*raised, if not NULL, is set to 1 then, else 0);
 * IE_ERR_INVAL "chat template line N: ..." for a runtime error (undefined
 * attribute, type error, unsupported construct, limit reached);
 * IE_ERR_FORMAT vars_json / trusted_json is not a JSON object; IE_ERR_NOMEM. */
ie_status_t ie_jinja_render(const ie_jinja_t *t, const char *vars_json, const char *trusted_json,
                            const ie_jinja_opts_t *opts, char **text_out, uint8_t **mask_out, size_t *len_out,
                            int *raised);

#endif

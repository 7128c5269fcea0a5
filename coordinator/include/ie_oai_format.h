/* ie_oai_format.h — OpenAI's `response_format` request field, read into
 * the engine's structured-output setting (ie_gen_params_t.json_schema).
 */
#ifndef IE_OAI_FORMAT_H
#define IE_OAI_FORMAT_H

#include "ie_status.h"

struct cJSON;

/* rf: the request's "response_format" value (NULL when absent).
 *   absent, null, {"type": "text"}            -> *schema_out = NULL
 *   {"type": "json_object"}                    -> ""   (any JSON object)
 *   {"type": "json_schema", "json_schema": {"name": ..., "schema": {...},
 *    "strict": ...}}                           -> the schema, as JSON text
 *     (no "schema": any JSON object; "strict" is accepted either way: the
 *     output always follows the schema)
 * The schema is compiled once here, so an unsupported keyword fails now.
 * IE_ERR_INVAL with a message that names the field or keyword. Caller
 * frees *schema_out (malloc'd; NULL on failure or for text). */
ie_status_t ie_oai_response_format(const struct cJSON *rf, char **schema_out);

#endif

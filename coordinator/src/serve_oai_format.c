/* serve_oai_format.c — `response_format` -> json_schema (ie_oai_format.h). */
#include "ie_oai_format.h"
#include "ie_grammar.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

ie_status_t ie_oai_response_format(const cJSON *rf, char **schema_out)
{
    ie_status_t st = IE_OK;
    ie_grammar_t *g = NULL;
    char *text = NULL;
    *schema_out = NULL;
    if (!rf || cJSON_IsNull(rf)) return IE_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(t))
        return ie_error_set(IE_ERR_INVAL,
                            "'response_format' must be an object with a \"type\": \"text\", \"json_object\" or "
                            "\"json_schema\"");
    if (!strcmp(t->valuestring, "text")) return IE_OK;
    if (!strcmp(t->valuestring, "json_object")) {
        text = strdup("");
    } else if (!strcmp(t->valuestring, "json_schema")) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
        if (!cJSON_IsObject(js))
            return ie_error_set(IE_ERR_INVAL, "'response_format.json_schema' must be an object");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
        const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
        if (name && !cJSON_IsString(name))
            return ie_error_set(IE_ERR_INVAL, "'response_format.json_schema.name' must be a string");
        if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
            return ie_error_set(IE_ERR_INVAL, "'response_format.json_schema.strict' must be a boolean");
        if (!schema || cJSON_IsNull(schema)) text = strdup("");
        else if (cJSON_IsObject(schema) || cJSON_IsBool(schema)) text = cJSON_PrintUnformatted(schema);
        else return ie_error_set(IE_ERR_INVAL, "'response_format.json_schema.schema' must be a JSON Schema object");
    } else {
        return ie_error_set(IE_ERR_INVAL,
                            "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\" (got "
                            "\"%.64s\")",
                            t->valuestring);
    }
    if (!text) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    if ((st = ie_grammar_compile(text, &g)) != IE_OK) {
        free(text);
        return st;
    }
    ie_grammar_destroy(&g);
    *schema_out = text;
    return IE_OK;
}

/* oai_err.c — OpenAI-shaped error answers (ie_oai_err.h). */
#include "ie_oai_err.h"

#include <stdio.h>

/* Contract (ie_oai_err.h). */
int ie_oai_err_vset(ie_oai_err_t *e, unsigned status, const char *type, const char *code, const char *param,
                    const char *fmt, va_list ap)
{
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    return -1;
}

/* Contract (ie_oai_err.h). */
int ie_oai_err_set(ie_oai_err_t *e, unsigned status, const char *type, const char *code, const char *param,
                   const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ie_oai_err_vset(e, status, type, code, param, fmt, ap);
    va_end(ap);
    return -1;
}

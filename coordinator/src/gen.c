/* gen.c — defaults and names of the generation parameters (ie_gen.h). */
#include "ie_gen.h"

#include <string.h>

void ie_gen_params_default(ie_gen_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->max_new = 128;
    p->sampling = ie_sampler_params_default();
    p->add_special = 1;
    p->parse_special = 1;
}

const char *ie_finish_name(ie_finish_t r)
{
    switch (r) {
    case IE_FINISH_NONE: return "none";
    case IE_FINISH_EOS: return "eos";
    case IE_FINISH_STOP: return "stop";
    case IE_FINISH_LENGTH: return "length";
    case IE_FINISH_CONTEXT: return "context";
    }
    return "none";
}

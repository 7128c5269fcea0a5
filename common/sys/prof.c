/* prof.c — the counters of ie_prof.h. */
#include "ie_prof.h"

atomic_int ie_prof_enabled;
_Atomic uint64_t ie_prof_ns[IE_PROF_N];

void ie_prof_enable(int on) { atomic_store_explicit(&ie_prof_enabled, on ? 1 : 0, memory_order_relaxed); }

void ie_prof_reset(void)
{
    for (int i = 0; i < IE_PROF_N; i++) atomic_store_explicit(&ie_prof_ns[i], 0, memory_order_relaxed);
}

uint64_t ie_prof_get(int cls)
{
    return cls >= 0 && cls < IE_PROF_N ? atomic_load_explicit(&ie_prof_ns[cls], memory_order_relaxed) : 0;
}

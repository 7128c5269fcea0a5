/* ie_prof.h — per-kernel-class time for `--profile` (common/sys/prof.c).
 *
 * The worker's forward pass brackets each class of work (a matmul by its
 * weights' dtype, attention, norms, activation quantization, tensor-plan
 * reductions, element-wise ops) with ie_prof_begin / ie_prof_end on the
 * thread that drives the step (the wall time of the parallel job). When
 * profiling is off the cost is one relaxed atomic load per bracket: no clock
 * is read and nothing is written.
 *
 * Counters are process-wide; in-process plan workers add to the same ones
 * (their times are then summed over the workers).
 */
#ifndef IE_PROF_H
#define IE_PROF_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

enum {
    IE_PROF_MATMUL = 0, /* + the weights' ie_dtype_t (< IE_PROF_MATMUL_N) */
    IE_PROF_MATMUL_N = 128,
    IE_PROF_ATTENTION = IE_PROF_MATMUL_N, /* scores, softmax, weighted V      */
    IE_PROF_NORM,                         /* RMS / layer norms                */
    IE_PROF_ACT_QUANT,                    /* activations into the kernels' format */
    IE_PROF_REDUCE,                       /* tensor-plan partial-sum reductions */
    IE_PROF_ELEMENTWISE,                  /* RoPE, KV stores, SwiGLU, residual adds */
    IE_PROF_LORA, /* adapters' expand pass (their shrink runs inside the matmul job it joins) */
    IE_PROF_N
};

extern atomic_int ie_prof_enabled;
extern _Atomic uint64_t ie_prof_ns[IE_PROF_N];

static inline uint64_t ie_prof_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A start time when profiling is on, else 0 (then ie_prof_end does nothing). */
static inline uint64_t ie_prof_begin(void)
{
    return atomic_load_explicit(&ie_prof_enabled, memory_order_relaxed) ? ie_prof_clock_ns() : 0;
}

/* Add the time since t0 (from ie_prof_begin) to class cls (0..IE_PROF_N). */
static inline void ie_prof_end(int cls, uint64_t t0)
{
    if (t0 && cls >= 0 && cls < IE_PROF_N)
        atomic_fetch_add_explicit(&ie_prof_ns[cls], ie_prof_clock_ns() - t0, memory_order_relaxed);
}

/* Turn profiling on (1) or off (0); reset zeroes every counter. */
void ie_prof_enable(int on);
void ie_prof_reset(void);
/* Nanoseconds counted for class cls so far (0 for a bad class). */
uint64_t ie_prof_get(int cls);

#endif

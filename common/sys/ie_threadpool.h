/* ie_threadpool.h — a persistent fork-join thread pool.
 *
 * n threads in all: the calling thread is thread 0, n-1 workers wait
 * (spinning briefly, then sleeping on a condition variable) for the next job.
 * ie_threadpool_run() is a full barrier: it returns once every thread has
 * finished fn. Workers may be pinned one per core (ie_threadpool_new's `pin`;
 * overridden by env IE_TP_USE_AFFINITY=0/1).
 */
#ifndef IE_THREADPOOL_H
#define IE_THREADPOOL_H

#include "ie_status.h"

typedef struct ie_threadpool ie_threadpool_t;

typedef void (*ie_task_fn)(void *ctx, int ith, int nth);

/* Start a pool of n_threads (>= 1; 0 means one per online CPU). Caller owns
 * *out and must destroy it. */
ie_status_t ie_threadpool_new(int n_threads, int pin, ie_threadpool_t **out);

/* Stop and join all workers; *self_p = NULL. Accepts NULL. */
void ie_threadpool_destroy(ie_threadpool_t **self_p);

int ie_threadpool_size(const ie_threadpool_t *tp);

/* The CPU thread ith (0 = the owner) was pinned to, or -1 when the pool
 * does not pin it (pin off, more threads than CPUs, or pinning failed for
 * the owner). Share ith of a job normally runs on thread ith; the owner
 * may run a share whose thread has not woken yet. */
int ie_threadpool_cpu(const ie_threadpool_t *tp, int ith);

/* Run fn(ctx, ith, nth) on every thread (ith = 0..nth-1) and wait. Not
 * reentrant: call from the owning thread only. */
void ie_threadpool_run(ie_threadpool_t *tp, ie_task_fn fn, void *ctx);

/* Work a worker thread may do between jobs, e.g. prefetching the memory
 * the next job will stream. After every job a worker calls
 * fn(ctx, ith, nth, tp, gen) (ith: the worker's own thread number,
 * 1..nth-1, whichever share it ran; gen: the job just finished). fn must
 * return soon after ie_threadpool_idle_over(tp, gen) turns 1 (checked every
 * few hundred nanoseconds of work), as the next job waits for it; it must
 * only read memory nobody writes meanwhile. */
typedef void (*ie_idle_fn)(void *ctx, int ith, int nth, const ie_threadpool_t *tp, unsigned gen);
typedef struct ie_idle {
    ie_idle_fn fn;
    void *ctx;
} ie_idle_t;

/* Install the hook *idle (NULL: none), from the owning thread. What the
 * owner wrote before the call is visible to the hook. *idle and its ctx
 * must stay valid and unchanged until the pool is destroyed: a worker may
 * still be in a hook installed earlier. */
void ie_threadpool_set_idle(ie_threadpool_t *tp, const ie_idle_t *idle);

/* 1 once a job after `gen` has been published or the pool is stopping. */
int ie_threadpool_idle_over(const ie_threadpool_t *tp, unsigned gen);

/* Split [0, n) into nth contiguous shares; share ith is [*b, *e). */
void ie_split_range(long n, int ith, int nth, long *b, long *e);

#endif

/* ie_shmreduce.h — the all-reduce of tensor-parallel ranks that share a
 * host, over POSIX shared memory instead of ZeroMQ (issue 5).
 *
 * Every rank creates one segment when it loads its assignment (before it
 * answers READY), named after the cluster's random id, the epoch and its
 * rank, so concurrent clusters on one host never meet:
 *
 *   header   magic, version, identity (cluster id, epoch, rank, ranks,
 *            capacity), the rank's vote, a publish counter (futex word),
 *            a sleeper count, and the sequence number of each buffer
 *   buffers  2 × max_floats f32 partial sums, used alternately
 *
 * A reduction (step, index) writes the rank's partial into its next buffer
 * and release-stores the buffer's sequence number; then it waits for each
 * peer's buffer holding the same (step, index) — spinning for a short while,
 * then sleeping on the peer's futex word — and sums the parts in rank
 * order, the very expression of the ZeroMQ path, so the bits are the same.
 *
 * Two buffers are enough: a rank publishes its (k+2)-th partial into the
 * buffer of its k-th only after the (k+1)-th completed, i.e. after every
 * peer published its (k+1)-th, which each did after it had finished reading
 * our k-th. A reader also re-checks the sequence number after reading (a
 * seqlock), so even a peer that gave up on a reduction (timeout) and moved
 * on cannot hand it torn data.
 *
 * Deciding: at its first reduction each rank opens every peer's segment
 * and checks it (magic, version, identity, size), then votes in its own
 * header: "shm" if all opened, "zmq" otherwise. A rank that voted shm waits
 * for every peer's vote and uses shared memory only if all voted shm; so a
 * cluster with any remote rank, any rank built without this module or run
 * with IE_TP_SHM=0 (it creates no segment: the others cannot open it) uses
 * ZeroMQ on every rank. Once all voted shm, every peer has mapped our
 * segment and its name is unlinked: a kill -9 after that leaves nothing in
 * /dev/shm (the mappings stay valid).
 *
 * One rank's handle is used by one thread at a time.
 */
#ifndef IE_SHMREDUCE_H
#define IE_SHMREDUCE_H

#include "ie_status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ie_shmreduce ie_shmreduce_t;

typedef struct ie_shmreduce_opts {
    uint64_t cluster_id; /* random, the same on every rank (ASSIGN); != 0  */
    uint64_t epoch;      /* cluster generation                             */
    int rank, n_ranks;   /* 0 <= rank < n_ranks <= 64, n_ranks >= 2        */
    size_t max_floats;   /* largest reduction (max_batch × n_embd)         */
    int spin_us;         /* spin this long before sleeping (0: 50 µs;
                            < 0: sleep at once)                            */
} ie_shmreduce_opts_t;

/* 0 when the environment says IE_TP_SHM=0 (ZeroMQ only), else 1. */
int ie_shmreduce_enabled(void);

/* Create this rank's segment (shm_open + ftruncate + mmap) and fill its
 * header; unlink the names of this cluster's earlier epochs that are still
 * there (left by a rank killed before its peers voted). *out is owned by
 * the caller (ie_shmreduce_destroy). Errors:
 * IE_ERR_UNSUPPORTED when IE_TP_SHM=0 or cluster_id is 0, IE_ERR_INVAL on
 * bad options, IE_ERR_IO / IE_ERR_NOMEM when the segment cannot be made. */
ie_status_t ie_shmreduce_new(const ie_shmreduce_opts_t *o, ie_shmreduce_t **out);

/* Unmap everything and unlink the own segment's name if still linked.
 * Accepts NULL and a NULL *self_p; sets *self_p to NULL. */
void ie_shmreduce_destroy(ie_shmreduce_t **self_p);

/* Decide (once) whether the cluster reduces through shared memory: open
 * and check the peers' segments, vote, wait up to timeout_ms for the other
 * votes. IE_OK: every rank voted shm (ie_shmreduce_run may be used);
 * IE_ERR_UNSUPPORTED: the cluster uses ZeroMQ (final, every rank decides
 * so); IE_ERR_UNAVAILABLE: a peer's vote did not come in time (the
 * decision is still open: call again). Later calls answer at once. */
ie_status_t ie_shmreduce_attach(ie_shmreduce_t *s, int timeout_ms);

/* Reduction `index` of step `step` (step < 2^43, index < 2^20; the pair
 * increases from call to call on every rank): replace buf[0..n) by the
 * rank-order sum of every rank's buf. n <= max_floats and the same on
 * every rank. Needs a successful ie_shmreduce_attach. IE_ERR_UNAVAILABLE
 * when a peer did not publish it within timeout_ms or has already gone
 * past it (it failed this reduction); buf is then unspecified. */
ie_status_t ie_shmreduce_run(ie_shmreduce_t *s, uint64_t step, int index, float *buf, size_t n, int timeout_ms);

/* buf[j] = part[0][j] + part[1][j] + ... + part[n_ranks-1][j], added in rank
 * order. The one expression of a tensor-parallel sum, shared by both
 * transports (this one and node.c's ZeroMQ path) so every rank gets the
 * same bits whichever carried the parts. buf may be one of the parts
 * (element j reads every part's j before writing it). */
void ie_reduce_rank_sum(float *buf, const float *const *part, int n_ranks, size_t n);

#endif

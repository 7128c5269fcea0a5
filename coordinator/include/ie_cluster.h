/* ie_cluster.h — the coordinator's side of the distributed service: worker
 * registration, shard assignment, heartbeats, and steps over the network.
 *
 * The cluster binds a ROUTER; workers (ie_node_run) connect, say HELLO and
 * are given a rank of the plan (the rank they ask for when free, else the
 * lowest free one). Every change of membership starts a new epoch: each
 * rank is (re)ASSIGNed with the new peer table; a worker whose shard did
 * not change keeps its weights. The cluster is ready when every rank has
 * answered READY for the current epoch.
 *
 * Steps: the batch goes to every tensor rank (or to pipeline stage 0, the
 * stages then hop), the rank(s) with the head answer with logits, which
 * the cluster assembles into rows of n_vocab. While it waits it answers
 * registrations and watches heartbeats: a rank silent for dead_ms (or whose
 * step failed) fails the step with IE_ERR_UNAVAILABLE naming the worker —
 * never a hang — and the cluster stays up, not ready, until a worker takes
 * the empty rank again. A step that is not answered within step_timeout_ms
 * although every rank still heartbeats (a pipeline stage whose next stage
 * cannot be reached queues the hidden state forever) fails the same way:
 * the ranks that owe an answer are counted in ie_step_timeouts_total, shown
 * down (ie_worker_up 0) and assigned again in a new epoch, so they drop
 * what is stuck and must answer READY before the next step. The systemd
 * watchdog is fed only while no step is overdue.
 */
#ifndef IE_CLUSTER_H
#define IE_CLUSTER_H

#include "ie_backend.h"
#include "ie_metrics.h"
#include "ie_model_src.h"
#include "ie_transport.h"
#include "ie_worker.h"

typedef struct ie_cluster ie_cluster_t;

#define IE_CLUSTER_STEP_TIMEOUT_MS 30000

typedef struct ie_cluster_opts {
    const char *bind;     /* ROUTER endpoint workers connect to      */
    ie_shard_kind_t plan; /* PIPELINE or TENSOR                      */
    int n_ranks;          /* workers in the plan (>= 1)              */
    int n_ctx, n_seq, max_batch;
    int kv_block, kv_blocks;           /* paged KV (ie_worker_opts_t); 0: defaults */
    uint64_t kv_mem_bytes;             /* with kv_blocks 0 and this > 0: each rank's
                                          KV memory; the pool is the fewest blocks
                                          any rank's layers and heads fit in it
                                          (ie_worker_kv_budget_blocks)           */
    ie_kv_type_t kv_type_k, kv_type_v; /* cache types (ie_worker_opts_t) */
    ie_kv_rotate_t kv_rotate;
    int kv_swa_full; /* ie_worker_opts_t.kv_swa_full                      */
    ie_precision_t precision;
    int heartbeat_ms;      /* default 250                             */
    int dead_ms;           /* default 2000                            */
    int step_timeout_ms;   /* a step unanswered this long fails (0:
                              IE_CLUSTER_STEP_TIMEOUT_MS)              */
    ie_net_t *net;         /* context (required; shared for inproc)   */
    ie_metrics_t *metrics; /* optional                                */
    int verbose;           /* log membership changes to stderr        */
} ie_cluster_opts_t;

/* The model src gives the shapes and the fingerprint workers must match;
 * the plan is checked against it (IE_ERR_INVAL naming the limit). src must
 * outlive the cluster. Caller owns *out. */
ie_status_t ie_cluster_new(const ie_cluster_opts_t *o, const ie_model_src_t *src, ie_cluster_t **out);

/* Send BYE to every worker and close. Accepts NULL. */
void ie_cluster_destroy(ie_cluster_t **c_p);

/* The endpoint actually bound (port resolved). */
const char *ie_cluster_endpoint(const ie_cluster_t *c);

/* Serve registrations and heartbeats for up to timeout_ms (returns early
 * when the cluster becomes ready). 1 ready, 0 not (yet). */
int ie_cluster_service(ie_cluster_t *c, int timeout_ms);

/* Wait until ready: IE_OK, or IE_ERR_TIMEOUT naming the missing ranks. */
ie_status_t ie_cluster_wait_ready(ie_cluster_t *c, int timeout_ms);

int ie_cluster_ready(const ie_cluster_t *c);

/* One step across the workers: like ie_worker_step (logits rows of n_vocab
 * for the tokens that asked, in batch order). Not ready, a lost worker or
 * a worker's error -> that status with a one-line reason. */
ie_status_t ie_cluster_step(ie_cluster_t *c, const ie_batch_t *b, float *logits_out);

/* The caller's word on the next ie_cluster_step (it holds for that one
 * step; without a word, 1): 1 when the step after it will likely be the
 * same slots at their next positions (no request about to join or to end
 * by length), so the cluster may send that step ahead, chained
 * (docs/PROTOCOL.md, "Chained steps"); 0 when it will not, to spare the
 * ranks a step that would be dropped. Results never depend on it: a step
 * sent ahead is used only when the next batch is exactly it. The cluster
 * chains only when it has a CPU the ranks' threads do not fill (on one
 * host, fewer rank threads than its CPUs); IE_LOOKAHEAD=1 / 0 in the
 * environment turns chaining on / off regardless. */
void ie_cluster_lookahead(ie_cluster_t *c, int ok);

/* Forget a slot on every worker (queued like the operations below; a bad
 * slot is ignored, as ie_worker_seq_clear does). */
void ie_cluster_seq_clear(ie_cluster_t *c, int seq);
/* Paged KV (ie_worker_kv_bind / ie_worker_seq_set_len): the arguments are
 * checked here against the pool the workers build (IE_ERR_RANGE), the
 * operations queued and sent to every rank with the next step, applied
 * before it in call order — clears included, one ordered list
 * (docs/PROTOCOL.md, "KV operations"). On the workers they apply up to the
 * first one refused (e.g. a length over an unbound block), which fails the
 * step; a step whose tokens are refused leaves them applied, as on an
 * embedded worker. One step carries at most IE_PROTO_KV_IDS_MAX block ids:
 * a bind past that is IE_ERR_RANGE (run a step first). A worker that
 * registers anew starts with the default tables and no K/V: after an
 * IE_ERR_UNAVAILABLE step the caller rebinds what it uses again. */
ie_status_t ie_cluster_kv_bind(ie_cluster_t *c, int seq, int first, const int32_t *pb, int n);
ie_status_t ie_cluster_seq_set_len(ie_cluster_t *c, int seq, int n_pos);

/* A one-line description of the members ("rank 0: pid 12 on host, node 0,
 * ready; rank 1: empty"), for logs and the CLI's JSON line. */
void ie_cluster_describe(const ie_cluster_t *c, char *out, size_t cap);

/* Totals over the workers' reports: compute and transfer time, bytes on
 * the wire (both directions, headers included), steps. */
typedef struct ie_cluster_stats {
    double compute_ms, transfer_ms;
    uint64_t bytes_sent, bytes_received;
    uint64_t steps;
    double step_ms;             /* wall time inside ie_cluster_step       */
    uint64_t lookahead_used;    /* chained steps sent ahead and used      */
    uint64_t lookahead_dropped; /* ... and dropped (the batch differed)    */
} ie_cluster_stats_t;
void ie_cluster_stats(const ie_cluster_t *c, ie_cluster_stats_t *out);

/* The cluster as a backend (ie_backend.h): step, KV operations, the
 * lookahead hint, readiness and upkeep (ie_cluster_service) are the
 * cluster's; the geometry is its options' with ie_worker_new's defaults
 * resolved. Takes *c_p in every case (*c_p becomes NULL; on failure the
 * cluster is destroyed); ie_backend_destroy destroys it (BYE to the
 * workers). Caller owns *out. */
ie_status_t ie_backend_cluster_new(ie_cluster_t **c_p, ie_backend_t **out);

#endif

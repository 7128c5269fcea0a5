/* ie_node.h — a worker process's runtime: registration, shard loading and
 * the step loop of the distributed service (docs/OPERATIONS.md,
 * docs/PROTOCOL.md).
 *
 * A node connects to the coordinator (DEALER), says HELLO, is ASSIGNed a
 * rank and shard, loads it (ie_worker with opts.shard), answers READY, and
 * then runs STEPs: from the coordinator (tensor ranks, pipeline stage 0) or
 * from the previous pipeline stage (its PULL "peer" socket). Tensor ranks
 * exchange PARTIAL sums with every other rank (PUSH to each peer's PULL);
 * pipeline stages pass STEP + hidden state to the next stage; the rank(s)
 * with the output head send RESULT with their logits to the coordinator.
 * A heartbeat thread (its own socket) reports liveness every heartbeat_ms,
 * also while a step computes. A node that hears nothing from the
 * coordinator for dead_ms registers again (keeping its loaded shard when
 * the new assignment is the same), so a restarted coordinator or worker
 * rejoins by itself.
 */
#ifndef IE_NODE_H
#define IE_NODE_H

#include "ie_metrics.h"
#include "ie_status.h"
#include "ie_transport.h"

#include <signal.h>

typedef struct ie_node_opts {
    const char *model_path;      /* the worker's local copy                 */
    const char *coordinator;     /* endpoint of the coordinator's ROUTER    */
    const char *coordinator_key; /* its CURVE public key (secure net)       */
    const char *peer_bind;       /* where to bind the peer socket           */
    const char *advertise;       /* host peers should use for a tcp peer
                                    endpoint (NULL: as bound)               */
    int rank;                    /* rank asked for (-1: any)                */
    int n_threads;               /* compute threads (>= 1)                  */
    int pin_threads;             /* pin them                                */
    int numa_node;               /* node to bind to (-1: from the policy)   */
    const char *numa_policy;     /* NULL: env NUMA_POLICY, else "auto"      */
    const char *affinity;        /* NULL: env AFFINITY; "auto", "none" or a
                                    CPU list "0-3,8" for the pool           */
    ie_net_t *net;               /* shared context (inproc), or NULL: own   */
    ie_metrics_t *metrics;       /* optional: worker series are added       */
    volatile sig_atomic_t *stop; /* set non-zero to leave the loop          */
    int verbose;                 /* log registration and state changes      */
    int quiet;                   /* do not log load failures (in-process
                                    workers: the engine reports them)       */
    const char *lora_dir;        /* NULL: LoRA adapters are read at the
                                    paths the coordinator sends; else at
                                    lora_dir/<last part of that path> (this
                                    host keeps its adapters elsewhere)      */
} ie_node_opts_t;

void ie_node_opts_default(ie_node_opts_t *o);

/* Run until *stop, a BYE from the coordinator, or a fatal local error
 * (model unreadable: IE_ERR_IO/IE_ERR_FORMAT). Transient trouble (lost
 * coordinator, failed shard load, peer gone) is logged and retried. */
ie_status_t ie_node_run(const ie_node_opts_t *o);

#endif

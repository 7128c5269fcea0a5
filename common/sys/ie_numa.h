/* ie_numa.h — topology (hwloc) and placement (libnuma).
 *
 * A worker asks which node it should run on under a policy, binds its
 * threads' CPUs and its memory to that node, and reports what it found.
 * On a machine with one node (or without NUMA support) everything works
 * and reports node 0.
 *
 * Policies (NUMA_POLICY env or config):
 *   auto        socket:<rank % n_nodes> when there are several nodes, else
 *               no binding
 *   compact     ranks fill node 0 first (all on node 0 while it has cores
 *               for them, then node 1, ...)
 *   scatter     rank r on node r % n_nodes
 *   socket:<id> node <id> (an id that does not exist is IE_ERR_INVAL)
 *   none        no binding
 */
#ifndef IE_NUMA_H
#define IE_NUMA_H

#include "ie_status.h"

#include <stddef.h>

typedef struct ie_topo {
    int n_nodes;        /* NUMA nodes (>= 1)                          */
    int n_packages;     /* sockets                                    */
    int n_cores;        /* physical cores                             */
    int n_pus;          /* hardware threads                           */
    int node_cores[64]; /* cores per node (first 64 nodes)            */
} ie_topo_t;

/* Read the machine's topology with hwloc. */
ie_status_t ie_topo_read(ie_topo_t *t);

/* One line: "nodes=1 packages=1 cores=2 pus=2 node0:cores=2". */
void ie_topo_describe(const ie_topo_t *t, char *out, size_t cap);

/* The node for `rank` of `n_ranks` under `policy` (NULL or "" = "auto");
 * -1 means no binding. IE_ERR_INVAL for an unknown policy or node. */
ie_status_t ie_numa_pick(const ie_topo_t *t, const char *policy, int rank, int n_ranks, int *node_out);

/* Bind the calling thread (and threads it creates later) to the CPUs of
 * `node` and set the process's memory policy to prefer/bind that node
 * (libnuma). node < 0: nothing. */
ie_status_t ie_numa_bind(int node);

/* Allocate n bytes on `node` (numa_alloc_onnode; node < 0: mmap'd
 * anywhere), page-aligned; free with ie_numa_free(p, n). NULL on failure. */
void *ie_numa_alloc(size_t n, int node);
void ie_numa_free(void *p, size_t n);

/* The node CPU `cpu` belongs to (libnuma numa_node_of_cpu); 0 without
 * NUMA support; -1 for cpu < 0 or a CPU libnuma does not know. */
int ie_numa_node_of_cpu(int cpu);

#endif

/* numa.c — machine topology (hwloc) and NUMA placement (libnuma); see
 * ie_numa.h.
 *
 * hwloc answers "what is there" (nodes, packages, cores, threads and which
 * cores sit on which node) the same way on every machine, NUMA or not;
 * libnuma does the binding. Where the kernel has no NUMA support
 * (numa_available() < 0) the machine is treated as a single node 0:
 * binding to it is a no-op and allocations come from plain mmap.
 */
#define _GNU_SOURCE
#include "ie_numa.h"

#include <errno.h>
#include <hwloc.h>
#include <numa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define IE_TOPO_MAX_NODES ((int)(sizeof(((ie_topo_t *)0)->node_cores) / sizeof(int)))

/* Contract: fills *t from hwloc. Every count is >= 1 (a machine where hwloc
 * sees no cores counts its hardware threads as cores). IE_ERR_IO when hwloc
 * cannot load the topology. */
ie_status_t ie_topo_read(ie_topo_t *t)
{
    ie_status_t st = IE_OK;
    hwloc_topology_t topo = NULL;
    int inited = 0;

    if (!t) return ie_error_set(IE_ERR_INVAL, "ie_topo_read: t is NULL");
    memset(t, 0, sizeof *t);
    if (hwloc_topology_init(&topo) != 0) {
        st = ie_error_set(IE_ERR_IO, "hwloc: cannot initialise a topology");
        goto cleanup;
    }
    inited = 1;
    if (hwloc_topology_load(topo) != 0) {
        st = ie_error_set(IE_ERR_IO, "hwloc: cannot load the topology: %s", strerror(errno));
        goto cleanup;
    }
    t->n_nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    t->n_packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    t->n_cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    t->n_pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    if (t->n_pus < 1) t->n_pus = 1;
    if (t->n_cores < 1) t->n_cores = t->n_pus;
    if (t->n_packages < 1) t->n_packages = 1;
    if (t->n_nodes < 1) t->n_nodes = 1;

    for (int i = 0; i < t->n_nodes && i < IE_TOPO_MAX_NODES; i++) {
        hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
        int c = 0;
        if (node && node->cpuset) {
            c = hwloc_get_nbobjs_inside_cpuset_by_type(topo, node->cpuset, HWLOC_OBJ_CORE);
            if (c < 1) c = hwloc_get_nbobjs_inside_cpuset_by_type(topo, node->cpuset, HWLOC_OBJ_PU);
        }
        if (c < 0) c = 0;
        t->node_cores[i] = c;
    }
    /* one node that hwloc could not map to CPUs still holds every core */
    if (t->n_nodes == 1 && t->node_cores[0] < 1) t->node_cores[0] = t->n_cores;
cleanup:
    if (inited) hwloc_topology_destroy(topo);
    return st;
}

/* Contract: writes one NUL-terminated line into out (truncated to cap). */
void ie_topo_describe(const ie_topo_t *t, char *out, size_t cap)
{
    if (!out || cap == 0) return;
    out[0] = '\0';
    if (!t) return;
    size_t len = 0;
    int n = snprintf(out, cap, "nodes=%d packages=%d cores=%d pus=%d", t->n_nodes, t->n_packages, t->n_cores,
                     t->n_pus);
    if (n < 0) return;
    len = (size_t)n;
    for (int i = 0; i < t->n_nodes && i < IE_TOPO_MAX_NODES && len < cap; i++) {
        n = snprintf(out + len, cap - len, " node%d:cores=%d", i, t->node_cores[i]);
        if (n < 0) return;
        len += (size_t)n;
    }
}

/* Cores on node i; nodes past the table are assumed to hold an equal share. */
static int node_cores(const ie_topo_t *t, int i)
{
    if (i < IE_TOPO_MAX_NODES && t->node_cores[i] > 0) return t->node_cores[i];
    int share = t->n_cores / (t->n_nodes > 0 ? t->n_nodes : 1);
    return share > 0 ? share : 1;
}

/* Contract: *node_out receives the node for rank `rank` (0 <= rank <
 * n_ranks) under `policy` (see ie_numa.h), or -1 for no binding.
 * IE_ERR_INVAL (with *node_out = -1) for an unknown policy, a socket id
 * that is not a node, or a bad rank. */
ie_status_t ie_numa_pick(const ie_topo_t *t, const char *policy, int rank, int n_ranks, int *node_out)
{
    if (!node_out) return ie_error_set(IE_ERR_INVAL, "ie_numa_pick: node_out is NULL");
    *node_out = -1;
    if (!t || t->n_nodes < 1) return ie_error_set(IE_ERR_INVAL, "ie_numa_pick: no topology");
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
        return ie_error_set(IE_ERR_INVAL, "numa: rank %d of %d is out of range", rank, n_ranks);
    if (!policy || !*policy) policy = "auto";

    if (strcmp(policy, "none") == 0) {
        *node_out = -1;
    } else if (strcmp(policy, "auto") == 0) {
        *node_out = t->n_nodes > 1 ? rank % t->n_nodes : -1;
    } else if (strcmp(policy, "scatter") == 0) {
        *node_out = rank % t->n_nodes;
    } else if (strcmp(policy, "compact") == 0) {
        /* one core per rank: fill node 0's cores, then node 1's, ...; more
         * ranks than cores start over at node 0 */
        int total = 0;
        for (int i = 0; i < t->n_nodes; i++) total += node_cores(t, i);
        int r = rank % (total > 0 ? total : 1);
        int node = 0;
        while (node < t->n_nodes - 1 && r >= node_cores(t, node)) r -= node_cores(t, node++);
        *node_out = node;
    } else if (strncmp(policy, "socket:", 7) == 0) {
        const char *digits = policy + 7;
        char *end = NULL;
        errno = 0;
        long id = strtol(digits, &end, 10);
        if (*digits < '0' || *digits > '9' || *end != '\0' || errno != 0)
            return ie_error_set(IE_ERR_INVAL, "numa: bad node id in policy '%s'", policy);
        if (id >= t->n_nodes)
            return ie_error_set(IE_ERR_INVAL, "numa: policy '%s' names node %ld, but this machine has %d node%s",
                                policy, id, t->n_nodes, t->n_nodes == 1 ? "" : "s");
        *node_out = (int)id;
    } else {
        return ie_error_set(IE_ERR_INVAL, "numa: unknown policy '%s' (auto, compact, scatter, socket:<id> or none)",
                            policy);
    }
    return IE_OK;
}

/* Is `node` a node libnuma can bind to (numa_available() >= 0)? */
static int node_exists(int node)
{
    if (node > numa_max_node()) return 0;
    return numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)node) != 0;
}

/* Contract: node < 0 does nothing. Otherwise the calling thread runs on
 * node's CPUs from now on (threads it creates later inherit this) and its
 * memory policy prefers node. Without NUMA support node 0 is accepted as a
 * no-op. IE_ERR_INVAL for a node that does not exist, IE_ERR_IO when the
 * kernel refuses. */
ie_status_t ie_numa_bind(int node)
{
    if (node < 0) return IE_OK;
    if (numa_available() < 0) {
        if (node == 0) return IE_OK;
        return ie_error_set(IE_ERR_INVAL, "numa: no NUMA support here, so no node %d (only node 0)", node);
    }
    if (!node_exists(node))
        return ie_error_set(IE_ERR_INVAL, "numa: node %d does not exist (highest node is %d)", node,
                            numa_max_node());
    if (numa_run_on_node(node) != 0)
        return ie_error_set(IE_ERR_IO, "numa: cannot run on node %d: %s", node, strerror(errno));
    /* preferred, not bound: a full node spills over instead of OOM-killing */
    numa_set_preferred(node);
    return IE_OK;
}

/* Contract: n bytes of zeroed, page-aligned memory on `node` (node < 0 or
 * no NUMA support: anywhere), owned by the caller and freed with
 * ie_numa_free(p, n). NULL (and a recorded reason) for n == 0, a node that
 * does not exist, or no memory. */
void *ie_numa_alloc(size_t n, int node)
{
    void *p = NULL;
    if (n == 0) {
        ie_error_set(IE_ERR_INVAL, "numa: zero-byte allocation");
        return NULL;
    }
    if (node >= 0 && numa_available() >= 0) {
        if (!node_exists(node)) {
            ie_error_set(IE_ERR_INVAL, "numa: node %d does not exist", node);
            return NULL;
        }
        p = numa_alloc_onnode(n, node);
        if (!p) ie_error_set(IE_ERR_NOMEM, "numa: cannot allocate %zu bytes on node %d", n, node);
        return p;
    }
    if (node > 0) {
        ie_error_set(IE_ERR_INVAL, "numa: no NUMA support here, so no node %d", node);
        return NULL;
    }
    p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        ie_error_set(IE_ERR_NOMEM, "numa: cannot map %zu bytes: %s", n, strerror(errno));
        return NULL;
    }
    return p;
}

/* Contract: frees memory from ie_numa_alloc(n, ...) (the same n). Accepts
 * NULL. Both paths are whole-page mappings (numa_alloc_onnode is mmap plus
 * mbind, numa_free is munmap), so either release undoes either kind. */
void ie_numa_free(void *p, size_t n)
{
    if (!p || n == 0) return;
    if (numa_available() >= 0) numa_free(p, n);
    else munmap(p, n);
}

/* Contract (ie_numa.h). */
int ie_numa_node_of_cpu(int cpu)
{
    if (cpu < 0) return -1;
    if (numa_available() < 0) return 0;
    int node = numa_node_of_cpu(cpu);
    return node >= 0 ? node : -1;
}

/* test_numa.c — topology and placement (ie_numa.h): the machine's topology
 * is sane, every policy picks a node that exists (checked on the real
 * topology and on made-up multi-node ones), bad policies are refused,
 * binding to node 0 works and node-local allocations are usable.
 */
#define _GNU_SOURCE
#include "ie_numa.h"

#include <CUnit/Basic.h>
#include <numa.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static void test_topology(void)
{
    ie_topo_t t;
    CU_ASSERT_EQUAL_FATAL(ie_topo_read(&t), IE_OK);
    CU_ASSERT(t.n_nodes >= 1);
    CU_ASSERT(t.n_packages >= 1);
    CU_ASSERT(t.n_cores >= 1);
    CU_ASSERT(t.n_pus >= t.n_cores);
    int sum = 0;
    for (int i = 0; i < t.n_nodes && i < 64; i++) {
        CU_ASSERT(t.node_cores[i] >= 0);
        sum += t.node_cores[i];
    }
    if (t.n_nodes <= 64) CU_ASSERT_EQUAL(sum, t.n_cores); /* every core on exactly one node */

    char line[512];
    ie_topo_describe(&t, line, sizeof line);
    char want[128];
    snprintf(want, sizeof want, "nodes=%d packages=%d cores=%d pus=%d node0:cores=%d", t.n_nodes, t.n_packages,
             t.n_cores, t.n_pus, t.node_cores[0]);
    CU_ASSERT_EQUAL(strncmp(line, want, strlen(want)), 0);
    printf("\n    topology: %s\n", line);

    /* a short buffer truncates, NUL-terminated */
    char tiny[8];
    ie_topo_describe(&t, tiny, sizeof tiny);
    CU_ASSERT_EQUAL(strlen(tiny), sizeof tiny - 1);
    CU_ASSERT_EQUAL(ie_topo_read(NULL), IE_ERR_INVAL);
}

static void test_describe_fixed(void)
{
    ie_topo_t t = {.n_nodes = 2, .n_packages = 2, .n_cores = 8, .n_pus = 16, .node_cores = {4, 4}};
    char line[128];
    ie_topo_describe(&t, line, sizeof line);
    CU_ASSERT_STRING_EQUAL(line, "nodes=2 packages=2 cores=8 pus=16 node0:cores=4 node1:cores=4");
}

/* Every policy on the machine we run on: the node exists (or -1). */
static void test_pick_this_machine(void)
{
    ie_topo_t t;
    CU_ASSERT_EQUAL_FATAL(ie_topo_read(&t), IE_OK);
    const char *policies[] = {NULL, "", "auto", "compact", "scatter", "socket:0", "none"};
    for (size_t p = 0; p < sizeof policies / sizeof *policies; p++)
        for (int n = 1; n <= 8; n++)
            for (int r = 0; r < n; r++) {
                int node = -2;
                CU_ASSERT_EQUAL(ie_numa_pick(&t, policies[p], r, n, &node), IE_OK);
                CU_ASSERT(node >= -1 && node < t.n_nodes);
            }
    int node = -2;
    CU_ASSERT_EQUAL(ie_numa_pick(&t, "socket:0", 3, 4, &node), IE_OK);
    CU_ASSERT_EQUAL(node, 0);
    CU_ASSERT_EQUAL(ie_numa_pick(&t, "none", 0, 1, &node), IE_OK);
    CU_ASSERT_EQUAL(node, -1);
    if (t.n_nodes == 1) { /* one node: auto does not bind, compact and scatter report node 0 */
        CU_ASSERT_EQUAL(ie_numa_pick(&t, "auto", 1, 2, &node), IE_OK);
        CU_ASSERT_EQUAL(node, -1);
        CU_ASSERT_EQUAL(ie_numa_pick(&t, "scatter", 1, 2, &node), IE_OK);
        CU_ASSERT_EQUAL(node, 0);
        CU_ASSERT_EQUAL(ie_numa_pick(&t, "compact", 5, 8, &node), IE_OK);
        CU_ASSERT_EQUAL(node, 0);
    }
}

/* The policies' arithmetic on a made-up 2-socket, 3-node machine. */
static void test_pick_multinode(void)
{
    ie_topo_t t = {.n_nodes = 3, .n_packages = 2, .n_cores = 7, .n_pus = 14, .node_cores = {2, 3, 2}};
    int node = -2;
    static const int compact[] = {0, 0, 1, 1, 1, 2, 2, 0, 0, 1}; /* 7 cores, then start over */
    for (int r = 0; r < 10; r++) {
        CU_ASSERT_EQUAL(ie_numa_pick(&t, "compact", r, 10, &node), IE_OK);
        CU_ASSERT_EQUAL(node, compact[r]);
        CU_ASSERT_EQUAL(ie_numa_pick(&t, "scatter", r, 10, &node), IE_OK);
        CU_ASSERT_EQUAL(node, r % 3);
        CU_ASSERT_EQUAL(ie_numa_pick(&t, "auto", r, 10, &node), IE_OK);
        CU_ASSERT_EQUAL(node, r % 3);
        CU_ASSERT_EQUAL(ie_numa_pick(&t, NULL, r, 10, &node), IE_OK);
        CU_ASSERT_EQUAL(node, r % 3);
        CU_ASSERT_EQUAL(ie_numa_pick(&t, "none", r, 10, &node), IE_OK);
        CU_ASSERT_EQUAL(node, -1);
        CU_ASSERT_EQUAL(ie_numa_pick(&t, "socket:2", r, 10, &node), IE_OK);
        CU_ASSERT_EQUAL(node, 2);
    }
    CU_ASSERT_EQUAL(ie_numa_pick(&t, "socket:3", 0, 1, &node), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(node, -1);
}

static void test_pick_bad(void)
{
    ie_topo_t t;
    CU_ASSERT_EQUAL_FATAL(ie_topo_read(&t), IE_OK);
    const char *bad[] = {"fastest",   "AUTO",           "socket:",
                         "socket:x",  "socket:-1",      "socket:+0",
                         "socket:0x", "socket: 0",      "socket:99999999999999999999",
                         "compact ",  "scatter,compact"};
    char id[32];
    snprintf(id, sizeof id, "socket:%d", t.n_nodes); /* one past the last node */
    for (size_t i = 0; i <= sizeof bad / sizeof *bad; i++) {
        const char *p = i < sizeof bad / sizeof *bad ? bad[i] : id;
        int node = 7;
        ie_error_clear();
        CU_ASSERT_EQUAL(ie_numa_pick(&t, p, 0, 1, &node), IE_ERR_INVAL);
        CU_ASSERT_EQUAL(node, -1);
        CU_ASSERT(strlen(ie_error_last()) > 0);
    }
    int node;
    CU_ASSERT_EQUAL(ie_numa_pick(&t, "auto", 2, 2, &node), IE_ERR_INVAL); /* rank out of range */
    CU_ASSERT_EQUAL(ie_numa_pick(&t, "auto", -1, 2, &node), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_numa_pick(&t, "auto", 0, 0, &node), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_numa_pick(NULL, "auto", 0, 1, &node), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_numa_pick(&t, "auto", 0, 1, NULL), IE_ERR_INVAL);
}

static void test_bind(void)
{
    cpu_set_t before, after;
    CU_ASSERT_EQUAL_FATAL(sched_getaffinity(0, sizeof before, &before), 0);
    CU_ASSERT_EQUAL(ie_numa_bind(-1), IE_OK); /* no binding: nothing changes */
    CU_ASSERT_EQUAL(sched_getaffinity(0, sizeof after, &after), 0);
    CU_ASSERT(CPU_EQUAL(&before, &after));

    CU_ASSERT_EQUAL(ie_numa_bind(0), IE_OK);
    CU_ASSERT_EQUAL(sched_getaffinity(0, sizeof after, &after), 0);
    CU_ASSERT(CPU_COUNT(&after) >= 1);
    if (numa_available() >= 0) {
        CU_ASSERT_EQUAL(numa_preferred(), 0);
        /* node 0's CPUs: on a one-node machine, every CPU we may use */
        if (numa_max_node() == 0) CU_ASSERT(CPU_EQUAL(&before, &after));
    }

    ie_error_clear();
    CU_ASSERT_EQUAL(ie_numa_bind(4096), IE_ERR_INVAL);
    CU_ASSERT(strlen(ie_error_last()) > 0);

    /* undo: the other tests (and the process) run unbound */
    sched_setaffinity(0, sizeof before, &before);
    if (numa_available() >= 0) numa_set_localalloc();
}

static void check_alloc(int node)
{
    const size_t sizes[] = {1, 4096, 3 * 4096 + 5, 8u << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        unsigned char *p = ie_numa_alloc(sizes[i], node);
        CU_ASSERT_PTR_NOT_NULL_FATAL(p);
        CU_ASSERT_EQUAL((uintptr_t)p % 4096, 0);
        CU_ASSERT_EQUAL(p[0], 0); /* zeroed */
        CU_ASSERT_EQUAL(p[sizes[i] - 1], 0);
        memset(p, 0xAB, sizes[i]); /* all of it is writable */
        CU_ASSERT_EQUAL(p[sizes[i] / 2], 0xAB);
        if (node >= 0 && numa_available() >= 0 && sizes[i] >= 4096) {
            int where = -1;
            void *page = p;
            if (numa_move_pages(0, 1, &page, NULL, &where, 0) == 0) CU_ASSERT_EQUAL(where, node);
        }
        ie_numa_free(p, sizes[i]);
    }
}

static void test_alloc(void)
{
    check_alloc(0);
    check_alloc(-1);
    ie_error_clear();
    CU_ASSERT_PTR_NULL(ie_numa_alloc(4096, 4096)); /* no such node */
    CU_ASSERT(strlen(ie_error_last()) > 0);
    CU_ASSERT_PTR_NULL(ie_numa_alloc(0, 0));
    ie_numa_free(NULL, 4096); /* NULL is fine */
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("numa", NULL, NULL);
    CU_add_test(s, "topology of this machine", test_topology);
    CU_add_test(s, "describe a fixed topology", test_describe_fixed);
    CU_add_test(s, "every policy on this machine", test_pick_this_machine);
    CU_add_test(s, "policies on a 3-node topology", test_pick_multinode);
    CU_add_test(s, "bad policies and ranks", test_pick_bad);
    CU_add_test(s, "bind to node 0", test_bind);
    CU_add_test(s, "alloc/free on node 0 and anywhere", test_alloc);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

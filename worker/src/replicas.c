/* replicas.c — NUMA hot-weight replicas (IE_HOT_REPLICATE, ie_worker.h,
 * docs/OPERATIONS.md): per-node copies of the output head and the embedding
 * table, and the two places that choose a copy (the head matmul, the
 * lookups).
 *
 * Meant for a worker whose pool spans several NUMA nodes (the embedded
 * engine on a multi-socket host); a distributed worker bound to one node
 * already reads local memory. The head is streamed whole every token by
 * every thread, so a remote copy costs the interconnect's bandwidth on
 * every token; the embedding is read a few rows a step but is the head's
 * own buffer when tied.
 */
#include "worker_internal.h"

#include "ie_numa.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The options as the environment overrides them. Only read when asked
 * for, so a stray IE_HOT_REPL_LIMIT_MB does not break a worker. */
static ie_status_t hot_env(const ie_worker_opts_t *o, int *want, double *limit_mb, int *fake)
{
    const char *e = getenv("IE_HOT_REPLICATE");
    char *end = NULL;
    *want = (e && (e[0] == '0' || e[0] == '1') && !e[1]) ? e[0] == '1' : o->hot_replicate > 0;
    *limit_mb = o->hot_repl_limit_mb;
    *fake = 0;
    if (!*want) return IE_OK;
    if ((e = getenv("IE_HOT_REPL_LIMIT_MB")) && *e) {
        errno = 0;
        double v = strtod(e, &end);
        if (*end || errno || !(v >= 0 && v <= 1e9))
            return ie_error_set(IE_ERR_INVAL, "worker: IE_HOT_REPL_LIMIT_MB='%s' is not a size in MiB", e);
        *limit_mb = v;
    }
    if (!(*limit_mb >= 0 && *limit_mb <= 1e9))
        return ie_error_set(IE_ERR_INVAL, "worker: hot_repl_limit_mb %g is not a size in MiB", *limit_mb);
    if ((e = getenv("IE_NUMA_FAKE_NODES")) && *e) {
        errno = 0;
        long v = strtol(e, &end, 10);
        if (*end || errno || v < 1 || v > 64)
            return ie_error_set(IE_ERR_INVAL, "worker: IE_NUMA_FAKE_NODES='%s' (expected 1..64)", e);
        *fake = (int)v;
    }
    return IE_OK;
}

static void fmt_size(char *out, size_t cap, double bytes)
{
    if (bytes >= 1048576.0) snprintf(out, cap, "%.1f MiB", bytes / 1048576.0);
    else snprintf(out, cap, "%.1f KiB", bytes / 1024.0);
}

/* Append to the report (truncated at its size, never overflowing). */
static void hot_say(ie_worker_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void hot_say(ie_worker_t *w, const char *fmt, ...)
{
    size_t len = strlen(w->hot_report);
    if (len + 1 >= sizeof w->hot_report) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->hot_report + len, sizeof w->hot_report - len, fmt, ap);
    va_end(ap);
}

/* w->n_repl copies of m, copy r on node nodes[r] (node 0 for fake nodes);
 * *out receives the [n_repl] descriptors, which differ from m only in where
 * the bytes are. The memory goes to w->repl_mem at once, so destroy frees
 * whatever was made before a failure. */
static ie_status_t hot_copy(ie_worker_t *w, const wmat_t *m, const int *nodes, int fake, const char *name,
                            wmat_t **out)
{
    const size_t bytes = m->slice * (size_t)m->n_mat;
    wmat_t *c = calloc((size_t)w->n_repl, sizeof *c);
    if (!c) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    *out = c;
    for (int r = 0; r < w->n_repl; r++) {
        const int node = fake ? 0 : nodes[r];
        void *p = ie_numa_alloc(bytes, node);
        if (!p) {
            char why[160];
            snprintf(why, sizeof why, "%s", ie_error_last());
            return ie_error_set(IE_ERR_NOMEM, "worker: cannot copy '%s' (%zu bytes) to node %d: %s", name, bytes,
                                node, why);
        }
        size_t k = 0;
        while (w->repl_mem[k]) k++; /* 2 * n_repl slots, at most 2 tensors */
        w->repl_mem[k] = p;
        w->repl_bytes[k] = bytes;
        /* streamed like every weight: huge pages where THP allows
         * (big_alloc's reasoning); then the copy lands on node's pages */
        madvise(p, bytes, MADV_HUGEPAGE);
        memcpy(p, m->data, bytes);
        c[r] = *m;
        c[r].data = p;
        if (m->layout == IE_LAYOUT_BSR && ie_bsr_view(p, bytes, m->n_in, m->n_out, &c[r].bsr, NULL, 0) != 0)
            return ie_error_set(IE_ERR_INTERNAL, "worker: the copy of '%s' is not the blob it copied", name);
    }
    w->hot_copies += w->n_repl;
    return IE_OK;
}

/* Contract (worker_internal.h). Find the pool threads' nodes, then copy the head and the embedding for
 * each node while the cap allows; w->hot_report says what happened. Not
 * asked for: nothing, report "". Fails only on bad settings or memory. */
ie_status_t worker_replicas_new(ie_worker_t *w)
{
    ie_status_t st = IE_OK;
    int want = 0, fake = 0, n = 0, unpinned = 0;
    double limit_mb = 0;
    const int nt = w->opts.n_threads;
    int *node_of = NULL, *nodes = NULL;
    char a[32], b[32];

    if ((st = hot_env(&w->opts, &want, &limit_mb, &fake)) != IE_OK || !want) return st;
    node_of = malloc((size_t)nt * sizeof *node_of);
    nodes = calloc((size_t)nt, sizeof *nodes);
    w->share_repl = calloc((size_t)nt, sizeof *w->share_repl);
    if (!node_of || !nodes || !w->share_repl) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    /* the node of the thread that runs each share: its pinned CPU's */
    for (int i = 0; i < nt; i++) {
        node_of[i] = fake ? i % fake : ie_numa_node_of_cpu(ie_threadpool_cpu(w->tp, i));
        unpinned |= node_of[i] < 0;
    }
    for (int i = 0; i < nt && !unpinned; i++) {
        int r = 0;
        while (r < n && nodes[r] != node_of[i]) r++;
        if (r == n) nodes[n++] = node_of[i];
        w->share_repl[i] = r;
    }
    if (n < 2) {
        ie_topo_t t;
        const int machine = fake ? fake : ie_topo_read(&t) == IE_OK ? t.n_nodes : 1;
        if (machine <= 1) hot_say(w, "1 node: no replicas needed");
        else if (unpinned) hot_say(w, "%d nodes, but the pool's threads are not pinned: no replicas", machine);
        else
            hot_say(w, "%d nodes, the pool's %d thread%s on node %d only: no replicas needed", machine, nt,
                    nt == 1 ? "" : "s", nodes[0]);
        goto cleanup;
    }

    w->n_repl = n;
    w->repl_mem = calloc(2 * (size_t)n, sizeof *w->repl_mem);
    w->repl_bytes = calloc(2 * (size_t)n, sizeof *w->repl_bytes);
    if (!w->repl_mem || !w->repl_bytes) {
        st = ie_error_set(IE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    if (fake) hot_say(w, "%d fake nodes (IE_NUMA_FAKE_NODES, copies on node 0), %d threads:", n, nt);
    else {
        hot_say(w, "%d nodes (", n);
        for (int r = 0; r < n; r++) hot_say(w, "%s%d", r ? "," : "", nodes[r]);
        hot_say(w, "), %d threads:", nt);
    }
    if (!w->sh.has_head && !w->sh.has_embed) hot_say(w, " this shard holds neither head nor embedding");
    const double cap = limit_mb * 1048576.0;
    double used = 0;
    const char *sep = w->sh.has_head || w->sh.has_embed ? " " : "; ";
    const int tied = w->sh.has_head && w->sh.has_embed && w->tok_embd.data == w->output.data;
    /* the head first: every token streams all of it */
    for (int which = 0; which < 2; which++) {
        const wmat_t *m = which == 0 ? &w->output : &w->tok_embd;
        const int held = which == 0 ? w->sh.has_head : w->sh.has_embed;
        const char *name = which == 0 ? (w->arch.tied_output ? "token_embd.weight (tied head)" : "output.weight")
                                      : "token_embd.weight";
        if (!held || !m->data) continue;
        if (which == 1 && tied) {
            if (w->head_repl) {
                if (!(w->embd_repl = calloc((size_t)n, sizeof *w->embd_repl))) {
                    st = ie_error_set(IE_ERR_NOMEM, "out of memory");
                    goto cleanup;
                }
                for (int r = 0; r < n; r++) {
                    w->embd_repl[r] = w->tok_embd;
                    w->embd_repl[r].data = w->head_repl[r].data;
                }
                hot_say(w, ", lookups read the head's copies");
            }
            continue;
        }
        const double need = (double)m->slice * (double)m->n_mat * n;
        fmt_size(a, sizeof a, (double)m->slice * (double)m->n_mat);
        if (used + need > cap) {
            fmt_size(b, sizeof b, cap - used);
            hot_say(w, "%sskipped %s: %d x %s, %s of the cap left", sep, name, n, a, b);
            sep = "; ";
            continue;
        }
        if ((st = hot_copy(w, m, nodes, fake, name, which == 0 ? &w->head_repl : &w->embd_repl)) != IE_OK)
            goto cleanup;
        used += need;
        hot_say(w, "%s%s %d x %s", sep, name, n, a);
        sep = "; ";
    }
    fmt_size(a, sizeof a, used);
    fmt_size(b, sizeof b, cap);
    hot_say(w, "%s%s of the %s cap", sep, a, b);

cleanup:
    free(node_of);
    free(nodes);
    return st;
}

/* Contract (worker_internal.h). */
const wmat_t *worker_embedding(const ie_worker_t *w)
{
    return w->embd_repl ? &w->embd_repl[w->share_repl[0]] : &w->tok_embd;
}

/* Contract (worker_internal.h). */
ie_status_t worker_matmul_head(ie_worker_t *w, float *logits, const float *x, int n)
{
    const wmat_t *ms[1] = {&w->output}, *rp[1] = {w->head_repl}; /* per-node copies, if any */
    float *ys[1] = {logits};
    return worker_matmul_rep(w, 1, ms, rp, ys, x, n, NULL);
}

int ie_worker_hot_replicas(const ie_worker_t *w) { return w ? w->hot_copies : 0; }
const char *ie_worker_hot_report(const ie_worker_t *w) { return w ? w->hot_report : ""; }

/* Contract (ie_worker.h). */
const void *ie_worker_hot_replica(const ie_worker_t *w, int embd, int r, size_t *bytes_out)
{
    const wmat_t *c = !w ? NULL : embd ? w->embd_repl : w->head_repl;
    if (bytes_out) *bytes_out = 0;
    if (!c || r < 0 || r >= w->n_repl) return NULL;
    if (bytes_out) *bytes_out = c[r].slice * (size_t)c[r].n_mat;
    return c[r].data;
}

/* Contract (ie_worker.h). */
int ie_worker_hot_replica_of(const ie_worker_t *w, int ith)
{
    if (!w || (!w->head_repl && !w->embd_repl) || ith < 0 || ith >= w->opts.n_threads) return -1;
    return w->share_repl[ith];
}

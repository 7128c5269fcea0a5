/* shmreduce.c — the same-host all-reduce of tensor-parallel ranks over
 * POSIX shared memory (ie_shmreduce.h): segments, votes, publishing with a
 * release-stored sequence number, waiting by spinning and then sleeping on
 * a futex, the rank-order sum. */
#define _GNU_SOURCE
#include "ie_shmreduce.h"
#include "ie_clock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() atomic_signal_fence(memory_order_seq_cst)
#endif

#define MAGIC 0x6965747073686d31ull /* "ietpshm1" */
#define VERSION 1u
#define MAX_RANKS 64
#define HDR_BYTES 4096 /* the buffers start on their own page             */
#define IDX_BITS 20
#define STEP_MAX (1ull << 43)
#define SPIN_DEFAULT_US 50

enum { VOTE_NONE = 0, VOTE_SHM = 1, VOTE_ZMQ = 2 };

/* One rank's segment. Lines: identity (read-only once magic is set); the
 * owner's publications (readers only read it); the readers' sleeper count
 * (readers write it, the owner reads it). */
typedef struct seg_hdr {
    _Alignas(64) _Atomic uint64_t magic; /* release-stored last at creation */
    uint32_t version, hdr_bytes;
    uint64_t cluster_id, epoch;
    int32_t rank, n_ranks;
    uint64_t max_floats; /* capacity of each buffer                       */
    uint64_t buf_stride; /* bytes from one buffer to the next             */
    int32_t pid;         /* creator (diagnostics only)                     */

    _Alignas(64) _Atomic uint64_t seq[2]; /* (step+1)<<20 | index held by
                                             buffer p; 0: being written   */
    _Atomic uint32_t pub;                 /* futex word: bumps on every
                                             publication and on the vote  */
    _Atomic int32_t vote;                 /* VOTE_*                        */

    _Alignas(64) _Atomic uint32_t sleepers; /* readers in FUTEX_WAIT on pub */
} seg_hdr_t;

_Static_assert(sizeof(seg_hdr_t) <= HDR_BYTES, "header fits its page");

struct ie_shmreduce {
    ie_shmreduce_opts_t o;
    char name[96]; /* own segment's name                        */
    int linked;    /* the name still exists                      */
    size_t seg_bytes;
    seg_hdr_t *seg[MAX_RANKS]; /* mappings: own and (after attach) peers'  */
    int decided;               /* 0 open, 1 shared memory, -1 ZeroMQ        */
    uint64_t n_pub;            /* own publications so far (buffer parity)    */
};

int ie_shmreduce_enabled(void)
{
    const char *e = getenv("IE_TP_SHM");
    return !(e && !strcmp(e, "0"));
}

static void seg_name(char *out, size_t cap, uint64_t cluster_id, uint64_t epoch, int rank)
{
    snprintf(out, cap, "/ie-tp-%016llx-%llu-%d", (unsigned long long)cluster_id, (unsigned long long)epoch, rank);
}

static size_t stride_of(size_t max_floats) { return (max_floats * sizeof(float) + 63) & ~(size_t)63; }

static float *seg_buf(seg_hdr_t *h, int p) { return (float *)((char *)h + HDR_BYTES + (size_t)p * h->buf_stride); }

/* ------------------------------------------------------------ futex */

static void futex_wait(_Atomic uint32_t *w, uint32_t val, double ms)
{
    struct timespec ts;
    if (ms < 0) ms = 0;
    ts.tv_sec = (time_t)(ms / 1e3);
    ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1e3) * 1e6);
    /* shared (not FUTEX_PRIVATE): the word lives in another process's
     * mapping too; EINTR / EAGAIN / ETIMEDOUT all mean "look again" */
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *w)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Bump the owner's futex word after a publication; wake sleepers. The
 * seq_cst bump and the seq_cst read of `sleepers` pair with the reader's
 * seq_cst increment of `sleepers` and read of `pub`: either the reader saw
 * the new `pub` (its FUTEX_WAIT returns at once) or we see its sleeper. */
static void announce(seg_hdr_t *h)
{
    atomic_fetch_add(&h->pub, 1);
    if (atomic_load(&h->sleepers) > 0) futex_wake_all(&h->pub);
}

/* ------------------------------------------------------------ waiting */

typedef enum { W_NOT_YET, W_FOUND, W_BEYOND } wres_t;

/* Poll one peer for the condition in *check until found, beyond, or the
 * deadline. Spins until spin_end (a shared budget for the whole wait), then
 * sleeps on the peer's futex word. */
typedef wres_t (*check_fn)(seg_hdr_t *h, uint64_t want, int *slot);

static wres_t wait_for(seg_hdr_t *h, check_fn check, uint64_t want, int *slot, double spin_end, double deadline)
{
    wres_t r;
    for (;;) {
        for (int k = 0; k < 32; k++) {
            if ((r = check(h, want, slot)) != W_NOT_YET) return r;
            cpu_relax();
        }
        double now = ie_now_ms();
        if (now >= deadline) return W_NOT_YET;
        if (now < spin_end) continue;
        atomic_fetch_add(&h->sleepers, 1);
        uint32_t v = atomic_load(&h->pub);
        if ((r = check(h, want, slot)) == W_NOT_YET) futex_wait(&h->pub, v, deadline - now);
        atomic_fetch_sub(&h->sleepers, 1);
        if (r != W_NOT_YET) return r;
    }
}

static wres_t check_vote(seg_hdr_t *h, uint64_t want, int *slot)
{
    (void)want;
    int v = atomic_load_explicit(&h->vote, memory_order_acquire);
    if (v == VOTE_NONE) return W_NOT_YET;
    *slot = v;
    return W_FOUND;
}

static wres_t check_seq(seg_hdr_t *h, uint64_t want, int *slot)
{
    for (int pass = 0;; pass++) {
        uint64_t a = atomic_load_explicit(&h->seq[0], memory_order_acquire);
        uint64_t b = atomic_load_explicit(&h->seq[1], memory_order_acquire);
        if (a == want || b == want) {
            *slot = a == want ? 0 : 1;
            return W_FOUND;
        }
        if (a <= want && b <= want) return W_NOT_YET;
        /* A later reduction is out. The two loads are no snapshot: the peer
         * may have published ours and then the next one between them. Its
         * buffer for ours cannot be rewritten before we publish the next
         * one, so a second look after seeing the later one settles it; not
         * there then means the peer skipped ours (it failed it, e.g. on a
         * timeout). */
        if (pass == 1) return W_BEYOND;
    }
}

/* ------------------------------------------------------------ segments */

static ie_status_t map_segment(const char *name, int create, size_t bytes, seg_hdr_t **out)
{
    *out = NULL;
    int fd = create ? shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(name, O_RDWR, 0);
    if (fd < 0 && create && errno == EEXIST) {
        /* names are unique per (cluster, epoch, rank): this is a leftover
         * of a killed process of the same rank and epoch; replace it */
        shm_unlink(name);
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0) return ie_error_set(IE_ERR_IO, "shm_open %s: %s", name, strerror(errno));
    ie_status_t st = IE_OK;
    struct stat sb;
    if (create && ftruncate(fd, (off_t)bytes) != 0) {
        st = ie_error_set(IE_ERR_IO, "ftruncate %s to %zu bytes: %s", name, bytes, strerror(errno));
    } else if (!create && (fstat(fd, &sb) != 0 || (size_t)sb.st_size != bytes)) {
        st = ie_error_set(IE_ERR_FORMAT, "%s: %lld bytes, expected %zu", name, (long long)sb.st_size, bytes);
    } else {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            st = ie_error_set(IE_ERR_NOMEM, "mmap %s (%zu bytes): %s", name, bytes, strerror(errno));
        else *out = p;
    }
    close(fd);
    if (st != IE_OK && create) shm_unlink(name);
    return st;
}

/* Unlink this cluster's segments of earlier epochs. A rank unlinks its own
 * name once every peer voted; a rank killed before that (between READY and
 * the first reduction) leaves its name, and the survivors, re-assigned to
 * a later epoch, remove it here. Nobody needs an old epoch's names: a rank
 * still in that epoch that cannot open a peer's votes ZeroMQ, and its step
 * fails anyway. Best effort: /dev/shm is where glibc keeps them. */
static void sweep_older(uint64_t cluster_id, uint64_t epoch)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "ie-tp-%016llx-", (unsigned long long)cluster_id);
    const size_t np = strlen(prefix);
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, np) != 0) continue;
        char *end;
        errno = 0;
        unsigned long long ep = strtoull(e->d_name + np, &end, 10);
        if (errno || end == e->d_name + np || *end != '-' || ep >= epoch) continue;
        char name[NAME_MAX + 2];
        snprintf(name, sizeof name, "/%s", e->d_name);
        shm_unlink(name);
    }
    closedir(d);
}

ie_status_t ie_shmreduce_new(const ie_shmreduce_opts_t *o, ie_shmreduce_t **out)
{
    ie_status_t st = IE_OK;
    ie_shmreduce_t *s = NULL;
    *out = NULL;
    if (!ie_shmreduce_enabled()) return ie_error_set(IE_ERR_UNSUPPORTED, "shared-memory reduce: off (IE_TP_SHM=0)");
    if (!o || o->cluster_id == 0)
        return ie_error_set(IE_ERR_UNSUPPORTED, "shared-memory reduce: the cluster has no id");
    if (o->n_ranks < 2 || o->n_ranks > MAX_RANKS || o->rank < 0 || o->rank >= o->n_ranks || o->max_floats == 0 ||
        o->max_floats > ((size_t)1 << 40) / sizeof(float))
        return ie_error_set(IE_ERR_INVAL, "shared-memory reduce: rank %d of %d, %zu floats", o ? o->rank : -1,
                            o ? o->n_ranks : 0, o ? o->max_floats : 0);
    if (!(s = calloc(1, sizeof *s))) return ie_error_set(IE_ERR_NOMEM, "out of memory");
    s->o = *o;
    if (s->o.spin_us == 0) s->o.spin_us = SPIN_DEFAULT_US;
    s->seg_bytes = HDR_BYTES + 2 * stride_of(o->max_floats);
    seg_name(s->name, sizeof s->name, o->cluster_id, o->epoch, o->rank);
    seg_hdr_t *h = NULL;
    if ((st = map_segment(s->name, 1, s->seg_bytes, &h)) != IE_OK) goto cleanup;
    s->linked = 1;
    s->seg[o->rank] = h;
    /* ftruncate zero-filled it: seq, pub, vote, sleepers start at 0 */
    h->version = VERSION;
    h->hdr_bytes = HDR_BYTES;
    h->cluster_id = o->cluster_id;
    h->epoch = o->epoch;
    h->rank = o->rank;
    h->n_ranks = o->n_ranks;
    h->max_floats = o->max_floats;
    h->buf_stride = stride_of(o->max_floats);
    h->pid = (int32_t)getpid();
    atomic_store_explicit(&h->magic, MAGIC, memory_order_release);
    sweep_older(o->cluster_id, o->epoch);
    *out = s;
    s = NULL;

cleanup:
    ie_shmreduce_destroy(&s);
    return st;
}

void ie_shmreduce_destroy(ie_shmreduce_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_shmreduce_t *s = *self_p;
    for (int r = 0; r < MAX_RANKS; r++)
        if (s->seg[r]) munmap(s->seg[r], s->seg_bytes);
    if (s->linked) shm_unlink(s->name);
    free(s);
    *self_p = NULL;
}

/* Open and check peer r's segment. */
static ie_status_t open_peer(ie_shmreduce_t *s, int r)
{
    char name[96];
    seg_name(name, sizeof name, s->o.cluster_id, s->o.epoch, r);
    seg_hdr_t *h = NULL;
    ie_status_t st = map_segment(name, 0, s->seg_bytes, &h);
    if (st != IE_OK) return st;
    if (atomic_load_explicit(&h->magic, memory_order_acquire) != MAGIC || h->version != VERSION ||
        h->hdr_bytes != HDR_BYTES || h->cluster_id != s->o.cluster_id || h->epoch != s->o.epoch || h->rank != r ||
        h->n_ranks != s->o.n_ranks || h->max_floats != s->o.max_floats ||
        h->buf_stride != stride_of(s->o.max_floats)) {
        munmap(h, s->seg_bytes);
        return ie_error_set(IE_ERR_FORMAT, "%s: header does not match rank %d of %d, epoch %llu, %zu floats", name,
                            r, s->o.n_ranks, (unsigned long long)s->o.epoch, s->o.max_floats);
    }
    s->seg[r] = h;
    return IE_OK;
}

ie_status_t ie_shmreduce_attach(ie_shmreduce_t *s, int timeout_ms)
{
    const int me = s->o.rank, P = s->o.n_ranks;
    seg_hdr_t *own = s->seg[me];
    if (s->decided > 0) return IE_OK;
    if (s->decided < 0) return ie_error_set(IE_ERR_UNSUPPORTED, "shared-memory reduce: the cluster uses ZeroMQ");
    if (atomic_load(&own->vote) == VOTE_NONE) { /* first call: open every peer, vote */
        int vote = VOTE_SHM;
        char why[256] = "";
        for (int r = 0; r < P && vote == VOTE_SHM; r++)
            if (r != me && open_peer(s, r) != IE_OK) {
                vote = VOTE_ZMQ;
                snprintf(why, sizeof why, "%s", ie_error_last()); /* not ie_error_set's own buffer */
            }
        atomic_store_explicit(&own->vote, vote, memory_order_release);
        announce(own);
        if (vote == VOTE_ZMQ) {
            s->decided = -1;
            return ie_error_set(IE_ERR_UNSUPPORTED, "shared-memory reduce: no peer segment here (%s)", why);
        }
    }
    /* every peer is mapped: collect their votes */
    const double t0 = ie_now_ms(), deadline = t0 + timeout_ms, spin_end = t0 + s->o.spin_us / 1e3;
    for (int r = 0; r < P; r++) {
        if (r == me) continue;
        int v = VOTE_NONE;
        if (wait_for(s->seg[r], check_vote, 0, &v, spin_end, deadline) != W_FOUND)
            return ie_error_set(IE_ERR_UNAVAILABLE, "shared-memory reduce: no vote from rank %d within %d ms", r,
                                timeout_ms);
        if (v != VOTE_SHM) {
            s->decided = -1;
            return ie_error_set(IE_ERR_UNSUPPORTED, "shared-memory reduce: rank %d cannot use it", r);
        }
    }
    /* every peer voted shm, so every peer has mapped our segment: the name
     * is no longer needed, and a kill -9 from now on leaves nothing behind */
    shm_unlink(s->name);
    s->linked = 0;
    s->decided = 1;
    return IE_OK;
}

/* Contract (ie_shmreduce.h). */
void ie_reduce_rank_sum(float *buf, const float *const *part, int n_ranks, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        float v = part[0][j];
        for (int r = 1; r < n_ranks; r++) v += part[r][j];
        buf[j] = v;
    }
}

ie_status_t ie_shmreduce_run(ie_shmreduce_t *s, uint64_t step, int index, float *buf, size_t n, int timeout_ms)
{
    const int me = s->o.rank, P = s->o.n_ranks;
    if (s->decided <= 0) return ie_error_set(IE_ERR_INTERNAL, "shared-memory reduce: not attached");
    if (n > s->o.max_floats || step >= STEP_MAX || index < 0 || index >= (1 << IDX_BITS))
        return ie_error_set(IE_ERR_RANGE, "shared-memory reduce: step %llu index %d of %zu floats (at most %zu)",
                            (unsigned long long)step, index, n, s->o.max_floats);
    const uint64_t want = ((step + 1) << IDX_BITS) | (uint64_t)index;
    const double t0 = ie_now_ms(), deadline = t0 + timeout_ms, spin_end = t0 + s->o.spin_us / 1e3;

    /* publish: invalidate the buffer, write it, release its number */
    seg_hdr_t *own = s->seg[me];
    const int p = (int)(s->n_pub++ & 1);
    atomic_store_explicit(&own->seq[p], 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    memcpy(seg_buf(own, p), buf, n * sizeof(float));
    atomic_store_explicit(&own->seq[p], want, memory_order_release);
    announce(own);

    /* wait for every peer's part of this reduction */
    const float *part[MAX_RANKS];
    int slot[MAX_RANKS];
    for (int r = 0; r < P; r++) {
        if (r == me) {
            part[r] = buf; /* summed in place: element j reads every part's j before writing it */
            continue;
        }
        wres_t w = wait_for(s->seg[r], check_seq, want, &slot[r], spin_end, deadline);
        if (w == W_BEYOND)
            return ie_error_set(IE_ERR_UNAVAILABLE,
                                "tensor reduce: rank %d went past step %llu index %d "
                                "(it failed it)",
                                r, (unsigned long long)step, index);
        if (w != W_FOUND)
            return ie_error_set(IE_ERR_UNAVAILABLE, "tensor reduce: no partial sum from rank %d within %d ms", r,
                                timeout_ms);
        part[r] = seg_buf(s->seg[r], slot[r]);
    }
    ie_reduce_rank_sum(buf, part, P, n);
    /* seqlock check: no peer rewrote a buffer while we read it (only a
     * peer that gave up on this reduction could have) */
    atomic_thread_fence(memory_order_acquire);
    for (int r = 0; r < P; r++)
        if (r != me && atomic_load_explicit(&s->seg[r]->seq[slot[r]], memory_order_relaxed) != want)
            return ie_error_set(IE_ERR_UNAVAILABLE, "tensor reduce: rank %d moved on during step %llu index %d", r,
                                (unsigned long long)step, index);
    return IE_OK;
}

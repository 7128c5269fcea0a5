/* test_kvpool.c — CUnit suite for coordinator/src/kvpool.c (KV block pool
 * and prefix cache): refcounts, exhaustion, prefix publish/match, salts,
 * LRU eviction, duplicates, forget, the reuse of an evicted parent's id,
 * and a long random run against a linear-search reference model.
 *
 * The file includes kvpool.c itself (the library's copy is then never
 * linked: every symbol it defines is defined here first) for two things the
 * public header does not offer: a hash that can be switched to a constant,
 * so that every key collides and only the exact comparison separates them,
 * and a structural check of the pool's lists, hash chains and child lists.
 */
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ie_test_rng.h"

static int g_const_hash; /* 1: every key hashes to the same value */
#define IE_KVPOOL_HASH(salt, parent, ids, bt) (g_const_hash ? UINT64_C(0x5eed) : kvpool_hash(salt, parent, ids, bt))
#include "../../coordinator/src/kvpool.c"

/* ------------------------------------------------------------ helpers */

static ie_kvpool_t *make(int n_blocks, int block_tokens)
{
    ie_kvpool_t *p = NULL;
    CU_ASSERT_EQUAL_FATAL(ie_kvpool_new(n_blocks, block_tokens, &p), IE_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

static int32_t alloc1(ie_kvpool_t *p)
{
    int32_t b = -7;
    CU_ASSERT_EQUAL_FATAL(ie_kvpool_alloc(p, &b), IE_OK);
    CU_ASSERT_FATAL(b >= 0 && b < p->n_blocks);
    return b;
}

static void expect_stats(const ie_kvpool_t *p, int used, int cached, int free_)
{
    ie_kvpool_stats_t s;
    ie_kvpool_stats(p, &s);
    CU_ASSERT_EQUAL(s.used, used);
    CU_ASSERT_EQUAL(s.cached, cached);
    CU_ASSERT_EQUAL(s.free, free_);
    CU_ASSERT_EQUAL(s.used + s.cached + s.free, s.n_blocks);
    CU_ASSERT_EQUAL(ie_kvpool_available(p), cached + free_);
}

static void expect_counters(const ie_kvpool_t *p, uint64_t hits, uint64_t misses, uint64_t evictions)
{
    ie_kvpool_stats_t s;
    ie_kvpool_stats(p, &s);
    CU_ASSERT_EQUAL(s.hit_blocks, hits);
    CU_ASSERT_EQUAL(s.miss_blocks, misses);
    CU_ASSERT_EQUAL(s.evictions, evictions);
}

static void release_all(ie_kvpool_t *p, const int32_t *b, int n)
{
    for (int i = 0; i < n; i++) ie_kvpool_release(p, b[i]);
}

/* Structural invariants; returns what is wrong, or NULL. */
static const char *pool_check(const ie_kvpool_t *p)
{
    static char seen[1024];
    int n = p->n_blocks, published = 0, in_chains = 0;
    if (n > (int)sizeof seen) return "pool too large for the check";
    memset(seen, 0, (size_t)n);
    const kvpool_list_t *lists[2] = {&p->free, &p->lru};
    for (int l = 0; l < 2; l++) {
        int cnt = 0, prev = -1;
        for (int32_t b = lists[l]->head; b >= 0; prev = b, b = p->blk[b].next) {
            if (seen[b]++ || ++cnt > n) return "block on two lists or a cycle";
            if (p->blk[b].prev != prev || p->blk[b].ref != 0) return "bad list link or refcount";
            if (p->blk[b].published != (l == 1)) return "free block published or cached block not";
        }
        if (cnt != lists[l]->n || lists[l]->tail != prev) return "list count or tail wrong";
    }
    for (int32_t b = 0; b < n; b++) {
        const kvpool_blk_t *x = &p->blk[b];
        if ((x->ref == 0) != (seen[b] != 0) || x->ref < 0)
            return "refcount 0 block not on a list, or used block on one";
        if (!x->published) {
            if (x->parent != -1 || x->child != -1 || x->sib_next != -1 || x->sib_prev != -1)
                return "unpublished block keeps tree links";
            continue;
        }
        published++;
        if (!x->spent) return "published block not spent";
        const int32_t *ids = p->tokens + (size_t)b * p->block_tokens;
        if (x->hash != IE_KVPOOL_HASH(x->salt, x->parent, ids, p->block_tokens) ||
            kvpool_find(p, x->hash, x->salt, x->parent, ids) != b)
            return "published block not found under its own key";
        if (x->parent >= 0) {
            const kvpool_blk_t *par = &p->blk[x->parent];
            if (!par->published || par->salt != x->salt) return "published block under an unpublished parent";
            int32_t c = par->child;
            while (c >= 0 && c != b) c = p->blk[c].sib_next;
            if (c != b) return "block missing from its parent's child list";
        } else if (x->sib_prev != -1 || x->sib_next != -1) {
            return "root with siblings";
        }
        for (int32_t c = x->child, prev = -1; c >= 0; prev = c, c = p->blk[c].sib_next)
            if (p->blk[c].parent != b || p->blk[c].sib_prev != prev || !p->blk[c].published)
                return "bad child list";
    }
    for (uint64_t h = 0; h <= p->mask; h++)
        for (int32_t b = p->bucket[h]; b >= 0; b = p->blk[b].hnext)
            if (!p->blk[b].published || (p->blk[b].hash & p->mask) != h || ++in_chains > n) return "bad hash chain";
    return in_chains == published ? NULL : "hash chains and published blocks differ";
}

#define CHECK_POOL(p)                                            \
    do {                                                         \
        const char *why_ = pool_check(p);                        \
        if (why_) fprintf(stderr, "\n  pool_check: %s\n", why_); \
        CU_ASSERT_PTR_NULL(why_);                                \
    } while (0)

/* ------------------------------------------------------------ cases */

static void test_new_and_null(void)
{
    ie_kvpool_t *p = (ie_kvpool_t *)&p; /* not NULL: new must clear it */
    CU_ASSERT_EQUAL(ie_kvpool_new(0, 4, &p), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(p);
    CU_ASSERT_EQUAL(ie_kvpool_new(4, 0, &p), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_kvpool_new(-3, 4, &p), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_kvpool_new(4, -1, &p), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_kvpool_new(4, 4, NULL), IE_ERR_INVAL);
    CU_ASSERT_PTR_NULL(p);

    p = make(3, 16);
    CU_ASSERT_EQUAL(ie_kvpool_block_tokens(p), 16);
    expect_stats(p, 0, 0, 3);
    expect_counters(p, 0, 0, 0);
    CHECK_POOL(p);
    ie_kvpool_destroy(&p);
    CU_ASSERT_PTR_NULL(p);
    ie_kvpool_destroy(&p);
    ie_kvpool_destroy(NULL);

    /* every entry point survives a NULL pool */
    int32_t b = 5, out[2] = {0}, ids[4] = {1, 2, 3, 4};
    ie_kvpool_stats_t s;
    memset(&s, 0x5a, sizeof s);
    CU_ASSERT_EQUAL(ie_kvpool_block_tokens(NULL), 0);
    CU_ASSERT_EQUAL(ie_kvpool_available(NULL), 0);
    CU_ASSERT_EQUAL(ie_kvpool_match(NULL, 0, ids, 4, out, 2), 0);
    CU_ASSERT_EQUAL(ie_kvpool_alloc(NULL, &b), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(b, -1);
    CU_ASSERT_EQUAL(ie_kvpool_retain(NULL, 0), IE_ERR_INVAL);
    ie_kvpool_release(NULL, 0);
    CU_ASSERT_EQUAL(ie_kvpool_publish(NULL, 0, 0, -1, ids), 0);
    ie_kvpool_forget(NULL);
    ie_kvpool_stats(NULL, &s);
    CU_ASSERT_EQUAL(s.n_blocks, 0);
    CU_ASSERT_EQUAL(s.hit_blocks, 0);
    ie_kvpool_stats(NULL, NULL);
}

static void test_alloc_until_full(void)
{
    enum { N = 5 };
    ie_kvpool_t *p = make(N, 4);
    int32_t got[N];
    int seen[N] = {0};
    for (int i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(ie_kvpool_available(p), N - i);
        got[i] = alloc1(p);
        CU_ASSERT_EQUAL(seen[got[i]]++, 0);
    }
    expect_stats(p, N, 0, 0);
    int32_t b = 99;
    ie_error_clear();
    CU_ASSERT_EQUAL(ie_kvpool_alloc(p, &b), IE_ERR_NOMEM);
    CU_ASSERT_EQUAL(b, -1);
    CU_ASSERT_STRING_EQUAL(ie_error_last(), "KV cache full");
    CU_ASSERT_EQUAL(ie_kvpool_alloc(p, NULL), IE_ERR_INVAL);

    /* one back, one out: the only free block */
    ie_kvpool_release(p, got[2]);
    expect_stats(p, N - 1, 0, 1);
    CU_ASSERT_EQUAL(alloc1(p), got[2]);
    CU_ASSERT_EQUAL(ie_kvpool_alloc(p, &b), IE_ERR_NOMEM);
    expect_counters(p, 0, 0, 0);
    CHECK_POOL(p);
    release_all(p, got, N);
    expect_stats(p, 0, 0, N);
    ie_kvpool_destroy(&p);
}

static void test_refcounts(void)
{
    ie_kvpool_t *p = make(4, 2);
    int32_t a = alloc1(p);
    CU_ASSERT_EQUAL(ie_kvpool_retain(p, a), IE_OK);
    CU_ASSERT_EQUAL(ie_kvpool_retain(p, a), IE_OK);
    ie_kvpool_release(p, a);
    ie_kvpool_release(p, a);
    expect_stats(p, 1, 0, 3); /* one reference left */
    ie_kvpool_release(p, a);
    expect_stats(p, 0, 0, 4);
    ie_kvpool_release(p, a); /* free: ignored */
    expect_stats(p, 0, 0, 4);
    CU_ASSERT_EQUAL(ie_kvpool_retain(p, a), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_kvpool_retain(p, -1), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_kvpool_retain(p, 4), IE_ERR_RANGE);
    CU_ASSERT_EQUAL(ie_kvpool_retain(p, INT32_MIN), IE_ERR_RANGE);
    expect_stats(p, 0, 0, 4);

    a = alloc1(p);
    int32_t b = alloc1(p);
    ie_kvpool_release(p, -1);
    ie_kvpool_release(p, 4);
    ie_kvpool_release(p, INT32_MAX);
    expect_stats(p, 2, 0, 2);

    /* a cached block can be retained: it becomes used again */
    const int32_t ids[2] = {10, 11};
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, a, 0, -1, ids), 1);
    ie_kvpool_release(p, a);
    expect_stats(p, 1, 1, 2);
    CU_ASSERT_EQUAL(ie_kvpool_retain(p, a), IE_OK);
    CU_ASSERT_EQUAL(ie_kvpool_retain(p, a), IE_OK);
    expect_stats(p, 2, 0, 2);
    ie_kvpool_release(p, a);
    expect_stats(p, 2, 0, 2);
    ie_kvpool_release(p, a);
    expect_stats(p, 1, 1, 2);
    ie_kvpool_release(p, b);
    expect_stats(p, 0, 1, 3);
    CHECK_POOL(p);
    ie_kvpool_destroy(&p);
}

static void test_prefix_match(void)
{
    enum { BT = 4 };
    ie_kvpool_t *p = make(8, BT);
    int32_t ids[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    int32_t b[3], out[8];
    for (int j = 0; j < 3; j++) {
        b[j] = alloc1(p);
        CU_ASSERT_EQUAL(ie_kvpool_publish(p, b[j], 0, j ? b[j - 1] : -1, ids + j * BT), 1);
    }
    release_all(p, b, 3);
    expect_stats(p, 0, 3, 5);
    CHECK_POOL(p);

    /* the whole prefix; the partial fourth block (2 tokens) is not asked for */
    memset(out, 0xff, sizeof out);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, 14, out, 8), 3);
    CU_ASSERT_EQUAL(out[0], b[0]);
    CU_ASSERT_EQUAL(out[1], b[1]);
    CU_ASSERT_EQUAL(out[2], b[2]);
    CU_ASSERT_EQUAL(out[3], -1);
    expect_counters(p, 3, 0, 0);
    expect_stats(p, 3, 0, 5);
    release_all(p, out, 3);
    expect_stats(p, 0, 3, 5);

    /* shorter asks */
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, 11, out, 8), 2); /* 2 full blocks */
    release_all(p, out, 2);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, 12, out, 1), 1); /* max_blocks */
    CU_ASSERT_EQUAL(out[0], b[0]);
    release_all(p, out, 1);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, 3, out, 8), 0); /* no full block */
    expect_counters(p, 6, 0, 0);

    /* 4 blocks, the last one never published: 3 hits, 1 miss */
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, 16, out, 8), 3);
    release_all(p, out, 3);
    expect_counters(p, 9, 1, 0);

    /* differs in block 2: 2 hits; blocks 2 and 3 are misses */
    int32_t other[16];
    memcpy(other, ids, sizeof other);
    other[10] = 99;
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, other, 16, out, 8), 2);
    CU_ASSERT_EQUAL(out[1], b[1]);
    release_all(p, out, 2);
    expect_counters(p, 11, 3, 0);
    /* ... but misses only up to max_blocks */
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, other, 16, out, 3), 2);
    release_all(p, out, 2);
    expect_counters(p, 13, 4, 0);

    /* differs in the last token of block 0: nothing, though blocks 1, 2 equal */
    memcpy(other, ids, sizeof other);
    other[3] = 0;
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, other, 12, out, 8), 0);
    expect_counters(p, 13, 7, 0);
    /* block 1's tokens at position 0: they were published under a parent */
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids + BT, 8, out, 8), 0);
    expect_counters(p, 13, 9, 0);
    expect_stats(p, 0, 3, 5);
    CHECK_POOL(p);
    ie_kvpool_destroy(&p);
}

static void test_salt(void)
{
    ie_kvpool_t *p = make(6, 2);
    const int32_t ids[4] = {1, 2, 3, 4};
    int32_t a[2], z[2], out[2];
    for (int j = 0; j < 2; j++) {
        a[j] = alloc1(p);
        CU_ASSERT_EQUAL(ie_kvpool_publish(p, a[j], 7, j ? a[0] : -1, ids + 2 * j), 1);
    }
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, 4, out, 2), 0);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 8, ids, 4, out, 2), 0);
    /* the same tokens under salt 0 are a different entry, not a duplicate */
    z[0] = alloc1(p);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, z[0], 0, -1, ids), 1);
    z[1] = alloc1(p);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, z[1], 0, a[0], ids + 2), 0); /* parent has salt 7 */
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, z[1], 0, z[0], ids + 2), 1);
    release_all(p, a, 2);
    release_all(p, z, 2);

    CU_ASSERT_EQUAL(ie_kvpool_match(p, 7, ids, 4, out, 2), 2);
    CU_ASSERT(out[0] == a[0] && out[1] == a[1]);
    release_all(p, out, 2);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, 4, out, 2), 2);
    CU_ASSERT(out[0] == z[0] && out[1] == z[1]);
    release_all(p, out, 2);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, UINT64_MAX, ids, 4, out, 2), 0);
    expect_stats(p, 0, 4, 2);
    CHECK_POOL(p);
    ie_kvpool_destroy(&p);
}

static void test_evicted_no_match(void)
{
    ie_kvpool_t *p = make(2, 2);
    const int32_t ids[2] = {5, 6};
    int32_t out[1];
    int32_t a = alloc1(p);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, a, 0, -1, ids), 1);
    ie_kvpool_release(p, a);
    int32_t f = alloc1(p); /* the free block goes first */
    CU_ASSERT_NOT_EQUAL(f, a);
    expect_counters(p, 0, 0, 0);
    CU_ASSERT_EQUAL(alloc1(p), a); /* then the cached one */
    expect_counters(p, 0, 0, 1);
    expect_stats(p, 2, 0, 0);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, 2, out, 1), 0);
    expect_counters(p, 0, 1, 1);
    /* its entry is gone: the same tokens publish anew */
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, f, 0, -1, ids), 1);
    ie_kvpool_release(p, f);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, 2, out, 1), 1);
    CU_ASSERT_EQUAL(out[0], f);
    CHECK_POOL(p);
    ie_kvpool_destroy(&p);
}

static void test_lru_order(void)
{
    enum { N = 4 };
    ie_kvpool_t *p = make(N, 2);
    int32_t b[N], ids[N][2], out[1];
    for (int i = 0; i < N; i++) {
        ids[i][0] = 100 + i;
        ids[i][1] = 200 + i;
        b[i] = alloc1(p);
        CU_ASSERT_EQUAL(ie_kvpool_publish(p, b[i], 0, -1, ids[i]), 1);
    }
    /* released C, A, D, B; A retained and released again, D matched and
     * released again: least recently released first is C, B, A, D */
    ie_kvpool_release(p, b[2]);
    ie_kvpool_release(p, b[0]);
    ie_kvpool_release(p, b[3]);
    ie_kvpool_release(p, b[1]);
    CU_ASSERT_EQUAL(ie_kvpool_retain(p, b[0]), IE_OK);
    ie_kvpool_release(p, b[0]);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids[3], 2, out, 1), 1);
    CU_ASSERT_EQUAL(out[0], b[3]);
    ie_kvpool_release(p, b[3]);
    expect_stats(p, 0, N, 0);
    CHECK_POOL(p);

    const int want[N] = {2, 1, 0, 3};
    for (int i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(alloc1(p), b[want[i]]);
        ie_kvpool_stats_t s;
        ie_kvpool_stats(p, &s);
        CU_ASSERT_EQUAL(s.evictions, (uint64_t)i + 1);
        /* the evicted one is gone, the rest are still there */
        for (int k = 0; k < N; k++) {
            int evicted = 0;
            for (int e = 0; e <= i; e++) evicted |= want[e] == k;
            int got = ie_kvpool_match(p, 0, ids[k], 2, out, 1);
            CU_ASSERT_EQUAL(got, !evicted);
            if (got) /* matching touched it: put it back where it was */
                ie_kvpool_release(p, out[0]);
        }
        /* the matches above reordered the LRU list: restore the intended order */
        for (int e = i + 1; e < N; e++) {
            CU_ASSERT_EQUAL(ie_kvpool_retain(p, b[want[e]]), IE_OK);
            ie_kvpool_release(p, b[want[e]]);
        }
    }
    CU_ASSERT_EQUAL(ie_kvpool_available(p), 0);
    CHECK_POOL(p);
    ie_kvpool_destroy(&p);
}

static void test_duplicate_and_bad_publish(void)
{
    ie_kvpool_t *p = make(6, 2);
    const int32_t A[2] = {1, 2}, B[2] = {3, 4};
    int32_t out[2];
    int32_t x = alloc1(p), y = alloc1(p), c = alloc1(p);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, x, 0, -1, A), 1);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, y, 0, -1, A), 0); /* computed twice */
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, x, 0, -1, A), 0); /* published once */
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, x, 0, -1, B), 0);
    /* a child of the unpublished twin could never be matched: refused */
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, c, 0, y, B), 0);
    /* bad parents and arguments */
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, c, 0, -2, B), 0);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, c, 0, 6, B), 0);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, c, 0, INT32_MAX, B), 0);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, c, 0, 5, B), 0); /* a free block */
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, c, 0, x, NULL), 0);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, -1, 0, x, B), 0);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, 6, 0, x, B), 0);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, 5, 0, -1, B), 0); /* free blocks are not published */
    CHECK_POOL(p);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, c, 0, x, B), 1);

    ie_kvpool_release(p, y); /* the twin was never published: free */
    expect_stats(p, 2, 0, 4);
    ie_kvpool_release(p, x);
    ie_kvpool_release(p, c);
    expect_stats(p, 0, 2, 4);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, (const int32_t[]){1, 2, 3, 4}, 4, out, 2), 2);
    CU_ASSERT(out[0] == x && out[1] == c);
    release_all(p, out, 2);
    CHECK_POOL(p);
    ie_kvpool_destroy(&p);
}

static void test_forget(void)
{
    ie_kvpool_t *p = make(5, 2);
    const int32_t ids[6] = {1, 2, 3, 4, 5, 6};
    int32_t b[3], out[3];
    for (int j = 0; j < 3; j++) {
        b[j] = alloc1(p);
        CU_ASSERT_EQUAL(ie_kvpool_publish(p, b[j], 3, j ? b[j - 1] : -1, ids + 2 * j), 1);
    }
    ie_kvpool_release(p, b[1]);
    ie_kvpool_release(p, b[2]);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 3, ids, 6, out, 3), 3);
    release_all(p, out, 3);
    expect_stats(p, 1, 2, 2);
    expect_counters(p, 3, 0, 0);

    ie_kvpool_forget(p);
    expect_stats(p, 1, 0, 4); /* b[0] still used, the cached two free */
    expect_counters(p, 3, 0, 0);
    CHECK_POOL(p);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 3, ids, 6, out, 3), 0);
    expect_counters(p, 3, 3, 0);
    /* its K/V is gone: b[0] is not published again, and goes free */
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, b[0], 3, -1, ids), 0);
    ie_kvpool_release(p, b[0]);
    expect_stats(p, 0, 0, 5);
    /* no stale entry blocks a fresh publish */
    int32_t n0 = alloc1(p);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, n0, 3, -1, ids), 1);
    ie_kvpool_release(p, n0);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 3, ids, 6, out, 3), 1);
    CU_ASSERT_EQUAL(out[0], n0);
    ie_kvpool_release(p, n0);
    ie_kvpool_forget(p);
    ie_kvpool_forget(p);
    expect_stats(p, 0, 0, 5);
    CHECK_POOL(p);
    ie_kvpool_destroy(&p);
}

/* A detached adapter's namespace goes at once: its cached blocks free (a
 * child met before its root too), a block a slot still binds stays used
 * and unpublished, other salts (the base's 0 included) keep theirs. */
static void test_drop_salt(void)
{
    ie_kvpool_t *p = make(8, 2);
    const int32_t ids[6] = {1, 2, 3, 4, 5, 6};
    int32_t a[3], z[2], out[3];
    /* salt 9: a chain of three whose root sits at a higher id than its
     * child, so the scan meets the child first */
    int32_t tmp = alloc1(p);
    a[1] = alloc1(p);
    a[0] = alloc1(p);
    a[2] = alloc1(p);
    ie_kvpool_release(p, tmp);
    for (int j = 0; j < 3; j++) CU_ASSERT_EQUAL(ie_kvpool_publish(p, a[j], 9, j ? a[j - 1] : -1, ids + 2 * j), 1);
    for (int j = 0; j < 2; j++) {
        z[j] = alloc1(p);
        CU_ASSERT_EQUAL(ie_kvpool_publish(p, z[j], 0, j ? z[0] : -1, ids + 2 * j), 1);
    }
    release_all(p, z, 2);
    ie_kvpool_release(p, a[1]);
    ie_kvpool_release(p, a[2]);
    expect_stats(p, 1, 4, 3); /* a[0] still bound */
    CU_ASSERT_EQUAL(ie_kvpool_drop_salt(p, 9), 2);
    expect_stats(p, 1, 2, 5);
    CHECK_POOL(p);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 9, ids, 6, out, 3), 0);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, 6, out, 3), 2);
    CU_ASSERT(out[0] == z[0] && out[1] == z[1]);
    release_all(p, out, 2);
    /* the bound block was unpublished, not freed: its release frees it */
    CU_ASSERT_EQUAL(ie_kvpool_drop_salt(p, 9), 0);
    ie_kvpool_release(p, a[0]);
    expect_stats(p, 0, 2, 6);
    CU_ASSERT_EQUAL(ie_kvpool_drop_salt(p, 12345), 0);
    CU_ASSERT_EQUAL(ie_kvpool_drop_salt(NULL, 9), 0);
    CU_ASSERT_EQUAL(ie_kvpool_drop_salt(p, 0), 2);
    expect_stats(p, 0, 0, 8);
    CHECK_POOL(p);
    ie_kvpool_destroy(&p);
}

/* A block id comes back with other tokens after its entry was evicted:
 * nothing published under the old id may match under the new content. */
static void test_parent_id_reuse(void)
{
    const int32_t old0[2] = {1, 2}, new0[2] = {5, 6}, blk1[2] = {3, 4}, blk2[2] = {7, 8};
    int32_t out[3];

    /* the child is still in use when its parent is evicted */
    ie_kvpool_t *p = make(3, 2);
    int32_t par = alloc1(p), ch = alloc1(p), other = alloc1(p);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, par, 0, -1, old0), 1);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, ch, 0, par, blk1), 1);
    ie_kvpool_release(p, par);
    CU_ASSERT_EQUAL(alloc1(p), par); /* evicts the parent */
    expect_counters(p, 0, 0, 1);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, par, 0, -1, new0), 1);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, (const int32_t[]){5, 6, 3, 4}, 4, out, 2), 1);
    CU_ASSERT_EQUAL(out[0], par);
    ie_kvpool_release(p, out[0]);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, (const int32_t[]){1, 2, 3, 4}, 4, out, 2), 0);
    CHECK_POOL(p);
    ie_kvpool_release(p, ch); /* unpublished with its parent: goes free */
    expect_stats(p, 2, 0, 1);
    ie_kvpool_release(p, other);
    ie_kvpool_release(p, par);
    expect_stats(p, 0, 1, 2);
    ie_kvpool_destroy(&p);

    /* a cached chain parent -> child -> grandchild, plus a second child:
     * evicting the parent frees the whole subtree at once */
    p = make(5, 2);
    int32_t c2, g, spare;
    par = alloc1(p);
    ch = alloc1(p);
    g = alloc1(p);
    c2 = alloc1(p);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, par, 0, -1, old0), 1);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, ch, 0, par, blk1), 1);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, g, 0, ch, blk2), 1);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, c2, 0, par, blk2), 1);
    ie_kvpool_release(p, par);
    ie_kvpool_release(p, ch);
    ie_kvpool_release(p, g);
    ie_kvpool_release(p, c2);
    spare = alloc1(p);
    expect_stats(p, 1, 4, 0);
    CU_ASSERT_EQUAL(alloc1(p), par);
    expect_stats(p, 2, 0, 3); /* ch, g, c2 dropped with their root */
    expect_counters(p, 0, 0, 1);
    CHECK_POOL(p);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, par, 0, -1, new0), 1);
    int32_t ch2 = alloc1(p);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, ch2, 0, par, blk1), 1); /* no stale twin */
    ie_kvpool_release(p, ch2);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, (const int32_t[]){5, 6, 3, 4, 7, 8}, 6, out, 3), 2);
    CU_ASSERT(out[0] == par && out[1] == ch2);
    release_all(p, out, 2);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, (const int32_t[]){1, 2, 3, 4, 7, 8}, 6, out, 3), 0);
    ie_kvpool_release(p, spare);
    ie_kvpool_release(p, par);
    expect_stats(p, 0, 2, 3);
    CHECK_POOL(p);
    ie_kvpool_destroy(&p);
}

/* Every key hashes alike: the single chain and the exact comparison must
 * still tell tokens, parents and salts apart. */
static void test_constant_hash(void)
{
    enum { N = 16, BT = 3 };
    g_const_hash = 1;
    ie_kvpool_t *p = make(N, BT);
    int32_t root[4], kid[4][2], out[2];
    for (int r = 0; r < 4; r++) { /* roots differ in the last token or salt */
        root[r] = alloc1(p);
        CU_ASSERT_EQUAL(ie_kvpool_publish(p, root[r], r / 2, -1, (const int32_t[]){1, 2, r % 2}), 1);
    }
    for (int r = 0; r < 4; r++) /* the same tokens under every root */
        for (int k = 0; k < 2; k++) {
            kid[r][k] = alloc1(p);
            CU_ASSERT_EQUAL(ie_kvpool_publish(p, kid[r][k], r / 2, root[r], (const int32_t[]){9, 9, k}), 1);
        }
    for (int r = 0; r < 4; r++) {
        ie_kvpool_release(p, root[r]);
        release_all(p, kid[r], 2);
    }
    CHECK_POOL(p);
    int chain = 0;
    for (int32_t b = p->bucket[0x5eed & p->mask]; b >= 0; b = p->blk[b].hnext) chain++;
    CU_ASSERT_EQUAL(chain, 12);

    for (int pass = 0; pass < 2; pass++) {
        for (int r = 0; r < 4; r++)
            for (int k = 0; k < 2; k++) {
                const int32_t ids[6] = {1, 2, r % 2, 9, 9, k};
                int got = ie_kvpool_match(p, (uint64_t)(r / 2), ids, 6, out, 2);
                int want = pass == 0 || r != 1 ? 2 : 0;
                CU_ASSERT_EQUAL(got, want);
                if (got == 2) CU_ASSERT(out[0] == root[r] && out[1] == kid[r][k]);
                release_all(p, out, got);
            }
        CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, (const int32_t[]){1, 2, 2}, 3, out, 2), 0);
        CU_ASSERT_EQUAL(ie_kvpool_match(p, 2, (const int32_t[]){1, 2, 0}, 3, out, 2), 0);
        if (pass == 0) {
            /* evict root 1 from the middle of the chain: the 4 free blocks
             * go first, then root 1 once everything else is more recent */
            for (int i = 0; i < 4; i++) alloc1(p);
            for (int r = 0; r < 4; r++)
                for (int k = -1; k < 2; k++) {
                    int32_t b = k < 0 ? root[r] : kid[r][k];
                    if (b == root[1]) continue;
                    CU_ASSERT_EQUAL(ie_kvpool_retain(p, b), IE_OK);
                    ie_kvpool_release(p, b);
                }
            CU_ASSERT_EQUAL(alloc1(p), root[1]);
            expect_stats(p, 5, 9, 2); /* root 1's two kids freed with it */
            CHECK_POOL(p);
        }
    }
    ie_kvpool_destroy(&p);
    g_const_hash = 0;
}

static void test_bad_input(void)
{
    ie_kvpool_t *p = make(3, 4);
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[2];
    int32_t b = alloc1(p);
    CU_ASSERT_EQUAL(ie_kvpool_publish(p, b, 0, -1, ids), 1);
    ie_kvpool_release(p, b);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, NULL, 0, out, 2), 0);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, NULL, 8, out, 2), 0);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, 8, NULL, 2), 0);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, 8, out, 0), 0);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, 8, out, -5), 0);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, 0, out, 2), 0);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, NULL, 0, NULL, 0), 0);
    expect_counters(p, 0, 0, 0);
    expect_stats(p, 0, 1, 2);
    CU_ASSERT_EQUAL(ie_kvpool_match(p, 0, ids, SIZE_MAX, out, 1), 1); /* only max_blocks are read */
    ie_kvpool_release(p, out[0]);
    expect_counters(p, 1, 0, 0);
    CHECK_POOL(p);
    ie_kvpool_destroy(&p);
}

/* ------------------------------------------------------------ random vs model */

enum { RN = 24, RBT = 2, RHELD = 64 };

typedef struct {
    int ref, pub, spent, parent;
    uint64_t salt, released_at;
    int32_t tok[RBT];
} model_blk_t;

typedef struct {
    model_blk_t b[RN];
    uint64_t tick, hits, misses, evictions;
} model_t;

static int model_find(const model_t *m, uint64_t salt, int parent, const int32_t *ids)
{
    for (int b = 0; b < RN; b++)
        if (m->b[b].pub && m->b[b].salt == salt && m->b[b].parent == parent &&
            memcmp(m->b[b].tok, ids, sizeof m->b[b].tok) == 0)
            return b;
    return -1;
}

/* Unpublish b, then everything whose parent is no longer published. */
static void model_unpublish(model_t *m, int b)
{
    m->b[b].pub = 0;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int c = 0; c < RN; c++)
            if (m->b[c].pub && m->b[c].parent >= 0 && !m->b[m->b[c].parent].pub) m->b[c].pub = 0, changed = 1;
    }
}

static void random_run(int const_hash, uint64_t seed, int ops)
{
    g_const_hash = const_hash;
    rng_seed(seed);
    ie_kvpool_t *p = make(RN, RBT);
    model_t m;
    memset(&m, 0, sizeof m);
    int32_t held[RHELD];
    int n_held = 0;
    long n_nomem = 0, n_pub = 0, n_dup = 0, n_deep = 0, n_cascade = 0;
    const char *why = NULL;

#define REQ(c)    \
    if (!(c)) {   \
        why = #c; \
        break;    \
    }
    int op;
    for (op = 0; op < ops && !why; op++) {
        uint32_t r = rng_u32() % 100;
        if (r < 20) { /* alloc */
            if (n_held == RHELD) continue;
            int want_free = -1, want_lru = -1;
            for (int b = 0; b < RN; b++) {
                if (m.b[b].ref == 0 && !m.b[b].pub) want_free = b;
                if (m.b[b].ref == 0 && m.b[b].pub &&
                    (want_lru < 0 || m.b[b].released_at < m.b[want_lru].released_at))
                    want_lru = b;
            }
            int32_t b = -2;
            ie_status_t st = ie_kvpool_alloc(p, &b);
            if (want_free < 0 && want_lru < 0) {
                REQ(st == IE_ERR_NOMEM && b == -1);
                n_nomem++;
                continue;
            }
            REQ(st == IE_OK && b >= 0 && b < RN && m.b[b].ref == 0);
            if (want_free >= 0) {
                REQ(!m.b[b].pub); /* any free block will do */
            } else {
                REQ(b == want_lru);
                int before = 0, after = 0;
                for (int k = 0; k < RN; k++) before += m.b[k].pub;
                model_unpublish(&m, b);
                for (int k = 0; k < RN; k++) after += m.b[k].pub;
                n_cascade += before - after - 1;
                m.evictions++;
            }
            m.b[b].ref = 1;
            m.b[b].spent = 0;
            held[n_held++] = b;
        } else if (r < 45) { /* release a held reference */
            if (n_held == 0) continue;
            int i = (int)(rng_u32() % (uint32_t)n_held);
            int32_t b = held[i];
            held[i] = held[--n_held];
            ie_kvpool_release(p, b);
            if (--m.b[b].ref == 0) m.b[b].released_at = ++m.tick;
        } else if (r < 55) { /* retain any id */
            int32_t b = (int32_t)(rng_u32() % (RN + 2)) - 1;
            int ok = b >= 0 && b < RN && (m.b[b].ref > 0 || m.b[b].pub);
            ie_status_t st = ie_kvpool_retain(p, b);
            REQ(st == (ok ? IE_OK : IE_ERR_RANGE));
            if (ok) {
                m.b[b].ref++;
                if (n_held < RHELD) held[n_held++] = b;
                else ie_kvpool_release(p, b), m.b[b].ref--; /* still > 0 */
            }
        } else if (r < 75) { /* publish */
            int32_t b = n_held ? held[rng_u32() % (uint32_t)n_held] : (int32_t)(rng_u32() % RN);
            int32_t parent;
            uint32_t how = rng_u32() % 10;
            if (how < 3) {
                parent = -1;
            } else if (how < 8) {
                parent = (int32_t)(rng_u32() % RN);
                for (int t = 0; t < RN && !m.b[parent].pub; t++) parent = (parent + 1) % RN;
            } else {
                parent = (int32_t)(rng_u32() % (RN + 3)) - 2;
            }
            uint64_t salt = rng_u32() % 8 == 0 ? 1 : (parent >= 0 && parent < RN ? m.b[parent].salt : 0);
            int32_t tok[RBT];
            for (int t = 0; t < RBT; t++) tok[t] = (int32_t)(rng_u32() % 3);
            int want = m.b[b].ref > 0 && !m.b[b].pub && !m.b[b].spent &&
                       (parent == -1 ||
                        (parent >= 0 && parent < RN && m.b[parent].pub && m.b[parent].salt == salt));
            int dup = want && model_find(&m, salt, parent, tok) >= 0;
            n_dup += dup;
            want = want && !dup;
            REQ(ie_kvpool_publish(p, b, salt, parent, tok) == want);
            if (want) {
                n_pub++;
                m.b[b].pub = m.b[b].spent = 1;
                m.b[b].salt = salt;
                m.b[b].parent = parent;
                memcpy(m.b[b].tok, tok, sizeof tok);
            }
        } else if (r < 95) { /* match */
            int32_t ids[6 * RBT + 1], out[6];
            size_t n = 0;
            uint64_t salt = rng_u32() % 4 == 0;
            if (rng_u32() % 2) { /* follow a published chain from a random block up */
                int32_t chain[RN];
                int len = 0;
                int32_t b = (int32_t)(rng_u32() % RN);
                if (m.b[b].pub) {
                    salt = m.b[b].salt;
                    for (; b >= 0 && len < RN; b = m.b[b].parent) chain[len++] = b;
                }
                for (int j = len - 1; j >= 0 && j >= len - 6; j--)
                    for (int t = 0; t < RBT; t++) ids[n++] = m.b[chain[j]].tok[t];
            }
            size_t extra = rng_u32() % (sizeof ids / sizeof *ids - n + 1);
            for (size_t t = 0; t < extra; t++) ids[n++] = (int32_t)(rng_u32() % 3);
            int max_blocks = (int)(rng_u32() % 7);
            if (n_held + max_blocks > RHELD) continue;
            int k = ie_kvpool_match(p, salt, ids, n, out, max_blocks);
            int want = (int)(n / RBT) < max_blocks ? (int)(n / RBT) : max_blocks;
            int j = 0;
            for (int parent = -1; j < want; j++) {
                int b = model_find(&m, salt, parent, ids + j * RBT);
                if (b < 0) break;
                REQ(j < k && out[j] == b);
                parent = b;
                m.b[b].ref++;
                held[n_held++] = b;
            }
            if (why) break;
            REQ(k == j);
            m.hits += (uint64_t)k;
            m.misses += (uint64_t)(want - k);
            n_deep += k >= 3;
        } else if (r < 99) { /* release of a bad id or a free block: ignored */
            int32_t b = (int32_t)(rng_u32() % (RN + 4)) - 2;
            if (b >= 0 && b < RN && m.b[b].ref > 0) continue;
            ie_kvpool_release(p, b);
        } else if (rng_u32() % 16 == 0) {
            ie_kvpool_forget(p);
            for (int b = 0; b < RN; b++) m.b[b].pub = 0;
        }

        ie_kvpool_stats_t s;
        ie_kvpool_stats(p, &s);
        int used = 0, cached = 0, free_ = 0;
        for (int b = 0; b < RN; b++) {
            used += m.b[b].ref > 0;
            cached += m.b[b].ref == 0 && m.b[b].pub;
            free_ += m.b[b].ref == 0 && !m.b[b].pub;
        }
        REQ(s.n_blocks == RN && s.used + s.cached + s.free == RN);
        REQ(s.used == used && s.cached == cached && s.free == free_);
        REQ(s.hit_blocks == m.hits && s.miss_blocks == m.misses && s.evictions == m.evictions);
        why = pool_check(p);
    }
#undef REQ
    if (why) fprintf(stderr, "\n  op %d (const_hash %d): %s\n", op, const_hash, why);
    CU_ASSERT_PTR_NULL(why);
    /* the run exercised what it is meant to */
    ie_kvpool_stats_t s;
    ie_kvpool_stats(p, &s);
    if (!why) {
        CU_ASSERT(s.hit_blocks > 1000 && s.miss_blocks > 1000 && s.evictions > 1000);
        CU_ASSERT(n_nomem > 100 && n_pub > 1000 && n_dup > 100 && n_deep > 100 && n_cascade > 100);
    }
    fprintf(stderr,
            "[%d ops: %llu hits, %llu misses, %llu evictions, %ld published, %ld dup, "
            "%ld deep, %ld cascaded, %ld full] ",
            op, (unsigned long long)s.hit_blocks, (unsigned long long)s.miss_blocks,
            (unsigned long long)s.evictions, n_pub, n_dup, n_deep, n_cascade, n_nomem);
    ie_kvpool_destroy(&p);
    g_const_hash = 0;
}

static void test_random(void) { random_run(0, 1, 100000); }
static void test_random_const_hash(void) { random_run(1, 2, 100000); }

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return (int)CU_get_error();
    CU_pSuite suite = CU_add_suite("kvpool", NULL, NULL);
    if (!suite) {
        CU_cleanup_registry();
        return (int)CU_get_error();
    }
    CU_add_test(suite, "new and NULL pool", test_new_and_null);
    CU_add_test(suite, "alloc until full", test_alloc_until_full);
    CU_add_test(suite, "refcounts", test_refcounts);
    CU_add_test(suite, "prefix match", test_prefix_match);
    CU_add_test(suite, "salt", test_salt);
    CU_add_test(suite, "evicted no match", test_evicted_no_match);
    CU_add_test(suite, "LRU order", test_lru_order);
    CU_add_test(suite, "duplicate and bad publish", test_duplicate_and_bad_publish);
    CU_add_test(suite, "forget", test_forget);
    CU_add_test(suite, "drop salt", test_drop_salt);
    CU_add_test(suite, "parent id reuse", test_parent_id_reuse);
    CU_add_test(suite, "constant hash", test_constant_hash);
    CU_add_test(suite, "bad input", test_bad_input);
    CU_add_test(suite, "random vs model", test_random);
    CU_add_test(suite, "random vs model, constant hash", test_random_const_hash);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}

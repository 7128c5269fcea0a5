/* kvpool.c — the coordinator's book of paged KV-cache blocks (see
 * ie_kvpool.h).
 *
 * Every block lives in exactly one of three places: the free list
 * (refcount 0, unpublished), the LRU list (refcount 0, published: cached,
 * least recently released at the head) or neither (used). Both lists are
 * intrusive and doubly linked through the same prev/next fields, so every
 * move is O(1).
 *
 * Published blocks sit in a chained hash table keyed by (salt, parent,
 * tokens); a lookup confirms salt, parent and all block_tokens ids, so the
 * hash only narrows the search.
 *
 * A key names its parent by block id, and ids are reused: once a parent is
 * evicted and reallocated for other tokens, a child still keyed on that id
 * would match under a prefix it was never computed for. So the pool keeps
 * one invariant: a published block's parent is published (same salt).
 * Publish refuses a child of an unpublished parent (match could never reach
 * it anyway), and unpublishing a block (eviction, forget) unpublishes its
 * whole subtree at once — cached descendants become free, used ones merely
 * unpublished. Each published block is linked into its parent's child list
 * for that. The cost is O(1) amortized (a block is unpublished at most once
 * per publish), and no unreachable entry ever occupies a cached block.
 */
#include "ie_kvpool.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct kvpool_blk {
    uint64_t salt;              /* published: namespace                             */
    uint64_t hash;              /* published: hash of its key                       */
    int32_t ref;                /* references (slots binding it)                    */
    int32_t prev, next;         /* refcount 0: neighbours in the free or LRU list   */
    int32_t hnext;              /* published: next block in its hash chain          */
    int32_t parent;             /* published: block holding the block before, or -1 */
    int32_t child;              /* published: first published child, or -1          */
    int32_t sib_prev, sib_next; /* published: siblings under parent         */
    uint8_t published;
    uint8_t spent; /* published since it was allocated: never again    */
} kvpool_blk_t;

typedef struct kvpool_list {
    int32_t head, tail; /* -1 when empty                                    */
    int n;
} kvpool_list_t;

struct ie_kvpool {
    int n_blocks;
    int block_tokens;
    kvpool_blk_t *blk; /* (n_blocks)                                       */
    int32_t *tokens;   /* (n_blocks, block_tokens) published blocks' ids   */
    int32_t *bucket;   /* (mask + 1) first block of each hash chain, or -1 */
    uint64_t mask;
    kvpool_list_t free; /* refcount 0, unpublished                          */
    kvpool_list_t lru;  /* refcount 0, published; head evicted first        */
    uint64_t hits, misses, evictions;
};

/* The key's hash. Tests may replace it (e.g. by a constant, so every key
 * collides) by defining IE_KVPOOL_HASH before including this file. */
static uint64_t kvpool_hash(uint64_t salt, int32_t parent, const int32_t *ids, int bt)
{
    uint64_t seed = salt ^ ((uint64_t)(uint32_t)(parent + 1) * 0x9e3779b97f4a7c15ull);
    return XXH3_64bits_withSeed(ids, (size_t)bt * sizeof *ids, seed);
}
#ifndef IE_KVPOOL_HASH
#define IE_KVPOOL_HASH(salt, parent, ids, bt) kvpool_hash(salt, parent, ids, bt)
#endif

/* ------------------------------------------------------------ lists */

static void kvpool_list_push(ie_kvpool_t *p, kvpool_list_t *l, int32_t b)
{
    p->blk[b].prev = l->tail;
    p->blk[b].next = -1;
    if (l->tail >= 0) p->blk[l->tail].next = b;
    else l->head = b;
    l->tail = b;
    l->n++;
}

static void kvpool_list_remove(ie_kvpool_t *p, kvpool_list_t *l, int32_t b)
{
    kvpool_blk_t *x = &p->blk[b];
    if (x->prev >= 0) p->blk[x->prev].next = x->next;
    else l->head = x->next;
    if (x->next >= 0) p->blk[x->next].prev = x->prev;
    else l->tail = x->prev;
    x->prev = x->next = -1;
    l->n--;
}

/* ------------------------------------------------------------ prefix entries */

/* The published block with exactly this key, or -1. */
static int32_t kvpool_find(const ie_kvpool_t *p, uint64_t h, uint64_t salt, int32_t parent, const int32_t *ids)
{
    size_t bytes = (size_t)p->block_tokens * sizeof *ids;
    for (int32_t b = p->bucket[h & p->mask]; b >= 0; b = p->blk[b].hnext) {
        const kvpool_blk_t *x = &p->blk[b];
        if (x->hash == h && x->salt == salt && x->parent == parent &&
            memcmp(p->tokens + (size_t)b * p->block_tokens, ids, bytes) == 0)
            return b;
    }
    return -1;
}

/* Unpublish b and every published descendant: drop their entries; the
 * cached ones among them become free. The subtree is walked through a
 * work list threaded on sib_next (the child lists are dismantled anyway). */
static void kvpool_unpublish(ie_kvpool_t *p, int32_t b)
{
    kvpool_blk_t *x = &p->blk[b];
    if (x->sib_prev >= 0) p->blk[x->sib_prev].sib_next = x->sib_next;
    else if (x->parent >= 0) p->blk[x->parent].child = x->sib_next;
    if (x->sib_next >= 0) p->blk[x->sib_next].sib_prev = x->sib_prev;
    x->sib_next = -1;

    for (int32_t w = b; w >= 0;) {
        x = &p->blk[w];
        int32_t rest = x->sib_next;
        for (int32_t c = x->child; c >= 0;) {
            int32_t c_next = p->blk[c].sib_next;
            p->blk[c].sib_next = rest;
            rest = c;
            c = c_next;
        }
        int32_t *link = &p->bucket[x->hash & p->mask];
        while (*link != w) link = &p->blk[*link].hnext;
        *link = x->hnext;
        x->hnext = x->parent = x->child = x->sib_prev = x->sib_next = -1;
        x->published = 0;
        if (x->ref == 0) {
            kvpool_list_remove(p, &p->lru, w);
            kvpool_list_push(p, &p->free, w);
        }
        w = rest;
    }
}

/* ------------------------------------------------------------ API */

ie_status_t ie_kvpool_new(int n_blocks, int block_tokens, ie_kvpool_t **out)
{
    ie_status_t st = IE_OK;
    ie_kvpool_t *p = NULL;

    if (!out) return ie_error_set(IE_ERR_INVAL, "kvpool: out is NULL");
    *out = NULL;
    if (n_blocks < 1 || block_tokens < 1 || (size_t)n_blocks * (size_t)block_tokens > SIZE_MAX / 8)
        return ie_error_set(IE_ERR_INVAL, "kvpool: bad size (%d blocks of %d tokens)", n_blocks, block_tokens);
    p = calloc(1, sizeof *p);
    if (!p) {
        st = ie_error_set(IE_ERR_NOMEM, "kvpool: out of memory");
        goto cleanup;
    }
    size_t n_buckets = 1;
    while (n_buckets < (size_t)n_blocks) n_buckets *= 2;
    p->n_blocks = n_blocks;
    p->block_tokens = block_tokens;
    p->mask = n_buckets - 1;
    p->blk = malloc((size_t)n_blocks * sizeof *p->blk);
    p->tokens = malloc((size_t)n_blocks * (size_t)block_tokens * sizeof *p->tokens);
    p->bucket = malloc(n_buckets * sizeof *p->bucket);
    if (!p->blk || !p->tokens || !p->bucket) {
        st = ie_error_set(IE_ERR_NOMEM, "kvpool: out of memory for %d blocks", n_blocks);
        goto cleanup;
    }
    memset(p->bucket, 0xff, n_buckets * sizeof *p->bucket); /* all -1 */
    p->free = p->lru = (kvpool_list_t){-1, -1, 0};
    for (int32_t b = 0; b < n_blocks; b++) {
        p->blk[b] = (kvpool_blk_t){.hnext = -1, .parent = -1, .child = -1, .sib_prev = -1, .sib_next = -1};
        kvpool_list_push(p, &p->free, b);
    }
    *out = p;
    p = NULL;
cleanup:
    ie_kvpool_destroy(&p);
    return st;
}

void ie_kvpool_destroy(ie_kvpool_t **self_p)
{
    if (!self_p || !*self_p) return;
    ie_kvpool_t *p = *self_p;
    free(p->blk);
    free(p->tokens);
    free(p->bucket);
    free(p);
    *self_p = NULL;
}

int ie_kvpool_block_tokens(const ie_kvpool_t *p) { return p ? p->block_tokens : 0; }

int ie_kvpool_available(const ie_kvpool_t *p) { return p ? p->free.n + p->lru.n : 0; }

int ie_kvpool_match(ie_kvpool_t *p, uint64_t salt, const int32_t *ids, size_t n, int32_t *blocks, int max_blocks)
{
    if (!p || max_blocks <= 0 || !blocks || (!ids && n > 0)) return 0;
    size_t want = n / (size_t)p->block_tokens;
    if (want > (size_t)max_blocks) want = (size_t)max_blocks;
    int k = 0;
    int32_t parent = -1;
    for (; (size_t)k < want; k++) {
        const int32_t *blk_ids = ids + (size_t)k * p->block_tokens;
        int32_t b = kvpool_find(p, IE_KVPOOL_HASH(salt, parent, blk_ids, p->block_tokens), salt, parent, blk_ids);
        if (b < 0) break;
        if (p->blk[b].ref++ == 0) kvpool_list_remove(p, &p->lru, b);
        blocks[k] = parent = b;
    }
    p->hits += (uint64_t)k;
    p->misses += (uint64_t)(want - (size_t)k);
    return k;
}

ie_status_t ie_kvpool_alloc(ie_kvpool_t *p, int32_t *block)
{
    ie_status_t st = IE_OK;
    int32_t b = -1;

    if (!p || !block) {
        st = ie_error_set(IE_ERR_INVAL, "kvpool: bad argument to alloc");
        goto cleanup;
    }
    if (p->free.n > 0) {
        b = p->free.head;
    } else if (p->lru.n > 0) {
        b = p->lru.head;
        kvpool_unpublish(p, b); /* b and its cached descendants go free */
        p->evictions++;
    } else {
        st = ie_error_set(IE_ERR_NOMEM, "KV cache full");
        goto cleanup;
    }
    kvpool_list_remove(p, &p->free, b);
    p->blk[b].ref = 1;
    p->blk[b].spent = 0;
cleanup:
    if (block) *block = b;
    return st;
}

ie_status_t ie_kvpool_retain(ie_kvpool_t *p, int32_t block)
{
    if (!p) return ie_error_set(IE_ERR_INVAL, "kvpool: pool is NULL");
    if (block < 0 || block >= p->n_blocks || (p->blk[block].ref == 0 && !p->blk[block].published))
        return ie_error_set(IE_ERR_RANGE, "kvpool: cannot retain block %d", (int)block);
    if (p->blk[block].ref++ == 0) kvpool_list_remove(p, &p->lru, block);
    return IE_OK;
}

void ie_kvpool_release(ie_kvpool_t *p, int32_t block)
{
    if (!p || block < 0 || block >= p->n_blocks || p->blk[block].ref == 0) return;
    kvpool_blk_t *x = &p->blk[block];
    if (--x->ref == 0) kvpool_list_push(p, x->published ? &p->lru : &p->free, block);
}

int ie_kvpool_publish(ie_kvpool_t *p, int32_t block, uint64_t salt, int32_t parent, const int32_t *block_ids)
{
    if (!p || !block_ids || block < 0 || block >= p->n_blocks) return 0;
    kvpool_blk_t *x = &p->blk[block];
    if (x->ref == 0 || x->published || x->spent) return 0;
    /* The invariant of the file comment: the parent must be reachable. */
    if (parent != -1 &&
        (parent < 0 || parent >= p->n_blocks || !p->blk[parent].published || p->blk[parent].salt != salt))
        return 0;
    uint64_t h = IE_KVPOOL_HASH(salt, parent, block_ids, p->block_tokens);
    if (kvpool_find(p, h, salt, parent, block_ids) >= 0)
        return 0; /* computed twice: the first copy stays the entry */

    memcpy(p->tokens + (size_t)block * p->block_tokens, block_ids, (size_t)p->block_tokens * sizeof *block_ids);
    x->salt = salt;
    x->hash = h;
    x->parent = parent;
    x->hnext = p->bucket[h & p->mask];
    p->bucket[h & p->mask] = block;
    x->sib_prev = -1;
    x->sib_next = parent >= 0 ? p->blk[parent].child : -1;
    if (parent >= 0) {
        if (x->sib_next >= 0) p->blk[x->sib_next].sib_prev = block;
        p->blk[parent].child = block;
    }
    x->published = x->spent = 1;
    return 1;
}

void ie_kvpool_forget(ie_kvpool_t *p)
{
    if (!p) return;
    for (int32_t b = 0; b < p->n_blocks; b++) {
        kvpool_blk_t *x = &p->blk[b];
        if (!x->published) continue;
        x->hnext = x->parent = x->child = x->sib_prev = x->sib_next = -1;
        x->published = 0;
        if (x->ref == 0) {
            kvpool_list_remove(p, &p->lru, b);
            kvpool_list_push(p, &p->free, b);
        }
    }
    memset(p->bucket, 0xff, (size_t)(p->mask + 1) * sizeof *p->bucket);
}

int ie_kvpool_drop_salt(ie_kvpool_t *p, uint64_t salt)
{
    if (!p) return 0;
    const int free0 = p->free.n;
    /* a published block's parent is published under the same salt, so
     * every block met takes its subtree along (a descendant met before its
     * root goes alone; one gone already is no longer published) */
    for (int32_t b = 0; b < p->n_blocks; b++)
        if (p->blk[b].published && p->blk[b].salt == salt) kvpool_unpublish(p, b);
    return p->free.n - free0;
}

void ie_kvpool_stats(const ie_kvpool_t *p, ie_kvpool_stats_t *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!p) return;
    out->n_blocks = p->n_blocks;
    out->cached = p->lru.n;
    out->free = p->free.n;
    out->used = p->n_blocks - p->lru.n - p->free.n;
    out->hit_blocks = p->hits;
    out->miss_blocks = p->misses;
    out->evictions = p->evictions;
}

/* ie_kvpool.h — the coordinator's book of paged KV-cache blocks.
 *
 * The workers hold the KV storage: a pool of n_blocks physical blocks of
 * block_tokens positions each, and per sequence slot a block table
 * (ie_worker_kv_bind). Which physical block holds what is decided here, on
 * the coordinator, once for every rank — so a tensor or pipeline cluster
 * needs no agreement protocol, only the bind operations the scheduler sends.
 *
 * Blocks are reference counted. A block is
 *   free      refcount 0, holds nothing reusable;
 *   used      refcount > 0 (bound in one or more slots' tables);
 *   cached    refcount 0 but published: it holds the K/V of a known token
 *             prefix and can be matched again until it is evicted (least
 *             recently released first) to satisfy an allocation.
 *
 * Prefix cache: a *full* block j of a sequence is identified by its tokens
 * and by the block holding the tokens before it (its parent), which makes
 * the key exact — a hash finds candidates, tokens and parent confirm them,
 * so a hash collision can never hand out wrong K/V. `salt` separates
 * namespaces whose K/V differ for the same tokens (e.g. LoRA adapters); use
 * 0 for the base model.
 *
 * Not thread-safe: the scheduler owns it and calls it from its one thread.
 */
#ifndef IE_KVPOOL_H
#define IE_KVPOOL_H

#include "ie_status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ie_kvpool ie_kvpool_t;

typedef struct ie_kvpool_stats {
    int n_blocks;         /* all blocks                                    */
    int used;             /* refcount > 0                                  */
    int cached;           /* refcount 0, published (evictable)             */
    int free;             /* refcount 0, unpublished                       */
    uint64_t hit_blocks;  /* blocks ie_kvpool_match handed out             */
    uint64_t miss_blocks; /* full blocks asked for and not found           */
    uint64_t evictions;   /* cached blocks reused for something else       */
} ie_kvpool_stats_t;

/* A pool of n_blocks (>= 1) blocks of block_tokens (>= 1) positions.
 * IE_ERR_INVAL on bad sizes, IE_ERR_NOMEM. Caller owns *out. */
ie_status_t ie_kvpool_new(int n_blocks, int block_tokens, ie_kvpool_t **out);
void ie_kvpool_destroy(ie_kvpool_t **self_p);

int ie_kvpool_block_tokens(const ie_kvpool_t *p);
/* Blocks an allocation can get now (free + cached). */
int ie_kvpool_available(const ie_kvpool_t *p);

/* Longest cached prefix of ids[0..n): the physical blocks holding full
 * blocks 0, 1, ..., k-1 of it, written to blocks[0..k) with a reference
 * taken on each (release them with ie_kvpool_release). At most max_blocks
 * are matched. Counts k hits and, for the full blocks of ids after the
 * first miss (up to max_blocks), misses. Returns k. */
int ie_kvpool_match(ie_kvpool_t *p, uint64_t salt, const int32_t *ids, size_t n, int32_t *blocks, int max_blocks);

/* A block with refcount 1: a free one, else the least recently released
 * cached one (its prefix entry is dropped). IE_ERR_NOMEM (message "KV cache
 * full") when every block is in use. */
ie_status_t ie_kvpool_alloc(ie_kvpool_t *p, int32_t *block);

/* Take one more reference on a used or cached block (a cached one becomes
 * used again). IE_ERR_RANGE for a bad id or a free block. */
ie_status_t ie_kvpool_retain(ie_kvpool_t *p, int32_t block);

/* Drop one reference. At refcount 0 a published block becomes cached (most
 * recently released), an unpublished one free. Bad ids are ignored. */
void ie_kvpool_release(ie_kvpool_t *p, int32_t block);

/* Record that `block` (used, refcount >= 1) now holds full block j of the
 * sequence ids[0..(j+1)*block_tokens), where parent is the block holding
 * block j-1 (-1 for j == 0). If an equal entry already exists (another
 * sequence computed the same prefix) nothing changes and 0 is returned;
 * else 1. A block is published at most once (later calls return 0). */
int ie_kvpool_publish(ie_kvpool_t *p, int32_t block, uint64_t salt, int32_t parent, const int32_t *block_ids);

/* Drop every prefix entry (the workers' K/V is gone, e.g. a worker was
 * replaced): cached blocks become free, used blocks stay used but
 * unpublished. Statistics are kept. */
void ie_kvpool_forget(ie_kvpool_t *p);

/* Drop every prefix entry of namespace `salt` (an adapter set that was
 * detached: its K/V can never be matched again). Cached blocks of it
 * become free now instead of ageing out; used ones (still bound in a
 * slot) stay used, merely unpublished. Other salts' entries are kept.
 * Returns the number of blocks made free. */
int ie_kvpool_drop_salt(ie_kvpool_t *p, uint64_t salt);

void ie_kvpool_stats(const ie_kvpool_t *p, ie_kvpool_stats_t *out);

#endif

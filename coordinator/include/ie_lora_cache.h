/* ie_lora_cache.h — the engine's LoRA adapter registry (docs/LORA.md):
 * adapters by name, loaded and unloaded at run time, held within a memory
 * budget (least recently used unpinned ones evicted, reloaded from disk
 * when asked for again), and the weighted adapter *sets* requests run
 * attached to the backend (ie_backend_lora_add), each under its own id and
 * prefix-cache salt.
 *
 * A request leases a set (ie_lora_cache_acquire) before it is submitted
 * and gives it back at its terminal event (ie_lora_cache_release). A
 * leased set, and every adapter in it, is never detached or evicted.
 * Unloading a leased adapter takes its name away at once (new requests no
 * longer find it) and detaches it when its last lease ends.
 *
 * Salt: every set attached gets a salt never given out before (a counter
 * with the top bit set: never 0, the base's, nor the scheduler's legacy
 * adapter id + 1), so the prefix cache cannot hand a reloaded or reused
 * adapter id the K/V another adapter computed. The salts of detached sets
 * are handed to the stepping thread (ie_lora_cache_take_detached), which
 * frees their prefix blocks at once (ie_sched_drop_salt).
 *
 * Threads: every function may be called from any thread. Attaching and
 * detaching use the backend, which belongs to the stepping thread
 * (ie_backend.h): a serving loop registers itself (ie_lora_cache_stepper)
 * and brackets each step with ie_lora_cache_step_begin / _end; between
 * the two steps step_begin runs the attaches and detaches other threads
 * queued (they wait for their outcome meanwhile) and the detaches that
 * waited for a lease. An attach the backend answers later (a cluster's
 * ranks: ie_backend_lora_add_begin) stays in flight across steps: only
 * its requester and the jobs queued behind it wait (one attach at a
 * time), the steps go on. With no stepping thread registered (the CLI,
 * start-up) a call attaches at once under the step lock that
 * step_begin / _end hold, as the stepping thread's own calls do.
 */
#ifndef IE_LORA_CACHE_H
#define IE_LORA_CACHE_H

#include "ie_backend.h"
#include "ie_lora.h"
#include "ie_metrics.h"
#include "ie_status.h"

#include <stddef.h>
#include <stdint.h>

#define IE_LORA_CACHE_MAX 256 /* adapters registered (resident or not) */
#define IE_LORA_SET_MAX 64    /* sets attached at once (backend ids)   */
#define IE_LORA_SET_PARTS 8   /* adapters in one set                   */
#define IE_LORA_NAME_MAX 64   /* bytes of a name, NUL included          */

typedef struct ie_lora_cache ie_lora_cache_t;

typedef struct ie_lora_cache_opts {
    ie_backend_t *backend;  /* not owned, outlives the cache          */
    const ie_hparams_t *hp; /* the base's: adapters are checked on it */
    uint64_t budget_bytes;  /* resident adapter weights at most, with
                                the backend's copies of attached sets
                                (ie_backend_lora_bytes) (0: no limit);
                                pinned and leased adapters are never
                                evicted, so it may be exceeded while
                                they alone fill it                    */
    ie_metrics_t *metrics;  /* optional: ie_lora_* series            */
} ie_lora_cache_opts_t;

/* One adapter of a requested set: its name and weight. */
typedef struct ie_lora_use {
    const char *name;
    float scale; /* finite; 0 parts are dropped by the callers */
} ie_lora_use_t;

/* A leased set: the backend id a request's tokens carry (ie_batch_t
 * .adapter, ie_sched_req_t.lora - 1), its prefix-cache salt, and the
 * handle ie_lora_cache_release takes. id -1 / salt 0: the base model (an
 * empty set), which release accepts. */
typedef struct ie_lora_lease {
    int id;
    uint64_t salt;
    int set; /* internal: the set's slot (-1: none) */
} ie_lora_lease_t;

/* One adapter, as ie_lora_cache_list reports it. */
typedef struct ie_lora_info {
    char name[IE_LORA_NAME_MAX];
    int index;      /* its registry slot: llama.cpp's `lora[].id` */
    int resident;   /* weights in memory (else reloaded on use)  */
    int pinned;     /* never evicted                             */
    uint64_t bytes; /* of its weights when resident              */
} ie_lora_info_t;

/* IE_ERR_INVAL without a backend or hparams, IE_ERR_NOMEM. Caller owns
 * *out (ie_lora_cache_destroy, before the backend goes). */
ie_status_t ie_lora_cache_new(const ie_lora_cache_opts_t *o, ie_lora_cache_t **out);

/* Detach every set still attached and free every adapter; accepts NULL.
 * Leases still out become invalid (release ignores them). */
void ie_lora_cache_destroy(ie_lora_cache_t **self_p);

/* Load the adapter at path (PEFT directory or GGUF LoRA) from disk now and
 * register it as `name` with default scale `scale` (what a request naming
 * it in `model` runs), pinned (never evicted) or not. The file is read
 * with no lock held. Errors: IE_ERR_INVAL for a bad name (1..63
 * characters, none of '=' ',' ':') or one taken ("already loaded"),
 * ie_lora_load's (IE_ERR_IO missing, IE_ERR_FORMAT / IE_ERR_UNSUPPORTED
 * a bad or refused adapter, naming the tensor), IE_ERR_RANGE when the
 * registry is full or the adapter alone exceeds the budget (its weights
 * and the copy the backend would make: ie_backend_lora_cost). Nothing
 * changes on failure; other adapters may be evicted on success. */
ie_status_t ie_lora_cache_load(ie_lora_cache_t *c, const char *name, const char *path, float scale, int pinned);

/* Take `name` away: IE_ERR_RANGE ("cannot be found") when no adapter has
 * it. When no request holds it, it is detached and freed now (*deferred
 * 0); else it is detached at the last lease's release (*deferred 1;
 * deferred may be NULL). Pinned adapters may be unloaded too. */
ie_status_t ie_lora_cache_unload(ie_lora_cache_t *c, const char *name, int *deferred);

/* Lease the set sum_i uses[i].scale * adapter(uses[i].name) (1..8 parts,
 * distinct names; the order does not matter): an equal set attached
 * already (same adapters, loaded the same time, same scales) is reused,
 * else one is attached, reloading evicted adapters from disk first (that
 * load counts in the load metrics). scale NAN stands for the adapter's
 * default scale. Errors: IE_ERR_RANGE ("cannot be found", naming it) for
 * an unknown name; IE_ERR_INVAL for 0 or more than 8 parts, a repeated
 * name or a non-finite scale; IE_ERR_BUSY when all IE_LORA_SET_MAX sets
 * are leased; a reload's or the backend's errors. n 0 with uses NULL
 * gives the base's lease (id -1) and IE_OK. */
ie_status_t ie_lora_cache_acquire(ie_lora_cache_t *c, const ie_lora_use_t *uses, int n, ie_lora_lease_t *out);

/* End a lease; n_gen (tokens the request generated) counts into each of
 * its adapters' metrics with one request. Accepts the base's lease and
 * leases of a destroyed set (no-op). Never touches the backend: a detach
 * this allows waits for the next step_begin. */
void ie_lora_cache_release(ie_lora_cache_t *c, const ie_lora_lease_t *l, size_t n_gen);

/* The salt of the set attached under backend id `id` (0 for -1 or an id
 * not attached): for callers that only kept the id. */
uint64_t ie_lora_cache_salt(ie_lora_cache_t *c, int id);

/* Bracket one backend step (stepping thread): begin takes the attach
 * mutex and runs the detaches that waited for a lease; end releases it. */
void ie_lora_cache_step_begin(ie_lora_cache_t *c);
void ie_lora_cache_step_end(ie_lora_cache_t *c);

/* on 1: the calling thread is the stepping thread from now on; other
 * threads' attaches and detaches are queued for its step_begin, and
 * wake(wake_ctx) (may be NULL) is called when one is queued, to rouse it
 * from an idle wait. on 0 (the same thread, its loop over): what is
 * queued runs now, and later calls attach at once again. */
void ie_lora_cache_stepper(ie_lora_cache_t *c, int on, void (*wake)(void *), void *wake_ctx);

/* Move up to max salts of sets detached since the last call (unload,
 * eviction, a set slot reused) into salts; returns how many. The stepping
 * thread hands them to ie_sched_drop_salt so their prefix-cache blocks are
 * freed at once. Any thread. */
int ie_lora_cache_take_detached(ie_lora_cache_t *c, uint64_t *salts, int max);

/* Up to max registered adapters (in slot order) into out; returns how
 * many there are in all. */
int ie_lora_cache_list(ie_lora_cache_t *c, ie_lora_info_t *out, int max);

/* The registry slot of `name` (ie_lora_info_t.index), -1 when none. */
int ie_lora_cache_index(ie_lora_cache_t *c, const char *name);

/* The name registered in slot `index` into buf (size >= IE_LORA_NAME_MAX):
 * 0, or -1 when the slot is empty. */
int ie_lora_cache_name_at(ie_lora_cache_t *c, int index, char *buf);

/* Counters for tests and the CLI: resident adapters and the bytes the
 * budget counts (their weights, plus what the backend holds in this
 * process for each attached set: ie_backend_lora_bytes — a sum's
 * concatenated copy, a worker's int8 copy), loads from disk, evictions,
 * sets attached. */
typedef struct ie_lora_cache_stats {
    int resident, sets;
    uint64_t bytes, loads, evictions;
} ie_lora_cache_stats_t;
void ie_lora_cache_stats(ie_lora_cache_t *c, ie_lora_cache_stats_t *out);

#endif

/* tokenizer_map.c — small open-addressing hash maps for the tokenizer.
 *
 * Two maps with linear probing and a power-of-two capacity kept at most half
 * full: token text -> id (keys are borrowed pointers into the tokenizer's
 * pool) and (left id, right id) -> (merge rank, merged id). Both are built
 * once at load time and only read afterwards, so lookups need no locking.
 */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

struct ie_tok_strslot {
    const char *key; /* NULL = empty */
    uint32_t len;
    int32_t value;
    uint64_t hash;
};

struct ie_tok_pairslot {
    uint64_t key; /* (left << 32) | right */
    int32_t rank; /* -1 = empty */
    int32_t merged;
};

/* FNV-1a, 64 bit: short keys, good enough spread after the final mix. */
static uint64_t hash_bytes(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    h ^= h >> 29;
    return h;
}

/* splitmix64 finaliser */
static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static size_t cap_for(size_t expected)
{
    size_t cap = 16;
    while (cap < expected * 2 + 1) { cap <<= 1; }
    return cap;
}

ie_status_t ie_tok_strmap_init(ie_tok_strmap_t *m, size_t expected)
{
    memset(m, 0, sizeof *m);
    if (expected > (SIZE_MAX / 4) / sizeof(struct ie_tok_strslot)) {
        return ie_error_set(IE_ERR_NOMEM, "tokenizer: hash map too large");
    }
    m->cap = cap_for(expected);
    m->slots = calloc(m->cap, sizeof *m->slots);
    if (!m->slots) {
        m->cap = 0;
        return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory for hash map");
    }
    return IE_OK;
}

void ie_tok_strmap_free(ie_tok_strmap_t *m)
{
    if (!m) { return; }
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static ie_status_t strmap_grow(ie_tok_strmap_t *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 16;
    struct ie_tok_strslot *ns = calloc(ncap, sizeof *ns);
    if (!ns) { return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory for hash map"); }
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].key) {
            size_t j = m->slots[i].hash & (ncap - 1);
            while (ns[j].key) { j = (j + 1) & (ncap - 1); }
            ns[j] = m->slots[i];
        }
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return IE_OK;
}

ie_status_t ie_tok_strmap_put(ie_tok_strmap_t *m, const char *key, size_t len, int32_t value, int *inserted_out)
{
    if (inserted_out) { *inserted_out = 0; }
    if (len > UINT32_MAX) { return ie_error_set(IE_ERR_RANGE, "tokenizer: key too long"); }
    if ((m->count + 1) * 2 > m->cap) {
        ie_status_t st = strmap_grow(m);
        if (st != IE_OK) { return st; }
    }
    uint64_t h = hash_bytes(key, len);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].key) {
        struct ie_tok_strslot *s = &m->slots[j];
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) {
            return IE_OK; /* present: first value wins */
        }
        j = (j + 1) & (m->cap - 1);
    }
    /* an empty key still needs a non-NULL pointer to mark the slot used */
    m->slots[j].key = len ? key : "";
    m->slots[j].len = (uint32_t)len;
    m->slots[j].value = value;
    m->slots[j].hash = h;
    m->count++;
    if (inserted_out) { *inserted_out = 1; }
    return IE_OK;
}

int32_t ie_tok_strmap_get(const ie_tok_strmap_t *m, const char *key, size_t len)
{
    if (m->cap == 0) { return -1; }
    uint64_t h = hash_bytes(key, len);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].key) {
        const struct ie_tok_strslot *s = &m->slots[j];
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) { return s->value; }
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

static void pairmap_clear_slots(struct ie_tok_pairslot *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        s[i].key = 0;
        s[i].rank = -1;
        s[i].merged = -1;
    }
}

ie_status_t ie_tok_pairmap_init(ie_tok_pairmap_t *m, size_t expected)
{
    memset(m, 0, sizeof *m);
    if (expected > (SIZE_MAX / 4) / sizeof(struct ie_tok_pairslot)) {
        return ie_error_set(IE_ERR_NOMEM, "tokenizer: merge table too large");
    }
    m->cap = cap_for(expected);
    m->slots = malloc(m->cap * sizeof *m->slots);
    if (!m->slots) {
        m->cap = 0;
        return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory for merge table");
    }
    pairmap_clear_slots(m->slots, m->cap);
    return IE_OK;
}

void ie_tok_pairmap_free(ie_tok_pairmap_t *m)
{
    if (!m) { return; }
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static uint64_t pair_key(int32_t left, int32_t right) { return ((uint64_t)(uint32_t)left << 32) | (uint32_t)right; }

static ie_status_t pairmap_grow(ie_tok_pairmap_t *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 16;
    struct ie_tok_pairslot *ns = malloc(ncap * sizeof *ns);
    if (!ns) { return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory for merge table"); }
    pairmap_clear_slots(ns, ncap);
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].rank >= 0) {
            size_t j = hash_u64(m->slots[i].key) & (ncap - 1);
            while (ns[j].rank >= 0) { j = (j + 1) & (ncap - 1); }
            ns[j] = m->slots[i];
        }
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return IE_OK;
}

ie_status_t ie_tok_pairmap_put(ie_tok_pairmap_t *m, int32_t left, int32_t right, int32_t rank, int32_t merged)
{
    if (rank < 0) { return ie_error_set(IE_ERR_INTERNAL, "tokenizer: negative merge rank"); }
    if ((m->count + 1) * 2 > m->cap) {
        ie_status_t st = pairmap_grow(m);
        if (st != IE_OK) { return st; }
    }
    uint64_t k = pair_key(left, right);
    size_t j = hash_u64(k) & (m->cap - 1);
    while (m->slots[j].rank >= 0) {
        if (m->slots[j].key == k) { return IE_OK; }
        j = (j + 1) & (m->cap - 1);
    }
    m->slots[j].key = k;
    m->slots[j].rank = rank;
    m->slots[j].merged = merged;
    m->count++;
    return IE_OK;
}

int ie_tok_pairmap_get(const ie_tok_pairmap_t *m, int32_t left, int32_t right, int32_t *rank_out,
                       int32_t *merged_out)
{
    if (m->cap == 0) { return 0; }
    uint64_t k = pair_key(left, right);
    size_t j = hash_u64(k) & (m->cap - 1);
    while (m->slots[j].rank >= 0) {
        if (m->slots[j].key == k) {
            *rank_out = m->slots[j].rank;
            *merged_out = m->slots[j].merged;
            return 1;
        }
        j = (j + 1) & (m->cap - 1);
    }
    return 0;
}

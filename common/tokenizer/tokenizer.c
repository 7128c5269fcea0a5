/* tokenizer.c — the tokenizer core: tables, encode (special-token split,
 * normalisation, pre-tokenizer, BPE), token bytes and the streaming
 * detokenizer. Loaders live in tokenizer_gguf.c and tokenizer_json.c.
 *
 * BPE works on contiguous spans of the (normalised) text: a symbol is a
 * byte range plus a token id, merges join neighbours through a linked list
 * and a binary heap ordered by (priority, position) — the order both
 * Hugging Face's BPE (rank, lower first) and SentencePiece / llama.cpp
 * (score, higher first) use, so the result matches theirs and the cost is
 * O(n log n) even for a megabyte-long word.
 *
 * Byte-level vocabularies are stored decoded (raw bytes), so GPT-2's
 * byte->Unicode mapping is applied once at load time, never per encode.
 */
#include "tokenizer_internal.h"

#include "ie_array.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ================================================================ building */

ie_status_t ie_tok_alloc(int32_t n_vocab, ie_tokenizer_t **out)
{
    ie_status_t st = IE_OK;
    ie_tokenizer_t *t = NULL;
    *out = NULL;
    if (n_vocab <= 0 || n_vocab > (1 << 24)) {
        st = ie_error_set(IE_ERR_FORMAT, "tokenizer: vocabulary size %d out of range (1..16777216)", (int)n_vocab);
        goto cleanup;
    }
    t = calloc(1, sizeof *t);
    if (!t) {
        st = ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
        goto cleanup;
    }
    t->tokens = calloc((size_t)n_vocab, sizeof *t->tokens);
    if (!t->tokens) {
        st = ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory for %d tokens", (int)n_vocab);
        goto cleanup;
    }
    t->n_vocab = n_vocab;
    for (int32_t i = 0; i < n_vocab; i++) { t->tokens[i].type = IE_TOKT_UNUSED; }
    for (int i = 0; i < 256; i++) {
        t->byte_sym[i] = -1;
        t->byte_tok[i] = -1;
    }
    t->bos = t->eos = t->eot = t->unk = t->pad = t->bpe_unk = -1;
    t->fim_pre = t->fim_suf = t->fim_mid = -1;
    *out = t;
    t = NULL;

cleanup:
    ie_tokenizer_destroy(&t);
    return st;
}

ie_status_t ie_tok_pool_add(ie_tokenizer_t *t, const char *s, size_t len, uint32_t *off_out)
{
    if (len > UINT32_MAX - t->pool_len) {
        return ie_error_set(IE_ERR_RANGE, "tokenizer: vocabulary text exceeds 4 GiB");
    }
    if (t->pool_len + len > t->pool_cap) {
        size_t ncap = t->pool_cap ? t->pool_cap : 4096;
        while (ncap < t->pool_len + len) { ncap *= 2; }
        char *np = realloc(t->pool, ncap);
        if (!np) { return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory for vocabulary text"); }
        t->pool = np;
        t->pool_cap = ncap;
    }
    if (len) { memcpy(t->pool + t->pool_len, s, len); }
    *off_out = (uint32_t)t->pool_len;
    t->pool_len += len;
    return IE_OK;
}

ie_status_t ie_tok_set_token(ie_tokenizer_t *t, int32_t id, const char *text, size_t text_len, const char *piece,
                             size_t piece_len)
{
    ie_status_t st;
    if (id < 0 || id >= t->n_vocab) {
        return ie_error_set(IE_ERR_INTERNAL, "tokenizer: token id %d out of range", (int)id);
    }
    ie_tok_token_t *tk = &t->tokens[id];
    if ((st = ie_tok_pool_add(t, text, text_len, &tk->text_off)) != IE_OK) { return st; }
    tk->text_len = (uint32_t)text_len;
    if (piece == text && piece_len == text_len) {
        tk->piece_off = tk->text_off;
    } else if ((st = ie_tok_pool_add(t, piece, piece_len, &tk->piece_off)) != IE_OK) {
        return st;
    }
    tk->piece_len = (uint32_t)piece_len;
    return IE_OK;
}

ie_status_t ie_tok_add_step(ie_tokenizer_t *t, pcre2_code *re, ie_tok_split_behavior_t behavior, int invert)
{
    ie_tok_pretok_step_t *ns = realloc(t->steps, (t->n_steps + 1) * sizeof *ns);
    if (!ns) {
        pcre2_code_free(re);
        return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->steps = ns;
    t->steps[t->n_steps].re = re;
    t->steps[t->n_steps].behavior = behavior;
    t->steps[t->n_steps].invert = invert;
    t->steps[t->n_steps].on_bytelevel = 0;
    t->n_steps++;
    return IE_OK;
}

ie_status_t ie_tok_add_eog(ie_tokenizer_t *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab) { return IE_OK; }
    size_t i = 0;
    while (i < t->n_eog && t->eog[i] < id) { i++; }
    if (i < t->n_eog && t->eog[i] == id) { return IE_OK; }
    int32_t *ne = realloc(t->eog, (t->n_eog + 1) * sizeof *ne);
    if (!ne) { return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory"); }
    t->eog = ne;
    memmove(t->eog + i + 1, t->eog + i, (t->n_eog - i) * sizeof *ne);
    t->eog[i] = id;
    t->n_eog++;
    return IE_OK;
}

ie_status_t ie_tok_build_text_map(ie_tokenizer_t *t)
{
    ie_status_t st = IE_OK;
    if (t->text_map.cap) { return IE_OK; }
    st = ie_tok_strmap_init(&t->text_map, (size_t)t->n_vocab);
    for (int32_t i = 0; i < t->n_vocab && st == IE_OK; i++) {
        const ie_tok_token_t *tk = &t->tokens[i];
        if (tk->in_bpe && tk->text_len > 0) {
            st = ie_tok_strmap_put(&t->text_map, t->pool + tk->text_off, tk->text_len, i, NULL);
        }
    }
    return st;
}

typedef struct match_key {
    unsigned char first;
    uint32_t len;
    int32_t id;
} match_key_t;

static int cmp_match(const void *a, const void *b)
{
    const match_key_t *x = a, *y = b;
    if (x->first != y->first) { return x->first < y->first ? -1 : 1; }
    if (x->len != y->len) { return x->len > y->len ? -1 : 1; /* longest first */ }
    return x->id < y->id ? -1 : (x->id > y->id);
}

ie_status_t ie_tok_finalize(ie_tokenizer_t *t)
{
    ie_status_t st = IE_OK;
    match_key_t *keys = NULL;

    if ((st = ie_tok_build_text_map(t)) != IE_OK) { goto cleanup; }
    const int32_t *ids[] = {&t->bos, &t->eos, &t->eot, &t->unk, &t->pad};
    const char *names[] = {"bos", "eos", "eot", "unknown", "padding"};
    for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++) {
        if (*ids[k] < -1 || *ids[k] >= t->n_vocab) {
            st = ie_error_set(IE_ERR_FORMAT, "tokenizer: %s token id %d out of range (vocabulary has %d)", names[k],
                              (int)*ids[k], (int)t->n_vocab);
            goto cleanup;
        }
    }

    /* single bytes (byte-level) and <0xXX> tokens (SPM byte fallback) */
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_sym[b] = ie_tok_strmap_get(&t->text_map, &c, 1);
    }
    for (int32_t i = t->n_vocab; i-- > 0;) {
        const ie_tok_token_t *tk = &t->tokens[i];
        if (tk->type == IE_TOKT_BYTE && tk->piece_len == 1) {
            t->byte_tok[(unsigned char)t->pool[tk->piece_off]] = i; /* lowest id wins */
        }
    }

    /* special / added tokens matched in the text, grouped by first byte */
    size_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const ie_tok_token_t *tk = &t->tokens[i];
        if ((tk->flags & IE_TOKF_MATCHABLE) && tk->text_len > 0 &&
            ie_tok_utf8_valid_prefix(t->pool + tk->text_off, tk->text_len) == tk->text_len) {
            n++;
        }
    }
    if (n) {
        keys = malloc(n * sizeof *keys);
        t->match_ids = malloc(n * sizeof *t->match_ids);
        if (!keys || !t->match_ids) {
            st = ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
            goto cleanup;
        }
        size_t k = 0;
        for (int32_t i = 0; i < t->n_vocab; i++) {
            const ie_tok_token_t *tk = &t->tokens[i];
            if ((tk->flags & IE_TOKF_MATCHABLE) && tk->text_len > 0 &&
                ie_tok_utf8_valid_prefix(t->pool + tk->text_off, tk->text_len) == tk->text_len) {
                keys[k].first = (unsigned char)t->pool[tk->text_off];
                keys[k].len = tk->text_len;
                keys[k].id = i;
                k++;
            }
        }
        qsort(keys, n, sizeof *keys, cmp_match);
        for (size_t i = 0; i < n; i++) { t->match_ids[i] = keys[i].id; }
    }
    t->n_match = n;
    {
        size_t k = 0;
        for (int b = 0; b <= 256; b++) {
            while (b < 256 && k < n && keys[k].first < b) { k++; }
            t->match_start[b] = (uint32_t)(b < 256 ? k : n);
        }
    }

    /* SentencePiece vocabularies trained with split_by_whitespace never put
     * U+2581 after another character inside a piece. Then no merge crosses
     * the start of a "word" (a U+2581 run and what follows it), merges in
     * different words never interact, and BPE per word gives exactly the
     * result of BPE over the whole text, with small heaps. */
    if (t->algo == IE_TOK_ALGO_SPM) {
        t->spm_word_split = 1;
        for (int32_t i = 0; i < t->n_vocab && t->spm_word_split; i++) {
            const ie_tok_token_t *tk = &t->tokens[i];
            const char *s = t->pool + tk->text_off;
            if (!tk->in_bpe) { continue; }
            for (uint32_t k = 1; k + 3 <= tk->text_len; k++) {
                if (memcmp(s + k, "\xE2\x96\x81", 3) == 0 && (k < 3 || memcmp(s + k - 3, "\xE2\x96\x81", 3) != 0)) {
                    t->spm_word_split = 0;
                    break;
                }
            }
        }
    }

    if ((st = ie_tok_add_eog(t, t->eos)) != IE_OK || (st = ie_tok_add_eog(t, t->eot)) != IE_OK) { goto cleanup; }

cleanup:
    free(keys);
    return st;
}

/* ================================================================ public: load */

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* GGUF starts with the magic "GGUF"; anything else is treated as JSON. */
static int file_is_gguf(const char *path)
{
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) { return 0; }
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}

ie_status_t ie_tokenizer_load(const char *path, ie_tokenizer_t **out)
{
    ie_status_t st = IE_OK;
    char *json = NULL, *config = NULL;
    if (!out) { return ie_error_set(IE_ERR_INVAL, "ie_tokenizer_load: out is NULL"); }
    *out = NULL;
    if (!path || !*path) { return ie_error_set(IE_ERR_INVAL, "ie_tokenizer_load: empty path"); }
    struct stat sb;
    if (stat(path, &sb) != 0) { return ie_error_set(IE_ERR_IO, "tokenizer: cannot open '%s'", path); }
    size_t plen = strlen(path);
    if (S_ISDIR(sb.st_mode)) {
        json = malloc(plen + 32);
        config = malloc(plen + 32);
        if (!json || !config) {
            st = ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
            goto cleanup;
        }
        snprintf(json, plen + 32, "%s/tokenizer.json", path);
        snprintf(config, plen + 32, "%s/tokenizer_config.json", path);
        if (stat(json, &sb) != 0) {
            st = ie_error_set(IE_ERR_IO, "tokenizer: directory '%s' holds no tokenizer.json", path);
            goto cleanup;
        }
        st = ie_tok_load_json(json, config, out);
    } else if (file_is_gguf(path) || ends_with(path, ".gguf")) {
        st = ie_tok_load_gguf(path, out);
    } else if (ends_with(path, ".tiktoken")) {
        /* the harmony special-token table next to the ranks, if any */
        const char *slash = strrchr(path, '/');
        size_t dlen = slash ? (size_t)(slash - path) + 1 : 0;
        json = malloc(dlen + sizeof IE_TIKTOKEN_SPECIALS);
        if (!json) {
            st = ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
            goto cleanup;
        }
        memcpy(json, path, dlen);
        memcpy(json + dlen, IE_TIKTOKEN_SPECIALS, sizeof IE_TIKTOKEN_SPECIALS);
        st = ie_tokenizer_load_tiktoken(path, stat(json, &sb) == 0 ? json : NULL, out);
    } else {
        /* tokenizer_config.json next to the file, if any */
        const char *slash = strrchr(path, '/');
        size_t dlen = slash ? (size_t)(slash - path) + 1 : 0;
        config = malloc(dlen + 32);
        if (!config) {
            st = ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
            goto cleanup;
        }
        memcpy(config, path, dlen);
        strcpy(config + dlen, "tokenizer_config.json");
        st = ie_tok_load_json(path, config, out);
    }

cleanup:
    free(json);
    free(config);
    return st;
}

void ie_tokenizer_destroy(ie_tokenizer_t **self_p)
{
    if (!self_p || !*self_p) { return; }
    ie_tokenizer_t *t = *self_p;
    for (size_t i = 0; i < t->n_steps; i++) { pcre2_code_free(t->steps[i].re); }
    free(t->steps);
    ie_tok_strmap_free(&t->text_map);
    ie_tok_pairmap_free(&t->merges);
    free(t->match_ids);
    free(t->eog);
    free(t->tokens);
    free(t->pool);
    free(t);
    *self_p = NULL;
}

/* ================================================================ encode */

typedef struct sym {
    int32_t id;     /* token id, -1 = not in vocabulary */
    uint32_t start; /* byte offset in the word */
    uint32_t len;   /* 0 once merged into its left neighbour */
    int32_t prev, next;
} sym_t;

typedef struct heap_ent {
    double prio;    /* lower pops first: rank, or -score */
    int32_t pos;    /* left symbol */
    int32_t merged; /* resulting token */
    uint32_t size;  /* left.len + right.len when queued */
} heap_ent_t;

typedef struct enc {
    const ie_tokenizer_t *t;
    int32_t *ids;
    size_t n_ids, cap_ids;
    char *norm;
    size_t cap_norm;
    char *nfc; /* NFC of the current stretch */
    size_t cap_nfc;
    ie_tok_spans_t sa, sb;
    sym_t *sym;
    size_t cap_sym;
    heap_ent_t *heap;
    size_t n_heap, cap_heap;
    pcre2_match_data *md;
    pcre2_match_context *mctx; /* NULL: defaults */
} enc_t;

static ie_status_t push_id(enc_t *e, int32_t id)
{
    if (ie_array_grow((void **)&e->ids, &e->cap_ids, e->n_ids + 1, sizeof *e->ids) != 0) {
        return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory for token ids");
    }
    e->ids[e->n_ids++] = id;
    return IE_OK;
}

static int heap_less(const heap_ent_t *a, const heap_ent_t *b)
{
    return a->prio < b->prio || (a->prio == b->prio && a->pos < b->pos);
}

static ie_status_t heap_push(enc_t *e, heap_ent_t v)
{
    if (ie_array_grow((void **)&e->heap, &e->cap_heap, e->n_heap + 1, sizeof *e->heap) != 0) {
        return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t i = e->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&v, &e->heap[p])) { break; }
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = v;
    return IE_OK;
}

static heap_ent_t heap_pop(enc_t *e)
{
    heap_ent_t top = e->heap[0];
    heap_ent_t last = e->heap[--e->n_heap];
    size_t n = e->n_heap, i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n) { break; }
        size_t c = (l + 1 < n && heap_less(&e->heap[l + 1], &e->heap[l])) ? l + 1 : l;
        if (!heap_less(&e->heap[c], &last)) { break; }
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n) { e->heap[i] = last; }
    return top;
}

/* Queue the merge of symbol l with its right neighbour, if one exists. */
static ie_status_t try_pair(enc_t *e, const char *w, int32_t l)
{
    const ie_tokenizer_t *t = e->t;
    if (l < 0) { return IE_OK; }
    int32_t r = e->sym[l].next;
    if (r < 0) { return IE_OK; }
    const sym_t *a = &e->sym[l], *b = &e->sym[r];
    heap_ent_t h;
    h.pos = l;
    h.size = a->len + b->len;
    if (t->merge_mode == IE_TOK_MERGE_RANK) {
        int32_t rank, merged;
        if (a->id < 0 || b->id < 0 || !ie_tok_pairmap_get(&t->merges, a->id, b->id, &rank, &merged)) {
            return IE_OK;
        }
        h.prio = rank;
        h.merged = merged;
    } else {
        int32_t id = ie_tok_strmap_get(&t->text_map, w + a->start, h.size);
        if (id < 0) { return IE_OK; }
        /* tiktoken: the rank (= id) of the joined bytes; SPM: best score */
        h.prio = t->merge_mode == IE_TOK_MERGE_TIKTOKEN ? (double)id : -(double)t->tokens[id].score;
        h.merged = id;
    }
    return heap_push(e, h);
}

static ie_status_t add_sym(enc_t *e, size_t *n, int32_t id, uint32_t start, uint32_t len)
{
    if (*n == e->cap_sym) {
        size_t ncap = e->cap_sym ? e->cap_sym * 2 : 256;
        sym_t *ns = realloc(e->sym, ncap * sizeof *ns);
        if (!ns) { return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory"); }
        e->sym = ns;
        e->cap_sym = ncap;
    }
    sym_t *s = &e->sym[*n];
    s->id = id;
    s->start = start;
    s->len = len;
    s->prev = (int32_t)*n - 1;
    s->next = -1;
    if (*n > 0) { e->sym[*n - 1].next = (int32_t)*n; }
    (*n)++;
    return IE_OK;
}

/* Emit the ids of a symbol that is not in the vocabulary. */
static ie_status_t emit_unknown(enc_t *e, const char *w, const sym_t *s)
{
    const ie_tokenizer_t *t = e->t;
    ie_status_t st = IE_OK;
    if (t->algo == IE_TOK_ALGO_SPM && t->byte_fallback) {
        for (uint32_t k = 0; k < s->len && st == IE_OK; k++) {
            int32_t b = t->byte_tok[(unsigned char)w[s->start + k]];
            if (b < 0) { b = t->bpe_unk; }
            if (b >= 0) { st = push_id(e, b); }
        }
        return st;
    }
    if (t->bpe_unk >= 0) { st = push_id(e, t->bpe_unk); }
    return st;
}

/* BPE one pre-tokenized word w[0..n) and append its ids. */
static ie_status_t bpe_word(enc_t *e, const char *w, size_t n)
{
    const ie_tokenizer_t *t = e->t;
    ie_status_t st = IE_OK;
    size_t ns = 0;

    if (n == 0) { return IE_OK; }
    if (n > UINT32_MAX / 2) { return ie_error_set(IE_ERR_RANGE, "tokenizer: text segment too long"); }
    if (t->ignore_merges) {
        int32_t id = ie_tok_strmap_get(&t->text_map, w, n);
        if (id >= 0) { return push_id(e, id); }
    }

    /* initial symbols: bytes (byte-level) or UTF-8 characters (SPM) */
    int pending_unk = 0; /* last symbol is an unk that may absorb more (fuse_unk) */
    for (size_t i = 0; i < n && st == IE_OK;) {
        uint32_t cl = 1;
        int32_t id;
        if (t->algo == IE_TOK_ALGO_BYTE_BPE) {
            id = t->byte_sym[(unsigned char)w[i]];
        } else {
            cl = (uint32_t)ie_tok_utf8_len((unsigned char)w[i]);
            if (i + cl > n) { cl = (uint32_t)(n - i); }
            id = ie_tok_strmap_get(&t->text_map, w + i, cl);
        }
        if (id >= 0 || t->merge_mode == IE_TOK_MERGE_SCORE) {
            /* score mode (SentencePiece): unknown characters stay as id -1
             * symbols and fall back to bytes when emitted */
            st = add_sym(e, &ns, id, (uint32_t)i, cl);
            pending_unk = 0;
        } else {
            /* rank mode (HF BPE): byte fallback now, else unk, else the
             * character is left out of the word altogether */
            int all = t->algo == IE_TOK_ALGO_SPM && t->byte_fallback;
            for (uint32_t k = 0; k < cl && all; k++) { all = t->byte_tok[(unsigned char)w[i + k]] >= 0; }
            if (all) {
                for (uint32_t k = 0; k < cl && st == IE_OK; k++) {
                    st = add_sym(e, &ns, t->byte_tok[(unsigned char)w[i + k]], (uint32_t)(i + k), 1);
                }
                pending_unk = 0;
            } else if (t->bpe_unk >= 0) {
                if (pending_unk && t->fuse_unk) {
                    e->sym[ns - 1].len += cl;
                } else {
                    st = add_sym(e, &ns, t->bpe_unk, (uint32_t)i, cl);
                }
                pending_unk = 1;
            }
        }
        i += cl;
    }
    if (st != IE_OK || ns == 0) { return st; }

    /* merge */
    e->n_heap = 0;
    for (size_t i = 0; i + 1 < ns && st == IE_OK; i++) { st = try_pair(e, w, (int32_t)i); }
    while (st == IE_OK && e->n_heap > 0) {
        heap_ent_t h = heap_pop(e);
        sym_t *a = &e->sym[h.pos];
        if (a->len == 0 || a->next < 0) { continue; }
        sym_t *b = &e->sym[a->next];
        if (a->len + b->len != h.size) { continue; /* stale: a neighbour changed since it was queued */ }
        a->len += b->len;
        a->id = h.merged;
        a->next = b->next;
        if (b->next >= 0) { e->sym[b->next].prev = h.pos; }
        b->len = 0;
        st = try_pair(e, w, a->prev);
        if (st == IE_OK) { st = try_pair(e, w, h.pos); }
    }

    /* emit */
    for (int32_t i = 0; i >= 0 && st == IE_OK; i = e->sym[i].next) {
        const sym_t *s = &e->sym[i];
        st = s->id >= 0 ? push_id(e, s->id) : emit_unknown(e, w, s);
    }
    return st;
}

static int is_ascii_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static int is_word_byte(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80;
}

/* Normalise, pre-tokenize and BPE one stretch of plain text. at_start: the
 * stretch begins at byte 0 of the caller's input. */
static ie_status_t encode_text(enc_t *e, const char *s, size_t n, int at_start)
{
    const ie_tokenizer_t *t = e->t;
    ie_status_t st = IE_OK;
    if (n == 0) { return IE_OK; }
    if (t->nfc && ie_tok_nfc_needed(s, n)) {
        if ((st = ie_tok_nfc(s, n, &e->nfc, &e->cap_nfc, &n)) != IE_OK) { return st; }
        s = e->nfc;
    }

    int prefix = t->prepend == IE_TOK_PREPEND_ALWAYS || (t->prepend == IE_TOK_PREPEND_FIRST && at_start);
    if (prefix && t->prefix_if_missing) {
        /* HF ByteLevel / Metaspace: only when the (space-escaped) segment
         * does not already start with the prefix */
        if ((n >= t->prefix_len && memcmp(s, t->prefix, t->prefix_len) == 0) || (t->escape_spaces && s[0] == ' ')) {
            prefix = 0;
        }
    }
    const char *buf = s;
    size_t len = n;
    if (prefix || t->escape_spaces) {
        /* worst case: every byte is a space that becomes 3 bytes */
        if (n > (SIZE_MAX - 16) / 3) { return ie_error_set(IE_ERR_RANGE, "tokenizer: text too long"); }
        size_t need = n * 3 + t->prefix_len + 1;
        if (need > e->cap_norm) {
            char *nb = realloc(e->norm, need);
            if (!nb) { return ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory"); }
            e->norm = nb;
            e->cap_norm = need;
        }
        size_t o = 0;
        if (prefix) {
            memcpy(e->norm, t->prefix, t->prefix_len);
            o = t->prefix_len;
        }
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ' && t->escape_spaces) {
                memcpy(e->norm + o, "\xE2\x96\x81", 3);
                o += 3;
            } else {
                e->norm[o++] = s[i];
            }
        }
        buf = e->norm;
        len = o;
    }
    if (len > UINT32_MAX) { return ie_error_set(IE_ERR_RANGE, "tokenizer: text segment longer than 4 GiB"); }

    e->sa.n = 0;
    if ((st = ie_tok_spans_push(&e->sa, 0, (uint32_t)len)) != IE_OK) { return st; }
    for (size_t k = 0; k < t->n_steps; k++) {
        e->sb.n = 0;
        st = ie_tok_pretok_apply(&t->steps[k], buf, &e->sa, &e->sb, e->md, e->mctx);
        if (st != IE_OK) { return st; }
        ie_tok_spans_t tmp = e->sa;
        e->sa = e->sb;
        e->sb = tmp;
    }
    for (size_t k = 0; k < e->sa.n && st == IE_OK; k++) {
        const char *w = buf + e->sa.v[k].off;
        size_t wl = e->sa.v[k].len;
        if (!t->spm_word_split) {
            st = bpe_word(e, w, wl);
            continue;
        }
        /* cut before each U+2581 that follows another character */
        size_t start = 0;
        for (size_t i = 1; i + 3 <= wl && st == IE_OK; i++) {
            if (memcmp(w + i, "\xE2\x96\x81", 3) == 0 && (i < 3 || memcmp(w + i - 3, "\xE2\x96\x81", 3) != 0)) {
                st = bpe_word(e, w + start, i - start);
                start = i;
            }
        }
        if (st == IE_OK) { st = bpe_word(e, w + start, wl - start); }
    }
    return st;
}

/* The added token matching at text[i], honouring flags; -1 if none. */
static int32_t match_special(const ie_tokenizer_t *t, const char *text, size_t len, size_t i, int flags)
{
    unsigned char c = (unsigned char)text[i];
    for (uint32_t k = t->match_start[c]; k < t->match_start[c + 1]; k++) {
        int32_t id = t->match_ids[k];
        const ie_tok_token_t *tk = &t->tokens[id];
        if (tk->special && !(flags & IE_TOK_PARSE_SPECIAL)) { continue; }
        if (tk->text_len > len - i || memcmp(text + i, t->pool + tk->text_off, tk->text_len) != 0) { continue; }
        if (tk->flags & IE_TOKF_SINGLE_WORD) {
            size_t end = i + tk->text_len;
            if ((i > 0 && is_word_byte((unsigned char)text[i - 1])) ||
                (end < len && is_word_byte((unsigned char)text[end]))) {
                continue;
            }
        }
        return id;
    }
    return -1;
}

ie_status_t ie_tokenizer_check_utf8(const char *text, size_t len)
{
    if (!text && len) { return ie_error_set(IE_ERR_INVAL, "ie_tokenizer_check_utf8: NULL text"); }
    size_t valid = ie_tok_utf8_valid_prefix(text, len);
    if (valid != len) { return ie_error_set(IE_ERR_INVAL, "invalid UTF-8 at byte %zu", valid); }
    return IE_OK;
}

ie_status_t ie_tokenizer_encode(const ie_tokenizer_t *tok, const char *text, size_t len, int flags,
                                int32_t **ids_out, size_t *n_out)
{
    ie_status_t st = IE_OK;
    enc_t e;
    memset(&e, 0, sizeof e);
    e.t = tok;

    if (ids_out) { *ids_out = NULL; }
    if (n_out) { *n_out = 0; }
    if (!tok || !ids_out || !n_out || (!text && len > 0)) {
        return ie_error_set(IE_ERR_INVAL, "ie_tokenizer_encode: NULL argument");
    }
    if (flags & ~(IE_TOK_ADD_SPECIAL | IE_TOK_PARSE_SPECIAL)) {
        return ie_error_set(IE_ERR_INVAL, "ie_tokenizer_encode: unknown flags 0x%x", (unsigned)flags);
    }
    if ((st = ie_tokenizer_check_utf8(text, len)) != IE_OK) { return st; }
    if (!text) { text = ""; /* len == 0: keep pointer arithmetic defined */ }

    if (tok->n_steps) {
        /* per call, so threads share nothing; the JIT uses its default
         * 32 KiB machine stack (see find_matches for the fallback) */
        e.md = pcre2_match_data_create(4, NULL);
        if (!e.md) {
            st = ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory for regex state");
            goto cleanup;
        }
    }

    if ((flags & IE_TOK_ADD_SPECIAL) && tok->add_bos && tok->bos >= 0) {
        if ((st = push_id(&e, tok->bos)) != IE_OK) { goto cleanup; }
    }

    size_t seg = 0; /* start of the pending plain-text stretch */
    size_t i = 0;
    while (i < len) {
        unsigned char c = (unsigned char)text[i];
        int32_t id = -1;
        if (tok->match_start[c] != tok->match_start[c + 1]) { id = match_special(tok, text, len, i, flags); }
        if (id < 0) {
            i++;
            continue;
        }
        const ie_tok_token_t *tk = &tok->tokens[id];
        size_t end = i; /* end of the plain text before the token */
        if (tk->flags & IE_TOKF_LSTRIP) {
            while (end > seg && is_ascii_space((unsigned char)text[end - 1])) { end--; }
        }
        if ((st = encode_text(&e, text + seg, end - seg, seg == 0)) != IE_OK || (st = push_id(&e, id)) != IE_OK) {
            goto cleanup;
        }
        i += tk->text_len;
        if (tk->flags & IE_TOKF_RSTRIP) {
            while (i < len && is_ascii_space((unsigned char)text[i])) { i++; }
        }
        seg = i;
    }
    if ((st = encode_text(&e, text + seg, len - seg, seg == 0)) != IE_OK) { goto cleanup; }

    if ((flags & IE_TOK_ADD_SPECIAL) && tok->add_eos && tok->eos >= 0) {
        if ((st = push_id(&e, tok->eos)) != IE_OK) { goto cleanup; }
    }

    if (e.n_ids == 0) {
        /* hand back a valid, freeable pointer even for no tokens */
        e.ids = malloc(sizeof(int32_t));
        if (!e.ids) {
            st = ie_error_set(IE_ERR_NOMEM, "tokenizer: out of memory");
            goto cleanup;
        }
    }
    *ids_out = e.ids;
    *n_out = e.n_ids;
    e.ids = NULL;

cleanup:
    free(e.ids);
    free(e.norm);
    free(e.nfc);
    free(e.sa.v);
    free(e.sb.v);
    free(e.sym);
    free(e.heap);
    pcre2_match_data_free(e.md);
    return st;
}

/* ================================================================ queries */

int ie_tokenizer_token_bytes(const ie_tokenizer_t *tok, int32_t id, int special, char *buf, size_t cap)
{
    if (!tok || id < 0 || id >= tok->n_vocab) { return -1; }
    const ie_tok_token_t *tk = &tok->tokens[id];
    if ((tk->type == IE_TOKT_CONTROL || tk->type == IE_TOKT_UNKNOWN) && !special) { return 0; }
    size_t n = tk->piece_len;
    if (buf && cap) { memcpy(buf, tok->pool + tk->piece_off, n < cap ? n : cap); }
    return (int)n;
}

int32_t ie_tokenizer_n_vocab(const ie_tokenizer_t *tok) { return tok ? tok->n_vocab : 0; }

int32_t ie_tokenizer_bos(const ie_tokenizer_t *tok) { return tok ? tok->bos : -1; }

int32_t ie_tokenizer_eos(const ie_tokenizer_t *tok) { return tok ? tok->eos : -1; }

int32_t ie_tokenizer_eot(const ie_tokenizer_t *tok) { return tok ? tok->eot : -1; }

int32_t ie_tokenizer_unk(const ie_tokenizer_t *tok) { return tok ? tok->unk : -1; }

int ie_tokenizer_add_bos(const ie_tokenizer_t *tok) { return tok && tok->add_bos && tok->bos >= 0; }

int ie_tokenizer_add_eos(const ie_tokenizer_t *tok) { return tok && tok->add_eos && tok->eos >= 0; }

int ie_tokenizer_is_eog(const ie_tokenizer_t *tok, int32_t id)
{
    if (!tok) { return 0; }
    size_t lo = 0, hi = tok->n_eog;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (tok->eog[mid] == id) { return 1; }
        if (tok->eog[mid] < id) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return 0;
}

int ie_tokenizer_is_special(const ie_tokenizer_t *tok, int32_t id)
{
    if (!tok || id < 0 || id >= tok->n_vocab) { return 0; }
    uint8_t ty = tok->tokens[id].type;
    return ty == IE_TOKT_CONTROL || ty == IE_TOKT_UNKNOWN;
}

/* Contract (ie_tokenizer.h). The spellings llama.cpp's vocabulary loader
 * also recognizes, one family per row: prefix, suffix, middle. */
int ie_tokenizer_fim(const ie_tokenizer_t *tok, int32_t *pre, int32_t *suf, int32_t *mid)
{
    static const char *const k_fim[][3] = {
        {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"}, /* Qwen2.5-Coder */
        {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},       /* StarCoder, Refact, Codestral */
        {"<fim-prefix>", "<fim-suffix>", "<fim-middle>"},       /* StableCode */
        {"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"}, /* DeepSeek-Coder */
        {"<PRE>", "<SUF>", "<MID>"},                            /* CodeLlama */
        {"▁<PRE>", "▁<SUF>", "▁<MID>"}, /* CodeLlama, as its SentencePiece vocabulary spells them */
        {"<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"}, /* GLM-4 */
    };
    if (!tok) return 0;
    if (tok->fim_pre >= 0 && tok->fim_suf >= 0 && tok->fim_mid >= 0) {
        *pre = tok->fim_pre, *suf = tok->fim_suf, *mid = tok->fim_mid;
        return 1;
    }
    for (size_t r = 0; r < sizeof k_fim / sizeof k_fim[0]; r++) {
        const int32_t a = ie_tokenizer_find(tok, k_fim[r][0], strlen(k_fim[r][0]));
        const int32_t b = a >= 0 ? ie_tokenizer_find(tok, k_fim[r][1], strlen(k_fim[r][1])) : -1;
        const int32_t c = b >= 0 ? ie_tokenizer_find(tok, k_fim[r][2], strlen(k_fim[r][2])) : -1;
        if (c >= 0) {
            *pre = a, *suf = b, *mid = c;
            return 1;
        }
    }
    return 0;
}

int32_t ie_tokenizer_find(const ie_tokenizer_t *tok, const char *text, size_t len)
{
    if (!tok || (!text && len)) { return -1; }
    for (int32_t i = 0; i < tok->n_vocab; i++) {
        const ie_tok_token_t *tk = &tok->tokens[i];
        if (tk->text_len == len && memcmp(tok->pool + tk->text_off, text, len) == 0 && tk->type != IE_TOKT_UNUSED) {
            return i;
        }
    }
    return -1;
}

/* ================================================================ detokenizer */

struct ie_detok {
    const ie_tokenizer_t *tok;
    unsigned char pend[4]; /* incomplete UTF-8 sequence */
    int n_pend, need;      /* bytes held, bytes the sequence needs */
    unsigned char lo, hi;  /* allowed range of the next continuation byte */
    int started;           /* some byte has been seen */
    int special;           /* emit control tokens' text */
    char *out;
    size_t n_out, cap_out;
    int oom;
};

ie_status_t ie_detok_new(const ie_tokenizer_t *tok, ie_detok_t **out)
{
    if (!out) { return ie_error_set(IE_ERR_INVAL, "ie_detok_new: out is NULL"); }
    *out = NULL;
    if (!tok) { return ie_error_set(IE_ERR_INVAL, "ie_detok_new: tokenizer is NULL"); }
    ie_detok_t *d = calloc(1, sizeof *d);
    if (!d) { return ie_error_set(IE_ERR_NOMEM, "detok: out of memory"); }
    d->tok = tok;
    d->cap_out = 64;
    d->out = malloc(d->cap_out);
    if (!d->out) {
        free(d);
        return ie_error_set(IE_ERR_NOMEM, "detok: out of memory");
    }
    d->out[0] = '\0';
    *out = d;
    return IE_OK;
}

void ie_detok_destroy(ie_detok_t **self_p)
{
    if (!self_p || !*self_p) { return; }
    free((*self_p)->out);
    free(*self_p);
    *self_p = NULL;
}

void ie_detok_set_special(ie_detok_t *d, int special)
{
    if (d) { d->special = special ? 1 : 0; }
}

static void out_put(ie_detok_t *d, const void *p, size_t n)
{
    if (d->oom) { return; }
    if (d->n_out + n + 1 > d->cap_out) {
        size_t ncap = d->cap_out;
        while (ncap < d->n_out + n + 1) { ncap *= 2; }
        char *nb = realloc(d->out, ncap);
        if (!nb) {
            d->oom = 1; /* keep what fits; the text is truncated, never corrupt */
            return;
        }
        d->out = nb;
        d->cap_out = ncap;
    }
    memcpy(d->out + d->n_out, p, n);
    d->n_out += n;
}

static void put_replacement(ie_detok_t *d) { out_put(d, "\xEF\xBF\xBD", 3); }

/* Feed one byte through the UTF-8 state machine ("maximal subpart" rule:
 * each broken sequence becomes one U+FFFD, the offending byte restarts). */
static void feed(ie_detok_t *d, unsigned char c)
{
    if (d->n_pend > 0) {
        if (c >= d->lo && c <= d->hi) {
            d->pend[d->n_pend++] = c;
            d->lo = 0x80;
            d->hi = 0xBF;
            if (d->n_pend == d->need) {
                out_put(d, d->pend, (size_t)d->n_pend);
                d->n_pend = 0;
            }
            return;
        }
        put_replacement(d);
        d->n_pend = 0;
    }
    if (c < 0x80) {
        out_put(d, &c, 1);
        return;
    }
    int n = ie_tok_utf8_len(c);
    if (n == 1) {
        put_replacement(d);
        return;
    }
    d->pend[0] = c;
    d->n_pend = 1;
    d->need = n;
    d->lo = 0x80;
    d->hi = 0xBF;
    if (c == 0xE0) {
        d->lo = 0xA0;
    } else if (c == 0xED) {
        d->hi = 0x9F;
    } else if (c == 0xF0) {
        d->lo = 0x90;
    } else if (c == 0xF4) {
        d->hi = 0x8F;
    }
}

const char *ie_detok_push(ie_detok_t *d, int32_t id)
{
    if (!d) { return ""; }
    d->n_out = 0;
    char small[256];
    int n = ie_tokenizer_token_bytes(d->tok, id, d->special, small, sizeof small);
    const unsigned char *p = (const unsigned char *)small;
    if (n > (int)sizeof small) {
        /* long pieces are read straight from the pool */
        p = (const unsigned char *)d->tok->pool + d->tok->tokens[id].piece_off;
    }
    for (int i = 0; i < n; i++) {
        if (!d->started) {
            d->started = 1;
            if (d->tok->strip_leading_space && p[i] == ' ') { continue; }
        }
        feed(d, p[i]);
    }
    d->out[d->n_out] = '\0';
    return d->out;
}

const char *ie_detok_flush(ie_detok_t *d)
{
    if (!d) { return ""; }
    d->n_out = 0;
    if (d->n_pend > 0) {
        put_replacement(d);
        d->n_pend = 0;
    }
    d->out[d->n_out] = '\0';
    return d->out;
}

size_t ie_detok_last_len(const ie_detok_t *d) { return d ? d->n_out : 0; }

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Contract (tokenizer_internal.h): "<0xAB>" / "<0xab>" -> 0xAB, else -1.
 * One copy for the GGUF and the tokenizer.json loaders, so the two accept
 * the same spellings. */
int ie_tok_parse_byte_token(const char *s, size_t len)
{
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

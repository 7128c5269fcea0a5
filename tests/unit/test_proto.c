/* test_proto.c — the wire protocol (ie_proto.h): every cluster message
 * round-trips; every class of bad header (wrong type, missing key, long
 * string, other version, trailing bytes, every truncation, random byte
 * mutations) is refused cleanly; a STEP's KV-operations frame round-trips
 * and every truncation, mutation and limit is checked the same way; client
 * requests get their defaults and limits (their version apart from the
 * cluster's); reply encoders decode back with plain msgpack-c.
 *
 * Bad headers are made by re-packing a valid one with one key dropped or
 * replaced (repack below), so each case differs from a valid message in
 * exactly the way it names.
 */
#include "ie_kernels.h"
#include "ie_proto.h"
#include "ie_test_rng.h"

#include <CUnit/Basic.h>
#include <msgpack.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ builders */

typedef enum { V_INT, V_UINT, V_DBL, V_STR, V_BOOL, V_NIL, V_ARR_INT, V_ARR_STR, V_MAP_EMPTY } vkind_t;

typedef struct val {
    vkind_t k;
    int64_t i;
    double d;
    const char *s;
    size_t slen; /* V_STR: 0 means strlen(s); V_ARR_*: the element count */
} val_t;

static void pack_val(msgpack_packer *pk, const val_t *v)
{
    switch (v->k) {
    case V_INT: msgpack_pack_int64(pk, v->i); break;
    case V_UINT: msgpack_pack_uint64(pk, (uint64_t)v->i); break;
    case V_DBL: msgpack_pack_double(pk, v->d); break;
    case V_STR: {
        const size_t n = v->slen ? v->slen : strlen(v->s);
        msgpack_pack_str_with_body(pk, v->s, n);
        break;
    }
    case V_BOOL:
        if (v->i) msgpack_pack_true(pk);
        else msgpack_pack_false(pk);
        break;
    case V_NIL: msgpack_pack_nil(pk); break;
    case V_ARR_INT:
        msgpack_pack_array(pk, v->slen);
        for (size_t j = 0; j < v->slen; j++) msgpack_pack_int64(pk, v->i);
        break;
    case V_ARR_STR:
        msgpack_pack_array(pk, v->slen);
        for (size_t j = 0; j < v->slen; j++) msgpack_pack_str_with_body(pk, v->s, strlen(v->s));
        break;
    case V_MAP_EMPTY: msgpack_pack_map(pk, 0); break;
    }
}

/* Copy the map in data[0..n) into out, dropping key `drop` (NULL: none)
 * and giving key `set` the value *v (added when missing; NULL: none). */
static void repack(const void *data, size_t n, const char *drop, const char *set, const val_t *v,
                   msgpack_sbuffer *out)
{
    msgpack_unpacked u;
    msgpack_packer pk;
    size_t off = 0;
    int found = 0;
    msgpack_unpacked_init(&u);
    msgpack_sbuffer_init(out);
    msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
    CU_ASSERT_FATAL(msgpack_unpack_next(&u, data, n, &off) == MSGPACK_UNPACK_SUCCESS);
    const msgpack_object_map *m = &u.data.via.map;
    uint32_t count = 0;
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object *k = &m->ptr[i].key;
        if (drop && k->via.str.size == strlen(drop) && memcmp(k->via.str.ptr, drop, k->via.str.size) == 0) continue;
        if (set && k->via.str.size == strlen(set) && memcmp(k->via.str.ptr, set, k->via.str.size) == 0) found = 1;
        count++;
    }
    msgpack_pack_map(&pk, count + (set && !found ? 1 : 0));
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object *k = &m->ptr[i].key;
        if (drop && k->via.str.size == strlen(drop) && memcmp(k->via.str.ptr, drop, k->via.str.size) == 0) continue;
        msgpack_pack_object(&pk, *k);
        if (set && k->via.str.size == strlen(set) && memcmp(k->via.str.ptr, set, k->via.str.size) == 0)
            pack_val(&pk, v);
        else msgpack_pack_object(&pk, m->ptr[i].val);
    }
    if (set && !found) {
        msgpack_pack_str_with_body(&pk, set, strlen(set));
        pack_val(&pk, v);
    }
    msgpack_unpacked_destroy(&u);
}

/* ------------------------------------------------------------ sample messages */

static void sample(ie_msg_kind_t kind, ie_msg_t *m)
{
    memset(m, 0, sizeof *m);
    m->kind = kind;
    switch (kind) {
    case IE_MSG_HELLO:
        m->u.hello = (ie_msg_hello_t){
            .rank = -1, .pid = 4242, .numa_node = 1, .n_threads = 16, .model_fp = 0xfedcba9876543210ull};
        strcpy(m->u.hello.host, "node-7.example");
        strcpy(m->u.hello.peer_endpoint, "tcp://10.0.0.7:5601");
        strcpy(m->u.hello.public_key, "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7");
        strcpy(m->u.hello.topology, "2 packages, 2 NUMA nodes, 64 cores");
        break;
    case IE_MSG_ASSIGN:
        m->u.assign = (ie_msg_assign_t){.epoch = 3,
                                        .plan = 1,
                                        .rank = 2,
                                        .n_ranks = 4,
                                        .n_ctx = 4096,
                                        .n_seq = 8,
                                        .max_batch = 512,
                                        .kv_block = 16,
                                        .kv_blocks = 1000,
                                        .kv_type_k = 3,
                                        .kv_type_v = 5,
                                        .kv_rotate = 2,
                                        .kv_swa_full = 1,
                                        .precision = 4,
                                        .heartbeat_ms = 500,
                                        .dead_ms = 3000,
                                        .cluster_id = 0xf3e2d1c0b9a89786ull};
        for (int i = 0; i < 4; i++) {
            snprintf(m->u.assign.peer_endpoint[i], IE_PROTO_ENDPOINT_MAX, "tcp://10.0.0.%d:5601", i + 1);
            snprintf(m->u.assign.peer_key[i], IE_PROTO_KEY_MAX, "key-%d", i);
        }
        break;
    case IE_MSG_READY:
        m->u.ready =
            (ie_msg_ready_t){.epoch = 3, .rank = 2, .status = 0, .load_ms = 1234.5, .weight_bytes = 7ull << 32};
        break;
    case IE_MSG_STEP:
        /* field by field: a compound literal's trailing padding (4 bytes
         * here) may be stack garbage at -O0, and the round trip memcmps */
        m->u.step.epoch = 3;
        m->u.step.step = 99;
        m->u.step.n = 17;
        m->u.step.has_hidden = 1;
        m->u.step.kv_words = 23;
        break;
    case IE_MSG_RESULT:
        m->u.result = (ie_msg_result_t){.epoch = 3,
                                        .step = 99,
                                        .rank = 1,
                                        .status = 0,
                                        .n_rows = 4,
                                        .vocab_begin = 64000,
                                        .vocab_end = 128256,
                                        .compute_ms = 12.25,
                                        .transfer_ms = 0.5};
        break;
    case IE_MSG_PARTIAL:
        m->u.partial = (ie_msg_partial_t){.epoch = 3, .step = 99, .from_rank = 3, .index = 31, .count = 4096};
        break;
    case IE_MSG_HEARTBEAT: m->u.heartbeat = (ie_msg_heartbeat_t){.epoch = 3, .rank = -1, .busy = 1}; break;
    case IE_MSG_BYE: break;
    case IE_MSG_ERROR:
        m->u.error.code = IE_ERR_FORMAT;
        strcpy(m->u.error.message, "decode step: missing key \"n\"");
        break;
    case IE_MSG_LORA:
        m->u.lora = (ie_msg_lora_t){.seq = 7, .op = IE_LORA_OP_ADD, .id = 31, .keep = 5, .n_name = 2, .n_path = 2};
        strcpy(m->u.lora.name[0], "qv8");
        strcpy(m->u.lora.name[1], "all16");
        strcpy(m->u.lora.path[0], "/data/lora/qv8");
        strcpy(m->u.lora.path[1], "/data/lora/all16.gguf");
        break;
    case IE_MSG_LORA_ACK:
        m->u.lora_ack = (ie_msg_lora_ack_t){.seq = 7, .rank = 1, .id = 3, .status = IE_ERR_INVAL};
        strcpy(m->u.lora_ack.error, "worker rank 1: adapter 'qv8': fingerprint differs");
        break;
    default: break;
    }
}

static ie_msg_t g_a, g_b; /* big (assign holds 64 endpoints): not on the stack */

static void encode_sample(ie_msg_kind_t kind, ie_buf_t *b)
{
    sample(kind, &g_a);
    CU_ASSERT_EQUAL_FATAL(ie_msg_encode(&g_a, b), IE_OK);
}

/* Decode data and expect status st (with the error naming `key` if given). */
static void expect_decode(const void *data, size_t n, ie_status_t st, const char *key)
{
    const ie_status_t got = ie_msg_decode(data, n, &g_b);
    CU_ASSERT_EQUAL(got, st);
    if (got != st)
        fprintf(stderr, "\n  expected %s, got %s: %s\n", ie_status_str(st), ie_status_str(got), ie_error_last());
    if (st != IE_OK) {
        CU_ASSERT_EQUAL(g_b.kind, IE_MSG_NONE);
        if (key) {
            char q[64];
            snprintf(q, sizeof q, "\"%s\"", key);
            CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), q));
        }
    }
}

/* Repack a sample of `kind` with one change and expect status st naming key. */
static void expect_changed(ie_msg_kind_t kind, const char *drop, const char *set, val_t v, ie_status_t st,
                           const char *key)
{
    ie_buf_t b = {0};
    msgpack_sbuffer sb;
    encode_sample(kind, &b);
    repack(b.data, b.len, drop, set, &v, &sb);
    expect_decode(sb.data, sb.size, st, key);
    msgpack_sbuffer_destroy(&sb);
    ie_buf_free(&b);
}

/* ------------------------------------------------------------ cluster tests */

static void test_kind_names(void)
{
    CU_ASSERT_STRING_EQUAL(ie_msg_kind_name(IE_MSG_HELLO), "hello");
    CU_ASSERT_STRING_EQUAL(ie_msg_kind_name(IE_MSG_HEARTBEAT), "heartbeat");
    CU_ASSERT_STRING_EQUAL(ie_msg_kind_name(IE_MSG_ERROR), "error");
    CU_ASSERT_STRING_EQUAL(ie_msg_kind_name(IE_MSG_NONE), "none");
    CU_ASSERT_STRING_EQUAL(ie_msg_kind_name((ie_msg_kind_t)77), "none");
    CU_ASSERT_STRING_EQUAL(ie_msg_kind_name((ie_msg_kind_t)-1), "none");
}

static void test_round_trip(void)
{
    ie_buf_t b = {0};
    for (int k = IE_MSG_HELLO; k <= IE_MSG_LORA_ACK; k++) {
        encode_sample((ie_msg_kind_t)k, &b);
        CU_ASSERT_EQUAL(ie_msg_decode(b.data, b.len, &g_b), IE_OK);
        CU_ASSERT_EQUAL(memcmp(&g_a, &g_b, sizeof g_a), 0);
        /* every header carries "v" and "kind" */
        msgpack_unpacked u;
        size_t off = 0;
        msgpack_unpacked_init(&u);
        CU_ASSERT_FATAL(msgpack_unpack_next(&u, b.data, b.len, &off) == MSGPACK_UNPACK_SUCCESS);
        CU_ASSERT_EQUAL(u.data.type, MSGPACK_OBJECT_MAP);
        int has_v = 0, has_kind = 0;
        for (uint32_t i = 0; i < u.data.via.map.size; i++) {
            const msgpack_object_kv *kv = &u.data.via.map.ptr[i];
            if (kv->key.via.str.size == 1 && kv->key.via.str.ptr[0] == 'v')
                has_v = kv->val.via.u64 == IE_PROTO_VERSION;
            if (kv->key.via.str.size == 4 && memcmp(kv->key.via.str.ptr, "kind", 4) == 0)
                has_kind = kv->val.via.u64 == (uint64_t)k;
        }
        CU_ASSERT(has_v && has_kind);
        msgpack_unpacked_destroy(&u);
    }
    /* extremes survive */
    sample(IE_MSG_STEP, &g_a);
    g_a.u.step.epoch = UINT64_MAX;
    g_a.u.step.kv_words = IE_PROTO_KV_WORDS_MAX;
    CU_ASSERT_EQUAL_FATAL(ie_msg_encode(&g_a, &b), IE_OK);
    CU_ASSERT_EQUAL(ie_msg_decode(b.data, b.len, &g_b), IE_OK);
    CU_ASSERT_EQUAL(memcmp(&g_a, &g_b, sizeof g_a), 0);
    sample(IE_MSG_ASSIGN, &g_a);
    g_a.u.assign.n_ranks = IE_PROTO_MAX_RANKS;
    g_a.u.assign.rank = IE_PROTO_MAX_RANKS - 1;
    for (int i = 0; i < IE_PROTO_MAX_RANKS; i++) {
        memset(g_a.u.assign.peer_endpoint[i], 'e', IE_PROTO_ENDPOINT_MAX - 1);
        memset(g_a.u.assign.peer_key[i], 'k', IE_PROTO_KEY_MAX - 1);
    }
    CU_ASSERT_EQUAL_FATAL(ie_msg_encode(&g_a, &b), IE_OK);
    CU_ASSERT_EQUAL(ie_msg_decode(b.data, b.len, &g_b), IE_OK);
    CU_ASSERT_EQUAL(memcmp(&g_a, &g_b, sizeof g_a), 0);
    ie_buf_free(&b);
}

static void test_encode_refuses(void)
{
    ie_buf_t b = {0};
    sample(IE_MSG_HELLO, &g_a);
    g_a.kind = IE_MSG_NONE;
    CU_ASSERT_EQUAL(ie_msg_encode(&g_a, &b), IE_ERR_INVAL);
    g_a.kind = (ie_msg_kind_t)42;
    CU_ASSERT_EQUAL(ie_msg_encode(&g_a, &b), IE_ERR_INVAL);
    sample(IE_MSG_HELLO, &g_a);
    g_a.u.hello.rank = IE_PROTO_MAX_RANKS;
    CU_ASSERT_EQUAL(ie_msg_encode(&g_a, &b), IE_ERR_INVAL);
    sample(IE_MSG_HELLO, &g_a);
    memset(g_a.u.hello.host, 'x', sizeof g_a.u.hello.host); /* not terminated */
    CU_ASSERT_EQUAL(ie_msg_encode(&g_a, &b), IE_ERR_INVAL);
    sample(IE_MSG_ASSIGN, &g_a);
    g_a.u.assign.rank = 4; /* == n_ranks */
    CU_ASSERT_EQUAL(ie_msg_encode(&g_a, &b), IE_ERR_INVAL);
    sample(IE_MSG_STEP, &g_a);
    g_a.u.step.kv_words = IE_PROTO_KV_WORDS_MAX + 1;
    CU_ASSERT_EQUAL(ie_msg_encode(&g_a, &b), IE_ERR_INVAL);
    g_a.u.step.kv_words = -1;
    CU_ASSERT_EQUAL(ie_msg_encode(&g_a, &b), IE_ERR_INVAL);
    sample(IE_MSG_ASSIGN, &g_a);
    g_a.u.assign.kv_blocks = -1;
    CU_ASSERT_EQUAL(ie_msg_encode(&g_a, &b), IE_ERR_INVAL);
    sample(IE_MSG_READY, &g_a);
    g_a.u.ready.load_ms = -1;
    CU_ASSERT_EQUAL(ie_msg_encode(&g_a, &b), IE_ERR_INVAL);
    sample(IE_MSG_RESULT, &g_a);
    g_a.u.result.vocab_end = 10;
    CU_ASSERT_EQUAL(ie_msg_encode(&g_a, &b), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_msg_encode(NULL, &b), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_msg_encode(&g_a, NULL), IE_ERR_INVAL);
    ie_buf_free(&b);
}

static void test_wrong_types(void)
{
    expect_changed(IE_MSG_HELLO, NULL, "rank", (val_t){V_STR, .s = "1"}, IE_ERR_FORMAT, "rank");
    expect_changed(IE_MSG_HELLO, NULL, "model_fp", (val_t){V_INT, .i = -5}, IE_ERR_FORMAT, "model_fp");
    expect_changed(IE_MSG_HELLO, NULL, "model_fp", (val_t){V_DBL, .d = 1.0}, IE_ERR_FORMAT, "model_fp");
    expect_changed(IE_MSG_HELLO, NULL, "host", (val_t){V_INT, .i = 3}, IE_ERR_FORMAT, "host");
    expect_changed(IE_MSG_HELLO, NULL, "host", (val_t){V_STR, .s = "a\0b", .slen = 3}, IE_ERR_FORMAT, "host");
    expect_changed(IE_MSG_STEP, NULL, "n", (val_t){V_DBL, .d = 17.0}, IE_ERR_FORMAT, "n");
    expect_changed(IE_MSG_STEP, NULL, "has_hidden", (val_t){V_STR, .s = "yes"}, IE_ERR_FORMAT, "has_hidden");
    expect_changed(IE_MSG_STEP, NULL, "has_hidden", (val_t){V_INT, .i = 2}, IE_ERR_FORMAT, "has_hidden");
    expect_changed(IE_MSG_STEP, NULL, "kv_words", (val_t){V_STR, .s = "2"}, IE_ERR_FORMAT, "kv_words");
    expect_changed(IE_MSG_STEP, NULL, "kv_words", (val_t){V_ARR_INT, .i = 1, .slen = 2}, IE_ERR_FORMAT, "kv_words");
    expect_changed(IE_MSG_STEP, NULL, "kv_words", (val_t){V_DBL, .d = 2.0}, IE_ERR_FORMAT, "kv_words");
    expect_changed(IE_MSG_ASSIGN, NULL, "kv_block", (val_t){V_BOOL, .i = 1}, IE_ERR_FORMAT, "kv_block");
    expect_changed(IE_MSG_ASSIGN, NULL, "cluster_id", (val_t){V_INT, .i = -1}, IE_ERR_FORMAT, "cluster_id");
    expect_changed(IE_MSG_ASSIGN, NULL, "cluster_id", (val_t){V_STR, .s = "7"}, IE_ERR_FORMAT, "cluster_id");
    expect_changed(IE_MSG_ASSIGN, NULL, "peer_endpoint", (val_t){V_ARR_INT, .i = 1, .slen = 4}, IE_ERR_FORMAT,
                   "peer_endpoint");
    expect_changed(IE_MSG_READY, NULL, "load_ms", (val_t){V_STR, .s = "1"}, IE_ERR_FORMAT, "load_ms");
    expect_changed(IE_MSG_READY, NULL, "load_ms", (val_t){V_DBL, .d = -0.5}, IE_ERR_FORMAT, "load_ms");
    expect_changed(IE_MSG_READY, NULL, "load_ms", (val_t){V_DBL, .d = 1.0 / 0.0}, IE_ERR_FORMAT, "load_ms");
    expect_changed(IE_MSG_HEARTBEAT, NULL, "busy", (val_t){.k = V_NIL}, IE_ERR_FORMAT, "busy");
    expect_changed(IE_MSG_ERROR, NULL, "code", (val_t){.k = V_MAP_EMPTY}, IE_ERR_FORMAT, "code");
    expect_changed(IE_MSG_HELLO, NULL, "kind", (val_t){V_STR, .s = "hello"}, IE_ERR_FORMAT, "kind");
    expect_changed(IE_MSG_HELLO, NULL, "kind", (val_t){V_INT, .i = 0}, IE_ERR_FORMAT, "kind");
    expect_changed(IE_MSG_HELLO, NULL, "kind", (val_t){V_INT, .i = 12}, IE_ERR_FORMAT, "kind");
    expect_changed(IE_MSG_HELLO, NULL, "v", (val_t){V_STR, .s = "1"}, IE_ERR_FORMAT, "v");
    /* a number where a float is expected may be an int; flags may be 0/1 */
    expect_changed(IE_MSG_READY, NULL, "load_ms", (val_t){V_INT, .i = 7}, IE_OK, NULL);
    CU_ASSERT_EQUAL(g_b.u.ready.load_ms, 7.0);
    expect_changed(IE_MSG_HEARTBEAT, NULL, "busy", (val_t){V_INT, .i = 0}, IE_OK, NULL);
    CU_ASSERT_EQUAL(g_b.u.heartbeat.busy, 0);
}

static void test_missing_keys(void)
{
    static const struct {
        ie_msg_kind_t kind;
        const char *key;
    } req[] = {{IE_MSG_HELLO, "rank"},
               {IE_MSG_HELLO, "peer_endpoint"},
               {IE_MSG_HELLO, "model_fp"},
               {IE_MSG_ASSIGN, "n_ranks"},
               {IE_MSG_ASSIGN, "peer_endpoint"},
               {IE_MSG_ASSIGN, "epoch"},
               {IE_MSG_READY, "status"},
               {IE_MSG_STEP, "n"},
               {IE_MSG_STEP, "kv_words"},
               {IE_MSG_ASSIGN, "kv_block"},
               {IE_MSG_ASSIGN, "kv_blocks"},
               {IE_MSG_RESULT, "vocab_end"},
               {IE_MSG_PARTIAL, "count"},
               {IE_MSG_HEARTBEAT, "rank"},
               {IE_MSG_ERROR, "code"},
               {IE_MSG_HELLO, "kind"},
               {IE_MSG_STEP, "v"}};
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
        expect_changed(req[i].kind, req[i].key, NULL, (val_t){.k = V_NIL}, IE_ERR_FORMAT, req[i].key);
    /* optional texts default to "" */
    expect_changed(IE_MSG_HELLO, "topology", NULL, (val_t){.k = V_NIL}, IE_OK, NULL);
    CU_ASSERT_STRING_EQUAL(g_b.u.hello.topology, "");
    expect_changed(IE_MSG_ASSIGN, "peer_key", NULL, (val_t){.k = V_NIL}, IE_OK, NULL);
    CU_ASSERT_STRING_EQUAL(g_b.u.assign.peer_key[0], "");
    CU_ASSERT_STRING_EQUAL(g_b.u.assign.peer_endpoint[3], "tcp://10.0.0.4:5601");
    /* an ASSIGN without a cluster id (an older coordinator): 0, no shared-memory reduce */
    expect_changed(IE_MSG_ASSIGN, "cluster_id", NULL, (val_t){.k = V_NIL}, IE_OK, NULL);
    CU_ASSERT_EQUAL(g_b.u.assign.cluster_id, 0);
    CU_ASSERT_EQUAL(g_b.u.assign.dead_ms, 3000);
    /* without KV cache types (an older coordinator): 0, an f32 cache, auto */
    expect_changed(IE_MSG_ASSIGN, "kv_type_k", NULL, (val_t){.k = V_NIL}, IE_OK, NULL);
    CU_ASSERT_EQUAL(g_b.u.assign.kv_type_k, 0);
    CU_ASSERT_EQUAL(g_b.u.assign.kv_type_v, 5);
    expect_changed(IE_MSG_ASSIGN, "kv_rotate", NULL, (val_t){.k = V_NIL}, IE_OK, NULL);
    CU_ASSERT_EQUAL(g_b.u.assign.kv_rotate, 0);
    /* sliding layers' rings: carried, and off (0: rings) without the field */
    CU_ASSERT_EQUAL(g_b.u.assign.kv_swa_full, 1);
    expect_changed(IE_MSG_ASSIGN, "kv_swa_full", NULL, (val_t){.k = V_NIL}, IE_OK, NULL);
    CU_ASSERT_EQUAL(g_b.u.assign.kv_swa_full, 0);
}

static void test_ranges_and_strings(void)
{
    char big[1024];
    memset(big, 'h', sizeof big);
    big[IE_PROTO_TEXT_MAX] = '\0'; /* 512 bytes: one too many for char[512] */
    expect_changed(IE_MSG_HELLO, NULL, "host", (val_t){V_STR, .s = big}, IE_ERR_FORMAT, "host");
    big[IE_PROTO_TEXT_MAX - 1] = '\0'; /* 511: fits */
    expect_changed(IE_MSG_HELLO, NULL, "host", (val_t){V_STR, .s = big}, IE_OK, NULL);
    CU_ASSERT_EQUAL(strlen(g_b.u.hello.host), IE_PROTO_TEXT_MAX - 1);
    memset(big, 'k', sizeof big);
    big[IE_PROTO_KEY_MAX] = '\0';
    expect_changed(IE_MSG_HELLO, NULL, "public_key", (val_t){V_STR, .s = big}, IE_ERR_FORMAT, "public_key");
    expect_changed(IE_MSG_ASSIGN, NULL, "peer_key", (val_t){V_ARR_STR, .s = big, .slen = 4}, IE_ERR_FORMAT,
                   "peer_key");
    expect_changed(IE_MSG_ASSIGN, NULL, "n_ranks", (val_t){V_INT, .i = 0}, IE_ERR_FORMAT, "n_ranks");
    expect_changed(IE_MSG_ASSIGN, NULL, "n_ranks", (val_t){V_INT, .i = 65}, IE_ERR_FORMAT, "n_ranks");
    expect_changed(IE_MSG_ASSIGN, NULL, "n_ranks", (val_t){V_INT, .i = 5}, IE_ERR_FORMAT, "peer_endpoint");
    expect_changed(IE_MSG_ASSIGN, NULL, "rank", (val_t){V_INT, .i = 4}, IE_ERR_FORMAT, "rank");
    expect_changed(IE_MSG_ASSIGN, NULL, "peer_key", (val_t){V_ARR_STR, .s = "k", .slen = 3}, IE_ERR_FORMAT,
                   "peer_key");
    expect_changed(IE_MSG_STEP, NULL, "kv_words", (val_t){V_INT, .i = IE_PROTO_KV_WORDS_MAX + 1}, IE_ERR_FORMAT,
                   "kv_words");
    expect_changed(IE_MSG_STEP, NULL, "kv_words", (val_t){V_INT, .i = -1}, IE_ERR_FORMAT, "kv_words");
    expect_changed(IE_MSG_STEP, NULL, "kv_words", (val_t){V_INT, .i = IE_PROTO_KV_WORDS_MAX}, IE_OK, NULL);
    CU_ASSERT_EQUAL(g_b.u.step.kv_words, IE_PROTO_KV_WORDS_MAX);
    expect_changed(IE_MSG_STEP, NULL, "kv_words", (val_t){V_INT, .i = 0}, IE_OK, NULL);
    CU_ASSERT_EQUAL(g_b.u.step.kv_words, 0);
    expect_changed(IE_MSG_ASSIGN, NULL, "kv_blocks", (val_t){V_INT, .i = -1}, IE_ERR_FORMAT, "kv_blocks");
    expect_changed(IE_MSG_ASSIGN, NULL, "kv_block", (val_t){V_INT, .i = 0}, IE_OK, NULL);
    CU_ASSERT_EQUAL(g_b.u.assign.kv_block, 0);
    expect_changed(IE_MSG_ASSIGN, NULL, "kv_type_v", (val_t){V_INT, .i = 7}, IE_ERR_FORMAT, "kv_type_v");
    expect_changed(IE_MSG_ASSIGN, NULL, "kv_rotate", (val_t){V_INT, .i = 3}, IE_ERR_FORMAT, "kv_rotate");
    expect_changed(IE_MSG_ASSIGN, NULL, "kv_swa_full", (val_t){V_INT, .i = 2}, IE_ERR_FORMAT, "kv_swa_full");
    expect_changed(IE_MSG_STEP, NULL, "n", (val_t){V_INT, .i = -1}, IE_ERR_FORMAT, "n");
    expect_changed(IE_MSG_STEP, NULL, "n", (val_t){V_INT, .i = (int64_t)INT32_MAX + 1}, IE_ERR_FORMAT, "n");
    expect_changed(IE_MSG_HELLO, NULL, "rank", (val_t){V_INT, .i = -2}, IE_ERR_FORMAT, "rank");
    expect_changed(IE_MSG_HELLO, NULL, "rank", (val_t){V_INT, .i = 64}, IE_ERR_FORMAT, "rank");
    expect_changed(IE_MSG_RESULT, NULL, "vocab_begin", (val_t){V_UINT, .i = -1}, IE_ERR_FORMAT, "vocab_begin");
    expect_changed(IE_MSG_RESULT, NULL, "vocab_end", (val_t){V_INT, .i = 5}, IE_ERR_FORMAT, "vocab_end");
    expect_changed(IE_MSG_PARTIAL, NULL, "from_rank", (val_t){V_INT, .i = 100}, IE_ERR_FORMAT, "from_rank");
}

static void test_version_and_shape(void)
{
    /* versions 1 (clear lists, no KV pool), 2 (every logits row whole),
     * 3 (no chained steps) and 4 (no hidden-state rows, no LoRA) are other protocols now */
    expect_changed(IE_MSG_HELLO, NULL, "v", (val_t){V_INT, .i = 1}, IE_ERR_UNSUPPORTED, NULL);
    expect_changed(IE_MSG_HELLO, NULL, "v", (val_t){V_INT, .i = 2}, IE_ERR_UNSUPPORTED, NULL);
    expect_changed(IE_MSG_HELLO, NULL, "v", (val_t){V_INT, .i = 3}, IE_ERR_UNSUPPORTED, NULL);
    expect_changed(IE_MSG_HELLO, NULL, "v", (val_t){V_INT, .i = 4}, IE_ERR_UNSUPPORTED, NULL);
    expect_changed(IE_MSG_HELLO, NULL, "v", (val_t){V_INT, .i = 6}, IE_ERR_UNSUPPORTED, NULL);
    expect_changed(IE_MSG_HELLO, NULL, "v", (val_t){V_INT, .i = 0}, IE_ERR_UNSUPPORTED, NULL);
    /* version is judged before anything else: a v1 header with odd keys is "another version" */
    {
        ie_buf_t b = {0};
        msgpack_sbuffer s1, s2;
        val_t v2 = {V_INT, .i = 1}, bad = {V_STR, .s = "?"};
        encode_sample(IE_MSG_STEP, &b);
        repack(b.data, b.len, NULL, "v", &v2, &s1);
        repack(s1.data, s1.size, "n", "epoch", &bad, &s2);
        expect_decode(s2.data, s2.size, IE_ERR_UNSUPPORTED, NULL);
        msgpack_sbuffer_destroy(&s1);
        msgpack_sbuffer_destroy(&s2);
        ie_buf_free(&b);
    }
    /* unknown keys are ignored */
    expect_changed(IE_MSG_STEP, NULL, "future_field", (val_t){V_ARR_STR, .s = "x", .slen = 3}, IE_OK, NULL);
    CU_ASSERT_EQUAL(g_b.u.step.n, 17);

    static const uint8_t not_map[] = {0x93, 0x01, 0x02, 0x03};        /* [1,2,3] */
    static const uint8_t int_key[] = {0x81, 0x01, 0x01};              /* {1:1} */
    static const uint8_t huge_arr[] = {0xdd, 0xff, 0xff, 0xff, 0xff}; /* array of 4G: never allocated */
    static const uint8_t huge_map[] = {0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'v', 0x01};
    static const uint8_t huge_str[] = {0x81, 0xa1, 'v', 0xdb, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t deep[] = {0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x90};
    static const uint8_t never[] = {0xc1};
    static const uint8_t dup_v[] = {0x83, 0xa1, 'v', 0x05, 0xa1, 'v', 0x05, 0xa4, 'k', 'i', 'n', 'd', 0x08};
    static const uint8_t bye[] = {0x82, 0xa1, 'v', 0x05, 0xa4, 'k', 'i', 'n', 'd', 0x08};
    static const uint8_t dup_kind[] = {0x83, 0xa1, 'v',  0x05, 0xa4, 'k', 'i', 'n',
                                       'd',  0x08, 0xa4, 'k',  'i',  'n', 'd', 0x08};
    expect_decode(not_map, sizeof not_map, IE_ERR_FORMAT, NULL);
    expect_decode(int_key, sizeof int_key, IE_ERR_FORMAT, NULL);
    expect_decode(huge_arr, sizeof huge_arr, IE_ERR_FORMAT, NULL);
    expect_decode(huge_map, sizeof huge_map, IE_ERR_FORMAT, NULL);
    expect_decode(huge_str, sizeof huge_str, IE_ERR_FORMAT, NULL);
    expect_decode(deep, sizeof deep, IE_ERR_FORMAT, NULL);
    expect_decode(never, sizeof never, IE_ERR_FORMAT, NULL);
    expect_decode(dup_v, sizeof dup_v, IE_ERR_FORMAT, "v");
    expect_decode(dup_kind, sizeof dup_kind, IE_ERR_FORMAT, "kind");
    expect_decode(bye, sizeof bye, IE_OK, NULL);
    CU_ASSERT_EQUAL(g_b.kind, IE_MSG_BYE);
    expect_decode("", 0, IE_ERR_FORMAT, NULL);
    CU_ASSERT_EQUAL(ie_msg_decode(bye, sizeof bye, NULL), IE_ERR_INVAL);
    /* duplicate known key */
    {
        ie_buf_t b = {0};
        encode_sample(IE_MSG_HEARTBEAT, &b);
        /* {v, kind, epoch, rank, busy} + a second "busy": bump the fixmap count */
        CU_ASSERT_FATAL((uint8_t)b.data[0] == 0x85);
        b.data[0] = (char)0x86;
        ie_buf_append(&b,
                      "\xa4"
                      "busy"
                      "\xc3",
                      6);
        expect_decode(b.data, b.len, IE_ERR_FORMAT, "busy");
        ie_buf_free(&b);
    }
}

static void test_trailing_and_truncated(void)
{
    ie_buf_t b = {0};
    int bad = 0;
    for (int k = IE_MSG_HELLO; k <= IE_MSG_LORA_ACK; k++) {
        encode_sample((ie_msg_kind_t)k, &b);
        ie_buf_append(&b, "\x00", 1);
        expect_decode(b.data, b.len, IE_ERR_FORMAT, NULL);
        CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "trailing"));
        b.len--;
        /* every proper prefix fails, into an exactly-sized heap block so ASan sees any overread */
        for (size_t n = 0; n < b.len; n++) {
            char *p = malloc(n ? n : 1);
            memcpy(p, b.data, n);
            if (ie_msg_decode(p, n, &g_b) != IE_ERR_FORMAT || g_b.kind != IE_MSG_NONE) bad++;
            free(p);
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    ie_buf_free(&b);
}

/* Random byte mutations never crash; whatever decodes re-encodes to an
 * equal message (the decoder admits only what the encoder would write). */
static void test_mutations(void)
{
    ie_buf_t b = {0}, b2 = {0};
    int accepted = 0, bad = 0;
    rng_seed(7);
    for (int k = IE_MSG_HELLO; k <= IE_MSG_LORA_ACK; k++) {
        encode_sample((ie_msg_kind_t)k, &b);
        char *p = malloc(b.len);
        for (int it = 0; it < 3000; it++) {
            memcpy(p, b.data, b.len);
            const int flips = 1 + (int)(rng_u32() % 4);
            for (int f = 0; f < flips; f++) {
                const size_t at = rng_u32() % b.len;
                p[at] = (rng_u32() & 1) ? (char)rng_u32() : (char)(p[at] ^ (1u << (rng_u32() % 8)));
            }
            const size_t n = (rng_u32() % 8 == 0) ? rng_u32() % b.len : b.len;
            if (ie_msg_decode(p, n, &g_b) != IE_OK) {
                if (g_b.kind != IE_MSG_NONE) bad++;
                continue;
            }
            accepted++;
            if (ie_msg_encode(&g_b, &b2) != IE_OK) {
                bad++;
                continue;
            }
            g_a = g_b;
            if (ie_msg_decode(b2.data, b2.len, &g_b) != IE_OK || memcmp(&g_a, &g_b, sizeof g_a) != 0) bad++;
        }
        free(p);
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(accepted > 0);
    ie_buf_free(&b);
    ie_buf_free(&b2);
}

/* ------------------------------------------------------------ KV operations */

/* A frame with every kind of operation, edge values included. */
static void kv_sample(ie_buf_t *f)
{
    static const int32_t pb[5] = {0, -1, 7, INT32_MAX, 3};
    const ie_kv_op_t ops[] = {
        {IE_KV_OP_CLEAR, 3, 0, 0, NULL},          {IE_KV_OP_BIND, 0, 2, 5, pb},
        {IE_KV_OP_SET_LEN, 1, 0, 40, NULL},       {IE_KV_OP_BIND, 2, 0, 0, NULL},
        {IE_KV_OP_SET_LEN, 0, 0, 0, NULL},        {IE_KV_OP_CLEAR, INT32_MAX, 0, 0, NULL},
        {IE_KV_OP_BIND, 1, INT32_MAX, 1, pb + 1},
    };
    ie_buf_reset(f);
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) CU_ASSERT_EQUAL(ie_kv_ops_append(f, &ops[i]), IE_OK);
}

/* Re-encode a validated frame through next + append: the same bytes. */
static int kv_reencode_equal(const void *data, size_t bytes)
{
    ie_buf_t g = {0};
    ie_kv_op_t op;
    size_t off = 0;
    int32_t *w = malloc(bytes ? bytes : 4); /* aligned copy */
    if (bytes) memcpy(w, data, bytes);
    int ok = 1;
    while (ie_kv_ops_next(w, bytes / 4, &off, &op)) ok &= ie_kv_ops_append(&g, &op) == IE_OK;
    ok &= g.len == bytes && (bytes == 0 || memcmp(g.data, data, bytes) == 0);
    free(w);
    ie_buf_free(&g);
    return ok;
}

/* LORA: names and paths pair up, at most IE_PROTO_LORA_PARTS of each, and
 * an ADD names at least one adapter. */
static void test_lora_limits(void)
{
    ie_buf_t b = {0};
    ie_msg_t m = {.kind = IE_MSG_LORA};
    /* the encoder refuses what the decoder would */
    m.u.lora = (ie_msg_lora_t){.seq = 1, .op = IE_LORA_OP_ADD, .id = 0, .n_name = 2, .n_path = 1};
    CU_ASSERT_NOT_EQUAL(ie_msg_encode(&m, &b), IE_OK);
    m.u.lora.n_name = m.u.lora.n_path = 0; /* an add names at least one */
    CU_ASSERT_NOT_EQUAL(ie_msg_encode(&m, &b), IE_OK);
    m.u.lora.n_name = m.u.lora.n_path = IE_PROTO_LORA_PARTS + 1;
    CU_ASSERT_NOT_EQUAL(ie_msg_encode(&m, &b), IE_OK);
    m.u.lora = (ie_msg_lora_t){.seq = 1, .op = IE_LORA_OP_REMOVE, .id = 3}; /* a remove names none */
    CU_ASSERT_EQUAL(ie_msg_encode(&m, &b), IE_OK);
    expect_decode(b.data, b.len, IE_OK, NULL);
    CU_ASSERT_EQUAL(g_b.u.lora.id, 3);
    /* and the decoder the same from the wire */
    expect_changed(IE_MSG_LORA, NULL, "n_path", (val_t){V_INT, .i = 1}, IE_ERR_FORMAT, "path");
    expect_changed(IE_MSG_LORA, NULL, "n_path", (val_t){V_INT, .i = IE_PROTO_LORA_PARTS + 1}, IE_ERR_FORMAT,
                   "n_path");
    expect_changed(IE_MSG_LORA, NULL, "id", (val_t){V_INT, .i = IE_PROTO_LORA_IDS}, IE_ERR_FORMAT, "id");
    expect_changed(IE_MSG_LORA, NULL, "op", (val_t){V_INT, .i = 3}, IE_ERR_FORMAT, "op");
    expect_changed(IE_MSG_LORA, NULL, "name", (val_t){V_ARR_STR, .s = "x", .slen = IE_PROTO_LORA_PARTS + 1},
                   IE_ERR_FORMAT, "name");
    ie_buf_free(&b);
}

static void test_kv_ops_round_trip(void)
{
    ie_buf_t f = {0};
    int n_ops = -1;
    kv_sample(&f);
    CU_ASSERT_EQUAL(f.len, 4 * (2 + 9 + 3 + 4 + 3 + 2 + 5));
    CU_ASSERT_EQUAL(ie_kv_ops_check(f.data, f.len, &n_ops), IE_OK);
    CU_ASSERT_EQUAL(n_ops, 7);
    CU_ASSERT(kv_reencode_equal(f.data, f.len));
    /* the decoded operations, in order */
    ie_kv_op_t op;
    size_t off = 0;
    const int32_t *w = (const int32_t *)f.data;
    CU_ASSERT(ie_kv_ops_next(w, f.len / 4, &off, &op) && op.kind == IE_KV_OP_CLEAR && op.seq == 3);
    CU_ASSERT(ie_kv_ops_next(w, f.len / 4, &off, &op) && op.kind == IE_KV_OP_BIND && op.seq == 0 && op.first == 2 &&
              op.n == 5 && op.pb[1] == -1 && op.pb[3] == INT32_MAX);
    CU_ASSERT(ie_kv_ops_next(w, f.len / 4, &off, &op) && op.kind == IE_KV_OP_SET_LEN && op.seq == 1 && op.n == 40);
    CU_ASSERT(ie_kv_ops_next(w, f.len / 4, &off, &op) && op.kind == IE_KV_OP_BIND && op.n == 0);
    for (int i = 0; i < 3; i++) CU_ASSERT(ie_kv_ops_next(w, f.len / 4, &off, &op));
    CU_ASSERT_FALSE(ie_kv_ops_next(w, f.len / 4, &off, &op));
    /* the empty frame: no operations */
    CU_ASSERT_EQUAL(ie_kv_ops_check(NULL, 0, &n_ops), IE_OK);
    CU_ASSERT_EQUAL(n_ops, 0);
    /* the encoder refuses what the checker would */
    const int32_t bad_pb[2] = {1, -2};
    const ie_kv_op_t refused[] = {
        {IE_KV_OP_CLEAR, -1, 0, 0, NULL},    {IE_KV_OP_SET_LEN, 0, 0, -1, NULL},  {IE_KV_OP_BIND, 0, -1, 1, bad_pb},
        {IE_KV_OP_BIND, 0, 0, -1, bad_pb},   {IE_KV_OP_BIND, 0, 0, 2, bad_pb},    {IE_KV_OP_BIND, 0, 0, 1, NULL},
        {(ie_kv_op_kind_t)4, 0, 0, 0, NULL}, {(ie_kv_op_kind_t)0, 0, 0, 0, NULL},
    };
    const size_t len = f.len;
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        CU_ASSERT_EQUAL(ie_kv_ops_append(&f, &refused[i]), IE_ERR_INVAL);
        CU_ASSERT_EQUAL(f.len, len); /* unchanged */
    }
    CU_ASSERT_EQUAL(ie_kv_ops_append(NULL, &refused[0]), IE_ERR_INVAL);
    ie_buf_free(&f);
}

/* Every truncation fails unless it ends on an operation boundary (then it
 * is the frame of the operations before); odd byte counts always fail. */
static void test_kv_ops_truncated(void)
{
    ie_buf_t f = {0};
    kv_sample(&f);
    static const size_t bounds[] = {0, 2, 11, 14, 18, 21, 23, 28}; /* words at operation boundaries */
    int bad = 0;
    for (size_t n = 0; n < f.len; n++) {
        char *p = malloc(n ? n : 1); /* exactly sized: ASan sees any overread */
        memcpy(p, f.data, n);
        int at_bound = 0, ops = -1;
        for (size_t k = 0; k < sizeof bounds / sizeof bounds[0]; k++) at_bound |= n == 4 * bounds[k];
        const ie_status_t st = ie_kv_ops_check(p, n, &ops);
        if (at_bound ? st != IE_OK : st != IE_ERR_FORMAT) bad++;
        if (st != IE_OK && ops != 0) bad++;
        free(p);
    }
    CU_ASSERT_EQUAL(bad, 0);
    ie_buf_free(&f);
}

static void test_kv_ops_mutations_and_limits(void)
{
    ie_buf_t f = {0};
    int accepted = 0, refused = 0, bad = 0;
    kv_sample(&f);
    rng_seed(11);
    int32_t *w = malloc(f.len);
    const size_t nw = f.len / 4;
    for (int it = 0; it < 20000; it++) {
        memcpy(w, f.data, f.len);
        const int flips = 1 + (int)(rng_u32() % 3);
        for (int k = 0; k < flips; k++) {
            const size_t at = rng_u32() % nw;
            switch (rng_u32() % 4) {
            case 0: w[at] = (int32_t)rng_u32(); break;
            case 1: w[at] ^= (int32_t)(1u << (rng_u32() % 32)); break;
            case 2: w[at] = (int32_t)(rng_u32() % 5) - 1; break; /* small values: other kinds, counts */
            default: w[at] = (int32_t)(rng_u32() % 40); break;
            }
        }
        if (ie_kv_ops_check(w, f.len, NULL) != IE_OK) {
            refused++;
            continue;
        }
        accepted++;
        if (!kv_reencode_equal(w, f.len)) bad++;
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(accepted > 0 && refused > 0);
    free(w);

    /* limits: block ids and words */
    int32_t *ids = calloc(IE_PROTO_KV_IDS_MAX + 1, sizeof(int32_t));
    CU_ASSERT_FATAL(ids != NULL);
    ie_buf_reset(&f);
    const ie_kv_op_t big = {IE_KV_OP_BIND, 0, 0, IE_PROTO_KV_IDS_MAX, ids};
    CU_ASSERT_EQUAL(ie_kv_ops_append(&f, &big), IE_OK);
    CU_ASSERT_EQUAL(ie_kv_ops_check(f.data, f.len, NULL), IE_OK);
    const ie_kv_op_t one = {IE_KV_OP_BIND, 1, 0, 1, ids};
    CU_ASSERT_EQUAL(ie_kv_ops_append(&f, &one), IE_OK); /* the encoder leaves the limit to the caller */
    CU_ASSERT_EQUAL(ie_kv_ops_check(f.data, f.len, NULL), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "65536"));
    ie_buf_reset(&f);
    const ie_kv_op_t clr = {IE_KV_OP_CLEAR, 0, 0, 0, NULL};
    for (int i = 0; i < IE_PROTO_KV_WORDS_MAX / 2; i++) ie_kv_ops_append(&f, &clr);
    CU_ASSERT_EQUAL(f.len, 4u * IE_PROTO_KV_WORDS_MAX);
    CU_ASSERT_EQUAL(ie_kv_ops_check(f.data, f.len, NULL), IE_OK);
    ie_kv_ops_append(&f, &clr);
    CU_ASSERT_EQUAL(ie_kv_ops_check(f.data, f.len, NULL), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_kv_ops_check(f.data, 6, NULL), IE_ERR_FORMAT); /* not whole words */
    free(ids);
    ie_buf_free(&f);
}

/* ------------------------------------------------------------ client requests */

/* Pack a request map from (key, value) pairs. */
typedef struct kvp {
    const char *key;
    val_t v;
} kvp_t;

static void pack_req(const kvp_t *kv, int n, msgpack_sbuffer *sb)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        msgpack_pack_str_with_body(&pk, kv[i].key, strlen(kv[i].key));
        pack_val(&pk, &kv[i].v);
    }
}

static ie_status_t req_decode(const kvp_t *kv, int n, ie_client_req_t *r)
{
    msgpack_sbuffer sb;
    pack_req(kv, n, &sb);
    const ie_status_t st = ie_client_req_decode(sb.data, sb.size, r);
    msgpack_sbuffer_destroy(&sb);
    return st;
}

#define V1                     \
    {                          \
        "v", { V_INT, .i = 1 } \
    }
#define GEN                                \
    {                                      \
        "type", { V_STR, .s = "generate" } \
    }
#define ID                            \
    {                                 \
        "id", { V_STR, .s = "req-1" } \
    }
#define PROMPT                            \
    {                                     \
        "prompt", { V_STR, .s = "Hello" } \
    }

/* Expect a request with one extra key to fail with st naming the key. */
static void expect_req(kvp_t extra, ie_status_t st)
{
    ie_client_req_t r;
    kvp_t kv[] = {V1, GEN, ID, PROMPT, extra};
    const ie_status_t got = req_decode(kv, 5, &r);
    CU_ASSERT_EQUAL(got, st);
    if (got != st)
        fprintf(stderr, "\n  key %s: expected %s, got %s: %s\n", extra.key, ie_status_str(st), ie_status_str(got),
                ie_error_last());
    if (st != IE_OK) {
        char q[64];
        snprintf(q, sizeof q, "\"%s\"", extra.key);
        CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), q));
        CU_ASSERT_PTR_NULL(r.id);
    }
    ie_client_req_clear(&r);
}

static void test_req_defaults(void)
{
    ie_client_req_t r;
    kvp_t kv[] = {V1, GEN, ID, PROMPT};
    CU_ASSERT_EQUAL_FATAL(req_decode(kv, 4, &r), IE_OK);
    CU_ASSERT_STRING_EQUAL(r.type, "generate");
    CU_ASSERT_STRING_EQUAL(r.id, "req-1");
    CU_ASSERT_STRING_EQUAL(r.prompt, "Hello");
    CU_ASSERT_PTR_NULL(r.messages);
    CU_ASSERT_EQUAL(r.n_messages, 0);
    CU_ASSERT_EQUAL(r.max_new, 128);
    CU_ASSERT_DOUBLE_EQUAL(r.temperature, 0.8, 1e-6);
    CU_ASSERT_EQUAL(r.top_k, 40);
    CU_ASSERT_DOUBLE_EQUAL(r.top_p, 0.95, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(r.min_p, 0.05, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(r.repeat_penalty, 1.0, 1e-6);
    CU_ASSERT_EQUAL(r.seed, -1);
    CU_ASSERT_EQUAL(r.n_stop, 0);
    CU_ASSERT_EQUAL(r.stream, 0);
    CU_ASSERT_EQUAL(r.priority, 0);
    CU_ASSERT_EQUAL(r.logprobs, -1);
    ie_client_req_clear(&r);
    CU_ASSERT_PTR_NULL(r.id);
    /* "logprobs": -1..20 */
    kvp_t lp[] = {V1, GEN, ID, PROMPT, {"logprobs", {V_INT, .i = 20}}};
    CU_ASSERT_EQUAL_FATAL(req_decode(lp, 5, &r), IE_OK);
    CU_ASSERT_EQUAL(r.logprobs, 20);
    ie_client_req_clear(&r);
    expect_req((kvp_t){"logprobs", {V_INT, .i = 21}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"logprobs", {V_INT, .i = -2}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"logprobs", {V_STR, .s = "3"}}, IE_ERR_FORMAT);
    ie_client_req_clear(&r); /* twice is fine */
    ie_client_req_clear(NULL);
}

static void test_req_full(void)
{
    ie_client_req_t r;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 15);
#define K(s) msgpack_pack_str_with_body(&pk, s, strlen(s))
    K("v");
    msgpack_pack_int(&pk, 1);
    K("type");
    K("generate");
    K("id");
    K("chat-9");
    K("messages");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_map(&pk, 3);
    K("role");
    K("system");
    K("content");
    K("Be brief.");
    K("name");
    K("x");
    msgpack_pack_map(&pk, 2);
    K("content");
    K("Hi");
    K("role");
    K("user");
    K("max_new");
    msgpack_pack_int(&pk, 7);
    K("temperature");
    msgpack_pack_int(&pk, 0); /* an int where a float is expected */
    K("top_k");
    msgpack_pack_int(&pk, 0);
    K("top_p");
    msgpack_pack_float(&pk, 0.5f);
    K("min_p");
    msgpack_pack_double(&pk, 0.0);
    K("repeat_penalty");
    msgpack_pack_double(&pk, 1.1);
    K("seed");
    msgpack_pack_uint64(&pk, 1234567890123ull);
    K("stop");
    msgpack_pack_array(&pk, 2);
    K("\n\n");
    K("</s>");
    K("stream");
    msgpack_pack_true(&pk);
    K("priority");
    msgpack_pack_int(&pk, -3);
    K("extension");
    msgpack_pack_map(&pk, 1);
    K("a");
    msgpack_pack_nil(&pk);
#undef K
    CU_ASSERT_EQUAL_FATAL(ie_client_req_decode(sb.data, sb.size, &r), IE_OK);
    CU_ASSERT_PTR_NULL(r.prompt);
    CU_ASSERT_EQUAL_FATAL(r.n_messages, 2);
    CU_ASSERT_STRING_EQUAL(r.messages[0].role, "system");
    CU_ASSERT_STRING_EQUAL(r.messages[0].content, "Be brief.");
    CU_ASSERT_STRING_EQUAL(r.messages[1].role, "user");
    CU_ASSERT_STRING_EQUAL(r.messages[1].content, "Hi");
    CU_ASSERT_EQUAL(r.max_new, 7);
    CU_ASSERT_EQUAL(r.temperature, 0.0f);
    CU_ASSERT_EQUAL(r.top_k, 0);
    CU_ASSERT_DOUBLE_EQUAL(r.top_p, 0.5, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(r.repeat_penalty, 1.1, 1e-6);
    CU_ASSERT_EQUAL(r.seed, 1234567890123ll);
    CU_ASSERT_EQUAL_FATAL(r.n_stop, 2);
    CU_ASSERT_STRING_EQUAL(r.stop[0], "\n\n");
    CU_ASSERT_STRING_EQUAL(r.stop[1], "</s>");
    CU_ASSERT_EQUAL(r.stream, 1);
    CU_ASSERT_EQUAL(r.priority, -3);
    ie_client_req_clear(&r);

    /* every proper prefix fails cleanly; mutations never crash or leak */
    int bad = 0;
    for (size_t n = 0; n < sb.size; n++) {
        char *p = malloc(n ? n : 1);
        memcpy(p, sb.data, n);
        if (ie_client_req_decode(p, n, &r) != IE_ERR_FORMAT || r.id || r.messages || r.stop) bad++;
        free(p);
    }
    rng_seed(11);
    char *p = malloc(sb.size);
    for (int it = 0; it < 20000; it++) {
        memcpy(p, sb.data, sb.size);
        for (int f = 0; f < 1 + (int)(rng_u32() % 3); f++) p[rng_u32() % sb.size] = (char)rng_u32();
        if (ie_client_req_decode(p, sb.size, &r) != IE_OK && (r.id || r.messages || r.stop)) bad++;
        ie_client_req_clear(&r);
    }
    free(p);
    CU_ASSERT_EQUAL(bad, 0);
    msgpack_sbuffer_destroy(&sb);
}

static void test_req_cancel_and_shape(void)
{
    ie_client_req_t r;
    kvp_t cancel[] = {V1, {"type", {V_STR, .s = "cancel"}}, ID};
    CU_ASSERT_EQUAL(req_decode(cancel, 3, &r), IE_OK);
    CU_ASSERT_STRING_EQUAL(r.type, "cancel");
    CU_ASSERT_STRING_EQUAL(r.id, "req-1");
    ie_client_req_clear(&r);

    kvp_t no_type[] = {V1, ID, PROMPT};
    CU_ASSERT_EQUAL(req_decode(no_type, 3, &r), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "\"type\""));
    kvp_t no_id[] = {V1, GEN, PROMPT};
    CU_ASSERT_EQUAL(req_decode(no_id, 3, &r), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "\"id\""));
    kvp_t no_v[] = {GEN, ID, PROMPT};
    CU_ASSERT_EQUAL(req_decode(no_v, 3, &r), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "\"v\""));
    kvp_t v2[] = {{"v", {V_INT, .i = 2}}, GEN, ID, PROMPT};
    CU_ASSERT_EQUAL(req_decode(v2, 4, &r), IE_ERR_UNSUPPORTED);
    kvp_t bad_type[] = {V1, {"type", {V_STR, .s = "complete"}}, ID, PROMPT};
    CU_ASSERT_EQUAL(req_decode(bad_type, 4, &r), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "\"type\""));
    kvp_t neither[] = {V1, GEN, ID};
    CU_ASSERT_EQUAL(req_decode(neither, 3, &r), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "exactly one"));
    kvp_t both[] = {V1, GEN, ID, PROMPT, {"messages", {V_ARR_STR, .s = "x", .slen = 1}}};
    CU_ASSERT_EQUAL(req_decode(both, 5, &r), IE_ERR_FORMAT); /* messages must hold maps */
    kvp_t dup[] = {V1, GEN, ID, PROMPT, PROMPT};
    CU_ASSERT_EQUAL(req_decode(dup, 5, &r), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NULL(r.prompt);
    /* nil on an optional key reads as absent */
    kvp_t nil_seed[] = {V1, GEN, ID, PROMPT, {"seed", {.k = V_NIL}}};
    CU_ASSERT_EQUAL(req_decode(nil_seed, 5, &r), IE_OK);
    CU_ASSERT_EQUAL(r.seed, -1);
    ie_client_req_clear(&r);
    CU_ASSERT_EQUAL(ie_client_req_decode("\x90", 1, &r), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_client_req_decode(NULL, 0, &r), IE_ERR_FORMAT);
}

static void test_req_both_prompt_and_messages(void)
{
    ie_client_req_t r;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 5);
    msgpack_pack_str_with_body(&pk, "v", 1);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_str_with_body(&pk, "type", 4);
    msgpack_pack_str_with_body(&pk, "generate", 8);
    msgpack_pack_str_with_body(&pk, "id", 2);
    msgpack_pack_str_with_body(&pk, "a", 1);
    msgpack_pack_str_with_body(&pk, "prompt", 6);
    msgpack_pack_str_with_body(&pk, "p", 1);
    msgpack_pack_str_with_body(&pk, "messages", 8);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str_with_body(&pk, "role", 4);
    msgpack_pack_str_with_body(&pk, "user", 4);
    msgpack_pack_str_with_body(&pk, "content", 7);
    msgpack_pack_str_with_body(&pk, "c", 1);
    CU_ASSERT_EQUAL(ie_client_req_decode(sb.data, sb.size, &r), IE_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "exactly one"));
    CU_ASSERT_PTR_NULL(r.messages);
    msgpack_sbuffer_destroy(&sb);
}

static void test_req_limits(void)
{
    char *big = malloc((1u << 20) + 2);
    memset(big, 'a', (1u << 20) + 1);
    big[(1u << 20) + 1] = '\0';
    {
        ie_client_req_t r;
        kvp_t id129[] = {V1, GEN, {"id", {V_STR, .s = big, .slen = 129}}, PROMPT};
        CU_ASSERT_EQUAL(req_decode(id129, 4, &r), IE_ERR_FORMAT);
        CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "\"id\""));
        kvp_t ok128[] = {V1, GEN, {"id", {V_STR, .s = big, .slen = 128}}, PROMPT};
        CU_ASSERT_EQUAL(req_decode(ok128, 4, &r), IE_OK);
        ie_client_req_clear(&r);
        kvp_t empty_id[] = {V1, GEN, {"id", {V_STR, .s = ""}}, PROMPT};
        CU_ASSERT_EQUAL(req_decode(empty_id, 4, &r), IE_ERR_FORMAT);
        kvp_t p1m[] = {V1, GEN, ID, {"prompt", {V_STR, .s = big, .slen = 1u << 20}}};
        CU_ASSERT_EQUAL(req_decode(p1m, 4, &r), IE_OK);
        CU_ASSERT_EQUAL(strlen(r.prompt), 1u << 20);
        ie_client_req_clear(&r);
        kvp_t p1m1[] = {V1, GEN, ID, {"prompt", {V_STR, .s = big, .slen = (1u << 20) + 1}}};
        CU_ASSERT_EQUAL(req_decode(p1m1, 4, &r), IE_ERR_FORMAT);
        CU_ASSERT_PTR_NOT_NULL(strstr(ie_error_last(), "\"prompt\""));
    }
    free(big);
    {
        /* 256 messages ok, 257 refused; more than 1 MiB of content refused */
        ie_client_req_t r;
        for (int count = 256; count <= 257; count++) {
            msgpack_sbuffer sb;
            msgpack_packer pk;
            msgpack_sbuffer_init(&sb);
            msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
            msgpack_pack_map(&pk, 4);
            msgpack_pack_str_with_body(&pk, "v", 1);
            msgpack_pack_int(&pk, 1);
            msgpack_pack_str_with_body(&pk, "type", 4);
            msgpack_pack_str_with_body(&pk, "generate", 8);
            msgpack_pack_str_with_body(&pk, "id", 2);
            msgpack_pack_str_with_body(&pk, "m", 1);
            msgpack_pack_str_with_body(&pk, "messages", 8);
            msgpack_pack_array(&pk, (size_t)count);
            for (int i = 0; i < count; i++) {
                msgpack_pack_map(&pk, 2);
                msgpack_pack_str_with_body(&pk, "role", 4);
                msgpack_pack_str_with_body(&pk, "user", 4);
                msgpack_pack_str_with_body(&pk, "content", 7);
                msgpack_pack_str_with_body(&pk, "hi", 2);
            }
            CU_ASSERT_EQUAL(ie_client_req_decode(sb.data, sb.size, &r), count <= 256 ? IE_OK : IE_ERR_FORMAT);
            if (count == 256) CU_ASSERT_EQUAL(r.n_messages, 256);
            ie_client_req_clear(&r);
            msgpack_sbuffer_destroy(&sb);
        }
    }
    expect_req((kvp_t){"stop", {V_ARR_STR, .s = "x", .slen = 17}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"stop", {V_ARR_STR, .s = "", .slen = 1}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"stop", {V_STR, .s = "x"}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"stop", {V_ARR_STR, .s = "x", .slen = 16}}, IE_OK);
    expect_req((kvp_t){"max_new", {V_INT, .i = 0}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"max_new", {V_DBL, .d = 5}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"max_new", {V_INT, .i = 1 << 20}}, IE_OK);
    expect_req((kvp_t){"temperature", {V_DBL, .d = -0.1}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"temperature", {V_STR, .s = "hot"}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"temperature", {V_DBL, .d = 0.0 / 0.0}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"temperature", {V_INT, .i = 2}}, IE_OK);
    expect_req((kvp_t){"top_p", {V_DBL, .d = 1.5}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"min_p", {V_INT, .i = -1}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"repeat_penalty", {V_INT, .i = 0}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"repeat_penalty", {V_DBL, .d = 1e-60}},
               IE_ERR_FORMAT); /* 0 as a float (found by fuzz_proto) */
    expect_req((kvp_t){"temperature", {V_DBL, .d = 1e300}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"top_k", {V_INT, .i = -1}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"seed", {V_INT, .i = -2}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"seed", {V_UINT, .i = -1}}, IE_ERR_FORMAT); /* 2^64-1 */
    expect_req((kvp_t){"stream", {V_INT, .i = 1}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"stream", {V_BOOL, .i = 1}}, IE_OK);
    expect_req((kvp_t){"priority", {V_INT, .i = (int64_t)INT32_MAX + 1}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"messages", {.k = V_MAP_EMPTY}}, IE_ERR_FORMAT);
    expect_req((kvp_t){"unknown_key", {.k = V_MAP_EMPTY}}, IE_OK);
}

/* ------------------------------------------------------------ replies */

static const msgpack_object *get(const msgpack_object *map, const char *key)
{
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) &&
            memcmp(k->via.str.ptr, key, k->via.str.size) == 0)
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

static int str_is(const msgpack_object *o, const char *s, size_t n)
{
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == n && memcmp(o->via.str.ptr, s, n) == 0;
}

static void test_replies(void)
{
    ie_buf_t b = {0};
    msgpack_unpacked u;
    size_t off;
    msgpack_unpacked_init(&u);

    CU_ASSERT_EQUAL_FATAL(ie_client_enc_token(&b, "r1", 3, 1234, "he\0y", 4), IE_OK);
    off = 0;
    CU_ASSERT_FATAL(msgpack_unpack_next(&u, b.data, b.len, &off) == MSGPACK_UNPACK_SUCCESS && off == b.len);
    CU_ASSERT_EQUAL(u.data.via.map.size, 6);
    CU_ASSERT_EQUAL(get(&u.data, "v")->via.u64, 1);
    CU_ASSERT(str_is(get(&u.data, "type"), "token", 5));
    CU_ASSERT(str_is(get(&u.data, "id"), "r1", 2));
    CU_ASSERT_EQUAL(get(&u.data, "index")->via.u64, 3);
    CU_ASSERT_EQUAL(get(&u.data, "token")->via.u64, 1234);
    CU_ASSERT(str_is(get(&u.data, "text"), "he\0y", 4));

    ie_client_done_t d = {.id = "r1",
                          .text = "hello world",
                          .text_len = 11,
                          .finish = "stop",
                          .n_prompt = 5,
                          .n_gen = 2,
                          .ttft_ms = 12.5,
                          .total_ms = 40.0,
                          .decode_tps = 33.3};
    CU_ASSERT_EQUAL_FATAL(ie_client_enc_done(&b, &d), IE_OK);
    off = 0;
    CU_ASSERT_FATAL(msgpack_unpack_next(&u, b.data, b.len, &off) == MSGPACK_UNPACK_SUCCESS && off == b.len);
    CU_ASSERT_EQUAL(u.data.via.map.size, 10);
    CU_ASSERT(str_is(get(&u.data, "type"), "done", 4));
    CU_ASSERT(str_is(get(&u.data, "text"), "hello world", 11));
    CU_ASSERT(str_is(get(&u.data, "finish"), "stop", 4));
    CU_ASSERT_EQUAL(get(&u.data, "n_prompt")->via.u64, 5);
    CU_ASSERT_EQUAL(get(&u.data, "n_gen")->via.u64, 2);
    CU_ASSERT_EQUAL(get(&u.data, "ttft_ms")->type, MSGPACK_OBJECT_FLOAT64);
    CU_ASSERT_DOUBLE_EQUAL(get(&u.data, "ttft_ms")->via.f64, 12.5, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(get(&u.data, "total_ms")->via.f64, 40.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(get(&u.data, "decode_tps")->via.f64, 33.3, 1e-12);

    CU_ASSERT_EQUAL_FATAL(ie_client_enc_error(&b, NULL, "bad_request", "request: missing key \"id\""), IE_OK);
    off = 0;
    CU_ASSERT_FATAL(msgpack_unpack_next(&u, b.data, b.len, &off) == MSGPACK_UNPACK_SUCCESS && off == b.len);
    CU_ASSERT_EQUAL(u.data.via.map.size, 5);
    CU_ASSERT(str_is(get(&u.data, "type"), "error", 5));
    CU_ASSERT_EQUAL(get(&u.data, "id")->type, MSGPACK_OBJECT_NIL); /* no id known */
    CU_ASSERT(str_is(get(&u.data, "code"), "bad_request", 11));
    CU_ASSERT_PTR_NOT_NULL(get(&u.data, "message"));

    /* log-probabilities: a token's and the done reply's list */
    ie_client_lp_t lp = {.token = 7, .logprob = -0.5f, .n_top = 2, .top_ids = {7, 9}, .top_lps = {-0.5f, -1.5f}};
    CU_ASSERT_EQUAL_FATAL(ie_client_enc_token_lp(&b, "r1", 0, 7, "x", 1, &lp), IE_OK);
    off = 0;
    CU_ASSERT_FATAL(msgpack_unpack_next(&u, b.data, b.len, &off) == MSGPACK_UNPACK_SUCCESS && off == b.len);
    CU_ASSERT_EQUAL(u.data.via.map.size, 8);
    CU_ASSERT_DOUBLE_EQUAL(get(&u.data, "logprob")->via.f64, -0.5, 1e-12);
    const msgpack_object *tl = get(&u.data, "top_logprobs");
    CU_ASSERT_FATAL(tl && tl->type == MSGPACK_OBJECT_ARRAY && tl->via.array.size == 2);
    CU_ASSERT_EQUAL(tl->via.array.ptr[1].via.array.ptr[0].via.u64, 9);
    CU_ASSERT_DOUBLE_EQUAL(tl->via.array.ptr[1].via.array.ptr[1].via.f64, -1.5, 1e-12);
    d.lp = &lp;
    d.n_lp = 1;
    CU_ASSERT_EQUAL_FATAL(ie_client_enc_done(&b, &d), IE_OK);
    off = 0;
    CU_ASSERT_FATAL(msgpack_unpack_next(&u, b.data, b.len, &off) == MSGPACK_UNPACK_SUCCESS && off == b.len);
    CU_ASSERT_EQUAL(u.data.via.map.size, 11);
    const msgpack_object *dl = get(&u.data, "logprobs");
    CU_ASSERT_FATAL(dl && dl->type == MSGPACK_OBJECT_ARRAY && dl->via.array.size == 1);
    CU_ASSERT_EQUAL(get(&dl->via.array.ptr[0], "token")->via.u64, 7);
    CU_ASSERT_DOUBLE_EQUAL(get(&dl->via.array.ptr[0], "logprob")->via.f64, -0.5, 1e-12);
    d.lp = NULL;
    CU_ASSERT_EQUAL(ie_client_enc_done(&b, &d), IE_ERR_INVAL); /* n_lp without lp */

    CU_ASSERT_EQUAL(ie_client_enc_token(&b, "r", 0, 0, NULL, 3), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_client_enc_done(&b, NULL), IE_ERR_INVAL);
    CU_ASSERT_EQUAL(ie_client_enc_error(&b, "r", NULL, "x"), IE_ERR_INVAL);
    msgpack_unpacked_destroy(&u);
    ie_buf_free(&b);
}

/* IE_LOGITS_EMBD entries take no row of the logits payload nor of
 * logits_out: the rows of the other entries stay in order around them. */
static void test_result_logits_embd(void)
{
    enum { V = 10, N = 4 };
    const uint8_t flags[N] = {IE_LOGITS_EMBD, IE_LOGITS_FULL, IE_LOGITS_EMBD, IE_LOGITS_ARGMAX};
    CU_ASSERT_EQUAL(ie_result_logits_len(flags, N, V), V + 2);
    float lg[2 * V], out[2][V], am_val[2] = {-INFINITY, -INFINITY};
    int32_t am_id[2] = {-1, -1};
    for (int j = 0; j < 2 * V; j++) lg[j] = (float)j;
    lg[V + 3] = 100.0f; /* the ARGMAX row's winner: id 3 */
    const size_t len = ie_result_logits_pack(lg, flags, N, V, 0);
    CU_ASSERT_EQUAL(len, V + 2);
    CU_ASSERT_EQUAL(ie_result_logits_merge(lg, len * sizeof(float), flags, N, 0, V, V, &out[0][0], am_val, am_id),
                    IE_OK);
    ie_result_logits_finish(flags, N, V, am_val, am_id, &out[0][0]);
    for (int j = 0; j < V; j++) CU_ASSERT_EQUAL(out[0][j], (float)j); /* row 0: the FULL entry */
    CU_ASSERT_EQUAL(am_id[1], 3);
    CU_ASSERT_EQUAL(ie_argmax_f32(out[1], V, NULL), 3); /* row 1: the ARGMAX entry */
    const uint8_t only[2] = {IE_LOGITS_EMBD, IE_LOGITS_EMBD};
    CU_ASSERT_EQUAL(ie_result_logits_len(only, 2, V), 0);
}

/* RESULT logits payload: two ranks' slices of a 50-row vocabulary packed
 * as a worker packs them, merged as the coordinator merges them, equal to
 * the whole vocabulary's rows and first arg max; a tie across the slices
 * goes to the lower id; every malformed payload is refused and changes
 * nothing; random payloads never crash. */
static void test_result_logits(void)
{
    enum { V = 50, N = 5, CUT = 24 };
    const uint8_t flags[N] = {IE_LOGITS_ARGMAX, 0, IE_LOGITS_FULL, IE_LOGITS_ARGMAX, IE_LOGITS_ARGMAX};
    const int rows = 4;
    float full[4][V];
    rng_seed(5);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < V; j++) full[r][j] = (float)(rng_u32() % 1000) / 10.0f;
    full[0][7] = 200.0f, full[0][40] = 200.0f;            /* tie across the slices: id 7 wins */
    full[2][30] = NAN, full[2][45] = 150.0f;              /* NaN never wins */
    for (int j = 0; j < CUT; j++) full[3][j] = -INFINITY; /* rank 0 has nothing usable */
    float out[4][V], am_val[4];
    int32_t am_id[4];
    for (int r = 0; r < rows; r++) am_val[r] = -INFINITY, am_id[r] = -1;
    memset(out, 0, sizeof out);
    const int64_t b[2] = {0, CUT}, e[2] = {CUT, V};
    for (int k = 1; k >= 0; k--) { /* the ranks answer in any order */
        const int64_t nv = e[k] - b[k];
        float lg[4 * V];
        for (int r = 0; r < rows; r++) memcpy(lg + r * nv, &full[r][b[k]], sizeof(float) * (size_t)nv);
        const size_t len = ie_result_logits_pack(lg, flags, N, nv, b[k]);
        CU_ASSERT_EQUAL(len, ie_result_logits_len(flags, N, nv));
        CU_ASSERT_EQUAL(len, 2 + (size_t)nv + 2 + 2);
        CU_ASSERT_EQUAL(ie_result_logits_merge(lg, len * sizeof(float), flags, N, b[k], e[k], V, &out[0][0], am_val,
                                               am_id),
                        IE_OK);
    }
    ie_result_logits_finish(flags, N, V, am_val, am_id, &out[0][0]);
    CU_ASSERT(memcmp(out[1], full[1], sizeof out[1]) == 0); /* the FULL row, both slices */
    const int want[4] = {7, -1, 45, -1};
    for (int r = 0; r < rows; r++) {
        if (r == 1) continue;
        int64_t w = -1;
        float m = -INFINITY;
        for (int j = 0; j < V; j++)
            if (full[r][j] > m) m = full[r][j], w = j;
        if (want[r] >= 0) CU_ASSERT_EQUAL(w, want[r]);
        CU_ASSERT_EQUAL(am_id[r], w);
        CU_ASSERT_EQUAL(ie_argmax_f32(out[r], V, NULL), w); /* the finished row gives the same id */
        for (int j = 0; j < V; j++) CU_ASSERT(j == w ? out[r][j] == m : out[r][j] == -INFINITY);
    }

    /* malformed: wrong length, ids outside the slice; nothing applied */
    float pay[2 + 26 + 2 + 2];
    memset(pay, 0, sizeof pay);
    const size_t good = sizeof pay;
    float keep_val[4];
    int32_t keep_id[4];
    memcpy(keep_val, am_val, sizeof keep_val);
    memcpy(keep_id, am_id, sizeof keep_id);
    const int32_t bad_ids[] = {-2, 23, 50, 51, INT32_MIN, INT32_MAX};
    for (size_t t = 0; t < sizeof bad_ids / sizeof bad_ids[0]; t++) {
        int32_t ok = 30;
        memcpy(&pay[1], &ok, 4);
        pay[0] = 1e30f;
        memcpy(&pay[2 + 26 + 1], &ok, 4);
        memcpy(&pay[2 + 26 + 2 + 1], &bad_ids[t], 4); /* the last entry is bad: the first must not apply */
        CU_ASSERT_EQUAL(ie_result_logits_merge(pay, good, flags, N, CUT, V, V, &out[0][0], am_val, am_id),
                        IE_ERR_FORMAT);
        CU_ASSERT(memcmp(am_val, keep_val, sizeof keep_val) == 0 && memcmp(am_id, keep_id, sizeof keep_id) == 0);
    }
    CU_ASSERT_EQUAL(ie_result_logits_merge(pay, good - 4, flags, N, CUT, V, V, &out[0][0], am_val, am_id),
                    IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_result_logits_merge(pay, good + 4, flags, N, CUT, V, V, &out[0][0], am_val, am_id),
                    IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_result_logits_merge(pay, 0, flags, N, CUT, V, V, &out[0][0], am_val, am_id), IE_ERR_FORMAT);
    CU_ASSERT_EQUAL(ie_result_logits_merge(pay, good, flags, N, CUT, V + 1, V, &out[0][0], am_val, am_id),
                    IE_ERR_FORMAT); /* a slice past the vocabulary */
    /* random words of the right length: OK or refused, never out of bounds (ASan) */
    for (int t = 0; t < 2000; t++) {
        uint32_t w[sizeof pay / 4];
        for (size_t i = 0; i < sizeof w / 4; i++) w[i] = t % 2 ? rng_u32() : rng_u32() % 64;
        const ie_status_t st = ie_result_logits_merge(w, sizeof w, flags, N, CUT, V, V, &out[0][0], am_val, am_id);
        CU_ASSERT(st == IE_OK || st == IE_ERR_FORMAT);
    }
    for (int r = 0; r < rows; r++) CU_ASSERT(am_id[r] == -1 || (am_id[r] >= 0 && am_id[r] < V));
}

/* Chained steps: the ranks' gather (put, sum in rank order, pick) gives
 * the coordinator's merged arg max ids; bad entries are refused. */
static void test_chain_gather(void)
{
    enum { V = 50, N = 4, P = 3, CUT = 24 };
    const uint8_t flags[N] = {IE_LOGITS_ARGMAX, IE_LOGITS_ARGMAX, IE_LOGITS_ARGMAX, IE_LOGITS_ARGMAX};
    float full[N][V];
    rng_seed(11);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < V; j++) full[r][j] = (float)(rng_u32() % 1000) / 10.0f - 50.0f;
    full[0][7] = 200.0f, full[0][40] = 200.0f;            /* a tie across the slices: 7 */
    full[1][30] = NAN, full[1][3] = 180.0f;               /* NaN never wins */
    for (int j = 0; j < CUT; j++) full[2][j] = -INFINITY; /* rank 0 has nothing usable */
    full[3][33] = -0.0f, full[3][5] = 0.0f;               /* equal zeros of both signs: the lower id */
    for (int j = 0; j < V; j++)
        if (j != 33 && j != 5) full[3][j] = -1.0f;
    const int64_t b[P] = {0, CUT, 0}, e[P] = {CUT, V, 0}; /* rank 2 holds no head */
    float g[P][2 * P * N], am_val[N];
    int32_t am_id[N];
    for (int i = 0; i < N; i++) am_val[i] = -INFINITY, am_id[i] = -1;
    CU_ASSERT_EQUAL(ie_chain_gather_len(P, N), (size_t)2 * P * N);
    for (int k = 0; k < P; k++) {
        const int64_t nv = e[k] - b[k];
        float lg[N * V];
        for (int r = 0; r < N; r++) memcpy(lg + r * nv, &full[r][b[k]], sizeof(float) * (size_t)nv);
        if (nv > 0) {
            const size_t len = ie_result_logits_pack(lg, flags, N, nv, b[k]);
            CU_ASSERT_EQUAL(ie_result_logits_merge(lg, len * sizeof(float), flags, N, b[k], e[k], V, NULL, am_val,
                                                   am_id),
                            IE_OK);
        }
        ie_chain_gather_put(g[k], P, k, N, nv > 0 ? lg : NULL);
    }
    float sum[2 * P * N];
    for (size_t j = 0; j < sizeof sum / sizeof sum[0]; j++) {
        float t = g[0][j];
        for (int k = 1; k < P; k++) t += g[k][j];
        sum[j] = t;
    }
    int32_t tok[N];
    CU_ASSERT_EQUAL_FATAL(ie_chain_gather_pick(sum, P, N, V, tok), IE_OK);
    const int32_t want[N] = {7, 3, -2, 5}; /* -2: whatever the scan says */
    for (int i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(tok[i], am_id[i]);
        if (want[i] >= 0) CU_ASSERT_EQUAL(tok[i], want[i]);
        CU_ASSERT(tok[i] >= CUT || i != 2);
    }
    /* refused: an id field that is -1 (a rank that cannot chain), not an
     * integer, past the vocabulary, NaN; an entry nobody can answer */
    const float bad[] = {-1.0f, 1.5f, (float)V + 1.0f, NAN, INFINITY};
    for (size_t t = 0; t < sizeof bad / sizeof bad[0]; t++) {
        float s2[2 * P * N];
        memcpy(s2, sum, sizeof s2);
        s2[ie_chain_gather_len(1, N) + 2 * 2 + 1] = bad[t];
        CU_ASSERT_EQUAL(ie_chain_gather_pick(s2, P, N, V, tok), IE_ERR_FORMAT);
    }
    float none[2 * P * N];
    memcpy(none, sum, sizeof none);
    for (int k = 0; k < P; k++) none[ie_chain_gather_len(k, N) + 2 * 1 + 1] = 0.0f; /* entry 1: no id anywhere */
    CU_ASSERT_EQUAL(ie_chain_gather_pick(none, P, N, V, tok), IE_ERR_FORMAT);
    /* random sums: OK or refused, ids in range */
    for (int t = 0; t < 2000; t++) {
        float w[2 * P * N];
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            w[i] = t % 2 ? (float)(int32_t)rng_u32() : (float)(rng_u32() % 60) - 5.0f;
        const ie_status_t st = ie_chain_gather_pick(w, P, N, V, tok);
        CU_ASSERT(st == IE_OK || st == IE_ERR_FORMAT);
        if (st == IE_OK)
            for (int i = 0; i < N; i++) CU_ASSERT(tok[i] >= 0 && tok[i] < V);
    }
    /* the STEP's chain flag survives encoding */
    ie_buf_t buf = {0};
    sample(IE_MSG_STEP, &g_a);
    g_a.u.step.chain = 1;
    CU_ASSERT_EQUAL_FATAL(ie_msg_encode(&g_a, &buf), IE_OK);
    CU_ASSERT_EQUAL(ie_msg_decode(buf.data, buf.len, &g_b), IE_OK);
    CU_ASSERT_EQUAL(g_b.u.step.chain, 1);
    ie_buf_free(&buf);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("proto", NULL, NULL);
    CU_add_test(s, "kind names", test_kind_names);
    CU_add_test(s, "round trip of every kind", test_round_trip);
    CU_add_test(s, "encoder refuses bad fields", test_encode_refuses);
    CU_add_test(s, "wrong types", test_wrong_types);
    CU_add_test(s, "missing keys", test_missing_keys);
    CU_add_test(s, "ranges and string sizes", test_ranges_and_strings);
    CU_add_test(s, "version and shape", test_version_and_shape);
    CU_add_test(s, "trailing bytes, every truncation", test_trailing_and_truncated);
    CU_add_test(s, "random mutations", test_mutations);
    CU_add_test(s, "lora: parts limits", test_lora_limits);
    CU_add_test(s, "kv ops: round trip, encoder refusals", test_kv_ops_round_trip);
    CU_add_test(s, "kv ops: every truncation", test_kv_ops_truncated);
    CU_add_test(s, "kv ops: mutations, limits", test_kv_ops_mutations_and_limits);
    CU_add_test(s, "client request defaults", test_req_defaults);
    CU_add_test(s, "client request, every key", test_req_full);
    CU_add_test(s, "client cancel and request shape", test_req_cancel_and_shape);
    CU_add_test(s, "client prompt and messages together", test_req_both_prompt_and_messages);
    CU_add_test(s, "client request limits", test_req_limits);
    CU_add_test(s, "reply encoders", test_replies);
    CU_add_test(s, "RESULT logits payload: pack, merge, finish, bad input", test_result_logits);
    CU_add_test(s, "RESULT logits payload around hidden-state entries", test_result_logits_embd);
    CU_add_test(s, "chained steps: token gather against the merge, bad input", test_chain_gather);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

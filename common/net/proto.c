/* proto.c — MessagePack headers of the wire protocol (ie_proto.h,
 * docs/PROTOCOL.md): encoders and validating decoders.
 *
 * Cluster headers are described by one table per kind (key, C type, offset
 * in the struct, range), so the encoder and the decoder read the same rules
 * and cannot drift apart. The key of a field is its C member name.
 *
 * Input from the network is skimmed by a small structural checker before
 * msgpack-c sees it: msgpack-c allocates an array's element table as soon as
 * it reads the count, so a 5-byte "array of 4 billion" would ask for ~100 GB.
 * The skim bounds every count by the bytes that are left (each element takes
 * at least one), limits nesting and finds trailing bytes, so the allocation
 * msgpack-c then makes is at most a small multiple of the input.
 */
#include "ie_proto.h"
#include "ie_kernels.h"

#include <msgpack.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PROTO_MAX_DEPTH 8 /* deepest legal header: request -> messages -> pair */

/* Client request limits (documented in docs/PROTOCOL.md). */
#define CLIENT_ID_MAX 128
#define CLIENT_TEXT_MAX (1u << 20) /* prompt, or all message contents together */
#define CLIENT_MESSAGES_MAX 256
#define CLIENT_ROLE_MAX 64
#define CLIENT_STOP_MAX 16
#define CLIENT_STOP_LEN_MAX 256
#define CLIENT_MAX_NEW_MAX (1 << 20)

/* ------------------------------------------------------------ kind names */

static const char *const k_kind_names[] = {"none",    "hello",     "assign", "ready", "step", "result",
                                           "partial", "heartbeat", "bye",    "error", "lora", "lora_ack"};

const char *ie_msg_kind_name(ie_msg_kind_t k)
{
    if ((int)k < 0 || (size_t)k >= sizeof k_kind_names / sizeof k_kind_names[0]) return "none";
    return k_kind_names[k];
}

/* ------------------------------------------------------------ skim */

static int read_be(const uint8_t *p, size_t n, size_t *off, int width, uint64_t *v)
{
    if ((size_t)width > n - *off) return -1;
    uint64_t x = 0;
    for (int i = 0; i < width; i++) x = (x << 8) | p[*off + (size_t)i];
    *off += (size_t)width;
    *v = x;
    return 0;
}

/* Walk one MessagePack object at p[*off..n) without building anything.
 * 0 ok (then *off is past it), -1 truncated or malformed. */
static int skim(const uint8_t *p, size_t n, size_t *off, int depth)
{
    if (depth > PROTO_MAX_DEPTH || *off >= n) return -1;
    const uint8_t b = p[(*off)++];
    uint64_t len = 0, count = 0;
    int is_map = 0, is_array = 0;

    if (b <= 0x7f || b >= 0xe0) return 0; /* fixint */
    if (b <= 0x8f) {
        count = b & 0x0f;
        is_map = 1;
    } else if (b <= 0x9f) {
        count = b & 0x0f;
        is_array = 1;
    } else if (b <= 0xbf) {
        len = b & 0x1f;
    } else {
        switch (b) {
        case 0xc0:
        case 0xc2:
        case 0xc3: break; /* nil, false, true */
        case 0xc4:
        case 0xd9:
            if (read_be(p, n, off, 1, &len)) return -1;
            break; /* bin8 / str8 */
        case 0xc5:
        case 0xda:
            if (read_be(p, n, off, 2, &len)) return -1;
            break;
        case 0xc6:
        case 0xdb:
            if (read_be(p, n, off, 4, &len)) return -1;
            break;
        case 0xc7:
            if (read_be(p, n, off, 1, &len)) return -1;
            len += 1;
            break; /* ext: + type */
        case 0xc8:
            if (read_be(p, n, off, 2, &len)) return -1;
            len += 1;
            break;
        case 0xc9:
            if (read_be(p, n, off, 4, &len)) return -1;
            len += 1;
            break;
        case 0xca: len = 4; break;
        case 0xcb: len = 8; break;
        case 0xcc:
        case 0xd0: len = 1; break;
        case 0xcd:
        case 0xd1: len = 2; break;
        case 0xce:
        case 0xd2: len = 4; break;
        case 0xcf:
        case 0xd3: len = 8; break;
        case 0xd4: len = 2; break; /* fixext 1..16: type + data */
        case 0xd5: len = 3; break;
        case 0xd6: len = 5; break;
        case 0xd7: len = 9; break;
        case 0xd8: len = 17; break;
        case 0xdc:
            if (read_be(p, n, off, 2, &count)) return -1;
            is_array = 1;
            break;
        case 0xdd:
            if (read_be(p, n, off, 4, &count)) return -1;
            is_array = 1;
            break;
        case 0xde:
            if (read_be(p, n, off, 2, &count)) return -1;
            is_map = 1;
            break;
        case 0xdf:
            if (read_be(p, n, off, 4, &count)) return -1;
            is_map = 1;
            break;
        default: return -1; /* 0xc1: never used */
        }
    }
    if (is_map || is_array) {
        const uint64_t items = is_map ? 2 * count : count;
        if (items > n - *off) return -1; /* every item needs at least one byte */
        for (uint64_t i = 0; i < items; i++)
            if (skim(p, n, off, depth + 1) != 0) return -1;
        return 0;
    }
    if (len > n - *off) return -1;
    *off += (size_t)len;
    return 0;
}

/* Parse exactly one map filling data[0..n) into u (caller destroys u). */
static ie_status_t unpack_map(const void *data, size_t n, msgpack_unpacked *u, const char *what)
{
    size_t off = 0;
    if (!data && n) return ie_error_set(IE_ERR_INVAL, "%s: no data", what);
    if (n == 0) return ie_error_set(IE_ERR_FORMAT, "%s: empty header", what);
    if (skim(data, n, &off, 0) != 0)
        return ie_error_set(IE_ERR_FORMAT, "%s: truncated or malformed MessagePack (%zu bytes)", what, n);
    if (off != n) return ie_error_set(IE_ERR_FORMAT, "%s: %zu trailing bytes after the header", what, n - off);
    off = 0;
    const msgpack_unpack_return r = msgpack_unpack_next(u, data, n, &off);
    if (r == MSGPACK_UNPACK_NOMEM_ERROR) return ie_error_set(IE_ERR_NOMEM, "%s: out of memory decoding", what);
    if (r != MSGPACK_UNPACK_SUCCESS || off != n)
        return ie_error_set(IE_ERR_FORMAT, "%s: malformed MessagePack", what);
    if (u->data.type != MSGPACK_OBJECT_MAP) return ie_error_set(IE_ERR_FORMAT, "%s: header is not a map", what);
    return IE_OK;
}

/* ------------------------------------------------------------ object helpers */

static int key_is(const msgpack_object *k, const char *s)
{
    const size_t n = strlen(s);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && memcmp(k->via.str.ptr, s, n) == 0;
}

/* Integer value of o: 0 ok, -1 not an integer or beyond int64. */
static int obj_i64(const msgpack_object *o, int64_t *v)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)INT64_MAX) return -1;
        *v = (int64_t)o->via.u64;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *v = o->via.i64;
        return 0;
    }
    return -1;
}

/* A number where a float is expected: int or float, finite. */
static int obj_num(const msgpack_object *o, double *v)
{
    int64_t i;
    if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64) *v = o->via.f64;
    else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) *v = (double)o->via.u64;
    else if (obj_i64(o, &i) == 0) *v = (double)i;
    else return -1;
    return isfinite(*v) ? 0 : -1;
}

/* A string without NUL bytes (C strings cannot carry them). */
static int obj_str(const msgpack_object *o)
{
    return o->type == MSGPACK_OBJECT_STR && (o->via.str.size == 0 || !memchr(o->via.str.ptr, 0, o->via.str.size));
}

/* Copy a string object into a fixed buffer: -1 when it does not fit. */
static int str_copy(const msgpack_object *o, char *dst, size_t cap)
{
    if (!obj_str(o) || o->via.str.size >= cap) return -1;
    if (o->via.str.size) memcpy(dst, o->via.str.ptr, o->via.str.size);
    dst[o->via.str.size] = '\0';
    return 0;
}

/* Header version: the first pass over every map. Missing "v" is a format
 * error, another number is another protocol (cluster and client messages
 * are versioned apart: `want`). */
static ie_status_t check_version(const msgpack_object_map *map, const char *what, int want)
{
    const msgpack_object *v = NULL;
    for (uint32_t i = 0; i < map->size; i++) {
        const msgpack_object *k = &map->ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR) return ie_error_set(IE_ERR_FORMAT, "%s: a key is not a string", what);
        if (key_is(k, "v")) {
            if (v) return ie_error_set(IE_ERR_FORMAT, "%s: duplicate key \"v\"", what);
            v = &map->ptr[i].val;
        }
    }
    int64_t ver;
    if (!v) return ie_error_set(IE_ERR_FORMAT, "%s: missing key \"v\"", what);
    if (obj_i64(v, &ver) != 0) return ie_error_set(IE_ERR_FORMAT, "%s: key \"v\" must be an integer", what);
    if (ver != want)
        return ie_error_set(IE_ERR_UNSUPPORTED, "%s: protocol version %lld, this build speaks %d", what,
                            (long long)ver, want);
    return IE_OK;
}

/* ------------------------------------------------------------ packing */

typedef struct pack_ctx {
    ie_buf_t *out;
    int oom;
} pack_ctx_t;

static int pack_write(void *data, const char *buf, size_t len)
{
    pack_ctx_t *c = data;
    if (ie_buf_append(c->out, buf, len) != 0) {
        c->oom = 1;
        return -1;
    }
    return 0;
}

static void pack_key(msgpack_packer *pk, const char *k) { msgpack_pack_str_with_body(pk, k, strlen(k)); }

/* NULL packs as nil. */
static void pack_strn(msgpack_packer *pk, const char *s, size_t n)
{
    if (!s) msgpack_pack_nil(pk);
    else msgpack_pack_str_with_body(pk, s, n);
}

static void pack_cstr(msgpack_packer *pk, const char *s) { pack_strn(pk, s, s ? strlen(s) : 0); }

/* ------------------------------------------------------------ cluster tables */

typedef enum ftype {
    FT_I32,     /* int32_t in [lo, hi]                                  */
    FT_I64,     /* int64_t in [lo, hi]                                  */
    FT_U64,     /* uint64_t, any                                        */
    FT_F64,     /* double, finite, >= 0 (all are durations or rates)     */
    FT_FLAG,    /* int32_t 0/1, encoded as a boolean (an int 0/1 is read) */
    FT_STR,     /* char[size]                                           */
    FT_STR_ARR, /* char[64][size], as many as the int32 at count_off     */
    FT_I32_ARR  /* int32_t[64] in [lo, hi]; its length goes to count_off */
} ftype_t;

typedef struct field {
    const char *key;
    ftype_t type;
    size_t off;  /* offset in the kind's struct                    */
    size_t size; /* FT_STR*: bytes of one string buffer            */
    int required;
    int64_t lo, hi;   /* integer ranges (elements for FT_I32_ARR)       */
    size_t count_off; /* FT_*_ARR: offset of the int32 element count    */
} field_t;

#define REQ 1
#define OPT 0
#define FI(T, m, req, lo, hi)                         \
    {                                                 \
#m, FT_I32, offsetof(T, m), 0, req, lo, hi, 0 \
    }
#define FL(T, m, req, lo, hi)                         \
    {                                                 \
#m, FT_I64, offsetof(T, m), 0, req, lo, hi, 0 \
    }
#define FU(T, m, req)                               \
    {                                               \
#m, FT_U64, offsetof(T, m), 0, req, 0, 0, 0 \
    }
#define FD(T, m, req)                               \
    {                                               \
#m, FT_F64, offsetof(T, m), 0, req, 0, 0, 0 \
    }
#define FB(T, m, req)                                \
    {                                                \
#m, FT_FLAG, offsetof(T, m), 0, req, 0, 1, 0 \
    }
#define FS(T, m, req)                                                 \
    {                                                                 \
#m, FT_STR, offsetof(T, m), sizeof(((T *)0)->m), req, 0, 0, 0 \
    }
#define FSA(T, m, req, cnt)                                                                 \
    {                                                                                       \
#m, FT_STR_ARR, offsetof(T, m), sizeof(((T *)0)->m[0]), req, 0, 0, offsetof(T, cnt) \
    }
/* a string array of at most max entries (FSA: IE_PROTO_MAX_RANKS) */
#define FSAN(T, m, req, cnt, max)                                                             \
    {                                                                                         \
#m, FT_STR_ARR, offsetof(T, m), sizeof(((T *)0)->m[0]), req, 0, max, offsetof(T, cnt) \
    }
#define FIA(T, m, req, lo, hi, cnt)                                      \
    {                                                                    \
#m, FT_I32_ARR, offsetof(T, m), 0, req, lo, hi, offsetof(T, cnt) \
    }

#define RANK_MAX (IE_PROTO_MAX_RANKS - 1)

static const field_t k_hello[] = {
    FI(ie_msg_hello_t, rank, REQ, -1, RANK_MAX),
    FI(ie_msg_hello_t, pid, REQ, 0, INT32_MAX),
    FI(ie_msg_hello_t, numa_node, REQ, -1, INT32_MAX),
    FI(ie_msg_hello_t, n_threads, REQ, 0, INT32_MAX),
    FU(ie_msg_hello_t, model_fp, REQ),
    FU(ie_msg_hello_t, weights_fp, OPT),
    FS(ie_msg_hello_t, host, OPT),
    FS(ie_msg_hello_t, peer_endpoint, REQ),
    FS(ie_msg_hello_t, public_key, OPT),
    FS(ie_msg_hello_t, topology, OPT),
};

static const field_t k_assign[] = {
    FU(ie_msg_assign_t, epoch, REQ),
    FI(ie_msg_assign_t, plan, REQ, 0, INT32_MAX),
    FI(ie_msg_assign_t, rank, REQ, 0, RANK_MAX),
    FI(ie_msg_assign_t, n_ranks, REQ, 1, IE_PROTO_MAX_RANKS),
    FI(ie_msg_assign_t, n_ctx, REQ, 1, INT32_MAX),
    FI(ie_msg_assign_t, n_seq, REQ, 1, INT32_MAX),
    FI(ie_msg_assign_t, max_batch, REQ, 1, INT32_MAX),
    FI(ie_msg_assign_t, kv_block, REQ, 0, INT32_MAX),
    FI(ie_msg_assign_t, kv_blocks, REQ, 0, INT32_MAX),
    FI(ie_msg_assign_t, kv_type_k, OPT, 0, 6),
    FI(ie_msg_assign_t, kv_type_v, OPT, 0, 6),
    FI(ie_msg_assign_t, kv_rotate, OPT, 0, 2),
    FI(ie_msg_assign_t, kv_swa_full, OPT, 0, 1),
    FI(ie_msg_assign_t, precision, REQ, 0, INT32_MAX),
    FI(ie_msg_assign_t, heartbeat_ms, REQ, 1, INT32_MAX),
    FI(ie_msg_assign_t, dead_ms, REQ, 1, INT32_MAX),
    FU(ie_msg_assign_t, cluster_id, OPT),
    FSA(ie_msg_assign_t, peer_endpoint, REQ, n_ranks),
    FSA(ie_msg_assign_t, peer_key, OPT, n_ranks),
};

static const field_t k_ready[] = {
    FU(ie_msg_ready_t, epoch, REQ),
    FI(ie_msg_ready_t, rank, REQ, -1, RANK_MAX), /* -1: failed before it had one */
    FI(ie_msg_ready_t, status, REQ, 0, INT32_MAX),
    FD(ie_msg_ready_t, load_ms, REQ),
    FU(ie_msg_ready_t, weight_bytes, REQ),
    FS(ie_msg_ready_t, error, OPT),
};

static const field_t k_step[] = {
    FU(ie_msg_step_t, epoch, REQ),
    FU(ie_msg_step_t, step, REQ),
    FI(ie_msg_step_t, n, REQ, 0, INT32_MAX),
    FB(ie_msg_step_t, has_hidden, REQ),
    FI(ie_msg_step_t, kv_words, REQ, 0, IE_PROTO_KV_WORDS_MAX),
    FB(ie_msg_step_t, chain, OPT),
    FB(ie_msg_step_t, has_adapter, OPT),
};

static const field_t k_result[] = {
    FU(ie_msg_result_t, epoch, REQ),
    FU(ie_msg_result_t, step, REQ),
    FI(ie_msg_result_t, rank, REQ, -1, RANK_MAX), /* -1: not assigned (an error result) */
    FI(ie_msg_result_t, status, REQ, 0, INT32_MAX),
    FI(ie_msg_result_t, n_rows, REQ, 0, INT32_MAX),
    FL(ie_msg_result_t, vocab_begin, REQ, 0, INT64_MAX),
    FL(ie_msg_result_t, vocab_end, REQ, 0, INT64_MAX),
    FD(ie_msg_result_t, compute_ms, REQ),
    FD(ie_msg_result_t, transfer_ms, REQ),
    FS(ie_msg_result_t, error, OPT),
};

static const field_t k_partial[] = {
    FU(ie_msg_partial_t, epoch, REQ),
    FU(ie_msg_partial_t, step, REQ),
    FI(ie_msg_partial_t, from_rank, REQ, 0, RANK_MAX),
    FI(ie_msg_partial_t, index, REQ, 0, INT32_MAX),
    FL(ie_msg_partial_t, count, REQ, 0, INT64_MAX),
};

static const field_t k_heartbeat[] = {
    FU(ie_msg_heartbeat_t, epoch, REQ),
    FI(ie_msg_heartbeat_t, rank, REQ, -1, RANK_MAX),
    FB(ie_msg_heartbeat_t, busy, REQ),
};

static const field_t k_error[] = {
    FI(ie_msg_error_t, code, REQ, 0, INT32_MAX),
    FS(ie_msg_error_t, message, OPT),
};

static const field_t k_lora[] = {
    FU(ie_msg_lora_t, seq, REQ),
    FI(ie_msg_lora_t, op, REQ, IE_LORA_OP_ADD, IE_LORA_OP_KEEP),
    FI(ie_msg_lora_t, id, REQ, 0, IE_PROTO_LORA_IDS - 1),
    FL(ie_msg_lora_t, keep, OPT, 0, (1ll << IE_PROTO_LORA_IDS) - 1),
    FI(ie_msg_lora_t, n_name, OPT, 0, IE_PROTO_LORA_PARTS),
    FI(ie_msg_lora_t, n_path, OPT, 0, IE_PROTO_LORA_PARTS),
    FSAN(ie_msg_lora_t, name, OPT, n_name, IE_PROTO_LORA_PARTS),
    FSAN(ie_msg_lora_t, path, OPT, n_path, IE_PROTO_LORA_PARTS),
};

static const field_t k_lora_ack[] = {
    FU(ie_msg_lora_ack_t, seq, REQ),
    FI(ie_msg_lora_ack_t, rank, REQ, -1, RANK_MAX),
    FI(ie_msg_lora_ack_t, id, REQ, 0, IE_PROTO_LORA_IDS - 1),
    FI(ie_msg_lora_ack_t, status, REQ, 0, INT32_MAX),
    FS(ie_msg_lora_ack_t, error, OPT),
};

typedef struct kind_desc {
    const field_t *fields;
    int n_fields;
} kind_desc_t;
/* ie_msg_decode keeps one bit and one array length per field */
_Static_assert(sizeof k_assign / sizeof k_assign[0] <= 32, "ASSIGN: more fields than ie_msg_decode tracks");

#define KD(t)                            \
    {                                    \
        t, (int)(sizeof t / sizeof t[0]) \
    }
static const kind_desc_t k_kinds[] = {
    [IE_MSG_HELLO] = KD(k_hello),         [IE_MSG_ASSIGN] = KD(k_assign),     [IE_MSG_READY] = KD(k_ready),
    [IE_MSG_STEP] = KD(k_step),           [IE_MSG_RESULT] = KD(k_result),     [IE_MSG_PARTIAL] = KD(k_partial),
    [IE_MSG_HEARTBEAT] = KD(k_heartbeat), [IE_MSG_BYE] = {NULL, 0},           [IE_MSG_ERROR] = KD(k_error),
    [IE_MSG_LORA] = KD(k_lora),           [IE_MSG_LORA_ACK] = KD(k_lora_ack),
};

static const kind_desc_t *kind_desc(int64_t kind)
{
    if (kind <= IE_MSG_NONE || kind > IE_MSG_LORA_ACK) return NULL;
    return &k_kinds[kind];
}

/* Cross-field rules a table row cannot say. */
static ie_status_t check_msg(const ie_msg_t *m, ie_status_t st, const char *what)
{
    switch (m->kind) {
    case IE_MSG_ASSIGN:
        if (m->u.assign.rank >= m->u.assign.n_ranks)
            return ie_error_set(st, "%s: assign: \"rank\" %d is not below \"n_ranks\" %d", what,
                                (int)m->u.assign.rank, (int)m->u.assign.n_ranks);
        break;
    case IE_MSG_RESULT:
        if (m->u.result.vocab_end < m->u.result.vocab_begin)
            return ie_error_set(st, "%s: result: \"vocab_end\" is below \"vocab_begin\"", what);
        break;
    case IE_MSG_LORA:
        if (m->u.lora.n_name != m->u.lora.n_path || (m->u.lora.op == IE_LORA_OP_ADD && m->u.lora.n_name < 1))
            return ie_error_set(st, "%s: lora: %d names and %d paths (an add needs 1..%d of each)", what,
                                (int)m->u.lora.n_name, (int)m->u.lora.n_path, IE_PROTO_LORA_PARTS);
        break;
    default: break;
    }
    return IE_OK;
}

/* ------------------------------------------------------------ cluster encode */

static ie_status_t enc_field(msgpack_packer *pk, const field_t *f, const uint8_t *base, const char *kname)
{
    const void *p = base + f->off;
    int64_t v;
    int32_t i32;
    switch (f->type) {
    case FT_I32:
    case FT_FLAG:
        memcpy(&i32, p, 4);
        if (i32 < f->lo || i32 > f->hi)
            return ie_error_set(IE_ERR_INVAL, "encode %s: \"%s\" = %d is outside %lld..%lld", kname, f->key,
                                (int)i32, (long long)f->lo, (long long)f->hi);
        pack_key(pk, f->key);
        if (f->type == FT_FLAG) {
            if (i32) msgpack_pack_true(pk);
            else msgpack_pack_false(pk);
        } else {
            msgpack_pack_int32(pk, i32);
        }
        break;
    case FT_I64:
        memcpy(&v, p, 8);
        if (v < f->lo || v > f->hi)
            return ie_error_set(IE_ERR_INVAL, "encode %s: \"%s\" = %lld is out of range", kname, f->key,
                                (long long)v);
        pack_key(pk, f->key);
        msgpack_pack_int64(pk, v);
        break;
    case FT_U64: {
        uint64_t u;
        memcpy(&u, p, 8);
        pack_key(pk, f->key);
        msgpack_pack_uint64(pk, u);
        break;
    }
    case FT_F64: {
        double d;
        memcpy(&d, p, 8);
        if (!isfinite(d) || d < 0)
            return ie_error_set(IE_ERR_INVAL, "encode %s: \"%s\" must be finite and >= 0", kname, f->key);
        pack_key(pk, f->key);
        msgpack_pack_double(pk, d);
        break;
    }
    case FT_STR: {
        const char *s = p;
        const size_t n = strnlen(s, f->size);
        if (n == f->size) return ie_error_set(IE_ERR_INVAL, "encode %s: \"%s\" is not terminated", kname, f->key);
        pack_key(pk, f->key);
        msgpack_pack_str_with_body(pk, s, n);
        break;
    }
    case FT_STR_ARR:
    case FT_I32_ARR: {
        int32_t cnt;
        memcpy(&cnt, base + f->count_off, 4);
        const int64_t amax = f->type == FT_STR_ARR && f->hi > 0 ? f->hi : IE_PROTO_MAX_RANKS;
        if (cnt < 0 || cnt > amax)
            return ie_error_set(IE_ERR_INVAL, "encode %s: \"%s\" has %d entries (0..%lld)", kname, f->key, (int)cnt,
                                (long long)amax);
        pack_key(pk, f->key);
        msgpack_pack_array(pk, (size_t)cnt);
        for (int32_t i = 0; i < cnt; i++) {
            if (f->type == FT_STR_ARR) {
                const char *s = (const char *)p + (size_t)i * f->size;
                const size_t n = strnlen(s, f->size);
                if (n == f->size)
                    return ie_error_set(IE_ERR_INVAL, "encode %s: \"%s\"[%d] is not terminated", kname, f->key,
                                        (int)i);
                msgpack_pack_str_with_body(pk, s, n);
            } else {
                memcpy(&i32, (const uint8_t *)p + 4 * (size_t)i, 4);
                if (i32 < f->lo || i32 > f->hi)
                    return ie_error_set(IE_ERR_INVAL, "encode %s: \"%s\"[%d] = %d is out of range", kname, f->key,
                                        (int)i, (int)i32);
                msgpack_pack_int32(pk, i32);
            }
        }
        break;
    }
    }
    return IE_OK;
}

ie_status_t ie_msg_encode(const ie_msg_t *m, ie_buf_t *out)
{
    ie_status_t st = IE_OK;
    msgpack_packer pk;
    pack_ctx_t ctx = {out, 0};
    const kind_desc_t *kd;

    if (!m || !out) return ie_error_set(IE_ERR_INVAL, "ie_msg_encode: NULL argument");
    if (!(kd = kind_desc(m->kind)))
        return ie_error_set(IE_ERR_INVAL, "ie_msg_encode: no encoder for kind %d", (int)m->kind);
    st = check_msg(m, IE_ERR_INVAL, "encode");
    if (st != IE_OK) goto cleanup;

    ie_buf_reset(out);
    msgpack_packer_init(&pk, &ctx, pack_write);
    msgpack_pack_map(&pk, 2 + (size_t)kd->n_fields);
    pack_key(&pk, "v");
    msgpack_pack_int(&pk, IE_PROTO_VERSION);
    pack_key(&pk, "kind");
    msgpack_pack_int(&pk, (int)m->kind);
    for (int i = 0; i < kd->n_fields; i++) {
        st = enc_field(&pk, &kd->fields[i], (const uint8_t *)&m->u, ie_msg_kind_name(m->kind));
        if (st != IE_OK) goto cleanup;
    }
    if (ctx.oom) st = ie_error_set(IE_ERR_NOMEM, "ie_msg_encode: out of memory");

cleanup:
    if (st != IE_OK) ie_buf_reset(out);
    return st;
}

/* ------------------------------------------------------------ cluster decode */

static ie_status_t dec_field(const field_t *f, const msgpack_object *o, uint8_t *base, const char *kname,
                             int32_t *arr_len)
{
    void *p = base + f->off;
    int64_t v;
    switch (f->type) {
    case FT_I32:
    case FT_I64:
        if (obj_i64(o, &v) != 0 || v < f->lo || v > f->hi)
            return ie_error_set(IE_ERR_FORMAT, "decode %s: key \"%s\" must be an integer in %lld..%lld", kname,
                                f->key, (long long)f->lo, (long long)f->hi);
        if (f->type == FT_I32) {
            const int32_t i32 = (int32_t)v;
            memcpy(p, &i32, 4);
        } else {
            memcpy(p, &v, 8);
        }
        return IE_OK;
    case FT_FLAG: {
        int32_t b;
        if (o->type == MSGPACK_OBJECT_BOOLEAN) b = o->via.boolean ? 1 : 0;
        else if (obj_i64(o, &v) == 0 && (v == 0 || v == 1)) b = (int32_t)v;
        else return ie_error_set(IE_ERR_FORMAT, "decode %s: key \"%s\" must be a boolean", kname, f->key);
        memcpy(p, &b, 4);
        return IE_OK;
    }
    case FT_U64:
        if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
            return ie_error_set(IE_ERR_FORMAT, "decode %s: key \"%s\" must be an unsigned integer", kname, f->key);
        memcpy(p, &o->via.u64, 8);
        return IE_OK;
    case FT_F64: {
        double d;
        if (obj_num(o, &d) != 0 || d < 0)
            return ie_error_set(IE_ERR_FORMAT, "decode %s: key \"%s\" must be a finite number >= 0", kname, f->key);
        memcpy(p, &d, 8);
        return IE_OK;
    }
    case FT_STR:
        if (str_copy(o, p, f->size) != 0)
            return ie_error_set(IE_ERR_FORMAT, "decode %s: key \"%s\" must be a string of at most %zu bytes", kname,
                                f->key, f->size - 1);
        return IE_OK;
    case FT_STR_ARR:
    case FT_I32_ARR: {
        /* a string array's own limit (FSAN) is in hi: the buffer's entries */
        const int64_t amax = f->type == FT_STR_ARR && f->hi > 0 ? f->hi : IE_PROTO_MAX_RANKS;
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > amax)
            return ie_error_set(IE_ERR_FORMAT, "decode %s: key \"%s\" must be an array of at most %lld entries",
                                kname, f->key, (long long)amax);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            const msgpack_object *e = &o->via.array.ptr[i];
            if (f->type == FT_STR_ARR) {
                if (str_copy(e, (char *)p + (size_t)i * f->size, f->size) != 0)
                    return ie_error_set(IE_ERR_FORMAT,
                                        "decode %s: key \"%s\"[%u] must be a string of at most %zu bytes", kname,
                                        f->key, i, f->size - 1);
            } else {
                if (obj_i64(e, &v) != 0 || v < f->lo || v > f->hi)
                    return ie_error_set(IE_ERR_FORMAT, "decode %s: key \"%s\"[%u] must be an integer in %lld..%lld",
                                        kname, f->key, i, (long long)f->lo, (long long)f->hi);
                const int32_t i32 = (int32_t)v;
                memcpy((uint8_t *)p + 4 * (size_t)i, &i32, 4);
            }
        }
        *arr_len = (int32_t)o->via.array.size;
        return IE_OK;
    }
    }
    return ie_error_set(IE_ERR_INTERNAL, "decode %s: bad field table", kname);
}

ie_status_t ie_msg_decode(const void *data, size_t n, ie_msg_t *m)
{
    ie_status_t st = IE_OK;
    msgpack_unpacked u;
    const kind_desc_t *kd = NULL;
    const char *kname = "header";
    int32_t arr_len[32]; /* per field of a kind: at most 32 (`seen` is a 32-bit mask) */
    uint32_t seen = 0;

    msgpack_unpacked_init(&u);
    if (!m) return ie_error_set(IE_ERR_INVAL, "ie_msg_decode: NULL message");
    memset(m, 0, sizeof *m);
    st = unpack_map(data, n, &u, "decode");
    if (st != IE_OK) goto cleanup;
    const msgpack_object_map *map = &u.data.via.map;
    st = check_version(map, "decode", IE_PROTO_VERSION);
    if (st != IE_OK) goto cleanup;

    /* The kind says which table reads the other keys, wherever it sits. */
    const msgpack_object *ko = NULL;
    for (uint32_t i = 0; i < map->size; i++) {
        if (!key_is(&map->ptr[i].key, "kind")) continue;
        if (ko) {
            st = ie_error_set(IE_ERR_FORMAT, "decode: duplicate key \"kind\"");
            goto cleanup;
        }
        ko = &map->ptr[i].val;
    }
    int64_t kind;
    if (!ko) {
        st = ie_error_set(IE_ERR_FORMAT, "decode: missing key \"kind\"");
        goto cleanup;
    }
    if (obj_i64(ko, &kind) != 0 || !(kd = kind_desc(kind))) {
        st = ie_error_set(IE_ERR_FORMAT, "decode: key \"kind\" must be an integer in %d..%d", IE_MSG_HELLO,
                          IE_MSG_LORA_ACK);
        goto cleanup;
    }
    m->kind = (ie_msg_kind_t)kind;
    kname = ie_msg_kind_name(m->kind);

    for (uint32_t i = 0; i < map->size; i++) {
        const msgpack_object *k = &map->ptr[i].key;
        for (int j = 0; j < kd->n_fields; j++) {
            if (!key_is(k, kd->fields[j].key)) continue;
            if (seen & (1u << j)) {
                st = ie_error_set(IE_ERR_FORMAT, "decode %s: duplicate key \"%s\"", kname, kd->fields[j].key);
                goto cleanup;
            }
            seen |= 1u << j;
            st = dec_field(&kd->fields[j], &map->ptr[i].val, (uint8_t *)&m->u, kname, &arr_len[j]);
            if (st != IE_OK) goto cleanup;
            break;
        }
        /* any other key: from a newer minor revision, ignored */
    }
    for (int j = 0; j < kd->n_fields; j++) {
        const field_t *f = &kd->fields[j];
        if (!(seen & (1u << j))) {
            if (f->required) {
                st = ie_error_set(IE_ERR_FORMAT, "decode %s: missing key \"%s\"", kname, f->key);
                goto cleanup;
            }
            continue;
        }
        int32_t *cnt = (int32_t *)((uint8_t *)&m->u + f->count_off);
        if (f->type == FT_I32_ARR) {
            *cnt = arr_len[j];
        } else if (f->type == FT_STR_ARR && arr_len[j] != *cnt) {
            st = ie_error_set(IE_ERR_FORMAT, "decode %s: key \"%s\" has %d entries, expected %d", kname, f->key,
                              (int)arr_len[j], (int)*cnt);
            goto cleanup;
        }
    }
    st = check_msg(m, IE_ERR_FORMAT, "decode");

cleanup:
    msgpack_unpacked_destroy(&u);
    if (st != IE_OK) memset(m, 0, sizeof *m);
    return st;
}

/* ------------------------------------------------------------ KV operations */

ie_status_t ie_kv_ops_append(ie_buf_t *frame, const ie_kv_op_t *op)
{
    int32_t w[4];
    size_t nw = 0;
    if (!frame || !op) return ie_error_set(IE_ERR_INVAL, "ie_kv_ops_append: NULL argument");
    if (op->seq < 0) return ie_error_set(IE_ERR_INVAL, "kv op: slot %d", (int)op->seq);
    switch (op->kind) {
    case IE_KV_OP_CLEAR:
        w[nw++] = IE_KV_OP_CLEAR;
        w[nw++] = op->seq;
        break;
    case IE_KV_OP_SET_LEN:
        if (op->n < 0) return ie_error_set(IE_ERR_INVAL, "kv op: set length %d", (int)op->n);
        w[nw++] = IE_KV_OP_SET_LEN;
        w[nw++] = op->seq;
        w[nw++] = op->n;
        break;
    case IE_KV_OP_BIND:
        if (op->first < 0 || op->n < 0 || (op->n > 0 && !op->pb))
            return ie_error_set(IE_ERR_INVAL, "kv op: bind of %d blocks at %d", (int)op->n, (int)op->first);
        for (int32_t i = 0; i < op->n; i++)
            if (op->pb[i] < -1) return ie_error_set(IE_ERR_INVAL, "kv op: physical block %d", (int)op->pb[i]);
        w[nw++] = IE_KV_OP_BIND;
        w[nw++] = op->seq;
        w[nw++] = op->first;
        w[nw++] = op->n;
        break;
    default: return ie_error_set(IE_ERR_INVAL, "kv op: kind %d", (int)op->kind);
    }
    const size_t len = frame->len;
    if (ie_buf_append(frame, w, nw * 4) != 0 ||
        (op->kind == IE_KV_OP_BIND && op->n > 0 && ie_buf_append(frame, op->pb, (size_t)op->n * 4) != 0)) {
        frame->len = len;
        return ie_error_set(IE_ERR_NOMEM, "kv op: out of memory");
    }
    return IE_OK;
}

ie_status_t ie_kv_ops_check(const void *frame, size_t bytes, int *n_ops)
{
    int32_t w;
    size_t ids = 0;
    int ops = 0;
    if (n_ops) *n_ops = 0;
    if (bytes % 4 != 0 || bytes / 4 > IE_PROTO_KV_WORDS_MAX)
        return ie_error_set(IE_ERR_FORMAT, "kv ops: a frame of %zu bytes (whole int32 words, at most %d)", bytes,
                            IE_PROTO_KV_WORDS_MAX);
    if (bytes && !frame) return ie_error_set(IE_ERR_INVAL, "kv ops: no data");
    const size_t n = bytes / 4;
    const uint8_t *p = frame;
#define WORD(i) (memcpy(&w, p + 4 * (i), 4), w)
    for (size_t at = 0; at < n; ops++) {
        const int32_t kind = WORD(at);
        const size_t need = kind == IE_KV_OP_CLEAR     ? 2
                            : kind == IE_KV_OP_SET_LEN ? 3
                            : kind == IE_KV_OP_BIND    ? 4
                                                       : 0;
        if (!need) return ie_error_set(IE_ERR_FORMAT, "kv ops: word %zu: unknown operation %d", at, (int)kind);
        if (n - at < need)
            return ie_error_set(IE_ERR_FORMAT, "kv ops: word %zu: operation %d cut short", at, (int)kind);
        if (WORD(at + 1) < 0) return ie_error_set(IE_ERR_FORMAT, "kv ops: word %zu: slot %d", at + 1, (int)w);
        if (kind == IE_KV_OP_SET_LEN && WORD(at + 2) < 0)
            return ie_error_set(IE_ERR_FORMAT, "kv ops: word %zu: length %d", at + 2, (int)w);
        if (kind == IE_KV_OP_BIND) {
            if (WORD(at + 2) < 0)
                return ie_error_set(IE_ERR_FORMAT, "kv ops: word %zu: first block %d", at + 2, (int)w);
            const int32_t cnt = WORD(at + 3);
            if (cnt < 0 || (size_t)cnt > n - at - 4)
                return ie_error_set(IE_ERR_FORMAT, "kv ops: word %zu: %d blocks (%zu words left)", at + 3, (int)cnt,
                                    n - at - 4);
            ids += (size_t)cnt;
            if (ids > IE_PROTO_KV_IDS_MAX)
                return ie_error_set(IE_ERR_FORMAT, "kv ops: more than %d block ids", IE_PROTO_KV_IDS_MAX);
            for (size_t i = 0; i < (size_t)cnt; i++)
                if (WORD(at + 4 + i) < -1)
                    return ie_error_set(IE_ERR_FORMAT, "kv ops: word %zu: physical block %d", at + 4 + i, (int)w);
            at += (size_t)cnt;
        }
        at += need;
    }
#undef WORD
    if (n_ops) *n_ops = ops;
    return IE_OK;
}

int ie_kv_ops_next(const int32_t *words, size_t n_words, size_t *off, ie_kv_op_t *op)
{
    if (*off >= n_words) return 0;
    const int32_t *w = words + *off;
    memset(op, 0, sizeof *op);
    op->kind = (ie_kv_op_kind_t)w[0];
    op->seq = w[1];
    switch (op->kind) {
    case IE_KV_OP_CLEAR: *off += 2; break;
    case IE_KV_OP_SET_LEN:
        op->n = w[2];
        *off += 3;
        break;
    case IE_KV_OP_BIND:
        op->first = w[2];
        op->n = w[3];
        op->pb = w + 4;
        *off += 4 + (size_t)op->n;
        break;
    default: *off = n_words; return 0; /* not a validated frame */
    }
    return 1;
}

/* ------------------------------------------------------------ client requests */

void ie_client_req_clear(ie_client_req_t *r)
{
    if (!r) return;
    free(r->type);
    free(r->id);
    free(r->prompt);
    for (size_t i = 0; i < r->n_messages; i++) {
        free(r->messages[i].role);
        free(r->messages[i].content);
    }
    free(r->messages);
    for (size_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->json_schema);
    free(r->bias);
    free(r->stop_ids);
    for (size_t i = 0; i < r->n_choice; i++) free(r->choice[i]);
    free(r->choice);
    free(r->adapter);
    for (size_t i = 0; i < r->n_lora; i++) free(r->lora[i].name);
    free(r->lora);
    free(r->lora_name);
    free(r->lora_path);
    memset(r, 0, sizeof *r);
}

static void req_defaults(ie_client_req_t *r)
{
    memset(r, 0, sizeof *r);
    r->max_new = 128;
    r->temperature = 0.8f;
    r->top_k = 40;
    r->top_p = 0.95f;
    r->min_p = 0.05f;
    r->repeat_penalty = 1.0f;
    r->seed = -1;
    r->stream = 0;
    r->priority = 0;
    r->logprobs = -1;
}

/* Duplicate a string object of lo..hi bytes into *dst (malloc'd). */
static ie_status_t req_str(const msgpack_object *o, const char *key, size_t lo, size_t hi, char **dst)
{
    if (!obj_str(o) || o->via.str.size < lo || o->via.str.size > hi)
        return ie_error_set(IE_ERR_FORMAT, "request: \"%s\" must be a string of %zu..%zu bytes without NUL", key,
                            lo, hi);
    char *s = malloc(o->via.str.size + 1);
    if (!s) return ie_error_set(IE_ERR_NOMEM, "request: out of memory");
    if (o->via.str.size) memcpy(s, o->via.str.ptr, o->via.str.size);
    s[o->via.str.size] = '\0';
    *dst = s;
    return IE_OK;
}

static ie_status_t req_int(const msgpack_object *o, const char *key, int64_t lo, int64_t hi, int64_t *v)
{
    if (obj_i64(o, v) != 0 || *v < lo || *v > hi)
        return ie_error_set(IE_ERR_FORMAT, "request: \"%s\" must be an integer in %lld..%lld", key, (long long)lo,
                            (long long)hi);
    return IE_OK;
}

/* lo_open: the value must be above lo rather than at least lo. The range
 * is checked on the float the value becomes (1e-60 > 0, but not as a float). */
static ie_status_t req_num(const msgpack_object *o, const char *key, double lo, int lo_open, double hi, float *v)
{
    double d = 0;
    if (obj_num(o, &d) != 0 || d < lo || d > hi || (lo_open && (float)d <= lo))
        return ie_error_set(IE_ERR_FORMAT, "request: \"%s\" must be a number in %s%g..%g", key, lo_open ? "(" : "",
                            lo, hi);
    *v = (float)d;
    return IE_OK;
}

static ie_status_t req_messages(const msgpack_object *o, ie_client_req_t *r)
{
    size_t total = 0;
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 1 || o->via.array.size > CLIENT_MESSAGES_MAX)
        return ie_error_set(IE_ERR_FORMAT, "request: \"messages\" must be an array of 1..%d maps",
                            CLIENT_MESSAGES_MAX);
    r->messages = calloc(o->via.array.size, sizeof *r->messages);
    if (!r->messages) return ie_error_set(IE_ERR_NOMEM, "request: out of memory");
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object *e = &o->via.array.ptr[i];
        const msgpack_object *role = NULL, *content = NULL;
        ie_client_chat_t *c = &r->messages[i];
        r->n_messages = i + 1; /* what clear must free, even half-filled */
        if (e->type != MSGPACK_OBJECT_MAP)
            return ie_error_set(IE_ERR_FORMAT, "request: \"messages\"[%u] must be a map", i);
        for (uint32_t j = 0; j < e->via.map.size; j++) {
            const msgpack_object *k = &e->via.map.ptr[j].key;
            const msgpack_object **slot = key_is(k, "role") ? &role : key_is(k, "content") ? &content : NULL;
            if (k->type != MSGPACK_OBJECT_STR)
                return ie_error_set(IE_ERR_FORMAT, "request: \"messages\"[%u] has a key that is not a string", i);
            if (!slot) continue;
            if (*slot) return ie_error_set(IE_ERR_FORMAT, "request: \"messages\"[%u] has a duplicate key", i);
            *slot = &e->via.map.ptr[j].val;
        }
        if (!role || !content)
            return ie_error_set(IE_ERR_FORMAT, "request: \"messages\"[%u] needs \"role\" and \"content\"", i);
        ie_status_t st = req_str(role, "role", 1, CLIENT_ROLE_MAX, &c->role);
        if (st == IE_OK) st = req_str(content, "content", 0, CLIENT_TEXT_MAX, &c->content);
        if (st != IE_OK) return st;
        total += content->via.str.size;
        if (total > CLIENT_TEXT_MAX)
            return ie_error_set(IE_ERR_FORMAT, "request: the messages hold more than %u bytes", CLIENT_TEXT_MAX);
    }
    return IE_OK;
}

static ie_status_t req_stop(const msgpack_object *o, ie_client_req_t *r)
{
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > CLIENT_STOP_MAX)
        return ie_error_set(IE_ERR_FORMAT, "request: \"stop\" must be an array of at most %d strings",
                            CLIENT_STOP_MAX);
    if (o->via.array.size == 0) return IE_OK;
    r->stop = calloc(o->via.array.size, sizeof *r->stop);
    if (!r->stop) return ie_error_set(IE_ERR_NOMEM, "request: out of memory");
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        r->n_stop = i + 1;
        ie_status_t st = req_str(&o->via.array.ptr[i], "stop", 1, CLIENT_STOP_LEN_MAX, &r->stop[i]);
        if (st != IE_OK) return st;
    }
    return IE_OK;
}

/* "lora": an array of at most IE_CLIENT_LORA_MAX maps {"name": str | "id":
 * int >= 0, "scale": number (default 1)}. */
static ie_status_t req_lora(const msgpack_object *o, ie_client_req_t *r)
{
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > IE_CLIENT_LORA_MAX)
        return ie_error_set(IE_ERR_FORMAT, "request: \"lora\" must be an array of at most %d maps",
                            IE_CLIENT_LORA_MAX);
    if (o->via.array.size == 0) return IE_OK;
    if (!(r->lora = calloc(o->via.array.size, sizeof *r->lora)))
        return ie_error_set(IE_ERR_NOMEM, "request: out of memory");
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object *e = &o->via.array.ptr[i], *name = NULL, *id = NULL, *scale = NULL;
        ie_client_lora_t *l = &r->lora[i];
        ie_status_t st = IE_OK;
        int64_t v = 0;
        r->n_lora = i + 1; /* what clear must free, even half-filled */
        l->id = -1;
        l->scale = 1.0f;
        if (e->type != MSGPACK_OBJECT_MAP)
            return ie_error_set(IE_ERR_FORMAT, "request: \"lora\"[%u] must be a map", i);
        for (uint32_t j = 0; j < e->via.map.size; j++) {
            const msgpack_object *k = &e->via.map.ptr[j].key;
            const msgpack_object **slot = key_is(k, "name")    ? &name
                                          : key_is(k, "id")    ? &id
                                          : key_is(k, "scale") ? &scale
                                                               : NULL;
            if (!slot) continue;
            if (*slot) return ie_error_set(IE_ERR_FORMAT, "request: \"lora\"[%u] has a duplicate key", i);
            *slot = &e->via.map.ptr[j].val;
        }
        if (!name == !id)
            return ie_error_set(IE_ERR_FORMAT, "request: \"lora\"[%u] needs one of \"name\" and \"id\"", i);
        if (name) st = req_str(name, "lora name", 1, 63, &l->name);
        else if ((st = req_int(id, "lora id", 0, 255, &v)) == IE_OK) l->id = (int32_t)v;
        if (st == IE_OK && scale) st = req_num(scale, "lora scale", -1e6, 0, 1e6, &l->scale);
        if (st != IE_OK) return st;
    }
    return IE_OK;
}

/* "logit_bias": a map of at most IE_CLIENT_BIAS_MAX token ids (integers
 * >= 0, or strings of digits as a JSON-minded client sends them) to
 * numbers in [-100, 100]. The ids are checked against the vocabulary by
 * the server. */
static ie_status_t req_bias(const msgpack_object *o, ie_client_req_t *r)
{
    if (o->type != MSGPACK_OBJECT_MAP || o->via.map.size > IE_CLIENT_BIAS_MAX)
        return ie_error_set(IE_ERR_FORMAT, "request: \"logit_bias\" must be a map of at most %d token ids",
                            IE_CLIENT_BIAS_MAX);
    if (o->via.map.size == 0) return IE_OK;
    if (!(r->bias = calloc(o->via.map.size, sizeof *r->bias)))
        return ie_error_set(IE_ERR_NOMEM, "request: out of memory");
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        int64_t id = -1;
        if (obj_str(k) && k->via.str.size >= 1 && k->via.str.size <= 10) {
            id = 0;
            for (uint32_t j = 0; j < k->via.str.size && id >= 0; j++)
                id = k->via.str.ptr[j] >= '0' && k->via.str.ptr[j] <= '9' ? id * 10 + (k->via.str.ptr[j] - '0')
                                                                          : -1;
        } else if (obj_i64(k, &id) != 0) {
            id = -1;
        }
        if (id < 0 || id > INT32_MAX)
            return ie_error_set(IE_ERR_FORMAT, "request: \"logit_bias\" keys must be token ids (integers >= 0)");
        r->bias[i].id = (int32_t)id;
        ie_status_t st = req_num(&o->via.map.ptr[i].val, "logit_bias value", -100, 0, 100, &r->bias[i].bias);
        if (st != IE_OK) return st;
        r->n_bias = i + 1;
    }
    return IE_OK;
}

/* "stop_token_ids": at most IE_CLIENT_STOP_IDS_MAX integers >= 0 (the
 * server checks them against the vocabulary). */
static ie_status_t req_stop_ids(const msgpack_object *o, ie_client_req_t *r)
{
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > IE_CLIENT_STOP_IDS_MAX)
        return ie_error_set(IE_ERR_FORMAT, "request: \"stop_token_ids\" must be an array of at most %d token ids",
                            IE_CLIENT_STOP_IDS_MAX);
    if (o->via.array.size == 0) return IE_OK;
    if (!(r->stop_ids = calloc(o->via.array.size, sizeof *r->stop_ids)))
        return ie_error_set(IE_ERR_NOMEM, "request: out of memory");
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        int64_t v = 0;
        ie_status_t st = req_int(&o->via.array.ptr[i], "stop_token_ids entry", 0, INT32_MAX, &v);
        if (st != IE_OK) return st;
        r->stop_ids[r->n_stop_ids++] = (int32_t)v;
    }
    return IE_OK;
}

/* "guided_choice": 1..IE_CLIENT_CHOICE_MAX non-empty strings. */
static ie_status_t req_choice(const msgpack_object *o, ie_client_req_t *r)
{
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 1 || o->via.array.size > IE_CLIENT_CHOICE_MAX)
        return ie_error_set(IE_ERR_FORMAT, "request: \"guided_choice\" must be an array of 1..%d strings",
                            IE_CLIENT_CHOICE_MAX);
    if (!(r->choice = calloc(o->via.array.size, sizeof *r->choice)))
        return ie_error_set(IE_ERR_NOMEM, "request: out of memory");
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        ie_status_t st = req_str(&o->via.array.ptr[i], "guided_choice entry", 1, CLIENT_STOP_LEN_MAX,
                                 &r->choice[i]);
        if (st != IE_OK) return st;
        r->n_choice = i + 1;
    }
    return IE_OK;
}

/* One key of a request. Unknown keys are ignored; nil on an optional key
 * reads as "not given" (what JSON-minded clients send for None). */
static ie_status_t req_key(const msgpack_object *k, const msgpack_object *o, ie_client_req_t *r, uint32_t *seen)
{
    static const char *const keys[] = {"type",
                                       "id",
                                       "prompt",
                                       "messages",
                                       "max_new",
                                       "temperature",
                                       "top_k",
                                       "top_p",
                                       "min_p",
                                       "repeat_penalty",
                                       "seed",
                                       "stop",
                                       "stream",
                                       "priority",
                                       "logprobs",
                                       "json_schema",
                                       "adapter",
                                       "lora",
                                       "lora_name",
                                       "lora_path",
                                       "pinned",
                                       "min_new",
                                       "ignore_eos",
                                       "logit_bias",
                                       "frequency_penalty",
                                       "presence_penalty",
                                       "stop_token_ids",
                                       "guided_choice",
                                       "include_stop_str_in_output",
                                       "skip_special_tokens"};
    int idx = -1;
    int64_t v = 0;
    for (int i = 0; i < (int)(sizeof keys / sizeof keys[0]); i++)
        if (key_is(k, keys[i])) idx = i;
    if (idx < 0) return IE_OK;
    if (*seen & (1u << idx)) return ie_error_set(IE_ERR_FORMAT, "request: duplicate key \"%s\"", keys[idx]);
    *seen |= 1u << idx;
    if (o->type == MSGPACK_OBJECT_NIL && idx >= 2) {
        *seen &= ~(1u << idx);
        return IE_OK;
    }
    ie_status_t st = IE_OK;
    switch (idx) {
    case 0:
        st = req_str(o, "type", 1, 16, &r->type);
        if (st == IE_OK && strcmp(r->type, "generate") != 0 && strcmp(r->type, "cancel") != 0 &&
            strcmp(r->type, "load_lora") != 0 && strcmp(r->type, "unload_lora") != 0)
            st = ie_error_set(IE_ERR_FORMAT, "request: \"type\" must be \"generate\", \"cancel\", \"load_lora\" "
                                             "or \"unload_lora\"");
        break;
    case 1: st = req_str(o, "id", 1, CLIENT_ID_MAX, &r->id); break;
    case 2: st = req_str(o, "prompt", 0, CLIENT_TEXT_MAX, &r->prompt); break;
    case 3: st = req_messages(o, r); break;
    case 4:
        if ((st = req_int(o, "max_new", 1, CLIENT_MAX_NEW_MAX, &v)) == IE_OK) r->max_new = (int32_t)v;
        break;
    case 5: st = req_num(o, "temperature", 0, 0, 100, &r->temperature); break;
    case 6:
        if ((st = req_int(o, "top_k", 0, INT32_MAX, &v)) == IE_OK) r->top_k = (int32_t)v;
        break;
    case 7: st = req_num(o, "top_p", 0, 0, 1, &r->top_p); break;
    case 8: st = req_num(o, "min_p", 0, 0, 1, &r->min_p); break;
    case 9: st = req_num(o, "repeat_penalty", 0, 1, 100, &r->repeat_penalty); break;
    case 10:
        if ((st = req_int(o, "seed", -1, INT64_MAX, &v)) == IE_OK) r->seed = v;
        break;
    case 11: st = req_stop(o, r); break;
    case 12:
        if (o->type != MSGPACK_OBJECT_BOOLEAN)
            st = ie_error_set(IE_ERR_FORMAT, "request: \"stream\" must be a boolean");
        else r->stream = o->via.boolean ? 1 : 0;
        break;
    case 13:
        if ((st = req_int(o, "priority", INT32_MIN, INT32_MAX, &v)) == IE_OK) r->priority = (int32_t)v;
        break;
    case 14:
        if ((st = req_int(o, "logprobs", -1, IE_CLIENT_TOP_MAX, &v)) == IE_OK) r->logprobs = (int32_t)v;
        break;
    case 15: st = req_str(o, "json_schema", 0, CLIENT_TEXT_MAX, &r->json_schema); break;
    case 16: st = req_str(o, "adapter", 1, 63, &r->adapter); break;
    case 17: st = req_lora(o, r); break;
    case 18: st = req_str(o, "lora_name", 1, 63, &r->lora_name); break;
    case 19: st = req_str(o, "lora_path", 1, 4096, &r->lora_path); break;
    case 20:
        if (o->type != MSGPACK_OBJECT_BOOLEAN)
            st = ie_error_set(IE_ERR_FORMAT, "request: \"pinned\" must be a boolean");
        else r->pinned = o->via.boolean ? 1 : 0;
        break;
    case 21:
        if ((st = req_int(o, "min_new", 0, CLIENT_MAX_NEW_MAX, &v)) == IE_OK) r->min_new = (int32_t)v;
        break;
    case 22:
        if (o->type != MSGPACK_OBJECT_BOOLEAN)
            st = ie_error_set(IE_ERR_FORMAT, "request: \"ignore_eos\" must be a boolean");
        else r->ignore_eos = o->via.boolean ? 1 : 0;
        break;
    case 23: st = req_bias(o, r); break;
    case 24: st = req_num(o, "frequency_penalty", -2, 0, 2, &r->frequency_penalty); break;
    case 25: st = req_num(o, "presence_penalty", -2, 0, 2, &r->presence_penalty); break;
    case 26: st = req_stop_ids(o, r); break;
    case 27: st = req_choice(o, r); break;
    case 28:
    case 29:
        if (o->type != MSGPACK_OBJECT_BOOLEAN)
            st = ie_error_set(IE_ERR_FORMAT, "request: \"%s\" must be a boolean", keys[idx]);
        else if (idx == 28) r->include_stop = o->via.boolean ? 1 : 0;
        else r->show_special = o->via.boolean ? 0 : 1; /* skip_special_tokens false: shown */
        break;
    }
    return st;
}

ie_status_t ie_client_req_decode(const void *data, size_t n, ie_client_req_t *r)
{
    ie_status_t st = IE_OK;
    msgpack_unpacked u;
    uint32_t seen = 0;

    msgpack_unpacked_init(&u);
    if (!r) return ie_error_set(IE_ERR_INVAL, "ie_client_req_decode: NULL request");
    req_defaults(r);
    st = unpack_map(data, n, &u, "request");
    if (st != IE_OK) goto cleanup;
    const msgpack_object_map *map = &u.data.via.map;
    st = check_version(map, "request", IE_PROTO_CLIENT_VERSION);
    if (st != IE_OK) goto cleanup;
    for (uint32_t i = 0; i < map->size; i++) {
        st = req_key(&map->ptr[i].key, &map->ptr[i].val, r, &seen);
        if (st != IE_OK) goto cleanup;
    }
    if (!r->type) {
        st = ie_error_set(IE_ERR_FORMAT, "request: missing key \"type\"");
        goto cleanup;
    }
    if (!r->id) {
        st = ie_error_set(IE_ERR_FORMAT, "request: missing key \"id\"");
        goto cleanup;
    }
    if (strcmp(r->type, "generate") == 0 && !r->prompt == !r->messages)
        st = ie_error_set(IE_ERR_FORMAT,
                          "request: a generate request needs exactly one of \"prompt\" or \"messages\"");
    else if (strcmp(r->type, "load_lora") == 0 && (!r->lora_name || !r->lora_path))
        st = ie_error_set(IE_ERR_FORMAT, "request: load_lora needs \"lora_name\" and \"lora_path\"");
    else if (strcmp(r->type, "unload_lora") == 0 && !r->lora_name)
        st = ie_error_set(IE_ERR_FORMAT, "request: unload_lora needs \"lora_name\"");
    else if (r->min_new > r->max_new)
        st = ie_error_set(IE_ERR_FORMAT, "request: \"min_new\" (%d) must not exceed \"max_new\" (%d)",
                          (int)r->min_new, (int)r->max_new);

cleanup:
    msgpack_unpacked_destroy(&u);
    if (st != IE_OK) ie_client_req_clear(r);
    return st;
}

/* ------------------------------------------------------------ client replies */

static void reply_begin(msgpack_packer *pk, pack_ctx_t *ctx, ie_buf_t *out, size_t n_keys, const char *type,
                        const char *id)
{
    ie_buf_reset(out);
    msgpack_packer_init(pk, ctx, pack_write);
    msgpack_pack_map(pk, n_keys);
    pack_key(pk, "v");
    msgpack_pack_int(pk, IE_PROTO_CLIENT_VERSION);
    pack_key(pk, "type");
    pack_cstr(pk, type);
    pack_key(pk, "id");
    pack_cstr(pk, id);
}

static ie_status_t reply_end(pack_ctx_t *ctx, ie_buf_t *out)
{
    if (!ctx->oom) return IE_OK;
    ie_buf_reset(out);
    return ie_error_set(IE_ERR_NOMEM, "client reply: out of memory");
}

/* "logprob": f, "top_logprobs": [[id, f]...] of lp (two map entries). */
static void pack_lp(msgpack_packer *pk, const ie_client_lp_t *lp)
{
    const int32_t n = lp->n_top < 0 ? 0 : lp->n_top > IE_CLIENT_TOP_MAX ? IE_CLIENT_TOP_MAX : lp->n_top;
    pack_key(pk, "logprob");
    msgpack_pack_double(pk, lp->logprob);
    pack_key(pk, "top_logprobs");
    msgpack_pack_array(pk, (size_t)n);
    for (int32_t j = 0; j < n; j++) {
        msgpack_pack_array(pk, 2);
        msgpack_pack_int32(pk, lp->top_ids[j]);
        msgpack_pack_double(pk, lp->top_lps[j]);
    }
}

ie_status_t ie_client_enc_token_lp(ie_buf_t *out, const char *id, int32_t index, int32_t token, const char *text,
                                   size_t text_len, const ie_client_lp_t *lp)
{
    msgpack_packer pk;
    pack_ctx_t ctx = {out, 0};
    if (!out || (!text && text_len) || text_len > UINT32_MAX)
        return ie_error_set(IE_ERR_INVAL, "ie_client_enc_token: bad argument");
    reply_begin(&pk, &ctx, out, lp ? 8 : 6, "token", id);
    pack_key(&pk, "index");
    msgpack_pack_int32(&pk, index);
    pack_key(&pk, "token");
    msgpack_pack_int32(&pk, token);
    pack_key(&pk, "text");
    pack_strn(&pk, text ? text : "", text_len);
    if (lp) pack_lp(&pk, lp);
    return reply_end(&ctx, out);
}

ie_status_t ie_client_enc_token(ie_buf_t *out, const char *id, int32_t index, int32_t token, const char *text,
                                size_t text_len)
{
    return ie_client_enc_token_lp(out, id, index, token, text, text_len, NULL);
}

ie_status_t ie_client_enc_done(ie_buf_t *out, const ie_client_done_t *d)
{
    msgpack_packer pk;
    pack_ctx_t ctx = {out, 0};
    if (!out || !d || (!d->text && d->text_len) || d->text_len > UINT32_MAX)
        return ie_error_set(IE_ERR_INVAL, "ie_client_enc_done: bad argument");
    if (d->n_lp && !d->lp) return ie_error_set(IE_ERR_INVAL, "ie_client_enc_done: bad argument");
    reply_begin(&pk, &ctx, out, d->lp ? 11 : 10, "done", d->id);
    pack_key(&pk, "text");
    pack_strn(&pk, d->text ? d->text : "", d->text_len);
    pack_key(&pk, "finish");
    pack_cstr(&pk, d->finish);
    pack_key(&pk, "n_prompt");
    msgpack_pack_int32(&pk, d->n_prompt);
    pack_key(&pk, "n_gen");
    msgpack_pack_int32(&pk, d->n_gen);
    pack_key(&pk, "ttft_ms");
    msgpack_pack_double(&pk, d->ttft_ms);
    pack_key(&pk, "total_ms");
    msgpack_pack_double(&pk, d->total_ms);
    pack_key(&pk, "decode_tps");
    msgpack_pack_double(&pk, d->decode_tps);
    if (d->lp) {
        pack_key(&pk, "logprobs");
        msgpack_pack_array(&pk, d->n_lp);
        for (size_t i = 0; i < d->n_lp; i++) {
            msgpack_pack_map(&pk, 3);
            pack_key(&pk, "token");
            msgpack_pack_int32(&pk, d->lp[i].token);
            pack_lp(&pk, &d->lp[i]);
        }
    }
    return reply_end(&ctx, out);
}

ie_status_t ie_client_enc_error(ie_buf_t *out, const char *id, const char *code, const char *message)
{
    msgpack_packer pk;
    pack_ctx_t ctx = {out, 0};
    if (!out || !code) return ie_error_set(IE_ERR_INVAL, "ie_client_enc_error: bad argument");
    reply_begin(&pk, &ctx, out, 5, "error", id);
    pack_key(&pk, "code");
    pack_cstr(&pk, code);
    pack_key(&pk, "message");
    pack_cstr(&pk, message ? message : "");
    return reply_end(&ctx, out);
}

ie_status_t ie_client_enc_ok(ie_buf_t *out, const char *id, const char *message)
{
    msgpack_packer pk;
    pack_ctx_t ctx = {out, 0};
    if (!out) return ie_error_set(IE_ERR_INVAL, "ie_client_enc_ok: bad argument");
    reply_begin(&pk, &ctx, out, 4, "ok", id);
    pack_key(&pk, "message");
    pack_cstr(&pk, message ? message : "");
    return reply_end(&ctx, out);
}

/* ------------------------------------------------- RESULT logits payload */

size_t ie_result_logits_len(const uint8_t *flags, int n, int64_t nv)
{
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += flags[i] == IE_LOGITS_ARGMAX ? 2 : flags[i] == IE_LOGITS_FULL ? (size_t)nv : 0;
    return len;
}

size_t ie_result_logits_pack(float *lg, const uint8_t *flags, int n, int64_t nv, int64_t vocab_begin)
{
    size_t in = 0, out = 0;
    for (int i = 0; i < n; i++) {
        if (!flags[i] || flags[i] == IE_LOGITS_EMBD) continue; /* no logits row */
        if (flags[i] == IE_LOGITS_ARGMAX) {
            float best;
            const int64_t j = ie_argmax_f32(lg + in, nv, &best);
            const int32_t id = j < 0 ? -1 : (int32_t)(vocab_begin + j);
            lg[out] = best;
            memcpy(&lg[out + 1], &id, sizeof id);
            out += 2;
        } else {
            if (out != in) memmove(lg + out, lg + in, (size_t)nv * sizeof(float));
            out += (size_t)nv;
        }
        in += (size_t)nv;
    }
    return out;
}

/* The arg max rule of every merge: (v, id) beats (bv, bid) when it is
 * usable (id >= 0) and larger, or equal with a lower id (or none yet). */
static int am_beats(float v, int32_t id, float bv, int32_t bid)
{
    return id >= 0 && (v > bv || (v == bv && (bid < 0 || id < bid)));
}

ie_status_t ie_result_logits_merge(const void *payload, size_t bytes, const uint8_t *flags, int n, int64_t vb,
                                   int64_t ve, int64_t n_vocab, float *logits_out, float *am_val, int32_t *am_id)
{
    const int64_t nv = ve - vb;
    const size_t want = ie_result_logits_len(flags, n, nv);
    if (vb < 0 || nv < 0 || ve > n_vocab || bytes != want * sizeof(float))
        return ie_error_set(IE_ERR_FORMAT, "result: %zu bytes of logits, %zu expected for rows %lld..%lld", bytes,
                            want * sizeof(float), (long long)vb, (long long)ve);
    const float *src = payload;
    /* check every id first: a bad payload changes nothing */
    for (int i = 0, row = 0; i < n; i++) {
        if (!flags[i] || flags[i] == IE_LOGITS_EMBD) continue; /* no logits row */
        if (flags[i] == IE_LOGITS_ARGMAX) {
            int32_t id;
            memcpy(&id, src + 1, sizeof id);
            if (id != -1 && (id < vb || id >= ve))
                return ie_error_set(IE_ERR_FORMAT, "result: entry %d's arg max id %d is outside rows %lld..%lld",
                                    row, (int)id, (long long)vb, (long long)ve);
            src += 2;
        } else {
            src += nv;
        }
        row++;
    }
    src = payload;
    for (int i = 0, row = 0; i < n; i++) {
        if (!flags[i] || flags[i] == IE_LOGITS_EMBD) continue; /* no logits row */
        if (flags[i] == IE_LOGITS_ARGMAX) {
            const float v = src[0];
            int32_t id;
            memcpy(&id, src + 1, sizeof id);
            if (am_beats(v, id, am_val[row], am_id[row])) {
                am_val[row] = v;
                am_id[row] = id;
            }
            src += 2;
        } else {
            memcpy(logits_out + (size_t)row * (size_t)n_vocab + vb, src, (size_t)nv * sizeof(float));
            src += nv;
        }
        row++;
    }
    return IE_OK;
}

size_t ie_chain_gather_len(int n_ranks, int n) { return (size_t)2 * (size_t)n_ranks * (size_t)n; }

void ie_chain_gather_put(float *g, int n_ranks, int rank, int n, const float *packed)
{
    memset(g, 0, ie_chain_gather_len(n_ranks, n) * sizeof *g);
    if (!packed) return;
    float *mine = g + ie_chain_gather_len(rank, n);
    for (int i = 0; i < n; i++) {
        int32_t id;
        memcpy(&id, packed + 2 * i + 1, sizeof id);
        mine[2 * i] = id >= 0 ? packed[2 * i] : 0.0f;
        mine[2 * i + 1] = id >= 0 ? (float)id + 1.0f : 0.0f; /* exact: ids < 2^24 */
    }
}

ie_status_t ie_chain_gather_pick(const float *g, int n_ranks, int n, int64_t n_vocab, int32_t *tok)
{
    for (int i = 0; i < n; i++) {
        float bv = -INFINITY;
        int32_t bid = -1;
        for (int r = 0; r < n_ranks; r++) {
            const float *e = g + ie_chain_gather_len(r, n) + 2 * i;
            if (!(e[1] >= 0.0f && e[1] <= (float)n_vocab && e[1] == (float)(int32_t)e[1]))
                return ie_error_set(IE_ERR_FORMAT, "chained step: rank %d's arg max of entry %d is not an id", r,
                                    i);
            const int32_t id = (int32_t)e[1] - 1;
            if (am_beats(e[0], id, bv, bid)) {
                bv = e[0];
                bid = id;
            }
        }
        if (bid < 0)
            return ie_error_set(IE_ERR_FORMAT, "chained step: entry %d has no usable logit on any rank", i);
        tok[i] = bid;
    }
    return IE_OK;
}

void ie_result_logits_finish(const uint8_t *flags, int n, int64_t n_vocab, const float *am_val,
                             const int32_t *am_id, float *logits_out)
{
    for (int i = 0, row = 0; i < n; i++) {
        if (!flags[i] || flags[i] == IE_LOGITS_EMBD) continue; /* no logits row */
        if (flags[i] == IE_LOGITS_ARGMAX) {
            float *lo = logits_out + (size_t)row * (size_t)n_vocab;
            /* a few -inf, then doubling copies (libc's memcpy is wide; a
             * plain loop stayed scalar, ~30 us per 49k row) */
            const size_t V = (size_t)n_vocab;
            size_t done = V < 16 ? V : 16;
            for (size_t j = 0; j < done; j++) lo[j] = -INFINITY;
            while (done < V) {
                const size_t k = done < V - done ? done : V - done;
                memcpy(lo + done, lo, k * sizeof *lo);
                done += k;
            }
            if (am_id[row] >= 0) lo[am_id[row]] = am_val[row];
        }
        row++;
    }
}

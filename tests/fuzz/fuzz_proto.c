/* fuzz_proto.c — libFuzzer target for the wire protocol decoders
 * (ie_msg_decode, ie_client_req_decode, ie_kv_ops_check in ie_proto.h).
 *
 * Every input goes to both decoders, copied into an exactly-sized heap block
 * so ASan sees any read past its end. Oracles beyond "no crash, no leak":
 * a cluster header that decodes must re-encode, and decode again to the
 * same struct (the decoder admits only what the encoder can write); a
 * client request that decodes must satisfy the documented limits; a KV
 * operations frame that checks must re-encode (ie_kv_ops_next +
 * ie_kv_ops_append) to the same bytes.
 *
 * Seeds (tests/fuzz/corpus_proto/) come from the encoders themselves: build
 * this file on its own with -DIE_PROTO_MAKE_SEEDS and run it with the
 * corpus directory (see the end of the file). Run the fuzzer via
 * scripts/fuzz.sh.
 */
#include "ie_proto.h"

#include <msgpack.h>

#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef IE_PROTO_MAKE_SEEDS

static ie_msg_t g_m, g_m2; /* large (assign): kept off the stack */

static void check_request(const ie_client_req_t *r)
{
    const int gen = strcmp(r->type, "generate") == 0;
    const int load = strcmp(r->type, "load_lora") == 0, unload = strcmp(r->type, "unload_lora") == 0;
    if (!gen && !load && !unload && strcmp(r->type, "cancel") != 0) __builtin_trap();
    if ((load && (!r->lora_name || !r->lora_path)) || (unload && !r->lora_name)) __builtin_trap();
    if (r->n_lora > 8 || (r->n_lora && !r->lora)) __builtin_trap();
    for (size_t i = 0; i < r->n_lora; i++)
        if (!r->lora[i].name == (r->lora[i].id < 0) || !isfinite(r->lora[i].scale)) __builtin_trap();
    if (r->adapter && !r->adapter[0]) __builtin_trap();
    if (!r->id || strlen(r->id) < 1 || strlen(r->id) > 128) __builtin_trap();
    if (gen && !r->prompt == !r->messages) __builtin_trap();
    if (r->prompt && strlen(r->prompt) > (1u << 20)) __builtin_trap();
    if (r->n_messages > 256 || r->n_stop > 16) __builtin_trap();
    for (size_t i = 0; i < r->n_messages; i++)
        if (!r->messages[i].role || !r->messages[i].content) __builtin_trap();
    for (size_t i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || !r->stop[i][0]) __builtin_trap();
    if (!(r->temperature >= 0) || !(r->top_p >= 0 && r->top_p <= 1) || !(r->repeat_penalty > 0)) __builtin_trap();
    if (r->logprobs < -1 || r->logprobs > IE_CLIENT_TOP_MAX) __builtin_trap();
    if (r->n_bias > IE_CLIENT_BIAS_MAX || (r->n_bias && !r->bias)) __builtin_trap();
    for (size_t i = 0; i < r->n_bias; i++)
        if (r->bias[i].id < 0 || !(r->bias[i].bias >= -100 && r->bias[i].bias <= 100)) __builtin_trap();
    if (r->min_new < 0 || r->min_new > r->max_new || (r->ignore_eos != 0 && r->ignore_eos != 1)) __builtin_trap();
    if (!(fabsf(r->frequency_penalty) <= 2) || !(fabsf(r->presence_penalty) <= 2)) __builtin_trap();
    if (r->n_stop_ids > IE_CLIENT_STOP_IDS_MAX || (r->n_stop_ids && !r->stop_ids)) __builtin_trap();
    for (size_t i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] < 0) __builtin_trap();
    if (r->n_choice > IE_CLIENT_CHOICE_MAX || (r->n_choice && !r->choice)) __builtin_trap();
    for (size_t i = 0; i < r->n_choice; i++)
        if (!r->choice[i] || !r->choice[i][0]) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *p = malloc(size ? size : 1);
    ie_buf_t b = {0};
    ie_client_req_t r;

    if (!p) return 0;
    if (size) memcpy(p, data, size);
    if (ie_msg_decode(p, size, &g_m) == IE_OK) {
        if (ie_msg_encode(&g_m, &b) != IE_OK) __builtin_trap();
        if (ie_msg_decode(b.data, b.len, &g_m2) != IE_OK || memcmp(&g_m, &g_m2, sizeof g_m) != 0) __builtin_trap();
    } else if (g_m.kind != IE_MSG_NONE) {
        __builtin_trap(); /* a failed decode leaves a zeroed message */
    }
    if (ie_kv_ops_check(p, size, NULL) == IE_OK) { /* p is malloc'd: int32-aligned */
        ie_kv_op_t op;
        size_t off = 0;
        ie_buf_reset(&b);
        while (ie_kv_ops_next((const int32_t *)p, size / 4, &off, &op))
            if (ie_kv_ops_append(&b, &op) != IE_OK) __builtin_trap();
        if (b.len != size || (size && memcmp(b.data, p, size) != 0)) __builtin_trap();
    }
    if (ie_client_req_decode(p, size, &r) == IE_OK) check_request(&r);
    else if (r.id || r.type || r.prompt || r.messages || r.stop) __builtin_trap();
    ie_client_req_clear(&r);
    ie_buf_free(&b);
    free(p);
    return 0;
}

#else /* seed writer: cc -DIE_PROTO_MAKE_SEEDS -Icommon/net -Icommon/sys -Iinclude tests/fuzz/fuzz_proto.c \
   *   build/libie_net.a build/libie_sys.a build/libie_kernels.a -lmsgpackc -o seeds && ./seeds tests/fuzz/corpus_proto */

#include <stdio.h>

static void write_seed(const char *dir, const char *name, const void *data, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) abort();
    fclose(f);
}

static void seed_msg(const char *dir, const ie_msg_t *m)
{
    ie_buf_t b = {0};
    char name[64];
    if (ie_msg_encode(m, &b) != IE_OK) abort();
    snprintf(name, sizeof name, "msg-%s", ie_msg_kind_name(m->kind));
    write_seed(dir, name, b.data, b.len);
    ie_buf_free(&b);
}

#define K(s) msgpack_pack_str_with_body(&pk, s, strlen(s))

/* A client request's map of n keys, opened with v, type and id. */
static void req_head(msgpack_packer *pk, uint32_t n, const char *type, const char *id)
{
    msgpack_pack_map(pk, n);
    msgpack_pack_str_with_body(pk, "v", 1);
    msgpack_pack_int(pk, 1);
    msgpack_pack_str_with_body(pk, "type", 4);
    msgpack_pack_str_with_body(pk, type, strlen(type));
    msgpack_pack_str_with_body(pk, "id", 2);
    msgpack_pack_str_with_body(pk, id, strlen(id));
}

int main(int argc, char **argv)
{
    static ie_msg_t m;
    const char *dir = argc > 1 ? argv[1] : "tests/fuzz/corpus_proto";

    memset(&m, 0, sizeof m);
    m.kind = IE_MSG_HELLO;
    m.u.hello = (ie_msg_hello_t){.rank = -1, .pid = 77, .numa_node = 0, .n_threads = 8, .model_fp = 1234567};
    strcpy(m.u.hello.host, "node-1");
    strcpy(m.u.hello.peer_endpoint, "tcp://10.0.0.1:5601");
    seed_msg(dir, &m);

    memset(&m, 0, sizeof m);
    m.kind = IE_MSG_ASSIGN;
    m.u.assign = (ie_msg_assign_t){.epoch = 1,
                                   .plan = 1,
                                   .rank = 1,
                                   .n_ranks = 2,
                                   .n_ctx = 2048,
                                   .n_seq = 4,
                                   .max_batch = 256,
                                   .kv_block = 16,
                                   .kv_blocks = 64,
                                   .precision = 0,
                                   .heartbeat_ms = 500,
                                   .dead_ms = 3000,
                                   .cluster_id = 0x1234abcd5678ef90ull};
    strcpy(m.u.assign.peer_endpoint[0], "tcp://10.0.0.1:5601");
    strcpy(m.u.assign.peer_endpoint[1], "tcp://10.0.0.2:5601");
    seed_msg(dir, &m);

    memset(&m, 0, sizeof m);
    m.kind = IE_MSG_READY;
    m.u.ready = (ie_msg_ready_t){.epoch = 1, .rank = 1, .status = 3, .load_ms = 12.5, .weight_bytes = 1 << 20};
    strcpy(m.u.ready.error, "bad shard");
    seed_msg(dir, &m);

    memset(&m, 0, sizeof m);
    m.kind = IE_MSG_STEP;
    m.u.step = (ie_msg_step_t){.epoch = 1, .step = 5, .n = 3, .has_hidden = 1, .kv_words = 14};
    seed_msg(dir, &m);
    {
        /* a chained STEP (its tokens from the ranks' arg max) */
        ie_buf_t b = {0};
        m.u.step = (ie_msg_step_t){.epoch = 1, .step = 6, .n = 3, .chain = 1};
        if (ie_msg_encode(&m, &b) == IE_OK) write_seed(dir, "step-chain", b.data, b.len);
        ie_buf_free(&b);
    }

    { /* a STEP's KV-operations frame: clear, bind, set length */
        static const int32_t pb[3] = {7, -1, 2};
        const ie_kv_op_t ops[3] = {{IE_KV_OP_CLEAR, 1, 0, 0, NULL},
                                   {IE_KV_OP_BIND, 1, 0, 3, pb},
                                   {IE_KV_OP_SET_LEN, 0, 0, 40, NULL}};
        ie_buf_t b = {0};
        for (int i = 0; i < 3; i++)
            if (ie_kv_ops_append(&b, &ops[i]) != IE_OK) abort();
        write_seed(dir, "kv-ops", b.data, b.len);
        ie_buf_free(&b);
    }

    memset(&m, 0, sizeof m);
    m.kind = IE_MSG_RESULT;
    m.u.result = (ie_msg_result_t){.epoch = 1,
                                   .step = 5,
                                   .rank = 0,
                                   .n_rows = 1,
                                   .vocab_begin = 0,
                                   .vocab_end = 32000,
                                   .compute_ms = 3.5,
                                   .transfer_ms = 0.25};
    seed_msg(dir, &m);

    memset(&m, 0, sizeof m);
    m.kind = IE_MSG_PARTIAL;
    m.u.partial = (ie_msg_partial_t){.epoch = 1, .step = 5, .from_rank = 1, .index = 4, .count = 4096};
    seed_msg(dir, &m);

    memset(&m, 0, sizeof m);
    m.kind = IE_MSG_HEARTBEAT;
    m.u.heartbeat = (ie_msg_heartbeat_t){.epoch = 1, .rank = -1, .busy = 0};
    seed_msg(dir, &m);

    memset(&m, 0, sizeof m);
    m.kind = IE_MSG_BYE;
    seed_msg(dir, &m);

    memset(&m, 0, sizeof m);
    m.kind = IE_MSG_ERROR;
    m.u.error.code = 3;
    strcpy(m.u.error.message, "decode: missing key \"kind\"");
    seed_msg(dir, &m);

    memset(&m, 0, sizeof m);
    m.kind = IE_MSG_LORA;
    m.u.lora = (ie_msg_lora_t){.seq = 3, .op = IE_LORA_OP_ADD, .id = 2, .keep = 0, .n_name = 2, .n_path = 2};
    strcpy(m.u.lora.name[0], "qv8");
    strcpy(m.u.lora.name[1], "all16");
    strcpy(m.u.lora.path[0], "/srv/lora/qv8");
    strcpy(m.u.lora.path[1], "/srv/lora/all16.gguf");
    seed_msg(dir, &m);

    memset(&m, 0, sizeof m);
    m.kind = IE_MSG_LORA_ACK;
    m.u.lora_ack = (ie_msg_lora_ack_t){.seq = 3, .rank = 1, .id = 2, .status = 2};
    strcpy(m.u.lora_ack.error, "worker rank 1: adapter 'qv8': differs");
    seed_msg(dir, &m);

    /* client requests */
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    req_head(&pk, 14, "generate", "req-1");
    K("prompt");
    K("Once upon a time");
    K("max_new");
    msgpack_pack_int(&pk, 16);
    K("temperature");
    msgpack_pack_double(&pk, 0.7);
    K("top_k");
    msgpack_pack_int(&pk, 40);
    K("top_p");
    msgpack_pack_float(&pk, 0.9f);
    K("min_p");
    msgpack_pack_int(&pk, 0);
    K("repeat_penalty");
    msgpack_pack_double(&pk, 1.1);
    K("seed");
    msgpack_pack_int(&pk, 42);
    K("stop");
    msgpack_pack_array(&pk, 1);
    K("\n\n");
    K("stream");
    msgpack_pack_true(&pk);
    K("priority");
    msgpack_pack_int(&pk, 1);
    write_seed(dir, "req-generate", sb.data, sb.size);

    msgpack_sbuffer_clear(&sb);
    req_head(&pk, 4, "generate", "chat-1");
    K("messages");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_map(&pk, 2);
    K("role");
    K("system");
    K("content");
    K("Be brief.");
    msgpack_pack_map(&pk, 2);
    K("role");
    K("user");
    K("content");
    K("Hi!");
    write_seed(dir, "req-chat", sb.data, sb.size);

    msgpack_sbuffer_clear(&sb);
    req_head(&pk, 14, "generate", "bias-1");
    K("stop_token_ids");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_int(&pk, 2);
    msgpack_pack_int(&pk, 7);
    K("guided_choice");
    msgpack_pack_array(&pk, 2);
    K("yes");
    K("no");
    K("include_stop_str_in_output");
    msgpack_pack_true(&pk);
    K("skip_special_tokens");
    msgpack_pack_false(&pk);
    K("prompt");
    K("Hi");
    K("max_new");
    msgpack_pack_int(&pk, 8);
    K("min_new");
    msgpack_pack_int(&pk, 4);
    K("ignore_eos");
    msgpack_pack_true(&pk);
    K("logit_bias");
    msgpack_pack_map(&pk, 2);
    msgpack_pack_int(&pk, 17);
    msgpack_pack_double(&pk, -100.0);
    K("42");
    msgpack_pack_int(&pk, 5);
    K("frequency_penalty");
    msgpack_pack_double(&pk, 0.5);
    K("presence_penalty");
    msgpack_pack_double(&pk, -1.0);
    write_seed(dir, "req-bias", sb.data, sb.size);

    msgpack_sbuffer_clear(&sb);
    req_head(&pk, 3, "cancel", "req-1");
    write_seed(dir, "req-cancel", sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return 0;
}

#endif

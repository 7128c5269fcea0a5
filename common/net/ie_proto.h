/* ie_proto.h — the wire protocol of the distributed service (docs/PROTOCOL.md).
 *
 * Every message is one ZeroMQ multipart message:
 *     frame 0      MessagePack map: the header (kind, version and fields)
 *     frames 1..   raw little-endian arrays (token ids, positions, hidden
 *                  states, logits) — never encoded number by number
 * Headers are decoded into the C structs below; strings are copied into
 * fixed buffers (truncation is an error), so a decoded message owns nothing.
 * Decoders never trust their input: any type mismatch, missing required
 * key, out-of-range number or trailing garbage is IE_ERR_FORMAT with a line
 * naming the key. Unknown keys are ignored (forward compatibility); a
 * different major version is refused.
 *
 * Cluster messages (coordinator <-> workers, worker <-> worker):
 *   HELLO     worker -> coord   registration (and re-registration)
 *   ASSIGN    coord -> worker   shard to load + peer table
 *   READY     worker -> coord   shard loaded (or failed: status != 0)
 *   STEP      coord -> worker, stage -> next stage
 *             frames: tokens i32[n], pos i32[n], seq i32[n], logits u8[n],
 *                     kv i32[kv_words] (KV-cache operations, see below)
 *                     [, hidden f32[n * n_embd] when has_hidden]
 *   RESULT    worker -> coord   frames: logits f32[n_rows * (v1 - v0)]
 *   PARTIAL   worker -> worker  tensor-parallel partial sums, frame f32[count]
 *   HEARTBEAT both ways
 *   BYE       either way: orderly shutdown / leaving
 *   ERROR     either way: a request could not be understood
 *   LORA      coord -> worker   attach / detach a LoRA adapter set; frames:
 *                               fingerprint u64[n_parts], scale f32[n_parts]
 *   LORA_ACK  worker -> coord   its answer (status != 0: error says why)
 * Client messages (client <-> coordinator ROUTER), see ie_client_*.
 */
#ifndef IE_PROTO_H
#define IE_PROTO_H

#include "ie_buf.h"
#include "ie_status.h"

#include <stddef.h>
#include <stdint.h>

#define IE_PROTO_VERSION \
    5                             /* cluster messages (2: KV operations, paged pool;
                                     3: arg-max-only logits rows; 4: chained steps;
                                     5: hidden-state rows, IE_LOGITS_EMBD;
                                     LoRA adapters) */
#define IE_PROTO_CLIENT_VERSION 1 /* client requests and replies                    */

#define IE_PROTO_ENDPOINT_MAX 256 /* bytes of an endpoint string incl. NUL */
#define IE_PROTO_TEXT_MAX 512     /* error texts, host names, topology     */
#define IE_PROTO_KEY_MAX 41       /* Z85 CURVE public key + NUL            */
#define IE_PROTO_MAX_RANKS 64
#define IE_PROTO_KV_IDS_MAX 65536       /* block ids in one step's KV operations */
#define IE_PROTO_KV_WORDS_MAX (1 << 20) /* int32 words in one step's KV frame     */

typedef enum ie_msg_kind {
    IE_MSG_NONE = 0,
    IE_MSG_HELLO = 1,
    IE_MSG_ASSIGN = 2,
    IE_MSG_READY = 3,
    IE_MSG_STEP = 4,
    IE_MSG_RESULT = 5,
    IE_MSG_PARTIAL = 6,
    IE_MSG_HEARTBEAT = 7,
    IE_MSG_BYE = 8,
    IE_MSG_ERROR = 9,
    IE_MSG_LORA = 10,
    IE_MSG_LORA_ACK = 11
} ie_msg_kind_t;

#define IE_PROTO_LORA_PARTS 8       /* adapters in one set (ie_backend.h's 1..8) */
#define IE_PROTO_LORA_NAME_MAX 64   /* bytes of an adapter name incl. NUL        */
#define IE_PROTO_LORA_PATH_MAX 1024 /* bytes of an adapter path incl. NUL       */
#define IE_PROTO_LORA_IDS 32        /* adapter ids 0..31 (IE_WORKER_MAX_LORA <=)  */

/* "hello", "assign", ...; "none" for unknown kinds. */
const char *ie_msg_kind_name(ie_msg_kind_t k);

typedef struct ie_msg_hello {
    int32_t rank; /* rank asked for, -1: any free one              */
    int32_t pid;
    int32_t numa_node;   /* node the worker is bound to (-1: none)         */
    int32_t n_threads;   /* compute threads it will run                    */
    uint64_t model_fp;   /* ie_model_fingerprint of its local model        */
    uint64_t weights_fp; /* ie_model_src_weights_hash of it (0: none)   */
    char host[IE_PROTO_TEXT_MAX];
    char peer_endpoint[IE_PROTO_ENDPOINT_MAX]; /* where peers reach it      */
    char public_key[IE_PROTO_KEY_MAX];         /* its CURVE key ("" none)    */
    char topology[IE_PROTO_TEXT_MAX];          /* what it found (hwloc)      */
} ie_msg_hello_t;

typedef struct ie_msg_assign {
    uint64_t epoch;      /* cluster generation: bumps on every re-plan     */
    uint64_t cluster_id; /* random per cluster, the same for every rank
                              (0: none): names the ranks' shared-memory
                              segments (ie_shmreduce.h)                      */
    int32_t plan;        /* ie_shard_kind_t                                */
    int32_t rank, n_ranks;
    int32_t n_ctx, n_seq, max_batch;
    int32_t kv_block;     /* positions per KV block (0: the worker's default) */
    int32_t kv_blocks;    /* KV blocks in the pool (0: enough for all slots)  */
    int32_t kv_type_k;    /* ie_kv_type_t of the K cache (absent: 0, f32)   */
    int32_t kv_type_v;    /* and of V                                       */
    int32_t kv_rotate;    /* ie_kv_rotate_t (absent: 0, auto)               */
    int32_t kv_swa_full;  /* 1: sliding layers keep the whole context, no
                             ring (ie_worker_opts_t; absent: 0)             */
    int32_t precision;    /* ie_precision_t                                 */
    int32_t heartbeat_ms; /* how often to send heartbeats                   */
    int32_t dead_ms;      /* silence after which a peer counts as dead      */
    /* per rank: where its peer socket listens and its CURVE key */
    char peer_endpoint[IE_PROTO_MAX_RANKS][IE_PROTO_ENDPOINT_MAX];
    char peer_key[IE_PROTO_MAX_RANKS][IE_PROTO_KEY_MAX];
} ie_msg_assign_t;

typedef struct ie_msg_ready {
    uint64_t epoch;
    int32_t rank;
    int32_t status; /* ie_status_t of the load                        */
    double load_ms;
    uint64_t weight_bytes; /* bytes of weights this shard holds              */
    char error[IE_PROTO_TEXT_MAX];
} ie_msg_ready_t;

typedef struct ie_msg_step {
    uint64_t epoch;
    uint64_t step;       /* strictly increasing per cluster epoch          */
    int32_t n;           /* tokens (frames hold n entries each)            */
    int32_t has_hidden;  /* 1: a hidden-state frame follows (pipeline)     */
    int32_t kv_words;    /* int32 words of the KV-operations frame, applied
                              in order before the step (ie_kv_op_t)      */
    int32_t has_adapter; /* 1: an adapter frame follows (last): the LORA id
                              of each token, -1 the base               */
    int32_t chain;       /* 1: a chained step (tensor plans): entry i's
                              token is not in the tokens frame (it holds
                              -1s) but the whole vocabulary's arg max of
                              entry i of the step just before (step - 1),
                              every entry of which was ARGMAX; the ranks
                              agree on it among themselves, and each
                              RESULT carries the tokens used as a frame
                              (docs/PROTOCOL.md, "Chained steps")        */
} ie_msg_step_t;

typedef struct ie_msg_result {
    uint64_t epoch, step;
    int32_t rank;
    int32_t status;                 /* ie_status_t; != 0: error says why, no frame    */
    int32_t n_rows;                 /* logits rows                                    */
    int64_t vocab_begin, vocab_end; /* the columns this rank computed       */
    double compute_ms;              /* time in the forward pass                       */
    double transfer_ms;             /* time waiting on peers (reduce / hops)          */
    char error[IE_PROTO_TEXT_MAX];
} ie_msg_result_t;

typedef struct ie_msg_partial {
    uint64_t epoch, step;
    int32_t from_rank;
    int32_t index; /* which reduction of the step (2 per layer)      */
    int64_t count; /* floats in the frame                            */
} ie_msg_partial_t;

typedef struct ie_msg_heartbeat {
    uint64_t epoch;
    int32_t rank; /* -1 from the coordinator                        */
    int32_t busy; /* 1 while a step runs                            */
} ie_msg_heartbeat_t;

typedef struct ie_msg_error {
    int32_t code; /* ie_status_t                                    */
    char message[IE_PROTO_TEXT_MAX];
} ie_msg_error_t;

/* LORA ops: ADD attaches id as the weighted sum of the parts (an id
 * attached with the same parts stays as it is; with others it is
 * replaced), REMOVE detaches id (not attached: fine), KEEP detaches every
 * id whose bit in keep is clear (a rank joining: the coordinator sends
 * KEEP, then ADD for each attached set). Every LORA is answered by a
 * LORA_ACK of the same seq. */
typedef enum ie_lora_op { IE_LORA_OP_ADD = 0, IE_LORA_OP_REMOVE = 1, IE_LORA_OP_KEEP = 2 } ie_lora_op_t;

typedef struct ie_msg_lora {
    uint64_t seq;           /* increasing per coordinator; echoed in the ack */
    int32_t op;             /* ie_lora_op_t                                  */
    int32_t id;             /* 0..IE_PROTO_LORA_IDS-1                         */
    int64_t keep;           /* KEEP: bit i set = id i stays                  */
    int32_t n_name, n_path; /* parts (ADD: equal, 1..IE_PROTO_LORA_PARTS)    */
    char name[IE_PROTO_LORA_PARTS][IE_PROTO_LORA_NAME_MAX];
    char path[IE_PROTO_LORA_PARTS][IE_PROTO_LORA_PATH_MAX];
} ie_msg_lora_t;

typedef struct ie_msg_lora_ack {
    uint64_t seq;
    int32_t rank;
    int32_t id;
    int32_t status; /* ie_status_t; != 0: error says why               */
    char error[IE_PROTO_TEXT_MAX];
} ie_msg_lora_ack_t;

typedef struct ie_msg {
    ie_msg_kind_t kind;
    union {
        ie_msg_hello_t hello;
        ie_msg_assign_t assign;
        ie_msg_ready_t ready;
        ie_msg_step_t step;
        ie_msg_result_t result;
        ie_msg_partial_t partial;
        ie_msg_heartbeat_t heartbeat;
        ie_msg_error_t error;
        ie_msg_lora_t lora;
        ie_msg_lora_ack_t lora_ack;
    } u;
} ie_msg_t;

/* Encode m's header into out (replacing its contents). IE_ERR_INVAL for a
 * kind without an encoder or fields out of range; IE_ERR_NOMEM. */
ie_status_t ie_msg_encode(const ie_msg_t *m, ie_buf_t *out);

/* Decode a header frame. On failure *m is zeroed and the error names what
 * was wrong (IE_ERR_FORMAT; IE_ERR_UNSUPPORTED for another version). */
ie_status_t ie_msg_decode(const void *data, size_t n, ie_msg_t *m);

/* ------------------------------------------------------------ KV operations
 * A STEP's KV-cache operations (the slot clears, block binds and length
 * settings queued since the previous step) travel as one frame of int32
 * words, one operation after the other, applied in that order before the
 * step's tokens:
 *     CLEAR    1, seq                       ie_worker_seq_clear
 *     BIND     2, seq, first, n, pb[0..n)   ie_worker_kv_bind (-1 unbinds)
 *     SET_LEN  3, seq, n_pos                ie_worker_seq_set_len
 * A frame holds at most IE_PROTO_KV_WORDS_MAX words and IE_PROTO_KV_IDS_MAX
 * block ids. Ranges against the pool are the worker's to check. */
typedef enum ie_kv_op_kind { IE_KV_OP_CLEAR = 1, IE_KV_OP_BIND = 2, IE_KV_OP_SET_LEN = 3 } ie_kv_op_kind_t;

typedef struct ie_kv_op {
    ie_kv_op_kind_t kind;
    int32_t seq;       /* slot (>= 0)                                    */
    int32_t first;     /* BIND: first logical block (>= 0)               */
    int32_t n;         /* BIND: blocks (>= 0); SET_LEN: positions (>= 0) */
    const int32_t *pb; /* BIND: n physical blocks (>= -1), borrowed      */
} ie_kv_op_t;

/* Append op's words to the frame in `frame` (int32 words, native = little
 * endian). IE_ERR_INVAL for a field out of range, IE_ERR_NOMEM; the frame
 * is unchanged then. The frame limits are the caller's to keep. */
ie_status_t ie_kv_ops_append(ie_buf_t *frame, const ie_kv_op_t *op);

/* Validate a received frame of `bytes` bytes (a whole number of words,
 * every operation complete and in range, within both limits). IE_OK and the
 * operation count in *n_ops (may be NULL), else IE_ERR_FORMAT naming the
 * word. */
ie_status_t ie_kv_ops_check(const void *frame, size_t bytes, int *n_ops);

/* Walk a validated frame of n_words words: decode the operation at word
 * *off into *op (pb points into the frame), advance *off; 0 at the end. */
int ie_kv_ops_next(const int32_t *words, size_t n_words, size_t *off, ie_kv_op_t *op);

/* --------------------------------------------------- RESULT logits payload
 * A STEP's logits byte per entry: 0 none, IE_LOGITS_FULL the row,
 * IE_LOGITS_ARGMAX only its arg max. A head rank's RESULT frame holds, for
 * each entry with a nonzero byte, in order: FULL, the nv floats of its
 * vocabulary slice [vocab_begin, vocab_begin + nv); ARGMAX, 2 words: the
 * slice's largest logit (f32) and its vocabulary id (i32, the first of
 * equal maxima; -1 with -inf when nothing in the slice is usable). */
#define IE_LOGITS_FULL 1
#define IE_LOGITS_ARGMAX 2
/* IE_LOGITS_EMBD: no logits, the entry's hidden state after the final norm
 * (n_embd floats, an embedding request's); it takes no row of the logits
 * payload. The head rank with vocab_begin 0 (the last pipeline stage, or
 * tensor rank 0) sends these rows, in entry order, as one more RESULT
 * frame; the other head ranks send none (docs/PROTOCOL.md, RESULT). */
#define IE_LOGITS_EMBD 3

/* Floats in the payload of one rank holding nv vocabulary rows. */
size_t ie_result_logits_len(const uint8_t *flags, int n, int64_t nv);

/* Worker side, in place: lg holds one nv-float row per flagged entry, in
 * order; the ARGMAX rows become their 2 words and the rows after them move
 * down. Returns the payload's length in floats. */
size_t ie_result_logits_pack(float *lg, const uint8_t *flags, int n, int64_t nv, int64_t vocab_begin);

/* Coordinator side: take one rank's payload (bytes long) for vocabulary
 * rows [vb, ve) of n_vocab. FULL entries are copied into their row of
 * logits_out (n_vocab floats per flagged entry); ARGMAX entries update
 * am_val / am_id (one per flagged entry, start at -inf / -1) when their
 * maximum is larger, or equal with a lower id — so after every rank, the
 * whole vocabulary's first maximum. IE_ERR_FORMAT (naming the entry, and
 * nothing of this payload applied) for a wrong length or an id that is
 * not -1 and not in [vb, ve). */
ie_status_t ie_result_logits_merge(const void *payload, size_t bytes, const uint8_t *flags, int n, int64_t vb,
                                   int64_t ve, int64_t n_vocab, float *logits_out, float *am_val, int32_t *am_id);

/* After the merges: every ARGMAX entry's row of logits_out becomes -inf
 * but at its winner, the row a greedy sampler reads the same id from. */
void ie_result_logits_finish(const uint8_t *flags, int n, int64_t n_vocab, const float *am_val,
                             const int32_t *am_id, float *logits_out);

/* ------------------------------------------------------- chained steps
 * The tensor ranks' agreement on a chained STEP's tokens: each rank puts
 * its slice's (max, id) of every entry of the previous step into a
 * gather vector of ie_chain_gather_len floats, zeros elsewhere, and the
 * ranks sum it (their reduce), which leaves every rank's entries in every
 * rank's vector: at [(rank * n + i) * 2] the maximum, at [+1] id + 1 as an
 * exact small integer (0: none, a rank without the head or nothing usable).
 * Each rank then picks entry i's token with the rule of
 * ie_result_logits_merge, the coordinator's, so both see the same ids. */
size_t ie_chain_gather_len(int n_ranks, int n);

/* Zero g (ie_chain_gather_len floats) and put this rank's n pairs from
 * `packed` (ie_result_logits_pack's ARGMAX words: max, id as int32 bits;
 * NULL: this rank holds no head) at its place. */
void ie_chain_gather_put(float *g, int n_ranks, int rank, int n, const float *packed);

/* After the sum: entry i's token into tok[i] (the largest maximum, the
 * lowest id among equals). IE_ERR_FORMAT naming the entry when an id is
 * not an integer in [0, n_vocab] or an entry has no usable logit on any
 * rank; tok is then unspecified. */
ie_status_t ie_chain_gather_pick(const float *g, int n_ranks, int n, int64_t n_vocab, int32_t *tok);

/* ------------------------------------------------------------- clients
 * Client -> coordinator (ROUTER): a request map ("v" is
 * IE_PROTO_CLIENT_VERSION, independent of the cluster's version)
 *   {"v":1, "type":"generate", "id":str, "prompt":str | "messages":[{"role":str,"content":str}...],
 *    "max_new":int, "temperature":float, "top_k":int, "top_p":float, "min_p":float,
 *    "repeat_penalty":float, "seed":int, "stop":[str...], "stream":bool, "priority":int,
 *    "logprobs":int (-1..20), "json_schema":str}
 *    [, "adapter":str, "lora":[{"name":str | "id":int, "scale":float}...]]  (LoRA set)
 * or {"v":1, "type":"cancel", "id":str},
 * or {"v":1, "type":"load_lora", "id":str, "lora_name":str, "lora_path":str[, "pinned":bool]},
 * or {"v":1, "type":"unload_lora", "id":str, "lora_name":str}, answered
 *    {"v":1, "type":"ok", "id", "message":str} or an error.
 * Coordinator -> client: {"v":1, "type":"token", "id", "index", "token", "text"} events when streaming,
 * then {"v":1, "type":"done", "id", "text", "finish", "n_prompt", "n_gen", "ttft_ms", "total_ms",
 *       "decode_tps"} or {"v":1, "type":"error", "id", "code":str, "message":str}.
 * With "logprobs" k >= 0 a token event also has "logprob":float and
 * "top_logprobs":[[id, logprob]...] (k entries), and "done" has
 * "logprobs":[{"token", "logprob", "top_logprobs"}...] for every token.
 */
#define IE_CLIENT_TOP_MAX 20      /* "logprobs" alternatives at most */
#define IE_CLIENT_BIAS_MAX 4096   /* "logit_bias" entries at most */
#define IE_CLIENT_STOP_IDS_MAX 64 /* "stop_token_ids" at most */
#define IE_CLIENT_CHOICE_MAX 16   /* "guided_choice" strings at most */

/* One generated token's log-probability and its alternatives (a reply's). */
typedef struct ie_client_lp {
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t top_ids[IE_CLIENT_TOP_MAX];
    float top_lps[IE_CLIENT_TOP_MAX];
} ie_client_lp_t;

typedef struct ie_client_msg_pair {
    char *role, *content;
} ie_client_chat_t;

/* One entry of a request's "lora" list: name, or registry index id (name
 * NULL), and its weight. */
typedef struct ie_client_lora {
    char *name;
    int32_t id;  /* -1 when named                                   */
    float scale; /* default 1                                       */
} ie_client_lora_t;

/* One entry of a request's "logit_bias": token id and the bias added to
 * its logit. */
typedef struct ie_client_bias {
    int32_t id;
    float bias;
} ie_client_bias_t;

#define IE_CLIENT_LORA_MAX 8

typedef struct ie_client_req {
    char *type;   /* "generate", "cancel", "load_lora", "unload_lora" */
    char *id;     /* client's request id (<= 128 bytes)             */
    char *prompt; /* NULL when messages are given                   */
    ie_client_chat_t *messages;
    size_t n_messages;
    int32_t max_new;                           /* default 128                                    */
    float temperature;                         /* default 0.8; 0: greedy                         */
    int32_t top_k;                             /* default 40                                     */
    float top_p;                               /* default 0.95                                   */
    float min_p;                               /* default 0.05                                   */
    float repeat_penalty;                      /* default 1.0                                    */
    float frequency_penalty, presence_penalty; /* default 0 (OpenAI's)      */
    int32_t min_new;                           /* default 0: no end (EOS, stop) before min_new   */
    int ignore_eos;                            /* default 0; 1: never end at EOS                 */
    ie_client_bias_t *bias;                    /* "logit_bias" (n_bias <= IE_CLIENT_BIAS_MAX)  */
    size_t n_bias;
    int32_t *stop_ids; /* "stop_token_ids": more ids that end it like EOS */
    size_t n_stop_ids;
    char **choice; /* "guided_choice": the answer is one of these  */
    size_t n_choice;
    int include_stop; /* "include_stop_str_in_output" (default 0)     */
    int show_special; /* "skip_special_tokens" false (default 0)      */
    int64_t seed;     /* default -1: from the clock                      */
    char **stop;
    size_t n_stop;
    int stream;             /* default 0                                      */
    int32_t priority;       /* default 0; higher first                        */
    int32_t logprobs;       /* default -1: none; k in 0..IE_CLIENT_TOP_MAX:
                              each token's log-probability and k alternatives */
    char *json_schema;      /* default NULL: free text; "" any JSON object; else
                               a JSON Schema (ie_gen_params_t.json_schema)    */
    char *adapter;          /* generate: an adapter at its default scale      */
    ie_client_lora_t *lora; /* generate: the weighted set (n_lora <= 8)  */
    size_t n_lora;
    char *lora_name, *lora_path; /* load_lora / unload_lora            */
    int pinned;                  /* load_lora                          */
} ie_client_req_t;

/* Decode a client request (owning strings in *r). Errors IE_ERR_FORMAT /
 * IE_ERR_UNSUPPORTED with a line a client can act on; *r is cleared then. */
ie_status_t ie_client_req_decode(const void *data, size_t n, ie_client_req_t *r);
void ie_client_req_clear(ie_client_req_t *r);

/* Encoders of the replies, appending a complete map to out (replacing it). */
ie_status_t ie_client_enc_token(ie_buf_t *out, const char *id, int32_t index, int32_t token, const char *text,
                                size_t text_len);
/* ie_client_enc_token plus lp's "logprob" and "top_logprobs" (lp NULL:
 * the same as ie_client_enc_token). */
ie_status_t ie_client_enc_token_lp(ie_buf_t *out, const char *id, int32_t index, int32_t token, const char *text,
                                   size_t text_len, const ie_client_lp_t *lp);
typedef struct ie_client_done {
    const char *id, *text, *finish;
    size_t text_len;
    int32_t n_prompt, n_gen;
    double ttft_ms, total_ms, decode_tps;
    const ie_client_lp_t *lp; /* NULL: no "logprobs" key; else n_lp entries */
    size_t n_lp;
} ie_client_done_t;
ie_status_t ie_client_enc_done(ie_buf_t *out, const ie_client_done_t *d);
ie_status_t ie_client_enc_error(ie_buf_t *out, const char *id, const char *code, const char *message);
/* {"v":1, "type":"ok", "id", "message"}: a load_lora / unload_lora done. */
ie_status_t ie_client_enc_ok(ie_buf_t *out, const char *id, const char *message);

#endif

/* ie_client_example.c — `ie-client-example`: a minimal C client of the
 * coordinator's client endpoint (ie_serve.h, ie_proto.h). It connects a
 * DEALER (ie_transport.h), sends one streamed "generate" request as a
 * MessagePack map, prints the text of each token event as it arrives and
 * then the done summary (or the error reply).
 *
 *   ie-client-example --endpoint tcp://127.0.0.1:5556 --prompt "Hello" \
 *                     [--max-new N] [--temperature T] [--timeout-ms N] \
 *                     [--server-key coord.pub --keys-dir DIR --key NAME]
 *
 * stdout: the generated text, then a newline and one summary line
 *   "done finish=length n_prompt=5 n_gen=24 ttft_ms=... total_ms=..."
 * Exit codes: 0 done, 1 error reply or transport failure, 2 bad usage,
 * 3 no reply within the timeout.
 */
#include "ie_buf.h"
#include "ie_proto.h"
#include "ie_transport.h"

#include <getopt.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pack_write(void *data, const char *buf, size_t len) { return ie_buf_append((ie_buf_t *)data, buf, len); }

static void pack_str(msgpack_packer *pk, const char *s)
{
    const size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

/* The value of key k in map m, or NULL. */
static const msgpack_object *map_get(const msgpack_object *m, const char *k)
{
    if (m->type != MSGPACK_OBJECT_MAP) return NULL;
    const size_t kn = strlen(k);
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object *key = &m->via.map.ptr[i].key;
        if (key->type == MSGPACK_OBJECT_STR && key->via.str.size == kn && memcmp(key->via.str.ptr, k, kn) == 0)
            return &m->via.map.ptr[i].val;
    }
    return NULL;
}

static int obj_is_str(const msgpack_object *o, const char *s)
{
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

static void print_str(FILE *f, const msgpack_object *o)
{
    if (o && o->type == MSGPACK_OBJECT_STR) fwrite(o->via.str.ptr, 1, o->via.str.size, f);
}

static double obj_num(const msgpack_object *o)
{
    if (!o) return 0;
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return (double)o->via.u64;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return (double)o->via.i64;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return o->via.f64;
    default: return 0;
    }
}

static void usage(FILE *f)
{
    fputs("usage: ie-client-example --endpoint EP --prompt TEXT [options]\n"
          "  --endpoint EP        the coordinator's client endpoint (tcp://127.0.0.1:5556)\n"
          "  --prompt TEXT        prompt text\n"
          "  --max-new N          tokens to generate at most (32)\n"
          "  --temperature T      0 = greedy (0)\n"
          "  --timeout-ms N       longest wait for the next reply (60000)\n"
          "  --server-key FILE --keys-dir DIR --key NAME   CURVE\n",
          f);
}

int main(int argc, char **argv)
{
    const char *endpoint = NULL, *prompt = NULL, *server_key = NULL, *keys_dir = NULL, *key_name = NULL;
    long max_new = 32, timeout_ms = 60000;
    double temperature = 0.0;
    enum { O_EP = 1, O_PROMPT, O_MAXNEW, O_TEMP, O_TIMEOUT, O_SKEY, O_KEYS, O_KEY, O_HELP };
    static const struct option lo[] = {{"endpoint", required_argument, 0, O_EP},
                                       {"prompt", required_argument, 0, O_PROMPT},
                                       {"max-new", required_argument, 0, O_MAXNEW},
                                       {"temperature", required_argument, 0, O_TEMP},
                                       {"timeout-ms", required_argument, 0, O_TIMEOUT},
                                       {"server-key", required_argument, 0, O_SKEY},
                                       {"keys-dir", required_argument, 0, O_KEYS},
                                       {"key", required_argument, 0, O_KEY},
                                       {"help", no_argument, 0, O_HELP},
                                       {0, 0, 0, 0}};
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case O_EP: endpoint = optarg; break;
        case O_PROMPT: prompt = optarg; break;
        case O_MAXNEW: max_new = strtol(optarg, &end, 10); break;
        case O_TEMP: temperature = strtod(optarg, &end); break;
        case O_TIMEOUT: timeout_ms = strtol(optarg, &end, 10); break;
        case O_SKEY: server_key = optarg; break;
        case O_KEYS: keys_dir = optarg; break;
        case O_KEY: key_name = optarg; break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (end && (*end || end == optarg)) {
            fprintf(stderr, "error: bad number '%s'\n", optarg);
            return 2;
        }
    }
    if (!endpoint || !prompt || optind < argc || max_new < 1 || max_new > 1 << 20 || timeout_ms < 1) {
        usage(stderr);
        return 2;
    }
    if ((server_key || keys_dir || key_name) && !(server_key && keys_dir && key_name)) {
        fprintf(stderr, "error: CURVE needs --server-key, --keys-dir and --key together\n");
        return 2;
    }

    int rc = 1;
    ie_net_t *net = NULL;
    ie_sock_t *s = NULL;
    ie_buf_t req = {0};
    ie_parts_t in = {0};
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    char skey[41] = "";
    ie_status_t st;

    if ((st = ie_net_new(&net)) != IE_OK) goto fail;
    if (server_key) {
        char path[1024], pub[41], sec[41];
        if ((st = ie_keys_load(server_key, skey)) != IE_OK) goto fail;
        snprintf(path, sizeof path, "%s/%s.pub", keys_dir, key_name);
        if ((st = ie_keys_load(path, pub)) != IE_OK) goto fail;
        snprintf(path, sizeof path, "%s/%s.key", keys_dir, key_name);
        if ((st = ie_keys_load(path, sec)) != IE_OK) goto fail;
        if ((st = ie_net_curve(net, pub, sec, NULL)) != IE_OK) goto fail;
    }
    if ((st = ie_sock_new(net, IE_SOCK_DEALER, &s)) != IE_OK) goto fail;
    if ((st = ie_sock_connect(s, endpoint, server_key ? skey : NULL)) != IE_OK) goto fail;

    /* the request map */
    msgpack_packer pk;
    msgpack_packer_init(&pk, &req, pack_write);
    msgpack_pack_map(&pk, 7);
    pack_str(&pk, "v");
    msgpack_pack_int(&pk, IE_PROTO_CLIENT_VERSION);
    pack_str(&pk, "type");
    pack_str(&pk, "generate");
    pack_str(&pk, "id");
    pack_str(&pk, "c-example-1");
    pack_str(&pk, "prompt");
    pack_str(&pk, prompt);
    pack_str(&pk, "max_new");
    msgpack_pack_long(&pk, max_new);
    pack_str(&pk, "temperature");
    msgpack_pack_double(&pk, temperature);
    pack_str(&pk, "stream");
    msgpack_pack_true(&pk);
    if (!req.data) {
        fprintf(stderr, "error: out of memory\n");
        goto cleanup;
    }
    const ie_frame_t f = {req.data, req.len};
    if ((st = ie_sock_send(s, &f, 1, (int)timeout_ms)) != IE_OK) goto fail;

    for (;;) {
        st = ie_sock_recv(s, &in, (int)timeout_ms);
        if (st == IE_ERR_TIMEOUT) {
            fprintf(stderr, "error: no reply within %ld ms\n", timeout_ms);
            rc = 3;
            goto cleanup;
        }
        if (st != IE_OK) goto fail;
        if (in.n < 1) continue;
        /* the map is the last frame (a ROUTER may put an empty delimiter first) */
        size_t off = 0;
        if (msgpack_unpack_next(&u, in.data[in.n - 1], in.size[in.n - 1], &off) != MSGPACK_UNPACK_SUCCESS ||
            u.data.type != MSGPACK_OBJECT_MAP) {
            fprintf(stderr, "error: a reply that is not a MessagePack map\n");
            goto cleanup;
        }
        const msgpack_object *m = &u.data, *type = map_get(m, "type");
        if (obj_is_str(type, "token")) {
            print_str(stdout, map_get(m, "text"));
            fflush(stdout);
        } else if (obj_is_str(type, "done")) {
            fputs("\ndone finish=", stdout);
            print_str(stdout, map_get(m, "finish"));
            printf(" n_prompt=%.0f n_gen=%.0f ttft_ms=%.1f total_ms=%.1f decode_tps=%.1f\n",
                   obj_num(map_get(m, "n_prompt")), obj_num(map_get(m, "n_gen")), obj_num(map_get(m, "ttft_ms")),
                   obj_num(map_get(m, "total_ms")), obj_num(map_get(m, "decode_tps")));
            rc = 0;
            goto cleanup;
        } else if (obj_is_str(type, "error")) {
            fputs("error: ", stderr);
            print_str(stderr, map_get(m, "code"));
            fputs(": ", stderr);
            print_str(stderr, map_get(m, "message"));
            fputc('\n', stderr);
            goto cleanup;
        } else {
            fprintf(stderr, "warning: ignoring a reply of unknown type\n");
        }
    }
fail:
    fprintf(stderr, "error: %s\n", ie_error_last());
cleanup:
    msgpack_unpacked_destroy(&u);
    ie_parts_free(&in);
    ie_buf_free(&req);
    ie_sock_destroy(&s);
    ie_net_destroy(&net);
    return rc;
}

/* ie_transport.h — the only door to ZeroMQ (libzmq; CURVE via libsodium).
 *
 * Nothing else in clocher includes zmq.h: the cluster and the client
 * endpoint talk through these sockets, which carry multipart messages of
 * plain byte frames (ie_proto.h says what the frames mean).
 *
 *     ie_net_t *net;  ie_net_new(&net);
 *     ie_sock_t *s;   ie_sock_new(net, IE_SOCK_DEALER, &s);
 *     ie_sock_connect(s, "tcp://10.0.0.1:5555");
 *     ie_frame_t f[2] = {{hdr, hdr_len}, {data, data_len}};
 *     ie_sock_send(s, f, 2, -1);                         // -1: block
 *     ie_parts_t in = {0};  ie_sock_recv(s, &in, 1000);   // IE_ERR_TIMEOUT...
 *     ie_parts_free(&in); ie_sock_destroy(&s); ie_net_destroy(&net);
 *
 * Security: with ie_net_curve() every socket of the net uses CURVE. Binding
 * sockets are CURVE servers that accept only clients whose public key is
 * authorized for the socket's role (ie_role_t, ie_sock_set_role: workers
 * or clients; a ZAP handler inside the net; a refused peer is logged to
 * stderr with its address and key); connecting sockets are CURVE clients
 * and must be told the server's public key (ie_sock_connect). Failed
 * handshakes (a wrong server key, a peer without CURVE) are logged too.
 * Keys are Z85 text (40 chars) in files written by ie_keys_generate.
 *
 * Threading: a socket belongs to one thread at a time (ZeroMQ's rule); the
 * net may be shared by all threads of a process (inproc:// needs that).
 */
#ifndef IE_TRANSPORT_H
#define IE_TRANSPORT_H

#include "ie_status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ie_net ie_net_t;
typedef struct ie_sock ie_sock_t;

/* Who a peer is, for CURVE: a key authorized as a worker may join the
 * cluster (and reach the workers' peer sockets); a key authorized as a
 * client may only use the client port. A key may hold both roles. */
typedef enum ie_role { IE_ROLE_WORKER = 1, IE_ROLE_CLIENT = 2 } ie_role_t;

typedef enum ie_sock_type {
    IE_SOCK_ROUTER = 1,
    IE_SOCK_DEALER = 2,
    IE_SOCK_PUSH = 3,
    IE_SOCK_PULL = 4
} ie_sock_type_t;

/* One outgoing frame (borrowed). */
typedef struct ie_frame {
    const void *data;
    size_t size;
} ie_frame_t;

/* A received multipart message: n frames, each its own malloc'd block
 * (aligned to 16 bytes, so float/int32 frames can be read in place).
 * Reused across receives; ie_parts_free releases it. */
typedef struct ie_parts {
    int n;
    void **data;
    size_t *size;
    size_t *cap;
    int cap_n;
} ie_parts_t;

void ie_parts_free(ie_parts_t *p);

/* A context. Caller owns *out. */
ie_status_t ie_net_new(ie_net_t **out);

/* Turn CURVE on for every socket created afterwards: this process's key
 * pair (public and secret Z85) and the directory of authorized public keys,
 * one Z85 key per "*.pub" file: DIR/workers/ (and, for older layouts,
 * DIR itself) hold worker keys, DIR/clients/ client keys (either
 * subdirectory may be missing; NULL: accept only keys later added with
 * ie_net_authorize). Starts the ZAP handler. */
ie_status_t ie_net_curve(ie_net_t *net, const char *public_z85, const char *secret_z85, const char *authorized_dir);

/* ie_net_curve with this process's key pair read from DIR/NAME.pub and
 * DIR/NAME.key (ie_keys_load: the secret must not be group/other
 * readable). */
ie_status_t ie_net_curve_from_dir(ie_net_t *net, const char *dir, const char *name, const char *authorized_dir);

/* Authorize one key (Z85) for a role at run time (adds to its roles). */
ie_status_t ie_net_authorize(ie_net_t *net, ie_role_t role, const char *public_z85);

/* 1 when CURVE is on; then *public_z85 (if not NULL) is this net's key. */
int ie_net_is_secure(const ie_net_t *net, const char **public_z85);

/* Stop the ZAP handler, close the context. Sockets must be destroyed
 * first. Accepts NULL. */
void ie_net_destroy(ie_net_t **net_p);

ie_status_t ie_sock_new(ie_net_t *net, ie_sock_type_t type, ie_sock_t **out);
void ie_sock_destroy(ie_sock_t **s_p); /* linger 0; accepts NULL */

/* Which keys a binding socket accepts on a secure net (before bind):
 * IE_ROLE_WORKER (the default: cluster and peer sockets) or
 * IE_ROLE_CLIENT (the coordinator's client port). */
ie_status_t ie_sock_set_role(ie_sock_t *s, ie_role_t role);

/* Identity a DEALER presents to a ROUTER (before connect). */
ie_status_t ie_sock_set_identity(ie_sock_t *s, const void *id, size_t n);

/* Bind; a tcp endpoint with port 0 or '*' picks a free port. The endpoint
 * actually bound (connectable form, e.g. tcp://127.0.0.1:41234) is copied
 * to bound[bound_cap] when bound != NULL. */
ie_status_t ie_sock_bind(ie_sock_t *s, const char *endpoint, char *bound, size_t bound_cap);

/* Connect (plain, or a CURVE client to a server with that public key;
 * server_z85 NULL on a secure net is IE_ERR_INVAL). */
ie_status_t ie_sock_connect(ie_sock_t *s, const char *endpoint, const char *server_z85);
ie_status_t ie_sock_disconnect(ie_sock_t *s, const char *endpoint);

/* Send n frames as one message. timeout_ms < 0 blocks; otherwise a send
 * that cannot be queued in time is IE_ERR_TIMEOUT. */
ie_status_t ie_sock_send(ie_sock_t *s, const ie_frame_t *frames, int n, int timeout_ms);

/* Receive one whole message into p (replacing its frames). timeout_ms < 0
 * blocks, 0 polls. IE_ERR_TIMEOUT when nothing arrived. A message of more
 * than 64 frames or 1 GiB is dropped with IE_ERR_FORMAT. */
ie_status_t ie_sock_recv(ie_sock_t *s, ie_parts_t *p, int timeout_ms);

/* Cap one received message at `bytes` (1..1 GiB; the default is 1 GiB).
 * Set it before bind/connect: it applies to connections made afterwards. A
 * peer that sends a larger frame is disconnected by ZeroMQ before the frame
 * is stored (no memory is spent on it); a message whose frames add up to
 * more is read, dropped and reported by ie_sock_recv (IE_ERR_FORMAT). */
ie_status_t ie_sock_set_max_msg(ie_sock_t *s, int64_t bytes);

/* Watch a bound socket's peers (call before bind): with heartbeat_ms > 0
 * ZeroMQ pings every connection that often and drops one silent for three
 * intervals (a client whose host vanished); every connection that ends is
 * then reported by ie_sock_peers_gone. */
ie_status_t ie_sock_watch_peers(ie_sock_t *s, int heartbeat_ms);

/* The connection (an opaque number, the socket's file descriptor; -1 for
 * inproc or unknown) the last message ie_sock_recv returned came over. */
int ie_sock_last_peer(const ie_sock_t *s);

/* Connections of a watched socket that ended since the last call: up to
 * cap of their numbers (as ie_sock_last_peer gave) into fds; returns how
 * many. Never blocks; 0 on an unwatched socket. A number can be reused by
 * a later connection: read the ends before the next messages. */
int ie_sock_peers_gone(ie_sock_t *s, int *fds, int cap);

/* Wait until one of the sockets has a message to read; ready[i] = 1 for
 * those. Returns the number ready (0 on timeout), -1 on error (interrupted
 * by a signal counts as 0). */
int ie_sock_poll(ie_sock_t *const *socks, int n, int *ready, int timeout_ms);

/* ----------------------------------------------------------- endpoints */

/* Can a TCP connection to a tcp:// endpoint be opened within timeout_ms
 * (opened and closed at once; other transports: IE_OK untried)?
 * IE_ERR_UNAVAILABLE naming the endpoint and the reason otherwise. */
ie_status_t ie_endpoint_probe(const char *endpoint, int timeout_ms);

/* This host's address on the route to a tcp:// endpoint's host ("10.0.0.2",
 * "[fd00::2]") into out[cap]: what a peer on that side can reach us at. */
ie_status_t ie_endpoint_local_addr(const char *endpoint, char *out, size_t cap);

/* ---------------------------------------------------------------- keys */

/* Make a CURVE key pair: writes DIR/NAME.pub (public Z85 + newline, 0644)
 * and DIR/NAME.key (secret Z85 + newline, 0600; created with O_EXCL unless
 * force). */
ie_status_t ie_keys_generate(const char *dir, const char *name, int force);

/* Read one Z85 key (first 40 chars of the file, rest whitespace) into
 * out[41]. Refuses a secret key file (".key") readable by group or others. */
ie_status_t ie_keys_load(const char *path, char out[41]);

#endif

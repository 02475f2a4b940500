/*
 * conn.h - the transport interface: a connection carries whole messages
 * (header + meta + payload buffers) between two quorum processes.
 *
 * This is deliberately narrow - listen, connect, send a message, receive a
 * message in place, peer lost - so that a shared-memory or RDMA data plane
 * can implement the same calls later. The one implementation today,
 * conn_uv.c and the conn_*.c beside it (conn_internal.h), runs on a libuv
 * loop over TCP or Unix-domain stream sockets.
 *
 * Receiving in place: when a message's header and meta have arrived, the
 * owner's `header` event decides where the payload goes by calling
 * qr_conn_expect() with destination buffers (a variable's gradient buffer,
 * a worker's copy of a variable); the bytes land there with no staging
 * copy for large payloads. If the owner does not call qr_conn_expect(), the
 * payload is read and discarded, so the stream stays in step and the owner
 * can still answer with an error.
 *
 * Lifetime (libuv's handle rules): a qr_conn is freed by the transport
 * after its `lost` event, which is delivered exactly once, whether the
 * peer went away, a protocol error closed it, or the owner called
 * qr_conn_close(). Every send's callback runs before `lost`.
 *
 * Threading: a connection belongs to the thread running its loop.
 */
#ifndef QR_CONN_H
#define QR_CONN_H

#include "common/addr.h"
#include "wire/auth.h"
#include "wire/proto.h"

#include <uv.h>

typedef struct qr_conn qr_conn;
typedef struct qr_listener qr_listener;

typedef struct qr_iov {
    void *base;
    size_t len;
} qr_iov;

typedef struct qr_conn_events {
    /* Outgoing connections: the connect finished (status QR_OK or error). */
    void (*connected)(qr_conn *c, int status);
    /* Header and meta arrived. meta is valid until `message` returns.
     * Return QR_OK, or an error to close the connection. */
    int (*header)(qr_conn *c, const qr_frame *f, const uint8_t *meta);
    /* Optional: more of an expected payload has landed; `got` bytes of it
     * are in the buffers now. Lets the owner work on a large payload while
     * the rest is still on the wire (the ps checks gradients this way). */
    void (*payload)(qr_conn *c, uint64_t got);
    /* The whole message arrived (payload in the expected buffers). */
    void (*message)(qr_conn *c, const qr_frame *f, const uint8_t *meta);
    /* The connection is gone; c is freed right after this returns. */
    void (*lost)(qr_conn *c, int status);
    /* Optional: spliced sends have all reached the kernel's socket (their
     * callbacks come later, once the peer has read them and speaks
     * again): bytes counted by qr_conn_pending_bytes went down. */
    void (*drained)(qr_conn *c);
    /* Listeners only: a peer connected; set c's data here. */
    void (*accepted)(qr_listener *l, qr_conn *c);
} qr_conn_events;

typedef struct qr_conn_options {
    int socket_buffer_bytes; /* SO_SNDBUF/SO_RCVBUF; 0 = system default */
    uint64_t max_payload;    /* larger incoming messages close the connection */
    int peer_timeout_ms;     /* TCP: silent this long = lost (conn_uv.c, set_liveness); 0 = off */
    /* The job's credentials (auth.h), or NULL: no handshake. With them,
     * every connection is authenticated before it carries a message: a
     * client's `connected` comes once the handshake is done (or failed:
     * status QR_EAUTH, the reason in qr_last_error), a listener's
     * `accepted` at once but no `header` before it is done. A refused
     * connection is `lost` with QR_EAUTH (qr_conn_refusal says why). */
    const qr_auth *auth;
    int handshake_timeout_ms; /* a handshake not done by then fails */
    /* Listeners: what one peer may hold, whatever the authentication
     * (conn_limits.c; 0 = no bound). A message begun must be complete
     * within max(message_timeout_ms, its size at message_min_rate bytes a
     * second), time the connection was not read from aside; a connection
     * that completes no message within first_message_timeout_ms is
     * closed; the messages being received by all of the listener's
     * connections together may claim max_incomplete_bytes (their meta
     * and payload, counted from their header), beyond which a new one of
     * 64 KiB or more waits, its connection not read from, until others
     * complete (one alone always goes ahead). Only accepted connections
     * are bounded; the ps sets them (docs/SECURITY.md). */
    int message_timeout_ms;
    uint64_t message_min_rate; /* bytes a second */
    int first_message_timeout_ms;
    uint64_t max_incomplete_bytes;
} qr_conn_options;

typedef void (*qr_send_cb)(qr_conn *c, int status, void *ctx);

/* Listen on addr, or on bind_host at addr's port when bind_host is not
 * NULL or empty ("0.0.0.0": every interface). A TCP listener whose addr
 * is a loopback address also listens on the matching Unix socket
 * (qr_addr_local_unix_path) unless tcp_only. */
int qr_listen(uv_loop_t *loop, const qr_addr *addr, const char *bind_host, bool tcp_only,
              const qr_conn_options *opt, const qr_conn_events *ev, void *data,
              qr_listener **out);
void *qr_listener_data(const qr_listener *l);
/* The Unix socket it also listens on, or NULL. */
const char *qr_listener_unix_path(const qr_listener *l);
/* Close the listener's sockets (and remove its Unix socket file). */
void qr_listener_close(qr_listener *l);

/* Start connecting to addr. For a loopback TCP address with prefer_unix,
 * the Unix socket is tried first and TCP second. The result arrives as
 * the `connected` event; on failure `lost` follows it. */
int qr_connect(uv_loop_t *loop, const qr_addr *addr, bool prefer_unix,
               const qr_conn_options *opt, const qr_conn_events *ev, void *data,
               qr_conn **out);

void qr_conn_set_data(qr_conn *c, void *data);
void *qr_conn_data(const qr_conn *c);
/* "unix" or "tcp", and the peer's printable address. */
const char *qr_conn_kind(const qr_conn *c);
const char *qr_conn_peer(const qr_conn *c);
/* Messages received whole on it so far. */
uint64_t qr_conn_messages_in(const qr_conn *c);

/* Why the connection's handshake failed (qr_hs_refusal; 0 if it did
 * not), and the message said of it, naming the peer. */
int qr_conn_refusal(const qr_conn *c);
/* The cipher sealing the connection ("AES-256-GCM", "XChaCha20-Poly1305"),
 * or NULL if it is not encrypted. */
const char *qr_conn_cipher(const qr_conn *c);
const char *qr_conn_refusal_message(const qr_conn *c);

/* From the `header` event: the payload goes to these buffers, in order.
 * Their lengths must add up to the frame's payload_len. The array is
 * copied; the buffers must stay valid until `message` or `lost`. */
int qr_conn_expect(qr_conn *c, const qr_iov *iov, int n);
/* From the `header` or `payload` event: the payload's next bytes (what
 * has not arrived yet, or its first part) go to these buffers instead;
 * the owner's `payload` event, called as they fill, may name the next
 * buffers with another call; bytes no call names are read and discarded
 * (n 0: all that is left). Lets an owner place a payload it learns the
 * layout of from its own first bytes (a re-replication's snapshot: its
 * head, then its tensors straight into the variables). */
int qr_conn_expect_rest(qr_conn *c, const qr_iov *iov, int n);

/* Send one message: header f (meta_len and payload_len are filled in),
 * meta (copied), and payload buffers, which must stay unchanged until cb
 * runs. cb (may be NULL) runs once, with QR_OK or an error. If this call
 * fails, cb never runs. */
int qr_conn_send(qr_conn *c, const qr_frame *f, const void *meta, uint32_t meta_len,
                 const qr_iov *payload, int npayload, qr_send_cb cb, void *ctx);
/* A large payload to a Unix socket is lent to the kernel, not copied
 * (conn_write.c): its callback runs once the peer has read it,
 * which the connection checks when the peer next sends something. This
 * checks now, running the callbacks of sends read since. */
void qr_conn_reclaim(qr_conn *c);
/* Bytes queued for writing and not yet handed to the kernel (for
 * backpressure; spliced bytes waiting for the peer to read are not). */
size_t qr_conn_pending_bytes(const qr_conn *c);
/* True if everything sent so far has reached the kernel: the payload
 * buffers of the sends are no longer read, even though their callbacks
 * have not run yet (libuv defers them to the next loop iteration). */
bool qr_conn_all_written(const qr_conn *c);

/* Stop / resume reading from the peer: a ps pauses a peer whose replies
 * pile up unsent (libuv itself applies no backpressure), or whose push
 * waits for a checkpoint's cut. A paused connection delivers nothing more,
 * not even messages that came in the same read as the one it was paused
 * in; after qr_conn_resume they are delivered first, in order, before the
 * loop next waits (never inside qr_conn_resume), and only then is the
 * peer read again. */
void qr_conn_pause(qr_conn *c);
void qr_conn_resume(qr_conn *c);
bool qr_conn_paused(const qr_conn *c);

/* Close the connection; `lost` follows with QR_ESTOPPED. Idempotent. */
void qr_conn_close(qr_conn *c);

#endif /* QR_CONN_H */

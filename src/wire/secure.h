/*
 * secure.h - authentication and encryption of a connection's byte stream,
 * for any transport (the libuv one today, through conn_secure.c; a
 * shared-memory one would reuse it as it is): the handshake of auth.h
 * within a deadline, a reason a peer that cannot authenticate can read,
 * and the sealed records of seal.h once a session is encrypted.
 *
 * The transport drives it, as libuv drives a stream's handle through the
 * callbacks it was given: the transport hands in the bytes it reads (into
 * the buffer qr_secure_read_buf names), the messages it sends
 * (qr_secure_seal), a deadline passed or a peer gone; this layer answers
 * only through the qr_secure_io calls the transport filled in (write these
 * bytes, the session is open, here is plaintext, close). It calls nothing
 * else of the transport's and sees none of its state; the transport reads
 * this layer's state only through the calls below.
 */
#ifndef QR_WIRE_SECURE_H
#define QR_WIRE_SECURE_H

#include "wire/auth.h"
#include "wire/proto.h"
#include "wire/seal.h"

#include <uv.h>

/* What the transport does for the security layer; ctx is the one given to
 * qr_secure_init. Any of these may close the connection (the owner's
 * events run inside some): the layer asks `closing` after them. */
typedef struct qr_secure_io {
    /* Write a handshake message (n bytes, copied) to the peer, and end the
     * connection with QR_EAUTH once it is written if close_after. A write
     * that fails goes back to the layer as qr_secure_lost. */
    void (*send)(void *ctx, const void *bytes, size_t n, bool close_after);
    /* Write what the socket takes at once, queueing nothing: the bytes
     * taken, or < 0. */
    int (*try_write)(void *ctx, const void *bytes, size_t n);
    /* Start the handshake's deadline (ms > 0: qr_secure_timeout once it
     * passes) or stop it (ms == 0). */
    void (*deadline)(void *ctx, int ms);
    /* Read nothing more: a refusal is being written. */
    void (*stop_reading)(void *ctx);
    /* The peer is authenticated: take what carrying messages needs (the
     * staging buffer). QR_OK or why not (qr_last_error says). */
    int (*open)(void *ctx);
    /* A client's handshake is over: QR_OK, or why it failed (the owner's
     * `connected` event). */
    void (*connected)(void *ctx, int status);
    /* Opened plaintext of the message being received: where its next n
     * bytes belong, if wholly inside one buffer its owner expects (NULL
     * otherwise), so a record opens straight into it, and then that the n
     * bytes landed there; or n bytes to walk the receive state machine
     * over. */
    uint8_t *(*payload_dest)(void *ctx, size_t n);
    void (*payload_landed)(void *ctx, size_t n);
    void (*plaintext)(void *ctx, const uint8_t *p, size_t n);
    /* End the connection with status (its `lost` event). */
    void (*close)(void *ctx, int status);
    bool (*closing)(void *ctx);
} qr_secure_io;

/* A connection's security state, inside the transport's connection. While
 * hs is set the connection is in its handshake: it reads only into hs_buf,
 * exactly the bytes of the peer's next message, and the transport holds no
 * staging buffer for it yet and delivers no message. */
typedef struct qr_secure {
    const qr_secure_io *io;
    void *ctx;
    const char *peer;         /* the transport's name of the peer, for logs */
    int handshake_timeout_ms; /* 0: the default */
    bool server;              /* accepted: the peer connected to us */
    bool failed;              /* refused: waiting for the refusal to be written */
    uint8_t plain;            /* server: the peer sent a plain request instead */
    uint8_t plain_type;       /* that request's type and id: the reply answers it */
    uint32_t plain_id;
    uint64_t drain;           /* plain request: its bytes still to read and drop */
    int refusal;              /* why the handshake failed (qr_hs_refusal), or 0 */
    char reason[256];         /* and in words, with the peer's address */
    qr_handshake *hs;
    uint8_t hs_buf[QR_HS_MAX_LEN];
    size_t hs_got;
    /* Encrypted sessions: each direction's key and counter, and the record
     * being received (QR_SEAL_OVERHEAD + QR_SEAL_MAX_RECORD). */
    qr_sealer *tx, *rx;
    uint8_t *rec;
    size_t rec_have;
} qr_secure;

/* Set up (s zeroed) for a connection the transport calls ctx; peer names
 * it in logs and reasons (the string may be filled in later). */
void qr_secure_init(qr_secure *s, const qr_secure_io *io, void *ctx, const char *peer,
                    int handshake_timeout_ms);
/* Begin the handshake: a client sends its HELLO, a server waits for one.
 * The transport reads only into qr_secure_read_buf until it is done. */
int qr_secure_start(qr_secure *s, const qr_auth *auth, bool server);
/* A server without a secret got a HELLO's first n bytes (first): answer
 * it with a refusal the client can read, then close. The rest of the
 * bytes the transport has go to qr_secure_feed. */
void qr_secure_refuse_hello(qr_secure *s, const uint8_t *first, size_t n);

/* Whether reads are this layer's (its handshake, or sealed records), and
 * if so the buffer the next read goes to, and n bytes read into it (at
 * p). */
static inline bool qr_secure_owns_reads(const qr_secure *s) {
    return s->hs || s->rx;
}
void qr_secure_read_buf(qr_secure *s, uv_buf_t *buf);
void qr_secure_read(qr_secure *s, const uint8_t *p, size_t n);
/* n handshake bytes that were read elsewhere (after qr_secure_refuse_hello). */
void qr_secure_feed(qr_secure *s, const uint8_t *p, size_t n);
/* The peer is gone, or a write failed (status, of the transport). */
void qr_secure_lost(qr_secure *s, int status);
/* The deadline passed. */
void qr_secure_timeout(qr_secure *s);

/* Seal a message's buffers into one (*sealed, *len bytes; the caller frees
 * it); false on no memory. If may_write (nothing is queued before it), a
 * large message goes into the socket piece by piece as it is sealed
 * (try_write): *sent says how much. */
bool qr_secure_seal(qr_secure *s, const uv_buf_t *bufs, int n, bool may_write, uint8_t **sealed,
                    size_t *len, size_t *sent);
void qr_secure_free(qr_secure *s);

static inline bool qr_secure_handshaking(const qr_secure *s) {
    return s->hs != NULL;
}
static inline bool qr_secure_sealed(const qr_secure *s) {
    return s->tx != NULL;
}
/* The session's cipher, or NULL if it is not encrypted. */
static inline const char *qr_secure_cipher(const qr_secure *s) {
    return s->tx ? qr_sealer_cipher(s->tx) : NULL;
}
static inline int qr_secure_refusal(const qr_secure *s) {
    return s->refusal;
}
static inline const char *qr_secure_reason(const qr_secure *s) {
    return s->reason;
}

#endif /* QR_WIRE_SECURE_H */

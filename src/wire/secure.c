/*
 * secure.c - authentication and encryption of a connection (secure.h):
 * drives the handshake of auth.h over the transport within a deadline,
 * answers a peer that cannot authenticate with a reason it can read, and
 * seals and opens the records of seal.h once a session is encrypted. It
 * reaches the transport only through the qr_secure_io it was given.
 *
 * A connection of a job with a secret goes through these states (s->hs
 * is set until the last):
 *
 *   client: connected --HELLO--> wait CHALLENGE --PROOF--> wait RESULT --> done: `connected`
 *   server: accepted ----------> wait HELLO --CHALLENGE--> wait PROOF --RESULT--> done
 *   either: refused: the refusal is written, then the connection is lost
 *           with QR_EAUTH (a client's `connected` gets QR_EAUTH first)
 *   either: the peer gone, or silent past the deadline: a server counts it
 *           as a refusal (QR_EAUTH); a client's `connected` gets the plain
 *           transport status (QR_EPEERLOST, QR_ETIMEDOUT), as for any lost
 *           connection, since a ps restarting or rolling back closes
 *           connections in their handshake too, and the worker retries
 *
 * While in the handshake a connection reads only the bytes of the peer's
 * next message, into hs_buf (so nothing it could not yet trust is ever
 * buffered), owns no staging buffer, and sends nothing from its owner.
 *
 * Peers that cannot take part are told why rather than cut off: a worker
 * without the secret sends a plain request first, which gets an error
 * reply with the reason (its bytes are read and dropped first, so the
 * close that follows is not a reset that loses the reply); a ps without a
 * secret answers a HELLO with a refusing CHALLENGE.
 */
#include "wire/secure.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A plain request read and dropped before it is answered: no larger. */
#define PLAIN_REQUEST_MAX 4096
/* The deadline of a ps without a secret answering a HELLO. */
#define DEFAULT_HANDSHAKE_MS 10000

enum { PLAIN_NONE = 0, PLAIN_HEADER = 1, PLAIN_DRAIN = 2 };

void qr_secure_init(qr_secure *s, const qr_secure_io *io, void *ctx, const char *peer,
                    int handshake_timeout_ms) {
    s->io = io;
    s->ctx = ctx;
    s->peer = peer;
    s->handshake_timeout_ms = handshake_timeout_ms;
}

static bool closing(const qr_secure *s) {
    return s->io->closing(s->ctx);
}

static void close_connection(qr_secure *s, int status) {
    s->io->close(s->ctx, status);
}

static int timeout_ms(const qr_secure *s) {
    return s->handshake_timeout_ms > 0 ? s->handshake_timeout_ms : DEFAULT_HANDSHAKE_MS;
}

/* The handshake failed: say so (qr_last_error holds why), tell the owner
 * of a client (with client_status), send the refusal if there is one, and
 * close. */
static void failed(qr_secure *s, int refusal, int client_status, const void *msg, size_t len) {
    bool client = !s->hs->server;
    s->refusal = refusal ? refusal : QR_HS_MALFORMED;
    s->failed = true;
    snprintf(s->reason, sizeof s->reason, "%s %s: %s", client ? "connection to" : "connection from",
             s->peer, qr_last_error());
    s->io->stop_reading(s->ctx);
    /* The deadline stays: a refusal the peer never lets us write still
     * ends the connection (qr_secure_timeout). */
    int status = client ? client_status : QR_EAUTH;
    if (client) {
        qr__fail(status, "%s", s->reason);
        s->io->connected(s->ctx, status);
        if (closing(s)) return;
    }
    if (len) s->io->send(s->ctx, msg, len, true);
    else close_connection(s, status);
}

/* A refusal: by this side's checks or the peer's word. */
static void refused(qr_secure *s, int refusal, const void *msg, size_t len) {
    failed(s, refusal, QR_EAUTH, msg, len);
}

void qr_secure_lost(qr_secure *s, int status) {
    if (closing(s)) return;
    if (!s->hs || s->failed) { /* a refusal being written: it was refused all the same */
        close_connection(s, s->failed ? QR_EAUTH : status);
        return;
    }
    /* A peer gone mid-handshake failed it, as far as anyone can tell: a
     * ps counts it, and a worker hears why its connection went. */
    qr__fail(QR_EAUTH, "the connection closed during the handshake (%s)", qr_strerror(status));
    failed(s, QR_HS_MALFORMED, status, NULL, 0);
}

void qr_secure_timeout(qr_secure *s) {
    if (closing(s)) return;
    if (!s->hs || s->failed) { /* a refusal that could not be written in time */
        close_connection(s, QR_EAUTH);
        return;
    }
    qr__fail(QR_EAUTH, "the handshake did not complete within %d ms (handshake-timeout-ms)",
             timeout_ms(s));
    failed(s, QR_HS_TIMEOUT, QR_ETIMEDOUT, NULL, 0);
}

static int begin(qr_secure *s, const qr_auth *auth, bool server) {
    s->hs = qr__calloc(1, sizeof *s->hs);
    if (!s->hs) return QR_ENOMEM;
    qr_handshake_start(s->hs, auth, server);
    s->server = server;
    s->io->deadline(s->ctx, timeout_ms(s));
    return QR_OK;
}

int qr_secure_start(qr_secure *s, const qr_auth *auth, bool server) {
    int rc = begin(s, auth, server);
    if (rc || server) return rc;
    uint8_t hello[QR_HS_HELLO_LEN];
    qr_handshake_hello(s->hs, hello);
    s->io->send(s->ctx, hello, sizeof hello, false);
    return QR_OK;
}

void qr_secure_refuse_hello(qr_secure *s, const uint8_t *first, size_t n) {
    if (begin(s, NULL, true)) {
        close_connection(s, QR_ENOMEM);
        return;
    }
    memcpy(s->hs_buf, first, n);
    s->hs_got = n;
}

/* Bytes the message being read has in all. */
static size_t want(const qr_secure *s) {
    if (s->plain == PLAIN_HEADER) return QR_PROTO_HEADER_LEN;
    if (s->plain == PLAIN_DRAIN) return (size_t)QR_MIN(s->drain, (uint64_t)sizeof s->hs_buf);
    if (s->hs->server && s->hs->state == QR_HS_WAIT_HELLO && s->hs_got < 4) return 4;
    return qr_handshake_want(s->hs);
}

static void handshake_buf(qr_secure *s, uv_buf_t *buf) {
    size_t w = s->failed ? 0 : want(s);
    if (w <= s->hs_got) {
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    *buf = uv_buf_init((char *)s->hs_buf + s->hs_got, (unsigned)(w - s->hs_got));
}

/* The session is open: set up its keys, have the transport take its
 * staging buffer, and let the owner in. */
static void done(qr_secure *s) {
    qr_handshake *hs = s->hs;
    bool client = !hs->server;
    s->io->deadline(s->ctx, 0);
    int rc = s->io->open(s->ctx);
    if (!rc && hs->encrypt) {
        s->tx = qr__calloc(2, sizeof *s->tx);
        s->rec = malloc(QR_SEAL_OVERHEAD + QR_SEAL_MAX_RECORD);
        if (!s->tx || !s->rec) {
            rc = qr__fail(QR_ENOMEM, "out of memory for an encrypted connection");
        } else {
            s->rx = s->tx + 1;
            qr_sealer_init(s->tx, hs->aes, hs->key_tx);
            qr_sealer_init(s->rx, hs->aes, hs->key_rx);
        }
    }
    qr__log(QR_LOG_DEBUG, "%s %s: authenticated%s%s", client ? "connection to" : "connection from",
            s->peer, s->tx ? ", encrypted with " : "", s->tx ? qr_sealer_cipher(s->tx) : "");
    qr_handshake_clear(hs);
    free(hs);
    s->hs = NULL;
    if (rc) {
        if (client) s->io->connected(s->ctx, rc);
        close_connection(s, rc);
        return;
    }
    if (client) s->io->connected(s->ctx, QR_OK);
}

/* A plain request (a peer without the secret): its header is in; read
 * and drop the rest, then answer it with the reason. */
static void plain_request(qr_secure *s) {
    qr_frame f;
    if (s->plain == PLAIN_HEADER) {
        if (qr_proto_decode_header(s->hs_buf, PLAIN_REQUEST_MAX, &f) ||
            f.meta_len > PLAIN_REQUEST_MAX) {
            qr__fail(QR_EAUTH, "%s", qr_hs_reason(QR_HS_NO_HANDSHAKE));
            refused(s, QR_HS_NO_HANDSHAKE, NULL, 0);
            return;
        }
        uint64_t head = QR_PROTO_HEADER_LEN + (uint64_t)f.meta_len;
        s->drain = f.meta_len + qr_proto_pad(head) + f.payload_len + qr_proto_pad(f.payload_len);
        /* The reply goes to this request: keep its type and id. */
        s->plain_type = f.type;
        s->plain_id = f.request_id;
        s->plain = PLAIN_DRAIN;
    } else {
        s->drain -= s->hs_got;
    }
    s->hs_got = 0;
    if (s->drain) return;
    char msg[200];
    int n = snprintf(msg, sizeof msg, "this ps requires authentication: %s",
                     qr_hs_reason(QR_HS_NO_HANDSHAKE));
    uint8_t out[QR_PROTO_HEADER_LEN + 256];
    qr_frame reply = {.type = (uint8_t)(s->plain_type | QR_MSG_REPLY),
                      .request_id = s->plain_id, .status = QR_EAUTH,
                      .meta_len = (uint32_t)n};
    qr_proto_encode_header(&reply, out);
    memcpy(out + QR_PROTO_HEADER_LEN, msg, (size_t)n);
    size_t len = QR_PROTO_HEADER_LEN + (size_t)n;
    uint32_t pad = qr_proto_pad(len);
    memset(out + len, 0, pad);
    qr__fail(QR_EAUTH, "%s", qr_hs_reason(QR_HS_NO_HANDSHAKE));
    refused(s, QR_HS_NO_HANDSHAKE, out, len + pad);
}

/* A whole handshake message is in hs_buf. */
static void message_in(qr_secure *s) {
    qr_handshake *hs = s->hs;
    if (s->plain) {
        plain_request(s);
        return;
    }
    if (hs->server && hs->state == QR_HS_WAIT_HELLO && s->hs_got == 4) {
        if (qr_handshake_is_hello(s->hs_buf, 4)) return; /* read on to the whole HELLO */
        uint8_t magic[4] = {QR_PROTO_MAGIC & 0xff, (QR_PROTO_MAGIC >> 8) & 0xff,
                            (QR_PROTO_MAGIC >> 16) & 0xff, QR_PROTO_MAGIC >> 24};
        if (!memcmp(s->hs_buf, magic, 4)) {
            s->plain = PLAIN_HEADER;
            return;
        }
        qr__fail(QR_EAUTH, "the peer sent bytes that are neither a handshake nor a request");
        refused(s, QR_HS_MALFORMED, NULL, 0);
        return;
    }
    uint8_t out[QR_HS_MAX_LEN];
    size_t out_len = 0;
    if (!hs->auth) { /* this ps has no secret; the peer has one */
        qr_handshake_refuse_hello(out);
        qr__fail(QR_EAUTH, "the peer offered to authenticate and this ps has no secret (%s)",
                 qr_hs_reason(QR_HS_NO_SECRET));
        refused(s, QR_HS_NO_SECRET, out, QR_HS_CHALLENGE_LEN);
        return;
    }
    int rc = qr_handshake_step(hs, s->hs_buf, s->hs_got, out, &out_len);
    s->hs_got = 0;
    if (rc) {
        refused(s, hs->refusal, out, out_len);
        return;
    }
    if (out_len) s->io->send(s->ctx, out, out_len, false);
    if (!closing(s) && hs->state == QR_HS_DONE) done(s);
}

void qr_secure_feed(qr_secure *s, const uint8_t *p, size_t n) {
    while (n > 0 && s->hs && !s->failed && !closing(s)) {
        size_t w = want(s);
        size_t take = QR_MIN(n, w - s->hs_got);
        uint8_t *dst = s->hs_buf + s->hs_got;
        if (dst != p) memmove(dst, p, take);
        s->hs_got += take;
        p += take;
        n -= take;
        if (s->hs_got == w) message_in(s);
    }
    if (n > 0 && !s->hs && !closing(s)) {
        /* Neither side may speak between its last handshake message and
         * the other's answer: reads are sized so this never happens. */
        qr__log(QR_LOG_WARN, "closing connection %s %s: bytes before the handshake ended",
                s->server ? "from" : "to", s->peer);
        close_connection(s, QR_EPROTO);
    }
}

/* ---- sealed records ------------------------------------------------------ */

static void records_buf(qr_secure *s, uv_buf_t *buf) {
    size_t cap = QR_SEAL_OVERHEAD + QR_SEAL_MAX_RECORD, n = cap - s->rec_have;
    if (s->rec_have >= QR_SEAL_LEN_BYTES) {
        /* Read to the end of this record and no further: nothing is moved
         * afterwards, and a large payload is read in record-sized reads. */
        uint32_t len = qr_seal_record_len(s->rec);
        if (len) n = QR_SEAL_OVERHEAD + len - s->rec_have;
    }
    *buf = uv_buf_init((char *)s->rec + s->rec_have, (unsigned)n);
}

static void records_read(qr_secure *s, size_t n) {
    s->rec_have += n;
    while (s->rec_have >= QR_SEAL_LEN_BYTES && !closing(s)) {
        uint32_t len = qr_seal_record_len(s->rec);
        if (!len) {
            qr__log(QR_LOG_WARN, "closing connection %s %s: a sealed record of impossible length",
                    s->server ? "from" : "to", s->peer);
            close_connection(s, QR_EAUTH);
            return;
        }
        size_t total = QR_SEAL_OVERHEAD + (size_t)len;
        if (s->rec_have < total) return;
        /* A payload's record usually holds bytes of one destination only
         * (the sender seals each buffer apart): it opens straight into it,
         * saving a copy of every payload byte. */
        uint8_t *dst = s->io->payload_dest(s->ctx, len);
        if (dst ? qr_unseal_to(s->rx, s->rec, len, dst) : qr_unseal(s->rx, s->rec, len)) {
            qr__log(QR_LOG_WARN, "closing connection %s %s: %s", s->server ? "from" : "to",
                    s->peer, qr_last_error());
            close_connection(s, QR_EAUTH);
            return;
        }
        if (dst) s->io->payload_landed(s->ctx, len);
        else s->io->plaintext(s->ctx, s->rec + QR_SEAL_LEN_BYTES, len);
        if (closing(s)) return;
        s->rec_have -= total;
        if (s->rec_have) memmove(s->rec, s->rec + total, s->rec_have);
    }
}

void qr_secure_read_buf(qr_secure *s, uv_buf_t *buf) {
    if (s->hs) handshake_buf(s, buf);
    else records_buf(s, buf);
}

void qr_secure_read(qr_secure *s, const uint8_t *p, size_t n) {
    if (s->hs) qr_secure_feed(s, p, n);
    else records_read(s, n);
}

/* A large sealed message is written in pieces of this size as it is
 * sealed, when nothing is queued before it: the peer opens the first
 * records while the rest are sealed, so the two ends' passes over the
 * payload overlap instead of following each other. */
#define SEAL_FLUSH_BYTES (256 * 1024)

bool qr_secure_seal(qr_secure *s, const uv_buf_t *bufs, int n, bool may_write, uint8_t **sealed,
                    size_t *len, size_t *sent) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += qr_sealed_size(bufs[i].len);
    *sent = 0;
    uint8_t *out = *sealed = malloc(QR_MAX(total, (size_t)1));
    if (!out) return false;
    *len = total;
    bool direct = total > SEAL_FLUSH_BYTES && may_write;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = (const uint8_t *)bufs[i].base;
        for (size_t off = 0; off < bufs[i].len;) {
            size_t take = QR_MIN(bufs[i].len - off, (size_t)SEAL_FLUSH_BYTES);
            at += qr_seal(s->tx, p + off, take, out + at);
            off += take;
            if (!direct || at - *sent < SEAL_FLUSH_BYTES) continue;
            size_t piece = at - *sent;
            int w = s->io->try_write(s->ctx, out + *sent, piece);
            if (w > 0) *sent += (size_t)w;
            if (w < 0 || (size_t)w < piece) direct = false; /* full: the rest queues */
        }
    }
    if (direct && at > *sent) {
        int w = s->io->try_write(s->ctx, out + *sent, at - *sent);
        if (w > 0) *sent += (size_t)w;
    }
    return true;
}

void qr_secure_free(qr_secure *s) {
    if (s->hs) {
        qr_handshake_clear(s->hs);
        free(s->hs);
        s->hs = NULL;
    }
    if (s->tx) {
        qr_sealer_clear(s->tx);
        qr_sealer_clear(s->rx);
        free(s->tx);
    }
    free(s->rec);
}

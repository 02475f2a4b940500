/*
 * conn_secure.c - authentication and encryption of a connection (conn.h):
 * drives the handshake of auth.h over the socket within a deadline,
 * answers a peer that cannot authenticate with a reason it can read, and
 * seals and opens the records of seal.h once a session is encrypted.
 *
 * A connection of a job with a secret goes through these states (c->hs
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
#include "wire/conn_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A plain request read and dropped before it is answered: no larger. */
#define PLAIN_REQUEST_MAX 4096
/* The deadline of a ps without a secret answering a HELLO. */
#define DEFAULT_HANDSHAKE_MS 10000

enum { PLAIN_NONE = 0, PLAIN_HEADER = 1, PLAIN_DRAIN = 2 };

typedef struct hs_write {
    uv_write_t req;
    qr_conn *c;
    bool close_after;
    uint8_t bytes[];
} hs_write;

static void on_hs_written(uv_write_t *req, int status) {
    hs_write *w = (hs_write *)req;
    qr_conn *c = w->c;
    bool close_after = w->close_after;
    free(w);
    if (c->closing) return;
    if (status < 0) qr__conn_handshake_lost(c, qr__conn_from_uv(status));
    else if (close_after) qr__conn_close_with(c, QR_EAUTH);
}

/* Write a handshake message (copied); close once written if close_after. */
static void send_bytes(qr_conn *c, const void *p, size_t n, bool close_after) {
    hs_write *w = malloc(sizeof *w + n);
    if (!w) {
        qr__conn_close_with(c, close_after ? QR_EAUTH : QR_ENOMEM);
        return;
    }
    w->c = c;
    w->close_after = close_after;
    memcpy(w->bytes, p, n);
    uv_buf_t buf = uv_buf_init((char *)w->bytes, (unsigned)n);
    int rc = uv_write(&w->req, &c->h.stream, &buf, 1, on_hs_written);
    if (rc) {
        free(w);
        if (close_after) qr__conn_close_with(c, QR_EAUTH);
        else qr__conn_handshake_lost(c, qr__conn_from_uv(rc));
    }
}

/* The handshake failed: say so (qr_last_error holds why), tell the owner
 * of a client (with client_status), send the refusal if there is one, and
 * close. */
static void failed(qr_conn *c, int refusal, int client_status, const void *msg, size_t len) {
    bool client = !c->hs->server;
    c->refusal = refusal ? refusal : QR_HS_MALFORMED;
    c->hs_failed = true;
    snprintf(c->reason, sizeof c->reason, "%s %s: %s", client ? "connection to" : "connection from",
             c->peer, qr_last_error());
    uv_read_stop(&c->h.stream);
    /* The deadline stays: a refusal the peer never lets us write still
     * ends the connection (on_hs_timeout). */
    int status = client ? client_status : QR_EAUTH;
    if (client && c->ev->connected) {
        qr__fail(status, "%s", c->reason);
        c->ev->connected(c, status);
        if (c->closing) return;
    }
    if (len) send_bytes(c, msg, len, true);
    else qr__conn_close_with(c, status);
}

/* A refusal: by this side's checks or the peer's word. */
static void refused(qr_conn *c, int refusal, const void *msg, size_t len) {
    failed(c, refusal, QR_EAUTH, msg, len);
}

void qr__conn_handshake_lost(qr_conn *c, int status) {
    if (c->closing) return;
    if (!c->hs || c->hs_failed) { /* a refusal being written: it was refused all the same */
        qr__conn_close_with(c, c->hs_failed ? QR_EAUTH : status);
        return;
    }
    /* A peer gone mid-handshake failed it, as far as anyone can tell: a
     * ps counts it, and a worker hears why its connection went. */
    qr__fail(QR_EAUTH, "the connection closed during the handshake (%s)", qr_strerror(status));
    failed(c, QR_HS_MALFORMED, status, NULL, 0);
}

static void on_hs_timeout(uv_timer_t *t) {
    qr_conn *c = t->data;
    if (c->closing) return;
    if (!c->hs || c->hs_failed) { /* a refusal that could not be written in time */
        qr__conn_close_with(c, QR_EAUTH);
        return;
    }
    qr__fail(QR_EAUTH, "the handshake did not complete within %d ms (handshake-timeout-ms)",
             c->opt.handshake_timeout_ms > 0 ? c->opt.handshake_timeout_ms : DEFAULT_HANDSHAKE_MS);
    failed(c, QR_HS_TIMEOUT, QR_ETIMEDOUT, NULL, 0);
}

static int begin(qr_conn *c, const qr_auth *auth, bool server) {
    c->hs = qr__calloc(1, sizeof *c->hs);
    if (!c->hs) return QR_ENOMEM;
    qr_handshake_start(c->hs, auth, server);
    if (!c->hs_timer_ready) {
        uv_timer_init(c->loop, &c->hs_timer); /* cannot fail */
        c->hs_timer.data = c;
        c->hs_timer_ready = true;
        c->open_handles++;
    }
    int ms = c->opt.handshake_timeout_ms > 0 ? c->opt.handshake_timeout_ms : DEFAULT_HANDSHAKE_MS;
    uv_timer_start(&c->hs_timer, on_hs_timeout, (uint64_t)ms, 0);
    return QR_OK;
}

int qr__conn_handshake_start(qr_conn *c, bool server) {
    int rc = begin(c, c->opt.auth, server);
    if (rc || server) return rc;
    uint8_t hello[QR_HS_HELLO_LEN];
    qr_handshake_hello(c->hs, hello);
    send_bytes(c, hello, sizeof hello, false);
    return QR_OK;
}

void qr__conn_refuse_hello(qr_conn *c, const uint8_t *first, size_t n) {
    if (begin(c, NULL, true)) {
        qr__conn_close_with(c, QR_ENOMEM);
        return;
    }
    memcpy(c->hs_buf, first, n);
    c->hs_got = n;
}

/* Bytes the message being read has in all. */
static size_t want(const qr_conn *c) {
    if (c->hs_plain == PLAIN_HEADER) return QR_PROTO_HEADER_LEN;
    if (c->hs_plain == PLAIN_DRAIN) return (size_t)QR_MIN(c->hs_drain, (uint64_t)sizeof c->hs_buf);
    if (c->hs->server && c->hs->state == QR_HS_WAIT_HELLO && c->hs_got < 4) return 4;
    return qr_handshake_want(c->hs);
}

void qr__conn_handshake_alloc(qr_conn *c, uv_buf_t *buf) {
    size_t w = c->hs_failed ? 0 : want(c);
    if (w <= c->hs_got) {
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    *buf = uv_buf_init((char *)c->hs_buf + c->hs_got, (unsigned)(w - c->hs_got));
}

/* The session is open: set up its keys, take the staging buffer, and let
 * the owner in. */
static void done(qr_conn *c) {
    qr_handshake *hs = c->hs;
    bool client = !hs->server;
    uv_timer_stop(&c->hs_timer);
    int rc = qr__conn_alloc_staging(c);
    if (!rc && hs->encrypt) {
        c->tx = qr__calloc(2, sizeof *c->tx);
        c->rec = malloc(QR_SEAL_OVERHEAD + QR_SEAL_MAX_RECORD);
        if (!c->tx || !c->rec) {
            rc = qr__fail(QR_ENOMEM, "out of memory for an encrypted connection");
        } else {
            c->rx = c->tx + 1;
            qr_sealer_init(c->tx, hs->aes, hs->key_tx);
            qr_sealer_init(c->rx, hs->aes, hs->key_rx);
        }
    }
    qr__log(QR_LOG_DEBUG, "%s %s: authenticated%s%s", client ? "connection to" : "connection from",
            c->peer, c->tx ? ", encrypted with " : "", c->tx ? qr_sealer_cipher(c->tx) : "");
    qr_handshake_clear(hs);
    free(hs);
    c->hs = NULL;
    if (rc) {
        if (client && c->ev->connected) c->ev->connected(c, rc);
        qr__conn_close_with(c, rc);
        return;
    }
    if (client && c->ev->connected) c->ev->connected(c, QR_OK);
}

/* A plain request (a peer without the secret): its header is in; read
 * and drop the rest, then answer it with the reason. */
static void plain_request(qr_conn *c) {
    qr_frame f;
    if (c->hs_plain == PLAIN_HEADER) {
        if (qr_proto_decode_header(c->hs_buf, PLAIN_REQUEST_MAX, &f) ||
            f.meta_len > PLAIN_REQUEST_MAX) {
            qr__fail(QR_EAUTH, "%s", qr_hs_reason(QR_HS_NO_HANDSHAKE));
            refused(c, QR_HS_NO_HANDSHAKE, NULL, 0);
            return;
        }
        uint64_t head = QR_PROTO_HEADER_LEN + (uint64_t)f.meta_len;
        c->hs_drain = f.meta_len + qr_proto_pad(head) + f.payload_len + qr_proto_pad(f.payload_len);
        /* The reply goes to this request: keep its type and id. */
        c->frame = f;
        c->hs_plain = PLAIN_DRAIN;
    } else {
        c->hs_drain -= c->hs_got;
    }
    c->hs_got = 0;
    if (c->hs_drain) return;
    char msg[200];
    int n = snprintf(msg, sizeof msg, "this ps requires authentication: %s",
                     qr_hs_reason(QR_HS_NO_HANDSHAKE));
    uint8_t out[QR_PROTO_HEADER_LEN + 256];
    qr_frame reply = {.type = (uint8_t)(c->frame.type | QR_MSG_REPLY),
                      .request_id = c->frame.request_id, .status = QR_EAUTH,
                      .meta_len = (uint32_t)n};
    qr_proto_encode_header(&reply, out);
    memcpy(out + QR_PROTO_HEADER_LEN, msg, (size_t)n);
    size_t len = QR_PROTO_HEADER_LEN + (size_t)n;
    uint32_t pad = qr_proto_pad(len);
    memset(out + len, 0, pad);
    qr__fail(QR_EAUTH, "%s", qr_hs_reason(QR_HS_NO_HANDSHAKE));
    refused(c, QR_HS_NO_HANDSHAKE, out, len + pad);
}

/* A whole handshake message is in hs_buf. */
static void message_in(qr_conn *c) {
    qr_handshake *hs = c->hs;
    if (c->hs_plain) {
        plain_request(c);
        return;
    }
    if (hs->server && hs->state == QR_HS_WAIT_HELLO && c->hs_got == 4) {
        if (qr_handshake_is_hello(c->hs_buf, 4)) return; /* read on to the whole HELLO */
        uint8_t magic[4] = {QR_PROTO_MAGIC & 0xff, (QR_PROTO_MAGIC >> 8) & 0xff,
                            (QR_PROTO_MAGIC >> 16) & 0xff, QR_PROTO_MAGIC >> 24};
        if (!memcmp(c->hs_buf, magic, 4)) {
            c->hs_plain = PLAIN_HEADER;
            return;
        }
        qr__fail(QR_EAUTH, "the peer sent bytes that are neither a handshake nor a request");
        refused(c, QR_HS_MALFORMED, NULL, 0);
        return;
    }
    uint8_t out[QR_HS_MAX_LEN];
    size_t out_len = 0;
    if (!hs->auth) { /* this ps has no secret; the peer has one */
        qr_handshake_refuse_hello(out);
        qr__fail(QR_EAUTH, "the peer offered to authenticate and this ps has no secret (%s)",
                 qr_hs_reason(QR_HS_NO_SECRET));
        refused(c, QR_HS_NO_SECRET, out, QR_HS_CHALLENGE_LEN);
        return;
    }
    int rc = qr_handshake_step(hs, c->hs_buf, c->hs_got, out, &out_len);
    c->hs_got = 0;
    if (rc) {
        refused(c, hs->refusal, out, out_len);
        return;
    }
    if (out_len) send_bytes(c, out, out_len, false);
    if (!c->closing && hs->state == QR_HS_DONE) done(c);
}

void qr__conn_handshake_feed(qr_conn *c, const uint8_t *p, size_t n) {
    while (n > 0 && c->hs && !c->hs_failed && !c->closing) {
        size_t w = want(c);
        size_t take = QR_MIN(n, w - c->hs_got);
        uint8_t *dst = c->hs_buf + c->hs_got;
        if (dst != p) memmove(dst, p, take);
        c->hs_got += take;
        p += take;
        n -= take;
        if (c->hs_got == w) message_in(c);
    }
    if (n > 0 && !c->hs && !c->closing) {
        /* Neither side may speak between its last handshake message and
         * the other's answer: reads are sized so this never happens. */
        qr__log(QR_LOG_WARN, "closing connection %s %s: bytes before the handshake ended",
                c->accepted ? "from" : "to", c->peer);
        qr__conn_close_with(c, QR_EPROTO);
    }
}

/* ---- sealed records ------------------------------------------------------ */

void qr__conn_records_alloc(qr_conn *c, uv_buf_t *buf) {
    size_t cap = QR_SEAL_OVERHEAD + QR_SEAL_MAX_RECORD, n = cap - c->rec_have;
    if (c->rec_have >= QR_SEAL_LEN_BYTES) {
        /* Read to the end of this record and no further: nothing is moved
         * afterwards, and a large payload is read in record-sized reads. */
        uint32_t len = qr_seal_record_len(c->rec);
        if (len) n = QR_SEAL_OVERHEAD + len - c->rec_have;
    }
    *buf = uv_buf_init((char *)c->rec + c->rec_have, (unsigned)n);
}

void qr__conn_records_read(qr_conn *c, size_t n) {
    c->rec_have += n;
    while (c->rec_have >= QR_SEAL_LEN_BYTES && !c->closing) {
        uint32_t len = qr_seal_record_len(c->rec);
        if (!len) {
            qr__log(QR_LOG_WARN, "closing connection %s %s: a sealed record of impossible length",
                    c->accepted ? "from" : "to", c->peer);
            qr__conn_close_with(c, QR_EAUTH);
            return;
        }
        size_t total = QR_SEAL_OVERHEAD + (size_t)len;
        if (c->rec_have < total) return;
        /* A payload's record usually holds bytes of one destination only
         * (the sender seals each buffer apart): it opens straight into it,
         * saving a copy of every payload byte. */
        uint8_t *dst = qr__conn_payload_dest(c, len);
        if (dst ? qr_unseal_to(c->rx, c->rec, len, dst) : qr_unseal(c->rx, c->rec, len)) {
            qr__log(QR_LOG_WARN, "closing connection %s %s: %s", c->accepted ? "from" : "to",
                    c->peer, qr_last_error());
            qr__conn_close_with(c, QR_EAUTH);
            return;
        }
        if (dst) qr__conn_payload_landed(c, len);
        else qr__conn_process_bytes(c, c->rec + QR_SEAL_LEN_BYTES, len);
        if (c->closing) return;
        c->rec_have -= total;
        if (c->rec_have) memmove(c->rec, c->rec + total, c->rec_have);
    }
}

/* A large sealed message is written in pieces of this size as it is
 * sealed, when nothing is queued before it: the peer opens the first
 * records while the rest are sealed, so the two ends' passes over the
 * payload overlap instead of following each other. */
#define SEAL_FLUSH_BYTES (256 * 1024)

bool qr__conn_seal_send(qr_conn *c, send_req *r, const uv_buf_t *bufs, int n, size_t *sent) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += qr_sealed_size(bufs[i].len);
    *sent = 0;
    r->sealed = malloc(QR_MAX(total, (size_t)1));
    if (!r->sealed) return false;
    r->bytes = total;
    bool direct = total > SEAL_FLUSH_BYTES && uv_stream_get_write_queue_size(&c->h.stream) == 0;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = (const uint8_t *)bufs[i].base;
        for (size_t off = 0; off < bufs[i].len;) {
            size_t take = QR_MIN(bufs[i].len - off, (size_t)SEAL_FLUSH_BYTES);
            at += qr_seal(c->tx, p + off, take, r->sealed + at);
            off += take;
            if (!direct || at - *sent < SEAL_FLUSH_BYTES) continue;
            uv_buf_t b = uv_buf_init((char *)r->sealed + *sent, (unsigned)(at - *sent));
            int w = uv_try_write(&c->h.stream, &b, 1);
            if (w > 0) *sent += (size_t)w;
            if (w < 0 || (size_t)w < b.len) direct = false; /* full: the rest queues */
        }
    }
    if (direct && at > *sent) {
        uv_buf_t b = uv_buf_init((char *)r->sealed + *sent, (unsigned)(at - *sent));
        int w = uv_try_write(&c->h.stream, &b, 1);
        if (w > 0) *sent += (size_t)w;
    }
    return true;
}

void qr__conn_secure_free(qr_conn *c) {
    if (c->hs) {
        qr_handshake_clear(c->hs);
        free(c->hs);
        c->hs = NULL;
    }
    if (c->tx) {
        qr_sealer_clear(c->tx);
        qr_sealer_clear(c->rx);
        free(c->tx);
    }
    free(c->rec);
}

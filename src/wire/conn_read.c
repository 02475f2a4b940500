/*
 * conn_read.c - the read path of the libuv transport (conn_internal.h):
 * a connection's bytes in, one message at a time, into the buffers its
 * owner names (qr_conn_expect), and the owner's pause and resume.
 *
 * Receive state machine (META includes the pad after the meta, TRAILER is
 * the pad after the payload; proto.h):
 *
 *     HEADER --32--> META --meta+pad--> PAYLOAD --payload_len--> TRAILER --pad--+
 *       ^                                                                        |
 *       +------------------------------ `message` event <-----------------------+
 *
 * Two ways bytes come in. While a large payload is being received, the
 * alloc callback hands libuv the remaining part of the current destination
 * buffer, so the kernel copies straight into the variable or gradient
 * (no staging copy). Otherwise it hands out the connection's 64 KiB
 * staging buffer, and qr__conn_process_bytes() walks the state machine
 * over it; that lets one read() carry a whole small request (header, meta
 * and payload), which keeps small round trips at raw-socket cost.
 *
 * While the security layer owns the reads (its handshake, then sealed
 * records: conn_secure.c) on_alloc and on_read hand them to it, and it
 * gives back plaintext for the state machine. What a listener's peers may
 * hold is conn_limits.c's: the state machine tells it where a message
 * begins, its header and its end, and it may stop reading a connection
 * until there is room.
 */
#include "wire/conn_internal.h"

#include <stdlib.h>
#include <string.h>

/* Below this many bytes still to come, a payload goes through the staging
 * buffer: the extra copy is cheaper than another read() call. */
#define IN_PLACE_MIN (16 * 1024)
/* After a message with a payload of STAGING_BYTES or more, the next two
 * reads into the staging buffer ask for only this much. A connection that
 * carries one large tensor usually carries another soon: right after it
 * (pushes in a row), or after one small message in between (a push, then
 * a pull request; a push's small answer, then a pull's large one). A full
 * 64 KiB staging read would pull the tensor's first 64 KiB through the
 * staging buffer and copy it again: at 1 MiB that is 6% more bytes
 * copied. 4 KiB still holds the header and meta of any common request. */
#define HEAD_READ_BYTES (4 * 1024)

/* The staging buffer, made once the peer is authenticated. */
int qr__conn_alloc_staging(qr_conn *c) {
    if (c->staging) return QR_OK;
    c->staging = qr__aligned_alloc_uninit(STAGING_BYTES);
    if (!c->staging) return qr__fail(QR_ENOMEM, "out of memory for a connection");
    return QR_OK;
}

static void header_admitted(qr_conn *c);

static void rx_reset(qr_conn *c) {
    c->state = RX_HEADER;
    c->hdr_got = 0;
    c->meta_got = 0;
    c->niov = 0;
    c->iov_idx = 0;
    c->iov_off = 0;
    c->discard = false;
    c->payload_got = 0;
    c->trailer_left = 0;
}

/* Make iov[0..n) the destination of the payload's next bytes: all of the
 * `left` still to come (exact), or at most that. */
static int set_iovs(qr_conn *c, const qr_iov *iov, int n, uint64_t left, bool exact) {
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += iov[i].len;
    if (exact ? total != left : total > left)
        return qr__fail(QR_EINTERNAL, "expected buffers hold %llu bytes, payload has %llu to come",
                        (unsigned long long)total, (unsigned long long)left);
    if (n > c->iov_cap) {
        qr_iov *grown = realloc(c->iov, (size_t)n * sizeof *grown);
        if (!grown) return qr__fail(QR_ENOMEM, "out of memory for %d receive buffers", n);
        c->iov = grown;
        c->iov_cap = n;
    }
    if (n) memcpy(c->iov, iov, (size_t)n * sizeof *iov);
    c->niov = n;
    c->discard = false;
    return QR_OK;
}

int qr_conn_expect(qr_conn *c, const qr_iov *iov, int n) {
    return set_iovs(c, iov, n, c->frame.payload_len, true);
}

static void skip_full_iovs(qr_conn *c);

int qr_conn_expect_rest(qr_conn *c, const qr_iov *iov, int n) {
    if (c->state != RX_PAYLOAD)
        return qr__fail(QR_EINTERNAL, "qr_conn_expect_rest outside a payload");
    c->iov_idx = 0;
    c->iov_off = 0;
    if (n == 0) {
        c->niov = 0;
        c->discard = true;
        return QR_OK;
    }
    int rc = set_iovs(c, iov, n, c->frame.payload_len - c->payload_got, false);
    if (rc) {
        c->niov = 0;
        c->discard = true; /* the stream stays in step */
        return rc;
    }
    skip_full_iovs(c);
    return QR_OK;
}

/* A meta buffer grown beyond this for one message is given back after it:
 * a peer could otherwise make the ps keep up to QR_PROTO_MAX_META (1 MiB)
 * per connection with one message each. */
#define META_KEEP_BYTES 4096

static void message_done(qr_conn *c) {
    qr_frame f = c->frame;
    c->large_recent = (uint8_t)(((c->large_recent << 1) | (f.payload_len >= STAGING_BYTES)) & 3);
    c->messages_in++;
    if (c->ev->message) c->ev->message(c, &f, c->meta);
    if (c->closing) return;
    rx_reset(c);
    if (c->lim) qr__conn_limits_done(c);
    if (c->meta_cap > META_KEEP_BYTES) {
        free(c->meta);
        c->meta = NULL;
        c->meta_cap = 0;
    }
}

/* Skip empty destination buffers so iov_idx names one with room left. */
static void skip_full_iovs(qr_conn *c) {
    while (c->iov_idx < c->niov && c->iov_off == c->iov[c->iov_idx].len) {
        c->iov_idx++;
        c->iov_off = 0;
    }
}

/* The payload is in: skip its pad, if any, before the message is done
 * (the next header starts after it). */
static void payload_done(qr_conn *c) {
    c->trailer_left = qr_proto_pad(c->frame.payload_len);
    if (c->trailer_left) c->state = RX_TRAILER;
    else message_done(c);
}

void qr__conn_payload_advance(qr_conn *c, size_t n) {
    c->payload_got += n;
    if (!c->discard) {
        c->iov_off += n;
        skip_full_iovs(c);
        if (c->ev->payload) c->ev->payload(c, c->payload_got);
        /* Buffers named by qr_conn_expect_rest for part of what was left
         * are full, and the owner named no more: the rest is discarded. */
        if (!c->discard && c->iov_idx == c->niov) c->discard = true;
    }
    if (c->payload_got == c->frame.payload_len) payload_done(c);
}

static void start_payload(qr_conn *c) {
    c->state = RX_PAYLOAD;
    c->niov = 0;
    c->discard = true; /* unless the owner calls qr_conn_expect */
    int rc = c->ev->header ? c->ev->header(c, &c->frame, c->meta) : QR_OK;
    if (c->closing) return;
    if (rc) {
        qr__log(QR_LOG_WARN, "closing connection from %s: %s", c->peer, qr_last_error());
        qr__conn_close_with(c, rc);
        return;
    }
    c->iov_idx = 0;
    c->iov_off = 0;
    if (!c->discard) skip_full_iovs(c);
    if (!c->discard && c->iov_idx == c->niov) c->discard = true; /* (empty buffers only) */
    else if (c->discard && c->reserved) qr__conn_limits_keep(c, c->meta_want); /* read into staging */
    if (c->frame.payload_len == 0) payload_done(c);
}

static void header_done(qr_conn *c) {
    if (qr_proto_decode_header(c->hdr, c->opt.max_payload, &c->frame)) {
        /* Not a frame: a peer with a secret opens with a HELLO instead,
         * which a ps without one answers with the reason. */
        if (!c->opt.auth && !c->messages_in && qr_handshake_is_hello(c->hdr, sizeof c->hdr)) {
            qr_secure_refuse_hello(&c->sec, c->hdr, sizeof c->hdr);
            return;
        }
        qr__log(QR_LOG_WARN, "closing connection from %s: %s", c->peer, qr_last_error());
        qr__conn_close_with(c, QR_EPROTO);
        return;
    }
    c->meta_want = c->frame.meta_len + qr_proto_pad(QR_PROTO_HEADER_LEN + (uint64_t)c->frame.meta_len);
    /* Nothing is allocated for the message before the budget has room. */
    if (c->lim && !qr__conn_limits_admit(c)) return;
    header_admitted(c);
}

/* The header is in and the budget has room: receive the meta. */
static void header_admitted(qr_conn *c) {
    if (c->meta_want > c->meta_cap) {
        size_t cap = QR_MAX(c->meta_want, 256u);
        uint8_t *m = realloc(c->meta, cap);
        if (!m) {
            qr__conn_close_with(c, QR_ENOMEM);
            return;
        }
        c->meta = m;
        c->meta_cap = cap;
    }
    c->state = RX_META;
    c->meta_got = 0;
    if (c->meta_want == 0) start_payload(c);
}

/* Reading stopped (the owner paused the connection, or the budget has no
 * room for its next message) with n bytes of this read left: keep them
 * for when it goes on (walk_held), after any kept already (the security
 * layer may hand in the plaintext of several records of one read). */
static void hold(qr_conn *c, const uint8_t *p, size_t n) {
    uint8_t *held = realloc(c->held, c->held_len + n);
    if (!held) {
        qr__fail(QR_ENOMEM, "out of memory holding %zu bytes read from %s", n, c->peer);
        qr__conn_close_with(c, QR_ENOMEM);
        return;
    }
    memcpy(held + c->held_len, p, n);
    c->held = held;
    c->held_len += n;
}

/* Walk the state machine over n bytes received into the staging buffer. */
void qr__conn_process_bytes(qr_conn *c, const uint8_t *p, size_t n) {
    while (n > 0 && !c->closing) {
        if (qr__conn_rx_stopped(c)) {
            hold(c, p, n);
            return;
        }
        if (qr_secure_handshaking(&c->sec)) { /* a plain ps answering a HELLO (header_done) */
            qr_secure_feed(&c->sec, p, n);
            return;
        }
        size_t take;
        switch (c->state) {
        case RX_HEADER:
            if (c->hdr_got == 0 && c->lim) qr__conn_limits_begin(c);
            take = QR_MIN(n, QR_PROTO_HEADER_LEN - c->hdr_got);
            memcpy(c->hdr + c->hdr_got, p, take);
            c->hdr_got += take;
            if (c->hdr_got == QR_PROTO_HEADER_LEN) header_done(c);
            break;
        case RX_META:
            take = QR_MIN(n, c->meta_want - c->meta_got);
            memcpy(c->meta + c->meta_got, p, take);
            c->meta_got += take;
            if (c->meta_got == c->meta_want) start_payload(c);
            break;
        case RX_PAYLOAD:
            take = (size_t)QR_MIN((uint64_t)n, c->frame.payload_len - c->payload_got);
            if (!c->discard) {
                qr_iov *v = &c->iov[c->iov_idx];
                take = QR_MIN(take, v->len - c->iov_off);
                memcpy((uint8_t *)v->base + c->iov_off, p, take);
            }
            qr__conn_payload_advance(c, take);
            break;
        case RX_TRAILER:
            take = QR_MIN(n, c->trailer_left);
            c->trailer_left -= (uint32_t)take;
            if (c->trailer_left == 0) message_done(c);
            break;
        default:
            return;
        }
        p += take;
        n -= take;
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    qr_conn *c = h->data;
    if (qr_secure_owns_reads(&c->sec)) { /* the handshake, or sealed records */
        qr_secure_read_buf(&c->sec, buf);
        return;
    }
    if (c->state == RX_PAYLOAD && !c->discard && c->iov_idx < c->niov) {
        qr_iov *v = &c->iov[c->iov_idx];
        size_t rem = v->len - c->iov_off;
        if (rem >= IN_PLACE_MIN) {
            c->in_place = true;
            c->in_place_len = rem;
            buf->base = (char *)v->base + c->iov_off;
            buf->len = rem;
            return;
        }
    }
    c->in_place = false;
    if (c->skip_read) {
        c->skip_read = false;
        *buf = uv_buf_init(NULL, 0); /* libuv answers UV_ENOBUFS, see on_read */
        return;
    }
    buf->base = (char *)c->staging;
    buf->len = c->large_recent ? HEAD_READ_BYTES : STAGING_BYTES;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    qr_conn *c = s->data;
    if (c->closing) return;
    qr_conn_reclaim(c); /* the peer speaks: it may have read what was lent */
    if (nread == UV_ENOBUFS) return; /* our own skip_read: not an error */
    if (nread < 0) {
        if (nread != UV_EOF)
            qr__log(QR_LOG_DEBUG, "read from %s failed: %s", c->peer, uv_strerror((int)nread));
        if (qr_secure_handshaking(&c->sec)) qr_secure_lost(&c->sec, qr__conn_from_uv((int)nread));
        else qr__conn_close_with(c, qr__conn_from_uv((int)nread));
        return;
    }
    if (nread == 0) return; /* EAGAIN; not end of stream */
    if (qr_secure_owns_reads(&c->sec)) {
        qr_secure_read(&c->sec, (const uint8_t *)buf->base, (size_t)nread);
    } else if (c->in_place) {
        qr__conn_payload_advance(c, (size_t)nread);
        /* A read that filled its buffer makes libuv read again at once.
         * When that read ended a large message, the peer is almost always
         * waiting for our answer and the read would only return EAGAIN:
         * skip it. libuv's epoll watch is level-triggered, so bytes that
         * did arrive are still reported on the next turn of the loop. */
        c->skip_read = (size_t)nread == c->in_place_len && c->state == RX_HEADER;
    } else {
        qr__conn_process_bytes(c, (const uint8_t *)buf->base, (size_t)nread);
    }
}

int qr__conn_start_reading(qr_conn *c) {
    int rc = uv_read_start(&c->h.stream, on_alloc, on_read);
    if (rc) return qr__fail(QR_EIO, "cannot read from %s: %s", c->peer, uv_strerror(rc));
    return QR_OK;
}

/* A resumed connection's held bytes, walked before it reads again (from
 * the prepare handle, not inside qr_conn_resume: the owner resumes from
 * its own callbacks, which must not run its message callbacks again). The
 * walk may pause it again, holding what is left. */
void qr__conn_walk_held(qr_conn *c) {
    if (!c->held || qr__conn_rx_stopped(c) || c->closing) return;
    uint8_t *held = c->held;
    size_t len = c->held_len;
    c->held = NULL;
    c->held_len = 0;
    qr__conn_process_bytes(c, held, len);
    free(held);
    if (!qr__conn_rx_stopped(c) && !c->closing && !c->held && qr__conn_start_reading(c))
        qr__conn_close_with(c, QR_EIO);
}

/* The budget made room for the header it stopped at (conn_limits.c):
 * carry on from it, then with the bytes held behind it, or read again. */
void qr__conn_budget_granted(qr_conn *c) {
    c->budget_granted = false;
    if (c->closing) return;
    qr__conn_limits_unstall(c);
    if (c->closing) return;
    header_admitted(c);
    if (!c->held && !qr__conn_rx_stopped(c) && !c->closing && qr__conn_start_reading(c))
        qr__conn_close_with(c, QR_EIO);
}

void qr_conn_pause(qr_conn *c) {
    if (c->paused || c->closing) return;
    c->paused = true;
    uv_read_stop(&c->h.stream);
    if (c->lim) qr__conn_limits_stall(c);
}

void qr_conn_resume(qr_conn *c) {
    if (!c->paused || c->closing) return;
    c->paused = false;
    /* Waiting for the budget, or given room and not on yet (on_defer):
     * that path reads it again. */
    if (c->budget_wait || c->budget_granted) return;
    if (c->lim) qr__conn_limits_unstall(c); /* which may close it: a deadline had passed */
    if (c->closing) return;
    if (c->held) qr__conn_defer(c); /* walk_held, which then reads again */
    else if (qr__conn_start_reading(c)) qr__conn_close_with(c, QR_EIO);
}

bool qr_conn_paused(const qr_conn *c) {
    return c->paused;
}

/*
 * conn_limits.c - what one peer can make a listener (a ps) hold, whatever
 * the authentication: the bounds of docs/SECURITY.md ("What one peer can
 * hold").
 *
 * Without them anyone who reaches the port could, without a secret, make
 * a ps allocate a receive buffer per connection by sending a PUSH header
 * and all but the last byte of its body (500 connections: 8 MB -> 555 MB,
 * none ever closed), hold a connection forever by sending nothing, or by
 * sending a byte now and then. Three bounds, set by the listener's options
 * (conn.h) and shared by the connections it accepted:
 *
 *  - A message's deadline: once its first byte has come, a message must be
 *    complete within max(message_timeout_ms, its size at message_min_rate)
 *    (the size is known once its header is in: until then the minimum).
 *  - The first message's deadline: a connection that has completed no
 *    message first_message_timeout_ms after it opened is closed (with a
 *    secret, the handshake's own deadline comes first).
 *  - A budget of bytes for the messages being received: a message's meta
 *    and payload are counted from its header until it is done; when a
 *    new one would take the total past max_incomplete_bytes it waits, its
 *    connection not read from, in a queue (first come, first served) until
 *    others complete or are closed. One alone always goes ahead (a message
 *    larger than the budget is not refused for it), and a message under
 *    STAGING_BYTES never waits: each connection's staging buffer bounds
 *    those already. A waiting connection holds only its header and what
 *    its last read brought (at most the staging buffer).
 *
 * The deadlines run only while the connection is read from: time it was
 * paused by its owner (a ps whose replies to it pile up, or whose push
 * waits for a checkpoint) or waited for the budget is not the peer's, nor
 * time the loop itself was busy elsewhere (a timer that fires late). One
 * timer per connection, armed lazily: a message that completes before the
 * timer is due costs a clock read and a comparison, not a timer operation;
 * a timer that fires re-arms for whatever is due next, or stops.
 *
 * A connection closed by a deadline is logged with its peer and the reason
 * (five lines a second at most; the rest are counted into the next line)
 * and is lost with QR_ETIMEDOUT.
 */
#include "wire/conn_internal.h"

#include <stdio.h>
#include <stdlib.h>

struct qr_conn_limits {
    int refs; /* the listener and each connection it accepted */
    uint64_t message_timeout_ms;
    uint64_t min_rate; /* bytes a second */
    uint64_t first_message_timeout_ms;
    uint64_t max_bytes;
    uint64_t in_flight;          /* reserved by the messages being received */
    qr_conn *wait_head, *wait_tail;
    qr_log_limit close_log, wait_log;
};

#define CLOSE_LOGS_PER_SEC 5
/* A timer this much later than it was asked for means the loop was busy
 * (a large apply, a checkpoint): that time is not counted against the
 * peer, whose bytes may be waiting in the socket. */
#define LATE_MS 500

int qr__conn_limits_new(const qr_conn_options *opt, qr_conn_limits **out) {
    *out = NULL;
    if (opt->message_timeout_ms <= 0 && opt->first_message_timeout_ms <= 0 &&
        !opt->max_incomplete_bytes)
        return QR_OK;
    qr_conn_limits *lim = qr__calloc(1, sizeof *lim);
    if (!lim) return QR_ENOMEM;
    lim->refs = 1;
    lim->message_timeout_ms = (uint64_t)QR_MAX(opt->message_timeout_ms, 0);
    lim->min_rate = opt->message_min_rate;
    lim->first_message_timeout_ms = (uint64_t)QR_MAX(opt->first_message_timeout_ms, 0);
    lim->max_bytes = opt->max_incomplete_bytes;
    *out = lim;
    return QR_OK;
}

void qr__conn_limits_unref(qr_conn_limits *lim) {
    if (lim && --lim->refs == 0) free(lim);
}

/* ---- deadlines ------------------------------------------------------------ */

static void on_timer(uv_timer_t *t);

/* Have the timer fire at `due` (loop ms) at the latest. */
static void arm(qr_conn *c, uint64_t due) {
    if (c->lim_armed && c->lim_due <= due) return; /* it looks again then */
    uint64_t now = uv_now(c->loop);
    c->lim_armed = true;
    c->lim_due = due;
    uv_timer_start(&c->lim_timer, on_timer, due > now ? due - now : 0, 0);
}

/* Bytes of the current message in so far. */
static uint64_t message_got(const qr_conn *c) {
    if (c->state == RX_HEADER) return c->hdr_got;
    return QR_PROTO_HEADER_LEN + c->meta_got + c->payload_got;
}

static void close_logged(qr_conn *c, const char *why) {
    uint64_t dropped;
    if (qr__log_allow(&c->lim->close_log, CLOSE_LOGS_PER_SEC, &dropped)) {
        char more[80] = "";
        if (dropped)
            snprintf(more, sizeof more, " (and %llu more closed since the last report)",
                     (unsigned long long)dropped);
        qr__log(QR_LOG_WARN, "closing connection from %s: %s%s", c->peer, why, more);
    }
    qr__conn_close_with(c, QR_ETIMEDOUT);
}

static void close_slow(qr_conn *c, uint64_t now) {
    char why[320];
    double secs = (double)(now - c->msg_start_ms) / 1000.0;
    if (c->state == RX_HEADER)
        snprintf(why, sizeof why, "a message header was not complete %.1f s after it began "
                 "(%zu of %d bytes; message-timeout-ms)", secs, c->hdr_got, QR_PROTO_HEADER_LEN);
    else
        snprintf(why, sizeof why, "a %s message of %llu bytes was not complete %.1f s after it "
                 "began (%llu received; a message may take max(message-timeout-ms, its size at "
                 "message-min-rate-kb))", qr_msg_name(c->frame.type),
                 (unsigned long long)(QR_PROTO_HEADER_LEN + c->meta_want + c->frame.payload_len),
                 secs, (unsigned long long)message_got(c));
    close_logged(c, why);
}

/* Close the connection if a deadline has passed, else arm the timer for
 * the next one (if any). */
static void check(qr_conn *c) {
    qr_conn_limits *lim = c->lim;
    uint64_t now = uv_now(c->loop);
    if (lim->message_timeout_ms && qr__conn_rx_busy(c)) {
        uint64_t due = c->msg_start_ms + c->msg_window_ms;
        if (now >= due) close_slow(c, now);
        else arm(c, due);
        return;
    }
    if (lim->first_message_timeout_ms && c->messages_in == 0) {
        uint64_t due = c->opened_ms + lim->first_message_timeout_ms;
        if (now < due) {
            arm(c, due);
            return;
        }
        char why[160];
        snprintf(why, sizeof why, "no complete message %.1f s after it opened "
                 "(first-message-timeout-ms)", (double)(now - c->opened_ms) / 1000.0);
        close_logged(c, why);
    }
}

/* Time that is not the peer's moves its deadlines on. */
static void shift(qr_conn *c, uint64_t ms) {
    c->msg_start_ms += ms;
    c->opened_ms += ms;
}

static void on_timer(uv_timer_t *t) {
    qr_conn *c = t->data;
    c->lim_armed = false;
    if (c->closing || c->stalled_since) return; /* qr__conn_limits_unstall arms it again */
    uint64_t now = uv_now(c->loop);
    if (now > c->lim_due + LATE_MS) shift(c, now - c->lim_due);
    check(c);
}

static void on_timer_closed(uv_handle_t *h) {
    qr__conn_release(h->data);
}

void qr__conn_limits_attach(qr_conn *c, qr_conn_limits *lim) {
    c->lim = lim;
    lim->refs++;
    c->opened_ms = uv_now(c->loop);
    uv_timer_init(c->loop, &c->lim_timer); /* cannot fail */
    c->lim_timer.data = c;
    c->lim_timer_ready = true;
    c->open_handles++;
    if (lim->first_message_timeout_ms) arm(c, c->opened_ms + lim->first_message_timeout_ms);
}

void qr__conn_limits_begin(qr_conn *c) {
    c->msg_start_ms = uv_now(c->loop);
    c->msg_window_ms = c->lim->message_timeout_ms;
    if (c->msg_window_ms) arm(c, c->msg_start_ms + c->msg_window_ms);
}

void qr__conn_limits_stall(qr_conn *c) {
    if (!c->stalled_since) c->stalled_since = QR_MAX(uv_now(c->loop), 1);
}

void qr__conn_limits_unstall(qr_conn *c) {
    if (!c->stalled_since || qr__conn_rx_stopped(c)) return;
    shift(c, uv_now(c->loop) - c->stalled_since);
    c->stalled_since = 0;
    check(c);
}

/* ---- the budget of incomplete messages ------------------------------------ */

/* Give room to the waiting connections, in order, while there is some;
 * each carries on from its header before the loop next waits (on_defer). */
static void wake(qr_conn_limits *lim) {
    qr_conn *c;
    while ((c = lim->wait_head)) {
        uint64_t need = c->meta_want + c->frame.payload_len;
        if (lim->in_flight && lim->in_flight + need > lim->max_bytes) return;
        lim->wait_head = c->wait_next;
        if (!lim->wait_head) lim->wait_tail = NULL;
        c->wait_next = NULL;
        c->budget_wait = false;
        c->budget_granted = true;
        c->reserved = need;
        lim->in_flight += need;
        qr__conn_defer(c);
    }
}

static void release(qr_conn *c, uint64_t keep) {
    if (c->reserved <= keep) return;
    c->lim->in_flight -= c->reserved - keep;
    c->reserved = keep;
    wake(c->lim);
}

bool qr__conn_limits_admit(qr_conn *c) {
    qr_conn_limits *lim = c->lim;
    uint64_t need = c->meta_want + c->frame.payload_len;
    if (lim->min_rate && c->msg_window_ms) {
        uint64_t ms = need / lim->min_rate * 1000 + need % lim->min_rate * 1000 / lim->min_rate;
        if (ms > c->msg_window_ms) c->msg_window_ms = ms;
    }
    if (!lim->max_bytes || need < STAGING_BYTES) return true;
    if (!lim->wait_head && (!lim->in_flight || lim->in_flight + need <= lim->max_bytes)) {
        lim->in_flight += need;
        c->reserved = need;
        return true;
    }
    c->budget_wait = true;
    if (lim->wait_tail) lim->wait_tail->wait_next = c;
    else lim->wait_head = c;
    lim->wait_tail = c;
    uv_read_stop(&c->h.stream);
    qr__conn_limits_stall(c);
    /* A debug line: under a heavy but honest load (several workers pushing
     * 64 MiB at once) messages wait all the time; a flood shows in the
     * closes that follow. */
    uint64_t dropped;
    if (qr__log_enabled(QR_LOG_DEBUG) && qr__log_allow(&lim->wait_log, 1, &dropped))
        qr__log(QR_LOG_DEBUG, "a %s message of %llu bytes from %s waits: %llu bytes of "
                "incomplete messages are being received (max-incomplete-mb)%s",
                qr_msg_name(c->frame.type), (unsigned long long)need, c->peer,
                (unsigned long long)lim->in_flight, dropped ? "; others wait too" : "");
    return false;
}

void qr__conn_limits_keep(qr_conn *c, uint64_t keep) {
    release(c, keep);
}

void qr__conn_limits_done(qr_conn *c) {
    release(c, 0);
}

void qr__conn_limits_close(qr_conn *c) {
    qr_conn_limits *lim = c->lim;
    if (c->lim_timer_ready) uv_close((uv_handle_t *)&c->lim_timer, on_timer_closed);
    c->lim_timer_ready = false;
    if (c->budget_wait) {
        qr_conn **at = &lim->wait_head, *prev = NULL;
        while (*at != c) {
            prev = *at;
            at = &(*at)->wait_next;
        }
        *at = c->wait_next;
        if (lim->wait_tail == c) lim->wait_tail = prev;
        c->wait_next = NULL;
        c->budget_wait = false;
    }
}

/* Its bytes go back only now that its owner has had `lost` and given back
 * what it allocated for the message: given back at the close, they let the
 * messages waiting allocate theirs while the closed ones' were still held
 * (500 half-sent pushes against 256 MiB peaked at 425 MiB). */
void qr__conn_limits_lost(qr_conn *c) {
    qr_conn_limits *lim = c->lim;
    release(c, 0);
    c->lim = NULL;
    qr__conn_limits_unref(lim);
}

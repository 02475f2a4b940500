/*
 * conn_secure.c - the libuv transport's side of the security layer
 * (secure.h): the qr_secure_io calls through which the layer answers a
 * connection (write these handshake bytes, start or stop the deadline,
 * open, here is plaintext for the state machine, close).
 *
 * A connection of a job with a secret is authenticated, and with
 * --encrypt sealed, by that layer, which the transport drives as libuv
 * drives a stream: while the layer owns the reads (its handshake, then
 * sealed records) conn_read.c hands them to it, qr_conn_send
 * (conn_write.c) hands it each message to seal, and the layer sees none of
 * the transport's state, only these calls.
 */
#include "wire/conn_internal.h"

#include <stdlib.h>
#include <string.h>

/* A handshake message being written: its own copy of the bytes. */
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
    if (status < 0) qr_secure_lost(&c->sec, qr__conn_from_uv(status));
    else if (close_after) qr__conn_close_with(c, QR_EAUTH);
}

static void secure_send(void *ctx, const void *p, size_t n, bool close_after) {
    qr_conn *c = ctx;
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
        else qr_secure_lost(&c->sec, qr__conn_from_uv(rc));
    }
}

static int secure_try_write(void *ctx, const void *p, size_t n) {
    qr_conn *c = ctx;
    uv_buf_t b = uv_buf_init((char *)p, (unsigned)n);
    return uv_try_write(&c->h.stream, &b, 1);
}

static void on_hs_timeout(uv_timer_t *t) {
    qr_secure_timeout(&((qr_conn *)t->data)->sec);
}

static void secure_deadline(void *ctx, int ms) {
    qr_conn *c = ctx;
    if (!ms) {
        if (c->hs_timer_ready) uv_timer_stop(&c->hs_timer);
        return;
    }
    if (!c->hs_timer_ready) {
        uv_timer_init(c->loop, &c->hs_timer); /* cannot fail */
        c->hs_timer.data = c;
        c->hs_timer_ready = true;
        c->open_handles++;
    }
    uv_timer_start(&c->hs_timer, on_hs_timeout, (uint64_t)ms, 0);
}

static void secure_stop_reading(void *ctx) {
    uv_read_stop(&((qr_conn *)ctx)->h.stream);
}

static int secure_open(void *ctx) {
    return qr__conn_alloc_staging(ctx);
}

static void secure_connected(void *ctx, int status) {
    qr_conn *c = ctx;
    if (c->ev->connected) c->ev->connected(c, status);
}

static uint8_t *secure_payload_dest(void *ctx, size_t n) {
    qr_conn *c = ctx;
    if (c->state != RX_PAYLOAD || c->discard || c->iov_idx >= c->niov ||
        c->frame.payload_len - c->payload_got < n)
        return NULL;
    qr_iov *v = &c->iov[c->iov_idx];
    return v->len - c->iov_off >= n ? (uint8_t *)v->base + c->iov_off : NULL;
}

static void secure_payload_landed(void *ctx, size_t n) {
    qr__conn_payload_advance(ctx, n);
}

static void secure_plaintext(void *ctx, const uint8_t *p, size_t n) {
    qr__conn_process_bytes(ctx, p, n);
}

static void secure_close(void *ctx, int status) {
    qr__conn_close_with(ctx, status);
}

static bool secure_closing(void *ctx) {
    return ((qr_conn *)ctx)->closing;
}

const qr_secure_io qr__conn_secure_io = {
    .send = secure_send,
    .try_write = secure_try_write,
    .deadline = secure_deadline,
    .stop_reading = secure_stop_reading,
    .open = secure_open,
    .connected = secure_connected,
    .payload_dest = secure_payload_dest,
    .payload_landed = secure_payload_landed,
    .plaintext = secure_plaintext,
    .close = secure_close,
    .closing = secure_closing,
};

/*
 * peer.c - what every request family of the ps uses: replies, the checks
 * of a request's meta, the request's receive buffer, and the fence of a
 * run that was stopped past heartbeat-timeout-ms (like Redis's
 * networking.c beside its command files).
 *
 * A request is checked completely before it changes anything. A check
 * that fails when the header arrives is held (qr__peer_hold_error) and
 * answered once the payload has gone by, because the stream must be
 * read past it either way; the connection keeps working.
 */
#include "ps/ps_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- replies ---------------------------------------------------------- */

void qr__peer_reply_sent(qr_conn *c, int status, void *ctx) {
    (void)status, (void)ctx;
    qr__peer_drained(c);
}

void qr__peer_drained(qr_conn *c) {
    ps_peer *p = qr_conn_data(c);
    if (p && !p->parked && qr_conn_paused(c) && qr_conn_pending_bytes(c) < PEER_MAX_PENDING / 2)
        qr_conn_resume(c);
}

int qr__peer_reply(ps_peer *p, const qr_frame *req, int status, const qr_wbuf *meta,
                   const qr_iov *iov, int niov, qr_send_cb cb, void *ctx) {
    qr_frame f = {0};
    f.type = (uint8_t)(req->type | QR_MSG_REPLY);
    f.request_id = req->request_id;
    f.status = status;
    int rc = qr_conn_send(p->conn, &f, meta ? meta->data : NULL, meta ? (uint32_t)meta->len : 0,
                          iov, niov, cb ? cb : qr__peer_reply_sent, ctx);
    if (rc) {
        qr__log(QR_LOG_DEBUG, "reply to %s not sent: %s", qr_conn_peer(p->conn), qr_last_error());
        if (cb) cb(p->conn, rc, ctx);
        return rc;
    }
    if (qr_conn_pending_bytes(p->conn) > PEER_MAX_PENDING) qr_conn_pause(p->conn);
    return QR_OK;
}

void qr__peer_notify_stop(ps_peer *p, int status, const char *why) {
    qr_frame req = {.type = QR_MSG_STOP, .request_id = QR_STOP_NOTICE_ID};
    qr_wbuf meta = {0};
    qr_wbuf_bytes(&meta, why, strlen(why));
    qr__peer_reply(p, &req, status, &meta, NULL, 0, NULL, NULL);
    qr_wbuf_free(&meta);
}

void qr__peer_reply_error(ps_peer *p, const qr_frame *req, int status, const char *msg) {
    qr_wbuf meta = {0};
    qr_wbuf_bytes(&meta, msg, strlen(msg));
    qr__log(QR_LOG_DEBUG, "%s from %s refused: %s", qr_msg_name(req->type),
            qr_conn_peer(p->conn), msg);
    qr__peer_reply(p, req, status, &meta, NULL, 0, NULL, NULL);
    qr_wbuf_free(&meta);
}

void qr__peer_reply_step(ps_peer *p, const qr_frame *req, int64_t step) {
    qr_wbuf meta = {0};
    qr_msg_put_step(&meta, step);
    qr__peer_reply(p, req, QR_OK, &meta, NULL, 0, NULL, NULL);
    qr_wbuf_free(&meta);
}

void qr__peer_hold_error(ps_peer *p, int status) {
    p->err = status;
    snprintf(p->errmsg, sizeof p->errmsg, "%s: %s", p->ps->name, qr_last_error());
}

/* ---- request checks ---------------------------------------------------- */

int qr__peer_reserve_items(ps_peer *p, uint32_t n) {
    if ((int)n <= p->items_cap) return QR_OK;
    push_item *grown = realloc(p->items, n * sizeof *grown);
    if (!grown) return qr__fail(QR_ENOMEM, "out of memory for %u items", n);
    p->items = grown;
    p->items_cap = (int)n;
    return QR_OK;
}

int qr__peer_check_count(const char *what, uint32_t count) {
    if (count == 0 || count > QR_PROTO_MAX_ITEMS)
        return qr__fail(QR_EPROTO, "%s names %u variables (1..%u allowed)", what, count,
                        QR_PROTO_MAX_ITEMS);
    return QR_OK;
}

int qr__peer_check_end(const char *what, const qr_rbuf *r, uint64_t described,
                       uint64_t payload_len) {
    if (r->bad) return qr__fail(QR_EPROTO, "%s meta is truncated", what);
    if (r->left) return qr__fail(QR_EPROTO, "%s meta has %zu unexpected trailing bytes", what, r->left);
    if (described != payload_len)
        return qr__fail(QR_EPROTO, "%s describes %llu payload bytes but carries %llu", what,
                        (unsigned long long)described, (unsigned long long)payload_len);
    return QR_OK;
}

int qr__peer_check_small(const qr_frame *f, uint32_t meta_len) {
    if (f->meta_len != meta_len || f->payload_len)
        return qr__fail(QR_EPROTO, "%s carries %u meta and %llu payload bytes (expected %u and 0)",
                        qr_msg_name(f->type), f->meta_len, (unsigned long long)f->payload_len,
                        meta_len);
    return QR_OK;
}

uint64_t qr__link_backoff_ms(int *attempts) {
    uint64_t ms = QR_MIN(1000ull, 10ull << QR_MIN(*attempts, 7));
    (*attempts)++;
    return ms;
}

int qr__peer_lookup(ps_peer *p, const char *what, uint32_t id, qr_var **out) {
    qr_var *v = qr_store_get(qr__peer_store(p), id);
    if (!v)
        return qr__fail(p->ps->ready ? QR_ENOTFOUND : QR_ENOTREADY,
                        "%s: no variable with id %u on this ps%s", what, id,
                        p->ps->ready ? "" : " (not initialized yet)");
    if (v->mark == p->ps->mark)
        return qr__fail(QR_EINVAL, "%s names variable '%s' twice", what, v->name);
    v->mark = p->ps->mark;
    *out = v;
    return QR_OK;
}

/* ---- receive buffers --------------------------------------------------- */

void qr__peer_release_recv(ps_peer *p) {
    for (int i = 0; i < p->nitems; i++) qr__fused_end(p->ps, &p->items[i]);
    qr__recv_pool_put(&p->ps->recv_pool, p->recv, p->recv_cap);
    p->recv = NULL;
    p->recv_cap = 0;
}

typedef struct recv_lent {
    recv_pool *pool;
    float *data;
    size_t cap;
} recv_lent;

void *qr__peer_lend_recv(ps_peer *p) {
    if (!p->recv) return NULL;
    recv_lent *l = malloc(sizeof *l);
    if (!l) return NULL;
    *l = (recv_lent){&p->ps->recv_pool, p->recv, p->recv_cap};
    p->recv = NULL;
    p->recv_cap = 0;
    return l;
}

void qr__recv_lent_release(void *owner) {
    recv_lent *l = owner;
    qr__recv_pool_put(l->pool, l->data, l->cap);
    free(l);
}

int qr__peer_take_recv(ps_peer *p, size_t bytes) {
    qr__peer_release_recv(p); /* a request takes one buffer; none is held between requests */
    p->recv = qr__recv_pool_get(&p->ps->recv_pool, bytes, &p->recv_cap);
    return p->recv ? QR_OK : QR_ENOMEM;
}

/* ---- the fence -------------------------------------------------------------- */

void qr__ps_fence(qr_ps *ps, const char *why) {
    if (ps->fenced) return;
    ps->fenced = ps->stopping = true;
    snprintf(ps->abort_msg, sizeof ps->abort_msg, "%s: %s; this run is over: it serves nothing "
             "more, forwards nothing, and exits", ps->name, why);
    ps->exit_status = QR_EABORTED;
    qr__log(QR_LOG_ERROR, "%s", ps->abort_msg);
}

bool qr__ps_fenced(qr_ps *ps) {
    if (ps->fenced) return true;
    const ps_liveness *l = &ps->liveness;
    /* Only a ps that others judge (ps 0 its links, each ps k ps 0) is
     * declared hung, and only such a one may have been replaced. */
    if (l->beat_ms <= 0 || !l->turn_ns || ps->cluster->nps < 2) return false;
    uint64_t gap_ms = (qr__now_ns() - l->turn_ns) / 1000000;
    if (gap_ms < (uint64_t)l->timeout_ms) return false;
    ps->fenced = ps->stopping = true;
    snprintf(ps->abort_msg, sizeof ps->abort_msg, "%s did not run for %.1f s (stopped, or its "
             "loop wedged), longer than heartbeat-timeout-ms (%lld ms): the other tasks may have "
             "declared it hung and a new run of it may serve its shard; this run is over: it "
             "serves nothing more, writes no checkpoint, and exits", ps->name,
             (double)gap_ms / 1e3, (long long)l->timeout_ms);
    ps->exit_status = QR_EABORTED;
    qr__log(QR_LOG_ERROR, "%s", ps->abort_msg);
    return true;
}

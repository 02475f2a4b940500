/*
 * replica_forward.c - what the primary of a shard forwards to its copy
 * (--ps-replicas 2), and the answers that wait for it: each async push
 * applied (qr__replica_begin, _add, _send: push.c, rows.c, lookup.c,
 * sync.c), each CREATE; a push's answer held until the backup has applied
 * every forward up to its own (qr__replica_wait). The forwards travel on
 * replica.c's link, which answers the waits as the backup acknowledges;
 * replica_backup.c applies them on the other side.
 *
 * Exactly once: per worker, the last QR_REPL_DUP_WINDOW pushes applied
 * here and the step each was answered with; a push of one of those
 * (worker, seq) is answered as applied and not applied again
 * (duplicate_pushes). The record travels with each forward, so the
 * backup holds it too, and answers a push resent to it after a failover.
 */
#include "ps/ps_internal.h"

#include <stdlib.h>

/* ---- forwarding (primary) ---------------------------------------------------- */

repl_forward *qr__replica_begin(qr_ps *ps, const qr_msg_repl_head *head) {
    repl_forward *fw = qr__calloc(1, sizeof *fw);
    if (!fw) {
        qr__replica_fail_forward(ps);
        return NULL;
    }
    fw->type = QR_MSG_REPLICATE;
    fw->head = *head;
    fw->head.count = 0;
    return fw;
}

void qr__replica_add(repl_forward *fw, uint32_t id, uint32_t kind, float lr, const void *data,
                     uint64_t nbytes) {
    if (!fw) return;
    qr_msg_put_repl_item(&fw->items, &(qr_msg_repl_item){.id = id, .kind = kind,
                                                          .nbytes = nbytes, .lr = lr});
    if (nbytes && data) qr_wbuf_bytes(&fw->payload, data, (size_t)nbytes);
    fw->head.count++;
}

void qr__replica_send(qr_ps *ps, repl_forward *fw) {
    qr__replica_link_send(&ps->replica.link, fw);
}

/* The link that carries p's shard: this ps's own to its backup, or a
 * promoted copy's to the replacement being made. */
static repl_link *shard_link(ps_peer *p) {
    ps_replica *r = &p->ps->replica;
    return p->promoted_shard ? &r->copy_link : &r->link;
}

void qr__replica_send_shard0(qr_ps *ps, repl_forward *fw) {
    ps_replica *r = &ps->replica;
    /* The coordinator serves shard 0 as its own (ps 0), or from its
     * promoted copy (ps 1, whose primary is ps 0, since ps 0 failed over). */
    bool from_copy = r->promoted && r->primary == 0;
    qr__replica_link_send(from_copy ? &r->copy_link : &r->link, fw);
}

repl_last *qr__replica_shard0_record(qr_ps *ps) {
    ps_replica *r = &ps->replica;
    return ps->index == 0 ? r->last : r->backup_last;
}

void qr__replica_send_for(ps_peer *p, repl_forward *fw) {
    qr__replica_link_send(shard_link(p), fw);
}

bool qr__replica_keeps(ps_peer *p) {
    return qr__replica_on(p->ps) && !shard_link(p)->gone;
}

void qr__replica_forward_create(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    repl_forward *fw = qr__calloc(1, sizeof *fw);
    if (!fw) {
        qr__replica_fail_forward(ps);
        return;
    }
    fw->type = QR_MSG_CREATE;
    qr_wbuf_bytes(&fw->items, meta, f->meta_len);
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    uint32_t count = qr_msg_get_count(&r);
    /* The records were checked when the CREATE came: each names a
     * variable of the store now. */
    for (uint32_t i = 0; i < count && !r.bad; i++) {
        qr_msg_create_var m;
        qr_msg_get_create_var(&r, &m);
        const qr_var *v = qr_store_get(&ps->store, m.id);
        if (v && v->value) qr_wbuf_bytes(&fw->payload, v->value->data, (size_t)v->n * 4);
    }
    qr__replica_send(ps, fw);
    /* A CREATE's number only orders it; the backup knows no number for it. */
}

/* ---- exactly once ---------------------------------------------------------- */

/* The record of p's shard: this ps's own, or its copy's. */
static repl_last *record_of(ps_peer *p) {
    ps_replica *r = &p->ps->replica;
    return p->promoted_shard ? r->backup_last : r->last;
}

bool qr__replica_duplicate(ps_peer *p, uint32_t worker, uint32_t seq, int64_t *answer) {
    qr_ps *ps = p->ps;
    ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps) || !qr__is_worker(worker, ps->cluster->nworkers)) return false;
    const repl_last *l = &record_of(p)[worker];
    for (int i = 0; i < l->n; i++) {
        if (l->seq[i] != seq) continue;
        *answer = l->answer[i];
        r->duplicate_pushes++;
        return true;
    }
    return false;
}

void qr__replica_record_last(repl_last *last, int nworkers, uint32_t worker, uint32_t seq,
                             int64_t answer, uint64_t data_pos) {
    if (!qr__is_worker(worker, nworkers)) return;
    repl_last *l = &last[worker];
    l->data_pos = data_pos;
    l->seq[l->next] = seq;
    l->answer[l->next] = answer;
    l->next = (l->next + 1) % QR_REPL_DUP_WINDOW;
    if (l->n < QR_REPL_DUP_WINDOW) l->n++;
}

void qr__replica_applied(ps_peer *p, uint32_t worker, uint32_t seq, int64_t answer) {
    qr_ps *ps = p->ps;
    if (!qr__replica_on(ps)) return;
    qr__replica_record_last(record_of(p), ps->cluster->nworkers, worker, seq, answer,
                            p->push_data_pos);
    if (p->promoted_shard) ps->replica.copy_pushes++;
    else ps->replica.own_pushes++;
}

/* cb once every forward made so far on L but the last `lag` is applied
 * there: at once when they are, when there is no copy, or while a copy is
 * still being made (the shard is on one copy until it has caught up,
 * rerep.c). Waits are answered in the order they came. p and f (NULL for
 * ps 0's own part of a sync step) go back to cb. */
static void wait_on(repl_link *L, ps_peer *p, const qr_frame *f, uint64_t lag,
                    qr_repl_answer_cb cb, void *ctx) {
    uint64_t fwd = L->next_fwd - 1; /* the last forward made */
    if ((fwd <= L->acked + lag && !L->wait_head) || L->gone || L->streaming) {
        qr__replica_note_answer(L, fwd);
        cb(p, f, ctx, QR_OK, NULL);
        return;
    }
    repl_wait *w = qr__calloc(1, sizeof *w);
    if (!w) {
        cb(p, f, ctx, QR_ENOMEM, "out of memory keeping an answer for the backup");
        return;
    }
    *w = (repl_wait){.peer = p, .fwd = fwd, .lag = lag, .cb = cb, .ctx = ctx};
    if (f) w->req = *f;
    if (L->wait_tail) L->wait_tail->next = w;
    else L->wait_head = w;
    L->wait_tail = w;
}

void qr__replica_wait(ps_peer *p, const qr_frame *f, qr_repl_answer_cb cb, void *ctx) {
    wait_on(shard_link(p), p, f, 0, cb, ctx);
}

void qr__replica_wait_lagging(ps_peer *p, const qr_frame *f, qr_repl_answer_cb cb, void *ctx) {
    wait_on(shard_link(p), p, f, p->ps->replica.lag, cb, ctx);
}

void qr__replica_note_answer(repl_link *L, uint64_t fwd) {
    if (fwd <= L->acked || L->gone || L->streaming) return;
    ps_replica *r = &L->ps->replica;
    r->answered_ahead++;
    r->lag_seen = QR_MAX(r->lag_seen, fwd - L->acked);
}

void qr__replica_after(qr_ps *ps, qr_repl_answer_cb cb, void *ctx) {
    wait_on(&ps->replica.link, NULL, NULL, 0, cb, ctx); /* this ps's own shard */
}

void qr__replica_wait_copy(ps_peer *p, const qr_frame *f, qr_repl_answer_cb cb, void *ctx) {
    wait_on(&p->ps->replica.copy_link, p, f, 0, cb, ctx);
}

void qr__replica_after_copy(qr_ps *ps, qr_repl_answer_cb cb, void *ctx) {
    wait_on(&ps->replica.copy_link, NULL, NULL, 0, cb, ctx);
}

void qr__replica_peer_lost(ps_peer *p) {
    ps_replica *r = &p->ps->replica;
    for (repl_wait *w = r->link.wait_head; w; w = w->next)
        if (w->peer == p) w->peer = NULL;
    for (repl_wait *w = r->copy_link.wait_head; w; w = w->next)
        if (w->peer == p) w->peer = NULL;
}

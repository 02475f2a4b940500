/*
 * ckpt_save.c - SAVE: a worker asks ps 0 for a checkpoint now (at the end
 * of an epoch, before a risky change), and is answered once one that
 * started after its request is written, with that checkpoint's global
 * step. Requests that come while a checkpoint is under way wait for the
 * next one (the one under way may hold an older step), or, if the global
 * step has not moved once it is written, are answered with it: it holds
 * that very step (ckpt_coord.c, finish_checkpoint). Several requests are
 * served by one checkpoint. In sync mode it is taken between steps.
 */
#include "ps/ps_internal.h"

#include <stdlib.h>

typedef struct save_waiter {
    ps_peer *peer;
    qr_frame req;
    uint64_t first_id; /* the first checkpoint id that serves it */
    struct save_waiter *next;
} save_waiter;

void qr__ckpt_save_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    ps_ckpt *c = &ps->ckpt;
    if (!qr__ps_coordinates(ps) || !c->dir) {
        qr__peer_reply_error(p, f, QR_EINVAL, !qr__ps_coordinates(ps)
                             ? "SAVE goes to ps 0"
                             : "checkpoint: the ps tasks were started without --checkpoint-dir");
        return;
    }
    if (!c->busy && c->last_step >= 0 && ps->global_step == c->last_step) {
        qr__peer_reply_step(p, f, c->last_step); /* the newest one holds this very step */
        return;
    }
    save_waiter *w = qr__calloc(1, sizeof *w);
    if (!w) {
        qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory queueing a checkpoint request");
        return;
    }
    *w = (save_waiter){.peer = p, .req = *f, .first_id = c->next_id + 1, .next = c->saves};
    c->saves = w;
    qr__log(QR_LOG_INFO, "checkpoint requested by worker %d at global step %lld",
            p->worker_index, (long long)ps->global_step);
    /* (A coordinator's successor that has not heard every worker's data
     * position yet takes it at a later step: qr__ckpt_step_done.) */
    if (!c->busy && !(ps->sync.on && ps->sync.applying) && !ps->stopping && !c->pos_fresh)
        qr__ckpt_start(ps);
}

bool qr__ckpt_save_done(qr_ps *ps, uint64_t id, bool ok) {
    ps_ckpt *c = &ps->ckpt;
    bool more = false;
    for (save_waiter **link = &c->saves; *link;) {
        save_waiter *w = *link;
        if (w->first_id > id) {
            more = true;
            link = &w->next;
            continue;
        }
        if (ok) {
            qr__peer_reply_step(w->peer, &w->req, c->last_step);
        } else {
            char msg[700];
            snprintf(msg, sizeof msg, "the checkpoint at global step %lld was not written: %s",
                     (long long)c->step, c->failure[0] ? c->failure : "see ps 0's log");
            qr__peer_reply_error(w->peer, &w->req, QR_EIO, msg);
        }
        *link = w->next;
        free(w);
    }
    return more;
}

void qr__ckpt_save_peer_lost(ps_peer *p) {
    for (save_waiter **link = &p->ps->ckpt.saves; *link;) {
        save_waiter *w = *link;
        if (w->peer != p) {
            link = &w->next;
            continue;
        }
        *link = w->next;
        free(w);
    }
}

void qr__ckpt_save_free(qr_ps *ps) {
    while (ps->ckpt.saves) {
        save_waiter *w = ps->ckpt.saves;
        ps->ckpt.saves = w->next;
        free(w);
    }
}

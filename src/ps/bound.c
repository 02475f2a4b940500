/*
 * bound.c - bounded staleness (stale synchronous parallel) for async
 * training, on ps 0.
 *
 * ps 0 counts the step pushes of each worker (its clock). Before a step, a
 * worker whose clock is c asks CLOCK(c); ps 0 answers once
 *     c - min(clock of every live worker) <= k        (k = max-staleness)
 * so no worker runs more than k steps ahead of the slowest. k = 0 is bulk
 * synchronous: every step waits for every live worker, without a quorum.
 * A worker whose connections are all closed is not live and holds nobody
 * back; a wait also ends at stop ("stopped").
 */
#include "ps/ps_internal.h"

#include <stdlib.h>

int qr__bound_init(qr_ps *ps) {
    ps->max_staleness = qr__config_int(ps->cfg, "max-staleness");
    ps->clock = qr__calloc((size_t)ps->cluster->nworkers, sizeof *ps->clock);
    return ps->clock ? QR_OK : QR_ENOMEM;
}

void qr__bound_free(qr_ps *ps) {
    while (ps->bound_waiters) {
        bound_waiter *next = ps->bound_waiters->next;
        free(ps->bound_waiters);
        ps->bound_waiters = next;
    }
    free(ps->clock);
    ps->clock = NULL;
}

/* The fewest steps pushed by a live worker (INT64_MAX if none is live). */
static int64_t slowest_live(const qr_ps *ps) {
    int64_t lo = INT64_MAX;
    for (int w = 0; w < ps->cluster->nworkers; w++)
        if (ps->worker_conns[w] > 0 && ps->clock[w] < lo) lo = ps->clock[w];
    return lo;
}

static void answer(bound_waiter *b, int status, int64_t slowest) {
    if (status) {
        qr__ps_reply_error(b->peer, &b->req, status, "stopped: training is over");
        return;
    }
    qr_wbuf meta = {0};
    qr_wbuf_i64(&meta, slowest);
    qr__ps_reply(b->peer, &b->req, QR_OK, &meta, NULL, 0, NULL, NULL);
    qr_wbuf_free(&meta);
}

void qr__bound_update(qr_ps *ps) {
    if (!ps->bound_waiters) return;
    int64_t slowest = slowest_live(ps);
    bound_waiter **link = &ps->bound_waiters;
    while (*link) {
        bound_waiter *b = *link;
        if (slowest == INT64_MAX || b->clock - slowest <= ps->max_staleness) {
            answer(b, QR_OK, slowest == INT64_MAX ? b->clock : slowest);
            *link = b->next;
            free(b);
        } else {
            link = &b->next;
        }
    }
}

void qr__bound_clock(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    uint32_t worker = qr_rbuf_u32(&r);
    int64_t clock = qr_rbuf_i64(&r);
    if (!qr__is_worker(worker, ps->cluster->nworkers) || clock < 0) {
        qr__ps_reply_error(p, f, QR_EINVAL, "CLOCK: no such worker, or a negative clock");
        return;
    }
    bound_waiter *b = qr__calloc(1, sizeof *b);
    if (!b) {
        qr__ps_reply_error(p, f, QR_ENOMEM, "out of memory");
        return;
    }
    b->peer = p;
    b->req = *f;
    b->clock = clock;
    b->next = ps->bound_waiters;
    ps->bound_waiters = b;
    qr__bound_update(ps);
}

void qr__bound_peer_lost(ps_peer *p) {
    qr_ps *ps = p->ps;
    bound_waiter **link = &ps->bound_waiters;
    while (*link) {
        bound_waiter *b = *link;
        if (b->peer == p) {
            *link = b->next;
            free(b);
        } else {
            link = &b->next;
        }
    }
    /* A worker that left no longer holds the others back. */
    qr__bound_update(ps);
}

void qr__bound_stop(qr_ps *ps) {
    while (ps->bound_waiters) {
        bound_waiter *b = ps->bound_waiters;
        ps->bound_waiters = b->next;
        answer(b, QR_ESTOPPED, 0);
        free(b);
    }
}

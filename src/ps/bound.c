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
 * back; a wait also ends at stop ("stopped"). A worker that is connected
 * but makes no progress (hung, stopped, far slower) holds the others as
 * long as it stays so; every stall-report-ms, ps 0 logs who waits for
 * whom, so the run says which worker to look at instead of going quiet.
 */
#include "ps/ps_internal.h"

#include <stdio.h>
#include <stdlib.h>

static void on_report_timer(uv_timer_t *t);

int qr__bound_init(qr_ps *ps) {
    ps->bound.max_staleness = qr__config_int(ps->cfg, "max-staleness");
    ps->bound.clock = qr__calloc((size_t)ps->cluster->nworkers, sizeof *ps->bound.clock);
    if (!ps->bound.clock) return QR_ENOMEM;
    if (ps->bound.max_staleness >= 0) {
        int64_t report_ms = qr__config_int(ps->cfg, "stall-report-ms");
        ps->bound.report_every_ns = (uint64_t)report_ms * 1000000;
        uint64_t period = (uint64_t)QR_MAX(50, QR_MIN(1000, report_ms / 4));
        uv_timer_init(&ps->loop, &ps->bound.timer);
        ps->bound.timer.data = ps;
        ps->bound.timer_on = true;
        uv_timer_start(&ps->bound.timer, on_report_timer, period, period);
        uv_unref((uv_handle_t *)&ps->bound.timer); /* does not keep the loop alive */
    }
    return QR_OK;
}

void qr__bound_close(qr_ps *ps) {
    if (ps->bound.timer_on && !uv_is_closing((uv_handle_t *)&ps->bound.timer))
        uv_close((uv_handle_t *)&ps->bound.timer, NULL); /* embedded in ps: nothing to free */
}

/* "worker 1 (step 17), worker 3 (step 16)": the live workers more than
 * max-staleness steps behind `clock`, the ones b waits for. */
static void laggards(const qr_ps *ps, int64_t clock, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (int w = 0; w < ps->cluster->nworkers && used < len; w++) {
        if (ps->worker_conns[w] == 0 || clock - ps->bound.clock[w] <= ps->bound.max_staleness) continue;
        int n = snprintf(buf + used, len - used, "%sworker %d (step %lld)", used ? ", " : "", w,
                         (long long)ps->bound.clock[w]);
        if (n < 0) break;
        used += (size_t)n;
    }
}

static void on_report_timer(uv_timer_t *t) {
    qr_ps *ps = t->data;
    if (ps->stopping || !ps->bound.waiters) return;
    uint64_t now = qr__now_ns();
    uint64_t report_ns = ps->bound.report_every_ns;
    if (now - ps->bound.report_ns < report_ns) return;
    const bound_waiter *longest = ps->bound.waiters;
    int nwaiting = 0;
    for (const bound_waiter *b = ps->bound.waiters; b; b = b->next, nwaiting++)
        if (b->since_ns < longest->since_ns) longest = b;
    if (now - longest->since_ns < report_ns) return;
    char behind[512];
    laggards(ps, longest->clock, behind, sizeof behind);
    qr__log(QR_LOG_WARN, "bounded staleness: worker %u has waited %.1f s to start step %lld "
            "for %s, more than max-staleness %lld steps behind (%d worker(s) waiting)",
            longest->worker, (double)(now - longest->since_ns) / 1e9,
            (long long)longest->clock, behind[0] ? behind : "(nobody now)",
            (long long)ps->bound.max_staleness, nwaiting);
    ps->bound.report_ns = now;
}

void qr__bound_free(qr_ps *ps) {
    while (ps->bound.waiters) {
        bound_waiter *next = ps->bound.waiters->next;
        free(ps->bound.waiters);
        ps->bound.waiters = next;
    }
    free(ps->bound.clock);
    ps->bound.clock = NULL;
}

/* The fewest steps pushed by a live worker (INT64_MAX if none is live). */
static int64_t slowest_live(const qr_ps *ps) {
    int64_t lo = INT64_MAX;
    for (int w = 0; w < ps->cluster->nworkers; w++)
        if (ps->worker_conns[w] > 0 && ps->bound.clock[w] < lo) lo = ps->bound.clock[w];
    return lo;
}

static void answer(bound_waiter *b, int status, int64_t slowest) {
    if (status) {
        qr__peer_reply_error(b->peer, &b->req, status, "stopped: training is over");
        return;
    }
    qr__peer_reply_step(b->peer, &b->req, slowest);
}

void qr__bound_update(qr_ps *ps) {
    if (!ps->bound.waiters) return;
    int64_t slowest = slowest_live(ps);
    bound_waiter **link = &ps->bound.waiters;
    while (*link) {
        bound_waiter *b = *link;
        if (slowest == INT64_MAX || b->clock - slowest <= ps->bound.max_staleness) {
            answer(b, QR_OK, slowest == INT64_MAX ? b->clock : slowest);
            *link = b->next;
            free(b);
        } else {
            link = &b->next;
        }
    }
}

void qr__bound_count_step(qr_ps *ps, uint32_t worker) {
    if (qr__is_worker(worker, ps->cluster->nworkers)) ps->bound.clock[worker]++;
    qr__bound_update(ps);
}

int qr__bound_clock_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    const qr_ps *ps = p->ps;
    if (ps->sync.on || !qr__ps_coordinates(ps) || ps->bound.max_staleness < 0)
        return qr__fail(QR_EINVAL, "CLOCK goes to ps 0 of an async run with max-staleness");
    return qr__peer_check_small(f, QR_MSG_CLOCK_LEN);
}

void qr__bound_clock(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_msg_clock m;
    qr_msg_get_clock(&r, &m);
    uint32_t worker = m.worker;
    int64_t clock = m.clock;
    if (!qr__is_worker(worker, ps->cluster->nworkers) || clock < 0) {
        qr__peer_reply_error(p, f, QR_EINVAL, "CLOCK: no such worker, or a negative clock");
        return;
    }
    int waits = 0;
    for (const bound_waiter *o = ps->bound.waiters; o; o = o->next) waits += o->peer == p;
    if (waits >= PEER_MAX_WAITS) {
        char msg[160];
        snprintf(msg, sizeof msg, "CLOCK: this connection has %d CLOCK requests waiting already "
                 "(at most %d)", waits, PEER_MAX_WAITS);
        qr__peer_reply_error(p, f, QR_EINVAL, msg);
        return;
    }
    bound_waiter *b = qr__calloc(1, sizeof *b);
    if (!b) {
        qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory");
        return;
    }
    b->peer = p;
    b->req = *f;
    b->worker = worker;
    b->clock = clock;
    b->since_ns = qr__now_ns();
    b->next = ps->bound.waiters;
    ps->bound.waiters = b;
    qr__bound_update(ps);
}

void qr__bound_peer_lost(ps_peer *p) {
    qr_ps *ps = p->ps;
    bound_waiter **link = &ps->bound.waiters;
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
    qr__bound_close(ps);
    while (ps->bound.waiters) {
        bound_waiter *b = ps->bound.waiters;
        ps->bound.waiters = b->next;
        answer(b, QR_ESTOPPED, 0);
        free(b);
    }
}

/*
 * coord_token.c - the token queue of synchronous training, on ps 0 (the
 * step itself is coord.c's). A completed step queues max(N, R) tokens
 * carrying the next step (init_tokens more of the first when the chief
 * marks the cluster ready); a worker's place in the queue is taken when
 * its push is counted (coord.c) or when it asks with none, granted a
 * token in FIFO order, and answered when its TOKEN request is in (a held
 * push's answer goes with its token: coord_held.c). A lost connection
 * gives its places and an uncollected token back; the stop, or an abort,
 * ends every wait.
 */
#include "ps/ps_internal.h"

#include <stdlib.h>

/* ---- tokens ---------------------------------------------------------------- */

int qr__coord_push_token(ps_sync *s, int64_t step) {
    if (s->ntokens == s->tokens_cap) {
        int cap = s->tokens_cap ? s->tokens_cap * 2 : 64;
        int64_t *grown = malloc((size_t)cap * sizeof *grown);
        if (!grown) return qr__fail(QR_ENOMEM, "out of memory for tokens");
        for (int i = 0; i < s->ntokens; i++)
            grown[i] = s->tokens[(s->tokens_head + i) % s->tokens_cap];
        free(s->tokens);
        s->tokens = grown;
        s->tokens_cap = cap;
        s->tokens_head = 0;
    }
    s->tokens[(s->tokens_head + s->ntokens) % s->tokens_cap] = step;
    s->ntokens++;
    return QR_OK;
}

static int64_t pop_token(ps_sync *s) {
    int64_t step = s->tokens[s->tokens_head];
    s->tokens_head = (s->tokens_head + 1) % s->tokens_cap;
    s->ntokens--;
    return step;
}

static void unpop_token(ps_sync *s, int64_t step) {
    if (qr__coord_push_token(s, step)) return; /* makes room; then move it to the front */
    s->ntokens--;
    s->tokens_head = (s->tokens_head + s->tokens_cap - 1) % s->tokens_cap;
    s->tokens[s->tokens_head] = step;
    s->ntokens++;
}

static void answer_token(token_waiter *w, int status, int64_t step, const char *msg) {
    if (w->held) { /* a held push: the values come with the token */
        if (status) qr__held_fail(w->held, status, msg);
        else qr__held_answer(w->held, step);
        w->held = NULL;
        return;
    }
    if (status) {
        qr__peer_reply_error(w->peer, &w->req, status, msg);
        return;
    }
    qr__peer_reply_step(w->peer, &w->req, step);
}

/* R = N and no initial tokens: every worker gives each step one gradient. */
bool qr__coord_lockstep(const ps_sync *s) {
    return s->R == s->N && s->init_tokens == 0;
}

/* Grant tokens to waiting places in order; answer those whose TOKEN
 * request is in. A granted place whose request has not come yet keeps its
 * token (and its place) until it comes. */
void qr__coord_serve_waiters(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    token_waiter **link = &s->waiters;
    while (*link) {
        token_waiter *w = *link;
        if (!w->granted) {
            /* Lockstep: a token of the step this place's gradient is in, or
             * an earlier one, was released for a worker that is gone (one
             * that comes back starts at the global step without a token).
             * Taken, it would make this worker's next gradient a second
             * one for that step: it is dropped instead. */
            while (s->ntokens && qr__coord_lockstep(s) &&
                   s->tokens[s->tokens_head] <= w->committed)
                pop_token(s);
            if (!s->ntokens) break; /* FIFO: nobody behind may pass */
            w->granted = true;
            w->token = pop_token(s);
        }
        if (w->has_request) {
            if (w->held) qr__coord_release_others(ps, w->held);
            answer_token(w, QR_OK, w->token, NULL);
            *link = w->next;
            free(w);
        } else {
            link = &w->next;
        }
    }
    s->waiters_tail = NULL;
    for (token_waiter *w = s->waiters; w; w = w->next) s->waiters_tail = w;
}

/* Queues a place for p at the back (in *out unless out is NULL);
 * QR_EINVAL when p holds PEER_MAX_WAITS places already, QR_ENOMEM when
 * out of memory (the error is set either way). */
int qr__coord_add_waiter(ps_sync *s, ps_peer *p, token_waiter **out) {
    int held = 0;
    for (const token_waiter *o = s->waiters; o; o = o->next) held += o->peer == p;
    if (held >= PEER_MAX_WAITS)
        return qr__fail(QR_EINVAL, "this connection holds %d places in the token queue already "
                        "(at most %d)", held, PEER_MAX_WAITS);
    token_waiter *w = qr__calloc(1, sizeof *w);
    if (!w) return QR_ENOMEM;
    w->peer = p;
    w->committed = -1;
    if (s->waiters_tail) s->waiters_tail->next = w;
    else s->waiters = w;
    s->waiters_tail = w;
    if (out) *out = w;
    return QR_OK;
}

void qr__coord_end_waiters(ps_sync *s, int status, const char *msg) {
    while (s->waiters) {
        token_waiter *w = s->waiters;
        s->waiters = w->next;
        if (w->has_request) answer_token(w, status, 0, msg);
        free(w);
    }
    s->waiters_tail = NULL;
    qr__coord_end_commits(s, status, msg);
}

void qr__coord_ready(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    s->step = ps->global_step;
    s->step_started_ns = qr__now_ns();
    if (s->tokens_seeded) return;
    s->tokens_seeded = true;
    for (int i = 0; i < s->init_tokens; i++)
        if (qr__coord_push_token(s, ps->global_step)) return;
}

void qr__coord_set_step(qr_ps *ps, int64_t step) {
    ps_sync *s = &ps->sync;
    s->step = step;
    for (int i = 0; i < s->ntokens; i++) s->tokens[(s->tokens_head + i) % s->tokens_cap] = step;
}

void qr__coord_token(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    ps_sync *s = &ps->sync;
    if (s->aborted) {
        qr__peer_reply_error(p, f, QR_EABORTED, s->abort_msg);
        return;
    }
    /* This worker's oldest place without a request; a worker that asks
     * without having committed (after a restart, say) queues anew. */
    token_waiter *w = s->waiters;
    while (w && (w->peer != p || w->has_request)) w = w->next;
    int rc = w ? QR_OK : qr__coord_add_waiter(s, p, &w);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "TOKEN: %s", qr_last_error());
        qr__peer_reply_error(p, f, rc, msg);
        return;
    }
    w->has_request = true;
    w->req = *f;
    qr__coord_serve_waiters(ps);
}

void qr__coord_peer_lost(ps_peer *p) {
    qr_ps *ps = p->ps;
    ps_sync *s = &ps->sync;
    /* Its places leave the queue; a token it was granted but never
     * collected goes back to the front, as if never dequeued. */
    token_waiter **link = &s->waiters;
    s->waiters_tail = NULL;
    while (*link) {
        token_waiter *w = *link;
        if (w->peer == p) {
            if (w->granted) unpop_token(s, w->token);
            *link = w->next;
            free(w->held);
            free(w);
        } else {
            s->waiters_tail = w;
            link = &w->next;
        }
    }
    /* A held push not counted yet loses its answer, but keeps what the
     * other ps tasks said of it: sent again (qr__coord_held_push), it is
     * counted without their HELD, which they do not repeat; never sent
     * again, it goes when its step is over (qr__coord_judge_commits). */
    qr__coord_held_peer_lost(ps, p);
    qr__coord_serve_waiters(ps);
    if (p->role != QR_ROLE_WORKER || p->worker_index < 0) return;
    int w = p->worker_index;
    if (ps->worker_conns[w] > 0 || ps->stopping) return; /* control.c and server.c count them */
    int live = 0;
    for (int i = 0; i < s->N; i++) live += ps->worker_conns[i] > 0;
    bool done = ps->step_limit > 0 && ps->global_step >= ps->step_limit;
    if (!done && !qr__liveness_finished(ps, w))
        qr__log(QR_LOG_WARN, "worker %d disconnected at step %lld; %d of %d workers alive "
                "(%d gradients make a step)", w, (long long)ps->global_step, live, s->N, s->R);
}

void qr__coord_stop(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    /* An abort (a lost ps, say) ends them with its status and reason, not
     * as the end of training: a worker takes QR_ESTOPPED for a job done. */
    qr__coord_end_waiters(s, ps->exit_status ? ps->exit_status : QR_ESTOPPED,
                          qr__ps_stop_reason(ps));
    if (s->timer_on) uv_timer_stop(&s->timer);
}

/*
 * coord.c - synchronous replicas, the part ps 0 plays: the coordinator.
 *
 * Step s of training goes like this (TensorFlow's SyncReplicasOptimizer,
 * with the quorum decided once for the whole model):
 *
 *   1. Workers push their gradients of step s to every ps (sync.c keeps
 *      them) and then COMMIT (worker, seq, local_step) here.
 *   2. A commit with local_step < s, or one that arrives after R commits
 *      were counted, is stale: it is dropped, counted, and answered
 *      QR_ESTALE ("dropped: stale"). Otherwise it joins the quorum.
 *   3. At R members the quorum is closed. APPLY(s, members sorted by
 *      (worker, seq)) goes to every ps, this one included.
 *   4. When every ps has applied, the global step becomes s+1 and
 *      max(N, R) tokens carrying s+1 join the token queue.
 *   5. A worker's TOKEN request is answered with the oldest token in the
 *      queue (FIFO, not tied to workers), at once or when one is released.
 *
 * init_tokens tokens carrying the initial step are queued when the chief
 * marks the cluster ready. No worker is needed for a step to complete
 * other than those whose gradients make it, the chief included.
 *
 * Waiting is bounded. A timer checks the current step once a second. Past
 * stall-report-ms it logs which workers are missing and for how long.
 * Past sync-timeout-ms it aborts: every token wait ends with QR_EABORTED
 * and that report, the other ps tasks are told to stop, and this one stops.
 * A stop (the chief's STOP, or a signal) ends every token wait with
 * QR_ESTOPPED.
 *
 * ps 0 reaches the other ps tasks through its links (links.c), which
 * carry APPLY and STOP.
 */
#include "ps/ps_internal.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* ---- tokens ---------------------------------------------------------------- */

static int push_token(ps_sync *s, int64_t step) {
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
    if (push_token(s, step)) return; /* makes room; then move it to the front */
    s->ntokens--;
    s->tokens_head = (s->tokens_head + s->tokens_cap - 1) % s->tokens_cap;
    s->tokens[s->tokens_head] = step;
    s->ntokens++;
}

static void answer_token(token_waiter *w, int status, int64_t step, const char *msg) {
    if (status) {
        qr__peer_reply_error(w->peer, &w->req, status, msg);
        return;
    }
    qr__peer_reply_step(w->peer, &w->req, step);
}

/* Grant tokens to waiting places in order; answer those whose TOKEN
 * request is in. A granted place whose request has not come yet keeps its
 * token (and its place) until it comes. */
static void serve_waiters(ps_sync *s) {
    token_waiter **link = &s->waiters;
    while (*link) {
        token_waiter *w = *link;
        if (!w->granted) {
            if (!s->ntokens) break; /* FIFO: nobody behind may pass */
            w->granted = true;
            w->token = pop_token(s);
        }
        if (w->has_request) {
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
static int add_waiter(ps_sync *s, ps_peer *p, token_waiter **out) {
    int held = 0;
    for (const token_waiter *o = s->waiters; o; o = o->next) held += o->peer == p;
    if (held >= PEER_MAX_WAITS)
        return qr__fail(QR_EINVAL, "this connection holds %d places in the token queue already "
                        "(at most %d)", held, PEER_MAX_WAITS);
    token_waiter *w = qr__calloc(1, sizeof *w);
    if (!w) return QR_ENOMEM;
    w->peer = p;
    if (s->waiters_tail) s->waiters_tail->next = w;
    else s->waiters = w;
    s->waiters_tail = w;
    if (out) *out = w;
    return QR_OK;
}

static void end_waiters(ps_sync *s, int status, const char *msg) {
    while (s->waiters) {
        token_waiter *w = s->waiters;
        s->waiters = w->next;
        if (w->has_request) answer_token(w, status, 0, msg);
        free(w);
    }
    s->waiters_tail = NULL;
}

static void abort_training(qr_ps *ps, const char *why);

/* ---- steps ------------------------------------------------------------------ */

static int cmp_member(const void *a, const void *b) {
    const quorum_member *x = a, *y = b;
    if (x->worker != y->worker) return x->worker < y->worker ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static void write_step_stats(qr_ps *ps, int64_t step, uint64_t wait_ns, uint64_t stale) {
    ps_sync *s = &ps->sync;
    if (!s->stats_file) return;
    fprintf(s->stats_file, "{\"step\":%lld,\"quorum\":[", (long long)step);
    for (int i = 0; i < s->nquorum; i++)
        fprintf(s->stats_file, "%s[%u,%u]", i ? "," : "", s->quorum[i].worker, s->quorum[i].seq);
    fprintf(s->stats_file, "],\"stale\":%llu,\"wait_ms\":%.3f}\n", (unsigned long long)stale,
            (double)wait_ns / 1e6);
    fflush(s->stats_file);
}

static void complete_step(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    int64_t step = ps->global_step;
    uint64_t wait_ns = s->last_grad_ns - s->step_started_ns;
    s->steps_done++;
    s->wait_ns_total += wait_ns;
    s->wait_ns_max = QR_MAX(s->wait_ns_max, wait_ns);
    for (int i = 0; i < s->nquorum; i++) {
        s->in_quorum[s->quorum[i].worker]++;
        qr__ckpt_data_pos(ps, s->quorum[i].worker, s->quorum[i].data_pos);
    }
    write_step_stats(ps, step, wait_ns, s->stale_commits - s->stale_at_step_start);
    if (qr__log_enabled(QR_LOG_DEBUG)) {
        char who[256] = "";
        size_t off = 0;
        for (int i = 0; i < s->nquorum && off < sizeof who; i++)
            off += (size_t)snprintf(who + off, sizeof who - off, "%s%u", i ? "," : "",
                                    s->quorum[i].worker);
        qr__log(QR_LOG_DEBUG, "step %lld done: workers %s, waited %.1f ms", (long long)step, who,
                (double)wait_ns / 1e6);
    }
    s->stale_at_step_start = s->stale_commits;
    ps->global_step = step + 1;
    s->applying = false;
    s->nquorum = 0;
    s->step_started_ns = qr__now_ns();
    int release = QR_MAX(s->N, s->R);
    for (int i = 0; i < release; i++)
        if (push_token(s, ps->global_step)) {
            abort_training(ps, qr_last_error());
            return;
        }
    serve_waiters(s);
    qr__ckpt_step_done(ps);
}

static void complete_apply_part(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    if (--s->applies_pending == 0) complete_step(ps);
}

/* An APPLY's answer from ps k (links.c). */
/* An APPLY's answer from ps k (qr_link_apply_cb). */
static void on_apply_answer(qr_ps *ps, int k, int64_t step, int status, const char *meta,
                            uint32_t len) {
    if (status) {
        char msg[700];
        snprintf(msg, sizeof msg, "ps %d could not apply step %lld: %.*s", k, (long long)step,
                 (int)QR_MIN(len, 500u), meta);
        abort_training(ps, msg);
        return;
    }
    complete_apply_part(ps);
}

static void start_apply(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    qsort(s->quorum, (size_t)s->nquorum, sizeof *s->quorum, cmp_member);
    s->applying = true;
    s->applies_pending = ps->cluster->nps;
    int64_t step = ps->global_step;
    qr__links_apply(ps, step, on_apply_answer);
    if (qr__sync_apply_step(ps, step, s->quorum, s->nquorum)) {
        abort_training(ps, qr_last_error());
        return;
    }
    complete_apply_part(ps);
}

/* ---- stall reports ------------------------------------------------------------ */

static void stall_report(qr_ps *ps, char *buf, size_t len) {
    ps_sync *s = &ps->sync;
    uint64_t now = qr__now_ns();
    int live = 0;
    for (int w = 0; w < s->N; w++) live += ps->worker_conns[w] > 0;
    size_t off = 0;
#define ADD(...) off += (size_t)snprintf(buf + off, off < len ? len - off : 0, __VA_ARGS__)
    if (live < s->R)
        ADD("only %d of %d workers are alive but a step needs %d gradients; ", live, s->N, s->R);
    if (ps->liveness.nfinished)
        ADD("%d worker%s finished; ", ps->liveness.nfinished, ps->liveness.nfinished > 1 ? "s have" : " has");
    if (s->applying)
        ADD("step %lld has waited %.1f s for the other ps tasks to apply it", (long long)ps->global_step,
            (double)(now - s->step_started_ns) / 1e9);
    else
        ADD("step %lld has waited %.1f s with %d of %d gradients", (long long)ps->global_step,
            (double)(now - s->step_started_ns) / 1e9, s->nquorum, s->R);
    /* A ps that is gone stalls every step: the workers cannot push to it,
     * and no step can be applied without it. Say so before the workers
     * it holds up. */
    for (int k = 1; k < ps->cluster->nps; k++) {
        uint64_t down_ns = qr__link_down_ns(ps, k);
        if (down_ns)
            ADD("; ps %d is unreachable (for %.1f s): no step can be applied without it", k,
                (double)(now - down_ns) / 1e9);
    }
    ADD("; missing:");
    int missing = 0;
    for (int w = 0; w < s->N; w++) {
        bool in = false;
        for (int i = 0; i < s->nquorum; i++) in |= (int)s->quorum[i].worker == w;
        if (in) continue;
        missing++;
        if (ps->worker_conns[w])
            ADD(" worker %d (connected, no gradient for this step yet);", w);
        else if (qr__liveness_finished(ps, w))
            ADD(" worker %d (finished);", w);
        else if (ps->worker_lost_ns[w])
            ADD(" worker %d (disconnected %.1f s ago);", w, (double)(now - ps->worker_lost_ns[w]) / 1e9);
        else
            ADD(" worker %d (never connected);", w);
    }
    if (!missing) ADD(" none");
#undef ADD
}

static void abort_training(qr_ps *ps, const char *why) {
    ps_sync *s = &ps->sync;
    if (s->aborted) return;
    s->aborted = true;
    snprintf(s->abort_msg, sizeof s->abort_msg, "synchronous training aborted: %s", why);
    end_waiters(s, QR_EABORTED, s->abort_msg);
    qr__ps_ask_abort(ps, QR_EABORTED, s->abort_msg);
}

/* The worker missing from the step that has been gone longest, or -1: a
 * step that waits for a dead worker waits for its restart, and that wait
 * is bounded by restart-wait-ms, not by sync-timeout-ms (ten minutes by
 * default, which is for slow workers). */
static int lost_worker_missing(const qr_ps *ps, uint64_t *gone_ms) {
    const ps_sync *s = &ps->sync;
    int who = -1;
    uint64_t now = qr__now_ns(), longest = 0;
    for (int w = 0; w < s->N; w++) {
        bool in = false;
        for (int i = 0; i < s->nquorum; i++) in |= (int)s->quorum[i].worker == w;
        if (in || ps->worker_conns[w] || !ps->worker_lost_ns[w] || qr__liveness_finished(ps, w))
            continue;
        uint64_t ms = (now - ps->worker_lost_ns[w]) / 1000000;
        if (who < 0 || ms > longest) who = w, longest = ms;
    }
    *gone_ms = longest;
    return who;
}

static void on_timer(uv_timer_t *t) {
    qr_ps *ps = t->data;
    ps_sync *s = &ps->sync;
    if (s->aborted || ps->stopping || !ps->ready) return;
    uint64_t now = qr__now_ns();
    uint64_t waited_ms = (now - s->step_started_ns) / 1000000;
    uint64_t gone_ms = 0;
    int lost = s->applying ? -1 : lost_worker_missing(ps, &gone_ms);
    if (lost >= 0 && waited_ms >= (uint64_t)s->restart_wait_ms &&
        gone_ms >= (uint64_t)s->restart_wait_ms) {
        char report[900], why[1200];
        stall_report(ps, report, sizeof report);
        snprintf(why, sizeof why, "worker %d left %.1f s ago and has not come back within "
                 "restart-wait-ms (%lld ms), and step %lld cannot do without it: %s", lost,
                 (double)gone_ms / 1e3, (long long)s->restart_wait_ms, (long long)ps->global_step,
                 report);
        abort_training(ps, why);
        return;
    }
    if (waited_ms < (uint64_t)s->report_ms) return;
    char report[900];
    stall_report(ps, report, sizeof report);
    if (waited_ms >= (uint64_t)s->timeout_ms) {
        char why[1000];
        snprintf(why, sizeof why, "no progress for %lld ms (sync-timeout-ms): %s",
                 (long long)s->timeout_ms, report);
        abort_training(ps, why);
        return;
    }
    if ((now - s->last_report_ns) / 1000000 >= (uint64_t)s->report_ms) {
        qr__log(QR_LOG_WARN, "stalled: %s", report);
        s->last_report_ns = now;
    }
}

/* ---- requests -------------------------------------------------------------- */

int qr__coord_init(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    s->quorum = qr__calloc((size_t)s->R, sizeof *s->quorum);
    s->in_quorum = qr__calloc((size_t)s->N, sizeof *s->in_quorum);
    s->stale_by_worker = qr__calloc((size_t)s->N, sizeof *s->stale_by_worker);
    if (!s->quorum || !s->in_quorum || !s->stale_by_worker)
        return QR_ENOMEM;
    const char *path = qr__config_str(ps->cfg, "sync-stats-file");
    if (path[0]) {
        s->stats_file = fopen(path, "w");
        if (!s->stats_file)
            return qr__fail(QR_EIO, "sync-stats-file %s: cannot open for writing", path);
    }
    uv_timer_init(&ps->loop, &s->timer);
    s->timer.data = ps;
    s->timer_on = true;
    uint64_t period = (uint64_t)QR_MAX(50, QR_MIN(1000, QR_MIN(s->report_ms, s->timeout_ms) / 4));
    uv_timer_start(&s->timer, on_timer, period, period);
    uv_unref((uv_handle_t *)&s->timer);
    s->step_started_ns = qr__now_ns();
    return QR_OK;
}

static void on_closed(uv_handle_t *h) {
    (void)h;
}

void qr__coord_close(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    if (s->timer_on && !uv_is_closing((uv_handle_t *)&s->timer))
        uv_close((uv_handle_t *)&s->timer, on_closed);
}

void qr__coord_ready(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    s->step = ps->global_step;
    s->step_started_ns = qr__now_ns();
    if (s->tokens_seeded) return;
    s->tokens_seeded = true;
    for (int i = 0; i < s->init_tokens; i++)
        if (push_token(s, ps->global_step)) return;
}

void qr__coord_set_step(qr_ps *ps, int64_t step) {
    ps_sync *s = &ps->sync;
    s->step = step;
    for (int i = 0; i < s->ntokens; i++) s->tokens[(s->tokens_head + i) % s->tokens_cap] = step;
}

int qr__coord_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    const qr_ps *ps = p->ps;
    if (!ps->sync.on)
        return qr__fail(QR_EINVAL, "%s: this ps trains in async mode", qr_msg_name(f->type));
    if (ps->index != 0)
        return qr__fail(QR_EINVAL, "%s goes to ps 0, not ps %d", qr_msg_name(f->type), ps->index);
    return qr__peer_check_small(f, f->type == QR_MSG_COMMIT ? QR_MSG_COMMIT_LEN : QR_MSG_TOKEN_LEN);
}

void qr__coord_commit(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    ps_sync *s = &ps->sync;
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_msg_commit m;
    qr_msg_get_commit(&r, &m);
    uint32_t worker = m.worker, seq = m.seq;
    int64_t local_step = m.local_step;
    char msg[512];
    if (s->aborted) {
        qr__peer_reply_error(p, f, QR_EABORTED, s->abort_msg);
        return;
    }
    if (!ps->ready) {
        qr__peer_reply_error(p, f, QR_ENOTREADY, "COMMIT: the chief has not initialized yet");
        return;
    }
    bool known = qr__is_worker(worker, s->N);
    if (!known || local_step > ps->global_step) {
        snprintf(msg, sizeof msg, "COMMIT: worker %u, step %lld: %s", worker,
                 (long long)local_step, !known ? "no such worker" : "that step has not started");
        qr__peer_reply_error(p, f, QR_EINVAL, msg);
        return;
    }
    /* The worker's place in the token queue, fresh or stale alike. */
    int rc = add_waiter(s, p, NULL);
    if (rc) {
        snprintf(msg, sizeof msg, "COMMIT: %s", qr_last_error());
        qr__peer_reply_error(p, f, rc, msg);
        return;
    }
    if (local_step < ps->global_step || s->applying) {
        qr__ckpt_data_pos(ps, worker, m.data_pos); /* its batch is spent all the same */
        s->stale_commits++;
        s->stale_by_worker[worker]++;
        snprintf(msg, sizeof msg, "dropped: stale: worker %u's gradient of step %lld came after "
                 "step %lld had its %d gradients", worker, (long long)local_step,
                 (long long)local_step, s->R);
        qr__peer_reply_error(p, f, QR_ESTALE, msg);
        serve_waiters(s);
        return;
    }
    for (int i = 0; i < s->nquorum; i++)
        if (s->quorum[i].worker == worker && s->quorum[i].seq == seq) {
            qr__peer_reply_error(p, f, QR_EINVAL, "COMMIT: this push was committed already");
            return;
        }
    s->quorum[s->nquorum++] = (quorum_member){worker, seq, m.data_pos};
    s->last_grad_ns = qr__now_ns();
    qr__peer_reply_step(p, f, ps->global_step);
    serve_waiters(s);
    if (s->nquorum == s->R) start_apply(ps);
    else qr__liveness_end_if_finished(ps);
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
    int rc = w ? QR_OK : add_waiter(s, p, &w);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "TOKEN: %s", qr_last_error());
        qr__peer_reply_error(p, f, rc, msg);
        return;
    }
    w->has_request = true;
    w->req = *f;
    serve_waiters(s);
}

void qr__coord_stats_json(qr_ps *ps, cJSON *j) {
    ps_sync *s = &ps->sync;
    cJSON_AddNumberToObject(j, "replicas_to_aggregate", s->R);
    cJSON_AddNumberToObject(j, "total_num_replicas", s->N);
    cJSON_AddNumberToObject(j, "init_tokens", s->init_tokens);
    cJSON_AddNumberToObject(j, "steps", (double)s->steps_done);
    cJSON_AddNumberToObject(j, "global_step", (double)ps->global_step);
    cJSON_AddNumberToObject(j, "stale_dropped", (double)s->stale_commits);
    cJSON *inq = cJSON_AddArrayToObject(j, "in_quorum");
    cJSON *stale = cJSON_AddArrayToObject(j, "stale_by_worker");
    for (int w = 0; w < s->N; w++) {
        cJSON_AddItemToArray(inq, cJSON_CreateNumber((double)s->in_quorum[w]));
        cJSON_AddItemToArray(stale, cJSON_CreateNumber((double)s->stale_by_worker[w]));
    }
    cJSON_AddNumberToObject(j, "mean_wait_ms",
                            s->steps_done ? (double)s->wait_ns_total / 1e6 / (double)s->steps_done : 0);
    cJSON_AddNumberToObject(j, "max_wait_ms", (double)s->wait_ns_max / 1e6);
    cJSON_AddNumberToObject(j, "tokens_queued", s->ntokens);
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
            free(w);
        } else {
            s->waiters_tail = w;
            link = &w->next;
        }
    }
    serve_waiters(s);
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
    end_waiters(s, QR_ESTOPPED, ps->end_msg[0] ? ps->end_msg : "stopped: training is over");
    if (s->timer_on) uv_timer_stop(&s->timer);
}

/*
 * liveness.c - a ps notices when the job around it has ended or lost a
 * part, so that no ps is ever left running for a job that is over.
 *
 *   ps 0: a run whose step limit is reached and whose workers have all
 *         left is over: it stops the cluster (a program's chief may end
 *         without STOP). A run that has had workers and has had
 *         none for restart-wait-ms has ended without an orderly stop: it
 *         stops the cluster with an error. A link to another ps down for
 *         restart-wait-ms ends the run too (links.c).
 *         The chief (worker 0) evaluates the model at the end and stops
 *         the cluster; the other workers wait for that stop once their
 *         steps are done (src/train). A chief whose connections closed
 *         (killed, or declared hung) without STOP or LEAVE is waited for
 *         restart-wait-ms; a new run of it that comes back in time ends
 *         the run as before. Past that the run ends with QR_ECHIEFLOST
 *         ("job ended without its chief: ... nobody evaluated the model"),
 *         which every task's exit status says (3; tools/quorum.c), unless
 *         a report that says more applies: every worker gone (above), or
 *         in sync mode a step the survivors cannot make (coord.c).
 *   ps k: ps 0 gone for restart-wait-ms (its link closed and not made
 *         again): this ps stops with an error. (With --ps-replicas 2 in
 *         async mode ps 1 takes the role over first when ps 0 is dead,
 *         failover.c, and the others follow it.) ps 0 beats on its link
 *         (links.c) every heartbeat-ms; a link silent for
 *         heartbeat-timeout-ms is a hung ps 0 (stopped, wedged): named,
 *         told to the supervisor, closed, and then waited for as a dead one.
 *   Every ps judged by another (a cluster of several ps) that finds its
 *   own loop did not run for heartbeat-timeout-ms (SIGSTOP and SIGCONT)
 *   knows it was declared hung and may have been replaced: it is fenced
 *   (peer.c, qr__ps_fenced) and ends without serving or writing anything.
 *
 * A worker that has finished its work (its data is done) says LEAVE to
 * ps 0 before it goes, so that its going is not taken for a death: ps 0
 * ends the run in order once every worker has finished, or, in sync mode,
 * once those still training are fewer than a step's quorum (min(R, N))
 * and one of them has sent a gradient to a step that therefore cannot
 * complete. That is how a sync run whose workers each go through their own
 * shard of the data ends (TensorFlow's SyncReplicasOptimizer hangs there);
 * until that gradient comes, the others may still pull the last values.
 *
 * And ps 0 watches the workers' heartbeats (BEAT, sent by each worker's
 * heartbeat thread, src/worker/heartbeat.c).
 *
 * A dead worker is seen at once: its kernel closes its connections. A hung
 * one (SIGSTOPped, wedged in a driver, a livelocked process) keeps them
 * open and says nothing; before heartbeats it held a bounded-staleness
 * wait or a synchronous step until sync-timeout-ms. Now a worker that has
 * beaten once and then stays silent for heartbeat-timeout-ms is declared
 * hung: ps 0 logs it and closes every connection it has from that worker,
 * which is what a death looks like, so everything that follows a death
 * follows (its tokens go back, the others stop waiting for its clock, the
 * stall report names it). If it comes back (SIGCONT), its next beat says
 * so; its calls find their connections closed and it reconnects.
 */
#include "ps/ps_internal.h"

#include <stdlib.h>

#define WATCH_PERIOD_MS 250

static void close_worker(qr_ps *ps, int w) {
    for (ps_peer *p = ps->peers; p; p = p->next)
        if (p->worker_index == w || p->beat_worker == w) qr_conn_close(p->conn);
}

static bool past_step_limit(const qr_ps *ps) {
    return ps->step_limit > 0 && ps->global_step >= ps->step_limit;
}

/* ps 0: since when the chief has been gone without ending the run: its
 * last connection closed, and it neither stopped the cluster (that stops
 * this ps) nor said LEAVE. 0: it is connected, finished, or never came. */
static uint64_t chief_gone_since(const qr_ps *ps) {
    if (ps->worker_conns[0] > 0 || qr__liveness_finished(ps, 0)) return 0;
    return ps->worker_lost_ns[0];
}

/* ps 0: has the job ended, in order or not? */
static void watch_workers_left(qr_ps *ps, uint64_t now) {
    ps_liveness *l = &ps->liveness;
    int live = 0;
    for (int w = 0; w < ps->cluster->nworkers; w++) live += ps->worker_conns[w] > 0;
    if (live) {
        l->none_since_ns = 0;
        return;
    }
    if (!l->seen_workers) return;
    if (!l->none_since_ns) l->none_since_ns = now;
    if (past_step_limit(ps)) {
        /* Training is done, but a chief that left without ending the run
         * has not evaluated it: it is waited for (watch_chief). */
        if (chief_gone_since(ps)) return;
        qr__log(QR_LOG_INFO, "step limit %lld reached and every worker has left: stopping",
                (long long)ps->step_limit);
        qr__ps_ask_stop_cluster(ps);
        return;
    }
    uint64_t idle_ms = (now - l->none_since_ns) / 1000000;
    if (idle_ms >= (uint64_t)ps->restart_wait_ms) {
        char why[512];
        snprintf(why, sizeof why, "no worker has been connected for %.1f s (restart-wait-ms) and "
                 "the run is at step %lld%s: the job has ended without an orderly stop; stopping "
                 "the cluster", (double)idle_ms / 1e3, (long long)ps->global_step,
                 ps->step_limit > 0 ? ", before its step limit" : "");
        qr__ps_ask_abort(ps, QR_EABORTED, why);
    }
}

/* ps 0: a chief gone without ending the run is waited for restart-wait-ms
 * (a new run of it rejoins and ends the run); then the run ends with
 * QR_ECHIEFLOST, unless every worker is gone or, in sync mode, the
 * others cannot make a step without it: before the step limit those
 * reports say more (watch_workers_left; coord.c names the step it stalls,
 * the one outcome of docs/SYNC.md). */
static void watch_chief(qr_ps *ps, uint64_t now) {
    ps_liveness *l = &ps->liveness;
    uint64_t since = chief_gone_since(ps);
    if (!since) {
        if (l->chief_lost_said && ps->worker_conns[0] > 0)
            qr__log(QR_LOG_INFO, "the chief (worker 0) is back after %.1f s",
                    (double)(now - ps->worker_lost_ns[0]) / 1e9);
        l->chief_lost_said = false;
        return;
    }
    if (!l->chief_lost_said) {
        l->chief_lost_said = true;
        qr__log(QR_LOG_WARN, "the chief (worker 0) was lost at global step %lld without ending "
                "the run: waiting up to %.0f s (restart-wait-ms) for a new run of it; without "
                "it nobody evaluates the model", (long long)l->chief_lost_step,
                ps->restart_wait_ms / 1e3);
    }
    uint64_t gone_ms = (now - since) / 1000000;
    if (gone_ms < (uint64_t)ps->restart_wait_ms) return;
    int others = 0;
    for (int w = 1; w < ps->cluster->nworkers; w++) others += ps->worker_conns[w] > 0;
    const ps_sync *s = &ps->sync;
    if (!past_step_limit(ps) && (!others || (s->on && others < QR_MIN(s->R, s->N)))) return;
    char msg[sizeof ps->abort_msg], of[32] = "";
    if (ps->step_limit > 0) snprintf(of, sizeof of, " of %lld", (long long)ps->step_limit);
    snprintf(msg, sizeof msg, "job ended without its chief: worker 0 (%s) was lost at global "
             "step %lld and not restarted within restart-wait-ms (%lld ms); nobody evaluated "
             "the model (the run was at global step %lld%s)", ps->cluster->workers[0],
             (long long)l->chief_lost_step, (long long)ps->restart_wait_ms,
             (long long)ps->global_step, of);
    qr__ps_abort_as(ps, QR_ECHIEFLOST, msg);
}

void qr__liveness_coordinator_lost(qr_ps *ps) {
    if (!ps->stopping && !ps->coordinator_lost_ns) ps->coordinator_lost_ns = qr__now_ns();
}

/* ps k: ps 0 beats on its link every heartbeat-ms; a link that brings
 * nothing for heartbeat-timeout-ms comes from a ps 0 that is stopped or
 * wedged with its socket open: it is declared hung, named, reported to the
 * supervisor (launch kills and restarts it), and its link closed, so that
 * what follows a death follows (restart-wait-ms; a rollback when a new
 * run of ps 0 says HELLO). */
static void watch_coordinator_beats(qr_ps *ps, uint64_t now) {
    ps_liveness *l = &ps->liveness;
    if (l->beat_ms <= 0 || ps->coordinator_lost_ns || !ps->coordinator_heard_ns) return;
    uint64_t silent_ms = qr__ms_since(now, ps->coordinator_heard_ns);
    if (silent_ms < (uint64_t)l->timeout_ms) return;
    bool linked = false;
    for (ps_peer *p = ps->peers; p; p = p->next) linked |= p->role == QR_ROLE_COORDINATOR;
    if (!linked) return;
    /* The coordinator: ps 0, or its successor since ps 0 failed over (the
     * supervisor must kill that one, not a replacement of ps 0). */
    int c = ps->coord_index;
    qr__log(QR_LOG_ERROR, "ps %d (%s), the coordinator, sent nothing for %llu ms "
            "(heartbeat-timeout-ms %lld; it beats every heartbeat-ms): hung or stopped; treated "
            "as lost: waiting up to %.0f s (restart-wait-ms) for a new run of it", c,
            ps->cluster->ps[c], (unsigned long long)silent_ms, (long long)l->timeout_ms,
            ps->restart_wait_ms / 1e3);
    qr__tell_supervisor("hung ps %d %llu", c, (unsigned long long)silent_ms);
    l->hung_ps_total++;
    ps->coordinator_heard_ns = 0;
    for (ps_peer *p = ps->peers; p; p = p->next)
        if (p->role == QR_ROLE_COORDINATOR) qr_conn_close(p->conn); /* `lost` follows */
}

/* ps k: ps 0 has been gone too long. */
static void watch_coordinator(qr_ps *ps, uint64_t now) {
    watch_coordinator_beats(ps, now);
    if (!ps->coordinator_lost_ns) return;
    uint64_t gone_ms = (now - ps->coordinator_lost_ns) / 1000000;
    if (gone_ms < (uint64_t)ps->restart_wait_ms) return;
    char why[512];
    snprintf(why, sizeof why, "ps %d (%s), the coordinator, has been gone for %.1f s and did "
             "not come back within restart-wait-ms: the job has ended; stopping",
             ps->coord_index, ps->cluster->ps[ps->coord_index], (double)gone_ms / 1e3);
    ps->coordinator_lost_ns = 0;
    qr__ps_ask_abort(ps, QR_EABORTED, why);
}

static void on_watch(uv_timer_t *t) {
    qr_ps *ps = t->data;
    ps_liveness *l = &ps->liveness;
    uint64_t now = qr__now_ns();
    if (ps->stopping || qr__ps_fenced(ps)) return;
    /* This ps itself did not run for a while (stopped, with one ps only:
     * nobody fences it): the workers' silence meanwhile is its own. */
    if (l->watch_ns && now - l->watch_ns >= (uint64_t)l->timeout_ms * 1000000ull && l->beat_ns)
        for (int w = 0; w < ps->cluster->nworkers; w++)
            if (l->beat_ns[w]) l->beat_ns[w] = now;
    /* Back from a pause of its own (stopped, or a loop that lagged): what
     * its peers sent meanwhile is still unread in its sockets (libuv runs
     * timers before it reads), so their silence is not theirs yet. Judge
     * nobody this turn; the next one comes after the reads. (A ps 1
     * stopped 0.85 s once named a healthy ps 0 hung, and launch killed it.) */
    bool was_away = l->watch_ns && now - l->watch_ns >= 2ull * WATCH_PERIOD_MS * 1000000ull;
    l->watch_ns = now;
    if (was_away) return;
    if (!qr__ps_coordinates(ps) && qr__failover_successor_watch(ps, now)) return;
    if (!qr__ps_coordinates(ps)) {
        watch_coordinator(ps, now);
        return;
    }
    watch_workers_left(ps, now);
    if (!ps->stopping) watch_chief(ps, now);
    qr__links_watch(ps);
    if (!ps->stopping) qr__failover_backup_silent(ps, 0, qr__replica_backup_silent_ms(ps, now));
    for (int w = 0; w < ps->cluster->nworkers && !ps->stopping; w++) {
        if (!l->beat_ns[w] || l->hung[w] || l->finished[w]) continue;
        uint64_t silent_ms = (now - l->beat_ns[w]) / 1000000;
        if (silent_ms < (uint64_t)l->timeout_ms) continue;
        l->hung[w] = true;
        l->hung_total++;
        qr__log(QR_LOG_WARN, "worker %d sent no heartbeat for %llu ms (heartbeat-timeout-ms "
                "%lld): hung or stopped; treated as lost, its connections closed", w,
                (unsigned long long)silent_ms, (long long)l->timeout_ms);
        /* A hung chief would end the job unevaluated (watch_chief): launch
         * kills it, so that --max-restarts starts it again. */
        if (w == 0) qr__tell_supervisor("hung worker 0 %llu", (unsigned long long)silent_ms);
        close_worker(ps, w);
    }
}

int qr__liveness_coordinate(qr_ps *ps) {
    ps_liveness *l = &ps->liveness;
    if (l->beat_ns) return QR_OK;
    int n = QR_MAX(ps->cluster->nworkers, 1);
    l->beat_ns = qr__calloc((size_t)n, sizeof *l->beat_ns);
    l->hung = qr__calloc((size_t)n, sizeof *l->hung);
    l->finished = qr__calloc((size_t)n, sizeof *l->finished);
    l->nfinished = 0;
    if (!l->beat_ns || !l->hung || !l->finished) return QR_ENOMEM;
    /* A successor of the coordinator: the workers that told it they had
     * finished, as the copy of its shard has it (QR_REPL_LEAVE). */
    const repl_last *told = qr__replica_on(ps) ? qr__replica_shard0_record(ps) : NULL;
    for (int w = 0; told && w < ps->cluster->nworkers; w++)
        if (told[w].finished) {
            l->finished[w] = true;
            l->nfinished++;
        }
    return QR_OK;
}

int qr__liveness_init(qr_ps *ps) {
    ps_liveness *l = &ps->liveness;
    l->timeout_ms = qr__config_int(ps->cfg, "heartbeat-timeout-ms");
    l->beat_ms = qr__config_int(ps->cfg, "heartbeat-ms");
    if (qr__ps_coordinates(ps) && qr__liveness_coordinate(ps)) return QR_ENOMEM;
    uv_timer_init(&ps->loop, &l->timer);
    l->timer.data = ps;
    l->timer_on = true;
    uv_timer_start(&l->timer, on_watch, WATCH_PERIOD_MS, WATCH_PERIOD_MS);
    uv_unref((uv_handle_t *)&l->timer); /* never keeps the ps alive by itself */
    return QR_OK;
}

void qr__liveness_close(qr_ps *ps) {
    ps_liveness *l = &ps->liveness;
    if (l->timer_on && !uv_is_closing((uv_handle_t *)&l->timer))
        uv_close((uv_handle_t *)&l->timer, NULL);
}

void qr__liveness_free(qr_ps *ps) {
    free(ps->liveness.beat_ns);
    free(ps->liveness.hung);
    free(ps->liveness.finished);
    ps->liveness.beat_ns = NULL;
    ps->liveness.hung = NULL;
    ps->liveness.finished = NULL;
}

bool qr__liveness_finished(const qr_ps *ps, int worker) {
    const ps_liveness *l = &ps->liveness;
    return l->finished && worker >= 0 && worker < ps->cluster->nworkers && l->finished[worker];
}

void qr__liveness_worker_gone(qr_ps *ps, int worker) {
    /* A killed worker's sockets close at once; without this, the watch
     * would name it hung ("sent no heartbeat") heartbeat-timeout-ms later,
     * sending anyone reading the log after a hang that never was. */
    if (ps->liveness.beat_ns) ps->liveness.beat_ns[worker] = 0;
}

void qr__liveness_worker_back(qr_ps *ps, int worker) {
    ps_liveness *l = &ps->liveness;
    /* Said as it connects: a chief back just before the run's end (it
     * only evaluates and stops the cluster) may leave no turn of the watch
     * to say it (watch_chief). */
    if (worker == 0 && l->chief_lost_said) {
        l->chief_lost_said = false;
        qr__log(QR_LOG_INFO, "the chief (worker 0) is back after %.1f s",
                (double)(qr__now_ns() - ps->worker_lost_ns[0]) / 1e9);
    }
    if (!qr__liveness_finished(ps, worker)) return;
    ps->liveness.finished[worker] = false;
    ps->liveness.nfinished--;
    qr__log(QR_LOG_INFO, "worker %d had finished and is back", worker);
}

void qr__liveness_end_if_finished(qr_ps *ps) {
    ps_liveness *l = &ps->liveness;
    int n = ps->cluster->nworkers;
    const ps_sync *s = &ps->sync;
    char why[512];
    if (!l->finished || !l->nfinished || ps->stopping) return;
    if (l->nfinished == n) {
        snprintf(why, sizeof why, "every worker has finished (global step %lld): training is over",
                 (long long)ps->global_step);
    } else if (s->on && n - l->nfinished < QR_MIN(s->R, n) && s->nquorum > 0 && !s->applying) {
        size_t off = (size_t)snprintf(why, sizeof why, "worker%s", l->nfinished > 1 ? "s" : "");
        for (int w = 0, k = 0; w < n; w++) {
            if (!l->finished[w]) continue;
            off += (size_t)snprintf(why + off, off < sizeof why ? sizeof why - off : 0, "%s %d",
                                    k++ ? "," : "", w);
        }
        snprintf(why + off, off < sizeof why ? sizeof why - off : 0,
                 " finished, and the %d still training cannot make a step of %d gradients "
                 "(global step %lld): training is over", n - l->nfinished, s->R,
                 (long long)ps->global_step);
    } else {
        return;
    }
    qr__ps_ask_end(ps, why);
}

void qr__liveness_leave(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    ps_liveness *l = &ps->liveness;
    if (!qr__ps_coordinates(ps) || p->role != QR_ROLE_WORKER || !l->finished) {
        qr__peer_reply_error(p, f, QR_EINVAL, "LEAVE: a worker says it has finished to ps 0, "
                             "after its HELLO");
        return;
    }
    int w = p->worker_index;
    if (!l->finished[w]) {
        l->finished[w] = true;
        l->nfinished++;
        /* The copy of this ps's shard keeps it, in order with the pushes:
         * its ps, should it succeed this one, ends the run as it would. */
        if (qr__replica_on(ps))
            qr__replica_send_shard0(ps, qr__replica_begin(ps, &(qr_msg_repl_head){
                                                           .flags = QR_REPL_LEAVE,
                                                           .worker = (uint32_t)w}));
        qr__log(QR_LOG_INFO, "worker %d has finished at global step %lld (%d of %d workers have)",
                w, (long long)ps->global_step, l->nfinished, ps->cluster->nworkers);
    }
    qr__peer_reply(p, f, QR_OK, NULL, NULL, 0, NULL, NULL);
    qr__liveness_end_if_finished(ps);
}

int qr__liveness_beat_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    if (!qr__ps_coordinates(p->ps) && p->role != QR_ROLE_COORDINATOR)
        return qr__fail(QR_EINVAL, "BEAT goes to ps 0 (a worker's), or from ps 0's link");
    return qr__peer_check_small(f, QR_MSG_BEAT_LEN);
}

void qr__liveness_beat(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    uint32_t meta_len = f->meta_len;
    qr_ps *ps = p->ps;
    if (p->role == QR_ROLE_COORDINATOR) {
        /* ps 0's beat on its link: answered, so that ps 0 hears this ps;
         * with two copies the answer says how long this ps's link to its
         * backup has been silent: a partition between the two is one ps 0
         * cannot see by itself (failover.c). */
        qr_wbuf out = {0};
        if (qr__replica_on(ps)) qr_wbuf_u64(&out, qr__replica_backup_silent_ms(ps, qr__now_ns()));
        qr__peer_reply(p, f, QR_OK, &out, NULL, 0, NULL, NULL);
        qr_wbuf_free(&out);
        return;
    }
    ps_liveness *l = &ps->liveness;
    qr_rbuf r;
    qr_rbuf_init(&r, meta, meta_len);
    uint32_t w = qr_msg_get_worker(&r);
    if (r.bad || !qr__is_worker(w, ps->cluster->nworkers) || !l->beat_ns) return;
    if (p->beat_worker < 0) p->beat_worker = (int)w;
    if (l->hung[w]) {
        l->hung[w] = false;
        qr__log(QR_LOG_WARN, "worker %u beats again after being declared hung", w);
    }
    l->beat_ns[w] = qr__now_ns();
}

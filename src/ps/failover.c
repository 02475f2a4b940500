/*
 * failover.c - failover in place (--ps-replicas 2): the view of
 * where each shard is served, kept by the coordinator (ps 0, or ps 1
 * once ps 0 has failed over), and what every ps makes of it.
 * docs/REPLICATION.md, "Failover".
 *
 * View 0 is the placement of the start: shard k served by ps k, its copy
 * on ps (k+1) mod P. When ps 0 finds ps k (k > 0) dead (its link lost and
 * its address refusing a new one) or hung (silent for
 * heartbeat-timeout-ms, links.c), and k's backup and k's own copy of its
 * neighbour's shard leave every shard with a copy, ps 0 does not wait for
 * k, roll back or abort: it moves to the next view, in which ps k has
 * failed, and
 *   - tells every other ps (VIEW on its links): ps (k+1) promotes its
 *     copy of shard k (replica_backup.c: served to the workers'
 *     connections that name shard k, forwards of the old primary refused
 *     with QR_EVIEW), and ps (k-1) stops forwarding to k (its shard goes
 *     on on one copy);
 *   - applies it itself (ps 0 may be either);
 *   - tells every worker connected to it (a VIEW notice, unasked); a
 *     worker also asks (VIEW) when a ps refuses its HELLO as of an old
 *     view, and resends the pushes the lost ps did not answer, which the
 *     duplicate record answers if they were applied (replica_forward.c);
 *   - tells the supervisor ("failover ps K VIEW by C", C the coordinator): `quorum launch` then
 *     neither kills nor restarts k, and does not count it a failure.
 * In sync mode ps 0 also hands shard k's part of a step in flight to the
 * promoted copy (qr__coord_failed_over); the copy holds every push of it
 * (sync.c; the last ps's copy is on ps 0, which applies it with its own
 * part). A failed ps's replacement joins as the backup of its shards
 * (rerep.c: the view marks it JOINING, then BACKUP). A
 * shard with no copy left (two neighbours failed, or a neighbour and a
 * replacement still being copied) is not failed over: ps 0 rolls the
 * cluster back to its newest checkpoint at once, or aborts without
 * --checkpoint-dir (rollback.c, qr__rollback_both_lost); the view starts
 * again with every ps ALIVE, under the next number
 * (qr__failover_rolled_back).
 *
 * ps 0 itself, the coordinator, is failed over by its successor ps 1
 * (ps 0 dead: its address refusing): ps 1 holds the copy of shard 0 and
 * with it the global step (async) or the step in flight's pushes and
 * members (sync, qr__coord_take_over); it takes the role (take_over,
 * below: coord_index, links, liveness, the sync coordinator, the
 * checkpoints) and fails ps 0 over as the coordinator fails over any
 * ps. Once a replacement of ps 0 has been copied shard 0 again (it is
 * then ps 1's backup of it), it is ps 1's successor in turn, by the same
 * steps (qr__failover_successor): it serves shard 0 as its own again.
 * A hung coordinator still accepting is waited for as with one copy
 * (restart-wait-ms, then the run aborts or rolls back); under `quorum
 * launch` it is reported hung and killed, and its successor follows.
 *
 * A worker's connection names the view it knows and its shard (HELLO,
 * role QR_ROLE_WORKER_VIEW): a ps other than ps 0 refuses another view
 * (QR_EVIEW, "old view N, now M") and a shard it does not serve in it;
 * ps 0 accepts it and sends the view at once.
 */
#include "ps/ps_internal.h"
#include "wire/blocking.h"

#include <string.h>

/* What the view makes of this ps. A replacement (JOINING, BACKUP) serves
 * nothing and is copied its shards (rerep.c); its sources start copying
 * when they see it JOINING. */
void qr__failover_apply(qr_ps *ps) {
    ps_replica *r = &ps->replica;
    int self = r->failed[ps->index], prim = r->failed[r->primary], back = r->failed[r->backup];
    if (self == QR_PS_FAILED) {
        char why[200];
        snprintf(why, sizeof why, "view %llu names this ps failed: its shard is served by ps %d",
                 (unsigned long long)r->view, r->backup);
        qr__ps_fence(ps, why);
        return;
    }
    if (prim != QR_PS_ALIVE) qr__replica_promote(ps);
    /* the promoted copy's copy: on the primary's replacement, or none */
    if (prim == QR_PS_FAILED) qr__replica_link_gone(&r->copy_link);
    else if (prim == QR_PS_JOINING && r->promoted &&
             (self == QR_PS_ALIVE || self == QR_PS_BACKUP))
        qr__rerep_start(&r->copy_link);
    /* this ps's own shard's copy: on its backup (or the backup's
     * replacement), or none. A replacement's own shard is served by its
     * backup ps, which copies it here (rerep.c). */
    if (self != QR_PS_ALIVE) qr__replica_link_gone(&r->link); /* ps (k+1) serves it */
    else if (back == QR_PS_FAILED) qr__replica_backup_gone(ps);
    else if (back == QR_PS_JOINING) qr__rerep_start(&r->link);
    /* Both ALIVE with the link given up: this ps is a replacement that
     * waited to be made a backup (its link refused by the ps then serving
     * its shard) when the cluster rolled back to a checkpoint, which both
     * restored (rollback.c): its shard is its own again, forwarded as at
     * the start. */
    else if (back == QR_PS_ALIVE && r->link.gone) qr__replica_link_again(&r->link);
}

static void put_view(const qr_ps *ps, qr_wbuf *b) {
    qr_msg_put_view(b, ps->replica.view, ps->cluster->nps, ps->replica.failed);
}

/* ps 0 tells a worker the view, unasked. */
static void notify(ps_peer *p);

void qr__failover_notify_workers(qr_ps *ps) {
    for (ps_peer *p = ps->peers; p; p = p->next)
        if (p->role == QR_ROLE_WORKER) notify(p);
}

static void notify(ps_peer *p) {
    qr_frame req = {.type = QR_MSG_VIEW, .request_id = QR_VIEW_NOTICE_ID};
    qr_wbuf meta = {0};
    put_view(p->ps, &meta);
    qr__peer_reply(p, &req, QR_OK, &meta, NULL, 0, NULL, NULL);
    qr_wbuf_free(&meta);
}

bool qr__failover_lost(qr_ps *ps, int k, int why) {
    ps_replica *r = &ps->replica;
    int nps = ps->cluster->nps;
    if (!qr__replica_on(ps) || !qr__ps_coordinates(ps) || k < 0 || k >= nps || k == ps->index) return false;
    if (r->failed[k] == QR_PS_FAILED) return true;
    const char *how = why == QR_LOST_HUNG ? "is hung (no answer to heartbeats for "
                                            "heartbeat-timeout-ms)"
                      : why == QR_LOST_CUT_OFF ? "is cut off from its primary (a partition)"
                                               : "is gone (its link lost, its address refusing)";
    int next = (k + 1) % nps, prev = (k + nps - 1) % nps;
    /* A neighbour failed, or a replacement not yet copied its shards,
     * holds no full copy: a shard k holds would be lost with it. */
    bool next_down = r->failed[next] == QR_PS_FAILED || r->failed[next] == QR_PS_JOINING;
    bool prev_down = r->failed[prev] == QR_PS_FAILED || r->failed[prev] == QR_PS_JOINING;
    if ((next_down && r->failed[k] == QR_PS_ALIVE) || prev_down) {
        /* rollback.c: back to the newest checkpoint, or the abort */
        if (prev_down) return qr__rollback_both_lost(ps, prev, k, prev);
        return qr__rollback_both_lost(ps, k, k, next);
    }
    int was = r->failed[k];
    int served = r->failed[prev] == QR_PS_BACKUP ? prev : -1; /* from k's promoted copy */
    r->failed[k] = QR_PS_FAILED;
    /* A replacement before it held shard prev's copy as its backup: prev
     * serves its own shard again (the state of the start). */
    if (r->failed[prev] == QR_PS_BACKUP) r->failed[prev] = QR_PS_ALIVE;
    r->view++;
    if (was == QR_PS_ALIVE)
        qr__log(QR_LOG_WARN, "ps %d (%s) %s: failed over in place, view %llu: shard %d is "
                "served by its backup ps %d from now on, and shard %d goes on without its "
                "backup; both on one copy until a replacement is copied them "
                "(re-replication); nothing rolls back", k, ps->cluster->ps[k], how,
                (unsigned long long)r->view, k, next, prev);
    else
        qr__log(QR_LOG_WARN, "ps %d (%s), a replacement %s, %s: view %llu: shards %d (served by "
                "ps %d) and %d go on on one copy; nothing rolls back", k, ps->cluster->ps[k],
                was == QR_PS_JOINING ? "being copied its shards" : "holding copies", how,
                (unsigned long long)r->view, k, next, prev);
    qr__tell_supervisor("failover ps %d %llu by %d", k, (unsigned long long)r->view, ps->index);
    qr_wbuf_reset(&ps->sync.view_meta);
    put_view(ps, &ps->sync.view_meta);
    qr__failover_apply(ps);
    qr__links_view(ps);
    qr__failover_notify_workers(ps);
    qr__coord_failed_over(ps, k, served);
    return true;
}

/* ps 0, its run after a rollback: every ps serves its shard as placed
 * (the state of the start), under the view number after the last one of
 * the run before, never 0 again. Views only move forward: a worker or a
 * ps takes a view only if it is newer than the one it knows (apply_view,
 * qr__failover_view_message), so view 0 again would be ignored by a
 * worker that has not learnt of the rollback yet, and such a worker's
 * old view N would equal a rolled-back ps k's; under N + 1 an old worker
 * is refused by every ps k, asks ps 0, and meets its new run (the
 * rollback). Each other ps, rolled back to view 0, is sent N + 1. */
void qr__failover_rolled_back(qr_ps *ps, uint64_t view_before) {
    ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps) || !qr__ps_coordinates(ps) || !view_before) return;
    r->view = view_before + 1;
    qr__log(QR_LOG_INFO, "view %llu: every ps serves its own shard again, with its backup on "
            "the next ps (the placement of the start, after the rollback)",
            (unsigned long long)r->view);
    qr_wbuf_reset(&ps->sync.view_meta);
    put_view(ps, &ps->sync.view_meta);
    qr__links_view(ps);
}

/* A partition between a primary and its backup, ps 0 reaching both: the
 * primary's pushes wait for a backup that never answers, so one side must
 * go. The backup is failed over (its own shard moves to its backup in
 * turn; the primary's goes on on one copy, its waiting pushes answered);
 * when the backup is ps 0, whose coordinator role cannot move, the
 * primary is (its shard is served from ps 0's copy). Either way the ps
 * failed over is fenced at its first forward to a copy that serves its
 * shard now, so nothing is applied twice, and every acknowledged push is
 * on the copy that goes on (an acknowledgement needed both). */
void qr__failover_backup_silent(qr_ps *ps, int primary, uint64_t silent_ms) {
    ps_replica *r = &ps->replica;
    int nps = ps->cluster->nps;
    int64_t timeout_ms = ps->liveness.timeout_ms;
    if (!qr__replica_on(ps) || !qr__ps_coordinates(ps) || ps->stopping || timeout_ms <= 0 ||
        silent_ms < (uint64_t)timeout_ms || primary < 0 || primary >= nps)
        return;
    int backup = (primary + 1) % nps;
    if (r->failed[primary] != QR_PS_ALIVE ||
        (r->failed[backup] != QR_PS_ALIVE && r->failed[backup] != QR_PS_BACKUP))
        return;
    /* A backup ps 0 does not reach either is ps 0's to judge (dead or hung). */
    if (backup != ps->index && !qr__links_reaches(ps, backup)) return;
    if (primary != ps->index && !qr__links_reaches(ps, primary)) return;
    int victim = backup != ps->index ? backup : primary;
    qr__log(QR_LOG_ERROR, "ps %d (%s) has not reached its backup ps %d (%s) for %llu ms "
            "(heartbeat-timeout-ms %lld) while ps 0 reaches both: a partition between them; "
            "shard %d's pushes would wait for good, so ps %d is failed over (%s)", primary,
            ps->cluster->ps[primary], backup, ps->cluster->ps[backup],
            (unsigned long long)silent_ms, (long long)timeout_ms, primary, victim,
            victim == backup ? "the backup's side goes" : "ps 0's role cannot move: the "
            "primary's side goes");
    qr__links_fail(ps, victim, QR_LOST_CUT_OFF);
}

void qr__failover_beat_answer(qr_ps *ps, int index, const uint8_t *meta, uint32_t len) {
    if (len < 8) return; /* one copy: nothing said */
    qr_rbuf r;
    qr_rbuf_init(&r, meta, len);
    uint64_t silent_ms = qr_rbuf_u64(&r);
    if (!r.bad) qr__failover_backup_silent(ps, index, silent_ms);
}

int qr__failover_hello(ps_peer *p, const qr_msg_hello *m) {
    qr_ps *ps = p->ps;
    ps_replica *r = &ps->replica;
    if (!m->with_view) return QR_OK; /* a worker of one copy: as always */
    if (!qr__replica_on(ps))
        return qr__fail(QR_EINVAL, "HELLO: a worker of --ps-replicas 2, but this ps keeps one "
                        "copy: give every task the same --ps-replicas");
    /* ps 0 keeps the view: it tells an old one the view instead
     * (qr__failover_welcomed). */
    if (!qr__ps_coordinates(ps) && m->view != r->view)
        return qr__fail(QR_EVIEW, "old view %llu, now %llu%s: ask ps 0 for the view",
                        (unsigned long long)m->view, (unsigned long long)r->view,
                        m->view > r->view ? " here (ps 0 has not told this ps yet)" : "");
    if (m->shard == (uint32_t)ps->index && r->failed[ps->index] == QR_PS_ALIVE) return QR_OK;
    if (m->shard == (uint32_t)r->primary && r->promoted) {
        p->promoted_shard = true;
        return QR_OK;
    }
    return qr__fail(QR_EVIEW, "old view: ps %d does not serve shard %u in view %llu", ps->index,
                    m->shard, (unsigned long long)r->view);
}

void qr__failover_welcomed(ps_peer *p, const qr_msg_hello *m) {
    if (m->with_view && qr__ps_coordinates(p->ps) && m->view < p->ps->replica.view) notify(p);
}

int qr__failover_view_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    (void)meta;
    qr_ps *ps = p->ps;
    if (!qr__replica_on(ps))
        return qr__fail(QR_EINVAL, "VIEW: this ps keeps one copy of its shard (ps-replicas 1): "
                        "there is no view");
    if (p->role == QR_ROLE_COORDINATOR)
        return qr__peer_check_small(f, 12 + 4 * (uint32_t)ps->cluster->nps);
    return qr__peer_check_small(f, 0);
}

void qr__failover_view_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    ps_replica *r = &ps->replica;
    if (p->role != QR_ROLE_COORDINATOR) { /* a worker asks */
        qr_wbuf out = {0};
        put_view(ps, &out);
        qr__peer_reply(p, f, QR_OK, &out, NULL, 0, NULL, NULL);
        qr_wbuf_free(&out);
        return;
    }
    int nps = ps->cluster->nps;
    uint8_t failed[nps];
    uint64_t view;
    qr_rbuf rb;
    qr_rbuf_init(&rb, meta, f->meta_len);
    qr_msg_get_view(&rb, nps, &view, failed);
    if (rb.bad) {
        qr__peer_reply_error(p, f, QR_EPROTO, "VIEW: the record names another number of ps");
        return;
    }
    if (view > r->view) {
        r->view = view;
        memcpy(r->failed, failed, (size_t)nps);
        qr__log(QR_LOG_INFO, "view %llu from ps %d", (unsigned long long)view, ps->coord_index);
        qr__failover_apply(ps);
        qr__rerep_release_hellos(ps); /* answered as of this view */
    }
    /* A copy this view started (rerep.c): answered once it is made. */
    if (qr__rerep_hold_view(p, f)) return;
    qr__peer_reply(p, f, QR_OK, NULL, NULL, 0, NULL, NULL);
}

/* ---- the coordinator's role moves (the coordinator dead) ---------------------- */

/* Does ps k's address refuse a connection? The kernel answers at once for
 * a process that is gone (no listener on its socket or port); a live ps,
 * hung or not, accepts. Asked at most once a second (each asking leaves
 * a connection in a stopped ps's backlog), and bounded by PROBE_MS: it
 * runs on the loop. */
#define PROBE_MS 200
static bool refuses(qr_ps *ps, int k, uint64_t now) {
    if (now - ps->replica.probe_ns < 1000000000ull) return false;
    ps->replica.probe_ns = now;
    qr_addr a;
    if (qr_addr_parse(ps->cluster->ps[k], &a)) return false;
    bool prefer_unix = strcmp(qr__config_str(ps->cfg, "transport"), "tcp") != 0;
    return qr_blocking_refused(&a, prefer_unix, PROBE_MS);
}

/* The coordinator's successor takes its role: it holds the copy of the
 * coordinator's shard, and with it the global step (coord_step). It
 * opens the links to the other ps, watches the workers, and fails the
 * old coordinator over as the coordinator fails over any ps: the next
 * view, its copy promoted, VIEW to every ps and worker, the notice to
 * the supervisor. */
static void take_over(qr_ps *ps) {
    ps_replica *r = &ps->replica;
    int old = ps->coord_index;
    uint64_t old_run = ps->coordinator;
    uint64_t gone_ms = (qr__now_ns() - ps->coordinator_lost_ns) / 1000000;
    ps->coord_index = ps->index;
    ps->coordinator_lost_ns = 0;
    ps->coordinator = ps->incarnation;
    if (r->coord_step > ps->global_step) ps->global_step = r->coord_step;
    /* Sync: the step both shards held here have reached (coord.c). */
    if (ps->sync.on) ps->global_step = QR_MIN(ps->sync.step, r->copy_steps);
    /* The chief said READY to the old coordinator; its workers are past it. */
    ps->ready = true;
    qr__log(QR_LOG_WARN, "ps %d (%s), the coordinator, is gone (its links lost %llu ms ago, its "
            "address refusing): this ps, which holds the copy of its shard, coordinates the "
            "cluster from now on, at global step %lld", old, ps->cluster->ps[old],
            (unsigned long long)gone_ms, (long long)ps->global_step);
    int rc = qr__liveness_coordinate(ps);
    if (!rc) rc = ps->sync.on ? qr__coord_init(ps) : qr__bound_init(ps);
    if (!rc) rc = qr__ckpt_take_over(ps);
    if (!rc && ps->cluster->nps > 1) rc = qr__links_init(ps, qr__rollback_check_link);
    if (rc) {
        char why[400];
        snprintf(why, sizeof why, "taking over as the coordinator: %s", qr_last_error());
        qr__ps_ask_abort(ps, rc, why);
        return;
    }
    ps->sync.on_lost_ps = qr__failover_lost;
    ps->sync.on_beat = qr__failover_beat_answer;
    qr__ckpt_cut_coordinator_gone(ps); /* pushes held for the old one's cut */
    qr__links_drop(ps, old, old_run);
    qr__failover_lost(ps, old, QR_LOST_DEAD);
    if (ps->sync.on) {
        /* The step in flight, from the two shards held here; then this
         * ps's own held pushes, told to ps 0 before, are told to itself. */
        qr__coord_take_over(ps);
        qr__sync_coordinator_linked(ps);
    }
    qr__liveness_end_if_finished(ps); /* the workers that told ps 0 they had finished */
}

int qr__failover_successor(const qr_ps *ps) {
    const ps_replica *r = &ps->replica;
    int c = ps->coord_index, nps = ps->cluster->nps;
    if (!qr__replica_on(ps) || nps < 2 || !r->failed || r->failed[c] != QR_PS_ALIVE) return -1;
    /* ps 0 serves shard 0; its copy is on ps 1, which serves its own
     * shard, or is a replacement holding copies (BACKUP: shard 1 is served
     * by ps 2). */
    if (c == 0) return r->failed[1] == QR_PS_ALIVE || r->failed[1] == QR_PS_BACKUP ? 1 : -1;
    /* ps 1 serves shard 0 from its promoted copy since ps 0 failed over;
     * a replacement of ps 0 that has been copied it holds shard 0 again,
     * as the backup of ps 1 (rerep.c): it serves it again as its own. */
    if (c == 1 && r->failed[0] == QR_PS_BACKUP) return 0;
    return -1;
}

/* This ps's copy of shard 0 is fed by the coordinator's run: ps 1's
 * copy store by ps 0's replica link, ps 0's replacement's own store by
 * ps 1's promoted copy's link. A replacement the coordinator never made
 * a backup (its view still the start's, all ALIVE, as it was never sent
 * one) holds an empty copy: it took over once with it, when ps 0 ended
 * the run in order and left it waiting. */
static bool holds_coordinators_copy(const qr_ps *ps) {
    const ps_replica *r = &ps->replica;
    uint64_t fed_by = ps->index == 0 ? r->own_incarnation : r->primary_incarnation;
    return ps->coordinator && fed_by == ps->coordinator;
}

bool qr__failover_successor_watch(qr_ps *ps, uint64_t now) {
    int c = ps->coord_index;
    if (!qr__replica_on(ps) || ps->stopping || qr__ps_coordinates(ps) ||
        qr__failover_successor(ps) != ps->index || !holds_coordinators_copy(ps))
        return false;
    /* A successor that will serve no shard of its own (ps 1's
     * replacement, BACKUP, succeeding ps 0: shard 1 stays on ps 2) takes
     * over too, checkpoints included: it writes shard 0 alone and reports
     * that shard's marks alone (qr__ckpt_asked, ckpt_write.c, ckpt_cut.c).
     * ps 0's replacement, succeeding ps 1, serves shard 0 as its own
     * again. */
    /* Lost, not back within two watch periods, and refusing: dead. */
    if (!ps->coordinator || !ps->coordinator_lost_ns ||
        now - ps->coordinator_lost_ns < 500000000ull || !refuses(ps, c, now))
        return false;
    take_over(ps);
    return true;
}

bool qr__failover_successor_hello(qr_ps *ps, const qr_msg_hello *m) {
    int c = ps->coord_index, s = qr__failover_successor(ps);
    if (s < 0 || m->task_index != (uint32_t)s) return false;
    qr__log(QR_LOG_WARN, "ps %u (%s) coordinates the cluster from now on: ps %d (%s), the "
            "coordinator, is gone and ps %u holds the copy of its shard", m->task_index,
            ps->cluster->ps[m->task_index], c, ps->cluster->ps[c], m->task_index);
    ps->coord_index = (int)m->task_index;
    ps->coordinator = m->incarnation;
    qr__ckpt_cut_coordinator_gone(ps); /* pushes held for the old one's cut */
    /* A link of the old coordinator still open (a stopped one): it is
     * failed over; nothing it sends counts. */
    for (ps_peer *p = ps->peers; p; p = p->next)
        if (p->role == QR_ROLE_COORDINATOR) {
            p->role = 0;
            qr_conn_close(p->conn);
        }
    return true;
}

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
 * A sync push-and-pull (a held push, "held pushes" below) does steps 1
 * and 5 in one round trip: the push is the commit, counted once every ps
 * it went to says it holds it (HELD), and its answer goes with the token.
 *
 * ps 0 reaches the other ps tasks through its links (links.c), which
 * carry APPLY, RELEASE and STOP, and bring HELD.
 *
 * Files. This file is the step: the quorum counted (COMMIT, or a held
 * push once the other ps tasks hold it), the step applied everywhere and
 * completed, the stall reports and the abort. coord_token.c is the token
 * queue the completed steps fill and the workers' TOKEN requests empty;
 * coord_held.c the held pushes (a sync push-and-pull): what the other ps
 * tasks said of each, until it is counted here. The three call each other
 * (qr__coord_*, ps_internal.h): one room, as the checkpoint's files are.
 */
#include "ps/ps_internal.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
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
        if (s->quorum[i].data_pos != QR_POS_UNKNOWN)
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
    qr__coord_judge_commits(ps);
    for (int i = 0; i < release; i++)
        if (qr__coord_push_token(s, ps->global_step)) {
            qr__coord_abort(ps, qr_last_error());
            return;
        }
    qr__coord_serve_waiters(ps);
    qr__ckpt_step_done(ps);
}

static void complete_apply_part(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    if (--s->applies_pending == 0) complete_step(ps);
}

/* ps-replicas 2: shard `shard` of the step being applied is applied (on
 * ps `shard`, or on its promoted copy after a failover). A step is done
 * when every shard is, whichever ps applied it. */
static void shard_applied(qr_ps *ps, uint32_t shard) {
    ps_sync *s = &ps->sync;
    if (shard >= (uint32_t)ps->cluster->nps || s->shard_applied[shard]) return;
    s->shard_applied[shard] = 1;
    complete_apply_part(ps);
}

/* The shard ps k serves besides its own in the view: the failed primary's
 * whose copy it holds (ps k serving, or a replacement that holds that
 * copy); -1 if none. */
static int promoted_shard_of(const qr_ps *ps, int k) {
    int nps = ps->cluster->nps, prev = (k + nps - 1) % nps;
    const uint8_t *failed = ps->replica.failed;
    bool holds = failed[k] == QR_PS_ALIVE || failed[k] == QR_PS_BACKUP;
    return failed[prev] != QR_PS_ALIVE && holds ? prev : -1;
}

/* The mirror fault (QUORUM_TEST_COORDINATOR_DIES_AT_STEP=N:mirror): ps 0
 * dies once ps 1 has both its shards at step N + 1 and no other ps was
 * sent the step. */
static void test_die_when_done(qr_ps *ps) {
    if (!ps->test_die_waits || --ps->test_die_waits) return;
    qr__log(QR_LOG_WARN, "QUORUM_TEST_COORDINATOR_DIES_AT_STEP: step %lld applied on ps 1's "
            "shards, its APPLY sent to no other ps; this ps dies now", (long long)ps->global_step);
    _exit(9);
}

/* An APPLY's answer from ps k (qr_link_apply_cb). With two copies it names
 * the step and the shards applied there (i64 step, u32 count, u32 each). */
static void on_apply_answer(qr_ps *ps, int k, int64_t step, int status, const char *meta,
                            uint32_t len) {
    if (!status && k == 1) test_die_when_done(ps);
    if (status) {
        char msg[700];
        snprintf(msg, sizeof msg, "ps %d could not apply step %lld: %.*s", k, (long long)step,
                 (int)QR_MIN(len, 500u), meta);
        qr__coord_abort(ps, msg);
        return;
    }
    if (!qr__replica_on(ps)) {
        complete_apply_part(ps);
        return;
    }
    ps_sync *s = &ps->sync;
    qr_rbuf r;
    qr_rbuf_init(&r, meta, len);
    int64_t answered = len ? qr_rbuf_i64(&r) : step;
    uint32_t n = len ? qr_rbuf_u32(&r) : 0;
    if (!s->applying || answered != ps->global_step || r.bad) return; /* an earlier send's */
    if (!len) shard_applied(ps, (uint32_t)k);
    for (uint32_t i = 0; i < n && !r.bad && s->applying; i++) shard_applied(ps, qr_rbuf_u32(&r));
    /* Its answer came before it heard the view: ask again for the copy. */
    int copy = promoted_shard_of(ps, k);
    if (s->applying && copy >= 0 && !s->shard_applied[copy])
        qr__link_apply_again(ps, k, ps->global_step);
}

/* One of ps 0's parts of a step is on its other copy too (or the wait
 * ended otherwise). */
static void part_copied(qr_ps *ps, uint32_t shard, int status, const char *msg) {
    if (status == QR_ESTOPPED) return; /* the run is ending: no step completes */
    if (status) {
        qr__coord_abort(ps, msg);
        return;
    }
    shard_applied(ps, shard);
}

/* ps 0's promoted copy's part of a step is done once the failed ps's
 * replacement, when one is being copied it or holds it, has the step too
 * (at once without one). */
static void own_copy_copied(ps_peer *p, const qr_frame *req, void *ctx, int status,
                            const char *msg) {
    (void)p;
    (void)req;
    qr_ps *ps = ctx;
    part_copied(ps, (uint32_t)ps->replica.primary, status, msg);
}

/* ps 0 serving the last ps's shard from its copy (a failover): the step
 * applied to the copy too. */
static int apply_own_copy(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    if (!qr__replica_on(ps) || !ps->replica.promoted) return QR_OK;
    int rc = qr__sync_apply_copy(ps, ps->global_step, s->quorum, s->nquorum);
    if (!rc) qr__replica_after_copy(ps, own_copy_copied, ps);
    return rc;
}

void qr__coord_failed_over(qr_ps *ps, int k, int served) {
    ps_sync *s = &ps->sync;
    if (!s->on || !s->applying) return;
    if (served > 0 && !s->shard_applied[served]) {
        /* ps k served it from its promoted copy; the replacement that held
         * its copy serves it now, and applies the step from the pushes and
         * steps ps k forwarded (a repeat if it has the step). */
        qr__log(QR_LOG_INFO, "step %lld: shard %d's part goes to ps %d, which held its copy",
                (long long)ps->global_step, served, served);
        qr__link_apply_again(ps, served, ps->global_step);
    }
    if (s->shard_applied[k]) return;
    int next = (k + 1) % ps->cluster->nps;
    qr__log(QR_LOG_INFO, "step %lld: shard %d's part goes to its copy on ps %d",
            (long long)ps->global_step, k, next);
    if (next != ps->index) {
        qr__link_apply_again(ps, next, ps->global_step);
        return;
    }
    if (apply_own_copy(ps)) qr__coord_abort(ps, qr_last_error());
}

/* The coordinator's own shard's part of a step with two copies: done once
 * its backup has applied the step too (sync.c forwarded it), as ps k
 * answers APPLY. (On ps 0 its held pushes are the coordinator's; on a
 * successor, its own shard's wait in sync.c as on any ps k.) */
static void own_step_copied(ps_peer *p, const qr_frame *req, void *ctx, int status,
                            const char *msg) {
    (void)p;
    (void)req;
    qr_ps *ps = ctx;
    if (!status) qr__sync_answer_own(ps); /* (none on ps 0: its own are the coordinator's) */
    if (!status) test_die_when_done(ps);
    part_copied(ps, (uint32_t)ps->index, status, msg);
}

static void start_apply(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    qsort(s->quorum, (size_t)s->nquorum, sizeof *s->quorum, cmp_member);
    s->applying = true;
    s->applies_pending = ps->cluster->nps; /* ps tasks; with two copies, shards */
    if (s->shard_applied) memset(s->shard_applied, 0, (size_t)ps->cluster->nps);
    int64_t step = ps->global_step;
    bool test_fault = step == ps->test_die_at_step && ps->index == 0 && ps->cluster->nps > 2;
    if (test_fault && !ps->test_die_mirror) {
        /* The test's fault: the APPLY to ps 1 as if still in this ps's
         * write queue when it died (sends are written at once while the
         * socket has room, conn_write.c). */
        qr__links_apply(ps, step, on_apply_answer, 1);
        qr__log(QR_LOG_WARN, "QUORUM_TEST_COORDINATOR_DIES_AT_STEP: step %lld's APPLY sent to "
                "every ps but ps 1; this ps dies now", (long long)step);
        _exit(9);
    }
    if (test_fault) { /* the mirror: the APPLYs to the other ps still queued */
        ps->test_die_waits = 2; /* ps 1's answer, shard 0's part copied */
        qr__link_apply(ps, 1, step, on_apply_answer);
    } else {
        qr__links_apply(ps, step, on_apply_answer, -1);
    }
    /* A coordinator that is a replacement holding copies (BACKUP: ps 1's,
     * succeeding ps 0) serves no shard of its own: ps (index+1) applies
     * it from its promoted copy and forwards the step to the copy here,
     * as for any BACKUP ps (sync.c, qr__sync_apply_message). */
    bool own = !qr__replica_on(ps) || ps->replica.failed[ps->index] == QR_PS_ALIVE;
    if ((own && qr__sync_apply_step(ps, step, s->quorum, s->nquorum)) || apply_own_copy(ps)) {
        qr__coord_abort(ps, qr_last_error());
        return;
    }
    if (!qr__replica_on(ps)) complete_apply_part(ps);
    else if (own) qr__replica_after(ps, own_step_copied, ps);
}

/* The coordinator's successor, in sync mode (failover.c, take_over): it
 * holds two shards, each at the step it applied last, and the members of
 * that step: ps 1 holds shard 0's copy and its own shard; ps 0's
 * replacement, succeeding ps 1 in turn, holds shard 0 (its own, copied
 * from ps 1) and ps P-1's copy. The coordinator completed every step
 * before the older of the two (each needs both copies of every shard),
 * and sent its APPLYs before forwarding its own part, so:
 *  - both at step s: step s-1 is done everywhere; the cluster is
 *    gathering step s (its pushes held on the shards, their HELD said
 *    again on the new links, shard 0's parts resent by the workers);
 *  - one at s + 1: step s is being applied; it is applied again here and
 *    on every other ps (a repeat where it was: nothing), with the members
 *    recorded, and completes once.
 * Tokens: a completed step's were granted by ps 0, or are implied by the
 * answers of the pushes resent (a member of the last step is answered
 * with the global step); a worker whose TOKEN request was lost asks
 * again, so max(N, R) tokens of the step are queued. In lockstep (R = N,
 * no initial tokens) the ones nobody asks for are dropped as the step's
 * gradients come (coord_token.c); otherwise they let up to that many
 * gradients more into the step's race (REPLICATION.md). */
void qr__coord_take_over(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    int64_t own = s->step, copy = ps->replica.copy_steps;
    int64_t step = ps->global_step; /* the older of the two (take_over) */
    const quorum_member *members = own > copy ? s->own_members : s->copy_members;
    int n = own > copy ? s->nown_members : s->ncopy_members;
    s->tokens_seeded = true;
    s->step_started_ns = s->last_grad_ns = qr__now_ns();
    if (own != copy && n > 0 && n <= s->R) {
        /* (ps 1: its own shard and shard 0's copy; ps 0's replacement,
         * succeeding ps 1: shard 0, its own, and ps P-1's copy) */
        int own_shard = ps->index, copy_shard = ps->replica.primary;
        qr__log(QR_LOG_INFO, "step %lld was being applied (shard %d here has it, shard %d here "
                "not): applying it again everywhere, with its %d members", (long long)step,
                own > copy ? own_shard : copy_shard, own > copy ? copy_shard : own_shard, n);
        for (int i = 0; i < n; i++)
            s->quorum[i] = (quorum_member){members[i].worker, members[i].seq, QR_POS_UNKNOWN};
        s->nquorum = n;
        start_apply(ps);
        return;
    }
    int release = QR_MAX(s->N, s->R);
    for (int i = 0; step > 0 && i < release; i++)
        if (qr__coord_push_token(s, step)) {
            qr__coord_abort(ps, qr_last_error());
            return;
        }
    qr__log(QR_LOG_INFO, "gathering step %lld (both shards here are at it)", (long long)step);
}

/* The mirror of the case below: ps 0's APPLY(s) to ps k was still in its
 * write queue when it died, while ps 1 had its own and shard 0's part. ps
 * k's shard is at s (its pushes of s held, unanswered), the shards here at
 * s + 1, gathering it: ps k is sent APPLY(s) with the members of s as
 * applied here, ahead of anything else on its link. Before, no worker could
 * push s + 1 (each waits for ps k's answer to its push of s) and the run
 * stalled until sync-timeout-ms. */
static void catch_up(qr_ps *ps, int k, int64_t step) {
    ps_sync *s = &ps->sync;
    bool own = ps->replica.failed[ps->index] == QR_PS_ALIVE; /* else a BACKUP successor */
    int64_t here = own ? s->step : ps->replica.copy_steps;
    const quorum_member *members = own ? s->own_members : s->copy_members;
    int n = own ? s->nown_members : s->ncopy_members;
    if (here != step + 1 || n <= 0 || n > s->R) return; /* (not the members of that step) */
    qr__log(QR_LOG_WARN, "ps %d's shard has not applied step %lld, which the shards here have "
            "(its APPLY was lost with the coordinator): sending it that APPLY, with the step's %d "
            "members", k, (long long)step, n);
    qr__link_catch_up(ps, k, step, members, n);
}

/* A step ps k applied that neither shard the successor holds had (ps 0's
 * APPLY to ps 1 still in its write queue when the one to ps k went out):
 * ps k's answer to the new link names it, with its members, and it is
 * applied everywhere as one found on the successor's own shards. Before,
 * that step would wait for HELDs ps k no longer owes (it answered those
 * pushes) until sync-timeout-ms. */
void qr__coord_shard_at(qr_ps *ps, int k, qr_rbuf *r) {
    ps_sync *s = &ps->sync;
    if (r->left < 12) return; /* (a ps of a build before this answer) */
    int64_t at = qr_rbuf_i64(r);
    uint32_t n = qr_rbuf_u32(r);
    if (!r->bad && !s->aborted && at == ps->global_step - 1 && at >= 0 &&
        ps->replica.failed[k] == QR_PS_ALIVE) {
        catch_up(ps, k, at);
        return;
    }
    if (r->bad || s->applying || s->aborted || at != ps->global_step + 1 || n == 0 ||
        n > (uint32_t)s->R || r->left != (size_t)n * QR_MSG_MEMBER_LEN)
        return;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t worker, seq;
        qr_msg_get_member(r, &worker, &seq);
        s->quorum[i] = (quorum_member){worker, seq, QR_POS_UNKNOWN};
    }
    s->nquorum = (int)n;
    qr__log(QR_LOG_WARN, "ps %d has applied step %lld, which the shards here had not: applying "
            "it everywhere, with its %u members", k, (long long)ps->global_step, n);
    start_apply(ps);
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
    QR_EACH_OTHER_PS(ps, k) {
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

void qr__coord_abort(qr_ps *ps, const char *why) {
    ps_sync *s = &ps->sync;
    if (s->aborted) return;
    s->aborted = true;
    char msg[sizeof s->abort_msg];
    snprintf(msg, sizeof msg, "synchronous training: %s", why);
    qr__ps_ask_abort(ps, QR_EABORTED, msg);
    /* The cluster's first abort is the one every waiting call is told. */
    snprintf(s->abort_msg, sizeof s->abort_msg, "%s", ps->abort_msg);
    qr__coord_end_waiters(s, ps->exit_status, s->abort_msg);
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
    if (s->aborted || qr__ps_fenced(ps) || ps->stopping || !ps->ready) return;
    uint64_t now = qr__now_ns();
    uint64_t waited_ms = (now - s->step_started_ns) / 1000000;
    uint64_t gone_ms = 0;
    int lost = s->applying ? -1 : lost_worker_missing(ps, &gone_ms);
    /* Past the step limit no step needs the chief: what it has not done is
     * evaluate, and liveness.c ends the run saying so (QR_ECHIEFLOST). */
    if (lost == 0 && ps->step_limit > 0 && ps->global_step >= ps->step_limit) lost = -1;
    if (lost >= 0 && waited_ms >= (uint64_t)s->restart_wait_ms &&
        gone_ms >= (uint64_t)s->restart_wait_ms) {
        char report[900], why[1200];
        stall_report(ps, report, sizeof report);
        snprintf(why, sizeof why, "worker %d left %.1f s ago and has not come back within "
                 "restart-wait-ms (%lld ms), and step %lld cannot do without it: %s", lost,
                 (double)gone_ms / 1e3, (long long)s->restart_wait_ms, (long long)ps->global_step,
                 report);
        qr__coord_abort(ps, why);
        return;
    }
    if (waited_ms < (uint64_t)s->report_ms) return;
    char report[900];
    stall_report(ps, report, sizeof report);
    if (waited_ms >= (uint64_t)s->timeout_ms) {
        char why[1000];
        snprintf(why, sizeof why, "no progress for %lld ms (sync-timeout-ms): %s",
                 (long long)s->timeout_ms, report);
        qr__coord_abort(ps, why);
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
    if (qr__replica_on(ps) &&
        !(s->shard_applied = qr__calloc((size_t)ps->cluster->nps, sizeof *s->shard_applied)))
        return QR_ENOMEM;
    const char *path = qr__config_str(ps->cfg, "sync-stats-file");
    if (path[0]) {
        s->stats_file = fopen(path, "w");
        if (!s->stats_file)
            return qr__fail(QR_EIO, "sync-stats-file %s: cannot open for writing", path);
    }
    s->on_held = qr__coord_on_held;
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

int qr__coord_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    const qr_ps *ps = p->ps;
    if (!ps->sync.on)
        return qr__fail(QR_EINVAL, "%s: this ps trains in async mode", qr_msg_name(f->type));
    if (!qr__ps_coordinates(ps))
        return qr__fail(QR_EINVAL, "%s goes to ps 0, not ps %d", qr_msg_name(f->type), ps->index);
    return qr__peer_check_small(f, f->type == QR_MSG_COMMIT ? QR_MSG_COMMIT_LEN : QR_MSG_TOKEN_LEN);
}

/* Count the push (worker, seq) of local_step for the step under way, or
 * drop it as stale, and queue the worker's place in the token queue.
 * held: a held push's answer, which goes with the worker's token (p, f
 * are its request); NULL: a COMMIT, answered here. */
void qr__coord_count(qr_ps *ps, ps_peer *p, const qr_frame *f, const qr_msg_commit *m,
                     held_pull *held) {
    ps_sync *s = &ps->sync;
    uint32_t worker = m->worker, seq = m->seq;
    int64_t local_step = m->local_step;
    char msg[512];
    int status = QR_OK;
    bool known = qr__is_worker(worker, s->N);
    bool twice = false, queued = false;
    for (int i = 0; i < s->nquorum; i++)
        twice |= s->quorum[i].worker == worker && s->quorum[i].seq == seq;
    /* Counted and still queued: its connection is not lost, so this is
     * not a push sent again after that (below), but a second one. */
    for (const token_waiter *o = s->waiters; twice && o; o = o->next)
        queued |= o->member && o->worker == worker && o->seq == seq;
    if (s->aborted) {
        status = QR_EABORTED;
        snprintf(msg, sizeof msg, "%s", s->abort_msg);
    } else if (!ps->ready) {
        status = QR_ENOTREADY;
        snprintf(msg, sizeof msg, "COMMIT: the chief has not initialized yet");
    } else if (!known || local_step > ps->global_step) {
        status = QR_EINVAL;
        snprintf(msg, sizeof msg, "COMMIT: worker %u, step %lld: %s", worker,
                 (long long)local_step, !known ? "no such worker" : "that step has not started");
    } else if (queued) {
        status = QR_EINVAL;
        snprintf(msg, sizeof msg, "COMMIT: this push was committed already");
    }
    /* The worker's place in the token queue, fresh or stale alike. */
    token_waiter *w = NULL;
    if (!status && (status = qr__coord_add_waiter(s, p, &w)))
        snprintf(msg, sizeof msg, "COMMIT: %s", qr_last_error());
    if (status) {
        if (held) qr__held_fail(held, status, msg);
        else qr__peer_reply_error(p, f, status, msg);
        return;
    }
    /* Lockstep (R = N, no initial tokens): a step is every worker once
     * (docs/SYNC.md, "Determinism"). A second gradient of a worker for one
     * step can only come with the token of a worker that is gone; counting
     * it would let the survivors finish the run without that worker or
     * not, by timing. It is dropped as stale, and the step waits for the
     * worker's restart, up to restart-wait-ms. */
    bool again = false;
    for (int i = 0; qr__coord_lockstep(s) && i < s->nquorum; i++)
        again |= s->quorum[i].worker == worker;
    bool stale = !twice && (local_step < ps->global_step || s->applying || again);
    w->committed = local_step;
    w->member = !stale;
    w->worker = worker;
    w->seq = seq;
    if (held) {
        held->stale = stale;
        w->held = held;
        w->has_request = true;
        w->req = held->req;
    }
    if (stale) {
        qr__ckpt_data_pos(ps, worker, m->data_pos); /* its batch is spent all the same */
        s->stale_commits++;
        s->stale_by_worker[worker]++;
        if (again && local_step == ps->global_step && !s->applying)
            snprintf(msg, sizeof msg, "dropped: stale: worker %u has a gradient in step %lld "
                     "already (R = N, no initial tokens: a step takes one gradient from each "
                     "worker)", worker, (long long)local_step);
        else
            snprintf(msg, sizeof msg, "dropped: stale: worker %u's gradient of step %lld came "
                     "after step %lld had its %d gradients", worker, (long long)local_step,
                     (long long)local_step, s->R);
        if (!held) qr__peer_reply_error(p, f, QR_ESTALE, msg);
        qr__coord_serve_waiters(ps);
        return;
    }
    if (twice) {
        /* Sent again after its connection was lost (ps 0 closed it: a
         * worker declared hung), which took its place in the token queue
         * (qr__coord_peer_lost): the place is back, the push not counted
         * again, and the answer is the original's. */
        ps->replica.duplicate_pushes += !held; /* (a held one was counted as it came) */
        if (!held) qr__peer_reply_step(p, f, ps->global_step);
        qr__coord_serve_waiters(ps);
        return;
    }
    s->quorum[s->nquorum++] = (quorum_member){worker, seq, m->data_pos};
    s->last_grad_ns = qr__now_ns();
    if (!held) qr__peer_reply_step(p, f, ps->global_step);
    qr__coord_serve_waiters(ps);
    if (s->nquorum == s->R) start_apply(ps);
    else qr__liveness_end_if_finished(ps);
}

void qr__coord_commit(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_msg_commit m;
    qr_msg_get_commit(&r, &m);
    qr__coord_count(p->ps, p, f, &m, NULL);
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

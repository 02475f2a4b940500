/*
 * rollback.c - what happens when a ps comes back as a new run: the whole
 * cluster rolls back, in place, to the checkpoint that ps restored.
 *
 * A ps restarted after a crash restores its shard from the newest
 * checkpoint. The updates since then are lost on that shard only; going
 * on would train a model whose shards are from different moments
 * (tensorflow#2461). So every other ps drops its state and restores the
 * same checkpoint, and the workers start again from its step. No process
 * but the dead one is restarted: each ps re-enters its own start path
 * inside qr_ps_run (server.c, reopen), and each worker finds out at its
 * next call (QR_EROLLEDBACK, worker/link.c) and is created again.
 *
 * Who decides. Every run of a ps has an incarnation, a random number new
 * at every start and every rollback, given in the answer to each HELLO
 * with the step it restored. Two rules, over ps 0's links (links.c):
 *
 *   ps 0: a linked ps answers with an incarnation other than the one it
 *         answered before, and not as a follower of this ps 0: it was
 *         restarted. ps 0 rolls back to the step that ps restored.
 *   ps k: a coordinator's HELLO comes from another ps 0 incarnation than
 *         the one it met before: ps 0 was restarted, or rolled back. ps k
 *         rolls back to the step that ps 0 restored, and follows it.
 *
 * A restarted ps k makes ps 0 roll back; the new ps 0 links to every ps
 * k, which rolls back in turn, following it; their new incarnations name
 * ps 0's as the one they follow, so ps 0 does not roll back again. The
 * restarted ps k itself met the old ps 0 (its HELLO is how ps 0 saw the
 * restart), so the new ps 0's HELLO names the run that caused it
 * (`cause`): that run, still at the checkpoint it restored (nothing that
 * changes a ps's state was handled since: ps->changed, server.c's handler
 * table), follows without rolling back, and one restart is one rollback.
 * A restarted chief's CREATE may reach that run before the new ps 0's
 * HELLO does; it matches the restored variables and changes nothing
 * (create.c), so it is no reason to roll back again (it was: a second
 * rollback in about one run of four restarts in ten, issue 28 item 7). A
 * restarted ps 0 makes every ps k roll back directly. Nothing but a HELLO
 * is sent on a link before its answer, so no request of an older run
 * reaches a newer one, and ps 0 says the cluster is ready (READY) only
 * once every link is up, so a worker trains only once every ps is in
 * step with ps 0.
 *
 * Without --checkpoint-dir there is nothing to roll back to: a restarted
 * ps has lost its variables, and the run is stopped with an error saying
 * so rather than trained on a mix.
 *
 * With two copies (--ps-replicas 2) a lost ps is failed over instead
 * (failover.c); only a shard that has lost both its copies together (two
 * neighbours lost, or a ps lost while its neighbour's replacement is still
 * being copied) comes here: ps 0 rolls back at once to its newest complete
 * checkpoint (qr__rollback_both_lost), without waiting for the lost ps to
 * be restarted. Every ps alive follows it (the second rule), and the lost
 * ps, restarted (`quorum launch --max-restarts` is told: "rollback ps K"),
 * restore that same checkpoint, the newest, and meet the new ps 0 as the
 * first one they know. The view starts again with every ps ALIVE, under
 * the next view number (failover.c, qr__failover_rolled_back). Once ps
 * 0 has failed over, its successor coordinates and the start's placement
 * would not have it serve shard 0, which workers follow: it stops the run
 * instead, to be started again whole from that checkpoint ("restart
 * cluster STEP" to the supervisor).
 */
#include "ps/ps_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

qr_msg_welcome qr__rollback_welcome(const qr_ps *ps) {
    return (qr_msg_welcome){.incarnation = ps->incarnation,
                            .restored_step = ps->ckpt.restored_step,
                            .follows = ps->follows,
                            .flags = ps->ckpt.dir ? QR_WELCOME_CHECKPOINTS : 0};
}

/* Ask for the end of this run of the ps so that qr_ps_run starts it
 * again from the checkpoint of `step` (-1: from nothing); server.c closes
 * the run before the loop next waits. */
static void roll_back(qr_ps *ps, int64_t step, uint64_t follows, uint64_t cause,
                      const char *why) {
    if (!qr__ps_ask_rollback(ps, step, follows, cause)) return;
    char what[64] = "a fresh start: no checkpoint was written before it";
    if (step >= 0) snprintf(what, sizeof what, "the checkpoint of step %lld", (long long)step);
    qr__log(QR_LOG_WARN, "%s: rolling back to %s", why, what);
}

bool qr__rollback_check_link(qr_ps *ps, int index, uint64_t known, const qr_msg_welcome *m) {
    if (!known || m->incarnation == known) return false;
    if (m->follows == ps->incarnation) return false; /* it rolled back after this ps 0 */
    char why[512];
    if (!(m->flags & QR_WELCOME_CHECKPOINTS) || !ps->ckpt.dir) {
        snprintf(why, sizeof why, "ps %d (%s) was restarted and has lost its variables: without "
                 "--checkpoint-dir there is no checkpoint to roll the cluster back to", index,
                 ps->cluster->ps[index]);
        qr__ps_ask_abort(ps, QR_EABORTED, why);
        return true;
    }
    snprintf(why, sizeof why, "ps %d (%s) was restarted", index, ps->cluster->ps[index]);
    roll_back(ps, m->restored_step, 0, m->incarnation, why);
    return true;
}

bool qr__rollback_check_coordinator(qr_ps *ps, const qr_msg_hello *m) {
    uint64_t known = ps->coordinator;
    if (!known) {
        ps->coordinator = m->incarnation; /* the first ps 0 this run meets */
        return false;
    }
    if (m->incarnation == known) return false;
    if (m->cause && m->cause == ps->incarnation && !ps->changed &&
        m->restored_step == ps->ckpt.restored_step) {
        /* This run's own restart made ps 0 roll back, to the checkpoint
         * this run restored and has not moved from: it is where ps 0 is
         * now. Rolling back again would be a second rollback for one
         * restart, which every worker that met this run would see. */
        ps->coordinator = m->incarnation;
        qr__log(QR_LOG_INFO, "ps 0 rolled back to this ps's checkpoint (step %lld) for its "
                "restart: following it", (long long)m->restored_step);
        return false;
    }
    if (!ps->ckpt.dir) {
        char why[512];
        snprintf(why, sizeof why, "ps 0 (%s) was restarted or rolled back: without "
                 "--checkpoint-dir this ps cannot follow it, and stops", ps->cluster->ps[0]);
        qr__ps_ask_abort(ps, QR_EABORTED, why);
        return true;
    }
    roll_back(ps, m->restored_step, m->incarnation, 0,
              "ps 0 is a new run (restarted, or rolled back)");
    return true;
}

bool qr__rollback_both_lost(qr_ps *ps, int shard, int k, int other) {
    int a = QR_MIN(k, other), b = QR_MAX(k, other);
    char why[700];
    int n = snprintf(why, sizeof why, "shard %d has lost both its copies: ps %d (%s) and ps %d "
                     "(%s) are lost together (dead or hung), which no failover covers", shard, a,
                     ps->cluster->ps[a], b, ps->cluster->ps[b]);
    if (!ps->ckpt.dir) {
        snprintf(why + n, sizeof why - (size_t)n, "; without --checkpoint-dir there is no "
                 "checkpoint to roll the cluster back to: the run aborts");
        qr__ps_ask_abort(ps, QR_EABORTED, why);
        return false;
    }
    if (ps->coord_index != 0) {
        /* ps 0 has failed over and this ps coordinates: a rollback in
         * place would give every ps its shard of the start again, ps 0
         * serving shard 0 while another ps coordinates, which no worker
         * follows (its coordinator's requests go with shard 0). So the
         * run stops here, and every task is started again, as at the
         * start (ps 0 coordinating): each ps restores the newest
         * checkpoint, and each worker goes on from its data position in
         * it. `quorum launch` does that ("restart cluster"). */
        char from[64] = "a fresh start: no checkpoint was written yet";
        if (ps->ckpt.last_step >= 0)
            snprintf(from, sizeof from, "its newest checkpoint (step %lld)",
                     (long long)ps->ckpt.last_step);
        snprintf(why + n, sizeof why - (size_t)n, "; ps %d coordinates since ps 0 failed over, "
                 "so the cluster cannot roll back in place: the run stops, to be started again "
                 "whole (every task, without --coordinator) from %s%s", ps->index, from,
                 getenv("QUORUM_SUPERVISOR_FD") ? "; quorum launch does so" : "");
        qr__tell_supervisor("restart cluster %lld", (long long)ps->ckpt.last_step);
        qr__ps_ask_abort(ps, QR_EABORTED, why);
        return false;
    }
    if (ps->rollback.wanted) return true;
    /* The supervisor restarts the lost (killing a hung one first); a
     * replacement being copied (JOINING) is alive and follows ps 0. */
    qr__tell_supervisor("rollback ps %d", k);
    if (ps->replica.failed[other] != QR_PS_JOINING) qr__tell_supervisor("rollback ps %d", other);
    /* Restarted, the lost ps restore the newest complete checkpoint: the
     * one this ps 0 knows as its last (none completes without them). */
    roll_back(ps, ps->ckpt.last_step, 0, 0, why);
    return true;
}

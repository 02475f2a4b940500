/*
 * ckpt_write.c - a ps's own part of a checkpoint: its shard taken on the
 * loop and written on libuv's thread pool (ckpt_shard.c's format), and
 * with --ps-replicas 2 the shard of a failed primary it serves from its
 * copy; the writes' results handed to ps 0's count (ckpt_coord.c) or, on
 * ps k, the answer to ps 0's CKPT, which asks for them in sync mode (in
 * async mode with several ps, ckpt_cut.c's CUT does). ckpt_coord.c's
 * header comment has the whole of a checkpoint.
 */
#include "ps/ps_internal.h"

#include <stdio.h>
#include <string.h>

/* What ckpt_shard.c reads of this ps: its own shard, or (copy) the copy
 * of ps `primary`'s that it holds (ps-replicas 2), with that shard's own
 * step counter. */
ckpt_shard_ctx qr__ckpt_ctx(qr_ps *ps, bool copy) {
    ckpt_shard_ctx sc = {.store = &ps->store, .optim = ps->optim, .cfg = ps->cfg,
                         .index = ps->index, .nps = ps->cluster->nps,
                         .nworkers = ps->cluster->nworkers, .sync = ps->sync.on,
                         .applied_steps = ps->applied_steps,
                         .average_decay = ps->average_decay, .data_pos = ps->ckpt.data_pos,
                         .incarnation = ps->incarnation,
                         .coordinator = qr__ps_coordinates(ps) ? ps->incarnation : ps->coordinator,
                         .tier_ps = ps->tier ? ps : NULL};
    if (copy) {
        sc.tier_ps = NULL;
        sc.store = &ps->replica.store;
        sc.index = ps->replica.primary;
        sc.applied_steps = ps->replica.copy_steps;
        /* The workers' data positions go with shard 0: ps 0's own, or
         * its copy on the coordinator's successor (failover.c). */
        sc.data_pos = sc.index == 0 ? ps->ckpt.data_pos : NULL;
    }
    return sc;
}

bool qr__ckpt_writer(const qr_ps *ps, int k) {
    return !qr__replica_on(ps) || ps->replica.failed[k] == QR_PS_ALIVE;
}

bool qr__ckpt_asked(const qr_ps *ps, int k) {
    int nps = ps->cluster->nps;
    return qr__ckpt_writer(ps, k) || !qr__ckpt_writer(ps, (k + nps - 1) % nps);
}

int qr__ckpt_promoted_shard(const qr_ps *ps) {
    const ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps) || !r->promoted || r->failed[r->primary] == QR_PS_ALIVE) return -1;
    return r->primary;
}

/* ---- this ps's shard(s): taken, written, answered ----------------------------- */

/* Every shard of this ps is written: ps 0 counts them; ps k answers CKPT
 * with its own shard's record, then the promoted copy's (u32 shard, record). */
static void shards_written(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    int copy = c->copy_shard;
    c->copy_shard = -1;
    if (qr__ps_coordinates(ps)) { /* ps 0, or its successor (failover.c) */
        uint64_t id = c->next_id;
        int me = ps->index;
        qr__ckpt_shard_written(ps, me, me, c->results[0].status, c->results[0].error,
                               &c->results[0].shard);
        if (copy >= 0 && c->next_id == id)
            qr__ckpt_shard_written(ps, me, copy, c->results[1].status, c->results[1].error,
                                   &c->results[1].shard);
        if (c->next_id == id)
            qr__ckpt_writer_failed(ps, me, QR_EINTERNAL, "the coordinator did not write it (the "
                                   "view moved)");
        return;
    }
    ps_peer *p = c->reply_peer;
    c->reply_peer = NULL;
    if (!p) return;
    const ckpt_result *bad = c->results[0].status ? &c->results[0]
                             : copy >= 0 && c->results[1].status ? &c->results[1] : NULL;
    if (bad) {
        qr__peer_reply_error(p, &c->reply_req, bad->status, bad->error);
        return;
    }
    qr_wbuf meta = {0};
    qr_msg_put_shard(&meta, &c->results[0].shard);
    if (copy >= 0) {
        qr_wbuf_u32(&meta, (uint32_t)copy);
        qr_msg_put_shard(&meta, &c->results[1].shard);
    }
    qr__peer_reply(p, &c->reply_req, QR_OK, &meta, NULL, 0, NULL, NULL);
    qr_wbuf_free(&meta);
}

static void on_shard_written(uv_work_t *w, int status) {
    ckpt_job *j = w->data;
    qr_ps *ps = j->ps;
    ps_ckpt *c = &ps->ckpt;
    ckpt_result *res = &c->results[j == c->copy_job ? 1 : 0];
    if (j == c->copy_job) c->copy_job = NULL;
    else c->job = NULL;
    if (status && !j->status) {
        j->status = QR_EINTERNAL;
        snprintf(j->error, sizeof j->error, "the write was cancelled");
    }
    res->status = j->status;
    snprintf(res->error, sizeof res->error, "%s", j->error);
    res->shard = (qr_msg_shard){.bytes = j->bytes, .crc32 = j->crc, .nvars = (uint32_t)j->nentries};
    if (j->status)
        qr__log(QR_LOG_ERROR, "checkpoint at step %lld: %s", (long long)j->step, j->error);
    qr__ckpt_shard_free(j);
    if (c->job || c->copy_job) return; /* the other shard is still being written */
    shards_written(ps);
    qr__rerep_resume(ps); /* a copy that waited for the stores */
}

/* Snapshot one shard (copy: the promoted copy's) for checkpoint `id`. */
static int snapshot(qr_ps *ps, bool copy, uint64_t id, int64_t step, uint64_t base,
                    ckpt_job **out) {
    ps_ckpt *c = &ps->ckpt;
    ckpt_shard_ctx sc = qr__ckpt_ctx(ps, copy);
    uint64_t *snap_id = copy ? &c->copy_snapshot_id : &c->snapshot_id;
    uint64_t *snap_coord = copy ? &c->copy_snapshot_coordinator : &c->snapshot_coordinator;
    /* An increment holds what changed since this ps's last shard: that
     * shard must be the base ps 0 names (else ps 0 gives this checkpoint
     * up, and the next one is full). */
    if (base && (base != *snap_id || sc.coordinator != *snap_coord))
        return qr__fail(QR_EINVAL, "%s cannot write an increment of checkpoint %llu of shard "
                        "%d: its last shard was of checkpoint %llu (of another ps 0 run, or "
                        "none since it started); the next checkpoint will be a full one",
                        ps->name, (unsigned long long)base, sc.index,
                        (unsigned long long)*snap_id);
    /* A re-replication's snapshot of this store still being sent (rerep.c). */
    if (qr__ckpt_store_busy(sc.store))
        return qr__fail(QR_EINVAL, "%s: shard %d's snapshot for a re-replication is still "
                        "being sent", ps->name, sc.index);
    sc.base = base;
    int rc = qr__ckpt_shard_snapshot(&sc, c->dir, id, step, out);
    if (rc) return rc;
    *snap_id = id;
    *snap_coord = sc.coordinator;
    (*out)->ps = ps;
    (*out)->work.data = *out;
    return QR_OK;
}

/* Take this ps's shard at `step` and write it off the loop; and the
 * promoted copy's shard, if this ps serves one (ps-replicas 2). A
 * replacement that holds copies (BACKUP) serves no shard of its own: its
 * own store is a copy that the ps serving it writes, so it writes the
 * promoted copy's alone (and answers with an empty record for its own,
 * which ps 0 does not count: it asked another ps for that shard). */
int qr__ckpt_start_shard(qr_ps *ps, uint64_t id, int64_t step, uint64_t base) {
    ps_ckpt *c = &ps->ckpt;
    if (c->job || c->copy_job)
        return qr__fail(QR_EINVAL, "a checkpoint is still being written on %s", ps->name);
    int copy = qr__ckpt_promoted_shard(ps);
    bool serves_own = qr__ckpt_writer(ps, ps->index);
    if (!serves_own && copy < 0)
        return qr__fail(QR_EINVAL, "%s serves no shard in view %llu", ps->name,
                        (unsigned long long)ps->replica.view);
    ckpt_job *own = NULL, *cj = NULL;
    uint64_t t0 = qr__now_ns();
    int rc = serves_own ? snapshot(ps, false, id, step, base, &own) : QR_OK;
    if (!rc && copy >= 0) rc = snapshot(ps, true, id, step, base, &cj);
    if (rc) {
        if (own) qr__ckpt_shard_free(own);
        return rc;
    }
    ps->ckpt.last_snapshot_ms = (double)(qr__now_ns() - t0) / 1e6;
    c->disk_rows_off_loop += (own ? own->disk_rows : 0) + (cj ? cj->disk_rows : 0);
    ps->ckpt.max_snapshot_ms = QR_MAX(ps->ckpt.max_snapshot_ms, ps->ckpt.last_snapshot_ms);
    memset(c->results, 0, sizeof c->results);
    rc = own ? uv_queue_work(&ps->loop, &own->work, qr__ckpt_shard_write, on_shard_written) : 0;
    if (rc) {
        qr__ckpt_shard_free(own);
        if (cj) qr__ckpt_shard_free(cj);
        return qr__fail(QR_EINTERNAL, "cannot queue a checkpoint write: %s", uv_strerror(rc));
    }
    c->job = own;
    c->copy_shard = copy;
    if (!cj) return QR_OK;
    rc = uv_queue_work(&ps->loop, &cj->work, qr__ckpt_shard_write, on_shard_written);
    if (rc && !own) {
        qr__ckpt_shard_free(cj);
        c->copy_shard = -1;
        return qr__fail(QR_EINTERNAL, "cannot queue the write of shard %d: %s", copy,
                        uv_strerror(rc));
    }
    if (rc) { /* answered with the own shard's write, as failed */
        c->results[1].status = QR_EINTERNAL;
        snprintf(c->results[1].error, sizeof c->results[1].error,
                 "cannot queue the write of shard %d: %s", copy, uv_strerror(rc));
        qr__ckpt_shard_free(cj);
        return QR_OK;
    }
    c->copy_job = cj;
    return QR_OK;
}

/* ---- ps k: CKPT from ps 0 -------------------------------------------------------- */

int qr__ckpt_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    if (p->role != QR_ROLE_COORDINATOR)
        return qr__fail(QR_EINVAL, "CKPT comes from ps 0's coordinator link only");
    if (!p->ps->ckpt.dir)
        return qr__fail(QR_EINVAL, "CKPT: %s was started without --checkpoint-dir", p->ps->name);
    if (f->meta_len < QR_MSG_CKPT_LEN || f->payload_len)
        return qr__fail(QR_EPROTO, "CKPT: %u meta bytes, at least %d and no payload expected",
                        f->meta_len, QR_MSG_CKPT_LEN);
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_msg_ckpt m;
    qr_msg_get_ckpt(&r, &m);
    if ((uint64_t)f->meta_len != QR_MSG_CKPT_LEN + (uint64_t)m.count * QR_MSG_CUT_LEN)
        return qr__fail(QR_EPROTO, "CKPT: %u meta bytes do not hold %u cut records",
                        f->meta_len, m.count);
    return QR_OK;
}

void qr__ckpt_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_msg_ckpt m;
    qr_msg_get_ckpt(&r, &m);
    bool async_cut = !ps->sync.on && ps->ckpt.marks;
    if (async_cut && m.phase >= QR_CKPT_HOLD && m.phase <= QR_CKPT_RELEASE) {
        qr__ckpt_cut_message(p, f, &m, &r);
        return;
    }
    if (m.phase != QR_CKPT_SNAPSHOT || m.count != 0 || !ps->sync.on) {
        qr__peer_reply_error(p, f, QR_EINVAL, "CKPT: a phase this ps does not take in its mode");
        return;
    }
    if (ps->sync.on && m.step != ps->sync.step) {
        char msg[256];
        snprintf(msg, sizeof msg, "CKPT: %s is at step %lld, not %lld", ps->name,
                 (long long)ps->sync.step, (long long)m.step);
        qr__peer_reply_error(p, f, QR_EINTERNAL, msg);
        return;
    }
    if (qr__ckpt_start_shard(ps, m.id, m.step, m.base)) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", qr_last_error());
        qr__peer_reply_error(p, f, QR_EINTERNAL, msg);
        return;
    }
    ps->ckpt.reply_peer = p;
    ps->ckpt.reply_req = *f;
}

void qr__ckpt_peer_lost(ps_peer *p) {
    ps_ckpt *c = &p->ps->ckpt;
    qr__ckpt_cut_peer_lost(p);
    if (c->reply_peer == p) c->reply_peer = NULL;
    if (c->stop_peer == p) c->stop_peer = NULL;
    qr__ckpt_save_peer_lost(p);
}

/*
 * ckpt_coord.c - when the ps tier takes a checkpoint and who does what;
 * the shards' format is ckpt_shard.c's (as Redis keeps rdb.c apart from
 * serverCron). docs/CHECKPOINTS.md has the user's view.
 *
 * Taking one:
 *   1. ps 0 decides, after the global step advanced: every
 *      checkpoint-steps steps, every checkpoint-secs seconds, when a
 *      worker asks for one (SAVE, ckpt_save.c), and at an orderly stop
 *      (the final checkpoint, then the stop). One is taken at a time; one
 *      that fails is given up, and none is started again for a second.
 *      In sync mode that moment lies between two steps: step S-1 is applied
 *      on every ps and step S not yet anywhere, since APPLY(S) leaves ps 0
 *      only once S has its quorum. ps 0 sends CKPT(S) to the others on its
 *      links and takes its own shard; a link is ordered, so each ps gets
 *      CKPT(S) before APPLY(S) and takes its shard at the same step.
 *      In async mode with one ps every push is applied whole on the loop,
 *      so any moment between two messages is a consistent cut. With
 *      several ps the moment is a cut agreed across them (ckpt_cut.c),
 *      whose CUT message asks each ps for its shard.
 *      ps 0 also decides whether it is full or an increment of the previous
 *      one (complete, and its chain shorter than checkpoint-full-every),
 *      and names that base in CKPT; the first of a run is full.
 *   2. Each ps takes its shard on the loop and writes it on libuv's thread
 *      pool (qr__ckpt_start_shard; ckpt_shard.c); an increment only if its
 *      own last shard is of the base. With --ps-replicas 2 each shard is
 *      written by the ps that serves it: a backup promoted after a failover
 *      writes its failed primary's shard from its copy too (a second job,
 *      a second record in its CKPT reply); ps 0 keeps per shard the ps
 *      asked for it (writers) and asks no failed ps or replacement.
 *   3. Each ps reports its file's size and crc32 to ps 0 (the CKPT reply);
 *      ps 0 writes the manifest, on the thread pool too, which makes the
 *      checkpoint exist, then prunes old ones (keep-checkpoints).
 *
 * Restoring: qr__ckpt_init, before the ps listens, picks the checkpoint:
 * the newest whose chain verifies (qr_ckpt_latest_chain skips corrupt ones
 * with a warning), or, in a rollback, exactly the one the restarted ps
 * restored (or none); the full one of its chain is read, then each
 * increment applied in order; ckpt_shard.c recreates this shard's
 * variables, tables, slots, averages, counters and the workers' data
 * positions, as if the ps had never stopped. The chief's CREATE then
 * finds them and, as with any live ps, keeps them (its payload is
 * discarded), so nothing is re-initialized; a variable declared
 * differently is refused by create.c with both shapes named. With
 * --ps-replicas 2 the ps then restores its primary's shard of the same
 * checkpoint into the copy it holds: both copies start from one file.
 */
#include "ps/ps_internal.h"

#include "ckpt/ckpt.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* What ckpt_shard.c reads of this ps: its own shard, or (copy) the copy
 * of ps `primary`'s that it holds (ps-replicas 2), with that shard's own
 * step counter. */
static ckpt_shard_ctx shard_ctx(qr_ps *ps, bool copy) {
    ckpt_shard_ctx sc = {.store = &ps->store, .optim = ps->optim, .cfg = ps->cfg,
                         .index = ps->index, .nps = ps->cluster->nps,
                         .nworkers = ps->cluster->nworkers, .sync = ps->sync.on,
                         .applied_steps = ps->applied_steps,
                         .average_decay = ps->average_decay, .data_pos = ps->ckpt.data_pos,
                         .incarnation = ps->incarnation,
                         .coordinator = ps->index == 0 ? ps->incarnation : ps->coordinator};
    if (copy) {
        sc.store = &ps->replica.store;
        sc.index = ps->replica.primary;
        sc.applied_steps = ps->replica.copy_steps;
        sc.data_pos = NULL; /* ps 0's own shard only; ps 0 is never a promoted copy */
    }
    return sc;
}

bool qr__ckpt_writer(const qr_ps *ps, int k) {
    return !qr__replica_on(ps) || ps->replica.failed[k] == QR_PS_ALIVE;
}

/* The shard this ps was promoted to serve, which it writes too; -1: none. */
static int promoted_shard(const qr_ps *ps) {
    const ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps) || !r->promoted || r->failed[r->primary] == QR_PS_ALIVE) return -1;
    return r->primary;
}

/* ---- this ps's shard(s): taken, written, answered ----------------------------- */

static void shard_written(qr_ps *ps, int from, int index, int status, const char *error,
                          const qr_msg_shard *shard);
static void writer_failed(qr_ps *ps, int from, int status, const char *error);

/* Every shard of this ps is written: ps 0 counts them; ps k answers CKPT
 * with its own shard's record, then the promoted copy's (u32 shard, record). */
static void shards_written(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    int copy = c->copy_shard;
    c->copy_shard = -1;
    if (ps->index == 0) {
        uint64_t id = c->next_id;
        shard_written(ps, 0, 0, c->results[0].status, c->results[0].error, &c->results[0].shard);
        if (copy >= 0 && c->next_id == id)
            shard_written(ps, 0, copy, c->results[1].status, c->results[1].error,
                          &c->results[1].shard);
        if (c->next_id == id)
            writer_failed(ps, 0, QR_EINTERNAL, "ps 0 did not write it (the view moved)");
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
    ckpt_shard_ctx sc = shard_ctx(ps, copy);
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
 * promoted copy's shard, if this ps serves one (ps-replicas 2). */
int qr__ckpt_start_shard(qr_ps *ps, uint64_t id, int64_t step, uint64_t base) {
    ps_ckpt *c = &ps->ckpt;
    if (c->job || c->copy_job)
        return qr__fail(QR_EINVAL, "a checkpoint is still being written on %s", ps->name);
    int copy = promoted_shard(ps);
    ckpt_job *own = NULL, *cj = NULL;
    uint64_t t0 = qr__now_ns();
    int rc = snapshot(ps, false, id, step, base, &own);
    if (!rc && copy >= 0) rc = snapshot(ps, true, id, step, base, &cj);
    if (rc) {
        if (own) qr__ckpt_shard_free(own);
        return rc;
    }
    ps->ckpt.last_snapshot_ms = (double)(qr__now_ns() - t0) / 1e6;
    ps->ckpt.max_snapshot_ms = QR_MAX(ps->ckpt.max_snapshot_ms, ps->ckpt.last_snapshot_ms);
    memset(c->results, 0, sizeof c->results);
    rc = uv_queue_work(&ps->loop, &own->work, qr__ckpt_shard_write, on_shard_written);
    if (rc) {
        qr__ckpt_shard_free(own);
        if (cj) qr__ckpt_shard_free(cj);
        return qr__fail(QR_EINTERNAL, "cannot queue a checkpoint write: %s", uv_strerror(rc));
    }
    c->job = own;
    c->copy_shard = copy;
    if (!cj) return QR_OK;
    rc = uv_queue_work(&ps->loop, &cj->work, qr__ckpt_shard_write, on_shard_written);
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

/* ---- ps 0: the checkpoint as a whole ------------------------------------------ */

typedef struct manifest_job {
    uv_work_t work;
    qr_ps *ps;
    qr_ckpt_info info;
    int keep;
    int status;
    char error[512];
} manifest_job;

static void write_manifest(uv_work_t *w) {
    manifest_job *m = w->data;
    qr__ckpt_lower_priority();
    m->status = qr_ckpt_write_manifest(&m->info);
    if (!m->status && qr_ckpt_prune(m->ps->ckpt.dir, m->keep))
        qr__log(QR_LOG_WARN, "removing old checkpoints: %s", qr_last_error());
    /* Every shard of this checkpoint is in place and no other is being
     * written: a temporary file left now is a dead writer's. */
    if (!m->status) qr_ckpt_remove_dead_tmp(m->ps->ckpt.dir);
    if (m->status) snprintf(m->error, sizeof m->error, "%s", qr_last_error());
}

static void finish_checkpoint(qr_ps *ps);

static void on_manifest_written(uv_work_t *w, int status) {
    manifest_job *m = w->data;
    qr_ps *ps = m->ps;
    ps_ckpt *c = &ps->ckpt;
    double seconds = (double)(qr__now_ns() - c->started_ns) / 1e9;
    if (status || m->status) {
        qr__log(QR_LOG_ERROR, "checkpoint at step %lld: writing the manifest: %s",
                (long long)c->step, status ? uv_strerror(status) : m->error);
    } else {
        c->last_step = c->step;
        c->last_id = m->info.checkpoint_id;
        c->last_view = c->started_view;
        c->chain_length = c->base_id ? c->chain_length + 1 : 0;
        if (!c->base_id) c->full_step = c->step;
        c->last_seconds = seconds;
        c->last_bytes = m->info.bytes;
        c->last_unix_time = m->info.unix_time;
        c->written++;
        char kind[96] = "full";
        if (c->base_id)
            snprintf(kind, sizeof kind, "incremental on step %lld", (long long)c->base_step);
        qr__log(QR_LOG_INFO, "checkpoint %s written: global step %lld (%s), %d shard(s), "
                "%.1f MB in %.3f s", m->info.path, (long long)c->step, kind, m->info.nshards,
                (double)m->info.bytes / 1e6, seconds);
    }
    free(m);
    finish_checkpoint(ps);
}

static void shards_complete(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    if (c->failure[0]) {
        qr__log(QR_LOG_ERROR, "checkpoint at step %lld not taken: %s", (long long)c->step,
                c->failure);
        finish_checkpoint(ps);
        return;
    }
    manifest_job *m = qr__calloc(1, sizeof *m);
    if (!m) {
        finish_checkpoint(ps);
        return;
    }
    m->ps = ps;
    m->keep = c->keep;
    m->work.data = m;
    qr_ckpt_path(m->info.path, sizeof m->info.path, c->dir, c->step);
    m->info.step = c->step;
    m->info.unix_time = (double)time(NULL);
    snprintf(m->info.mode, sizeof m->info.mode, "%s", ps->sync.on ? "sync" : "async");
    m->info.nshards = ps->cluster->nps;
    m->info.incarnation = ps->incarnation;
    m->info.checkpoint_id = c->next_id;
    m->info.incremental = c->base_id != 0;
    m->info.base_step = c->base_id ? c->base_step : -1;
    m->info.base_id = c->base_id;
    m->info.full_step = c->base_id ? c->full_step : c->step;
    m->info.shards = c->shards; /* read by the writer; freed after the checkpoint */
    for (int i = 0; i < m->info.nshards; i++) m->info.bytes += c->shards[i].bytes;
    if (uv_queue_work(&ps->loop, &m->work, write_manifest, on_manifest_written)) {
        free(m);
        finish_checkpoint(ps);
    }
}

/* ps 0: shard `index` written by ps `from` (or not: status). A shard
 * counts once, and only from the ps that was asked for it. */
static void shard_written(qr_ps *ps, int from, int index, int status, const char *error,
                          const qr_msg_shard *shard) {
    ps_ckpt *c = &ps->ckpt;
    if (!c->busy || !c->shards || !c->writers || index < 0 || index >= ps->cluster->nps ||
        c->writers[index] != from)
        return;
    c->writers[index] = -1;
    if (status && !c->failure[0])
        snprintf(c->failure, sizeof c->failure, "ps %d, shard %d: %s", from, index, error);
    if (!status) {
        qr_ckpt_shard *s = &c->shards[index];
        qr_ckpt_shard_name(s->file, sizeof s->file, index, ps->cluster->nps);
        s->bytes = shard->bytes;
        s->crc32 = shard->crc32;
        s->nvars = (int)shard->nvars;
    }
    if (--c->shards_pending == 0) shards_complete(ps);
}

/* ps 0: every shard ps `from` was to write, not written (its link lost,
 * or its answer an error). */
static void writer_failed(qr_ps *ps, int from, int status, const char *error) {
    ps_ckpt *c = &ps->ckpt;
    /* The last shard may end this checkpoint, and the next may start at
     * once: its shards are not this one's. */
    uint64_t id = c->next_id;
    for (int k = 0; c->busy && c->writers && c->next_id == id && k < ps->cluster->nps; k++)
        if (c->writers[k] == from) shard_written(ps, from, k, status, error, NULL);
}

/* Collect the shards of the checkpoint at `step`: this ps's, and in sync
 * mode the others' (async: the CUT that ckpt_cut.c sent asks for them).
 * Each shard is written by the ps that serves it now: its own ps, or,
 * after a failover (ps-replicas 2), the backup promoted in its place. */
void qr__ckpt_take(qr_ps *ps, int64_t step) {
    ps_ckpt *c = &ps->ckpt;
    int nps = ps->cluster->nps;
    c->step = step;
    c->shards = qr__calloc((size_t)nps, sizeof *c->shards);
    free(c->writers);
    c->writers = qr__calloc((size_t)nps, sizeof *c->writers);
    if (!c->shards || !c->writers) {
        qr__ckpt_failed(ps, "out of memory");
        return;
    }
    for (int k = 0; k < nps; k++)
        c->writers[k] = qr__ckpt_writer(ps, k) ? k : (k + 1) % nps;
    c->shards_pending = nps;
    if (ps->sync.on) {
        qr_wbuf meta = {0};
        qr_msg_put_ckpt(&meta, &(qr_msg_ckpt){.phase = QR_CKPT_SNAPSHOT, .id = c->next_id,
                                              .step = step, .base = c->base_id});
        for (int k = 1; k < nps; k++)
            if (qr__ckpt_writer(ps, k)) qr__link_ckpt(ps, k, &meta, qr__ckpt_link_answer);
        qr_wbuf_free(&meta);
    }
    if (qr__ckpt_start_shard(ps, c->next_id, step, c->base_id)) {
        char error[512];
        snprintf(error, sizeof error, "%s", qr_last_error());
        writer_failed(ps, 0, QR_EINTERNAL, error);
    }
}

void qr__ckpt_failed(qr_ps *ps, const char *why) {
    ps_ckpt *c = &ps->ckpt;
    qr__log(QR_LOG_WARN, "checkpoint at step %lld given up: %s", (long long)c->step, why);
    /* Not again at once: a late reply of this one must not be taken for
     * the next one's. */
    c->retry_ns = qr__now_ns() + 1000000000ull;
    finish_checkpoint(ps);
}

void qr__ckpt_start(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    c->busy = true;
    c->step = c->started_step = ps->global_step;
    c->started_ns = c->last_ns = qr__now_ns();
    c->failure[0] = '\0';
    /* An increment of the previous checkpoint when that one is complete
     * (none failed or was given up since: every ps's last shard is of it)
     * and its chain is shorter than full-every; else a full one. The
     * first one of a run is full, so a chain never spans a restart. */
    /* With two copies, also none since the view moved: a shard whose
     * writer moved (to its promoted copy) has no base on its new writer. */
    c->started_view = qr__replica_on(ps) ? ps->replica.view : 0;
    bool increment = c->full_every > 1 && c->last_id && c->last_id == c->next_id &&
                     c->chain_length + 1 < c->full_every && c->last_view == c->started_view;
    c->base_id = increment ? c->last_id : 0;
    c->base_step = increment ? c->last_step : -1;
    c->next_id++;
    if (!ps->sync.on && ps->cluster->nps > 1) qr__ckpt_cut_begin(ps);
    else qr__ckpt_take(ps, ps->global_step);
}

static void finish_checkpoint(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    free(c->shards);
    c->shards = NULL;
    free(c->writers);
    c->writers = NULL;
    c->busy = false;
    bool more_saves = qr__ckpt_save_done(ps, c->next_id, c->last_step == c->step);
    if (c->want_final && !c->final_started && ps->global_step != c->last_step &&
        !(ps->sync.on && ps->sync.applying)) {
        /* The one that just ended was a periodic one: now the final. */
        c->final_started = true;
        qr__ckpt_start(ps);
        return;
    }
    if (c->want_final && (c->final_started || ps->global_step == c->last_step)) {
        c->want_final = false;
        if (c->stop_peer) qr__peer_reply(c->stop_peer, &c->stop_req, QR_OK, NULL, NULL, 0, NULL, NULL);
        c->stop_peer = NULL;
        if (c->final_stops_cluster) qr__ps_ask_stop_cluster(ps);
        else qr__ps_ask_stop(ps);
        return;
    }
    /* A save asked for while this one was under way wants a newer one. */
    if (more_saves && !ps->stopping && !(ps->sync.on && ps->sync.applying)) qr__ckpt_start(ps);
}

static bool due(const qr_ps *ps) {
    const ps_ckpt *c = &ps->ckpt;
    if (ps->global_step == c->last_step) return false;
    /* The next multiple of checkpoint-steps after the last one started: a
     * multiple reached while one was still being written is taken as soon
     * as that one is done, not skipped. */
    if (c->every_steps > 0 &&
        ps->global_step >= (c->started_step / c->every_steps + 1) * c->every_steps)
        return true;
    return c->every_secs > 0 &&
           qr__now_ns() - c->last_ns >= (uint64_t)c->every_secs * 1000000000ull;
}

void qr__ckpt_step_done(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    if (!c->dir || ps->index != 0 || c->busy || ps->stopping || qr__now_ns() < c->retry_ns) return;
    if (c->want_final) c->final_started = true;
    if (c->want_final || c->saves || due(ps)) qr__ckpt_start(ps);
}

bool qr__ckpt_final(qr_ps *ps, ps_peer *p, const qr_frame *f) {
    ps_ckpt *c = &ps->ckpt;
    if (!c->dir || ps->index != 0 || c->want_final) return false;
    if (!c->busy && ps->global_step == c->last_step) return false; /* have it */
    c->want_final = true;
    c->stop_peer = p;
    if (f) c->stop_req = *f;
    qr__log(QR_LOG_INFO, "stop requested: writing the final checkpoint (global step %lld) first",
            (long long)ps->global_step);
    /* Sync: between steps only; a step being applied finishes first and
     * qr__ckpt_step_done takes it then. A checkpoint under way is
     * followed by the final one. */
    if (!c->busy && !(ps->sync.on && ps->sync.applying)) {
        c->final_started = true;
        qr__ckpt_start(ps);
    }
    return true;
}

/* A ps k's link lost while it wrote its shard(s): they are lost to us. */
static void link_lost(qr_ps *ps, int index) {
    ps_ckpt *c = &ps->ckpt;
    qr__ckpt_cut_link_lost(ps, index);
    if (!c->busy || !c->shards) return;
    writer_failed(ps, index, QR_EPEERLOST, "the link to it was lost while it wrote its shard");
}

void qr__ckpt_link_answer(qr_ps *ps, int index, int status, const qr_frame *f,
                          const uint8_t *meta) {
    if (!f) {
        link_lost(ps, index);
        return;
    }
    if (qr__ckpt_cut_report(ps, index, f, meta)) return;
    if (!ps->ckpt.shards) return; /* RELEASE's reply, or a late one */
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_msg_shard shard = {0}, copy = {0};
    uint32_t copy_index = 0;
    bool has_copy = false;
    char error[512] = "";
    if (f->status) {
        snprintf(error, sizeof error, "%.*s", (int)QR_MIN(f->meta_len, 500u), (const char *)meta);
    } else {
        qr_msg_get_shard(&r, &shard);
        /* then the promoted copy's shard, if that ps serves one */
        if (!r.bad && r.left) {
            has_copy = true;
            copy_index = qr_rbuf_u32(&r);
            qr_msg_get_shard(&r, &copy);
        }
        if (r.bad || r.left) snprintf(error, sizeof error, "its CKPT reply is truncated");
    }
    if (error[0]) {
        writer_failed(ps, index, f->status ? f->status : QR_EPROTO, error);
        return;
    }
    uint64_t id = ps->ckpt.next_id;
    shard_written(ps, index, index, QR_OK, "", &shard);
    if (has_copy && ps->ckpt.next_id == id)
        shard_written(ps, index, (int)copy_index, QR_OK, "", &copy);
    /* a shard it was asked for and did not write (a view it had not
     * applied yet): not in this checkpoint */
    if (ps->ckpt.next_id == id)
        writer_failed(ps, index, QR_EINTERNAL, "its answer did not hold this shard");
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

/* ---- data positions ------------------------------------------------------------- */

void qr__ckpt_data_pos(qr_ps *ps, uint32_t worker, uint64_t pos) {
    if (ps->ckpt.data_pos && qr__is_worker(worker, ps->cluster->nworkers))
        ps->ckpt.data_pos[worker] = pos;
}

uint64_t qr__ckpt_worker_pos(const qr_ps *ps, int worker) {
    if (!ps->ckpt.data_pos || worker < 0 || worker >= ps->cluster->nworkers) return 0;
    return ps->ckpt.data_pos[worker];
}

void qr__ckpt_stats_json(const qr_ps *ps, cJSON *obj) {
    const ps_ckpt *c = &ps->ckpt;
    if (!c->dir) return;
    cJSON *j = cJSON_AddObjectToObject(obj, "checkpoint");
    cJSON_AddStringToObject(j, "dir", c->dir);
    cJSON_AddNumberToObject(j, "written", (double)c->written);
    cJSON_AddNumberToObject(j, "last_step", (double)c->last_step);
    cJSON_AddNumberToObject(j, "last_duration_s", c->last_seconds);
    cJSON_AddNumberToObject(j, "last_bytes", (double)c->last_bytes);
    cJSON_AddBoolToObject(j, "last_incremental", c->last_id && c->chain_length > 0);
    cJSON_AddNumberToObject(j, "full_every", (double)c->full_every);
    cJSON_AddNumberToObject(j, "last_unix_time", c->last_unix_time);
    cJSON_AddNumberToObject(j, "restored_step", (double)c->restored_step);
    cJSON_AddNumberToObject(j, "last_snapshot_ms", c->last_snapshot_ms);
    cJSON_AddNumberToObject(j, "max_snapshot_ms", c->max_snapshot_ms);
}

/* ---- restore at start ---------------------------------------------------------- */

/* Restore a shard of the chain into this ps: its own, or (copy, with
 * ps-replicas 2) its primary's into the copy it holds. The full
 * checkpoint, then each increment in order (qr_ckpt_chain verified every
 * link). */
static int restore_shard(qr_ps *ps, const qr_ckpt_info *chain, int n, bool copy) {
    const qr_ckpt_info *info = &chain[n - 1];
    ckpt_shard_ctx sc = shard_ctx(ps, copy);
    char file[64], path[4200];
    qr_ckpt_shard_name(file, sizeof file, sc.index, ps->cluster->nps);
    int64_t counters[2];
    int rc = QR_OK;
    for (int i = 0; i < n && !rc; i++) {
        snprintf(path, sizeof path, "%s/%s", chain[i].path, file);
        rc = i == 0 ? qr__ckpt_shard_restore(&sc, path, counters)
                    : qr__ckpt_shard_apply_increment(&sc, path, counters);
        /* qr_ckpt_verify matched the header to the manifest; the counter
         * read back must say the same (a shard replaced since is refused). */
        if (!rc && counters[0] != chain[i].step)
            rc = qr__fail(QR_EIO, "checkpoint shard '%s' holds global step %lld, its manifest "
                          "%lld: a shard of another checkpoint (mixed steps)", path,
                          (long long)counters[0], (long long)chain[i].step);
    }
    if (rc) return rc;
    char chained[64] = "";
    if (n > 1) snprintf(chained, sizeof chained, " and %d increment(s) after step %lld", n - 1,
                        (long long)chain[0].step);
    if (copy) {
        /* The copy starts equal to its primary, which restores the same
         * bytes: the shard's own steps (Adam's t) are the file's. */
        ps->replica.copy_steps = counters[1];
        qr__log(QR_LOG_INFO, "restored the copy of ps %d's shard: %u variable(s), %.1f MB, "
                "from %s%s (global step %lld)", sc.index, sc.store->count,
                (double)sc.store->bytes / 1e6, n > 1 ? chain[0].path : path, chained,
                (long long)info->step);
        return QR_OK;
    }
    ps->global_step = counters[0];
    ps->sync.step = counters[0];
    ps->applied_steps = counters[1];
    ps->ckpt.restored_step = counters[0];
    ps->ckpt.started_step = counters[0];
    ps->ckpt.last_step = counters[0];
    qr__log(QR_LOG_INFO, "restored %u variable(s), %.1f MB, from %s%s (global step %lld)",
            ps->store.count, (double)ps->store.bytes / 1e6, n > 1 ? chain[0].path : path,
            chained, (long long)info->step);
    return QR_OK;
}

int qr__ckpt_init(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    c->last_step = c->restored_step = -1;
    c->copy_shard = -1;
    c->copy_snapshot_id = c->copy_snapshot_coordinator = 0;
    /* A run (the first, or one after a rollback) starts no chain on one
     * of a former run: its first checkpoint is full. */
    c->last_id = c->snapshot_id = c->snapshot_coordinator = c->base_id = 0;
    c->chain_length = 0;
    /* ps 0 keeps each worker's data position, checkpoints or not: a worker
     * restarted into the live cluster reads its own back (control.c). */
    if (ps->index == 0) {
        c->data_pos = qr__calloc((size_t)ps->cluster->nworkers, sizeof *c->data_pos);
        if (!c->data_pos) return QR_ENOMEM;
    }
    const char *dir = qr__config_str(ps->cfg, "checkpoint-dir");
    if (!dir[0]) return QR_OK;
    c->dir = qr__strdup(dir);
    c->every_secs = qr__config_int(ps->cfg, "checkpoint-secs");
    c->every_steps = qr__config_int(ps->cfg, "checkpoint-steps");
    c->keep = (int)qr__config_int(ps->cfg, "keep-checkpoints");
    c->full_every = qr__config_int(ps->cfg, "checkpoint-full-every");
    c->last_ns = qr__now_ns();
    if (!c->dir) return QR_ENOMEM;
    int rc = qr_mkdir(dir);
    if (rc) return rc;
    qr_ckpt_info info = {0}, *chain = NULL;
    int nchain = 0;
    if (ps->restore_step == QR_RESTORE_NONE) {
        qr__log(QR_LOG_INFO, "starting fresh, as the ps that made the cluster roll back did");
        return QR_OK;
    }
    if (ps->restore_step >= 0) {
        /* A rollback: exactly the checkpoint the restarted ps restored. */
        rc = qr_ckpt_path(info.path, sizeof info.path, dir, ps->restore_step);
        info.step = ps->restore_step;
        if (!rc) rc = qr_ckpt_read_manifest(&info);
        if (!rc) rc = qr_ckpt_chain(&info, &chain, &nchain);
        qr_ckpt_info_free(&info);
        if (rc) {
            qr__error_prefix("cannot roll back to the checkpoint of step %lld: ",
                             (long long)ps->restore_step);
            return rc;
        }
    } else {
        rc = qr_ckpt_latest_chain(dir, &chain, &nchain);
    }
    if (rc == QR_ENOTFOUND) {
        qr__log(QR_LOG_INFO, "no checkpoint in %s: starting fresh", dir);
        return QR_OK;
    }
    if (rc == QR_EIO && ps->restore_step < 0) {
        /* Every checkpoint there is damaged: a fresh start would train from
         * nothing and, at the next checkpoints, prune them away. */
        if (!qr__config_bool(ps->cfg, "allow-fresh-start")) {
            qr__error_prefix("refusing to start fresh over damaged checkpoints (repair or move "
                             "them, or pass --allow-fresh-start to train from scratch): ");
            return rc;
        }
        qr__log(QR_LOG_WARN, "%s; starting fresh, as --allow-fresh-start says", qr_last_error());
        return QR_OK;
    }
    if (!rc && chain[nchain - 1].nshards != ps->cluster->nps)
        rc = qr__fail(QR_EINVAL, "checkpoint %s has %d shards, this cluster %d ps tasks: "
                      "restore it with as many ps tasks as wrote it", chain[nchain - 1].path,
                      chain[nchain - 1].nshards, ps->cluster->nps);
    if (!rc) rc = restore_shard(ps, chain, nchain, false);
    /* With two copies the backup loads its primary's shard of the same
     * checkpoint: both copies start from the same verified bytes, equal
     * bit for bit, before any worker connects (docs/REPLICATION.md). */
    if (!rc && qr__replica_on(ps)) rc = restore_shard(ps, chain, nchain, true);
    qr_ckpt_list_free(chain, nchain);
    return rc;
}

int qr__ckpt_loop_init(qr_ps *ps) {
    if (!ps->ckpt.dir || ps->sync.on || ps->cluster->nps == 1) return QR_OK;
    return qr__ckpt_cut_init(ps);
}

void qr__ckpt_close(qr_ps *ps) {
    qr__ckpt_cut_close(ps);
}

void qr__ckpt_free(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    qr__ckpt_cut_free(ps);
    qr__ckpt_save_free(ps);
    free(c->dir);
    free(c->shards);
    free(c->writers);
    free(c->data_pos);
    c->dir = NULL;
    c->shards = NULL;
    c->writers = NULL;
    c->data_pos = NULL;
}

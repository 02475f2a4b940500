/*
 * ckpt_coord.c - when the ps tier takes a checkpoint and who does what,
 * decided by ps 0: the checkpoint started, its shards collected from the
 * ps that write them, the manifest written (on the thread pool), the
 * final one before an orderly stop. Each ps's own part, its shard(s)
 * taken and written and ps k's CKPT answered, is ckpt_write.c's; the
 * checkpoint a starting ps restores is ckpt_init.c's; the shards'
 * format is ckpt_shard.c's (as Redis keeps rdb.c apart from
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
 *      pool (qr__ckpt_start_shard, ckpt_write.c; ckpt_shard.c); an
 *      increment only if its own last shard is of the base. With --ps-replicas 2 each shard is
 *      written by the ps that serves it: a backup promoted after a failover
 *      writes its failed primary's shard from its copy too (a second job,
 *      a second record in its CKPT reply); ps 0 keeps per shard the ps
 *      asked for it (writers) and asks no failed ps or replacement.
 *   3. Each ps reports its file's size and crc32 to ps 0 (the CKPT reply);
 *      ps 0 writes the manifest, on the thread pool too, which makes the
 *      checkpoint exist, then prunes old ones (keep-checkpoints).
 */
#include "ps/ps_internal.h"

#include "ckpt/ckpt.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
void qr__ckpt_shard_written(qr_ps *ps, int from, int index, int status, const char *error,
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
void qr__ckpt_writer_failed(qr_ps *ps, int from, int status, const char *error) {
    ps_ckpt *c = &ps->ckpt;
    /* The last shard may end this checkpoint, and the next may start at
     * once: its shards are not this one's. */
    uint64_t id = c->next_id;
    for (int k = 0; c->busy && c->writers && c->next_id == id && k < ps->cluster->nps; k++)
        if (c->writers[k] == from) qr__ckpt_shard_written(ps, from, k, status, error, NULL);
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
        QR_EACH_OTHER_PS(ps, k)
            if (qr__ckpt_asked(ps, k)) qr__link_ckpt(ps, k, &meta, qr__ckpt_link_answer);
        qr_wbuf_free(&meta);
    }
    if (qr__ckpt_start_shard(ps, c->next_id, step, c->base_id)) {
        char error[512];
        snprintf(error, sizeof error, "%s", qr_last_error());
        qr__ckpt_writer_failed(ps, ps->index, QR_EINTERNAL, error);
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
    bool written = c->last_step == c->step;
    /* Saves asked for while this one was written, the global step still
     * where this one took it (workers waiting on the saver, say), are
     * served by it too: it holds that very step, as a save asked for now
     * is answered (ckpt_save.c). Another at the same step would be
     * written into this one's folder, over it (its base). */
    uint64_t serves = written && ps->global_step == c->last_step ? UINT64_MAX : c->next_id;
    bool more_saves = qr__ckpt_save_done(ps, serves, written);
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

/* Does the coordinator know where every worker's data is? Always, but on
 * a successor (qr__ckpt_take_over) until each worker still training has
 * pushed to it: a checkpoint taken before would hold positions as old as
 * the takeover's first push of theirs. */
static bool positions_known(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    if (!c->pos_fresh) return true;
    for (int w = 0; w < ps->cluster->nworkers; w++)
        if (!c->pos_fresh[w] && !qr__liveness_finished(ps, w)) return false;
    free(c->pos_fresh);
    c->pos_fresh = NULL;
    return true;
}

static bool due(qr_ps *ps) {
    const ps_ckpt *c = &ps->ckpt;
    if (ps->global_step == c->last_step || !positions_known(ps)) return false;
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
    if (!c->dir || !qr__ps_coordinates(ps) || c->busy || ps->stopping || qr__now_ns() < c->retry_ns) return;
    if (c->want_final) c->final_started = true;
    if (c->want_final || (c->saves && positions_known(ps)) || due(ps)) qr__ckpt_start(ps);
}

int qr__ckpt_take_over(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    int nw = ps->cluster->nworkers;
    if (!c->data_pos && !(c->data_pos = qr__calloc((size_t)nw, sizeof *c->data_pos)))
        return QR_ENOMEM;
    /* Each worker's data position, as the copy of ps 0's shard has it from
     * the pushes forwarded to it: a worker restarted from now on reads its
     * own back from this ps (control.c), as it did from ps 0. */
    const repl_last *pos = qr__replica_on(ps) ? qr__replica_shard0_record(ps) : NULL;
    for (int w = 0; pos && w < nw; w++) c->data_pos[w] = pos[w].data_pos;
    if (!c->dir) return QR_OK;
    /* Where each worker's data is: in sync mode it comes with its next
     * commit (a held push's own part); an async cut reads it from every
     * ps's marks. */
    if (ps->sync.on && !(c->pos_fresh = qr__calloc((size_t)QR_MAX(nw, 1), 1))) return QR_ENOMEM;
    /* ps 0's checkpoint under way, if any, is given up: its manifest is
     * never written, and its shards' folder is a dead writer's. The
     * newest complete one on disk is what a rollback goes back to; the
     * first of this ps's own is full (a chain never spans coordinators:
     * an increment's base must be the last shard every ps took, of this
     * coordinator's). A multiple of checkpoint-steps passed since is due. */
    qr_ckpt_info *chain = NULL;
    int nchain = 0;
    if (!qr_ckpt_latest_chain(c->dir, &chain, &nchain)) {
        c->last_step = c->started_step = chain[nchain - 1].step;
        qr_ckpt_list_free(chain, nchain);
    }
    c->last_id = c->base_id = 0;
    c->chain_length = 0;
    c->busy = false;
    c->last_ns = qr__now_ns();
    if (!ps->sync.on && ps->cluster->nps > 1) return qr__ckpt_cut_coordinate(ps);
    return QR_OK;
}

bool qr__ckpt_final(qr_ps *ps, ps_peer *p, const qr_frame *f) {
    ps_ckpt *c = &ps->ckpt;
    if (!c->dir || !qr__ps_coordinates(ps) || c->want_final) return false;
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
    qr__ckpt_writer_failed(ps, index, QR_EPEERLOST,
                           "the link to it was lost while it wrote its shard");
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
        qr__ckpt_writer_failed(ps, index, f->status ? f->status : QR_EPROTO, error);
        return;
    }
    uint64_t id = ps->ckpt.next_id;
    qr__ckpt_shard_written(ps, index, index, QR_OK, "", &shard);
    if (has_copy && ps->ckpt.next_id == id)
        qr__ckpt_shard_written(ps, index, (int)copy_index, QR_OK, "", &copy);
    /* a shard it was asked for and did not write (a view it had not
     * applied yet): not in this checkpoint */
    if (ps->ckpt.next_id == id)
        qr__ckpt_writer_failed(ps, index, QR_EINTERNAL, "its answer did not hold this shard");
}

/* ---- data positions ------------------------------------------------------------- */

void qr__ckpt_data_pos(qr_ps *ps, uint32_t worker, uint64_t pos) {
    if (!ps->ckpt.data_pos || !qr__is_worker(worker, ps->cluster->nworkers)) return;
    ps->ckpt.data_pos[worker] = pos;
    if (ps->ckpt.pos_fresh) ps->ckpt.pos_fresh[worker] = 1;
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
    cJSON_AddNumberToObject(j, "disk_rows_off_loop", (double)c->disk_rows_off_loop);
}

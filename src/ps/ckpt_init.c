/*
 * ckpt_init.c - a ps's checkpoints from its start to its end: the
 * options (checkpoint-dir and the others), the checkpoint it restores
 * before it listens, and what it frees at the end. Taking a checkpoint
 * is ckpt_coord.c's (ps 0) and ckpt_write.c's (each ps's shard); the
 * shard files are read back by ckpt_restore.c.
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

#include <stdio.h>
#include <stdlib.h>

/* ---- restore at start ---------------------------------------------------------- */

/* Restore a shard of the chain into this ps: its own, or (copy, with
 * ps-replicas 2) its primary's into the copy it holds. The full
 * checkpoint, then each increment in order (qr_ckpt_chain verified every
 * link). */
static int restore_shard(qr_ps *ps, const qr_ckpt_info *chain, int n, bool copy) {
    const qr_ckpt_info *info = &chain[n - 1];
    ckpt_shard_ctx sc = qr__ckpt_ctx(ps, copy);
    /* Shard 0's workers' data positions go to its record too (ps-replicas
     * 2), the one a re-replication copies on and a successor coordinator
     * answers a restarted worker from (qr__ckpt_take_over): a worker that
     * has not pushed since the restore is still where the checkpoint
     * says. A copy on a ps that does not coordinate reads them into
     * `copy_pos`. */
    repl_last *record = !qr__replica_on(ps) || sc.index != 0 ? NULL
                        : copy ? ps->replica.backup_last : ps->replica.last;
    uint64_t *copy_pos = NULL;
    int nw = ps->cluster->nworkers;
    if (record && !sc.data_pos) {
        if (!(copy_pos = qr__calloc((size_t)QR_MAX(nw, 1), sizeof *copy_pos))) return QR_ENOMEM;
        sc.data_pos = copy_pos;
    }
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
    for (int w = 0; !rc && record && w < nw; w++) record[w].data_pos = sc.data_pos[w];
    free(copy_pos);
    if (rc) return rc;
    char chained[64] = "";
    if (n > 1) snprintf(chained, sizeof chained, " and %d increment(s) after step %lld", n - 1,
                        (long long)chain[0].step);
    if (copy) {
        /* The copy starts equal to its primary, which restores the same
         * bytes: the shard's own steps (Adam's t) are the file's. */
        ps->replica.copy_steps = counters[1];
        if (sc.index == 0) ps->replica.coord_step = counters[0]; /* the coordinator's shard */
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
    if (qr__ps_coordinates(ps)) {
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
    free(c->pos_fresh);
    c->pos_fresh = NULL;
    c->dir = NULL;
    c->shards = NULL;
    c->writers = NULL;
    c->data_pos = NULL;
}

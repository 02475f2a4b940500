/*
 * rerep.c - re-replication (--ps-replicas 2, async): a replacement for a
 * failed ps K joins the running cluster as the backup of the two shards
 * that lost a copy when K failed, without a rollback or a pause.
 * docs/REPLICATION.md, "Re-replication".
 *
 *   ps 0 keeps trying the address of a failed ps (links.c); a new run
 *   there (another incarnation) is a replacement: ps 0 marks it JOINING
 *   in the next view and sends the view to every ps (qr__rerep_joined).
 *   The two ps that hold the shards K backed up become its sources:
 *     - ps K+1, which serves shard K from its promoted copy, opens its
 *       copy link to K (replica.c: the promoted copy's forwards);
 *     - ps K-1, whose shard lost its backup, opens its own link to K
 *       again.
 *   Each source takes a snapshot of the shard (the checkpoint's:
 *   copy-on-write references, ckpt_shard.c), puts it at the head of the
 *   link's queue, and goes on training: every push applied from then on
 *   is forwarded behind it, and answered at once (the shard is still on
 *   one copy). The snapshot is sent as it stands (SNAPSHOT: the shard
 *   file's head, then its tensors where they are, no file and no copy);
 *   K loads it from the bytes received into the store it copies (its own shard
 *   into ps->store, its neighbour's into ps->replica.store), with the
 *   step counters, the duplicate records and the push count, then applies
 *   the forwards in order. Once K has applied the snapshot and every
 *   forward made before that moment, the source waits for K again before
 *   it answers a push (as any primary waits for its backup), and says so
 *   to ps 0 (its answer to the VIEW that started it; ps 0 itself: here).
 *   With both shards copied, ps 0 marks K BACKUP in the next view: both
 *   shards are on two copies again.
 *
 * K stays a backup (QR_PS_BACKUP): shard K keeps its primary on ps K+1.
 * A later failure of K is the first one again (failover.c); one of K+1
 * makes K serve shard K from its copy (K ALIVE again, as at the start).
 */
#include "ps/ps_internal.h"

#include "ckpt/ckpt.h"
#include "ps/ckpt_shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A snapshot as a SNAPSHOT's payload: the shard's safetensors head, then
 * each tensor's bytes where the snapshot holds them (the variables' own
 * values, averages and slots by reference, copied on write by the next
 * apply; the tables' rows copied when it was taken). Freed with the
 * forward, once the copy has it or is given up. */
typedef struct rerep_snapshot {
    ckpt_job *shard;
    uint8_t *head;
} rerep_snapshot;

/* What the snapshot's meta carries besides the shard. */
static void put_snapshot_meta(qr_wbuf *b, const repl_link *L, uint64_t fwd) {
    const qr_ps *ps = L->ps;
    const ps_replica *r = &ps->replica;
    int nw = QR_MAX(ps->cluster->nworkers, 1);
    qr_wbuf_u64(b, fwd);
    qr_wbuf_u32(b, (uint32_t)L->shard);
    qr_wbuf_i64(b, L->copy ? r->copy_steps : ps->applied_steps);
    qr_wbuf_u64(b, L->copy ? r->copy_pushes : r->own_pushes);
    qr_wbuf_u32(b, (uint32_t)nw);
    qr_wbuf_bytes(b, L->copy ? r->backup_last : r->last, (size_t)nw * sizeof(repl_last));
}

static ckpt_shard_ctx shard_ctx(qr_ps *ps, qr_store *store, int shard, int64_t steps) {
    return (ckpt_shard_ctx){.store = store, .optim = ps->optim, .cfg = ps->cfg,
                            .index = shard, .nps = ps->cluster->nps,
                            .nworkers = ps->cluster->nworkers, .sync = false,
                            .applied_steps = steps, .average_decay = ps->average_decay,
                            .incarnation = ps->incarnation,
                            .coordinator = ps->index == 0 ? ps->incarnation : ps->coordinator};
}

static void snapshot_free(void *owner) {
    rerep_snapshot *sn = owner;
    qr__ckpt_shard_free(sn->shard);
    free(sn->head);
    free(sn);
}

/* The snapshot of store's shard and its payload's buffers (*niov of them,
 * *bytes in all). */
static int take_snapshot(qr_ps *ps, qr_store *store, int shard, int64_t steps,
                         rerep_snapshot **out, qr_iov **iov_out, int *niov, size_t *bytes) {
    rerep_snapshot *sn = qr__calloc(1, sizeof *sn);
    if (!sn) return QR_ENOMEM;
    ckpt_shard_ctx sc = shard_ctx(ps, store, shard, steps);
    size_t head_len = 0;
    int rc = qr__ckpt_shard_snapshot(&sc, "re-replication", 0, ps->global_step, &sn->shard);
    if (!rc) rc = qr_st_head(sn->shard->path, sn->shard->tensors, sn->shard->ntensors,
                             sn->shard->meta, &sn->head, &head_len);
    qr_iov *iov = rc ? NULL : qr__calloc((size_t)sn->shard->ntensors + 1, sizeof *iov);
    if (!rc && !iov) rc = QR_ENOMEM;
    if (rc) {
        snapshot_free(sn);
        return rc;
    }
    int n = 0;
    iov[n++] = (qr_iov){sn->head, head_len};
    *bytes = head_len;
    for (int i = 0; i < sn->shard->ntensors; i++) {
        const qr_st_tensor *t = &sn->shard->tensors[i];
        size_t len = (size_t)qr_st_bytes(t);
        if (len) iov[n++] = (qr_iov){(void *)t->data, len};
        *bytes += len;
    }
    *out = sn;
    *iov_out = iov;
    *niov = n;
    return QR_OK;
}

/* "digest %016llx" of a store for a log line, or, for a large one, why
 * not: the digest reads every byte, one at a time (a second a GB), on the
 * loop, which a copy must not stall. */
#define DIGEST_MAX_BYTES ((size_t)64 << 20)
static const char *digest_note(const qr_store *s, size_t bytes, char *buf, size_t len) {
    if (bytes > DIGEST_MAX_BYTES)
        snprintf(buf, len, "digest left out above %zu MiB", DIGEST_MAX_BYTES >> 20);
    else
        snprintf(buf, len, "digest %016llx", (unsigned long long)qr__store_digest(s));
    return buf;
}

void qr__rerep_start(repl_link *L) {
    qr_ps *ps = L->ps;
    ps_replica *r = &ps->replica;
    if (!L->gone) return; /* a copy there, or being made */
    qr_store *store = L->copy ? &r->store : &ps->store;
    if (qr__ckpt_store_busy(store)) {
        /* A checkpoint's snapshot of the store is being written; a
         * variable protects one snapshot at a time. */
        L->deferred = true;
        qr__log(QR_LOG_INFO, "re-replication of shard %d to ps %d waits for the checkpoint "
                "being written", L->shard, L->target);
        return;
    }
    int64_t steps = L->copy ? r->copy_steps : ps->applied_steps;
    uint64_t t0 = qr__now_ns();
    rerep_snapshot *sn;
    qr_iov *iov;
    int niov;
    size_t bytes;
    int rc = take_snapshot(ps, store, L->shard, steps, &sn, &iov, &niov, &bytes);
    if (rc) {
        qr__log(QR_LOG_ERROR, "re-replication of shard %d to ps %d: %s; the shard stays on one "
                "copy", L->shard, L->target, qr_last_error());
        return;
    }
    double snap_ms = (double)(qr__now_ns() - t0) / 1e6;
    /* The snapshot heads the link's queue; what is applied from now on is
     * forwarded behind it, and answered at once until the copy has it. */
    repl_forward *fw = qr__replica_snapshot_forward(L);
    qr_wbuf meta = {0};
    put_snapshot_meta(&meta, L, L->snapshot_fwd);
    qr__replica_snapshot_meta(fw, &meta);
    qr_wbuf_free(&meta);
    qr__replica_snapshot_payload(fw, iov, niov, snapshot_free, sn);
    L->streaming = true;
    L->mark = 0;
    char digest[64];
    qr__log(QR_LOG_INFO, "re-replication of shard %d to ps %d: snapshot taken at forward %llu "
            "(%u variables, %.2f ms on the loop, %s); training goes on", L->shard, L->target,
            (unsigned long long)L->snapshot_fwd, store->count, snap_ms,
            digest_note(store, bytes, digest, sizeof digest));
    qr__log(QR_LOG_INFO, "re-replication of shard %d to ps %d: snapshot made (%zu bytes, %.1f "
            "MB, sent from the variables' own tensors), sending it", L->shard, L->target,
            bytes, (double)bytes / 1e6);
    qr__replica_link_flush(L);
}

/* ---- the source: caught up ---------------------------------------------------- */

static void copied(qr_ps *ps, int joiner, int bit);

void qr__rerep_acked(repl_link *L) {
    qr_ps *ps = L->ps;
    if (!L->mark && L->acked >= L->snapshot_fwd) {
        L->mark = L->next_fwd - 1; /* every forward made while the copy was being made */
        qr__log(QR_LOG_INFO, "re-replication of shard %d: ps %d has loaded the snapshot; %llu "
                "forwards made meanwhile to apply", L->shard, L->target,
                (unsigned long long)(L->mark - L->snapshot_fwd));
    }
    if (!L->mark || L->acked < L->mark) return;
    L->streaming = false;
    qr__log(QR_LOG_INFO, "re-replication of shard %d: ps %d holds it now (forward %llu); its "
            "pushes wait for ps %d again", L->shard, L->target, (unsigned long long)L->acked,
            L->target);
    int bit = L->copy ? 1 : 2; /* its own shard, or its neighbour's */
    ps_rerep_report *rep = &ps->rerep;
    if (ps->index == 0) {
        copied(ps, L->target, bit);
    } else if (rep->peer) {
        qr_wbuf out = {0};
        qr_wbuf_u32(&out, (uint32_t)L->target);
        qr_wbuf_u32(&out, (uint32_t)bit);
        qr__peer_reply(rep->peer, &rep->req, QR_OK, &out, NULL, 0, NULL, NULL);
        qr_wbuf_free(&out);
        rep->peer = NULL;
    }
}

/* ---- ps 0: a replacement joins, and is made a backup ---------------------------- */

static void advance(qr_ps *ps) {
    ps_replica *r = &ps->replica;
    r->view++;
    qr_wbuf_reset(&ps->sync.view_meta);
    qr_msg_put_view(&ps->sync.view_meta, r->view, ps->cluster->nps, r->failed);
    qr__failover_apply(ps);
    qr__links_view(ps);
    qr__failover_notify_workers(ps);
}

bool qr__rerep_joined(qr_ps *ps, int k) {
    ps_replica *r = &ps->replica;
    int nps = ps->cluster->nps;
    if (!qr__replica_on(ps) || ps->index != 0 || r->failed[k] != QR_PS_FAILED) return false;
    if (ps->sync.on) {
        /* The copies of a sync step in flight are not part of a snapshot
         * yet: the shard stays on one copy. */
        qr__log(QR_LOG_WARN, "ps %d (%s) is back, but re-replication is built for async mode "
                "only: it is not made a backup", k, ps->cluster->ps[k]);
        return false;
    }
    int next = (k + 1) % nps, prev = (k + nps - 1) % nps;
    if (r->failed[next] != QR_PS_ALIVE || r->failed[prev] == QR_PS_FAILED ||
        r->failed[prev] == QR_PS_JOINING) {
        qr__log(QR_LOG_WARN, "ps %d (%s) is back, but ps %d or ps %d does not hold its copies: "
                "it is not made a backup", k, ps->cluster->ps[k], next, prev);
        return false;
    }
    r->failed[k] = QR_PS_JOINING;
    r->rejoin_done[k] = 0;
    qr__log(QR_LOG_WARN, "ps %d (%s) is back, a new run: it rejoins as a backup (view %llu): "
            "ps %d copies it shard %d, ps %d shard %d, while training goes on", k,
            ps->cluster->ps[k], (unsigned long long)r->view + 1, next, k, prev, prev);
    advance(ps);
    return true;
}

static void copied(qr_ps *ps, int joiner, int bit) {
    ps_replica *r = &ps->replica;
    int nps = ps->cluster->nps;
    if (joiner <= 0 || joiner >= nps || r->failed[joiner] != QR_PS_JOINING) return;
    r->rejoin_done[joiner] |= (uint8_t)bit;
    if (r->rejoin_done[joiner] != 3) return;
    r->failed[joiner] = QR_PS_BACKUP;
    qr__log(QR_LOG_WARN, "re-replication complete: ps %d holds copies of shard %d (served by ps "
            "%d) and of shard %d: both on two copies again (view %llu)", joiner, joiner,
            (joiner + 1) % nps, (joiner + nps - 1) % nps, (unsigned long long)r->view + 1);
    qr__tell_supervisor("rejoined ps %d %llu", joiner, (unsigned long long)r->view + 1);
    advance(ps);
}

void qr__rerep_view_answer(qr_ps *ps, int from, int status, const uint8_t *meta, uint32_t len) {
    if (status) {
        qr__log(QR_LOG_WARN, "ps %d: re-replication failed: %.*s", from,
                (int)QR_MIN(len, 500u), (const char *)meta);
        return;
    }
    if (len != 8) return; /* a plain VIEW's answer */
    qr_rbuf rb;
    qr_rbuf_init(&rb, meta, len);
    int joiner = (int)qr_rbuf_u32(&rb);
    int bit = (int)qr_rbuf_u32(&rb);
    if (!rb.bad && (bit == 1 || bit == 2)) copied(ps, joiner, bit);
}

/* ---- the replacement: HELLO and SNAPSHOT -------------------------------------- */

int qr__rerep_hello(ps_peer *p, const qr_msg_hello *m) {
    qr_ps *ps = p->ps;
    ps_replica *r = &ps->replica;
    int state = r->failed[ps->index];
    if (m->cause != (uint64_t)ps->index + 1 || m->task_index != (uint32_t)r->backup)
        return qr__fail(QR_EINVAL, "HELLO: a copy of shard %llu from ps %u, but this ps is "
                        "copied its own shard %d by ps %d only", (unsigned long long)m->cause - 1,
                        m->task_index, ps->index, r->backup);
    if (state != QR_PS_JOINING && state != QR_PS_BACKUP)
        return qr__fail(QR_EVIEW, "HELLO: a copy of this ps's own shard, but it serves that "
                        "shard itself in view %llu", (unsigned long long)r->view);
    p->copy_own = true;
    if (m->incarnation != r->own_incarnation) {
        r->own_incarnation = m->incarnation;
        r->own_applied_fwd = 0;
    }
    return QR_OK;
}

int qr__rerep_snapshot_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    (void)meta;
    if (p->role != QR_ROLE_REPLICA)
        return qr__fail(QR_EINVAL, "SNAPSHOT comes only on a replica link");
    if (f->meta_len < 32 || f->payload_len == 0)
        return qr__fail(QR_EPROTO, "SNAPSHOT: the meta (%u bytes) or the shard is missing",
                        f->meta_len);
    int rc = qr__peer_take_recv(p, (size_t)f->payload_len);
    if (rc) return qr__fail(rc, "out of memory receiving a snapshot of %llu bytes",
                            (unsigned long long)f->payload_len);
    qr_iov iov = {p->recv, (size_t)f->payload_len};
    return qr_conn_expect(p->conn, &iov, 1);
}

/* The shard's bytes into store (emptied first). */
static int load(qr_ps *ps, qr_store *store, int shard, const void *bytes, size_t len,
                int64_t counters[2]) {
    qr_store_free(store);
    qr_store_init(store);
    ckpt_shard_ctx sc = shard_ctx(ps, store, shard, 0);
    char name[64];
    snprintf(name, sizeof name, "the snapshot of shard %d", shard);
    return qr__ckpt_shard_restore_memory(&sc, bytes, len, name, counters);
}

void qr__rerep_snapshot_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    ps_replica *r = &ps->replica;
    qr_rbuf rb;
    qr_rbuf_init(&rb, meta, f->meta_len);
    uint64_t fwd = qr_rbuf_u64(&rb);
    int shard = (int)qr_rbuf_u32(&rb);
    int64_t steps = qr_rbuf_i64(&rb);
    uint64_t pushes = qr_rbuf_u64(&rb);
    uint32_t nw = qr_rbuf_u32(&rb);
    int want = p->copy_own ? ps->index : r->primary;
    size_t rec = (size_t)QR_MAX(ps->cluster->nworkers, 1) * sizeof(repl_last);
    if (rb.bad || shard != want || nw != (uint32_t)QR_MAX(ps->cluster->nworkers, 1) ||
        rb.left != rec) {
        char msg[300];
        snprintf(msg, sizeof msg, "%s: SNAPSHOT: of shard %d for %u workers, but this link copies "
                 "shard %d of a cluster of %d workers", ps->name, shard, nw, want,
                 ps->cluster->nworkers);
        qr__peer_reply_error(p, f, QR_EINVAL, msg);
        return;
    }
    qr_store *store = qr__peer_store(p);
    int64_t counters[2];
    uint64_t t0 = qr__now_ns();
    int rc = load(ps, store, shard, p->recv, (size_t)f->payload_len, counters);
    if (rc) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s: SNAPSHOT of shard %d: %s", ps->name, shard,
                 qr_last_error());
        qr__peer_reply_error(p, f, rc, msg);
        return;
    }
    memcpy(p->copy_own ? r->last : r->backup_last, rb.p, rec);
    if (p->copy_own) {
        ps->applied_steps = steps;
        r->own_pushes = pushes;
        r->own_applied_fwd = fwd;
        if (counters[0] > ps->global_step) ps->global_step = counters[0];
    } else {
        r->copy_steps = steps;
        r->copy_pushes = pushes;
        r->applied_fwd = fwd;
    }
    double load_ms = (double)(qr__now_ns() - t0) / 1e6;
    char digest[64];
    qr__log(QR_LOG_INFO, "loaded the snapshot of shard %d (%u variables, %.1f MB in %.0f ms, "
            "%s, %llu pushes, step %lld) from ps %d", shard, store->count,
            (double)f->payload_len / 1e6, load_ms,
            digest_note(store, (size_t)f->payload_len, digest, sizeof digest),
            (unsigned long long)pushes, (long long)steps, p->copy_own ? r->backup : r->primary);
    qr_wbuf out = {0};
    qr_wbuf_u64(&out, fwd);
    qr__peer_reply(p, f, QR_OK, &out, NULL, 0, NULL, NULL);
    qr_wbuf_free(&out);
}

/* ---- the VIEW that starts a copy: answered once it is made ------------------- */

bool qr__rerep_hold_view(ps_peer *p, const qr_frame *f) {
    qr_ps *ps = p->ps;
    ps_replica *r = &ps->replica;
    bool streaming = (r->link.streaming && r->failed[r->link.target] == QR_PS_JOINING) ||
                     (r->copy_link.streaming && r->failed[r->copy_link.target] == QR_PS_JOINING);
    if (ps->rerep.peer && !streaming) { /* the copy it waited for was given up */
        qr__peer_reply_error(ps->rerep.peer, &ps->rerep.req, QR_EPEERLOST,
                             "re-replication given up: the replacement failed");
        ps->rerep.peer = NULL;
    }
    if (!streaming || ps->rerep.peer) return false;
    ps->rerep.peer = p;
    ps->rerep.req = *f;
    return true;
}

void qr__rerep_peer_lost(ps_peer *p) {
    if (p->ps->rerep.peer == p) p->ps->rerep.peer = NULL;
}

void qr__rerep_resume(qr_ps *ps) {
    ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps) || !r->failed) return;
    /* Still wanted: the target is still a replacement being copied. */
    if (r->link.deferred) {
        r->link.deferred = false;
        if (r->failed[r->link.target] == QR_PS_JOINING) qr__rerep_start(&r->link);
    }
    if (r->copy_link.deferred) {
        r->copy_link.deferred = false;
        if (r->failed[r->copy_link.target] == QR_PS_JOINING) qr__rerep_start(&r->copy_link);
    }
}

void qr__rerep_abandon(repl_link *L) {
    L->deferred = false; /* (a snapshot sent goes with the link's forwards) */
}

void qr__rerep_close(qr_ps *ps) {
    qr__rerep_abandon(&ps->replica.link);
    qr__rerep_abandon(&ps->replica.copy_link);
}

void qr__rerep_stop(qr_ps *ps) {
    ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps) || ps->index != 0 || !r->failed) return;
    for (int k = 1; k < ps->cluster->nps; k++)
        if (r->failed[k] == QR_PS_JOINING || r->failed[k] == QR_PS_BACKUP)
            qr__links_stop_one(ps, k);
}

/* ---- a worker's HELLO before this ps knows whether it serves -------------------- */

bool qr__rerep_hold_hello(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps) || ps->sync.on || ps->index == 0 || r->ever_up || r->view ||
        ps->stopping || p->role || f->meta_len > sizeof p->held_meta)
        return false;
    qr_rbuf rb;
    qr_rbuf_init(&rb, meta, f->meta_len);
    qr_msg_hello m;
    qr_msg_get_hello(&rb, &m);
    if (rb.bad || m.role != QR_ROLE_WORKER || !m.with_view || m.shard != (uint32_t)ps->index)
        return false;
    p->hello_held = true;
    p->held_req = *f;
    memcpy(p->held_meta, meta, f->meta_len);
    return true;
}

void qr__rerep_release_hellos(qr_ps *ps) {
    for (ps_peer *p = ps->peers; p; p = p->next) {
        if (!p->hello_held) continue;
        p->hello_held = false;
        qr__control_message(p, &p->held_req, p->held_meta);
    }
}

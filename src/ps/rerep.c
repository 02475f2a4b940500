/*
 * rerep.c - re-replication (--ps-replicas 2): a replacement for a
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
 *   K receives the head, makes a store from it, and receives the tensors
 *   straight into that store's variables (one copy, the kernel's); once
 *   all is in and checked, the store replaces the one the link copies
 *   (its own shard: ps->store, its neighbour's: ps->replica.store), with
 *   the step counters, the duplicate records and the push count; then it
 *   applies the forwards in order. Once K has applied the snapshot and every
 *   forward made before that moment, the source waits for K again before
 *   it answers a push (as any primary waits for its backup), and says so
 *   to ps 0 (its answer to the VIEW that started it; ps 0 itself: here).
 *   With both shards copied, ps 0 marks K BACKUP in the next view: both
 *   shards are on two copies again.
 *
 * Sync mode: the snapshot holds the shard as its last step left it, with
 * that step's members; the pushes kept for the step in flight follow it
 * (qr__sync_forward_kept), then the pushes and steps as sync.c forwards
 * them. docs/REPLICATION.md, "Re-replication in sync mode".
 *
 * K stays a backup (QR_PS_BACKUP): shard K keeps its primary on ps K+1.
 * A later failure of K is the first one again (failover.c); one of K+1
 * makes K serve shard K from its copy (K ALIVE again, as at the start).
 */
#include "ps/ps_internal.h"

#include "ckpt/ckpt.h"
#include "ps/ckpt_shard.h"

#include <cjson/cJSON.h>

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

/* The steps the shard L copies has applied: the promoted copy's, or this
 * ps's own (in sync mode its accumulator step, the step in flight). */
static int64_t shard_steps(const repl_link *L) {
    const qr_ps *ps = L->ps;
    if (L->copy) return ps->replica.copy_steps;
    return ps->sync.on ? ps->sync.step : ps->applied_steps;
}

/* What the snapshot's meta carries besides the shard. */
static void put_snapshot_meta(qr_wbuf *b, const repl_link *L, uint64_t fwd) {
    const qr_ps *ps = L->ps;
    const ps_replica *r = &ps->replica;
    int nw = QR_MAX(ps->cluster->nworkers, 1);
    qr_wbuf_u64(b, fwd);
    qr_wbuf_u32(b, (uint32_t)L->shard);
    qr_wbuf_i64(b, shard_steps(L));
    qr_wbuf_u64(b, L->copy ? r->copy_pushes : r->own_pushes);
    qr_wbuf_u32(b, (uint32_t)nw);
    qr_wbuf_bytes(b, L->copy ? r->backup_last : r->last, (size_t)nw * sizeof(repl_last));
    /* Sync: the members of the shard's last step, so that a push of
     * theirs resent to the replacement, once it serves the shard, is
     * answered as applied (sync.c, resent) */
    if (!ps->sync.on) return;
    const ps_sync *sy = &ps->sync;
    int n = L->copy ? sy->ncopy_members : sy->nown_members;
    const quorum_member *m = L->copy ? sy->copy_members : sy->own_members;
    qr_wbuf_u32(b, (uint32_t)n);
    for (int i = 0; i < n; i++) qr_msg_put_member(b, m[i].worker, m[i].seq);
}

/* The members of the snapshot's last step (sync), after the records: into
 * the shard's record of them. */
static int take_members(qr_ps *ps, bool own, qr_rbuf *rb) {
    if (!rb->left) return QR_OK; /* async */
    uint32_t n = qr_rbuf_u32(rb);
    if (rb->bad || n > QR_PROTO_MAX_ITEMS || rb->left != (size_t)n * QR_MSG_MEMBER_LEN)
        return qr__fail(QR_EPROTO, "SNAPSHOT: the last step's members are malformed");
    quorum_member *members = qr__calloc((size_t)n + 1, sizeof *members);
    if (!members) return qr__fail(QR_ENOMEM, "out of memory recording a step's members");
    for (uint32_t i = 0; i < n; i++) qr_msg_get_member(rb, &members[i].worker, &members[i].seq);
    int rc = qr__sync_record_members(ps, !own, members, (int)n);
    free(members);
    return rc;
}

static ckpt_shard_ctx shard_ctx(qr_ps *ps, qr_store *store, int shard, int64_t steps) {
    return (ckpt_shard_ctx){.store = store, .optim = ps->optim, .cfg = ps->cfg,
                            .index = shard, .nps = ps->cluster->nps,
                            .nworkers = ps->cluster->nworkers, .sync = false,
                            .applied_steps = steps, .average_decay = ps->average_decay,
                            .incarnation = ps->incarnation,
                            .coordinator = qr__ps_coordinates(ps) ? ps->incarnation : ps->coordinator};
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

/* The digest reads every byte, one at a time (a second a GB). */
#define DIGEST_MAX_BYTES ((size_t)64 << 20)
const char *qr__store_digest_note(const qr_store *s, size_t bytes, char *buf, size_t len) {
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
    int64_t steps = shard_steps(L);
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
    qr__replica_lend(fw, iov, niov, snapshot_free, sn);
    L->streaming = true;
    L->mark = 0;
    /* Sync mode: the pushes kept for the step in flight are not in the
     * snapshot (it holds the shard as the last step left it); they follow
     * it, before any kept from now on and before the step's own forward,
     * so the replacement holds every push the step may name. */
    if (ps->sync.on) qr__sync_forward_kept(ps, L->copy);
    char digest[64];
    qr__log(QR_LOG_INFO, "re-replication of shard %d to ps %d: snapshot taken at forward %llu "
            "(%u variables, %.2f ms on the loop, %s); training goes on", L->shard, L->target,
            (unsigned long long)L->snapshot_fwd, store->count, snap_ms,
            qr__store_digest_note(store, bytes, digest, sizeof digest));
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
    if (qr__ps_coordinates(ps)) {
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
    if (!qr__replica_on(ps) || !qr__ps_coordinates(ps) || r->failed[k] != QR_PS_FAILED) return false;
    int next = (k + 1) % nps, prev = (k + nps - 1) % nps;
    /* ps next serves shard k (promoted) whether it serves its own shard
     * (ALIVE) or is itself a replacement that holds copies (BACKUP): both
     * copy it on. (Refused before: the replacement waited restart-wait-ms
     * for nothing, and shard k stayed on one copy.) */
    if ((r->failed[next] != QR_PS_ALIVE && r->failed[next] != QR_PS_BACKUP) ||
        r->failed[prev] == QR_PS_FAILED || r->failed[prev] == QR_PS_JOINING) {
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
    if (joiner < 0 || joiner >= nps || r->failed[joiner] != QR_PS_JOINING) return;
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

/* A SNAPSHOT being received: its length word, then its head, into
 * buffers of their own; then its tensors straight into the variables of
 * a store of its own, made from the head (dense variables: their values,
 * slots and averages; the rest, tables and counters, into a buffer of
 * the file's, read from there once all is in). The store is put in
 * service only when every byte is in and checked: a snapshot refused or
 * cut short leaves nothing half loaded. */
typedef struct rerep_recv {
    int shard;
    uint64_t payload_len;
    uint8_t first8[8];
    uint8_t *head;
    uint64_t head_len;       /* 0 until the length word is in */
    bool open;               /* file and vars hold the head, placed */
    qr_st_file file;
    cJSON *vars;
    qr_store store;
    char name[64];
} rerep_recv;

static void recv_free(ps_peer *p) {
    rerep_recv *rr = p->snapshot;
    if (!rr) return;
    if (rr->open) {
        cJSON_Delete(rr->vars);
        qr_st_close(&rr->file);
    }
    free(rr->head);
    qr_store_free(&rr->store);
    free(rr);
    p->snapshot = NULL;
}

/* The shard the SNAPSHOT's meta names, checked against what the link
 * copies. */
static int check_snapshot_meta(ps_peer *p, const qr_frame *f, const uint8_t *meta, int *shard) {
    qr_ps *ps = p->ps;
    qr_rbuf rb;
    qr_rbuf_init(&rb, meta, f->meta_len);
    (void)qr_rbuf_u64(&rb); /* the forward */
    *shard = (int)qr_rbuf_u32(&rb);
    (void)qr_rbuf_i64(&rb);
    (void)qr_rbuf_u64(&rb);
    uint32_t nw = qr_rbuf_u32(&rb);
    int want = p->copy_own ? ps->index : ps->replica.primary;
    size_t rec = (size_t)QR_MAX(ps->cluster->nworkers, 1) * sizeof(repl_last);
    /* (after the records, in sync mode: u32 n, the last step's n members) */
    size_t extra = rb.left >= rec ? rb.left - rec : 0;
    qr_rbuf tail;
    qr_rbuf_init(&tail, extra ? rb.p + rec : rb.p, extra);
    uint32_t nmembers = extra >= 4 ? qr_rbuf_u32(&tail) : 0;
    bool members_ok = extra == 0 || (ps->sync.on && extra >= 4 &&
                                     nmembers <= QR_PROTO_MAX_ITEMS &&
                                     extra == 4 + (size_t)nmembers * QR_MSG_MEMBER_LEN);
    if (rb.bad || *shard != want || nw != (uint32_t)QR_MAX(ps->cluster->nworkers, 1) ||
        rb.left < rec || !members_ok)
        return qr__fail(QR_EINVAL, "SNAPSHOT: of shard %d for %u workers, but this link copies "
                        "shard %d of a cluster of %d workers", *shard, nw, want,
                        ps->cluster->nworkers);
    return QR_OK;
}

int qr__rerep_snapshot_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    recv_free(p);
    if (p->role != QR_ROLE_REPLICA)
        return qr__fail(QR_EINVAL, "SNAPSHOT comes only on a replica link");
    if (f->meta_len < 32 || f->payload_len < 8)
        return qr__fail(QR_EPROTO, "SNAPSHOT: the meta (%u bytes) or the shard (%llu bytes) is "
                        "missing", f->meta_len, (unsigned long long)f->payload_len);
    int shard;
    int rc = check_snapshot_meta(p, f, meta, &shard);
    if (rc) return rc;
    rerep_recv *rr = qr__calloc(1, sizeof *rr);
    if (!rr) return qr__fail(QR_ENOMEM, "out of memory receiving a snapshot");
    rr->shard = shard;
    rr->payload_len = f->payload_len;
    qr_store_init(&rr->store);
    snprintf(rr->name, sizeof rr->name, "the snapshot of shard %d", shard);
    p->snapshot = rr;
    qr_iov iov = {rr->first8, sizeof rr->first8};
    return qr_conn_expect_rest(p->conn, &iov, 1); /* the rest: qr__rerep_snapshot_payload */
}

static int by_begin(const void *a, const void *b) {
    const qr_st_tensor *x = *(const qr_st_tensor *const *)a, *y = *(const qr_st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The head is in: parse it, make the store, and receive the tensors into it. */
static int place_tensors(ps_peer *p, rerep_recv *rr, uint64_t payload_len) {
    int rc = qr_st_open_head(&rr->file, rr->head, rr->head_len, payload_len, rr->name);
    if (rc) return rc;
    ckpt_shard_ctx sc = shard_ctx(p->ps, &rr->store, rr->shard, 0);
    rc = qr__ckpt_shard_place(&sc, &rr->file, &rr->vars); /* the file closed on an error */
    if (rc) return rc;
    rr->open = true;
    free(rr->head); /* parsed: the names live in the file's header */
    rr->head = NULL;
    /* The tensors tile the bytes after the head (checked at open): in
     * their order, their places take the rest of the payload exactly. */
    int n = rr->file.n;
    const qr_st_tensor **order = qr__calloc((size_t)QR_MAX(n, 1), sizeof *order);
    qr_iov *iov = qr__calloc((size_t)QR_MAX(n, 1), sizeof *iov);
    if (!order || !iov) rc = qr__fail(QR_ENOMEM, "out of memory placing %s", rr->name);
    int niov = 0;
    for (int i = 0; !rc && i < n; i++) order[i] = &rr->file.t[i];
    if (!rc) qsort(order, (size_t)n, sizeof *order, by_begin);
    for (int i = 0; !rc && i < n; i++) {
        size_t len = (size_t)(order[i]->end - order[i]->begin);
        if (len) iov[niov++] = (qr_iov){(void *)order[i]->data, len};
    }
    if (!rc) rc = qr_conn_expect_rest(p->conn, iov, niov);
    free(order);
    free(iov);
    return rc;
}

void qr__rerep_snapshot_payload(ps_peer *p, uint64_t got) {
    rerep_recv *rr = p->snapshot;
    uint64_t len = rr->payload_len;
    int rc = QR_OK;
    if (!rr->head_len && got == sizeof rr->first8) {
        rc = qr_st_head_length(rr->first8, len, &rr->head_len);
        if (rc) qr__error_prefix("'%s': ", rr->name);
        rr->head = rc ? NULL : malloc(rr->head_len);
        if (!rc && !rr->head) rc = qr__fail(QR_ENOMEM, "out of memory for the head of %s",
                                            rr->name);
        if (!rc) {
            memcpy(rr->head, rr->first8, sizeof rr->first8);
            qr_iov iov = {rr->head + 8, (size_t)rr->head_len - 8};
            rc = qr_conn_expect_rest(p->conn, &iov, rr->head_len > 8 ? 1 : 0);
            if (!rc && rr->head_len == 8) rc = place_tensors(p, rr, len);
        }
    } else if (rr->head_len && !rr->open && got == rr->head_len) {
        rc = place_tensors(p, rr, len);
    }
    if (rc) { /* refused once the payload has gone by (on_message) */
        qr__error_prefix("SNAPSHOT of shard %d: ", rr->shard);
        qr__peer_hold_error(p, rc);
        recv_free(p);
        qr_conn_expect_rest(p->conn, NULL, 0);
    }
}

void qr__rerep_snapshot_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    ps_replica *r = &ps->replica;
    rerep_recv *rr = p->snapshot;
    if (!rr || !rr->open) { /* a payload of 8 bytes or less */
        recv_free(p);
        qr__peer_reply_error(p, f, QR_EPROTO, "SNAPSHOT: the shard is cut short");
        return;
    }
    qr_rbuf rb;
    qr_rbuf_init(&rb, meta, f->meta_len);
    uint64_t fwd = qr_rbuf_u64(&rb);
    int shard = (int)qr_rbuf_u32(&rb);
    int64_t steps = qr_rbuf_i64(&rb);
    uint64_t pushes = qr_rbuf_u64(&rb);
    (void)qr_rbuf_u32(&rb); /* the workers, checked with the rest at the header */
    size_t rec = (size_t)QR_MAX(ps->cluster->nworkers, 1) * sizeof(repl_last);
    int64_t counters[2];
    uint64_t t0 = qr__now_ns();
    ckpt_shard_ctx sc = shard_ctx(ps, &rr->store, shard, 0);
    rr->open = false; /* finish frees the file and the records */
    int rc = qr__ckpt_shard_finish(&sc, &rr->file, rr->vars, counters);
    qr_rbuf members;
    qr_rbuf_init(&members, rb.p + rec, rb.left - rec); /* (the header checked rec's length) */
    if (!rc) rc = take_members(ps, p->copy_own, &members);
    if (rc) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s: SNAPSHOT of shard %d: %s", ps->name, shard,
                 qr_last_error());
        recv_free(p);
        qr__peer_reply_error(p, f, rc, msg);
        return;
    }
    /* Complete and checked: it replaces what the link's store held. */
    qr_store *store = qr__peer_store(p);
    qr_store_free(store);
    *store = rr->store;
    qr_store_init(&rr->store);
    recv_free(p);
    memcpy(p->copy_own ? r->last : r->backup_last, rb.p, rec);
    if (p->copy_own) {
        ps->applied_steps = steps;
        if (ps->sync.on) ps->sync.step = steps; /* the step in flight: its pushes follow */
        r->own_pushes = pushes;
        r->own_applied_fwd = fwd;
        if (counters[0] > ps->global_step) ps->global_step = counters[0];
    } else {
        r->copy_steps = steps;
        r->copy_pushes = pushes;
        r->applied_fwd = fwd;
    }
    /* Shard 0's copy: the coordinator's global step (failover.c, take_over). */
    if (shard == 0) r->coord_step = QR_MAX(r->coord_step, counters[0]);
    double load_ms = (double)(qr__now_ns() - t0) / 1e6;
    char digest[64];
    qr__log(QR_LOG_INFO, "loaded the snapshot of shard %d (%u variables, %.1f MB received into "
            "them, %.1f ms to finish, %s, %llu pushes, step %lld) from ps %d", shard,
            store->count, (double)f->payload_len / 1e6, load_ms,
            qr__store_digest_note(store, (size_t)f->payload_len, digest, sizeof digest),
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
    recv_free(p); /* a snapshot cut short: nothing of it was put in service */
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
    if (!qr__replica_on(ps) || !qr__ps_coordinates(ps) || !r->failed) return;
    QR_EACH_OTHER_PS(ps, k)
        if (r->failed[k] == QR_PS_JOINING || r->failed[k] == QR_PS_BACKUP)
            qr__links_stop_one(ps, k);
}

/* ---- a worker's HELLO before this ps knows whether it serves -------------------- */

bool qr__rerep_hold_hello(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps) || qr__ps_coordinates(ps) || r->ever_up || r->view ||
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

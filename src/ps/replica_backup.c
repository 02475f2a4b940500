/*
 * replica_backup.c - the backup's side of a shard's copy (--ps-replicas
 * 2): ps k holds the copy of ps (k-1) mod P's shard in a store of its own
 * (ps->replica.store), fed by that primary's replica link (replica.c,
 * whose forwards replica_forward.c makes): its HELLO, each REPLICATE
 * checked and applied; the copy promoted to serve the shard when the
 * view moves (failover.c); and the copies' statistics.
 *
 * Backup. A REPLICATE is checked as any request (the variables exist in
 * the backup's store, sizes and kinds, the learning rates, every value
 * finite, every row id of the primary's shard), then applied with the
 * kernels the primary used, in the same order (qr_optim_apply_dense,
 * qr__rows_apply, qr_table_lookup), so the copies are equal bit for bit.
 */
#include "ps/ps_internal.h"

#include "cluster/placement.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* ---- REPLICATE (backup) ------------------------------------------------------- */

int qr__replica_hello(ps_peer *p, const qr_msg_hello *m) {
    qr_ps *ps = p->ps;
    ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps))
        return qr__fail(QR_EINVAL, "HELLO: a replica link, but this ps keeps no copies "
                        "(ps-replicas 1): give every task the same --ps-replicas");
    if (m->cause) /* a promoted copy of this ps's own shard, to a replacement (rerep.c) */
        return qr__rerep_hello(p, m);
    if (m->task_index != (uint32_t)r->primary)
        return qr__fail(QR_EINVAL, "HELLO: a replica link from ps %u, but this ps backs up "
                        "ps %d's shard", m->task_index, r->primary);
    if (r->promoted)
        return qr__fail(QR_EVIEW, "old view: ps %d's shard is served by this ps since view "
                        "%llu (ps %d failed): its forwards are refused", r->primary,
                        (unsigned long long)r->view, r->primary);
    if (m->incarnation != r->primary_incarnation) {
        /* A new run of the primary numbers its forwards from 1 again. */
        r->primary_incarnation = m->incarnation;
        r->applied_fwd = 0;
    }
    return QR_OK;
}

/* One item's record against its variable in the backup's store. */
static int check_item(const qr_msg_repl_item *it, const qr_var *v, int64_t *nrows) {
    *nrows = -1;
    if (!(it->lr >= 0 && it->lr < 1e30f))
        return qr__fail(QR_EINVAL, "REPLICATE: variable '%s': learning rate %g is not a "
                        "finite number >= 0", v->name, (double)it->lr);
    int64_t dim = v->shape[v->ndim - 1];
    switch (it->kind) {
    case QR_REPL_DENSE:
        if (v->table)
            return qr__fail(QR_EINVAL, "REPLICATE: '%s' is a table: dense item", v->name);
        if (it->nbytes != (uint64_t)v->n * 4)
            return qr__fail(QR_ESHAPE, "REPLICATE: variable '%s' has %lld floats but the item "
                            "has %llu bytes", v->name, (long long)v->n,
                            (unsigned long long)it->nbytes);
        return QR_OK;
    case QR_REPL_SPARSE:
        if (it->nbytes % (8 + 4 * (uint64_t)dim))
            return qr__fail(QR_ESHAPE, "REPLICATE: sparse rows of '%s': %llu bytes is not a "
                            "whole number of (index, row of %lld floats) pairs", v->name,
                            (unsigned long long)it->nbytes, (long long)dim);
        *nrows = (int64_t)(it->nbytes / (8 + 4 * (uint64_t)dim));
        return QR_OK;
    case QR_REPL_LOOKUP:
        if (!v->table || it->nbytes % 8)
            return qr__fail(QR_EINVAL, "REPLICATE: sightings of '%s': %s", v->name,
                            v->table ? "not a whole number of ids" : "not a table");
        *nrows = (int64_t)(it->nbytes / 8);
        return QR_OK;
    default:
        return qr__fail(QR_EINVAL, "REPLICATE: variable '%s': item kind %u (0 dense, 1 sparse "
                        "rows, 2 sightings)", v->name, it->kind);
    }
}

/* A sync step's REPLICATE: one item, the members (u32 worker, u32 seq
 * each), received whole. */
static int members_header(ps_peer *p, const qr_frame *f, qr_rbuf *r) {
    qr_msg_repl_item it;
    qr_msg_get_repl_item(r, &it);
    if (r->bad) return qr__fail(QR_EPROTO, "REPLICATE meta is truncated");
    if (p->repl.count != 1 || it.kind != QR_REPL_MEMBERS || it.id != 0 ||
        it.nbytes != f->payload_len || !it.nbytes || it.nbytes % QR_MSG_MEMBER_LEN ||
        it.nbytes / QR_MSG_MEMBER_LEN > QR_PROTO_MAX_ITEMS)
        return qr__fail(QR_EINVAL, "REPLICATE: a sync step carries one item of kind 3 (its "
                        "members, 1 to %d of %d bytes each) and nothing else",
                        QR_PROTO_MAX_ITEMS, QR_MSG_MEMBER_LEN);
    p->nitems = 0;
    int rc = qr__peer_check_end("REPLICATE", r, it.nbytes, f->payload_len);
    if (!rc) rc = qr__peer_take_recv(p, (size_t)f->payload_len);
    if (rc) return rc;
    qr_iov iov = {p->recv, (size_t)f->payload_len};
    return qr_conn_expect(p->conn, &iov, 1);
}

int qr__replica_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    if (p->role != QR_ROLE_REPLICA)
        return qr__fail(QR_EINVAL, "REPLICATE comes only on a primary's replica link");
    if (p->ps->replica.promoted && !p->copy_own)
        return qr__fail(QR_EVIEW, "old view: ps %d's shard is served by this ps since view "
                        "%llu: its forwards are refused", p->ps->replica.primary,
                        (unsigned long long)p->ps->replica.view);
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_msg_get_repl_head(&r, &p->repl);
    if (r.bad) return qr__fail(QR_EPROTO, "REPLICATE meta is truncated");
    uint32_t flags = p->repl.flags;
    if (flags & ~(QR_PUSH_STEP | QR_PUSH_DELTA | QR_REPL_SYNC_PUSH | QR_REPL_SYNC_STEP |
                  QR_REPL_LEAVE) ||
        ((flags & QR_REPL_SYNC_PUSH) && (flags & ~QR_REPL_SYNC_PUSH)) ||
        ((flags & QR_REPL_SYNC_STEP) && (flags & ~QR_REPL_SYNC_STEP)) ||
        ((flags & QR_REPL_LEAVE) && (flags & ~QR_REPL_LEAVE)))
        return qr__fail(QR_EINVAL, "REPLICATE: unknown flags 0x%x", flags);
    if ((flags & QR_REPL_LEAVE) &&
        (p->repl.count || !qr__is_worker(p->repl.worker, p->ps->cluster->nworkers)))
        return qr__fail(QR_EINVAL, "REPLICATE: a worker's LEAVE names worker %u of %d, with %u "
                        "items", p->repl.worker, p->ps->cluster->nworkers, p->repl.count);
    if (flags & QR_REPL_SYNC_STEP) return members_header(p, f, &r);
    int rc = p->repl.count ? qr__peer_check_count("REPLICATE", p->repl.count) : QR_OK;
    if (!rc) rc = qr__peer_reserve_items(p, p->repl.count);
    if (rc) return rc;
    p->ps->mark++;
    uint64_t offset = 0;
    for (uint32_t i = 0; i < p->repl.count; i++) {
        qr_msg_repl_item it;
        qr_msg_get_repl_item(&r, &it);
        if (r.bad) return qr__fail(QR_EPROTO, "REPLICATE meta is truncated at item %u", i);
        qr_var *v = NULL;
        int64_t nrows;
        if ((rc = qr__peer_lookup(p, "REPLICATE", it.id, &v))) return rc;
        /* A sync push's learning rate may be none (the ps's schedule,
         * resolved where the step is applied). */
        float lr = it.lr;
        if ((flags & QR_REPL_SYNC_PUSH) && it.lr == QR_MSG_PUSH_LR_NONE) it.lr = 0;
        if ((rc = check_item(&it, v, &nrows))) return rc;
        it.lr = lr;
        if ((flags & QR_REPL_SYNC_PUSH) && it.kind == QR_REPL_LOOKUP)
            return qr__fail(QR_EINVAL, "REPLICATE: a sync push of sightings");
        p->items[i] = (push_item){.var = v, .offset = offset, .nrows = nrows, .lr = it.lr,
                                  .dtype = (uint8_t)it.kind};
        offset += it.nbytes;
    }
    p->nitems = (int)p->repl.count;
    rc = qr__peer_check_end("REPLICATE", &r, offset, f->payload_len);
    if (!rc) rc = qr__peer_take_recv(p, (size_t)f->payload_len);
    if (rc) return rc;
    for (int i = 0; i < p->nitems; i++) p->items[i].data = (uint8_t *)p->recv + p->items[i].offset;
    qr_iov iov = {p->recv, (size_t)f->payload_len};
    return qr_conn_expect(p->conn, &iov, f->payload_len ? 1 : 0);
}

/* The shard a replica link copies: the primary's, or (a replacement's
 * link from the ps serving it) this ps's own. */
static int copied_shard(const ps_peer *p) {
    return p->copy_own ? p->ps->index : p->ps->replica.primary;
}

/* Everything forwarded is usable, before anything changes. */
static int check_values(ps_peer *p, char *msg, size_t len) {
    qr_ps *ps = p->ps;
    for (int i = 0; i < p->nitems; i++) {
        push_item *it = &p->items[i];
        qr_var *v = it->var;
        if (it->dtype == QR_REPL_LOOKUP) {
            for (int64_t k = 0; k < it->nrows; k++) {
                int64_t id;
                memcpy(&id, it->data + 8 * k, 8);
                if (qr_place_row(id, ps->cluster->nps) != copied_shard(p)) {
                    snprintf(msg, len, "%s: REPLICATE: id %lld of table '%s' is not of ps %d's "
                             "shard; nothing was applied", ps->name, (long long)id, v->name,
                             copied_shard(p));
                    return QR_EINVAL;
                }
            }
            continue;
        }
        if (it->nrows >= 0) {
            int rc = qr__rows_check(ps, copied_shard(p), it, msg, len);
            if (rc) return rc;
        }
        const float *vals = (const float *)(it->data + (it->nrows >= 0 ? 8 * it->nrows : 0));
        int64_t n = it->nrows >= 0 ? it->nrows * v->shape[v->ndim - 1] : v->n;
        if (!qr_optim_all_finite(vals, n)) {
            snprintf(msg, len, "%s: REPLICATE: the values for '%s' contain NaN or Inf; nothing "
                     "was applied", ps->name, v->name);
            return QR_ENONFINITE;
        }
    }
    return QR_OK;
}

/* A LOOKUP's sightings, replayed: rows made and admission counted as on
 * the primary. */
static int sight(qr_ps *ps, qr_var *v, const push_item *it, int64_t clock) {
    qr_table *t = v->table;
    t->clock = clock;
    size_t cap = 0;
    float *out = qr__recv_pool_get(&ps->recv_pool,
                                   QR_MAX((size_t)it->nrows * (size_t)t->dim * 4, 4), &cap);
    if (!out) return QR_ENOMEM;
    uint64_t added = 0;
    int rc = qr_table_lookup(t, it->nrows, (const int64_t *)it->data, false, out, &added);
    qr__recv_pool_put(&ps->recv_pool, out, cap);
    if (!rc) qr_table_evict_idle(t);
    return rc ? qr__fail(rc, "out of memory sighting rows of '%s'", v->name) : QR_OK;
}

/* One item applied as the primary applied it. */
static int apply_item(qr_ps *ps, push_item *it, bool delta, int64_t t) {
    qr_var *v = it->var;
    if (it->dtype == QR_REPL_LOOKUP) return sight(ps, v, it, t);
    if (it->nrows >= 0) {
        /* The ps's own row counters count what it serves, not its copies. */
        uint64_t added = ps->metrics.rows_added, pushed = ps->metrics.rows_pushed;
        int rc = qr__rows_apply_push(ps, v, it->data, (const float *)(it->data + 8 * it->nrows),
                                     it->nrows, delta, t, it->lr);
        ps->metrics.rows_added = added;
        ps->metrics.rows_pushed = pushed;
        if (!rc) v->version++;
        return rc;
    }
    if (qr_var_prepare_write(v)) return QR_ENOMEM;
    const float *g = (const float *)it->data;
    float *val = v->value->data;
    int rc = QR_OK;
    if (delta) qr_optim_add_delta(val, val, g, v->n);
    else if (v->non_trainable) memcpy(val, g, (size_t)v->n * sizeof *val);
    else rc = qr_optim_apply_dense(qr__var_optim(ps, v), v->slots, val, g, v->n, it->lr, t);
    if (!rc) v->version++;
    return rc;
}

/* Sync mode (sync.c): a push the primary kept, kept on the copy; a step
 * it applied (its members), applied to the copy from those pushes, which
 * must be at that step. `out` holds the reply's fwd and is freed here. */
static void sync_message(ps_peer *p, const qr_frame *f, qr_wbuf *out) {
    qr_ps *ps = p->ps;
    ps_replica *r = &ps->replica;
    const qr_msg_repl_head *h = &p->repl;
    char msg[512];
    int rc;
    bool applied_part = false;
    if (!ps->sync.on) {
        rc = qr__fail(QR_EINVAL, "a sync %s, but this ps trains in async mode: give every task "
                      "the same --mode", h->flags & QR_REPL_SYNC_PUSH ? "push" : "step");
    } else if (h->flags & QR_REPL_SYNC_PUSH) {
        rc = qr__sync_copy_keep(ps, p->copy_own, h, p->items, p->nitems, p->recv,
                                (size_t)f->payload_len);
    } else {
        int n = (int)(f->payload_len / QR_MSG_MEMBER_LEN);
        quorum_member *members = qr__calloc((size_t)n, sizeof *members);
        qr_rbuf rb;
        qr_rbuf_init(&rb, p->recv, (size_t)f->payload_len);
        for (int i = 0; members && i < n; i++)
            qr_msg_get_member(&rb, &members[i].worker, &members[i].seq);
        if (!members) rc = qr__fail(QR_ENOMEM, "out of memory applying a step to the copy");
        else if (h->t != (p->copy_own ? ps->sync.step : r->copy_steps))
            rc = qr__fail(QR_EINVAL, "sync step %lld of ps %d's shard, but this copy is at step "
                          "%lld", (long long)h->t, p->copy_own ? ps->index : r->primary,
                          (long long)(p->copy_own ? ps->sync.step : r->copy_steps));
        /* (A replacement's own shard, forwarded by the ps serving it.) */
        else if ((rc = p->copy_own ? qr__sync_apply_step(ps, h->t, members, n)
                                   : qr__sync_apply_copy(ps, h->t, members, n)))
            applied_part = true;
        free(members);
    }
    if (rc) {
        /* A step part applied leaves this copy different from the primary. */
        snprintf(msg, sizeof msg, "%s: REPLICATE: %s%s%d%s", ps->name, qr_last_error(),
                 applied_part ? "; this copy of ps " : "; nothing was applied to the copy of ps ",
                 r->primary, applied_part ? "'s shard differs from it now" : "'s shard");
        qr__peer_reply_error(p, f, rc, msg);
        qr_wbuf_free(out);
        return;
    }
    *(p->copy_own ? &r->own_applied_fwd : &r->applied_fwd) = h->fwd;
    r->applied++;
    qr__peer_reply(p, f, QR_OK, out, NULL, 0, NULL, NULL);
    qr_wbuf_free(out);
}

void qr__replica_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    (void)meta;
    qr_ps *ps = p->ps;
    ps_replica *r = &ps->replica;
    const qr_msg_repl_head *h = &p->repl;
    qr_wbuf out = {0};
    qr_wbuf_u64(&out, h->fwd);
    uint64_t *applied_fwd = p->copy_own ? &r->own_applied_fwd : &r->applied_fwd;
    if (h->fwd && h->fwd <= *applied_fwd) { /* sent again after the link came back */
        qr__peer_reply(p, f, QR_OK, &out, NULL, 0, NULL, NULL);
        qr_wbuf_free(&out);
        return;
    }
    if (h->flags & QR_REPL_LEAVE) { /* (the worker checked at the header) */
        (p->copy_own ? r->last : r->backup_last)[h->worker].finished = 1;
        *applied_fwd = h->fwd;
        r->applied++;
        qr__peer_reply(p, f, QR_OK, &out, NULL, 0, NULL, NULL);
        qr_wbuf_free(&out);
        return;
    }
    char msg[512];
    int rc = h->flags & QR_REPL_SYNC_STEP ? QR_OK : check_values(p, msg, sizeof msg);
    if (rc) {
        qr__peer_reply_error(p, f, rc, msg);
        qr_wbuf_free(&out);
        return;
    }
    if (h->flags & (QR_REPL_SYNC_PUSH | QR_REPL_SYNC_STEP)) {
        sync_message(p, f, &out);
        return;
    }
    bool delta = h->flags & QR_PUSH_DELTA;
    for (int i = 0; i < p->nitems && !rc; i++)
        rc = apply_item(ps, &p->items[i], delta, h->t);
    for (int i = 0; i < p->nitems && !rc && (h->flags & QR_PUSH_STEP) && ps->average_decay > 0;
         i++) {
        qr_var *v = p->items[i].var;
        if (!v->table && !v->non_trainable && qr_var_update_average(v, ps->average_decay, h->t))
            rc = qr__fail(QR_ENOMEM, "out of memory updating an average");
    }
    if (rc) {
        /* Part of it may be applied: this copy is no longer the primary's. */
        snprintf(msg, sizeof msg, "%s: REPLICATE: %s; this copy of shard %d differs from "
                 "its primary now", ps->name, qr_last_error(), copied_shard(p));
        qr__peer_reply_error(p, f, rc, msg);
        qr_wbuf_free(&out);
        return;
    }
    *applied_fwd = h->fwd;
    r->applied++;
    bool sightings = h->count && p->items[0].dtype == QR_REPL_LOOKUP;
    if (!sightings) { /* a push: what a promotion goes on from */
        qr__replica_record_last(p->copy_own ? r->last : r->backup_last, ps->cluster->nworkers,
                                h->worker, h->seq, h->answer, h->data_pos);
        qr__ckpt_forwarded(ps, p->copy_own, h->worker, h->seq);
        int64_t steps = (h->flags & QR_PUSH_STEP) ? h->t : h->t - 1;
        if (p->copy_own) {
            ps->applied_steps = steps;
            r->own_pushes++;
        } else {
            r->copy_steps = steps;
            r->copy_pushes++;
        }
        /* A copy of shard 0, the coordinator's: its global step, which a
         * successor goes on from (ps 1's copy; ps 0's replacement's own). */
        if ((h->flags & QR_PUSH_STEP) && copied_shard(p) == 0)
            r->coord_step = QR_MAX(r->coord_step, h->answer);
    }
    qr__peer_reply(p, f, QR_OK, &out, NULL, 0, NULL, NULL);
    qr_wbuf_free(&out);
}

/* ---- the view moved (failover.c) ------------------------------------------------ */

void qr__replica_promote(qr_ps *ps) {
    ps_replica *r = &ps->replica;
    if (r->promoted) return;
    r->promoted = true;
    /* The old primary's forwards stop here: a stopped one that comes back
     * finds its replica link refused (QR_EVIEW) and is fenced. */
    for (ps_peer *p = ps->peers; p; p = p->next)
        if (p->role == QR_ROLE_REPLICA) qr_conn_close(p->conn);
    char note[64]; /* its digest, unless large: the workers wait for this ps */
    qr__log(QR_LOG_WARN, "view %llu: this ps serves ps %d's shard now, from its copy (%u "
            "variables, %s, %llu pushes applied, step %lld); on one copy until "
            "its failed primary's replacement is copied it (re-replication)", (unsigned long long)r->view, r->primary,
            r->store.count, qr__store_digest_note(&r->store, (size_t)r->store.bytes, note, sizeof note),
            (unsigned long long)r->copy_pushes, (long long)r->copy_steps);
    if (r->lag)
        qr__log(QR_LOG_WARN, "replication-lag %llu: ps %d may have acknowledged up to %llu "
                "pushes this copy never received (lost; their workers do not send them again)",
                (unsigned long long)r->lag, r->primary, (unsigned long long)r->lag);
}

/* ---- statistics ------------------------------------------------------------------ */

static void add_shard(cJSON *shards, int index, const char *role, const qr_store *s,
                      uint64_t pushes) {
    char digest[20];
    snprintf(digest, sizeof digest, "%016llx", (unsigned long long)qr__store_digest(s));
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "shard", index);
    cJSON_AddStringToObject(o, "role", role);
    cJSON_AddStringToObject(o, "params_digest", digest);
    cJSON_AddNumberToObject(o, "variables", s->count);
    cJSON_AddNumberToObject(o, "pushes_applied", (double)pushes);
    cJSON_AddItemToArray(shards, o);
}

void qr__replica_stats_json(qr_ps *ps, cJSON *j) {
    ps_replica *r = &ps->replica;
    cJSON_AddNumberToObject(j, "ps_replicas", r->copies);
    cJSON_AddNumberToObject(j, "duplicate_pushes", (double)r->duplicate_pushes);
    if (!qr__replica_on(ps)) return;
    cJSON_AddNumberToObject(j, "forwards", (double)(r->link.forwards + r->copy_link.forwards));
    cJSON_AddNumberToObject(j, "forwards_applied_here", (double)r->applied);
    cJSON_AddNumberToObject(j, "replication_lag", (double)r->lag);
    /* pushes answered before the backup had applied them, and the most
     * forwards it was behind one then (replication-lag) */
    cJSON_AddNumberToObject(j, "answered_ahead", (double)r->answered_ahead);
    cJSON_AddNumberToObject(j, "lag_seen", (double)r->lag_seen);
    cJSON *shards = cJSON_AddArrayToObject(j, "shards");
    int own = r->failed ? r->failed[ps->index] : QR_PS_ALIVE;
    add_shard(shards, ps->index, own == QR_PS_ALIVE ? "primary" : "backup", &ps->store,
              r->own_pushes);
    add_shard(shards, r->primary, r->promoted ? "promoted" : "backup", &r->store,
              r->copy_pushes);
    cJSON_AddNumberToObject(j, "view", (double)r->view);
    cJSON *failed = cJSON_AddArrayToObject(j, "failed_ps");
    for (int k = 0; k < ps->cluster->nps; k++)
        if (r->failed[k]) cJSON_AddItemToArray(failed, cJSON_CreateNumber(k));
    cJSON_AddBoolToObject(j, "backup_failed", r->link.gone);
}

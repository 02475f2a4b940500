/*
 * sync.c - synchronous replicas, the part every ps task plays.
 *
 * A synchronous push (QR_PUSH_SYNC) carries one worker's gradients for
 * one step, tagged (worker, seq, local_step). The ps does not apply it: it
 * keeps it, received in place into a buffer of its own, until ps 0 has
 * decided the step's quorum and sends APPLY(step, members). Then the ps
 * reduces, variable by variable, the members' gradients in member order
 * (sorted by worker, then seq) and applies the optimizer once, the two in
 * one pass over the gradients (reduce_dense), advances its
 * accumulator step, and drops every other push of that step or older:
 * those are the stale ones.
 *
 * Because ps 0 names the members, the same pushes make the step on every
 * ps and for every variable (TensorFlow takes them per variable), and
 * because the order is fixed, the result does not depend on arrival order.
 *
 * A push may carry a learning rate per variable (QR_PUSH_LR, the worker's
 * schedule: qr_worker_set_lr), held with it. A variable's step is applied
 * with the one carried by its first gradient in member order (the first
 * member, by worker then seq, that pushed it), so it is the same whatever
 * the arrival order; workers that run the same scheduler agree anyway.
 *
 * A held push (QR_PUSH_SYNC | QR_PUSH_REPLY_VALUES: a sync push-and-pull
 * in one round trip) is kept the same way; on ps k its answer is held too
 * (held_pull), ps 0 is told (HELD), and the answer goes out with the
 * values once the push's step is applied here (or at ps 0's RELEASE).
 * ps 0's own part goes to coord.c, which answers it with the token.
 *
 * Two copies (--ps-replicas 2, docs/REPLICATION.md): ps k forwards each
 * push it keeps to its backup, which keeps it on its copy of the shard,
 * and, per step, the members; the backup reduces and applies the same
 * pushes in the same order (apply_shard on the copy). ps k says HELD (or
 * answers a non-held push) once the backup has the push, and answers APPLY
 * (and its held pushes) once the backup has the step. After a failover the
 * promoted copy is a second shard of this ps, with its own pushes, held
 * answers and step (sync_push.copy, held_pull.copy, replica.copy_steps).
 *
 * A push sent again after a lost connection (ps 0 closed a worker it
 * declared hung, or a failover) that the shard keeps for its step
 * already, or that was a member of the step last applied to it, is
 * answered as the original and not kept twice (qr__sync_take_resent).
 *
 * A non-trainable variable (trainable=false, a module's buffer) takes no
 * gradient: the members that pushed it pushed values, and their mean (over
 * those members only; one member's: its value) is assigned.
 */
#include "ps/ps_internal.h"

#include <stdlib.h>
#include <string.h>

int qr__sync_init(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    s->on = !strcmp(qr__config_str(ps->cfg, "mode"), "sync");
    if (!s->on) return QR_OK;
    s->N = ps->cluster->nworkers;
    int rc = qr_sync_check_config(ps->cfg, s->N, &s->R, &s->init_tokens);
    if (rc) return rc;
    s->mean = !strcmp(qr__config_str(ps->cfg, "reduction"), "mean");
    s->sparse_per_row = !strcmp(qr__config_str(ps->cfg, "sparse-reduction"), "per_row");
    s->timeout_ms = qr__config_int(ps->cfg, "sync-timeout-ms");
    s->report_ms = qr__config_int(ps->cfg, "stall-report-ms");
    s->restart_wait_ms = qr__config_int(ps->cfg, "restart-wait-ms");
    return QR_OK;
}

void qr__sync_push_free(qr_ps *ps, sync_push *sp) {
    if (!sp) return;
    free(sp->items);
    qr__recv_pool_put(&ps->recv_pool, sp->data, sp->data_cap);
    qr__recv_pool_put(&ps->recv_pool, sp->wide, sp->wide_cap);
    free(sp);
}

void qr__sync_free(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    while (s->pending) {
        sync_push *next = s->pending->next;
        qr__sync_push_free(ps, s->pending);
        s->pending = next;
    }
    while (s->waiters) {
        token_waiter *next = s->waiters->next;
        free(s->waiters->held);
        free(s->waiters);
        s->waiters = next;
    }
    while (s->held) {
        held_pull *next = s->held->next;
        free(s->held);
        s->held = next;
    }
    free(s->sources);
    free(s->quorum);
    free(s->tokens);
    free(s->links);
    free(s->in_quorum);
    free(s->own_members);
    free(s->copy_members);
    free(s->shard_applied);
    free(s->stale_by_worker);
    if (s->stats_file) fclose(s->stats_file);
    qr_wbuf_free(&s->view_meta); /* (failover.c's: freed here, as the memset below forgets it) */
    memset(s, 0, sizeof *s);
}

int qr__sync_push_header(ps_peer *p, const qr_frame *f, uint32_t worker, uint32_t seq,
                         int64_t local_step) {
    if (!qr__is_worker(worker, p->ps->sync.N))
        return qr__fail(QR_EINVAL, "PUSH: worker %u is not in the cluster (%d workers)", worker,
                        p->ps->sync.N);
    sync_push *sp = qr__calloc(1, sizeof *sp);
    if (!sp) return QR_ENOMEM;
    sp->worker = worker;
    sp->seq = seq;
    sp->local_step = local_step;
    sp->data_pos = p->push_data_pos;
    sp->nitems = p->nitems;
    sp->items = qr__calloc((size_t)QR_MAX(p->nitems, 1), sizeof *sp->items);
    sp->data = qr__recv_pool_get(&p->ps->recv_pool, f->payload_len, &sp->data_cap);
    if (!sp->items || !sp->data) {
        qr__sync_push_free(p->ps, sp);
        return QR_ENOMEM;
    }
    if (p->nitems > 0) /* a push with nothing for this ps (the commit alone) has no items */
        memcpy(sp->items, p->items, (size_t)p->nitems * sizeof *sp->items);
    p->incoming = sp;
    qr_iov iov = {sp->data, f->payload_len};
    int rc = qr_conn_expect(p->conn, &iov, 1);
    for (int i = 0; !rc && i < sp->nitems; i++)
        sp->items[i].data = (uint8_t *)sp->data + sp->items[i].offset;
    if (!rc) qr__grad_check_start(&p->check, sp->items, sp->nitems);
    return rc;
}

/* A push kept for the shard this ps serves as its own (copy false) or for
 * its copy of ps `primary`'s (ps-replicas 2): one worker's push of a step
 * goes to both when the copy is promoted, as two pushes. */
static sync_push *find_pending(ps_sync *s, uint32_t worker, uint32_t seq, bool copy) {
    for (sync_push *sp = s->pending; sp; sp = sp->next)
        if (sp->worker == worker && sp->seq == seq && sp->copy == copy) return sp;
    return NULL;
}

/* The sync step of the shard: this ps's own, or its copy's. */
static int64_t *shard_step(qr_ps *ps, bool copy) {
    return copy ? &ps->replica.copy_steps : &ps->sync.step;
}

/* The link that carries a shard's pushes and steps to its other copy (ps-
 * replicas 2): this ps's own shard's, to its backup, while this ps serves
 * it (a replacement, JOINING or BACKUP, only holds it: its primary
 * forwards); a promoted copy's, to the failed primary's replacement
 * (copy_link: gone until one joins, rerep.c). NULL: nothing forwarded. */
static repl_link *forward_link(qr_ps *ps, bool copy) {
    ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps)) return NULL;
    if (copy) return r->promoted ? &r->copy_link : NULL;
    return r->failed && r->failed[ps->index] != QR_PS_ALIVE ? NULL : &r->link;
}

static void forward_push(qr_ps *ps, const sync_push *sp);
static void push_copied(ps_peer *p, const qr_frame *req, void *ctx, int status,
                        const char *msg);

int qr__sync_push_keep(ps_peer *p, const qr_frame *f, char *msg, size_t len) {
    qr_ps *ps = p->ps;
    ps_sync *s = &ps->sync;
    sync_push *sp = p->incoming;
    p->incoming = NULL;
    qr__grad_check_finish(&p->check, f->payload_len); /* it ran as the payload arrived */
    if (qr__grad_widen(ps, sp->items, sp->nitems, &sp->wide, &sp->wide_cap)) {
        qr__sync_push_free(ps, sp);
        snprintf(msg, len, "out of memory widening a bf16/fp16 gradient");
        return QR_ENOMEM;
    }
    sp->copy = p->promoted_shard;
    int64_t now = *shard_step(ps, sp->copy);
    if (sp->local_step < now) {
        s->stale_pushes++;
        snprintf(msg, len, "dropped: stale: a gradient of step %lld from worker %u, but "
                 "%s is at step %lld", (long long)sp->local_step, sp->worker, ps->name,
                 (long long)now);
        qr__sync_push_free(ps, sp);
        return QR_ESTALE;
    }
    if (sp->local_step > now || find_pending(s, sp->worker, sp->seq, sp->copy)) {
        snprintf(msg, len, "%s: PUSH: worker %u's push %u for step %lld: %s", ps->name,
                 sp->worker, sp->seq, (long long)sp->local_step,
                 sp->local_step > now ? "that step has not started" : "pushed twice");
        qr__sync_push_free(ps, sp);
        return QR_EINVAL;
    }
    for (int i = 0; i < sp->nitems; i++) {
        push_item *it = &sp->items[i];
        if (it->nrows >= 0 && qr__rows_check(ps, ps->index, it, msg, len)) {
            qr__sync_push_free(ps, sp);
            return QR_EINVAL;
        }
        if (!it->nonfinite) continue;
        if (!ps->skip_nonfinite) {
            snprintf(msg, len, "%s: PUSH: the gradient of variable '%s' contains NaN or "
                     "Inf; the push was refused", ps->name, it->var->name);
            qr__sync_push_free(ps, sp);
            return QR_ENONFINITE;
        }
        it->skip = true; /* counts as a zero gradient in the mean */
        it->var->nonfinite_skipped++;
    }
    if (!sp->nitems) { /* a held push's commit to ps 0: nothing to reduce here */
        qr__sync_push_free(ps, sp);
        return QR_OK;
    }
    sp->next = s->pending;
    s->pending = sp;
    forward_push(ps, sp);
    return QR_OK;
}

/* ---- held pushes (a sync push-and-pull in one round trip) ----------------------- */

held_pull *qr__held_new(ps_peer *p, const qr_frame *f, uint32_t worker, uint32_t seq,
                        int64_t step, const push_item *items, int nitems) {
    int dense = 0;
    for (int i = 0; i < nitems; i++) dense += !items[i].var->table && items[i].nrows < 0;
    held_pull *h = qr__calloc(1, sizeof *h + (size_t)dense * sizeof h->items[0]);
    if (!h) return NULL;
    *h = (held_pull){.peer = p, .req = *f, .worker = worker, .seq = seq, .step = step};
    for (int i = 0; i < nitems; i++)
        if (!items[i].var->table && items[i].nrows < 0)
            h->items[h->nitems++] = (push_item){.var = items[i].var, .nrows = -1,
                                                .dtype = items[i].dtype};
    return h;
}

void qr__held_answer(held_pull *h, int64_t step) {
    qr_wbuf head = {0};
    qr_msg_put_held_reply(&head, step, h->stale ? QR_HELD_STALE : 0);
    qr__pull_reply_items(h->peer, &h->req, h->items, h->nitems, false, &head);
    qr_wbuf_free(&head);
    free(h);
}

void qr__held_fail(held_pull *h, int status, const char *msg) {
    qr__peer_reply_error(h->peer, &h->req, status, msg);
    free(h);
}

/* ps k: tell ps 0 what became of a held push (QR_OK: held here for its
 * step), on the link ps 0 opened to this ps. Without one (ps 0's link is
 * being remade), the held ones are told again when it is back
 * (qr__sync_coordinator_linked); a refusal then is the worker's to see. */
static void tell_coordinator(qr_ps *ps, uint32_t worker, uint32_t seq, int64_t step,
                             int status, const char *why, bool copy) {
    ps_peer *c = ps->peers;
    while (c && c->role != QR_ROLE_COORDINATOR) c = c->next;
    if (!c && !qr__ps_coordinates(ps)) return;
    qr_wbuf meta = {0};
    qr_msg_put_held(&meta, &(qr_msg_held){.worker = worker, .seq = seq, .local_step = step,
                                          .status = status});
    if (status && status != QR_ESTALE && why) qr_wbuf_bytes(&meta, why, strlen(why));
    if (qr__ps_coordinates(ps)) {
        /* The coordinator hears its other shards' parts as those shards'
         * HELD: ps 0 serving the copy of the last ps's shard (a failover),
         * or its successor its own shard (shard 0's part, the
         * coordinator's own, never comes here). */
        int shard = copy ? ps->replica.primary : ps->index;
        if (shard != 0 && !meta.oom && ps->sync.on_held)
            ps->sync.on_held(ps, shard, meta.data, (uint32_t)meta.len);
        qr_wbuf_free(&meta);
        return;
    }
    /* Of a promoted copy's shard: the frame's flags name it (shard + 1),
     * since this ps says HELD of its own shard's part too. */
    qr_frame f = {.type = QR_MSG_HELD, .request_id = QR_STOP_NOTICE_ID,
                  .flags = copy ? (uint16_t)(ps->replica.primary + 1) : 0};
    if (!meta.oom && qr_conn_send(c->conn, &f, meta.data, (uint32_t)meta.len, NULL, 0, NULL, NULL))
        qr__log(QR_LOG_DEBUG, "HELD not sent to ps 0: %s", qr_last_error());
    qr_wbuf_free(&meta);
}

static bool is_held(const qr_frame *f) {
    return (f->flags & QR_PUSH_SYNC) && (f->flags & QR_PUSH_REPLY_VALUES);
}

/* A connection may hold PEER_MAX_WAITS answers: beyond, a client that
 * keeps pushing ahead of its steps would grow the ps's memory. */
static int held_by(const ps_sync *s, const ps_peer *p) {
    int n = 0;
    for (const held_pull *h = s->held; h; h = h->next) n += h->peer == p;
    return n;
}

/* A held push's HELD to ps 0, once its backup has the push (ps-replicas 2):
 * ps 0 counts a push in a quorum only when both copies of every shard it
 * went to hold it, so a promoted copy can apply the step in flight. */
typedef struct held_tell {
    qr_ps *ps;
    uint32_t worker, seq;
    int64_t step;
    bool copy; /* of the promoted copy's shard (its replacement has it) */
} held_tell;

static void held_copied(ps_peer *p, const qr_frame *req, void *ctx, int status,
                        const char *msg) {
    (void)p;
    (void)req;
    (void)msg;
    held_tell *t = ctx;
    if (!status) {
        tell_coordinator(t->ps, t->worker, t->seq, t->step, QR_OK, NULL, t->copy);
        for (held_pull *h = t->ps->sync.held; h; h = h->next)
            if (h->worker == t->worker && h->seq == t->seq && h->copy == t->copy) h->told = true;
    }
    free(t);
}

/* A push resent to a shard (the worker's connection was lost before its
 * answer: a ps that closed it, say a worker declared hung, or a failover
 * that promoted this copy): one it keeps for its step already (its old
 * primary forwarded it, on a copy), or a member of the step last applied
 * to the shard (*applied). */
static bool resent(qr_ps *ps, const sync_push *in, bool copy, bool *applied) {
    ps_sync *s = &ps->sync;
    *applied = false;
    const sync_push *kept = find_pending(s, in->worker, in->seq, copy);
    if (kept) return kept->local_step == in->local_step;
    if (in->local_step != *shard_step(ps, copy) - 1) return false;
    const quorum_member *members = copy ? s->copy_members : s->own_members;
    int n = copy ? s->ncopy_members : s->nown_members;
    for (int m = 0; m < n; m++)
        if (members[m].worker == in->worker && members[m].seq == in->seq) return *applied = true;
    return false;
}

bool qr__sync_take_resent(ps_peer *p, const qr_frame *f, bool *applied) {
    if (!resent(p->ps, p->incoming, p->promoted_shard, applied)) return false;
    qr__grad_check_finish(&p->check, f->payload_len);
    qr__sync_push_free(p->ps, p->incoming);
    p->incoming = NULL;
    p->ps->replica.duplicate_pushes++;
    return true;
}

void qr__sync_push_message(ps_peer *p, const qr_frame *f) {
    qr_ps *ps = p->ps;
    ps_sync *s = &ps->sync;
    const sync_push *in = p->incoming;
    uint32_t worker = in->worker, seq = in->seq;
    int64_t step = in->local_step;
    bool copy = p->promoted_shard, applied = false;
    char msg[512];
    int rc;
    if (is_held(f) && held_by(s, p) >= PEER_MAX_WAITS) {
        qr__grad_check_finish(&p->check, f->payload_len);
        qr__sync_push_free(ps, p->incoming);
        p->incoming = NULL;
        rc = QR_EINVAL;
        snprintf(msg, sizeof msg, "%s: PUSH: this connection holds %d sync push-and-pulls "
                 "waiting for their step already (at most %d)", ps->name, PEER_MAX_WAITS,
                 PEER_MAX_WAITS);
    } else if (qr__sync_take_resent(p, f, &applied)) {
        /* Kept once: answered as any held push (or at once if applied); a
         * non-held one as kept, once the backup has what was forwarded. */
        rc = QR_OK;
    } else {
        rc = qr__sync_push_keep(p, f, msg, sizeof msg);
    }
    /* (A promoted copy's link is gone until a replacement joins; while it
     * is being copied, wait_on answers at once.) */
    repl_link *L = forward_link(ps, copy);
    bool wait_backup = !rc && L && !L->gone;
    if (!is_held(f)) {
        if (rc) qr__peer_reply_error(p, f, rc, msg);
        else if (wait_backup) qr__replica_wait(p, f, push_copied, ps); /* the worker commits next */
        else qr__peer_reply_step(p, f, *shard_step(ps, copy));
        return;
    }
    /* A held push on ps k (ps 0's go to coord.c): ps 0 hears what became
     * of it (once the backup has it too); the answer comes once its step
     * is applied here, or now. It is held before ps 0 hears of it: on ps 0
     * itself (serving a copy) the HELD may complete the step at once. */
    held_pull *h = NULL;
    if (!rc || rc == QR_ESTALE) {
        h = qr__held_new(p, f, worker, seq, step, p->items, p->nitems);
        if (!h) {
            rc = QR_ENOMEM;
            snprintf(msg, sizeof msg, "out of memory holding a push-and-pull");
        }
    }
    if (rc && rc != QR_ESTALE) {
        tell_coordinator(ps, worker, seq, step, rc, msg, copy);
        qr__peer_reply_error(p, f, rc, msg);
        return;
    }
    h->copy = copy;
    if (rc == QR_ESTALE || applied) {
        h->stale = rc == QR_ESTALE;
        if (!applied) tell_coordinator(ps, worker, seq, step, rc, msg, copy);
        qr__held_answer(h, *shard_step(ps, copy));
        return;
    }
    h->next = s->held;
    s->held = h;
    held_tell *t = wait_backup ? qr__calloc(1, sizeof *t) : NULL;
    if (t) {
        *t = (held_tell){ps, worker, seq, step, copy};
        qr__replica_wait(p, f, held_copied, t);
        return;
    }
    /* (Out of memory for the wait: told now, as with one copy.) */
    h->told = true;
    tell_coordinator(ps, worker, seq, step, QR_OK, NULL, copy);
}

void qr__sync_push_refused(ps_peer *p, const qr_frame *f, int status, const char *msg) {
    if (f->type != QR_MSG_PUSH || !is_held(f) || !p->ps->sync.on || qr__peer_coordinator_part(p))
        return;
    tell_coordinator(p->ps, p->push_worker, p->push_seq, -1, status, msg, p->promoted_shard);
}

void qr__sync_coordinator_linked(qr_ps *ps) {
    for (const held_pull *h = ps->sync.held; h; h = h->next)
        if (h->told) tell_coordinator(ps, h->worker, h->seq, h->step, QR_OK, NULL, h->copy);
}

/* ps k: the held pushes of `step` or older are answered, with the values
 * that step left. */
static void answer_held(qr_ps *ps, int64_t step, bool copy) {
    ps_sync *s = &ps->sync;
    held_pull **link = &s->held, *done = NULL;
    while (*link) {
        held_pull *h = *link;
        if (h->step <= step && h->copy == copy) {
            *link = h->next;
            h->next = done;
            done = h;
        } else {
            link = &h->next;
        }
    }
    /* Oldest first: each connection's answers in the order asked. */
    held_pull *ordered = NULL;
    while (done) {
        held_pull *next = done->next;
        done->next = ordered;
        ordered = done;
        done = next;
    }
    while (ordered) {
        held_pull *next = ordered->next;
        qr__held_answer(ordered, *shard_step(ps, copy));
        ordered = next;
    }
}

int qr__sync_release_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    if (!p->ps->sync.on || p->role != QR_ROLE_COORDINATOR)
        return qr__fail(QR_EINVAL, "RELEASE comes only from ps 0's coordinator, in sync mode");
    return qr__peer_check_small(f, QR_MSG_MEMBER_LEN);
}

void qr__sync_release(qr_ps *ps, uint32_t worker, uint32_t seq) {
    ps_sync *s = &ps->sync;
    /* Both its parts, when this ps serves two shards (a promoted copy). */
    for (held_pull **link = &s->held; *link;) {
        held_pull *h = *link;
        if (h->worker != worker || h->seq != seq) {
            link = &h->next;
            continue;
        }
        *link = h->next;
        qr__held_answer(h, *shard_step(ps, h->copy));
    }
}

void qr__sync_release_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    uint32_t worker, seq;
    qr_msg_get_member(&r, &worker, &seq);
    qr__sync_release(p->ps, worker, seq);
}

void qr__sync_put_shard_step(const qr_ps *ps, qr_wbuf *out) {
    const ps_sync *s = &ps->sync;
    if (!s->on || !qr__replica_on(ps)) return;
    qr_wbuf_i64(out, s->step);
    qr_wbuf_u32(out, (uint32_t)s->nown_members);
    for (int i = 0; i < s->nown_members; i++)
        qr_msg_put_member(out, s->own_members[i].worker, s->own_members[i].seq);
}

void qr__sync_answer_own(qr_ps *ps) {
    answer_held(ps, ps->sync.step - 1, false);
}

void qr__sync_peer_lost(ps_peer *p) {
    held_pull **link = &p->ps->sync.held;
    while (*link) {
        held_pull *h = *link;
        if (h->peer == p) {
            *link = h->next;
            free(h);
        } else {
            link = &h->next;
        }
    }
}

void qr__sync_stop(qr_ps *ps, int status, const char *why) {
    ps_sync *s = &ps->sync;
    while (s->held) {
        held_pull *h = s->held;
        s->held = h->next;
        qr__held_fail(h, status, why);
    }
}

/* ---- two copies (--ps-replicas 2, docs/REPLICATION.md) ------------------------ */

/* Primary: a push kept for its step goes to the backup as it came (its
 * gradients as float32, a bf16/fp16 one widened; the learning rate it
 * carried, or none), so that the copy holds every push the shard holds:
 * what a promoted copy needs to apply the step in flight. Skipped items
 * (non-finite, nonfinite=skip) are no source of the reduce: not sent. */
static void forward_push(qr_ps *ps, const sync_push *sp) {
    repl_link *L = forward_link(ps, sp->copy);
    if (!L) return;
    repl_forward *fw = qr__replica_begin(ps, &(qr_msg_repl_head){.flags = QR_REPL_SYNC_PUSH,
                                                                 .worker = sp->worker,
                                                                 .seq = sp->seq,
                                                                 .t = sp->local_step,
                                                                 .data_pos = sp->data_pos});
    for (int i = 0; i < sp->nitems; i++) {
        const push_item *it = &sp->items[i];
        if (it->skip) continue;
        const qr_var *v = it->var;
        int64_t dim = v->shape[v->ndim - 1];
        uint64_t nbytes = it->nrows < 0 ? (uint64_t)v->n * 4
                                        : (uint64_t)it->nrows * (8 + 4 * (uint64_t)dim);
        qr__replica_add(fw, v->id, it->nrows < 0 ? QR_REPL_DENSE : QR_REPL_SPARSE, it->lr,
                        it->data, nbytes);
    }
    qr__replica_link_send(L, fw);
}

void qr__sync_forward_kept(qr_ps *ps, bool copy) {
    for (const sync_push *sp = ps->sync.pending; sp; sp = sp->next)
        if (sp->copy == copy) forward_push(ps, sp);
}

/* Primary: the step applied, named by its members (in reduce order), after
 * their pushes on the same link: the backup reduces the same bytes in the
 * same order with the same kernels (reduce_and_apply), hence the same bits.
 * (Forwarding the reduced gradient instead would need an apply kernel that
 * gives the fused reduce+apply's bits, which none promises, and would
 * leave the copy without the step's pushes if the primary died mid-step.) */
static void forward_step(qr_ps *ps, repl_link *L, int64_t step, const quorum_member *members,
                         int n) {
    repl_forward *fw = qr__replica_begin(ps, &(qr_msg_repl_head){.flags = QR_REPL_SYNC_STEP,
                                                                 .t = step});
    qr_wbuf list = {0};
    for (int m = 0; m < n; m++) qr_msg_put_member(&list, members[m].worker, members[m].seq);
    qr__replica_add(fw, 0, QR_REPL_MEMBERS, 0, list.data, list.len);
    if (list.oom)
        qr__ps_ask_abort(ps, QR_ENOMEM, "out of memory forwarding a step to the backup: the "
                         "copies would differ");
    qr_wbuf_free(&list);
    qr__replica_link_send(L, fw);
}

/* ps k: the step is on the backup too (or the wait ended otherwise). The
 * answer names the step and the shards this ps has applied it to: its own,
 * and a promoted copy's (ps 0 counts a step's shards, not its ps). */
typedef struct step_done {
    qr_ps *ps;
    int64_t step;
    bool own;      /* this ps serves its own shard (not a replacement) */
    bool copy_waited; /* the wait for the promoted copy's replacement is done */
} step_done;

static void step_copied(ps_peer *p, const qr_frame *req, void *ctx, int status,
                        const char *msg) {
    step_done *d = ctx;
    qr_ps *ps = d->ps;
    int64_t step = d->step;
    bool own = d->own;
    if (!status && !d->copy_waited) { /* the own shard's backup has it */
        if (own) answer_held(ps, ps->sync.step - 1, false);
        /* A promoted copy being copied to the failed primary's
         * replacement: ps 0 hears "applied" once that has the step too. */
        repl_link *L = forward_link(ps, true);
        if (p && L && !L->gone) {
            d->copy_waited = true;
            qr__replica_wait_copy(p, req, step_copied, d);
            return;
        }
    }
    free(d);
    if (status) {
        if (p) qr__peer_reply_error(p, req, status, msg);
        return; /* the held answers are the stop's (qr__sync_stop) */
    }
    if (!p) return;
    bool copy = ps->replica.promoted && ps->replica.copy_steps > step;
    qr_wbuf out = {0};
    qr_wbuf_i64(&out, step);
    qr_wbuf_u32(&out, (uint32_t)own + (uint32_t)copy);
    if (own) qr_wbuf_u32(&out, (uint32_t)ps->index);
    if (copy) qr_wbuf_u32(&out, (uint32_t)ps->replica.primary);
    qr__peer_reply(p, req, QR_OK, &out, NULL, 0, NULL, NULL);
    qr_wbuf_free(&out);
}

/* A (non-held) sync push is on the backup too: the worker may commit it. */
static void push_copied(ps_peer *p, const qr_frame *req, void *ctx, int status,
                        const char *msg) {
    qr_ps *ps = ctx;
    if (!p) return;
    if (status) qr__peer_reply_error(p, req, status, msg);
    else qr__peer_reply_step(p, req, *shard_step(ps, p->promoted_shard));
}

int qr__sync_copy_keep(qr_ps *ps, bool own, const qr_msg_repl_head *h, const push_item *items,
                       int nitems, const void *payload, size_t len) {
    ps_sync *s = &ps->sync;
    bool copy = !own;
    int64_t now = *shard_step(ps, copy);
    if (!qr__is_worker(h->worker, s->N))
        return qr__fail(QR_EINVAL, "REPLICATE: worker %u is not in the cluster (%d workers)",
                        h->worker, s->N);
    /* A push of a step the copy has applied, or one it holds: sent again
     * after the link was remade (the forward numbers catch most). */
    if (h->t < now || find_pending(s, h->worker, h->seq, copy)) return QR_OK;
    if (h->t > now)
        return qr__fail(QR_EINVAL, "REPLICATE: worker %u's push %u for step %lld, but this copy "
                        "is at step %lld", h->worker, h->seq, (long long)h->t, (long long)now);
    sync_push *sp = qr__calloc(1, sizeof *sp);
    if (!sp) return qr__fail(QR_ENOMEM, "out of memory keeping a sync push on the copy");
    *sp = (sync_push){.worker = h->worker, .seq = h->seq, .local_step = h->t, .nitems = nitems,
                      .copy = copy, .data_pos = h->data_pos};
    /* Its batch is read (as ps 0 counts it, member or stale): where the
     * worker's data goes on from, should this copy's ps succeed ps 0. */
    (own ? ps->replica.last : ps->replica.backup_last)[h->worker].data_pos = h->data_pos;
    sp->items = qr__calloc((size_t)QR_MAX(nitems, 1), sizeof *sp->items);
    sp->data = qr__recv_pool_get(&ps->recv_pool, QR_MAX(len, 4), &sp->data_cap);
    if (!sp->items || !sp->data) {
        qr__sync_push_free(ps, sp);
        return qr__fail(QR_ENOMEM, "out of memory keeping a sync push on the copy");
    }
    if (len) memcpy(sp->data, payload, len);
    for (int i = 0; i < nitems; i++) {
        sp->items[i] = (push_item){.var = items[i].var, .offset = items[i].offset,
                                   .nrows = items[i].nrows, .dtype = QR_FLOAT32,
                                   .lr = items[i].lr};
        sp->items[i].data = (uint8_t *)sp->data + items[i].offset;
    }
    sp->next = s->pending;
    s->pending = sp;
    return QR_OK;
}

int qr__sync_record_members(qr_ps *ps, bool copy, const quorum_member *members, int n) {
    ps_sync *s = &ps->sync;
    quorum_member **last = copy ? &s->copy_members : &s->own_members;
    int *nlast = copy ? &s->ncopy_members : &s->nown_members;
    int *cap = copy ? &s->copy_members_cap : &s->own_members_cap;
    if (n > *cap) {
        quorum_member *grown = realloc(*last, (size_t)n * sizeof *grown);
        if (!grown) return qr__fail(QR_ENOMEM, "out of memory recording a step's members");
        *last = grown;
        *cap = n;
    }
    if (n) memcpy(*last, members, (size_t)n * sizeof *members);
    *nlast = n;
    return QR_OK;
}

/* A promoted copy's step is on the replacement too (or there is none): its
 * held pushes are answered. */
static void copy_step_copied(ps_peer *p, const qr_frame *req, void *ctx, int status,
                             const char *msg) {
    (void)p;
    (void)req;
    (void)msg;
    step_done *d = ctx;
    if (!status) answer_held(d->ps, d->step, true); /* else: the stop's (qr__sync_stop) */
    free(d);
}

/* Reduce and apply step `step` of a shard (this ps's own, or its copy of
 * ps `primary`'s) from the members' pushes kept for it, and drop the other
 * pushes of that step or older. */
static int apply_shard(qr_ps *ps, bool copy, int64_t step, const quorum_member *members, int n) {
    ps_sync *s = &ps->sync;
    int64_t *now = shard_step(ps, copy);
    if (step < *now) return QR_OK; /* applied already: a repeated APPLY */
    if (step > *now)
        return qr__fail(QR_EINTERNAL, "%s is at step %lld%s but was asked to apply step %lld "
                        "(did it restart and lose its state?)", ps->name, (long long)*now,
                        copy ? " on its copy" : "", (long long)step);
    s->nsources = 0;
    int rc = QR_OK;
    for (int m = 0; m < n && !rc; m++) {
        sync_push *sp = find_pending(s, members[m].worker, members[m].seq, copy);
        if (!sp || sp->local_step != step) {
            /* A committed push is held by every ps it was sent to (the
             * worker commits once each has acknowledged it), so a member
             * without one here pushed nothing for this ps: its variables
             * here count it as a zero. */
            qr__log(QR_LOG_DEBUG, "step %lld: push %u of worker %u has nothing for this ps",
                    (long long)step, members[m].seq, members[m].worker);
            continue;
        }
        for (int i = 0; i < sp->nitems && !rc; i++) {
            push_item *it = &sp->items[i];
            if (!it->skip) rc = qr__sync_add_source(s, it->var, m, it);
        }
    }
    /* A variable a member did not push counts as a zero in the mean: the
     * divisor is the quorum size either way. */
    float divisor = s->mean ? (float)n : 1.0f;
    /* The ps's own row counters count what it serves, not a backup's copy. */
    uint64_t added = ps->metrics.rows_added, pushed = ps->metrics.rows_pushed;
    if (!rc) rc = qr__sync_reduce_and_apply(ps, s->sources, s->nsources, step, divisor);
    if (copy && !ps->replica.promoted) {
        ps->metrics.rows_added = added;
        ps->metrics.rows_pushed = pushed;
    }
    if (rc) return rc;
    repl_link *L = forward_link(ps, copy);
    if (L) forward_step(ps, L, step, members, n);
    /* Everything of this step or older that is still here is stale. */
    sync_push **link = &s->pending;
    while (*link) {
        sync_push *sp = *link;
        if (sp->copy == copy && sp->local_step <= step) {
            *link = sp->next;
            qr__sync_push_free(ps, sp);
        } else {
            link = &sp->next;
        }
    }
    *now = step + 1;
    rc = qr__sync_record_members(ps, copy, members, n);
    if (rc) return rc;
    if (copy) {
        ps->replica.copy_pushes += (uint64_t)n;
        /* A promoted copy's held pushes wait for its replacement once that
         * is copied (its link: at once while there is none, or while it is
         * being copied). */
        step_done *d = L ? qr__calloc(1, sizeof *d) : NULL;
        if (!d) {
            answer_held(ps, step, true);
            return QR_OK;
        }
        *d = (step_done){ps, step, false, false};
        qr__replica_after_copy(ps, copy_step_copied, d);
        return QR_OK;
    }
    ps->replica.own_pushes += (uint64_t)n; /* the gradients applied (as the copy counts) */
    ps->applied_steps = step + 1;
    /* With two copies the held answers wait for the backup
     * (qr__sync_apply_message): an answer means both copies have the step. */
    if (!qr__replica_on(ps)) answer_held(ps, step, false);
    return QR_OK;
}

int qr__sync_apply_step(qr_ps *ps, int64_t step, const quorum_member *members, int n) {
    return apply_shard(ps, false, step, members, n);
}

int qr__sync_apply_copy(qr_ps *ps, int64_t step, const quorum_member *members, int n) {
    return apply_shard(ps, true, step, members, n);
}

int qr__sync_apply_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    if (!p->ps->sync.on) return qr__fail(QR_EINVAL, "APPLY: this ps trains in async mode");
    if (p->role != QR_ROLE_COORDINATOR)
        return qr__fail(QR_EINVAL, "APPLY comes only from ps 0's coordinator");
    if (f->payload_len) return qr__fail(QR_EPROTO, "APPLY carries no payload");
    return QR_OK;
}

void qr__sync_apply_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    int64_t step;
    uint32_t count;
    qr_msg_get_apply_head(&r, &step, &count);
    if (r.bad || count == 0 || count > QR_PROTO_MAX_ITEMS ||
        r.left != (size_t)count * QR_MSG_MEMBER_LEN) {
        qr__peer_reply_error(p, f, QR_EPROTO, "APPLY meta is malformed");
        return;
    }
    quorum_member *members = qr__calloc(count, sizeof *members);
    if (!members) {
        qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory");
        return;
    }
    for (uint32_t i = 0; i < count; i++) qr_msg_get_member(&r, &members[i].worker, &members[i].seq);
    /* A replacement (JOINING, BACKUP) does not serve its own shard: its
     * copy there applies each step as the ps serving it forwards it. (A
     * BACKUP whose primary failed serves that one: the copy, below.) */
    const ps_replica *rp = &p->ps->replica;
    bool own = !qr__replica_on(p->ps) || !rp->failed || rp->failed[p->ps->index] == QR_PS_ALIVE;
    int rc = own ? qr__sync_apply_step(p->ps, step, members, (int)count) : QR_OK;
    /* A promoted copy (a failover, ps-replicas 2) applies the step too, from
     * the pushes its old primary forwarded and those resent to it. */
    if (!rc && p->ps->replica.promoted) rc = qr__sync_apply_copy(p->ps, step, members, (int)count);
    free(members);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", qr_last_error());
        qr__peer_reply_error(p, f, rc, msg);
        return;
    }
    if (qr__replica_on(p->ps)) {
        /* ps 0 hears "applied" once the backup has the step too (a
         * repeated APPLY as well: it waits for the forward made then). */
        step_done *d = qr__calloc(1, sizeof *d);
        if (!d) {
            qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory");
            return;
        }
        *d = (step_done){p->ps, step, own, false};
        if (own) qr__replica_wait(p, f, step_copied, d);
        else step_copied(p, f, d, QR_OK, NULL); /* (the promoted copy's wait, if any) */
        return;
    }
    qr__peer_reply(p, f, QR_OK, NULL, NULL, 0, NULL, NULL);
}

/*
 * push.c - PUSH: a worker's gradients (or deltas) for variables of this
 * ps, applied as they come (async). A synchronous push is checked here
 * the same way, then handed to sync.c to wait for its step's quorum.
 *
 * A push goes through these phases, each a function below:
 *   header   decode and check every item against its variable, and say
 *            where the payload lands (qr__push_header, expect_payload)
 *   check    once the payload is in: NaN/Inf (scanned as it arrived) and
 *            sparse row indices, before any variable changes
 *   prepare  make every tensor the apply writes exclusive (a pull reply
 *            may still read it): after this a dense apply cannot fail
 *   ack      acknowledge before applying when nothing can fail any more,
 *            so the worker's next request travels while the ps applies
 *   apply    the optimizer (or the delta) on each item, the staleness
 *            recorded, a fused push installed; a non-trainable
 *            variable's item (trainable=false, a module's buffer) is its
 *            new value, assigned (added, in a delta push)
 *   count    a step push advances the steps applied here, the moving
 *            averages, and on ps 0 the global step and the worker's clock
 *   forward  with --ps-replicas 2, the push as applied goes to the backup
 *            (replica_forward.c; a push of dense items only just before its
 *            apply, so that both copies apply it at once, from the receive
 *            buffer lent to the forward), and the answer waits until the backup has
 *            applied it (or, with --replication-lag N, all but the last N
 *            forwards before it): no early acknowledgement then, and no apply on
 *            arrival (fused_apply.c), since the backup must apply the
 *            gradient itself; a push of a (worker, seq) applied already
 *            is answered as it was, not applied again
 * Nothing else is served until the apply is done (one loop thread), so
 * every later request of every worker sees it.
 */
#include "ps/ps_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- header ------------------------------------------------------------ */

/* The bytes of item i of the request's payload. */
static uint64_t item_bytes(const ps_peer *p, int i, const qr_frame *f) {
    return (i + 1 < p->nitems ? p->items[i + 1].offset : f->payload_len) - p->items[i].offset;
}

/* Where an async push's payload lands: the items applied as they arrive
 * (fused_apply.c) each in a buffer of their own, the others one after
 * another in the request's buffer. */
static int expect_payload(ps_peer *p, const qr_frame *f) {
    bool delta = f->flags & QR_PUSH_DELTA;
    uint64_t shared = 0;
    int nfused = 0;
    for (int i = 0; i < p->nitems; i++) {
        if (qr__fused_eligible(p->ps, &p->items[i], delta)) nfused++;
        else shared += item_bytes(p, i, f);
    }
    /* A push of fused items only needs no request buffer. */
    int rc = QR_OK;
    if (shared || nfused < p->nitems) rc = qr__peer_take_recv(p, shared);
    else qr__peer_release_recv(p);
    qr_iov *iov = qr__calloc((size_t)p->nitems, sizeof *iov);
    if (rc || !iov) {
        free(iov);
        return QR_ENOMEM;
    }
    int niov = 0;
    uint64_t at = 0;
    for (int i = 0; i < p->nitems && !rc; i++) {
        push_item *it = &p->items[i];
        uint64_t bytes = item_bytes(p, i, f);
        if (qr__fused_eligible(p->ps, it, delta)) {
            rc = qr__fused_begin(p->ps, it, delta);
            if (!rc) iov[niov++] = (qr_iov){it->data, bytes};
            continue;
        }
        it->data = (uint8_t *)p->recv + at;
        at += bytes;
        if (!bytes) continue;
        if (niov && (uint8_t *)iov[niov - 1].base + iov[niov - 1].len == it->data)
            iov[niov - 1].len += bytes; /* next to the previous item */
        else
            iov[niov++] = (qr_iov){it->data, bytes};
    }
    if (!rc) rc = qr_conn_expect(p->conn, iov, niov);
    free(iov);
    if (!rc) qr__grad_check_start(&p->check, p->items, p->nitems);
    return rc;
}

/* One item's record against its variable: a dense gradient of the
 * variable's size, or whole sparse rows (async only). *nrows: the rows of
 * a sparse item, -1 for a dense one. */
static int check_item(const qr_msg_var *rec, const qr_var *v, int64_t *nrows) {
    *nrows = -1;
    if (qr_msg_kind_grad(rec->kind) == QR_GRAD_SPARSE && v->non_trainable)
        return qr__fail(QR_EINVAL, "PUSH: '%s' is not trainable (trainable=false): push its "
                        "whole value, not rows", v->name);
    uint32_t dtype = qr_msg_kind_dtype(rec->kind);
    if (qr_msg_kind_grad(rec->kind) == QR_GRAD_DENSE && dtype != QR_FLOAT32 &&
        (!qr_dt_size((int)dtype) || v->table))
        return qr__fail(QR_EINVAL, "PUSH: variable '%s': %s", v->name,
                        v->table ? "an embedding table's rows are float32"
                                 : "unknown dtype in the item's kind (0 float32, 1 bfloat16, "
                                   "2 float16)");
    if (rec->kind == QR_GRAD_SPARSE) {
        uint64_t row_bytes = 8 + 4 * (uint64_t)v->shape[v->ndim - 1];
        if (rec->nbytes % row_bytes)
            return qr__fail(QR_ESHAPE, "PUSH: sparse gradient of '%s': %llu bytes is not a "
                            "whole number of (index, row of %lld floats) pairs", v->name,
                            (unsigned long long)rec->nbytes, (long long)v->shape[v->ndim - 1]);
        *nrows = (int64_t)(rec->nbytes / row_bytes);
        return QR_OK;
    }
    if (qr_msg_kind_grad(rec->kind) != QR_GRAD_DENSE)
        return qr__fail(QR_EINVAL, "PUSH: variable '%s': gradient kind %u is not supported "
                        "(0 dense, 1 sparse rows; a dtype only with dense)", v->name, rec->kind);
    if (v->table)
        return qr__fail(QR_EINVAL, "PUSH: '%s' is an embedding table: push its gradient as "
                        "sparse rows (ids and rows)", v->name);
    uint64_t want = qr_dt_wire_bytes((int)dtype, (uint64_t)v->n);
    if (rec->nbytes != want) {
        char shape[128], half[96] = "";
        qr_shape_str(v->ndim, v->shape, shape, sizeof shape);
        if (dtype != QR_FLOAT32)
            snprintf(half, sizeof half, " (in %s: %llu)", qr_dt_name((int)dtype),
                     (unsigned long long)want);
        return qr__fail(QR_ESHAPE,
                        "PUSH: variable '%s' has shape %s (%lld floats) but the gradient "
                        "has %llu bytes%s", v->name, shape, (long long)v->n,
                        (unsigned long long)rec->nbytes, half);
    }
    return QR_OK;
}

int qr__push_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_msg_push_head head;
    qr_msg_get_push_head(&r, &head);
    if (r.bad) return qr__fail(QR_EPROTO, "PUSH meta is truncated");
    bool sync = f->flags & QR_PUSH_SYNC;
    p->push_worker = head.worker;
    p->push_data_pos = head.data_pos;
    p->push_seq = head.seq;
    p->push_nparts = head.nparts;
    if (f->flags & ~QR_PUSH_FLAGS_ALL)
        return qr__fail(QR_EINVAL, "PUSH: unknown flags 0x%x", f->flags);
    if (sync && (f->flags & QR_PUSH_DELTA))
        return qr__fail(QR_EINVAL, "PUSH: delta pushes are for async training");
    if (sync != p->ps->sync.on)
        return qr__fail(QR_EINVAL, "PUSH: a %s push, but this ps trains in %s mode",
                        sync ? "synchronous" : "asynchronous", p->ps->sync.on ? "sync" : "async");
    /* A push of no variables is allowed: it only advances the step. */
    int rc = head.count ? qr__peer_check_count("PUSH", head.count) : QR_OK;
    if (!rc) rc = qr__peer_reserve_items(p, head.count);
    if (rc) return rc;
    uint64_t offset = 0;
    bool with_lr = f->flags & QR_PUSH_LR;
    p->ps->mark++;
    for (uint32_t i = 0; i < head.count; i++) {
        qr_msg_var rec;
        qr_msg_get_var(&r, &rec);
        float lr = with_lr ? qr_msg_get_push_lr(&r) : QR_MSG_PUSH_LR_NONE;
        if (r.bad) return qr__fail(QR_EPROTO, "PUSH meta is truncated at item %u", i);
        qr_var *v = NULL;
        int64_t nrows;
        if ((rc = qr__peer_lookup(p, "PUSH", rec.id, &v))) return rc;
        if ((rc = check_item(&rec, v, &nrows))) return rc;
        if (!(isfinite(lr) && (lr >= 0 || lr == QR_MSG_PUSH_LR_NONE)))
            return qr__fail(QR_EINVAL, "PUSH: variable '%s': learning rate %g is not a finite "
                            "number >= 0 (or -1: the ps's own)", v->name, (double)lr);
        p->items[i] = (push_item){.var = v, .offset = offset, .version = rec.version,
                                  .nrows = nrows, .lr = lr,
                                  .dtype = (uint8_t)qr_msg_kind_dtype(rec.kind)};
        offset += rec.nbytes;
    }
    p->nitems = (int)head.count;
    rc = qr__peer_check_end("PUSH", &r, offset, f->payload_len);
    if (rc) return rc;
    if (sync) return qr__sync_push_header(p, f, head.worker, head.seq, head.local_step);
    return expect_payload(p, f);
}

/* ---- check ------------------------------------------------------------- */

/* What the apply phase carries from one item to the next. */
typedef struct push_apply {
    bool delta;       /* add to the weights, no optimizer */
    int64_t t;        /* the step this apply is (Adam's t): applied_steps + 1 */
    bool ack_first;   /* acknowledged before the apply */
    float *save;      /* for rebasing another push's fused apply */
    size_t save_cap;
    bool stale;       /* a gradient of the push missed an update */
    float *wide;      /* the bf16/fp16 gradients widened (qr__grad_widen) */
    size_t wide_cap;
} push_apply;

/* Every gradient is usable, or the push is refused whole (replied here).
 * A NaN/Inf gradient with nonfinite=skip is marked to be skipped. The
 * bf16/fp16 ones are widened to float32 (into a->wide). */
static int check_items(ps_peer *p, const qr_frame *f, push_apply *a) {
    qr_ps *ps = p->ps;
    /* The NaN/Inf scan ran while the payload arrived; this finishes it. */
    qr__grad_check_finish(&p->check, f->payload_len);
    if (qr__grad_widen(ps, p->items, p->nitems, &a->wide, &a->wide_cap)) {
        qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory widening a bf16/fp16 gradient");
        return QR_ENOMEM;
    }
    char msg[400];
    for (int i = 0; i < p->nitems; i++) {
        push_item *it = &p->items[i];
        int rc = it->nrows >= 0 ? qr__rows_check(ps, qr__peer_shard(p), it, msg, sizeof msg)
                                : QR_OK;
        if (rc) {
            qr__peer_reply_error(p, f, rc, msg);
            return rc;
        }
        if (!it->nonfinite) continue;
        if (!ps->skip_nonfinite) {
            snprintf(msg, sizeof msg, "%s: PUSH: the gradient of variable '%s' contains NaN or "
                     "Inf; nothing was applied (set nonfinite=skip to skip such gradients)",
                     ps->name, it->var->name);
            qr__peer_reply_error(p, f, QR_ENONFINITE, msg);
            return QR_ENONFINITE;
        }
        it->skip = true;
        it->var->nonfinite_skipped++;
    }
    return QR_OK;
}

/* ---- prepare ------------------------------------------------------------ */

/* Make every tensor the push writes exclusive, and everything a fused
 * item needs to be installed, so that a dense apply cannot fail after. */
static int prepare_tensors(ps_peer *p, const qr_frame *f, push_apply *a) {
    qr_ps *ps = p->ps;
    /* A tensor still referenced by a pull reply must be copied before it
     * changes. Replies lent to the kernel (conn.h) hold it until their
     * worker is known to have read them: ask every connection now, so a
     * reply read since does not cost a copy. */
    bool shared = false;
    for (int i = 0; i < p->nitems; i++)
        shared |= !p->items[i].skip && !p->items[i].var->table && p->items[i].var->value->refs > 1;
    if (shared)
        for (ps_peer *q = ps->peers; q; q = q->next) qr_conn_reclaim(q->conn);
    size_t save_floats = 0;
    for (int i = 0; i < p->nitems; i++) {
        push_item *it = &p->items[i];
        if (it->skip) continue;
        qr_var *v = it->var;
        if (qr__ckpt_before_apply(ps, v)) goto oom;
        if (v->table) continue; /* rows change in place; a checkpoint copied them */
        if (it->fused) {
            if (qr__fused_prepare(it)) goto oom;
            continue;
        }
        push_item *fu = qr__fused_of(ps, v);
        if (fu && !qr__fused_can_follow(ps, it, a->delta))
            save_floats = QR_MAX(save_floats, (size_t)fu->fused_done);
        /* A tensor a pull reply still reads is not copied and then updated
         * (two passes over it) when the update can be written straight
         * into the spare instead (one pass). */
        it->to_spare = it->nrows < 0 && v->value->refs > 1 &&
                       (a->delta || v->non_trainable ||
                        qr_optim_stateless(qr__var_optim(ps, v)));
        if (it->to_spare ? qr_var_prepare_spare(v) : qr_var_prepare_write(v)) goto oom;
    }
    if (save_floats) {
        a->save = qr__recv_pool_get(&ps->recv_pool, save_floats * sizeof *a->save, &a->save_cap);
        if (!a->save) goto oom;
    }
    return QR_OK;
oom:
    qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory applying a gradient");
    return QR_ENOMEM;
}

/* Sparse items and moving averages may still need memory while they are
 * applied: a push with either is acknowledged after. */
static bool can_ack_first(const ps_peer *p) {
    if (p->ps->average_decay != 0) return false;
    for (int i = 0; i < p->nitems; i++)
        if (p->items[i].nrows >= 0) return false;
    return true;
}

/* ---- apply ---------------------------------------------------------------- */

static int staleness_bucket(uint64_t s) {
    if (s < 4) return (int)s;
    int b = 4;
    for (uint64_t lim = 8; s >= lim && b < QR_STALENESS_BUCKETS - 1; lim *= 2) b++;
    return b;
}

/* Sparse rows: of a table, or of a dense variable. Duplicate ids are
 * summed first (in the order they came), then the optimizer's sparse
 * apply, or the rows are added (delta). */
static int apply_sparse(qr_ps *ps, push_item *it, bool delta, int64_t t) {
    qr_var *v = it->var;
    /* as qr__rows_apply picks it, for the backup (replica_backup.c) */
    it->applied_lr = it->lr >= 0 ? it->lr : qr__ps_lr(ps, v, qr__var_optim(ps, v), t - 1);
    return qr__rows_apply_push(ps, v, it->data, (const float *)(it->data + 8 * it->nrows),
                               it->nrows, delta, t, it->lr);
}

/* How many updates its variable took since the worker pulled the
 * version its gradient was computed at. */
static uint64_t staleness_of(const push_item *it) {
    return it->var->version > it->version ? it->var->version - it->version : 0;
}

/* The learning rate a dense gradient is applied with at step t. */
static float dense_lr(const qr_ps *ps, const push_item *it, uint64_t staleness, int64_t t) {
    float lr = qr__item_lr(ps, it, qr__var_optim(ps, it->var), t - 1);
    if (ps->staleness_lr_scale && staleness) lr /= (float)(1 + staleness);
    return lr;
}

/* A dense gradient or delta (or a non-trainable variable's new value),
 * into the value or its spare (then swapped in); a gradient's learning
 * rate in *lr_used. */
static int apply_dense(qr_ps *ps, push_item *it, bool delta, uint64_t staleness, int64_t t,
                       float *lr_used) {
    qr_var *v = it->var;
    const float *g = (const float *)it->data;
    float *out = it->to_spare ? v->spare->data : v->value->data;
    int rc = QR_OK;
    if (delta) {
        qr_optim_add_delta(out, v->value->data, g, v->n);
    } else if (v->non_trainable) {
        memcpy(out, g, (size_t)v->n * sizeof *out);
    } else {
        const qr_optim *opt = qr__var_optim(ps, v);
        float lr = dense_lr(ps, it, staleness, t);
        *lr_used = lr;
        it->applied_lr = lr;
        rc = it->to_spare ? qr_optim_apply_dense_to(opt, out, v->value->data, g, v->n, lr)
                          : qr_optim_apply_dense(opt, v->slots, out, g, v->n, lr, t);
    }
    if (!rc && it->to_spare) qr_var_swap_spare(v);
    return rc;
}

/* One checked, prepared item of an async push applied to its variable,
 * and any fused push of the same variable made to follow. */
static int apply_item(qr_ps *ps, push_item *it, push_apply *a) {
    qr_var *v = it->var;
    /* Staleness (a value assigned to a non-trainable variable is no
     * gradient: not counted). */
    uint64_t staleness = staleness_of(it);
    if (!v->non_trainable) {
        ps->staleness_hist[staleness_bucket(staleness)]++;
        a->stale |= staleness > 0;
    }
    if (it->fused) { /* computed while it arrived */
        qr__fused_install(ps, it);
        v->version++;
        ps->fused_pushes++;
        return QR_OK;
    }
    /* Another push's fused apply read v's value, which this changes. */
    push_item *fu = qr__fused_of(ps, v);
    bool follow = fu && fu->fused_done > 0;
    bool direct = qr__fused_can_follow(ps, it, a->delta);
    if (follow && !direct) qr__fused_save(fu, a->save);
    float lr = 0;
    int rc = it->nrows >= 0 ? apply_sparse(ps, it, a->delta, a->t)
                            : apply_dense(ps, it, a->delta, staleness, a->t, &lr);
    if (rc) return qr__fail(rc, "%s: applying to '%s': %s", ps->name, v->name, qr_last_error());
    if (follow) {
        if (direct) qr__fused_follow(fu, (const float *)it->data, a->delta ? -1.0f : lr);
        else qr__fused_rebase(fu, a->save);
        ps->fused_rebases++;
    }
    v->version++;
    return QR_OK;
}

/* ---- count ---------------------------------------------------------------- */

/* p's step pushes count the global step: it is the coordinator's link
 * for shard 0 (the shard workers send their step pushes to), served by
 * ps 0 or, since ps 0 failed over, by its successor's promoted copy. */
static bool counts_global_step(const ps_peer *p) {
    const qr_ps *ps = p->ps;
    if (!qr__ps_coordinates(ps)) return false;
    return p->promoted_shard ? ps->replica.primary == 0 : ps->index == 0;
}

/* A step push was applied: the steps applied here (Adam's t, the lr
 * schedule), the moving averages, and on ps 0 the global step. */
static int count_step(ps_peer *p) {
    qr_ps *ps = p->ps;
    /* A shard this ps was promoted to serve counts its own steps, as
     * its failed primary did (failover.c); never the global step. */
    int64_t *steps = p->promoted_shard ? &ps->replica.copy_steps : &ps->applied_steps;
    ++*steps;
    for (int i = 0; i < p->nitems && ps->average_decay > 0; i++)
        if (!p->items[i].var->table && !p->items[i].var->non_trainable &&
            qr_var_update_average(p->items[i].var, ps->average_decay, *steps))
            return qr__fail(QR_ENOMEM, "out of memory updating an average");
    if (counts_global_step(p)) {
        ps->global_step++;
        qr__bound_count_step(ps, p->push_worker);
        qr__ckpt_step_done(ps);
    }
    return QR_OK;
}

/* ---- forward ------------------------------------------------------------- */

/* A push's answer kept until its backup has applied it: the step, and
 * for a fused push-and-pull the dense variables whose values it brings
 * (as they are when it is answered, which this push's update is in). */
typedef struct push_answer {
    int64_t step;
    bool values;
    int nitems;
    push_item items[];
} push_answer;

static void answer_push(ps_peer *p, const qr_frame *req, void *ctx, int status,
                        const char *msg) {
    push_answer *a = ctx;
    if (p && status) {
        qr__peer_reply_error(p, req, status, msg);
    } else if (p && a->values) {
        qr_wbuf head = {0};
        qr_msg_put_step(&head, a->step);
        qr__pull_reply_items(p, req, a->items, a->nitems, false, &head);
        qr_wbuf_free(&head);
    } else if (p) {
        qr__peer_reply_step(p, req, a->step);
    }
    free(a);
}

/* Answer f with `step` once the backup has applied everything forwarded
 * so far, but the last replication-lag forwards. */
static void answer_after_backup(ps_peer *p, const qr_frame *f, int64_t step) {
    bool values = f->flags & QR_PUSH_REPLY_VALUES;
    int n = values ? p->nitems : 0;
    push_answer *a = malloc(sizeof *a + (size_t)n * sizeof a->items[0]);
    if (!a) {
        qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory keeping a push's answer");
        return;
    }
    a->step = step;
    a->values = values;
    a->nitems = 0;
    for (int i = 0; i < n; i++)
        if (!p->items[i].var->table && p->items[i].nrows < 0) a->items[a->nitems++] = p->items[i];
    qr__replica_wait_lagging(p, f, answer_push, a);
}

/* The push, as applied (or as it is about to be: forward_before_apply), to the
 * backup, with the step it is answered with. Its gradients go from the
 * request's receive buffer, lent to the forward until the backup has
 * them: no copy (widened bf16/fp16 gradients are copied). */
static void forward(ps_peer *p, const qr_frame *f, const push_apply *a, int64_t answer) {
    qr_ps *ps = p->ps;
    qr_msg_repl_head head = {.flags = f->flags & (QR_PUSH_STEP | QR_PUSH_DELTA),
                             .worker = p->push_worker, .seq = p->push_seq, .t = a->t,
                             .answer = answer, .data_pos = p->push_data_pos};
    repl_forward *fw = qr__replica_begin(ps, &head);
    /* A buffer much larger than the push (the pool hands out the hottest
     * that fits) is not held for it while the backup catches up. */
    bool lend = !a->wide && p->recv && p->recv_cap <= 2 * f->payload_len + ((size_t)64 << 10);
    qr_iov *iov = lend ? qr__calloc((size_t)p->nitems, sizeof *iov) : NULL;
    void *lent = iov ? qr__peer_lend_recv(p) : NULL;
    int niov = 0;
    for (int i = 0; i < p->nitems; i++) {
        const push_item *it = &p->items[i];
        if (it->skip) continue;
        uint64_t bytes = it->nrows >= 0
                             ? (uint64_t)it->nrows * (8 + 4 * (uint64_t)it->var->shape[it->var->ndim - 1])
                             : (uint64_t)it->var->n * 4;
        float lr = a->delta || it->var->non_trainable ? 0 : it->applied_lr;
        qr__replica_add(fw, it->var->id, it->nrows >= 0 ? QR_REPL_SPARSE : QR_REPL_DENSE, lr,
                        lent ? NULL : it->data, bytes);
        if (!lent || !bytes) continue;
        if (niov && (uint8_t *)iov[niov - 1].base + iov[niov - 1].len == it->data)
            iov[niov - 1].len += bytes; /* next to the previous item */
        else
            iov[niov++] = (qr_iov){it->data, bytes};
    }
    if (lent) qr__replica_lend(fw, iov, niov, qr__recv_lent_release, lent);
    else free(iov);
    qr__replica_send_for(p, fw);
    qr__replica_applied(p, p->push_worker, p->push_seq, answer);
}

/* A push of dense items only goes to the backup before it is applied
 * here, so that both copies apply it at once: once prepared a dense apply
 * cannot fail, and nothing else runs between the forward and the apply
 * (one loop thread), so it is what the apply will be, with the learning
 * rates the apply will use. A sparse apply may still fail (rows made,
 * memory): such a push is forwarded after. */
static bool forward_before_apply(ps_peer *p, const push_apply *a) {
    /* (A forward with no copy to go to is freed at once, and with it the
     * receive buffer lent to it, which the apply still reads.) */
    if (!qr__replica_keeps(p) || p->ps->average_decay > 0) return false;
    for (int i = 0; i < p->nitems; i++) {
        push_item *it = &p->items[i];
        if (it->nrows >= 0 || it->fused) return false;
    }
    for (int i = 0; i < p->nitems; i++) {
        push_item *it = &p->items[i];
        if (!it->skip && !a->delta && !it->var->non_trainable)
            it->applied_lr = dense_lr(p->ps, it, staleness_of(it), a->t);
    }
    return true;
}

/* ---- the push ------------------------------------------------------------- */

void qr__push_message(ps_peer *p, const qr_frame *f) {
    qr_ps *ps = p->ps;
    bool step = f->flags & QR_PUSH_STEP;
    push_apply a = {.delta = f->flags & QR_PUSH_DELTA,
                    .t = (p->promoted_shard ? ps->replica.copy_steps : ps->applied_steps) + 1};
    /* Applied (this function again) when the checkpoint's cut is decided. */
    if (qr__ckpt_park(p, f, qr__push_message)) return;
    int64_t answer;
    if (qr__replica_duplicate(p, p->push_worker, p->push_seq, &answer)) {
        qr__log(QR_LOG_DEBUG, "push (worker %u, seq %u) was applied already: answered, not "
                "applied again", p->push_worker, p->push_seq);
        qr__ckpt_applied(ps, p); /* this part of the call is in the shard (a cut counts it) */
        answer_after_backup(p, f, answer);
        return;
    }
    if (check_items(p, f, &a) || prepare_tensors(p, f, &a)) {
        qr__recv_pool_put(&ps->recv_pool, a.wide, a.wide_cap);
        return;
    }
    bool values = f->flags & QR_PUSH_REPLY_VALUES;
    a.ack_first = can_ack_first(p) && !values && !qr__replica_on(ps);
    if (a.ack_first) qr__peer_reply_step(p, f, ps->global_step + (step && counts_global_step(p)));
    bool forwarded = forward_before_apply(p, &a);
    if (forwarded) /* with the step count_step makes */
        forward(p, f, &a, ps->global_step + (step && counts_global_step(p)));
    int rc = QR_OK;
    for (int i = 0; i < p->nitems && !rc; i++)
        if (!p->items[i].skip) rc = apply_item(ps, &p->items[i], &a);
    qr__recv_pool_put(&ps->recv_pool, a.save, a.save_cap);
    qr__recv_pool_put(&ps->recv_pool, a.wide, a.wide_cap);
    if (!rc) qr__ckpt_applied(ps, p);
    /* The summaries' stale_gradients count pushes, not their variables. */
    if (!rc && a.stale) ps->stale_pushes_applied++;
    if (!rc && step) rc = count_step(p);
    if (rc && a.ack_first) {
        qr__log(QR_LOG_ERROR, "acknowledged push not applied: %s", qr_last_error());
        return;
    }
    if (rc && forwarded) { /* the backup applies what this copy did not */
        char msg[512];
        snprintf(msg, sizeof msg, "a push forwarded to the backup was not applied here, so the "
                 "copies would differ: %s", qr_last_error());
        qr__peer_reply_error(p, f, rc, msg);
        qr__ps_ask_abort(ps, QR_EABORTED, msg);
        return;
    }
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", qr_last_error());
        qr__peer_reply_error(p, f, rc, msg);
        return;
    }
    if (qr__replica_on(ps)) { /* a promoted shard's: to its copy, if one is being made */
        if (!forwarded) forward(p, f, &a, ps->global_step);
        answer_after_backup(p, f, ps->global_step);
    } else if (values) {
        qr__pull_reply_values(p, f, false, &ps->global_step);
    } else if (!a.ack_first) {
        qr__peer_reply_step(p, f, ps->global_step);
    }
}

void qr__push_stats_json(const qr_ps *ps, cJSON *j) {
    cJSON *hist = cJSON_AddArrayToObject(j, "staleness");
    for (int i = 0; i < QR_STALENESS_BUCKETS; i++)
        cJSON_AddItemToArray(hist, cJSON_CreateNumber((double)ps->staleness_hist[i]));
    cJSON_AddNumberToObject(j, "stale_pushes_applied", (double)ps->stale_pushes_applied);
    cJSON_AddNumberToObject(j, "applied_on_arrival", (double)ps->fused_pushes);
    cJSON_AddNumberToObject(j, "rebased_on_arrival", (double)ps->fused_rebases);
    /* the payload bytes of the pushes and pulls served: what a narrower
     * wire (qr_worker_set_dtype) saves */
    cJSON_AddNumberToObject(j, "push_bytes", (double)ps->metrics.push_bytes);
    cJSON_AddNumberToObject(j, "pull_bytes", (double)ps->metrics.pull_bytes);
}

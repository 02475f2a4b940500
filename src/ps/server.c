/*
 * server.c - a ps task: serves the variables placed on it to workers.
 *
 * One libuv loop thread does everything: accepts connections, decodes
 * requests, applies gradients and queues replies. Requests of one
 * connection are handled in order; the optimizer runs inside the loop
 * (spreading large applies over its own threads), so there is no lock on a
 * variable anywhere.
 *
 * A request is checked completely before it changes anything: its meta is
 * validated when it arrives (every id, size and count), its gradients are
 * checked for NaN/Inf once received, and only then applied. A request that
 * fails any check gets an error reply naming the problem, and the
 * connection keeps working. Only a frame header that cannot be trusted
 * (bad magic, version, lengths) closes that one connection, because the
 * stream can no longer be followed.
 *
 * Stop: a STOP request (from the chief) or qr_ps_stop() closes the
 * listener, answers every later request with QR_ESTOPPED, and waits up to
 * linger-ms for the workers to hang up before the loop ends.
 */
#include "ps/ps_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- replies ---------------------------------------------------------- */

static void on_reply_sent(qr_conn *c, int status, void *ctx) {
    ps_peer *p = qr_conn_data(c);
    if (p && qr_conn_paused(c) && qr_conn_pending_bytes(c) < PEER_MAX_PENDING / 2)
        qr_conn_resume(c);
}

int qr__ps_reply(ps_peer *p, const qr_frame *req, int status, const qr_wbuf *meta,
                 const qr_iov *iov, int niov, qr_send_cb cb, void *ctx) {
    qr_frame f = {0};
    f.type = (uint8_t)(req->type | QR_MSG_REPLY);
    f.request_id = req->request_id;
    f.status = status;
    int rc = qr_conn_send(p->conn, &f, meta ? meta->data : NULL, meta ? (uint32_t)meta->len : 0,
                          iov, niov, cb ? cb : on_reply_sent, ctx);
    if (rc) {
        qr__log(QR_LOG_DEBUG, "reply to %s not sent: %s", qr_conn_peer(p->conn), qr_last_error());
        if (cb) cb(p->conn, rc, ctx);
        return rc;
    }
    if (qr_conn_pending_bytes(p->conn) > PEER_MAX_PENDING) qr_conn_pause(p->conn);
    return QR_OK;
}

void qr__ps_reply_error(ps_peer *p, const qr_frame *req, int status, const char *msg) {
    qr_wbuf meta = {0};
    qr_wbuf_bytes(&meta, msg, strlen(msg));
    qr__log(QR_LOG_DEBUG, "%s from %s refused: %s", qr_msg_name(req->type),
            qr_conn_peer(p->conn), msg);
    qr__ps_reply(p, req, status, &meta, NULL, 0, NULL, NULL);
    qr_wbuf_free(&meta);
}

/* Remember a failure found while checking meta (qr__fail already wrote
 * the message); it is answered once the payload has gone by. */
static int hold_error(ps_peer *p, int status) {
    p->err = status;
    snprintf(p->errmsg, sizeof p->errmsg, "%s: %s", p->ps->name, qr_last_error());
    return QR_OK;
}

/* ---- request checks ------------------------------------------------------ */

static int ensure_items(ps_peer *p, uint32_t n) {
    if ((int)n <= p->items_cap) return QR_OK;
    push_item *grown = realloc(p->items, n * sizeof *grown);
    if (!grown) return qr__fail(QR_ENOMEM, "out of memory for %u items", n);
    p->items = grown;
    p->items_cap = (int)n;
    return QR_OK;
}

/* The request's receive buffer, from the ps's pool; given back as soon
 * as the request is done with it (release_recv), so the next push, from
 * any worker, lands in the same hot buffer. */
static void release_recv(ps_peer *p) {
    for (int i = 0; i < p->nitems; i++) qr__fused_end(p->ps, &p->items[i]);
    qr__recv_pool_put(&p->ps->recv_pool, p->recv, p->recv_cap);
    p->recv = NULL;
    p->recv_cap = 0;
}

static int take_recv(ps_peer *p, size_t bytes) {
    release_recv(p); /* a request takes one buffer; none is held between requests */
    p->recv = qr__recv_pool_get(&p->ps->recv_pool, bytes, &p->recv_cap);
    return p->recv ? QR_OK : QR_ENOMEM;
}

static int check_count(const char *what, uint32_t count) {
    if (count == 0 || count > QR_PROTO_MAX_ITEMS)
        return qr__fail(QR_EPROTO, "%s names %u variables (1..%u allowed)", what, count,
                        QR_PROTO_MAX_ITEMS);
    return QR_OK;
}

static int check_end(const char *what, const qr_rbuf *r, uint64_t described,
                     uint64_t payload_len) {
    if (r->bad) return qr__fail(QR_EPROTO, "%s meta is truncated", what);
    if (r->left) return qr__fail(QR_EPROTO, "%s meta has %zu unexpected trailing bytes", what, r->left);
    if (described != payload_len)
        return qr__fail(QR_EPROTO, "%s describes %llu payload bytes but carries %llu", what,
                        (unsigned long long)described, (unsigned long long)payload_len);
    return QR_OK;
}

static int lookup(ps_peer *p, const char *what, uint32_t id, qr_var **out) {
    qr_var *v = qr_store_get(&p->ps->store, id);
    if (!v)
        return qr__fail(p->ps->ready ? QR_ENOTFOUND : QR_ENOTREADY,
                        "%s: no variable with id %u on this ps%s", what, id,
                        p->ps->ready ? "" : " (not initialized yet)");
    if (v->mark == p->ps->mark)
        return qr__fail(QR_EINVAL, "%s names variable '%s' twice", what, v->name);
    v->mark = p->ps->mark;
    *out = v;
    return QR_OK;
}

/* Where an async push's payload lands: the items applied as they arrive
 * (fused_apply.c) each in a buffer of their own, the others one after
 * another in the request's buffer. */
static uint64_t item_bytes(const ps_peer *p, int i, const qr_frame *f) {
    return (i + 1 < p->nitems ? p->items[i + 1].offset : f->payload_len) - p->items[i].offset;
}

static int expect_push(ps_peer *p, const qr_frame *f) {
    bool delta = f->flags & QR_PUSH_DELTA;
    uint64_t shared = 0;
    int nfused = 0;
    for (int i = 0; i < p->nitems; i++) {
        if (qr__fused_eligible(p->ps, &p->items[i], delta)) nfused++;
        else shared += item_bytes(p, i, f);
    }
    /* A push of fused items only needs no request buffer. */
    int rc = QR_OK;
    if (shared || nfused < p->nitems) rc = take_recv(p, shared);
    else release_recv(p);
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

static int push_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    uint32_t count = qr_rbuf_u32(&r);
    int64_t local_step = qr_rbuf_i64(&r);
    uint32_t worker = qr_rbuf_u32(&r);
    uint32_t seq = qr_rbuf_u32(&r);
    if (r.bad) return qr__fail(QR_EPROTO, "PUSH meta is truncated");
    bool sync = f->flags & QR_PUSH_SYNC;
    p->push_worker = worker;
    if (sync && (f->flags & QR_PUSH_DELTA))
        return qr__fail(QR_EINVAL, "PUSH: delta pushes are for async training");
    if (sync != p->ps->sync.on)
        return qr__fail(QR_EINVAL, "PUSH: a %s push, but this ps trains in %s mode",
                        sync ? "synchronous" : "asynchronous", p->ps->sync.on ? "sync" : "async");
    /* A push of no variables is allowed: it only advances the step. */
    int rc = count ? check_count("PUSH", count) : QR_OK;
    if (!rc) rc = ensure_items(p, count);
    if (rc) return rc;
    uint64_t offset = 0;
    p->ps->mark++;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t id = qr_rbuf_u32(&r);
        uint32_t kind = qr_rbuf_u32(&r);
        uint64_t nbytes = qr_rbuf_u64(&r);
        uint64_t version = qr_rbuf_u64(&r);
        if (r.bad) return qr__fail(QR_EPROTO, "PUSH meta is truncated at item %u", i);
        qr_var *v = NULL;
        if ((rc = lookup(p, "PUSH", id, &v))) return rc;
        int64_t nrows = -1;
        if (kind == QR_GRAD_SPARSE) {
            if (sync)
                return qr__fail(QR_EINVAL, "PUSH: variable '%s': sparse gradients are for async "
                                "training", v->name);
            uint64_t row_bytes = 8 + 4 * (uint64_t)v->shape[v->ndim - 1];
            if (nbytes % row_bytes)
                return qr__fail(QR_ESHAPE, "PUSH: sparse gradient of '%s': %llu bytes is not a "
                                "whole number of (index, row of %lld floats) pairs", v->name,
                                (unsigned long long)nbytes, (long long)v->shape[v->ndim - 1]);
            nrows = (int64_t)(nbytes / row_bytes);
        } else if (kind != QR_GRAD_DENSE) {
            return qr__fail(QR_EINVAL, "PUSH: variable '%s': gradient kind %u is not supported "
                            "(0 dense, 1 sparse rows)", v->name, kind);
        } else if (nbytes != (uint64_t)v->n * sizeof(float)) {
            char shape[128];
            qr_shape_str(v->ndim, v->shape, shape, sizeof shape);
            return qr__fail(QR_ESHAPE,
                            "PUSH: variable '%s' has shape %s (%lld floats) but the gradient "
                            "has %llu bytes", v->name, shape, (long long)v->n,
                            (unsigned long long)nbytes);
        }
        p->items[i] = (push_item){.var = v, .offset = offset, .version = version, .nrows = nrows};
        offset += nbytes;
    }
    p->nitems = (int)count;
    rc = check_end("PUSH", &r, offset, f->payload_len);
    if (!rc && sync) return qr__sync_push_header(p, f, worker, seq, local_step);
    return rc ? rc : expect_push(p, f);
}

static void reply_ok_step(ps_peer *p, const qr_frame *f, int64_t global_step) {
    qr_wbuf meta = {0};
    qr_wbuf_i64(&meta, global_step);
    qr__ps_reply(p, f, QR_OK, &meta, NULL, 0, NULL, NULL);
    qr_wbuf_free(&meta);
}

float qr__ps_lr(const qr_ps *ps, const qr_var *v, const qr_optim *opt, int64_t step) {
    float lr = v->lr >= 0 ? v->lr : qr_optim_lr(opt);
    return qr_optim_decayed_lr(lr, step, ps->lr_decay_rate, ps->lr_decay_steps,
                               ps->lr_decay_staircase);
}

static int staleness_bucket(uint64_t s) {
    if (s < 4) return (int)s;
    int b = 4;
    for (uint64_t lim = 8; s >= lim && b < QR_STALENESS_BUCKETS - 1; lim *= 2) b++;
    return b;
}

/* Apply one checked item of an async push to its variable (after the
 * tensors it writes were made exclusive); a dense SGD-style apply reports
 * its learning rate in *lr_used. On failure msg says why. */
static int apply_item(qr_ps *ps, push_item *it, bool delta, uint64_t staleness, int64_t t,
                      float *lr_used, char *msg, size_t msgsz) {
    qr_var *v = it->var;
    const float *g = (const float *)it->data;
    int rc;
    if (it->nrows >= 0) {
        int64_t dim = v->shape[v->ndim - 1];
        const uint8_t *raw = it->data;
        /* The indices sit wherever the payload put them: copy them to an
         * aligned array for the optimizer. */
        int64_t *idx = malloc((size_t)QR_MAX(it->nrows, 1) * 8);
        if (!idx) {
            snprintf(msg, msgsz, "out of memory applying a sparse gradient");
            return QR_ENOMEM;
        }
        if (it->nrows) memcpy(idx, raw, (size_t)it->nrows * 8);
        const float *rows = (const float *)(raw + 8 * it->nrows);
        const qr_optim *sopt = qr__var_optim(ps, v);
        rc = delta ? QR_OK
                   : qr_optim_apply_sparse(sopt, v->slots, v->value->data, v->n / dim, dim, idx,
                                           rows, it->nrows, qr__ps_lr(ps, v, sopt, t - 1), t);
        if (delta)
            for (int64_t k = 0; k < it->nrows; k++)
                for (int64_t e = 0; e < dim; e++) v->value->data[idx[k] * dim + e] += rows[k * dim + e];
        free(idx);
    } else if (delta) {
        const float *w = v->value->data;
        float *out = it->to_spare ? v->spare->data : v->value->data;
        for (int64_t k = 0; k < v->n; k++) out[k] = w[k] + g[k];
        if (it->to_spare) qr_var_swap_spare(v);
        rc = QR_OK;
    } else {
        const qr_optim *opt = qr__var_optim(ps, v);
        float lr = qr__ps_lr(ps, v, opt, t - 1);
        if (ps->staleness_lr_scale && staleness) lr /= (float)(1 + staleness);
        *lr_used = lr;
        rc = it->to_spare
                 ? qr_optim_apply_dense_to(opt, v->spare->data, v->value->data, g, v->n, lr)
                 : qr_optim_apply_dense(opt, v->slots, v->value->data, g, v->n, lr, t);
        if (!rc && it->to_spare) qr_var_swap_spare(v);
    }
    if (rc) snprintf(msg, msgsz, "%s: applying to '%s': %s", ps->name, v->name, qr_last_error());
    return rc;
}

static void push_message(ps_peer *p, const qr_frame *f) {
    qr_ps *ps = p->ps;
    /* Check every gradient before touching any variable. The NaN/Inf scan
     * ran while the payload arrived; this finishes it. */
    qr__grad_check_finish(&p->check, f->payload_len);
    for (int i = 0; i < p->nitems; i++) {
        push_item *it = &p->items[i];
        if (it->nrows >= 0) {
            /* Sparse: every index in range, before anything changes. */
            int64_t rows = it->var->n / it->var->shape[it->var->ndim - 1];
            const uint8_t *idx = it->data;
            for (int64_t k = 0; k < it->nrows; k++) {
                int64_t row;
                memcpy(&row, idx + 8 * k, 8);
                if (row < 0 || row >= rows) {
                    char msg[400];
                    snprintf(msg, sizeof msg, "%s: PUSH: sparse gradient of '%s': row index "
                             "%lld is out of range [0, %lld); nothing was applied", ps->name,
                             it->var->name, (long long)row, (long long)rows);
                    qr__ps_reply_error(p, f, QR_EINVAL, msg);
                    return;
                }
            }
        }
        if (!it->nonfinite) continue;
        if (!ps->skip_nonfinite) {
            char msg[400];
            snprintf(msg, sizeof msg, "%s: PUSH: the gradient of variable '%s' contains NaN or "
                     "Inf; nothing was applied (set nonfinite=skip to skip such gradients)",
                     ps->name, it->var->name);
            qr__ps_reply_error(p, f, QR_ENONFINITE, msg);
            return;
        }
        it->skip = true;
        it->var->nonfinite_skipped++;
    }
    bool delta = f->flags & QR_PUSH_DELTA;
    /* A tensor still referenced by a pull reply must be copied before it
     * changes. Replies lent to the kernel (conn.h) hold it until their
     * worker is known to have read them: ask every connection now, so a
     * reply read since does not cost a copy. */
    bool shared = false;
    for (int i = 0; i < p->nitems; i++) shared |= !p->items[i].skip && p->items[i].var->value->refs > 1;
    if (shared)
        for (ps_peer *q = ps->peers; q; q = q->next) qr_conn_reclaim(q->conn);
    size_t save_floats = 0; /* for rebasing another push's fused apply */
    for (int i = 0; i < p->nitems; i++) {
        push_item *it = &p->items[i];
        if (it->skip) continue;
        qr_var *v = it->var;
        if (it->fused) {
            if (qr__fused_prepare(it)) {
                qr__ps_reply_error(p, f, QR_ENOMEM, "out of memory applying a gradient");
                return;
            }
            continue;
        }
        if (v->fused_out && !qr__fused_can_follow(ps, it, delta))
            save_floats = QR_MAX(save_floats, (size_t)v->fused_done);
        /* A tensor a pull reply still reads is not copied and then updated
         * (two passes over it) when the update can be written straight
         * into the spare instead (one pass). */
        it->to_spare = it->nrows < 0 && v->value->refs > 1 &&
                       (delta || qr_optim_stateless(qr__var_optim(ps, v)));
        if (it->to_spare ? qr_var_prepare_spare(v) : qr_var_prepare_write(v)) {
            qr__ps_reply_error(p, f, QR_ENOMEM, "out of memory applying a gradient");
            return;
        }
    }
    size_t save_cap = 0;
    float *save = save_floats ? qr__recv_pool_get(&ps->recv_pool, save_floats * sizeof *save,
                                                  &save_cap)
                              : NULL;
    if (save_floats && !save) {
        qr__ps_reply_error(p, f, QR_ENOMEM, "out of memory applying a gradient");
        return;
    }
    int64_t t = ps->applied_steps + 1;
    /* Everything is checked and every tensor to write is exclusive: a
     * dense apply cannot fail now. Acknowledge before applying, so the
     * worker's next request travels while the ps applies. Nothing else is
     * served until the apply is done (one loop thread), so every later
     * request of every worker sees it. Sparse items and moving averages
     * may still need memory, so they are acknowledged after. */
    bool ack_first = ps->average_decay == 0;
    for (int i = 0; i < p->nitems; i++) ack_first &= p->items[i].nrows < 0;
    if (ack_first)
        reply_ok_step(p, f, ps->global_step + ((f->flags & QR_PUSH_STEP) && ps->index == 0));
    for (int i = 0; i < p->nitems; i++) {
        push_item *it = &p->items[i];
        if (it->skip) continue;
        qr_var *v = it->var;
        /* Staleness: how many updates this variable took since the worker
         * pulled the version its gradient was computed at. */
        uint64_t staleness = v->version > it->version ? v->version - it->version : 0;
        ps->staleness_hist[staleness_bucket(staleness)]++;
        if (it->fused) { /* computed while it arrived */
            qr__fused_install(it);
            v->version++;
            ps->fused_pushes++;
            continue;
        }
        /* Another push's fused apply read v's value, which this changes. */
        bool follow = v->fused_out && v->fused_done > 0;
        bool direct = qr__fused_can_follow(ps, it, delta);
        if (follow && !direct) qr__fused_save(v, save);
        char msg[400];
        float lr = 0;
        int rc = apply_item(ps, it, delta, staleness, t, &lr, msg, sizeof msg);
        if (follow && !rc) {
            if (direct) qr__fused_follow(v, (const float *)it->data, delta ? -1.0f : lr);
            else qr__fused_rebase(v, save);
            ps->fused_rebases++;
        }
        if (rc) {
            qr__recv_pool_put(&ps->recv_pool, save, save_cap);
            if (ack_first) qr__log(QR_LOG_ERROR, "acknowledged push not applied: %s", msg);
            else qr__ps_reply_error(p, f, rc, msg);
            return;
        }
        v->version++;
    }
    qr__recv_pool_put(&ps->recv_pool, save, save_cap);
    if (f->flags & QR_PUSH_STEP) {
        ps->applied_steps++;
        if (ps->average_decay > 0) {
            for (int i = 0; i < p->nitems; i++)
                if (qr_var_update_average(p->items[i].var, ps->average_decay, ps->applied_steps)) {
                    qr__ps_reply_error(p, f, QR_ENOMEM, "out of memory updating an average");
                    return;
                }
        }
        if (ps->index == 0) {
            ps->global_step++;
            if (p->push_worker < (uint32_t)ps->cluster->nworkers) ps->clock[p->push_worker]++;
            qr__bound_update(ps);
        }
    }
    if (!ack_first) reply_ok_step(p, f, ps->global_step);
}

static int pull_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    uint32_t count = qr_rbuf_u32(&r);
    if (r.bad) return qr__fail(QR_EPROTO, "PULL meta is truncated");
    int rc = check_count("PULL", count);
    if (!rc) rc = ensure_items(p, count);
    if (rc) return rc;
    p->ps->mark++;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t id = qr_rbuf_u32(&r);
        if (r.bad) return qr__fail(QR_EPROTO, "PULL meta is truncated at item %u", i);
        qr_var *v = NULL;
        if ((rc = lookup(p, "PULL", id, &v))) return rc;
        if ((f->flags & QR_PULL_AVERAGES) && !v->average)
            return qr__fail(QR_ENOTFOUND, "PULL: variable '%s' has no moving average "
                            "(moving-average-decay is 0, or moving-average-vars leaves it out)",
                            v->name);
        p->items[i] = (push_item){.var = v};
    }
    p->nitems = (int)count;
    return check_end("PULL", &r, 0, f->payload_len);
}

typedef struct pull_refs {
    int n;
    qr_tensor *t[];
} pull_refs;

static void on_pull_sent(qr_conn *c, int status, void *ctx) {
    pull_refs *refs = ctx;
    for (int i = 0; i < refs->n; i++) qr_tensor_unref(refs->t[i]);
    free(refs);
    on_reply_sent(c, status, NULL);
}

static void pull_message(ps_peer *p, const qr_frame *f) {
    int n = p->nitems;
    pull_refs *refs = malloc(sizeof *refs + (size_t)n * sizeof(qr_tensor *));
    qr_iov *iov = malloc((size_t)n * sizeof *iov);
    if (!refs || !iov) {
        free(refs);
        free(iov);
        qr__ps_reply_error(p, f, QR_ENOMEM, "out of memory answering a pull");
        return;
    }
    qr_wbuf meta = {0};
    qr_wbuf_u32(&meta, (uint32_t)n);
    refs->n = n;
    for (int i = 0; i < n; i++) {
        qr_var *v = p->items[i].var;
        qr_wbuf_u32(&meta, v->id);
        qr_wbuf_u32(&meta, 0);
        qr_wbuf_u64(&meta, (uint64_t)v->n * sizeof(float));
        qr_wbuf_u64(&meta, v->version);
        /* The reply holds a reference: a later apply copies instead of
         * changing bytes that are still being written. */
        qr_tensor *t = (f->flags & QR_PULL_AVERAGES) ? v->average : v->value;
        refs->t[i] = qr_tensor_ref(t);
        iov[i] = (qr_iov){t->data, (size_t)v->n * sizeof(float)};
    }
    if (meta.oom) {
        on_pull_sent(p->conn, QR_ENOMEM, refs);
        qr__ps_reply_error(p, f, QR_ENOMEM, "out of memory");
    } else if (qr__ps_reply(p, f, QR_OK, &meta, iov, n, on_pull_sent, refs) == QR_OK &&
               qr_conn_all_written(p->conn)) {
        /* The kernel has the bytes already (the usual case when the reply
         * fits the socket buffer): drop the references now, so a push
         * handled before the deferred callback need not copy the tensor. */
        for (int i = 0; i < n; i++) qr_tensor_unref(refs->t[i]);
        refs->n = 0;
    }
    qr_wbuf_free(&meta);
    free(iov);
}

/* CREATE: the chief's variables, with their initial values; or, with
 * QR_CREATE_CHECK_ONLY, another worker's declarations to check. */
static void drop_created(ps_peer *p) {
    for (int i = 0; i < p->ncreated; i++) qr_var_free(p->created[i]);
    free(p->created);
    p->created = NULL;
    p->ncreated = 0;
}

static int create_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    bool check_only = f->flags & QR_CREATE_CHECK_ONLY;
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    uint32_t count = qr_rbuf_u32(&r);
    if (r.bad) return qr__fail(QR_EPROTO, "CREATE meta is truncated");
    int rc = check_count("CREATE", count);
    if (rc) return rc;
    p->created = qr__calloc(count, sizeof *p->created);
    qr_iov *iov = qr__calloc(count, sizeof *iov);
    if (!p->created || !iov) {
        free(iov);
        return QR_ENOMEM;
    }
    uint64_t described = 0, largest_existing = 0;
    int niov = 0;
    ps->mark++;
    for (uint32_t i = 0; i < count && !rc; i++) {
        uint32_t id = qr_rbuf_u32(&r);
        uint32_t ndim = qr_rbuf_u32(&r);
        int64_t shape[QR_PROTO_MAX_NDIM] = {0};
        if (ndim < 1 || ndim > QR_PROTO_MAX_NDIM) {
            rc = qr__fail(QR_EINVAL, "CREATE: variable id %u has %u dimensions (1..%d allowed)",
                          id, ndim, QR_PROTO_MAX_NDIM);
            break;
        }
        int64_t n = 1;
        for (uint32_t d = 0; d < ndim; d++) {
            shape[d] = qr_rbuf_i64(&r);
            if (!r.bad && (shape[d] < 1 || shape[d] > QR_MAX_VAR_ELEMS / n)) {
                rc = qr__fail(QR_EINVAL, "CREATE: variable id %u: dimension %u is %lld "
                              "(must be >= 1, and the size at most %lld elements)",
                              id, d, (long long)shape[d], (long long)QR_MAX_VAR_ELEMS);
                break;
            }
            n *= shape[d] > 0 ? shape[d] : 1;
        }
        if (rc) break;
        float lr = qr_rbuf_f32(&r);
        uint32_t name_len = qr_rbuf_u32(&r);
        if (!r.bad && (name_len < 1 || name_len > QR_PROTO_MAX_NAME)) {
            rc = qr__fail(QR_EINVAL, "CREATE: variable id %u: name of %u bytes (1..%d allowed)",
                          id, name_len, QR_PROTO_MAX_NAME);
            break;
        }
        const uint8_t *name_bytes = qr_rbuf_bytes(&r, name_len);
        uint32_t opts_len = qr_rbuf_u32(&r);
        if (!r.bad && opts_len > 1024) {
            rc = qr__fail(QR_EINVAL, "CREATE: variable id %u: options of %u bytes (1024 allowed)",
                          id, opts_len);
            break;
        }
        const uint8_t *opts_bytes = qr_rbuf_bytes(&r, opts_len);
        if (r.bad) {
            rc = qr__fail(QR_EPROTO, "CREATE meta is truncated at item %u", i);
            break;
        }
        char name[QR_PROTO_MAX_NAME + 1], opts[1025];
        memcpy(name, name_bytes, name_len);
        name[name_len] = 0;
        if (opts_len) memcpy(opts, opts_bytes, opts_len);
        opts[opts_len] = 0;
        if (strlen(name) != name_len || strlen(opts) != opts_len || !isfinite(lr) ||
            id >= QR_MAX_VAR_ID) {
            rc = qr__fail(QR_EINVAL, "CREATE: variable id %u: invalid name, id or learning rate", id);
            break;
        }
        char want[128];
        qr_shape_str((int)ndim, shape, want, sizeof want);
        /* Before anything is allocated: a request of a few hundred bytes
         * must not make the ps zero gigabytes it never gets values for. */
        if (!check_only && described + (uint64_t)n * 4 > f->payload_len) {
            rc = qr__fail(QR_EPROTO, "CREATE: variable '%s' %s needs %llu bytes of initial "
                          "values but the payload has %llu bytes in all", name, want,
                          (unsigned long long)n * 4, (unsigned long long)f->payload_len);
            break;
        }
        qr_var *old = qr_store_get(&ps->store, id);
        qr_var *same_name = qr_store_find_name(&ps->store, name);
        if (old || same_name) {
            char have[128];
            qr_var *o = old ? old : same_name;
            qr_shape_str(o->ndim, o->shape, have, sizeof have);
            if (o != old || o != same_name || o->ndim != (int)ndim ||
                memcmp(o->shape, shape, sizeof shape) || strcmp(o->options, opts)) {
                rc = qr__fail(QR_EEXIST, "CREATE: variable '%s' %s (id %u, options '%s') "
                              "conflicts with existing variable '%s' %s (id %u, options '%s'): "
                              "do all workers declare the same variables in the same order?",
                              name, want, id, opts, o->name, have, o->id, o->options);
                break;
            }
            if (o->mark == ps->mark) {
                rc = qr__fail(QR_EINVAL, "CREATE names variable '%s' twice", name);
                break;
            }
            o->mark = ps->mark;
            /* Created already (a restarted chief): keep its values. */
            if (!check_only) {
                described += (uint64_t)n * 4;
                largest_existing = QR_MAX(largest_existing, (uint64_t)n * 4);
                iov[niov++] = (qr_iov){NULL, (size_t)n * 4};
            }
            continue;
        }
        if (check_only) {
            rc = qr__fail(QR_ENOTREADY, "variable '%s' %s (id %u) does not exist on this ps: "
                          "has the chief initialized it?", name, want, id);
            break;
        }
        for (int j = 0; j < p->ncreated; j++)
            if (p->created[j]->id == id || !strcmp(p->created[j]->name, name)) {
                rc = qr__fail(QR_EINVAL, "CREATE names variable '%s' (id %u) twice", name, id);
                break;
            }
        if (rc) break;
        qr_var *v = qr__calloc(1, sizeof *v);
        if (!v) {
            rc = QR_ENOMEM;
            break;
        }
        p->created[p->ncreated++] = v;
        v->id = id;
        v->name = qr__strdup(name);
        v->ndim = (int)ndim;
        memcpy(v->shape, shape, sizeof shape);
        v->n = n;
        v->lr = lr;
        v->value = qr_tensor_new(n);
        v->options = qr__strdup(opts);
        int64_t dim = shape[ndim - 1], rows = n / dim;
        if (!v->name || !v->value || !v->options) {
            rc = QR_ENOMEM;
            break;
        }
        if (opts[0]) {
            rc = qr_optim_create_for_var(&v->optim, ps->cfg, opts);
            if (rc) {
                qr__error_prefix("CREATE: variable '%s': ", name);
                break;
            }
        }
        rc = qr_optim_slots_create(qr__var_optim(ps, v), rows, dim, &v->slots);
        if (rc) break;
        described += (uint64_t)n * 4;
        iov[niov++] = (qr_iov){v->value->data, (size_t)n * 4};
        if (ps->average_decay > 0 &&
            (!ps->average_vars[0] || qr__list_has(ps->average_vars, ',', name))) {
            v->average = qr_tensor_new(n); /* filled with the initial values below */
            if (!v->average) {
                rc = QR_ENOMEM;
                break;
            }
        }
    }
    if (!rc) rc = check_end("CREATE", &r, described, f->payload_len);
    if (!rc && largest_existing) {
        /* Values of variables that exist already are read and dropped. */
        rc = take_recv(p, largest_existing);
        for (int i = 0; i < niov && !rc; i++)
            if (!iov[i].base) iov[i].base = p->recv;
    }
    if (!rc) rc = qr_conn_expect(p->conn, iov, niov);
    free(iov);
    return rc;
}

static void create_message(ps_peer *p, const qr_frame *f) {
    qr_ps *ps = p->ps;
    for (int i = 0; i < p->ncreated; i++) {
        qr_var *v = p->created[i];
        if (!qr_optim_all_finite(v->value->data, v->n)) {
            char msg[400];
            snprintf(msg, sizeof msg, "%s: CREATE: initial value of '%s' contains NaN or Inf",
                     ps->name, v->name);
            drop_created(p);
            qr__ps_reply_error(p, f, QR_ENONFINITE, msg);
            return;
        }
    }
    for (int i = 0; i < p->ncreated; i++) {
        qr_var *v = p->created[i];
        if (v->average) memcpy(v->average->data, v->value->data, (size_t)v->n * sizeof(float));
        if (qr_store_add(&ps->store, p->created[i])) {
            char msg[400];
            snprintf(msg, sizeof msg, "%s: CREATE: %s", ps->name, qr_last_error());
            qr_var_free(p->created[i]);
            for (int j = i + 1; j < p->ncreated; j++) qr_var_free(p->created[j]);
            free(p->created);
            p->created = NULL;
            p->ncreated = 0;
            qr__ps_reply_error(p, f, QR_EINTERNAL, msg);
            return;
        }
        qr__log(QR_LOG_DEBUG, "created variable '%s' (id %u, %lld floats)", p->created[i]->name,
                p->created[i]->id, (long long)p->created[i]->n);
    }
    free(p->created);
    p->created = NULL;
    p->ncreated = 0;
    qr__ps_reply(p, f, QR_OK, NULL, NULL, 0, NULL, NULL);
}

static int small_header(ps_peer *p, const qr_frame *f, const uint8_t *meta, uint32_t meta_len) {
    if (f->meta_len != meta_len || f->payload_len)
        return qr__fail(QR_EPROTO, "%s carries %u meta and %llu payload bytes (expected %u and 0)",
                        qr_msg_name(f->type), f->meta_len, (unsigned long long)f->payload_len,
                        meta_len);
    return QR_OK;
}

/* The ps's statistics as one JSON object: the staleness histogram of
 * async pushes here, and on ps 0 of a sync run the coordinator's figures. */
static void stats_message(ps_peer *p, const qr_frame *f) {
    qr_ps *ps = p->ps;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "ps", ps->index);
    cJSON *hist = cJSON_AddArrayToObject(j, "staleness");
    for (int i = 0; i < QR_STALENESS_BUCKETS; i++)
        cJSON_AddItemToArray(hist, cJSON_CreateNumber((double)ps->staleness_hist[i]));
    cJSON_AddNumberToObject(j, "applied_on_arrival", (double)ps->fused_pushes);
    cJSON_AddNumberToObject(j, "rebased_on_arrival", (double)ps->fused_rebases);
    if (ps->sync.on && ps->index == 0) qr__coord_stats_json(ps, j);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    qr_wbuf out = {0};
    if (text) qr_wbuf_bytes(&out, text, strlen(text));
    free(text);
    qr__ps_reply(p, f, QR_OK, &out, NULL, 0, NULL, NULL);
    qr_wbuf_free(&out);
}

/* COMMIT and TOKEN go to ps 0, in synchronous mode. */
static int coord_only(ps_peer *p, const qr_frame *f) {
    if (!p->ps->sync.on)
        return qr__fail(QR_EINVAL, "%s: this ps trains in async mode", qr_msg_name(f->type));
    if (p->ps->index != 0)
        return qr__fail(QR_EINVAL, "%s goes to ps 0, not ps %d", qr_msg_name(f->type),
                        p->ps->index);
    return QR_OK;
}

static int apply_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    if (!p->ps->sync.on) return qr__fail(QR_EINVAL, "APPLY: this ps trains in async mode");
    if (p->role != QR_ROLE_COORDINATOR)
        return qr__fail(QR_EINVAL, "APPLY comes only from ps 0's coordinator");
    if (f->payload_len) return qr__fail(QR_EPROTO, "APPLY carries no payload");
    return QR_OK;
}

/* ---- connection events ------------------------------------------------- */


static int on_header(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    ps_peer *p = qr_conn_data(c);
    qr_ps *ps = p->ps;
    p->err = QR_OK;
    p->nitems = 0;
    p->check.items = NULL;
    drop_created(p);
    qr__sync_push_free(p->ps, p->incoming);
    p->incoming = NULL;
    int rc;
    if (f->type & QR_MSG_REPLY)
        rc = qr__fail(QR_EPROTO, "a ps does not accept %s replies", qr_msg_name(f->type));
    else if (ps->stopping && f->type != QR_MSG_STOP)
        rc = qr__fail(QR_ESTOPPED, "the ps is stopping: training is over");
    else {
        switch (f->type) {
        case QR_MSG_HELLO: rc = small_header(p, f, meta, 12); break;
        case QR_MSG_READY: rc = small_header(p, f, meta, 12); break;
        case QR_MSG_COMMIT: rc = coord_only(p, f) ? QR_EINVAL : small_header(p, f, meta, 16); break;
        case QR_MSG_TOKEN: rc = coord_only(p, f) ? QR_EINVAL : small_header(p, f, meta, 4); break;
        case QR_MSG_STATS: rc = small_header(p, f, meta, 0); break;
        case QR_MSG_APPLY: rc = apply_header(p, f, meta); break;
        case QR_MSG_CLOCK:
            if (ps->sync.on || ps->index != 0 || ps->max_staleness < 0)
                rc = qr__fail(QR_EINVAL, "CLOCK goes to ps 0 of an async run with max-staleness");
            else
                rc = small_header(p, f, meta, 12);
            break;
        case QR_MSG_STEP: rc = small_header(p, f, meta, 0); break;
        case QR_MSG_STOP: rc = small_header(p, f, meta, 0); break;
        case QR_MSG_PUSH: rc = push_header(p, f, meta); break;
        case QR_MSG_PULL: rc = pull_header(p, f, meta); break;
        case QR_MSG_CREATE: rc = create_header(p, f, meta); break;
        default: rc = qr__fail(QR_EPROTO, "unexpected message type %u", f->type);
        }
    }
    if (rc) {
        drop_created(p);
        hold_error(p, rc);
    }
    return QR_OK;
}

static void on_message(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    ps_peer *p = qr_conn_data(c);
    qr_ps *ps = p->ps;
    if (p->err) {
        qr__ps_reply_error(p, f, p->err, p->errmsg);
        release_recv(p);
        return;
    }
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_wbuf out = {0};
    switch (f->type) {
    case QR_MSG_HELLO: {
        uint32_t role = qr_rbuf_u32(&r);
        uint32_t index = qr_rbuf_u32(&r);
        uint32_t mode = qr_rbuf_u32(&r);
        if (role == QR_ROLE_WORKER && !qr__is_worker(index, ps->cluster->nworkers)) {
            qr__ps_reply_error(p, f, QR_EINVAL, "HELLO: no such worker index");
            break;
        }
        if (role == QR_ROLE_WORKER && (mode != 0) != ps->sync.on) {
            char msg[256];
            snprintf(msg, sizeof msg, "%s: worker %u trains in %s mode but the ps in %s mode: "
                     "give every task the same --mode", ps->name, index, mode ? "sync" : "async",
                     ps->sync.on ? "sync" : "async");
            qr__ps_reply_error(p, f, QR_EINVAL, msg);
            break;
        }
        p->role = (int)role;
        if (role == QR_ROLE_WORKER) {
            p->worker_index = (int)index;
            qr__log(QR_LOG_DEBUG, "worker %d connected from %s (%s)", p->worker_index,
                    qr_conn_peer(c), qr_conn_kind(c));
            ps->worker_conns[p->worker_index]++;
        }
        qr__ps_reply(p, f, QR_OK, NULL, NULL, 0, NULL, NULL);
        break;
    }
    case QR_MSG_READY: {
        uint32_t set = qr_rbuf_u32(&r);
        int64_t step_limit = qr_rbuf_i64(&r);
        if (set && !ps->ready) {
            ps->ready = true;
            if (ps->sync.on && ps->index == 0) qr__coord_ready(ps, step_limit);
        }
        qr_wbuf_u32(&out, ps->ready);
        qr_wbuf_i64(&out, ps->global_step);
        qr__ps_reply(p, f, QR_OK, &out, NULL, 0, NULL, NULL);
        break;
    }
    case QR_MSG_COMMIT: qr__coord_commit(p, f, meta); break;
    case QR_MSG_TOKEN: qr__coord_token(p, f); break;
    case QR_MSG_STATS: stats_message(p, f); break;
    case QR_MSG_CLOCK: qr__bound_clock(p, f, meta); break;
    case QR_MSG_APPLY: qr__sync_apply_message(p, f, meta); break;
    case QR_MSG_STEP:
        qr_wbuf_i64(&out, ps->global_step);
        qr__ps_reply(p, f, QR_OK, &out, NULL, 0, NULL, NULL);
        break;
    case QR_MSG_STOP:
        qr__ps_reply(p, f, QR_OK, NULL, NULL, 0, NULL, NULL);
        qr__log(QR_LOG_INFO, "stop requested by %s", p->worker_index >= 0 ? "a worker" : "a peer");
        qr__ps_begin_stop(ps);
        break;
    case QR_MSG_PUSH:
        if (f->flags & QR_PUSH_SYNC) qr__sync_push_message(p, f);
        else push_message(p, f);
        break;
    case QR_MSG_PULL: pull_message(p, f); break;
    case QR_MSG_CREATE: create_message(p, f); break;
    }
    release_recv(p); /* every request is done with its payload by now */
    qr_wbuf_free(&out);
}

/* More of a push's payload is in: check the new part while it is hot. */
static void on_payload(qr_conn *c, uint64_t got) {
    ps_peer *p = qr_conn_data(c);
    if (p->check.items) qr__grad_check_advance(&p->check, got);
}

static void on_accepted(qr_listener *l, qr_conn *c) {
    qr_ps *ps = qr_listener_data(l);
    ps_peer *p = qr__calloc(1, sizeof *p);
    if (!p) {
        qr_conn_close(c);
        return;
    }
    p->ps = ps;
    p->conn = c;
    p->worker_index = -1;
    p->next = ps->peers;
    if (ps->peers) ps->peers->prev = p;
    ps->peers = p;
    ps->npeers++;
    qr_conn_set_data(c, p);
}


static void on_lost(qr_conn *c, int status) {
    ps_peer *p = qr_conn_data(c);
    if (!p) return;
    qr_ps *ps = p->ps;
    /* A worker that finished and one that died look alike here (both close
     * the socket). One whose machine vanished closes nothing: the
     * transport's keepalive declares it lost (QR_ETIMEDOUT), worth a word. */
    if (p->worker_index >= 0 && status == QR_ETIMEDOUT)
        qr__log(QR_LOG_WARN, "worker %d (%s) stopped answering (peer-timeout-ms): treated as "
                "gone", p->worker_index, qr_conn_peer(c));
    else if (p->worker_index >= 0 && !ps->stopping)
        qr__log(QR_LOG_DEBUG, "worker %d (%s) disconnected: %s", p->worker_index,
                qr_conn_peer(c), qr_strerror(status));
    if (p->role == QR_ROLE_WORKER && p->worker_index >= 0 &&
        --ps->worker_conns[p->worker_index] == 0)
        ps->worker_lost_ns[p->worker_index] = qr__now_ns();
    if (ps->sync.on && ps->index == 0) qr__coord_peer_lost(p);
    if (!ps->sync.on && ps->index == 0) qr__bound_peer_lost(p);
    if (p->prev) p->prev->next = p->next;
    else ps->peers = p->next;
    if (p->next) p->next->prev = p->prev;
    ps->npeers--;
    drop_created(p);
    qr__sync_push_free(p->ps, p->incoming);
    release_recv(p); /* before the items it reads */
    free(p->items);
    free(p);
    qr__ps_finish_if_idle(ps);
}

/* ---- lifecycle ---------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h) {
    (void)h;
}

static void close_loop_handles(qr_ps *ps) {
    if (!uv_is_closing((uv_handle_t *)&ps->linger_timer))
        uv_close((uv_handle_t *)&ps->linger_timer, on_handle_closed);
    if (!uv_is_closing((uv_handle_t *)&ps->stop_async))
        uv_close((uv_handle_t *)&ps->stop_async, on_handle_closed);
}

void qr__ps_finish_if_idle(qr_ps *ps) {
    /* Done once every peer has hung up and ps 0's links have delivered
     * their STOP (or given up). */
    if (!ps->stopping || ps->npeers != 0) return;
    if (ps->sync.on && ps->index == 0 && qr__coord_links_busy(ps)) return;
    if (ps->sync.on && ps->index == 0) qr__coord_free(ps);
    close_loop_handles(ps);
}

static void on_linger_timeout(uv_timer_t *t) {
    qr_ps *ps = t->data;
    if (ps->npeers)
        qr__log(QR_LOG_INFO, "closing %d connection(s) still open %d ms after the stop",
                ps->npeers, ps->linger_ms);
    for (ps_peer *p = ps->peers; p; p = p->next) qr_conn_close(p->conn);
    if (ps->sync.on && ps->index == 0) qr__coord_free(ps);
    close_loop_handles(ps);
}

void qr__ps_begin_stop(qr_ps *ps) {
    if (ps->stopping) return;
    ps->stopping = true;
    if (ps->sync.on && ps->index == 0) qr__coord_stop(ps);
    if (!ps->sync.on && ps->index == 0) qr__bound_stop(ps);
    qr_listener_close(ps->listener);
    ps->listener = NULL;
    uv_timer_start(&ps->linger_timer, on_linger_timeout, (uint64_t)ps->linger_ms, 0);
    qr__ps_finish_if_idle(ps);
}

static void on_stop_async(uv_async_t *a) {
    qr__ps_begin_stop(a->data);
}

int qr_ps_create(qr_ps **out, const qr_cluster *cluster, const qr_config *cfg) {
    if (!out || !cluster) return qr__fail(QR_EINVAL, "qr_ps_create: out and cluster are required");
    *out = NULL;
    if (strcmp(cluster->job, "ps") || cluster->task_index < 0 ||
        cluster->task_index >= cluster->nps)
        return qr__fail(QR_EINVAL, "qr_ps_create: the cluster spec does not name a ps task "
                        "(job '%s', index %d)", cluster->job, cluster->task_index);
    qr_ps *ps = qr__calloc(1, sizeof *ps);
    if (!ps) return QR_ENOMEM;
    ps->index = cluster->task_index;
    snprintf(ps->name, sizeof ps->name, "ps %d", ps->index);
    qr_store_init(&ps->store);
    int rc = qr_config_new(&ps->cfg);
    if (!rc) rc = qr__config_merge(ps->cfg, cfg);
    if (!rc) rc = qr_cluster_clone(cluster, &ps->cluster);
    if (!rc) rc = qr_optim_create(&ps->optim, ps->cfg);
    if (!rc) rc = qr__sync_init(ps);
    if (rc) {
        qr__error_prefix("ps %d: ", ps->index);
        qr_optim_free(ps->optim);
        qr_config_free(ps->cfg);
        qr_cluster_free(ps->cluster);
        free(ps);
        return rc;
    }
    ps->skip_nonfinite = !strcmp(qr__config_str(ps->cfg, "nonfinite"), "skip");
    ps->staleness_lr_scale = qr__config_bool(ps->cfg, "staleness-lr-scale");
    ps->lr_decay_rate = qr__config_float(ps->cfg, "lr-decay-rate");
    ps->lr_decay_steps = qr__config_int(ps->cfg, "lr-decay-steps");
    ps->lr_decay_staircase = qr__config_bool(ps->cfg, "lr-decay-staircase");
    ps->average_decay = (float)qr__config_float(ps->cfg, "moving-average-decay");
    ps->average_vars = qr__strdup(qr__config_str(ps->cfg, "moving-average-vars"));
    if (!ps->average_vars) rc = QR_ENOMEM;
    ps->worker_conns = qr__calloc((size_t)ps->cluster->nworkers, sizeof *ps->worker_conns);
    ps->worker_lost_ns = qr__calloc((size_t)ps->cluster->nworkers, sizeof *ps->worker_lost_ns);
    if (!ps->worker_conns || !ps->worker_lost_ns) rc = QR_ENOMEM;
    ps->linger_ms = (int)qr__config_int(ps->cfg, "linger-ms");
    ps->conn_opt.socket_buffer_bytes = (int)qr__config_int(ps->cfg, "socket-buffer-kb") * 1024;
    ps->conn_opt.peer_timeout_ms = (int)qr__config_int(ps->cfg, "peer-timeout-ms");
    ps->conn_opt.max_payload = (uint64_t)qr__config_int(ps->cfg, "max-message-mb") << 20;
    ps->events = (qr_conn_events){.header = on_header, .payload = on_payload,
                                  .message = on_message, .lost = on_lost,
                                  .accepted = on_accepted};
    uv_loop_init(&ps->loop);
    uv_async_init(&ps->loop, &ps->stop_async, on_stop_async);
    ps->stop_async.data = ps;
    uv_timer_init(&ps->loop, &ps->linger_timer);
    ps->linger_timer.data = ps;
    if (!rc && ps->sync.on && ps->index == 0) rc = qr__coord_init(ps);
    if (!rc && !ps->sync.on && ps->index == 0) rc = qr__bound_init(ps);

    const char *addr_str = ps->cluster->ps[ps->index];
    qr_addr addr;
    if (!rc) rc = qr_addr_parse(addr_str, &addr);
    if (!rc) {
        bool tcp_only = !strcmp(qr__config_str(ps->cfg, "transport"), "tcp");
        rc = qr_listen(&ps->loop, &addr, tcp_only, &ps->conn_opt, &ps->events, ps, &ps->listener);
    }
    if (rc) {
        qr__error_prefix("ps %d: ", ps->index);
        ps->stopping = true;
        qr_ps_free(ps);
        return rc;
    }
    qr__log(QR_LOG_DEBUG, "listening on %s", addr_str);
    *out = ps;
    return QR_OK;
}

int qr_ps_run(qr_ps *ps) {
    if (!ps) return qr__fail(QR_EINVAL, "qr_ps_run: ps is NULL");
    uv_run(&ps->loop, UV_RUN_DEFAULT);
    if (ps->exit_status) return qr__fail(ps->exit_status, "%s", ps->sync.abort_msg);
    return QR_OK;
}

int qr_ps_stop(qr_ps *ps) {
    if (!ps) return qr__fail(QR_EINVAL, "qr_ps_stop: ps is NULL");
    uv_async_send(&ps->stop_async);
    return QR_OK;
}

void qr_ps_free(qr_ps *ps) {
    if (!ps) return;
    /* Close whatever is still open and let the loop run the close
     * callbacks, so the loop can be closed without leaking handles. */
    qr_listener_close(ps->listener);
    ps->listener = NULL;
    ps->stopping = true;
    for (ps_peer *p = ps->peers; p; p = p->next) qr_conn_close(p->conn);
    close_loop_handles(ps);
    if (ps->sync.on && ps->index == 0) qr__coord_free(ps);
    qr__bound_close(ps);
    uv_run(&ps->loop, UV_RUN_DEFAULT);
    uv_loop_close(&ps->loop);
    qr__sync_free(ps);
    qr__bound_free(ps);
    qr__recv_pool_free(&ps->recv_pool);
    free(ps->worker_conns);
    free(ps->worker_lost_ns);
    free(ps->average_vars);
    qr_store_free(&ps->store);
    qr_optim_free(ps->optim);
    qr_config_free(ps->cfg);
    qr_cluster_free(ps->cluster);
    free(ps);
}

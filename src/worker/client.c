/*
 * client.c - a worker's life and its dense pushes and pulls: create and
 * free a worker; pull, push, the fused push-and-pull, and the sparse push
 * beside the dense one. Declaring and initializing the variables is in
 * declare.c, the control calls (token, step, statistics, checkpoint,
 * leave, stop) in control.c, and every request these build runs in
 * link.c.
 *
 * A pull or push sends one request to each ps that holds a part of what
 * it names. Pull replies are received straight into their destinations
 * (the worker's copy of each variable, or the caller's buffers); pushes
 * are written straight from the caller's gradient arrays.
 */
#include "worker/worker_internal.h"

#include "worker/heartbeat.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int push(qr_worker *w, int n, const int *ids, const float *const *grads, unsigned flags,
                float *const *values, int64_t *global_step);

/* ---- life ------------------------------------------------------------------ */

int qr_worker_create(qr_worker **out, const qr_cluster *cluster, int task_index,
                     const qr_config *cfg) {
    if (!out || !cluster) return qr__fail(QR_EINVAL, "qr_worker_create: out and cluster are required");
    *out = NULL;
    if (task_index < 0) {
        if (strcmp(cluster->job, "worker"))
            return qr__fail(QR_EINVAL, "qr_worker_create: the cluster spec names job '%s', "
                            "not a worker, and no task index was given", cluster->job);
        task_index = cluster->task_index;
    }
    if (task_index >= cluster->nworkers)
        return qr__fail(QR_EINVAL, "worker index %d is out of range: the cluster has %d workers",
                        task_index, cluster->nworkers);
    qr_worker *w = qr__calloc(1, sizeof *w);
    if (!w) return QR_ENOMEM;
    w->index = task_index;
    int rc = qr_config_new(&w->cfg);
    if (!rc) rc = qr__config_merge(w->cfg, cfg);
    if (!rc) rc = qr__config_check_mode(w->cfg);
    if (!rc) rc = qr_cluster_clone(cluster, &w->cluster);
    if (!rc) rc = qr__auth_from_config(w->cfg, w->cluster, &w->auth);
    if (!rc) rc = qr_replicas_check_config(w->cfg, w->cluster->nps, NULL);
    if (!rc) {
        w->nps = w->cluster->nps;
        w->links = qr__calloc((size_t)w->nps, sizeof *w->links);
        if (!w->links) rc = QR_ENOMEM;
    }
    for (int i = 0; !rc && i < w->nps; i++) {
        ps_link *l = &w->links[i];
        l->w = w;
        l->index = i;
        rc = qr_addr_parse(w->cluster->ps[i], &l->addr);
    }
    if (rc) {
        qr__error_prefix("worker %d: ", task_index);
        qr_auth_free(w->auth);
        qr_config_free(w->cfg);
        qr_cluster_free(w->cluster);
        free(w->links);
        free(w);
        return rc;
    }
    w->prefer_unix = strcmp(qr__config_str(w->cfg, "transport"), "tcp") != 0;
    w->timeout_ms = (int)qr__config_int(w->cfg, "timeout-ms");
    w->sync_timeout_ms = (int)qr__config_int(w->cfg, "sync-timeout-ms");
    w->restart_wait_ms = (int)qr__config_int(w->cfg, "restart-wait-ms");
    w->sync = !strcmp(qr__config_str(w->cfg, "mode"), "sync");
    w->max_staleness = qr__config_int(w->cfg, "max-staleness");
    w->replicas = (int)qr__config_int(w->cfg, "ps-replicas");
    if (w->replicas > 1 && !(w->failed = qr__calloc((size_t)w->nps, 1))) {
        qr_auth_free(w->auth);
        qr_config_free(w->cfg);
        qr_cluster_free(w->cluster);
        free(w->links);
        free(w);
        return QR_ENOMEM;
    }
    /* Pushes are named (worker, seq) on the ps. A restarted worker must not
     * reuse the names of pushes its predecessor left pending, so numbering
     * starts anywhere in [0, 2^31): only the order of one worker's own
     * pushes matters (for the reduction), and it stays increasing. */
    w->push_seq = (uint32_t)((qr__now_ns() ^ ((uint64_t)getpid() << 16)) & 0x7fffffffu);
    w->conn_opt.socket_buffer_bytes = (int)qr__config_int(w->cfg, "socket-buffer-kb") * 1024;
    w->conn_opt.peer_timeout_ms = (int)qr__config_int(w->cfg, "peer-timeout-ms");
    w->conn_opt.max_payload = UINT64_MAX >> 1;
    w->conn_opt.auth = w->auth;
    w->conn_opt.handshake_timeout_ms = (int)qr__config_int(w->cfg, "handshake-timeout-ms");
    wk_links_init(w);
    *out = w;
    return QR_OK;
}

void qr_worker_free(qr_worker *w) {
    if (!w) return;
    qr_heartbeat_stop(w->heartbeat);
    wk_links_report(w);
    wk_links_close(w);
    wk_rows_free(w);
    for (int i = 0; i < w->nvars; i++) {
        free(w->vars[i].name);
        free(w->vars[i].init);
        free(w->vars[i].options);
        free(w->vars[i].data);
        free(w->vars[i].parts);
    }
    free(w->vars);
    free(w->links);
    free(w->failed);
    qr_cluster_free(w->cluster);
    qr_config_free(w->cfg);
    qr_auth_free(w->auth);
    free(w);
}

/* ---- the figures of a metrics page (worker.h) -------------------------------- */

void wk_count_call(qr_worker *w, bool is_push, int rc, double seconds) {
    if (!w) return;
    if (rc == QR_ESTALE) w->calls.stale_pushes++;
    if (!rc || rc == QR_ESTALE) qr_prom_observe(is_push ? &w->calls.push : &w->calls.pull, seconds);
}

void qr__worker_calls(const qr_worker *w, qr_worker_calls *out) {
    *out = w->calls;
}

int qr__worker_batches_per_step(const qr_worker *w) {
    int replicas = 1;
    if (w->sync && qr_sync_check_config(w->cfg, w->cluster->nworkers, &replicas, NULL))
        replicas = w->cluster->nworkers; /* checked at create already: not reached */
    return w->sync ? replicas : 1;
}

/* ---- pull ------------------------------------------------------------------ */

/* Room in r for the count variables whose values its reply brings. */
static int expect_values_alloc(wk_request *r, int count) {
    r->var_ids = qr__calloc((size_t)count, sizeof *r->var_ids);
    r->dst = qr__calloc((size_t)count, sizeof *r->dst);
    r->parts = qr__calloc((size_t)count, sizeof *r->parts);
    r->dst_dt = qr__calloc((size_t)count, sizeof *r->dst_dt);
    return r->var_ids && r->dst && r->parts && r->dst_dt ? QR_OK : QR_ENOMEM;
}

/* Value i of r's reply goes to the caller's array (in the variable's
 * array type) or, when that is NULL, the worker's float32 copy: where in
 * it this part starts. */
static void expect_value(wk_request *r, const wk_var *v, int id, wk_part *part, void *caller) {
    int dt = caller ? v->array_dt : QR_FLOAT32;
    uint8_t *base = caller ? caller : (uint8_t *)v->data;
    r->var_ids[r->nvars] = id;
    r->parts[r->nvars] = part;
    r->dst_dt[r->nvars] = (uint8_t)dt;
    r->dst[r->nvars++] = base + (size_t)part->offset * qr_dt_size(dt);
}

void wk_call_free(wk_call *c) {
    wk_free_requests(c->reqs, c->n);
    free(c->reqs);
    memset(c, 0, sizeof *c);
}

/* Without argument checks (ids already valid; n == 0 means all). */
int wk_pull_build(qr_worker *w, int n, const int *ids, float **dst, uint16_t flags, wk_call *c) {
    int total = n ? n : w->nvars;
    memset(c, 0, sizeof *c);
    wk_request **reqs = c->reqs = qr__calloc((size_t)w->nps, sizeof *reqs);
    if (!reqs) return QR_ENOMEM;
    int rc = QR_OK, nreq = 0;
    for (int p = 0; p < w->nps && !rc; p++) {
        int count = 0;
        for (int i = 0; i < total; i++) count += wk_part_on(&w->vars[n ? ids[i] : i], p) != NULL;
        if (!count) continue;
        wk_request *r = wk_request_new(w, p, QR_MSG_PULL);
        if (!r) {
            rc = QR_ENOMEM;
            break;
        }
        reqs[nreq++] = r;
        r->flags = flags;
        if ((rc = expect_values_alloc(r, count))) break;
        /* Each id is followed by the dtype its values come in when some
         * variable asked for travels in other than float32. */
        bool typed = false;
        for (int i = 0; i < total; i++) {
            const wk_var *v = &w->vars[n ? ids[i] : i];
            typed |= v->wire_dt != QR_FLOAT32 && wk_part_on(v, p);
        }
        if (typed) r->flags |= QR_PULL_DTYPES;
        qr_msg_put_count(&r->meta, (uint32_t)count);
        for (int i = 0; i < total; i++) {
            int id = n ? ids[i] : i;
            wk_var *v = &w->vars[id];
            wk_part *part = wk_part_on(v, p);
            if (!part) continue;
            /* A NULL entry, like a NULL array, means the worker's copy. */
            expect_value(r, v, id, part, dst ? dst[i] : NULL);
            qr_msg_put_id(&r->meta, (uint32_t)id);
            if (typed) qr_msg_put_dtype(&r->meta, v->wire_dt);
        }
    }
    c->n = nreq;
    return rc;
}

int wk_pull_vars(qr_worker *w, int n, const int *ids, float **dst, uint16_t flags) {
    wk_call c;
    int rc = wk_pull_build(w, n, ids, dst, flags, &c);
    if (!rc) rc = wk_run_requests(w, c.reqs, c.n, w->timeout_ms);
    wk_call_free(&c);
    return rc;
}

int qr_worker_pull(qr_worker *w, int n, const int *ids, float **dst) {
    int rc = wk_check_ids(w, "pull", n, ids);
    if (!rc) rc = wk_check_dense(w, "pull", n, ids);
    if (rc) return rc;
    double t0 = qr__now_sec();
    rc = wk_pull_vars(w, n, ids, dst, 0);
    wk_count_call(w, false, rc, qr__now_sec() - t0);
    return rc;
}

int qr_worker_pull_averages(qr_worker *w, int n, const int *ids, float **dst) {
    int rc = wk_check_ids(w, "pull_averages", n, ids);
    if (!rc) rc = wk_check_dense(w, "pull_averages", n, ids);
    return rc ? rc : wk_pull_vars(w, n, ids, dst, QR_PULL_AVERAGES);
}

/* ---- push ------------------------------------------------------------------ */

int qr_worker_push(qr_worker *w, int n, const int *ids, const float *const *grads,
                   unsigned flags, int64_t *global_step) {
    double t0 = qr__now_sec();
    int rc = push(w, n, ids, grads, flags, NULL, global_step);
    wk_rows_clear(w); /* sent, or not: the added rows are used up either way */
    wk_count_call(w, true, rc, qr__now_sec() - t0);
    return rc;
}

int qr_worker_push_pull(qr_worker *w, int n, const int *ids, const float *const *grads,
                        float *const *values, unsigned flags, int64_t *global_step) {
    float **copies = NULL; /* values NULL: every variable into the worker's copy */
    if (!values && n > 0 && !(copies = qr__calloc((size_t)n, sizeof *copies))) return QR_ENOMEM;
    double t0 = qr__now_sec();
    int rc = push(w, n, ids, grads, flags, values ? values : copies, global_step);
    wk_rows_clear(w);
    free(copies);
    wk_count_call(w, true, rc, qr__now_sec() - t0);
    return rc;
}

int qr_worker_push_sparse(qr_worker *w, int var_id, int64_t nrows, const int64_t *indices,
                          const float *rows, unsigned flags, int64_t *global_step) {
    int rc = qr_worker_add_rows(w, var_id, nrows, indices, rows);
    if (rc) {
        wk_rows_clear(w);
        return rc;
    }
    return qr_worker_push(w, 0, NULL, NULL, flags, global_step);
}

/* values: a fused push-and-pull (qr_worker_push_pull): where each
 * variable's new values go (NULL entries: the worker's copy); NULL: a
 * plain push. */
int wk_push_build(qr_worker *w, int n, const int *ids, const float *const *grads,
                  unsigned flags, float *const *values, wk_call *c) {
    memset(c, 0, sizeof *c);
    int rc = wk_check_ids(w, "push", n, ids);
    if (!rc && values && n <= 0)
        rc = qr__fail(QR_EINVAL, "push_pull: name the variables to push and pull (n >= 1)");
    if (!rc) rc = wk_check_dense(w, "push", n, ids);
    if (!rc) rc = wk_rows_prepare(w);
    if (rc) return rc;
    if (n > 0 && !grads) return qr__fail(QR_EINVAL, "push: grads is NULL");
    if (w->sync && (flags & QR_PUSH_DELTA))
        return qr__fail(QR_EINVAL, "push: delta pushes are for async training");
    if (w->sync && (flags & QR_PUSH_EVERY_PS))
        return qr__fail(QR_EINVAL, "push: QR_PUSH_EVERY_PS is for async training (a sync step "
                        "reaches every ps whole)");
    wk_request **reqs = c->reqs = qr__calloc((size_t)w->nps, sizeof *reqs);
    if (!reqs) return QR_ENOMEM;
    int nreq = 0;
    uint32_t seq = c->seq = ++w->push_seq;
    c->local_step = w->local_step;
    /* Sync with values: a held push, to ps 0 always (it counts it and
     * answers with the token) and to every ps of its variables (each
     * answers after the step): one round trip. */
    c->held = w->sync && values;
    /* Async: the step flag rides on the push to ps 0. Sync: ps 0 counts
     * the push when it is committed (push, below), or held. */
    bool step_to_ps0 = (!w->sync && (flags & QR_PUSH_STEP)) || c->held;
    /* How many ps this call reaches: each is told, so that an async
     * checkpoint can tell a push that reached some of them from a whole
     * one (src/ps/ckpt_cut.c). */
    uint32_t nparts = 0;
    /* The learning rates ride along when some variable of the push has one
     * set (qr_worker_set_lr); a delta has none. */
    bool with_lr = !(flags & QR_PUSH_DELTA) && wk_rows_with_lr(w);
    for (int i = 0; i < n && !with_lr && !(flags & QR_PUSH_DELTA); i++)
        with_lr = w->vars[ids[i]].push_lr >= 0;
    for (int p = 0; p < w->nps; p++) {
        bool reaches = (step_to_ps0 && p == 0) || (flags & QR_PUSH_EVERY_PS) || wk_rows_items(w, p);
        for (int i = 0; i < n && !reaches; i++) reaches = wk_part_on(&w->vars[ids[i]], p) != NULL;
        nparts += reaches;
    }
    for (int p = 0; p < w->nps && !rc; p++) {
        int count = 0, row_items = wk_rows_items(w, p);
        uint64_t staged = 0; /* bytes of the items converted to their wire type */
        for (int i = 0; i < n; i++) {
            const wk_var *v = &w->vars[ids[i]];
            const wk_part *part = wk_part_on(v, p);
            count += part != NULL;
            if (part && v->wire_dt != v->array_dt)
                staged += qr_dt_wire_bytes(v->wire_dt, (uint64_t)part->n);
        }
        if (!count && !row_items && !(step_to_ps0 && p == 0) && !(flags & QR_PUSH_EVERY_PS))
            continue;
        wk_request *r = wk_request_new(w, p, QR_MSG_PUSH);
        if (!r) {
            rc = QR_ENOMEM;
            break;
        }
        reqs[nreq++] = r;
        if (p == 0) c->step_req = r;
        r->flags = w->sync ? QR_PUSH_SYNC : (uint16_t)(flags & (QR_PUSH_STEP | QR_PUSH_DELTA));
        if (c->held) r->flags |= QR_PUSH_REPLY_VALUES;
        if (with_lr) r->flags |= QR_PUSH_LR;
        /* an iov per item, and one more for a half-width item's padding */
        r->payload = qr__calloc((size_t)QR_MAX(2 * count + 2 * row_items, 1),
                                sizeof *r->payload);
        if (staged && !(r->out_stage = malloc(staged))) rc = QR_ENOMEM;
        if (rc || !r->payload) {
            rc = QR_ENOMEM;
            rc = QR_ENOMEM;
            break;
        }
        if (values && (c->held || count)) {
            /* The reply brings the values of the dense items, in order. */
            r->flags |= QR_PUSH_REPLY_VALUES;
            if ((rc = expect_values_alloc(r, QR_MAX(count, 1)))) break;
        }
        qr_msg_put_push_head(&r->meta, &(qr_msg_push_head){.count = (uint32_t)(count + row_items),
                                                           .local_step = w->local_step,
                                                           .worker = (uint32_t)w->index,
                                                           .seq = seq, .nparts = nparts,
                                                           .data_pos = w->data_pos});
        uint8_t *stage = r->out_stage;
        for (int i = 0; i < n; i++) {
            wk_var *v = &w->vars[ids[i]];
            wk_part *part = wk_part_on(v, p);
            if (!part) continue;
            if (!grads[i]) {
                rc = qr__fail(QR_EINVAL, "push: gradient %d ('%s') is NULL", i, v->name);
                break;
            }
            uint64_t nbytes = qr_dt_wire_bytes(v->wire_dt, (uint64_t)part->n);
            qr_msg_put_var(&r->meta, &(qr_msg_var){.id = (uint32_t)ids[i],
                                                   .kind = qr_msg_kind(QR_GRAD_DENSE, v->wire_dt),
                                                   .nbytes = nbytes, .version = part->version});
            if (with_lr) qr_msg_put_push_lr(&r->meta, v->push_lr);
            const uint8_t *src = (const uint8_t *)grads[i] +
                                 (size_t)part->offset * qr_dt_size(v->array_dt);
            size_t raw = (size_t)part->n * qr_dt_size(v->wire_dt);
            if (v->wire_dt != v->array_dt) { /* a float32 array on a narrower wire */
                qr_dt_from_f32(v->wire_dt, stage, (const float *)src, (size_t)part->n);
                memset(stage + raw, 0, nbytes - raw);
                r->payload[r->npayload++] = (qr_iov){stage, (size_t)nbytes};
                stage += nbytes;
            } else {
                r->payload[r->npayload++] = (qr_iov){(void *)src, raw};
                if (nbytes > raw) r->payload[r->npayload++] = (qr_iov){&r->pad, nbytes - raw};
            }
            if (r->flags & QR_PUSH_REPLY_VALUES) expect_value(r, v, ids[i], part, values[i]);
        }
        wk_rows_put(w, p, r, with_lr);
    }
    c->n = nreq;
    c->counts_step = step_to_ps0 && !c->held;
    return rc;
}

int wk_call_timeout_ms(const qr_worker *w, const wk_call *c) {
    /* ps 0 ends a stalled step after sync-timeout-ms with its report (the
     * answers then say so); this is only the safety net of a token wait. */
    return c->held ? 2 * w->sync_timeout_ms + 5000 : w->timeout_ms;
}

int wk_push_done(qr_worker *w, const wk_call *c, int rc, int64_t *global_step) {
    if (rc) return rc;
    if (global_step && c->step_req) *global_step = c->step_req->step;
    if (c->counts_step) w->steps_pushed++;
    if (!c->held) return QR_OK;
    /* The token came with ps 0's answer: the next step's. */
    w->local_step = c->step_req->step;
    bool stale = false;
    for (int i = 0; i < c->n; i++) stale |= (c->reqs[i]->held_flags & QR_HELD_STALE) != 0;
    if (stale)
        return qr__fail(QR_ESTALE, "dropped: stale: worker %d's gradient of step %lld came after "
                        "that step had its gradients; the values and the token of step %lld "
                        "came back", w->index, (long long)c->local_step, (long long)w->local_step);
    return QR_OK;
}

static int push(qr_worker *w, int n, const int *ids, const float *const *grads,
                unsigned flags, float *const *values, int64_t *global_step) {
    wk_call call;
    int rc = wk_push_build(w, n, ids, grads, flags, values, &call);
    if (!rc && call.held && !w->initialized)
        rc = qr__fail(QR_ENOTREADY, "push_pull: call qr_worker_initialize first");
    if (!rc) rc = wk_run_requests(w, call.reqs, call.n, wk_call_timeout_ms(w, &call));
    rc = wk_push_done(w, &call, rc, global_step);
    uint32_t seq = call.seq;
    bool held = call.held;
    wk_call_free(&call);
    /* Sync: a push some ps found stale is still committed, so that ps 0
     * counts it and gives the worker its place in the token queue (it
     * will find it stale too). A held push was all of that already. */
    if (!w->sync || held || (rc && rc != QR_ESTALE)) return rc;

    /* Every ps holds this push's gradients: now ps 0 may count it. */
    w->last_commit = (qr_msg_commit){.worker = (uint32_t)w->index, .seq = seq,
                                     .local_step = w->local_step, .data_pos = w->data_pos};
    int64_t step = 0;
    rc = wk_commit(w, &step);
    if (!rc && global_step) *global_step = step;
    return rc;
}

int wk_commit(qr_worker *w, int64_t *step) {
    wk_request *c = wk_request_new(w, 0, QR_MSG_COMMIT);
    if (!c) return QR_ENOMEM;
    qr_msg_put_commit(&c->meta, &w->last_commit);
    int rc = wk_run_requests(w, &c, 1, w->timeout_ms);
    if (!rc && step) *step = c->step;
    w->commit_unserved = !rc || rc == QR_ESTALE; /* a place in the token queue either way */
    wk_request_free(c);
    return rc;
}

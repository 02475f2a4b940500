/*
 * link.c - the worker's request engine: its connections to the ps tasks,
 * the requests in flight on them, and the loop that runs them. The calls
 * (client.c, declare.c, control.c, rows.c, inflight.c) build requests
 * (wk_request_new) and hand them here (wk_run_requests); nothing here
 * calls back up into those files.
 *
 * Each qr_worker owns a private libuv loop that runs only inside its own
 * calls, on the caller's thread: a call queues its requests (one per ps
 * task involved, all sent at once, matched to replies by request id) and
 * turns the loop until every reply is in or the deadline passes. Running
 * the loop in the caller's thread, rather than in an I/O thread, keeps a
 * small round trip at raw-socket cost: no hand-off between threads.
 *
 * Connections are made lazily and remade with exponential backoff (10 ms
 * doubling to 1 s) while a call is waiting, so ps tasks may start after
 * the workers or restart during training. A request already sent on a
 * connection that is lost fails with QR_EPEERLOST (a push may or may not
 * have been applied; it is not silently repeated). Nothing but the HELLO
 * goes on a new connection before the HELLO's answer, which says which
 * run of the ps this is (its incarnation).
 *
 * Waits say what they wait for. A ps that was reached once and now refuses
 * connections is reported at once, and a call that needs it waits up to
 * restart-wait-ms for it to come back; every wait that lasts is reported
 * every few seconds (report_waits). A ps that comes back as a new
 * incarnation was restarted: the cluster rolls back to that ps's
 * checkpoint (docs/CHECKPOINTS.md, "Rollback"), so this worker's state is
 * gone and every later call fails with QR_EROLLEDBACK (QR_EABORTED when
 * the ps keeps no checkpoints and has lost its variables): the caller
 * creates the worker again to go on from the checkpoint.
 *
 * With --ps-replicas 2 (async) a link is a shard's: link k carries the
 * requests for shard k to the ps that serves it in the view (ps k, or
 * its backup ps (k+1) mod P once ps k failed over, docs/REPLICATION.md).
 * Its HELLO names the view the worker knows and the shard; a ps refuses
 * an old one (QR_EVIEW) and the worker asks ps 0 for the view (VIEW),
 * which ps 0 also sends unasked at each failover (QR_VIEW_NOTICE_ID).
 * A new view moves the links of the shards that moved (apply_view), and
 * a push whose connection was lost is sent again (to the new primary, or
 * to the same ps come back): both copies hold its (worker, seq), so the
 * one that has applied it answers without applying it twice.
 *
 * A reply's values are received straight into the request's destinations
 * (expect_values), never staged.
 */
#include "worker/worker_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- requests ------------------------------------------------------------ */

wk_request *wk_request_new(qr_worker *w, int ps, uint8_t type) {
    wk_request *r = qr__calloc(1, sizeof *r);
    if (!r) return NULL;
    r->link = &w->links[ps];
    r->type = type;
    r->id = ++w->next_id;
    if (r->id == QR_VIEW_NOTICE_ID) r->id = ++w->next_id; /* never the notice's */
    if (type == QR_MSG_PUSH) r->created_ns = qr__now_ns();
    return r;
}

void wk_request_free(wk_request *r) {
    if (!r) return;
    qr_wbuf_free(&r->meta);
    free(r->reply_meta); /* kept whole for its caller (want_meta) */
    free(r->payload);
    free(r->var_ids);
    free(r->dst);
    free(r->dst_dt);
    free(r->parts);
    free(r->out_stage);
    free(r->in_stage);
    free(r);
}

static void request_finish(wk_request *r, int status, const char *msg) {
    r->done = true;
    r->status = status;
    if (status && msg) snprintf(r->errmsg, sizeof r->errmsg, "%s", msg);
    if (r->internal) {
        qr_worker *w = r->link->w;
        if (r == w->view_req) w->view_req = NULL;
        if (status == QR_EVIEW && r->type == QR_MSG_HELLO) {
            /* Of an old view: ask ps 0, and connect again after it. */
            qr__log(QR_LOG_INFO, "ps %d refused the connection for shard %d: %s", r->link->target,
                    r->link->index, r->errmsg);
            w->view_wanted = true;
            if (r->link->conn) qr_conn_close(r->link->conn);
            wk_request_free(r);
            return;
        }
        /* The ps refused this worker (e.g. a different --mode): remember
         * why, so the next call on this link reports it. */
        if (status && status != QR_EPEERLOST && r->link) {
            snprintf(r->link->refusal, sizeof r->link->refusal, "%s", r->errmsg);
            r->link->refused = status;
        }
        wk_request_free(r);
    }
}

/* The HELLO's answer: the link carries requests from now on, unless the ps
 * is a new incarnation, in which case the cluster is rolling back. */
static void hello_answered(ps_link *l, const uint8_t *meta, uint32_t len) {
    qr_worker *w = l->w;
    qr_msg_welcome m = {0};
    qr_rbuf rb;
    qr_rbuf_init(&rb, meta, len);
    qr_msg_get_welcome(&rb, &m);
    if (rb.bad) m = (qr_msg_welcome){.restored_step = -1};
    if (l->incarnation && m.incarnation != l->incarnation) {
        char from[64] = "nothing: it has no checkpoint yet";
        if (m.restored_step >= 0)
            snprintf(from, sizeof from, "its checkpoint of step %lld", (long long)m.restored_step);
        if (m.flags & QR_WELCOME_CHECKPOINTS) {
            w->rolled_back = QR_EROLLEDBACK;
            snprintf(w->rollback_msg, sizeof w->rollback_msg,
                     "ps %d (%s) is a new run that restored %s: a ps was restarted and the "
                     "cluster rolls back to that checkpoint; create the worker again to go on "
                     "from there", l->index,
                     w->cluster->ps[l->index], from);
        } else {
            w->rolled_back = QR_EABORTED;
            snprintf(w->rollback_msg, sizeof w->rollback_msg,
                     "job aborted: ps %d (%s) was restarted and has lost its variables: without "
                     "--checkpoint-dir there is nothing to roll back to, training cannot go on",
                     l->index, w->cluster->ps[l->index]);
        }
        qr__log(QR_LOG_WARN, "%s", w->rollback_msg);
        return; /* the link stays in LINK_HELLO: nothing more is sent on it */
    }
    if (l->lost_ns && l->target != l->index)
        qr__log(QR_LOG_INFO, "shard %d is served again after %.1f s, by ps %d (%s) since the "
                "failover", l->index, (double)(qr__now_ns() - l->lost_ns) / 1e9, l->target,
                w->cluster->ps[l->target]);
    else if (l->lost_ns)
        qr__log(QR_LOG_INFO, "ps %d (%s) is back after %.1f s", l->index,
                w->cluster->ps[l->index], (double)(qr__now_ns() - l->lost_ns) / 1e9);
    else if (!l->incarnation)
        qr__log(QR_LOG_INFO, "connected to ps %d (%s) over %s", l->target,
                w->cluster->ps[l->target], l->conn ? qr_conn_kind(l->conn) : "?");
    /* Tell `quorum launch` this worker has joined the run: one that has
     * not when the run ends only arrived late, and is not a failure. */
    if (l->index == 0 && !l->incarnation) qr__tell_supervisor("joined worker %d", w->index);
    l->incarnation = m.incarnation;
    l->lost_ns = l->unreached_ns = 0;
    l->refusal_reported = false;
    l->state = LINK_UP;
}

static void link_fail_pending(ps_link *l, int status, const char *why) {
    char msg[512];
    snprintf(msg, sizeof msg, "ps %d (%s): connection lost: %s", l->index,
             l->w->cluster->ps[l->index], why);
    wk_request *r = l->head;
    l->head = l->tail = l->replying = NULL;
    while (r) {
        wk_request *next = r->next;
        request_finish(r, status, msg);
        r = next;
    }
}

static int link_send(ps_link *l, wk_request *r) {
    qr_frame f = {.type = r->type, .flags = r->flags, .request_id = r->id};
    int rc = qr_conn_send(l->conn, &f, r->meta.data, (uint32_t)r->meta.len, r->payload,
                          r->npayload, NULL, NULL);
    if (rc) return rc;
    r->sent = true;
    r->next = NULL;
    if (l->tail) l->tail->next = r;
    else l->head = r;
    l->tail = r;
    return QR_OK;
}

/* ---- connection events ------------------------------------------------ */

/* A ps refused this worker's handshake, or this worker refused the ps's
 * proof: trying again cannot help (another secret, another spec, or an
 * impostor at the ps's address), so the worker stops at once, every call
 * failing with the reason, rather than waiting out restart-wait-ms. */
static void auth_refused(ps_link *l) {
    qr_worker *w = l->w;
    qr__log(QR_LOG_ERROR, "ps %d (%s): %s", l->index, w->cluster->ps[l->index], l->last_error);
    w->stopping = true;
    if (w->stop_status) return;
    w->stop_status = QR_EAUTH;
    snprintf(w->stop_msg, sizeof w->stop_msg, "ps %d (%s): %s", l->index,
             w->cluster->ps[l->index], l->last_error);
}

static void on_connected(qr_conn *c, int status) {
    ps_link *l = qr_conn_data(c);
    if (status) {
        snprintf(l->last_error, sizeof l->last_error, "%s", qr_last_error());
        if (status == QR_EAUTH) auth_refused(l);
        return; /* `lost` follows */
    }
    l->state = LINK_HELLO;
    l->attempts = 0;
    wk_request *hello = wk_request_new(l->w, l->index, QR_MSG_HELLO);
    if (!hello) return;
    hello->internal = true;
    qr_worker *w = l->w;
    qr_msg_put_hello(&hello->meta, &(qr_msg_hello){.role = QR_ROLE_WORKER,
                                                   .task_index = (uint32_t)w->index,
                                                   .mode = w->sync ? 1 : 0,
                                                   .with_view = w->replicas > 1,
                                                   .view = w->view,
                                                   .shard = (uint32_t)l->index});
    if (link_send(l, hello)) wk_request_free(hello);
}

static void on_lost(qr_conn *c, int status) {
    ps_link *l = qr_conn_data(c);
    qr_worker *w = l->w;
    uint64_t now = qr__now_ns();
    if (l->state == LINK_UP || l->state == LINK_HELLO) {
        snprintf(l->last_error, sizeof l->last_error, "%s", qr_strerror(status));
        qr__log(QR_LOG_DEBUG, "lost ps %d: %s", l->index, qr_strerror(status));
        if (l->state == LINK_UP && !l->lost_ns) l->lost_ns = now;
    } else if (l->lost_ns && !l->refusal_reported && !w->stopping && !w->rolled_back) {
        /* It was reached before and now refuses: it has died or stopped.
         * Said at once, with what follows. */
        l->refusal_reported = true;
        qr__log(QR_LOG_WARN, "ps %d (%s) is gone (%s): a call that needs it waits up to %.0f s "
                "(restart-wait-ms) for it to come back", l->index, w->cluster->ps[l->index],
                l->last_error, w->restart_wait_ms / 1e3);
    } else if (!l->incarnation && !l->unreached_ns) {
        l->unreached_ns = now;
    }
    /* With two copies, a ps reached before that refuses now may have been
     * failed over (ps 0 too: then nobody may send this worker the view
     * unasked, if it has no connection to ps 1): ask any ps that answers
     * for the view, again at each refused attempt (ask_view). */
    if (l->state != LINK_UP && l->state != LINK_HELLO && l->lost_ns && w->replicas > 1 &&
        !w->stopping)
        w->view_wanted = true;
    l->conn = NULL;
    l->state = LINK_DOWN;
    uint64_t backoff_ms = QR_MIN(1000ull, 10ull << QR_MIN(l->attempts, 7));
    l->attempts++;
    l->retry_at_ns = qr__now_ns() + backoff_ms * 1000000ull;
    link_fail_pending(l, QR_EPEERLOST, l->last_error);
}

static bool is_stop_notice(const qr_frame *f) {
    return f->type == (QR_MSG_STOP | QR_MSG_REPLY) && f->request_id == QR_STOP_NOTICE_ID;
}

static bool is_view_notice(const qr_frame *f) {
    return f->type == (QR_MSG_VIEW | QR_MSG_REPLY) && f->request_id == QR_VIEW_NOTICE_ID;
}

/* Link l's shard is served by ps `target` from now on: its connection
 * (if any) is dropped, which fails what was sent on it with QR_EPEERLOST
 * (sent again by wk_run_requests), and the next one goes there. */
static void retarget(ps_link *l, int target) {
    qr_worker *w = l->w;
    qr__log(QR_LOG_WARN, "view %llu: shard %d is served by ps %d (%s) from now on",
            (unsigned long long)w->view, l->index, target, w->cluster->ps[target]);
    l->target = target;
    if (qr_addr_parse(w->cluster->ps[target], &l->addr))
        qr__log(QR_LOG_ERROR, "ps %d's address: %s", target, qr_last_error());
    l->incarnation = 0; /* another ps: not a restart of the one before */
    l->refused = 0;
    l->attempts = 0;
    l->retry_at_ns = 0;
    l->unreached_ns = 0;
    l->refusal_reported = false;
    if (l->conn) qr_conn_close(l->conn); /* `lost` follows */
}

/* A view from ps 0 (its VIEW notice or answer): the links of the shards
 * that moved go to their new ps. */
static void apply_view(qr_worker *w, const uint8_t *meta, uint32_t len) {
    if (w->replicas < 2 || !w->failed) return;
    uint8_t failed[w->nps];
    uint64_t view;
    qr_rbuf rb;
    qr_rbuf_init(&rb, meta, len);
    qr_msg_get_view(&rb, w->nps, &view, failed);
    if (rb.bad) {
        qr__log(QR_LOG_WARN, "ps 0 sent a view this worker cannot read (%u bytes)", len);
        return;
    }
    if (view <= w->view) return;
    w->view = view;
    memcpy(w->failed, failed, (size_t)w->nps);
    int coordinator = w->links[0].target;
    for (int k = 0; k < w->nps; k++) {
        int target = failed[k] ? (k + 1) % w->nps : k;
        if (target != w->links[k].target) retarget(&w->links[k], target);
    }
    /* The coordinator serves shard 0: its successor since ps 0 failed
     * over. TOKEN, CLOCK, SAVE, LEAVE and READY follow link 0; the
     * heartbeat thread is told. */
    if (w->links[0].target != coordinator && w->heartbeat &&
        qr_heartbeat_move(w->heartbeat, w->cluster->ps[w->links[0].target]))
        qr__log(QR_LOG_ERROR, "heartbeat: %s", qr_last_error());
    /* The chief told ps 0 the run's last step (READY); its successor
     * learns it from the chief too, so that it ends a run whose workers
     * have all left past it, as ps 0 would have. */
    if (w->links[0].target != coordinator && w->step_limit > 0) w->limit_wanted = true;
}

static void link_connect(ps_link *l);

/* A ps refused a HELLO as of an old view, or a ps reached before refuses
 * to connect: ask for the view, once at a time, on link 0 (the
 * coordinator's) when it is up, else on any link that is. A link 0 that
 * is down is made again for it: nothing else may need the coordinator
 * while the call waits (a push to the refusing ps alone), and ps 0 may
 * be a new run, rolled back (its views number on, so every ps refuses
 * this worker's old view): its HELLO's answer is how this worker learns
 * of the rollback. Another ps answers with the view it has been told,
 * which may not be the newest yet: a refusal asks again. */
static void ask_view(qr_worker *w) {
    ps_link *l0 = &w->links[0];
    if (w->limit_wanted && l0->state == LINK_UP) {
        wk_request *r = wk_request_new(w, 0, QR_MSG_READY);
        if (r) {
            r->internal = true;
            qr_msg_put_ready(&r->meta, &(qr_msg_ready){.set = 0, .step = w->step_limit});
            if (link_send(l0, r)) wk_request_free(r);
            else w->limit_wanted = false;
        }
    }
    if (w->view_wanted && l0->state == LINK_DOWN && qr__now_ns() >= l0->retry_at_ns)
        link_connect(l0);
    if (!w->view_wanted || w->view_req) return;
    ps_link *l = l0->state == LINK_UP ? l0 : NULL;
    for (int k = 1; !l && k < w->nps; k++)
        if (w->links[k].state == LINK_UP) l = &w->links[k];
    if (!l) return;
    wk_request *r = wk_request_new(w, l->index, QR_MSG_VIEW);
    if (!r) return;
    r->internal = true;
    r->want_meta = true;
    if (link_send(l, r)) {
        wk_request_free(r);
        return;
    }
    w->view_req = r;
    w->view_wanted = false;
}

/* A pull's reply (or a fused push's, after its step): the records of the
 * variables asked for, in order, and their values read straight into the
 * request's destinations; values in another type than their destination's
 * (a bf16 wire, a float32 array) land in r->in_stage, for unstage_values. */
static int expect_values(qr_conn *c, ps_link *l, wk_request *r, qr_rbuf *rbp,
                         const qr_frame *f) {
    qr_rbuf rb = *rbp;
    uint32_t count = qr_msg_get_count(&rb);
    if (count != (uint32_t)r->nvars)
        return qr__fail(QR_EPROTO, "ps %d answered a pull of %d variables with %u",
                        l->index, r->nvars, count);
    uint64_t staged = 0;
    for (uint32_t i = 0; i < count; i++) {
        const wk_var *v = &l->w->vars[r->var_ids[i]];
        if (r->dst_dt[i] != v->wire_dt)
            staged += qr_dt_wire_bytes(v->wire_dt, (uint64_t)r->parts[i]->n);
    }
    free(r->in_stage); /* a retried request's */
    r->in_stage = staged ? malloc(staged) : NULL;
    qr_iov *iov = malloc((size_t)QR_MAX(2 * count, 1) * sizeof *iov);
    if (!iov || (staged && !r->in_stage)) {
        free(iov);
        return QR_ENOMEM;
    }
    uint64_t total = 0;
    uint8_t *stage = r->in_stage;
    int niov = 0;
    for (uint32_t i = 0; i < count; i++) {
        qr_msg_var rec;
        qr_msg_get_var(&rb, &rec);
        uint64_t nbytes = rec.nbytes;
        wk_var *v = &l->w->vars[r->var_ids[i]];
        wk_part *part = r->parts[i];
        part->version = rec.version;
        if (rb.bad || rec.id != (uint32_t)r->var_ids[i] ||
            rec.kind != qr_msg_kind(QR_GRAD_DENSE, v->wire_dt) ||
            nbytes != qr_dt_wire_bytes(v->wire_dt, (uint64_t)part->n)) {
            free(iov);
            return qr__fail(QR_EPROTO, "ps %d answered the pull of '%s' with a bad record",
                            l->index, v->name);
        }
        size_t raw = (size_t)part->n * qr_dt_size(v->wire_dt);
        if (r->dst_dt[i] != v->wire_dt) {
            iov[niov++] = (qr_iov){stage, (size_t)nbytes};
            stage += nbytes;
        } else {
            iov[niov++] = (qr_iov){r->dst[i], raw};
            if (nbytes > raw) iov[niov++] = (qr_iov){&r->pad, (size_t)nbytes - raw};
        }
        total += nbytes;
    }
    int rc = total == f->payload_len ? qr_conn_expect(c, iov, niov)
                                      : qr__fail(QR_EPROTO, "ps %d: pull reply size mismatch",
                                                 l->index);
    free(iov);
    return rc;
}

/* A lookup's reply (or a slot read's): u64 count, then count rows of
 * rows_dim floats read straight into dst[0]. */
static int expect_floats(qr_conn *c, ps_link *l, wk_request *r, qr_rbuf *rb,
                         const qr_frame *f) {
    uint64_t count = qr_rbuf_u64(rb);
    uint64_t bytes = r->rows * (uint64_t)r->rows_dim * sizeof(float);
    if (rb->bad || count != r->rows || f->payload_len != bytes)
        return qr__fail(QR_EPROTO, "ps %d answered a %s of %llu rows with %llu (%llu bytes)",
                        l->index, qr_msg_name(r->type), (unsigned long long)r->rows,
                        (unsigned long long)count, (unsigned long long)f->payload_len);
    qr_iov iov = {r->dst[0], (size_t)bytes};
    return qr_conn_expect(c, &iov, 1);
}

/* The reply is in: values staged in their wire type are widened into
 * their float32 destinations. */
static void unstage_values(const qr_worker *w, wk_request *r) {
    const uint8_t *stage = r->in_stage;
    for (int i = 0; stage && i < r->nvars; i++) {
        const wk_var *v = &w->vars[r->var_ids[i]];
        if (r->dst_dt[i] == v->wire_dt) continue;
        qr_dt_to_f32(v->wire_dt, r->dst[i], stage, (size_t)r->parts[i]->n);
        stage += qr_dt_wire_bytes(v->wire_dt, (uint64_t)r->parts[i]->n);
    }
}

/* The sent request a reply answers. A ps answers in the order asked, but
 * a held push's answer waits for its step while later requests are
 * answered, so it is looked for by id. */
static wk_request *answered(const ps_link *l, uint32_t id) {
    wk_request *r = l->head;
    while (r && r->id != id) r = r->next;
    return r;
}

static void unqueue(ps_link *l, wk_request *r) {
    wk_request **link = &l->head, *prev = NULL;
    while (*link != r) prev = *link, link = &(*link)->next;
    *link = r->next;
    if (l->tail == r) l->tail = prev;
}

static int reply_header(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    ps_link *l = qr_conn_data(c);
    if (is_stop_notice(f) || is_view_notice(f))
        return f->payload_len ? qr__fail(QR_EPROTO, "ps %d sent a notice with a payload",
                                         l->index)
                              : QR_OK;
    wk_request *r = l->replying = answered(l, f->request_id);
    if (!r || f->type != (r->type | QR_MSG_REPLY))
        return qr__fail(QR_EPROTO, "ps %d sent an unexpected %s reply (id %u)", l->index,
                        qr_msg_name(f->type), f->request_id);
    if (f->status != QR_OK) return QR_OK; /* error text in meta; no payload */
    qr_rbuf rb;
    qr_rbuf_init(&rb, meta, f->meta_len);
    switch (r->type) {
    case QR_MSG_PUSH:
        if ((r->flags & QR_PUSH_SYNC) && (r->flags & QR_PUSH_REPLY_VALUES)) {
            qr_msg_get_held_reply(&rb, &r->step, &r->held_flags); /* held: values follow */
            return expect_values(c, l, r, &rb, f);
        }
        r->step = qr_msg_get_step(&rb);
        return r->nvars ? expect_values(c, l, r, &rb, f) : QR_OK; /* fused: values follow */
    case QR_MSG_STEP:
    case QR_MSG_SAVE:
    case QR_MSG_COMMIT:
    case QR_MSG_TOKEN: r->step = qr_msg_get_step(&rb); break;
    case QR_MSG_READY: {
        qr_msg_ready m;
        qr_msg_get_ready(&rb, &m);
        r->ready = m.set;
        r->step = m.step;
        r->data_pos = m.data_pos;
        break;
    }
    case QR_MSG_SLOTS:
        if (r->want_meta) break; /* the names: kept whole (reply_message) */
        if (r->dst) return expect_floats(c, l, r, &rb, f); /* a read */
        r->step = qr_msg_get_step(&rb); /* a write or the step: the ps's step */
        break;
    case QR_MSG_LOOKUP: return expect_floats(c, l, r, &rb, f);
    case QR_MSG_PULL: return expect_values(c, l, r, &rb, f);
    default: break;
    }
    return QR_OK;
}

/* A ps stops: requests not sent yet end at once with how and why
 * (wk_run_requests), so no call waits for a ps of a job that has ended. */
static void stop_noticed(ps_link *l, const qr_frame *f, const uint8_t *meta) {
    qr_worker *w = l->w;
    w->stopping = true;
    if (w->stop_status) return;
    w->stop_status = f->status && f->status != QR_OK ? f->status : QR_ESTOPPED;
    int n = (int)QR_MIN(f->meta_len, sizeof w->stop_msg - 1);
    memcpy(w->stop_msg, meta, (size_t)n);
    w->stop_msg[n] = 0;
    if (!n) snprintf(w->stop_msg, sizeof w->stop_msg, "ps %d stopped", l->index);
}

static void reply_message(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    ps_link *l = qr_conn_data(c);
    if (is_stop_notice(f)) {
        stop_noticed(l, f, meta);
        return;
    }
    if (is_view_notice(f)) {
        /* Only the coordinator sends them (ps 0, or its successor once ps
         * 0 failed over, on whichever link it serves); a view is taken
         * only if it is newer than the one known. */
        if (f->status == QR_OK) apply_view(l->w, meta, f->meta_len);
        return;
    }
    wk_request *r = l->replying;
    l->replying = NULL;
    unqueue(l, r);
    if (r->type == QR_MSG_VIEW && f->status == QR_OK) apply_view(l->w, meta, f->meta_len);
    if (r->type == QR_MSG_PUSH && f->status == QR_OK) {
        l->pushes_acked++;
        l->w->max_push_ns = QR_MAX(l->w->max_push_ns, qr__now_ns() - r->created_ns);
    }
    if (f->status == QR_ESTOPPED) l->w->stopping = true;
    if (r->type == QR_MSG_HELLO && f->status == QR_OK) hello_answered(l, meta, f->meta_len);
    if (r->type == QR_MSG_HELLO && f->status == QR_EAUTH) { /* this worker has no secret */
        snprintf(l->last_error, sizeof l->last_error, "%.*s", (int)QR_MIN(f->meta_len, 400u),
                 (const char *)meta);
        auth_refused(l);
    }
    if (f->status != QR_OK) {
        char msg[512];
        int n = (int)QR_MIN(f->meta_len, sizeof msg - 1);
        memcpy(msg, meta, (size_t)n);
        msg[n] = 0;
        request_finish(r, f->status, msg);
    } else {
        if (r->want_meta && f->meta_len) {
            r->reply_meta = malloc(f->meta_len);
            if (r->reply_meta) {
                memcpy(r->reply_meta, meta, f->meta_len);
                r->reply_meta_len = f->meta_len;
            }
        }
        if (r->nvars) unstage_values(l->w, r);
        request_finish(r, QR_OK, NULL);
    }
}

/* ---- driving the loop ---------------------------------------------------- */

static void on_wake(uv_timer_t *t) {
    (void)t;
}

static void link_connect(ps_link *l) {
    qr_worker *w = l->w;
    l->state = LINK_CONNECTING;
    int rc = qr_connect(&w->loop, &l->addr, w->prefer_unix, &w->conn_opt, &w->events, l, &l->conn);
    if (rc) {
        snprintf(l->last_error, sizeof l->last_error, "%s", qr_last_error());
        l->state = LINK_DOWN;
        l->attempts++;
        l->retry_at_ns = qr__now_ns() + QR_MIN(1000ull, 10ull << QR_MIN(l->attempts, 7)) * 1000000ull;
    }
}

/* When a call gives up on r: its own deadline, or, while r's ps is lost
 * and may be restarting, restart-wait-ms after the loss (the one bound
 * on waiting for a restart, whatever the call). */
static uint64_t request_deadline(const qr_worker *w, const wk_request *r, uint64_t deadline) {
    const ps_link *l = r->link;
    if (!r->sent && l->lost_ns) return l->lost_ns + (uint64_t)w->restart_wait_ms * 1000000ull;
    return deadline;
}

/* End r now with status and msg. A request already sent may still be
 * answered: its connection is dropped first, so the answer cannot land
 * in buffers the caller owns again. */
static void request_give_up(qr_worker *w, wk_request *r, int status, const char *msg) {
    if (r->sent) {
        qr_conn_close(r->link->conn);
        while (!r->done) uv_run(&w->loop, UV_RUN_ONCE);
        r->status = status;
        snprintf(r->errmsg, sizeof r->errmsg, "%s", msg);
    } else {
        request_finish(r, status, msg);
    }
}

static void give_up_message(const qr_worker *w, const wk_request *r, int timeout_ms,
                            char *msg, size_t len) {
    const ps_link *l = r->link;
    if (!r->sent && l->lost_ns)
        snprintf(msg, len, "job aborted: ps %d (%s) was lost %.1f s ago and did not come back "
                 "within restart-wait-ms (%d ms); last error: %s", l->index, w->cluster->ps[l->index],
                 (double)(qr__now_ns() - l->lost_ns) / 1e9, w->restart_wait_ms, l->last_error);
    else
        snprintf(msg, len, "ps %d (%s): no %s reply within %d ms%s%s", l->index,
                 w->cluster->ps[l->index], qr_msg_name(r->type), timeout_ms,
                 l->last_error[0] ? "; last error: " : "", l->last_error);
}

/* Say what a call that has lasted a while waits for: once per ps. */
static void report_waits(const qr_worker *w, wk_request **reqs, int n, uint64_t start,
                         int timeout_ms) {
    uint64_t now = qr__now_ns();
    double waited = (double)(now - start) / 1e9;
    for (int i = 0; i < n; i++) {
        const wk_request *r = reqs[i];
        const ps_link *l = r->link;
        bool seen = false;
        for (int k = 0; k < i && !seen; k++) seen = !reqs[k]->done && reqs[k]->link == l;
        if (r->done || seen) continue;
        const char *addr = w->cluster->ps[l->index];
        if (!r->sent && l->lost_ns)
            qr__log(QR_LOG_INFO, "waiting for ps %d (%s) to come back: gone for %.0f s (%s); "
                    "giving up at %.0f s (restart-wait-ms)", l->index, addr,
                    (double)(now - l->lost_ns) / 1e9, l->last_error, w->restart_wait_ms / 1e3);
        else if (!r->sent)
            qr__log(QR_LOG_INFO, "waiting for ps %d (%s) to accept connections: %.0f s so far%s%s; "
                    "giving up after %.0f s", l->index, addr,
                    l->unreached_ns ? (double)(now - l->unreached_ns) / 1e9 : waited,
                    l->last_error[0] ? ", last error: " : "", l->last_error, timeout_ms / 1e3);
        else if (r->type == QR_MSG_TOKEN)
            qr__log(QR_LOG_INFO, "waiting %.0f s for a token of step %lld or later from ps 0: the "
                    "step's quorum is not complete (ps 0 reports whom it waits for)", waited,
                    (long long)w->local_step + 1);
        else if (r->type == QR_MSG_PUSH && (r->flags & QR_PUSH_REPLY_VALUES) &&
                 (r->flags & QR_PUSH_SYNC))
            qr__log(QR_LOG_INFO, "waiting %.0f s for ps %d (%s) to answer a sync push-and-pull: "
                    "it answers once step %lld is done%s", waited, l->index, addr,
                    (long long)w->local_step,
                    l->index ? "" : " and a token is free (ps 0 reports whom it waits for)");
        else if (r->type == QR_MSG_CLOCK)
            qr__log(QR_LOG_INFO, "waiting %.0f s at the staleness bound (max-staleness %lld) for "
                    "the slowest worker to catch up", waited, (long long)w->max_staleness);
        else
            qr__log(QR_LOG_INFO, "waiting %.0f s for ps %d (%s) to answer %s", waited, l->index,
                    addr, qr_msg_name(r->type));
    }
}


void wk_send_requests(qr_worker *w, wk_request **reqs, int n) {
    if (w->rolled_back || w->stop_status) return; /* wk_run_requests says why */
    uv_run(&w->loop, UV_RUN_NOWAIT); /* take in what happened meanwhile (see below) */
    for (int i = 0; i < n; i++) {
        wk_request *r = reqs[i];
        ps_link *l = r->link;
        if (r->done || r->sent || l->refused) continue;
        if (l->state == LINK_UP && link_send(l, r)) request_finish(r, QR_EPEERLOST, qr_last_error());
    }
    uv_run(&w->loop, UV_RUN_NOWAIT); /* start the writes */
}

/* Send reqs (connecting as needed) and wait for all their replies.
 * Returns the first failure, with its message. */
int wk_run_requests(qr_worker *w, wk_request **reqs, int n, int timeout_ms) {
    if (w->rolled_back) {
        for (int i = 0; i < n; i++) request_finish(reqs[i], w->rolled_back, w->rollback_msg);
        return qr__fail(w->rolled_back, "%s", w->rollback_msg);
    }
    uint64_t start = qr__now_ns();
    uint64_t deadline = start + (uint64_t)timeout_ms * 1000000ull;
    uint64_t next_report = start + WK_WAIT_REPORT_NS;
    /* The loop runs only inside calls: before a push, first take in what
     * happened while the caller was computing (a ps that closed its end,
     * say), so that it is not sent on a connection already gone: an async
     * push with one copy is never repeated (it may have been applied; see
     * `again` below for the pushes that are). Other requests are, after
     * a lost connection, so they skip this look (a system call on every
     * small round trip). */
    bool pushes = false;
    for (int i = 0; i < n; i++) pushes |= reqs[i]->type == QR_MSG_PUSH;
    if (pushes) uv_run(&w->loop, UV_RUN_NOWAIT);
    for (;;) {
        uint64_t now = qr__now_ns();
        uint64_t wake_at = next_report;
        int pending = 0;
        ask_view(w);
        for (int i = 0; i < n; i++) {
            wk_request *r = reqs[i];
            if (w->rolled_back && !r->done) request_give_up(w, r, w->rolled_back, w->rollback_msg);
            uint64_t dl = request_deadline(w, r, deadline);
            /* Everything but a push may be repeated safely after a lost
             * connection; a push may have been applied, so it is not,
             * but with two copies of every shard (--ps-replicas 2): the
             * copy that applied it answers it without applying it again,
             * wherever it is sent (docs/REPLICATION.md). A sync push is
             * sent again with one copy too: the ps that keeps it for its
             * step, or has just applied it, knows it by (worker, seq,
             * step) and answers it as the original (sync.c resent()); a
             * paused worker whose connections ps 0 closed would otherwise
             * leave its step without its gradient until sync-timeout-ms. */
            bool again = !r->once && (r->type != QR_MSG_PUSH || w->replicas > 1 ||
                                      (r->flags & QR_PUSH_SYNC));
            if (r->done && r->status == QR_EPEERLOST && again &&
                r->retries < (w->replicas > 1 ? 8 : 3) && now < dl) {
                if (r->type == QR_MSG_PUSH) w->pushes_resent++;
                r->retries++;
                r->done = r->sent = false;
                r->status = QR_OK;
                dl = request_deadline(w, r, deadline);
            }
            if (r->done) continue;
            /* The cluster has stopped: what is not sent yet never will be
             * (a STOP may still go: asking for it again is harmless). */
            if (w->stop_status && !r->sent && r->type != QR_MSG_STOP) {
                request_finish(r, w->stop_status, w->stop_msg);
                continue;
            }
            if (now >= dl) {
                char msg[512];
                give_up_message(w, r, timeout_ms, msg, sizeof msg);
                request_give_up(w, r, r->link->lost_ns && !r->sent ? QR_EPEERLOST : QR_ETIMEDOUT,
                                msg);
                continue;
            }
            pending++;
            wake_at = QR_MIN(wake_at, dl);
            if (r->sent) continue;
            ps_link *l = r->link;
            if (l->state == LINK_DOWN && now >= l->retry_at_ns) link_connect(l);
            if (l->refused) {
                request_finish(r, l->refused, l->refusal);
                pending--;
            } else if (l->state == LINK_UP) {
                if (link_send(l, r)) request_finish(r, QR_EPEERLOST, qr_last_error());
            } else if (l->state == LINK_DOWN) {
                wake_at = QR_MIN(wake_at, l->retry_at_ns);
            }
        }
        if (!pending) break;
        if (now >= next_report) {
            report_waits(w, reqs, n, start, timeout_ms);
            next_report += WK_WAIT_REPORT_NS;
            wake_at = QR_MIN(wake_at, next_report);
        }
        uint64_t wait_ms = (wake_at > now ? (wake_at - now) / 1000000ull : 0) + 1;
        uv_timer_start(&w->wake, on_wake, wait_ms, 0);
        uv_run(&w->loop, UV_RUN_ONCE);
        uv_timer_stop(&w->wake);
    }
    for (int i = 0; i < n; i++)
        if (reqs[i]->status) return qr__fail(reqs[i]->status, "%s", reqs[i]->errmsg);
    return QR_OK;
}

void wk_idle(qr_worker *w, int ms) {
    uint64_t until = qr__now_ns() + (uint64_t)ms * 1000000ull;
    for (uint64_t now = qr__now_ns(); now < until && !w->stop_status && !w->rolled_back;
         now = qr__now_ns()) {
        uv_timer_start(&w->wake, on_wake, (until - now) / 1000000ull + 1, 0);
        uv_run(&w->loop, UV_RUN_ONCE);
        uv_timer_stop(&w->wake);
    }
}

void wk_free_requests(wk_request **reqs, int n) {
    for (int i = 0; i < n; i++) wk_request_free(reqs[i]);
}

/* ---- the loop's life ------------------------------------------------------ */

/* The worker's loop, its wake-up timer and the events of its connections
 * (qr_worker_create). */
void wk_links_init(qr_worker *w) {
    for (int k = 0; k < w->nps; k++) w->links[k].target = k;
    /* Started after ps 0's failover (--coordinator 1): shard 0, and with
     * it the coordinator's requests and the heartbeat, are its
     * successor's. The coordinator's view, at the first HELLO it answers
     * or refuses, says the rest. */
    int coordinator = (int)qr__config_int(w->cfg, "coordinator");
    if (coordinator && w->failed) {
        w->failed[0] = 1;
        w->links[0].target = coordinator;
        w->links[0].addr = w->links[coordinator].addr; /* (parsed by qr_worker_create) */
    }
    w->events = (qr_conn_events){.connected = on_connected, .header = reply_header,
                                 .message = reply_message, .lost = on_lost};
    uv_loop_init(&w->loop);
    uv_timer_init(&w->loop, &w->wake);
}

void wk_links_report(const qr_worker *w) {
    if (w->replicas < 2) return;
    char acked[512];
    size_t off = 0;
    for (int k = 0; k < w->nps && off < sizeof acked; k++)
        off += (size_t)snprintf(acked + off, sizeof acked - off, "%s%d:%llu", k ? " " : "", k,
                                (unsigned long long)w->links[k].pushes_acked);
    qr__log(QR_LOG_INFO, "worker %d: pushes acknowledged per shard: %s; resent after a lost "
            "connection: %llu; longest push (a failover's stall): %.3f s; view %llu", w->index,
            acked, (unsigned long long)w->pushes_resent, (double)w->max_push_ns / 1e9,
            (unsigned long long)w->view);
}

/* Close every connection and the loop (qr_worker_free). */
void wk_links_close(qr_worker *w) {
    for (int i = 0; i < w->nps; i++)
        if (w->links[i].conn) qr_conn_close(w->links[i].conn);
    uv_close((uv_handle_t *)&w->wake, NULL);
    uv_run(&w->loop, UV_RUN_DEFAULT);
    uv_loop_close(&w->loop);
}

/*
 * client.c - the worker side: declares variables, connects to every ps
 * task, and pushes and pulls with blocking calls.
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
 * Pull replies are received straight into their destinations (the
 * worker's copy of each variable, or the caller's buffers); pushes are
 * written straight from the caller's gradient arrays.
 */
#include "worker/worker_internal.h"

#include "cluster/placement.h"
#include "common/init.h"
#include "common/table_options.h"
#include "optim/optim.h"
#include "worker/heartbeat.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- requests ------------------------------------------------------------ */

wk_request *wk_request_new(qr_worker *w, int ps, uint8_t type) {
    wk_request *r = qr__calloc(1, sizeof *r);
    if (!r) return NULL;
    r->link = &w->links[ps];
    r->type = type;
    r->id = ++w->next_id;
    return r;
}

void wk_request_free(wk_request *r) {
    if (!r) return;
    qr_wbuf_free(&r->meta);
    free(r->payload);
    free(r->var_ids);
    free(r->dst);
    free(r->parts);
    free(r);
}

static void request_finish(wk_request *r, int status, const char *msg) {
    r->done = true;
    r->status = status;
    if (status && msg) snprintf(r->errmsg, sizeof r->errmsg, "%s", msg);
    if (r->internal) {
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
                     "ps %d (%s) was restarted and has lost its variables: without "
                     "--checkpoint-dir there is nothing to roll back to, training cannot go on",
                     l->index, w->cluster->ps[l->index]);
        }
        qr__log(QR_LOG_WARN, "%s", w->rollback_msg);
        return; /* the link stays in LINK_HELLO: nothing more is sent on it */
    }
    if (l->lost_ns)
        qr__log(QR_LOG_INFO, "ps %d (%s) is back after %.1f s", l->index,
                w->cluster->ps[l->index], (double)(qr__now_ns() - l->lost_ns) / 1e9);
    else if (!l->incarnation)
        qr__log(QR_LOG_INFO, "connected to ps %d (%s) over %s", l->index,
                w->cluster->ps[l->index], l->conn ? qr_conn_kind(l->conn) : "?");
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
    l->head = l->tail = NULL;
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
    qr_msg_put_hello(&hello->meta, &(qr_msg_hello){.role = QR_ROLE_WORKER,
                                                   .task_index = (uint32_t)l->w->index,
                                                   .mode = l->w->sync ? 1 : 0});
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

/* A pull's reply (or a fused push's, after its step): the records of the
 * variables asked for, in order, and their values read straight into the
 * request's destinations. */
static int expect_values(qr_conn *c, ps_link *l, wk_request *r, qr_rbuf *rbp,
                         const qr_frame *f) {
    qr_rbuf rb = *rbp;
    uint32_t count = qr_msg_get_count(&rb);
    if (count != (uint32_t)r->nvars)
        return qr__fail(QR_EPROTO, "ps %d answered a pull of %d variables with %u",
                        l->index, r->nvars, count);
    qr_iov *iov = malloc((size_t)QR_MAX(count, 1) * sizeof *iov);
    if (!iov) return QR_ENOMEM;
    uint64_t total = 0;
    for (uint32_t i = 0; i < count; i++) {
        qr_msg_var rec;
        qr_msg_get_var(&rb, &rec);
        uint64_t nbytes = rec.nbytes;
        wk_var *v = &l->w->vars[r->var_ids[i]];
        wk_part *part = r->parts[i];
        part->version = rec.version;
        if (rb.bad || rec.id != (uint32_t)r->var_ids[i] || nbytes != (uint64_t)part->n * 4) {
            free(iov);
            return qr__fail(QR_EPROTO, "ps %d answered the pull of '%s' with a bad record",
                            l->index, v->name);
        }
        iov[i] = (qr_iov){r->dst[i], nbytes};
        total += nbytes;
    }
    int rc = total == f->payload_len ? qr_conn_expect(c, iov, (int)count)
                                      : qr__fail(QR_EPROTO, "ps %d: pull reply size mismatch",
                                                 l->index);
    free(iov);
    return rc;
}

static int reply_header(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    ps_link *l = qr_conn_data(c);
    wk_request *r = l->head;
    if (is_stop_notice(f))
        return f->payload_len ? qr__fail(QR_EPROTO, "ps %d sent a stop notice with a payload",
                                         l->index)
                              : QR_OK;
    if (!r || f->request_id != r->id || f->type != (r->type | QR_MSG_REPLY))
        return qr__fail(QR_EPROTO, "ps %d sent an unexpected %s reply (id %u)", l->index,
                        qr_msg_name(f->type), f->request_id);
    if (f->status != QR_OK) return QR_OK; /* error text in meta; no payload */
    qr_rbuf rb;
    qr_rbuf_init(&rb, meta, f->meta_len);
    switch (r->type) {
    case QR_MSG_PUSH:
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
    case QR_MSG_LOOKUP: {
        uint64_t count = qr_rbuf_u64(&rb);
        uint64_t bytes = r->rows * (uint64_t)r->rows_dim * sizeof(float);
        if (rb.bad || count != r->rows || f->payload_len != bytes)
            return qr__fail(QR_EPROTO, "ps %d answered a lookup of %llu rows with %llu (%llu "
                            "bytes)", l->index, (unsigned long long)r->rows,
                            (unsigned long long)count, (unsigned long long)f->payload_len);
        qr_iov iov = {r->dst[0], (size_t)bytes};
        return qr_conn_expect(c, &iov, 1);
    }
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
    wk_request *r = l->head;
    l->head = r->next;
    if (!l->head) l->tail = NULL;
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
        snprintf(msg, len, "ps %d (%s) was lost %.1f s ago and did not come back within "
                 "restart-wait-ms (%d ms); last error: %s", l->index, w->cluster->ps[l->index],
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
        else if (r->type == QR_MSG_CLOCK)
            qr__log(QR_LOG_INFO, "waiting %.0f s at the staleness bound (max-staleness %lld) for "
                    "the slowest worker to catch up", waited, (long long)w->max_staleness);
        else
            qr__log(QR_LOG_INFO, "waiting %.0f s for ps %d (%s) to answer %s", waited, l->index,
                    addr, qr_msg_name(r->type));
    }
}

#define WAIT_REPORT_NS (5000ull * 1000000ull) /* a lasting wait is said this often */

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
    uint64_t next_report = start + WAIT_REPORT_NS;
    /* The loop runs only inside calls: before a push, first take in what
     * happened while the caller was computing (a ps that closed its end,
     * say), so that it is not sent on a connection already gone: a push is
     * never repeated (it may have been applied). Other requests are, after
     * a lost connection, so they skip this look (a system call on every
     * small round trip). */
    bool pushes = false;
    for (int i = 0; i < n; i++) pushes |= reqs[i]->type == QR_MSG_PUSH;
    if (pushes) uv_run(&w->loop, UV_RUN_NOWAIT);
    for (;;) {
        uint64_t now = qr__now_ns();
        uint64_t wake_at = next_report;
        int pending = 0;
        for (int i = 0; i < n; i++) {
            wk_request *r = reqs[i];
            if (w->rolled_back && !r->done) request_give_up(w, r, w->rolled_back, w->rollback_msg);
            uint64_t dl = request_deadline(w, r, deadline);
            /* Everything but a push may be repeated safely after a lost
             * connection; a push may have been applied, so it is not. */
            if (r->done && r->status == QR_EPEERLOST && r->type != QR_MSG_PUSH &&
                r->retries < 3 && now < dl) {
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
            next_report += WAIT_REPORT_NS;
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

void wk_free_requests(wk_request **reqs, int n) {
    for (int i = 0; i < n; i++) wk_request_free(reqs[i]);
}

static int pull_vars(qr_worker *w, int n, const int *ids, float **dst, uint16_t flags);
static int push(qr_worker *w, int n, const int *ids, const float *const *grads, unsigned flags,
                float *const *values, int64_t *global_step);

/* ---- public API -------------------------------------------------------- */

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
    w->events = (qr_conn_events){.connected = on_connected, .header = reply_header,
                                 .message = reply_message, .lost = on_lost};
    uv_loop_init(&w->loop);
    uv_timer_init(&w->loop, &w->wake);
    *out = w;
    return QR_OK;
}

void qr_worker_free(qr_worker *w) {
    if (!w) return;
    qr_heartbeat_stop(w->heartbeat);
    for (int i = 0; i < w->nps; i++)
        if (w->links[i].conn) qr_conn_close(w->links[i].conn);
    uv_close((uv_handle_t *)&w->wake, NULL);
    uv_run(&w->loop, UV_RUN_DEFAULT);
    uv_loop_close(&w->loop);
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
    qr_cluster_free(w->cluster);
    qr_config_free(w->cfg);
    qr_auth_free(w->auth);
    free(w);
}

int qr_worker_declare(qr_worker *w, const char *name, int ndim, const int64_t *shape,
                      const char *init, uint64_t seed, float lr, int *var_id) {
    return wk_declare(w, name, ndim, shape, init, seed, lr, "", false, var_id);
}

int qr_worker_declare_opts(qr_worker *w, const char *name, int ndim, const int64_t *shape,
                           const char *init, uint64_t seed, const char *options, int *var_id) {
    return wk_declare(w, name, ndim, shape, init, seed, -1.0f, options ? options : "", false,
                      var_id);
}

/* A variable's options are its optimizer's, and partitions=N, which is the
 * worker's (placement) and never reaches the ps: split it off. */
static int take_partitions(const char *options, char *rest, size_t restsz, int *wanted) {
    if (strlen(options) >= restsz)
        return qr__fail(QR_EINVAL, "variable options are longer than %zu bytes", restsz - 1);
    rest[0] = 0;
    *wanted = 0;
    const char *item = options;
    while (*item) {
        size_t len = strcspn(item, ",");
        static const char key[] = "partitions=";
        if (len >= sizeof key - 1 && !strncmp(item, key, sizeof key - 1)) {
            char value[32] = "";
            size_t vlen = len - (sizeof key - 1);
            memcpy(value, item + sizeof key - 1, QR_MIN(vlen, sizeof value - 1));
            char *end = NULL;
            long n = strtol(value, &end, 10);
            if (!vlen || vlen >= sizeof value || *end || n < 1 || n > 65536)
                return qr__fail(QR_EINVAL, "partitions=%.*s: want a whole number of shards "
                                "from 1 to 65536", (int)vlen, item + sizeof key - 1);
            *wanted = (int)n;
        } else if (len) {
            size_t at = strlen(rest);
            snprintf(rest + at, restsz - at, "%s%.*s", at ? "," : "", (int)len, item);
        }
        item += len + (item[len] == ',');
    }
    return QR_OK;
}

int qr_worker_declare_values(qr_worker *w, const char *name, int ndim, const int64_t *shape,
                             const float *values, int64_t n, const char *options, int *var_id) {
    if (!values) return qr__fail(QR_EINVAL, "declare_values '%s': values is NULL",
                                 name ? name : "?");
    int id;
    int rc = wk_declare(w, name, ndim, shape, "zeros", 0, -1.0f, options ? options : "", false,
                        &id);
    if (rc) return rc;
    wk_var *v = &w->vars[id];
    if (n != v->n) {
        /* Undo the declaration: the caller may declare it again, right. */
        free(v->name);
        free(v->init);
        free(v->options);
        free(v->data);
        w->nvars--;
        return qr__fail(QR_ESHAPE, "declare_values '%s': %lld values for a shape of %lld "
                        "elements", name, (long long)n, (long long)v->n);
    }
    memcpy(v->data, values, (size_t)n * sizeof *values);
    v->given = true;
    if (var_id) *var_id = id;
    return QR_OK;
}

int wk_declare(qr_worker *w, const char *name, int ndim, const int64_t *shape, const char *init,
               uint64_t seed, float lr, const char *options, bool table, int *var_id) {
    if (!w || !name || !shape)
        return qr__fail(QR_EINVAL, "qr_worker_declare: worker, name and shape are required");
    if (w->placed)
        return qr__fail(QR_EINVAL, "declare '%s': variables must be declared before "
                        "qr_worker_initialize", name);
    size_t len = strlen(name);
    if (len < 1 || len > QR_PROTO_MAX_NAME)
        return qr__fail(QR_EINVAL, "declare: name '%s' must have 1 to %d bytes", name,
                        QR_PROTO_MAX_NAME);
    if (ndim < 1 || ndim > QR_PROTO_MAX_NDIM)
        return qr__fail(QR_EINVAL, "declare '%s': %d dimensions (1..%d allowed)", name, ndim,
                        QR_PROTO_MAX_NDIM);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1 || shape[d] > (1ll << 34) / n)
            return qr__fail(QR_ESHAPE, "declare '%s': dimension %d is %lld (must be >= 1 and "
                            "the whole variable at most 2^34 elements)", name, d,
                            (long long)shape[d]);
        n *= shape[d];
    }
    if (!init) init = "zeros";
    int rc = qr_init_validate(init);
    if (rc) return qr__fail(rc, "declare '%s': %s", name, qr_last_error());
    char optim_options[1025];
    int want_parts = 0;
    rc = take_partitions(options, optim_options, sizeof optim_options, &want_parts);
    if (!rc && want_parts && table)
        rc = qr__fail(QR_EINVAL, "a table is spread over every ps by id already; partitions= "
                      "is for dense variables");
    qr_table_options table_options;
    if (!rc) rc = qr_table_options_parse(optim_options, &table_options);
    if (!rc && !table && qr_table_options_set(&table_options))
        rc = qr__fail(QR_EINVAL, "admit_after and evict_after_steps are for embedding tables "
                      "(declare_table)");
    if (rc) return qr__fail(rc, "declare '%s': %s", name, qr_last_error());
    options = optim_options;
    if (options[0]) {
        /* Checked here, where the caller can fix it; the ps checks again. */
        qr_optim *check = NULL;
        rc = qr_optim_create_for_var(&check, w->cfg, options);
        qr_optim_free(check);
        if (rc) return qr__fail(rc, "declare '%s': %s", name, qr_last_error());
    }
    for (int i = 0; i < w->nvars; i++)
        if (!strcmp(w->vars[i].name, name))
            return qr__fail(QR_EEXIST, "declare: variable '%s' is declared twice", name);
    if (w->nvars == w->vars_cap) {
        int cap = w->vars_cap ? w->vars_cap * 2 : 16;
        wk_var *grown = realloc(w->vars, (size_t)cap * sizeof *grown);
        if (!grown) return qr__fail(QR_ENOMEM, "out of memory declaring '%s'", name);
        w->vars = grown;
        w->vars_cap = cap;
    }
    wk_var *v = &w->vars[w->nvars];
    memset(v, 0, sizeof *v);
    v->name = qr__strdup(name);
    v->init = qr__strdup(init);
    v->options = qr__strdup(options);
    v->table = table;
    v->want_parts = want_parts;
    if (table) n = 0; /* its rows live on the ps tasks only */
    v->data = table ? NULL : qr__aligned_alloc((size_t)n * sizeof(float));
    if (!v->name || !v->init || !v->options || (!table && !v->data)) {
        free(v->name);
        free(v->init);
        free(v->options);
        free(v->data);
        return QR_ENOMEM;
    }
    v->ndim = ndim;
    memcpy(v->shape, shape, (size_t)ndim * sizeof *shape);
    v->n = n;
    v->seed = seed;
    v->lr = lr;
    if (var_id) *var_id = w->nvars;
    w->nvars++;
    return QR_OK;
}

/* Split dense variable v into nparts shards along dimension 0. */
static int make_parts(wk_var *v, int nparts) {
    v->parts = qr__calloc((size_t)nparts, sizeof *v->parts);
    if (!v->parts) return QR_ENOMEM;
    v->nparts = nparts;
    int64_t row = v->n / v->shape[0], at = 0;
    for (int k = 0; k < nparts; k++) {
        int64_t rows = qr_partition_rows(v->shape[0], nparts, k);
        v->parts[k] = (wk_part){.ps = -1, .offset = at * row, .n = rows * row};
        at += rows;
    }
    char shard_name[16];
    int len = snprintf(shard_name, sizeof shard_name, "/part_%d", nparts - 1);
    if (nparts > 1 && strlen(v->name) + (size_t)len > QR_PROTO_MAX_NAME)
        return qr__fail(QR_EINVAL, "'%s' in %d shards: the shard names (NAME/part_K) would "
                        "have more than %d bytes", v->name, nparts, QR_PROTO_MAX_NAME);
    return QR_OK;
}

/* Which ps holds what: a table every ps (by id); a dense variable one ps,
 * or, partitioned, one shard on each of several, by least-loaded greedy
 * placement in declaration order (cluster/placement.h). Every worker
 * computes the same from the same declarations and options. */
static int place_variables(qr_worker *w) {
    if (w->placed) return QR_OK;
    double min_mb = qr__config_float(w->cfg, "partition-min-mb");
    int rc = QR_OK, nshards = 0;
    for (int i = 0; !rc && i < w->nvars; i++) {
        wk_var *v = &w->vars[i];
        if (v->table) continue;
        int n = qr_partition_count(v->n * 4, v->shape[0], w->nps, min_mb, v->want_parts);
        if (n < 0) rc = qr__fail(n, "'%s': %s", v->name, qr_last_error());
        if (!rc) rc = make_parts(v, n);
        nshards += v->nparts;
    }
    int64_t *bytes = rc ? NULL : qr__calloc((size_t)QR_MAX(nshards, 1), sizeof *bytes);
    int *group = rc ? NULL : qr__calloc((size_t)QR_MAX(nshards, 1), sizeof *group);
    int *ps_of = rc ? NULL : qr__calloc((size_t)QR_MAX(nshards, 1), sizeof *ps_of);
    if (!rc && (!bytes || !group || !ps_of)) rc = QR_ENOMEM;
    for (int i = 0, s = 0; !rc && i < w->nvars; i++)
        for (int k = 0; k < w->vars[i].nparts; k++, s++) {
            bytes[s] = w->vars[i].parts[k].n * 4;
            group[s] = i;
        }
    if (!rc) rc = qr_place_shards(w->nps, nshards, bytes, group, ps_of);
    for (int i = 0, s = 0; !rc && i < w->nvars; i++) {
        wk_var *v = &w->vars[i];
        char where[256] = "";
        for (int k = 0; k < v->nparts; k++) {
            v->parts[k].ps = ps_of[s++];
            size_t at = strlen(where);
            snprintf(where + at, sizeof where - at, "%s%d", k ? ", " : "", v->parts[k].ps);
        }
        if (v->nparts > 1 && w->index == 0)
            qr__log(QR_LOG_INFO, "'%s' (%.2f MiB) is partitioned in %d shards of dimension 0 "
                    "on ps %s", v->name, (double)v->n * 4 / 1048576.0, v->nparts, where);
    }
    free(bytes);
    free(group);
    free(ps_of);
    if (!rc) w->placed = true;
    return rc;
}

/* One CREATE per ps that holds variables: with values (chief) or as a
 * check of the declarations (everyone else). */
static int create_on_ps(qr_worker *w, bool check_only) {
    wk_request **reqs = qr__calloc((size_t)w->nps, sizeof *reqs);
    if (!reqs) return QR_ENOMEM;
    int rc = QR_OK, nreq = 0;
    for (int p = 0; p < w->nps && !rc; p++) {
        int count = 0;
        for (int i = 0; i < w->nvars; i++)
            count += w->vars[i].table || wk_part_on(&w->vars[i], p) != NULL;
        if (!count) continue;
        wk_request *r = wk_request_new(w, p, QR_MSG_CREATE);
        if (!r) {
            rc = QR_ENOMEM;
            break;
        }
        reqs[nreq++] = r;
        r->flags = check_only ? QR_CREATE_CHECK_ONLY : 0;
        r->payload = check_only ? NULL : qr__calloc((size_t)count, sizeof *r->payload);
        qr_msg_put_count(&r->meta, (uint32_t)count);
        for (int i = 0; i < w->nvars; i++) {
            wk_var *v = &w->vars[i];
            wk_part *part = wk_part_on(v, p);
            if (!part && !v->table) continue;
            /* A shard is a variable of its own on its ps: NAME/part_K, its
             * rows of dimension 0 (TensorFlow's names for them). */
            char shard_name[QR_PROTO_MAX_NAME + 1];
            const char *name = v->name;
            if (v->nparts > 1) {
                snprintf(shard_name, sizeof shard_name, "%s/part_%d", v->name,
                         (int)(part - v->parts));
                name = shard_name;
            }
            qr_msg_create_var rec = {.id = (uint32_t)i, .ndim = (uint32_t)v->ndim, .lr = v->lr,
                                     .name_len = (uint32_t)strlen(name), .name = name,
                                     .options_len = (uint32_t)strlen(v->options),
                                     .options = v->options};
            memcpy(rec.shape, v->shape, (size_t)v->ndim * sizeof *rec.shape);
            if (part) rec.shape[0] = part->n / (v->n / v->shape[0]);
            if (v->table) {
                rec.kind = QR_VAR_TABLE;
                rec.init = v->init;
                rec.init_len = (uint32_t)strlen(v->init);
                rec.seed = v->seed;
            }
            qr_msg_put_create_var(&r->meta, &rec);
            if (!check_only && r->payload && !v->table)
                r->payload[r->npayload++] = (qr_iov){v->data + part->offset, (size_t)part->n * 4};
        }
        if (r->meta.oom || (!check_only && !r->payload)) rc = QR_ENOMEM;
    }
    if (!rc) rc = wk_run_requests(w, reqs, nreq, w->timeout_ms);
    wk_free_requests(reqs, nreq);
    free(reqs);
    return rc;
}

static int ready_request(qr_worker *w, bool set, uint32_t *ready, int timeout_ms) {
    wk_request *r = wk_request_new(w, 0, QR_MSG_READY);
    if (!r) return QR_ENOMEM;
    qr_msg_put_ready(&r->meta, &(qr_msg_ready){.set = set, .step = w->step_limit});
    int rc = wk_run_requests(w, &r, 1, timeout_ms);
    if (ready) *ready = r->ready;
    if (!rc) w->local_step = r->step;
    if (!rc) w->restored_pos = r->data_pos;
    wk_request_free(r);
    return rc;
}

/* Ask ps 0 until the cluster is ready: the chief marks it so (ps 0 says
 * ready once every ps is in step with it), the others wait for that. The
 * wait is bounded by init-timeout-ms and said every few seconds, naming
 * what it waits for: ps 0 itself, or the chief. */
static int wait_ready(qr_worker *w, bool set) {
    int init_ms = (int)qr__config_int(w->cfg, "init-timeout-ms");
    uint64_t start = qr__now_ns(), deadline = start + (uint64_t)init_ms * 1000000ull;
    uint64_t next_report = start + WAIT_REPORT_NS;
    bool reached = false;
    for (;;) {
        uint64_t now = qr__now_ns();
        int left_ms = (int)QR_MAX(1, (int64_t)(deadline - QR_MIN(deadline, now)) / 1000000);
        uint32_t ready = 0;
        int rc = ready_request(w, set, &ready, QR_MIN(w->timeout_ms, left_ms));
        if (rc && rc != QR_EPEERLOST && rc != QR_ETIMEDOUT) return rc;
        reached |= !rc;
        if (!rc && ready) return QR_OK;
        now = qr__now_ns();
        const char *waiting_for = !reached ? "ps 0 to answer"
                                  : set ? "every ps task to be in step with ps 0"
                                        : "the chief (worker 0) to initialize the variables";
        if (now >= deadline) {
            if (!reached)
                return qr__fail(QR_ETIMEDOUT, "ps 0 (%s) could not be reached within %d ms "
                                "(init-timeout-ms)%s%s", w->cluster->ps[0], init_ms,
                                w->links[0].last_error[0] ? "; last error: " : "",
                                w->links[0].last_error);
            return qr__fail(QR_ENOTREADY, "waited %.0f s (init-timeout-ms) for %s; ps 0 "
                            "answers, but the cluster is not ready", (double)(now - start) / 1e9,
                            waiting_for);
        }
        if (now >= next_report) {
            qr__log(QR_LOG_INFO, "waiting for %s: %.0f s so far, giving up after %.0f s",
                    waiting_for, (double)(now - start) / 1e9, init_ms / 1e3);
            next_report += WAIT_REPORT_NS;
        }
        nanosleep(&(struct timespec){0, 20 * 1000000}, NULL);
    }
}

int qr_worker_initialize(qr_worker *w) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_initialize: worker is NULL");
    if (w->nvars == 0) return qr__fail(QR_EINVAL, "initialize: no variables were declared");
    int rc = place_variables(w);
    if (rc) return rc;
    if (w->index == 0) {
        for (int i = 0; i < w->nvars && !rc; i++) {
            wk_var *v = &w->vars[i];
            if (!v->table && !v->given)
                rc = qr_init_fill(v->data, v->n, v->ndim, v->shape, v->init, v->seed);
        }
        if (!rc) rc = create_on_ps(w, false);
        if (!rc) rc = wait_ready(w, true);
        if (!rc) rc = pull_vars(w, 0, NULL, NULL, 0); /* a restarted chief gets current values */
    } else {
        rc = wait_ready(w, false);
        if (!rc) rc = create_on_ps(w, true);
    }
    /* The caller names the worker (qr_train_worker does): this prefix
     * says which call failed, like the other qr_worker_* messages. */
    if (rc) qr__error_prefix("initialize: ");
    else w->initialized = true;
    int64_t beat_ms = qr__config_int(w->cfg, "heartbeat-ms");
    if (!rc && beat_ms > 0 && !w->heartbeat)
        rc = qr_heartbeat_start(&w->heartbeat, w->cluster->ps[0], w->prefer_unix, w->index,
                                (int)beat_ms, w->auth, w->conn_opt.handshake_timeout_ms);
    return rc;
}

int64_t qr_worker_var_size(const qr_worker *w, int var_id) {
    if (!w || var_id < 0 || var_id >= w->nvars) return -1;
    return w->vars[var_id].n;
}

float *qr_worker_var_data(qr_worker *w, int var_id) {
    if (!w || var_id < 0 || var_id >= w->nvars) return NULL;
    return w->vars[var_id].data;
}

int qr_worker_var_placement(const qr_worker *w, int var_id, int cap, int *ps, int64_t *offset,
                            int64_t *count) {
    if (!w || var_id < 0 || var_id >= w->nvars || cap < 0)
        return qr__fail(QR_EINVAL, "var_placement: bad worker, variable id or cap");
    if (!w->placed)
        return qr__fail(QR_ENOTREADY, "var_placement: call qr_worker_initialize first");
    const wk_var *v = &w->vars[var_id];
    for (int k = 0; k < v->nparts && k < cap; k++) {
        if (ps) ps[k] = v->parts[k].ps;
        if (offset) offset[k] = v->parts[k].offset;
        if (count) count[k] = v->parts[k].n;
    }
    return v->nparts;
}

int wk_check_ids(qr_worker *w, const char *what, int n, const int *ids) {
    if (!w) return qr__fail(QR_EINVAL, "%s: worker is NULL", what);
    if (!w->initialized)
        return qr__fail(QR_ENOTREADY, "%s: call qr_worker_initialize first", what);
    if (n < 0 || (n > 0 && !ids)) return qr__fail(QR_EINVAL, "%s: bad id list", what);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= w->nvars)
            return qr__fail(QR_ENOTFOUND, "%s: no variable with id %d (%d declared)", what,
                            ids[i], w->nvars);
    return QR_OK;
}

/* Dense pulls and pushes name no table (whose rows go by id). */
int wk_check_dense(const qr_worker *w, const char *what, int n, const int *ids) {
    for (int i = 0; i < n; i++)
        if (w->vars[ids[i]].table)
            return qr__fail(QR_EINVAL, "%s: '%s' is an embedding table: use %s", what,
                            w->vars[ids[i]].name,
                            strcmp(what, "push") ? "qr_worker_pull_rows" : "qr_worker_add_rows");
    return QR_OK;
}

/* Room in r for the count variables whose values its reply brings. */
static int expect_values_alloc(wk_request *r, int count) {
    r->var_ids = qr__calloc((size_t)count, sizeof *r->var_ids);
    r->dst = qr__calloc((size_t)count, sizeof *r->dst);
    r->parts = qr__calloc((size_t)count, sizeof *r->parts);
    return r->var_ids && r->dst && r->parts ? QR_OK : QR_ENOMEM;
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
        qr_msg_put_count(&r->meta, (uint32_t)count);
        for (int i = 0; i < total; i++) {
            int id = n ? ids[i] : i;
            wk_part *part = wk_part_on(&w->vars[id], p);
            if (!part) continue;
            r->var_ids[r->nvars] = id;
            r->parts[r->nvars] = part;
            /* A NULL entry, like a NULL array, means the worker's copy. */
            r->dst[r->nvars] = (dst && dst[i] ? dst[i] : w->vars[id].data) + part->offset;
            r->nvars++;
            qr_msg_put_id(&r->meta, (uint32_t)id);
        }
    }
    c->n = nreq;
    return rc;
}

static int pull_vars(qr_worker *w, int n, const int *ids, float **dst, uint16_t flags) {
    wk_call c;
    int rc = wk_pull_build(w, n, ids, dst, flags, &c);
    if (!rc) rc = wk_run_requests(w, c.reqs, c.n, w->timeout_ms);
    wk_call_free(&c);
    return rc;
}

int qr_worker_pull(qr_worker *w, int n, const int *ids, float **dst) {
    int rc = wk_check_ids(w, "pull", n, ids);
    if (!rc) rc = wk_check_dense(w, "pull", n, ids);
    return rc ? rc : pull_vars(w, n, ids, dst, 0);
}

int qr_worker_pull_averages(qr_worker *w, int n, const int *ids, float **dst) {
    int rc = wk_check_ids(w, "pull_averages", n, ids);
    if (!rc) rc = wk_check_dense(w, "pull_averages", n, ids);
    return rc ? rc : pull_vars(w, n, ids, dst, QR_PULL_AVERAGES);
}

int qr_worker_push(qr_worker *w, int n, const int *ids, const float *const *grads,
                   unsigned flags, int64_t *global_step) {
    int rc = push(w, n, ids, grads, flags, NULL, global_step);
    wk_rows_clear(w); /* sent, or not: the added rows are used up either way */
    return rc;
}

int qr_worker_push_pull(qr_worker *w, int n, const int *ids, const float *const *grads,
                        float *const *values, unsigned flags, int64_t *global_step) {
    float **copies = NULL; /* values NULL: every variable into the worker's copy */
    if (!values && n > 0 && !(copies = qr__calloc((size_t)n, sizeof *copies))) return QR_ENOMEM;
    int rc = push(w, n, ids, grads, flags, values ? values : copies, global_step);
    wk_rows_clear(w);
    free(copies);
    return rc;
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
    /* Async: the step flag rides on the push to ps 0. Sync: ps 0 counts
     * the push when it is committed, below. */
    bool step_to_ps0 = !w->sync && (flags & QR_PUSH_STEP);
    /* How many ps this call reaches: each is told, so that an async
     * checkpoint can tell a push that reached some of them from a whole
     * one (src/ps/checkpoint.c). */
    uint32_t nparts = 0;
    for (int p = 0; p < w->nps; p++) {
        bool reaches = (step_to_ps0 && p == 0) || (flags & QR_PUSH_EVERY_PS) || wk_rows_items(w, p);
        for (int i = 0; i < n && !reaches; i++) reaches = wk_part_on(&w->vars[ids[i]], p) != NULL;
        nparts += reaches;
    }
    for (int p = 0; p < w->nps && !rc; p++) {
        int count = 0, row_items = wk_rows_items(w, p);
        for (int i = 0; i < n; i++) count += wk_part_on(&w->vars[ids[i]], p) != NULL;
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
        r->payload = qr__calloc((size_t)QR_MAX(count + 2 * row_items, 1), sizeof *r->payload);
        if (!r->payload) {
            rc = QR_ENOMEM;
            break;
        }
        if (values && !w->sync && count) {
            /* The reply brings the values of the dense items, in order. */
            r->flags |= QR_PUSH_REPLY_VALUES;
            if ((rc = expect_values_alloc(r, count))) break;
        }
        qr_msg_put_push_head(&r->meta, &(qr_msg_push_head){.count = (uint32_t)(count + row_items),
                                                           .local_step = w->local_step,
                                                           .worker = (uint32_t)w->index,
                                                           .seq = seq, .nparts = nparts,
                                                           .data_pos = w->data_pos});
        for (int i = 0; i < n; i++) {
            wk_var *v = &w->vars[ids[i]];
            wk_part *part = wk_part_on(v, p);
            if (!part) continue;
            if (!grads[i]) {
                rc = qr__fail(QR_EINVAL, "push: gradient %d ('%s') is NULL", i, v->name);
                break;
            }
            qr_msg_put_var(&r->meta, &(qr_msg_var){.id = (uint32_t)ids[i], .kind = QR_GRAD_DENSE,
                                                   .nbytes = (uint64_t)part->n * 4,
                                                   .version = part->version});
            r->payload[r->npayload++] =
                (qr_iov){(void *)(grads[i] + part->offset), (size_t)part->n * 4};
            if (r->flags & QR_PUSH_REPLY_VALUES) {
                r->var_ids[r->nvars] = ids[i];
                r->parts[r->nvars] = part;
                r->dst[r->nvars++] = (values[i] ? values[i] : v->data) + part->offset;
            }
        }
        wk_rows_put(w, p, r);
    }
    c->n = nreq;
    c->counts_step = step_to_ps0;
    return rc;
}

/* The async part of a push once its requests are answered. */
void wk_push_done(qr_worker *w, const wk_call *c, int64_t *global_step) {
    if (global_step && c->step_req) *global_step = c->step_req->step;
    if (c->counts_step) w->steps_pushed++;
}

static int push(qr_worker *w, int n, const int *ids, const float *const *grads,
                unsigned flags, float *const *values, int64_t *global_step) {
    wk_call call;
    int rc = wk_push_build(w, n, ids, grads, flags, values, &call);
    if (!rc) rc = wk_run_requests(w, call.reqs, call.n, w->timeout_ms);
    if (!rc) wk_push_done(w, &call, global_step);
    uint32_t seq = call.seq;
    wk_call_free(&call);
    /* Sync: a push some ps found stale is still committed, so that ps 0
     * counts it and gives the worker its place in the token queue (it
     * will find it stale too). */
    if (!w->sync || (rc && rc != QR_ESTALE)) return rc;

    /* Every ps holds this push's gradients: now ps 0 may count it. */
    wk_request *c = wk_request_new(w, 0, QR_MSG_COMMIT);
    if (!c) return QR_ENOMEM;
    qr_msg_put_commit(&c->meta, &(qr_msg_commit){.worker = (uint32_t)w->index, .seq = seq,
                                                 .local_step = w->local_step,
                                                 .data_pos = w->data_pos});
    rc = wk_run_requests(w, &c, 1, w->timeout_ms);
    if (!rc && global_step) *global_step = c->step;
    wk_request_free(c);
    if ((rc && rc != QR_ESTALE) || !values) return rc;
    /* Sync: the values after this step are there once the step is done,
     * which taking the token waits for (a stale push too: the caller gets
     * QR_ESTALE and fresh values). Three round trips, not one. */
    int stale = rc;
    int64_t step;
    rc = qr_worker_take_token(w, &step);
    if (!rc && global_step) *global_step = step;
    if (!rc) rc = pull_vars(w, n, ids, (float **)values, 0);
    return rc ? rc : stale;
}

int qr_worker_take_token(qr_worker *w, int64_t *step) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_take_token: worker is NULL");
    if (!w->sync) return qr__fail(QR_EINVAL, "take_token: this worker trains in async mode");
    if (!w->initialized) return qr__fail(QR_ENOTREADY, "take_token: call qr_worker_initialize first");
    wk_request *r = wk_request_new(w, 0, QR_MSG_TOKEN);
    if (!r) return QR_ENOMEM;
    qr_msg_put_worker(&r->meta, (uint32_t)w->index);
    /* ps 0 ends a stalled wait after sync-timeout-ms with its report; this
     * deadline is only the safety net for a ps 0 that cannot answer. */
    int rc = wk_run_requests(w, &r, 1, 2 * w->sync_timeout_ms + 5000);
    if (!rc) {
        w->local_step = r->step;
        if (step) *step = r->step;
    }
    wk_request_free(r);
    return rc;
}

int qr_worker_local_step(const qr_worker *w, int64_t *step) {
    if (!w || !step) return qr__fail(QR_EINVAL, "qr_worker_local_step: bad arguments");
    *step = w->local_step;
    return QR_OK;
}

int qr_worker_set_step_limit(qr_worker *w, int64_t last_step) {
    if (!w || last_step < 0) return qr__fail(QR_EINVAL, "qr_worker_set_step_limit: bad arguments");
    w->step_limit = last_step;
    return QR_OK;
}

int qr_worker_wait_bound(qr_worker *w) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_wait_bound: worker is NULL");
    if (w->sync || w->max_staleness < 0) return QR_OK;
    wk_request *r = wk_request_new(w, 0, QR_MSG_CLOCK);
    if (!r) return QR_ENOMEM;
    qr_msg_put_clock(&r->meta, &(qr_msg_clock){.worker = (uint32_t)w->index,
                                               .clock = w->steps_pushed});
    int rc = wk_run_requests(w, &r, 1, 2 * w->sync_timeout_ms + 5000);
    wk_request_free(r);
    return rc;
}

/* Add the number named key of a ps's statistics to total's. */
static void add_number(cJSON *total, const cJSON *part, const char *key) {
    cJSON *a = cJSON_GetObjectItem(total, key);
    const cJSON *b = cJSON_GetObjectItem(part, key);
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b))
        cJSON_SetNumberValue(a, a->valuedouble + b->valuedouble);
}

/* Sum the arrays named key of every ps's statistics into total[]. */
static void add_array(cJSON *total, const cJSON *part, const char *key) {
    cJSON *a = cJSON_GetObjectItem(total, key);
    const cJSON *b = cJSON_GetObjectItem(part, key);
    if (!cJSON_IsArray(a) || !cJSON_IsArray(b)) return;
    int n = QR_MIN(cJSON_GetArraySize(a), cJSON_GetArraySize(b));
    for (int i = 0; i < n; i++) {
        cJSON *x = cJSON_GetArrayItem(a, i);
        cJSON_SetNumberValue(x, x->valuedouble + cJSON_GetArrayItem(b, i)->valuedouble);
    }
}

/* "tables": {name: {figure: n}} of each ps, summed into total's. */
static void add_tables(cJSON *total, const cJSON *part) {
    const cJSON *tables = cJSON_GetObjectItemCaseSensitive(part, "tables");
    if (!cJSON_IsObject(tables)) return;
    cJSON *into = cJSON_GetObjectItemCaseSensitive(total, "tables");
    if (!into) into = cJSON_AddObjectToObject(total, "tables");
    const cJSON *table;
    cJSON_ArrayForEach(table, tables) {
        cJSON *mine = cJSON_GetObjectItemCaseSensitive(into, table->string);
        if (!mine) {
            cJSON_AddItemToObject(into, table->string, cJSON_Duplicate(table, true));
            continue;
        }
        const cJSON *figure;
        cJSON_ArrayForEach(figure, table) add_number(mine, table, figure->string);
    }
}

int qr_worker_stats(qr_worker *w, char *buf, size_t len) {
    if (!w || !buf || len < 3) return qr__fail(QR_EINVAL, "qr_worker_stats: bad arguments");
    wk_request **reqs = qr__calloc((size_t)w->nps, sizeof *reqs);
    if (!reqs) return QR_ENOMEM;
    int rc = QR_OK;
    for (int p = 0; p < w->nps; p++) {
        reqs[p] = wk_request_new(w, p, QR_MSG_STATS);
        if (!reqs[p]) rc = QR_ENOMEM;
        else reqs[p]->want_meta = true;
    }
    if (!rc) rc = wk_run_requests(w, reqs, w->nps, w->timeout_ms);
    cJSON *total = NULL;
    for (int p = 0; !rc && p < w->nps; p++) {
        cJSON *part = cJSON_ParseWithLength((const char *)reqs[p]->reply_meta,
                                            reqs[p]->reply_meta_len);
        if (!part) {
            rc = qr__fail(QR_EPROTO, "ps %d sent statistics that are not JSON", p);
            break;
        }
        if (!total) {
            total = part;
            cJSON_DeleteItemFromObject(total, "ps");
        } else {
            add_array(total, part, "staleness");
            add_number(total, part, "applied_on_arrival");
            add_number(total, part, "rebased_on_arrival");
            add_tables(total, part);
            cJSON_Delete(part);
        }
    }
    if (!rc) {
        char *text = cJSON_PrintUnformatted(total);
        if (!text) rc = QR_ENOMEM;
        else if (strlen(text) + 1 > len)
            rc = qr__fail(QR_ETOOBIG, "statistics need %zu bytes", strlen(text) + 1);
        else
            memcpy(buf, text, strlen(text) + 1);
        free(text);
    }
    cJSON_Delete(total);
    for (int p = 0; p < w->nps; p++)
        if (reqs[p]) free(reqs[p]->reply_meta);
    wk_free_requests(reqs, w->nps);
    free(reqs);
    return rc;
}

int qr_worker_global_step(qr_worker *w, int64_t *global_step) {
    if (!w || !global_step) return qr__fail(QR_EINVAL, "qr_worker_global_step: bad arguments");
    wk_request *r = wk_request_new(w, 0, QR_MSG_STEP);
    if (!r) return QR_ENOMEM;
    int rc = wk_run_requests(w, &r, 1, w->timeout_ms);
    if (!rc) *global_step = r->step;
    wk_request_free(r);
    return rc;
}

int qr_worker_set_data_position(qr_worker *w, uint64_t position) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_set_data_position: worker is NULL");
    w->data_pos = position;
    return QR_OK;
}

int qr_worker_data_position(const qr_worker *w, uint64_t *position) {
    if (!w || !position)
        return qr__fail(QR_EINVAL, "qr_worker_data_position: worker and position are required");
    if (!w->initialized)
        return qr__fail(QR_EINVAL, "qr_worker_data_position: call qr_worker_initialize first");
    *position = w->restored_pos;
    return QR_OK;
}

int qr_worker_checkpoint(qr_worker *w, int64_t *global_step) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_checkpoint: worker is NULL");
    if (!w->initialized)
        return qr__fail(QR_EINVAL, "qr_worker_checkpoint: call qr_worker_initialize first");
    wk_request *r = wk_request_new(w, 0, QR_MSG_SAVE);
    if (!r) return QR_ENOMEM;
    /* Written by every ps: as long as a final checkpoint may take. */
    int rc = wk_run_requests(w, &r, 1, (int)qr__config_int(w->cfg, "init-timeout-ms"));
    if (!rc && global_step) *global_step = r->step;
    wk_request_free(r);
    return rc;
}

int qr_worker_leave(qr_worker *w) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_leave: worker is NULL");
    if (!w->initialized) return qr__fail(QR_EINVAL, "qr_worker_leave: call qr_worker_initialize first");
    wk_request *r = wk_request_new(w, 0, QR_MSG_LEAVE);
    if (!r) return QR_ENOMEM;
    int rc = wk_run_requests(w, &r, 1, w->timeout_ms);
    wk_free_requests(&r, 1);
    return rc;
}

int qr_worker_stop_cluster(qr_worker *w) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_stop_cluster: worker is NULL");
    wk_request **reqs = qr__calloc((size_t)w->nps, sizeof *reqs);
    if (!reqs) return QR_ENOMEM;
    w->stopping = true; /* the ps tasks going away is what this asks for */
    for (int p = 0; p < w->nps; p++) reqs[p] = wk_request_new(w, p, QR_MSG_STOP);
    int rc = QR_OK;
    for (int p = 0; p < w->nps; p++)
        if (!reqs[p]) rc = QR_ENOMEM;
    /* ps 0 first: with checkpoints on, it answers once the final
     * checkpoint, which needs every ps, is written (init-timeout-ms
     * bounds that wait); then the others. */
    if (!rc) rc = wk_run_requests(w, reqs, 1, (int)qr__config_int(w->cfg, "init-timeout-ms"));
    if (!rc && w->nps > 1) rc = wk_run_requests(w, reqs + 1, w->nps - 1, w->timeout_ms);
    wk_free_requests(reqs, w->nps);
    free(reqs);
    return rc;
}

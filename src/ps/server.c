/*
 * server.c - a ps task: its loop, its connections, the dispatch of each
 * request to the file of its family (ps_internal.h lists them), and its
 * start and stop.
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
 * The lifecycle is asked for, never run, by the rest of the ps
 * (ps_internal.h, "The lifecycle"): a STOP request (from the chief or ps
 * 0), qr_ps_stop(), an abort, the orderly end of a run, a rollback. This
 * file carries out what was asked in one place, on_lifecycle, which the
 * loop runs before it next waits. A stop closes the listener, answers
 * every later request with QR_ESTOPPED, and waits up to linger-ms for the
 * workers to hang up before the loop ends.
 *
 * A rollback (rollback.c) ends the run of the ps the same way, without
 * the stop async, and qr_ps_run starts the ps again in the same loop
 * (reopen), restoring the checkpoint the rollback names.
 */
#include "ps/ps_internal.h"
#include "ps/tier.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* ---- dispatch -------------------------------------------------------------- */

/* A STOP from a worker is bare; ps 0's says how the run ended and why
 * (wire/msg.h), which only ps 0 may say. */
static int stop_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    bool from_ps0 = p->role == QR_ROLE_COORDINATOR;
    if (f->payload_len || f->meta_len >= sizeof p->ps->abort_msg || (f->meta_len && !from_ps0))
        return qr__fail(QR_EPROTO, "STOP carries %u meta and %llu payload bytes (a worker's "
                        "carries none, ps 0's up to %zu of meta)", f->meta_len,
                        (unsigned long long)f->payload_len, sizeof p->ps->abort_msg - 1);
    if (f->status && (!from_ps0 || (f->status != QR_EABORTED && f->status != QR_ECHIEFLOST)))
        return qr__fail(QR_EINVAL, "STOP with status %d: only ps 0 stops a run with a status "
                        "(QR_EABORTED, QR_ECHIEFLOST)", f->status);
    return QR_OK;
}

static void stop_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr__log(QR_LOG_INFO, "stop requested by %s", p->worker_index >= 0 ? "a worker" : "a peer");
    if (f->meta_len) {
        /* ps 0 says why the run ended: this ps ends with the same status
         * and tells its workers the same reason. */
        char why[sizeof p->ps->abort_msg];
        memcpy(why, meta, f->meta_len);
        why[f->meta_len] = 0;
        if (f->status) qr__ps_abort_as(p->ps, f->status, why);
        else if (!p->ps->end_msg[0]) snprintf(p->ps->end_msg, sizeof p->ps->end_msg, "%s", why);
    }
    /* An orderly stop on ps 0 writes the final checkpoint first; the
     * reply and the stop follow it. */
    if (qr__ckpt_final(p->ps, p, f)) return;
    qr__peer_reply(p, f, QR_OK, NULL, NULL, 0, NULL, NULL);
    qr__ps_ask_stop(p->ps);
}

/* A push is held for its step's quorum (sync.c) or applied now (push.c). */
static void push_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    bool held = (f->flags & QR_PUSH_SYNC) && (f->flags & QR_PUSH_REPLY_VALUES);
    /* Shard 0's part goes to the coordinator (ps 0, or its successor
     * serving shard 0's copy); any other shard's, ps 0's own or a copy it
     * serves since a failover (--ps-replicas 2), is held as any ps k
     * holds one. */
    if (held && qr__peer_coordinator_part(p)) qr__coord_held_push(p, f);
    else if (f->flags & QR_PUSH_SYNC) qr__sync_push_message(p, f);
    else qr__push_message(p, f);
}

/* What a ps does with each message type, in one table, as Redis's
 * command table: `check` validates the header and meta when they arrive
 * and makes ready for the payload (NULL: a request of no meta and no
 * payload); `handle` runs once the payload is in and every check passed;
 * `timed` requests are counted in the metrics with their latency. A type
 * with no row (a reply, or one only workers receive) is refused. */
typedef struct ps_handler {
    int (*check)(ps_peer *p, const qr_frame *f, const uint8_t *meta);
    void (*handle)(ps_peer *p, const qr_frame *f, const uint8_t *meta);
    bool timed;
    /* May change the ps's state (rollback.c: a run that has not moved).
     * CREATE says it itself (create.c): a restarted chief's CREATE of the
     * variables a checkpoint restored changes nothing, and it may reach a
     * restarted ps before ps 0's rolled-back run does. */
    bool changes;
} ps_handler;

static const ps_handler handlers[] = {
    [QR_MSG_HELLO] = {qr__control_header, qr__control_message, false, false},
    [QR_MSG_READY] = {qr__control_header, qr__control_message, false, false},
    [QR_MSG_STEP] = {qr__control_header, qr__control_message, false, false},
    [QR_MSG_STATS] = {qr__control_header, qr__control_message, false, false},
    [QR_MSG_COMMIT] = {qr__coord_header, qr__coord_commit, false, true},
    [QR_MSG_TOKEN] = {qr__coord_header, qr__coord_token, false, true},
    [QR_MSG_APPLY] = {qr__sync_apply_header, qr__sync_apply_message, false, true},
    /* RELEASE and BEAT have no reply */
    [QR_MSG_RELEASE] = {qr__sync_release_header, qr__sync_release_message, false, true},
    [QR_MSG_CLOCK] = {qr__bound_clock_header, qr__bound_clock, false, true},
    [QR_MSG_STOP] = {stop_header, stop_message, false, false},
    [QR_MSG_PUSH] = {qr__push_header, push_message, true, true},
    [QR_MSG_PULL] = {qr__pull_header, qr__pull_message, true, false},
    [QR_MSG_LOOKUP] = {qr__lookup_header, qr__lookup_message, false, true},
    [QR_MSG_CREATE] = {qr__create_header, qr__create_message, false, false},
    [QR_MSG_CKPT] = {qr__ckpt_header, qr__ckpt_message, false, true},
    [QR_MSG_BEAT] = {qr__liveness_beat_header, qr__liveness_beat, false, false},
    [QR_MSG_LEAVE] = {NULL, qr__liveness_leave, false, false},
    [QR_MSG_SAVE] = {NULL, qr__ckpt_save_message, false, true},
    [QR_MSG_SLOTS] = {qr__slots_header, qr__slots_message, false, true},
    [QR_MSG_REPLICATE] = {qr__replica_header, qr__replica_message, false, true},
    [QR_MSG_VIEW] = {qr__failover_view_header, qr__failover_view_message, false, false},
    [QR_MSG_SNAPSHOT] = {qr__rerep_snapshot_header, qr__rerep_snapshot_message, false, true},
};

static const ps_handler *handler_of(unsigned type) {
    if (type >= sizeof handlers / sizeof handlers[0] || !handlers[type].handle) return NULL;
    return &handlers[type];
}

/* Check a request's header and meta, by its family, and make ready for
 * its payload. A failure is held and answered in on_message. */
static int check_request(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    if (f->type & QR_MSG_REPLY)
        return qr__fail(QR_EPROTO, "a ps does not accept %s replies", qr_msg_name(f->type));
    /* A stopping backup still applies its primary's forwards: the copies
     * end equal (replica.c, qr__replica_stop). */
    if (p->ps->stopping && f->type != QR_MSG_STOP &&
        !(p->role == QR_ROLE_REPLICA && f->type == QR_MSG_REPLICATE))
        return qr__fail(p->ps->exit_status ? p->ps->exit_status : QR_ESTOPPED, "%s",
                        qr__ps_stop_reason(p->ps));
    const ps_handler *h = handler_of(f->type);
    if (!h) return qr__fail(QR_EPROTO, "unexpected message type %u", f->type);
    /* A replica link names the backup's store: only the copy travels there. */
    if (p->role == QR_ROLE_REPLICA && f->type != QR_MSG_CREATE &&
        f->type != QR_MSG_REPLICATE && f->type != QR_MSG_SNAPSHOT && f->type != QR_MSG_STATS &&
        f->type != QR_MSG_STOP)
        return qr__fail(QR_EPROTO, "a replica link carries CREATE and REPLICATE (and SNAPSHOT), not %s",
                        qr_msg_name(f->type));
    return h->check ? h->check(p, f, meta) : qr__peer_check_small(f, 0);
}

/* A run rolling back serves nothing more: its connections close (all of
 * them before the loop next waits, on_lifecycle), so that its workers find
 * the next run when they reconnect, as they would had it closed at once.
 * Answering "stopped" instead would end them. */
static bool rolling_back(qr_ps *ps, qr_conn *c) {
    if (!ps->rollback.wanted) return false;
    qr_conn_close(c);
    return true;
}

static int on_header(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    ps_peer *p = qr_conn_data(c);
    if (rolling_back(p->ps, c)) return QR_OK;
    if (qr__ps_fenced(p->ps)) {
        qr_conn_close(c); /* this run is over: nothing is answered (on_lifecycle ends it) */
        return QR_OK;
    }
    if (p->role == QR_ROLE_COORDINATOR) p->ps->coordinator_heard_ns = qr__now_ns();
    /* What the previous request left is gone by now. */
    p->err = QR_OK;
    p->header_ns = qr__now_ns();
    p->nitems = 0;
    p->check.items = NULL;
    qr__create_drop(p);
    qr__sync_push_free(p->ps, p->incoming);
    p->incoming = NULL;
    int rc = check_request(p, f, meta);
    if (rc) {
        qr__create_drop(p);
        qr__peer_hold_error(p, rc);
    }
    return QR_OK;
}

static void on_message(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    ps_peer *p = qr_conn_data(c);
    if (rolling_back(p->ps, c)) return; /* its buffers go back in on_lost */
    if (qr__ps_fenced(p->ps)) {
        qr_conn_close(c);
        return;
    }
    /* check_request held an error for any type without a handler. */
    const ps_handler *h = handler_of(f->type);
    if (p->err) {
        qr__peer_reply_error(p, f, p->err, p->errmsg);
        qr__sync_push_refused(p, f, p->err, p->errmsg);
    } else {
        p->ps->changed |= h->changes;
        h->handle(p, f, meta);
    }
    if (!p->err && h->timed) qr__metrics_request(p, f);
    /* Every request is done with its payload by now, but a parked push. */
    if (!p->parked) qr__peer_release_recv(p);
}

/* More of a push's payload is in: check the new part while it is hot.
 * A snapshot's: its head in, the rest is placed (rerep.c). */
static void on_payload(qr_conn *c, uint64_t got) {
    ps_peer *p = qr_conn_data(c);
    if (p->check.items) qr__grad_check_advance(&p->check, got);
    if (p->snapshot) qr__rerep_snapshot_payload(p, got);
}

/* ---- connections ---------------------------------------------------------- */

/* Not known to be a task of the job: no HELLO (a worker, ps 0's link)
 * and no heartbeat yet. */
static bool unidentified(const ps_peer *p) {
    return p->role == 0 && p->beat_worker < 0;
}

/* At max-connections, make room for a new connection by closing the one
 * least likely to be a task of the job: the oldest that has completed no
 * request, else the oldest unidentified one. Connections that anyone can
 * open without a secret must not lock a worker out (they did: 1,030 silent
 * connections kept a real worker out until it gave up); a worker says
 * HELLO as its first request, so it is never the one closed once it has.
 * False if every connection is identified. */
static bool evict_for(qr_ps *ps, qr_conn *incoming) {
    ps_peer *silent = NULL, *anonymous = NULL; /* the list runs newest first */
    for (ps_peer *p = ps->peers; p; p = p->next) {
        if (!unidentified(p) || p->evicted) continue;
        anonymous = p;
        if (qr_conn_messages_in(p->conn) == 0) silent = p;
    }
    ps_peer *victim = silent ? silent : anonymous;
    if (!victim) return false;
    victim->evicted = true;
    ps->peers_evicting++;
    ps->peers_evicted++;
    uint64_t dropped;
    if (qr__log_allow(&ps->evicted_log, 1, &dropped))
        qr__log(QR_LOG_WARN, "closed the connection from %s (%s) to make room for one from %s: "
                "%d connections are open (max-connections); %llu closed so far",
                qr_conn_peer(victim->conn),
                victim == silent ? "no complete request yet" : "no HELLO",
                qr_conn_peer(incoming), ps->npeers, (unsigned long long)ps->peers_evicted);
    qr_conn_close(victim->conn);
    return true;
}

static void on_accepted(qr_listener *l, qr_conn *c) {
    qr_ps *ps = qr_listener_data(l);
    if (qr__ps_fenced(ps)) {
        qr_conn_set_data(c, NULL);
        qr_conn_close(c);
        return;
    }
    /* Those closed to make room are gone once their `lost` comes. */
    if (ps->npeers - ps->peers_evicting >= ps->max_peers && !evict_for(ps, c)) {
        /* Anyone who can reach the port could otherwise hold the ps's
         * memory and file descriptors with idle connections. */
        ps->peers_refused++;
        uint64_t dropped;
        if (qr__log_allow(&ps->refused_log, 1, &dropped))
            qr__log(QR_LOG_WARN, "refused a connection from %s: %d connections are open "
                    "(max-connections); %llu refused so far", qr_conn_peer(c), ps->npeers,
                    (unsigned long long)ps->peers_refused);
        qr_conn_set_data(c, NULL); /* no peer: on_lost has nothing to undo */
        qr_conn_close(c);
        return;
    }
    ps_peer *p = qr__calloc(1, sizeof *p);
    if (!p) {
        qr_conn_close(c);
        return;
    }
    p->ps = ps;
    p->conn = c;
    p->worker_index = -1;
    p->beat_worker = -1;
    p->next = ps->peers;
    if (ps->peers) ps->peers->prev = p;
    ps->peers = p;
    ps->npeers++;
    qr_conn_set_data(c, p);
}


/* A connection refused at its handshake: counted by reason, and logged
 * with the peer's address and the reason, up to HANDSHAKE_LOGS_PER_SEC
 * lines a second (anyone who reaches the port could otherwise fill the
 * log); the lines left out are counted in the next one. */
#define HANDSHAKE_LOGS_PER_SEC 5
static void handshake_refused(qr_ps *ps, qr_conn *c) {
    int why = qr_conn_refusal(c);
    ps->handshakes_refused[why >= 0 && why <= QR_HS_REFUSAL_MAX ? why : QR_HS_MALFORMED]++;
    uint64_t dropped;
    if (!qr__log_allow(&ps->handshake_log, HANDSHAKE_LOGS_PER_SEC, &dropped)) return;
    char more[64] = "";
    if (dropped)
        snprintf(more, sizeof more, " (and %llu more refused since the last report)",
                 (unsigned long long)dropped);
    qr__log(QR_LOG_WARN, "refused %s%s", qr_conn_refusal_message(c), more);
}

static void on_lost(qr_conn *c, int status) {
    ps_peer *p = qr_conn_data(c);
    if (!p) return;
    qr_ps *ps = p->ps;
    if (status == QR_EAUTH && qr_conn_refusal(c)) handshake_refused(ps, c);
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
        --ps->worker_conns[p->worker_index] == 0) {
        ps->worker_lost_ns[p->worker_index] = qr__now_ns();
        if (p->worker_index == 0) ps->liveness.chief_lost_step = ps->global_step;
        qr__liveness_worker_gone(ps, p->worker_index);
    }
    if (p->role == QR_ROLE_COORDINATOR) qr__liveness_coordinator_lost(ps);
    if (ps->sync.on && qr__ps_coordinates(ps)) qr__coord_peer_lost(p);
    if (ps->sync.on) qr__sync_peer_lost(p);
    if (!ps->sync.on && qr__ps_coordinates(ps)) qr__bound_peer_lost(p);
    qr__replica_peer_lost(p);
    qr__rerep_peer_lost(p);
    if (p->prev) p->prev->next = p->next;
    else ps->peers = p->next;
    if (p->next) p->next->prev = p->prev;
    ps->npeers--;
    if (p->evicted) ps->peers_evicting--;
    qr__create_drop(p);
    qr__ckpt_peer_lost(p);
    qr__sync_push_free(p->ps, p->incoming);
    qr__peer_release_recv(p); /* before the items it reads */
    free(p->items);
    free(p);
}

/* ---- lifecycle ---------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h) {
    (void)h;
}

/* Close every handle of this run of the ps; the stop async stays (it is
 * the loop's, kept across a rollback). */
static void close_run_handles(qr_ps *ps) {
    qr__ckpt_close(ps);
    qr__liveness_close(ps);
    qr__metrics_close(ps);
    qr__links_close(ps);
    qr__replica_close(ps);
    if (ps->sync.on && qr__ps_coordinates(ps)) qr__coord_close(ps);
    qr__bound_close(ps);
    if (!uv_is_closing((uv_handle_t *)&ps->linger_timer))
        uv_close((uv_handle_t *)&ps->linger_timer, on_handle_closed);
}

static void close_loop_handles(qr_ps *ps) {
    close_run_handles(ps);
    if (!uv_is_closing((uv_handle_t *)&ps->stop_async))
        uv_close((uv_handle_t *)&ps->stop_async, on_handle_closed);
    if (!uv_is_closing((uv_handle_t *)&ps->lifecycle))
        uv_close((uv_handle_t *)&ps->lifecycle, on_handle_closed);
}

/* A stopping ps is done once every peer has hung up and ps 0's links have
 * delivered their STOP (or given up). */
static void finish_if_idle(qr_ps *ps) {
    if (!ps->stop_begun || ps->npeers != 0 || ps->rollback.wanted) return;
    if (qr__links_busy(ps) || qr__replica_busy(ps)) return;
    close_loop_handles(ps);
}

static void on_linger_timeout(uv_timer_t *t) {
    qr_ps *ps = t->data;
    if (ps->npeers)
        qr__log(QR_LOG_INFO, "closing %d connection(s) still open %d ms after the stop",
                ps->npeers, ps->linger_ms);
    for (ps_peer *p = ps->peers; p; p = p->next) qr_conn_close(p->conn);
    close_loop_handles(ps);
}

/* The stop, carried out: no more connections, the other parts of the ps
 * told, the workers told, and linger-ms for them to hang up. */
static void begin_stop(qr_ps *ps) {
    if (ps->stop_begun) return;
    ps->stop_begun = ps->stopping = true;
    qr__rerep_stop(ps);
    qr__links_stop(ps);
    qr__replica_stop(ps);
    if (ps->sync.on && qr__ps_coordinates(ps)) qr__coord_stop(ps);
    if (ps->sync.on)
        qr__sync_stop(ps, ps->exit_status ? ps->exit_status : QR_ESTOPPED, qr__ps_stop_reason(ps));
    if (!ps->sync.on && qr__ps_coordinates(ps)) qr__bound_stop(ps);
    qr_listener_close(ps->listener);
    ps->listener = NULL;
    /* Workers hear it now, not at their next request: one waiting for
     * another ps to come back would wait out restart-wait-ms. */
    for (ps_peer *p = ps->peers; p; p = p->next)
        if (p->role == QR_ROLE_WORKER)
            qr__peer_notify_stop(p, ps->exit_status ? ps->exit_status : QR_ESTOPPED,
                                 qr__ps_stop_reason(ps));
    uv_timer_start(&ps->linger_timer, on_linger_timeout, (uint64_t)ps->linger_ms, 0);
}

const char *qr__ps_stop_reason(const qr_ps *ps) {
    if (ps->exit_status && ps->abort_msg[0]) return ps->abort_msg;
    if (ps->end_msg[0]) return ps->end_msg;
    return "the ps is stopping: training is over";
}

/* ps 0: the run is over in order: the final checkpoint first if
 * checkpoints are on (checkpoint.c asks for the stop once it is written),
 * else the cluster stops now. */
static void end_run(qr_ps *ps) {
    ps->asked.end = false;
    if (ps->stopping || ps->exit_status || ps->ckpt.want_final) return;
    qr__log(QR_LOG_INFO, "%s: stopping the cluster", ps->end_msg);
    if (qr__ckpt_final(ps, NULL, NULL)) {
        ps->ckpt.final_stops_cluster = true;
        return;
    }
    qr__ps_ask_stop_cluster(ps);
}

/* Close the listener, every connection and every handle of this run. */
static void close_run(qr_ps *ps) {
    qr_listener_close(ps->listener);
    ps->listener = NULL;
    ps->stopping = true; /* requests still in flight are answered "stopped" */
    for (ps_peer *p = ps->peers; p; p = p->next) qr_conn_close(p->conn);
    close_run_handles(ps);
}

/* What was asked (ps_internal.h, "The lifecycle"), carried out once per
 * turn of the loop, before it waits: a rollback closes the run (qr_ps_run
 * then reopens it, and nothing else asked of this run matters); otherwise
 * an orderly end (which may ask for the stop at once), the stop of the
 * cluster or of this ps, and the end of a stopped ps once it is idle. */
static void on_lifecycle(uv_prepare_t *h) {
    qr_ps *ps = h->data;
    /* A fenced run (qr__ps_fenced) ends here and says nothing to anyone:
     * no STOP to the other ps (they may be the new run's cluster), no
     * final checkpoint; qr_ps_run returns why. */
    if (qr__ps_fenced(ps)) {
        if (!ps->rollback.closed) {
            ps->rollback.closed = true;
            ps->rollback.wanted = false;
            close_run(ps);
        }
        return;
    }
    ps->liveness.turn_ns = qr__now_ns();
    if (ps->rollback.wanted) {
        if (!ps->rollback.closed) {
            ps->rollback.closed = true;
            close_run(ps);
        }
        return;
    }
    if (ps->asked.end) end_run(ps);
    if (ps->asked.stop_cluster) {
        ps->asked.stop_cluster = false;
        qr__links_stop_all(ps);
    }
    if (ps->asked.stop) {
        ps->asked.stop = false;
        begin_stop(ps);
    }
    finish_if_idle(ps);
}

static void on_stop_async(uv_async_t *a) {
    qr_ps *ps = a->data;
    ps->stop_asked = true;
    qr__ps_ask_stop(ps);
}

/* The options a ps reads once, at its start. */
static int read_options(qr_ps *ps) {
    ps->skip_nonfinite = !strcmp(qr__config_str(ps->cfg, "nonfinite"), "skip");
    ps->staleness_lr_scale = qr__config_bool(ps->cfg, "staleness-lr-scale");
    ps->lr_decay_rate = qr__config_float(ps->cfg, "lr-decay-rate");
    ps->lr_decay_steps = qr__config_int(ps->cfg, "lr-decay-steps");
    ps->lr_decay_staircase = qr__config_bool(ps->cfg, "lr-decay-staircase");
    ps->average_decay = (float)qr__config_float(ps->cfg, "moving-average-decay");
    ps->average_vars = qr__strdup(qr__config_str(ps->cfg, "moving-average-vars"));
    ps->worker_conns = qr__calloc((size_t)ps->cluster->nworkers, sizeof *ps->worker_conns);
    ps->worker_lost_ns = qr__calloc((size_t)ps->cluster->nworkers, sizeof *ps->worker_lost_ns);
    ps->linger_ms = (int)qr__config_int(ps->cfg, "linger-ms");
    ps->max_peers = (int)qr__config_int(ps->cfg, "max-connections");
    ps->restart_wait_ms = (int)qr__config_int(ps->cfg, "restart-wait-ms");
    ps->conn_opt.socket_buffer_bytes = (int)qr__config_int(ps->cfg, "socket-buffer-kb") * 1024;
    ps->conn_opt.peer_timeout_ms = (int)qr__config_int(ps->cfg, "peer-timeout-ms");
    ps->conn_opt.max_payload = (uint64_t)qr__config_int(ps->cfg, "max-message-mb") << 20;
    ps->conn_opt.auth = ps->auth;
    ps->conn_opt.handshake_timeout_ms = (int)qr__config_int(ps->cfg, "handshake-timeout-ms");
    ps->conn_opt.message_timeout_ms = (int)qr__config_int(ps->cfg, "message-timeout-ms");
    ps->conn_opt.message_min_rate = (uint64_t)qr__config_int(ps->cfg, "message-min-rate-kb") << 10;
    ps->conn_opt.first_message_timeout_ms =
        (int)qr__config_int(ps->cfg, "first-message-timeout-ms");
    ps->conn_opt.max_incomplete_bytes = (uint64_t)qr__config_int(ps->cfg, "max-incomplete-mb") << 20;
    if (!ps->average_vars || !ps->worker_conns || !ps->worker_lost_ns) return QR_ENOMEM;
    return QR_OK;
}

/* Every interface unless --bind says otherwise: behind NAT or a container's
 * port mapping the advertised name is not a local address. "::" takes
 * IPv4 too; a kernel without IPv6 gets "0.0.0.0". */
static int start_listening(qr_ps *ps) {
    const char *addr_str = ps->cluster->ps[ps->index];
    qr_addr addr;
    int rc = qr_addr_parse(addr_str, &addr);
    if (rc) return rc;
    bool tcp_only = !strcmp(qr__config_str(ps->cfg, "transport"), "tcp");
    const char *bind = qr__config_str(ps->cfg, "bind");
    if (*bind || addr.kind == QR_ADDR_UNIX) {
        rc = qr_listen(&ps->loop, &addr, bind, tcp_only, &ps->conn_opt, &ps->events, ps,
                       &ps->listener);
    } else {
        bind = "::";
        rc = qr_listen(&ps->loop, &addr, bind, tcp_only, &ps->conn_opt, &ps->events, ps,
                       &ps->listener);
        if (rc) {
            bind = "0.0.0.0";
            rc = qr_listen(&ps->loop, &addr, bind, tcp_only, &ps->conn_opt, &ps->events, ps,
                           &ps->listener);
        }
    }
    if (rc) return rc;
    if (ps->auth)
        qr__log(QR_LOG_INFO, "connections authenticated with the secret %.8s...%s",
                qr_auth_key_name(ps->auth), qr_auth_encrypts(ps->auth) ? " and encrypted" : "");
    else
        qr__log(QR_LOG_INFO, "no secret (--secret-file): connections are not authenticated; "
                "run on a network only this job can reach (docs/SECURITY.md)");
    if (addr.kind == QR_ADDR_UNIX)
        qr__log(QR_LOG_INFO, "listening on %s", addr_str);
    else
        qr__log(QR_LOG_INFO, "listening on %s (port %d on %s)%s", addr_str, addr.port,
                *qr__config_str(ps->cfg, "bind") ? bind : "every interface",
                qr_listener_unix_path(ps->listener) ? ", and on a Unix socket for this host"
                                                    : "");
    return QR_OK;
}

/* A run's random name: its incarnation (rollback.c). */
static uint64_t new_incarnation(void) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x)
        x = qr__now_ns() ^ ((uint64_t)getpid() << 32);
    return x ? x : 1;
}

/* Free what one run of the ps holds, once its loop has run out; the
 * loop, the stop async, the cluster and the options stay. */
static void free_run(qr_ps *ps) {
    if (ps->sync.on && qr__ps_coordinates(ps)) qr__coord_free(ps);
    qr__sync_free(ps);
    qr__bound_free(ps);
    qr__links_free(ps);
    qr__replica_free(ps);
    qr__recv_pool_free(&ps->recv_pool);
    qr__row_marks_free(&ps->row_marks);
    qr__ckpt_free(ps);
    qr__liveness_free(ps);
    qr__metrics_free(ps);
    free(ps->worker_conns);
    free(ps->worker_lost_ns);
    free(ps->average_vars);
    qr__tier_free(ps); /* before the tables it tiers */
    qr_store_free(&ps->store);
    qr_optim_free(ps->optim);
    ps->worker_conns = NULL;
    ps->worker_lost_ns = NULL;
    ps->average_vars = NULL;
    ps->optim = NULL;
}

/* One run of the ps: its state (restored from a checkpoint, as
 * ps->restore_step says), its handles, and its listener. On failure the
 * caller closes what was made (qr_ps_free). */
static int start_run(qr_ps *ps) {
    ps->index = ps->cluster->task_index;
    ps->incarnation = new_incarnation();
    snprintf(ps->name, sizeof ps->name, "ps %d", ps->index);
    qr_store_init(&ps->store);
    ps->events = (qr_conn_events){.header = on_header, .payload = on_payload,
                                  .message = on_message, .lost = on_lost,
                                  .drained = qr__peer_drained,
                                  .accepted = on_accepted};
    uv_timer_init(&ps->loop, &ps->linger_timer);
    ps->linger_timer.data = ps;
    const char *die_at = getenv("QUORUM_TEST_COORDINATOR_DIES_AT_STEP");
    if (die_at && die_at[0]) {
        char *end;
        ps->test_die_at_step = strtoll(die_at, &end, 10);
        ps->test_die_mirror = strcmp(end, ":mirror") == 0;
    } else {
        ps->test_die_at_step = -1;
    }
    int rc = qr_optim_create(&ps->optim, ps->cfg);
    if (!rc) rc = qr__sync_init(ps);
    if (!rc) rc = read_options(ps);
    if (!rc) rc = qr__replica_init(ps);
    /* The disk tier before the restore: a restored table's rows go to it
     * as they are read, batch by batch, within the cap. */
    if (!rc) rc = qr__tier_init(ps);
    if (!rc) rc = qr__ckpt_init(ps);
    if (!rc && ps->sync.on && qr__ps_coordinates(ps)) rc = qr__coord_init(ps);
    if (!rc && !ps->sync.on && qr__ps_coordinates(ps)) rc = qr__bound_init(ps);
    if (!rc && qr__ps_coordinates(ps) && ps->cluster->nps > 1)
        rc = qr__links_init(ps, qr__rollback_check_link);
    if (!rc && qr__ps_coordinates(ps) && ps->cluster->nps > 1 && qr__replica_on(ps)) {
        ps->sync.on_lost_ps = qr__failover_lost;
        ps->sync.on_beat = qr__failover_beat_answer;
    }
    if (!rc) rc = qr__ckpt_loop_init(ps);
    if (!rc) rc = qr__liveness_init(ps);
    if (!rc) rc = qr__metrics_init(ps);
    if (!rc) rc = start_listening(ps);
    if (!rc) rc = qr__replica_start(ps);
    return rc;
}

/* The rollback: end this run and start the next from the checkpoint
 * ps->rollback names, in the same loop. Everything from linger_timer on
 * in qr_ps is made anew (ps_internal.h). */
static int reopen(qr_ps *ps) {
    int64_t step = ps->rollback.step;
    uint64_t follows = ps->rollback.follows;
    uint64_t cause = ps->rollback.cause;
    bool stop_asked = ps->stop_asked;
    uint64_t view = ps->replica.view; /* ps 0's view numbers never go back */
    int coordinator = ps->coord_index; /* ps 0's successor, once it took over, rolls back too */
    qr_auth *auth = ps->auth; /* the task's, not the run's */
    free_run(ps);
    size_t keep = offsetof(qr_ps, linger_timer);
    memset((char *)ps + keep, 0, sizeof *ps - keep);
    ps->auth = auth;
    ps->coord_index = coordinator;
    ps->restore_step = step >= 0 ? step : QR_RESTORE_NONE;
    ps->follows = ps->coordinator = follows;
    ps->cause = cause;
    ps->stop_asked = stop_asked;
    int rc = start_run(ps);
    if (rc) {
        qr__error_prefix("ps %d: rolling back: ", ps->cluster->task_index);
        return rc;
    }
    qr__failover_rolled_back(ps, view);
    if (stop_asked) qr__ps_ask_stop(ps);
    return QR_OK;
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
    int rc = qr_config_new(&ps->cfg);
    if (!rc) rc = qr__config_merge(ps->cfg, cfg);
    if (!rc) rc = qr__config_check_mode(ps->cfg);
    if (!rc) rc = qr_cluster_clone(cluster, &ps->cluster);
    if (!rc) rc = qr__auth_from_config(ps->cfg, ps->cluster, &ps->auth);
    if (!rc && qr__config_int(ps->cfg, "coordinator") == cluster->task_index &&
        cluster->task_index != 0)
        rc = qr__fail(QR_EINVAL, "--coordinator %d names this ps: a cluster starts coordinated "
                      "by ps 0; the option names ps 0's successor to the tasks started after it "
                      "took the role over", cluster->task_index);
    if (rc) {
        qr__error_prefix("ps %d: ", cluster->task_index);
        qr_config_free(ps->cfg);
        qr_cluster_free(ps->cluster);
        free(ps);
        return rc;
    }
    uv_loop_init(&ps->loop);
    uv_async_init(&ps->loop, &ps->stop_async, on_stop_async);
    ps->stop_async.data = ps;
    uv_unref((uv_handle_t *)&ps->stop_async); /* the listener keeps the loop alive */
    uv_prepare_init(&ps->loop, &ps->lifecycle);
    ps->lifecycle.data = ps;
    uv_prepare_start(&ps->lifecycle, on_lifecycle);
    uv_unref((uv_handle_t *)&ps->lifecycle);
    ps->restore_step = QR_RESTORE_NEWEST;
    /* A run started after ps 0's failover (a replacement for any ps, ps 0
     * included) is told who took the role over: it waits for that ps's
     * links, as any ps waits for the coordinator's (checked with the
     * other replica options in qr__replica_init). */
    ps->coord_index = (int)qr__config_int(ps->cfg, "coordinator");
    rc = start_run(ps);
    if (rc) {
        qr__error_prefix("ps %d: ", ps->index);
        qr_ps_free(ps);
        return rc;
    }
    *out = ps;
    return QR_OK;
}

int qr_ps_run(qr_ps *ps) {
    if (!ps) return qr__fail(QR_EINVAL, "qr_ps_run: ps is NULL");
    for (;;) {
        uv_run(&ps->loop, UV_RUN_DEFAULT);
        if (!ps->rollback.wanted) break;
        int rc = reopen(ps);
        if (rc) return rc;
    }
    if (ps->exit_status) return qr__fail(ps->exit_status, "%s", ps->abort_msg);
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
    close_run(ps);
    if (!uv_is_closing((uv_handle_t *)&ps->stop_async))
        uv_close((uv_handle_t *)&ps->stop_async, on_handle_closed);
    if (!uv_is_closing((uv_handle_t *)&ps->lifecycle))
        uv_close((uv_handle_t *)&ps->lifecycle, on_handle_closed);
    uv_run(&ps->loop, UV_RUN_DEFAULT);
    uv_loop_close(&ps->loop);
    free_run(ps);
    qr_auth_free(ps->auth);
    qr_config_free(ps->cfg);
    qr_cluster_free(ps->cluster);
    free(ps);
}

/*
 * links.c - the coordinator's connections to the other ps tasks (ps
 * 0's; ps 1's once it has taken the role over, failover.c): what travels on
 * them (the APPLY of a sync step, the HELD and RELEASE of its held
 * pushes, the CKPT requests of a checkpoint, STOP)
 * and what they tell about those tasks: whether each one is up, and which
 * run of it (its incarnation) answers.
 *
 * ps 0 opens every link at its start and keeps it open, remaking it with
 * backoff (10 ms doubling to 1 s) whenever it is lost, so that a ps that
 * dies is seen at once and a ps that comes back is seen at its first
 * answer. A ps that hangs (SIGSTOP, a wedged loop) keeps its sockets open
 * and closes nothing: ps 0 beats on every link (BEAT every heartbeat-ms,
 * answered), and a link silent for heartbeat-timeout-ms is declared hung
 * and closed, as if the ps had died (beat_or_declare_hung). A HELLO opens every connection, carrying ps 0's incarnation and
 * the checkpoint it restored; nothing else is sent before its answer,
 * which carries the other's. The answer goes to the welcome callback the
 * links were made with (rollback.c's check: must the cluster roll back, a
 * restarted ps?). A link that was up and stays down for restart-wait-ms
 * ends the run with an error naming the ps; one never up yet is a ps
 * still starting, and is waited for.
 *
 * With --ps-replicas 2 a ps that dies or hangs may be failed over
 * instead (failover.c): the callback the links were made with
 * (on_lost_ps) is asked first, once the ps is hung or its link could not
 * be made again; when it takes the ps, the link is dropped for good (no
 * retries, no restart-wait-ms, no STOP at the end, no "hung" notice to
 * the supervisor) and the VIEW it sends goes to the others (qr__links_view).
 * A dropped link still tries the address every second: a new run there
 * (a replacement) is taken back (rerep.c, qr__rerep_joined), and a
 * source's answer to a VIEW says a copy for it is made.
 *
 * Every request carries the callback that consumes its answer, as libuv's
 * uv_write_t carries its uv_write_cb: an APPLY's goes to the coordinator,
 * a CKPT's to the checkpoint, so the links call nothing above them, and
 * what ends the run (an abort) is only asked for (ps_internal.h, "The
 * lifecycle").
 */
#include "ps/ps_internal.h"

#include <stdlib.h>
#include <string.h>

struct coord_link {
    qr_ps *ps;
    int index;
    qr_addr addr;
    qr_conn *conn;
    bool connecting;
    bool up;             /* connected and its HELLO answered */
    bool closing;
    bool refusal_logged; /* its handshake was refused, and that was said */
    uv_timer_t retry;
    int attempts;
    uint32_t next_id;
    uint64_t incarnation; /* of the ps at the other end; 0 until its first answer */
    int64_t apply_step;  /* sync: step to apply there; -1 = none */
    uint64_t down_ns;    /* when it was lost, or first failed to connect; 0 while up */
    uint64_t heard_ns;   /* the last message from it, or when the connection was made */
    uint64_t beat_ns;    /* when the last BEAT went */
    bool hung;           /* declared hung (silent for heartbeat-timeout-ms), not heard since */
    bool apply_sent;
    bool stop_wanted, stop_sent;
    bool dropped;        /* failed over (failover.c): never linked again */
    bool view_wanted;    /* a VIEW to send (ps->sync.view_meta) */
    qr_link_apply_cb apply_cb; /* the APPLY's answer goes there */
    /* sync, two copies: the APPLY of a step this ps's shard missed (its
     * APPLY left in a dead coordinator's write queue), sent first; -1 =
     * none (qr__link_catch_up) */
    int64_t catch_up_step;
    bool catch_up_sent;
    qr_wbuf catch_up;
    bool ckpt_wanted;    /* a CKPT request to send (ckpt_coord.c) */
    qr_wbuf ckpt;
    qr_link_ckpt_cb ckpt_cb; /* the CKPT exchange's answers and the link's loss go there */
};

static const qr_conn_events link_events;
static void link_connect(coord_link *l);

static coord_link *link_of(qr_ps *ps, int index) {
    return &ps->sync.links[index];
}

static void link_send_status(coord_link *l, uint8_t type, int status, const qr_wbuf *meta) {
    qr_frame f = {.type = type, .request_id = ++l->next_id, .status = status};
    if (qr_conn_send(l->conn, &f, meta ? meta->data : NULL, meta ? (uint32_t)meta->len : 0, NULL,
                     0, NULL, NULL))
        qr__log(QR_LOG_WARN, "sending %s to ps %d failed: %s", qr_msg_name(type), l->index,
                qr_last_error());
}

static void link_send(coord_link *l, uint8_t type, const qr_wbuf *meta) {
    link_send_status(l, type, QR_OK, meta);
}

/* STOP says how the run ended (the abort's status, or none) and why, so
 * that the other ps tasks exit with that status and tell their workers
 * the same reason as ps 0 does. */
static void link_send_stop(coord_link *l) {
    qr_wbuf meta = {0};
    const char *why = qr__ps_stop_reason(l->ps);
    qr_wbuf_bytes(&meta, why, strlen(why));
    link_send_status(l, QR_MSG_STOP, l->ps->exit_status, &meta);
    qr_wbuf_free(&meta);
    l->stop_sent = true;
}

/* Send what is wanted, in the order a ps must see it. */
/* An APPLY's meta: the step and its members. */
static void put_apply(qr_wbuf *meta, int64_t step, const quorum_member *members, int n) {
    qr_msg_put_apply_head(meta, step, (uint32_t)n);
    for (int i = 0; i < n; i++) qr_msg_put_member(meta, members[i].worker, members[i].seq);
}

static void link_flush(coord_link *l) {
    qr_ps *ps = l->ps;
    if (!l->conn || l->connecting) return; /* sent once connected */
    if (!l->up) {
        /* Only a STOP goes before the HELLO's answer: it is for any run of
         * the ps (a ps 0 that aborts at that answer still stops it). */
        if (l->stop_wanted && !l->stop_sent) link_send_stop(l);
        return;
    }
    if (l->view_wanted) { /* first: the placement every later request assumes */
        link_send(l, QR_MSG_VIEW, &ps->sync.view_meta);
        l->view_wanted = false;
    }
    if (l->catch_up_step >= 0 && !l->catch_up_sent) { /* before the CKPT or APPLY of a later step */
        link_send(l, QR_MSG_APPLY, &l->catch_up);
        l->catch_up_sent = true;
    }
    if (l->ckpt_wanted) { /* before an APPLY: the shard is of the step before */
        link_send(l, QR_MSG_CKPT, &l->ckpt);
        l->ckpt_wanted = false;
    }
    if (l->apply_step >= 0 && !l->apply_sent) {
        qr_wbuf meta = {0};
        put_apply(&meta, l->apply_step, ps->sync.quorum, ps->sync.nquorum);
        link_send(l, QR_MSG_APPLY, &meta);
        qr_wbuf_free(&meta);
        l->apply_sent = true;
    }
    if (l->stop_wanted && !l->stop_sent) link_send_stop(l);
}

static void on_retry(uv_timer_t *t) {
    coord_link *l = t->data;
    if ((!l->closing || (l->dropped && !l->ps->stopping)) && !l->conn) link_connect(l);
}

static void retry_later(coord_link *l) {
    uv_timer_start(&l->retry, on_retry, qr__link_backoff_ms(&l->attempts), 0);
}

static void link_connect(coord_link *l) {
    qr_ps *ps = l->ps;
    l->connecting = true;
    bool prefer_unix = strcmp(qr__config_str(ps->cfg, "transport"), "tcp") != 0;
    if (qr_connect(&ps->loop, &l->addr, prefer_unix, &ps->conn_opt, &link_events, l, &l->conn)) {
        if (!l->down_ns) l->down_ns = qr__now_ns();
        l->connecting = false;
        l->conn = NULL;
        retry_later(l);
    }
}

static void on_link_connected(qr_conn *c, int status) {
    coord_link *l = qr_conn_data(c);
    l->connecting = false;
    if (status == QR_EAUTH && !l->refusal_logged) {
        /* Another job's ps at that address, or one given another secret or
         * spec: said once; the link keeps trying, in case it is restarted
         * right, and a sync step that needs it reports the stall. */
        l->refusal_logged = true;
        qr__log(QR_LOG_ERROR, "ps %d (%s): %s", l->index, l->ps->cluster->ps[l->index],
                qr_last_error());
    }
    if (status) return; /* `lost` follows */
    l->refusal_logged = false;
    qr_ps *ps = l->ps;
    l->heard_ns = qr__now_ns(); /* its HELLO's answer is due within heartbeat-timeout-ms */
    qr_wbuf meta = {0};
    qr_msg_put_hello(&meta, &(qr_msg_hello){.role = QR_ROLE_COORDINATOR,
                                            .task_index = (uint32_t)ps->index, .mode = ps->sync.on,
                                            .incarnation = ps->incarnation,
                                            .restored_step = ps->ckpt.restored_step,
                                            .cause = ps->cause});
    link_send(l, QR_MSG_HELLO, &meta);
    qr_wbuf_free(&meta);
    link_flush(l); /* a STOP may be waiting */
}

/* The ps at the other end is failed over (failover.c): this link carries
 * nothing more to it. It keeps trying the address, slowly, for a
 * replacement (rerep.c): a new run there joins as a backup. */
static void drop(coord_link *l) {
    l->dropped = l->closing = true;
    l->apply_step = l->catch_up_step = -1;
    /* A checkpoint that asked it for its part will not get it: given up,
     * not waited for. Whether the CKPT was never sent (the link down
     * since its loss: a checkpoint started between the loss and the
     * failover) or sent and not answered (a hung ps, failed over with its
     * link up: the closed link's loss comes to a dropped link, which
     * tells nobody). The shards ignore a ps they did not ask for one; a
     * cut being decided is given up (the next comes a second later). */
    if (l->ckpt_cb) l->ckpt_cb(l->ps, l->index, QR_EPEERLOST, NULL, NULL);
    l->ckpt_wanted = l->view_wanted = false;
    l->up = false;
    uv_timer_stop(&l->retry);
    if (l->conn) qr_conn_close(l->conn);
    retry_later(l); /* a replacement may come */
}

/* A dropped link reached a run of the failed ps: a replacement (another
 * incarnation) joins; the old run (a stopped one resumed) is left to fence
 * itself. */
static void rejoin(coord_link *l, const qr_msg_welcome *m) {
    qr_ps *ps = l->ps;
    if (m->incarnation == l->incarnation || ps->stopping) {
        qr_conn_close(l->conn);
        return;
    }
    l->dropped = l->closing = l->hung = false;
    /* Sync: the APPLYs queued while the link was dropped are of steps the
     * replacement takes no part in (it serves no shard). */
    l->apply_step = -1;
    l->incarnation = m->incarnation;
    l->up = true;
    l->attempts = 0;
    l->down_ns = 0;
    if (!qr__rerep_joined(ps, l->index)) {
        drop(l);
        return;
    }
    link_flush(l);
}

/* Is ps `index` failed over rather than waited for? (hung: declared so) */
static bool failed_over(coord_link *l, int why) {
    qr_ps *ps = l->ps;
    if (l->dropped) return true;
    if (!ps->sync.on_lost_ps || ps->stopping || l->stop_wanted || !l->incarnation) return false;
    if (!ps->sync.on_lost_ps(ps, l->index, why)) return false;
    drop(l);
    return true;
}

static void on_link_lost(qr_conn *c, int status) {
    coord_link *l = qr_conn_data(c);
    qr_ps *ps = l->ps;
    bool was_up = l->up;
    if (l->dropped || c != l->conn) {
        if (c != l->conn) return; /* a connection given up before this one */
        l->conn = NULL;
        l->up = l->connecting = false;
        if (!ps->stopping) retry_later(l); /* for a replacement */
        return;
    }
    /* Gone, and its address refuses a new connection: died. (A link that
     * was up is tried once more first, 10 ms later.) */
    if (!was_up && l->incarnation && !l->closing && failed_over(l, QR_LOST_DEAD)) {
        l->conn = NULL;
        l->connecting = false;
        return;
    }
    if (l->up && !l->closing && !ps->stopping)
        qr__log(QR_LOG_WARN, "lost ps %d (%s): %s; waiting up to %.0f s (restart-wait-ms) for it "
                "to come back", l->index, ps->cluster->ps[l->index], qr_strerror(status),
                ps->restart_wait_ms / 1e3);
    l->conn = NULL;
    l->up = l->connecting = false;
    if (!l->down_ns) l->down_ns = qr__now_ns();
    l->ckpt_wanted = false;
    /* A shard it was writing, or its part of a cut, is lost to us. */
    if (l->ckpt_cb) l->ckpt_cb(ps, l->index, QR_EPEERLOST, NULL, NULL);
    if (l->closing || l->stop_sent) {
        /* Closed by us, or gone after the stop: this link is done (the
         * ps ends once none is busy: qr__links_busy). */
        l->closing = true;
        return;
    }
    if (ps->stopping && !l->stop_wanted) return;
    l->apply_sent = l->catch_up_sent = false; /* APPLY is idempotent: send it again */
    retry_later(l);
}

/* The HELLO's answer: the link is up, unless the other ps is a new run
 * that makes the cluster roll back (rollback.c), which ends this one. */
static void on_hello_answer(coord_link *l, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = l->ps;
    if (l->dropped) {
        qr_msg_welcome w;
        qr_rbuf rb;
        qr_rbuf_init(&rb, meta, f->meta_len);
        qr_msg_get_welcome(&rb, &w);
        if (f->status || rb.bad) qr_conn_close(l->conn);
        else rejoin(l, &w);
        return;
    }
    if (f->status) {
        char why[700];
        snprintf(why, sizeof why, "ps %d (%s) refused ps 0's link: %.*s", l->index,
                 ps->cluster->ps[l->index], (int)QR_MIN(f->meta_len, 500u), (const char *)meta);
        qr__ps_ask_abort(ps, QR_EABORTED, why);
        return;
    }
    qr_msg_welcome m;
    qr_rbuf rb;
    qr_rbuf_init(&rb, meta, f->meta_len);
    qr_msg_get_welcome(&rb, &m);
    uint64_t known = l->incarnation;
    l->incarnation = m.incarnation;
    if (ps->sync.on_welcome(ps, l->index, known, &m)) return;
    if (l->down_ns && known)
        qr__log(QR_LOG_INFO, "ps %d (%s) is back after %.1f s", l->index,
                ps->cluster->ps[l->index], (double)(qr__now_ns() - l->down_ns) / 1e9);
    else if (!known)
        qr__log(QR_LOG_INFO, "linked to ps %d (%s)", l->index, ps->cluster->ps[l->index]);
    l->up = true;
    l->hung = false;
    l->attempts = 0;
    l->down_ns = 0;
    if (ps->sync.on && qr__replica_on(ps)) qr__coord_shard_at(ps, l->index, &rb);
    link_flush(l);
}

/* The answer to the APPLY of a step ps k's shard had missed: the first
 * APPLY answered on the connection, as it was the first sent. */
static void on_catch_up_answer(coord_link *l, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = l->ps;
    int64_t step = l->catch_up_step;
    l->catch_up_step = -1;
    l->catch_up_sent = false;
    if (f->status) {
        char why[700];
        snprintf(why, sizeof why, "ps %d (%s) could not apply step %lld, which its shard had "
                 "missed: %.*s", l->index, ps->cluster->ps[l->index], (long long)step,
                 (int)QR_MIN(f->meta_len, 500u), (const char *)meta);
        qr__ps_ask_abort(ps, QR_EABORTED, why);
        return;
    }
    qr__log(QR_LOG_INFO, "ps %d has applied step %lld, which its shard had missed", l->index,
            (long long)step);
}

static int on_link_header(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    return QR_OK; /* replies carry no payload; meta is read in the message */
}

static void on_link_message(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    coord_link *l = qr_conn_data(c);
    qr_ps *ps = l->ps;
    int type = f->type & ~QR_MSG_REPLY;
    if (qr__ps_fenced(ps)) return;
    l->heard_ns = qr__now_ns();
    if (type == QR_MSG_HELLO) {
        on_hello_answer(l, f, meta);
    } else if (type == QR_MSG_APPLY && l->catch_up_sent) {
        on_catch_up_answer(l, f, meta); /* sent before any other APPLY on this connection */
    } else if (type == QR_MSG_APPLY && l->apply_step >= 0) {
        int64_t step = l->apply_step;
        /* With two copies the answer names its step: one of an APPLY sent
         * before (asked again after a failover) leaves this one waiting. */
        if (!f->status && f->meta_len >= 8) {
            qr_rbuf r;
            qr_rbuf_init(&r, meta, f->meta_len);
            if (qr_rbuf_i64(&r) != step) return;
        }
        if (!f->status) {
            l->apply_step = -1;
            l->apply_sent = false;
        }
        l->apply_cb(ps, l->index, step, f->status, (const char *)meta, f->meta_len);
    } else if (f->type == QR_MSG_HELD) {
        /* flags: shard + 1 when it is of the copy this ps serves since a
         * failover (ps-replicas 2), not of its own shard. */
        int from = f->flags ? f->flags - 1 : l->index;
        if (from >= ps->cluster->nps || (f->flags && !qr__replica_on(ps))) return;
        if (ps->sync.on_held) ps->sync.on_held(ps, from, meta, f->meta_len);
    } else if (type == QR_MSG_CKPT && l->ckpt_cb) {
        l->ckpt_cb(ps, l->index, f->status, f, meta);
    } else if (type == QR_MSG_VIEW) {
        qr__rerep_view_answer(ps, l->index, f->status, meta, f->meta_len);
    } else if (type == QR_MSG_BEAT && !f->status) {
        if (ps->sync.on_beat) ps->sync.on_beat(ps, l->index, meta, f->meta_len);
    } else if (type == QR_MSG_STOP) {
        l->closing = true;
        qr_conn_close(c);
    } else if (f->status) {
        qr__log(QR_LOG_WARN, "ps %d refused %s: %.*s", l->index, qr_msg_name(type),
                (int)QR_MIN(f->meta_len, 500u), (const char *)meta);
    }
}

static const qr_conn_events link_events = {.connected = on_link_connected,
                                           .header = on_link_header,
                                           .message = on_link_message,
                                           .lost = on_link_lost};

/* ---- what the rest of the ps asks of the links -------------------------- */

int qr__links_init(qr_ps *ps, qr_link_welcome_cb on_welcome) {
    ps_sync *s = &ps->sync;
    s->on_welcome = on_welcome;
    /* one a ps, indexed by it; the coordinator's own is never made */
    s->links = qr__calloc((size_t)ps->cluster->nps, sizeof *s->links);
    if (!s->links) return QR_ENOMEM;
    QR_EACH_OTHER_PS(ps, i) {
        coord_link *l = &s->links[i];
        l->ps = ps;
        l->index = i;
        l->apply_step = l->catch_up_step = -1;
        uv_timer_init(&ps->loop, &l->retry);
        l->retry.data = l;
        uv_unref((uv_handle_t *)&l->retry); /* a retry never keeps the ps alive by itself */
        int rc = qr_addr_parse(ps->cluster->ps[i], &l->addr);
        if (rc) return rc;
        link_connect(l);
    }
    return QR_OK;
}

bool qr__links_all_up(const qr_ps *ps) {
    if (!qr__ps_has_links(ps)) return true;
    QR_EACH_OTHER_PS(ps, k) {
        if (!ps->sync.links[k].up && !ps->sync.links[k].dropped) return false;
    }
    return true;
}

void qr__links_view(qr_ps *ps) {
    if (!qr__ps_has_links(ps)) return;
    QR_EACH_OTHER_PS(ps, k) {
        coord_link *l = link_of(ps, k);
        if (l->dropped) continue;
        l->view_wanted = true;
        link_flush(l);
    }
}

bool qr__links_reaches(qr_ps *ps, int k) {
    if (!qr__ps_has_links(ps) || k < 0 || k >= ps->cluster->nps || k == ps->coord_index)
        return false;
    const coord_link *l = link_of(ps, k);
    uint64_t timeout_ns = (uint64_t)ps->liveness.timeout_ms * 1000000ull;
    return l->up && !l->hung && !l->dropped && !l->closing &&
           qr__now_ns() - l->heard_ns < timeout_ns;
}

void qr__links_drop(qr_ps *ps, int k, uint64_t incarnation) {
    if (!qr__ps_has_links(ps) || k < 0 || k >= ps->cluster->nps || k == ps->coord_index) return;
    coord_link *l = link_of(ps, k);
    if (!l->incarnation) l->incarnation = incarnation;
    drop(l);
}

bool qr__links_fail(qr_ps *ps, int k, int why) {
    if (!qr__ps_has_links(ps) || k < 0 || k >= ps->cluster->nps || k == ps->coord_index)
        return false;
    return failed_over(link_of(ps, k), why);
}

uint64_t qr__link_down_ns(const qr_ps *ps, int index) {
    return ps->sync.links[index].down_ns;
}

void qr__link_apply(qr_ps *ps, int k, int64_t step, qr_link_apply_cb cb) {
    coord_link *l = link_of(ps, k);
    l->apply_step = step;
    l->apply_cb = cb;
    l->apply_sent = false;
    link_flush(l);
}

void qr__links_apply(qr_ps *ps, int64_t step, qr_link_apply_cb cb, int skip) {
    QR_EACH_OTHER_PS(ps, k) {
        if (k != skip) qr__link_apply(ps, k, step, cb);
    }
}

void qr__link_apply_again(qr_ps *ps, int k, int64_t step) {
    coord_link *l = link_of(ps, k);
    if (l->dropped) return;
    l->apply_step = step;
    l->apply_sent = false;
    link_flush(l);
}

void qr__link_catch_up(qr_ps *ps, int k, int64_t step, const quorum_member *members, int n) {
    coord_link *l = link_of(ps, k);
    if (l->dropped) return;
    qr_wbuf_reset(&l->catch_up);
    put_apply(&l->catch_up, step, members, n);
    l->catch_up_step = step;
    l->catch_up_sent = false;
    link_flush(l);
}

void qr__links_release(qr_ps *ps, uint32_t worker, uint32_t seq) {
    if (!qr__ps_has_links(ps)) return;
    qr_wbuf meta = {0};
    qr_msg_put_member(&meta, worker, seq);
    if (!qr__ps_has_links(ps)) return;
    QR_EACH_OTHER_PS(ps, k) {
        coord_link *l = link_of(ps, k);
        if (l->dropped) continue;
        /* A link down loses it: that ps then answers after the step. */
        if (l->up && l->conn) link_send(l, QR_MSG_RELEASE, &meta);
    }
    qr_wbuf_free(&meta);
}

void qr__link_ckpt(qr_ps *ps, int index, const qr_wbuf *meta, qr_link_ckpt_cb cb) {
    coord_link *l = link_of(ps, index);
    l->ckpt_cb = cb;
    qr_wbuf_reset(&l->ckpt);
    qr_wbuf_bytes(&l->ckpt, meta->data, meta->len);
    l->ckpt_wanted = true;
    link_flush(l);
}

void qr__links_stop_all(qr_ps *ps) {
    if (!qr__ps_has_links(ps)) return;
    QR_EACH_OTHER_PS(ps, k) {
        coord_link *l = link_of(ps, k);
        if (l->dropped) continue; /* failed over: nothing to tell */
        l->stop_wanted = true;
        l->apply_step = -1;
        if (!l->conn && !l->connecting && !l->closing) link_connect(l);
        link_flush(l);
    }
}

/* A BEAT every heartbeat-ms on a link that is up; the other ps answers
 * each one. A connected link that brings nothing for heartbeat-timeout-ms
 * (no answer to its beats, or to its HELLO) leads to a ps that is stopped
 * or wedged with its sockets open: it is declared hung, named, reported
 * to the supervisor (launch kills and restarts it), and its link closed,
 * so that what follows is what follows a death (restart-wait-ms, a
 * rollback when a new run of it answers). */
static void beat_or_declare_hung(coord_link *l, uint64_t now) {
    qr_ps *ps = l->ps;
    const ps_liveness *lv = &ps->liveness;
    if (lv->beat_ms <= 0 || !l->conn || l->connecting || l->closing || !l->incarnation) return;
    uint64_t silent_ms = qr__ms_since(now, l->heard_ns);
    if (silent_ms >= (uint64_t)lv->timeout_ms) {
        if (!l->hung && l->up && failed_over(l, QR_LOST_HUNG)) {
            ps->liveness.hung_ps_total++;
            return;
        }
        if (!l->hung) {
            qr__log(QR_LOG_ERROR, "ps %d (%s) answered nothing for %llu ms (heartbeat-timeout-ms "
                    "%lld): hung or stopped; treated as lost: waiting up to %.0f s "
                    "(restart-wait-ms) for a new run of it", l->index, ps->cluster->ps[l->index],
                    (unsigned long long)silent_ms, (long long)lv->timeout_ms,
                    ps->restart_wait_ms / 1e3);
            qr__tell_supervisor("hung ps %d %llu", l->index, (unsigned long long)silent_ms);
            ps->liveness.hung_ps_total++;
        }
        l->hung = true;
        if (!l->down_ns) l->down_ns = now;
        qr_conn_close(l->conn); /* `lost` follows: the link is remade with backoff */
        return;
    }
    if (l->up && now - l->beat_ns >= (uint64_t)lv->beat_ms * 1000000ull) {
        qr_wbuf meta = {0};
        qr_msg_put_worker(&meta, 0);
        link_send(l, QR_MSG_BEAT, &meta);
        qr_wbuf_free(&meta);
        l->beat_ns = now;
    }
}

/* A link down for restart-wait-ms ends the run; a lost link is reported
 * every stall-report-ms meanwhile. Called by ps 0's watch timer. */
void qr__links_watch(qr_ps *ps) {
    if (!qr__ps_has_links(ps) || ps->stopping) return;
    uint64_t now = qr__now_ns();
    QR_EACH_OTHER_PS(ps, k) {
        coord_link *l = link_of(ps, k);
        if (l->dropped) continue;
        beat_or_declare_hung(l, now);
        /* Lost and not back within a watch period: failed over, if it can
         * be (the reconnect normally says so sooner, on_link_lost). */
        if (l->down_ns && !l->closing && now - l->down_ns >= 500000000ull &&
            failed_over(l, l->hung ? QR_LOST_HUNG : QR_LOST_DEAD))
            continue;
        /* A ps never reached is still starting (pods come up minutes
         * apart): only one that was up and went is waited for. */
        if (!l->down_ns || l->closing || !l->incarnation) continue;
        uint64_t gone_ms = (now - l->down_ns) / 1000000;
        if (gone_ms >= (uint64_t)ps->restart_wait_ms) {
            char why[512];
            snprintf(why, sizeof why, "ps %d (%s) has been %s for %.1f s and did not come back "
                     "within restart-wait-ms (%d ms); last error: %s", k, ps->cluster->ps[k],
                     l->hung ? "hung (no answer to its heartbeats)" : "unreachable",
                     (double)gone_ms / 1e3, ps->restart_wait_ms, qr_last_error());
            qr__ps_ask_abort(ps, QR_EABORTED, why);
            return;
        }
    }
}

void qr__links_stop_one(qr_ps *ps, int k) {
    coord_link *l = link_of(ps, k);
    if (l->dropped || l->stop_wanted) return;
    l->stop_wanted = true;
    l->apply_step = -1;
    if (!l->conn && !l->connecting && !l->closing) link_connect(l);
    link_flush(l);
}

bool qr__links_busy(qr_ps *ps) {
    if (!qr__ps_has_links(ps)) return false;
    QR_EACH_OTHER_PS(ps, k) {
        coord_link *l = link_of(ps, k);
        if (l->stop_wanted && !l->closing) return true;
    }
    return false;
}

/* The stop: links with no STOP to deliver close now. */
void qr__links_stop(qr_ps *ps) {
    if (!qr__ps_has_links(ps)) return;
    QR_EACH_OTHER_PS(ps, k) {
        coord_link *l = link_of(ps, k);
        if (!l->stop_wanted) {
            l->closing = true;
            uv_timer_stop(&l->retry);
            if (l->conn) qr_conn_close(l->conn);
        }
    }
}

static void on_closed(uv_handle_t *h) {
    (void)h;
}

void qr__links_close(qr_ps *ps) {
    if (!qr__ps_has_links(ps)) return;
    QR_EACH_OTHER_PS(ps, k) {
        coord_link *l = link_of(ps, k);
        if (!l->ps) continue; /* never made (links_init failed before it) */
        l->closing = true;
        if (!uv_is_closing((uv_handle_t *)&l->retry)) uv_close((uv_handle_t *)&l->retry, on_closed);
        qr_wbuf_free(&l->ckpt);
        qr_wbuf_free(&l->catch_up);
        if (l->conn) qr_conn_close(l->conn);
    }
}

void qr__links_free(qr_ps *ps) {
    qr_wbuf_free(&ps->sync.view_meta);
    free(ps->sync.links);
    ps->sync.links = NULL;
}

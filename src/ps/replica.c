/*
 * replica.c - two copies of every shard (--ps-replicas 2), both sides of
 * the copy: ps k is the primary of its own shard, whose backup is ps
 * (k+1) mod P, and the backup of ps (k-1) mod P's shard, which it holds
 * in a store of its own (ps->replica.store), never mixed with its own
 * variables. docs/REPLICATION.md has the protocol and what is not built.
 *
 * Primary. ps k opens a link to its backup (HELLO of role
 * QR_ROLE_REPLICA, remade with backoff when lost, as ps 0's links are)
 * and forwards, in the order it applied them:
 *   - each CREATE it applied (the same meta, and each dense variable's
 *     values as the payload): the backup runs create.c on its store;
 *   - each async push it applied (REPLICATE): the gradients as applied
 *     (float32, a bf16/fp16 one widened), the learning rate each was
 *     applied with (staleness scaling and lr decay included), the step
 *     the apply was (Adam's t, a table's clock), the push's flags and
 *     (worker, seq) and the step it is answered with;
 *   - each LOOKUP that sighted ids of a table (rows made, admission
 *     counters), which the backup replays.
 *   - in sync mode (sync.c), each push it keeps for a step, as it came,
 *     and each step it applies, by its members: the backup keeps the
 *     pushes on its copy and runs the same reduce on them.
 * A push's answer (and a CREATE's) waits until the backup has applied
 * every forward up to its own (qr__replica_wait): an acknowledged push is
 * on both copies. A LOOKUP's answer does not wait (its rows are made from
 * (seed, id) alone; the forward only keeps the backup's table in step).
 * Forwards stay queued until applied; a link that comes back sends again
 * every one not acknowledged, and the backup applies a forward once (by
 * its number, from 1 for each run of the primary).
 *
 * The view (failover.c) changes what a ps is: a backup promoted serves
 * its copy as the shard's primary (workers' connections naming that
 * shard, qr__peer_store) and refuses the old primary's replica link and
 * forwards (QR_EVIEW), which fences that primary if it still runs; a
 * primary whose backup failed forwards nothing more and answers at once.
 *
 * Links. The primary side is per link (repl_link): ps->replica.link
 * carries this ps's own shard to its backup; ps->replica.copy_link
 * carries a promoted copy to the failed primary's replacement (rerep.c),
 * whose replica HELLO names the shard (cause = shard + 1) so that it
 * applies those forwards to its own store. A link re-opened to a
 * replacement starts with a SNAPSHOT (rerep.c) and answers pushes at
 * once until the replacement has caught up.
 *
 * Files. This file is the primary's link (connect, HELLO, each forward
 * sent in order and answered, lost and remade, drained at the stop), the
 * replication's lifecycle and the shards' digests; replica_forward.c
 * makes the forwards and keeps the answers that wait for them, and the
 * exactly-once record; replica_backup.c is the other side, the backup
 * applying them, and the copies' statistics. The forward and wait
 * records are in replica.h.
 */
#include "ps/ps_internal.h"

#include <stdlib.h>
#include <string.h>

static const qr_conn_events link_events;
static void link_connect(repl_link *L);
static void end_drain(repl_link *L);

/* ---- the options ---------------------------------------------------------- */

int qr__replica_init(qr_ps *ps) {
    ps_replica *r = &ps->replica;
    int nps = ps->cluster->nps;
    qr_store_init(&r->store);
    r->backup = r->primary = -1;
    int rc = qr_replicas_check_config(ps->cfg, nps, &r->copies);
    if (rc) return rc;
    r->lag = (uint64_t)qr__config_int(ps->cfg, "replication-lag");
    if (!qr__replica_on(ps)) return QR_OK;
    r->backup = (ps->index + 1) % nps;
    r->primary = (ps->index + nps - 1) % nps;
    r->link = (repl_link){.ps = ps, .target = r->backup, .shard = ps->index, .next_fwd = 1};
    r->copy_link = (repl_link){.ps = ps, .target = r->primary, .shard = r->primary,
                               .copy = true, .gone = true, .next_fwd = 1};
    int nw = ps->cluster->nworkers;
    r->last = qr__calloc((size_t)QR_MAX(nw, 1), sizeof *r->last);
    r->backup_last = qr__calloc((size_t)QR_MAX(nw, 1), sizeof *r->backup_last);
    r->failed = qr__calloc((size_t)nps, sizeof *r->failed);
    r->rejoin_done = qr__calloc((size_t)nps, sizeof *r->rejoin_done);
    if (!r->last || !r->backup_last || !r->failed || !r->rejoin_done) return QR_ENOMEM;
    rc = qr_addr_parse(ps->cluster->ps[r->backup], &r->link.addr);
    return rc ? rc : qr_addr_parse(ps->cluster->ps[r->primary], &r->copy_link.addr);
}

/* ---- the link to the backup ----------------------------------------------- */

static void forward_free(repl_forward *fw) {
    qr_wbuf_free(&fw->items);
    qr_wbuf_free(&fw->payload);
    if (fw->release) fw->release(fw->owner);
    free(fw->iov);
    free(fw);
}

static void on_sent(qr_conn *c, int status, void *ctx) {
    (void)c;
    (void)status;
    repl_forward *fw = ctx;
    if (--fw->sending == 0 && fw->acked) forward_free(fw);
}

static void send_forward(repl_link *L, repl_forward *fw) {
    qr_wbuf meta = {0};
    const qr_wbuf *m = &fw->items;
    if (fw->type == QR_MSG_REPLICATE) {
        qr_msg_put_repl_head(&meta, &fw->head);
        qr_wbuf_bytes(&meta, fw->items.data, fw->items.len);
        m = &meta;
    }
    qr_frame f = {.type = fw->type, .request_id = ++L->next_id};
    fw->request_id = f.request_id;
    qr_iov iov = {fw->payload.data, fw->payload.len};
    fw->sending++;
    if (qr_conn_send(L->conn, &f, m->data, (uint32_t)m->len, fw->niov ? fw->iov : &iov,
                     fw->niov ? fw->niov : fw->payload.len ? 1 : 0, on_sent, fw)) {
        /* The connection is going: `lost` follows, and this is sent again.
         * A failed send never runs on_sent: count it back here, or a queue
         * dropped later (the copy gone) would leave it unfreed. */
        fw->sending--;
        qr__log(QR_LOG_WARN, "forwarding to ps %d failed: %s", L->target, qr_last_error());
    }
    qr_wbuf_free(&meta);
}

/* Every forward not applied yet goes (again), in order. */
static void link_flush(repl_link *L) {
    if (!L->conn || L->connecting || !L->up) return;
    for (repl_forward *fw = L->fwd_head; fw; fw = fw->next) send_forward(L, fw);
}

static void on_retry(uv_timer_t *t) {
    repl_link *L = t->data;
    if (!L->closing && !L->conn && !L->gone) link_connect(L);
}

static void link_connect(repl_link *L) {
    qr_ps *ps = L->ps;
    L->connecting = true;
    bool prefer_unix = strcmp(qr__config_str(ps->cfg, "transport"), "tcp") != 0;
    if (qr_connect(&ps->loop, &L->addr, prefer_unix, &ps->conn_opt, &link_events, L,
                   &L->conn)) {
        L->connecting = false;
        L->conn = NULL;
        uv_timer_start(&L->retry, on_retry, qr__link_backoff_ms(&L->attempts), 0);
    }
}

static void on_link_connected(qr_conn *c, int status) {
    repl_link *L = qr_conn_data(c);
    qr_ps *ps = L->ps;
    L->connecting = false;
    if (status) return; /* `lost` follows */
    qr_wbuf meta = {0};
    /* A promoted copy's link names the shard it carries (cause: shard + 1;
     * 0 on a primary's own link), so that a replacement holding both of a
     * ps's shards (2 ps) tells the two apart. */
    qr_msg_put_hello(&meta, &(qr_msg_hello){.role = QR_ROLE_REPLICA,
                                            .task_index = (uint32_t)ps->index,
                                            .mode = ps->sync.on,
                                            .incarnation = ps->incarnation,
                                            .restored_step = ps->ckpt.restored_step,
                                            .cause = L->copy ? (uint64_t)L->shard + 1 : 0});
    qr_frame f = {.type = QR_MSG_HELLO, .request_id = ++L->next_id};
    if (qr_conn_send(c, &f, meta.data, (uint32_t)meta.len, NULL, 0, NULL, NULL))
        qr__log(QR_LOG_WARN, "HELLO to ps %d failed: %s", L->target, qr_last_error());
    qr_wbuf_free(&meta);
}

static void on_link_lost(qr_conn *c, int status) {
    repl_link *L = qr_conn_data(c);
    qr_ps *ps = L->ps;
    if (L->up && !L->closing && !ps->stopping && !L->gone)
        qr__log(QR_LOG_WARN, "lost the link to ps %d (%s), the copy of shard %d: %s; pushes "
                "wait for it", L->target, ps->cluster->ps[L->target], L->shard,
                qr_strerror(status));
    if (!L->down_ns) L->down_ns = qr__now_ns();
    L->conn = NULL;
    L->up = L->connecting = false;
    if (L->draining) end_drain(L); /* the backup went before the stop's forwards were in */
    if (L->closing || ps->stopping || L->gone || L->stale) return;
    uv_timer_start(&L->retry, on_retry, qr__link_backoff_ms(&L->attempts), 0);
}

/* Answer the waits whose forwards are all applied now (but their lag). */
static void answer_waits(repl_link *L, int status, const char *msg) {
    while (L->wait_head && (status || L->wait_head->fwd <= L->acked + L->wait_head->lag)) {
        repl_wait *w = L->wait_head;
        L->wait_head = w->next;
        if (!L->wait_head) L->wait_tail = NULL;
        if (!status) qr__replica_note_answer(L, w->fwd);
        w->cb(w->peer, &w->req, w->ctx, status, msg);
        free(w);
    }
}

/* The stop's end of the link: closed, and what still waits for the
 * backup answered "stopped". */
static void end_drain(repl_link *L) {
    L->draining = false;
    if (L->conn) qr_conn_close(L->conn);
    answer_waits(L, QR_ESTOPPED, qr__ps_stop_reason(L->ps));
}

bool qr__replica_busy(const qr_ps *ps) {
    return ps->replica.link.draining || ps->replica.copy_link.draining;
}

/* The backup's answer to the forward at the head of the queue. */
static void on_forward_answer(repl_link *L, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = L->ps;
    repl_forward *fw = L->fwd_head;
    if (!fw || f->request_id != fw->request_id) return; /* of an earlier send of it */
    if (f->status == QR_EVIEW && !L->copy) { /* the backup serves this shard now */
        char why[700];
        snprintf(why, sizeof why, "backup ps %d refused a forward: %.*s", L->target,
                 (int)QR_MIN(f->meta_len, 500u), (const char *)meta);
        qr__ps_fence(ps, why);
        return;
    }
    if (f->status) {
        char why[700];
        snprintf(why, sizeof why, "ps %d refused a forward of shard %d (%s), so the copies "
                 "would differ: %.*s", L->target, L->shard, qr_msg_name(fw->type),
                 (int)QR_MIN(f->meta_len, 500u), (const char *)meta);
        answer_waits(L, QR_EABORTED, why);
        qr__ps_ask_abort(ps, QR_EABORTED, why);
        return;
    }
    L->fwd_head = fw->next;
    if (!L->fwd_head) L->fwd_tail = NULL;
    L->acked = fw->fwd;
    fw->acked = true;
    if (!fw->sending) forward_free(fw);
    if (L->streaming) qr__rerep_acked(L);
    answer_waits(L, QR_OK, NULL);
    if (L->draining && !L->fwd_head) end_drain(L); /* the stop's last forward is in */
}

static int on_link_header(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    (void)c;
    (void)f;
    (void)meta;
    return QR_OK; /* answers carry no payload; the meta is read in the message */
}

/* The backup answers as a new run that followed the same rollback as this
 * run (the same ps 0 run, the same checkpoint restored), and its run
 * before applied nothing of this run's forwards: it holds the copy this
 * run started from, as at any run's start. (This ps met its previous run
 * in the moment before it followed ps 0; taken for a replacement, the
 * link waited for a view that never came, and the chief's CREATE for it:
 * test_replication_ckpt.py both_lost, about one run in 40 under ASan.) */
static bool rolled_back_alike(const repl_link *L, const qr_msg_welcome *w) {
    const qr_ps *ps = L->ps;
    uint64_t leader = qr__ps_coordinates(ps) ? ps->incarnation : ps->coordinator;
    return !L->copy && L->acked == 0 && L->snapshot_fwd == 0 && w->follows != 0 &&
           w->follows == leader && w->restored_step == ps->ckpt.restored_step;
}

static void on_link_message(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    repl_link *L = qr_conn_data(c);
    qr_ps *ps = L->ps;
    if (qr__ps_fenced(ps)) return;
    int type = f->type & ~QR_MSG_REPLY;
    L->heard_ns = qr__now_ns();
    if (type == QR_MSG_HELLO) {
        if (f->status == QR_EVIEW && !L->copy && !ps->replica.ever_up) {
            /* A replacement started after its shard moved: it serves
             * nothing until the coordinator makes it a backup (rerep.c). */
            qr__log(QR_LOG_INFO, "ps %d serves this ps's shard in a later view: this ps waits "
                    "for ps %d, the coordinator, to make it a backup (re-replication)",
                    L->target, ps->coord_index);
            L->gone = true;
            qr_conn_close(c);
            return;
        }
        if (f->status == QR_EVIEW && !L->copy) {
            char why[700];
            snprintf(why, sizeof why, "backup ps %d refused this ps's replica link: %.*s",
                     L->target, (int)QR_MIN(f->meta_len, 500u), (const char *)meta);
            qr__ps_fence(ps, why);
            return;
        }
        if (f->status) {
            char why[700];
            snprintf(why, sizeof why, "ps %d (%s) refused this ps's replica link (shard %d): "
                     "%.*s", L->target, ps->cluster->ps[L->target], L->shard,
                     (int)QR_MIN(f->meta_len, 500u), (const char *)meta);
            qr__ps_ask_abort(ps, QR_EABORTED, why);
            return;
        }
        qr_msg_welcome w;
        qr_rbuf rb;
        qr_rbuf_init(&rb, meta, f->meta_len);
        qr_msg_get_welcome(&rb, &w);
        if (!rb.bad && L->target_incarnation && w.incarnation != L->target_incarnation &&
            !rolled_back_alike(L, &w)) {
            /* A replacement at the backup's address, before this ps heard
             * of the failover: it holds no copy, so nothing is sent to it
             * until ps 0's view says what it is (rerep.c). */
            qr__log(QR_LOG_WARN, "ps %d answers as a new run: its copy of shard %d is lost; "
                    "the link waits for ps 0's view", L->target, L->shard);
            L->stale = true;
            qr_conn_close(c);
            return;
        }
        if (!rb.bad) L->target_incarnation = w.incarnation;
        qr__log(QR_LOG_INFO, "linked to ps %d (%s), the copy of shard %d", L->target,
                ps->cluster->ps[L->target], L->shard);
        L->up = true;
        L->down_ns = 0;
        if (!L->copy && !ps->replica.ever_up) {
            ps->replica.ever_up = true;
            qr__rerep_release_hellos(ps); /* this ps serves its shard: as placed */
        }
        L->attempts = 0;
        link_flush(L);
    } else if (type == QR_MSG_REPLICATE || type == QR_MSG_CREATE || type == QR_MSG_SNAPSHOT) {
        on_forward_answer(L, f, meta);
    }
}

static const qr_conn_events link_events = {.connected = on_link_connected,
                                           .header = on_link_header,
                                           .message = on_link_message,
                                           .lost = on_link_lost};

static void link_init(repl_link *L) {
    uv_timer_init(&L->ps->loop, &L->retry);
    L->retry.data = L;
    L->retry_on = true;
    uv_unref((uv_handle_t *)&L->retry); /* a retry never keeps the ps alive by itself */
}

int qr__replica_start(qr_ps *ps) {
    ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps)) return QR_OK;
    link_init(&r->link);
    link_init(&r->copy_link);
    link_connect(&r->link);
    return QR_OK;
}

/* What this ps applied reaches the copy before the link closes, so that
 * the run ends with both copies equal (a stopping backup still applies
 * forwards): the link closes once the copy has answered every forward
 * (on_forward_answer), when it is lost, or at linger-ms
 * (qr__replica_close). */
static void link_stop(repl_link *L) {
    L->closing = true;
    if (L->retry_on) uv_timer_stop(&L->retry);
    if (L->conn && L->up && L->fwd_head && !qr__ps_fenced(L->ps)) {
        L->draining = true;
        return;
    }
    end_drain(L);
}

void qr__replica_stop(qr_ps *ps) {
    ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps)) return;
    link_stop(&r->link);
    link_stop(&r->copy_link);
}

static void on_closed(uv_handle_t *h) {
    (void)h;
}

uint64_t qr__store_digest(const qr_store *s) {
    uint64_t h = QR_FNV_INIT;
    for (uint32_t i = 0; i < s->cap; i++) {
        const qr_var *v = s->by_id[i];
        if (v && v->value) h = qr__fnv1a(v->value->data, (size_t)v->n * 4, h);
    }
    for (uint32_t i = 0; i < s->cap; i++) {
        const qr_var *v = s->by_id[i];
        if (!v || !v->table) continue;
        const qr_table *t = v->table;
        for (uint64_t row = 0; row < t->count; row++) {
            h = qr__fnv1a(&t->keys[row], sizeof t->keys[row], h);
            h = qr__fnv1a(qr_table_row(t, row), (size_t)t->dim * 4, h);
        }
    }
    return h;
}

/* Each copy's digest, once, as the run ends: a test compares a shard's
 * primary with its backup after the workers are done. */
static void log_digests(qr_ps *ps) {
    ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps) || r->digests_logged) return;
    r->digests_logged = true;
    qr__log(QR_LOG_INFO, "replica digests: shard %d %s %016llx, shard %d %s %016llx "
            "(%llu forwards sent, %llu applied here, %llu duplicate pushes; pushes applied: "
            "shard %d %llu, shard %d %llu; view %llu%s)", ps->index,
            r->failed[ps->index] == QR_PS_ALIVE ? "primary" : "backup",
            (unsigned long long)qr__store_digest(&ps->store), r->primary,
            r->promoted ? "promoted" : "backup",
            (unsigned long long)qr__store_digest(&r->store),
            (unsigned long long)(r->link.forwards + r->copy_link.forwards),
            (unsigned long long)r->applied, (unsigned long long)r->duplicate_pushes, ps->index,
            (unsigned long long)r->own_pushes, r->primary, (unsigned long long)r->copy_pushes,
            (unsigned long long)r->view,
            r->failed[ps->index] != QR_PS_ALIVE ? "; a replacement: its shard served by its backup"
            : r->link.gone ? "; its backup failed" : "");
    if (qr__ps_coordinates(ps) && !ps->sync.on)
        qr__log(QR_LOG_INFO, "the coordinator's global step: %lld", (long long)ps->global_step);
    if (r->primary == ps->coord_index && !ps->sync.on)
        qr__log(QR_LOG_INFO, "the coordinator's global step, as its shard's forwards tell "
                "this copy: %lld", (long long)r->coord_step);
    if (r->lag)
        qr__log(QR_LOG_INFO, "replication-lag %llu: %llu pushes answered before the backup had "
                "applied them, at most %llu forwards behind", (unsigned long long)r->lag,
                (unsigned long long)r->answered_ahead, (unsigned long long)r->lag_seen);
}

void qr__replica_close(qr_ps *ps) {
    ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps)) return;
    log_digests(ps);
    repl_link *links[2] = {&r->link, &r->copy_link};
    for (int i = 0; i < 2; i++) {
        repl_link *L = links[i];
        L->closing = true;
        end_drain(L); /* at linger-ms, whatever the copy has not answered */
        if (L->retry_on && !uv_is_closing((uv_handle_t *)&L->retry))
            uv_close((uv_handle_t *)&L->retry, on_closed);
    }
    qr__rerep_close(ps);
}

/* Every forward dropped: the loop is over, or the copy is gone. */
static uint64_t drop_forwards(repl_link *L, bool loop_over) {
    uint64_t dropped = 0;
    while (L->fwd_head) {
        repl_forward *fw = L->fwd_head;
        L->fwd_head = fw->next;
        fw->acked = true;
        /* A send whose callback has not run still reads it: once the loop
         * is over, none will. */
        if (loop_over || !fw->sending) forward_free(fw);
        dropped++;
    }
    L->fwd_tail = NULL;
    L->acked = L->next_fwd - 1;
    return dropped;
}

void qr__replica_free(qr_ps *ps) {
    ps_replica *r = &ps->replica;
    answer_waits(&r->link, QR_ESTOPPED, "the ps is stopping");
    answer_waits(&r->copy_link, QR_ESTOPPED, "the ps is stopping");
    drop_forwards(&r->link, true);
    drop_forwards(&r->copy_link, true);
    free(r->last);
    free(r->backup_last);
    free(r->failed);
    free(r->rejoin_done);
    r->last = r->backup_last = NULL;
    r->failed = r->rejoin_done = NULL;
    qr_store_free(&r->store);
}

/* ---- queueing on the link (primary) ------------------------------------------ */

void qr__replica_fail_forward(qr_ps *ps) {
    qr__ps_ask_abort(ps, QR_ENOMEM, "out of memory forwarding an update to the backup: the "
                     "copies would differ");
}

/* fw, numbered, to L's copy (dropped when there is none). */
void qr__replica_link_send(repl_link *L, repl_forward *fw) {
    qr_ps *ps = L->ps;
    if (!fw) return;
    if (fw->items.oom || fw->payload.oom) {
        forward_free(fw);
        qr__replica_fail_forward(ps);
        return;
    }
    fw->fwd = fw->head.fwd = L->next_fwd++;
    if (L->gone) { /* one copy: nothing to keep it for */
        L->acked = fw->fwd;
        forward_free(fw);
        return;
    }
    if (L->fwd_tail) {
        L->fwd_tail->next = fw;
    } else {
        L->fwd_head = fw;
        L->heard_ns = qr__now_ns(); /* the backup's silence counts from here */
    }
    L->fwd_tail = fw;
    L->forwards++;
    if (L->conn && L->up) send_forward(L, fw);
}

uint64_t qr__replica_backup_silent_ms(const qr_ps *ps, uint64_t now) {
    const ps_replica *r = &ps->replica;
    const repl_link *L = &r->link;
    if (!qr__replica_on(ps) || ps->stopping || !r->ever_up || L->gone || L->stale ||
        L->closing || L->draining || L->streaming)
        return 0;
    /* (qr__ms_since: a forward queued within the watch's turn, by pushes
     * applied when a failover gave a cut up, once read as 584 million
     * years of silence and failed the backup over as cut off.) */
    uint64_t since = !L->up ? L->down_ns : L->fwd_head ? L->heard_ns : 0;
    return since ? qr__ms_since(now, since) : 0;
}

/* ---- the copy gone, or a new one (failover.c, rerep.c) ------------------------- */

uint64_t qr__replica_link_gone(repl_link *L) {
    if (L->gone) return 0;
    L->gone = true;
    L->stale = false;
    L->streaming = false;
    qr__rerep_abandon(L); /* a copy waiting for a checkpoint: for nobody now */
    if (L->retry_on) uv_timer_stop(&L->retry);
    if (L->conn) qr_conn_close(L->conn);
    uint64_t dropped = drop_forwards(L, false);
    answer_waits(L, QR_OK, NULL);
    return dropped;
}

void qr__replica_link_again(repl_link *L) {
    if (!L->gone) return;
    L->gone = L->stale = false;
    L->target_incarnation = 0;
    L->closing = false;
    L->attempts = 0;
    if (!L->conn && !L->connecting) link_connect(L);
}

static void link_open(repl_link *L, repl_forward *snapshot) {
    L->gone = L->stale = false;
    L->target_incarnation = 0; /* the replacement's run, met at its answer */
    L->closing = false;
    L->attempts = 0;
    /* the snapshot heads the queue; forwards made from now on follow it */
    snapshot->fwd = L->snapshot_fwd = L->next_fwd++;
    L->fwd_head = L->fwd_tail = snapshot;
    L->forwards++;
    if (L->conn) qr_conn_close(L->conn); /* `lost` connects again */
    else if (!L->connecting) link_connect(L);
}

repl_forward *qr__replica_snapshot_forward(repl_link *L) {
    repl_forward *fw = qr__calloc(1, sizeof *fw);
    if (!fw) {
        qr__replica_fail_forward(L->ps);
        return NULL;
    }
    fw->type = QR_MSG_SNAPSHOT;
    link_open(L, fw);
    return fw;
}

void qr__replica_snapshot_meta(repl_forward *fw, const qr_wbuf *meta) {
    if (fw) qr_wbuf_bytes(&fw->items, meta->data, meta->len);
}

void qr__replica_lend(repl_forward *fw, qr_iov *iov, int niov, void (*release)(void *owner),
                      void *owner) {
    if (!fw) {
        release(owner);
        free(iov);
        return;
    }
    fw->iov = iov;
    fw->niov = niov;
    fw->release = release;
    fw->owner = owner;
}

void qr__replica_link_flush(repl_link *L) {
    link_flush(L);
}

void qr__replica_backup_gone(qr_ps *ps) {
    ps_replica *r = &ps->replica;
    if (r->link.gone) return;
    uint64_t dropped = qr__replica_link_gone(&r->link);
    qr__log(QR_LOG_WARN, "view %llu: backup ps %d failed: this ps's shard goes on on one copy "
            "until its replacement is copied it (re-replication); %llu forwards it had not "
            "applied dropped, the pushes waiting for them answered",
            (unsigned long long)r->view, r->backup, (unsigned long long)dropped);
}

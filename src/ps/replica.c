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
 * Backup. A REPLICATE is checked as any request (the variables exist in
 * the backup's store, sizes and kinds, the learning rates, every value
 * finite, every row id of the primary's shard), then applied with the
 * kernels the primary used, in the same order (qr_optim_apply_dense,
 * qr__rows_apply, qr_table_lookup), so the copies are equal bit for bit.
 *
 * Exactly once: per worker, the last QR_REPL_DUP_WINDOW pushes applied
 * here and the step each was answered with; a push of one of those
 * (worker, seq) is answered as applied and not applied again
 * (duplicate_pushes). The record travels with each forward, so the
 * backup holds it too, and answers a push resent to it after a failover.
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
 */
#include "ps/ps_internal.h"

#include "cluster/placement.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

struct repl_forward {
    repl_forward *next;
    uint8_t type;        /* QR_MSG_REPLICATE or QR_MSG_CREATE */
    uint64_t fwd;
    uint32_t request_id; /* of its last send */
    int sending;         /* sends whose callback has not run */
    bool acked;
    qr_msg_repl_head head;
    qr_wbuf items;       /* REPLICATE: the item records; CREATE: the meta */
    qr_wbuf payload;
    /* SNAPSHOT: the payload as buffers another owns (a snapshot's
     * references, rerep.c), let go with release(owner) when freed */
    qr_iov *iov;
    int niov;
    void (*release)(void *owner);
    void *owner;
};

struct repl_wait {
    repl_wait *next;
    ps_peer *peer;       /* NULL once it is gone */
    qr_frame req;
    uint64_t fwd;        /* answered once this forward is applied */
    qr_repl_answer_cb cb;
    void *ctx;
};

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

/* Answer the waits whose forwards are all applied now. */
static void answer_waits(repl_link *L, int status, const char *msg) {
    while (L->wait_head && (status || L->wait_head->fwd <= L->acked)) {
        repl_wait *w = L->wait_head;
        L->wait_head = w->next;
        if (!L->wait_head) L->wait_tail = NULL;
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

static void on_link_message(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    repl_link *L = qr_conn_data(c);
    qr_ps *ps = L->ps;
    if (qr__ps_fenced(ps)) return;
    int type = f->type & ~QR_MSG_REPLY;
    L->heard_ns = qr__now_ns();
    if (type == QR_MSG_HELLO) {
        if (f->status == QR_EVIEW && !L->copy && !ps->replica.ever_up) {
            /* A replacement started after its shard moved: it serves
             * nothing until ps 0 makes it a backup (rerep.c). */
            qr__log(QR_LOG_INFO, "ps %d serves this ps's shard in a later view: this ps waits "
                    "for ps 0 to make it a backup (re-replication)", L->target);
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
        if (!rb.bad && L->target_incarnation && w.incarnation != L->target_incarnation) {
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

/* ---- forwarding (primary) ---------------------------------------------------- */

static void fail_forward(qr_ps *ps) {
    qr__ps_ask_abort(ps, QR_ENOMEM, "out of memory forwarding an update to the backup: the "
                     "copies would differ");
}

repl_forward *qr__replica_begin(qr_ps *ps, const qr_msg_repl_head *head) {
    repl_forward *fw = qr__calloc(1, sizeof *fw);
    if (!fw) {
        fail_forward(ps);
        return NULL;
    }
    fw->type = QR_MSG_REPLICATE;
    fw->head = *head;
    fw->head.count = 0;
    return fw;
}

void qr__replica_add(repl_forward *fw, uint32_t id, uint32_t kind, float lr, const void *data,
                     uint64_t nbytes) {
    if (!fw) return;
    qr_msg_put_repl_item(&fw->items, &(qr_msg_repl_item){.id = id, .kind = kind,
                                                          .nbytes = nbytes, .lr = lr});
    if (nbytes) qr_wbuf_bytes(&fw->payload, data, (size_t)nbytes);
    fw->head.count++;
}

/* fw, numbered, to L's copy (dropped when there is none). */
static void link_send(repl_link *L, repl_forward *fw) {
    qr_ps *ps = L->ps;
    if (!fw) return;
    if (fw->items.oom || fw->payload.oom) {
        forward_free(fw);
        fail_forward(ps);
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
    if (!L->up) return L->down_ns ? (now - L->down_ns) / 1000000 : 0;
    return L->fwd_head ? (now - L->heard_ns) / 1000000 : 0;
}

void qr__replica_send(qr_ps *ps, repl_forward *fw) {
    link_send(&ps->replica.link, fw);
}

void qr__replica_send_for(ps_peer *p, repl_forward *fw) {
    ps_replica *r = &p->ps->replica;
    link_send(p->promoted_shard ? &r->copy_link : &r->link, fw);
}

void qr__replica_forward_create(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    repl_forward *fw = qr__calloc(1, sizeof *fw);
    if (!fw) {
        fail_forward(ps);
        return;
    }
    fw->type = QR_MSG_CREATE;
    qr_wbuf_bytes(&fw->items, meta, f->meta_len);
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    uint32_t count = qr_msg_get_count(&r);
    /* The records were checked when the CREATE came: each names a
     * variable of the store now. */
    for (uint32_t i = 0; i < count && !r.bad; i++) {
        qr_msg_create_var m;
        qr_msg_get_create_var(&r, &m);
        const qr_var *v = qr_store_get(&ps->store, m.id);
        if (v && v->value) qr_wbuf_bytes(&fw->payload, v->value->data, (size_t)v->n * 4);
    }
    qr__replica_send(ps, fw);
    /* A CREATE's number only orders it; the backup knows no number for it. */
}

/* ---- exactly once ---------------------------------------------------------- */

/* The record of p's shard: this ps's own, or its copy's. */
static repl_last *record_of(ps_peer *p) {
    ps_replica *r = &p->ps->replica;
    return p->promoted_shard ? r->backup_last : r->last;
}

bool qr__replica_duplicate(ps_peer *p, uint32_t worker, uint32_t seq, int64_t *answer) {
    qr_ps *ps = p->ps;
    ps_replica *r = &ps->replica;
    if (!qr__replica_on(ps) || !qr__is_worker(worker, ps->cluster->nworkers)) return false;
    const repl_last *l = &record_of(p)[worker];
    for (int i = 0; i < l->n; i++) {
        if (l->seq[i] != seq) continue;
        *answer = l->answer[i];
        r->duplicate_pushes++;
        return true;
    }
    return false;
}

static void record_last(repl_last *last, int nworkers, uint32_t worker, uint32_t seq,
                        int64_t answer) {
    if (!qr__is_worker(worker, nworkers)) return;
    repl_last *l = &last[worker];
    l->seq[l->next] = seq;
    l->answer[l->next] = answer;
    l->next = (l->next + 1) % QR_REPL_DUP_WINDOW;
    if (l->n < QR_REPL_DUP_WINDOW) l->n++;
}

void qr__replica_applied(ps_peer *p, uint32_t worker, uint32_t seq, int64_t answer) {
    qr_ps *ps = p->ps;
    if (!qr__replica_on(ps)) return;
    record_last(record_of(p), ps->cluster->nworkers, worker, seq, answer);
    if (p->promoted_shard) ps->replica.copy_pushes++;
    else ps->replica.own_pushes++;
}

/* cb once every forward made so far on L is applied there: at once when
 * all are, when there is no copy, or while a copy is still being made
 * (the shard is on one copy until it has caught up, rerep.c). p and f
 * (NULL for ps 0's own part of a sync step) go back to cb. */
static void wait_on(repl_link *L, ps_peer *p, const qr_frame *f, qr_repl_answer_cb cb, void *ctx) {
    uint64_t fwd = L->next_fwd - 1; /* the last forward made */
    if ((fwd <= L->acked && !L->wait_head) || L->gone || L->streaming) {
        cb(p, f, ctx, QR_OK, NULL);
        return;
    }
    repl_wait *w = qr__calloc(1, sizeof *w);
    if (!w) {
        cb(p, f, ctx, QR_ENOMEM, "out of memory keeping an answer for the backup");
        return;
    }
    *w = (repl_wait){.peer = p, .fwd = fwd, .cb = cb, .ctx = ctx};
    if (f) w->req = *f;
    if (L->wait_tail) L->wait_tail->next = w;
    else L->wait_head = w;
    L->wait_tail = w;
}

void qr__replica_wait(ps_peer *p, const qr_frame *f, qr_repl_answer_cb cb, void *ctx) {
    qr_ps *ps = p->ps;
    wait_on(p->promoted_shard ? &ps->replica.copy_link : &ps->replica.link, p, f, cb, ctx);
}

void qr__replica_after(qr_ps *ps, qr_repl_answer_cb cb, void *ctx) {
    wait_on(&ps->replica.link, NULL, NULL, cb, ctx); /* this ps's own shard */
}

void qr__replica_peer_lost(ps_peer *p) {
    ps_replica *r = &p->ps->replica;
    for (repl_wait *w = r->link.wait_head; w; w = w->next)
        if (w->peer == p) w->peer = NULL;
    for (repl_wait *w = r->copy_link.wait_head; w; w = w->next)
        if (w->peer == p) w->peer = NULL;
}

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
    if (flags & ~(QR_PUSH_STEP | QR_PUSH_DELTA | QR_REPL_SYNC_PUSH | QR_REPL_SYNC_STEP) ||
        ((flags & QR_REPL_SYNC_PUSH) && (flags & ~QR_REPL_SYNC_PUSH)) ||
        ((flags & QR_REPL_SYNC_STEP) && (flags & ~QR_REPL_SYNC_STEP)))
        return qr__fail(QR_EINVAL, "REPLICATE: unknown flags 0x%x", flags);
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
        rc = qr__sync_copy_keep(ps, h, p->items, p->nitems, p->recv, (size_t)f->payload_len);
    } else {
        int n = (int)(f->payload_len / QR_MSG_MEMBER_LEN);
        quorum_member *members = qr__calloc((size_t)n, sizeof *members);
        qr_rbuf rb;
        qr_rbuf_init(&rb, p->recv, (size_t)f->payload_len);
        for (int i = 0; members && i < n; i++)
            qr_msg_get_member(&rb, &members[i].worker, &members[i].seq);
        if (!members) rc = qr__fail(QR_ENOMEM, "out of memory applying a step to the copy");
        else if (h->t != r->copy_steps)
            rc = qr__fail(QR_EINVAL, "sync step %lld of ps %d's shard, but this copy is at step "
                          "%lld", (long long)h->t, r->primary, (long long)r->copy_steps);
        else if ((rc = qr__sync_apply_copy(ps, h->t, members, n)))
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
    r->applied_fwd = h->fwd;
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
        record_last(p->copy_own ? r->last : r->backup_last, ps->cluster->nworkers, h->worker,
                    h->seq, h->answer);
        qr__ckpt_forwarded(ps, p->copy_own, h->worker, h->seq);
        int64_t steps = (h->flags & QR_PUSH_STEP) ? h->t : h->t - 1;
        if (p->copy_own) {
            ps->applied_steps = steps;
            r->own_pushes++;
        } else {
            r->copy_steps = steps;
            r->copy_pushes++;
        }
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
}

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
        fail_forward(L->ps);
        return NULL;
    }
    fw->type = QR_MSG_SNAPSHOT;
    link_open(L, fw);
    return fw;
}

void qr__replica_snapshot_meta(repl_forward *fw, const qr_wbuf *meta) {
    if (fw) qr_wbuf_bytes(&fw->items, meta->data, meta->len);
}

void qr__replica_snapshot_payload(repl_forward *fw, qr_iov *iov, int niov,
                                  void (*release)(void *owner), void *owner) {
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

/* ---- digests and statistics -------------------------------------------------- */

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

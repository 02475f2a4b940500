/*
 * control.c - the small requests about the connection and the run:
 *   HELLO  who the peer is (a worker and its index, or ps 0's
 *          coordinator link), and that it trains in this ps's mode
 *   READY  the chief marks the cluster initialized; others ask whether it is
 *   STEP   the global step (ps 0)
 *   STATS  the ps's statistics as one JSON object
 * Each carries a few fixed bytes of meta and no payload.
 */
#include "ps/ps_internal.h"
#include "ps/tier.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

int qr__control_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    switch (f->type) {
    case QR_MSG_HELLO: return qr__peer_check_small(f, qr_msg_hello_len(meta, f->meta_len));
    case QR_MSG_READY: return qr__peer_check_small(f, QR_MSG_READY_LEN);
    default: return qr__peer_check_small(f, 0); /* STEP, STATS */
    }
}

static void hello_message(ps_peer *p, const qr_frame *f, qr_rbuf *r) {
    qr_ps *ps = p->ps;
    qr_msg_hello m;
    qr_msg_get_hello(r, &m);
    /* One identity per connection: a second HELLO would count the peer
     * twice among the live workers, and only once would it leave. */
    if (p->role) {
        qr__peer_reply_error(p, f, QR_EINVAL, "HELLO: this connection has said who it is "
                             "already; connect again to speak for another task");
        return;
    }
    if (m.role == QR_ROLE_WORKER && !qr__is_worker(m.task_index, ps->cluster->nworkers)) {
        qr__peer_reply_error(p, f, QR_EINVAL, "HELLO: no such worker index");
        return;
    }
    if (m.role == QR_ROLE_WORKER && (m.mode != 0) != ps->sync.on) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s: worker %u trains in %s mode but the ps in %s mode: "
                 "give every task the same --mode", ps->name, m.task_index,
                 m.mode ? "sync" : "async", ps->sync.on ? "sync" : "async");
        qr__peer_reply_error(p, f, QR_EINVAL, msg);
        return;
    }
    if (m.role == QR_ROLE_COORDINATOR) {
        if (qr__ps_coordinates(ps)) {
            qr__peer_reply_error(p, f, QR_EINVAL, "HELLO: ps 0 is the coordinator itself");
            return;
        }
        if (m.task_index != (uint32_t)ps->coord_index) {
            /* Another ps than the coordinator: its successor, taking over? */
            if (!qr__failover_successor_hello(ps, &m)) {
                char msg[200];
                snprintf(msg, sizeof msg, "HELLO: a coordinator's link from ps %u, but ps %d "
                         "coordinates", m.task_index, ps->coord_index);
                qr__peer_reply_error(p, f, QR_EINVAL, msg);
                return;
            }
        } else if (qr__rollback_check_coordinator(ps, &m)) {
            return; /* this run of the ps ends */
        }
        ps->coordinator_lost_ns = 0;
        ps->coordinator_heard_ns = qr__now_ns(); /* its beats are due from now on */
    }
    int view_rc = m.role == QR_ROLE_WORKER ? qr__failover_hello(p, &m) : QR_OK;
    if (view_rc) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s: %s", ps->name, qr_last_error());
        p->promoted_shard = false;
        qr__peer_reply_error(p, f, view_rc, msg);
        return;
    }
    int repl_rc = m.role == QR_ROLE_REPLICA ? qr__replica_hello(p, &m) : QR_OK;
    if (repl_rc) { /* QR_EVIEW: the old primary of a promoted copy (it fences itself) */
        char msg[300];
        snprintf(msg, sizeof msg, "%s: %s", ps->name, qr_last_error());
        qr__peer_reply_error(p, f, repl_rc, msg);
        return;
    }
    p->role = (int)m.role;
    if (m.role == QR_ROLE_WORKER) {
        p->worker_index = (int)m.task_index;
        qr__log(QR_LOG_DEBUG, "worker %d connected from %s (%s)", p->worker_index,
                qr_conn_peer(p->conn), qr_conn_kind(p->conn));
        ps->worker_conns[p->worker_index]++;
        ps->liveness.seen_workers = true;
        qr__liveness_worker_back(ps, p->worker_index);
    }
    qr_wbuf out = {0};
    qr_msg_welcome welcome = qr__rollback_welcome(ps);
    qr_msg_put_welcome(&out, &welcome);
    if (m.role == QR_ROLE_COORDINATOR) qr__sync_put_shard_step(ps, &out);
    qr__peer_reply(p, f, QR_OK, &out, NULL, 0, NULL, NULL);
    qr_wbuf_free(&out);
    qr__failover_welcomed(p, &m);
    /* ps 0's link is (back) up: what it may have missed of the held pushes */
    if (m.role == QR_ROLE_COORDINATOR && ps->sync.on) qr__sync_coordinator_linked(ps);
}

static void ready_message(ps_peer *p, const qr_frame *f, qr_rbuf *r) {
    qr_ps *ps = p->ps;
    qr_msg_ready m;
    qr_msg_get_ready(r, &m);
    /* ps 0 is ready once the chief says so and every other ps is in step
     * with it (linked: after a rollback, each has rolled back too). */
    bool linked = qr__links_all_up(ps);
    if (m.set && !ps->ready && linked) {
        ps->ready = true;
        ps->step_limit = m.step;
        if (ps->sync.on && qr__ps_coordinates(ps)) qr__coord_ready(ps);
    }
    /* The chief again, to the coordinator's successor (failover.c), which
     * the chief's READY to ps 0 never reached: the run's last step. */
    if (!m.set && m.step > 0 && ps->ready && !ps->step_limit && qr__ps_coordinates(ps)) {
        ps->step_limit = m.step;
        qr__log(QR_LOG_INFO, "the chief says the run ends at global step %lld", (long long)m.step);
    }
    /* Not while a link is down: a ps may be coming back as a new run, and
     * a worker rejoining after a rollback would start training with this
     * run only to meet the next one (rollback.c): one rollback, seen twice. */
    qr_wbuf out = {0};
    qr_msg_put_ready(&out, &(qr_msg_ready){.set = ps->ready && linked, .step = ps->global_step,
                                           .data_pos = qr__ckpt_worker_pos(ps, p->worker_index)});
    qr__peer_reply(p, f, QR_OK, &out, NULL, 0, NULL, NULL);
    qr_wbuf_free(&out);
}

/* Per embedding table here: its rows and bytes, and what admission and
 * eviction did. */
static void tables_stats_json(const qr_ps *ps, cJSON *j) {
    cJSON *tables = NULL;
    for (uint32_t i = 0; i < ps->store.cap; i++) {
        const qr_var *v = ps->store.by_id[i];
        if (!v || !v->table) continue;
        if (!tables) tables = cJSON_AddObjectToObject(j, "tables");
        const qr_table *t = v->table;
        cJSON *o = cJSON_AddObjectToObject(tables, v->name);
        cJSON_AddNumberToObject(o, "rows", (double)qr__tier_rows(t));
        cJSON_AddNumberToObject(o, "bytes", (double)qr_table_bytes(t));
        if (t->admit_after) /* where sightings are counted; kept by add_tables as it is */
            cJSON_AddStringToObject(o, "admission_filter", t->filter.counters ? "bloom" : "exact");
        cJSON_AddNumberToObject(o, "admission_candidates", (double)t->ncand);
        cJSON_AddNumberToObject(o, "admission_filter_bytes", (double)t->filter.m);
        cJSON_AddNumberToObject(o, "admitted", (double)t->admitted);
        cJSON_AddNumberToObject(o, "unadmitted_reads", (double)t->unadmitted_reads);
        cJSON_AddNumberToObject(o, "dropped_rows", (double)t->dropped_rows);
        cJSON_AddNumberToObject(o, "evicted", (double)t->evicted);
        if (ps->tier) {
            qr_tier_stats ts;
            qr__tier_stats(t, &ts);
            cJSON_AddNumberToObject(o, "rows_memory", (double)ts.rows_memory);
            cJSON_AddNumberToObject(o, "rows_disk", (double)ts.rows_disk);
            cJSON_AddNumberToObject(o, "disk_bytes", (double)ts.disk_bytes);
            cJSON_AddNumberToObject(o, "memory_hits", (double)ts.memory_hits);
            cJSON_AddNumberToObject(o, "disk_hits", (double)ts.disk_hits);
            cJSON_AddNumberToObject(o, "misses", (double)ts.misses);
            cJSON_AddNumberToObject(o, "rows_spilled", (double)ts.rows_spilled);
        }
    }
}

/* The staleness histogram of async pushes here, and on ps 0 of a sync
 * run the coordinator's figures, and the checkpoints'. */
static void stats_message(ps_peer *p, const qr_frame *f) {
    qr_ps *ps = p->ps;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "ps", ps->index);
    qr__push_stats_json(ps, j);
    if (ps->sync.on && qr__ps_coordinates(ps)) qr__coord_stats_json(ps, j);
    if (qr__ps_coordinates(ps)) qr__ckpt_stats_json(ps, j);
    tables_stats_json(ps, j);
    qr__replica_stats_json(ps, j);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    qr_wbuf out = {0};
    if (text) qr_wbuf_bytes(&out, text, strlen(text));
    free(text);
    qr__peer_reply(p, f, QR_OK, &out, NULL, 0, NULL, NULL);
    qr_wbuf_free(&out);
}

void qr__control_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    switch (f->type) {
    case QR_MSG_HELLO:
        /* a worker's, to a ps that may be a replacement not told yet */
        if (!qr__rerep_hold_hello(p, f, meta)) hello_message(p, f, &r);
        break;
    case QR_MSG_READY: ready_message(p, f, &r); break;
    case QR_MSG_STEP: qr__peer_reply_step(p, f, p->ps->global_step); break;
    case QR_MSG_STATS: stats_message(p, f); break;
    }
}

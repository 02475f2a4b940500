/*
 * metrics.c - a ps task's Prometheus metrics (--metrics-port; the names
 * and their meaning: docs/METRICS.md).
 *
 * The HTTP server runs on libmicrohttpd's thread, and everything it would
 * report belongs to the loop thread, which has no locks. So a scrape does
 * not read the ps: it asks the loop (uv_async) to write the page, and waits
 * for it on a condition variable, at most RENDER_WAIT_MS; a loop busy longer
 * than that (a huge apply) gets the previous page served, marked stale. The
 * counters themselves are plain fields the loop updates as requests go by.
 */
#include "ps/ps_internal.h"
#include "ps/tier.h"

#include "common/metrics.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define RENDER_WAIT_MS 1000

/* ---- counting (loop thread) ------------------------------------------------- */

void qr__metrics_request(ps_peer *p, const qr_frame *f) {
    ps_metrics *m = &p->ps->metrics;
    uint64_t now = qr__now_ns();
    double secs = p->header_ns ? (double)(now - p->header_ns) / 1e9 : 0;
    if (f->type == QR_MSG_PUSH) {
        m->pushes++;
        m->push_bytes += f->payload_len;
        qr_prom_observe(&m->push_latency, secs);
        uint32_t w = p->push_worker;
        if (m->worker_seen_ns && qr__is_worker(w, p->ps->cluster->nworkers)) {
            m->worker_seen_ns[w] = now;
            m->worker_step[w] = p->ps->global_step;
        }
    } else if (f->type == QR_MSG_PULL) {
        uint64_t bytes = 0;
        for (int i = 0; i < p->nitems; i++) bytes += qr_dt_wire_bytes(p->items[i].dtype, (uint64_t)p->items[i].var->n);
        m->pulls++;
        m->pull_bytes += bytes;
        qr_prom_observe(&m->pull_latency, secs);
    }
}

/* ---- the page (loop thread) ---------------------------------------------------- */

static void family(FILE *f, const char *name, const char *type, const char *help, double v) {
    qr_prom_family(f, name, type, help);
    qr_prom_sample(f, name, NULL, v);
}

/* What table_family samples of each table. */
typedef enum table_figure {
    TABLE_ROWS, TABLE_BYTES, TABLE_CANDIDATES, TABLE_FILTER_BYTES, TABLE_ADMITTED,
    TABLE_UNADMITTED_READS, TABLE_DROPPED_ROWS, TABLE_EVICTED,
    /* the disk tier (--table-memory-mb, tier.c) */
    TIER_ROWS_MEMORY, TIER_ROWS_DISK, TIER_DISK_BYTES, TIER_MEMORY_HITS, TIER_DISK_HITS,
    TIER_MISSES, TIER_SPILLED
} table_figure;

static double table_value(const qr_table *t, table_figure what) {
    qr_tier_stats ts;
    if (what >= TIER_ROWS_MEMORY) qr__tier_stats(t, &ts);
    switch (what) {
    case TABLE_ROWS: return (double)qr__tier_rows(t);
    case TABLE_BYTES: return (double)qr_table_bytes(t);
    case TABLE_CANDIDATES: return (double)t->ncand;
    case TABLE_FILTER_BYTES: return (double)t->filter.m;
    case TABLE_ADMITTED: return (double)t->admitted;
    case TABLE_UNADMITTED_READS: return (double)t->unadmitted_reads;
    case TABLE_DROPPED_ROWS: return (double)t->dropped_rows;
    case TABLE_EVICTED: return (double)t->evicted;
    case TIER_ROWS_MEMORY: return (double)ts.rows_memory;
    case TIER_ROWS_DISK: return (double)ts.rows_disk;
    case TIER_DISK_BYTES: return (double)ts.disk_bytes;
    case TIER_MEMORY_HITS: return (double)ts.memory_hits;
    case TIER_DISK_HITS: return (double)ts.disk_hits;
    case TIER_MISSES: return (double)ts.misses;
    case TIER_SPILLED: return (double)ts.rows_spilled;
    }
    return 0;
}

/* A sample per embedding table. */
static void table_family(FILE *f, const qr_ps *ps, const char *name, const char *type,
                         const char *help, table_figure what) {
    qr_prom_family(f, name, type, help);
    for (uint32_t i = 0; i < ps->store.cap; i++) {
        const qr_var *v = ps->store.by_id[i];
        if (!v || !v->table) continue;
        char value[2 * QR_PROTO_MAX_NAME], labels[3 * QR_PROTO_MAX_NAME];
        qr_prom_label(value, sizeof value, v->name);
        snprintf(labels, sizeof labels, "table=\"%s\"", value);
        qr_prom_sample(f, name, labels, table_value(v->table, what));
    }
}

/* Requests: steps applied, pushes and pulls, their latency, stale drops. */
static void render_requests(const qr_ps *ps, FILE *f) {
    const ps_metrics *m = &ps->metrics;
    family(f, "quorum_steps_applied_total", "counter", "Step pushes (async) or steps (sync) "
           "applied on this ps.", (double)(ps->sync.on ? ps->sync.step : ps->applied_steps));
    family(f, "quorum_pushes_total", "counter", "PUSH requests received.", (double)m->pushes);
    family(f, "quorum_push_bytes_total", "counter", "Bytes of gradients pushed here.",
           (double)m->push_bytes);
    family(f, "quorum_pulls_total", "counter", "PULL requests answered.", (double)m->pulls);
    family(f, "quorum_pull_bytes_total", "counter", "Bytes of variables sent by pulls.",
           (double)m->pull_bytes);
    qr_prom_family(f, "quorum_request_seconds", "histogram",
                   "Time from a request's header arriving to its answer being queued.");
    qr_prom_histogram(f, "quorum_request_seconds", "op=\"push\"", &m->push_latency);
    qr_prom_histogram(f, "quorum_request_seconds", "op=\"pull\"", &m->pull_latency);
    if (ps->sync.on && qr__ps_coordinates(ps))
        family(f, "quorum_stale_gradients_dropped_total", "counter",
               "Synchronous gradients dropped as stale.", (double)ps->sync.stale_commits);
}

/* A sample per worker: its last push here and whether it is connected. */
static void render_workers(const qr_ps *ps, FILE *f) {
    const ps_metrics *m = &ps->metrics;
    char labels[64];
    uint64_t now = qr__now_ns();
    qr_prom_family(f, "quorum_worker_last_push_global_step", "gauge",
                   "The global step when the worker last pushed to this ps.");
    for (int w = 0; w < ps->cluster->nworkers; w++) {
        snprintf(labels, sizeof labels, "worker=\"%d\"", w);
        qr_prom_sample(f, "quorum_worker_last_push_global_step", labels,
                       (double)m->worker_step[w]);
    }
    qr_prom_family(f, "quorum_worker_last_seen_seconds", "gauge",
                   "Seconds since the worker's last push to this ps (-1: never).");
    for (int w = 0; w < ps->cluster->nworkers; w++) {
        snprintf(labels, sizeof labels, "worker=\"%d\"", w);
        qr_prom_sample(f, "quorum_worker_last_seen_seconds", labels,
                       m->worker_seen_ns[w] ? (double)(now - m->worker_seen_ns[w]) / 1e9 : -1);
    }
    qr_prom_family(f, "quorum_worker_connected", "gauge",
                   "Whether the worker has a connection open to this ps.");
    for (int w = 0; w < ps->cluster->nworkers; w++) {
        snprintf(labels, sizeof labels, "worker=\"%d\"", w);
        qr_prom_sample(f, "quorum_worker_connected", labels, ps->worker_conns[w] > 0);
    }
}

/* ps 0's checkpoints: the newest one's age, the last one's duration, how many. */
static void render_checkpoints(const qr_ps *ps, FILE *f) {
    double age = ps->ckpt.last_unix_time > 0 ? (double)time(NULL) - ps->ckpt.last_unix_time : -1;
    family(f, "quorum_checkpoint_age_seconds", "gauge",
           "Seconds since the newest complete checkpoint was taken (-1: none yet).", age);
    family(f, "quorum_checkpoint_duration_seconds", "gauge",
           "How long the last checkpoint took, start to manifest.", ps->ckpt.last_seconds);
    family(f, "quorum_checkpoints_total", "counter", "Complete checkpoints written.",
           (double)ps->ckpt.written);
}

/* The tables' disk tier (--table-memory-mb): rows per tier, hits and misses. */
static void render_tier(const qr_ps *ps, FILE *f) {
    table_family(f, ps, "quorum_table_rows_memory", "gauge",
                 "Rows of an embedding table in memory here.", TIER_ROWS_MEMORY);
    table_family(f, ps, "quorum_table_rows_disk", "gauge",
                 "Rows of an embedding table on the disk tier here.", TIER_ROWS_DISK);
    table_family(f, ps, "quorum_table_disk_bytes", "gauge",
                 "Bytes of the disk tier's pages holding an embedding table's rows.",
                 TIER_DISK_BYTES);
    table_family(f, ps, "quorum_table_memory_hits_total", "counter",
                 "Ids of lookups and pushes whose row was in memory.", TIER_MEMORY_HITS);
    table_family(f, ps, "quorum_table_disk_hits_total", "counter",
                 "Ids of lookups and pushes whose row was brought back from disk.",
                 TIER_DISK_HITS);
    table_family(f, ps, "quorum_table_misses_total", "counter",
                 "Ids of lookups and pushes with a row in neither tier.", TIER_MISSES);
    table_family(f, ps, "quorum_table_rows_spilled_total", "counter",
                 "Rows written to the disk tier to keep --table-memory-mb.", TIER_SPILLED);
}

/* Embedding tables, when the ps holds any: per table, then their rows' traffic. */
static void render_tables(const qr_ps *ps, FILE *f) {
    bool tables = false;
    for (uint32_t i = 0; i < ps->store.cap; i++) tables |= ps->store.by_id[i] && ps->store.by_id[i]->table;
    if (!tables) return;
    table_family(f, ps, "quorum_table_rows", "gauge", "Rows an embedding table holds here "
                 "(in memory and on the disk tier).", TABLE_ROWS);
    if (ps->tier) render_tier(ps, f);
    table_family(f, ps, "quorum_table_bytes", "gauge", "Bytes an embedding table holds "
                 "here: rows, slots, ids, index and admission counts.", TABLE_BYTES);
    table_family(f, ps, "quorum_table_admission_candidates", "gauge",
                 "Ids seen but not admitted yet (admit_after; 0 under admit_filter=bloom).",
                 TABLE_CANDIDATES);
    table_family(f, ps, "quorum_table_admission_filter_bytes", "gauge",
                 "Bytes of the counting Bloom filter that counts sightings under "
                 "admit_filter=bloom (one 8-bit counter a byte); 0 otherwise.", TABLE_FILTER_BYTES);
    table_family(f, ps, "quorum_table_rows_admitted_total", "counter",
                 "Rows made at an id's admit_after-th sighting.", TABLE_ADMITTED);
    table_family(f, ps, "quorum_table_unadmitted_reads_total", "counter",
                 "Lookups of ids not admitted yet, answered with the initial value.",
                 TABLE_UNADMITTED_READS);
    table_family(f, ps, "quorum_table_dropped_rows_total", "counter",
                 "Pushed gradient rows dropped: their id was not admitted yet.",
                 TABLE_DROPPED_ROWS);
    table_family(f, ps, "quorum_table_rows_evicted_total", "counter",
                 "Rows removed after evict_after_steps steps without an update.",
                 TABLE_EVICTED);
    family(f, "quorum_table_rows_added_total", "counter",
           "Rows made in the embedding tables here (first lookup or push of an id).",
           (double)ps->metrics.rows_added);
    family(f, "quorum_table_rows_looked_up_total", "counter",
           "Rows sent in answer to lookups.", (double)ps->metrics.rows_looked_up);
    family(f, "quorum_table_rows_pushed_total", "counter",
           "Distinct rows updated by sparse pushes and sync steps.",
           (double)ps->metrics.rows_pushed);
    family(f, "quorum_duplicate_pushes_total", "counter",
           "Pushes of a (worker, seq) applied here already: answered, not applied again "
           "(--ps-replicas 2).", (double)ps->replica.duplicate_pushes);
    family(f, "quorum_replica_forwards_total", "counter",
           "Updates forwarded to this ps's backup (--ps-replicas 2).",
           (double)(ps->replica.link.forwards + ps->replica.copy_link.forwards));
    family(f, "quorum_replica_answered_ahead_total", "counter",
           "Pushes answered before the backup had applied them (--replication-lag).",
           (double)ps->replica.answered_ahead);
}

/* Connections: open, refused, evicted, and the handshakes refused by reason. */
static void render_connections(const qr_ps *ps, FILE *f) {
    family(f, "quorum_connections", "gauge", "Connections open to this ps.", ps->npeers);
    family(f, "quorum_connections_refused_total", "counter",
           "Connections closed at once: max-connections were open.", (double)ps->peers_refused);
    family(f, "quorum_connections_evicted_total", "counter",
           "Connections not yet identified (no HELLO) closed to make room for a new one at "
           "max-connections.", (double)ps->peers_evicted);
    family(f, "quorum_authenticated", "gauge",
           "1 if every connection must authenticate with the cluster secret.", ps->auth != NULL);
    qr_prom_family(f, "quorum_handshakes_refused_total", "counter",
                   "Connections closed at their handshake, by reason (docs/SECURITY.md).");
    for (int why = 1; why <= QR_HS_REFUSAL_MAX; why++) {
        char reason[64];
        snprintf(reason, sizeof reason, "reason=\"%s\"", qr_hs_reason_label(why));
        qr_prom_sample(f, "quorum_handshakes_refused_total", reason,
                       (double)ps->handshakes_refused[why]);
    }
}

/* The whole page, one metric family after another in a fixed order. */
static void render(qr_ps *ps, FILE *f) {
    family(f, "quorum_ps_up", "gauge", "This quorum ps task is serving (always 1).", 1);
    if (qr__ps_coordinates(ps))
        family(f, "quorum_global_step", "gauge", "The global step (ps 0 holds it).",
               (double)ps->global_step);
    render_requests(ps, f);
    if (ps->metrics.worker_seen_ns) render_workers(ps, f);
    if (ps->ckpt.dir && qr__ps_coordinates(ps)) render_checkpoints(ps, f);
    family(f, "quorum_variables_bytes", "gauge", "Bytes of the variables held here.",
           (double)ps->store.bytes);
    render_tables(ps, f);
    family(f, "quorum_process_resident_bytes", "gauge", "The ps process's resident memory.",
           (double)qr_process_rss_bytes());
    render_connections(ps, f);
}

static void on_render(uv_async_t *a) {
    qr_ps *ps = a->data;
    ps_metrics *m = &ps->metrics;
    char *page = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&page, &len);
    if (f) {
        render(ps, f);
        fclose(f);
    }
    pthread_mutex_lock(&m->mu);
    if (page) {
        free(m->page);
        m->page = page;
    }
    m->rendered++;
    pthread_cond_broadcast(&m->cond);
    pthread_mutex_unlock(&m->mu);
}

/* ---- the server's side -------------------------------------------------------- */

static void serve(FILE *f, void *ctx) {
    qr_ps *ps = ctx;
    ps_metrics *m = &ps->metrics;
    pthread_mutex_lock(&m->mu);
    uint64_t want = m->rendered + 1;
    bool fresh = false;
    if (!m->closing) {
        uv_async_send(&m->render);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += RENDER_WAIT_MS / 1000;
        while (!m->closing && m->rendered < want &&
               pthread_cond_timedwait(&m->cond, &m->mu, &until) == 0) {
        }
        fresh = m->rendered >= want;
    }
    if (!fresh) fprintf(f, "# the ps loop did not answer within %d ms: the last page\n",
                        RENDER_WAIT_MS);
    if (m->page) fputs(m->page, f);
    pthread_mutex_unlock(&m->mu);
}

int qr__metrics_init(qr_ps *ps) {
    ps_metrics *m = &ps->metrics;
    int port = (int)qr__config_int(ps->cfg, "metrics-port");
    if (qr__ps_coordinates(ps)) {
        m->worker_seen_ns = qr__calloc((size_t)QR_MAX(ps->cluster->nworkers, 1), sizeof *m->worker_seen_ns);
        m->worker_step = qr__calloc((size_t)QR_MAX(ps->cluster->nworkers, 1), sizeof *m->worker_step);
        if (!m->worker_seen_ns || !m->worker_step) return QR_ENOMEM;
    }
    if (!port) return QR_OK;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cond, NULL);
    uv_async_init(&ps->loop, &m->render, on_render);
    m->render.data = ps;
    m->on = true;
    int rc = qr_metrics_start(&m->server, qr__config_str(ps->cfg, "metrics-bind"), port, serve, ps);
    if (!rc)
        qr__log(QR_LOG_INFO, "metrics at http://%s:%d/metrics", qr__config_str(ps->cfg, "metrics-bind"),
                port);
    return rc;
}

/* Before the loop's handles close: no scrape may wait for it any more. */
void qr__metrics_close(qr_ps *ps) {
    ps_metrics *m = &ps->metrics;
    if (!m->on) return;
    pthread_mutex_lock(&m->mu);
    m->closing = true;
    pthread_cond_broadcast(&m->cond);
    pthread_mutex_unlock(&m->mu);
    qr_metrics_stop(m->server); /* joins the server's thread */
    m->server = NULL;
    if (!uv_is_closing((uv_handle_t *)&m->render)) uv_close((uv_handle_t *)&m->render, NULL);
}

void qr__metrics_free(qr_ps *ps) {
    ps_metrics *m = &ps->metrics;
    free(m->worker_seen_ns);
    free(m->worker_step);
    m->worker_seen_ns = NULL;
    m->worker_step = NULL;
    if (!m->on) return;
    free(m->page);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cond);
    m->on = false;
}

/*
 * lookup.c - LOOKUP: the rows of an embedding table for a batch's ids
 * placed on this ps (the worker has removed duplicates and split the ids
 * by shard). A row is made on first lookup with the table's seeded
 * initializer (table.h); a read-only lookup (evaluation) gives an absent
 * id its initial value without adding it.
 *
 * The reply copies the rows into a buffer of its own: rows sit apart in
 * the arena and may move (a removal fills the hole with the last row), so
 * unlike a dense pull the reply cannot lend them (and a push from another
 * worker updates rows in place while a large reply may still be queued).
 * The copy is one pass over bytes the reply sends anyway, its cache
 * misses overlapped (qr_table_lookup, table.c). The buffer comes from the ps's
 * receive pool and goes back to it once sent: a fresh one per lookup
 * page-faulted on every reply (`quorum bench embed`).
 */
#include "ps/ps_internal.h"
#include "ps/tier.h"

#include "cluster/placement.h"

#include <stdlib.h>
#include <string.h>

int qr__lookup_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_msg_lookup m;
    qr_msg_get_lookup(&r, &m);
    if (r.bad || r.left) return qr__fail(QR_EPROTO, "LOOKUP meta must be %d bytes, not %u",
                                         QR_MSG_LOOKUP_LEN, f->meta_len);
    if (f->flags & ~QR_LOOKUP_READ_ONLY)
        return qr__fail(QR_EINVAL, "LOOKUP: unknown flags 0x%x", f->flags);
    qr_var *v = NULL;
    p->ps->mark++;
    int rc = qr__peer_reserve_items(p, 1);
    if (!rc) rc = qr__peer_lookup(p, "LOOKUP", m.var_id, &v);
    if (rc) return rc;
    if (!v->table)
        return qr__fail(QR_EINVAL, "LOOKUP: '%s' is a dense variable, not an embedding table "
                        "(pull it)", v->name);
    if (m.count > QR_LOOKUP_MAX_IDS || m.count * 8 != f->payload_len)
        return qr__fail(QR_EPROTO, "LOOKUP of '%s': %llu ids (at most %d) in a payload of "
                        "%llu bytes", v->name, (unsigned long long)m.count, QR_LOOKUP_MAX_IDS,
                        (unsigned long long)f->payload_len);
    if (m.count * (uint64_t)v->table->dim * 4 > p->ps->conn_opt.max_payload)
        return qr__fail(QR_ETOOBIG, "LOOKUP of '%s': %llu rows of %lld floats make a reply "
                        "larger than max-message", v->name, (unsigned long long)m.count,
                        (long long)v->table->dim);
    p->items[0] = (push_item){.var = v, .nrows = (int64_t)m.count};
    p->nitems = 1;
    if (!f->payload_len) return QR_OK;
    rc = qr__peer_take_recv(p, f->payload_len);
    if (rc) return rc;
    p->items[0].data = (uint8_t *)p->recv;
    qr_iov iov = {p->recv, f->payload_len};
    return qr_conn_expect(p->conn, &iov, 1);
}

/* A reply's rows, lent until sent. */
typedef struct lookup_reply {
    qr_ps *ps;
    float *rows;
    size_t cap;
} lookup_reply;

static void on_lookup_sent(qr_conn *c, int status, void *ctx) {
    lookup_reply *r = ctx;
    qr__recv_pool_put(&r->ps->recv_pool, r->rows, r->cap);
    free(r);
    qr__peer_reply_sent(c, status, NULL);
}

void qr__lookup_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    qr_var *v = p->items[0].var;
    qr_table *t = v->table;
    int64_t n = p->items[0].nrows, dim = t->dim;
    const int64_t *ids = (const int64_t *)p->items[0].data;
    char msg[300];
    /* With one ps every id is placed here: no hash per id to check. */
    for (int64_t i = 0; i < n && ps->cluster->nps > 1; i++) {
        if (qr_place_row(ids[i], ps->cluster->nps) != qr__peer_shard(p)) {
            snprintf(msg, sizeof msg, "%s: LOOKUP of '%s': id %lld is placed on ps %d, not "
                     "on the shard served here", ps->name, v->name, (long long)ids[i],
                     qr_place_row(ids[i], ps->cluster->nps));
            qr__peer_reply_error(p, f, QR_EINVAL, msg);
            return;
        }
    }
    lookup_reply *reply = malloc(sizeof *reply);
    size_t cap = 0;
    float *out = reply ? qr__recv_pool_get(&ps->recv_pool, (size_t)n * dim * sizeof(float), &cap)
                       : NULL;
    if (!out) {
        free(reply);
        qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory answering a lookup");
        return;
    }
    *reply = (lookup_reply){ps, out, cap};
    uint64_t added = 0;
    t->clock = p->promoted_shard ? ps->replica.copy_steps : ps->applied_steps;
    /* Rows on the disk tier come back first (tier.c). */
    int trc = qr__tier_fault_in(ps, v, ids, n);
    if (trc) {
        qr__recv_pool_put(&ps->recv_pool, out, cap);
        free(reply);
        snprintf(msg, sizeof msg, "%s: LOOKUP of '%s': %s", ps->name, v->name, qr_last_error());
        qr__peer_reply_error(p, f, trc, msg);
        return;
    }
    /* A sighting (admission counts it) unless read-only. An id with no
     * row (not admitted yet, or a read) reads its initial value. */
    if (qr_table_lookup(t, n, ids, f->flags & QR_LOOKUP_READ_ONLY, out, &added)) {
        qr__recv_pool_put(&ps->recv_pool, out, cap);
        free(reply);
        snprintf(msg, sizeof msg, "%s: LOOKUP of '%s': %s", ps->name, v->name, qr_last_error());
        qr__peer_reply_error(p, f, QR_ENOMEM, msg);
        return;
    }
    qr_table_evict_idle(t);
    /* The backup replays the sightings (replica_backup.c); the answer does not
     * wait for it: a row's values come from (seed, id) alone. */
    if (qr__replica_on(ps) && !(f->flags & QR_LOOKUP_READ_ONLY)) {
        qr_msg_repl_head head = {.t = t->clock};
        repl_forward *fw = qr__replica_begin(ps, &head);
        qr__replica_add(fw, v->id, QR_REPL_LOOKUP, 0, ids, (uint64_t)n * 8);
        qr__replica_send_for(p, fw); /* a promoted shard's: to its copy being made, if any */
    }
    ps->metrics.rows_added += added;
    ps->metrics.rows_looked_up += (uint64_t)n;
    qr_wbuf head = {0};
    qr_wbuf_u64(&head, (uint64_t)n);
    qr_iov iov = {out, (size_t)(n * dim) * sizeof(float)};
    if (head.oom) {
        qr__recv_pool_put(&ps->recv_pool, out, cap);
        free(reply);
        qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory");
    } else {
        qr__peer_reply(p, f, QR_OK, &head, &iov, 1, on_lookup_sent, reply);
    }
    qr_wbuf_free(&head);
}

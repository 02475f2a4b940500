/*
 * rows.c - embedding tables and sparse rows, the worker's side
 * (docs/EMBEDDINGS.md).
 *
 * A table lives on every ps: id i is on ps qr_place_row(i, nps), a hash
 * every worker and ps computes alike. A pull of a batch's rows asks each
 * ps only once for each distinct id (a batch of a Zipf-distributed field
 * repeats its head ids many times), one LOOKUP per ps, all in flight
 * together; the rows come back into scratch that the worker keeps, and are
 * copied out to each place the caller asked for (or, for distinct ids on
 * one ps, straight into the caller's array).
 *
 * Rows to push are added first (qr_worker_add_rows: summed by id into the
 * worker's buffer, so the caller's arrays are free at once) and travel
 * with the next qr_worker_push, split by ps, beside its dense gradients:
 * in sync mode that makes one step, one quorum, of dense and sparse
 * gradients alike. qr_worker_push_sparse (client.c, beside the dense
 * push) is the two in one call; a table is declared in declare.c.
 */
#include "worker/worker_internal.h"

#include "cluster/placement.h"
#include "common/init.h"
#include "optim/optim.h"

#include <stdlib.h>
#include <string.h>

/* ---- pull ----------------------------------------------------------------- */

static int grow(void **p, uint64_t *cap, uint64_t want, size_t elem) {
    if (want <= *cap) return QR_OK;
    uint64_t cap2 = QR_MAX(want, *cap * 2);
    void *q = realloc(*p, cap2 * elem);
    if (!q) return qr__fail(QR_ENOMEM, "out of memory for %llu rows", (unsigned long long)cap2);
    *p = q;
    *cap = cap2;
    return QR_OK;
}

/* The first slot of id in a table of 2^(64 - shift) slots. One multiply
 * (Fibonacci hashing: the product's top bits pick the slot) spreads
 * sequential ids, the usual vocabulary indices, evenly. These are the
 * caller's own ids, not a stranger's, and a bad spread would only cost
 * time. */
static inline uint64_t id_slot(int64_t id, int shift) {
    return ((uint64_t)id * 0x9e3779b97f4a7c15ull) >> shift;
}

/* 64 - log2(slots), slots a power of two. */
static int slots_shift(uint64_t slots) {
    int shift = 64;
    while ((1ull << (64 - shift)) < slots) shift--;
    return shift;
}

/* The slots of the id table a call with n ids uses: the fewest, a power
 * of two, that keep it at most half full, so that probe runs stay short. */
static uint64_t table_slots(uint64_t n) {
    uint64_t slots = 16;
    while (slots < 2 * n) slots *= 2;
    return slots;
}

/* The scratch for n ids of which at most n are distinct, rows of dim. */
static int lookup_reserve(qr_worker *w, uint64_t n, int64_t dim) {
    wk_lookup *k = &w->lookup;
    if (!k->start) {
        k->start = qr__calloc((size_t)w->nps + 1, sizeof *k->start);
        if (!k->start) return QR_ENOMEM;
    }
    if (!k->fill) {
        k->fill = qr__calloc((size_t)w->nps, sizeof *k->fill);
        if (!k->fill) return QR_ENOMEM;
    }
    uint64_t slots = table_slots(n);
    if (slots > k->cap_table) {
        /* Zeroed: gen 0 is no call's, so every slot starts empty. */
        wk_id_slot *table = qr__calloc((size_t)slots, sizeof *table);
        if (!table) return QR_ENOMEM;
        free(k->table);
        k->table = table;
        k->cap_table = slots;
    }
    uint64_t cap_n = k->cap_n, cap_u = k->cap_u;
    int rc = grow((void **)&k->pos, &cap_n, n, sizeof *k->pos);
    if (!rc && n > k->cap_u) {
        uint64_t c;
        c = k->cap_u; rc = grow((void **)&k->uniq, &c, n, sizeof *k->uniq);
        c = k->cap_u; if (!rc) rc = grow((void **)&k->slot, &c, n, sizeof *k->slot);
        c = k->cap_u; if (!rc) rc = grow((void **)&k->shard, &c, n, sizeof *k->shard);
        c = k->cap_u; if (!rc) rc = grow((void **)&k->grouped, &c, n, sizeof *k->grouped);
        cap_u = c;
    }
    if (!rc && n * (uint64_t)dim > k->cap_rows) {
        float *rows = qr__aligned_alloc_uninit(n * (uint64_t)dim * sizeof *rows);
        if (!rows) return QR_ENOMEM;
        free(k->rows);
        k->rows = rows;
        k->cap_rows = n * (uint64_t)dim;
    }
    if (rc) return rc;
    k->cap_n = cap_n;
    k->cap_u = cap_u;
    return QR_OK;
}

/* How many ids ahead the deduplication fetches a slot. */
#define DEDUP_AHEAD 8

/* The batch's distinct ids into k->uniq (first-seen order), which one
 * each id is into k->pos, each distinct id's ps into k->shard and how
 * many each ps has into k->start[p + 1]. Returns how many are distinct.
 * The scratch holds n ids (lookup_reserve). */
static uint64_t lookup_dedup(wk_lookup *k, int nps, int64_t n, const int64_t *ids) {
    if (++k->gen == 0) {
        /* The gens have come round (after 2^32 - 1 calls): a slot filled
         * that long ago would pass for this call's, so empty them all this
         * once. */
        memset(k->table, 0, (size_t)k->cap_table * sizeof *k->table);
        k->gen = 1;
    }
    uint32_t gen = k->gen;
    uint64_t slots = table_slots((uint64_t)n), mask = slots - 1;
    int shift = slots_shift(slots);
    memset(k->start, 0, ((size_t)nps + 1) * sizeof *k->start);
    uint64_t nu = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t id = ids[i];
        uint64_t at = id_slot(id, shift);
        /* The table (16 bytes a slot, 128 KiB for 4096 ids) outgrows L1:
         * the slot of the id DEDUP_AHEAD places on is fetched while this
         * one is probed (the probe's load was a third of the pull's time
         * on the worker in `perf`, docs/EMBEDDINGS.md). */
        if (i + DEDUP_AHEAD < n)
            __builtin_prefetch(&k->table[id_slot(ids[i + DEDUP_AHEAD], shift)]);
        wk_id_slot *s = &k->table[at];
        while (s->gen == gen && s->id != id) {
            at = (at + 1) & mask;
            s = &k->table[at];
        }
        if (s->gen != gen) {
            *s = (wk_id_slot){.id = id, .gen = gen, .at = (uint32_t)nu};
            int p = nps > 1 ? qr_place_row(id, nps) : 0;
            k->uniq[nu] = id;
            k->shard[nu] = p;
            k->start[p + 1]++;
            nu++;
        }
        k->pos[i] = s->at;
    }
    return nu;
}

static int check_table(qr_worker *w, const char *what, int var_id, int64_t n, const void *ids,
                       const void *rows) {
    int rc = wk_check_ids(w, what, 1, &var_id);
    if (rc) return rc;
    if (n < 0 || n > QR_WORKER_MAX_ROWS || (n > 0 && (!ids || !rows)))
        return qr__fail(QR_EINVAL, "%s: %lld rows (0..%d allowed), or a NULL array", what,
                        (long long)n, QR_WORKER_MAX_ROWS);
    return QR_OK;
}

int qr_worker_pull_rows(qr_worker *w, int var_id, int64_t n, const int64_t *ids, float *out,
                        unsigned flags) {
    int rc = check_table(w, "pull_rows", var_id, n, ids, out);
    if (rc) return rc;
    wk_var *v = &w->vars[var_id];
    if (!v->table)
        return qr__fail(QR_EINVAL, "pull_rows: '%s' is a dense variable, not an embedding "
                        "table (use qr_worker_pull)", v->name);
    if (flags & ~QR_ROWS_READ_ONLY) return qr__fail(QR_EINVAL, "pull_rows: unknown flags 0x%x", flags);
    if (n == 0) return QR_OK;
    int64_t dim = v->shape[0];
    if ((rc = lookup_reserve(w, (uint64_t)n, dim))) return rc;
    wk_lookup *k = &w->lookup;
    uint64_t nu = lookup_dedup(k, w->nps, n, ids);
    for (int p = 0; p < w->nps; p++) k->start[p + 1] += k->start[p];
    /* Grouped by ps (a counting sort, stable: first-seen order within);
     * with one ps the distinct ids are that already. */
    int64_t *grouped = k->uniq;
    if (w->nps > 1) {
        memcpy(k->fill, k->start, (size_t)w->nps * sizeof *k->fill);
        for (uint64_t u = 0; u < nu; u++) {
            uint64_t at = k->fill[k->shard[u]]++;
            k->grouped[at] = k->uniq[u];
            k->slot[u] = (uint32_t)at;
        }
        grouped = k->grouped;
    }
    wk_request **reqs = qr__calloc((size_t)w->nps, sizeof *reqs);
    if (!reqs) return QR_ENOMEM;
    /* Distinct ids all on one ps (always so with one ps): the reply's rows
     * come in the caller's order, so they land straight in its array, not
     * in the scratch first (quorum.torch.Embedding asks for distinct ids). */
    bool direct = nu == (uint64_t)n && k->start[k->shard[0] + 1] - k->start[k->shard[0]] == nu;
    int nreq = 0;
    for (int p = 0; p < w->nps && !rc; p++) {
        uint64_t count = k->start[p + 1] - k->start[p];
        if (!count) continue;
        wk_request *r = wk_request_new(w, p, QR_MSG_LOOKUP);
        if (!r) {
            rc = QR_ENOMEM;
            break;
        }
        reqs[nreq++] = r;
        r->flags = (flags & QR_ROWS_READ_ONLY) ? QR_LOOKUP_READ_ONLY : 0;
        qr_msg_put_lookup(&r->meta, &(qr_msg_lookup){.var_id = (uint32_t)var_id, .count = count});
        r->payload = qr__calloc(1, sizeof *r->payload);
        r->dst = qr__calloc(1, sizeof *r->dst);
        if (!r->payload || !r->dst || r->meta.oom) {
            rc = QR_ENOMEM;
            break;
        }
        r->payload[0] = (qr_iov){grouped + k->start[p], (size_t)count * 8};
        r->npayload = 1;
        r->dst[0] = direct ? out : k->rows + k->start[p] * (uint64_t)dim;
        r->rows = count;
        r->rows_dim = dim;
    }
    if (!rc) rc = wk_run_requests(w, reqs, nreq, w->timeout_ms);
    wk_free_requests(reqs, nreq);
    free(reqs);
    if (rc || direct) return rc;
    size_t row_bytes = (size_t)dim * sizeof(float);
    for (int64_t i = 0; i < n; i++) {
        /* The rows come in any order of the scratch (L2 at best): the
         * one DEDUP_AHEAD positions on is fetched while this is copied. */
        if (i + DEDUP_AHEAD < n) {
            uint64_t next = w->nps > 1 ? k->slot[k->pos[i + DEDUP_AHEAD]] : k->pos[i + DEDUP_AHEAD];
            const char *row = (const char *)(k->rows + next * (uint64_t)dim);
            for (size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(row + b);
        }
        uint64_t at = w->nps > 1 ? k->slot[k->pos[i]] : k->pos[i];
        memcpy(out + i * dim, k->rows + at * (uint64_t)dim, row_bytes);
    }
    return QR_OK;
}

/* ---- rows added to the next push -------------------------------------------- */

/* The split's own arrays, if it has them (not the sums lent, rows_split). */
static void split_free(wk_rows *a) {
    if (a->split_ids != a->ids) {
        free(a->split_ids);
        free(a->split_rows);
    }
    a->split_ids = NULL;
    a->split_rows = NULL;
    free(a->start);
    a->start = NULL;
}

static void rows_free(wk_rows *a) {
    if (!a) return;
    split_free(a);
    free(a->table);
    free(a->ids);
    free(a->sum);
    free(a);
}

void wk_rows_free(qr_worker *w) {
    for (int i = 0; i < w->nvars; i++) {
        rows_free(w->vars[i].added);
        w->vars[i].added = NULL;
    }
    wk_lookup *k = &w->lookup;
    free(k->table);
    free(k->uniq);
    free(k->pos);
    free(k->slot);
    free(k->shard);
    free(k->grouped);
    free(k->rows);
    free(k->start);
    free(k->fill);
    memset(k, 0, sizeof *k);
}

/* id's slot in a's table: its own, or the empty one it would take. */
static wk_id_slot *rows_probe(const wk_rows *a, int64_t id) {
    uint64_t mask = a->table_cap - 1, at = id_slot(id, a->table_shift);
    wk_id_slot *s = &a->table[at];
    while (s->gen == a->gen && s->id != id) s = &a->table[at = (at + 1) & mask];
    return s;
}

/* Room in a's id table for `more` ids beyond those held, at most half
 * full; a bigger table takes the ids held again. */
static int rows_table_reserve(wk_rows *a, uint64_t more) {
    if (a->n + more > 0x7fffffffull) /* a slot's place is 32 bits */
        return qr__fail(QR_ENOMEM, "add_rows: more than 2^31 rows added before a push");
    uint64_t slots = table_slots(a->n + more);
    if (slots <= a->table_cap) return QR_OK;
    wk_id_slot *table = qr__calloc((size_t)slots, sizeof *table);
    if (!table) return QR_ENOMEM;
    free(a->table);
    a->table = table;
    a->table_cap = slots;
    a->table_shift = slots_shift(slots);
    if (!a->gen) a->gen = 1; /* zeroed slots: gen 0 is no push's */
    for (uint64_t i = 0; i < a->n; i++)
        *rows_probe(a, a->ids[i]) = (wk_id_slot){.id = a->ids[i], .gen = a->gen, .at = (uint32_t)i};
    return QR_OK;
}

int qr_worker_add_rows(qr_worker *w, int var_id, int64_t n, const int64_t *ids,
                       const float *rows) {
    int rc = check_table(w, "add_rows", var_id, n, ids, rows);
    if (rc) return rc;
    wk_var *v = &w->vars[var_id];
    int64_t dim = v->shape[v->ndim - 1];
    int64_t nrows = v->table ? 0 : v->n / dim;
    for (int64_t i = 0; i < n && !v->table; i++)
        if (ids[i] < 0 || ids[i] >= nrows)
            return qr__fail(QR_EINVAL, "add_rows: '%s': row index %lld is out of range [0, "
                            "%lld)", v->name, (long long)ids[i], (long long)nrows);
    if (!v->table && v->nparts > 1 && v->ndim == 1)
        return qr__fail(QR_EINVAL, "add_rows: '%s' is one row split over %d shards: push it "
                        "densely", v->name, v->nparts);
    if (!qr_optim_all_finite(rows, n * dim))
        return qr__fail(QR_ENONFINITE, "add_rows: the rows for '%s' contain NaN or Inf",
                        v->name);
    wk_rows *a = v->added;
    if (!a && !(a = v->added = qr__calloc(1, sizeof *a))) return QR_ENOMEM;
    if (rows_table_reserve(a, (uint64_t)n)) return QR_ENOMEM;
    if (a->n + (uint64_t)n > a->cap) {
        uint64_t cap = QR_MAX(a->n + (uint64_t)n, a->cap * 2);
        int64_t *ids2 = realloc(a->ids, cap * sizeof *ids2);
        if (ids2) a->ids = ids2;
        float *sum2 = realloc(a->sum, cap * (uint64_t)dim * sizeof *sum2);
        if (sum2) a->sum = sum2;
        if (!ids2 || !sum2) return qr__fail(QR_ENOMEM, "add_rows: out of memory");
        a->cap = cap;
    }
    /* Duplicates summed in the order they come: the same rows added in the
     * same order give the same sums. */
    for (int64_t i = 0; i < n; i++) {
        /* The slot of an id DEDUP_AHEAD on is fetched while this one is
         * probed. */
        if (i + DEDUP_AHEAD < n)
            __builtin_prefetch(&a->table[id_slot(ids[i + DEDUP_AHEAD], a->table_shift)]);
        wk_id_slot *s = rows_probe(a, ids[i]);
        bool added = s->gen != a->gen;
        if (added) *s = (wk_id_slot){.id = ids[i], .gen = a->gen, .at = (uint32_t)a->n};
        float *dst = a->sum + (uint64_t)s->at * (uint64_t)dim;
        if (added) {
            a->ids[a->n++] = ids[i];
            memcpy(dst, rows + i * dim, (size_t)dim * sizeof *dst);
        } else {
            /* The vectorised loop of a delta push: the same float sums
             * (this one, with no restrict, compiled to scalar adds). */
            qr_optim_add_delta(dst, dst, rows + i * dim, dim);
        }
    }
    return QR_OK;
}

/* The ps that holds row id of v, and the id it knows the row by there: a
 * table's id itself, a dense variable's row index within its shard. */
static int row_place(const qr_worker *w, const wk_var *v, int64_t id, int64_t *id_there) {
    if (id_there) *id_there = id;
    if (v->table) return w->nps > 1 ? qr_place_row(id, w->nps) : 0;
    int64_t dim = v->shape[v->ndim - 1], at = id * dim;
    int k = 0;
    while (k + 1 < v->nparts && at >= v->parts[k + 1].offset) k++;
    if (id_there) *id_there = (at - v->parts[k].offset) / dim;
    return v->parts[k].ps;
}

/* Split every variable's added rows by ps (once per push). Rows that all
 * go to one ps under their own ids (always so with one ps) are sent from
 * the sums themselves: no copy. */
static int rows_split(qr_worker *w, wk_var *v) {
    wk_rows *a = v->added;
    int64_t dim = v->shape[v->ndim - 1];
    split_free(a);
    a->start = qr__calloc((size_t)w->nps + 1, sizeof *a->start);
    if (!a->start) return qr__fail(QR_ENOMEM, "push: out of memory splitting the rows of '%s'",
                                   v->name);
    for (uint64_t i = 0; i < a->n; i++) a->start[row_place(w, v, a->ids[i], NULL) + 1]++;
    int used = 0;
    for (int p = 0; p < w->nps; p++) used += a->start[p + 1] > 0;
    for (int p = 0; p < w->nps; p++) a->start[p + 1] += a->start[p];
    if (used <= 1 && (v->table || v->nparts <= 1)) {
        a->split_ids = a->ids;
        a->split_rows = a->sum;
        return QR_OK;
    }
    a->split_ids = malloc(QR_MAX(a->n, 1) * sizeof *a->split_ids);
    a->split_rows = malloc(QR_MAX(a->n, 1) * (uint64_t)dim * sizeof *a->split_rows);
    uint64_t *fill = qr__calloc((size_t)w->nps, sizeof *fill);
    if (!a->split_ids || !a->split_rows || !fill) {
        free(fill);
        free(a->split_ids);
        free(a->split_rows);
        a->split_ids = NULL;
        a->split_rows = NULL;
        return qr__fail(QR_ENOMEM, "push: out of memory splitting the rows of '%s'", v->name);
    }
    for (uint64_t i = 0; i < a->n; i++) {
        int64_t id;
        int p = row_place(w, v, a->ids[i], &id);
        uint64_t at = a->start[p] + fill[p]++;
        a->split_ids[at] = id;
        memcpy(a->split_rows + at * (uint64_t)dim, a->sum + i * (uint64_t)dim,
               (size_t)dim * sizeof(float));
    }
    free(fill);
    return QR_OK;
}

int wk_rows_prepare(qr_worker *w) {
    for (int i = 0; i < w->nvars; i++) {
        wk_var *v = &w->vars[i];
        /* Sync: every table goes to every ps in every push, with no rows if
         * none were added, so each ps holds every member's push of a step. */
        if (!v->added && v->table && w->sync) {
            v->added = qr__calloc(1, sizeof *v->added);
            if (!v->added) return QR_ENOMEM;
        }
        if (v->added && rows_split(w, v)) return QR_ENOMEM;
    }
    return QR_OK;
}

/* Does variable v carry an item to ps p in this push? */
static bool item_for(const qr_worker *w, const wk_var *v, int p) {
    const wk_rows *a = v->added;
    if (!a || !a->start) return false;
    if (w->sync && v->table) return true;
    return a->start[p + 1] > a->start[p];
}

int wk_rows_items(const qr_worker *w, int p) {
    int n = 0;
    for (int i = 0; i < w->nvars; i++) n += item_for(w, &w->vars[i], p);
    return n;
}

bool wk_rows_with_lr(const qr_worker *w) {
    for (int i = 0; i < w->nvars; i++)
        if (w->vars[i].added && w->vars[i].added->start && w->vars[i].push_lr >= 0) return true;
    return false;
}

void wk_rows_put(qr_worker *w, int p, wk_request *r, bool with_lr) {
    for (int i = 0; i < w->nvars; i++) {
        wk_var *v = &w->vars[i];
        if (!item_for(w, v, p)) continue;
        wk_rows *a = v->added;
        int64_t dim = v->shape[v->ndim - 1];
        uint64_t k = a->start[p + 1] - a->start[p];
        qr_msg_put_var(&r->meta, &(qr_msg_var){.id = (uint32_t)i, .kind = QR_GRAD_SPARSE,
                                               .nbytes = k * (8 + 4 * (uint64_t)dim),
                                               .version = v->table ? v->version
                                                                   : wk_part_on(v, p)->version});
        if (with_lr) qr_msg_put_push_lr(&r->meta, v->push_lr);
        r->payload[r->npayload++] = (qr_iov){a->split_ids + a->start[p], (size_t)k * 8};
        r->payload[r->npayload++] =
            (qr_iov){a->split_rows + a->start[p] * (uint64_t)dim, (size_t)(k * dim) * 4};
    }
}

bool wk_rows_pending(const qr_worker *w) {
    for (int i = 0; i < w->nvars; i++)
        if (w->vars[i].added && w->vars[i].added->n) return true;
    return false;
}

void wk_rows_clear(qr_worker *w) {
    for (int i = 0; i < w->nvars; i++) {
        wk_rows *a = w->vars[i].added;
        if (!a) continue;
        /* A new gen empties every slot; after 2^32 - 1 pushes the gens
         * come round, and the slots are emptied this once. */
        if (a->table && ++a->gen == 0) {
            memset(a->table, 0, (size_t)a->table_cap * sizeof *a->table);
            a->gen = 1;
        }
        a->n = 0;
        split_free(a);
    }
}

/*
 * rows.c - the sparse rows of a push: their ids checked against what this
 * ps holds, summed by id (rows.h), and applied to a table or to the rows
 * of a dense variable (async pushes and sync steps alike).
 */
#include "ps/ps_internal.h"
#include "ps/tier.h"

#include "cluster/placement.h"

#include <stdlib.h>
#include <string.h>

int row_sum_init(row_sum *s, int64_t dim, uint64_t expected) {
    memset(s, 0, sizeof *s);
    s->dim = dim;
    return qr_idmap_init(&s->index, expected);
}

void row_sum_free(row_sum *s) {
    qr_idmap_free(&s->index);
    free(s->ids);
    free(s->sum);
    free(s->count);
    free(s->last);
    memset(s, 0, sizeof *s);
}

static int reserve(row_sum *s, uint64_t more) {
    if (s->n + more <= s->cap) return QR_OK;
    uint64_t cap = QR_MAX(s->cap * 2, s->n + more);
    int64_t *ids = realloc(s->ids, cap * sizeof *ids);
    if (ids) s->ids = ids;
    float *sum = realloc(s->sum, cap * (uint64_t)s->dim * sizeof *sum);
    if (sum) s->sum = sum;
    uint32_t *count = realloc(s->count, cap * sizeof *count);
    if (count) s->count = count;
    uint32_t *last = realloc(s->last, cap * sizeof *last);
    if (last) s->last = last;
    if (!ids || !sum || !count || !last) return qr__fail(QR_ENOMEM, "out of memory summing sparse rows");
    s->cap = cap;
    return QR_OK;
}

int row_sum_add(row_sum *s, const uint8_t *ids, const float *rows, int64_t k) {
    if (reserve(s, (uint64_t)k)) return QR_ENOMEM;
    int64_t dim = s->dim;
    s->sources++;
    for (int64_t i = 0; i < k; i++) {
        int64_t id;
        memcpy(&id, ids + 8 * i, 8);
        bool added;
        int64_t at = qr_idmap_insert(&s->index, s->ids, id, (uint32_t)s->n, &added);
        if (at < 0) return QR_ENOMEM;
        float *dst = s->sum + at * dim;
        const float *src = rows + i * dim;
        if (added) {
            s->ids[at] = id;
            s->n++;
            memcpy(dst, src, (size_t)dim * sizeof *dst);
            s->count[at] = 1;
            s->last[at] = s->sources;
        } else {
            qr_optim_add_delta(dst, dst, src, dim); /* vectorised: the same sums */
            /* A source counts once per id, whatever its duplicates. */
            if (s->last[at] != s->sources) s->count[at]++;
            s->last[at] = s->sources;
        }
    }
    return QR_OK;
}

void row_sum_scale(row_sum *s, float divisor, bool per_row) {
    for (uint64_t i = 0; i < s->n; i++) {
        float d = per_row ? (float)s->count[i] : divisor;
        if (d == 1.0f) continue;
        float *row = s->sum + i * (uint64_t)s->dim;
        for (int64_t k = 0; k < s->dim; k++) row[k] /= d;
    }
}

/* How many ids ahead a push's finds fetch. */
#define FIND_AHEAD 8

/* Each find is three dependent misses (slot, key, row) on a table larger
 * than L2: the slot of the id 2 * FIND_AHEAD on and the key of the one
 * FIND_AHEAD on are fetched while id k is found (the finds were a tenth
 * of a push in `perf`, docs/EMBEDDINGS.md). */
static void prefetch_find(const qr_table *tab, const uint8_t *ids, uint64_t k, uint64_t n) {
    int64_t id;
    if (k + 2 * FIND_AHEAD < n) {
        memcpy(&id, ids + 8 * (k + 2 * FIND_AHEAD), 8);
        qr_table_prefetch_slot(tab, id);
    }
    if (k + FIND_AHEAD < n) {
        memcpy(&id, ids + 8 * (k + FIND_AHEAD), 8);
        qr_table_prefetch_key(tab, id);
    }
}

/* n distinct ids (read with memcpy) and their n x dim rows to table v:
 * each id's row made if absent (or the row dropped, under admission),
 * then the optimizer's row apply, or the rows added (delta). */
static int apply_table(qr_ps *ps, qr_var *v, const uint8_t *ids, const float *grads, uint64_t n,
                       bool delta, int64_t t, float lr) {
    const qr_optim *opt = qr__var_optim(ps, v);
    qr_table *tab = v->table;
    int64_t dim = tab->dim;
    int nslots = tab->nslots;
    float **var_rows = malloc(n * (1 + (uint64_t)nslots) * sizeof *var_rows);
    const float **grad_rows = malloc(n * sizeof *grad_rows);
    int rc = var_rows && grad_rows ? QR_OK
                                   : qr__fail(QR_ENOMEM, "out of memory applying rows of '%s'",
                                              v->name);
    float **slot_rows = var_rows ? var_rows + n : NULL;
    uint64_t added = 0, m = 0; /* m: the rows applied (admission drops some) */
    tab->clock = t;
    for (uint64_t k = 0; k < n && !rc; k++) {
        prefetch_find(tab, ids, k, n);
        int64_t id;
        memcpy(&id, ids + 8 * k, 8);
        bool add;
        int64_t r = qr_table_row_for_update(tab, id, &add);
        if (r == -1) continue; /* not admitted yet: dropped (the table counts it) */
        if (r < 0) {
            rc = QR_ENOMEM;
            break;
        }
        added += add;
        float *row = qr_table_row(tab, (uint64_t)r);
        var_rows[m] = row;
        for (int j = 0; j < nslots; j++) slot_rows[(uint64_t)j * n + m] = row + dim * (1 + j);
        grad_rows[m++] = grads + k * (uint64_t)dim;
    }
    ps->metrics.rows_added += added;
    ps->metrics.rows_pushed += m;
    if (!rc && delta) {
        for (uint64_t k = 0; k < m; k++)
            qr_optim_add_delta(var_rows[k], var_rows[k], grad_rows[k], dim);
    } else if (!rc && m) {
        /* The slots' rows are laid out with a stride of n per slot. */
        if (m < n)
            for (int j = 1; j < nslots; j++)
                memmove(slot_rows + (uint64_t)j * m, slot_rows + (uint64_t)j * n,
                        m * sizeof *slot_rows);
        rc = qr_optim_apply_rows(opt, v->slots, var_rows, slot_rows, grad_rows, (int64_t)m,
                                 dim, lr, t);
    }
    free(var_rows);
    free(grad_rows);
    if (!rc) qr_table_evict_idle(tab);
    return rc;
}

int qr__rows_apply(qr_ps *ps, qr_var *v, row_sum *s, bool delta, int64_t t, float pushed_lr) {
    if (!s->n) return QR_OK; /* no rows: nothing changes, AdamAsync's powers included */
    int64_t dim = s->dim;
    const qr_optim *opt = qr__var_optim(ps, v);
    float lr = pushed_lr >= 0 ? pushed_lr : qr__ps_lr(ps, v, opt, t - 1);
    if (!v->table) {
        int64_t rows = v->n / dim;
        if (delta) return qr_optim_add_delta_rows(v->value->data, rows, dim, s->ids, s->sum,
                                                  (int64_t)s->n);
        return qr_optim_apply_sparse(opt, v->slots, v->value->data, rows, dim, s->ids, s->sum,
                                     (int64_t)s->n, lr, t);
    }
    v->table->clock = t;
    int rc = qr__tier_fault_in(ps, v, s->ids, (int64_t)s->n); /* rows on disk come back */
    if (rc) return rc;
    return apply_table(ps, v, (const uint8_t *)s->ids, s->sum, s->n, delta, t, lr);
}

bool qr__rows_present_distinct(row_marks *m, const qr_table *t, const uint8_t *ids, uint64_t n) {
    if (!n || !t->count) return false;
    uint64_t words = (t->count + 63) / 64, have = m->nbits / 64;
    if (words > have) {
        uint64_t cap = QR_MAX(words, have * 2);
        uint64_t *bits = realloc(m->bits, cap * sizeof *bits);
        if (!bits) return false;
        memset(bits + have, 0, (cap - have) * sizeof *bits);
        m->bits = bits;
        m->nbits = cap * 64;
    }
    int64_t *found = malloc(n * sizeof *found);
    if (!found) return false;
    uint64_t k = 0;
    for (; k < n; k++) {
        prefetch_find(t, ids, k, n);
        int64_t id;
        memcpy(&id, ids + 8 * k, 8);
        int64_t r = qr_idmap_find_from(&t->index, t->keys, id, qr_idmap_home(&t->index, id));
        if (r < 0) break;
        uint64_t *word = &m->bits[(uint64_t)r >> 6], bit = 1ull << (r & 63);
        if (*word & bit) break;
        *word |= bit;
        found[k] = r;
    }
    /* Every other bit of these words was clear: clear them whole. */
    for (uint64_t i = 0; i < k; i++) m->bits[(uint64_t)found[i] >> 6] = 0;
    free(found);
    return k == n;
}

void qr__row_marks_free(row_marks *m) {
    free(m->bits);
    m->bits = NULL;
    m->nbits = 0;
}

int qr__rows_apply_push(qr_ps *ps, qr_var *v, const uint8_t *ids, const float *rows, int64_t n,
                        bool delta, int64_t t, float pushed_lr) {
    if (n <= 0) return QR_OK; /* as qr__rows_apply: nothing changes */
    /* The sum of distinct rows is each row as it came, in the order it
     * came: applied from the payload, the result is the sum path's. */
    /* (Not with a disk tier: its rows come back, and are counted, in
     * qr__tier_fault_in, which the sum path calls.) */
    if (v->table && !v->table->tier &&
        qr__rows_present_distinct(&ps->row_marks, v->table, ids, (uint64_t)n)) {
        const qr_optim *opt = qr__var_optim(ps, v);
        float lr = pushed_lr >= 0 ? pushed_lr : qr__ps_lr(ps, v, opt, t - 1);
        return apply_table(ps, v, ids, rows, (uint64_t)n, delta, t, lr);
    }
    row_sum sum;
    int rc = row_sum_init(&sum, v->shape[v->ndim - 1], (uint64_t)n);
    if (!rc) rc = row_sum_add(&sum, ids, rows, n);
    if (!rc) rc = qr__rows_apply(ps, v, &sum, delta, t, pushed_lr);
    row_sum_free(&sum);
    return rc;
}


/* A sparse item's row indices: in range of a dense variable, or ids of a
 * table placed on this ps. Run on async pushes (push.c) and sync ones
 * (sync.c) before anything is applied. */
int qr__rows_check(const qr_ps *ps, int shard, const push_item *it, char *msg, size_t msgsz) {
    if (it->var->table) {
        /* With one ps every id is placed here: no hash per id to check. */
        for (int64_t k = 0; k < it->nrows && ps->cluster->nps > 1; k++) {
            int64_t id;
            memcpy(&id, it->data + 8 * k, 8);
            int home = qr_place_row(id, ps->cluster->nps);
            if (home != shard) {
                snprintf(msg, msgsz, "%s: PUSH: rows of table '%s': id %lld is placed on ps "
                         "%d, not %s; nothing was applied", ps->name, it->var->name,
                         (long long)id, home, shard == ps->index ? "here" : "its shard here");
                return QR_EINVAL;
            }
        }
        return QR_OK;
    }
    int64_t rows = it->var->n / it->var->shape[it->var->ndim - 1];
    for (int64_t k = 0; k < it->nrows; k++) {
        int64_t row;
        memcpy(&row, it->data + 8 * k, 8);
        if (row < 0 || row >= rows) {
            snprintf(msg, msgsz, "%s: PUSH: sparse gradient of '%s': row index %lld is out of "
                     "range [0, %lld); nothing was applied", ps->name, it->var->name,
                     (long long)row, (long long)rows);
            return QR_EINVAL;
        }
    }
    return QR_OK;
}

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
            for (int64_t d = 0; d < dim; d++) dst[d] += src[d];
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
    qr_table *tab = v->table;
    int nslots = tab->nslots;
    float **var_rows = malloc(s->n * (1 + (uint64_t)nslots) * sizeof *var_rows);
    const float **grad_rows = malloc(s->n * sizeof *grad_rows);
    int rc = var_rows && grad_rows ? QR_OK
                                   : qr__fail(QR_ENOMEM, "out of memory applying rows of '%s'",
                                              v->name);
    float **slot_rows = var_rows ? var_rows + s->n : NULL;
    uint64_t added = 0, m = 0; /* m: the rows applied (admission drops some) */
    tab->clock = t;
    if (!rc) rc = qr__tier_fault_in(ps, v, s->ids, (int64_t)s->n); /* rows on disk come back */
    for (uint64_t k = 0; k < s->n && !rc; k++) {
        bool add;
        int64_t r = qr_table_row_for_update(tab, s->ids[k], &add);
        if (r == -1) continue; /* not admitted yet: dropped (the table counts it) */
        if (r < 0) {
            rc = QR_ENOMEM;
            break;
        }
        added += add;
        float *row = qr_table_row(tab, (uint64_t)r);
        var_rows[m] = row;
        for (int j = 0; j < nslots; j++) slot_rows[(uint64_t)j * s->n + m] = row + dim * (1 + j);
        grad_rows[m++] = s->sum + k * (uint64_t)dim;
    }
    ps->metrics.rows_added += added;
    ps->metrics.rows_pushed += m;
    if (!rc && delta) {
        for (uint64_t k = 0; k < m; k++)
            qr_optim_add_delta(var_rows[k], var_rows[k], grad_rows[k], dim);
    } else if (!rc && m) {
        /* The slots' rows are laid out with a stride of s->n per slot. */
        if (m < s->n)
            for (int j = 1; j < nslots; j++)
                memmove(slot_rows + (uint64_t)j * m, slot_rows + (uint64_t)j * s->n,
                        m * sizeof *slot_rows);
        rc = qr_optim_apply_rows(opt, v->slots, var_rows, slot_rows, grad_rows, (int64_t)m,
                                 dim, lr, t);
    }
    free(var_rows);
    free(grad_rows);
    if (!rc) qr_table_evict_idle(tab);
    return rc;
}

/* A sparse item's row indices: in range of a dense variable, or ids of a
 * table placed on this ps. Run on async pushes (push.c) and sync ones
 * (sync.c) before anything is applied. */
int qr__rows_check(const qr_ps *ps, int shard, const push_item *it, char *msg, size_t msgsz) {
    if (it->var->table) {
        for (int64_t k = 0; k < it->nrows; k++) {
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

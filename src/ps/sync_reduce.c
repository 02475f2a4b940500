/*
 * sync_reduce.c - a synchronous step's reduce and apply on one ps (sync.c
 * decides when, and with which pushes): the members' gradients of each
 * variable summed in member order and the optimizer applied once, in one
 * pass where the variable is dense (qr_optim_reduce_apply_dense), by id
 * where it takes rows (reduce_rows), or averaged and assigned where it is
 * not trainable (a module's buffer).
 *
 * The order is the contract: sources sorted by variable, then by member
 * (worker, then seq, as ps 0 named them), so every ps, and a backup on its
 * copy of a shard, computes the same bits whatever order the pushes came
 * in (docs/SYNC.md; docs/REPLICATION.md, "A sync step with two copies").
 */
#include "ps/ps_internal.h"

#include <stdlib.h>
#include <string.h>

int qr__sync_add_source(ps_sync *s, qr_var *v, int member, const push_item *it) {
    if (s->nsources == s->sources_cap) {
        int cap = QR_MAX(16, 2 * s->sources_cap);
        sync_source *grown = realloc(s->sources, (size_t)cap * sizeof *grown);
        if (!grown) return qr__fail(QR_ENOMEM, "out of memory reducing '%s'", v->name);
        s->sources = grown;
        s->sources_cap = cap;
    }
    s->sources[s->nsources++] = (sync_source){v, member, it};
    return QR_OK;
}

/* By variable, then in member order: the order of the reduce. */
static int cmp_source(const void *a, const void *b) {
    const sync_source *x = a, *y = b;
    if (x->var->id != y->var->id) return x->var->id < y->var->id ? -1 : 1;
    return (x->member > y->member) - (x->member < y->member);
}

/* Sparse rows of one variable (sources src[0..n), in member order) summed
 * by id and scaled: the mean over the step's gradients (a member that did
 * not touch a row counts as zero), per row (TensorFlow's
 * SparseConditionalAccumulator), or the sum; then the sparse apply. */
static int reduce_rows(qr_ps *ps, qr_var *v, const sync_source *src, int n, float divisor,
                       int64_t step) {
    ps_sync *s = &ps->sync;
    row_sum sum;
    uint64_t expected = 0;
    for (int i = 0; i < n; i++) expected += (uint64_t)src[i].it->nrows;
    int rc = row_sum_init(&sum, v->shape[v->ndim - 1], expected);
    for (int i = 0; i < n && !rc; i++) {
        const push_item *it = src[i].it;
        rc = row_sum_add(&sum, it->data, (const float *)(it->data + 8 * it->nrows), it->nrows);
    }
    if (!rc) {
        row_sum_scale(&sum, divisor, s->mean && s->sparse_per_row);
        rc = qr__ckpt_before_apply(ps, v);
    }
    if (!rc && !v->table) rc = qr_var_prepare_write(v);
    if (!rc) rc = qr__rows_apply(ps, v, &sum, false, step + 1, src[0].it->lr);
    row_sum_free(&sum);
    return rc;
}

/* The gradients of a dense variable (dense ones, and any sparse rows
 * scattered into a dense sum), reduced in member order and applied by the
 * dense apply, in one pass: qr_optim_reduce_apply_dense sums a block of
 * the members' gradients in L1 and runs the optimizer on it there, the
 * same bits as a reduce into a buffer and an apply of that buffer, with
 * the pushes' buffers only read.
 *
 * The NaN/Inf check is not in this pass: it ran on each push as it
 * arrived (grad_check.c), and an accepted push holds only finite
 * gradients (a refused one got QR_ENONFINITE and is not pending; with
 * nonfinite=skip the item is not a source). That is the behaviour to keep
 * (the worker learns at its push, and a bad gradient never reaches a
 * quorum), and it is the cheaper place: there the check reads each piece
 * from L2 right after the kernel copied it, in time the ps would spend
 * waiting for the next piece, where here it would be one more pass over
 * the members' gradients while every worker waits: `quorum bench optim`'s
 * sync points time that scan of the members' gradients against the fused
 * pass (check/fused): for 4 x 1M floats on the shared 2-core development
 * machine, ~0.5 of the fused pass for SGD and ~0.3 for Adam, so that moving
 * the check here would give back most of what the fusion saves (the
 * fused pass took 0.70-0.87 of the two passes for SGD and Adam, 4 x 1M
 * and 4 x 4M floats, on a quiet 16-core Xeon). */
static int reduce_dense(qr_ps *ps, qr_var *v, const sync_source *src, int n, float divisor,
                        int64_t step, const float **srcs) {
    bool all_dense = true;
    for (int i = 0; i < n; i++) all_dense &= src[i].it->nrows < 0;
    float *own = NULL;
    int k = n;
    if (all_dense) {
        for (int i = 0; i < n; i++) srcs[i] = (const float *)src[i].it->data;
    } else {
        /* Zeroed: every source is added into it, and rows no member sent
         * stay 0 (the division by the divisor is left to the fused apply). */
        own = qr__aligned_alloc((size_t)v->n * sizeof(float));
        if (!own) return qr__fail(QR_ENOMEM, "out of memory reducing '%s'", v->name);
        int64_t dim = v->shape[v->ndim - 1];
        for (int i = 0; i < n; i++) {
            const push_item *it = src[i].it;
            const float *g = (const float *)(it->data + (it->nrows < 0 ? 0 : 8 * it->nrows));
            if (it->nrows < 0) {
                for (int64_t e = 0; e < v->n; e++) own[e] += g[e];
                continue;
            }
            for (int64_t r = 0; r < it->nrows; r++) {
                int64_t row;
                memcpy(&row, it->data + 8 * r, 8);
                for (int64_t e = 0; e < dim; e++) own[row * dim + e] += g[r * dim + e];
            }
        }
        srcs[0] = own;
        k = 1;
    }
    int rc = qr__ckpt_before_apply(ps, v);
    if (!rc) rc = qr_var_prepare_write(v);
    const qr_optim *opt = qr__var_optim(ps, v);
    if (!rc)
        rc = qr_optim_reduce_apply_dense(opt, v->slots, v->value->data, srcs, k, v->n, divisor,
                                         qr__item_lr(ps, src[0].it, opt, step), step + 1);
    free(own);
    return rc;
}

/* A non-trainable variable's values (sources src[0..n), dense: checked at
 * the header) averaged in member order over the members that pushed one,
 * and assigned: reduced straight into the variable's storage, or into its
 * spare when a pull reply still reads the value (which is then not
 * copied first only to be overwritten). */
static int assign_mean(qr_ps *ps, qr_var *v, const sync_source *src, int n, const float **srcs) {
    for (int i = 0; i < n; i++) srcs[i] = (const float *)src[i].it->data;
    int rc = qr__ckpt_before_apply(ps, v);
    bool to_spare = v->value->refs > 1;
    if (!rc) rc = to_spare ? qr_var_prepare_spare(v) : QR_OK;
    if (rc) return rc;
    qr_optim_reduce(to_spare ? v->spare->data : v->value->data, srcs, n, v->n, (float)n);
    if (to_spare) qr_var_swap_spare(v);
    return QR_OK;
}

/* Reduce the step's gradients of each variable (sources[0..nsources),
 * sorted here) in member order and apply the optimizer once: sparse rows
 * only (a table, or a dense variable every member pushed rows of) by the
 * sparse apply, anything else by the dense one. The primary runs it on its
 * shard, the backup on its copy with the primary's sources as forwarded
 * (qr__sync_apply_copy): the same code on the same inputs. */
int qr__sync_reduce_and_apply(qr_ps *ps, sync_source *sources, int nsources, int64_t step,
                               float divisor) {
    /* A step with nothing for this ps (its members pushed only to others)
     * has no sources, and qsort must not be handed a NULL array. */
    if (nsources > 1) qsort(sources, (size_t)nsources, sizeof *sources, cmp_source);
    const float **srcs = qr__calloc((size_t)QR_MAX(nsources, 1), sizeof *srcs);
    if (!srcs) return QR_ENOMEM;
    int rc = QR_OK;
    for (int i = 0, end; i < nsources && !rc; i = end) {
        qr_var *v = sources[i].var;
        bool all_rows = true;
        for (end = i; end < nsources && sources[end].var == v; end++)
            all_rows &= sources[end].it->nrows >= 0;
        if (v->non_trainable)
            rc = assign_mean(ps, v, sources + i, end - i, srcs);
        else if (v->table || all_rows)
            rc = reduce_rows(ps, v, sources + i, end - i, divisor, step);
        else
            rc = reduce_dense(ps, v, sources + i, end - i, divisor, step, srcs);
        if (!rc && !v->table && !v->non_trainable && ps->average_decay > 0)
            rc = qr_var_update_average(v, ps->average_decay, step + 1);
        if (rc) qr__error_prefix("%s: step %lld, variable '%s': ", ps->name, (long long)step, v->name);
        v->version++;
    }
    free(srcs);
    return rc;
}

/*
 * fused_apply.c - large async SGD pushes applied while they arrive: the
 * gradient's receive buffer becomes the variable's next value.
 *
 * Why. For a large variable the ps's own passes over a push cost as much
 * as moving it: a NaN/Inf scan of the gradient, then an in-place apply
 * that reads the gradient again and reads and writes the variable. At
 * 16 MiB neither fits the caches of this class of machine, and a lone
 * worker waits for all of it. Here each piece of the gradient, as soon as
 * the kernel has copied it in (still in L2), is replaced by the
 * variable's next value, next = var - lr * g, and the finiteness check
 * runs on the values as they are written. When the push is complete and
 * acknowledged the buffer is swapped in as the variable's value and the
 * old value's storage goes back to the receive pool. One pass reading the
 * variable, instead of a scan plus a pass reading the gradient and the
 * variable and writing the variable. Measured with `quorum bench wire`,
 * 1 ps x 1 worker over Unix sockets, 10 to 15 alternating runs of quorum
 * with and without: +12% GB/s at 16 MiB, +13% at 8 MiB, +25% at 64 MiB,
 * no change at 4 MiB and -20% at 2 MiB (there everything stays in L3,
 * and the ordinary order, which acknowledges before applying, overlaps
 * the apply with the worker's next request): hence QR_FUSED_MIN_BYTES.
 *
 * Nothing changes before the whole push is checked: the variable is not
 * written until install, and a push found non-finite, or cut off, just
 * gives its buffer back. The results are bit-identical to the ordinary
 * apply (qr_optim_sgd_into_grad), with the learning rate fixed when the
 * header arrived (the same one unless another push stepped the schedule
 * in between).
 *
 * Concurrency. One push per variable is applied this way at a time (the
 * ps's list of fused items under way names it: qr__fused_of); pushes of the same variable that start
 * meanwhile take the ordinary path. If one of them completes first, it
 * changes the value the fused push has already read from, so the floats
 * computed so far must follow: a dense push's update is applied to them
 * as well (qr__fused_follow: the same SGD step, or the delta), a sparse
 * push's as the difference it made (qr__fused_save before that apply,
 * qr__fused_rebase after: next[i] += value_after[i] - value_before[i]).
 * The result holds both updates, each element as if the two had been
 * applied in one order or the other: async training's usual semantics
 * (TensorFlow's use_locking=False), and exact when the arithmetic is.
 *
 * Not applied this way: optimizers with slots (their state would change
 * before the check), SGD with weight decay, sync pushes (they are reduced
 * first), staleness-scaled learning rates (known only at apply time),
 * sparse gradients.
 */
#include "ps/ps_internal.h"

#include "optim/optim.h"

#include <stdlib.h>
#include <string.h>

/* A dense plain SGD step or delta: it changes nothing but the value, so
 * it can be computed out of place and checked before anything is
 * written, and repeated on another buffer (qr__fused_follow). */
static bool sgd_like(const qr_ps *ps, const push_item *it, bool delta) {
    if (it->nrows >= 0 || it->var->non_trainable) return false; /* a value is assigned */
    if (delta) return true;
    const qr_optim *opt = qr__var_optim(ps, it->var);
    /* weight decay reads the value too: the ordinary apply does it */
    return !strcmp(qr_optim_name(opt), "sgd") && qr_optim_weight_decay(opt) == 0.0f;
}

/* The list is as long as the fused pushes under way, one per connection
 * at most: a few, and usually none. It lives with the ps rather than in
 * the variable because only this file and the apply that must follow
 * ask for it. */
push_item *qr__fused_of(const qr_ps *ps, const qr_var *v) {
    for (push_item *it = ps->fused; it; it = it->next_fused)
        if (it->var == v) return it;
    return NULL;
}

static void unlink_fused(qr_ps *ps, push_item *it) {
    for (push_item **link = &ps->fused; *link; link = &(*link)->next_fused)
        if (*link == it) {
            *link = it->next_fused;
            break;
        }
    it->next_fused = NULL;
    it->fused = false;
}

bool qr__fused_eligible(const qr_ps *ps, const push_item *it, bool delta) {
    const qr_var *v = it->var;
    /* A bf16/fp16 gradient is widened once it is all in, never applied as
     * it arrives. */
    if (qr__fused_of(ps, v) || ps->staleness_lr_scale || it->dtype != QR_FLOAT32) return false;
    /* With a backup (--ps-replicas 2) the gradient itself is forwarded and
     * the push answered after the backup's apply: nothing to gain here. */
    if (qr__replica_on(ps)) return false;
    return (uint64_t)v->n * sizeof(float) >= QR_FUSED_MIN_BYTES && sgd_like(ps, it, delta);
}

bool qr__fused_can_follow(const qr_ps *ps, const push_item *it, bool delta) {
    return sgd_like(ps, it, delta);
}

int qr__fused_begin(qr_ps *ps, push_item *it, bool delta) {
    qr_var *v = it->var;
    it->own = qr__recv_pool_get(&ps->recv_pool, (size_t)v->n * sizeof(float), &it->own_cap);
    if (!it->own) return QR_ENOMEM;
    it->fused = true;
    it->fused_lr = delta ? -1.0f : qr__item_lr(ps, it, qr__var_optim(ps, v), ps->applied_steps);
    it->data = (uint8_t *)it->own;
    it->fused_done = 0;
    it->next_fused = ps->fused;
    ps->fused = it;
    return QR_OK;
}

void qr__fused_advance(push_item *it, int64_t from, int64_t to) {
    qr_var *v = it->var;
    if (!qr_optim_sgd_into_grad(it->own + from, v->value->data + from, to - from, it->fused_lr))
        it->nonfinite = true;
    it->fused_done = to;
}

int qr__fused_prepare(push_item *it) {
    if (it->var->value->refs == 1) return QR_OK;
    /* A pull reply still reads the value: the next one needs a tensor of
     * its own, allocated now so that installing cannot fail. */
    it->shell = qr__calloc(1, sizeof *it->shell);
    return it->shell ? QR_OK : QR_ENOMEM;
}

void qr__fused_install(qr_ps *ps, push_item *it) {
    qr_var *v = it->var;
    size_t bytes = (size_t)v->n * sizeof(float);
    if (v->value->refs > 1) { /* qr__fused_prepare made the shell */
        qr_tensor *t = it->shell;
        it->shell = NULL;
        *t = (qr_tensor){.refs = 1, .n = v->n, .data = it->own};
        it->own = qr_var_replace_value(v, t, &it->own_cap);
    } else {
        float *old = v->value->data;
        v->value->data = it->own;
        it->own = old; /* the old value's storage, for the pool */
        it->own_cap = bytes;
    }
    unlink_fused(ps, it);
}

void qr__fused_end(qr_ps *ps, push_item *it) {
    if (it->fused) unlink_fused(ps, it);
    if (it->own) qr__recv_pool_put(&ps->recv_pool, it->own, it->own_cap);
    free(it->shell);
    it->own = NULL;
    it->shell = NULL;
}

void qr__fused_follow(push_item *fu, const float *g, float lr) {
    float *next = fu->own;
    for (int64_t i = 0; i < fu->fused_done; i++) next[i] -= g[i] * lr;
}

void qr__fused_save(const push_item *fu, float *save) {
    memcpy(save, fu->var->value->data, (size_t)fu->fused_done * sizeof(float));
}

void qr__fused_rebase(push_item *fu, const float *save) {
    float *next = fu->own;
    const float *now = fu->var->value->data;
    for (int64_t i = 0; i < fu->fused_done; i++) next[i] += now[i] - save[i];
}

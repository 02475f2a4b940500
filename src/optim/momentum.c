/*
 * momentum.c - momentum SGD, optionally Nesterov.
 *
 * TF ApplyMomentum (tensorflow/core/kernels/training_ops.cc), slot
 * "momentum" (accum) starting at 0:
 *     accum = accum * momentum + grad
 *     var  -= accum * lr                                   (classic)
 *     var  -= grad * lr + accum * momentum * lr            (use_nesterov)
 * The learning rate multiplies the update, not the accumulator: PyTorch's
 * SGD(momentum, dampening=0) is the same algorithm (buf = m*buf + g;
 * var -= lr*buf, nesterov var -= lr*(g + m*buf)) and agrees while lr is
 * constant; with a changing lr TF's form applies the new lr to the whole
 * history. Sparse: TF SparseApplyMomentum, the same on each touched row.
 * Defaults: lr 0.05 (TF has none), momentum 0.9.
 * weight-decay (torch's SGD weight_decay, default 0): grad is replaced by
 * grad + weight_decay * var before all of the above (optim.c), as torch
 * does before its momentum buffer.
 */
#include "optim/optim_internal.h"

QR_OPTIM_LOOP static void momentum_run(float *restrict var, float *restrict accum, const float *restrict g,
                         int64_t n, float lr, float momentum) {
    for (int64_t i = 0; i < n; i++) {
        accum[i] = accum[i] * momentum + g[i];
        var[i] -= accum[i] * lr;
    }
}

QR_OPTIM_LOOP static void nesterov_run(float *restrict var, float *restrict accum, const float *restrict g,
                         int64_t n, float lr, float momentum) {
    for (int64_t i = 0; i < n; i++) {
        accum[i] = accum[i] * momentum + g[i];
        var[i] -= g[i] * lr + accum[i] * momentum * lr;
    }
}

static void momentum_kernel(const qr_optim_call *c, float *var, float *const *slot,
                            const float *g, int64_t n) {
    if (c->hp->nesterov)
        nesterov_run(var, slot[0], g, n, c->lr, (float)c->hp->momentum);
    else
        momentum_run(var, slot[0], g, n, c->lr, (float)c->hp->momentum);
}

static int momentum_init(qr_optim *opt, const qr_config *cfg) {
    qr_optim_hp *hp = &opt->hp;
    hp->lr = qr__optim_opt_float(cfg, "lr", 0.05);
    hp->momentum = qr__optim_opt_float(cfg, "momentum", 0.9);
    hp->nesterov = qr__config_bool(cfg, "nesterov");
    if (!(hp->momentum >= 0.0 && hp->momentum <= 1.0))
        return qr__fail(QR_EINVAL, "optimizer momentum: option momentum must be in [0, 1], got %g",
                        (double)hp->momentum);
    qr__optim_add_slot(opt, "momentum", false, 0.0f);
    return QR_OK;
}

const qr_optim_ops qr__optim_momentum = {
    .name = "momentum",
    .tf_name = "Momentum",
    .keys = "lr|momentum|nesterov|weight-decay",
    .init = momentum_init,
    .apply_dense = momentum_kernel,
    .apply_sparse_rows = momentum_kernel,
};

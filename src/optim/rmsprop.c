/*
 * rmsprop.c - RMSProp (Hinton's lecture 6e), plain or centered, with
 * momentum, as TensorFlow 1 has it.
 *
 * TF ApplyRMSProp (tensorflow/core/kernels/training_ops.cc), slots "rms"
 * (ms), "momentum" (mom):
 *     ms   += (grad * grad - ms) * (1 - rho)        i.e. rho*ms + (1-rho)*g^2
 *     mom   = mom * momentum + grad * lr / sqrt(ms + epsilon)
 *     var  -= mom
 * TF ApplyCenteredRMSProp adds slot "mg" (mean gradient):
 *     ms   += (grad * grad - ms) * (1 - rho)
 *     mg   += (grad - mg) * (1 - rho)
 *     mom   = mom * momentum + grad * lr / sqrt(ms - mg * mg + epsilon)
 *     var  -= mom
 * Choices, all TF1 (tf.train.RMSPropOptimizer):
 *   - "rms" starts at 1.0 (TF1 ones_initializer); "momentum" and "mg" at 0.
 *     Keras' RMSprop and PyTorch start at 0, which makes the first updates
 *     about lr/sqrt(1-rho) in size.
 *   - epsilon inside the square root (PyTorch adds eps after sqrt).
 *   - lr inside the momentum accumulator (PyTorch multiplies lr outside;
 *     the same while lr is constant).
 * Defaults: lr 0.001, decay (rho) 0.9, momentum 0, epsilon 1e-10.
 * Sparse: TF SparseApplyRMSProp / SparseApplyCenteredRMSProp, the same on
 * each touched row.
 * weight-decay (torch.optim.RMSprop's weight_decay, default 0): grad is
 * replaced by grad + weight_decay * var before all of the above (optim.c).
 */
#include "optim/optim_internal.h"

#include <math.h>

QR_OPTIM_LOOP static void rmsprop_run(float *restrict var, float *restrict ms, float *restrict mom,
                        const float *restrict g, int64_t n, float lr, float one_minus_rho,
                        float momentum, float eps) {
    for (int64_t i = 0; i < n; i++) {
        ms[i] += (g[i] * g[i] - ms[i]) * one_minus_rho;
        mom[i] = mom[i] * momentum + g[i] * lr / sqrtf(ms[i] + eps);
        var[i] -= mom[i];
    }
}

QR_OPTIM_LOOP static void centered_run(float *restrict var, float *restrict ms, float *restrict mom,
                         float *restrict mg, const float *restrict g, int64_t n, float lr,
                         float one_minus_rho, float momentum, float eps) {
    for (int64_t i = 0; i < n; i++) {
        ms[i] += (g[i] * g[i] - ms[i]) * one_minus_rho;
        mg[i] += (g[i] - mg[i]) * one_minus_rho;
        float denom = (ms[i] - mg[i] * mg[i]) + eps;
        mom[i] = mom[i] * momentum + g[i] * lr / sqrtf(denom);
        var[i] -= mom[i];
    }
}

static void rmsprop_kernel(const qr_optim_call *c, float *var, float *const *slot,
                           const float *g, int64_t n) {
    const qr_optim_hp *hp = c->hp;
    const float one_minus_rho = (float)(1.0 - hp->rho);
    if (hp->centered)
        centered_run(var, slot[0], slot[1], slot[2], g, n, c->lr, one_minus_rho,
                     (float)hp->momentum, (float)hp->epsilon);
    else
        rmsprop_run(var, slot[0], slot[1], g, n, c->lr, one_minus_rho, (float)hp->momentum,
                    (float)hp->epsilon);
}

static int rmsprop_init(qr_optim *opt, const qr_config *cfg) {
    qr_optim_hp *hp = &opt->hp;
    hp->lr = qr__optim_opt_float(cfg, "lr", 0.001);
    hp->rho = qr__config_float(cfg, "decay");
    hp->momentum = qr__optim_opt_float(cfg, "momentum", 0.0);
    hp->epsilon = qr__optim_opt_float(cfg, "epsilon", 1e-10);
    hp->centered = qr__config_bool(cfg, "centered");
    if (!(hp->rho >= 0.0f && hp->rho <= 1.0f))
        return qr__fail(QR_EINVAL, "optimizer rmsprop: option decay must be in [0, 1], got %g",
                        (double)hp->rho);
    if (!(hp->momentum >= 0.0f && hp->momentum <= 1.0f))
        return qr__fail(QR_EINVAL, "optimizer rmsprop: option momentum must be in [0, 1], got %g",
                        (double)hp->momentum);
    if (!((float)hp->epsilon > 0.0f && isfinite((float)hp->epsilon)))
        return qr__fail(QR_EINVAL, "optimizer rmsprop: option epsilon must be > 0, got %g",
                        (double)hp->epsilon);
    qr__optim_add_slot(opt, "rms", false, 1.0f);
    qr__optim_add_slot(opt, "momentum", false, 0.0f);
    if (hp->centered) qr__optim_add_slot(opt, "mg", false, 0.0f);
    return QR_OK;
}

const qr_optim_ops qr__optim_rmsprop = {
    .name = "rmsprop",
    .tf_name = "RMSProp",
    .keys = "lr|decay|momentum|epsilon|centered|weight-decay",
    .init = rmsprop_init,
    .apply_dense = rmsprop_kernel,
    .apply_sparse_rows = rmsprop_kernel,
};

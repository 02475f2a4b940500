/*
 * sgd.c - plain stochastic gradient descent.
 *
 * TF ApplyGradientDescent (tensorflow/core/kernels/training_ops.cc):
 *     var -= grad * lr
 * Sparse: the same on each touched row (TF scatter-subtracts lr * grad
 * after summing duplicates). No slots. Default lr 0.05 (TF has none).
 * weight-decay (torch.optim.SGD's weight_decay, default 0): the kernel is
 * handed grad + weight_decay * var (optim.c), i.e.
 *     var -= (grad + weight_decay * var) * lr
 */
#include "optim/optim_internal.h"

#include <string.h>

QR_OPTIM_LOOP static void sgd_run(float *restrict var, const float *restrict g, int64_t n, float lr) {
    for (int64_t i = 0; i < n; i++) var[i] -= g[i] * lr;
}

/* The same expression out of place (optim.h, qr_optim_apply_dense_to):
 * bit-identical to sgd_run. */
QR_OPTIM_LOOP static void sgd_run_to(float *restrict out, const float *restrict var,
                                     const float *restrict g, int64_t n, float lr) {
    for (int64_t i = 0; i < n; i++) out[i] = var[i] - g[i] * lr;
}

/* A ps applying a large push while it arrives (ps/fused_apply.c) turns
 * the gradient's own buffer into the variable's next value, one pass
 * instead of a NaN scan plus an in-place apply. The expression is
 * sgd_run's, so the result is bit-identical to it; lr = -1 gives var + g
 * exactly (a local SGD delta). The magnitude bits of every result are
 * max-reduced as they are written: any NaN or Inf, in the gradient or
 * from an overflow, shows as a value above the largest finite float. */
QR_OPTIM_LOOP bool qr_optim_sgd_into_grad(float *restrict g, const float *restrict var,
                                          int64_t n, float lr) {
    uint32_t top = 0;
    for (int64_t i = 0; i < n; i++) {
        float next = var[i] - g[i] * lr;
        g[i] = next;
        uint32_t bits;
        memcpy(&bits, &next, sizeof bits);
        bits &= 0x7fffffffu;
        top = bits > top ? bits : top;
    }
    return top <= 0x7f7fffffu;
}

/* optim.h: the worker's local SGD step, sgd_run itself. */
void qr_optim_sgd_step(float *var, const float *grad, int64_t n, float lr) {
    sgd_run(var, grad, n, lr);
}

static void sgd_kernel(const qr_optim_call *c, float *var, float *const *slot, const float *g,
                       int64_t n) {
    sgd_run(var, g, n, c->lr);
}

static void sgd_kernel_to(const qr_optim_call *c, float *out, const float *var, const float *g,
                          int64_t n) {
    sgd_run_to(out, var, g, n, c->lr);
}

static int sgd_init(qr_optim *opt, const qr_config *cfg) {
    opt->hp.lr = qr__optim_opt_float(cfg, "lr", 0.05);
    return QR_OK;
}

const qr_optim_ops qr__optim_sgd = {
    .name = "sgd",
    .tf_name = "GradientDescent",
    .keys = "lr|weight-decay",
    .init = sgd_init,
    .apply_dense = sgd_kernel,
    .apply_sparse_rows = sgd_kernel,
    .apply_dense_to = sgd_kernel_to,
};

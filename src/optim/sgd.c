/*
 * sgd.c - plain stochastic gradient descent.
 *
 * TF ApplyGradientDescent (tensorflow/core/kernels/training_ops.cc):
 *     var -= grad * lr
 * Sparse: the same on each touched row (TF scatter-subtracts lr * grad
 * after summing duplicates). No slots. Default lr 0.05 (TF has none).
 */
#include "optim/optim_internal.h"

QR_OPTIM_LOOP static void sgd_run(float *restrict var, const float *restrict g, int64_t n, float lr) {
    for (int64_t i = 0; i < n; i++) var[i] -= g[i] * lr;
}

/* The same expression out of place (optim.h, qr_optim_apply_dense_to):
 * bit-identical to sgd_run. */
QR_OPTIM_LOOP static void sgd_run_to(float *restrict out, const float *restrict var,
                                     const float *restrict g, int64_t n, float lr) {
    for (int64_t i = 0; i < n; i++) out[i] = var[i] - g[i] * lr;
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
    .keys = "lr",
    .init = sgd_init,
    .apply_dense = sgd_kernel,
    .apply_sparse_rows = sgd_kernel,
    .apply_dense_to = sgd_kernel_to,
};

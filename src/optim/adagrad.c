/*
 * adagrad.c - Adagrad (Duchi, Hazan, Singer 2011) as TensorFlow 1 has it.
 *
 * TF ApplyAdagrad (tensorflow/core/kernels/training_ops.cc, update_slots
 * true), slot "accumulator" starting at initial-accumulator (TF1 default
 * 0.1, must be > 0):
 *     accum += grad * grad
 *     var   -= grad * lr / sqrt(accum)
 * Choice: TF1's kernel, no epsilon. TF2's Keras Adagrad divides by
 * sqrt(accum) + epsilon and PyTorch's by sqrt(accum) + eps (with the
 * accumulator starting at 0 by default); the positive initial accumulator
 * is what keeps the division safe here, hence the check. TF multiplies by
 * rsqrt(accum); we divide by sqrt(accum), the same value with one rounding
 * less. Sparse: TF SparseApplyAdagrad, the same on each touched row.
 * weight-decay (torch.optim.Adagrad's weight_decay, default 0): grad is
 * replaced by grad + weight_decay * var before all of the above (optim.c);
 * on a sparse apply for the touched rows only (torch refuses weight_decay
 * with sparse gradients).
 */
#include "optim/optim_internal.h"

#include <math.h>

QR_OPTIM_LOOP static void adagrad_run(float *restrict var, float *restrict accum, const float *restrict g,
                        int64_t n, float lr) {
    for (int64_t i = 0; i < n; i++) {
        accum[i] += g[i] * g[i];
        var[i] -= g[i] * lr / sqrtf(accum[i]);
    }
}

static void adagrad_kernel(const qr_optim_call *c, float *var, float *const *slot,
                           const float *g, int64_t n) {
    adagrad_run(var, slot[0], g, n, c->lr);
}

static int adagrad_init(qr_optim *opt, const qr_config *cfg) {
    qr_optim_hp *hp = &opt->hp;
    hp->lr = qr__optim_opt_float(cfg, "lr", 0.001);
    hp->init_accum = qr__config_float(cfg, "initial-accumulator");
    if (!((float)hp->init_accum > 0.0f && isfinite((float)hp->init_accum)))
        return qr__fail(QR_EINVAL,
                        "optimizer adagrad: option initial-accumulator must be > 0 (TF requires "
                        "it; it keeps grad/sqrt(accum) finite), got %g",
                        (double)hp->init_accum);
    qr__optim_add_slot(opt, "accumulator", false, (float)hp->init_accum);
    return QR_OK;
}

const qr_optim_ops qr__optim_adagrad = {
    .name = "adagrad",
    .tf_name = "Adagrad",
    .keys = "lr|initial-accumulator|weight-decay",
    .init = adagrad_init,
    .apply_dense = adagrad_kernel,
    .apply_sparse_rows = adagrad_kernel,
};

/*
 * adam.c - Adam (Kingma & Ba 2015) as TensorFlow's ApplyAdam, with the
 * bias-correction powers shared by all variables of the ps.
 *
 * TF ApplyAdam (tensorflow/core/kernels/training_ops.cc), slots "m", "v"
 * starting at 0, t = the global step (>= 1):
 *     alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
 *     m    += (grad - m) * (1 - beta1)                i.e. beta1*m + (1-beta1)*g
 *     v    += (grad * grad - v) * (1 - beta2)
 *     var  -= m * alpha / (sqrt(v) + epsilon)
 *     use_nesterov: var -= (grad * (1 - beta1) + m * beta1) * alpha / (sqrt(v) + epsilon)
 * epsilon is TF's "epsilon hat": added after sqrt and not bias-corrected,
 * where PyTorch's Adam adds eps to sqrt(v)/sqrt(1-beta2^t) (the two differ
 * by eps*(1 - sqrt(1-beta2^t)) in the denominator; PyTorch's SparseAdam
 * uses TF's form).
 *
 * alpha is computed in double from the global step and rounded to float.
 * The powers: TF keeps beta1^t and beta2^t in two float variables shared
 * by all variables and advanced once per global step (by the optimizer's
 * finish op). A ps applies pushes of many workers to many variables; it
 * passes the global step t and we compute beta^t in double, once per call,
 * which is the same value without the float rounding TF accumulates over
 * t multiplications. Compare AdamAsync (adam_async.c): powers per variable,
 * advanced per apply, no global step needed.
 *
 * Sparse (choice): lazy Adam, as tf.contrib.opt.LazyAdamOptimizer and
 * PyTorch's SparseAdam: only the touched rows of m, v and var change, with
 * alpha from the global step. TF's plain AdamOptimizer instead decays m and
 * v of every row and moves every row of var on each sparse apply, which
 * costs a dense pass per sparse gradient.
 * Defaults: lr 0.001, beta1 0.9, beta2 0.999, epsilon 1e-8.
 * weight-decay (torch.optim.Adam's weight_decay, L2, default 0): the
 * kernel is handed grad + weight_decay * var (optim.c). For the decoupled
 * form use adamw (adamw.c).
 */
#include "optim/optim_internal.h"

#include <math.h>

/* omb1, omb2: 1 - beta1 and 1 - beta2, rounded to float once. */
QR_OPTIM_LOOP static void adam_run(float *restrict var, float *restrict m, float *restrict v,
                     const float *restrict g, int64_t n, float alpha, float omb1, float omb2,
                     float eps) {
    for (int64_t i = 0; i < n; i++) {
        m[i] += (g[i] - m[i]) * omb1;
        v[i] += (g[i] * g[i] - v[i]) * omb2;
        var[i] -= m[i] * alpha / (sqrtf(v[i]) + eps);
    }
}

QR_OPTIM_LOOP static void adam_nesterov_run(float *restrict var, float *restrict m, float *restrict v,
                              const float *restrict g, int64_t n, float alpha, float beta1,
                              float omb1, float omb2, float eps) {
    for (int64_t i = 0; i < n; i++) {
        m[i] += (g[i] - m[i]) * omb1;
        v[i] += (g[i] * g[i] - v[i]) * omb2;
        var[i] -= (g[i] * omb1 + m[i] * beta1) * alpha / (sqrtf(v[i]) + eps);
    }
}

static void adam_kernel(const qr_optim_call *c, float *var, float *const *slot, const float *g,
                        int64_t n) {
    const qr_optim_hp *hp = c->hp;
    const float omb1 = (float)(1.0 - hp->beta1), omb2 = (float)(1.0 - hp->beta2);
    if (hp->nesterov)
        adam_nesterov_run(var, slot[0], slot[1], g, n, c->alpha, (float)hp->beta1, omb1, omb2,
                          (float)hp->epsilon);
    else
        adam_run(var, slot[0], slot[1], g, n, c->alpha, omb1, omb2, (float)hp->epsilon);
}

int qr__optim_adam_powers(const qr_optim *opt, int64_t global_step, double *beta1_t,
                          double *beta2_t) {
    if (global_step < 1)
        return qr__fail(QR_EINVAL, "optimizer %s: global step %lld must be >= 1 (the first "
                        "apply is step 1)", opt->ops->name, (long long)global_step);
    *beta1_t = pow(opt->hp.beta1, (double)global_step);
    *beta2_t = pow(opt->hp.beta2, (double)global_step);
    return QR_OK;
}

static int adam_begin(const qr_optim *opt, qr_optim_slots *s, int64_t global_step,
                      qr_optim_call *c) {
    double b1p = 0, b2p = 0;
    int rc = qr__optim_adam_powers(opt, global_step, &b1p, &b2p);
    if (rc) return rc;
    c->alpha = (float)((double)c->lr * sqrt(1.0 - b2p) / (1.0 - b1p));
    return QR_OK;
}

/* Shared with adam_async.c: beta1, beta2, epsilon, nesterov, checked. */
int qr__optim_adam_hp(qr_optim *opt, const qr_config *cfg) {
    qr_optim_hp *hp = &opt->hp;
    const char *name = opt->ops->name;
    hp->lr = qr__optim_opt_float(cfg, "lr", 0.001);
    hp->beta1 = qr__config_float(cfg, "beta1");
    hp->beta2 = qr__config_float(cfg, "beta2");
    hp->epsilon = qr__optim_opt_float(cfg, "epsilon", 1e-8);
    hp->nesterov = qr__config_bool(cfg, "nesterov");
    if (!(hp->beta1 >= 0.0 && (float)hp->beta1 < 1.0f))
        return qr__fail(QR_EINVAL, "optimizer %s: option beta1 must be in [0, 1), got %g "
                        "(1 - beta1^t is a divisor)", name, (double)hp->beta1);
    if (!(hp->beta2 >= 0.0 && (float)hp->beta2 < 1.0f))
        return qr__fail(QR_EINVAL, "optimizer %s: option beta2 must be in [0, 1), got %g",
                        name, (double)hp->beta2);
    if (!((float)hp->epsilon > 0.0f && isfinite((float)hp->epsilon)))
        return qr__fail(QR_EINVAL, "optimizer %s: option epsilon must be > 0, got %g", name,
                        (double)hp->epsilon);
    return QR_OK;
}

static int adam_init(qr_optim *opt, const qr_config *cfg) {
    int rc = qr__optim_adam_hp(opt, cfg);
    if (rc) return rc;
    qr__optim_add_slot(opt, "m", false, 0.0f);
    qr__optim_add_slot(opt, "v", false, 0.0f);
    return QR_OK;
}

const qr_optim_ops qr__optim_adam = {
    .name = "adam",
    .tf_name = "Adam",
    .keys = "lr|beta1|beta2|epsilon|nesterov|weight-decay",
    .init = adam_init,
    .apply_dense = adam_kernel,
    .apply_sparse_rows = adam_kernel,
    .begin = adam_begin,
};

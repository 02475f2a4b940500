/*
 * ftrl.c - FTRL-Proximal (McMahan et al., "Ad Click Prediction: a View from
 * the Trenches", KDD 2013) as TensorFlow's ApplyFtrl.
 *
 * TF ApplyFtrl (tensorflow/core/kernels/training_ops.cc, no l2 shrinkage),
 * slots "accum" (start: initial-accumulator, TF default 0.1, >= 0) and
 * "linear" (start 0), p = -lr_power (TF default lr_power -0.5, i.e. p = 1/2):
 *     new_accum = accum + grad * grad
 *     linear   += grad - (new_accum^p - accum^p) / lr * var     (old var)
 *     quadratic = new_accum^p / lr + 2 * l2
 *     var       = |linear| > l1 ? (sign(linear) * l1 - linear) / quadratic : 0
 *     accum     = new_accum
 * McMahan's per-coordinate rate alpha / (beta + sqrt(n)) appears here as
 * lr = alpha and the initial accumulator in place of beta (TF1's
 * FtrlOptimizer has no beta). For lr_power = -0.5 TF uses sqrt, and so do
 * we (that loop vectorises; the general one calls powf per element).
 * lr must be > 0 (it divides). Sparse: TF SparseApplyFtrl, the same on
 * each touched row.
 * weight-decay: refused unless 0 (accepted so that a caller passing
 * torch's default everywhere is not refused). Added to the gradient it
 * would also enter the accumulator, which is not TF's l2 shrinkage; l2 is
 * FTRL's own regularization.
 */
#include "optim/optim_internal.h"

#include <math.h>
#include <string.h>

/* var = |linear| > l1 ? pre_shrink : 0, done on the bit patterns: gcc will
 * not if-convert a float comparison under -ftrapping-math, and an integer
 * compare of |linear|'s bits (a NaN never passes, as in TF) vectorises. */
static inline float ftrl_select(float linear, float pre_shrink, int32_t l1_bits) {
    int32_t lin_bits, pre_bits;
    memcpy(&lin_bits, &linear, sizeof lin_bits);
    memcpy(&pre_bits, &pre_shrink, sizeof pre_bits);
    int32_t abs_bits = lin_bits & 0x7fffffff;
    int32_t keep = -(int32_t)((abs_bits > l1_bits) & (abs_bits <= 0x7f800000));
    int32_t out = pre_bits & keep;
    float r;
    memcpy(&r, &out, sizeof r);
    return r;
}

QR_OPTIM_LOOP static void ftrl_sqrt_run(float *restrict var, float *restrict accum, float *restrict linear,
                          const float *restrict g, int64_t n, float lr, float l1, float l2) {
    const float two_l2 = 2.0f * l2;
    int32_t l1_bits;
    memcpy(&l1_bits, &l1, sizeof l1_bits);
    for (int64_t i = 0; i < n; i++) {
        float new_accum = accum[i] + g[i] * g[i];
        float sqrt_new = sqrtf(new_accum);
        float lin = linear[i] + (g[i] - (sqrt_new - sqrtf(accum[i])) / lr * var[i]);
        float quadratic = sqrt_new / lr + two_l2;
        float pre_shrink = (copysignf(l1, lin) - lin) / quadratic;
        var[i] = ftrl_select(lin, pre_shrink, l1_bits);
        linear[i] = lin;
        accum[i] = new_accum;
    }
}

static void ftrl_pow_run(float *restrict var, float *restrict accum, float *restrict linear,
                         const float *restrict g, int64_t n, float lr, float l1, float l2,
                         float p) {
    const float two_l2 = 2.0f * l2;
    int32_t l1_bits;
    memcpy(&l1_bits, &l1, sizeof l1_bits);
    for (int64_t i = 0; i < n; i++) {
        float new_accum = accum[i] + g[i] * g[i];
        float pow_new = powf(new_accum, p);
        float lin = linear[i] + (g[i] - (pow_new - powf(accum[i], p)) / lr * var[i]);
        float quadratic = pow_new / lr + two_l2;
        float pre_shrink = (copysignf(l1, lin) - lin) / quadratic;
        var[i] = ftrl_select(lin, pre_shrink, l1_bits);
        linear[i] = lin;
        accum[i] = new_accum;
    }
}

static void ftrl_kernel(const qr_optim_call *c, float *var, float *const *slot, const float *g,
                        int64_t n) {
    const qr_optim_hp *hp = c->hp;
    if (hp->lr_power == -0.5)
        ftrl_sqrt_run(var, slot[0], slot[1], g, n, c->lr, (float)hp->l1, (float)hp->l2);
    else
        ftrl_pow_run(var, slot[0], slot[1], g, n, c->lr, (float)hp->l1, (float)hp->l2,
                     (float)-hp->lr_power);
}

static int ftrl_begin(const qr_optim *opt, qr_optim_slots *s, int64_t global_step,
                      qr_optim_call *c) {
    if (!(c->lr > 0.0f))
        return qr__fail(QR_EINVAL, "optimizer ftrl: learning rate must be > 0, got %g",
                        (double)c->lr);
    return QR_OK;
}

static int ftrl_init(qr_optim *opt, const qr_config *cfg) {
    qr_optim_hp *hp = &opt->hp;
    hp->lr = qr__optim_opt_float(cfg, "lr", 0.001);
    hp->lr_power = qr__config_float(cfg, "lr-power");
    hp->init_accum = qr__config_float(cfg, "initial-accumulator");
    hp->l1 = qr__config_float(cfg, "l1");
    hp->l2 = qr__config_float(cfg, "l2");
    if (!(hp->lr_power <= 0.0f) || !isfinite((float)hp->lr_power))
        return qr__fail(QR_EINVAL, "optimizer ftrl: option lr-power %g must be <= 0",
                        (double)hp->lr_power);
    if (!(hp->init_accum >= 0.0f) || !isfinite((float)hp->init_accum))
        return qr__fail(QR_EINVAL, "optimizer ftrl: option initial-accumulator %g must be >= 0",
                        (double)hp->init_accum);
    if (!(hp->l1 >= 0.0f) || !isfinite((float)hp->l1))
        return qr__fail(QR_EINVAL, "optimizer ftrl: option l1 %g must be >= 0", (double)hp->l1);
    if (!(hp->l2 >= 0.0f) || !isfinite((float)hp->l2))
        return qr__fail(QR_EINVAL, "optimizer ftrl: option l2 %g must be >= 0", (double)hp->l2);
    if (hp->weight_decay != 0.0)
        return qr__fail(QR_EINVAL, "optimizer ftrl: option weight-decay %g is not supported "
                        "(FTRL has its own l2 regularization: use l2); only 0 is accepted",
                        hp->weight_decay);
    qr__optim_add_slot(opt, "accum", false, (float)hp->init_accum);
    qr__optim_add_slot(opt, "linear", false, 0.0f);
    return QR_OK;
}

const qr_optim_ops qr__optim_ftrl = {
    .name = "ftrl",
    .tf_name = "Ftrl",
    .keys = "lr|lr-power|initial-accumulator|l1|l2|weight-decay",
    .init = ftrl_init,
    .apply_dense = ftrl_kernel,
    .apply_sparse_rows = ftrl_kernel,
    .begin = ftrl_begin,
};

/*
 * adam_async.c - AdamAsync (Alibaba DeepRec): Adam whose bias-correction
 * powers are slots of each variable, so asynchronous applies to different
 * variables share no state (docs/OPTIMIZERS.md, "Adam and AdamAsync").
 *
 * DeepRec ApplyAdamAsync (tensorflow/core/kernels/training_ali_ops.cc),
 * slots "m", "v" (per element, start 0), "beta1_power", "beta2_power"
 * (one float each, start at beta1 and beta2):
 *     alpha = lr * sqrt(1 - beta2_power) / (1 - beta1_power)    (powers read first)
 *     m     = m * beta1 + grad * (1 - beta1)
 *     v     = v * beta2 + grad * grad * (1 - beta2)
 *     var  -= m * alpha / (sqrt(v) + epsilon)
 *     nesterov: var -= (grad * (1 - beta1) + beta1 * m) * alpha / (sqrt(v) + epsilon)
 *     beta1_power *= beta1 ; beta2_power *= beta2                (once per apply call)
 * Element math in float like DeepRec (T = float); the powers are float
 * slots multiplied in float as in DeepRec; alpha is computed from them in
 * double and rounded once.
 *
 * Difference with Adam (adam.c): Adam takes t from the ps's global step,
 * shared by every variable, so a variable applied rarely still gets the
 * late-step alpha; here t counts this variable's own applies. With one
 * apply per step and variable the two agree up to float rounding of the
 * powers.
 *
 * DeepRec SparseApplyAdamAsync: lazy, only the touched rows of m, v, var
 * change, with the same formulas (nesterov too here; DeepRec's sparse
 * kernel has no nesterov), and the powers still advance once per call.
 * A call with no rows changes nothing, powers included.
 * apply-sparse-rmsprop (off by default): sparse applies become TF's
 * RMSProp with rho = beta2, momentum = beta1, epsilon inside the root, the
 * powers untouched; dense applies of the same optimizer stay Adam:
 *     v    = v * beta2 + grad * grad * (1 - beta2)
 *     m    = m * beta1 + lr * grad / sqrt(v + epsilon)
 *     var -= m
 * (DeepRec writes rsqrt(v + eps) * lr * grad; we divide, one rounding less.)
 * weight-decay (default 0, DeepRec has none): as Adam's, L2 added to the
 * gradient, grad + weight_decay * var, before all of the above (optim.c).
 */
#include "optim/optim_internal.h"

#include <math.h>

/* omb1, omb2: 1 - beta1 and 1 - beta2, rounded to float once. */
QR_OPTIM_LOOP static void adam_async_run(float *restrict var, float *restrict m, float *restrict v,
                           const float *restrict g, int64_t n, float alpha, float beta1,
                           float beta2, float omb1, float omb2, float eps) {
    for (int64_t i = 0; i < n; i++) {
        m[i] = m[i] * beta1 + g[i] * omb1;
        v[i] = v[i] * beta2 + g[i] * g[i] * omb2;
        var[i] -= m[i] * alpha / (sqrtf(v[i]) + eps);
    }
}

QR_OPTIM_LOOP static void adam_async_nesterov_run(float *restrict var, float *restrict m, float *restrict v,
                                    const float *restrict g, int64_t n, float alpha, float beta1,
                                    float beta2, float omb1, float omb2, float eps) {
    for (int64_t i = 0; i < n; i++) {
        m[i] = m[i] * beta1 + g[i] * omb1;
        v[i] = v[i] * beta2 + g[i] * g[i] * omb2;
        var[i] -= (g[i] * omb1 + beta1 * m[i]) * alpha / (sqrtf(v[i]) + eps);
    }
}

QR_OPTIM_LOOP static void sparse_rmsprop_run(float *restrict var, float *restrict m, float *restrict v,
                               const float *restrict g, int64_t n, float lr, float beta1,
                               float beta2, float omb2, float eps) {
    for (int64_t i = 0; i < n; i++) {
        v[i] = v[i] * beta2 + g[i] * g[i] * omb2;
        m[i] = m[i] * beta1 + lr * g[i] / sqrtf(v[i] + eps);
        var[i] -= m[i];
    }
}

static void adam_async_dense(const qr_optim_call *c, float *var, float *const *slot,
                             const float *g, int64_t n) {
    const qr_optim_hp *hp = c->hp;
    const float b1 = (float)hp->beta1, b2 = (float)hp->beta2, eps = (float)hp->epsilon;
    const float omb1 = (float)(1.0 - hp->beta1), omb2 = (float)(1.0 - hp->beta2);
    if (hp->nesterov)
        adam_async_nesterov_run(var, slot[0], slot[1], g, n, c->alpha, b1, b2, omb1, omb2, eps);
    else
        adam_async_run(var, slot[0], slot[1], g, n, c->alpha, b1, b2, omb1, omb2, eps);
}

static void adam_async_rows(const qr_optim_call *c, float *var, float *const *slot,
                            const float *g, int64_t n) {
    const qr_optim_hp *hp = c->hp;
    if (hp->sparse_rmsprop)
        sparse_rmsprop_run(var, slot[0], slot[1], g, n, c->lr, (float)hp->beta1,
                           (float)hp->beta2, (float)(1.0 - hp->beta2), (float)hp->epsilon);
    else
        adam_async_dense(c, var, slot, g, n);
}

/* Slots 2 and 3 are the per-variable powers. */
static int adam_async_begin(const qr_optim *opt, qr_optim_slots *s, int64_t global_step,
                            qr_optim_call *c) {
    const double beta1_power = s->data[2][0], beta2_power = s->data[3][0];
    c->alpha = (float)((double)c->lr * sqrt(1.0 - beta2_power) / (1.0 - beta1_power));
    return QR_OK;
}

static void adam_async_end(const qr_optim *opt, qr_optim_slots *s, const qr_optim_call *c) {
    if (c->sparse && c->hp->sparse_rmsprop) return; /* RMSProp leaves the powers alone */
    s->data[2][0] *= (float)c->hp->beta1;
    s->data[3][0] *= (float)c->hp->beta2;
}

static int adam_async_init(qr_optim *opt, const qr_config *cfg) {
    int rc = qr__optim_adam_hp(opt, cfg);
    if (rc) return rc;
    opt->hp.sparse_rmsprop = qr__config_bool(cfg, "apply-sparse-rmsprop");
    qr__optim_add_slot(opt, "m", false, 0.0f);
    qr__optim_add_slot(opt, "v", false, 0.0f);
    qr__optim_add_slot(opt, "beta1_power", true, (float)opt->hp.beta1);
    qr__optim_add_slot(opt, "beta2_power", true, (float)opt->hp.beta2);
    return QR_OK;
}

const qr_optim_ops qr__optim_adam_async = {
    .name = "adam_async",
    .tf_name = "AdamAsync",
    .keys = "lr|beta1|beta2|epsilon|nesterov|apply-sparse-rmsprop|weight-decay",
    .init = adam_async_init,
    .apply_dense = adam_async_dense,
    .apply_sparse_rows = adam_async_rows,
    .begin = adam_async_begin,
    .end = adam_async_end,
};

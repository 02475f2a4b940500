/*
 * adamw.c - AdamW (Loshchilov & Hutter, "Decoupled Weight Decay
 * Regularization", ICLR 2019) exactly as torch.optim.AdamW computes it.
 *
 * torch.optim.AdamW (torch/optim/adam.py, _single_tensor_adam with
 * decoupled_weight_decay, amsgrad off), slots "m" (torch's exp_avg) and
 * "v" (exp_avg_sq) starting at 0, t = the ps's global step (>= 1), the
 * same t as Adam's (adam.c):
 *     var     *= 1 - lr * weight_decay                 decoupled decay, first
 *     m        = beta1 * m + (1 - beta1) * g           torch: exp_avg.lerp_(g, 1 - beta1)
 *     v        = beta2 * v + (1 - beta2) * g^2
 *     bias_c1  = 1 - beta1^t
 *     bias_c2  = 1 - beta2^t
 *     var     -= (lr / bias_c1) * m / (sqrt(v) / sqrt(bias_c2) + eps)
 * Unlike adam.c (TF's ApplyAdam, "epsilon hat" added to sqrt(v)), eps is
 * added to the bias-corrected sqrt(v) / sqrt(bias_c2), as torch does: the
 * two differ by eps * (1 - sqrt(bias_c2)) in the denominator, which
 * matters early and for small v.
 *
 * Rounding as torch's: lr / bias_c1, sqrt(bias_c2) and 1 - lr * weight_decay
 * are computed in double once per call and rounded to float; the element
 * math is float, with the same operations in the same order (torch may
 * fuse a multiply-add where we round twice: ~1 ulp).
 *
 * Sparse (choice, documented in docs/OPTIMIZERS.md): lazy, as Adam's
 * sparse apply and torch's SparseAdam: only the touched rows of var, m and
 * v change, and only they are decayed; t is still the global step.
 * torch.optim.AdamW with a sparse gradient is refused by torch.
 * Defaults: lr 0.001, beta1 0.9, beta2 0.999, epsilon 1e-8 and
 * weight-decay 0.01 when unset (torch's; the option's global default is 0,
 * the other optimizers' coupled L2). amsgrad, maximize: not options here.
 */
#include "optim/optim_internal.h"

#include <math.h>

/* keep = 1 - lr * weight_decay; step = lr / bias_c1; omb1, omb2:
 * 1 - beta1 and 1 - beta2, each rounded to float once. */
QR_OPTIM_LOOP static void adamw_run(float *restrict var, float *restrict m, float *restrict v,
                                    const float *restrict g, int64_t n, float keep,
                                    float step, float beta2, float omb1, float omb2,
                                    float bias_c2_sqrt, float eps) {
    for (int64_t i = 0; i < n; i++) {
        float w = var[i] * keep;                    /* var *= 1 - lr*wd         */
        m[i] += (g[i] - m[i]) * omb1;               /* m = b1*m + (1-b1)*g      */
        v[i] = v[i] * beta2 + omb2 * g[i] * g[i];   /* v = b2*v + (1-b2)*g^2    */
        float denom = sqrtf(v[i]) / bias_c2_sqrt + eps; /* sqrt(v)/sqrt(bc2) + eps */
        var[i] = w - step * m[i] / denom;           /* var -= lr/bc1 * m/denom  */
    }
}

static void adamw_kernel(const qr_optim_call *c, float *var, float *const *slot, const float *g,
                         int64_t n) {
    const qr_optim_hp *hp = c->hp;
    adamw_run(var, slot[0], slot[1], g, n, c->keep, c->alpha, (float)hp->beta2,
              (float)(1.0 - hp->beta1), (float)(1.0 - hp->beta2), c->bias_c2_sqrt,
              (float)hp->epsilon);
}

/* The per-call constants, from this call's lr and the global step t. */
static int adamw_begin(const qr_optim *opt, qr_optim_slots *s, int64_t global_step,
                       qr_optim_call *c) {
    double beta1_t = 0, beta2_t = 0;
    int rc = qr__optim_adam_powers(opt, global_step, &beta1_t, &beta2_t);
    if (rc) return rc;
    c->alpha = (float)((double)c->lr / (1.0 - beta1_t));
    c->bias_c2_sqrt = (float)sqrt(1.0 - beta2_t);
    c->keep = (float)(1.0 - (double)c->lr * c->hp->weight_decay);
    return QR_OK;
}

static int adamw_init(qr_optim *opt, const qr_config *cfg) {
    int rc = qr__optim_adam_hp(opt, cfg);
    if (rc) return rc;
    opt->hp.weight_decay = qr__optim_opt_float(cfg, "weight-decay", 0.01);
    qr__optim_add_slot(opt, "m", false, 0.0f);
    qr__optim_add_slot(opt, "v", false, 0.0f);
    return QR_OK;
}

const qr_optim_ops qr__optim_adamw = {
    .name = "adamw",
    .tf_name = "AdamW",
    .keys = "lr|beta1|beta2|epsilon|weight-decay",
    .decoupled_decay = true,
    .init = adamw_init,
    .apply_dense = adamw_kernel,
    .apply_sparse_rows = adamw_kernel,
    .begin = adamw_begin,
};

/*
 * test_optim_hand.c - one or two optimizer steps on one or two numbers,
 * each expected value worked out by hand in the comment above it, so a
 * reader can check the formulas (and this code) with a calculator.
 * The long random runs against PyTorch and independent formulas are in
 * tests/optim_ref/check_optim.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "optim/optim.h"

/* |got - want| <= 2e-6 * max(|want|, 1e-3): float32 rounding of a few ops. */
#define NEAR(got, want)                                                              \
    do {                                                                             \
        double g_ = (got), w_ = (want);                                              \
        double tol_ = 2e-6 * fmax(fabs(w_), 1e-3);                                   \
        if (fabs(g_ - w_) > tol_) fail_msg("%s = %.9g, want %.9g", #got, g_, w_);    \
    } while (0)

/* Build an optimizer from "key=value" pairs, NULL-terminated. */
static qr_optim *make(const char *kv, ...) {
    qr_config *cfg;
    assert_int_equal(qr_config_new(&cfg), QR_OK);
    va_list ap;
    va_start(ap, kv);
    for (const char *p = kv; p; p = va_arg(ap, const char *)) {
        char key[64];
        const char *eq = strchr(p, '=');
        assert_non_null(eq);
        snprintf(key, sizeof key, "%.*s", (int)(eq - p), p);
        if (qr_config_set(cfg, key, eq + 1)) fail_msg("%s: %s", p, qr_last_error());
    }
    va_end(ap);
    qr_optim *opt;
    if (qr_optim_create(&opt, cfg)) fail_msg("create: %s", qr_last_error());
    qr_config_free(cfg);
    return opt;
}

static float *slot_data(qr_optim_slots *s, const char *want) {
    for (int i = 0; i < qr_optim_slots_count(s); i++) {
        const char *name;
        float *data;
        assert_int_equal(qr_optim_slot(s, i, &name, &data, NULL), QR_OK);
        if (!strcmp(name, want)) return data;
    }
    fail_msg("no slot %s", want);
    return NULL;
}

/* SGD, lr 0.1: var = [1, -2], g = [0.5, -1]
 *   var = [1 - 0.1*0.5, -2 - 0.1*(-1)] = [0.95, -1.9] */
static void test_sgd(void **state) {
    qr_optim *opt = make("optimizer=sgd", "lr=0.1", NULL);
    qr_optim_slots *s;
    assert_int_equal(qr_optim_slots_create(opt, 1, 2, &s), QR_OK);
    assert_int_equal(qr_optim_slots_count(s), 0);
    float var[2] = {1, -2}, g[2] = {0.5f, -1};
    assert_int_equal(qr_optim_apply_dense(opt, s, var, g, 2, -1, 1), QR_OK);
    NEAR(var[0], 0.95);
    NEAR(var[1], -1.9);
    /* A per-variable lr of 1 overrides the optimizer's: -1.9 - 1*(-1) = -0.9 */
    assert_int_equal(qr_optim_apply_dense(opt, s, var, g, 2, 1.0f, 2), QR_OK);
    NEAR(var[1], -0.9);
    qr_optim_slots_free(s);
    qr_optim_free(opt);
}

/* Momentum, lr 0.1, momentum 0.9, var = 1, g = 0.5 twice:
 *   step 1: accum = 0.9*0 + 0.5 = 0.5;      var = 1 - 0.1*0.5 = 0.95
 *   step 2: accum = 0.9*0.5 + 0.5 = 0.95;   var = 0.95 - 0.1*0.95 = 0.855
 * Nesterov (var -= lr*g + lr*momentum*accum):
 *   step 1: accum = 0.5;  var = 1 - (0.05 + 0.1*0.9*0.5) = 1 - 0.095 = 0.905
 *   step 2: accum = 0.95; var = 0.905 - (0.05 + 0.1*0.9*0.95) = 0.905 - 0.1355 = 0.7695 */
static void test_momentum(void **state) {
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        qr_optim *opt = make("optimizer=momentum", "lr=0.1", "momentum=0.9",
                             nesterov ? "nesterov=true" : "nesterov=false", NULL);
        qr_optim_slots *s;
        assert_int_equal(qr_optim_slots_create(opt, 1, 1, &s), QR_OK);
        float var = 1, g = 0.5f;
        assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 1), QR_OK);
        NEAR(slot_data(s, "momentum")[0], 0.5);
        NEAR(var, nesterov ? 0.905 : 0.95);
        assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 2), QR_OK);
        NEAR(slot_data(s, "momentum")[0], 0.95);
        NEAR(var, nesterov ? 0.7695 : 0.855);
        qr_optim_slots_free(s);
        qr_optim_free(opt);
    }
}

/* Adagrad (TF1, no epsilon), lr 0.1, initial accumulator 0.16, var = 1:
 *   g = 0.3: accum = 0.16 + 0.09 = 0.25;  var = 1 - 0.1*0.3/sqrt(0.25) = 1 - 0.06 = 0.94
 *   g = 1.2: accum = 0.25 + 1.44 = 1.69;  var = 0.94 - 0.1*1.2/1.3 = 0.847692308 */
static void test_adagrad(void **state) {
    qr_optim *opt = make("optimizer=adagrad", "lr=0.1", "initial-accumulator=0.16", NULL);
    qr_optim_slots *s;
    assert_int_equal(qr_optim_slots_create(opt, 1, 1, &s), QR_OK);
    NEAR(slot_data(s, "accumulator")[0], 0.16);
    float var = 1, g = 0.3f;
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 1), QR_OK);
    NEAR(slot_data(s, "accumulator")[0], 0.25);
    NEAR(var, 0.94);
    g = 1.2f;
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 2), QR_OK);
    NEAR(slot_data(s, "accumulator")[0], 1.69);
    NEAR(var, 0.847692308);
    qr_optim_slots_free(s);
    qr_optim_free(opt);
}

/* RMSProp (TF1: rms starts at 1), lr 0.01, decay 0.9, epsilon 1e-10, var = 1, g = 2:
 *   step 1: ms = 1 + (4 - 1)*0.1 = 1.3
 *           mom = 0*mom + 0.01*2/sqrt(1.3) = 0.02/1.140175425 = 0.0175411604
 *           var = 1 - 0.0175411604 = 0.9824588396
 * with momentum 0.5, step 2 (g = 2 again):
 *           ms = 1.3 + (4 - 1.3)*0.1 = 1.57
 *           mom = 0.5*0.0175411604 + 0.02/sqrt(1.57) = 0.0087705802 + 0.0159617377 = 0.0247323179
 *           var = 0.9824588396 - 0.0247323179 = 0.9577265217
 * centered, step 1: ms = 1.3, mg = 0 + (2 - 0)*0.1 = 0.2
 *           mom = 0.02/sqrt(1.3 - 0.2^2 + 1e-10) = 0.02/sqrt(1.26) = 0.0178174161
 *           var = 0.9821825839 */
static void test_rmsprop(void **state) {
    qr_optim *opt = make("optimizer=rmsprop", "lr=0.01", "decay=0.9", "momentum=0.5", NULL);
    qr_optim_slots *s;
    assert_int_equal(qr_optim_slots_create(opt, 1, 1, &s), QR_OK);
    assert_int_equal(qr_optim_slots_count(s), 2);
    NEAR(slot_data(s, "rms")[0], 1.0);
    float var = 1, g = 2;
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 1), QR_OK);
    NEAR(slot_data(s, "rms")[0], 1.3);
    NEAR(slot_data(s, "momentum")[0], 0.0175411604);
    NEAR(var, 0.9824588396);
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 2), QR_OK);
    NEAR(slot_data(s, "rms")[0], 1.57);
    NEAR(slot_data(s, "momentum")[0], 0.0247323179);
    NEAR(var, 0.9577265217);
    qr_optim_slots_free(s);
    qr_optim_free(opt);

    opt = make("optimizer=rmsprop", "lr=0.01", "centered=true", NULL);
    assert_int_equal(qr_optim_slots_create(opt, 1, 1, &s), QR_OK);
    assert_int_equal(qr_optim_slots_count(s), 3);
    var = 1;
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 1), QR_OK);
    NEAR(slot_data(s, "mg")[0], 0.2);
    NEAR(var, 0.9821825839);
    qr_optim_slots_free(s);
    qr_optim_free(opt);
}

/* Adam, lr 0.001, beta1 0.9, beta2 0.999, eps 1e-8, var = 1, g = 0.5, t = 1:
 *   m = 0.1*0.5 = 0.05, v = 0.001*0.25 = 0.00025
 *   alpha = 0.001*sqrt(1 - 0.999)/(1 - 0.9) = 0.001*0.0316227766/0.1 = 0.000316227766
 *   var -= 0.05*0.000316227766/(sqrt(0.00025) + 1e-8) = 0.05*0.000316227766/0.0158113983
 *        = 0.000999999368   ->  var = 0.999000000632 (the first Adam step is ~lr)
 * With a constant gradient every step is ~lr (m/(1-beta1^t) = g, v/(1-beta2^t) = g^2):
 *   t = 2: m = 0.095, v = 0.00049975, alpha = 0.001*sqrt(0.001999)/0.19,
 *          var = 0.999 - 0.001 = 0.998.
 * The global step, not the number of applies, sets alpha: a first apply
 * at t = 2 has m = 0.05, v = 0.00025 and
 *   var -= 0.05 * (0.001*sqrt(0.001999)/0.19) / 0.0158113983 = 0.000744136 */
static void test_adam(void **state) {
    qr_optim *opt = make("optimizer=adam", NULL);
    qr_optim_slots *s;
    assert_int_equal(qr_optim_slots_create(opt, 1, 1, &s), QR_OK);
    float var = 1, g = 0.5f;
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 1), QR_OK);
    NEAR(slot_data(s, "m")[0], 0.05);
    NEAR(slot_data(s, "v")[0], 0.00025);
    NEAR(var, 0.999000000632);
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 2), QR_OK);
    NEAR(slot_data(s, "m")[0], 0.095);
    NEAR(slot_data(s, "v")[0], 0.00049975);
    NEAR(var, 0.998);
    /* t must be >= 1 */
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 0), QR_EINVAL);
    qr_optim_slots_free(s);

    assert_int_equal(qr_optim_slots_create(opt, 1, 1, &s), QR_OK);
    var = 1;
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 2), QR_OK);
    NEAR(var, 1.0 - 0.000744136);
    qr_optim_slots_free(s);
    qr_optim_free(opt);
}

/* AdamAsync: the same first step as Adam (powers start at beta1, beta2),
 * then the variable's own powers advance: beta1_power = 0.81,
 * beta2_power = 0.998001. The global step argument is ignored.
 * A sparse apply with no rows changes nothing, powers included.
 * apply-sparse-rmsprop, lr 0.01, one sparse row, var = 1, g = 2:
 *   v = 0.999*0 + 0.001*4 = 0.004
 *   m = 0.9*0 + 0.01*2/sqrt(0.004 + 1e-8) = 0.02/0.0632456345 = 0.316227371
 *   var = 1 - 0.316227371 = 0.683772629; powers unchanged. */
static void test_adam_async(void **state) {
    qr_optim *opt = make("optimizer=adam_async", NULL);
    qr_optim_slots *s;
    assert_int_equal(qr_optim_slots_create(opt, 1, 1, &s), QR_OK);
    assert_int_equal(qr_optim_slots_count(s), 4);
    NEAR(slot_data(s, "beta1_power")[0], 0.9);
    NEAR(slot_data(s, "beta2_power")[0], 0.999);
    float var = 1, g = 0.5f;
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 12345), QR_OK);
    NEAR(var, 0.999000000632);
    NEAR(slot_data(s, "beta1_power")[0], 0.81);
    NEAR(slot_data(s, "beta2_power")[0], 0.998001);
    int64_t idx = 0;
    assert_int_equal(qr_optim_apply_sparse(opt, s, &var, 1, 1, &idx, &g, 0, -1, 0), QR_OK);
    NEAR(var, 0.999000000632);
    NEAR(slot_data(s, "beta1_power")[0], 0.81);
    /* one sparse row: the second Adam step of a constant gradient, ~lr */
    assert_int_equal(qr_optim_apply_sparse(opt, s, &var, 1, 1, &idx, &g, 1, -1, 0), QR_OK);
    NEAR(var, 0.998);
    NEAR(slot_data(s, "beta1_power")[0], 0.729);
    qr_optim_slots_free(s);
    qr_optim_free(opt);

    opt = make("optimizer=adam_async", "lr=0.01", "apply-sparse-rmsprop=true", NULL);
    assert_int_equal(qr_optim_slots_create(opt, 1, 1, &s), QR_OK);
    var = 1;
    g = 2;
    assert_int_equal(qr_optim_apply_sparse(opt, s, &var, 1, 1, &idx, &g, 1, -1, 1), QR_OK);
    NEAR(slot_data(s, "v")[0], 0.004);
    NEAR(slot_data(s, "m")[0], 0.316227371);
    NEAR(var, 0.683772629);
    NEAR(slot_data(s, "beta1_power")[0], 0.9);
    NEAR(slot_data(s, "beta2_power")[0], 0.999);
    /* a dense apply of the same optimizer is still Adam and advances them */
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 1), QR_OK);
    NEAR(slot_data(s, "beta1_power")[0], 0.81);
    qr_optim_slots_free(s);
    qr_optim_free(opt);
}

/* AdamW (torch.optim.AdamW), lr 0.1, weight-decay 0.5, beta1 0.9,
 * beta2 0.999, eps 1e-8, var = 1, g = 0.5:
 *   t = 1: var = 1 * (1 - 0.1*0.5) = 0.95                      decay first
 *          m = 0.1*0.5 = 0.05, v = 0.001*0.25 = 0.00025
 *          bias_c1 = 0.1, bias_c2 = 0.001
 *          sqrt(v)/sqrt(bias_c2) = 0.0158113883/0.0316227766 = 0.5
 *          var = 0.95 - (0.1/0.1) * 0.05/(0.5 + 1e-8) = 0.95 - 0.099999998 = 0.850000002
 *   t = 2: var = 0.850000002 * 0.95 = 0.807500002
 *          m = 0.9*0.05 + 0.05 = 0.095, v = 0.999*0.00025 + 0.00025 = 0.00049975
 *          bias_c1 = 0.19, bias_c2 = 0.001999: m/bias_c1 = 0.5, v/bias_c2 = 0.25
 *          var = 0.807500002 - 0.1 * 0.5/(0.5 + 1e-8) = 0.707500004
 * (Without the decay it would be 0.8: each step of a constant gradient is
 * lr.) The same as a sparse apply, lazy: on a (2, 1) variable [1, 1] with
 * row 1 touched at t = 1, row 1 becomes 0.850000002 and row 0 stays 1,
 * undecayed. A first apply at global step 3 uses t = 3 (bias_c1 = 0.271,
 * bias_c2 = 0.002997001):
 *   var = 0.95 - (0.1/0.271) * 0.05/(0.0158113883/0.0547448718 + 1e-8)
 *       = 0.95 - 0.369003690 * 0.05/0.288820 = 0.95 - 0.0638814 = 0.886118642 */
static void test_adamw(void **state) {
    qr_optim *opt = make("optimizer=adamw", "lr=0.1", "weight-decay=0.5", NULL);
    qr_optim_slots *s;
    assert_int_equal(qr_optim_slots_create(opt, 1, 1, &s), QR_OK);
    float var = 1, g = 0.5f;
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 1), QR_OK);
    NEAR(slot_data(s, "m")[0], 0.05);
    NEAR(slot_data(s, "v")[0], 0.00025);
    NEAR(var, 0.850000002);
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 2), QR_OK);
    NEAR(slot_data(s, "m")[0], 0.095);
    NEAR(slot_data(s, "v")[0], 0.00049975);
    NEAR(var, 0.707500004);
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 0), QR_EINVAL);
    qr_optim_slots_free(s);

    assert_int_equal(qr_optim_slots_create(opt, 2, 1, &s), QR_OK);
    float rows[2] = {1, 1};
    int64_t idx = 1;
    assert_int_equal(qr_optim_apply_sparse(opt, s, rows, 2, 1, &idx, &g, 1, -1, 1), QR_OK);
    assert_true(rows[0] == 1.0f);
    NEAR(rows[1], 0.850000002);
    assert_true(slot_data(s, "m")[0] == 0.0f);
    qr_optim_slots_free(s);

    assert_int_equal(qr_optim_slots_create(opt, 1, 1, &s), QR_OK);
    var = 1;
    assert_int_equal(qr_optim_apply_dense(opt, s, &var, &g, 1, -1, 3), QR_OK);
    NEAR(var, 0.886118642);
    qr_optim_slots_free(s);
    qr_optim_free(opt);
}

/* Weight decay as torch's weight_decay (L2 in the gradient), SGD lr 0.1,
 * weight-decay 0.5, var = [1, -2], g = [0.5, -1]:
 *   g' = g + 0.5*var = [1, -2];  var = [1 - 0.1*1, -2 + 0.1*2] = [0.9, -1.8]
 * Momentum 0.9 on the same, twice (var = 1, g = 0.5):
 *   step 1: g' = 1,          accum = 1,               var = 1 - 0.1 = 0.9
 *   step 2: g' = 0.5 + 0.45 = 0.95, accum = 0.9 + 0.95 = 1.85, var = 0.9 - 0.185 = 0.715
 * Sparse SGD on a (2, 1) variable [1, 1], row 1 touched with g = 0.5:
 * row 1 = 1 - 0.1*(0.5 + 0.5) = 0.9; row 0, untouched, is not decayed. */
static void test_weight_decay(void **state) {
    qr_optim *opt = make("optimizer=sgd", "lr=0.1", "weight-decay=0.5", NULL);
    qr_optim_slots *s;
    assert_int_equal(qr_optim_slots_create(opt, 1, 2, &s), QR_OK);
    float var[2] = {1, -2}, g[2] = {0.5f, -1};
    assert_int_equal(qr_optim_apply_dense(opt, s, var, g, 2, -1, 1), QR_OK);
    NEAR(var[0], 0.9);
    NEAR(var[1], -1.8);
    qr_optim_slots_free(s);
    assert_int_equal(qr_optim_slots_create(opt, 2, 1, &s), QR_OK);
    float rows[2] = {1, 1};
    int64_t idx = 1;
    assert_int_equal(qr_optim_apply_sparse(opt, s, rows, 2, 1, &idx, g, 1, -1, 1), QR_OK);
    assert_true(rows[0] == 1.0f);
    NEAR(rows[1], 0.9);
    qr_optim_slots_free(s);
    qr_optim_free(opt);

    opt = make("optimizer=momentum", "lr=0.1", "momentum=0.9", "weight-decay=0.5", NULL);
    assert_int_equal(qr_optim_slots_create(opt, 1, 1, &s), QR_OK);
    float v = 1;
    assert_int_equal(qr_optim_apply_dense(opt, s, &v, g, 1, -1, 1), QR_OK);
    NEAR(v, 0.9);
    assert_int_equal(qr_optim_apply_dense(opt, s, &v, g, 1, -1, 2), QR_OK);
    NEAR(slot_data(s, "momentum")[0], 1.85);
    NEAR(v, 0.715);
    qr_optim_slots_free(s);
    qr_optim_free(opt);
}

/* FTRL, lr 0.1, lr_power -0.5, initial accumulator 16, l1 1, l2 0.5,
 * var = [0.5, 0], g = [3, 0.5]:
 *   element 0: new_accum = 16 + 9 = 25
 *              linear = 0 + 3 - (sqrt(25) - sqrt(16))/0.1 * 0.5 = 3 - 10*0.5 = -2
 *              quadratic = sqrt(25)/0.1 + 2*0.5 = 51
 *              |linear| = 2 > l1 = 1: var = (sign(-2)*1 - (-2))/51 = 1/51 = 0.0196078431
 *   element 1: new_accum = 16.25; linear = 0.5 - (...)*0 = 0.5; |0.5| <= 1: var = 0 */
static void test_ftrl(void **state) {
    qr_optim *opt = make("optimizer=ftrl", "lr=0.1", "initial-accumulator=16", "l1=1", "l2=0.5",
                         NULL);
    qr_optim_slots *s;
    assert_int_equal(qr_optim_slots_create(opt, 2, 1, &s), QR_OK);
    float var[2] = {0.5f, 0}, g[2] = {3, 0.5f};
    assert_int_equal(qr_optim_apply_dense(opt, s, var, g, 2, -1, 1), QR_OK);
    NEAR(slot_data(s, "accum")[0], 25);
    NEAR(slot_data(s, "accum")[1], 16.25);
    NEAR(slot_data(s, "linear")[0], -2);
    NEAR(slot_data(s, "linear")[1], 0.5);
    NEAR(var[0], 1.0 / 51);
    assert_true(var[1] == 0.0f);
    qr_optim_slots_free(s);
    qr_optim_free(opt);
}

/* Sparse SGD, lr 1, on a (3, 2) variable of zeros, indices [2, 0, 2] with
 * rows [1,1], [2,2], [3,3]: duplicates are summed first, so row 2 moves by
 * -(1+3) = -4, row 0 by -2, row 1 stays 0.
 * Momentum 0.5 on the same rows twice: row 1's accumulator is never
 * decayed or touched (lazy), and row 0 after two applies:
 *   accum = 0.5*2 + 2 = 3, var = -2 - 3 = -5. */
static void test_sparse_duplicates(void **state) {
    qr_optim *opt = make("optimizer=sgd", "lr=1", NULL);
    qr_optim_slots *s;
    assert_int_equal(qr_optim_slots_create(opt, 3, 2, &s), QR_OK);
    float var[6] = {0}, g[6] = {1, 1, 2, 2, 3, 3};
    int64_t idx[3] = {2, 0, 2};
    assert_int_equal(qr_optim_apply_sparse(opt, s, var, 3, 2, idx, g, 3, -1, 1), QR_OK);
    float want[6] = {-2, -2, 0, 0, -4, -4};
    for (int i = 0; i < 6; i++) NEAR(var[i], want[i]);
    qr_optim_slots_free(s);
    qr_optim_free(opt);

    opt = make("optimizer=momentum", "lr=1", "momentum=0.5", NULL);
    assert_int_equal(qr_optim_slots_create(opt, 3, 2, &s), QR_OK);
    float *accum = slot_data(s, "momentum");
    accum[2] = accum[3] = 7; /* row 1: must not decay */
    float v2[6] = {0};
    assert_int_equal(qr_optim_apply_sparse(opt, s, v2, 3, 2, idx, g, 3, -1, 1), QR_OK);
    assert_int_equal(qr_optim_apply_sparse(opt, s, v2, 3, 2, idx, g, 3, -1, 2), QR_OK);
    NEAR(accum[0], 3);
    NEAR(v2[0], -5);
    NEAR(accum[2], 7);
    assert_true(v2[2] == 0.0f && v2[3] == 0.0f);
    qr_optim_slots_free(s);
    qr_optim_free(opt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd),      cmocka_unit_test(test_momentum),
        cmocka_unit_test(test_adagrad),  cmocka_unit_test(test_rmsprop),
        cmocka_unit_test(test_adam),     cmocka_unit_test(test_adam_async),
        cmocka_unit_test(test_ftrl),     cmocka_unit_test(test_sparse_duplicates),
        cmocka_unit_test(test_adamw),    cmocka_unit_test(test_weight_decay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

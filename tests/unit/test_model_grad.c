/*
 * test_model_grad.c - the model's loss and gradients are right.
 *
 * The check is independent of model.c: a plain double-precision reference
 * forward pass written here with loops computes the loss, and central
 * finite differences of it give every parameter's gradient, which the
 * model's float32 backward pass must match element by element. A few tiny
 * cases are also checked against values worked out by hand. The layer
 * hooks (what the trainer overlaps its communication with) are checked
 * to come in layer order with each layer's values read only after its
 * before_forward and its gradients final at its after_backward.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/model.h"

/* A model together with its parameters and gradient buffers. */
typedef struct net {
    qr_model *m;
    int np;
    int L;          /* dense layers */
    int dims[8];    /* dims[0] = input, dims[L] = classes */
    float *p[16];   /* parameter values */
    float *g[16];   /* gradients */
    int64_t size[16];
} net;

static void net_create(net *n, const char *kind, int in, const int *hidden, int nhidden, int C,
                       int max_batch) {
    memset(n, 0, sizeof *n);
    assert_int_equal(qr_model_create(&n->m, kind, in, hidden, nhidden, C, max_batch), QR_OK);
    n->np = qr_model_num_params(n->m);
    n->L = n->np / 2;
    for (int i = 0; i < n->np; i++) {
        const char *name, *init;
        int ndim;
        int64_t shape[2];
        qr_model_param_info(n->m, i, &name, &ndim, shape, &init);
        n->size[i] = ndim == 2 ? shape[0] * shape[1] : shape[0];
        if (i % 2 == 0) {
            n->dims[i / 2] = (int)shape[0];
            n->dims[i / 2 + 1] = (int)shape[1];
        }
        n->p[i] = calloc((size_t)n->size[i], sizeof(float));
        n->g[i] = calloc((size_t)n->size[i], sizeof(float));
    }
}

static void net_random(net *n, uint64_t seed, double scale) {
    qr_rng rng;
    qr_rng_seed(&rng, seed);
    for (int i = 0; i < n->np; i++)
        for (int64_t k = 0; k < n->size[i]; k++) n->p[i][k] = (float)(scale * qr_rng_normal(&rng));
}

static void net_free(net *n) {
    for (int i = 0; i < n->np; i++) {
        free(n->p[i]);
        free(n->g[i]);
    }
    qr_model_free(n->m);
}

static int net_loss_grad(net *n, const float *x, const int32_t *y, int B, double *loss) {
    return qr_model_loss_grad(n->m, (const float *const *)n->p, n->g, x, y, B, loss);
}

/* Reference: mean softmax cross-entropy of the dense-ReLU stack, in double. */
static double ref_loss(const net *n, const float *x, const int32_t *y, int B) {
    double total = 0;
    double h[64], z[64];
    for (int b = 0; b < B; b++) {
        for (int j = 0; j < n->dims[0]; j++) h[j] = x[b * n->dims[0] + j];
        for (int l = 0; l < n->L; l++) {
            int din = n->dims[l], dout = n->dims[l + 1];
            const float *W = n->p[2 * l], *bias = n->p[2 * l + 1];
            for (int o = 0; o < dout; o++) {
                double s = bias[o];
                for (int i = 0; i < din; i++) s += h[i] * (double)W[i * dout + o];
                z[o] = (l < n->L - 1 && s < 0) ? 0 : s;
            }
            memcpy(h, z, sizeof(double) * (size_t)dout);
        }
        int C = n->dims[n->L];
        double mx = h[0], sum = 0;
        for (int c = 1; c < C; c++) mx = fmax(mx, h[c]);
        for (int c = 0; c < C; c++) sum += exp(h[c] - mx);
        total += -(h[y[b]] - mx - log(sum));
    }
    return total / B;
}

/* Every gradient element against central differences of ref_loss. */
static void check_gradients(net *n, const float *x, const int32_t *y, int B) {
    double loss;
    assert_int_equal(net_loss_grad(n, x, y, B, &loss), QR_OK);
    double ref = ref_loss(n, x, y, B);
    assert_true(fabs(loss - ref) <= 1e-6 * (1 + fabs(ref)));

    const float h = 1e-3f;
    int checked = 0;
    for (int i = 0; i < n->np; i++) {
        for (int64_t k = 0; k < n->size[i]; k++) {
            float saved = n->p[i][k];
            float plus = saved + h, minus = saved - h;
            double step = (double)plus - (double)minus; /* the step actually taken */
            n->p[i][k] = plus;
            double lp = ref_loss(n, x, y, B);
            n->p[i][k] = minus;
            double lm = ref_loss(n, x, y, B);
            n->p[i][k] = saved;
            double fd = (lp - lm) / step;
            double g = n->g[i][k];
            double err = fabs(g - fd), tol = 2e-5 + 2e-3 * fabs(fd);
            if (err > tol) {
                const char *name;
                qr_model_param_info(n->m, i, &name, NULL, NULL, NULL);
                print_error("%s[%lld]: analytic %.8g vs finite difference %.8g\n", name,
                            (long long)k, g, fd);
            }
            assert_true(err <= tol);
            checked++;
        }
    }
    /* Guard against a vacuous pass: the gradient must not be all zeros. */
    double norm = 0;
    for (int i = 0; i < n->np; i++)
        for (int64_t k = 0; k < n->size[i]; k++) norm += fabs(n->g[i][k]);
    assert_true(norm > 1e-3);
    assert_true(checked > 0);
}

static void random_batch(float *x, int32_t *y, int B, int D, int C, uint64_t seed) {
    qr_rng rng;
    qr_rng_seed(&rng, seed);
    for (int i = 0; i < B * D; i++) x[i] = (float)qr_rng_normal(&rng);
    for (int i = 0; i < B; i++) y[i] = (int32_t)qr_rng_below(&rng, (uint64_t)C);
}

static void test_softmax_gradient(void **state) {
    (void)state;
    net n;
    net_create(&n, "softmax", 6, NULL, 0, 4, 8);
    assert_int_equal(n.np, 2);
    net_random(&n, 11, 0.5);
    float x[3 * 6];
    int32_t y[3];
    random_batch(x, y, 3, 6, 4, 12);
    check_gradients(&n, x, y, 3);
    net_free(&n);
}

static void test_mlp_gradient(void **state) {
    (void)state;
    int hidden[] = {7, 5};
    net n;
    net_create(&n, "mlp", 6, hidden, 2, 4, 8);
    assert_int_equal(n.np, 6);
    net_random(&n, 21, 0.7);
    float x[3 * 6];
    int32_t y[3];
    random_batch(x, y, 3, 6, 4, 22);
    check_gradients(&n, x, y, 3);
    /* Also a full max_batch, and a batch of one. */
    float x8[8 * 6];
    int32_t y8[8];
    random_batch(x8, y8, 8, 6, 4, 23);
    check_gradients(&n, x8, y8, 8);
    check_gradients(&n, x8, y8, 1);
    net_free(&n);
}

static void test_param_info(void **state) {
    (void)state;
    int hidden[] = {7, 5};
    net n;
    net_create(&n, "mlp", 6, hidden, 2, 4, 3);
    static const char *names[] = {"layer0/weights", "layer0/bias", "layer1/weights",
                                  "layer1/bias", "layer2/weights", "layer2/bias"};
    static const int64_t shapes[][2] = {{6, 7}, {7, 1}, {7, 5}, {5, 1}, {5, 4}, {4, 1}};
    for (int i = 0; i < 6; i++) {
        const char *name, *init;
        int ndim;
        int64_t shape[2];
        qr_model_param_info(n.m, i, &name, &ndim, shape, &init);
        assert_string_equal(name, names[i]);
        assert_int_equal(ndim, i % 2 ? 1 : 2);
        assert_int_equal(shape[0], shapes[i][0]);
        if (ndim == 2) assert_int_equal(shape[1], shapes[i][1]);
        assert_string_equal(init, i % 2 ? "zeros" : "glorot_uniform");
    }
    const char *name = "x";
    int ndim = 5;
    qr_model_param_info(n.m, 6, &name, &ndim, NULL, NULL);
    assert_null(name);
    assert_int_equal(ndim, 0);
    net_free(&n);

    qr_model *m;
    assert_int_equal(qr_model_create(&m, "softmax", 64, NULL, 0, 10, 32), QR_OK);
    assert_int_equal(qr_model_num_params(m), 2);
    int64_t shape[2];
    qr_model_param_info(m, 0, &name, &ndim, shape, NULL);
    assert_string_equal(name, "layer0/weights");
    assert_int_equal(shape[0], 64);
    assert_int_equal(shape[1], 10);
    qr_model_free(m);
}

/* Zero parameters: every class has probability 1/C, so loss = ln C, and
 * for softmax regression dW = x^T (1/C - onehot(y)) / B exactly. */
static void test_zero_params_loss_is_log_classes(void **state) {
    (void)state;
    net n;
    net_create(&n, "softmax", 6, NULL, 0, 4, 4);
    float x[3 * 6];
    int32_t y[3];
    random_batch(x, y, 3, 6, 4, 5);
    double loss;
    assert_int_equal(net_loss_grad(&n, x, y, 3, &loss), QR_OK);
    assert_true(fabs(loss - log(4.0)) < 1e-6);
    for (int i = 0; i < 6; i++)
        for (int c = 0; c < 4; c++) {
            double want = 0;
            for (int b = 0; b < 3; b++) want += x[b * 6 + i] * (0.25 - (y[b] == c)) / 3;
            assert_true(fabs(n.g[0][i * 4 + c] - want) < 1e-6);
        }
    for (int c = 0; c < 4; c++) {
        double want = 0;
        for (int b = 0; b < 3; b++) want += (0.25 - (y[b] == c)) / 3;
        assert_true(fabs(n.g[1][c] - want) < 1e-6);
    }
    net_free(&n);

    int hidden[] = {7, 5};
    net_create(&n, "mlp", 6, hidden, 2, 10, 4);
    assert_int_equal(net_loss_grad(&n, x, y, 3, &loss), QR_OK);
    assert_true(fabs(loss - log(10.0)) < 1e-6);
    /* The hidden layers output zeros, so only the last bias learns. */
    for (int i = 0; i < 5; i++)
        for (int64_t k = 0; k < n.size[i]; k++) assert_true(n.g[i][k] == 0.0f);
    net_free(&n);
}

/* One input, two classes, W = [1, -1], x = 1, y = 0: logits (1, -1),
 * loss = ln(1 + e^-2), p0 = 1 / (1 + e^-2), dW = db = (p0 - 1, 1 - p0). */
static void test_hand_computed_case(void **state) {
    (void)state;
    net n;
    net_create(&n, "softmax", 1, NULL, 0, 2, 1);
    n.p[0][0] = 1;
    n.p[0][1] = -1;
    float x = 1;
    int32_t y = 0;
    double loss;
    assert_int_equal(net_loss_grad(&n, &x, &y, 1, &loss), QR_OK);
    double p0 = 1 / (1 + exp(-2.0));
    assert_true(fabs(loss - log(1 + exp(-2.0))) < 1e-6);
    assert_true(fabs(n.g[0][0] - (p0 - 1)) < 1e-6);
    assert_true(fabs(n.g[0][1] - (1 - p0)) < 1e-6);
    assert_true(fabs(n.g[1][0] - (p0 - 1)) < 1e-6);
    assert_true(fabs(n.g[1][1] - (1 - p0)) < 1e-6);

    /* Huge logits (1000, 0) with the wrong label: a naive exp() overflows;
     * the stable softmax gives loss 1000 and gradient (1, -1). */
    n.p[0][0] = 1000;
    n.p[0][1] = 0;
    y = 1;
    assert_int_equal(net_loss_grad(&n, &x, &y, 1, &loss), QR_OK);
    assert_true(fabs(loss - 1000) < 1e-3);
    assert_true(fabs(n.g[0][0] - 1) < 1e-6 && fabs(n.g[0][1] + 1) < 1e-6);

    /* A NaN parameter is reported, not hidden, even behind a ReLU. */
    n.p[0][0] = NAN;
    assert_int_equal(net_loss_grad(&n, &x, &y, 1, &loss), QR_ENONFINITE);
    net_free(&n);
    int hidden[] = {3};
    net_create(&n, "mlp", 1, hidden, 1, 2, 1);
    n.p[0][1] = NAN;
    assert_int_equal(net_loss_grad(&n, &x, &y, 1, &loss), QR_ENONFINITE);
    assert_true(isnan(loss));
    net_free(&n);
}

/* A smaller batch after a larger one must not see the larger one's data. */
static void test_no_state_between_calls(void **state) {
    (void)state;
    int hidden[] = {9};
    net a, b;
    net_create(&a, "mlp", 5, hidden, 1, 3, 6);
    net_create(&b, "mlp", 5, hidden, 1, 3, 6);
    net_random(&a, 3, 0.5);
    net_random(&b, 3, 0.5);
    float x[6 * 5];
    int32_t y[6];
    random_batch(x, y, 6, 5, 3, 4);
    double la, lb;
    assert_int_equal(net_loss_grad(&a, x, y, 6, &la), QR_OK);
    assert_int_equal(net_loss_grad(&a, x + 5, y + 1, 2, &la), QR_OK);
    assert_int_equal(net_loss_grad(&b, x + 5, y + 1, 2, &lb), QR_OK);
    assert_true(la == lb);
    for (int i = 0; i < a.np; i++)
        assert_memory_equal(a.g[i], b.g[i], (size_t)a.size[i] * sizeof(float));
    net_free(&a);
    net_free(&b);
}

static void test_evaluate_matches_reference(void **state) {
    (void)state;
    int hidden[] = {8};
    net n;
    net_create(&n, "mlp", 4, hidden, 1, 3, 4); /* 10 examples: chunks of 4, 4, 2 */
    net_random(&n, 8, 0.8);
    float x[10 * 4];
    int32_t y[10];
    random_batch(x, y, 10, 4, 3, 9);
    qr_dataset d = {.n = 10, .dim = 4, .nclasses = 3, .x = x, .y = y};
    double acc, loss;
    assert_int_equal(qr_model_evaluate(n.m, (const float *const *)n.p, &d, &acc, &loss), QR_OK);
    assert_true(fabs(loss - ref_loss(&n, x, y, 10)) < 1e-5);
    /* Accuracy: count examples whose single-example loss is the smallest
     * among the possible labels. */
    int correct = 0;
    for (int b = 0; b < 10; b++) {
        double best = INFINITY;
        int arg = -1;
        for (int c = 0; c < 3; c++) {
            int32_t yc = c;
            double l = ref_loss(&n, x + b * 4, &yc, 1);
            if (l < best) best = l, arg = c;
        }
        correct += arg == y[b];
    }
    assert_true(fabs(acc - correct / 10.0) < 1e-12);

    d.dim = 5;
    assert_int_equal(qr_model_evaluate(n.m, (const float *const *)n.p, &d, &acc, &loss),
                     QR_ESHAPE);
    d.dim = 4;
    y[3] = 3;
    assert_int_equal(qr_model_evaluate(n.m, (const float *const *)n.p, &d, &acc, &loss),
                     QR_EINVAL);
    net_free(&n);
}

static void test_bad_arguments(void **state) {
    (void)state;
    qr_model *m = (qr_model *)1;
    int hidden[] = {4, 0};
    assert_int_equal(qr_model_create(&m, "cnn", 4, NULL, 0, 3, 8), QR_EINVAL);
    assert_null(m);
    assert_non_null(strstr(qr_last_error(), "cnn"));
    assert_int_equal(qr_model_create(&m, "mlp", 4, hidden, 0, 3, 8), QR_EINVAL);
    assert_int_equal(qr_model_create(&m, "mlp", 4, hidden, 2, 3, 8), QR_EINVAL);
    assert_int_equal(qr_model_create(&m, "softmax", 0, NULL, 0, 3, 8), QR_EINVAL);
    assert_int_equal(qr_model_create(&m, "softmax", 4, NULL, 0, 1, 8), QR_EINVAL);
    assert_int_equal(qr_model_create(&m, "softmax", 4, NULL, 0, 3, 0), QR_EINVAL);

    net n;
    net_create(&n, "softmax", 2, NULL, 0, 3, 4);
    float x[10] = {0};
    int32_t y[5] = {0, 1, 2, 0, 1};
    double loss;
    assert_int_equal(net_loss_grad(&n, x, y, 0, &loss), QR_EINVAL);
    assert_int_equal(net_loss_grad(&n, x, y, 5, &loss), QR_EINVAL);
    y[1] = 3;
    assert_int_equal(net_loss_grad(&n, x, y, 2, &loss), QR_EINVAL);
    y[1] = -1;
    assert_int_equal(net_loss_grad(&n, x, y, 2, &loss), QR_EINVAL);
    net_free(&n);
    qr_model_free(NULL);
}

/* The worker runs OpenBLAS on one thread; results must not depend on the
 * thread count. Big enough that OpenBLAS would actually split the work. */
static void test_blas_threads_do_not_change_results(void **state) {
    (void)state;
    int hidden[] = {256};
    net a;
    net_create(&a, "mlp", 784, hidden, 1, 10, 128);
    net_random(&a, 5, 0.05);
    float *x = malloc(128 * 784 * sizeof(float));
    int32_t y[128];
    random_batch(x, y, 128, 784, 10, 6);
    float *g1[16];
    double l1, l2;
    int saved = openblas_get_num_threads();
    openblas_set_num_threads(1);
    assert_int_equal(net_loss_grad(&a, x, y, 128, &l1), QR_OK);
    for (int i = 0; i < a.np; i++) {
        g1[i] = malloc((size_t)a.size[i] * sizeof(float));
        memcpy(g1[i], a.g[i], (size_t)a.size[i] * sizeof(float));
    }
    openblas_set_num_threads(2);
    assert_int_equal(net_loss_grad(&a, x, y, 128, &l2), QR_OK);
    openblas_set_num_threads(saved);
    assert_true(fabs(l1 - l2) <= 1e-6 * fabs(l1));
    for (int i = 0; i < a.np; i++) {
        for (int64_t k = 0; k < a.size[i]; k++)
            assert_true(fabs(g1[i][k] - a.g[i][k]) <= 1e-6 + 1e-4 * fabs(g1[i][k]));
        free(g1[i]);
    }
    free(x);
    net_free(&a);
}

/* What the layer hooks see: the order of their calls, and at each
 * after_backward whether the first layer's gradient is still untouched. */
typedef struct hook_trace {
    net *n;
    const net *ref;  /* the same model, run without hooks */
    char events[32]; /* "F0" ... "B0": forward / backward hooks in order */
    int nevents;
    bool first_layer_untouched[8]; /* at after_backward(l) */
    int fail_at_backward;          /* this layer's hook fails (-1: none) */
} hook_trace;

/* A layer's values "land" only now: they were NaN until its forward. */
static int values_land(void *ctx, int l) {
    hook_trace *t = ctx;
    t->events[t->nevents++] = 'F';
    t->events[t->nevents++] = (char)('0' + l);
    for (int i = 2 * l; i < 2 * l + 2; i++)
        memcpy(t->n->p[i], t->ref->p[i], (size_t)t->n->size[i] * sizeof(float));
    return QR_OK;
}

/* A layer's gradients "go out": they must be final already, and its
 * values may be overwritten (new ones landing) without changing the
 * step's other gradients. */
static int grads_out(void *ctx, int l) {
    hook_trace *t = ctx;
    t->events[t->nevents++] = 'B';
    t->events[t->nevents++] = (char)('0' + l);
    t->first_layer_untouched[l] = isnan(t->n->g[0][0]);
    for (int i = 2 * l; i < 2 * l + 2; i++) {
        assert_memory_equal(t->n->g[i], t->ref->g[i], (size_t)t->n->size[i] * sizeof(float));
        for (int64_t k = 0; k < t->n->size[i]; k++) t->n->p[i][k] = NAN;
    }
    return l == t->fail_at_backward ? qr__fail(QR_EPEERLOST, "hook failed") : QR_OK;
}

static void test_layer_hooks(void **state) {
    (void)state;
    int hidden[] = {7, 6};
    net ref, n;
    net_create(&ref, "mlp", 5, hidden, 2, 4, 8);
    net_create(&n, "mlp", 5, hidden, 2, 4, 8);
    net_random(&ref, 21, 0.5);
    float x[8 * 5];
    int32_t y[8];
    random_batch(x, y, 8, 5, 4, 22);
    double ref_l, l;
    assert_int_equal(net_loss_grad(&ref, x, y, 8, &ref_l), QR_OK);
    assert_int_equal(qr_model_num_layers(n.m), 3);
    for (int fail = -1; fail < 3; fail += 3) {
        hook_trace t = {.n = &n, .ref = &ref, .fail_at_backward = fail};
        for (int i = 0; i < n.np; i++)
            for (int64_t k = 0; k < n.size[i]; k++) n.p[i][k] = n.g[i][k] = NAN;
        qr_model_hooks hooks = {values_land, grads_out, &t};
        int rc = qr_model_loss_grad_hooked(n.m, (const float *const *)n.p, n.g, x, y, 8, &l, &hooks);
        if (fail >= 0) { /* a hook's error ends the call with it, at once */
            assert_int_equal(rc, QR_EPEERLOST);
            assert_string_equal(t.events, "F0F1F2B2");
            continue;
        }
        assert_int_equal(rc, QR_OK);
        assert_true(l == ref_l);
        assert_string_equal(t.events, "F0F1F2B2B1B0");
        /* the last layer's gradient went out before the first layer's
         * backward had written anything */
        assert_true(t.first_layer_untouched[2] && t.first_layer_untouched[1]);
        assert_false(t.first_layer_untouched[0]);
        for (int i = 0; i < n.np; i++)
            assert_memory_equal(n.g[i], ref.g[i], (size_t)n.size[i] * sizeof(float));
    }
    /* A diverged step: its gradients are written, but none goes out. */
    hook_trace t = {.n = &n, .ref = &ref, .fail_at_backward = -1};
    for (int i = 0; i < n.np; i++)
        for (int64_t k = 0; k < n.size[i]; k++) n.p[i][k] = ref.p[i][k];
    ref.p[4][0] = INFINITY;
    qr_model_hooks only_forward = {values_land, grads_out, &t};
    assert_int_equal(qr_model_loss_grad_hooked(n.m, (const float *const *)n.p, n.g, x, y, 8, &l,
                                               &only_forward), QR_ENONFINITE);
    assert_string_equal(t.events, "F0F1F2");
    net_free(&ref);
    net_free(&n);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softmax_gradient),
        cmocka_unit_test(test_mlp_gradient),
        cmocka_unit_test(test_param_info),
        cmocka_unit_test(test_zero_params_loss_is_log_classes),
        cmocka_unit_test(test_hand_computed_case),
        cmocka_unit_test(test_no_state_between_calls),
        cmocka_unit_test(test_evaluate_matches_reference),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_blas_threads_do_not_change_results),
        cmocka_unit_test(test_layer_hooks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_model_train.c - models and data end to end: plain minibatch SGD,
 * in-process, on the 8x8 digits must reach a good test accuracy within a
 * few seconds. Parameters start from the initializers the worker uses.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "data/data.h"
#include "model/model.h"
#include "common/init.h"

enum { BATCH = 32 };

/* Train `m` with SGD for `epochs` on train; return test accuracy. */
static double train_sgd(qr_model *m, const qr_dataset *train, const qr_dataset *test, int epochs,
                        float lr, uint64_t seed, double *first_loss, double *last_loss) {
    int np = qr_model_num_params(m);
    float *p[16], *g[16];
    int64_t size[16];
    for (int i = 0; i < np; i++) {
        const char *name, *init;
        int ndim;
        int64_t shape[2];
        qr_model_param_info(m, i, &name, &ndim, shape, &init);
        size[i] = ndim == 2 ? shape[0] * shape[1] : shape[0];
        p[i] = malloc((size_t)size[i] * sizeof(float));
        g[i] = malloc((size_t)size[i] * sizeof(float));
        assert_int_equal(qr_init_fill(p[i], size[i], ndim, shape, init, seed + (uint64_t)i),
                         QR_OK);
    }
    int64_t D = train->dim;
    float *xb = malloc(BATCH * (size_t)D * sizeof(float));
    int32_t yb[BATCH];
    int64_t *order = malloc((size_t)train->n * sizeof(int64_t));
    for (int64_t i = 0; i < train->n; i++) order[i] = i;
    qr_rng rng;
    qr_rng_seed(&rng, seed);
    double epoch_loss = 0;
    for (int e = 0; e < epochs; e++) {
        for (int64_t i = train->n - 1; i > 0; i--) {
            int64_t j = (int64_t)qr_rng_below(&rng, (uint64_t)i + 1), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        epoch_loss = 0;
        int steps = 0;
        for (int64_t s = 0; s + BATCH <= train->n; s += BATCH, steps++) {
            for (int b = 0; b < BATCH; b++) {
                memcpy(xb + b * D, train->x + order[s + b] * D, (size_t)D * sizeof(float));
                yb[b] = train->y[order[s + b]];
            }
            double loss;
            assert_int_equal(qr_model_loss_grad(m, (const float *const *)p, g, xb, yb, BATCH,
                                                &loss), QR_OK);
            epoch_loss += loss;
            for (int i = 0; i < np; i++)
                for (int64_t k = 0; k < size[i]; k++) p[i][k] -= lr * g[i][k];
        }
        epoch_loss /= steps;
        if (e == 0) *first_loss = epoch_loss;
    }
    *last_loss = epoch_loss;
    double acc, loss;
    assert_int_equal(qr_model_evaluate(m, (const float *const *)p, test, &acc, &loss), QR_OK);
    for (int i = 0; i < np; i++) {
        free(p[i]);
        free(g[i]);
    }
    free(xb);
    free(order);
    return acc;
}

static void test_mlp_learns_digits(void **state) {
    (void)state;
    qr_dataset train, test;
    assert_int_equal(qr_data_load("digits", NULL, &train, &test), QR_OK);
    int hidden[] = {64};
    qr_model *m;
    assert_int_equal(qr_model_create(&m, "mlp", train.dim, hidden, 1, train.nclasses, BATCH),
                     QR_OK);
    double t0 = qr__now_sec(), first = 0, last = 0;
    double acc = train_sgd(m, &train, &test, 30, 0.1f, 1, &first, &last);
    print_message("mlp(64) on digits: train loss %.3f -> %.3f, test accuracy %.4f in %.2f s\n",
                  first, last, acc, qr__now_sec() - t0);
    assert_true(last < first / 4);
    assert_true(acc >= 0.93);
    qr_model_free(m);
    qr_dataset_free(&train);
    qr_dataset_free(&test);
}

static void test_softmax_learns_digits(void **state) {
    (void)state;
    qr_dataset train, test;
    assert_int_equal(qr_data_load("digits", NULL, &train, &test), QR_OK);
    qr_model *m;
    assert_int_equal(qr_model_create(&m, "softmax", train.dim, NULL, 0, train.nclasses, BATCH),
                     QR_OK);
    double first = 0, last = 0;
    double acc = train_sgd(m, &train, &test, 30, 0.2f, 2, &first, &last);
    print_message("softmax on digits: train loss %.3f -> %.3f, test accuracy %.4f\n", first, last,
                  acc);
    assert_true(acc >= 0.90);
    qr_model_free(m);
    qr_dataset_free(&train);
    qr_dataset_free(&test);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_learns_digits),
        cmocka_unit_test(test_softmax_learns_digits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

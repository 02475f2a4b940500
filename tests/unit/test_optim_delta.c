/*
 * test_optim_delta.c - the local-SGD kernels of src/optim (delta.c and
 * qr_optim_sgd_step) against plain reference loops, bit for bit: the
 * worker's SGD step and delta, and the ps's dense and row-wise delta add,
 * whose results must equal the inline loops they replace exactly.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim.h"

/* An odd length, so that the vector loops' remainders are exercised. */
#define N 1037

static void fill(float *x, int64_t n, unsigned seed) {
    srand(seed);
    for (int64_t i = 0; i < n; i++) x[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * 8.0f;
}

static void assert_same_bits(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)))
            fail_msg("element %lld: %.9g vs %.9g", (long long)i, a[i], b[i]);
}

static void test_sgd_step(void **state) {
    float var[N], grad[N], want[N];
    fill(var, N, 1);
    fill(grad, N, 2);
    const float lr = 0.0537f;
    /* The loop train.c ran before the kernel existed. */
    for (int64_t e = 0; e < N; e++) want[e] = var[e] - lr * grad[e];
    qr_optim_sgd_step(var, grad, N, lr);
    assert_same_bits(var, want, N);

    /* ... and what the ps's SGD apply computes. */
    float var2[N];
    fill(var, N, 1);
    memcpy(var2, var, sizeof var);
    qr_optim *opt;
    qr_optim_slots *s;
    assert_int_equal(qr_optim_create(&opt, NULL), QR_OK);
    assert_int_equal(qr_optim_slots_create(opt, N, 1, &s), QR_OK);
    assert_int_equal(qr_optim_apply_dense(opt, s, var2, grad, N, lr, 1), QR_OK);
    qr_optim_sgd_step(var, grad, N, lr);
    assert_same_bits(var, var2, N);
    qr_optim_slots_free(s);
    qr_optim_free(opt);
}

static void test_delta(void **state) {
    float now[N], before[N], out[N], want[N];
    fill(now, N, 3);
    fill(before, N, 4);
    for (int64_t e = 0; e < N; e++) want[e] = now[e] - before[e];
    qr_optim_delta(out, now, before, N);
    assert_same_bits(out, want, N);
}

static void test_add_delta(void **state) {
    float w[N], delta[N], out[N], want[N];
    fill(w, N, 5);
    fill(delta, N, 6);
    /* The loop the ps ran before this kernel: out[k] = w[k] + g[k]. */
    for (int64_t k = 0; k < N; k++) want[k] = w[k] + delta[k];
    qr_optim_add_delta(out, w, delta, N);
    assert_same_bits(out, want, N);
    /* In place (out == w), as when no pull reads the tensor. */
    qr_optim_add_delta(w, w, delta, N);
    assert_same_bits(w, want, N);
    /* And what the fused apply (lr = -1) writes into the gradient. */
    fill(w, N, 5);
    assert_true(qr_optim_sgd_into_grad(delta, w, N, -1.0f));
    assert_same_bits(delta, want, N);
}

static void test_add_delta_rows(void **state) {
    enum { ROWS = 50, DIM = 13, NIDX = 7 };
    float var[ROWS * DIM], want[ROWS * DIM], rows[NIDX * DIM];
    fill(var, ROWS * DIM, 7);
    fill(rows, NIDX * DIM, 8);
    memcpy(want, var, sizeof var);
    const int64_t idx[NIDX] = {3, 49, 0, 3, 17, 3, 48}; /* row 3 three times */
    /* The loop the ps ran before this kernel. */
    for (int64_t k = 0; k < NIDX; k++)
        for (int64_t e = 0; e < DIM; e++) want[idx[k] * DIM + e] += rows[k * DIM + e];
    assert_int_equal(qr_optim_add_delta_rows(var, ROWS, DIM, idx, rows, NIDX), QR_OK);
    assert_same_bits(var, want, ROWS * DIM);

    /* No rows: nothing changes. An index out of range: nothing changes. */
    assert_int_equal(qr_optim_add_delta_rows(var, ROWS, DIM, idx, rows, 0), QR_OK);
    const int64_t bad[2] = {1, ROWS};
    assert_int_equal(qr_optim_add_delta_rows(var, ROWS, DIM, bad, rows, 2), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "out of range"));
    assert_same_bits(var, want, ROWS * DIM);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_step),
        cmocka_unit_test(test_delta),
        cmocka_unit_test(test_add_delta),
        cmocka_unit_test(test_add_delta_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

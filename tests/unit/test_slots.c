/*
 * test_slots.c - a variable's optimizer state read and written by a
 * worker (qr_worker_slot_names, _pull_slot, _set_slot, _set_step; the
 * SLOTS request of src/ps/slots.c), against real ps tasks on threads
 * (cluster_fixture.h):
 *   - Adam's slots after one push are (1 - beta1) g and (1 - beta2) g^2,
 *     named "m,v";
 *   - a momentum slot written over two ps (a partitioned variable) reads
 *     back exactly, and the next push applies it;
 *   - a variable's values written (slot "") are what a pull brings;
 *   - the step set on a new cluster: Adam's t goes on from it, as after
 *     that many steps of zero gradients (which leave m, v and the values
 *     as they were), in async and sync mode;
 *   - refusals: an unknown slot (the message lists the slots), a wrong
 *     size, a NaN, an embedding table, the step set by another worker or
 *     on a cluster past step 0; each changes nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "world_fixture.h"

static void expect_ok(int rc) {
    if (rc) fprintf(stderr, "%s\n", qr_last_error());
    assert_int_equal(rc, QR_OK);
}

/* ---- reading ---------------------------------------------------------------- */

static void test_read_adam(void **state) {
    (void)state;
    world s;
    world_start(&s, 1, 1, NULL);
    int64_t shape[1] = {4};
    int v, t;
    expect_ok(qr_worker_declare_opts(s.w[0], "w", 1, shape, "constant:1", 1, "optimizer=adam,lr=0.1",
                                     &v));
    expect_ok(qr_worker_declare_table(s.w[0], "emb", 2, "zeros", 1, "", &t));
    world_init_all(&s);
    char names[64];
    expect_ok(qr_worker_slot_names(s.w[0], v, names, sizeof names));
    assert_string_equal(names, "m,v");
    assert_int_equal(qr_worker_slot_names(s.w[0], v, names, 3), QR_ETOOBIG);
    float g[4] = {1, -2, 0.5f, 4}, m[4], sq[4], val[4];
    const float *grads[1] = {g};
    expect_ok(qr_worker_push(s.w[0], 1, &v, grads, QR_PUSH_STEP, NULL));
    expect_ok(qr_worker_pull_slot(s.w[0], v, "m", m, 4));
    expect_ok(qr_worker_pull_slot(s.w[0], v, "v", sq, 4));
    expect_ok(qr_worker_pull_slot(s.w[0], v, NULL, val, 4));
    float *dst[1] = {NULL};
    expect_ok(qr_worker_pull(s.w[0], 1, &v, dst));
    for (int i = 0; i < 4; i++) {
        assert_float_equal(m[i], 0.1f * g[i], 1e-7);
        assert_float_equal(sq[i], 0.001f * g[i] * g[i], 1e-7);
        assert_true(val[i] == qr_worker_var_data(s.w[0], v)[i]);
    }
    /* refusals */
    assert_int_equal(qr_worker_pull_slot(s.w[0], v, "momentum", m, 4), QR_ENOTFOUND);
    assert_non_null(strstr(qr_last_error(), "'m', 'v'"));
    assert_int_equal(qr_worker_pull_slot(s.w[0], v, "m", m, 3), QR_ESHAPE);
    assert_int_equal(qr_worker_pull_slot(s.w[0], t, "m", m, 2), QR_EINVAL);
    assert_int_equal(qr_worker_pull_slot(s.w[0], 9, "m", m, 4), QR_ENOTFOUND);
    world_finish(&s);
}

/* ---- writing ---------------------------------------------------------------- */

/* A (6, 2) momentum variable split over 2 ps: the slot written reads back,
 * and a push applies it: accum = 0.9 accum + g, w -= lr accum. */
static void test_write_partitioned(void **state) {
    (void)state;
    world s;
    world_start(&s, 2, 1, NULL);
    int64_t shape[2] = {6, 2};
    int v;
    expect_ok(qr_worker_declare_opts(s.w[0], "w", 2, shape, "zeros", 1,
                                     "optimizer=momentum,momentum=0.9,lr=0.5,partitions=2", &v));
    world_init_all(&s);
    assert_int_equal(qr_worker_var_placement(s.w[0], v, 0, NULL, NULL, NULL), 2);
    float buf[12], back[12], g[12], vals[12];
    for (int i = 0; i < 12; i++) buf[i] = (float)i * 0.25f - 1.0f, g[i] = 1.0f;
    expect_ok(qr_worker_set_slot(s.w[0], v, "momentum", buf, 12));
    expect_ok(qr_worker_pull_slot(s.w[0], v, "momentum", back, 12));
    assert_memory_equal(buf, back, sizeof buf);

    /* Refused whole: nothing changes on either ps. */
    float bad[12];
    memcpy(bad, buf, sizeof bad);
    bad[11] = NAN;
    assert_int_equal(qr_worker_set_slot(s.w[0], v, "momentum", bad, 12), QR_ENONFINITE);
    assert_int_equal(qr_worker_set_slot(s.w[0], v, "m", g, 12), QR_ENOTFOUND);
    assert_non_null(strstr(qr_last_error(), "'momentum'"));
    assert_int_equal(qr_worker_set_slot(s.w[0], v, "momentum", g, 6), QR_ESHAPE);
    expect_ok(qr_worker_pull_slot(s.w[0], v, "momentum", back, 12));
    assert_memory_equal(buf, back, sizeof buf);

    /* The variable's values, then a push on top of both. */
    for (int i = 0; i < 12; i++) vals[i] = (float)i;
    expect_ok(qr_worker_set_slot(s.w[0], v, "", vals, 12));
    const float *grads[1] = {g};
    expect_ok(qr_worker_push(s.w[0], 1, &v, grads, QR_PUSH_STEP, NULL));
    float *dst[1] = {NULL};
    expect_ok(qr_worker_pull(s.w[0], 1, &v, dst));
    expect_ok(qr_worker_pull_slot(s.w[0], v, "momentum", back, 12));
    for (int i = 0; i < 12; i++) {
        float accum = buf[i] * 0.9f + g[i];
        assert_true(back[i] == accum);
        assert_true(qr_worker_var_data(s.w[0], v)[i] == vals[i] - accum * 0.5f);
    }
    world_finish(&s);
}

/* ---- the step --------------------------------------------------------------- */

/* Adam over `zero_steps` pushes of zero gradients (or the step set to
 * that many), then one push of g: the values after it. */
static void adam_after(const char *mode, int zero_steps, bool set_step, float out[3]) {
    world s;
    const char *opts[] = {"mode", mode, NULL};
    world_start(&s, 2, 1, opts);
    int64_t shape[1] = {3};
    int v;
    expect_ok(qr_worker_declare_opts(s.w[0], "w", 1, shape, "constant:1", 1, "optimizer=adam,lr=0.1",
                                     &v));
    world_init_all(&s);
    bool sync = !strcmp(mode, "sync");
    float zero[3] = {0, 0, 0}, g[3] = {0.5f, -1, 2};
    const float *zeros[1] = {zero}, *grads[1] = {g};
    int64_t step = -1;
    if (set_step) {
        expect_ok(qr_worker_set_step(s.w[0], zero_steps));
        expect_ok(qr_worker_global_step(s.w[0], &step));
        assert_int_equal(step, zero_steps);
        expect_ok(qr_worker_set_step(s.w[0], zero_steps)); /* at it already: nothing */
    } else {
        for (int k = 0; k < zero_steps; k++) {
            expect_ok(qr_worker_push(s.w[0], 1, &v, zeros, QR_PUSH_STEP, NULL));
            if (sync) expect_ok(qr_worker_take_token(s.w[0], NULL));
        }
    }
    expect_ok(qr_worker_push(s.w[0], 1, &v, grads, QR_PUSH_STEP, NULL));
    if (sync) {
        expect_ok(qr_worker_take_token(s.w[0], &step));
        assert_int_equal(step, zero_steps + 1);
    }
    float *dst[1] = {out};
    expect_ok(qr_worker_pull(s.w[0], 1, &v, dst));
    expect_ok(qr_worker_global_step(s.w[0], &step));
    assert_int_equal(step, zero_steps + 1);
    /* Past step 0 the step is not set again. */
    assert_int_equal(qr_worker_set_step(s.w[0], 0), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "before the first push"));
    world_finish(&s);
}

static void test_set_step(void **state) {
    (void)state;
    const char *modes[2] = {"async", "sync"};
    for (int k = 0; k < 2; k++) {
        float walked[3], set[3], first[3];
        adam_after(modes[k], 7, false, walked);
        adam_after(modes[k], 7, true, set);
        adam_after(modes[k], 0, false, first);
        assert_memory_equal(walked, set, sizeof set);
        /* t = 8, not 1: the bias correction differs. */
        assert_true(memcmp(walked, first, sizeof first) != 0);
    }
}

static void test_set_step_refused(void **state) {
    (void)state;
    world s;
    world_start(&s, 1, 2, NULL);
    int64_t shape[1] = {2};
    int v;
    expect_ok(qr_worker_declare_opts(s.w[0], "w", 1, shape, "constant:1", 1, "optimizer=adam", &v));
    expect_ok(qr_worker_declare_opts(s.w[1], "w", 1, shape, "constant:1", 1, "optimizer=adam", &v));
    world_init_all(&s);
    assert_int_equal(qr_worker_set_step(s.w[1], 3), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "chief"));
    assert_int_equal(qr_worker_set_step(s.w[0], -1), QR_EINVAL);
    int64_t step = -1;
    expect_ok(qr_worker_global_step(s.w[0], &step));
    assert_int_equal(step, 0);
    world_finish(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_adam),
        cmocka_unit_test(test_write_partitioned),
        cmocka_unit_test(test_set_step),
        cmocka_unit_test(test_set_step_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

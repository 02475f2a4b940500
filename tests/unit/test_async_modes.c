/*
 * test_async_modes.c - asynchronous training's extras, through the C API
 * against a real ps: delta pushes (local SGD), staleness stamping and the
 * 1/(1 + staleness) learning-rate scale, the staleness histogram, and the
 * staleness bound (max-staleness) with a worker that waits and one that
 * leaves, and sparse pushes (their step flag advancing the steps applied on
 * the ps that holds them), and large pushes applied as they arrive on
 * every ps. SGD with lr 1, values worked out by hand.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "world_fixture.h"

typedef struct run {
    cluster_fixture f;
    qr_worker *w[2];
    int id[2];
} run;

/* A 1-ps cluster of 2 workers, SGD with lr 1, options key, value, ...,
 * NULL on top; both workers declare w = [0, 0]. */
static void start_with(run *r, const char *const *options) {
    fix_init(&r->f, 1, 2);
    qr_config_set(r->f.cfg, "lr", "1");
    for (int k = 0; options && options[k]; k += 2)
        assert_int_equal(qr_config_set(r->f.cfg, options[k], options[k + 1]), QR_OK);
    assert_int_equal(fix_start_ps(&r->f, 0), QR_OK);
    int64_t shape[1] = {2};
    for (int i = 0; i < 2; i++) {
        r->w[i] = fix_worker(&r->f, i);
        assert_int_equal(qr_worker_declare(r->w[i], "w", 1, shape, "zeros", 1, -1, &r->id[i]),
                         QR_OK);
        assert_int_equal(qr_worker_initialize(r->w[i]), QR_OK);
    }
}

static void start(run *r, const char *key, const char *value) {
    const char *const options[] = {key, value, NULL};
    start_with(r, key ? options : NULL);
}

static void finish(run *r) {
    assert_int_equal(qr_worker_stop_cluster(r->w[0]), QR_OK);
    for (int i = 0; i < 2; i++) qr_worker_free(r->w[i]);
    fix_join(&r->f);
}

static int push(run *r, int i, float a, float b, unsigned flags) {
    float g[2] = {a, b};
    const float *grads[1] = {g};
    return qr_worker_push(r->w[i], 1, &r->id[i], grads, flags, NULL);
}

static const float *pull(run *r, int i) {
    assert_int_equal(qr_worker_pull(r->w[i], 1, &r->id[i], NULL), QR_OK);
    return qr_worker_var_data(r->w[i], r->id[i]);
}

static void expect_stats(run *r, const char *phrase) {
    char buf[2048];
    assert_int_equal(qr_worker_stats(r->w[0], buf, sizeof buf), QR_OK);
    if (!strstr(buf, phrase)) fprintf(stderr, "stats %s lack %s\n", buf, phrase);
    assert_non_null(strstr(buf, phrase));
}

/* A push that lands while a pull reply of the same variable is still being
 * written: with 64 KiB socket buffers a 16 MiB reply takes many writes, so
 * the ps computes the update into the variable's spare tensor
 * (qr_var_prepare_spare) instead of touching the tensor the reply reads.
 * The reply must hold the values of one moment, never a mix, and the update
 * must land exactly (gradients and deltas, lr 1). */
typedef struct big_pull {
    qr_worker *w;
    int id;
    int rc;
} big_pull;

static void *big_pull_thread(void *p) {
    big_pull *b = p;
    b->rc = qr_worker_pull(b->w, 1, &b->id, NULL);
    return NULL;
}

static void expect_all(const float *x, int64_t n, float a, float b, const char *what) {
    float first = x[0];
    if (first != a && first != b) fail_msg("%s: value %g, want %g or %g", what, first, a, b);
    for (int64_t i = 1; i < n; i++)
        if (x[i] != first) fail_msg("%s: element %lld is %g, element 0 is %g (a torn reply)",
                                    what, (long long)i, x[i], first);
}

static void test_push_while_pull_in_flight(void **state) {
    (void)state;
    run r;
    const int64_t n = 4 << 20; /* 16 MiB */
    fix_init(&r.f, 1, 2);
    qr_config_set(r.f.cfg, "lr", "1");
    qr_config_set(r.f.cfg, "socket-buffer-kb", "64");
    assert_int_equal(fix_start_ps(&r.f, 0), QR_OK);
    int64_t shape[1] = {n};
    for (int i = 0; i < 2; i++) {
        r.w[i] = fix_worker(&r.f, i);
        assert_int_equal(qr_worker_declare(r.w[i], "big", 1, shape, "zeros", 1, -1, &r.id[i]),
                         QR_OK);
        assert_int_equal(qr_worker_initialize(r.w[i]), QR_OK);
    }
    float *g = malloc((size_t)n * sizeof *g);
    const float *grads[1] = {g};
    float expect = 0.0f;
    for (int round = 0; round < 6; round++) {
        unsigned flags = round % 2 ? QR_PUSH_DELTA : 0;
        float step = (float)(round + 1);
        for (int64_t i = 0; i < n; i++) g[i] = step;
        big_pull b = {r.w[1], r.id[1], -1};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, big_pull_thread, &b), 0);
        assert_int_equal(qr_worker_push(r.w[0], 1, &r.id[0], grads, flags, NULL), QR_OK);
        float after = flags ? expect + step : expect - step;
        pthread_join(t, NULL);
        assert_int_equal(b.rc, QR_OK);
        expect_all(qr_worker_var_data(r.w[1], r.id[1]), n, expect, after, "the concurrent pull");
        assert_int_equal(qr_worker_pull(r.w[0], 1, &r.id[0], NULL), QR_OK);
        expect_all(qr_worker_var_data(r.w[0], r.id[0]), n, after, after, "the pull after");
        expect = after;
    }
    free(g);
    finish(&r);
}

/* A delta is added as it is; a gradient goes through the optimizer. */
static void test_delta_push(void **state) {
    (void)state;
    run r;
    start(&r, NULL, NULL);
    assert_int_equal(push(&r, 0, 0.25f, -2, QR_PUSH_STEP | QR_PUSH_DELTA), QR_OK);
    const float *w = pull(&r, 0);
    assert_true(w[0] == 0.25f && w[1] == -2.0f);
    assert_int_equal(push(&r, 0, 1, 1, QR_PUSH_STEP), QR_OK); /* SGD: w -= 1 * g */
    w = pull(&r, 0);
    assert_true(w[0] == -0.75f && w[1] == -3.0f);
    finish(&r);
}

/* Worker 1 pulls, worker 0 pushes twice, worker 1 pushes: its gradient
 * is 2 updates stale, recorded as such, and scaled by 1/(1 + 2). */
static void test_staleness_stamped_and_lr_scaled(void **state) {
    (void)state;
    run r;
    start(&r, "staleness-lr-scale", "true");
    pull(&r, 1);
    assert_int_equal(push(&r, 0, 1, 0, QR_PUSH_STEP), QR_OK); /* fresh: w = [-1, 0] */
    pull(&r, 0);
    assert_int_equal(push(&r, 0, 1, 0, QR_PUSH_STEP), QR_OK); /* fresh: w = [-2, 0] */
    assert_int_equal(push(&r, 1, 0, 3, QR_PUSH_STEP), QR_OK); /* stale 2: w -= 3/3 */
    const float *w = pull(&r, 0);
    assert_true(w[0] == -2.0f && w[1] == -1.0f);
    expect_stats(&r, "\"staleness\":[2,0,1,0,0,0,0,0,0]");
    finish(&r);
}

/* The learning-rate schedule counts the step pushes applied on the ps:
 * the s-th (0-based) uses lr 0.5^(s / 2), and a push without the step
 * flag does not advance s. With staleness-lr-scale the factors multiply. */
static void test_lr_decay(void **state) {
    (void)state;
    run r;
    static const char *const options[] = {"lr-decay-rate", "0.5", "lr-decay-steps", "2",
                                          "staleness-lr-scale", "true", NULL};
    start_with(&r, options);
    const float half_root = 0.70710678f; /* 0.5^(1/2) */
    pull(&r, 1);
    pull(&r, 0);
    assert_int_equal(push(&r, 0, 1, 0, QR_PUSH_STEP), QR_OK); /* s = 0: lr 1 */
    assert_float_equal(pull(&r, 0)[0], -1.0f, 1e-6);
    assert_int_equal(push(&r, 0, 1, 0, QR_PUSH_STEP), QR_OK); /* s = 1: lr 0.5^(1/2) */
    assert_float_equal(pull(&r, 0)[0], -1.0f - half_root, 1e-6);
    assert_int_equal(push(&r, 0, 1, 0, 0), QR_OK); /* no step flag: s stays 2, lr 0.5 */
    assert_float_equal(pull(&r, 0)[0], -1.5f - half_root, 1e-6);
    /* Worker 1 pulled before all three: staleness 3, lr 0.5 / (1 + 3) */
    assert_int_equal(push(&r, 1, 0, 8, QR_PUSH_STEP), QR_OK);
    assert_float_equal(pull(&r, 0)[1], -1.0f, 1e-6);
    finish(&r);
}

static void test_staleness_unscaled_by_default(void **state) {
    (void)state;
    run r;
    start(&r, NULL, NULL);
    pull(&r, 1);
    assert_int_equal(push(&r, 0, 1, 0, QR_PUSH_STEP), QR_OK);
    assert_int_equal(push(&r, 1, 0, 3, QR_PUSH_STEP), QR_OK); /* stale 1, full lr */
    const float *w = pull(&r, 0);
    assert_true(w[0] == -1.0f && w[1] == -3.0f);
    expect_stats(&r, "\"staleness\":[1,1,0,0,0,0,0,0,0]");
    finish(&r);
}

typedef struct wait_arg {
    qr_worker *w;
    volatile int done;
    int rc;
} wait_arg;

static void *wait_thread(void *p) {
    wait_arg *a = p;
    a->rc = qr_worker_wait_bound(a->w);
    a->done = 1;
    return NULL;
}

static void sleep_ms(int ms) {
    nanosleep(&(struct timespec){0, ms * 1000000L}, NULL);
}

/* max-staleness 1: worker 0 may run one step ahead of worker 1, not two;
 * it goes on when worker 1 pushes, and when worker 1 leaves. */
static void test_staleness_bound(void **state) {
    (void)state;
    run r;
    start(&r, "max-staleness", "1");
    assert_int_equal(qr_worker_wait_bound(r.w[0]), QR_OK); /* 0 - 0 <= 1 */
    assert_int_equal(push(&r, 0, 1, 0, QR_PUSH_STEP), QR_OK);
    assert_int_equal(qr_worker_wait_bound(r.w[0]), QR_OK); /* 1 - 0 <= 1 */
    assert_int_equal(push(&r, 0, 1, 0, QR_PUSH_STEP), QR_OK);
    /* 2 - 0 > 1: worker 0 waits ... */
    wait_arg a = {.w = r.w[0]};
    pthread_t t;
    pthread_create(&t, NULL, wait_thread, &a);
    sleep_ms(300);
    assert_false(a.done);
    /* ... until worker 1 makes a step: 2 - 1 <= 1. */
    assert_int_equal(push(&r, 1, 0, 1, QR_PUSH_STEP), QR_OK);
    pthread_join(t, NULL);
    assert_int_equal(a.rc, QR_OK);
    assert_int_equal(push(&r, 0, 1, 0, QR_PUSH_STEP), QR_OK);
    /* 3 - 1 > 1 again; now worker 1 leaves, and holds nobody back. */
    a.done = 0;
    pthread_create(&t, NULL, wait_thread, &a);
    sleep_ms(300);
    assert_false(a.done);
    qr_worker_free(r.w[1]);
    r.w[1] = NULL;
    pthread_join(t, NULL);
    assert_int_equal(a.rc, QR_OK);
    assert_int_equal(qr_worker_stop_cluster(r.w[0]), QR_OK);
    qr_worker_free(r.w[0]);
    fix_join(&r.f);
}

/* Sparse gradients of a (4, 2) variable: SGD with lr 1 on the touched
 * rows only, duplicate indices summed; bad ones refused, nothing changed. */
static void test_sparse_push(void **state) {
    (void)state;
    cluster_fixture f;
    fix_init(&f, 2, 1);
    qr_config_set(f.cfg, "lr", "1");
    assert_int_equal(fix_start_ps(&f, 0), QR_OK);
    assert_int_equal(fix_start_ps(&f, 1), QR_OK);
    qr_worker *w = fix_worker(&f, 0);
    int64_t shape[2] = {4, 2}, pad_shape[1] = {8};
    int pad, table, lazy;
    /* "pad" fills ps 0, so the table lives on ps 1 and the step flag rides
     * on an empty push to ps 0. */
    assert_int_equal(qr_worker_declare(w, "pad", 1, pad_shape, "zeros", 1, -1, &pad), QR_OK);
    assert_int_equal(qr_worker_declare(w, "table", 2, shape, "zeros", 1, -1, &table), QR_OK);
    assert_int_equal(qr_worker_declare_opts(w, "lazy", 2, shape, "constant:1", 1,
                                            "optimizer=adam_async,lr=0.1", &lazy), QR_OK);
    assert_int_equal(qr_worker_initialize(w), QR_OK);

    int64_t idx[3] = {2, 0, 2};
    float rows[6] = {1, 1, 2, 2, 3, 3};
    int64_t step = -1;
    assert_int_equal(qr_worker_push_sparse(w, table, 3, idx, rows, QR_PUSH_STEP, &step), QR_OK);
    assert_int_equal(step, 1);
    assert_int_equal(qr_worker_pull(w, 1, &table, NULL), QR_OK);
    const float *t = qr_worker_var_data(w, table);
    const float want[8] = {-2, -2, 0, 0, -4, -4, 0, 0}; /* row 2: -(1 + 3) */
    assert_memory_equal(t, want, sizeof want);

    int64_t bad_idx[1] = {4};
    assert_int_equal(qr_worker_push_sparse(w, table, 1, bad_idx, rows, 0, NULL), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "row index 4 is out of range [0, 4)"));
    float nan_rows[2] = {1, 0.0f / 0.0f};
    assert_int_equal(qr_worker_push_sparse(w, table, 1, idx, nan_rows, 0, NULL), QR_ENONFINITE);
    assert_int_equal(qr_worker_push_sparse(w, table, 0, NULL, NULL, 0, NULL), QR_OK);
    /* A sparse delta is added as it is. */
    int64_t one[1] = {3};
    float delta[2] = {0.5f, -0.5f};
    assert_int_equal(qr_worker_push_sparse(w, table, 1, one, delta, QR_PUSH_DELTA, NULL), QR_OK);
    assert_int_equal(qr_worker_pull(w, 1, &table, NULL), QR_OK);
    const float want2[8] = {-2, -2, 0, 0, -4, -4, 0.5f, -0.5f};
    assert_memory_equal(t, want2, sizeof want2);

    /* Lazy AdamAsync: only row 1 moves (by about lr, Adam's first step). */
    int64_t r1[1] = {1};
    float g1[2] = {5, -5};
    assert_int_equal(qr_worker_push_sparse(w, lazy, 1, r1, g1, 0, NULL), QR_OK);
    assert_int_equal(qr_worker_pull(w, 1, &lazy, NULL), QR_OK);
    const float *l = qr_worker_var_data(w, lazy);
    for (int r = 0; r < 4; r++)
        for (int e = 0; e < 2; e++) {
            float expect = r != 1 ? 1.0f : e == 0 ? 0.9f : 1.1f;
            assert_float_equal(l[r * 2 + e], expect, 1e-5);
        }
    assert_int_equal(qr_worker_stop_cluster(w), QR_OK);
    qr_worker_free(w);
    fix_join(&f);
}

/* A step-flagged sparse push to a variable on ps 1 advances ps 1's
 * applied steps (the learning-rate decay and Adam's t there) as a dense
 * one does, and the global step once. lr = 0.5^s with s the steps applied
 * on the variable's ps before the push. */
static void test_sparse_push_advances_its_ps(void **state) {
    (void)state;
    cluster_fixture f;
    fix_init(&f, 2, 1);
    static const char *const options[] = {"lr", "1", "lr-decay-rate", "0.5", "lr-decay-steps",
                                          "1", NULL};
    for (int k = 0; options[k]; k += 2)
        assert_int_equal(qr_config_set(f.cfg, options[k], options[k + 1]), QR_OK);
    assert_int_equal(fix_start_ps(&f, 0), QR_OK);
    assert_int_equal(fix_start_ps(&f, 1), QR_OK);
    qr_worker *w = fix_worker(&f, 0);
    int64_t shape[2] = {2, 1}, pad_shape[1] = {8};
    int pad, table;
    assert_int_equal(qr_worker_declare(w, "pad", 1, pad_shape, "zeros", 1, -1, &pad), QR_OK);
    assert_int_equal(qr_worker_declare(w, "table", 2, shape, "zeros", 1, -1, &table), QR_OK);
    assert_int_equal(qr_worker_initialize(w), QR_OK);
    int64_t row[1] = {0};
    float g[1] = {1};
    int64_t step = -1;
    assert_int_equal(qr_worker_push_sparse(w, table, 1, row, g, QR_PUSH_STEP, &step), QR_OK);
    assert_int_equal(step, 1);
    assert_int_equal(qr_worker_push_sparse(w, table, 1, row, g, QR_PUSH_STEP, &step), QR_OK);
    assert_int_equal(step, 2);
    assert_int_equal(qr_worker_pull(w, 1, &table, NULL), QR_OK);
    /* s = 0 then s = 1 on ps 1: -1 - 0.5. (Stuck at s = 0 it would be -2.) */
    assert_float_equal(qr_worker_var_data(w, table)[0], -1.5f, 1e-6);
    assert_int_equal(qr_worker_stop_cluster(w), QR_OK);
    qr_worker_free(w);
    fix_join(&f);
}

/* Pushes of a variable of 8 MiB or more are applied while they arrive
 * (src/ps/fused_apply.c), from a real worker (whose large pushes are
 * spliced over Unix sockets) to each of 2 ps tasks; the values are exact
 * and qr_worker_stats sums the count over the ps tasks. */
/* A fused push-and-pull (qr_worker_push_pull), SGD lr 1: the reply brings
 * the values as this push left them, into the caller's buffer or the
 * worker's copy; the other worker's earlier push is in them, its later
 * one is not. Bad calls are refused. */
static void test_push_pull(void **state) {
    (void)state;
    run r;
    start(&r, NULL, NULL);
    float g0[2] = {1, 2}, g1[2] = {10, 20}, out[2] = {0, 0};
    const float *grads0[1] = {g0}, *grads1[1] = {g1};
    float *into[1] = {out};
    int64_t step = -1;
    assert_int_equal(qr_worker_push_pull(r.w[0], 1, &r.id[0], grads0, into, QR_PUSH_STEP, &step),
                     QR_OK);
    assert_int_equal(step, 1);
    assert_true(out[0] == -1.0f && out[1] == -2.0f);
    assert_int_equal(qr_worker_push_pull(r.w[1], 1, &r.id[1], grads1, NULL, QR_PUSH_STEP, &step),
                     QR_OK);
    assert_int_equal(step, 2);
    const float *copy = qr_worker_var_data(r.w[1], r.id[1]);
    assert_true(copy[0] == -11.0f && copy[1] == -22.0f);
    /* Worker 0's copy is untouched by its fused call into `out`. */
    assert_true(qr_worker_var_data(r.w[0], r.id[0])[0] == 0.0f);
    assert_int_equal(qr_worker_push_pull(r.w[0], 0, &r.id[0], grads0, into, 0, NULL), QR_EINVAL);
    finish(&r);
}

/* Non-blocking calls, SGD lr 1: 16 pushes in flight, a blocking call and a
 * pull among them; each ps answers in order, so the pull sent after the
 * pushes sees them all and the steps come back 1..16. A fused one too.
 * Misuse is refused. */
static void test_requests_in_flight(void **state) {
    (void)state;
    run r;
    start(&r, NULL, NULL);
    enum { N = 16 };
    float g[2] = {1, 1}, seen[2] = {0, 0}, fused[2] = {0, 0};
    const float *grads[1] = {g};
    float *into[1] = {seen}, *fused_into[1] = {fused};
    qr_request *req[N + 2];
    for (int k = 0; k < N; k++)
        assert_int_equal(qr_worker_push_start(r.w[0], 1, &r.id[0], grads, QR_PUSH_STEP, &req[k]),
                         QR_OK);
    assert_int_equal(qr_worker_pull_start(r.w[0], 1, &r.id[0], into, &req[N]), QR_OK);
    int64_t step = -1;
    assert_int_equal(qr_worker_global_step(r.w[1], &step), QR_OK); /* another worker meanwhile */
    assert_int_equal(qr_worker_push_pull_start(r.w[0], 1, &r.id[0], grads, fused_into, 0,
                                               &req[N + 1]), QR_OK);
    for (int k = 0; k < N; k++) {
        assert_int_equal(qr_request_wait(req[k], &step), QR_OK);
        assert_int_equal(step, k + 1);
    }
    assert_int_equal(qr_request_wait(req[N], NULL), QR_OK);
    assert_true(seen[0] == -16.0f && seen[1] == -16.0f);
    assert_int_equal(qr_request_wait(req[N + 1], &step), QR_OK);
    assert_true(fused[0] == -17.0f && fused[1] == -17.0f);
    /* Misuse. */
    qr_request *bad = (qr_request *)1;
    assert_int_equal(qr_worker_push_start(r.w[0], 1, &r.id[0], grads, 0, NULL), QR_EINVAL);
    assert_int_equal(qr_worker_pull_start(r.w[0], 1, (int[]){99}, NULL, &bad), QR_ENOTFOUND);
    assert_null(bad);
    assert_int_equal(qr_request_wait(NULL, NULL), QR_EINVAL);
    int64_t row = 0;
    assert_int_equal(qr_worker_add_rows(r.w[0], r.id[0], 1, &row, (float[]){1, 1}), QR_OK);
    assert_int_equal(qr_worker_push_start(r.w[0], 1, &r.id[0], grads, 0, &bad), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "blocking qr_worker_push"));
    finish(&r);
}

/* Adam over 2 ps, 3 steps of variables "a" and "b" (placed on different
 * ps): pushed together with QR_PUSH_STEP, or one variable at a time in
 * flight without it and then a tick (QR_PUSH_EVERY_PS | QR_PUSH_STEP), as
 * quorum.torch overlaps pushes with backprop. Adam's t is the same in
 * both, so the values are equal bit for bit, and so is the global step. */
static void adam_steps(bool per_variable, float out[8], int64_t *global_step) {
    world s;
    static const char *const opts[] = {"optimizer", "adam", "lr", "0.1", NULL};
    world_start(&s, 2, 1, opts);
    int64_t shape[1] = {4};
    int id[2];
    assert_int_equal(qr_worker_declare(s.w[0], "a", 1, shape, "uniform:-1,1", 1, -1, &id[0]), QR_OK);
    assert_int_equal(qr_worker_declare(s.w[0], "b", 1, shape, "uniform:-1,1", 2, -1, &id[1]), QR_OK);
    world_init_all(&s);
    int ps_a, ps_b;
    assert_int_equal(qr_worker_var_placement(s.w[0], id[0], 1, &ps_a, NULL, NULL), 1);
    assert_int_equal(qr_worker_var_placement(s.w[0], id[1], 1, &ps_b, NULL, NULL), 1);
    assert_int_not_equal(ps_a, ps_b);
    for (int step = 0; step < 3; step++) {
        float ga[4], gb[4];
        for (int i = 0; i < 4; i++) ga[i] = (float)(i + 1) * 0.3f - (float)step, gb[i] = 0.5f - (float)i;
        const float *grads[2] = {ga, gb};
        if (!per_variable) {
            assert_int_equal(qr_worker_push(s.w[0], 2, id, grads, QR_PUSH_STEP, global_step), QR_OK);
            continue;
        }
        qr_request *req[2];
        for (int v = 0; v < 2; v++)
            assert_int_equal(qr_worker_push_start(s.w[0], 1, &id[v], &grads[v], 0, &req[v]), QR_OK);
        for (int v = 0; v < 2; v++) assert_int_equal(qr_request_wait(req[v], NULL), QR_OK);
        assert_int_equal(qr_worker_push(s.w[0], 0, NULL, NULL, QR_PUSH_STEP | QR_PUSH_EVERY_PS,
                                        global_step), QR_OK);
    }
    assert_int_equal(qr_worker_pull(s.w[0], 2, id, (float *[]){out, out + 4}), QR_OK);
    world_finish(&s);
}

static void test_step_tick(void **state) {
    (void)state;
    float together[8], apart[8];
    int64_t step_together = -1, step_apart = -1;
    adam_steps(false, together, &step_together);
    adam_steps(true, apart, &step_apart);
    assert_memory_equal(apart, together, sizeof together);
    assert_int_equal(step_together, 3);
    assert_int_equal(step_apart, 3);
}

/* Workers that finish say so (qr_worker_leave): once every worker has,
 * ps 0 ends the run in order by itself (no chief's STOP, no launcher), and
 * not before; a worker that comes back after leaving counts again. */
static void test_every_worker_finished_ends_the_run(void **state) {
    (void)state;
    run r;
    start(&r, "restart-wait-ms", "600000");
    assert_int_equal(push(&r, 1, 1, 1, 0), QR_OK);
    assert_int_equal(qr_worker_leave(r.w[1]), QR_OK);
    qr_worker_free(r.w[1]);
    /* Worker 1 again (a restart): it trains, so worker 0 leaving is not the end. */
    r.w[1] = fix_worker(&r.f, 1);
    int64_t shape[1] = {2};
    assert_int_equal(qr_worker_declare(r.w[1], "w", 1, shape, "zeros", 1, -1, &r.id[1]), QR_OK);
    assert_int_equal(qr_worker_initialize(r.w[1]), QR_OK);
    assert_int_equal(qr_worker_leave(r.w[0]), QR_OK);
    qr_worker_free(r.w[0]);
    assert_int_equal(push(&r, 1, 1, 1, 0), QR_OK);
    assert_int_equal(qr_worker_pull(r.w[1], 1, &r.id[1], NULL), QR_OK);
    const float *w = qr_worker_var_data(r.w[1], r.id[1]);
    assert_true(w[0] == -2.0f && w[1] == -2.0f);
    assert_int_equal(qr_worker_leave(r.w[1]), QR_OK);
    qr_worker_free(r.w[1]);
    fix_join(&r.f); /* returns: the ps stopped by itself */
    assert_int_equal(r.f.run_status[0], QR_OK);
}

static void test_large_pushes_applied_on_arrival(void **state) {
    (void)state;
    cluster_fixture f;
    fix_init(&f, 2, 1);
    qr_config_set(f.cfg, "lr", "0.5");
    for (int i = 0; i < 2; i++) assert_int_equal(fix_start_ps(&f, i), QR_OK);
    qr_worker *w = fix_worker(&f, 0);
    enum { N = 5 << 19 }; /* 2.5M floats: 10 MiB each */
    int64_t shape[1] = {N};
    int id[2];
    assert_int_equal(qr_worker_declare(w, "a", 1, shape, "zeros", 1, -1, &id[0]), QR_OK);
    assert_int_equal(qr_worker_declare(w, "b", 1, shape, "zeros", 1, -1, &id[1]), QR_OK);
    assert_int_equal(qr_worker_initialize(w), QR_OK);
    float *ga = malloc(N * sizeof *ga), *gb = malloc(N * sizeof *gb);
    for (int64_t i = 0; i < N; i++) {
        ga[i] = (float)(i % 5);
        gb[i] = -2.0f;
    }
    const float *grads[2] = {ga, gb};
    for (int k = 0; k < 2; k++)
        assert_int_equal(qr_worker_push(w, 2, id, grads, QR_PUSH_STEP, NULL), QR_OK);
    assert_int_equal(qr_worker_pull(w, 2, id, NULL), QR_OK);
    const float *a = qr_worker_var_data(w, id[0]), *b = qr_worker_var_data(w, id[1]);
    for (int64_t i = 0; i < N; i++)
        if (a[i] != -(float)(i % 5) || b[i] != 2.0f)
            fail_msg("element %lld: a %g b %g", (long long)i, a[i], b[i]);
    char buf[2048];
    assert_int_equal(qr_worker_stats(w, buf, sizeof buf), QR_OK);
    if (!strstr(buf, "\"applied_on_arrival\":4,")) fail_msg("stats: %s", buf);
    assert_int_equal(qr_worker_stop_cluster(w), QR_OK);
    qr_worker_free(w);
    fix_join(&f);
    free(ga);
    free(gb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_delta_push),
        cmocka_unit_test(test_push_while_pull_in_flight),
        cmocka_unit_test(test_staleness_stamped_and_lr_scaled),
        cmocka_unit_test(test_staleness_unscaled_by_default),
        cmocka_unit_test(test_lr_decay),
        cmocka_unit_test(test_staleness_bound),
        cmocka_unit_test(test_sparse_push),
        cmocka_unit_test(test_sparse_push_advances_its_ps),
        cmocka_unit_test(test_large_pushes_applied_on_arrival),
        cmocka_unit_test(test_every_worker_finished_ends_the_run),
        cmocka_unit_test(test_push_pull),
        cmocka_unit_test(test_requests_in_flight),
        cmocka_unit_test(test_step_tick),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

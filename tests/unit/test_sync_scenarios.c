/*
 * test_sync_scenarios.c - synchronous replicas, trace by trace.
 *
 * Each scenario drives several worker handles step by step against a real
 * ps (on a thread, over loopback sockets), in an order the test fixes, and
 * checks the variable, the steps and the statistics against values worked
 * out by hand in the comments. The variable is "w" = [0, 0], the optimizer
 * SGD with lr 1, so after a step w -= mean(gradients of its quorum).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <time.h>

#include "cluster_fixture.h"

typedef struct scenario {
    cluster_fixture f;
    qr_worker *w[FIX_MAX_WORKERS];
    int id[FIX_MAX_WORKERS];
} scenario;

/* Extra options for the next start(): key, value, ..., NULL. */
static const char *const *extra;

/* A 1-ps cluster of n workers in sync mode with R and init_tokens (-1 =
 * default); every worker declares w = [0, 0] and is initialized. */
static void start(scenario *s, int n, int R, int init_tokens) {
    fix_init(&s->f, 1, n);
    for (int k = 0; extra && extra[k]; k += 2)
        assert_int_equal(qr_config_set(s->f.cfg, extra[k], extra[k + 1]), QR_OK);
    char buf[32];
    qr_config_set(s->f.cfg, "mode", "sync");
    qr_config_set(s->f.cfg, "lr", "1");
    snprintf(buf, sizeof buf, "%d", R);
    qr_config_set(s->f.cfg, "replicas-to-aggregate", buf);
    snprintf(buf, sizeof buf, "%d", init_tokens);
    qr_config_set(s->f.cfg, "init-tokens", buf);
    assert_int_equal(fix_start_ps(&s->f, 0), QR_OK);
    int64_t shape[1] = {2};
    for (int i = 0; i < n; i++) {
        s->w[i] = fix_worker(&s->f, i);
        assert_non_null(s->w[i]);
        assert_int_equal(qr_worker_declare(s->w[i], "w", 1, shape, "zeros", 1, -1, &s->id[i]),
                         QR_OK);
        assert_int_equal(qr_worker_initialize(s->w[i]), QR_OK);
    }
}

static void finish(scenario *s) {
    assert_int_equal(qr_worker_stop_cluster(s->w[0]), QR_OK);
    for (int i = 0; i < s->f.nworkers; i++) qr_worker_free(s->w[i]);
    fix_join(&s->f);
}

static int push(scenario *s, int i, float g0, float g1) {
    float g[2] = {g0, g1};
    const float *grads[1] = {g};
    return qr_worker_push(s->w[i], 1, &s->id[i], grads, 0, NULL);
}

static int64_t token(scenario *s, int i) {
    int64_t step = -1;
    int rc = qr_worker_take_token(s->w[i], &step);
    if (rc) fprintf(stderr, "take_token: %s\n", qr_last_error());
    assert_int_equal(rc, QR_OK);
    return step;
}

static void expect_w(scenario *s, float a, float b) {
    assert_int_equal(qr_worker_pull(s->w[0], 1, &s->id[0], NULL), QR_OK);
    const float *w = qr_worker_var_data(s->w[0], s->id[0]);
    if (w[0] != a || w[1] != b) fprintf(stderr, "w = [%g, %g], expected [%g, %g]\n", w[0], w[1], a, b);
    assert_true(w[0] == a && w[1] == b);
}

static int64_t global_step(scenario *s) {
    int64_t g = -1;
    assert_int_equal(qr_worker_global_step(s->w[0], &g), QR_OK);
    return g;
}

static void expect_stats(scenario *s, const char *phrase) {
    char buf[2048];
    assert_int_equal(qr_worker_stats(s->w[0], buf, sizeof buf), QR_OK);
    if (!strstr(buf, phrase)) fprintf(stderr, "stats %s lack %s\n", buf, phrase);
    assert_non_null(strstr(buf, phrase));
}

/* R = N = 2 with TensorFlow's init tokens (R = 2): the second round after
 * start-up is wasted, every gradient in it stale. */
static void test_tensorflow_init_tokens_waste_second_round(void **state) {
    (void)state;
    scenario s;
    start(&s, 2, 2, 2);
    assert_int_equal(push(&s, 0, 1, 0), QR_OK);
    assert_int_equal(push(&s, 1, 0, 1), QR_OK);
    /* step 0 = mean([1,0], [0,1]) = [0.5, 0.5] */
    expect_w(&s, -0.5f, -0.5f);
    assert_int_equal(global_step(&s), 1);
    /* Both take an initial token, which carries step 0 ... */
    assert_int_equal(token(&s, 0), 0);
    assert_int_equal(token(&s, 1), 0);
    /* ... so their next gradients are stale and dropped, and reported. */
    assert_int_equal(push(&s, 0, 100, 100), QR_ESTALE);
    assert_non_null(strstr(qr_last_error(), "dropped: stale"));
    assert_int_equal(push(&s, 1, 100, 100), QR_ESTALE);
    expect_w(&s, -0.5f, -0.5f);
    /* The tokens of step 1 come next. */
    assert_int_equal(token(&s, 0), 1);
    assert_int_equal(token(&s, 1), 1);
    assert_int_equal(push(&s, 0, 2, 0), QR_OK);
    assert_int_equal(push(&s, 1, 0, 2), QR_OK);
    /* step 1 = mean([2,0], [0,2]) = [1, 1] */
    expect_w(&s, -1.5f, -1.5f);
    assert_int_equal(global_step(&s), 2);
    expect_stats(&s, "\"stale_dropped\":2");
    expect_stats(&s, "\"in_quorum\":[2,2]");
    finish(&s);
}

/* quorum's default init tokens, max(0, R - N) = 0 with R = N = 2: strict
 * lockstep, no wasted round. */
static void test_default_init_tokens_lockstep(void **state) {
    (void)state;
    scenario s;
    start(&s, 2, 2, -1);
    assert_int_equal(push(&s, 0, 1, 0), QR_OK);
    assert_int_equal(push(&s, 1, 0, 1), QR_OK);
    assert_int_equal(token(&s, 0), 1);
    assert_int_equal(token(&s, 1), 1);
    assert_int_equal(push(&s, 0, 2, 0), QR_OK);
    assert_int_equal(push(&s, 1, 0, 2), QR_OK);
    expect_w(&s, -1.5f, -1.5f);
    expect_stats(&s, "\"stale_dropped\":0");
    finish(&s);
}

/* R = 2, N = 3 (one backup): the first two gradients make the step; the
 * third is stale, dropped, and its worker still gets a token. */
static void test_backup_worker_dropped(void **state) {
    (void)state;
    scenario s;
    start(&s, 3, 2, -1);
    assert_int_equal(push(&s, 2, 1, 0), QR_OK);
    assert_int_equal(push(&s, 0, 0, 1), QR_OK);
    /* step 0 = mean([1,0], [0,1]); worker 1 is late */
    assert_int_equal(push(&s, 1, 10, 10), QR_ESTALE);
    expect_w(&s, -0.5f, -0.5f);
    for (int i = 0; i < 3; i++) assert_int_equal(token(&s, i), 1);
    expect_stats(&s, "\"in_quorum\":[1,0,1]");
    expect_stats(&s, "\"stale_by_worker\":[0,1,0]");
    finish(&s);
}

/* R = 3, N = 2: the default init tokens are R - N = 1, so a worker
 * computes a second batch for step 0. The step reduces in (worker, seq)
 * order: worker 0's two pushes, then worker 1's. */
static void test_fewer_workers_than_replicas(void **state) {
    (void)state;
    scenario s;
    start(&s, 2, 3, -1);
    assert_int_equal(push(&s, 0, 3, 0), QR_OK);
    assert_int_equal(push(&s, 1, 3, 3), QR_OK);
    assert_int_equal(global_step(&s), 0); /* 2 of 3 */
    assert_int_equal(token(&s, 0), 0);    /* the initial token */
    assert_int_equal(push(&s, 0, 0, 3), QR_OK);
    /* step 0 = ([3,0] + [0,3] + [3,3]) / 3 = [2, 2] */
    expect_w(&s, -2.0f, -2.0f);
    assert_int_equal(global_step(&s), 1);
    assert_int_equal(token(&s, 1), 1);
    assert_int_equal(token(&s, 0), 1);
    expect_stats(&s, "\"in_quorum\":[2,1]");
    finish(&s);
}

/* Fewer initial tokens than R - N cannot finish step 0: refused. */
static void test_too_few_init_tokens_refused(void **state) {
    (void)state;
    cluster_fixture f;
    fix_init(&f, 1, 2);
    qr_config_set(f.cfg, "mode", "sync");
    qr_config_set(f.cfg, "replicas-to-aggregate", "3");
    qr_config_set(f.cfg, "init-tokens", "0");
    assert_int_equal(fix_start_ps(&f, 0), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(),
                           "too few tokens to finish the first step: 0 (given) vs 1 (needed)"));
    qr_config_free(f.cfg);
}

/* R = 2, N = 3, worker 2 slow: tokens are not tied to workers, so the fast
 * worker 0 takes the token released for worker 2 and makes step 1 alone. */
static void test_fast_worker_takes_slow_workers_token(void **state) {
    (void)state;
    scenario s;
    start(&s, 3, 2, -1);
    assert_int_equal(push(&s, 0, 1, 0), QR_OK);
    assert_int_equal(push(&s, 1, 0, 1), QR_OK);
    /* step 0 = [0.5, 0.5]; 3 tokens of step 1: workers 0 and 1 hold a place
     * for two, the third is free */
    assert_int_equal(token(&s, 0), 1);
    assert_int_equal(push(&s, 0, 2, 0), QR_OK);
    assert_int_equal(token(&s, 0), 1); /* worker 2's token */
    assert_int_equal(push(&s, 0, 0, 2), QR_OK);
    /* step 1 = mean([2,0], [0,2]) = [1, 1], both from worker 0 */
    expect_w(&s, -1.5f, -1.5f);
    assert_int_equal(global_step(&s), 2);
    /* Worker 1 comes back with its step-1 token: its gradient is stale. */
    assert_int_equal(token(&s, 1), 1);
    assert_int_equal(push(&s, 1, 50, 50), QR_ESTALE);
    /* The slow worker's step-0 gradient is stale too; it gets a step-2 token. */
    assert_int_equal(push(&s, 2, 70, 70), QR_ESTALE);
    assert_int_equal(token(&s, 2), 2);
    expect_w(&s, -1.5f, -1.5f);
    expect_stats(&s, "\"in_quorum\":[3,1,0]");
    finish(&s);
}

typedef struct take_arg {
    qr_worker *w;
    int rc;
    char msg[1024];
} take_arg;

static void *take_thread(void *p) {
    take_arg *a = p;
    int64_t step;
    a->rc = qr_worker_take_token(a->w, &step);
    snprintf(a->msg, sizeof a->msg, "%s", qr_last_error());
    return NULL;
}

/* The chief ends training while a worker waits for a token: the wait ends
 * with "stopped" and nothing stays blocked. */
static void test_stop_ends_token_waits(void **state) {
    (void)state;
    scenario s;
    start(&s, 2, 2, -1);
    assert_int_equal(push(&s, 1, 1, 1), QR_OK);
    take_arg a = {.w = s.w[1]};
    pthread_t t;
    pthread_create(&t, NULL, take_thread, &a);
    nanosleep(&(struct timespec){0, 200 * 1000000}, NULL);
    assert_int_equal(qr_worker_stop_cluster(s.w[0]), QR_OK);
    pthread_join(t, NULL);
    assert_int_equal(a.rc, QR_ESTOPPED);
    for (int i = 0; i < 2; i++) qr_worker_free(s.w[i]);
    fix_join(&s.f);
    assert_int_equal(s.f.run_status[0], QR_OK);
}

/* A worker disappears with R = N = 2: the ps reports which worker is
 * missing, and after sync-timeout-ms ends the waits with that report. */
static void test_missing_worker_stall_report_and_abort(void **state) {
    (void)state;
    scenario s;
    fix_init(&s.f, 1, 2);
    qr_config_set(s.f.cfg, "mode", "sync");
    qr_config_set(s.f.cfg, "lr", "1");
    qr_config_set(s.f.cfg, "sync-timeout-ms", "1500");
    qr_config_set(s.f.cfg, "stall-report-ms", "500");
    assert_int_equal(fix_start_ps(&s.f, 0), QR_OK);
    int64_t shape[1] = {2};
    for (int i = 0; i < 2; i++) {
        s.w[i] = fix_worker(&s.f, i);
        assert_int_equal(qr_worker_declare(s.w[i], "w", 1, shape, "zeros", 1, -1, &s.id[i]), QR_OK);
        assert_int_equal(qr_worker_initialize(s.w[i]), QR_OK);
    }
    qr_worker_free(s.w[1]); /* worker 1 is gone */
    assert_int_equal(push(&s, 0, 1, 1), QR_OK);
    take_arg a = {.w = s.w[0]};
    pthread_t t;
    pthread_create(&t, NULL, take_thread, &a);
    pthread_join(t, NULL);
    assert_int_equal(a.rc, QR_EABORTED);
    fprintf(stderr, "abort message: %s\n", a.msg);
    assert_non_null(strstr(a.msg, "only 1 of 2 workers are alive"));
    assert_non_null(strstr(a.msg, "worker 1 (disconnected"));
    assert_non_null(strstr(a.msg, "with 1 of 2 gradients"));
    qr_worker_free(s.w[0]);
    fix_join(&s.f);
    assert_int_equal(s.f.run_status[0], QR_EABORTED);
}

/* R = 2, N = 3, each worker going through its own data: a worker that has
 * finished says so (qr_worker_leave) and the others go on without it;
 * once those left cannot make a step of R gradients, ps 0 ends the run in
 * order and the last worker's wait ends with "stopped" and the reason,
 * instead of waiting out restart-wait-ms and aborting. */
static void test_finished_workers_end_the_run(void **state) {
    (void)state;
    scenario s;
    static const char *const long_wait[] = {"restart-wait-ms", "600000", NULL};
    extra = long_wait;
    start(&s, 3, 2, -1);
    extra = NULL;
    assert_int_equal(push(&s, 0, 1, 0), QR_OK);
    assert_int_equal(push(&s, 2, 0, 1), QR_OK);
    for (int i = 0; i < 3; i += 2) assert_int_equal(token(&s, i), 1);
    assert_int_equal(qr_worker_leave(s.w[0]), QR_OK);
    assert_int_equal(qr_worker_leave(s.w[0]), QR_OK); /* said twice: counted once */
    qr_worker_free(s.w[0]);
    s.w[0] = s.w[1]; /* expect_w and friends ask through worker 0 */
    /* Workers 1 and 2 still make a quorum: step 1 = mean([2,0], [0,2]). */
    assert_int_equal(push(&s, 1, 2, 0), QR_ESTALE); /* its step-0 gradient, late */
    assert_int_equal(token(&s, 1), 1);
    assert_int_equal(push(&s, 1, 2, 0), QR_OK);
    assert_int_equal(push(&s, 2, 0, 2), QR_OK);
    expect_w(&s, -1.5f, -1.5f);
    assert_int_equal(global_step(&s), 2);
    assert_int_equal(token(&s, 2), 2);
    /* Worker 1 has a gradient in step 2 (1 of 2); worker 2 finishes. */
    assert_int_equal(token(&s, 1), 2);
    assert_int_equal(push(&s, 1, 5, 5), QR_OK);
    assert_int_equal(qr_worker_leave(s.w[2]), QR_OK);
    int64_t step = -1;
    int rc = qr_worker_take_token(s.w[1], &step);
    if (rc == QR_OK) rc = push(&s, 1, 5, 5);
    fprintf(stderr, "worker 1's next calls: %s\n", qr_last_error());
    assert_int_equal(rc, QR_ESTOPPED);
    assert_non_null(strstr(qr_last_error(), "workers 0, 2 finished, and the 1 still training "
                                            "cannot make a step of 2 gradients (global step 2): "
                                            "training is over"));
    qr_worker_free(s.w[1]);
    qr_worker_free(s.w[2]);
    fix_join(&s.f);
    assert_int_equal(s.f.run_status[0], QR_OK);
}

/* R = N = 2: one worker finishing ends the run at once; the other's next
 * call says why. */
static void test_leave_then_come_back(void **state) {
    (void)state;
    scenario s;
    start(&s, 2, 2, -1);
    assert_int_equal(qr_worker_leave(NULL), QR_EINVAL);
    qr_request *req = NULL; /* a sync push is committed whole: no push_start */
    const float *g[1] = {(float[]){1, 1}};
    assert_int_equal(qr_worker_push_start(s.w[0], 1, &s.id[0], g, 0, &req), QR_EINVAL);
    assert_null(req);
    assert_int_equal(qr_worker_leave(s.w[1]), QR_OK);
    qr_worker_free(s.w[1]);
    /* 1 of 2 training, R = 2: the run has ended. */
    int64_t step = -1;
    int rc = qr_worker_push(s.w[0], 1, &s.id[0], (const float *const[]){(float[]){1, 1}}, 0, &step);
    if (rc == QR_OK) rc = qr_worker_take_token(s.w[0], &step);
    assert_int_equal(rc, QR_ESTOPPED);
    assert_non_null(strstr(qr_last_error(), "worker 1 finished"));
    qr_worker_free(s.w[0]);
    fix_join(&s.f);
    assert_int_equal(s.f.run_status[0], QR_OK);
}

/* A gradient with NaN or Inf (nonfinite=error, the default) is refused
 * as it arrives, with QR_ENONFINITE naming the variable: it is no part of
 * any step, and the variable stays as it was until a quorum of finite
 * gradients makes the step. R = N = 2. */
static void test_nonfinite_push_refused(void **state) {
    (void)state;
    scenario s;
    start(&s, 2, 2, -1);
    assert_int_equal(push(&s, 0, NAN, 1), QR_ENONFINITE);
    assert_non_null(strstr(qr_last_error(),
                           "the gradient of variable 'w' contains NaN or Inf; the push was refused"));
    assert_int_equal(push(&s, 1, 0, 2), QR_OK);
    assert_int_equal(push(&s, 1, 0, INFINITY), QR_ENONFINITE);
    /* one gradient of the two the step needs */
    assert_int_equal(global_step(&s), 0);
    expect_w(&s, 0.0f, 0.0f);
    assert_int_equal(push(&s, 0, 2, 0), QR_OK);
    /* step 0 = mean([0,2], [2,0]) = [1, 1]: the refused ones left no trace */
    expect_w(&s, -1.0f, -1.0f);
    assert_int_equal(global_step(&s), 1);
    finish(&s);
}

/* nonfinite=skip: the push is accepted, its gradient counts as a zero in
 * the step's mean (the divisor is still R) and is counted. */
static void test_nonfinite_push_skipped(void **state) {
    (void)state;
    scenario s;
    static const char *const skip[] = {"nonfinite", "skip", NULL};
    extra = skip;
    start(&s, 2, 2, -1);
    extra = NULL;
    assert_int_equal(push(&s, 0, NAN, 1), QR_OK);
    assert_int_equal(push(&s, 1, 0, 2), QR_OK);
    /* step 0 = ([0,0] + [0,2]) / 2 */
    expect_w(&s, 0.0f, -1.0f);
    assert_int_equal(global_step(&s), 1);
    finish(&s);
}

/* A dense variable one member pushes rows of and the other a dense
 * gradient: the rows are scattered into a dense sum with the gradient,
 * then the mean is applied densely. */
static void test_dense_and_rows_of_one_variable(void **state) {
    (void)state;
    scenario s;
    start(&s, 2, 2, -1);
    assert_int_equal(push(&s, 0, 1, 2), QR_OK);
    int64_t row0[1] = {0};
    const float rows[2] = {3, 6};
    assert_int_equal(qr_worker_push_sparse(s.w[1], s.id[1], 1, row0, rows, 0, NULL), QR_OK);
    /* step 0 = ([1,2] + [3,6]) / 2 = [2, 4] */
    expect_w(&s, -2.0f, -4.0f);
    finish(&s);
}

/* Moving averages: after each step, with num_updates = the new global
 * step t, d = min(decay, (1 + t) / (10 + t)) and avg -= (1 - d)(avg - w). */
static void test_moving_averages(void **state) {
    (void)state;
    scenario s;
    static const char *const average[] = {"moving-average-decay", "0.9", NULL};
    extra = average;
    start(&s, 1, 1, -1);
    extra = NULL;
    float avg[2] = {0, 0}, w[2] = {0, 0};
    const float g[2][2] = {{1, 2}, {1, 0}};
    for (int t = 1; t <= 2; t++) {
        assert_int_equal(push(&s, 0, g[t - 1][0], g[t - 1][1]), QR_OK);
        assert_int_equal(token(&s, 0), t);
        float d = (float)(1 + t) / (float)(10 + t); /* 2/11, then 3/12: below 0.9 */
        for (int i = 0; i < 2; i++) {
            w[i] -= g[t - 1][i];
            avg[i] -= (1.0f - d) * (avg[i] - w[i]);
        }
    }
    /* t = 1: avg = -(9/11)[1, 2]; t = 2: w = [-2, -2], avg moves 3/4 of the way */
    float got[2];
    float *dst[1] = {got};
    assert_int_equal(qr_worker_pull_averages(s.w[0], 1, &s.id[0], dst), QR_OK);
    for (int i = 0; i < 2; i++) assert_float_equal(got[i], avg[i], 1e-6);
    expect_w(&s, -2.0f, -2.0f);
    finish(&s);
}

/* The learning-rate schedule in sync mode counts global steps: step s
 * (0-based) applies the mean gradient with lr * 0.5^(s / 2), and with
 * staircase lr * 0.5^floor(s / 2). R = N = 2, lr 1, g = [1, 0] from each. */
static void run_decay(bool staircase, const float *expect) {
    scenario s;
    static const char *const smooth[] = {"lr-decay-rate", "0.5", "lr-decay-steps", "2", NULL};
    static const char *const stairs[] = {"lr-decay-rate", "0.5", "lr-decay-steps", "2",
                                         "lr-decay-staircase", "true", NULL};
    extra = staircase ? stairs : smooth;
    start(&s, 2, 2, -1);
    extra = NULL;
    for (int step = 0; step < 4; step++) {
        for (int i = 0; i < 2; i++) assert_int_equal(push(&s, i, 1, 0), QR_OK);
        for (int i = 0; i < 2; i++) assert_int_equal(token(&s, i), step + 1);
        assert_int_equal(qr_worker_pull(s.w[0], 1, &s.id[0], NULL), QR_OK);
        assert_float_equal(qr_worker_var_data(s.w[0], s.id[0])[0], expect[step], 1e-6);
    }
    finish(&s);
}

static void test_lr_decay(void **state) {
    (void)state;
    /* w after each step: the running sum of -lr(s) */
    const float r = 0.70710678f; /* 0.5^(1/2) */
    const float smooth[4] = {-1, -1 - r, -1.5f - r, -1.5f - 1.5f * r};
    const float stairs[4] = {-1, -2, -2.5f, -3};
    run_decay(false, smooth);
    run_decay(true, stairs);
}

/* qr_worker_set_lr in sync mode: a variable's step uses the learning rate
 * of its first gradient in member order (by worker), whatever order the
 * pushes arrived in; one set on no member's push leaves the ps's own (lr
 * 1, decayed here by 0.5 a step), and a pushed one is used as is, not
 * decayed. R = N = 2, g = [2, 4] then [1, 1] from each. */
static void test_pushed_lr_first_member(void **state) {
    (void)state;
    scenario s;
    static const char *const decay[] = {"lr-decay-rate", "0.5", "lr-decay-steps", "1",
                                        "lr-decay-staircase", "true", NULL};
    extra = decay;
    start(&s, 2, 2, -1);
    extra = NULL;
    /* step 0: worker 1's push arrives first, but worker 0 is the first
     * member: its 0.25 applies, not 0.5. w = -0.25 * [2, 4] */
    assert_int_equal(qr_worker_set_lr(s.w[0], s.id[0], 0.25f), QR_OK);
    assert_int_equal(qr_worker_set_lr(s.w[1], s.id[1], 0.5f), QR_OK);
    assert_int_equal(push(&s, 1, 2, 4), QR_OK);
    assert_int_equal(push(&s, 0, 2, 4), QR_OK);
    for (int i = 0; i < 2; i++) assert_int_equal(token(&s, i), 1);
    expect_w(&s, -0.5f, -1.0f);
    /* step 1: worker 0 back to the ps's own, 1 * 0.5^1 (decayed); worker
     * 1's 0.5 is not the first member's. w -= 0.5 * [1, 1] */
    assert_int_equal(qr_worker_set_lr(s.w[0], s.id[0], -1.0f), QR_OK);
    assert_int_equal(push(&s, 1, 1, 1), QR_OK);
    assert_int_equal(push(&s, 0, 1, 1), QR_OK);
    for (int i = 0; i < 2; i++) assert_int_equal(token(&s, i), 2);
    expect_w(&s, -1.0f, -1.5f);
    /* step 2: both 2 (one scheduler): used as is, not decayed (0.25).
     * w -= 2 * [1, 1] */
    for (int i = 0; i < 2; i++) assert_int_equal(qr_worker_set_lr(s.w[i], s.id[i], 2.0f), QR_OK);
    for (int i = 0; i < 2; i++) assert_int_equal(push(&s, i, 1, 1), QR_OK);
    for (int i = 0; i < 2; i++) assert_int_equal(token(&s, i), 3);
    expect_w(&s, -3.0f, -3.5f);
    finish(&s);
}

static void test_no_moving_average_refused(void **state) {
    (void)state;
    scenario s;
    start(&s, 1, 1, -1);
    float got[2];
    float *dst[1] = {got};
    assert_int_equal(qr_worker_pull_averages(s.w[0], 1, &s.id[0], dst), QR_ENOTFOUND);
    assert_non_null(strstr(qr_last_error(), "variable 'w' has no moving average"));
    finish(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensorflow_init_tokens_waste_second_round),
        cmocka_unit_test(test_default_init_tokens_lockstep),
        cmocka_unit_test(test_backup_worker_dropped),
        cmocka_unit_test(test_fewer_workers_than_replicas),
        cmocka_unit_test(test_too_few_init_tokens_refused),
        cmocka_unit_test(test_fast_worker_takes_slow_workers_token),
        cmocka_unit_test(test_stop_ends_token_waits),
        cmocka_unit_test(test_missing_worker_stall_report_and_abort),
        cmocka_unit_test(test_finished_workers_end_the_run),
        cmocka_unit_test(test_leave_then_come_back),
        cmocka_unit_test(test_nonfinite_push_refused),
        cmocka_unit_test(test_nonfinite_push_skipped),
        cmocka_unit_test(test_dense_and_rows_of_one_variable),
        cmocka_unit_test(test_moving_averages),
        cmocka_unit_test(test_lr_decay),
        cmocka_unit_test(test_pushed_lr_first_member),
        cmocka_unit_test(test_no_moving_average_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

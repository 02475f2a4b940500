/*
 * test_sync_one_trip.c - a synchronous push-and-pull in one round trip
 * (docs/SYNC.md, "One round trip"), against real ps tasks on threads over
 * loopback sockets: one request per ps per step, the values after the
 * step, the token implied by ps 0's answer (the worker's local step), a
 * stale push answered at once, a ps that holds none of the variables
 * still answering after the step, an earlier step's token (fewer workers
 * than replicas) answered before the step, the non-blocking call, and a
 * held answer ended by the stop. SGD with lr 1: w -= mean(gradients).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <time.h>

#include "cluster_fixture.h"
#include "worker/worker_internal.h"

typedef struct trip {
    cluster_fixture f;
    qr_worker *w[FIX_MAX_WORKERS];
    int a, b; /* "a" on ps 0, "b" on ps 1 (greedy placement: equal sizes) */
} trip;

/* nps ps tasks, n workers in sync mode (R replicas, init tokens T; -1:
 * the defaults), every worker declaring a = b = [0, 0] and initialized. */
static void start(trip *t, int nps, int n, int R, int T) {
    fix_init(&t->f, nps, n);
    char buf[32];
    qr_config_set(t->f.cfg, "mode", "sync");
    qr_config_set(t->f.cfg, "lr", "1");
    qr_config_set(t->f.cfg, "sync-timeout-ms", "4000");
    if (R > 0) {
        snprintf(buf, sizeof buf, "%d", R);
        qr_config_set(t->f.cfg, "replicas-to-aggregate", buf);
    }
    if (T >= 0) {
        snprintf(buf, sizeof buf, "%d", T);
        qr_config_set(t->f.cfg, "init-tokens", buf);
    }
    for (int i = 0; i < nps; i++) assert_int_equal(fix_start_ps(&t->f, i), QR_OK);
    int64_t shape[1] = {2};
    for (int i = 0; i < n; i++) {
        t->w[i] = fix_worker(&t->f, i);
        assert_non_null(t->w[i]);
        assert_int_equal(qr_worker_declare(t->w[i], "a", 1, shape, "zeros", 1, -1, &t->a), QR_OK);
        assert_int_equal(qr_worker_declare(t->w[i], "b", 1, shape, "zeros", 1, -1, &t->b), QR_OK);
    }
    /* the chief first: the others wait for its initialization */
    for (int i = 0; i < n; i++) assert_int_equal(qr_worker_initialize(t->w[i]), QR_OK);
}

static void finish(trip *t) {
    assert_int_equal(qr_worker_stop_cluster(t->w[0]), QR_OK);
    for (int i = 0; i < t->f.nworkers; i++) qr_worker_free(t->w[i]);
    fix_join(&t->f);
}

/* One step of worker i on thread: push_pull of a and b (gradient g for
 * both), the values into out[0..4), the step into *step. */
typedef struct step_arg {
    trip *t;
    int i;
    float g;
    int n;        /* variables: 2 (a, b) or 1 (b only) */
    float out[4];
    int64_t step;
    int rc;
    char err[512];
} step_arg;

static void *step_thread(void *p) {
    step_arg *s = p;
    float ga[2] = {s->g, s->g}, gb[2] = {s->g, s->g};
    int ids[2] = {s->t->a, s->t->b};
    const float *grads[2] = {ga, gb};
    float *values[2] = {s->out, s->out + 2};
    if (s->n == 1) {
        ids[0] = s->t->b;
        values[0] = s->out + 2;
    }
    s->rc = qr_worker_push_pull(s->t->w[s->i], s->n, ids, grads, values, 0, &s->step);
    if (s->rc) snprintf(s->err, sizeof s->err, "%s", qr_last_error());
    return NULL;
}

/* Every worker's step at once, each on a thread of its own. */
static void steps(trip *t, step_arg *args, int n) {
    pthread_t th[FIX_MAX_WORKERS];
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, step_thread, &args[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < n; i++)
        if (args[i].rc) fprintf(stderr, "worker %d: %s\n", args[i].i, args[i].err);
    (void)t;
}

static void expect_stats(qr_worker *w, const char *phrase) {
    char buf[4096];
    assert_int_equal(qr_worker_stats(w, buf, sizeof buf), QR_OK);
    if (!strstr(buf, phrase)) fprintf(stderr, "stats %s lack %s\n", buf, phrase);
    assert_non_null(strstr(buf, phrase));
}

/* 2 ps, 2 workers, 5 steps: each step is one request to each ps (and so
 * one answer from each: the worker waits for them together), the values
 * are the step's result, and the step returned is the next token's. */
static void test_one_request_per_ps_per_step(void **state) {
    (void)state;
    trip t;
    start(&t, 2, 2, -1, -1);
    int pa = -1, pb = -1;
    int64_t off[1], len[1];
    assert_int_equal(qr_worker_var_placement(t.w[0], t.a, 1, &pa, off, len), 1);
    assert_int_equal(qr_worker_var_placement(t.w[0], t.b, 1, &pb, off, len), 1);
    assert_true(pa == 0 && pb == 1);
    float expect = 0;
    for (int k = 0; k < 5; k++) {
        uint32_t before[2] = {t.w[0]->next_id, t.w[1]->next_id};
        step_arg args[2] = {{.t = &t, .i = 0, .g = 1.0f + k, .n = 2},
                            {.t = &t, .i = 1, .g = 3.0f + k, .n = 2}};
        steps(&t, args, 2);
        expect -= (1.0f + k + 3.0f + k) / 2; /* the mean, at lr 1 */
        for (int i = 0; i < 2; i++) {
            assert_int_equal(args[i].rc, QR_OK);
            assert_int_equal(args[i].step, k + 1);
            int64_t local = -1;
            qr_worker_local_step(t.w[i], &local);
            assert_int_equal(local, k + 1);
            for (int e = 0; e < 4; e++) assert_true(args[i].out[e] == expect);
            /* one request per ps: no COMMIT, TOKEN or PULL after the push */
            assert_int_equal(t.w[i]->next_id - before[i], 2);
        }
    }
    expect_stats(t.w[0], "\"steps\":5");
    expect_stats(t.w[0], "\"in_quorum\":[5,5]");
    finish(&t);
}

/* R = 2, N = 3: workers 0 and 2 make step 0; worker 1's push of step 0
 * comes after it and is stale: answered at once (nobody else pushes),
 * with QR_ESTALE, the values of step 1 and the token of step 1. */
static void test_stale_push_answered_at_once(void **state) {
    (void)state;
    trip t;
    start(&t, 2, 3, 2, -1);
    step_arg args[2] = {{.t = &t, .i = 0, .g = 1, .n = 2}, {.t = &t, .i = 2, .g = 3, .n = 2}};
    steps(&t, args, 2);
    assert_int_equal(args[0].rc, QR_OK);
    assert_int_equal(args[1].rc, QR_OK);
    step_arg late = {.t = &t, .i = 1, .g = 100, .n = 2};
    step_thread(&late);
    assert_int_equal(late.rc, QR_ESTALE);
    assert_non_null(strstr(late.err, "dropped: stale"));
    assert_int_equal(late.step, 1);
    for (int e = 0; e < 4; e++) assert_true(late.out[e] == -2.0f);
    expect_stats(t.w[0], "\"stale_by_worker\":[0,1,0]");
    finish(&t);
}

/* Both workers push_pull b only (on ps 1): the push reaches ps 0 all the
 * same (it counts it there, and answers with the token), and a, on ps 0,
 * is not touched. Then worker 0 pushes a only, worker 1 b only: ps 1
 * holds nothing of worker 0, and still answers after the step. */
static void test_variables_on_one_ps(void **state) {
    (void)state;
    trip t;
    start(&t, 2, 2, -1, -1);
    step_arg args[2] = {{.t = &t, .i = 0, .g = 2, .n = 1}, {.t = &t, .i = 1, .g = 4, .n = 1}};
    steps(&t, args, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(args[i].rc, QR_OK);
        assert_int_equal(args[i].step, 1);
        assert_true(args[i].out[2] == -3.0f && args[i].out[3] == -3.0f);
    }
    float ga[2] = {2, 2}, gb[2] = {4, 4}, va[2], vb[2];
    const float *g0[1] = {ga}, *g1[1] = {gb};
    float *v0[1] = {va}, *v1[1] = {vb};
    qr_request *r0 = NULL, *r1 = NULL;
    /* worker 0 (a: ps 0) without waiting, worker 1 (b: ps 1) blocking */
    assert_int_equal(qr_worker_push_pull_start(t.w[0], 1, &t.a, g0, v0, 0, &r0), QR_OK);
    assert_int_equal(qr_worker_push_pull_start(t.w[1], 1, &t.b, g1, v1, 0, &r1), QR_OK);
    int64_t s0 = -1, s1 = -1;
    assert_int_equal(qr_request_wait(r1, &s1), QR_OK);
    assert_int_equal(qr_request_wait(r0, &s0), QR_OK);
    assert_int_equal(s0, 2);
    assert_int_equal(s1, 2);
    /* a variable a member did not push counts as a zero in the mean */
    assert_true(va[0] == -1.0f && va[1] == -1.0f);
    assert_true(vb[0] == -5.0f && vb[1] == -5.0f);
    finish(&t);
}

/* R = 2, N = 1: the initial token (R - N = 1) lets the worker make a
 * second batch for step 0. Its first push_pull is answered with that
 * token before the step is done, by every ps (ps 0 tells ps 1: RELEASE),
 * with the values before the step; the second completes it. */
static void test_earlier_token_answered_before_the_step(void **state) {
    (void)state;
    trip t;
    start(&t, 2, 1, 2, -1);
    step_arg first = {.t = &t, .i = 0, .g = 1, .n = 2};
    step_thread(&first);
    assert_int_equal(first.rc, QR_OK);
    assert_int_equal(first.step, 0);
    for (int e = 0; e < 4; e++) assert_true(first.out[e] == 0.0f);
    step_arg second = {.t = &t, .i = 0, .g = 3, .n = 2};
    step_thread(&second);
    assert_int_equal(second.rc, QR_OK);
    assert_int_equal(second.step, 1);
    for (int e = 0; e < 4; e++) assert_true(second.out[e] == -2.0f);
    expect_stats(t.w[0], "\"in_quorum\":[2]");
    finish(&t);
}

/* ps 0 counts a push only once every ps it went to holds it: one worker
 * (R = N = 1) pushes a small gradient to ps 0 and a large one (16 MB) to
 * ps 1; were the step decided on ps 0's part alone, ps 1 would apply it
 * before the large part is in, as if that worker had pushed nothing. */
static void test_counted_once_every_ps_holds_it(void **state) {
    (void)state;
    cluster_fixture f;
    fix_init(&f, 2, 1);
    qr_config_set(f.cfg, "mode", "sync");
    qr_config_set(f.cfg, "lr", "1");
    for (int i = 0; i < 2; i++) assert_int_equal(fix_start_ps(&f, i), QR_OK);
    qr_worker *w = fix_worker(&f, 0);
    enum { BIG = 4 << 20 };
    int64_t small_shape[1] = {2}, big_shape[1] = {BIG};
    int ids[2];
    assert_int_equal(qr_worker_declare(w, "small", 1, small_shape, "zeros", 1, -1, &ids[0]), QR_OK);
    assert_int_equal(qr_worker_declare(w, "big", 1, big_shape, "zeros", 1, -1, &ids[1]), QR_OK);
    assert_int_equal(qr_worker_initialize(w), QR_OK);
    int where = -1;
    assert_int_equal(qr_worker_var_placement(w, ids[1], 1, &where, NULL, NULL), 1);
    assert_int_equal(where, 1);
    float *g = malloc(BIG * sizeof *g), *out = malloc(BIG * sizeof *out), gs[2] = {1, 1}, os[2];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < BIG; i++) g[i] = 1;
        const float *grads[2] = {gs, g};
        float *values[2] = {os, out};
        int64_t step = -1;
        assert_int_equal(qr_worker_push_pull(w, 2, ids, grads, values, 0, &step), QR_OK);
        assert_int_equal(step, k + 1);
        assert_true(out[0] == -(k + 1.0f) && out[BIG - 1] == -(k + 1.0f));
        assert_true(os[0] == -(k + 1.0f));
    }
    free(g);
    free(out);
    assert_int_equal(qr_worker_stop_cluster(w), QR_OK);
    qr_worker_free(w);
    fix_join(&f);
}

/* A held answer ends with the stop: worker 1 waits for worker 0, who
 * stops the cluster instead; worker 1's call returns QR_ESTOPPED. */
static void test_held_answer_ended_by_stop(void **state) {
    (void)state;
    trip t;
    start(&t, 2, 2, -1, -1);
    step_arg waiting = {.t = &t, .i = 1, .g = 1, .n = 2};
    pthread_t th;
    pthread_create(&th, NULL, step_thread, &waiting);
    struct timespec ts = {0, 300000000}; /* its push held by both ps meanwhile */
    nanosleep(&ts, NULL);
    assert_int_equal(qr_worker_stop_cluster(t.w[0]), QR_OK);
    pthread_join(th, NULL);
    assert_int_equal(waiting.rc, QR_ESTOPPED);
    for (int i = 0; i < 2; i++) qr_worker_free(t.w[i]);
    fix_join(&t.f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_request_per_ps_per_step),
        cmocka_unit_test(test_stale_push_answered_at_once),
        cmocka_unit_test(test_variables_on_one_ps),
        cmocka_unit_test(test_earlier_token_answered_before_the_step),
        cmocka_unit_test(test_counted_once_every_ps_holds_it),
        cmocka_unit_test(test_held_answer_ended_by_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

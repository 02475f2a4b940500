/*
 * test_api_inprocess.c - the public API end to end in one process: ps
 * tasks on threads, workers on the test's thread, real sockets (Unix and
 * TCP). Checks exact values after SGD applies, the global step, pulls into
 * caller buffers, placement over two ps, declaration checks between
 * workers, error paths, the clean stop, and that a large pull (spliced,
 * zero-copy) is always one whole version of the variable, and that a pull
 * over PEER_MAX_PENDING (256 MiB) does not leave its connection paused,
 * and the learning rate a worker sets (qr_worker_set_lr) in async mode.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cluster_fixture.h"

#include <math.h>

/* nps ps tasks (and two workers) with lr 0.5 over the given transport. */
static void start_cluster(cluster_fixture *f, int nps, const char *transport) {
    fix_init(f, nps, 2);
    assert_int_equal(qr_config_set(f->cfg, "lr", "0.5"), QR_OK);
    assert_int_equal(qr_config_set(f->cfg, "transport", transport), QR_OK);
    for (int i = 0; i < nps; i++) {
        int rc = fix_start_ps(f, i);
        if (rc) fprintf(stderr, "qr_ps_create: %s\n", qr_last_error());
        assert_int_equal(rc, QR_OK);
    }
}

static void join_cluster(cluster_fixture *f) {
    fix_join(f);
    for (int i = 0; i < f->nps; i++) assert_int_equal(f->run_status[i], QR_OK);
}

static qr_worker *make_worker(cluster_fixture *f, int index) {
    qr_worker *w = fix_worker(f, index);
    assert_non_null(w);
    return w;
}

/* Stop ps 0 and start a new one on the same address. */
static void restart_ps0(cluster_fixture *f) {
    qr_ps_stop(f->ps[0]);
    pthread_join(f->thread[0], NULL);
    qr_ps_free(f->ps[0]);
    assert_int_equal(fix_start_ps(f, 0), QR_OK);
}

static void declare_model(qr_worker *w, int *ids) {
    int64_t s0[2] = {2, 3}, s1[1] = {3}, s2[1] = {5};
    assert_int_equal(qr_worker_declare(w, "w", 2, s0, "constant:1", 1, -1, &ids[0]), QR_OK);
    assert_int_equal(qr_worker_declare(w, "b", 1, s1, "zeros", 2, -1, &ids[1]), QR_OK);
    /* This one has its own learning rate. */
    assert_int_equal(qr_worker_declare(w, "c", 1, s2, "constant:2", 3, 0.1f, &ids[2]), QR_OK);
}

static void run_push_pull(int nps, const char *transport) {
    cluster_fixture f;
    start_cluster(&f, nps, transport);
    qr_worker *chief = make_worker(&f, 0);
    int ids[3];
    declare_model(chief, ids);
    assert_int_equal(qr_worker_push(chief, 0, NULL, NULL, 0, NULL), QR_ENOTREADY);
    assert_int_equal(qr_worker_initialize(chief), QR_OK);
    assert_true(qr_worker_var_data(chief, ids[0])[5] == 1.0f);
    assert_true(qr_worker_var_data(chief, ids[2])[4] == 2.0f);

    /* var -= lr * g, lr = 0.5 globally and 0.1 for "c". */
    float gw[6] = {1, 2, 3, 4, 5, 6}, gb[3] = {-2, 0, 2}, gc[5] = {10, 10, 10, 10, 10};
    const float *grads[3] = {gw, gb, gc};
    int64_t step = -1;
    assert_int_equal(qr_worker_push(chief, 3, ids, grads, QR_PUSH_STEP, &step), QR_OK);
    assert_int_equal(step, 1);
    assert_int_equal(qr_worker_push(chief, 1, &ids[1], &grads[1], QR_PUSH_STEP, &step), QR_OK);
    assert_int_equal(step, 2);
    assert_int_equal(qr_worker_pull(chief, 0, NULL, NULL), QR_OK);
    const float *w = qr_worker_var_data(chief, ids[0]);
    const float *b = qr_worker_var_data(chief, ids[1]);
    const float *c = qr_worker_var_data(chief, ids[2]);
    for (int i = 0; i < 6; i++) assert_true(w[i] == 1.0f - 0.5f * gw[i]);
    for (int i = 0; i < 3; i++) assert_true(b[i] == -2 * 0.5f * gb[i]);
    for (int i = 0; i < 5; i++) assert_true(c[i] == 2.0f - 0.1f * 10.0f);

    /* Pull one variable into a buffer of the caller's. */
    float mine[3] = {0};
    float *dst[1] = {mine};
    assert_int_equal(qr_worker_pull(chief, 1, &ids[1], dst), QR_OK);
    assert_memory_equal(mine, b, sizeof mine);
    /* A NULL entry lands in the worker's copy (it was written to address
     * 0 + offset: found by tests/fuzz/fuzz_worker.c). */
    float theirs[3] = {0};
    float *mixed[2] = {NULL, theirs};
    memset(qr_worker_var_data(chief, ids[0]), 0, 6 * sizeof(float));
    assert_int_equal(qr_worker_pull(chief, 2, ids, mixed), QR_OK);
    for (int i = 0; i < 6; i++) assert_true(w[i] == 1.0f - 0.5f * gw[i]);
    assert_memory_equal(theirs, b, sizeof theirs);

    /* A second worker sees the same values and the same step. */
    qr_worker *other = make_worker(&f, 1);
    int other_ids[3];
    declare_model(other, other_ids);
    assert_int_equal(qr_worker_initialize(other), QR_OK);
    assert_int_equal(qr_worker_pull(other, 0, NULL, NULL), QR_OK);
    assert_memory_equal(qr_worker_var_data(other, other_ids[0]), w, 6 * sizeof(float));
    assert_int_equal(qr_worker_global_step(other, &step), QR_OK);
    assert_int_equal(step, 2);

    /* Errors name the problem and change nothing. */
    int bad = 7;
    assert_int_equal(qr_worker_pull(chief, 1, &bad, NULL), QR_ENOTFOUND);
    assert_non_null(strstr(qr_last_error(), "no variable with id 7"));
    int64_t s1[1] = {3};
    assert_int_equal(qr_worker_declare(chief, "late", 1, s1, "zeros", 0, -1, NULL), QR_EINVAL);

    assert_int_equal(qr_worker_stop_cluster(chief), QR_OK);
    /* After the stop, requests are refused with "stopped" (or find the ps gone). */
    int rc = qr_worker_push(other, 3, other_ids, grads, 0, NULL);
    assert_true(rc == QR_ESTOPPED || rc == QR_EPEERLOST);
    qr_worker_free(other);
    qr_worker_free(chief);
    join_cluster(&f);
}

static void test_push_pull_unix_one_ps(void **state) {
    (void)state;
    run_push_pull(1, "auto");
}

static void test_push_pull_tcp_two_ps(void **state) {
    (void)state;
    run_push_pull(2, "tcp");
}

static void test_mismatched_declarations(void **state) {
    (void)state;
    cluster_fixture f;
    start_cluster(&f, 2, "auto");
    qr_worker *chief = make_worker(&f, 0);
    int ids[3];
    declare_model(chief, ids);
    assert_int_equal(qr_worker_initialize(chief), QR_OK);

    qr_worker *other = make_worker(&f, 1);
    int64_t wrong[2] = {3, 2};
    int64_t s1[1] = {3}, s2[1] = {5};
    assert_int_equal(qr_worker_declare(other, "w", 2, wrong, "zeros", 1, -1, NULL), QR_OK);
    assert_int_equal(qr_worker_declare(other, "b", 1, s1, "zeros", 1, -1, NULL), QR_OK);
    assert_int_equal(qr_worker_declare(other, "c", 1, s2, "zeros", 1, -1, NULL), QR_OK);
    assert_int_equal(qr_worker_initialize(other), QR_EEXIST);
    assert_non_null(strstr(qr_last_error(), "conflicts with existing variable 'w' [2,3]"));

    qr_worker_free(other);

    /* Bad declarations are refused at once, and so is declaring late. */
    other = make_worker(&f, 1);
    int64_t zero[1] = {0};
    assert_int_equal(qr_worker_declare(other, "z", 1, zero, "zeros", 1, -1, NULL), QR_ESHAPE);
    assert_int_equal(qr_worker_declare(other, "b", 1, s1, "zeros", 1, -1, NULL), QR_OK);
    assert_int_equal(qr_worker_declare(other, "b", 1, s1, "zeros", 1, -1, NULL), QR_EEXIST);
    assert_int_equal(qr_worker_declare(other, "u", 1, s1, "uniform:3,1", 1, -1, NULL), QR_EINVAL);
    assert_int_equal(qr_worker_declare(other, "", 1, s1, "zeros", 1, -1, NULL), QR_EINVAL);
    qr_worker_free(other);

    assert_int_equal(qr_worker_stop_cluster(chief), QR_OK);
    qr_worker_free(chief);
    join_cluster(&f);
}

static void test_ps_not_up_times_out(void **state) {
    (void)state;
    /* No ps is running: initialize retries with backoff, then gives up
     * with a message naming the ps and its address. */
    cluster_fixture f;
    fix_init(&f, 1, 2); /* no ps is started */
    assert_int_equal(qr_config_set(f.cfg, "timeout-ms", "300"), QR_OK);
    qr_worker *chief = make_worker(&f, 0);
    int ids[3];
    declare_model(chief, ids);
    assert_int_equal(qr_worker_initialize(chief), QR_ETIMEDOUT);
    assert_non_null(strstr(qr_last_error(), "ps 0 (127.0.0.1:"));
    assert_non_null(strstr(qr_last_error(), "no CREATE reply within 300 ms"));
    qr_worker_free(chief);
    qr_config_free(f.cfg);
}

static void test_reconnects_after_ps_restart(void **state) {
    (void)state;
    cluster_fixture f;
    start_cluster(&f, 1, "auto");
    qr_worker *chief = make_worker(&f, 0);
    int ids[3];
    declare_model(chief, ids);
    assert_int_equal(qr_worker_initialize(chief), QR_OK);
    float g[6] = {0};
    const float *grads[1] = {g};
    int64_t step;
    assert_int_equal(qr_worker_push(chief, 1, ids, grads, QR_PUSH_STEP, &step), QR_OK);
    assert_int_equal(step, 1);

    /* The ps goes away and a new one starts on the same address. */
    restart_ps0(&f);

    /* The worker reconnects on its own and finds a new run of the ps,
     * without checkpoints: its variables are lost, and the worker says so
     * rather than going on (every later call too). */
    assert_int_equal(qr_worker_global_step(chief, &step), QR_EABORTED);
    assert_non_null(strstr(qr_last_error(), "was restarted and has lost its variables"));
    assert_int_equal(qr_worker_push(chief, 1, ids, grads, 0, NULL), QR_EABORTED);
    qr_worker_free(chief);
    /* A worker made again sees the new ps as it is: step 0, nothing held. */
    chief = make_worker(&f, 0);
    declare_model(chief, ids);
    assert_int_equal(qr_worker_global_step(chief, &step), QR_OK);
    assert_int_equal(step, 0);
    assert_int_equal(qr_worker_push(chief, 1, ids, grads, 0, NULL), QR_ENOTREADY);
    assert_int_equal(qr_worker_stop_cluster(chief), QR_OK);
    qr_worker_free(chief);
    join_cluster(&f);
}

static void test_nonfinite_policies(void **state) {
    (void)state;
    float nan_grad[6] = {1, 1, 0.0f / 0.0f, 1, 1, 1};
    const float *grads[1] = {nan_grad};
    for (int skip = 0; skip < 2; skip++) {
        cluster_fixture f;
        start_cluster(&f, 1, "auto");
        if (skip) {
            /* Restart the ps with nonfinite=skip. */
            assert_int_equal(qr_config_set(f.cfg, "nonfinite", "skip"), QR_OK);
            restart_ps0(&f);
        }
        qr_worker *chief = make_worker(&f, 0);
        int ids[3];
        declare_model(chief, ids);
        assert_int_equal(qr_worker_initialize(chief), QR_OK);
        int64_t step = -1;
        int rc = qr_worker_push(chief, 1, ids, grads, QR_PUSH_STEP, &step);
        if (skip) {
            /* Accepted, skipped: the step advances, the variable does not. */
            assert_int_equal(rc, QR_OK);
            assert_int_equal(step, 1);
        } else {
            assert_int_equal(rc, QR_ENONFINITE);
            assert_non_null(strstr(qr_last_error(), "variable 'w' contains NaN or Inf"));
            assert_int_equal(qr_worker_global_step(chief, &step), QR_OK);
            assert_int_equal(step, 0);
        }
        assert_int_equal(qr_worker_pull(chief, 1, ids, NULL), QR_OK);
        for (int i = 0; i < 6; i++) assert_true(qr_worker_var_data(chief, ids[0])[i] == 1.0f);
        assert_int_equal(qr_worker_stop_cluster(chief), QR_OK);
        qr_worker_free(chief);
        join_cluster(&f);
    }
}

/* Variables with their own optimizer options; the ps's is SGD, lr 0.5. */
static void test_per_variable_optimizer_options(void **state) {
    (void)state;
    cluster_fixture f;
    start_cluster(&f, 1, "auto");
    qr_worker *chief = make_worker(&f, 0);
    int64_t shape[1] = {2};
    int plain, mom, own_lr;
    assert_int_equal(qr_worker_declare(chief, "plain", 1, shape, "zeros", 1, -1, &plain), QR_OK);
    assert_int_equal(qr_worker_declare_opts(chief, "mom", 1, shape, "zeros", 1,
                                            "optimizer=momentum,momentum=0.5,lr=0.1", &mom),
                     QR_OK);
    assert_int_equal(qr_worker_declare_opts(chief, "own_lr", 1, shape, "zeros", 1, "lr=0.25",
                                            &own_lr), QR_OK);
    /* Bad options are refused at once, naming the problem. */
    assert_int_equal(qr_worker_declare_opts(chief, "bad", 1, shape, "zeros", 1, "beta1=2", NULL),
                     QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "option beta1: 2 is out of range"));
    assert_int_equal(qr_worker_declare_opts(chief, "bad", 1, shape, "zeros", 1, "momentum=0.5",
                                            NULL), QR_EINVAL); /* sgd has no momentum */
    assert_non_null(strstr(qr_last_error(), "option momentum does not apply"));
    assert_int_equal(qr_worker_declare_opts(chief, "bad", 1, shape, "zeros", 1, "lr", NULL),
                     QR_EINVAL);
    assert_int_equal(qr_worker_initialize(chief), QR_OK);
    float g[2] = {1, 2};
    const float *grads[3] = {g, g, g};
    int ids[3] = {plain, mom, own_lr};
    for (int step = 0; step < 2; step++)
        assert_int_equal(qr_worker_push(chief, 3, ids, grads, QR_PUSH_STEP, NULL), QR_OK);
    assert_int_equal(qr_worker_pull(chief, 0, NULL, NULL), QR_OK);
    const float *p = qr_worker_var_data(chief, plain);
    const float *m = qr_worker_var_data(chief, mom);
    const float *o = qr_worker_var_data(chief, own_lr);
    for (int i = 0; i < 2; i++) {
        assert_true(p[i] == -2 * 0.5f * g[i]); /* SGD, lr 0.5, twice */
        assert_true(o[i] == -2 * 0.25f * g[i]); /* SGD, its own lr 0.25 */
        /* Momentum 0.5, lr 0.1: accum = g, then 1.5 g; var = -0.1 g - 0.15 g */
        assert_float_equal(m[i], -0.25f * g[i], 1e-6);
    }
    /* Another worker declaring different options for a variable is refused. */
    qr_worker *other = make_worker(&f, 1);
    assert_int_equal(qr_worker_declare(other, "plain", 1, shape, "zeros", 1, -1, NULL), QR_OK);
    assert_int_equal(qr_worker_declare_opts(other, "mom", 1, shape, "zeros", 1,
                                            "optimizer=momentum,lr=0.1", NULL), QR_OK);
    assert_int_equal(qr_worker_declare_opts(other, "own_lr", 1, shape, "zeros", 1, "lr=0.25",
                                            NULL), QR_OK);
    assert_int_equal(qr_worker_initialize(other), QR_EEXIST);
    assert_non_null(strstr(qr_last_error(), "options 'optimizer=momentum,momentum=0.5,lr=0.1'"));
    qr_worker_free(other);
    assert_int_equal(qr_worker_stop_cluster(chief), QR_OK);
    qr_worker_free(chief);
    join_cluster(&f);
}

/* Large pull replies over a Unix socket are spliced: the kernel reads
 * the tensor's own pages while the worker copies them out, and the ps must
 * not change them until the worker has read them all (conn_write.c). Worker
 * B adds 1 to every element of a 2 MiB variable, again and again, while
 * worker A pulls it: each pull must be one version whole (every element
 * equal). A reply whose pages were given back early would show a mix:
 * with the check of the unread count taken out, 3 runs of 3 failed. 2 MiB
 * fits the socket buffer, so a whole reply is lent at once and the window
 * for such a mistake is wide. */
#define BIG_N ((int64_t)1 << 19)
#define BIG_PUSHES 400

typedef struct pusher {
    qr_worker *w;
    int id;
    int failures;
    char error[256];
    volatile int done;
} pusher;

static void *push_ones(void *arg) {
    pusher *p = arg;
    float *ones = malloc((size_t)BIG_N * sizeof(float));
    for (int64_t i = 0; ones && i < BIG_N; i++) ones[i] = 1.0f;
    const float *grads[1] = {ones};
    for (int k = 0; ones && k < BIG_PUSHES; k++) {
        if (qr_worker_push(p->w, 1, &p->id, grads, QR_PUSH_DELTA, NULL) != QR_OK) {
            p->failures++;
            snprintf(p->error, sizeof p->error, "%s", qr_last_error());
        }
    }
    if (!ones) p->failures++;
    free(ones);
    __atomic_store_n(&p->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_large_pulls_are_whole_versions(void **state) {
    (void)state;
    cluster_fixture f;
    start_cluster(&f, 1, "unix");
    qr_worker *a = make_worker(&f, 0), *b = make_worker(&f, 1);
    int64_t shape[1] = {BIG_N};
    int id_a, id_b;
    assert_int_equal(qr_worker_declare(a, "big", 1, shape, "zeros", 1, -1, &id_a), QR_OK);
    assert_int_equal(qr_worker_declare(b, "big", 1, shape, "zeros", 1, -1, &id_b), QR_OK);
    assert_int_equal(qr_worker_initialize(a), QR_OK);
    assert_int_equal(qr_worker_initialize(b), QR_OK);
    pusher p = {.w = b, .id = id_b};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, push_ones, &p), 0);
    int pulls = 0, torn = 0;
    float last = 0;
    while (!__atomic_load_n(&p.done, __ATOMIC_ACQUIRE)) {
        assert_int_equal(qr_worker_pull(a, 1, &id_a, NULL), QR_OK);
        const float *x = qr_worker_var_data(a, id_a);
        int64_t i = 1;
        while (i < BIG_N && x[i] == x[0]) i++;
        if (i < BIG_N) {
            if (!torn)
                fprintf(stderr, "pull %d: element 0 is %g but element %lld is %g\n", pulls,
                        (double)x[0], (long long)i, (double)x[i]);
            torn++;
        }
        assert_true(x[0] >= last); /* versions only go forward */
        last = x[0];
        pulls++;
    }
    pthread_join(t, NULL);
    if (p.failures) fprintf(stderr, "push failed: %s\n", p.error);
    assert_int_equal(p.failures, 0);
    assert_int_equal(torn, 0);
    assert_int_equal(qr_worker_pull(a, 1, &id_a, NULL), QR_OK);
    const float *x = qr_worker_var_data(a, id_a);
    for (int64_t i = 0; i < BIG_N; i++)
        if (x[i] != (float)BIG_PUSHES) fail_msg("element %lld is %g", (long long)i, (double)x[i]);
    fprintf(stderr, "%d whole pulls while %d pushes went in\n", pulls, BIG_PUSHES);
    assert_true(pulls > 1);
    assert_int_equal(qr_worker_stop_cluster(a), QR_OK);
    qr_worker_free(b);
    qr_worker_free(a);
    join_cluster(&f);
}

/* A pull reply larger than PEER_MAX_PENDING pauses the connection until
 * it has gone out. Spliced, its bytes reach the kernel without a send
 * callback (that comes when the worker speaks again, which it could not
 * while paused): the worker's next request waited its whole timeout
 * (timeout-ms 5000 here) before the `drained` event resumed reading. */
static void test_pull_over_the_pending_limit(void **state) {
    (void)state;
    cluster_fixture f;
    start_cluster(&f, 1, "unix");
    qr_worker *w = make_worker(&f, 0);
    int64_t big_shape[1] = {(int64_t)(300 << 20) / 4}, small_shape[1] = {16};
    int big, small;
    assert_int_equal(qr_worker_declare(w, "big", 1, big_shape, "zeros", 1, -1, &big), QR_OK);
    assert_int_equal(qr_worker_declare(w, "small", 1, small_shape, "zeros", 1, -1, &small), QR_OK);
    assert_int_equal(qr_worker_initialize(w), QR_OK);
    for (int round = 0; round < 2; round++) {
        assert_int_equal(qr_worker_pull(w, 1, &big, NULL), QR_OK);
        assert_int_equal(qr_worker_pull(w, 1, &small, NULL), QR_OK);
    }
    assert_int_equal(qr_worker_stop_cluster(w), QR_OK);
    qr_worker_free(w);
    join_cluster(&f);
}

/* The log callback gets the library's lines (level, task, message, no
 * prefix) instead of stderr; the level filters them. */
typedef struct log_seen {
    int count, level;
    char task[64], message[512];
} log_seen;

static void on_log(int level, const char *task, const char *message, void *ctx) {
    log_seen *s = ctx;
    if (!strstr(message, "starting fresh")) return;
    s->count++;
    s->level = level;
    snprintf(s->task, sizeof s->task, "%s", task);
    snprintf(s->message, sizeof s->message, "%s", message);
}

static void test_log_callback(void **state) {
    (void)state;
    log_seen seen = {0};
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/qr-test-log-%d", (int)getpid());
    cluster_fixture f;
    fix_init(&f, 1, 1);
    assert_int_equal(qr_config_set(f.cfg, "checkpoint-dir", dir), QR_OK);
    assert_int_equal(qr_set_log_callback(on_log, &seen), QR_OK);
    assert_int_equal(qr_set_log_level(QR_LOG_WARN), QR_OK);
    qr_cluster *c = fix_spec(&f, "ps", 0);
    qr_ps *ps = NULL;
    assert_int_equal(qr_ps_create(&ps, c, f.cfg), QR_OK); /* logs at info: dropped */
    qr_ps_free(ps);
    assert_int_equal(seen.count, 0);
    assert_int_equal(qr_set_log_level(QR_LOG_INFO), QR_OK);
    assert_int_equal(qr_ps_create(&ps, c, f.cfg), QR_OK);
    qr_ps_free(ps);
    assert_int_equal(seen.count, 1);
    assert_int_equal(seen.level, QR_LOG_INFO);
    assert_non_null(strstr(seen.message, dir));
    assert_null(strstr(seen.message, "info:")); /* the message alone, no prefix */
    assert_true(seen.task[0] != '\0');
    assert_int_equal(qr_set_log_level(99), QR_EINVAL);
    assert_int_equal(qr_set_log_callback(NULL, NULL), QR_OK);
    qr_cluster_free(c);
    qr_config_free(f.cfg);
    rmdir(dir);
}

/* A variable declared with its values starts from the chief's values; a
 * second worker's values (other numbers, same size) are not used; a wrong
 * count is refused and the name stays free. */
static void test_declare_values(void **state) {
    (void)state;
    cluster_fixture f;
    start_cluster(&f, 2, "auto");
    qr_worker *chief = make_worker(&f, 0), *other = make_worker(&f, 1);
    int64_t shape[2] = {2, 3};
    float mine[6] = {1, -2, 3.5f, 4, 5, 6e-3f}, theirs[6] = {0};
    int v, v2, b;
    assert_int_equal(qr_worker_declare_values(chief, "w", 2, shape, mine, 5, NULL, &v), QR_ESHAPE);
    assert_non_null(strstr(qr_last_error(), "5 values for a shape of 6"));
    assert_int_equal(qr_worker_declare_values(chief, "w", 2, shape, NULL, 6, NULL, &v), QR_EINVAL);
    assert_int_equal(qr_worker_declare_values(chief, "w", 2, shape, mine, 6, "lr=0.25", &v), QR_OK);
    int64_t sb[1] = {2};
    assert_int_equal(qr_worker_declare(chief, "b", 1, sb, "constant:3", 1, -1, &b), QR_OK);
    assert_int_equal(qr_worker_declare_values(other, "w", 2, shape, theirs, 6, "lr=0.25", &v2), QR_OK);
    assert_int_equal(qr_worker_declare(other, "b", 1, sb, "constant:3", 1, -1, NULL), QR_OK);
    assert_int_equal(qr_worker_initialize(chief), QR_OK);
    assert_int_equal(qr_worker_initialize(other), QR_OK);
    assert_int_equal(qr_worker_pull(other, 0, NULL, NULL), QR_OK);
    assert_memory_equal(qr_worker_var_data(other, v2), mine, sizeof mine);
    float g[6] = {4, 4, 4, 4, 4, 4};
    const float *grads[1] = {g};
    assert_int_equal(qr_worker_push(other, 1, &v2, grads, QR_PUSH_STEP, NULL), QR_OK);
    assert_int_equal(qr_worker_pull(chief, 1, &v, NULL), QR_OK);
    for (int i = 0; i < 6; i++) assert_true(qr_worker_var_data(chief, v)[i] == mine[i] - 1.0f);
    assert_int_equal(qr_worker_stop_cluster(chief), QR_OK);
    qr_worker_free(chief);
    qr_worker_free(other);
    join_cluster(&f);
}

/* qr_worker_set_lr (async): every later push of the variable carries the
 * learning rate, which the ps applies as is in place of its own (0.5): a
 * dense variable, both shards of a partitioned one, rows added to it, an
 * embedding table's rows, and a large push applied as it arrives
 * (fused_apply.c); lr < 0 returns to the ps's own; bad ids and rates are
 * refused by name. */
static void test_set_lr(void **state) {
    (void)state;
    cluster_fixture f;
    start_cluster(&f, 2, "auto");
    qr_worker *chief = make_worker(&f, 0);
    enum { BIG = 2 << 20 }; /* 8 MiB: applied as it arrives */
    int64_t sp[2] = {2, 2}, sb[1] = {3}, sbig[1] = {BIG};
    int p, b, emb, big;
    assert_int_equal(qr_worker_declare_opts(chief, "p", 2, sp, "zeros", 1, "partitions=2", &p),
                     QR_OK);
    assert_int_equal(qr_worker_declare(chief, "b", 1, sb, "zeros", 1, -1, &b), QR_OK);
    assert_int_equal(qr_worker_declare_table(chief, "emb", 2, "zeros", 1, "", &emb), QR_OK);
    assert_int_equal(qr_worker_declare(chief, "big", 1, sbig, "zeros", 1, -1, &big), QR_OK);
    assert_int_equal(qr_worker_set_lr(NULL, p, 0.1f), QR_EINVAL);
    assert_int_equal(qr_worker_set_lr(chief, 7, 0.1f), QR_ENOTFOUND);
    assert_non_null(strstr(qr_last_error(), "no variable with id 7"));
    assert_int_equal(qr_worker_set_lr(chief, -1, 0.1f), QR_ENOTFOUND);
    assert_int_equal(qr_worker_set_lr(chief, b, NAN), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "'b': the learning rate is nan, not a finite"));
    assert_int_equal(qr_worker_set_lr(chief, b, INFINITY), QR_EINVAL);
    assert_int_equal(qr_worker_initialize(chief), QR_OK);

    assert_int_equal(qr_worker_set_lr(chief, p, 0.1f), QR_OK);
    assert_int_equal(qr_worker_set_lr(chief, big, 0.125f), QR_OK);
    float *ones = malloc(BIG * sizeof *ones);
    assert_non_null(ones);
    for (int i = 0; i < BIG; i++) ones[i] = 1;
    const float *grads[3] = {ones, ones, ones};
    int ids[3] = {p, b, big};
    assert_int_equal(qr_worker_push(chief, 3, ids, grads, QR_PUSH_STEP, NULL), QR_OK);
    assert_int_equal(qr_worker_pull(chief, 0, NULL, NULL), QR_OK);
    const float *pv = qr_worker_var_data(chief, p), *bv = qr_worker_var_data(chief, b);
    const float *bigv = qr_worker_var_data(chief, big);
    for (int i = 0; i < 4; i++) assert_float_equal(pv[i], -0.1f, 1e-7); /* its own, both shards */
    for (int i = 0; i < 3; i++) assert_float_equal(bv[i], -0.5f, 1e-7);  /* the ps's */
    assert_true(bigv[0] == -0.125f && bigv[BIG - 1] == -0.125f);
    char stats[4096];
    assert_int_equal(qr_worker_stats(chief, stats, sizeof stats), QR_OK);
    assert_non_null(strstr(stats, "\"applied_on_arrival\":1"));

    /* Back to the ps's own. */
    assert_int_equal(qr_worker_set_lr(chief, p, -3.0f), QR_OK);
    assert_int_equal(qr_worker_push(chief, 1, &p, grads, QR_PUSH_STEP, NULL), QR_OK);
    /* Rows of the partitioned variable (its row 1, on the second shard)
     * and of the table, each at its own rate. */
    assert_int_equal(qr_worker_set_lr(chief, p, 0.25f), QR_OK);
    assert_int_equal(qr_worker_set_lr(chief, emb, 0.75f), QR_OK);
    int64_t row1 = 1, id7 = 7;
    float rg[2] = {1, 2};
    assert_int_equal(qr_worker_add_rows(chief, p, 1, &row1, rg), QR_OK);
    assert_int_equal(qr_worker_add_rows(chief, emb, 1, &id7, rg), QR_OK);
    assert_int_equal(qr_worker_push(chief, 0, NULL, NULL, QR_PUSH_STEP, NULL), QR_OK);
    assert_int_equal(qr_worker_pull(chief, 1, &p, NULL), QR_OK);
    assert_float_equal(pv[0], -0.6f, 1e-6);
    assert_float_equal(pv[1], -0.6f, 1e-6);
    assert_float_equal(pv[2], -0.6f - 0.25f, 1e-6);
    assert_float_equal(pv[3], -0.6f - 0.5f, 1e-6);
    float row[2];
    assert_int_equal(qr_worker_pull_rows(chief, emb, 1, &id7, row, 0), QR_OK);
    assert_float_equal(row[0], -0.75f, 1e-7);
    assert_float_equal(row[1], -1.5f, 1e-7);
    free(ones);
    assert_int_equal(qr_worker_stop_cluster(chief), QR_OK);
    qr_worker_free(chief);
    join_cluster(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_declare_values),
        cmocka_unit_test(test_push_pull_unix_one_ps),
        cmocka_unit_test(test_push_pull_tcp_two_ps),
        cmocka_unit_test(test_mismatched_declarations),
        cmocka_unit_test(test_ps_not_up_times_out),
        cmocka_unit_test(test_reconnects_after_ps_restart),
        cmocka_unit_test(test_nonfinite_policies),
        cmocka_unit_test(test_per_variable_optimizer_options),
        cmocka_unit_test(test_large_pulls_are_whole_versions),
        cmocka_unit_test(test_pull_over_the_pending_limit),
        cmocka_unit_test(test_log_callback),
        cmocka_unit_test(test_set_lr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

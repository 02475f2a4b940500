/*
 * test_embedding.c - embedding tables and sparse rows through the C API,
 * against real ps tasks on threads (cluster_fixture.h):
 *   - a table's rows start from the seeded initializer of (seed, id), the
 *     same with 1 or 2 ps tasks and in any order of first pulls;
 *   - async sparse pushes: duplicate ids summed before the apply;
 *   - TensorFlow's SyncReplicasOptimizer test with two workers, a dense
 *     and a sparse variable, R = N = 2 and R initial tokens
 *     (sync_replicas_optimizer_test.py, test2Workers), value by value;
 *   - sync steps of a table, reduced as the true mean (default) and per
 *     row (sparse-reduction=per_row, TensorFlow's
 *     SparseConditionalAccumulator), in one quorum with a dense variable;
 *   - bad input: rows of a dense call, a dense call on a table, NaN rows.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <time.h>
#include <pthread.h>

#include "world_fixture.h"
#include "common/init.h"

/* Rows of ids pulled with nps ps tasks, ids pulled in the given order. */
static void pull_init_rows(int nps, const int64_t *ids, int n, float *out) {
    world s;
    world_start(&s, nps, 1, NULL);
    int t;
    assert_int_equal(qr_worker_declare_table(s.w[0], "emb", 4, "normal:0,0.5", 42, "", &t), QR_OK);
    world_init_all(&s);
    assert_int_equal(qr_worker_var_size(s.w[0], t), 0);
    assert_int_equal(qr_worker_pull_rows(s.w[0], t, n, ids, out, 0), QR_OK);
    world_finish(&s);
}

static void test_rows_start_from_seed_and_id(void **state) {
    (void)state;
    int64_t ids[6] = {7, -3, 1ll << 40, 7, 123456789, 0};
    int64_t rev[6] = {0, 123456789, 7, 1ll << 40, -3, 7};
    float one[24], two[24], back[24], want[4];
    pull_init_rows(1, ids, 6, one);
    pull_init_rows(2, ids, 6, two);
    pull_init_rows(2, rev, 6, back);
    qr_init_spec spec;
    assert_int_equal(qr_init_parse("normal:0,0.5", &spec), QR_OK);
    for (int i = 0; i < 6; i++) {
        qr_init_row(&spec, 42, ids[i], want, 4);
        assert_memory_equal(one + 4 * i, want, sizeof want);
        assert_memory_equal(two + 4 * i, want, sizeof want);
        assert_memory_equal(back + 4 * (5 - i), want, sizeof want);
    }
    /* Different ids get different rows. */
    assert_true(memcmp(one, one + 4, 16) != 0);
}

/* Async SGD, lr 0.5: duplicates of one push are summed before the apply. */
static void test_async_duplicates_summed(void **state) {
    (void)state;
    world s;
    static const char *const opts[] = {"lr", "0.5", NULL};
    world_start(&s, 2, 1, opts);
    int t;
    assert_int_equal(qr_worker_declare_table(s.w[0], "emb", 2, "constant:1", 1, "", &t), QR_OK);
    int64_t shape[2] = {3, 1};
    int d;
    assert_int_equal(qr_worker_declare(s.w[0], "bias", 2, shape, "zeros", 1, -1, &d), QR_OK);
    world_init_all(&s);
    int64_t ids[3] = {10, 11, 10};
    float g[6] = {1, 2, 3, 4, 5, 6};
    int64_t step = -1;
    assert_int_equal(qr_worker_push_sparse(s.w[0], t, 3, ids, g, QR_PUSH_STEP, &step), QR_OK);
    assert_int_equal(step, 1);
    float rows[6];
    int64_t q[3] = {10, 11, 12};
    assert_int_equal(qr_worker_pull_rows(s.w[0], t, 3, q, rows, 0), QR_OK);
    /* id 10: 1 - 0.5 * (1 + 5), 1 - 0.5 * (2 + 6); id 11: 1 - 0.5 * (3, 4); 12 new. */
    float want[6] = {-2, -3, -0.5f, -1, 1, 1};
    assert_memory_equal(rows, want, sizeof want);
    /* Rows of a dense variable by index, through add_rows + push. */
    int64_t idx[2] = {2, 2};
    float gd[2] = {1, 1};
    assert_int_equal(qr_worker_add_rows(s.w[0], d, 2, idx, gd), QR_OK);
    assert_int_equal(qr_worker_push(s.w[0], 0, NULL, NULL, 0, NULL), QR_OK);
    assert_int_equal(qr_worker_pull(s.w[0], 1, &d, NULL), QR_OK);
    const float *b = qr_worker_var_data(s.w[0], d);
    assert_true(b[0] == 0 && b[1] == 0 && b[2] == -1.0f);
    world_finish(&s);
}

static void test_bad_input(void **state) {
    (void)state;
    world s;
    world_start(&s, 1, 1, NULL);
    int t, d;
    int64_t shape[1] = {2};
    assert_int_equal(qr_worker_declare_table(s.w[0], "emb", 2, "zeros", 1, "", &t), QR_OK);
    assert_int_equal(qr_worker_declare(s.w[0], "w", 1, shape, "zeros", 1, -1, &d), QR_OK);
    assert_int_equal(qr_worker_declare_table(s.w[0], "bad", 0, "zeros", 1, "", NULL), QR_ESHAPE);
    assert_int_equal(qr_worker_declare_table(s.w[0], "bad", 2, "gaussian", 1, "", NULL), QR_EINVAL);
    world_init_all(&s);
    float g[4] = {1, 2, 3, 4};
    const float *grads[1] = {g};
    assert_int_equal(qr_worker_push(s.w[0], 1, &t, grads, 0, NULL), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "embedding table"));
    assert_int_equal(qr_worker_pull(s.w[0], 1, &t, NULL), QR_EINVAL);
    int64_t ids[2] = {1, 2};
    float out[4];
    assert_int_equal(qr_worker_pull_rows(s.w[0], d, 2, ids, out, 0), QR_EINVAL);
    int64_t big[1] = {2};
    assert_int_equal(qr_worker_add_rows(s.w[0], d, 1, big, g), QR_EINVAL);
    g[1] = NAN;
    assert_int_equal(qr_worker_add_rows(s.w[0], t, 2, ids, g), QR_ENONFINITE);
    /* A read-only pull does not add rows; the ps still serves. */
    assert_int_equal(qr_worker_pull_rows(s.w[0], t, 2, ids, out, QR_ROWS_READ_ONLY), QR_OK);
    char stats[4096];
    assert_int_equal(qr_worker_stats(s.w[0], stats, sizeof stats), QR_OK);
    world_finish(&s);
}

/* ---- TensorFlow's test2Workers ------------------------------------------- */

typedef struct tf_worker {
    qr_worker *w;
    int v0, v1, vs;
    int index;
} tf_worker;

/* One train_op of worker `index`: grads_0 = 0.1 + 0.2 i, grads_1 = 0.9 +
 * 0.2 i, grads_sparse = IndexedSlices([[0.1 + 0.2 i]], [1]), pushed as one
 * step, then a token. */
static int train_op(tf_worker *t) {
    float g0 = 0.1f + (float)t->index * 0.2f, g1 = 0.9f + (float)t->index * 0.2f;
    float gs = 0.1f + (float)t->index * 0.2f;
    int64_t row = 1;
    int rc = qr_worker_add_rows(t->w, t->vs, 1, &row, &gs);
    if (rc) return rc;
    int ids[2] = {t->v0, t->v1};
    const float *grads[2] = {&g0, &g1};
    rc = qr_worker_push(t->w, 2, ids, grads, 0, NULL);
    if (rc && rc != QR_ESTALE) return rc;
    int64_t step;
    return qr_worker_take_token(t->w, &step);
}

static void *train_thread(void *p) {
    tf_worker *t = p;
    int rc = train_op(t);
    if (rc) fprintf(stderr, "train_op: %s\n", qr_last_error());
    return (void *)(intptr_t)rc;
}

static void pull_tf(tf_worker *t, float *v0, float *v1, float *vs) {
    int ids[3] = {t->v0, t->v1, t->vs};
    float *dst[3] = {v0, v1, vs};
    assert_int_equal(qr_worker_pull(t->w, 3, ids, dst), QR_OK);
}

static void test_tensorflow_2_workers_sparse(void **state) {
    (void)state;
    world s;
    static const char *const opts[] = {"mode", "sync", "lr", "2.0", "replicas-to-aggregate",
                                       "2", "init-tokens", "2", NULL};
    world_start(&s, 2, 2, opts);
    tf_worker t[2];
    for (int i = 0; i < 2; i++) {
        t[i].w = s.w[i];
        t[i].index = i;
        int64_t one[1] = {1}, two[2] = {2, 1};
        assert_int_equal(qr_worker_declare(s.w[i], "v0", 1, one, "constant:0", 1, -1, &t[i].v0), QR_OK);
        assert_int_equal(qr_worker_declare(s.w[i], "v1", 1, one, "constant:1", 1, -1, &t[i].v1), QR_OK);
        assert_int_equal(qr_worker_declare(s.w[i], "v_sparse", 2, two, "constant:0", 1, -1,
                                           &t[i].vs), QR_OK);
    }
    /* TensorFlow's v_sparse starts at [[3.0], [4.0]]; here at [[0], [0]]
     * (SGD's updates do not depend on the value, so the trace is the same
     * shifted by the start). */
    world_init_all(&s);
    float v0, v1, vs[2];
    pull_tf(&t[1], &v0, &v1, vs);
    assert_true(v0 == 0.0f && v1 == 1.0f);
    int64_t local;
    assert_int_equal(qr_worker_local_step(s.w[0], &local), QR_OK);
    assert_int_equal(local, 0);
    /* Initial tokens: each worker runs its train_op alone. */
    assert_int_equal(train_op(&t[0]), QR_OK);
    assert_int_equal(train_op(&t[1]), QR_OK);
    /* As TensorFlow's test: the step completes once ps 1 applied it. */
    int64_t g = 0;
    for (int tries = 0; tries < 500 && g != 1; tries++) {
        assert_int_equal(qr_worker_global_step(s.w[1], &g), QR_OK);
        if (g != 1) nanosleep(&(struct timespec){0, 10 * 1000000}, NULL);
    }
    assert_int_equal(g, 1);
    pull_tf(&t[1], &v0, &v1, vs);
    assert_float_equal(v0, 0 - (0.1 + 0.3) / 2 * 2.0, 1e-6);
    assert_float_equal(v1, 1 - (0.9 + 1.1) / 2 * 2.0, 1e-6);
    assert_float_equal(vs[0], 0.0, 0);
    assert_float_equal(vs[1], 0 - (0.1 + 0.3) / 2 * 2.0, 1e-6);
    /* The initial tokens carried step 0: the next round is stale. */
    assert_int_equal(qr_worker_local_step(s.w[0], &local), QR_OK);
    assert_int_equal(local, 0);
    assert_int_equal(train_op(&t[0]), QR_OK);
    assert_int_equal(train_op(&t[1]), QR_OK);
    assert_int_equal(qr_worker_global_step(s.w[1], &g), QR_OK);
    assert_int_equal(g, 1);
    assert_int_equal(qr_worker_local_step(s.w[0], &local), QR_OK);
    assert_int_equal(local, 1);
    assert_int_equal(qr_worker_local_step(s.w[1], &local), QR_OK);
    assert_int_equal(local, 1);
    pull_tf(&t[1], &v0, &v1, vs);
    assert_float_equal(v0, 0 - (0.1 + 0.3) / 2 * 2.0, 1e-6);
    /* No token left: both workers must run together. */
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, train_thread, &t[i]);
    for (int i = 0; i < 2; i++) {
        void *rc;
        pthread_join(th[i], &rc);
        assert_int_equal((int)(intptr_t)rc, QR_OK);
    }
    assert_int_equal(qr_worker_global_step(s.w[1], &g), QR_OK);
    assert_int_equal(g, 2);
    pull_tf(&t[1], &v0, &v1, vs);
    assert_float_equal(v0, 0 - 2 * (0.1 + 0.3) / 2 * 2.0, 1e-6);
    assert_float_equal(v1, 1 - 2 * (0.9 + 1.1) / 2 * 2.0, 1e-6);
    assert_float_equal(vs[1], 0 - 2 * (0.1 + 0.3) / 2 * 2.0, 1e-6);
    assert_float_equal(vs[0], 0.0, 0);
    world_finish(&s);
}

/* ---- sync steps of a table ------------------------------------------------ */

typedef struct table_step {
    qr_worker *w;
    int t, d;
    int n;
    int64_t ids[2];
    float rows[2];
    float dense;
} table_step;

static void *table_step_thread(void *p) {
    table_step *a = p;
    int rc = a->n ? qr_worker_add_rows(a->w, a->t, a->n, a->ids, a->rows) : QR_OK;
    const float *grads[1] = {&a->dense};
    if (!rc) rc = qr_worker_push(a->w, 1, &a->d, grads, 0, NULL);
    int64_t step;
    if (!rc) rc = qr_worker_take_token(a->w, &step);
    if (rc) fprintf(stderr, "table step: %s\n", qr_last_error());
    return (void *)(intptr_t)rc;
}

/* Two workers, SGD lr 1, a table of dim 1 starting at 0 and a dense
 * scalar; worker 0 pushes id 5: 1, id 7: 2; worker 1 pushes id 5: 3 and
 * nothing for id 7 (and id 9 on its own). */
static void run_table_sync(const char *reduction, float want5, float want7, float want9) {
    world s;
    const char *const opts[] = {"mode", "sync", "lr", "1", "sparse-reduction", reduction, NULL};
    world_start(&s, 2, 2, opts);
    table_step a[2];
    for (int i = 0; i < 2; i++) {
        int64_t one[1] = {1};
        a[i].w = s.w[i];
        assert_int_equal(qr_worker_declare_table(s.w[i], "emb", 1, "zeros", 3, "", &a[i].t), QR_OK);
        assert_int_equal(qr_worker_declare(s.w[i], "b", 1, one, "zeros", 1, -1, &a[i].d), QR_OK);
    }
    world_init_all(&s);
    a[0].n = 2;
    a[0].ids[0] = 5, a[0].ids[1] = 7;
    a[0].rows[0] = 1, a[0].rows[1] = 2;
    a[0].dense = 1;
    a[1].n = 2;
    a[1].ids[0] = 5, a[1].ids[1] = 9;
    a[1].rows[0] = 3, a[1].rows[1] = 4;
    a[1].dense = 3;
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, table_step_thread, &a[i]);
    for (int i = 0; i < 2; i++) {
        void *rc;
        pthread_join(th[i], &rc);
        assert_int_equal((int)(intptr_t)rc, QR_OK);
    }
    int64_t ids[3] = {5, 7, 9};
    float out[3];
    assert_int_equal(qr_worker_pull_rows(s.w[0], a[0].t, 3, ids, out, 0), QR_OK);
    assert_float_equal(out[0], want5, 1e-6);
    assert_float_equal(out[1], want7, 1e-6);
    assert_float_equal(out[2], want9, 1e-6);
    float b;
    float *dst[1] = {&b};
    assert_int_equal(qr_worker_pull(s.w[0], 1, &a[0].d, dst), QR_OK);
    assert_float_equal(b, -2.0, 1e-6); /* mean(1, 3): the same quorum */
    int64_t g;
    assert_int_equal(qr_worker_global_step(s.w[0], &g), QR_OK);
    assert_int_equal(g, 1);
    world_finish(&s);
}

static void test_table_sync_true_mean(void **state) {
    (void)state;
    /* id 5: (1 + 3) / 2; id 7: (2 + 0) / 2; id 9: (0 + 4) / 2 */
    run_table_sync("mean", -2, -1, -2);
}

static void test_table_sync_per_row(void **state) {
    (void)state;
    /* id 5: (1 + 3) / 2; id 7: 2 / 1; id 9: 4 / 1 */
    run_table_sync("per_row", -2, -2, -4);
}

/* ---- checkpoints ------------------------------------------------------------ */

/* One cluster of 2 ps (Adagrad, async) over a table: pushes `pushes` times
 * the same rows, then pulls ids into out. dir: checkpoint-dir or NULL. */
static void table_run(const char *dir, int pushes, const int64_t *ids, int n, float *before,
                      float *out) {
    world s;
    const char *const opts[] = {"optimizer", "adagrad", "lr", "0.5", dir ? "checkpoint-dir" : NULL,
                                dir, NULL};
    world_start(&s, 2, 1, opts);
    int t;
    assert_int_equal(qr_worker_declare_table(s.w[0], "emb", 3, "uniform:-1,1", 5, "", &t), QR_OK);
    world_init_all(&s);
    if (before) assert_int_equal(qr_worker_pull_rows(s.w[0], t, n, ids, before, QR_ROWS_READ_ONLY),
                                 QR_OK);
    float g[3 * 64];
    for (int i = 0; i < 3 * n; i++) g[i] = 0.1f * (float)(i % 7) - 0.2f;
    for (int k = 0; k < pushes; k++)
        assert_int_equal(qr_worker_push_sparse(s.w[0], t, n, ids, g, QR_PUSH_STEP, NULL), QR_OK);
    assert_int_equal(qr_worker_pull_rows(s.w[0], t, n, ids, out, QR_ROWS_READ_ONLY), QR_OK);
    world_finish(&s);
}

/* A table's rows and per-row slots survive a checkpoint exactly: the rows
 * read back are the rows written, and a push after the restore gives what
 * the same two pushes give without one (Adagrad's accumulators came back). */
static void test_table_checkpoint_restore(void **state) {
    (void)state;
    char dir[] = "/tmp/qr-embed-ckpt-XXXXXX";
    assert_non_null(mkdtemp(dir));
    int64_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (int64_t)i * 7919 - 100000;
    float once[120], restored[120], twice[120], straight[120];
    table_run(dir, 1, ids, 40, NULL, once);
    table_run(dir, 1, ids, 40, restored, twice);
    assert_memory_equal(restored, once, sizeof once);
    table_run(NULL, 2, ids, 40, NULL, straight);
    assert_memory_equal(twice, straight, sizeof twice);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_start_from_seed_and_id),
        cmocka_unit_test(test_async_duplicates_summed),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_tensorflow_2_workers_sparse),
        cmocka_unit_test(test_table_sync_true_mean),
        cmocka_unit_test(test_table_sync_per_row),
        cmocka_unit_test(test_table_checkpoint_restore),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

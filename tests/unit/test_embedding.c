/*
 * test_embedding.c - embedding tables and sparse rows through the C API,
 * against real ps tasks on threads (cluster_fixture.h):
 *   - a table's rows start from the seeded initializer of (seed, id), the
 *     same with 1 or 2 ps tasks and in any order of first pulls;
 *   - async sparse pushes: duplicate ids summed before the apply; pushes
 *     of distinct rows already made applied from the payload, with the
 *     same values (and the duplicate check of that path, ps/rows.h);
 *   - TensorFlow's SyncReplicasOptimizer test with two workers, a dense
 *     and a sparse variable, R = N = 2 and R initial tokens
 *     (sync_replicas_optimizer_test.py, test2Workers), value by value;
 *   - sync steps of a table, reduced as the true mean (default) and per
 *     row (sparse-reduction=per_row, TensorFlow's
 *     SparseConditionalAccumulator), in one quorum with a dense variable;
 *   - bad input: rows of a dense call, a dense call on a table, NaN rows;
 *   - admission (admit_after; sightings counted exactly or in a counting
 *     Bloom filter, admit_filter=bloom) and eviction (evict_after_steps),
 *     counted in the statistics, their state through a checkpoint, and
 *     bad options refused.
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
#include "ps/rows.h"
#include "worker/worker_internal.h"

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

/* Pushes to rows that exist, distinct ids (a worker's push: summed by id
 * there) with 1 and 2 ps: the ps applies them from the payload, without
 * summing (ps/rows.c); the values are those of the sum path, exactly. A
 * push that makes a row (an absent id) takes the sum path in the same run. */
static void push_existing_rows(int nps) {
    world s;
    static const char *const opts[] = {"lr", "0.5", NULL};
    world_start(&s, nps, 1, opts);
    int t;
    assert_int_equal(qr_worker_declare_table(s.w[0], "emb", 2, "constant:1", 1, "", &t), QR_OK);
    world_init_all(&s);
    int64_t ids[4] = {10, 11, 12, 13};
    float rows[8];
    assert_int_equal(qr_worker_pull_rows(s.w[0], t, 4, ids, rows, 0), QR_OK); /* made */
    float g[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    /* present and distinct: from the payload */
    assert_int_equal(qr_worker_push_sparse(s.w[0], t, 4, ids, g, 0, NULL), QR_OK);
    /* 13 twice (summed on the worker), 14 absent: the sum path */
    int64_t more[4] = {13, 14, 10, 13};
    float g2[8] = {1, 1, 2, 2, 4, 4, 8, 8};
    assert_int_equal(qr_worker_push_sparse(s.w[0], t, 4, more, g2, 0, NULL), QR_OK);
    int64_t q[5] = {10, 11, 12, 13, 14};
    float got[10];
    assert_int_equal(qr_worker_pull_rows(s.w[0], t, 5, q, got, 0), QR_OK);
    /* 10: 1 - 0.5 * (1, 2) - 0.5 * (4, 4); 11, 12: one push; 13: 1 - 0.5 *
     * (7, 8) - 0.5 * (1 + 8, 1 + 8); 14: 1 - 0.5 * (2, 2). */
    float want[10] = {-1.5f, -2, -0.5f, -1, -1.5f, -2, -7, -7.5f, 0, 0};
    assert_memory_equal(got, want, sizeof want);
    world_finish(&s);
}

static void test_async_push_existing_rows(void **state) {
    (void)state;
    push_existing_rows(1);
    push_existing_rows(2);
}

/* Rows added in several calls before one push are summed by id across
 * the calls (the worker's id table grows and takes the ids held again),
 * and the next push starts empty. */
static void test_add_rows_across_calls(void **state) {
    (void)state;
    world s;
    static const char *const opts[] = {"lr", "1", NULL};
    world_start(&s, 2, 1, opts);
    int t;
    assert_int_equal(qr_worker_declare_table(s.w[0], "emb", 1, "zeros", 1, "", &t), QR_OK);
    world_init_all(&s);
    assert_int_equal(qr_worker_add_rows(s.w[0], t, 2, (int64_t[]){5, 6}, (float[]){1, 2}), QR_OK);
    int64_t ids[100];
    float ones[100];
    for (int i = 0; i < 100; i++) ids[i] = 99 - i, ones[i] = 1;
    assert_int_equal(qr_worker_add_rows(s.w[0], t, 100, ids, ones), QR_OK);
    /* One sum per id, 5 and 6 found again after the table grew (the ps
     * would sum a duplicate again: only the count shows it). */
    assert_int_equal(s.w[0]->vars[t].added->n, 100);
    assert_int_equal(qr_worker_push(s.w[0], 0, NULL, NULL, 0, NULL), QR_OK);
    assert_int_equal(qr_worker_add_rows(s.w[0], t, 1, (int64_t[]){5}, (float[]){1}), QR_OK);
    assert_int_equal(qr_worker_push(s.w[0], 0, NULL, NULL, 0, NULL), QR_OK);
    float got[100];
    for (int i = 0; i < 100; i++) ids[i] = i;
    assert_int_equal(qr_worker_pull_rows(s.w[0], t, 100, ids, got, 0), QR_OK);
    for (int i = 0; i < 100; i++) {
        float want = i == 5 ? -3 : i == 6 ? -3 : -1;
        assert_true(got[i] == want);
    }
    world_finish(&s);
}

/* The duplicate check of that path on a table alone: true only for ids
 * all present and each once, and every mark clear after each call. */
static void test_rows_present_distinct(void **state) {
    (void)state;
    qr_table tab;
    assert_int_equal(qr_table_init(&tab, 4, 0, NULL, "zeros", 1), QR_OK);
    row_marks m = {0};
    int64_t ids[300];
    for (int i = 0; i < 300; i++) ids[i] = (int64_t)i * 7919 - 1000;
    const uint8_t *raw = (const uint8_t *)ids;
    assert_false(qr__rows_present_distinct(&m, &tab, raw, 3)); /* an empty table */
    for (int i = 0; i < 200; i++) {
        bool added;
        assert_true(qr_table_get_or_add(&tab, ids[i], &added) == i);
    }
    assert_true(qr__rows_present_distinct(&m, &tab, raw, 200));
    assert_false(qr__rows_present_distinct(&m, &tab, raw, 0));
    assert_false(qr__rows_present_distinct(&m, &tab, raw, 201)); /* ids[200] absent */
    int64_t dup[150];
    memcpy(dup, ids, sizeof dup);
    dup[149] = ids[3]; /* the last one a duplicate: found after 149 marks */
    assert_false(qr__rows_present_distinct(&m, &tab, (const uint8_t *)dup, 150));
    dup[149] = ids[149];
    dup[0] = dup[1];
    assert_false(qr__rows_present_distinct(&m, &tab, (const uint8_t *)dup, 150));
    for (uint64_t w = 0; w < m.nbits / 64; w++) assert_true(m.bits[w] == 0);
    assert_true(qr__rows_present_distinct(&m, &tab, raw + 8 * 50, 150));
    qr__row_marks_free(&m);
    qr_table_free(&tab);
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

/* ---- admission and eviction ----------------------------------------------- */

/* A table's figure from the cluster's statistics (summed over the ps). */
static double table_stat(qr_worker *w, const char *table, const char *figure) {
    char buf[8192], key[128];
    assert_int_equal(qr_worker_stats(w, buf, sizeof buf), QR_OK);
    const char *at = strstr(buf, "\"tables\":{");
    assert_non_null(at);
    snprintf(key, sizeof key, "\"%s\":{", table);
    at = strstr(at, key);
    assert_non_null(at);
    snprintf(key, sizeof key, "\"%s\":", figure);
    at = strstr(at, key);
    assert_non_null(at);
    return strtod(at + strlen(key), NULL);
}

/* Sightings counted in a counting Bloom filter of 4096 counters on each
 * ps (the 4 ids here share no counters: the hashes are fixed, so this is
 * deterministic). */
#define BLOOM_OPTIONS "admit_filter=bloom,admit_filter_bytes=4096"

/* admit_after=3 (SGD, lr 1): an id's first two lookups read its initial
 * value without making a row, and a push to it then is dropped and
 * counted; the third makes the row, and pushes apply. A table without
 * admission gives the same initial values. Over 2 ps; sightings counted
 * exactly or in a filter. */
static void admission_with(const char *options, bool bloom) {
    world s;
    static const char *const opts[] = {"lr", "1", NULL};
    world_start(&s, 2, 1, opts);
    int t, plain;
    assert_int_equal(qr_worker_declare_table(s.w[0], "emb", 2, "normal:0,1", 9, options, &t),
                     QR_OK);
    assert_int_equal(qr_worker_declare_table(s.w[0], "plain", 2, "normal:0,1", 9, "", &plain),
                     QR_OK);
    world_init_all(&s);
    int64_t ids[4] = {3, 44, 555, 6666};
    float init[8], rows[8], g[8];
    for (int i = 0; i < 8; i++) g[i] = 1.0f;
    assert_int_equal(qr_worker_pull_rows(s.w[0], plain, 4, ids, init, 0), QR_OK);
    for (int seen = 1; seen <= 2; seen++) {
        assert_int_equal(qr_worker_pull_rows(s.w[0], t, 4, ids, rows, 0), QR_OK);
        assert_memory_equal(rows, init, sizeof init);
        assert_int_equal(qr_worker_push_sparse(s.w[0], t, 4, ids, g, QR_PUSH_STEP, NULL), QR_OK);
    }
    assert_int_equal(table_stat(s.w[0], "emb", "rows"), 0);
    assert_int_equal(table_stat(s.w[0], "emb", "admission_candidates"), bloom ? 0 : 4);
    assert_int_equal(table_stat(s.w[0], "emb", "admission_filter_bytes"), bloom ? 2 * 4096 : 0);
    assert_int_equal(table_stat(s.w[0], "emb", "unadmitted_reads"), 8);
    assert_int_equal(table_stat(s.w[0], "emb", "dropped_rows"), 8);
    /* A read-only lookup (evaluation) is no sighting. */
    assert_int_equal(qr_worker_pull_rows(s.w[0], t, 4, ids, rows, QR_ROWS_READ_ONLY), QR_OK);
    assert_int_equal(table_stat(s.w[0], "emb", "rows"), 0);
    /* The third sighting admits them, with their initial values untouched. */
    assert_int_equal(qr_worker_pull_rows(s.w[0], t, 4, ids, rows, 0), QR_OK);
    assert_memory_equal(rows, init, sizeof init);
    assert_int_equal(table_stat(s.w[0], "emb", "rows"), 4);
    assert_int_equal(table_stat(s.w[0], "emb", "admitted"), 4);
    assert_int_equal(table_stat(s.w[0], "emb", "admission_candidates"), 0);
    assert_int_equal(qr_worker_push_sparse(s.w[0], t, 4, ids, g, QR_PUSH_STEP, NULL), QR_OK);
    assert_int_equal(qr_worker_pull_rows(s.w[0], t, 4, ids, rows, 0), QR_OK);
    for (int i = 0; i < 8; i++) assert_float_equal(rows[i], init[i] - 1.0f, 1e-6);
    assert_int_equal(table_stat(s.w[0], "emb", "dropped_rows"), 8);
    assert_int_equal(table_stat(s.w[0], "plain", "admitted"), 0);
    char buf[8192];
    assert_int_equal(qr_worker_stats(s.w[0], buf, sizeof buf), QR_OK);
    assert_non_null(strstr(buf, bloom ? "\"admission_filter\":\"bloom\""
                                      : "\"admission_filter\":\"exact\""));
    world_finish(&s);
}

static void test_admission(void **state) {
    (void)state;
    admission_with("admit_after=3", false);
}

static void test_admission_bloom(void **state) {
    (void)state;
    admission_with("admit_after=3," BLOOM_OPTIONS, true);
}

/* evict_after_steps=4 on 1 ps (its applied steps are the clock): id 1 is
 * pushed at every step, id 2 once; at the sweep after step 6 id 2 has
 * gone 5 steps without an update and is removed (a later lookup makes it
 * anew from its initial value), id 1 stays. */
static void test_eviction(void **state) {
    (void)state;
    world s;
    static const char *const opts[] = {"lr", "1", NULL};
    world_start(&s, 1, 1, opts);
    int t;
    assert_int_equal(qr_worker_declare_table(s.w[0], "emb", 1, "constant:0", 1,
                                             "evict_after_steps=4", &t), QR_OK);
    int64_t shape[1] = {1};
    int d;
    /* the dense variable is a decoy: pushing it alone must not touch rows */
    assert_int_equal(qr_worker_declare(s.w[0], "d", 1, shape, "zeros", 1, -1, &d), QR_OK);
    world_init_all(&s);
    int64_t both[2] = {1, 2}, one[1] = {1};
    float g[2] = {1, 1}, rows[2];
    assert_int_equal(qr_worker_push_sparse(s.w[0], t, 2, both, g, QR_PUSH_STEP, NULL), QR_OK);
    for (int step = 2; step <= 8; step++)
        assert_int_equal(qr_worker_push_sparse(s.w[0], t, 1, one, g, QR_PUSH_STEP, NULL), QR_OK);
    assert_int_equal(table_stat(s.w[0], "emb", "evicted"), 1);
    assert_int_equal(table_stat(s.w[0], "emb", "rows"), 1);
    assert_int_equal(qr_worker_pull_rows(s.w[0], t, 2, both, rows, QR_ROWS_READ_ONLY), QR_OK);
    assert_float_equal(rows[0], -8.0f, 0);
    assert_float_equal(rows[1], 0.0f, 0); /* gone: its initial value again */
    world_finish(&s);
}

/* Admission counts and update steps are in checkpoints: a candidate seen
 * twice before the checkpoint (admit_after=3) is admitted at its first
 * lookup after the restore, and a row's update step comes back, so it is
 * evicted on time after the restore. */
static void admission_run(const char *dir, bool first, bool bloom) {
    world s;
    const char *const opts[] = {"lr", "1", "checkpoint-dir", dir, NULL};
    world_start(&s, 2, 1, opts);
    int t;
    assert_int_equal(qr_worker_declare_table(s.w[0], "emb", 2, "constant:0", 1,
                                             bloom ? "admit_after=3,evict_after_steps=8,"
                                                     BLOOM_OPTIONS
                                                   : "admit_after=3,evict_after_steps=8", &t),
                     QR_OK);
    world_init_all(&s);
    int64_t ids[2] = {10, 20}, old_id[1] = {30};
    float rows[4], g[4] = {1, 1, 1, 1};
    if (first) {
        for (int k = 0; k < 3; k++)
            assert_int_equal(qr_worker_pull_rows(s.w[0], t, 1, old_id, rows, 0), QR_OK);
        assert_int_equal(qr_worker_push_sparse(s.w[0], t, 1, old_id, g, QR_PUSH_STEP, NULL),
                         QR_OK);
        for (int k = 0; k < 2; k++)
            assert_int_equal(qr_worker_pull_rows(s.w[0], t, 2, ids, rows, 0), QR_OK);
        assert_int_equal(table_stat(s.w[0], "emb", "admission_candidates"), bloom ? 0 : 2);
        assert_int_equal(table_stat(s.w[0], "emb", "rows"), 1);
    } else {
        assert_int_equal(table_stat(s.w[0], "emb", "admission_candidates"), bloom ? 0 : 2);
        assert_int_equal(table_stat(s.w[0], "emb", "rows"), 1);
        assert_int_equal(qr_worker_pull_rows(s.w[0], t, 2, ids, rows, 0), QR_OK);
        assert_int_equal(table_stat(s.w[0], "emb", "rows"), 3);
        assert_int_equal(table_stat(s.w[0], "emb", "admitted"), 2);
        /* id 30 was updated at step 1: pushes to the others until step 10
         * leave it idle for 9 > 8 steps. */
        for (int k = 0; k < 9; k++)
            assert_int_equal(qr_worker_push_sparse(s.w[0], t, 2, ids, g, QR_PUSH_STEP, NULL),
                             QR_OK);
        assert_int_equal(table_stat(s.w[0], "emb", "evicted"), 1);
        assert_int_equal(table_stat(s.w[0], "emb", "rows"), 2);
    }
    world_finish(&s);
}

static void test_admission_eviction_checkpoint(void **state) {
    (void)state;
    for (int bloom = 0; bloom <= 1; bloom++) {
        char dir[] = "/tmp/qr-admit-ckpt-XXXXXX";
        assert_non_null(mkdtemp(dir));
        admission_run(dir, true, bloom);
        admission_run(dir, false, bloom);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        assert_int_equal(system(cmd), 0);
    }
}

/* Bad policy options: refused where the caller can fix them. */
static void test_admission_bad_options(void **state) {
    (void)state;
    world s;
    world_start(&s, 1, 1, NULL);
    int t;
    assert_int_equal(qr_worker_declare_table(s.w[0], "a", 2, "zeros", 1, "admit_after=0", &t),
                     QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "admit-after=0: want a whole number from 1"));
    assert_int_equal(qr_worker_declare_table(s.w[0], "b", 2, "zeros", 1, "evict_after_steps=x",
                                             &t), QR_EINVAL);
    int64_t shape[1] = {2};
    assert_int_equal(qr_worker_declare(s.w[0], "c", 1, shape, "zeros", 1, -1, &t), QR_OK);
    assert_int_equal(qr_worker_declare_values(s.w[0], "e", 1, shape, (float[]){1, 2}, 2,
                                              "admit_after=2", &t), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "are for embedding tables"));
    /* the counting Bloom filter: only with admit_after, up to 255, sized in range */
    assert_int_equal(qr_worker_declare_table(s.w[0], "f", 2, "zeros", 1, "admit_filter=bloom",
                                             &t), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "give admit_after=K too"));
    assert_int_equal(qr_worker_declare_table(s.w[0], "g", 2, "zeros", 1,
                                             "admit_after=300,admit_filter=bloom", &t), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "8-bit counters count to 255"));
    assert_int_equal(qr_worker_declare_table(s.w[0], "h", 2, "zeros", 1,
                                             "admit_after=2,admit_filter_bytes=4096", &t),
                     QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "need admit_filter=bloom"));
    assert_int_equal(qr_worker_declare_table(s.w[0], "i", 2, "zeros", 1,
                                             "admit_after=2,admit_filter=bloom,"
                                             "admit_filter_bytes=10", &t), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "admit-filter-bytes=10: want a whole number from 64"));
    assert_int_equal(qr_worker_declare_table(s.w[0], "j", 2, "zeros", 1,
                                             "admit_after=2,admit_filter=cuckoo", &t), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "want exact"));
    assert_int_equal(qr_worker_declare_table(s.w[0], "ok", 2, "zeros", 1,
                                             "admit_after=2,optimizer=adagrad", &t), QR_OK);
    world_init_all(&s);
    world_finish(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_start_from_seed_and_id),
        cmocka_unit_test(test_async_duplicates_summed),
        cmocka_unit_test(test_async_push_existing_rows),
        cmocka_unit_test(test_rows_present_distinct),
        cmocka_unit_test(test_add_rows_across_calls),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_tensorflow_2_workers_sparse),
        cmocka_unit_test(test_table_sync_true_mean),
        cmocka_unit_test(test_table_sync_per_row),
        cmocka_unit_test(test_table_checkpoint_restore),
        cmocka_unit_test(test_admission),
        cmocka_unit_test(test_admission_bloom),
        cmocka_unit_test(test_eviction),
        cmocka_unit_test(test_admission_eviction_checkpoint),
        cmocka_unit_test(test_admission_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_buffers.c - non-trainable variables (option trainable=false, a
 * module's buffers such as BatchNorm's running statistics), through the C
 * API against a real ps: a push carries their value, which the ps assigns
 * with no optimizer (async: at once; a delta push adds it; sync: the mean
 * of the values the step's members pushed), beside a trainable variable
 * that the same pushes train with SGD lr 1. Declarations that cannot mean
 * anything are refused by name. And ps 0 keeps each worker's data position
 * without checkpoints, so a worker restarted into the live cluster reads
 * its own back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "cluster_fixture.h"

typedef struct run {
    cluster_fixture f;
    qr_worker *w[2];
    int wid[2]; /* "w", trainable, [0, 0] */
    int bid[2]; /* "b", trainable=false, [1, 1] as declared */
} run;

/* A 1-ps cluster of 2 workers, SGD with lr 1; sync or async. */
static void start(run *r, bool sync) {
    fix_init(&r->f, 1, 2);
    qr_config_set(r->f.cfg, "lr", "1");
    if (sync) {
        qr_config_set(r->f.cfg, "mode", "sync");
        qr_config_set(r->f.cfg, "replicas-to-aggregate", "2");
        qr_config_set(r->f.cfg, "init-tokens", "0");
    }
    assert_int_equal(fix_start_ps(&r->f, 0), QR_OK);
    int64_t shape[1] = {2};
    const float ones[2] = {1, 1};
    for (int i = 0; i < 2; i++) {
        r->w[i] = fix_worker(&r->f, i);
        assert_int_equal(qr_worker_declare(r->w[i], "w", 1, shape, "zeros", 1, -1, &r->wid[i]),
                         QR_OK);
        assert_int_equal(qr_worker_declare_values(r->w[i], "b", 1, shape, ones, 2,
                                                  "trainable=false", &r->bid[i]), QR_OK);
        assert_int_equal(qr_worker_initialize(r->w[i]), QR_OK);
    }
}

static void finish(run *r) {
    assert_int_equal(qr_worker_stop_cluster(r->w[0]), QR_OK);
    for (int i = 0; i < 2; i++) qr_worker_free(r->w[i]);
    fix_join(&r->f);
}

/* Worker i pushes gradient g to "w" and, if b is not NULL, value b to "b". */
static int push(run *r, int i, const float *g, const float *b, unsigned flags) {
    int ids[2] = {r->wid[i], r->bid[i]};
    const float *arrays[2] = {g, b};
    return qr_worker_push(r->w[i], b ? 2 : 1, ids, arrays, flags, NULL);
}

static void expect(run *r, int i, int id, float a, float b) {
    assert_int_equal(qr_worker_pull(r->w[i], 1, &id, NULL), QR_OK);
    const float *v = qr_worker_var_data(r->w[i], id);
    if (v[0] != a || v[1] != b)
        fprintf(stderr, "worker %d, variable %d: [%g, %g], expected [%g, %g]\n", i, id, v[0],
                v[1], a, b);
    assert_true(v[0] == a && v[1] == b);
}

/* Async: the value is assigned as it comes (the last push's), a delta
 * push adds it, the gradient beside it is trained; no staleness counted. */
static void test_async_assign(void **state) {
    (void)state;
    run r;
    start(&r, false);
    const float g[2] = {1, 2}, b0[2] = {0.25f, 3}, b1[2] = {5, -7};
    assert_int_equal(push(&r, 0, g, b0, QR_PUSH_STEP), QR_OK);
    expect(&r, 1, r.bid[1], 0.25f, 3);
    expect(&r, 1, r.wid[1], -1, -2);
    assert_int_equal(push(&r, 1, g, b1, QR_PUSH_STEP), QR_OK);
    expect(&r, 0, r.bid[0], 5, -7);
    expect(&r, 0, r.wid[0], -2, -4);
    const float d[2] = {1, 1};
    assert_int_equal(push(&r, 0, d, d, QR_PUSH_DELTA), QR_OK);
    expect(&r, 0, r.bid[0], 6, -6);
    expect(&r, 0, r.wid[0], -1, -3);
    /* rows of a non-trainable variable are refused, naming it */
    int64_t row = 0;
    assert_int_equal(qr_worker_push_sparse(r.w[0], r.bid[0], 1, &row, d, 0, NULL), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "'b' is not trainable"));
    /* worker 1's b is two applies old: a value, so no stale gradient */
    const float b2[2] = {9, 9};
    const float *arrays[1] = {b2};
    assert_int_equal(qr_worker_push(r.w[1], 1, &r.bid[1], arrays, QR_PUSH_STEP, NULL), QR_OK);
    expect(&r, 0, r.bid[0], 9, 9);
    char stats[2048];
    assert_int_equal(qr_worker_stats(r.w[0], stats, sizeof stats), QR_OK);
    assert_non_null(strstr(stats, "\"stale_pushes_applied\":0"));
    finish(&r);
}

/* Sync: the mean of the values of the step's members that pushed one;
 * one member's is its own, exactly. */
static void test_sync_mean_of_pushers(void **state) {
    (void)state;
    run r;
    start(&r, true);
    const float g0[2] = {1, 2}, g1[2] = {3, 4}, b0[2] = {0.1f, 3}, b1[2] = {4, 8};
    /* step 0: only worker 0 pushes b (the chief's buffers) */
    assert_int_equal(push(&r, 0, g0, b0, 0), QR_OK);
    assert_int_equal(push(&r, 1, g1, NULL, 0), QR_OK);
    for (int i = 0; i < 2; i++) assert_int_equal(qr_worker_take_token(r.w[i], NULL), QR_OK);
    expect(&r, 1, r.bid[1], 0.1f, 3);
    expect(&r, 1, r.wid[1], -2, -3);
    /* step 1: both push b: their mean */
    const float b2[2] = {2, 4};
    assert_int_equal(push(&r, 0, g0, b1, 0), QR_OK);
    assert_int_equal(push(&r, 1, g1, b2, 0), QR_OK);
    for (int i = 0; i < 2; i++) assert_int_equal(qr_worker_take_token(r.w[i], NULL), QR_OK);
    expect(&r, 0, r.bid[0], 3, 6);
    expect(&r, 0, r.wid[0], -4, -6);
    /* step 2: neither: it keeps its value */
    assert_int_equal(push(&r, 0, g0, NULL, 0), QR_OK);
    assert_int_equal(push(&r, 1, g1, NULL, 0), QR_OK);
    for (int i = 0; i < 2; i++) assert_int_equal(qr_worker_take_token(r.w[i], NULL), QR_OK);
    expect(&r, 1, r.bid[1], 3, 6);
    finish(&r);
}

/* Declarations that cannot mean anything, refused where the caller can fix
 * them, naming the problem. */
static void test_refused_declarations(void **state) {
    (void)state;
    cluster_fixture f;
    fix_init(&f, 1, 1);
    qr_worker *w = fix_worker(&f, 0);
    int64_t shape[1] = {2};
    int id;
    assert_int_equal(qr_worker_declare_opts(w, "a", 1, shape, "zeros", 0,
                                            "trainable=false,lr=0.1", &id), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "'lr' is an optimizer setting"));
    assert_int_equal(qr_worker_declare_opts(w, "a", 1, shape, "zeros", 0, "trainable=no", &id),
                     QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "trainable=no: want true or false"));
    assert_int_equal(qr_worker_declare_table(w, "t", 4, "zeros", 0, "trainable=false", &id),
                     QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "not tables"));
    /* trainable=true is a plain variable, and partitions= goes with either */
    assert_int_equal(qr_worker_declare_opts(w, "c", 1, shape, "zeros", 0,
                                            "trainable=true,optimizer=adam", &id), QR_OK);
    assert_int_equal(qr_worker_declare_opts(w, "d", 1, shape, "zeros", 0,
                                            "partitions=1,trainable=false", &id), QR_OK);
    qr_worker_free(w);
    qr_config_free(f.cfg);
}

/* A worker restarted into the live cluster (a new handle of the same
 * index, no checkpoints kept) reads back the data position of its last
 * push. */
static void test_data_position_without_checkpoints(void **state) {
    (void)state;
    run r;
    start(&r, false);
    const float g[2] = {0, 0};
    assert_int_equal(qr_worker_set_data_position(r.w[1], 41), QR_OK);
    assert_int_equal(push(&r, 1, g, NULL, QR_PUSH_STEP), QR_OK);
    assert_int_equal(qr_worker_set_data_position(r.w[1], 42), QR_OK);
    assert_int_equal(push(&r, 1, g, NULL, QR_PUSH_STEP), QR_OK);
    qr_worker_free(r.w[1]);
    r.w[1] = fix_worker(&r.f, 1);
    int64_t shape[1] = {2};
    const float ones[2] = {1, 1};
    assert_int_equal(qr_worker_declare(r.w[1], "w", 1, shape, "zeros", 1, -1, &r.wid[1]), QR_OK);
    assert_int_equal(qr_worker_declare_values(r.w[1], "b", 1, shape, ones, 2, "trainable=false",
                                              &r.bid[1]), QR_OK);
    assert_int_equal(qr_worker_initialize(r.w[1]), QR_OK);
    uint64_t pos = 0;
    assert_int_equal(qr_worker_data_position(r.w[1], &pos), QR_OK);
    assert_int_equal(pos, 42);
    assert_int_equal(qr_worker_data_position(r.w[0], &pos), QR_OK);
    assert_int_equal(pos, 0);
    finish(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_assign),
        cmocka_unit_test(test_sync_mean_of_pushers),
        cmocka_unit_test(test_refused_declarations),
        cmocka_unit_test(test_data_position_without_checkpoints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_partition.c - dense variables partitioned over several ps tasks
 * (TensorFlow's fixed-size and min-max partitioners), through the C API
 * against real ps tasks on threads (cluster_fixture.h):
 *   - a variable with partitions=N is N shards on N different ps tasks,
 *     rows of dimension 0 in order, placed least-loaded with the others;
 *     partition-min-mb splits by size;
 *   - the worker sees one tensor: the initial values are the unsplit
 *     variable's, and pulls, dense pushes and row pushes across a shard
 *     boundary give exactly what one ps gives;
 *   - a sync run (2 workers, Adam) of partitioned variables ends bit for
 *     bit where the same run of unpartitioned ones does;
 *   - shards are checkpointed as NAME/part_K and restored;
 *   - bad input: more shards than ps tasks or rows, a malformed option,
 *     partitions on a table, workers that disagree.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "world_fixture.h"
#include "common/init.h"

/* ---- placement ------------------------------------------------------------- */

/* 3 ps: "a" (10 x 4, partitions=2) takes ps 0 and 1 (20 floats each),
 * "b" (8) the least loaded, ps 2; "c" (30 x 2, partitions=3) one shard on
 * each, rows 10/10/10; "d" goes to ps 2 (8 + 20 = 28 < 40). */
static void test_placement(void **state) {
    (void)state;
    world s;
    world_start(&s, 3, 1, NULL);
    int64_t sa[2] = {10, 4}, sb[1] = {8}, sc[2] = {30, 2}, sd[1] = {4};
    int a, b, c, d, t;
    assert_int_equal(qr_worker_declare_opts(s.w[0], "a", 2, sa, "zeros", 1, "partitions=2", &a),
                     QR_OK);
    assert_int_equal(qr_worker_declare(s.w[0], "b", 1, sb, "zeros", 1, -1, &b), QR_OK);
    assert_int_equal(qr_worker_declare_opts(s.w[0], "c", 2, sc, "zeros", 1,
                                            "lr=0.5,partitions=3", &c), QR_OK);
    assert_int_equal(qr_worker_declare(s.w[0], "d", 1, sd, "zeros", 1, -1, &d), QR_OK);
    assert_int_equal(qr_worker_declare_table(s.w[0], "t", 4, "zeros", 1, "", &t), QR_OK);
    assert_int_equal(qr_worker_var_placement(s.w[0], a, 0, NULL, NULL, NULL), QR_ENOTREADY);
    world_init_all(&s);
    int ps[3];
    int64_t off[3], cnt[3];
    assert_int_equal(qr_worker_var_placement(s.w[0], a, 3, ps, off, cnt), 2);
    assert_true(ps[0] == 0 && ps[1] == 1 && off[0] == 0 && cnt[0] == 20 && off[1] == 20 &&
                cnt[1] == 20);
    assert_int_equal(qr_worker_var_placement(s.w[0], b, 3, ps, off, cnt), 1);
    assert_true(ps[0] == 2 && off[0] == 0 && cnt[0] == 8);
    assert_int_equal(qr_worker_var_placement(s.w[0], c, 3, ps, off, cnt), 3);
    /* loads 20, 20, 8: the least loaded first, ties to the lowest index */
    assert_true(ps[0] == 2 && ps[1] == 0 && ps[2] == 1);
    assert_true(off[1] == 20 && off[2] == 40 && cnt[0] == 20 && cnt[1] == 20 && cnt[2] == 20);
    assert_int_equal(qr_worker_var_placement(s.w[0], d, 3, ps, off, cnt), 1);
    assert_int_equal(ps[0], 2);
    assert_int_equal(qr_worker_var_placement(s.w[0], t, 3, ps, off, cnt), 0);
    assert_int_equal(qr_worker_var_size(s.w[0], c), 60);
    world_finish(&s);
}

/* partition-min-mb: a variable of 1 MiB + 4 bytes in shards of at least
 * 0.25 MiB over 3 ps is 3 shards (at most one per ps); a smaller one is
 * not split. Rows: 65537 of 4 floats split 21846/21846/21845. */
static void test_min_mb(void **state) {
    (void)state;
    world s;
    static const char *const opts[] = {"partition-min-mb", "0.25", NULL};
    world_start(&s, 3, 1, opts);
    int64_t big[2] = {65537, 4}, small[1] = {65536};
    int b, m;
    assert_int_equal(qr_worker_declare(s.w[0], "big", 2, big, "uniform:-1,1", 3, -1, &b), QR_OK);
    assert_int_equal(qr_worker_declare(s.w[0], "small", 1, small, "zeros", 1, -1, &m), QR_OK);
    world_init_all(&s);
    int64_t cnt[3];
    assert_int_equal(qr_worker_var_placement(s.w[0], b, 3, NULL, NULL, cnt), 3);
    assert_true(cnt[0] == 21846 * 4 && cnt[1] == 21846 * 4 && cnt[2] == 21845 * 4);
    assert_int_equal(qr_worker_var_placement(s.w[0], m, 3, NULL, NULL, NULL), 1);
    /* The chief filled the whole tensor before splitting it: its values
     * are the unsplit variable's. */
    float *want = malloc((size_t)65537 * 4 * sizeof *want);
    assert_int_equal(qr_init_fill(want, 65537 * 4, 2, big, "uniform:-1,1", 3), QR_OK);
    float *got = malloc((size_t)65537 * 4 * sizeof *got);
    float *dst[1] = {got};
    assert_int_equal(qr_worker_pull(s.w[0], 1, &b, dst), QR_OK);
    assert_memory_equal(got, want, (size_t)65537 * 4 * sizeof *got);
    free(want);
    free(got);
    world_finish(&s);
}

/* ---- one tensor ------------------------------------------------------------ */

/* Async SGD lr 0.5 on "w" (5 x 2) with `options`, over 2 ps: a dense push,
 * then rows 1 and 3 (both sides of the 3/2 split) pushed twice, summed.
 * The pulled values. */
static void async_run(const char *options, float first[10], float out[10]) {
    world s;
    static const char *const opts[] = {"lr", "0.5", NULL};
    world_start(&s, 2, 1, opts);
    int64_t shape[2] = {5, 2};
    int v;
    assert_int_equal(qr_worker_declare_opts(s.w[0], "w", 2, shape, "normal:0,1", 9, options, &v),
                     QR_OK);
    world_init_all(&s);
    float g[10];
    for (int i = 0; i < 10; i++) g[i] = (float)i - 4.5f;
    const float *grads[1] = {g};
    /* Fused: each shard's ps answers with its part after the apply. */
    assert_int_equal(qr_worker_push_pull(s.w[0], 1, &v, grads, NULL, QR_PUSH_STEP, NULL), QR_OK);
    memcpy(first, qr_worker_var_data(s.w[0], v), 10 * sizeof *first);
    int64_t rows[3] = {3, 1, 3};
    float rg[6] = {1, 2, 3, 4, 5, 6};
    assert_int_equal(qr_worker_push_sparse(s.w[0], v, 3, rows, rg, 0, NULL), QR_OK);
    assert_int_equal(qr_worker_pull(s.w[0], 0, NULL, NULL), QR_OK);
    memcpy(out, qr_worker_var_data(s.w[0], v), 10 * sizeof *out);
    world_finish(&s);
}

static void test_one_tensor(void **state) {
    (void)state;
    float whole[10], split[10], want[10], first_whole[10], first_split[10];
    async_run("", first_whole, whole);
    async_run("partitions=2", first_split, split);
    int64_t shape[2] = {5, 2};
    assert_int_equal(qr_init_fill(want, 10, 2, shape, "normal:0,1", 9), QR_OK);
    for (int i = 0; i < 10; i++) {
        float after = want[i] - 0.5f * ((float)i - 4.5f);
        assert_true(first_whole[i] == after && first_split[i] == after);
    }
    float row1[2] = {3, 4}, row3[2] = {1 + 5, 2 + 6};
    for (int i = 0; i < 10; i++) {
        want[i] -= 0.5f * ((float)i - 4.5f);
        if (i / 2 == 1) want[i] -= 0.5f * row1[i % 2];
        if (i / 2 == 3) want[i] -= 0.5f * row3[i % 2];
    }
    assert_memory_equal(whole, want, sizeof want);
    assert_memory_equal(split, want, sizeof want);
}

/* ---- sync -------------------------------------------------------------------- */

typedef struct sync_arg {
    qr_worker *w;
    int index, var[2];
    bool fused; /* qr_worker_push_pull instead of push, take_token, pull */
    int rc;
} sync_arg;

static void *sync_thread(void *p) {
    sync_arg *a = p;
    int n[2] = {6 * 3, 7};
    float g0[18], g1[7];
    const float *grads[2] = {g0, g1};
    for (int step = 0; step < 4 && !a->rc; step++) {
        for (int i = 0; i < n[0]; i++) g0[i] = sinf((float)(i + 1) * (float)(step + 1)) * (float)(a->index + 1);
        for (int i = 0; i < n[1]; i++) g1[i] = cosf((float)(i + 3) * (float)(step + 2)) - (float)a->index;
        if (a->fused) {
            a->rc = qr_worker_push_pull(a->w, 2, a->var, grads, NULL, QR_PUSH_STEP, NULL);
            continue;
        }
        a->rc = qr_worker_push(a->w, 2, a->var, grads, QR_PUSH_STEP, NULL);
        int64_t token;
        if (!a->rc) a->rc = qr_worker_take_token(a->w, &token);
        if (!a->rc) a->rc = qr_worker_pull(a->w, 0, NULL, NULL);
    }
    return NULL;
}

/* Four sync steps of 2 workers with Adam over 2 ps; the final values of
 * "w" (6 x 3) and "v" (7). */
static void sync_run(const char *min_mb, bool fused, float w_out[18], float v_out[7]) {
    world s;
    const char *const opts[] = {"mode", "sync", "optimizer", "adam", "lr", "0.1",
                                "partition-min-mb", min_mb, NULL};
    world_start(&s, 2, 2, opts);
    sync_arg a[2];
    int64_t sw[2] = {6, 3}, sv[1] = {7};
    for (int i = 0; i < 2; i++) {
        a[i] = (sync_arg){.w = s.w[i], .index = i, .fused = fused};
        assert_int_equal(qr_worker_declare(s.w[i], "w", 2, sw, "glorot_uniform", 4, -1, &a[i].var[0]),
                         QR_OK);
        assert_int_equal(qr_worker_declare(s.w[i], "v", 1, sv, "uniform:-1,1", 5, -1, &a[i].var[1]),
                         QR_OK);
    }
    world_init_all(&s);
    /* 0.00005 MiB is 52 bytes: "w" (72 bytes) splits in 2, "v" (28) not. */
    assert_int_equal(qr_worker_var_placement(s.w[1], a[1].var[0], 0, NULL, NULL, NULL),
                     strcmp(min_mb, "0") ? 2 : 1);
    assert_int_equal(qr_worker_var_placement(s.w[1], a[1].var[1], 0, NULL, NULL, NULL), 1);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, sync_thread, &a[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) assert_int_equal(a[i].rc, QR_OK);
    memcpy(w_out, qr_worker_var_data(s.w[0], a[0].var[0]), 18 * sizeof *w_out);
    memcpy(v_out, qr_worker_var_data(s.w[0], a[0].var[1]), 7 * sizeof *v_out);
    float other[18];
    memcpy(other, qr_worker_var_data(s.w[1], a[1].var[0]), sizeof other);
    assert_memory_equal(other, w_out, sizeof other);
    world_finish(&s);
}

static void test_sync_same_as_unpartitioned(void **state) {
    (void)state;
    float w1[18], v1[7], w2[18], v2[7], w0[18], w3[18], v3[7];
    int64_t sw[2] = {6, 3};
    assert_int_equal(qr_init_fill(w0, 18, 2, sw, "glorot_uniform", 4), QR_OK);
    sync_run("0", false, w1, v1);
    sync_run("0.00005", false, w2, v2);
    sync_run("0.00005", true, w3, v3); /* push_pull: the same steps, the same values */
    assert_true(memcmp(w1, w0, sizeof w0) != 0); /* it trained */
    assert_memory_equal(w2, w1, sizeof w1);
    assert_memory_equal(v2, v1, sizeof v1);
    assert_memory_equal(w3, w1, sizeof w1);
    assert_memory_equal(v3, v1, sizeof v1);
}

/* ---- checkpoints ------------------------------------------------------------ */

/* Adagrad over 2 ps, "w" (9 x 2) in 2 shards: `pushes` pushes, then its
 * values into out (before: the values at start, after a restore). */
static void ckpt_run(const char *dir, int pushes, float *before, float out[18]) {
    world s;
    const char *const opts[] = {"optimizer", "adagrad", "lr", "0.3",
                                dir ? "checkpoint-dir" : NULL, dir, NULL};
    world_start(&s, 2, 1, opts);
    int64_t shape[2] = {9, 2};
    int v;
    assert_int_equal(qr_worker_declare_opts(s.w[0], "w", 2, shape, "uniform:-1,1", 2,
                                            "partitions=2", &v), QR_OK);
    world_init_all(&s);
    if (before) memcpy(before, qr_worker_var_data(s.w[0], v), 18 * sizeof *before);
    float g[18];
    for (int i = 0; i < 18; i++) g[i] = 0.1f * (float)(i % 5) - 0.15f;
    const float *grads[1] = {g};
    for (int k = 0; k < pushes; k++)
        assert_int_equal(qr_worker_push(s.w[0], 1, &v, grads, QR_PUSH_STEP, NULL), QR_OK);
    assert_int_equal(qr_worker_pull(s.w[0], 1, &v, NULL), QR_OK);
    memcpy(out, qr_worker_var_data(s.w[0], v), 18 * sizeof *out);
    world_finish(&s);
}

/* The shards and their Adagrad slots survive a checkpoint: the values
 * restored are those saved, and one more push gives what two pushes give
 * without a restore. The shard files hold NAME/part_K. */
static void test_checkpoint_restore(void **state) {
    (void)state;
    char dir[] = "/tmp/qr-partition-ckpt-XXXXXX";
    assert_non_null(mkdtemp(dir));
    float once[18], restored[18], twice[18], straight[18];
    ckpt_run(dir, 1, NULL, once);
    ckpt_run(dir, 1, restored, twice);
    assert_memory_equal(restored, once, sizeof once);
    ckpt_run(NULL, 2, NULL, straight);
    assert_memory_equal(twice, straight, sizeof twice);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "grep -rlq 'w/part_0' %s && grep -rlq 'w/part_1' %s", dir, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* ---- bad input ------------------------------------------------------------- */

static void test_bad_input(void **state) {
    (void)state;
    world s;
    world_start(&s, 2, 2, NULL);
    int64_t shape[2] = {4, 2}, one[1] = {1}, vec[1] = {6};
    int v;
    assert_int_equal(qr_worker_declare_opts(s.w[0], "x", 2, shape, "zeros", 1, "partitions=0",
                                            NULL), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "partitions=0"));
    assert_int_equal(qr_worker_declare_opts(s.w[0], "x", 2, shape, "zeros", 1, "partitions=2x",
                                            NULL), QR_EINVAL);
    assert_int_equal(qr_worker_declare_table(s.w[0], "t", 2, "zeros", 1, "partitions=2", NULL),
                     QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "table"));
    /* More shards than ps tasks, or than rows: initialize says which. */
    qr_worker *extra = fix_worker(&s.f, 0);
    assert_int_equal(qr_worker_declare_opts(extra, "x", 2, shape, "zeros", 1, "partitions=3",
                                            NULL), QR_OK);
    assert_int_equal(qr_worker_initialize(extra), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "2 ps tasks"));
    qr_worker_free(extra);
    extra = fix_worker(&s.f, 0);
    assert_int_equal(qr_worker_declare_opts(extra, "x", 1, one, "zeros", 1, "partitions=2",
                                            NULL), QR_OK);
    assert_int_equal(qr_worker_initialize(extra), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "only 1 rows"));
    qr_worker_free(extra);
    /* A worker that splits what the chief did not is refused by the ps. */
    assert_int_equal(qr_worker_declare_opts(s.w[0], "x", 2, shape, "zeros", 1, "partitions=2",
                                            &v), QR_OK);
    assert_int_equal(qr_worker_declare_opts(s.w[0], "y", 1, vec, "zeros", 1, "partitions=2",
                                            NULL), QR_OK);
    assert_int_equal(qr_worker_declare(s.w[1], "x", 2, shape, "zeros", 1, -1, NULL), QR_OK);
    assert_int_equal(qr_worker_declare_opts(s.w[1], "y", 1, vec, "zeros", 1, "partitions=2",
                                            NULL), QR_OK);
    assert_int_equal(qr_worker_initialize(s.w[0]), QR_OK);
    assert_int_not_equal(qr_worker_initialize(s.w[1]), QR_OK);
    fprintf(stderr, "as expected: %s\n", qr_last_error());
    /* Rows of a 1-D variable split in two cannot be pushed as rows. */
    int64_t row = 0;
    float g[6] = {0};
    assert_int_equal(qr_worker_add_rows(s.w[0], 1, 1, &row, g), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "densely"));
    qr_worker_free(s.w[1]);
    s.f.nworkers = 1;
    world_finish(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placement),
        cmocka_unit_test(test_min_mb),
        cmocka_unit_test(test_one_tensor),
        cmocka_unit_test(test_sync_same_as_unpartitioned),
        cmocka_unit_test(test_checkpoint_restore),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

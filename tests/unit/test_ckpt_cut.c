/*
 * test_ckpt_cut.c - async checkpoints over two ps tasks are consistent
 * cuts, with a workload where a torn one would show.
 *
 * Variables a (on ps 0) and b (on ps 1), 512 floats each, start at zero.
 * Three workers push as fast as they can, concurrently, a gradient of -1
 * for both in one push call, with SGD at lr 1 and the step flag: every
 * call adds exactly 1 to every element of a and of b, and 1 to the global
 * step. A checkpoint is asked for every 5 global steps. In a consistent
 * cut each call is in both shards or in neither, so in every checkpoint
 *     a == b == global_step   (element by element)
 * A checkpoint that snapshotted ps 0 and ps 1 at different moments would
 * hold a call on one shard only, and a != b.
 *
 * Then the unit pieces of the format: a shard's bytes corrupted, cut
 * short, or its manifest torn are refused by qr_ckpt_verify, naming the
 * file. And saves asked for while one is being written.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "ckpt/ckpt.h"
#include "cluster_fixture.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NWORKERS 3
#define PUSHES 1500
#define N 512

typedef struct wk_arg {
    cluster_fixture *f;
    int index;
    int status;
} wk_arg;

/* Twice in the run every worker stops at this barrier and the chief asks
 * for a checkpoint on demand, so that at least three are complete however
 * slowly a loaded machine writes the periodic ones (a CI run under load
 * once ended with fewer: they are skipped while one is being written).
 * The periodic ones, cut while every worker pushes, are the test. */
static pthread_barrier_t phase;

static void *worker_main(void *arg) {
    wk_arg *a = arg;
    qr_worker *w = fix_worker(a->f, a->index);
    int64_t shape[1] = {N};
    int ids[2];
    a->status = !w;
    if (!a->status) a->status = qr_worker_declare(w, "a", 1, shape, "zeros", 1, -1, &ids[0]);
    if (!a->status) a->status = qr_worker_declare(w, "b", 1, shape, "zeros", 2, -1, &ids[1]);
    if (!a->status) a->status = qr_worker_initialize(w);
    float *g = malloc(N * sizeof *g);
    for (int i = 0; i < N; i++) g[i] = -1.0f;
    const float *grads[2] = {g, g};
    for (int k = 0; k < PUSHES; k++) {
        if (k == PUSHES / 3 || k == 2 * PUSHES / 3) {
            pthread_barrier_wait(&phase); /* every worker, even a failed one */
            if (a->index == 0 && !a->status) a->status = qr_worker_checkpoint(w, NULL);
            pthread_barrier_wait(&phase);
        }
        if (!a->status) a->status = qr_worker_push(w, 2, ids, grads, QR_PUSH_STEP, NULL);
    }
    if (a->status) fprintf(stderr, "worker %d: %s\n", a->index, qr_last_error());
    free(g);
    a->f = (cluster_fixture *)w; /* handed back, freed by the test */
    return NULL;
}

static void read_tensor(const char *ckpt, int shard, const char *name, float *out) {
    char file[64], path[4200];
    qr_ckpt_shard_name(file, sizeof file, shard, 2);
    snprintf(path, sizeof path, "%s/%s", ckpt, file);
    qr_st_file f;
    assert_int_equal(qr_st_open(&f, path), QR_OK);
    const qr_st_tensor *t = qr_st_find(&f, name);
    assert_non_null(t);
    assert_int_equal(t->end - t->begin, N * 4);
    assert_int_equal(qr_st_read(&f, t, out), QR_OK);
    qr_st_close(&f);
}

static char dir[256];

static void test_async_cut_is_consistent(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/qr-test-cut-%d", (int)getpid());
    cluster_fixture f;
    fix_init(&f, 2, NWORKERS);
    qr_config_set(f.cfg, "mode", "async");
    qr_config_set(f.cfg, "lr", "1");
    qr_config_set(f.cfg, "checkpoint-dir", dir);
    qr_config_set(f.cfg, "checkpoint-steps", "5");
    qr_config_set(f.cfg, "keep-checkpoints", "100000");
    assert_int_equal(fix_start_ps(&f, 0), QR_OK);
    assert_int_equal(fix_start_ps(&f, 1), QR_OK);
    pthread_t t[NWORKERS];
    wk_arg args[NWORKERS];
    pthread_barrier_init(&phase, NULL, NWORKERS);
    for (int i = 0; i < NWORKERS; i++) {
        args[i] = (wk_arg){.f = &f, .index = i};
        pthread_create(&t[i], NULL, worker_main, &args[i]);
    }
    for (int i = 0; i < NWORKERS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&phase);
    for (int i = 0; i < NWORKERS; i++) assert_int_equal(args[i].status, QR_OK);
    qr_worker *chief = (qr_worker *)args[0].f;
    assert_int_equal(qr_worker_stop_cluster(chief), QR_OK);
    for (int i = 0; i < NWORKERS; i++) qr_worker_free((qr_worker *)args[i].f);
    fix_join(&f);

    qr_ckpt_info *list;
    int n;
    assert_int_equal(qr_ckpt_list(dir, &list, &n), QR_OK);
    float a[N], b[N];
    int complete = 0, increments = 0;
    for (int i = 0; i < n; i++) {
        if (!list[i].complete) continue;
        complete++;
        /* Increments (checkpoint-full-every's default) are cuts too: a and b
         * change at every step, so every one holds both. */
        increments += list[i].incremental;
        qr_ckpt_info *chain;
        int links;
        assert_int_equal(qr_ckpt_chain(&list[i], &chain, &links), QR_OK);
        assert_int_equal(chain[0].incremental, false);
        qr_ckpt_list_free(chain, links);
        read_tensor(list[i].path, 0, "a", a);
        read_tensor(list[i].path, 1, "b", b);
        for (int k = 0; k < N; k++) {
            if (a[k] != b[k] || a[k] != (float)list[i].step)
                fail_msg("%s: a[%d] = %g, b[%d] = %g, global step %lld: a torn cut", list[i].path,
                         k, a[k], k, b[k], (long long)list[i].step);
        }
    }
    /* The final checkpoint holds every push. */
    assert_true(n > 0 && list[0].complete && list[0].step == NWORKERS * PUSHES);
    printf("%d checkpoints (%d incremental), every one with a == b == global step\n", complete,
           increments);
    assert_true(increments > 0);
    assert_true(complete >= 3); /* two on demand and the final one at least */
    qr_ckpt_list_free(list, n);
}

/* Two ps tasks, SGD at lr 1, checkpoints in /tmp/qr-test-TAG-PID (where). */
static void start_saving(cluster_fixture *f, int nworkers, char *where, size_t len,
                         const char *tag) {
    snprintf(where, len, "/tmp/qr-test-%s-%d", tag, (int)getpid());
    fix_init(f, 2, nworkers);
    qr_config_set(f->cfg, "lr", "1");
    qr_config_set(f->cfg, "checkpoint-dir", where);
    assert_int_equal(fix_start_ps(f, 0), QR_OK);
    assert_int_equal(fix_start_ps(f, 1), QR_OK);
}

/* qr_worker_checkpoint: a checkpoint on demand, between the periodic
 * ones (none here), holding every push made before the call; asked again
 * with no push since, the same one; refused without --checkpoint-dir. */
static void test_checkpoint_on_demand(void **state) {
    (void)state;
    char where[256];
    cluster_fixture f;
    start_saving(&f, 1, where, sizeof where, "save");
    qr_worker *w = fix_worker(&f, 0);
    int64_t shape[1] = {N};
    int ids[2];
    assert_int_equal(qr_worker_declare(w, "a", 1, shape, "zeros", 1, -1, &ids[0]), QR_OK);
    assert_int_equal(qr_worker_declare(w, "b", 1, shape, "zeros", 2, -1, &ids[1]), QR_OK);
    assert_int_equal(qr_worker_initialize(w), QR_OK);
    float g[N], a[N];
    for (int i = 0; i < N; i++) g[i] = -1.0f;
    const float *grads[2] = {g, g};
    int64_t step = -1;
    for (int round = 1; round <= 2; round++) {
        for (int k = 0; k < 7; k++)
            assert_int_equal(qr_worker_push(w, 2, ids, grads, QR_PUSH_STEP, NULL), QR_OK);
        assert_int_equal(qr_worker_checkpoint(w, &step), QR_OK);
        assert_int_equal(step, 7 * round);
        qr_ckpt_info *list;
        int n;
        assert_int_equal(qr_ckpt_list(where, &list, &n), QR_OK);
        assert_true(n == round && list[0].complete && list[0].step == step);
        read_tensor(list[0].path, 1, "b", a);
        assert_true(a[0] == (float)step && a[N - 1] == (float)step);
        qr_ckpt_list_free(list, n);
        int64_t again = -1;
        assert_int_equal(qr_worker_checkpoint(w, &again), QR_OK); /* no push since */
        assert_int_equal(again, step);
    }
    assert_int_equal(qr_worker_stop_cluster(w), QR_OK);
    qr_worker_free(w);
    fix_join(&f);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", where);
    assert_int_equal(system(cmd), 0);

    fix_init(&f, 1, 1);
    assert_int_equal(fix_start_ps(&f, 0), QR_OK);
    w = fix_worker(&f, 0);
    assert_int_equal(qr_worker_declare(w, "a", 1, shape, "zeros", 1, -1, &ids[0]), QR_OK);
    assert_int_equal(qr_worker_initialize(w), QR_OK);
    assert_int_equal(qr_worker_checkpoint(w, NULL), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "without --checkpoint-dir"));
    assert_int_equal(qr_worker_stop_cluster(w), QR_OK);
    qr_worker_free(w);
    fix_join(&f);
}

/* The newest checkpoint of the run above, damaged three ways. */
static void test_verify_names_the_damage(void **state) {
    (void)state;
    qr_ckpt_info c;
    assert_int_equal(qr_ckpt_latest(dir, &c), QR_OK);
    char shard[4200];
    snprintf(shard, sizeof shard, "%s/%s", c.path, c.shards[1].file);
    FILE *fp = fopen(shard, "r+b");
    fseek(fp, -5, SEEK_END);
    int byte = fgetc(fp);
    fseek(fp, -5, SEEK_END);
    fputc(byte ^ 0x40, fp);
    fclose(fp);
    assert_int_equal(qr_ckpt_verify(&c), QR_EIO);
    assert_non_null(strstr(qr_last_error(), "crc32"));
    assert_non_null(strstr(qr_last_error(), c.shards[1].file));
    assert_int_equal(truncate(shard, (off_t)c.shards[1].bytes - 100), 0);
    assert_int_equal(qr_ckpt_verify(&c), QR_EIO);
    assert_non_null(strstr(qr_last_error(), "truncated"));
    /* The newest now fails: latest falls back to the one before it. */
    qr_ckpt_info prev;
    assert_int_equal(qr_ckpt_latest(dir, &prev), QR_OK);
    assert_true(prev.step < c.step);
    qr_ckpt_info_free(&prev);
    qr_ckpt_info_free(&c);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* ---- a save asked for while one is written ---------------------------------- */

#define BIG (8 << 20) /* floats a variable: a write long enough to ask into */

typedef struct save_arg {
    qr_worker *w;
    int64_t step;
    int status;
    double answered; /* when qr_worker_checkpoint returned */
} save_arg;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *save_main(void *arg) {
    save_arg *a = arg;
    a->status = qr_worker_checkpoint(a->w, &a->step);
    a->answered = now_s();
    return NULL;
}

/* Worker 1 asks for a save while the one worker 0 asked for is being
 * written, the global step unchanged: both are answered with that one
 * checkpoint, and no second one is started at the same step (it was,
 * written into the first one's folder, over its own base). Each round
 * pushes one step first; the round counts only when worker 1 asked
 * before worker 0's answer came (a fast disk may write the checkpoint
 * first). */
static void test_saves_while_one_is_written(void **state) {
    (void)state;
    char where[256];
    cluster_fixture f;
    start_saving(&f, 2, where, sizeof where, "saves");
    qr_worker *w[2] = {fix_worker(&f, 0), fix_worker(&f, 1)};
    int64_t shape[1] = {BIG};
    int ids[2];
    for (int k = 0; k < 2; k++) {
        assert_int_equal(qr_worker_declare(w[k], "a", 1, shape, "zeros", 1, -1, &ids[0]), QR_OK);
        assert_int_equal(qr_worker_declare(w[k], "b", 1, shape, "zeros", 2, -1, &ids[1]), QR_OK);
    }
    assert_int_equal(qr_worker_initialize(w[0]), QR_OK);
    assert_int_equal(qr_worker_initialize(w[1]), QR_OK);
    float *g = malloc(BIG * sizeof *g);
    for (int i = 0; i < BIG; i++) g[i] = -1.0f;
    const float *grads[2] = {g, g};
    int rounds = 0, inside = 0;
    while (rounds < 6 && inside < 2) {
        rounds++;
        assert_int_equal(qr_worker_push(w[0], 2, ids, grads, QR_PUSH_STEP, NULL), QR_OK);
        save_arg first = {.w = w[0]}, second = {.w = w[1]};
        pthread_t t;
        pthread_create(&t, NULL, save_main, &first);
        usleep(30 * 1000); /* worker 0's SAVE has reached ps 0 */
        double asked = now_s();
        save_main(&second);
        pthread_join(t, NULL);
        assert_int_equal(first.status, QR_OK);
        assert_int_equal(second.status, QR_OK);
        assert_int_equal(first.step, rounds);
        assert_int_equal(second.step, rounds);
        inside += asked < first.answered;
    }
    printf("%d rounds, %d with worker 1's save asked while worker 0's was written\n", rounds,
           inside);
    assert_true(inside > 0);
    /* One checkpoint a round: the first full, each next an increment of
     * the one before, every chain whole. */
    qr_ckpt_info *list;
    int n;
    assert_int_equal(qr_ckpt_list(where, &list, &n), QR_OK);
    assert_int_equal(n, rounds);
    for (int i = 0; i < n; i++) {
        qr_ckpt_info *c = &list[n - 1 - i]; /* oldest first */
        assert_true(c->complete);
        assert_int_equal(c->step, i + 1);
        assert_int_equal(c->incremental, i > 0);
        if (i > 0) assert_int_equal(c->base_step, i);
        qr_ckpt_info *chain;
        int nchain;
        assert_int_equal(qr_ckpt_chain(c, &chain, &nchain), QR_OK);
        assert_int_equal(nchain, i + 1);
        qr_ckpt_list_free(chain, nchain);
    }
    qr_ckpt_list_free(list, n);
    free(g);
    assert_int_equal(qr_worker_stop_cluster(w[0]), QR_OK);
    qr_worker_free(w[0]);
    qr_worker_free(w[1]);
    fix_join(&f);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", where);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_cut_is_consistent),
        cmocka_unit_test(test_verify_names_the_damage),
        cmocka_unit_test(test_checkpoint_on_demand),
        cmocka_unit_test(test_saves_while_one_is_written),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

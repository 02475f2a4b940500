/*
 * test_table_tier.c - tables larger than memory (--table-memory-mb, the
 * LMDB disk tier of src/ps/tier.c), through the C API against a real ps
 * on a thread (world_fixture.h):
 *   - a table four times its cap, trained with Adagrad by skewed batches,
 *     holds every row exactly: its values, and its slots (one more push
 *     to every row gives the same values), bit for bit those of the same
 *     pushes on an all-in-memory table; the statistics show both tiers,
 *     hits and misses, and the rows in memory within the cap;
 *   - a checkpoint taken with rows in both tiers restores them all (under
 *     the cap again, the memory of the rows spilled given back), and
 *     training goes on as without the checkpoint;
 *   - with admission (admit_after) and eviction by age (evict_after_steps)
 *     the same: rows, and what admission and eviction counted, equal to
 *     an all-in-memory run's (rows evicted from both tiers);
 *   - a spill goes below the cap, to a low-water mark, so that the next
 *     requests need none; the rows stay exact;
 *   - a request larger than the cap is refused with a message naming it;
 *     a cap out of range and a cap with --ps-replicas 2 are refused;
 *   - --table-dir: the files live in DIR/ps-0, a stale file there is
 *     cleared at start, and they are removed at the end.
 * The resident memory, measured from outside, is test_table_tier.py's.
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

#define DIM 16
#define ROWS 28000 /* about 4x the 7,200 rows of dim 16 with Adagrad in 1 MiB */
#define CHUNK 2000
#define BATCH 1024

/* Deterministic gradient rows of a step. */
static void grads(int step, const int64_t *ids, int n, float *g) {
    for (int i = 0; i < n; i++)
        for (int d = 0; d < DIM; d++)
            g[i * DIM + d] = 0.1f * sinf(0.001f * (float)ids[i] + 0.37f * (float)step + (float)d);
}

/* Skewed ids (most mass on few): floor(ROWS * u^3), u from a seeded LCG. */
static void skewed_batch(uint64_t *lcg, int64_t *ids) {
    for (int i = 0; i < BATCH; i++) {
        *lcg = *lcg * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(*lcg >> 11) / 9007199254740992.0;
        ids[i] = (int64_t)(ROWS * u * u * u) * 7 - 5000; /* spread, some negative */
    }
}

static int64_t *all_ids(void) {
    int64_t *ids = malloc(ROWS * sizeof *ids);
    assert_non_null(ids);
    for (int i = 0; i < ROWS; i++) ids[i] = (int64_t)i * 7 - 5000;
    return ids;
}

/* Every row pulled (read-only, in chunks) into out [ROWS x DIM]. */
static void pull_all(qr_worker *w, int t, const int64_t *ids, float *out) {
    for (int at = 0; at < ROWS; at += CHUNK)
        assert_int_equal(qr_worker_pull_rows(w, t, CHUNK, ids + at, out + (size_t)at * DIM,
                                              QR_ROWS_READ_ONLY), QR_OK);
}

/* A push of every row (in chunks), step `step`. */
static void push_all(qr_worker *w, int t, const int64_t *ids, int step) {
    float *g = malloc((size_t)CHUNK * DIM * sizeof *g);
    assert_non_null(g);
    for (int at = 0; at < ROWS; at += CHUNK) {
        grads(step, ids + at, CHUNK, g);
        assert_int_equal(qr_worker_push_sparse(w, t, CHUNK, ids + at, g, QR_PUSH_STEP, NULL),
                         QR_OK);
    }
    free(g);
}

static double table_stat(qr_worker *w, const char *figure) {
    char buf[8192], key[64];
    assert_int_equal(qr_worker_stats(w, buf, sizeof buf), QR_OK);
    const char *at = strstr(buf, "\"emb\":{");
    assert_non_null(at);
    snprintf(key, sizeof key, "\"%s\":", figure);
    at = strstr(at, key);
    assert_non_null(at);
    return strtod(at + strlen(key), NULL);
}

/* The options of a run: a cap of mb MiB (0: none), a checkpoint dir or NULL. */
static void start(world *s, const char *mb, const char *dir) {
    const char *opts[9] = {"optimizer", "adagrad", "lr", "0.3"};
    int k = 4;
    if (mb) {
        opts[k++] = "table-memory-mb";
        opts[k++] = mb;
    }
    if (dir) {
        opts[k++] = "checkpoint-dir";
        opts[k++] = dir;
    }
    opts[k] = NULL;
    world_start(s, 1, 1, opts);
}

/* Training: every row once, then skewed batches; the rows after it into
 * out, then after one more push of every row into again. */
static void train(qr_worker *w, int t, const int64_t *ids, float *out, float *again) {
    push_all(w, t, ids, 0);
    uint64_t lcg = 12345;
    int64_t batch[BATCH];
    float g[BATCH * DIM];
    for (int step = 1; step <= 60; step++) {
        skewed_batch(&lcg, batch);
        grads(step, batch, BATCH, g);
        assert_int_equal(qr_worker_push_sparse(w, t, BATCH, batch, g, QR_PUSH_STEP, NULL), QR_OK);
        if (step % 5 == 0) { /* lookups between pushes, as training does */
            float rows[BATCH * DIM];
            assert_int_equal(qr_worker_pull_rows(w, t, BATCH, batch, rows, 0), QR_OK);
        }
    }
    pull_all(w, t, ids, out);
    if (again) {
        push_all(w, t, ids, 99);
        pull_all(w, t, ids, again);
    }
}

static int declare_with(world *s, const char *options) {
    int t;
    assert_int_equal(qr_worker_declare_table(s->w[0], "emb", DIM, "uniform:-0.5,0.5", 9, options,
                                             &t), QR_OK);
    world_init_all(s);
    return t;
}

static int declare(world *s) {
    return declare_with(s, "");
}

static void test_four_times_the_cap_exact(void **state) {
    (void)state;
    int64_t *ids = all_ids();
    size_t bytes = (size_t)ROWS * DIM * sizeof(float);
    float *mem = malloc(bytes), *mem2 = malloc(bytes), *tier = malloc(bytes),
          *tier2 = malloc(bytes);
    assert_true(mem && mem2 && tier && tier2);
    world s;
    start(&s, NULL, NULL);
    int t = declare(&s);
    train(s.w[0], t, ids, mem, mem2);
    world_finish(&s);

    start(&s, "1", NULL);
    t = declare(&s);
    train(s.w[0], t, ids, tier, NULL);
    /* Both tiers hold rows; memory within the cap (row cost: dim 16 value
     * and accumulator, id, index slot, mark: 145 bytes). */
    double in_memory = table_stat(s.w[0], "rows_memory"), on_disk = table_stat(s.w[0], "rows_disk");
    assert_true(in_memory * 145 <= 1 << 20);
    assert_true(on_disk > 2 * in_memory);
    assert_true(in_memory + on_disk == ROWS);
    assert_true(table_stat(s.w[0], "rows") == ROWS);
    assert_true(table_stat(s.w[0], "disk_hits") > 0);
    assert_true(table_stat(s.w[0], "memory_hits") > 0);
    assert_true(table_stat(s.w[0], "rows_spilled") > 0);
    assert_true(table_stat(s.w[0], "disk_bytes") > on_disk * DIM * 8);
    push_all(s.w[0], t, ids, 99);
    pull_all(s.w[0], t, ids, tier2);
    world_finish(&s);
    assert_memory_equal(tier, mem, bytes);
    /* Adagrad's accumulators came back with their rows. */
    assert_memory_equal(tier2, mem2, bytes);
    free(mem), free(mem2), free(tier), free(tier2), free(ids);
}

static void test_checkpoint_both_tiers(void **state) {
    (void)state;
    char dir[] = "/tmp/qr-tier-ckpt-XXXXXX";
    assert_non_null(mkdtemp(dir));
    int64_t *ids = all_ids();
    size_t bytes = (size_t)ROWS * DIM * sizeof(float);
    float *before = malloc(bytes), *restored = malloc(bytes), *after = malloc(bytes),
          *straight = malloc(bytes), *straight2 = malloc(bytes);
    assert_true(before && restored && after && straight && straight2);
    world s;
    start(&s, "1", dir);
    int t = declare(&s);
    train(s.w[0], t, ids, before, NULL);
    assert_true(table_stat(s.w[0], "rows_disk") > 0);
    assert_int_equal(qr_worker_checkpoint(s.w[0], NULL), QR_OK);
    world_finish(&s);

    start(&s, "1", dir); /* restores, and spills what exceeds the cap */
    t = declare(&s);
    assert_true(table_stat(s.w[0], "rows") == ROWS);
    assert_true(table_stat(s.w[0], "rows_memory") * 145 <= 1 << 20);
    /* The restore made every row in memory before the spill; what they
     * held is given back (qr_table_trim): two chunks (the one in use and
     * a spare, 2 MiB each), ids, change flags and index sized for the
     * rows left (4.44 MB here; sized for all 28,000 rows, the ids and
     * index alone pass the bound). */
    assert_true(table_stat(s.w[0], "bytes") <=
                (4 << 20) + table_stat(s.w[0], "rows_memory") * 2 * (8 + 1 + 16));
    pull_all(s.w[0], t, ids, restored);
    push_all(s.w[0], t, ids, 99);
    pull_all(s.w[0], t, ids, after);
    world_finish(&s);
    assert_memory_equal(restored, before, bytes);

    start(&s, NULL, NULL);
    t = declare(&s);
    train(s.w[0], t, ids, straight, straight2);
    world_finish(&s);
    assert_memory_equal(after, straight2, bytes);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    free(before), free(restored), free(after), free(straight), free(straight2), free(ids);
}

/* Admission and eviction across the tiers: the same pushes and lookups
 * with and without a cap give the same rows and the same counts. */
static void test_admission_eviction_across_tiers(void **state) {
    (void)state;
    static const char *const figures[] = {"rows", "admitted", "unadmitted_reads", "dropped_rows",
                                          "evicted", "admission_candidates"};
    int64_t *ids = all_ids();
    size_t bytes = (size_t)ROWS * DIM * sizeof(float);
    float *mem = malloc(bytes), *tier = malloc(bytes);
    assert_true(mem && tier);
    double counts[2][6];
    for (int capped = 0; capped < 2; capped++) {
        world s;
        start(&s, capped ? "1" : NULL, NULL);
        int t = declare_with(&s, "admit_after=2,evict_after_steps=30");
        /* The first half of the ids sighted twice (admitted: rows, most
         * on disk), the rest once (candidates), then training: the skewed
         * batches admit more; rows idle for 30 steps go, from whichever
         * tier holds them. */
        float *rows = malloc((size_t)CHUNK * DIM * sizeof *rows);
        for (int pass = 0; pass < 2; pass++)
            for (int at = 0; at < (pass ? ROWS / 2 : ROWS); at += CHUNK)
                assert_int_equal(qr_worker_pull_rows(s.w[0], t, CHUNK, ids + at, rows, 0), QR_OK);
        free(rows);
        train(s.w[0], t, ids, capped ? tier : mem, NULL);
        for (int k = 0; k < 6; k++) counts[capped][k] = table_stat(s.w[0], figures[k]);
        if (capped) assert_true(table_stat(s.w[0], "rows_disk") > 0);
        world_finish(&s);
    }
    for (int k = 0; k < 6; k++) {
        if (counts[0][k] != counts[1][k])
            fprintf(stderr, "%s: %g all in memory, %g tiered\n", figures[k], counts[0][k],
                    counts[1][k]);
        assert_true(counts[0][k] == counts[1][k]);
    }
    /* Each happened: ids admitted, candidates left, rows evicted by age. */
    assert_true(counts[0][1] > 0 && counts[0][5] > 0 && counts[0][4] > 0);
    assert_memory_equal(tier, mem, bytes);
    free(mem), free(tier), free(ids);
}

/* The rows pushed by spill_steps: 7,000 new ids in chunks of 1,000, then
 * 200, 100 and 100 more, one request each. */
#define SPILL_ROWS 7400
static const int spill_steps[][2] = {{0, 1000}, {1000, 2000}, {2000, 3000}, {3000, 4000},
                                     {4000, 5000}, {5000, 6000}, {6000, 7000}, {7000, 7200},
                                     {7200, 7300}, {7300, 7400}};

static void spill_push(qr_worker *w, int t, const int64_t *ids, int from, int to) {
    float *g = malloc((size_t)(to - from) * DIM * sizeof *g);
    assert_non_null(g);
    grads(1, ids + from, to - from, g);
    assert_int_equal(qr_worker_push_sparse(w, t, to - from, ids + from, g, QR_PUSH_STEP, NULL),
                     QR_OK);
    free(g);
}

/* A spill goes below the cap, to a low-water mark (tier.c,
 * SPILL_BELOW_DIV: the cap less the larger of the room the request needs
 * and 1/16 of the cap), so the next requests need none; the rows stay
 * exact. 1 MiB holds 7,231 rows of 145 bytes: 7,200 rows fit; 100 more
 * pass the cap, and the spill writes out enough for 1/16 of the cap
 * (65,536 bytes) to be free, not just the 100 rows' 14,500; the 100 after
 * that then fit. */
static void test_spill_below_the_cap(void **state) {
    (void)state;
    int64_t *ids = all_ids();
    size_t bytes = (size_t)SPILL_ROWS * DIM * sizeof(float);
    float *out[2][2];
    for (int capped = 0; capped < 2; capped++) {
        world s;
        start(&s, capped ? "1" : NULL, NULL);
        int t = declare(&s);
        for (size_t k = 0; k < sizeof spill_steps / sizeof *spill_steps; k++) {
            spill_push(s.w[0], t, ids, spill_steps[k][0], spill_steps[k][1]);
            if (!capped) continue;
            double in_memory = table_stat(s.w[0], "rows_memory"),
                   spilled = table_stat(s.w[0], "rows_spilled");
            assert_true(in_memory * 145 <= 1 << 20);
            if (spill_steps[k][1] <= 7200) {
                assert_true(spilled == 0 && in_memory == spill_steps[k][1]);
            } else {
                /* 7,200 x 145 + 2^20 / 16 - 2^20 bytes: 421 rows. */
                double want = ceil((7200.0 * 145 + (1 << 20) / 16 - (1 << 20)) / 145);
                assert_true(spilled == want);
                assert_true(table_stat(s.w[0], "rows_disk") == want);
                assert_true(in_memory == spill_steps[k][1] - want);
            }
        }
        for (int pass = 0; pass < 2; pass++) {
            out[capped][pass] = malloc(bytes);
            assert_non_null(out[capped][pass]);
            if (pass)
                for (int at = 0; at < SPILL_ROWS; at += 1000)
                    spill_push(s.w[0], t, ids, at, at + 1000 < SPILL_ROWS ? at + 1000 : SPILL_ROWS);
            for (int at = 0; at < SPILL_ROWS; at += 1000)
                assert_int_equal(qr_worker_pull_rows(s.w[0], t, SPILL_ROWS - at < 1000 ? SPILL_ROWS - at : 1000,
                                                      ids + at, out[capped][pass] + (size_t)at * DIM,
                                                      QR_ROWS_READ_ONLY), QR_OK);
        }
        world_finish(&s);
    }
    /* The values, and the accumulators through one more push. */
    for (int pass = 0; pass < 2; pass++) assert_memory_equal(out[1][pass], out[0][pass], bytes);
    for (int capped = 0; capped < 2; capped++) free(out[capped][0]), free(out[capped][1]);
    free(ids);
}

/* A lookup of more rows than the cap holds is refused, naming the flag;
 * the ps goes on serving. */
static void test_request_over_the_cap(void **state) {
    (void)state;
    world s;
    start(&s, "1", NULL);
    int t = declare(&s);
    int n = 8000; /* 8000 x 145 bytes > 1 MiB */
    int64_t *ids = malloc((size_t)n * sizeof *ids);
    float *rows = malloc((size_t)n * DIM * sizeof *rows);
    for (int i = 0; i < n; i++) ids[i] = i;
    assert_int_not_equal(qr_worker_pull_rows(s.w[0], t, n, ids, rows, 0), QR_OK);
    assert_non_null(strstr(qr_last_error(), "table-memory-mb"));
    assert_int_equal(qr_worker_pull_rows(s.w[0], t, 100, ids, rows, 0), QR_OK);
    world_finish(&s);
    free(ids), free(rows);
}

static void test_options(void **state) {
    (void)state;
    qr_config *cfg;
    assert_int_equal(qr_config_new(&cfg), QR_OK);
    assert_int_equal(qr_config_set(cfg, "table-memory-mb", "-1"), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "table-memory-mb"));
    qr_config_free(cfg);
    cluster_fixture f;
    fix_init(&f, 2, 1);
    assert_int_equal(qr_config_set(f.cfg, "ps-replicas", "2"), QR_OK);
    assert_int_equal(qr_config_set(f.cfg, "table-memory-mb", "64"), QR_OK);
    assert_int_equal(fix_start_ps(&f, 0), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "--table-memory-mb does not work with --ps-replicas"));
    fix_join(&f);
}

static bool exists(const char *dir, const char *name) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (f) fclose(f);
    return f != NULL;
}

static void test_table_dir(void **state) {
    (void)state;
    char dir[] = "/tmp/qr-tier-dir-XXXXXX", cmd[128];
    assert_non_null(mkdtemp(dir));
    /* A stale file where the tier goes: not an LMDB file, cleared. */
    snprintf(cmd, sizeof cmd, "mkdir -p %s/ps-0 && echo stale > %s/ps-0/data.mdb", dir, dir);
    assert_int_equal(system(cmd), 0);
    world s;
    const char *const opts[] = {"optimizer", "adagrad", "table-memory-mb", "1", "table-dir", dir,
                                NULL};
    world_start(&s, 1, 1, opts);
    int t = declare(&s);
    int64_t *ids = all_ids();
    push_all(s.w[0], t, ids, 0);
    assert_true(table_stat(s.w[0], "rows_disk") > 0);
    char sub[64];
    snprintf(sub, sizeof sub, "%s/ps-0", dir);
    assert_true(exists(sub, "data.mdb"));
    world_finish(&s);
    assert_false(exists(sub, "data.mdb"));
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    free(ids);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_four_times_the_cap_exact),
        cmocka_unit_test(test_checkpoint_both_tiers),
        cmocka_unit_test(test_admission_eviction_across_tiers),
        cmocka_unit_test(test_spill_below_the_cap),
        cmocka_unit_test(test_request_over_the_cap),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_table_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_cluster_placement.c - greedy placement of dense variables against
 * hand-computed assignments, and the spread of the sparse row hash.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cluster/placement.h"
#include "common/common.h"

#include <string.h>

static void expect_place(int nps, int n, const int64_t *bytes, const int *want) {
    int got[64];
    assert_true(n <= 64);
    assert_int_equal(qr_place_greedy(nps, n, bytes, got), QR_OK);
    for (int i = 0; i < n; i++)
        if (got[i] != want[i]) fail_msg("nps %d: variable %d on ps %d, want %d", nps, i, got[i], want[i]);
}

static void test_greedy_by_hand(void **state) {
    /* loads after each step: [100,0] [100,10] [100,30] [100,60] [100,100]
     * then a tie at 100/100 goes to ps 0: [150,100]. */
    const int64_t b1[] = {100, 10, 20, 30, 40, 50};
    const int w1[] = {0, 1, 1, 1, 1, 0};
    expect_place(2, 6, b1, w1);

    /* Three ps, equal sizes: round robin, since every tie goes low. */
    const int64_t b2[] = {8, 8, 8, 8, 8, 8, 8};
    const int w2[] = {0, 1, 2, 0, 1, 2, 0};
    expect_place(3, 7, b2, w2);

    /* A big variable first: everything else fills the other ps until it
     * catches up. loads: [1000,0,0] [1000,300,0] [1000,300,300]
     * [1000,600,300] [1000,600,700] [1000,1100,700] [1000,1100,1200]. */
    const int64_t b3[] = {1000, 300, 300, 300, 400, 500, 500};
    const int w3[] = {0, 1, 2, 1, 2, 1, 2};
    expect_place(3, 7, b3, w3);

    /* Zero-byte variables still take a turn: all loads stay 0, so all go
     * to ps 0 (a tie every time). */
    const int64_t b4[] = {0, 0, 0};
    const int w4[] = {0, 0, 0};
    expect_place(4, 3, b4, w4);

    /* More ps than variables. */
    const int64_t b5[] = {5, 5};
    const int w5[] = {0, 1};
    expect_place(8, 2, b5, w5);
}

static void test_greedy_one_ps(void **state) {
    int64_t bytes[20];
    int want[20];
    for (int i = 0; i < 20; i++) {
        bytes[i] = (i * 37) % 11 + 1;
        want[i] = 0;
    }
    expect_place(1, 20, bytes, want);
}

static void test_greedy_deterministic(void **state) {
    int64_t bytes[64];
    int a[64], b[64];
    qr_rng rng;
    qr_rng_seed(&rng, 42);
    for (int i = 0; i < 64; i++) bytes[i] = (int64_t)qr_rng_below(&rng, 1 << 20);
    assert_int_equal(qr_place_greedy(5, 64, bytes, a), QR_OK);
    for (int r = 0; r < 10; r++) {
        memset(b, 0xff, sizeof b);
        assert_int_equal(qr_place_greedy(5, 64, bytes, b), QR_OK);
        assert_memory_equal(a, b, sizeof a);
    }
    /* Every ps gets something when there are many variables. */
    int used[5] = {0};
    for (int i = 0; i < 64; i++) {
        assert_true(a[i] >= 0 && a[i] < 5);
        used[a[i]] = 1;
    }
    for (int p = 0; p < 5; p++) assert_true(used[p]);
}

static void test_greedy_errors(void **state) {
    const int64_t bytes[] = {1, -2};
    int out[2];
    assert_int_equal(qr_place_greedy(0, 2, bytes, out), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "at least one ps"));
    assert_int_equal(qr_place_greedy(2, -1, bytes, out), QR_EINVAL);
    assert_int_equal(qr_place_greedy(2, 2, bytes, out), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "variable 1 has negative size"));
    assert_int_equal(qr_place_greedy(2, 1, NULL, out), QR_EINVAL);
    assert_int_equal(qr_place_greedy(2, 0, NULL, NULL), QR_OK);
}

/* Shards of one variable go to distinct ps tasks, each to the least loaded
 * the variable does not use yet; other variables as qr_place_greedy. */
static void test_shards(void **state) {
    (void)state;
    /* a: 3 shards of 10; b: 25; c: 2 shards of 20, over 3 ps. */
    const int64_t bytes[] = {10, 10, 10, 25, 20, 20};
    const int group[] = {0, 0, 0, 1, 2, 2};
    int out[6];
    assert_int_equal(qr_place_shards(3, 6, bytes, group, out), QR_OK);
    /* loads after a: 10 10 10; b -> ps 0 (35); c: ps 1 (30), then ps 2 (30) */
    const int want[] = {0, 1, 2, 0, 1, 2};
    assert_memory_equal(out, want, sizeof want);
    /* Without groups: as the greedy placement of six variables. */
    int greedy[6];
    assert_int_equal(qr_place_shards(3, 6, bytes, NULL, out), QR_OK);
    assert_int_equal(qr_place_greedy(3, 6, bytes, greedy), QR_OK);
    assert_memory_equal(out, greedy, sizeof greedy);
    /* A heavily loaded ps is skipped only if another is free. */
    const int64_t skew[] = {100, 1, 1};
    const int g2[] = {0, 1, 1};
    assert_int_equal(qr_place_shards(2, 3, skew, g2, out), QR_OK);
    assert_true(out[0] == 0 && out[1] == 1 && out[2] == 0);
    /* More shards of one variable than ps tasks: refused. */
    const int g3[] = {0, 0, 0};
    assert_int_equal(qr_place_shards(2, 3, skew, g3, out), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "more shards"));
}

/* TensorFlow's partitioners: fixed (partitions=N) and min-max by size. */
static void test_partition_count(void **state) {
    (void)state;
    const int64_t mib = 1 << 20;
    assert_int_equal(qr_partition_count(100 * mib, 1000, 4, 0, 0), 1);          /* off */
    assert_int_equal(qr_partition_count(100 * mib, 1000, 4, 30, 0), 4);         /* capped by ps */
    assert_int_equal(qr_partition_count(100 * mib, 1000, 8, 30, 0), 4);         /* ceil(100/30) */
    assert_int_equal(qr_partition_count(10 * mib, 1000, 8, 30, 0), 1);          /* small */
    assert_int_equal(qr_partition_count(100 * mib, 2, 8, 1, 0), 2);             /* capped by rows */
    assert_int_equal(qr_partition_count(100 * mib, 1000, 8, 30, 3), 3);         /* explicit */
    assert_int_equal(qr_partition_count(10, 1000, 2, 0, 3), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "2 ps tasks"));
    assert_int_equal(qr_partition_count(10, 2, 8, 0, 3), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "only 2 rows"));
    /* rows: the first dim0 % n shards one more */
    assert_int_equal(qr_partition_rows(10, 3, 0), 4);
    assert_int_equal(qr_partition_rows(10, 3, 1), 3);
    assert_int_equal(qr_partition_rows(10, 3, 2), 3);
}

static void test_row_hash(void **state) {
    /* Sequential ids, the usual vocabulary indices, and strided ids, which
     * a plain "id % nps" would put all on one shard. */
    enum { N = 100000, NPS = 4 };
    for (int pattern = 0; pattern < 2; pattern++) {
        int count[NPS] = {0};
        for (int64_t i = 0; i < N; i++) {
            int64_t id = pattern == 0 ? i : i * 4;
            int s = qr_place_row(id, NPS);
            assert_true(s >= 0 && s < NPS);
            count[s]++;
        }
        /* Expect 25000 each; 5% either way is ~30 standard deviations. */
        for (int s = 0; s < NPS; s++)
            if (count[s] < N / NPS * 95 / 100 || count[s] > N / NPS * 105 / 100)
                fail_msg("pattern %d: shard %d has %d of %d ids", pattern, s, count[s], N);
    }
    /* Deterministic, negative ids fine, one ps takes everything. */
    assert_int_equal(qr_place_row(123456789, 4), qr_place_row(123456789, 4));
    int s = qr_place_row(-5, 4);
    assert_true(s >= 0 && s < 4);
    assert_int_equal(qr_place_row(INT64_MIN, 1), 0);
    assert_int_equal(qr_place_row(77, 1), 0);
    assert_int_equal(qr_place_row(1, 0), QR_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_by_hand),
        cmocka_unit_test(test_greedy_one_ps),
        cmocka_unit_test(test_greedy_deterministic),
        cmocka_unit_test(test_greedy_errors),
        cmocka_unit_test(test_shards),
        cmocka_unit_test(test_partition_count),
        cmocka_unit_test(test_row_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

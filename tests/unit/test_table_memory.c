/*
 * test_table_memory.c - what an embedding table's shard costs per row, at
 * 10 million rows (ps/table.h): the rows and their slots, dim * 4 * (1 +
 * slots) bytes, plus the id (8 bytes, 12 at most while the id array has
 * grown by half) and the hash index (4-byte slots at a load of 0.35 to 0.7: 5.7
 * to 11.4 bytes). The fixed overhead is asserted to stay under 32 bytes a
 * row, and the figures are printed (docs/EMBEDDINGS.md quotes them). Also
 * the index itself: every id found, removal keeps every other one. And
 * the memory given back (qr_table_trim): a table that lost most of its
 * rows, by eviction or moved out to a disk tier, holds about what the rows
 * left need (its byte count, and the process's resident memory), those
 * rows intact, and grows again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps/table.h"

static void fill_and_measure(int64_t dim, int nslots, uint64_t rows) {
    qr_table t;
    float init[2] = {0.1f, 0.0f};
    assert_int_equal(qr_table_init(&t, dim, nslots, init, "normal:0,0.01", 3), 0);
    for (uint64_t i = 0; i < rows; i++) {
        bool added;
        /* ids spread like a hashed vocabulary */
        int64_t id = (int64_t)(i * 0x9e3779b97f4a7c15ull >> 1);
        assert_true(qr_table_get_or_add(&t, id, &added) == (int64_t)i && added);
    }
    double need = (double)dim * 4 * (1 + nslots);
    double per_row = (double)qr_table_bytes(&t) / (double)rows;
    printf("dim %lld, %d slot(s), %llu rows: %.1f bytes a row for %.0f of rows and slots "
           "(%.3fx; overhead %.1f bytes)\n", (long long)dim, nslots, (unsigned long long)rows,
           per_row, need, per_row / need, per_row - need);
    assert_true(per_row - need < 32);
    /* Spot checks: found where put, absent ids absent. */
    for (uint64_t i = 0; i < rows; i += rows / 1000) {
        int64_t id = (int64_t)(i * 0x9e3779b97f4a7c15ull >> 1);
        assert_true(qr_table_find(&t, id) == (int64_t)i);
        assert_true(qr_table_find(&t, id + 1) < 0 || (i + 1 < rows));
    }
    qr_table_free(&t);
}

static void test_memory_10m_rows(void **state) {
    (void)state;
    fill_and_measure(8, 1, 10000000);  /* dim 8, Adagrad */
    fill_and_measure(64, 2, 1000000);  /* dim 64, Adam */
}

static void test_remove_keeps_others(void **state) {
    (void)state;
    qr_table t;
    assert_int_equal(qr_table_init(&t, 2, 0, NULL, "zeros", 1), 0);
    bool added;
    for (int64_t id = 0; id < 5000; id++) qr_table_get_or_add(&t, id * 31, &added);
    for (int64_t id = 0; id < 5000; id += 3) {
        int64_t r = qr_table_find(&t, id * 31);
        assert_true(r >= 0);
        qr_table_remove(&t, (uint64_t)r);
    }
    for (int64_t id = 0; id < 5000; id++) {
        int64_t r = qr_table_find(&t, id * 31);
        if (id % 3 == 0) assert_true(r < 0);
        else assert_true(r >= 0 && t.keys[r] == id * 31);
    }
    assert_int_equal(t.count, 5000 - 1667);
    qr_table_free(&t);
}

/* The process's own resident memory (RssAnon), in bytes. */
static uint64_t rss_anon(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "RssAnon:", 8)) kb = strtoull(line + 8, NULL, 10);
    if (f) fclose(f);
    return kb << 10;
}

#define TRIM_ROWS 400000
#define TRIM_KEPT 10000
#define TRIM_ID(i) ((int64_t)((uint64_t)(i) * 0x9e3779b97f4a7c15ull >> 1))

/* A table of TRIM_ROWS rows (dim 8, no slots: 64Ki rows a 2 MiB chunk, 7
 * chunks) of which all but TRIM_KEPT go, by eviction (evict) or moved out
 * as the disk tier moves them, then qr_table_trim as the tier calls it. */
static void shrink_and_grow(bool evict) {
    qr_table t;
    assert_int_equal(qr_table_init(&t, 8, 0, NULL, "normal:0,0.01", 3), 0);
    if (evict) {
        qr_table_options o;
        memset(&o, 0, sizeof o);
        o.evict_after_steps = 10;
        assert_int_equal(qr_table_set_policy(&t, &o), 0);
    }
    assert_int_equal(qr_table_changes_begin(&t), 0); /* the change flags shrink too */
    bool added;
    for (uint64_t i = 0; i < TRIM_ROWS; i++)
        assert_true(qr_table_get_or_add(&t, TRIM_ID(i), &added) == (int64_t)i && added);
    /* Rows kept: the first TRIM_KEPT, given values of their own. */
    for (uint64_t i = 0; i < TRIM_KEPT; i++)
        for (int d = 0; d < 8; d++) qr_table_row(&t, i)[d] = (float)i + 0.125f * (float)d;
    uint64_t full = qr_table_bytes(&t), rss_full = rss_anon();
    uint64_t chunk = ((uint64_t)1 << t.chunk_shift) * 8 * sizeof(float);
    assert_true(full > 7 * chunk);
    if (evict) {
        t.clock = 100;
        for (uint64_t i = 0; i < TRIM_KEPT; i++)
            assert_true(qr_table_row_for_update(&t, TRIM_ID(i), &added) == (int64_t)i);
        assert_int_equal(qr_table_evict_idle(&t), TRIM_ROWS - TRIM_KEPT);
        assert_int_equal(t.nremoved, TRIM_ROWS - TRIM_KEPT);
    } else {
        for (uint64_t r = TRIM_ROWS; r-- > TRIM_KEPT;) qr_table_move_out(&t, r);
        qr_table_trim(&t);
        assert_int_equal(t.ndisk_changed, TRIM_ROWS - TRIM_KEPT);
    }
    /* The ids gone (removed, or changed rows now on disk) are listed for
     * the next increment until its snapshot (8 MiB here, with the set's
     * index); the lists are then sized by what they held: kept for an
     * interval that lists as many, given back after one that listed none. */
    uint64_t *cap = evict ? &t.removed_cap : &t.disk_changed_cap;
    assert_int_equal(qr_table_changes_begin(&t), 0);
    assert_true(*cap >= TRIM_ROWS - TRIM_KEPT);
    assert_int_equal(qr_table_changes_begin(&t), 0);
    assert_int_equal(*cap, 64);
    assert_true(t.disk_changed_index.cap <= 16);
    assert_int_equal(t.count, TRIM_KEPT);
    /* What is held: the chunk in use and a spare, ids (and update steps,
     * change flags) for twice the rows, an index at a load of 0.35. */
    uint64_t left = qr_table_bytes(&t), rss_left = rss_anon();
    uint64_t per_row = 2 * (8 + 1 + (evict ? 8 : 0)) + 16;
    printf("%s: %llu bytes held for %d rows, %llu for %d (%lld KiB less resident)\n",
           evict ? "evicted" : "moved out", (unsigned long long)full, TRIM_ROWS,
           (unsigned long long)left, TRIM_KEPT, (long long)(rss_full - rss_left) / 1024);
    assert_int_equal(t.nchunks, 2);
    assert_true(left <= 2 * chunk + TRIM_KEPT * per_row);
    /* Given back to the system, not only counted: the 4 chunks filled
     * past the spare, and the ids (not under ASan, whose allocator keeps
     * freed blocks in quarantine). */
#ifndef __SANITIZE_ADDRESS__
    assert_true(rss_left + 4 * chunk + TRIM_ROWS * 8 <= rss_full);
#else
    (void)rss_left, (void)rss_full;
#endif
    /* The rows left: found, their values as they were. */
    for (uint64_t i = 0; i < TRIM_ROWS; i++) {
        int64_t r = qr_table_find(&t, TRIM_ID(i));
        if (i >= TRIM_KEPT) {
            assert_true(r < 0);
            continue;
        }
        assert_true(r == (int64_t)i);
        for (int d = 0; d < 8; d++)
            assert_true(qr_table_row(&t, i)[d] == (float)i + 0.125f * (float)d);
    }
    /* Growing again: new rows made as in a fresh table, the old ones kept. */
    float init[8];
    for (uint64_t i = TRIM_ROWS; i < 2 * TRIM_ROWS; i++)
        assert_true(qr_table_get_or_add(&t, TRIM_ID(i), &added) ==
                    (int64_t)(TRIM_KEPT + i - TRIM_ROWS) && added);
    for (uint64_t i = TRIM_ROWS; i < 2 * TRIM_ROWS; i += 997) {
        int64_t r = qr_table_find(&t, TRIM_ID(i));
        qr_table_initial_value(&t, TRIM_ID(i), init);
        assert_memory_equal(qr_table_row(&t, (uint64_t)r), init, sizeof init);
    }
    for (uint64_t i = 0; i < TRIM_KEPT; i++) assert_true(qr_table_find(&t, TRIM_ID(i)) == (int64_t)i);
    assert_true(qr_table_row(&t, TRIM_KEPT - 1)[7] == (float)(TRIM_KEPT - 1) + 0.875f);
    /* Trimming a table that needs all it holds changes nothing. */
    uint64_t grown = qr_table_bytes(&t);
    qr_table_trim(&t);
    assert_true(qr_table_bytes(&t) == grown);
    qr_table_free(&t);
}

static void test_memory_given_back(void **state) {
    (void)state;
    shrink_and_grow(true);
    shrink_and_grow(false);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_10m_rows),
        cmocka_unit_test(test_remove_keeps_others),
        cmocka_unit_test(test_memory_given_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

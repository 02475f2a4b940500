/*
 * test_ps_grad_check.c - the NaN/Inf check a ps runs on a push while it
 * arrives: whatever the sizes of the pieces the payload comes in (split
 * mid-float, one byte at a time, all at once), the items flagged are
 * exactly those whose floats hold a NaN or Inf, and the int64 indices of a
 * sparse item are never read as floats.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps/ps_internal.h"

/* A payload of three items: dense w (1000 floats), sparse emb (3 rows of
 * dim 5: 3 int64 indices then 15 floats), dense b (37 floats). */
enum { W_N = 1000, ROWS = 3, DIM = 5, B_N = 37 };

typedef struct fixture {
    qr_var w, emb, b;
    push_item items[3];
    uint8_t *payload;
    uint64_t len;
} fixture;

static void make(fixture *fx) {
    memset(fx, 0, sizeof *fx);
    fx->w = (qr_var){.name = "w", .ndim = 1, .shape = {W_N}, .n = W_N};
    fx->emb = (qr_var){.name = "emb", .ndim = 2, .shape = {100, DIM}, .n = 100 * DIM};
    fx->b = (qr_var){.name = "b", .ndim = 1, .shape = {B_N}, .n = B_N};
    uint64_t off_emb = 4 * W_N, off_b = off_emb + ROWS * (8 + 4 * DIM);
    fx->len = off_b + 4 * B_N;
    fx->items[0] = (push_item){.var = &fx->w, .offset = 0, .nrows = -1};
    fx->items[1] = (push_item){.var = &fx->emb, .offset = off_emb, .nrows = ROWS};
    fx->items[2] = (push_item){.var = &fx->b, .offset = off_b, .nrows = -1};
    fx->payload = aligned_alloc(64, (fx->len + 63) / 64 * 64);
    float *wf = (float *)fx->payload;
    for (int i = 0; i < W_N; i++) wf[i] = 0.5f * (float)i;
    /* Indices whose bytes are all ones: a NaN pattern if read as floats. */
    int64_t *idx = (int64_t *)(fx->payload + off_emb);
    for (int r = 0; r < ROWS; r++) idx[r] = -1;
    float *ef = (float *)(fx->payload + off_emb + 8 * ROWS);
    for (int i = 0; i < ROWS * DIM; i++) ef[i] = -1.0f;
    float *bf = (float *)(fx->payload + off_b);
    for (int i = 0; i < B_N; i++) bf[i] = 3.0f;
}

/* Feed the payload in pieces of `step` bytes (the last one shorter). */
static void run_check(fixture *fx, uint64_t step) {
    grad_check gc;
    for (int i = 0; i < 3; i++) fx->items[i].data = fx->payload + fx->items[i].offset;
    qr__grad_check_start(&gc, fx->items, 3);
    for (uint64_t got = step; got < fx->len; got += step) qr__grad_check_advance(&gc, got);
    qr__grad_check_advance(&gc, fx->len);
}

static const uint64_t steps[] = {1, 3, 4, 7, 64, 1000, 4001, 1 << 20};

static void test_clean_payload_passes(void **state) {
    (void)state;
    fixture fx;
    make(&fx);
    for (size_t s = 0; s < sizeof steps / sizeof *steps; s++) {
        run_check(&fx, steps[s]);
        for (int i = 0; i < 3; i++) assert_false(fx.items[i].nonfinite);
    }
    free(fx.payload);
}

/* A bad float at every position of interest, in every item. */
static void test_bad_float_flags_its_item_only(void **state) {
    (void)state;
    fixture fx;
    make(&fx);
    uint64_t off_ef = fx.items[1].offset + 8 * ROWS;
    struct {
        uint64_t at;
        int item;
    } cases[] = {
        {0, 0}, {4 * 499, 0}, {4 * (W_N - 1), 0},      /* w: first, middle, last */
        {off_ef, 1}, {off_ef + 4 * (ROWS * DIM - 1), 1}, /* emb rows */
        {fx.items[2].offset, 2}, {fx.len - 4, 2},        /* b */
    };
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (size_t k = 0; k < 3; k++)
            for (size_t s = 0; s < sizeof steps / sizeof *steps; s++) {
                float saved;
                memcpy(&saved, fx.payload + cases[c].at, 4);
                memcpy(fx.payload + cases[c].at, &bad[k], 4);
                run_check(&fx, steps[s]);
                for (int i = 0; i < 3; i++)
                    if (fx.items[i].nonfinite != (i == cases[c].item))
                        fail_msg("bad float at byte %llu (item %d), pieces of %llu bytes: item %d "
                                 "flagged %d", (unsigned long long)cases[c].at, cases[c].item,
                                 (unsigned long long)steps[s], i, fx.items[i].nonfinite);
                memcpy(fx.payload + cases[c].at, &saved, 4);
            }
    free(fx.payload);
}

/* Finishing the check on an unchanged payload twice is harmless, and a
 * restart clears the previous result. */
static void test_restart_clears_flags(void **state) {
    (void)state;
    fixture fx;
    make(&fx);
    float nan = NAN;
    memcpy(fx.payload + 8, &nan, 4);
    run_check(&fx, 64);
    assert_true(fx.items[0].nonfinite);
    float one = 1.0f;
    memcpy(fx.payload + 8, &one, 4);
    run_check(&fx, 64);
    assert_false(fx.items[0].nonfinite);
    free(fx.payload);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean_payload_passes),
        cmocka_unit_test(test_bad_float_flags_its_item_only),
        cmocka_unit_test(test_restart_clears_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

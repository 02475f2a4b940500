/*
 * test_optim_reduce_apply.c - a synchronous step's reduce fused into the
 * optimizer's dense apply (qr_optim_reduce_apply_dense) gives the very
 * bits of the two passes it replaces, qr_optim_reduce then
 * qr_optim_apply_dense, for every optimizer of optim.c's list and the
 * options that change their arithmetic: random gradients whose sum
 * depends on the order of the additions, 1 to 8 members, divisor 1 (sum),
 * the member count (mean) and more (members that pushed nothing count as
 * zero), lengths that are no multiple of the block, several steps in a
 * row (the slots carry over), one thread and a pool. The members'
 * gradients are only read. Also qr_optim_reduce's order itself, in place
 * and out of place, and argument checks that change nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim_internal.h"

/* Options that change each optimizer's arithmetic, "key=value" comma
 * separated ("" = the defaults). Every optimizer of optim.c's list must
 * have a line (options_for fails otherwise). */
static const struct {
    const char *name;
    const char *options[4];
} variants[] = {
    {"sgd", {"", "weight-decay=0.01", NULL}},
    {"momentum", {"", "nesterov=true", "weight-decay=0.02", NULL}},
    {"adagrad", {"", "weight-decay=0.01", NULL}},
    {"rmsprop", {"", "centered=true,momentum=0.5", NULL}},
    {"adam", {"", "nesterov=true", "weight-decay=0.01", NULL}},
    {"adam_async", {"", "nesterov=true", NULL}},
    {"ftrl", {"", "l1=0.01,l2=0.02", NULL}},
    {"adamw", {"", "weight-decay=0.1", NULL}},
};

static const char *const *options_for(const char *name) {
    for (size_t i = 0; i < QR_ARRAY_LEN(variants); i++)
        if (!strcmp(variants[i].name, name)) return variants[i].options;
    fail_msg("optimizer %s: no variants in test_optim_reduce_apply.c", name);
    return NULL;
}

/* optimizer `name` with "k=v,k=v" options and apply-threads. */
static qr_optim *make(const char *name, const char *options, int threads) {
    qr_config *cfg;
    assert_int_equal(qr_config_new(&cfg), QR_OK);
    assert_int_equal(qr_config_set(cfg, "optimizer", name), QR_OK);
    char th[8];
    snprintf(th, sizeof th, "%d", threads);
    assert_int_equal(qr_config_set(cfg, "apply-threads", th), QR_OK);
    char buf[128];
    snprintf(buf, sizeof buf, "%s", options);
    for (char *kv = strtok(buf, ","); kv; kv = strtok(NULL, ",")) {
        char *eq = strchr(kv, '=');
        assert_non_null(eq);
        *eq = '\0';
        assert_int_equal(qr_config_set(cfg, kv, eq + 1), QR_OK);
    }
    qr_optim *opt;
    if (qr_optim_create(&opt, cfg)) fail_msg("%s %s: %s", name, options, qr_last_error());
    qr_config_free(cfg);
    if (threads > 1) qr__optim_set_parallel_min(opt, 64);
    return opt;
}

/* Gradients over six orders of magnitude, of both signs: sums that depend
 * on the order of their additions. */
static void fill_random(qr_rng *rng, float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((qr_rng_uniform(rng) - 0.5) * scale * pow(10.0, 6.0 * qr_rng_uniform(rng) - 3.0));
}

static void copy_slots(const qr_optim_slots *from, qr_optim_slots *to) {
    for (int j = 0; j < qr_optim_slots_count(from); j++) {
        float *a, *b;
        int64_t n;
        assert_int_equal(qr_optim_slot(from, j, NULL, &a, &n), QR_OK);
        assert_int_equal(qr_optim_slot(to, j, NULL, &b, NULL), QR_OK);
        memcpy(b, a, (size_t)n * sizeof *a);
    }
}

static void expect_same_slots(const qr_optim_slots *a, const qr_optim_slots *b, const char *what) {
    for (int j = 0; j < qr_optim_slots_count(a); j++) {
        float *x, *y;
        int64_t n;
        const char *name;
        assert_int_equal(qr_optim_slot(a, j, &name, &x, &n), QR_OK);
        assert_int_equal(qr_optim_slot(b, j, NULL, &y, NULL), QR_OK);
        if (memcmp(x, y, (size_t)n * sizeof *x))
            fail_msg("%s: slot %s differs", what, name);
    }
}

/* One optimizer variant: `steps` steps of k members' gradients, fused and
 * in two passes side by side from the same start. */
static void compare(const char *name, const char *options, int threads, int k, float divisor,
                    int64_t n, qr_rng *rng) {
    char what[160];
    snprintf(what, sizeof what, "%s [%s] threads=%d k=%d divisor=%g n=%lld", name, options,
             threads, k, (double)divisor, (long long)n);
    qr_optim *opt = make(name, options, threads);
    qr_optim_slots *s_ref, *s_fused;
    assert_int_equal(qr_optim_slots_create(opt, 1, n, &s_ref), QR_OK);
    assert_int_equal(qr_optim_slots_create(opt, 1, n, &s_fused), QR_OK);
    /* the slots as after some training, so every term of the update counts */
    for (int j = 0; j < qr_optim_row_slots(opt); j++) {
        float *x;
        assert_int_equal(qr_optim_slot(s_ref, j, NULL, &x, NULL), QR_OK);
        for (int64_t i = 0; i < n; i++) x[i] = (float)(0.01 + 0.5 * qr_rng_uniform(rng));
    }
    copy_slots(s_ref, s_fused);
    size_t bytes = (size_t)n * sizeof(float);
    float *var_ref = malloc(bytes), *var_fused = malloc(bytes), *sum = malloc(bytes);
    float *grads[8], *saved[8];
    for (int i = 0; i < k; i++) {
        grads[i] = malloc(bytes);
        saved[i] = malloc(bytes);
    }
    fill_random(rng, var_ref, n, 4.0);
    memcpy(var_fused, var_ref, bytes);
    for (int64_t step = 1; step <= 3; step++) {
        for (int i = 0; i < k; i++) {
            fill_random(rng, grads[i], n, 1.0);
            memcpy(saved[i], grads[i], bytes);
        }
        /* today's two passes: the reduce into the first push's buffer ... */
        memcpy(sum, grads[0], bytes);
        const float *srcs[8] = {sum};
        for (int i = 1; i < k; i++) srcs[i] = grads[i];
        qr_optim_reduce(sum, srcs, k, n, divisor);
        /* ... then the apply of the sum */
        assert_int_equal(qr_optim_apply_dense(opt, s_ref, var_ref, sum, n, 0.05f, step), QR_OK);
        const float *members[8];
        for (int i = 0; i < k; i++) members[i] = grads[i];
        int rc = qr_optim_reduce_apply_dense(opt, s_fused, var_fused, members, k, n, divisor,
                                             0.05f, step);
        if (rc) fail_msg("%s: %s", what, qr_last_error());
        if (memcmp(var_ref, var_fused, bytes)) {
            int64_t i = 0;
            while (var_ref[i] == var_fused[i]) i++;
            fail_msg("%s, step %lld: var[%lld] %.9g fused, %.9g in two passes", what,
                     (long long)step, (long long)i, (double)var_fused[i], (double)var_ref[i]);
        }
        expect_same_slots(s_ref, s_fused, what);
        for (int i = 0; i < k; i++)
            if (memcmp(grads[i], saved[i], bytes)) fail_msg("%s: gradient %d was written", what, i);
    }
    for (int i = 0; i < k; i++) {
        free(grads[i]);
        free(saved[i]);
    }
    free(var_ref);
    free(var_fused);
    free(sum);
    qr_optim_slots_free(s_ref);
    qr_optim_slots_free(s_fused);
    qr_optim_free(opt);
}

static void test_every_optimizer_bit_for_bit(void **state) {
    (void)state;
    qr_rng rng;
    qr_rng_seed(&rng, 27);
    /* 1000 and 3077: no multiple of the 1024-float block (3077 = 3 blocks
     * and a tail); 5: shorter than one vector loop. */
    const int64_t lengths[] = {5, 1000, 3077};
    const int counts[] = {1, 2, 3, 4, 5, 8}; /* the reduce adds up to 4 at once */
    for (int o = 0; o < qr_optim_count(); o++) {
        const char *name = qr_optim_name_at(o);
        const char *const *options = options_for(name);
        for (int v = 0; options[v]; v++)
            for (size_t c = 0; c < QR_ARRAY_LEN(counts); c++) {
                int k = counts[c];
                /* sum; mean over the members; mean over a quorum of k + 2
                 * of which two pushed nothing for this variable */
                const float divisors[] = {1.0f, (float)k, (float)(k + 2)};
                for (size_t d = 0; d < QR_ARRAY_LEN(divisors); d++)
                    for (size_t l = 0; l < QR_ARRAY_LEN(lengths); l++)
                        compare(name, options[v], 1, k, divisors[d], lengths[l], &rng);
            }
    }
}

/* Split over a pool of 3 threads (chunks of 16-float multiples, each cut
 * into blocks again): still the same bits. */
static void test_pool_bit_for_bit(void **state) {
    (void)state;
    qr_rng rng;
    qr_rng_seed(&rng, 28);
    for (int o = 0; o < qr_optim_count(); o++) {
        const char *name = qr_optim_name_at(o);
        compare(name, options_for(name)[0], 3, 3, 3.0f, 10007, &rng);
        compare(name, options_for(name)[0], 3, 1, 1.0f, 4099, &rng);
    }
}

/* qr_optim_reduce adds in the order given, then divides: checked against
 * the expression written out, in place (the ps's old way, the local
 * trainer's) and into another buffer, and shown to depend on the order
 * for this data (so that the comparisons above could fail). */
static void test_reduce_order(void **state) {
    (void)state;
    qr_rng rng;
    qr_rng_seed(&rng, 29);
    const int64_t n = 2053;
    float *src[9], *out = malloc(n * sizeof *out), *inplace = malloc(n * sizeof *inplace);
    for (int j = 0; j < 9; j++) {
        src[j] = malloc(n * sizeof(float));
        fill_random(&rng, src[j], n, 1.0);
    }
    /* 1 to 9 sources: every grouping of the loops that add 4 and 3 at once */
    for (int k = 1; k <= 9; k++) {
        const float *srcs[9], *in_srcs[9];
        for (int j = 0; j < k; j++) srcs[j] = in_srcs[j] = src[j];
        in_srcs[0] = inplace;
        memcpy(inplace, src[0], n * sizeof *inplace);
        float divisor = k == 2 ? 1.0f : (float)k;
        qr_optim_reduce(out, srcs, k, n, divisor);
        qr_optim_reduce(inplace, in_srcs, k, n, divisor);
        int64_t order_matters = 0;
        for (int64_t i = 0; i < n; i++) {
            volatile float want = src[0][i], backwards = src[k - 1][i];
            for (int j = 1; j < k; j++) {
                want += src[j][i];
                backwards += src[k - 1 - j][i];
            }
            want /= divisor;
            backwards /= divisor;
            if (out[i] != want || inplace[i] != want)
                fail_msg("k=%d, [%lld]: %.9g out of place, %.9g in place, %.9g wanted", k,
                         (long long)i, (double)out[i], (double)inplace[i], (double)want);
            order_matters += backwards != want;
        }
        if (k >= 3) assert_true(order_matters > 0);
    }
    for (int j = 0; j < 9; j++) free(src[j]);
    free(out);
    free(inplace);
}

/* Bad arguments are refused with a message, and nothing changes: not the
 * variable, not the slots (AdamAsync's powers included). */
static void test_refusals_change_nothing(void **state) {
    (void)state;
    qr_optim *opt = make("adam_async", "", 1);
    const int64_t n = 40;
    qr_optim_slots *s;
    assert_int_equal(qr_optim_slots_create(opt, 1, n, &s), QR_OK);
    float var[40], g[40], before[40];
    for (int i = 0; i < n; i++) var[i] = before[i] = (float)i, g[i] = 1.0f;
    float *p1;
    assert_int_equal(qr_optim_slot(s, 2, NULL, &p1, NULL), QR_OK);
    float power = *p1;
    const float *one[1] = {g}, *with_null[2] = {g, NULL};
    assert_int_equal(qr_optim_reduce_apply_dense(opt, s, var, one, 0, n, 1.0f, -1, 1), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "a reduce of 0 gradients"));
    assert_int_equal(qr_optim_reduce_apply_dense(opt, s, var, NULL, 1, n, 1.0f, -1, 1), QR_EINVAL);
    assert_int_equal(qr_optim_reduce_apply_dense(opt, s, var, one, 1, n, 0.0f, -1, 1), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "divisor 0 is not a finite number > 0"));
    assert_int_equal(qr_optim_reduce_apply_dense(opt, s, var, one, 1, n, NAN, -1, 1), QR_EINVAL);
    assert_int_equal(qr_optim_reduce_apply_dense(opt, s, var, with_null, 2, n, 2.0f, -1, 1),
                     QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "gradient 1 of the reduce is NULL"));
    assert_int_equal(qr_optim_reduce_apply_dense(opt, s, var, one, 1, n - 1, 1.0f, -1, 1),
                     QR_ESHAPE);
    assert_int_equal(qr_optim_reduce_apply_dense(opt, s, var, one, 1, n, 1.0f, NAN, 1), QR_EINVAL);
    assert_memory_equal(var, before, sizeof var);
    assert_true(*p1 == power);
    /* and a good call does change them */
    assert_int_equal(qr_optim_reduce_apply_dense(opt, s, var, with_null, 1, n, 1.0f, -1, 1), QR_OK);
    assert_true(var[3] != before[3] && *p1 != power);
    qr_optim_slots_free(s);
    qr_optim_free(opt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_optimizer_bit_for_bit),
        cmocka_unit_test(test_pool_bit_for_bit),
        cmocka_unit_test(test_reduce_order),
        cmocka_unit_test(test_refusals_change_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

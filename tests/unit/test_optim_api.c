/*
 * test_optim_api.c - the optimizer library's contract apart from the
 * numbers: the list of optimizers (every one covered here, with its
 * TensorFlow name), creation-time validation with messages naming the
 * option, defaults, slot layout, argument checks that change nothing, the finite
 * check, and that the thread pool (dense chunks and sparse rows, and
 * concurrent applies sharing one pool) gives bit-identical results.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim_internal.h"

/* What this test expects of each optimizer. The tests walk optim.c's list
 * (qr_optim_name_at) and look their expectations up here, and
 * test_registry fails for an optimizer in that list without a line here. */
typedef struct optimizer_case {
    const char *name;
    const char *tf_name;  /* TensorFlow's class name */
    float lr;             /* default learning rate */
    int nrow;             /* per-row slots */
    const char *slots[4]; /* TF's slot names, per-row first */
    const char *extra;    /* an option that changes its arithmetic */
} optimizer_case;

static const optimizer_case cases[] = {
    {"sgd", "GradientDescent", 0.05f, 0, {NULL}, "lr=0.01"},
    {"momentum", "Momentum", 0.05f, 1, {"momentum", NULL}, "lr=0.01"},
    {"adagrad", "Adagrad", 0.001f, 1, {"accumulator", NULL}, "lr=0.01"},
    {"rmsprop", "RMSProp", 0.001f, 2, {"rms", "momentum", NULL}, "centered=true"},
    {"adam", "Adam", 0.001f, 2, {"m", "v", NULL}, "nesterov=true"},
    {"adam_async", "AdamAsync", 0.001f, 2, {"m", "v", "beta1_power", "beta2_power"},
     "apply-sparse-rmsprop=true"},
    {"ftrl", "Ftrl", 0.001f, 2, {"accum", "linear", NULL}, "l1=0.001"},
    {"adamw", "AdamW", 0.001f, 2, {"m", "v", NULL}, "weight-decay=0.1"},
};

/* The expectations for optimizer i of optim.c's list. */
static const optimizer_case *case_at(int i) {
    const char *name = qr_optim_name_at(i);
    assert_non_null(name);
    for (size_t k = 0; k < QR_ARRAY_LEN(cases); k++)
        if (!strcmp(cases[k].name, name)) return &cases[k];
    fail_msg("optimizer %s: not covered by test_optim_api.c (add it to cases[])", name);
    return NULL;
}

/* Create from "key=value" pairs (NULL-terminated); returns the status. */
static int try_make(qr_optim **opt, const char *kv, ...) {
    qr_config *cfg;
    assert_int_equal(qr_config_new(&cfg), QR_OK);
    va_list ap;
    va_start(ap, kv);
    int rc = QR_OK;
    for (const char *p = kv; p && !rc; p = va_arg(ap, const char *)) {
        char key[64];
        const char *eq = strchr(p, '=');
        snprintf(key, sizeof key, "%.*s", (int)(eq - p), p);
        rc = qr_config_set(cfg, key, eq + 1);
    }
    va_end(ap);
    *opt = NULL;
    if (!rc) rc = qr_optim_create(opt, cfg);
    qr_config_free(cfg);
    return rc;
}

static void expect_refused(const char *needle, const char *kv, ...) {
    /* same as try_make but with up to 4 pairs, checking the message */
    qr_config *cfg;
    assert_int_equal(qr_config_new(&cfg), QR_OK);
    va_list ap;
    va_start(ap, kv);
    int rc = QR_OK;
    for (const char *p = kv; p && !rc; p = va_arg(ap, const char *)) {
        char key[64];
        const char *eq = strchr(p, '=');
        snprintf(key, sizeof key, "%.*s", (int)(eq - p), p);
        rc = qr_config_set(cfg, key, eq + 1);
    }
    va_end(ap);
    qr_optim *opt = NULL;
    if (!rc) rc = qr_optim_create(&opt, cfg);
    qr_config_free(cfg);
    if (rc != QR_EINVAL) fail_msg("%s: accepted (rc %d)", kv, rc);
    assert_null(opt);
    if (!strstr(qr_last_error(), needle))
        fail_msg("message '%s' does not mention '%s'", qr_last_error(), needle);
}

/* optim.c's list: every optimizer in it covered by cases[] and every case
 * in it (so the count matches), each with its TensorFlow name; the
 * option table offers exactly these names, in this order. */
static void test_registry(void **state) {
    (void)state;
    assert_int_equal(qr_optim_count(), (int)QR_ARRAY_LEN(cases));
    char choices[256] = "";
    for (int i = 0; i < qr_optim_count(); i++) {
        const optimizer_case *c = case_at(i);
        assert_string_equal(qr_optim_tf_name(c->name), c->tf_name);
        snprintf(choices + strlen(choices), sizeof choices - strlen(choices), "%s%s",
                 i ? "|" : "", c->name);
    }
    for (size_t k = 0; k < QR_ARRAY_LEN(cases); k++) {
        int found = 0;
        for (int i = 0; i < qr_optim_count(); i++)
            found += !strcmp(qr_optim_name_at(i), cases[k].name);
        assert_int_equal(found, 1);
    }
    assert_null(qr_optim_name_at(-1));
    assert_null(qr_optim_name_at(qr_optim_count()));
    assert_null(qr_optim_tf_name("adamax"));
    assert_null(qr_optim_tf_name(NULL));
    qr__config_key key;
    int i = 0;
    while (qr__config_key_info(i, &key) && strcmp(key.name, "optimizer")) i++;
    assert_string_equal(key.name, "optimizer");
    assert_string_equal(key.choices, choices);
    assert_string_equal(key.def, "sgd");
}

static void test_defaults(void **state) {
    qr_optim *opt;
    assert_int_equal(qr_optim_create(&opt, NULL), QR_OK);
    assert_string_equal(qr_optim_name(opt), "sgd");
    assert_true(qr_optim_lr(opt) == 0.05f);
    qr_optim_free(opt);
    for (int i = 0; i < qr_optim_count(); i++) {
        const optimizer_case *c = case_at(i);
        char kv[64];
        snprintf(kv, sizeof kv, "optimizer=%s", c->name);
        assert_int_equal(try_make(&opt, kv, NULL), QR_OK);
        assert_string_equal(qr_optim_name(opt), c->name);
        assert_true(qr_optim_lr(opt) == c->lr);
        qr_optim_free(opt);
    }
    assert_int_equal(try_make(&opt, "optimizer=momentum", NULL), QR_OK);
    assert_true(opt->hp.momentum == 0.9);
    qr_optim_free(opt);
    assert_int_equal(try_make(&opt, "optimizer=rmsprop", NULL), QR_OK);
    assert_true(opt->hp.momentum == 0.0 && opt->hp.epsilon == 1e-10 && opt->hp.rho == 0.9);
    qr_optim_free(opt);
    assert_int_equal(try_make(&opt, "optimizer=adam", NULL), QR_OK);
    assert_true(opt->hp.epsilon == 1e-8 && opt->hp.beta1 == 0.9 && opt->hp.beta2 == 0.999);
    qr_optim_free(opt);
    /* weight-decay: torch's defaults, 0 everywhere but AdamW's 0.01 */
    for (int i = 0; i < qr_optim_count(); i++) {
        char kv[64];
        snprintf(kv, sizeof kv, "optimizer=%s", qr_optim_name_at(i));
        assert_int_equal(try_make(&opt, kv, NULL), QR_OK);
        bool adamw = !strcmp(qr_optim_name_at(i), "adamw");
        assert_true(qr_optim_weight_decay(opt) == (adamw ? 0.01f : 0.0f));
        qr_optim_free(opt);
    }
    assert_int_equal(try_make(&opt, "optimizer=adamw", NULL), QR_OK);
    assert_true(opt->hp.epsilon == 1e-8 && opt->hp.beta1 == 0.9 && opt->hp.beta2 == 0.999);
    assert_false(opt->hp.nesterov);
    qr_optim_free(opt);
    assert_int_equal(try_make(&opt, "optimizer=adamw", "weight-decay=0", NULL), QR_OK);
    assert_true(qr_optim_weight_decay(opt) == 0.0f);
    qr_optim_free(opt);
    assert_true(qr_optim_weight_decay(NULL) == 0.0f);
    qr_optim_free(NULL);
    qr_optim_slots_free(NULL);
}

static void test_validation(void **state) {
    expect_refused("initial-accumulator", "optimizer=adagrad", "initial-accumulator=0", NULL);
    expect_refused("beta1", "optimizer=adam", "beta1=1", NULL);
    expect_refused("beta2", "optimizer=adam_async", "beta2=1", NULL);
    /* options the optimizer does not read are refused, not ignored */
    expect_refused("momentum", "optimizer=sgd", "momentum=0.9", NULL);
    expect_refused("nesterov", "optimizer=rmsprop", "nesterov=true", NULL);
    expect_refused("epsilon", "optimizer=adagrad", "epsilon=1e-7", NULL);
    expect_refused("apply-sparse-rmsprop", "optimizer=adam", "apply-sparse-rmsprop=true", NULL);
    expect_refused("centered", "optimizer=adam", "centered=true", NULL);
    expect_refused("lr-power", "optimizer=ftrl", "lr-power=0.5", NULL);  /* config range */
    expect_refused("lr", "optimizer=adam", "lr=0", NULL);                /* config range */
    expect_refused("lr", "optimizer=adam", "lr=-0.1", NULL);
    expect_refused("epsilon", "optimizer=rmsprop", "epsilon=0", NULL);
    expect_refused("lr", "optimizer=sgd", "lr=1e300", NULL); /* not a finite float */
    expect_refused("lr", "optimizer=sgd", "lr=nan", NULL);
    /* weight-decay: >= 0 and a finite float; FTRL takes only 0 (its own
     * regularization is l2); AdamW has no Nesterov and no momentum */
    expect_refused("weight-decay", "optimizer=adam", "weight-decay=-0.1", NULL);
    expect_refused("weight-decay", "optimizer=sgd", "weight-decay=1e300", NULL);
    expect_refused("weight-decay", "optimizer=ftrl", "weight-decay=0.01", NULL);
    expect_refused("nesterov", "optimizer=adamw", "nesterov=true", NULL);
    expect_refused("momentum", "optimizer=adamw", "momentum=0.9", NULL);
    expect_refused("beta1", "optimizer=adamw", "beta1=1", NULL);
    expect_refused("epsilon", "optimizer=adamw", "epsilon=0", NULL);

    /* the FTRL check itself, past the config table */
    qr_optim *opt;
    assert_int_equal(try_make(&opt, "optimizer=ftrl", NULL), QR_OK);
    qr_optim_hp hp = opt->hp;
    qr_optim_free(opt);
    assert_true(hp.lr_power == -0.5);
    assert_int_equal(try_make(&opt, "optimizer=ftrl", "lr-power=0", "l1=0.1", NULL), QR_OK);
    qr_optim_free(opt);
    /* torch's default passed everywhere is fine, FTRL and AdamAsync included */
    for (int i = 0; i < qr_optim_count(); i++) {
        char kv[64];
        snprintf(kv, sizeof kv, "optimizer=%s", qr_optim_name_at(i));
        assert_int_equal(try_make(&opt, kv, "weight-decay=0", NULL), QR_OK);
        qr_optim_free(opt);
    }
    /* a variable's own options take it, as --var-opt NAME:weight-decay=... */
    qr_config *global;
    assert_int_equal(qr_config_new(&global), QR_OK);
    assert_int_equal(qr_config_set(global, "optimizer", "adam"), QR_OK);
    assert_int_equal(qr_config_set(global, "weight-decay", "0.001"), QR_OK);
    assert_int_equal(qr_optim_create_for_var(&opt, global, "weight-decay=0"), QR_OK);
    assert_true(qr_optim_weight_decay(opt) == 0.0f);
    qr_optim_free(opt);
    assert_int_equal(qr_optim_create_for_var(&opt, global, "lr=0.01"), QR_OK);
    assert_true(qr_optim_weight_decay(opt) == 0.001f);
    qr_optim_free(opt);
    assert_int_equal(qr_optim_create_for_var(&opt, global, "optimizer=adamw"), QR_OK);
    assert_true(qr_optim_weight_decay(opt) == 0.01f); /* a fresh configuration */
    qr_optim_free(opt);
    assert_int_equal(qr_optim_create_for_var(&opt, global, "optimizer=ftrl,weight_decay=0.1"),
                     QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "weight-decay"));
    qr_config_free(global);
}

static void test_slot_layout(void **state) {
    for (int i = 0; i < qr_optim_count(); i++) {
        const optimizer_case *c = case_at(i);
        char kv[64];
        qr_optim *opt;
        snprintf(kv, sizeof kv, "optimizer=%s", c->name);
        assert_int_equal(try_make(&opt, kv, NULL), QR_OK);
        assert_int_equal(qr_optim_row_slots(opt), c->nrow);
        qr_optim_slots *s;
        assert_int_equal(qr_optim_slots_create(opt, 5, 3, &s), QR_OK);
        int n = 0;
        while (n < 4 && c->slots[n]) n++;
        assert_int_equal(qr_optim_slots_count(s), n);
        for (int j = 0; j < n; j++) {
            const char *name;
            float *data;
            int64_t len;
            assert_int_equal(qr_optim_slot(s, j, &name, &data, &len), QR_OK);
            assert_string_equal(name, c->slots[j]);
            assert_int_equal(len, j < c->nrow ? 15 : 1);
            if (j < c->nrow) {
                float init;
                assert_int_equal(qr_optim_row_slot_info(opt, j, &name, &init), QR_OK);
                assert_true(data[14] == init);
            }
        }
        assert_int_equal(qr_optim_slot(s, n, NULL, NULL, NULL), QR_EINVAL);
        qr_optim_slots_free(s);
        qr_optim_free(opt);
    }
}

static void test_bad_calls_change_nothing(void **state) {
    qr_optim *opt, *other;
    assert_int_equal(try_make(&opt, "optimizer=adam_async", NULL), QR_OK);
    assert_int_equal(try_make(&other, "optimizer=adam", NULL), QR_OK);
    qr_optim_slots *s, *so;
    assert_int_equal(qr_optim_slots_create(opt, 4, 2, &s), QR_OK);
    assert_int_equal(qr_optim_slots_create(other, 4, 2, &so), QR_OK);
    float var[8] = {1, 2, 3, 4, 5, 6, 7, 8}, copy[8], g[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    memcpy(copy, var, sizeof var);
    int64_t idx[3] = {1, 4, 0}; /* 4 is out of range */
    assert_int_equal(qr_optim_apply_sparse(opt, s, var, 4, 2, idx, g, 3, -1, 1), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "index 4"));
    int64_t neg = -1;
    assert_int_equal(qr_optim_apply_sparse(opt, s, var, 4, 2, &neg, g, 1, -1, 1), QR_EINVAL);
    assert_int_equal(qr_optim_apply_sparse(opt, s, var, 2, 4, idx, g, 1, -1, 1), QR_ESHAPE);
    assert_int_equal(qr_optim_apply_dense(opt, s, var, g, 7, -1, 1), QR_ESHAPE);
    assert_int_equal(qr_optim_apply_dense(opt, so, var, g, 8, -1, 1), QR_EINVAL); /* wrong slots */
    assert_int_equal(qr_optim_apply_dense(opt, s, var, g, 8, NAN, 1), QR_EINVAL);
    assert_int_equal(qr_optim_apply_dense(other, so, var, g, 8, -1, 0), QR_EINVAL); /* step 0 */
    assert_memory_equal(var, copy, sizeof var);
    float *data;
    assert_int_equal(qr_optim_slot(s, 2, NULL, &data, NULL), QR_OK);
    assert_true(data[0] == 0.9f); /* beta1_power untouched */
    assert_int_equal(qr_optim_slot(s, 0, NULL, &data, NULL), QR_OK);
    for (int i = 0; i < 8; i++) assert_true(data[i] == 0.0f);
    qr_optim_slots *bad;
    assert_int_equal(qr_optim_slots_create(opt, 1, 0, &bad), QR_ESHAPE);
    assert_null(bad);
    qr_optim_slots_free(s);
    qr_optim_slots_free(so);
    qr_optim_free(opt);
    qr_optim_free(other);
}

static void test_all_finite(void **state) {
    enum { N = 10000 };
    float *x = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = (float)(i - N / 2) * 1e-3f;
    assert_true(qr_optim_all_finite(x, N));
    assert_true(qr_optim_all_finite(x, 0));
    x[7] = FLT_MAX;
    x[8] = -FLT_MAX;
    x[9] = FLT_MIN / 4; /* subnormal */
    x[10] = -0.0f;
    assert_true(qr_optim_all_finite(x, N));
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    const int where[] = {0, 4095, 4096, 8191, N - 1};
    for (size_t b = 0; b < QR_ARRAY_LEN(bad); b++)
        for (size_t w = 0; w < QR_ARRAY_LEN(where); w++) {
            float keep = x[where[w]];
            x[where[w]] = bad[b];
            assert_false(qr_optim_all_finite(x, N));
            assert_true(qr_optim_all_finite(x, where[w])); /* stops before it */
            x[where[w]] = keep;
        }
    free(x);
}

/* ---- threads: the pool must not change a single bit -------------------- */

static float frand(uint64_t *st) {
    *st = *st * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*st >> 40) / (double)(1ull << 24) - 0.5);
}

/* Optimizer `name` with `threads` apply threads and one more option
 * (extra, "key=value"), splitting tensors of 1000 elements or more. */
static qr_optim *make_split(const char *name, int threads, const char *extra) {
    char kv1[64], kv2[64];
    snprintf(kv1, sizeof kv1, "optimizer=%s", name);
    snprintf(kv2, sizeof kv2, "apply-threads=%d", threads);
    qr_optim *opt;
    assert_int_equal(try_make(&opt, kv1, kv2, extra, NULL), QR_OK);
    qr__optim_set_parallel_min(opt, 1000);
    return opt;
}

/* Runs 3 dense and 3 sparse applies with `threads` threads; returns var
 * followed by every per-row slot. */
static float *run_config(const char *name, const char *extra, int threads, int64_t rows,
                         int64_t dim) {
    qr_optim *opt = make_split(name, threads, extra);
    qr_optim_slots *s;
    int64_t n = rows * dim;
    assert_int_equal(qr_optim_slots_create(opt, rows, dim, &s), QR_OK);
    float *var = malloc((size_t)n * sizeof(float)), *g = malloc((size_t)n * sizeof(float));
    uint64_t st = 42;
    for (int64_t i = 0; i < n; i++) var[i] = frand(&st);
    int64_t nidx = rows / 2;
    int64_t *idx = malloc((size_t)nidx * sizeof(int64_t));
    for (int step = 1; step <= 6; step++) {
        for (int64_t i = 0; i < n; i++) g[i] = frand(&st);
        if (step % 2) {
            assert_int_equal(qr_optim_apply_dense(opt, s, var, g, n, -1, step), QR_OK);
        } else {
            for (int64_t k = 0; k < nidx; k++) idx[k] = (int64_t)((st = st * 2862933555777941757ull + 3037000493ull) >> 33) % rows;
            assert_int_equal(qr_optim_apply_sparse(opt, s, var, rows, dim, idx, g, nidx, -1, step), QR_OK);
        }
    }
    int nrow = qr_optim_row_slots(opt);
    float *out = malloc((size_t)n * (size_t)(1 + nrow) * sizeof(float));
    memcpy(out, var, (size_t)n * sizeof(float));
    for (int j = 0; j < nrow; j++) {
        float *data;
        qr_optim_slot(s, j, NULL, &data, NULL);
        memcpy(out + (j + 1) * n, data, (size_t)n * sizeof(float));
    }
    free(var);
    free(g);
    free(idx);
    qr_optim_slots_free(s);
    qr_optim_free(opt);
    return out;
}

static void test_threads_bit_identical(void **state) {
    const int64_t rows = 997, dim = 13; /* odd sizes: chunk edges fall mid-vector */
    for (int i = 0; i < qr_optim_count(); i++) {
        const optimizer_case *c = case_at(i);
        int nrow = 0;
        qr_optim *opt;
        char kv[64];
        snprintf(kv, sizeof kv, "optimizer=%s", c->name);
        assert_int_equal(try_make(&opt, kv, c->extra, NULL), QR_OK);
        nrow = qr_optim_row_slots(opt);
        qr_optim_free(opt);
        float *one = run_config(c->name, c->extra, 1, rows, dim);
        for (int t = 2; t <= 3; t++) {
            float *many = run_config(c->name, c->extra, t, rows, dim);
            if (memcmp(one, many, (size_t)(rows * dim * (1 + nrow)) * sizeof(float)))
                fail_msg("%s: %d threads differ from 1", c->name, t);
            free(many);
        }
        free(one);
    }
}

/* Coupled weight decay (optim.c): the kernel sees g + wd * var, block by
 * block. An apply with weight-decay wd must give the bits of the same
 * optimizer without it fed that gradient by hand, for a tensor spanning
 * several blocks, split over threads or not, dense and sparse (where only
 * the touched rows are decayed); weight-decay=0 set explicitly changes
 * nothing. */
static void wd_apply(const char *name, const char *wd, int threads, float *var, int64_t rows,
                     int64_t dim, const float *const *grads, int nsteps, float *slots_out) {
    char kv[64];
    snprintf(kv, sizeof kv, "weight-decay=%s", wd);
    qr_optim *opt = make_split(name, threads, kv);
    qr_optim_slots *s;
    int64_t n = rows * dim;
    assert_int_equal(qr_optim_slots_create(opt, rows, dim, &s), QR_OK);
    int64_t idx[3] = {rows - 1, 0, rows - 1}; /* a duplicate: summed, then decayed once */
    for (int step = 0; step < nsteps; step++) {
        if (step % 2 == 0)
            assert_int_equal(qr_optim_apply_dense(opt, s, var, grads[step], n, -1, step + 1), QR_OK);
        else
            assert_int_equal(qr_optim_apply_sparse(opt, s, var, rows, dim, idx, grads[step], 3,
                                                   -1, step + 1), QR_OK);
    }
    for (int j = 0; j < qr_optim_row_slots(opt); j++) {
        float *data;
        qr_optim_slot(s, j, NULL, &data, NULL);
        memcpy(slots_out + j * n, data, (size_t)n * sizeof(float));
    }
    qr_optim_slots_free(s);
    qr_optim_free(opt);
}

static void test_weight_decay_is_l2_in_the_gradient(void **state) {
    (void)state;
    const char *names[] = {"sgd", "momentum", "adagrad", "rmsprop", "adam", "adam_async"};
    const int64_t rows = 3, dim = 1500, n = rows * dim; /* rows of 1500: blocks of 1024 + 476 */
    const float wd = 0.25f;
    float *var0 = malloc(n * sizeof(float)), *g[3];
    uint64_t st = 5;
    for (int64_t i = 0; i < n; i++) var0[i] = frand(&st) * 4;
    for (int k = 0; k < 3; k++) {
        g[k] = malloc(n * sizeof(float));
        for (int64_t i = 0; i < n; i++) g[k][i] = frand(&st);
    }
    float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    float *want_slots = calloc((size_t)n * 3, sizeof(float));
    float *got_slots = calloc((size_t)n * 3, sizeof(float));
    float *gd = malloc(n * sizeof(float));
    for (size_t o = 0; o < QR_ARRAY_LEN(names); o++) {
        /* By hand: weight-decay 0, fed g + wd*var (dense: every element;
         * sparse: the summed rows 2 and 0 of the duplicate-index push). */
        qr_optim *opt;
        char kv[64];
        snprintf(kv, sizeof kv, "optimizer=%s", names[o]);
        assert_int_equal(try_make(&opt, kv, NULL), QR_OK);
        qr_optim_slots *s;
        assert_int_equal(qr_optim_slots_create(opt, rows, dim, &s), QR_OK);
        memcpy(want, var0, n * sizeof(float));
        for (int step = 0; step < 3; step++) {
            if (step % 2 == 0) {
                for (int64_t i = 0; i < n; i++) gd[i] = g[step][i] + wd * want[i];
                assert_int_equal(qr_optim_apply_dense(opt, s, want, gd, n, -1, step + 1), QR_OK);
            } else {
                int64_t idx[2] = {rows - 1, 0};
                for (int64_t i = 0; i < dim; i++) {
                    gd[i] = (g[step][i] + g[step][2 * dim + i]) + wd * want[(rows - 1) * dim + i];
                    gd[dim + i] = g[step][dim + i] + wd * want[i];
                }
                assert_int_equal(qr_optim_apply_sparse(opt, s, want, rows, dim, idx, gd, 2, -1,
                                                       step + 1), QR_OK);
            }
        }
        for (int j = 0; j < qr_optim_row_slots(opt); j++) {
            float *data;
            qr_optim_slot(s, j, NULL, &data, NULL);
            memcpy(want_slots + j * n, data, (size_t)n * sizeof(float));
        }
        int nrow = qr_optim_row_slots(opt);
        qr_optim_slots_free(s);
        qr_optim_free(opt);
        for (int threads = 1; threads <= 3; threads += 2) {
            memcpy(got, var0, n * sizeof(float));
            wd_apply(names[o], "0.25", threads, got, rows, dim, (const float *const *)g, 3,
                     got_slots);
            if (memcmp(got, want, n * sizeof(float)) ||
                memcmp(got_slots, want_slots, (size_t)(n * nrow) * sizeof(float)))
                fail_msg("%s, %d threads: weight-decay is not g + wd*var", names[o], threads);
        }
        /* weight-decay=0 set explicitly: the very bits of no decay */
        float *plain = malloc(n * sizeof(float));
        memcpy(plain, var0, n * sizeof(float));
        memcpy(got, var0, n * sizeof(float));
        wd_apply(names[o], "0", 1, got, rows, dim, (const float *const *)g, 3, got_slots);
        assert_int_equal(try_make(&opt, kv, NULL), QR_OK);
        assert_int_equal(qr_optim_slots_create(opt, rows, dim, &s), QR_OK);
        int64_t idx[3] = {rows - 1, 0, rows - 1};
        for (int step = 0; step < 3; step++)
            assert_int_equal(step % 2 ? qr_optim_apply_sparse(opt, s, plain, rows, dim, idx,
                                                              g[step], 3, -1, step + 1)
                                      : qr_optim_apply_dense(opt, s, plain, g[step], n, -1,
                                                             step + 1),
                             QR_OK);
        assert_memory_equal(got, plain, n * sizeof(float));
        free(plain);
        qr_optim_slots_free(s);
        qr_optim_free(opt);
    }
    /* SGD's out-of-place apply decays too: the bits of the in-place one */
    qr_optim *opt;
    assert_int_equal(try_make(&opt, "optimizer=sgd", "weight-decay=0.25", "apply-threads=3", NULL),
                     QR_OK);
    qr__optim_set_parallel_min(opt, 1000);
    qr_optim_slots *s;
    assert_int_equal(qr_optim_slots_create(opt, n, 1, &s), QR_OK);
    assert_true(qr_optim_stateless(opt));
    assert_int_equal(qr_optim_apply_dense_to(opt, got, var0, g[0], n, -1), QR_OK);
    memcpy(want, var0, n * sizeof(float));
    assert_int_equal(qr_optim_apply_dense(opt, s, want, g[0], n, -1, 1), QR_OK);
    assert_memory_equal(got, want, n * sizeof(float));
    for (int64_t i = 0; i < n; i += 101)
        assert_true(want[i] == var0[i] - (g[0][i] + 0.25f * var0[i]) * 0.05f);
    qr_optim_slots_free(s);
    qr_optim_free(opt);
    for (int k = 0; k < 3; k++) free(g[k]);
    free(var0);
    free(want);
    free(got);
    free(want_slots);
    free(got_slots);
    free(gd);
}

/* tf.compat.v1.train.exponential_decay: lr * rate^(step / steps), floored
 * exponent with staircase, no decay when steps is 0. */
static void test_decayed_lr(void **state) {
    (void)state;
    assert_float_equal(qr_optim_decayed_lr(0.1f, 0, 0.5, 10, false), 0.1f, 0);
    assert_float_equal(qr_optim_decayed_lr(0.1f, 10, 0.5, 10, false), 0.05f, 1e-8);
    assert_float_equal(qr_optim_decayed_lr(0.1f, 15, 0.5, 10, false), 0.1 * pow(0.5, 1.5), 1e-8);
    assert_float_equal(qr_optim_decayed_lr(0.1f, 15, 0.5, 10, true), 0.05f, 1e-8);
    assert_float_equal(qr_optim_decayed_lr(0.1f, 19, 0.5, 10, true), 0.05f, 1e-8);
    assert_float_equal(qr_optim_decayed_lr(0.1f, 20, 0.5, 10, true), 0.025f, 1e-8);
    assert_float_equal(qr_optim_decayed_lr(0.1f, 1000, 0.5, 0, false), 0.1f, 0);
    assert_float_equal(qr_optim_decayed_lr(0.1f, 1000, 1.0, 10, false), 0.1f, 0);
}

/* The out-of-place apply a ps uses for a tensor a pull still reads:
 * bit-identical to the in-place apply, input left alone, and refused by
 * every optimizer that keeps slots (their state could not follow). */
/* Values with no pattern a vector loop could hide behind. */
static void fill_var_and_grad(float *var, float *g, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        var[i] = 0.37f * (float)(i % 17) - 2.0f;
        g[i] = 1.0f / (float)(i + 3) - 0.1f;
    }
}

static void test_apply_dense_to(void **state) {
    (void)state;
    const int64_t n = 1001; /* odd: the vector loop's tail runs too */
    float *var = malloc(n * sizeof *var), *g = malloc(n * sizeof *g);
    float *inplace = malloc(n * sizeof *inplace), *out = malloc(n * sizeof *out);
    fill_var_and_grad(var, g, n);
    for (int i = 0; i < qr_optim_count(); i++) {
        const char *name = qr_optim_name_at(i);
        qr_optim *opt;
        char kv[64];
        snprintf(kv, sizeof kv, "optimizer=%s", name);
        assert_int_equal(try_make(&opt, kv, "lr=0.013", NULL), QR_OK);
        bool sgd = !strcmp(name, "sgd");
        assert_int_equal(qr_optim_stateless(opt), sgd);
        if (!sgd) {
            assert_int_equal(qr_optim_apply_dense_to(opt, out, var, g, n, -1), QR_EINVAL);
            assert_non_null(strstr(qr_last_error(), "slots"));
            qr_optim_free(opt);
            continue;
        }
        qr_optim_slots *slots;
        assert_int_equal(qr_optim_slots_create(opt, n, 1, &slots), QR_OK);
        for (int lr_kind = 0; lr_kind < 2; lr_kind++) {
            float lr = lr_kind ? 0.5f : -1.0f; /* the variable's, then the optimizer's */
            memcpy(inplace, var, n * sizeof *var);
            assert_int_equal(qr_optim_apply_dense(opt, slots, inplace, g, n, lr, 1), QR_OK);
            float *saved = malloc(n * sizeof *saved);
            memcpy(saved, var, n * sizeof *var);
            assert_int_equal(qr_optim_apply_dense_to(opt, out, var, g, n, lr), QR_OK);
            assert_memory_equal(out, inplace, n * sizeof *out);
            assert_memory_equal(var, saved, n * sizeof *var); /* input untouched */
            assert_memory_not_equal(out, var, n * sizeof *out);
            free(saved);
        }
        assert_int_equal(qr_optim_apply_dense_to(opt, out, var, g, n, NAN), QR_EINVAL);
        assert_int_equal(qr_optim_apply_dense_to(opt, NULL, var, g, n, -1), QR_EINVAL);
        qr_optim_slots_free(slots);
        qr_optim_free(opt);
    }
    assert_false(qr_optim_stateless(NULL));
    /* Split over a pool of 3 threads: every element still written once,
     * the same bits as the one-thread in-place apply. */
    qr_optim *pooled;
    assert_int_equal(try_make(&pooled, "optimizer=sgd", "lr=0.013", "apply-threads=3", NULL),
                     QR_OK);
    qr__optim_set_parallel_min(pooled, 1000);
    qr_optim_slots *slots;
    assert_int_equal(qr_optim_slots_create(pooled, n, 1, &slots), QR_OK);
    memcpy(inplace, var, n * sizeof *var);
    assert_int_equal(qr_optim_apply_dense(pooled, slots, inplace, g, n, -1, 1), QR_OK);
    memset(out, 0xff, n * sizeof *out); /* NaNs where a part would be skipped */
    assert_int_equal(qr_optim_apply_dense_to(pooled, out, var, g, n, -1), QR_OK);
    assert_memory_equal(out, inplace, n * sizeof *out);
    qr_optim_slots_free(slots);
    qr_optim_free(pooled);
    free(var);
    free(g);
    free(inplace);
    free(out);
}

/* The ps's apply-on-arrival kernel (ps/fused_apply.c) must give the very
 * bits of an in-place SGD apply, flag every non-finite result, and with
 * lr = -1 add exactly. */
static void test_sgd_into_grad(void **state) {
    (void)state;
    const int64_t n = 1001; /* odd: the vector loop's tail runs too */
    float *var = malloc(n * sizeof *var), *g = malloc(n * sizeof *g);
    float *want = malloc(n * sizeof *want), *io = malloc(n * sizeof *io);
    fill_var_and_grad(var, g, n);
    qr_optim *opt;
    assert_int_equal(try_make(&opt, "optimizer=sgd", "lr=0.013", NULL), QR_OK);
    qr_optim_slots *slots;
    assert_int_equal(qr_optim_slots_create(opt, n, 1, &slots), QR_OK);
    const float lrs[] = {0.013f, 0.5f, 3.0f};
    for (size_t k = 0; k < QR_ARRAY_LEN(lrs); k++) {
        memcpy(want, var, n * sizeof *var);
        assert_int_equal(qr_optim_apply_dense(opt, slots, want, g, n, lrs[k], 1), QR_OK);
        memcpy(io, g, n * sizeof *g);
        assert_true(qr_optim_sgd_into_grad(io, var, n, lrs[k]));
        assert_memory_equal(io, want, n * sizeof *io);
    }
    memcpy(io, g, n * sizeof *g);
    assert_true(qr_optim_sgd_into_grad(io, var, n, -1.0f));
    for (int64_t i = 0; i < n; i++) assert_true(io[i] == var[i] + g[i]);
    /* A NaN or Inf anywhere, in the gradient or from an overflow, is seen;
     * so is one in the tail after the vector loop. */
    const int64_t where[] = {0, 517, n - 1};
    const float bad[] = {NAN, INFINITY, -INFINITY, 3e38f};
    for (size_t w = 0; w < QR_ARRAY_LEN(where); w++)
        for (size_t b = 0; b < QR_ARRAY_LEN(bad); b++) {
            memcpy(io, g, n * sizeof *g);
            io[where[w]] = bad[b]; /* 3e38 * -3 overflows to -Inf */
            if (qr_optim_sgd_into_grad(io, var, n, -3.0f))
                fail_msg("value %g at %lld not flagged", (double)bad[b], (long long)where[w]);
        }
    qr_optim_slots_free(slots);
    qr_optim_free(opt);
    free(var);
    free(g);
    free(want);
    free(io);
}

/* Two threads applying two big variables with one shared optimizer: one
 * gets the pool, the other runs alone; both must be right. */
typedef struct {
    qr_optim *opt;
    float *var, *g;
    int64_t n;
    qr_optim_slots *s;
} conc_arg;

static void *conc_main(void *p) {
    conc_arg *a = p;
    for (int step = 1; step <= 20; step++)
        if (qr_optim_apply_dense(a->opt, a->s, a->var, a->g, a->n, -1, step)) return p;
    return NULL;
}

static void test_concurrent_applies(void **state) {
    qr_optim *opt;
    assert_int_equal(try_make(&opt, "optimizer=adam", "apply-threads=2", NULL), QR_OK);
    qr__optim_set_parallel_min(opt, 1000);
    const int64_t n = 100000;
    conc_arg a[2];
    for (int k = 0; k < 2; k++) {
        a[k].opt = opt;
        a[k].n = n;
        a[k].var = calloc((size_t)n, sizeof(float));
        a[k].g = malloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) a[k].g[i] = 0.5f;
        assert_int_equal(qr_optim_slots_create(opt, 1, n, &a[k].s), QR_OK);
    }
    pthread_t th[2];
    for (int k = 0; k < 2; k++) pthread_create(&th[k], NULL, conc_main, &a[k]);
    for (int k = 0; k < 2; k++) {
        void *ret;
        pthread_join(th[k], &ret);
        assert_null(ret);
    }
    /* constant gradient: each Adam step moves ~lr, so 20 steps ~ -0.02 */
    for (int k = 0; k < 2; k++) {
        for (int64_t i = 0; i < n; i += 997) assert_true(fabsf(a[k].var[i] + 0.02f) < 1e-5f);
        assert_true(a[k].var[0] == a[k].var[n - 1]);
        free(a[k].var);
        free(a[k].g);
        qr_optim_slots_free(a[k].s);
    }
    qr_optim_free(opt);
}

/* The row-pointer core on rows that are not contiguous: same result as a
 * sparse apply of the same rows of a dense variable. */
static void test_apply_rows(void **state) {
    qr_optim *opt;
    assert_int_equal(try_make(&opt, "optimizer=adam_async", NULL), QR_OK);
    enum { R = 6, D = 5 };
    qr_optim_slots *dense_s, *rows_s;
    assert_int_equal(qr_optim_slots_create(opt, R, D, &dense_s), QR_OK);
    assert_int_equal(qr_optim_slots_create(opt, 0, D, &rows_s), QR_OK);
    assert_int_equal(qr_optim_slots_count(rows_s), 4);
    float var[R * D], g[2 * D];
    uint64_t st = 7;
    for (int i = 0; i < R * D; i++) var[i] = frand(&st);
    for (int i = 0; i < 2 * D; i++) g[i] = frand(&st);
    /* rows 4 and 1 stored apart, each with its own m and v rows */
    float r4[D], r1[D], m4[D] = {0}, m1[D] = {0}, v4[D] = {0}, v1[D] = {0};
    memcpy(r4, var + 4 * D, sizeof r4);
    memcpy(r1, var + 1 * D, sizeof r1);
    int64_t idx[2] = {4, 1};
    for (int step = 0; step < 3; step++) {
        assert_int_equal(qr_optim_apply_sparse(opt, dense_s, var, R, D, idx, g, 2, -1, 0), QR_OK);
        float *var_rows[2] = {r4, r1};
        float *slot_rows[4] = {m4, m1, v4, v1};
        const float *grad_rows[2] = {g, g + D};
        assert_int_equal(qr_optim_apply_rows(opt, rows_s, var_rows, slot_rows, grad_rows, 2, D, -1, 0), QR_OK);
    }
    assert_memory_equal(r4, var + 4 * D, sizeof r4);
    assert_memory_equal(r1, var + 1 * D, sizeof r1);
    float *m;
    qr_optim_slot(dense_s, 0, NULL, &m, NULL);
    assert_memory_equal(m1, m + 1 * D, sizeof m1);
    qr_optim_slots_free(dense_s);
    qr_optim_slots_free(rows_s);
    qr_optim_free(opt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_slot_layout),
        cmocka_unit_test(test_bad_calls_change_nothing),
        cmocka_unit_test(test_all_finite),
        cmocka_unit_test(test_threads_bit_identical),
        cmocka_unit_test(test_weight_decay_is_l2_in_the_gradient),
        cmocka_unit_test(test_decayed_lr),
        cmocka_unit_test(test_apply_dense_to),
        cmocka_unit_test(test_sgd_into_grad),
        cmocka_unit_test(test_concurrent_applies),
        cmocka_unit_test(test_apply_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * optim.c - the optimizer object and everything that does not depend on the
 * algorithm: option reading and validation, slot allocation, argument
 * checks, and running an element kernel over a dense tensor (split across
 * the pool for large ones) or over the touched rows of a sparse gradient,
 * with coupled weight decay (torch's weight_decay, L2) added to the
 * gradient on the way, and a synchronous step's reduce made block by
 * block on the way in (qr_optim_reduce_apply_dense). The algorithms
 * themselves are in sgd.c momentum.c adagrad.c rmsprop.c adam.c
 * adam_async.c adamw.c ftrl.c.
 */
#include "optim/optim_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The optimizers: the one list of them. Each entry names itself (quorum's
 * name, TensorFlow's class name) and its slots (its init function); the
 * option table's choices for "optimizer" and --help come from here
 * (register_names), checkpoints name slots with qr_optim_tf_name, and
 * test_optim_api.c fails for an entry it has no expectations for. */
static const qr_optim_ops *const all_ops[] = {
    &qr__optim_sgd,  &qr__optim_momentum,   &qr__optim_adagrad, &qr__optim_rmsprop,
    &qr__optim_adam, &qr__optim_adam_async, &qr__optim_ftrl,    &qr__optim_adamw,
};

double qr__optim_opt_float(const qr_config *cfg, const char *key, double def) {
    if (!qr__config_is_set(cfg, key)) return def;
    return qr__config_float(cfg, key);
}

static const qr_optim_ops *find_ops(const char *name) {
    for (size_t i = 0; name && i < QR_ARRAY_LEN(all_ops); i++)
        if (!strcmp(all_ops[i]->name, name)) return all_ops[i];
    return NULL;
}

int qr_optim_count(void) {
    return (int)QR_ARRAY_LEN(all_ops);
}

const char *qr_optim_name_at(int i) {
    return i >= 0 && i < qr_optim_count() ? all_ops[i]->name : NULL;
}

const char *qr_optim_tf_name(const char *name) {
    const qr_optim_ops *ops = find_ops(name);
    return ops ? ops->tf_name : NULL;
}

/* The option table (common/config.c, a layer below, which cannot ask this
 * one) learns the names as the "optimizer" option's choices, "sgd|...",
 * when the library is loaded: before main in a program, at dlopen for
 * libquorum.so. Every program that creates an optimizer has this file. */
__attribute__((constructor)) static void register_names(void) {
    static char choices[256];
    size_t len = 0;
    for (size_t i = 0; i < QR_ARRAY_LEN(all_ops); i++)
        len += (size_t)snprintf(choices + len, sizeof choices - len, "%s%s", i ? "|" : "",
                                all_ops[i]->name);
    qr__config_provide_choices("optimizer", choices, qr__optim_sgd.name);
}

void qr__optim_add_slot(qr_optim *opt, const char *name, bool scalar, float init) {
    /* Layout: per-row slots first, scalars after; init functions add the
     * per-row ones first. QR_OPTIM_MAX_SLOTS bounds every optimizer here. */
    qr_optim_slot_spec *sp = &opt->slot[opt->nslots++];
    sp->name = name;
    sp->scalar = scalar;
    sp->init = init;
    if (!scalar) opt->nrow_slots++;
}

void qr__optim_set_parallel_min(qr_optim *opt, int64_t n) {
    opt->parallel_min = n < 1 ? 1 : n;
}

int qr_optim_create(qr_optim **out, const qr_config *cfg) {
    if (!out) return qr__fail(QR_EINVAL, "qr_optim_create: out is NULL");
    *out = NULL;
    const char *name = qr__config_str(cfg, "optimizer");
    const qr_optim_ops *ops = find_ops(name);
    if (!ops) return qr__fail(QR_EINVAL, "option optimizer: unknown optimizer '%s'", name);

    for (const char *k = QR__OPTIM_KEYS; *k;) {
        size_t len = strcspn(k, "|");
        char key[32];
        snprintf(key, sizeof key, "%.*s", (int)len, k);
        if (qr__config_is_set(cfg, key) && !qr__list_has(ops->keys, '|', key))
            return qr__fail(QR_EINVAL,
                            "optimizer %s: option %s does not apply to it (it reads: %s)",
                            ops->name, key, ops->keys);
        k += len + (k[len] == '|');
    }

    qr_optim *opt = qr__calloc(1, sizeof *opt);
    if (!opt) return QR_ENOMEM;
    opt->ops = ops;
    opt->parallel_min = QR_OPTIM_PARALLEL_MIN;
    /* torch's default, 0 (AdamW's init sets its own, 0.01, when unset) */
    opt->hp.weight_decay = qr__optim_opt_float(cfg, "weight-decay", 0.0);
    int rc = ops->init(opt, cfg);
    /* every hyper-parameter is used as a float: it must be one */
    if (rc == QR_OK && !(opt->hp.lr > 0 && isfinite((float)opt->hp.lr)))
        rc = qr__fail(QR_EINVAL, "optimizer %s: option lr must be a finite number > 0, got %g",
                      ops->name, (double)opt->hp.lr);
    if (rc == QR_OK && !(opt->hp.weight_decay >= 0 && isfinite((float)opt->hp.weight_decay)))
        rc = qr__fail(QR_EINVAL,
                      "optimizer %s: option weight-decay must be a finite number >= 0, got %g",
                      ops->name, (double)opt->hp.weight_decay);
    if (rc == QR_OK) {
        opt->nthreads = (int)qr__config_int(cfg, "apply-threads");
        /* 0 = one per core, at most 4. The default is 1: on this project's
         * 2-core machine a second apply thread showed no measurable gain
         * (16 MiB push+pull: 9.1-10.8 ms either way). */
        if (opt->nthreads == 0) opt->nthreads = (int)QR_MIN(4, QR_MAX(1, sysconf(_SC_NPROCESSORS_ONLN)));
        if (opt->nthreads < 1) opt->nthreads = 1;
        if (opt->nthreads > 1) rc = qr__optim_pool_create(&opt->pool, opt->nthreads);
    }
    if (rc) {
        qr_optim_free(opt);
        return rc;
    }
    *out = opt;
    return QR_OK;
}

void qr_optim_free(qr_optim *opt) {
    if (!opt) return;
    qr__optim_pool_free(opt->pool);
    free(opt);
}

const char *qr_optim_name(const qr_optim *opt) {
    return opt ? opt->ops->name : "";
}

float qr_optim_lr(const qr_optim *opt) {
    return opt ? (float)opt->hp.lr : 0.0f;
}

float qr_optim_weight_decay(const qr_optim *opt) {
    return opt ? (float)opt->hp.weight_decay : 0.0f;
}

float qr_optim_decayed_lr(float lr, int64_t step, double rate, int64_t steps, bool staircase) {
    if (steps <= 0 || step <= 0) return lr;
    double exponent = (double)step / (double)steps;
    if (staircase) exponent = floor(exponent);
    return (float)((double)lr * pow(rate, exponent));
}

/* ---- slots --------------------------------------------------------------- */

int qr_optim_slots_create(const qr_optim *opt, int64_t rows, int64_t dim,
                          qr_optim_slots **out) {
    if (!out) return qr__fail(QR_EINVAL, "qr_optim_slots_create: out is NULL");
    *out = NULL;
    if (!opt) return qr__fail(QR_EINVAL, "qr_optim_slots_create: opt is NULL");
    if (rows < 0 || dim < 1 || (rows > 0 && dim > INT64_MAX / 4 / rows))
        return qr__fail(QR_ESHAPE, "optimizer %s: bad slot shape (%lld, %lld)",
                        opt->ops->name, (long long)rows, (long long)dim);
    qr_optim_slots *s = qr__calloc(1, sizeof *s);
    if (!s) return QR_ENOMEM;
    s->ops = opt->ops;
    s->nslots = opt->nslots;
    s->nrow_slots = opt->nrow_slots;
    s->rows = rows;
    s->dim = dim;
    s->n = rows * dim;
    for (int j = 0; j < opt->nslots; j++) {
        const qr_optim_slot_spec *sp = &opt->slot[j];
        int64_t len = sp->scalar ? 1 : s->n;
        s->name[j] = sp->name;
        s->len[j] = len;
        /* zeroed only when zero is the initial value: a slot filled with
         * its initial value is not cleared first */
        size_t bytes = (size_t)len * sizeof(float);
        s->data[j] = sp->init == 0.0f ? qr__aligned_alloc(bytes) : qr__aligned_alloc_uninit(bytes);
        if (!s->data[j]) {
            qr_optim_slots_free(s);
            return QR_ENOMEM;
        }
        if (sp->init != 0.0f)
            for (int64_t i = 0; i < len; i++) s->data[j][i] = sp->init;
    }
    *out = s;
    return QR_OK;
}

void qr_optim_slots_free(qr_optim_slots *s) {
    if (!s) return;
    for (int j = 0; j < s->nslots; j++) free(s->data[j]);
    free(s);
}

int qr_optim_slots_clone(const qr_optim_slots *s, qr_optim_slots **out) {
    *out = NULL;
    qr_optim_slots *c = qr__calloc(1, sizeof *c);
    if (!c) return QR_ENOMEM;
    *c = *s;
    for (int j = 0; j < s->nslots; j++) {
        size_t bytes = (size_t)s->len[j] * sizeof(float);
        c->data[j] = qr__aligned_alloc_uninit(bytes);
        if (!c->data[j]) {
            for (int k = j; k < s->nslots; k++) c->data[k] = NULL;
            qr_optim_slots_free(c);
            return QR_ENOMEM;
        }
        memcpy(c->data[j], s->data[j], bytes);
    }
    *out = c;
    return QR_OK;
}

int qr_optim_slots_count(const qr_optim_slots *s) {
    return s ? s->nslots : 0;
}

int qr_optim_slot(const qr_optim_slots *s, int i, const char **name, float **data,
                  int64_t *n) {
    if (!s || i < 0 || i >= s->nslots)
        return qr__fail(QR_EINVAL, "qr_optim_slot: no slot %d (the variable has %d)", i,
                        s ? s->nslots : 0);
    if (name) *name = s->name[i];
    if (data) *data = s->data[i];
    if (n) *n = s->len[i];
    return QR_OK;
}

int qr_optim_row_slots(const qr_optim *opt) {
    return opt ? opt->nrow_slots : 0;
}

int qr_optim_row_slot_info(const qr_optim *opt, int j, const char **name, float *init) {
    if (!opt || j < 0 || j >= opt->nrow_slots)
        return qr__fail(QR_EINVAL, "qr_optim_row_slot_info: no per-row slot %d", j);
    if (name) *name = opt->slot[j].name;
    if (init) *init = opt->slot[j].init;
    return QR_OK;
}

/* ---- applies ------------------------------------------------------------- */

/* The call's hyperparameters and learning rate (< 0: the optimizer's). */
static int call_init(const qr_optim *opt, float lr, qr_optim_call *c) {
    if (isnan(lr) || isinf(lr))
        return qr__fail(QR_EINVAL, "optimizer %s: learning rate %g is not finite",
                        opt->ops->name, (double)lr);
    *c = (qr_optim_call){.hp = &opt->hp, .lr = lr < 0 ? (float)opt->hp.lr : lr};
    if (!opt->ops->decoupled_decay) c->grad_decay = (float)opt->hp.weight_decay;
    return QR_OK;
}

/* Checks common to every apply, then the optimizer's per-call constants. */
static int begin_call(const qr_optim *opt, qr_optim_slots *s, float lr, int64_t global_step,
                      bool sparse, qr_optim_call *c) {
    if (!opt || !s) return qr__fail(QR_EINVAL, "optimizer apply: opt and slots must not be NULL");
    if (s->ops != opt->ops || s->nslots != opt->nslots)
        return qr__fail(QR_EINVAL, "optimizer %s: the slots were made for optimizer %s",
                        opt->ops->name, s->ops->name);
    int rc = call_init(opt, lr, c);
    if (rc) return rc;
    c->sparse = sparse;
    return opt->ops->begin ? opt->ops->begin(opt, s, global_step, c) : QR_OK;
}

/* Coupled weight decay (torch's weight_decay for SGD, Adam, Adagrad,
 * RMSprop: grad = grad.add(param, alpha=weight_decay), before anything
 * else). The kernels are left as they are: they are handed
 *     g' = g + wd * var          (var before this update)
 * computed here DECAY_BLOCK elements at a time into a buffer on the stack,
 * still in L1 when the kernel reads it. The kernels are element-wise, so
 * cutting a range into blocks changes no result; wd = 0 skips all this
 * and passes the gradient itself, bit for bit as before. On a sparse apply
 * only the touched rows get the decay (their summed gradient rows), as
 * torch would for a dense gradient that is zero elsewhere and only those
 * rows applied. */
#define DECAY_BLOCK 1024

QR_OPTIM_LOOP static void decayed_grad(float *restrict out, const float *restrict g,
                                       const float *restrict var, int64_t n, float wd) {
    for (int64_t i = 0; i < n; i++) out[i] = g[i] + wd * var[i];
}

/* kernel(c, var[n], slot[..][n], g[n]) with the decay added to g. */
static void run_kernel(const qr_optim_call *c, qr_optim_kernel kernel, float *var,
                       float *const *slot, int nrow_slots, const float *g, int64_t n) {
    if (c->grad_decay == 0.0f) {
        kernel(c, var, slot, g, n);
        return;
    }
    _Alignas(64) float block[DECAY_BLOCK];
    float *block_slot[QR_OPTIM_MAX_SLOTS];
    for (int64_t lo = 0; lo < n; lo += DECAY_BLOCK) {
        int64_t len = QR_MIN(DECAY_BLOCK, n - lo);
        decayed_grad(block, g + lo, var + lo, len, c->grad_decay);
        for (int q = 0; q < nrow_slots; q++) block_slot[q] = slot[q] + lo;
        kernel(c, var + lo, block_slot, block, len);
    }
}

/* The same for an out-of-place apply: out[n] = var[n] - update(g'[n]). */
static void run_kernel_to(const qr_optim_call *c, const qr_optim_ops *ops, float *out,
                          const float *var, const float *g, int64_t n) {
    if (c->grad_decay == 0.0f) {
        ops->apply_dense_to(c, out, var, g, n);
        return;
    }
    _Alignas(64) float block[DECAY_BLOCK];
    for (int64_t lo = 0; lo < n; lo += DECAY_BLOCK) {
        int64_t len = QR_MIN(DECAY_BLOCK, n - lo);
        decayed_grad(block, g + lo, var + lo, len, c->grad_decay);
        ops->apply_dense_to(c, out + lo, var + lo, block, len);
    }
}

/* Dense: one kernel call per thread on a contiguous chunk. The gradient is
 * g, or (srcs != NULL) the reduce of a synchronous step, made here. */
typedef struct dense_job {
    const qr_optim_call *c;
    qr_optim_kernel kernel;
    float *var;
    const float *g;
    float *const *slot;
    int nrow_slots;
    int64_t n;
    const float *const *srcs; /* k gradients to reduce, or NULL */
    int k;
    float divisor;
} dense_job;

/* A synchronous step (qr_optim_reduce_apply_dense): the gradients are
 * reduced FUSE_BLOCK elements at a time into a buffer on the stack and
 * the kernel runs on that block while it is still in L1, so the sum is
 * never written to memory and read back. 1024 floats: the block, its
 * decayed copy (run_kernel) and the block of the variable and of each
 * slot fit in a 32 KiB L1 beside the sources' streams. Both the reduce
 * and the kernels are element-wise, so cutting the range into blocks
 * changes no result. */
#define FUSE_BLOCK 1024

static void dense_range(const dense_job *j, int64_t lo, int64_t hi) {
    float *slot[QR_OPTIM_MAX_SLOTS];
    if (!j->srcs) {
        for (int k = 0; k < j->nrow_slots; k++) slot[k] = j->slot[k] + lo;
        run_kernel(j->c, j->kernel, j->var + lo, slot, j->nrow_slots, j->g + lo, hi - lo);
        return;
    }
    _Alignas(64) float block[FUSE_BLOCK];
    for (int64_t b = lo; b < hi; b += FUSE_BLOCK) {
        int64_t len = QR_MIN(FUSE_BLOCK, hi - b);
        qr__optim_reduce_at(block, j->srcs, j->k, b, len, j->divisor);
        for (int k = 0; k < j->nrow_slots; k++) slot[k] = j->slot[k] + b;
        run_kernel(j->c, j->kernel, j->var + b, slot, j->nrow_slots, block, len);
    }
}

/* Part `part` of nparts of n elements, as [*lo, *hi). Boundaries on
 * 16-float (64-byte) multiples: no cache line is written by two threads,
 * and each chunk starts aligned like the tensor. */
static void part_range(int64_t n, int part, int nparts, int64_t *lo, int64_t *hi) {
    int64_t blocks = (n + 15) / 16;
    *lo = blocks * part / nparts * 16;
    *hi = QR_MIN(blocks * (part + 1) / nparts * 16, n);
}

static void dense_part(void *arg, int part, int nparts) {
    const dense_job *j = arg;
    int64_t lo, hi;
    part_range(j->n, part, nparts, &lo, &hi);
    if (lo < hi) dense_range(j, lo, hi);
}

/* Out of place: out = update(var, g), one chunk per thread. */
typedef struct dense_to_job {
    const qr_optim_call *c;
    const qr_optim_ops *ops;
    float *out;
    const float *var, *g;
    int64_t n;
} dense_to_job;

static void dense_to_part(void *arg, int part, int nparts) {
    const dense_to_job *j = arg;
    int64_t lo, hi;
    part_range(j->n, part, nparts, &lo, &hi);
    if (lo < hi) run_kernel_to(j->c, j->ops, j->out + lo, j->var + lo, j->g + lo, hi - lo);
}

/* A dense apply of j (var, g or srcs, n set): the checks, the call's
 * constants, the kernel over the tensor (split across the pool when it is
 * large), then the optimizer's end. */
static int run_dense(const qr_optim *opt, qr_optim_slots *s, float lr, int64_t global_step,
                     dense_job *j) {
    qr_optim_call c;
    int rc = begin_call(opt, s, lr, global_step, false, &c);
    if (rc) return rc;
    int64_t n = j->n;
    if (n != s->n)
        return qr__fail(QR_ESHAPE, "optimizer %s: dense apply of %lld elements to slots of %lld",
                        opt->ops->name, (long long)n, (long long)s->n);
    if (n > 0 && (!j->var || (!j->g && !j->srcs)))
        return qr__fail(QR_EINVAL, "optimizer %s: var and grad must not be NULL", opt->ops->name);
    j->c = &c;
    j->kernel = opt->ops->apply_dense;
    j->slot = s->data;
    j->nrow_slots = s->nrow_slots;
    if (opt->pool && n >= opt->parallel_min && qr__optim_pool_run(opt->pool, dense_part, j)) {
        /* done by the pool */
    } else if (n > 0) {
        dense_range(j, 0, n);
    }
    if (opt->ops->end) opt->ops->end(opt, s, &c);
    return QR_OK;
}

int qr_optim_apply_dense(const qr_optim *opt, qr_optim_slots *s, float *var,
                         const float *grad, int64_t n, float lr, int64_t global_step) {
    dense_job j = {.var = var, .g = grad, .n = n};
    return run_dense(opt, s, lr, global_step, &j);
}

int qr_optim_reduce_apply_dense(const qr_optim *opt, qr_optim_slots *s, float *var,
                                const float *const *grads, int k, int64_t n, float divisor,
                                float lr, int64_t global_step) {
    const char *name = opt ? opt->ops->name : "?";
    if (k < 1 || !grads)
        return qr__fail(QR_EINVAL, "optimizer %s: a reduce of %d gradients (at least 1)", name, k);
    if (!(divisor > 0.0f && isfinite(divisor)))
        return qr__fail(QR_EINVAL, "optimizer %s: reduce divisor %g is not a finite number > 0",
                        name, (double)divisor);
    for (int i = 0; i < k && n > 0; i++)
        if (!grads[i])
            return qr__fail(QR_EINVAL, "optimizer %s: gradient %d of the reduce is NULL", name, i);
    dense_job j = {.var = var, .n = n, .srcs = grads, .k = k, .divisor = divisor};
    /* One gradient and nothing to divide: the sum is that gradient, read in
     * place as a plain apply would. */
    if (k == 1 && divisor == 1.0f) {
        j.g = grads[0];
        j.srcs = NULL;
    }
    return run_dense(opt, s, lr, global_step, &j);
}

bool qr_optim_stateless(const qr_optim *opt) {
    return opt && opt->ops->apply_dense_to && opt->nslots == 0;
}

int qr_optim_apply_dense_to(const qr_optim *opt, float *out, const float *var,
                            const float *grad, int64_t n, float lr) {
    if (!qr_optim_stateless(opt))
        return qr__fail(QR_EINVAL, "optimizer %s keeps slots: it cannot apply out of place",
                        opt ? opt->ops->name : "(null)");
    qr_optim_call c;
    int rc = call_init(opt, lr, &c);
    if (rc) return rc;
    if (n < 0) return qr__fail(QR_EINVAL, "optimizer %s: %lld elements", opt->ops->name, (long long)n);
    if (n > 0 && (!out || !var || !grad))
        return qr__fail(QR_EINVAL, "optimizer %s: out, var and grad must not be NULL",
                        opt->ops->name);
    dense_to_job j = {&c, opt->ops, out, var, grad, n};
    if (opt->pool && n >= opt->parallel_min && qr__optim_pool_run(opt->pool, dense_to_part, &j)) {
        /* done by the pool */
    } else if (n > 0) {
        dense_to_part(&j, 0, 1);
    }
    return QR_OK;
}

/* Rows: the row kernel on each of nrows distinct rows through pointers. */
typedef struct rows_job {
    const qr_optim_call *c;
    qr_optim_kernel kernel;
    float *const *var_rows;
    float *const *slot_rows; /* [nrow_slots * nrows] */
    const float *const *grad_rows;
    int nrow_slots;
    int64_t nrows, dim;
} rows_job;

/* The lines of n floats at p, fetched for writing. */
static void prefetch_floats(const float *p, int64_t n) {
    const char *at = (const char *)p, *end = (const char *)(p + n);
    for (; at < end; at += 64) __builtin_prefetch(at, 1, 3);
    __builtin_prefetch(end - 1, 1, 3); /* a row that starts mid-line */
}

/* How many rows ahead a row apply fetches its rows. */
#define ROWS_AHEAD 4

static void rows_range(const rows_job *j, int64_t lo, int64_t hi) {
    float *slot[QR_OPTIM_MAX_SLOTS];
    for (int64_t k = lo; k < hi; k++) {
        /* Rows of an embedding table sit apart (ps/table.c): each kernel
         * call would wait for its row's misses, so the rows ROWS_AHEAD on
         * are fetched while this one is applied. Hints only: the values
         * computed do not change. */
        if (k + ROWS_AHEAD < hi) {
            int64_t a = k + ROWS_AHEAD;
            prefetch_floats(j->var_rows[a], j->dim);
            prefetch_floats(j->grad_rows[a], j->dim);
            for (int q = 0; q < j->nrow_slots; q++)
                prefetch_floats(j->slot_rows[q * j->nrows + a], j->dim);
        }
        for (int q = 0; q < j->nrow_slots; q++) slot[q] = j->slot_rows[q * j->nrows + k];
        run_kernel(j->c, j->kernel, j->var_rows[k], slot, j->nrow_slots, j->grad_rows[k], j->dim);
    }
}

static void rows_part(void *arg, int part, int nparts) {
    const rows_job *j = arg;
    rows_range(j, j->nrows * part / nparts, j->nrows * (part + 1) / nparts);
}

static void run_rows(const qr_optim *opt, const rows_job *j) {
    if (opt->pool && j->nrows > 1 && j->nrows * j->dim >= opt->parallel_min &&
        qr__optim_pool_run(opt->pool, rows_part, (void *)j))
        return;
    rows_range(j, 0, j->nrows);
}

int qr_optim_apply_rows(const qr_optim *opt, qr_optim_slots *s, float *const *var_rows,
                        float *const *slot_rows, const float *const *grad_rows,
                        int64_t nrows, int64_t dim, float lr, int64_t global_step) {
    if (nrows < 0 || dim < 1 || (s && dim != s->dim))
        return qr__fail(QR_ESHAPE, "optimizer %s: row apply of (%lld, %lld) rows, slots have dim %lld",
                        opt ? opt->ops->name : "?", (long long)nrows, (long long)dim,
                        s ? (long long)s->dim : 0LL);
    qr_optim_call c;
    int rc = begin_call(opt, s, lr, global_step, true, &c);
    if (rc) return rc;
    if (nrows == 0) return QR_OK; /* nothing touched: powers stay too */
    if (!var_rows || !grad_rows || (opt->nrow_slots && !slot_rows))
        return qr__fail(QR_EINVAL, "optimizer %s: row pointers must not be NULL", opt->ops->name);
    rows_job j = {&c, opt->ops->apply_sparse_rows, var_rows, slot_rows, grad_rows,
                  opt->nrow_slots, nrows, dim};
    run_rows(opt, &j);
    if (opt->ops->end) opt->ops->end(opt, s, &c);
    return QR_OK;
}

int qr_optim_apply_sparse(const qr_optim *opt, qr_optim_slots *s, float *var, int64_t rows,
                          int64_t dim, const int64_t *indices, const float *grad, int64_t nidx,
                          float lr, int64_t global_step) {
    qr_optim_call c;
    int rc = begin_call(opt, s, lr, global_step, true, &c);
    if (rc) return rc;
    if (rows != s->rows || dim != s->dim)
        return qr__fail(QR_ESHAPE, "optimizer %s: sparse apply to (%lld, %lld), slots are (%lld, %lld)",
                        opt->ops->name, (long long)rows, (long long)dim, (long long)s->rows,
                        (long long)s->dim);
    if (nidx < 0) return qr__fail(QR_EINVAL, "optimizer %s: %lld indices", opt->ops->name, (long long)nidx);
    if (nidx == 0) return QR_OK; /* nothing touched: AdamAsync powers stay too */
    if (!var || !indices || !grad)
        return qr__fail(QR_EINVAL, "optimizer %s: var, indices and grad must not be NULL",
                        opt->ops->name);

    qr_optim_rows u;
    rc = qr__optim_dedup(indices, grad, nidx, rows, dim, &u);
    if (rc) {
        qr__error_prefix("optimizer %s: ", opt->ops->name);
        return rc;
    }
    /* Row pointers into var and each slot: the same core as a hash table. */
    int ns = opt->nrow_slots;
    float **ptrs = malloc((size_t)u.n * (size_t)(1 + ns) * sizeof(float *));
    if (!ptrs) {
        qr__optim_rows_free(&u);
        return qr__fail(QR_ENOMEM, "optimizer %s: out of memory for %lld row pointers",
                        opt->ops->name, (long long)u.n);
    }
    float **var_rows = ptrs, **slot_rows = ptrs + u.n;
    for (int64_t k = 0; k < u.n; k++) var_rows[k] = var + u.row[k] * dim;
    for (int q = 0; q < ns; q++)
        for (int64_t k = 0; k < u.n; k++) slot_rows[q * u.n + k] = s->data[q] + u.row[k] * dim;
    rows_job j = {&c, opt->ops->apply_sparse_rows, var_rows, slot_rows, u.grad, ns, u.n, dim};
    run_rows(opt, &j);
    if (opt->ops->end) opt->ops->end(opt, s, &c);
    free(ptrs);
    qr__optim_rows_free(&u);
    return QR_OK;
}

/* ---- finite check ---------------------------------------------------------- */

/* NaN and +-Inf are the only floats whose bits without the sign exceed
 * FLT_MAX's (0x7f7fffff), so the largest such value of a block decides.
 * An unsigned max vectorises (built for AVX2 and SSE2, like the kernels).
 * 32 independent maxima, not one, so the vector loop keeps several
 * accumulators and is not held to one max per cycle by the dependency on
 * the previous one: 1.2-1.6x faster here, which matters because this scan
 * runs on every gradient a ps receives. */
#define FINITE_LANES 32
#define FINITE_BLOCK 4096 /* floats per early-exit check */

QR_OPTIM_LOOP
bool qr_optim_all_finite(const float *x, int64_t n) {
    if (n <= 0) return true;
    if (!x) return false;
    int64_t i = 0;
    while (n - i >= FINITE_LANES) {
        int64_t block_end = i + QR_MIN(FINITE_BLOCK, (n - i) / FINITE_LANES * FINITE_LANES);
        uint32_t top[FINITE_LANES] = {0};
        for (; i < block_end; i += FINITE_LANES)
            for (int k = 0; k < FINITE_LANES; k++) {
                uint32_t u;
                memcpy(&u, &x[i + k], sizeof u);
                u &= 0x7fffffffu;
                top[k] = u > top[k] ? u : top[k];
            }
        uint32_t block_top = 0;
        for (int k = 0; k < FINITE_LANES; k++) block_top = QR_MAX(block_top, top[k]);
        if (block_top > 0x7f7fffffu) return false;
    }
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        if ((u & 0x7fffffffu) > 0x7f7fffffu) return false;
    }
    return true;
}

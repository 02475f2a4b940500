/*
 * optim_internal.h - what the optimizer files share: the hyper-parameter
 * block, the per-optimizer ops table, the slot layout, the per-call
 * constants handed to the element kernels, the thread pool and the
 * duplicate-index helper. The algorithms: sgd.c momentum.c adagrad.c
 * rmsprop.c adam.c adam_async.c adamw.c ftrl.c; optim.c runs them (and
 * adds coupled weight decay to the gradient, and fuses a synchronous
 * step's reduce into the apply), pool.c dedup.c reduce.c delta.c
 * var_options.c around them.
 *
 * Shape of the code (llm.c style): each optimizer file has plain loops
 * "run" functions over n consecutive elements with restrict pointers, so
 * gcc vectorises them; a dense apply calls the kernel on the whole tensor
 * (or on one chunk per thread), a sparse apply calls the same kernel on each
 * touched row (n = dim) through row pointers. Same code, same rounding, for
 * dense and sparse.
 */
#ifndef QR_OPTIM_INTERNAL_H
#define QR_OPTIM_INTERNAL_H

#include "optim/optim.h"

#include "common/config.h"

#define QR_OPTIM_MAX_SLOTS 4

/* The options of config.c that belong to optimizers: qr_optim_create
 * refuses one set explicitly that the chosen optimizer does not read (its
 * ops' keys), and a variable's own options may set these and "optimizer"
 * (var_options.c). */
#define QR__OPTIM_KEYS                                                                 \
    "lr|momentum|nesterov|beta1|beta2|epsilon|decay|centered|initial-accumulator|l1|l2|" \
    "lr-power|apply-sparse-rmsprop|weight-decay"

/* The element loops are compiled twice, for baseline x86-64 (SSE2, 4 floats)
 * and for AVX2 (8 floats), and the dynamic loader picks one for the CPU
 * (GCC function multi-versioning; no -march needed, the binary runs on any
 * x86-64). AVX2 without FMA performs the same IEEE operations in the same
 * order, so both paths give bit-identical results. It matters for the
 * loops with a sqrt and a division per element, which are compute-bound at
 * 4 floats per instruction. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define QR_OPTIM_LOOP __attribute__((target_clones("avx2", "default")))
#else
#define QR_OPTIM_LOOP
#endif
/* Dense tensors (and sparse applies touching) at least this many elements
 * are split across the pool's threads; below it the hand-off costs more
 * than it saves (a thread wake-up is a few microseconds, 256K floats of
 * Adam take ~100 us). */
#define QR_OPTIM_PARALLEL_MIN ((int64_t)1 << 18)

/* Hyper-parameters as the options' decimal values (double). The kernels
 * compute in float like TF's (T = float), with each constant rounded to
 * float once: (float)(1.0 - beta2) is the float nearest 0.001, where TF's
 * T(1) - beta2() gives 1 - 0.999f = 0.000999987 (1.3e-5 off, which shows
 * in v). */
typedef struct qr_optim_hp {
    double lr;         /* default learning rate */
    double momentum;   /* momentum, rmsprop */
    double beta1, beta2;
    double epsilon;
    double rho;        /* rmsprop "decay" */
    double init_accum; /* adagrad, ftrl "initial-accumulator" */
    double l1, l2, lr_power;
    /* "weight-decay": torch's weight_decay. Coupled (L2, added to the
     * gradient by optim.c before the kernel runs) for every optimizer but
     * AdamW, whose kernel decays the variable itself (decoupled). */
    double weight_decay;
    bool nesterov, centered, sparse_rmsprop;
} qr_optim_hp;

/* One slot of the optimizer's layout. */
typedef struct qr_optim_slot_spec {
    const char *name; /* TF's slot name */
    bool scalar;      /* one float per variable (AdamAsync powers), else per element */
    float init;       /* initial value */
} qr_optim_slot_spec;

typedef struct qr_optim_ops qr_optim_ops;
typedef struct qr_optim_pool qr_optim_pool;

struct qr_optim {
    const qr_optim_ops *ops;
    qr_optim_hp hp;
    int nslots;     /* all slots */
    int nrow_slots; /* per-element slots, which come first */
    qr_optim_slot_spec slot[QR_OPTIM_MAX_SLOTS];
    int nthreads;
    int64_t parallel_min;
    qr_optim_pool *pool; /* NULL when nthreads == 1 */
};

struct qr_optim_slots {
    const qr_optim_ops *ops; /* the optimizer kind the slots were made for */
    int nslots, nrow_slots;
    int64_t rows, dim, n;
    const char *name[QR_OPTIM_MAX_SLOTS];
    float *data[QR_OPTIM_MAX_SLOTS];
    int64_t len[QR_OPTIM_MAX_SLOTS];
};

/* Constants of one apply call, computed once before the element loops. */
typedef struct qr_optim_call {
    const qr_optim_hp *hp;
    float lr;    /* effective learning rate of this call */
    float alpha; /* Adam/AdamAsync step size lr_t (see adam.c), AdamW's
                  * lr / bias_c1 (adamw.c); else unused */
    float bias_c2_sqrt; /* AdamW: sqrt(1 - beta2^t) */
    float keep;         /* AdamW: 1 - lr * weight_decay, the decoupled decay */
    /* Coupled weight decay: optim.c hands the kernel g + grad_decay * var
     * (torch's grad.add(param, alpha=weight_decay)); 0 = the gradient as
     * it came, untouched, and for AdamW. */
    float grad_decay;
    bool sparse; /* the call is a sparse (row-wise) apply */
} qr_optim_call;

/* Element kernel: update n consecutive elements, var[n], slot[j][n] for the
 * per-row slots, g[n]. Dense applies run it on the tensor or on a chunk,
 * sparse applies on each touched row. */
typedef void (*qr_optim_kernel)(const qr_optim_call *c, float *var,
                                float *const *slot, const float *g, int64_t n);

struct qr_optim_ops {
    const char *name;    /* quorum's: the "optimizer" option's value */
    const char *tf_name; /* TensorFlow's class name, which checkpoints give
                          * the slots ("layer0/weights/Adam_1") */
    /* The options it reads, "|"-separated; an optimizer option set
     * explicitly but not listed here is refused by qr_optim_create. */
    const char *keys;
    /* AdamW: the kernel applies weight-decay itself (decoupled); the others
     * get it added to their gradient by optim.c. */
    bool decoupled_decay;
    /* Read and check the hyper-parameters (opt->hp, defaults applied) and
     * fill the slot layout opt->slot/nslots/nrow_slots. */
    int (*init)(qr_optim *opt, const qr_config *cfg);
    qr_optim_kernel apply_dense;       /* kernel of dense applies */
    qr_optim_kernel apply_sparse_rows; /* kernel run on each touched row */
    /* Optional, slot-free optimizers only: out[n] = var[n] - update(g[n]),
     * the same arithmetic as apply_dense (qr_optim_apply_dense_to). */
    void (*apply_dense_to)(const qr_optim_call *c, float *out, const float *var,
                           const float *g, int64_t n);
    /* Optional: per-call constants from the global step or the variable's
     * scalar slots (c->lr is already set). */
    int (*begin)(const qr_optim *opt, qr_optim_slots *s, int64_t global_step,
                 qr_optim_call *c);
    /* Optional: after a non-empty apply (AdamAsync advances its powers). */
    void (*end)(const qr_optim *opt, qr_optim_slots *s, const qr_optim_call *c);
};

extern const qr_optim_ops qr__optim_sgd, qr__optim_momentum, qr__optim_adagrad,
    qr__optim_rmsprop, qr__optim_adam, qr__optim_adam_async, qr__optim_ftrl, qr__optim_adamw;

/* Helpers for init functions (optim.c). */
/* float option `key`, or `def` when unset. */
double qr__optim_opt_float(const qr_config *cfg, const char *key, double def);
void qr__optim_add_slot(qr_optim *opt, const char *name, bool scalar, float init);
/* adam.c, shared with adam_async.c and adamw.c: lr, beta1, beta2,
 * epsilon, nesterov. */
int qr__optim_adam_hp(qr_optim *opt, const qr_config *cfg);
/* adam.c, shared with adamw.c: beta1^t and beta2^t in double for the
 * global step t; QR_EINVAL for t < 1. */
int qr__optim_adam_powers(const qr_optim *opt, int64_t global_step, double *beta1_t,
                          double *beta2_t);

/* For tests: split tensors of at least n elements (n >= 1) across threads. */
void qr__optim_set_parallel_min(qr_optim *opt, int64_t n);

/* ---- thread pool (pool.c) ---------------------------------------------- */
/* nthreads workers in total, the calling thread being one of them. */
int qr__optim_pool_create(qr_optim_pool **out, int nthreads);
void qr__optim_pool_free(qr_optim_pool *p);
/* Run fn(arg, part, nparts) for every part in [0, nparts), nparts = the
 * pool's size, the caller doing part 0, and wait for all. Returns false
 * without running anything if another thread is using the pool; the caller
 * then does the work alone (never blocks behind another variable's apply). */
bool qr__optim_pool_run(qr_optim_pool *p, void (*fn)(void *arg, int part, int nparts),
                        void *arg);

/* ---- the reduce of a synchronous step (reduce.c) ----------------------- */
/* dst[0..n) = (srcs[0][off..off+n) + ... + srcs[k-1][off..off+n)) / divisor,
 * added in that order (qr_optim_reduce on a range). dst may be srcs[0] + off
 * (in place) or a buffer that overlaps no source. */
void qr__optim_reduce_at(float *dst, const float *const *srcs, int k, int64_t off, int64_t n,
                         float divisor);

/* ---- duplicate indices (dedup.c) --------------------------------------- */
/* The distinct rows of a sparse gradient in first-occurrence order, each
 * with a pointer to its summed gradient row (into grad itself when the
 * index occurs once, into `sum` otherwise). */
typedef struct qr_optim_rows {
    int64_t n;
    int64_t *row;       /* [n] row indices */
    const float **grad; /* [n] gradient rows, dim floats each */
    float *sum;         /* summed rows of repeated indices */
} qr_optim_rows;
/* QR_EINVAL naming the first out-of-range index; QR_ENOMEM. */
int qr__optim_dedup(const int64_t *indices, const float *grad, int64_t nidx,
                    int64_t rows, int64_t dim, qr_optim_rows *out);
void qr__optim_rows_free(qr_optim_rows *r);

#endif /* QR_OPTIM_INTERNAL_H */

/*
 * train.h - the training loop a worker process runs: load the data, build
 * the model, declare its parameters, then pull / compute / push until the
 * step limit; the chief evaluates on the test split and stops the cluster.
 * And the single-process reference of synchronous training.
 *
 * This sits on top of the public API (qr_worker_*) and the models. It
 * prints nothing: it returns a qr_train_result and reports progress through
 * a callback; the CLI (tools/: `quorum worker`, `quorum train --local`)
 * parses the flags into qr_train_opts and prints what comes back.
 */
#ifndef QR_TRAIN_H
#define QR_TRAIN_H

#include "common/common.h"

#define QR_TRAIN_MAX_HIDDEN 8
#define QR_TRAIN_MAX_VAR_OPTS 16

/* Where a worker's training is, after a step (or at the end: final). */
typedef struct qr_train_progress {
    int64_t step;            /* the global step reached */
    int64_t total;           /* the global step training ends at */
    double loss;             /* moving average (0.95) of the minibatch loss */
    double examples_per_sec; /* since the first step (final: the run's figure) */
    double elapsed;          /* seconds since the first step started */
    bool final;              /* the report after the last step */
} qr_train_progress;

typedef void (*qr_train_progress_fn)(const qr_train_progress *p, void *ctx);

/* The strings are borrowed: the caller keeps them alive during a call. */
typedef struct qr_train_opts {
    const char *model;          /* "softmax" | "mlp" | "logreg" | "wide-deep" */
    int embedding_dim;          /* click models: the embedding tables' width */
    int hidden[QR_TRAIN_MAX_HIDDEN];
    int nhidden;
    const char *data;           /* "fashion-mnist" | "digits" | PATH */
    const char *data_dir;       /* NULL = default location */
    int batch_size;
    double epochs;              /* used when steps == 0 */
    int64_t steps;              /* global steps; 0 = from epochs */
    uint64_t seed;
    int slow_worker;            /* test option: this worker sleeps ... */
    int slow_ms;                /* ... this long every step (-1: none) */
    int accumulate;             /* async: batches summed into one push (>= 1) */
    int local_steps;            /* async: local SGD steps before a delta push (>= 1) */
    /* QR_FLOAT32 (0, the default), QR_BFLOAT16 or QR_FLOAT16: the wire
     * of every dense variable (qr_worker_set_dtype; the arrays stay
     * float32, converted at the worker boundary) */
    int wire_dtype;
    /* "NAME:key=value,...": a variable's own optimizer options */
    int nvar_opts;
    const char *var_opt[QR_TRAIN_MAX_VAR_OPTS];
    /* click models: the variables no var_opt names get the model's own
     * optimizer options (train_ctr.c; neither --optimizer nor --lr given) */
    bool model_optimizer;
    int virtual_workers;        /* workers simulated by qr_train_local */
    /* A worker's communication under its compute (train.c, "Overlap"):
     * 1 on, 0 off, 2 pipeline (async: the step's push and pull under the
     * next step's compute, pipeline.c), -1 (the default) pipeline or on
     * when this machine has a core to spare (qr__train_overlap_default).
     * Plain steps only. */
    int overlap;
    /* Called by qr_train_worker after every step and once at the end
     * (final), if set; the callback decides what to show and how often. */
    qr_train_progress_fn on_progress;
    void *progress_ctx;
    /* The chief writes TensorBoard event files and JSON lines here
     * (NULL: none), a point every summary_secs seconds and at the end. */
    const char *logdir;
    double summary_secs;
} qr_train_opts;

/* The defaults: mlp 256,128 on digits, batch 64, 1 epoch, seed 1. */
void qr_train_opts_default(qr_train_opts *o);

typedef struct qr_train_result {
    double test_accuracy, test_loss;
    double test_auc, test_logloss; /* click models (-1 otherwise) */
    double test_accuracy_averaged; /* with the moving averages; -1 if off */
    int64_t global_step;
    int64_t local_steps;
    int64_t stale_pushes;       /* this worker's pushes dropped as stale */
    int64_t lost_pushes;        /* pushes cut off by a lost ps (maybe applied, maybe not) */
    int64_t rollbacks;          /* times the cluster rolled back under it (a ps restarted) */
    char stats[4096];           /* the cluster statistics (JSON), from qr_worker_stats */
    double examples_per_sec;
    double wall_seconds;
    uint64_t params_digest;
    bool overlapped;            /* the steps overlapped communication with compute */
    bool pipelined;             /* ... as --overlap pipeline: a step under the next one */
} qr_train_result;

/* Run worker `task_index` of `cluster` to the end of training. The chief
 * (worker 0) fills res with the evaluation, the digest and the cluster's
 * statistics, then stops the cluster; the others fill the step counts. */
int qr_train_worker(const qr_cluster *cluster, int task_index, const qr_config *cfg,
                    const qr_train_opts *opts, qr_train_result *res);

/* The single-process reference of synchronous training: opts->virtual_workers
 * workers computed in turn, their gradients reduced in worker order and
 * applied with the same code the ps runs. With the same seed, a cluster
 * run with R = N and init-tokens 0 ends with bit-identical parameters. */
int qr_train_local(const qr_config *cfg, const qr_train_opts *opts, qr_train_result *res);

#endif

/*
 * train.h - the training loop a worker process runs: load the data, build
 * the model, declare its parameters, then pull / compute / push until the
 * step limit; the chief evaluates on the test split and stops the cluster.
 *
 * This sits on top of the public API (qr_worker_*) and the models; the CLI
 * (`quorum worker`, `quorum launch`) is its only caller.
 */
#ifndef QR_TRAIN_H
#define QR_TRAIN_H

#include "common/common.h"

#define QR_TRAIN_MAX_HIDDEN 8

typedef struct qr_train_opts {
    char model[16];             /* "softmax" | "mlp" */
    int hidden[QR_TRAIN_MAX_HIDDEN];
    int nhidden;
    char data[512];             /* "fashion-mnist" | "digits" | PATH */
    char data_dir[512];         /* "" = default location */
    int batch_size;
    double epochs;              /* used when steps == 0 */
    int64_t steps;              /* global steps; 0 = from epochs */
    uint64_t seed;
    bool json;                  /* print the JSON summary line on stdout */
    bool quiet;                 /* no progress line */
    int slow_worker;            /* test option: this worker sleeps ... */
    int slow_ms;                /* ... this long every step (-1: none) */
    int accumulate;             /* async: batches summed into one push (>= 1) */
    int local_steps;            /* async: local SGD steps before a delta push (>= 1) */
    /* --var-opt NAME:key=value,... : a variable's own optimizer options */
    int nvar_opts;
    char var_opt_name[16][128];
    char var_opt[16][512];
    bool local;                 /* quorum train --local */
    int virtual_workers;        /* workers simulated by --local */
} qr_train_opts;

void qr_train_opts_default(qr_train_opts *o);
/* Apply a training option ("model", "hidden", "batch-size", ...).
 * Returns QR_ENOTFOUND for a key that is not a training option. */
int qr_train_opts_set(qr_train_opts *o, const char *key, const char *value);
/* Help lines for the training options. */
const char *qr_train_opts_help(void);

typedef struct qr_train_result {
    double test_accuracy, test_loss;
    double test_accuracy_averaged; /* with the moving averages; -1 if off */
    int64_t global_step;
    int64_t local_steps;
    int64_t stale_pushes;       /* this worker's pushes dropped as stale */
    char stats[4096];           /* the cluster statistics (JSON), from qr_worker_stats */
    double examples_per_sec;
    double wall_seconds;
    uint64_t params_digest;
} qr_train_result;

/* Run worker `task_index` of `cluster` to the end of training. The chief
 * (worker 0) fills res with the evaluation and prints the summary. */
int qr_train_worker(const qr_cluster *cluster, int task_index, const qr_config *cfg,
                    const qr_train_opts *opts, qr_train_result *res);

/* The single-process reference of synchronous training: opts->virtual_workers
 * workers computed in turn, their gradients reduced in worker order and
 * applied with the same code the ps runs. With the same seed, a cluster
 * run with R = N and init-tokens 0 ends with bit-identical parameters. */
int qr_train_local(const qr_config *cfg, const qr_train_opts *opts, qr_train_result *res);

#endif

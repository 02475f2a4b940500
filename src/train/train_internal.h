/*
 * train_internal.h - what the two training loops share. The folder:
 *   train.c          a worker's loop for the dense models (softmax, MLP),
 *                    one function per step strategy; qr_train_local
 *   train_ctr.c      a worker's loop for the click models (logreg, wide &
 *                    deep) over embedding tables
 *   train_common.c   what both loops do the same way: the run's steps,
 *                    the seeds, --var-opt, the outcome of a push, progress,
 *                    the figures at the end of the steps; the --overlap
 *                    default
 *   pipeline.c       --overlap pipeline: an async step's push and pull on a
 *                    thread of its own, under the next step's compute
 *   summaries.c      the chief's summary service (--logdir)
 *   worker_metrics.c a worker's Prometheus endpoint (--metrics-port)
 *   monitor.c        both of them for a program's own training loop
 *                    (qr_monitor_*, include/quorum.h; quorum.torch)
 * A cluster trained by either loop and qr_train_local draw the same seeds
 * and batches from here, which is what keeps their digests comparable.
 */
#ifndef QR_TRAIN_INTERNAL_H
#define QR_TRAIN_INTERNAL_H

#include "train/train.h"

#include <pthread.h>

/* train_ctr.c: the click models' loop, which qr_train_worker hands them to. */
bool qr__train_is_ctr(const char *model);
int qr__train_ctr_worker(const qr_cluster *cluster, int task_index, const qr_config *cfg,
                         const qr_train_opts *opts, qr_train_result *res);

/* Global steps of the run: --steps, or --epochs over the training set; a
 * synchronous step consumes R batches, an asynchronous one a single batch. */
int64_t qr__train_total_steps(const qr_train_opts *o, int64_t ntrain, int batches_per_step);
/* R: --replicas-to-aggregate, or every worker. */
int qr__train_sync_replicas(const qr_config *cfg, int nworkers);

/* Variable i's initializer seed: the same in every worker and in --local. */
uint64_t qr__train_param_seed(const qr_train_opts *o, int i);
/* Worker w's minibatch generator. */
void qr__train_worker_rng(qr_rng *rng, const qr_train_opts *o, int w);
/* Resume a data stream: draw what `batches` minibatches of `batch`
 * examples out of n would have drawn, without copying them. */
void qr__train_skip_batches(qr_rng *rng, int batch, int64_t n, uint64_t batches);

/* Whether a worker overlaps its communication with its compute by
 * default (--overlap auto; quorum.torch's overlap=None follows the same
 * rule): when the cores this process may run on (sched_getaffinity)
 * outnumber what the cluster's tasks on this machine use: each local
 * worker its compute threads (compute_threads, this worker's count), each
 * local ps one. A task is local when its address is a Unix socket or a
 * loopback one; this worker always is. Overlap trades waiting for more,
 * smaller requests, which only pays when the ps tasks and the kernel's
 * network work have a core of their own beside the backward pass. The
 * counts go to *cores and *needed (may be NULL). */
bool qr__train_overlap_default(const qr_cluster *cluster, int compute_threads, int *cores,
                               int *needed);

/* --overlap pipeline (pipeline.c): the step in flight on its thread and
 * the back halves of the double-buffered parameters and gradients. The
 * worker's handle is the thread's between start and finish. */
typedef struct qr__pipeline {
    qr_worker *w;
    int n;
    const int *ids;
    float **params_back, **grads_back; /* the sets the thread pulls into and sends */
    float **owned;                     /* what init allocated, to free whatever was swapped */
    float **grads_given;               /* the caller's gradient buffers, given back at the end */
    pthread_t thread;
    bool running;
    unsigned flags;
    int rc;                            /* the thread's push_pull status, its message: */
    char error[512];
    int64_t global;
    double seconds;                    /* how long its push_pull took (the metrics') */
} qr__pipeline;

/* Back sets for n variables of these sizes. QR_OK or QR_ENOMEM (then
 * qr__pipeline_free what was made). */
int qr__pipeline_init(qr__pipeline *p, qr_worker *w, int n, const int *ids,
                      const int64_t *sizes, float **grads);
/* Push grads (swapped with the back set first: the caller's pointers then
 * name the free set) and pull into the back parameters, on the thread. */
int qr__pipeline_start(qr__pipeline *p, float **grads, unsigned flags);
/* Wait for the step in flight, if any: its values become the front set
 * (params swapped with the back one) and *global its global step; its
 * failure, with the thread's message, otherwise (params unchanged). */
int qr__pipeline_finish(qr__pipeline *p, float **params, int64_t *global);
/* Wait for a step still in flight (its outcome dropped) and give the
 * caller's own gradient buffers back to grads (they may be swapped). */
void qr__pipeline_end(qr__pipeline *p, float **grads);
/* Wait for a step still in flight and free the back sets. */
void qr__pipeline_free(qr__pipeline *p);

/* Whether a --var-opt spec ("NAME:key=value,...") names the variable. */
bool qr__train_var_opt_names(const char *spec, const char *name);
/* The options of the last --var-opt naming the variable, or "". */
const char *qr__train_var_opts_of(const qr_train_opts *o, const char *name);

/* The moving average (0.95) of the minibatch loss; NAN before the first. */
double qr__train_smooth_loss(double avg, double loss);
/* The test option --slow-worker: this worker sleeps before its push. */
void qr__train_slow_down(const qr_train_opts *o, int task_index);
/* After a push that returned push_rc: count it and move to the next step,
 * the token's (sync) or the global step ps 0 answered (async). A stale or
 * lost push is counted and training goes on. */
int qr__train_after_push(qr_worker *w, int push_rc, bool sync, int64_t global, int64_t *step,
                         qr_train_result *res);
/* Call o->on_progress, if set, with where the run is. */
void qr__train_report(const qr_train_opts *o, int64_t step, int64_t total, double loss,
                      double start, bool final, double examples_per_sec);
/* A worker's steps ended with rc: a worker other than the chief that
 * did them all waits for the run's end (qr__worker_wait_end), so that its
 * exit says whether the chief evaluated the model; the chief, and a
 * failure, return rc as it is. */
int qr__train_wait_end(qr_worker *w, bool chief, int rc);
/* A worker's steps ended with rc (at the step `step` of `total`, each of
 * `batches` batches, since `start`): a stop is not an error for a worker
 * other than the chief (the chief ended the run); the run's figures into
 * res, and the final progress report. Returns rc, or QR_OK for that stop. */
int qr__train_steps_ended(const qr_train_opts *o, int rc, bool chief, int64_t step,
                          int64_t total, int batches, double loss, double start,
                          qr_train_result *res);

#endif

/*
 * train_common.c - what the dense loop (train.c) and the click models'
 * loop (train_ctr.c) do the same way (train_internal.h): how many steps a
 * run has, the seeds of variables and batches, a variable's --var-opt, what
 * follows a push, the progress report and the figures at the end of the
 * steps; and whether a worker overlaps its communication by default. One copy, so the two loops cannot drift apart in what a seeded
 * run draws or counts.
 */
#include "train/train_internal.h"

#include "cluster/cluster.h"
#include "common/addr.h"
#include "common/config.h"
#include "worker/worker.h"

#include <math.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int64_t qr__train_total_steps(const qr_train_opts *o, int64_t ntrain, int batches_per_step) {
    if (o->steps) return o->steps;
    double per_step = (double)o->batch_size * batches_per_step;
    return QR_MAX(1, (int64_t)ceil(o->epochs * (double)ntrain / per_step));
}

int qr__train_sync_replicas(const qr_config *cfg, int nworkers) {
    int64_t r = qr__config_int(cfg, "replicas-to-aggregate");
    return r > 0 ? (int)r : nworkers;
}

uint64_t qr__train_param_seed(const qr_train_opts *o, int i) {
    return o->seed * 1000003u + (uint64_t)i;
}

void qr__train_worker_rng(qr_rng *rng, const qr_train_opts *o, int w) {
    qr_rng_seed(rng, o->seed * 7919u + (uint64_t)w);
}

void qr__train_skip_batches(qr_rng *rng, int batch, int64_t n, uint64_t batches) {
    for (uint64_t i = 0; i < batches; i++)
        for (int b = 0; b < batch; b++) qr_rng_below(rng, (uint64_t)n);
}

/* Whether address s is on this machine: a Unix socket, or loopback TCP. */
static bool local_address(const char *s) {
    qr_addr a;
    return !qr_addr_parse(s, &a) && (a.kind == QR_ADDR_UNIX || a.loopback);
}

bool qr__train_overlap_default(const qr_cluster *cluster, int compute_threads, int *cores,
                               int *needed) {
    int workers = 0, ps = 0;
    bool self = cluster->task_index >= 0 && !strcmp(cluster->job, "worker");
    for (int i = 0; i < cluster->nworkers; i++)
        workers += local_address(cluster->workers[i]) || (self && i == cluster->task_index);
    for (int i = 0; i < cluster->nps; i++) ps += local_address(cluster->ps[i]);
    int use = QR_MAX(workers, 1) * QR_MAX(compute_threads, 1) + ps;
    cpu_set_t set;
    int have = sched_getaffinity(0, sizeof set, &set) ? (int)sysconf(_SC_NPROCESSORS_ONLN)
                                                      : CPU_COUNT(&set);
    if (cores) *cores = have;
    if (needed) *needed = use;
    return have > use;
}

bool qr__train_var_opt_names(const char *spec, const char *name) {
    const char *colon = strchr(spec, ':');
    size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
    return strlen(name) == len && !strncmp(spec, name, len);
}

const char *qr__train_var_opts_of(const qr_train_opts *o, const char *name) {
    const char *opts = "";
    for (int k = 0; k < o->nvar_opts; k++) {
        if (!qr__train_var_opt_names(o->var_opt[k], name)) continue;
        const char *colon = strchr(o->var_opt[k], ':');
        opts = colon ? colon + 1 : "";
    }
    return opts;
}

double qr__train_smooth_loss(double avg, double loss) {
    return isnan(avg) ? loss : 0.95 * avg + 0.05 * loss;
}

void qr__train_slow_down(const qr_train_opts *o, int task_index) {
    if (o->slow_worker != task_index || o->slow_ms <= 0) return;
    struct timespec ts = {o->slow_ms / 1000, (long)(o->slow_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int qr__train_after_push(qr_worker *w, int push_rc, bool sync, int64_t global, int64_t *step,
                         qr_train_result *res) {
    int rc = push_rc;
    if (rc == QR_ESTALE) {
        /* Too late for its step (a backup worker, or TensorFlow's wasted
         * round); it still takes a token and goes on. */
        res->stale_pushes++;
        rc = QR_OK;
    } else if (rc == QR_EPEERLOST) {
        /* A ps died under the push: it is not repeated (it may have been
         * applied). The next call waits for that ps to come back: the
         * cluster then rolls back, or the wait ends the run. */
        qr__log(QR_LOG_WARN, "push of step %lld lost: %s", (long long)*step, qr_last_error());
        res->lost_pushes++;
        rc = QR_OK;
    }
    if (rc) return rc;
    res->local_steps++;
    if (sync) return qr_worker_take_token(w, step);
    *step = global;
    return QR_OK;
}

void qr__train_report(const qr_train_opts *o, int64_t step, int64_t total, double loss,
                      double start, bool final, double examples_per_sec) {
    if (!o->on_progress) return;
    double elapsed = qr__now_sec() - start;
    qr_train_progress p = {
        .step = step,
        .total = total,
        .loss = loss,
        .examples_per_sec = final ? examples_per_sec : (double)step * o->batch_size / elapsed,
        .elapsed = elapsed,
        .final = final,
    };
    o->on_progress(&p, o->progress_ctx);
}

int qr__train_wait_end(qr_worker *w, bool chief, int rc) {
    return rc || chief ? rc : qr__worker_wait_end(w);
}

int qr__train_steps_ended(const qr_train_opts *o, int rc, bool chief, int64_t step,
                          int64_t total, int batches, double loss, double start,
                          qr_train_result *res) {
    if (rc == QR_ESTOPPED && !chief) rc = QR_OK;
    res->wall_seconds = qr__now_sec() - start;
    res->global_step = step;
    res->examples_per_sec = (double)step * o->batch_size * batches / res->wall_seconds;
    if (!rc) qr__train_report(o, step, total, loss, start, true, res->examples_per_sec);
    return rc;
}

/*
 * train.c - the worker training loop (see train.h).
 *
 * Every step a worker pulls every parameter, samples a minibatch with its
 * own seeded generator (seed * 7919 + worker index), computes the mean
 * gradient and pushes it.
 *   async: the push to ps 0 advances the global step; training ends when
 *          it reaches the limit or a ps answers "stopped" (the chief ended
 *          the run).
 *   sync:  the push is tagged with the worker's local step; then the worker
 *          takes a token (the barrier) and its step from it; training ends
 *          at the token that carries the last step. A plain step does push,
 *          token and pull in one round trip per ps (qr_worker_push_pull);
 *          accumulation keeps the three.
 * What a step computes is one of three strategies: plain (one batch),
 * accumulate (k batches summed) and local SGD (k steps on a local copy,
 * then the delta). qr_train_local is the single-process reference of sync
 * training.
 *
 * Overlap (--overlap; by default when the machine has a core to spare,
 * qr__train_overlap_default): a plain step's communication runs under its
 * compute, through the model's layer hooks and the non-blocking calls.
 *   async: each layer's gradient is pushed, with its new values asked
 *          back in the same request, as soon as backward has it (the last
 *          layer first, as DDP's buckets); the first layer's push carries
 *          the step to every ps (QR_PUSH_EVERY_PS: each ps counts the step
 *          once, so every apply uses the step number one push would). The
 *          next batch is drawn before those replies are waited for, and
 *          layer l's forward waits only for layer l's.
 *   sync:  the step's push is committed whole (qr_worker_push); after the
 *          token, each layer's values are pulled apart (qr_worker_pull_start,
 *          first layer first), and the next batch is drawn and layer l's
 *          forward waits only for layer l's. The values are the same, so
 *          the digests are.
 */
#include "train/train_internal.h"
#include "train/summaries.h"
#include "train/worker_metrics.h"

#include "common/config.h"
#include "data/data.h"
#include "model/model.h"
#include "optim/optim.h"
#include "common/init.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void qr_train_opts_default(qr_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->model = "mlp";
    o->hidden[0] = 256;
    o->hidden[1] = 128;
    o->nhidden = 2;
    o->data = "digits";
    o->batch_size = 64;
    o->epochs = 1;
    o->seed = 1;
    o->slow_worker = -1;
    o->slow_ms = 0;
    o->virtual_workers = 1;
    o->summary_secs = 120; /* TensorFlow's summary service */
    o->accumulate = 1;
    o->local_steps = 1;
    o->embedding_dim = 8;
    o->overlap = -1;
}

/* Hash of every variable's bytes in id order: two runs that end with the
 * same parameters have the same digest. */
static uint64_t params_digest(float *const *params, const int64_t *sizes, int np) {
    uint64_t h = QR_FNV_INIT;
    for (int i = 0; i < np; i++) h = qr__fnv1a(params[i], (size_t)sizes[i] * 4, h);
    return h;
}

/* What every way of training shares: the data, the model, the batch. */
typedef struct trainer {
    qr_dataset train, test;
    qr_model *model;
    int nparams;
    float *bx;
    int32_t *by;
    uint64_t drawn; /* minibatches sampled so far: the worker's data position */
} trainer;

static void trainer_free(trainer *t) {
    qr_model_free(t->model);
    qr_dataset_free(&t->train);
    qr_dataset_free(&t->test);
    free(t->bx);
    free(t->by);
}

static int trainer_setup(trainer *t, const qr_train_opts *o) {
    int rc = qr_data_load(o->data, o->data_dir && o->data_dir[0] ? o->data_dir : NULL, &t->train,
                          &t->test);
    if (rc) return rc;
    if (t->train.n < 1) return qr__fail(QR_EINVAL, "the training set '%s' is empty", o->data);
    rc = qr_model_create(&t->model, o->model, t->train.dim, o->hidden, o->nhidden,
                         t->train.nclasses, o->batch_size);
    if (rc) return rc;
    t->nparams = qr_model_num_params(t->model);
    t->bx = qr__calloc((size_t)o->batch_size * (size_t)t->train.dim, sizeof *t->bx);
    t->by = qr__calloc((size_t)o->batch_size, sizeof *t->by);
    return t->bx && t->by ? QR_OK : QR_ENOMEM;
}

static void sample_batch(trainer *t, qr_rng *rng, int batch) {
    int64_t dim = t->train.dim;
    t->drawn++;
    for (int b = 0; b < batch; b++) {
        int64_t k = (int64_t)qr_rng_below(rng, (uint64_t)t->train.n);
        memcpy(t->bx + (size_t)b * (size_t)dim, t->train.x + (size_t)k * (size_t)dim,
               (size_t)dim * sizeof(float));
        t->by[b] = t->train.y[k];
    }
}

/* One minibatch from rng and the mean loss and gradients at params. */
static int batch_grad(trainer *t, qr_rng *rng, int batch, float **params, float **grads,
                      double *loss) {
    sample_batch(t, rng, batch);
    return qr_model_loss_grad(t->model, (const float *const *)params, grads, t->bx, t->by, batch,
                              loss);
}

/* ---- one worker's run ------------------------------------------------- */

typedef struct worker_run {
    trainer t;
    const qr_train_opts *o;
    qr_worker *w;
    int task_index;
    bool chief, sync;
    int *ids;
    int64_t *sizes;     /* elements of each parameter */
    float **params;     /* the worker's copies, refreshed by every pull */
    float **grads;      /* what the step pushes: gradients, or the delta */
    float **extra;      /* gradient sums (accumulate) or the pulled weights (local SGD) */
    qr_rng rng;
    int batches;        /* batches one global step consumes */
    int64_t step, total;
    bool values_due;    /* the next step must pull first (one-trip sync) */
    double loss_avg;
    train_summaries summaries; /* the chief's, with --logdir */
    worker_metrics metrics;    /* with --metrics-port */
    /* local SGD: the ps's learning rate and schedule */
    double local_lr, decay_rate;
    int64_t decay_steps;
    bool decay_staircase;
    /* overlap: per layer, its request in flight (NULL: none) */
    bool overlap;
    bool pipelined;     /* --overlap pipeline (pipeline.c) */
    qr__pipeline pipe;
    int nlayers;
    qr_request **layer_req;
    qr_train_result *res;
} worker_run;

/* A step strategy: compute what the step pushes into r->grads. */
typedef int (*step_fn)(worker_run *r, double *loss, unsigned *flags);

static int step_plain(worker_run *r, double *loss, unsigned *flags) {
    return batch_grad(&r->t, &r->rng, r->o->batch_size, r->params, r->grads, loss);
}

/* Accumulation: k batches' gradients at the pulled weights, summed, pushed
 * once; the ps applies the sum. */
static int step_accumulate(worker_run *r, double *loss, unsigned *flags) {
    int rc = QR_OK;
    for (int k = 0; !rc && k < r->o->accumulate; k++) {
        rc = batch_grad(&r->t, &r->rng, r->o->batch_size, r->params, r->grads, loss);
        for (int i = 0; !rc && i < r->t.nparams; i++) {
            float *sum = r->extra[i];
            const float *g = r->grads[i];
            for (int64_t e = 0; e < r->sizes[i]; e++) sum[e] = k ? sum[e] + g[e] : g[e];
        }
    }
    for (int i = 0; !rc && i < r->t.nparams; i++)
        memcpy(r->grads[i], r->extra[i], (size_t)r->sizes[i] * sizeof(float));
    return rc;
}

/* Local SGD: k plain steps on the worker's copy, then push the delta
 * w_local - w_pulled; the ps adds it to its weights. */
static int step_local_sgd(worker_run *r, double *loss, unsigned *flags) {
    int rc = QR_OK;
    for (int i = 0; i < r->t.nparams; i++)
        memcpy(r->extra[i], r->params[i], (size_t)r->sizes[i] * sizeof(float));
    /* The ps's learning-rate schedule, at the global step: the ps adds
     * deltas as they come, so the decay happens here. */
    float lr = qr_optim_decayed_lr((float)r->local_lr, r->step, r->decay_rate, r->decay_steps,
                                   r->decay_staircase);
    for (int k = 0; !rc && k < r->o->local_steps; k++) {
        rc = batch_grad(&r->t, &r->rng, r->o->batch_size, r->params, r->grads, loss);
        for (int i = 0; !rc && i < r->t.nparams; i++)
            qr_optim_sgd_step(r->params[i], r->grads[i], r->sizes[i], lr);
    }
    for (int i = 0; !rc && i < r->t.nparams; i++)
        qr_optim_delta(r->grads[i], r->params[i], r->extra[i], r->sizes[i]);
    *flags |= QR_PUSH_DELTA;
    return rc;
}

static step_fn pick_strategy(const qr_train_opts *o) {
    if (o->local_steps > 1) return step_local_sgd;
    if (o->accumulate > 1) return step_accumulate;
    return step_plain;
}

/* Push what the step computed and move to the next step. */
static int push_and_advance(worker_run *r, unsigned flags, qr_train_result *res) {
    qr__train_slow_down(r->o, r->task_index);
    int64_t global = 0;
    qr_worker_set_data_position(r->w, r->t.drawn);
    double t0 = qr__now_sec();
    int rc = qr_worker_push(r->w, r->t.nparams, r->ids, (const float *const *)r->grads, flags,
                            &global);
    qr__worker_metrics_call(&r->metrics, true, qr__now_sec() - t0);
    return qr__train_after_push(r->w, rc, r->sync, global, &r->step, res);
}

/* Sync without overlap, one round trip per ps (docs/SYNC.md, "One round
 * trip"): the push's answers come after the step with its values, into the
 * worker's copies, and ps 0's with the token, whose step is the worker's
 * next local step. A stale push is answered with the values and a token
 * too (QR_ESTALE after both), so the next step starts from them as after
 * TOKEN and PULL. */
static int push_pull_and_advance(worker_run *r, unsigned flags, qr_train_result *res) {
    qr__train_slow_down(r->o, r->task_index);
    int64_t token = 0;
    qr_worker_set_data_position(r->w, r->t.drawn);
    double t0 = qr__now_sec();
    int rc = qr_worker_push_pull(r->w, r->t.nparams, r->ids, (const float *const *)r->grads,
                                 NULL, flags, &token);
    qr__worker_metrics_call(&r->metrics, true, qr__now_sec() - t0);
    if (rc == QR_ESTALE) {
        res->stale_pushes++;
        res->local_steps++;
        return qr_worker_local_step(r->w, &r->step);
    }
    if (rc == QR_EPEERLOST) {
        /* As a lost push (qr__train_after_push): the next pull waits for the
         * ps to come back, and the cluster rolls back or the wait ends. */
        qr__log(QR_LOG_WARN, "push of step %lld lost: %s", (long long)r->step, qr_last_error());
        res->lost_pushes++;
        res->local_steps++;
        r->values_due = true;
        return QR_OK;
    }
    if (rc) return rc;
    res->local_steps++;
    r->step = token;
    return QR_OK;
}

/* ---- overlap: a step's communication under its compute ---------------- */

/* Layer l's request waited for. A push lost with its ps is counted and
 * training goes on, as qr__train_after_push does for a whole push. */
static int wait_layer(worker_run *r, int l, int64_t *global) {
    qr_request *req = r->layer_req[l];
    if (!req) return QR_OK;
    r->layer_req[l] = NULL;
    double t0 = qr__now_sec();
    int rc = qr_request_wait(req, global);
    qr__worker_metrics_call(&r->metrics, !r->sync, qr__now_sec() - t0);
    if (rc == QR_EPEERLOST && !r->sync) {
        qr__log(QR_LOG_WARN, "push of layer %d lost: %s", l, qr_last_error());
        r->res->lost_pushes++;
        rc = QR_OK;
    }
    return rc;
}

/* Every request still in flight waited for (each must be, before the
 * worker goes); returns the first failure. */
static int wait_layers(worker_run *r) {
    int rc = QR_OK;
    for (int l = 0; l < r->nlayers; l++) {
        int lrc = wait_layer(r, l, NULL);
        if (!rc) rc = lrc;
    }
    return rc;
}

/* The model's hook: layer l's values are in before its forward reads them. */
static int layer_values_in(void *ctx, int l) {
    return wait_layer(ctx, l, NULL);
}

/* The model's hook (async): layer l's gradients go out as backward has
 * them, its new values coming back into the worker's copies. The first
 * layer's push, the step's last, carries the step to every ps. */
static int layer_grads_out(void *ctx, int l) {
    worker_run *r = ctx;
    unsigned flags = l == 0 ? QR_PUSH_STEP | QR_PUSH_EVERY_PS : 0;
    return qr_worker_push_pull_start(r->w, 2, &r->ids[2 * l],
                                     (const float *const *)&r->grads[2 * l], NULL, flags,
                                     &r->layer_req[l]);
}

/* Sync: the step's values pulled a layer at a time, the first layer first. */
static int start_layer_pulls(worker_run *r) {
    int rc = qr_worker_wait_bound(r->w);
    for (int l = 0; !rc && l < r->nlayers; l++)
        rc = qr_worker_pull_start(r->w, 2, &r->ids[2 * l], NULL, &r->layer_req[l]);
    return rc;
}

/* One overlapped step: draw the batch (under the last step's requests),
 * then the forward (each layer waiting for its values) and the backward
 * (async: pushing each layer's gradients as it goes). Async: the step
 * ends once the first layer's push is answered, with the global step;
 * sync: with the whole push and the token, then the next step's pulls. */
static int overlapped_step(worker_run *r, double *loss) {
    sample_batch(&r->t, &r->rng, r->o->batch_size);
    int64_t global = r->step;
    int rc = QR_OK;
    if (!r->sync && r->layer_req[0]) {
        /* The last step's first-layer push carries its global step: only
         * now is it known whether that step was the run's last. */
        rc = wait_layer(r, 0, &global);
        rc = qr__train_after_push(r->w, rc, false, global, &r->step, r->res);
        if (rc || r->step >= r->total) return rc;
        rc = qr_worker_wait_bound(r->w);
        if (rc) return rc;
    }
    if (!r->sync) qr__train_slow_down(r->o, r->task_index);
    qr_worker_set_data_position(r->w, r->t.drawn); /* rides on this step's pushes */
    qr_model_hooks hooks = {.before_forward = layer_values_in,
                            .after_backward = r->sync ? NULL : layer_grads_out, .ctx = r};
    rc = qr_model_loss_grad_hooked(r->t.model, (const float *const *)r->params, r->grads,
                                   r->t.bx, r->t.by, r->o->batch_size, loss, &hooks);
    if (rc || !r->sync) return rc;
    rc = push_and_advance(r, QR_PUSH_STEP, r->res);
    if (!rc && r->step < r->total) rc = start_layer_pulls(r);
    return rc;
}

/* The first step's values, whole: nothing is in flight yet. */
static int first_values(worker_run *r) {
    int rc = qr_worker_wait_bound(r->w);
    if (!rc) rc = qr_worker_pull(r->w, 0, NULL, NULL);
    return rc;
}

/* Declare the model's parameters (every worker declares the same seeds;
 * only the chief's are used) and allocate their gradients. */
static int declare_params(worker_run *r) {
    int np = r->t.nparams;
    r->ids = qr__calloc((size_t)np, sizeof *r->ids);
    r->sizes = qr__calloc((size_t)np, sizeof *r->sizes);
    r->params = qr__calloc((size_t)np, sizeof *r->params);
    r->grads = qr__calloc((size_t)np, sizeof *r->grads);
    if (!r->ids || !r->sizes || !r->params || !r->grads) return QR_ENOMEM;
    for (int i = 0; i < np; i++) {
        const char *name, *init;
        int ndim;
        int64_t shape[2];
        qr_model_param_info(r->t.model, i, &name, &ndim, shape, &init);
        int rc = qr_worker_declare_opts(r->w, name, ndim, shape, init,
                                        qr__train_param_seed(r->o, i),
                                        qr__train_var_opts_of(r->o, name), &r->ids[i]);
        if (!rc && r->o->wire_dtype != QR_FLOAT32)
            rc = qr_worker_set_dtype(r->w, r->ids[i], r->o->wire_dtype, QR_FLOAT32);
        if (rc) return rc;
        r->sizes[i] = qr_worker_var_size(r->w, r->ids[i]);
        r->grads[i] = qr__aligned_alloc((size_t)r->sizes[i] * sizeof(float));
        if (!r->grads[i]) return QR_ENOMEM;
    }
    return QR_OK;
}

/* Every --var-opt must name a variable of the model. */
static int check_var_opts(const worker_run *r) {
    for (int k = 0; k < r->o->nvar_opts; k++) {
        bool found = false;
        for (int i = 0; i < r->t.nparams; i++) {
            const char *name, *init;
            int ndim;
            int64_t shape[2];
            qr_model_param_info(r->t.model, i, &name, &ndim, shape, &init);
            found |= qr__train_var_opt_names(r->o->var_opt[k], name);
        }
        if (!found) {
            const char *spec = r->o->var_opt[k], *colon = strchr(spec, ':');
            return qr__fail(QR_EINVAL, "--var-opt: the model has no variable '%.*s' (it has "
                            "layer0/weights, layer0/bias, layer1/weights, ...)",
                            (int)(colon ? colon - spec : (ptrdiff_t)strlen(spec)), spec);
        }
    }
    return QR_OK;
}

/* The second set of buffers of accumulate and local SGD. */
static int alloc_extra(worker_run *r) {
    if (r->o->accumulate <= 1 && r->o->local_steps <= 1) return QR_OK;
    r->extra = qr__calloc((size_t)r->t.nparams, sizeof *r->extra);
    if (!r->extra) return QR_ENOMEM;
    for (int i = 0; i < r->t.nparams; i++) {
        r->extra[i] = qr__aligned_alloc((size_t)r->sizes[i] * sizeof(float));
        if (!r->extra[i]) return QR_ENOMEM;
    }
    return QR_OK;
}

static void read_local_lr(worker_run *r, const qr_config *cfg) {
    r->local_lr = qr__config_is_set(cfg, "lr") ? qr__config_float(cfg, "lr") : 0.05;
    r->decay_rate = qr__config_float(cfg, "lr-decay-rate");
    r->decay_steps = qr__config_int(cfg, "lr-decay-steps");
    r->decay_staircase = qr__config_bool(cfg, "lr-decay-staircase");
}

/* Everything before the first step: data, model, worker, variables
 * (initialized by the chief, waited for by the others). */
/* --overlap: on, off, pipeline, or (auto) when this machine has a core to
 * spare (qr__train_overlap_default): pipeline for async runs of several
 * workers (a one-worker async run steps as --local does, which the
 * pipeline's extra step of staleness would change; several workers' push
 * order varies from run to run anyway), on otherwise; plain steps only. */
static int choose_overlap(worker_run *r, const qr_cluster *cluster) {
    const qr_train_opts *o = r->o;
    bool plain = o->accumulate <= 1 && o->local_steps <= 1;
    if (o->overlap >= 1 && !plain)
        return qr__fail(QR_EINVAL, "--overlap %s: a step of several batches (--accumulate, "
                        "--local-steps) pushes once at its end; use --overlap off or auto",
                        o->overlap == 2 ? "pipeline" : "on");
    if (o->overlap == 2 && r->sync)
        return qr__fail(QR_EINVAL, "--overlap pipeline is for --mode async: a sync step's "
                        "values exist only after its quorum (--overlap on pulls them under the "
                        "next batch)");
    int cores = 0, needed = 0;
    bool spare = qr__train_overlap_default(cluster, openblas_get_num_threads(), &cores, &needed);
    r->pipelined = o->overlap == 2 || (o->overlap < 0 && spare && plain && !r->sync &&
                                       qr_cluster_num_workers(cluster) > 1);
    r->overlap = !r->pipelined && plain && (o->overlap < 0 ? spare : o->overlap == 1);
    if (r->chief && o->overlap < 0)
        qr__log(QR_LOG_INFO, "overlap %s: %d cores for this machine's tasks, which use %d "
                "(--overlap on|off|pipeline to choose)",
                r->pipelined ? "pipeline" : r->overlap ? "on" : "off", cores, needed);
    r->nlayers = qr_model_num_layers(r->t.model);
    r->layer_req = qr__calloc((size_t)QR_MAX(r->nlayers, 1), sizeof *r->layer_req);
    return r->layer_req ? QR_OK : QR_ENOMEM;
}

static int run_setup(worker_run *r, const qr_cluster *cluster, const qr_config *cfg) {
    int rc = qr__config_check_mode(cfg);
    if (!rc) rc = trainer_setup(&r->t, r->o);
    if (!rc) rc = qr_worker_create(&r->w, cluster, r->task_index, cfg);
    if (!rc) rc = declare_params(r);
    if (!rc && r->sync && (r->o->accumulate > 1 || r->o->local_steps > 1))
        rc = qr__fail(QR_EINVAL, "--accumulate and --local-steps are for --mode async");
    r->batches = r->sync ? qr__train_sync_replicas(cfg, qr_cluster_num_workers(cluster))
                         : r->o->accumulate * r->o->local_steps;
    r->total = qr__train_total_steps(r->o, r->t.train.n, r->batches);
    if (!rc) rc = check_var_opts(r);
    if (!rc) rc = alloc_extra(r);
    if (!rc) rc = choose_overlap(r, cluster);
    read_local_lr(r, cfg);
    if (!rc && r->chief) rc = qr_worker_set_step_limit(r->w, r->total);
    if (!rc) rc = qr_worker_initialize(r->w);
    for (int i = 0; !rc && i < r->t.nparams; i++) r->params[i] = qr_worker_var_data(r->w, r->ids[i]);
    qr__train_worker_rng(&r->rng, r->o, r->task_index);
    /* A cluster resumed from a checkpoint: this worker's data stream goes
     * on after the last batch whose push the checkpoint holds. */
    uint64_t position = 0;
    if (!rc) rc = qr_worker_data_position(r->w, &position);
    if (!rc) {
        qr__train_skip_batches(&r->rng, r->o->batch_size, r->t.train.n, position);
        r->t.drawn += position;
    }
    if (!rc && r->sync) rc = qr_worker_local_step(r->w, &r->step);
    return rc;
}

/* The chief's end of the run: evaluate the final (and the averaged)
 * weights, collect the cluster's statistics, stop the cluster. */
static int chief_finish(worker_run *r, const qr_config *cfg, qr_train_result *res) {
    int rc = qr_worker_pull(r->w, 0, NULL, NULL);
    if (!rc)
        rc = qr_model_evaluate(r->t.model, (const float *const *)r->params, &r->t.test,
                               &res->test_accuracy, &res->test_loss);
    res->params_digest = params_digest(r->params, r->sizes, r->t.nparams);
    res->test_accuracy_averaged = -1;
    if (!rc && qr__config_float(cfg, "moving-average-decay") > 0 &&
        !qr__config_str(cfg, "moving-average-vars")[0]) {
        /* Evaluate the averaged weights too (the copies are refreshed from
         * the ps by any later pull). */
        double loss;
        rc = qr_worker_pull_averages(r->w, 0, NULL, NULL);
        if (!rc)
            rc = qr_model_evaluate(r->t.model, (const float *const *)r->params, &r->t.test,
                                   &res->test_accuracy_averaged, &loss);
    }
    /* A ps restarted while the chief finished: the cluster rolled back to
     * a checkpoint before the end, so training goes on from there (the
     * caller rejoins); the cluster must not be stopped now. */
    if (rc == QR_EROLLEDBACK) return rc;
    if (!rc) rc = qr_worker_stats(r->w, res->stats, sizeof res->stats);
    /* The last summary point, while the ps tasks can still be asked. */
    if (!rc)
        rc = qr__summaries_point(&r->summaries, r->w, r->step, r->loss_avg,
                                 (int64_t)r->o->batch_size * r->batches, true,
                                 res->test_accuracy, res->test_loss);
    int stop_rc = qr_worker_stop_cluster(r->w);
    return rc ? rc : stop_rc;
}

static void run_free(worker_run *r) {
    for (int i = 0; i < r->t.nparams; i++) {
        if (r->grads) free(r->grads[i]);
        if (r->extra) free(r->extra[i]);
    }
    qr__pipeline_free(&r->pipe); /* joined already (pipelined_steps) */
    free(r->layer_req); /* every request was waited for (overlapped_steps) */
    free(r->extra);
    free(r->grads);
    free(r->params);
    free(r->sizes);
    free(r->ids);
    qr_worker_free(r->w);
    trainer_free(&r->t);
}

static worker_run new_run(const qr_train_opts *o, int task_index, const qr_config *cfg,
                          qr_train_result *res) {
    return (worker_run){.o = o, .task_index = task_index, .chief = task_index == 0,
                        .sync = !strcmp(qr__config_str(cfg, "mode"), "sync"), .loss_avg = NAN,
                        .res = res};
}

/* After a step that reached r->step: progress, metrics and the chief's
 * summaries. */
static int step_done(worker_run *r, double loss, double start) {
    int64_t examples_per_step = (int64_t)r->o->batch_size * r->batches;
    r->loss_avg = qr__train_smooth_loss(r->loss_avg, loss);
    qr__train_report(r->o, r->step, r->total, r->loss_avg, start, false, 0);
    double elapsed = qr__now_sec() - start;
    qr__worker_metrics_step(&r->metrics, r->step, r->loss_avg, r->step / elapsed,
                            (double)r->step * (double)examples_per_step / elapsed,
                            r->res->stale_pushes);
    /* The last step's point is the final one (chief_finish), with the
     * accuracy: a periodic point due then would repeat its step. */
    if (!r->chief || r->step >= r->total) return QR_OK;
    return qr__summaries_point(&r->summaries, r->w, r->step, r->loss_avg, examples_per_step,
                               false, 0, 0);
}

/* The steps with their communication overlapped (overlapped_step). An
 * async step is done once the next batch is drawn and its first layer's
 * push answered: its loss waits in `pending` until then. */
static int overlapped_steps(worker_run *r, double start) {
    int rc = first_values(r);
    double pending = NAN;
    while (!rc && r->step < r->total) {
        double loss = 0;
        int64_t before = r->step;
        rc = overlapped_step(r, &loss);
        if (!rc && !r->sync && r->step != before) rc = step_done(r, pending, start);
        if (!rc && r->sync) rc = step_done(r, loss, start);
        pending = loss;
    }
    int wait_rc = wait_layers(r); /* what is still in flight, whatever happened */
    return rc ? rc : wait_rc;
}

/* ---- pipeline: a step's communication under the next step's compute --- */

/* The steps pipelined (pipeline.c): step t's push and pull run on the
 * pipeline's thread while step t+1 computes on the values step t-1's push
 * brought. A step is done (its global step known, its loss reported) once
 * the next batch's gradient is computed and its push is answered. */
static int pipelined_steps(worker_run *r, double start) {
    int rc = qr__pipeline_init(&r->pipe, r->w, r->t.nparams, r->ids, r->sizes, r->grads);
    if (!rc) rc = first_values(r);
    double pending = NAN;
    while (!rc) {
        double loss = 0;
        rc = batch_grad(&r->t, &r->rng, r->o->batch_size, r->params, r->grads, &loss);
        if (!rc && r->pipe.running) {
            int64_t global = r->step;
            int push_rc = qr__pipeline_finish(&r->pipe, r->params, &global);
            qr__worker_metrics_call(&r->metrics, true, r->pipe.seconds);
            rc = qr__train_after_push(r->w, push_rc, false, global, &r->step, r->res);
            if (!rc) rc = step_done(r, pending, start);
        }
        if (rc || r->step >= r->total) break;
        qr__train_slow_down(r->o, r->task_index);
        rc = qr_worker_wait_bound(r->w); /* max-staleness; at once if unset */
        qr_worker_set_data_position(r->w, r->t.drawn); /* rides on the push */
        if (!rc) rc = qr__pipeline_start(&r->pipe, r->grads, QR_PUSH_STEP);
        pending = loss;
    }
    int64_t global = 0;
    int wait_rc = qr__pipeline_finish(&r->pipe, r->params, &global); /* one still in flight */
    qr__pipeline_end(&r->pipe, r->grads); /* run_free frees the buffers it made */
    /* The worker's own copies again: the chief evaluates what its last
     * pull brings into them. */
    for (int i = 0; i < r->t.nparams; i++) r->params[i] = qr_worker_var_data(r->w, r->ids[i]);
    return rc ? rc : wait_rc;
}

/* Steps until the run's last one, or a failure. */
static int train_steps(worker_run *r, qr_train_result *res, double start) {
    if (r->pipelined) return pipelined_steps(r, start);
    if (r->overlap) return overlapped_steps(r, start);
    step_fn compute_step = pick_strategy(r->o);
    /* A plain sync step is one round trip: its answer brings the next
     * step's values, so only the first step (and one after a lost push)
     * pulls. */
    bool one_trip = r->sync && compute_step == step_plain;
    r->values_due = true;
    int rc = QR_OK;
    while (!rc && r->step < r->total) {
        unsigned flags = QR_PUSH_STEP;
        double loss = 0;
        rc = qr_worker_wait_bound(r->w); /* max-staleness; returns at once if unset */
        if (!rc && (r->values_due || !one_trip)) {
            double t0 = qr__now_sec();
            rc = qr_worker_pull(r->w, 0, NULL, NULL);
            qr__worker_metrics_call(&r->metrics, false, qr__now_sec() - t0);
            r->values_due = false;
        }
        if (!rc) rc = compute_step(r, &loss, &flags);
        if (!rc) rc = one_trip ? push_pull_and_advance(r, flags, res)
                               : push_and_advance(r, flags, res);
        if (!rc) rc = step_done(r, loss, start);
    }
    return rc;
}

/* One BLAS thread per worker: several workers share the cores. A count
 * the user set (OPENBLAS_NUM_THREADS, which the quorum tool otherwise sets
 * to 1) is kept, as torchrun keeps a user's OMP_NUM_THREADS. */
static void one_blas_thread_unless_set(void) {
    if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);
}

int qr_train_worker(const qr_cluster *cluster, int task_index, const qr_config *cfg,
                    const qr_train_opts *o, qr_train_result *res) {
    one_blas_thread_unless_set();
    memset(res, 0, sizeof *res);
    res->test_accuracy_averaged = -1;
    res->test_auc = res->test_logloss = -1;
    if (qr__train_is_ctr(o->model) && o->overlap == 1)
        return qr__fail(QR_EINVAL, "--overlap on: the click models (%s) push once a step; use "
                        "--overlap off or auto", o->model);
    if (qr__train_is_ctr(o->model)) return qr__train_ctr_worker(cluster, task_index, cfg, o, res);
    worker_run r = new_run(o, task_index, cfg, res);
    int rc = qr__worker_metrics_start(&r.metrics, cfg);
    if (!rc) rc = run_setup(&r, cluster, cfg);
    bool joined = !rc;
    if (!rc && r.chief) rc = qr__summaries_open(&r.summaries, o->logdir, o->summary_secs, cfg);
    double start = qr__now_sec();
    if (!rc) rc = qr__train_wait_end(r.w, r.chief, train_steps(&r, res, start));
rejoin:
    /* A restarted ps made the cluster roll back to its checkpoint: this
     * worker starts again from there, as a worker started anew would. */
    while (rc == QR_EROLLEDBACK) {
        qr__log(QR_LOG_INFO, "rejoining the cluster at its checkpoint");
        run_free(&r);
        worker_run again = new_run(o, task_index, cfg, res);
        again.loss_avg = r.loss_avg; /* what goes on across the rollback */
        again.summaries = r.summaries;
        again.metrics = r.metrics;
        r = again;
        /* One rollback counts once: one met while rejoining is the same
         * rollback settling (a ps that had not rolled back yet). */
        res->rollbacks += joined;
        rc = run_setup(&r, cluster, cfg);
        joined = !rc;
        if (!rc) rc = qr__train_wait_end(r.w, r.chief, train_steps(&r, res, start));
    }
    rc = qr__train_steps_ended(o, rc, r.chief, r.step, r.total, r.batches, r.loss_avg, start,
                               res);
    res->overlapped = r.overlap || r.pipelined;
    res->pipelined = r.pipelined;
    if (!rc && r.chief) {
        rc = chief_finish(&r, cfg, res);
        if (rc == QR_EROLLEDBACK) goto rejoin; /* met while it finished */
    }
    qr__summaries_close(&r.summaries);
    qr__worker_metrics_stop(&r.metrics);
    if (rc) qr__error_prefix("worker %d: ", task_index);
    run_free(&r);
    return rc;
}

/* ---- the single-process reference -------------------------------------- */

typedef struct local_run {
    trainer t;
    qr_optim *opt;
    int n, np;               /* virtual workers, parameters */
    float **params;
    int64_t *sizes;
    qr_optim_slots **slots;
    float **grads;           /* [worker][param] */
    const float **srcs;      /* one parameter's gradients, in worker order */
    qr_rng *rngs;
} local_run;

/* The parameters as the chief initializes them, and the same slots,
 * viewed the same way, as the ps creates. */
static int local_setup(local_run *l, const qr_config *cfg, const qr_train_opts *o) {
    int rc = trainer_setup(&l->t, o);
    if (!rc) rc = qr_optim_create(&l->opt, cfg);
    int np = l->np = l->t.nparams, n = l->n;
    l->params = qr__calloc((size_t)QR_MAX(np, 1), sizeof *l->params);
    l->sizes = qr__calloc((size_t)QR_MAX(np, 1), sizeof *l->sizes);
    l->slots = qr__calloc((size_t)QR_MAX(np, 1), sizeof *l->slots);
    l->grads = qr__calloc((size_t)QR_MAX(np * n, 1), sizeof *l->grads);
    l->srcs = qr__calloc((size_t)n, sizeof *l->srcs);
    l->rngs = qr__calloc((size_t)n, sizeof *l->rngs);
    if (!rc && (!l->params || !l->sizes || !l->slots || !l->grads || !l->srcs || !l->rngs))
        rc = QR_ENOMEM;
    for (int i = 0; !rc && i < np; i++) {
        const char *name, *init;
        int ndim;
        int64_t shape[2];
        qr_model_param_info(l->t.model, i, &name, &ndim, shape, &init);
        l->sizes[i] = ndim == 2 ? shape[0] * shape[1] : shape[0];
        int64_t dim = shape[ndim - 1];
        l->params[i] = qr__aligned_alloc((size_t)l->sizes[i] * sizeof(float));
        if (!l->params[i]) rc = QR_ENOMEM;
        if (!rc)
            rc = qr_init_fill(l->params[i], l->sizes[i], ndim, shape, init,
                              qr__train_param_seed(o, i));
        if (!rc) rc = qr_optim_slots_create(l->opt, l->sizes[i] / dim, dim, &l->slots[i]);
        for (int w = 0; !rc && w < n; w++) {
            l->grads[w * np + i] = qr__aligned_alloc((size_t)l->sizes[i] * sizeof(float));
            if (!l->grads[w * np + i]) rc = QR_ENOMEM;
        }
    }
    for (int w = 0; l->rngs && w < n; w++) qr__train_worker_rng(&l->rngs[w], o, w);
    return rc;
}

/* Synchronous step s: every virtual worker's gradient at the same weights;
 * as the ps does, reduced in worker order into worker 0's buffer, then one
 * apply with the optimizer's step s + 1. */
static int local_step(local_run *l, int batch, bool mean, int64_t s) {
    int rc = QR_OK, np = l->np;
    for (int w = 0; !rc && w < l->n; w++) {
        double loss;
        rc = batch_grad(&l->t, &l->rngs[w], batch, l->params, &l->grads[w * np], &loss);
    }
    for (int i = 0; !rc && i < np; i++) {
        for (int w = 0; w < l->n; w++) l->srcs[w] = l->grads[w * np + i];
        qr_optim_reduce(l->grads[i], l->srcs, l->n, l->sizes[i], mean ? (float)l->n : 1.0f);
        rc = qr_optim_apply_dense(l->opt, l->slots[i], l->params[i], l->grads[i], l->sizes[i],
                                  -1.0f, s + 1);
    }
    return rc;
}

static void local_free(local_run *l) {
    for (int i = 0; i < l->np; i++) {
        if (l->params) free(l->params[i]);
        if (l->slots) qr_optim_slots_free(l->slots[i]);
    }
    for (int k = 0; l->grads && k < l->np * l->n; k++) free(l->grads[k]);
    free(l->srcs);
    free(l->params);
    free(l->sizes);
    free(l->slots);
    free(l->grads);
    free(l->rngs);
    qr_optim_free(l->opt);
    trainer_free(&l->t);
}

int qr_train_local(const qr_config *cfg, const qr_train_opts *o, qr_train_result *res) {
    one_blas_thread_unless_set();
    memset(res, 0, sizeof *res);
    res->test_accuracy_averaged = -1;
    res->test_auc = res->test_logloss = -1;
    if (qr__train_is_ctr(o->model))
        return qr__fail(QR_EINVAL, "quorum train --local trains softmax and mlp; click models "
                        "(%s) train on a cluster", o->model);
    local_run l = {.n = o->virtual_workers};
    int rc = local_setup(&l, cfg, o);
    int64_t total = qr__train_total_steps(o, l.t.train.n, l.n);
    bool mean = !strcmp(qr__config_str(cfg, "reduction"), "mean");
    double start = qr__now_sec();
    for (int64_t s = 0; !rc && s < total; s++) {
        rc = local_step(&l, o->batch_size, mean, s);
        res->global_step = s + 1;
    }
    res->wall_seconds = qr__now_sec() - start;
    res->examples_per_sec = (double)res->global_step * o->batch_size * l.n / res->wall_seconds;
    if (!rc)
        rc = qr_model_evaluate(l.t.model, (const float *const *)l.params, &l.t.test,
                               &res->test_accuracy, &res->test_loss);
    if (!rc) res->params_digest = params_digest(l.params, l.sizes, l.np);
    local_free(&l);
    return rc;
}

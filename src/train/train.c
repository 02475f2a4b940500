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
 *          at the token that carries the last step.
 * qr_train_local is the single-process reference of sync training.
 */
#include "train/train.h"

#include "common/config.h"
#include "data/data.h"
#include "model/model.h"
#include "optim/optim.h"
#include "worker/init.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void qr_train_opts_default(qr_train_opts *o) {
    memset(o, 0, sizeof *o);
    snprintf(o->model, sizeof o->model, "mlp");
    o->hidden[0] = 256;
    o->hidden[1] = 128;
    o->nhidden = 2;
    snprintf(o->data, sizeof o->data, "digits");
    o->batch_size = 64;
    o->epochs = 1;
    o->seed = 1;
    o->slow_worker = -1;
    o->slow_ms = 0;
    o->virtual_workers = 1;
    o->accumulate = 1;
    o->local_steps = 1;
}

static int parse_hidden(qr_train_opts *o, const char *value) {
    int n = 0;
    const char *p = value;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 65536 || (*end && *end != ','))
            return qr__fail(QR_EINVAL, "--hidden '%s': expected widths like 256,128", value);
        if (n == QR_TRAIN_MAX_HIDDEN)
            return qr__fail(QR_EINVAL, "--hidden: at most %d layers", QR_TRAIN_MAX_HIDDEN);
        o->hidden[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!n) return qr__fail(QR_EINVAL, "--hidden is empty");
    o->nhidden = n;
    return QR_OK;
}

int qr_train_opts_set(qr_train_opts *o, const char *key, const char *value) {
    int64_t iv;
    double dv;
    int rc;
    char k[64];
    snprintf(k, sizeof k, "%s", key);
    for (char *c = k; *c; c++)
        if (*c == '_') *c = '-';
    if (!strcmp(k, "model")) {
        if (strcmp(value, "softmax") && strcmp(value, "mlp"))
            return qr__fail(QR_EINVAL, "--model '%s': expected softmax or mlp", value);
        snprintf(o->model, sizeof o->model, "%s", value);
    } else if (!strcmp(k, "hidden")) {
        return parse_hidden(o, value);
    } else if (!strcmp(k, "data")) {
        snprintf(o->data, sizeof o->data, "%s", value);
    } else if (!strcmp(k, "data-dir")) {
        snprintf(o->data_dir, sizeof o->data_dir, "%s", value);
    } else if (!strcmp(k, "batch-size")) {
        if ((rc = qr__parse_int64(value, 1, 1 << 20, &iv)))
            return qr__fail(rc, "--batch-size: %s", qr_last_error());
        o->batch_size = (int)iv;
    } else if (!strcmp(k, "epochs")) {
        if ((rc = qr__parse_float(value, &dv)) || dv <= 0 || dv > 1e6)
            return qr__fail(QR_EINVAL, "--epochs '%s': expected a number > 0", value);
        o->epochs = dv;
        o->steps = 0;
    } else if (!strcmp(k, "steps")) {
        if ((rc = qr__parse_int64(value, 1, INT64_MAX / 2, &iv)))
            return qr__fail(rc, "--steps: %s", qr_last_error());
        o->steps = iv;
    } else if (!strcmp(k, "seed")) {
        if ((rc = qr__parse_int64(value, 0, INT64_MAX, &iv)))
            return qr__fail(rc, "--seed: %s", qr_last_error());
        o->seed = (uint64_t)iv;
    } else if (!strcmp(k, "slow-worker")) {
        int w, ms;
        char extra;
        if (sscanf(value, "%d:%d%c", &w, &ms, &extra) != 2 || w < 0 || ms < 0)
            return qr__fail(QR_EINVAL, "--slow-worker '%s': expected INDEX:MILLISECONDS", value);
        o->slow_worker = w;
        o->slow_ms = ms;
    } else if (!strcmp(k, "accumulate") || !strcmp(k, "local-steps")) {
        if ((rc = qr__parse_int64(value, 1, 1 << 20, &iv)))
            return qr__fail(rc, "--%s: %s", k, qr_last_error());
        if (!strcmp(k, "accumulate")) o->accumulate = (int)iv;
        else o->local_steps = (int)iv;
        if (o->accumulate > 1 && o->local_steps > 1)
            return qr__fail(QR_EINVAL, "--accumulate and --local-steps do not combine");
    } else if (!strcmp(k, "var-opt")) {
        const char *colon = strchr(value, ':');
        if (!colon || colon == value || !colon[1] || strchr(colon + 1, ':'))
            return qr__fail(QR_EINVAL, "--var-opt '%s': expected NAME:key=value,...", value);
        if (o->nvar_opts == 16) return qr__fail(QR_EINVAL, "--var-opt: at most 16 of them");
        snprintf(o->var_opt_name[o->nvar_opts], sizeof o->var_opt_name[0], "%.*s",
                 (int)(colon - value), value);
        snprintf(o->var_opt[o->nvar_opts], sizeof o->var_opt[0], "%s", colon + 1);
        o->nvar_opts++;
    } else if (!strcmp(k, "local")) {
        o->local = !strcmp(value, "true") || !strcmp(value, "1");
    } else if (!strcmp(k, "virtual-workers")) {
        if ((rc = qr__parse_int64(value, 1, 1024, &iv)))
            return qr__fail(rc, "--virtual-workers: %s", qr_last_error());
        o->virtual_workers = (int)iv;
    } else if (!strcmp(k, "json")) {
        o->json = !strcmp(value, "true") || !strcmp(value, "1");
    } else if (!strcmp(k, "quiet")) {
        o->quiet = !strcmp(value, "true") || !strcmp(value, "1");
    } else {
        return QR_ENOTFOUND;
    }
    return QR_OK;
}

const char *qr_train_opts_help(void) {
    return "  --model softmax|mlp     model to train (default mlp)\n"
           "  --hidden 256,128        hidden layer widths of the mlp\n"
           "  --data NAME|PATH        fashion-mnist, digits, or a directory of IDX files\n"
           "                          or a digits-style .csv(.gz) (default digits)\n"
           "  --data-dir DIR          where fashion-mnist/digits live, if not the default\n"
           "  --batch-size N          examples per worker step (default 64)\n"
           "  --epochs E              passes over the training set, counted in global\n"
           "                          steps of batch-size examples (default 1)\n"
           "  --steps N               global steps instead of epochs\n"
           "  --seed N                seed of initialization and sampling (default 1)\n"
           "  --json                  print a JSON summary as the last line of stdout\n"
           "  --quiet                 no progress line\n"
           "  --accumulate K          async: sum K batches' gradients at the pulled weights,\n"
           "                          push once\n"
           "  --local-steps K         async: K plain SGD steps on a local copy (lr: --lr,\n"
           "                          default 0.05, decayed by the lr-decay-* schedule at the\n"
           "                          global step), then push the delta w_local - w_pulled\n"
           "  --var-opt NAME:K=V,...  a variable's own optimizer options, e.g.\n"
           "                          layer0/weights:optimizer=adagrad,lr=0.05 (repeatable)\n"
           "  --slow-worker I:MS      (testing) worker I sleeps MS milliseconds every step\n"
           "  (--mode, --replicas-to-aggregate, --reduction, --init-tokens: see options)\n";
}

/* Hash of every variable's bytes in id order: two runs that end with the
 * same parameters have the same digest. */
static uint64_t params_digest(qr_worker *w, int nparams) {
    uint64_t h = QR_FNV_INIT;
    for (int i = 0; i < nparams; i++)
        h = qr__fnv1a(qr_worker_var_data(w, i), (size_t)qr_worker_var_size(w, i) * 4, h);
    return h;
}

static void print_progress(bool tty, int64_t step, int64_t total, double loss, double eps,
                           bool final) {
    if (tty)
        fprintf(stderr, "\rstep %lld/%lld  loss %.4f  %.0f examples/s   %s",
                (long long)step, (long long)total, loss, eps, final ? "\n" : "");
    else
        fprintf(stderr, "step %lld/%lld  loss %.4f  %.0f examples/s\n", (long long)step,
                (long long)total, loss, eps);
    fflush(stderr);
}

static void print_summary(const qr_train_opts *o, const qr_config *cfg, int nps, int nworkers,
                          const qr_train_result *r) {
    const char *mode = qr__config_str(cfg, "mode");
    double steps_per_sec = r->wall_seconds > 0 ? (double)r->global_step / r->wall_seconds : 0;
    fprintf(stderr,
            "trained %s on %s (%s): test accuracy %.4f (loss %.4f) after %lld global steps, "
            "%.1f steps/s, %.0f examples/s, %.1f s\n",
            o->model, o->data, mode, r->test_accuracy, r->test_loss, (long long)r->global_step,
            steps_per_sec, r->examples_per_sec, r->wall_seconds);
    if (!o->json) return;
    cJSON *j = cJSON_CreateObject();
    char digest[32];
    snprintf(digest, sizeof digest, "%016llx", (unsigned long long)r->params_digest);
    cJSON_AddNumberToObject(j, "test_accuracy", r->test_accuracy);
    cJSON_AddNumberToObject(j, "test_loss", r->test_loss);
    if (r->test_accuracy_averaged >= 0)
        cJSON_AddNumberToObject(j, "test_accuracy_averaged", r->test_accuracy_averaged);
    cJSON_AddNumberToObject(j, "global_step", (double)r->global_step);
    cJSON_AddNumberToObject(j, "global_steps_per_sec", steps_per_sec);
    cJSON_AddNumberToObject(j, "examples_per_sec", r->examples_per_sec);
    cJSON_AddNumberToObject(j, "wall_seconds", r->wall_seconds);
    cJSON_AddStringToObject(j, "model", o->model);
    cJSON_AddStringToObject(j, "data", o->data);
    cJSON_AddStringToObject(j, "mode", mode);
    cJSON_AddStringToObject(j, "optimizer", qr__config_str(cfg, "optimizer"));
    cJSON_AddNumberToObject(j, "batch_size", o->batch_size);
    cJSON_AddNumberToObject(j, "ps", nps);
    cJSON_AddNumberToObject(j, "workers", nworkers);
    cJSON_AddStringToObject(j, "params_digest", digest);
    cJSON *stats = r->stats[0] ? cJSON_Parse(r->stats) : NULL;
    if (stats && !strcmp(mode, "sync")) {
        cJSON_AddItemToObject(j, "sync", stats);
    } else if (stats) {
        /* async: how many updates each gradient missed, as a histogram */
        cJSON *st = cJSON_AddObjectToObject(j, "staleness");
        static const char *buckets[] = {"0", "1", "2", "3", "4-7", "8-15", "16-31", "32-63", "64+"};
        cJSON_AddItemToObject(st, "buckets", cJSON_CreateStringArray(buckets, 9));
        cJSON *counts = cJSON_GetObjectItem(stats, "staleness");
        if (counts) cJSON_AddItemToObject(st, "counts", cJSON_Duplicate(counts, 1));
        cJSON_Delete(stats);
    }
    char *text = cJSON_PrintUnformatted(j);
    if (text) printf("%s\n", text);
    fflush(stdout);
    free(text);
    cJSON_Delete(j);
}

/* What every way of training shares: the data, the model, the batch. */
typedef struct trainer {
    qr_dataset train, test;
    qr_model *model;
    int nparams;
    float *bx;
    int32_t *by;
} trainer;

static void trainer_free(trainer *t) {
    qr_model_free(t->model);
    qr_dataset_free(&t->train);
    qr_dataset_free(&t->test);
    free(t->bx);
    free(t->by);
}

static int trainer_setup(trainer *t, const qr_train_opts *o) {
    int rc = qr_data_load(o->data, o->data_dir[0] ? o->data_dir : NULL, &t->train, &t->test);
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

/* Parameter i's seed: the same in every worker and in --local. */
static uint64_t param_seed(const qr_train_opts *o, int i) {
    return o->seed * 1000003u + (uint64_t)i;
}

/* Worker w's minibatch generator. */
static void worker_rng(qr_rng *rng, const qr_train_opts *o, int w) {
    qr_rng_seed(rng, o->seed * 7919u + (uint64_t)w);
}

static void sample_batch(trainer *t, qr_rng *rng, int batch) {
    int64_t dim = t->train.dim;
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

/* Global steps of the run: --steps, or --epochs over the training set; a
 * synchronous step consumes R batches, an asynchronous one a single batch. */
static int64_t total_steps(const qr_train_opts *o, int64_t ntrain, int batches_per_step) {
    if (o->steps) return o->steps;
    double per_step = (double)o->batch_size * batches_per_step;
    return QR_MAX(1, (int64_t)ceil(o->epochs * (double)ntrain / per_step));
}

static int sync_replicas(const qr_config *cfg, int nworkers) {
    int64_t r = qr__config_int(cfg, "replicas-to-aggregate");
    return r > 0 ? (int)r : nworkers;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int qr_train_worker(const qr_cluster *cluster, int task_index, const qr_config *cfg,
                    const qr_train_opts *o, qr_train_result *res) {
    /* One BLAS thread per worker: several workers share the cores. */
    openblas_set_num_threads(1);
    memset(res, 0, sizeof *res);
    res->test_accuracy_averaged = -1;
    bool chief = task_index == 0;
    bool sync = !strcmp(qr__config_str(cfg, "mode"), "sync");
    trainer t = {0};
    qr_worker *w = NULL;
    int *ids = NULL;
    float **params = NULL, **grads = NULL;
    int rc = trainer_setup(&t, o);
    if (!rc) rc = qr_worker_create(&w, cluster, task_index, cfg);
    if (!rc) {
        ids = qr__calloc((size_t)t.nparams, sizeof *ids);
        params = qr__calloc((size_t)t.nparams, sizeof *params);
        grads = qr__calloc((size_t)t.nparams, sizeof *grads);
        if (!ids || !params || !grads) rc = QR_ENOMEM;
    }
    for (int i = 0; !rc && i < t.nparams; i++) {
        const char *name, *init;
        int ndim;
        int64_t shape[2];
        qr_model_param_info(t.model, i, &name, &ndim, shape, &init);
        /* Every worker declares the same seeds; only the chief's are used. */
        const char *opts = "";
        for (int k = 0; k < o->nvar_opts; k++)
            if (!strcmp(o->var_opt_name[k], name)) opts = o->var_opt[k];
        rc = qr_worker_declare_opts(w, name, ndim, shape, init, param_seed(o, i), opts, &ids[i]);
        if (!rc) {
            grads[i] = qr__aligned_alloc((size_t)qr_worker_var_size(w, ids[i]) * sizeof(float));
            if (!grads[i]) rc = QR_ENOMEM;
        }
    }
    if (!rc && sync && (o->accumulate > 1 || o->local_steps > 1))
        rc = qr__fail(QR_EINVAL, "--accumulate and --local-steps are for --mode async");
    /* Batches one global step consumes. */
    int batches = sync ? sync_replicas(cfg, qr_cluster_num_workers(cluster))
                       : o->accumulate * o->local_steps;
    int64_t total = total_steps(o, t.train.n, batches);
    for (int k = 0; !rc && k < o->nvar_opts; k++) {
        bool found = false;
        for (int i = 0; i < t.nparams; i++) {
            const char *name, *init;
            int ndim;
            int64_t shape[2];
            qr_model_param_info(t.model, i, &name, &ndim, shape, &init);
            found |= !strcmp(name, o->var_opt_name[k]);
        }
        if (!found)
            rc = qr__fail(QR_EINVAL, "--var-opt: the model has no variable '%s' (it has "
                          "layer0/weights, layer0/bias, layer1/weights, ...)", o->var_opt_name[k]);
    }
    /* Gradient sums (accumulate) or the pulled weights (local SGD). */
    float **extra = NULL;
    if (!rc && (o->accumulate > 1 || o->local_steps > 1)) {
        extra = qr__calloc((size_t)t.nparams, sizeof *extra);
        if (!extra) rc = QR_ENOMEM;
        for (int i = 0; !rc && i < t.nparams; i++) {
            extra[i] = qr__aligned_alloc((size_t)qr_worker_var_size(w, ids[i]) * sizeof(float));
            if (!extra[i]) rc = QR_ENOMEM;
        }
    }
    double local_lr = qr__config_is_set(cfg, "lr") ? qr__config_float(cfg, "lr") : 0.05;
    double decay_rate = qr__config_float(cfg, "lr-decay-rate");
    int64_t decay_steps = qr__config_int(cfg, "lr-decay-steps");
    bool decay_staircase = qr__config_bool(cfg, "lr-decay-staircase");
    if (!rc && chief) rc = qr_worker_set_step_limit(w, total);
    if (!rc) rc = qr_worker_initialize(w);
    for (int i = 0; !rc && i < t.nparams; i++) params[i] = qr_worker_var_data(w, ids[i]);

    qr_rng rng;
    worker_rng(&rng, o, task_index);
    bool tty = isatty(2) && !o->quiet;
    double start = qr__now_sec(), last_print = start, loss_avg = NAN;
    int64_t step = 0;
    if (!rc && sync) rc = qr_worker_local_step(w, &step);
    while (!rc && step < total) {
        rc = qr_worker_wait_bound(w); /* max-staleness; returns at once if unset */
        if (!rc) rc = qr_worker_pull(w, 0, NULL, NULL);
        if (rc) break;
        unsigned flags = QR_PUSH_STEP;
        double loss = 0;
        if (o->local_steps > 1) {
            /* Local SGD: k plain steps on the worker's copy, then push the
             * delta w_local - w_pulled; the ps adds it to its weights. */
            for (int i = 0; i < t.nparams; i++)
                memcpy(extra[i], params[i], (size_t)qr_worker_var_size(w, ids[i]) * sizeof(float));
            /* The ps's learning-rate schedule, at the global step: the
             * ps adds deltas as they come, so the decay happens here. */
            float lr = qr_optim_decayed_lr((float)local_lr, step, decay_rate, decay_steps,
                                           decay_staircase);
            for (int k = 0; !rc && k < o->local_steps; k++) {
                rc = batch_grad(&t, &rng, o->batch_size, params, grads, &loss);
                for (int i = 0; !rc && i < t.nparams; i++) {
                    int64_t n = qr_worker_var_size(w, ids[i]);
                    for (int64_t e = 0; e < n; e++) params[i][e] -= lr * grads[i][e];
                }
            }
            for (int i = 0; !rc && i < t.nparams; i++) {
                int64_t n = qr_worker_var_size(w, ids[i]);
                for (int64_t e = 0; e < n; e++) grads[i][e] = params[i][e] - extra[i][e];
            }
            flags |= QR_PUSH_DELTA;
        } else if (o->accumulate > 1) {
            /* Accumulation: k batches' gradients at the pulled weights,
             * summed, pushed once; the ps applies the sum. */
            for (int k = 0; !rc && k < o->accumulate; k++) {
                rc = batch_grad(&t, &rng, o->batch_size, params, grads, &loss);
                for (int i = 0; !rc && i < t.nparams; i++) {
                    int64_t n = qr_worker_var_size(w, ids[i]);
                    for (int64_t e = 0; e < n; e++)
                        extra[i][e] = k ? extra[i][e] + grads[i][e] : grads[i][e];
                }
            }
            for (int i = 0; !rc && i < t.nparams; i++)
                memcpy(grads[i], extra[i], (size_t)qr_worker_var_size(w, ids[i]) * sizeof(float));
        } else {
            rc = batch_grad(&t, &rng, o->batch_size, params, grads, &loss);
        }
        if (rc) break;
        loss_avg = isnan(loss_avg) ? loss : 0.95 * loss_avg + 0.05 * loss;
        if (o->slow_worker == task_index && o->slow_ms > 0) sleep_ms(o->slow_ms);
        int64_t global = 0;
        rc = qr_worker_push(w, t.nparams, ids, (const float *const *)grads, flags, &global);
        if (rc == QR_ESTALE) {
            /* Too late for its step (a backup worker, or TensorFlow's
             * wasted round); it still takes a token and goes on. */
            res->stale_pushes++;
            rc = QR_OK;
        }
        if (rc) break;
        res->local_steps++;
        if (sync) rc = qr_worker_take_token(w, &step);
        else step = global;
        double now = qr__now_sec();
        if (!rc && chief && !o->quiet && now - last_print > (tty ? 0.2 : 5.0)) {
            print_progress(tty, step, total, loss_avg,
                           (double)step * o->batch_size / (now - start), false);
            last_print = now;
        }
    }
    /* A stop means the chief ended the run: not an error for the others. */
    if (rc == QR_ESTOPPED && !chief) rc = QR_OK;
    res->wall_seconds = qr__now_sec() - start;
    res->global_step = step;
    res->examples_per_sec = (double)step * o->batch_size * batches / res->wall_seconds;
    if (!rc && chief) {
        if (!o->quiet) print_progress(tty, step, total, loss_avg, res->examples_per_sec, true);
        rc = qr_worker_pull(w, 0, NULL, NULL);
        if (!rc)
            rc = qr_model_evaluate(t.model, (const float *const *)params, &t.test,
                                   &res->test_accuracy, &res->test_loss);
        res->params_digest = params_digest(w, t.nparams);
        res->test_accuracy_averaged = -1;
        if (!rc && qr__config_float(cfg, "moving-average-decay") > 0 &&
            !qr__config_str(cfg, "moving-average-vars")[0]) {
            /* Evaluate the averaged weights too (the copies are refreshed
             * from the ps by any later pull). */
            double loss;
            rc = qr_worker_pull_averages(w, 0, NULL, NULL);
            if (!rc)
                rc = qr_model_evaluate(t.model, (const float *const *)params, &t.test,
                                       &res->test_accuracy_averaged, &loss);
        }
        if (!rc) rc = qr_worker_stats(w, res->stats, sizeof res->stats);
        int stop_rc = qr_worker_stop_cluster(w);
        if (!rc) rc = stop_rc;
        if (!rc) print_summary(o, cfg, qr_cluster_num_ps(cluster), qr_cluster_num_workers(cluster), res);
    }
    if (rc) qr__error_prefix("worker %d: ", task_index);
    for (int i = 0; i < t.nparams; i++) {
        if (grads) free(grads[i]);
        if (extra) free(extra[i]);
    }
    free(extra);
    free(grads);
    free(params);
    free(ids);
    qr_worker_free(w);
    trainer_free(&t);
    return rc;
}

int qr_train_local(const qr_config *cfg, const qr_train_opts *o, qr_train_result *res) {
    openblas_set_num_threads(1);
    memset(res, 0, sizeof *res);
    res->test_accuracy_averaged = -1;
    int n = o->virtual_workers;
    trainer t = {0};
    qr_optim *opt = NULL;
    int rc = trainer_setup(&t, o);
    if (!rc) rc = qr_optim_create(&opt, cfg);
    int np = t.nparams;
    float **params = qr__calloc((size_t)QR_MAX(np, 1), sizeof *params);
    int64_t *sizes = qr__calloc((size_t)QR_MAX(np, 1), sizeof *sizes);
    qr_optim_slots **slots = qr__calloc((size_t)QR_MAX(np, 1), sizeof *slots);
    float **grads = qr__calloc((size_t)QR_MAX(np * n, 1), sizeof *grads); /* [worker][param] */
    qr_rng *rngs = qr__calloc((size_t)n, sizeof *rngs);
    if (!rc && (!params || !sizes || !slots || !grads || !rngs)) rc = QR_ENOMEM;
    for (int i = 0; !rc && i < np; i++) {
        const char *name, *init;
        int ndim;
        int64_t shape[2];
        qr_model_param_info(t.model, i, &name, &ndim, shape, &init);
        sizes[i] = ndim == 2 ? shape[0] * shape[1] : shape[0];
        int64_t dim = shape[ndim - 1];
        params[i] = qr__aligned_alloc((size_t)sizes[i] * sizeof(float));
        if (!params[i]) rc = QR_ENOMEM;
        if (!rc) rc = qr_init_fill(params[i], sizes[i], ndim, shape, init, param_seed(o, i));
        /* The same slots, viewed the same way, as the ps creates. */
        if (!rc) rc = qr_optim_slots_create(opt, sizes[i] / dim, dim, &slots[i]);
        for (int w = 0; !rc && w < n; w++) {
            grads[w * np + i] = qr__aligned_alloc((size_t)sizes[i] * sizeof(float));
            if (!grads[w * np + i]) rc = QR_ENOMEM;
        }
    }
    for (int w = 0; w < n; w++) worker_rng(&rngs[w], o, w);
    int64_t total = total_steps(o, t.train.n, n);
    const float **srcs = qr__calloc((size_t)n, sizeof *srcs);
    if (!srcs) rc = QR_ENOMEM;
    bool mean = !strcmp(qr__config_str(cfg, "reduction"), "mean");
    double start = qr__now_sec();
    for (int64_t s = 0; !rc && s < total; s++) {
        for (int w = 0; !rc && w < n; w++) {
            double loss;
            rc = batch_grad(&t, &rngs[w], o->batch_size, params, &grads[w * np], &loss);
        }
        /* As the ps does: reduce in worker order into worker 0's buffer,
         * then one apply with the optimizer's step s + 1. */
        for (int i = 0; !rc && i < np; i++) {
            for (int w = 0; w < n; w++) srcs[w] = grads[w * np + i];
            qr_optim_reduce(grads[i], srcs, n, sizes[i], mean ? (float)n : 1.0f);
            rc = qr_optim_apply_dense(opt, slots[i], params[i], grads[i], sizes[i], -1.0f, s + 1);
        }
        res->global_step = s + 1;
    }
    res->wall_seconds = qr__now_sec() - start;
    res->examples_per_sec = (double)res->global_step * o->batch_size * n / res->wall_seconds;
    if (!rc)
        rc = qr_model_evaluate(t.model, (const float *const *)params, &t.test, &res->test_accuracy,
                               &res->test_loss);
    if (!rc) {
        uint64_t h = QR_FNV_INIT;
        for (int i = 0; i < np; i++) h = qr__fnv1a(params[i], (size_t)sizes[i] * 4, h);
        res->params_digest = h;
        print_summary(o, cfg, 0, n, res);
    }
    for (int i = 0; i < np; i++) {
        if (params) free(params[i]);
        if (slots) qr_optim_slots_free(slots[i]);
    }
    for (int k = 0; grads && k < np * n; k++) free(grads[k]);
    free(srcs);
    free(params);
    free(sizes);
    free(slots);
    free(grads);
    free(rngs);
    qr_optim_free(opt);
    trainer_free(&t);
    return rc;
}

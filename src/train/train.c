/*
 * train.c - the worker training loop (see train.h).
 *
 * Asynchronous training: each step a worker pulls every parameter, samples
 * a minibatch with its own seeded generator, computes the mean gradient
 * and pushes it; the push to ps 0 advances the global step. Training ends
 * when the global step reaches the limit (or a ps answers "stopped",
 * meaning the chief has ended the run).
 */
#include "train/train.h"

#include "common/config.h"
#include "model/data.h"
#include "model/model.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    snprintf(o->mode, sizeof o->mode, "async");
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
    } else if (!strcmp(k, "mode")) {
        if (strcmp(value, "async"))
            return qr__fail(QR_EINVAL, "--mode '%s': this build supports: async", value);
        snprintf(o->mode, sizeof o->mode, "%s", value);
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
           "  --mode async            training regime (default async)\n"
           "  --json                  print a JSON summary as the last line of stdout\n"
           "  --quiet                 no progress line\n";
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
    fprintf(stderr,
            "trained %s on %s: test accuracy %.4f (loss %.4f) after %lld global steps, "
            "%.0f examples/s, %.1f s\n",
            o->model, o->data, r->test_accuracy, r->test_loss, (long long)r->global_step,
            r->examples_per_sec, r->wall_seconds);
    if (!o->json) return;
    cJSON *j = cJSON_CreateObject();
    char digest[32];
    snprintf(digest, sizeof digest, "%016llx", (unsigned long long)r->params_digest);
    cJSON_AddNumberToObject(j, "test_accuracy", r->test_accuracy);
    cJSON_AddNumberToObject(j, "test_loss", r->test_loss);
    cJSON_AddNumberToObject(j, "global_step", (double)r->global_step);
    cJSON_AddNumberToObject(j, "examples_per_sec", r->examples_per_sec);
    cJSON_AddNumberToObject(j, "wall_seconds", r->wall_seconds);
    cJSON_AddStringToObject(j, "model", o->model);
    cJSON_AddStringToObject(j, "data", o->data);
    cJSON_AddStringToObject(j, "mode", o->mode);
    cJSON_AddStringToObject(j, "optimizer", qr__config_str(cfg, "optimizer"));
    cJSON_AddNumberToObject(j, "batch_size", o->batch_size);
    cJSON_AddNumberToObject(j, "ps", nps);
    cJSON_AddNumberToObject(j, "workers", nworkers);
    cJSON_AddStringToObject(j, "params_digest", digest);
    char *s = cJSON_PrintUnformatted(j);
    if (s) printf("%s\n", s);
    fflush(stdout);
    free(s);
    cJSON_Delete(j);
}

typedef struct trainer {
    qr_dataset train, test;
    qr_model *model;
    qr_worker *worker;
    int nparams;
    int *ids;
    float **params; /* the worker's copies */
    float **grads;
    float *bx;
    int32_t *by;
} trainer;

static void trainer_free(trainer *t) {
    qr_worker_free(t->worker);
    qr_model_free(t->model);
    qr_dataset_free(&t->train);
    qr_dataset_free(&t->test);
    if (t->grads)
        for (int i = 0; i < t->nparams; i++) free(t->grads[i]);
    free(t->grads);
    free(t->params);
    free(t->ids);
    free(t->bx);
    free(t->by);
}

static int trainer_setup(trainer *t, const qr_cluster *cluster, int index, const qr_config *cfg,
                         const qr_train_opts *o) {
    int rc = qr_data_load(o->data, o->data_dir[0] ? o->data_dir : NULL, &t->train, &t->test);
    if (rc) return rc;
    if (t->train.n < 1) return qr__fail(QR_EINVAL, "the training set '%s' is empty", o->data);
    rc = qr_model_create(&t->model, o->model, t->train.dim, o->hidden, o->nhidden,
                         t->train.nclasses, o->batch_size);
    if (!rc) rc = qr_worker_create(&t->worker, cluster, index, cfg);
    if (rc) return rc;
    t->nparams = qr_model_num_params(t->model);
    t->ids = qr__calloc((size_t)t->nparams, sizeof *t->ids);
    t->params = qr__calloc((size_t)t->nparams, sizeof *t->params);
    t->grads = qr__calloc((size_t)t->nparams, sizeof *t->grads);
    t->bx = qr__calloc((size_t)o->batch_size * (size_t)t->train.dim, sizeof *t->bx);
    t->by = qr__calloc((size_t)o->batch_size, sizeof *t->by);
    if (!t->ids || !t->params || !t->grads || !t->bx || !t->by) return QR_ENOMEM;
    for (int i = 0; i < t->nparams; i++) {
        const char *name, *init;
        int ndim;
        int64_t shape[2];
        qr_model_param_info(t->model, i, &name, &ndim, shape, &init);
        /* Every worker declares the same seeds; only the chief's are used. */
        rc = qr_worker_declare(t->worker, name, ndim, shape, init, o->seed * 1000003u + (uint64_t)i,
                               -1.0f, &t->ids[i]);
        if (rc) return rc;
        int64_t n = qr_worker_var_size(t->worker, t->ids[i]);
        t->grads[i] = qr__aligned_alloc((size_t)n * sizeof(float));
        if (!t->grads[i]) return QR_ENOMEM;
    }
    rc = qr_worker_initialize(t->worker);
    if (rc) return rc;
    for (int i = 0; i < t->nparams; i++) t->params[i] = qr_worker_var_data(t->worker, t->ids[i]);
    return QR_OK;
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

int qr_train_worker(const qr_cluster *cluster, int task_index, const qr_config *cfg,
                    const qr_train_opts *o, qr_train_result *res) {
    /* One BLAS thread per worker: several workers share the cores. */
    openblas_set_num_threads(1);
    memset(res, 0, sizeof *res);
    trainer t = {0};
    int rc = trainer_setup(&t, cluster, task_index, cfg, o);
    if (rc) {
        qr__error_prefix("worker %d: ", task_index);
        trainer_free(&t);
        return rc;
    }
    bool chief = task_index == 0;
    int64_t total = o->steps;
    if (!total) total = (int64_t)ceil(o->epochs * (double)t.train.n / o->batch_size);
    qr_rng rng;
    qr_rng_seed(&rng, o->seed * 7919u + (uint64_t)task_index);
    bool tty = isatty(2) && !o->quiet;
    double start = qr__now_sec(), last_print = start, loss_avg = NAN;
    int64_t step = 0;
    for (;;) {
        rc = qr_worker_pull(t.worker, 0, NULL, NULL);
        if (rc) break;
        sample_batch(&t, &rng, o->batch_size);
        double loss;
        rc = qr_model_loss_grad(t.model, (const float *const *)t.params, t.grads, t.bx, t.by,
                                o->batch_size, &loss);
        if (rc) break;
        loss_avg = isnan(loss_avg) ? loss : 0.95 * loss_avg + 0.05 * loss;
        rc = qr_worker_push(t.worker, t.nparams, t.ids, (const float *const *)t.grads,
                            QR_PUSH_STEP, &step);
        if (rc) break;
        res->local_steps++;
        double now = qr__now_sec();
        if (chief && !o->quiet && now - last_print > (tty ? 0.2 : 5.0)) {
            print_progress(tty, step, total, loss_avg,
                           (double)step * o->batch_size / (now - start), false);
            last_print = now;
        }
        if (step >= total) break;
    }
    /* Another worker's chief ended the run: not an error for this one. */
    if (rc == QR_ESTOPPED && !chief) rc = QR_OK;
    res->wall_seconds = qr__now_sec() - start;
    res->global_step = step;
    res->examples_per_sec = (double)step * o->batch_size / res->wall_seconds;
    if (!rc && chief) {
        if (!o->quiet)
            print_progress(tty, step, total, loss_avg, res->examples_per_sec, true);
        rc = qr_worker_pull(t.worker, 0, NULL, NULL);
        if (!rc)
            rc = qr_model_evaluate(t.model, (const float *const *)t.params, &t.test,
                                   &res->test_accuracy, &res->test_loss);
        res->params_digest = params_digest(t.worker, t.nparams);
        int stop_rc = qr_worker_stop_cluster(t.worker);
        if (!rc) rc = stop_rc;
        if (!rc) print_summary(o, cfg, qr_cluster_num_ps(cluster), qr_cluster_num_workers(cluster), res);
    }
    if (rc) qr__error_prefix("worker %d: ", task_index);
    trainer_free(&t);
    return rc;
}

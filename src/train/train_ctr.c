/*
 * train_ctr.c - a worker training a click-prediction model (model/ctr.h)
 * on click data (data/ctr.h), its embeddings as tables on the ps tier
 * (docs/EMBEDDINGS.md).
 *
 * A step: pull the dense variables, sample a batch, pull the rows of its
 * features from each table (qr_worker_pull_rows: each distinct id once,
 * from the ps that holds it), compute the loss and the gradients, add the
 * row gradients (qr_worker_add_rows sums them by id) and push them with the
 * dense gradients: async, the push advances the global step; sync, it is
 * one member of the step's quorum for every variable, then a token. The
 * chief evaluates the test set at the end (reading rows without adding
 * those of ids never trained on) and reports AUC and log loss.
 */
#include "train/train_internal.h"

#include "common/config.h"
#include "data/ctr.h"
#include "model/ctr.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TABLES 2

typedef struct ctr_run {
    const qr_train_opts *o;
    int task_index;
    bool chief, sync;
    qr_ctr_dataset train, test;
    qr_ctr_model *model;
    qr_worker *w;
    int ntables, ndense;
    int table_id[MAX_TABLES], table_dim[MAX_TABLES];
    int *dense_id;
    float **dense, **dense_grad;
    float **dense_sum;     /* --accumulate k: the batches' dense gradients / k so far */
    int pending;           /* ... and how many batches they hold */
    /* the batch, gathered */
    int64_t *row_ptr, *ids;
    int32_t *field;
    float *val, *label, *prob;
    int64_t cap_nnz, cur_nnz;
    float *rows[MAX_TABLES], *row_grad[MAX_TABLES];
    qr_rng rng;
    uint64_t drawn;
    int batches;
    int64_t step, total;
    double loss_avg;
} ctr_run;

bool qr__train_is_ctr(const char *model) {
    return model && (!strcmp(model, "logreg") || !strcmp(model, "wide-deep"));
}

static void run_free(ctr_run *r) {
    qr_worker_free(r->w);
    qr_ctr_model_free(r->model);
    qr_ctr_dataset_free(&r->train);
    qr_ctr_dataset_free(&r->test);
    for (int i = 0; i < r->ndense; i++) free(r->dense_grad ? r->dense_grad[i] : NULL);
    for (int i = 0; i < r->ndense; i++) free(r->dense_sum ? r->dense_sum[i] : NULL);
    free(r->dense_grad);
    free(r->dense_sum);
    free(r->dense);
    free(r->dense_id);
    for (int j = 0; j < MAX_TABLES; j++) {
        free(r->rows[j]);
        free(r->row_grad[j]);
    }
    free(r->row_ptr);
    free(r->ids);
    free(r->field);
    free(r->val);
    free(r->label);
    free(r->prob);
}

/* Room for a batch of nnz features. */
static int reserve(ctr_run *r, int64_t nnz) {
    if (nnz <= r->cap_nnz) return QR_OK;
    int64_t cap = QR_MAX(nnz, 2 * r->cap_nnz);
    free(r->ids);
    free(r->field);
    free(r->val);
    r->ids = malloc((size_t)cap * sizeof *r->ids);
    r->field = malloc((size_t)cap * sizeof *r->field);
    r->val = malloc((size_t)cap * sizeof *r->val);
    int rc = r->ids && r->field && r->val ? QR_OK : QR_ENOMEM;
    for (int j = 0; j < r->ntables && !rc; j++) {
        free(r->rows[j]);
        free(r->row_grad[j]);
        r->rows[j] = malloc((size_t)cap * (size_t)r->table_dim[j] * sizeof(float));
        r->row_grad[j] = malloc((size_t)cap * (size_t)r->table_dim[j] * sizeof(float));
        if (!r->rows[j] || !r->row_grad[j]) rc = QR_ENOMEM;
    }
    if (rc) return qr__fail(QR_ENOMEM, "out of memory for a batch of %lld features",
                            (long long)nnz);
    r->cap_nnz = cap;
    return QR_OK;
}

/* Examples pick[0..n) of d, gathered into the batch arrays. */
static int gather(ctr_run *r, const qr_ctr_dataset *d, const int64_t *pick, int n) {
    int64_t nnz = 0;
    for (int i = 0; i < n; i++) nnz += d->row_ptr[pick[i] + 1] - d->row_ptr[pick[i]];
    int rc = reserve(r, nnz);
    if (rc) return rc;
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        int64_t a = d->row_ptr[pick[i]], b = d->row_ptr[pick[i] + 1];
        r->row_ptr[i] = at;
        memcpy(r->ids + at, d->id + a, (size_t)(b - a) * sizeof *r->ids);
        memcpy(r->field + at, d->field + a, (size_t)(b - a) * sizeof *r->field);
        memcpy(r->val + at, d->val + a, (size_t)(b - a) * sizeof *r->val);
        r->label[i] = d->label[pick[i]];
        at += b - a;
    }
    r->row_ptr[n] = at;
    r->cur_nnz = at;
    return QR_OK;
}

/* The rows of the batch's features from every table. */
static int pull_rows(ctr_run *r, unsigned flags) {
    for (int j = 0; j < r->ntables; j++) {
        int rc = qr_worker_pull_rows(r->w, r->table_id[j], r->cur_nnz, r->ids, r->rows[j], flags);
        if (rc) return rc;
    }
    return QR_OK;
}

static qr_ctr_batch batch_of(const ctr_run *r, int n) {
    return (qr_ctr_batch){.n = n, .row_ptr = r->row_ptr, .field = r->field, .val = r->val,
                          .label = r->label};
}

/* Worker w's batch generator: the same stream after a restart. */
static void sample(ctr_run *r, int64_t *pick, int n) {
    r->drawn++;
    for (int i = 0; i < n; i++) pick[i] = (int64_t)qr_rng_below(&r->rng, (uint64_t)r->train.n);
}

/* A variable's optimizer options: those --var-opt gives it, else the
 * model's own when it trains with them (cli_click_defaults: Adagrad at
 * 0.3, wide-deep's embedding table at 0.05, whatever the ps was started
 * with), else none (the ps's). */
static const char *var_opts(const ctr_run *r, const char *name) {
    const char *given = qr__train_var_opts_of(r->o, name);
    if (given[0] || !r->o->model_optimizer) return given;
    if (!strcmp(r->o->model, "wide-deep") && !strcmp(name, "embedding"))
        return "optimizer=adagrad,lr=0.05";
    return "optimizer=adagrad,lr=0.3";
}

static int declare(ctr_run *r) {
    r->ntables = qr_ctr_model_num_tables(r->model);
    r->ndense = qr_ctr_model_num_dense(r->model);
    r->dense_id = qr__calloc((size_t)r->ndense, sizeof *r->dense_id);
    r->dense = qr__calloc((size_t)r->ndense, sizeof *r->dense);
    r->dense_grad = qr__calloc((size_t)r->ndense, sizeof *r->dense_grad);
    if (!r->dense_id || !r->dense || !r->dense_grad) return QR_ENOMEM;
    for (int j = 0; j < r->ntables; j++) {
        const char *name, *init;
        qr_ctr_model_table_info(r->model, j, &name, &r->table_dim[j], &init);
        /* a table's seed: past any dense variable's */
        int rc = qr_worker_declare_table(r->w, name, r->table_dim[j], init,
                                         qr__train_param_seed(r->o, 100 + j),
                                         var_opts(r, name), &r->table_id[j]);
        if (rc) return rc;
    }
    for (int i = 0; i < r->ndense; i++) {
        const char *name, *init;
        int ndim;
        int64_t shape[2];
        qr_ctr_model_dense_info(r->model, i, &name, &ndim, shape, &init);
        int rc = qr_worker_declare_opts(r->w, name, ndim, shape, init,
                                        qr__train_param_seed(r->o, i),
                                        var_opts(r, name), &r->dense_id[i]);
        if (!rc && r->o->wire_dtype != QR_FLOAT32)
            rc = qr_worker_set_dtype(r->w, r->dense_id[i], r->o->wire_dtype, QR_FLOAT32);
        if (rc) return rc;
        r->dense_grad[i] = qr__aligned_alloc((size_t)qr_worker_var_size(r->w, r->dense_id[i]) *
                                             sizeof(float));
        if (!r->dense_grad[i]) return QR_ENOMEM;
    }
    return QR_OK;
}

static int setup(ctr_run *r, const qr_cluster *cluster, const qr_config *cfg) {
    const qr_train_opts *o = r->o;
    int rc = qr__config_check_mode(cfg);
    if (!rc && o->local_steps > 1)
        rc = qr__fail(QR_EINVAL, "--local-steps is not for click models yet (--accumulate is)");
    if (!rc) rc = qr_ctr_load(o->data, &r->train, &r->test);
    if (!rc)
        rc = qr_ctr_model_create(&r->model, o->model, r->train.nfields, o->embedding_dim,
                                 o->hidden, !strcmp(o->model, "wide-deep") ? o->nhidden : 0,
                                 o->batch_size);
    int B = o->batch_size;
    r->row_ptr = qr__calloc((size_t)B + 1, sizeof *r->row_ptr);
    r->label = qr__calloc((size_t)B, sizeof *r->label);
    r->prob = qr__calloc((size_t)B, sizeof *r->prob);
    if (!rc && (!r->row_ptr || !r->label || !r->prob)) rc = QR_ENOMEM;
    if (!rc) rc = qr_worker_create(&r->w, cluster, r->task_index, cfg);
    if (!rc) rc = declare(r);
    if (!rc && r->sync && o->accumulate > 1)
        rc = qr__fail(QR_EINVAL, "--accumulate is for --mode async (as for the dense models)");
    /* A step is a push: of k batches with --accumulate k. */
    r->batches = r->sync ? qr__train_sync_replicas(cfg, qr_cluster_num_workers(cluster))
                         : QR_MAX(o->accumulate, 1);
    r->total = qr__train_total_steps(o, r->train.n, r->batches);
    if (!rc && r->chief) rc = qr_worker_set_step_limit(r->w, r->total);
    if (!rc) rc = qr_worker_initialize(r->w);
    for (int i = 0; !rc && i < r->ndense; i++) r->dense[i] = qr_worker_var_data(r->w, r->dense_id[i]);
    if (!rc && o->accumulate > 1) {
        r->dense_sum = qr__calloc((size_t)r->ndense, sizeof *r->dense_sum);
        if (!r->dense_sum) rc = QR_ENOMEM;
        for (int i = 0; !rc && i < r->ndense; i++) {
            r->dense_sum[i] = qr__aligned_alloc((size_t)qr_worker_var_size(r->w, r->dense_id[i]) *
                                                sizeof(float)); /* zeroed */
            if (!r->dense_sum[i]) rc = QR_ENOMEM;
        }
    }
    qr__train_worker_rng(&r->rng, o, r->task_index);
    uint64_t position = 0;
    if (!rc) rc = qr_worker_data_position(r->w, &position);
    if (!rc) qr__train_skip_batches(&r->rng, B, r->train.n, position);
    r->drawn = position;
    if (!rc && r->sync) rc = qr_worker_local_step(r->w, &r->step);
    return rc;
}

static int train_step(ctr_run *r, int64_t *pick, qr_train_result *res) {
    int B = r->o->batch_size;
    int rc = qr_worker_wait_bound(r->w);
    if (!rc) rc = qr_worker_pull(r->w, 0, NULL, NULL);
    sample(r, pick, B);
    if (!rc) rc = gather(r, &r->train, pick, B);
    if (!rc) rc = pull_rows(r, 0);
    double loss = 0;
    qr_ctr_batch b = batch_of(r, B);
    if (!rc)
        rc = qr_ctr_model_run(r->model, &b, (const float *const *)r->dense,
                              (const float *const *)r->rows, r->dense_grad, r->row_grad, &loss,
                              NULL);
    /* --accumulate k: the push is the mean of k batches' gradients. Rows
     * added with qr_worker_add_rows are summed by id until the push, so
     * each batch's are added divided by k; the dense ones are summed here. */
    int k = QR_MAX(r->o->accumulate, 1);
    float scale = 1.0f / (float)k;
    for (int j = 0; j < r->ntables && !rc; j++) {
        if (k > 1)
            for (int64_t e = 0; e < r->cur_nnz * r->table_dim[j]; e++) r->row_grad[j][e] *= scale;
        rc = qr_worker_add_rows(r->w, r->table_id[j], r->cur_nnz, r->ids, r->row_grad[j]);
    }
    if (rc) return rc;
    r->loss_avg = qr__train_smooth_loss(r->loss_avg, loss);
    qr__train_slow_down(r->o, r->task_index);
    float **push_grad = r->dense_grad;
    if (k > 1) {
        for (int i = 0; i < r->ndense; i++) {
            int64_t n = qr_worker_var_size(r->w, r->dense_id[i]);
            for (int64_t e = 0; e < n; e++) r->dense_sum[i][e] += scale * r->dense_grad[i][e];
        }
        res->local_steps++;
        if (++r->pending < k) return QR_OK; /* not yet a push */
        r->pending = 0;
        push_grad = r->dense_sum;
        res->local_steps--; /* counted once below */
    }
    qr_worker_set_data_position(r->w, r->drawn);
    int64_t global = 0;
    rc = qr_worker_push(r->w, r->ndense, r->dense_id, (const float *const *)push_grad,
                        QR_PUSH_STEP, &global);
    for (int i = 0; k > 1 && i < r->ndense; i++)
        memset(r->dense_sum[i], 0, (size_t)qr_worker_var_size(r->w, r->dense_id[i]) * sizeof(float));
    return qr__train_after_push(r->w, rc, r->sync, global, &r->step, res);
}

static int train_steps(ctr_run *r, qr_train_result *res, double start) {
    int64_t *pick = malloc((size_t)r->o->batch_size * sizeof *pick);
    if (!pick) return QR_ENOMEM;
    int rc = QR_OK;
    while (!rc && r->step < r->total) {
        rc = train_step(r, pick, res);
        if (!rc) qr__train_report(r->o, r->step, r->total, r->loss_avg, start, false, 0);
    }
    free(pick);
    return rc;
}

/* The chief: AUC, log loss and accuracy on the test set, read-only. */
static int evaluate(ctr_run *r, qr_train_result *res) {
    int rc = qr_worker_pull(r->w, 0, NULL, NULL);
    int64_t n = r->test.n;
    float *prob = malloc((size_t)QR_MAX(n, 1) * sizeof *prob);
    int64_t *pick = malloc((size_t)r->o->batch_size * sizeof *pick);
    if (!prob || !pick) rc = QR_ENOMEM;
    for (int64_t first = 0; first < n && !rc; first += r->o->batch_size) {
        int count = (int)QR_MIN(r->o->batch_size, n - first);
        for (int i = 0; i < count; i++) pick[i] = first + i;
        rc = gather(r, &r->test, pick, count);
        if (!rc) rc = pull_rows(r, QR_ROWS_READ_ONLY);
        qr_ctr_batch b = batch_of(r, count);
        if (!rc)
            rc = qr_ctr_model_run(r->model, &b, (const float *const *)r->dense,
                                  (const float *const *)r->rows, NULL, NULL, NULL, prob + first);
    }
    if (!rc) {
        res->test_auc = qr_auc(prob, r->test.label, n);
        res->test_logloss = qr_logloss(prob, r->test.label, n);
        res->test_loss = res->test_logloss;
        int64_t right = 0;
        for (int64_t i = 0; i < n; i++) right += (prob[i] >= 0.5f) == (r->test.label[i] > 0.5f);
        res->test_accuracy = n ? (double)right / (double)n : 0;
        uint64_t h = QR_FNV_INIT;
        for (int i = 0; i < r->ndense; i++)
            h = qr__fnv1a(r->dense[i], (size_t)qr_worker_var_size(r->w, r->dense_id[i]) * 4, h);
        /* and the rows of the test set's first batch, as trained */
        res->params_digest = h;
    }
    free(prob);
    free(pick);
    return rc;
}

static ctr_run new_run(const qr_train_opts *o, int task_index, const qr_config *cfg) {
    return (ctr_run){.o = o, .task_index = task_index, .chief = task_index == 0,
                     .sync = !strcmp(qr__config_str(cfg, "mode"), "sync"), .loss_avg = NAN};
}

int qr__train_ctr_worker(const qr_cluster *cluster, int task_index, const qr_config *cfg,
                         const qr_train_opts *o, qr_train_result *res) {
    ctr_run r = new_run(o, task_index, cfg);
    int rc = setup(&r, cluster, cfg);
    bool joined = !rc;
    double start = qr__now_sec();
    if (!rc) rc = qr__train_wait_end(r.w, r.chief, train_steps(&r, res, start));
rejoin:
    while (rc == QR_EROLLEDBACK) {
        qr__log(QR_LOG_INFO, "rejoining the cluster at its checkpoint");
        double loss = r.loss_avg;
        run_free(&r);
        r = new_run(o, task_index, cfg);
        r.loss_avg = loss;
        /* One rollback counts once: one met while rejoining is the same
         * rollback settling (a ps that had not rolled back yet). */
        res->rollbacks += joined;
        rc = setup(&r, cluster, cfg);
        joined = !rc;
        if (!rc) rc = qr__train_wait_end(r.w, r.chief, train_steps(&r, res, start));
    }
    rc = qr__train_steps_ended(o, rc, r.chief, r.step, r.total, r.batches, r.loss_avg, start,
                               res);
    if (!rc && r.chief) {
        rc = evaluate(&r, res);
        /* A ps restarted while the chief finished: the cluster rolled back
         * to a checkpoint before the end; train on from there (the cluster
         * is not stopped). */
        if (rc == QR_EROLLEDBACK) goto rejoin;
        if (!rc) rc = qr_worker_stats(r.w, res->stats, sizeof res->stats);
        int stop_rc = qr_worker_stop_cluster(r.w);
        if (!rc) rc = stop_rc;
    }
    if (rc) qr__error_prefix("worker %d: ", task_index);
    run_free(&r);
    return rc;
}

/*
 * declare.c - a worker's variables: declare them (dense, from given
 * values, or embedding tables), place them on the ps tasks, and initialize
 * the cluster with them (qr_worker_initialize), and what the caller may
 * ask of them afterwards (size, data, placement).
 *
 * Every worker declares the same variables in the same order and computes
 * the same placement. At initialize the chief (worker 0) fills the dense
 * variables and creates them on their ps tasks, then marks the cluster
 * ready on ps 0; every other worker waits for that and checks its
 * declarations against the ps tasks'.
 */
#include "worker/worker_internal.h"

#include "cluster/placement.h"
#include "common/init.h"
#include "common/table_options.h"
#include "optim/optim.h"
#include "worker/heartbeat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int declare_variable(qr_worker *w, const char *name, int ndim, const int64_t *shape,
                            const char *init, uint64_t seed, float lr, const char *options,
                            bool table, int *var_id);

/* ---- declare ------------------------------------------------------------- */

int qr_worker_declare(qr_worker *w, const char *name, int ndim, const int64_t *shape,
                      const char *init, uint64_t seed, float lr, int *var_id) {
    return declare_variable(w, name, ndim, shape, init, seed, lr, "", false, var_id);
}

int qr_worker_declare_opts(qr_worker *w, const char *name, int ndim, const int64_t *shape,
                           const char *init, uint64_t seed, const char *options, int *var_id) {
    return declare_variable(w, name, ndim, shape, init, seed, -1.0f, options ? options : "",
                            false, var_id);
}

int qr_worker_declare_table(qr_worker *w, const char *name, int64_t dim, const char *init,
                            uint64_t seed, const char *options, int *var_id) {
    if (!w || !name) return qr__fail(QR_EINVAL, "declare_table: worker and name are required");
    if (dim < 1 || dim > QR_WORKER_MAX_TABLE_DIM)
        return qr__fail(QR_ESHAPE, "declare_table '%s': dim %lld (1..%d allowed)", name,
                        (long long)dim, QR_WORKER_MAX_TABLE_DIM);
    if (!init) init = "zeros";
    if (strlen(init) > QR_MSG_MAX_INIT)
        return qr__fail(QR_EINVAL, "declare_table '%s': initializer of more than %d bytes",
                        name, QR_MSG_MAX_INIT);
    int id;
    int rc = declare_variable(w, name, 1, &dim, init, seed, -1.0f, options ? options : "", true,
                              &id);
    if (rc) return rc;
    if (var_id) *var_id = id;
    return QR_OK;
}

/* A variable's options are its optimizer's, and partitions=N, which is the
 * worker's (placement) and never reaches the ps: split it off. */
static int take_partitions(const char *options, char *rest, size_t restsz, int *wanted) {
    if (strlen(options) >= restsz)
        return qr__fail(QR_EINVAL, "variable options are longer than %zu bytes", restsz - 1);
    rest[0] = 0;
    *wanted = 0;
    const char *item = options;
    while (*item) {
        size_t len = strcspn(item, ",");
        static const char key[] = "partitions=";
        if (len >= sizeof key - 1 && !strncmp(item, key, sizeof key - 1)) {
            char value[32] = "";
            size_t vlen = len - (sizeof key - 1);
            memcpy(value, item + sizeof key - 1, QR_MIN(vlen, sizeof value - 1));
            char *end = NULL;
            long n = strtol(value, &end, 10);
            if (!vlen || vlen >= sizeof value || *end || n < 1 || n > 65536)
                return qr__fail(QR_EINVAL, "partitions=%.*s: want a whole number of shards "
                                "from 1 to 65536", (int)vlen, item + sizeof key - 1);
            *wanted = (int)n;
        } else if (len) {
            size_t at = strlen(rest);
            snprintf(rest + at, restsz - at, "%s%.*s", at ? "," : "", (int)len, item);
        }
        item += len + (item[len] == ',');
    }
    return QR_OK;
}

int qr_worker_declare_values(qr_worker *w, const char *name, int ndim, const int64_t *shape,
                             const float *values, int64_t n, const char *options, int *var_id) {
    if (!values) return qr__fail(QR_EINVAL, "declare_values '%s': values is NULL",
                                 name ? name : "?");
    int id;
    int rc = declare_variable(w, name, ndim, shape, "zeros", 0, -1.0f, options ? options : "",
                              false, &id);
    if (rc) return rc;
    wk_var *v = &w->vars[id];
    if (n != v->n) {
        /* Undo the declaration: the caller may declare it again, right. */
        free(v->name);
        free(v->init);
        free(v->options);
        free(v->data);
        w->nvars--;
        return qr__fail(QR_ESHAPE, "declare_values '%s': %lld values for a shape of %lld "
                        "elements", name, (long long)n, (long long)v->n);
    }
    memcpy(v->data, values, (size_t)n * sizeof *values);
    v->given = true;
    if (var_id) *var_id = id;
    return QR_OK;
}

/* Declare a variable (dense, or a table). */
static int declare_variable(qr_worker *w, const char *name, int ndim, const int64_t *shape,
                            const char *init, uint64_t seed, float lr, const char *options,
                            bool table, int *var_id) {
    if (!w || !name || !shape)
        return qr__fail(QR_EINVAL, "qr_worker_declare: worker, name and shape are required");
    if (w->placed)
        return qr__fail(QR_EINVAL, "declare '%s': variables must be declared before "
                        "qr_worker_initialize", name);
    size_t len = strlen(name);
    if (len < 1 || len > QR_PROTO_MAX_NAME)
        return qr__fail(QR_EINVAL, "declare: name '%s' must have 1 to %d bytes", name,
                        QR_PROTO_MAX_NAME);
    if (ndim < 1 || ndim > QR_PROTO_MAX_NDIM)
        return qr__fail(QR_EINVAL, "declare '%s': %d dimensions (1..%d allowed)", name, ndim,
                        QR_PROTO_MAX_NDIM);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1 || shape[d] > (1ll << 34) / n)
            return qr__fail(QR_ESHAPE, "declare '%s': dimension %d is %lld (must be >= 1 and "
                            "the whole variable at most 2^34 elements)", name, d,
                            (long long)shape[d]);
        n *= shape[d];
    }
    if (!init) init = "zeros";
    int rc = qr_init_validate(init);
    if (rc) return qr__fail(rc, "declare '%s': %s", name, qr_last_error());
    char optim_options[1025];
    int want_parts = 0;
    rc = take_partitions(options, optim_options, sizeof optim_options, &want_parts);
    if (!rc && want_parts && table)
        rc = qr__fail(QR_EINVAL, "a table is spread over every ps by id already; partitions= "
                      "is for dense variables");
    qr_table_options table_options;
    if (!rc) rc = qr_table_options_parse(optim_options, &table_options);
    if (!rc && !table && qr_table_options_set(&table_options))
        rc = qr__fail(QR_EINVAL, "admit_after and evict_after_steps are for embedding tables "
                      "(declare_table)");
    bool trainable = true;
    if (!rc) rc = qr_var_options_trainable(optim_options, &trainable);
    if (!rc && !trainable && table)
        rc = qr__fail(QR_EINVAL, "trainable=false is for dense variables, not tables");
    if (rc) return qr__fail(rc, "declare '%s': %s", name, qr_last_error());
    options = optim_options;
    if (options[0]) {
        /* Checked here, where the caller can fix it; the ps checks again. */
        qr_optim *check = NULL;
        rc = qr_optim_create_for_var(&check, w->cfg, options);
        qr_optim_free(check);
        if (rc) return qr__fail(rc, "declare '%s': %s", name, qr_last_error());
    }
    for (int i = 0; i < w->nvars; i++)
        if (!strcmp(w->vars[i].name, name))
            return qr__fail(QR_EEXIST, "declare: variable '%s' is declared twice", name);
    if (w->nvars == w->vars_cap) {
        int cap = w->vars_cap ? w->vars_cap * 2 : 16;
        wk_var *grown = realloc(w->vars, (size_t)cap * sizeof *grown);
        if (!grown) return qr__fail(QR_ENOMEM, "out of memory declaring '%s'", name);
        w->vars = grown;
        w->vars_cap = cap;
    }
    wk_var *v = &w->vars[w->nvars];
    memset(v, 0, sizeof *v);
    v->name = qr__strdup(name);
    v->init = qr__strdup(init);
    v->options = qr__strdup(options);
    v->table = table;
    v->want_parts = want_parts;
    if (table) n = 0; /* its rows live on the ps tasks only */
    v->data = table ? NULL : qr__aligned_alloc((size_t)n * sizeof(float));
    if (!v->name || !v->init || !v->options || (!table && !v->data)) {
        free(v->name);
        free(v->init);
        free(v->options);
        free(v->data);
        return QR_ENOMEM;
    }
    v->ndim = ndim;
    memcpy(v->shape, shape, (size_t)ndim * sizeof *shape);
    v->n = n;
    v->seed = seed;
    v->lr = lr;
    v->push_lr = QR_MSG_PUSH_LR_NONE;
    if (var_id) *var_id = w->nvars;
    w->nvars++;
    return QR_OK;
}

/* ---- placement and initialize ------------------------------------------- */

/* Split dense variable v into nparts shards along dimension 0. */
static int make_parts(wk_var *v, int nparts) {
    v->parts = qr__calloc((size_t)nparts, sizeof *v->parts);
    if (!v->parts) return QR_ENOMEM;
    v->nparts = nparts;
    int64_t row = v->n / v->shape[0], at = 0;
    for (int k = 0; k < nparts; k++) {
        int64_t rows = qr_partition_rows(v->shape[0], nparts, k);
        v->parts[k] = (wk_part){.ps = -1, .offset = at * row, .n = rows * row};
        at += rows;
    }
    char shard_name[16];
    int len = snprintf(shard_name, sizeof shard_name, "/part_%d", nparts - 1);
    if (nparts > 1 && strlen(v->name) + (size_t)len > QR_PROTO_MAX_NAME)
        return qr__fail(QR_EINVAL, "'%s' in %d shards: the shard names (NAME/part_K) would "
                        "have more than %d bytes", v->name, nparts, QR_PROTO_MAX_NAME);
    return QR_OK;
}

/* Which ps holds what: a table every ps (by id); a dense variable one ps,
 * or, partitioned, one shard on each of several, by least-loaded greedy
 * placement in declaration order (cluster/placement.h). Every worker
 * computes the same from the same declarations and options. */
static int place_variables(qr_worker *w) {
    if (w->placed) return QR_OK;
    double min_mb = qr__config_float(w->cfg, "partition-min-mb");
    int rc = QR_OK, nshards = 0;
    for (int i = 0; !rc && i < w->nvars; i++) {
        wk_var *v = &w->vars[i];
        if (v->table) continue;
        int n = qr_partition_count(v->n * 4, v->shape[0], w->nps, min_mb, v->want_parts);
        if (n < 0) rc = qr__fail(n, "'%s': %s", v->name, qr_last_error());
        if (!rc) rc = make_parts(v, n);
        nshards += v->nparts;
    }
    int64_t *bytes = rc ? NULL : qr__calloc((size_t)QR_MAX(nshards, 1), sizeof *bytes);
    int *group = rc ? NULL : qr__calloc((size_t)QR_MAX(nshards, 1), sizeof *group);
    int *ps_of = rc ? NULL : qr__calloc((size_t)QR_MAX(nshards, 1), sizeof *ps_of);
    if (!rc && (!bytes || !group || !ps_of)) rc = QR_ENOMEM;
    for (int i = 0, s = 0; !rc && i < w->nvars; i++)
        for (int k = 0; k < w->vars[i].nparts; k++, s++) {
            bytes[s] = w->vars[i].parts[k].n * 4;
            group[s] = i;
        }
    if (!rc) rc = qr_place_shards(w->nps, nshards, bytes, group, ps_of);
    for (int i = 0, s = 0; !rc && i < w->nvars; i++) {
        wk_var *v = &w->vars[i];
        char where[256] = "";
        for (int k = 0; k < v->nparts; k++) {
            v->parts[k].ps = ps_of[s++];
            size_t at = strlen(where);
            snprintf(where + at, sizeof where - at, "%s%d", k ? ", " : "", v->parts[k].ps);
        }
        if (v->nparts > 1 && w->index == 0)
            qr__log(QR_LOG_INFO, "'%s' (%.2f MiB) is partitioned in %d shards of dimension 0 "
                    "on ps %s", v->name, (double)v->n * 4 / 1048576.0, v->nparts, where);
    }
    free(bytes);
    free(group);
    free(ps_of);
    if (!rc) w->placed = true;
    return rc;
}

/* One CREATE per ps that holds variables: with values (chief) or as a
 * check of the declarations (everyone else). */
static int create_on_ps(qr_worker *w, bool check_only) {
    wk_request **reqs = qr__calloc((size_t)w->nps, sizeof *reqs);
    if (!reqs) return QR_ENOMEM;
    int rc = QR_OK, nreq = 0;
    for (int p = 0; p < w->nps && !rc; p++) {
        int count = 0;
        for (int i = 0; i < w->nvars; i++)
            count += w->vars[i].table || wk_part_on(&w->vars[i], p) != NULL;
        if (!count) continue;
        wk_request *r = wk_request_new(w, p, QR_MSG_CREATE);
        if (!r) {
            rc = QR_ENOMEM;
            break;
        }
        reqs[nreq++] = r;
        r->flags = check_only ? QR_CREATE_CHECK_ONLY : 0;
        r->payload = check_only ? NULL : qr__calloc((size_t)count, sizeof *r->payload);
        qr_msg_put_count(&r->meta, (uint32_t)count);
        for (int i = 0; i < w->nvars; i++) {
            wk_var *v = &w->vars[i];
            wk_part *part = wk_part_on(v, p);
            if (!part && !v->table) continue;
            /* A shard is a variable of its own on its ps: NAME/part_K, its
             * rows of dimension 0 (TensorFlow's names for them). */
            char shard_name[QR_PROTO_MAX_NAME + 1];
            const char *name = v->name;
            if (v->nparts > 1) {
                snprintf(shard_name, sizeof shard_name, "%s/part_%d", v->name,
                         (int)(part - v->parts));
                name = shard_name;
            }
            qr_msg_create_var rec = {.id = (uint32_t)i, .ndim = (uint32_t)v->ndim, .lr = v->lr,
                                     .name_len = (uint32_t)strlen(name), .name = name,
                                     .options_len = (uint32_t)strlen(v->options),
                                     .options = v->options};
            memcpy(rec.shape, v->shape, (size_t)v->ndim * sizeof *rec.shape);
            if (part) rec.shape[0] = part->n / (v->n / v->shape[0]);
            if (v->table) {
                rec.kind = QR_VAR_TABLE;
                rec.init = v->init;
                rec.init_len = (uint32_t)strlen(v->init);
                rec.seed = v->seed;
            }
            qr_msg_put_create_var(&r->meta, &rec);
            if (!check_only && r->payload && !v->table)
                r->payload[r->npayload++] = (qr_iov){v->data + part->offset, (size_t)part->n * 4};
        }
        if (r->meta.oom || (!check_only && !r->payload)) rc = QR_ENOMEM;
    }
    if (!rc) rc = wk_run_requests(w, reqs, nreq, w->timeout_ms);
    wk_free_requests(reqs, nreq);
    free(reqs);
    return rc;
}

static int ready_request(qr_worker *w, bool set, uint32_t *ready, int timeout_ms) {
    wk_request *r = wk_request_new(w, 0, QR_MSG_READY);
    if (!r) return QR_ENOMEM;
    qr_msg_put_ready(&r->meta, &(qr_msg_ready){.set = set, .step = w->step_limit});
    int rc = wk_run_requests(w, &r, 1, timeout_ms);
    if (ready) *ready = r->ready;
    if (!rc) w->local_step = r->step;
    if (!rc) w->restored_pos = r->data_pos;
    wk_request_free(r);
    return rc;
}

/* Ask ps 0 until the cluster is ready: the chief marks it so (ps 0 says
 * ready once every ps is in step with it), the others wait for that. The
 * wait is bounded by init-timeout-ms and said every few seconds, naming
 * what it waits for: ps 0 itself, or the chief. */
static int wait_ready(qr_worker *w, bool set) {
    int init_ms = (int)qr__config_int(w->cfg, "init-timeout-ms");
    uint64_t start = qr__now_ns(), deadline = start + (uint64_t)init_ms * 1000000ull;
    uint64_t next_report = start + WK_WAIT_REPORT_NS;
    bool reached = false;
    for (;;) {
        uint64_t now = qr__now_ns();
        int left_ms = (int)QR_MAX(1, (int64_t)(deadline - QR_MIN(deadline, now)) / 1000000);
        uint32_t ready = 0;
        /* Until ps 0 is first reached, the request itself waits for it
         * (connecting with backoff) up to the whole init-timeout-ms, so
         * that what it says of its wait names that deadline. */
        int rc = ready_request(w, set, &ready, reached ? QR_MIN(w->timeout_ms, left_ms) : left_ms);
        if (rc && rc != QR_EPEERLOST && rc != QR_ETIMEDOUT) return rc;
        reached |= !rc;
        if (!rc && ready) return QR_OK;
        now = qr__now_ns();
        const char *waiting_for = !reached ? "ps 0 to answer"
                                  : set ? "every ps task to be in step with ps 0"
                                        : "the chief (worker 0) to initialize the variables";
        if (now >= deadline) {
            if (!reached)
                return qr__fail(QR_ETIMEDOUT, "ps 0 (%s) could not be reached within %d ms "
                                "(init-timeout-ms)%s%s", w->cluster->ps[0], init_ms,
                                w->links[0].last_error[0] ? "; last error: " : "",
                                w->links[0].last_error);
            return qr__fail(QR_ENOTREADY, "waited %.0f s (init-timeout-ms) for %s; ps 0 "
                            "answers, but the cluster is not ready", (double)(now - start) / 1e9,
                            waiting_for);
        }
        if (now >= next_report) {
            qr__log(QR_LOG_INFO, "waiting for %s: %.0f s so far, giving up after %.0f s",
                    waiting_for, (double)(now - start) / 1e9, init_ms / 1e3);
            next_report += WK_WAIT_REPORT_NS;
        }
        nanosleep(&(struct timespec){0, 20 * 1000000}, NULL);
    }
}

int qr_worker_initialize(qr_worker *w) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_initialize: worker is NULL");
    if (w->nvars == 0) return qr__fail(QR_EINVAL, "initialize: no variables were declared");
    int rc = place_variables(w);
    if (rc) return rc;
    if (w->index == 0) {
        for (int i = 0; i < w->nvars && !rc; i++) {
            wk_var *v = &w->vars[i];
            if (!v->table && !v->given)
                rc = qr_init_fill(v->data, v->n, v->ndim, v->shape, v->init, v->seed);
        }
        if (!rc) rc = create_on_ps(w, false);
        if (!rc) rc = wait_ready(w, true);
        if (!rc) rc = wk_pull_vars(w, 0, NULL, NULL, 0); /* a restarted chief gets current values */
    } else {
        rc = wait_ready(w, false);
        if (!rc) rc = create_on_ps(w, true);
    }
    /* The caller names the worker (qr_train_worker does): this prefix
     * says which call failed, like the other qr_worker_* messages. */
    if (rc) qr__error_prefix("initialize: ");
    else w->initialized = true;
    int64_t beat_ms = qr__config_int(w->cfg, "heartbeat-ms");
    if (!rc && beat_ms > 0 && !w->heartbeat)
        rc = qr_heartbeat_start(&w->heartbeat, w->cluster->ps[w->links[0].target], /* the coordinator */
                                w->prefer_unix, w->index, (int)beat_ms, w->auth,
                                w->conn_opt.handshake_timeout_ms);
    return rc;
}

/* ---- what the caller may ask of a variable -------------------------------- */

int64_t qr_worker_var_size(const qr_worker *w, int var_id) {
    if (!w || var_id < 0 || var_id >= w->nvars) return -1;
    return w->vars[var_id].n;
}

float *qr_worker_var_data(qr_worker *w, int var_id) {
    if (!w || var_id < 0 || var_id >= w->nvars) return NULL;
    return w->vars[var_id].data;
}

int qr_worker_var_placement(const qr_worker *w, int var_id, int cap, int *ps, int64_t *offset,
                            int64_t *count) {
    if (!w || var_id < 0 || var_id >= w->nvars || cap < 0)
        return qr__fail(QR_EINVAL, "var_placement: bad worker, variable id or cap");
    if (!w->placed)
        return qr__fail(QR_ENOTREADY, "var_placement: call qr_worker_initialize first");
    const wk_var *v = &w->vars[var_id];
    for (int k = 0; k < v->nparts && k < cap; k++) {
        if (ps) ps[k] = v->parts[k].ps;
        if (offset) offset[k] = v->parts[k].offset;
        if (count) count[k] = v->parts[k].n;
    }
    return v->nparts;
}

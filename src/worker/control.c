/*
 * control.c - a worker's control calls: the sync token and steps, the
 * staleness bound, the data position, the learning rate pushes carry
 * (set_lr), statistics summed over every ps,
 * a checkpoint on demand, leaving the run, stopping the cluster, and
 * waiting for the run's end.
 * A call that asks the cluster sends one request to ps 0 (to every ps
 * for statistics and stop) and waits for it in link.c; the others read or
 * set the handle's state.
 */
#include "worker/worker_internal.h"

#include <cjson/cJSON.h>
#include <math.h>

#include <stdlib.h>
#include <string.h>

int qr_worker_take_token(qr_worker *w, int64_t *step) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_take_token: worker is NULL");
    if (!w->sync) return qr__fail(QR_EINVAL, "take_token: this worker trains in async mode");
    if (!w->initialized) return qr__fail(QR_ENOTREADY, "take_token: call qr_worker_initialize first");
    int rc;
    for (int tries = 0;; tries++) {
        wk_request *r = wk_request_new(w, 0, QR_MSG_TOKEN);
        if (!r) return QR_ENOMEM;
        qr_msg_put_worker(&r->meta, (uint32_t)w->index);
        /* A lost connection loses the place its COMMIT took in the token
         * queue, and a coordinator that failed over (docs/REPLICATION.md)
         * takes the role without it: the commit goes again first. One
         * counted already is answered as the original (coord.c). */
        r->once = w->commit_unserved && tries < 8;
        /* ps 0 ends a stalled wait after sync-timeout-ms with its report;
         * this deadline is only the safety net for a ps 0 that cannot
         * answer. */
        rc = wk_run_requests(w, &r, 1, 2 * w->sync_timeout_ms + 5000);
        if (!rc) {
            w->local_step = r->step;
            w->commit_unserved = false;
            if (step) *step = r->step;
        }
        bool lost = r->once && rc == QR_EPEERLOST;
        wk_request_free(r);
        if (!lost) break;
        qr__log(QR_LOG_INFO, "the connection to the coordinator was lost while this worker "
                "waited for a token: its commit of step %lld goes again",
                (long long)w->last_commit.local_step);
        rc = wk_commit(w, NULL);
        if (rc && rc != QR_ESTALE) break;
    }
    return rc;
}

int qr_worker_local_step(const qr_worker *w, int64_t *step) {
    if (!w || !step) return qr__fail(QR_EINVAL, "qr_worker_local_step: bad arguments");
    *step = w->local_step;
    return QR_OK;
}

int qr_worker_set_step_limit(qr_worker *w, int64_t last_step) {
    if (!w || last_step < 0) return qr__fail(QR_EINVAL, "qr_worker_set_step_limit: bad arguments");
    w->step_limit = last_step;
    return QR_OK;
}

int qr_worker_wait_bound(qr_worker *w) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_wait_bound: worker is NULL");
    if (w->sync || w->max_staleness < 0) return QR_OK;
    wk_request *r = wk_request_new(w, 0, QR_MSG_CLOCK);
    if (!r) return QR_ENOMEM;
    qr_msg_put_clock(&r->meta, &(qr_msg_clock){.worker = (uint32_t)w->index,
                                               .clock = w->steps_pushed});
    int rc = wk_run_requests(w, &r, 1, 2 * w->sync_timeout_ms + 5000);
    wk_request_free(r);
    return rc;
}

/* Add the number named key of a ps's statistics to total's. */
static void add_number(cJSON *total, const cJSON *part, const char *key) {
    cJSON *a = cJSON_GetObjectItem(total, key);
    const cJSON *b = cJSON_GetObjectItem(part, key);
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b))
        cJSON_SetNumberValue(a, a->valuedouble + b->valuedouble);
}

/* Sum the arrays named key of every ps's statistics into total[]. */
static void add_array(cJSON *total, const cJSON *part, const char *key) {
    cJSON *a = cJSON_GetObjectItem(total, key);
    const cJSON *b = cJSON_GetObjectItem(part, key);
    if (!cJSON_IsArray(a) || !cJSON_IsArray(b)) return;
    int n = QR_MIN(cJSON_GetArraySize(a), cJSON_GetArraySize(b));
    for (int i = 0; i < n; i++) {
        cJSON *x = cJSON_GetArrayItem(a, i);
        cJSON_SetNumberValue(x, x->valuedouble + cJSON_GetArrayItem(b, i)->valuedouble);
    }
}

/* "tables": {name: {figure: n}} of each ps, summed into total's. */
static void add_tables(cJSON *total, const cJSON *part) {
    const cJSON *tables = cJSON_GetObjectItemCaseSensitive(part, "tables");
    if (!cJSON_IsObject(tables)) return;
    cJSON *into = cJSON_GetObjectItemCaseSensitive(total, "tables");
    if (!into) into = cJSON_AddObjectToObject(total, "tables");
    const cJSON *table;
    cJSON_ArrayForEach(table, tables) {
        cJSON *mine = cJSON_GetObjectItemCaseSensitive(into, table->string);
        if (!mine) {
            cJSON_AddItemToObject(into, table->string, cJSON_Duplicate(table, true));
            continue;
        }
        const cJSON *figure;
        cJSON_ArrayForEach(figure, table) add_number(mine, table, figure->string);
    }
}

int qr_worker_stats(qr_worker *w, char *buf, size_t len) {
    if (!w || !buf || len < 3) return qr__fail(QR_EINVAL, "qr_worker_stats: bad arguments");
    wk_request **reqs = qr__calloc((size_t)w->nps, sizeof *reqs);
    if (!reqs) return QR_ENOMEM;
    int rc = QR_OK;
    for (int p = 0; p < w->nps; p++) {
        reqs[p] = wk_request_new(w, p, QR_MSG_STATS);
        if (!reqs[p]) rc = QR_ENOMEM;
        else reqs[p]->want_meta = true;
    }
    if (!rc) rc = wk_run_requests(w, reqs, w->nps, w->timeout_ms);
    cJSON *total = NULL;
    for (int p = 0; !rc && p < w->nps; p++) {
        cJSON *part = cJSON_ParseWithLength((const char *)reqs[p]->reply_meta,
                                            reqs[p]->reply_meta_len);
        if (!part) {
            rc = qr__fail(QR_EPROTO, "ps %d sent statistics that are not JSON", p);
            break;
        }
        if (!total) {
            total = part;
            cJSON_DeleteItemFromObject(total, "ps");
        } else {
            add_array(total, part, "staleness");
            add_number(total, part, "stale_pushes_applied");
            add_number(total, part, "applied_on_arrival");
            add_number(total, part, "rebased_on_arrival");
            add_number(total, part, "push_bytes");
            add_number(total, part, "pull_bytes");
            add_tables(total, part);
            cJSON_Delete(part);
        }
    }
    if (!rc) {
        char *text = cJSON_PrintUnformatted(total);
        if (!text) rc = QR_ENOMEM;
        else if (strlen(text) + 1 > len)
            rc = qr__fail(QR_ETOOBIG, "statistics need %zu bytes", strlen(text) + 1);
        else
            memcpy(buf, text, strlen(text) + 1);
        free(text);
    }
    cJSON_Delete(total);
    wk_free_requests(reqs, w->nps);
    free(reqs);
    return rc;
}

int qr_worker_global_step(qr_worker *w, int64_t *global_step) {
    if (!w || !global_step) return qr__fail(QR_EINVAL, "qr_worker_global_step: bad arguments");
    wk_request *r = wk_request_new(w, 0, QR_MSG_STEP);
    if (!r) return QR_ENOMEM;
    int rc = wk_run_requests(w, &r, 1, w->timeout_ms);
    if (!rc) *global_step = r->step;
    wk_request_free(r);
    return rc;
}

int qr_worker_set_data_position(qr_worker *w, uint64_t position) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_set_data_position: worker is NULL");
    w->data_pos = position;
    return QR_OK;
}

int qr_worker_set_lr(qr_worker *w, int var_id, float lr) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_set_lr: worker is NULL");
    if (var_id < 0 || var_id >= w->nvars)
        return qr__fail(QR_ENOTFOUND, "set_lr: no variable with id %d (%d declared)", var_id,
                        w->nvars);
    wk_var *v = &w->vars[var_id];
    if (!isfinite(lr))
        return qr__fail(QR_EINVAL, "set_lr: '%s': the learning rate is %g, not a finite number",
                        v->name, (double)lr);
    v->push_lr = lr < 0 ? QR_MSG_PUSH_LR_NONE : lr;
    return QR_OK;
}

int qr_worker_set_dtype(qr_worker *w, int var_id, int wire, int array) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_set_dtype: worker is NULL");
    if (var_id < 0 || var_id >= w->nvars)
        return qr__fail(QR_ENOTFOUND, "set_dtype: no variable with id %d (%d declared)", var_id,
                        w->nvars);
    wk_var *v = &w->vars[var_id];
    if (!qr_dt_size(wire) || !qr_dt_size(array))
        return qr__fail(QR_EINVAL, "set_dtype: '%s': dtype %d is not one of QR_FLOAT32, "
                        "QR_BFLOAT16, QR_FLOAT16", v->name, qr_dt_size(wire) ? array : wire);
    if (array != QR_FLOAT32 && array != wire)
        return qr__fail(QR_EINVAL, "set_dtype: '%s': %s arrays travel as %s, not %s (the "
                        "worker converts only float32 arrays)", v->name, qr_dt_name(array),
                        qr_dt_name(array), qr_dt_name(wire));
    if (v->table && (wire != QR_FLOAT32 || array != QR_FLOAT32))
        return qr__fail(QR_EINVAL, "set_dtype: '%s' is an embedding table: its rows are "
                        "float32", v->name);
    v->wire_dt = (uint8_t)wire;
    v->array_dt = (uint8_t)array;
    return QR_OK;
}

int qr_worker_data_position(const qr_worker *w, uint64_t *position) {
    if (!w || !position)
        return qr__fail(QR_EINVAL, "qr_worker_data_position: worker and position are required");
    if (!w->initialized)
        return qr__fail(QR_EINVAL, "qr_worker_data_position: call qr_worker_initialize first");
    *position = w->restored_pos;
    return QR_OK;
}

int qr_worker_checkpoint(qr_worker *w, int64_t *global_step) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_checkpoint: worker is NULL");
    if (!w->initialized)
        return qr__fail(QR_EINVAL, "qr_worker_checkpoint: call qr_worker_initialize first");
    wk_request *r = wk_request_new(w, 0, QR_MSG_SAVE);
    if (!r) return QR_ENOMEM;
    /* Written by every ps: as long as a final checkpoint may take. */
    int rc = wk_run_requests(w, &r, 1, (int)qr__config_int(w->cfg, "init-timeout-ms"));
    if (!rc && global_step) *global_step = r->step;
    wk_request_free(r);
    return rc;
}

int qr_worker_leave(qr_worker *w) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_leave: worker is NULL");
    if (!w->initialized) return qr__fail(QR_EINVAL, "qr_worker_leave: call qr_worker_initialize first");
    wk_request *r = wk_request_new(w, 0, QR_MSG_LEAVE);
    if (!r) return QR_ENOMEM;
    int rc = wk_run_requests(w, &r, 1, w->timeout_ms);
    wk_free_requests(&r, 1);
    return rc;
}

int qr__worker_wait_end(qr_worker *w) {
    if (!w) return qr__fail(QR_EINVAL, "qr__worker_wait_end: worker is NULL");
    uint64_t start = qr__now_ns(), next_report = start + WK_WAIT_REPORT_NS;
    for (;;) {
        if (w->stop_status && w->stop_status != QR_ESTOPPED)
            return qr__fail(w->stop_status, "%s", w->stop_msg);
        if (w->stopping) return QR_OK; /* stopped in order: the chief ended the run */
        /* ps 0 is asked now and then: one that is gone or hung ends the
         * wait as it ends any call (restart-wait-ms, timeout-ms). */
        int64_t step = 0;
        int rc = qr_worker_global_step(w, &step);
        if (rc == QR_ESTOPPED) return QR_OK;
        if (rc) return rc;
        uint64_t now = qr__now_ns();
        if (now >= next_report) {
            qr__log(QR_LOG_INFO, "training is done (global step %lld); waiting %.0f s so far for "
                    "the chief (worker 0) to evaluate the model and end the run (ps 0 ends it if "
                    "the chief is lost for restart-wait-ms, %d ms)", (long long)step,
                    (double)(now - start) / 1e9, w->restart_wait_ms);
            next_report += WK_WAIT_REPORT_NS;
        }
        wk_idle(w, 1000);
    }
}

int qr_worker_stop_cluster(qr_worker *w) {
    if (!w) return qr__fail(QR_EINVAL, "qr_worker_stop_cluster: worker is NULL");
    wk_request **reqs = qr__calloc((size_t)w->nps, sizeof *reqs);
    if (!reqs) return QR_ENOMEM;
    w->stopping = true; /* the ps tasks going away is what this asks for */
    for (int p = 0; p < w->nps; p++) reqs[p] = wk_request_new(w, p, QR_MSG_STOP);
    int rc = QR_OK;
    for (int p = 0; p < w->nps; p++)
        if (!reqs[p]) rc = QR_ENOMEM;
    /* ps 0 first: with checkpoints on, it answers once the final
     * checkpoint, which needs every ps, is written (init-timeout-ms
     * bounds that wait); then the others. */
    if (!rc) rc = wk_run_requests(w, reqs, 1, (int)qr__config_int(w->cfg, "init-timeout-ms"));
    if (!rc && w->nps > 1) rc = wk_run_requests(w, reqs + 1, w->nps - 1, w->timeout_ms);
    wk_free_requests(reqs, w->nps);
    free(reqs);
    return rc;
}

/*
 * inflight.c - non-blocking pushes and pulls (include/quorum.h): a start
 * call builds a pull's or push's requests (client.c), sends what can go
 * and returns a handle; qr_request_wait runs the worker's loop until they
 * are answered. Each ps answers its requests in order, so any number may
 * be in flight: a worker pipelines small requests, or pushes each
 * parameter's gradient as soon as backpropagation has it and waits once.
 * In sync mode a push-and-pull is held by the ps tasks until its step is
 * done (client.c): the worker may compute, or ask for other things,
 * meanwhile, and its wait takes the step's token.
 */
#include "worker/worker_internal.h"

#include <stdlib.h>
#include <string.h>

struct qr_request {
    qr_worker *w;
    wk_call call;
    bool push;
    double started; /* for the metrics page's call times */
};

static int start(qr_worker *w, qr_request *r, qr_request **out) {
    wk_send_requests(w, r->call.reqs, r->call.n);
    r->w = w;
    r->started = qr__now_sec();
    *out = r;
    return QR_OK;
}

static int push_start(qr_worker *w, int n, const int *ids, const float *const *grads,
                      unsigned flags, float *const *values, qr_request **out) {
    if (!out) return qr__fail(QR_EINVAL, "push_start: request is NULL");
    *out = NULL;
    if (!w) return qr__fail(QR_EINVAL, "push_start: worker is NULL");
    if (w->sync && !values)
        return qr__fail(QR_EINVAL, "push_start: a synchronous step's push is committed whole; "
                        "use qr_worker_push or qr_worker_push_pull_start in sync mode");
    if (w->sync && !w->initialized)
        return qr__fail(QR_ENOTREADY, "push_pull_start: call qr_worker_initialize first");
    if (wk_rows_pending(w))
        return qr__fail(QR_EINVAL, "push_start: rows added with qr_worker_add_rows go with a "
                        "blocking qr_worker_push");
    qr_request *r = qr__calloc(1, sizeof *r);
    if (!r) return QR_ENOMEM;
    r->push = true;
    int rc = wk_push_build(w, n, ids, grads, flags, values, &r->call);
    if (rc) {
        wk_call_free(&r->call);
        free(r);
        return rc;
    }
    return start(w, r, out);
}

int qr_worker_push_start(qr_worker *w, int n, const int *ids, const float *const *grads,
                         unsigned flags, qr_request **request) {
    return push_start(w, n, ids, grads, flags, NULL, request);
}

int qr_worker_push_pull_start(qr_worker *w, int n, const int *ids, const float *const *grads,
                              float *const *values, unsigned flags, qr_request **request) {
    float **copies = NULL; /* values NULL: every variable into the worker's copy */
    if (!values && n > 0 && !(copies = qr__calloc((size_t)n, sizeof *copies))) return QR_ENOMEM;
    int rc = push_start(w, n, ids, grads, flags, values ? values : copies, request);
    free(copies); /* read while building: the requests hold the addresses */
    return rc;
}

int qr_worker_pull_start(qr_worker *w, int n, const int *ids, float **dst,
                         qr_request **request) {
    if (!request) return qr__fail(QR_EINVAL, "pull_start: request is NULL");
    *request = NULL;
    int rc = wk_check_ids(w, "pull", n, ids);
    if (!rc) rc = wk_check_dense(w, "pull", n, ids);
    if (rc) return rc;
    qr_request *r = qr__calloc(1, sizeof *r);
    if (!r) return QR_ENOMEM;
    rc = wk_pull_build(w, n, ids, dst, 0, &r->call);
    if (rc) {
        wk_call_free(&r->call);
        free(r);
        return rc;
    }
    return start(w, r, request);
}

int qr_request_wait(qr_request *r, int64_t *global_step) {
    if (!r) return qr__fail(QR_EINVAL, "qr_request_wait: request is NULL");
    qr_worker *w = r->w;
    int rc = wk_run_requests(w, r->call.reqs, r->call.n, wk_call_timeout_ms(w, &r->call));
    if (r->push) rc = wk_push_done(w, &r->call, rc, global_step);
    wk_count_call(w, r->push, rc, qr__now_sec() - r->started);
    wk_call_free(&r->call);
    free(r);
    return rc;
}

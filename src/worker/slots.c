/*
 * slots.c - a variable's optimizer state on the ps tasks, read and
 * written by a worker (torch's Optimizer.state_dict and load_state_dict):
 * the names of its slots, one slot's values, new values for a slot or for
 * the variable itself, and the step the optimizer counts from. Each is a
 * SLOTS request (src/ps/slots.c) to every ps holding a part of the
 * variable: a per-element slot is split as a pull is (each ps holds the
 * slot of its part), a scalar one is read from the first part and written
 * to every part.
 *
 * A write first asks every ps to check it (QR_SLOTS_CHECK_ONLY): what one
 * ps would refuse (a slot it lacks, a size, a step it is past) fails the
 * call before any ps has changed.
 */
#include "worker/worker_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The checks every call here makes: a dense variable of an initialized
 * worker, a slot name the wire carries, n floats the variable's size or 1
 * (a scalar slot). */
static int check_var(qr_worker *w, const char *what, int var_id, const char *slot, int64_t n) {
    int rc = wk_check_ids(w, what, 1, &var_id);
    if (!rc && w->vars[var_id].table)
        rc = qr__fail(QR_EINVAL, "%s: '%s' is an embedding table: its slots are kept only in "
                      "the ps tasks' checkpoints", what, w->vars[var_id].name);
    if (!rc && n != -1 && n != 1 && n != w->vars[var_id].n)
        rc = qr__fail(QR_ESHAPE, "%s: '%s' has %lld elements, not %lld (a scalar slot has 1)",
                      what, w->vars[var_id].name, (long long)w->vars[var_id].n, (long long)n);
    if (!rc && slot && strlen(slot) > QR_MSG_MAX_SLOT_NAME)
        rc = qr__fail(QR_EINVAL, "%s: a slot name of %zu bytes (at most %d)", what, strlen(slot),
                      QR_MSG_MAX_SLOT_NAME);
    return rc;
}

static wk_request *slots_request(qr_worker *w, int ps, const qr_msg_slots *m, uint16_t flags) {
    wk_request *r = wk_request_new(w, ps, QR_MSG_SLOTS);
    if (!r) return NULL;
    r->flags = flags;
    qr_msg_put_slots(&r->meta, m);
    return r;
}

int qr_worker_slot_names(qr_worker *w, int var_id, char *buf, size_t cap) {
    int rc = check_var(w, "slot_names", var_id, NULL, -1);
    if (!rc && (!buf || !cap)) rc = qr__fail(QR_EINVAL, "slot_names: no buffer");
    if (rc) return rc;
    wk_var *v = &w->vars[var_id];
    wk_request *r = slots_request(w, v->parts[0].ps, &(qr_msg_slots){.op = QR_SLOTS_NAMES,
                                                                     .var_id = (uint32_t)var_id},
                                  0);
    if (!r) return QR_ENOMEM;
    r->want_meta = true;
    rc = wk_run_requests(w, &r, 1, w->timeout_ms);
    size_t len = 0;
    buf[0] = 0;
    if (!rc) {
        qr_rbuf rb;
        qr_rbuf_init(&rb, r->reply_meta, r->reply_meta_len);
        uint32_t count = qr_msg_get_count(&rb);
        for (uint32_t i = 0; i < count && !rc; i++) {
            const char *name;
            uint32_t name_len;
            uint64_t elements;
            if (!qr_msg_get_slot_name(&rb, &name, &name_len, &elements) || rb.bad)
                rc = qr__fail(QR_EPROTO, "ps %d answered slot_names with a bad record",
                              v->parts[0].ps);
            else if (len + (i > 0) + name_len + 1 > cap)
                rc = qr__fail(QR_ETOOBIG, "slot_names: the names of '%s' need more than %zu "
                              "bytes", v->name, cap);
            else
                len += (size_t)snprintf(buf + len, cap - len, "%s%.*s", i ? "," : "",
                                        (int)name_len, name);
        }
    }
    if (rc) buf[0] = 0;
    wk_request_free(r);
    return rc;
}

/* The requests of a read or write of n floats: one per part for a
 * per-element slot (n is the variable's size), else (n = 1) the scalar
 * slot from the first part (read) or to every part (write). */
static int build(qr_worker *w, int var_id, const char *slot, const float *src, float *dst,
                 int64_t n, uint16_t flags, wk_request **reqs, int *nreq) {
    wk_var *v = &w->vars[var_id];
    bool split = n == v->n;
    int nparts = (split || src) ? v->nparts : 1;
    *nreq = 0;
    for (int k = 0; k < nparts; k++) {
        wk_part *part = &v->parts[k];
        int64_t off = split ? part->offset : 0, count = split ? part->n : n;
        bool check_only = flags & QR_SLOTS_CHECK_ONLY;
        qr_msg_slots m = {.op = src ? QR_SLOTS_WRITE : QR_SLOTS_READ, .var_id = (uint32_t)var_id,
                          .count = (uint64_t)count, .name_len = (uint32_t)strlen(slot),
                          .name = slot};
        wk_request *r = reqs[(*nreq)++] = slots_request(w, part->ps, &m, flags);
        if (!r) return QR_ENOMEM;
        if (src && !check_only) {
            r->payload = qr__calloc(1, sizeof *r->payload);
            if (!r->payload) return QR_ENOMEM;
            r->payload[r->npayload++] = (qr_iov){(void *)(src + off), (size_t)count * 4};
        } else if (!src) {
            r->dst = qr__calloc(1, sizeof *r->dst);
            if (!r->dst) return QR_ENOMEM;
            r->dst[0] = dst + off;
            r->rows = (uint64_t)count;
            r->rows_dim = 1;
        }
        if (r->meta.oom) return QR_ENOMEM;
    }
    return QR_OK;
}

/* Build and run the requests of one read or write. */
static int run(qr_worker *w, int var_id, const char *slot, const float *src, float *dst,
               int64_t n, uint16_t flags) {
    wk_var *v = &w->vars[var_id];
    wk_request **reqs = qr__calloc((size_t)v->nparts, sizeof *reqs);
    if (!reqs) return QR_ENOMEM;
    int nreq = 0;
    int rc = build(w, var_id, slot, src, dst, n, flags, reqs, &nreq);
    if (!rc) rc = wk_run_requests(w, reqs, nreq, w->timeout_ms);
    wk_free_requests(reqs, nreq);
    free(reqs);
    return rc;
}

int qr_worker_pull_slot(qr_worker *w, int var_id, const char *slot, float *dst, int64_t n) {
    int rc = check_var(w, "pull_slot", var_id, slot, n);
    if (!rc && (!dst || n < 1)) rc = qr__fail(QR_EINVAL, "pull_slot: no destination");
    return rc ? rc : run(w, var_id, slot ? slot : "", NULL, dst, n, 0);
}

int qr_worker_set_slot(qr_worker *w, int var_id, const char *slot, const float *src, int64_t n) {
    int rc = check_var(w, "set_slot", var_id, slot, n);
    if (!rc && (!src || n < 1)) rc = qr__fail(QR_EINVAL, "set_slot: no values");
    if (rc) return rc;
    const char *name = slot ? slot : "";
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(src[i]))
            return qr__fail(QR_ENONFINITE, "set_slot: %s%s of '%s' has a non-finite value at "
                            "element %lld: nothing was written", name[0] ? "slot " : "the value",
                            name, w->vars[var_id].name, (long long)i);
    rc = run(w, var_id, name, src, NULL, n, QR_SLOTS_CHECK_ONLY);
    if (!rc) rc = run(w, var_id, name, src, NULL, n, 0);
    return rc;
}

int qr_worker_set_step(qr_worker *w, int64_t step) {
    if (!w) return qr__fail(QR_EINVAL, "set_step: worker is NULL");
    if (!w->initialized) return qr__fail(QR_ENOTREADY, "set_step: call qr_worker_initialize first");
    if (w->index != 0)
        return qr__fail(QR_EINVAL, "set_step: the chief (worker 0) sets the step, not worker %d",
                        w->index);
    if (step < 0) return qr__fail(QR_EINVAL, "set_step: step %lld is negative", (long long)step);
    wk_request **reqs = qr__calloc((size_t)w->nps, sizeof *reqs);
    if (!reqs) return QR_ENOMEM;
    int rc = QR_OK;
    /* Checked on every ps, then set on every ps. */
    for (int pass = 0; pass < 2 && !rc; pass++) {
        for (int p = 0; p < w->nps && !rc; p++) {
            reqs[p] = slots_request(w, p, &(qr_msg_slots){.op = QR_SLOTS_STEP, .step = step},
                                    pass ? 0 : QR_SLOTS_CHECK_ONLY);
            if (!reqs[p]) rc = QR_ENOMEM;
        }
        if (!rc) rc = wk_run_requests(w, reqs, w->nps, w->timeout_ms);
        wk_free_requests(reqs, w->nps);
        memset(reqs, 0, (size_t)w->nps * sizeof *reqs);
    }
    free(reqs);
    if (!rc) w->local_step = step; /* sync: this worker's next push is of that step */
    return rc;
}

/*
 * slots.c - SLOTS: a worker reads and writes a variable's optimizer state
 * on this ps, as torch's Optimizer.state_dict and load_state_dict do: the
 * names of its slots, one slot's values (its part here, for a variable
 * split over several ps), new values for a slot or for the variable
 * itself, and the step the optimizer counts from (Adam's t).
 *
 * A write is checked whole before anything changes: the variable (dense,
 * not an embedding table), the slot's name, its size here, and every
 * value finite. A checkpoint being written still reads the old state
 * (qr__ckpt_before_apply, as an apply does), and a pull reply being sent
 * keeps the values it was queued with (copy-on-write, store.h).
 *
 * The step is set only where nothing has been applied yet (a new cluster,
 * before its first push), by the chief: that is how a run saved with
 * torch.save resumes in a new cluster, its Adam's bias correction going
 * on from the saved step, as a checkpoint's restore sets it
 * (ckpt_coord.c). A ps already at that step takes it as done, so loading
 * the same state twice is harmless. Anywhere else the step would move
 * under pushes in flight, so it is refused with the step the ps is at.
 *
 * A read copies the slot into a buffer the reply owns: applies update
 * slots in place, and a reply still queued must not change under the
 * worker (the values are lent only by pull.c, from reference-counted
 * tensors).
 */
#include "ps/ps_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The slot of v named (name, len) into *data, *n; "" names v's values
 * (writable only after qr_var_prepare_write). QR_ENOTFOUND naming the
 * slots v has otherwise. */
static int find_slot(const qr_ps *ps, const qr_var *v, const char *name, uint32_t len,
                     float **data, int64_t *n) {
    if (len == 0) {
        *data = v->value->data;
        *n = v->n;
        return QR_OK;
    }
    int count = qr_optim_slots_count(v->slots);
    char names[256] = "";
    size_t off = 0;
    for (int i = 0; i < count; i++) {
        const char *sn;
        if (qr_optim_slot(v->slots, i, &sn, data, n)) return QR_EINTERNAL;
        if (strlen(sn) == len && !memcmp(sn, name, len)) return QR_OK;
        if (off < sizeof names)
            off += (size_t)snprintf(names + off, sizeof names - off, "%s'%s'", i ? ", " : "", sn);
    }
    return qr__fail(QR_ENOTFOUND, "SLOTS: '%s' has no slot '%.*s': its optimizer %s keeps %s",
                    v->name, (int)len, name, qr_optim_name(qr__var_optim(ps, v)),
                    count ? names : "none");
}

/* The step may be set here now: nothing applied or held, or at it already. */
static int check_step(const qr_ps *ps, const ps_peer *p, int64_t step) {
    const ps_sync *s = &ps->sync;
    if (p->role != QR_ROLE_WORKER || p->worker_index != 0)
        return qr__fail(QR_EINVAL, "SLOTS: the step is set by the chief (worker 0), not %s",
                        p->role == QR_ROLE_WORKER ? "another worker" : "this peer");
    if (step < 0) return qr__fail(QR_EINVAL, "SLOTS: step %lld is negative", (long long)step);
    bool at_it = ps->applied_steps == step && (!qr__ps_coordinates(ps) || ps->global_step == step);
    if (at_it) return QR_OK;
    bool fresh = ps->applied_steps == 0 && ps->global_step == 0 && s->step == 0 &&
                 !s->pending && !s->nquorum && !s->applying && !s->waiters && !ps->fused;
    if (!fresh)
        return qr__fail(QR_EINVAL, "SLOTS: the step can be set only before the first push of a "
                        "new cluster: %s is at step %lld (%lld applied here); load the state "
                        "before training, or restore the cluster's own checkpoint", ps->name,
                        (long long)(qr__ps_coordinates(ps) ? ps->global_step : ps->applied_steps),
                        (long long)ps->applied_steps);
    return QR_OK;
}

int qr__slots_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_msg_slots m;
    if (!qr_msg_get_slots(&r, &m))
        return qr__fail(QR_EINVAL, "SLOTS: a slot name of %u bytes (at most %d)", m.name_len,
                        QR_MSG_MAX_SLOT_NAME);
    if (r.bad || r.left)
        return qr__fail(QR_EPROTO, "SLOTS meta must be %d bytes and the name, not %u",
                        QR_MSG_SLOTS_LEN, f->meta_len);
    if (f->flags & ~QR_SLOTS_CHECK_ONLY)
        return qr__fail(QR_EINVAL, "SLOTS: unknown flags 0x%x", f->flags);
    bool check_only = f->flags & QR_SLOTS_CHECK_ONLY;
    bool writes = m.op == QR_SLOTS_WRITE && !check_only;
    if (m.op < QR_SLOTS_NAMES || m.op > QR_SLOTS_STEP)
        return qr__fail(QR_EINVAL, "SLOTS: unknown operation %u", m.op);
    if (check_only && m.op != QR_SLOTS_WRITE && m.op != QR_SLOTS_STEP)
        return qr__fail(QR_EINVAL, "SLOTS: only a write or the step is checked");
    if (f->payload_len != (writes ? m.count * 4 : 0) || (writes && m.count > (1ull << 40)))
        return qr__fail(QR_EPROTO, "SLOTS: a payload of %llu bytes for %llu floats",
                        (unsigned long long)f->payload_len, (unsigned long long)m.count);
    int rc = qr__peer_reserve_items(p, 1);
    if (rc) return rc;
    p->items[0] = (push_item){.nrows = -1};
    if (m.op == QR_SLOTS_STEP) return check_step(ps, p, m.step);
    qr_var *v = NULL;
    ps->mark++;
    if ((rc = qr__peer_lookup(p, "SLOTS", m.var_id, &v))) return rc;
    if (v->table)
        return qr__fail(QR_EINVAL, "SLOTS: '%s' is an embedding table: its rows' slots are "
                        "read and written only with the table's checkpoint", v->name);
    p->items[0].var = v;
    p->nitems = 1;
    if (m.op == QR_SLOTS_NAMES) return QR_OK;
    float *data;
    int64_t n;
    if ((rc = find_slot(ps, v, m.name, m.name_len, &data, &n))) return rc;
    if (m.count != (uint64_t)n)
        return qr__fail(QR_ESHAPE, "SLOTS: %s of '%s' has %lld elements on %s, not %llu",
                        m.name_len ? "the slot" : "the value", v->name, (long long)n, ps->name,
                        (unsigned long long)m.count);
    if (!writes) return QR_OK;
    if ((rc = qr__peer_take_recv(p, f->payload_len))) return rc;
    p->items[0].data = (uint8_t *)p->recv;
    qr_iov iov = {p->recv, f->payload_len};
    return qr_conn_expect(p->conn, &iov, 1);
}

static void names_message(ps_peer *p, const qr_frame *f, const qr_var *v) {
    qr_wbuf out = {0};
    int count = qr_optim_slots_count(v->slots);
    qr_msg_put_count(&out, (uint32_t)count);
    for (int i = 0; i < count; i++) {
        const char *name;
        float *data;
        int64_t n;
        qr_optim_slot(v->slots, i, &name, &data, &n);
        qr_msg_put_slot_name(&out, name, (uint64_t)n);
    }
    if (out.oom) qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory");
    else qr__peer_reply(p, f, QR_OK, &out, NULL, 0, NULL, NULL);
    qr_wbuf_free(&out);
}

static void on_read_sent(qr_conn *c, int status, void *ctx) {
    free(ctx);
    qr__peer_reply_sent(c, status, NULL);
}

static void read_message(ps_peer *p, const qr_frame *f, const float *data, int64_t n) {
    float *copy = malloc((size_t)QR_MAX(n, 1) * sizeof *copy);
    if (!copy) {
        qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory copying a slot");
        return;
    }
    memcpy(copy, data, (size_t)n * sizeof *copy);
    qr_wbuf out = {0};
    qr_wbuf_u64(&out, (uint64_t)n);
    qr_iov iov = {copy, (size_t)n * sizeof *copy};
    if (out.oom) {
        free(copy);
        qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory");
    } else {
        qr__peer_reply(p, f, QR_OK, &out, &iov, 1, on_read_sent, copy);
    }
    qr_wbuf_free(&out);
}

static void write_message(ps_peer *p, const qr_frame *f, qr_var *v, const char *name,
                          uint32_t len, int64_t n) {
    qr_ps *ps = p->ps;
    const float *src = (const float *)p->items[0].data;
    bool check_only = f->flags & QR_SLOTS_CHECK_ONLY;
    for (int64_t i = 0; i < n && !check_only; i++)
        if (!isfinite(src[i])) {
            char msg[300];
            snprintf(msg, sizeof msg, "SLOTS: %s%.*s of '%s' has a non-finite value at element "
                     "%lld: nothing was written", len ? "the slot " : "the value", (int)len,
                     name, v->name, (long long)i);
            qr__peer_reply_error(p, f, QR_ENONFINITE, msg);
            return;
        }
    if (!len && qr__fused_of(ps, v)) {
        qr__peer_reply_error(p, f, QR_EINVAL, "SLOTS: a push to this variable is being applied "
                             "as it arrives; write its values between pushes");
        return;
    }
    if (check_only) {
        qr__peer_reply_step(p, f, qr__ps_coordinates(ps) ? ps->global_step : ps->applied_steps);
        return;
    }
    /* A checkpoint still reading the old state keeps it; a reply still
     * sending the old value keeps it (the value is then a copy). */
    float *data;
    int64_t got;
    if (qr__ckpt_before_apply(ps, v) || (!len && qr_var_prepare_write(v)) ||
        find_slot(ps, v, name, len, &data, &got)) {
        char msg[300];
        snprintf(msg, sizeof msg, "SLOTS: %s", qr_last_error());
        qr__peer_reply_error(p, f, QR_ENOMEM, msg);
        return;
    }
    memcpy(data, src, (size_t)n * sizeof *data);
    if (!len) v->version++; /* a gradient of the old value is now stale */
    qr__peer_reply_step(p, f, qr__ps_coordinates(ps) ? ps->global_step : ps->applied_steps);
}

static void step_message(ps_peer *p, const qr_frame *f, int64_t step) {
    qr_ps *ps = p->ps;
    if (check_step(ps, p, step)) { /* the state may have moved since the header */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", qr_last_error());
        qr__peer_reply_error(p, f, QR_EINVAL, msg);
        return;
    }
    if (!(f->flags & QR_SLOTS_CHECK_ONLY) && ps->applied_steps != step) {
        ps->applied_steps = step;
        ps->sync.step = step;
        if (qr__ps_coordinates(ps)) {
            ps->global_step = step;
            ps->ckpt.started_step = step; /* checkpoint-steps count on from it */
            if (ps->sync.on) qr__coord_set_step(ps, step);
        }
        qr__log(QR_LOG_INFO, "the step is set to %lld by the chief (a loaded optimizer state)",
                (long long)step);
    }
    qr__peer_reply_step(p, f, qr__ps_coordinates(ps) ? ps->global_step : ps->applied_steps);
}

void qr__slots_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_msg_slots m;
    qr_msg_get_slots(&r, &m);
    if (m.op == QR_SLOTS_STEP) {
        step_message(p, f, m.step);
        return;
    }
    qr_var *v = p->items[0].var;
    if (m.op == QR_SLOTS_NAMES) {
        names_message(p, f, v);
        return;
    }
    float *data;
    int64_t n;
    if (find_slot(p->ps, v, m.name, m.name_len, &data, &n)) {
        qr__peer_reply_error(p, f, QR_EINTERNAL, qr_last_error());
        return;
    }
    if (m.op == QR_SLOTS_READ) read_message(p, f, data, n);
    else write_message(p, f, v, m.name, m.name_len, n);
}

/*
 * msg.c - write and read the meta records laid out in msg.h. Each pair of
 * functions below is the whole definition of one record: the put writes
 * the fields in the order the table gives, the get reads them back in the
 * same order. Pure functions over buffers, like proto.c.
 */
#include "wire/msg.h"

#include <string.h>

void qr_msg_put_count(qr_wbuf *b, uint32_t count) {
    qr_wbuf_u32(b, count);
}

uint32_t qr_msg_get_count(qr_rbuf *r) {
    return qr_rbuf_u32(r);
}

void qr_msg_put_step(qr_wbuf *b, int64_t step) {
    qr_wbuf_i64(b, step);
}

int64_t qr_msg_get_step(qr_rbuf *r) {
    return qr_rbuf_i64(r);
}

void qr_msg_put_hello(qr_wbuf *b, const qr_msg_hello *m) {
    qr_wbuf_u32(b, m->with_view ? QR_ROLE_WORKER_VIEW : m->role);
    qr_wbuf_u32(b, m->task_index);
    qr_wbuf_u32(b, m->mode);
    if (m->with_view) {
        qr_wbuf_u64(b, m->view);
        qr_wbuf_u32(b, m->shard);
    }
    if (m->role == QR_ROLE_COORDINATOR || m->role == QR_ROLE_REPLICA) {
        qr_wbuf_u64(b, m->incarnation);
        qr_wbuf_i64(b, m->restored_step);
        qr_wbuf_u64(b, m->cause);
    }
}

uint32_t qr_msg_hello_len(const uint8_t *meta, uint32_t meta_len) {
    qr_rbuf r;
    qr_rbuf_init(&r, meta, meta_len);
    uint32_t role = qr_rbuf_u32(&r);
    if (role == QR_ROLE_WORKER_VIEW) return QR_MSG_HELLO_VIEW_LEN;
    return role == QR_ROLE_COORDINATOR || role == QR_ROLE_REPLICA ? QR_MSG_HELLO_COORD_LEN
                                                                  : QR_MSG_HELLO_LEN;
}

void qr_msg_get_hello(qr_rbuf *r, qr_msg_hello *m) {
    m->role = qr_rbuf_u32(r);
    m->task_index = qr_rbuf_u32(r);
    m->mode = qr_rbuf_u32(r);
    m->incarnation = 0;
    m->restored_step = -1;
    m->cause = 0;
    m->with_view = false;
    m->view = 0;
    m->shard = 0;
    if (m->role == QR_ROLE_WORKER_VIEW) {
        m->role = QR_ROLE_WORKER;
        m->with_view = true;
        m->view = qr_rbuf_u64(r);
        m->shard = qr_rbuf_u32(r);
    }
    if (m->role == QR_ROLE_COORDINATOR || m->role == QR_ROLE_REPLICA) {
        m->incarnation = qr_rbuf_u64(r);
        m->restored_step = qr_rbuf_i64(r);
        m->cause = qr_rbuf_u64(r);
    }
}

void qr_msg_put_view(qr_wbuf *b, uint64_t view, int nps, const uint8_t *failed) {
    qr_wbuf_u64(b, view);
    qr_wbuf_u32(b, (uint32_t)nps);
    for (int k = 0; k < nps; k++) qr_wbuf_u32(b, failed[k]);
}

void qr_msg_get_view(qr_rbuf *r, int nps, uint64_t *view, uint8_t *failed) {
    *view = qr_rbuf_u64(r);
    uint32_t n = qr_rbuf_u32(r);
    if (n != (uint32_t)nps) {
        r->bad = true;
        return;
    }
    for (int k = 0; k < nps; k++) {
        uint32_t state = qr_rbuf_u32(r); /* 0 serving, 1 failed, 2 joining, 3 a backup */
        if (state > 3) r->bad = true;
        failed[k] = (uint8_t)(state > 3 ? 1 : state);
    }
}

void qr_msg_put_repl_head(qr_wbuf *b, const qr_msg_repl_head *m) {
    qr_wbuf_u32(b, m->flags);
    qr_wbuf_u32(b, m->worker);
    qr_wbuf_u32(b, m->seq);
    qr_wbuf_u32(b, m->count);
    qr_wbuf_i64(b, m->t);
    qr_wbuf_i64(b, m->answer);
    qr_wbuf_u64(b, m->fwd);
    qr_wbuf_u64(b, m->data_pos);
}

void qr_msg_get_repl_head(qr_rbuf *r, qr_msg_repl_head *m) {
    m->flags = qr_rbuf_u32(r);
    m->worker = qr_rbuf_u32(r);
    m->seq = qr_rbuf_u32(r);
    m->count = qr_rbuf_u32(r);
    m->t = qr_rbuf_i64(r);
    m->answer = qr_rbuf_i64(r);
    m->fwd = qr_rbuf_u64(r);
    m->data_pos = qr_rbuf_u64(r);
}

void qr_msg_put_repl_item(qr_wbuf *b, const qr_msg_repl_item *m) {
    qr_wbuf_u32(b, m->id);
    qr_wbuf_u32(b, m->kind);
    qr_wbuf_u64(b, m->nbytes);
    qr_wbuf_f32(b, m->lr);
}

void qr_msg_get_repl_item(qr_rbuf *r, qr_msg_repl_item *m) {
    m->id = qr_rbuf_u32(r);
    m->kind = qr_rbuf_u32(r);
    m->nbytes = qr_rbuf_u64(r);
    m->lr = qr_rbuf_f32(r);
}

void qr_msg_put_welcome(qr_wbuf *b, const qr_msg_welcome *m) {
    qr_wbuf_u64(b, m->incarnation);
    qr_wbuf_i64(b, m->restored_step);
    qr_wbuf_u64(b, m->follows);
    qr_wbuf_u32(b, m->flags);
}

void qr_msg_get_welcome(qr_rbuf *r, qr_msg_welcome *m) {
    m->incarnation = qr_rbuf_u64(r);
    m->restored_step = qr_rbuf_i64(r);
    m->follows = qr_rbuf_u64(r);
    m->flags = qr_rbuf_u32(r);
}

void qr_msg_put_ready(qr_wbuf *b, const qr_msg_ready *m) {
    qr_wbuf_u32(b, m->set);
    qr_wbuf_i64(b, m->step);
    qr_wbuf_u64(b, m->data_pos);
}

void qr_msg_get_ready(qr_rbuf *r, qr_msg_ready *m) {
    m->set = qr_rbuf_u32(r);
    m->step = qr_rbuf_i64(r);
    m->data_pos = qr_rbuf_u64(r);
}

void qr_msg_put_push_head(qr_wbuf *b, const qr_msg_push_head *m) {
    qr_wbuf_u32(b, m->count);
    qr_wbuf_i64(b, m->local_step);
    qr_wbuf_u32(b, m->worker);
    qr_wbuf_u32(b, m->seq);
    qr_wbuf_u32(b, m->nparts);
    qr_wbuf_u64(b, m->data_pos);
}

void qr_msg_get_push_head(qr_rbuf *r, qr_msg_push_head *m) {
    m->count = qr_rbuf_u32(r);
    m->local_step = qr_rbuf_i64(r);
    m->worker = qr_rbuf_u32(r);
    m->seq = qr_rbuf_u32(r);
    m->nparts = qr_rbuf_u32(r);
    m->data_pos = qr_rbuf_u64(r);
}

void qr_msg_put_var(qr_wbuf *b, const qr_msg_var *m) {
    qr_wbuf_u32(b, m->id);
    qr_wbuf_u32(b, m->kind);
    qr_wbuf_u64(b, m->nbytes);
    qr_wbuf_u64(b, m->version);
}

void qr_msg_get_var(qr_rbuf *r, qr_msg_var *m) {
    m->id = qr_rbuf_u32(r);
    m->kind = qr_rbuf_u32(r);
    m->nbytes = qr_rbuf_u64(r);
    m->version = qr_rbuf_u64(r);
}

void qr_msg_put_push_lr(qr_wbuf *b, float lr) {
    qr_wbuf_f32(b, lr);
}

float qr_msg_get_push_lr(qr_rbuf *r) {
    return qr_rbuf_f32(r);
}

void qr_msg_put_id(qr_wbuf *b, uint32_t id) {
    qr_wbuf_u32(b, id);
}

uint32_t qr_msg_get_id(qr_rbuf *r) {
    return qr_rbuf_u32(r);
}

void qr_msg_put_dtype(qr_wbuf *b, uint32_t dtype) {
    qr_wbuf_u32(b, dtype);
}

uint32_t qr_msg_get_dtype(qr_rbuf *r) {
    return qr_rbuf_u32(r);
}

void qr_msg_put_create_var(qr_wbuf *b, const qr_msg_create_var *m) {
    qr_wbuf_u32(b, m->id);
    qr_wbuf_u32(b, m->ndim);
    for (uint32_t d = 0; d < m->ndim; d++) qr_wbuf_i64(b, m->shape[d]);
    qr_wbuf_f32(b, m->lr);
    qr_wbuf_u32(b, m->name_len);
    qr_wbuf_bytes(b, m->name, m->name_len);
    qr_wbuf_u32(b, m->options_len);
    qr_wbuf_bytes(b, m->options, m->options_len);
    qr_wbuf_u32(b, m->kind);
    qr_wbuf_u32(b, m->init_len);
    qr_wbuf_bytes(b, m->init, m->init_len);
    qr_wbuf_u64(b, m->seed);
}

qr_msg_create_bad qr_msg_get_create_var(qr_rbuf *r, qr_msg_create_var *m) {
    *m = (qr_msg_create_var){0};
    m->id = qr_rbuf_u32(r);
    m->ndim = qr_rbuf_u32(r);
    /* Lengths are checked before the bytes they count are read: a record
     * never makes the reader skip beyond what the limits allow. */
    if (!r->bad && (m->ndim < 1 || m->ndim > QR_PROTO_MAX_NDIM)) return QR_MSG_CREATE_BAD_NDIM;
    for (uint32_t d = 0; d < m->ndim && !r->bad; d++) m->shape[d] = qr_rbuf_i64(r);
    m->lr = qr_rbuf_f32(r);
    m->name_len = qr_rbuf_u32(r);
    if (!r->bad && (m->name_len < 1 || m->name_len > QR_PROTO_MAX_NAME))
        return QR_MSG_CREATE_BAD_NAME_LEN;
    m->name = (const char *)qr_rbuf_bytes(r, m->name_len);
    m->options_len = qr_rbuf_u32(r);
    if (!r->bad && m->options_len > QR_MSG_MAX_OPTIONS) return QR_MSG_CREATE_BAD_OPTIONS_LEN;
    m->options = (const char *)qr_rbuf_bytes(r, m->options_len);
    m->kind = qr_rbuf_u32(r);
    m->init_len = qr_rbuf_u32(r);
    if (!r->bad && m->init_len > QR_MSG_MAX_INIT) return QR_MSG_CREATE_BAD_INIT_LEN;
    m->init = (const char *)qr_rbuf_bytes(r, m->init_len);
    m->seed = qr_rbuf_u64(r);
    return QR_MSG_CREATE_OK;
}

void qr_msg_put_lookup(qr_wbuf *b, const qr_msg_lookup *m) {
    qr_wbuf_u32(b, m->var_id);
    qr_wbuf_u32(b, 0);
    qr_wbuf_u64(b, m->count);
}

void qr_msg_get_lookup(qr_rbuf *r, qr_msg_lookup *m) {
    m->var_id = qr_rbuf_u32(r);
    m->reserved = qr_rbuf_u32(r);
    m->count = qr_rbuf_u64(r);
}

void qr_msg_put_commit(qr_wbuf *b, const qr_msg_commit *m) {
    qr_wbuf_u32(b, m->worker);
    qr_wbuf_u32(b, m->seq);
    qr_wbuf_i64(b, m->local_step);
    qr_wbuf_u64(b, m->data_pos);
}

void qr_msg_get_commit(qr_rbuf *r, qr_msg_commit *m) {
    m->worker = qr_rbuf_u32(r);
    m->seq = qr_rbuf_u32(r);
    m->local_step = qr_rbuf_i64(r);
    m->data_pos = qr_rbuf_u64(r);
}

void qr_msg_put_held(qr_wbuf *b, const qr_msg_held *m) {
    qr_wbuf_u32(b, m->worker);
    qr_wbuf_u32(b, m->seq);
    qr_wbuf_i64(b, m->local_step);
    qr_wbuf_u32(b, (uint32_t)m->status);
}

void qr_msg_get_held(qr_rbuf *r, qr_msg_held *m) {
    m->worker = qr_rbuf_u32(r);
    m->seq = qr_rbuf_u32(r);
    m->local_step = qr_rbuf_i64(r);
    m->status = (int32_t)qr_rbuf_u32(r);
}

void qr_msg_put_held_reply(qr_wbuf *b, int64_t step, uint32_t flags) {
    qr_wbuf_i64(b, step);
    qr_wbuf_u32(b, flags);
}

void qr_msg_get_held_reply(qr_rbuf *r, int64_t *step, uint32_t *flags) {
    *step = qr_rbuf_i64(r);
    *flags = qr_rbuf_u32(r);
}

void qr_msg_put_worker(qr_wbuf *b, uint32_t worker) {
    qr_wbuf_u32(b, worker);
}

uint32_t qr_msg_get_worker(qr_rbuf *r) {
    return qr_rbuf_u32(r);
}

void qr_msg_put_clock(qr_wbuf *b, const qr_msg_clock *m) {
    qr_wbuf_u32(b, m->worker);
    qr_wbuf_i64(b, m->clock);
}

void qr_msg_get_clock(qr_rbuf *r, qr_msg_clock *m) {
    m->worker = qr_rbuf_u32(r);
    m->clock = qr_rbuf_i64(r);
}

void qr_msg_put_apply_head(qr_wbuf *b, int64_t step, uint32_t count) {
    qr_wbuf_i64(b, step);
    qr_wbuf_u32(b, count);
}

void qr_msg_get_apply_head(qr_rbuf *r, int64_t *step, uint32_t *count) {
    *step = qr_rbuf_i64(r);
    *count = qr_rbuf_u32(r);
}

void qr_msg_put_member(qr_wbuf *b, uint32_t worker, uint32_t seq) {
    qr_wbuf_u32(b, worker);
    qr_wbuf_u32(b, seq);
}

void qr_msg_get_member(qr_rbuf *r, uint32_t *worker, uint32_t *seq) {
    *worker = qr_rbuf_u32(r);
    *seq = qr_rbuf_u32(r);
}

void qr_msg_put_ckpt(qr_wbuf *b, const qr_msg_ckpt *m) {
    qr_wbuf_u32(b, m->phase);
    qr_wbuf_u64(b, m->id);
    qr_wbuf_i64(b, m->step);
    qr_wbuf_u32(b, m->count);
    qr_wbuf_u64(b, m->base);
}

void qr_msg_get_ckpt(qr_rbuf *r, qr_msg_ckpt *m) {
    m->phase = qr_rbuf_u32(r);
    m->id = qr_rbuf_u64(r);
    m->step = qr_rbuf_i64(r);
    m->count = qr_rbuf_u32(r);
    m->base = qr_rbuf_u64(r);
}

void qr_msg_put_cut(qr_wbuf *b, const qr_msg_cut *m) {
    qr_wbuf_u32(b, m->include);
    qr_wbuf_u32(b, m->seq);
}

void qr_msg_get_cut(qr_rbuf *r, qr_msg_cut *m) {
    m->include = qr_rbuf_u32(r);
    m->seq = qr_rbuf_u32(r);
}

void qr_msg_put_mark(qr_wbuf *b, const qr_msg_mark *m) {
    qr_wbuf_u32(b, m->worker);
    qr_wbuf_u32(b, m->flags);
    qr_wbuf_u32(b, m->seq);
    qr_wbuf_u32(b, m->nparts);
    qr_wbuf_u64(b, m->data_pos);
}

void qr_msg_get_mark(qr_rbuf *r, qr_msg_mark *m) {
    m->worker = qr_rbuf_u32(r);
    m->flags = qr_rbuf_u32(r);
    m->seq = qr_rbuf_u32(r);
    m->nparts = qr_rbuf_u32(r);
    m->data_pos = qr_rbuf_u64(r);
}

void qr_msg_put_shard(qr_wbuf *b, const qr_msg_shard *m) {
    qr_wbuf_u64(b, m->bytes);
    qr_wbuf_u32(b, m->crc32);
    qr_wbuf_u32(b, m->nvars);
}

void qr_msg_get_shard(qr_rbuf *r, qr_msg_shard *m) {
    m->bytes = qr_rbuf_u64(r);
    m->crc32 = qr_rbuf_u32(r);
    m->nvars = qr_rbuf_u32(r);
}

void qr_msg_put_slots(qr_wbuf *b, const qr_msg_slots *m) {
    qr_wbuf_u32(b, m->op);
    qr_wbuf_u32(b, m->var_id);
    qr_wbuf_i64(b, m->step);
    qr_wbuf_u64(b, m->count);
    qr_wbuf_u32(b, m->name_len);
    qr_wbuf_bytes(b, m->name, m->name_len);
}
bool qr_msg_get_slots(qr_rbuf *r, qr_msg_slots *m) {
    *m = (qr_msg_slots){0};
    m->op = qr_rbuf_u32(r);
    m->var_id = qr_rbuf_u32(r);
    m->step = qr_rbuf_i64(r);
    m->count = qr_rbuf_u64(r);
    m->name_len = qr_rbuf_u32(r);
    if (!r->bad && m->name_len > QR_MSG_MAX_SLOT_NAME) return false;
    m->name = (const char *)qr_rbuf_bytes(r, m->name_len);
    return true;
}

void qr_msg_put_slot_name(qr_wbuf *b, const char *name, uint64_t elements) {
    size_t len = strlen(name);
    qr_wbuf_u32(b, (uint32_t)len);
    qr_wbuf_bytes(b, name, len);
    qr_wbuf_u64(b, elements);
}
bool qr_msg_get_slot_name(qr_rbuf *r, const char **name, uint32_t *name_len,
                          uint64_t *elements) {
    *name_len = qr_rbuf_u32(r);
    *name = NULL;
    *elements = 0;
    if (!r->bad && *name_len > QR_MSG_MAX_SLOT_NAME) return false;
    *name = (const char *)qr_rbuf_bytes(r, *name_len);
    *elements = qr_rbuf_u64(r);
    return true;
}

/*
 * pull.c - PULL: the current values (or moving averages) of variables of
 * this ps, sent from the variables' own tensors without a copy. A fused
 * push-and-pull (an async PUSH with QR_PUSH_REPLY_VALUES, push.c) is
 * answered the same way, after its apply, and so is a held sync push
 * (sync.c, coord.c), after its step.
 *
 * The reply holds a reference on each tensor it sends (store.h): an apply
 * that comes while the reply is still being written copies the tensor
 * instead of changing bytes the worker has not read yet, so a pull always
 * returns one whole version of each variable.
 *
 * Values asked for in bf16 or fp16 (QR_PULL_DTYPES, or a fused push of
 * such gradients) cannot be lent: they are narrowed from the float32
 * tensor into a buffer of the reply's own, freed once it is sent.
 */
#include "ps/ps_internal.h"

#include <stdlib.h>
#include <string.h>

int qr__pull_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    uint32_t count = qr_msg_get_count(&r);
    if (r.bad) return qr__fail(QR_EPROTO, "PULL meta is truncated");
    if (f->flags & ~QR_PULL_FLAGS_ALL)
        return qr__fail(QR_EINVAL, "PULL: unknown flags 0x%x", f->flags);
    bool typed = f->flags & QR_PULL_DTYPES;
    int rc = qr__peer_check_count("PULL", count);
    if (!rc) rc = qr__peer_reserve_items(p, count);
    if (rc) return rc;
    p->ps->mark++;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t id = qr_msg_get_id(&r);
        uint32_t dtype = typed ? qr_msg_get_dtype(&r) : QR_FLOAT32;
        if (r.bad) return qr__fail(QR_EPROTO, "PULL meta is truncated at item %u", i);
        if (!qr_dt_size((int)dtype))
            return qr__fail(QR_EINVAL, "PULL: item %u asks for dtype %u (0 float32, 1 bfloat16, "
                            "2 float16)", i, dtype);
        qr_var *v = NULL;
        if ((rc = qr__peer_lookup(p, "PULL", id, &v))) return rc;
        if ((f->flags & QR_PULL_AVERAGES) && !v->average)
            return qr__fail(QR_ENOTFOUND, "PULL: variable '%s' has no moving average "
                            "(moving-average-decay is 0, or moving-average-vars leaves it out)",
                            v->name);
        p->items[i] = (push_item){.var = v, .nrows = -1, .dtype = (uint8_t)dtype};
    }
    p->nitems = (int)count;
    return qr__peer_check_end("PULL", &r, 0, f->payload_len);
}

/* The tensors a reply lends, released when it has been read, and the
 * values it narrowed to bf16/fp16. */
typedef struct pull_refs {
    int n;
    uint8_t *narrowed;
    qr_tensor *t[];
} pull_refs;

static void on_pull_sent(qr_conn *c, int status, void *ctx) {
    pull_refs *refs = ctx;
    for (int i = 0; i < refs->n; i++) qr_tensor_unref(refs->t[i]);
    free(refs->narrowed);
    free(refs);
    qr__peer_reply_sent(c, status, NULL);
}

void qr__pull_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr__pull_reply_values(p, f, f->flags & QR_PULL_AVERAGES, NULL);
}

void qr__pull_reply_values(ps_peer *p, const qr_frame *f, bool averages, const int64_t *step) {
    qr_wbuf head = {0};
    if (step) qr_msg_put_step(&head, *step);
    qr__pull_reply_items(p, f, p->items, p->nitems, averages, &head);
    qr_wbuf_free(&head);
}

void qr__pull_reply_items(ps_peer *p, const qr_frame *f, const push_item *items, int nitems,
                          bool averages, const qr_wbuf *head) {
    int n = 0;
    uint64_t narrow_bytes = 0;
    for (int i = 0; i < nitems; i++) {
        const push_item *it = &items[i];
        if (it->var->table || it->nrows >= 0) continue;
        n++;
        if (it->dtype != QR_FLOAT32)
            narrow_bytes += qr_dt_wire_bytes(it->dtype, (uint64_t)it->var->n);
    }
    pull_refs *refs = malloc(sizeof *refs + (size_t)n * sizeof(qr_tensor *));
    qr_iov *iov = malloc((size_t)QR_MAX(n, 1) * sizeof *iov);
    uint8_t *narrowed = narrow_bytes ? malloc(narrow_bytes) : NULL;
    if (!refs || !iov || (narrow_bytes && !narrowed)) {
        free(refs);
        free(iov);
        free(narrowed);
        qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory answering a pull");
        return;
    }
    qr_wbuf meta = {0};
    if (head->len) qr_wbuf_bytes(&meta, head->data, head->len);
    qr_msg_put_count(&meta, (uint32_t)n);
    refs->n = 0;
    refs->narrowed = narrowed;
    uint8_t *at = narrowed;
    for (int i = 0, k = 0; i < nitems; i++) {
        qr_var *v = items[i].var;
        int dtype = items[i].dtype;
        if (v->table || items[i].nrows >= 0) continue; /* rows: no values back */
        uint64_t bytes = qr_dt_wire_bytes(dtype, (uint64_t)v->n);
        qr_msg_put_var(&meta, &(qr_msg_var){.id = v->id,
                                            .kind = qr_msg_kind(QR_GRAD_DENSE, (uint32_t)dtype),
                                            .nbytes = bytes, .version = v->version});
        qr_tensor *t = averages ? v->average : v->value;
        if (dtype != QR_FLOAT32) { /* narrowed now: nothing is lent */
            size_t raw = (size_t)v->n * qr_dt_size(dtype);
            qr_dt_from_f32(dtype, at, t->data, (size_t)v->n);
            memset(at + raw, 0, bytes - raw);
            iov[k++] = (qr_iov){at, (size_t)bytes};
            at += bytes;
            continue;
        }
        refs->t[refs->n++] = qr_tensor_ref(t);
        iov[k++] = (qr_iov){t->data, (size_t)bytes};
    }
    if (meta.oom) {
        on_pull_sent(p->conn, QR_ENOMEM, refs);
        qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory");
    } else if (qr__peer_reply(p, f, QR_OK, &meta, iov, n, on_pull_sent, refs) == QR_OK &&
               qr_conn_all_written(p->conn)) {
        /* The kernel has the bytes already (the usual case when the reply
         * fits the socket buffer): drop the references now, so a push
         * handled before the deferred callback need not copy the tensor. */
        for (int i = 0; i < refs->n; i++) qr_tensor_unref(refs->t[i]);
        refs->n = 0;
    }
    qr_wbuf_free(&meta);
    free(iov);
}

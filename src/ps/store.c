/*
 * store.c - variable storage of a ps task (see store.h for the
 * copy-on-write rule that keeps pull replies consistent).
 */
#include "ps/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static qr_tensor *tensor_alloc(int64_t n, bool zeroed) {
    qr_tensor *t = qr__calloc(1, sizeof *t);
    if (!t) return NULL;
    size_t bytes = (size_t)n * sizeof(float);
    t->data = zeroed ? qr__aligned_alloc(bytes) : qr__aligned_alloc_uninit(bytes);
    if (!t->data) {
        free(t);
        return NULL;
    }
    t->n = n;
    t->refs = 1;
    return t;
}

qr_tensor *qr_tensor_new(int64_t n) {
    return tensor_alloc(n, true);
}

qr_tensor *qr_tensor_new_uninit(int64_t n) {
    return tensor_alloc(n, false);
}

qr_tensor *qr_tensor_ref(qr_tensor *t) {
    t->refs++;
    return t;
}

void qr_tensor_unref(qr_tensor *t) {
    if (!t || --t->refs > 0) return;
    free(t->data);
    free(t);
}

void qr_var_free(qr_var *v) {
    if (!v) return;
    qr_tensor_unref(v->value);
    qr_tensor_unref(v->spare);
    for (int i = 0; i < v->nretired; i++) qr_tensor_unref(v->retired[i]);
    qr_tensor_unref(v->average);
    qr_optim_slots_free(v->slots);
    if (v->table) qr_table_free(v->table);
    free(v->table);
    qr_optim_free(v->optim);
    free(v->options);
    free(v->name);
    free(v);
}

void qr_store_init(qr_store *s) {
    memset(s, 0, sizeof *s);
}

void qr_store_free(qr_store *s) {
    for (uint32_t i = 0; i < s->cap; i++) qr_var_free(s->by_id[i]);
    free(s->by_id);
    memset(s, 0, sizeof *s);
}

qr_var *qr_store_get(const qr_store *s, uint32_t id) {
    return id < s->cap ? s->by_id[id] : NULL;
}

qr_var *qr_store_find_name(const qr_store *s, const char *name) {
    /* Names are looked up only when variables are created (a handful of
     * times per run); pushes and pulls go by id. A scan is enough. */
    for (uint32_t i = 0; i < s->cap; i++)
        if (s->by_id[i] && !strcmp(s->by_id[i]->name, name)) return s->by_id[i];
    return NULL;
}

int qr_store_add(qr_store *s, qr_var *v) {
    if (v->id >= QR_MAX_VAR_ID)
        return qr__fail(QR_EINVAL, "variable id %u exceeds the limit %u", v->id, QR_MAX_VAR_ID);
    if (v->id >= s->cap) {
        uint32_t cap = s->cap ? s->cap : 16;
        while (cap <= v->id) cap *= 2;
        qr_var **grown = realloc(s->by_id, cap * sizeof *grown);
        if (!grown) return qr__fail(QR_ENOMEM, "out of memory for the variable table");
        memset(grown + s->cap, 0, (cap - s->cap) * sizeof *grown);
        s->by_id = grown;
        s->cap = cap;
    }
    if (s->by_id[v->id]) return qr__fail(QR_EEXIST, "variable id %u already exists", v->id);
    s->by_id[v->id] = v;
    s->count++;
    s->bytes += v->n * (int64_t)sizeof(float);
    return QR_OK;
}

/* Make *t exclusively owned, copying it if a reply in flight holds it. */
static int make_exclusive(qr_tensor **t) {
    if ((*t)->refs == 1) return QR_OK;
    qr_tensor *copy = tensor_alloc((*t)->n, false); /* overwritten just below */
    if (!copy) return QR_ENOMEM;
    memcpy(copy->data, (*t)->data, (size_t)(*t)->n * sizeof(float));
    qr_tensor_unref(*t);
    *t = copy;
    return QR_OK;
}

/* A tensor of v's size that no reply reads, for v's next value: the
 * spare if free, else a retired one that came free, else a new one (its
 * contents are garbage; NULL when out of memory). A busy spare is retired
 * on the way, while there is room: replies lent to the kernel (conn.h)
 * hold tensors until the worker has read them, and with several workers
 * pulling a large variable, several versions are out at once. */
static qr_tensor *take_free_tensor(qr_var *v) {
    qr_tensor *t = v->spare;
    v->spare = NULL;
    if (t && t->refs == 1) return t;
    if (t && v->nretired < QR_VAR_MAX_RETIRED) v->retired[v->nretired++] = t;
    else qr_tensor_unref(t); /* the replies reading it keep it alive */
    for (int i = 0; i < v->nretired; i++) {
        if (v->retired[i]->refs > 1) continue;
        t = v->retired[i];
        v->retired[i] = v->retired[--v->nretired];
        return t;
    }
    return tensor_alloc(v->n, false);
}

int qr_var_prepare_write(qr_var *v) {
    qr_tensor *old = v->value;
    if (old->refs == 1) return QR_OK;
    qr_tensor *copy = take_free_tensor(v);
    if (!copy) return QR_ENOMEM;
    memcpy(copy->data, old->data, (size_t)v->n * sizeof(float));
    v->value = copy;
    v->spare = old; /* keeps the variable's reference; the replies hold theirs */
    return QR_OK;
}

int qr_var_prepare_spare(qr_var *v) {
    if (v->spare && v->spare->refs == 1) return QR_OK;
    qr_tensor *t = take_free_tensor(v); /* overwritten by the caller */
    if (!t) return QR_ENOMEM;
    v->spare = t;
    return QR_OK;
}

void qr_var_swap_spare(qr_var *v) {
    qr_tensor *old = v->value;
    v->value = v->spare;
    v->spare = old;
}

float *qr_var_replace_value(qr_var *v, qr_tensor *t, size_t *bytes) {
    float *freed = NULL;
    qr_tensor *spare = v->spare;
    if (spare && spare->refs == 1) {
        freed = spare->data;
        *bytes = (size_t)spare->n * sizeof(float);
        free(spare);
    } else if (spare && v->nretired < QR_VAR_MAX_RETIRED) {
        v->retired[v->nretired++] = spare;
    } else {
        qr_tensor_unref(spare); /* the replies reading it keep it alive */
    }
    v->spare = v->value; /* keeps the variable's reference; the replies hold theirs */
    v->value = t;
    return freed;
}

int qr_var_update_average(qr_var *v, float decay, int64_t num_updates) {
    if (!v->average) return QR_OK;
    int rc = make_exclusive(&v->average);
    if (rc) return rc;
    float d = (float)(1 + num_updates) / (float)(10 + num_updates);
    if (decay < d) d = decay;
    float *avg = v->average->data;
    const float *val = v->value->data;
    for (int64_t i = 0; i < v->n; i++) avg[i] -= (1.0f - d) * (avg[i] - val[i]);
    return QR_OK;
}

void qr_shape_str(int ndim, const int64_t *shape, char *buf, size_t len) {
    size_t off = 0;
    off += (size_t)snprintf(buf + off, len - off, "[");
    for (int i = 0; i < ndim && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (off < len) snprintf(buf + off, len - off, "]");
}

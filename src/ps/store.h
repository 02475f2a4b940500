/*
 * store.h - the variables a ps task holds: dense float32 tensors with
 * their optimizer slots.
 *
 * Values live in reference-counted tensors. The variable holds one
 * reference; every pull reply still being written holds another. An apply
 * to a variable whose tensor is shared first copies it (copy-on-write), so
 * a reply queued before the apply goes out with the values it was queued
 * with, never a torn mix: a queued write must keep its buffers unchanged
 * until it completes (qr_conn_send, wire/conn.h). The store is used only from the ps loop thread, so
 * the counts need no atomics.
 *
 * A variable that had to copy keeps the tensor it left behind as a spare:
 * once the replies reading it are done, the next copy goes there instead
 * of into a fresh allocation. Large variables pulled by several workers at
 * once copy often (a 16 MiB reply outlives a 4 MiB socket buffer), and a
 * fresh 16 MiB tensor costs 4096 page faults before the copy even starts;
 * double buffering turns that into a plain memcpy.
 */
#ifndef QR_PS_STORE_H
#define QR_PS_STORE_H

#include "common/common.h"
#include "common/limits.h"
#include "optim/optim.h"
#include "ps/table.h"

typedef struct qr_tensor {
    int refs;
    int64_t n;   /* elements */
    float *data; /* 64-byte aligned */
} qr_tensor;

qr_tensor *qr_tensor_new(int64_t n);
/* Its values left as they are: for a caller that writes every one (a
 * restore), which would otherwise touch the memory twice. */
qr_tensor *qr_tensor_new_uninit(int64_t n);
qr_tensor *qr_tensor_ref(qr_tensor *t);
void qr_tensor_unref(qr_tensor *t);

/* At most this many busy former spares a variable keeps for reuse: with
 * the value and the spare, a variable pulled by several workers at once
 * holds up to 2 + QR_VAR_MAX_RETIRED tensors of its size. */
#define QR_VAR_MAX_RETIRED 4

typedef struct qr_var {
    uint32_t id;
    char *name;
    int ndim;
    int64_t shape[QR_PROTO_MAX_NDIM];
    int64_t n;          /* elements */
    float lr;           /* < 0: the optimizer's learning rate */
    qr_tensor *value;   /* NULL for an embedding table */
    /* An embedding table's shard (the rows of its ids placed on this ps),
     * or NULL for a dense variable. A table has ndim 1, shape [dim], n 0. */
    qr_table *table;
    qr_tensor *spare;   /* the value before the last copy-on-write, or NULL */
    /* Former spares still read by replies when a new one was needed, kept
     * to be reused once free (store.c, take_free_tensor). */
    qr_tensor *retired[QR_VAR_MAX_RETIRED];
    int nretired;
    qr_tensor *average; /* exponential moving average, or NULL */
    uint64_t version;   /* applies so far */
    qr_optim *optim;    /* its own optimizer, or NULL for the ps's */
    char *options;      /* the options it was declared with ("" if none) */
    /* Declared trainable=false (a module's buffer): a push carries its new
     * value, assigned with no optimizer (async: at once; sync: the mean of
     * the values the step's members pushed), never a gradient. */
    bool non_trainable;
    qr_optim_slots *slots;
    uint64_t nonfinite_skipped;
    uint64_t mark; /* last message that named it: catches duplicates */
    /* A checkpoint being written still reads this variable's tensors and
     * slots (src/ps/ckpt_shard.c): the next apply calls
     * qr__ckpt_before_apply first. NULL otherwise. */
    struct ckpt_entry *ckpt;
    /* Incremental checkpoints: the id of the last checkpoint whose shard
     * held this variable (0: none yet), its version then, and whether it
     * changed since in a way the version does not count (set by
     * qr__ckpt_before_apply, which every write of a dense variable calls). */
    uint64_t ckpt_id, ckpt_version;
    bool ckpt_changed;
} qr_var;

typedef struct qr_store {
    qr_var **by_id; /* indexed by variable id; NULL where absent */
    uint32_t cap;
    uint32_t count;
    int64_t bytes;
} qr_store;

/* Largest variable id and element count a ps accepts. */
#define QR_MAX_VAR_ID (1u << 20)
#define QR_MAX_VAR_ELEMS (1ll << 34)

void qr_store_init(qr_store *s);
void qr_store_free(qr_store *s);
qr_var *qr_store_get(const qr_store *s, uint32_t id);
qr_var *qr_store_find_name(const qr_store *s, const char *name);
/* Take ownership of v (with its value tensor) under v->id. */
int qr_store_add(qr_store *s, qr_var *v);
void qr_var_free(qr_var *v);

/* Make v's tensor exclusively owned (copy-on-write) so it can be updated
 * in place. */
int qr_var_prepare_write(qr_var *v);

/* The cheaper route when a reply still reads v's tensor and the update
 * can be computed out of place (SGD, a delta: next = f(value, g)):
 * qr_var_prepare_spare makes v->spare a tensor no reply reads (allocating
 * one if needed), the caller writes the next value into it, and
 * qr_var_swap_spare makes it the value. That skips the copy of the whole
 * tensor that qr_var_prepare_write would make first: one pass over memory
 * instead of two. */
int qr_var_prepare_spare(qr_var *v);
void qr_var_swap_spare(qr_var *v);

/* Make t (n floats, refs 1) v's value while pull replies still read the
 * current one. The old value becomes the spare, to be reused once they are
 * done (a busy spare is retired). Returns storage nothing uses any more,
 * with its size in *bytes, for the caller to reuse: a free spare's, or
 * NULL when there was none. */
float *qr_var_replace_value(qr_var *v, qr_tensor *t, size_t *bytes);

/* TensorFlow's ExponentialMovingAverage, after an update of v:
 *   d = min(decay, (1 + num_updates) / (10 + num_updates))
 *   average -= (1 - d) * (average - value)
 * (copy-on-write, like the value). QR_ENOMEM if the copy fails. */
int qr_var_update_average(qr_var *v, float decay, int64_t num_updates);

/* "[784,256]" into buf. */
void qr_shape_str(int ndim, const int64_t *shape, char *buf, size_t len);

#endif /* QR_PS_STORE_H */

/*
 * create.c - CREATE: the chief's variables with their initial values, or
 * (QR_CREATE_CHECK_ONLY) another worker's declarations, checked against
 * the variables the chief created.
 *
 * A CREATE is all or nothing. The header builds every new variable aside
 * (p->created) and receives the initial values straight into their
 * tensors; only when the payload is in and every value is finite are they
 * added to the store. A variable that exists already (a restarted chief)
 * must match it exactly and keeps its values: the bytes sent for it are
 * read into a scratch buffer and dropped.
 */
#include "ps/ps_internal.h"

#include "common/init.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void qr__create_drop(ps_peer *p) {
    for (int i = 0; i < p->ncreated; i++) qr_var_free(p->created[i]);
    free(p->created);
    p->created = NULL;
    p->ncreated = 0;
}

/* One decoded record: what the codec found out of range, each dimension,
 * the name, options and id. name and opts get the NUL-terminated copies;
 * *n the element count. */
static int check_record(const qr_rbuf *r, qr_msg_create_bad bad, const qr_msg_create_var *m,
                        uint32_t i, char *name, char *opts, int64_t *n) {
    if (bad == QR_MSG_CREATE_BAD_NDIM)
        return qr__fail(QR_EINVAL, "CREATE: variable id %u has %u dimensions (1..%d allowed)",
                        m->id, m->ndim, QR_PROTO_MAX_NDIM);
    *n = 1;
    for (uint32_t d = 0; d < m->ndim && !r->bad; d++) {
        if (m->shape[d] < 1 || m->shape[d] > QR_MAX_VAR_ELEMS / *n)
            return qr__fail(QR_EINVAL, "CREATE: variable id %u: dimension %u is %lld "
                            "(must be >= 1, and the size at most %lld elements)",
                            m->id, d, (long long)m->shape[d], (long long)QR_MAX_VAR_ELEMS);
        *n *= m->shape[d];
    }
    if (bad == QR_MSG_CREATE_BAD_NAME_LEN)
        return qr__fail(QR_EINVAL, "CREATE: variable id %u: name of %u bytes (1..%d allowed)",
                        m->id, m->name_len, QR_PROTO_MAX_NAME);
    if (bad == QR_MSG_CREATE_BAD_OPTIONS_LEN)
        return qr__fail(QR_EINVAL, "CREATE: variable id %u: options of %u bytes (%d allowed)",
                        m->id, m->options_len, QR_MSG_MAX_OPTIONS);
    if (bad == QR_MSG_CREATE_BAD_INIT_LEN)
        return qr__fail(QR_EINVAL, "CREATE: variable id %u: initializer of %u bytes (%d "
                        "allowed)", m->id, m->init_len, QR_MSG_MAX_INIT);
    if (r->bad) return qr__fail(QR_EPROTO, "CREATE meta is truncated at item %u", i);
    memcpy(name, m->name, m->name_len);
    name[m->name_len] = 0;
    if (m->options_len) memcpy(opts, m->options, m->options_len);
    opts[m->options_len] = 0;
    if (strlen(name) != m->name_len || strlen(opts) != m->options_len || !isfinite(m->lr) ||
        m->id >= QR_MAX_VAR_ID)
        return qr__fail(QR_EINVAL, "CREATE: variable id %u: invalid name, id or learning rate",
                        m->id);
    if (m->kind != QR_VAR_DENSE && m->kind != QR_VAR_TABLE)
        return qr__fail(QR_EINVAL, "CREATE: variable '%s': kind %u (0 dense, 1 table)", name,
                        m->kind);
    qr_table_options policy;
    int prc = qr_table_options_parse(opts, &policy);
    if (!prc && m->kind != QR_VAR_TABLE && qr_table_options_set(&policy))
        prc = qr__fail(QR_EINVAL, "admit_after and evict_after_steps are for embedding tables");
    bool trainable = true;
    if (!prc) prc = qr_var_options_trainable(opts, &trainable);
    if (!prc && !trainable && m->kind == QR_VAR_TABLE)
        prc = qr__fail(QR_EINVAL, "trainable=false is for dense variables, not tables");
    if (prc) return qr__fail(prc, "CREATE: variable '%s': %s", name, qr_last_error());
    if (m->kind == QR_VAR_TABLE) {
        if (m->ndim != 1 || m->shape[0] > QR_TABLE_MAX_DIM)
            return qr__fail(QR_EINVAL, "CREATE: table '%s' must have shape [dim] with dim "
                            "at most %d", name, QR_TABLE_MAX_DIM);
        char init[QR_MSG_MAX_INIT + 1];
        memcpy(init, m->init, m->init_len);
        init[m->init_len] = 0;
        int rc = qr_init_validate(init);
        if (rc) return qr__fail(rc, "CREATE: table '%s': %s", name, qr_last_error());
        *n = 0;
    }
    return QR_OK;
}

/* A table as the record describes it: the initializer and seed, the
 * per-row slots of opt, v's optimizer. */
int qr__create_table(const qr_optim *opt, qr_var *v, const qr_msg_create_var *m) {
    char init[QR_MSG_MAX_INIT + 1];
    memcpy(init, m->init, m->init_len);
    init[m->init_len] = 0;
    int nslots = qr_optim_row_slots(opt);
    float slot_init[QR_TABLE_MAX_SLOTS];
    for (int j = 0; j < nslots && j < QR_TABLE_MAX_SLOTS; j++)
        qr_optim_row_slot_info(opt, j, NULL, &slot_init[j]);
    qr_table_options policy;
    int rc = qr_table_options_parse(v->options, &policy);
    if (rc) return rc;
    v->table = qr__calloc(1, sizeof *v->table);
    if (!v->table) return QR_ENOMEM;
    rc = qr_table_init(v->table, m->shape[0], nslots, slot_init, init, m->seed);
    if (!rc) rc = qr_table_set_policy(v->table, &policy);
    return rc;
}

/* Does an existing variable's kind (and a table's initializer) match? */
static bool same_kind(const qr_var *o, const qr_msg_create_var *m) {
    if ((m->kind == QR_VAR_TABLE) != (o->table != NULL)) return false;
    if (!o->table) return true;
    char init[QR_MSG_MAX_INIT + 1];
    memcpy(init, m->init, m->init_len);
    init[m->init_len] = 0;
    qr_init_spec s;
    return !qr_init_parse(init, &s) && s.kind == o->table->init.kind && s.a == o->table->init.a &&
           s.b == o->table->init.b && m->seed == o->table->seed;
}

/* A variable that exists already by id or name must be this one exactly
 * (the same id, name, shape and options), named once in the request.
 * want: the record's shape as text. */
static int check_existing(ps_peer *p, qr_var *o, const qr_msg_create_var *m, const char *name,
                          const char *opts, const int64_t *shape, const char *want) {
    qr_ps *ps = p->ps;
    const qr_store *store = qr__peer_store(p);
    char have[128];
    qr_shape_str(o->ndim, o->shape, have, sizeof have);
    if (o != qr_store_get(store, m->id) || o != qr_store_find_name(store, name) ||
        o->ndim != (int)m->ndim || memcmp(o->shape, shape, sizeof o->shape) ||
        strcmp(o->options, opts) || !same_kind(o, m))
        return qr__fail(QR_EEXIST, "CREATE: variable '%s' %s (id %u, options '%s') "
                        "conflicts with existing variable '%s' %s (id %u, options '%s'): "
                        "do all workers declare the same variables in the same order, with "
                        "the same partitions?",
                        name, want, m->id, opts, o->name, have, o->id, o->options);
    if (o->mark == ps->mark) return qr__fail(QR_EINVAL, "CREATE names variable '%s' twice", name);
    o->mark = ps->mark;
    return QR_OK;
}

/* A new variable, its tensor ready to receive the initial values, its
 * optimizer and slots made; added to p->created. */
static int new_var(ps_peer *p, const qr_msg_create_var *m, const char *name, const char *opts,
                   const int64_t *shape, int64_t n, qr_var **out) {
    qr_ps *ps = p->ps;
    for (int j = 0; j < p->ncreated; j++)
        if (p->created[j]->id == m->id || !strcmp(p->created[j]->name, name))
            return qr__fail(QR_EINVAL, "CREATE names variable '%s' (id %u) twice", name, m->id);
    qr_var *v = qr__calloc(1, sizeof *v);
    if (!v) return QR_ENOMEM;
    p->created[p->ncreated++] = v;
    v->id = m->id;
    v->name = qr__strdup(name);
    v->ndim = (int)m->ndim;
    memcpy(v->shape, shape, sizeof v->shape);
    v->n = n;
    v->lr = m->lr;
    bool table = m->kind == QR_VAR_TABLE;
    v->value = table ? NULL : qr_tensor_new(n);
    v->options = qr__strdup(opts);
    if (!v->name || (!table && !v->value) || !v->options) return QR_ENOMEM;
    int rc = opts[0] ? qr_optim_create_for_var(&v->optim, ps->cfg, opts) : QR_OK;
    bool trainable = true;
    if (!rc) rc = qr_var_options_trainable(opts, &trainable);
    v->non_trainable = !trainable;
    if (rc) {
        qr__error_prefix("CREATE: variable '%s': ", name);
        return rc;
    }
    int64_t dim = shape[m->ndim - 1];
    /* A table's slots hold only the per-variable scalars (AdamAsync's
     * powers); its rows' slots live beside the rows. */
    rc = qr_optim_slots_create(qr__var_optim(ps, v), table ? 0 : n / dim, dim, &v->slots);
    if (!rc && table) rc = qr__create_table(qr__var_optim(ps, v), v, m);
    if (rc) return rc;
    if (!table && !v->non_trainable && ps->average_decay > 0 &&
        (!ps->average_vars[0] || qr__list_has(ps->average_vars, ',', name))) {
        v->average = qr_tensor_new(n); /* filled with the initial values on arrival */
        if (!v->average) return QR_ENOMEM;
    }
    *out = v;
    return QR_OK;
}

/* Where a CREATE's payload goes: one destination per variable, the new
 * ones' tensors or (NULL until the end) a scratch buffer for values of
 * variables that exist already. */
typedef struct create_plan {
    bool check_only;
    qr_iov *iov;
    int niov;
    uint64_t described;        /* payload bytes the records account for */
    uint64_t largest_existing; /* the scratch buffer's size */
} create_plan;

/* Decode record i, check it, and make (or match) its variable. */
static int plan_record(ps_peer *p, const qr_frame *f, qr_rbuf *r, uint32_t i, create_plan *plan) {
    qr_msg_create_var m;
    qr_msg_create_bad bad = qr_msg_get_create_var(r, &m);
    char name[QR_PROTO_MAX_NAME + 1], opts[QR_MSG_MAX_OPTIONS + 1], want[128];
    int64_t n = 0, shape[QR_PROTO_MAX_NDIM] = {0};
    int rc = check_record(r, bad, &m, i, name, opts, &n);
    if (rc) return rc;
    memcpy(shape, m.shape, m.ndim * sizeof *shape);
    qr_shape_str((int)m.ndim, shape, want, sizeof want);
    uint64_t bytes = (uint64_t)n * 4;
    /* Before anything is allocated: a request of a few hundred bytes
     * must not make the ps zero gigabytes it never gets values for. */
    if (!plan->check_only && plan->described + bytes > f->payload_len)
        return qr__fail(QR_EPROTO, "CREATE: variable '%s' %s needs %llu bytes of initial "
                        "values but the payload has %llu bytes in all", name, want,
                        (unsigned long long)bytes, (unsigned long long)f->payload_len);
    qr_store *store = qr__peer_store(p);
    qr_var *old = qr_store_get(store, m.id);
    if (!old) old = qr_store_find_name(store, name);
    if (old) {
        /* Created already (a restarted chief): keep its values. */
        if ((rc = check_existing(p, old, &m, name, opts, shape, want))) return rc;
        if (plan->check_only) return QR_OK;
        plan->described += bytes;
        plan->largest_existing = QR_MAX(plan->largest_existing, bytes);
        if (bytes) plan->iov[plan->niov++] = (qr_iov){NULL, (size_t)bytes};
        return QR_OK;
    }
    if (plan->check_only)
        return qr__fail(QR_ENOTREADY, "variable '%s' %s (id %u) does not exist on this ps: "
                        "has the chief initialized it?", name, want, m.id);
    qr_var *v = NULL;
    if ((rc = new_var(p, &m, name, opts, shape, n, &v))) return rc;
    plan->described += bytes;
    if (bytes) plan->iov[plan->niov++] = (qr_iov){v->value->data, (size_t)bytes};
    return QR_OK;
}

int qr__create_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    uint32_t count = qr_msg_get_count(&r);
    if (r.bad) return qr__fail(QR_EPROTO, "CREATE meta is truncated");
    int rc = qr__peer_check_count("CREATE", count);
    if (rc) return rc;
    create_plan plan = {.check_only = f->flags & QR_CREATE_CHECK_ONLY};
    p->created = qr__calloc(count, sizeof *p->created);
    plan.iov = qr__calloc(count, sizeof *plan.iov);
    if (!p->created || !plan.iov) {
        free(plan.iov);
        return QR_ENOMEM;
    }
    p->ps->mark++;
    for (uint32_t i = 0; i < count && !rc; i++) rc = plan_record(p, f, &r, i, &plan);
    if (!rc) rc = qr__peer_check_end("CREATE", &r, plan.described, f->payload_len);
    if (!rc && plan.largest_existing) {
        /* Values of variables that exist already are read and dropped. */
        rc = qr__peer_take_recv(p, plan.largest_existing);
        for (int i = 0; i < plan.niov && !rc; i++)
            if (!plan.iov[i].base) plan.iov[i].base = p->recv;
    }
    if (!rc) rc = qr_conn_expect(p->conn, plan.iov, plan.niov);
    free(plan.iov);
    return rc;
}

/* A CREATE's answer, once the backup has applied it (qr_repl_answer_cb). */
static void answer_created(ps_peer *p, const qr_frame *req, void *ctx, int status,
                           const char *msg) {
    (void)ctx;
    if (!p) return;
    if (status) qr__peer_reply_error(p, req, status, msg);
    else qr__peer_reply(p, req, QR_OK, NULL, NULL, 0, NULL, NULL);
}

void qr__create_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    char msg[400];
    for (int i = 0; i < p->ncreated; i++) {
        qr_var *v = p->created[i];
        if (!v->table && !qr_optim_all_finite(v->value->data, v->n)) {
            snprintf(msg, sizeof msg, "%s: CREATE: initial value of '%s' contains NaN or Inf",
                     ps->name, v->name);
            qr__create_drop(p);
            qr__peer_reply_error(p, f, QR_ENONFINITE, msg);
            return;
        }
    }
    /* Only new variables change the state: one that exists already keeps
     * its values (a restarted chief's CREATE after a rollback matches the
     * variables the checkpoint restored, and moves nothing). */
    if (p->ncreated) ps->changed = true;
    for (int i = 0; i < p->ncreated; i++) {
        qr_var *v = p->created[i];
        if (v->average) memcpy(v->average->data, v->value->data, (size_t)v->n * sizeof(float));
        if (qr_store_add(qr__peer_store(p), v)) {
            snprintf(msg, sizeof msg, "%s: CREATE: %s", ps->name, qr_last_error());
            /* The store has the ones before i; the rest are still ours. */
            memmove(p->created, p->created + i, (size_t)(p->ncreated - i) * sizeof *p->created);
            p->ncreated -= i;
            qr__create_drop(p);
            qr__peer_reply_error(p, f, QR_EINTERNAL, msg);
            return;
        }
        if (v->table)
            qr__log(QR_LOG_DEBUG, "created table '%s' (id %u, dim %lld)", v->name, v->id,
                    (long long)v->table->dim);
        else
            qr__log(QR_LOG_DEBUG, "created variable '%s' (id %u, %lld floats)", v->name, v->id,
                    (long long)v->n);
    }
    free(p->created);
    p->created = NULL;
    p->ncreated = 0;
    /* With a backup, the chief hears once the backup has the variables
     * too (replica_forward.c); a replica link's CREATE is that backup's copy. */
    if (qr__replica_on(ps) && p->role != QR_ROLE_REPLICA && !(f->flags & QR_CREATE_CHECK_ONLY)) {
        qr__replica_forward_create(p, f, meta);
        qr__replica_wait(p, f, answer_created, NULL);
        return;
    }
    qr__peer_reply(p, f, QR_OK, NULL, NULL, 0, NULL, NULL);
}

/*
 * checkpoint.c - checkpoints of the ps tier, taken while training goes on,
 * and the restore of the newest one when a ps starts.
 *
 * Taking one (docs/CHECKPOINTS.md has the user's view):
 *   1. ps 0 decides, after the global step advanced (every checkpoint-steps
 *      steps, every checkpoint-secs seconds, and at an orderly stop).
 *      In sync mode that moment lies between two steps: step S-1 is applied
 *      on every ps and step S not yet anywhere, since APPLY(S) leaves ps 0
 *      only once S has its quorum. ps 0 takes its own shard and sends
 *      CKPT(S) to the others on its links; a link is ordered, so each ps
 *      gets CKPT(S) before APPLY(S) and takes its shard at the same step.
 *      In async mode with one ps every push is applied whole on the loop,
 *      so any moment between two messages is a consistent cut. (Async with
 *      several ps needs a cut agreed across them; it is refused for now.)
 *   2. A ps takes its shard as references: each variable's value and
 *      moving average (reference-counted, copy-on-write: the next apply
 *      writes a copy and leaves the snapshot as it was) and its optimizer
 *      slots (the next apply clones them first, qr__ckpt_before_apply).
 *      That is all the loop does; no tensor byte is copied there.
 *   3. The shard is written on libuv's thread pool (uv_queue_work), as a
 *      safetensors file, durably (ckpt/). A variable the writer has passed
 *      is released at its next apply, so only variables still waiting to be
 *      written pay a copy.
 *   4. Each ps reports its file's size and crc32 to ps 0 (the CKPT reply);
 *      ps 0 writes the manifest, which makes the checkpoint exist, then
 *      prunes old ones (keep-checkpoints).
 *
 * Restoring: qr__ckpt_init, before the ps listens, finds the newest
 * checkpoint that verifies (qr_ckpt_latest skips corrupt ones with a
 * warning) and recreates this shard's variables, slots, averages and
 * counters, as if the ps had never stopped. The chief's CREATE then finds
 * them and, as with any live ps, keeps them (its payload is discarded), so
 * nothing is re-initialized; a variable declared differently is refused by
 * create.c with both shapes named.
 */
#include "ps/ps_internal.h"

#include "ckpt/ckpt.h"
#include "cluster/placement.h"

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* What a shard holds of one variable while it is written. */
typedef struct ckpt_entry {
    qr_var *var;            /* NULL once the variable no longer points here */
    qr_tensor *value, *average;
    qr_optim_slots *slots;  /* the slots as they were; owned once the
                             * variable applies to a clone */
    bool owns_slots;
    /* A table's rows, copied when the snapshot was taken: its ids, then
     * per row its value and slots as the arena holds them. */
    int64_t *table_ids;
    float *table_rows[1 + QR_TABLE_MAX_SLOTS];
    /* ... and, under admission and eviction, its candidates' ids and
     * sightings and its rows' update steps */
    int64_t *table_policy[3];
    int first, ntensors;    /* its tensors in the job's list */
    atomic_int written;     /* set by the writer once all are on disk */
} ckpt_entry;

struct ckpt_job {
    uv_work_t work;
    qr_ps *ps;
    uint64_t id;
    int64_t step;
    char path[4200];        /* the shard file */
    int nentries;
    ckpt_entry *entries;
    int ntensors;
    qr_st_tensor *tensors;
    char **names;           /* tensor names made here (slots, averages) */
    int nnames;
    int64_t counters[2];    /* global_step, applied_steps */
    uint64_t *data_pos;     /* ps 0: the workers' positions */
    cJSON *meta;
    /* the result, set by the writer */
    int status;
    char error[512];
    uint32_t crc;
    uint64_t bytes;
};

/* TensorFlow's optimizer names, which its slot variables carry
 * ("layer0/weights/Adam", "layer0/weights/Adam_1"). */
static const char *tf_optimizer_name(const char *quorum_name) {
    static const char *map[][2] = {{"momentum", "Momentum"}, {"adagrad", "Adagrad"},
                                   {"rmsprop", "RMSProp"},   {"adam", "Adam"},
                                   {"adam_async", "AdamAsync"}, {"ftrl", "Ftrl"}};
    for (size_t i = 0; i < QR_ARRAY_LEN(map); i++)
        if (!strcmp(map[i][0], quorum_name)) return map[i][1];
    return quorum_name;
}

/* ---- snapshot (loop thread) ------------------------------------------------- */

static void entry_release(ckpt_entry *e) {
    if (e->var && e->var->ckpt == e) e->var->ckpt = NULL;
    e->var = NULL;
    qr_tensor_unref(e->value);
    qr_tensor_unref(e->average);
    if (e->owns_slots) qr_optim_slots_free(e->slots);
    free(e->table_ids);
    for (int i = 0; i <= QR_TABLE_MAX_SLOTS; i++) free(e->table_rows[i]);
    memset(e->table_rows, 0, sizeof e->table_rows);
    for (int i = 0; i < 3; i++) free(e->table_policy[i]);
    memset(e->table_policy, 0, sizeof e->table_policy);
    e->table_ids = NULL;
    e->value = e->average = NULL;
    e->slots = NULL;
}

int qr__ckpt_before_apply(qr_ps *ps, qr_var *v) {
    (void)ps;
    ckpt_entry *e = v->ckpt;
    if (!e) return QR_OK;
    if (atomic_load(&e->written)) {
        entry_release(e); /* on disk already: let the apply work in place */
        return QR_OK;
    }
    if (v->slots && e->slots == v->slots) {
        qr_optim_slots *copy;
        int rc = qr_optim_slots_clone(v->slots, &copy);
        if (rc) return qr__fail(rc, "out of memory copying the slots of '%s' for a checkpoint",
                                v->name);
        v->slots = copy;
        e->owns_slots = true;
    }
    /* The value and the average are copied on write by their refcount. */
    v->ckpt = NULL;
    e->var = NULL;
    return QR_OK;
}

static void job_free(ckpt_job *j) {
    if (!j) return;
    for (int i = 0; i < j->nentries; i++) entry_release(&j->entries[i]);
    for (int i = 0; i < j->nnames; i++) free(j->names[i]);
    free(j->names);
    free(j->entries);
    free(j->tensors);
    free(j->data_pos);
    cJSON_Delete(j->meta);
    free(j);
}

static const char *job_name(ckpt_job *j, const char *fmt, const char *a, const char *b) {
    size_t len = strlen(a) + strlen(b) + 32;
    char *s = malloc(len);
    if (!s) return NULL;
    snprintf(s, len, fmt, a, b);
    j->names[j->nnames++] = s;
    return s;
}

static void add_tensor(ckpt_job *j, const char *name, qr_dtype dt, int ndim, const int64_t *shape,
                       const void *data) {
    qr_st_tensor *t = &j->tensors[j->ntensors++];
    *t = (qr_st_tensor){.name = name, .dtype = dt, .ndim = ndim, .data = data};
    if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
}

/* Admission and eviction state, copied with the rows: NAME/admission_ids
 * and NAME/admission_counts [candidates] (ids seen, not admitted yet, and
 * their sightings), NAME/update_steps [rows] (the step of each row's last
 * update, in the rows' order). All int64. */
static int snapshot_table_policy(ckpt_job *j, ckpt_entry *e, qr_var *v) {
    const qr_table *t = v->table;
    if (t->admit_after) {
        uint64_t n = t->ncand;
        e->table_policy[0] = malloc(QR_MAX(n, 1) * sizeof(int64_t));
        e->table_policy[1] = malloc(QR_MAX(n, 1) * sizeof(int64_t));
        const char *ids = job_name(j, "%s/%s", v->name, "admission_ids");
        const char *counts = job_name(j, "%s/%s", v->name, "admission_counts");
        if (!e->table_policy[0] || !e->table_policy[1] || !ids || !counts)
            return qr__fail(QR_ENOMEM, "out of memory copying the admission counts of '%s'",
                            v->name);
        for (uint64_t i = 0; i < n; i++) {
            e->table_policy[0][i] = t->cand_ids[i];
            e->table_policy[1][i] = t->cand_seen[i];
        }
        int64_t shape[1] = {(int64_t)n};
        add_tensor(j, ids, QR_DT_I64, 1, shape, e->table_policy[0]);
        add_tensor(j, counts, QR_DT_I64, 1, shape, e->table_policy[1]);
    }
    if (t->updated) {
        uint64_t n = t->count;
        e->table_policy[2] = malloc(QR_MAX(n, 1) * sizeof(int64_t));
        const char *name = job_name(j, "%s/%s", v->name, "update_steps");
        if (!e->table_policy[2] || !name)
            return qr__fail(QR_ENOMEM, "out of memory copying the update steps of '%s'", v->name);
        if (n) memcpy(e->table_policy[2], t->updated, n * sizeof(int64_t));
        int64_t shape[1] = {(int64_t)n};
        add_tensor(j, name, QR_DT_I64, 1, shape, e->table_policy[2]);
    }
    return QR_OK;
}

/* Put back what snapshot_table_policy wrote (either may be absent: the
 * checkpoint was written with admission or eviction off). */
static int restore_table_policy(const qr_st_file *f, qr_table *t, const char *name) {
    char key[QR_PROTO_MAX_NAME + 24];
    snprintf(key, sizeof key, "%s/admission_ids", name);
    const qr_st_tensor *ids = qr_st_find(f, key);
    snprintf(key, sizeof key, "%s/admission_counts", name);
    const qr_st_tensor *counts = qr_st_find(f, key);
    snprintf(key, sizeof key, "%s/update_steps", name);
    const qr_st_tensor *steps = qr_st_find(f, key);
    int rc = QR_OK;
    if (ids && counts && t->admit_after) {
        uint64_t n = (uint64_t)(ids->ndim == 1 ? ids->shape[0] : -1);
        if (ids->dtype != QR_DT_I64 || counts->dtype != QR_DT_I64 || ids->ndim != 1 ||
            counts->ndim != 1 || counts->shape[0] != ids->shape[0])
            return qr__fail(QR_EIO, "'%s': table '%s': its admission counts are malformed",
                            f->path, name);
        int64_t *idv = malloc(QR_MAX(n, 1) * 8), *seen = malloc(QR_MAX(n, 1) * 8);
        rc = idv && seen ? QR_OK : QR_ENOMEM;
        if (!rc) rc = qr_st_read(f, ids, idv);
        if (!rc) rc = qr_st_read(f, counts, seen);
        for (uint64_t i = 0; i < n && !rc; i++) {
            if (seen[i] < 1 || seen[i] > UINT32_MAX || qr_table_find(t, idv[i]) >= 0)
                rc = qr__fail(QR_EIO, "'%s': table '%s': admission count %lld of id %lld",
                              f->path, name, (long long)seen[i], (long long)idv[i]);
            else rc = qr_table_restore_candidate(t, idv[i], (uint32_t)seen[i]);
        }
        free(idv);
        free(seen);
    }
    if (!rc && steps && t->updated) {
        if (steps->dtype != QR_DT_I64 || steps->ndim != 1 || (uint64_t)steps->shape[0] != t->count)
            return qr__fail(QR_EIO, "'%s': table '%s': its update steps are malformed", f->path,
                            name);
        rc = qr_st_read(f, steps, t->updated);
    }
    return rc;
}

/* A table's rows, copied now: unlike a dense tensor they are updated in
 * place, so the snapshot cannot hold a reference. The tensors: NAME
 * [rows, dim], NAME/ids [rows] (int64), a per-row slot [rows, dim]. */
static int snapshot_table(ckpt_job *j, ckpt_entry *e, qr_var *v, cJSON *rec) {
    const qr_table *t = v->table;
    uint64_t n = t->count;
    int64_t dim = t->dim;
    e->table_ids = malloc(QR_MAX(n, 1) * sizeof *e->table_ids);
    for (int s = 0; s <= t->nslots; s++)
        e->table_rows[s] = malloc(QR_MAX(n, 1) * (uint64_t)dim * sizeof(float));
    for (int s = 0; s <= t->nslots; s++)
        if (!e->table_rows[s]) e->table_ids = (free(e->table_ids), NULL);
    if (!e->table_ids) return qr__fail(QR_ENOMEM, "out of memory copying table '%s' (%llu rows) "
                                       "for a checkpoint", v->name, (unsigned long long)n);
    if (n) memcpy(e->table_ids, t->keys, n * sizeof *e->table_ids);
    for (uint64_t r = 0; r < n; r++) {
        const float *row = qr_table_row(t, r);
        for (int s = 0; s <= t->nslots; s++)
            memcpy(e->table_rows[s] + r * (uint64_t)dim, row + s * dim, (size_t)dim * 4);
    }
    int64_t shape[2] = {(int64_t)n, dim};
    add_tensor(j, v->name, QR_DT_F32, 2, shape, e->table_rows[0]);
    const char *ids = job_name(j, "%s/%s", v->name, "ids");
    if (!ids) return QR_ENOMEM;
    add_tensor(j, ids, QR_DT_I64, 1, shape, e->table_ids);
    int rc = snapshot_table_policy(j, e, v);
    if (rc) return rc;
    cJSON *tab = cJSON_AddObjectToObject(rec, "table");
    cJSON_AddNumberToObject(tab, "dim", (double)dim);
    cJSON_AddStringToObject(tab, "init", t->init_text);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)t->seed);
    cJSON_AddStringToObject(tab, "seed", seed);
    cJSON_AddNumberToObject(tab, "rows", (double)n);
    return QR_OK;
}

/* One variable's tensors (value, slots, average) and its metadata record. */
static int snapshot_var(ckpt_job *j, qr_ps *ps, qr_var *v, cJSON *vars) {
    ckpt_entry *e = &j->entries[j->nentries++];
    e->var = v;
    e->first = j->ntensors;
    cJSON *rec = cJSON_CreateObject();
    if (v->table) {
        int rc = snapshot_table(j, e, v, rec);
        if (rc) {
            cJSON_Delete(rec);
            return rc;
        }
    } else {
        e->value = qr_tensor_ref(v->value);
        add_tensor(j, v->name, QR_DT_F32, v->ndim, v->shape, v->value->data);
    }
    cJSON_AddItemToArray(vars, rec);
    cJSON_AddStringToObject(rec, "name", v->name);
    cJSON_AddNumberToObject(rec, "id", v->id);
    cJSON_AddNumberToObject(rec, "lr", v->lr);
    cJSON_AddStringToObject(rec, "options", v->options);
    cJSON_AddNumberToObject(rec, "version", (double)v->version);
    const qr_optim *opt = qr__var_optim(ps, v);
    cJSON_AddStringToObject(rec, "optimizer", qr_optim_name(opt));
    cJSON *slots = cJSON_AddObjectToObject(rec, "slots");
    const char *tf = tf_optimizer_name(qr_optim_name(opt));
    e->slots = v->slots;
    for (int s = 0; s < qr_optim_slots_count(v->slots); s++) {
        const char *slot;
        float *data;
        int64_t n;
        qr_optim_slot(v->slots, s, &slot, &data, &n);
        char suffix[16] = "";
        if (s) snprintf(suffix, sizeof suffix, "_%d", s);
        const char *name = job_name(j, "%s/%s", v->name, tf);
        if (!name) return QR_ENOMEM;
        if (s) name = job_name(j, "%s%s", name, suffix);
        if (!name) return QR_ENOMEM;
        /* Per-element slots have the variable's shape; scalar ones none. */
        if (v->table && s < v->table->nslots) {
            int64_t shape[2] = {(int64_t)v->table->count, v->table->dim};
            add_tensor(j, name, QR_DT_F32, 2, shape, e->table_rows[1 + s]);
        } else if (n == v->n) add_tensor(j, name, QR_DT_F32, v->ndim, v->shape, data);
        else add_tensor(j, name, QR_DT_F32, 0, NULL, data);
        cJSON_AddStringToObject(slots, name, slot);
    }
    if (v->average) {
        e->average = qr_tensor_ref(v->average);
        const char *name = job_name(j, "%s/%s", v->name, "ExponentialMovingAverage");
        if (!name) return QR_ENOMEM;
        add_tensor(j, name, QR_DT_F32, v->ndim, v->shape, v->average->data);
        cJSON_AddStringToObject(rec, "average", name);
    }
    e->ntensors = j->ntensors - e->first;
    v->ckpt = e;
    return QR_OK;
}

static void add_meta(cJSON *m, const char *key, const char *fmt, long long v) {
    char buf[32];
    snprintf(buf, sizeof buf, fmt, v);
    cJSON_AddStringToObject(m, key, buf);
}

/* The shard of this ps at global step `step`, as references. */
static int snapshot(qr_ps *ps, uint64_t id, int64_t step, ckpt_job **out) {
    ckpt_job *j = qr__calloc(1, sizeof *j);
    if (!j) return QR_ENOMEM;
    uint32_t nvars = ps->store.count;
    /* value, ids or average, slots; counters */
    int max_tensors = (int)nvars * (2 + QR_TABLE_MAX_SLOTS + 2 + 3) + 4;
    j->ps = ps;
    j->id = id;
    j->step = step;
    j->entries = qr__calloc(QR_MAX(nvars, 1), sizeof *j->entries);
    j->tensors = qr__calloc((size_t)max_tensors, sizeof *j->tensors);
    j->names = qr__calloc((size_t)max_tensors * 2, sizeof *j->names);
    j->meta = cJSON_CreateObject();
    cJSON *vars = cJSON_CreateArray();
    if (!j->entries || !j->tensors || !j->names || !j->meta || !vars) {
        cJSON_Delete(vars);
        job_free(j);
        return qr__fail(QR_ENOMEM, "out of memory taking a checkpoint");
    }
    char dir[4096];
    int rc = qr_ckpt_path(dir, sizeof dir, ps->ckpt.dir, step);
    char file[64];
    qr_ckpt_shard_name(file, sizeof file, ps->index, ps->cluster->nps);
    snprintf(j->path, sizeof j->path, "%s/%s", dir, file);
    for (uint32_t i = 0; i < ps->store.cap && !rc; i++)
        if (ps->store.by_id[i]) rc = snapshot_var(j, ps, ps->store.by_id[i], vars);
    j->counters[0] = step;
    j->counters[1] = ps->sync.on ? step : ps->applied_steps;
    add_tensor(j, "global_step", QR_DT_I64, 0, NULL, &j->counters[0]);
    add_tensor(j, "quorum/applied_steps", QR_DT_I64, 0, NULL, &j->counters[1]);
    int nw = ps->cluster->nworkers;
    if (ps->index == 0 && ps->ckpt.data_pos) {
        j->data_pos = qr__calloc((size_t)nw, sizeof *j->data_pos);
        if (!j->data_pos) rc = QR_ENOMEM;
        else {
            memcpy(j->data_pos, ps->ckpt.data_pos, (size_t)nw * sizeof *j->data_pos);
            int64_t shape[1] = {nw};
            add_tensor(j, "quorum/worker_data_position", QR_DT_I64, 1, shape, j->data_pos);
        }
    }
    cJSON_AddStringToObject(j->meta, "format", QR_CKPT_FORMAT);
    add_meta(j->meta, "version", "%lld", QR_CKPT_VERSION);
    add_meta(j->meta, "global_step", "%lld", step);
    add_meta(j->meta, "shard", "%lld", ps->index);
    add_meta(j->meta, "num_shards", "%lld", ps->cluster->nps);
    add_meta(j->meta, "num_workers", "%lld", nw);
    cJSON_AddStringToObject(j->meta, "mode", ps->sync.on ? "sync" : "async");
    cJSON_AddStringToObject(j->meta, "optimizer", qr_optim_name(ps->optim));
    char *vars_text = cJSON_PrintUnformatted(vars);
    cJSON_Delete(vars);
    if (!vars_text) rc = QR_ENOMEM;
    else cJSON_AddStringToObject(j->meta, "quorum.variables", vars_text);
    free(vars_text);
    if (rc) {
        job_free(j);
        return rc;
    }
    *out = j;
    return QR_OK;
}

/* ---- write (thread pool) ------------------------------------------------------ */

static void on_tensor_written(void *ctx, int index) {
    ckpt_job *j = ctx;
    for (int i = 0; i < j->nentries; i++) {
        ckpt_entry *e = &j->entries[i];
        if (index == e->first + e->ntensors - 1) atomic_store(&e->written, 1);
    }
}

/* The writer runs at a lower priority than the ps loop: on a machine with
 * fewer free cores than busy threads (the writer checksums and copies into
 * the page cache at full speed), the loop would otherwise lose whole
 * scheduler slices to it, and every push and pull would wait. Only libuv's
 * pool threads are lowered, and only once they write a checkpoint (a ps
 * uses the pool for nothing else). */
static void lower_priority(void) {
    setpriority(PRIO_PROCESS, (id_t)gettid(), 10);
}

static void write_shard(uv_work_t *w) {
    ckpt_job *j = w->data;
    lower_priority();
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", j->path);
    *strrchr(dir, '/') = '\0';
    j->status = qr_mkdir(dir);
    if (!j->status)
        j->status = qr_st_write_file_progress(j->path, j->tensors, j->ntensors, j->meta,
                                              on_tensor_written, j, &j->crc, &j->bytes);
    if (j->status) snprintf(j->error, sizeof j->error, "%s", qr_last_error());
}

static void shard_written(qr_ps *ps, int index, int status, const char *error,
                          const qr_msg_shard *shard);

static void on_shard_written(uv_work_t *w, int status) {
    ckpt_job *j = w->data;
    qr_ps *ps = j->ps;
    ps->ckpt.job = NULL;
    if (status && !j->status) {
        j->status = QR_EINTERNAL;
        snprintf(j->error, sizeof j->error, "the write was cancelled");
    }
    qr_msg_shard shard = {.bytes = j->bytes, .crc32 = j->crc, .nvars = (uint32_t)j->nentries};
    if (j->status)
        qr__log(QR_LOG_ERROR, "checkpoint at step %lld: %s", (long long)j->step, j->error);
    if (ps->index == 0) {
        shard_written(ps, 0, j->status, j->error, &shard);
    } else if (ps->ckpt.reply_peer) {
        ps_peer *p = ps->ckpt.reply_peer;
        ps->ckpt.reply_peer = NULL;
        if (j->status) {
            qr__peer_reply_error(p, &ps->ckpt.reply_req, j->status, j->error);
        } else {
            qr_wbuf meta = {0};
            qr_msg_put_shard(&meta, &shard);
            qr__peer_reply(p, &ps->ckpt.reply_req, QR_OK, &meta, NULL, 0, NULL, NULL);
            qr_wbuf_free(&meta);
        }
    }
    job_free(j);
}

/* Take this ps's shard at `step` and write it off the loop. */
int qr__ckpt_start_shard(qr_ps *ps, uint64_t id, int64_t step) {
    if (ps->ckpt.job)
        return qr__fail(QR_EINVAL, "a checkpoint is still being written on %s", ps->name);
    ckpt_job *j;
    uint64_t t0 = qr__now_ns();
    int rc = snapshot(ps, id, step, &j);
    if (rc) return rc;
    ps->ckpt.last_snapshot_ms = (double)(qr__now_ns() - t0) / 1e6;
    ps->ckpt.max_snapshot_ms = QR_MAX(ps->ckpt.max_snapshot_ms, ps->ckpt.last_snapshot_ms);
    j->work.data = j;
    rc = uv_queue_work(&ps->loop, &j->work, write_shard, on_shard_written);
    if (rc) {
        job_free(j);
        return qr__fail(QR_EINTERNAL, "cannot queue a checkpoint write: %s", uv_strerror(rc));
    }
    ps->ckpt.job = j;
    return QR_OK;
}

/* ---- ps 0: the checkpoint as a whole ------------------------------------------ */

typedef struct manifest_job {
    uv_work_t work;
    qr_ps *ps;
    qr_ckpt_info info;
    int keep;
    int status;
    char error[512];
} manifest_job;

static void write_manifest(uv_work_t *w) {
    manifest_job *m = w->data;
    lower_priority();
    m->status = qr_ckpt_write_manifest(&m->info);
    if (!m->status && qr_ckpt_prune(m->ps->ckpt.dir, m->keep))
        qr__log(QR_LOG_WARN, "removing old checkpoints: %s", qr_last_error());
    if (m->status) snprintf(m->error, sizeof m->error, "%s", qr_last_error());
}

static void finish_checkpoint(qr_ps *ps);

static void on_manifest_written(uv_work_t *w, int status) {
    manifest_job *m = w->data;
    qr_ps *ps = m->ps;
    ps_ckpt *c = &ps->ckpt;
    double seconds = (double)(qr__now_ns() - c->started_ns) / 1e9;
    if (status || m->status) {
        qr__log(QR_LOG_ERROR, "checkpoint at step %lld: writing the manifest: %s",
                (long long)c->step, status ? uv_strerror(status) : m->error);
    } else {
        c->last_step = c->step;
        c->last_seconds = seconds;
        c->last_bytes = m->info.bytes;
        c->last_unix_time = m->info.unix_time;
        c->written++;
        qr__log(QR_LOG_INFO, "checkpoint %s written: global step %lld, %d shard(s), %.1f MB "
                "in %.3f s", m->info.path, (long long)c->step, m->info.nshards,
                (double)m->info.bytes / 1e6, seconds);
    }
    free(m);
    finish_checkpoint(ps);
}

static void shards_complete(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    if (c->failure[0]) {
        qr__log(QR_LOG_ERROR, "checkpoint at step %lld not taken: %s", (long long)c->step,
                c->failure);
        finish_checkpoint(ps);
        return;
    }
    manifest_job *m = qr__calloc(1, sizeof *m);
    if (!m) {
        finish_checkpoint(ps);
        return;
    }
    m->ps = ps;
    m->keep = c->keep;
    m->work.data = m;
    qr_ckpt_path(m->info.path, sizeof m->info.path, c->dir, c->step);
    m->info.step = c->step;
    m->info.unix_time = (double)time(NULL);
    snprintf(m->info.mode, sizeof m->info.mode, "%s", ps->sync.on ? "sync" : "async");
    m->info.nshards = ps->cluster->nps;
    m->info.shards = c->shards; /* read by the writer; freed after the checkpoint */
    for (int i = 0; i < m->info.nshards; i++) m->info.bytes += c->shards[i].bytes;
    if (uv_queue_work(&ps->loop, &m->work, write_manifest, on_manifest_written)) {
        free(m);
        finish_checkpoint(ps);
    }
}

static void shard_written(qr_ps *ps, int index, int status, const char *error,
                          const qr_msg_shard *shard) {
    ps_ckpt *c = &ps->ckpt;
    if (!c->busy || !c->shards) return;
    if (status && !c->failure[0])
        snprintf(c->failure, sizeof c->failure, "ps %d: %s", index, error);
    if (!status) {
        qr_ckpt_shard *s = &c->shards[index];
        qr_ckpt_shard_name(s->file, sizeof s->file, index, ps->cluster->nps);
        s->bytes = shard->bytes;
        s->crc32 = shard->crc32;
        s->nvars = (int)shard->nvars;
    }
    if (--c->shards_pending == 0) shards_complete(ps);
}

/* Collect the shards of the checkpoint at `step`: this ps's, and in sync
 * mode the others' (async: the CUT that ckpt_cut.c sent asks for them). */
void qr__ckpt_take(qr_ps *ps, int64_t step) {
    ps_ckpt *c = &ps->ckpt;
    c->step = step;
    c->shards = qr__calloc((size_t)ps->cluster->nps, sizeof *c->shards);
    if (!c->shards) {
        qr__ckpt_failed(ps, "out of memory");
        return;
    }
    c->shards_pending = ps->cluster->nps;
    if (ps->sync.on) {
        qr_wbuf meta = {0};
        qr_msg_put_ckpt(&meta, &(qr_msg_ckpt){.phase = QR_CKPT_SNAPSHOT, .id = c->next_id,
                                              .step = step});
        for (int k = 1; k < ps->cluster->nps; k++) qr__link_ckpt(ps, k, &meta, qr__ckpt_link_answer);
        qr_wbuf_free(&meta);
    }
    if (qr__ckpt_start_shard(ps, c->next_id, step)) {
        char error[512];
        snprintf(error, sizeof error, "%s", qr_last_error());
        shard_written(ps, 0, QR_EINTERNAL, error, NULL);
    }
}

void qr__ckpt_failed(qr_ps *ps, const char *why) {
    ps_ckpt *c = &ps->ckpt;
    qr__log(QR_LOG_WARN, "checkpoint at step %lld given up: %s", (long long)c->step, why);
    /* Not again at once: a late reply of this one must not be taken for
     * the next one's. */
    c->retry_ns = qr__now_ns() + 1000000000ull;
    finish_checkpoint(ps);
}

void qr__ckpt_start(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    c->busy = true;
    c->step = c->started_step = ps->global_step;
    c->started_ns = c->last_ns = qr__now_ns();
    c->failure[0] = '\0';
    c->next_id++;
    if (!ps->sync.on && ps->cluster->nps > 1) qr__ckpt_cut_begin(ps);
    else qr__ckpt_take(ps, ps->global_step);
}

static void finish_checkpoint(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    free(c->shards);
    c->shards = NULL;
    c->busy = false;
    bool more_saves = qr__ckpt_save_done(ps, c->next_id, c->last_step == c->step);
    if (c->want_final && !c->final_started && ps->global_step != c->last_step &&
        !(ps->sync.on && ps->sync.applying)) {
        /* The one that just ended was a periodic one: now the final. */
        c->final_started = true;
        qr__ckpt_start(ps);
        return;
    }
    if (c->want_final && (c->final_started || ps->global_step == c->last_step)) {
        c->want_final = false;
        if (c->stop_peer) qr__peer_reply(c->stop_peer, &c->stop_req, QR_OK, NULL, NULL, 0, NULL, NULL);
        c->stop_peer = NULL;
        if (c->final_stops_cluster) qr__ps_ask_stop_cluster(ps);
        else qr__ps_ask_stop(ps);
        return;
    }
    /* A save asked for while this one was under way wants a newer one. */
    if (more_saves && !ps->stopping && !(ps->sync.on && ps->sync.applying)) qr__ckpt_start(ps);
}

static bool due(const qr_ps *ps) {
    const ps_ckpt *c = &ps->ckpt;
    if (ps->global_step == c->last_step) return false;
    /* The next multiple of checkpoint-steps after the last one started: a
     * multiple reached while one was still being written is taken as soon
     * as that one is done, not skipped. */
    if (c->every_steps > 0 &&
        ps->global_step >= (c->started_step / c->every_steps + 1) * c->every_steps)
        return true;
    return c->every_secs > 0 &&
           qr__now_ns() - c->last_ns >= (uint64_t)c->every_secs * 1000000000ull;
}

void qr__ckpt_step_done(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    if (!c->dir || ps->index != 0 || c->busy || ps->stopping || qr__now_ns() < c->retry_ns) return;
    if (c->want_final) c->final_started = true;
    if (c->want_final || c->saves || due(ps)) qr__ckpt_start(ps);
}

bool qr__ckpt_final(qr_ps *ps, ps_peer *p, const qr_frame *f) {
    ps_ckpt *c = &ps->ckpt;
    if (!c->dir || ps->index != 0 || c->want_final) return false;
    if (!c->busy && ps->global_step == c->last_step) return false; /* have it */
    c->want_final = true;
    c->stop_peer = p;
    if (f) c->stop_req = *f;
    qr__log(QR_LOG_INFO, "stop requested: writing the final checkpoint (global step %lld) first",
            (long long)ps->global_step);
    /* Sync: between steps only; a step being applied finishes first and
     * qr__ckpt_step_done takes it then. A checkpoint under way is
     * followed by the final one. */
    if (!c->busy && !(ps->sync.on && ps->sync.applying)) {
        c->final_started = true;
        qr__ckpt_start(ps);
    }
    return true;
}

/* A ps k's link lost while it wrote its shard: that shard is lost to us. */
static void link_lost(qr_ps *ps, int index) {
    ps_ckpt *c = &ps->ckpt;
    qr__ckpt_cut_link_lost(ps, index);
    if (!c->busy || !c->shards || c->shards[index].bytes) return;
    shard_written(ps, index, QR_EPEERLOST, "the link to it was lost while it wrote its shard",
                  NULL);
}

void qr__ckpt_link_answer(qr_ps *ps, int index, int status, const qr_frame *f,
                          const uint8_t *meta) {
    if (!f) {
        link_lost(ps, index);
        return;
    }
    if (qr__ckpt_cut_report(ps, index, f, meta)) return;
    if (!ps->ckpt.shards) return; /* RELEASE's reply, or a late one */
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_msg_shard shard = {0};
    char error[512] = "";
    if (f->status) {
        snprintf(error, sizeof error, "%.*s", (int)QR_MIN(f->meta_len, 500u), (const char *)meta);
    } else {
        qr_msg_get_shard(&r, &shard);
        if (r.bad) snprintf(error, sizeof error, "its CKPT reply is truncated");
    }
    shard_written(ps, index, error[0] ? (f->status ? f->status : QR_EPROTO) : QR_OK, error,
                  &shard);
}

/* ---- ps k: CKPT from ps 0 -------------------------------------------------------- */

int qr__ckpt_header(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    if (p->role != QR_ROLE_COORDINATOR)
        return qr__fail(QR_EINVAL, "CKPT comes from ps 0's coordinator link only");
    if (!p->ps->ckpt.dir)
        return qr__fail(QR_EINVAL, "CKPT: %s was started without --checkpoint-dir", p->ps->name);
    if (f->meta_len < QR_MSG_CKPT_LEN || f->payload_len)
        return qr__fail(QR_EPROTO, "CKPT: %u meta bytes, at least %d and no payload expected",
                        f->meta_len, QR_MSG_CKPT_LEN);
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_msg_ckpt m;
    qr_msg_get_ckpt(&r, &m);
    if ((uint64_t)f->meta_len != QR_MSG_CKPT_LEN + (uint64_t)m.count * QR_MSG_CUT_LEN)
        return qr__fail(QR_EPROTO, "CKPT: %u meta bytes do not hold %u cut records",
                        f->meta_len, m.count);
    return QR_OK;
}

void qr__ckpt_message(ps_peer *p, const qr_frame *f, const uint8_t *meta) {
    qr_ps *ps = p->ps;
    qr_rbuf r;
    qr_rbuf_init(&r, meta, f->meta_len);
    qr_msg_ckpt m;
    qr_msg_get_ckpt(&r, &m);
    bool async_cut = !ps->sync.on && ps->ckpt.marks;
    if (async_cut && m.phase >= QR_CKPT_HOLD && m.phase <= QR_CKPT_RELEASE) {
        qr__ckpt_cut_message(p, f, &m, &r);
        return;
    }
    if (m.phase != QR_CKPT_SNAPSHOT || m.count != 0 || !ps->sync.on) {
        qr__peer_reply_error(p, f, QR_EINVAL, "CKPT: a phase this ps does not take in its mode");
        return;
    }
    if (ps->sync.on && m.step != ps->sync.step) {
        char msg[256];
        snprintf(msg, sizeof msg, "CKPT: %s is at step %lld, not %lld", ps->name,
                 (long long)ps->sync.step, (long long)m.step);
        qr__peer_reply_error(p, f, QR_EINTERNAL, msg);
        return;
    }
    if (qr__ckpt_start_shard(ps, m.id, m.step)) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", qr_last_error());
        qr__peer_reply_error(p, f, QR_EINTERNAL, msg);
        return;
    }
    ps->ckpt.reply_peer = p;
    ps->ckpt.reply_req = *f;
}

void qr__ckpt_peer_lost(ps_peer *p) {
    ps_ckpt *c = &p->ps->ckpt;
    qr__ckpt_cut_peer_lost(p);
    if (c->reply_peer == p) c->reply_peer = NULL;
    if (c->stop_peer == p) c->stop_peer = NULL;
    qr__ckpt_save_peer_lost(p);
}

/* ---- data positions ------------------------------------------------------------- */

void qr__ckpt_data_pos(qr_ps *ps, uint32_t worker, uint64_t pos) {
    if (ps->ckpt.data_pos && qr__is_worker(worker, ps->cluster->nworkers))
        ps->ckpt.data_pos[worker] = pos;
}

uint64_t qr__ckpt_worker_pos(const qr_ps *ps, int worker) {
    if (!ps->ckpt.data_pos || worker < 0 || worker >= ps->cluster->nworkers) return 0;
    return ps->ckpt.data_pos[worker];
}

void qr__ckpt_stats_json(const qr_ps *ps, cJSON *obj) {
    const ps_ckpt *c = &ps->ckpt;
    if (!c->dir) return;
    cJSON *j = cJSON_AddObjectToObject(obj, "checkpoint");
    cJSON_AddStringToObject(j, "dir", c->dir);
    cJSON_AddNumberToObject(j, "written", (double)c->written);
    cJSON_AddNumberToObject(j, "last_step", (double)c->last_step);
    cJSON_AddNumberToObject(j, "last_duration_s", c->last_seconds);
    cJSON_AddNumberToObject(j, "last_bytes", (double)c->last_bytes);
    cJSON_AddNumberToObject(j, "last_unix_time", c->last_unix_time);
    cJSON_AddNumberToObject(j, "restored_step", (double)c->restored_step);
    cJSON_AddNumberToObject(j, "last_snapshot_ms", c->last_snapshot_ms);
    cJSON_AddNumberToObject(j, "max_snapshot_ms", c->max_snapshot_ms);
}

/* ---- restore ---------------------------------------------------------------------- */

static int read_counter(const qr_st_file *f, const char *name, int64_t *out) {
    const qr_st_tensor *t = qr_st_find(f, name);
    if (!t || t->dtype != QR_DT_I64 || t->ndim != 0)
        return qr__fail(QR_EIO, "'%s' has no int64 scalar '%s'", f->path, name);
    return qr_st_read(f, t, out);
}

/* Read tensor `name` of n floats into dst, checking it is there and whole. */
static int read_floats(const qr_st_file *f, const char *name, float *dst, int64_t n) {
    const qr_st_tensor *t = qr_st_find(f, name);
    if (!t || t->dtype != QR_DT_F32 || t->end - t->begin != (uint64_t)n * 4)
        return qr__fail(QR_EIO, "'%s': tensor '%s' is missing or has the wrong size", f->path,
                        name);
    return qr_st_read(f, t, dst);
}

static int restore_slots(qr_ps *ps, const qr_st_file *f, qr_var *v, const cJSON *slots) {
    const qr_optim *opt = qr__var_optim(ps, v);
    int nslots = qr_optim_slots_count(v->slots);
    if (cJSON_GetArraySize(slots) != nslots)
        return qr__fail(QR_EINVAL, "variable '%s' has %d optimizer slots in the checkpoint; "
                        "optimizer %s keeps %d: was it written with another optimizer?",
                        v->name, cJSON_GetArraySize(slots), qr_optim_name(opt), nslots);
    int s = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, slots) {
        const char *name;
        float *data;
        int64_t n;
        qr_optim_slot(v->slots, s++, &name, &data, &n);
        if (!cJSON_IsString(e) || strcmp(e->valuestring, name))
            return qr__fail(QR_EINVAL, "variable '%s': checkpoint slot '%s' is not %s's '%s': "
                            "was it written with another optimizer?", v->name, e->string,
                            qr_optim_name(opt), name);
        /* A table's per-row slots are read with its rows (restore_table). */
        if (v->table && s <= v->table->nslots) continue;
        int rc = read_floats(f, e->string, data, n);
        if (rc) return rc;
    }
    return QR_OK;
}

/* A table's record: its rows, ids and per-row slots, read whole and put
 * back row by row; the per-variable scalar slots as for a dense one. */
static int restore_table(qr_ps *ps, const qr_st_file *f, const cJSON *rec, const cJSON *tab,
                         const qr_st_tensor *t) {
    const char *name = cJSON_GetObjectItemCaseSensitive(rec, "name")->valuestring;
    const cJSON *dim = cJSON_GetObjectItemCaseSensitive(tab, "dim");
    const cJSON *init = cJSON_GetObjectItemCaseSensitive(tab, "init");
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(tab, "seed");
    const cJSON *slots = cJSON_GetObjectItemCaseSensitive(rec, "slots");
    char ids_name[QR_PROTO_MAX_NAME + 8];
    snprintf(ids_name, sizeof ids_name, "%s/ids", name);
    const qr_st_tensor *ids = qr_st_find(f, ids_name);
    if (!cJSON_IsNumber(dim) || dim->valuedouble < 1 || dim->valuedouble > QR_TABLE_MAX_DIM ||
        !cJSON_IsString(init) || !cJSON_IsString(seed) || t->ndim != 2 ||
        t->shape[1] != (int64_t)dim->valuedouble || !ids || ids->dtype != QR_DT_I64 ||
        ids->ndim != 1 || ids->shape[0] != t->shape[0])
        return qr__fail(QR_EIO, "'%s': table '%s' is malformed (its record, its rows [n, dim] "
                        "or its ids [n])", f->path, name);
    char *end;
    uint64_t useed = strtoull(seed->valuestring, &end, 10);
    if (!seed->valuestring[0] || *end)
        return qr__fail(QR_EIO, "'%s': table '%s': bad seed '%s'", f->path, name,
                        seed->valuestring);
    qr_msg_create_var m = {
        .id = (uint32_t)cJSON_GetObjectItemCaseSensitive(rec, "id")->valuedouble,
        .ndim = 1, .shape = {(int64_t)dim->valuedouble},
        .lr = (float)cJSON_GetObjectItemCaseSensitive(rec, "lr")->valuedouble,
        .kind = QR_VAR_TABLE, .init = init->valuestring,
        .init_len = (uint32_t)strlen(init->valuestring), .seed = useed};
    qr_var *v = qr__calloc(1, sizeof *v);
    if (!v) return QR_ENOMEM;
    v->id = m.id;
    v->name = qr__strdup(name);
    v->options = qr__strdup(cJSON_GetObjectItemCaseSensitive(rec, "options")->valuestring);
    v->ndim = 1;
    v->shape[0] = m.shape[0];
    v->lr = m.lr;
    v->version = (uint64_t)cJSON_GetObjectItemCaseSensitive(rec, "version")->valuedouble;
    int rc = v->name && v->options ? QR_OK : QR_ENOMEM;
    if (!rc && v->options[0]) rc = qr_optim_create_for_var(&v->optim, ps->cfg, v->options);
    if (!rc) rc = qr_optim_slots_create(qr__var_optim(ps, v), 0, m.shape[0], &v->slots);
    if (!rc) rc = qr__create_table(ps, v, &m);
    if (!rc) rc = restore_slots(ps, f, v, slots);
    uint64_t n = (uint64_t)t->shape[0];
    int64_t d = m.shape[0];
    int nslots = v->table ? v->table->nslots : 0;
    int64_t *idv = NULL;
    float *rows[1 + QR_TABLE_MAX_SLOTS] = {0};
    if (!rc) {
        idv = malloc(QR_MAX(n, 1) * 8);
        rc = idv ? qr_st_read(f, ids, idv) : QR_ENOMEM;
    }
    for (int s = 0; s <= nslots && !rc; s++) {
        rows[s] = malloc(QR_MAX(n, 1) * (uint64_t)d * 4);
        if (!rows[s]) rc = QR_ENOMEM;
        else if (s == 0) rc = qr_st_read(f, t, rows[0]);
    }
    /* Per-row slot tensors are named in the record's slots, in order. */
    const cJSON *e = slots ? slots->child : NULL;
    for (int s = 1; s <= nslots && !rc; s++, e = e ? e->next : NULL) {
        const qr_st_tensor *st = e ? qr_st_find(f, e->string) : NULL;
        if (!st || st->dtype != QR_DT_F32 || st->end - st->begin != n * (uint64_t)d * 4)
            rc = qr__fail(QR_EIO, "'%s': table '%s': slot %d is missing or has the wrong size",
                          f->path, name, s - 1);
        else rc = qr_st_read(f, st, rows[s]);
    }
    for (uint64_t r = 0; r < n && !rc; r++) {
        bool added;
        int64_t at = qr_table_get_or_add(v->table, idv[r], &added);
        if (at < 0) rc = QR_ENOMEM;
        else if (!added) rc = qr__fail(QR_EIO, "'%s': table '%s': id %lld appears twice",
                                       f->path, name, (long long)idv[r]);
        else if (qr_place_row(idv[r], ps->cluster->nps) != ps->index)
            rc = qr__fail(QR_EIO, "'%s': table '%s': id %lld does not belong on ps %d", f->path,
                          name, (long long)idv[r], ps->index);
        float *row = rc ? NULL : qr_table_row(v->table, (uint64_t)at);
        for (int s = 0; s <= nslots && !rc; s++)
            memcpy(row + s * d, rows[s] + r * (uint64_t)d, (size_t)d * 4);
    }
    free(idv);
    for (int s = 0; s <= nslots; s++) free(rows[s]);
    /* Rows were added in the checkpoint's order, so update_steps lines up. */
    if (!rc) rc = restore_table_policy(f, v->table, name);
    if (!rc && (qr_store_get(&ps->store, v->id) || qr_store_find_name(&ps->store, v->name)))
        rc = qr__fail(QR_EIO, "'%s': variable '%s' (id %u) appears twice", f->path, v->name, v->id);
    if (!rc) rc = qr_store_add(&ps->store, v);
    if (rc) {
        qr__error_prefix("restoring table '%s': ", name);
        qr_var_free(v);
    }
    return rc;
}

static int restore_var(qr_ps *ps, const qr_st_file *f, const cJSON *rec) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(rec, "name");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(rec, "id");
    const cJSON *lr = cJSON_GetObjectItemCaseSensitive(rec, "lr");
    const cJSON *opts = cJSON_GetObjectItemCaseSensitive(rec, "options");
    const cJSON *version = cJSON_GetObjectItemCaseSensitive(rec, "version");
    const cJSON *slots = cJSON_GetObjectItemCaseSensitive(rec, "slots");
    const cJSON *average = cJSON_GetObjectItemCaseSensitive(rec, "average");
    if (!cJSON_IsString(name) || !cJSON_IsNumber(id) || id->valuedouble < 0 ||
        id->valuedouble >= QR_MAX_VAR_ID || !cJSON_IsNumber(lr) || !cJSON_IsString(opts) ||
        !cJSON_IsNumber(version) || !cJSON_IsObject(slots))
        return qr__fail(QR_EIO, "'%s': a variable record of quorum.variables is malformed",
                        f->path);
    const qr_st_tensor *t = qr_st_find(f, name->valuestring);
    if (!t || t->dtype != QR_DT_F32 || t->ndim < 1)
        return qr__fail(QR_EIO, "'%s': variable '%s' has no F32 tensor", f->path, name->valuestring);
    const cJSON *table = cJSON_GetObjectItemCaseSensitive(rec, "table");
    if (table) return restore_table(ps, f, rec, table, t);
    qr_var *v = qr__calloc(1, sizeof *v);
    if (!v) return QR_ENOMEM;
    v->id = (uint32_t)id->valuedouble;
    v->name = qr__strdup(name->valuestring);
    v->options = qr__strdup(opts->valuestring);
    v->ndim = t->ndim;
    memcpy(v->shape, t->shape, sizeof v->shape);
    v->n = (int64_t)((t->end - t->begin) / 4);
    v->lr = (float)lr->valuedouble;
    v->version = (uint64_t)version->valuedouble;
    v->value = v->name && v->options ? qr_tensor_new(v->n) : NULL;
    int rc = v->value ? QR_OK : QR_ENOMEM;
    if (!rc && v->options[0]) rc = qr_optim_create_for_var(&v->optim, ps->cfg, v->options);
    int64_t dim = v->shape[v->ndim - 1];
    if (!rc) rc = qr_optim_slots_create(qr__var_optim(ps, v), v->n / dim, dim, &v->slots);
    if (!rc) rc = qr_st_read(f, t, v->value->data);
    if (!rc) rc = restore_slots(ps, f, v, slots);
    if (!rc && cJSON_IsString(average) && ps->average_decay > 0) {
        v->average = qr_tensor_new(v->n);
        rc = v->average ? read_floats(f, average->valuestring, v->average->data, v->n) : QR_ENOMEM;
    }
    if (!rc && (qr_store_get(&ps->store, v->id) || qr_store_find_name(&ps->store, v->name)))
        rc = qr__fail(QR_EIO, "'%s': variable '%s' (id %u) appears twice", f->path, v->name, v->id);
    if (!rc) rc = qr_store_add(&ps->store, v);
    if (rc) {
        qr__error_prefix("restoring '%s': ", name->valuestring);
        qr_var_free(v);
    }
    return rc;
}

static int restore_shard(qr_ps *ps, const qr_ckpt_info *info) {
    char file[64], path[4200];
    qr_ckpt_shard_name(file, sizeof file, ps->index, ps->cluster->nps);
    snprintf(path, sizeof path, "%s/%s", info->path, file);
    qr_st_file f;
    int rc = qr_st_open(&f, path);
    if (rc) return rc;
    const char *vars_text = qr_st_meta(&f, "quorum.variables");
    const char *mode = qr_st_meta(&f, "mode");
    cJSON *vars = vars_text ? cJSON_Parse(vars_text) : NULL;
    int64_t counters[2];
    if (!cJSON_IsArray(vars) || !mode)
        rc = qr__fail(QR_EIO, "'%s' is not a quorum shard (no quorum.variables)", path);
    else if (strcmp(mode, ps->sync.on ? "sync" : "async"))
        rc = qr__fail(QR_EINVAL, "'%s' was written in %s mode; this run trains in %s mode", path,
                      mode, ps->sync.on ? "sync" : "async");
    if (!rc) rc = read_counter(&f, "global_step", &counters[0]);
    if (!rc) rc = read_counter(&f, "quorum/applied_steps", &counters[1]);
    const cJSON *rec;
    cJSON_ArrayForEach(rec, vars) {
        if (rc) break;
        rc = restore_var(ps, &f, rec);
    }
    const qr_st_tensor *pos = qr_st_find(&f, "quorum/worker_data_position");
    if (!rc && ps->ckpt.data_pos && pos) {
        if (pos->dtype != QR_DT_I64 || pos->ndim != 1 || pos->shape[0] != ps->cluster->nworkers)
            qr__log(QR_LOG_WARN, "%s: the workers' data positions are for %lld workers, this "
                    "cluster has %d: they start their data streams anew", path,
                    (long long)(pos->ndim == 1 ? pos->shape[0] : -1), ps->cluster->nworkers);
        else
            rc = qr_st_read(&f, pos, ps->ckpt.data_pos);
    }
    if (!rc) {
        ps->global_step = counters[0];
        ps->sync.step = counters[0];
        ps->applied_steps = counters[1];
        ps->ckpt.restored_step = counters[0];
        ps->ckpt.started_step = counters[0];
        ps->ckpt.last_step = counters[0];
        qr__log(QR_LOG_INFO, "restored %u variable(s), %.1f MB, from %s (global step %lld)",
                ps->store.count, (double)ps->store.bytes / 1e6, path, (long long)counters[0]);
    }
    cJSON_Delete(vars);
    qr_st_close(&f);
    return rc;
}

int qr__ckpt_init(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    c->last_step = c->restored_step = -1;
    const char *dir = qr__config_str(ps->cfg, "checkpoint-dir");
    if (!dir[0]) return QR_OK;
    c->dir = qr__strdup(dir);
    c->every_secs = qr__config_int(ps->cfg, "checkpoint-secs");
    c->every_steps = qr__config_int(ps->cfg, "checkpoint-steps");
    c->keep = (int)qr__config_int(ps->cfg, "keep-checkpoints");
    c->last_ns = qr__now_ns();
    if (ps->index == 0)
        c->data_pos = qr__calloc((size_t)ps->cluster->nworkers, sizeof *c->data_pos);
    if (!c->dir || (ps->index == 0 && !c->data_pos)) return QR_ENOMEM;
    int rc = qr_mkdir(dir);
    if (rc) return rc;
    qr_ckpt_info info = {0};
    if (ps->restore_step == QR_RESTORE_NONE) {
        qr__log(QR_LOG_INFO, "starting fresh, as the ps that made the cluster roll back did");
        return QR_OK;
    }
    if (ps->restore_step >= 0) {
        /* A rollback: exactly the checkpoint the restarted ps restored. */
        rc = qr_ckpt_path(info.path, sizeof info.path, dir, ps->restore_step);
        info.step = ps->restore_step;
        if (!rc) rc = qr_ckpt_read_manifest(&info);
        if (!rc) rc = qr_ckpt_verify(&info);
        if (rc) {
            qr__error_prefix("cannot roll back to the checkpoint of step %lld: ",
                             (long long)ps->restore_step);
            qr_ckpt_info_free(&info);
            return rc;
        }
    } else {
        rc = qr_ckpt_latest(dir, &info);
    }
    if (rc == QR_ENOTFOUND) {
        qr__log(QR_LOG_INFO, "no checkpoint in %s: starting fresh", dir);
        return QR_OK;
    }
    if (!rc && info.nshards != ps->cluster->nps)
        rc = qr__fail(QR_EINVAL, "checkpoint %s has %d shards, this cluster %d ps tasks: "
                      "restore it with as many ps tasks as wrote it", info.path, info.nshards,
                      ps->cluster->nps);
    if (!rc) rc = restore_shard(ps, &info);
    qr_ckpt_info_free(&info);
    return rc;
}

int qr__ckpt_loop_init(qr_ps *ps) {
    if (!ps->ckpt.dir || ps->sync.on || ps->cluster->nps == 1) return QR_OK;
    return qr__ckpt_cut_init(ps);
}

void qr__ckpt_close(qr_ps *ps) {
    qr__ckpt_cut_close(ps);
}

void qr__ckpt_free(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    qr__ckpt_cut_free(ps);
    qr__ckpt_save_free(ps);
    free(c->dir);
    free(c->shards);
    free(c->data_pos);
    c->dir = NULL;
    c->shards = NULL;
    c->data_pos = NULL;
}

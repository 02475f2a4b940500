/*
 * ckpt_shard.c - one ps's shard of a checkpoint: its format. The shard is
 * taken on the loop, written on libuv's thread pool and read back at
 * start; when and by whom is ckpt_coord.c's (docs/CHECKPOINTS.md).
 *
 *   Snapshot (loop thread): each dense variable's value and moving
 *   average as references (copy-on-write: the next apply writes a copy
 *   and leaves the snapshot as it was) and its optimizer slots (the next
 *   apply clones them first, qr__ckpt_before_apply). An embedding table's
 *   rows, ids, per-row slots and admission and eviction state are updated
 *   in place, so they are copied here: the only tensor bytes the loop
 *   copies.
 *   Write (thread pool): one safetensors file, durably (ckpt/), at a lower
 *   priority than the loop. A variable the writer has passed is released
 *   at its next apply, so only variables still waiting to be written pay
 *   a copy.
 *   Restore: the shard's variables, tables, slots, averages, counters and
 *   the workers' data positions, back into a store, as if the ps had
 *   never stopped.
 *
 * Tensor names follow TensorFlow's: NAME, NAME/Adam, NAME/Adam_1,
 * NAME/ExponentialMovingAverage, global_step; quorum's own under quorum/
 * and NAME/ids, NAME/admission_ids, NAME/admission_counts,
 * NAME/admission_filter, NAME/update_steps, NAME/removed_ids (an
 * increment's). Each variable's record (name, id, options, version,
 * optimizer, slots, table) is the JSON of the "quorum.variables"
 * metadata. The format reads the ps only through ckpt_shard_ctx.
 *
 * Incremental (ctx.base, docs/CHECKPOINTS.md): the shard holds the dense
 * variables written to since the base (whole), and per table the rows
 * made or updated since, the candidates sighted since (an admission
 * filter's counters whole: a sighting changes counters, not an entry) and
 * the ids removed since (its record says "delta"); a variable made since
 * is written whole. Restoring applies it onto its base, already restored.
 */
#include "ps/ps_internal.h"
#include "ps/tier.h"

#include "ckpt/ckpt.h"
#include "cluster/placement.h"

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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
    int64_t *table_policy[4];
    uint8_t *table_filter;  /* or, under admit_filter=bloom, its counters */
    uint64_t table_n;       /* the rows copied */
    int first, ntensors;    /* its tensors in the job's list */
    atomic_int written;     /* set by the writer once all are on disk */
} ckpt_entry;

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
    for (int i = 0; i < 4; i++) free(e->table_policy[i]);
    memset(e->table_policy, 0, sizeof e->table_policy);
    free(e->table_filter);
    e->table_filter = NULL;
    e->table_ids = NULL;
    e->value = e->average = NULL;
    e->slots = NULL;
}

bool qr__ckpt_store_busy(const qr_store *s) {
    for (uint32_t i = 0; i < s->cap; i++)
        if (s->by_id[i] && s->by_id[i]->ckpt) return true;
    return false;
}

int qr__ckpt_before_apply(qr_ps *ps, qr_var *v) {
    (void)ps;
    v->ckpt_changed = true; /* the next increment writes it */
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

void qr__ckpt_shard_free(ckpt_job *j) {
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
 * update, in the rows' order), all int64; under admit_filter=bloom
 * NAME/admission_filter [counters] (uint8) in place of the candidates. An
 * increment (sel) holds the candidates sighted since the last checkpoint
 * (the filter whole) and its rows' steps. */
static int snapshot_table_policy(ckpt_job *j, ckpt_entry *e, qr_var *v, const uint64_t *sel) {
    const qr_table *t = v->table;
    if (t->filter.counters) {
        e->table_filter = malloc(t->filter.m);
        const char *name = job_name(j, "%s/%s", v->name, "admission_filter");
        if (!e->table_filter || !name)
            return qr__fail(QR_ENOMEM, "out of memory copying the admission filter of '%s'",
                            v->name);
        memcpy(e->table_filter, t->filter.counters, t->filter.m);
        int64_t shape[1] = {(int64_t)t->filter.m};
        add_tensor(j, name, QR_DT_U8, 1, shape, e->table_filter);
    } else if (t->admit_after) {
        uint64_t n = 0;
        for (uint64_t i = 0; i < t->ncand; i++) n += !sel || t->cand_changed[i];
        e->table_policy[0] = malloc(QR_MAX(n, 1) * sizeof(int64_t));
        e->table_policy[1] = malloc(QR_MAX(n, 1) * sizeof(int64_t));
        const char *ids = job_name(j, "%s/%s", v->name, "admission_ids");
        const char *counts = job_name(j, "%s/%s", v->name, "admission_counts");
        if (!e->table_policy[0] || !e->table_policy[1] || !ids || !counts)
            return qr__fail(QR_ENOMEM, "out of memory copying the admission counts of '%s'",
                            v->name);
        for (uint64_t i = 0, k = 0; i < t->ncand; i++) {
            if (sel && !t->cand_changed[i]) continue;
            e->table_policy[0][k] = t->cand_ids[i];
            e->table_policy[1][k++] = t->cand_seen[i];
        }
        int64_t shape[1] = {(int64_t)n};
        add_tensor(j, ids, QR_DT_I64, 1, shape, e->table_policy[0]);
        add_tensor(j, counts, QR_DT_I64, 1, shape, e->table_policy[1]);
    }
    if (t->updated) {
        uint64_t n = e->table_n;
        e->table_policy[2] = malloc(QR_MAX(n, 1) * sizeof(int64_t));
        const char *name = job_name(j, "%s/%s", v->name, "update_steps");
        if (!e->table_policy[2] || !name)
            return qr__fail(QR_ENOMEM, "out of memory copying the update steps of '%s'", v->name);
        uint64_t in_memory = sel ? n : t->count;
        for (uint64_t r = 0; r < in_memory; r++) e->table_policy[2][r] = t->updated[sel ? sel[r] : r];
        if (!sel) { /* a full one: the rows on the disk tier follow (tier.c) */
            int rc = qr__tier_copy_disk_rows(t, NULL, NULL, e->table_policy[2], t->count);
            if (rc) return rc;
        }
        int64_t shape[1] = {(int64_t)n};
        add_tensor(j, name, QR_DT_I64, 1, shape, e->table_policy[2]);
    }
    if (sel) { /* the ids removed since the last checkpoint */
        uint64_t n = t->nremoved;
        e->table_policy[3] = malloc(QR_MAX(n, 1) * sizeof(int64_t));
        const char *name = job_name(j, "%s/%s", v->name, "removed_ids");
        if (!e->table_policy[3] || !name)
            return qr__fail(QR_ENOMEM, "out of memory copying the removed ids of '%s'", v->name);
        if (n) memcpy(e->table_policy[3], t->removed_ids, n * sizeof(int64_t));
        int64_t shape[1] = {(int64_t)n};
        add_tensor(j, name, QR_DT_I64, 1, shape, e->table_policy[3]);
    }
    return QR_OK;
}

/* The rows that changed since the last checkpoint, in *sel (*n of them). */
static int changed_rows(const qr_table *t, uint64_t **sel, uint64_t *n) {
    uint64_t m = 0;
    for (uint64_t r = 0; r < t->count; r++) m += t->changed[r];
    *sel = malloc(QR_MAX(m, 1) * sizeof **sel);
    if (!*sel) return QR_ENOMEM;
    for (uint64_t r = 0, k = 0; r < t->count; r++)
        if (t->changed[r]) (*sel)[k++] = r;
    *n = m;
    return QR_OK;
}

/* A table's rows, copied now: unlike a dense tensor they are updated in
 * place, so the snapshot cannot hold a reference. The tensors: NAME
 * [rows, dim], NAME/ids [rows] (int64), a per-row slot [rows, dim]. In an
 * increment (delta) only the rows made or updated since the last
 * checkpoint, and NAME/removed_ids. */
static int snapshot_table(ckpt_job *j, ckpt_entry *e, qr_var *v, cJSON *rec, bool delta) {
    const qr_table *t = v->table;
    if (delta && t->tier)
        return qr__fail(QR_EINVAL, "table '%s' has a disk tier (table-memory-mb): its "
                        "checkpoints are full, not incremental", v->name);
    /* full: the rows in memory, then those on the disk tier (tier.c) */
    uint64_t *sel = NULL, n = qr__tier_rows(t);
    if (delta && changed_rows(t, &sel, &n))
        return qr__fail(QR_ENOMEM, "out of memory listing the changed rows of '%s'", v->name);
    int64_t dim = t->dim;
    e->table_n = n;
    e->table_ids = malloc(QR_MAX(n, 1) * sizeof *e->table_ids);
    for (int s = 0; s <= t->nslots; s++)
        e->table_rows[s] = malloc(QR_MAX(n, 1) * (uint64_t)dim * sizeof(float));
    for (int s = 0; s <= t->nslots; s++)
        if (!e->table_rows[s]) e->table_ids = (free(e->table_ids), NULL);
    if (!e->table_ids) {
        free(sel);
        return qr__fail(QR_ENOMEM, "out of memory copying table '%s' (%llu rows) for a "
                        "checkpoint", v->name, (unsigned long long)n);
    }
    uint64_t in_memory = sel ? n : t->count;
    for (uint64_t k = 0; k < in_memory; k++) {
        uint64_t r = sel ? sel[k] : k;
        const float *row = qr_table_row(t, r);
        e->table_ids[k] = t->keys[r];
        for (int s = 0; s <= t->nslots; s++)
            memcpy(e->table_rows[s] + k * (uint64_t)dim, row + s * dim, (size_t)dim * 4);
    }
    int rc = sel ? QR_OK : qr__tier_copy_disk_rows(t, e->table_ids, e->table_rows, NULL, t->count);
    if (rc) {
        free(sel);
        return rc;
    }
    int64_t shape[2] = {(int64_t)n, dim};
    add_tensor(j, v->name, QR_DT_F32, 2, shape, e->table_rows[0]);
    const char *ids = job_name(j, "%s/%s", v->name, "ids");
    if (ids) add_tensor(j, ids, QR_DT_I64, 1, shape, e->table_ids);
    rc = ids ? snapshot_table_policy(j, e, v, sel) : QR_ENOMEM;
    free(sel);
    if (rc) return rc;
    cJSON *tab = cJSON_AddObjectToObject(rec, "table");
    cJSON_AddNumberToObject(tab, "dim", (double)dim);
    cJSON_AddStringToObject(tab, "init", t->init_text);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)t->seed);
    cJSON_AddStringToObject(tab, "seed", seed);
    cJSON_AddNumberToObject(tab, "rows", (double)n);
    if (delta) cJSON_AddBoolToObject(tab, "delta", true);
    return QR_OK;
}

/* In an increment: did v change since the base, the last checkpoint this
 * ps took a shard for? A variable made since, or a table whose changes
 * were not tracked, is written whole. */
static bool in_base(const ckpt_shard_ctx *c, const qr_var *v) {
    return c->base && v->ckpt_id == c->base && (!v->table || v->table->changed);
}

static bool unchanged_since_base(const ckpt_shard_ctx *c, const qr_var *v) {
    return in_base(c, v) && !v->table && v->version == v->ckpt_version && !v->ckpt_changed;
}

/* One variable's tensors (value, slots, average) and its metadata record. */
static int snapshot_var(ckpt_job *j, const ckpt_shard_ctx *c, qr_var *v, cJSON *vars) {
    if (unchanged_since_base(c, v)) return QR_OK; /* the base holds it as it is */
    ckpt_entry *e = &j->entries[j->nentries++];
    e->var = v;
    e->first = j->ntensors;
    cJSON *rec = cJSON_CreateObject();
    if (v->table) {
        int rc = snapshot_table(j, e, v, rec, in_base(c, v));
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
    const qr_optim *opt = ckpt_shard_optim(c, v);
    cJSON_AddStringToObject(rec, "optimizer", qr_optim_name(opt));
    cJSON *slots = cJSON_AddObjectToObject(rec, "slots");
    /* TensorFlow's optimizer name, which its slot variables carry
     * ("layer0/weights/Adam", "layer0/weights/Adam_1"). */
    const char *tf = qr_optim_tf_name(qr_optim_name(opt));
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
            int64_t shape[2] = {(int64_t)e->table_n, v->table->dim};
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

/* The shard at global step `step`, as references (ckpt_shard.h). */
int qr__ckpt_shard_snapshot(const ckpt_shard_ctx *c, const char *ckpt_dir, uint64_t id,
                            int64_t step, ckpt_job **out) {
    ckpt_job *j = qr__calloc(1, sizeof *j);
    if (!j) return QR_ENOMEM;
    uint32_t nvars = c->store->count;
    /* value, ids or average, slots; counters */
    int max_tensors = (int)nvars * (2 + QR_TABLE_MAX_SLOTS + 2 + 3) + 4;
    j->id = id;
    j->step = step;
    j->entries = qr__calloc(QR_MAX(nvars, 1), sizeof *j->entries);
    j->tensors = qr__calloc((size_t)max_tensors, sizeof *j->tensors);
    j->names = qr__calloc((size_t)max_tensors * 2, sizeof *j->names);
    j->meta = cJSON_CreateObject();
    cJSON *vars = cJSON_CreateArray();
    if (!j->entries || !j->tensors || !j->names || !j->meta || !vars) {
        cJSON_Delete(vars);
        qr__ckpt_shard_free(j);
        return qr__fail(QR_ENOMEM, "out of memory taking a checkpoint");
    }
    char dir[4096];
    int rc = qr_ckpt_path(dir, sizeof dir, ckpt_dir, step);
    char file[64];
    qr_ckpt_shard_name(file, sizeof file, c->index, c->nps);
    snprintf(j->path, sizeof j->path, "%s/%s", dir, file);
    for (uint32_t i = 0; i < c->store->cap && !rc; i++)
        if (c->store->by_id[i]) rc = snapshot_var(j, c, c->store->by_id[i], vars);
    /* What the next increment compares with: this shard, when it is a
     * checkpoint's (id 0 is a re-replication's snapshot, rerep.c: the
     * changes since the last checkpoint stay marked for the next one). */
    for (uint32_t i = 0; i < c->store->cap && !rc && id; i++) {
        qr_var *v = c->store->by_id[i];
        if (!v) continue;
        v->ckpt_id = id;
        v->ckpt_version = v->version;
        v->ckpt_changed = false;
        /* Out of memory: the table is written whole next time. */
        if (v->table && qr_table_changes_begin(v->table))
            qr__log(QR_LOG_WARN, "%s; its next checkpoint holds it whole", qr_last_error());
    }
    j->counters[0] = step;
    j->counters[1] = c->sync ? step : c->applied_steps;
    add_tensor(j, "global_step", QR_DT_I64, 0, NULL, &j->counters[0]);
    add_tensor(j, "quorum/applied_steps", QR_DT_I64, 0, NULL, &j->counters[1]);
    int nw = c->nworkers;
    if (c->index == 0 && c->data_pos) {
        j->data_pos = qr__calloc((size_t)nw, sizeof *j->data_pos);
        if (!j->data_pos) rc = QR_ENOMEM;
        else {
            memcpy(j->data_pos, c->data_pos, (size_t)nw * sizeof *j->data_pos);
            int64_t shape[1] = {nw};
            add_tensor(j, "quorum/worker_data_position", QR_DT_I64, 1, shape, j->data_pos);
        }
    }
    cJSON_AddStringToObject(j->meta, "format", QR_CKPT_FORMAT);
    /* Incremental shards are version 3: a quorum that reads only 1 and 2
     * refuses them instead of restoring an increment as a whole. */
    add_meta(j->meta, "version", "%lld", c->base ? QR_CKPT_VERSION : QR_CKPT_FULL_VERSION);
    cJSON_AddStringToObject(j->meta, "kind", c->base ? "incremental" : "full");
    if (c->base) add_meta(j->meta, "base_checkpoint_id", "%lld", (long long)c->base);
    add_meta(j->meta, "global_step", "%lld", step);
    add_meta(j->meta, "shard", "%lld", c->index);
    add_meta(j->meta, "num_shards", "%lld", c->nps);
    add_meta(j->meta, "num_workers", "%lld", nw);
    cJSON_AddStringToObject(j->meta, "mode", c->sync ? "sync" : "async");
    /* Which checkpoint this shard belongs to (ps 0's run and its count),
     * and which run of this ps wrote it: qr_ckpt_verify matches them to
     * the manifest, so a shard of another checkpoint is never mixed in. */
    char hex[24];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)c->coordinator);
    cJSON_AddStringToObject(j->meta, "checkpoint_incarnation", hex);
    add_meta(j->meta, "checkpoint_id", "%lld", (long long)id);
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)c->incarnation);
    cJSON_AddStringToObject(j->meta, "incarnation", hex);
    cJSON_AddStringToObject(j->meta, "optimizer", qr_optim_name(c->optim));
    char *vars_text = cJSON_PrintUnformatted(vars);
    cJSON_Delete(vars);
    if (!vars_text) rc = QR_ENOMEM;
    else cJSON_AddStringToObject(j->meta, "quorum.variables", vars_text);
    free(vars_text);
    if (rc) {
        qr__ckpt_shard_free(j);
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
void qr__ckpt_lower_priority(void) {
    setpriority(PRIO_PROCESS, (id_t)gettid(), 10);
}

void qr__ckpt_shard_write(uv_work_t *w) {
    ckpt_job *j = w->data;
    qr__ckpt_lower_priority();
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", j->path);
    *strrchr(dir, '/') = '\0';
    j->status = qr_mkdir(dir);
    if (!j->status)
        j->status = qr_st_write_file_progress(j->path, j->tensors, j->ntensors, j->meta,
                                              on_tensor_written, j, &j->crc, &j->bytes);
    if (j->status) snprintf(j->error, sizeof j->error, "%s", qr_last_error());
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

/* An admission filter's counters, whole (a full checkpoint's or an
 * increment's), if the file has them and the table keeps a filter. */
static int restore_filter(const qr_st_file *f, qr_table *t, const char *name) {
    char key[QR_PROTO_MAX_NAME + 24];
    snprintf(key, sizeof key, "%s/admission_filter", name);
    const qr_st_tensor *filter = qr_st_find(f, key);
    if (!filter || !t->filter.counters) return QR_OK;
    /* The table was made from the checkpoint's own options: the same size. */
    if (filter->dtype != QR_DT_U8 || filter->ndim != 1 ||
        (uint64_t)filter->shape[0] != t->filter.m)
        return qr__fail(QR_EIO, "'%s': table '%s': its admission filter is not uint8 [%llu]",
                        f->path, name, (unsigned long long)t->filter.m);
    return qr_st_read(f, filter, t->filter.counters);
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
    int rc = restore_filter(f, t, name);
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

static int restore_slots(const ckpt_shard_ctx *c, const qr_st_file *f, qr_var *v,
                         const cJSON *slots) {
    const qr_optim *opt = ckpt_shard_optim(c, v);
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
static int restore_table(const ckpt_shard_ctx *c, const qr_st_file *f, const cJSON *rec,
                         const cJSON *tab,
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
    if (!rc && v->options[0]) rc = qr_optim_create_for_var(&v->optim, c->cfg, v->options);
    if (!rc) rc = qr_optim_slots_create(ckpt_shard_optim(c, v), 0, m.shape[0], &v->slots);
    if (!rc) rc = qr__create_table(ckpt_shard_optim(c, v), v, &m);
    if (!rc) rc = restore_slots(c, f, v, slots);
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
        else if (qr_place_row(idv[r], c->nps) != c->index)
            rc = qr__fail(QR_EIO, "'%s': table '%s': id %lld does not belong on ps %d", f->path,
                          name, (long long)idv[r], c->index);
        float *row = rc ? NULL : qr_table_row(v->table, (uint64_t)at);
        for (int s = 0; s <= nslots && !rc; s++)
            memcpy(row + s * d, rows[s] + r * (uint64_t)d, (size_t)d * 4);
    }
    free(idv);
    for (int s = 0; s <= nslots; s++) free(rows[s]);
    /* Rows were added in the checkpoint's order, so update_steps lines up. */
    if (!rc) rc = restore_table_policy(f, v->table, name);
    if (!rc && (qr_store_get(c->store, v->id) || qr_store_find_name(c->store, v->name)))
        rc = qr__fail(QR_EIO, "'%s': variable '%s' (id %u) appears twice", f->path, v->name, v->id);
    if (!rc) rc = qr_store_add(c->store, v);
    if (rc) {
        qr__error_prefix("restoring table '%s': ", name);
        qr_var_free(v);
    }
    return rc;
}

static int restore_var(const ckpt_shard_ctx *c, const qr_st_file *f, const cJSON *rec) {
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
    if (table) return restore_table(c, f, rec, table, t);
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
    if (!rc && v->options[0]) rc = qr_optim_create_for_var(&v->optim, c->cfg, v->options);
    bool trainable = true;
    if (!rc) rc = qr_var_options_trainable(v->options, &trainable);
    v->non_trainable = !trainable;
    int64_t dim = v->shape[v->ndim - 1];
    if (!rc) rc = qr_optim_slots_create(ckpt_shard_optim(c, v), v->n / dim, dim, &v->slots);
    if (!rc) rc = qr_st_read(f, t, v->value->data);
    if (!rc) rc = restore_slots(c, f, v, slots);
    if (!rc && cJSON_IsString(average) && c->average_decay > 0) {
        v->average = qr_tensor_new(v->n);
        rc = v->average ? read_floats(f, average->valuestring, v->average->data, v->n) : QR_ENOMEM;
    }
    if (!rc && (qr_store_get(c->store, v->id) || qr_store_find_name(c->store, v->name)))
        rc = qr__fail(QR_EIO, "'%s': variable '%s' (id %u) appears twice", f->path, v->name, v->id);
    if (!rc) rc = qr_store_add(c->store, v);
    if (rc) {
        qr__error_prefix("restoring '%s': ", name->valuestring);
        qr_var_free(v);
    }
    return rc;
}

/* Open the shard at `path`, check its kind and mode, read its variable
 * records and counters. */
static int open_shard(const ckpt_shard_ctx *c, const char *path, bool increment, qr_st_file *f,
                      cJSON **vars, int64_t counters[2]) {
    *vars = NULL;
    int rc = qr_st_open(f, path);
    if (rc) return rc;
    const char *vars_text = qr_st_meta(f, "quorum.variables");
    const char *mode = qr_st_meta(f, "mode");
    const char *kind = qr_st_meta(f, "kind");
    bool is_increment = kind && !strcmp(kind, "incremental");
    *vars = vars_text ? cJSON_Parse(vars_text) : NULL;
    if (!cJSON_IsArray(*vars) || !mode)
        rc = qr__fail(QR_EIO, "'%s' is not a quorum shard (no quorum.variables)", path);
    else if (strcmp(mode, c->sync ? "sync" : "async"))
        rc = qr__fail(QR_EINVAL, "'%s' was written in %s mode; this run trains in %s mode", path,
                      mode, c->sync ? "sync" : "async");
    else if (is_increment != increment)
        rc = qr__fail(QR_EIO, "'%s' is %s shard where %s one was expected", path,
                      is_increment ? "an incremental" : "a full",
                      increment ? "an incremental" : "a full");
    if (!rc) rc = read_counter(f, "global_step", &counters[0]);
    if (!rc) rc = read_counter(f, "quorum/applied_steps", &counters[1]);
    if (rc) {
        cJSON_Delete(*vars);
        *vars = NULL;
        qr_st_close(f);
    }
    return rc;
}

static int restore_data_pos(const ckpt_shard_ctx *c, const qr_st_file *f) {
    const qr_st_tensor *pos = qr_st_find(f, "quorum/worker_data_position");
    if (!c->data_pos || !pos) return QR_OK;
    if (pos->dtype != QR_DT_I64 || pos->ndim != 1 || pos->shape[0] != c->nworkers) {
        qr__log(QR_LOG_WARN, "%s: the workers' data positions are for %lld workers, this "
                "cluster has %d: they start their data streams anew", f->path,
                (long long)(pos->ndim == 1 ? pos->shape[0] : -1), c->nworkers);
        return QR_OK;
    }
    return qr_st_read(f, pos, c->data_pos);
}

/* Read the shard at `path` into c's store (ckpt_shard.h). */
int qr__ckpt_shard_restore(const ckpt_shard_ctx *c, const char *path, int64_t counters[2]) {
    qr_st_file f;
    cJSON *vars;
    int rc = open_shard(c, path, false, &f, &vars, counters);
    if (rc) return rc;
    const cJSON *rec;
    cJSON_ArrayForEach(rec, vars) {
        if (rc) break;
        rc = restore_var(c, &f, rec);
    }
    if (!rc) rc = restore_data_pos(c, &f);
    cJSON_Delete(vars);
    qr_st_close(&f);
    return rc;
}

/* ---- restore: an increment on top of its base ----------------------------------- */

/* Read an int64 vector tensor NAME/suffix of n entries (n -1: any) into a
 * malloc'd array; *count its length. Absent: NULL and 0, no error. */
static int read_ids(const qr_st_file *f, const char *name, const char *suffix, int64_t n,
                    int64_t **out, uint64_t *count) {
    char key[QR_PROTO_MAX_NAME + 24];
    snprintf(key, sizeof key, "%s/%s", name, suffix);
    const qr_st_tensor *t = qr_st_find(f, key);
    *out = NULL;
    *count = 0;
    if (!t) return QR_OK;
    if (t->dtype != QR_DT_I64 || t->ndim != 1 || (n >= 0 && t->shape[0] != n))
        return qr__fail(QR_EIO, "'%s': tensor '%s' is malformed", f->path, key);
    *count = (uint64_t)t->shape[0];
    *out = malloc(QR_MAX(*count, 1) * sizeof **out);
    if (!*out) return QR_ENOMEM;
    return qr_st_read(f, t, *out);
}

/* An incremental table record: the ids removed since the base go (rows and
 * candidates), the rows it holds replace or join the table's (an admitted
 * id is no candidate any more), then the candidates it holds take their
 * counts. That order is the one the changes happened in: an id removed
 * and made again since the base is in both lists and ends up present. */
static int apply_table_delta(const ckpt_shard_ctx *c, const qr_st_file *f, const cJSON *rec,
                             const qr_st_tensor *t, qr_var *v) {
    const char *name = v->name;
    qr_table *tab = v->table;
    int64_t d = tab->dim;
    if (t->ndim != 2 || t->shape[1] != d || t->dtype != QR_DT_F32)
        return qr__fail(QR_EIO, "'%s': table '%s': its rows are not [n, %lld]", f->path, name,
                        (long long)d);
    uint64_t n = (uint64_t)t->shape[0];
    uint64_t nremoved = 0, nids = 0, nsteps = 0, ncand = 0, ncounts = 0;
    int64_t *removed = NULL, *idv = NULL, *steps = NULL, *cand = NULL, *counts = NULL;
    float *rows[1 + QR_TABLE_MAX_SLOTS] = {0};
    int rc = read_ids(f, name, "removed_ids", -1, &removed, &nremoved);
    if (!rc) rc = read_ids(f, name, "ids", (int64_t)n, &idv, &nids);
    if (!rc && nids != n)
        rc = qr__fail(QR_EIO, "'%s': table '%s' has no ids for its rows", f->path, name);
    if (!rc) rc = read_ids(f, name, "update_steps", (int64_t)n, &steps, &nsteps);
    if (!rc) rc = read_ids(f, name, "admission_ids", -1, &cand, &ncand);
    if (!rc) rc = read_ids(f, name, "admission_counts", (int64_t)ncand, &counts, &ncounts);
    if (!rc && ncounts != ncand)
        rc = qr__fail(QR_EIO, "'%s': table '%s': its admission counts are malformed", f->path,
                      name);
    if (!rc) rc = restore_slots(c, f, v, cJSON_GetObjectItemCaseSensitive(rec, "slots"));
    for (int s = 0; s <= tab->nslots && !rc; s++) {
        rows[s] = malloc(QR_MAX(n, 1) * (uint64_t)d * 4);
        if (!rows[s]) rc = QR_ENOMEM;
    }
    if (!rc) rc = qr_st_read(f, t, rows[0]);
    const cJSON *slots = cJSON_GetObjectItemCaseSensitive(rec, "slots");
    const cJSON *e = slots ? slots->child : NULL;
    for (int s = 1; s <= tab->nslots && !rc; s++, e = e ? e->next : NULL)
        rc = e ? read_floats(f, e->string, rows[s], (int64_t)n * d)
               : qr__fail(QR_EIO, "'%s': table '%s': slot %d is missing", f->path, name, s - 1);
    for (uint64_t i = 0; i < nremoved && !rc; i++) qr_table_forget_id(tab, removed[i]);
    for (uint64_t r = 0; r < n && !rc; r++) {
        if (qr_place_row(idv[r], c->nps) != c->index) {
            rc = qr__fail(QR_EIO, "'%s': table '%s': id %lld does not belong on ps %d", f->path,
                          name, (long long)idv[r], c->index);
            break;
        }
        bool added;
        if (tab->admit_after && qr_table_find(tab, idv[r]) < 0) qr_table_forget_id(tab, idv[r]);
        int64_t at = qr_table_get_or_add(tab, idv[r], &added);
        if (at < 0) {
            rc = QR_ENOMEM;
            break;
        }
        float *row = qr_table_row(tab, (uint64_t)at);
        for (int s = 0; s <= tab->nslots; s++)
            memcpy(row + s * d, rows[s] + r * (uint64_t)d, (size_t)d * 4);
        if (steps && tab->updated) tab->updated[at] = steps[r];
    }
    for (uint64_t i = 0; i < ncand && !rc && tab->admit_after; i++) {
        if (counts[i] < 1 || counts[i] > UINT32_MAX || qr_table_find(tab, cand[i]) >= 0)
            rc = qr__fail(QR_EIO, "'%s': table '%s': admission count %lld of id %lld", f->path,
                          name, (long long)counts[i], (long long)cand[i]);
        else rc = qr_table_restore_candidate(tab, cand[i], (uint32_t)counts[i]);
    }
    if (!rc) rc = restore_filter(f, tab, name);
    free(removed);
    free(idv);
    free(steps);
    free(cand);
    free(counts);
    for (int s = 0; s <= tab->nslots; s++) free(rows[s]);
    if (!rc) v->version = (uint64_t)cJSON_GetObjectItemCaseSensitive(rec, "version")->valuedouble;
    if (rc) qr__error_prefix("applying the increment of table '%s': ", name);
    return rc;
}

/* Drop variable v from the store (an increment holds it anew). */
static void store_drop(qr_store *s, qr_var *v) {
    s->by_id[v->id] = NULL;
    s->count--;
    s->bytes -= v->n * (int64_t)sizeof(float);
    qr_var_free(v);
}

/* Apply the incremental shard at `path` (ckpt_shard.h). */
int qr__ckpt_shard_apply_increment(const ckpt_shard_ctx *c, const char *path,
                                   int64_t counters[2]) {
    qr_st_file f;
    cJSON *vars;
    int rc = open_shard(c, path, true, &f, &vars, counters);
    if (rc) return rc;
    const cJSON *rec;
    cJSON_ArrayForEach(rec, vars) {
        if (rc) break;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(rec, "name");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(rec, "id");
        const cJSON *table = cJSON_GetObjectItemCaseSensitive(rec, "table");
        const cJSON *version = cJSON_GetObjectItemCaseSensitive(rec, "version");
        if (!cJSON_IsString(name) || !cJSON_IsNumber(id) || id->valuedouble < 0 ||
            id->valuedouble >= QR_MAX_VAR_ID || !cJSON_IsNumber(version)) {
            rc = qr__fail(QR_EIO, "'%s': a variable record of quorum.variables is malformed",
                          path);
            break;
        }
        qr_var *v = qr_store_get(c->store, (uint32_t)id->valuedouble);
        if (v && strcmp(v->name, name->valuestring)) {
            rc = qr__fail(QR_EIO, "'%s': variable id %u is '%s' here, '%s' in its base", path,
                          v->id, name->valuestring, v->name);
            break;
        }
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(table, "delta"))) {
            const qr_st_tensor *t = qr_st_find(&f, name->valuestring);
            if (!v || !v->table || !t)
                rc = qr__fail(QR_EIO, "'%s': the rows of table '%s' change a table its base "
                              "does not hold", path, name->valuestring);
            else rc = apply_table_delta(c, &f, rec, t, v);
            continue;
        }
        /* Written whole: it replaces the base's (or is new since). */
        if (v) store_drop(c->store, v);
        rc = restore_var(c, &f, rec);
    }
    if (!rc) rc = restore_data_pos(c, &f);
    cJSON_Delete(vars);
    qr_st_close(&f);
    return rc;
}

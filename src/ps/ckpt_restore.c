/*
 * ckpt_restore.c - one ps's shard of a checkpoint read back into a store:
 * the other half of ckpt_shard.c's format (the tensors' names and the
 * "quorum.variables" records are described there).
 *
 *   Full: the shard's variables, tables (rows, per-row slots, admission
 *   candidates or filter, update steps), slots, moving averages, counters
 *   and the workers' data positions, as if the ps had never stopped.
 *   Increment (its record says "delta"): applied onto its base, already
 *   restored: dense variables replaced whole, a table's rows made or
 *   updated since written over, its candidates merged, the ids removed
 *   since dropped, a variable made since restored whole.
 *   Received (a re-replication's SNAPSHOT, rerep.c): the dense variables
 *   made from the head alone, their tensors then the places the bytes
 *   are received into (place); the counters and tables read once every
 *   byte is in (finish).
 * A shard that does not fit the running ps (another mode, shape or
 * optimizer) is refused with a message naming it (docs/CHECKPOINTS.md,
 * "Restore").
 */
#include "ps/ps_internal.h"

#include "ckpt/ckpt.h"
#include "cluster/placement.h"
#include "ps/tier.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
static int restore_table_policy(const qr_st_file *f, qr_table *t, const char *name,
                                bool with_steps) {
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
    if (!rc && steps && t->updated && with_steps) {
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

/* A table's rows, ids and per-row slots (the tensors t, ids and those the
 * record's slots name), read in batches of at most 64Ki rows and put back
 * row by row. With a disk tier (c->tier_ps) a batch holds at most a
 * quarter of the cap, each row's update step is put back with it, and
 * what exceeds the cap is written out to disk after each batch: the rows
 * never hold much more than the cap, however large the table (a restore
 * read the whole table first before, then the tier spilled it). */
static int restore_rows(const ckpt_shard_ctx *c, const qr_st_file *f, qr_var *v,
                        const qr_st_tensor *t, const qr_st_tensor *ids, const cJSON *slots,
                        const char *name) {
    qr_table *tab = v->table;
    uint64_t n = (uint64_t)t->shape[0];
    int64_t d = tab->dim;
    int nslots = tab->nslots;
    size_t rb = (size_t)d * 4;
    const qr_st_tensor *src[1 + QR_TABLE_MAX_SLOTS] = {t};
    /* Per-row slot tensors are named in the record's slots, in order. */
    const cJSON *e = slots ? slots->child : NULL;
    for (int s = 1; s <= nslots; s++, e = e ? e->next : NULL) {
        src[s] = e ? qr_st_find(f, e->string) : NULL;
        if (!src[s] || src[s]->dtype != QR_DT_F32 || src[s]->end - src[s]->begin != n * rb)
            return qr__fail(QR_EIO, "'%s': table '%s': slot %d is missing or has the wrong size",
                            f->path, name, s - 1);
    }
    const qr_st_tensor *steps = NULL;
    if (c->tier_ps && tab->updated) {
        char key[QR_PROTO_MAX_NAME + 24];
        snprintf(key, sizeof key, "%s/update_steps", name);
        steps = qr_st_find(f, key);
        if (steps && (steps->dtype != QR_DT_I64 || steps->ndim != 1 ||
                      (uint64_t)steps->shape[0] != n))
            return qr__fail(QR_EIO, "'%s': table '%s': its update steps are malformed",
                            f->path, name);
    }
    uint64_t batch = QR_MIN(c->tier_ps ? qr__tier_batch_rows(c->tier_ps, tab) : (uint64_t)1 << 16,
                            QR_MAX(n, 1));
    int64_t *idv = malloc(batch * 8), *stepv = steps ? malloc(batch * 8) : NULL;
    float *rows[1 + QR_TABLE_MAX_SLOTS] = {0};
    int rc = idv && (!steps || stepv) ? QR_OK : QR_ENOMEM;
    for (int s = 0; s <= nslots && !rc; s++)
        if (!(rows[s] = malloc(batch * rb))) rc = QR_ENOMEM;
    for (uint64_t k0 = 0; k0 < n && !rc; k0 += batch) {
        uint64_t nb = QR_MIN(batch, n - k0);
        rc = qr_st_read_range(f, ids, k0 * 8, nb * 8, idv);
        for (int s = 0; s <= nslots && !rc; s++)
            rc = qr_st_read_range(f, src[s], k0 * rb, nb * rb, rows[s]);
        if (!rc && steps) rc = qr_st_read_range(f, steps, k0 * 8, nb * 8, stepv);
        for (uint64_t r = 0; r < nb && !rc; r++) {
            bool added;
            int64_t at = qr_table_get_or_add(tab, idv[r], &added);
            if (at < 0) rc = QR_ENOMEM;
            else if (!added) rc = qr__fail(QR_EIO, "'%s': table '%s': id %lld appears twice",
                                           f->path, name, (long long)idv[r]);
            else if (qr_place_row(idv[r], c->nps) != c->index)
                rc = qr__fail(QR_EIO, "'%s': table '%s': id %lld does not belong on ps %d",
                              f->path, name, (long long)idv[r], c->index);
            float *row = rc ? NULL : qr_table_row(tab, (uint64_t)at);
            for (int s = 0; s <= nslots && !rc; s++) memcpy(row + s * d, rows[s] + r * d, rb);
            if (!rc && steps) tab->updated[at] = stepv[r];
        }
        if (!rc && c->tier_ps) rc = qr__tier_restore_spill(c->tier_ps, v);
    }
    if (rc == QR_ENOMEM) rc = qr__fail(QR_ENOMEM, "out of memory restoring table '%s'", name);
    free(idv);
    free(stepv);
    for (int s = 0; s <= nslots; s++) free(rows[s]);
    return rc;
}

/* A table's record: its rows, ids and per-row slots, read in batches and
 * put back row by row (restore_rows); the per-variable scalar slots as
 * for a dense one. */
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
    if (!rc && (qr_store_get(c->store, v->id) || qr_store_find_name(c->store, v->name)))
        rc = qr__fail(QR_EIO, "'%s': variable '%s' (id %u) appears twice", f->path, v->name, v->id);
    if (!rc && c->tier_ps) rc = qr__tier_restore_attach(c->tier_ps, v);
    if (!rc) rc = restore_rows(c, f, v, t, ids, slots, name);
    /* Rows were added in the checkpoint's order, so update_steps lines up
     * (with a tier they were put back with each batch). */
    if (!rc) rc = restore_table_policy(f, v->table, name, !c->tier_ps);
    if (!rc) rc = qr_store_add(c->store, v);
    if (rc) {
        qr__error_prefix("restoring table '%s': ", name);
        if (c->tier_ps) qr__tier_detach(c->tier_ps, v);
        qr_var_free(v);
    }
    return rc;
}

/* Which records a walk restores: a shard read whole restores all; one
 * whose bytes are still to come places its dense variables first (their
 * tensors then land in them) and restores its tables once it is in. */
typedef enum { RESTORE_ALL, RESTORE_DENSE, RESTORE_TABLES } restore_part;

static int restore_var(const ckpt_shard_ctx *c, const qr_st_file *f, const cJSON *rec,
                       restore_part part) {
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
    if (table) return part == RESTORE_DENSE ? QR_OK : restore_table(c, f, rec, table, t);
    if (part == RESTORE_TABLES) return QR_OK;
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
    v->value = v->name && v->options ? qr_tensor_new_uninit(v->n) : NULL; /* read whole */
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
        v->average = qr_tensor_new_uninit(v->n); /* read whole */
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

/* f, opened: check its kind and mode and parse its variable records
 * (*vars; NULL on an error, f left open). */
static int check_kind(const ckpt_shard_ctx *c, bool increment, const qr_st_file *f,
                      cJSON **vars) {
    const char *path = f->path;
    int rc = QR_OK;
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
    if (rc) {
        cJSON_Delete(*vars);
        *vars = NULL;
    }
    return rc;
}

static int read_counters(const qr_st_file *f, int64_t counters[2]) {
    int rc = read_counter(f, "global_step", &counters[0]);
    if (!rc) rc = read_counter(f, "quorum/applied_steps", &counters[1]);
    return rc;
}

/* f, opened: check_kind, then its counters (f closed on an error). */
static int check_shard(const ckpt_shard_ctx *c, bool increment, qr_st_file *f, cJSON **vars,
                       int64_t counters[2]) {
    int rc = check_kind(c, increment, f, vars);
    if (!rc) rc = read_counters(f, counters);
    if (rc) {
        cJSON_Delete(*vars);
        *vars = NULL;
        qr_st_close(f);
    }
    return rc;
}

/* Open the shard at `path`, then check_shard. */
static int open_shard(const ckpt_shard_ctx *c, const char *path, bool increment, qr_st_file *f,
                      cJSON **vars, int64_t counters[2]) {
    *vars = NULL;
    int rc = qr_st_open(f, path);
    return rc ? rc : check_shard(c, increment, f, vars, counters);
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

/* A full shard, opened and checked, into c's store (the records `part`
 * names); f and vars freed. */
static int restore_opened(const ckpt_shard_ctx *c, qr_st_file *f, cJSON *vars,
                          restore_part part) {
    int rc = QR_OK;
    const cJSON *rec;
    cJSON_ArrayForEach(rec, vars) {
        if (rc) break;
        rc = restore_var(c, f, rec, part);
    }
    if (!rc) rc = restore_data_pos(c, f);
    cJSON_Delete(vars);
    qr_st_close(f);
    return rc;
}

/* Read the shard at `path` into c's store (ckpt_shard.h). */
int qr__ckpt_shard_restore(const ckpt_shard_ctx *c, const char *path, int64_t counters[2]) {
    qr_st_file f;
    cJSON *vars;
    int rc = open_shard(c, path, false, &f, &vars, counters);
    return rc ? rc : restore_opened(c, &f, vars, RESTORE_ALL);
}

int qr__ckpt_shard_place(const ckpt_shard_ctx *c, qr_st_file *f, cJSON **vars) {
    *vars = NULL;
    int rc = check_kind(c, false, f, vars);
    const cJSON *rec;
    cJSON_ArrayForEach(rec, *vars) { /* NULL on an error */
        if (rc) break;
        rc = restore_var(c, f, rec, RESTORE_DENSE);
    }
    if (!rc) rc = qr_st_place_rest(f);
    if (rc) {
        cJSON_Delete(*vars);
        *vars = NULL;
        qr_st_close(f);
    }
    return rc;
}

int qr__ckpt_shard_finish(const ckpt_shard_ctx *c, qr_st_file *f, cJSON *vars,
                          int64_t counters[2]) {
    int rc = read_counters(f, counters);
    if (rc) {
        cJSON_Delete(vars);
        qr_st_close(f);
        return rc;
    }
    return restore_opened(c, f, vars, RESTORE_TABLES);
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
    /* With a disk tier, each batch of ids comes back in memory first (its
     * rows on disk, to be removed or written over), as a request's do. */
    uint64_t batch = c->tier_ps ? qr__tier_batch_rows(c->tier_ps, tab) : UINT64_MAX;
    for (uint64_t i = 0; i < nremoved && !rc; i++) {
        if (c->tier_ps && i % batch == 0)
            rc = qr__tier_fault_in(c->tier_ps, v, removed + i,
                                   (int64_t)QR_MIN(batch, nremoved - i));
        if (!rc) qr_table_forget_id(tab, removed[i]);
    }
    for (uint64_t r = 0; r < n && !rc; r++) {
        if (c->tier_ps && r % batch == 0) {
            rc = qr__tier_fault_in(c->tier_ps, v, idv + r, (int64_t)QR_MIN(batch, n - r));
            if (rc) break;
        }
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
        if (v && c->tier_ps) qr__tier_detach(c->tier_ps, v);
        if (v) store_drop(c->store, v);
        rc = restore_var(c, &f, rec, RESTORE_ALL);
    }
    if (!rc) rc = restore_data_pos(c, &f);
    cJSON_Delete(vars);
    qr_st_close(&f);
    return rc;
}

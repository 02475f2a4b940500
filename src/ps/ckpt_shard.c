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
 *   Restore (ckpt_restore.c): the shard's variables, tables, slots,
 *   averages, counters and the workers' data positions, back into a
 *   store, as if the ps had never stopped.
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
 * made or updated since (on either tier: a row changed and then written
 * out to the disk tier is read back from it), the candidates sighted since (an admission
 * filter's counters whole: a sighting changes counters, not an entry) and
 * the ids removed since (its record says "delta"); a variable made since
 * is written whole. Restoring (ckpt_restore.c) applies it onto its base,
 * already restored.
 */
#include "ps/ps_internal.h"
#include "ps/tier.h"

#include "ckpt/ckpt.h"
#include "cluster/placement.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
    /* A full checkpoint of a tiered table: its rows streamed at the cut
     * into an unnamed spool file (not copied in memory), at these offsets */
    bool spooled;
    int spool_fd;
    uint64_t spool_ids, spool_rows[1 + QR_TABLE_MAX_SLOTS], spool_steps;
    /* ... its rows in memory at the cut; those only on disk then, from
     * row spool_from on, come from the disk tier's snapshot on the
     * writer's thread (spool_disk_rows) */
    qr_tier_snap *snap;
    uint64_t spool_from;
    int spool_dim, spool_nslots;
    bool spool_has_steps;
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
    qr__tier_snap_end(e->snap); /* (never read: the job failed before or in its write) */
    e->snap = NULL;
    if (e->spooled) close(e->spool_fd);
    e->spooled = false;
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

/* A tensor of a table's: from the spool when the rows were spooled. */
static void add_table_tensor(ckpt_job *j, const ckpt_entry *e, const char *name, qr_dtype dt,
                             int ndim, const int64_t *shape, const void *data, uint64_t off) {
    add_tensor(j, name, dt, ndim, shape, e->spooled ? NULL : data);
    if (!e->spooled) return;
    qr_st_tensor *t = &j->tensors[j->ntensors - 1];
    t->from_fd = true;
    t->src_fd = e->spool_fd;
    t->src_off = off;
}

/* Admission and eviction state, copied with the rows: NAME/admission_ids
 * and NAME/admission_counts [candidates] (ids seen, not admitted yet, and
 * their sightings), NAME/update_steps [rows] (the step of each row's last
 * update, in the rows' order), all int64; under admit_filter=bloom
 * NAME/admission_filter [counters] (uint8) in place of the candidates. An
 * increment (sel) holds the candidates sighted since the last checkpoint
 * (the filter whole) and its rows' steps. */
static int snapshot_table_policy(ckpt_job *j, ckpt_entry *e, qr_var *v, const uint64_t *sel,
                                 uint64_t nsel) {
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
    if (t->updated && e->spooled) { /* streamed with the rows */
        const char *name = job_name(j, "%s/%s", v->name, "update_steps");
        if (!name) return QR_ENOMEM;
        int64_t shape[1] = {(int64_t)e->table_n};
        add_table_tensor(j, e, name, QR_DT_I64, 1, shape, NULL, e->spool_steps);
    } else if (t->updated) { /* (no tier: the rows in memory are all) */
        uint64_t n = e->table_n;
        e->table_policy[2] = malloc(QR_MAX(n, 1) * sizeof(int64_t));
        const char *name = job_name(j, "%s/%s", v->name, "update_steps");
        if (!e->table_policy[2] || !name)
            return qr__fail(QR_ENOMEM, "out of memory copying the update steps of '%s'", v->name);
        for (uint64_t r = 0; r < n; r++) e->table_policy[2][r] = t->updated[sel ? sel[r] : r];
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

/* A table's part of its variable's record. */
static int table_record(cJSON *rec, const qr_table *t, uint64_t n, bool delta) {
    cJSON *tab = cJSON_AddObjectToObject(rec, "table");
    cJSON_AddNumberToObject(tab, "dim", (double)t->dim);
    cJSON_AddStringToObject(tab, "init", t->init_text);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)t->seed);
    cJSON_AddStringToObject(tab, "seed", seed);
    cJSON_AddNumberToObject(tab, "rows", (double)n);
    if (delta) cJSON_AddBoolToObject(tab, "delta", true);
    return QR_OK;
}

/* ---- a full checkpoint of a tiered table, streamed ------------------------------
 *
 * Copying a tiered table's rows (both tiers) into memory for the writer
 * would take the whole table's size in memory, not the cap's. Instead
 * they are streamed into an unnamed spool file in the tier's directory,
 * a batch at a time (buffers of SPOOL_BATCH_BYTES at the cut, of
 * SPOOL_WRITER_BATCH_BYTES on the writer), laid out as the shard holds
 * the tensors (ids, value, each slot, update steps); the
 * writer copies them from it into the shard a chunk at a time
 * (qr_st_tensor.from_fd). The rows in memory change in place, so the cut
 * (on the loop) spools them, at most the cap's bytes. The rows only on
 * disk, most of a table several times its cap, are read by the writer's
 * thread from the disk tier's snapshot of the cut (an LMDB read
 * transaction, qr__tier_snap_begin) while training goes on: the loop no
 * longer pauses for the whole table. The spool turns a copy's memory into
 * page cache (written back and dropped by the kernel, never the ps's
 * anonymous memory) and the file's disk space, at the price of writing
 * the table's bytes twice. */
#define SPOOL_BATCH_BYTES ((size_t)8 << 20)
/* The writer's: its buffers are resident beside the loop's memory while
 * training goes on (the cut's, while the loop waits for them). */
#define SPOOL_WRITER_BATCH_BYTES ((size_t)2 << 20)

typedef struct spool {
    ckpt_entry *e;
    int dim, nslots;         /* the table's at the cut (the writer must not read it) */
    bool has_steps;
    uint64_t batch, k0, nb;  /* rows a batch; the first row of this batch; rows in it */
    int64_t *ids, *steps;
    float *rows[1 + QR_TABLE_MAX_SLOTS];
    void *buffers;           /* one mapping for all of them */
    size_t buffers_len;
} spool;

static int spool_write(int fd, const void *p, size_t len, uint64_t off) {
    const uint8_t *b = p;
    while (len) {
        ssize_t n = pwrite(fd, b, len, (off_t)off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return qr__fail(QR_EIO, "writing a checkpoint's spool: %s", strerror(errno));
        b += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return QR_OK;
}

static int spool_flush(spool *sp) {
    ckpt_entry *e = sp->e;
    size_t rb = (size_t)sp->dim * 4;
    int rc = spool_write(e->spool_fd, sp->ids, sp->nb * 8, e->spool_ids + sp->k0 * 8);
    for (int s = 0; s <= sp->nslots && !rc; s++)
        rc = spool_write(e->spool_fd, sp->rows[s], sp->nb * rb, e->spool_rows[s] + sp->k0 * rb);
    if (!rc && sp->has_steps)
        rc = spool_write(e->spool_fd, sp->steps, sp->nb * 8, e->spool_steps + sp->k0 * 8);
    sp->k0 += sp->nb;
    sp->nb = 0;
    return rc;
}

static int spool_row(void *ctx, int64_t id, const void *row, int64_t step) {
    spool *sp = ctx;
    size_t rb = (size_t)sp->dim * 4;
    if (sp->k0 + sp->nb >= sp->e->table_n)
        return qr__fail(QR_EINTERNAL, "a spooled table: more rows than the %llu counted",
                        (unsigned long long)sp->e->table_n);
    sp->ids[sp->nb] = id;
    sp->steps[sp->nb] = step;
    for (int s = 0; s <= sp->nslots; s++)
        memcpy(sp->rows[s] + sp->nb * (uint64_t)sp->dim, (const char *)row + s * rb, rb);
    return ++sp->nb == sp->batch ? spool_flush(sp) : QR_OK;
}

/* A spool's batch buffers, for e's table from row k0 on: mapped for
 * themselves, so that they go back to the kernel when closed (freed, the
 * writer thread's malloc arena would keep them resident: 8 MiB more of
 * the ps's anonymous memory for the rest of the run). */
static int spool_open(spool *sp, ckpt_entry *e, uint64_t k0, size_t bytes) {
    size_t rb = (size_t)e->spool_dim * 4;
    *sp = (spool){.e = e, .dim = e->spool_dim, .nslots = e->spool_nslots,
                  .has_steps = e->spool_has_steps, .k0 = k0};
    sp->batch = QR_MAX(bytes / (16 + (sp->nslots + 1) * rb), 64);
    size_t len = sp->batch * (16 + (size_t)(sp->nslots + 1) * rb);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return qr__fail(QR_ENOMEM, "out of memory streaming a table for a checkpoint");
    sp->buffers = m;
    sp->buffers_len = len;
    sp->ids = m;
    sp->steps = sp->ids + sp->batch;
    float *rows = (float *)(sp->steps + sp->batch);
    for (int s = 0; s <= sp->nslots; s++) sp->rows[s] = rows + (size_t)s * sp->batch * sp->dim;
    return QR_OK;
}

static void spool_close(spool *sp) {
    if (sp->buffers) munmap(sp->buffers, sp->buffers_len);
    sp->buffers = NULL;
}

/* At the cut (loop): the rows in memory (an increment's: the changed
 * ones, sel) into the spool, and the disk tier's snapshot for the rest
 * (spool_disk_rows): the rows only on disk, or the changed rows there. */
static int spool_table(ckpt_entry *e, const qr_table *t, const char *name, const uint64_t *sel,
                       uint64_t nsel) {
    uint64_t n = e->table_n, rb = (uint64_t)t->dim * 4;
    int fd = qr__tier_spool(t);
    if (fd < 0) return -fd;
    e->spooled = true;
    e->spool_fd = fd;
    e->spool_ids = 0;
    for (int s = 0; s <= t->nslots; s++) e->spool_rows[s] = n * 8 + (uint64_t)s * n * rb;
    e->spool_steps = n * 8 + (uint64_t)(t->nslots + 1) * n * rb;
    e->spool_dim = (int)t->dim;
    e->spool_nslots = t->nslots;
    e->spool_has_steps = t->updated != NULL;
    spool sp;
    int rc = spool_open(&sp, e, 0, SPOOL_BATCH_BYTES);
    for (uint64_t k = 0; k < (sel ? nsel : t->count) && !rc; k++) {
        uint64_t r = sel ? sel[k] : k;
        rc = spool_row(&sp, t->keys[r], qr_table_row(t, r), t->updated ? t->updated[r] : 0);
    }
    if (!rc && sp.nb) rc = spool_flush(&sp);
    spool_close(&sp);
    e->spool_from = sp.k0;
    if (!rc && sel && t->ndisk_changed) /* (none: nothing to read from disk) */
        rc = qr__tier_snap_begin(t, t->disk_changed_ids, t->ndisk_changed, &e->snap);
    else if (!rc && !sel)
        rc = qr__tier_snap_begin(t, NULL, 0, &e->snap);
    if (!rc && sp.k0 + qr__tier_snap_rows(e->snap) != n)
        rc = qr__fail(QR_EINTERNAL, "table '%s': %llu rows in memory and %llu on disk, %llu "
                      "counted", name, (unsigned long long)sp.k0,
                      (unsigned long long)qr__tier_snap_rows(e->snap), (unsigned long long)n);
    return rc;
}

/* On the writer's thread: the rows only on disk at the cut, from the
 * tier's snapshot into the spool after the rows in memory. */
static int spool_disk_rows(ckpt_entry *e) {
    spool sp;
    int rc = spool_open(&sp, e, e->spool_from, SPOOL_WRITER_BATCH_BYTES);
    if (!rc) rc = qr__tier_snap_each(e->snap, spool_row, &sp);
    if (!rc && sp.nb) rc = spool_flush(&sp);
    if (!rc && sp.k0 != e->table_n)
        rc = qr__fail(QR_EINTERNAL, "a spooled table: %llu rows streamed, %llu counted",
                      (unsigned long long)sp.k0, (unsigned long long)e->table_n);
    spool_close(&sp);
    qr__tier_snap_end(e->snap);
    e->snap = NULL;
    return rc;
}

/* A tiered table's rows, streamed into a spool (above): all of them, or
 * in an increment (sel: its changed rows in memory) the changed ones. */
static int snapshot_tiered_table(ckpt_job *j, ckpt_entry *e, qr_var *v, cJSON *rec,
                                 const uint64_t *sel, uint64_t nsel) {
    const qr_table *t = v->table;
    e->table_n = sel ? nsel + t->ndisk_changed : qr__tier_rows(t);
    int rc = spool_table(e, t, v->name, sel, nsel);
    if (rc) return rc;
    j->disk_rows += qr__tier_snap_rows(e->snap);
    int64_t shape[2] = {(int64_t)e->table_n, t->dim};
    add_table_tensor(j, e, v->name, QR_DT_F32, 2, shape, NULL, e->spool_rows[0]);
    const char *ids = job_name(j, "%s/%s", v->name, "ids");
    if (ids) add_table_tensor(j, e, ids, QR_DT_I64, 1, shape, NULL, e->spool_ids);
    rc = ids ? snapshot_table_policy(j, e, v, sel, nsel) : QR_ENOMEM;
    if (rc) return rc;
    return table_record(rec, t, e->table_n, sel != NULL);
}

/* A table's rows, copied now (a tiered one's: streamed, above): unlike a
 * dense tensor they are updated in place, so the snapshot cannot hold a
 * reference. The tensors: NAME [rows, dim], NAME/ids [rows] (int64), a
 * per-row slot [rows, dim]. In an increment (delta) only the rows made or
 * updated since the last checkpoint (on either tier: moves between the
 * tiers are no changes, table.h), and NAME/removed_ids. */
static int snapshot_table(ckpt_job *j, ckpt_entry *e, qr_var *v, cJSON *rec, bool delta) {
    const qr_table *t = v->table;
    uint64_t *sel = NULL, n = t->count, nsel = 0;
    if (delta) {
        if (changed_rows(t, &sel, &nsel))
            return qr__fail(QR_ENOMEM, "out of memory listing the changed rows of '%s'", v->name);
        n = nsel;
    }
    if (t->tier) {
        int rc = snapshot_tiered_table(j, e, v, rec, sel, nsel);
        free(sel);
        return rc;
    }
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
    uint64_t in_memory = sel ? nsel : t->count;
    for (uint64_t k = 0; k < in_memory; k++) {
        uint64_t r = sel ? sel[k] : k;
        const float *row = qr_table_row(t, r);
        e->table_ids[k] = t->keys[r];
        for (int s = 0; s <= t->nslots; s++)
            memcpy(e->table_rows[s] + k * (uint64_t)dim, row + s * dim, (size_t)dim * 4);
    }
    int64_t shape[2] = {(int64_t)n, dim};
    add_tensor(j, v->name, QR_DT_F32, 2, shape, e->table_rows[0]);
    const char *ids = job_name(j, "%s/%s", v->name, "ids");
    if (ids) add_tensor(j, ids, QR_DT_I64, 1, shape, e->table_ids);
    int rc = ids ? snapshot_table_policy(j, e, v, sel, nsel) : QR_ENOMEM;
    free(sel);
    if (rc) return rc;
    return table_record(rec, t, n, delta);
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
            add_table_tensor(j, e, name, QR_DT_F32, 2, shape, e->table_rows[1 + s],
                             e->spool_rows[1 + s]);
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
    /* (after a failure, the snapshots left unread end with the job) */
    for (int i = 0; i < j->nentries && !j->status; i++)
        if (j->entries[i].snap) j->status = spool_disk_rows(&j->entries[i]);
    if (!j->status)
        j->status = qr_st_write_file_progress(j->path, j->tensors, j->ntensors, j->meta,
                                              on_tensor_written, j, &j->crc, &j->bytes);
    if (j->status) snprintf(j->error, sizeof j->error, "%s", qr_last_error());
}

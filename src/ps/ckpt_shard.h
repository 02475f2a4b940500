/*
 * ckpt_shard.h - one ps's shard of a checkpoint, its format only
 * (ckpt_shard.c): taken as references on the loop, written on libuv's
 * thread pool, read back into a store at start (ckpt_restore.c). When a checkpoint is
 * taken, by whom, and what becomes of the written shard is the
 * orchestration's (ckpt_coord.c); like Redis's rdb.c, nothing here knows
 * it. The format reads the ps only through ckpt_shard_ctx, so a store can
 * be written and restored without a ps or a cluster (test_ckpt_shard.c).
 * A shard is full, or an increment of the previous one this ps took
 * (ctx.base): only what changed since, and the ids removed.
 */
#ifndef QR_PS_CKPT_SHARD_H
#define QR_PS_CKPT_SHARD_H

#include "ckpt/ckpt.h"
#include "common/config.h"
#include "optim/optim.h"
#include "ps/store.h"

#include <uv.h>

/* What the format reads of the ps (and, restoring, writes into). */
typedef struct ckpt_shard_ctx {
    qr_store *store;         /* the variables: snapshot marks each v->ckpt */
    const qr_optim *optim;   /* the ps's optimizer, for variables without their own */
    const qr_config *cfg;    /* restore: makes a variable's own optimizer */
    int index, nps;          /* this shard, of how many (a table row's place) */
    int nworkers;
    bool sync;               /* the run's mode: written, and checked at restore */
    int64_t applied_steps;   /* async: step pushes applied here (Adam's t) */
    float average_decay;     /* restore: 0 leaves moving averages out */
    uint64_t *data_pos;      /* ps 0: the workers' data positions [nworkers]; NULL */
    /* written into the shard's header, so that it names its checkpoint:
     * this ps run's incarnation, and the ps 0 run whose checkpoint it is */
    uint64_t incarnation, coordinator;
    /* snapshot: the checkpoint this one is an increment of (its id, the
     * last this ps took a shard for), or 0 for a full one */
    uint64_t base;
    /* restore: the ps whose disk tier (opened before the restore) takes
     * the tables' rows as they come, batch by batch; NULL: none */
    struct qr_ps *tier_ps;
} ckpt_shard_ctx;

/* The optimizer that applies to v: its own, else the ps's. */
static inline const qr_optim *ckpt_shard_optim(const ckpt_shard_ctx *c, const qr_var *v) {
    return v->optim ? v->optim : c->optim;
}

typedef struct ckpt_entry ckpt_entry;

/* A shard being written: made by qr__ckpt_shard_snapshot on the loop,
 * written by qr__ckpt_shard_write on the thread pool (work.data is the
 * job), freed on the loop. */
typedef struct ckpt_job {
    uv_work_t work;
    qr_ps *ps;              /* the orchestration's: who to tell (NULL here) */
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
    struct cJSON *meta;
    /* the result, set by the writer */
    int status;
    char error[512];
    uint32_t crc;
    uint64_t bytes;
    /* set by the snapshot: the tiered tables' rows it left on disk for the
     * writer to read (qr__tier_snap_begin), not copied at the cut */
    uint64_t disk_rows;
} ckpt_job;

/* The shard of c's store at global step `step`, as references, to be
 * written under checkpoint root `dir` (its path in (*out)->path). Each
 * variable's v->ckpt points at its entry until the writer has passed it
 * or the variable is next applied (qr__ckpt_before_apply). */
int qr__ckpt_shard_snapshot(const ckpt_shard_ctx *c, const char *dir, uint64_t id, int64_t step,
                            ckpt_job **out);
/* A snapshot of s is still being written (a variable's v->ckpt is set):
 * a second one must wait, since a variable protects one snapshot's
 * entry at a time (a checkpoint's and a re-replication's of one store). */
bool qr__ckpt_store_busy(const qr_store *s);
/* uv_work_cb: write the job's shard, durably; sets its status, error,
 * crc and bytes. Runs off the loop. */
void qr__ckpt_shard_write(uv_work_t *w);
void qr__ckpt_shard_free(ckpt_job *j);
/* Lower the calling thread's priority below the loop's: a checkpoint's
 * writer threads call it. */
void qr__ckpt_lower_priority(void);
/* Read the shard at `path` into c's store (and c->data_pos), checking it
 * was written in c's mode; counters: its global_step, applied_steps. */
int qr__ckpt_shard_restore(const ckpt_shard_ctx *c, const char *path, int64_t counters[2]);
/* A full shard whose bytes are still to come (a re-replication's
 * SNAPSHOT, received straight into the variables): f opened with
 * qr_st_open_head. place: check its kind and mode, make its dense
 * variables in c's store (their values, slots and averages then are the
 * places their tensors land in), give the other tensors a place of f's
 * (qr_st_place_rest); *vars its records (f closed on an error). Once
 * every byte is in, finish: its counters, its tables; f and vars freed.
 * c's store is a fresh one, put in service only once finish succeeds. */
int qr__ckpt_shard_place(const ckpt_shard_ctx *c, qr_st_file *f, struct cJSON **vars);
int qr__ckpt_shard_finish(const ckpt_shard_ctx *c, qr_st_file *f, struct cJSON *vars,
                          int64_t counters[2]);
/* Apply the incremental shard at `path` to c's store, which holds its
 * base restored (a full shard and the increments before it, in order):
 * the rows, dense variables and admission counts it holds replace what is
 * there, the ids it lists as removed go; counters as for a full one. */
int qr__ckpt_shard_apply_increment(const ckpt_shard_ctx *c, const char *path,
                                   int64_t counters[2]);

#endif /* QR_PS_CKPT_SHARD_H */

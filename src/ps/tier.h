/*
 * tier.h - tables larger than memory: with --table-memory-mb N a ps keeps
 * at most N MiB of its embedding tables' rows in memory; colder rows live
 * on a disk tier (an LMDB environment under --table-dir) and come back, a
 * request's misses in one batch, when a lookup or a push asks for them
 * (docs/EMBEDDINGS.md, "Tables larger than memory").
 *
 * The tables themselves (table.c) stay all-in-memory structures: before a
 * request touches a table, qr__tier_fault_in makes every id it names that
 * has a row present in memory (brought back from disk, colder rows
 * written out to make room), so lookup.c and rows.c run unchanged and a
 * tiered table computes bit for bit what an all-in-memory one does.
 * Used only from the ps loop thread.
 */
#ifndef QR_PS_TIER_H
#define QR_PS_TIER_H

#include "ps/table.h"

#include <stdbool.h>
#include <stdint.h>

struct qr_ps;
struct qr_var;

/* What a table's tiers hold and did (zeros without a tier). */
typedef struct qr_tier_stats {
    uint64_t rows_memory, rows_disk;
    uint64_t disk_bytes;   /* the table's pages in the LMDB file */
    uint64_t memory_hits;  /* ids of requests found in memory */
    uint64_t disk_hits;    /* ids brought back from disk */
    uint64_t misses;       /* ids in neither tier (new rows, or not admitted yet) */
    uint64_t rows_spilled; /* rows written out to make room */
} qr_tier_stats;

/* Open the ps's disk tier if --table-memory-mb asks for one (at the start
 * of a run, before a restore, which puts rows back through it). */
int qr__tier_init(struct qr_ps *ps);
/* Close it; a private directory is removed. */
void qr__tier_free(struct qr_ps *ps);

/* Before a lookup or a push of ids[0..n) on v's table (whose clock is
 * set): every id with a row on disk gets it back in memory, in one LMDB
 * transaction with the rows spilled to keep the cap. QR_EINVAL if the
 * request alone needs more rows than the cap holds, QR_EIO on a failure
 * of the store, QR_ENOMEM: the table is then unchanged. Nothing to do
 * without a tier. */
int qr__tier_fault_in(struct qr_ps *ps, struct qr_var *v, const int64_t *ids, int64_t n);

/* Table t (with a tier) removes id's row from memory (eviction by age, a
 * restore's removal): its stale record on disk goes too, so that the id
 * does not come back from it. An LMDB failure fails the tier (the next
 * request says so). */
void qr__tier_forget(qr_table *t, int64_t id);

/* Rows of table t on disk only (0 without a tier). */
uint64_t qr__tier_disk_rows(const qr_table *t);
/* Rows of table t in both tiers. */
static inline uint64_t qr__tier_rows(const qr_table *t) {
    return t->count + qr__tier_disk_rows(t);
}

void qr__tier_stats(const qr_table *t, qr_tier_stats *out);

/* A checkpoint's rows on disk, read off the loop (tier.c says how).
 * snap_begin, on the loop at the cut: *out is the snapshot of a full
 * checkpoint's rows only on disk (changed NULL), or of an increment's
 * changed rows on disk (the nchanged ids of `changed`, copied); NULL when
 * there are none. snap_each, on the checkpoint writer's thread:
 * its rows one at a time in key order, each as fn(ctx, id, row, step):
 * row points at its value and slots (stride floats, not aligned) in
 * LMDB's map, good until fn returns; step is its update step (the
 * table's clock at the cut without eviction by age); an error of fn
 * stops the walk; QR_EIO unless exactly snap_rows rows came. snap_end,
 * on either thread, once: the loop's writes may reuse its pages again.
 * The tier is not freed before every snapshot has ended (the ps ends
 * once its writer has). */
typedef struct qr_tier_snap qr_tier_snap;
int qr__tier_snap_begin(const qr_table *t, const int64_t *changed, uint64_t nchanged,
                        qr_tier_snap **out);
int qr__tier_snap_each(qr_tier_snap *s,
                       int (*fn)(void *ctx, int64_t id, const void *row, int64_t step),
                       void *ctx);
uint64_t qr__tier_snap_rows(const qr_tier_snap *s);
void qr__tier_snap_end(qr_tier_snap *s);
/* An unnamed file (O_TMPFILE, or made and unlinked) in the tier's
 * directory, for a checkpoint's spool: its fd, or minus an error. */
int qr__tier_spool(const qr_table *t);

/* A restore in bounded batches (ckpt_restore.c), with the tier opened
 * before it: attach v's table (made by the restore, not yet in the
 * store) to the tier; after each batch of rows added, spill what exceeds
 * the cap; detach a table that goes (replaced whole by an increment, or
 * a failed restore), its records dropped. */
int qr__tier_restore_attach(struct qr_ps *ps, struct qr_var *v);
int qr__tier_restore_spill(struct qr_ps *ps, struct qr_var *v);
void qr__tier_detach(struct qr_ps *ps, struct qr_var *v);
/* Rows of t a restore's batch may hold: at most 64Ki, and a quarter of
 * the cap (a request of that many ids fits it). */
uint64_t qr__tier_batch_rows(const struct qr_ps *ps, const qr_table *t);

#endif /* QR_PS_TIER_H */

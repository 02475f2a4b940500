/*
 * table.h - an embedding table's shard on a ps: id (int64) -> row of dim
 * float32 values and the row's optimizer slots, growing as ids are seen
 * (the DeepRec EmbeddingVariable idea; docs/EMBEDDINGS.md).
 *
 * Memory: rows live in an arena of chunks, each row's value and slots side
 * by side (dim * (1 + slots) floats: one apply touches adjacent cache
 * lines), plus per row its id (8 bytes) and its slot in the hash index
 * (common/idmap.h: 5.7 to 11.4 bytes). Chunks are never moved, so a row
 * stays where it is while the table grows (no copy of the whole table, and
 * a pointer to a row is good until the next removal).
 *
 * A new row gets its value from the table's initializer, seeded by the
 * table's seed and the row's id alone (common/init.h), so it is the same
 * on whichever shard and whenever it is made; its slots start at the
 * optimizer's initial values. Used only from the ps loop thread.
 *
 * Admission and eviction (optional, common/table_options.h; DeepRec's
 * counter filter and global-step eviction): with admit_after k > 1 an id
 * gets a row only at its k-th sighting (a lookup that would make it);
 * until then reads see its initial value, its sightings are counted in a
 * second index of candidates, and pushes to it are dropped and counted.
 * With admit_filter=bloom the sightings are counted instead in a counting
 * Bloom filter of fixed size (common/bloom.h): memory that stays the same
 * however many ids come, at the price of ids admitted early (never late)
 * when other ids share all their counters. An admitted id stops counting
 * (its counters keep what it gave them), so an evicted row's id comes
 * back at its next sighting.
 * With evict_after T > 0 each row keeps the step of its last update (8
 * bytes a row, only then) and rows idle for more than T steps are removed
 * by a sweep every T/4 steps. The clock is the caller's: the steps applied
 * on this ps (the global step in sync mode).
 *
 * Changes since the last checkpoint (incremental checkpoints,
 * docs/CHECKPOINTS.md): once qr_table_changes_begin was called, each row
 * and each admission candidate carries a flag set when it is made or
 * updated (1 byte a row), and removed rows' ids are listed; the next
 * qr_table_changes_begin (the next checkpoint's snapshot) clears them.
 * With a disk tier (tier.c) a row moving out to disk and back is neither
 * removed nor made: its flag goes with it. Why a set of ids beside the
 * table rather than a flag in the tier's record: the next increment must
 * find the changed rows on disk without a scan of the disk (its cost is
 * what changed, not the table), and a checkpoint forgets them all at once
 * (a flag on disk would need every flagged record rewritten). The set
 * holds only rows changed since the last checkpoint and now on disk: 8
 * bytes an id and its index slot, outside --table-memory-mb's cap.
 */
#ifndef QR_PS_TABLE_H
#define QR_PS_TABLE_H

#include "common/idmap.h"
#include "common/init.h"
#include "common/table_options.h"

#include <stddef.h>
#include <stdint.h>

#define QR_TABLE_MAX_SLOTS 4
/* Widest row a table may have. */
#define QR_TABLE_MAX_DIM 65536

typedef struct qr_table {
    int64_t dim;
    int nslots;                         /* per-row optimizer slots */
    float slot_init[QR_TABLE_MAX_SLOTS];
    qr_init_spec init;
    char init_text[129];                /* the spec as given */
    uint64_t seed;
    int64_t stride;                     /* floats per row: dim * (1 + nslots) */
    qr_idmap index;
    int64_t *keys;                      /* keys[row]: the row's id */
    uint64_t count, keys_cap;
    float **chunks;
    uint64_t nchunks, chunks_cap;
    int chunk_shift;                    /* rows per chunk: 1 << chunk_shift */
    int64_t clock;                      /* the caller's step, for eviction */
    /* admission (admit_after > 1): ids seen without a row yet */
    uint32_t admit_after;
    qr_idmap cand_index;
    int64_t *cand_ids;
    uint32_t *cand_seen;                /* sightings so far */
    uint64_t ncand, cand_cap;
    qr_bloom filter;                    /* admit_filter=bloom: counts the sightings
                                         * instead of cand_* (counters non-NULL) */
    /* eviction (evict_after > 0) */
    int64_t evict_after;
    int64_t *updated;                   /* [keys_cap]: the step of the row's last update */
    int64_t last_sweep;
    /* changes since the last checkpoint (NULL until the first one) */
    uint8_t *changed;                   /* [keys_cap]: row made or updated */
    uint8_t *cand_changed;              /* [cand_cap]: candidate sighted */
    int64_t *removed_ids;               /* rows removed (evicted), in order */
    uint64_t nremoved, removed_cap;
    /* ... and, with a disk tier, the ids of the changed rows now on disk
     * (a set: qr_table_move_out adds, qr_table_add_uninit takes back) */
    qr_idmap disk_changed_index;
    int64_t *disk_changed_ids;
    uint64_t ndisk_changed, disk_changed_cap;
    /* counted since the table was made here */
    uint64_t admitted, unadmitted_reads, dropped_rows, evicted;
    /* --table-memory-mb: the table's disk tier (tier.c), NULL without one */
    struct tier_table *tier;
} qr_table;

/* An empty table. init is an initializer spec (qr_init_validate'd). */
int qr_table_init(qr_table *t, int64_t dim, int nslots, const float *slot_init,
                  const char *init, uint64_t seed);
void qr_table_free(qr_table *t);
/* Turn on admission and eviction as the options say (an empty table). */
int qr_table_set_policy(qr_table *t, const qr_table_options *o);

/* The row of id, or -1. */
static inline int64_t qr_table_find(const qr_table *t, int64_t id) {
    return qr_idmap_find(&t->index, t->keys, id);
}
/* The row of id, made (initialized) if it was not there; -1 with
 * QR_ENOMEM set if it could not be (the table is unchanged). */
int64_t qr_table_get_or_add(qr_table *t, int64_t id, bool *added);

/* Row r's value (dim floats); its slot j follows at + dim * (1 + j). */
static inline float *qr_table_row(const qr_table *t, uint64_t r) {
    uint64_t mask = ((uint64_t)1 << t->chunk_shift) - 1;
    return t->chunks[r >> t->chunk_shift] + (r & mask) * (uint64_t)t->stride;
}

/* Hints for a caller that finds many ids in turn (a push's rows,
 * ps/rows.c): fetch id's index slot some ids before its find, then, once
 * that slot is in cache, the id it points to, so that the find itself
 * hits cache (the three dependent misses qr_table_lookup overlaps). */
static inline void qr_table_prefetch_slot(const qr_table *t, int64_t id) {
    if (t->index.cap) __builtin_prefetch(t->index.slot + qr_idmap_home(&t->index, id), 0, 3);
}
static inline void qr_table_prefetch_key(const qr_table *t, int64_t id) {
    if (!t->index.cap) return;
    uint32_t s = t->index.slot[qr_idmap_home(&t->index, id)];
    if (s) __builtin_prefetch(t->keys + s - 1, 0, 3);
}

/* A lookup that may make a row: the row of id as qr_table_get_or_add,
 * but under admission one is made only at the id's admit_after-th
 * sighting; until then *row is -1 (read its initial value). QR_ENOMEM if
 * memory ran out (the table is unchanged). */
int qr_table_sight(qr_table *t, int64_t id, int64_t *row, bool *added);

/* A LOOKUP's rows: for each of ids[0..n) its row's value copied to
 * out + i * dim, the row made first as qr_table_sight does (a sighting),
 * or only found when read_only; an id with no row reads its initial
 * value. *added counts the rows made. QR_ENOMEM if memory ran out (rows
 * made before stay). Row pointers stay good: nothing is removed. */
int qr_table_lookup(qr_table *t, int64_t n, const int64_t *ids, bool read_only, float *out,
                    uint64_t *added);

/* A push's row: the row of id, made if absent, or -1 under admission for
 * an id not admitted yet (the gradient is to be dropped; counted). -2
 * with QR_ENOMEM set if memory ran out. The row counts as updated now. */
int64_t qr_table_row_for_update(qr_table *t, int64_t id, bool *added);

/* Under eviction: remove the rows idle for more than evict_after steps,
 * if a sweep is due (every evict_after / 4 steps of the clock); how many
 * went, and the memory they held given back (qr_table_trim). Row pointers
 * are stale after it. */
uint64_t qr_table_evict_idle(qr_table *t);

/* Room for a new row of id, not initialized: the caller fills its value
 * and slots (a row coming back from the disk tier, tier.c; not a change:
 * it is marked changed only if it was when it went out). -1 with
 * QR_ENOMEM set if memory ran out, -2 if id has a row already. */
int64_t qr_table_add_uninit(qr_table *t, int64_t id);
/* Row r leaves memory for the disk tier (written there by the caller):
 * removed as qr_table_remove does, but not listed as removed, and if it
 * changed since the last checkpoint its id joins the changed ids on disk. */
void qr_table_move_out(qr_table *t, uint64_t r);
/* The disk tier removed id's row (eviction by age on disk): listed as
 * removed, no longer a changed id on disk. */
void qr_table_disk_row_removed(qr_table *t, int64_t id);

/* Put back a checkpoint's admission candidate (id seen `seen` times;
 * into the filter under admit_filter=bloom). */
int qr_table_restore_candidate(qr_table *t, int64_t id, uint32_t seen);

/* The value a row of id starts with (what a read of an absent id sees). */
void qr_table_initial_value(const qr_table *t, int64_t id, float *out);

/* Remove row r; the last row moves into its place (rows stay dense).
 * Listed as removed for the next increment. */
void qr_table_remove(qr_table *t, uint64_t r);

/* Start (or restart) tracking changes: every flag cleared, the removed
 * list emptied. Called at each checkpoint's snapshot, after the table was
 * copied. QR_ENOMEM if the flags cannot be allocated (tracking is off). */
int qr_table_changes_begin(qr_table *t);
/* Forget id entirely: its row and its admission candidate, if any (an
 * incremental checkpoint's removed id, restored). */
void qr_table_forget_id(qr_table *t, int64_t id);

/* Give back what the table holds beyond what its rows need, when it holds
 * much more (table.c says how much: chunks past the last in use but one,
 * ids, flags and index when 4x oversized). Rows keep their numbers, ids,
 * values and order; a pointer to a row stays good. Called after a batch of
 * removals (qr_table_evict_idle calls it; the disk tier after rows went
 * out), not per row. */
void qr_table_trim(qr_table *t);

/* Bytes held: the arena's chunks, the ids and the index, and
 * admission's candidates or filter. */
uint64_t qr_table_bytes(const qr_table *t);

#endif /* QR_PS_TABLE_H */

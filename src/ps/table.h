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
 */
#ifndef QR_PS_TABLE_H
#define QR_PS_TABLE_H

#include "common/idmap.h"
#include "common/init.h"

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
} qr_table;

/* An empty table. init is an initializer spec (qr_init_validate'd). */
int qr_table_init(qr_table *t, int64_t dim, int nslots, const float *slot_init,
                  const char *init, uint64_t seed);
void qr_table_free(qr_table *t);

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

/* The value a row of id starts with (what a read of an absent id sees). */
void qr_table_initial_value(const qr_table *t, int64_t id, float *out);

/* Remove row r; the last row moves into its place (rows stay dense). */
void qr_table_remove(qr_table *t, uint64_t r);

/* Bytes held: the arena's chunks, the ids and the index. */
uint64_t qr_table_bytes(const qr_table *t);

#endif /* QR_PS_TABLE_H */

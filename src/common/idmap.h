/*
 * idmap.h - an open-addressing hash index from int64 ids to positions in
 * an array of ids the caller keeps: the core of an embedding table's
 * lookup (ps/table.c) and of the deduplication of a batch's ids (the
 * worker, a sync step's sparse reduce).
 *
 * Why hand-written rather than a library's map: the table holds tens of
 * millions of rows, and the bytes per row decide how many fit. A slot
 * here is a 4-byte position (0 = empty, else position + 1); the id itself
 * is read from the caller's array, where it is stored once. At the load
 * factor kept (at most 0.7, capacity a power of two) the index costs 5.7
 * to 11.4 bytes per id; a generic map storing key and value per slot
 * costs 16 bytes per slot, 23 to 46 per id. Linear probing keeps a miss
 * to one or two cache lines, and removal shifts later entries back instead
 * of leaving tombstones, so a table that evicts rows does not slow down.
 *
 * Positions are below 2^32 - 1. Not thread-safe.
 */
#ifndef QR_COMMON_IDMAP_H
#define QR_COMMON_IDMAP_H

#include <stdbool.h>
#include <stdint.h>

typedef struct qr_idmap {
    uint32_t *slot; /* position + 1, or 0 for an empty slot */
    uint64_t cap;   /* slots: a power of two, or 0 */
    uint64_t count;
    int shift;      /* 64 - log2(cap): the hash's top bits pick a slot */
} qr_idmap;

#define QR_IDMAP_MAX_COUNT 0xfffffffeull

/* An empty map with room for `expected` ids before it grows. */
int qr_idmap_init(qr_idmap *m, uint64_t expected);
void qr_idmap_free(qr_idmap *m);
/* Forget every id, keep the memory. */
void qr_idmap_clear(qr_idmap *m);

/* The hash whose top bits pick id's first slot (the splitmix64 finalizer;
 * idmap.c says why salted), and that slot: a caller that looks up many
 * ids prefetches m->slot + qr_idmap_home(m, id) ahead of the finds
 * (ps/table.c, qr_table_lookup). m must have slots (cap > 0). */
static inline uint64_t qr_idmap_hash(int64_t id) {
    uint64_t z = (uint64_t)id + 0x5851f42d4c957f2dull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline uint64_t qr_idmap_home(const qr_idmap *m, int64_t id) {
    return qr_idmap_hash(id) >> m->shift;
}

/* The position of id (keys[pos] == id), or -1. */
int64_t qr_idmap_find(const qr_idmap *m, const int64_t *keys, int64_t id);
/* The same, probing from home = qr_idmap_home(m, id) computed by the
 * caller (who prefetched that slot with it): inline, no second hash. */
static inline int64_t qr_idmap_find_from(const qr_idmap *m, const int64_t *keys, int64_t id,
                                         uint64_t home) {
    uint64_t mask = m->cap - 1;
    for (uint64_t i = home;; i = (i + 1) & mask) {
        uint32_t s = m->slot[i];
        if (!s) return -1;
        if (keys[s - 1] == id) return s - 1;
    }
}

/* The position of id if present (*added false); otherwise id is given
 * position `next` (*added true) and the caller must store keys[next] = id
 * before the next call. Returns -1 with QR_ENOMEM set if the map could not
 * grow (nothing changed). */
int64_t qr_idmap_insert(qr_idmap *m, const int64_t *keys, int64_t id, uint32_t next,
                        bool *added);

/* Remove id (at position pos). If moved_from >= 0, the caller is about to
 * move the entry at position moved_from into the hole at pos (keeping its
 * array dense), and the index points there at once. Call it before
 * changing keys: keys[pos] and keys[moved_from] still hold their ids. */
void qr_idmap_remove(qr_idmap *m, const int64_t *keys, int64_t id, int64_t pos,
                     int64_t moved_from);

/* Rebuild the index with the capacity qr_idmap_init gives `expected` ids
 * (never less than its count needs): a table that lost most of its rows
 * gives the slots back (ps/table.c). Every id keeps its position; only the
 * slots move. QR_ENOMEM: the index is as it was. */
int qr_idmap_resize(qr_idmap *m, const int64_t *keys, uint64_t expected);

/* Bytes the index holds. */
uint64_t qr_idmap_bytes(const qr_idmap *m);

#endif /* QR_COMMON_IDMAP_H */

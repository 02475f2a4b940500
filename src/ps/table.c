/*
 * table.c - an embedding table's shard: the arena of rows and the hash
 * index over their ids (table.h).
 */
#include "ps/table.h"
#include "ps/tier.h"

#include "common/common.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

/* A chunk holds about this many bytes of rows (at least 16 rows): big
 * enough that chunk pointers are few, small enough that a table of a few
 * rows costs little. */
#define CHUNK_BYTES ((uint64_t)2 << 20)

/* A chunk is mapped for itself rather than taken from malloc: freed
 * (qr_table_trim) it goes back to the system at once. From malloc it would
 * not, once glibc's mmap threshold rose to 2 MiB (it does at the first
 * such block freed): chunks then come from the heap, and the space freed
 * there is reused by the next large allocations (a checkpoint's copy of
 * the table, hundreds of MiB), which stay resident after they are freed.
 * Measured on the restore of a 10M-row table spilled to a 160 MiB cap: 400
 * MiB more resident after the next full checkpoint that way. */
static uint64_t chunk_bytes(const qr_table *t) {
    return ((uint64_t)1 << t->chunk_shift) * (uint64_t)t->stride * sizeof(float);
}

static float *chunk_alloc(uint64_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

int qr_table_init(qr_table *t, int64_t dim, int nslots, const float *slot_init,
                  const char *init, uint64_t seed) {
    memset(t, 0, sizeof *t);
    if (dim < 1 || nslots < 0 || nslots > QR_TABLE_MAX_SLOTS)
        return qr__fail(QR_EINVAL, "table: dim %lld, %d slots", (long long)dim, nslots);
    int rc = qr_init_parse(init, &t->init);
    if (rc) return rc;
    if (strlen(init) >= sizeof t->init_text)
        return qr__fail(QR_EINVAL, "table: initializer '%.40s...' is too long", init);
    strcpy(t->init_text, init);
    t->dim = dim;
    t->nslots = nslots;
    for (int j = 0; j < nslots; j++) t->slot_init[j] = slot_init[j];
    t->seed = seed;
    t->stride = dim * (1 + nslots);
    t->chunk_shift = 4;
    while (((uint64_t)2 << t->chunk_shift) * (uint64_t)t->stride * 4 <= CHUNK_BYTES)
        t->chunk_shift++;
    return qr_idmap_init(&t->index, 0);
}

void qr_table_free(qr_table *t) {
    for (uint64_t i = 0; i < t->nchunks; i++) munmap(t->chunks[i], chunk_bytes(t));
    free(t->chunks);
    free(t->keys);
    free(t->updated);
    free(t->cand_ids);
    free(t->cand_seen);
    free(t->changed);
    free(t->cand_changed);
    free(t->removed_ids);
    free(t->disk_changed_ids);
    qr_idmap_free(&t->disk_changed_index);
    qr_idmap_free(&t->index);
    qr_idmap_free(&t->cand_index);
    qr_bloom_free(&t->filter);
    memset(t, 0, sizeof *t);
}

int qr_table_set_policy(qr_table *t, const qr_table_options *o) {
    if (t->count) return qr__fail(QR_EINVAL, "table: admission and eviction are set when it is empty");
    t->admit_after = o->admit_after > 1 ? o->admit_after : 0;
    t->evict_after = o->evict_after_steps;
    if (t->admit_after && o->admit_filter_bytes)
        return qr_bloom_init(&t->filter, o->admit_filter_bytes, o->admit_filter_hashes);
    if (t->admit_after) return qr_idmap_init(&t->cand_index, 0);
    return QR_OK;
}

void qr_table_initial_value(const qr_table *t, int64_t id, float *out) {
    qr_init_row(&t->init, t->seed, id, out, t->dim);
}

/* Room for row number t->count: its id and its place in the arena. */
static int reserve_row(qr_table *t) {
    if (t->count == t->keys_cap) {
        uint64_t cap = t->keys_cap ? t->keys_cap + t->keys_cap / 2 : 64;
        int64_t *keys = realloc(t->keys, cap * sizeof *keys);
        if (!keys) return qr__fail(QR_ENOMEM, "out of memory growing a table to %llu rows",
                                   (unsigned long long)cap);
        t->keys = keys;
        if (t->evict_after) {
            int64_t *updated = realloc(t->updated, cap * sizeof *updated);
            if (!updated) return qr__fail(QR_ENOMEM, "out of memory growing a table to %llu "
                                          "rows", (unsigned long long)cap);
            t->updated = updated;
        }
        if (t->changed) {
            uint8_t *changed = realloc(t->changed, cap);
            if (!changed) return qr__fail(QR_ENOMEM, "out of memory growing a table to %llu "
                                          "rows", (unsigned long long)cap);
            t->changed = changed;
        }
        t->keys_cap = cap;
    }
    if ((t->count >> t->chunk_shift) < t->nchunks) return QR_OK;
    if (t->nchunks == t->chunks_cap) {
        uint64_t cap = t->chunks_cap ? t->chunks_cap * 2 : 16;
        float **chunks = realloc(t->chunks, cap * sizeof *chunks);
        if (!chunks) return qr__fail(QR_ENOMEM, "out of memory growing a table");
        t->chunks = chunks;
        t->chunks_cap = cap;
    }
    uint64_t bytes = chunk_bytes(t);
    float *chunk = chunk_alloc(bytes);
    if (!chunk) return qr__fail(QR_ENOMEM, "out of memory adding %llu bytes of table rows",
                                (unsigned long long)bytes);
    t->chunks[t->nchunks++] = chunk;
    return QR_OK;
}

int64_t qr_table_get_or_add(qr_table *t, int64_t id, bool *added) {
    int64_t r = qr_table_find(t, id);
    *added = false;
    if (r >= 0) return r;
    if (reserve_row(t)) return -1;
    r = qr_idmap_insert(&t->index, t->keys, id, (uint32_t)t->count, added);
    if (r < 0) return -1;
    t->keys[r] = id;
    if (t->updated) t->updated[r] = t->clock;
    if (t->changed) t->changed[r] = 1;
    t->count++;
    float *row = qr_table_row(t, (uint64_t)r);
    qr_init_row(&t->init, t->seed, id, row, t->dim);
    for (int j = 0; j < t->nslots; j++) {
        float *slot = row + t->dim * (1 + j);
        for (int64_t k = 0; k < t->dim; k++) slot[k] = t->slot_init[j];
    }
    return r;
}

/* A failure to grow a list of changes turns tracking off: the next
 * checkpoint then writes this table whole (ckpt_shard.c), which needs no
 * list. */
static void tracking_off(qr_table *t) {
    free(t->changed);
    t->changed = NULL;
    t->ndisk_changed = 0;
    qr_idmap_clear(&t->disk_changed_index);
}

/* An incremental checkpoint lists the ids removed since the last one. */
static void note_removed(qr_table *t, int64_t id) {
    if (!t->changed) return;
    if (t->nremoved == t->removed_cap) {
        uint64_t cap = t->removed_cap ? t->removed_cap * 2 : 64;
        int64_t *ids = realloc(t->removed_ids, cap * sizeof *ids);
        if (!ids) {
            tracking_off(t);
            return;
        }
        t->removed_ids = ids;
        t->removed_cap = cap;
    }
    t->removed_ids[t->nremoved++] = id;
}

/* ---- the changed rows on the disk tier (table.h says why a set) ------------- */

static void disk_changed_add(qr_table *t, int64_t id) {
    if (t->ndisk_changed == t->disk_changed_cap) {
        uint64_t cap = t->disk_changed_cap ? t->disk_changed_cap * 2 : 64;
        int64_t *ids = realloc(t->disk_changed_ids, cap * sizeof *ids);
        if (!ids) {
            tracking_off(t);
            return;
        }
        t->disk_changed_ids = ids;
        t->disk_changed_cap = cap;
    }
    bool added;
    if (qr_idmap_insert(&t->disk_changed_index, t->disk_changed_ids, id,
                        (uint32_t)t->ndisk_changed, &added) < 0) {
        tracking_off(t);
        return;
    }
    if (added) t->disk_changed_ids[t->ndisk_changed++] = id;
}

/* Was id a changed row on disk? It is no longer one. */
static bool disk_changed_take(qr_table *t, int64_t id) {
    if (!t->ndisk_changed) return false;
    int64_t at = qr_idmap_find(&t->disk_changed_index, t->disk_changed_ids, id);
    if (at < 0) return false;
    uint64_t last = t->ndisk_changed - 1;
    qr_idmap_remove(&t->disk_changed_index, t->disk_changed_ids, id, at,
                    (uint64_t)at == last ? -1 : (int64_t)last);
    t->disk_changed_ids[at] = t->disk_changed_ids[last];
    t->ndisk_changed--;
    return true;
}

int64_t qr_table_add_uninit(qr_table *t, int64_t id) {
    if (qr_table_find(t, id) >= 0) return -2;
    if (reserve_row(t)) return -1;
    bool added;
    int64_t r = qr_idmap_insert(&t->index, t->keys, id, (uint32_t)t->count, &added);
    if (r < 0) return -1;
    t->keys[r] = id;
    if (t->updated) t->updated[r] = t->clock;
    /* Back from disk: changed only if it was when it went out. */
    if (t->changed) t->changed[r] = disk_changed_take(t, id);
    t->count++;
    return r;
}

void qr_table_disk_row_removed(qr_table *t, int64_t id) {
    if (!t->changed) return;
    disk_changed_take(t, id);
    note_removed(t, id);
}

/* Row r goes; the last row moves into its place. */
static void remove_row(qr_table *t, uint64_t r) {
    uint64_t last = t->count - 1;
    qr_idmap_remove(&t->index, t->keys, t->keys[r], (int64_t)r, r == last ? -1 : (int64_t)last);
    if (r != last) {
        t->keys[r] = t->keys[last];
        if (t->updated) t->updated[r] = t->updated[last];
        if (t->changed) t->changed[r] = t->changed[last];
        memcpy(qr_table_row(t, r), qr_table_row(t, last), (size_t)t->stride * sizeof(float));
    }
    t->count--;
}

void qr_table_remove(qr_table *t, uint64_t r) {
    note_removed(t, t->keys[r]);
    if (t->tier) qr__tier_forget(t, t->keys[r]); /* its stale record on disk */
    remove_row(t, r);
}

void qr_table_move_out(qr_table *t, uint64_t r) {
    if (t->changed && t->changed[r]) disk_changed_add(t, t->keys[r]);
    remove_row(t, r);
}

/* ---- giving memory back ----------------------------------------------------- */

/* When a table holds much more than its rows need (rows spilled to the
 * disk tier, evicted, removed by a restore), qr_table_trim gives the rest
 * back. The thresholds keep a count that moves up and down from freeing
 * and allocating the same memory again and again:
 *  - chunks: those past the last one in use go, but one spare stays, so a
 *    count that crosses a chunk's boundary back and forth frees nothing
 *    (a chunk is 2 MiB: at most that much kept for nothing per table);
 *  - the ids, per-row flags and update steps (keys_cap entries) shrink
 *    only when they hold at least 4x the rows (and more than TRIM_MIN
 *    entries), to twice the rows: the count must then halve again before
 *    the next shrink, or double before they grow (by half) again;
 *  - the index, whose load is 0.35 to 0.7 as it grows, is rebuilt only
 *    once its load falls to a quarter of its most (0.175), at a load of
 *    0.35: again a halving or a doubling away from the next rebuild.
 * A shrink of keys_cap entries reallocates (a copy of the ids, 8 bytes a
 * row) and a rebuild rehashes the ids left: work proportional to the rows
 * left, after the removal of at least as many again, so it costs at most
 * what the removals did. */
#define TRIM_MIN 1024
/* glibc keeps freed memory in its heap (blocks under its mmap threshold,
 * which rises up to 32 MiB as blocks that size are freed: the ids and
 * index of a table of a few million rows) until it is at the top of it or
 * malloc_trim hands the free pages back: called when a trim freed at least
 * this much. The arrays shrink by 4x at least each time, so a table that
 * keeps losing rows calls it a few times, not once a removal. */
#define RETURN_BYTES ((uint64_t)1 << 20)

static void return_memory(uint64_t freed) {
#ifdef __GLIBC__
    if (freed >= RETURN_BYTES) malloc_trim(0);
#else
    (void)freed;
#endif
}

/* *p reallocated to n entries of size bytes, if it can be (a failure keeps
 * the larger block, which still holds the entries). */
static void shrink_array(void *p, uint64_t n, size_t size) {
    void **at = p;
    if (!*at) return;
    void *q = realloc(*at, n * size);
    if (q) *at = q;
}

void qr_table_trim(qr_table *t) {
    uint64_t freed = 0; /* from malloc (chunks are unmapped at once) */
    uint64_t used = (t->count + ((uint64_t)1 << t->chunk_shift) - 1) >> t->chunk_shift;
    while (t->nchunks > used + 1) {
        t->nchunks--;
        munmap(t->chunks[t->nchunks], chunk_bytes(t));
        t->chunks[t->nchunks] = NULL;
    }
    if (t->keys_cap > TRIM_MIN && t->keys_cap / 4 >= t->count) {
        uint64_t cap = QR_MAX(2 * t->count, 64);
        shrink_array(&t->keys, cap, sizeof *t->keys);
        shrink_array(&t->updated, cap, sizeof *t->updated);
        shrink_array(&t->changed, cap, sizeof *t->changed);
        freed += (t->keys_cap - cap) * (sizeof *t->keys + (t->updated ? sizeof *t->updated : 0) +
                                        (t->changed ? 1 : 0));
        t->keys_cap = cap;
    }
    uint64_t slots = t->index.cap;
    if (slots > TRIM_MIN && t->index.count * 40 <= slots * 7 &&
        !qr_idmap_resize(&t->index, t->keys, 2 * t->index.count))
        freed += (slots - t->index.cap) * sizeof *t->index.slot;
    return_memory(freed);
}

/* ---- admission ------------------------------------------------------------ */

/* Id's candidate position, made with 0 sightings if absent; -1 (ENOMEM). */
static int64_t candidate(qr_table *t, int64_t id) {
    if (t->ncand == t->cand_cap) {
        uint64_t cap = t->cand_cap ? t->cand_cap * 2 : 64;
        int64_t *ids = realloc(t->cand_ids, cap * sizeof *ids);
        if (ids) t->cand_ids = ids;
        uint32_t *seen = realloc(t->cand_seen, cap * sizeof *seen);
        if (seen) t->cand_seen = seen;
        uint8_t *changed = t->cand_changed ? realloc(t->cand_changed, cap) : NULL;
        if (changed) t->cand_changed = changed;
        if (!ids || !seen || (t->cand_changed && !changed)) {
            qr__fail(QR_ENOMEM, "out of memory counting the sightings of %llu ids",
                     (unsigned long long)cap);
            return -1;
        }
        t->cand_cap = cap;
    }
    bool added;
    int64_t at = qr_idmap_insert(&t->cand_index, t->cand_ids, id, (uint32_t)t->ncand, &added);
    if (at >= 0 && added) {
        t->cand_ids[at] = id;
        t->cand_seen[at] = 0;
        if (t->cand_changed) t->cand_changed[at] = 1;
        t->ncand++;
    }
    return at;
}

static void forget_candidate(qr_table *t, int64_t at) {
    uint64_t last = t->ncand - 1;
    qr_idmap_remove(&t->cand_index, t->cand_ids, t->cand_ids[at], at,
                    (uint64_t)at == last ? -1 : (int64_t)last);
    t->cand_ids[at] = t->cand_ids[last];
    t->cand_seen[at] = t->cand_seen[last];
    if (t->cand_changed) t->cand_changed[at] = t->cand_changed[last];
    t->ncand--;
}

int qr_table_sight(qr_table *t, int64_t id, int64_t *row, bool *added) {
    *added = false;
    *row = qr_table_find(t, id);
    if (*row >= 0) return QR_OK;
    if (t->filter.counters) {
        /* Admitted when the filter's estimate reaches admit_after; the
         * filter is then left as it was, so a row that cannot be made
         * loses nothing. */
        if (!qr_bloom_sight(&t->filter, id, t->admit_after)) {
            t->unadmitted_reads++;
            return QR_OK;
        }
        *row = qr_table_get_or_add(t, id, added);
        if (*row < 0) return QR_ENOMEM;
        t->admitted++;
        return QR_OK;
    }
    if (t->admit_after) {
        int64_t at = candidate(t, id);
        if (at < 0) return QR_ENOMEM;
        if (t->cand_changed) t->cand_changed[at] = 1;
        if (++t->cand_seen[at] < t->admit_after) {
            t->unadmitted_reads++;
            return QR_OK;
        }
        /* Admitted: made below. Forgotten first, so a failure to make it
         * leaves the id as a candidate seen once less, nothing worse. */
        uint32_t seen = t->cand_seen[at];
        forget_candidate(t, at);
        *row = qr_table_get_or_add(t, id, added);
        if (*row < 0) {
            int64_t back = candidate(t, id);
            if (back >= 0) t->cand_seen[back] = seen - 1;
            return QR_ENOMEM;
        }
        t->admitted++;
        return QR_OK;
    }
    *row = qr_table_get_or_add(t, id, added);
    return *row < 0 ? QR_ENOMEM : QR_OK;
}

/* How far ahead a lookup works. Every id of a LOOKUP is a random place in
 * the index, the id array and the arena: three dependent cache misses
 * (slot, then its key, then the row), each to L3 or memory once the table
 * outgrows L2. Taken one id at a time they run in series. Here id i's
 * slot is prefetched AHEAD ids before its key is, its key AHEAD before
 * its row is found (the find then hits cache) and its row's lines
 * prefetched, and its row copied AHEAD ids after that: about 3 * AHEAD
 * misses are in flight at once, and each copy finds its row in cache. */
#define AHEAD 8
#define RING (4 * AHEAD) /* ids between a slot's prefetch and its copy, a power of two */

static void prefetch_row(const float *row, int64_t dim) {
    const char *p = (const char *)row, *end = (const char *)(row + dim);
    for (; p < end; p += 64) __builtin_prefetch(p, 0, 3);
    __builtin_prefetch(end - 1, 0, 3); /* a row that starts mid-line */
}

int qr_table_lookup(qr_table *t, int64_t n, const int64_t *ids, bool read_only, float *out,
                    uint64_t *added) {
    size_t row_bytes = (size_t)t->dim * sizeof(float);
    uint64_t home[RING];
    int home_shift[RING]; /* the index's shift when home was taken */
    int64_t rows[RING];
    *added = 0;
    for (int64_t i = 0; i < n + 3 * AHEAD; i++) {
        /* A sighting may grow the index, which moves every slot: a home
         * taken before is then only a hint (still inside the bigger
         * index), and the find hashes again. */
        if (i < n) {
            home[i % RING] = qr_idmap_home(&t->index, ids[i]);
            home_shift[i % RING] = t->index.shift;
            __builtin_prefetch(t->index.slot + home[i % RING], 0, 3);
        }
        int64_t k = i - AHEAD;
        if (k >= 0 && k < n) {
            uint32_t s = t->index.slot[home[k % RING]];
            if (s) __builtin_prefetch(t->keys + s - 1, 0, 3);
        }
        k = i - 2 * AHEAD;
        if (k >= 0 && k < n) {
            bool add = false;
            int64_t *r = &rows[k % RING];
            /* Found inline from its home (no second hash, no call): the
             * usual case of a warm table. A sighting of an id found
             * changes nothing, so only a miss goes through
             * qr_table_sight (admission, a new row). */
            uint64_t h = home_shift[k % RING] == t->index.shift
                             ? home[k % RING] : qr_idmap_home(&t->index, ids[k]);
            *r = qr_idmap_find_from(&t->index, t->keys, ids[k], h);
            if (*r < 0 && !read_only && qr_table_sight(t, ids[k], r, &add)) return QR_ENOMEM;
            *added += add;
            if (*r >= 0) prefetch_row(qr_table_row(t, (uint64_t)*r), t->dim);
        }
        k = i - 3 * AHEAD;
        if (k >= 0) {
            float *dst = out + k * t->dim;
            int64_t r = rows[k % RING];
            if (r >= 0) memcpy(dst, qr_table_row(t, (uint64_t)r), row_bytes);
            else qr_table_initial_value(t, ids[k], dst);
        }
    }
    return QR_OK;
}

int64_t qr_table_row_for_update(qr_table *t, int64_t id, bool *added) {
    int64_t r;
    *added = false;
    if (t->admit_after) {
        r = qr_table_find(t, id);
        if (r < 0) {
            t->dropped_rows++;
            return -1;
        }
    } else {
        r = qr_table_get_or_add(t, id, added);
        if (r < 0) return -2;
    }
    if (t->updated) t->updated[r] = t->clock;
    if (t->changed) t->changed[r] = 1;
    return r;
}

int qr_table_restore_candidate(qr_table *t, int64_t id, uint32_t seen) {
    if (!t->admit_after) return QR_OK; /* admission is off now: the counts do not matter */
    if (t->filter.counters) {
        for (uint32_t i = 0; i < QR_MIN(seen, t->admit_after - 1); i++)
            qr_bloom_add(&t->filter, id);
        return QR_OK;
    }
    int64_t at = candidate(t, id);
    if (at < 0) return QR_ENOMEM;
    t->cand_seen[at] = QR_MIN(seen, t->admit_after - 1);
    if (t->cand_changed) t->cand_changed[at] = 1;
    return QR_OK;
}

void qr_table_forget_id(qr_table *t, int64_t id) {
    int64_t r = qr_table_find(t, id);
    if (r >= 0) qr_table_remove(t, (uint64_t)r);
    int64_t at = t->admit_after ? qr_idmap_find(&t->cand_index, t->cand_ids, id) : -1;
    if (at >= 0) forget_candidate(t, at);
}

/* ---- changes since the last checkpoint ------------------------------------- */

/* The lists of an interval emptied: sized by what the last interval
 * used, when they hold 4x that (as qr_table_trim sizes the rows). */
static void trim_change_lists(qr_table *t) {
    uint64_t freed = 0;
    if (t->removed_cap > TRIM_MIN && t->removed_cap / 4 >= t->nremoved) {
        uint64_t cap = QR_MAX(2 * t->nremoved, 64);
        shrink_array(&t->removed_ids, cap, sizeof *t->removed_ids);
        freed += (t->removed_cap - cap) * sizeof *t->removed_ids;
        t->removed_cap = cap;
    }
    if (t->disk_changed_cap > TRIM_MIN && t->disk_changed_cap / 4 >= t->ndisk_changed) {
        uint64_t cap = QR_MAX(2 * t->ndisk_changed, 64);
        shrink_array(&t->disk_changed_ids, cap, sizeof *t->disk_changed_ids);
        freed += (t->disk_changed_cap - cap) * sizeof *t->disk_changed_ids;
        t->disk_changed_cap = cap;
    }
    uint64_t slots = t->disk_changed_index.cap;
    qr_idmap_clear(&t->disk_changed_index);
    if (slots > TRIM_MIN && t->ndisk_changed * 40 <= slots * 7 &&
        !qr_idmap_resize(&t->disk_changed_index, t->disk_changed_ids, 2 * t->ndisk_changed))
        freed += (slots - t->disk_changed_index.cap) * sizeof(uint32_t);
    return_memory(freed);
}

int qr_table_changes_begin(qr_table *t) {
    trim_change_lists(t);
    t->nremoved = t->ndisk_changed = 0;
    if (!t->changed) t->changed = malloc(QR_MAX(t->keys_cap, 1));
    if (t->admit_after && !t->cand_changed) t->cand_changed = malloc(QR_MAX(t->cand_cap, 1));
    if (!t->changed || (t->admit_after && !t->cand_changed)) {
        free(t->changed);
        t->changed = NULL;
        return qr__fail(QR_ENOMEM, "out of memory tracking the changes of a table of %llu rows",
                        (unsigned long long)t->count);
    }
    memset(t->changed, 0, QR_MAX(t->keys_cap, 1));
    if (t->cand_changed) memset(t->cand_changed, 0, QR_MAX(t->cand_cap, 1));
    return QR_OK;
}

/* ---- eviction ------------------------------------------------------------- */

uint64_t qr_table_evict_idle(qr_table *t) {
    if (!t->evict_after || t->clock - t->last_sweep < QR_MAX(t->evict_after / 4, 1)) return 0;
    t->last_sweep = t->clock;
    uint64_t gone = 0;
    /* Downwards: a removal moves the last row, already looked at, into
     * the hole. */
    for (uint64_t r = t->count; r-- > 0;) {
        if (t->clock - t->updated[r] <= t->evict_after) continue;
        qr_table_remove(t, r);
        gone++;
    }
    t->evicted += gone;
    if (gone) qr_table_trim(t);
    return gone;
}

uint64_t qr_table_bytes(const qr_table *t) {
    uint64_t bytes = t->nchunks * chunk_bytes(t) + t->keys_cap * sizeof *t->keys + qr_idmap_bytes(&t->index);
    if (t->updated) bytes += t->keys_cap * sizeof *t->updated;
    if (t->changed) bytes += t->keys_cap + t->removed_cap * sizeof *t->removed_ids;
    bytes += t->disk_changed_cap * sizeof *t->disk_changed_ids +
             qr_idmap_bytes(&t->disk_changed_index);
    if (t->cand_changed) bytes += t->cand_cap;
    bytes += t->cand_cap * (sizeof *t->cand_ids + sizeof *t->cand_seen) +
             qr_idmap_bytes(&t->cand_index) + t->filter.m;
    return bytes;
}

/*
 * table.c - an embedding table's shard: the arena of rows and the hash
 * index over their ids (table.h).
 */
#include "ps/table.h"

#include "common/common.h"

#include <stdlib.h>
#include <string.h>

/* A chunk holds about this many bytes of rows (at least 16 rows): big
 * enough that chunk pointers are few, small enough that a table of a few
 * rows costs little. */
#define CHUNK_BYTES ((uint64_t)2 << 20)

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
    for (uint64_t i = 0; i < t->nchunks; i++) free(t->chunks[i]);
    free(t->chunks);
    free(t->keys);
    qr_idmap_free(&t->index);
    memset(t, 0, sizeof *t);
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
    uint64_t bytes = ((uint64_t)1 << t->chunk_shift) * (uint64_t)t->stride * sizeof(float);
    float *chunk = qr__aligned_alloc_uninit(bytes);
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
    t->count++;
    float *row = qr_table_row(t, (uint64_t)r);
    qr_init_row(&t->init, t->seed, id, row, t->dim);
    for (int j = 0; j < t->nslots; j++) {
        float *slot = row + t->dim * (1 + j);
        for (int64_t k = 0; k < t->dim; k++) slot[k] = t->slot_init[j];
    }
    return r;
}

void qr_table_remove(qr_table *t, uint64_t r) {
    uint64_t last = t->count - 1;
    qr_idmap_remove(&t->index, t->keys, t->keys[r], (int64_t)r, r == last ? -1 : (int64_t)last);
    if (r != last) {
        t->keys[r] = t->keys[last];
        memcpy(qr_table_row(t, r), qr_table_row(t, last), (size_t)t->stride * sizeof(float));
    }
    t->count--;
}

uint64_t qr_table_bytes(const qr_table *t) {
    uint64_t chunk = ((uint64_t)1 << t->chunk_shift) * (uint64_t)t->stride * sizeof(float);
    return t->nchunks * chunk + t->keys_cap * sizeof *t->keys + qr_idmap_bytes(&t->index);
}

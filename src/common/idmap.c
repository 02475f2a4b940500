/*
 * idmap.c - the hash index of idmap.h: linear probing over 4-byte slots,
 * grown at a load of 0.7, removal by backward shift.
 */
#include "common/idmap.h"

#include "common/common.h"

#include <stdlib.h>
#include <string.h>

/* The hash (qr_idmap_hash, idmap.h) is well mixed and its top bits pick
 * the slot. The salt keeps it independent of the ps placement of a row
 * (cluster/placement.c mixes the bare id and takes it modulo the ps
 * count): on a shard that holds only ids of one residue, the slots must
 * still be used evenly. */
static uint64_t home(const qr_idmap *m, int64_t id) {
    return qr_idmap_home(m, id);
}

static int alloc_slots(qr_idmap *m, uint64_t cap) {
    uint32_t *slot = calloc(cap, sizeof *slot);
    if (!slot) return qr__fail(QR_ENOMEM, "out of memory growing an id index to %llu slots",
                               (unsigned long long)cap);
    m->slot = slot;
    m->cap = cap;
    m->shift = 64;
    for (uint64_t c = cap; c > 1; c >>= 1) m->shift--;
    return QR_OK;
}

int qr_idmap_init(qr_idmap *m, uint64_t expected) {
    memset(m, 0, sizeof *m);
    uint64_t cap = 16;
    while (cap * 7 / 10 < expected) cap *= 2;
    return alloc_slots(m, cap);
}

void qr_idmap_free(qr_idmap *m) {
    free(m->slot);
    memset(m, 0, sizeof *m);
}

void qr_idmap_clear(qr_idmap *m) {
    if (m->slot) memset(m->slot, 0, m->cap * sizeof *m->slot);
    m->count = 0;
}

int64_t qr_idmap_find(const qr_idmap *m, const int64_t *keys, int64_t id) {
    if (!m->cap) return -1;
    return qr_idmap_find_from(m, keys, id, home(m, id));
}

/* Every entry rehashed into cap slots (a power of two that holds them). */
static int rehash(qr_idmap *m, const int64_t *keys, uint64_t cap) {
    qr_idmap to = *m;
    if (alloc_slots(&to, cap)) return QR_ENOMEM;
    uint64_t mask = to.cap - 1;
    for (uint64_t j = 0; j < m->cap; j++) {
        uint32_t s = m->slot[j];
        if (!s) continue;
        uint64_t i = home(&to, keys[s - 1]);
        while (to.slot[i]) i = (i + 1) & mask;
        to.slot[i] = s;
    }
    free(m->slot);
    *m = to;
    return QR_OK;
}

static int grow(qr_idmap *m, const int64_t *keys) {
    return rehash(m, keys, m->cap ? m->cap * 2 : 16);
}

int qr_idmap_resize(qr_idmap *m, const int64_t *keys, uint64_t expected) {
    uint64_t cap = 16;
    while (cap * 7 / 10 < QR_MAX(expected, m->count)) cap *= 2;
    return cap == m->cap ? QR_OK : rehash(m, keys, cap);
}

int64_t qr_idmap_insert(qr_idmap *m, const int64_t *keys, int64_t id, uint32_t next,
                        bool *added) {
    *added = false;
    if (next >= QR_IDMAP_MAX_COUNT) {
        qr__fail(QR_ENOMEM, "an id index holds at most %llu ids",
                 (unsigned long long)QR_IDMAP_MAX_COUNT);
        return -1;
    }
    if ((m->count + 1) * 10 > m->cap * 7 && grow(m, keys)) return -1;
    uint64_t mask = m->cap - 1;
    uint64_t i = home(m, id);
    for (;; i = (i + 1) & mask) {
        uint32_t s = m->slot[i];
        if (!s) break;
        if (keys[s - 1] == id) return s - 1;
    }
    m->slot[i] = next + 1;
    m->count++;
    *added = true;
    return next;
}

/* The slot that holds position pos for id. */
static uint64_t slot_of(const qr_idmap *m, int64_t id, int64_t pos) {
    uint64_t mask = m->cap - 1;
    uint64_t i = home(m, id);
    while (m->slot[i] != (uint32_t)pos + 1) i = (i + 1) & mask;
    return i;
}

void qr_idmap_remove(qr_idmap *m, const int64_t *keys, int64_t id, int64_t pos,
                     int64_t moved_from) {
    uint64_t mask = m->cap - 1;
    uint64_t hole = slot_of(m, id, pos);
    /* Backward shift: every later entry of the probe run whose home is not
     * between the hole and itself moves into the hole. */
    for (uint64_t i = (hole + 1) & mask;; i = (i + 1) & mask) {
        uint32_t s = m->slot[i];
        if (!s) break;
        uint64_t h = home(m, keys[s - 1]);
        bool stays = hole <= i ? (hole < h && h <= i) : (hole < h || h <= i);
        if (stays) continue;
        m->slot[hole] = s;
        hole = i;
    }
    m->slot[hole] = 0;
    m->count--;
    if (moved_from >= 0 && moved_from != pos)
        m->slot[slot_of(m, keys[moved_from], moved_from)] = (uint32_t)pos + 1;
}

uint64_t qr_idmap_bytes(const qr_idmap *m) {
    return m->cap * sizeof *m->slot;
}

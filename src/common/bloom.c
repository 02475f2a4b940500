/*
 * bloom.c - a counting Bloom filter of saturating 8-bit counters (bloom.h:
 * the hashing and the false-positive math).
 */
#include "common/bloom.h"

#include "common/common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int qr_bloom_init(qr_bloom *b, uint64_t m, int k) {
    memset(b, 0, sizeof *b);
    if (m < QR_BLOOM_MIN_COUNTERS || m > QR_BLOOM_MAX_COUNTERS)
        return qr__fail(QR_EINVAL, "counting Bloom filter of %llu counters: want %llu to %llu",
                        (unsigned long long)m, QR_BLOOM_MIN_COUNTERS, QR_BLOOM_MAX_COUNTERS);
    if (k < 1 || k > QR_BLOOM_MAX_HASHES)
        return qr__fail(QR_EINVAL, "counting Bloom filter with %d hashes: want 1 to %d", k,
                        QR_BLOOM_MAX_HASHES);
    b->counters = calloc(m, 1); /* calloc: the kernel's zero pages, touched as ids come */
    if (!b->counters)
        return qr__fail(QR_ENOMEM, "out of memory making a counting Bloom filter of %llu bytes",
                        (unsigned long long)m);
    b->m = m;
    b->k = k;
    return QR_OK;
}

void qr_bloom_free(qr_bloom *b) {
    free(b->counters);
    memset(b, 0, sizeof *b);
}

/* The splitmix64 finalizer over the id, salted apart from the hashes that
 * place ids on a ps (cluster/placement.c) and in an index (idmap.h): the
 * ids of one ps share their placement hash's residue, and must not share
 * counters for it. */
static uint64_t mix(int64_t id) {
    uint64_t z = (uint64_t)id + 0x2545f4914f6cdd1dull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* id's k counter positions into at[]. */
static void positions(const qr_bloom *b, int64_t id, uint64_t *at) {
    uint64_t h = mix(id);
    uint32_t g = (uint32_t)h, step = (uint32_t)(h >> 32) | 1;
    for (int i = 0; i < b->k; i++, g += step) at[i] = ((uint64_t)g * b->m) >> 32;
}

/* The least of the counters at[] (id's estimate). */
static uint32_t least(const qr_bloom *b, const uint64_t *at) {
    uint32_t low = QR_BLOOM_MAX_COUNT;
    for (int i = 0; i < b->k; i++) low = QR_MIN(low, b->counters[at[i]]);
    return low;
}

/* Add 1 to the counters at[], each stopping at QR_BLOOM_MAX_COUNT. */
static void bump(qr_bloom *b, const uint64_t *at) {
    for (int i = 0; i < b->k; i++)
        if (b->counters[at[i]] < QR_BLOOM_MAX_COUNT) b->counters[at[i]]++;
}

void qr_bloom_add(qr_bloom *b, int64_t id) {
    uint64_t at[QR_BLOOM_MAX_HASHES];
    positions(b, id, at);
    bump(b, at);
}

uint32_t qr_bloom_count(const qr_bloom *b, int64_t id) {
    uint64_t at[QR_BLOOM_MAX_HASHES];
    positions(b, id, at);
    return least(b, at);
}

bool qr_bloom_sight(qr_bloom *b, int64_t id, uint32_t reach) {
    uint64_t at[QR_BLOOM_MAX_HASHES];
    positions(b, id, at);
    if (least(b, at) + 1 >= reach) return true;
    bump(b, at);
    return false;
}

double qr_bloom_fp_rate(uint64_t n, uint64_t m, int k) {
    return pow(1.0 - exp(-(double)k * (double)n / (double)m), k);
}

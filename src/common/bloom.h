/*
 * bloom.h - a counting Bloom filter of fixed size: approximate counts of
 * int64 ids in m saturating 8-bit counters, whatever the number of
 * distinct ids. An embedding table's admission counts sightings in one
 * (admit_filter=bloom, ps/table.h; DeepRec's CBF filter) instead of an
 * exact index of candidates that grows with every id seen.
 *
 * Each id has k counters, picked by double hashing (Kirsch and
 * Mitzenmacher) from one 64-bit mix of the id: h1 and h2 its two 32-bit
 * halves (h2 made odd), g_i = h1 + i * h2 mod 2^32 for i < k, counter
 * floor(g_i * m / 2^32). Counting an id adds 1 to each of its k counters
 * (saturating at 255: a counter never wraps, so never reads less than it
 * was given); its estimate is the least of them. Counters only grow, so
 * an estimate is never below the id's true count (no false negatives): it
 * can only be above it, when other ids share all k of its counters.
 *
 * False positives. After n distinct ids are counted into m counters with
 * k hashes, a given counter was missed by all kn increments with
 * probability (1 - 1/m)^(kn) ~ e^(-kn/m). An id never counted reads a
 * nonzero estimate when all k of its counters were hit:
 *
 *     p = (1 - e^(-kn/m))^k,  least at k = (m/n) ln 2, where p = 0.6185^(m/n).
 *
 * The default k is 3 (admit_filter_hashes=K sets it): n grows over
 * training and is not known when the table is declared; k = 3 is the best
 * at 4 counters an id and degrades gently as the filter fills (at m/n = 2,
 * k = 6 gives 0.74). Counters per id (m/n) -> p with k = 3, and with the
 * best whole k:
 *
 *     m/n = 2:  0.469  (k = 1: 0.393)
 *     m/n = 4:  0.147  (k = 3: 0.147)
 *     m/n = 8:  0.0306 (k = 6: 0.0216)
 *     m/n = 16: 0.0050 (k = 11: 0.00046)
 *
 * A larger k wins only with many counters per id; give it with
 * admit_filter_hashes when n is known. test_bloom measures p against the
 * formula.
 *
 * 8-bit counters, not 4: a count of up to 255 lets admit_after go to 255
 * (4 bits stop at 15), and a counter is one byte to read and write (no
 * shared nibble) and a uint8 tensor in a checkpoint as it is. 4 bits
 * would hold twice the counters in the same bytes (at k = 3, 8 counters
 * an id become 16: p from 0.031 to 0.005); admission needs counts only up
 * to admit_after, so a 4-bit variant for admit_after <= 15 is the way to
 * halve the filter if it is ever needed.
 *
 * Not thread-safe; the caller's lock or thread (the ps loop) owns it.
 */
#ifndef QR_COMMON_BLOOM_H
#define QR_COMMON_BLOOM_H

#include <stdbool.h>
#include <stdint.h>

#define QR_BLOOM_MAX_COUNT 255u
#define QR_BLOOM_MAX_HASHES 16
/* counters: from 64 to 2^32 (the double hashing's 32-bit positions) */
#define QR_BLOOM_MIN_COUNTERS 64ull
#define QR_BLOOM_MAX_COUNTERS (1ull << 32)

typedef struct qr_bloom {
    uint8_t *counters; /* [m], zeroed at init */
    uint64_t m;
    int k;
} qr_bloom;

/* A filter of m counters (QR_BLOOM_MIN_COUNTERS..QR_BLOOM_MAX_COUNTERS),
 * all 0, with k hashes (1..QR_BLOOM_MAX_HASHES). QR_EINVAL naming a bad
 * size, QR_ENOMEM. */
int qr_bloom_init(qr_bloom *b, uint64_t m, int k);
void qr_bloom_free(qr_bloom *b);

/* Add 1 to each of id's counters (saturating). */
void qr_bloom_add(qr_bloom *b, int64_t id);
/* The estimate of id's count: the least of its counters (>= its true count). */
uint32_t qr_bloom_count(const qr_bloom *b, int64_t id);
/* A sighting of id towards `reach` (admission's admit_after): true when
 * it brings id's estimate to reach (the counters are then left as they
 * were: the id leaves the filter's care); otherwise its counters are
 * incremented and false. One pass over the k counters. */
bool qr_bloom_sight(qr_bloom *b, int64_t id, uint32_t reach);

/* The formula's false-positive rate with n distinct ids in m counters and
 * k hashes: (1 - e^(-kn/m))^k. */
double qr_bloom_fp_rate(uint64_t n, uint64_t m, int k);

#endif /* QR_COMMON_BLOOM_H */

/*
 * table_options.h - an embedding table's own options, given among its
 * variable options ("admit_after=3,evict_after_steps=10000,
 * optimizer=adagrad"): row admission and eviction (docs/EMBEDDINGS.md),
 * and where admission counts sightings: an exact index of candidates
 * (admit_filter=exact, the default) or a counting Bloom filter of fixed
 * size (admit_filter=bloom, admit_filter_bytes=N, admit_filter_hashes=K;
 * common/bloom.h).
 * The worker reads them to refuse bad ones where the caller can fix them,
 * the ps to apply them (ps/table.h); the optimizer skips them.
 */
#ifndef QR_COMMON_TABLE_OPTIONS_H
#define QR_COMMON_TABLE_OPTIONS_H

#include "common/bloom.h"

#include <stdbool.h>
#include <stdint.h>

/* The keys, as qr__list_has reads them ('_' written as '-'). */
#define QR_TABLE_OPTION_KEYS \
    "admit-after|evict-after-steps|admit-filter|admit-filter-bytes|admit-filter-hashes"

#define QR_TABLE_MAX_ADMIT_AFTER 1000000
#define QR_TABLE_MAX_EVICT_STEPS (1ll << 40)
/* admit_filter=bloom without admit_filter_bytes: 16 MiB a ps, 16 Mi
 * counters (2 million ids at 8 counters an id: p = 0.031 with k = 3). */
#define QR_TABLE_DEFAULT_FILTER_BYTES (16ull << 20)
#define QR_TABLE_DEFAULT_FILTER_HASHES 3

typedef struct qr_table_options {
    uint32_t admit_after;      /* a row is made at the id's k-th sighting; 0 or 1: the first */
    int64_t evict_after_steps; /* a row not updated for this many steps goes; 0: never */
    /* admit_filter=bloom: sightings counted in a counting Bloom filter of
     * this many 8-bit counters (bytes) and hashes, on each ps; 0: exact */
    uint64_t admit_filter_bytes;
    int admit_filter_hashes;
} qr_table_options;

/* Read the table keys of options (others are skipped); QR_EINVAL naming
 * a bad value or a bad mix (a filter without admit_after, admit_after
 * beyond the filter's counters, filter sizes without admit_filter=bloom). */
int qr_table_options_parse(const char *options, qr_table_options *out);

/* Does the options string set a table key (to refuse it for a dense
 * variable)? */
static inline bool qr_table_options_set(const qr_table_options *o) {
    return o->admit_after > 1 || o->evict_after_steps > 0 || o->admit_filter_bytes > 0;
}

#endif /* QR_COMMON_TABLE_OPTIONS_H */

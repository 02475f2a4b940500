/*
 * table_options.h - an embedding table's own options, given among its
 * variable options ("admit_after=3,evict_after_steps=10000,
 * optimizer=adagrad"): row admission and eviction (docs/EMBEDDINGS.md).
 * The worker reads them to refuse bad ones where the caller can fix them,
 * the ps to apply them (ps/table.h); the optimizer skips them.
 */
#ifndef QR_COMMON_TABLE_OPTIONS_H
#define QR_COMMON_TABLE_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

/* The keys, as qr__list_has reads them ('_' written as '-'). */
#define QR_TABLE_OPTION_KEYS "admit-after|evict-after-steps"

#define QR_TABLE_MAX_ADMIT_AFTER 1000000
#define QR_TABLE_MAX_EVICT_STEPS (1ll << 40)

typedef struct qr_table_options {
    uint32_t admit_after;      /* a row is made at the id's k-th sighting; 0 or 1: the first */
    int64_t evict_after_steps; /* a row not updated for this many steps goes; 0: never */
} qr_table_options;

/* Read the table keys of options (others are skipped); QR_EINVAL naming
 * a bad value. */
int qr_table_options_parse(const char *options, qr_table_options *out);

/* Does the options string set a table key (to refuse it for a dense
 * variable)? */
static inline bool qr_table_options_set(const qr_table_options *o) {
    return o->admit_after > 1 || o->evict_after_steps > 0;
}

#endif /* QR_COMMON_TABLE_OPTIONS_H */

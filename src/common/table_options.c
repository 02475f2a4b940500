/*
 * table_options.c - reading an embedding table's own options
 * (table_options.h).
 */
#include "common/table_options.h"

#include "common/common.h"

#include <stdlib.h>
#include <string.h>

/* A whole number from min to max for key, or QR_EINVAL saying what it is. */
static int whole(const char *key, const char *value, long long min, long long max,
                 const char *what, long long *out) {
    char *end = NULL;
    long long n = strtoll(value, &end, 10);
    if (!value[0] || *end || n < min || n > max)
        return qr__fail(QR_EINVAL, "%s=%s: want a whole number from %lld to %lld (%s)", key,
                        value, min, max, what);
    *out = n;
    return QR_OK;
}

static int parse_key(const char *key, const char *value, qr_table_options *out, int *filter) {
    long long n = 0;
    int rc = QR_OK;
    if (!strcmp(key, "admit-filter")) {
        if (!strcmp(value, "exact")) *filter = 1;
        else if (!strcmp(value, "bloom")) *filter = 2;
        else rc = qr__fail(QR_EINVAL, "admit-filter=%s: want exact (an index of the ids seen) "
                           "or bloom (a counting Bloom filter of fixed size)", value);
    } else if (!strcmp(key, "admit-after")) {
        rc = whole(key, value, 1, QR_TABLE_MAX_ADMIT_AFTER,
                   "the sightings of an id before it gets a row", &n);
        out->admit_after = (uint32_t)n;
    } else if (!strcmp(key, "evict-after-steps")) {
        rc = whole(key, value, 1, QR_TABLE_MAX_EVICT_STEPS,
                   "the steps a row may go without an update", &n);
        out->evict_after_steps = n;
    } else if (!strcmp(key, "admit-filter-bytes")) {
        rc = whole(key, value, (long long)QR_BLOOM_MIN_COUNTERS,
                   (long long)QR_BLOOM_MAX_COUNTERS,
                   "the bytes of the admission filter on each ps, one 8-bit counter each", &n);
        out->admit_filter_bytes = (uint64_t)n;
    } else {
        rc = whole(key, value, 1, QR_BLOOM_MAX_HASHES,
                   "the hashes, counters an id has in the admission filter", &n);
        out->admit_filter_hashes = (int)n;
    }
    return rc;
}

int qr_table_options_parse(const char *options, qr_table_options *out) {
    memset(out, 0, sizeof *out);
    int filter = 0; /* admit_filter: 0 not given, 1 exact, 2 bloom */
    const char *item = options ? options : "";
    while (*item) {
        size_t len = strcspn(item, ",");
        const char *eq = memchr(item, '=', len);
        char key[32] = "", value[32] = "";
        if (eq && (size_t)(eq - item) < sizeof key && len - (size_t)(eq - item) - 1 < sizeof value) {
            memcpy(key, item, (size_t)(eq - item));
            memcpy(value, eq + 1, len - (size_t)(eq - item) - 1);
            for (char *c = key; *c; c++)
                if (*c == '_') *c = '-';
        }
        if (key[0] && qr__list_has(QR_TABLE_OPTION_KEYS, '|', key)) {
            int rc = parse_key(key, value, out, &filter);
            if (rc) return rc;
        }
        item += len + (item[len] == ',');
    }
    bool sized = out->admit_filter_bytes || out->admit_filter_hashes;
    if (filter != 2) {
        if (sized)
            return qr__fail(QR_EINVAL, "admit_filter_bytes and admit_filter_hashes size the "
                            "counting Bloom filter: they need admit_filter=bloom");
        return QR_OK;
    }
    if (out->admit_after < 2)
        return qr__fail(QR_EINVAL, "admit_filter=bloom counts the sightings admit_after asks "
                        "for: give admit_after=K too (K from 2 to %u)", QR_BLOOM_MAX_COUNT);
    if (out->admit_after > QR_BLOOM_MAX_COUNT)
        return qr__fail(QR_EINVAL, "admit_after=%u with admit_filter=bloom: its 8-bit counters "
                        "count to %u", out->admit_after, QR_BLOOM_MAX_COUNT);
    if (!out->admit_filter_bytes) out->admit_filter_bytes = QR_TABLE_DEFAULT_FILTER_BYTES;
    if (!out->admit_filter_hashes) out->admit_filter_hashes = QR_TABLE_DEFAULT_FILTER_HASHES;
    return QR_OK;
}

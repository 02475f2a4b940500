/*
 * table_options.c - reading an embedding table's own options
 * (table_options.h).
 */
#include "common/table_options.h"

#include "common/common.h"

#include <stdlib.h>
#include <string.h>

int qr_table_options_parse(const char *options, qr_table_options *out) {
    memset(out, 0, sizeof *out);
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
            char *end = NULL;
            long long n = strtoll(value, &end, 10);
            bool admit = !strcmp(key, "admit-after");
            long long max = admit ? QR_TABLE_MAX_ADMIT_AFTER : QR_TABLE_MAX_EVICT_STEPS;
            if (!value[0] || *end || n < 1 || n > max)
                return qr__fail(QR_EINVAL, "%s=%s: want a whole number from 1 to %lld (%s)",
                                key, value, max,
                                admit ? "the sightings of an id before it gets a row"
                                      : "the steps a row may go without an update");
            if (admit) out->admit_after = (uint32_t)n;
            else out->evict_after_steps = n;
        }
        item += len + (item[len] == ',');
    }
    return QR_OK;
}

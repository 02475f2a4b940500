/*
 * rows.h - sparse rows gathered from one push or from the members of a
 * sync step: duplicate ids summed (in the order they come, so the result
 * does not depend on anything but that order), then applied to a table or
 * to the rows of a dense variable.
 */
#ifndef QR_PS_ROWS_H
#define QR_PS_ROWS_H

#include "common/idmap.h"
#include "ps/store.h"

typedef struct row_sum {
    int64_t dim;
    qr_idmap index;
    int64_t *ids;     /* distinct ids, in first-seen order */
    float *sum;       /* n x dim: the summed rows */
    uint32_t *count;  /* how many sources held each id */
    uint32_t *last;   /* the last source that held it */
    uint64_t n, cap;
    uint32_t sources; /* calls to row_sum_add */
} row_sum;

int row_sum_init(row_sum *s, int64_t dim, uint64_t expected);
void row_sum_free(row_sum *s);
/* Add k rows: ids (read with memcpy: a payload need not align them) and
 * k x dim floats. */
int row_sum_add(row_sum *s, const uint8_t *ids, const float *rows, int64_t k);
/* Divide every row by divisor, or (per_row) each by its count. */
void row_sum_scale(row_sum *s, float divisor, bool per_row);

#endif /* QR_PS_ROWS_H */

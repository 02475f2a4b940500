/*
 * rows.h - sparse rows gathered from one push or from the members of a
 * sync step: duplicate ids summed (in the order they come, so the result
 * does not depend on anything but that order), then applied to a table or
 * to the rows of a dense variable. A push whose ids are distinct rows of a
 * table already skips the sum (row_marks).
 */
#ifndef QR_PS_ROWS_H
#define QR_PS_ROWS_H

#include "common/idmap.h"
#include "ps/store.h"
#include "ps/table.h"

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

/* A bit per row of a table, all clear between uses: what finds a push's
 * duplicate ids without an index of its own (qr__rows_present_distinct). */
typedef struct row_marks {
    uint64_t *bits;
    uint64_t nbits;
} row_marks;

/* Are the n ids (read with memcpy) all rows of t already, each once?
 * Found with their cache misses overlapped; a duplicate shows as a row
 * whose mark is set already. The marks it sets are cleared before it
 * returns. False too when memory for the marks ran out. */
bool qr__rows_present_distinct(row_marks *m, const qr_table *t, const uint8_t *ids, uint64_t n);
void qr__row_marks_free(row_marks *m);

int row_sum_init(row_sum *s, int64_t dim, uint64_t expected);
void row_sum_free(row_sum *s);
/* Add k rows: ids (read with memcpy: a payload need not align them) and
 * k x dim floats. */
int row_sum_add(row_sum *s, const uint8_t *ids, const float *rows, int64_t k);
/* Divide every row by divisor, or (per_row) each by its count. */
void row_sum_scale(row_sum *s, float divisor, bool per_row);

#endif /* QR_PS_ROWS_H */

/*
 * dedup.c - distinct rows of a sparse gradient, duplicates summed.
 *
 * TF's optimizers do the same before their sparse kernels
 * (Optimizer._apply_sparse_duplicate_indices: unsorted_segment_sum over
 * unique indices). Why an open-addressing hash table and not a sort:
 *   - O(nidx) expected instead of O(nidx log nidx);
 *   - it keeps the rows in first-occurrence order and sums duplicates in
 *     the order they appear, so the result is deterministic and the same as
 *     a plain in-order accumulation (np.add.at in the reference test);
 *   - the gradient rows never move: a row that occurs once is used in place,
 *     only repeated rows are summed into a small side buffer. A sort would
 *     either permute (nidx, dim) floats or gather them afterwards.
 * Linear probing in a table of at least twice nidx slots, keys are the row
 * indices (-1 = empty) hashed by Fibonacci multiplication.
 */
#include "optim/optim_internal.h"

#include <stdlib.h>
#include <string.h>

void qr__optim_rows_free(qr_optim_rows *r) {
    free(r->row);
    free(r->grad);
    free(r->sum);
    memset(r, 0, sizeof *r);
}

int qr__optim_dedup(const int64_t *indices, const float *grad, int64_t nidx, int64_t rows,
                    int64_t dim, qr_optim_rows *out) {
    memset(out, 0, sizeof *out);
    /* All indices are checked before anything is allocated or changed. */
    for (int64_t i = 0; i < nidx; i++)
        if (indices[i] < 0 || indices[i] >= rows)
            return qr__fail(QR_EINVAL, "index %lld at offset %lld is out of range [0, %lld)",
                            (long long)indices[i], (long long)i, (long long)rows);

    int bits = 4;
    while (((int64_t)1 << bits) < 2 * nidx) bits++;
    size_t cap = (size_t)1 << bits, mask = cap - 1;
    int64_t *key = malloc(cap * sizeof *key);  /* row index or -1 */
    int64_t *val = malloc(cap * sizeof *val);  /* position in out->row */
    int64_t *first = malloc((size_t)nidx * sizeof *first); /* first offset of each row */
    int64_t *count = calloc((size_t)nidx, sizeof *count);
    out->row = malloc((size_t)nidx * sizeof *out->row);
    out->grad = malloc((size_t)nidx * sizeof *out->grad);
    int64_t *slot_of = malloc((size_t)nidx * sizeof *slot_of); /* offset i -> distinct row */
    int rc = QR_OK;
    if (!key || !val || !first || !count || !out->row || !out->grad || !slot_of) {
        rc = qr__fail(QR_ENOMEM, "out of memory deduplicating %lld indices", (long long)nidx);
        goto done;
    }
    memset(key, 0xff, cap * sizeof *key);

    int64_t n = 0, nrep = 0;
    for (int64_t i = 0; i < nidx; i++) {
        int64_t r = indices[i];
        size_t h = (size_t)(((uint64_t)r * 0x9E3779B97F4A7C15ull) >> (64 - bits));
        while (key[h] != -1 && key[h] != r) h = (h + 1) & mask;
        if (key[h] == -1) {
            key[h] = r;
            val[h] = n;
            out->row[n] = r;
            first[n] = i;
            n++;
        }
        int64_t u = val[h];
        slot_of[i] = u;
        if (++count[u] == 2) nrep++;
    }
    out->n = n;

    /* Rows seen once point into grad; repeated rows get a summed copy. */
    if (nrep > 0) {
        out->sum = malloc((size_t)nrep * (size_t)dim * sizeof(float));
        if (!out->sum) {
            rc = qr__fail(QR_ENOMEM, "out of memory summing %lld repeated rows", (long long)nrep);
            goto done;
        }
    }
    int64_t next = 0;
    for (int64_t u = 0; u < n; u++) {
        if (count[u] == 1) {
            out->grad[u] = grad + first[u] * dim;
        } else {
            float *dst = out->sum + next++ * dim;
            memcpy(dst, grad + first[u] * dim, (size_t)dim * sizeof(float));
            out->grad[u] = dst;
        }
    }
    for (int64_t i = 0; i < nidx; i++) {
        int64_t u = slot_of[i];
        if (count[u] == 1 || first[u] == i) continue;
        float *dst = (float *)out->grad[u];
        const float *src = grad + i * dim;
        for (int64_t d = 0; d < dim; d++) dst[d] += src[d];
    }

done:
    free(key);
    free(val);
    free(first);
    free(count);
    free(slot_of);
    if (rc) qr__optim_rows_free(out);
    return rc;
}

/*
 * delta.c - the two element loops of local SGD (docs/ASYNC.md): the
 * worker's delta w_local - w_pulled, and the ps's w += delta for a push
 * flagged QR_PUSH_DELTA, dense and row-wise. No optimizer and no slots:
 * a delta is added as it is. Contracts in optim.h.
 */
#include "optim/optim_internal.h"

QR_OPTIM_LOOP static void add_in_place(float *restrict var, const float *restrict delta,
                                       int64_t n) {
    for (int64_t i = 0; i < n; i++) var[i] += delta[i];
}

QR_OPTIM_LOOP static void add_to(float *restrict out, const float *restrict w,
                                 const float *restrict delta, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = w[i] + delta[i];
}

/* Two loops so that each has restrict pointers and vectorises: the in-place
 * call (out == w) would break the out-of-place loop's no-alias promise. */
void qr_optim_add_delta(float *out, const float *w, const float *delta, int64_t n) {
    if (out == w) add_in_place(out, delta, n);
    else add_to(out, w, delta, n);
}

int qr_optim_add_delta_rows(float *var, int64_t rows, int64_t dim, const int64_t *indices,
                            const float *delta, int64_t nidx) {
    /* Check every index first, so that a bad one changes nothing. */
    for (int64_t k = 0; k < nidx; k++)
        if (indices[k] < 0 || indices[k] >= rows)
            return qr__fail(QR_EINVAL, "delta row %lld: index %lld is out of range [0, %lld)",
                            (long long)k, (long long)indices[k], (long long)rows);
    for (int64_t k = 0; k < nidx; k++)
        add_in_place(var + indices[k] * dim, delta + k * dim, dim);
    return QR_OK;
}

QR_OPTIM_LOOP void qr_optim_delta(float *restrict out, const float *restrict now,
                                  const float *restrict before, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = now[i] - before[i];
}

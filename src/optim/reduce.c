/*
 * reduce.c - combining the gradients of one synchronous step.
 *
 * dst = (srcs[0] + srcs[1] + ... + srcs[k-1]) / divisor, added strictly in
 * the order given. Floating-point addition is not associative, so the
 * order is part of the result: the ps passes the step's pushes sorted by
 * (worker, seq), and the single-process reference mode (quorum train
 * --local) calls this same function in the same order, which is what
 * makes the two bit-identical.
 *
 * The ps reduces a block at a time into a buffer that stays in L1 and
 * hands each block straight to the optimizer (qr_optim_reduce_apply_dense,
 * optim.c): the same operations on each element as the whole-tensor
 * reduce, so the same bits, without writing the sum out and reading it
 * back.
 */
#include "optim/optim_internal.h"

#include <string.h>

/* Built like the optimizer loops (SSE2 and AVX2 clones). An add or a
 * division is one IEEE operation whatever the vector width, so every
 * clone gives the same bits. */
QR_OPTIM_LOOP static void sum_into(float *restrict dst, const float *restrict a,
                                   const float *restrict b, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
}

QR_OPTIM_LOOP static void add_into(float *restrict dst, const float *restrict s, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += s[i];
}

QR_OPTIM_LOOP static void divide(float *restrict dst, int64_t n, float divisor) {
    for (int64_t i = 0; i < n; i++) dst[i] /= divisor;
}

void qr__optim_reduce_at(float *dst, const float *const *srcs, int k, int64_t off, int64_t n,
                         float divisor) {
    if (k <= 0 || n <= 0) return;
    int j = 1;
    if (dst == srcs[0] + off) {
        /* in place: the first source is the sum so far */
    } else if (k >= 2) {
        sum_into(dst, srcs[0] + off, srcs[1] + off, n); /* = a copy of srcs[0], then += srcs[1] */
        j = 2;
    } else {
        memcpy(dst, srcs[0] + off, (size_t)n * sizeof *dst);
    }
    for (; j < k; j++) add_into(dst, srcs[j] + off, n);
    if (divisor != 1.0f) divide(dst, n, divisor);
}

void qr_optim_reduce(float *dst, const float *const *srcs, int k, int64_t n, float divisor) {
    qr__optim_reduce_at(dst, srcs, k, 0, n, divisor);
}

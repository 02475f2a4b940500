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
 * clone gives the same bits. Up to four sources are added in one loop,
 * left to right as written ((dst + a) + b) + c: one pass over dst instead
 * of one per source, the same operations in the same order. */
QR_OPTIM_LOOP static void sum2(float *restrict dst, const float *restrict a,
                               const float *restrict b, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
}

QR_OPTIM_LOOP static void sum3(float *restrict dst, const float *restrict a,
                               const float *restrict b, const float *restrict c, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = a[i] + b[i] + c[i];
}

QR_OPTIM_LOOP static void sum4(float *restrict dst, const float *restrict a,
                               const float *restrict b, const float *restrict c,
                               const float *restrict d, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = a[i] + b[i] + c[i] + d[i];
}

QR_OPTIM_LOOP static void add1(float *restrict dst, const float *restrict a, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += a[i];
}

QR_OPTIM_LOOP static void add2(float *restrict dst, const float *restrict a,
                               const float *restrict b, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = dst[i] + a[i] + b[i];
}

QR_OPTIM_LOOP static void add3(float *restrict dst, const float *restrict a,
                               const float *restrict b, const float *restrict c, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = dst[i] + a[i] + b[i] + c[i];
}

QR_OPTIM_LOOP static void divide(float *restrict dst, int64_t n, float divisor) {
    for (int64_t i = 0; i < n; i++) dst[i] /= divisor;
}

void qr__optim_reduce_at(float *dst, const float *const *srcs, int k, int64_t off, int64_t n,
                         float divisor) {
    if (k <= 0 || n <= 0) return;
    const float *s[4];
    int j = 1; /* sources summed so far */
    if (dst != srcs[0] + off) { /* else in place: the first source is the sum so far */
        int m = QR_MIN(k, 4);
        for (int q = 0; q < m; q++) s[q] = srcs[q] + off;
        if (m == 1) memcpy(dst, s[0], (size_t)n * sizeof *dst);
        else if (m == 2) sum2(dst, s[0], s[1], n);
        else if (m == 3) sum3(dst, s[0], s[1], s[2], n);
        else sum4(dst, s[0], s[1], s[2], s[3], n);
        j = m;
    }
    while (j < k) {
        int m = QR_MIN(k - j, 3);
        for (int q = 0; q < m; q++) s[q] = srcs[j + q] + off;
        if (m == 1) add1(dst, s[0], n);
        else if (m == 2) add2(dst, s[0], s[1], n);
        else add3(dst, s[0], s[1], s[2], n);
        j += m;
    }
    if (divisor != 1.0f) divide(dst, n, divisor);
}

void qr_optim_reduce(float *dst, const float *const *srcs, int k, int64_t n, float divisor) {
    qr__optim_reduce_at(dst, srcs, k, 0, n, divisor);
}

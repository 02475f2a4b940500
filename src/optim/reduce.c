/*
 * reduce.c - combining the gradients of one synchronous step.
 *
 * dst = (srcs[0] + srcs[1] + ... + srcs[k-1]) / divisor, added strictly in
 * the order given. Floating-point addition is not associative, so the
 * order is part of the result: the ps passes the step's pushes sorted by
 * (worker, seq), and the single-process reference mode (quorum train
 * --local) calls this same function in the same order, which is what
 * makes the two bit-identical.
 */
#include "optim/optim.h"

void qr_optim_reduce(float *dst, const float *const *srcs, int k, int64_t n, float divisor) {
    if (k <= 0) return;
    if (dst != srcs[0])
        for (int64_t i = 0; i < n; i++) dst[i] = srcs[0][i];
    for (int j = 1; j < k; j++) {
        const float *s = srcs[j];
        for (int64_t i = 0; i < n; i++) dst[i] += s[i];
    }
    if (divisor != 1.0f)
        for (int64_t i = 0; i < n; i++) dst[i] /= divisor;
}

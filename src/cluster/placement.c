/*
 * placement.c - greedy least-loaded placement of dense variables and hash
 * sharding of sparse rows over the ps tasks.
 */
#include "cluster/placement.h"

#include "common/common.h"

#include <stdlib.h>

int qr_place_greedy(int nps, int nvars, const int64_t *bytes, int *ps_of_var) {
    if (nps < 1) return qr__fail(QR_EINVAL, "placement: need at least one ps task, got %d", nps);
    if (nvars < 0) return qr__fail(QR_EINVAL, "placement: negative variable count %d", nvars);
    if (nvars == 0) return QR_OK;
    if (!bytes || !ps_of_var) return qr__fail(QR_EINVAL, "placement: NULL argument");
    for (int i = 0; i < nvars; i++)
        if (bytes[i] < 0)
            return qr__fail(QR_EINVAL, "placement: variable %d has negative size %lld", i,
                            (long long)bytes[i]);
    int64_t *load = qr__calloc((size_t)nps, sizeof *load);
    if (!load) return QR_ENOMEM;
    for (int i = 0; i < nvars; i++) {
        /* Strict '<' keeps the lowest index on ties, as Python's min() does
         * in TensorFlow's GreedyLoadBalancingStrategy. */
        int best = 0;
        for (int p = 1; p < nps; p++)
            if (load[p] < load[best]) best = p;
        ps_of_var[i] = best;
        load[best] += bytes[i];
    }
    free(load);
    return QR_OK;
}

/* splitmix64's finalizer: every input bit affects every output bit, so
 * sequential ids (the common case: vocabulary indices) spread evenly. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int qr_place_row(int64_t id, int nps) {
    if (nps < 1) return qr__fail(QR_EINVAL, "placement: need at least one ps task, got %d", nps);
    return (int)(mix64((uint64_t)id) % (uint64_t)nps);
}

/*
 * placement.c - greedy least-loaded placement of dense variables (and of
 * the shards of partitioned ones), and hash sharding of sparse rows over
 * the ps tasks.
 */
#include "cluster/placement.h"

#include "common/common.h"

#include <math.h>
#include <stdlib.h>

int qr_place_greedy(int nps, int nvars, const int64_t *bytes, int *ps_of_var) {
    return qr_place_shards(nps, nvars, bytes, NULL, ps_of_var);
}

int qr_place_shards(int nps, int nshards, const int64_t *bytes, const int *group,
                    int *ps_of_shard) {
    if (nps < 1) return qr__fail(QR_EINVAL, "placement: need at least one ps task, got %d", nps);
    if (nshards < 0) return qr__fail(QR_EINVAL, "placement: negative variable count %d", nshards);
    if (nshards == 0) return QR_OK;
    if (!bytes || !ps_of_shard) return qr__fail(QR_EINVAL, "placement: NULL argument");
    for (int i = 0; i < nshards; i++)
        if (bytes[i] < 0)
            return qr__fail(QR_EINVAL, "placement: variable %d has negative size %lld", i,
                            (long long)bytes[i]);
    int64_t *load = qr__calloc((size_t)nps, sizeof *load);
    /* used[p] == i + 1: shard i's group already has a shard on p */
    int *used = qr__calloc((size_t)nps, sizeof *used);
    if (!load || !used) {
        free(load);
        free(used);
        return QR_ENOMEM;
    }
    int group_start = 0;
    for (int i = 0; i < nshards; i++) {
        if (!group || i == 0 || group[i] != group[i - 1]) group_start = i;
        /* Strict '<' keeps the lowest index on ties, as Python's min() does
         * in TensorFlow's GreedyLoadBalancingStrategy. */
        int best = -1;
        for (int p = 0; p < nps; p++)
            if (used[p] != group_start + 1 && (best < 0 || load[p] < load[best])) best = p;
        if (best < 0) {
            free(load);
            free(used);
            return qr__fail(QR_EINVAL, "placement: variable %d has more shards than the %d ps "
                            "tasks", group ? group[i] : i, nps);
        }
        ps_of_shard[i] = best;
        used[best] = group_start + 1;
        load[best] += bytes[i];
    }
    free(load);
    free(used);
    return QR_OK;
}

int qr_partition_count(int64_t bytes, int64_t dim0, int nps, double min_mb, int wanted) {
    if (nps < 1 || dim0 < 1 || bytes < 0 || wanted < 0 || !(min_mb >= 0))
        return qr__fail(QR_EINVAL, "partitions: bad arguments");
    if (wanted > 0) {
        if (wanted > nps)
            return qr__fail(QR_EINVAL, "partitions=%d, but the cluster has %d ps task%s: at "
                            "most one shard per ps", wanted, nps, nps == 1 ? "" : "s");
        if (wanted > dim0)
            return qr__fail(QR_EINVAL, "partitions=%d, but dimension 0 has only %lld rows to "
                            "split", wanted, (long long)dim0);
        return wanted;
    }
    if (min_mb <= 0) return 1;
    /* TensorFlow's min_max_variable_partitioner: as many shards of at least
     * min_mb as fit, at most one per ps and one per row. */
    double shards = ceil((double)bytes / (min_mb * 1048576.0));
    int64_t n = (int64_t)QR_MIN(shards, (double)nps);
    n = QR_MIN(n, dim0);
    return (int)QR_MAX(n, 1);
}

int64_t qr_partition_rows(int64_t dim0, int nparts, int k) {
    /* The first dim0 % nparts shards get one row more, as TensorFlow's. */
    return dim0 / nparts + (k < dim0 % nparts);
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

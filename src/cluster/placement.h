/*
 * placement.h - which ps task holds which variable.
 *
 * Every worker computes placement on its own from the declarations, with
 * no message exchanged, so both functions must give the same answer on
 * every machine and in every version that shares a cluster: they depend
 * only on their arguments.
 */
#ifndef QR_CLUSTER_PLACEMENT_H
#define QR_CLUSTER_PLACEMENT_H

#include <stdint.h>

/* Greedy least-loaded placement of dense variables, as TF's
 * replica_device_setter with GreedyLoadBalancingStrategy: variables taken
 * in declaration order, each to the ps with the least bytes so far (ties
 * -> lowest index). Deterministic. ps_of_var[i] receives the ps of
 * variable i. QR_EINVAL if nps < 1, nvars < 0 or a size is negative. */
int qr_place_greedy(int nps, int nvars, const int64_t *bytes, int *ps_of_var);

/* The same for shards: shard i of bytes[i], shards of one variable
 * consecutive with the same group[i] and each on a different ps (the
 * least loaded one its variable does not use yet). group NULL: every
 * shard a variable of its own (qr_place_greedy). QR_EINVAL if a group has
 * more shards than there are ps tasks. */
int qr_place_shards(int nps, int nshards, const int64_t *bytes, const int *group,
                    int *ps_of_shard);

/* How many shards a dense variable of `bytes` with dim0 rows (its first
 * dimension) is split into: `wanted` if > 0 (at most nps and dim0, or
 * QR_EINVAL), else as TensorFlow's min_max_variable_partitioner with a
 * minimum shard of min_mb MiB and at most nps shards (1 if min_mb is 0). */
int qr_partition_count(int64_t bytes, int64_t dim0, int nps, double min_mb, int wanted);

/* Rows of shard k of dim0 rows split nparts ways (the first dim0 % nparts
 * shards have one more). */
int64_t qr_partition_rows(int64_t dim0, int nparts, int k);

/* Shard of a sparse row id: a well-mixed 64-bit hash of the id modulo nps
 * (used by embedding tables later). Returns 0..nps-1, or QR_EINVAL if
 * nps < 1. The hash must never change: it decides where saved rows live. */
int qr_place_row(int64_t id, int nps);

#endif /* QR_CLUSTER_PLACEMENT_H */

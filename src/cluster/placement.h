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

/* Shard of a sparse row id: a well-mixed 64-bit hash of the id modulo nps
 * (used by embedding tables later). Returns 0..nps-1, or QR_EINVAL if
 * nps < 1. The hash must never change: it decides where saved rows live. */
int qr_place_row(int64_t id, int nps);

#endif /* QR_CLUSTER_PLACEMENT_H */

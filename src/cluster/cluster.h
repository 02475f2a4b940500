/*
 * cluster.h - the cluster spec as library code sees it (quorum.h keeps it
 * opaque), plus the constructors the local launcher and the worker use.
 *
 * Every address in a qr_cluster has passed qr_addr_parse and no two tasks
 * share an address, so code that binds or connects can parse them again
 * without handling errors it could not explain better than the spec did.
 */
#ifndef QR_CLUSTER_CLUSTER_H
#define QR_CLUSTER_CLUSTER_H

#include "quorum.h"

struct qr_cluster {
    int nps, nworkers;
    char **ps;        /* nps address strings as given */
    char **workers;   /* nworkers address strings */
    char job[16];     /* "ps" or "worker" ("" if the spec names no task) */
    int task_index;   /* -1 if none */
};

/* Deep copy of src into a new spec. */
int qr_cluster_clone(const qr_cluster *src, qr_cluster **out);

/* Build a spec from address lists directly (used by the local launcher).
 * job NULL or "" means the spec names no task (task_index is ignored and
 * stored as -1). Same checks as qr_cluster_from_flags. */
int qr_cluster_create(qr_cluster **out, int nps, const char *const *ps, int nworkers,
                      const char *const *workers, const char *job, int task_index);

#endif /* QR_CLUSTER_CLUSTER_H */

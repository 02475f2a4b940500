/*
 * worker.h - what the layers above may read of a worker handle beyond
 * include/quorum.h: the figures of its metrics page (src/train/monitor.c),
 * which the handle keeps as its calls go, so that a training loop of a
 * program's own (quorum.torch's) serves the page quorum's trainer serves;
 * and the end of a run for a worker that is not the chief (src/train
 * waits for it after its last step).
 */
#ifndef QR_WORKER_H
#define QR_WORKER_H

#include "common/common.h"
#include "common/metrics.h"

/* The handle's calls so far: the time of each dense push (qr_worker_push,
 * qr_worker_push_pull, a push request waited for) and pull, every ps
 * answered; and the pushes a sync step dropped as stale (QR_ESTALE). */
typedef struct qr_worker_calls {
    qr_prom_hist push, pull;
    uint64_t stale_pushes;
} qr_worker_calls;

void qr__worker_calls(const qr_worker *w, qr_worker_calls *out);
/* The batches one global step takes: replicas-to-aggregate in sync mode,
 * 1 in async mode (a step is one worker's push). */
int qr__worker_batches_per_step(const qr_worker *w);

/* A worker other than the chief, its steps done: wait until the run ends.
 * The chief ends it (its evaluation, then STOP: QR_OK), or ps 0 does
 * when the chief is lost for restart-wait-ms (QR_ECHIEFLOST: nobody
 * evaluated) or the run aborts (QR_EABORTED); each with ps 0's reason. */
int qr__worker_wait_end(qr_worker *w);

#endif /* QR_WORKER_H */

/*
 * worker_metrics.h - a training worker's Prometheus endpoint (worker_metrics.c).
 */
#ifndef QR_TRAIN_WORKER_METRICS_H
#define QR_TRAIN_WORKER_METRICS_H

#include "common/common.h"
#include "common/metrics.h"

#include <pthread.h>

typedef struct worker_metrics {
    bool on;
    qr_metrics_server *server;
    pthread_mutex_t mu; /* guards the figures below */
    int64_t step, stale;
    double loss, steps_per_sec, examples_per_sec;
    uint64_t pushes, pulls;
    qr_prom_hist push_latency, pull_latency;
} worker_metrics;

/* Serve them if metrics-port is set; else every call returns at once. */
int qr__worker_metrics_start(worker_metrics *m, const qr_config *cfg);
/* Serve them on bind:port (QR_EINVAL, QR_EIO naming the port). */
int qr__worker_metrics_serve(worker_metrics *m, const char *bind, int port);
/* Every push and pull so far, counted elsewhere (instead of
 * qr__worker_metrics_call for each). */
void qr__worker_metrics_calls(worker_metrics *m, const qr_prom_hist *push,
                              const qr_prom_hist *pull);
void qr__worker_metrics_call(worker_metrics *m, bool push, double seconds);
void qr__worker_metrics_step(worker_metrics *m, int64_t step, double loss, double steps_per_sec,
                             double examples_per_sec, int64_t stale);
void qr__worker_metrics_stop(worker_metrics *m);

#endif

/*
 * worker_metrics.c - a training worker's Prometheus metrics
 * (--metrics-port; docs/METRICS.md). The training loop updates a few
 * figures after each step under a mutex; the HTTP server's thread writes
 * the page from them under the same mutex, so it never touches the
 * worker handle, which belongs to the training thread. A program's own
 * loop (monitor.c) serves the same page, its call figures taken from the
 * handle's (worker/worker.h).
 */
#include "train/worker_metrics.h"

#include "common/config.h"

#include <stdlib.h>
#include <string.h>

static void family(FILE *f, const char *name, const char *type, const char *help, double v) {
    qr_prom_family(f, name, type, help);
    qr_prom_sample(f, name, NULL, v);
}

static void render(FILE *f, void *ctx) {
    worker_metrics *m = ctx;
    pthread_mutex_lock(&m->mu);
    family(f, "quorum_worker_global_step", "gauge", "The global step this worker last saw.",
           (double)m->step);
    family(f, "quorum_worker_loss", "gauge", "Moving average (0.95) of the minibatch loss.",
           m->loss);
    family(f, "quorum_worker_steps_per_second", "gauge",
           "Global steps per second since training started.", m->steps_per_sec);
    family(f, "quorum_worker_examples_per_second", "gauge",
           "Examples per second of the whole cluster since training started.", m->examples_per_sec);
    family(f, "quorum_worker_pushes_total", "counter", "Push calls made.", (double)m->pushes);
    family(f, "quorum_worker_pulls_total", "counter", "Pull calls made.", (double)m->pulls);
    family(f, "quorum_worker_stale_pushes_total", "counter",
           "Pushes the cluster dropped as stale (sync).", (double)m->stale);
    qr_prom_family(f, "quorum_worker_call_seconds", "histogram",
                   "Time of the worker's push and pull calls, every ps answered.");
    qr_prom_histogram(f, "quorum_worker_call_seconds", "op=\"push\"", &m->push_latency);
    qr_prom_histogram(f, "quorum_worker_call_seconds", "op=\"pull\"", &m->pull_latency);
    family(f, "quorum_process_resident_bytes", "gauge", "The worker process's resident memory.",
           (double)qr_process_rss_bytes());
    pthread_mutex_unlock(&m->mu);
}

int qr__worker_metrics_start(worker_metrics *m, const qr_config *cfg) {
    memset(m, 0, sizeof *m);
    int port = (int)qr__config_int(cfg, "metrics-port");
    return port ? qr__worker_metrics_serve(m, qr__config_str(cfg, "metrics-bind"), port) : QR_OK;
}

int qr__worker_metrics_serve(worker_metrics *m, const char *bind, int port) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->on = true;
    int rc = qr_metrics_start(&m->server, bind, port, render, m);
    if (rc) {
        pthread_mutex_destroy(&m->mu);
        m->on = false;
        return rc;
    }
    qr__log(QR_LOG_INFO, "metrics at http://%s:%d/metrics", bind, port);
    return QR_OK;
}

void qr__worker_metrics_calls(worker_metrics *m, const qr_prom_hist *push,
                              const qr_prom_hist *pull) {
    if (!m->on) return;
    pthread_mutex_lock(&m->mu);
    m->pushes = push->total;
    m->pulls = pull->total;
    m->push_latency = *push;
    m->pull_latency = *pull;
    pthread_mutex_unlock(&m->mu);
}

void qr__worker_metrics_call(worker_metrics *m, bool push, double seconds) {
    if (!m->on) return;
    pthread_mutex_lock(&m->mu);
    if (push) {
        m->pushes++;
        qr_prom_observe(&m->push_latency, seconds);
    } else {
        m->pulls++;
        qr_prom_observe(&m->pull_latency, seconds);
    }
    pthread_mutex_unlock(&m->mu);
}

void qr__worker_metrics_step(worker_metrics *m, int64_t step, double loss, double steps_per_sec,
                             double examples_per_sec, int64_t stale) {
    if (!m->on) return;
    pthread_mutex_lock(&m->mu);
    m->step = step;
    m->loss = loss;
    m->steps_per_sec = steps_per_sec;
    m->examples_per_sec = examples_per_sec;
    m->stale = stale;
    pthread_mutex_unlock(&m->mu);
}

void qr__worker_metrics_stop(worker_metrics *m) {
    if (!m->on) return;
    qr_metrics_stop(m->server);
    pthread_mutex_destroy(&m->mu);
    m->on = false;
}

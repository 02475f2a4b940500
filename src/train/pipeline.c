/*
 * pipeline.c - an async step's push and pull on a thread of its own, under
 * the next step's compute (--overlap pipeline; train.c, "Overlap").
 *
 * Why a thread: the worker has no I/O thread (worker/inflight.c): a
 * request started sends what its sockets take at once (a few hundred
 * KiB), and the rest of it and its answer move only while some call of
 * the worker waits, so the per-layer overlap of train.c hides little of a
 * step. Here the blocking
 * qr_worker_push_pull of step t runs on a second thread while the caller
 * computes step t+1; the worker's handle belongs to that thread from
 * qr__pipeline_start to qr__pipeline_finish (one handle, one thread at a
 * time: the join is the hand-over).
 *
 * Double buffers: the thread sends the gradients of step t from one set
 * while the caller's backward writes the next into the other, and pulls
 * the values into the back set of parameters while the caller's forward
 * reads the front one; finish swaps both. So step t+1's gradient is taken
 * on the values step t-1's push brought back: one step staler than
 * without the pipeline (async training allows it; sync cannot).
 */
#include "train/train_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *push_pull_thread(void *arg) {
    qr__pipeline *p = arg;
    double t0 = qr__now_sec();
    p->rc = qr_worker_push_pull(p->w, p->n, p->ids, (const float *const *)p->grads_back,
                                p->params_back, p->flags, &p->global);
    p->seconds = qr__now_sec() - t0;
    if (p->rc) snprintf(p->error, sizeof p->error, "%s", qr_last_error()); /* per thread */
    return NULL;
}

int qr__pipeline_init(qr__pipeline *p, qr_worker *w, int n, const int *ids,
                      const int64_t *sizes, float **grads) {
    memset(p, 0, sizeof *p);
    p->w = w;
    p->n = n;
    p->ids = ids;
    p->owned = qr__calloc((size_t)n * 2, sizeof *p->owned);
    p->params_back = qr__calloc((size_t)n, sizeof *p->params_back);
    p->grads_back = qr__calloc((size_t)n, sizeof *p->grads_back);
    p->grads_given = qr__calloc((size_t)n, sizeof *p->grads_given);
    if (!p->owned || !p->params_back || !p->grads_back || !p->grads_given) return QR_ENOMEM;
    memcpy(p->grads_given, grads, (size_t)n * sizeof *grads);
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)sizes[i] * sizeof(float);
        p->owned[2 * i] = p->params_back[i] = qr__aligned_alloc(bytes);
        p->owned[2 * i + 1] = p->grads_back[i] = qr__aligned_alloc(bytes);
        if (!p->params_back[i] || !p->grads_back[i]) return QR_ENOMEM;
    }
    return QR_OK;
}

static void swap_sets(float **a, float **b, int n) {
    for (int i = 0; i < n; i++) {
        float *t = a[i];
        a[i] = b[i];
        b[i] = t;
    }
}

int qr__pipeline_start(qr__pipeline *p, float **grads, unsigned flags) {
    swap_sets(grads, p->grads_back, p->n); /* the caller's next backward writes the other set */
    p->flags = flags;
    int err = pthread_create(&p->thread, NULL, push_pull_thread, p);
    if (err) {
        swap_sets(grads, p->grads_back, p->n);
        return qr__fail(QR_EIO, "--overlap pipeline: cannot start the step's thread: %s",
                        strerror(err));
    }
    p->running = true;
    return QR_OK;
}

int qr__pipeline_finish(qr__pipeline *p, float **params, int64_t *global) {
    if (!p->running) return QR_OK;
    pthread_join(p->thread, NULL);
    p->running = false;
    if (p->rc) return qr__fail(p->rc, "%s", p->error); /* its message, on this thread */
    swap_sets(params, p->params_back, p->n);
    *global = p->global;
    return QR_OK;
}

void qr__pipeline_end(qr__pipeline *p, float **grads) {
    if (p->running) {
        pthread_join(p->thread, NULL);
        p->running = false;
    }
    for (int i = 0; p->grads_given && i < p->n; i++)
        if (grads[i] != p->grads_given[i]) { /* the pair is {given, owned}: swap back */
            p->grads_back[i] = grads[i];
            grads[i] = p->grads_given[i];
        }
}

void qr__pipeline_free(qr__pipeline *p) {
    if (p->running) {
        pthread_join(p->thread, NULL);
        p->running = false;
    }
    free(p->grads_given);
    for (int i = 0; p->owned && i < 2 * p->n; i++) free(p->owned[i]);
    free(p->owned);
    free(p->params_back);
    free(p->grads_back);
    memset(p, 0, sizeof *p);
}

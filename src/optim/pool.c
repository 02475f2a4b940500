/*
 * pool.c - the small persistent thread pool of a qr_optim, used to split
 * the apply of one large tensor across "apply-threads" threads.
 *
 * One job at a time: a job is fn(arg, part, nparts) for every part, the
 * caller doing part 0 and worker w doing part w. The caller takes `busy`
 * with trylock, so two ps threads applying two large variables at once do
 * not queue behind each other: the second one just runs its apply alone.
 *
 * States of a worker: waiting on `wake` until `gen` changes (or `stop`),
 * running its part, then decrementing `pending`; the last one signals
 * `done`, on which the caller waits.
 */
#include "optim/optim_internal.h"

#include <pthread.h>
#include <stdlib.h>

struct qr_optim_pool {
    int nthreads; /* including the caller */
    pthread_t *threads;
    int started;
    pthread_mutex_t busy; /* held by the caller of a running job */
    pthread_mutex_t mu;   /* guards everything below */
    pthread_cond_t wake, done;
    uint64_t gen;
    int pending;
    bool stop;
    void (*fn)(void *arg, int part, int nparts);
    void *arg;
};

typedef struct worker_arg {
    qr_optim_pool *p;
    int part;
} worker_arg;

static void *worker_main(void *varg) {
    worker_arg *wa = varg;
    qr_optim_pool *p = wa->p;
    int part = wa->part;
    free(wa);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->stop) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        void (*fn)(void *, int, int) = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, part, p->nthreads);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int qr__optim_pool_create(qr_optim_pool **out, int nthreads) {
    *out = NULL;
    qr_optim_pool *p = qr__calloc(1, sizeof *p);
    if (!p) return QR_ENOMEM;
    p->nthreads = nthreads;
    pthread_mutex_init(&p->busy, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = qr__calloc((size_t)nthreads, sizeof(pthread_t));
    if (!p->threads) {
        qr__optim_pool_free(p);
        return QR_ENOMEM;
    }
    for (int w = 1; w < nthreads; w++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) {
            qr__optim_pool_free(p);
            return qr__fail(QR_ENOMEM, "optimizer thread pool: out of memory");
        }
        wa->p = p;
        wa->part = w;
        int err = pthread_create(&p->threads[w], NULL, worker_main, wa);
        if (err) {
            free(wa);
            qr__optim_pool_free(p);
            return qr__fail(QR_EINTERNAL, "optimizer thread pool: cannot start thread %d of %d (error %d)",
                            w, nthreads, err);
        }
        p->started = w;
    }
    *out = p;
    return QR_OK;
}

void qr__optim_pool_free(qr_optim_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int w = 1; w <= p->started; w++) pthread_join(p->threads[w], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->busy);
    free(p);
}

bool qr__optim_pool_run(qr_optim_pool *p, void (*fn)(void *arg, int part, int nparts),
                        void *arg) {
    if (pthread_mutex_trylock(&p->busy) != 0) return false;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->pending = p->nthreads - 1;
    p->gen++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    fn(arg, 0, p->nthreads);

    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->busy);
    return true;
}

/*
 * cluster_fixture.h - a real cluster inside one test process: ps tasks on
 * threads (qr_ps_run), workers as handles on the test's threads, all over
 * real loopback sockets on free ports. Header-only; each test includes it
 * once. The functions are static inline so that a program using only some
 * of them (the fuzz targets) builds without unused-function warnings.
 */
#ifndef QR_TEST_CLUSTER_FIXTURE_H
#define QR_TEST_CLUSTER_FIXTURE_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster/cluster.h"
#include "quorum.h"

#define FIX_MAX_PS 3
#define FIX_MAX_WORKERS 4

static inline int fix_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    bind(fd, (struct sockaddr *)&sa, sizeof sa);
    getsockname(fd, (struct sockaddr *)&sa, &len);
    close(fd);
    return ntohs(sa.sin_port);
}

typedef struct cluster_fixture {
    int nps, nworkers;
    char ps_addr[FIX_MAX_PS][64];
    char worker_addr[FIX_MAX_WORKERS][64];
    qr_ps *ps[FIX_MAX_PS];
    pthread_t thread[FIX_MAX_PS];
    int run_status[FIX_MAX_PS];
    qr_config *cfg;
} cluster_fixture;

typedef struct fix_ps_arg {
    qr_ps *ps;
    int *status;
} fix_ps_arg;

static inline void *fix_ps_thread(void *arg) {
    fix_ps_arg *a = arg;
    *a->status = qr_ps_run(a->ps);
    free(a);
    return NULL;
}

static inline qr_cluster *fix_spec(cluster_fixture *f, const char *job, int index) {
    const char *ps[FIX_MAX_PS], *wk[FIX_MAX_WORKERS];
    for (int i = 0; i < f->nps; i++) ps[i] = f->ps_addr[i];
    for (int i = 0; i < f->nworkers; i++) wk[i] = f->worker_addr[i];
    qr_cluster *c = NULL;
    if (qr_cluster_create(&c, f->nps, ps, f->nworkers, wk, job, index))
        fprintf(stderr, "qr_cluster_create: %s\n", qr_last_error());
    return c;
}

/* Set up addresses and the options every task shares; the caller may add
 * options to f->cfg before fix_start_ps. */
static inline void fix_init(cluster_fixture *f, int nps, int nworkers) {
    memset(f, 0, sizeof *f);
    f->nps = nps;
    f->nworkers = nworkers;
    qr_config_new(&f->cfg);
    qr_config_set(f->cfg, "timeout-ms", "5000");
    qr_config_set(f->cfg, "linger-ms", "300");
    /* Each port is free when asked for but released at once, so the
     * kernel may hand the same one out twice: draw again until distinct. */
    int ports[FIX_MAX_PS + FIX_MAX_WORKERS];
    for (int i = 0; i < nps + nworkers; i++) {
        bool fresh;
        do {
            ports[i] = fix_free_port();
            fresh = true;
            for (int j = 0; j < i; j++) fresh &= ports[j] != ports[i];
        } while (!fresh);
    }
    for (int i = 0; i < nps; i++)
        snprintf(f->ps_addr[i], sizeof f->ps_addr[i], "127.0.0.1:%d", ports[i]);
    for (int i = 0; i < nworkers; i++)
        snprintf(f->worker_addr[i], sizeof f->worker_addr[i], "127.0.0.1:%d", ports[nps + i]);
}

/* Create and run ps task i; returns qr_ps_create's status. */
static inline int fix_start_ps(cluster_fixture *f, int i) {
    qr_cluster *c = fix_spec(f, "ps", i);
    int rc = qr_ps_create(&f->ps[i], c, f->cfg);
    qr_cluster_free(c);
    if (rc) return rc;
    fix_ps_arg *a = malloc(sizeof *a);
    a->ps = f->ps[i];
    a->status = &f->run_status[i];
    pthread_create(&f->thread[i], NULL, fix_ps_thread, a);
    return QR_OK;
}

static inline qr_worker *fix_worker(cluster_fixture *f, int index) {
    qr_cluster *c = fix_spec(f, "worker", index);
    qr_worker *w = NULL;
    if (qr_worker_create(&w, c, -1, f->cfg)) fprintf(stderr, "worker: %s\n", qr_last_error());
    qr_cluster_free(c);
    return w;
}

/* Wait for every ps thread to end; frees them and the options. */
static inline void fix_join(cluster_fixture *f) {
    for (int i = 0; i < f->nps; i++) {
        if (!f->ps[i]) continue;
        pthread_join(f->thread[i], NULL);
        qr_ps_free(f->ps[i]);
    }
    qr_config_free(f->cfg);
}

#endif

/*
 * fit_line.c - the public API in one page: a ps task on a thread and a
 * worker that fits y = 3x + 2 by pushing gradients and pulling weights.
 * It includes only quorum.h and links only libquorum (the shared library).
 *
 *   ./fit_line            exits 0 when the fit is within 1e-3
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "quorum.h"

#define CHECK(call)                                                            \
    do {                                                                       \
        int rc_ = (call);                                                      \
        if (rc_ != QR_OK) {                                                    \
            fprintf(stderr, "%s failed: %s: %s\n", #call, qr_status_name(rc_), \
                    qr_last_error());                                          \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

static void *serve(void *ps) {
    qr_ps_run(ps);
    return NULL;
}

int main(void) {
    /* A cluster of one ps and one worker on Unix sockets in /tmp. */
    char ps_addr[64], worker_addr[64];
    snprintf(ps_addr, sizeof ps_addr, "unix:/tmp/quorum-fit-line-%d.sock", (int)getpid());
    snprintf(worker_addr, sizeof worker_addr, "unix:/tmp/quorum-fit-line-w-%d.sock", (int)getpid());
    qr_config *cfg;
    CHECK(qr_config_new(&cfg));
    CHECK(qr_config_set(cfg, "optimizer", "momentum"));
    CHECK(qr_config_set(cfg, "lr", "0.05"));

    qr_cluster *ps_spec, *worker_spec;
    CHECK(qr_cluster_from_flags(&ps_spec, ps_addr, worker_addr, "ps", 0));
    CHECK(qr_cluster_from_flags(&worker_spec, ps_addr, worker_addr, "worker", 0));
    qr_ps *ps;
    CHECK(qr_ps_create(&ps, ps_spec, cfg));
    pthread_t thread;
    pthread_create(&thread, NULL, serve, ps);

    /* The model: y = w x + b. */
    qr_worker *w;
    CHECK(qr_worker_create(&w, worker_spec, -1, cfg));
    int64_t one[1] = {1};
    int wid, bid;
    CHECK(qr_worker_declare(w, "w", 1, one, "zeros", 1, -1, &wid));
    CHECK(qr_worker_declare(w, "b", 1, one, "zeros", 2, -1, &bid));
    CHECK(qr_worker_initialize(w));

    int ids[2] = {wid, bid};
    for (int step = 0; step < 500; step++) {
        CHECK(qr_worker_pull(w, 2, ids, NULL));
        float wv = *qr_worker_var_data(w, wid), bv = *qr_worker_var_data(w, bid);
        /* Mean squared error over x = -1, -0.5, ..., 1; its gradient. */
        float gw = 0, gb = 0;
        for (int i = 0; i <= 4; i++) {
            float x = -1.0f + 0.5f * (float)i, err = wv * x + bv - (3 * x + 2);
            gw += 2 * err * x / 5;
            gb += 2 * err / 5;
        }
        const float gw_arr[1] = {gw}, gb_arr[1] = {gb};
        const float *grads[2] = {gw_arr, gb_arr};
        CHECK(qr_worker_push(w, 2, ids, grads, QR_PUSH_STEP, NULL));
    }
    CHECK(qr_worker_pull(w, 2, ids, NULL));
    float wv = *qr_worker_var_data(w, wid), bv = *qr_worker_var_data(w, bid);
    int64_t step;
    CHECK(qr_worker_global_step(w, &step));
    printf("after %lld steps: y = %.4f x + %.4f\n", (long long)step, wv, bv);

    CHECK(qr_worker_stop_cluster(w));
    qr_worker_free(w);
    pthread_join(thread, NULL);
    qr_ps_free(ps);
    qr_cluster_free(ps_spec);
    qr_cluster_free(worker_spec);
    qr_config_free(cfg);
    return (wv > 2.999f && wv < 3.001f && bv > 1.999f && bv < 2.001f) ? 0 : 1;
}

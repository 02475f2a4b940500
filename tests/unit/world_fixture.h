/*
 * world_fixture.h - a cluster_fixture with its workers for cmocka tests:
 * start the ps tasks (options as name/value pairs) and the worker
 * handles, initialize every worker, stop the cluster and free it all,
 * failing the test at the first error. Include after <cmocka.h>.
 */
#ifndef QR_TEST_WORLD_FIXTURE_H
#define QR_TEST_WORLD_FIXTURE_H

#include "cluster_fixture.h"

typedef struct world {
    cluster_fixture f;
    qr_worker *w[FIX_MAX_WORKERS];
} world;

/* opts: NULL-terminated name, value, name, value, ... set on every task. */
static inline void world_start(world *s, int nps, int nworkers, const char *const *opts) {
    fix_init(&s->f, nps, nworkers);
    for (int k = 0; opts && opts[k]; k += 2)
        assert_int_equal(qr_config_set(s->f.cfg, opts[k], opts[k + 1]), QR_OK);
    for (int i = 0; i < nps; i++) assert_int_equal(fix_start_ps(&s->f, i), QR_OK);
    for (int i = 0; i < nworkers; i++) {
        s->w[i] = fix_worker(&s->f, i);
        assert_non_null(s->w[i]);
    }
}

static inline void world_init_all(world *s) {
    for (int i = 0; i < s->f.nworkers; i++) {
        int rc = qr_worker_initialize(s->w[i]);
        if (rc) fprintf(stderr, "initialize: %s\n", qr_last_error());
        assert_int_equal(rc, QR_OK);
    }
}

static inline void world_finish(world *s) {
    assert_int_equal(qr_worker_stop_cluster(s->w[0]), QR_OK);
    for (int i = 0; i < s->f.nworkers; i++) qr_worker_free(s->w[i]);
    fix_join(&s->f);
}

#endif

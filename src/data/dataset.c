/*
 * dataset.c - freeing a dense dataset and the fixed train/test split of
 * one that ships without a split (a digits csv).
 */
#include "data/dataset.h"

#include "common/common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void qr_dataset_free(qr_dataset *d) {
    if (!d) return;
    free(d->x);
    free(d->y);
    memset(d, 0, sizeof *d);
}

static int alloc_dataset(qr_dataset *d, int64_t n, int64_t dim, int nclasses) {
    d->n = n;
    d->dim = dim;
    d->nclasses = nclasses;
    d->x = malloc((size_t)(n * dim) * sizeof(float) + 1);
    d->y = malloc((size_t)n * sizeof(int32_t) + 1);
    if (!d->x || !d->y) {
        qr_dataset_free(d);
        return qr__fail(QR_ENOMEM, "out of memory for a dataset of %lld x %lld", (long long)n,
                        (long long)dim);
    }
    return QR_OK;
}

int qr_dataset_split(const qr_dataset *all, double test_fraction, uint64_t seed,
                     qr_dataset *train, qr_dataset *test) {
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    int64_t ntest = (int64_t)llround((double)all->n * test_fraction);
    if (!(test_fraction > 0 && test_fraction < 1) || ntest < 1 || ntest >= all->n)
        return qr__fail(QR_EINVAL, "cannot hold out %g of %lld examples for testing",
                        test_fraction, (long long)all->n);
    /* Fisher-Yates; the first ntest entries of the permutation are test. */
    int64_t *perm = malloc((size_t)all->n * sizeof(int64_t));
    char *is_test = calloc((size_t)all->n, 1);
    if (!perm || !is_test) {
        free(perm);
        free(is_test);
        return qr__fail(QR_ENOMEM, "out of memory splitting %lld examples", (long long)all->n);
    }
    qr_rng rng;
    qr_rng_seed(&rng, seed);
    for (int64_t i = 0; i < all->n; i++) perm[i] = i;
    for (int64_t i = all->n - 1; i > 0; i--) {
        int64_t j = (int64_t)qr_rng_below(&rng, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int64_t i = 0; i < ntest; i++) is_test[perm[i]] = 1;
    free(perm);

    int rc = alloc_dataset(train, all->n - ntest, all->dim, all->nclasses);
    if (!rc) rc = alloc_dataset(test, ntest, all->dim, all->nclasses);
    if (rc) {
        free(is_test);
        qr_dataset_free(train);
        return rc;
    }
    int64_t itr = 0, ite = 0;
    for (int64_t i = 0; i < all->n; i++) {
        qr_dataset *d = is_test[i] ? test : train;
        int64_t k = is_test[i] ? ite++ : itr++;
        memcpy(d->x + k * all->dim, all->x + i * all->dim, (size_t)all->dim * sizeof(float));
        d->y[k] = all->y[i];
    }
    free(is_test);
    return QR_OK;
}

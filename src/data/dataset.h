/*
 * dataset.h - a dense dataset in memory, and the two things every loader
 * and its callers do with one: free it and split it into train and test.
 *
 * This is the bottom of src/data: the digits loader and the dispatcher
 * (data.c) use it and it uses neither, so the calls between the files go
 * one way: data.c -> digits.c, idx.c -> dataset.c (digits.c builds a
 * dataset, data.c splits and frees them). The model (model/model.h) takes
 * a qr_dataset to evaluate on and needs nothing else from src/data.
 */
#ifndef QR_DATA_DATASET_H
#define QR_DATA_DATASET_H

#include <stdint.h>

/* Dense datasets (Fashion-MNIST, the 8x8 digits) are (n, dim) float rows
 * with integer class labels. */
typedef struct qr_dataset {
    int64_t n;        /* examples */
    int64_t dim;      /* features per example */
    int nclasses;
    float *x;         /* (n, dim) row-major, pixel features scaled to [0,1] */
    int32_t *y;       /* (n) labels in [0, nclasses) */
} qr_dataset;

void qr_dataset_free(qr_dataset *d); /* frees arrays, zeroes struct; NULL-safe */

/* Split `all` into test (round(n * test_fraction) examples picked by a
 * permutation from `seed`) and train (the rest); both keep file order.
 * QR_EINVAL if the fraction leaves either side empty, QR_ENOMEM. */
int qr_dataset_split(const qr_dataset *all, double test_fraction, uint64_t seed,
                     qr_dataset *train, qr_dataset *test);

#endif /* QR_DATA_DATASET_H */

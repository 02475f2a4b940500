/*
 * libsvm.h - sparse datasets in CSR form, and the loader of the libsvm
 * text format.
 */
#ifndef QR_DATA_LIBSVM_H
#define QR_DATA_LIBSVM_H

#include <stdint.h>

/* libsvm text format: "label idx:val idx:val ..." (1-based indices,
 * ascending). Sparse, CSR. Blank lines are skipped; gz or plain. */
typedef struct qr_sparse_dataset {
    int64_t n, dim, nnz; /* dim = largest feature index seen */
    int64_t *row_ptr;    /* (n+1) */
    int32_t *col;        /* (nnz) 0-based */
    float *val;          /* (nnz) */
    float *label;        /* (n) as written in the file (e.g. +1/-1) */
} qr_sparse_dataset;

/* Status codes as in data.h. */
int qr_libsvm_load(const char *path, qr_sparse_dataset *out);
void qr_sparse_dataset_free(qr_sparse_dataset *d); /* NULL-safe */

#endif /* QR_DATA_LIBSVM_H */

/*
 * data.h - datasets a worker trains on, loaded into memory whole.
 *
 * Dense datasets (Fashion-MNIST, the 8x8 digits) are (n, dim) float rows
 * with integer class labels; sparse ones (libsvm text) are CSR. Loaders
 * validate everything they read: a bad file gives a status and a message
 * naming the file (and the line, for text), never a crash.
 *
 * Status codes: QR_ENOTFOUND for a missing file, QR_EIO for a read error
 * or truncated data, QR_EINVAL for malformed content (bad magic, a field
 * that is not a number, a label out of range, extra data), QR_ESHAPE when
 * two counts that must agree do not (images vs labels, columns per row).
 */
#ifndef QR_MODEL_DATA_H
#define QR_MODEL_DATA_H

#include <stdint.h>

typedef struct qr_dataset {
    int64_t n;        /* examples */
    int64_t dim;      /* features per example */
    int nclasses;
    float *x;         /* (n, dim) row-major, pixel features scaled to [0,1] */
    int32_t *y;       /* (n) labels in [0, nclasses) */
} qr_dataset;

/*
 * spec: "fashion-mnist" (IDX .gz files; directory = data_dir if non-NULL and
 *       non-empty, else /usr/share/datasets/fashion-mnist),
 *       "digits" (data/digits.csv.gz of this repo; found in data_dir if
 *       given, else in $QR_DATA_DIR, else in the compiled-in source path),
 *       or a PATH: a directory holding train-/t10k- IDX files (gz or not),
 *       or a digits-style .csv/.csv.gz file.
 * Fills train and test (zeroed on failure). For a csv (no official split)
 * the test split is a fixed held-out 20% chosen by a permutation with a
 * fixed seed, QR_DATA_SPLIT_SEED, not the training seed, so every run
 * tests on the same examples. nclasses: 10 for the named datasets, else
 * one more than the largest label seen.
 */
int qr_data_load(const char *spec, const char *data_dir, qr_dataset *train, qr_dataset *test);
void qr_dataset_free(qr_dataset *d); /* frees arrays, zeroes struct; NULL-safe */

#define QR_DATA_SPLIT_SEED 0x64696769747331ull /* "digits1" */
#define QR_DATA_TEST_FRACTION 0.2

/* IDX reader used by the above (validates magic, dims, sizes; gz or plain).
 * Images: magic 0x00000803 (ubyte, 3 dims) or any ubyte IDX of >= 2 dims;
 * each example is the product of the dims after the first, scaled by /255.
 * Labels: magic 0x00000801 (ubyte, 1 dim). *x / *y are malloc'ed. */
int qr_idx_load_images(const char *path, float **x, int64_t *n, int64_t *dim);
int qr_idx_load_labels(const char *path, int32_t **y, int64_t *n);

/* Digits-style csv (gz or plain): each line is `ncols - 1` pixel values in
 * [0, 16] and then an integer label in [0, 256). ncols = 0 takes the count
 * from the first line. Pixels are scaled by /16; nclasses = max label + 1. */
int qr_digits_load_csv(const char *path, int ncols, qr_dataset *out);

/* Split `all` into test (round(n * test_fraction) examples picked by a
 * permutation from `seed`) and train (the rest); both keep file order. */
int qr_dataset_split(const qr_dataset *all, double test_fraction, uint64_t seed,
                     qr_dataset *train, qr_dataset *test);

/* libsvm text format: "label idx:val idx:val ..." (1-based indices,
 * ascending). Sparse, CSR. Blank lines are skipped; gz or plain. */
typedef struct qr_sparse_dataset {
    int64_t n, dim, nnz; /* dim = largest feature index seen */
    int64_t *row_ptr;    /* (n+1) */
    int32_t *col;        /* (nnz) 0-based */
    float *val;          /* (nnz) */
    float *label;        /* (n) as written in the file (e.g. +1/-1) */
} qr_sparse_dataset;

int qr_libsvm_load(const char *path, qr_sparse_dataset *out);
void qr_sparse_dataset_free(qr_sparse_dataset *d);

#endif /* QR_MODEL_DATA_H */

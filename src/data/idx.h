/*
 * idx.h - the reader of IDX files (MNIST, Fashion-MNIST): one file of
 * images or one of labels.
 */
#ifndef QR_DATA_IDX_H
#define QR_DATA_IDX_H

#include <stdint.h>

/* Validates magic, dims, sizes; gz or plain. Status codes as in data.h.
 * Images: magic 0x00000803 (ubyte, 3 dims) or any ubyte IDX of >= 2 dims;
 * each example is the product of the dims after the first, scaled by /255.
 * Labels: magic 0x00000801 (ubyte, 1 dim). *x / *y are malloc'ed. */
int qr_idx_load_images(const char *path, float **x, int64_t *n, int64_t *dim);
int qr_idx_load_labels(const char *path, int32_t **y, int64_t *n);

#endif /* QR_DATA_IDX_H */

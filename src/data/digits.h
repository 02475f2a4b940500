/*
 * digits.h - the loader of digits-style csv files (data/digits.csv.gz of
 * this repository, or a file of the same shape).
 */
#ifndef QR_DATA_DIGITS_H
#define QR_DATA_DIGITS_H

#include "data/dataset.h"

/* Digits-style csv (gz or plain): each line is `ncols - 1` pixel values in
 * [0, 16] and then an integer label in [0, 256). ncols = 0 takes the count
 * from the first line. Pixels are scaled by /16; nclasses = max label + 1.
 * Status codes as in data.h. */
int qr_digits_load_csv(const char *path, int ncols, qr_dataset *out);

#endif /* QR_DATA_DIGITS_H */

/*
 * data.h - datasets a worker trains on, loaded into memory whole: the one
 * entry point that turns a dataset spec into a train and a test split.
 *
 * Dense datasets (Fashion-MNIST, the 8x8 digits) are qr_dataset
 * (dataset.h); sparse ones (libsvm text) are CSR (libsvm.h). Each file
 * format has a loader of its own (digits.h, idx.h, libsvm.h), which this
 * dispatcher calls; none of them calls back into it. Loaders validate
 * everything they read: a bad file gives a status and a message naming
 * the file (and the line, for text), never a crash.
 *
 * Status codes: QR_ENOTFOUND for a missing file, QR_EIO for a read error
 * or truncated data, QR_EINVAL for malformed content (bad magic, a field
 * that is not a number, a label out of range, extra data), QR_ESHAPE when
 * two counts that must agree do not (images vs labels, columns per row).
 */
#ifndef QR_DATA_DATA_H
#define QR_DATA_DATA_H

#include "data/dataset.h"

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

#define QR_DATA_SPLIT_SEED 0x64696769747331ull /* "digits1" */
#define QR_DATA_TEST_FRACTION 0.2

#endif /* QR_DATA_DATA_H */

/*
 * data.c - qr_data_load: turn a dataset spec ("fashion-mnist", "digits",
 * a directory of IDX files, a csv file) into a train and a test split.
 */
#include "data/data.h"

#include "common/common.h"
#include "data/digits.h"
#include "data/idx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef QR_SOURCE_DATA_DIR
#define QR_SOURCE_DATA_DIR "data" /* normally set by src/data/CMakeLists.txt */
#endif
#define FASHION_DIR "/usr/share/datasets/fashion-mnist"
#define NAMED_NCLASSES 10

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Find "<dir>/<split>-<kind>" in the spellings datasets ship with:
 * train-images-idx3-ubyte(.gz) and the original MNIST train-images.idx3-ubyte. */
static int find_idx(const char *dir, const char *split, const char *kind, const char *ext,
                    char *path, size_t size) {
    static const char *forms[] = {"%s/%s-%s-%s.gz", "%s/%s-%s-%s", "%s/%s-%s.%s.gz", "%s/%s-%s.%s"};
    for (size_t i = 0; i < QR_ARRAY_LEN(forms); i++) {
        int len = snprintf(path, size, forms[i], dir, split, kind, ext);
        if (len < 0 || (size_t)len >= size)
            return qr__fail(QR_EINVAL, "IDX directory %s: path too long", dir);
        if (is_file(path)) return QR_OK;
    }
    return qr__fail(QR_ENOTFOUND, "IDX directory %s: no %s-%s-%s or %s-%s-%s.gz file", dir, split,
                    kind, ext, split, kind, ext);
}

/* Load one split (train or t10k) of an IDX directory. */
static int load_idx_split(const char *dir, const char *split, qr_dataset *d) {
    char ipath[4096], lpath[4096];
    int rc = find_idx(dir, split, "images", "idx3-ubyte", ipath, sizeof ipath);
    if (!rc) rc = find_idx(dir, split, "labels", "idx1-ubyte", lpath, sizeof lpath);
    if (!rc) rc = qr_idx_load_images(ipath, &d->x, &d->n, &d->dim);
    if (rc) return rc;
    int64_t nlabels;
    rc = qr_idx_load_labels(lpath, &d->y, &nlabels);
    if (rc) return rc;
    if (nlabels != d->n)
        return qr__fail(QR_ESHAPE, "IDX files %s and %s: %lld images but %lld labels", ipath,
                        lpath, (long long)d->n, (long long)nlabels);
    int maxlabel = 0;
    for (int64_t i = 0; i < d->n; i++) maxlabel = QR_MAX(maxlabel, d->y[i]);
    d->nclasses = maxlabel + 1;
    return QR_OK;
}

/* nclasses > 0: labels must be below it (a named dataset); 0: inferred. */
static int load_idx_dir(const char *dir, int nclasses, qr_dataset *train, qr_dataset *test) {
    int rc = load_idx_split(dir, "train", train);
    if (!rc) rc = load_idx_split(dir, "t10k", test);
    if (rc) return rc;
    if (train->dim != test->dim)
        return qr__fail(QR_ESHAPE, "IDX directory %s: train images have %lld pixels, t10k %lld",
                        dir, (long long)train->dim, (long long)test->dim);
    int seen = QR_MAX(train->nclasses, test->nclasses);
    if (nclasses > 0 && seen > nclasses)
        return qr__fail(QR_EINVAL, "IDX directory %s: label %d out of range [0, %d)", dir,
                        seen - 1, nclasses);
    train->nclasses = test->nclasses = nclasses > 0 ? nclasses : seen;
    return QR_OK;
}

static int load_csv_split(const char *path, int ncols, int nclasses, qr_dataset *train,
                          qr_dataset *test) {
    qr_dataset all;
    int rc = qr_digits_load_csv(path, ncols, &all);
    if (rc) return rc;
    if (nclasses > 0 && all.nclasses > nclasses) {
        rc = qr__fail(QR_EINVAL, "digits file %s: label %d out of range [0, %d)", path,
                      all.nclasses - 1, nclasses);
    } else {
        if (nclasses > 0) all.nclasses = nclasses;
        rc = qr_dataset_split(&all, QR_DATA_TEST_FRACTION, QR_DATA_SPLIT_SEED, train, test);
        if (rc) qr__error_prefix("digits file %s: ", path);
    }
    qr_dataset_free(&all);
    return rc;
}

static int load_digits(const char *data_dir, qr_dataset *train, qr_dataset *test) {
    const char *dir = data_dir && *data_dir ? data_dir : getenv("QR_DATA_DIR");
    if (!dir || !*dir) dir = QR_SOURCE_DATA_DIR;
    char path[4096];
    int len = snprintf(path, sizeof path, "%s/digits.csv.gz", dir);
    if (len < 0 || (size_t)len >= sizeof path)
        return qr__fail(QR_EINVAL, "digits: data directory path too long");
    if (!is_file(path)) {
        char plain[4096];
        snprintf(plain, sizeof plain, "%s/digits.csv", dir);
        if (is_file(plain))
            memcpy(path, plain, sizeof path);
        else
            return qr__fail(QR_ENOTFOUND, "digits: no digits.csv.gz or digits.csv in %s "
                            "(--data-dir or QR_DATA_DIR name another folder)", dir);
    }
    return load_csv_split(path, 65, NAMED_NCLASSES, train, test);
}

int qr_data_load(const char *spec, const char *data_dir, qr_dataset *train, qr_dataset *test) {
    if (!train || !test) return qr__fail(QR_EINVAL, "qr_data_load: train and test are required");
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    if (!spec || !*spec) return qr__fail(QR_EINVAL, "dataset: empty spec");
    int rc;
    struct stat st;
    if (!strcmp(spec, "fashion-mnist")) {
        rc = load_idx_dir(data_dir && *data_dir ? data_dir : FASHION_DIR, NAMED_NCLASSES, train,
                          test);
    } else if (!strcmp(spec, "digits")) {
        rc = load_digits(data_dir, train, test);
    } else if (stat(spec, &st) == 0 && S_ISDIR(st.st_mode)) {
        rc = load_idx_dir(spec, 0, train, test);
    } else if (ends_with(spec, ".csv") || ends_with(spec, ".csv.gz")) {
        rc = load_csv_split(spec, 0, 0, train, test);
    } else {
        rc = qr__fail(QR_EINVAL, "dataset '%s': not fashion-mnist, digits, a directory of IDX "
                      "files or a .csv/.csv.gz file", spec);
    }
    if (!rc && (train->n == 0 || test->n == 0)) rc = qr__fail(QR_EINVAL, "dataset '%s' is empty", spec);
    if (rc) {
        qr_dataset_free(train);
        qr_dataset_free(test);
    }
    return rc;
}

/*
 * digits.c - the digits-style csv loader and the fixed train/test split.
 *
 * A digits csv (scikit-learn's copy of the UCI optdigits test set) has one
 * example per line: 64 pixel counts in 0..16, then the digit as an integer.
 * The whole file is read into memory and parsed in place; every field must
 * be a number, so a stray header line or a typo is an error with its line
 * and column rather than a silent zero.
 */
#include "model/data.h"

#include "common/common.h"
#include "model/readfile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DIGITS_MAX_PIXEL 16.0
#define DIGITS_MAX_LABEL 255

static int count_fields(const char *line) {
    int n = 1;
    for (const char *p = line; *p; p++) n += *p == ',';
    return n;
}

/* Parse the NUL-terminated field [s, ...) as a finite number, ignoring
 * surrounding blanks. */
static int parse_field(char *s, double *v) {
    while (*s == ' ' || *s == '\t') s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t')) *--end = '\0';
    if (!*s) return -1;
    char *stop;
    *v = strtod(s, &stop);
    return (*stop || !isfinite(*v)) ? -1 : 0;
}

/* Next line of the buffer: NUL-terminates it (dropping a '\r') and
 * advances *cursor past it. NULL at end of data. */
static char *next_line(char **cursor, char *end) {
    char *line = *cursor;
    if (line >= end) return NULL;
    char *nl = memchr(line, '\n', (size_t)(end - line));
    char *stop = nl ? nl : end;
    *cursor = nl ? nl + 1 : end;
    *stop = '\0';
    if (stop > line && stop[-1] == '\r') stop[-1] = '\0';
    return line;
}

static int blank(const char *s) {
    return s[strspn(s, " \t")] == '\0';
}

int qr_digits_load_csv(const char *path, int ncols, qr_dataset *out) {
    memset(out, 0, sizeof *out);
    char *buf;
    size_t len;
    int rc = qr_data_read_file(path, "digits file", &buf, &len);
    if (rc) return rc;

    /* Upper bound on examples: the number of lines. */
    int64_t max_rows = 1;
    for (size_t i = 0; i < len; i++) max_rows += buf[i] == '\n';

    char *cursor = buf, *end = buf + len, *line;
    long long lineno = 0;
    int64_t n = 0, dim = 0;
    int maxlabel = -1;
    float *x = NULL;
    int32_t *y = NULL;
    while ((line = next_line(&cursor, end))) {
        lineno++;
        if (blank(line)) continue;
        int cols = count_fields(line);
        if (!x) {
            if (ncols == 0) ncols = cols;
            if (ncols < 2) {
                rc = qr__fail(QR_EINVAL, "digits file %s: line %lld has %d column, need pixels "
                              "and a label", path, lineno, cols);
                goto fail;
            }
            dim = ncols - 1;
            x = malloc((size_t)(max_rows * dim) * sizeof(float));
            y = malloc((size_t)max_rows * sizeof(int32_t));
            if (!x || !y) {
                rc = qr__fail(QR_ENOMEM, "digits file %s: out of memory for %lld rows", path,
                              (long long)max_rows);
                goto fail;
            }
        }
        if (cols != ncols) {
            rc = qr__fail(QR_ESHAPE, "digits file %s: line %lld has %d columns, expected %d",
                          path, lineno, cols, ncols);
            goto fail;
        }
        char *field = line;
        for (int c = 0; c < ncols; c++) {
            char *comma = strchr(field, ',');
            if (comma) *comma = '\0';
            double v;
            if (parse_field(field, &v)) {
                rc = qr__fail(QR_EINVAL, "digits file %s: line %lld column %d: '%.40s' is not a "
                              "number", path, lineno, c + 1, field);
                goto fail;
            }
            if (c < ncols - 1) {
                if (v < 0 || v > DIGITS_MAX_PIXEL) {
                    rc = qr__fail(QR_EINVAL, "digits file %s: line %lld column %d: pixel %g is "
                                  "outside [0, 16]", path, lineno, c + 1, v);
                    goto fail;
                }
                x[n * dim + c] = (float)(v / DIGITS_MAX_PIXEL);
            } else {
                if (v != floor(v) || v < 0 || v > DIGITS_MAX_LABEL) {
                    rc = qr__fail(QR_EINVAL, "digits file %s: line %lld: label %g is not an "
                                  "integer in [0, %d]", path, lineno, v, DIGITS_MAX_LABEL);
                    goto fail;
                }
                y[n] = (int32_t)v;
                maxlabel = QR_MAX(maxlabel, y[n]);
            }
            if (comma) field = comma + 1;
        }
        n++;
    }
    if (n == 0) {
        rc = qr__fail(QR_EINVAL, "digits file %s: no examples", path);
        goto fail;
    }
    free(buf);
    out->n = n;
    out->dim = dim;
    out->nclasses = maxlabel + 1;
    out->x = x;
    out->y = y;
    return QR_OK;
fail:
    free(buf);
    free(x);
    free(y);
    return rc;
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

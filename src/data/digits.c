/*
 * digits.c - the digits-style csv loader.
 *
 * A digits csv (scikit-learn's copy of the UCI optdigits test set) has one
 * example per line: 64 pixel counts in 0..16, then the digit as an integer.
 * The whole file is read into memory and parsed in place; every field must
 * be a number, so a stray header line or a typo is an error with its line
 * and column rather than a silent zero.
 */
#include "data/digits.h"

#include "common/common.h"
#include "data/readfile.h"

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

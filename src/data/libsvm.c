/*
 * libsvm.c - loader for the libsvm/svmlight text format into CSR arrays.
 *
 * Each line is "label idx:val idx:val ..." with 1-based, strictly
 * ascending feature indices; features not listed are zero. The file is
 * read whole, and the arrays are sized from a first count of lines and
 * ':' characters (upper bounds), so parsing never reallocates.
 */
#include "data/libsvm.h"

#include "common/common.h"
#include "data/readfile.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int is_blank(char c) {
    return c == ' ' || c == '\t' || c == '\r';
}

/* Length of the token at p (up to the next blank), capped for messages. */
static int token_len(const char *p) {
    int n = 0;
    while (p[n] && !is_blank(p[n]) && n < 40) n++;
    return n;
}

static char *skip_blanks(char *p) {
    while (is_blank(*p)) p++;
    return p;
}

void qr_sparse_dataset_free(qr_sparse_dataset *d) {
    if (!d) return;
    free(d->row_ptr);
    free(d->col);
    free(d->val);
    free(d->label);
    memset(d, 0, sizeof *d);
}

int qr_libsvm_load(const char *path, qr_sparse_dataset *out) {
    memset(out, 0, sizeof *out);
    char *buf;
    size_t len;
    int rc = qr_data_read_file(path, "libsvm file", &buf, &len);
    if (rc) return rc;

    int64_t max_rows = 1, max_nnz = 0;
    for (size_t i = 0; i < len; i++) {
        max_rows += buf[i] == '\n';
        max_nnz += buf[i] == ':';
    }
    qr_sparse_dataset d = {0};
    d.row_ptr = malloc((size_t)(max_rows + 1) * sizeof(int64_t));
    d.label = malloc((size_t)max_rows * sizeof(float));
    d.col = malloc((size_t)max_nnz * sizeof(int32_t) + 1);
    d.val = malloc((size_t)max_nnz * sizeof(float) + 1);
    if (!d.row_ptr || !d.label || !d.col || !d.val) {
        rc = qr__fail(QR_ENOMEM, "libsvm file %s: out of memory", path);
        goto fail;
    }
    d.row_ptr[0] = 0;

    long long lineno = 0;
    char *line = buf, *end = buf + len;
    while (line < end) {
        char *nl = memchr(line, '\n', (size_t)(end - line));
        char *next = nl ? nl + 1 : end;
        if (nl) *nl = '\0';
        lineno++;
        char *p = skip_blanks(line);
        line = next;
        if (!*p) continue; /* blank line */

        char *stop;
        double label = strtod(p, &stop);
        if (stop == p || !(is_blank(*stop) || !*stop) || !(fabs(label) <= FLT_MAX)) {
            rc = qr__fail(QR_EINVAL, "libsvm file %s: line %lld: label '%.*s' is not a finite "
                          "float32 number", path, lineno, token_len(p), p);
            goto fail;
        }
        p = skip_blanks(stop);
        long prev = 0;
        while (*p) {
            char *tok = p;
            errno = 0;
            long idx = strtol(p, &stop, 10);
            if (stop == p || *stop != ':') {
                rc = qr__fail(QR_EINVAL, "libsvm file %s: line %lld: '%.*s' is not idx:value",
                              path, lineno, token_len(tok), tok);
                goto fail;
            }
            if (errno || idx < 1 || idx > INT32_MAX) {
                rc = qr__fail(QR_EINVAL, "libsvm file %s: line %lld: feature index %.*s is out "
                              "of range (indices start at 1)", path, lineno,
                              (int)QR_MIN(stop - tok, 20), tok);
                goto fail;
            }
            if (idx <= prev) {
                rc = qr__fail(QR_EINVAL, "libsvm file %s: line %lld: feature index %ld after %ld; "
                              "indices must be strictly ascending", path, lineno, idx, prev);
                goto fail;
            }
            p = stop + 1;
            double v = strtod(p, &stop);
            if (stop == p || !(is_blank(*stop) || !*stop) || !(fabs(v) <= FLT_MAX)) {
                rc = qr__fail(QR_EINVAL, "libsvm file %s: line %lld: value of feature %ld "
                              "'%.*s' is not a finite float32 number", path, lineno, idx, token_len(p), p);
                goto fail;
            }
            d.col[d.nnz] = (int32_t)(idx - 1);
            d.val[d.nnz] = (float)v;
            d.nnz++;
            d.dim = QR_MAX(d.dim, (int64_t)idx);
            prev = idx;
            p = skip_blanks(stop);
        }
        d.label[d.n] = (float)label;
        d.n++;
        d.row_ptr[d.n] = d.nnz;
    }
    if (d.n == 0) {
        rc = qr__fail(QR_EINVAL, "libsvm file %s: no examples", path);
        goto fail;
    }
    free(buf);
    *out = d;
    return QR_OK;
fail:
    free(buf);
    qr_sparse_dataset_free(&d);
    return rc;
}

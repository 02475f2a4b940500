/*
 * ctr.c - the click-data loader (libffm text; libsvm through libsvm.c),
 * the train/test split of one file, AUC and log loss (ctr.h).
 */
#include "data/ctr.h"

#include "common/common.h"
#include "data/libsvm.h"
#include "data/readfile.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void qr_ctr_dataset_free(qr_ctr_dataset *d) {
    if (!d) return;
    free(d->row_ptr);
    free(d->field);
    free(d->id);
    free(d->val);
    free(d->label);
    memset(d, 0, sizeof *d);
}

static int alloc_set(qr_ctr_dataset *d, int64_t n, int64_t nnz) {
    d->row_ptr = calloc((size_t)n + 1, sizeof *d->row_ptr);
    d->field = malloc((size_t)QR_MAX(nnz, 1) * sizeof *d->field);
    d->id = malloc((size_t)QR_MAX(nnz, 1) * sizeof *d->id);
    d->val = malloc((size_t)QR_MAX(nnz, 1) * sizeof *d->val);
    d->label = malloc((size_t)QR_MAX(n, 1) * sizeof *d->label);
    if (!d->row_ptr || !d->field || !d->id || !d->val || !d->label) {
        qr_ctr_dataset_free(d);
        return qr__fail(QR_ENOMEM, "out of memory for %lld examples", (long long)n);
    }
    return QR_OK;
}

/* A label as written: 1, +1 or 1.0 are clicks; 0 and -1 are not. */
static int parse_label(const char *tok, float *out) {
    char *end;
    errno = 0;
    double v = strtod(tok, &end);
    if (end == tok || errno || (*end && *end != ' ' && *end != '\t')) return -1;
    if (v != 1 && v != 0 && v != -1) return -1;
    *out = v > 0 ? 1.0f : 0.0f;
    return (int)(end - tok);
}

/* libffm: parsed in place, the arrays sized from a first count. */
static int load_ffm(const char *path, char *text, qr_ctr_dataset *out) {
    int64_t lines = 0, colons = 0;
    for (const char *c = text; *c; c++) {
        lines += *c == '\n';
        colons += *c == ':';
    }
    lines++;
    int rc = alloc_set(out, lines, colons / 2 + 1);
    if (rc) return rc;
    int64_t n = 0, nnz = 0, line = 0;
    int maxfield = -1;
    for (char *p = text; *p;) {
        char *eol = strchr(p, '\n');
        if (eol) *eol = 0;
        line++;
        while (*p == ' ' || *p == '\t' || *p == '\r') p++;
        if (*p) {
            int used = parse_label(p, &out->label[n]);
            if (used < 0) {
                rc = qr__fail(QR_EINVAL, "%s:%lld: the label '%.20s' is not 0, 1 or -1", path,
                              (long long)line, p);
                break;
            }
            p += used;
            out->row_ptr[n] = nnz;
            for (;;) {
                while (*p == ' ' || *p == '\t' || *p == '\r') p++;
                if (!*p) break;
                char *end;
                errno = 0;
                long f = strtol(p, &end, 10);
                long long id = 0;
                double val = 0;
                bool ok = end != p && *end == ':' && f >= 0 && f < QR_CTR_MAX_FIELDS && !errno;
                if (ok) {
                    p = end + 1;
                    id = strtoll(p, &end, 10);
                    ok = end != p && *end == ':' && !errno;
                }
                if (ok) {
                    p = end + 1;
                    val = strtod(p, &end);
                    ok = end != p && !errno && isfinite(val) &&
                         (!*end || *end == ' ' || *end == '\t' || *end == '\r');
                }
                if (!ok) {
                    rc = qr__fail(QR_EINVAL, "%s:%lld: '%.30s' is not field:id:value (field "
                                  "0..%d, an int64 id, a finite value)", path, (long long)line,
                                  p, QR_CTR_MAX_FIELDS - 1);
                    break;
                }
                p = end;
                out->field[nnz] = (int32_t)f;
                out->id[nnz] = id;
                out->val[nnz] = (float)val;
                nnz++;
                if (f > maxfield) maxfield = (int)f;
            }
            if (rc) break;
            n++;
        }
        if (!eol) break;
        p = eol + 1;
    }
    if (rc) {
        qr_ctr_dataset_free(out);
        return rc;
    }
    out->row_ptr[n] = nnz;
    out->n = n;
    out->nnz = nnz;
    out->nfields = maxfield + 1;
    if (n == 0) {
        qr_ctr_dataset_free(out);
        return qr__fail(QR_EINVAL, "%s: no examples", path);
    }
    return QR_OK;
}

/* libsvm through its own loader: every feature field 0, id its index. */
static int load_svm(const char *path, qr_ctr_dataset *out) {
    qr_sparse_dataset s;
    int rc = qr_libsvm_load(path, &s);
    if (rc) return rc;
    rc = alloc_set(out, s.n, s.nnz);
    for (int64_t i = 0; !rc && i < s.n; i++) {
        if (s.label[i] != 1 && s.label[i] != 0 && s.label[i] != -1) {
            rc = qr__fail(QR_EINVAL, "%s: example %lld has label %g (1, 0 or -1 expected)",
                          path, (long long)i + 1, (double)s.label[i]);
            qr_ctr_dataset_free(out);
            break;
        }
        out->label[i] = s.label[i] > 0 ? 1.0f : 0.0f;
    }
    if (!rc) {
        memcpy(out->row_ptr, s.row_ptr, ((size_t)s.n + 1) * sizeof *s.row_ptr);
        for (int64_t k = 0; k < s.nnz; k++) {
            out->field[k] = 0;
            out->id[k] = (int64_t)s.col[k] + 1;
            out->val[k] = s.val[k];
        }
        out->n = s.n;
        out->nnz = s.nnz;
        out->nfields = 1;
    }
    qr_sparse_dataset_free(&s);
    return rc;
}

int qr_ctr_load_file(const char *path, qr_ctr_dataset *out) {
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    int rc = qr_data_read_file(path, "click data file", &text, &len);
    if (rc) return rc;
    /* The first feature token tells the format: two colons, libffm. */
    const char *tok = text;
    while (*tok && *tok != ' ' && *tok != '\t') tok++;
    while (*tok == ' ' || *tok == '\t') tok++;
    const char *colon = strchr(tok, ':');
    const char *end = tok + strcspn(tok, " \t\r\n");
    bool ffm = colon && colon < end && memchr(colon + 1, ':', (size_t)(end - colon - 1));
    if (ffm) rc = load_ffm(path, text, out);
    free(text);
    return ffm ? rc : load_svm(path, out);
}

/* Examples `pick[0..n)` of src into dst. */
static int take(const qr_ctr_dataset *src, const int64_t *pick, int64_t n, qr_ctr_dataset *dst) {
    int64_t nnz = 0;
    for (int64_t i = 0; i < n; i++) nnz += src->row_ptr[pick[i] + 1] - src->row_ptr[pick[i]];
    int rc = alloc_set(dst, n, nnz);
    if (rc) return rc;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t a = src->row_ptr[pick[i]], b = src->row_ptr[pick[i] + 1];
        dst->row_ptr[i] = at;
        memcpy(dst->field + at, src->field + a, (size_t)(b - a) * sizeof *dst->field);
        memcpy(dst->id + at, src->id + a, (size_t)(b - a) * sizeof *dst->id);
        memcpy(dst->val + at, src->val + a, (size_t)(b - a) * sizeof *dst->val);
        dst->label[i] = src->label[pick[i]];
        at += b - a;
    }
    dst->row_ptr[n] = at;
    dst->n = n;
    dst->nnz = at;
    dst->nfields = src->nfields;
    return QR_OK;
}

/* The first regular file in dir whose name begins with prefix. */
static int find_prefixed(const char *dir, const char *prefix, char *path, size_t size) {
    DIR *d = opendir(dir);
    if (!d) return qr__fail(QR_ENOTFOUND, "click data directory %s: %s", dir, strerror(errno));
    char best[1024] = "";
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix))) continue;
        char full[4096];
        struct stat st;
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        if (stat(full, &st) || !S_ISREG(st.st_mode)) continue;
        if (!best[0] || strcmp(e->d_name, best) < 0) snprintf(best, sizeof best, "%s", e->d_name);
    }
    closedir(d);
    if (!best[0])
        return qr__fail(QR_ENOTFOUND, "click data directory %s has no %s* file", dir, prefix);
    snprintf(path, size, "%s/%s", dir, best);
    return QR_OK;
}

int qr_ctr_load(const char *spec, qr_ctr_dataset *train, qr_ctr_dataset *test) {
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    struct stat st;
    if (stat(spec, &st)) return qr__fail(QR_ENOTFOUND, "click data %s: %s", spec, strerror(errno));
    int rc;
    if (S_ISDIR(st.st_mode)) {
        char tr[4200], te[4200];
        rc = find_prefixed(spec, "train", tr, sizeof tr);
        if (!rc) rc = find_prefixed(spec, "test", te, sizeof te);
        if (!rc) rc = qr_ctr_load_file(tr, train);
        if (!rc) rc = qr_ctr_load_file(te, test);
        if (!rc) test->nfields = train->nfields = QR_MAX(train->nfields, test->nfields);
    } else {
        qr_ctr_dataset all;
        rc = qr_ctr_load_file(spec, &all);
        if (rc) return rc;
        if (all.n < 5) {
            qr_ctr_dataset_free(&all);
            return qr__fail(QR_EINVAL, "click data %s: %lld examples are too few to split",
                            spec, (long long)all.n);
        }
        int64_t *perm = malloc((size_t)all.n * sizeof *perm);
        if (!perm) {
            qr_ctr_dataset_free(&all);
            return QR_ENOMEM;
        }
        qr_rng rng;
        qr_rng_seed(&rng, QR_CTR_SPLIT_SEED);
        for (int64_t i = 0; i < all.n; i++) perm[i] = i;
        for (int64_t i = all.n - 1; i > 0; i--) {
            int64_t j = (int64_t)qr_rng_below(&rng, (uint64_t)i + 1);
            int64_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        int64_t ntest = all.n / 5;
        rc = take(&all, perm, ntest, test);
        if (!rc) rc = take(&all, perm + ntest, all.n - ntest, train);
        free(perm);
        qr_ctr_dataset_free(&all);
    }
    if (rc) {
        qr_ctr_dataset_free(train);
        qr_ctr_dataset_free(test);
    }
    return rc;
}

/* ---- measures ----------------------------------------------------------- */

typedef struct scored {
    float score;
    float label;
} scored;

static int by_score(const void *a, const void *b) {
    float x = ((const scored *)a)->score, y = ((const scored *)b)->score;
    return (x > y) - (x < y);
}

double qr_auc(const float *score, const float *label, int64_t n) {
    scored *s = malloc((size_t)QR_MAX(n, 1) * sizeof *s);
    if (!s) return NAN;
    for (int64_t i = 0; i < n; i++) s[i] = (scored){score[i], label[i]};
    qsort(s, (size_t)n, sizeof *s, by_score);
    /* Mann-Whitney: the positives' rank sum, ties given their mean rank. */
    double rank_sum = 0, pos = 0;
    for (int64_t i = 0; i < n;) {
        int64_t j = i;
        while (j < n && s[j].score == s[i].score) j++;
        double mean_rank = (double)(i + 1 + j) / 2.0; /* ranks i+1 .. j */
        for (int64_t k = i; k < j; k++)
            if (s[k].label > 0.5f) {
                rank_sum += mean_rank;
                pos++;
            }
        i = j;
    }
    free(s);
    double neg = (double)n - pos;
    if (pos == 0 || neg == 0) return 0.5;
    return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg);
}

double qr_logloss(const float *p, const float *label, int64_t n) {
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        double q = fmin(fmax((double)p[i], 1e-7), 1 - 1e-7);
        sum -= label[i] > 0.5f ? log(q) : log(1 - q);
    }
    return n ? sum / (double)n : 0;
}

/*
 * ctr_gen.c - quorum gen-ctr: a seeded synthetic click data set shaped
 * like real ones (ctr.h, docs/EMBEDDINGS.md).
 *
 * Field f draws a rank r from a Zipf distribution, P(r) ~ r^-s, over a
 * vocabulary of V values (V from a million down to a hundred, s from 1.05
 * to 1.35, by field), and writes the feature (f, id) with id an affine
 * permutation of r within the field's block of ids (f * 10^7 + ...), so
 * frequent ids are not simply small numbers. The label of an example is
 * drawn from a hidden logistic model:
 *     logit = b + sum_f w(f, r_f),
 *     w(f, r) = sigma * z(seed, f, r) / (1 + r / 20),  z ~ N(0, 1)
 * whose weights shrink along the tail: a rare value says little (as in real
 * data, and as a learner can only learn about values it has seen). The
 * hidden model's own AUC on the test split, written to meta.json, is the
 * ceiling a learner is measured against.
 */
#include "data/ctr.h"

#include "common/common.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ID_BLOCK 10000000ll /* ids of field f are f * ID_BLOCK + [0, V) */
#define NVOCAB 7
static const int64_t vocab[NVOCAB] = {1000000, 300000, 100000, 30000, 10000, 1000, 100};
#define WEIGHT_SIGMA 0.6
#define BIAS (-1.3)

void qr_ctr_gen_default(qr_ctr_gen *g) {
    *g = (qr_ctr_gen){.rows = 200000, .fields = 26, .seed = 1, .test_fraction = 0.2};
}

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The hidden weight of rank r of field f. */
static double hidden_weight(uint64_t seed, int f, int64_t r) {
    qr_rng rng;
    qr_rng_seed(&rng, mix(seed ^ mix((uint64_t)f * 0x9e3779b97f4a7c15ull + (uint64_t)r)));
    return WEIGHT_SIGMA * qr_rng_normal(&rng) / (1.0 + (double)r / 20.0);
}

/* The Zipf CDF of one vocabulary: cdf[r - 1] = P(rank <= r). */
static double *zipf_cdf(int64_t v, double s) {
    double *cdf = malloc((size_t)v * sizeof *cdf);
    if (!cdf) return NULL;
    double sum = 0;
    for (int64_t r = 1; r <= v; r++) cdf[r - 1] = (sum += pow((double)r, -s));
    for (int64_t r = 0; r < v; r++) cdf[r] /= sum;
    return cdf;
}

static int64_t draw_rank(const double *cdf, int64_t v, qr_rng *rng) {
    double u = qr_rng_uniform(rng);
    int64_t lo = 0, hi = v - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (cdf[mid] < u) lo = mid + 1;
        else hi = mid;
    }
    return lo + 1;
}

static double sigmoid(double x) {
    return 1.0 / (1.0 + exp(-x));
}

int qr_ctr_generate(const char *dir, const qr_ctr_gen *g, double *hidden_auc) {
    if (g->rows < 10 || g->rows > (1ll << 32) || g->fields < 1 || g->fields > 100 ||
        !(g->test_fraction > 0 && g->test_fraction < 1))
        return qr__fail(QR_EINVAL, "gen-ctr: rows %lld (10..2^32), fields %d (1..100), test "
                        "fraction %g (0..1)", (long long)g->rows, g->fields, g->test_fraction);
    if (mkdir(dir, 0777) && errno != EEXIST)
        return qr__fail(QR_EIO, "gen-ctr: cannot create %s: %s", dir, strerror(errno));
    double *cdf[NVOCAB] = {0};
    int rc = QR_OK;
    for (int k = 0; k < NVOCAB && !rc; k++)
        if (!(cdf[k] = zipf_cdf(vocab[k], 1.05 + 0.05 * k))) rc = QR_ENOMEM;
    int64_t ntest = (int64_t)((double)g->rows * g->test_fraction);
    int64_t ntrain = g->rows - ntest;
    float *logit = malloc((size_t)QR_MAX(ntest, 1) * sizeof *logit);
    float *label = malloc((size_t)QR_MAX(ntest, 1) * sizeof *label);
    if (!logit || !label) rc = QR_ENOMEM;
    char path[2][4200];
    FILE *out[2] = {NULL, NULL};
    snprintf(path[0], sizeof path[0], "%s/train.ffm", dir);
    snprintf(path[1], sizeof path[1], "%s/test.ffm", dir);
    for (int i = 0; i < 2 && !rc; i++)
        if (!(out[i] = fopen(path[i], "w")))
            rc = qr__fail(QR_EIO, "gen-ctr: cannot write %s: %s", path[i], strerror(errno));
    qr_rng rng;
    qr_rng_seed(&rng, g->seed);
    int64_t clicks = 0;
    char line[64 * 100 + 16];
    for (int64_t i = 0; i < g->rows && !rc; i++) {
        double z = BIAS;
        int len = 0;
        int64_t ranks[100];
        for (int f = 0; f < g->fields; f++) {
            int k = f % NVOCAB;
            ranks[f] = draw_rank(cdf[k], vocab[k], &rng);
            z += hidden_weight(g->seed, f, ranks[f]);
        }
        int y = qr_rng_uniform(&rng) < sigmoid(z);
        clicks += y;
        len += snprintf(line + len, sizeof line - (size_t)len, "%d", y);
        for (int f = 0; f < g->fields; f++) {
            int64_t v = vocab[f % NVOCAB];
            int64_t id = (int64_t)f * ID_BLOCK + ((ranks[f] - 1) * 1000003 + 7919 * f) % v;
            len += snprintf(line + len, sizeof line - (size_t)len, " %d:%lld:1", f, (long long)id);
        }
        line[len++] = '\n';
        bool is_test = i >= ntrain;
        if (is_test) {
            logit[i - ntrain] = (float)z;
            label[i - ntrain] = (float)y;
        }
        if (fwrite(line, 1, (size_t)len, out[is_test]) != (size_t)len)
            rc = qr__fail(QR_EIO, "gen-ctr: writing %s: %s", path[is_test], strerror(errno));
    }
    for (int i = 0; i < 2; i++)
        if (out[i] && fclose(out[i]) && !rc)
            rc = qr__fail(QR_EIO, "gen-ctr: closing %s: %s", path[i], strerror(errno));
    double auc = rc ? 0 : qr_auc(logit, label, ntest);
    if (!rc) {
        char meta[4200];
        snprintf(meta, sizeof meta, "%s/meta.json", dir);
        FILE *m = fopen(meta, "w");
        if (!m) {
            rc = qr__fail(QR_EIO, "gen-ctr: cannot write %s: %s", meta, strerror(errno));
        } else {
            fprintf(m, "{\"rows\": %lld, \"train_rows\": %lld, \"test_rows\": %lld, "
                    "\"fields\": %d, \"seed\": %llu, \"click_rate\": %.6f, "
                    "\"hidden_auc\": %.6f, \"vocabularies\": [", (long long)g->rows,
                    (long long)ntrain, (long long)ntest, g->fields,
                    (unsigned long long)g->seed, (double)clicks / (double)g->rows, auc);
            for (int f = 0; f < g->fields; f++)
                fprintf(m, "%s%lld", f ? ", " : "", (long long)vocab[f % NVOCAB]);
            fprintf(m, "], \"zipf_exponents\": [");
            for (int f = 0; f < g->fields; f++)
                fprintf(m, "%s%.2f", f ? ", " : "", 1.05 + 0.05 * (f % NVOCAB));
            fprintf(m, "]}\n");
            if (fclose(m)) rc = qr__fail(QR_EIO, "gen-ctr: closing %s", meta);
        }
    }
    if (!rc && hidden_auc) *hidden_auc = auc;
    for (int k = 0; k < NVOCAB; k++) free(cdf[k]);
    free(logit);
    free(label);
    return rc;
}

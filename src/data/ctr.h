/*
 * ctr.h - click data: examples of categorical features and a 0/1 label,
 * the input of the click-prediction models (model/ctr.h), and the
 * measures they are judged by (AUC, log loss). docs/EMBEDDINGS.md.
 *
 * Text formats, gz or plain, one example per line:
 *   libffm  "label field:id:value field:id:value ..."  (field >= 0, any
 *           int64 id: a feature is (field, id), usually value 1)
 *   libsvm  "label index:value ..."  (read by libsvm.c; every feature is
 *           field 0 with id = its index)
 * A label is 1 or 0 (+1 and -1 read as 1 and 0).
 */
#ifndef QR_DATA_CTR_H
#define QR_DATA_CTR_H

#include <stdint.h>

typedef struct qr_ctr_dataset {
    int64_t n, nnz;
    int nfields;       /* one more than the largest field */
    int64_t *row_ptr;  /* n + 1: example i's features are [row_ptr[i], row_ptr[i+1]) */
    int32_t *field;    /* nnz */
    int64_t *id;       /* nnz */
    float *val;        /* nnz */
    float *label;      /* n: 0 or 1 */
} qr_ctr_dataset;

#define QR_CTR_MAX_FIELDS 1024

/* One file, either format (told apart by its first feature). */
int qr_ctr_load_file(const char *path, qr_ctr_dataset *out);
/* spec: a directory holding train and test files (the first names that
 * begin with "train" and "test", e.g. train.ffm and test.ffm, as
 * quorum gen-ctr writes), or one file, split with a fixed permutation
 * (seed QR_CTR_SPLIT_SEED): 20% test. */
int qr_ctr_load(const char *spec, qr_ctr_dataset *train, qr_ctr_dataset *test);
#define QR_CTR_SPLIT_SEED 0x6374727370ull /* "ctrsp" */
void qr_ctr_dataset_free(qr_ctr_dataset *d); /* NULL-safe */

/* Area under the ROC curve of scores against 0/1 labels (ties share
 * their ranks); 0.5 when one class is missing. */
double qr_auc(const float *score, const float *label, int64_t n);
/* Mean log loss of probabilities p (clipped to [1e-7, 1 - 1e-7]). */
double qr_logloss(const float *p, const float *label, int64_t n);

/* quorum gen-ctr: a seeded synthetic click set in dir (train.ffm,
 * test.ffm, meta.json): `fields` categorical fields whose ids follow Zipf
 * distributions over vocabularies up to a million values, labels drawn
 * from a hidden logistic model; *hidden_auc receives that model's own test
 * AUC (what a learner can hope to reach), also written to meta.json. */
typedef struct qr_ctr_gen {
    int64_t rows;      /* examples, train and test together */
    int fields;
    uint64_t seed;
    double test_fraction;
} qr_ctr_gen;
void qr_ctr_gen_default(qr_ctr_gen *g);
int qr_ctr_generate(const char *dir, const qr_ctr_gen *g, double *hidden_auc);

#endif /* QR_DATA_CTR_H */

/*
 * ctr.h - click-prediction models over categorical features
 * (docs/EMBEDDINGS.md): logistic regression, and wide & deep (Cheng et
 * al., 2016), each with its gradient.
 *
 *   logreg     z = bias + sum_k val_k * wide[id_k]
 *   wide-deep  z = bias + sum_k val_k * wide[id_k] + mlp(x),
 *              x = concat over fields f of sum_{k in f} val_k * emb[id_k]
 *              mlp: hidden layers with ReLU, then one linear output
 *   p = sigmoid(z), loss = mean log loss.
 *
 * "wide" (dim 1) and "embedding" (dim --embedding-dim) are embedding
 * tables on the ps; the rest are dense variables. Like model.h, a model
 * holds no parameters: the caller passes in the rows it pulled for the
 * batch's features, one row per feature in batch order (duplicates
 * included), and gets back one gradient row per feature, which
 * qr_worker_add_rows sums by id.
 */
#ifndef QR_MODEL_CTR_H
#define QR_MODEL_CTR_H

#include <stdint.h>

typedef struct qr_ctr_model qr_ctr_model;

/* A batch: n examples, example i's features [row_ptr[i], row_ptr[i+1])
 * (row_ptr[0] = 0), each a field and a value; labels 0/1 (NULL when only
 * predicting). */
typedef struct qr_ctr_batch {
    int n;
    const int64_t *row_ptr;
    const int32_t *field;
    const float *val;
    const float *label;
} qr_ctr_batch;

/* kind "logreg" or "wide-deep"; nfields, the data's; dim, the embedding
 * width; hidden, the MLP's hidden widths (wide-deep). */
int qr_ctr_model_create(qr_ctr_model **out, const char *kind, int nfields, int dim,
                        const int *hidden, int nhidden, int max_batch);
void qr_ctr_model_free(qr_ctr_model *m);

int qr_ctr_model_num_tables(const qr_ctr_model *m);
void qr_ctr_model_table_info(const qr_ctr_model *m, int j, const char **name, int *dim,
                             const char **init);
int qr_ctr_model_num_dense(const qr_ctr_model *m);
void qr_ctr_model_dense_info(const qr_ctr_model *m, int i, const char **name, int *ndim,
                             int64_t shape[2], const char **init);

/* Forward (and, if dense_grads is not NULL, backward) on a batch. rows[j]:
 * table j's row for each feature (nnz x dim_j); dense[i]: dense variable
 * i. Writes the mean loss (if label), the probabilities (prob, if not
 * NULL), dense_grads[i] and row_grads[j] (nnz x dim_j). */
int qr_ctr_model_run(qr_ctr_model *m, const qr_ctr_batch *b, const float *const *dense,
                     const float *const *rows, float *const *dense_grads,
                     float *const *row_grads, double *loss, float *prob);

#endif /* QR_MODEL_CTR_H */

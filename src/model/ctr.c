/*
 * ctr.c - logistic regression and wide & deep over embedding rows
 * (ctr.h), forward and backward, the MLP on OpenBLAS.
 *
 * Shapes (B examples, F fields, d the embedding width, L dense layers):
 *   x      B x F*d   x[i, f*d : f*d+d] = sum_{k of i in field f} val_k * e_k
 *   a_0 = x,  a_{l+1} = relu(a_l W_l + b_l)  (l < L-1),  out = a_{L-1} W + b
 *   z_i    = bias + sum_k val_k * w_k + out_i,   p_i = sigmoid(z_i)
 *   loss   = mean_i [ log(1 + e^z_i) - y_i z_i ]
 * Backward, dz_i = (p_i - y_i) / B:
 *   d bias = sum_i dz_i;  d w_k = dz_i val_k;  d out = dz
 *   d W_l = a_l^T da_{l+1};  d b_l = colsum da_{l+1};  da_l = da_{l+1} W_l^T,
 *   through relu: da_l *= (a_l > 0) for l >= 1
 *   d e_k = val_k * da_0[i, f_k*d : f_k*d+d]
 */
#include "model/ctr.h"

#include "common/common.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LAYERS 8

struct qr_ctr_model {
    bool deep;
    int nfields, dim, max_batch;
    int nlayers;               /* dense layers of the MLP (0 for logreg) */
    int width[MAX_LAYERS + 1]; /* width[0] = F*d, ..., width[nlayers] = 1 */
    float *act[MAX_LAYERS + 1]; /* a_l, B x width[l] */
    float *dact[MAX_LAYERS + 1];
    float *z;                  /* B */
    char names[2 * MAX_LAYERS][48];
};

int qr_ctr_model_create(qr_ctr_model **out, const char *kind, int nfields, int dim,
                        const int *hidden, int nhidden, int max_batch) {
    *out = NULL;
    bool deep;
    if (!strcmp(kind, "logreg")) deep = false;
    else if (!strcmp(kind, "wide-deep")) deep = true;
    else return qr__fail(QR_EINVAL, "click model '%s': logreg or wide-deep", kind);
    if (nfields < 1 || dim < 1 || dim > 1024 || max_batch < 1 || nhidden < 0 ||
        nhidden > MAX_LAYERS - 1 || (deep && nhidden < 1))
        return qr__fail(QR_EINVAL, "click model: %d fields, embedding dim %d (1..1024), %d "
                        "hidden layers (wide-deep: 1..%d)", nfields, dim, nhidden,
                        MAX_LAYERS - 1);
    qr_ctr_model *m = qr__calloc(1, sizeof *m);
    if (!m) return QR_ENOMEM;
    m->deep = deep;
    m->nfields = nfields;
    m->dim = dim;
    m->max_batch = max_batch;
    m->z = malloc((size_t)max_batch * sizeof *m->z);
    int rc = m->z ? QR_OK : QR_ENOMEM;
    if (deep) {
        m->nlayers = nhidden + 1;
        m->width[0] = nfields * dim;
        for (int l = 0; l < nhidden; l++) {
            if (hidden[l] < 1) rc = qr__fail(QR_EINVAL, "click model: hidden width %d", hidden[l]);
            m->width[l + 1] = hidden[l];
        }
        m->width[m->nlayers] = 1;
        for (int l = 0; l <= m->nlayers && !rc; l++) {
            size_t bytes = (size_t)max_batch * (size_t)m->width[l] * sizeof(float);
            m->act[l] = qr__aligned_alloc(bytes);
            m->dact[l] = qr__aligned_alloc(bytes);
            if (!m->act[l] || !m->dact[l]) rc = QR_ENOMEM;
        }
        for (int l = 0; l < m->nlayers; l++) {
            snprintf(m->names[2 * l], sizeof m->names[0], "deep/layer%d/weights", l);
            snprintf(m->names[2 * l + 1], sizeof m->names[0], "deep/layer%d/bias", l);
        }
    }
    if (rc) {
        qr_ctr_model_free(m);
        return rc;
    }
    *out = m;
    return QR_OK;
}

void qr_ctr_model_free(qr_ctr_model *m) {
    if (!m) return;
    for (int l = 0; l <= MAX_LAYERS; l++) {
        free(m->act[l]);
        free(m->dact[l]);
    }
    free(m->z);
    free(m);
}

int qr_ctr_model_num_tables(const qr_ctr_model *m) {
    return m->deep ? 2 : 1;
}

void qr_ctr_model_table_info(const qr_ctr_model *m, int j, const char **name, int *dim,
                             const char **init) {
    if (j == 0) {
        *name = "wide";
        *dim = 1;
        *init = "zeros";
    } else {
        *name = "embedding";
        *dim = m->dim;
        *init = "truncated_normal:0,0.05";
    }
}

int qr_ctr_model_num_dense(const qr_ctr_model *m) {
    return 1 + 2 * m->nlayers;
}

void qr_ctr_model_dense_info(const qr_ctr_model *m, int i, const char **name, int *ndim,
                             int64_t shape[2], const char **init) {
    if (i == 0) {
        *name = "bias";
        *ndim = 1;
        shape[0] = 1;
        shape[1] = 1;
        *init = "zeros";
        return;
    }
    int l = (i - 1) / 2;
    *name = m->names[i - 1];
    if ((i - 1) % 2 == 0) {
        *ndim = 2;
        shape[0] = m->width[l];
        shape[1] = m->width[l + 1];
        *init = "glorot_uniform";
    } else {
        *ndim = 1;
        shape[0] = m->width[l + 1];
        shape[1] = 1;
        *init = "zeros";
    }
}

/* The MLP's forward from act[0]: act[l+1] = relu(act[l] W + b), the last
 * layer linear. */
static void mlp_forward(qr_ctr_model *m, int B, const float *const *dense) {
    for (int l = 0; l < m->nlayers; l++) {
        int in = m->width[l], out = m->width[l + 1];
        const float *W = dense[1 + 2 * l], *b = dense[2 + 2 * l];
        float *a = m->act[l + 1];
        for (int i = 0; i < B; i++) memcpy(a + (size_t)i * out, b, (size_t)out * sizeof *a);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, out, in, 1.0f, m->act[l], in,
                    W, out, 1.0f, a, out);
        if (l + 1 < m->nlayers)
            for (size_t k = 0; k < (size_t)B * out; k++) a[k] = a[k] > 0 ? a[k] : 0;
    }
}

/* Backward from dact[nlayers] (= dz): the layers' gradients and dact[0]. */
static void mlp_backward(qr_ctr_model *m, int B, const float *const *dense, float *const *grads) {
    for (int l = m->nlayers - 1; l >= 0; l--) {
        int in = m->width[l], out = m->width[l + 1];
        const float *W = dense[1 + 2 * l];
        float *dW = grads[1 + 2 * l], *db = grads[2 + 2 * l];
        const float *da = m->dact[l + 1];
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, B, 1.0f, m->act[l], in,
                    da, out, 0.0f, dW, out);
        /* from the first row, not from a cleared buffer: one pass fewer */
        memcpy(db, da, (size_t)out * sizeof *db);
        for (int i = 1; i < B; i++)
            for (int j = 0; j < out; j++) db[j] += da[(size_t)i * out + j];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, in, out, 1.0f, da, out, W, out,
                    0.0f, m->dact[l], in);
        if (l > 0)
            for (size_t k = 0; k < (size_t)B * in; k++)
                if (m->act[l][k] <= 0) m->dact[l][k] = 0;
    }
}

int qr_ctr_model_run(qr_ctr_model *m, const qr_ctr_batch *b, const float *const *dense,
                     const float *const *rows, float *const *dense_grads,
                     float *const *row_grads, double *loss, float *prob) {
    int B = b->n;
    if (B < 1 || B > m->max_batch)
        return qr__fail(QR_EINVAL, "click model: batch of %d (1..%d)", B, m->max_batch);
    int d = m->dim, F = m->nfields;
    for (int64_t k = 0; k < b->row_ptr[B]; k++)
        if (b->field[k] < 0 || b->field[k] >= F)
            return qr__fail(QR_EINVAL, "click model: field %d, but the model has %d fields",
                            b->field[k], F);
    /* z = bias + wide; x = the fields' summed embeddings. */
    if (m->deep) memset(m->act[0], 0, (size_t)B * F * d * sizeof(float));
    for (int i = 0; i < B; i++) {
        double z = dense[0][0];
        float *x = m->deep ? m->act[0] + (size_t)i * F * d : NULL;
        for (int64_t k = b->row_ptr[i]; k < b->row_ptr[i + 1]; k++) {
            z += (double)b->val[k] * rows[0][k];
            if (!x) continue;
            const float *e = rows[1] + k * d;
            float *xf = x + (size_t)b->field[k] * d;
            for (int c = 0; c < d; c++) xf[c] += b->val[k] * e[c];
        }
        m->z[i] = (float)z;
    }
    if (m->deep) {
        mlp_forward(m, B, dense);
        for (int i = 0; i < B; i++) m->z[i] += m->act[m->nlayers][i];
    }
    double sum = 0;
    bool finite = true;
    for (int i = 0; i < B; i++) {
        float z = m->z[i];
        float p = 1.0f / (1.0f + expf(-z));
        if (prob) prob[i] = p;
        if (b->label) {
            float y = b->label[i];
            sum += fmaxf(z, 0) - y * z + log1pf(expf(-fabsf(z)));
        }
        finite &= isfinite(z);
        m->z[i] = p; /* kept for the backward */
    }
    if (loss) *loss = b->label ? sum / B : 0;
    if (!finite) return qr__fail(QR_ENONFINITE, "click model: a logit is not finite");
    if (!dense_grads) return QR_OK;
    if (!b->label) return qr__fail(QR_EINVAL, "click model: gradients need labels");
    /* dz = (p - y) / B */
    float dbias = 0;
    for (int i = 0; i < B; i++) {
        float dz = (m->z[i] - b->label[i]) / (float)B;
        m->z[i] = dz;
        dbias += dz;
        if (m->deep) m->dact[m->nlayers][i] = dz;
    }
    dense_grads[0][0] = dbias;
    if (m->deep) mlp_backward(m, B, dense, dense_grads);
    for (int i = 0; i < B; i++) {
        float dz = m->z[i];
        const float *dx = m->deep ? m->dact[0] + (size_t)i * F * d : NULL;
        for (int64_t k = b->row_ptr[i]; k < b->row_ptr[i + 1]; k++) {
            row_grads[0][k] = dz * b->val[k];
            if (!dx) continue;
            const float *dxf = dx + (size_t)b->field[k] * d;
            float *de = row_grads[1] + k * d;
            for (int c = 0; c < d; c++) de[c] = b->val[k] * dxf[c];
        }
    }
    return QR_OK;
}

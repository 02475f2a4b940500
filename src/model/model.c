/*
 * model.c - forward and backward passes of softmax regression and the MLP.
 *
 * Both are a stack of L dense layers: layer l maps (B, dims[l]) to
 * (B, dims[l+1]) as h W + b, followed by ReLU except after the last layer,
 * whose output is the logits (B, C). Softmax regression is the case L = 1.
 * The loss is the mean over the batch of -log softmax(logits)[y].
 *
 * Matmuls go to OpenBLAS sgemm. Shapes are written (rows, cols), row-major.
 */
#include "model/model.h"

#include "common/common.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL_MAX_LAYERS 64

struct qr_model {
    int nlayers;   /* L dense layers */
    int *dims;     /* (L+1) widths: dims[0] = input_dim, dims[L] = nclasses */
    int max_batch;
    char (*names)[32]; /* (2L) "layer<l>/weights", "layer<l>/bias" */
    float **act;   /* act[l]: (max_batch, dims[l+1]) layer l's output after ReLU;
                      act[L-1] is the logits */
    float *dz;     /* (max_batch, maxw) gradient w.r.t. a layer's pre-activation */
    float *dh;     /* (max_batch, maxw) gradient w.r.t. a layer's input */
};

void qr_model_free(qr_model *m) {
    if (!m) return;
    if (m->act)
        for (int l = 0; l < m->nlayers; l++) free(m->act[l]);
    free(m->act);
    free(m->dz);
    free(m->dh);
    free(m->names);
    free(m->dims);
    free(m);
}

int qr_model_create(qr_model **out, const char *kind, int64_t input_dim, const int *hidden,
                    int nhidden, int nclasses, int max_batch) {
    if (!out) return qr__fail(QR_EINVAL, "model: out is NULL");
    *out = NULL;
    int mlp;
    if (kind && !strcmp(kind, "softmax"))
        mlp = 0;
    else if (kind && !strcmp(kind, "mlp"))
        mlp = 1;
    else
        return qr__fail(QR_EINVAL, "model '%s': unknown kind; expected softmax or mlp",
                        kind ? kind : "(null)");
    if (input_dim < 1 || input_dim > INT_MAX)
        return qr__fail(QR_EINVAL, "model: input_dim %lld out of range", (long long)input_dim);
    if (nclasses < 2) return qr__fail(QR_EINVAL, "model: nclasses %d must be >= 2", nclasses);
    if (max_batch < 1) return qr__fail(QR_EINVAL, "model: max_batch %d must be >= 1", max_batch);
    if (mlp && (nhidden < 1 || nhidden >= MODEL_MAX_LAYERS || !hidden))
        return qr__fail(QR_EINVAL, "model mlp: needs 1 to %d hidden layer widths, got %d",
                        MODEL_MAX_LAYERS - 1, nhidden);
    int L = mlp ? nhidden + 1 : 1;
    for (int l = 0; mlp && l < nhidden; l++)
        if (hidden[l] < 1)
            return qr__fail(QR_EINVAL, "model mlp: hidden layer %d has width %d", l, hidden[l]);

    qr_model *m = qr__calloc(1, sizeof *m);
    if (!m) return QR_ENOMEM;
    m->nlayers = L;
    m->max_batch = max_batch;
    m->dims = qr__calloc((size_t)L + 1, sizeof *m->dims);
    m->names = qr__calloc(2 * (size_t)L, sizeof *m->names);
    m->act = qr__calloc((size_t)L, sizeof *m->act);
    if (!m->dims || !m->names || !m->act) goto oom;
    m->dims[0] = (int)input_dim;
    for (int l = 1; l < L; l++) m->dims[l] = hidden[l - 1];
    m->dims[L] = nclasses;
    int maxw = 0;
    for (int l = 0; l < L; l++) {
        snprintf(m->names[2 * l], sizeof m->names[0], "layer%d/weights", l);
        snprintf(m->names[2 * l + 1], sizeof m->names[0], "layer%d/bias", l);
        maxw = QR_MAX(maxw, m->dims[l + 1]);
        m->act[l] = qr__calloc((size_t)max_batch * (size_t)m->dims[l + 1], sizeof(float));
        if (!m->act[l]) goto oom;
    }
    /* dh holds the gradient w.r.t. a hidden layer's output, never the input. */
    m->dz = qr__calloc((size_t)max_batch * (size_t)maxw, sizeof(float));
    m->dh = qr__calloc((size_t)max_batch * (size_t)maxw, sizeof(float));
    if (!m->dz || !m->dh) goto oom;
    *out = m;
    return QR_OK;
oom:
    qr_model_free(m);
    return qr__fail(QR_ENOMEM, "model: out of memory for max_batch %d", max_batch);
}

int qr_model_num_params(const qr_model *m) {
    return m ? 2 * m->nlayers : 0;
}

void qr_model_param_info(const qr_model *m, int i, const char **name, int *ndim,
                         int64_t shape[2], const char **init) {
    int ok = m && i >= 0 && i < 2 * m->nlayers;
    int l = i / 2, is_bias = i % 2;
    if (name) *name = ok ? m->names[i] : NULL;
    if (ndim) *ndim = ok ? (is_bias ? 1 : 2) : 0;
    if (init) *init = ok ? (is_bias ? "zeros" : "glorot_uniform") : NULL;
    if (shape) {
        shape[0] = !ok ? 0 : is_bias ? m->dims[l + 1] : m->dims[l];
        shape[1] = !ok ? 0 : is_bias ? 1 : m->dims[l + 1];
    }
}

/* out (B, dout) = in (B, din) @ W (din, dout) + b (dout) */
static void dense_forward(float *out, const float *in, const float *W, const float *b, int B,
                          int din, int dout) {
    for (int i = 0; i < B; i++) memcpy(out + (size_t)i * dout, b, (size_t)dout * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, dout, din, 1.0f, in, din, W, dout,
                1.0f, out, dout);
}

/* db (dout) = the sum over the B rows of dz, starting from the first row
 * rather than from a cleared buffer (the same sums, one pass fewer). */
static void bias_grad(float *db, const float *dz, int B, int dout) {
    memcpy(db, dz, (size_t)dout * sizeof *db);
    for (int i = 1; i < B; i++)
        for (int j = 0; j < dout; j++) db[j] += dz[(size_t)i * dout + j];
}

/* Given dz (B, dout) = dloss/d(out): dW (din, dout) = in^T dz, db (dout) =
 * sum over rows of dz, and if din_grad: din_grad (B, din) = dz W^T. */
static void dense_backward(float *dW, float *db, float *din_grad, const float *dz,
                           const float *in, const float *W, int B, int din, int dout) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, din, dout, B, 1.0f, in, din, dz, dout,
                0.0f, dW, dout);
    bias_grad(db, dz, B, dout);
    if (din_grad)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, din, dout, 1.0f, dz, dout, W,
                    dout, 0.0f, din_grad, din);
}

/* h (B, D) = max(h, 0) in place. Written so a NaN passes through: a
 * diverged parameter must show up in the loss, not be zeroed away. */
static void relu_forward(float *h, size_t n) {
    for (size_t i = 0; i < n; i++) h[i] = h[i] < 0 ? 0 : h[i];
}

/* dh (B, D) *= (h > 0): h is the ReLU output, positive exactly where its input was. */
static void relu_backward(float *dh, const float *h, size_t n) {
    for (size_t i = 0; i < n; i++) dh[i] = h[i] > 0 ? dh[i] : 0;
}

/* Run every layer on x (B, dims[0]); the logits land in act[L-1] (B, C).
 * hooks (may be NULL): before_forward(l) before layer l reads its
 * parameters; its error ends the pass with it. */
static int model_forward(qr_model *m, const float *const *params, const float *x, int B,
                         const qr_model_hooks *hooks) {
    const float *in = x;
    for (int l = 0; l < m->nlayers; l++) {
        int din = m->dims[l], dout = m->dims[l + 1];
        int rc = hooks && hooks->before_forward ? hooks->before_forward(hooks->ctx, l) : QR_OK;
        if (rc) return rc;
        dense_forward(m->act[l], in, params[2 * l], params[2 * l + 1], B, din, dout);
        if (l < m->nlayers - 1) relu_forward(m->act[l], (size_t)B * dout);
        in = m->act[l];
    }
    return QR_OK;
}

/*
 * Softmax cross-entropy on logits (B, C) with labels y (B). Adds each row's
 * -log p[y] to *loss_sum and 1 per row whose argmax is y to *correct. If
 * dlogits: dlogits (B, C) = (softmax(logits) - onehot(y)) * scale.
 * Subtracting the row max keeps exp() from overflowing; sums are double.
 */
static void softmax_xent_forward(const float *logits, const int32_t *y, int B, int C,
                                 double *loss_sum, int64_t *correct, float *dlogits, float scale) {
    for (int i = 0; i < B; i++) {
        const float *z = logits + (size_t)i * C;
        int argmax = 0;
        for (int j = 1; j < C; j++)
            if (z[j] > z[argmax]) argmax = j;
        double zmax = z[argmax], sum = 0;
        for (int j = 0; j < C; j++) sum += exp((double)z[j] - zmax);
        double logsum = log(sum);
        *loss_sum += -((double)z[y[i]] - zmax - logsum);
        *correct += argmax == y[i];
        if (dlogits) {
            float *dz = dlogits + (size_t)i * C;
            for (int j = 0; j < C; j++) {
                double p = exp((double)z[j] - zmax - logsum);
                dz[j] = (float)((p - (j == y[i])) * scale);
            }
        }
    }
}

static int check_labels(const qr_model *m, const int32_t *y, int64_t n, const char *what) {
    int C = m->dims[m->nlayers];
    for (int64_t i = 0; i < n; i++)
        if (y[i] < 0 || y[i] >= C)
            return qr__fail(QR_EINVAL, "%s: label %d of example %lld is outside [0, %d)", what,
                            (int)y[i], (long long)i, C);
    return QR_OK;
}

int qr_model_num_layers(const qr_model *m) {
    return m ? m->nlayers : 0;
}

int qr_model_loss_grad(qr_model *m, const float *const *params, float *const *grads,
                       const float *x, const int32_t *y, int batch, double *loss) {
    return qr_model_loss_grad_hooked(m, params, grads, x, y, batch, loss, NULL);
}

int qr_model_loss_grad_hooked(qr_model *m, const float *const *params, float *const *grads,
                              const float *x, const int32_t *y, int batch, double *loss,
                              const qr_model_hooks *hooks) {
    if (!m || !params || !grads || !x || !y)
        return qr__fail(QR_EINVAL, "model loss_grad: NULL argument");
    if (batch < 1 || batch > m->max_batch)
        return qr__fail(QR_EINVAL, "model loss_grad: batch %d outside [1, max_batch %d]", batch,
                        m->max_batch);
    int rc = check_labels(m, y, batch, "model loss_grad");
    if (!rc) rc = model_forward(m, params, x, batch, hooks);
    if (rc) return rc;
    const int L = m->nlayers, B = batch, C = m->dims[L];
    double loss_sum = 0;
    int64_t correct = 0;
    softmax_xent_forward(m->act[L - 1], y, B, C, &loss_sum, &correct, m->dz, 1.0f / (float)B);
    double mean = loss_sum / B;
    if (loss) *loss = mean;
    /* A diverged step's gradients are still written, but no hook hands
     * them on (a training loop would push them before seeing the loss). */
    bool finite = isfinite(mean);

    /* Backward through the layers; dz is dloss/d(pre-activation) of layer l. */
    for (int l = L - 1; l >= 0; l--) {
        int din = m->dims[l], dout = m->dims[l + 1];
        const float *in = l > 0 ? m->act[l - 1] : x;
        float *dh = l > 0 ? m->dh : NULL;
        dense_backward(grads[2 * l], grads[2 * l + 1], dh, m->dz, in, params[2 * l], B, din,
                       dout);
        if (l > 0) {
            relu_backward(m->dh, m->act[l - 1], (size_t)B * din);
            float *t = m->dz;
            m->dz = m->dh;
            m->dh = t;
        }
        /* Layer l's gradients are final and its parameters no longer read. */
        if (finite && hooks && hooks->after_backward && (rc = hooks->after_backward(hooks->ctx, l)))
            return rc;
    }
    if (!finite)
        return qr__fail(QR_ENONFINITE, "model loss_grad: loss is %g (parameters diverged?)", mean);
    return QR_OK;
}

int qr_model_evaluate(qr_model *m, const float *const *params, const qr_dataset *d,
                      double *accuracy, double *loss) {
    if (!m || !params || !d || (d->n > 0 && (!d->x || !d->y)))
        return qr__fail(QR_EINVAL, "model evaluate: NULL argument");
    if (d->n < 1) return qr__fail(QR_EINVAL, "model evaluate: empty dataset");
    if (d->dim != m->dims[0])
        return qr__fail(QR_ESHAPE, "model evaluate: dataset has %lld features, model expects %d",
                        (long long)d->dim, m->dims[0]);
    int rc = check_labels(m, d->y, d->n, "model evaluate");
    if (rc) return rc;
    const int L = m->nlayers, C = m->dims[L];
    double loss_sum = 0;
    int64_t correct = 0;
    for (int64_t start = 0; start < d->n; start += m->max_batch) {
        int B = (int)QR_MIN((int64_t)m->max_batch, d->n - start);
        model_forward(m, params, d->x + start * d->dim, B, NULL);
        softmax_xent_forward(m->act[L - 1], d->y + start, B, C, &loss_sum, &correct, NULL, 0);
    }
    double mean = loss_sum / (double)d->n;
    if (accuracy) *accuracy = (double)correct / (double)d->n;
    if (loss) *loss = mean;
    if (!isfinite(mean))
        return qr__fail(QR_ENONFINITE, "model evaluate: loss is %g", mean);
    return QR_OK;
}

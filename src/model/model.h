/*
 * model.h - the models a worker trains: softmax regression and a
 * multi-layer perceptron, each with its loss gradient.
 *
 * A model holds no parameters: the worker owns them (its local copies of
 * the ps variables) and passes them in on every call, in the order and
 * shapes qr_model_param_info lists. The model owns only its scratch
 * buffers, allocated once for max_batch, so a training step never mallocs;
 * for the same reason one model must not be used by two threads at once.
 */
#ifndef QR_MODEL_MODEL_H
#define QR_MODEL_MODEL_H

#include <stdint.h>

#include "data/dataset.h"

typedef struct qr_model qr_model;

/* kind: "softmax" (softmax regression, no hidden layer) or "mlp" (hidden
 * layers with ReLU, then softmax cross-entropy). hidden: nhidden layer
 * widths (ignored for softmax; mlp requires nhidden >= 1). max_batch:
 * largest batch passed later. */
int qr_model_create(qr_model **out, const char *kind, int64_t input_dim, const int *hidden,
                    int nhidden, int nclasses, int max_batch);
void qr_model_free(qr_model *m);
int qr_model_num_params(const qr_model *m);

/* Parameter i (0 <= i < num_params): layer l has "layer<l>/weights", shape
 * (in, out), init "glorot_uniform", then "layer<l>/bias", shape (out), init
 * "zeros". ndim is 1 or 2; unused shape entries are set to 1. For an i out
 * of range *name and *init are NULL and *ndim is 0. */
void qr_model_param_info(const qr_model *m, int i, const char **name, int *ndim,
                         int64_t shape[2], const char **init);

/* Mean softmax-cross-entropy loss over the batch and its gradient w.r.t.
 * every parameter (mean over the batch). params[i] / grads[i] point to
 * parameter i's values / gradient output (prod(shape) floats each).
 * x: (batch, input_dim), y: (batch) with labels in [0, nclasses).
 * QR_ENONFINITE if the loss is not finite (grads are still written). */
int qr_model_loss_grad(qr_model *m, const float *const *params, float *const *grads,
                       const float *x, const int32_t *y, int batch, double *loss);

/* The layers of a loss_grad, for a training loop that overlaps its
 * communication with them (src/train/train.c): before_forward(ctx, l) is
 * called before layer l's forward reads its parameters (2l and 2l + 1:
 * wait for their values), in order 0..L-1; after_backward(ctx, l) once
 * layer l's backward has written their gradients and no longer reads the
 * parameters (send the gradients; new values may land in the parameters
 * from then on), in order L-1..0. Either may be NULL. A hook's error ends
 * the call with it. A step whose loss is not finite calls no
 * after_backward (nothing of it should be pushed). */
typedef struct qr_model_hooks {
    int (*before_forward)(void *ctx, int layer);
    int (*after_backward)(void *ctx, int layer);
    void *ctx;
} qr_model_hooks;

/* qr_model_loss_grad with hooks (NULL: none). */
int qr_model_loss_grad_hooked(qr_model *m, const float *const *params, float *const *grads,
                              const float *x, const int32_t *y, int batch, double *loss,
                              const qr_model_hooks *hooks);
/* L: the dense layers (parameters 2l, 2l + 1 are layer l's). */
int qr_model_num_layers(const qr_model *m);

/* Accuracy and mean loss over a whole dataset (evaluated in chunks of
 * max_batch). Either output may be NULL. */
int qr_model_evaluate(qr_model *m, const float *const *params, const qr_dataset *d,
                      double *accuracy, double *loss);

#endif /* QR_MODEL_MODEL_H */

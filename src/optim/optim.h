/*
 * optim.h - the optimizers a ps applies to its variables: SGD, Momentum
 * (+Nesterov), Adagrad, RMSProp (+centered), Adam, AdamAsync, FTRL-Proximal
 * and AdamW, each with a dense apply and a sparse (row-wise) apply.
 *
 * The formulas are those of the TensorFlow CPU kernels (training_ops.cc:
 * ApplyGradientDescent, ApplyMomentum, ApplyAdagrad, ApplyRMSProp,
 * ApplyCenteredRMSProp, ApplyAdam, ApplyFtrl) and of Alibaba DeepRec's
 * ApplyAdamAsync / SparseApplyAdamAsync, and AdamW's is torch.optim.AdamW's;
 * each optimizer's file quotes the formula it implements. "weight-decay"
 * is torch's weight_decay: L2 added to the gradient (g + wd * var) for all
 * but AdamW, whose decay is decoupled (var *= 1 - lr * wd); FTRL refuses a
 * non-zero one. Where TensorFlow versions differ the choice is
 * written in that file (Adagrad: TF1 without epsilon; RMSProp: TF1 slot
 * "rms" starts at 1; Adam sparse: lazy, like tf.contrib LazyAdamOptimizer).
 *
 * Objects:
 *   qr_optim        one configured optimizer, immutable after create, shared
 *                   by every variable of a ps. Applies to DIFFERENT
 *                   variables may run concurrently from several threads.
 *   qr_optim_slots  the optimizer state of one variable ("m", "v", ...).
 *                   Applies to the same variable must be serialised by the
 *                   caller (they update var and slots in place).
 *
 * Numbers: float32 tensors, hyper-parameters held as float like TF's
 * kernels (their scalars are T). Every call returns QR_OK or a negative
 * qr_status with a message in qr_last_error(); a failing call changes
 * nothing.
 */
#ifndef QR_OPTIM_H
#define QR_OPTIM_H

#include "common/common.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct qr_optim qr_optim;
typedef struct qr_optim_slots qr_optim_slots;

/* Create the optimizer named by cfg's "optimizer" key (cfg may be NULL:
 * SGD with lr 0.05). Reads lr, momentum, nesterov, beta1, beta2, epsilon,
 * decay, centered, initial-accumulator, l1, l2, lr-power,
 * apply-sparse-rmsprop, weight-decay and apply-threads; an unset
 * lr/epsilon/momentum takes the optimizer's TF default, an unset
 * weight-decay 0 (AdamW: 0.01, torch's). Refuses (QR_EINVAL, message
 * naming the option) values the algorithm cannot use, and an explicitly
 * set option the chosen optimizer does not use ("momentum" with sgd), so a
 * mistake is not silently ignored. apply-threads > 1 starts a small thread pool owned by *out. */
int qr_optim_create(qr_optim **out, const qr_config *cfg);
void qr_optim_free(qr_optim *opt);
/* The optimizer of one variable declared with its own options
 * ("optimizer=adagrad,lr=0.05"): a fresh configuration if the options name
 * an optimizer, else global's with the options on top (global may be NULL).
 * Refuses keys that are not optimizer options. */
int qr_optim_create_for_var(qr_optim **out, const qr_config *global, const char *options);
/* Option "trainable" of a variable's options: *trainable false for
 * "trainable=false" (its pushes carry values, assigned with no optimizer),
 * true if it is "true" or absent; QR_EINVAL for any other value. With
 * trainable=false, qr_optim_create_for_var refuses every optimizer setting. */
int qr_var_options_trainable(const char *options, bool *trainable);
/* The optimizer's name: "sgd", "momentum", "adagrad", "rmsprop", "adam",
 * "adam_async", "ftrl" or "adamw". */
const char *qr_optim_name(const qr_optim *opt);
/* The optimizers there are, in a fixed order: qr_optim_name_at(i) for
 * i < qr_optim_count() (NULL past the end). The option table's choices for
 * "optimizer" are these names, in this order. */
int qr_optim_count(void);
const char *qr_optim_name_at(int i);
/* TensorFlow's class name for an optimizer ("adam" -> "Adam", "adam_async"
 * -> "AdamAsync", "sgd" -> "GradientDescent"), which a TF checkpoint gives
 * the slot variables ("layer0/weights/Adam", "layer0/weights/Adam_1");
 * NULL for a name that is no optimizer. The slot names themselves are the
 * created optimizer's: qr_optim_slot, qr_optim_row_slot_info. */
const char *qr_optim_tf_name(const char *name);
/* The optimizer's learning rate (the default when cfg had none). */
float qr_optim_lr(const qr_optim *opt);
/* Its weight decay (0: none). A plain SGD step without it is what a ps
 * may compute on arrival (qr_optim_sgd_into_grad). */
float qr_optim_weight_decay(const qr_optim *opt);
/* TensorFlow's exponential_decay: lr * rate^(step / steps), the exponent
 * rounded down to an integer when staircase. step is the number of steps
 * already applied (0 for the first). steps <= 0 leaves lr unchanged. */
float qr_optim_decayed_lr(float lr, int64_t step, double rate, int64_t steps, bool staircase);

/*
 * Slots for a dense variable of rows*dim elements, viewed as (rows, dim)
 * for sparse applies (a 1-D variable of n elements may use rows = n,
 * dim = 1, or rows = 1, dim = n if it is only applied densely).
 * Slots start at TF's initial values (Adagrad/FTRL accumulator: the
 * initial-accumulator option; RMSProp "rms": 1; AdamAsync powers: beta1 and
 * beta2; everything else 0). rows == 0 creates only the per-variable scalar
 * slots, for a variable whose rows live elsewhere (qr_optim_apply_rows).
 */
int qr_optim_slots_create(const qr_optim *opt, int64_t rows, int64_t dim,
                          qr_optim_slots **out);
void qr_optim_slots_free(qr_optim_slots *s);
/* A copy of s with its own storage (a checkpoint keeps the original while
 * applies go on in the copy). */
int qr_optim_slots_clone(const qr_optim_slots *s, qr_optim_slots **out);

/* Slot inspection, for checkpoints: slots 0..count-1 in a fixed order; the
 * per-row slots first, then the per-variable scalar slots. name is TF's
 * slot name ("m", "v", "beta1_power", "accum", "linear", "rms", "momentum",
 * "mg", "accumulator"); data may be written (restore) between applies. */
int qr_optim_slots_count(const qr_optim_slots *s);
int qr_optim_slot(const qr_optim_slots *s, int i, const char **name,
                  float **data, int64_t *n);

/*
 * Dense apply: var[n] -= update(grad[n]) and the slots advance.
 * lr: the variable's learning rate, or < 0 for the optimizer's.
 * global_step: the ps's global step, >= 1 at the first apply; used only by
 * Adam and AdamW, whose bias-correction powers beta^t are shared by all
 * variables (TF's beta1_power/beta2_power; torch's per-parameter "step").
 * AdamAsync ignores it and uses the variable's own power slots instead. n must equal the slots' rows*dim.
 * Large tensors are split across the optimizer's thread pool.
 */
int qr_optim_apply_dense(const qr_optim *opt, qr_optim_slots *s, float *var,
                         const float *grad, int64_t n, float lr,
                         int64_t global_step);

/*
 * Out-of-place dense apply, for an optimizer that keeps no slots (SGD):
 *     out[n] = var[n] - update(grad[n]),  var unchanged.
 * Bit-identical to qr_optim_apply_dense on the same inputs. A ps uses it
 * to write the next value of a variable that a pull reply is still
 * reading into a second tensor, instead of copying the tensor and then
 * updating the copy. QR_EINVAL for an optimizer with slots (see
 * qr_optim_stateless). out must not overlap var or grad.
 */
bool qr_optim_stateless(const qr_optim *opt);
int qr_optim_apply_dense_to(const qr_optim *opt, float *out, const float *var,
                            const float *grad, int64_t n, float lr);

/*
 * Sparse apply on a dense (rows, dim) variable: grad is (nidx, dim), row i
 * of grad belongs to row indices[i] of var. Duplicate indices are summed
 * first (in the order they appear); only the touched rows of var and of the
 * slots change. nidx == 0 changes nothing at all (AdamAsync powers
 * included). An out-of-range index is QR_EINVAL and nothing changes.
 */
int qr_optim_apply_sparse(const qr_optim *opt, qr_optim_slots *s, float *var,
                          int64_t rows, int64_t dim, const int64_t *indices,
                          const float *grad, int64_t nidx, float lr,
                          int64_t global_step);

/*
 * Row-wise core, for a variable whose rows are not contiguous (a future
 * hash-table embedding): nrows DISTINCT rows, var_rows[k] the k-th row of
 * the variable (dim floats), slot_rows[j * nrows + k] its row of per-row
 * slot j (j < qr_optim_row_slots(opt)), grad_rows[k] its gradient, already
 * summed over duplicates. s holds the per-variable scalar slots (create it
 * with rows = 0). Same semantics as a sparse apply of those rows.
 */
int qr_optim_apply_rows(const qr_optim *opt, qr_optim_slots *s,
                        float *const *var_rows, float *const *slot_rows,
                        const float *const *grad_rows, int64_t nrows,
                        int64_t dim, float lr, int64_t global_step);
/* Number of per-row slots, and slot j's name and initial value. */
int qr_optim_row_slots(const qr_optim *opt);
int qr_optim_row_slot_info(const qr_optim *opt, int j, const char **name,
                           float *init);

/* True if every x[i] is finite (no NaN, no +-Inf). One vectorised pass,
 * stopping at the first bad block; the ps runs it on each piece of a
 * gradient as the piece arrives, while it is still in cache. */
bool qr_optim_all_finite(const float *x, int64_t n);

/* SGD written into the gradient's buffer: g[i] = var[i] - g[i] * lr,
 * bit-identical to an in-place SGD apply (lr = -1: var + g, a delta).
 * Returns whether every result is finite (false for a NaN or Inf in g or
 * an overflow). g and var must not overlap. */
bool qr_optim_sgd_into_grad(float *g, const float *var, int64_t n, float lr);

/* One plain SGD step in place: var[i] -= grad[i] * lr, the very loop of an
 * SGD apply (bit-identical to qr_optim_apply_dense with optimizer sgd and
 * this lr), without an optimizer object. A local-SGD worker trains its
 * copy of the weights with it. var and grad must not overlap. */
void qr_optim_sgd_step(float *var, const float *grad, int64_t n, float lr);

/* out[i] = now[i] - before[i]: the delta a local-SGD worker pushes
 * (w_local - w_pulled). out must not overlap now or before. */
void qr_optim_delta(float *out, const float *now, const float *before, int64_t n);

/* Add a delta (a QR_PUSH_DELTA push): out[i] = w[i] + delta[i], exactly the
 * float sum, no optimizer, no learning rate. out may be w (in place);
 * otherwise none of the three may overlap. */
void qr_optim_add_delta(float *out, const float *w, const float *delta, int64_t n);

/* The row-wise delta of a (rows, dim) variable: row k of delta (nidx rows
 * of dim floats) is added to row indices[k] of var, in the order given, so
 * a duplicated index gets both rows (first the earlier one). An index
 * outside [0, rows) is QR_EINVAL and nothing changes. */
int qr_optim_add_delta_rows(float *var, int64_t rows, int64_t dim, const int64_t *indices,
                            const float *delta, int64_t nidx);

/* dst = (srcs[0] + ... + srcs[k-1]) / divisor, summed in exactly that
 * order (dst may be srcs[0]). The reduction of a synchronous step. */
void qr_optim_reduce(float *dst, const float *const *srcs, int k, int64_t n, float divisor);

/*
 * A synchronous step's reduce and dense apply in one pass over the
 * gradients: bit-identical to
 *     qr_optim_reduce(g, grads, k, n, divisor);
 *     qr_optim_apply_dense(opt, s, var, g, n, lr, global_step);
 * but the sum is made a cache-sized block at a time and handed to the
 * optimizer while it is in L1, never written out: grads are only read.
 * k >= 1 gradients of n floats, none overlapping var or the slots;
 * divisor a finite number > 0. Refuses what qr_optim_apply_dense refuses,
 * changing nothing.
 */
int qr_optim_reduce_apply_dense(const qr_optim *opt, qr_optim_slots *s, float *var,
                                const float *const *grads, int k, int64_t n, float divisor,
                                float lr, int64_t global_step);

#endif /* QR_OPTIM_H */

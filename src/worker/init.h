/*
 * init.h - variable initializers, named by the spec strings of quorum.h:
 * "zeros", "constant:C", "uniform:LO,HI", "normal:MEAN,STD",
 * "truncated_normal:MEAN,STD", "glorot_uniform".
 *
 * The worker that creates a variable fills it with qr_init_fill from the
 * variable's seed, so the same seed gives the same values on any machine.
 * They live in worker/ because the worker is what fills initial values;
 * the local trainer (train/, above the worker) fills its parameters with
 * the same functions, so both runs start from the same values.
 */
#ifndef QR_WORKER_INIT_H
#define QR_WORKER_INIT_H

#include <stdint.h>

/* Check that spec is well formed: a known name, numbers where expected,
 * LO < HI, STD >= 0. QR_EINVAL with a message naming the spec otherwise. */
int qr_init_validate(const char *spec);

/*
 * Fill n floats according to spec, deterministically from seed.
 *   uniform:LO,HI      values in [LO, HI)
 *   normal:MEAN,STD    Gaussian
 *   truncated_normal   Gaussian with draws beyond 2 std redrawn (as TensorFlow)
 *   glorot_uniform     uniform in +-sqrt(6 / (fan_in + fan_out)) with
 *                      fan_in = shape[0], fan_out = shape[1] for 2-D; for 1-D
 *                      fan_in = fan_out = shape[0]; for more dims, TensorFlow's
 *                      rule (receptive field = product of all but the last two,
 *                      fan_in = shape[-2] * rf, fan_out = shape[-1] * rf).
 * shape may be NULL only when ndim is 0 (a scalar; glorot then uses fans of
 * 1). Otherwise n must equal the product of shape[0..ndim) (QR_ESHAPE).
 */
int qr_init_fill(float *dst, int64_t n, int ndim, const int64_t *shape, const char *spec,
                 uint64_t seed);

#endif /* QR_WORKER_INIT_H */

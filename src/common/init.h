/*
 * init.h - variable initializers, named by the spec strings of quorum.h:
 * "zeros", "constant:C", "uniform:LO,HI", "normal:MEAN,STD",
 * "truncated_normal:MEAN,STD", "glorot_uniform".
 *
 * The worker that creates a dense variable fills it with qr_init_fill from
 * the variable's seed, so the same seed gives the same values on any
 * machine; the local trainer fills its parameters with the same function.
 * An embedding table's rows are made on the ps that holds them, each from
 * the seed and its own id (qr_init_row), which is why this sits in common/
 * where both the worker and the ps reach it.
 */
#ifndef QR_COMMON_INIT_H
#define QR_COMMON_INIT_H

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

/* A parsed spec, for filling many rows without parsing it each time. */
typedef struct qr_init_spec {
    int kind;
    double a, b;
} qr_init_spec;
int qr_init_parse(const char *spec, qr_init_spec *out);

/* One row of an embedding table: dim floats drawn from a generator seeded
 * by (seed, id) alone, so a row's first value is the same whichever ps
 * shard creates it and in whatever order. glorot_uniform uses fans of dim
 * (the row seen as a 1-D variable). */
void qr_init_row(const qr_init_spec *s, uint64_t seed, int64_t id, float *row, int64_t dim);

#endif /* QR_COMMON_INIT_H */

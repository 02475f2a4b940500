/*
 * init.c - parse an initializer spec and fill a buffer from a seeded rng.
 *
 * All draws go through qr_rng (xoshiro256**), and each value is computed
 * in double and rounded once, so a seed names the same floats everywhere.
 */
#include "common/init.h"

#include "common/common.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum init_kind { INIT_ZEROS, INIT_CONSTANT, INIT_UNIFORM, INIT_NORMAL, INIT_TRUNCATED, INIT_GLOROT };

/* qr_init_spec: kind is an init_kind; constant: a; uniform: lo, hi;
 * normal: mean, std. */
typedef qr_init_spec init_spec;

static const struct {
    const char *name;
    enum init_kind kind;
    int nargs;
    const char *usage;
} kinds[] = {
    {"zeros", INIT_ZEROS, 0, "zeros"},
    {"constant", INIT_CONSTANT, 1, "constant:C"},
    {"uniform", INIT_UNIFORM, 2, "uniform:LO,HI"},
    {"normal", INIT_NORMAL, 2, "normal:MEAN,STD"},
    {"truncated_normal", INIT_TRUNCATED, 2, "truncated_normal:MEAN,STD"},
    {"glorot_uniform", INIT_GLOROT, 0, "glorot_uniform"},
};

static int parse_spec(const char *spec, init_spec *out) {
    if (!spec || !*spec) return qr__fail(QR_EINVAL, "initializer: empty spec");
    const char *colon = strchr(spec, ':');
    size_t namelen = colon ? (size_t)(colon - spec) : strlen(spec);
    int k = -1;
    for (size_t i = 0; i < QR_ARRAY_LEN(kinds); i++)
        if (strlen(kinds[i].name) == namelen && !strncmp(spec, kinds[i].name, namelen)) k = (int)i;
    if (k < 0)
        return qr__fail(QR_EINVAL, "initializer '%s': unknown; expected zeros, constant:C, "
                        "uniform:LO,HI, normal:MEAN,STD, truncated_normal:MEAN,STD or "
                        "glorot_uniform", spec);
    out->kind = kinds[k].kind;
    out->a = out->b = 0;
    /* Split the arguments at ',' and parse each strictly. */
    double args[2];
    int nargs = 0;
    if (colon) {
        char buf[128];
        if (strlen(colon + 1) >= sizeof buf)
            return qr__fail(QR_EINVAL, "initializer '%.40s...': arguments too long", spec);
        strcpy(buf, colon + 1);
        char *tok = buf;
        for (;;) {
            char *comma = strchr(tok, ',');
            if (comma) *comma = '\0';
            while (*tok == ' ') tok++;
            for (char *e = tok + strlen(tok); e > tok && e[-1] == ' ';) *--e = '\0';
            if (nargs == 2 || qr__parse_float(tok, &args[nargs]))
                return qr__fail(QR_EINVAL, "initializer '%s': expected %s", spec,
                                kinds[k].usage);
            nargs++;
            if (!comma) break;
            tok = comma + 1;
        }
    }
    if (nargs != kinds[k].nargs)
        return qr__fail(QR_EINVAL, "initializer '%s': expected %s", spec, kinds[k].usage);
    if (nargs > 0) out->a = args[0];
    if (nargs > 1) out->b = args[1];
    if (out->kind == INIT_UNIFORM && !(out->a < out->b))
        return qr__fail(QR_EINVAL, "initializer '%s': LO must be less than HI", spec);
    if ((out->kind == INIT_NORMAL || out->kind == INIT_TRUNCATED) && out->b < 0)
        return qr__fail(QR_EINVAL, "initializer '%s': STD must not be negative", spec);
    return QR_OK;
}

int qr_init_validate(const char *spec) {
    init_spec s;
    return parse_spec(spec, &s);
}

int qr_init_parse(const char *spec, qr_init_spec *out) {
    return parse_spec(spec, out);
}

/* Uniform in [lo, hi): rounding to float can land on hi, so step back. */
static float uniform_value(qr_rng *rng, double lo, double hi) {
    float v = (float)(lo + (hi - lo) * qr_rng_uniform(rng));
    if (v >= (float)hi) v = nextafterf((float)hi, (float)lo);
    if (v < (float)lo) v = (float)lo;
    return v;
}

static void fill(const init_spec *sp, qr_rng *rng, float *dst, int64_t n, int ndim,
                 const int64_t *shape);

int qr_init_fill(float *dst, int64_t n, int ndim, const int64_t *shape, const char *spec,
                 uint64_t seed) {
    init_spec s;
    int rc = parse_spec(spec, &s);
    if (rc) return rc;
    if (n < 0 || (n > 0 && !dst)) return qr__fail(QR_EINVAL, "initializer '%s': bad buffer", spec);
    if (ndim < 0 || ndim > 8 || (ndim > 0 && !shape))
        return qr__fail(QR_EINVAL, "initializer '%s': bad shape (ndim %d)", spec, ndim);
    if (shape) {
        int64_t prod = 1;
        for (int i = 0; i < ndim; i++) {
            if (shape[i] < 0) return qr__fail(QR_ESHAPE, "initializer '%s': negative dimension", spec);
            prod *= shape[i];
        }
        if (ndim > 0 && prod != n)
            return qr__fail(QR_ESHAPE, "initializer '%s': %lld values for a shape of %lld",
                            spec, (long long)n, (long long)prod);
    }
    qr_rng rng;
    qr_rng_seed(&rng, seed);
    fill(&s, &rng, dst, n, ndim, shape);
    return QR_OK;
}

/* Draw n values of spec s from rng. */
static void fill(const init_spec *sp, qr_rng *rng, float *dst, int64_t n, int ndim,
                 const int64_t *shape) {
    init_spec s = *sp;
    switch (s.kind) {
    case INIT_ZEROS:
    case INIT_CONSTANT:
        for (int64_t i = 0; i < n; i++) dst[i] = (float)s.a;
        break;
    case INIT_UNIFORM:
        for (int64_t i = 0; i < n; i++) dst[i] = uniform_value(rng, s.a, s.b);
        break;
    case INIT_NORMAL:
        for (int64_t i = 0; i < n; i++) dst[i] = (float)(s.a + s.b * qr_rng_normal(rng));
        break;
    case INIT_TRUNCATED:
        for (int64_t i = 0; i < n; i++) {
            double z;
            do z = qr_rng_normal(rng);
            while (fabs(z) > 2.0);
            dst[i] = (float)(s.a + s.b * z);
        }
        break;
    case INIT_GLOROT: {
        double fan_in, fan_out;
        if (ndim == 0) {
            fan_in = fan_out = 1;
        } else if (ndim == 1) {
            fan_in = fan_out = (double)shape[0];
        } else {
            double rf = 1;
            for (int i = 0; i < ndim - 2; i++) rf *= (double)shape[i];
            fan_in = (double)shape[ndim - 2] * rf;
            fan_out = (double)shape[ndim - 1] * rf;
        }
        if (fan_in + fan_out <= 0) break; /* empty tensor: nothing to fill */
        double limit = sqrt(6.0 / (fan_in + fan_out));
        for (int64_t i = 0; i < n; i++) dst[i] = uniform_value(rng, -limit, limit);
        break;
    }
    }
}

void qr_init_row(const qr_init_spec *s, uint64_t seed, int64_t id, float *row, int64_t dim) {
    /* The id is mixed into the seed by the seeding itself (splitmix64 of
     * a combination), so neighbouring ids get unrelated streams. */
    qr_rng rng;
    qr_rng_seed(&rng, seed ^ ((uint64_t)id * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull));
    fill(s, &rng, row, dim, 1, &dim);
}

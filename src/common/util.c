/*
 * util.c - clocks, checked allocation, strict number parsing and the
 * seeded random generator (see common.h for why each exists). Logging is
 * in log.c.
 */
#include "common.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

uint64_t qr__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double qr__now_sec(void) {
    return (double)qr__now_ns() * 1e-9;
}

void *qr__calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) qr__fail(QR_ENOMEM, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *qr__aligned_alloc(size_t size) {
    size_t rounded = (size + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) {
        qr__fail(QR_ENOMEM, "out of memory allocating %zu bytes", size);
        return NULL;
    }
    memset(p, 0, rounded ? rounded : 64);
    return p;
}

void *qr__aligned_alloc_uninit(size_t size) {
    size_t rounded = (size + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) qr__fail(QR_ENOMEM, "out of memory allocating %zu bytes", size);
    return p;
}

char *qr__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = qr__calloc(1, n);
    if (p) memcpy(p, s, n);
    return p;
}

int qr__parse_int64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return qr__fail(QR_EINVAL, "expected an integer, got an empty string");
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s)
        return qr__fail(QR_EINVAL, "'%s' is not an integer", s);
    if (v < lo || v > hi)
        return qr__fail(QR_EINVAL, "%lld is out of range [%lld, %lld]", v,
                        (long long)lo, (long long)hi);
    *out = v;
    return QR_OK;
}

int qr__parse_float(const char *s, double *out) {
    if (!s || !*s) return qr__fail(QR_EINVAL, "expected a number, got an empty string");
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !isfinite(v))
        return qr__fail(QR_EINVAL, "'%s' is not a finite number", s);
    *out = v;
    return QR_OK;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void qr_rng_seed(qr_rng *rng, uint64_t seed) {
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t qr_rng_next(qr_rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double qr_rng_uniform(qr_rng *rng) {
    return (double)(qr_rng_next(rng) >> 11) * 0x1.0p-53;
}

double qr_rng_normal(qr_rng *rng) {
    /* Box-Muller; one value per call keeps the stream simple to reason about. */
    double u1 = qr_rng_uniform(rng);
    double u2 = qr_rng_uniform(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

uint64_t qr_rng_below(qr_rng *rng, uint64_t n) {
    /* Lemire's multiply-shift; the tiny bias is irrelevant for sampling. */
    return (uint64_t)(((__uint128_t)qr_rng_next(rng) * n) >> 64);
}

bool qr__list_has(const char *list, char sep, const char *item) {
    size_t n = strlen(item);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, sep);
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && !strncmp(p, item, n)) return true;
        if (!end) break;
        p = end + 1;
    }
    return false;
}

uint64_t qr__fnv1a(const void *data, size_t len, uint64_t h) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

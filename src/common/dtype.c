/*
 * dtype.c - conversions between float32 and the half-width wire types
 * (dtype.h). Bits are moved through memcpy, never through a cast pointer,
 * so the loops are free of aliasing questions and gcc still turns each
 * memcpy into a plain load and vectorizes the loop.
 */
#include "common/dtype.h"

#include <string.h>
#include <strings.h>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define QR_HAVE_F16C 1
#endif

size_t qr_dt_size(int dtype) {
    switch (dtype) {
    case QR_FLOAT32: return 4;
    case QR_BFLOAT16:
    case QR_FLOAT16: return 2;
    default: return 0;
    }
}

const char *qr_dt_name(int dtype) {
    switch (dtype) {
    case QR_FLOAT32: return "float32";
    case QR_BFLOAT16: return "bfloat16";
    case QR_FLOAT16: return "float16";
    default: return "?";
    }
}

int qr_dt_parse(const char *name) {
    static const struct { const char *name; int dtype; } names[] = {
        {"f32", QR_FLOAT32},   {"float32", QR_FLOAT32},  {"fp32", QR_FLOAT32},
        {"bf16", QR_BFLOAT16}, {"bfloat16", QR_BFLOAT16},
        {"f16", QR_FLOAT16},   {"fp16", QR_FLOAT16},     {"float16", QR_FLOAT16},
        {"half", QR_FLOAT16},
    };
    for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
        if (!strcasecmp(name, names[i].name)) return names[i].dtype;
    return -1;
}

uint64_t qr_dt_wire_bytes(int dtype, uint64_t n) {
    uint64_t bytes = n * qr_dt_size(dtype);
    return (bytes + 3) & ~(uint64_t)3;
}

/* c ? a : b as masks, so that gcc sees no branch in a loop's body (a
 * ternary of computed values can still become a jump, which stops the
 * vectorizer). */
static inline uint32_t pick(bool c, uint32_t a, uint32_t b) {
    uint32_t m = 0u - (uint32_t)c;
    return (a & m) | (b & ~m);
}

static inline uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- bfloat16: the top half of a float32 ------------------------------- */

void qr_f32_to_bf16(uint16_t *restrict dst, const float *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u = bits_of(src[i]);
        /* Round to nearest even: add 0x7fff and the lowest kept bit; a
         * carry out of the mantissa raises the exponent, up to inf. */
        uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        /* A NaN is not rounded (it could carry into inf): kept, made quiet. */
        uint32_t nan = (u >> 16) | 0x40u;
        dst[i] = (uint16_t)pick((u & 0x7fffffffu) > 0x7f800000u, nan, rounded);
    }
}

void qr_bf16_to_f32(float *restrict dst, const uint16_t *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = float_of((uint32_t)src[i] << 16);
}

/* ---- IEEE half ----------------------------------------------------------- */

/* One float32 to half, rounding to nearest even (after F. Giesen's
 * float_to_half_fast3_rtne): every case computed, one chosen. */
static inline uint16_t f32_to_f16_one(float x) {
    const uint32_t f32_inf = 255u << 23;
    const uint32_t f16_overflow = (127u + 16u) << 23;        /* 65536.0f */
    const uint32_t smallest_normal = 113u << 23;             /* 2^-14 */
    const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23; /* 0.5f */
    uint32_t u = bits_of(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    /* subnormal half (and zero): the float adder rounds the bits into
     * place (ties to even, the default rounding mode) */
    uint32_t sub = bits_of(float_of(a) + float_of(denorm_magic)) - denorm_magic;
    /* normal half: rebias the exponent, round the 13 bits dropped */
    uint32_t norm = (a + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    /* NaN: quiet, the top of its payload kept; too large: inf */
    uint32_t big = pick(a > f32_inf, 0x7e00u | ((a >> 13) & 0x3ffu), 0x7c00u);
    uint32_t h = pick(a >= f16_overflow, big, pick(a < smallest_normal, sub, norm));
    return (uint16_t)(h | sign);
}

/* One half to float32 (exact): rebias; inf and NaN get float32's top
 * exponent; a subnormal is renormalized by a float subtraction. */
static inline float f16_to_f32_one(uint16_t h) {
    uint32_t em = ((uint32_t)h & 0x7fffu) << 13;
    uint32_t exp = em & 0x0f800000u;
    uint32_t norm = em + (112u << 23);
    uint32_t special = norm + (112u << 23);
    uint32_t sub = bits_of(float_of(em + (113u << 23)) - float_of(113u << 23));
    uint32_t o = pick(exp == 0x0f800000u, special, pick(exp == 0, sub, norm));
    return float_of(o | (((uint32_t)h & 0x8000u) << 16));
}

void qr_f32_to_f16(uint16_t *restrict dst, const float *restrict src, size_t n) {
    size_t i = 0;
#ifdef QR_HAVE_F16C
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) dst[i] = f32_to_f16_one(src[i]);
}

void qr_f16_to_f32(float *restrict dst, const uint16_t *restrict src, size_t n) {
    size_t i = 0;
#ifdef QR_HAVE_F16C
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = f16_to_f32_one(src[i]);
}

/* ---- any dtype ----------------------------------------------------------- */

void qr_dt_to_f32(int dtype, float *dst, const void *src, size_t n) {
    switch (dtype) {
    case QR_BFLOAT16: qr_bf16_to_f32(dst, src, n); break;
    case QR_FLOAT16: qr_f16_to_f32(dst, src, n); break;
    default: memcpy(dst, src, n * sizeof(float)); break;
    }
}

void qr_dt_from_f32(int dtype, void *dst, const float *src, size_t n) {
    switch (dtype) {
    case QR_BFLOAT16: qr_f32_to_bf16(dst, src, n); break;
    case QR_FLOAT16: qr_f32_to_f16(dst, src, n); break;
    default: memcpy(dst, src, n * sizeof(float)); break;
    }
}

bool qr_dt_half_all_finite(int dtype, const uint16_t *src, size_t n) {
    /* Inf and NaN have every exponent bit set: 8 of bf16's, 5 of half's. */
    uint16_t exp = dtype == QR_BFLOAT16 ? 0x7f80u : 0x7c00u;
    unsigned bad = 0;
    for (size_t i = 0; i < n; i++) bad |= (src[i] & exp) == exp;
    return !bad;
}

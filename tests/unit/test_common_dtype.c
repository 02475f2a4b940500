/*
 * test_common_dtype.c - the float32 <-> bf16 / fp16 conversions of the
 * wire (common/dtype.h): widening checked on every one of the 65536 bit
 * patterns of each type against the value it denotes, computed here
 * another way; narrowing checked on the cases that decide rounding (ties
 * to even, carries into the exponent, half's subnormals and overflow,
 * NaN and inf) and on a round trip of every pattern. The loops run over
 * arrays of odd lengths, so the vectorized body and its tail both count.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The value half pattern h denotes, from its fields. */
static double f16_value(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
    double v = exp == 0 ? ldexp(mant, -24) : exp == 31 ? (mant ? NAN : INFINITY)
                                                        : ldexp(1024 + mant, exp - 25);
    return sign ? -v : v;
}

static uint16_t *all_patterns(void) {
    uint16_t *h = malloc(65536 * sizeof *h);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    return h;
}

static void widen_bf16_every_pattern(void **state) {
    uint16_t *h = all_patterns();
    float *f = malloc(65536 * sizeof *f);
    qr_bf16_to_f32(f, h, 65536);
    for (uint32_t i = 0; i < 65536; i++) assert_int_equal(bits(f[i]), i << 16);
    free(h);
    free(f);
}

static void widen_f16_every_pattern(void **state) {
    uint16_t *h = all_patterns();
    float *f = malloc(65536 * sizeof *f);
    qr_f16_to_f32(f, h, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        double want = f16_value((uint16_t)i);
        if (isnan(want)) {
            assert_true(isnan(f[i]));
            assert_int_equal(bits(f[i]) >> 31, i >> 15);              /* its sign */
            assert_int_equal((bits(f[i]) >> 13) & 1023, i & 1023);  /* its payload */
        } else {
            assert_true((double)f[i] == want);
            assert_int_equal(signbit(f[i]) != 0, (int)(i >> 15)); /* -0 too */
        }
    }
    free(h);
    free(f);
}

/* Narrowing the widened value of every pattern gives the pattern back
 * (a NaN stays a NaN, made quiet). */
static void round_trip_every_pattern(void **state) {
    uint16_t *h = all_patterns();
    float *f = malloc(65536 * sizeof *f);
    uint16_t *back = malloc(65536 * sizeof *back);
    for (int type = 0; type < 2; type++) {
        int dt = type ? QR_FLOAT16 : QR_BFLOAT16;
        qr_dt_to_f32(dt, f, h, 65536);
        qr_dt_from_f32(dt, back, f, 65536);
        uint16_t quiet = dt == QR_BFLOAT16 ? 0x40 : 0x200;
        uint16_t exp = dt == QR_BFLOAT16 ? 0x7f80 : 0x7c00;
        for (uint32_t i = 0; i < 65536; i++) {
            bool nan = (i & exp) == exp && (i & (exp ^ 0x7fff));
            assert_int_equal(back[i], nan ? (i | quiet) : i);
        }
    }
    free(h);
    free(f);
    free(back);
}

typedef struct narrow_case {
    uint32_t f32;
    uint16_t want;
} narrow_case;

static void narrow(int dt, const narrow_case *c, int n) {
    /* each case at a different place of a long array: body and tail */
    for (int at = 0; at < 37; at += 7) {
        float src[64];
        uint16_t dst[64];
        for (int k = 0; k < 64; k++) src[k] = 1.0f;
        for (int i = 0; i < n; i++) {
            src[at] = from_bits(c[i].f32);
            qr_dt_from_f32(dt, dst, src, (size_t)at + 1 + (size_t)i % 5);
            if (dst[at] != c[i].want)
                fail_msg("%s case %d: 0x%08x gave 0x%04x, want 0x%04x", qr_dt_name(dt), i,
                         c[i].f32, dst[at], c[i].want);
        }
    }
}

static void narrow_bf16_rounding(void **state) {
    static const narrow_case cases[] = {
        {0x3f800000, 0x3f80}, /* 1.0 */
        {0x3f808000, 0x3f80}, /* a tie, kept even */
        {0x3f818000, 0x3f82}, /* a tie, rounded up to even */
        {0x3f808001, 0x3f81}, /* above the tie */
        {0x3f807fff, 0x3f80}, /* below the tie */
        {0x7f7fffff, 0x7f80}, /* FLT_MAX rounds to inf */
        {0x7f7f7fff, 0x7f7f}, /* the largest that does not */
        {0xff800000, 0xff80}, /* -inf */
        {0x7f800001, 0x7fc0}, /* a signalling NaN stays a NaN, quiet */
        {0xffc12345, 0xffc1}, /* a NaN's sign and payload top */
        {0x00000001, 0x0000}, /* the smallest subnormal rounds to 0 */
        {0x80000000, 0x8000}, /* -0 */
        {0x007fffff, 0x0080}, /* a subnormal carries into the exponent */
    };
    narrow(QR_BFLOAT16, cases, (int)(sizeof cases / sizeof cases[0]));
}

static void narrow_f16_rounding(void **state) {
    static const narrow_case cases[] = {
        {0x3f800000, 0x3c00}, /* 1.0 */
        {0x3f801000, 0x3c00}, /* 1 + 2^-11: a tie, kept even */
        {0x3f803000, 0x3c02}, /* 1 + 3 * 2^-11: a tie, up to even */
        {0x3f801001, 0x3c01}, /* above the tie */
        {0x477fe000, 0x7bff}, /* 65504, the largest half */
        {0x477fefff, 0x7bff}, /* just below 65520 */
        {0x477ff000, 0x7c00}, /* 65520: the tie rounds to inf */
        {0x47800000, 0x7c00}, /* 65536 */
        {0x7f7fffff, 0x7c00}, /* FLT_MAX: overflow to inf */
        {0xc7800000, 0xfc00}, /* -65536: -inf */
        {0x7f800000, 0x7c00}, /* inf */
        {0x7f800001, 0x7e00}, /* a signalling NaN stays a NaN, quiet */
        {0xffc02000, 0xfe01}, /* a NaN's sign and payload top */
        {0x38800000, 0x0400}, /* 2^-14, the smallest normal */
        {0x33800000, 0x0001}, /* 2^-24, the smallest subnormal */
        {0x33000000, 0x0000}, /* 2^-25: a tie, to even (0) */
        {0x33000001, 0x0001}, /* just above it */
        {0x33c00000, 0x0002}, /* 1.5 * 2^-24: a tie, to even (2) */
        {0x387fe000, 0x0400}, /* 1023.5 * 2^-24: the tie carries to normal */
        {0x387fc000, 0x03ff}, /* 1023 * 2^-24, the largest subnormal */
        {0x80000000, 0x8000}, /* -0 */
        {0x00000001, 0x0000}, /* a float32 subnormal */
    };
    narrow(QR_FLOAT16, cases, (int)(sizeof cases / sizeof cases[0]));
}

static void half_finite_scan(void **state) {
    uint16_t h[33];
    for (int dt = QR_BFLOAT16; dt <= QR_FLOAT16; dt++) {
        for (int k = 0; k < 33; k++) h[k] = dt == QR_BFLOAT16 ? 0x3f80 : 0x3c00;
        assert_true(qr_dt_half_all_finite(dt, h, 33));
        uint16_t specials[] = {0x7f80, 0xff80, 0x7fc0, 0x7c00, 0xfc00, 0x7e00};
        for (size_t s = 0; s < sizeof specials / sizeof specials[0]; s++) {
            h[32] = specials[s];
            bool bad = dt == QR_BFLOAT16 ? (specials[s] & 0x7f80) == 0x7f80
                                         : (specials[s] & 0x7c00) == 0x7c00;
            assert_int_equal(qr_dt_half_all_finite(dt, h, 33), !bad);
            h[32] = h[0];
        }
    }
}

static void names_and_sizes(void **state) {
    assert_int_equal(qr_dt_parse("bf16"), QR_BFLOAT16);
    assert_int_equal(qr_dt_parse("BFloat16"), QR_BFLOAT16);
    assert_int_equal(qr_dt_parse("fp16"), QR_FLOAT16);
    assert_int_equal(qr_dt_parse("f32"), QR_FLOAT32);
    assert_int_equal(qr_dt_parse("int8"), -1);
    assert_int_equal(qr_dt_parse(NULL), -1);
    assert_int_equal(qr_dt_size(QR_FLOAT32), 4);
    assert_int_equal(qr_dt_size(QR_BFLOAT16), 2);
    assert_int_equal(qr_dt_size(7), 0);
    assert_int_equal(qr_dt_wire_bytes(QR_FLOAT32, 3), 12);
    assert_int_equal(qr_dt_wire_bytes(QR_BFLOAT16, 3), 8); /* padded to 4 */
    assert_int_equal(qr_dt_wire_bytes(QR_FLOAT16, 4), 8);
    assert_string_equal(qr_dt_name(QR_FLOAT16), "float16");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(widen_bf16_every_pattern),
        cmocka_unit_test(widen_f16_every_pattern),
        cmocka_unit_test(round_trip_every_pattern),
        cmocka_unit_test(narrow_bf16_rounding),
        cmocka_unit_test(narrow_f16_rounding),
        cmocka_unit_test(half_finite_scan),
        cmocka_unit_test(names_and_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

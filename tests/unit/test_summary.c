/*
 * test_summary.c - the pieces of TensorBoard event files: CRC-32C against
 * the standard check values, and one scalar event's TFRecord against bytes
 * written out by hand from the Event and Summary protocol buffers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "summary/summary.h"

#include <string.h>

static void test_crc32c_vectors(void **state) {
    (void)state;
    assert_int_equal(qr_crc32c("123456789", 9), 0xe3069283u); /* the CRC catalogue's check */
    uint8_t zeros[32] = {0}, ones[32];
    memset(ones, 0xff, sizeof ones);
    assert_int_equal(qr_crc32c(zeros, 32), 0x8a9136aau); /* RFC 3720, B.4 */
    assert_int_equal(qr_crc32c(ones, 32), 0x62a8ab43u);
    assert_int_equal(qr_crc32c("", 0), 0);
    uint32_t c = qr_crc32c("123456789", 9);
    assert_int_equal(qr_crc32c_masked("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

static void test_scalar_event_bytes(void **state) {
    (void)state;
    const char *tags[] = {"loss"};
    const double values[] = {0.5};
    uint8_t rec[256];
    size_t n = qr_summary_event_record(rec, sizeof rec, 2.0, 300, 1, tags, values);
    /* Event: 09 <2.0 as double LE> 10 <300 varint = ac 02> 2a <len> Summary
     * Summary: 0a <len> Value; Value: 0a 04 "loss" 15 <0.5f LE = 00 00 00 3f> */
    const uint8_t event[] = {0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x10, 0xac, 0x02, 0x2a, 0x0d,
                             0x0a, 0x0b, 0x0a, 0x04, 'l', 'o', 's', 's', 0x15, 0, 0, 0, 0x3f};
    assert_int_equal(n, 8 + 4 + sizeof event + 4);
    uint8_t len[8] = {sizeof event};
    assert_memory_equal(rec, len, 8);
    uint32_t lc = qr_crc32c_masked(len, 8), dc = qr_crc32c_masked(event, sizeof event);
    assert_int_equal(rec[8] | rec[9] << 8 | rec[10] << 16 | (uint32_t)rec[11] << 24, lc);
    assert_memory_equal(rec + 12, event, sizeof event);
    const uint8_t *t = rec + 12 + sizeof event;
    assert_int_equal(t[0] | t[1] << 8 | t[2] << 16 | (uint32_t)t[3] << 24, dc);
    /* too small a buffer: nothing */
    assert_int_equal(qr_summary_event_record(rec, 16, 2.0, 300, 1, tags, values), 0);
}

static void test_bad_logdir(void **state) {
    (void)state;
    qr_summary *s = NULL;
    assert_int_equal(qr_summary_open(&s, "/proc/qr-no-such/x"), QR_EIO);
    assert_non_null(strstr(qr_last_error(), "/proc/qr-no-such/x"));
    assert_null(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_vectors),
        cmocka_unit_test(test_scalar_event_bytes),
        cmocka_unit_test(test_bad_logdir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

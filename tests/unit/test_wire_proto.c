/*
 * test_wire_proto.c - the frame header codec and the meta reader/writer:
 * round trips, and every way a header can be malformed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "wire/proto.h"

static qr_frame sample(void) {
    qr_frame f = {.type = QR_MSG_PUSH, .flags = 0x1234, .request_id = 0xdeadbeef,
                  .status = QR_ESHAPE, .meta_len = 100, .payload_len = 1ull << 33};
    return f;
}

static void test_round_trip(void **state) {
    (void)state;
    qr_frame f = sample(), g;
    uint8_t buf[QR_PROTO_HEADER_LEN];
    qr_proto_encode_header(&f, buf);
    assert_int_equal(qr_proto_decode_header(buf, UINT64_MAX, &g), QR_OK);
    assert_int_equal(g.type, f.type);
    assert_int_equal(g.flags, f.flags);
    assert_int_equal(g.request_id, f.request_id);
    assert_int_equal(g.status, f.status);
    assert_int_equal(g.meta_len, f.meta_len);
    assert_true(g.payload_len == f.payload_len);
}

static void test_little_endian_layout(void **state) {
    (void)state;
    qr_frame f = {.type = QR_MSG_PULL | QR_MSG_REPLY, .request_id = 1, .meta_len = 2,
                  .payload_len = 3};
    uint8_t b[QR_PROTO_HEADER_LEN];
    qr_proto_encode_header(&f, b);
    const uint8_t magic[4] = {'Q', 'U', 'R', 'M'};
    assert_memory_equal(b, magic, 4);
    assert_int_equal(b[4], QR_PROTO_VERSION);
    assert_int_equal(b[5], 0x85);
    assert_int_equal(b[8], 1);
    assert_int_equal(b[16], 2);
    assert_int_equal(b[24], 3);
    for (int i = 20; i < 24; i++) assert_int_equal(b[i], 0);
}

static void expect_bad(uint8_t *buf, uint64_t max_payload, int status, const char *phrase) {
    qr_frame g;
    assert_int_equal(qr_proto_decode_header(buf, max_payload, &g), status);
    assert_non_null(strstr(qr_last_error(), phrase));
}

static void test_malformed_headers(void **state) {
    (void)state;
    qr_frame f = sample();
    uint8_t good[QR_PROTO_HEADER_LEN], b[QR_PROTO_HEADER_LEN];
    qr_proto_encode_header(&f, good);

    memcpy(b, good, sizeof b);
    b[0] = 'X';
    expect_bad(b, UINT64_MAX, QR_EPROTO, "bad magic");

    memcpy(b, good, sizeof b);
    b[4] = 9;
    expect_bad(b, UINT64_MAX, QR_EPROTO, "unsupported protocol version 9");

    memcpy(b, good, sizeof b);
    b[5] = 0x7f;
    expect_bad(b, UINT64_MAX, QR_EPROTO, "unknown message type");
    b[5] = 0;
    expect_bad(b, UINT64_MAX, QR_EPROTO, "unknown message type");

    memcpy(b, good, sizeof b);
    b[21] = 1;
    expect_bad(b, UINT64_MAX, QR_EPROTO, "reserved");

    memcpy(b, good, sizeof b);
    b[18] = 0xff; /* meta_len of about 16 MiB */
    expect_bad(b, UINT64_MAX, QR_ETOOBIG, "meta of");

    expect_bad(good, 1000, QR_ETOOBIG, "payload of 8589934592 bytes exceeds the limit of 1000");
}

static void test_meta_reader_bounds(void **state) {
    (void)state;
    qr_wbuf w = {0};
    qr_wbuf_u32(&w, 7);
    qr_wbuf_i64(&w, -5);
    qr_wbuf_f32(&w, 1.5f);
    qr_wbuf_bytes(&w, "abc", 3);
    assert_false(w.oom);
    assert_int_equal(w.len, 4 + 8 + 4 + 3);

    qr_rbuf r;
    qr_rbuf_init(&r, w.data, w.len);
    assert_int_equal(qr_rbuf_u32(&r), 7);
    assert_true(qr_rbuf_i64(&r) == -5);
    assert_true(qr_rbuf_f32(&r) == 1.5f);
    assert_memory_equal(qr_rbuf_bytes(&r, 3), "abc", 3);
    assert_false(r.bad);
    assert_int_equal(r.left, 0);
    /* Reading past the end yields zeros and marks the reader bad. */
    assert_int_equal(qr_rbuf_u32(&r), 0);
    assert_true(r.bad);
    assert_null(qr_rbuf_bytes(&r, 1));

    /* A truncated record: 3 bytes where a u32 is expected. */
    qr_rbuf_init(&r, w.data, 3);
    assert_int_equal(qr_rbuf_u32(&r), 0);
    assert_true(r.bad);
    qr_wbuf_free(&w);
}

static void test_names(void **state) {
    (void)state;
    assert_string_equal(qr_msg_name(QR_MSG_PUSH), "PUSH");
    assert_string_equal(qr_msg_name(QR_MSG_PULL | QR_MSG_REPLY), "PULL");
    assert_string_equal(qr_msg_name(99), "UNKNOWN");
    assert_string_equal(qr_status_name(QR_ESHAPE), "QR_ESHAPE");
    assert_string_equal(qr_strerror(QR_ESTALE), "dropped: stale");
    assert_string_equal(qr_strerror(12345), "unknown status");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_little_endian_layout),
        cmocka_unit_test(test_malformed_headers),
        cmocka_unit_test(test_meta_reader_bounds),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

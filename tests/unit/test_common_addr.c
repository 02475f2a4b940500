/*
 * test_common_addr.c - address parsing (TCP v4/v6/names, Unix paths),
 * loopback detection, canonical keys and the local Unix socket path.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/addr.h"
#include "common/common.h"

#include <stdlib.h>
#include <string.h>

/* Assert that parsing s fails with QR_EINVAL and a message containing phrase. */
static void expect_bad(const char *s, const char *phrase) {
    qr_addr a;
    int rc = qr_addr_parse(s, &a);
    if (rc != QR_EINVAL || !strstr(qr_last_error(), phrase))
        fail_msg("'%s': rc %d, message '%s', wanted '%s'", s, rc, qr_last_error(), phrase);
}

static void test_ipv4(void **state) {
    qr_addr a;
    assert_int_equal(qr_addr_parse("10.1.2.3:2222", &a), QR_OK);
    assert_int_equal(a.kind, QR_ADDR_TCP);
    assert_string_equal(a.host, "10.1.2.3");
    assert_int_equal(a.port, 2222);
    assert_false(a.loopback);

    assert_int_equal(qr_addr_parse("127.0.0.1:1", &a), QR_OK);
    assert_true(a.loopback);
    assert_int_equal(a.port, 1);
    assert_int_equal(qr_addr_parse("127.45.6.7:65535", &a), QR_OK);
    assert_true(a.loopback);
    assert_int_equal(a.port, 65535);
    assert_int_equal(qr_addr_parse("128.0.0.1:80", &a), QR_OK);
    assert_false(a.loopback);
}

static void test_hostnames(void **state) {
    qr_addr a;
    assert_int_equal(qr_addr_parse("localhost:5000", &a), QR_OK);
    assert_string_equal(a.host, "localhost");
    assert_true(a.loopback);
    assert_int_equal(qr_addr_parse("LocalHost:5000", &a), QR_OK);
    assert_true(a.loopback);
    assert_int_equal(qr_addr_parse("ps-0.train_job.svc.cluster.local:2222", &a), QR_OK);
    assert_string_equal(a.host, "ps-0.train_job.svc.cluster.local");
    assert_false(a.loopback);
    assert_int_equal(qr_addr_parse("localhostx:5000", &a), QR_OK);
    assert_false(a.loopback);
}

static void test_ipv6(void **state) {
    qr_addr a;
    assert_int_equal(qr_addr_parse("[::1]:5000", &a), QR_OK);
    assert_int_equal(a.kind, QR_ADDR_TCP);
    assert_string_equal(a.host, "::1"); /* brackets dropped */
    assert_int_equal(a.port, 5000);
    assert_true(a.loopback);

    assert_int_equal(qr_addr_parse("[fe80::1:2]:80", &a), QR_OK);
    assert_string_equal(a.host, "fe80::1:2");
    assert_false(a.loopback);
    assert_int_equal(qr_addr_parse("[::ffff:127.0.0.1]:80", &a), QR_OK);
    assert_true(a.loopback);

    expect_bad("::1:5000", "must be in brackets");
    expect_bad("[::1:5000", "missing ']'");
    expect_bad("[::1]", "missing port");
    expect_bad("[::1]5000", "expected ':'");
    expect_bad("[zz::1]:5000", "not a valid IPv6 address");
    expect_bad("[]:5000", "empty host");
}

static void test_unix(void **state) {
    qr_addr a;
    assert_int_equal(qr_addr_parse("unix:/tmp/q.sock", &a), QR_OK);
    assert_int_equal(a.kind, QR_ADDR_UNIX);
    assert_string_equal(a.path, "/tmp/q.sock");
    assert_false(a.loopback);

    /* 107 bytes fit sun_path with its NUL; 108 do not. */
    char s[200] = "unix:/";
    memset(s + 6, 'p', 106);
    s[112] = '\0';
    assert_int_equal(qr_addr_parse(s, &a), QR_OK);
    assert_int_equal(strlen(a.path), 107);
    strcat(s, "p");
    expect_bad(s, "socket path is 108 bytes");
    expect_bad("unix:", "empty socket path");
    expect_bad("unix:/tmp/a\nb", "bad character");
}

static void test_errors(void **state) {
    expect_bad("", "empty address");
    expect_bad("localhost", "missing port");
    expect_bad("localhost:", "missing port");
    expect_bad(":5000", "empty host");
    expect_bad("h:0", "port 0 is out of range 1..65535");
    expect_bad("h:65536", "port 65536 is out of range");
    expect_bad("h:99999999999999999999999", "out of range");
    expect_bad("h:abc", "port 'abc' is not a number");
    expect_bad("h:-1", "not a number");
    expect_bad("h:+80", "not a number");
    expect_bad("h: 80", "not a number");
    expect_bad("ho st:80", "bad character space in host");
    expect_bad("ho$t:80", "bad character '$' in host");
    expect_bad("1.2.3.256:80", "not a valid IPv4 address");
    expect_bad("1.2.3:80", "not a valid IPv4 address");
    expect_bad("-host:80", "not a valid host name");
    expect_bad("a..b:80", "not a valid host name");
    char longhost[300];
    memset(longhost, 'a', 260);
    strcpy(longhost + 260, ":80");
    expect_bad(longhost, "host is 260 bytes");

    qr_addr a;
    assert_int_equal(qr_addr_parse(NULL, &a), QR_EINVAL);
    assert_int_equal(qr_addr_parse("h:1", NULL), QR_EINVAL);
}

static void test_key(void **state) {
    qr_addr a, b;
    char ka[320], kb[320];
    assert_int_equal(qr_addr_parse("[::1]:5000", &a), QR_OK);
    assert_int_equal(qr_addr_parse("[0:0:0::1]:5000", &b), QR_OK);
    qr_addr_key(&a, ka, sizeof ka);
    qr_addr_key(&b, kb, sizeof kb);
    assert_string_equal(ka, kb);
    assert_string_equal(ka, "tcp:[::1]:5000");

    assert_int_equal(qr_addr_parse("Host.Example:0080", &a), QR_OK);
    qr_addr_key(&a, ka, sizeof ka);
    assert_string_equal(ka, "tcp:host.example:80");

    assert_int_equal(qr_addr_parse("unix:/x", &a), QR_OK);
    qr_addr_key(&a, ka, sizeof ka);
    assert_string_equal(ka, "unix:/x");
}

static void test_local_unix_path(void **state) {
    qr_addr a;
    char path[108];
    assert_int_equal(qr_addr_parse("localhost:5000", &a), QR_OK);

    unsetenv("QUORUM_SOCKET_DIR");
    assert_int_equal(qr_addr_local_unix_path(&a, path, sizeof path), QR_OK);
    assert_string_equal(path, "/tmp/quorum-localhost-5000.sock");

    setenv("QUORUM_SOCKET_DIR", "/run/q/", 1);
    assert_int_equal(qr_addr_local_unix_path(&a, path, sizeof path), QR_OK);
    assert_string_equal(path, "/run/q/quorum-localhost-5000.sock");

    setenv("QUORUM_SOCKET_DIR", "", 1);
    assert_int_equal(qr_addr_local_unix_path(&a, path, sizeof path), QR_OK);
    assert_string_equal(path, "/tmp/quorum-localhost-5000.sock");

    assert_int_equal(qr_addr_parse("[::1]:7", &a), QR_OK);
    assert_int_equal(qr_addr_local_unix_path(&a, path, sizeof path), QR_OK);
    assert_string_equal(path, "/tmp/quorum-::1-7.sock");

    /* A directory so long the path would not fit sun_path. */
    char dir[120] = "/";
    memset(dir + 1, 'd', 99);
    dir[100] = '\0';
    setenv("QUORUM_SOCKET_DIR", dir, 1);
    assert_int_equal(qr_addr_local_unix_path(&a, path, sizeof path), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "QUORUM_SOCKET_DIR"));
    unsetenv("QUORUM_SOCKET_DIR");

    /* A buffer too small for the result. */
    char small[8];
    assert_int_equal(qr_addr_local_unix_path(&a, small, sizeof small), QR_EINVAL);

    assert_int_equal(qr_addr_parse("unix:/x", &a), QR_OK);
    assert_int_equal(qr_addr_local_unix_path(&a, path, sizeof path), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "only a TCP address"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ipv4),   cmocka_unit_test(test_hostnames),
        cmocka_unit_test(test_ipv6),   cmocka_unit_test(test_unix),
        cmocka_unit_test(test_errors), cmocka_unit_test(test_key),
        cmocka_unit_test(test_local_unix_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

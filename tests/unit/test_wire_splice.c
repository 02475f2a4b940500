/*
 * test_wire_splice.c - the zero-copy writer (src/wire/splice.c) on a real
 * Unix socket pair: the kernel here splices into Unix sockets (else large
 * sends quietly fall back to copying, and quorum loses its Unix speed);
 * a payload larger than the socket buffer moves in several calls that
 * report a full socket, arrives whole and in order; the unread count is
 * above zero until the reader has read every byte, then zero. That last
 * fact is what lets the transport give a lent buffer back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "wire/splice.h"

#define BYTES ((size_t)9 << 20) /* more than the 4 MiB socket buffers below */

static void test_kernel_splices_into_unix_sockets(void **state) {
    (void)state;
    assert_true(qr_splice_works());
}

/* Read whatever has arrived (non-blocking). */
static size_t drain(int fd, uint8_t *in, size_t got, size_t cap) {
    for (;;) {
        ssize_t n = read(fd, in + got, cap - got);
        if (n <= 0) return got;
        got += (size_t)n;
    }
}

static void test_large_send_arrives_whole(void **state) {
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    int size = 4 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    uint8_t *out = malloc(BYTES), *in = malloc(BYTES);
    assert_non_null(out);
    assert_non_null(in);
    for (size_t i = 0; i < BYTES; i++) out[i] = (uint8_t)(i * 131 + (i >> 12));
    qr_splicer s;
    assert_int_equal(qr_splicer_open(&s), QR_OK);

    size_t off = 0, got = 0;
    int full = 0, rc;
    while ((rc = qr_splicer_send(&s, sv[0], out, BYTES, &off)) == 1) {
        full++;
        /* Lent bytes are in the socket, unread: the count says so. */
        assert_true(qr_splice_unread(sv[0]) > 0);
        got = drain(sv[1], in, got, BYTES);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(off, BYTES);
    assert_true(full > 0); /* 9 MiB cannot go into 4 MiB buffers in one call */
    assert_true(qr_splice_unread(sv[0]) > 0 || got == BYTES);
    while (got < BYTES) {
        struct pollfd p = {.fd = sv[1], .events = POLLIN};
        assert_true(poll(&p, 1, 5000) == 1);
        got = drain(sv[1], in, got, BYTES);
    }
    assert_memory_equal(in, out, BYTES);
    /* Everything read: every lent page is back. */
    assert_int_equal(qr_splice_unread(sv[0]), 0);

    /* The peer gone: an error, not a signal or a hang. */
    close(sv[1]);
    off = 0;
    rc = qr_splicer_send(&s, sv[0], out, 1 << 20, &off);
    assert_true(rc < 0);
    qr_splicer_close(&s);
    close(sv[0]);
    free(out);
    free(in);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN); /* as the transport does (conn_uv.c) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_splices_into_unix_sockets),
        cmocka_unit_test(test_large_send_arrives_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * fuzz_io.h - blocking socket helpers the fuzz targets share, each bounded
 * by a timeout so that a hang shows up as a failed read, never as a stuck
 * fuzzer. Header-only.
 */
#ifndef QR_FUZZ_IO_H
#define QR_FUZZ_IO_H

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

/* Wait up to timeout_ms for fd to be ready for `events`. */
static inline bool fuzz_wait(int fd, short events, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = events};
    int n;
    do n = poll(&p, 1, timeout_ms);
    while (n < 0 && errno == EINTR);
    return n > 0;
}

/* Read exactly n bytes into buf (dropped if buf is NULL); false on EOF,
 * an error, or timeout_ms without data. */
static inline bool fuzz_read_n(int fd, uint8_t *buf, size_t n, int timeout_ms) {
    uint8_t scratch[4096];
    while (n) {
        if (!fuzz_wait(fd, POLLIN, timeout_ms)) return false;
        size_t want = buf || n < sizeof scratch ? n : sizeof scratch;
        ssize_t k = read(fd, buf ? buf : scratch, want);
        if (k <= 0) return false;
        if (buf) buf += k;
        n -= (size_t)k;
    }
    return true;
}

/* Send all n bytes; false if the peer is gone. */
static inline bool fuzz_send_all(int fd, const void *data, size_t n) {
    const uint8_t *p = data;
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

#endif

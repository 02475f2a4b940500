/*
 * blocking.c - a client of the wire protocol over a plain blocking socket
 * (blocking.h). One small frame a second needs no event loop, and the
 * thread that sends it (the worker's heartbeat) must not share its
 * caller's: this is what it speaks through, the same addresses, the same
 * handshake (auth.h, here driven by blocking reads and writes with a
 * deadline) as every conn.h connection.
 */
#include "wire/blocking.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* connect(2), bounded by timeout_ms when it is positive (SO_SNDTIMEO,
 * which a blocking connect honours on Unix and TCP sockets); the
 * connected descriptor, or -1 with *err the reason. */
static int connect_within(int fd, const struct sockaddr *sa, socklen_t len, int timeout_ms,
                          int *err) {
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    if (timeout_ms > 0) {
        struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    if (connect(fd, sa, len)) {
        *err = errno;
        close(fd);
        return -1;
    }
    if (timeout_ms > 0) /* the bound was for the connect only */
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &(struct timeval){0}, sizeof(struct timeval));
    return fd;
}

static int connect_unix(const char *path, int timeout_ms, int *err) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
        *err = ENAMETOOLONG;
        return -1;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    return connect_within(fd, (struct sockaddr *)&sa, sizeof sa, timeout_ms, err);
}

static int connect_tcp(const qr_addr *a, int timeout_ms, int *err) {
    char port[16];
    snprintf(port, sizeof port, "%d", a->port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(a->host, port, &hints, &res)) {
        *err = EHOSTUNREACH;
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
        fd = connect_within(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol),
                            ai->ai_addr, ai->ai_addrlen, timeout_ms, err);
    freeaddrinfo(res);
    if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int));
    return fd;
}

static int connect_addr(const qr_addr *addr, bool prefer_unix, int timeout_ms, int *err) {
    if (addr->kind == QR_ADDR_UNIX) return connect_unix(addr->path, timeout_ms, err);
    char path[108];
    if (prefer_unix && addr->loopback && !qr_addr_local_unix_path(addr, path, sizeof path)) {
        int fd = connect_unix(path, timeout_ms, err);
        if (fd >= 0) return fd;
    }
    return connect_tcp(addr, timeout_ms, err);
}

bool qr_blocking_refused(const qr_addr *addr, bool prefer_unix, int timeout_ms) {
    int err = 0;
    int fd = connect_addr(addr, prefer_unix, timeout_ms, &err);
    if (fd >= 0) {
        close(fd);
        return false;
    }
    /* a Unix socket's file left by a process gone, or none: nobody listens */
    return err == ECONNREFUSED || err == ENOENT;
}

/* The same way a conn.h connection goes: a Unix socket for a peer on
 * this machine, when the transport allows it. */
int qr_blocking_connect(const qr_addr *addr, bool prefer_unix) {
    int err;
    return connect_addr(addr, prefer_unix, 0, &err);
}

bool qr_blocking_send_all(int fd, const void *buf, size_t len) {
    const uint8_t *p = buf;
    for (size_t off = 0; off < len;) {
        ssize_t n = send(fd, p + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        off += (size_t)n;
    }
    return true;
}

bool qr_blocking_recv_all(int fd, void *buf, size_t len) {
    uint8_t *p = buf;
    for (size_t off = 0; off < len;) {
        ssize_t n = recv(fd, p + off, len - off, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        off += (size_t)n;
    }
    return true;
}

int qr_blocking_handshake(int fd, const qr_auth *auth, int timeout_ms, const char *peer,
                          qr_sealer **tx) {
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    qr_handshake hs;
    qr_handshake_start(&hs, auth, false);
    uint8_t out[QR_HS_MAX_LEN], in[QR_HS_MAX_LEN];
    qr_handshake_hello(&hs, out);
    size_t out_len = QR_HS_HELLO_LEN;
    int rc = QR_OK;
    while (rc == QR_OK && hs.state != QR_HS_DONE) {
        if (out_len && !qr_blocking_send_all(fd, out, out_len)) {
            rc = qr__fail(QR_EPEERLOST, "%s closed the connection in the handshake", peer);
            break;
        }
        size_t want = qr_handshake_want(&hs);
        if (!qr_blocking_recv_all(fd, in, want)) {
            rc = qr__fail(QR_EPEERLOST, "no answer to the handshake from %s", peer);
            break;
        }
        rc = qr_handshake_step(&hs, in, want, out, &out_len);
        if (rc && out_len) qr_blocking_send_all(fd, out, out_len); /* our refusal, for its log */
    }
    if (rc == QR_OK && hs.encrypt) {
        *tx = qr__calloc(1, sizeof **tx);
        if (*tx) qr_sealer_init(*tx, hs.aes, hs.key_tx);
        else rc = QR_ENOMEM;
    }
    qr_handshake_clear(&hs);
    return rc;
}

void qr_blocking_close(int fd) {
    close(fd);
}

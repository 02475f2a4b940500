/*
 * addr.h - parsing and checking of task addresses: "host:port" (TCP) or
 * "unix:/path" (Unix domain socket).
 *
 * Every address of a cluster spec goes through qr_addr_parse when the spec
 * is built, so a typo in --ps_hosts is reported before anything binds or
 * connects, with the address and the reason in the message.
 *
 * Why in common/: two layers read addresses. The transport (wire/) binds
 * and connects them; the cluster spec (cluster/), which sits below wire/,
 * checks every one when the spec is built. The grammar is a pure function
 * of the string (no I/O, no resolving), so it lives below both rather than
 * in wire/, where cluster/ could only reach it by an include pointing up.
 */
#ifndef QR_COMMON_ADDR_H
#define QR_COMMON_ADDR_H

#include <stdbool.h>
#include <stddef.h>

typedef enum { QR_ADDR_TCP = 1, QR_ADDR_UNIX = 2 } qr_addr_kind;

typedef struct qr_addr {
    qr_addr_kind kind;
    /* TCP: host name, IPv4 literal, or IPv6 literal. An IPv6 address is
     * written "[::1]:5000" in the spec; host holds it without the brackets
     * ("::1"), the form getaddrinfo and inet_pton take. */
    char host[256];
    int port;        /* TCP: 1..65535 */
    char path[108];  /* UNIX: socket path (sun_path limit; longer is an error) */
    bool loopback;   /* TCP host is 127.0.0.0/8, ::1 or "localhost" */
} qr_addr;

/* Parse "host:port", "[v6]:port" or "unix:/path" into *out. On error
 * returns QR_EINVAL with a message that quotes the address and says what
 * is wrong (missing port, port out of range, bad character, ...). */
int qr_addr_parse(const char *s, qr_addr *out);

/* The Unix socket a ps listening on a loopback TCP address also serves, so
 * that local peers get Unix sockets automatically:
 * "<dir>/quorum-<host>-<port>.sock" with dir = $QUORUM_SOCKET_DIR or /tmp.
 * Returns QR_EINVAL if a is not TCP or the result would not fit sun_path
 * or len. */
int qr_addr_local_unix_path(const qr_addr *a, char *path, size_t len);

/* A canonical spelling of the address ("tcp:host:port" with the host in
 * lower case and IPv6 in its shortest form, or "unix:path"), used to find
 * two tasks given the same address in different spellings. */
void qr_addr_key(const qr_addr *a, char *buf, size_t len);

#endif /* QR_COMMON_ADDR_H */

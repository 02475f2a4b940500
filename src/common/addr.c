/*
 * addr.c - parsing of task addresses ("host:port", "[v6]:port",
 * "unix:/path") and the derived local Unix socket path of a loopback ps.
 *
 * The checks are strict on purpose: an address that would only fail later
 * at bind or connect time (a port of 70000, a host with a stray space, an
 * IPv6 literal without brackets) is refused here, where the message can
 * still say which flag and which element it came from.
 */
#include "common/addr.h"

#include "common/common.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>

_Static_assert(sizeof(((qr_addr *)0)->path) == sizeof(((struct sockaddr_un *)0)->sun_path),
               "qr_addr.path must match sun_path");

#define HOST_MAX (sizeof(((qr_addr *)0)->host) - 1)
#define PATH_MAX_LEN (sizeof(((qr_addr *)0)->path) - 1)

/* A byte as it should appear in a message: itself if printable, else hex. */
static const char *show_char(unsigned char c, char buf[8]) {
    if (isprint(c) && c != ' ')
        snprintf(buf, 8, "'%c'", c);
    else if (c == ' ')
        snprintf(buf, 8, "space");
    else
        snprintf(buf, 8, "\\x%02x", c);
    return buf;
}

static int parse_unix(const char *s, qr_addr *out) {
    const char *p = s + 5;
    size_t n = strlen(p);
    if (n == 0) return qr__fail(QR_EINVAL, "'%s': empty socket path after 'unix:'", s);
    if (n > PATH_MAX_LEN)
        return qr__fail(QR_EINVAL,
                        "'%s': socket path is %zu bytes, longer than the %zu bytes a "
                        "Unix socket path may have",
                        s, n, PATH_MAX_LEN);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c < 0x20 || c == 0x7f) {
            char cb[8];
            return qr__fail(QR_EINVAL, "'%s': bad character %s in socket path", s,
                            show_char(c, cb));
        }
    }
    out->kind = QR_ADDR_UNIX;
    memcpy(out->path, p, n + 1);
    return QR_OK;
}

/* Port: decimal digits only (no sign, no spaces), 1..65535. */
static int parse_port(const char *s, const char *p, int *port) {
    if (!*p) return qr__fail(QR_EINVAL, "'%s': missing port after ':'", s);
    long v = 0;
    bool big = false;
    for (const char *q = p; *q; q++) {
        if (*q < '0' || *q > '9')
            return qr__fail(QR_EINVAL, "'%s': port '%s' is not a number", s, p);
        if (!big) v = v * 10 + (*q - '0');
        if (v > 65535) big = true;
    }
    if (big || v < 1)
        return qr__fail(QR_EINVAL, "'%s': port %s is out of range 1..65535", s, p);
    *port = (int)v;
    return QR_OK;
}

/* Host name or IPv4 literal (IPv6 is handled by the caller). */
static int check_host(const char *s, const char *host, bool *loopback) {
    bool numeric = true;
    for (const char *q = host; *q; q++) {
        unsigned char c = (unsigned char)*q;
        if (!(isalnum(c) || c == '-' || c == '.' || c == '_')) {
            char cb[8];
            return qr__fail(QR_EINVAL, "'%s': bad character %s in host", s, show_char(c, cb));
        }
        if (!(isdigit(c) || c == '.')) numeric = false;
    }
    if (numeric) {
        /* All digits and dots can only mean an IPv4 literal; "10.0.0.256"
         * would otherwise go to DNS and fail much later. */
        struct in_addr a4;
        if (inet_pton(AF_INET, host, &a4) != 1)
            return qr__fail(QR_EINVAL, "'%s': '%s' is not a valid IPv4 address", s, host);
        *loopback = (ntohl(a4.s_addr) >> 24) == 127;
        return QR_OK;
    }
    if (host[0] == '-' || host[0] == '.' || strstr(host, ".."))
        return qr__fail(QR_EINVAL, "'%s': '%s' is not a valid host name", s, host);
    *loopback = strcasecmp(host, "localhost") == 0 || strcasecmp(host, "localhost.") == 0;
    return QR_OK;
}

static int check_host6(const char *s, const char *host, bool *loopback) {
    struct in6_addr a6;
    if (inet_pton(AF_INET6, host, &a6) != 1)
        return qr__fail(QR_EINVAL, "'%s': '%s' is not a valid IPv6 address", s, host);
    *loopback = IN6_IS_ADDR_LOOPBACK(&a6) ||
                (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return QR_OK;
}

int qr_addr_parse(const char *s, qr_addr *out) {
    if (!s || !out) return qr__fail(QR_EINVAL, "qr_addr_parse: NULL argument");
    memset(out, 0, sizeof *out);
    if (!*s) return qr__fail(QR_EINVAL, "empty address (expected host:port or unix:/path)");
    if (strncmp(s, "unix:", 5) == 0) return parse_unix(s, out);

    const char *hb, *he, *port;
    bool v6 = false;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close) return qr__fail(QR_EINVAL, "'%s': missing ']' after IPv6 address", s);
        if (close[1] == '\0')
            return qr__fail(QR_EINVAL, "'%s': missing port (expected [v6]:port)", s);
        if (close[1] != ':')
            return qr__fail(QR_EINVAL, "'%s': expected ':' and a port after ']'", s);
        hb = s + 1;
        he = close;
        port = close + 2;
        v6 = true;
    } else {
        const char *colon = strrchr(s, ':');
        if (!colon)
            return qr__fail(QR_EINVAL,
                            "'%s': missing port (expected host:port or unix:/path)", s);
        if (memchr(s, ':', (size_t)(colon - s)))
            return qr__fail(QR_EINVAL,
                            "'%s': an IPv6 address must be in brackets, like [::1]:5000", s);
        hb = s;
        he = colon;
        port = colon + 1;
    }

    size_t hlen = (size_t)(he - hb);
    if (hlen == 0) return qr__fail(QR_EINVAL, "'%s': empty host", s);
    if (hlen > HOST_MAX)
        return qr__fail(QR_EINVAL, "'%s': host is %zu bytes, at most %zu are allowed", s, hlen,
                        HOST_MAX);
    memcpy(out->host, hb, hlen);
    out->host[hlen] = '\0';

    int rc = parse_port(s, port, &out->port);
    if (rc == QR_OK)
        rc = v6 ? check_host6(s, out->host, &out->loopback)
                : check_host(s, out->host, &out->loopback);
    if (rc != QR_OK) {
        memset(out, 0, sizeof *out);
        return rc;
    }
    out->kind = QR_ADDR_TCP;
    return QR_OK;
}

int qr_addr_local_unix_path(const qr_addr *a, char *path, size_t len) {
    if (!a || !path || len == 0)
        return qr__fail(QR_EINVAL, "qr_addr_local_unix_path: NULL argument");
    path[0] = '\0';
    if (a->kind != QR_ADDR_TCP)
        return qr__fail(QR_EINVAL, "only a TCP address has a local Unix socket path");
    const char *dir = getenv("QUORUM_SOCKET_DIR");
    if (!dir || !*dir) dir = "/tmp";
    /* "/tmp/" and "/tmp" name the same directory; drop trailing slashes so
     * both give the same socket path (but keep "/" itself). */
    size_t dlen = strlen(dir);
    while (dlen > 1 && dir[dlen - 1] == '/') dlen--;
    int n = snprintf(NULL, 0, "%.*s/quorum-%s-%d.sock", (int)dlen, dir, a->host, a->port);
    if (n < 0) return qr__fail(QR_EINVAL, "cannot format a socket path");
    if ((size_t)n > PATH_MAX_LEN)
        return qr__fail(QR_EINVAL,
                        "socket path for %s:%d in '%.*s' would be %d bytes, over the %zu "
                        "bytes a Unix socket path may have; set QUORUM_SOCKET_DIR to a "
                        "shorter directory",
                        a->host, a->port, (int)dlen, dir, n, PATH_MAX_LEN);
    if ((size_t)n >= len)
        return qr__fail(QR_EINVAL, "socket path needs %d bytes, buffer has %zu", n + 1, len);
    snprintf(path, len, "%.*s/quorum-%s-%d.sock", (int)dlen, dir, a->host, a->port);
    return QR_OK;
}

void qr_addr_key(const qr_addr *a, char *buf, size_t len) {
    if (a->kind == QR_ADDR_UNIX) {
        snprintf(buf, len, "unix:%s", a->path);
        return;
    }
    char host[sizeof a->host];
    struct in6_addr a6;
    if (strchr(a->host, ':') && inet_pton(AF_INET6, a->host, &a6) == 1) {
        /* "0:0::1" and "::1" are the same address; inet_ntop gives the
         * shortest form. */
        inet_ntop(AF_INET6, &a6, host, sizeof host);
        snprintf(buf, len, "tcp:[%s]:%d", host, a->port);
        return;
    }
    size_t i = 0;
    for (; a->host[i] && i < sizeof host - 1; i++)
        host[i] = (char)tolower((unsigned char)a->host[i]);
    host[i] = '\0';
    snprintf(buf, len, "tcp:%s:%d", host, a->port);
}

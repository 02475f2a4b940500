/*
 * heartbeat.c - a worker's heartbeat to ps 0: BEAT(worker) every
 * heartbeat-ms, from a thread of its own, on a connection of its own.
 *
 * Why a thread: the worker library has no I/O thread (its loop runs only
 * inside the caller's calls), and a worker computing a long batch sends
 * nothing for as long. A silent connection therefore says nothing about
 * the worker; a missing heartbeat does. A SIGSTOPped or wedged process
 * stops every thread, this one too, and ps 0 (src/ps/liveness.c) treats
 * the worker as lost within heartbeat-timeout-ms; a merely busy one goes
 * on beating. The thread uses a plain blocking socket: one small frame a
 * second needs no event loop, and it must not share the caller's. In a
 * job with a secret it authenticates as every connection does (the same
 * handshake, wire/auth.h, driven by blocking reads with a deadline) and,
 * with --encrypt, seals its beats (wire/seal.h).
 */
#include "worker/heartbeat.h"

#include "common/addr.h"
#include "wire/auth.h"
#include "wire/msg.h"
#include "wire/seal.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

struct qr_heartbeat {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stop;
    qr_addr addr;
    bool prefer_unix;
    uint32_t worker;
    int period_ms;
    int fd;
    const qr_auth *auth;  /* the worker's; NULL without a secret */
    int handshake_timeout_ms;
    qr_sealer *tx;        /* encrypted: this connection's sending key */
    bool refusal_logged;
};

static int connect_unix(const char *path) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) return -1;
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static int connect_tcp(const qr_addr *a) {
    char port[16];
    snprintf(port, sizeof port, "%d", a->port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(a->host, port, &hints, &res)) return -1;
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int));
    return fd;
}

/* The same way the worker's own connections go: a Unix socket for ps 0
 * on this machine, when the transport allows it. */
static int hb_connect(const qr_heartbeat *h) {
    if (h->addr.kind == QR_ADDR_UNIX) return connect_unix(h->addr.path);
    char path[108];
    if (h->prefer_unix && h->addr.loopback &&
        !qr_addr_local_unix_path(&h->addr, path, sizeof path)) {
        int fd = connect_unix(path);
        if (fd >= 0) return fd;
    }
    return connect_tcp(&h->addr);
}

static bool send_all(int fd, const uint8_t *p, size_t len) {
    for (size_t off = 0; off < len;) {
        ssize_t n = send(fd, p + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        off += (size_t)n;
    }
    return true;
}

static bool recv_all(int fd, uint8_t *p, size_t len) {
    for (size_t off = 0; off < len;) {
        ssize_t n = recv(fd, p + off, len - off, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        off += (size_t)n;
    }
    return true;
}

/* The handshake on the fresh connection fd, each read and write bounded by
 * the handshake timeout. On success with encryption, h->tx is set up. */
static int authenticate(qr_heartbeat *h, int fd) {
    struct timeval tv = {.tv_sec = h->handshake_timeout_ms / 1000,
                         .tv_usec = (h->handshake_timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    qr_handshake hs;
    qr_handshake_start(&hs, h->auth, false);
    uint8_t out[QR_HS_MAX_LEN], in[QR_HS_MAX_LEN];
    qr_handshake_hello(&hs, out);
    size_t out_len = QR_HS_HELLO_LEN;
    int rc = QR_OK;
    while (rc == QR_OK && hs.state != QR_HS_DONE) {
        if (out_len && !send_all(fd, out, out_len)) {
            rc = qr__fail(QR_EPEERLOST, "ps 0 closed the heartbeat's connection in the handshake");
            break;
        }
        size_t want = qr_handshake_want(&hs);
        if (!recv_all(fd, in, want)) {
            rc = qr__fail(QR_EPEERLOST, "no answer to the heartbeat's handshake from ps 0");
            break;
        }
        rc = qr_handshake_step(&hs, in, want, out, &out_len);
        if (rc && out_len) send_all(fd, out, out_len); /* our refusal, for ps 0's log */
    }
    if (rc == QR_OK && hs.encrypt) {
        h->tx = qr__calloc(1, sizeof *h->tx);
        if (h->tx) qr_sealer_init(h->tx, hs.aes, hs.key_tx);
        else rc = QR_ENOMEM;
    }
    qr_handshake_clear(&hs);
    return rc;
}

static int hb_open(qr_heartbeat *h) {
    int fd = hb_connect(h);
    if (fd < 0 || !h->auth) return fd;
    free(h->tx);
    h->tx = NULL;
    if (authenticate(h, fd) == QR_OK) {
        h->refusal_logged = false;
        return fd;
    }
    /* The worker's own connections report a refusal to its calls; this
     * says it once for the heartbeat. */
    if (!h->refusal_logged) qr__log(QR_LOG_WARN, "heartbeat: %s", qr_last_error());
    h->refusal_logged = true;
    close(fd);
    return -1;
}

static bool send_beat(qr_heartbeat *h, int fd, uint32_t worker) {
    uint8_t frame[QR_PROTO_HEADER_LEN + QR_MSG_BEAT_LEN + QR_PROTO_ALIGN] = {0};
    qr_frame f = {.type = QR_MSG_BEAT, .meta_len = QR_MSG_BEAT_LEN};
    qr_proto_encode_header(&f, frame);
    qr_wbuf meta = {0};
    qr_msg_put_worker(&meta, worker);
    if (meta.oom) return false;
    memcpy(frame + QR_PROTO_HEADER_LEN, meta.data, QR_MSG_BEAT_LEN);
    qr_wbuf_free(&meta);
    size_t len = QR_PROTO_HEADER_LEN + QR_MSG_BEAT_LEN;
    len += qr_proto_pad(len);
    if (!h->tx) return send_all(fd, frame, len);
    uint8_t sealed[sizeof frame + QR_SEAL_OVERHEAD];
    return send_all(fd, sealed, qr_seal(h->tx, frame, len, sealed));
}

static void *hb_main(void *arg) {
    qr_heartbeat *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        pthread_mutex_unlock(&h->mu);
        if (h->fd < 0) h->fd = hb_open(h);
        if (h->fd >= 0 && !send_beat(h, h->fd, h->worker)) {
            close(h->fd); /* ps 0 gone or restarting: connect again next time */
            h->fd = -1;
        }
        pthread_mutex_lock(&h->mu);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += h->period_ms / 1000;
        until.tv_nsec += (long)(h->period_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!h->stop && pthread_cond_timedwait(&h->cond, &h->mu, &until) == 0) {
        }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

int qr_heartbeat_start(qr_heartbeat **out, const char *ps0, bool prefer_unix, int worker,
                       int period_ms, const qr_auth *auth, int handshake_timeout_ms) {
    *out = NULL;
    qr_heartbeat *h = qr__calloc(1, sizeof *h);
    if (!h) return QR_ENOMEM;
    int rc = qr_addr_parse(ps0, &h->addr);
    if (rc) {
        free(h);
        return rc;
    }
    h->prefer_unix = prefer_unix;
    h->worker = (uint32_t)worker;
    h->period_ms = period_ms;
    h->auth = auth;
    h->handshake_timeout_ms = handshake_timeout_ms > 0 ? handshake_timeout_ms : 10000;
    h->fd = -1;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cond, NULL);
    if (pthread_create(&h->thread, NULL, hb_main, h)) {
        pthread_mutex_destroy(&h->mu);
        pthread_cond_destroy(&h->cond);
        free(h);
        return qr__fail(QR_EINTERNAL, "cannot start the heartbeat thread");
    }
    *out = h;
    return QR_OK;
}

void qr_heartbeat_stop(qr_heartbeat *h) {
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    h->stop = true;
    pthread_cond_signal(&h->cond);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    if (h->fd >= 0) close(h->fd);
    if (h->tx) qr_sealer_clear(h->tx);
    free(h->tx);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cond);
    free(h);
}

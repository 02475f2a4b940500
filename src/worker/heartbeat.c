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
 * second needs no event loop, and it must not share the caller's.
 */
#include "worker/heartbeat.h"

#include "common/addr.h"
#include "wire/msg.h"

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

static bool send_beat(int fd, uint32_t worker) {
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
    for (size_t off = 0; off < len;) {
        ssize_t n = send(fd, frame + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        off += (size_t)n;
    }
    return true;
}

static void *hb_main(void *arg) {
    qr_heartbeat *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        pthread_mutex_unlock(&h->mu);
        if (h->fd < 0) h->fd = hb_connect(h);
        if (h->fd >= 0 && !send_beat(h->fd, h->worker)) {
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
                       int period_ms) {
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
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cond);
    free(h);
}

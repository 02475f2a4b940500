/*
 * heartbeat.c - a worker's heartbeat to the coordinator (ps 0, or its
 * successor once ps 0 failed over: qr_heartbeat_move): BEAT(worker)
 * every heartbeat-ms, from a thread of its own, on a connection of its
 * own.
 *
 * Why a thread: the worker library has no I/O thread (its loop runs only
 * inside the caller's calls), and a worker computing a long batch sends
 * nothing for as long. A silent connection therefore says nothing about
 * the worker; a missing heartbeat does. A SIGSTOPped or wedged process
 * stops every thread, this one too, and ps 0 (src/ps/liveness.c) treats
 * the worker as lost within heartbeat-timeout-ms; a merely busy one goes
 * on beating. The thread uses a plain blocking socket (wire/blocking.h):
 * one small frame a second needs no event loop, and it must not share the
 * caller's. In a job with a secret it authenticates as every connection
 * does (the same handshake, wire/auth.h, driven by blocking reads with a
 * deadline) and, with --encrypt, seals its beats (wire/seal.h).
 */
#include "worker/heartbeat.h"

#include "common/addr.h"
#include "wire/blocking.h"
#include "wire/msg.h"
#include "wire/seal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct qr_heartbeat {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stop;
    qr_addr addr;
    qr_addr moved_to;     /* the coordinator's address since it moved (under mu) */
    bool moved;
    bool prefer_unix;
    uint32_t worker;
    int period_ms;
    int fd;
    const qr_auth *auth;  /* the worker's; NULL without a secret */
    int handshake_timeout_ms;
    qr_sealer *tx;        /* encrypted: this connection's sending key */
    bool refusal_logged;
};

/* A fresh connection to ps 0, authenticated in a job with a secret; -1
 * when there is none this time (the next beat tries again). */
static int hb_open(qr_heartbeat *h) {
    int fd = qr_blocking_connect(&h->addr, h->prefer_unix);
    if (fd < 0 || !h->auth) return fd;
    free(h->tx);
    h->tx = NULL;
    if (qr_blocking_handshake(fd, h->auth, h->handshake_timeout_ms, "ps 0", &h->tx) == QR_OK) {
        h->refusal_logged = false;
        return fd;
    }
    /* The worker's own connections report a refusal to its calls; this
     * says it once for the heartbeat. */
    if (!h->refusal_logged) qr__log(QR_LOG_WARN, "heartbeat: %s", qr_last_error());
    h->refusal_logged = true;
    qr_blocking_close(fd);
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
    if (!h->tx) return qr_blocking_send_all(fd, frame, len);
    uint8_t sealed[sizeof frame + QR_SEAL_OVERHEAD];
    return qr_blocking_send_all(fd, sealed, qr_seal(h->tx, frame, len, sealed));
}

static void *hb_main(void *arg) {
    qr_heartbeat *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        if (h->moved) { /* beats go to the new coordinator from now on */
            h->moved = false;
            h->addr = h->moved_to;
            if (h->fd >= 0) qr_blocking_close(h->fd);
            h->fd = -1;
        }
        pthread_mutex_unlock(&h->mu);
        if (h->fd < 0) h->fd = hb_open(h);
        if (h->fd >= 0 && !send_beat(h, h->fd, h->worker)) {
            qr_blocking_close(h->fd); /* ps 0 gone or restarting: connect again next time */
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

int qr_heartbeat_move(qr_heartbeat *h, const char *coordinator) {
    qr_addr a;
    int rc = qr_addr_parse(coordinator, &a);
    if (rc || !h) return rc;
    pthread_mutex_lock(&h->mu);
    h->moved_to = a;
    h->moved = true;
    pthread_cond_signal(&h->cond); /* beat there now */
    pthread_mutex_unlock(&h->mu);
    return QR_OK;
}

void qr_heartbeat_stop(qr_heartbeat *h) {
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    h->stop = true;
    pthread_cond_signal(&h->cond);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    if (h->fd >= 0) qr_blocking_close(h->fd);
    if (h->tx) qr_sealer_clear(h->tx);
    free(h->tx);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cond);
    free(h);
}

/*
 * fuzz_worker.c - libFuzzer target: a worker facing a ps that answers
 * with arbitrary bytes.
 *
 * A fake ps on a thread of this process answers HELLO, CREATE, READY and
 * the first PULL correctly, so that a real qr_worker gets through
 * qr_worker_initialize with one variable "w" [4, 3]. The request the input's first byte picks
 * (pull, push, step, stats or a sparse push) is answered with the rest of
 * the input, its request id set to the one the worker sent (so the reply
 * gets past the id check), and then the connection is closed. The worker
 * must come back with a status, not crash, write out of bounds or hang
 * past its timeout.
 */
#include "cluster/cluster.h"
#include "fuzz_io.h"
#include "quorum.h"
#include "wire/proto.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { OP_PULL, OP_PUSH, OP_STEP, OP_STATS, OP_SPARSE, NOPS };

static int listen_fd = -1, port;
/* The current input's reply, copied: a connection of an earlier input may
 * still be open on the fake ps's thread. */
static pthread_mutex_t reply_mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *reply_bytes;
static size_t reply_len;
static bool init_pull_answered; /* qr_worker_initialize pulls once: answer it right */

/* A request the worker has started sends the rest at once; a second
 * without bytes means it has gone quiet. */
#define READ_TIMEOUT_MS 1000

/* A well-formed OK reply with meta and a payload of zeros. */
static void reply_ok(int fd, const qr_frame *req, const void *meta, uint32_t meta_len,
                     uint32_t payload_len) {
    uint8_t out[QR_PROTO_ALIGN * 3] = {0};
    qr_frame f = {.type = (uint8_t)(req->type | QR_MSG_REPLY), .request_id = req->request_id,
                  .meta_len = meta_len, .payload_len = payload_len};
    qr_proto_encode_header(&f, out);
    if (meta_len) memcpy(out + QR_PROTO_HEADER_LEN, meta, meta_len);
    size_t len = QR_PROTO_HEADER_LEN + meta_len;
    len += qr_proto_pad(len) + payload_len;
    fuzz_send_all(fd, out, len + qr_proto_pad(len));
}

/* Serve one connection: the handshake properly, anything else with the
 * input, then hang up. */
static void serve(int fd) {
    for (;;) {
        uint8_t head[QR_PROTO_HEADER_LEN];
        qr_frame req;
        if (!fuzz_read_n(fd, head, sizeof head, READ_TIMEOUT_MS) ||
            qr_proto_decode_header(head, 1u << 30, &req) != QR_OK)
            return;
        uint64_t meta_all = req.meta_len + qr_proto_pad(QR_PROTO_HEADER_LEN + req.meta_len);
        uint64_t payload_all = req.payload_len + qr_proto_pad(req.payload_len);
        if (!fuzz_read_n(fd, NULL, meta_all + payload_all, READ_TIMEOUT_MS)) return;
        pthread_mutex_lock(&reply_mu);
        bool init_pull = req.type == QR_MSG_PULL && !init_pull_answered;
        init_pull_answered |= init_pull;
        pthread_mutex_unlock(&reply_mu);
        if (req.type == QR_MSG_HELLO || req.type == QR_MSG_CREATE) {
            reply_ok(fd, &req, NULL, 0, 0);
        } else if (req.type == QR_MSG_READY) {
            uint8_t meta[12] = {1, 0, 0, 0}; /* ready, global step 0 */
            reply_ok(fd, &req, meta, sizeof meta, 0);
        } else if (init_pull) {
            /* count 1; id 0, kind 0, 48 bytes, version 0 */
            uint8_t meta[28] = {1, 0, 0, 0, [12] = 48};
            reply_ok(fd, &req, meta, sizeof meta, 48);
        } else {
            pthread_mutex_lock(&reply_mu);
            size_t len = reply_len;
            uint8_t *out = malloc(len ? len : 1);
            if (out) memcpy(out, reply_bytes, len);
            pthread_mutex_unlock(&reply_mu);
            if (!out) abort();
            if (len >= 12) memcpy(out + 8, &req.request_id, 4); /* little-endian */
            fuzz_send_all(fd, out, len);
            free(out);
            return;
        }
    }
}

static void *fake_ps(void *arg) {
    (void)arg;
    for (;;) {
        int fd = accept(listen_fd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return NULL;
        }
        serve(fd);
        close(fd);
    }
}

static void start_fake_ps(void) {
    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&sa, sizeof sa) ||
        getsockname(listen_fd, (struct sockaddr *)&sa, &len) || listen(listen_fd, 16))
        abort();
    port = ntohs(sa.sin_port);
    pthread_t t;
    if (pthread_create(&t, NULL, fake_ps, NULL)) abort();
    pthread_detach(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (listen_fd < 0) start_fake_ps();
    pthread_mutex_lock(&reply_mu);
    free(reply_bytes);
    reply_len = size - 1;
    reply_bytes = malloc(reply_len ? reply_len : 1);
    if (!reply_bytes) abort();
    memcpy(reply_bytes, data + 1, reply_len);
    init_pull_answered = false;
    pthread_mutex_unlock(&reply_mu);

    char ps_addr[32];
    snprintf(ps_addr, sizeof ps_addr, "127.0.0.1:%d", port);
    const char *ps[1] = {ps_addr}, *workers[1] = {"127.0.0.1:1"};
    qr_cluster *cluster = NULL;
    qr_config *cfg = NULL;
    qr_worker *w = NULL;
    int id = -1;
    if (qr_cluster_create(&cluster, 1, ps, 1, workers, "worker", 0) || qr_config_new(&cfg) ||
        qr_config_set(cfg, "transport", "tcp") || qr_config_set(cfg, "timeout-ms", "100") ||
        qr_config_set(cfg, "init-timeout-ms", "500") ||
        qr_worker_create(&w, cluster, 0, cfg)) {
        fprintf(stderr, "fuzz_worker: setup: %s\n", qr_last_error());
        abort();
    }
    int64_t shape[2] = {4, 3};
    if (qr_worker_declare(w, "w", 2, shape, "zeros", 1, -1, &id) || qr_worker_initialize(w)) {
        fprintf(stderr, "fuzz_worker: initialize: %s\n", qr_last_error());
        abort();
    }
    /* Exactly the variable's size, on the heap: a byte past it is an
     * AddressSanitizer report. */
    float grad[12] = {0}, *out = calloc(12, sizeof(float)), *dst[1] = {out};
    if (!out) abort();
    const float *grads[1] = {grad};
    int64_t step, rows[2] = {1, 3};
    char stats[4096];
    switch (data[0] % NOPS) {
    case OP_PULL: qr_worker_pull(w, 1, &id, dst); break;
    case OP_PUSH: qr_worker_push(w, 1, &id, grads, QR_PUSH_STEP, &step); break;
    case OP_STEP: qr_worker_global_step(w, &step); break;
    case OP_STATS: qr_worker_stats(w, stats, sizeof stats); break;
    case OP_SPARSE: qr_worker_push_sparse(w, id, 2, rows, grad, 0, &step); break;
    }
    qr_worker_free(w);
    free(out);
    qr_config_free(cfg);
    qr_cluster_free(cluster);
    return 0;
}

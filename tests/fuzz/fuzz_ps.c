/*
 * fuzz_ps.c - libFuzzer target: whatever bytes a client sends, a live ps
 * survives them and goes on serving.
 *
 * One ps runs on a thread of this process (tests/unit/cluster_fixture.h)
 * with three variables made by a real worker: "dense" [4, 3] (SGD),
 * "table" [8, 2] (sparse pushes land here), "adam" [5] (Adam, slots) and
 * the embedding table "emb" (id 3, dim 2, Adagrad: per-row slots).
 * fuzz_ps runs it async with max-staleness 2 (so CLOCK is served);
 * fuzz_ps_sync, built from this file with FUZZ_SYNC, as synchronous
 * replicas of 2 workers (COMMIT, TOKEN, held pushes, step applies).
 * Each input is sent as it is on a fresh TCP connection, which is then
 * half-closed and drained until the ps closes it. Then a STEP request on
 * another connection must be answered: a ps that crashed fails the run
 * (AddressSanitizer and UndefinedBehaviorSanitizer report the bug), and
 * one that hangs or stops answering aborts it. An input that stops the ps
 * on purpose (a STOP message) just gets a new ps for the next input.
 *
 * Build and run: scripts/fuzz.sh [seconds]. Seeds: tests/fuzz/seeds.py.
 */
#include "../unit/cluster_fixture.h"
#include "fuzz_io.h"

#include "wire/proto.h"

/* The longest the ps may take to answer or close: far above any real
 * answer, so only a hang trips it. */
#define FUZZ_TIMEOUT_MS 5000

static cluster_fixture fix;
static bool running;
static int ps_port;

static void start_cluster(void) {
#ifdef FUZZ_SYNC
    fix_init(&fix, 1, 2);
    qr_config_set(fix.cfg, "mode", "sync");
#else
    fix_init(&fix, 1, 1);
    qr_config_set(fix.cfg, "max-staleness", "2");
#endif
    qr_config_set(fix.cfg, "lr", "0.1");
    qr_config_set(fix.cfg, "linger-ms", "0");
    if (fix_start_ps(&fix, 0)) {
        fprintf(stderr, "fuzz_ps: cannot start the ps: %s\n", qr_last_error());
        abort();
    }
    ps_port = atoi(strrchr(fix.ps_addr[0], ':') + 1);
    qr_worker *w = fix_worker(&fix, 0);
    int64_t dense[2] = {4, 3}, table[2] = {8, 2}, adam[1] = {5};
    int id;
    if (!w || qr_worker_declare(w, "dense", 2, dense, "zeros", 1, -1, &id) ||
        qr_worker_declare(w, "table", 2, table, "zeros", 1, -1, &id) ||
        qr_worker_declare_opts(w, "adam", 1, adam, "zeros", 1, "optimizer=adam", &id) ||
        qr_worker_declare_table(w, "emb", 2, "normal:0,1", 7, "optimizer=adagrad", &id) ||
        qr_worker_initialize(w)) {
        fprintf(stderr, "fuzz_ps: cannot create the variables: %s\n", qr_last_error());
        abort();
    }
    qr_worker_free(w);
    running = true;
}

static int connect_ps(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ps_port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) return fd;
    if (fd >= 0) close(fd);
    return -1;
}

/* Send the input while reading whatever comes back (a ps answers as it
 * reads, and a full socket both ways would stall us both), then
 * half-close and read until the ps closes or goes quiet. */
static void send_input(const uint8_t *data, size_t size) {
    int fd = connect_ps();
    if (fd < 0) return; /* the ps is stopping: the liveness check decides */
    static uint8_t sink[1 << 16];
    size_t sent = 0;
    bool open = true;
    while (open && sent < size) {
        struct pollfd p = {.fd = fd, .events = POLLIN | POLLOUT};
        if (poll(&p, 1, FUZZ_TIMEOUT_MS) <= 0) break;
        if (p.revents & POLLIN) open = read(fd, sink, sizeof sink) > 0;
        if (open && (p.revents & POLLOUT)) {
            ssize_t n = send(fd, data + sent, size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n < 0 && errno != EAGAIN) break;
            if (n > 0) sent += (size_t)n;
        }
        if (p.revents & (POLLERR | POLLHUP)) break;
    }
    shutdown(fd, SHUT_WR);
    while (open && fuzz_wait(fd, POLLIN, FUZZ_TIMEOUT_MS) && read(fd, sink, sizeof sink) > 0) {
    }
    close(fd);
}

/* Does the ps answer a STEP request? */
static bool ps_answers(void) {
    int fd = connect_ps();
    if (fd < 0) return false;
    qr_frame f = {.type = QR_MSG_STEP, .request_id = 7};
    uint8_t req[QR_PROTO_ALIGN] = {0}, rep[QR_PROTO_HEADER_LEN]; /* header and its pad */
    qr_proto_encode_header(&f, req);
    bool ok = fuzz_send_all(fd, req, sizeof req) &&
              fuzz_read_n(fd, rep, sizeof rep, FUZZ_TIMEOUT_MS);
    qr_frame r;
    ok = ok && qr_proto_decode_header(rep, 1 << 20, &r) == QR_OK &&
         r.type == (QR_MSG_STEP | QR_MSG_REPLY) && r.request_id == 7 && r.status == QR_OK;
    close(fd);
    return ok;
}

/* Did the ps end because a message asked it to (STOP), not by failing? */
static bool ps_stopped_cleanly(void) {
    for (int i = 0; i < FUZZ_TIMEOUT_MS / 10; i++) {
        if (pthread_tryjoin_np(fix.thread[0], NULL) == 0) {
            bool clean = fix.run_status[0] == QR_OK;
            qr_ps_free(fix.ps[0]);
            qr_config_free(fix.cfg);
            running = false;
            return clean;
        }
        usleep(10000);
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!running) start_cluster();
    send_input(data, size);
    if (ps_answers()) return 0;
    if (ps_stopped_cleanly()) return 0; /* a STOP in the input: next input gets a new ps */
    fprintf(stderr, "fuzz_ps: the ps no longer answers STEP after this input\n");
    abort();
}

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
 * Every input meets a ps of its own, just made (its variables created and
 * initialized, nothing else), so that a finding replays from its own file:
 *   build-fuzz/tests/fuzz/fuzz_ps_sync build-fuzz/crash-...   (or any input)
 * A ps kept across inputs would let one input's state (a push held, a
 * step applied, a buffer grown) decide what the next one does, and a crash
 * file alone would not show it (the NULL array handed to qsort in
 * sync.c's reduce_and_apply crashed only on a ps that had never held a
 * push: tests/fuzz/regressions/sync-apply-no-sources). The price is the
 * start of a ps per input (measured in scripts/fuzz.sh's header).
 * FUZZ_KEEP_STATE=1 keeps one ps across inputs instead (faster, and
 * reaches states only a sequence makes, but its findings may not replay
 * from one file).
 *
 * fuzz_ps_auth, built with FUZZ_AUTH, runs the async ps with a cluster
 * secret (written once into a mkdtemp directory) and encrypt on, so that
 * every connection goes through the handshake (src/wire/secure.c).
 * The input's first byte says how the rest reaches it (the low 3 bits; 5-7
 * read as 1):
 *   0 raw, as fuzz_ps sends it: a plain request is refused with a reason,
 *     anything else must be a handshake;
 *   1 sealed: after a genuine handshake (this file plays a worker of the
 *     job, src/wire/auth.c), the rest from the third byte on in records of
 *     the second byte + 1 bytes, so the requests reach the ps through its
 *     record layer;
 *   2 raw after a genuine handshake: the bytes stand in for sealed records;
 *   3 raw after a genuine HELLO: they stand in for the PROOF and on;
 *   4 raw, and the connection is held open (not half-closed) until the ps
 *     closes it: one still in its handshake must be closed at the
 *     handshake deadline (handshake-timeout-ms), or the run aborts.
 * Bit 3 makes the handshakes of 1 and 2 offer XChaCha20-Poly1305 only (the
 * ps picks AES-256-GCM where both ends have it). The liveness check
 * authenticates and seals its STEP the same way.
 *
 * Build and run: scripts/fuzz.sh [seconds]. Seeds: tests/fuzz/seeds.py.
 */
#include "../unit/cluster_fixture.h"
#include "fuzz_io.h"

#include "wire/proto.h"

#ifdef FUZZ_AUTH
#include "wire/auth.h"
#include "wire/seal.h"
#include "wire/secret.h"

/* Far below FUZZ_TIMEOUT_MS, so that a connection the ps fails to close
 * at its deadline shows; and far above a handshake's time on loopback. */
#define FUZZ_HANDSHAKE_MS "300"
static char secret_dir[64], secret_path[96];
static qr_auth *auth; /* a worker's credentials for the running ps's job */
#endif

/* The longest the ps may take to answer or close: far above any real
 * answer, so only a hang trips it. */
#define FUZZ_TIMEOUT_MS 5000

static cluster_fixture fix;
static bool running;
static int ps_port;
static bool keep_state; /* FUZZ_KEEP_STATE: one ps across inputs */

#ifdef FUZZ_AUTH
static void remove_secret(void) {
    unlink(secret_path);
    rmdir(secret_dir);
}

/* The secret (once per process) and the options that make the ps use it. */
static void set_secret(void) {
    if (!secret_path[0]) {
        snprintf(secret_dir, sizeof secret_dir, "/tmp/fuzz_ps_auth-XXXXXX");
        if (!mkdtemp(secret_dir)) {
            perror("fuzz_ps: mkdtemp");
            abort();
        }
        snprintf(secret_path, sizeof secret_path, "%s/secret", secret_dir);
        if (qr__write_secret_file(secret_path)) {
            fprintf(stderr, "fuzz_ps: cannot write a secret: %s\n", qr_last_error());
            abort();
        }
        atexit(remove_secret);
    }
    qr_config_set(fix.cfg, "secret-file", secret_path);
    qr_config_set(fix.cfg, "encrypt", "true");
    qr_config_set(fix.cfg, "handshake-timeout-ms", FUZZ_HANDSHAKE_MS);
    /* Few inputs here say HELLO as a worker (only sealed ones can), so the
     * ps would soon find no worker connected for restart-wait-ms and end
     * the run (src/ps/liveness.c), which is no finding. */
    qr_config_set(fix.cfg, "restart-wait-ms", "86400000");
}

/* This harness's credentials: the secret bound to the new ps's spec. */
static void make_auth(void) {
    qr_cluster *cl = fix_spec(&fix, "worker", 0);
    char *spec = cl ? qr__cluster_spec_text(cl) : NULL;
    uint8_t secret[QR_SECRET_MAX_BYTES + 2];
    size_t len = 0;
    qr_auth_free(auth);
    auth = NULL;
    if (!spec || qr__read_secret_file(secret_path, secret, &len) ||
        qr_auth_new(secret, len, spec, true, &auth)) {
        fprintf(stderr, "fuzz_ps: cannot make credentials: %s\n", qr_last_error());
        abort();
    }
    free(spec);
    qr_cluster_free(cl);
}
#endif

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
#ifdef FUZZ_AUTH
    set_secret();
#endif
    if (fix_start_ps(&fix, 0)) {
        fprintf(stderr, "fuzz_ps: cannot start the ps: %s\n", qr_last_error());
        abort();
    }
#ifdef FUZZ_AUTH
    make_auth();
#endif
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

/* Send the bytes on fd while reading whatever comes back (a ps answers as
 * it reads, and a full socket both ways would stall us both), then
 * half-close and read until the ps closes or goes quiet. hold: do not
 * half-close, and the ps must close the connection itself in time. */
static void pump(int fd, const uint8_t *data, size_t size, bool hold) {
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
    if (!hold) shutdown(fd, SHUT_WR);
    while (open) {
        if (!fuzz_wait(fd, POLLIN, FUZZ_TIMEOUT_MS)) {
            if (!hold) break;
            fprintf(stderr, "fuzz_ps: the ps kept a connection open %d ms, past its handshake "
                    "deadline\n", FUZZ_TIMEOUT_MS);
            abort();
        }
        open = read(fd, sink, sizeof sink) > 0;
    }
    close(fd);
}

#ifdef FUZZ_AUTH
/* An authenticated connection, as a worker of the job opens it. */
typedef struct session {
    int fd;
    qr_sealer tx, rx;
} session;

static bool open_session(session *s, bool offer_aes) {
    s->fd = connect_ps();
    if (s->fd < 0) return false;
    qr_handshake hs;
    qr_handshake_start(&hs, auth, false);
    uint8_t hello[QR_HS_HELLO_LEN], msg[QR_HS_CHALLENGE_LEN], out[QR_HS_MAX_LEN];
    size_t out_len = 0;
    qr_handshake_hello(&hs, hello);
    if (!offer_aes) { /* as a worker on a CPU without AES in hardware would */
        hello[5] &= (uint8_t)~2u;
        hs.transcript[5] = hello[5];
    }
    bool ok = fuzz_send_all(s->fd, hello, sizeof hello) &&
              fuzz_read_n(s->fd, msg, QR_HS_CHALLENGE_LEN, FUZZ_TIMEOUT_MS) &&
              qr_handshake_step(&hs, msg, QR_HS_CHALLENGE_LEN, out, &out_len) == QR_OK &&
              fuzz_send_all(s->fd, out, out_len) &&
              fuzz_read_n(s->fd, msg, QR_HS_RESULT_LEN, FUZZ_TIMEOUT_MS) &&
              qr_handshake_step(&hs, msg, QR_HS_RESULT_LEN, out, &out_len) == QR_OK &&
              hs.state == QR_HS_DONE && hs.encrypt;
    if (ok) {
        qr_sealer_init(&s->tx, hs.aes, hs.key_tx);
        qr_sealer_init(&s->rx, hs.aes, hs.key_rx);
    } else {
        fprintf(stderr, "fuzz_ps: handshake: %s\n", qr_last_error());
        close(s->fd);
    }
    qr_handshake_clear(&hs);
    return ok;
}

/* Read sealed records until n bytes of plaintext are in (the rest of the
 * last record is dropped). */
static bool read_sealed(session *s, uint8_t *out, size_t n) {
    static uint8_t rec[QR_SEAL_OVERHEAD + QR_SEAL_MAX_RECORD];
    while (n) {
        if (!fuzz_read_n(s->fd, rec, QR_SEAL_LEN_BYTES, FUZZ_TIMEOUT_MS)) return false;
        uint32_t len = qr_seal_record_len(rec);
        if (!len || !fuzz_read_n(s->fd, rec + QR_SEAL_LEN_BYTES, QR_SEAL_OVERHEAD -
                                 QR_SEAL_LEN_BYTES + len, FUZZ_TIMEOUT_MS) ||
            qr_unseal(&s->rx, rec, len))
            return false;
        size_t k = QR_MIN(n, (size_t)len);
        memcpy(out, rec + QR_SEAL_LEN_BYTES, k);
        out += k;
        n -= k;
    }
    return true;
}

static void send_input(const uint8_t *data, size_t size) {
    if (!size) return;
    int mode = data[0] & 7;
    bool offer_aes = !(data[0] & 8);
    if (mode > 4) mode = 1;
    data++, size--;
    session s;
    if (mode == 0 || mode == 4) {
        int fd = connect_ps();
        if (fd >= 0) pump(fd, data, size, mode == 4);
    } else if (mode == 3) {
        qr_handshake hs;
        qr_handshake_start(&hs, auth, false);
        uint8_t *wire = malloc(QR_HS_HELLO_LEN + size);
        qr_handshake_hello(&hs, wire);
        if (size) memcpy(wire + QR_HS_HELLO_LEN, data, size);
        int fd = connect_ps();
        if (fd >= 0) pump(fd, wire, QR_HS_HELLO_LEN + size, false);
        free(wire);
    } else if (open_session(&s, offer_aes)) {
        if (mode == 2) {
            pump(s.fd, data, size, false);
            return;
        }
        size_t chunk = size ? (size_t)data[0] + 1 : 1;
        if (size) data++, size--;
        uint8_t *wire = malloc(qr_sealed_size(size) + QR_SEAL_OVERHEAD * size + 1);
        size_t at = 0;
        for (size_t i = 0; i < size; i += chunk)
            at += qr_seal(&s.tx, data + i, QR_MIN(chunk, size - i), wire + at);
        pump(s.fd, wire, at, false);
        free(wire);
    }
    /* (a failed handshake: the liveness check decides) */
}
#else
/* Send the input on a fresh connection (pump). */
static void send_input(const uint8_t *data, size_t size) {
    int fd = connect_ps();
    if (fd < 0) return; /* the ps is stopping: the liveness check decides */
    pump(fd, data, size, false);
}
#endif

/* Does the ps answer a STEP request? (fuzz_ps_auth: on a connection
 * that authenticates, and sealed) */
static bool ps_answers(void) {
    qr_frame f = {.type = QR_MSG_STEP, .request_id = 7};
    uint8_t req[QR_PROTO_ALIGN] = {0}, rep[QR_PROTO_HEADER_LEN]; /* header and its pad */
    qr_proto_encode_header(&f, req);
#ifdef FUZZ_AUTH
    session s;
    if (!open_session(&s, true)) return false;
    int fd = s.fd;
    uint8_t sealed[sizeof req + QR_SEAL_OVERHEAD];
    bool ok = fuzz_send_all(fd, sealed, qr_seal(&s.tx, req, sizeof req, sealed)) &&
              read_sealed(&s, rep, sizeof rep);
    qr_sealer_clear(&s.tx);
    qr_sealer_clear(&s.rx);
#else
    int fd = connect_ps();
    if (fd < 0) return false;
    bool ok = fuzz_send_all(fd, req, sizeof req) &&
              fuzz_read_n(fd, rep, sizeof rep, FUZZ_TIMEOUT_MS);
#endif
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

/* End the running ps, so that the next input gets a new one. */
static void stop_cluster(void) {
    qr_ps_stop(fix.ps[0]);
    pthread_join(fix.thread[0], NULL);
    qr_ps_free(fix.ps[0]);
    qr_config_free(fix.cfg);
    running = false;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *keep = getenv("FUZZ_KEEP_STATE");
    keep_state = keep && keep[0] && strcmp(keep, "0");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!running) start_cluster();
    send_input(data, size);
    if (ps_answers()) {
        if (!keep_state) stop_cluster();
        return 0;
    }
    if (ps_stopped_cleanly()) return 0; /* a STOP in the input: next input gets a new ps */
    fprintf(stderr, "fuzz_ps: the ps no longer answers STEP after this input\n");
    abort();
}

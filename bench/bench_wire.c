/*
 * bench_wire.c - `quorum bench wire`: dense push, pull and push+pull
 * throughput and per-request latency of quorum, each figure beside a
 * raw-socket baseline that moves the same bytes over the same kind of
 * socket in the same run.
 *
 * Everything runs in this one process. For each topology (transport, P ps
 * tasks, W workers):
 *
 *   quorum    P ps tasks, each a qr_ps served by its own thread on a free
 *             loopback port, and W worker handles, each driven by its own
 *             thread. A tensor of S bytes is P variables of S/P bytes, one
 *             per ps (greedy placement), so one request is spread over
 *             every ps as a sharded model is. A push is applied with SGD on
 *             the ps (lr 1e-9): that is part of what a push costs.
 *   baseline  P raw server threads and W raw client threads with one
 *             socket from every client to every server, the same socket
 *             options as quorum's (4096 KiB SO_SNDBUF/SO_RCVBUF,
 *             TCP_NODELAY) and the same message pattern: a push sends a
 *             16-byte header and S/P bytes to each server and reads an
 *             8-byte ack from each; a pull sends a header and reads S/P
 *             bytes from each. With one server a client is a plain blocking
 *             send/receive loop; with several it sends to all and receives
 *             from all at once with poll(), the parallelism quorum has. A
 *             server serving one client is a blocking loop; serving several
 *             it waits for the next request with poll(). With
 *             --baseline-apply the server also applies SGD to each push
 *             before its ack, so the ratio shows what quorum costs beyond
 *             the work any ps must do (the targets stay against the plain
 *             loop).
 *
 * A round of a point (size, op) runs one warm-up op per worker, then every
 * worker repeats the op until --seconds have passed and it has done at
 * least 3. GB/s = payload bytes moved by all workers (push S, pull S,
 * push+pull 2S per op) / wall time from the first start to the last
 * finish; latency is the mean time of one op as a worker sees it. Rounds
 * alternate baseline and quorum (--repeat of each, at most 2 for push and
 * pull from 16 MiB on, back to back, so both see the same machine) and
 * each side reports its fastest round: the 2 cores are shared, and the
 * best round is the least disturbed one. Many short rounds beat a few long ones here: on
 * this VM one 30 ms round of the same point varies 2x with scheduling,
 * while the best of 10 such rounds moved by under 10% between groups of
 * rounds (measured: 1 MiB push+pull, ratios 0.80-0.85 across four groups
 * of ten).
 *
 * --auth and --encrypt measure the price of a cluster secret (wire/auth.h,
 * wire/seal.h). Each topology then also runs a second (third) set of ps
 * tasks and workers given a secret, made for the run in a private temp
 * directory: --auth authenticates every connection and sends messages in
 * the clear, --encrypt seals every message in AEAD records (and gives up
 * the splice path). Their rounds join the same alternation (baseline,
 * quorum, quorum with a secret, quorum encrypted), so all sides see the
 * same machine, and each point shows them beside plain quorum with their
 * ratio. Authentication costs nothing per message once the handshake is
 * done, so its ratio should be 1.0 within noise; encryption's is set
 * against a goal (push+pull >= 1 MiB at ENCRYPT_GOAL of plain at least).
 * The handshake is paid once per connection, and timed apart: N fresh
 * connections to ps 0 of each kind, interleaved, each a connect, the
 * handshake (auth.h's pure API over a blocking socket, as the worker's
 * heartbeat drives it) and one STEP round trip, the smallest request. The
 * medians, and their difference, are its cost per connection.
 */
#include "bench/bench.h"

#include "cluster/cluster.h"
#include "cluster/placement.h"
#include "common/common.h"
#include "common/addr.h"
#include "common/cpu.h"
#include "optim/optim_internal.h"
#include "wire/auth.h"
#include "wire/proto.h"
#include "wire/seal.h"
#include "wire/secret.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h> /* mallinfo2: the ps tasks' memory with --ps-replicas 2 */
#endif

enum { T_UNIX, T_TCP, NTRANSPORTS };
static const char *const transport_names[NTRANSPORTS] = {"unix", "tcp"};
/* fused: qr_worker_push_pull, one request per ps that pushes and brings the
 * values back; its baseline does the same on raw sockets (a push whose
 * reply is the piece), ps-lite's ZPushPull pattern. pipelined: PIPELINE
 * pushes and pulls in flight at once per worker (qr_worker_push_start,
 * qr_worker_pull_start, then the waits: ps-lite's ZPush/ZPull and Wait);
 * one op is that batch, and its baseline the raw push+pull one at a time. */
enum { OP_PUSH, OP_PULL, OP_PUSHPULL, OP_FUSED, OP_PIPELINED, NOPS };
static const char *const op_names[NOPS] = {"push", "pull", "pushpull", "fused", "pipelined"};
#define PIPELINE 16

#define MAX_SIZES 16
#define MAX_PS 8
#define MAX_WORKERS 16
#define MAX_LIST 8
#define MIN_OPS 3
#define MAX_SIZE (1ull << 30)
/* Every blocking wait (a raw reply, a quorum request) gives up after this,
 * so a broken run ends with an error instead of hanging. */
#define IO_TIMEOUT_MS 30000
/* quorum's default socket-buffer-kb; the baseline sets the same. */
#define SOCKET_BUFFER_BYTES (4096 * 1024)
/* From this size on a push or pull point gets at most LARGE_ROUNDS rounds:
 * 3 ops per worker already take tens to hundreds of ms. Push+pull, whose
 * ratio is the target, keeps every round: with 2 rounds one disturbed
 * round decides the point (16 MiB ratios moved between 0.72 and 1.11 from
 * one run to the next). */
#define LARGE_SIZE (16ull << 20)
#define LARGE_ROUNDS 2
#define TARGET_PUSHPULL_RATIO 0.8
#define TARGET_LATENCY_RATIO 1.5
/* --encrypt: push+pull of 1 MiB and more, encrypted, at this much of plain
 * quorum's GB/s at least (issue 18). */
#define ENCRYPT_GOAL 0.5
/* Fresh connections of each kind timed for the handshake's cost. */
#define CONNECTIONS 200
#define QUICK_CONNECTIONS 50

/* The quorum sides of a run: plain, with --auth and --encrypt a cluster
 * secret without and with encryption, and with --ps-replicas 2 two copies
 * of every shard (issue 29: each push forwarded to the backup ps and
 * answered once the backup applied it). */
enum { V_PLAIN, V_AUTH, V_ENCRYPT, V_REPLICAS, NVARIANTS };
static const char *const variant_names[NVARIANTS] = {"quorum", "quorum with a secret",
                                                     "quorum encrypted",
                                                     "quorum with two copies"};
/* --ps-replicas 2: two copies at this much of one copy's GB/s at least
 * (issue 29: at most 15% slower). */
#define REPLICAS_GOAL 0.85

typedef struct opts {
    uint64_t sizes[MAX_SIZES];
    int nsizes;
    int transports[NTRANSPORTS];
    int ntransports;
    int ps[MAX_LIST];
    int nps;
    int workers[MAX_LIST];
    int nworkers;
    int ops[NOPS];
    int nops;
    double seconds;
    int repeat;
    bool json;
    bool baseline_apply; /* the raw server also applies SGD to each push */
    bool variants[NVARIANTS]; /* the quorum sides measured: plain always */
    int connections;          /* per kind, for the handshake's cost */
    char secret_path[256];    /* the run's secret file, with --auth or --encrypt */
    char repl_lag[24];        /* --replication-lag of the two-copy side ("0": none) */
} opts;

typedef struct meas {
    double gbps, latency_us;
    uint64_t ops;
} meas;

typedef struct point {
    int transport, op, nps, nworkers;
    uint64_t size;
    const char *used; /* socket kind quorum's connections actually had */
    meas q, raw;
    meas auth, enc; /* --auth, --encrypt */
    meas repl;      /* --ps-replicas 2 */
} point;

/* --ps-replicas 2: what the ps tasks of each side held at the end of a
 * topology (bytes malloc'd, counted as they are freed when the side
 * stops: values, slots, spare tensors, queues; the workers are stopped
 * first), beside the bytes of the variables themselves. */
typedef struct mem_point {
    int transport, nps, nworkers;
    uint64_t var_bytes;          /* every variable of the topology, one copy */
    int64_t held[NVARIANTS];     /* by the side's nps ps tasks together; -1: unknown */
} mem_point;

/* The cost of a connection (connect, handshake if any, one STEP round
 * trip) of each quorum side: the median over opts.connections. */
typedef struct conn_cost {
    bool have;
    double us[NVARIANTS];
    double compute_us;  /* one handshake's computation, both sides, in memory */
    const char *cipher; /* the encrypted sessions' */
} conn_cost;

/* ------------------------------------------------------------------------ */
/* Driving W worker threads through the points of a topology.              */
/* ------------------------------------------------------------------------ */

typedef struct driver driver;

typedef struct wslot {
    driver *d;
    int index;
    pthread_t tid;
    void *state; /* the quorum or raw worker's own state */
    uint64_t ops, busy_ns, t_start, t_end;
    int rc;
    char err[512];
} wslot;

/* The main thread posts a command (a point, or quit) and meets the
 * workers at three barriers per point: command posted, all warmed up, all
 * finished. Only the main thread writes the command, between barriers. */
struct driver {
    int nworkers;
    pthread_barrier_t bar;
    int size_idx, op;
    double seconds;
    bool quit;
    void *ctx;
    int (*setup)(wslot *s);
    int (*run_op)(wslot *s, int size_idx, int op);
    void (*teardown)(wslot *s);
    wslot slots[MAX_WORKERS];
    int nstarted;
};

static void wait_barrier(driver *d) {
    pthread_barrier_wait(&d->bar);
}

static void *worker_thread(void *arg) {
    wslot *s = arg;
    driver *d = s->d;
    s->rc = d->setup(s);
    wait_barrier(d); /* set up */
    for (;;) {
        wait_barrier(d); /* command posted */
        if (d->quit) break;
        s->ops = s->busy_ns = 0;
        if (!s->rc) s->rc = d->run_op(s, d->size_idx, d->op); /* warm-up */
        wait_barrier(d);                                      /* all warm */
        s->t_start = qr__now_ns();
        uint64_t deadline = s->t_start + (uint64_t)(d->seconds * 1e9);
        while (!s->rc) {
            uint64_t t0 = qr__now_ns();
            s->rc = d->run_op(s, d->size_idx, d->op);
            uint64_t t1 = qr__now_ns();
            s->ops++;
            s->busy_ns += t1 - t0;
            if (t1 >= deadline && s->ops >= MIN_OPS) break;
        }
        s->t_end = qr__now_ns();
        wait_barrier(d); /* all finished */
    }
    d->teardown(s);
    return NULL;
}

/* First failure of any worker, reported with its message. */
static int driver_check(driver *d, const char *what) {
    for (int i = 0; i < d->nworkers; i++)
        if (d->slots[i].rc) {
            fprintf(stderr, "bench wire: %s worker %d: %s\n", what, i, d->slots[i].err);
            return d->slots[i].rc;
        }
    return QR_OK;
}

/* Start the worker threads and wait until each has set itself up. */
static int driver_start(driver *d, int nworkers, void *ctx, const char *what) {
    d->nworkers = nworkers;
    d->ctx = ctx;
    d->quit = false;
    d->nstarted = 0;
    if (pthread_barrier_init(&d->bar, NULL, (unsigned)nworkers + 1)) {
        fprintf(stderr, "bench wire: pthread_barrier_init failed\n");
        return QR_EINTERNAL;
    }
    for (int i = 0; i < nworkers; i++) {
        wslot *s = &d->slots[i];
        memset(s, 0, sizeof *s);
        s->d = d;
        s->index = i;
    }
    for (int i = 0; i < nworkers; i++) {
        if (pthread_create(&d->slots[i].tid, NULL, worker_thread, &d->slots[i])) {
            /* The barrier counts on every thread: without all of them the
             * ones started would wait forever, so this is fatal. */
            fprintf(stderr, "bench wire: cannot start a worker thread\n");
            abort();
        }
        d->nstarted++;
    }
    wait_barrier(d);
    return driver_check(d, what);
}

static void driver_stop(driver *d) {
    if (!d->nstarted) return;
    d->quit = true;
    wait_barrier(d);
    for (int i = 0; i < d->nstarted; i++) pthread_join(d->slots[i].tid, NULL);
    pthread_barrier_destroy(&d->bar);
    d->nstarted = 0;
}

static int driver_measure(driver *d, int size_idx, int op, double seconds, uint64_t size,
                          const char *what, meas *m) {
    d->size_idx = size_idx;
    d->op = op;
    d->seconds = seconds;
    wait_barrier(d); /* command posted */
    wait_barrier(d); /* all warm */
    wait_barrier(d); /* all finished */
    int rc = driver_check(d, what);
    if (rc) return rc;
    uint64_t first = UINT64_MAX, last = 0, ops = 0, busy = 0;
    for (int i = 0; i < d->nworkers; i++) {
        wslot *s = &d->slots[i];
        first = QR_MIN(first, s->t_start);
        last = QR_MAX(last, s->t_end);
        ops += s->ops;
        busy += s->busy_ns;
    }
    double per_op = op == OP_PUSHPULL || op == OP_FUSED ? 2.0 : op == OP_PIPELINED ? 2.0 * PIPELINE : 1.0;
    double bytes = (double)ops * (double)size * per_op;
    double elapsed = (double)(last - first) / 1e9;
    m->ops = ops;
    m->gbps = bytes / elapsed / 1e9;
    m->latency_us = (double)busy / (double)ops / 1e3;
    return QR_OK;
}

static void slot_fail(wslot *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void slot_fail(wslot *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------ */
/* Shared by both sides                                                     */
/* ------------------------------------------------------------------------ */

typedef struct topo {
    const opts *o;
    int transport, nps, nworkers;
    /* Read-only bytes every push sends (float 1e-3: finite, so the ps
     * applies them), at least the largest size. */
    const float *send;
    uint64_t max_piece; /* largest S/P */
} topo;

/* n free loopback TCP ports, distinct (all are held open until all are
 * known). */
static int free_ports(int n, int *ports) {
    int fds[2 * MAX_PS + MAX_WORKERS];
    int rc = QR_OK, nfds = 0;
    for (int i = 0; i < n && !rc; i++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            rc = qr__fail(QR_EIO, "socket: %s", strerror(errno));
            break;
        }
        fds[nfds++] = fd;
        if (bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len))
            rc = qr__fail(QR_EIO, "cannot find a free loopback port: %s", strerror(errno));
        else
            ports[i] = ntohs(a.sin_port);
    }
    for (int i = 0; i < nfds; i++) close(fds[i]);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* quorum                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct qside {
    topo *t;
    char ps_addr[MAX_PS][32]; /* for the handshake's timing */
    qr_config *cfg;
    qr_cluster *workers_spec;
    qr_ps *ps[MAX_PS];
    pthread_t ps_tid[MAX_PS];
    bool ps_running[MAX_PS];
    int ps_rc[MAX_PS];
    driver d;
} qside;

typedef struct qworker {
    qr_worker *w;
    int ids[MAX_SIZES][MAX_PS];
    const float *grads[MAX_SIZES][MAX_PS];
} qworker;

static void *ps_thread(void *arg) {
    qr_ps **slot = arg;
    int rc = qr_ps_run(*slot);
    if (rc) fprintf(stderr, "bench wire: ps: %s\n", qr_last_error());
    return NULL;
}

static void var_name(char *buf, size_t len, uint64_t size, int part) {
    snprintf(buf, len, "bench_%llu_part%d", (unsigned long long)size, part);
}

static int q_setup(wslot *s) {
    qside *q = s->d->ctx;
    topo *t = q->t;
    qworker *qw = calloc(1, sizeof *qw);
    if (!qw) {
        slot_fail(s, "out of memory");
        return QR_ENOMEM;
    }
    s->state = qw;
    int rc = qr_worker_create(&qw->w, q->workers_spec, s->index, q->cfg);
    for (int k = 0; k < t->o->nsizes && !rc; k++) {
        uint64_t piece = t->o->sizes[k] / (uint64_t)t->nps;
        for (int j = 0; j < t->nps && !rc; j++) {
            char name[64];
            var_name(name, sizeof name, t->o->sizes[k], j);
            int64_t shape[1] = {(int64_t)(piece / sizeof(float))};
            rc = qr_worker_declare(qw->w, name, 1, shape, "zeros", 0, -1.0f, &qw->ids[k][j]);
            qw->grads[k][j] = t->send + (uint64_t)j * piece / sizeof(float);
        }
    }
    /* Worker 0 (the chief) creates the variables; the others wait until it
     * has, inside qr_worker_initialize. */
    if (!rc) rc = qr_worker_initialize(qw->w);
    if (rc) slot_fail(s, "%s", qr_last_error());
    return rc;
}

static int q_run_op(wslot *s, int k, int op) {
    qworker *qw = s->state;
    int nps = ((qside *)s->d->ctx)->t->nps;
    int rc = QR_OK;
    if (op == OP_FUSED)
        rc = qr_worker_push_pull(qw->w, nps, qw->ids[k], qw->grads[k], NULL, 0, NULL);
    if (op == OP_PIPELINED) {
        qr_request *req[2 * PIPELINE];
        int started = 0;
        for (int i = 0; i < PIPELINE && !rc; i++) {
            rc = qr_worker_push_start(qw->w, nps, qw->ids[k], qw->grads[k], 0, &req[started]);
            if (!rc) started++;
            if (!rc) rc = qr_worker_pull_start(qw->w, nps, qw->ids[k], NULL, &req[started]);
            if (!rc) started++;
        }
        for (int i = 0; i < started; i++) { /* every handle is waited for, failed or not */
            int wrc = qr_request_wait(req[i], NULL);
            if (!rc) rc = wrc;
        }
    }
    if (op == OP_PUSH || op == OP_PUSHPULL)
        rc = qr_worker_push(qw->w, nps, qw->ids[k], qw->grads[k], 0, NULL);
    if (!rc && (op == OP_PULL || op == OP_PUSHPULL)) rc = qr_worker_pull(qw->w, nps, qw->ids[k], NULL);
    if (rc) slot_fail(s, "%s %s", op_names[op], qr_last_error());
    return rc;
}

static void q_teardown(wslot *s) {
    qworker *qw = s->state;
    if (!qw) return;
    qr_worker_free(qw->w);
    free(qw);
    s->state = NULL;
}

/* The variables of one size must land one per ps, or a request would not
 * be spread as described. Placement is greedy in declaration order, so
 * check with the same function the worker uses. */
static int check_placement(const topo *t) {
    int nvars = t->o->nsizes * t->nps;
    int64_t *bytes = calloc((size_t)nvars, sizeof *bytes);
    int *ps_of = calloc((size_t)nvars, sizeof *ps_of);
    int rc = bytes && ps_of ? QR_OK : qr__fail(QR_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < nvars; i++)
        bytes[i] = (int64_t)(t->o->sizes[i / t->nps] / (uint64_t)t->nps);
    if (!rc) rc = qr_place_greedy(t->nps, nvars, bytes, ps_of);
    for (int k = 0; !rc && k < t->o->nsizes; k++)
        for (int j = 0; !rc && j < t->nps; j++)
            for (int j2 = 0; j2 < j; j2++)
                if (ps_of[k * t->nps + j] == ps_of[k * t->nps + j2])
                    rc = qr__fail(QR_EINTERNAL, "placement put two parts of the %llu-byte "
                                  "tensor on ps %d", (unsigned long long)t->o->sizes[k],
                                  ps_of[k * t->nps + j]);
    free(bytes);
    free(ps_of);
    return rc;
}

static void q_stop(qside *q) {
    driver_stop(&q->d);
    for (int i = 0; i < MAX_PS; i++) {
        if (q->ps_running[i]) {
            qr_ps_stop(q->ps[i]);
            pthread_join(q->ps_tid[i], NULL);
            q->ps_running[i] = false;
        }
        qr_ps_free(q->ps[i]);
        q->ps[i] = NULL;
    }
    qr_cluster_free(q->workers_spec);
    q->workers_spec = NULL;
    qr_config_free(q->cfg);
    q->cfg = NULL;
}

/* Bytes malloc'd by this process now (-1 where the C library cannot say). */
static int64_t heap_in_use(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    struct mallinfo2 m = mallinfo2();
    return (int64_t)(m.uordblks + m.hblkhd);
#else
    return -1;
#endif
}

/* q_stop, returning what the side's ps tasks held: its workers are
 * stopped first, then the heap in use is read before and after the ps
 * tasks are freed (every other thread of the run is idle meanwhile). */
static int64_t q_stop_measured(qside *q) {
    driver_stop(&q->d);
    int64_t before = heap_in_use();
    q_stop(q);
    int64_t after = heap_in_use();
    return before < 0 || after < 0 ? -1 : before - after;
}

static int q_start(qside *q, topo *t, int variant) {
    memset(q, 0, sizeof *q);
    q->t = t;
    int rc = check_placement(t);
    int ports[MAX_PS + MAX_WORKERS];
    if (!rc) rc = free_ports(t->nps + t->nworkers, ports);
    char addrs[MAX_PS + MAX_WORKERS][32];
    const char *ps_addrs[MAX_PS], *worker_addrs[MAX_WORKERS];
    for (int i = 0; !rc && i < t->nps + t->nworkers; i++) {
        snprintf(addrs[i], sizeof addrs[i], "127.0.0.1:%d", ports[i]);
        if (i < t->nps) {
            ps_addrs[i] = addrs[i];
            snprintf(q->ps_addr[i], sizeof q->ps_addr[i], "%s", addrs[i]);
        } else {
            worker_addrs[i - t->nps] = addrs[i];
        }
    }
    /* "tcp" makes the ps listen on TCP only and the worker connect over TCP;
     * "unix" lets a worker use the Unix socket a loopback ps also serves. */
    const char *const settings[][2] = {
        {"transport", transport_names[t->transport]},
        {"optimizer", "sgd"},
        {"lr", "1e-9"},
        {"timeout-ms", "30000"},
        {"init-timeout-ms", "30000"},
        {"linger-ms", "100"},
    };
    if (!rc) rc = qr_config_new(&q->cfg);
    for (size_t i = 0; !rc && i < QR_ARRAY_LEN(settings); i++)
        rc = qr_config_set(q->cfg, settings[i][0], settings[i][1]);
    /* "none" even for plain quorum: a QUORUM_SECRET_FILE in the
     * environment must not turn the plain side into an authenticated one. */
    if (!rc)
        rc = qr_config_set(q->cfg, "secret-file",
                           variant == V_AUTH || variant == V_ENCRYPT ? t->o->secret_path
                                                                     : "none");
    if (!rc) rc = qr_config_set(q->cfg, "encrypt", variant == V_ENCRYPT ? "true" : "false");
    if (!rc) rc = qr_config_set(q->cfg, "ps-replicas", variant == V_REPLICAS ? "2" : "1");
    if (!rc && variant == V_REPLICAS) rc = qr_config_set(q->cfg, "replication-lag", t->o->repl_lag);
    for (int i = 0; !rc && i < t->nps; i++) {
        qr_cluster *spec = NULL;
        rc = qr_cluster_create(&spec, t->nps, ps_addrs, t->nworkers, worker_addrs, "ps", i);
        if (!rc) rc = qr_ps_create(&q->ps[i], spec, q->cfg);
        qr_cluster_free(spec);
        if (!rc && pthread_create(&q->ps_tid[i], NULL, ps_thread, &q->ps[i]))
            rc = qr__fail(QR_EINTERNAL, "cannot start a ps thread");
        if (!rc) q->ps_running[i] = true;
    }
    if (!rc)
        rc = qr_cluster_create(&q->workers_spec, t->nps, ps_addrs, t->nworkers, worker_addrs,
                               "worker", 0);
    if (rc) {
        fprintf(stderr, "bench wire: starting %s: %s\n", variant_names[variant], qr_last_error());
        q_stop(q);
        return rc;
    }
    q->d.setup = q_setup;
    q->d.run_op = q_run_op;
    q->d.teardown = q_teardown;
    rc = driver_start(&q->d, t->nworkers, q, variant_names[variant]);
    if (rc) q_stop(q);
    return rc;
}

/* The kind of socket quorum's connections actually use: count this
 * process's connected stream sockets by family (only quorum's exist when
 * this runs). */
static const char *socket_kind_in_use(void) {
    int nunix = 0, ninet = 0;
    for (int fd = 0; fd < 4096; fd++) {
        int domain, type, listening;
        socklen_t len = sizeof domain;
        if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len)) continue;
        len = sizeof type;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) || type != SOCK_STREAM) continue;
        len = sizeof listening;
        if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) || listening) continue;
        if (domain == AF_UNIX) nunix++;
        else if (domain == AF_INET || domain == AF_INET6) ninet++;
    }
    if (nunix && !ninet) return "unix";
    if (ninet && !nunix) return "tcp";
    return nunix ? "mixed" : "none";
}

/* ------------------------------------------------------------------------ */
/* Raw-socket baseline                                                      */
/* ------------------------------------------------------------------------ */

enum { RAW_PUSH = 1, RAW_PULL = 2, RAW_PUSHPULL = 3 };

typedef struct raw_header {
    uint32_t op;
    uint32_t zero;
    uint64_t len; /* push: payload bytes that follow; pull: bytes wanted */
} raw_header;

typedef struct rside rside;

typedef struct rserver {
    rside *r;
    int index;
    int listen_fd;
    char path[108]; /* Unix socket file, removed at the end */
    struct sockaddr_in addr;
    int fds[MAX_WORKERS];
    int nfds;
    uint8_t *rx, *tx;
    pthread_t tid;
    bool running;
    char err[256];
} rserver;

struct rside {
    topo *t;
    rserver servers[MAX_PS];
    driver d;
};

typedef struct rclient {
    int fds[MAX_PS];
    uint8_t *rx;
} rclient;

static void tune_raw_socket(int fd, int transport) {
    int size = SOCKET_BUFFER_BYTES, one = 1;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    if (transport == T_TCP) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Blocking full read / write; errno describes a failure, 0 = peer closed. */
static int read_full(int fd, void *buf, size_t len) {
    uint8_t *p = buf;
    while (len) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (n == 0) errno = 0;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int writev_full(int fd, struct iovec *iov, int niov) {
    while (niov) {
        ssize_t n = writev(fd, iov, niov);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        while (niov && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++;
            niov--;
        }
        if (niov) {
            iov->iov_base = (uint8_t *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    return 0;
}

/* --baseline-apply: what any parameter server must do with a pushed
 * gradient, built like quorum's optimizer loops (optim_internal.h). */
QR_OPTIM_LOOP static void raw_sgd(float *restrict w, const float *restrict g, uint64_t n,
                                  float lr) {
    for (uint64_t i = 0; i < n; i++) w[i] -= lr * g[i];
}

/* Read one request from fd and answer it. 1 = served, 0 = peer closed,
 * -1 = error (in s->err). */
static int serve_one(rserver *s, int fd) {
    raw_header h;
    if (read_full(fd, &h, sizeof h)) {
        if (errno == 0) return 0;
        snprintf(s->err, sizeof s->err, "read: %s", strerror(errno));
        return -1;
    }
    if (h.op < RAW_PUSH || h.op > RAW_PUSHPULL || h.zero || h.len > s->r->t->max_piece) {
        snprintf(s->err, sizeof s->err, "bad request header");
        return -1;
    }
    uint64_t ack = 1;
    struct iovec iov;
    if (h.op == RAW_PUSH || h.op == RAW_PUSHPULL) {
        if (read_full(fd, s->rx, h.len)) {
            snprintf(s->err, sizeof s->err, "read: %s", errno ? strerror(errno) : "peer closed");
            return -1;
        }
        if (s->r->t->o->baseline_apply)
            raw_sgd((float *)s->tx, (const float *)s->rx, h.len / sizeof(float), 1e-9f);
        iov = h.op == RAW_PUSH ? (struct iovec){&ack, sizeof ack} : (struct iovec){s->tx, h.len};
    } else {
        iov = (struct iovec){s->tx, h.len};
    }
    if (writev_full(fd, &iov, 1)) {
        snprintf(s->err, sizeof s->err, "write: %s", strerror(errno));
        return -1;
    }
    return 1;
}

static void *server_thread(void *arg) {
    rserver *s = arg;
    topo *t = s->r->t;
    /* Accept every client first (they connect while setting up). */
    while (s->nfds < t->nworkers) {
        struct pollfd p = {.fd = s->listen_fd, .events = POLLIN};
        int n = poll(&p, 1, IO_TIMEOUT_MS);
        if (n < 0 && errno == EINTR) continue;
        int fd = n > 0 ? accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC) : -1;
        if (fd < 0) {
            snprintf(s->err, sizeof s->err, "accept: %s", n == 0 ? "timed out" : strerror(errno));
            goto out;
        }
        tune_raw_socket(fd, t->transport);
        s->fds[s->nfds++] = fd;
    }
    if (s->nfds == 1) {
        /* One client: the plain blocking loop. */
        while (serve_one(s, s->fds[0]) > 0) {
        }
        goto out;
    }
    /* Several clients: wait for the next request with poll, serve it with
     * blocking reads and writes (a client sends a request whole). */
    struct pollfd pfds[MAX_WORKERS];
    int open = s->nfds;
    for (int i = 0; i < s->nfds; i++) pfds[i] = (struct pollfd){.fd = s->fds[i], .events = POLLIN};
    while (open > 0) {
        int n = poll(pfds, (nfds_t)s->nfds, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            snprintf(s->err, sizeof s->err, "poll: %s", strerror(errno));
            goto out;
        }
        for (int i = 0; i < s->nfds; i++) {
            if (pfds[i].fd < 0 || !pfds[i].revents) continue;
            int r = serve_one(s, pfds[i].fd);
            if (r < 0) goto out;
            if (r == 0) {
                pfds[i].fd = -1;
                open--;
            }
        }
    }
out:
    if (s->err[0]) fprintf(stderr, "bench wire: raw server %d: %s\n", s->index, s->err);
    for (int i = 0; i < s->nfds; i++) close(s->fds[i]);
    s->nfds = 0;
    return NULL;
}

static int raw_connect(rside *r, int server) {
    topo *t = r->t;
    rserver *s = &r->servers[server];
    int fd = socket(t->transport == T_UNIX ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct timeval tv = {.tv_sec = IO_TIMEOUT_MS / 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int rc;
    if (t->transport == T_UNIX) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%s", s->path);
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    } else {
        rc = connect(fd, (struct sockaddr *)&s->addr, sizeof s->addr);
    }
    if (rc) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    /* Set after connect, as quorum's transport does. */
    tune_raw_socket(fd, t->transport);
    if (t->nps > 1) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

static int r_setup(wslot *s) {
    rside *r = s->d->ctx;
    rclient *c = calloc(1, sizeof *c);
    if (!c) {
        slot_fail(s, "out of memory");
        return QR_ENOMEM;
    }
    s->state = c;
    for (int j = 0; j < MAX_PS; j++) c->fds[j] = -1;
    c->rx = qr__aligned_alloc(r->t->max_piece * (uint64_t)r->t->nps);
    if (!c->rx) {
        slot_fail(s, "out of memory");
        return QR_ENOMEM;
    }
    memset(c->rx, 1, r->t->max_piece * (uint64_t)r->t->nps); /* fault the pages in */
    for (int j = 0; j < r->t->nps; j++) {
        c->fds[j] = raw_connect(r, j);
        if (c->fds[j] < 0) {
            slot_fail(s, "raw connect to server %d: %s", j, strerror(errno));
            return QR_EIO;
        }
    }
    return QR_OK;
}

/* One exchange with every server: send hdr (+ payload for a push) to each,
 * then receive each reply. One server: blocking calls. Several: all at
 * once, non-blocking sockets driven by poll. */
typedef struct xfer {
    struct iovec out[2];
    int nout;
    uint8_t *in;
    size_t in_left;
} xfer;

static int send_some(int fd, xfer *x) {
    ssize_t n = writev(fd, x->out, x->nout);
    if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
    while (x->nout && (size_t)n >= x->out[0].iov_len) {
        n -= (ssize_t)x->out[0].iov_len;
        x->out[0] = x->out[1];
        x->nout--;
    }
    if (x->nout) {
        x->out[0].iov_base = (uint8_t *)x->out[0].iov_base + n;
        x->out[0].iov_len -= (size_t)n;
    }
    return 0;
}

static int recv_some(int fd, xfer *x) {
    ssize_t n = read(fd, x->in, x->in_left);
    if (n == 0) {
        errno = ECONNRESET;
        return -1;
    }
    if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
    x->in += n;
    x->in_left -= (size_t)n;
    return 0;
}

static int exchange(const int *fds, int n, xfer *x) {
    if (n == 1) {
        if (writev_full(fds[0], x[0].out, x[0].nout)) return -1;
        if (read_full(fds[0], x[0].in, x[0].in_left)) {
            if (errno == 0) errno = ECONNRESET;
            return -1;
        }
        return 0;
    }
    int pending = 0;
    for (int j = 0; j < n; j++) {
        if (send_some(fds[j], &x[j])) return -1;
        pending += x[j].nout > 0 || x[j].in_left > 0;
    }
    struct pollfd pfds[MAX_PS];
    while (pending) {
        for (int j = 0; j < n; j++) {
            pfds[j].fd = x[j].nout || x[j].in_left ? fds[j] : -1;
            pfds[j].events = x[j].nout ? POLLOUT : POLLIN;
            pfds[j].revents = 0;
        }
        int rc = poll(pfds, (nfds_t)n, IO_TIMEOUT_MS);
        if (rc < 0 && errno == EINTR) continue;
        if (rc <= 0) {
            if (rc == 0) errno = ETIMEDOUT;
            return -1;
        }
        pending = 0;
        for (int j = 0; j < n; j++) {
            if (pfds[j].revents) {
                if (x[j].nout ? send_some(fds[j], &x[j]) : recv_some(fds[j], &x[j])) return -1;
            }
            pending += x[j].nout > 0 || x[j].in_left > 0;
        }
    }
    return 0;
}

static int r_run_op(wslot *s, int k, int op) {
    rside *r = s->d->ctx;
    rclient *c = s->state;
    topo *t = r->t;
    uint64_t piece = t->o->sizes[k] / (uint64_t)t->nps;
    raw_header hdr[MAX_PS];
    xfer x[MAX_PS];
    uint64_t acks[MAX_PS];
    /* The pipelined op's baseline: PIPELINE raw push+pull pairs. */
    for (int rep = 0; rep < (op == OP_PIPELINED ? PIPELINE : 1); rep++) {
    if (op == OP_PUSH || op == OP_PUSHPULL || op == OP_PIPELINED) {
        for (int j = 0; j < t->nps; j++) {
            hdr[j] = (raw_header){.op = RAW_PUSH, .len = piece};
            x[j] = (xfer){.nout = 2, .in = (uint8_t *)&acks[j], .in_left = sizeof acks[j]};
            x[j].out[0] = (struct iovec){&hdr[j], sizeof hdr[j]};
            x[j].out[1] = (struct iovec){(uint8_t *)t->send + (uint64_t)j * piece, piece};
        }
        if (exchange(c->fds, t->nps, x)) {
            slot_fail(s, "raw push: %s", strerror(errno));
            return QR_EIO;
        }
    }
    if (op == OP_FUSED) {
        for (int j = 0; j < t->nps; j++) {
            hdr[j] = (raw_header){.op = RAW_PUSHPULL, .len = piece};
            x[j] = (xfer){.nout = 2, .in = c->rx + (uint64_t)j * piece, .in_left = piece};
            x[j].out[0] = (struct iovec){&hdr[j], sizeof hdr[j]};
            x[j].out[1] = (struct iovec){(uint8_t *)t->send + (uint64_t)j * piece, piece};
        }
        if (exchange(c->fds, t->nps, x)) {
            slot_fail(s, "raw fused push+pull: %s", strerror(errno));
            return QR_EIO;
        }
    }
    if (op == OP_PULL || op == OP_PUSHPULL || op == OP_PIPELINED) {
        for (int j = 0; j < t->nps; j++) {
            hdr[j] = (raw_header){.op = RAW_PULL, .len = piece};
            x[j] = (xfer){.nout = 1, .in = c->rx + (uint64_t)j * piece, .in_left = piece};
            x[j].out[0] = (struct iovec){&hdr[j], sizeof hdr[j]};
        }
        if (exchange(c->fds, t->nps, x)) {
            slot_fail(s, "raw pull: %s", strerror(errno));
            return QR_EIO;
        }
    }
    }
    return QR_OK;
}

static void r_teardown(wslot *s) {
    rclient *c = s->state;
    if (!c) return;
    for (int j = 0; j < MAX_PS; j++)
        if (c->fds[j] >= 0) close(c->fds[j]);
    free(c->rx);
    free(c);
    s->state = NULL;
}

static void r_stop(rside *r) {
    /* A server still waiting in accept (a client failed to connect) wakes
     * up when its listening socket is shut down. */
    for (int j = 0; j < MAX_PS; j++)
        if (r->servers[j].listen_fd >= 0) shutdown(r->servers[j].listen_fd, SHUT_RDWR);
    driver_stop(&r->d); /* clients close their sockets: the servers see EOF */
    for (int j = 0; j < MAX_PS; j++) {
        rserver *s = &r->servers[j];
        if (s->running) pthread_join(s->tid, NULL);
        s->running = false;
        if (s->listen_fd >= 0) close(s->listen_fd);
        s->listen_fd = -1;
        if (s->path[0]) unlink(s->path);
        s->path[0] = 0;
        free(s->rx);
        free(s->tx);
        s->rx = s->tx = NULL;
    }
}

static int r_listen(rside *r, rserver *s) {
    topo *t = r->t;
    s->listen_fd = socket(t->transport == T_UNIX ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s->listen_fd < 0) return qr__fail(QR_EIO, "socket: %s", strerror(errno));
    int rc;
    if (t->transport == T_UNIX) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(s->path, sizeof s->path, "/tmp/quorum-bench-wire-%d-%d.sock", (int)getpid(),
                 s->index);
        snprintf(a.sun_path, sizeof a.sun_path, "%s", s->path);
        unlink(s->path);
        rc = bind(s->listen_fd, (struct sockaddr *)&a, sizeof a);
    } else {
        int one = 1;
        setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        s->addr = (struct sockaddr_in){.sin_family = AF_INET,
                                       .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof s->addr;
        rc = bind(s->listen_fd, (struct sockaddr *)&s->addr, sizeof s->addr);
        if (!rc) rc = getsockname(s->listen_fd, (struct sockaddr *)&s->addr, &len);
    }
    if (!rc) rc = listen(s->listen_fd, 64);
    if (rc) return qr__fail(QR_EIO, "raw server %d: cannot listen: %s", s->index, strerror(errno));
    return QR_OK;
}

static int r_start(rside *r, topo *t) {
    memset(r, 0, sizeof *r);
    r->t = t;
    for (int j = 0; j < MAX_PS; j++) r->servers[j].listen_fd = -1;
    int rc = QR_OK;
    for (int j = 0; j < t->nps && !rc; j++) {
        rserver *s = &r->servers[j];
        s->r = r;
        s->index = j;
        s->rx = qr__aligned_alloc(t->max_piece);
        s->tx = qr__aligned_alloc(t->max_piece);
        if (!s->rx || !s->tx) {
            rc = QR_ENOMEM;
            break;
        }
        memset(s->rx, 1, t->max_piece); /* fault the pages in, as a ps's values are */
        memset(s->tx, 1, t->max_piece);
        rc = r_listen(r, s);
        if (!rc && pthread_create(&s->tid, NULL, server_thread, s))
            rc = qr__fail(QR_EINTERNAL, "cannot start a raw server thread");
        if (!rc) s->running = true;
    }
    if (rc) {
        fprintf(stderr, "bench wire: starting the baseline: %s\n", qr_last_error());
        r_stop(r);
        return rc;
    }
    r->d.setup = r_setup;
    r->d.run_op = r_run_op;
    r->d.teardown = r_teardown;
    rc = driver_start(&r->d, t->nworkers, r, "baseline");
    if (rc) r_stop(r);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* The handshake's cost per connection                                      */
/* ------------------------------------------------------------------------ */

/* One client connection to a ps, driven with blocking calls. */
typedef struct session {
    int fd;
    bool sealed;
    qr_sealer tx, rx;
    uint8_t *rec;             /* the last record read: QR_SEAL_OVERHEAD + QR_SEAL_MAX_RECORD */
    uint32_t rec_len, rec_at; /* its plaintext, and how much of it is taken */
} session;

/* Connect to ps 0 of q as its workers do: its Unix socket for "unix",
 * TCP with TCP_NODELAY for "tcp". -1 with errno on failure. */
static int ps0_connect(const qside *q) {
    qr_addr a;
    if (qr_addr_parse(q->ps_addr[0], &a)) {
        errno = EINVAL;
        return -1;
    }
    bool unix_socket = q->t->transport == T_UNIX;
    int fd = socket(unix_socket ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct timeval tv = {.tv_sec = IO_TIMEOUT_MS / 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int rc;
    if (unix_socket) {
        /* The Unix socket a ps on a loopback address also serves. */
        struct sockaddr_un un = {.sun_family = AF_UNIX};
        rc = qr_addr_local_unix_path(&a, un.sun_path, sizeof un.sun_path);
        if (rc) errno = EINVAL;
        else rc = connect(fd, (struct sockaddr *)&un, sizeof un);
    } else {
        struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a.port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        rc = connect(fd, (struct sockaddr *)&in, sizeof in);
        if (!rc) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int));
    }
    if (rc) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* MSG_NOSIGNAL: a ps that refuses us closes the connection. */
static int send_full(int fd, const uint8_t *p, size_t len) {
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int session_send(session *s, const uint8_t *p, size_t len) {
    if (!s->sealed) return send_full(s->fd, p, len);
    uint8_t sealed[256];
    if (qr_sealed_size(len) > sizeof sealed) return qr__fail(QR_EINTERNAL, "message too long");
    if (send_full(s->fd, sealed, qr_seal(&s->tx, p, len, sealed)))
        return qr__fail(QR_EIO, "send: %s", strerror(errno));
    return QR_OK;
}

/* len bytes of the stream the ps sends, opened record by record when
 * sealed. */
static int session_recv(session *s, uint8_t *p, size_t len) {
    while (len) {
        if (!s->sealed) {
            if (read_full(s->fd, p, len))
                return qr__fail(QR_EIO, "read: %s", errno ? strerror(errno) : "the ps closed");
            return QR_OK;
        }
        if (s->rec_at == s->rec_len) {
            if (read_full(s->fd, s->rec, QR_SEAL_LEN_BYTES))
                return qr__fail(QR_EIO, "read: %s", errno ? strerror(errno) : "the ps closed");
            uint32_t n = qr_seal_record_len(s->rec);
            if (!n) return qr__fail(QR_EPROTO, "a record of a bad length");
            if (read_full(s->fd, s->rec + QR_SEAL_LEN_BYTES, n + QR_SEAL_TAG_BYTES))
                return qr__fail(QR_EIO, "read: %s", errno ? strerror(errno) : "the ps closed");
            int rc = qr_unseal(&s->rx, s->rec, n);
            if (rc) return rc;
            s->rec_len = n;
            s->rec_at = 0;
        }
        size_t take = QR_MIN(len, (size_t)(s->rec_len - s->rec_at));
        memcpy(p, s->rec + QR_SEAL_LEN_BYTES + s->rec_at, take);
        s->rec_at += (uint32_t)take;
        p += take;
        len -= take;
    }
    return QR_OK;
}

/* The client's side of the handshake, as the worker's heartbeat runs it;
 * an encrypted session's sealers are set up at the end. */
static int session_handshake(session *s, const qr_auth *auth) {
    qr_handshake hs;
    qr_handshake_start(&hs, auth, false);
    uint8_t out[QR_HS_MAX_LEN], in[QR_HS_MAX_LEN];
    qr_handshake_hello(&hs, out);
    size_t out_len = QR_HS_HELLO_LEN;
    int rc = QR_OK;
    while (!rc && hs.state != QR_HS_DONE) {
        if (out_len && send_full(s->fd, out, out_len)) {
            rc = qr__fail(QR_EIO, "handshake: send: %s", strerror(errno));
            break;
        }
        size_t want = qr_handshake_want(&hs);
        if (read_full(s->fd, in, want)) {
            rc = qr__fail(QR_EIO, "handshake: read: %s", errno ? strerror(errno) : "the ps closed");
            break;
        }
        rc = qr_handshake_step(&hs, in, want, out, &out_len);
    }
    if (!rc && hs.encrypt) {
        qr_sealer_init(&s->tx, hs.aes, hs.key_tx);
        qr_sealer_init(&s->rx, hs.aes, hs.key_rx);
        s->sealed = true;
    }
    qr_handshake_clear(&hs);
    return rc;
}

/* STEP: the smallest request with a reply (32-byte header, padded to 64);
 * its reply is the global step. */
static int step_round_trip(session *s) {
    uint8_t msg[QR_PROTO_HEADER_LEN + QR_PROTO_ALIGN] = {0};
    qr_frame f = {.type = QR_MSG_STEP, .request_id = 1};
    qr_proto_encode_header(&f, msg);
    size_t len = QR_PROTO_HEADER_LEN + qr_proto_pad(QR_PROTO_HEADER_LEN);
    int rc = session_send(s, msg, len);
    if (!rc) rc = session_recv(s, msg, QR_PROTO_HEADER_LEN);
    qr_frame r;
    if (!rc) rc = qr_proto_decode_header(msg, 0, &r);
    if (!rc && (r.type != (QR_MSG_STEP | QR_MSG_REPLY) || r.request_id != 1 || r.status))
        rc = qr__fail(QR_EPROTO, "STEP: unexpected reply (type %u, status %d)", r.type, r.status);
    uint64_t rest = rc ? 0 : r.meta_len + qr_proto_pad(QR_PROTO_HEADER_LEN + (uint64_t)r.meta_len);
    if (rest > sizeof msg) rc = qr__fail(QR_EPROTO, "STEP: a reply of %u bytes of meta", r.meta_len);
    if (!rc) rc = session_recv(s, msg, rest);
    return rc;
}

/* One fresh connection to ps 0 of q, timed from before the connect to the
 * end of the STEP reply; the close is left out. */
static int one_connection(const qside *q, const qr_auth *auth, uint8_t *rec, uint64_t *ns,
                          const char **cipher) {
    session s = {.rec = rec};
    uint64_t t0 = qr__now_ns();
    s.fd = ps0_connect(q);
    int rc = s.fd < 0 ? qr__fail(QR_EIO, "connect: %s", strerror(errno)) : QR_OK;
    if (!rc && auth) rc = session_handshake(&s, auth);
    if (!rc) rc = step_round_trip(&s);
    *ns = qr__now_ns() - t0;
    if (s.sealed) {
        *cipher = qr_sealer_cipher(&s.tx);
        qr_sealer_clear(&s.tx);
        qr_sealer_clear(&s.rx);
    }
    if (s.fd >= 0) close(s.fd);
    return rc;
}

/* Both sides of one handshake in memory: what it costs apart from its
 * round trips. */
static int handshake_in_memory(const qr_auth *auth) {
    qr_handshake c, sv;
    qr_handshake_start(&c, auth, false);
    qr_handshake_start(&sv, auth, true);
    uint8_t a[QR_HS_MAX_LEN], b[QR_HS_MAX_LEN];
    size_t alen = QR_HS_HELLO_LEN, blen = 0;
    qr_handshake_hello(&c, a);
    int rc = QR_OK;
    while (!rc && c.state != QR_HS_DONE) {
        rc = qr_handshake_step(&sv, a, alen, b, &blen); /* CHALLENGE, then RESULT */
        if (!rc) rc = qr_handshake_step(&c, b, blen, a, &alen); /* PROOF, then done */
    }
    if (!rc && sv.state != QR_HS_DONE) rc = qr__fail(QR_EINTERNAL, "the server side is not done");
    qr_handshake_clear(&c);
    qr_handshake_clear(&sv);
    return rc;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Time n fresh connections to ps 0 of each quorum side,
 * interleaved one by one so every kind sees the same machine; the median
 * is the figure (a 2-core VM stalls the odd connection for milliseconds). */
static int measure_connections(qside *const q[NVARIANTS], int n, conn_cost *cost) {
    memset(cost, 0, sizeof *cost);
    qr_auth *auth[NVARIANTS] = {0};
    uint64_t *ns[NVARIANTS] = {0};
    uint8_t *rec = malloc(QR_SEAL_OVERHEAD + QR_SEAL_MAX_RECORD);
    int rc = rec ? QR_OK : qr__fail(QR_ENOMEM, "out of memory");
    /* The client's credentials from the same options and spec as the
     * side's workers (NULL for plain quorum: no secret). */
    for (int v = 0; v < NVARIANTS && !rc; v++) {
        if (!q[v] || v == V_REPLICAS) continue;
        rc = qr__auth_from_config(q[v]->cfg, q[v]->workers_spec, &auth[v]);
        ns[v] = calloc((size_t)n + 1, sizeof *ns[v]);
        if (!rc && !ns[v]) rc = qr__fail(QR_ENOMEM, "out of memory");
    }
    /* Round 0 warms up (first connection of a kind, page faults). */
    for (int i = 0; i <= n && !rc; i++)
        for (int v = 0; v < NVARIANTS && !rc; v++) {
            if (!q[v] || v == V_REPLICAS) continue;
            rc = one_connection(q[v], auth[v], rec, &ns[v][i], &cost->cipher);
            if (rc)
                fprintf(stderr, "bench wire: a connection to %s's ps 0: %s\n", variant_names[v],
                        qr_last_error());
        }
    for (int v = 0; v < NVARIANTS && !rc; v++) {
        if (!q[v] || v == V_REPLICAS) continue;
        qsort(ns[v] + 1, (size_t)n, sizeof *ns[v], cmp_u64);
        cost->us[v] = (n % 2 ? (double)ns[v][1 + n / 2]
                             : ((double)ns[v][n / 2] + (double)ns[v][1 + n / 2]) / 2) / 1e3;
    }
    const qr_auth *any = auth[V_AUTH] ? auth[V_AUTH] : auth[V_ENCRYPT];
    uint64_t t0 = qr__now_ns();
    for (int i = 0; i < n && !rc && any; i++) rc = handshake_in_memory(any);
    if (!rc) cost->compute_us = (double)(qr__now_ns() - t0) / n / 1e3;
    if (rc && any) fprintf(stderr, "bench wire: a handshake in memory: %s\n", qr_last_error());
    cost->have = !rc;
    for (int v = 0; v < NVARIANTS; v++) {
        qr_auth_free(auth[v]);
        free(ns[v]);
    }
    free(rec);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Command line                                                             */
/* ------------------------------------------------------------------------ */

static const uint64_t default_sizes[] = {64, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
static const uint64_t quick_sizes[] = {64, 64 << 10, 1 << 20};

static void usage(FILE *f) {
    fprintf(f,
            "usage: quorum bench wire [options]\n"
            "\n"
            "Dense push, pull and push+pull throughput (GB/s) and per-request latency of\n"
            "quorum, each beside a raw-socket baseline (plain blocking send/receive of the\n"
            "same bytes over the same kind of socket, same ps/worker topology) measured in\n"
            "the same run. ps tasks and workers are threads of this process on loopback.\n"
            "A tensor of SIZE bytes is split evenly over the ps tasks (one variable each).\n"
            "\n"
            "options:\n"
            "  --sizes LIST       tensor sizes, e.g. 64,4K,1M,64MiB (default:\n"
            "                     64,4KiB,64KiB,1MiB,16MiB,64MiB); each a multiple of 4 x ps\n"
            "  --transports LIST  unix,tcp (default: both)\n"
            "  --ps LIST          ps task counts, 1..%d (default: 1,2)\n"
            "  --workers LIST     worker counts, 1..%d (default: 1,2,4)\n"
            "  --ops LIST         push,pull,pushpull,fused,pipelined (default: all five);\n"
            "                     pushpull is a push then a pull, fused one\n"
            "                     qr_worker_push_pull (one round trip; its baseline pushes\n"
            "                     and reads back in one exchange too), pipelined 16 pushes\n"
            "                     and 16 pulls in flight (an op is that batch; baseline:\n"
            "                     16 raw push+pull pairs one at a time)\n"
            "  --seconds S        minimum time of one round of a point, per side (default:\n"
            "                     0.04); each worker also does at least %d ops after 1\n"
            "                     warm-up op\n"
            "  --repeat R         rounds per point, alternating baseline and quorum; each\n"
            "                     side reports its best round (default: 5); push and pull\n"
            "                     of 16 MiB and larger get at most %d (3 ops take long)\n"
            "  --quick            tiny grid for a smoke test: sizes 64,64KiB,1MiB, workers\n"
            "                     1,2, seconds 0.02, repeat 1, %d connections per kind for\n"
            "                     the handshake; with --auth or --encrypt, ps 2 only\n"
            "                     (later flags still apply)\n"
            "  --json             print one JSON object: {\"results\": [...], \"summary\": {...}}\n"
            "  --baseline-apply   the raw server also applies SGD to every push before its\n"
            "                     ack (pulls then send the updated values): the baseline\n"
            "                     becomes raw sockets plus the work any ps must do, and the\n"
            "                     ratio shows quorum's own overhead (not the targets' baseline)\n"
            "  --auth             also measure quorum with a cluster secret (a secret file\n"
            "                     made for the run in a private temp directory, removed at\n"
            "                     the end): every connection authenticated, messages in the\n"
            "                     clear. Its rounds alternate with the others; each point\n"
            "                     shows its GB/s and its ratio to plain quorum (goal: 1.0\n"
            "                     within noise). Also times %d fresh connections of each\n"
            "                     kind to ps 0 (connect, handshake, one STEP round trip)\n"
            "                     and prints the medians: the handshake's cost\n"
            "  --encrypt          the same with the secret and encrypt (every message sealed\n"
            "                     in AEAD records, no splice); goal: push+pull >= 1 MiB at\n"
            "                     %.1f of plain quorum's GB/s or more\n"
            "  --ps-replicas 2    also measure quorum with two copies of every shard (each\n"
            "                     push forwarded to the shard's backup on the next ps and\n"
            "                     answered once applied there): each point shows its GB/s,\n"
            "                     its ratio to one copy (goal: %.2f or more, at most 15%%\n"
            "                     slower) and its latency; at the end, the bytes the ps\n"
            "                     tasks held with one copy and two (mallinfo2). --ps\n"
            "                     defaults to 2 then, and 1 is refused. Async push/pull\n"
            "                     only: this benchmark has no sync step (sync with two\n"
            "                     copies: bench/python/bench_replicas.py --mode sync)\n"
            "  --replication-lag N  the two-copy side answers a push once the backup is at\n"
            "                     most N forwards behind it (default 0: once applied there)\n"
            "  --help             this text\n"
            "\n"
            "The default grid (216 points) takes 2 to 3 minutes on 2 shared cores. --auth\n"
            "and --encrypt add a side each to every round, and encrypted large ops are slow:\n"
            "on 2 cores, sizes 64 B to 16 MiB with both took 20 minutes.\n"
            "Targets: push+pull >= %.1f x raw for 1 MiB and larger; 64 B pull round trip\n"
            "<= %.1f x raw.\n",
            MAX_PS, MAX_WORKERS, MIN_OPS, LARGE_ROUNDS, QUICK_CONNECTIONS, CONNECTIONS,
            ENCRYPT_GOAL, REPLICAS_GOAL, TARGET_PUSHPULL_RATIO, TARGET_LATENCY_RATIO);
}

/* "64", "4K", "4KiB", "1M", "1MiB", "1G" (binary multiples). */
static int parse_size(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno || *s == '-') return -1;
    uint64_t mult = 1;
    if (*end == 'K' || *end == 'k') mult = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm') mult = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g') mult = 1ull << 30, end++;
    if (mult > 1 && !strcmp(end, "iB")) end += 2;
    else if (mult > 1 && (*end == 'B' || *end == 'b')) end++;
    else if (mult == 1 && (*end == 'B' || *end == 'b')) end++;
    if (*end || v == 0 || v > MAX_SIZE / mult) return -1;
    *out = v * mult;
    return 0;
}

static void format_size(uint64_t v, char *buf, size_t len) {
    if (v >= (1ull << 30) && v % (1ull << 30) == 0) snprintf(buf, len, "%llu GiB", (unsigned long long)(v >> 30));
    else if (v >= (1ull << 20) && v % (1ull << 20) == 0) snprintf(buf, len, "%llu MiB", (unsigned long long)(v >> 20));
    else if (v >= 1024 && v % 1024 == 0) snprintf(buf, len, "%llu KiB", (unsigned long long)(v >> 10));
    else snprintf(buf, len, "%llu B", (unsigned long long)v);
}

/* Split a comma-separated list; calls item() on each element. */
static int parse_list(const char *flag, const char *value, int max,
                      int (*item)(const char *tok, void *out, int i), void *out, int *count) {
    char buf[512];
    if (strlen(value) >= sizeof buf) {
        fprintf(stderr, "bench wire: %s: list too long\n", flag);
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", value);
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == max) {
            fprintf(stderr, "bench wire: %s: at most %d values\n", flag, max);
            return -1;
        }
        if (item(tok, out, n)) {
            fprintf(stderr, "bench wire: %s: bad or repeated value '%s'\n", flag, tok);
            return -1;
        }
        n++;
    }
    if (n == 0) {
        fprintf(stderr, "bench wire: %s: empty list\n", flag);
        return -1;
    }
    *count = n;
    return 0;
}

static int item_size(const char *tok, void *out, int i) {
    return parse_size(tok, &((uint64_t *)out)[i]);
}

static int item_name(const char *tok, int *out, int i, const char *const *names, int nnames) {
    for (int k = 0; k < nnames; k++) {
        if (!strcmp(tok, names[k])) {
            for (int j = 0; j < i; j++)
                if (out[j] == k) return -1; /* listed twice */
            out[i] = k;
            return 0;
        }
    }
    return -1;
}

static int item_transport(const char *tok, void *out, int i) {
    return item_name(tok, out, i, transport_names, NTRANSPORTS);
}

static int item_op(const char *tok, void *out, int i) {
    if (!strcmp(tok, "push+pull")) tok = "pushpull";
    return item_name(tok, out, i, op_names, NOPS);
}

static int item_int(const char *tok, int *out, int i, int lo, int hi) {
    int64_t v;
    if (qr__parse_int64(tok, lo, hi, &v)) return -1;
    for (int j = 0; j < i; j++)
        if (out[j] == v) return -1; /* listed twice */
    out[i] = (int)v;
    return 0;
}

static int item_ps(const char *tok, void *out, int i) {
    return item_int(tok, out, i, 1, MAX_PS);
}

static int item_workers(const char *tok, void *out, int i) {
    return item_int(tok, out, i, 1, MAX_WORKERS);
}

/* 0 = run, 1 = --help printed, -1 = bad flags (message printed). */
static int parse_args(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->nsizes = (int)QR_ARRAY_LEN(default_sizes);
    memcpy(o->sizes, default_sizes, sizeof default_sizes);
    o->ntransports = 2;
    o->transports[0] = T_UNIX;
    o->transports[1] = T_TCP;
    o->nps = 2;
    o->ps[0] = 1;
    o->ps[1] = 2;
    o->nworkers = 3;
    o->workers[0] = 1;
    o->workers[1] = 2;
    o->workers[2] = 4;
    o->nops = NOPS;
    for (int i = 0; i < NOPS; i++) o->ops[i] = i;
    o->seconds = 0.04;
    o->repeat = 5;
    o->variants[V_PLAIN] = true;
    snprintf(o->repl_lag, sizeof o->repl_lag, "0");
    o->connections = CONNECTIONS;
    bool quick = false, ps_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--json")) {
            o->json = true;
            continue;
        }
        if (!strcmp(a, "--baseline-apply")) {
            o->baseline_apply = true;
            continue;
        }
        if (!strcmp(a, "--auth") || !strcmp(a, "--encrypt")) {
            o->variants[!strcmp(a, "--auth") ? V_AUTH : V_ENCRYPT] = true;
            continue;
        }
        if (!strcmp(a, "--quick")) {
            o->nsizes = (int)QR_ARRAY_LEN(quick_sizes);
            memcpy(o->sizes, quick_sizes, sizeof quick_sizes);
            o->nworkers = 2;
            o->seconds = 0.02;
            o->repeat = 1;
            o->connections = QUICK_CONNECTIONS;
            quick = true;
            continue;
        }
        /* The rest take a value: "--flag value" or "--flag=value". */
        char flag[64];
        const char *value = NULL;
        const char *eq = strchr(a, '=');
        if (eq && eq - a < (ptrdiff_t)sizeof flag) {
            snprintf(flag, sizeof flag, "%.*s", (int)(eq - a), a);
            value = eq + 1;
        } else {
            snprintf(flag, sizeof flag, "%s", a);
            if (i + 1 < argc) value = argv[++i];
        }
        static const char *const valued[] = {"--sizes", "--transports", "--ps", "--workers",
                                             "--ops", "--seconds", "--repeat", "--ps-replicas",
                                             "--replication-lag"};
        bool known = false;
        for (size_t k = 0; k < QR_ARRAY_LEN(valued); k++) known |= !strcmp(flag, valued[k]);
        if (!known) {
            fprintf(stderr, "bench wire: unknown option '%s' (see --help)\n", a);
            return -1;
        }
        if (!value) {
            fprintf(stderr, "bench wire: %s needs a value\n", flag);
            return -1;
        }
        int rc = 0;
        if (!strcmp(flag, "--sizes")) rc = parse_list(flag, value, MAX_SIZES, item_size, o->sizes, &o->nsizes);
        else if (!strcmp(flag, "--transports"))
            rc = parse_list(flag, value, NTRANSPORTS, item_transport, o->transports, &o->ntransports);
        else if (!strcmp(flag, "--ps")) {
            rc = parse_list(flag, value, MAX_LIST, item_ps, o->ps, &o->nps);
            ps_given = true;
        }
        else if (!strcmp(flag, "--workers"))
            rc = parse_list(flag, value, MAX_LIST, item_workers, o->workers, &o->nworkers);
        else if (!strcmp(flag, "--ops")) rc = parse_list(flag, value, NOPS, item_op, o->ops, &o->nops);
        else if (!strcmp(flag, "--seconds")) {
            double v;
            if (qr__parse_float(value, &v) || !(v > 0 && v <= 600)) {
                fprintf(stderr, "bench wire: --seconds: '%s' is not a number in (0, 600]\n", value);
                rc = -1;
            } else {
                o->seconds = v;
            }
        }
        else if (!strcmp(flag, "--ps-replicas")) {
            int64_t v;
            if (qr__parse_int64(value, 1, 2, &v)) {
                fprintf(stderr, "bench wire: --ps-replicas: '%s' is not 1 or 2\n", value);
                rc = -1;
            } else {
                o->variants[V_REPLICAS] = v == 2;
            }
        }
        else if (!strcmp(flag, "--replication-lag")) {
            int64_t v;
            if (qr__parse_int64(value, 0, 1 << 20, &v)) {
                fprintf(stderr, "bench wire: --replication-lag: '%s' is not an integer in "
                        "0..1048576\n", value);
                rc = -1;
            } else {
                snprintf(o->repl_lag, sizeof o->repl_lag, "%lld", (long long)v);
            }
        }
        else if (!strcmp(flag, "--repeat")) {
            int64_t v;
            if (qr__parse_int64(value, 1, 100, &v)) {
                fprintf(stderr, "bench wire: --repeat: '%s' is not an integer in 1..100\n", value);
                rc = -1;
            } else {
                o->repeat = (int)v;
            }
        }
        if (rc) return -1;
    }
    /* --quick with --auth or --encrypt measures two or three quorum sides
     * instead of one: 2 ps only (whose link to each other is then
     * authenticated too) keeps the smoke test about as short. */
    if (quick && !ps_given && (o->variants[V_AUTH] || o->variants[V_ENCRYPT])) {
        o->nps = 1;
        o->ps[0] = 2;
    }
    /* Two copies need two ps at least (a shard's backup is on the next
     * ps): 2 by default, and a 1 asked for is refused. */
    if (o->variants[V_REPLICAS] && !ps_given) {
        o->nps = 1;
        o->ps[0] = 2;
    }
    for (int p = 0; p < o->nps && o->variants[V_REPLICAS]; p++)
        if (o->ps[p] < 2) {
            fprintf(stderr, "bench wire: --ps-replicas 2 needs 2 ps at least (a shard's backup "
                    "is on another ps): --ps lists %d\n", o->ps[p]);
            return -1;
        }
    for (int k = 0; k < o->nsizes; k++) {
        for (int j = 0; j < k; j++)
            if (o->sizes[j] == o->sizes[k]) {
                fprintf(stderr, "bench wire: --sizes lists %llu twice\n",
                        (unsigned long long)o->sizes[k]);
                return -1;
            }
        for (int p = 0; p < o->nps; p++)
            if (o->sizes[k] % (4ull * (uint64_t)o->ps[p])) {
                fprintf(stderr, "bench wire: size %llu is not a multiple of 4 x %d ps (float32 "
                        "variables, one per ps)\n", (unsigned long long)o->sizes[k], o->ps[p]);
                return -1;
            }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Output                                                                   */
/* ------------------------------------------------------------------------ */

static const char *baseline_name(const opts *o) {
    return o->baseline_apply ? "raw sockets + SGD apply (--baseline-apply)" : "raw sockets";
}

static void print_header(const opts *o) {
    char cpu[256];
    qr__cpu_summary(cpu, sizeof cpu);
    printf("# cpu: %s\n", cpu);
    printf("%-9s %-8s %8s %2s %7s | %8s %8s %5s | %10s %10s %5s", "transport", "op", "size",
           "ps", "workers", "GB/s", "raw GB/s", "ratio", "latency_us", "raw_us", "ratio");
    if (o->variants[V_AUTH]) printf(" | %9s %6s", "auth GB/s", "/plain");
    if (o->variants[V_ENCRYPT]) printf(" | %9s %6s", "enc GB/s", "/plain");
    if (o->variants[V_REPLICAS]) printf(" | %9s %6s %9s", "2cp GB/s", "/1cp", "2cp_us");
    printf("\n");
}

static void print_point(const opts *o, const point *p) {
    char size[32];
    format_size(p->size, size, sizeof size);
    char transport[16];
    snprintf(transport, sizeof transport, "%s%s", transport_names[p->transport],
             strcmp(p->used, transport_names[p->transport]) ? "!" : "");
    printf("%-9s %-8s %8s %2d %7d | %8.3f %8.3f %5.2f | %10.1f %10.1f %5.2f", transport,
           op_names[p->op], size, p->nps, p->nworkers, p->q.gbps, p->raw.gbps,
           p->q.gbps / p->raw.gbps, p->q.latency_us, p->raw.latency_us,
           p->q.latency_us / p->raw.latency_us);
    if (o->variants[V_AUTH]) printf(" | %9.3f %6.2f", p->auth.gbps, p->auth.gbps / p->q.gbps);
    if (o->variants[V_ENCRYPT]) printf(" | %9.3f %6.2f", p->enc.gbps, p->enc.gbps / p->q.gbps);
    if (o->variants[V_REPLICAS])
        printf(" | %9.3f %6.2f %9.1f", p->repl.gbps, p->repl.gbps / p->q.gbps,
               p->repl.latency_us);
    printf("\n");
    fflush(stdout);
}

typedef struct summary {
    bool have_pp, have_lat;
    double pp_min_ratio;       /* push+pull, size >= 1 MiB: min of GB/s ratios */
    const point *pp_worst;
    double lat_ratio;          /* 64 B pull, 1 ps, 1 worker */
    double lat_us, lat_raw_us;
    double lat_max_ratio;      /* 64 B pull over every topology */
    int nfused;                /* fused points with a pushpull twin */
    double fused_min, fused_max; /* quorum fused GB/s / quorum pushpull GB/s */
    int npipe;                 /* pipelined points with a pushpull twin */
    double pipe_min, pipe_max; /* quorum pipelined GB/s / quorum pushpull GB/s */
    /* --auth, --encrypt: GB/s with a secret / plain quorum's, every point */
    int nauth, nenc;
    double auth_median, auth_min, auth_max, enc_median;
    bool have_enc_pp;          /* push+pull >= 1 MiB, encrypted: */
    double enc_pp_min;         /* the smallest ratio, */
    const point *enc_pp_worst; /* its point */
    /* --ps-replicas 2: GB/s with two copies / one copy, per op and over
     * every point; points at REPLICAS_GOAL or better */
    int nrepl, nrepl_op[NOPS], repl_met;
    double repl_median, repl_min, repl_op_median[NOPS];
    double push64_us, push64_repl_us; /* a 64 B push, 1 worker (else the fewest) */
    int push64_workers;
} summary;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of r[0, n), which it sorts. */
static double median(double *r, int n) {
    qsort(r, (size_t)n, sizeof *r, cmp_double);
    return n % 2 ? r[n / 2] : (r[n / 2 - 1] + r[n / 2]) / 2;
}

/* The pushpull point of fused point f's topology and size, or NULL. */
static const point *pushpull_twin(const point *pts, int n, const point *f) {
    for (int i = 0; i < n; i++)
        if (pts[i].op == OP_PUSHPULL && pts[i].transport == f->transport &&
            pts[i].size == f->size && pts[i].nps == f->nps && pts[i].nworkers == f->nworkers)
            return &pts[i];
    return NULL;
}

static void summarize(const opts *o, const point *pts, int n, int transport, summary *s) {
    memset(s, 0, sizeof *s);
    double *auth = calloc((size_t)n + 1, sizeof *auth), *enc = calloc((size_t)n + 1, sizeof *enc);
    double *repl = calloc((size_t)n + 1, sizeof *repl), *repl_op = calloc((size_t)n + 1,
                                                                          sizeof *repl_op);
    for (int i = 0; i < n; i++) {
        const point *p = &pts[i];
        if (p->transport != transport) continue;
        if (o->variants[V_AUTH] && auth) auth[s->nauth++] = p->auth.gbps / p->q.gbps;
        if (o->variants[V_ENCRYPT] && enc) enc[s->nenc++] = p->enc.gbps / p->q.gbps;
        if (o->variants[V_REPLICAS] && repl) {
            double r = p->repl.gbps / p->q.gbps;
            repl[s->nrepl++] = r;
            s->repl_met += r >= REPLICAS_GOAL;
            if (p->op == OP_PUSH && p->size == 64 &&
                (!s->push64_workers || p->nworkers < s->push64_workers)) {
                s->push64_workers = p->nworkers;
                s->push64_us = p->q.latency_us;
                s->push64_repl_us = p->repl.latency_us;
            }
        }
        if (o->variants[V_ENCRYPT] && p->op == OP_PUSHPULL && p->size >= (1u << 20)) {
            double r = p->enc.gbps / p->q.gbps;
            if (!s->have_enc_pp || r < s->enc_pp_min) s->enc_pp_min = r, s->enc_pp_worst = p;
            s->have_enc_pp = true;
        }
        if (p->op == OP_PUSHPULL && p->size >= (1u << 20)) {
            double r = p->q.gbps / p->raw.gbps;
            if (!s->have_pp || r < s->pp_min_ratio) s->pp_min_ratio = r, s->pp_worst = p;
            s->have_pp = true;
        }
        const point *twin = p->op == OP_FUSED || p->op == OP_PIPELINED
                                ? pushpull_twin(pts, n, p) : NULL;
        if (twin && p->op == OP_FUSED) {
            double r = p->q.gbps / twin->q.gbps;
            s->fused_min = s->nfused ? QR_MIN(s->fused_min, r) : r;
            s->fused_max = s->nfused ? QR_MAX(s->fused_max, r) : r;
            s->nfused++;
        } else if (twin) {
            double r = p->q.gbps / twin->q.gbps;
            s->pipe_min = s->npipe ? QR_MIN(s->pipe_min, r) : r;
            s->pipe_max = s->npipe ? QR_MAX(s->pipe_max, r) : r;
            s->npipe++;
        }
        if (p->op == OP_PULL && p->size == 64) {
            double r = p->q.latency_us / p->raw.latency_us;
            s->lat_max_ratio = QR_MAX(s->lat_max_ratio, r);
            /* The round trip proper: one worker, one ps (else the smallest
             * topology measured). */
            if (!s->have_lat || (p->nps == 1 && p->nworkers == 1)) {
                s->lat_ratio = r;
                s->lat_us = p->q.latency_us;
                s->lat_raw_us = p->raw.latency_us;
            }
            s->have_lat = true;
        }
    }
    if (s->nauth) {
        s->auth_median = median(auth, s->nauth);
        s->auth_min = auth[0];
        s->auth_max = auth[s->nauth - 1];
    }
    if (s->nenc) s->enc_median = median(enc, s->nenc);
    if (s->nrepl) {
        s->repl_median = median(repl, s->nrepl);
        s->repl_min = repl[0];
        for (int op = 0; op < NOPS && repl_op; op++) {
            for (int i = 0; i < n; i++)
                if (pts[i].transport == transport && pts[i].op == op)
                    repl_op[s->nrepl_op[op]++] = pts[i].repl.gbps / pts[i].q.gbps;
            if (s->nrepl_op[op]) s->repl_op_median[op] = median(repl_op, s->nrepl_op[op]);
        }
    }
    free(auth);
    free(enc);
    free(repl);
    free(repl_op);
}

/* --auth and --encrypt: each beside plain quorum, and a connection's cost. */
static void print_secure_summary(const opts *o, int tr, const summary *s, const conn_cost *c) {
    const char *name = transport_names[tr];
    if (s->nauth)
        printf("  %-4s auth: GB/s with a secret / plain quorum: median %.2f (%.2f to %.2f) over "
               "%d points - goal 1.0 within noise (nothing per message after the handshake)\n",
               name, s->auth_median, s->auth_min, s->auth_max, s->nauth);
    if (c->have && o->variants[V_AUTH])
        printf("  %-4s auth: a fresh connection (connect, handshake, STEP round trip) %.1f us vs "
               "%.1f us plain: the handshake costs %.1f us per connection (medians of %d; its "
               "computation %.1f us, the rest is its 2 more round trips)\n",
               name, c->us[V_AUTH], c->us[V_PLAIN], c->us[V_AUTH] - c->us[V_PLAIN],
               o->connections, c->compute_us);
    if (c->have && o->variants[V_ENCRYPT])
        printf("  %-4s encrypt: a fresh connection %.1f us vs %.1f us plain: %.1f us more per "
               "connection (medians of %d; %s)\n", name, c->us[V_ENCRYPT], c->us[V_PLAIN],
               c->us[V_ENCRYPT] - c->us[V_PLAIN], o->connections,
               c->cipher ? c->cipher : "cipher unknown");
    if (s->nenc)
        printf("  %-4s encrypt: GB/s encrypted / plain quorum: median %.2f over %d points\n",
               name, s->enc_median, s->nenc);
    if (s->have_enc_pp) {
        char size[32];
        format_size(s->enc_pp_worst->size, size, sizeof size);
        printf("  %-4s encrypt: push+pull >= 1 MiB at %.2f of plain (goal %.1f): %s (worst: %s, "
               "%d ps, %d workers)\n", name, s->enc_pp_min, ENCRYPT_GOAL,
               s->enc_pp_min >= ENCRYPT_GOAL ? "met" : "NOT met", size, s->enc_pp_worst->nps,
               s->enc_pp_worst->nworkers);
    }
}

/* --ps-replicas 2: two copies beside one, and the ps tasks' memory. */
static void print_replicas_summary(int tr, const summary *s) {
    const char *name = transport_names[tr];
    if (!s->nrepl) return;
    printf("  %-4s replicas: GB/s with two copies / one copy: median %.2f (min %.2f) over %d "
           "points; at %.2f or better (goal: at most %.0f%% slower) on %d of %d\n", name,
           s->repl_median, s->repl_min, s->nrepl, REPLICAS_GOAL, (1 - REPLICAS_GOAL) * 100,
           s->repl_met, s->nrepl);
    printf("  %-4s replicas: median per op:", name);
    for (int op = 0; op < NOPS; op++)
        if (s->nrepl_op[op]) printf(" %s %.2f", op_names[op], s->repl_op_median[op]);
    printf("\n");
    if (s->push64_workers)
        printf("  %-4s replicas: a 64 B push (%d worker%s) %.1f us with two copies, %.1f us with "
               "one: %.1f us more (the forward to the backup and its apply)\n", name,
               s->push64_workers, s->push64_workers > 1 ? "s" : "", s->push64_repl_us,
               s->push64_us, s->push64_repl_us - s->push64_us);
}

static void print_memory(const mem_point *mem, int nmem) {
    printf("\nmemory held by the ps tasks at the end (malloc'd bytes freed as they stop; "
           "variables: every size once, SGD, no slots):\n");
    for (int i = 0; i < nmem; i++) {
        const mem_point *m = &mem[i];
        if (m->held[V_PLAIN] < 0 || m->held[V_REPLICAS] < 0) {
            printf("  %-4s %d ps %d workers: not measured (no mallinfo2 in this C library)\n",
                   transport_names[m->transport], m->nps, m->nworkers);
            continue;
        }
        printf("  %-4s %d ps %d workers: one copy %.1f MiB, two copies %.1f MiB (%.2fx) for "
               "%.1f MiB of variables; per ps %.1f / %.1f MiB\n", transport_names[m->transport],
               m->nps, m->nworkers, (double)m->held[V_PLAIN] / (1 << 20),
               (double)m->held[V_REPLICAS] / (1 << 20),
               (double)m->held[V_REPLICAS] / (double)QR_MAX(m->held[V_PLAIN], 1),
               (double)m->var_bytes / (1 << 20), (double)m->held[V_PLAIN] / (1 << 20) / m->nps,
               (double)m->held[V_REPLICAS] / (1 << 20) / m->nps);
    }
}

static void print_summary(const opts *o, const point *pts, int n, const conn_cost *costs) {
    printf("\nheadline (ratio = quorum / %s, same run):\n", baseline_name(o));
    for (int t = 0; t < o->ntransports; t++) {
        int tr = o->transports[t];
        summary s;
        summarize(o, pts, n, tr, &s);
        if (s.have_pp) {
            char size[32];
            format_size(s.pp_worst->size, size, sizeof size);
            printf("  %-4s push+pull >= 1 MiB: min %.2f of the baseline's GB/s (worst: %s, %d "
                   "ps, %d workers)", transport_names[tr], s.pp_min_ratio, size,
                   s.pp_worst->nps, s.pp_worst->nworkers);
            /* The targets are set against plain raw sockets. */
            if (o->baseline_apply)
                printf("\n");
            else
                printf(" - target >= %.1f: %s\n", TARGET_PUSHPULL_RATIO,
                       s.pp_min_ratio >= TARGET_PUSHPULL_RATIO ? "met" : "NOT met");
        }
        if (s.nfused)
            printf("  %-4s fused push+pull vs a push then a pull (quorum, same points): "
                   "%.2fx to %.2fx over %d points\n", transport_names[tr], s.fused_min,
                   s.fused_max, s.nfused);
        if (s.npipe)
            printf("  %-4s %d push+pulls in flight vs one at a time (quorum, same points): "
                   "%.2fx to %.2fx over %d points\n", transport_names[tr], PIPELINE,
                   s.pipe_min, s.pipe_max, s.npipe);
        if (s.have_lat)
            printf("  %-4s 64 B pull round trip: %.1f us vs raw %.1f us = %.2f (max over "
                   "topologies %.2f) - target <= %.1f: %s\n", transport_names[tr], s.lat_us,
                   s.lat_raw_us, s.lat_ratio, s.lat_max_ratio, TARGET_LATENCY_RATIO,
                   s.lat_ratio <= TARGET_LATENCY_RATIO ? "met" : "NOT met");
        print_secure_summary(o, tr, &s, &costs[tr]);
        print_replicas_summary(tr, &s);
    }
}

static cJSON *json_summary(const opts *o, const point *pts, int n, const conn_cost *costs) {
    cJSON *sum = cJSON_CreateObject();
    cJSON_AddNumberToObject(sum, "target_pushpull_ratio", TARGET_PUSHPULL_RATIO);
    cJSON_AddNumberToObject(sum, "target_latency_ratio", TARGET_LATENCY_RATIO);
    if (o->variants[V_ENCRYPT]) cJSON_AddNumberToObject(sum, "encrypt_goal", ENCRYPT_GOAL);
    cJSON *per = cJSON_AddObjectToObject(sum, "transports");
    for (int t = 0; t < o->ntransports; t++) {
        int tr = o->transports[t];
        summary s;
        summarize(o, pts, n, tr, &s);
        cJSON *j = cJSON_AddObjectToObject(per, transport_names[tr]);
        if (s.have_pp) {
            cJSON_AddNumberToObject(j, "pushpull_min_ratio_1mib_up", s.pp_min_ratio);
            if (!o->baseline_apply) /* the target is against plain raw sockets */
                cJSON_AddBoolToObject(j, "pushpull_target_met",
                                      s.pp_min_ratio >= TARGET_PUSHPULL_RATIO);
        }
        if (s.nfused) {
            cJSON_AddNumberToObject(j, "fused_vs_pushpull_min", s.fused_min);
            cJSON_AddNumberToObject(j, "fused_vs_pushpull_max", s.fused_max);
        }
        if (s.npipe) {
            cJSON_AddNumberToObject(j, "pipelined_vs_pushpull_min", s.pipe_min);
            cJSON_AddNumberToObject(j, "pipelined_vs_pushpull_max", s.pipe_max);
        }
        if (s.have_lat) {
            cJSON_AddNumberToObject(j, "pull64_latency_us", s.lat_us);
            cJSON_AddNumberToObject(j, "pull64_baseline_latency_us", s.lat_raw_us);
            cJSON_AddNumberToObject(j, "pull64_latency_ratio", s.lat_ratio);
            cJSON_AddNumberToObject(j, "pull64_latency_ratio_max", s.lat_max_ratio);
            cJSON_AddBoolToObject(j, "latency_target_met", s.lat_ratio <= TARGET_LATENCY_RATIO);
        }
        /* --auth, --encrypt: ratios to plain quorum; connection costs in us */
        if (s.nauth) {
            cJSON_AddNumberToObject(j, "auth_ratio_median", s.auth_median);
            cJSON_AddNumberToObject(j, "auth_ratio_min", s.auth_min);
            cJSON_AddNumberToObject(j, "auth_ratio_max", s.auth_max);
        }
        if (s.nenc) cJSON_AddNumberToObject(j, "encrypt_ratio_median", s.enc_median);
        if (s.have_enc_pp) {
            cJSON_AddNumberToObject(j, "encrypt_pushpull_min_ratio_1mib_up", s.enc_pp_min);
            cJSON_AddBoolToObject(j, "encrypt_goal_met", s.enc_pp_min >= ENCRYPT_GOAL);
        }
        /* --ps-replicas 2: two copies / one copy */
        if (s.nrepl) {
            cJSON_AddNumberToObject(j, "replicas_ratio_median", s.repl_median);
            cJSON_AddNumberToObject(j, "replicas_ratio_min", s.repl_min);
            cJSON_AddNumberToObject(j, "replicas_points", s.nrepl);
            cJSON_AddNumberToObject(j, "replicas_points_goal_met", s.repl_met);
            cJSON *ops = cJSON_AddObjectToObject(j, "replicas_ratio_median_per_op");
            for (int op = 0; op < NOPS; op++)
                if (s.nrepl_op[op]) cJSON_AddNumberToObject(ops, op_names[op], s.repl_op_median[op]);
            if (s.push64_workers) {
                cJSON_AddNumberToObject(j, "push64_latency_us", s.push64_us);
                cJSON_AddNumberToObject(j, "push64_replicas_latency_us", s.push64_repl_us);
            }
        }
        const conn_cost *c = &costs[tr];
        if (c->have) {
            cJSON_AddNumberToObject(j, "connections", o->connections);
            cJSON_AddNumberToObject(j, "connection_plain_us", c->us[V_PLAIN]);
            cJSON_AddNumberToObject(j, "handshake_compute_us", c->compute_us);
            if (o->variants[V_AUTH]) {
                cJSON_AddNumberToObject(j, "connection_auth_us", c->us[V_AUTH]);
                cJSON_AddNumberToObject(j, "handshake_us", c->us[V_AUTH] - c->us[V_PLAIN]);
            }
            if (o->variants[V_ENCRYPT]) {
                cJSON_AddNumberToObject(j, "connection_encrypt_us", c->us[V_ENCRYPT]);
                cJSON_AddNumberToObject(j, "handshake_encrypt_us",
                                        c->us[V_ENCRYPT] - c->us[V_PLAIN]);
                if (c->cipher) cJSON_AddStringToObject(j, "cipher", c->cipher);
            }
        }
    }
    return sum;
}

static int print_json(const opts *o, const point *pts, int n, const conn_cost *costs,
                      const mem_point *mem, int nmem) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "benchmark", "wire");
    cJSON_AddStringToObject(root, "version", qr_version());
    cJSON *cpu = qr__cpu_json();
    if (cpu) cJSON_AddItemToObject(root, "cpu", cpu);
    cJSON_AddNumberToObject(root, "seconds_per_round", o->seconds);
    cJSON_AddNumberToObject(root, "rounds_per_point", o->repeat);
    cJSON_AddNumberToObject(root, "min_ops_per_worker", MIN_OPS);
    cJSON_AddStringToObject(root, "baseline", o->baseline_apply ? "raw+apply" : "raw");
    cJSON_AddBoolToObject(root, "auth", o->variants[V_AUTH]);
    cJSON_AddBoolToObject(root, "encrypt", o->variants[V_ENCRYPT]);
    cJSON_AddNumberToObject(root, "ps_replicas", o->variants[V_REPLICAS] ? 2 : 1);
    cJSON *results = cJSON_AddArrayToObject(root, "results");
    for (int i = 0; i < n; i++) {
        const point *p = &pts[i];
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "transport", transport_names[p->transport]);
        cJSON_AddStringToObject(r, "transport_used", p->used);
        cJSON_AddStringToObject(r, "op", op_names[p->op]);
        cJSON_AddNumberToObject(r, "size_bytes", (double)p->size);
        cJSON_AddNumberToObject(r, "ps", p->nps);
        cJSON_AddNumberToObject(r, "workers", p->nworkers);
        cJSON_AddNumberToObject(r, "gbps", p->q.gbps);
        cJSON_AddNumberToObject(r, "baseline_gbps", p->raw.gbps);
        cJSON_AddNumberToObject(r, "ratio", p->q.gbps / p->raw.gbps);
        cJSON_AddNumberToObject(r, "latency_us", p->q.latency_us);
        cJSON_AddNumberToObject(r, "baseline_latency_us", p->raw.latency_us);
        cJSON_AddNumberToObject(r, "latency_ratio", p->q.latency_us / p->raw.latency_us);
        cJSON_AddNumberToObject(r, "ops", (double)p->q.ops);
        cJSON_AddNumberToObject(r, "baseline_ops", (double)p->raw.ops);
        /* With a secret, beside plain quorum (ratio = that / quorum's). */
        if (o->variants[V_AUTH]) {
            cJSON_AddNumberToObject(r, "auth_gbps", p->auth.gbps);
            cJSON_AddNumberToObject(r, "auth_ratio", p->auth.gbps / p->q.gbps);
            cJSON_AddNumberToObject(r, "auth_latency_us", p->auth.latency_us);
            cJSON_AddNumberToObject(r, "auth_ops", (double)p->auth.ops);
        }
        if (o->variants[V_ENCRYPT]) {
            cJSON_AddNumberToObject(r, "encrypt_gbps", p->enc.gbps);
            cJSON_AddNumberToObject(r, "encrypt_ratio", p->enc.gbps / p->q.gbps);
            cJSON_AddNumberToObject(r, "encrypt_latency_us", p->enc.latency_us);
            cJSON_AddNumberToObject(r, "encrypt_ops", (double)p->enc.ops);
        }
        /* With two copies of every shard, beside one copy (quorum's). */
        if (o->variants[V_REPLICAS]) {
            cJSON_AddNumberToObject(r, "replicas_gbps", p->repl.gbps);
            cJSON_AddNumberToObject(r, "replicas_ratio", p->repl.gbps / p->q.gbps);
            cJSON_AddNumberToObject(r, "replicas_latency_us", p->repl.latency_us);
            cJSON_AddNumberToObject(r, "replicas_ops", (double)p->repl.ops);
        }
        cJSON_AddItemToArray(results, r);
    }
    if (o->variants[V_REPLICAS]) {
        cJSON *jm = cJSON_AddArrayToObject(root, "memory");
        for (int i = 0; i < nmem; i++) {
            const mem_point *m = &mem[i];
            cJSON *r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "transport", transport_names[m->transport]);
            cJSON_AddNumberToObject(r, "ps", m->nps);
            cJSON_AddNumberToObject(r, "workers", m->nworkers);
            cJSON_AddNumberToObject(r, "variable_bytes", (double)m->var_bytes);
            cJSON_AddNumberToObject(r, "ps_bytes_one_copy", (double)m->held[V_PLAIN]);
            cJSON_AddNumberToObject(r, "ps_bytes_two_copies", (double)m->held[V_REPLICAS]);
            cJSON_AddItemToArray(jm, r);
        }
    }
    cJSON_AddItemToObject(root, "summary", json_summary(o, pts, n, costs));
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) {
        fprintf(stderr, "bench wire: out of memory printing JSON\n");
        return -1;
    }
    printf("%s\n", text);
    free(text);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Main                                                                     */
/* ------------------------------------------------------------------------ */

/* Measure every (size, op) of one topology, the baseline and each quorum
 * side back to back. Appends to pts. With cost, also times fresh
 * connections to each side's ps 0 (once per transport is enough: a
 * connection does not depend on the topology). */
static int run_topology(topo *t, point *pts, int *npts, conn_cost *cost, mem_point *mem) {
    const opts *o = t->o;
    qside *qs = calloc(NVARIANTS, sizeof *qs);
    rside *r = calloc(1, sizeof *r);
    qside *q[NVARIANTS] = {0}; /* the sides started */
    int rc = qs && r ? QR_OK : QR_ENOMEM;
    if (rc) fprintf(stderr, "bench wire: out of memory\n");
    for (int v = 0; v < NVARIANTS && !rc; v++) {
        if (!o->variants[v]) continue;
        rc = q_start(&qs[v], t, v);
        if (!rc) q[v] = &qs[v];
    }
    if (rc) {
        for (int v = 0; v < NVARIANTS; v++)
            if (q[v]) q_stop(q[v]);
        free(qs);
        free(r);
        return rc;
    }
    /* Only quorum's sockets exist now, so the count tells which kind the
     * workers connected with. */
    const char *used = socket_kind_in_use();
    if (strcmp(used, transport_names[t->transport]))
        fprintf(stderr, "bench wire: warning: transport %s asked for, but quorum's connections "
                "are %s\n", transport_names[t->transport], used);
    if (cost && (q[V_AUTH] || q[V_ENCRYPT])) rc = measure_connections(q, o->connections, cost);
    if (!rc) rc = r_start(r, t);
    for (int k = 0; k < o->nsizes && !rc; k++) {
        for (int i = 0; i < o->nops && !rc; i++) {
            point *p = &pts[(*npts)];
            *p = (point){.transport = t->transport, .op = o->ops[i], .nps = t->nps,
                         .nworkers = t->nworkers, .size = o->sizes[k], .used = used};
            meas *best[NVARIANTS] = {&p->q, &p->auth, &p->enc, &p->repl};
            /* Rounds alternate the baseline and the quorum sides; each
             * side keeps its best round (the least disturbed on a shared
             * machine). */
            int rounds = p->size >= LARGE_SIZE && p->op != OP_PUSHPULL && p->op != OP_FUSED && p->op != OP_PIPELINED
                             ? QR_MIN(o->repeat, LARGE_ROUNDS)
                             : o->repeat;
            for (int round = 0; round < rounds && !rc; round++) {
                meas m;
                rc = driver_measure(&r->d, k, p->op, o->seconds, p->size, "baseline", &m);
                if (!rc && m.gbps > p->raw.gbps) p->raw = m;
                for (int v = 0; v < NVARIANTS && !rc; v++) {
                    if (!q[v]) continue;
                    rc = driver_measure(&q[v]->d, k, p->op, o->seconds, p->size, variant_names[v], &m);
                    if (!rc && m.gbps > best[v]->gbps) *best[v] = m;
                }
            }
            if (rc) break;
            (*npts)++;
            if (!o->json) print_point(o, p);
        }
    }
    if (r->t) r_stop(r);
    /* Every side's workers first, so that only ps tasks are freed below. */
    for (int v = 0; v < NVARIANTS; v++)
        if (q[v]) driver_stop(&q[v]->d);
    *mem = (mem_point){.transport = t->transport, .nps = t->nps, .nworkers = t->nworkers};
    for (int k = 0; k < o->nsizes; k++) mem->var_bytes += o->sizes[k];
    for (int v = NVARIANTS - 1; v >= 0; v--) {
        mem->held[v] = -1;
        if (q[v]) mem->held[v] = q_stop_measured(q[v]);
    }
    free(qs);
    free(r);
    return rc;
}

/* --auth, --encrypt: the run's secret, in a directory only we can enter
 * (mkdtemp makes it 0700; the file itself is 0600). */
static int make_secret(opts *o, char *dir, size_t len) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, len, "%s/quorum-bench-wire-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "bench wire: cannot make a temp directory for the secret: %s\n",
                strerror(errno));
        dir[0] = 0;
        return -1;
    }
    snprintf(o->secret_path, sizeof o->secret_path, "%s/secret", dir);
    if (qr__write_secret_file(o->secret_path)) {
        fprintf(stderr, "bench wire: %s\n", qr_last_error());
        o->secret_path[0] = 0;
        return -1;
    }
    return 0;
}

static void remove_secret(opts *o, const char *dir) {
    if (o->secret_path[0]) unlink(o->secret_path);
    if (dir[0]) rmdir(dir);
}

int qr_bench_wire_main(int argc, char **argv) {
    opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc) return prc > 0 ? 0 : 2;
    uint64_t max_size = 0;
    for (int k = 0; k < o.nsizes; k++) max_size = QR_MAX(max_size, o.sizes[k]);
    float *send = qr__aligned_alloc(max_size);
    int maxpts = o.ntransports * o.nps * o.nworkers * o.nsizes * o.nops;
    point *pts = calloc((size_t)maxpts, sizeof *pts);
    mem_point *mems = calloc((size_t)(o.ntransports * o.nps * o.nworkers), sizeof *mems);
    int nmem = 0;
    if (!send || !pts || !mems) {
        fprintf(stderr, "bench wire: out of memory\n");
        free(send);
        free(pts);
        free(mems);
        return 1;
    }
    char secret_dir[256] = "";
    if ((o.variants[V_AUTH] || o.variants[V_ENCRYPT]) &&
        make_secret(&o, secret_dir, sizeof secret_dir)) {
        remove_secret(&o, secret_dir);
        free(send);
        free(pts);
        free(mems);
        return 1;
    }
    for (uint64_t i = 0; i < max_size / sizeof(float); i++) send[i] = 1e-3f;
    if (!o.json) {
        printf("quorum bench wire: best of %d rounds of %.2f s per point and side (at least %d "
               "ops per worker); ratio = quorum / %s\n", o.repeat, o.seconds, MIN_OPS,
               baseline_name(&o));
        if (o.variants[V_AUTH] || o.variants[V_ENCRYPT])
            printf("%s%s%s: quorum with the secret %s (removed at the end), in the same "
                   "alternating rounds; /plain = its GB/s / quorum's\n",
                   o.variants[V_AUTH] ? "auth (authenticated, in the clear)" : "",
                   o.variants[V_AUTH] && o.variants[V_ENCRYPT] ? ", " : "",
                   o.variants[V_ENCRYPT] ? "enc (authenticated and encrypted)" : "",
                   o.secret_path);
        if (o.variants[V_REPLICAS])
            printf("2cp: quorum with two copies of every shard (--ps-replicas 2: each push "
                   "applied on its backup ps before it is answered), in the same alternating "
                   "rounds; /1cp = its GB/s / quorum's (one copy); goal %.2f\n", REPLICAS_GOAL);
        print_header(&o);
    }
    conn_cost costs[NTRANSPORTS];
    memset(costs, 0, sizeof costs);
    int npts = 0, rc = QR_OK;
    for (int a = 0; a < o.ntransports && !rc; a++)
        for (int b = 0; b < o.nps && !rc; b++)
            for (int c = 0; c < o.nworkers && !rc; c++) {
                topo t = {.o = &o, .transport = o.transports[a], .nps = o.ps[b],
                          .nworkers = o.workers[c], .send = send};
                for (int k = 0; k < o.nsizes; k++)
                    t.max_piece = QR_MAX(t.max_piece, o.sizes[k] / (uint64_t)t.nps);
                conn_cost *cost = costs[t.transport].have ? NULL : &costs[t.transport];
                rc = run_topology(&t, pts, &npts, cost, &mems[nmem]);
                if (!rc) nmem++;
            }
    remove_secret(&o, secret_dir);
    if (!rc) {
        if (o.json) {
            rc = print_json(&o, pts, npts, costs, mems, nmem);
        } else {
            print_summary(&o, pts, npts, costs);
            if (o.variants[V_REPLICAS]) print_memory(mems, nmem);
        }
    }
    free(send);
    free(pts);
    free(mems);
    return rc ? 1 : 0;
}

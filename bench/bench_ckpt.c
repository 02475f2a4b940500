/*
 * bench_ckpt.c - `quorum bench ckpt`: what a checkpoint costs training,
 * each figure beside a baseline measured in the same run.
 *
 *   pause  A probe worker pushes and pulls a small variable of a large
 *          model over and over, first with no checkpoint, then while
 *          checkpoints of the whole model are taken back to back. The
 *          longest round trip of each phase is printed, and the ps's own
 *          figure for the part a checkpoint runs on its loop (the snapshot
 *          of references, max_snapshot_ms).
 *   write  The checkpoint's bytes over its duration (shard written and
 *          fsynced, manifest written) against the disk's sequential
 *          write speed: the same number of bytes written with write() in
 *          1 MiB pieces and one fsync, into the same folder, just after.
 *
 * A ps runs on a thread of this process on a loopback address (Unix socket),
 * the probe on the main thread. The folder is removed at the end.
 */
#include "bench/bench.h"

#include "common/cpu.h"
#include "quorum.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct bench_opts {
    int64_t model_mb;
    int nvars;
    const char *optimizer;
    double seconds;
    const char *dir;
    bool json;
} bench_opts;

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int mkdir_p(const char *path) {
    return mkdir(path, 0755) && errno != EEXIST ? -1 : 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* The benchmark's own folder and everything in it. */
static void rm_rf(const char *path) {
    nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int usage(int status) {
    fprintf(status ? stderr : stdout,
            "usage: quorum bench ckpt [--model-mb N] [--vars N] [--optimizer NAME]\n"
            "                         [--seconds S] [--dir DIR] [--quick] [--json]\n"
            "  --model-mb N     the model's size (default 1024)\n"
            "  --vars N         spread over this many variables (default 64)\n"
            "  --optimizer O    its slots are written too (default adam: 3x the model)\n"
            "  --seconds S      length of each phase of the pause measurement (default 3)\n"
            "  --dir DIR        where to write (default: a new folder in $TMPDIR or /tmp)\n"
            "  --quick          a 32 MiB model, 1 s phases (a smoke test)\n"
            "  --json           one JSON line with the figures at the end\n");
    return status;
}

static void *ps_main(void *arg) {
    qr_ps_run(arg);
    return NULL;
}

/* Round-trip times of one phase, for its percentiles. */
typedef struct samples {
    double *ms;
    long n, cap;
} samples;

static void sample_add(samples *s, double ms) {
    if (s->n == s->cap) {
        long cap = s->cap ? 2 * s->cap : 4096;
        double *grown = realloc(s->ms, (size_t)cap * sizeof *grown);
        if (!grown) return;
        s->ms = grown;
        s->cap = cap;
    }
    s->ms[s->n++] = ms;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (0..1) of the samples (sorts them). */
static double quantile(samples *s, double q) {
    if (!s->n) return 0;
    qsort(s->ms, (size_t)s->n, sizeof *s->ms, cmp_double);
    long i = (long)(q * (double)(s->n - 1));
    return s->ms[i];
}

/* The longest push+pull round trip of the probe over `seconds`; with
 * `step`, every push advances the global step, and with checkpoint-steps
 * 1 each step starts a checkpoint unless one is under way. */
static int probe(qr_worker *w, int id, float *grad, double seconds, bool step, double *max_ms,
                 long *rounds, samples *s) {
    *max_ms = 0;
    *rounds = 0;
    double end = now_sec() + seconds;
    while (now_sec() < end) {
        double t0 = now_sec();
        int rc = qr_worker_push(w, 1, &id, (const float *const *)&grad, step ? QR_PUSH_STEP : 0,
                                NULL);
        if (!rc) rc = qr_worker_pull(w, 1, &id, NULL);
        if (rc) return rc;
        double ms = (now_sec() - t0) * 1e3;
        if (ms > *max_ms) *max_ms = ms;
        (*rounds)++;
        sample_add(s, ms);
    }
    return QR_OK;
}

/* Seconds to write `bytes` to path sequentially, fsync included. */
static double disk_write_seconds(const char *path, uint64_t bytes) {
    size_t chunk = 1 << 20;
    char *buf = malloc(chunk);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (!buf || fd < 0) {
        free(buf);
        if (fd >= 0) close(fd);
        return -1;
    }
    for (size_t i = 0; i < chunk; i++) buf[i] = (char)(i * 131);
    double t0 = now_sec();
    for (uint64_t done = 0; done < bytes;) {
        size_t n = (size_t)(bytes - done < chunk ? bytes - done : chunk);
        ssize_t got = write(fd, buf, n);
        if (got <= 0) break;
        done += (uint64_t)got;
    }
    fsync(fd);
    double t = now_sec() - t0;
    close(fd);
    unlink(path);
    free(buf);
    return t;
}

static double json_num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* The duration of one checkpoint taken while nothing else runs: wait for
 * the one under way, make one step, wait for its checkpoint. -1 if none. */
static double idle_checkpoint(qr_worker *w, int id, float *grad, double written) {
    char stats[8192];
    double deadline = now_sec() + 600, seen = written;
    for (int phase = 0; phase < 2; phase++) {
        double before = now_sec();
        for (;;) {
            if (now_sec() > deadline || qr_worker_stats(w, stats, sizeof stats)) return -1;
            cJSON *s = cJSON_Parse(stats);
            const cJSON *ck = cJSON_GetObjectItemCaseSensitive(s, "checkpoint");
            double done = json_num(ck, "written"), secs = json_num(ck, "last_duration_s");
            cJSON_Delete(s);
            if (phase == 1 && done > seen) return secs;
            /* phase 0: none under way once the count has been still a while */
            if (phase == 0 && done == seen && now_sec() - before > 0.5) break;
            if (done != seen) {
                seen = done;
                before = now_sec();
            }
            usleep(20000);
        }
        if (phase == 0 &&
            qr_worker_push(w, 1, &id, (const float *const *)&grad, QR_PUSH_STEP, NULL))
            return -1;
    }
    return -1;
}

static int parse(int argc, char **argv, bench_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(0) - 1;
        if (!strcmp(a, "--quick")) {
            o->model_mb = 32;
            o->nvars = 8;
            o->seconds = 1;
        } else if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (v && !strcmp(a, "--model-mb")) {
            o->model_mb = atoll(v), i++;
        } else if (v && !strcmp(a, "--vars")) {
            o->nvars = atoi(v), i++;
        } else if (v && !strcmp(a, "--optimizer")) {
            o->optimizer = v, i++;
        } else if (v && !strcmp(a, "--seconds")) {
            o->seconds = atof(v), i++;
        } else if (v && !strcmp(a, "--dir")) {
            o->dir = v, i++;
        } else {
            fprintf(stderr, "bench ckpt: unknown option or missing value: %s\n", a);
            return usage(2);
        }
    }
    if (o->model_mb < 1 || o->model_mb > (1 << 20) || o->nvars < 1 || o->nvars > 4096 ||
        o->seconds <= 0 || o->seconds > 3600) {
        fprintf(stderr, "bench ckpt: --model-mb 1..1048576, --vars 1..4096, --seconds 0..3600\n");
        return 2;
    }
    return 0;
}

typedef struct cluster_run {
    qr_cluster *ps_spec, *w_spec;
    qr_config *cfg;
    qr_ps *ps;
    pthread_t ps_tid;
    bool ps_started;
    qr_worker *w;
} cluster_run;

static int start(cluster_run *c, const bench_opts *o, const char *dir) {
    char sock[600], whost[600];
    snprintf(sock, sizeof sock, "unix:%s/ps0.sock", dir);
    snprintf(whost, sizeof whost, "unix:%s/w0.sock", dir);
    char ckdir[600];
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", dir);
    int rc = qr_config_new(&c->cfg);
    if (!rc) rc = qr_config_set(c->cfg, "optimizer", o->optimizer);
    if (!rc) rc = qr_config_set(c->cfg, "checkpoint-dir", ckdir);
    if (!rc) rc = qr_config_set(c->cfg, "checkpoint-steps", "1");
    if (!rc) rc = qr_config_set(c->cfg, "checkpoint-secs", "0");
    if (!rc) rc = qr_config_set(c->cfg, "keep-checkpoints", "1");
    /* Whole-model checkpoints: the model the probe does not train would
     * otherwise be left out of every increment. */
    if (!rc) rc = qr_config_set(c->cfg, "checkpoint-full-every", "1");
    if (!rc) rc = qr_cluster_from_flags(&c->ps_spec, sock, whost, "ps", 0);
    if (!rc) rc = qr_cluster_from_flags(&c->w_spec, sock, whost, "worker", 0);
    if (!rc) rc = qr_ps_create(&c->ps, c->ps_spec, c->cfg);
    if (!rc && pthread_create(&c->ps_tid, NULL, ps_main, c->ps) == 0) c->ps_started = true;
    if (!rc && !c->ps_started) rc = QR_EINTERNAL;
    if (!rc) rc = qr_worker_create(&c->w, c->w_spec, 0, c->cfg);
    return rc;
}

static void stop(cluster_run *c) {
    if (c->w) qr_worker_stop_cluster(c->w);
    qr_worker_free(c->w); /* hang up, so the ps need not wait for it */
    if (c->ps_started) {
        qr_ps_stop(c->ps);
        pthread_join(c->ps_tid, NULL);
    }
    qr_ps_free(c->ps);
    qr_cluster_free(c->ps_spec);
    qr_cluster_free(c->w_spec);
    qr_config_free(c->cfg);
}

static int declare_model(qr_worker *w, const bench_opts *o, int *probe_id) {
    int64_t floats = o->model_mb * (1 << 20) / 4;
    int64_t cols = 1024, rows = floats / o->nvars / cols;
    if (rows < 1) rows = 1;
    int64_t probe_shape[1] = {1024};
    int rc = qr_worker_declare(w, "probe", 1, probe_shape, "zeros", 1, -1, probe_id);
    for (int i = 0; !rc && i < o->nvars; i++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d/weights", i);
        int64_t shape[2] = {rows, cols};
        rc = qr_worker_declare(w, name, 2, shape, "normal:0,0.01", (uint64_t)i, -1, NULL);
    }
    return rc ? rc : qr_worker_initialize(w);
}

int qr_bench_ckpt_main(int argc, char **argv) {
    bench_opts o = {.model_mb = 1024, .nvars = 64, .optimizer = "adam", .seconds = 3};
    int prc = parse(argc, argv, &o);
    if (prc) return prc < 0 ? 0 : prc;
    char dir[512];
    if (o.dir) snprintf(dir, sizeof dir, "%s/quorum-bench-ckpt-%d", o.dir, (int)getpid());
    else snprintf(dir, sizeof dir, "%s/quorum-bench-ckpt-%d",
                  getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    if (mkdir_p(dir)) {
        fprintf(stderr, "bench ckpt: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    cluster_run c = {0};
    int id = 0;
    float grad[1024];
    for (int i = 0; i < 1024; i++) grad[i] = 1e-3f;
    double base_ms = 0, during_ms = 0;
    long base_rounds = 0, during_rounds = 0;
    int rc = start(&c, &o, dir);
    if (!rc) rc = declare_model(c.w, &o, &id);
    samples base_s = {0}, during_s = {0};
    if (!rc) rc = probe(c.w, id, grad, o.seconds, false, &base_ms, &base_rounds, &base_s);
    /* With checkpoints: at least `seconds`, and until two are complete (a
     * large model's take longer than one phase). */
    char stats[8192];
    double deadline = now_sec() + 10 * o.seconds + 300;
    for (int round = 0; !rc; round++) {
        double ms;
        long n;
        rc = probe(c.w, id, grad, round ? 0.25 : o.seconds, true, &ms, &n, &during_s);
        if (ms > during_ms) during_ms = ms;
        during_rounds += n;
        if (!rc) rc = qr_worker_stats(c.w, stats, sizeof stats);
        if (rc) break;
        cJSON *s = cJSON_Parse(stats);
        double done = json_num(cJSON_GetObjectItemCaseSensitive(s, "checkpoint"), "written");
        cJSON_Delete(s);
        if (done >= 2 || now_sec() > deadline) break;
    }
    if (rc) {
        fprintf(stderr, "bench ckpt: %s\n", qr_last_error());
        stop(&c);
        rm_rf(dir);
        return 1;
    }
    cJSON *j = cJSON_Parse(stats);
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(j, "checkpoint");
    double written = json_num(ck, "written"), bytes = json_num(ck, "last_bytes");
    double secs = json_num(ck, "last_duration_s"), snap_ms = json_num(ck, "max_snapshot_ms");
    double idle_secs = idle_checkpoint(c.w, id, grad, written);
    stop(&c);
    char path[600];
    snprintf(path, sizeof path, "%s/baseline.bin", dir);
    double disk_s = bytes > 0 ? disk_write_seconds(path, (uint64_t)bytes) : -1;
    double ck_gbs = secs > 0 ? bytes / secs / 1e9 : 0, disk_gbs = disk_s > 0 ? bytes / disk_s / 1e9 : 0;
    double idle_gbs = idle_secs > 0 ? bytes / idle_secs / 1e9 : 0;
    printf("checkpoint of a %lld MiB model in %d variables, optimizer %s: %.0f MiB per "
           "checkpoint, %.0f taken while the probe ran\n",
           (long long)o.model_mb, o.nvars, o.optimizer, bytes / (1 << 20), written);
    double p99 = quantile(&during_s, 0.99), base_p99 = quantile(&base_s, 0.99);
    double p999 = quantile(&during_s, 0.999), base_p999 = quantile(&base_s, 0.999);
    free(base_s.ms);
    free(during_s.ms);
    char cpu[256];
    qr__cpu_summary(cpu, sizeof cpu);
    printf("cpu    %s\n", cpu);
    printf("pause  probe push+pull with checkpoints: longest %.2f ms, p99.9 %.3f, p99 %.3f "
           "(%ld rounds); without: longest %.2f ms, p99.9 %.3f, p99 %.3f (%ld rounds); the "
           "loop's part (snapshot): %.3f ms\n",
           during_ms, p999, p99, during_rounds, base_ms, base_p999, base_p99, base_rounds, snap_ms);
    printf("write  disk sequential write+fsync %.2f GB/s; a checkpoint while the probe trains "
           "%.2f GB/s (ratio %.2f), one with training idle %.2f GB/s (ratio %.2f)\n",
           disk_gbs, ck_gbs, disk_gbs > 0 ? ck_gbs / disk_gbs : 0, idle_gbs,
           disk_gbs > 0 ? idle_gbs / disk_gbs : 0);
    if (o.json)
        printf("{\"model_mb\":%lld,\"checkpoint_bytes\":%.0f,\"checkpoints\":%.0f,"
               "\"pause_ms\":%.3f,\"pause_baseline_ms\":%.3f,\"p99_ms\":%.3f,"
               "\"p99_baseline_ms\":%.3f,\"snapshot_ms\":%.3f,"
               "\"write_gbs\":%.3f,\"idle_write_gbs\":%.3f,\"disk_gbs\":%.3f}\n",
               (long long)o.model_mb, bytes, written, during_ms, base_ms, p99, base_p99, snap_ms,
               ck_gbs, idle_gbs, disk_gbs);
    cJSON_Delete(j);
    rm_rf(dir);
    return written >= 1 && bytes > 0 ? 0 : 1;
}

/*
 * bench_tier.c - `quorum bench tier`: an embedding table larger than the
 * ps's memory cap (--table-memory-mb, the LMDB disk tier of
 * src/ps/tier.c), and the same table all in memory beside it.
 *
 * One ps (a thread of this process, over a Unix socket) and one worker;
 * a table of dim D with Adagrad. First every row is made (a push of a
 * gradient to each id, BATCH ids a push): the fill rate. Then for the
 * given seconds, batches of BATCH ids drawn Zipf (s = 1.1 over the rows)
 * are pulled and pushed, as training does: ids a second, and the tiers'
 * figures (rows in memory and on disk, hits from memory and from disk,
 * misses, bytes on disk). With --baseline the same runs without a cap
 * follow, and the ratio of the Zipf rates is printed (same run, same
 * machine: read the ratio), and the CPU time an id took (this process's:
 * steadier than the rate on a shared machine). RssAnon is this
 * process's (ps and worker).
 *
 * 100 million rows of dim 16 under a 2 GB cap (issue 30) is
 *   quorum bench tier --rows 100000000 --dim 16 --memory-mb 2048 \
 *       --table-dir /some/ssd --seconds 60
 * (about 13 GiB of LMDB records and 1.5 GB of Bloom filter and marks
 * beside the cap: not a machine of 2 cores and a small disk).
 */
#include "bench/bench.h"

#include "common/common.h"
#include "quorum.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ZIPF_S 1.1

typedef struct tier_opts {
    int64_t rows, dim, memory_mb, batch;
    double seconds;
    const char *dir;
    bool baseline, json;
} tier_opts;

typedef struct tier_result {
    double fill_rows_per_sec, zipf_ids_per_sec, zipf_cpu_ns_per_id, rss_anon_mb;
    double rows_memory, rows_disk, disk_bytes, memory_hits, disk_hits, misses;
} tier_result;

static double now_sec(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* CPU seconds of this process (ps and worker): steadier than the wall
 * clock on a machine shared with other work. */
static double cpu_sec(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double rss_anon_mb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "RssAnon:", 8)) kb = atof(line + 8);
    if (f) fclose(f);
    return kb / 1024;
}

/* A Zipf-like rank in [0, n): the continuous power law's inverse CDF
 * (no table of n entries: n may be 10^8). */
static int64_t zipf_rank(uint64_t *lcg, int64_t n) {
    *lcg = *lcg * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(*lcg >> 11) / 9007199254740992.0;
    double a = 1 - ZIPF_S, hi = pow((double)n, a);
    int64_t r = (int64_t)pow(u * (hi - 1) + 1, 1 / a) - 1;
    return r < 0 ? 0 : r >= n ? n - 1 : r;
}

static void *ps_main(void *arg) {
    qr_ps_run(arg);
    return NULL;
}

static double stat_of(const cJSON *table, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(table, name);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* One cluster, capped at mb MiB (0: all in memory). */
static int run(const tier_opts *o, int64_t mb, tier_result *res) {
    memset(res, 0, sizeof *res);
    char dir[200], ps_host[260], worker_host[260], text[32];
    snprintf(dir, sizeof dir, "%s/quorum-bench-tier-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    snprintf(ps_host, sizeof ps_host, "unix:%s/ps0.sock", dir);
    snprintf(worker_host, sizeof worker_host, "unix:%s/w0.sock", dir);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    if (system(cmd)) return qr__fail(QR_EIO, "bench tier: cannot create %s", dir);
    qr_config *cfg = NULL;
    qr_ps *ps = NULL;
    qr_worker *w = NULL;
    pthread_t tid;
    bool started = false;
    int rc = qr_config_new(&cfg);
    if (!rc) rc = qr_config_set(cfg, "optimizer", "adagrad");
    if (!rc) rc = qr_config_set(cfg, "lr", "0.05");
    snprintf(text, sizeof text, "%lld", (long long)mb);
    if (!rc) rc = qr_config_set(cfg, "table-memory-mb", text);
    if (!rc && o->dir) rc = qr_config_set(cfg, "table-dir", o->dir);
    qr_cluster *spec = NULL;
    if (!rc) rc = qr_cluster_from_flags(&spec, ps_host, worker_host, "ps", 0);
    if (!rc) rc = qr_ps_create(&ps, spec, cfg);
    qr_cluster_free(spec);
    spec = NULL;
    if (!rc && !pthread_create(&tid, NULL, ps_main, ps)) started = true;
    else if (!rc) rc = QR_EINTERNAL;
    if (!rc) rc = qr_cluster_from_flags(&spec, ps_host, worker_host, "worker", 0);
    if (!rc) rc = qr_worker_create(&w, spec, 0, cfg);
    qr_cluster_free(spec);
    int t = -1;
    if (!rc) rc = qr_worker_declare_table(w, "emb", o->dim, "uniform:-0.05,0.05", 1, "", &t);
    if (!rc) rc = qr_worker_initialize(w);
    int64_t b = o->batch;
    int64_t *ids = malloc((size_t)b * sizeof *ids);
    float *rows = malloc((size_t)(b * o->dim) * sizeof *rows);
    float *grads = malloc((size_t)(b * o->dim) * sizeof *grads);
    if (!rc && (!ids || !rows || !grads)) rc = QR_ENOMEM;
    for (int64_t k = 0; !rc && k < b * o->dim; k++) grads[k] = 0.01f * (float)((k % 13) - 6);
    /* Every row made. */
    double t0 = now_sec();
    for (int64_t at = 0; !rc && at < o->rows; at += b) {
        int64_t n = QR_MIN(b, o->rows - at);
        for (int64_t i = 0; i < n; i++) ids[i] = at + i;
        rc = qr_worker_push_sparse(w, t, n, ids, grads, QR_PUSH_STEP, NULL);
    }
    res->fill_rows_per_sec = (double)o->rows / (now_sec() - t0);
    /* Zipf batches, pulled and pushed. */
    uint64_t lcg = 7, ndone = 0;
    t0 = now_sec();
    double c0 = cpu_sec();
    double elapsed = 0;
    while (!rc && elapsed < o->seconds) {
        for (int64_t i = 0; i < b; i++) ids[i] = zipf_rank(&lcg, o->rows);
        rc = qr_worker_pull_rows(w, t, b, ids, rows, 0);
        if (!rc) rc = qr_worker_push_sparse(w, t, b, ids, grads, QR_PUSH_STEP, NULL);
        ndone += (uint64_t)b;
        elapsed = now_sec() - t0;
    }
    res->zipf_ids_per_sec = (double)ndone / elapsed;
    res->zipf_cpu_ns_per_id = (cpu_sec() - c0) * 1e9 / (double)ndone;
    res->rss_anon_mb = rss_anon_mb();
    char *buf = malloc(1 << 16);
    if (!rc && buf && !qr_worker_stats(w, buf, 1 << 16)) {
        cJSON *j = cJSON_Parse(buf);
        const cJSON *tables = cJSON_GetObjectItemCaseSensitive(j, "tables");
        const cJSON *emb = cJSON_GetObjectItemCaseSensitive(tables, "emb");
        res->rows_memory = mb ? stat_of(emb, "rows_memory") : stat_of(emb, "rows");
        res->rows_disk = stat_of(emb, "rows_disk");
        res->disk_bytes = stat_of(emb, "disk_bytes");
        res->memory_hits = stat_of(emb, "memory_hits");
        res->disk_hits = stat_of(emb, "disk_hits");
        res->misses = stat_of(emb, "misses");
        cJSON_Delete(j);
    }
    free(buf);
    free(ids);
    free(rows);
    free(grads);
    if (rc) fprintf(stderr, "bench tier: %s\n", qr_last_error());
    if (w) qr_worker_stop_cluster(w);
    qr_worker_free(w);
    if (started) {
        qr_ps_stop(ps);
        pthread_join(tid, NULL);
    }
    qr_ps_free(ps);
    qr_config_free(cfg);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "bench tier: could not remove %s\n", dir);
    return rc;
}

static void print(const tier_opts *o, int64_t mb, const tier_result *r, bool json) {
    if (json) {
        printf("{\"rows\": %lld, \"dim\": %lld, \"memory_mb\": %lld, \"fill_rows_per_sec\": %.0f, "
               "\"zipf_ids_per_sec\": %.0f, \"zipf_cpu_ns_per_id\": %.0f, \"rss_anon_mb\": %.1f, "
               "\"rows_memory\": %.0f, "
               "\"rows_disk\": %.0f, \"disk_bytes\": %.0f, \"memory_hits\": %.0f, "
               "\"disk_hits\": %.0f, \"misses\": %.0f}\n", (long long)o->rows, (long long)o->dim,
               (long long)mb, r->fill_rows_per_sec, r->zipf_ids_per_sec, r->zipf_cpu_ns_per_id,
               r->rss_anon_mb,
               r->rows_memory, r->rows_disk, r->disk_bytes, r->memory_hits, r->disk_hits,
               r->misses);
        return;
    }
    printf("%-16s fill %9.0f rows/s  zipf %9.0f ids/s (%.0f ns of CPU an id)  RssAnon %7.1f MiB  "
           "rows %.0f in memory, %.0f on disk (%.1f MiB)  hits %.0f memory, %.0f disk, %.0f "
           "misses\n", mb ? "capped" : "all in memory", r->fill_rows_per_sec, r->zipf_ids_per_sec,
           r->zipf_cpu_ns_per_id, r->rss_anon_mb, r->rows_memory, r->rows_disk, r->disk_bytes / (1 << 20),
           r->memory_hits, r->disk_hits, r->misses);
}

static int usage(int status) {
    fprintf(status ? stderr : stdout,
            "usage: quorum bench tier [--rows N] [--dim D] [--memory-mb M] [--table-dir DIR]\n"
            "                         [--seconds S] [--batch B] [--baseline] [--json]\n"
            "  a table of N rows (default 2000000) of dim D (16) with Adagrad on one ps capped\n"
            "  at M MiB of rows in memory (default: a quarter of the table), the rest on the\n"
            "  LMDB disk tier (in DIR, default a private directory under $TMPDIR): the rate\n"
            "  of making every row, then of Zipf batches of B ids (4096) pulled and pushed for\n"
            "  S seconds (5); --baseline: the same all in memory after it, and the ratio.\n");
    return status;
}

int qr_bench_tier_main(int argc, char **argv) {
    tier_opts o = {.rows = 2000000, .dim = 16, .batch = 4096, .seconds = 5};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(0);
        if (!strcmp(a, "--json")) o.json = true;
        else if (!strcmp(a, "--baseline")) o.baseline = true;
        else if (v && !strcmp(a, "--rows")) o.rows = atoll(v), i++;
        else if (v && !strcmp(a, "--dim")) o.dim = atoll(v), i++;
        else if (v && !strcmp(a, "--memory-mb")) o.memory_mb = atoll(v), i++;
        else if (v && !strcmp(a, "--batch")) o.batch = atoll(v), i++;
        else if (v && !strcmp(a, "--seconds")) o.seconds = atof(v), i++;
        else if (v && !strcmp(a, "--table-dir")) o.dir = v, i++;
        else {
            fprintf(stderr, "bench tier: unknown or incomplete option '%s'\n", a);
            return usage(2);
        }
    }
    /* A row in memory: value and accumulator, id, index slot, mark (tier.c). */
    int64_t row_bytes = o.dim * 8 + 17;
    if (!o.memory_mb) o.memory_mb = QR_MAX((o.rows * row_bytes / 4) >> 20, 1);
    if (o.rows < 1 || o.rows > ((int64_t)1 << 40) || o.dim < 1 || o.dim > 65536 ||
        o.batch < 1 || o.batch > 1 << 20 || o.seconds <= 0 || o.seconds > 3600 ||
        o.memory_mb < 1) {
        fprintf(stderr, "bench tier: --rows 1..2^40, --dim 1..65536, --batch 1..2^20, "
                "--seconds (0, 3600], --memory-mb >= 1\n");
        return 2;
    }
    if (o.batch * row_bytes > (o.memory_mb << 20)) {
        fprintf(stderr, "bench tier: a batch of %lld rows of dim %lld needs %.1f MiB in memory: "
                "more than --memory-mb %lld\n", (long long)o.batch, (long long)o.dim,
                (double)(o.batch * row_bytes) / (1 << 20), (long long)o.memory_mb);
        return 2;
    }
    if (!o.json)
        printf("bench tier: %lld rows of dim %lld with Adagrad (%.1f MiB in memory all told), "
               "capped at %lld MiB\n", (long long)o.rows, (long long)o.dim,
               (double)(o.rows * row_bytes) / (1 << 20), (long long)o.memory_mb);
    tier_result capped, whole;
    int rc = run(&o, o.memory_mb, &capped);
    if (rc) return 1;
    print(&o, o.memory_mb, &capped, o.json);
    if (!o.baseline) return 0;
    rc = run(&o, 0, &whole);
    if (rc) return 1;
    print(&o, 0, &whole, o.json);
    double ratio = capped.zipf_ids_per_sec / whole.zipf_ids_per_sec;
    double cpu = whole.zipf_cpu_ns_per_id / capped.zipf_cpu_ns_per_id;
    if (o.json) printf("{\"zipf_ratio\": %.3f, \"zipf_cpu_ratio\": %.3f}\n", ratio, cpu);
    else printf("capped / all in memory, Zipf batches: %.2f of the rate, %.2f of the CPU's\n",
                ratio, cpu);
    return 0;
}

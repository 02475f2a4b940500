/*
 * bench_embed.c - `quorum bench embed`: embedding tables' sparse pulls and
 * pushes against dense transfers of the same bytes, and a table's memory
 * per row.
 *
 * For each point (ps tasks 1 or 2, row dim 8, 64 or 256, ids drawn Zipf or
 * uniform) one worker repeats a batch's sparse call: a pull of the rows of
 * BATCH ids (qr_worker_pull_rows: duplicates removed on the worker, one
 * LOOKUP per ps in flight together) or a push of one gradient row per id
 * (qr_worker_push_sparse: summed by id on the worker, applied with SGD on
 * the ps). A pass over every batch first makes the rows, so the figures
 * are of a warm table, as in training. Beside it, in the same run, a dense
 * variable of the batch's mean distinct rows x dim floats (split over the
 * same ps tasks) is pulled or pushed the same way: the same bytes on the
 * wire, without ids, hashing or gathering. rows/s and GB/s count the
 * distinct rows moved; the ratio is sparse GB/s over dense GB/s (goal for
 * Zipf pulls at dim 64: 0.8 or better). extra_ns_per_row is what a row
 * costs over its dense bytes: the worker's dedup and split, the ps's hash
 * lookup and copy (or apply), the ids on the wire.
 *
 * Memory: a table of dim 8 with Adagrad (one slot) grown to 10 million
 * rows on the ps's own table code, bytes held per row beside the bytes its
 * row and slot need (goal: within 1.3x).
 *
 * --ps-replicas 2 (issue 29): each 2-ps point also runs a second cluster
 * whose every shard has two copies (each push forwarded to the backup ps
 * and answered once applied there; a pull's newly sighted ids forwarded so
 * the backup makes the same rows), its sparse calls alternated with the
 * one-copy cluster's in the same rounds: rows/s with two copies and the
 * ratio to one copy (goal: 0.85 or more).
 *
 * ps tasks are threads of this process, reached over Unix sockets.
 */
#include "bench/bench.h"

#include "common/common.h"
#include "common/cpu.h"
#include "ps/table.h"
#include "quorum.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BATCH 4096
#define NBATCHES 32
#define VOCAB 1000000
#define ZIPF_S 1.1
#define MAX_PS 2

typedef struct embed_opts {
    double seconds;     /* per side of a point */
    int64_t mem_rows;   /* rows of the memory measurement, 0: none */
    int rounds;         /* alternated rounds a point, the best kept */
    unsigned dims;      /* bit d: dims[d] */
    unsigned nps;       /* bit k: k + 1 ps */
    unsigned ids;       /* bit 1: Zipf, bit 0: uniform */
    unsigned ops;       /* bit op: op_names[op] */
    bool json, quick;
    bool replicas;      /* --ps-replicas 2: a two-copy cluster beside */
    unsigned sides;     /* --side: bit 0 the sparse calls, bit 1 the dense ones */
} embed_opts;

static double now_sec(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int usage(int status) {
    fprintf(status ? stderr : stdout,
            "usage: quorum bench embed [--seconds S] [--rounds R] [--dims D,..] [--ps N,..]\n"
            "                          [--ids zipf|uniform] [--ops OP,..] [--memory-rows N]\n"
            "                          [--ps-replicas 2] [--side sparse|dense] [--quick] [--json]\n"
            "  sparse pulls and pushes of a table's rows (dim 8, 64, 256; Zipf and uniform\n"
            "  ids; 1 and 2 ps) beside dense transfers of the same bytes, and a table's\n"
            "  memory per row\n"
            "  --seconds S       time per side of a point (default 0.5)\n"
            "  --rounds R        alternated rounds a point, the best kept (default 2)\n"
            "  --dims D,..       only these of 8, 64, 256\n"
            "  --ps N,..         only these of 1, 2 ps\n"
            "  --ids zipf|uniform  only these ids\n"
            "  --ops OP,..       only these of pull, pull_distinct, push\n"
            "  --memory-rows N   rows of the memory measurement (default 10000000; 0: none)\n"
            "  --ps-replicas 2   also the sparse calls of a cluster with two copies of every\n"
            "                    shard, alternated with one copy's: rows/s and the ratio\n"
            "                    (goal 0.85 or more); 2 ps only (--ps 1 is refused)\n"
            "  --side sparse|dense  only the sparse calls or only the dense ones (no ratio):\n"
            "                    for a profiler (perf record) to see one side alone\n"
            "  --quick           0.05 s a side, 200000 rows (a smoke test)\n"
            "  --json            one JSON object per point and one for the memory\n");
    return status;
}

/* ---- ids ---------------------------------------------------------------------- */

static int cmp_id(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

static int64_t *make_ids(bool zipf);

typedef struct id_batches {
    int64_t *ids;      /* NBATCHES x BATCH, as drawn */
    int64_t *uniq;     /* NBATCHES x BATCH: each batch's distinct ids first */
    int nuniq[NBATCHES];
    double distinct;   /* mean of nuniq */
} id_batches;

/* NBATCHES batches of BATCH ids; Zipf by inverse CDF over VOCAB ranks (rank
 * r drawn with weight 1/r^s), scattered over the id space so that hot ids
 * are not neighbours. */
static int make_batches(bool zipf, id_batches *b) {
    b->uniq = malloc((size_t)NBATCHES * BATCH * sizeof *b->uniq);
    b->ids = b->uniq ? make_ids(zipf) : NULL;
    if (!b->ids) {
        free(b->uniq);
        return QR_ENOMEM;
    }
    double total = 0;
    for (int k = 0; k < NBATCHES; k++) {
        int64_t *u = b->uniq + (size_t)k * BATCH;
        memcpy(u, b->ids + (size_t)k * BATCH, BATCH * sizeof *u);
        qsort(u, BATCH, sizeof *u, cmp_id);
        int n = 1;
        for (int i = 1; i < BATCH; i++)
            if (u[i] != u[n - 1]) u[n++] = u[i];
        b->nuniq[k] = n;
        total += n;
    }
    b->distinct = total / NBATCHES;
    return QR_OK;
}

static int64_t *make_ids(bool zipf) {
    int64_t *ids = malloc((size_t)NBATCHES * BATCH * sizeof *ids);
    double *cdf = zipf ? malloc((size_t)VOCAB * sizeof *cdf) : NULL;
    if (!ids || (zipf && !cdf)) {
        free(ids);
        free(cdf);
        return NULL;
    }
    if (zipf) {
        double sum = 0;
        for (int r = 0; r < VOCAB; r++) cdf[r] = (sum += pow(r + 1.0, -ZIPF_S));
        for (int r = 0; r < VOCAB; r++) cdf[r] /= sum;
    }
    qr_rng rng; /* seeded: the same ids in every run */
    qr_rng_seed(&rng, zipf ? 11 : 12);
    for (int i = 0; i < NBATCHES * BATCH; i++) {
        uint64_t rank;
        if (zipf) {
            double u = (double)(qr_rng_next(&rng) >> 11) / 9007199254740992.0;
            int lo = 0, hi = VOCAB - 1;
            while (lo < hi) {
                int mid = (lo + hi) / 2;
                if (cdf[mid] < u) lo = mid + 1;
                else hi = mid;
            }
            rank = (uint64_t)lo;
        } else {
            rank = qr_rng_below(&rng, VOCAB);
        }
        ids[i] = (int64_t)(qr__fnv1a(&rank, sizeof rank, 14695981039346656037ull) >> 1);
    }
    free(cdf);
    return ids;
}

/* ---- a cluster of nps ps threads and one worker --------------------------------- */

typedef struct cluster_run {
    char dir[256];
    qr_config *cfg;
    qr_ps *ps[MAX_PS];
    pthread_t tid[MAX_PS];
    int nps, started;
    qr_worker *w;
} cluster_run;

static void *ps_main(void *arg) {
    qr_ps_run(arg);
    return NULL;
}

static int cluster_start(cluster_run *c, int nps, int copies) {
    memset(c, 0, sizeof *c);
    c->nps = nps;
    snprintf(c->dir, sizeof c->dir, "%s/quorum-bench-embed-%d-%d",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(), copies);
    char ps_hosts[700] = "", worker[300];
    for (int i = 0; i < nps; i++) {
        size_t at = strlen(ps_hosts);
        snprintf(ps_hosts + at, sizeof ps_hosts - at, "%sunix:%s/ps%d.sock", i ? "," : "", c->dir, i);
    }
    snprintf(worker, sizeof worker, "unix:%s/w0.sock", c->dir);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", c->dir);
    if (system(cmd)) return qr__fail(QR_EIO, "bench embed: cannot create %s", c->dir);
    int rc = qr_config_new(&c->cfg);
    if (!rc) rc = qr_config_set(c->cfg, "lr", "1e-9"); /* SGD: no slots, the rows barely move */
    if (!rc) rc = qr_config_set(c->cfg, "ps-replicas", copies == 2 ? "2" : "1");
    for (int i = 0; i < nps && !rc; i++) {
        qr_cluster *spec;
        rc = qr_cluster_from_flags(&spec, ps_hosts, worker, "ps", i);
        if (!rc) rc = qr_ps_create(&c->ps[i], spec, c->cfg);
        qr_cluster_free(spec);
        if (!rc && pthread_create(&c->tid[i], NULL, ps_main, c->ps[i])) rc = QR_EINTERNAL;
        if (!rc) c->started++;
    }
    qr_cluster *spec = NULL;
    if (!rc) rc = qr_cluster_from_flags(&spec, ps_hosts, worker, "worker", 0);
    if (!rc) rc = qr_worker_create(&c->w, spec, 0, c->cfg);
    qr_cluster_free(spec);
    return rc;
}

static void cluster_stop(cluster_run *c) {
    if (c->w) qr_worker_stop_cluster(c->w);
    qr_worker_free(c->w);
    for (int i = 0; i < c->started; i++) {
        qr_ps_stop(c->ps[i]);
        pthread_join(c->tid[i], NULL);
    }
    for (int i = 0; i < c->nps; i++) qr_ps_free(c->ps[i]);
    qr_config_free(c->cfg);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", c->dir);
    if (system(cmd)) fprintf(stderr, "bench embed: could not remove %s\n", c->dir);
}

/* ---- one point ---------------------------------------------------------------------- */

/* pull: the batch's ids as drawn (duplicates removed by the worker, each
 * position filled); pull_distinct: its distinct ids only, as
 * quorum.torch.Embedding asks (the model gathers by its inverse index);
 * push: a gradient row per id, summed by id on the worker. */
enum { OP_PULL, OP_PULL_DISTINCT, OP_PUSH, NOPS };
static const char *const op_names[NOPS] = {"pull", "pull_distinct", "push"};

typedef struct point {
    int nps, dim, op;
    bool zipf;
    double distinct;            /* mean distinct rows a call moves */
    double calls_per_s, dense_calls_per_s;
    double repl_calls_per_s;    /* --ps-replicas 2: the sparse call with two copies; 0: none */
} point;

/* Calls per second of op over `seconds` (at least 3 calls), or -1. */
typedef int (*op_fn)(cluster_run *c, int k, void *ctx);

static double rate(cluster_run *c, op_fn op, void *ctx, double seconds) {
    int k = 0;
    double t0 = now_sec(), t;
    do {
        if (op(c, k++, ctx)) {
            fprintf(stderr, "bench embed: %s\n", qr_last_error());
            return -1;
        }
        t = now_sec();
    } while (k < 3 || t - t0 < seconds);
    return k / (t - t0);
}

typedef struct calls {
    int table, dense;
    int dim;
    const id_batches *ids;
    float *rows, *grads, *dense_buf;
} calls;

static int sparse_pull(cluster_run *c, int k, void *ctx) {
    calls *x = ctx;
    return qr_worker_pull_rows(c->w, x->table, BATCH,
                               x->ids->ids + (size_t)(k % NBATCHES) * BATCH, x->rows, 0);
}

static int sparse_pull_distinct(cluster_run *c, int k, void *ctx) {
    calls *x = ctx;
    k %= NBATCHES;
    return qr_worker_pull_rows(c->w, x->table, x->ids->nuniq[k], x->ids->uniq + (size_t)k * BATCH,
                               x->rows, 0);
}

static int sparse_push(cluster_run *c, int k, void *ctx) {
    calls *x = ctx;
    return qr_worker_push_sparse(c->w, x->table, BATCH,
                                 x->ids->ids + (size_t)(k % NBATCHES) * BATCH, x->grads, 0, NULL);
}

static int dense_pull(cluster_run *c, int k, void *ctx) {
    (void)k;
    calls *x = ctx;
    float *dst[1] = {x->dense_buf};
    return qr_worker_pull(c->w, 1, &x->dense, dst);
}

static int dense_push(cluster_run *c, int k, void *ctx) {
    (void)k;
    calls *x = ctx;
    const float *g[1] = {x->dense_buf};
    return qr_worker_push(c->w, 1, &x->dense, g, 0, NULL);
}

/* One cluster and its table and dense variable, its rows made. */
static int setup(cluster_run *c, int nps, int copies, calls *x, double distinct) {
    int rc = cluster_start(c, nps, copies);
    int64_t rows = (int64_t)(distinct + 0.5);
    int64_t shape[2] = {rows, x->dim};
    char opts[32];
    snprintf(opts, sizeof opts, "partitions=%d", nps);
    if (!rc) rc = qr_worker_declare_table(c->w, "table", x->dim, "normal:0,0.01", 1, "", &x->table);
    if (!rc) rc = qr_worker_declare_opts(c->w, "dense", 2, shape, "normal:0,0.01", 2, opts, &x->dense);
    if (!rc) rc = qr_worker_initialize(c->w);
    x->rows = malloc((size_t)BATCH * x->dim * sizeof(float));
    x->grads = malloc((size_t)BATCH * x->dim * sizeof(float));
    x->dense_buf = malloc((size_t)rows * x->dim * sizeof(float));
    if (!rc && (!x->rows || !x->grads || !x->dense_buf)) rc = QR_ENOMEM;
    for (int i = 0; !rc && i < BATCH * x->dim; i++) x->grads[i] = 1e-3f;
    for (int64_t i = 0; !rc && i < rows * x->dim; i++) x->dense_buf[i] = 1e-3f;
    for (int k = 0; !rc && k < NBATCHES; k++) rc = sparse_pull(c, k, x); /* warm: rows made */
    return rc;
}

static void teardown(cluster_run *c, calls *x) {
    free(x->rows);
    free(x->grads);
    free(x->dense_buf);
    cluster_stop(c);
}

/* Every op of one (nps, dim, ids) setting: NOPS points; with two_copies
 * also each sparse call on a cluster with --ps-replicas 2. */
static int measure(int nps, int dim, bool zipf, const id_batches *ids, double seconds,
                   int rounds, unsigned ops, unsigned sides, bool two_copies, point out[NOPS]) {
    static const op_fn sparse[NOPS] = {sparse_pull, sparse_pull_distinct, sparse_push};
    static const op_fn dense[NOPS] = {dense_pull, dense_pull, dense_push};
    cluster_run c, c2;
    calls x = {.dim = dim, .ids = ids}, x2 = {.dim = dim, .ids = ids};
    double distinct = ids->distinct;
    int rc = setup(&c, nps, 1, &x, distinct);
    if (!rc && two_copies) rc = setup(&c2, nps, 2, &x2, distinct);
    for (int op = 0; !rc && op < NOPS; op++) {
        point *p = &out[op];
        *p = (point){.nps = nps, .dim = dim, .zipf = zipf, .op = op, .distinct = distinct};
        if (!(ops >> op & 1)) continue;
        /* Alternated, best of the rounds: every side sees the same machine. */
        for (int round = 0; round < rounds && !rc; round++) {
            double s = sides & 1 ? rate(&c, sparse[op], &x, seconds) : 0;
            double d = sides & 2 ? rate(&c, dense[op], &x, seconds) : 0;
            double s2 = two_copies ? rate(&c2, sparse[op], &x2, seconds) : 0;
            if (s < 0 || d < 0 || s2 < 0) rc = QR_EINTERNAL;
            p->calls_per_s = QR_MAX(p->calls_per_s, s);
            p->dense_calls_per_s = QR_MAX(p->dense_calls_per_s, d);
            p->repl_calls_per_s = QR_MAX(p->repl_calls_per_s, s2);
        }
    }
    if (rc) fprintf(stderr, "bench embed: %s\n", qr_last_error());
    teardown(&c, &x);
    if (two_copies) teardown(&c2, &x2);
    return rc;
}

/* ---- memory ------------------------------------------------------------------------- */

typedef struct memory {
    int64_t rows;
    double held_per_row, needed_per_row;
    double insert_ns_per_row;
} memory;

/* The ps's table code itself (ps/table.h), dim 8 with one slot (Adagrad). */
static int measure_memory(int64_t rows, memory *m) {
    qr_table t;
    float slot_init = 0.1f;
    int rc = qr_table_init(&t, 8, 1, &slot_init, "normal:0,0.01", 1);
    double t0 = now_sec();
    qr_rng rng;
    qr_rng_seed(&rng, 5);
    for (int64_t i = 0; !rc && i < rows; i++) {
        bool added;
        if (qr_table_get_or_add(&t, (int64_t)(qr_rng_next(&rng) >> 1), &added) < 0) rc = QR_ENOMEM;
    }
    double dt = now_sec() - t0;
    *m = (memory){.rows = (int64_t)t.count,
                  .held_per_row = (double)qr_table_bytes(&t) / (double)t.count,
                  .needed_per_row = 8 * 4 * 2, .insert_ns_per_row = dt / (double)rows * 1e9};
    qr_table_free(&t);
    return rc;
}

/* ---- the run --------------------------------------------------------------------------- */

static void print_point(const point *p, bool json) {
    if (!p->calls_per_s || !p->dense_calls_per_s) { /* --side: one side only */
        const char *side = p->calls_per_s ? "sparse" : "dense";
        double per_s = p->calls_per_s ? p->calls_per_s : p->dense_calls_per_s;
        if (json)
            printf("{\"kind\":\"%s\",\"side\":\"%s\",\"dim\":%d,\"nps\":%d,\"calls_per_s\":%.1f}\n",
                   op_names[p->op], side, p->dim, p->nps, per_s);
        else
            printf("%-13s %4d %2d %s only: %.1f calls/s\n", op_names[p->op], p->dim, p->nps, side,
                   per_s);
        return;
    }
    double bytes = p->distinct * p->dim * 4;
    double gbps = p->calls_per_s * bytes / 1e9, dense = p->dense_calls_per_s * bytes / 1e9;
    double rows_s = p->calls_per_s * p->distinct;
    /* Per row beyond its bytes: a call's time minus the dense call's. */
    double extra_ns = (1 / p->calls_per_s - 1 / p->dense_calls_per_s) / p->distinct * 1e9;
    const char *op = op_names[p->op], *ids = p->zipf ? "zipf" : "uniform";
    if (json) {
        printf("{\"kind\":\"%s\",\"dim\":%d,\"ids\":\"%s\",\"nps\":%d,\"batch\":%d,"
               "\"distinct_rows\":%.1f,\"rows_per_s\":%.0f,\"gb_per_s\":%.4f,"
               "\"dense_gb_per_s\":%.4f,\"ratio\":%.3f,\"extra_ns_per_row\":%.1f",
               op, p->dim, ids, p->nps, BATCH, p->distinct, rows_s, gbps, dense, gbps / dense,
               extra_ns);
        if (p->repl_calls_per_s > 0)
            printf(",\"replicas_rows_per_s\":%.0f,\"replicas_ratio\":%.3f",
                   p->repl_calls_per_s * p->distinct, p->repl_calls_per_s / p->calls_per_s);
        printf("}\n");
        return;
    }
    printf("%-13s %4d %-7s %2d | %7.0f %12.0f %8.3f | %8.3f %6.2f | %10.1f", op, p->dim, ids,
           p->nps, p->distinct, rows_s, gbps, dense, gbps / dense, extra_ns);
    if (p->repl_calls_per_s > 0)
        printf(" | %12.0f %6.2f", p->repl_calls_per_s * p->distinct,
               p->repl_calls_per_s / p->calls_per_s);
    printf("\n");
}

/* A comma-separated subset of the values of `all` (n of them) as bits;
 * 0 if a value is not among them. */
static unsigned parse_set(const char *text, const int *all, int n) {
    unsigned bits = 0;
    for (const char *at = text; *at;) {
        char *end;
        long x = strtol(at, &end, 10);
        int k = 0;
        while (k < n && all[k] != x) k++;
        if (end == at || k == n || (*end && *end != ',')) return 0;
        bits |= 1u << k;
        at = *end ? end + 1 : end;
    }
    return bits;
}

/* Bits of the comma-separated names among op_names; 0 if one is not. */
static unsigned parse_ops(const char *text) {
    unsigned bits = 0;
    for (const char *at = text; *at;) {
        size_t len = strcspn(at, ",");
        int op = 0;
        while (op < NOPS && (strlen(op_names[op]) != len || strncmp(at, op_names[op], len))) op++;
        if (op == NOPS) return 0;
        bits |= 1u << op;
        at += len + (at[len] == ',');
    }
    return bits;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* --ps-replicas 2: the median ratio (two copies / one) of each op. */
static void print_replicas(double ratios[NOPS][6], const int *n, bool json) {
    if (json) printf("{\"kind\":\"replicas\",\"goal\":0.85");
    else printf("\nreplicas: rows/s with two copies / one copy, median per op (goal 0.85):");
    for (int op = 0; op < NOPS; op++) {
        if (!n[op]) continue;
        qsort(ratios[op], (size_t)n[op], sizeof(double), cmp_double);
        double m = n[op] % 2 ? ratios[op][n[op] / 2]
                             : (ratios[op][n[op] / 2 - 1] + ratios[op][n[op] / 2]) / 2;
        if (json) printf(",\"%s\":%.3f", op_names[op], m);
        else printf(" %s %.2f (%d points)", op_names[op], m, n[op]);
    }
    printf(json ? "}\n" : "\n");
}

static const int dims[3] = {8, 64, 256};
static const int ps_counts[MAX_PS] = {1, 2};

int qr_bench_embed_main(int argc, char **argv) {
    embed_opts o = {.seconds = 0.5, .mem_rows = 10000000, .rounds = 2, .dims = 7, .nps = 3,
                    .ids = 3, .ops = (1u << NOPS) - 1, .sides = 3};
    bool ps_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(0);
        if (!strcmp(a, "--quick")) o.quick = true, o.seconds = 0.05, o.mem_rows = 200000;
        else if (!strcmp(a, "--json")) o.json = true;
        else if (v && !strcmp(a, "--seconds")) o.seconds = atof(v), i++;
        else if (v && !strcmp(a, "--memory-rows")) o.mem_rows = atoll(v), i++;
        else if (v && !strcmp(a, "--rounds")) o.rounds = atoi(v), i++;
        else if (v && !strcmp(a, "--dims")) o.dims = parse_set(v, dims, 3), i++;
        else if (v && !strcmp(a, "--ps")) o.nps = parse_set(v, ps_counts, MAX_PS), ps_given = true, i++;
        else if (v && !strcmp(a, "--ops")) o.ops = parse_ops(v), i++;
        else if (v && !strcmp(a, "--ps-replicas") && (!strcmp(v, "1") || !strcmp(v, "2")))
            o.replicas = v[0] == '2', i++;
        else if (v && !strcmp(a, "--side"))
            o.sides = !strcmp(v, "sparse") ? 1 : !strcmp(v, "dense") ? 2 : 0, i++;
        else if (v && !strcmp(a, "--ids"))
            o.ids = !strcmp(v, "zipf") ? 2 : !strcmp(v, "uniform") ? 1 : 0, i++;
        else {
            fprintf(stderr, "bench embed: unknown option or missing value: %s\n", a);
            return usage(2);
        }
    }
    if (o.seconds <= 0 || o.seconds > 60 || (o.mem_rows && o.mem_rows < 1000) ||
        o.mem_rows > 200000000 || o.rounds < 1 || o.rounds > 100 || !o.dims || !o.nps || !o.ids ||
        !o.ops || !o.sides) {
        fprintf(stderr, "bench embed: --seconds 0..60, --rounds 1..100, --memory-rows 0 or "
                "1000..200000000, --dims among 8,64,256, --ps among 1,2, --ids zipf or "
                "uniform, --ops among pull,pull_distinct,push, --side sparse or dense\n");
        return 2;
    }
    /* Two copies need 2 ps (a shard's backup is on the other one). */
    if (o.replicas && o.nps != 2) {
        if (ps_given) {
            fprintf(stderr, "bench embed: --ps-replicas 2 needs 2 ps (a shard's backup is on "
                    "another ps): --ps 2\n");
            return 2;
        }
        o.nps = 2;
    }
    qr_set_log_level(QR_LOG_WARN);
    if (!o.json) {
        char cpu[256];
        qr__cpu_summary(cpu, sizeof cpu);
        printf("# cpu: %s\n", cpu);
    }
    if (!o.json)
        printf("quorum bench embed: batches of %d ids over %d values (Zipf s=%.1f or uniform), "
               "warm table, SGD;\nbaseline: a dense variable of the same bytes over the same "
               "ps, same run (best of %d alternated rounds of %.2f s)\n\n"
               "op             dim ids     ps |    rows        rows/s     GB/s | dense GB/s  ratio | "
               "extra ns/row%s\n", BATCH, VOCAB, ZIPF_S, o.rounds, o.seconds,
               o.replicas ? " |  2cp rows/s   /1cp" : "");
    int rc = 0;
    /* --ps-replicas 2: two copies / one copy, per op (at most 2 ids x 3 dims) */
    double ratios[NOPS][6];
    int nratios[NOPS] = {0};
    for (int z = 1; z >= 0 && !rc; z--) {
        if (!(o.ids >> z & 1)) continue;
        id_batches ids;
        if (make_batches(z, &ids)) return 1;
        for (int c = 0; c < MAX_PS && !rc; c++)
            for (int d = 0; d < 3 && !rc; d++) {
                if (!(o.nps >> c & 1) || !(o.dims >> d & 1)) continue;
                point p[NOPS];
                rc = measure(ps_counts[c], dims[d], z, &ids, o.seconds, o.rounds, o.ops,
                             o.sides, o.replicas, p);
                for (int k = 0; !rc && k < NOPS; k++) {
                    if (!(o.ops >> k & 1)) continue;
                    print_point(&p[k], o.json);
                    if (p[k].repl_calls_per_s > 0 && nratios[k] < 6)
                        ratios[k][nratios[k]++] = p[k].repl_calls_per_s / p[k].calls_per_s;
                }
            }
        free(ids.ids);
        free(ids.uniq);
    }
    if (rc) return 1;
    if (o.replicas) print_replicas(ratios, nratios, o.json);
    if (!o.mem_rows) return 0;
    memory m;
    if (measure_memory(o.mem_rows, &m)) {
        fprintf(stderr, "bench embed: %s\n", qr_last_error());
        return 1;
    }
    if (o.json)
        printf("{\"kind\":\"memory\",\"rows\":%lld,\"dim\":8,\"slots\":1,\"bytes_per_row\":%.1f,"
               "\"needed_per_row\":%.0f,\"ratio\":%.3f,\"insert_ns_per_row\":%.1f}\n",
               (long long)m.rows, m.held_per_row, m.needed_per_row,
               m.held_per_row / m.needed_per_row, m.insert_ns_per_row);
    else
        printf("\nmemory: %lld rows of dim 8 with Adagrad hold %.1f bytes a row for %.0f needed: "
               "%.2fx (goal 1.3x); %.0f ns to make a row\n", (long long)m.rows, m.held_per_row,
               m.needed_per_row, m.held_per_row / m.needed_per_row, m.insert_ns_per_row);
    return 0;
}

/*
 * bench_optim.c - how fast the ps applies each optimizer, beside the
 * memory-bandwidth bound for the same bytes measured in the same run.
 *
 *   quorum bench optim [--json] [--quick] [--n N] [--rows R] [--nidx K]
 *                      [--dim D] [--threads 1,2] [--reps R] [--optim a,b]
 *
 * Dense: each optimizer applied to an N-float tensor (default 16M). An
 * apply reads var, g and every per-element slot and writes var and the
 * slots (Adam: read var,m,v,g + write var,m,v = 7 x 4 bytes per element).
 * The bound is a STREAM-triad-like kernel over the same arrays with the
 * same pattern (a[i] += s * g[i] for each written array), so the ratio
 * says how close the optimizer is to the memory system.
 * Sparse: K random rows (default 1M, duplicates included) of dim D
 * (default 64) applied to an R-row variable (default 10M rows, 2.5 GB per
 * array: Adam needs ~8 GB); the bound does the same row updates on the
 * distinct rows. Reports rows/s.
 * Sync: a synchronous step's ps work on one variable, --members M
 * gradients of --sync-n floats (default 4 x 1M) reduced in member order and
 * applied, two ways in the same run: the two passes of before (the
 * reduce into the first gradient's buffer as the ps made it, then
 * qr_optim_apply_dense) and the fused pass (qr_optim_reduce_apply_dense),
 * alternating which goes first. speedup = the median over the repetitions
 * of t_two_pass / t_fused; check_ratio = the median of t_check / t_fused,
 * where t_check is a NaN/Inf scan of the M gradients (qr_optim_all_finite):
 * what a check at apply time would add to the fused pass (the ps checks
 * each push as it arrives instead, ps/grad_check.c).
 * Each point: elements/s and GB/s of the best of --reps applies after one
 * warm-up (the machine is shared; the best time is the least disturbed),
 * bound_gbps of the best bound run, and ratio = the median over the
 * repetitions of t_bound / t_apply measured back to back. --json prints
 * one JSON object {"benchmark":"optim", ..., "results":[{optimizer, kind,
 * threads, elements_per_sec, [rows_per_sec,] gbps, bound_gbps, ratio}]}.
 */
#include "bench/bench.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cpu.h"
#include "optim/optim_internal.h"

typedef struct bench_opts {
    bool json, quick;
    int64_t n, rows, nidx, dim, sync_n;
    int members;
    int reps;
    int threads[8], nthreads;
    const char *optims;
} bench_opts;

static const char *all_optims = "sgd,momentum,adagrad,rmsprop,adam,adam_async,ftrl,adamw";

#define QR_BENCH_MAX_MEMBERS 64

/* ---- the bandwidth bound: same arrays, same read/write pattern --------- */

typedef struct bound_job {
    float **w;       /* written (and read) arrays */
    int nw;
    const float *g;  /* read-only */
    int64_t n;
    /* sparse: distinct rows */
    const int64_t *rows;
    int64_t nrows, dim;
} bound_job;

/* Built like the optimizer loops (SSE2 and AVX2 clones), so the bound is
 * not held back by a narrower instruction set than the optimizers use. */
QR_OPTIM_LOOP static void triad(float *restrict a, const float *restrict g, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) a[i] += s * g[i];
}

/* One pass: for every element i, every written array. Done in blocks of
 * 1024 so each block of all arrays is touched once (one pass over memory,
 * like the optimizer's fused loop). */
static void bound_dense_range(const bound_job *j, int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; b += 1024) {
        int64_t e = b + 1024 < hi ? b + 1024 : hi;
        for (int k = 0; k < j->nw; k++) triad(j->w[k] + b, j->g + b, e - b, 1e-7f);
    }
}

static void bound_dense_part(void *arg, int part, int nparts) {
    const bound_job *j = arg;
    int64_t blocks = (j->n + 15) / 16;
    int64_t lo = blocks * part / nparts * 16, hi = blocks * (part + 1) / nparts * 16;
    if (hi > j->n) hi = j->n;
    if (lo < hi) bound_dense_range(j, lo, hi);
}

static void bound_rows_range(const bound_job *j, int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; k++)
        for (int q = 0; q < j->nw; q++)
            triad(j->w[q] + j->rows[k] * j->dim, j->g + k * j->dim, j->dim, 1e-7f);
}

static void bound_rows_part(void *arg, int part, int nparts) {
    const bound_job *j = arg;
    bound_rows_range(j, j->nrows * part / nparts, j->nrows * (part + 1) / nparts);
}

/* ---- helpers --------------------------------------------------------------- */

static float *alloc_floats(int64_t n, qr_rng *rng, float scale) {
    float *p = qr__aligned_alloc((size_t)n * sizeof(float));
    if (!p) return NULL;
    if (rng)
        for (int64_t i = 0; i < n; i++) p[i] = (float)((qr_rng_uniform(rng) - 0.5) * scale);
    return p;
}

static int make_optim(const char *name, int threads, qr_optim **out) {
    qr_config *cfg;
    int rc = qr_config_new(&cfg);
    if (rc) return rc;
    char th[16];
    snprintf(th, sizeof th, "%d", threads);
    rc = qr_config_set(cfg, "optimizer", name);
    if (!rc) rc = qr_config_set(cfg, "apply-threads", th);
    if (!rc) rc = qr_optim_create(out, cfg);
    qr_config_free(cfg);
    return rc;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Median of the per-repetition ratios t_bound / t_apply: each pair was
 * measured back to back, so a neighbour's burst on the shared machine
 * disturbs both alike; the best times alone can come from different
 * moments. */
/* The times of every measured repetition of an apply and of its bound,
 * and the best of each (start them at 1e30). */
typedef struct rep_times {
    double best_apply, best_bound;
    double apply[1000], bound[1000];
} rep_times;

/* Repetition r (0 = warm-up, not kept): the apply ran from t0 to t1, the
 * bound from t1 to t2. */
static void rep_record(rep_times *t, int r, double t0, double t1, double t2) {
    if (r == 0) return;
    t->best_apply = QR_MIN(t->best_apply, t1 - t0);
    t->best_bound = QR_MIN(t->best_bound, t2 - t1);
    t->apply[r - 1] = t1 - t0;
    t->bound[r - 1] = t2 - t1;
}

static double median_ratio(const double *t_apply, const double *t_bound, int n) {
    double r[1000];
    for (int i = 0; i < n; i++) r[i] = t_bound[i] / t_apply[i];
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && r[j - 1] > r[j]; j--) {
            double x = r[j];
            r[j] = r[j - 1];
            r[j - 1] = x;
        }
    return n % 2 ? r[n / 2] : 0.5 * (r[n / 2 - 1] + r[n / 2]);
}

static void add_point(cJSON *results, const char *optim, const char *kind, int threads,
                      double elems_per_sec, double rows_per_sec, double gbps, double bound_gbps,
                      double ratio, bool json) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "optimizer", optim);
    cJSON_AddStringToObject(p, "kind", kind);
    cJSON_AddNumberToObject(p, "threads", threads);
    cJSON_AddNumberToObject(p, "elements_per_sec", elems_per_sec);
    if (rows_per_sec > 0) cJSON_AddNumberToObject(p, "rows_per_sec", rows_per_sec);
    cJSON_AddNumberToObject(p, "gbps", gbps);
    cJSON_AddNumberToObject(p, "bound_gbps", bound_gbps);
    cJSON_AddNumberToObject(p, "ratio", ratio);
    cJSON_AddItemToArray(results, p);
    if (!json) {
        printf("%-11s %-6s %2d thr  %8.1f Melem/s", optim, kind, threads, elems_per_sec / 1e6);
        if (rows_per_sec > 0)
            printf("  %6.2f Mrows/s", rows_per_sec / 1e6);
        else
            printf("                ");
        printf("  %6.2f GB/s  bound %6.2f GB/s  ratio %.2f\n", gbps, bound_gbps, ratio);
        fflush(stdout);
    }
}

/* The optimizer under test and, with threads, a pool of the same size
 * for the bound kernel, so both sides use the same number of threads. */
static int make_optim_and_pool(const char *name, int threads, qr_optim **opt,
                               qr_optim_pool **pool) {
    *pool = NULL;
    int rc = make_optim(name, threads, opt);
    if (rc) return rc;
    if (threads > 1 && (rc = qr__optim_pool_create(pool, threads))) {
        qr_optim_free(*opt);
        *opt = NULL;
    }
    return rc;
}

/* ---- dense ------------------------------------------------------------------ */

static int bench_dense(const bench_opts *o, const char *name, int threads, cJSON *results) {
    qr_optim *opt;
    qr_optim_pool *pool;
    int rc = make_optim_and_pool(name, threads, &opt, &pool);
    if (rc) return rc;
    qr_rng rng;
    qr_rng_seed(&rng, 1);
    int64_t n = o->n;
    float *var = alloc_floats(n, &rng, 2.0f), *g = alloc_floats(n, &rng, 0.02f);
    qr_optim_slots *s = NULL;
    if (!var || !g || (rc = qr_optim_slots_create(opt, 1, n, &s))) {
        rc = rc ? rc : QR_ENOMEM;
        goto out;
    }
    int ns = qr_optim_row_slots(opt);
    float *w[QR_OPTIM_MAX_SLOTS + 1];
    w[0] = var;
    for (int j = 0; j < ns; j++) qr_optim_slot(s, j, NULL, &w[j + 1], NULL);
    bound_job bj = {w, ns + 1, g, n, NULL, 0, 0};

    rep_times t = {.best_apply = 1e30, .best_bound = 1e30};
    for (int r = 0; r <= o->reps; r++) { /* r == 0: warm-up */
        double t0 = qr__now_sec();
        if ((rc = qr_optim_apply_dense(opt, s, var, g, n, -1, r + 1))) goto out;
        double t1 = qr__now_sec();
        if (!(pool && qr__optim_pool_run(pool, bound_dense_part, &bj))) bound_dense_range(&bj, 0, n);
        rep_record(&t, r, t0, t1, qr__now_sec());
    }
    double bytes = (double)n * 4.0 * (double)((ns + 2) + (ns + 1)); /* reads + writes */
    add_point(results, name, "dense", threads, (double)n / t.best_apply, 0,
              bytes / t.best_apply / 1e9, bytes / t.best_bound / 1e9,
              median_ratio(t.apply, t.bound, o->reps), o->json);
out:
    qr_optim_slots_free(s);
    free(var);
    free(g);
    qr__optim_pool_free(pool);
    qr_optim_free(opt);
    return rc;
}

/* ---- sync step: reduce + apply, two passes against one ------------------- */

/* The ps's reduce before the fusion, the baseline of the sync points: the
 * first gradient's buffer becomes the sum, one pass over it per further
 * gradient and one for the division. */
static void reduce_before(float *dst, const float *const *srcs, int k, int64_t n, float divisor) {
    for (int j = 1; j < k; j++)
        for (int64_t i = 0; i < n; i++) dst[i] += srcs[j][i];
    if (divisor != 1.0f)
        for (int64_t i = 0; i < n; i++) dst[i] /= divisor;
}

static int bench_sync(const bench_opts *o, const char *name, int threads, cJSON *results) {
    qr_optim *opt;
    int rc = make_optim(name, threads, &opt);
    if (rc) return rc;
    qr_rng rng;
    qr_rng_seed(&rng, 3);
    int64_t n = o->sync_n;
    int m = o->members;
    float *var = alloc_floats(n, &rng, 2.0f), *grads[QR_BENCH_MAX_MEMBERS] = {0};
    qr_optim_slots *s = NULL;
    bool ok = var != NULL;
    for (int i = 0; i < m; i++) ok &= (grads[i] = alloc_floats(n, &rng, 0.02f)) != NULL;
    if (!ok || (rc = qr_optim_slots_create(opt, 1, n, &s))) {
        rc = rc ? rc : QR_ENOMEM;
        goto out;
    }
    const float *srcs[QR_BENCH_MAX_MEMBERS];
    for (int i = 0; i < m; i++) srcs[i] = grads[i];
    double best_fused = 1e30, best_two = 1e30, t_fused[1000], t_two[1000], t_check[1000];
    int64_t step = 1;
    bool all_finite = true;
    for (int r = 0; r <= o->reps; r++) { /* r == 0: warm-up */
        double tf = 0, tt = 0;
        for (int turn = 0; turn < 2; turn++) {
            bool fused_now = (turn == 0) == (r % 2 == 0); /* alternate which goes first */
            double t0 = qr__now_sec();
            if (fused_now) {
                rc = qr_optim_reduce_apply_dense(opt, s, var, srcs, m, n, (float)m, -1, step++);
            } else { /* before: the sum into the first push's buffer, then the apply */
                reduce_before(grads[0], srcs, m, n, (float)m);
                rc = qr_optim_apply_dense(opt, s, var, grads[0], n, -1, step++);
            }
            if (rc) goto out;
            *(fused_now ? &tf : &tt) = qr__now_sec() - t0;
        }
        double t0 = qr__now_sec();
        for (int i = 0; i < m; i++) all_finite &= qr_optim_all_finite(grads[i], n);
        double tc = qr__now_sec() - t0;
        if (r == 0) continue;
        best_fused = QR_MIN(best_fused, tf);
        best_two = QR_MIN(best_two, tt);
        t_fused[r - 1] = tf;
        t_two[r - 1] = tt;
        t_check[r - 1] = tc;
    }
    if (!all_finite) {
        rc = qr__fail(QR_EINTERNAL, "bench optim: sync %s: the gradients went non-finite", name);
        goto out;
    }
    double sp = median_ratio(t_fused, t_two, o->reps), cr = median_ratio(t_fused, t_check, o->reps);
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "optimizer", name);
    cJSON_AddStringToObject(p, "kind", "sync");
    cJSON_AddNumberToObject(p, "threads", threads);
    cJSON_AddNumberToObject(p, "members", m);
    cJSON_AddNumberToObject(p, "elements", (double)n);
    cJSON_AddNumberToObject(p, "fused_ms", best_fused * 1e3);
    cJSON_AddNumberToObject(p, "two_pass_ms", best_two * 1e3);
    cJSON_AddNumberToObject(p, "speedup", sp);
    cJSON_AddNumberToObject(p, "check_ratio", cr);
    cJSON_AddItemToArray(results, p);
    if (!o->json) {
        printf("%-11s %-6s %2d thr  %d x %lld floats: fused %7.3f ms, two passes %7.3f ms (best)"
               "  speedup %.2f  check/fused %.2f\n",
               name, "sync", threads, m, (long long)n, best_fused * 1e3, best_two * 1e3, sp, cr);
        fflush(stdout);
    }
out:
    qr_optim_slots_free(s);
    free(var);
    for (int i = 0; i < m; i++) free(grads[i]);
    qr_optim_free(opt);
    return rc;
}

/* ---- sparse ------------------------------------------------------------- */

typedef struct sparse_data {
    float *var, *g;
    int64_t *idx, *uniq, nuniq;
} sparse_data;

static int bench_sparse(const bench_opts *o, const sparse_data *d, const char *name, int threads,
                        cJSON *results) {
    qr_optim *opt;
    qr_optim_pool *pool;
    int rc = make_optim_and_pool(name, threads, &opt, &pool);
    if (rc) return rc;
    qr_optim_slots *s = NULL;
    if ((rc = qr_optim_slots_create(opt, o->rows, o->dim, &s))) goto out;
    int ns = qr_optim_row_slots(opt);
    float *w[QR_OPTIM_MAX_SLOTS + 1];
    w[0] = d->var;
    for (int j = 0; j < ns; j++) qr_optim_slot(s, j, NULL, &w[j + 1], NULL);
    /* the bound reads its rows from the first nuniq gradient rows */
    bound_job bj = {w, ns + 1, d->g, 0, d->uniq, d->nuniq, o->dim};

    rep_times t = {.best_apply = 1e30, .best_bound = 1e30};
    for (int r = 0; r <= o->reps; r++) { /* r == 0: warm-up */
        double t0 = qr__now_sec();
        rc = qr_optim_apply_sparse(opt, s, d->var, o->rows, o->dim, d->idx, d->g, o->nidx, -1,
                                   r + 1);
        if (rc) goto out;
        double t1 = qr__now_sec();
        if (!(pool && qr__optim_pool_run(pool, bound_rows_part, &bj)))
            bound_rows_range(&bj, 0, d->nuniq);
        rep_record(&t, r, t0, t1, qr__now_sec());
    }
    /* bytes of the row updates (distinct rows); the gradient is read once */
    double row_bytes = (double)d->nuniq * (double)o->dim * 4.0 * (double)(2 * (ns + 1));
    double grad_bytes = (double)d->nuniq * (double)o->dim * 4.0;
    double bytes = row_bytes + grad_bytes;
    add_point(results, name, "sparse", threads, (double)o->nidx * (double)o->dim / t.best_apply,
              (double)o->nidx / t.best_apply, bytes / t.best_apply / 1e9,
              bytes / t.best_bound / 1e9, median_ratio(t.apply, t.bound, o->reps), o->json);
out:
    qr_optim_slots_free(s);
    qr__optim_pool_free(pool);
    qr_optim_free(opt);
    return rc;
}

/* ---- main --------------------------------------------------------------- */

static void usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s [--json] [--quick] [--n N] [--rows R] [--nidx K] [--dim D]\n"
            "          [--threads 1,2] [--reps R] [--optim sgd,adam,...] [--no-sparse]\n"
            "          [--sync-n N] [--members M] [--no-sync]\n",
            prog);
}

/* --help: what the benchmark measures and its options. */
static int help(const char *prog) {
    usage(stdout, prog);
    printf("\n"
           "How fast a ps applies each optimizer, beside the memory-bandwidth bound for\n"
           "the same bytes (a STREAM-triad-like kernel over the same arrays) measured in\n"
           "the same run. Each point reports elements/s and GB/s of the best repetition,\n"
           "the bound's GB/s and their ratio. Sync points time a synchronous step's\n"
           "reduce and apply, in two passes and fused, in the same run.\n"
           "\n"
           "options:\n"
           "  --n N              dense: floats per tensor (default 16M)\n"
           "  --rows R           sparse: rows of the variable (default 10M)\n"
           "  --nidx K           sparse: rows applied, duplicates included (default 1M)\n"
           "  --dim D            sparse: floats per row (default 64)\n"
           "  --threads 1,2      apply threads to measure (default 1 and the cores)\n"
           "  --reps R           repetitions of each point after a warm-up (default 5)\n"
           "  --optim a,b        optimizers to measure (default all)\n"
           "  --no-sparse        no sparse applies\n"
           "  --sync-n N         sync: floats per gradient (default 1M)\n"
           "  --members M        sync: gradients reduced per step, 1..64 (default 4)\n"
           "  --no-sync          no sync-step points (reduce + apply, two passes vs fused)\n"
           "  --quick            small sizes for a smoke test\n"
           "  --json             print one JSON object with every result\n"
           "  --help             this text\n");
    return 0;
}

/* A bad option: say which, then how to call. */
static int bad_usage(const char *prog, const char *arg, const char *value) {
    fprintf(stderr, "%s: %s%s%s: unknown option, missing value or bad value\n", prog, arg,
            value ? " " : "", value ? value : "");
    usage(stderr, prog);
    return 2;
}

int qr_bench_optim_main(int argc, char **argv) {
    bench_opts o = {.n = 16 << 20, .rows = 10000000, .nidx = 1 << 20, .dim = 64, .reps = 5,
                    .sync_n = 1 << 20, .members = 4, .optims = all_optims};
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o.threads[o.nthreads++] = 1;
    if (ncpu > 1) o.threads[o.nthreads++] = (int)QR_MIN(ncpu, 64);
    bool sparse = true, sync = true, n_set = false, rows_set = false, nidx_set = false,
         reps_set = false, sync_n_set = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return help(argv[0]);
        if (!strcmp(a, "--json")) o.json = true;
        else if (!strcmp(a, "--quick")) o.quick = true;
        else if (!strcmp(a, "--no-sparse")) sparse = false;
        else if (!strcmp(a, "--no-sync")) sync = false;
        else if (v && !strcmp(a, "--members")) {
            if (qr__parse_int64(v, 1, QR_BENCH_MAX_MEMBERS, &x)) {
                fprintf(stderr, "%s: %s %s: %s\n", argv[0], a, v, qr_last_error());
                return 2;
            }
            o.members = (int)x;
            i++;
        } else if (v && (!strcmp(a, "--n") || !strcmp(a, "--rows") || !strcmp(a, "--nidx") ||
                       !strcmp(a, "--dim") || !strcmp(a, "--reps") || !strcmp(a, "--sync-n"))) {
            if (qr__parse_int64(v, 1, (int64_t)1 << 40, &x)) {
                fprintf(stderr, "%s: %s %s: %s\n", argv[0], a, v, qr_last_error());
                return 2;
            }
            if (!strcmp(a, "--n")) o.n = x, n_set = true;
            else if (!strcmp(a, "--rows")) o.rows = x, rows_set = true;
            else if (!strcmp(a, "--nidx")) o.nidx = x, nidx_set = true;
            else if (!strcmp(a, "--dim")) o.dim = x;
            else if (!strcmp(a, "--sync-n")) o.sync_n = x, sync_n_set = true;
            else o.reps = (int)QR_MIN(x, 1000), reps_set = true;
            i++;
        } else if (v && !strcmp(a, "--threads")) {
            o.nthreads = 0;
            for (char *p = argv[++i]; *p && o.nthreads < 8;) {
                char *end;
                long t = strtol(p, &end, 10);
                if (end == p || t < 1 || t > 64) return bad_usage(argv[0], a, v);
                o.threads[o.nthreads++] = (int)t;
                p = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') return bad_usage(argv[0], a, v);
            }
        } else if (v && !strcmp(a, "--optim")) {
            o.optims = argv[++i];
        } else {
            return bad_usage(argv[0], a, NULL);
        }
    }
    if (o.quick) {
        if (!n_set) o.n = 1 << 20;
        if (!rows_set) o.rows = 100000;
        if (!nidx_set) o.nidx = 20000;
        if (!reps_set) o.reps = 2;
        if (!sync_n_set) o.sync_n = 100003; /* no multiple of the block */
    }

    cJSON *root = cJSON_CreateObject(), *results = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "benchmark", "optim");
    cJSON_AddNumberToObject(root, "dense_elements", (double)o.n);
    cJSON_AddNumberToObject(root, "sparse_rows", (double)o.rows);
    cJSON_AddNumberToObject(root, "sparse_indices", (double)o.nidx);
    cJSON_AddNumberToObject(root, "dim", (double)o.dim);
    cJSON_AddNumberToObject(root, "sync_elements", (double)o.sync_n);
    cJSON_AddNumberToObject(root, "sync_members", o.members);
    cJSON_AddNumberToObject(root, "reps", o.reps);
    cJSON_AddItemToObject(root, "results", results);
    cJSON *cpu = qr__cpu_json();
    if (cpu) cJSON_AddItemToObject(root, "cpu", cpu);
    if (!o.json) {
        char line[256];
        qr__cpu_summary(line, sizeof line);
        printf("# cpu: %s\n", line);
    }
    if (!o.json)
        printf("optimizer applies: dense %lld floats, sparse %lld rows x %lld of a %lld-row "
               "variable; best of %d\n",
               (long long)o.n, (long long)o.nidx, (long long)o.dim, (long long)o.rows, o.reps);

    int rc = QR_OK;
    const char *names[] = {"sgd",        "momentum", "adagrad", "rmsprop",
                           "adam",       "adam_async", "ftrl",  "adamw"};
    for (size_t k = 0; k < QR_ARRAY_LEN(names) && !rc; k++) {
        if (!qr__list_has(o.optims, ',', names[k])) continue;
        for (int t = 0; t < o.nthreads && !rc; t++) rc = bench_dense(&o, names[k], o.threads[t], results);
    }

    for (size_t k = 0; k < QR_ARRAY_LEN(names) && sync && !rc; k++) {
        if (!qr__list_has(o.optims, ',', names[k])) continue;
        for (int t = 0; t < o.nthreads && !rc; t++) rc = bench_sync(&o, names[k], o.threads[t], results);
    }

    sparse_data d = {0};
    if (sparse && !rc) {
        qr_rng rng;
        qr_rng_seed(&rng, 2);
        d.var = alloc_floats(o.rows * o.dim, &rng, 2.0f);
        d.g = alloc_floats(o.nidx * o.dim, &rng, 0.02f);
        d.idx = malloc((size_t)o.nidx * sizeof(int64_t));
        d.uniq = malloc((size_t)o.nidx * sizeof(int64_t));
        if (!d.var || !d.g || !d.idx || !d.uniq) {
            rc = qr__fail(QR_ENOMEM, "bench optim: out of memory for the sparse variable");
        } else {
            for (int64_t i = 0; i < o.nidx; i++) d.idx[i] = (int64_t)qr_rng_below(&rng, (uint64_t)o.rows);
            memcpy(d.uniq, d.idx, (size_t)o.nidx * sizeof(int64_t));
            qsort(d.uniq, (size_t)o.nidx, sizeof(int64_t), cmp_i64);
            for (int64_t i = 0; i < o.nidx; i++)
                if (d.nuniq == 0 || d.uniq[d.nuniq - 1] != d.uniq[i]) d.uniq[d.nuniq++] = d.uniq[i];
            /* the bound visits them in a random order too, like the apply */
            for (int64_t i = d.nuniq - 1; i > 0; i--) {
                int64_t j = (int64_t)qr_rng_below(&rng, (uint64_t)i + 1), tmp = d.uniq[i];
                d.uniq[i] = d.uniq[j];
                d.uniq[j] = tmp;
            }
        }
        for (size_t k = 0; k < QR_ARRAY_LEN(names) && !rc; k++) {
            if (!qr__list_has(o.optims, ',', names[k])) continue;
            for (int t = 0; t < o.nthreads && !rc; t++)
                rc = bench_sparse(&o, &d, names[k], o.threads[t], results);
        }
    }
    free(d.var);
    free(d.g);
    free(d.idx);
    free(d.uniq);

    if (rc) {
        fprintf(stderr, "%s: %s\n", argv[0], qr_last_error());
    } else if (o.json) {
        char *s = cJSON_Print(root);
        printf("%s\n", s);
        free(s);
    }
    cJSON_Delete(root);
    return rc ? 1 : 0;
}

#ifdef QR_BENCH_OPTIM_STANDALONE
int main(int argc, char **argv) {
    return qr_bench_optim_main(argc, argv);
}
#endif

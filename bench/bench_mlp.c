/*
 * bench_mlp.c - `quorum bench mlp`: how long the MLP's forward and its
 * forward plus backward take on quorum's kernels (model/model.c, OpenBLAS
 * sgemm), per step, at the shapes a worker trains.
 *
 *   quorum bench mlp [--json] [--quick] [--input D] [--hidden 1024,256]
 *                    [--classes C] [--batch 64,128] [--steps N] [--rounds R]
 *
 * A point is one batch size: a warm-up, then R rounds of N steps, each of
 * forward (qr_model_evaluate on one batch: the layers, the softmax and the
 * loss) and of forward and backward (qr_model_loss_grad: the same, and
 * every parameter's gradient), timed separately; the point reports the
 * median and the fastest round in microseconds a step. Parameters are
 * glorot-uniform, inputs uniform in [0, 1), labels uniform: the time of a
 * dense layer does not depend on the values.
 *
 * The figures alone say little; bench/python/bench_mlp.py runs this and
 * torch on the same shapes in the same run, alternating rounds, and prints
 * the ratio. One BLAS thread, as every quorum task computes (tools/quorum.c).
 */
#include "bench/bench.h"

#include "common/common.h"
#include "common/cpu.h"
#include "common/init.h"
#include "model/model.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MLP_MAX_LIST 16

typedef struct mlp_opts {
    int input, classes;
    int hidden[MLP_MAX_LIST], nhidden;
    int batch[MLP_MAX_LIST], nbatch;
    int steps, rounds;
    bool json, quick;
} mlp_opts;

/* One batch size's figures, microseconds a step. */
typedef struct mlp_point {
    double forward_us, forward_us_min;
    double step_us, step_us_min; /* forward and backward */
} mlp_point;

/* The model's parameters and their gradients, filled as a worker's. */
typedef struct mlp_params {
    int n;
    float **values, **grads;
    int64_t params;
} mlp_params;

static void params_free(mlp_params *p) {
    for (int i = 0; i < p->n; i++) {
        if (p->values) free(p->values[i]);
        if (p->grads) free(p->grads[i]);
    }
    free(p->values);
    free(p->grads);
}

static int params_make(mlp_params *p, const qr_model *m) {
    memset(p, 0, sizeof *p);
    p->n = qr_model_num_params(m);
    p->values = qr__calloc((size_t)p->n, sizeof *p->values);
    p->grads = qr__calloc((size_t)p->n, sizeof *p->grads);
    if (!p->values || !p->grads) return QR_ENOMEM;
    for (int i = 0; i < p->n; i++) {
        const char *init;
        int ndim;
        int64_t shape[2];
        qr_model_param_info(m, i, NULL, &ndim, shape, &init);
        int64_t size = shape[0] * shape[1];
        p->params += size;
        p->values[i] = qr__aligned_alloc((size_t)size * sizeof(float));
        p->grads[i] = qr__aligned_alloc((size_t)size * sizeof(float));
        if (!p->values[i] || !p->grads[i]) return QR_ENOMEM;
        int rc = qr_init_fill(p->values[i], size, ndim, shape, init, 1000 + (uint64_t)i);
        if (rc) return rc;
    }
    return QR_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* steps calls of forward (and backward, if step) on batch b; seconds. */
static int time_steps(qr_model *m, const mlp_params *p, const qr_dataset *b, bool step,
                      int steps, double *secs) {
    const float *const *values = (const float *const *)p->values;
    double start = qr__now_sec(), loss, acc;
    for (int s = 0; s < steps; s++) {
        int rc = step ? qr_model_loss_grad(m, values, p->grads, b->x, b->y, (int)b->n, &loss)
                      : qr_model_evaluate(m, values, b, &acc, &loss);
        if (rc) return rc;
    }
    *secs = qr__now_sec() - start;
    return QR_OK;
}

static int measure(const mlp_opts *o, int batch, mlp_point *pt, int64_t *nparams) {
    qr_model *m = NULL;
    mlp_params p = {0};
    qr_dataset b = {.n = batch, .dim = o->input, .nclasses = o->classes};
    double fwd[64], both[64];
    int rc = qr_model_create(&m, "mlp", o->input, o->hidden, o->nhidden, o->classes, batch);
    if (!rc) rc = params_make(&p, m);
    b.x = qr__aligned_alloc((size_t)batch * (size_t)o->input * sizeof(float));
    b.y = qr__calloc((size_t)batch, sizeof *b.y);
    if (!rc && (!b.x || !b.y)) rc = QR_ENOMEM;
    if (!rc) {
        qr_rng rng;
        qr_rng_seed(&rng, 7);
        for (int64_t i = 0; i < (int64_t)batch * o->input; i++)
            b.x[i] = (float)qr_rng_uniform(&rng);
        for (int i = 0; i < batch; i++) b.y[i] = (int32_t)qr_rng_below(&rng, (uint64_t)o->classes);
        double unused;
        rc = time_steps(m, &p, &b, true, QR_MAX(o->steps / 4, 2), &unused); /* warm-up */
    }
    for (int r = 0; !rc && r < o->rounds; r++) {
        rc = time_steps(m, &p, &b, false, o->steps, &fwd[r]);
        if (!rc) rc = time_steps(m, &p, &b, true, o->steps, &both[r]);
        fwd[r] *= 1e6 / o->steps;
        both[r] *= 1e6 / o->steps;
    }
    if (!rc) {
        /* median() sorts: [0] is then the fastest round */
        pt->forward_us = median(fwd, o->rounds);
        pt->forward_us_min = fwd[0];
        pt->step_us = median(both, o->rounds);
        pt->step_us_min = both[0];
        *nparams = p.params;
    }
    free(b.x);
    free(b.y);
    params_free(&p);
    qr_model_free(m);
    return rc;
}

/* "1024,256" into v (at most MLP_MAX_LIST numbers in [1, 65536]). */
static bool parse_list(const char *s, int *v, int *n) {
    *n = 0;
    while (*s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 1 || x > 65536 || (*end && *end != ',') || *n == MLP_MAX_LIST)
            return false;
        v[(*n)++] = (int)x;
        s = *end ? end + 1 : end;
    }
    return *n > 0;
}

static void usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s [--json] [--quick] [--input D] [--hidden 1024,256] [--classes C]\n"
            "          [--batch 64,128] [--steps N] [--rounds R]\n",
            prog);
}

static int help(const char *prog) {
    usage(stdout, prog);
    printf("\n"
           "How long the MLP's forward, and its forward and backward, take on quorum's\n"
           "kernels (OpenBLAS sgemm, one thread), in microseconds a step: the median and\n"
           "the fastest of the rounds. bench/python/bench_mlp.py sets torch beside it.\n"
           "\n"
           "options:\n"
           "  --input D          input features (default 784)\n"
           "  --hidden W,...     hidden layer widths (default 1024,256)\n"
           "  --classes C        classes (default 10)\n"
           "  --batch B,...      batch sizes, one point each (default 64,128)\n"
           "  --steps N          steps a round (default 200)\n"
           "  --rounds R         rounds, 1 to 64 (default 5)\n"
           "  --quick            a small model, a few steps: a smoke test\n"
           "  --json             one JSON object a point\n"
           "  --help             this text\n");
    return 0;
}

static int bad_usage(const char *prog, const char *arg, const char *value, const char *want) {
    fprintf(stderr, "%s: %s%s%s: %s\n", prog, arg, value ? " " : "", value ? value : "", want);
    usage(stderr, prog);
    return 2;
}

static void print_point(const mlp_opts *o, int batch, const mlp_point *pt, int64_t nparams) {
    if (!o->json) {
        printf("%8d %12.1f %12.1f %14.1f %14.1f\n", batch, pt->forward_us, pt->forward_us_min,
               pt->step_us, pt->step_us_min);
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON *dims = cJSON_AddArrayToObject(j, "dims");
    cJSON_AddItemToArray(dims, cJSON_CreateNumber(o->input));
    for (int i = 0; i < o->nhidden; i++) cJSON_AddItemToArray(dims, cJSON_CreateNumber(o->hidden[i]));
    cJSON_AddItemToArray(dims, cJSON_CreateNumber(o->classes));
    cJSON_AddNumberToObject(j, "params", (double)nparams);
    cJSON_AddNumberToObject(j, "batch", batch);
    cJSON_AddNumberToObject(j, "steps", o->steps);
    cJSON_AddNumberToObject(j, "rounds", o->rounds);
    cJSON_AddNumberToObject(j, "forward_us", pt->forward_us);
    cJSON_AddNumberToObject(j, "forward_us_min", pt->forward_us_min);
    cJSON_AddNumberToObject(j, "forward_backward_us", pt->step_us);
    cJSON_AddNumberToObject(j, "forward_backward_us_min", pt->step_us_min);
    cJSON *cpu = qr__cpu_json();
    if (cpu) cJSON_AddItemToObject(j, "cpu", cpu);
    char *text = cJSON_PrintUnformatted(j);
    if (text) printf("%s\n", text);
    free(text);
    cJSON_Delete(j);
}

int qr_bench_mlp_main(int argc, char **argv) {
    const char *prog = "quorum bench mlp";
    mlp_opts o = {.input = 784, .classes = 10, .hidden = {1024, 256}, .nhidden = 2,
                  .batch = {64, 128}, .nbatch = 2, .steps = 200, .rounds = 5};
    bool steps_set = false, rounds_set = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return help(prog);
        if (!strcmp(a, "--json")) o.json = true;
        else if (!strcmp(a, "--quick")) o.quick = true;
        else if (v && !strcmp(a, "--hidden")) {
            if (!parse_list(v, o.hidden, &o.nhidden))
                return bad_usage(prog, a, v, "expected widths like 1024,256");
            i++;
        } else if (v && !strcmp(a, "--batch")) {
            if (!parse_list(v, o.batch, &o.nbatch))
                return bad_usage(prog, a, v, "expected batch sizes like 64,128");
            i++;
        } else if (v && (!strcmp(a, "--input") || !strcmp(a, "--classes") ||
                         !strcmp(a, "--steps") || !strcmp(a, "--rounds"))) {
            bool rounds = !strcmp(a, "--rounds");
            int64_t lo = !strcmp(a, "--classes") ? 2 : 1, hi = rounds ? 64 : 1 << 20;
            if (qr__parse_int64(v, lo, hi, &x)) return bad_usage(prog, a, v, qr_last_error());
            if (!strcmp(a, "--input")) o.input = (int)x;
            else if (!strcmp(a, "--classes")) o.classes = (int)x;
            else if (rounds) o.rounds = (int)x, rounds_set = true;
            else o.steps = (int)x, steps_set = true;
            i++;
        } else {
            return bad_usage(prog, a, v, "unknown option or missing value");
        }
    }
    if (o.quick) {
        o.input = 64, o.hidden[0] = 32, o.nhidden = 1, o.batch[0] = 16, o.nbatch = 1;
        if (!steps_set) o.steps = 5;
        if (!rounds_set) o.rounds = 2;
    }
    if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);
    if (!o.json) {
        char cpu[256];
        qr__cpu_summary(cpu, sizeof cpu);
        printf("# cpu: %s\n# mlp %d", cpu, o.input);
        for (int i = 0; i < o.nhidden; i++) printf("-%d", o.hidden[i]);
        printf("-%d, %d rounds of %d steps, microseconds a step\n", o.classes, o.rounds, o.steps);
        printf("%8s %12s %12s %14s %14s\n", "batch", "forward", "(fastest)", "fwd+backward",
               "(fastest)");
    }
    for (int k = 0; k < o.nbatch; k++) {
        mlp_point pt = {0};
        int64_t nparams = 0;
        if (measure(&o, o.batch[k], &pt, &nparams)) {
            fprintf(stderr, "%s: batch %d: %s\n", prog, o.batch[k], qr_last_error());
            return 1;
        }
        print_point(&o, o.batch[k], &pt, nparams);
        fflush(stdout);
    }
    return 0;
}

/*
 * train_flags.c - the training flags of `quorum worker`, `launch`, `ps` and
 * `train` (see cli.h): one table gives each flag's name, its help, the
 * groups and the training mode it belongs to, and the function that sets
 * it, so that parsing, --help, "did you mean" and the mode checks read the
 * same list. Messages here leave out the flag: cli_parse names it.
 */
#include "cli.h"

#include "common/dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool truth(const char *value) {
    return !strcmp(value, "true") || !strcmp(value, "1");
}

static int set_model(cli_args *a, const char *value) {
    static const char *models[] = {"softmax", "mlp", "logreg", "wide-deep"};
    for (size_t i = 0; i < QR_ARRAY_LEN(models); i++)
        if (!strcmp(value, models[i])) {
            a->train.model = models[i];
            return QR_OK;
        }
    return qr__fail(QR_EINVAL, "expected softmax, mlp, logreg or wide-deep");
}

static int set_embedding_dim(cli_args *a, const char *value) {
    int64_t v;
    if (qr__parse_int64(value, 1, 1024, &v)) return qr__fail(QR_EINVAL, "expected 1..1024");
    a->train.embedding_dim = (int)v;
    return QR_OK;
}

static int set_wire_dtype(cli_args *a, const char *value) {
    int dt = qr_dt_parse(value);
    if (dt < 0) return qr__fail(QR_EINVAL, "expected float32, bf16 or fp16");
    a->train.wire_dtype = dt;
    return QR_OK;
}

static int set_overlap(cli_args *a, const char *value) {
    static const char *const choices[] = {"off", "on", "pipeline", "auto"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(value, choices[i])) {
            a->train.overlap = i == 3 ? -1 : i;
            return QR_OK;
        }
    return qr__fail(QR_EINVAL, "expected auto, on, off or pipeline");
}

static int set_hidden(cli_args *a, const char *value) {
    int n = 0;
    const char *p = value;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 65536 || (*end && *end != ','))
            return qr__fail(QR_EINVAL, "expected widths like 256,128");
        if (n == QR_TRAIN_MAX_HIDDEN)
            return qr__fail(QR_EINVAL, "at most %d layers", QR_TRAIN_MAX_HIDDEN);
        a->train.hidden[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!n) return qr__fail(QR_EINVAL, "no widths");
    a->train.nhidden = n;
    return QR_OK;
}

/* The strings are argv's, which live as long as the process. */
static int set_data(cli_args *a, const char *value) {
    a->train.data = value;
    return QR_OK;
}

static int set_data_dir(cli_args *a, const char *value) {
    a->train.data_dir = value;
    return QR_OK;
}

static int set_logdir(cli_args *a, const char *value) {
    if (!value[0]) return qr__fail(QR_EINVAL, "expected a folder");
    a->train.logdir = value;
    return QR_OK;
}

static int set_summary_secs(cli_args *a, const char *value) {
    double v;
    if (qr__parse_float(value, &v) || !(v >= 0.05 && v <= 86400))
        return qr__fail(QR_EINVAL, "expected seconds from 0.05 to 86400");
    a->train.summary_secs = v;
    return QR_OK;
}

static int set_batch_size(cli_args *a, const char *value) {
    int64_t v;
    int rc = qr__parse_int64(value, 1, 1 << 20, &v);
    if (!rc) a->train.batch_size = (int)v;
    return rc;
}

static int set_epochs(cli_args *a, const char *value) {
    double v;
    if (qr__parse_float(value, &v) || v <= 0 || v > 1e6)
        return qr__fail(QR_EINVAL, "expected a number > 0");
    a->train.epochs = v;
    a->train.steps = 0;
    return QR_OK;
}

static int set_steps(cli_args *a, const char *value) {
    int64_t v;
    int rc = qr__parse_int64(value, 1, INT64_MAX / 2, &v);
    if (!rc) a->train.steps = v;
    return rc;
}

static int set_seed(cli_args *a, const char *value) {
    int64_t v;
    int rc = qr__parse_int64(value, 0, INT64_MAX, &v);
    if (!rc) a->train.seed = (uint64_t)v;
    return rc;
}

static int set_json(cli_args *a, const char *value) {
    a->json = truth(value);
    return QR_OK;
}

static int set_quiet(cli_args *a, const char *value) {
    a->quiet = truth(value);
    return QR_OK;
}

/* --accumulate K and --local-steps K: K >= 1, and not both above 1. */
static int set_batches_per_push(cli_args *a, const char *value, int *dst) {
    int64_t v;
    int rc = qr__parse_int64(value, 1, 1 << 20, &v);
    if (rc) return rc;
    *dst = (int)v;
    if (a->train.accumulate > 1 && a->train.local_steps > 1)
        return qr__fail(QR_EINVAL, "--accumulate and --local-steps do not combine");
    return QR_OK;
}

static int set_accumulate(cli_args *a, const char *value) {
    return set_batches_per_push(a, value, &a->train.accumulate);
}

static int set_local_steps(cli_args *a, const char *value) {
    return set_batches_per_push(a, value, &a->train.local_steps);
}

static int set_var_opt(cli_args *a, const char *value) {
    const char *colon = strchr(value, ':');
    if (!colon || colon == value || !colon[1] || strchr(colon + 1, ':'))
        return qr__fail(QR_EINVAL, "expected NAME:key=value,...");
    if (a->train.nvar_opts == QR_TRAIN_MAX_VAR_OPTS)
        return qr__fail(QR_EINVAL, "at most %d of them", QR_TRAIN_MAX_VAR_OPTS);
    a->train.var_opt[a->train.nvar_opts++] = value;
    return QR_OK;
}

static int set_slow_worker(cli_args *a, const char *value) {
    int w, ms;
    char extra;
    if (sscanf(value, "%d:%d%c", &w, &ms, &extra) != 2 || w < 0 || ms < 0)
        return qr__fail(QR_EINVAL, "expected INDEX:MILLISECONDS");
    a->train.slow_worker = w;
    a->train.slow_ms = ms;
    return QR_OK;
}

static int set_local(cli_args *a, const char *value) {
    a->local = truth(value);
    return QR_OK;
}

static int set_virtual_workers(cli_args *a, const char *value) {
    int64_t v;
    int rc = qr__parse_int64(value, 1, 1024, &v);
    if (!rc) a->train.virtual_workers = (int)v;
    return rc;
}

/* CLUSTER_ONLY: the flag means something to a worker of a cluster only
 * (quorum train --local refuses it). */
#define CLUSTER_ONLY (CLI_TRAIN | CLI_CLUSTER)

typedef struct train_flag {
    const char *name;
    const char *arg;  /* what the value looks like; NULL: the flag stands alone */
    unsigned groups;  /* CLI_TRAIN, CLUSTER_ONLY or CLI_LOCAL */
    const char *mode; /* the only training mode it applies to; NULL: both */
    int (*set)(cli_args *a, const char *value);
    const char *help; /* continuation lines are indented by the printer */
} train_flag;

static const train_flag flags[] = {
    {"local", NULL, CLI_LOCAL, NULL, set_local,
     "the single-process reference of synchronous training"},
    {"virtual-workers", "N", CLI_LOCAL, NULL, set_virtual_workers,
     "workers computed in turn by --local (default 1)"},
    {"model", "softmax|mlp|logreg|wide-deep", CLI_TRAIN, NULL, set_model,
     "model to train (default mlp); logreg and wide-deep are\n"
     "click models over embedding tables (docs/EMBEDDINGS.md), with\n"
     "their own defaults: batch 256, 3 epochs (logreg) or 2 and hidden\n"
     "64,32 (wide-deep), and without --optimizer or --lr, Adagrad at\n"
     "0.3 (wide-deep's embedding table at 0.05)"},
    {"hidden", "256,128", CLI_TRAIN, NULL, set_hidden,
     "hidden layer widths of the mlp (and of wide-deep's)"},
    {"embedding-dim", "D", CLI_TRAIN, NULL, set_embedding_dim,
     "wide-deep: the width of its embedding rows (default 8)"},
    {"wire-dtype", "float32|bf16|fp16", CLI_TRAIN, NULL, set_wire_dtype,
     "workers: dense gradients and values travel as this\n"
     "(bf16, fp16: half the bytes; the ps keeps float32)"},
    {"data", "NAME|PATH", CLI_TRAIN, NULL, set_data,
     "fashion-mnist, digits, or a directory of IDX files\n"
     "or a digits-style .csv(.gz) (default digits); for\n"
     "logreg and wide-deep, click data: a libffm or libsvm\n"
     "file, or a directory with train* and test* files\n"
     "(quorum gen-ctr writes one)"},
    {"data-dir", "DIR", CLI_TRAIN, NULL, set_data_dir,
     "where fashion-mnist/digits live, if not the default"},
    {"batch-size", "N", CLI_TRAIN, NULL, set_batch_size, "examples per worker step (default 64)"},
    {"epochs", "E", CLI_TRAIN, NULL, set_epochs,
     "passes over the training set, counted in global\n"
     "steps of batch-size examples (default 1)"},
    {"steps", "N", CLI_TRAIN, NULL, set_steps, "global steps instead of epochs"},
    {"seed", "N", CLI_TRAIN, NULL, set_seed, "seed of initialization and sampling (default 1)"},
    {"json", NULL, CLI_TRAIN, NULL, set_json, "print a JSON summary as the last line of stdout"},
    {"quiet", NULL, CLI_TRAIN, NULL, set_quiet, "no progress line"},
    {"accumulate", "K", CLI_TRAIN, "async", set_accumulate,
     "async: sum K batches' gradients at the pulled weights,\n"
     "push once"},
    {"local-steps", "K", CLI_TRAIN, "async", set_local_steps,
     "async: K plain SGD steps on a local copy (lr: --lr,\n"
     "default 0.05, decayed by the lr-decay-* schedule at the\n"
     "global step), then push the delta w_local - w_pulled"},
    {"overlap", "auto|on|off|pipeline", CLUSTER_ONLY, NULL, set_overlap,
     "workers: on: push each layer's gradient as backward\n"
     "has it and pull each layer's values under the next\n"
     "batch and forward; pipeline (async): a step's push and\n"
     "pull on a thread under the next step's compute, one\n"
     "step staler; auto (default): where this machine's\n"
     "cores outnumber what its tasks use, pipeline for async\n"
     "runs of several workers, else on (README)"},
    {"var-opt", "NAME:K=V,...", CLUSTER_ONLY, NULL, set_var_opt,
     "a variable's own optimizer options, e.g.\n"
     "layer0/weights:optimizer=adagrad,lr=0.05 (repeatable);\n"
     "a table's also admit_after=K (a row at an id's K-th\n"
     "sighting), admit_filter=exact|bloom (count them in an\n"
     "index, or a counting Bloom filter of fixed size:\n"
     "admit_filter_bytes=N, default 16 MiB a ps,\n"
     "admit_filter_hashes=H, default 3) and\n"
     "evict_after_steps=T (docs/EMBEDDINGS.md)"},
    {"logdir", "DIR", CLUSTER_ONLY, NULL, set_logdir,
     "the chief writes TensorBoard event files and\n"
     "summaries.jsonl here (docs/SUMMARIES.md)"},
    {"summary-secs", "S", CLUSTER_ONLY, NULL, set_summary_secs,
     "seconds between summary points (default 120)"},
    {"slow-worker", "I:MS", CLUSTER_ONLY, NULL, set_slow_worker,
     "(testing) worker I sleeps MS milliseconds every step"},
};

/* Flags of quorum train --local are CLI_LOCAL; the others are accepted by
 * every subcommand that takes training flags. */
static bool accepted(const train_flag *f, unsigned accept) {
    return (f->groups & CLI_LOCAL) ? (accept & CLI_LOCAL) : (accept & CLI_TRAIN);
}

int cli_train_flag_set(cli_args *a, unsigned accept, const char *key, const char *value) {
    for (size_t i = 0; i < QR_ARRAY_LEN(flags); i++) {
        if (strcmp(flags[i].name, key) || !accepted(&flags[i], accept)) continue;
        int rc = flags[i].set(a, value);
        if (!rc) a->train_given |= 1ull << i;
        return rc;
    }
    return QR_ENOTFOUND;
}

static bool given(const cli_args *a, const char *name) {
    for (size_t i = 0; i < QR_ARRAY_LEN(flags); i++)
        if (!strcmp(flags[i].name, name)) return a->train_given >> i & 1;
    return false;
}

int cli_click_defaults(cli_args *a) {
    qr_train_opts *o = &a->train;
    bool wide_deep = !strcmp(o->model, "wide-deep");
    if (!wide_deep && strcmp(o->model, "logreg")) return QR_OK;
    /* The generator's default set (quorum gen-ctr) trained with these
     * reaches its hidden model's test AUC within 0.01 (docs/EMBEDDINGS.md):
     * the dense models' batch of 64 and SGD at 0.05 fall short. */
    if (!given(a, "batch-size")) o->batch_size = 256;
    if (!given(a, "epochs") && !given(a, "steps")) o->epochs = wide_deep ? 2 : 3;
    if (wide_deep && !given(a, "hidden")) {
        o->hidden[0] = 64;
        o->hidden[1] = 32;
        o->nhidden = 2;
    }
    if (qr__config_is_set(a->cfg, "optimizer") || qr__config_is_set(a->cfg, "lr")) return QR_OK;
    o->model_optimizer = true;
    /* Said in the config too, so that the run's report and a ps given the
     * same flags (quorum launch) name it. */
    if (qr_config_set(a->cfg, "optimizer", "adagrad") || qr_config_set(a->cfg, "lr", "0.3"))
        return QR_EINVAL;
    return QR_OK;
}

bool cli_train_flag_at(int i, const char **name, bool *is_bool, unsigned *groups,
                       const char **mode) {
    if (i < 0 || i >= (int)QR_ARRAY_LEN(flags)) return false;
    *name = flags[i].name;
    *is_bool = !flags[i].arg;
    *groups = flags[i].groups;
    *mode = flags[i].mode;
    return true;
}

void cli_print_train_help(FILE *f, unsigned accept) {
    for (size_t i = 0; i < QR_ARRAY_LEN(flags); i++) {
        const train_flag *t = &flags[i];
        if (!accepted(t, accept)) continue;
        /* quorum train --local refuses the flags of async and of a cluster. */
        if ((accept & CLI_LOCAL) && ((t->mode && strcmp(t->mode, "sync")) ||
                                     (t->groups & CLI_CLUSTER)))
            continue;
        char flag[64];
        snprintf(flag, sizeof flag, "--%s%s%s", t->name, t->arg ? " " : "", t->arg ? t->arg : "");
        fprintf(f, "  %-24s", flag);
        if (strlen(flag) >= 24) fprintf(f, "\n%26s", ""); /* too long for the column */
        for (const char *p = t->help; *p; p++) {
            fputc(*p, f);
            if (*p == '\n') fprintf(f, "%26s", "");
        }
        fputc('\n', f);
    }
    fprintf(f, "  (--mode, --replicas-to-aggregate, --reduction, --init-tokens: see options)\n");
}

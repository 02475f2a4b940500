/*
 * report.c - what a training run shows the user (see cli.h): the progress
 * line on stderr while the chief trains, the summary line on stderr at the
 * end and, with --json, the summary as one JSON object, the last line of
 * stdout, which the integration tests and scripts parse.
 */
#include "cli.h"

#include "common/cpu.h"
#include "common/dtype.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_progress_line(bool tty, const qr_train_progress *p) {
    if (tty)
        fprintf(stderr, "\rstep %lld/%lld  loss %.4f  %.0f examples/s   %s", (long long)p->step,
                (long long)p->total, p->loss, p->examples_per_sec, p->final ? "\n" : "");
    else
        fprintf(stderr, "step %lld/%lld  loss %.4f  %.0f examples/s\n", (long long)p->step,
                (long long)p->total, p->loss, p->examples_per_sec);
    fflush(stderr);
}

void cli_show_progress(const qr_train_progress *p, void *ctx) {
    cli_progress *c = ctx;
    if (!p->final && p->elapsed - c->last_shown <= (c->tty ? 0.2 : 5.0)) return;
    print_progress_line(c->tty, p);
    c->last_shown = p->elapsed;
}

/* async: how many updates each gradient missed, as a histogram (a count
 * per variable of a push), and the pushes with a stale gradient (a count
 * per push on each ps it reached, as the stale_gradients summary). */
static void add_staleness(cJSON *j, const cJSON *stats) {
    cJSON *st = cJSON_AddObjectToObject(j, "staleness");
    static const char *buckets[] = {"0", "1", "2", "3", "4-7", "8-15", "16-31", "32-63", "64+"};
    cJSON_AddItemToObject(st, "buckets", cJSON_CreateStringArray(buckets, 9));
    cJSON *counts = cJSON_GetObjectItem(stats, "staleness");
    if (counts) cJSON_AddItemToObject(st, "counts", cJSON_Duplicate(counts, 1));
    cJSON *pushes = cJSON_GetObjectItem(stats, "stale_pushes_applied");
    if (pushes) cJSON_AddItemToObject(st, "stale_pushes", cJSON_Duplicate(pushes, 1));
}

static void print_json(const cli_args *a, const char *mode, int nps, int nworkers,
                       double steps_per_sec, const qr_train_result *r) {
    const qr_train_opts *o = &a->train;
    cJSON *j = cJSON_CreateObject();
    char digest[32];
    snprintf(digest, sizeof digest, "%016llx", (unsigned long long)r->params_digest);
    cJSON_AddNumberToObject(j, "test_accuracy", r->test_accuracy);
    cJSON_AddNumberToObject(j, "test_loss", r->test_loss);
    if (r->test_auc >= 0) {
        cJSON_AddNumberToObject(j, "test_auc", r->test_auc);
        cJSON_AddNumberToObject(j, "test_logloss", r->test_logloss);
    }
    if (r->test_accuracy_averaged >= 0)
        cJSON_AddNumberToObject(j, "test_accuracy_averaged", r->test_accuracy_averaged);
    cJSON_AddNumberToObject(j, "global_step", (double)r->global_step);
    cJSON_AddNumberToObject(j, "global_steps_per_sec", steps_per_sec);
    cJSON_AddNumberToObject(j, "examples_per_sec", r->examples_per_sec);
    cJSON_AddNumberToObject(j, "wall_seconds", r->wall_seconds);
    cJSON_AddStringToObject(j, "model", o->model);
    cJSON_AddStringToObject(j, "data", o->data);
    cJSON_AddStringToObject(j, "mode", mode);
    cJSON_AddStringToObject(j, "optimizer", qr__config_str(a->cfg, "optimizer"));
    cJSON_AddNumberToObject(j, "batch_size", o->batch_size);
    cJSON_AddNumberToObject(j, "ps", nps);
    cJSON_AddNumberToObject(j, "workers", nworkers);
    cJSON_AddStringToObject(j, "params_digest", digest);
    cJSON_AddNumberToObject(j, "rollbacks", (double)r->rollbacks);
    cJSON_AddNumberToObject(j, "lost_pushes", (double)r->lost_pushes);
    cJSON_AddStringToObject(j, "wire_dtype", qr_dt_name(o->wire_dtype));
    cJSON_AddBoolToObject(j, "overlap", r->overlapped);
    cJSON_AddBoolToObject(j, "pipeline", r->pipelined);
    cJSON *stats = r->stats[0] ? cJSON_Parse(r->stats) : NULL;
    /* the payload bytes the ps tasks received and sent (--wire-dtype) */
    for (const char **key = (const char *[]){"push_bytes", "pull_bytes", NULL}; *key; key++) {
        const cJSON *bytes = cJSON_GetObjectItem(stats, *key);
        if (cJSON_IsNumber(bytes)) cJSON_AddNumberToObject(j, *key, bytes->valuedouble);
    }
    if (stats && !strcmp(mode, "sync")) {
        cJSON_AddItemToObject(j, "sync", stats);
    } else if (stats) {
        add_staleness(j, stats);
        cJSON_Delete(stats);
    }
    /* what ran it: examples/s on one machine say little about another */
    cJSON *cpu = qr__cpu_json();
    if (cpu) cJSON_AddItemToObject(j, "cpu", cpu);
    char *text = cJSON_PrintUnformatted(j);
    if (text) printf("%s\n", text);
    fflush(stdout);
    free(text);
    cJSON_Delete(j);
}

void cli_print_summary(const cli_args *a, const char *mode, int nps, int nworkers,
                       const qr_train_result *r) {
    double steps_per_sec = r->wall_seconds > 0 ? (double)r->global_step / r->wall_seconds : 0;
    fprintf(stderr,
            "trained %s on %s (%s): test accuracy %.4f (loss %.4f) after %lld global steps, "
            "%.1f steps/s, %.0f examples/s, %.1f s\n",
            a->train.model, a->train.data, mode, r->test_accuracy, r->test_loss,
            (long long)r->global_step, steps_per_sec, r->examples_per_sec, r->wall_seconds);
    if (r->test_auc >= 0)
        fprintf(stderr, "test AUC %.4f, log loss %.4f\n", r->test_auc, r->test_logloss);
    if (a->json) print_json(a, mode, nps, nworkers, steps_per_sec, r);
}

/*
 * cli.h - what the subcommands of the `quorum` tool share: parsing of
 * "--key value" flags into a cluster spec, library options and training
 * options, all validated before anything starts; their help; and the
 * printing of a training run's progress and summary.
 */
#ifndef QR_CLI_H
#define QR_CLI_H

#include "cluster/cluster.h"
#include "common/config.h"
#include "train/train.h"

#include <stdio.h>

typedef struct cli_args {
    /* The cluster flags' values point into argv (never copied into a
     * buffer of a fixed size: a host list may be any length). */
    const char *ps_hosts;
    const char *worker_hosts;
    const char *job_name;
    int task_index;
    bool have_cluster_flags;
    qr_config *cfg;
    qr_train_opts train;
    bool json;               /* --json: the summary as JSON on stdout */
    bool quiet;              /* --quiet: no progress line */
    bool local;              /* --local: quorum train's single-process run */
    uint64_t train_given;    /* bit i: training flag i was on the command line */
    /* launch only */
    int launch_ps, launch_workers;
    int launch_max_restarts; /* launch: restarts of failed tasks allowed */
    int launch_metrics_base; /* launch: metrics on ports from this one (0: off) */
} cli_args;

/* Option groups a subcommand accepts. CLI_LOCAL: quorum train --local's
 * own flags (--local, --virtual-workers). */
enum { CLI_CLUSTER = 1, CLI_CONFIG = 2, CLI_TRAIN = 4, CLI_LAUNCH = 8, CLI_LOCAL = 16 };

/* Parse argv (after the subcommand) accepting the option groups in
 * `accept`, then refuse options that do not apply to the training mode
 * (or, with CLI_LOCAL, to the synchronous single-process run) and, for
 * launch, a --slow-worker beyond --workers. On error prints a message
 * naming the flag and returns 2. */
int cli_parse(const char *cmd, int argc, char **argv, unsigned accept, cli_args *a);
void cli_args_free(cli_args *a);
/* The cluster from the flags, else from TF_CONFIG; checks --slow-worker
 * against its workers. Returns 0, or 2 with a message printed. */
int cli_cluster(const char *cmd, const cli_args *a, qr_cluster **out);
/* The library options, with their choices and defaults. */
void cli_print_config_help(FILE *f);

/* train_flags.c: the training flags. */
/* Set training flag `key` (normalized: '-' not '_'); QR_ENOTFOUND if it
 * is not a training flag of the groups in `accept`, else QR_OK or an
 * error with a message. */
int cli_train_flag_set(cli_args *a, unsigned accept, const char *key, const char *value);
/* Flag i of the table: its name, whether it stands alone (true), its
 * groups and the only mode it applies to (NULL: both). False past the end. */
bool cli_train_flag_at(int i, const char **name, bool *is_bool, unsigned *groups,
                       const char **mode);
/* The help lines of the training flags of the groups in `accept`. */
void cli_print_train_help(FILE *f, unsigned accept);
/* The click models' own defaults (docs/EMBEDDINGS.md, "Defaults"), for
 * what the command line left out: batch 256, 3 epochs (logreg) or 2
 * (wide-deep, hidden 64,32), and, unless --optimizer or --lr was given,
 * Adagrad at lr 0.3 (wide-deep's embedding table at 0.05), which the
 * chief declares as the variables' own options. QR_OK, or an error. */
int cli_click_defaults(cli_args *a);

/* report.c: what a training run shows. */
typedef struct cli_progress {
    bool tty;          /* stderr is a terminal: one line rewritten in place */
    double last_shown; /* seconds into the run of the last line shown */
} cli_progress;
/* A qr_train_progress_fn: a progress line on stderr, at most every 0.2 s
 * on a terminal and every 5 s otherwise, and the final one. ctx is a
 * cli_progress. */
void cli_show_progress(const qr_train_progress *p, void *ctx);
/* The summary line on stderr and, with --json, the JSON object as the last
 * line of stdout. mode is the training mode the run had. */
void cli_print_summary(const cli_args *a, const char *mode, int nps, int nworkers,
                       const qr_train_result *r);

int cmd_launch(int argc, char **argv);
/* ckpt_cmd.c: `quorum ckpt ls|show|verify DIR`. */
int cmd_ckpt(int argc, char **argv);
/* plot.c: `quorum plot LOGDIR -o FILE.png`. */
int cmd_plot(int argc, char **argv);
/* A task started by `quorum launch` whose launcher has died removes the
 * launcher's socket directory if it is empty (the last ps to end does). */
void cli_leave_launch_dir(void);

#endif

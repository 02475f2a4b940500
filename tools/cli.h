/*
 * cli.h - what the subcommands of the `quorum` tool share: parsing of
 * "--key value" flags into a cluster spec, library options and training
 * options, all validated before anything starts.
 */
#ifndef QR_CLI_H
#define QR_CLI_H

#include "cluster/cluster.h"
#include "common/config.h"
#include "train/train.h"

#include <stdio.h>

typedef struct cli_args {
    char ps_hosts[4096];
    char worker_hosts[4096];
    char job_name[16];
    int task_index;
    bool have_cluster_flags;
    qr_config *cfg;
    qr_train_opts train;
    /* launch only */
    int launch_ps, launch_workers;
} cli_args;

enum { CLI_CLUSTER = 1, CLI_CONFIG = 2, CLI_TRAIN = 4, CLI_LAUNCH = 8 };

/* Parse argv (after the subcommand) accepting the option groups in
 * `accept`. On error prints a message naming the flag and returns 2. */
int cli_parse(const char *cmd, int argc, char **argv, unsigned accept, cli_args *a);
void cli_args_free(cli_args *a);
/* The cluster from the flags, else from TF_CONFIG. */
int cli_cluster(const char *cmd, const cli_args *a, qr_cluster **out);
void cli_print_config_help(FILE *f);

int cmd_launch(int argc, char **argv);

#endif

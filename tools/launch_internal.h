/*
 * launch_internal.h - the two halves of `quorum launch`:
 *   launch_plan.c  the plan: the options read and checked, every task's
 *                  address, the run's secret and directories, the metrics
 *                  ports, the tasks' thread count (OMP_NUM_THREADS);
 *                  everything decided before a child starts, and removed
 *                  when the run ends
 *   launch.c       the supervision: the children started (a program's
 *                  workers with TF_CONFIG and torchrun's RANK, WORLD_SIZE,
 *                  LOCAL_RANK, LOCAL_WORLD_SIZE, and QUORUM_LOGDIR,
 *                  QUORUM_METRICS_PORT and the like for their summaries
 *                  and metrics), watched, restarted and stopped, and the
 *                  exit status
 * The plan is read and prepared once; the supervisor only reads it.
 */
#ifndef QR_LAUNCH_INTERNAL_H
#define QR_LAUNCH_INTERNAL_H

#include "cli.h"

/* Exit statuses of `quorum launch` (2 is a bad option, as everywhere). */
enum { LAUNCH_OK = 0, LAUNCH_FAILED = 1, LAUNCH_TASKS_FAILED = 3, LAUNCH_INTERRUPTED = 130 };

typedef struct launch_plan {
    /* read from the options (launch_plan_read) */
    int nps, nworkers;
    bool tcp;
    bool sync;
    int replicas;            /* sync: R */
    int ps_copies;           /* --ps-replicas: 2 = a ps may be failed over (ps 0 by ps 1) */
    int64_t heartbeat_timeout_ms;
    int64_t restart_wait_ms;
    int max_restarts;        /* --max-restarts */
    int metrics_base;        /* --metrics-port-base: task i serves on base + i; 0 off */
    const char *logdir;      /* --logdir, to list the metrics ports in */
    double summary_secs;     /* --summary-secs (a program's QUORUM_SUMMARY_SECS) */
    bool quiet;              /* --quiet (a program's QUORUM_QUIET) */
    bool checkpoints;        /* --checkpoint-dir was given */
    bool secret_given;       /* --secret-file (a path, or none) */
    char **command;          /* after "--": the program each worker runs; NULL: quorum worker */
    char *options_json;      /* the options, for the program's QUORUM_OPTIONS */
    int npass;
    char **pass;             /* the arguments every task is given */
    /* made by launch_plan_prepare: how to start a task, again too */
    char *self, *ps_hosts, *worker_hosts;
    char *socket_dir;        /* the Unix sockets' private directory; NULL with tcp */
    char *run_dir;           /* tcp: a private directory for the secret alone */
    bool secret_made;        /* a secret made for this run (in one of the two) */
} launch_plan;

/* Read and check the options (argv after `launch`; a "--" ends them and
 * starts the workers' program). 0, or 2 with a message. */
int launch_plan_read(int argc, char **argv, launch_plan *plan);
/* Every task's address, checked; the run's directory and secret, and
 * OMP_NUM_THREADS=1 unless set, in the environment the children inherit. QR_OK, or LAUNCH_FAILED with a
 * message. */
int launch_plan_prepare(launch_plan *plan);
/* Remove the run's secret and directories and free what the plan holds. */
void launch_plan_free(launch_plan *plan);
/* Say where every task serves its metrics, and write it to --logdir. */
void launch_announce_metrics(const launch_plan *plan);
/* TF_CONFIG for task (job, index): the cluster as JSON lists (free it). */
char *launch_tf_config(const launch_plan *plan, const char *job, int index);
/* The program's QUORUM_OPTIONS (plan->options_json), with "coordinator"
 * added when it is not ps 0 (a worker started after ps 0's failover).
 * malloc'd; NULL when out of memory. */
char *launch_options_json(const launch_plan *plan, int coordinator);

#endif

/*
 * launch.c - `quorum launch`: a whole cluster on this machine.
 *
 * With the plan made (launch_plan.c: every task's address, the run's
 * secret), starts P ps tasks and W workers as child processes of this same
 * binary (each a real `quorum ps` / `quorum worker`, given the cluster by
 * flags), and supervises them:
 *   - a ps that another ps finds hung (no answer to its heartbeats for
 *     heartbeat-timeout-ms: SIGSTOPped, wedged) tells the launcher
 *     (read_notices), which SIGKILLs it: from then on it is a failed ps
 *     like any other, named as hung;
 *   - when a ps or the chief fails, the others are stopped (SIGTERM, then
 *     SIGKILL after a grace period) and the failure is reported with its
 *     exit;
 *   - when another worker fails, it is reported with what happens next:
 *     in async mode, and in sync mode while backup workers (N - R) stand
 *     in, training goes on without it; in sync mode past that, a step that
 *     needs it waits for its restart up to restart-wait-ms (ps 0 counts),
 *     and then the run aborts naming it;
 *   - with --ps-replicas 2 (async or sync), a ps other than ps 0 that dies or
 *     hangs is failed over in place by ps 0 (its backup serves its shard;
 *     "failover ps K VIEW", read_notices): it is neither killed nor
 *     counted a failure: a stopped one that resumes fences itself and
 *     exits, and one still there when the run ends is stopped with the
 *     rest; the launcher says so (docs/REPLICATION.md). Under
 *     --max-restarts, one that has exited is started again (a restart
 *     counted): the new run rejoins as the backup of the shards it held
 *     copies of, without a rollback (src/ps/rerep.c; "rejoined ps K
 *     VIEW" once it holds them);
 *     ps 0 itself fails over too (async or sync, with checkpoints or not):
 *     ps 1, which holds the copy of its shard, takes its role ("failover
 *     ps 0 VIEW" comes from ps 1), and the run's end is ps 1's from then
 *     on (coordinator_ended_well); every task started from then on (ps
 *     0's replacement, which rejoins as a backup, a restarted worker) is
 *     told so (--coordinator, spawn);
 *   - with --ps-replicas 2, two neighbouring ps lost together (a shard's
 *     both copies) make ps 0 roll the cluster back to its newest
 *     checkpoint at once ("rollback ps K" for each, read_notices): each is
 *     restarted as soon as it has exited (a restart counted, even one
 *     failed over just before), restores that checkpoint and joins the
 *     rolled-back cluster; without restarts left the run fails. When ps
 *     0's successor coordinates, it cannot roll back in place: it stops
 *     the run ("restart cluster STEP"), and every task is stopped and
 *     started again as at the start, ps 0 coordinating (restart_cluster,
 *     one restart, as torchrun counts its group's);
 *   - with --max-restarts K, up to K failures are restarted instead (as
 *     torchrun does): a failed worker, the chief included, is started again
 *     alone and rejoins at the current global step (the chief does not
 *     re-initialize what the ps tasks hold); a failed ps is started again
 *     alone, restores the newest checkpoint (--checkpoint-dir), and the
 *     other ps tasks and the workers roll back to it in place
 *     (src/ps/rollback.c), so that every shard and the global step come
 *     from one moment (tensorflow#2461);
 *   - once ps 0 has ended well (the cluster stopped in order), training
 *     is over and nothing is restarted (coordinator_ended_well); a ps failing then
 *     is reported among the tasks that did not end well;
 *   - once the chief and every ps have ended well, workers still running
 *     get GRACE_MS to end, and are then stopped and reported (as failed,
 *     unless the worker never reached ps 0: it only came late);
 *   - Ctrl-C / SIGTERM to the launcher stops every child the same way;
 *   - children get PR_SET_PDEATHSIG, so a killed launcher leaves nothing.
 *
 * `quorum launch [options] -- COMMAND ARGS...` runs any program as the
 * workers instead (a PyTorch script, say): the ps tasks as above, and
 * COMMAND once per worker, with TF_CONFIG naming the cluster and the task
 * (the convention of TensorFlow and Kubeflow's TFJob, which the Python
 * package reads), QUORUM_OPTIONS the options given before "--" (JSON), and
 * torchrun's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (the task
 * index and the number of workers; all run here), and QUORUM_LOGDIR,
 * QUORUM_SUMMARY_SECS, QUORUM_QUIET and QUORUM_METRICS_PORT for the
 * summaries, progress line and metrics page that quorum's own workers get
 * as flags (program_summaries_env), supervised the same way.
 * As torchrun does, every task gets OMP_NUM_THREADS=1 unless the launcher's
 * environment sets it (launch_plan.c), and the launcher says so. When every worker has ended well the ps tasks
 * are stopped, if the program did not stop the cluster itself.
 * The exit status says how every task ended: 0 all ended well; 1 the run
 * failed (a ps or the chief, or the launch itself); 3 training finished
 * but some task did not end well (the last line names them); 130
 * interrupted; 2 bad options.
 * Only the chief writes to stdout, so with --json its summary is the last
 * line of stdout.
 */
#include "launch_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GRACE_MS 5000

typedef struct child {
    pid_t pid;
    char name[32];
    bool exited;
    bool reported;
    int status;
    uint64_t started_ms;
    char hung[160]; /* killed by launch as hung: who said so, and why ("" otherwise) */
    bool joined;    /* a worker that has reached ps 0 ("joined worker K") */
    bool late;      /* stopped after the run ended without having joined it */
    bool failed_over; /* a ps whose shard its backup serves (--ps-replicas 2): not a failure */
    uint64_t failed_ms; /* such a ps (k > 0) ended: when, while ps 0's "failover" notice is awaited */
    bool told_to_stop;  /* a ps sent the orderly SIGTERM once every worker had ended well */
    bool rollback;      /* lost with its neighbour: ps 0 rolled back ("rollback ps K"), restart it */
} child;

/* ps tasks tell the launcher of a ps they found hung (qr__tell_supervisor:
 * "hung ps K SILENT_MS"), ps 0 of a hung chief ("hung worker 0 SILENT_MS"),
 * and workers that they have reached ps 0 ("joined
 * worker K"), on a datagram socket whose other end they inherit as
 * QUORUM_SUPERVISOR_FD. */
static int notices[2] = {-1, -1};
/* The ps that coordinates the run: ps 0, or its successor once ps 0 has
 * been failed over ("failover ps 0 VIEW by 1"), and ps 0's replacement
 * once that successor has been failed over in turn ("failover ps 1 VIEW
 * by 0"). */
static int coordinator;
/* The coordinator, not ps 0 (failed over), lost both copies of a shard:
 * the cluster cannot roll back in place, so every task is started again
 * ("restart cluster STEP"; src/ps/rollback.c). */
static bool cluster_restart_wanted;

static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
    interrupted = sig;
}

/* In a child about to exec: the notices' socket goes through exec, named
 * by QUORUM_SUPERVISOR_FD (ps tasks and workers, the program's too). */
static void pass_notices(void) {
    if (notices[1] < 0) return;
    char fd[16];
    snprintf(fd, sizeof fd, "%d", notices[1]);
    fcntl(notices[1], F_SETFD, 0);
    setenv("QUORUM_SUPERVISOR_FD", fd, 1);
}

static pid_t spawn(const char *self, const char *job, int index, const char *ps_hosts,
                   const char *worker_hosts, int argc, char **argv, int metrics_port,
                   int coordinator_now) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0) return pid;
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    char idx[16];
    snprintf(idx, sizeof idx, "%d", index);
    char **args = calloc((size_t)argc + 16, sizeof *args);
    if (!args) _exit(127);
    int n = 0;
    args[n++] = (char *)self;
    args[n++] = (char *)job;
    args[n++] = "--ps_hosts";
    args[n++] = (char *)ps_hosts;
    args[n++] = "--worker_hosts";
    args[n++] = (char *)worker_hosts;
    args[n++] = "--job_name";
    args[n++] = (char *)job;
    args[n++] = "--task_index";
    args[n++] = idx;
    for (int i = 0; i < argc; i++) args[n++] = argv[i];
    char port[16];
    if (metrics_port) {
        snprintf(port, sizeof port, "%d", metrics_port);
        args[n++] = "--metrics-port";
        args[n++] = port;
    }
    /* Started after ps 0's failover: who coordinates now (a replacement
     * of ps 0 would take itself for the coordinator, any other task would
     * wait for ps 0). */
    char coord[16];
    if (coordinator_now) {
        snprintf(coord, sizeof coord, "%d", coordinator_now);
        args[n++] = "--coordinator";
        args[n++] = coord;
    }
    args[n] = NULL;
    signal(SIGINT, SIG_IGN); /* the launcher decides how children stop */
    pass_notices();
    execv(self, args); /* inherits OPENBLAS_NUM_THREADS and _CORETYPE (quorum.c) */
    fprintf(stderr, "quorum launch: cannot run %s: %s\n", self, strerror(errno));
    _exit(127);
}

static void describe_exit(const child *c, char *buf, size_t len) {
    if (c->hung[0])
        snprintf(buf, len, "%s (pid %d) was hung (%s) and was killed", c->name, (int)c->pid,
                 c->hung);
    else if (WIFEXITED(c->status))
        snprintf(buf, len, "%s (pid %d) exited with status %d", c->name, (int)c->pid,
                 WEXITSTATUS(c->status));
    else if (WIFSIGNALED(c->status))
        snprintf(buf, len, "%s (pid %d) was killed by signal %d (%s)", c->name, (int)c->pid,
                 WTERMSIG(c->status), strsignal(WTERMSIG(c->status)));
    else
        snprintf(buf, len, "%s (pid %d) ended", c->name, (int)c->pid);
}

static bool failed(const child *c) {
    /* A ps told to stop in order that the SIGTERM killed outright had not
     * set its handler yet: it was still starting, with nothing to lose. */
    if (c->told_to_stop && WIFSIGNALED(c->status) && WTERMSIG(c->status) == SIGTERM) return false;
    return !c->late && !c->failed_over && (!WIFEXITED(c->status) || WEXITSTATUS(c->status) != 0);
}

/* Non-chief workers may come and go; everything else is essential. */
static bool essential(const child *c) {
    return !c->failed_over && (strncmp(c->name, "worker ", 7) || !strcmp(c->name, "worker 0"));
}

/* Reap children that have exited; returns how many are still running. */
static int reap(child *kids, int n) {
    int running = 0;
    for (int i = 0; i < n; i++) {
        if (kids[i].exited) continue;
        int status;
        pid_t r = waitpid(kids[i].pid, &status, WNOHANG);
        if (r == kids[i].pid) {
            kids[i].exited = true;
            kids[i].status = status;
        } else {
            running++;
        }
    }
    return running;
}

static void sleep_ms(int ms) {
    nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000L}, NULL);
}

/* SIGTERM every running child, SIGKILL whatever is left after the grace
 * period, and reap them all. */
static void stop_all(child *kids, int n) {
    for (int i = 0; i < n; i++)
        if (!kids[i].exited) kill(kids[i].pid, SIGTERM);
    for (int waited = 0; reap(kids, n) && waited < GRACE_MS; waited += 20) sleep_ms(20);
    for (int i = 0; i < n; i++)
        if (!kids[i].exited) kill(kids[i].pid, SIGKILL);
    while (reap(kids, n)) sleep_ms(5);
}

/* "quorum launch: worker 2 (pid 123) exited with status 1; <what happens now>". */
static void report_worker_lost(const child *c, const launch_plan *plan, int nlost) {
    char why[160];
    describe_exit(c, why, sizeof why);
    int backups = plan->nworkers - plan->replicas;
    if (!plan->sync || nlost <= backups) {
        fprintf(stderr, "quorum launch: %s; training goes on without it\n", why);
        return;
    }
    /* Tokens are not tied to workers: the others may take up its share of
     * the steps for a while, so say what can happen, not what will. */
    fprintf(stderr, "quorum launch: %s; a step needs %d gradients (replicas-to-aggregate) and "
            "%d of %d workers are left: steps go on only while the others take up its tokens, "
            "and a step that waits for it waits up to restart-wait-ms (%lld ms) for a restart "
            "(--max-restarts restarts it), then the run aborts with a report of the missing "
            "workers\n", why, plan->replicas, plan->nworkers - nlost, plan->nworkers,
            (long long)plan->restart_wait_ms);
}

/* What quorum's own workers get as --logdir, --summary-secs, --quiet and
 * --metrics-port, a program gets in its environment (quorum.torch reads
 * it; docs/PYTHON.md): the chief writes summaries into QUORUM_LOGDIR every
 * QUORUM_SUMMARY_SECS seconds and shows a progress line unless
 * QUORUM_QUIET=1; every worker serves its metrics on QUORUM_METRICS_PORT,
 * the port launch_announce_metrics listed for it. A port inherited from
 * the launcher's environment is dropped: every worker would take it. */
static void program_summaries_env(const launch_plan *plan, int index) {
    char value[32];
    if (plan->logdir) {
        setenv("QUORUM_LOGDIR", plan->logdir, 1);
        snprintf(value, sizeof value, "%g", plan->summary_secs);
        setenv("QUORUM_SUMMARY_SECS", value, 1);
    }
    if (plan->quiet) setenv("QUORUM_QUIET", "1", 1);
    unsetenv("QUORUM_METRICS_PORT");
    if (plan->metrics_base) {
        snprintf(value, sizeof value, "%d", plan->metrics_base + plan->nps + index);
        setenv("QUORUM_METRICS_PORT", value, 1);
    }
}

/* Worker `index` as the user's program: COMMAND with its environment. */
static pid_t spawn_command(const launch_plan *plan, int index, int coordinator_now) {
    char *config = launch_tf_config(plan, "worker", index);
    if (!config) return -1;
    char *options = launch_options_json(plan, coordinator_now); /* (as spawn's --coordinator) */
    if (!options) {
        free(config);
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0) {
        free(config);
        free(options);
        return pid;
    }
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    setenv("TF_CONFIG", config, 1);
    setenv("QUORUM_OPTIONS", options, 1);
    /* torchrun's variables, so that torch's own DistributedSampler and the
     * like read this worker's place: every worker runs on this machine, so
     * its local rank is its rank. No MASTER_ADDR/MASTER_PORT: nothing
     * serves a torch.distributed rendezvous, and without them
     * init_process_group fails at once, naming them, instead of waiting. */
    char rank[16], size[16];
    snprintf(rank, sizeof rank, "%d", index);
    snprintf(size, sizeof size, "%d", plan->nworkers);
    setenv("RANK", rank, 1);
    setenv("WORLD_SIZE", size, 1);
    setenv("LOCAL_RANK", rank, 1);
    setenv("LOCAL_WORLD_SIZE", size, 1);
    program_summaries_env(plan, index);
    pass_notices();
    signal(SIGINT, SIG_IGN); /* the launcher decides how children stop */
    execvp(plan->command[0], plan->command);
    fprintf(stderr, "quorum launch: cannot run %s: %s\n", plan->command[0], strerror(errno));
    _exit(127);
}

/* Start child i (ps tasks first, then workers), as at the start. */
static void start_child(child *kids, int i, const launch_plan *plan) {
    bool is_ps = i < plan->nps;
    int index = is_ps ? i : i - plan->nps;
    child *c = &kids[i];
    snprintf(c->name, sizeof c->name, "%s %d", is_ps ? "ps" : "worker", index);
    c->exited = c->reported = false;
    c->status = 0;
    c->hung[0] = 0;
    c->joined = c->late = c->failed_over = c->rollback = false;
    c->failed_ms = 0;
    c->started_ms = qr__now_ns() / 1000000;
    if (!is_ps && plan->command)
        c->pid = spawn_command(plan, index, coordinator);
    else
        c->pid = spawn(plan->self, is_ps ? "ps" : "worker", index, plan->ps_hosts,
                       plan->worker_hosts, plan->npass, plan->pass,
                       plan->metrics_base ? plan->metrics_base + i : 0, coordinator);
    if (c->pid < 0) {
        fprintf(stderr, "quorum launch: fork failed: %s\n", strerror(errno));
        c->exited = true;
        c->status = 1 << 8;
    }
}

/* The run cannot go on in place after ps 0's failover (`why`: both copies
 * of a shard lost while ps 0's successor coordinates, or that successor
 * lost with nobody to succeed it): every task stopped and started again
 * as at the start (ps 0 coordinating), each ps restoring the newest
 * checkpoint. One restart, as torchrun counts a restart of its whole
 * group (a replacement started for a failover a moment before, stopped
 * with the rest, was counted already). False: no restart left (nothing
 * stopped). */
static bool restart_cluster(child *kids, int n, const launch_plan *plan, int *used,
                            const char *why) {
    if (*used >= plan->max_restarts) {
        fprintf(stderr, "quorum launch: %s: starting the cluster again takes a restart, and "
                "none of --max-restarts %d is left\n", why, plan->max_restarts);
        return false;
    }
    (*used)++;
    fprintf(stderr, "quorum launch: %s: stopping every task and starting the cluster again, ps 0 "
            "coordinating (restart %d of %d): every ps restores the newest checkpoint, every "
            "worker goes on from its data position in it\n", why, *used, plan->max_restarts);
    stop_all(kids, n);
    coordinator = 0;
    for (int i = 0; i < n; i++) start_child(kids, i, plan);
    return true;
}

/* A failed task, restarts left: start it again (a worker), or the whole
 * cluster from its newest checkpoint (a ps). False: it cannot be. */
static bool restart(child *kids, int n, int i, const launch_plan *plan, int *used) {
    child *c = &kids[i];
    if (*used >= plan->max_restarts) return false;
    char why[160];
    describe_exit(c, why, sizeof why);
    bool is_ps = i < plan->nps;
    if (is_ps && !plan->checkpoints) {
        fprintf(stderr, "quorum launch: %s; not restarted: without --checkpoint-dir the other "
                "shards could not go back to the moment it would restart at\n", why);
        return false;
    }
    if (is_ps && i == coordinator && coordinator != 0) {
        /* ps 0's successor, dead with nobody to succeed it (ps 0's
         * replacement still being copied): a new run of it would take
         * itself for the coordinator of a run that has none, so the
         * whole cluster starts again instead. */
        char lost[300];
        snprintf(lost, sizeof lost, "%s; it coordinated since ps 0 failed over, and no ps "
                 "holding a full copy of shard 0 took its role over", why);
        return restart_cluster(kids, n, plan, used, lost);
    }
    (*used)++;
    if (!is_ps) {
        fprintf(stderr, "quorum launch: %s; restarting it (restart %d of %d): it rejoins at "
                "the current global step\n", why, *used, plan->max_restarts);
    } else {
        fprintf(stderr, "quorum launch: %s; restarting it (restart %d of %d): it restores the "
                "newest checkpoint, and the cluster rolls back to it in place, every shard and "
                "the global step at one moment\n", why, *used, plan->max_restarts);
    }
    start_child(kids, i, plan);
    return true;
}

/* A failed-over ps has exited, restarts left: a replacement, which joins
 * as a backup (src/ps/rerep.c). False: none is started (the ps stays
 * failed over, as without --max-restarts). */
static bool rejoin(child *kids, int i, const launch_plan *plan, int *used) {
    child *c = &kids[i];
    if (*used >= plan->max_restarts) {
        c->reported = true;
        return false;
    }
    (*used)++;
    fprintf(stderr, "quorum launch: %s (failed over) has exited; starting a replacement "
            "(restart %d of %d): it rejoins as a backup, copied its shards while training "
            "goes on, without a rollback\n", c->name, *used, plan->max_restarts);
    start_child(kids, i, plan);
    return true;
}

/* A ps found ps K hung ("hung ps K SILENT_MS"), or ps 0 the chief
 * ("hung worker 0 SILENT_MS"): SIGKILL it, which a stopped process cannot
 * ignore, so that it is handled as a dead one (a restart with
 * --max-restarts, else the end of the run) and never serves again. A notice about a run of it younger than the silence it reports
 * is about an earlier run, already gone. */
static void read_notices(child *kids, const launch_plan *plan) {
    char line[256];
    ssize_t n;
    while (notices[0] >= 0 && (n = recv(notices[0], line, sizeof line - 1, MSG_DONTWAIT)) > 0) {
        line[n] = 0;
        int index;
        unsigned long long silent_ms;
        if (sscanf(line, "joined worker %d", &index) == 1) {
            if (index >= 0 && index < plan->nworkers) kids[plan->nps + index].joined = true;
            continue;
        }
        unsigned long long view;
        int by = -1;
        if (sscanf(line, "failover ps %d %llu by %d", &index, &view, &by) >= 2) {
            if (index < 0 || index >= plan->nps || kids[index].failed_over) continue;
            child *c = &kids[index];
            c->failed_over = true;
            /* The notice comes from the coordinator of the new view: when
             * the old one was failed over, its successor, which says so
             * (ps 1 for ps 0; ps 0's replacement for ps 1 after that). */
            if (by < 0 || by >= plan->nps || by == index) /* (a notice without it) */
                by = index == coordinator ? (index + 1) % plan->nps : coordinator;
            if (index == coordinator) coordinator = by;
            fprintf(stderr, "quorum launch: %s (pid %d) was failed over by ps %d (view %llu): its "
                    "backup serves its shard, training goes on on one copy of it; not killed "
                    "and not counted a failure%s\n", c->name, (int)c->pid, by, view,
                    plan->max_restarts ? "; once it has exited, a replacement (--max-restarts) "
                    "rejoins as a backup" : "");
            continue;
        }
        long long step;
        if (sscanf(line, "restart cluster %lld", &step) == 1) {
            cluster_restart_wanted = true;
            continue;
        }
        if (sscanf(line, "rollback ps %d", &index) == 1) {
            if (index <= 0 || index >= plan->nps || kids[index].rollback) continue;
            child *c = &kids[index];
            c->rollback = true;
            /* Still running: the run ps 0 lost, hung or cut off (failed
             * over before, or silent for heartbeat-timeout-ms), whose
             * state the rollback drops; a stopped one would hold the
             * rollback up until it resumed. Not a replacement started a
             * moment ago for its failover: that one restores the
             * checkpoint as a restart would. */
            uint64_t age_ms = qr__now_ns() / 1000000 - c->started_ms;
            /* Exited after its failover and left unreplaced (no restart
             * left: rejoin), before this notice came: the
             * rollback needs it all the same (the loop restarts it). */
            if (c->exited) c->reported = false;
            bool kill_it = !c->exited &&
                           (c->failed_over || age_ms >= (uint64_t)plan->heartbeat_timeout_ms);
            fprintf(stderr, "quorum launch: %s (pid %d) is lost with a neighbour, both copies of "
                    "a shard with them: ps 0 rolls the cluster back to its newest checkpoint; "
                    "%s is restarted once it has exited (--max-restarts)%s\n", c->name,
                    (int)c->pid, c->name, kill_it ? "; killing it (hung or cut off)" : "");
            if (kill_it) kill(c->pid, SIGKILL);
            /* A replacement started a moment ago takes part in the rollback
             * as it runs: nothing to restart once it ends (with the run). */
            if (!c->exited && !kill_it) c->rollback = false;
            continue;
        }
        if (sscanf(line, "rejoined ps %d %llu", &index, &view) == 2) {
            if (index >= 0 && index < plan->nps)
                fprintf(stderr, "quorum launch: ps %d holds copies of its shards again (view "
                        "%llu): re-replicated\n", index, view);
            continue;
        }
        int ps_index, worker_index;
        if (sscanf(line, "hung ps %d %llu", &ps_index, &silent_ms) == 2 && ps_index >= 0 &&
            ps_index < plan->nps)
            index = ps_index;
        else if (sscanf(line, "hung worker %d %llu", &worker_index, &silent_ms) == 2 &&
                 worker_index == 0)
            index = plan->nps; /* the chief: a non-chief one is only lost (ps 0 goes on) */
        else
            continue;
        child *c = &kids[index];
        uint64_t age_ms = qr__now_ns() / 1000000 - c->started_ms;
        if (c->exited || c->hung[0] || age_ms < silent_ms) continue;
        snprintf(c->hung, sizeof c->hung, "no answer to heartbeats for %llu ms, "
                 "heartbeat-timeout-ms", silent_ms);
        fprintf(stderr, "quorum launch: %s (pid %d) is hung: %s; killing it\n", c->name,
                (int)c->pid, c->hung);
        kill(c->pid, SIGKILL);
    }
}

/* ps 0 has ended well: it stopped the cluster in order (its final
 * checkpoint written), so training is over. Nothing is restarted from
 * then on: a ps restarted now would wait for a ps 0 that is gone, with
 * no deadline (a ps waits as long as it takes for a ps 0 it has never
 * met), and the launcher with it. A ps that fails now (one stopped
 * through the end, that fences itself when continued) is reported with
 * the tasks that did not end well. */
static bool coordinator_ended_well(const child *kids) {
    return kids[coordinator].exited && !failed(&kids[coordinator]);
}

/* Supervise the children until all have exited; returns the exit status. */
static int supervise(child *kids, int n, const launch_plan *plan) {
    int nlost = 0, restarts = 0;
    uint64_t run_ended_ms = 0; /* when the chief and every ps had ended well */
    bool ps_told = false;
    for (;;) {
        read_notices(kids, plan);
        if (cluster_restart_wanted && !run_ended_ms && !coordinator_ended_well(kids)) {
            cluster_restart_wanted = false;
            char why[160];
            snprintf(why, sizeof why, "both copies of a shard are lost while ps %d coordinates "
                     "(ps 0 failed over)", coordinator);
            if (!restart_cluster(kids, n, plan, &restarts, why)) {
                fprintf(stderr, "quorum launch: stopping every task\n");
                stop_all(kids, n);
                return LAUNCH_FAILED;
            }
            nlost = 0;
            ps_told = false;
        }
        int running = reap(kids, n);
        /* A program run as the workers need not stop the cluster: once
         * every worker has ended well, the launcher stops the ps tasks
         * (SIGTERM: an orderly stop). */
        bool workers_done = plan->command != NULL;
        for (int i = plan->nps; i < n; i++) workers_done &= kids[i].exited && !failed(&kids[i]);
        if (workers_done && !ps_told) {
            ps_told = true;
            for (int i = 0; i < plan->nps; i++)
                if (!kids[i].exited) {
                    kids[i].told_to_stop = true;
                    kill(kids[i].pid, SIGTERM);
                }
        }
        uint64_t now_ms = qr__now_ns() / 1000000 + 1; /* never 0 */
        if (interrupted && running) {
            fprintf(stderr, "\nquorum launch: interrupted: stopping all tasks\n");
            stop_all(kids, n);
            return LAUNCH_INTERRUPTED;
        }
        bool essentials_done = true;
        for (int i = 0; i < n; i++) {
            child *c = &kids[i];
            /* (reported: a ps that failed once training was over) */
            if (essential(c)) essentials_done &= c->exited && (!failed(c) || c->reported);
            /* (ps 0 too: started with --coordinator, it rejoins as the
             * backup of the shards it held, as any ps does.) */
            if (c->exited && c->failed_over && !c->rollback && !c->reported && !run_ended_ms &&
                rejoin(kids, i, plan, &restarts)) {
                essentials_done = false;
                continue;
            }
            /* Lost with its neighbour: the cluster rolls back, and waits
             * for it (failed over just before, or not). */
            if (c->exited && c->rollback && !c->reported && !run_ended_ms &&
                !coordinator_ended_well(kids)) {
                if (restart(kids, n, i, plan, &restarts)) {
                    running++;
                    essentials_done = false;
                    break;
                }
                c->reported = true;
                fprintf(stderr, "quorum launch: %s is needed by the rollback and cannot be "
                        "restarted: stopping the other tasks\n", c->name);
                stop_all(kids, n);
                return LAUNCH_FAILED;
            }
            if (!c->exited || !failed(c) || c->reported) continue;
            /* The coordinator may fail it over (--ps-replicas 2; ps 0
             * itself, by its successor): it sees the death within a
             * heartbeat-timeout-ms at most, and says so. */
            if (plan->ps_copies > 1 && i < plan->nps) {
                if (!c->failed_ms) c->failed_ms = now_ms;
                if (now_ms - c->failed_ms < (uint64_t)plan->heartbeat_timeout_ms + 2000) {
                    essentials_done = false;
                    continue;
                }
            }
            /* Not once training is over: a straggler stopped then is not
             * a failure to undo. */
            bool over = run_ended_ms || coordinator_ended_well(kids);
            if (!over && restart(kids, n, i, plan, &restarts)) {
                running++; /* the new run of it: counted before the check below */
                essentials_done = false;
                break;
            }
            c->reported = true;
            if (!essential(c)) {
                report_worker_lost(c, plan, ++nlost);
                continue;
            }
            char why[160];
            describe_exit(c, why, sizeof why);
            if (i != coordinator && i < plan->nps && coordinator_ended_well(kids)) {
                fprintf(stderr, "quorum launch: %s after ps %d had stopped the cluster in order: "
                        "training is over; not restarted\n", why, coordinator);
                continue;
            }
            fprintf(stderr, "quorum launch: %s: stopping the other tasks\n", why);
            stop_all(kids, n);
            return LAUNCH_FAILED;
        }
        if (!running) break;
        if (essentials_done && !run_ended_ms) {
            run_ended_ms = now_ms;
            /* A failed-over ps still there (stopped) serves nothing: gone now. */
            for (int i = 0; i < plan->nps; i++)
                if (kids[i].failed_over && !kids[i].exited) kill(kids[i].pid, SIGKILL);
        }
        if (run_ended_ms && now_ms - run_ended_ms >= GRACE_MS) {
            /* Training is over; a worker that has not ended by now would
             * wait for nothing (the ps tasks are gone). One that never
             * reached ps 0 only came late (it started after the run had
             * done its steps, say): that is no failure of the run. */
            read_notices(kids, plan);
            for (int i = 0; i < n; i++) {
                child *c = &kids[i];
                if (c->exited) continue;
                c->reported = true;
                c->late = i >= plan->nps && !c->joined;
                if (c->late)
                    fprintf(stderr, "quorum launch: %s (pid %d) had not joined the run when it "
                            "ended (it was still waiting for ps 0): stopping it; not a "
                            "failure\n", c->name, (int)c->pid);
                else
                    fprintf(stderr, "quorum launch: %s (pid %d) was still running %d ms after "
                            "the run ended: stopping it\n", c->name, (int)c->pid, GRACE_MS);
            }
            stop_all(kids, n);
            break;
        }
        sleep_ms(20);
    }
    return LAUNCH_OK;
}

/* After a run whose chief and ps tasks ended well: 0 if every task did,
 * else 3 and one line naming those that did not. */
static int final_status(const child *kids, int n) {
    char *names = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&names, &len);
    int nbad = 0;
    for (int i = 0; i < n; i++) {
        if (!failed(&kids[i])) continue;
        if (f) fprintf(f, "%s%s", nbad ? ", " : "", kids[i].name);
        nbad++;
    }
    if (f) fclose(f);
    if (nbad)
        fprintf(stderr, "quorum launch: training finished, but %d of %d tasks did not end well: "
                "%s\n", nbad, n, names ? names : "");
    free(names);
    return nbad ? LAUNCH_TASKS_FAILED : LAUNCH_OK;
}

int cmd_launch(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: quorum launch --ps P --workers W [--max-restarts K] [training options]\n"
                   "                     [options]\n"
                   "       quorum launch --ps P --workers W [options] -- COMMAND [ARGS...]\n\n"
                   "Start P ps tasks and W workers on this machine (Unix sockets in a private\n"
                   "temporary directory; loopback TCP with --transport tcp)\n"
                   "and train. Every other option is passed to every task.\n"
                   "With \"-- COMMAND\", each worker runs COMMAND instead (a Python script using\n"
                   "the quorum package), with TF_CONFIG, QUORUM_OPTIONS (the options, JSON),\n"
                   "RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (as torchrun) set; the ps\n"
                   "tasks are stopped once every worker has ended well.\n"
                   "With --logdir, the program's chief writes its summaries there (QUORUM_LOGDIR,\n"
                   "QUORUM_SUMMARY_SECS); with --metrics-port-base, worker i serves its metrics\n"
                   "on the port listed for it (QUORUM_METRICS_PORT); --quiet: no progress line\n"
                   "(QUORUM_QUIET=1). quorum.torch does all three (docs/PYTHON.md).\n"
                   "Every task gets OMP_NUM_THREADS=1 unless it is set already (as torchrun).\n"
                   "--max-restarts K: restart up to K failed tasks (default 0): a worker alone,\n"
                   "rejoining at the current step; a ps alone, the cluster rolling back to\n"
                   "its newest checkpoint in place (needs --checkpoint-dir). A ps that another\n"
                   "ps finds hung (no answer to heartbeats for heartbeat-timeout-ms) is killed\n"
                   "and is then a failed ps like any other.\n"
                   "With --ps-replicas 2, a ps other than ps 0 that dies or hangs is\n"
                   "failed over in place by ps 0 (its backup serves its shard): it is neither\n"
                   "killed nor a failure; under --max-restarts, once it has exited, a\n"
                   "replacement rejoins as the backup of its shards, copied while training\n"
                   "goes on, without a rollback; checkpoints (--checkpoint-dir) go on, each\n"
                   "shard written by the copy that serves it (docs/REPLICATION.md). Two\n"
                   "neighbouring ps lost together (both copies of a shard) roll the cluster\n"
                   "back to its newest checkpoint, both restarted (2 restarts), or abort the\n"
                   "run without --checkpoint-dir; after ps 0's failover, every task is started\n"
                   "again from that checkpoint instead (1 restart). ps 0 that dies (or hangs,\n"
                   "and is killed) is failed over by ps 1, which takes the coordinator's role,\n"
                   "the step in flight and the checkpoints; under --max-restarts its\n"
                   "replacement, started with --coordinator 1 (as is every task started from\n"
                   "then on), rejoins as the backup of shard 0 and of ps P-1's shard.\n"
                   "--metrics-port-base N: task i serves Prometheus metrics on port N + i (ps\n"
                   "tasks first, then workers), on metrics-bind (127.0.0.1); listed at start and\n"
                   "in LOGDIR/metrics_ports.json with --logdir.\n"
                   "Exit status: 0 every task ended well; 1 the run failed (a ps or the chief);\n"
                   "3 training finished but some worker did not end well (named on the last\n"
                   "line; a worker that had not yet reached ps 0 when the run ended is stopped\n"
                   "and named, not counted); 130 interrupted; 2 bad options.\n\n"
                   "training:\n");
            cli_print_train_help(stdout, CLI_TRAIN);
            printf("\noptions:\n");
            cli_print_config_help(stdout);
            return 0;
        }
    launch_plan plan = {0};
    int n = 0;
    child *kids = NULL;
    int rc = launch_plan_read(argc, argv, &plan);
    if (rc) goto done;
    n = plan.nps + plan.nworkers;
    kids = calloc((size_t)n, sizeof *kids);
    if (!kids) {
        fprintf(stderr, "quorum launch: out of memory\n");
        rc = LAUNCH_FAILED;
        goto done;
    }
    rc = launch_plan_prepare(&plan);
    if (rc) goto done;
    fprintf(stderr, "quorum launch: %d ps (%s) and %d workers%s%s%s\n", plan.nps, plan.ps_hosts,
            plan.nworkers, plan.command ? " running " : "", plan.command ? plan.command[0] : "",
            plan.secret_made ? "; a secret made for this run authenticates every connection"
                             : "");
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (plan.metrics_base) launch_announce_metrics(&plan);
    if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, notices))
        notices[0] = notices[1] = -1; /* no notices: a hung ps is then only reported */
    for (int i = 0; i < n; i++) start_child(kids, i, &plan);
    rc = supervise(kids, n, &plan);
    for (int i = 0; i < 2; i++)
        if (notices[i] >= 0) close(notices[i]);
    if (rc == LAUNCH_OK) rc = final_status(kids, n);
done:
    launch_plan_free(&plan);
    free(kids);
    return rc;
}

/*
 * quorum.c - the `quorum` command: run one ps or worker task of a cluster,
 * launch a whole local cluster, or run a benchmark. The only code in the
 * project that prints for the user and exits.
 */
#include "cli.h"
#include "data/ctr.h"
#include "wire/secret.h"
#include "bench/bench.h"
#include "common/cpu.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static const char *cluster_help =
    "  --ps_hosts H:P,...      addresses of the ps tasks (or unix:/path)\n"
    "  --worker_hosts H:P,...  addresses of the workers; worker 0 is the chief\n"
    "  --job_name ps|worker    this task's job\n"
    "  --task_index I          this task's index in its job\n"
    "  (or set TF_CONFIG='{\"cluster\":{\"ps\":[...],\"worker\":[...]},"
    "\"task\":{\"type\":\"worker\",\"index\":0}}')\n";

static void usage(FILE *f) {
    fprintf(f,
            "quorum %s - a parameter server for distributed training\n\n"
            "usage: quorum <command> [options]\n\n"
            "commands:\n"
            "  launch   start a whole cluster (ps tasks and workers) on this machine and train\n"
            "  ps       run one parameter-server task of a cluster\n"
            "  worker   run one worker task of a cluster (worker 0 is the chief)\n"
            "  train    --local: the single-process reference of synchronous training\n"
            "  bench    benchmarks: quorum bench wire | optim | ckpt | embed | mlp | tier\n"
            "  ckpt     look at checkpoints: quorum ckpt ls | show | verify DIR\n"
            "  gen-ctr  write a synthetic click data set: quorum gen-ctr --out DIR\n"
            "  keygen   write a new cluster secret: quorum keygen PATH (docs/SECURITY.md)\n"
            "  plot     draw a run's loss and throughput: quorum plot LOGDIR -o FILE.png\n"
            "  version  print the version\n\n"
            "`quorum <command> --help` describes a command's options.\n",
            qr_version());
}

static int cmd_gen_ctr(int argc, char **argv);
static int cmd_keygen(int argc, char **argv);

static bool wants_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
    return false;
}

/* A task's exit status: 0 its part of the run ended well, 1 the run
 * failed, 2 bad options (cli.c), 3 the job ended without its chief
 * (QR_ECHIEFLOST: worker 0 was lost and not restarted within
 * restart-wait-ms, so nobody evaluated the model), so that an orchestrator
 * can tell that from other failures. */
#define EXIT_CHIEF_LOST 3

static int task_exit_status(int rc) {
    return rc == QR_ECHIEFLOST ? EXIT_CHIEF_LOST : rc ? 1 : 0;
}

static const char *task_exit_help =
    "Exit status: 0 the run ended well; 1 the run failed or was aborted (the last line\n"
    "says why); 2 bad options; 3 the job ended without its chief (worker 0 was lost\n"
    "and not restarted within restart-wait-ms: nobody evaluated the model).\n";

static qr_ps *running_ps;
/* A SIGINT/SIGTERM that came before the ps was made (a slow start: quorum
 * launch stops the ps tasks as soon as the workers are done) stops it as
 * soon as it runs, instead of killing it outright. */
static volatile sig_atomic_t stop_signalled;

static void on_stop_signal(int sig) {
    (void)sig;
    stop_signalled = 1;
    if (running_ps) qr_ps_stop(running_ps); /* uv_async_send: async-signal-safe */
}

static int cmd_ps(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        printf("usage: quorum ps [cluster flags] [options]\n\n"
               "Serve the variables placed on this ps task until the chief stops the\n"
               "cluster or the process gets SIGINT/SIGTERM.\n%s\ncluster:\n%s\noptions:\n",
               task_exit_help, cluster_help);
        cli_print_config_help(stdout);
        return 0;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_stop_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    cli_args a;
    /* A ps accepts the training options too, so one command line can be
     * given to every task; it uses only the library options. */
    int rc = cli_parse("ps", argc, argv, CLI_CLUSTER | CLI_CONFIG | CLI_TRAIN, &a);
    qr_cluster *cluster = NULL;
    if (!rc) rc = cli_cluster("ps", &a, &cluster);
    if (rc) {
        cli_args_free(&a);
        return rc;
    }
    char tag[32];
    snprintf(tag, sizeof tag, "ps %d", qr_cluster_task_index(cluster));
    qr__log_set_tag(tag);
    qr_ps *ps = NULL;
    rc = qr_ps_create(&ps, cluster, a.cfg);
    if (rc) {
        fprintf(stderr, "quorum ps: %s\n", qr_last_error());
    } else {
        running_ps = ps;
        if (stop_signalled) qr_ps_stop(ps); /* asked while it was being made */
        rc = qr_ps_run(ps);
        running_ps = NULL;
        if (rc) fprintf(stderr, "quorum ps: %s\n", qr_last_error());
        qr_ps_free(ps); /* closes the listener: its socket file is gone */
    }
    cli_leave_launch_dir();
    qr_cluster_free(cluster);
    cli_args_free(&a);
    return task_exit_status(rc);
}

/* A worker stopped by SIGTERM says so before it goes: its training loop is
 * not interrupted midway, and a silent death left the user guessing. The
 * message is built before the handler is installed; the handler only
 * writes it (async-signal-safe) and dies of the signal, so whoever waits
 * for the process still sees what ended it. */
static char worker_stop_msg[96];
static size_t worker_stop_len;

static void on_worker_sigterm(int sig) {
    ssize_t unused = write(2, worker_stop_msg, worker_stop_len);
    (void)unused;
    signal(sig, SIG_DFL);
    raise(sig);
}

static void say_when_terminated(int index) {
    int n = snprintf(worker_stop_msg, sizeof worker_stop_msg,
                     "quorum worker %d: stopped by SIGTERM\n", index);
    worker_stop_len = n > 0 ? (size_t)n : 0;
    struct sigaction sa = {0};
    sa.sa_handler = on_worker_sigterm;
    sigaction(SIGTERM, &sa, NULL);
}

static int cmd_worker(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        printf("usage: quorum worker [cluster flags] [training options] [options]\n\n"
               "Train as one worker of a cluster. Worker 0, the chief, initializes the\n"
               "variables, evaluates at the end and stops the cluster; the others wait\n"
               "for that stop once their steps are done.\n%s\ncluster:\n%s\n"
               "training:\n",
               task_exit_help, cluster_help);
        cli_print_train_help(stdout, CLI_TRAIN);
        printf("\noptions:\n");
        cli_print_config_help(stdout);
        return 0;
    }
    cli_args a;
    int rc = cli_parse("worker", argc, argv, CLI_CLUSTER | CLI_CONFIG | CLI_TRAIN, &a);
    qr_cluster *cluster = NULL;
    if (!rc) rc = cli_cluster("worker", &a, &cluster);
    if (rc) {
        cli_args_free(&a);
        return rc;
    }
    int index = qr_cluster_task_index(cluster);
    char tag[32];
    snprintf(tag, sizeof tag, "worker %d", index);
    qr__log_set_tag(tag);
    say_when_terminated(index);
    /* The chief shows the progress of the run and its summary. */
    cli_progress progress = {.tty = isatty(2)};
    if (index == 0 && !a.quiet) {
        a.train.on_progress = cli_show_progress;
        a.train.progress_ctx = &progress;
    }
    qr_train_result res;
    rc = qr_train_worker(cluster, index, a.cfg, &a.train, &res);
    if (rc)
        fprintf(stderr, "quorum worker: %s\n", qr_last_error());
    else if (index == 0)
        cli_print_summary(&a, qr__config_str(a.cfg, "mode"), qr_cluster_num_ps(cluster),
                          qr_cluster_num_workers(cluster), &res);
    qr_cluster_free(cluster);
    cli_args_free(&a);
    return task_exit_status(rc);
}

static int cmd_train(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        printf("usage: quorum train --local [--virtual-workers N] [training options] [options]\n\n"
               "The single-process reference of synchronous training: N workers computed\n"
               "in turn, their gradients reduced in worker order and applied with the\n"
               "code a ps runs. A cluster run with --mode sync, R = N and --init-tokens 0\n"
               "and the same seed ends with the same params_digest.\n\ntraining:\n");
        cli_print_train_help(stdout, CLI_TRAIN | CLI_LOCAL);
        printf("\noptions:\n");
        cli_print_config_help(stdout);
        return 0;
    }
    cli_args a;
    int rc = cli_parse("train", argc, argv, CLI_CONFIG | CLI_TRAIN | CLI_LOCAL, &a);
    if (!rc && !a.local) {
        fprintf(stderr, "quorum train: only --local is supported; use quorum launch for a cluster\n");
        rc = 2;
    }
    if (rc) {
        cli_args_free(&a);
        return rc;
    }
    qr_train_result res;
    rc = qr_train_local(a.cfg, &a.train, &res);
    if (rc) fprintf(stderr, "quorum train: %s\n", qr_last_error());
    /* Synchronous whatever the mode option says: it is the sync reference. */
    else cli_print_summary(&a, "sync", 0, a.train.virtual_workers, &res);
    cli_args_free(&a);
    return rc ? 1 : 0;
}

static int cmd_bench(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        printf("usage: quorum bench wire [options]    push/pull throughput and latency vs raw sockets,\n"
               "                                      with a cluster secret too (--auth, --encrypt)\n"
               "       quorum bench optim [options]   optimizer applies vs memory bandwidth\n"
               "       quorum bench ckpt [options]    checkpoint pause and write speed vs the disk\n"
               "       quorum bench embed [options]   sparse rows vs dense bytes, memory per row\n"
               "       quorum bench mlp [options]     the MLP's forward and backward, per step\n"
               "       quorum bench tier [options]    a table larger than --table-memory-mb\n"
               "`quorum bench NAME --help` lists a benchmark's options.\n");
        return argc < 1 ? 2 : 0;
    }
    if (!strcmp(argv[0], "wire")) return qr_bench_wire_main(argc, argv);
    if (!strcmp(argv[0], "optim")) {
        argv[0] = "quorum bench optim"; /* its usage line names the program */
        return qr_bench_optim_main(argc, argv);
    }
    if (!strcmp(argv[0], "ckpt")) return qr_bench_ckpt_main(argc, argv);
    if (!strcmp(argv[0], "embed")) return qr_bench_embed_main(argc, argv);
    if (!strcmp(argv[0], "mlp")) return qr_bench_mlp_main(argc, argv);
    if (!strcmp(argv[0], "tier")) return qr_bench_tier_main(argc, argv);
    fprintf(stderr, "quorum bench: unknown benchmark '%s' (wire, optim, ckpt, embed, mlp or "
            "tier)\n",
            argv[0]);
    return 2;
}

/* quorum computes on one BLAS thread everywhere (train.c: several tasks
 * share the cores; a ps and the benchmarks make no BLAS call). OpenBLAS
 * reads OPENBLAS_NUM_THREADS only when it loads, and without it starts a
 * thread pool whose threads spin on sched_yield for a while (measured:
 * ~0.1 s of a core per process, and during the first points of `quorum
 * bench wire` it ran beside the baseline).
 *
 * OpenBLAS also chooses its kernels when it loads, from the CPU's model
 * number: one older than the CPU (Debian 12's 0.3.21 on a Sapphire Rapids
 * Xeon) falls back to its SSE3 kernels, a third of the speed. If it chose
 * kernels narrower than the CPU's features allow (common/cpu.h) and
 * nothing set OPENBLAS_CORETYPE, quorum sets it from cpuid. A value the
 * user or the environment set is kept: some machines set it on purpose.
 *
 * Either way the variables are set and the binary run again, once,
 * before anything else happens (the second time both are set: no loop);
 * the tasks `quorum launch` starts inherit them. If that exec fails,
 * quorum goes on as it is. */
static const char *choose_coretype(void) {
    qr_cpu cpu;
    qr__cpu_describe(&cpu);
    const char *kernel = qr__blas_kernel();
    const char *coretype =
        qr__blas_coretype_to_set(cpu.coretype, getenv("OPENBLAS_CORETYPE"), kernel);
    if (!coretype) return NULL;
    const char *has = !strcmp(coretype, "SkylakeX")  ? "AVX-512"
                      : !strcmp(coretype, "Haswell") ? "AVX2 and FMA"
                                                     : "AVX";
    qr__log(QR_LOG_INFO,
            "OpenBLAS chose its %s kernels on this CPU (%s), which has %s: using "
            "OPENBLAS_CORETYPE=%s (set OPENBLAS_CORETYPE yourself to choose others)",
            kernel, cpu.model, has, coretype);
    return coretype;
}

/* After quorum chose the kernels: say so if OpenBLAS did not take them
 * (a build without them ignores the variable and detects as before). */
static void check_chosen_coretype(void) {
    const char *chosen = getenv(QR_CPU_CHOSEN_ENV), *set = getenv("OPENBLAS_CORETYPE");
    if (!chosen || !set || strcmp(chosen, set)) return;
    const char *kernel = qr__blas_kernel();
    if (strcasecmp(kernel, chosen))
        qr__log(QR_LOG_WARN, "OPENBLAS_CORETYPE=%s, but OpenBLAS runs its %s kernels", chosen,
                kernel);
}

static void prepare_blas(char **argv) {
    bool again = false;
    if (!getenv("OPENBLAS_NUM_THREADS")) {
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
        again = true;
    }
    const char *coretype = choose_coretype();
    if (coretype) {
        setenv("OPENBLAS_CORETYPE", coretype, 1);
        setenv(QR_CPU_CHOSEN_ENV, coretype, 1);
        again = true;
    }
    if (!again) {
        check_chosen_coretype();
        return;
    }
    execv("/proc/self/exe", argv);
    if (coretype)
        qr__log(QR_LOG_WARN, "cannot run quorum again with OPENBLAS_CORETYPE=%s (%s): OpenBLAS "
                "keeps the kernels it chose", coretype, strerror(errno));
}

int main(int argc, char **argv) {
    prepare_blas(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "ps")) return cmd_ps(argc - 2, argv + 2);
    if (!strcmp(cmd, "worker")) return cmd_worker(argc - 2, argv + 2);
    if (!strcmp(cmd, "launch")) return cmd_launch(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 2, argv + 2);
    if (!strcmp(cmd, "ckpt")) return cmd_ckpt(argc - 2, argv + 2);
    if (!strcmp(cmd, "plot")) return cmd_plot(argc - 2, argv + 2);
    if (!strcmp(cmd, "train")) return cmd_train(argc - 2, argv + 2);
    if (!strcmp(cmd, "gen-ctr")) return cmd_gen_ctr(argc - 2, argv + 2);
    if (!strcmp(cmd, "keygen")) return cmd_keygen(argc - 2, argv + 2);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        if (wants_help(argc - 2, argv + 2)) {
            printf("usage: quorum version\n\nPrint the version of quorum and exit.\n");
            return 0;
        }
        printf("quorum %s\n", qr_version());
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "quorum: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}

/* quorum gen-ctr --out DIR [--rows N] [--fields F] [--seed S] */
static int cmd_gen_ctr(int argc, char **argv) {
    qr_ctr_gen g;
    qr_ctr_gen_default(&g);
    if (wants_help(argc, argv)) {
        printf("usage: quorum gen-ctr --out DIR [--rows N] [--fields F] [--seed S]\n\n"
               "Write a seeded synthetic click data set to DIR: train.ffm and test.ffm\n"
               "(libffm text: label field:id:1 ...) and meta.json. Each field's ids follow a\n"
               "Zipf distribution over up to a million values; labels come from a hidden\n"
               "logistic model whose own test AUC is meta.json's hidden_auc, the ceiling a\n"
               "learner is measured against (docs/EMBEDDINGS.md).\n\n"
               "  --out DIR     where to write (created if missing)\n"
               "  --rows N      examples, train and test together (default %lld; 20%% test)\n"
               "  --fields F    categorical fields, 1..100 (default %d)\n"
               "  --seed S      (default %llu)\n",
               (long long)g.rows, g.fields, (unsigned long long)g.seed);
        return 0;
    }
    const char *out = NULL;
    for (int i = 0; i < argc; i++) {
        const char *flag = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t v = 0;
        int bad = 0;
        if (!value) bad = 1;
        else if (!strcmp(flag, "--out")) out = value;
        else if (!strcmp(flag, "--rows")) bad = qr__parse_int64(value, 10, 1ll << 32, &v) || !(g.rows = v);
        else if (!strcmp(flag, "--fields")) bad = qr__parse_int64(value, 1, 100, &v) || !(g.fields = (int)v);
        else if (!strcmp(flag, "--seed")) bad = qr__parse_int64(value, 0, INT64_MAX, &v) || ((g.seed = (uint64_t)v), 0);
        else {
            fprintf(stderr, "quorum gen-ctr: unknown option '%s' (see --help)\n", flag);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "quorum gen-ctr: %s needs %s\n", flag,
                    !strcmp(flag, "--out") ? "a folder"
                    : !strcmp(flag, "--rows") ? "a number, 10..2^32"
                    : !strcmp(flag, "--fields") ? "a number, 1..100" : "a number >= 0");
            return 2;
        }
        i++;
    }
    if (!out) {
        fprintf(stderr, "quorum gen-ctr: --out DIR is required\n");
        return 2;
    }
    double auc = 0;
    if (qr_ctr_generate(out, &g, &auc)) {
        fprintf(stderr, "quorum gen-ctr: %s\n", qr_last_error());
        return 1;
    }
    printf("wrote %lld examples of %d fields to %s (hidden model's test AUC %.4f)\n",
           (long long)g.rows, g.fields, out, auc);
    return 0;
}

/* quorum keygen PATH */
static int cmd_keygen(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        printf("usage: quorum keygen PATH\n\n"
               "Write a new cluster secret to PATH: 32 random bytes (as 64 hex digits), mode\n"
               "0600, readable by you only. Give it to every task of the job with\n"
               "--secret-file PATH (or QUORUM_SECRET_FILE=PATH): each connection is then\n"
               "mutually authenticated and bound to the job's cluster spec; add --encrypt to\n"
               "seal every message. An existing file is never overwritten. docs/SECURITY.md\n"
               "says how to hand the secret to tasks on other machines.\n");
        return 0;
    }
    if (argc != 1 || argv[0][0] == '-') {
        fprintf(stderr, "usage: quorum keygen PATH\n");
        return 2;
    }
    if (qr__write_secret_file(argv[0])) {
        fprintf(stderr, "quorum keygen: %s\n", qr_last_error());
        return 1;
    }
    printf("wrote a new cluster secret to %s (mode 0600)\n", argv[0]);
    return 0;
}

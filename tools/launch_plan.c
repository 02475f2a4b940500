/*
 * launch_plan.c - the plan of `quorum launch` (launch_internal.h):
 * everything decided before the first child starts. The options, read and
 * checked once for every task; the program each worker runs after "--";
 * the arguments passed through to every task; an address for every task
 * (Unix sockets in a private temporary directory, or free loopback TCP
 * ports with --transport tcp), checked as the tasks will check them; the
 * run's secret; the metrics ports; one OpenMP thread per task unless the
 * environment says otherwise; and, when the run ends, the removal of
 * what the plan made (launch.c supervises the children in between).
 *
 * Unless given a secret (--secret-file, QUORUM_SECRET_FILE) or told to go
 * without one (--secret-file none), the launcher makes a secret for the
 * run in a private directory and gives its path to every task
 * (QUORUM_SECRET_FILE), so no process outside the run can talk to its ps
 * tasks; the file is removed when the run ends.
 */
#include "launch_internal.h"
#include "wire/secret.h"

#include <cjson/cJSON.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* A free TCP port on 127.0.0.1. Another process could take it before the
 * ps binds it; the ps then fails to start and the launcher reports it. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int port = -1;
    if (!bind(fd, (struct sockaddr *)&sa, sizeof sa) &&
        !getsockname(fd, (struct sockaddr *)&sa, &len))
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

/* n addresses, comma-separated, in a string of their own (free it):
 * "unix:DIR/JOBi.sock" when dir is set (no port can be taken by another
 * process between choosing and binding it), else free ports. NULL when
 * no port or memory could be had. */
static char *build_hosts(const char *dir, const char *job, int n) {
    char *hosts = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&hosts, &len);
    if (!f) return NULL;
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        if (dir) {
            ok = fprintf(f, "%sunix:%s/%s%d.sock", i ? "," : "", dir, job, i) > 0;
        } else {
            int port = free_port();
            ok = port >= 0 && fprintf(f, "%s127.0.0.1:%d", i ? "," : "", port) > 0;
        }
    }
    if (fclose(f) || !ok) {
        free(hosts);
        return NULL;
    }
    return hosts;
}

/* Remove the socket files a killed ps may have left, then the directory. */
static void remove_socket_dir(const char *dir, int nps) {
    for (int i = 0; i < nps; i++) {
        char *path = NULL;
        if (asprintf(&path, "%s/ps%d.sock", dir, i) < 0) continue;
        unlink(path);
        free(path);
    }
    rmdir(dir);
}

/* argv without --ps and --workers: what every task is given. */
static char **pass_through(int argc, char **argv, int *npass) {
    char **pass = calloc((size_t)argc + 1, sizeof *pass);
    *npass = 0;
    for (int i = 0; pass && i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--ps") || !strcmp(s, "--workers") || !strcmp(s, "--max-restarts") ||
            !strcmp(s, "--metrics-port-base")) {
            i++;
            continue;
        }
        if (!strncmp(s, "--ps=", 5) || !strncmp(s, "--workers=", 10) ||
            !strncmp(s, "--max-restarts=", 15))
            continue;
        pass[(*npass)++] = argv[i];
    }
    return pass;
}

/* Every option set explicitly, as a JSON object of strings. */
static char *options_json(const qr_config *cfg) {
    cJSON *o = cJSON_CreateObject();
    qr__config_key k;
    for (int i = 0; qr__config_key_info(i, &k); i++)
        if (qr__config_is_set(cfg, k.name))
            cJSON_AddStringToObject(o, k.name, qr__config_str(cfg, k.name));
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

/* The run's secret: dir/secret, its path handed to every task through
 * QUORUM_SECRET_FILE. In the run's own directory (the Unix sockets'), so
 * that the ps tasks of a launcher killed outright remove it with the
 * directory (cli_leave_launch_dir). QR_OK, or an error (said). */
static int make_run_secret(const char *dir) {
    char *path = NULL;
    if (asprintf(&path, "%s/secret", dir) < 0 || qr__write_secret_file(path)) {
        fprintf(stderr, "quorum launch: cannot make the run's secret in %s: %s\n", dir,
                path ? qr_last_error() : strerror(errno));
        free(path);
        return QR_EIO;
    }
    setenv("QUORUM_SECRET_FILE", path, 1);
    free(path);
    return QR_OK;
}

static void remove_run_secret(const char *dir) {
    char *path = NULL;
    if (dir && asprintf(&path, "%s/secret", dir) >= 0) unlink(path);
    free(path);
}

/* Parse and check the options before any process starts. */
static int read_options(int argc, char **argv, launch_plan *plan) {
    cli_args a;
    int rc = cli_parse("launch", argc, argv, CLI_LAUNCH | CLI_CONFIG | CLI_TRAIN, &a);
    if (!rc) {
        plan->nps = a.launch_ps ? a.launch_ps : 1;
        plan->nworkers = a.launch_workers ? a.launch_workers : 1;
        plan->tcp = !strcmp(qr__config_str(a.cfg, "transport"), "tcp");
        plan->sync = !strcmp(qr__config_str(a.cfg, "mode"), "sync");
        plan->replicas = plan->nworkers;
        plan->restart_wait_ms = qr__config_int(a.cfg, "restart-wait-ms");
        plan->max_restarts = a.launch_max_restarts;
        plan->metrics_base = a.launch_metrics_base;
        plan->logdir = a.train.logdir;
        plan->summary_secs = a.train.summary_secs;
        plan->quiet = a.quiet;
        if (qr__config_int(a.cfg, "metrics-port") != 0) {
            fprintf(stderr, "quorum launch: --metrics-port would give every task the same port; "
                    "use --metrics-port-base N (task i serves on N + i)\n");
            rc = 2;
        }
        plan->checkpoints = qr__config_str(a.cfg, "checkpoint-dir")[0] != '\0';
        plan->secret_given = qr__config_is_set(a.cfg, "secret-file");
        plan->options_json = options_json(a.cfg);
        plan->heartbeat_timeout_ms = qr__config_int(a.cfg, "heartbeat-timeout-ms");
        if (qr__config_is_set(a.cfg, "coordinator")) {
            fprintf(stderr, "quorum launch: --coordinator is launch's own: it gives it to the "
                    "tasks it starts after ps 0's failover (a run starts coordinated by ps 0)\n");
            rc = 2;
        }
        if (qr_replicas_check_config(a.cfg, plan->nps, &plan->ps_copies)) {
            fprintf(stderr, "quorum launch: %s\n", qr_last_error());
            rc = 2;
        }
        if (plan->sync && qr_sync_check_config(a.cfg, plan->nworkers, &plan->replicas, NULL)) {
            fprintf(stderr, "quorum launch: %s\n", qr_last_error());
            rc = 2;
        }
    }
    cli_args_free(&a);
    return rc;
}

/* The private directory of the tasks' Unix sockets (free it), or NULL
 * with a message. */
static char *make_socket_dir(void) {
    const char *tmp = getenv("TMPDIR");
    char *dir = NULL;
    if (asprintf(&dir, "%s/quorum-launch-XXXXXX", tmp && *tmp ? tmp : "/tmp") < 0) return NULL;
    if (!mkdtemp(dir)) {
        fprintf(stderr, "quorum launch: cannot create %s: %s\n", dir, strerror(errno));
        free(dir);
        return NULL;
    }
    return dir;
}

int launch_plan_read(int argc, char **argv, launch_plan *plan) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "quorum launch: nothing after \"--\": give the program the "
                        "workers run (quorum launch --ps 2 --workers 3 -- python train.py)\n");
                return 2;
            }
            plan->command = argv + i + 1;
            argc = i;
            break;
        }
    int rc = read_options(argc, argv, plan);
    if (!rc) plan->pass = pass_through(argc, argv, &plan->npass);
    return rc;
}

/* One OpenMP thread per task, as torchrun sets for its workers: P + W
 * processes share this machine's cores, and a program that starts a thread
 * per core in each (torch does) overloads them (measured: a PyTorch job 30
 * to 50 times slower). A value in the launcher's environment is kept.
 * quorum's own tasks compute on one OpenBLAS thread already
 * (OPENBLAS_NUM_THREADS, quorum.c), so the launcher tells only a program's
 * users, once. */
static void one_thread_per_task(const launch_plan *plan) {
    if (getenv("OMP_NUM_THREADS")) return;
    setenv("OMP_NUM_THREADS", "1", 1);
    if (!plan->command) return;
    fprintf(stderr, "quorum launch: setting OMP_NUM_THREADS=1 for every task, as torchrun does: "
            "%d ps task%s and %d worker%s share this machine's %ld cores, and a thread pool per "
            "process would overload them; set OMP_NUM_THREADS to tune it for your program\n",
            plan->nps, plan->nps == 1 ? "" : "s", plan->nworkers, plan->nworkers == 1 ? "" : "s",
            sysconf(_SC_NPROCESSORS_ONLN));
}

int launch_plan_prepare(launch_plan *plan) {
    one_thread_per_task(plan);
    char *dir = plan->socket_dir = plan->tcp ? NULL : make_socket_dir();
    plan->self = realpath("/proc/self/exe", NULL);
    plan->ps_hosts = build_hosts(dir, "ps", plan->nps);
    plan->worker_hosts = build_hosts(dir, "worker", plan->nworkers);
    if (!plan->pass || (!plan->tcp && !dir) || !plan->self || !plan->ps_hosts ||
        !plan->worker_hosts) {
        fprintf(stderr, "quorum launch: cannot set up the run (free loopback ports, this "
                "program's path, a socket directory, or memory)\n");
        return LAUNCH_FAILED;
    }
    /* The tasks would each refuse a bad address (a socket path too long
     * for a long TMPDIR, say): refuse it once, here, with the way out. */
    qr_cluster *check = NULL;
    if (qr_cluster_from_flags(&check, plan->ps_hosts, plan->worker_hosts, "ps", 0)) {
        fprintf(stderr, "quorum launch: %s%s\n", qr_last_error(),
                plan->tcp ? "" : " (use a shorter TMPDIR, or --transport tcp)");
        return LAUNCH_FAILED;
    }
    qr_cluster_free(check);
    /* Unless the options or the environment name a secret (or "none"). */
    plan->secret_made = !plan->secret_given && !getenv("QUORUM_SECRET_FILE");
    if (plan->secret_made && !dir)
        plan->run_dir = make_socket_dir(); /* tcp: a directory for it alone */
    if (plan->secret_made &&
        ((!dir && !plan->run_dir) || make_run_secret(dir ? dir : plan->run_dir)))
        return LAUNCH_FAILED;
    /* If this launcher is killed outright it cleans up nothing: its ps
     * tasks then remove the socket directory (cli_leave_launch_dir). */
    if (dir || plan->run_dir) {
        char pid[24];
        snprintf(pid, sizeof pid, "%d", (int)getpid());
        setenv("QUORUM_LAUNCH_DIR", dir ? dir : plan->run_dir, 1);
        setenv("QUORUM_LAUNCH_PID", pid, 1);
    }
    return QR_OK;
}

void launch_plan_free(launch_plan *plan) {
    char *dir = plan->socket_dir;
    remove_run_secret(dir ? dir : plan->run_dir);
    if (plan->run_dir) rmdir(plan->run_dir);
    free(plan->run_dir);
    if (dir) remove_socket_dir(dir, plan->nps);
    free(plan->worker_hosts);
    free(plan->ps_hosts);
    free(plan->self);
    free(dir);
    free(plan->pass);
    free(plan->options_json);
}

/* Say where every task serves its metrics, and write it to --logdir. */
void launch_announce_metrics(const launch_plan *plan) {
    FILE *json = NULL;
    if (plan->logdir) {
        char path[4200];
        mkdir(plan->logdir, 0755);
        snprintf(path, sizeof path, "%s/metrics_ports.json", plan->logdir);
        json = fopen(path, "w");
        if (!json) fprintf(stderr, "quorum launch: cannot write %s: %s\n", path, strerror(errno));
    }
    fprintf(stderr, "quorum launch: metrics at");
    if (json) fprintf(json, "{");
    for (int i = 0; i < plan->nps + plan->nworkers; i++) {
        bool is_ps = i < plan->nps;
        int index = is_ps ? i : i - plan->nps;
        fprintf(stderr, "%s %s %d http://127.0.0.1:%d/metrics", i ? "," : "", is_ps ? "ps" : "worker",
                index, plan->metrics_base + i);
        if (json) fprintf(json, "%s\"%s %d\": %d", i ? ", " : "", is_ps ? "ps" : "worker", index,
                          plan->metrics_base + i);
    }
    fprintf(stderr, "\n");
    if (json) {
        fprintf(json, "}\n");
        fclose(json);
    }
}

/* TF_CONFIG for task (job, index): the cluster as JSON lists. */
char *launch_options_json(const launch_plan *plan, int coordinator) {
    const char *given = plan->options_json ? plan->options_json : "{}";
    if (!coordinator) return strdup(given);
    cJSON *o = cJSON_Parse(given);
    char value[16];
    snprintf(value, sizeof value, "%d", coordinator);
    if (!o || !cJSON_AddStringToObject(o, "coordinator", value)) {
        cJSON_Delete(o);
        return NULL;
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

char *launch_tf_config(const launch_plan *plan, const char *job, int index) {
    cJSON *root = cJSON_CreateObject(), *cluster = cJSON_AddObjectToObject(root, "cluster");
    const char *lists[2][2] = {{"ps", plan->ps_hosts}, {"worker", plan->worker_hosts}};
    for (int k = 0; k < 2; k++) {
        cJSON *arr = cJSON_AddArrayToObject(cluster, lists[k][0]);
        char *copy = strdup(lists[k][1]);
        for (char *save = NULL, *a = copy ? strtok_r(copy, ",", &save) : NULL; a;
             a = strtok_r(NULL, ",", &save))
            cJSON_AddItemToArray(arr, cJSON_CreateString(a));
        free(copy);
    }
    cJSON *task = cJSON_AddObjectToObject(root, "task");
    cJSON_AddStringToObject(task, "type", job);
    cJSON_AddNumberToObject(task, "index", index);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

void cli_leave_launch_dir(void) {
    const char *dir = getenv("QUORUM_LAUNCH_DIR"), *pid = getenv("QUORUM_LAUNCH_PID");
    /* Only when the launcher is gone: while it lives, the directory is its
     * to remove, and another ps may not have bound its socket yet. rmdir
     * removes it only once empty, so the last ps task to end does it. */
    if (!dir || !pid || getppid() == (pid_t)atoi(pid)) return;
    /* The run's secret goes with it: every task has read it already, and
     * no launcher is left to start one again. */
    remove_run_secret(dir);
    rmdir(dir);
}

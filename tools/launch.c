/*
 * launch.c - `quorum launch`: a whole cluster on this machine.
 *
 * Gives every task an address (Unix sockets in a private temporary
 * directory, or free loopback TCP ports with --transport tcp), starts P ps
 * tasks and W workers as child
 * processes of this same binary (each a real `quorum ps` / `quorum
 * worker`, given the cluster by flags), and supervises them:
 *   - the run succeeds when the chief and every ps exit 0;
 *   - when a ps or the chief fails, the others are stopped (SIGTERM, then
 *     SIGKILL after a grace period) and the failure is reported with its
 *     exit;
 *   - when another worker fails, it is reported and training goes on
 *     without it: the ps tier decides whether it can (async, or sync with
 *     backup workers), and says so if it cannot;
 *   - Ctrl-C / SIGTERM to the launcher stops every child the same way;
 *   - children get PR_SET_PDEATHSIG, so a killed launcher leaves nothing.
 * Only the chief writes to stdout, so with --json its summary is the last
 * line of stdout.
 */
#include "cli.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
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
} child;

static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
    interrupted = sig;
}

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

/* n addresses: "unix:DIR/JOBi.sock" when dir is set (no port can be taken
 * by another process between choosing and binding it), else free ports. */
static int build_hosts(const char *dir, const char *job, int n, char *buf, size_t len) {
    size_t off = 0;
    buf[0] = 0;
    for (int i = 0; i < n; i++) {
        if (dir) {
            off += (size_t)snprintf(buf + off, len - off, "%sunix:%s/%s%d.sock", i ? "," : "",
                                    dir, job, i);
        } else {
            int port = free_port();
            if (port < 0) return -1;
            off += (size_t)snprintf(buf + off, len - off, "%s127.0.0.1:%d", i ? "," : "", port);
        }
        if (off >= len) return -1;
    }
    return 0;
}

/* Remove the socket files a killed ps may have left, then the directory. */
static void remove_socket_dir(const char *dir, int nps) {
    char path[4200];
    for (int i = 0; i < nps; i++) {
        snprintf(path, sizeof path, "%s/ps%d.sock", dir, i);
        unlink(path);
    }
    rmdir(dir);
}

static pid_t spawn(const char *self, const char *job, int index, const char *ps_hosts,
                   const char *worker_hosts, int argc, char **argv) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0) return pid;
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    char idx[16];
    snprintf(idx, sizeof idx, "%d", index);
    char **args = calloc((size_t)argc + 16, sizeof *args);
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
    args[n] = NULL;
    signal(SIGINT, SIG_IGN); /* the launcher decides how children stop */
    execv(self, args); /* inherits OPENBLAS_NUM_THREADS=1 (quorum.c, main) */
    fprintf(stderr, "quorum launch: cannot run %s: %s\n", self, strerror(errno));
    _exit(127);
}

static void describe_exit(const child *c, char *buf, size_t len) {
    if (WIFEXITED(c->status))
        snprintf(buf, len, "%s (pid %d) exited with status %d", c->name, (int)c->pid,
                 WEXITSTATUS(c->status));
    else if (WIFSIGNALED(c->status))
        snprintf(buf, len, "%s (pid %d) was killed by signal %d (%s)", c->name, (int)c->pid,
                 WTERMSIG(c->status), strsignal(WTERMSIG(c->status)));
    else
        snprintf(buf, len, "%s (pid %d) ended", c->name, (int)c->pid);
}

static bool failed(const child *c) {
    return !WIFEXITED(c->status) || WEXITSTATUS(c->status) != 0;
}

/* Non-chief workers may come and go; everything else is essential. */
static bool essential(const child *c) {
    return strncmp(c->name, "worker ", 7) || !strcmp(c->name, "worker 0");
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

int cmd_launch(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: quorum launch --ps P --workers W [training options] [options]\n\n"
                   "Start P ps tasks and W workers on this machine (Unix sockets in a private\n"
                   "temporary directory; loopback TCP with --transport tcp)\n"
                   "and train. Every other option is passed to every task.\n\n"
                   "training:\n");
            cli_print_train_help(stdout, CLI_TRAIN);
            printf("\noptions:\n");
            cli_print_config_help(stdout);
            return 0;
        }
    /* Validate everything here, before any process starts. */
    cli_args a;
    int rc = cli_parse("launch", argc, argv, CLI_LAUNCH | CLI_CONFIG | CLI_TRAIN, &a);
    if (rc) {
        cli_args_free(&a);
        return rc;
    }
    int nps = a.launch_ps ? a.launch_ps : 1, nworkers = a.launch_workers ? a.launch_workers : 1;
    bool tcp = !strcmp(qr__config_str(a.cfg, "transport"), "tcp");
    if (!strcmp(qr__config_str(a.cfg, "mode"), "sync") &&
        qr_sync_check_config(a.cfg, nworkers, NULL, NULL)) {
        fprintf(stderr, "quorum launch: %s\n", qr_last_error());
        cli_args_free(&a);
        return 2;
    }
    cli_args_free(&a);

    /* Pass everything but --ps/--workers through to the tasks. */
    char **pass = calloc((size_t)argc + 1, sizeof *pass);
    int npass = 0;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        bool is_launch = !strcmp(s, "--ps") || !strcmp(s, "--workers");
        if (is_launch) {
            i++;
            continue;
        }
        if (!strncmp(s, "--ps=", 5) || !strncmp(s, "--workers=", 10)) continue;
        pass[npass++] = argv[i];
    }

    char ps_hosts[8192], worker_hosts[8192], self[4096], dir_buf[128];
    const char *dir = NULL;
    if (!tcp) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir_buf, sizeof dir_buf, "%s/quorum-launch-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        dir = mkdtemp(dir_buf);
        if (!dir) {
            fprintf(stderr, "quorum launch: cannot create %s: %s\n", dir_buf, strerror(errno));
            free(pass);
            return 1;
        }
    }
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0 || build_hosts(dir, "ps", nps, ps_hosts, sizeof ps_hosts) ||
        build_hosts(dir, "worker", nworkers, worker_hosts, sizeof worker_hosts)) {
        fprintf(stderr, "quorum launch: cannot find free loopback ports or this program's path\n");
        if (dir) remove_socket_dir(dir, nps);
        free(pass);
        return 1;
    }
    self[len] = 0;
    fprintf(stderr, "quorum launch: %d ps (%s) and %d workers\n", nps, ps_hosts, nworkers);

    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    int n = nps + nworkers;
    child *kids = calloc((size_t)n, sizeof *kids);
    for (int i = 0; i < n; i++) {
        bool is_ps = i < nps;
        int index = is_ps ? i : i - nps;
        snprintf(kids[i].name, sizeof kids[i].name, "%s %d", is_ps ? "ps" : "worker", index);
        kids[i].pid = spawn(self, is_ps ? "ps" : "worker", index, ps_hosts, worker_hosts,
                            npass, pass);
        if (kids[i].pid < 0) {
            fprintf(stderr, "quorum launch: fork failed: %s\n", strerror(errno));
            kids[i].exited = true;
            kids[i].status = 1 << 8;
        }
    }
    free(pass);

    int exit_code = 0;
    while (reap(kids, n)) {
        if (interrupted) {
            fprintf(stderr, "\nquorum launch: interrupted: stopping all tasks\n");
            stop_all(kids, n);
            exit_code = 130;
            break;
        }
        int bad = -1;
        for (int i = 0; i < n && bad < 0; i++) {
            if (!kids[i].exited || !failed(&kids[i])) continue;
            if (essential(&kids[i])) {
                bad = i;
            } else if (!kids[i].reported) {
                char why[160];
                describe_exit(&kids[i], why, sizeof why);
                fprintf(stderr, "quorum launch: %s; training goes on without it\n", why);
                kids[i].reported = true;
            }
        }
        if (bad >= 0) {
            char why[160];
            describe_exit(&kids[bad], why, sizeof why);
            fprintf(stderr, "quorum launch: %s: stopping the other tasks\n", why);
            stop_all(kids, n);
            exit_code = 1;
            break;
        }
        sleep_ms(20);
    }
    for (int i = 0; i < n && exit_code == 0; i++) {
        if (failed(&kids[i]) && essential(&kids[i])) {
            char why[160];
            describe_exit(&kids[i], why, sizeof why);
            fprintf(stderr, "quorum launch: %s\n", why);
            exit_code = 1;
        }
    }
    free(kids);
    if (dir) remove_socket_dir(dir, nps);
    return exit_code;
}

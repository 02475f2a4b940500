/*
 * cli.c - flag parsing shared by the quorum subcommands (see cli.h).
 *
 * Flags are "--key value" or "--key=value"; '-' and '_' are the same in
 * keys. A key is tried as a cluster flag, then a launch flag, then a
 * training flag (train_flags.c), then a library option (qr_config_set,
 * which validates the value); anything else is an error that names the
 * flag and suggests the nearest known one, so a typo never passes
 * silently. Then options that would be ignored are refused: those of the
 * other training mode, and a --slow-worker with no such worker.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void normalize(char *k) {
    for (; *k; k++)
        if (*k == '_') *k = '-';
}

/* Flags that may stand alone, meaning "true": the boolean library options
 * and the training flags that take no value. */
static bool is_bool_flag(const char *k) {
    qr__config_key info;
    for (int i = 0; qr__config_key_info(i, &info); i++)
        if (info.is_bool && !strcmp(k, info.name)) return true;
    const char *name, *mode;
    bool is_bool;
    unsigned groups;
    for (int i = 0; cli_train_flag_at(i, &name, &is_bool, &groups, &mode); i++)
        if (is_bool && !strcmp(k, name)) return true;
    return false;
}

static int set_cluster_flag(cli_args *a, const char *k, const char *v) {
    if (!strcmp(k, "ps-hosts")) a->ps_hosts = v;
    else if (!strcmp(k, "worker-hosts")) a->worker_hosts = v;
    else if (!strcmp(k, "job-name")) a->job_name = v;
    else if (!strcmp(k, "task-index")) {
        int64_t i;
        if (qr__parse_int64(v, 0, 1 << 20, &i)) return QR_EINVAL;
        a->task_index = (int)i;
    } else
        return QR_ENOTFOUND;
    a->have_cluster_flags = true;
    return QR_OK;
}

static int set_launch_flag(cli_args *a, const char *k, const char *v) {
    int64_t n;
    int *dst = !strcmp(k, "ps")             ? &a->launch_ps
               : !strcmp(k, "workers")      ? &a->launch_workers
               : !strcmp(k, "max-restarts") ? &a->launch_max_restarts
               : !strcmp(k, "metrics-port-base") ? &a->launch_metrics_base
                                            : NULL;
    if (!dst) return QR_ENOTFOUND;
    int64_t lo = dst == &a->launch_max_restarts ? 0 : dst == &a->launch_metrics_base ? 1024 : 1;
    int64_t hi = dst == &a->launch_max_restarts ? 1000 : dst == &a->launch_metrics_base ? 65000 : 256;
    if (qr__parse_int64(v, lo, hi, &n)) return QR_EINVAL;
    *dst = (int)n;
    return QR_OK;
}

/* ---- did you mean ------------------------------------------------------ */

static const char *cluster_flags[] = {"ps_hosts", "worker_hosts", "job_name", "task_index"};
static const char *launch_flags[] = {"ps", "workers", "max-restarts", "metrics-port-base"};

/* Option i of those a subcommand accepts, as --help spells it; NULL past
 * the end. */
static const char *option_at(unsigned accept, int i) {
    if (accept & CLI_CLUSTER) {
        if (i < (int)QR_ARRAY_LEN(cluster_flags)) return cluster_flags[i];
        i -= (int)QR_ARRAY_LEN(cluster_flags);
    }
    if (accept & CLI_LAUNCH) {
        if (i < (int)QR_ARRAY_LEN(launch_flags)) return launch_flags[i];
        i -= (int)QR_ARRAY_LEN(launch_flags);
    }
    const char *name, *mode;
    bool is_bool;
    unsigned groups;
    for (int k = 0; cli_train_flag_at(k, &name, &is_bool, &groups, &mode); k++) {
        bool ok = (groups & CLI_LOCAL) ? (accept & CLI_LOCAL) : (accept & CLI_TRAIN);
        if (ok && i-- == 0) return name;
    }
    qr__config_key info;
    if ((accept & CLI_CONFIG) && qr__config_key_info(i, &info)) return info.name;
    return NULL;
}

/* Optimal string alignment distance: insertions, deletions, substitutions
 * and swaps of two neighbours ("optimzier"), '-' and '_' alike. */
static int edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    int *d = calloc((n + 1) * (m + 1), sizeof *d);
    if (!d) return 1 << 20;
#define D(i, j) d[(i) * (m + 1) + (j)]
    for (size_t i = 0; i <= n; i++) D(i, 0) = (int)i;
    for (size_t j = 0; j <= m; j++) D(0, j) = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            char ca = a[i - 1] == '_' ? '-' : a[i - 1], cb = b[j - 1] == '_' ? '-' : b[j - 1];
            int best = QR_MIN(D(i - 1, j) + 1, D(i, j - 1) + 1);
            best = QR_MIN(best, D(i - 1, j - 1) + (ca != cb));
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                best = QR_MIN(best, D(i - 2, j - 2) + 1);
            D(i, j) = best;
        }
    int dist = D(n, m);
#undef D
    free(d);
    return dist;
}

static bool is_prefix(const char *p, const char *s) {
    for (; *p; p++, s++)
        if (*p != (*s == '_' ? '-' : *s)) return false;
    return true;
}

/* The known option nearest to an unknown key: within 1 edit for a short
 * key, one more per 5 characters; else the only option it begins. */
static const char *nearest_option(unsigned accept, const char *key) {
    const char *best = NULL, *only_prefix = NULL, *name;
    int best_dist = 1 + (int)strlen(key) / 5 + 1, prefixed = 0;
    for (int i = 0; (name = option_at(accept, i)); i++) {
        int d = edit_distance(key, name);
        if (d < best_dist) best = name, best_dist = d;
        if (strlen(key) >= 3 && is_prefix(key, name)) only_prefix = name, prefixed++;
    }
    return best ? best : prefixed == 1 ? only_prefix : NULL;
}

/* Every group: to tell an option of another subcommand from a typo. */
#define CLI_ALL (CLI_CLUSTER | CLI_CONFIG | CLI_TRAIN | CLI_LAUNCH | CLI_LOCAL)

static bool known_elsewhere(const char *key) {
    const char *name;
    for (int i = 0; (name = option_at(CLI_ALL, i)); i++)
        if (!edit_distance(key, name)) return true;
    return false;
}

static void unknown_option(const char *cmd, unsigned accept, const char *key) {
    const char *near = nearest_option(accept, key);
    if (known_elsewhere(key))
        fprintf(stderr, "quorum %s: --%s is not an option of quorum %s (see quorum %s --help)\n",
                cmd, key, cmd, cmd);
    else if (near)
        fprintf(stderr, "quorum %s: unknown option --%s: did you mean --%s? (see quorum %s --help)\n",
                cmd, key, near, cmd);
    else
        fprintf(stderr, "quorum %s: unknown option --%s (see quorum %s --help)\n", cmd, key, cmd);
}

/* ---- parsing ----------------------------------------------------------- */

static int set_option(cli_args *a, unsigned accept, const char *key, const char *value) {
    int rc = QR_ENOTFOUND;
    if ((accept & CLI_CLUSTER) && rc == QR_ENOTFOUND) rc = set_cluster_flag(a, key, value);
    if ((accept & CLI_LAUNCH) && rc == QR_ENOTFOUND) rc = set_launch_flag(a, key, value);
    if ((accept & (CLI_TRAIN | CLI_LOCAL)) && rc == QR_ENOTFOUND)
        rc = cli_train_flag_set(a, accept, key, value);
    if ((accept & CLI_CONFIG) && rc == QR_ENOTFOUND)
        rc = qr_config_get(NULL, key) ? qr_config_set(a->cfg, key, value) : QR_ENOTFOUND;
    return rc;
}

/* Parse argv[*i] (and its value); advances *i past what it used. */
static int parse_one(const char *cmd, int argc, char **argv, int *i, unsigned accept,
                     cli_args *a) {
    const char *arg = argv[*i];
    if (strncmp(arg, "--", 2) || !arg[2]) {
        fprintf(stderr, "quorum %s: unexpected argument '%s' (options are --key value)\n", cmd,
                arg);
        return 2;
    }
    const char *eq = strchr(arg, '='), *value;
    char *key = eq ? strndup(arg + 2, (size_t)(eq - arg - 2)) : strdup(arg + 2);
    if (!key) return 2;
    normalize(key);
    int rc = 0;
    if (eq)
        value = eq + 1;
    else if (is_bool_flag(key) && (*i + 1 >= argc || !strncmp(argv[*i + 1], "--", 2)))
        value = "true";
    else if (*i + 1 < argc)
        value = argv[++*i];
    else {
        fprintf(stderr, "quorum %s: --%s needs a value\n", cmd, key);
        rc = 2;
    }
    int set = rc ? QR_OK : set_option(a, accept, key, value);
    if (set == QR_ENOTFOUND) {
        unknown_option(cmd, accept, key);
        rc = 2;
    } else if (set) {
        fprintf(stderr, "quorum %s: --%s %s: %s\n", cmd, key, value, qr_last_error());
        rc = 2;
    }
    free(key);
    return rc;
}

/* The first training flag given that applies only to the other mode. */
static const char *misplaced_train_flag(const cli_args *a, const char *run_mode) {
    const char *name, *mode;
    bool is_bool;
    unsigned groups;
    for (int i = 0; cli_train_flag_at(i, &name, &is_bool, &groups, &mode); i++)
        if ((a->train_given >> i & 1) && mode && strcmp(mode, run_mode)) return name;
    return NULL;
}

/* Refuse what the run would ignore: an option of the other training mode,
 * and for quorum train --local (synchronous by definition) --mode async
 * and the flags of a cluster's workers. Defaults never count. */
static int check_mode(const char *cmd, const cli_args *a, unsigned accept) {
    bool local = accept & CLI_LOCAL;
    const char *mode = qr__config_str(a->cfg, "mode");
    if (local && qr__config_is_set(a->cfg, "mode") && strcmp(mode, "sync")) {
        fprintf(stderr, "quorum %s: --mode %s: quorum train --local is the synchronous "
                "reference (--mode sync)\n", cmd, mode);
        return 2;
    }
    if (local) mode = "sync";
    const char *key = qr__config_misplaced_key(a->cfg, mode);
    if (!key) key = misplaced_train_flag(a, mode);
    if (key) {
        const char *other = strcmp(mode, "sync") ? "sync" : "async";
        if (local)
            fprintf(stderr, "quorum %s: --%s applies to --mode %s only, and quorum train "
                    "--local is synchronous\n", cmd, key, other);
        else
            fprintf(stderr, "quorum %s: --%s applies to --mode %s only, and this run is "
                    "--mode %s\n", cmd, key, other, mode);
        return 2;
    }
    const char *name, *flag_mode;
    bool is_bool;
    unsigned groups;
    for (int i = 0; local && cli_train_flag_at(i, &name, &is_bool, &groups, &flag_mode); i++)
        if ((a->train_given >> i & 1) && (groups & CLI_CLUSTER)) {
            fprintf(stderr, "quorum %s: --%s does not apply to quorum train --local (it is "
                    "for the workers of a cluster)\n", cmd, name);
            return 2;
        }
    return 0;
}

/* --slow-worker I:MS must name one of the run's workers. */
static int check_slow_worker(const char *cmd, const cli_args *a, int nworkers) {
    int w = a->train.slow_worker;
    if (w < nworkers) return 0;
    fprintf(stderr, "quorum %s: --slow-worker %d:%d: there is no worker %d (%d worker%s: 0..%d)\n",
            cmd, w, a->train.slow_ms, w, nworkers, nworkers == 1 ? "" : "s", nworkers - 1);
    return 2;
}

int cli_parse(const char *cmd, int argc, char **argv, unsigned accept, cli_args *a) {
    memset(a, 0, sizeof *a);
    a->ps_hosts = a->worker_hosts = a->job_name = "";
    a->task_index = 0;
    qr_train_opts_default(&a->train);
    if (qr_config_new(&a->cfg)) return 2;
    for (int i = 0; i < argc; i++) {
        int rc = parse_one(cmd, argc, argv, &i, accept, a);
        if (rc) return rc;
    }
    int rc = (accept & (CLI_TRAIN | CLI_LOCAL)) ? check_mode(cmd, a, accept) : 0;
    if (!rc && (accept & (CLI_TRAIN | CLI_LOCAL)) && cli_click_defaults(a)) {
        fprintf(stderr, "quorum %s: the click model's defaults: %s\n", cmd, qr_last_error());
        rc = 2;
    }
    if (!rc && (accept & CLI_LAUNCH))
        rc = check_slow_worker(cmd, a, a->launch_workers ? a->launch_workers : 1);
    return rc;
}

void cli_args_free(cli_args *a) {
    qr_config_free(a->cfg);
    a->cfg = NULL;
}

int cli_cluster(const char *cmd, const cli_args *a, qr_cluster **out) {
    int rc;
    if (a->have_cluster_flags)
        rc = qr_cluster_from_flags(out, a->ps_hosts, a->worker_hosts, a->job_name, a->task_index);
    else {
        rc = qr_cluster_from_env(out);
        if (rc == QR_ENOTFOUND) {
            fprintf(stderr, "quorum %s: no cluster given: pass --ps_hosts, --worker_hosts, "
                    "--job_name and --task_index, or set TF_CONFIG\n", cmd);
            return 2;
        }
    }
    if (rc) {
        fprintf(stderr, "quorum %s: %s\n", cmd, qr_last_error());
        return 2;
    }
    if (check_slow_worker(cmd, a, qr_cluster_num_workers(*out))) {
        qr_cluster_free(*out);
        *out = NULL;
        return 2;
    }
    return 0;
}

void cli_print_config_help(FILE *f) {
    qr__config_key k;
    for (int i = 0; qr__config_key_info(i, &k); i++) {
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", k.name);
        fprintf(f, "  %-24s %s", flag, k.help);
        if (k.choices) fprintf(f, "; one of %s", k.choices);
        if (k.def[0]) fprintf(f, " (default %s)", k.def);
        fputc('\n', f);
    }
}

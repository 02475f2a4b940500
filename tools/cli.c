/*
 * cli.c - flag parsing shared by the quorum subcommands (see cli.h).
 *
 * Flags are "--key value" or "--key=value"; '-' and '_' are the same in
 * keys. A key is tried as a cluster flag, then a training option, then a
 * library option (qr_config_set, which validates the value); anything
 * else is an error that names the flag, so a typo never passes silently.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Flags that may stand alone, meaning "true". */
static const char *bool_flags[] = {"json", "quiet", "nesterov", "centered",
                                   "apply-sparse-rmsprop", "local", "staleness-lr-scale"};

static void normalize(char *k) {
    for (; *k; k++)
        if (*k == '_') *k = '-';
}

static bool is_bool_flag(const char *k) {
    for (size_t i = 0; i < QR_ARRAY_LEN(bool_flags); i++)
        if (!strcmp(k, bool_flags[i])) return true;
    return false;
}

static int set_cluster_flag(cli_args *a, const char *k, const char *v) {
    if (!strcmp(k, "ps-hosts")) snprintf(a->ps_hosts, sizeof a->ps_hosts, "%s", v);
    else if (!strcmp(k, "worker-hosts")) snprintf(a->worker_hosts, sizeof a->worker_hosts, "%s", v);
    else if (!strcmp(k, "job-name")) snprintf(a->job_name, sizeof a->job_name, "%s", v);
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
    int *dst = !strcmp(k, "ps") ? &a->launch_ps : !strcmp(k, "workers") ? &a->launch_workers : NULL;
    if (!dst) return QR_ENOTFOUND;
    if (qr__parse_int64(v, 1, 256, &n)) return QR_EINVAL;
    *dst = (int)n;
    return QR_OK;
}

int cli_parse(const char *cmd, int argc, char **argv, unsigned accept, cli_args *a) {
    memset(a, 0, sizeof *a);
    a->task_index = 0;
    qr_train_opts_default(&a->train);
    if (qr_config_new(&a->cfg)) return 2;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) || !arg[2]) {
            fprintf(stderr, "quorum %s: unexpected argument '%s' (options are --key value)\n",
                    cmd, arg);
            return 2;
        }
        char key[128];
        const char *value;
        const char *eq = strchr(arg, '=');
        if (eq) {
            snprintf(key, sizeof key, "%.*s", (int)(eq - arg - 2), arg + 2);
            value = eq + 1;
        } else {
            snprintf(key, sizeof key, "%s", arg + 2);
            normalize(key);
            if (is_bool_flag(key) && (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2)))
                value = "true";
            else if (i + 1 < argc)
                value = argv[++i];
            else {
                fprintf(stderr, "quorum %s: --%s needs a value\n", cmd, key);
                return 2;
            }
        }
        normalize(key);
        int rc = QR_ENOTFOUND;
        if ((accept & CLI_CLUSTER) && rc == QR_ENOTFOUND) rc = set_cluster_flag(a, key, value);
        if ((accept & CLI_LAUNCH) && rc == QR_ENOTFOUND) rc = set_launch_flag(a, key, value);
        if ((accept & CLI_TRAIN) && rc == QR_ENOTFOUND) rc = qr_train_opts_set(&a->train, key, value);
        if ((accept & CLI_CONFIG) && rc == QR_ENOTFOUND) {
            rc = qr_config_get(NULL, key) ? qr_config_set(a->cfg, key, value) : QR_ENOTFOUND;
        }
        if (rc == QR_ENOTFOUND) {
            fprintf(stderr, "quorum %s: unknown option --%s (see quorum %s --help)\n", cmd, key,
                    cmd);
            return 2;
        }
        if (rc) {
            fprintf(stderr, "quorum %s: --%s %s: %s\n", cmd, key, value, qr_last_error());
            return 2;
        }
    }
    return 0;
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
    return 0;
}

void cli_print_config_help(FILE *f) {
    const char *name, *def, *help;
    for (int i = 0; qr__config_key_at(i, &name, &def, &help); i++) {
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", name);
        fprintf(f, "  %-24s %s%s%s%s\n", flag, help, def[0] ? " (default " : "", def,
                def[0] ? ")" : "");
    }
}

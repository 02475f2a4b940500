/*
 * cluster.c - the cluster spec: which addresses the ps and worker tasks
 * have and which task this process is, from TensorFlow-style flags, from a
 * TF_CONFIG JSON document, or from lists given directly.
 *
 * All three sources end in build(), which checks every address, refuses
 * duplicates and checks the task, so a spec that exists is a valid one.
 * Error messages name the flag or JSON path an address came from, since
 * that is what the user has to go and fix.
 */
#include "cluster/cluster.h"

#include "common/addr.h"
#include "common/common.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How a source names the parts of a spec in its error messages. */
typedef enum { NAMES_FLAGS, NAMES_JSON, NAMES_LIST } names_style;

typedef struct naming {
    names_style style;
    const char *ps_list;     /* "--ps_hosts", "cluster.ps", "the ps list" */
    const char *worker_list;
    const char *index_name;  /* "--task_index", "task.index", "task_index" */
    bool chief;              /* JSON: worker 0 came from cluster.chief */
} naming;

static const naming flag_names = {NAMES_FLAGS, "--ps_hosts", "--worker_hosts", "--task_index",
                                  false};
static const naming list_names = {NAMES_LIST, "the ps list", "the worker list", "task_index",
                                  false};

/* "--worker_hosts: address 2" (1-based, as a person counts the list),
 * "cluster.worker[1]" (a JSON path), or "worker 1" (a task). */
static void label(const naming *nm, bool is_ps, int i, char *buf, size_t n) {
    switch (nm->style) {
    case NAMES_FLAGS:
        snprintf(buf, n, "%s: address %d", is_ps ? nm->ps_list : nm->worker_list, i + 1);
        break;
    case NAMES_JSON:
        if (is_ps)
            snprintf(buf, n, "cluster.ps[%d]", i);
        else if (nm->chief && i == 0)
            snprintf(buf, n, "cluster.chief[0]");
        else
            snprintf(buf, n, "cluster.worker[%d]", nm->chief ? i - 1 : i);
        break;
    case NAMES_LIST:
        snprintf(buf, n, "%s %d", is_ps ? "ps" : "worker", i);
        break;
    }
}

void qr_cluster_free(qr_cluster *c) {
    if (!c) return;
    if (c->ps)
        for (int i = 0; i < c->nps; i++) free(c->ps[i]);
    if (c->workers)
        for (int i = 0; i < c->nworkers; i++) free(c->workers[i]);
    free(c->ps);
    free(c->workers);
    free(c);
}

/* Copy already-checked lists into a new spec. */
static int alloc_cluster(qr_cluster **out, int nps, const char *const *ps, int nworkers,
                         const char *const *workers, const char *job, int task_index) {
    qr_cluster *c = qr__calloc(1, sizeof *c);
    if (!c) return QR_ENOMEM;
    c->ps = qr__calloc((size_t)nps, sizeof *c->ps);
    c->workers = qr__calloc((size_t)nworkers, sizeof *c->workers);
    if (!c->ps || !c->workers) goto oom;
    /* Count as we go so qr_cluster_free frees exactly what exists. */
    for (; c->nps < nps; c->nps++)
        if (!(c->ps[c->nps] = qr__strdup(ps[c->nps]))) goto oom;
    for (; c->nworkers < nworkers; c->nworkers++)
        if (!(c->workers[c->nworkers] = qr__strdup(workers[c->nworkers]))) goto oom;
    snprintf(c->job, sizeof c->job, "%s", job ? job : "");
    c->task_index = c->job[0] ? task_index : -1;
    *out = c;
    return QR_OK;
oom:
    qr_cluster_free(c);
    return QR_ENOMEM;
}

/* Check one non-empty list: every element a valid address. keys receives
 * each address's canonical form for the duplicate check. */
static int check_list(const naming *nm, bool is_ps, int n, const char *const *addrs,
                      char (*keys)[320]) {
    if (!addrs) return qr__fail(QR_EINVAL, "%s is NULL", is_ps ? nm->ps_list : nm->worker_list);
    for (int i = 0; i < n; i++) {
        char lb[64];
        label(nm, is_ps, i, lb, sizeof lb);
        if (!addrs[i] || !addrs[i][0]) return qr__fail(QR_EINVAL, "%s is empty", lb);
        qr_addr a;
        if (qr_addr_parse(addrs[i], &a) != QR_OK) {
            qr__error_prefix("%s: ", lb);
            return QR_EINVAL;
        }
        qr_addr_key(&a, keys[i], sizeof keys[i]);
    }
    return QR_OK;
}

/* Two tasks on one address would fight over the port (or socket file),
 * and a worker could not tell which one it reached. Compared in canonical
 * form, so "[::1]:5000" and "[0:0::1]:5000" are the same. Quadratic, but a
 * cluster has tens or hundreds of tasks, not millions. */
static int check_duplicates(int nps, int nworkers, char (*keys)[320]) {
    int n = nps + nworkers;
    for (int i = 0; i < n; i++) {
        for (int j = i + 1; j < n; j++) {
            if (strcmp(keys[i], keys[j]) != 0) continue;
            char a[32], b[32];
            snprintf(a, sizeof a, "%s %d", i < nps ? "ps" : "worker", i < nps ? i : i - nps);
            snprintf(b, sizeof b, "%s %d", j < nps ? "ps" : "worker", j < nps ? j : j - nps);
            /* Quote the canonical form: the two spellings may differ. */
            return qr__fail(QR_EINVAL,
                            "duplicate address: %s and %s are both %s; every task needs "
                            "its own address",
                            a, b, keys[i]);
        }
    }
    return QR_OK;
}

static int check_task(const naming *nm, int nps, int nworkers, const char *job,
                      int task_index) {
    if (!job || !*job) return QR_OK;
    int count;
    if (strcmp(job, "ps") == 0)
        count = nps;
    else if (strcmp(job, "worker") == 0)
        count = nworkers;
    else
        return qr__fail(QR_EINVAL, "unknown job name '%s': expected ps or worker", job);
    if (task_index < 0 || task_index >= count)
        return qr__fail(QR_EINVAL, "%s %d is out of range: job %s has %d task%s (0..%d)",
                        nm->index_name, task_index, job, count, count == 1 ? "" : "s",
                        count - 1);
    return QR_OK;
}

/* The single place where a spec is checked and made. */
static int build(qr_cluster **out, int nps, const char *const *ps, int nworkers,
                 const char *const *workers, const char *job, int task_index,
                 const naming *nm) {
    if (!out) return qr__fail(QR_EINVAL, "cluster: NULL output pointer");
    *out = NULL;
    int rc;
    char (*keys)[320] = NULL;
    if (nps < 1)
        return qr__fail(QR_EINVAL, "%s is empty: a cluster needs at least one ps task",
                        nm->ps_list);
    if (nworkers < 1)
        return qr__fail(QR_EINVAL, "%s is empty: a cluster needs at least one worker task",
                        nm->worker_list);
    keys = qr__calloc((size_t)nps + (size_t)nworkers, sizeof *keys);
    if (!keys) return QR_ENOMEM;
    rc = check_list(nm, true, nps, ps, keys);
    if (rc == QR_OK) rc = check_list(nm, false, nworkers, workers, keys + nps);
    if (rc == QR_OK) rc = check_duplicates(nps, nworkers, keys);
    free(keys);
    if (rc == QR_OK) rc = check_task(nm, nps, nworkers, job, task_index);
    if (rc == QR_OK) rc = alloc_cluster(out, nps, ps, nworkers, workers, job, task_index);
    return rc;
}

int qr_cluster_create(qr_cluster **out, int nps, const char *const *ps, int nworkers,
                      const char *const *workers, const char *job, int task_index) {
    return build(out, nps, ps, nworkers, workers, job, task_index, &list_names);
}

int qr_cluster_clone(const qr_cluster *src, qr_cluster **out) {
    if (!out) return qr__fail(QR_EINVAL, "qr_cluster_clone: NULL output pointer");
    *out = NULL;
    if (!src) return qr__fail(QR_EINVAL, "qr_cluster_clone: NULL cluster");
    return alloc_cluster(out, src->nps, (const char *const *)src->ps, src->nworkers,
                         (const char *const *)src->workers, src->job, src->task_index);
}

/* ------------------------------------------------------------------------ */
/* Flags                                                                    */
/* ------------------------------------------------------------------------ */

static bool is_blank(const char *s) {
    while (*s && isspace((unsigned char)*s)) s++;
    return *s == '\0';
}

/* Split a comma-separated list in place (buf is a private copy). Blanks
 * around each element are dropped, since "a:1, b:2" is what people type
 * in a shell; an element that is nothing but blanks becomes "". */
static int split_list(char *buf, char ***items, int *n) {
    int count = 1;
    for (const char *p = buf; *p; p++) count += *p == ',';
    char **v = qr__calloc((size_t)count, sizeof *v);
    if (!v) return QR_ENOMEM;
    char *p = buf;
    for (int i = 0; i < count; i++) {
        char *comma = strchr(p, ',');
        if (comma) *comma = '\0';
        while (isspace((unsigned char)*p)) p++;
        char *e = p + strlen(p);
        while (e > p && isspace((unsigned char)e[-1])) *--e = '\0';
        v[i] = p;
        p = comma ? comma + 1 : e;
    }
    *items = v;
    *n = count;
    return QR_OK;
}

int qr_cluster_from_flags(qr_cluster **out, const char *ps_hosts, const char *worker_hosts,
                          const char *job_name, int task_index) {
    if (!out) return qr__fail(QR_EINVAL, "qr_cluster_from_flags: NULL output pointer");
    *out = NULL;
    if (!ps_hosts || is_blank(ps_hosts))
        return qr__fail(QR_EINVAL, "--ps_hosts is empty: a cluster needs at least one ps task");
    if (!worker_hosts || is_blank(worker_hosts))
        return qr__fail(QR_EINVAL,
                        "--worker_hosts is empty: a cluster needs at least one worker task");
    char *pbuf = qr__strdup(ps_hosts), *wbuf = qr__strdup(worker_hosts);
    char **ps = NULL, **workers = NULL;
    int nps = 0, nworkers = 0;
    int rc = QR_ENOMEM;
    if (pbuf && wbuf && split_list(pbuf, &ps, &nps) == QR_OK &&
        split_list(wbuf, &workers, &nworkers) == QR_OK)
        rc = build(out, nps, (const char *const *)ps, nworkers, (const char *const *)workers,
                   job_name, task_index, &flag_names);
    free(ps);
    free(workers);
    free(pbuf);
    free(wbuf);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* TF_CONFIG                                                                */
/* ------------------------------------------------------------------------ */

static const char *json_type(const cJSON *j) {
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "invalid";
}

/* Where cJSON stopped, as line, column and a short printable snippet. */
static int fail_parse(const char *text, const char *at) {
    size_t len = strlen(text);
    size_t off = at && at >= text ? (size_t)(at - text) : 0;
    if (off > len) off = len;
    int line = 1, col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    char snip[32];
    size_t k = 0;
    for (size_t i = off; i < len && k < 24; i++)
        snip[k++] = isprint((unsigned char)text[i]) ? text[i] : ' ';
    snip[k] = '\0';
    if (k == 0)
        return qr__fail(QR_EINVAL, "not valid JSON: unexpected end of input at line %d column %d",
                        line, col);
    return qr__fail(QR_EINVAL, "not valid JSON: error at line %d column %d near '%s'", line, col,
                    snip);
}

/* A job's address list: an array of strings. NULL items when absent. */
static int json_list(const cJSON *list, const char *name, int *n) {
    if (!cJSON_IsArray(list))
        return qr__fail(QR_EINVAL, "cluster.%s must be an array of address strings, got %s",
                        name, json_type(list));
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        if (!cJSON_IsString(e) || !e->valuestring)
            return qr__fail(QR_EINVAL, "cluster.%s[%d] must be an address string, got %s", name,
                            i, json_type(e));
        i++;
    }
    *n = i;
    return QR_OK;
}

/* Fill v[at..] with the strings of a checked list. */
static int copy_list(const cJSON *list, const char **v, int at) {
    const cJSON *e;
    cJSON_ArrayForEach(e, list) v[at++] = e->valuestring;
    return at;
}

/* The task: type and index, mapped onto quorum's two jobs. TensorFlow's
 * chief is worker 0 and its workers follow, so "worker" i is worker i+1
 * when the cluster has a chief. */
static int json_task(const cJSON *root, int nps, int ntfworkers, bool chief, char job[16],
                     int *task_index) {
    job[0] = '\0';
    *task_index = -1;
    const cJSON *task = cJSON_GetObjectItemCaseSensitive(root, "task");
    if (!task || cJSON_IsNull(task)) return QR_OK;
    if (!cJSON_IsObject(task))
        return qr__fail(QR_EINVAL, "\"task\" must be an object, got %s", json_type(task));
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(task, "type");
    const cJSON *index = cJSON_GetObjectItemCaseSensitive(task, "index");
    if (!type) {
        /* {"task":{}} is what TF writes for a process outside the cluster. */
        if (index) return qr__fail(QR_EINVAL, "task.index is given but task.type is missing");
        return QR_OK;
    }
    if (!cJSON_IsString(type) || !type->valuestring)
        return qr__fail(QR_EINVAL, "task.type must be a string, got %s", json_type(type));
    /* TensorFlow defaults a missing index to 0 (RunConfig does). */
    int idx = 0;
    if (index) {
        double d = cJSON_IsNumber(index) ? index->valuedouble : NAN;
        if (!cJSON_IsNumber(index) || !isfinite(d) || d != floor(d) || d < INT_MIN ||
            d > INT_MAX) {
            if (cJSON_IsNumber(index))
                return qr__fail(QR_EINVAL, "task.index must be an integer, got %g", d);
            return qr__fail(QR_EINVAL, "task.index must be an integer, got %s",
                            json_type(index));
        }
        idx = (int)d;
    }
    const char *t = type->valuestring;
    int count, mapped;
    const char *as;
    if (strcmp(t, "ps") == 0) {
        count = nps;
        mapped = idx;
        as = "ps";
    } else if (strcmp(t, "worker") == 0) {
        if (ntfworkers == 0)
            return qr__fail(QR_EINVAL, "task.type is 'worker' but the cluster has no worker job");
        count = ntfworkers;
        mapped = chief ? idx + 1 : idx;
        as = "worker";
    } else if (strcmp(t, "chief") == 0) {
        if (!chief)
            return qr__fail(QR_EINVAL, "task.type is 'chief' but the cluster has no chief job");
        count = 1;
        mapped = 0;
        as = "worker";
    } else if (strcmp(t, "evaluator") == 0) {
        return qr__fail(QR_EINVAL,
                        "task.type 'evaluator' is not supported: quorum has no evaluator "
                        "job (an evaluator runs outside the training cluster)");
    } else {
        return qr__fail(QR_EINVAL, "unknown task.type '%s': expected ps, worker or chief", t);
    }
    if (idx < 0 || idx >= count)
        return qr__fail(QR_EINVAL, "task.index %d is out of range: job %s has %d task%s (0..%d)",
                        idx, t, count, count == 1 ? "" : "s", count - 1);
    snprintf(job, 16, "%s", as);
    *task_index = mapped;
    return QR_OK;
}

static int from_json(qr_cluster **out, const char *text) {
    const char *end = NULL;
    /* The length counts the NUL: with require_null_terminated, cJSON checks
     * that the byte after the document is a NUL inside the buffer, so
     * trailing garbage ("{} x") is an error rather than ignored. */
    cJSON *root = cJSON_ParseWithLengthOpts(text, strlen(text) + 1, &end, 1);
    if (!root) return fail_parse(text, end);

    int rc = QR_OK;
    const char **workers = NULL;
    const cJSON *ps = NULL, *worker = NULL, *chief = NULL;
    if (!cJSON_IsObject(root)) {
        rc = qr__fail(QR_EINVAL, "must be a JSON object, got %s", json_type(root));
        goto done;
    }
    const cJSON *cl = cJSON_GetObjectItemCaseSensitive(root, "cluster");
    if (!cl) {
        rc = qr__fail(QR_EINVAL, "no \"cluster\" object");
        goto done;
    }
    if (!cJSON_IsObject(cl)) {
        rc = qr__fail(QR_EINVAL, "\"cluster\" must be an object, got %s", json_type(cl));
        goto done;
    }
    /* Other top-level keys ("environment", "rpc_layer") are TensorFlow's
     * business and are ignored; unknown jobs inside "cluster" are not,
     * because a typo there would silently drop tasks. */
    const cJSON *job;
    cJSON_ArrayForEach(job, cl) {
        const cJSON **slot = NULL;
        const char *name = job->string ? job->string : "";
        if (strcmp(name, "ps") == 0)
            slot = &ps;
        else if (strcmp(name, "worker") == 0)
            slot = &worker;
        else if (strcmp(name, "chief") == 0)
            slot = &chief;
        else if (strcmp(name, "evaluator") == 0)
            continue; /* TF's evaluator reads checkpoints on its own and
                       * never talks to the ps: no place in our spec. */
        else {
            rc = qr__fail(QR_EINVAL,
                          "unknown job '%s' in \"cluster\": expected ps, worker or chief "
                          "(or evaluator, which is ignored)",
                          name);
            goto done;
        }
        if (*slot) {
            rc = qr__fail(QR_EINVAL, "job '%s' appears twice in \"cluster\"", name);
            goto done;
        }
        *slot = job;
    }
    int nps = 0, nworker = 0, nchief = 0;
    if (!ps) {
        rc = qr__fail(QR_EINVAL, "\"cluster\" has no ps job: a cluster needs at least one ps task");
        goto done;
    }
    if ((rc = json_list(ps, "ps", &nps)) != QR_OK) goto done;
    if (worker && (rc = json_list(worker, "worker", &nworker)) != QR_OK) goto done;
    if (chief && (rc = json_list(chief, "chief", &nchief)) != QR_OK) goto done;
    if (chief && nchief != 1) {
        rc = qr__fail(QR_EINVAL, "cluster.chief must have exactly one address, has %d", nchief);
        goto done;
    }
    if (!worker && !chief) {
        rc = qr__fail(QR_EINVAL,
                      "\"cluster\" has no worker or chief job: a cluster needs at least one "
                      "worker task");
        goto done;
    }
    if (nps == 0) {
        rc = qr__fail(QR_EINVAL, "cluster.ps is empty: a cluster needs at least one ps task");
        goto done;
    }
    if (nchief + nworker == 0) {
        rc = qr__fail(QR_EINVAL,
                      "cluster.worker is empty: a cluster needs at least one worker task");
        goto done;
    }

    char jobname[16];
    int task_index;
    if ((rc = json_task(root, nps, nworker, chief != NULL, jobname, &task_index)) != QR_OK)
        goto done;

    const char **psv = qr__calloc((size_t)nps + (size_t)nchief + (size_t)nworker, sizeof *psv);
    if (!psv) {
        rc = QR_ENOMEM;
        goto done;
    }
    workers = psv + nps;
    copy_list(ps, psv, 0);
    int at = chief ? copy_list(chief, workers, 0) : 0;
    if (worker) copy_list(worker, workers, at);
    naming nm = {NAMES_JSON, "cluster.ps", "cluster.worker", "task.index", chief != NULL};
    rc = build(out, nps, psv, nchief + nworker, workers, jobname, task_index, &nm);
    free(psv);
done:
    cJSON_Delete(root);
    return rc;
}

int qr_cluster_from_json(qr_cluster **out, const char *tf_config) {
    if (!out) return qr__fail(QR_EINVAL, "qr_cluster_from_json: NULL output pointer");
    *out = NULL;
    if (!tf_config) return qr__fail(QR_EINVAL, "TF_CONFIG: NULL document");
    int rc = from_json(out, tf_config);
    if (rc != QR_OK) qr__error_prefix("TF_CONFIG: ");
    return rc;
}

int qr_cluster_from_env(qr_cluster **out) {
    if (!out) return qr__fail(QR_EINVAL, "qr_cluster_from_env: NULL output pointer");
    *out = NULL;
    const char *s = getenv("TF_CONFIG");
    if (!s) return qr__fail(QR_ENOTFOUND, "TF_CONFIG is not set");
    /* TensorFlow treats an empty TF_CONFIG as absent; so do we, so that a
     * caller falling back to flags behaves the same. */
    if (is_blank(s)) return qr__fail(QR_ENOTFOUND, "TF_CONFIG is set but empty");
    return qr_cluster_from_json(out, s);
}

/* ------------------------------------------------------------------------ */
/* Accessors                                                                */
/* ------------------------------------------------------------------------ */

int qr_cluster_num_ps(const qr_cluster *c) {
    return c ? c->nps : 0;
}

int qr_cluster_num_workers(const qr_cluster *c) {
    return c ? c->nworkers : 0;
}

const char *qr_cluster_address(const qr_cluster *c, const char *job, int index) {
    if (!c || !job || index < 0) return NULL;
    if (strcmp(job, "ps") == 0) return index < c->nps ? c->ps[index] : NULL;
    if (strcmp(job, "worker") == 0) return index < c->nworkers ? c->workers[index] : NULL;
    return NULL;
}

const char *qr_cluster_job(const qr_cluster *c) {
    return c ? c->job : "";
}

int qr_cluster_task_index(const qr_cluster *c) {
    return c ? c->task_index : -1;
}

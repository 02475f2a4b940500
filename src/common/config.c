/*
 * config.c - the one table of options a ps or a worker understands.
 *
 * Each key has a type, a default, a range and a help line. qr_config_set
 * validates the value against its entry, so that "lr=-1" or "optimzer=adam"
 * fails where it is typed, with a message naming the key. The CLI turns
 * "--key value" flags into qr_config_set calls, so the command line and
 * the C API share these names and these checks.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { KEY_INT, KEY_FLOAT, KEY_BOOL, KEY_ENUM, KEY_STRING } key_type;

typedef struct {
    const char *name;
    const char *mode; /* "sync" or "async": the only training mode it applies to; NULL: both */
    key_type type;
    const char *def;  /* "" = unset: the consumer picks (e.g. per optimizer) */
    double lo, hi;    /* range for INT and FLOAT; FLOAT lo is exclusive if lo_open */
    int lo_open;
    const char *choices; /* "a|b|c" for ENUM */
    const char *help;
} key_spec;

/* The default and the choices of an ENUM key whose list belongs to a
 * higher layer (the optimizer names are optim.c's): that layer gives them
 * with qr__config_provide_choices when the library is loaded. */
#define PROVIDED NULL

#define INF 1e300
#define ANY NULL
#define SYNC "sync"
#define ASYNC "async"
/* The modes follow docs/SYNC.md and docs/ASYNC.md. stall-report-ms serves
 * both (a stalled sync step, a bounded-staleness wait); the moving averages
 * too. */
static const key_spec keys[] = {
    /* transport and timeouts */
    {"transport", ANY, KEY_ENUM, "auto", 0, 0, 0, "auto|tcp|unix",
     "auto: Unix socket to loopback peers, TCP otherwise"},
    {"timeout-ms", ANY, KEY_INT, "30000", 1, 86400000, 0, NULL,
     "deadline of one request, reconnection included"},
    {"init-timeout-ms", ANY, KEY_INT, "120000", 1, 86400000, 0, NULL,
     "how long a worker waits for the chief to initialize the variables"},
    {"socket-buffer-kb", ANY, KEY_INT, "4096", 64, 1048576, 0, NULL,
     "SO_SNDBUF/SO_RCVBUF of every connection"},
    {"peer-timeout-ms", ANY, KEY_INT, "10000", 2000, 86400000, 0, NULL,
     "TCP: a peer whose machine answers nothing for this long is lost (keepalive probes "
     "while idle, TCP_USER_TIMEOUT while data waits)"},
    {"max-message-mb", ANY, KEY_INT, "2048", 1, 65536, 0, NULL,
     "largest message a ps accepts; larger ones close the connection"},
    {"heartbeat-ms", ANY, KEY_INT, "1000", 0, 600000, 0, NULL,
     "worker: how often it tells ps 0 it is alive, from a thread of its own; ps 0: how often "
     "it beats on its links to the other ps (0: never, and no task is ever declared hung)"},
    {"heartbeat-timeout-ms", ANY, KEY_INT, "5000", 100, 86400000, 0, NULL,
     "ps 0: a worker whose heartbeats stop this long is hung (stopped, wedged): it is "
     "treated as lost and its connections are closed; a ps whose link brings nothing this "
     "long is hung too (treated as lost; launch kills and restarts it), and a ps that did "
     "not run this long itself is fenced: it ends without serving or writing"},
    {"metrics-port", ANY, KEY_INT, "0", 0, 65535, 0, NULL,
     "serve Prometheus metrics at http://metrics-bind:PORT/metrics (0: off): read-only "
     "(GET /metrics only, no authentication), on loopback unless --metrics-bind says otherwise"},
    {"metrics-bind", ANY, KEY_STRING, "127.0.0.1", 0, 0, 0, NULL,
     "the IPv4 address the metrics endpoint listens on: loopback unless told otherwise "
     "(read-only, but it says much about the run)"},
    {"bind", ANY, KEY_STRING, "", 0, 0, 0, NULL,
     "ps: the address it listens on, at its port from the cluster spec (\"\": every "
     "interface, as TensorFlow's server; the advertised name need not be a local address)"},
    {"restart-wait-ms", ANY, KEY_INT, "60000", 100, 86400000, 0, NULL,
     "how long a lost task is waited for to come back (a restart): a worker's call that "
     "needs a ps that is gone; sync: a step that needs a worker that is gone "
     "(disconnected, or hung); ps 0: a run with no worker left; ps k: ps 0 gone"},
    {"linger-ms", ANY, KEY_INT, "3000", 0, 600000, 0, NULL,
     "after a stop request, how long a ps waits for workers to hang up"},
    {"max-connections", ANY, KEY_INT, "1024", 4, 1000000, 0, NULL,
     "a ps keeps at most this many connections: a new one beyond them closes the oldest that "
     "has not said who it is (HELLO), else it is closed at once (each worker holds one per "
     "ps, plus a heartbeat's to ps 0; ps 0 one per other ps)"},
    /* what one peer can make a ps hold, with or without a secret (docs/SECURITY.md) */
    {"message-timeout-ms", ANY, KEY_INT, "10000", 0, 86400000, 0, NULL,
     "ps: a request whose first byte has come must be complete within max(this, its size at "
     "message-min-rate-kb), else its connection is closed (0: no deadline)"},
    {"message-min-rate-kb", ANY, KEY_INT, "1024", 1, 1 << 30, 0, NULL,
     "ps: the slowest a large request may arrive (KiB a second): a 64 MiB push at 1024 may "
     "take 64 s"},
    {"first-message-timeout-ms", ANY, KEY_INT, "10000", 0, 86400000, 0, NULL,
     "ps: a connection that has completed no request this long after it opened is closed "
     "(0: never)"},
    {"max-incomplete-mb", ANY, KEY_INT, "256", 0, 1 << 20, 0, NULL,
     "ps: the requests being received may claim this much memory together; a new one of "
     "64 KiB or more beyond it waits (its connection is not read) until others complete; "
     "one alone always goes ahead (0: no bound)"},
    /* security (docs/SECURITY.md) */
    {"secret-file", ANY, KEY_STRING, "", 0, 0, 0, NULL,
     "the cluster secret (32 bytes or more; `quorum keygen PATH` makes one; readable by its "
     "owner only): every connection is mutually authenticated and bound to this job (\"\": "
     "$QUORUM_SECRET_FILE, else none: connections are not authenticated; \"none\": none, "
     "whatever the environment says)"},
    {"encrypt", ANY, KEY_BOOL, "false", 0, 0, 0, NULL,
     "with a secret: seal every message after the handshake (AES-256-GCM or "
     "XChaCha20-Poly1305); every task of the job must agree"},
    {"handshake-timeout-ms", ANY, KEY_INT, "10000", 100, 600000, 0, NULL,
     "a connection whose handshake has not completed this long after it opened is closed"},
    {"partition-min-mb", ANY, KEY_FLOAT, "0", 0, 1e6, 0, NULL,
     "worker: split a dense variable larger than this (MiB) along dimension 0 into shards "
     "of at least this size, one per ps at most, pulled and pushed in parallel (TensorFlow's "
     "min_max_variable_partitioner; 0: never; a variable's partitions=N option overrides)"},
    /* tables larger than memory (ps tasks; docs/EMBEDDINGS.md) */
    {"table-memory-mb", ANY, KEY_INT, "0", 0, 1 << 30, 0, NULL,
     "ps: keep at most this many MiB of embedding-table rows in memory; colder rows move to a "
     "disk tier (LMDB under table-dir) and come back when asked (0: every row in memory)"},
    {"table-dir", ANY, KEY_STRING, "", 0, 0, 0, NULL,
     "ps with table-memory-mb: the disk tier's files go in DIR/ps-K, emptied at start (\"\": a "
     "private directory under $TMPDIR, else /tmp, removed when the ps ends)"},
    /* training regime */
    {"mode", ANY, KEY_ENUM, "async", 0, 0, 0, "async|sync",
     "async: apply every push at once; sync: synchronous replicas"},
    {"ps-replicas", ANY, KEY_INT, "1", 1, 2, 0, NULL,
     "copies of every ps shard: 1 (no copy), or 2: ps k's shard also lives on ps (k+1) mod P, "
     "every update (async: a push; sync: a step) applied there before it is acknowledged (at "
     "most the number of ps tasks; docs/REPLICATION.md)"},
    {"coordinator", ANY, KEY_INT, "0", 0, 65535, 0, NULL,
     "the ps that coordinates the cluster: 0, or, for a task started after ps 0 was failed "
     "over (ps-replicas 2), its successor ps 1, which serves shard 0 from then on (quorum "
     "launch passes it to the tasks it starts then; docs/REPLICATION.md)"},
    {"replication-lag", ASYNC, KEY_INT, "0", 0, 1 << 20, 0, NULL,
     "async, ps-replicas 2: a push is acknowledged once its primary has applied it and the "
     "backup is at most this many forwards behind it (0: once the backup has applied it). "
     "Faster pushes, but a primary's death may lose up to this many acknowledged pushes of "
     "its shard (docs/REPLICATION.md, \"Replication with a bounded lag\")"},
    {"replicas-to-aggregate", SYNC, KEY_INT, "0", 0, 1 << 20, 0, NULL,
     "sync: gradients that make a step (R); 0 = the number of workers"},
    {"reduction", SYNC, KEY_ENUM, "mean", 0, 0, 0, "mean|sum",
     "sync: how a step's gradients are combined"},
    {"sparse-reduction", SYNC, KEY_ENUM, "mean", 0, 0, 0, "mean|per_row",
     "sync, sparse rows with reduction=mean: mean divides each summed row by the gradients "
     "of the step (a replica that did not touch a row counts as zero); per_row divides it "
     "by the gradients that hold the row (TensorFlow's SparseConditionalAccumulator)"},
    {"init-tokens", SYNC, KEY_INT, "-1", -1, 1 << 20, 0, NULL,
     "sync: tokens released before step 0; -1 = max(0, R - N), R reproduces TensorFlow"},
    {"sync-timeout-ms", SYNC, KEY_INT, "600000", 100, 86400000, 0, NULL,
     "sync: a step with no progress this long aborts training with a stall report"},

    {"stall-report-ms", ANY, KEY_INT, "10000", 100, 86400000, 0, NULL,
     "sync: how often a waiting step is reported (which workers are missing); async with "
     "max-staleness: how often a bound wait is (who waits for whom)"},
    {"sync-stats-file", SYNC, KEY_STRING, "", 0, 0, 0, NULL,
     "sync: ps 0 writes one JSON line per step here (quorum, stale, wait)"},
    {"max-staleness", ASYNC, KEY_INT, "-1", -1, 1 << 30, 0, NULL,
     "async: a worker more than this many steps ahead of the slowest live worker waits "
     "(-1: no bound; 0: bulk synchronous)"},
    {"staleness-lr-scale", ASYNC, KEY_BOOL, "false", 0, 0, 0, NULL,
     "async: scale the learning rate of a gradient by 1/(1 + its staleness)"},
    {"moving-average-decay", ANY, KEY_FLOAT, "0", 0, 1, 0, NULL,
     "keep exponential moving averages of the variables on the ps (0: off)"},
    {"moving-average-vars", ANY, KEY_STRING, "", 0, 0, 0, NULL,
     "comma-separated names of the variables to average (default: all)"},
    /* checkpoints (ps tasks; docs/CHECKPOINTS.md) */
    {"checkpoint-dir", ANY, KEY_STRING, "", 0, 0, 0, NULL,
     "ps: write checkpoints here, and restore the newest complete one at start (\"\": off)"},
    {"checkpoint-secs", ANY, KEY_INT, "600", 0, 1ll << 31, 0, NULL,
     "ps: take a checkpoint every this many seconds (0: not by time)"},
    {"checkpoint-steps", ANY, KEY_INT, "0", 0, 1ll << 40, 0, NULL,
     "ps: take a checkpoint every this many global steps (0: not by steps)"},
    {"checkpoint-full-every", ANY, KEY_INT, "10", 1, 1 << 20, 0, NULL,
     "ps: every this many checkpoints one is full; the others in between hold only what "
     "changed since the previous one (1: every checkpoint full)"},
    {"keep-checkpoints", ANY, KEY_INT, "5", 1, 1 << 20, 0, NULL,
     "ps: complete checkpoints kept (and those their chains need); older ones are deleted once "
     "a newer one is complete"},
    {"allow-fresh-start", ANY, KEY_BOOL, "false", 0, 0, 0, NULL,
     "ps: when every checkpoint in checkpoint-dir is damaged, start from scratch instead of "
     "refusing to start"},
    /* optimizer */
    /* choices and default: optim's own list (qr__config_provide_choices) */
    {"optimizer", ANY, KEY_ENUM, PROVIDED, 0, 0, 0, PROVIDED, "optimizer applied on the ps"},
    {"lr", ANY, KEY_FLOAT, "", 0, INF, 1, NULL,
     "learning rate (default: 0.05 for sgd/momentum, 0.001 otherwise)"},
    {"lr-decay-rate", ANY, KEY_FLOAT, "1", 0, 1, 1, NULL,
     "exponential decay: lr * rate^(step / lr-decay-steps), step counted on the ps"},
    {"lr-decay-steps", ANY, KEY_INT, "0", 0, 1ll << 40, 0, NULL,
     "exponential decay: steps over which lr is multiplied by lr-decay-rate (0: no decay)"},
    {"lr-decay-staircase", ANY, KEY_BOOL, "false", 0, 0, 0, NULL,
     "exponential decay: decay in whole multiples of lr-decay-steps"},
    {"momentum", ANY, KEY_FLOAT, "", 0, 1, 0, NULL,
     "momentum (momentum: 0.9; rmsprop: 0.0)"},
    {"nesterov", ANY, KEY_BOOL, "false", 0, 0, 0, NULL, "Nesterov momentum (momentum, adam, adam_async)"},
    {"beta1", ANY, KEY_FLOAT, "0.9", 0, 1, 0, NULL, "Adam beta1"},
    {"beta2", ANY, KEY_FLOAT, "0.999", 0, 1, 0, NULL, "Adam beta2"},
    {"epsilon", ANY, KEY_FLOAT, "", 0, INF, 1, NULL,
     "epsilon (adam/adam_async: 1e-8; rmsprop: 1e-10)"},
    {"decay", ANY, KEY_FLOAT, "0.9", 0, 1, 0, NULL, "RMSProp decay (rho)"},
    {"centered", ANY, KEY_BOOL, "false", 0, 0, 0, NULL, "centered RMSProp"},
    {"initial-accumulator", ANY, KEY_FLOAT, "0.1", 0, INF, 0, NULL,
     "Adagrad/FTRL initial accumulator value"},
    {"l1", ANY, KEY_FLOAT, "0", 0, INF, 0, NULL, "FTRL l1 regularization"},
    {"l2", ANY, KEY_FLOAT, "0", 0, INF, 0, NULL, "FTRL l2 regularization"},
    {"lr-power", ANY, KEY_FLOAT, "-0.5", -INF, 0, 0, NULL, "FTRL learning rate power (<= 0)"},
    {"apply-sparse-rmsprop", ANY, KEY_BOOL, "false", 0, 0, 0, NULL,
     "AdamAsync: sparse applies use RMSProp"},
    {"weight-decay", ANY, KEY_FLOAT, "", 0, INF, 0, NULL,
     "weight decay, torch's weight_decay: g + wd*var before the update (L2); adamw: "
     "decoupled, var *= 1 - lr*wd (adamw: 0.01; others: 0; ftrl: only 0)"},
    {"nonfinite", ANY, KEY_ENUM, "error", 0, 0, 0, "error|skip",
     "a gradient with NaN/Inf: refuse it with an error, or skip and count it"},
    {"apply-threads", ANY, KEY_INT, "1", 0, 64, 0, NULL,
     "threads for optimizer applies of large tensors on a ps (0: the cores, at most 4)"},
};
#undef INF
#undef ANY
#undef SYNC
#undef ASYNC

#define NKEYS ((int)QR_ARRAY_LEN(keys))

/* What qr__config_provide_choices gave, per key. Written before main (or
 * at dlopen), read only afterwards: no lock. */
static struct {
    const char *choices, *def;
} provided[NKEYS];

struct qr_config {
    char *values[NKEYS]; /* NULL = not set */
};

static int key_index(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < NKEYS; i++) {
        const char *a = keys[i].name, *b = name;
        while (*a && *b && (*a == *b || (*a == '-' && *b == '_'))) a++, b++;
        if (!*a && !*b) return i;
    }
    return -1;
}

void qr__config_provide_choices(const char *key, const char *choices, const char *def) {
    int i = key_index(key);
    if (i < 0 || keys[i].choices != PROVIDED || keys[i].type != KEY_ENUM) return;
    provided[i].choices = choices;
    provided[i].def = def;
}

/* Key i's default and choices, its own or provided ("" and NULL when a
 * provided list has not been given). */
static const char *default_of(int i) {
    if (keys[i].def != PROVIDED) return keys[i].def;
    return provided[i].def ? provided[i].def : "";
}

static const char *choices_of(int i) {
    return keys[i].choices != PROVIDED ? keys[i].choices : provided[i].choices;
}

int qr_config_new(qr_config **out) {
    if (!out) return qr__fail(QR_EINVAL, "qr_config_new: out is NULL");
    *out = qr__calloc(1, sizeof(qr_config));
    return *out ? QR_OK : QR_ENOMEM;
}

void qr_config_free(qr_config *cfg) {
    if (!cfg) return;
    for (int i = 0; i < NKEYS; i++) free(cfg->values[i]);
    free(cfg);
}

static int validate(int i, const char *value) {
    const key_spec *k = &keys[i];
    int64_t iv;
    double fv;
    switch (k->type) {
    case KEY_INT:
        if (qr__parse_int64(value, (int64_t)k->lo, (int64_t)k->hi, &iv))
            return qr__fail(QR_EINVAL, "option %s: %s", k->name, qr_last_error());
        return QR_OK;
    case KEY_FLOAT:
        if (qr__parse_float(value, &fv))
            return qr__fail(QR_EINVAL, "option %s: %s", k->name, qr_last_error());
        if (fv < k->lo || (k->lo_open && fv == k->lo) || fv > k->hi) {
            char range[96];
            if (k->lo < -1e299)
                snprintf(range, sizeof range, "must be <= %g", k->hi);
            else if (k->hi > 1e299)
                snprintf(range, sizeof range, "must be %s %g", k->lo_open ? ">" : ">=", k->lo);
            else
                snprintf(range, sizeof range, "must be %s %g and <= %g",
                         k->lo_open ? ">" : ">=", k->lo, k->hi);
            return qr__fail(QR_EINVAL, "option %s: %s is out of range: %s", k->name, value,
                            range);
        }
        return QR_OK;
    case KEY_BOOL:
        if (!qr__list_has("true|false|1|0|yes|no", '|', value))
            return qr__fail(QR_EINVAL, "option %s: '%s' is not true or false", k->name, value);
        return QR_OK;
    case KEY_ENUM:
        /* A list not provided (a program without the layer that owns it)
         * is left to that layer's reader of the option. */
        if (choices_of(i) && !qr__list_has(choices_of(i), '|', value))
            return qr__fail(QR_EINVAL, "option %s: '%s' is not one of %s", k->name, value,
                            choices_of(i));
        return QR_OK;
    case KEY_STRING:
        return QR_OK;
    }
    return QR_OK;
}

int qr_config_set(qr_config *cfg, const char *key, const char *value) {
    if (!cfg || !key || !value)
        return qr__fail(QR_EINVAL, "qr_config_set: cfg, key and value must not be NULL");
    int i = key_index(key);
    if (i < 0) return qr__fail(QR_EINVAL, "unknown option '%s'", key);
    int rc = validate(i, value);
    if (rc) return rc;
    char *copy = qr__strdup(value);
    if (!copy) return QR_ENOMEM;
    free(cfg->values[i]);
    cfg->values[i] = copy;
    return QR_OK;
}

const char *qr_config_get(const qr_config *cfg, const char *key) {
    int i = key_index(key);
    if (i < 0) return NULL;
    if (cfg && cfg->values[i]) return cfg->values[i];
    return default_of(i);
}

const char *qr__config_str(const qr_config *cfg, const char *key) {
    const char *v = qr_config_get(cfg, key);
    return v ? v : "";
}

bool qr__config_is_set(const qr_config *cfg, const char *key) {
    int i = key_index(key);
    return cfg && i >= 0 && cfg->values[i];
}

int64_t qr__config_int(const qr_config *cfg, const char *key) {
    return strtoll(qr__config_str(cfg, key), NULL, 10);
}

double qr__config_float(const qr_config *cfg, const char *key) {
    return strtod(qr__config_str(cfg, key), NULL);
}

bool qr__config_bool(const qr_config *cfg, const char *key) {
    const char *v = qr__config_str(cfg, key);
    return !strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "yes");
}

int qr__config_merge(qr_config *dst, const qr_config *src) {
    if (!src) return QR_OK;
    for (int i = 0; i < NKEYS; i++) {
        if (!src->values[i]) continue;
        int rc = qr_config_set(dst, keys[i].name, src->values[i]);
        if (rc) return rc;
    }
    return QR_OK;
}

bool qr__config_key_info(int i, qr__config_key *out) {
    if (i < 0 || i >= NKEYS) return false;
    const key_spec *k = &keys[i];
    *out = (qr__config_key){.name = k->name, .def = default_of(i), .help = k->help,
                            .choices = k->type == KEY_ENUM ? choices_of(i) : NULL,
                            .mode = k->mode, .is_bool = k->type == KEY_BOOL};
    return true;
}

const char *qr__config_misplaced_key(const qr_config *cfg, const char *mode) {
    for (int i = 0; cfg && i < NKEYS; i++)
        if (cfg->values[i] && keys[i].mode && strcmp(keys[i].mode, mode)) return keys[i].name;
    return NULL;
}

int qr__config_check_mode(const qr_config *cfg) {
    const char *mode = qr__config_str(cfg, "mode");
    const char *key = qr__config_misplaced_key(cfg, mode);
    if (!key) return QR_OK;
    return qr__fail(QR_EINVAL, "option %s applies to mode %s only, and mode is %s", key,
                    keys[key_index(key)].mode, mode);
}

int qr_replicas_check_config(const qr_config *cfg, int nps, int *copies) {
    int r = (int)qr__config_int(cfg, "ps-replicas");
    if (r > 1 && r > nps)
        return qr__fail(QR_EINVAL, "ps-replicas %d needs at least %d ps tasks (each copy of a "
                        "shard on a different ps), and there are %d", r, r, nps);
    int64_t lag = qr__config_int(cfg, "replication-lag");
    if (lag > 0 && r < 2)
        return qr__fail(QR_EINVAL, "replication-lag %lld bounds how far a shard's second copy "
                        "may lag behind: it needs --ps-replicas 2", (long long)lag);
    int64_t coordinator = qr__config_int(cfg, "coordinator");
    if (coordinator != 0 && (r < 2 || coordinator != 1 || nps < 2))
        return qr__fail(QR_EINVAL, "coordinator %lld: a cluster is coordinated by ps 0, or by "
                        "ps 1 once ps 0 has been failed over, which needs --ps-replicas 2",
                        (long long)coordinator);
    if (copies) *copies = r;
    return QR_OK;
}

int qr_sync_check_config(const qr_config *cfg, int nworkers, int *R, int *init_tokens) {
    int r = (int)qr__config_int(cfg, "replicas-to-aggregate");
    if (r == 0) r = nworkers;
    if (r < 1 || nworkers < 1)
        return qr__fail(QR_EINVAL, "sync: replicas-to-aggregate (%d) and the number of workers "
                        "(%d) must be >= 1", r, nworkers);
    /* N workers push N gradients, then wait for tokens: R - N more
     * gradients are needed to finish step 0, so R - N tokens at least. */
    int needed = QR_MAX(0, r - nworkers);
    int64_t tokens = qr__config_int(cfg, "init-tokens");
    int init = tokens < 0 ? needed : (int)tokens;
    if (init < needed)
        return qr__fail(QR_EINVAL, "too few tokens to finish the first step: %d (given) vs %d "
                        "(needed)", init, needed);
    if (R) *R = r;
    if (init_tokens) *init_tokens = init;
    return QR_OK;
}

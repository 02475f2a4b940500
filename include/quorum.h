/*
 * quorum.h - the one public header of libquorum, a parameter server for
 * distributed training.
 *
 * Anything not declared here is not API. The header is written to be bound
 * from other languages (Python ctypes first): handles are opaque pointers,
 * every argument is a plain C type or an array of them, no struct crosses
 * the API by value, and no callback is needed on the basic path.
 *
 * Conventions that hold for every call:
 *   - A call returns QR_OK (0) or a negative qr_status code. On failure it
 *     also records a readable message for the calling thread, which
 *     qr_last_error() returns until the thread's next failing call.
 *   - A function named *_free or *_destroy accepts NULL and does nothing.
 *   - Buffers passed in are borrowed for the duration of the call only;
 *     buffers handed out (qr_worker_var_data) stay owned by the handle.
 *   - Handles are not thread-safe unless a function says so: use one
 *     worker handle per thread (one program may hold several).
 *   - The library sets SIGPIPE to "ignore" when it opens its first
 *     connection, if the program left it at the default (which would
 *     kill the process when a peer goes away mid-write).
 */
#ifndef QUORUM_H
#define QUORUM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define QR_API __attribute__((visibility("default")))
#else
#define QR_API
#endif

/* ------------------------------------------------------------------------ */
/* Status codes. One table gives the enum, the names and the messages.      */
/* ------------------------------------------------------------------------ */

#define QR_STATUS_MAP(X)                                                    \
    X(OK, 0, "ok")                                                          \
    X(EINVAL, -1, "invalid argument")                                       \
    X(ENOMEM, -2, "out of memory")                                          \
    X(EIO, -3, "input/output error")                                        \
    X(EPROTO, -4, "protocol error")                                         \
    X(ENOTFOUND, -5, "not found")                                           \
    X(EEXIST, -6, "already exists")                                         \
    X(ESHAPE, -7, "shape mismatch")                                         \
    X(ETIMEDOUT, -8, "timed out")                                           \
    X(EPEERLOST, -9, "peer lost")                                           \
    X(ESTOPPED, -10, "stopped")                                             \
    X(ENOTREADY, -11, "variables not initialized")                          \
    X(ESTALE, -12, "dropped: stale")                                        \
    X(EABORTED, -13, "aborted")                                             \
    X(ENONFINITE, -14, "non-finite value")                                  \
    X(ETOOBIG, -15, "message too large")                                    \
    X(EINTERNAL, -16, "internal error")                                     \
    X(EROLLEDBACK, -17, "rolled back to a checkpoint")                      \
    X(EAUTH, -18, "authentication failed")                                  \
    X(ECHIEFLOST, -19, "the job ended without its chief")                   \
    X(EVIEW, -20, "old view: the shards moved")

typedef enum qr_status {
#define QR__STATUS_ENUM(name, code, msg) QR_##name = code,
    QR_STATUS_MAP(QR__STATUS_ENUM)
#undef QR__STATUS_ENUM
} qr_status;

/* Short fixed description of a status code ("shape mismatch"). */
QR_API const char *qr_strerror(int status);
/* Symbolic name of a status code ("QR_ESHAPE"). */
QR_API const char *qr_status_name(int status);
/* Detailed message of the calling thread's last failing call, never NULL. */
QR_API const char *qr_last_error(void);
/* Library version string, e.g. "0.1.0". */
QR_API const char *qr_version(void);

/* Log lines. By default the library writes them to stderr as
 * "2026-11-24T00:27:01.123Z [ps 0 pid 4242] warn: message", at the level
 * QUORUM_LOG names (error|warn|info|debug; default info). A program that
 * embeds it routes them itself with a callback: level, the task ("ps 0",
 * "worker 2", or "quorum") and the message, one line, no prefix. The
 * callback may be called from any thread the library runs (a ps loop, a
 * worker's calls, a checkpoint writer), one call per line; NULL restores
 * stderr. */
enum { QR_LOG_ERROR = 0, QR_LOG_WARN = 1, QR_LOG_INFO = 2, QR_LOG_DEBUG = 3 };
typedef void (*qr_log_fn)(int level, const char *task, const char *message, void *ctx);
QR_API int qr_set_log_callback(qr_log_fn fn, void *ctx);
/* Lines above this level are dropped (QR_LOG_ERROR..QR_LOG_DEBUG);
 * overrides QUORUM_LOG. */
QR_API int qr_set_log_level(int level);

/* ------------------------------------------------------------------------ */
/* Configuration: string keys and values, validated when set.              */
/* ------------------------------------------------------------------------ */

/*
 * A qr_config holds the options of a ps or a worker as key=value strings,
 * the same names the command line uses without the leading "--" and with
 * '-' or '_' alike ("lr", "optimizer", "transport", "timeout-ms", ...).
 * qr_config_set validates a known key's value at once and refuses unknown
 * keys, so a typo is an error, not a silently ignored option.
 * The full list of keys, with defaults, ranges and choices, is the one
 * table in src/common/config.c; `quorum ps --help` prints it, and README.md
 * ("Configuration") describes the main ones.
 *
 * qr_ps_create and qr_worker_create copy the options they are given, so a
 * config may be changed or freed as soon as they return.
 */
typedef struct qr_config qr_config;

/* A new config in *out with no key set (every key reads as its default).
 * Free it with qr_config_free. QR_EINVAL if out is NULL, QR_ENOMEM. */
QR_API int qr_config_new(qr_config **out);
/* Free cfg and every value it holds; NULL does nothing. */
QR_API void qr_config_free(qr_config *cfg);
/* Set key to value, replacing an earlier value. value is copied (the
 * caller keeps its strings). QR_EINVAL if an argument is NULL, the key is
 * unknown, or the value does not parse or is out of range (the message
 * names the key); QR_ENOMEM. On failure cfg is unchanged. */
QR_API int qr_config_set(qr_config *cfg, const char *key, const char *value);
/* Value of key: the one set, else the default ("" for a key that has none,
 * such as lr, whose default depends on the optimizer). NULL for an unknown
 * or NULL key. cfg may be NULL (defaults). The string belongs to cfg (or to
 * the library, for a default) and stays valid until key is set again or
 * cfg is freed. */
QR_API const char *qr_config_get(const qr_config *cfg, const char *key);

/* ------------------------------------------------------------------------ */
/* Cluster spec                                                            */
/* ------------------------------------------------------------------------ */

/*
 * A cluster is a list of ps addresses and a list of worker addresses, and
 * for the process that holds the spec, its own job ("ps" or "worker") and
 * task index. Worker 0 is the chief.
 * An address is "host:port" (TCP, or a Unix socket chosen automatically
 * when host is a loopback address) or "unix:/path/to/socket".
 */
typedef struct qr_cluster qr_cluster;

/* From the TensorFlow-style flags. ps_hosts and worker_hosts are
 * comma-separated address lists; job_name is "ps" or "worker". */
QR_API int qr_cluster_from_flags(qr_cluster **out, const char *ps_hosts,
                                 const char *worker_hosts,
                                 const char *job_name, int task_index);
/* From a TF_CONFIG JSON document:
 * {"cluster":{"ps":[...],"worker":[...]},"task":{"type":"worker","index":0}} */
QR_API int qr_cluster_from_json(qr_cluster **out, const char *tf_config);
/* From the TF_CONFIG environment variable; QR_ENOTFOUND if it is unset. */
QR_API int qr_cluster_from_env(qr_cluster **out);
QR_API void qr_cluster_free(qr_cluster *cluster);

QR_API int qr_cluster_num_ps(const qr_cluster *cluster);
QR_API int qr_cluster_num_workers(const qr_cluster *cluster);
/* Address of task `index` of job "ps" or "worker"; NULL if out of range. */
QR_API const char *qr_cluster_address(const qr_cluster *cluster,
                                      const char *job, int index);
/* This process's job ("ps" or "worker") and task index. */
QR_API const char *qr_cluster_job(const qr_cluster *cluster);
QR_API int qr_cluster_task_index(const qr_cluster *cluster);

/* ------------------------------------------------------------------------ */
/* Parameter-server task                                                   */
/* ------------------------------------------------------------------------ */

typedef struct qr_ps qr_ps;

/* Create the ps task that `cluster` names as this process (job "ps"), with
 * options from cfg (may be NULL). Binds its listening sockets at once. */
QR_API int qr_ps_create(qr_ps **out, const qr_cluster *cluster,
                        const qr_config *cfg);
/* Serve until a worker asks the ps to stop, qr_ps_stop is called, or a
 * fatal error. Returns QR_OK on a clean stop. */
QR_API int qr_ps_run(qr_ps *ps);
/* Ask a running ps to stop; safe to call from any thread or a signal
 * handler's deferred context. */
QR_API int qr_ps_stop(qr_ps *ps);
QR_API void qr_ps_free(qr_ps *ps);

/* ------------------------------------------------------------------------ */
/* Worker                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct qr_worker qr_worker;

/* Create worker `task_index` of `cluster` (the spec's own task if
 * task_index < 0). Connects lazily: ps tasks may start later. */
QR_API int qr_worker_create(qr_worker **out, const qr_cluster *cluster,
                            int task_index, const qr_config *cfg);
QR_API void qr_worker_free(qr_worker *w);

/*
 * Declare a dense float32 variable. Every worker must declare the same
 * variables in the same order; the declaration order fixes placement.
 * init is one of "zeros", "constant:C", "uniform:LO,HI", "normal:MEAN,STD",
 * "truncated_normal:MEAN,STD", "glorot_uniform"; seed makes it
 * reproducible. lr < 0 means "use the global learning rate".
 * The variable's id (0, 1, ...) is written to *var_id.
 */
QR_API int qr_worker_declare(qr_worker *w, const char *name, int ndim,
                             const int64_t *shape, const char *init,
                             uint64_t seed, float lr, int *var_id);

/* Like qr_worker_declare, with the variable's own optimizer options:
 * "key=value,..." of any optimizer option ("optimizer=adagrad,lr=0.05",
 * "beta1=0.8"). Naming an optimizer starts from its defaults; otherwise
 * the options override the ps's. Checked here and on the ps.
 * "partitions=N" splits the variable along dimension 0 into N shards on N
 * different ps tasks (the "partition-min-mb" option does so by size; see
 * qr_worker_var_placement); the worker still sees one tensor.
 * "trainable=false" (with no optimizer setting) declares a dense variable
 * no optimizer touches, a module's buffer (BatchNorm's running
 * statistics): in a push, its array is its new value, not a gradient.
 * Async: the ps assigns it at once (a QR_PUSH_DELTA push adds it). Sync:
 * at the step's apply, the mean of the values the step's members pushed
 * for it (not counting members that pushed none) is assigned; so one
 * worker pushing it sets it, every worker pushing it averages it. It has
 * no slots, no moving average, and counts in no staleness figure; sparse
 * rows of it are refused. */
QR_API int qr_worker_declare_opts(qr_worker *w, const char *name, int ndim,
                                  const int64_t *shape, const char *init,
                                  uint64_t seed, const char *options, int *var_id);

/* Like qr_worker_declare_opts, with the initial value given: n floats
 * (the product of shape), copied at once, row-major. A framework keeps its
 * own initialization this way (a torch module's parameters). Only the
 * chief's values are used; other workers' are checked for size only, as
 * their initializers are. options may be NULL or "". */
QR_API int qr_worker_declare_values(qr_worker *w, const char *name, int ndim,
                                    const int64_t *shape, const float *values, int64_t n,
                                    const char *options, int *var_id);

/* The chief creates and initializes every declared variable on the ps
 * tasks and marks the cluster ready; other workers wait (up to the
 * "init-timeout-ms" option) until it has, then check that their
 * declarations match what the chief created. */
QR_API int qr_worker_initialize(qr_worker *w);

/* Number of elements and the worker's local copy of a variable (valid
 * until qr_worker_free; filled by qr_worker_pull with dst == NULL). A
 * table has 0 elements and no copy (NULL). */
QR_API int64_t qr_worker_var_size(const qr_worker *w, int var_id);
QR_API float *qr_worker_var_data(qr_worker *w, int var_id);

/* Where a dense variable lives, after qr_worker_initialize: its number of
 * shards (1 unless partitioned), and for the first `cap` of them the ps
 * task (ps[k]) and the elements it holds, [offset[k], offset[k] +
 * count[k]) of the variable (row-major; shards split dimension 0 in
 * order). ps, offset and count may be NULL. A table returns 0: its rows
 * are spread over every ps by id. Negative: a qr_status. */
QR_API int qr_worker_var_placement(const qr_worker *w, int var_id, int cap, int *ps,
                                   int64_t *offset, int64_t *count);

/* Element types of a variable's arrays and of its wire (qr_worker_set_dtype). */
#define QR_FLOAT32 0
#define QR_BFLOAT16 1 /* bfloat16: the top 16 bits of a float32 */
#define QR_FLOAT16 2  /* IEEE 754 half */

/* Mixed precision. Variable var_id's gradients and values travel as
 * `wire` (QR_FLOAT32, QR_BFLOAT16 or QR_FLOAT16: the two last take half
 * the bytes of float32), and the caller's arrays of it, the grads of a
 * push and the dst of a pull or push-and-pull, hold `array` elements (the
 * pointers stay float *: cast them). array is QR_FLOAT32 (the worker converts to and from the wire,
 * rounding to nearest even) or the same as wire (a bf16 or fp16 model's
 * own tensors, sent as they are). The ps keeps the variable, and its
 * optimizer's slots, in float32 whatever the wire: it widens a gradient
 * before the NaN/Inf check and the apply, and narrows the values a pull
 * asks for. The worker's own copy (qr_worker_var_data, a dst of NULL)
 * stays float32. Dense variables only (a table's rows are float32); set
 * after declaring, before or between pushes; the default is float32 for
 * both. QR_EINVAL for another pair, QR_ENOTFOUND for an unknown id. */
QR_API int qr_worker_set_dtype(qr_worker *w, int var_id, int wire, int array);

/*
 * Pull n variables (all of them if n == 0 and ids == NULL). dst[i] receives
 * variable ids[i]; if dst is NULL, each lands in the worker's local copy,
 * and so does any variable whose dst[i] is NULL.
 * Requests to different ps tasks travel in parallel.
 */
QR_API int qr_worker_pull(qr_worker *w, int n, const int *ids, float **dst);

/* Like qr_worker_pull, but the exponential moving averages the ps keeps
 * with option moving-average-decay (TensorFlow's ExponentialMovingAverage
 * with num_updates = the global step). QR_ENOTFOUND for a variable without
 * one. */
QR_API int qr_worker_pull_averages(qr_worker *w, int n, const int *ids, float **dst);

/*
 * A dense variable's optimizer state on the ps tasks (torch's
 * Optimizer.state_dict and load_state_dict are made of these).
 *
 * qr_worker_slot_names writes the names of the variable's slots, as its
 * optimizer on the ps keeps them, into buf (cap bytes, NUL-terminated),
 * comma-separated: "m,v" (adam, adamw), "momentum" (momentum),
 * "accumulator" (adagrad), "rms,momentum" and ",mg" if centered
 * (rmsprop), "m,v,beta1_power,beta2_power" (adam_async), "accum,linear"
 * (ftrl); "" for SGD. QR_ETOOBIG if cap is too small.
 *
 * qr_worker_pull_slot reads slot `slot` into dst, n floats: the
 * variable's size for a per-element slot (a partitioned variable's parts
 * come from their ps tasks), 1 for a scalar one (beta1_power); any other
 * n is QR_ESHAPE.
 * qr_worker_set_slot writes src (n floats, all finite) into it, on every
 * ps holding a part. A slot NULL or "" names the variable's values
 * themselves: set_slot then replaces them as a push would (gradients
 * computed from the old values are one version stale). Every ps checks a
 * write before any is changed: QR_ENOTFOUND for a slot the optimizer does
 * not keep (the message lists the ones it does), QR_ESHAPE for a size
 * that is not the slot's, QR_ENONFINITE for a NaN or Inf; then nothing
 * has changed. An embedding table's slots are not reached (QR_EINVAL):
 * they are in the ps tasks' checkpoints. Slots may be read and written
 * at any time; a write lands between two applies.
 *
 * qr_worker_set_step makes `step` the step the cluster counts from: the
 * global step, and on every ps the steps applied there (Adam's and
 * AdamW's t for bias correction, the learning-rate schedule), as a
 * checkpoint's restore does. Only the chief (worker 0) may, and only on a
 * cluster that has applied no step yet (a new one, before its first push)
 * or is at `step` already (then it changes nothing); QR_EINVAL otherwise,
 * saying at which step the cluster is. So a run saved with torch.save
 * resumes in a new cluster: the variables declared with the saved values,
 * the slots written, the step set, before the first push. In sync mode
 * the step's tokens become of that step, and the chief's next push is of
 * it (another worker initialized before the call finds its first push
 * stale, and goes on with the next token).
 */
QR_API int qr_worker_slot_names(qr_worker *w, int var_id, char *buf, size_t cap);
QR_API int qr_worker_pull_slot(qr_worker *w, int var_id, const char *slot, float *dst,
                               int64_t n);
QR_API int qr_worker_set_slot(qr_worker *w, int var_id, const char *slot, const float *src,
                              int64_t n);
QR_API int qr_worker_set_step(qr_worker *w, int64_t step);

/*
 * Push gradients for n variables (grads[i] for ids[i], each of the
 * variable's size). The ps applies them with its optimizer as they arrive.
 * If flags has QR_PUSH_STEP, the global step is incremented by one with
 * the push. *global_step (may be NULL) receives the global step after it.
 */
#define QR_PUSH_STEP 1u
/* Async only: the arrays are deltas that the ps adds to its weights as they
 * are, with no optimizer (local SGD pushes w_local - w_pulled this way). */
#define QR_PUSH_DELTA 4u
/* Async only: the push reaches every ps, holding gradients for it or not.
 * With QR_PUSH_STEP and no gradients it is a step's tick: a step pushed
 * as several pushes without QR_PUSH_STEP (one per variable, as backprop
 * produces them) then counts once on every ps, so every apply of the step
 * used the same step number (Adam's t, the learning-rate schedule) and
 * the global step moves by one. */
#define QR_PUSH_EVERY_PS 16u
QR_API int qr_worker_push(qr_worker *w, int n, const int *ids,
                          const float *const *grads, unsigned flags,
                          int64_t *global_step);

/*
 * A push and a pull of the same n variables in one call: values[i] (or
 * the worker's copy where values or values[i] is NULL) receives ids[i]'s
 * values after the push. Async: in one round trip per ps (ps-lite's
 * ZPushPull): each ps answers the push, once applied, with the variables'
 * values as it left them (later pushes of other workers not yet in).
 * Sync: one round trip per ps too: each ps answers once the push's step
 * is done there, with the step's values, and ps 0 with the next token
 * (set as the local step, and in *global_step): the push, the token
 * barrier and the pull of qr_worker_push, qr_worker_take_token and
 * qr_worker_pull in one exchange (docs/SYNC.md, "One round trip"). The
 * push reaches ps 0 even when none of the variables is there. A stale
 * push still gets the token and the values, and returns QR_ESTALE.
 * flags as for qr_worker_push.
 */
QR_API int qr_worker_push_pull(qr_worker *w, int n, const int *ids,
                               const float *const *grads, float *const *values,
                               unsigned flags, int64_t *global_step);

/*
 * Non-blocking pushes and pulls (ps-lite's ZPush/ZPull and Wait): a
 * *_start call sends its requests and returns at once with a handle;
 * qr_request_wait waits for its replies, frees the handle and returns the
 * call's status (and a push's global step). Several may be in flight on
 * one worker, with blocking calls between them; each ps answers in the
 * order it was asked. The arrays (gradients, destinations) must stay
 * valid and unchanged until the wait; wait for every handle before
 * qr_worker_free. Replies are taken in while the worker waits (in any of
 * its calls), not in the background. Pushes: async mode only, but
 * qr_worker_push_pull_start, which is a sync step in sync mode (its wait
 * takes the token; use qr_worker_push otherwise), and no rows added with
 * qr_worker_add_rows pending (they go with a blocking push). values in
 * qr_worker_push_pull_start as in qr_worker_push_pull. Replies are
 * matched by id: a sync push-and-pull's come after its step, those of
 * requests made later may come before.
 */
typedef struct qr_request qr_request;
QR_API int qr_worker_push_start(qr_worker *w, int n, const int *ids, const float *const *grads,
                                unsigned flags, qr_request **request);
QR_API int qr_worker_push_pull_start(qr_worker *w, int n, const int *ids,
                                     const float *const *grads, float *const *values,
                                     unsigned flags, qr_request **request);
QR_API int qr_worker_pull_start(qr_worker *w, int n, const int *ids, float **dst,
                                qr_request **request);
/* global_step may be NULL (and is not set by a pull). */
QR_API int qr_request_wait(qr_request *request, int64_t *global_step);

/* ---- synchronous replicas (option mode=sync) ----
 * A worker's step: qr_worker_pull, compute, qr_worker_push (tagged with
 * the worker's local step; the flags are ignored), then
 * qr_worker_take_token, which blocks until ps 0 releases a token and sets
 * the local step from it. qr_worker_push returns QR_ESTALE, with the
 * message "dropped: stale: ...", when the gradient came too late to count;
 * the worker still takes a token and goes on. A token wait ends with
 * QR_ESTOPPED when training is over and QR_EABORTED (with the stall
 * report) when ps 0 gave up waiting for missing workers; every call ends
 * with QR_ECHIEFLOST once ps 0 has ended a run whose chief (worker 0) was
 * lost and not restarted within restart-wait-ms. */
QR_API int qr_worker_take_token(qr_worker *w, int64_t *step);
/* The step this worker computes for (sync), set by initialize and tokens. */
QR_API int qr_worker_local_step(const qr_worker *w, int64_t *step);
/* The chief, before qr_worker_initialize: the run's last global step, so
 * that the ps tasks stop by themselves when training is over even if the
 * chief is gone. */
QR_API int qr_worker_set_step_limit(qr_worker *w, int64_t last_step);
/* Where this worker is in its data stream (batches consumed, an offset:
 * any number the caller can resume from). It rides on every push, and a
 * checkpoint records each worker's position after its last push that the
 * checkpoint holds. After qr_worker_initialize, qr_worker_data_position
 * gives the position restored from the checkpoint the cluster resumed
 * from, or, for a worker restarted into a live cluster, the position after
 * its last push that counted (ps 0 keeps each worker's, with checkpoints
 * or without; 0 when the cluster started fresh), so the data stream goes
 * on where it was. */
QR_API int qr_worker_set_data_position(qr_worker *w, uint64_t position);
/* The learning rate the ps applies this variable's gradients with, from
 * this worker's next push on (a schedule driven by the worker, as torch's
 * lr_scheduler): every later push of it carries lr, which the ps uses as
 * it is, in place of the variable's own lr and the ps's lr-decay schedule
 * (staleness-lr-scale still divides it in async mode). lr < 0 returns to
 * the ps's own. Async: each push is applied with the lr it carries. Sync:
 * a variable's step uses the lr of its first gradient in the step's
 * member order (by worker, then seq), so every worker should set the
 * same (running the same schedule, they do). Dense variables (every
 * shard of a partitioned one), rows added to them, and embedding tables
 * alike; a delta push (QR_PUSH_DELTA) has none. QR_ENOTFOUND for an
 * unknown id, QR_EINVAL for a NaN or infinite lr. */
QR_API int qr_worker_set_lr(qr_worker *w, int var_id, float lr);
QR_API int qr_worker_data_position(const qr_worker *w, uint64_t *position);
/* The cluster's training statistics as one JSON object, written to buf:
 * "staleness", the histogram of async gradient staleness (a count per
 * variable of a push) summed over the ps tasks (buckets 0, 1, 2, 3, 4-7,
 * 8-15, 16-31, 32-63, 64+); "stale_pushes_applied", the async pushes with
 * a gradient of staleness 1 or more (a count per push, on each ps task it
 * reached), summed over the ps tasks;
 * "applied_on_arrival", the large SGD pushes applied while they arrived,
 * and "rebased_on_arrival", the pushes that overtook one (docs/ASYNC.md),
 * both summed over the ps tasks; "push_bytes" and "pull_bytes", the
 * payload bytes of the pushes received and the pulls answered, summed
 * over the ps tasks (half as many on a bf16 or fp16 wire:
 * qr_worker_set_dtype); "tables", per embedding table its rows,
 * bytes, admission_candidates, admission_filter_bytes, admitted,
 * unadmitted_reads, dropped_rows and evicted, summed over the ps tasks,
 * and under admission "admission_filter" ("exact" or "bloom"); and in sync
 * mode ps 0's figures: steps, stale_dropped, in_quorum and stale_by_worker
 * per worker, mean_wait_ms, max_wait_ms, tokens_queued. */
QR_API int qr_worker_stats(qr_worker *w, char *buf, size_t len);

/* ---- asynchronous training with bounded staleness (max-staleness k) ----
 * Call before each step: blocks while this worker is more than k steps
 * ahead of the slowest live worker (k = 0: bulk synchronous). Returns at
 * once when no bound is set. */
QR_API int qr_worker_wait_bound(qr_worker *w);

/* ---- sparse rows and embedding tables (docs/EMBEDDINGS.md) ----
 *
 * An embedding table maps an id (any int64) to a row of dim floats and
 * has no fixed size: a row is made on the ps the first time its id is
 * pulled, from the initializer spec (as for qr_worker_declare) seeded by
 * seed and the id alone, so a row starts the same wherever and whenever it
 * is made. Its ids are spread over every ps task by a hash of the id; the
 * optimizer (the ps's, or the table's own options) keeps its slots per row.
 * The options also take admission and eviction: "admit_after=K" (a row
 * at an id's K-th lookup; the lookups counted exactly, or with
 * "admit_filter=bloom,admit_filter_bytes=N,admit_filter_hashes=H" in a
 * counting Bloom filter of N bytes on each ps, whose ids may be admitted
 * early, never late) and "evict_after_steps=T" (docs/EMBEDDINGS.md).
 * Declare tables with the dense variables, before qr_worker_initialize.
 * A table has qr_worker_var_size 0 and no local copy. */
QR_API int qr_worker_declare_table(qr_worker *w, const char *name, int64_t dim,
                                   const char *init, uint64_t seed, const char *options,
                                   int *var_id);

/* The rows of n ids of a table into out (n x dim floats, row i for
 * ids[i]; ids may repeat). Each distinct id is asked for once, from the
 * ps that holds it, all ps at once. With QR_ROWS_READ_ONLY an id not in
 * the table reads as its initial value and is not added (evaluation). */
#define QR_ROWS_READ_ONLY 1u
QR_API int qr_worker_pull_rows(qr_worker *w, int var_id, int64_t n, const int64_t *ids,
                               float *out, unsigned flags);

/* Add sparse gradient rows to the next qr_worker_push: n ids (of a table)
 * or row indices (of a dense variable of shape (..., dim), viewed as
 * (rows, dim)) and n x dim values. They are copied at once, duplicates
 * summed; the next push sends them, split by ps, with its dense
 * gradients: in sync mode, one step of dense and sparse gradients alike.
 * Only the rows named, and their optimizer slots, change (TensorFlow's
 * sparse applies: lazy for Adam; AdamAsync as its apply_sparse_rmsprop
 * option says). A sync step reduces a variable's rows as option
 * sparse-reduction says (docs/SYNC.md). An index out of range or a NaN/Inf
 * value is refused here. */
QR_API int qr_worker_add_rows(qr_worker *w, int var_id, int64_t n, const int64_t *ids,
                              const float *rows);

/* qr_worker_add_rows then qr_worker_push of no dense gradient: one
 * variable's sparse gradient. flags as for qr_worker_push (QR_PUSH_DELTA
 * adds the rows as they are). */
QR_API int qr_worker_push_sparse(qr_worker *w, int var_id, int64_t nrows,
                                 const int64_t *indices, const float *rows, unsigned flags,
                                 int64_t *global_step);

/* Read the global step held by ps 0. */
QR_API int qr_worker_global_step(qr_worker *w, int64_t *global_step);

/* Ask every ps task to stop serving (the chief does this at the end of
 * training). Pending and later requests of other workers get QR_ESTOPPED. */
QR_API int qr_worker_stop_cluster(qr_worker *w);

/* Ask for a checkpoint now (the ps tasks must have --checkpoint-dir) and
 * wait until one taken after this call is written: *global_step (may be
 * NULL) is its step. Training goes on meanwhile (a checkpoint is a
 * consistent cut, as the periodic ones). QR_EIO if it could not be
 * written (the message says why). */
QR_API int qr_worker_checkpoint(qr_worker *w, int64_t *global_step);

/* This worker has finished its work (its data is done) and will not push
 * again: ps 0 stops counting on it. Call it before qr_worker_free when a
 * worker ends of its own accord; a worker that goes without it is taken
 * for lost and waited for (restart-wait-ms). ps 0 ends the run in order
 * (final checkpoint, then every ps stops) once every worker has finished,
 * or, in sync mode, once fewer than replicas-to-aggregate (at most N)
 * workers are still training and one of them pushes to a step that so
 * cannot complete: their calls then fail with QR_ESTOPPED and a message
 * saying so. A worker that connects again after leaving
 * counts as training again. QR_ESTOPPED if the cluster has stopped
 * already. */
QR_API int qr_worker_leave(qr_worker *w);

/* ------------------------------------------------------------------------ */
/* A program's own training loop: summaries, metrics, progress             */
/* ------------------------------------------------------------------------ */

/*
 * What quorum's trainer writes and serves, for a training loop of the
 * program's own (quorum.torch's optimizer does this): a monitor watches a
 * worker handle, and the program tells it of each step.
 *   - The summary service (the chief's, docs/SUMMARIES.md): a point every
 *     every_secs seconds and at qr_monitor_flush, into logdir's TensorBoard
 *     event file and summaries.jsonl: loss (a moving average, 0.95, of the
 *     losses reported), global_step/sec, examples/sec (the whole cluster's:
 *     a sync step counts replicas-to-aggregate of this worker's batches),
 *     stale_gradients, learning_rate (as reported), checkpoint_duration_s,
 *     and the program's own scalars (their latest values).
 *   - The worker's Prometheus page (docs/METRICS.md), the trainer's
 *     families: global step, loss, steps/s, examples/s, pushes, pulls and
 *     their times (counted by the worker handle), stale pushes, memory.
 * Every call is made on the thread that uses the worker handle; the page
 * is written on its server's thread from figures the calls leave under a
 * lock, never from the handle.
 */
typedef struct qr_monitor qr_monitor;

/* A monitor of w, which it borrows (free the monitor first), writing and
 * serving nothing until told to. */
QR_API int qr_monitor_create(qr_monitor **out, qr_worker *w);
/* Write summaries into logdir (made if need be), a point every every_secs
 * (> 0) seconds. Once per monitor. QR_EIO naming logdir if it cannot be
 * made or written. */
QR_API int qr_monitor_open_summaries(qr_monitor *m, const char *logdir, double every_secs);
/* Serve the metrics page at http://bind:port/metrics (bind: an IPv4
 * address; NULL or "": 127.0.0.1). Once per monitor. QR_EIO if the port
 * cannot be had. */
QR_API int qr_monitor_serve_metrics(qr_monitor *m, const char *bind, int port);
/* A step of this worker ended: the global step after it, the examples the
 * step consumed on this worker (>= 0; 0 if not known), its loss and the
 * learning rate it was applied with (NAN: not known). Writes a point if
 * one is due (asking the ps tasks for their statistics). */
QR_API int qr_monitor_step(qr_monitor *m, int64_t global_step, int64_t examples, double loss,
                           double lr);
/* A scalar of the program's own (tag: 1-128 printable characters, no
 * quote or backslash; at most 32 tags), written with the next point; tag
 * "loss" is a loss, as qr_monitor_step's. */
QR_API int qr_monitor_scalar(qr_monitor *m, const char *tag, double value);
/* The figures of a progress line: the last global step, the loss's moving
 * average (NAN: none yet), and the cluster's examples per second since the
 * first step (0: not known). Any pointer may be NULL. */
QR_API int qr_monitor_progress(const qr_monitor *m, int64_t *global_step, double *loss,
                               double *examples_per_sec);
/* A point now, the run's last (while the ps tasks still answer). */
QR_API int qr_monitor_flush(qr_monitor *m);
/* Stops the page's server and closes the summary files. */
QR_API void qr_monitor_free(qr_monitor *m);

#ifdef __cplusplus
}
#endif
#endif /* QUORUM_H */

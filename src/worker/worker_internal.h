/*
 * worker_internal.h - the state of a worker handle, shared by the files
 * that make up the worker side:
 *   client.c    a worker's life (create, free), dense pull and push, the
 *               fused push-and-pull, the sparse push
 *   declare.c   declare variables (dense, from values, tables), place
 *               them on the ps tasks, initialize the cluster with them
 *   control.c   the control calls: token and steps, staleness bound, data
 *               position, statistics, checkpoint, leave, stop the cluster,
 *               wait for the run's end
 *   inflight.c  non-blocking pushes and pulls: a handle, a wait
 *   rows.c      embedding tables and sparse rows: pull a batch's rows
 *               (deduplicated, split by shard, in parallel), rows added
 *               to the next push
 *   slots.c     a variable's optimizer slots read and written, the step
 *               set (torch's state_dict and load_state_dict)
 *   link.c      the request engine: connections to the ps tasks, requests
 *               in flight, retries, waits, and the loop that runs them
 *   heartbeat.c the thread that tells ps 0 the worker lives (its blocking
 *               socket is wire/blocking.h's)
 * worker.h is what the layers above read beyond the public API (the
 * figures of a metrics page, counted by client.c and inflight.c).
 * Everything but the heartbeat runs on the caller's thread, inside its
 * calls.
 *
 * The files call one another downwards only, never up or sideways within
 * a row, so they form no circle:
 *   inflight.c  declare.c       (initialize: the chief pulls, wk_pull_vars)
 *   client.c
 *   control.c   rows.c   slots.c (a sync push_pull takes the token; a push
 *                                carries the rows added)
 *   link.c      heartbeat.c
 * link.c calls no other worker file: the files above build requests and
 * hand them to it.
 */
#ifndef QR_WORKER_INTERNAL_H
#define QR_WORKER_INTERNAL_H

#include "cluster/cluster.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/idmap.h"
#include "wire/conn.h"
#include "wire/msg.h"
#include "wire/secret.h"
#include "worker/heartbeat.h"
#include "worker/worker.h"

#include <string.h>

/* Where a dense variable's elements live: one part (the whole variable on
 * one ps), or the shards of a partitioned variable, rows of dimension 0
 * split in order, each on a different ps, where it is a variable of its
 * own named NAME/part_K under the same id. */
typedef struct wk_part {
    int ps;
    int64_t offset;    /* first element */
    int64_t n;         /* elements */
    uint64_t version;  /* the ps's version of it at the last pull */
} wk_part;

typedef struct wk_var {
    char *name;
    char *init;
    char *options; /* its own optimizer options ("" if none) */
    int ndim;
    int64_t shape[QR_PROTO_MAX_NDIM];
    int64_t n;
    uint64_t seed;
    float lr;
    /* qr_worker_set_lr's: carried by every later push of it (QR_PUSH_LR);
     * QR_MSG_PUSH_LR_NONE: the ps's own */
    float push_lr;
    /* qr_worker_set_dtype's: the wire's element type and the caller's
     * arrays' (QR_FLOAT32 and so on; the worker's copy, data, is float32 always) */
    uint8_t wire_dt, array_dt;
    int want_parts;   /* its partitions=N option (0: by partition-min-mb) */
    int nparts;       /* dense: set at placement (1: not partitioned) */
    wk_part *parts;
    uint64_t version; /* a table's (the ps's version at the last lookup) */
    float *data; /* the worker's copy (NULL for a table) */
    bool table;  /* an embedding table: shape [dim], rows on every ps by id */
    bool given;  /* data holds the caller's initial values (declare_values) */
    struct wk_rows *added; /* rows added to the next push, or NULL */
} wk_var;

/* One slot of the id tables of qr_worker_pull_rows and qr_worker_add_rows.
 * The id sits in the slot itself, so a probe reads one slot and nothing
 * else (an idmap slot holds only a position, and the id is then read from
 * a second array). */
typedef struct wk_id_slot {
    int64_t id;
    uint32_t gen;      /* the call that filled it: other values mean empty */
    uint32_t at;       /* which distinct id it is */
} wk_id_slot;

/* Sparse rows added to the next push for one variable, summed by id, and
 * at push time split by the ps each id goes to. */
typedef struct wk_rows {
    wk_id_slot *table; /* id -> its place in ids and sum: at most half full */
    uint64_t table_cap;
    int table_shift;   /* 64 - log2(table_cap) */
    uint32_t gen;      /* the slots of this push's ids; other gens are empty */
    int64_t *ids;
    float *sum;        /* n x dim */
    uint64_t n, cap;
    /* the split: ids and rows of ps p at [start[p], start[p + 1]) */
    int64_t *split_ids;
    float *split_rows;
    uint64_t *start;   /* nps + 1 */
} wk_rows;


/* The scratch of qr_worker_pull_rows, kept between calls (it grows to the
 * largest batch and stays): the batch's distinct ids, each id's place
 * among them, and the distinct ids grouped by ps with their rows. */
typedef struct wk_lookup {
    /* Open addressing, linear probing; a call uses the first 2^k slots,
     * the fewest that keep its batch at most half full. Each call takes a
     * new gen, which empties every slot at once, instead of clearing the
     * whole table (128 KiB for a batch of 4096) on every call. */
    wk_id_slot *table;
    uint64_t cap_table;
    uint32_t gen;      /* the last call's (0: none yet) */
    int64_t *uniq;     /* distinct ids, first-seen order */
    uint32_t *pos;     /* [n]: which distinct id ids[i] is */
    uint32_t *slot;    /* [distinct]: its place in the grouped arrays (2+ ps) */
    int *shard;        /* [distinct]: its ps */
    int64_t *grouped;  /* distinct ids grouped by ps (2+ ps; 1 ps: uniq is) */
    float *rows;       /* their rows, in the same order */
    uint64_t cap_n, cap_u, cap_rows;
    uint64_t *start;   /* nps + 1: ps p's distinct ids at [start[p], start[p + 1]) */
    uint64_t *fill;    /* nps: placed so far of each ps's */
} wk_lookup;

typedef struct ps_link ps_link;

typedef struct wk_request {
    ps_link *link;
    uint8_t type;
    uint16_t flags;
    uint32_t id;
    qr_wbuf meta;
    qr_iov *payload;
    int npayload;
    /* PULL: where each variable's values (its part on this ps) go, and
     * in what element type (QR_FLOAT32...): a type other than the variable's
     * wire_dt is received into stage and converted once the reply is in */
    int nvars;
    int *var_ids;
    void **dst;
    uint8_t *dst_dt;
    wk_part **parts;
    /* a push's gradients converted to their wire type (float32 arrays
     * on a bf16/fp16 wire), and a reply's values received in wire form
     * where their destination's type differs (converted by link.c once
     * the reply is in); the zero bytes a half-width item is padded with,
     * or where a reply's padding goes (msg.h) */
    uint8_t *out_stage;
    uint8_t *in_stage;
    uint32_t pad;
    bool sent, done, internal;
    bool once;           /* not sent again after a lost connection (its caller does) */
    uint64_t created_ns; /* a push's stall: made to answered, resends included */
    int retries;
    int status;
    char errmsg[512];
    int64_t step;
    uint32_t held_flags; /* a held push's reply: QR_HELD_STALE */
    uint64_t rows;      /* LOOKUP, a SLOTS read: rows expected, of rows_dim floats, into dst[0] */
    int64_t rows_dim;
    uint32_t ready;
    uint64_t data_pos; /* READY: this worker's restored data position */
    bool want_meta; /* keep the reply's meta (STATS) */
    uint8_t *reply_meta;
    size_t reply_meta_len;
    struct wk_request *next; /* in the link's queue of sent requests */
} wk_request;

struct ps_link {
    qr_worker *w;
    int index;        /* the shard whose requests go on it (ps `index` at the start) */
    int target;       /* the ps serving that shard in the view (--ps-replicas 2: its
                       * backup once failed over, apply_view); index otherwise */
    uint64_t pushes_acked; /* pushes to this shard answered OK */
    qr_addr addr;
    qr_conn *conn;
    enum { LINK_DOWN, LINK_CONNECTING, LINK_HELLO, LINK_UP } state;
    int attempts;
    uint64_t retry_at_ns;
    wk_request *head, *tail; /* sent, awaiting reply (answered in order, but a
                              * held push's answer, which waits for its step) */
    wk_request *replying;    /* the request whose reply is coming in */
    char last_error[256];
    int refused;      /* the ps refused our HELLO: every request fails so */
    char refusal[512];
    uint64_t incarnation; /* of the ps, from its first HELLO answer (0: never) */
    uint64_t lost_ns;     /* when a connection that was up was lost (0: up, or never up) */
    uint64_t unreached_ns; /* when connecting first failed, never up yet (0: not failing) */
    bool refusal_reported; /* the lost ps's refusals were reported */
};

struct qr_worker {
    uv_loop_t loop;
    uv_timer_t wake;
    qr_cluster *cluster;
    qr_config *cfg;
    int index;
    bool prefer_unix;
    qr_conn_options conn_opt;
    qr_auth *auth;            /* the job's credentials (wire/auth.h), or NULL */
    qr_conn_events events;
    ps_link *links;
    int nps;
    wk_var *vars;
    int nvars, vars_cap;
    bool placed, initialized;
    uint32_t next_id;
    int timeout_ms;
    int sync_timeout_ms;
    bool sync;           /* mode=sync: synchronous replicas */
    int64_t local_step;  /* sync: the step this worker computes for */
    /* sync: the last COMMIT answered, until a token follows it: sent again
     * when the TOKEN's connection is lost (take_token) */
    qr_msg_commit last_commit;
    bool commit_unserved;
    uint32_t push_seq;   /* numbers this worker's pushes */
    int64_t step_limit;  /* the chief tells ps 0 at initialize */
    int64_t steps_pushed; /* async: successful step pushes (the clock) */
    int64_t max_staleness;
    uint64_t data_pos;   /* set by the caller, sent with every push */
    uint64_t restored_pos; /* from ps 0 at initialize (a restored checkpoint) */
    qr_heartbeat *heartbeat; /* started by initialize (heartbeat-ms) */
    int restart_wait_ms; /* how long a call waits for a lost ps to come back */
    int rolled_back;     /* QR_EROLLEDBACK or QR_EABORTED: a ps was restarted */
    char rollback_msg[512];
    bool stopping;       /* the run is ending: a lost ps is expected */
    int stop_status;     /* a ps's stop notice: QR_ESTOPPED or its abort's status */
    char stop_msg[512];
    wk_lookup lookup;    /* qr_worker_pull_rows's scratch */
    /* --ps-replicas 2 (link.c, apply_view): the view of where the shards
     * are (from ps 0), and the pushes resent after a lost connection */
    int replicas;
    uint64_t view;
    uint8_t *failed;     /* [nps] */
    bool view_wanted;    /* a ps refused a HELLO of an old view: ask ps 0 */
    bool limit_wanted;   /* the coordinator moved: tell the new one the step limit */
    wk_request *view_req; /* that VIEW request, in flight */
    uint64_t pushes_resent, max_push_ns;
    qr_worker_calls calls; /* for a metrics page (worker.h) */
};

/* link.c: requests. One request goes to one ps; wk_run_requests sends
 * a batch at once (connecting as needed) and waits for every reply,
 * returning the first failure with its message. */
wk_request *wk_request_new(qr_worker *w, int ps, uint8_t type);
void wk_request_free(wk_request *r);
void wk_free_requests(wk_request **reqs, int n);
int wk_run_requests(qr_worker *w, wk_request **reqs, int n, int timeout_ms);
/* client.c: COMMIT w->last_commit to the coordinator (sync, the three-
 * round-trip step); *step: its answer (NULL: not wanted). */
int wk_commit(qr_worker *w, int64_t *step);
/* Send what of reqs can go now, without waiting for anything (a request
 * whose ps is not connected yet goes in wk_run_requests). */
void wk_send_requests(qr_worker *w, wk_request **reqs, int n);
/* Turn the loop for up to ms without a request of its own, taking in what
 * the ps tasks send unasked; returns early once a stop notice (or a
 * rollback) has come. */
void wk_idle(qr_worker *w, int ms);
/* The worker's loop and its connections' events (create), and their end
 * (free: every connection closed, the loop run out and closed). */
void wk_links_init(qr_worker *w);
void wk_links_close(qr_worker *w);
/* --ps-replicas 2: what the worker saw of failovers, logged as it ends. */
void wk_links_report(const qr_worker *w);
/* A wait that lasts is said this often (link.c's calls, declare.c's wait
 * for the cluster to be ready). */
#define WK_WAIT_REPORT_NS (5000ull * 1000000ull)

/* The checks a call makes before it builds requests (client.c, rows.c,
 * inflight.c): it may go on, the worker is initialized and the ids name
 * declared variables. */
static inline int wk_check_ids(qr_worker *w, const char *what, int n, const int *ids) {
    if (!w) return qr__fail(QR_EINVAL, "%s: worker is NULL", what);
    if (!w->initialized)
        return qr__fail(QR_ENOTREADY, "%s: call qr_worker_initialize first", what);
    if (n < 0 || (n > 0 && !ids)) return qr__fail(QR_EINVAL, "%s: bad id list", what);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= w->nvars)
            return qr__fail(QR_ENOTFOUND, "%s: no variable with id %d (%d declared)", what,
                            ids[i], w->nvars);
    return QR_OK;
}

/* ... and they are dense variables, not tables (whose rows go by id). */
static inline int wk_check_dense(const qr_worker *w, const char *what, int n, const int *ids) {
    for (int i = 0; i < n; i++)
        if (w->vars[ids[i]].table)
            return qr__fail(QR_EINVAL, "%s: '%s' is an embedding table: use %s", what,
                            w->vars[ids[i]].name,
                            strcmp(what, "push") ? "qr_worker_pull_rows" : "qr_worker_add_rows");
    return QR_OK;
}

/* client.c: the requests of one pull or push, one per ps reached. */
typedef struct wk_call {
    wk_request **reqs;
    int n;
    wk_request *step_req; /* the push to ps 0 (its reply has the global step) */
    bool counts_step;     /* an async step push: counted once answered */
    uint32_t seq;         /* a push's sequence number */
    bool held;            /* a sync push-and-pull in one round trip: each ps
                           * answers after the step, ps 0 with the token */
    int64_t local_step;   /* the step a sync push was computed for */
} wk_call;
int wk_pull_build(qr_worker *w, int n, const int *ids, float **dst, uint16_t flags, wk_call *c);
/* Pull and wait: ids already checked; n == 0 pulls every variable. */
int wk_pull_vars(qr_worker *w, int n, const int *ids, float **dst, uint16_t flags);
/* values: a fused push-and-pull's destinations (NULL entries: the
 * worker's copies), or NULL. Rows added since the last push go too. */
int wk_push_build(qr_worker *w, int n, const int *ids, const float *const *grads,
                  unsigned flags, float *const *values, wk_call *c);
/* A push's requests ran, with rc: the call's status (a held push's
 * QR_ESTALE), the global step (a held push's: its token's, which becomes
 * the worker's local step). */
int wk_push_done(qr_worker *w, const wk_call *c, int rc, int64_t *global_step);
/* How long a call's requests may wait: a held push waits for its step. */
int wk_call_timeout_ms(const qr_worker *w, const wk_call *c);
/* A dense push or pull ended (rc): its time into the handle's figures. */
void wk_count_call(qr_worker *w, bool is_push, int rc, double seconds);
void wk_call_free(wk_call *c);

/* The part of dense variable v that ps p holds, or NULL. */
static inline wk_part *wk_part_on(const wk_var *v, int p) {
    for (int k = 0; k < v->nparts; k++)
        if (v->parts[k].ps == p) return &v->parts[k];
    return NULL;
}

/* rows.c: rows added to the next push, per variable. */
#define QR_WORKER_MAX_TABLE_DIM 65536
#define QR_WORKER_MAX_ROWS (1 << 24)
void wk_rows_free(qr_worker *w);
/* At the start of a push: split the added rows by ps. */
int wk_rows_prepare(qr_worker *w);
/* How many items of rows the push to ps p carries (0: none). */
int wk_rows_items(const qr_worker *w, int p);
/* Their meta records and payload (two iovs each) into r; with_lr: each
 * record followed by its variable's push_lr (QR_PUSH_LR). */
void wk_rows_put(qr_worker *w, int p, wk_request *r, bool with_lr);
/* Some variable with rows added has a push_lr set. */
bool wk_rows_with_lr(const qr_worker *w);
/* The push went (or failed): the added rows are used up. */
void wk_rows_clear(qr_worker *w);
/* Rows added and not pushed yet? */
bool wk_rows_pending(const qr_worker *w);

#endif /* QR_WORKER_INTERNAL_H */

/*
 * msg.h - the meta records of every request and reply: the one place
 * that writes them (qr_msg_put_*) and reads them (qr_msg_get_*), for the
 * worker and the ps alike. A change of a layout is a change of this file
 * and msg.c only; the table below is the layout these functions write.
 *
 * All fields little-endian, no padding. u32 count prefixes a list.
 *   HELLO      req: u32 role (1 = worker, 2 = ps 0's coordinator link,
 *                   3 = ps k's link to its backup: task_index is k),
 *                   u32 task_index, u32 mode (0 = async, 1 = sync);
 *                   from the coordinator and a replica link 24 bytes
 *                   more: u64 incarnation (of the sender), i64
 *                   restored_step (its checkpoint; -1 none),
 *                   u64 cause (the incarnation of the restarted ps whose
 *                   HELLO answer made this run of ps 0 roll back; 0: none;
 *                   on a replica link: 0 for the sender's own shard, else
 *                   the shard + 1 of the promoted copy it carries to that
 *                   shard's replacement, src/ps/rerep.c)
 *                   role 4, a worker of --ps-replicas 2: as role 1, then
 *                   u64 view (the one it knows), u32 shard (the one it
 *                   wants served on this connection) (qr_msg_hello's
 *                   with_view; read back as role 1)
 *              reply (qr_msg_welcome): u64 incarnation (new at every start
 *                   and every rollback of the ps), i64 restored_step (-1:
 *                   none), u64 follows (the coordinator incarnation whose
 *                   rollback made this one; 0: none), u32 flags (1: it
 *                   writes checkpoints, so a restart can be rolled back to);
 *                   to a coordinator's link in sync mode with --ps-replicas
 *                   2, then i64 the step its own shard is at, u32 count
 *                   and that many members (u32 worker, u32 seq) of the
 *                   step before (what a coordinator's successor may lack)
 *   CREATE     req: u32 count, then per variable (qr_msg_create_var):
 *                   u32 var_id, u32 ndim, i64 shape[ndim], f32 lr,
 *                   u32 name_len, name bytes, u32 options_len, options
 *                   bytes (the variable's optimizer options, may be empty),
 *                   u32 kind (0 dense, 1 embedding table), u32 init_len,
 *                   init bytes, u64 seed (a table's row initializer and
 *                   seed: its rows are made on the ps; empty and 0 for a
 *                   dense variable). A table has ndim 1, shape [dim], and
 *                   goes to every ps, each holding the ids placed on it.
 *              payload: each dense variable's initial values, in order
 *              flags: QR_CREATE_CHECK_ONLY = do not create, only check
 *                     that the same variables exist (non-chief workers)
 *   READY      req: u32 set (1 = mark the cluster ready, 0 = query),
 *                   i64 step_limit (the run's last global step; 0 = unknown),
 *                   u64 0
 *              reply: u32 ready, i64 global_step, u64 data_position (the
 *                   asking worker's, from the checkpoint restored; 0 if none)
 *   PUSH       req: u32 count, i64 local_step, u32 worker, u32 seq,
 *                   u32 nparts (how many ps this push call went to: the
 *                   checkpoint cut of async runs), u64 data_position (the worker's, after this push's
 *                   batches) (qr_msg_push_head), then per item a qr_msg_var:
 *                   u32 var_id, u32 kind, u64 nbytes,
 *                   u64 version (of the variable the gradient was computed at)
 *              kind 0, dense: the gradient, the variable's size in floats
 *              kind 1, sparse rows of a (rows, dim) variable, dim its last
 *                   dimension, or of a table: K i64 row indices (ids),
 *                   then K x dim floats (nbytes = K * (8 + 4 dim))
 *              a dense item's kind may carry a dtype in bits 8..15
 *                   (qr_msg_kind; QR_FLOAT32... of quorum.h): 1 bf16, 2 fp16,
 *                   n elements of 2 bytes, nbytes = 2n rounded up to a
 *                   multiple of 4 (the 2 bytes of padding are zero, and
 *                   ignored), so that every item still starts at a
 *                   multiple of 4. dtype 0, float32, is the plain kind 0:
 *                   a float32 message is byte for byte what it was.
 *                   The ps widens such a gradient to float32 before it
 *                   checks and applies it.
 *              with QR_PUSH_LR, each item's record is followed by
 *                   f32 lr (qr_msg_put_push_lr): the learning rate to
 *                   apply its gradient with, as is (no lr-decay), or -1
 *                   for the ps's own; without the flag no item has one
 *                   (the records are as above, byte for byte)
 *              payload: the gradients, in order
 *              flags: QR_PUSH_STEP (async: advance the global step),
 *                     QR_PUSH_DELTA (async: add to the weights, no optimizer),
 *                     QR_PUSH_SYNC (hold for the step's quorum),
 *                     QR_PUSH_REPLY_VALUES (the values come back; with
 *                       QR_PUSH_SYNC a held push, below),
 *                     QR_PUSH_LR (the items carry their learning rates)
 *              reply: i64 global_step (async) or the ps's step (sync);
 *                     status QR_ESTALE if the gradient is stale
 *              a held push (QR_PUSH_SYNC | QR_PUSH_REPLY_VALUES) goes to
 *                     ps 0 always (it is the COMMIT too; nparts counts
 *                     every ps it went to, ps 0 included). Each ps k
 *                     tells ps 0 it holds it (HELD) and answers once the
 *                     push's step is done there (at once when it is
 *                     stale there); ps 0 counts it once every ps has
 *                     said so and answers when the worker's token is
 *                     granted. reply (qr_msg_held_reply): i64 step (ps
 *                     0: the token's; ps k: its step), u32 flags
 *                     (QR_HELD_STALE: ps 0 dropped the gradient as
 *                     stale), then a PULL reply's count, records and
 *                     values of the push's dense variables
 *   PULL       req: u32 count, then u32 var_id each; with
 *                   QR_PULL_DTYPES each var_id is followed by u32 dtype
 *                   (qr_msg_put_dtype): the type its values come back in
 *              flags: QR_PULL_AVERAGES = the moving averages instead,
 *                     QR_PULL_DTYPES = the ids carry their dtypes
 *              reply: u32 count, then per item a qr_msg_var (kind 0 with
 *                     the item's dtype, as a push's dense item; padded
 *                     the same way); payload: the values, converted from
 *                     the ps's float32 for a bf16 or fp16 item. A fused
 *                     push-and-pull's values come back in the dtype of
 *                     the item's gradient.
 *   LOOKUP     req: u32 var_id (a table), u32 0, u64 count; payload: count
 *                   i64 ids, distinct, each placed on this ps
 *              flags: QR_LOOKUP_READ_ONLY = an absent id reads as its
 *                     initial value and is not added (evaluation)
 *              reply: u64 count; payload: count x dim floats, the rows in
 *                     the order of the ids
 *   STEP       req: (empty)   reply: i64 global_step
 *   STOP       req: (empty)   reply: (empty)
 *              from ps 0 to another ps: the frame's status says how the
 *              run ended (0, or the abort's status) and the meta, text of
 *              up to 1023 bytes, why
 *   COMMIT     (to ps 0) req: u32 worker, u32 seq, i64 local_step,
 *              u64 data_position: the push (worker, seq) reached every ps;
 *              count it for the step.
 *              reply: i64 global_step; status QR_ESTALE if it is too late
 *   TOKEN      (to ps 0) req: u32 worker. The reply, sent when a token is
 *              free: i64 the token's step
 *   HELD       (ps k to ps 0, on ps 0's link, unasked: no reply) u32 worker,
 *              u32 seq, i64 local_step, i32 status (QR_OK: held for its
 *              step; QR_ESTALE: stale here; another: refused), then the
 *              refusal's message: what ps k did with a held push
 *   RELEASE    (ps 0 to ps k, no reply) u32 worker, u32 seq: answer that
 *              held push now, with the values as they are (ps 0 answered
 *              it before its step was done: an earlier step's token, or a
 *              refusal)
 *   APPLY      (ps 0 to ps k) req: i64 step, u32 count, then u32 worker,
 *              u32 seq per member: reduce these pushes and apply the step
 *   STATS      reply: meta = JSON text of the ps's statistics
 *   REPLICATE  (ps k to its backup ps (k+1) mod P, on the replica link;
 *              src/ps/replica.c) req (qr_msg_repl_head): u32 flags (the
 *              push's QR_PUSH_STEP | QR_PUSH_DELTA), u32 worker, u32 seq
 *              (the push's name), u32 count, i64 t (the apply's step:
 *              Adam's t, the sparse lr schedule's), i64 answer (the step
 *              the primary answers the push with), u64 fwd (this
 *              forward's number on the link, from 1: a resent one is
 *              applied once), u64 data_pos (the worker's data position
 *              the push carried); then count items (qr_msg_repl_item): u32
 *              var_id (of the backed-up shard), u32 kind (0 dense
 *              float32 gradient, delta or value; 1 sparse rows as a
 *              PUSH's; 2 ids a LOOKUP sighted, count 1, t 0), u64
 *              nbytes, f32 lr (the learning rate the primary applied
 *              it with, staleness scaling and lr decay included)
 *              payload: the items' bytes, in order
 *              Sync mode (src/ps/sync.c): a push kept for its step
 *              (flags QR_REPL_SYNC_PUSH; t its local step; items as
 *              above, lr the push's own or QR_MSG_PUSH_LR_NONE), and a
 *              step applied (QR_REPL_SYNC_STEP; t the step; one item of
 *              kind 3, var_id 0, lr 0, whose bytes are the members: u32
 *              worker, u32 seq each, in reduce order); and the
 *              coordinator's word that a worker has finished (LEAVE:
 *              QR_REPL_LEAVE, the worker, no item), kept with the copy
 *              for a successor of ps 0
 *              reply: u64 fwd, once the backup has applied it
 *   CKPT       (ps 0 to ps k, checkpoints; src/ps/ckpt_coord.c) req: u32 phase,
 *              u64 id, i64 global_step, u32 count, u64 base (the id of the
 *              checkpoint this one is an increment of; 0: a full one),
 *              then count cut records
 *              (u32 include, u32 seq: worker i's pushes up to seq belong to
 *              the checkpoint) for phase CUT, none otherwise. Phases:
 *              SNAPSHOT (sync): take the shard now, at global_step;
 *              HOLD, QUERY (async): park whole pushes instead of applying
 *              them, and report; CUT (async): apply the parked pushes the
 *              cut includes, take the shard, apply the rest, go on;
 *              RELEASE (async): the cut is given up, apply what is parked.
 *              reply of HOLD and QUERY: u32 count, then count marks
 *              (u32 worker, u32 flags: 1 applied, 2 connected, 4 parked;
 *              u32 seq, u32 nparts, u64 data_position): per worker its
 *              last applied push, then every parked push.
 *              reply of SNAPSHOT and CUT, once the shard is durable: u64
 *              bytes, u32 crc32, u32 variables. RELEASE: empty.
 *   BEAT       (to ps 0, a worker's heartbeat thread) req: u32 worker.
 *              No reply: the sender only writes (src/worker/heartbeat.c).
 *              From ps 0 on its link to ps k (u32 0): answered with an
 *              empty reply, so that ps 0 hears a live ps (src/ps/links.c).
 *   CLOCK      (to ps 0, async with max-staleness k) req: u32 worker,
 *              i64 clock (steps the worker has pushed). The reply, sent
 *              when clock - (fewest steps of any live worker) <= k:
 *              i64 that fewest
 *   SLOTS      (src/ps/slots.c) req (qr_msg_slots): u32 op, u32 var_id,
 *              i64 step, u64 count, u32 name_len, name bytes (a slot of
 *              the variable's optimizer; "" names the variable's values).
 *              NAMES: reply u32 count, then per slot u32 name_len, name
 *              bytes, u64 elements (the variable's part here for a
 *              per-element slot, 1 for a scalar one).
 *              READ: reply u64 count; payload: the count floats of the
 *              slot here (count must be its size).
 *              WRITE: payload: count floats, the slot's new values here.
 *              STEP (only from worker 0): the steps applied here (Adam's
 *              t, the lr schedule) and on ps 0 the global step become
 *              `step`; refused unless the ps has applied nothing and
 *              holds no pushes, or is at that step already.
 *              reply of WRITE, STEP: i64 the global step (ps 0) or the
 *              steps applied (ps k).
 *              flags: QR_SLOTS_CHECK_ONLY (WRITE, STEP): checked in full,
 *              nothing changed (no payload)
 *
 * A qr_msg_get_* never reads past the meta: a short record sets r->bad
 * and yields zeros (qr_rbuf), so a decoder checks r->bad once at the end.
 * Writers never fail: an allocation failure sets the qr_wbuf's oom.
 */
#ifndef QR_WIRE_MSG_H
#define QR_WIRE_MSG_H

#include "wire/proto.h"

/* Sizes of the fixed-size requests' meta, checked by the ps before it
 * reads them. */
#define QR_MSG_HELLO_LEN 12
#define QR_MSG_HELLO_COORD_LEN 36
#define QR_MSG_HELLO_VIEW_LEN 24
#define QR_MSG_WELCOME_LEN 28
#define QR_MSG_READY_LEN 20
#define QR_MSG_COMMIT_LEN 24
#define QR_MSG_TOKEN_LEN 4
#define QR_MSG_BEAT_LEN 4
#define QR_MSG_CLOCK_LEN 12
#define QR_MSG_PUSH_HEAD_LEN 32
#define QR_MSG_VAR_LEN 24
#define QR_MSG_SLOTS_LEN 28 /* without the name */
#define QR_MSG_REPL_HEAD_LEN 40
#define QR_MSG_REPL_ITEM_LEN 20

/* A list's length: PULL, its reply, CREATE. */
void qr_msg_put_count(qr_wbuf *b, uint32_t count);
uint32_t qr_msg_get_count(qr_rbuf *r);

/* A step (i64): the reply of PUSH, STEP, COMMIT, TOKEN and CLOCK. */
void qr_msg_put_step(qr_wbuf *b, int64_t step);
int64_t qr_msg_get_step(qr_rbuf *r);

typedef struct qr_msg_hello {
    uint32_t role;       /* QR_ROLE_WORKER or QR_ROLE_COORDINATOR */
    uint32_t task_index; /* the worker's index (0 from the coordinator) */
    uint32_t mode;       /* 0 async, 1 sync */
    /* The coordinator's only (role QR_ROLE_COORDINATOR): */
    uint64_t incarnation;
    int64_t restored_step;
    uint64_t cause; /* the restarted ps run that made this ps 0 roll back (0: none) */
    /* A worker of --ps-replicas 2 (written as role QR_ROLE_WORKER_VIEW): */
    bool with_view;
    uint64_t view;  /* the view it knows */
    uint32_t shard; /* the shard it wants served on this connection */
} qr_msg_hello;
void qr_msg_put_hello(qr_wbuf *b, const qr_msg_hello *m);
/* The length of a HELLO's meta, read from its first field (the role). */
uint32_t qr_msg_hello_len(const uint8_t *meta, uint32_t meta_len);
void qr_msg_get_hello(qr_rbuf *r, qr_msg_hello *m);

/* VIEW (--ps-replicas 2, src/ps/failover.c): where the shards are.
 * u64 view (0 at the start, one more at each failover or step of a
 * re-replication), u32 nps, then per ps a u32 state: 0 it serves its
 * shard; 1 it has failed (its shard is served by its backup, ps (k+1)
 * mod P); 2 a replacement being copied the shards it backs up; 3 a
 * replacement that holds them (its shard still served by ps (k+1) mod
 * P). A state above 3 is refused (r->bad). ps 0 sends it to every ps on
 * its links and to every worker unasked (QR_VIEW_NOTICE_ID); a worker
 * asks for it with an empty VIEW request. A source of a re-replication
 * answers the VIEW that started it only once the copy is made, with
 * u32 replacement, u32 which (1 its own shard, 2 its neighbour's). */
void qr_msg_put_view(qr_wbuf *b, uint64_t view, int nps, const uint8_t *failed);
/* Reads the view into *view and failed[0..nps) (the caller's array of
 * nps); r->bad if the record is short or names another number of ps. */
void qr_msg_get_view(qr_rbuf *r, int nps, uint64_t *view, uint8_t *failed);

/* SNAPSHOT (src/ps/rerep.c), on a replica link, the first forward to a
 * replacement: meta u64 fwd (its forward number), u32 shard, i64 steps
 * (the shard's Adam t), u64 pushes applied, u32 nworkers, then the
 * per-worker duplicate records as the ps lays them out (repl_last: both
 * ends run the same build); payload: the shard as a checkpoint shard
 * file (ckpt_shard.c). Reply: u64 fwd. Read and written in rerep.c. */
/* REPLICATE (src/ps/replica.c). */
#define QR_REPL_DENSE 0u
#define QR_REPL_SPARSE 1u
#define QR_REPL_LOOKUP 2u
#define QR_REPL_MEMBERS 3u
/* REPLICATE flags beside the push's QR_PUSH_STEP | QR_PUSH_DELTA: a sync
 * push the primary kept, and a sync step it applied (its members). */
#define QR_REPL_SYNC_PUSH 0x10000u
#define QR_REPL_SYNC_STEP 0x20000u
#define QR_REPL_LEAVE 0x40000u
typedef struct qr_msg_repl_head {
    uint32_t flags, worker, seq, count;
    int64_t t, answer;
    uint64_t fwd;
    uint64_t data_pos; /* the worker's data position its push carried (0: none) */
} qr_msg_repl_head;
typedef struct qr_msg_repl_item {
    uint32_t id, kind;
    uint64_t nbytes;
    float lr;
} qr_msg_repl_item;
void qr_msg_put_repl_head(qr_wbuf *b, const qr_msg_repl_head *m);
void qr_msg_get_repl_head(qr_rbuf *r, qr_msg_repl_head *m);
void qr_msg_put_repl_item(qr_wbuf *b, const qr_msg_repl_item *m);
void qr_msg_get_repl_item(qr_rbuf *r, qr_msg_repl_item *m);

/* HELLO's reply: which run of the ps answered (docs/CHECKPOINTS.md,
 * "Rollback"). */
#define QR_WELCOME_CHECKPOINTS 1u
typedef struct qr_msg_welcome {
    uint64_t incarnation;
    int64_t restored_step;
    uint64_t follows;
    uint32_t flags;
} qr_msg_welcome;
void qr_msg_put_welcome(qr_wbuf *b, const qr_msg_welcome *m);
void qr_msg_get_welcome(qr_rbuf *r, qr_msg_welcome *m);

typedef struct qr_msg_ready {
    uint32_t set;       /* request: 1 marks the cluster ready; reply: ready */
    int64_t step;       /* request: the step limit; reply: the global step */
    uint64_t data_pos;  /* reply: the worker's restored data position */
} qr_msg_ready;
void qr_msg_put_ready(qr_wbuf *b, const qr_msg_ready *m);
void qr_msg_get_ready(qr_rbuf *r, qr_msg_ready *m);

typedef struct qr_msg_push_head {
    uint32_t count;     /* qr_msg_var records that follow */
    int64_t local_step;
    uint32_t worker, seq;
    uint32_t nparts;    /* ps tasks this push call went to */
    uint64_t data_pos;  /* the worker's data position after this push */
} qr_msg_push_head;
void qr_msg_put_push_head(qr_wbuf *b, const qr_msg_push_head *m);
void qr_msg_get_push_head(qr_rbuf *r, qr_msg_push_head *m);

/* One variable's part of a PUSH request or a PULL reply's payload. */
typedef struct qr_msg_var {
    uint32_t id;
    uint32_t kind;      /* QR_GRAD_DENSE or QR_GRAD_SPARSE */
    uint64_t nbytes;    /* of the payload */
    uint64_t version;
} qr_msg_var;
void qr_msg_put_var(qr_wbuf *b, const qr_msg_var *m);
void qr_msg_get_var(qr_rbuf *r, qr_msg_var *m);

/* PUSH with QR_PUSH_LR: an item's learning rate, right after its
 * qr_msg_var record; QR_MSG_PUSH_LR_NONE: the ps's own. */
#define QR_MSG_PUSH_LR_LEN 4
#define QR_MSG_PUSH_LR_NONE (-1.0f)
void qr_msg_put_push_lr(qr_wbuf *b, float lr);
float qr_msg_get_push_lr(qr_rbuf *r);

/* A PULL request's variable id. */
void qr_msg_put_id(qr_wbuf *b, uint32_t id);
uint32_t qr_msg_get_id(qr_rbuf *r);
/* With QR_PULL_DTYPES, the dtype after each id. */
void qr_msg_put_dtype(qr_wbuf *b, uint32_t dtype);
uint32_t qr_msg_get_dtype(qr_rbuf *r);

/* An item record's kind: a QR_GRAD_* and the dtype of its elements. */
static inline uint32_t qr_msg_kind(uint32_t grad_kind, uint32_t dtype) {
    return grad_kind | dtype << QR_GRAD_DTYPE_SHIFT;
}
static inline uint32_t qr_msg_kind_grad(uint32_t kind) {
    return kind & QR_GRAD_KIND_MASK;
}
static inline uint32_t qr_msg_kind_dtype(uint32_t kind) {
    return kind >> QR_GRAD_DTYPE_SHIFT;
}

/* One variable of a CREATE request. name and options are not
 * NUL-terminated: on reading they point into the meta. */
typedef struct qr_msg_create_var {
    uint32_t id;
    uint32_t ndim;
    int64_t shape[QR_PROTO_MAX_NDIM];
    float lr;
    uint32_t name_len;
    const char *name;
    uint32_t options_len;
    const char *options;
    uint32_t kind;      /* QR_VAR_DENSE or QR_VAR_TABLE */
    uint32_t init_len;
    const char *init;
    uint64_t seed;
} qr_msg_create_var;
#define QR_VAR_DENSE 0u
#define QR_VAR_TABLE 1u
/* Largest options and initializer strings a CREATE record may carry. */
#define QR_MSG_MAX_OPTIONS 1024
#define QR_MSG_MAX_INIT 128
void qr_msg_put_create_var(qr_wbuf *b, const qr_msg_create_var *m);
/* What qr_msg_get_create_var found out of range; reading stops there, so
 * the fields after it are zero. */
typedef enum qr_msg_create_bad {
    QR_MSG_CREATE_OK = 0,
    QR_MSG_CREATE_BAD_NDIM,        /* ndim outside 1..QR_PROTO_MAX_NDIM */
    QR_MSG_CREATE_BAD_NAME_LEN,    /* name_len outside 1..QR_PROTO_MAX_NAME */
    QR_MSG_CREATE_BAD_OPTIONS_LEN, /* options_len over QR_MSG_MAX_OPTIONS */
    QR_MSG_CREATE_BAD_INIT_LEN,    /* init_len over QR_MSG_MAX_INIT */
} qr_msg_create_bad;
qr_msg_create_bad qr_msg_get_create_var(qr_rbuf *r, qr_msg_create_var *m);

/* LOOKUP: a table's rows for the ids of the payload. */
typedef struct qr_msg_lookup {
    uint32_t var_id, reserved;
    uint64_t count;
} qr_msg_lookup;
#define QR_MSG_LOOKUP_LEN 16
void qr_msg_put_lookup(qr_wbuf *b, const qr_msg_lookup *m);
void qr_msg_get_lookup(qr_rbuf *r, qr_msg_lookup *m);

typedef struct qr_msg_commit {
    uint32_t worker, seq;
    int64_t local_step;
    uint64_t data_pos;
} qr_msg_commit;
void qr_msg_put_commit(qr_wbuf *b, const qr_msg_commit *m);
void qr_msg_get_commit(qr_rbuf *r, qr_msg_commit *m);

/* HELD: ps k about a held push (then the refusal's text, if any). */
typedef struct qr_msg_held {
    uint32_t worker, seq;
    int64_t local_step;
    int32_t status;
} qr_msg_held;
#define QR_MSG_HELD_LEN 20
void qr_msg_put_held(qr_wbuf *b, const qr_msg_held *m);
void qr_msg_get_held(qr_rbuf *r, qr_msg_held *m);

/* A held push's reply, before its values. */
#define QR_HELD_STALE 1u
void qr_msg_put_held_reply(qr_wbuf *b, int64_t step, uint32_t flags);
void qr_msg_get_held_reply(qr_rbuf *r, int64_t *step, uint32_t *flags);

/* TOKEN: the worker asking. */
void qr_msg_put_worker(qr_wbuf *b, uint32_t worker);
uint32_t qr_msg_get_worker(qr_rbuf *r);

typedef struct qr_msg_clock {
    uint32_t worker;
    int64_t clock;
} qr_msg_clock;
void qr_msg_put_clock(qr_wbuf *b, const qr_msg_clock *m);
void qr_msg_get_clock(qr_rbuf *r, qr_msg_clock *m);

/* APPLY: the step and member count, then one (worker, seq) per member. */
void qr_msg_put_apply_head(qr_wbuf *b, int64_t step, uint32_t count);
void qr_msg_get_apply_head(qr_rbuf *r, int64_t *step, uint32_t *count);
void qr_msg_put_member(qr_wbuf *b, uint32_t worker, uint32_t seq);
void qr_msg_get_member(qr_rbuf *r, uint32_t *worker, uint32_t *seq);
#define QR_MSG_MEMBER_LEN 8

/* CKPT: ps 0's request to the other ps tasks (see the table above). */
enum { QR_CKPT_SNAPSHOT = 1, QR_CKPT_HOLD = 2, QR_CKPT_QUERY = 3, QR_CKPT_CUT = 4,
       QR_CKPT_RELEASE = 5 };
typedef struct qr_msg_ckpt {
    uint32_t phase;
    uint64_t id;
    int64_t step;
    uint32_t count; /* cut records that follow (CUT) */
    /* SNAPSHOT, CUT: the id of the checkpoint this one is an increment of
     * (the previous one, complete), or 0 for a full one */
    uint64_t base;
} qr_msg_ckpt;
#define QR_MSG_CKPT_LEN 32
void qr_msg_put_ckpt(qr_wbuf *b, const qr_msg_ckpt *m);
void qr_msg_get_ckpt(qr_rbuf *r, qr_msg_ckpt *m);

/* SLOTS: a variable's optimizer slots, read and written, and the step. */
enum { QR_SLOTS_NAMES = 1, QR_SLOTS_READ = 2, QR_SLOTS_WRITE = 3, QR_SLOTS_STEP = 4 };
/* Longest slot name a SLOTS request may carry. */
#define QR_MSG_MAX_SLOT_NAME 64
typedef struct qr_msg_slots {
    uint32_t op;
    uint32_t var_id;
    int64_t step;       /* STEP: the step to set; 0 otherwise */
    uint64_t count;     /* READ, WRITE: floats (the slot's size here) */
    uint32_t name_len;  /* <= QR_MSG_MAX_SLOT_NAME */
    const char *name;   /* not NUL-terminated: on reading, into the meta */
} qr_msg_slots;
void qr_msg_put_slots(qr_wbuf *b, const qr_msg_slots *m);
/* False if name_len is over QR_MSG_MAX_SLOT_NAME (reading stops there). */
bool qr_msg_get_slots(qr_rbuf *r, qr_msg_slots *m);
/* One slot of a NAMES reply. */
void qr_msg_put_slot_name(qr_wbuf *b, const char *name, uint64_t elements);
/* name points into the meta, name_len bytes; false if name_len is over
 * QR_MSG_MAX_SLOT_NAME. */
bool qr_msg_get_slot_name(qr_rbuf *r, const char **name, uint32_t *name_len,
                          uint64_t *elements);

/* One worker's part of a cut. */
typedef struct qr_msg_cut {
    uint32_t include, seq;
} qr_msg_cut;
#define QR_MSG_CUT_LEN 8
void qr_msg_put_cut(qr_wbuf *b, const qr_msg_cut *m);
void qr_msg_get_cut(qr_rbuf *r, qr_msg_cut *m);

/* A push as a HOLD/QUERY reply reports it. */
#define QR_MARK_APPLIED 1u
#define QR_MARK_CONNECTED 2u
#define QR_MARK_PARKED 4u
/* applied as a backup's forward (ps-replicas 2): nparts unknown; counts as
 * a part of a call that another mark names, never names one itself */
#define QR_MARK_FORWARDED 8u
typedef struct qr_msg_mark {
    uint32_t worker, flags, seq, nparts;
    uint64_t data_pos;
} qr_msg_mark;
void qr_msg_put_mark(qr_wbuf *b, const qr_msg_mark *m);
void qr_msg_get_mark(qr_rbuf *r, qr_msg_mark *m);

/* The reply to CKPT: the shard written. */
typedef struct qr_msg_shard {
    uint64_t bytes;
    uint32_t crc32, nvars;
} qr_msg_shard;
void qr_msg_put_shard(qr_wbuf *b, const qr_msg_shard *m);
void qr_msg_get_shard(qr_rbuf *r, qr_msg_shard *m);

#endif /* QR_WIRE_MSG_H */

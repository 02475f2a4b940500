/*
 * ps_internal.h - the state of a ps task, shared by the files that make
 * it up. Requests flow down this list: a file calls only files below it
 * (checked with the objects' symbols: nm), with two exceptions whose
 * files call each other, each one room: the checkpoint's orchestration
 * (ckpt_coord.c, ckpt_write.c, ckpt_save.c, ckpt_cut.c): a SAVE asks for
 * a checkpoint, the cut hands the shard to be written, and a written
 * checkpoint answers the saves and ends the cut; and the sync
 * coordinator (coord.c, coord_token.c, coord_held.c): a counted push
 * takes a place in the token queue, a completed step fills it and judges
 * the held pushes, which are counted in turn. What would go up is a
 * callback the caller hands down: the answer of a link's request
 * (links.c), a parked push's resume (ckpt_cut.c). The lifecycle (stop,
 * end, abort, rollback) is asked for by recording it on the ps, which
 * server.c carries out ("The lifecycle", below).
 *   server.c  the loop, connections, dispatch of each request by type
 *             (one handler table), and the lifecycle: start, stop, end,
 *             abort, rollback, carried out in one place
 *   control.c HELLO, READY, STEP, STATS: the small requests about the
 *             connection and the run
 *   slots.c   SLOTS: a variable's optimizer slots read and written by a
 *             worker (torch's state_dict), and the step set before the
 *             first push (a saved run resumed in a new cluster)
 *   push.c    async pushes: checked, acknowledged, applied, counted
 *   coord.c   synchronous replicas on ps 0: the quorum of each step, the
 *             global step, stall reports, statistics; with
 *             coord_token.c (the token barrier) and coord_held.c (held
 *             pushes: a sync push-and-pull counted once every ps holds
 *             it), one room: the three call each other
 *   sync.c    synchronous replicas on every ps: pushes held per step (and
 *             a sync push-and-pull's answer, until its step is done), and
 *             a step applied once its quorum is decided; with
 *             --ps-replicas 2 the same for the copy of ps k's shard
 *             (pushes and steps forwarded; served after a failover)
 *   sync_reduce.c  a step's reduce and apply, in member order, per variable
 *   bound.c   bounded staleness on ps 0 (async): the workers' clocks
 *   lookup.c  LOOKUP: the rows of an embedding table for a batch's ids
 *   liveness.c    ps 0: the workers' heartbeats (a silent one is hung), a
 *                 run with no worker left; ps k: ps 0 gone, or hung
 *   ckpt_init.c   checkpoints: the options, the checkpoint a starting ps
 *                 restores, the end (close, free)
 *   ckpt_coord.c  checkpoints: when one is due, ps 0 collecting the shards
 *                 and writing the manifest
 *   ckpt_write.c  a ps's own shard(s) taken and written, ps k answering
 *                 CKPT
 *   ckpt_save.c   SAVE: a worker asks ps 0 for a checkpoint now
 *   ckpt_cut.c    the consistent cut of an async checkpoint over several
 *                 ps: pushes parked, reports, the cut decided by ps 0
 *   ckpt_shard.c  one shard's format: snapshot (references, on the loop;
 *                 full, or an increment of the last one), write (libuv's
 *                 thread pool)
 *   ckpt_restore.c  the same format read back: restore into a store,
 *                 increments applied onto their base, a SNAPSHOT's
 *                 variables made from its head before its tensors arrive
 *   pull.c    pulls: replies that lend the variables' tensors
 *   create.c  CREATE: the chief's variables and the others' checks
 *   failover.c    --ps-replicas 2: the view (where each shard is
 *             served), kept by ps 0; a dead or hung ps failed over to its
 *             backup in place; VIEW, and a worker's HELLO of a view
 *   rerep.c   --ps-replicas 2: a failed ps's replacement joins as
 *             the backup of the shards it held copies of: a snapshot of
 *             each (the checkpoint's) streamed while training goes on,
 *             then the forwards since; ps 0 marks it in the view
 *   replica_backup.c  --ps-replicas 2, the backup's side: its store of
 *             ps k's shard, REPLICATE checked and applied with the same
 *             kernels, the copy promoted; statistics
 *   replica_forward.c --ps-replicas 2, the primary's side: each CREATE,
 *             applied async push and LOOKUP forwarded in apply order
 *             (sync.c forwards its kept pushes and steps), answers held
 *             until the backup has applied; duplicate pushes
 *   replica.c ps k's link to its backup ps (k+1) mod P: the forwards
 *             sent in order and acknowledged, remade when lost, drained
 *             at the stop; the replication's lifecycle; the shards'
 *             digests
 *   links.c   ps 0's links to the other ps tasks: APPLY, CKPT, STOP and
 *             BEAT travel on them, each request with the callback of its
 *             answer; they see a ps die, hang and come back
 *   rollback.c    a ps that comes back as a new run (restarted), or a
 *                 shard that lost both its copies (--ps-replicas 2): the
 *                 whole cluster rolls back to a checkpoint, in place
 *   grad_check.c  the NaN/Inf check of a push's gradients as they arrive
 *   peer.c    what every request family uses: replies, request checks,
 *             receive buffers, the fence of a run stopped too long
 *   fused_apply.c large async SGD pushes applied as they arrive, the
 *                 gradient's buffer becoming the variable's next value
 *   recv_pool.c   the receive buffers pushes land in, reused hot-first
 *   metrics.c     Prometheus metrics: counters, and the page written on
 *                 the loop for the HTTP server's thread
 *   rows.c    sparse rows: a push's ids checked, summed by id and applied
 *             (distinct ids of a table: applied from the payload itself)
 *             (async pushes, sync steps)
 *   store.c   the variables and their tensors
 *   table.c   an embedding table's shard: rows in an arena, a hash index
 * The state and calls of replication (replica*.c, failover.c, rerep.c) are
 * in replica.h, included here.
 * Everything runs on the ps loop thread, but a checkpoint's files, written
 * on libuv's thread pool (ckpt_shard.c's shard, ckpt_coord.c's manifest),
 * and the metrics page's HTTP server (metrics.c).
 */
#ifndef QR_PS_INTERNAL_H
#define QR_PS_INTERNAL_H

#include "cluster/cluster.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/metrics.h"
#include "ps/ckpt_shard.h"
#include "ps/replica.h"
#include "ps/rows.h"
#include "ps/store.h"
#include "wire/conn.h"
#include "wire/secret.h"
#include "wire/msg.h"

#include <pthread.h>
#include <stdio.h>

/* A peer whose queued replies exceed this stops being read until they
 * drain: bounds the memory a slow or hostile reader can pin. */
#define PEER_MAX_PENDING (256ull << 20)

/* A connection may hold at most this many requests the ps answers later
 * (TOKEN places and requests, CLOCK waits). A worker's calls block, so a
 * live one has one or two; without a bound, a client that keeps asking
 * for what will not come soon grows the ps's memory without end, since a
 * waiting request has no reply queued for PEER_MAX_PENDING to count. */
#define PEER_MAX_WAITS 16

typedef struct push_item {
    qr_var *var;
    uint64_t offset; /* of its bytes in the request's payload */
    uint8_t *data;   /* where those bytes land */
    uint64_t version; /* the variable's version the gradient was computed at */
    bool nonfinite;   /* its gradient holds a NaN or Inf (grad_check.c) */
    bool skip;        /* non-finite, with nonfinite=skip */
    int64_t nrows;    /* sparse items: how many rows; -1 for a dense gradient */
    uint8_t dtype;    /* of a dense item's elements on the wire (quorum.h's QR_FLOAT32...): a
                       * bf16/fp16 gradient is widened to float32 once in
                       * (qr__grad_widen), and a pull's values go back so */
    float lr;         /* the learning rate its push carried (QR_PUSH_LR), used
                       * as is; QR_MSG_PUSH_LR_NONE: the ps's own (qr__ps_lr) */
    float applied_lr; /* the learning rate it was applied with (replica.c forwards it) */
    bool to_spare;    /* computed into the variable's spare, then swapped in */
    /* Applied as it arrives (fused_apply.c): it has its own receive
     * buffer, which holds the variable's next value once all is in:
     * own[0..fused_done) is computed so far, from the current value. */
    bool fused;
    float fused_lr;    /* fixed when the header arrived; -1 for a delta */
    float *own;        /* its buffer, from the pool; NULL when none */
    size_t own_cap;
    int64_t fused_done;
    struct push_item *next_fused; /* the ps's list of fused items under way */
    qr_tensor *shell;  /* for the new value, when a reply reads the old */
} push_item;

/* Idle receive buffers, most recently returned last (recv_pool.c). */
#define QR_RECV_POOL_MAX_IDLE 8
typedef struct recv_buf {
    float *data;
    size_t cap;
} recv_buf;
typedef struct recv_pool {
    recv_buf idle[QR_RECV_POOL_MAX_IDLE];
    int nidle;
    size_t idle_bytes;
} recv_pool;
/* A buffer of at least `bytes` (its capacity in *cap), the hottest idle
 * one if any fits. NULL (with the error set) when out of memory. */
float *qr__recv_pool_get(recv_pool *pool, size_t bytes, size_t *cap);
/* Give a buffer back (data may be NULL). */
void qr__recv_pool_put(recv_pool *pool, float *data, size_t cap);
void qr__recv_pool_free(recv_pool *pool);

/* The NaN/Inf check of the push being received: items[next..] are not
 * fully scanned yet, and the payload bytes before `done` are. */
typedef struct grad_check {
    push_item *items; /* each item's bytes land at its `data` */
    int nitems, next;
    uint64_t done;
} grad_check;

/* Start checking a payload whose items land at their `data`; clears the
 * items' nonfinite. */
void qr__grad_check_start(grad_check *gc, push_item *items, int nitems);
/* The first `got` payload bytes are in: scan what is new. */
void qr__grad_check_advance(grad_check *gc, uint64_t got);
/* The whole payload is in: scan whatever is left (normally nothing, the
 * last `payload` event did it) and detach, so items[].nonfinite is final. */
void qr__grad_check_finish(grad_check *gc, uint64_t payload_len);
/* Once the payload is in and checked: every bf16/fp16 item widened to
 * float32 into one buffer from the pool (*buf, *cap; NULL when the push
 * has none), its data pointing there, so what follows reads float32
 * only. QR_ENOMEM (with the error set). */
int qr__grad_widen(qr_ps *ps, push_item *items, int nitems, float **buf, size_t *cap);

/* fused_apply.c. An async dense push of a variable of this many bytes or
 * more, applied by SGD (or a delta), is applied while it arrives. */
#define QR_FUSED_MIN_BYTES ((uint64_t)8 << 20)
bool qr__fused_eligible(const qr_ps *ps, const push_item *it, bool delta);
/* Give the item its own receive buffer and claim its variable; it->data
 * points there. QR_ENOMEM if no buffer. */
int qr__fused_begin(qr_ps *ps, push_item *it, bool delta);
/* Floats [from, to) of the item's gradient are in: turn them into the
 * variable's next value (sets it->nonfinite on a NaN, Inf or overflow). */
void qr__fused_advance(push_item *it, int64_t from, int64_t to);
/* Before the push is acknowledged: what installing needs (QR_ENOMEM). */
int qr__fused_prepare(push_item *it);
/* The next value becomes the variable's value; cannot fail. */
void qr__fused_install(qr_ps *ps, push_item *it);
/* Give the item's buffers back and release its variable (idempotent). */
void qr__fused_end(qr_ps *ps, push_item *it);
/* The fused push under way on v, or NULL. */
push_item *qr__fused_of(const qr_ps *ps, const qr_var *v);
/* Another push changing v while v's fused push `fu` is under way: the
 * floats fu has computed from the old value must follow. A dense SGD step
 * (lr) or delta (lr = -1) g is applied to them too (when can_follow); for
 * any other change (sparse rows, an optimizer with slots), save what they
 * were computed from (fu->fused_done floats) before it and rebase them on
 * the difference after it. */
bool qr__fused_can_follow(const qr_ps *ps, const push_item *it, bool delta);
void qr__fused_follow(push_item *fu, const float *g, float lr);
void qr__fused_save(const push_item *fu, float *save);
void qr__fused_rebase(push_item *fu, const float *save);

/* A synchronous push: one worker's gradients for one step, held on the
 * ps until the step's quorum is decided (then reduced, or dropped). */
typedef struct sync_push {
    struct sync_push *next;
    uint32_t worker, seq;
    int64_t local_step;
    uint64_t data_pos; /* the worker's data position the push carried */
    int nitems;
    push_item *items;
    float *data; /* the payload, received here in place (from ps->recv_pool) */
    size_t data_cap;
    float *wide; /* its bf16/fp16 gradients widened (qr__grad_widen), or NULL */
    size_t wide_cap;
    bool copy;   /* ps-replicas 2: a push to this ps's copy of ps `primary`'s shard
                  * (forwarded by it, or sent here once the copy is promoted) */
} sync_push;

typedef struct ps_peer {
    qr_ps *ps;
    qr_conn *conn;
    struct ps_peer *prev, *next;
    int worker_index; /* from HELLO; -1 until then */
    int role;         /* from HELLO: 1 worker, 2 ps 0's coordinator link, 3 a primary's
                       * replica link (its CREATEs and REPLICATEs go to ps->replica.store) */
    /* An error found while the request's meta was checked; sent once the
     * (discarded) payload has been read. */
    int err;
    char errmsg[512];
    /* The current request's decoded items. */
    push_item *items;
    int nitems, items_cap;
    sync_push *incoming; /* synchronous push being received */
    uint32_t push_worker; /* the worker index the current push names */
    uint64_t push_data_pos; /* and the data position it carries */
    uint32_t push_seq, push_nparts;
    bool parked;          /* its push waits for a checkpoint's cut */
    bool evicted;         /* closed to make room at max-connections */
    int beat_worker;      /* the worker whose heartbeats come here; -1 */
    uint64_t header_ns;   /* when the current request's header arrived */
    qr_msg_repl_head repl; /* REPLICATE (role QR_ROLE_REPLICA): the head being received */
    bool promoted_shard;  /* a worker's connection to the shard this ps was promoted to
                           * serve (failover.c): its requests name ps->replica.store */
    bool copy_own;        /* a replica link that copies this ps's own shard into ps->store
                           * (a replacement's, rerep.c) */
    struct rerep_recv *snapshot; /* a SNAPSHOT being received into place (rerep.c) */
    bool hello_held;      /* its HELLO waits (rerep.c): held_req, held_meta */
    qr_frame held_req;
    uint8_t held_meta[64];
    qr_var **created;    /* CREATE: new variables waiting for their payload */
    int ncreated;
    grad_check check;    /* of the push being received (items NULL: none) */
    float *recv;         /* this request's receive buffer, from ps->recv_pool */
    size_t recv_cap;
} ps_peer;

/* One member of a step's quorum: a worker's push, named by (worker, seq). */
typedef struct quorum_member {
    uint32_t worker, seq;
    uint64_t data_pos; /* the worker's data position after that push */
} quorum_member;
/* A member's data position not known here: a step's members as an APPLY
 * named them (worker, seq), taken over by the coordinator's successor. */
#define QR_POS_UNKNOWN UINT64_MAX

/* A held push's answer (a sync push-and-pull in one round trip,
 * docs/SYNC.md): the request to answer and the dense variables whose
 * values it brings back (var and dtype of each). ps k keeps it until the
 * push's step is applied there (sync.c); ps 0 until the worker's token
 * is granted (coord_held.c, coord_token.c). */
typedef struct held_pull {
    struct held_pull *next;
    ps_peer *peer;
    qr_frame req;
    uint32_t worker, seq;
    int64_t step;   /* the push's local_step */
    bool stale;     /* dropped as stale: the answer says so */
    bool copy;      /* for the promoted copy's shard (ps-replicas 2): answered at its step */
    bool told;      /* ps 0 was told HELD (with two copies: once the backup had the push) */
    int nitems;
    push_item items[];
} held_pull;

/* A worker's place in the token queue. It is taken when the worker's push
 * is committed (as if TensorFlow's dequeue followed apply_gradients with
 * no gap), granted a token in FIFO order, and answered when the worker's
 * TOKEN request arrives, or at once for a held push (its token is implied
 * by its answer). */
typedef struct token_waiter {
    struct token_waiter *next;
    ps_peer *peer;
    bool granted;
    int64_t token;    /* the step of the granted token */
    int64_t committed; /* the local step of the commit that queued it; -1 none */
    bool has_request; /* the TOKEN request has arrived: reply to req */
    qr_frame req;
    held_pull *held;  /* a held push's answer goes with the token */
    bool member;      /* queued by (worker, seq), counted in the quorum */
    uint32_t worker, seq;
} token_waiter;

typedef struct coord_link coord_link;

/* ps 0's links (links.c): each request carries the callback that consumes
 * its answer, as a libuv write carries its uv_write_cb. */
/* An APPLY of `step` answered by ps `index`: its status and meta. */
typedef void (*qr_link_apply_cb)(qr_ps *ps, int index, int64_t step, int status,
                                 const char *meta, uint32_t len);
/* A CKPT answered by ps `index` (f: the reply; status its status), or the
 * link lost while the checkpoint's exchange with it goes on (f and meta
 * NULL, status QR_EPEERLOST). The exchange is the link's last CKPT and
 * what follows it: later answers go to the same callback. */
typedef void (*qr_link_ckpt_cb)(qr_ps *ps, int index, int status, const qr_frame *f,
                                const uint8_t *meta);
/* The answer `m` to the HELLO that opens each link to ps `index`, which
 * had answered `known` before (0: first answer). True if the cluster rolls
 * back (or aborts): the link must do nothing more. */
typedef bool (*qr_link_welcome_cb)(qr_ps *ps, int index, uint64_t known,
                                   const qr_msg_welcome *m);
/* Why ps 0 takes ps `index` for lost: dead (its link lost, its address
 * refusing), hung (no answer to heartbeats), or cut off from its primary
 * while ps 0 reaches both (a partition between them: failover.c). */
enum { QR_LOST_DEAD, QR_LOST_HUNG, QR_LOST_CUT_OFF };
/* ps `index` is lost, `why` one of QR_LOST_* (links.c): true if it is
 * failed over (failover.c), and the link is then dropped. */
typedef bool (*qr_link_lost_cb)(qr_ps *ps, int index, int why);
/* The answer to a BEAT from ps `index` (its meta: with two copies, a u64,
 * how long that ps's link to its backup has been silent: failover.c). */
typedef void (*qr_link_beat_cb)(qr_ps *ps, int index, const uint8_t *meta, uint32_t len);
/* A HELD from ps `index` (its meta: a qr_msg_held, then the refusal's
 * text): what that ps did with a held push. */
typedef void (*qr_link_held_cb)(qr_ps *ps, int index, const uint8_t *meta, uint32_t len);

/* One gradient of a sync step's reduce: member `member` pushed `it` for v
 * (dense, or sparse rows: it->nrows >= 0). */
typedef struct sync_source {
    qr_var *var;
    int member;
    const push_item *it;
} sync_source;

/* Synchronous replicas: the configuration (every ps) and the coordinator
 * state (ps 0 only). */
typedef struct ps_sync {
    bool on;
    int R, N;            /* replicas_to_aggregate, total_num_replicas */
    bool mean;           /* reduction: mean (else sum) */
    bool sparse_per_row; /* sparse-reduction=per_row: a row's mean over the members that hold it */
    int init_tokens;
    int64_t timeout_ms;  /* a step that makes no progress this long aborts */
    int64_t report_ms;   /* stall report interval */
    int64_t restart_wait_ms; /* a step waiting for a lost worker aborts after this */
    int64_t step;        /* this ps's accumulator step */
    sync_push *pending;  /* received, waiting for their step's quorum */
    sync_source *sources; /* the step being applied: gradients per variable */
    int nsources, sources_cap;
    uint64_t stale_pushes; /* dropped here as stale */
    held_pull *held;     /* ps k: held pushes' answers, waiting for their step */
    /* The members of the last step applied to this ps's own shard and
     * (ps-replicas 2) to its copy of ps `primary`'s: a push of theirs
     * resent (after a lost connection, or a failover) is answered as
     * applied, not as stale (qr__sync_take_resent) */
    quorum_member *own_members, *copy_members;
    int nown_members, own_members_cap, ncopy_members, copy_members_cap;


    /* ps 0 only */
    quorum_member *quorum;
    int nquorum;
    bool applying;
    int applies_pending;
    uint8_t *shard_applied; /* ps-replicas 2: [nps] the step's shards applied (either copy) */
    bool tokens_seeded;
    int64_t *tokens; /* FIFO of token steps */
    int ntokens, tokens_cap, tokens_head;
    token_waiter *waiters, *waiters_tail;
    coord_link *links;  /* to ps 1..P-1 */
    qr_link_welcome_cb on_welcome; /* the answer to every link's HELLO */
    qr_link_lost_cb on_lost_ps;    /* a ps dead or hung: failed over? (failover.c) */
    qr_link_beat_cb on_beat;       /* a BEAT's answer: a partition to its backup? (failover.c) */
    qr_wbuf view_meta;             /* the view the links send (VIEW) */
    qr_link_held_cb on_held;       /* a HELD from a linked ps */
    struct held_commit *commits;   /* held pushes waiting for the other ps tasks' HELD */
    uv_timer_t timer;
    bool timer_on;
    uint64_t step_started_ns, last_grad_ns, last_report_ns;
    bool aborted;
    char abort_msg[1024];
    /* statistics */
    uint64_t steps_done, stale_commits;
    uint64_t stale_at_step_start; /* stale_commits when the step began */
    uint64_t *in_quorum, *stale_by_worker; /* per worker */
    uint64_t wait_ns_total, wait_ns_max;
    FILE *stats_file;
} ps_sync;

/* Bounded staleness (async, ps 0): a worker waiting to start a step. */
typedef struct bound_waiter {
    struct bound_waiter *next;
    ps_peer *peer;
    qr_frame req;
    uint32_t worker;
    int64_t clock; /* the step it wants to start (its completed steps) */
    uint64_t since_ns;
} bound_waiter;

/* Bounded staleness (bound.c): the configuration and, on ps 0 of an
 * async run, the workers' clocks and waits. */
typedef struct ps_bound {
    int64_t max_staleness;   /* the bound k, or -1 */
    int64_t *clock;          /* ps 0: step pushes per worker */
    bound_waiter *waiters;
    uv_timer_t timer;        /* stall reports of the waits */
    bool timer_on;
    uint64_t report_ns;      /* when the last one was logged */
    uint64_t report_every_ns; /* stall-report-ms */
} ps_bound;

/* Checkpoints (ckpt_coord.c): the options, the one being written, and on
 * ps 0 the shards collected for its manifest. */
/* What one shard's write gave (ckpt_coord.c), kept for the CKPT reply. */
typedef struct ckpt_result {
    int status;
    char error[512];
    qr_msg_shard shard;
} ckpt_result;

typedef struct ps_ckpt {
    char *dir;             /* NULL: checkpoints off */
    int64_t every_secs, every_steps;
    int keep;
    int64_t full_every;    /* a full checkpoint every this many (1: all full) */
    ckpt_job *job;         /* this ps's shard being written, or NULL */
    /* ps-replicas 2: the shard this ps was promoted to serve (its failed
     * primary's) is written by this ps too, from its copy: its job, which
     * shard (-1: none), and each write's result (own, copy) until both end */
    ckpt_job *copy_job;
    int copy_shard;
    ckpt_result results[2];
    uint64_t next_id;
    /* the last shard this ps took: its checkpoint's id and coordinator (an
     * increment must be of it); the same for the promoted copy's */
    uint64_t snapshot_id, snapshot_coordinator;
    uint64_t copy_snapshot_id, copy_snapshot_coordinator;
    /* ps 0, ps-replicas 2: the view the one being taken started in, and
     * the newest complete one's; an increment needs both the same (a
     * shard whose writer moved is written whole) */
    uint64_t started_view, last_view;
    /* ps 0: per shard of the one being taken, the ps that writes it (the
     * one serving it), -1 once its answer counted */
    int *writers;
    /* ps 0: the chain. base_id, base_step: the one being taken is an
     * increment of that checkpoint (0: full); last_id: the newest
     * complete checkpoint of this run (0: none yet), chain_length: the
     * increments between it and its full one, full_step: that one's step */
    uint64_t base_id, last_id;
    int64_t base_step, full_step, chain_length;
    /* ps 0 */
    bool busy;             /* a checkpoint is being taken (shards, manifest) */
    int64_t step;          /* its global step */
    int64_t started_step;  /* the global step of the last one started */
    uint64_t started_ns;
    int shards_pending;
    struct qr_ckpt_shard *shards;
    char failure[512];     /* the first shard's failure, "" if none */
    int64_t last_step;     /* of the newest complete checkpoint; -1 none */
    uint64_t last_ns;      /* when the last one was started */
    uint64_t retry_ns;     /* none before this (one was given up) */
    double last_seconds;   /* how long it took, start to manifest */
    uint64_t last_bytes;
    double last_unix_time;
    uint64_t written;      /* complete checkpoints this run */
    double last_snapshot_ms, max_snapshot_ms; /* the loop's part: the references */
    /* tiered tables' rows the cuts left to the writers, to read from the
     * disk tier's snapshot off the loop (not copied at the cut), over the
     * run */
    uint64_t disk_rows_off_loop;
    bool want_final;       /* a stop waits for the final checkpoint */
    bool final_started;
    bool final_stops_cluster; /* ... then STOP every ps (an orderly end) */
    ps_peer *stop_peer;    /* ... and the STOP request to answer after it */
    qr_frame stop_req;
    /* ps k: the CKPT request to answer when the shard is written */
    ps_peer *reply_peer;
    qr_frame reply_req;
    /* ps 0: workers' SAVE requests waiting for a checkpoint (ckpt_save.c) */
    struct save_waiter *saves;
    /* the workers' data positions (ps 0): after their last push that a
     * checkpoint taken now holds; restored ones until they push */
    uint64_t *data_pos;
    /* the coordinator's successor (qr__ckpt_take_over): per worker, a data
     * position heard since the takeover; NULL once each worker has one */
    uint8_t *pos_fresh;
    int64_t restored_step; /* -1: started fresh */
    /* async with several ps: the cut (ckpt_cut.c) */
    qr_msg_mark *marks;     /* [workers]: each one's last push applied here */
    qr_msg_mark *copy_marks; /* ps-replicas 2: the same for the promoted copy's shard */
    bool holding;           /* whole pushes park instead of being applied */
    bool park_failed;       /* one could not be parked: this cut is spoiled */
    struct parked_push *parked, *parked_tail;
    /* ps 0 */
    bool collecting;        /* waiting for the reports of a HOLD or QUERY */
    int reports_pending;
    qr_wbuf *reports;       /* [nps]: each ps's last report */
    uint64_t hold_ns;       /* when the hold began */
    uv_timer_t poll;
    bool poll_init;
} ps_ckpt;

/* ps 0: the workers' heartbeats (liveness.c). */
typedef struct ps_liveness {
    int64_t timeout_ms;    /* heartbeat-timeout-ms */
    int64_t beat_ms;       /* heartbeat-ms: ps 0's beats on its links (0: none, nothing hung) */
    uint64_t hung_ps_total; /* ps tasks declared hung (ps 0: linked ones; ps k: ps 0) */
    uint64_t watch_ns;     /* the watch timer's last tick */
    uint64_t turn_ns;      /* the loop's last turn (server.c stamps it): a ps stopped
                            * longer than timeout_ms sees the gap and is fenced */
    uint64_t *beat_ns;     /* [workers]: the last beat; 0 = none yet */
    bool *hung;            /* [workers]: declared hung, not beaten since */
    uint64_t hung_total;
    bool seen_workers;     /* ps 0: a worker has been connected */
    bool *finished;        /* [workers] ps 0: said LEAVE (done, will not push again) */
    int nfinished;
    uint64_t none_since_ns; /* ps 0: no worker connected since (0: some are) */
    int64_t chief_lost_step; /* ps 0: the global step when the chief's last connection closed */
    bool chief_lost_said;    /* ps 0: its loss has been logged (until it comes back) */
    uv_timer_t timer;
    bool timer_on;
} ps_liveness;

/* Prometheus metrics (metrics.c): counters of the loop, and the page the
 * loop writes for the server's thread. */
typedef struct ps_metrics {
    uint64_t pushes, push_bytes, pulls, pull_bytes;
    /* embedding tables: rows made, rows looked up, rows pushed */
    uint64_t rows_added, rows_looked_up, rows_pushed;
    qr_prom_hist push_latency, pull_latency;
    uint64_t *worker_seen_ns;  /* ps 0: each worker's last push here */
    int64_t *worker_step;      /* ps 0: the global step then */
    bool on;                   /* --metrics-port: the server runs */
    qr_metrics_server *server;
    uv_async_t render;
    pthread_mutex_t mu;        /* guards page, rendered, closing */
    pthread_cond_t cond;
    char *page;
    uint64_t rendered;
    bool closing;
} ps_metrics;

/* Staleness histogram buckets: 0, 1, 2, 3, 4-7, 8-15, 16-31, 32-63, 64+. */
#define QR_STALENESS_BUCKETS 9

struct qr_ps {
    /* Kept across a rollback (server.c, reopen): the loop, the stop any
     * thread or signal handler may ask for, the handle that carries out
     * the lifecycle, and what the ps was given. */
    uv_loop_t loop;
    uv_async_t stop_async;
    uv_prepare_t lifecycle; /* acts on what was asked ("The lifecycle") */
    qr_cluster *cluster;
    qr_config *cfg;
    /* Everything from here on is made anew by a rollback. */
    uv_timer_t linger_timer;
    int index;
    /* The ps that coordinates the cluster (the global step, the view, the
     * workers' liveness, the stop, sync steps and checkpoints): ps 0, or
     * ps 1, which serves shard 0 from its copy, once ps 0 has failed over
     * (failover.c, take_over; docs/REPLICATION.md, "ps 0's coordinator
     * failover"). */
    int coord_index;
    uint64_t incarnation;  /* this run of the ps: new at every start and rollback */
    uint64_t follows;      /* ps k: the coordinator incarnation whose rollback made this run (0: none) */
    uint64_t coordinator;  /* ps k: the coordinator incarnation it met (0: none yet) */
    uint64_t coordinator_lost_ns; /* ps k: when ps 0's link went (0: connected, or never) */
    uint64_t coordinator_heard_ns; /* ps k: the last message from ps 0's link (its beats) */
    uint64_t cause;        /* ps 0: the restarted ps run whose HELLO answer made this run (0: none) */
    bool changed;          /* a request that changes the state was handled in this run */
    bool fenced;           /* stopped past heartbeat-timeout-ms: this run is over (peer.c) */
    int64_t restore_step;  /* at start: QR_RESTORE_NEWEST, QR_RESTORE_NONE, or that step */
    struct {
        bool wanted;       /* the loop is ending for a rollback to `step` */
        int64_t step;      /* -1: to nothing (no checkpoint was written yet) */
        uint64_t follows;
        uint64_t cause;    /* ps 0: the restarted ps run that asked for it */
        bool closed;       /* server.c has closed the run for it */
    } rollback;
    int restart_wait_ms;
    int64_t step_limit;    /* ps 0: the run's last global step, from the chief (0: unknown) */
    char abort_msg[1024];  /* why exit_status is an error */
    char end_msg[512];     /* why an orderly end came (a stop notice says it) */
    qr_listener *listener;
    qr_conn_options conn_opt;
    qr_conn_events events;
    qr_optim *optim;
    qr_store store;
    ps_peer *peers;
    int npeers;
    int max_peers;           /* max-connections: more are closed at once */
    uint64_t peers_refused;  /* ... counted, logged once a second at most */
    qr_log_limit refused_log;
    uint64_t peers_evicted;  /* closed to make room for a new one (server.c, evict_for) */
    int peers_evicting;      /* of those, not lost yet (still in npeers) */
    qr_log_limit evicted_log;
    /* The job's credentials (wire/auth.h), NULL without a secret; failed
     * handshakes counted by reason (qr_hs_refusal) and logged with the
     * peer's address, 5 lines a second at most. */
    qr_auth *auth;
    uint64_t handshakes_refused[QR_HS_REFUSAL_MAX + 1];
    qr_log_limit handshake_log;
    recv_pool recv_pool;
    /* rows.c: a bit per table row, set while a push's rows are checked
     * for duplicates (qr__rows_apply_push), clear between pushes */
    row_marks row_marks;
    uint64_t mark;
    int64_t global_step;   /* meaningful on ps 0 */
    int64_t applied_steps; /* step pushes applied here: Adam's t */
    bool ready;
    /* The lifecycle ("The lifecycle" below): `stopping` from the moment a
     * stop, an abort or a rollback is decided (requests are refused, no
     * new work starts); what was asked, until the loop carries it out. */
    bool stopping;
    struct {
        bool stop;         /* this ps stops */
        bool stop_cluster; /* ps 0: STOP to every other ps first */
        bool end;          /* the run ends in order: the final checkpoint, then the cluster stops */
    } asked;
    bool stop_begun;       /* the stop is carried out: listener closed, workers told */
    bool stop_asked;       /* qr_ps_stop was called (kept over a rollback) */
    int exit_status;       /* what qr_ps_run returns */
    bool skip_nonfinite;
    int linger_ms;
    /* learning-rate schedule: exponential decay over the steps applied here */
    double lr_decay_rate;
    int64_t lr_decay_steps; /* 0 = no decay */
    bool lr_decay_staircase;
    char name[32];
    ps_sync sync;
    /* workers: open connections per worker index, and when the last closed */
    int *worker_conns;
    uint64_t *worker_lost_ns;
    /* async */
    bool staleness_lr_scale;
    uint64_t staleness_hist[QR_STALENESS_BUCKETS]; /* per gradient (variable) */
    uint64_t stale_pushes_applied; /* pushes with a gradient of staleness >= 1 */
    uint64_t fused_pushes;  /* items applied as they arrived (fused_apply.c) */
    uint64_t fused_rebases; /* applies that rebased such an item's results */
    push_item *fused;        /* fused pushes under way (fused_apply.c) */
    ps_bound bound;
    float average_decay;     /* moving averages: 0 = off */
    char *average_vars;      /* names to average ("" = all) */
    ps_ckpt ckpt;
    ps_liveness liveness;
    ps_metrics metrics;
    ps_replica replica;
    struct ps_tier *tier; /* --table-memory-mb: the tables' disk tier (tier.c), or NULL */
    /* A fault for the tests, from QUORUM_TEST_COORDINATOR_DIES_AT_STEP (-1:
     * none): at that global step ps 0 dies halfway through telling the
     * others, as a SIGKILL at a random moment rarely does: in sync mode
     * with a step's APPLY sent to every ps but ps 1 (coord.c), or, given
     * as "N:mirror", to ps 1 alone (dying once ps 1 has answered it and
     * has shard 0's part: test_die_waits counts the two down); in async
     * mode at the first checkpoint's cut from then on, once it has asked
     * every ps to hold (ckpt_cut.c). */
    bool test_die_mirror;
    int test_die_waits;
    int64_t test_die_at_step;
    /* rerep.c: the VIEW from ps 0 that started a copy, answered once it is made */
    ps_rerep_report rerep;
};

/* Does this ps coordinate the cluster (qr_ps.coord_index)? */
static inline bool qr__ps_coordinates(const qr_ps *ps) {
    return ps->index == ps->coord_index;
}
/* For each ps k but the coordinator (the ps its links go to). */
#define QR_EACH_OTHER_PS(ps, k)                                                                    \
    for (int k = 0; k < (ps)->cluster->nps; k++)                                                   \
        if (k == (ps)->coord_index) {                                                              \
        } else

/* ps-replicas 2: this ps forwards what it applies to its backup. */
static inline bool qr__replica_on(const qr_ps *ps) {
    return ps->replica.copies > 1;
}

/* Does a worker index read off the wire name one of n workers? Compared
 * unsigned: cast to int, indices of 2^31 and up would pass as negative. */
static inline bool qr__is_worker(uint32_t index, int n) {
    return n > 0 && index < (uint32_t)n;
}

/* The optimizer that applies to v: its own, else the ps's. */
static inline const qr_optim *qr__var_optim(const qr_ps *ps, const qr_var *v) {
    return v->optim ? v->optim : ps->optim;
}

/* The learning rate of one apply to v: the variable's own or its
 * optimizer's, decayed by the schedule at `step` (steps applied before
 * this one). */
static inline float qr__ps_lr(const qr_ps *ps, const qr_var *v, const qr_optim *opt,
                              int64_t step) {
    float lr = v->lr >= 0 ? v->lr : qr_optim_lr(opt);
    return qr_optim_decayed_lr(lr, step, ps->lr_decay_rate, ps->lr_decay_steps,
                               ps->lr_decay_staircase);
}

/* The learning rate of one apply of `it`'s gradient to its variable: the
 * one its push carried, as is (the worker's schedule replaces the ps's: no
 * lr-decay), else qr__ps_lr. */
static inline float qr__item_lr(const qr_ps *ps, const push_item *it, const qr_optim *opt,
                                int64_t step) {
    return it->lr >= 0 ? it->lr : qr__ps_lr(ps, it->var, opt, step);
}

/* peer.c: replies. A reply to `req` is queued on p's connection; past
 * PEER_MAX_PENDING queued bytes the connection stops being read until its
 * replies drain. qr__peer_reply returns QR_OK if queued; on failure cb
 * (if any) has already run. */
int qr__peer_reply(ps_peer *p, const qr_frame *req, int status, const qr_wbuf *meta,
                   const qr_iov *iov, int niov, qr_send_cb cb, void *ctx);
/* The callback of a reply with none of its own; one that has its own
 * calls it at the end (it resumes a paused connection). */
void qr__peer_reply_sent(qr_conn *c, int status, void *ctx);
/* The connection's queued replies reached the kernel (the `drained`
 * event): read it again if it was paused for them. */
void qr__peer_drained(qr_conn *c);
/* Status and message (sent as meta, also logged at debug level). */
/* Tell a worker, unasked, that this ps stops and why (QR_STOP_NOTICE_ID). */
void qr__peer_notify_stop(ps_peer *p, int status, const char *why);
void qr__peer_reply_error(ps_peer *p, const qr_frame *req, int status, const char *msg);
/* QR_OK with an i64 step: PUSH, STEP, COMMIT, TOKEN, CLOCK. */
void qr__peer_reply_step(ps_peer *p, const qr_frame *req, int64_t step);
/* Remember a failure found while checking a request's meta (qr__fail has
 * set the message); on_message answers it once the payload has gone by. */
void qr__peer_hold_error(ps_peer *p, int status);

/* peer.c: the wait before a link to another ps (ps 0's links, a
 * primary's replica link) is remade: 10 ms doubling to 1 s with each
 * attempt (*attempts counts them; the caller zeroes it once up). */
uint64_t qr__link_backoff_ms(int *attempts);

/* peer.c: request checks, each a qr__fail with a message naming the
 * request and the problem. */
/* A list of count variables: 1..QR_PROTO_MAX_ITEMS. */
int qr__peer_check_count(const char *what, uint32_t count);
/* The meta was read whole, no more, and describes payload_len bytes. */
int qr__peer_check_end(const char *what, const qr_rbuf *r, uint64_t described,
                       uint64_t payload_len);
/* A request of exactly meta_len meta bytes and no payload. */
int qr__peer_check_small(const qr_frame *f, uint32_t meta_len);
/* The variable with that id, named once in this request (ps->mark). */
int qr__peer_lookup(ps_peer *p, const char *what, uint32_t id, qr_var **out);
/* Room for n decoded items in p->items. */
int qr__peer_reserve_items(ps_peer *p, uint32_t n);

/* peer.c: the request's receive buffer, from the ps's pool. A request
 * takes at most one; it goes back as soon as the request is done with it
 * (qr__peer_release_recv, which also ends the request's fused items), so
 * the next push, from any worker, lands in the same hot buffer. */
int qr__peer_take_recv(ps_peer *p, size_t bytes);
void qr__peer_release_recv(ps_peer *p);
/* The request's receive buffer handed to another holder (a push's forward
 * to the backup, sent from it): the request no longer has one, and
 * qr__recv_lent_release(owner) gives it back to the pool. NULL when it has
 * none, or out of memory (the request keeps it then). */
void *qr__peer_lend_recv(ps_peer *p);
void qr__recv_lent_release(void *owner);

/* slots.c: SLOTS, a variable's optimizer state read and written. */
int qr__slots_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__slots_message(ps_peer *p, const qr_frame *f, const uint8_t *meta);

/* push.c: async pushes (a sync one is handed to sync.c). */
int qr__push_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__push_message(ps_peer *p, const qr_frame *f);
/* Staleness statistics of async pushes, as JSON fields of obj. */
struct cJSON;
void qr__push_stats_json(const qr_ps *ps, struct cJSON *obj);

/* pull.c */
int qr__pull_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__pull_message(ps_peer *p, const qr_frame *f, const uint8_t *meta);
/* Answer f with the values of the dense items of p (a pull's variables,
 * or a fused push's dense gradients': QR_PUSH_REPLY_VALUES), lent from
 * their tensors; step: the global step first in the meta, or NULL. */
void qr__pull_reply_values(ps_peer *p, const qr_frame *f, bool averages, const int64_t *step);
/* The same for items[0..nitems), the meta starting with head's bytes. */
void qr__pull_reply_items(ps_peer *p, const qr_frame *f, const push_item *items, int nitems,
                          bool averages, const qr_wbuf *head);

/* rows.c: a sparse item's ids are rows of its dense variable, or ids of
 * its table placed on ps `shard` (this ps; a backup: its primary);
 * otherwise msg says which is not (QR_EINVAL). */
int qr__rows_check(const qr_ps *ps, int shard, const push_item *it, char *msg, size_t msgsz);
/* rows.c: apply summed sparse rows (rows.h) to v, a table or the rows of
 * a dense variable: its optimizer at step t (Adam's t) with the learning
 * rate pushed_lr (a push's, QR_PUSH_LR), or when it is negative the ps's
 * of t - 1 steps applied; or added as they are (delta). A table gets the
 * rows it lacks, initialized, first. */
int qr__rows_apply(qr_ps *ps, qr_var *v, row_sum *s, bool delta, int64_t t, float pushed_lr);
/* rows.c: one push's sparse item (n ids, read with memcpy, and n x dim
 * floats) summed by id and applied as qr__rows_apply does. Ids all in a
 * table already and all distinct (a worker's push: summed by id there)
 * are applied from the payload itself, without the sum's copy and index;
 * the result is the same bit for bit. */
int qr__rows_apply_push(qr_ps *ps, qr_var *v, const uint8_t *ids, const float *rows, int64_t n,
                        bool delta, int64_t t, float pushed_lr);

/* lookup.c: LOOKUP, the rows of an embedding table. */
#define QR_LOOKUP_MAX_IDS (1 << 24)
int qr__lookup_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__lookup_message(ps_peer *p, const qr_frame *f, const uint8_t *meta);

/* create.c */
int qr__create_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__create_message(ps_peer *p, const qr_frame *f, const uint8_t *meta);
/* Make v (named, its optimizer and slots made) the table m describes;
 * opt: v's optimizer (qr__var_optim), whose per-row slots it keeps. */
int qr__create_table(const qr_optim *opt, qr_var *v, const qr_msg_create_var *m);
/* Free the variables a CREATE made and has not stored yet. */
void qr__create_drop(ps_peer *p);

/* replica.h: the store and the shard a peer's requests name. */
/* A replica link's store is the backup's. */
static inline qr_store *qr__peer_store(ps_peer *p) {
    if (p->copy_own) return &p->ps->store;
    return p->role == QR_ROLE_REPLICA || p->promoted_shard ? &p->ps->replica.store
                                                           : &p->ps->store;
}
/* The shard a peer's requests are for: this ps's, or the one it was
 * promoted to serve (failover.c). */
static inline int qr__peer_shard(const ps_peer *p) {
    return p->promoted_shard ? p->ps->replica.primary : p->ps->index;
}
/* Does this connection bring the coordinator its own part of held pushes?
 * Workers send that part to shard 0 always: ps 0's own shard, or its copy
 * on the ps that took the coordinator's role over (failover.c). */
static inline bool qr__peer_coordinator_part(const ps_peer *p) {
    return qr__ps_coordinates(p->ps) && qr__peer_shard(p) == 0;
}
/* control.c: HELLO, READY, STEP, STATS. */
int qr__control_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__control_message(ps_peer *p, const qr_frame *f, const uint8_t *meta);

/* sync.c: every ps */
int qr__sync_init(qr_ps *ps);
void qr__sync_push_free(qr_ps *ps, sync_push *sp);
void qr__sync_free(qr_ps *ps);
/* A synchronous push's meta was checked (items in p->items): receive its
 * payload into a buffer of its own. */
int qr__sync_push_header(ps_peer *p, const qr_frame *f, uint32_t worker, uint32_t seq,
                         int64_t local_step);
void qr__sync_push_message(ps_peer *p, const qr_frame *f);
/* A sync push resent (same worker, seq, step) that the shard it came for
 * keeps already for its step, or that was a member of the step last
 * applied to it (*applied): dropped here (not kept twice), counted in
 * duplicate_pushes; the caller answers it as the original. false: a new one. */
bool qr__sync_take_resent(ps_peer *p, const qr_frame *f, bool *applied);
/* The synchronous push just received, checked and kept for its step:
 * QR_OK, QR_ESTALE (stale here: dropped) or a refusal (dropped); msg
 * says why. Nothing is answered. */
int qr__sync_push_keep(ps_peer *p, const qr_frame *f, char *msg, size_t len);
/* A held push's answer (QR_PUSH_SYNC | QR_PUSH_REPLY_VALUES): the dense
 * items' variables whose values it brings. NULL when out of memory. */
held_pull *qr__held_new(ps_peer *p, const qr_frame *f, uint32_t worker, uint32_t seq,
                        int64_t step, const push_item *items, int nitems);
/* Answer it with its values (then `step`, and QR_HELD_STALE if stale),
 * or with an error; either frees it. */
void qr__held_answer(held_pull *h, int64_t step);
void qr__held_fail(held_pull *h, int status, const char *msg);
/* A request refused at its header: a held push's ps 0 hears of it. */
void qr__sync_push_refused(ps_peer *p, const qr_frame *f, int status, const char *msg);
/* ps k: ps 0's link (re)connected: say again which held pushes are here. */
void qr__sync_coordinator_linked(qr_ps *ps);
/* The peer is gone: its held pushes' answers with it. */
void qr__sync_peer_lost(ps_peer *p);
/* The ps stops: every held push is answered with why. */
void qr__sync_stop(qr_ps *ps, int status, const char *why);
/* RELEASE comes from ps 0's coordinator link: answer a held push now. */
int qr__sync_release_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__sync_release_message(ps_peer *p, const qr_frame *f, const uint8_t *meta);
/* Answer the held push (worker, seq) here now (RELEASE, or the
 * coordinator's successor releasing its own shard's part). */
void qr__sync_release(qr_ps *ps, uint32_t worker, uint32_t seq);
/* The answer to a coordinator's link (control.c), sync mode, two copies:
 * the step this ps's own shard is at and the members of the step before
 * (qr__coord_shard_at reads them). */
void qr__sync_put_shard_step(const qr_ps *ps, qr_wbuf *out);
/* The coordinator's successor: its own shard's step is on its backup, so
 * its held pushes of that step are answered (as APPLY's answer does on
 * ps k). */
void qr__sync_answer_own(qr_ps *ps);
/* APPLY comes from ps 0's coordinator link, in sync mode. */
int qr__sync_apply_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__sync_apply_message(ps_peer *p, const qr_frame *f, const uint8_t *meta);
/* Reduce and apply step s from the given pushes (in that order) and drop
 * the other pushes of step <= s. */
int qr__sync_apply_step(qr_ps *ps, int64_t s, const quorum_member *members, int n);
/* sync_reduce.c: a step's gradients, gathered one source at a time
 * (variable, member index, item), then reduced in member order and
 * applied once per variable (the sources are sorted in place). */
int qr__sync_add_source(ps_sync *s, qr_var *v, int member, const push_item *it);
int qr__sync_reduce_and_apply(qr_ps *ps, sync_source *sources, int nsources, int64_t step,
                              float divisor);
/* ps 0, ps-replicas 2, sync: ps k failed over; a step being applied gets
 * shard k's part from its promoted copy (coord.c); and shard `served`'s
 * (-1: none), which ps k served from its promoted copy, from ps `served`,
 * a replacement that held it and serves it now. */
void qr__coord_failed_over(qr_ps *ps, int k, int served);
/* The backup (replica_backup.c): a sync step forwarded by the primary (its
 * members), reduced and applied to the copy from the pushes forwarded, as
 * the primary did. */
int qr__sync_apply_copy(qr_ps *ps, int64_t step, const quorum_member *members, int n);
/* The backup: a sync push the primary kept (h: worker, seq, t = its
 * local step), kept on the copy with a copy of its bytes (payload); own:
 * on a replacement, a push of its own shard, forwarded by the ps that
 * serves it (rerep.c). */
int qr__sync_copy_keep(qr_ps *ps, bool own, const qr_msg_repl_head *h, const push_item *items,
                       int nitems, const void *payload, size_t len);
/* A re-replication's snapshot was queued on the link of the shard (copy:
 * the promoted copy's): the pushes kept for the step in flight, which a
 * snapshot does not hold, are forwarded behind it (rerep.c). */
void qr__sync_forward_kept(qr_ps *ps, bool copy);
/* The members of the last step applied to a shard (copy: the copy of ps
 * `primary`'s), kept for a resent push (also from a snapshot, rerep.c). */
int qr__sync_record_members(qr_ps *ps, bool copy, const quorum_member *members, int n);

/* bound.c: bounded staleness on ps 0 (async) */
int qr__bound_init(qr_ps *ps);
void qr__bound_free(qr_ps *ps);
int qr__bound_clock_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__bound_clock(ps_peer *p, const qr_frame *f, const uint8_t *meta);
/* ps 0 applied a step push of `worker` (any index off the wire): count it
 * on its clock and release who may go. */
void qr__bound_count_step(qr_ps *ps, uint32_t worker);
/* A worker left: release who may go. */
void qr__bound_update(qr_ps *ps);
void qr__bound_peer_lost(ps_peer *p);
void qr__bound_stop(qr_ps *ps);
/* Close the stall-report timer (the ps is stopping or being freed). */
void qr__bound_close(qr_ps *ps);

/* peer.c: this ps did not run for heartbeat-timeout-ms or more (SIGSTOP,
 * a wedged loop) since the loop's last turn: the others have declared it
 * hung and a new run of it may serve its shard. It is fenced off: true
 * from then on, and every path that would serve, answer, write a
 * checkpoint or tell the cluster anything asks first (server.c then ends
 * the run without a word to anyone). */
bool qr__ps_fenced(qr_ps *ps);
/* This run learns that another ps serves its shard now (its backup was
 * promoted, failover.c): fenced as above, with why. */
void qr__ps_fence(qr_ps *ps, const char *why);

/* ---- The lifecycle ----------------------------------------------------------
 * Whoever decides that the ps stops, ends its run, aborts or rolls back
 * (a request handler, a link, a timer, a checkpoint that completes) only
 * records it with one of these; server.c carries it out in one place, on
 * its prepare handle, before the loop next waits (Redis records
 * shutdown_asap and acts on it in serverCron). So no push, link or
 * checkpoint ever runs the stop path itself, and the order of what a stop
 * does (links told, token waits ended, listener closed, workers told,
 * then the end once every peer is gone) is written once. They call
 * nothing, so no file of the ps calls up into server.c. */

/* This ps stops (a worker's or ps 0's STOP, qr_ps_stop). */
static inline void qr__ps_ask_stop(qr_ps *ps) {
    ps->asked.stop = true;
    ps->stopping = true;
}

/* ps 0: STOP to every other ps, and stop this one. */
static inline void qr__ps_ask_stop_cluster(qr_ps *ps) {
    ps->asked.stop_cluster = true;
    qr__ps_ask_stop(ps);
}

/* ps 0: the run is over in order (why: for the log and the workers' stop
 * notice): the final checkpoint if checkpoints are on, then the cluster
 * stops. Nothing if the ps is stopping already. */
static inline void qr__ps_ask_end(qr_ps *ps, const char *why) {
    if (ps->stopping || ps->exit_status || ps->ckpt.want_final || ps->asked.end) return;
    ps->asked.end = true;
    snprintf(ps->end_msg, sizeof ps->end_msg, "%s", why);
}

/* The run fails with status and msg as they are (ps 0's STOP of an abort,
 * relayed by another ps): qr_ps_run returns them, every worker's stop
 * notice and every waiting call carry them, and the whole cluster stops
 * (ps 0; any other ps stops itself). The first abort is the one reported. */
static inline void qr__ps_abort_as(qr_ps *ps, int status, const char *msg) {
    if (ps->exit_status) return;
    qr__log(QR_LOG_ERROR, "%s", msg);
    snprintf(ps->abort_msg, sizeof ps->abort_msg, "%s", msg);
    ps->exit_status = status;
    qr__ps_ask_stop_cluster(ps);
}

/* The run fails because of why: "job aborted: why" (QR_EABORTED), so that
 * the last line of every task of the job says it was aborted and why
 * (docs/SYNC.md, "How a job ends"). */
static inline void qr__ps_ask_abort(qr_ps *ps, int status, const char *why) {
    char msg[sizeof ps->abort_msg];
    snprintf(msg, sizeof msg, "job aborted: %s", why);
    qr__ps_abort_as(ps, status, msg);
}

/* End this run of the ps so that qr_ps_run starts it again from the
 * checkpoint of `step` (-1: from nothing), following the coordinator
 * incarnation `follows` (0: none); ps 0: `cause` is the incarnation of
 * the restarted ps that asked for it (0: none), which the next run's
 * HELLOs name. False (nothing asked) if the ps is stopping or rolling
 * back already. */
static inline bool qr__ps_ask_rollback(qr_ps *ps, int64_t step, uint64_t follows,
                                       uint64_t cause) {
    if (ps->rollback.wanted || ps->stopping) return false;
    ps->rollback.wanted = true;
    ps->rollback.step = step;
    ps->rollback.follows = follows;
    ps->rollback.cause = cause;
    ps->stopping = true; /* requests still in flight are answered "stopped" */
    return true;
}

/* server.c: why this ps is stopping: the abort's message, the end's, or a
 * default. */
const char *qr__ps_stop_reason(const qr_ps *ps);

/* links.c: ps 0's links to the other ps tasks (whenever there are some);
 * every HELLO's answer goes to on_welcome. */
int qr__links_init(qr_ps *ps, qr_link_welcome_cb on_welcome);
static inline bool qr__ps_has_links(const qr_ps *ps) {
    return qr__ps_coordinates(ps) && ps->sync.links != NULL;
}
/* The link to ps k is given up for good (a coordinator taking over from
 * ps k, whose run was `incarnation`): it only watches for a replacement,
 * as a failed-over ps's; that run itself, resumed, is not one. */
void qr__links_drop(qr_ps *ps, int k, uint64_t incarnation);
/* Every link is up: connected and its HELLO answered (but those failed over). */
bool qr__links_all_up(const qr_ps *ps);
/* STOP to ps k alone (its link stays until it is delivered): a
 * replacement serves no worker, so no worker's stop reaches it. */
void qr__links_stop_one(qr_ps *ps, int k);
/* Send ps->sync.view_meta (VIEW) on every link not failed over, first
 * thing once it is up. */
void qr__links_view(qr_ps *ps);
/* Does ps 0 reach ps k now (its link up, answering within
 * heartbeat-timeout-ms)? Fail ps k over, `why` one of QR_LOST_* (true if
 * it was: the link is dropped). */
bool qr__links_reaches(qr_ps *ps, int k);
bool qr__links_fail(qr_ps *ps, int k, int why);
/* When the link to ps `index` went down (0: up). */
uint64_t qr__link_down_ns(const qr_ps *ps, int index);
/* Queue the APPLY of a sync step on every link but ps `skip`'s (-1: none),
 * or on ps k's; cb gets each answer. */
void qr__links_apply(qr_ps *ps, int64_t step, qr_link_apply_cb cb, int skip);
void qr__link_apply(qr_ps *ps, int k, int64_t step, qr_link_apply_cb cb);
/* Sync, two copies: APPLY(step) with those members to ps k, whose shard
 * missed that step (the coordinator died with it in its write queue),
 * sent before anything else on the link; its answer is logged, a refusal
 * aborts the job (coord.c, qr__coord_shard_at). */
void qr__link_catch_up(qr_ps *ps, int k, int64_t step, const quorum_member *members, int n);
/* APPLY(step) to ps k (again): ps-replicas 2, a shard it serves since a
 * failover is not applied yet (coord.c). */
void qr__link_apply_again(qr_ps *ps, int k, int64_t step);
/* Queue a CKPT request (its meta) on the link to ps `index`, sent before
 * any APPLY queued after it; cb gets its answer, or the link's loss. */
void qr__link_ckpt(qr_ps *ps, int index, const qr_wbuf *meta, qr_link_ckpt_cb cb);
void qr__links_stop_all(qr_ps *ps);
/* RELEASE (worker, seq) to every ps k linked now: answer that held push. */
void qr__links_release(qr_ps *ps, uint32_t worker, uint32_t seq);
/* ps 0's watch: a link down for restart-wait-ms ends the run. */
void qr__links_watch(qr_ps *ps);
/* A link still has a STOP to deliver. */
bool qr__links_busy(qr_ps *ps);
void qr__links_stop(qr_ps *ps);
void qr__links_close(qr_ps *ps);
void qr__links_free(qr_ps *ps);

/* rollback.c. ps 0: ps `index` answered its link's HELLO with m, having
 * answered `known` before (0: first answer). True if the ps rolls back
 * (or aborts): the link must do nothing more. */
bool qr__rollback_check_link(qr_ps *ps, int index, uint64_t known, const qr_msg_welcome *m);
/* ps k: a coordinator's HELLO. True if this ps rolls back (or stops): the
 * HELLO is not answered. */
bool qr__rollback_check_coordinator(qr_ps *ps, const qr_msg_hello *m);
/* What this ps answers a HELLO with. */
qr_msg_welcome qr__rollback_welcome(const qr_ps *ps);
/* ps 0, --ps-replicas 2: shard `shard` has lost both its copies: ps k
 * is lost now, its neighbour `other` held no copy (failed, or a
 * replacement still JOINING). With --checkpoint-dir the cluster rolls
 * back to the newest checkpoint (true: the run ends, a rollback);
 * without, the run aborts (false). Either way the message names the
 * shard and why. */
bool qr__rollback_both_lost(qr_ps *ps, int shard, int k, int other);
#define QR_RESTORE_NEWEST (-1)
#define QR_RESTORE_NONE (-2)

/* coord.c, coord_token.c, coord_held.c: ps 0 */
int qr__coord_init(qr_ps *ps);
void qr__coord_close(qr_ps *ps);
/* The run is over (its loop has run out): free what waits for the others. */
void qr__coord_free(qr_ps *ps);
void qr__coord_ready(qr_ps *ps);
/* Before the first step (slots.c): the run goes on from `step`, the
 * tokens queued already being of it. */
void qr__coord_set_step(qr_ps *ps, int64_t step);
/* The coordinator's successor (failover.c) takes the sync step over from
 * the shards it holds: the step in flight applied again, or gathered. */
void qr__coord_take_over(qr_ps *ps);
/* ps k's answer to the coordinator's link says its shard is at a step,
 * the members of the step before follow in r (qr__sync_put_shard_step):
 * a successor gathering that step applies it everywhere instead. */
void qr__coord_shard_at(qr_ps *ps, int k, qr_rbuf *r);
/* COMMIT and TOKEN go to ps 0 of a sync run: the check of their header. */
int qr__coord_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__coord_commit(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__coord_token(ps_peer *p, const qr_frame *f, const uint8_t *meta);
/* A held push (QR_PUSH_SYNC | QR_PUSH_REPLY_VALUES) on ps 0: kept as
 * any sync push, and committed once every other ps it went to has said it
 * holds it (HELD); answered when the worker's token is granted. */
void qr__coord_held_push(ps_peer *p, const qr_frame *f);
/* Add the coordinator's statistics to a cJSON object. */
void qr__coord_stats_json(qr_ps *ps, struct cJSON *obj);
void qr__coord_peer_lost(ps_peer *p);
/* The ps is stopping: end every token wait with "stopped". */
void qr__coord_stop(qr_ps *ps);
/* Between coord.c (the step), coord_token.c (the token queue) and
 * coord_held.c (held pushes). coord.c: count the push (worker, seq) of
 * m->local_step in the step under way, or drop it as stale, and queue the
 * worker's place in the token queue (held: a held push's answer, given
 * with the token; NULL: a COMMIT, answered there); abort the training
 * (every wait ends with the report). */
void qr__coord_count(qr_ps *ps, ps_peer *p, const qr_frame *f, const qr_msg_commit *m,
                     held_pull *held);
void qr__coord_abort(qr_ps *ps, const char *why);
/* coord_token.c: a token of `step` queued; R = N and no initial tokens
 * (each step every worker once); tokens granted to the places in order
 * and the requests in answered; a place queued for p (*out, unless
 * NULL; QR_EINVAL past PEER_MAX_WAITS, QR_ENOMEM, the error set); every
 * wait ended with status and msg. */
int qr__coord_push_token(ps_sync *s, int64_t step);
bool qr__coord_lockstep(const ps_sync *s);
void qr__coord_serve_waiters(qr_ps *ps);
int qr__coord_add_waiter(ps_sync *s, ps_peer *p, token_waiter **out);
void qr__coord_end_waiters(ps_sync *s, int status, const char *msg);
/* coord_held.c: the other ps answer held push h now (RELEASE) when its
 * step is not done everywhere; a HELD from ps `from` (links.c, through
 * ps->sync.on_held); a step is over: the held pushes it decides judged;
 * every held push ended with status and msg; p's connection lost: its
 * held pushes lose their answers. */
void qr__coord_release_others(qr_ps *ps, const held_pull *h);
void qr__coord_on_held(qr_ps *ps, int from, const uint8_t *meta, uint32_t len);
void qr__coord_judge_commits(qr_ps *ps);
void qr__coord_end_commits(ps_sync *s, int status, const char *msg);
void qr__coord_held_peer_lost(qr_ps *ps, ps_peer *p);

/* ---- checkpoints: ckpt_coord.c decides when and who (ps 0 coordinates),
 * ckpt_write.c writes a ps's own shard(s) (ps k answers CKPT), ckpt_init.c
 * reads the options and restores at start, ckpt_save.c serves SAVE,
 * ckpt_cut.c makes the async cut over several ps, and ckpt_shard.c is one
 * shard's format (its types and calls in ckpt_shard.h). */

/* ckpt_init.c, ckpt_coord.c, ckpt_write.c */
/* Read the options; restore the newest complete checkpoint, if any. */
int qr__ckpt_init(qr_ps *ps);
void qr__ckpt_free(qr_ps *ps);
/* After the loop exists: the timer of an async cut. */
int qr__ckpt_loop_init(qr_ps *ps);
void qr__ckpt_close(qr_ps *ps);
/* ps 0, after the global step advanced: take a checkpoint if one is due. */
void qr__ckpt_step_done(qr_ps *ps);
/* ps 0 asked to stop by a worker's STOP (p, f): if a final checkpoint is
 * to be taken, start it, keep the request and return true (the reply and
 * the stop follow once it is written); false: stop now. p and f NULL: no
 * request to answer (server.c, an orderly end). */
bool qr__ckpt_final(qr_ps *ps, ps_peer *p, const qr_frame *f);
/* Start a checkpoint now (not busy; in sync mode between steps). */
void qr__ckpt_start(qr_ps *ps);
/* The coordinator's successor (failover.c) takes the checkpoints over:
 * the workers' data positions, the newest checkpoint on disk, a fresh
 * chain, the cut's side of the coordinator (async). */
int qr__ckpt_take_over(qr_ps *ps);
/* A worker's push or commit carried its data position. */
void qr__ckpt_data_pos(qr_ps *ps, uint32_t worker, uint64_t pos);
/* ps 0: where the worker's data stream is, as a checkpoint taken now
 * would record it (restored from one until the worker pushes): what a
 * worker starting (or restarted) goes on from. 0 without checkpoints. */
uint64_t qr__ckpt_worker_pos(const qr_ps *ps, int worker);
/* CKPT from ps 0 (ps k), and its reply on ps 0's link. */
int qr__ckpt_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__ckpt_message(ps_peer *p, const qr_frame *f, const uint8_t *meta);
/* ps 0: the callback of every CKPT on a link (qr_link_ckpt_cb): a ps k's
 * answer, or its link lost. */
void qr__ckpt_link_answer(qr_ps *ps, int index, int status, const qr_frame *f,
                          const uint8_t *meta);
void qr__ckpt_peer_lost(ps_peer *p);
void qr__ckpt_stats_json(const qr_ps *ps, struct cJSON *obj);
/* For ckpt_cut.c: this ps's shard at `step`; ps 0: collect the shards of
 * the checkpoint at `step`, or give it up. */
/* base: the id of the checkpoint this one is an increment of, which must
 * be the last this ps took a shard for; 0: a full one. */
int qr__ckpt_start_shard(qr_ps *ps, uint64_t id, int64_t step, uint64_t base);
void qr__ckpt_take(qr_ps *ps, int64_t step);
/* ps 0: ps k writes shards of a checkpoint (it serves its own shard in
 * the view: always with one copy; ps-replicas 2, a failed ps or a
 * replacement serves none, and its shard is written by the ps that
 * serves it, from its promoted copy). */
bool qr__ckpt_writer(const qr_ps *ps, int k);
/* ps k is asked for its part of a checkpoint: it serves a shard, its own
 * (qr__ckpt_writer) or its primary's from a promoted copy. A replacement
 * that holds copies (BACKUP) may serve the second alone: ps 1's,
 * succeeding ps 0 as the coordinator, serves shard 0 and not shard 1. */
bool qr__ckpt_asked(const qr_ps *ps, int k);
/* The shard this ps was promoted to serve, whose copy it writes (and
 * reports the marks of) beside its own; -1: none. */
int qr__ckpt_promoted_shard(const qr_ps *ps);
void qr__ckpt_failed(qr_ps *ps, const char *why);
/* Between ckpt_write.c and ckpt_coord.c, ckpt_init.c: what ckpt_shard.c
 * reads of this ps (its own shard, or copy: the copy of ps `primary`'s
 * it holds, ps-replicas 2); ps 0: shard `index` written by ps `from` (or
 * not: status, error), counted once and only from the ps asked for it;
 * every shard ps `from` was to write, not written. */
ckpt_shard_ctx qr__ckpt_ctx(qr_ps *ps, bool copy);
void qr__ckpt_shard_written(qr_ps *ps, int from, int index, int status, const char *error,
                            const qr_msg_shard *shard);
void qr__ckpt_writer_failed(qr_ps *ps, int from, int status, const char *error);

/* ckpt_save.c: SAVE, a worker asking ps 0 for a checkpoint now. */
void qr__ckpt_save_message(ps_peer *p, const qr_frame *f, const uint8_t *meta);
/* A checkpoint with id `id` ended (written: ok); answer the saves it
 * serves; true if others still wait for a later one. */
bool qr__ckpt_save_done(qr_ps *ps, uint64_t id, bool ok);
void qr__ckpt_save_peer_lost(ps_peer *p);
void qr__ckpt_save_free(qr_ps *ps);

/* ckpt_cut.c: the consistent cut of async checkpoints over several ps. */
int qr__ckpt_cut_init(qr_ps *ps);
/* The coordinator's part of the cut (ps 0 at init, its successor at a
 * takeover); the coordinator that held this ps's pushes for a cut is
 * gone: apply them (ps k, a successor's HELLO). */
int qr__ckpt_cut_coordinate(qr_ps *ps);
void qr__ckpt_cut_coordinator_gone(qr_ps *ps);
void qr__ckpt_cut_close(qr_ps *ps);
void qr__ckpt_cut_free(qr_ps *ps);
void qr__ckpt_cut_begin(qr_ps *ps);
/* An async push is complete: true if it was parked for a cut (the
 * caller leaves its buffers alone; resume applies it later, as the park
 * carries its continuation, so the cut calls nothing of push.c). */
typedef void (*qr_park_resume_cb)(ps_peer *p, const qr_frame *f);
bool qr__ckpt_park(ps_peer *p, const qr_frame *f, qr_park_resume_cb resume);
/* An async push was applied here (or answered as applied already). */
void qr__ckpt_applied(qr_ps *ps, const ps_peer *p);
/* A backup applied the forward of (worker, seq) to its copy (own: a
 * replacement's own shard): once promoted, its report says that part of
 * the call is in the copy. */
void qr__ckpt_forwarded(qr_ps *ps, bool own, uint32_t worker, uint32_t seq);
/* ps 0: a HOLD or QUERY reply; false if none was expected. */
bool qr__ckpt_cut_report(qr_ps *ps, int index, const qr_frame *f, const uint8_t *meta);
void qr__ckpt_cut_link_lost(qr_ps *ps, int index);
/* ps k: HOLD, QUERY, CUT, RELEASE (r is positioned after the head). */
void qr__ckpt_cut_message(ps_peer *p, const qr_frame *f, const qr_msg_ckpt *m, qr_rbuf *r);
void qr__ckpt_cut_peer_lost(ps_peer *p);

/* ckpt_shard.c (the rest of it in ckpt_shard.h): v is about to be changed
 * by an apply; a snapshot still reading its slots gets them as they were. */
int qr__ckpt_before_apply(qr_ps *ps, qr_var *v);

/* metrics.c */
int qr__metrics_init(qr_ps *ps);
void qr__metrics_close(qr_ps *ps);
void qr__metrics_free(qr_ps *ps);
/* A PUSH or PULL was answered: count it and its time since its header. */
void qr__metrics_request(ps_peer *p, const qr_frame *f);

/* liveness.c */
int qr__liveness_init(qr_ps *ps);
/* This ps coordinates (from its start, or since it took the role over):
 * what it keeps of each worker's heartbeats and LEAVE. */
int qr__liveness_coordinate(qr_ps *ps);
void qr__liveness_close(qr_ps *ps);
void qr__liveness_free(qr_ps *ps);
int qr__liveness_beat_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__liveness_beat(ps_peer *p, const qr_frame *f, const uint8_t *meta);
/* ps 0's watch timer, also used by ps k: a run with no worker left, ps 0
 * gone (liveness.c). A peer that said it is the coordinator left. */
void qr__liveness_coordinator_lost(qr_ps *ps);
/* LEAVE: a worker has finished (ps 0). */
void qr__liveness_leave(ps_peer *p, const qr_frame *f, const uint8_t *meta);
/* A worker said HELLO: one that had finished is back (ps 0). */
void qr__liveness_worker_back(qr_ps *ps, int worker);
/* ps 0: worker's last connection closed: it is gone, not silent, so its
 * heartbeat clock stops until it beats again. */
void qr__liveness_worker_gone(qr_ps *ps, int worker);
/* ps 0: end the run in order if the finished workers leave it nothing to
 * do (every worker finished; in sync mode, a step that cannot complete). */
void qr__liveness_end_if_finished(qr_ps *ps);
/* Has this worker said LEAVE? (ps 0; false elsewhere) */
bool qr__liveness_finished(const qr_ps *ps, int worker);

#endif /* QR_PS_INTERNAL_H */

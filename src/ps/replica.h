/*
 * replica.h - replicated shards (--ps-replicas 2, docs/REPLICATION.md):
 * the state a ps keeps for its copies and the calls of the files that
 * make them: replica.c (the primary's link to the backup, the
 * lifecycle), replica_forward.c (the forwards made, the answers that
 * wait for them, exactly once), replica_backup.c (the backup's store,
 * REPLICATE applied, the digests), failover.c (the view, a failed ps's
 * shard served by its backup) and rerep.c (a replacement copied its
 * shards while training goes on). Included by ps_internal.h, whose qr_ps embeds
 * ps_replica; the ps's files include ps_internal.h.
 */
#ifndef QR_PS_REPLICA_H
#define QR_PS_REPLICA_H

#include "common/addr.h"
#include "ps/store.h"
#include "wire/conn.h"
#include "wire/msg.h"

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

typedef struct ps_peer ps_peer;
struct cJSON;

/* Replication (replica.c, docs/REPLICATION.md). With ps-replicas 2 this
 * ps is the primary of its own shard, copied to ps `backup`, and the
 * backup of ps `primary`'s shard, held in `store`, apart from its own. */
typedef struct repl_forward repl_forward;
typedef struct repl_wait repl_wait;
/* Per worker, the pushes applied last (a ring of the last
 * QR_REPL_DUP_WINDOW): a worker may have several pushes in flight to one
 * shard (overlapped layers, non-blocking pushes), and after a failover it
 * resends every one not answered, in any order. */
#define QR_REPL_DUP_WINDOW 64
typedef struct repl_last {
    uint32_t seq[QR_REPL_DUP_WINDOW];   /* the worker's pushes applied here */
    int64_t answer[QR_REPL_DUP_WINDOW]; /* the step each was answered with */
    int n, next;
    /* The coordinator's shard: the worker said it has finished (LEAVE),
     * which a successor of ps 0 must know to end the run as ps 0 would. */
    int finished;
    /* The data position the worker's latest push here carried: what a
     * successor of ps 0 answers a restarted worker with (its READY),
     * as ps 0 did from its own record (qr__ckpt_worker_pos). */
    uint64_t data_pos;
} repl_last;
/* A primary's link to the ps that holds a copy of one of its shards, and
 * the forwards that copy has not applied yet: ps->replica.link carries
 * this ps's own shard to its backup; ps->replica.copy_link, only while a
 * promoted copy is re-replicated (rerep.c), carries that copy to the
 * replacement of the failed ps. */
typedef struct repl_link {
    qr_ps *ps;
    int target;            /* the ps at the other end */
    int shard;             /* the shard it carries */
    bool copy;             /* the promoted copy (ps->replica.store), not ps->store */
    qr_addr addr;
    qr_conn *conn;
    bool connecting, up, closing, retry_on;
    bool draining;         /* stopping: the link stays until the backup has every forward */
    bool gone;             /* no copy there (the target failed, or never joined): nothing
                            * is forwarded, what waited is answered */
    uv_timer_t retry;
    int attempts;
    uint32_t next_id;      /* request ids on the link */
    uint64_t next_fwd;     /* the number the next forward takes (from 1) */
    uint64_t acked;        /* every forward up to this one is applied there */
    repl_forward *fwd_head, *fwd_tail;
    repl_wait *wait_head, *wait_tail;
    uint64_t forwards;
    /* re-replication (rerep.c): the queue starts with a snapshot (its
     * payload the variables' own tensors, held until the copy has it);
     * until the copy has applied the snapshot and every forward made
     * before that (`mark`), pushes are answered at once (the shard is
     * still on one copy: `streaming`) */
    bool streaming;
    bool deferred;         /* its store's checkpoint snapshot was being written: the
                            * copy starts once it is (qr__rerep_resume) */
    uint64_t mark;
    uint64_t snapshot_fwd; /* the snapshot's forward number (0: none) */
    uint64_t target_incarnation; /* the run of the target that holds the copy (0: not met) */
    bool stale;            /* the target answered as a new run (its copy lost): the link
                            * waits for ps 0's view (failed, then a re-replication) */
    /* A partition ps 0 cannot see (qr__replica_backup_silent_ms): when
     * the link went down (0 while up), and when the copy last answered
     * (or a forward was queued behind none). */
    uint64_t down_ns, heard_ns;
} repl_link;
typedef struct ps_replica {
    int copies;            /* ps-replicas: 1 (off) or 2 */
    /* replication-lag (async): a push is answered once the backup is at
     * most this many forwards behind it (0: once it has applied it);
     * pushes so answered, and the most forwards the backup was behind one */
    uint64_t lag;
    uint64_t answered_ahead, lag_seen;
    int backup, primary;   /* (index + 1) mod P, (index - 1) mod P; -1 when off */
    repl_link link;        /* primary: the link to the backup (its shard's forwards) */
    repl_link copy_link;   /* a promoted copy's forwards to the failed ps's replacement */
    bool ever_up;          /* the link to the backup was up once in this run */
    repl_last *last;       /* [workers]: duplicates are answered, not applied */
    uint64_t duplicate_pushes;
    /* backup */
    qr_store store;        /* the copy of ps `primary`'s shard */
    uint64_t primary_incarnation; /* the run of the primary whose forwards it holds */
    uint64_t applied_fwd;  /* the last forward applied: a resent one is answered only */
    uint64_t applied;      /* forwards applied */
    repl_last *backup_last; /* [workers]: the primary's record, as forwarded */
    int64_t copy_steps;    /* the primary's steps applied (Adam's t), as forwarded */
    /* the copy of the coordinator's shard (async): the global step the
     * coordinator answered its last step push with, as forwarded; what
     * a successor coordinator goes on from (REPLICATION.md, "ps 0's
     * coordinator failover") */
    int64_t coord_step;
    uint64_t probe_ns;     /* the successor's last look at a lost coordinator's address */
    /* a replacement (rerep.c): its own shard's copy, fed by the ps that
     * serves it (ps `backup`, promoted), on a link of its own */
    uint64_t own_incarnation, own_applied_fwd;
    bool digests_logged;
    /* the view (failover.c): its number, the state of each ps
     * (QR_PS_ALIVE, _FAILED, _JOINING, _BACKUP), and what it made of this
     * ps: the primary of its copy (promoted: it serves ps `primary`'s
     * shard from `store`), or a primary whose backup is gone (its shard on
     * one copy: nothing forwarded) */
    uint64_t view;
    uint8_t *failed;       /* [nps] */
    bool promoted;
    /* ps 0 (rerep.c): per ps joining, the copies made so far (bit 0: its
     * own shard's, from the ps serving it; bit 1: its neighbour's) */
    uint8_t *rejoin_done;  /* [nps] */
    /* pushes applied (duplicates not counted): to this ps's own shard,
     * and to its copy of ps `primary`'s (forwarded, then served) */
    uint64_t own_pushes, copy_pushes;
} ps_replica;
/* A ps's state in the view (ps_replica.failed[k]): serving as placed;
 * failed (its shard served by its backup); a replacement being copied
 * the shards it backs up; a replacement that holds them (the backup of
 * its own shard, which ps (k+1) mod P serves, and of ps (k-1)'s). */
#define QR_PS_ALIVE 0
#define QR_PS_FAILED 1
#define QR_PS_JOINING 2
#define QR_PS_BACKUP 3

/* rerep.c: a source's answer to the VIEW that started its copy, held until
 * the copy is made. */
typedef struct ps_rerep_report {
    ps_peer *peer;
    qr_frame req;
} ps_rerep_report;

/* failover.c: --ps-replicas 2, async (docs/REPLICATION.md, "Failover"). */
/* ps 0: ps k is dead or hung: true if it is failed over (the view moves;
 * qr_link_lost_cb). */
bool qr__failover_lost(qr_ps *ps, int k, int why);
/* The ps that holds the copy of the coordinator's shard (shard 0) in this
 * ps's view, which succeeds the coordinator should it die: ps 1 while ps 0
 * coordinates; ps 0's replacement, once it holds shard 0's copy again,
 * while ps 1 does. -1: none (shard 0 on one copy). */
int qr__failover_successor(const qr_ps *ps);
/* The coordinator's successor, from its watch: the coordinator lost and
 * dead (its address refusing)? Then it takes the coordinator's role and
 * fails it over (async or sync; with --checkpoint-dir unless it would
 * serve no shard of its own). True if it did. */
bool qr__failover_successor_watch(qr_ps *ps, uint64_t now);
/* ps k: a coordinator's HELLO from another ps than the coordinator: its
 * successor, taking over? (true: followed from now on) */
bool qr__failover_successor_hello(qr_ps *ps, const qr_msg_hello *m);
/* ps 0's run after a rollback: the view of the start, numbered after
 * view_before (the run before's last). */
void qr__failover_rolled_back(qr_ps *ps, uint64_t view_before);
/* A worker's HELLO: of the view and a shard served here? (QR_EVIEW with
 * the error set if not; p->promoted_shard set for a promoted one) */
int qr__failover_hello(ps_peer *p, const qr_msg_hello *m);
/* After the welcome: ps 0 tells a worker of an old view the view. */
void qr__failover_welcomed(ps_peer *p, const qr_msg_hello *m);
/* VIEW: from ps 0's link (the new view), or a worker asking for it. */
int qr__failover_view_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__failover_view_message(ps_peer *p, const qr_frame *f, const uint8_t *meta);

/* replica.c, replica_forward.c, replica_backup.c: ps-replicas 2
 * (docs/REPLICATION.md). */
/* Read ps-replicas (checked against the cluster and the other options). */
int qr__replica_init(qr_ps *ps);
/* Once the loop runs: the primary opens its link to the backup. */
int qr__replica_start(qr_ps *ps);
void qr__replica_stop(qr_ps *ps);
/* Stopping, its forwards not all applied by the backup yet: the ps waits
 * for them (up to linger-ms) before it ends. */
bool qr__replica_busy(const qr_ps *ps);
void qr__replica_close(qr_ps *ps);
void qr__replica_free(qr_ps *ps);
/* A HELLO of role QR_ROLE_REPLICA: from this ps's primary? (the error set) */
int qr__replica_hello(ps_peer *p, const qr_msg_hello *m);
/* (worker, seq) was applied to p's shard already (this ps's own, or the
 * copy it was promoted to serve): *answer, the step it was answered
 * with. Any index off the wire. */
bool qr__replica_duplicate(ps_peer *p, uint32_t worker, uint32_t seq, int64_t *answer);
/* Forwarding, primary side, in apply order: begin, add each item (its
 * bytes copied; data NULL: its bytes are lent, qr__replica_lend), send. A LOOKUP's sightings: one item of kind
 * QR_REPL_LOOKUP. An allocation failure aborts the run (the copies would
 * differ). */
repl_forward *qr__replica_begin(qr_ps *ps, const qr_msg_repl_head *head);
void qr__replica_add(repl_forward *fw, uint32_t id, uint32_t kind, float lr, const void *data,
                     uint64_t nbytes);
void qr__replica_send(qr_ps *ps, repl_forward *fw);
/* The coordinator's forward of what is not a push (a worker's LEAVE) to
 * the copy of shard 0, which its successor holds. */
void qr__replica_send_shard0(qr_ps *ps, repl_forward *fw);
/* The per-worker record of shard 0 held here (this ps's own on ps 0, the
 * copy's on ps 1): what a successor of the coordinator goes on from (the
 * workers that had finished, their data positions). */
repl_last *qr__replica_shard0_record(qr_ps *ps);
/* p's shard has a copy to forward to: a forward sent is kept until the
 * copy has it (without one it is freed as it is sent). */
bool qr__replica_keeps(ps_peer *p);
/* A CREATE applied here: the same meta, payload = each dense variable's
 * values in record order, applied on the backup by create.c. */
void qr__replica_forward_create(ps_peer *p, const qr_frame *f, const uint8_t *meta);
/* The push (worker, seq) was applied to p's shard and answered with
 * `answer`. */
void qr__replica_applied(ps_peer *p, uint32_t worker, uint32_t seq, int64_t answer);
/* The view moved (failover.c): this ps serves its copy of ps `primary`'s
 * shard from now on (forwards and replica links of the old primary are
 * refused: QR_EVIEW); or its own backup has failed (its shard goes on,
 * on one copy: nothing is forwarded, and what waited for the backup is
 * answered). */
void qr__replica_promote(qr_ps *ps);
void qr__replica_backup_gone(qr_ps *ps);
/* The answer to request f of p waits until the backup has applied every
 * forward sent so far (at once when it has): cb then answers it (status
 * QR_OK), or says why not; p NULL: the peer is gone (cb frees ctx). */
typedef void (*qr_repl_answer_cb)(ps_peer *p, const qr_frame *req, void *ctx, int status,
                                  const char *msg);
void qr__replica_wait(ps_peer *p, const qr_frame *f, qr_repl_answer_cb cb, void *ctx);
/* An async push's answer: the same wait, less replication-lag forwards
 * (the backup may be that many behind it when it is answered). */
void qr__replica_wait_lagging(ps_peer *p, const qr_frame *f, qr_repl_answer_cb cb, void *ctx);
void qr__replica_peer_lost(ps_peer *p);
/* The same wait with no request (ps 0's own part of a sync step): cb runs
 * with p and req NULL. */
void qr__replica_after(qr_ps *ps, qr_repl_answer_cb cb, void *ctx);
/* The same two waits on the promoted copy's link (copy_link: to the
 * failed primary's replacement; at once while there is none). */
void qr__replica_wait_copy(ps_peer *p, const qr_frame *f, qr_repl_answer_cb cb, void *ctx);
void qr__replica_after_copy(qr_ps *ps, qr_repl_answer_cb cb, void *ctx);
/* REPLICATE, on the backup. */
int qr__replica_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__replica_message(ps_peer *p, const qr_frame *f, const uint8_t *meta);
/* Re-replication (replica.c's side): a link's copy is gone (the target
 * failed: its forwards dropped, what waited answered; returns how many
 * were dropped); a link opened again with `snapshot` at the head of its
 * queue (numbered), to a replacement; the snapshot's forward made
 * (type SNAPSHOT) and the link opened; its meta, and its payload
 * (qr__replica_lend). */
uint64_t qr__replica_link_gone(repl_link *L);
repl_forward *qr__replica_snapshot_forward(repl_link *L);
void qr__replica_snapshot_meta(repl_forward *fw, const qr_wbuf *meta);
void qr__replica_link_flush(repl_link *L);
/* A forward of p's shard: to the backup of this ps's own shard, or (a
 * promoted shard) to the replacement being copied it. */
void qr__replica_send_for(ps_peer *p, repl_forward *fw);

/* Between replica.c, replica_forward.c and replica_backup.c. A forward
 * queued on a link until its copy has applied it, and an answer waiting
 * for the forwards made before it. */
struct repl_forward {
    repl_forward *next;
    uint8_t type;        /* QR_MSG_REPLICATE or QR_MSG_CREATE */
    uint64_t fwd;
    uint32_t request_id; /* of its last send */
    int sending;         /* sends whose callback has not run */
    bool acked;
    qr_msg_repl_head head;
    qr_wbuf items;       /* REPLICATE: the item records; CREATE: the meta */
    qr_wbuf payload;
    /* SNAPSHOT: the payload as buffers another owns (a snapshot's
     * references, rerep.c), let go with release(owner) when freed */
    qr_iov *iov;
    int niov;
    void (*release)(void *owner);
    void *owner;
};

struct repl_wait {
    repl_wait *next;
    ps_peer *peer;       /* NULL once it is gone */
    qr_frame req;
    uint64_t fwd;        /* answered once the backup has applied this forward, */
    uint64_t lag;        /* less this many (replication-lag) */
    qr_repl_answer_cb cb;
    void *ctx;
};
/* replica.c: out of memory making a forward (the run aborts: the copies
 * would differ); fw numbered and queued on L, sent when L is up (freed at
 * once when L has no copy). */
void qr__replica_fail_forward(qr_ps *ps);
void qr__replica_link_send(repl_link *L, repl_forward *fw);
/* A link given up (gone) made again, with no snapshot: its target holds
 * the same copy as this ps (failover.c: a replacement refused by its
 * backup, then the cluster rolled back to a checkpoint, both copies
 * restored from it). */
void qr__replica_link_again(repl_link *L);
/* replica.c: the payload of fw (a snapshot, or a forward whose items
 * were added with no data) is niov buffers (iov taken) that owner holds,
 * sent from where they are; release(owner) once fw is freed (at once if
 * fw is NULL). */
void qr__replica_lend(repl_forward *fw, qr_iov *iov, int niov, void (*release)(void *owner),
                      void *owner);
/* replica_forward.c: a wait for forward `fwd` of L answered: counted when
 * the backup has not applied it yet (replication-lag). */
void qr__replica_note_answer(repl_link *L, uint64_t fwd);
/* replica_forward.c: (worker, seq), answered with `answer`, recorded in
 * `last` (the exactly-once ring of each worker), with the data position
 * the push carried. */
void qr__replica_record_last(repl_last *last, int nworkers, uint32_t worker, uint32_t seq,
                             int64_t answer, uint64_t data_pos);

/* rerep.c: re-replication (docs/REPLICATION.md, "Re-replication"). */
/* Source: take the snapshot of L's shard and stream it to L's target,
 * then the forwards made since; qr__rerep_acked on each forward the
 * target applies while it is being copied. */
void qr__rerep_start(repl_link *L);
void qr__rerep_acked(repl_link *L);
/* ps 0: failed ps k answers its link again, a new run: it joins (true),
 * marked QR_PS_JOINING in the next view. A source's answer to that VIEW
 * (meta: joiner, which copy) says a copy is made. */
bool qr__rerep_joined(qr_ps *ps, int k);
void qr__rerep_view_answer(qr_ps *ps, int from, int status, const uint8_t *meta, uint32_t len);
/* Source ps k: hold the answer to VIEW f until the copy it started is
 * made (false: nothing to wait for). */
bool qr__rerep_hold_view(ps_peer *p, const qr_frame *f);
void qr__rerep_peer_lost(ps_peer *p);
void qr__rerep_close(qr_ps *ps);
/* L's copy is given up: a copy waiting for a checkpoint's write to end
 * is not started (a snapshot sent goes with the link's forwards). */
void qr__rerep_abandon(repl_link *L);
/* A checkpoint's shards are written (ckpt_coord.c): a copy that waited
 * for its store's snapshot to be free starts now. */
void qr__rerep_resume(qr_ps *ps);
/* A worker's HELLO for this ps's own shard, before this ps knows it
 * serves it (its backup has not accepted its replica link yet, and ps 0
 * has told it no view): held (true), and answered by
 * qr__rerep_release_hellos once it knows; a replacement started at a
 * failed ps's address must not serve a worker that has not heard of the
 * failover. */
bool qr__rerep_hold_hello(ps_peer *p, const qr_frame *f, const uint8_t *meta);
void qr__rerep_release_hellos(qr_ps *ps);
/* ps 0 stopping: the replacements (no worker's stop reaches them) are
 * stopped on ps 0's links. */
void qr__rerep_stop(qr_ps *ps);
/* The replacement: a replica HELLO that copies its own shard (cause =
 * shard + 1); SNAPSHOT, loaded into the store the link copies. */
int qr__rerep_hello(ps_peer *p, const qr_msg_hello *m);
int qr__rerep_snapshot_header(ps_peer *p, const qr_frame *f, const uint8_t *meta);
/* A SNAPSHOT's payload so far (the `payload` event): once its head is in,
 * its tensors are given their places in the store being made. */
void qr__rerep_snapshot_payload(ps_peer *p, uint64_t got);
void qr__rerep_snapshot_message(ps_peer *p, const qr_frame *f, const uint8_t *meta);
/* failover.c, for rerep.c: apply the view to this ps; tell the workers. */
void qr__failover_apply(qr_ps *ps);
void qr__failover_notify_workers(qr_ps *ps);

/* How long this ps's link to the backup of its own shard has been silent
 * (ms): down, or up with forwards the backup has not answered; 0 when it
 * is fine, has never been up, or carries nothing to wait for (a backup
 * gone, a copy being streamed). ps 0 hears it in each BEAT's answer. */
uint64_t qr__replica_backup_silent_ms(const qr_ps *ps, uint64_t now);
/* ps 0: ps `primary`'s link to its backup has been silent for silent_ms
 * (its BEAT's answer, or ps 0's own link): past heartbeat-timeout-ms,
 * while ps 0 reaches both, a partition between them; one side is failed
 * over (failover.c). */
void qr__failover_backup_silent(qr_ps *ps, int primary, uint64_t silent_ms);
/* The same, the answer to a BEAT from ps `index` (qr_link_beat_cb). */
void qr__failover_beat_answer(qr_ps *ps, int index, const uint8_t *meta, uint32_t len);

/* A store's params digest: FNV-1a of every dense variable's values in id
 * order (the trainer's params_digest), then every table row's id and
 * values in the table's order. */
uint64_t qr__store_digest(const qr_store *s);
/* "digest %016llx" of a store of `bytes` for a log line, into buf, or,
 * above 64 MiB, why not (rerep.c): the digest reads every byte on the
 * loop, which a failover or a copy must not stall. */
const char *qr__store_digest_note(const qr_store *s, size_t bytes, char *buf, size_t len);
/* The copies' statistics: per shard held, its role and digest. */
void qr__replica_stats_json(qr_ps *ps, struct cJSON *obj);

#endif /* QR_PS_REPLICA_H */

/*
 * coord_held.c - held pushes on ps 0 (a sync push-and-pull in one round
 * trip, docs/SYNC.md): what each ps the push went to said of it (HELD,
 * on ps 0's links), until it is counted in the step's quorum (coord.c);
 * its answer then waits for the worker's token (coord_token.c).
 *
 * A held push goes to every ps that holds its variables and to ps 0
 * always; each ps k keeps it for its step and says so (HELD). ps 0 counts
 * it (qr__coord_count) once its own part is in and every other ps the
 * push went to has said what it did with it: so a gradient is in a quorum
 * only when every ps that should have it has it. Its answer waits for the
 * worker's token: the token is implied by the answer. A ps k answers once
 * the push's step is applied there; when ps 0 answers before that (a
 * token of an earlier step: initial tokens, fewer workers than replicas,
 * a refusal), it tells the others to answer now (RELEASE), as a TOKEN
 * then a PULL would have read them.
 */
#include "ps/ps_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct held_commit {
    struct held_commit *next;
    uint32_t worker, seq;
    int64_t local_step;
    uint64_t data_pos;
    held_pull *own;  /* ps 0's part, the answer to give; NULL until it is in */
    int nparts;      /* the ps tasks the push went to, ps 0 included */
    int noted;       /* how many of the others said what they did with it */
    int refused;     /* the first refusal one of them noted, and why */
    char why[512];
    uint8_t from[];  /* per ps: it has noted */
} held_commit;

static held_commit *find_commit(qr_ps *ps, uint32_t worker, uint32_t seq, bool make) {
    ps_sync *s = &ps->sync;
    for (held_commit *c = s->commits; c; c = c->next)
        if (c->worker == worker && c->seq == seq) return c;
    if (!make) return NULL;
    held_commit *c = qr__calloc(1, sizeof *c + (size_t)ps->cluster->nps);
    if (!c) return NULL;
    c->worker = worker;
    c->seq = seq;
    c->next = s->commits;
    s->commits = c;
    return c;
}

static void drop_commit(ps_sync *s, held_commit *c) {
    held_commit **link = &s->commits;
    while (*link != c) link = &(*link)->next;
    *link = c->next;
    free(c->own);
    free(c);
}

void qr__coord_free(qr_ps *ps) {
    /* Held pushes still waiting for the other ps tasks' HELD (a run that
     * aborted): their peers are gone, so nothing is answered. */
    ps_sync *s = &ps->sync;
    while (s->commits) drop_commit(s, s->commits);
}

/* The other ps tasks answer the held push now (RELEASE) when its step is
 * not done everywhere: the answer of ps 0 is going ahead of it. */
void qr__coord_release_others(qr_ps *ps, const held_pull *h) {
    if (h->step < ps->global_step) return;
    qr__links_release(ps, h->worker, h->seq);
    /* Its parts of the shards this ps holds besides the coordinator's own:
     * a copy it serves since a failover, or, on the coordinator's
     * successor, its own shard. */
    qr__sync_release(ps, h->worker, h->seq);
}

/* Commit c if every ps has said what it did with it (or its step is over:
 * a HELD lost with a link cannot hold up a stale push). */
static void try_commit(qr_ps *ps, held_commit *c) {
    ps_sync *s = &ps->sync;
    if (!c->own) return;
    bool over = c->local_step < ps->global_step;
    if (c->noted < c->nparts - 1 && !over) return;
    held_pull *h = c->own;
    c->own = NULL;
    int refused = c->refused;
    char why[sizeof c->why];
    memcpy(why, c->why, sizeof why);
    qr_msg_commit m = {.worker = c->worker, .seq = c->seq, .local_step = c->local_step,
                       .data_pos = c->data_pos};
    drop_commit(s, c);
    if (refused) {
        qr__coord_release_others(ps, h);
        qr__held_fail(h, refused, why);
        return;
    }
    qr__coord_count(ps, h->peer, &h->req, &m, h);
}

/* The coordinator's own part of a held push (shard 0's), kept here and,
 * with two copies, waiting for the backup to hold it too. */
typedef struct own_part {
    qr_ps *ps;
    held_pull *h;
    uint32_t worker, seq;
    int64_t local_step;
    uint64_t data_pos;
    int nparts;
} own_part;

static void own_part_copied(ps_peer *p, const qr_frame *req, void *ctx, int status,
                            const char *msg) {
    (void)req;
    own_part *o = ctx;
    qr_ps *ps = o->ps;
    held_pull *h = o->h;
    held_commit *c = p && !status ? find_commit(ps, o->worker, o->seq, true) : NULL;
    if (!p) { /* its connection is lost, and the answer with it */
        free(h);
    } else if (status) {
        qr__coord_release_others(ps, h);
        qr__held_fail(h, status, msg);
    } else if (!c) {
        qr__coord_release_others(ps, h);
        qr__held_fail(h, QR_ENOMEM, "out of memory holding a push-and-pull");
    } else if (c->own) {
        qr__held_fail(h, QR_EINVAL, "PUSH: this push is held already");
    } else {
        c->own = h;
        c->local_step = o->local_step;
        c->data_pos = o->data_pos;
        c->nparts = o->nparts;
        free(o);
        try_commit(ps, c);
        return;
    }
    free(o);
}

void qr__coord_held_push(ps_peer *p, const qr_frame *f) {
    qr_ps *ps = p->ps;
    ps_sync *s = &ps->sync;
    const sync_push *in = p->incoming;
    uint32_t worker = in->worker, seq = in->seq;
    int64_t local_step = in->local_step;
    int held = 0;
    for (const token_waiter *w = s->waiters; w; w = w->next) held += w->peer == p;
    for (const held_commit *c = s->commits; c; c = c->next) held += c->own && c->own->peer == p;
    char msg[512];
    int rc = QR_OK;
    bool applied = false, resent = false;
    if (held >= PEER_MAX_WAITS) {
        qr__grad_check_finish(&p->check, f->payload_len);
        qr__sync_push_free(ps, p->incoming);
        p->incoming = NULL;
        rc = QR_EINVAL;
        snprintf(msg, sizeof msg, "%s: PUSH: this connection holds %d sync push-and-pulls "
                 "waiting for their token already (at most %d)", ps->name, held, PEER_MAX_WAITS);
    } else if (!(resent = qr__sync_take_resent(p, f, &applied))) {
        rc = qr__sync_push_keep(p, f, msg, sizeof msg);
    }
    /* A push sent again after its connection was lost (ps 0 closed it:
     * a worker declared hung) is answered as the original: a member of
     * the quorum under way gets its place in the token queue back; one of
     * the step just done, its answer now with that step's token (the
     * original's answer, lost with the connection, took one); one not
     * counted yet waits for what the others said of it (held_commit). */
    bool counted = false;
    for (int i = 0; i < s->nquorum && !rc; i++)
        counted |= s->quorum[i].worker == worker && s->quorum[i].seq == seq;
    counted &= local_step == ps->global_step;
    if (counted || applied) {
        ps->replica.duplicate_pushes += !resent; /* (nothing of it kept here to find) */
        held_pull *h = qr__held_new(p, f, worker, seq, local_step, p->items, p->nitems);
        if (!h) {
            qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory holding a push-and-pull");
        } else if (counted) {
            qr_msg_commit m = {.worker = worker, .seq = seq, .local_step = local_step,
                               .data_pos = p->push_data_pos};
            qr__coord_count(ps, p, f, &m, h);
        } else {
            qr__held_answer(h, ps->global_step);
        }
        return;
    }
    held_commit *c = find_commit(ps, worker, seq, !rc || rc == QR_ESTALE);
    held_pull *h = NULL;
    if (!rc || rc == QR_ESTALE) {
        h = qr__held_new(p, f, worker, seq, local_step, p->items, p->nitems);
        if (!h || !c) {
            free(h);
            rc = QR_ENOMEM;
            snprintf(msg, sizeof msg, "out of memory holding a push-and-pull");
        }
    }
    if (rc && rc != QR_ESTALE) {
        if (c) drop_commit(s, c);
        qr__links_release(ps, worker, seq);
        qr__peer_reply_error(p, f, rc, msg);
        return;
    }
    if (c->own) { /* the same (worker, seq) held twice */
        free(h);
        qr__peer_reply_error(p, f, QR_EINVAL, "PUSH: this push is held already");
        return;
    }
    c->local_step = local_step; /* (kept until its step is over: judge_commits) */
    own_part *o = qr__calloc(1, sizeof *o);
    if (!o) {
        drop_commit(s, c);
        free(h);
        qr__links_release(ps, worker, seq);
        qr__peer_reply_error(p, f, QR_ENOMEM, "out of memory holding a push-and-pull");
        return;
    }
    *o = (own_part){.ps = ps, .h = h, .worker = worker, .seq = seq, .local_step = local_step,
                    .data_pos = p->push_data_pos,
                    .nparts = (int)QR_MIN(QR_MAX(p->push_nparts, 1u), (uint32_t)ps->cluster->nps)};
    /* With two copies it counts once the backup holds it too, as the other
     * shards' HELD comes once theirs do: a step's members are then on
     * shard 0's copy, which a successor applies the step in flight from
     * (failover.c). A stale one kept nothing: at once. */
    if (!rc && qr__replica_on(ps)) qr__replica_wait(p, f, own_part_copied, o);
    else own_part_copied(p, f, o, QR_OK, NULL);
}

/* A HELD from ps `from` (links.c). */
void qr__coord_on_held(qr_ps *ps, int from, const uint8_t *meta, uint32_t len) {
    qr_rbuf r;
    qr_rbuf_init(&r, meta, len);
    qr_msg_held m;
    qr_msg_get_held(&r, &m);
    if (r.bad || from < 1 || from >= ps->cluster->nps) return;
    if (m.local_step >= 0 && m.local_step < ps->global_step - 1) return; /* long over */
    held_commit *c = find_commit(ps, m.worker, m.seq, true);
    if (!c) {
        qr__coord_abort(ps, "out of memory for a held push");
        return;
    }
    if (!c->own && m.local_step >= 0) c->local_step = m.local_step;
    if (c->from[from]) return; /* said again after its link was remade */
    c->from[from] = 1;
    c->noted++;
    if (m.status && m.status != QR_ESTALE && !c->refused) {
        c->refused = m.status;
        snprintf(c->why, sizeof c->why, "ps %d: %.*s", from, (int)QR_MIN(r.left, 400u),
                 (const char *)meta + QR_MSG_HELD_LEN);
    }
    try_commit(ps, c);
}

/* A step is over: held pushes waiting for a HELD that a lost link took
 * can be judged (stale), and what other ps tasks said of pushes whose
 * own part never came (a worker that died mid-call) is forgotten. */
void qr__coord_judge_commits(qr_ps *ps) {
    ps_sync *s = &ps->sync;
    held_commit *c = s->commits;
    while (c) {
        held_commit *next = c->next;
        if (c->own) try_commit(ps, c);
        else if (c->local_step < ps->global_step) drop_commit(s, c);
        c = next;
    }
}

void qr__coord_end_commits(ps_sync *s, int status, const char *msg) {
    while (s->commits) {
        held_commit *c = s->commits;
        if (c->own) qr__held_fail(c->own, status, msg);
        c->own = NULL;
        drop_commit(s, c);
    }
}

/* p's connection is lost (qr__coord_peer_lost): its held pushes not
 * counted yet lose their answers. */
void qr__coord_held_peer_lost(qr_ps *ps, ps_peer *p) {
    ps_sync *s = &ps->sync;
    for (held_commit *c = s->commits; c; c = c->next)
        if (c->own && c->own->peer == p) {
            free(c->own);
            c->own = NULL;
        }
}

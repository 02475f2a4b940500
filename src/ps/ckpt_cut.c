/*
 * ckpt_cut.c - the consistent cut of an async checkpoint over several ps
 * tasks: every push call of a worker is in the checkpoint on every shard
 * it reached, or on none.
 *
 * A worker's push call (qr_worker_push) sends one PUSH per ps it touches,
 * all named (worker, seq) and each saying how many ps the call reached
 * (nparts); the worker makes its next call only once every part is
 * answered. So at any moment at most one call per worker is partly
 * applied: applied on some ps, still travelling to others.
 *
 *   1. HOLD. ps 0 asks every ps (itself included) to hold: from now on a
 *      whole async push is parked instead of applied, and not answered
 *      (qr__ckpt_park; its connection stops being read). Each ps reports
 *      per worker its last applied push (seq, nparts, data position),
 *      whether the worker is connected, and every push it has parked.
 *   2. Decide. For each worker, its latest applied call S is the newest
 *      seq any ps applied. If the ps that applied S plus those that parked
 *      S make nparts, the call is whole and S belongs to the cut; parked
 *      pushes of S (and older) are applied before the shard is taken, the
 *      newer ones after. If parts of S are still travelling, ps 0 asks
 *      again (QUERY, every millisecond) until they have been parked. A
 *      worker connected to no ps has nothing more coming: what arrived is
 *      all there will ever be, and the live state holds the same.
 *      Holding longer than CUT_GIVE_UP_MS (a worker stuck halfway through
 *      sending) gives the cut up (RELEASE) with a warning: no checkpoint
 *      rather than a torn one.
 *   3. CUT. ps 0 applies its included parked pushes, reads the global step,
 *      and sends CUT(step, per worker: include, seq) to the others. Each
 *      applies its included parked pushes, takes its shard, applies the
 *      rest, and serves again. The shards are written as in sync mode.
 * Pulls are served all along; only applies wait, for a round trip or two
 * between the ps tasks.
 *
 * With --ps-replicas 2 a call's parts are per shard (a worker sends the
 * part of a shard served by a promoted copy on a connection of its own):
 * a promoted ps reports its marks twice, its own shard's and the copy's
 * (copy_marks); a backup marks each forward it applies (FORWARDED: a part
 * the copy holds, whose nparts it does not know), so that once promoted
 * the calls its primary applied before dying count as whole; ps 0 asks
 * only the ps that serve shards (qr__ckpt_asked). A replacement that
 * holds copies (BACKUP) and serves a promoted copy reports that copy's
 * marks alone: its own store's are forwards of a shard another ps serves.
 */
#include "ps/ps_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Past this, a cut waiting for the rest of a push call is given up. */
#define CUT_GIVE_UP_MS 2000
#define CUT_POLL_MS 1

typedef struct parked_push {
    struct parked_push *next;
    ps_peer *p;
    qr_frame f;
    qr_park_resume_cb resume; /* applies it, once the cut is decided */
} parked_push;

/* a is newer than b (seqs wrap; a worker's are increasing). */
static bool seq_after(uint32_t a, uint32_t b) {
    return (int32_t)(a - b) > 0;
}

/* ---- every ps: parking ----------------------------------------------------- */

bool qr__ckpt_park(ps_peer *p, const qr_frame *f, qr_park_resume_cb resume) {
    ps_ckpt *c = &p->ps->ckpt;
    if (!c->holding || p->parked) return false;
    parked_push *pp = qr__calloc(1, sizeof *pp);
    if (!pp) {
        c->park_failed = true; /* applied now: this cut would be torn */
        return false;
    }
    pp->p = p;
    pp->f = *f;
    pp->resume = resume;
    if (c->parked_tail) c->parked_tail->next = pp;
    else c->parked = pp;
    c->parked_tail = pp;
    p->parked = true;
    qr_conn_pause(p->conn);
    return true;
}

/* Apply a parked push as it would have been, and serve its connection again. */
static void unpark(qr_ps *ps, parked_push *pp) {
    ps_peer *p = pp->p;
    p->parked = false;
    pp->resume(p, &pp->f);
    qr__peer_release_recv(p);
    qr_conn_resume(p->conn);
    free(pp);
    (void)ps;
}

/* Apply the parked pushes the cut includes (include == NULL: all of
 * them), in the order they arrived. */
static void apply_parked(qr_ps *ps, const qr_msg_cut *cut) {
    ps_ckpt *c = &ps->ckpt;
    parked_push **link = &c->parked;
    c->holding = false; /* so that the push's resume applies it */
    while (*link) {
        parked_push *pp = *link;
        uint32_t w = pp->p->push_worker;
        bool in = !cut || (qr__is_worker(w, ps->cluster->nworkers) && cut[w].include &&
                           !seq_after(pp->p->push_seq, cut[w].seq));
        if (!in) {
            link = &pp->next;
            continue;
        }
        *link = pp->next;
        unpark(ps, pp);
    }
    c->parked_tail = NULL;
    for (parked_push *pp = c->parked; pp; pp = pp->next) c->parked_tail = pp;
    c->holding = cut != NULL; /* the excluded ones wait for the shard */
}

void qr__ckpt_applied(qr_ps *ps, const ps_peer *p) {
    ps_ckpt *c = &ps->ckpt;
    uint32_t w = p->push_worker;
    if (!qr__is_worker(w, ps->cluster->nworkers)) return;
    /* a push to the shard this ps was promoted to serve is a part of its
     * call of its own (the worker counts shards) */
    qr_msg_mark *marks = p->promoted_shard ? c->copy_marks : c->marks;
    /* a duplicate resent after a failover may be older than the last */
    if (marks && (marks[w].flags & QR_MARK_APPLIED) && seq_after(marks[w].seq, p->push_seq))
        return;
    qr__ckpt_data_pos(ps, w, p->push_data_pos);
    if (marks)
        marks[w] = (qr_msg_mark){.worker = w, .flags = QR_MARK_APPLIED, .seq = p->push_seq,
                                    .nparts = p->push_nparts, .data_pos = p->push_data_pos};
}

void qr__ckpt_cut_peer_lost(ps_peer *p) {
    ps_ckpt *c = &p->ps->ckpt;
    parked_push **link = &c->parked;
    while (*link) {
        parked_push *pp = *link;
        if (pp->p == p) {
            *link = pp->next;
            free(pp);
        } else {
            link = &pp->next;
        }
    }
    c->parked_tail = NULL;
    for (parked_push *pp = c->parked; pp; pp = pp->next) c->parked_tail = pp;
    p->parked = false;
}

void qr__ckpt_forwarded(qr_ps *ps, bool own, uint32_t worker, uint32_t seq) {
    ps_ckpt *c = &ps->ckpt;
    qr_msg_mark *marks = own ? c->marks : c->copy_marks;
    if (!marks || !qr__is_worker(worker, ps->cluster->nworkers)) return;
    marks[worker] = (qr_msg_mark){.worker = worker, .flags = QR_MARK_APPLIED | QR_MARK_FORWARDED,
                                  .seq = seq};
}

/* This ps's report: a mark per worker for each shard it serves (its own,
 * the promoted copy's), then one per parked push. */
static void put_report(qr_ps *ps, qr_wbuf *b) {
    ps_ckpt *c = &ps->ckpt;
    bool own = qr__ckpt_writer(ps, ps->index);
    /* (the shard written from the copy: a primary's copy promoted while
     * that primary, or its replacement, serves nothing) */
    bool copy = c->copy_marks && qr__ckpt_promoted_shard(ps) >= 0;
    uint32_t n = (uint32_t)ps->cluster->nworkers * ((own ? 1 : 0) + (copy ? 1 : 0));
    for (parked_push *pp = c->parked; pp; pp = pp->next) n++;
    qr_msg_put_count(b, n);
    for (int i = own ? 0 : 1; i < (copy ? 2 : 1); i++) {
        for (int w = 0; w < ps->cluster->nworkers; w++) {
            qr_msg_mark m = i ? c->copy_marks[w] : c->marks[w];
            m.worker = (uint32_t)w;
            if (ps->worker_conns[w] > 0) m.flags |= QR_MARK_CONNECTED;
            qr_msg_put_mark(b, &m);
        }
    }
    for (parked_push *pp = c->parked; pp; pp = pp->next)
        qr_msg_put_mark(b, &(qr_msg_mark){.worker = pp->p->push_worker, .flags = QR_MARK_PARKED,
                                          .seq = pp->p->push_seq, .nparts = pp->p->push_nparts,
                                          .data_pos = pp->p->push_data_pos});
}

/* ---- ps k: CKPT phases of an async cut -------------------------------------- */

void qr__ckpt_cut_message(ps_peer *p, const qr_frame *f, const qr_msg_ckpt *m, qr_rbuf *r) {
    qr_ps *ps = p->ps;
    ps_ckpt *c = &ps->ckpt;
    if (m->phase == QR_CKPT_HOLD || m->phase == QR_CKPT_QUERY) {
        if (m->phase == QR_CKPT_HOLD) {
            c->holding = true;
            c->park_failed = false;
        }
        qr_wbuf out = {0};
        put_report(ps, &out);
        qr__peer_reply(p, f, QR_OK, &out, NULL, 0, NULL, NULL);
        qr_wbuf_free(&out);
        return;
    }
    if (m->phase == QR_CKPT_RELEASE) {
        apply_parked(ps, NULL);
        qr__peer_reply(p, f, QR_OK, NULL, NULL, 0, NULL, NULL);
        return;
    }
    /* CUT */
    int nw = ps->cluster->nworkers;
    qr_msg_cut *cut = qr__calloc((size_t)QR_MAX(nw, 1), sizeof *cut);
    for (int w = 0; cut && w < nw; w++) qr_msg_get_cut(r, &cut[w]);
    int rc = !cut ? QR_ENOMEM
             : r->bad || m->count != (uint32_t)nw
                 ? qr__fail(QR_EPROTO, "CKPT CUT: %u records for %d workers", m->count, nw)
             : c->park_failed ? qr__fail(QR_ENOMEM, "%s could not park a push for the cut", ps->name)
                              : QR_OK;
    if (!rc) {
        apply_parked(ps, cut);
        rc = qr__ckpt_start_shard(ps, m->id, m->step, m->base);
    }
    apply_parked(ps, NULL);
    free(cut);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", qr_last_error());
        qr__peer_reply_error(p, f, rc, msg);
        return;
    }
    c->reply_peer = p;
    c->reply_req = *f;
}

/* ---- ps 0: the coordinator of the cut ----------------------------------------- */

static void send_phase(qr_ps *ps, uint32_t phase, uint64_t id, int64_t step, const qr_msg_cut *cut) {
    int nw = ps->cluster->nworkers;
    qr_wbuf meta = {0};
    qr_msg_put_ckpt(&meta, &(qr_msg_ckpt){.phase = phase, .id = id, .step = step,
                                         .count = cut ? (uint32_t)nw : 0,
                                         .base = ps->ckpt.base_id});
    for (int w = 0; cut && w < nw; w++) qr_msg_put_cut(&meta, &cut[w]);
    /* the ps that serve shards (ps-replicas 2: not a failed ps, nor a
     * replacement, whose shards are served by the ps promoted for them) */
    QR_EACH_OTHER_PS(ps, k)
        if (qr__ckpt_asked(ps, k)) qr__link_ckpt(ps, k, &meta, qr__ckpt_link_answer);
    qr_wbuf_free(&meta);
}

/* Ask every ps for its report: HOLD the first time, QUERY after. */
static void collect(qr_ps *ps, uint32_t phase) {
    ps_ckpt *c = &ps->ckpt;
    if (phase == QR_CKPT_HOLD) {
        c->holding = true;
        c->park_failed = false;
    }
    c->collecting = true;
    c->reports_pending = 0;
    QR_EACH_OTHER_PS(ps, k) c->reports_pending += qr__ckpt_asked(ps, k);
    qr_wbuf_reset(&c->reports[ps->index]); /* the coordinator's own: ps 0's, or a successor's */
    put_report(ps, &c->reports[ps->index]);
    send_phase(ps, phase, c->next_id, c->step, NULL);
}

static void give_up(qr_ps *ps, const char *why) {
    ps_ckpt *c = &ps->ckpt;
    c->collecting = false;
    send_phase(ps, QR_CKPT_RELEASE, c->next_id, c->step, NULL);
    apply_parked(ps, NULL);
    qr__ckpt_failed(ps, why);
}

typedef struct call_view {
    bool have, connected;
    uint32_t seq, nparts;
    uint64_t data_pos;
    int whole;   /* ps that applied or parked the call */
} call_view;

/* Read every ps's report into one view per worker; false if one is bad. */
static bool read_reports(qr_ps *ps, call_view *v) {
    ps_ckpt *c = &ps->ckpt;
    int nw = ps->cluster->nworkers;
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < ps->cluster->nps; k++) {
            if (!qr__ckpt_asked(ps, k)) continue;
            qr_rbuf r;
            qr_rbuf_init(&r, c->reports[k].data, c->reports[k].len);
            uint32_t n = qr_msg_get_count(&r);
            for (uint32_t i = 0; i < n && !r.bad; i++) {
                qr_msg_mark m;
                qr_msg_get_mark(&r, &m);
                if (r.bad || !qr__is_worker(m.worker, nw)) return false;
                call_view *cv = &v[m.worker];
                if (pass == 0) { /* the newest applied call */
                    if (m.flags & QR_MARK_CONNECTED) cv->connected = true;
                    if ((m.flags & QR_MARK_APPLIED) && !(m.flags & QR_MARK_FORWARDED) &&
                        (!cv->have || seq_after(m.seq, cv->seq))) {
                        cv->have = true;
                        cv->seq = m.seq;
                        cv->nparts = m.nparts;
                        cv->data_pos = m.data_pos;
                    }
                } else if (cv->have && m.seq == cv->seq &&
                           (m.flags & (QR_MARK_APPLIED | QR_MARK_PARKED))) {
                    cv->whole++;
                }
            }
            if (r.bad) return false;
        }
    }
    return true;
}

static void on_poll(uv_timer_t *t) {
    qr_ps *ps = t->data;
    if (ps->ckpt.busy && !qr__ps_fenced(ps)) collect(ps, QR_CKPT_QUERY);
}

static void decide(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    int nw = ps->cluster->nworkers;
    call_view *v = qr__calloc((size_t)QR_MAX(nw, 1), sizeof *v);
    qr_msg_cut *cut = qr__calloc((size_t)QR_MAX(nw, 1), sizeof *cut);
    if (!v || !cut || !read_reports(ps, v)) {
        free(v);
        free(cut);
        give_up(ps, "a ps sent a report that does not parse, or memory ran out");
        return;
    }
    int missing = -1;
    for (int w = 0; w < nw; w++) {
        if (!v[w].have) continue;
        if (v[w].whole < (int)v[w].nparts && v[w].connected && missing < 0) missing = w;
        cut[w] = (qr_msg_cut){.include = 1, .seq = v[w].seq};
    }
    if (missing >= 0) {
        uint64_t held_ms = (qr__now_ns() - c->hold_ns) / 1000000;
        if (held_ms >= CUT_GIVE_UP_MS) {
            char why[256];
            snprintf(why, sizeof why, "worker %d's push %u reached %d of its %u ps tasks and the "
                     "rest did not arrive in %d ms: no checkpoint rather than a torn one",
                     missing, v[missing].seq, v[missing].whole, v[missing].nparts, CUT_GIVE_UP_MS);
            give_up(ps, why);
        } else {
            c->collecting = false;
            uv_timer_start(&c->poll, on_poll, CUT_POLL_MS, 0);
        }
        free(v);
        free(cut);
        return;
    }
    /* The cut: ps 0's own included pushes, then its global step. */
    c->collecting = false;
    apply_parked(ps, cut);
    for (int w = 0; w < nw; w++)
        if (v[w].have && c->data_pos) c->data_pos[w] = v[w].data_pos;
    int64_t step = ps->global_step;
    send_phase(ps, QR_CKPT_CUT, c->next_id, step, cut);
    qr__ckpt_take(ps, step);
    apply_parked(ps, NULL);
    free(v);
    free(cut);
}

void qr__ckpt_cut_begin(qr_ps *ps) {
    ps->ckpt.hold_ns = qr__now_ns();
    collect(ps, QR_CKPT_HOLD);
    if (ps->test_die_at_step >= 0 && ps->global_step >= ps->test_die_at_step && ps->index == 0) {
        qr__log(QR_LOG_WARN, "QUORUM_TEST_COORDINATOR_DIES_AT_STEP: every ps asked to hold "
                "for the cut at step %lld; this ps dies now", (long long)ps->global_step);
        _exit(9);
    }
}

bool qr__ckpt_cut_report(qr_ps *ps, int index, const qr_frame *f, const uint8_t *meta) {
    ps_ckpt *c = &ps->ckpt;
    if (!c->collecting) return false;
    if (f->status) {
        char why[600];
        snprintf(why, sizeof why, "ps %d refused to hold: %.*s", index,
                 (int)QR_MIN(f->meta_len, 500u), (const char *)meta);
        give_up(ps, why);
        return true;
    }
    qr_wbuf_reset(&c->reports[index]);
    qr_wbuf_bytes(&c->reports[index], meta, f->meta_len);
    if (--c->reports_pending == 0) decide(ps);
    return true;
}

void qr__ckpt_cut_link_lost(qr_ps *ps, int index) {
    if (!ps->ckpt.collecting) return;
    char why[128];
    snprintf(why, sizeof why, "the link to ps %d was lost during the cut", index);
    give_up(ps, why);
}

int qr__ckpt_cut_init(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    c->marks = qr__calloc((size_t)QR_MAX(ps->cluster->nworkers, 1), sizeof *c->marks);
    if (!c->marks) return QR_ENOMEM;
    if (qr__replica_on(ps)) {
        c->copy_marks = qr__calloc((size_t)QR_MAX(ps->cluster->nworkers, 1), sizeof *c->marks);
        if (!c->copy_marks) return QR_ENOMEM;
    }
    if (!qr__ps_coordinates(ps)) return QR_OK;
    return qr__ckpt_cut_coordinate(ps);
}

int qr__ckpt_cut_coordinate(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    if (c->poll_init) return QR_OK;
    c->reports = qr__calloc((size_t)ps->cluster->nps, sizeof *c->reports);
    if (!c->reports) return QR_ENOMEM;
    uv_timer_init(&ps->loop, &c->poll);
    c->poll.data = ps;
    c->poll_init = true;
    return QR_OK;
}

void qr__ckpt_cut_coordinator_gone(qr_ps *ps) {
    if (ps->ckpt.holding) {
        qr__log(QR_LOG_INFO, "the coordinator that held pushes for a checkpoint's cut is gone: "
                "they are applied now");
        apply_parked(ps, NULL);
    }
}

void qr__ckpt_cut_close(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    if (c->poll_init && !uv_is_closing((uv_handle_t *)&c->poll)) uv_close((uv_handle_t *)&c->poll, NULL);
}

void qr__ckpt_cut_free(qr_ps *ps) {
    ps_ckpt *c = &ps->ckpt;
    while (c->parked) {
        parked_push *next = c->parked->next;
        free(c->parked);
        c->parked = next;
    }
    for (int k = 0; c->reports && k < ps->cluster->nps; k++) qr_wbuf_free(&c->reports[k]);
    free(c->reports);
    free(c->marks);
    free(c->copy_marks);
    c->reports = NULL;
    c->marks = c->copy_marks = NULL;
}

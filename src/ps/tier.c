/*
 * tier.c - the disk tier of a ps's embedding tables (tier.h): with
 * --table-memory-mb N at most N MiB of rows stay in memory, the rest in
 * an LMDB environment, one per ps, a named database per table.
 *
 * Why LMDB (Debian's liblmdb) and not RocksDB: what the tier does is
 * point lookups and point writes of fixed-size values (a row, its slots,
 * its update step) under 8-byte integer keys, by one thread (the ps
 * loop). LMDB is a copy-on-write B+tree in one mmap'd file: a read is a
 * few page lookups with no copy, a batch of writes is one transaction,
 * and nothing runs behind the caller's back: no compaction threads, no
 * write stalls, no tuning. RocksDB's LSM tree is built for write-heavy
 * loads; its compactions rewrite the data in the background (threads and
 * I/O bursts beside the ps loop) and a point read may look into several
 * levels. The tier's writes are no heavier than its reads (a row goes
 * out when another comes in), so LMDB's read path is the better trade.
 * The environment is opened MDB_WRITEMAP | MDB_NOSYNC: the tier is
 * scratch space (checkpoints are what survives a crash), so commits
 * never wait for the disk, and its pages are file-backed, not the
 * process's anonymous memory: the kernel may drop them under pressure.
 *
 * One write transaction serves many requests (TXN_RECORDS records
 * written or deleted): LMDB copies a page the first time a transaction
 * touches it, so a hot leaf is copied once a transaction, not once a
 * request. Reads by the tier (the statistics, the sweep) go through the
 * open transaction, which sees its own writes; a checkpoint's reads go
 * through a read transaction of their own, begun at its cut and read on
 * the writer's thread (qr__tier_snap_begin: the environment keeps its lock
 * file, whose reader table keeps the pages that transaction sees from
 * being reused). An LMDB error loses the
 * open transaction, and with it the rows written out since it began: the
 * tier then fails for good, every later request says so (restart from a
 * checkpoint). Failures of the ps's own memory undo what the request did.
 *
 * Which rows go out: GCLOCK over the rows in memory, one byte a row: a
 * request counts a use of each of its rows (up to 3); the hand takes one
 * from each row it passes and takes the first row at 0. Unlike CLOCK's
 * one bit, the count keeps the rows used often (Zipf's head) over rows
 * used once lately. A request's own rows are protected while room is made
 * for its misses.
 *
 * A record on disk: the row's value and slots (stride floats), then its
 * last update step when the table evicts by age (int64).
 *
 * A row that comes back keeps its record on disk, stale from then on:
 * when the row goes out again its put overwrites the record in place
 * (same key, same size), so a row that moves in and out costs a get and
 * a put, not a get, a delete and a put, and the B+tree keeps its shape
 * (no leaf split by a put, none merged by a delete). Profiled on `bench
 * tier`, the delete was 14% of the time. The disk therefore holds a
 * record for rows in memory too: whatever reads it as "the rows on disk"
 * skips the ids found in memory (the checkpoint's copy, the sweep), and
 * a row the table removes in memory takes its record with it
 * (qr__tier_forget, from qr_table_remove), so that an id evicted by age
 * does not come back from a stale copy. disk_rows counts the rows only
 * on disk (what the statistics call rows_disk).
 */
#include "ps/ps_internal.h"
#include "ps/tier.h"

#include "ckpt/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

/* Address space mapped for the file at first (sparse: only what is
 * written takes disk); doubled between transactions while the pages in
 * use and TXN_HEADROOM would take more than half of it, so that at least
 * twice TXN_HEADROOM stays free for a transaction's worst (TXN_RECORDS
 * records, a few pages each). */
#define MAP_BYTES ((size_t)1 << 30)
#define TXN_HEADROOM ((size_t)512 << 20)
/* Tables one ps may tier. */
#define MAX_TABLES 4096

/* Which ids may be on disk: a Bloom filter (4 bits an id, double
 * hashing), so that a miss of a new id (most misses while a table grows)
 * costs no B+tree search. Rows leaving the disk leave their bits set (a
 * false positive costs one search); the filter is rebuilt from the disk's
 * keys, at BUILD_BITS bits a row, once it holds fewer than MIN_BITS a row
 * (at most 2.4% false positives; about 2 bytes a row on disk). */
#define FILTER_K 4
#define BUILD_BITS 16
#define MIN_BITS 8

typedef struct disk_filter {
    uint64_t *words;
    uint64_t nbits;
    uint64_t ids;          /* ids added since it was built, and those it was built with */
} disk_filter;

/* A row's mark: a GCLOCK count of its recent uses (0 to MAX_USES), and
 * two flags while room is made. */
#define MAX_USES 3
#define PROTECTED 0x80 /* a row of the request being served */
#define LEAVING 0x40   /* chosen to go out */

struct tier_table {
    struct ps_tier *owner;
    qr_var *var;
    MDB_dbi dbi;
    uint8_t *mark;       /* [rows in memory] */
    uint64_t nmark, mark_cap;
    uint64_t hand;
    uint64_t disk_rows;
    disk_filter filter;
    uint64_t memory_hits, disk_hits, misses, spilled;
};
typedef struct tier_table tier_table;

/* A row chosen to go out. */
typedef struct victim {
    tier_table *tt;
    uint64_t row;
    int64_t id;
} victim;

typedef struct ps_tier {
    uint64_t cap;                /* bytes of rows in memory */
    char dir[PATH_MAX];
    bool private_dir;            /* made here, removed at the end */
    MDB_env *env;
    tier_table **tables;
    int ntables;
    int64_t *missing;            /* a request's ids not in memory */
    uint64_t missing_cap;
    int64_t *rows;               /* a request's rows in memory (-1: missing) */
    uint64_t rows_cap;
    victim *victims;
    uint64_t nvictims, victims_cap;
    int64_t *idle;               /* a sweep's ids to delete */
    uint64_t idle_cap;
    MDB_txn *txn;                /* the open write transaction, or NULL */
    uint64_t txn_records;        /* written or deleted in it */
    char failure[200];           /* "" while the tier works */
    /* checkpoints' snapshots being read on the writer's thread
     * (qr__tier_snap_begin): the map is not resized under them */
    uv_mutex_t snap_lock;
    uv_cond_t snap_ended;
    int snaps;
    bool snap_sync_made;
} ps_tier;

/* Records one write transaction may write or delete, whatever the
 * requests they come from (each dirties a leaf or two; past LMDB's 131,072
 * dirty pages a transaction it writes some out early, MDB_TXN_FULL does
 * not happen). Bounded by records alone: `bench tier` ran 2.6x faster than
 * committing every 64 requests. Since a row's record stays when it comes
 * back (no deletes), 65,536 spent a fifth less CPU in the puts than
 * 16,384 on the click model four times its cap (thread CPU time of the
 * ps's tier, two alternated runs each; 4,096 no better than 16,384): a
 * leaf is copied once a transaction, and a larger one puts more records
 * on each copy. Its worst, 65,536 records of about 3 pages, is under the
 * 1 GiB the map keeps free (TXN_HEADROOM, twice). */
#define TXN_RECORDS 65536

static int lmdb_fail(int rc, const char *what) {
    return qr__fail(rc == ENOMEM ? QR_ENOMEM : QR_EIO, "table disk tier: %s: %s", what,
                    mdb_strerror(rc));
}

/* An LMDB error in the open transaction: lost, and the tier with it. */
static int tier_failed(ps_tier *tier, int rc, const char *what) {
    if (tier->txn) mdb_txn_abort(tier->txn);
    tier->txn = NULL;
    snprintf(tier->failure, sizeof tier->failure, "%s: %s", what, mdb_strerror(rc));
    return qr__fail(QR_EIO, "table disk tier: %s (the rows written to it since its last "
                    "commit are lost: restart from a checkpoint)", tier->failure);
}

/* LMDB resizes its map only with no transaction open in the process: a
 * checkpoint's snapshot still being read on the writer's thread is waited
 * for (rare: its cut grew the map ahead for the writes that may come
 * meanwhile, qr__tier_snap_begin). */
static int resize_map(ps_tier *tier, size_t size) {
    uv_mutex_lock(&tier->snap_lock);
    while (tier->snaps) uv_cond_wait(&tier->snap_ended, &tier->snap_lock);
    int rc = mdb_env_set_mapsize(tier->env, size);
    uv_mutex_unlock(&tier->snap_lock);
    return rc;
}

static int tier_working(const ps_tier *tier) {
    if (!tier->failure[0]) return QR_OK;
    return qr__fail(QR_EIO, "table disk tier: it failed earlier (%s): restart from a "
                    "checkpoint", tier->failure);
}

/* Between transactions: the map doubled while `copies` times the pages in
 * use and TXN_HEADROOM would take more than half of it. */
static int grow_map(ps_tier *tier, size_t copies) {
    MDB_envinfo info;
    MDB_stat st;
    int rc = mdb_env_info(tier->env, &info);
    if (!rc) rc = mdb_env_stat(tier->env, &st);
    size_t used = rc ? 0 : (info.me_last_pgno + 1) * (size_t)st.ms_psize, size = info.me_mapsize;
    while (!rc && 2 * (copies * used + TXN_HEADROOM) > size) size *= 2;
    if (!rc && size != info.me_mapsize) rc = resize_map(tier, size);
    return rc ? tier_failed(tier, rc, "growing the map") : QR_OK;
}

static int txn_open(ps_tier *tier) {
    int rc = tier_working(tier);
    if (rc || tier->txn) return rc;
    if ((rc = grow_map(tier, 1))) return rc;
    rc = mdb_txn_begin(tier->env, NULL, 0, &tier->txn);
    if (rc) {
        tier->txn = NULL;
        return tier_failed(tier, rc, "beginning a transaction");
    }
    tier->txn_records = 0;
    return QR_OK;
}

static int txn_commit(ps_tier *tier) {
    if (!tier->txn) return QR_OK;
    int rc = mdb_txn_commit(tier->txn);
    tier->txn = NULL; /* committed, or freed by the failed commit */
    return rc ? tier_failed(tier, rc, "committing") : QR_OK;
}

/* After each record: a transaction that has written enough is committed
 * and a new one begun, with a new cursor on dbi when cur is given. */
static int txn_count(ps_tier *tier, MDB_dbi dbi, MDB_cursor **cur) {
    if (++tier->txn_records < TXN_RECORDS) return QR_OK;
    if (cur && *cur) mdb_cursor_close(*cur);
    if (cur) *cur = NULL;
    int rc = txn_commit(tier);
    if (!rc) rc = txn_open(tier);
    if (!rc && cur) {
        rc = mdb_cursor_open(tier->txn, dbi, cur);
        if (rc) rc = tier_failed(tier, rc, "opening a cursor");
    }
    return rc;
}

/* Memory a row in memory costs: its value and slots, its id, its slot in
 * the index (4 bytes at a load of about one half), its update step under
 * eviction, its CLOCK mark. */
static uint64_t row_cost(const qr_table *t) {
    return (uint64_t)t->stride * 4 + 8 + 8 + (t->evict_after ? 8 : 0) + 1;
}

static size_t record_bytes(const qr_table *t) {
    return (size_t)t->stride * 4 + (t->evict_after ? 8 : 0);
}

static uint64_t used_bytes(const ps_tier *tier) {
    uint64_t used = 0;
    for (int i = 0; i < tier->ntables; i++) {
        const qr_table *t = tier->tables[i]->var->table;
        used += t->count * row_cost(t);
    }
    return used;
}

static uint64_t bit_of(const disk_filter *f, uint64_t h1, uint64_t h2, int i) {
    return (uint64_t)(((unsigned __int128)(h1 + (uint64_t)i * h2) * f->nbits) >> 64);
}

static void filter_add(disk_filter *f, int64_t id) {
    uint64_t h1 = qr_idmap_hash(id), h2 = qr_idmap_hash((int64_t)~h1) | 1;
    for (int i = 0; i < FILTER_K; i++) {
        uint64_t b = bit_of(f, h1, h2, i);
        f->words[b >> 6] |= (uint64_t)1 << (b & 63);
    }
    f->ids++;
}

static bool filter_may_hold(const disk_filter *f, int64_t id) {
    uint64_t h1 = qr_idmap_hash(id), h2 = qr_idmap_hash((int64_t)~h1) | 1;
    for (int i = 0; i < FILTER_K; i++) {
        uint64_t b = bit_of(f, h1, h2, i);
        if (!(f->words[b >> 6] >> (b & 63) & 1)) return false;
    }
    return true;
}

/* An empty filter of nbits bits (at least 2^16). */
static int filter_make(disk_filter *f, uint64_t nbits) {
    nbits = QR_MAX(nbits, (uint64_t)1 << 16);
    uint64_t *words = calloc((nbits + 63) / 64, sizeof *words);
    if (!words) return qr__fail(QR_ENOMEM, "out of memory for the disk tier's filter "
                                "(%llu bits)", (unsigned long long)nbits);
    free(f->words);
    *f = (disk_filter){words, nbits, 0};
    return QR_OK;
}

/* The marks follow the table's rows: rows made since (by a lookup or a
 * push) count as referenced; rows the table removed itself (eviction by
 * age moves rows around) leave marks that are only a hint. */
static int sync_marks(tier_table *tt) {
    const qr_table *t = tt->var->table;
    if (t->count > tt->mark_cap) {
        uint64_t cap = QR_MAX(t->count, tt->mark_cap + tt->mark_cap / 2);
        uint8_t *m = realloc(tt->mark, cap);
        if (!m) return qr__fail(QR_ENOMEM, "out of memory marking %llu rows",
                                (unsigned long long)cap);
        tt->mark = m;
        tt->mark_cap = cap;
    }
    if (t->count > tt->nmark) memset(tt->mark + tt->nmark, 1, t->count - tt->nmark);
    tt->nmark = t->count;
    return QR_OK;
}

static int grow(void **p, uint64_t *cap, uint64_t want, size_t size) {
    if (want <= *cap) return QR_OK;
    uint64_t c = QR_MAX(want, *cap * 2);
    void *q = realloc(*p, c * size);
    if (!q) return qr__fail(QR_ENOMEM, "out of memory in the table disk tier");
    *p = q;
    *cap = c;
    return QR_OK;
}

static int attach(ps_tier *tier, qr_var *v) {
    if (tier->ntables == MAX_TABLES)
        return qr__fail(QR_EINVAL, "table disk tier: more than %d tables", MAX_TABLES);
    tier_table *tt = qr__calloc(1, sizeof *tt);
    tier_table **tables = realloc(tier->tables, (size_t)(tier->ntables + 1) * sizeof *tables);
    if (tables) tier->tables = tables;
    if (!tt || !tables) {
        free(tt);
        return qr__fail(QR_ENOMEM, "out of memory tiering table '%s'", v->name);
    }
    int rc = txn_open(tier);
    if (!rc) {
        rc = mdb_dbi_open(tier->txn, v->name, MDB_CREATE | MDB_INTEGERKEY, &tt->dbi);
        /* A database left by an earlier run of this ps (a rollback) holds
         * rows of that run: empty it. */
        if (!rc) rc = mdb_drop(tier->txn, tt->dbi, 0);
        /* A handle opened in a transaction is the environment's once it
         * commits. */
        if (rc) rc = tier_failed(tier, rc, v->name);
        else rc = txn_commit(tier);
    }
    if (rc) {
        free(tt);
        return rc;
    }
    rc = filter_make(&tt->filter, 0);
    if (rc) {
        free(tt);
        return rc;
    }
    tt->owner = tier;
    tt->var = v;
    v->table->tier = tt;
    tier->tables[tier->ntables++] = tt;
    return sync_marks(tt);
}

/* Row r's record into dst. */
static void fill_record(const qr_table *t, uint64_t r, void *dst) {
    memcpy(dst, qr_table_row(t, r), (size_t)t->stride * 4);
    if (t->evict_after) {
        int64_t step = t->updated ? t->updated[r] : t->clock;
        memcpy((char *)dst + (size_t)t->stride * 4, &step, 8);
    }
}

/* CLOCK: rows of tt chosen to go out, until *want bytes are freed or
 * every row left is protected. */
static int choose_victims(ps_tier *tier, tier_table *tt, int64_t *want) {
    const qr_table *t = tt->var->table;
    int64_t cost = (int64_t)row_cost(t);
    int rc = sync_marks(tt);
    uint64_t passed = 0; /* rows passed over since the last victim */
    while (!rc && *want > 0 && t->count && passed <= (MAX_USES + 1) * t->count) {
        if (tt->hand >= t->count) tt->hand = 0;
        uint64_t r = tt->hand++;
        if (tt->mark[r]) {
            if (!(tt->mark[r] & (PROTECTED | LEAVING))) tt->mark[r]--;
            passed++;
            continue;
        }
        rc = grow((void **)&tier->victims, &tier->victims_cap, tier->nvictims + 1,
                  sizeof *tier->victims);
        if (rc) break;
        tt->mark[r] = LEAVING;
        tier->victims[tier->nvictims++] = (victim){tt, r, t->keys[r]};
        *want -= cost;
        passed = 0;
    }
    return rc;
}

/* By table, then in LMDB's key order (unsigned). */
static int by_table_then_id(const void *a, const void *b) {
    const victim *x = a, *y = b;
    if (x->tt != y->tt) return x->tt < y->tt ? -1 : 1;
    return (uint64_t)x->id < (uint64_t)y->id ? -1 : (uint64_t)x->id > (uint64_t)y->id;
}

/* The victims' records written, in key order through one cursor a
 * table: a put then finds its leaf near the last one. */
static int write_victims(ps_tier *tier) {
    qsort(tier->victims, tier->nvictims, sizeof *tier->victims, by_table_then_id);
    MDB_cursor *cur = NULL;
    const tier_table *open = NULL;
    int rc = QR_OK;
    for (uint64_t k = 0; k < tier->nvictims && !rc; k++) {
        victim *x = &tier->victims[k];
        const qr_table *t = x->tt->var->table;
        if (x->tt != open) {
            if (cur) mdb_cursor_close(cur);
            cur = NULL;
            int lrc = mdb_cursor_open(tier->txn, x->tt->dbi, &cur);
            if (lrc) return tier_failed(tier, lrc, "opening a cursor");
            open = x->tt;
        }
        MDB_val key = {8, &x->id}, val = {record_bytes(t), NULL};
        int lrc = mdb_cursor_put(cur, &key, &val, MDB_RESERVE);
        if (lrc) {
            mdb_cursor_close(cur);
            return tier_failed(tier, lrc, "writing rows out");
        }
        fill_record(t, x->row, val.mv_data);
        filter_add(&x->tt->filter, x->id);
        rc = txn_count(tier, x->tt->dbi, &cur);
    }
    if (cur) mdb_cursor_close(cur);
    return rc;
}

/* Room for want more bytes, the rows written out: tt's rows first, then
 * the other tables'. */
static int make_room(ps_tier *tier, tier_table *tt, int64_t want) {
    int rc = choose_victims(tier, tt, &want);
    for (int i = 0; !rc && want > 0 && i < tier->ntables; i++)
        if (tier->tables[i] != tt) rc = choose_victims(tier, tier->tables[i], &want);
    return rc ? rc : write_victims(tier);
}

/* By table, the highest rows first: a removal moves the table's last row
 * into the hole, and the last row is then never one still to go. */
static int by_table_then_row_down(const void *a, const void *b) {
    const victim *x = a, *y = b;
    if (x->tt != y->tt) return x->tt < y->tt ? -1 : 1;
    return x->row < y->row ? 1 : x->row > y->row ? -1 : 0;
}

/* A request's victims are few (its misses' worth); a restore over the cap
 * chooses nearly the whole table at once (24 bytes a row): a list of more
 * than this many bytes is freed once used, not kept for the next. */
#define KEEP_VICTIMS_BYTES ((size_t)4 << 20)

static void victims_done(ps_tier *tier) {
    tier->nvictims = 0;
    if (tier->victims_cap * sizeof *tier->victims <= KEEP_VICTIMS_BYTES) return;
    free(tier->victims);
    tier->victims = NULL;
    tier->victims_cap = 0;
}

/* The memory a table's rows left behind given back (table.h,
 * qr_table_trim), its marks too: as the table's ids, shrunk to twice the
 * rows once they hold 4x. Row numbers do not change: the marks stay. */
static void trim_table(tier_table *tt) {
    const qr_table *t = tt->var->table;
    qr_table_trim(tt->var->table);
    if (tt->mark_cap > 1024 && tt->mark_cap / 4 >= t->count) {
        uint64_t cap = QR_MAX(2 * t->count, 64);
        uint8_t *m = realloc(tt->mark, cap);
        if (m) {
            tt->mark = m;
            tt->mark_cap = cap;
        }
    }
}

/* Once written: the victims leave memory, and each table they left gives
 * back what it no longer needs (once, after all its removals). */
static void remove_victims(ps_tier *tier) {
    qsort(tier->victims, tier->nvictims, sizeof *tier->victims, by_table_then_row_down);
    for (uint64_t k = 0; k < tier->nvictims; k++) {
        tier_table *tt = tier->victims[k].tt;
        qr_table *t = tt->var->table;
        uint64_t r = tier->victims[k].row;
        qr_table_move_out(t, r); /* a move, not a removal (table.h) */
        tt->mark[r] = tt->mark[t->count];
        tt->nmark = t->count;
        tt->disk_rows++;
        tt->spilled++;
        if (k + 1 == tier->nvictims || tier->victims[k + 1].tt != tt) trim_table(tt);
    }
    victims_done(tier);
}

/* Not written (out of memory choosing them): the victims stay, unmarked. */
static void keep_victims(ps_tier *tier) {
    for (uint64_t k = 0; k < tier->nvictims; k++)
        tier->victims[k].tt->mark[tier->victims[k].row] = 0;
    victims_done(tier);
}

/* The missing ids that are on disk come back (appended to the table from
 * row `from` on; their records stay, stale); *found counts them. One
 * cursor, ids in key order: each search starts near the last. QR_ENOMEM
 * if the table could not take a row (those back so far then leave memory
 * again). */
static int fetch(tier_table *tt, const int64_t *missing, uint64_t nmiss, uint64_t *found) {
    ps_tier *tier = tt->owner;
    qr_table *t = tt->var->table;
    size_t bytes = record_bytes(t);
    uint64_t from = t->count;
    MDB_cursor *cur;
    int lrc = mdb_cursor_open(tier->txn, tt->dbi, &cur);
    if (lrc) return tier_failed(tier, lrc, "opening a cursor");
    int rc = QR_OK;
    for (uint64_t k = 0; k < nmiss && tt->disk_rows > *found && !rc; k++) {
        int64_t id = missing[k];
        if (!filter_may_hold(&tt->filter, id)) continue;
        MDB_val key = {8, &id}, val;
        lrc = mdb_cursor_get(cur, &key, &val, MDB_SET_KEY);
        if (lrc == MDB_NOTFOUND) continue;
        if (!lrc && val.mv_size != bytes) lrc = MDB_CORRUPTED;
        if (lrc) {
            rc = tier_failed(tier, lrc, "reading a row");
            break;
        }
        int64_t r = qr_table_add_uninit(t, id);
        if (r == -2) continue; /* an id twice in one request: back already */
        if (r < 0) {
            rc = QR_ENOMEM;
            break;
        }
        memcpy(qr_table_row(t, (uint64_t)r), val.mv_data, (size_t)t->stride * 4);
        if (t->evict_after && t->updated)
            memcpy(&t->updated[r], (char *)val.mv_data + (size_t)t->stride * 4, 8);
        /* Its record stays (the put that takes it out again overwrites it). */
        (*found)++;
    }
    /* Out of memory: what came back goes back (the table as it was; the
     * records are still on disk, unchanged). */
    while (rc == QR_ENOMEM && t->count > from) {
        qr_table_move_out(t, t->count - 1);
        (*found)--;
    }
    if (!tier->failure[0]) mdb_cursor_close(cur);
    return rc;
}

/* A filter too full for its ids is built anew from the disk's keys (in
 * the open transaction, which sees its own writes). Out of memory: the
 * old one stays (it only answers "maybe" more often). */
static int filter_refresh(tier_table *tt) {
    disk_filter *f = &tt->filter;
    if (f->ids * MIN_BITS <= f->nbits) return QR_OK;
    /* Sized by the records, those of rows in memory included. */
    MDB_stat st;
    int lrc = mdb_stat(tt->owner->txn, tt->dbi, &st);
    if (lrc) return tier_failed(tt->owner, lrc, "counting the records on disk");
    disk_filter fresh = {0};
    if (filter_make(&fresh, (uint64_t)st.ms_entries * BUILD_BITS)) return QR_OK;
    MDB_cursor *cur;
    lrc = mdb_cursor_open(tt->owner->txn, tt->dbi, &cur);
    MDB_val key, val;
    for (lrc = lrc ? lrc : mdb_cursor_get(cur, &key, &val, MDB_FIRST); !lrc;
         lrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
        int64_t id;
        memcpy(&id, key.mv_data, 8);
        filter_add(&fresh, id);
    }
    if (lrc != MDB_NOTFOUND) {
        free(fresh.words);
        return tier_failed(tt->owner, lrc, "reading the keys on disk");
    }
    mdb_cursor_close(cur);
    free(f->words);
    *f = fresh;
    return QR_OK;
}

/* LMDB's order of MDB_INTEGERKEY keys: unsigned. */
static int by_id(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* How far below the cap a spill goes: when a request's misses would pass
 * the cap, the rows in memory are written out down to the cap less the
 * larger of the room the request needs and 1/SPILL_BELOW_DIV of the cap.
 * One spill then writes the misses of many requests at once (sorted by
 * id through one cursor: more of its puts share a leaf, and a leaf copied
 * by the transaction takes several), and the requests after it need none.
 * The rows never hold more than the cap; they hold about half of this
 * less on average, so a few more ids may miss (bench tier: 91.4 to 91.8%
 * of the ids found in memory, as before). Measured (docs/EMBEDDINGS.md,
 * Figures): 1/16 and 1/8 alike spent a quarter less of the ps's CPU than
 * a spill of the request's room alone on the click model four times its
 * cap; 1/32 less, 1/64 no better. */
#define SPILL_BELOW_DIV 16

/* The ids of a request missing from memory (tier->missing; its n rows in
 * memory are tier->rows): those on disk come back and colder rows make
 * room for every missing one (the rest may become new rows). */
static int bring_back(ps_tier *tier, tier_table *tt, int64_t n, uint64_t nmiss) {
    qr_table *t = tt->var->table;
    uint64_t cost = row_cost(t);
    bool need_room = used_bytes(tier) + nmiss * cost > tier->cap;
    if (!tt->disk_rows && !need_room) {
        tt->misses += nmiss;
        return QR_OK;
    }
    /* In key order: each get then walks the B+tree near the last one. */
    if (tt->disk_rows) qsort(tier->missing, nmiss, sizeof *tier->missing, by_id);
    int rc = txn_open(tier);
    if (rc) return rc;
    /* The request's rows stay while room is made for its misses. */
    const int64_t *rows = tier->rows;
    for (int64_t i = 0; i < n; i++)
        if (rows[i] >= 0) tt->mark[rows[i]] |= PROTECTED;
    uint64_t count0 = t->count, found = 0;
    if (tt->disk_rows) rc = fetch(tt, tier->missing, nmiss, &found);
    tt->disk_rows -= found;
    tt->disk_hits += found;
    tt->misses += nmiss - found;
    if (!rc) rc = sync_marks(tt);
    for (uint64_t r = count0; !rc && r < t->count; r++) tt->mark[r] = 1 | PROTECTED;
    /* Over the cap: down to a low-water mark below it (SPILL_BELOW_DIV). */
    uint64_t used = used_bytes(tier), need = (nmiss - found) * cost;
    if (!rc && used + need > tier->cap)
        rc = make_room(tier, tt, (int64_t)(used + QR_MAX(need, tier->cap / SPILL_BELOW_DIV)) -
                                 (int64_t)tier->cap);
    /* Unprotected before any removal moves rows. */
    for (int64_t i = 0; i < n; i++)
        if (rows[i] >= 0) tt->mark[rows[i]] &= (uint8_t)~PROTECTED;
    for (uint64_t r = count0; r < tt->nmark; r++) tt->mark[r] &= (uint8_t)~PROTECTED;
    if (rc) {
        /* Out of memory choosing victims: the rows back stay (the cap is
         * exceeded until the next request); an LMDB failure: the tier is
         * gone, the rows in memory stay as they are. */
        keep_victims(tier);
        return rc;
    }
    remove_victims(tier);
    for (int i = 0; i < tier->ntables && !rc; i++) rc = filter_refresh(tier->tables[i]);
    return rc;
}

/* Eviction by age on disk too, when the table's sweep is due (the same
 * test as qr_table_evict_idle, which runs after the request): run after
 * the request's rows came back, so a row asked for now is judged in
 * memory, as it would be without a tier. */
static int sweep_disk(ps_tier *tier, tier_table *tt) {
    qr_table *t = tt->var->table;
    if (!t->evict_after || !tt->disk_rows ||
        t->clock - t->last_sweep < QR_MAX(t->evict_after / 4, 1))
        return QR_OK;
    int rc = txn_open(tier);
    if (rc) return rc;
    /* The idle ids first, then their deletes (committed as they go). */
    MDB_cursor *cur;
    int lrc = mdb_cursor_open(tier->txn, tt->dbi, &cur);
    if (lrc) return tier_failed(tier, lrc, "opening a cursor");
    uint64_t nidle = 0;
    MDB_val key, val;
    size_t at = (size_t)t->stride * 4;
    for (lrc = mdb_cursor_get(cur, &key, &val, MDB_FIRST); !lrc && !rc;
         lrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
        int64_t step, id;
        memcpy(&step, (char *)val.mv_data + at, 8);
        if (t->clock - step <= t->evict_after) continue;
        memcpy(&id, key.mv_data, 8);
        if (qr_table_find(t, id) >= 0) continue; /* a stale copy: judged in memory */
        rc = grow((void **)&tier->idle, &tier->idle_cap, nidle + 1, sizeof *tier->idle);
        if (!rc) tier->idle[nidle++] = id;
    }
    if (rc) nidle = 0; /* out of memory: no sweep of the disk this time */
    else if (lrc != MDB_NOTFOUND) {
        mdb_cursor_close(cur);
        return tier_failed(tier, lrc, "sweeping idle rows");
    }
    for (uint64_t k = 0; k < nidle && !rc; k++) {
        MDB_val id = {8, &tier->idle[k]};
        lrc = mdb_cursor_get(cur, &id, &val, MDB_SET);
        if (!lrc) lrc = mdb_cursor_del(cur, 0);
        if (lrc) {
            mdb_cursor_close(cur);
            return tier_failed(tier, lrc, "deleting idle rows");
        }
        tt->disk_rows--;
        t->evicted++;
        qr_table_disk_row_removed(t, tier->idle[k]);
        rc = txn_count(tier, tt->dbi, &cur);
    }
    if (cur) mdb_cursor_close(cur);
    if (tier->idle_cap * sizeof *tier->idle > KEEP_VICTIMS_BYTES) { /* as the victims' list */
        free(tier->idle);
        tier->idle = NULL;
        tier->idle_cap = 0;
    }
    return rc;
}

/* How far ahead the pass of qr__tier_fault_in works (as table.c's lookup). */
#define PASS_AHEAD 8
#define PASS_RING (4 * PASS_AHEAD) /* more than the 2 * PASS_AHEAD ids a home lives, a power of two */

int qr__tier_fault_in(qr_ps *ps, qr_var *v, const int64_t *ids, int64_t n) {
    ps_tier *tier = ps->tier;
    if (!tier || !v->table) return QR_OK;
    qr_table *t = v->table;
    int rc;
    if (!t->tier) {
        /* A shard's copy (replica.c) is not this ps's own table. */
        if (qr_store_get(&ps->store, v->id) != v) return QR_OK;
        rc = attach(tier, v);
        if (rc) return rc;
    }
    tier_table *tt = t->tier;
    if ((uint64_t)n * row_cost(t) > tier->cap)
        return qr__fail(QR_EINVAL, "table '%s': a request of %lld ids needs %.1f MiB of rows in "
                        "memory at once, more than --table-memory-mb holds (%.1f MiB): raise "
                        "it or send smaller batches", v->name, (long long)n,
                        (double)((uint64_t)n * row_cost(t)) / (1 << 20),
                        (double)tier->cap / (1 << 20));
    rc = sync_marks(tt);
    if (!rc) rc = grow((void **)&tier->missing, &tier->missing_cap, (uint64_t)n,
                       sizeof *tier->missing);
    if (!rc) rc = grow((void **)&tier->rows, &tier->rows_cap, (uint64_t)n, sizeof *tier->rows);
    if (rc) return rc;
    /* One pass over the index, as table.c's lookup makes it: id i's slot
     * prefetched PASS_AHEAD ids before its key and mark are, and those
     * PASS_AHEAD before its find, so that the find hits cache (profiled
     * on the click model four times its cap: with only the slot
     * prefetched this pass took as much CPU as the rest of the ps's
     * work on the request). Nothing here changes the index, so a home
     * taken ahead stays good. */
    uint64_t nmiss = 0, home[PASS_RING];
    for (int64_t i = 0; i < n + 2 * PASS_AHEAD; i++) {
        if (i < n) {
            home[i % PASS_RING] = qr_idmap_home(&t->index, ids[i]);
            __builtin_prefetch(t->index.slot + home[i % PASS_RING], 0, 3);
        }
        int64_t k = i - PASS_AHEAD;
        if (k >= 0 && k < n) {
            uint32_t s = t->index.slot[home[k % PASS_RING]];
            if (s) {
                __builtin_prefetch(t->keys + s - 1, 0, 3);
                __builtin_prefetch(tt->mark + s - 1, 1, 3);
            }
        }
        k = i - 2 * PASS_AHEAD;
        if (k < 0) continue;
        int64_t r = qr_idmap_find_from(&t->index, t->keys, ids[k], home[k % PASS_RING]);
        tier->rows[k] = r;
        if (r < 0) tier->missing[nmiss++] = ids[k];
        else if (tt->mark[r] < MAX_USES) tt->mark[r]++;
    }
    tt->memory_hits += (uint64_t)n - nmiss;
    if (nmiss) rc = bring_back(tier, tt, n, nmiss);
    if (!rc) rc = sweep_disk(tier, tt);
    return rc;
}

void qr__tier_forget(qr_table *t, int64_t id) {
    tier_table *tt = t->tier;
    ps_tier *tier = tt->owner;
    if (!filter_may_hold(&tt->filter, id) || txn_open(tier)) return; /* a failed tier says so */
    MDB_val key = {8, &id};
    int lrc = mdb_del(tier->txn, tt->dbi, &key, NULL);
    if (lrc == MDB_NOTFOUND) return;
    if (lrc) tier_failed(tier, lrc, "deleting the record of a row removed");
    else txn_count(tier, tt->dbi, NULL);
}

uint64_t qr__tier_disk_rows(const qr_table *t) {
    return t->tier ? t->tier->disk_rows : 0;
}

void qr__tier_stats(const qr_table *t, qr_tier_stats *out) {
    memset(out, 0, sizeof *out);
    out->rows_memory = t->count;
    tier_table *tt = t->tier;
    if (!tt) return;
    out->rows_disk = tt->disk_rows;
    out->memory_hits = tt->memory_hits;
    out->disk_hits = tt->disk_hits;
    out->misses = tt->misses;
    out->rows_spilled = tt->spilled;
    MDB_stat st;
    if (!txn_open(tt->owner) && !mdb_stat(tt->owner->txn, tt->dbi, &st))
        out->disk_bytes = (uint64_t)st.ms_psize *
                          (st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages);
}

/* The files of an environment, and its directory if made here. */
static void remove_files(const ps_tier *tier) {
    char path[PATH_MAX + 16];
    static const char *const files[] = {"data.mdb", "lock.mdb"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", tier->dir, files[i]);
        unlink(path);
    }
    if (tier->private_dir) rmdir(tier->dir);
}

/* Spill what exceeds the cap, tt's rows first (no request's rows to keep). */
static int enforce_cap(ps_tier *tier, tier_table *tt) {
    int64_t want = (int64_t)used_bytes(tier) - (int64_t)tier->cap;
    if (want <= 0) return QR_OK;
    int rc = txn_open(tier);
    if (!rc) rc = make_room(tier, tt, want);
    if (rc) {
        keep_victims(tier);
        return rc;
    }
    remove_victims(tier);
    for (int i = 0; i < tier->ntables && !rc; i++) rc = filter_refresh(tier->tables[i]);
    return rc ? rc : txn_commit(tier);
}

int qr__tier_init(qr_ps *ps) {
    int64_t mb = qr__config_int(ps->cfg, "table-memory-mb");
    if (!mb) return QR_OK;
    if (qr__replica_on(ps))
        return qr__fail(QR_EINVAL, "--table-memory-mb does not work with --ps-replicas 2 yet "
                        "(a shard's copy on its backup holds every row in memory)");
    ps_tier *tier = qr__calloc(1, sizeof *tier);
    if (!tier) return QR_ENOMEM;
    ps->tier = tier;
    tier->cap = (uint64_t)mb << 20;
    if (uv_mutex_init(&tier->snap_lock)) return qr__fail(QR_ENOMEM, "table disk tier: no lock");
    if (uv_cond_init(&tier->snap_ended)) {
        uv_mutex_destroy(&tier->snap_lock);
        return qr__fail(QR_ENOMEM, "table disk tier: no condition variable");
    }
    tier->snap_sync_made = true;
    const char *dir = qr__config_str(ps->cfg, "table-dir");
    int rc = QR_OK;
    if (dir[0]) {
        int n = snprintf(tier->dir, sizeof tier->dir, "%s/ps-%d", dir, ps->index);
        if (n < 0 || (size_t)n >= sizeof tier->dir)
            return qr__fail(QR_EINVAL, "--table-dir '%.60s...' is too long", dir);
        rc = qr_mkdir(dir);
        if (!rc) rc = qr_mkdir(tier->dir);
        if (rc) {
            qr__error_prefix("--table-dir: ");
            return rc;
        }
        remove_files(tier); /* rows of an earlier run: the tier is scratch */
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(tier->dir, sizeof tier->dir, "%s/quorum-tables-ps%d-XXXXXX",
                 tmp && tmp[0] ? tmp : "/tmp", ps->index);
        if (!mkdtemp(tier->dir))
            return qr__fail(QR_EIO, "table disk tier: cannot make a directory %s: %s", tier->dir,
                            strerror(errno));
        tier->private_dir = true;
    }
    rc = mdb_env_create(&tier->env);
    if (!rc) rc = mdb_env_set_maxdbs(tier->env, MAX_TABLES);
    if (!rc) rc = mdb_env_set_mapsize(tier->env, MAP_BYTES);
    if (!rc) rc = mdb_env_open(tier->env, tier->dir,
                               MDB_WRITEMAP | MDB_NOSYNC | MDB_NOMETASYNC | MDB_NORDAHEAD |
                               MDB_NOTLS, 0600);
    if (rc) {
        rc = lmdb_fail(rc, tier->dir);
        if (tier->env) mdb_env_close(tier->env);
        tier->env = NULL;
        remove_files(tier); /* what a failed open left (its file, a private directory) */
        return rc;
    }
    qr__log(QR_LOG_INFO, "tables: at most %lld MiB of rows in memory, colder rows on disk in %s "
            "(LMDB%s)", (long long)mb, tier->dir, tier->private_dir ? ", removed at the end" : "");
    /* Opened before the restore (server.c), which attaches its tables and
     * spills batch by batch; tables already in the store (none at start)
     * are attached, what exceeds the cap goes to disk. */
    for (uint32_t i = 0; !rc && i < ps->store.cap; i++) {
        qr_var *v = ps->store.by_id[i];
        if (v && v->table) rc = attach(tier, v);
    }
    if (!rc && tier->ntables) rc = enforce_cap(tier, tier->tables[0]);
    return rc;
}

void qr__tier_free(qr_ps *ps) {
    ps_tier *tier = ps->tier;
    if (!tier) return;
    for (int i = 0; i < tier->ntables; i++) {
        tier_table *tt = tier->tables[i];
        if (tt->var->table) tt->var->table->tier = NULL;
        free(tt->mark);
        free(tt->filter.words);
        free(tt);
    }
    free(tier->tables);
    free(tier->missing);
    free(tier->rows);
    free(tier->victims);
    free(tier->idle);
    if (tier->txn) mdb_txn_abort(tier->txn); /* scratch: nothing to keep */
    if (tier->env) {
        mdb_env_close(tier->env);
        remove_files(tier);
    }
    if (tier->snap_sync_made) {
        uv_mutex_destroy(&tier->snap_lock);
        uv_cond_destroy(&tier->snap_ended);
    }
    free(tier);
    ps->tier = NULL;
}


/* ---- checkpoints and restores in bounded batches ---------------------------------- */

/* A full checkpoint's rows on disk, read off the loop. The cut commits
 * the open write transaction and begins a read transaction on what it
 * committed: LMDB's reader table (the environment has its lock file for
 * it) keeps the pages that transaction sees from being reused by the
 * loop's later writes, so the writer's thread reads the table exactly as
 * it was at the cut while training goes on. Rows in memory at the cut
 * have their ids copied: their records on disk are stale (or absent) and
 * are skipped. */
struct qr_tier_snap {
    ps_tier *tier;
    MDB_txn *txn;          /* read-only */
    MDB_dbi dbi;
    /* a full checkpoint: the ids in memory at the cut, whose records are
     * skipped; an increment (listed): the ids of the changed rows on disk,
     * each read (sorted by the writer) */
    uint64_t *mem_ids;
    bool listed;
    uint64_t nmem, disk_rows;
    size_t record_bytes;
    int stride;
    bool evicts;
    int64_t clock;
    char name[128];
};

int qr__tier_snap_begin(const qr_table *t, const int64_t *changed, uint64_t nchanged,
                        qr_tier_snap **out) {
    *out = NULL;
    tier_table *tt = t->tier;
    if (!tt || !(changed ? nchanged : tt->disk_rows)) return QR_OK;
    ps_tier *tier = tt->owner;
    /* The read transaction sees what is committed: the open transaction's
     * writes too, then (a failed tier lost some: no snapshot of it). */
    int rc = tier_working(tier);
    if (!rc) rc = txn_commit(tier);
    /* The writes that come while the writer reads cannot reuse the pages
     * it reads: the map is grown now for a whole copy more of what is in
     * use, so that no resize (which would wait for the snapshot) comes.
     * (Another table's snapshot of the same cut grew it already: waiting
     * for that one here would wait for good, its writer not yet queued.) */
    if (!rc && !tier->snaps) rc = grow_map(tier, 2);
    if (rc) return rc;
    qr_tier_snap *s = qr__calloc(1, sizeof *s);
    uint64_t nids = changed ? nchanged : t->count;
    uint64_t *ids = malloc(QR_MAX(nids, 1) * sizeof *ids);
    if (!s || !ids) {
        free(s);
        free(ids);
        return qr__fail(QR_ENOMEM, "out of memory listing the rows of '%s' for a checkpoint",
                        tt->var->name);
    }
    memcpy(ids, changed ? (const void *)changed : (const void *)t->keys, nids * sizeof *ids);
    *s = (qr_tier_snap){.tier = tier, .dbi = tt->dbi, .mem_ids = ids, .nmem = nids,
                        .listed = changed != NULL,
                        .disk_rows = changed ? nchanged : tt->disk_rows,
                        .record_bytes = record_bytes(t), .stride = t->stride,
                        .evicts = t->evict_after > 0, .clock = t->clock};
    snprintf(s->name, sizeof s->name, "%s", tt->var->name);
    rc = mdb_txn_begin(tier->env, NULL, MDB_RDONLY, &s->txn);
    if (rc) {
        free(s->mem_ids);
        free(s);
        return lmdb_fail(rc, "beginning a checkpoint's read transaction");
    }
    uv_mutex_lock(&tier->snap_lock);
    tier->snaps++;
    uv_mutex_unlock(&tier->snap_lock);
    *out = s;
    return QR_OK;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* An increment's changed rows on disk, in key order (each search starts
 * near the last). */
static int snap_each_listed(qr_tier_snap *s, MDB_cursor *cur,
                            int (*fn)(void *ctx, int64_t id, const void *row, int64_t step),
                            void *ctx) {
    for (uint64_t k = 0; k < s->nmem; k++) {
        MDB_val key = {8, &s->mem_ids[k]}, val;
        int rc = mdb_cursor_get(cur, &key, &val, MDB_SET_KEY);
        if (!rc && val.mv_size != s->record_bytes) rc = MDB_CORRUPTED;
        if (rc)
            return qr__fail(QR_EIO, "table disk tier: '%s': the changed row of id %lld is not "
                            "on disk (%s)", s->name, (long long)s->mem_ids[k], mdb_strerror(rc));
        int64_t step = s->clock;
        if (s->evicts) memcpy(&step, (const char *)val.mv_data + s->stride * 4, 8);
        rc = fn(ctx, (int64_t)s->mem_ids[k], val.mv_data, step);
        if (rc) return rc;
    }
    return QR_OK;
}

int qr__tier_snap_each(qr_tier_snap *s,
                       int (*fn)(void *ctx, int64_t id, const void *row, int64_t step),
                       void *ctx) {
    qsort(s->mem_ids, s->nmem, sizeof *s->mem_ids, cmp_u64);
    MDB_cursor *cur;
    int rc = mdb_cursor_open(s->txn, s->dbi, &cur);
    if (rc) return lmdb_fail(rc, "opening a checkpoint's cursor");
    if (s->listed) {
        rc = snap_each_listed(s, cur, fn, ctx);
        mdb_cursor_close(cur);
        return rc;
    }
    MDB_val key, val;
    uint64_t k = 0;
    int frc = QR_OK;
    for (rc = mdb_cursor_get(cur, &key, &val, MDB_FIRST); !rc && k < s->disk_rows;
         rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
        if (key.mv_size != 8 || val.mv_size != s->record_bytes) {
            rc = MDB_CORRUPTED;
            break;
        }
        uint64_t id;
        int64_t step = s->clock;
        memcpy(&id, key.mv_data, 8);
        if (bsearch(&id, s->mem_ids, s->nmem, sizeof id, cmp_u64)) continue; /* in memory: stale */
        if (s->evicts) memcpy(&step, (const char *)val.mv_data + s->stride * 4, 8);
        k++;
        frc = fn(ctx, (int64_t)id, val.mv_data, step);
        if (frc) break;
    }
    mdb_cursor_close(cur);
    if (frc) return frc;
    if (k != s->disk_rows || (rc && rc != MDB_NOTFOUND))
        return qr__fail(QR_EIO, "table disk tier: '%s' held %llu rows on disk at the "
                        "checkpoint's cut, %llu read back (%s)", s->name,
                        (unsigned long long)s->disk_rows, (unsigned long long)k,
                        rc && rc != MDB_NOTFOUND ? mdb_strerror(rc) : "too few");
    return QR_OK;
}

void qr__tier_snap_end(qr_tier_snap *s) {
    if (!s) return;
    ps_tier *tier = s->tier;
    mdb_txn_abort(s->txn);
    uv_mutex_lock(&tier->snap_lock);
    tier->snaps--;
    uv_cond_signal(&tier->snap_ended);
    uv_mutex_unlock(&tier->snap_lock);
    free(s->mem_ids);
    free(s);
}

uint64_t qr__tier_snap_rows(const qr_tier_snap *s) {
    return s ? s->disk_rows : 0;
}

int qr__tier_spool(const qr_table *t) {
    const char *dir = "/tmp";
    if (t->tier) dir = t->tier->owner->dir;
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/spool-XXXXXX", dir);
        fd = mkostemp(path, O_CLOEXEC);
        if (fd >= 0) unlink(path);
    }
    if (fd < 0) return -qr__fail(QR_EIO, "a checkpoint's spool in %s: %s", dir, strerror(errno));
    return fd;
}

int qr__tier_restore_attach(qr_ps *ps, qr_var *v) {
    ps_tier *tier = ps->tier;
    if (!tier || !v->table || v->table->tier) return QR_OK;
    return attach(tier, v);
}

int qr__tier_restore_spill(qr_ps *ps, qr_var *v) {
    ps_tier *tier = ps->tier;
    if (!tier || !v->table || !v->table->tier) return QR_OK;
    tier_table *tt = v->table->tier;
    int rc = QR_OK;
    for (int i = 0; i < tier->ntables && !rc; i++) rc = sync_marks(tier->tables[i]);
    return rc ? rc : enforce_cap(tier, tt);
}

void qr__tier_detach(qr_ps *ps, qr_var *v) {
    ps_tier *tier = ps->tier;
    if (!tier || !v->table || !v->table->tier) return;
    tier_table *tt = v->table->tier;
    for (int i = 0; i < tier->ntables; i++)
        if (tier->tables[i] == tt) {
            tier->tables[i] = tier->tables[--tier->ntables];
            break;
        }
    /* Its records go with it (a table replaced whole, a failed restore). */
    if (!txn_open(tier)) {
        int lrc = mdb_drop(tier->txn, tt->dbi, 0);
        if (lrc) tier_failed(tier, lrc, "dropping a table's records");
        else txn_commit(tier);
    }
    v->table->tier = NULL;
    free(tt->mark);
    free(tt->filter.words);
    free(tt);
}

uint64_t qr__tier_batch_rows(const qr_ps *ps, const qr_table *t) {
    uint64_t rows = (uint64_t)1 << 16;
    if (ps && ps->tier) rows = QR_MIN(rows, ps->tier->cap / 4 / row_cost(t));
    return QR_MAX(rows, 1);
}

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
 * Which rows go out: CLOCK (second chance) over the rows in memory, one
 * byte a row: a request's rows are marked referenced; the hand clears
 * marks and takes the first unmarked row. A request's own rows are
 * protected while room is made for its misses.
 *
 * A record on disk: the row's value and slots (stride floats), then its
 * last update step when the table evicts by age (int64).
 */
#include "ps/ps_internal.h"
#include "ps/tier.h"

#include "ckpt/ckpt.h"

#include <errno.h>
#include <lmdb.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Address space reserved for the file (sparse: only what is written
 * takes disk). 1 TiB holds several billion small rows. */
#define MAP_BYTES ((size_t)1 << 40)
/* Tables one ps may tier. */
#define MAX_TABLES 4096

/* A row's CLOCK mark. */
enum { COLD = 0, REFERENCED = 1, PROTECTED = 2, LEAVING = 3 };

struct tier_table {
    struct ps_tier *owner;
    qr_var *var;
    MDB_dbi dbi;
    uint8_t *mark;       /* [rows in memory] */
    uint64_t nmark, mark_cap;
    uint64_t hand;
    uint64_t disk_rows;
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
} ps_tier;

static int lmdb_fail(int rc, const char *what) {
    return qr__fail(rc == ENOMEM ? QR_ENOMEM : QR_EIO, "table disk tier: %s: %s", what,
                    mdb_strerror(rc));
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
    if (t->count > tt->nmark) memset(tt->mark + tt->nmark, REFERENCED, t->count - tt->nmark);
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
    if (!tt || !tables) {
        free(tt);
        return qr__fail(QR_ENOMEM, "out of memory tiering table '%s'", v->name);
    }
    tier->tables = tables;
    MDB_txn *txn;
    int rc = mdb_txn_begin(tier->env, NULL, 0, &txn);
    if (!rc) {
        rc = mdb_dbi_open(txn, v->name, MDB_CREATE | MDB_INTEGERKEY, &tt->dbi);
        /* A database left by an earlier run of this ps (a rollback) holds
         * rows of that run: empty it. */
        if (!rc) rc = mdb_drop(txn, tt->dbi, 0);
        if (!rc) rc = mdb_txn_commit(txn);
        else mdb_txn_abort(txn);
    }
    if (rc) {
        free(tt);
        return lmdb_fail(rc, v->name);
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
    while (!rc && *want > 0 && t->count && passed <= 2 * t->count) {
        if (tt->hand >= t->count) tt->hand = 0;
        uint64_t r = tt->hand++;
        if (tt->mark[r] != COLD) {
            if (tt->mark[r] == REFERENCED) tt->mark[r] = COLD;
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

/* The victims' records into txn, in key order through one cursor a
 * table: a put then finds its leaf near the last one. */
static int write_victims(ps_tier *tier, MDB_txn *txn) {
    qsort(tier->victims, tier->nvictims, sizeof *tier->victims, by_table_then_id);
    MDB_cursor *cur = NULL;
    const tier_table *open = NULL;
    int rc = 0;
    for (uint64_t k = 0; k < tier->nvictims && !rc; k++) {
        victim *x = &tier->victims[k];
        const qr_table *t = x->tt->var->table;
        if (x->tt != open) {
            if (cur) mdb_cursor_close(cur);
            cur = NULL;
            rc = mdb_cursor_open(txn, x->tt->dbi, &cur);
            if (rc) break;
            open = x->tt;
        }
        MDB_val key = {8, &x->id}, val = {record_bytes(t), NULL};
        rc = mdb_cursor_put(cur, &key, &val, MDB_RESERVE);
        if (!rc) fill_record(t, x->row, val.mv_data);
    }
    if (cur) mdb_cursor_close(cur);
    return rc ? lmdb_fail(rc, "writing rows out") : QR_OK;
}

/* Room for want more bytes, written into txn: tt's rows first, then the
 * other tables'. */
static int make_room(ps_tier *tier, tier_table *tt, MDB_txn *txn, int64_t want) {
    int rc = choose_victims(tier, tt, &want);
    for (int i = 0; !rc && want > 0 && i < tier->ntables; i++)
        if (tier->tables[i] != tt) rc = choose_victims(tier, tier->tables[i], &want);
    return rc ? rc : write_victims(tier, txn);
}

/* By table, the highest rows first: a removal moves the table's last row
 * into the hole, and the last row is then never one still to go. */
static int by_table_then_row_down(const void *a, const void *b) {
    const victim *x = a, *y = b;
    if (x->tt != y->tt) return x->tt < y->tt ? -1 : 1;
    return x->row < y->row ? 1 : x->row > y->row ? -1 : 0;
}

/* After the commit: the victims leave memory. */
static void remove_victims(ps_tier *tier) {
    qsort(tier->victims, tier->nvictims, sizeof *tier->victims, by_table_then_row_down);
    for (uint64_t k = 0; k < tier->nvictims; k++) {
        tier_table *tt = tier->victims[k].tt;
        qr_table *t = tt->var->table;
        uint64_t r = tier->victims[k].row;
        qr_table_remove(t, r);
        tt->mark[r] = tt->mark[t->count];
        tt->nmark = t->count;
        tt->disk_rows++;
        tt->spilled++;
    }
    tier->nvictims = 0;
}

/* A failed transaction: the victims stay, unmarked. */
static void keep_victims(ps_tier *tier) {
    for (uint64_t k = 0; k < tier->nvictims; k++)
        tier->victims[k].tt->mark[tier->victims[k].row] = COLD;
    tier->nvictims = 0;
}

/* The missing ids that are on disk come back (appended to the table, and
 * deleted from disk in txn); *found counts them. One cursor, ids in key
 * order: each search starts near the last. */
static int fetch(tier_table *tt, MDB_txn *txn, const int64_t *missing, uint64_t nmiss,
                 uint64_t *found) {
    qr_table *t = tt->var->table;
    size_t bytes = record_bytes(t);
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, tt->dbi, &cur);
    if (rc) return lmdb_fail(rc, "opening a cursor");
    for (uint64_t k = 0; k < nmiss && tt->disk_rows > *found && !rc; k++) {
        int64_t id = missing[k];
        MDB_val key = {8, &id}, val;
        rc = mdb_cursor_get(cur, &key, &val, MDB_SET_KEY);
        if (rc == MDB_NOTFOUND) {
            rc = 0;
            continue;
        }
        if (rc) {
            rc = lmdb_fail(rc, "reading a row");
            break;
        }
        if (val.mv_size != bytes) {
            rc = qr__fail(QR_EIO, "table disk tier: the record of id %lld in '%s' has %zu "
                          "bytes, not %zu", (long long)id, tt->var->name, val.mv_size, bytes);
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
        rc = mdb_cursor_del(cur, 0);
        if (rc) {
            rc = lmdb_fail(rc, "deleting a row brought back");
            break;
        }
        (*found)++;
    }
    mdb_cursor_close(cur);
    return rc;
}

/* LMDB's order of MDB_INTEGERKEY keys: unsigned. */
static int by_id(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The ids of a request missing from memory: those on disk come back and
 * colder rows make room for every missing one (the rest may become new
 * rows), in one write transaction. */
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
    MDB_txn *txn;
    int rc = mdb_txn_begin(tier->env, NULL, 0, &txn);
    if (rc) return lmdb_fail(rc, "beginning a transaction");
    /* The request's rows stay while room is made for its misses. */
    const int64_t *rows = tier->rows;
    for (int64_t i = 0; i < n; i++)
        if (rows[i] >= 0) tt->mark[rows[i]] = PROTECTED;
    uint64_t count0 = t->count, found = 0;
    rc = fetch(tt, txn, tier->missing, nmiss, &found);
    if (!rc) rc = sync_marks(tt);
    for (uint64_t r = count0; !rc && r < t->count; r++) tt->mark[r] = PROTECTED;
    int64_t want = (int64_t)(used_bytes(tier) + (nmiss - found) * cost) - (int64_t)tier->cap;
    if (!rc && want > 0) rc = make_room(tier, tt, txn, want);
    if (!rc) {
        rc = mdb_txn_commit(txn);
        if (rc) rc = lmdb_fail(rc, "committing");
    } else {
        mdb_txn_abort(txn);
    }
    /* Unprotected before any removal moves rows. */
    for (int64_t i = 0; i < n; i++)
        if (rows[i] >= 0) tt->mark[rows[i]] = REFERENCED;
    for (uint64_t r = count0; r < tt->nmark; r++) tt->mark[r] = REFERENCED;
    if (rc) {
        /* As it was: the rows brought back leave memory again (they are
         * still on disk), the victims stay. */
        keep_victims(tier);
        while (t->count > count0) qr_table_remove(t, t->count - 1);
        tt->nmark = QR_MIN(tt->nmark, t->count);
        return rc;
    }
    tt->disk_rows -= found;
    tt->disk_hits += found;
    tt->misses += nmiss - found;
    remove_victims(tier);
    return QR_OK;
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
    MDB_txn *txn;
    MDB_cursor *cur;
    int rc = mdb_txn_begin(tier->env, NULL, 0, &txn);
    if (rc) return lmdb_fail(rc, "beginning a sweep");
    rc = mdb_cursor_open(txn, tt->dbi, &cur);
    if (rc) {
        mdb_txn_abort(txn);
        return lmdb_fail(rc, "opening a cursor");
    }
    uint64_t gone = 0;
    MDB_val key, val;
    size_t at = (size_t)t->stride * 4;
    for (rc = mdb_cursor_get(cur, &key, &val, MDB_FIRST); !rc;
         rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
        int64_t step;
        memcpy(&step, (char *)val.mv_data + at, 8);
        if (t->clock - step <= t->evict_after) continue;
        rc = mdb_cursor_del(cur, 0);
        if (rc) break;
        gone++;
    }
    mdb_cursor_close(cur);
    if (rc != MDB_NOTFOUND) {
        mdb_txn_abort(txn);
        return lmdb_fail(rc, "sweeping idle rows");
    }
    rc = mdb_txn_commit(txn);
    if (rc) return lmdb_fail(rc, "committing a sweep");
    tt->disk_rows -= gone;
    t->evicted += gone;
    return QR_OK;
}

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
    /* One pass over the index, its slots prefetched ahead (table.c's
     * lookup does the same). */
    uint64_t nmiss = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i + 8 < n) __builtin_prefetch(t->index.slot + qr_idmap_home(&t->index, ids[i + 8]));
        int64_t r = qr_table_find(t, ids[i]);
        tier->rows[i] = r;
        if (r >= 0) tt->mark[r] = REFERENCED;
        else tier->missing[nmiss++] = ids[i];
    }
    tt->memory_hits += (uint64_t)n - nmiss;
    if (nmiss) rc = bring_back(tier, tt, n, nmiss);
    if (!rc) rc = sweep_disk(tier, tt);
    return rc;
}

uint64_t qr__tier_disk_rows(const qr_table *t) {
    return t->tier ? t->tier->disk_rows : 0;
}

int qr__tier_copy_disk_rows(const qr_table *t, int64_t *ids, float **rows, int64_t *steps,
                            uint64_t from) {
    tier_table *tt = t->tier;
    if (!tt || !tt->disk_rows) return QR_OK;
    MDB_txn *txn;
    MDB_cursor *cur;
    int rc = mdb_txn_begin(tt->owner->env, NULL, MDB_RDONLY, &txn);
    if (rc) return lmdb_fail(rc, "reading the rows for a checkpoint");
    rc = mdb_cursor_open(txn, tt->dbi, &cur);
    if (rc) {
        mdb_txn_abort(txn);
        return lmdb_fail(rc, "opening a cursor");
    }
    MDB_val key, val;
    uint64_t k = from, end = from + tt->disk_rows;
    size_t row_bytes = (size_t)t->dim * 4, bytes = record_bytes(t);
    for (rc = mdb_cursor_get(cur, &key, &val, MDB_FIRST); !rc && k < end;
         rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT), k++) {
        if (key.mv_size != 8 || val.mv_size != bytes) {
            rc = MDB_CORRUPTED;
            break;
        }
        if (ids) memcpy(&ids[k], key.mv_data, 8);
        for (int s = 0; rows && s <= t->nslots; s++)
            memcpy(rows[s] + k * (uint64_t)t->dim, (const char *)val.mv_data + s * row_bytes,
                   row_bytes);
        if (steps) {
            if (t->evict_after) memcpy(&steps[k], (const char *)val.mv_data + t->stride * 4, 8);
            else steps[k] = t->clock;
        }
    }
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    if (k != end || (rc && rc != MDB_NOTFOUND))
        return qr__fail(QR_EIO, "table disk tier: '%s' holds %llu rows on disk, %llu read back "
                        "(%s)", tt->var->name, (unsigned long long)tt->disk_rows,
                        (unsigned long long)(k - from), rc ? mdb_strerror(rc) : "too few");
    return QR_OK;
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
    MDB_txn *txn;
    MDB_stat st;
    if (mdb_txn_begin(tt->owner->env, NULL, MDB_RDONLY, &txn)) return;
    if (!mdb_stat(txn, tt->dbi, &st))
        out->disk_bytes = (uint64_t)st.ms_psize *
                          (st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages);
    mdb_txn_abort(txn);
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
    MDB_txn *txn;
    int rc = mdb_txn_begin(tier->env, NULL, 0, &txn);
    if (rc) return lmdb_fail(rc, "beginning a transaction");
    rc = make_room(tier, tt, txn, want);
    if (!rc) {
        rc = mdb_txn_commit(txn);
        if (rc) rc = lmdb_fail(rc, "committing");
    } else {
        mdb_txn_abort(txn);
    }
    if (rc) keep_victims(tier);
    else remove_victims(tier);
    return rc;
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
                               MDB_NOTLS | MDB_NOLOCK, 0600);
    if (rc) {
        rc = lmdb_fail(rc, tier->dir);
        if (tier->env) mdb_env_close(tier->env);
        tier->env = NULL;
        if (tier->private_dir) rmdir(tier->dir);
        return rc;
    }
    qr__log(QR_LOG_INFO, "tables: at most %lld MiB of rows in memory, colder rows on disk in %s "
            "(LMDB%s)", (long long)mb, tier->dir, tier->private_dir ? ", removed at the end" : "");
    /* Tables restored from a checkpoint came back whole: what exceeds the
     * cap goes to disk now. */
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
        free(tt);
    }
    free(tier->tables);
    free(tier->missing);
    free(tier->rows);
    free(tier->victims);
    if (tier->env) {
        mdb_env_close(tier->env);
        remove_files(tier);
    }
    free(tier);
    ps->tier = NULL;
}


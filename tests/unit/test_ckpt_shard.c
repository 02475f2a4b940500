/*
 * test_ckpt_shard.c - one shard of a checkpoint, written and read back
 * with the format's functions alone (ps/ckpt_shard.h): no ps, no cluster.
 *
 * A store holds two dense variables trained by the ps's Adam (per-element
 * slots and scalar ones), one with a moving average, a third with its own
 * AdamW (options "optimizer=adamw,weight-decay=0.05"), and an embedding
 * table with its own Adagrad (per-row slots), admission candidates and
 * eviction steps, and a second one that counts sightings in a counting
 * Bloom filter (admit_filter=bloom: its counters, NAME/admission_filter,
 * uint8), sighted again after the snapshot. The shard is snapshotted, then the live variables are
 * changed as an apply would change them (qr__ckpt_before_apply first):
 * the shard written afterwards must hold the state at the snapshot, and
 * restoring it into an empty store must give every value, slot, average,
 * row, counter and data position back bit for bit. The same snapshot as a
 * re-replication sends it (the head, then the tensors where they are) is
 * the file byte for byte, and received in place (its head first, then
 * each tensor's bytes straight into the variable made for it) gives the
 * same state; a SNAPSHOT that does not fit its head is refused.
 *
 * Then the refusals: a shard cut short, one whose header is damaged, one
 * of the other mode, each refused with an error naming the problem; a
 * flipped tensor byte is caught by the checkpoint's crc32 (qr_ckpt_verify),
 * which is how a starting ps refuses it. A shard of another checkpoint
 * (another step, or the same step from another run) whose manifest was
 * made to match its size and crc32 is refused by its header, and a
 * version 1 checkpoint (no checkpoint id) still verifies.
 *
 * Incremental: a full shard, changes of every kind, an increment of it;
 * the full one restored and the increment applied equal the live store
 * bit for bit, and neither kind passes for the other; pruning keeps the
 * checkpoints a kept increment's chain needs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <cjson/cJSON.h>

#include "ps/ps_internal.h"

enum { ROWS = 6, COLS = 5, BIAS = 7, DIM = 4, TABLE_ROWS = 9, CANDIDATES = 3, WORKERS = 3 };
#define STEP 42
/* The ps run that wrote the shards (ps 0: its own checkpoints' coordinator). */
#define INCARNATION 0x5eed0000cafe0042ull

/* The world of one test: a config (Adam), the ps's optimizer, a store. */
typedef struct world {
    qr_config *cfg;
    qr_optim *optim;
    qr_store store;
    uint64_t data_pos[WORKERS];
    char dir[256];
} world;

static uint32_t rng = 12345;
static float next_float(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / (float)(1u << 24) - 0.5f;
}

static void fill(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = next_float();
}

static ckpt_shard_ctx ctx_of(world *w, qr_store *store) {
    return (ckpt_shard_ctx){.store = store, .optim = w->optim, .cfg = w->cfg, .index = 0,
                            .nps = 1, .nworkers = WORKERS, .sync = false, .applied_steps = 17,
                            .average_decay = 0.99f, .data_pos = w->data_pos,
                            .incarnation = INCARNATION, .coordinator = INCARNATION};
}

static qr_var *dense(world *w, uint32_t id, const char *name, int ndim, const int64_t *shape,
                     bool average, const char *options) {
    qr_var *v = calloc(1, sizeof *v);
    v->id = id;
    v->name = strdup(name);
    v->options = strdup(options);
    if (options[0])
        assert_int_equal(qr_optim_create_for_var(&v->optim, w->cfg, options), QR_OK);
    v->ndim = ndim;
    v->n = 1;
    for (int i = 0; i < ndim; i++) v->n *= (v->shape[i] = shape[i]);
    v->lr = id == 1 ? -1.0f : 0.25f;
    v->version = 100 + id;
    v->value = qr_tensor_new(v->n);
    fill(v->value->data, v->n);
    int64_t dim = shape[ndim - 1];
    assert_int_equal(
        qr_optim_slots_create(v->optim ? v->optim : w->optim, v->n / dim, dim, &v->slots),
        QR_OK);
    for (int s = 0; s < qr_optim_slots_count(v->slots); s++) {
        const char *slot;
        float *data;
        int64_t n;
        qr_optim_slot(v->slots, s, &slot, &data, &n);
        fill(data, n);
    }
    if (average) {
        v->average = qr_tensor_new(v->n);
        fill(v->average->data, v->n);
    }
    assert_int_equal(qr_store_add(&w->store, v), QR_OK);
    return v;
}

static qr_var *table(world *w, uint32_t id, const char *name, bool bloom) {
    qr_var *v = calloc(1, sizeof *v);
    v->id = id;
    v->name = strdup(name);
    v->options = strdup(bloom ? "optimizer=adagrad,admit_after=3,evict_after_steps=1000,"
                                "admit_filter=bloom,admit_filter_bytes=1000"
                              : "optimizer=adagrad,admit_after=3,evict_after_steps=1000");
    v->ndim = 1;
    v->shape[0] = DIM;
    v->lr = -1.0f;
    v->version = 9;
    const char *init = "normal:0,0.1";
    qr_msg_create_var m = {.id = id, .ndim = 1, .shape = {DIM}, .lr = -1.0f,
                           .kind = QR_VAR_TABLE, .init = init,
                           .init_len = (uint32_t)strlen(init), .seed = 77};
    assert_int_equal(qr_optim_create_for_var(&v->optim, w->cfg, v->options), QR_OK);
    assert_int_equal(qr_optim_slots_create(v->optim, 0, DIM, &v->slots), QR_OK);
    assert_int_equal(qr__create_table(v->optim, v, &m), QR_OK);
    qr_table *t = v->table;
    assert_true(t->nslots >= 1 && t->admit_after == 3 && t->evict_after == 1000);
    for (int k = 0; k < TABLE_ROWS; k++) {
        bool added;
        int64_t r = qr_table_get_or_add(t, 1000 + 37 * k, &added);
        assert_true(r >= 0 && added);
        fill(qr_table_row(t, (uint64_t)r), (int64_t)(1 + t->nslots) * DIM);
        t->updated[r] = 500 + k;
    }
    for (int k = 0; k < CANDIDATES; k++) { /* seen once or twice: not admitted yet */
        int64_t row;
        bool added;
        for (int seen = 0; seen <= k % 2; seen++) {
            assert_int_equal(qr_table_sight(t, 5000 + k, &row, &added), QR_OK);
            assert_int_equal(row, -1);
        }
    }
    assert_int_equal(t->ncand, bloom ? 0 : CANDIDATES);
    assert_int_equal(t->filter.m, bloom ? 1000 : 0);
    assert_int_equal(qr_store_add(&w->store, v), QR_OK);
    return v;
}

static int setup(void **state) {
    world *w = calloc(1, sizeof *w);
    assert_int_equal(qr_config_new(&w->cfg), QR_OK);
    assert_int_equal(qr_config_set(w->cfg, "optimizer", "adam"), QR_OK);
    assert_int_equal(qr_optim_create(&w->optim, w->cfg), QR_OK);
    qr_store_init(&w->store);
    for (int i = 0; i < WORKERS; i++) w->data_pos[i] = 1000u * (uint64_t)(i + 1) + 3;
    snprintf(w->dir, sizeof w->dir, "/tmp/qr-test-shard-%d", (int)getpid());
    assert_int_equal(qr_mkdir(w->dir), QR_OK); /* the checkpoint root, as qr__ckpt_init */
    int64_t shape_w[2] = {ROWS, COLS}, shape_b[1] = {BIAS};
    dense(w, 1, "layer0/weights", 2, shape_w, true, "");
    dense(w, 2, "layer0/biases", 1, shape_b, false, "");
    table(w, 3, "emb", false);
    table(w, 5, "emb_bloom", true);
    qr_var *adamw = dense(w, 4, "layer1/weights", 2, shape_w, false,
                          "optimizer=adamw,weight-decay=0.05");
    assert_string_equal(qr_optim_name(adamw->optim), "adamw");
    assert_int_equal(qr_optim_slots_count(adamw->slots), 2);
    *state = w;
    return 0;
}

static int teardown(void **state) {
    world *w = *state;
    qr_store_free(&w->store);
    qr_optim_free(w->optim);
    qr_config_free(w->cfg);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", w->dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", w->dir);
    free(w);
    return 0;
}

/* Snapshot, then write the shard as the thread pool would: its file in
 * path, and in *shard (if not NULL) what the manifest lists of it. */
static void write_shard_of(world *w, int64_t step, uint64_t id, uint64_t base, char *path,
                           size_t len, qr_ckpt_shard *shard) {
    ckpt_shard_ctx c = ctx_of(w, &w->store);
    c.base = base;
    ckpt_job *j;
    assert_int_equal(qr__ckpt_shard_snapshot(&c, w->dir, id, step, &j), QR_OK);
    j->work.data = j;
    qr__ckpt_shard_write(&j->work);
    if (j->status) fail_msg("writing the shard: %s", j->error);
    assert_true(j->bytes > 0);
    snprintf(path, len, "%s", j->path);
    if (shard) {
        *shard = (qr_ckpt_shard){.bytes = j->bytes, .crc32 = j->crc, .nvars = j->nentries};
        qr_ckpt_shard_name(shard->file, sizeof shard->file, c.index, c.nps);
    }
    qr__ckpt_shard_free(j);
}

/* A full shard, checkpoint id 1. */
static void write_shard(world *w, int64_t step, char *path, size_t len, qr_ckpt_shard *shard) {
    write_shard_of(w, step, 1, 0, path, len, shard);
}

static void assert_slots_equal(const qr_var *a, const qr_var *b) {
    assert_int_equal(qr_optim_slots_count(a->slots), qr_optim_slots_count(b->slots));
    for (int s = 0; s < qr_optim_slots_count(a->slots); s++) {
        const char *na, *nb;
        float *da, *db;
        int64_t n, m;
        qr_optim_slot(a->slots, s, &na, &da, &n);
        qr_optim_slot(b->slots, s, &nb, &db, &m);
        assert_string_equal(na, nb);
        assert_int_equal(n, m);
        if (a->table && s < a->table->nslots) continue; /* per-row: in the rows */
        assert_memory_equal(da, db, (size_t)n * sizeof(float));
    }
}

/* Every variable of `want` is in `got` with the same bits. */
static void assert_stores_equal(const qr_store *want, const qr_store *got) {
    assert_int_equal(want->count, got->count);
    for (uint32_t i = 0; i < want->cap; i++) {
        const qr_var *a = want->by_id[i];
        if (!a) continue;
        const qr_var *b = qr_store_find_name(got, a->name);
        if (!b) fail_msg("variable '%s' was not restored", a->name);
        assert_int_equal(a->id, b->id);
        assert_int_equal(a->ndim, b->ndim);
        assert_memory_equal(a->shape, b->shape, sizeof a->shape);
        assert_int_equal(a->n, b->n);
        assert_memory_equal(&a->lr, &b->lr, sizeof a->lr);
        assert_int_equal(a->version, b->version);
        assert_string_equal(a->options, b->options);
        assert_true((a->optim == NULL) == (b->optim == NULL));
        if (a->optim) { /* remade from the options: the same optimizer */
            assert_string_equal(qr_optim_name(a->optim), qr_optim_name(b->optim));
            assert_true(qr_optim_weight_decay(a->optim) == qr_optim_weight_decay(b->optim));
        }
        assert_slots_equal(a, b);
        assert_true((a->average == NULL) == (b->average == NULL));
        if (a->average)
            assert_memory_equal(a->average->data, b->average->data, (size_t)a->n * 4);
        assert_true((a->table == NULL) == (b->table == NULL));
        if (!a->table) {
            assert_memory_equal(a->value->data, b->value->data, (size_t)a->n * 4);
            continue;
        }
        const qr_table *ta = a->table, *tb = b->table;
        assert_int_equal(ta->count, tb->count);
        assert_int_equal(ta->dim, tb->dim);
        assert_int_equal(ta->nslots, tb->nslots);
        assert_int_equal(ta->seed, tb->seed);
        for (uint64_t r = 0; r < ta->count; r++) {
            int64_t at = qr_table_find(tb, ta->keys[r]);
            if (at < 0) fail_msg("table '%s': row %lld was not restored", a->name,
                                 (long long)ta->keys[r]);
            assert_memory_equal(qr_table_row(ta, r), qr_table_row(tb, (uint64_t)at),
                                (size_t)(1 + ta->nslots) * (size_t)ta->dim * 4);
            if (ta->updated) assert_int_equal(ta->updated[r], tb->updated[at]);
        }
        assert_int_equal(ta->ncand, tb->ncand);
        assert_int_equal(ta->filter.m, tb->filter.m);
        if (ta->filter.m) assert_memory_equal(ta->filter.counters, tb->filter.counters, ta->filter.m);
        for (uint64_t k = 0; k < ta->ncand; k++) {
            bool found = false;
            for (uint64_t l = 0; l < tb->ncand; l++)
                if (tb->cand_ids[l] == ta->cand_ids[k]) {
                    assert_int_equal(ta->cand_seen[k], tb->cand_seen[l]);
                    found = true;
                }
            if (!found) fail_msg("table '%s': candidate %lld was not restored", a->name,
                                 (long long)ta->cand_ids[k]);
        }
    }
}

/* Restore `path` into a new store (freed by the caller); the status. */
static int restore(world *w, const char *path, bool sync, qr_store *into, int64_t counters[2],
                   uint64_t *data_pos) {
    qr_store_init(into);
    ckpt_shard_ctx c = ctx_of(w, into);
    c.sync = sync;
    c.data_pos = data_pos;
    return qr__ckpt_shard_restore(&c, path, counters);
}

/* A restored copy of the live store, taken through a shard: the expected
 * state, before the live one is changed. */
static void copy_store(world *w, qr_store *out) {
    char path[4200];
    write_shard(w, STEP - 1, path, sizeof path, NULL);
    int64_t counters[2];
    uint64_t pos[WORKERS];
    assert_int_equal(restore(w, path, false, out, counters, pos), QR_OK);
}

static void test_snapshot_write_restore(void **state) {
    world *w = *state;
    qr_store expect;
    copy_store(w, &expect);
    assert_stores_equal(&w->store, &expect);

    ckpt_shard_ctx c = ctx_of(w, &w->store);
    ckpt_job *j;
    assert_int_equal(qr__ckpt_shard_snapshot(&c, w->dir, 2, STEP, &j), QR_OK);
    /* Applies after the snapshot, before the writer: the shard keeps the
     * state at the snapshot (dense: copy-on-write; slots: cloned; table
     * rows and positions: copied). */
    for (uint32_t i = 0; i < w->store.cap; i++) {
        qr_var *v = w->store.by_id[i];
        if (!v) continue;
        assert_non_null(v->ckpt);
        assert_int_equal(qr__ckpt_before_apply(NULL, v), QR_OK);
        if (v->table) {
            fill(qr_table_row(v->table, 0), DIM);
            int64_t row;
            bool added;
            assert_int_equal(qr_table_sight(v->table, 7777, &row, &added), QR_OK);
        } else {
            assert_int_equal(qr_var_prepare_write(v), QR_OK);
            fill(v->value->data, v->n);
        }
        for (int s = 0; s < qr_optim_slots_count(v->slots); s++) {
            const char *slot;
            float *data;
            int64_t n;
            qr_optim_slot(v->slots, s, &slot, &data, &n);
            if (!v->table) fill(data, n);
        }
    }
    w->data_pos[1] = 99;
    j->work.data = j;
    qr__ckpt_shard_write(&j->work);
    if (j->status) fail_msg("writing the shard: %s", j->error);
    char path[4200];
    snprintf(path, sizeof path, "%s", j->path);
    assert_non_null(strstr(path, w->dir));
    qr__ckpt_shard_free(j);
    /* AdamW's slots carry TF's naming, the optimizer's class name:
     * "layer1/weights/AdamW" (m) and "layer1/weights/AdamW_1" (v) */
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    static char bytes[1 << 16];
    size_t len = fread(bytes, 1, sizeof bytes - 1, fp);
    fclose(fp);
    bytes[len] = 0;
    bool m_named = false, v_named = false;
    for (size_t i = 0; i + 24 < len; i++) {
        m_named |= !memcmp(bytes + i, "\"layer1/weights/AdamW\"", 22);
        v_named |= !memcmp(bytes + i, "\"layer1/weights/AdamW_1\"", 24);
    }
    assert_true(m_named && v_named);
    for (uint32_t i = 0; i < w->store.cap; i++)
        if (w->store.by_id[i]) assert_null(w->store.by_id[i]->ckpt);

    qr_store got;
    int64_t counters[2];
    uint64_t pos[WORKERS] = {0};
    if (restore(w, path, false, &got, counters, pos)) fail_msg("restore: %s", qr_last_error());
    assert_stores_equal(&expect, &got);
    assert_int_equal(counters[0], STEP);
    assert_int_equal(counters[1], 17); /* async: the step pushes applied */
    for (int i = 0; i < WORKERS; i++) assert_int_equal(pos[i], 1000u * (uint64_t)(i + 1) + 3);
    qr_store_free(&got);
    qr_store_free(&expect);
}

/* A re-replication's snapshot of w's store (*j; *expect a copy of the
 * store at it) and the bytes of its SNAPSHOT, malloc'd: the head, then
 * each tensor's where the snapshot holds it, as the socket delivers them. */
static uint8_t *snapshot_message(world *w, qr_store *expect, ckpt_job **jp, size_t *len) {
    copy_store(w, expect);
    ckpt_shard_ctx c = ctx_of(w, &w->store);
    assert_int_equal(qr__ckpt_shard_snapshot(&c, "re-replication", 0, STEP, jp), QR_OK);
    const ckpt_job *j = *jp;
    uint8_t *head;
    size_t head_len;
    assert_int_equal(qr_st_head(j->path, j->tensors, j->ntensors, j->meta, &head, &head_len),
                     QR_OK);
    *len = head_len;
    for (int i = 0; i < j->ntensors; i++) *len += (size_t)qr_st_bytes(&j->tensors[i]);
    uint8_t *msg = malloc(*len);
    assert_non_null(msg);
    memcpy(msg, head, head_len);
    size_t at = head_len;
    for (int i = 0; i < j->ntensors; i++) {
        size_t n = (size_t)qr_st_bytes(&j->tensors[i]);
        if (n) memcpy(msg + at, j->tensors[i].data, n);
        at += n;
    }
    free(head);
    return msg;
}

#define SNAPSHOT_NAME "the snapshot of shard 0"

/* msg's len bytes received as rerep.c receives a SNAPSHOT, into got: the
 * head parsed first and the store made from it, each dense variable's
 * tensors (value, slots, average) given their place in it, the rest
 * (tables, counters) a place of the file's; each tensor's bytes copied
 * to its place as the socket would copy them; then the shard finished. */
static void receive_in_place(world *w, const uint8_t *msg, size_t len, qr_store *got,
                             int64_t counters[2]) {
    uint64_t head_len;
    assert_int_equal(qr_st_head_length(msg, len, &head_len), QR_OK);
    qr_st_file f;
    assert_int_equal(qr_st_open_head(&f, msg, head_len, len, SNAPSHOT_NAME), QR_OK);
    qr_store_init(got);
    ckpt_shard_ctx into = ctx_of(w, got);
    cJSON *vars;
    if (qr__ckpt_shard_place(&into, &f, &vars)) fail_msg("place: %s", qr_last_error());
    int dense_placed = 0;
    for (uint32_t i = 0; i < got->cap; i++) {
        qr_var *v = got->by_id[i];
        if (!v) continue;
        assert_null(v->table); /* tables are made once their rows are in */
        const qr_st_tensor *t = qr_st_find(&f, v->name);
        assert_non_null(t);
        assert_ptr_equal(t->data, v->value->data); /* the value lands in the variable */
        dense_placed++;
    }
    assert_int_equal(dense_placed, 3);
    for (int i = 0; i < f.n; i++) {
        assert_non_null(f.t[i].data);
        memcpy((void *)f.t[i].data, msg + head_len + f.t[i].begin,
               (size_t)(f.t[i].end - f.t[i].begin));
    }
    if (qr__ckpt_shard_finish(&into, &f, vars, counters)) fail_msg("finish: %s", qr_last_error());
}

/* A re-replication's SNAPSHOT (rerep.c): the safetensors head, then the
 * snapshot's tensors where they are, as the socket delivers them one
 * after the other, is byte for byte the file the writer makes of the same
 * snapshot; received in place (receive_in_place) it gives the state at
 * the snapshot back, though the live variables changed after it. */
static void test_snapshot_sent_from_memory(void **state) {
    world *w = *state;
    qr_store expect;
    ckpt_job *j;
    size_t len;
    uint8_t *msg = snapshot_message(w, &expect, &j, &len);
    /* the same snapshot, written as a checkpoint's shard */
    snprintf(j->path, sizeof j->path, "%s/sent.safetensors", w->dir);
    j->work.data = j;
    qr__ckpt_shard_write(&j->work);
    if (j->status) fail_msg("writing the shard: %s", j->error);
    assert_int_equal(j->bytes, len);
    FILE *fp = fopen(j->path, "rb");
    assert_non_null(fp);
    uint8_t *file = malloc(len);
    assert_non_null(file);
    assert_int_equal(fread(file, 1, len, fp), len);
    fclose(fp);
    assert_memory_equal(file, msg, len);
    free(file);
    /* the live store moves on; the bytes sent keep the snapshot's state */
    for (uint32_t i = 0; i < w->store.cap; i++) {
        qr_var *v = w->store.by_id[i];
        if (!v || v->table) continue;
        assert_int_equal(qr__ckpt_before_apply(NULL, v), QR_OK);
        assert_int_equal(qr_var_prepare_write(v), QR_OK);
        fill(v->value->data, v->n);
    }
    qr__ckpt_shard_free(j);
    qr_store got;
    int64_t counters[2];
    receive_in_place(w, msg, len, &got, counters);
    assert_stores_equal(&expect, &got);
    assert_int_equal(counters[0], STEP);
    qr_store_free(&got);
    qr_store_free(&expect);
    free(msg);
}

/* A SNAPSHOT whose bytes do not fit its head, whose head is cut short or
 * is not JSON, or that gives one tensor two places, is refused by name
 * before a byte of its tensors would be taken. */
static void test_snapshot_refused(void **state) {
    world *w = *state;
    qr_store expect;
    ckpt_job *j;
    size_t len;
    uint8_t *msg = snapshot_message(w, &expect, &j, &len);
    qr__ckpt_shard_free(j);
    qr_store_free(&expect);
    uint64_t head_len;
    assert_int_equal(qr_st_head_length(msg, len, &head_len), QR_OK);
    qr_st_file f;
    /* the bytes announced are not those the head describes */
    assert_int_equal(qr_st_open_head(&f, msg, head_len, len - 1, SNAPSHOT_NAME), QR_EIO);
    assert_non_null(strstr(qr_last_error(), SNAPSHOT_NAME));
    assert_int_equal(qr_st_open_head(&f, msg, head_len, len + 4, SNAPSHOT_NAME), QR_EIO);
    assert_non_null(strstr(qr_last_error(), "bytes after its last tensor"));
    /* fewer bytes than a length word, or than the head it announces */
    uint64_t got_len;
    assert_int_equal(qr_st_head_length(msg, 5, &got_len), QR_EIO);
    assert_non_null(strstr(qr_last_error(), "are not a safetensors file"));
    assert_int_equal(qr_st_head_length(msg, head_len - 1, &got_len), QR_EIO);
    /* one tensor, two places */
    assert_int_equal(qr_st_open_head(&f, msg, head_len, len, SNAPSHOT_NAME), QR_OK);
    int64_t a, b; /* placing: nothing is read into them */
    const qr_st_tensor *t = qr_st_find(&f, "global_step");
    assert_int_equal(qr_st_read(&f, t, &a), QR_OK);
    assert_int_equal(qr_st_read(&f, t, &b), QR_EIO);
    assert_non_null(strstr(qr_last_error(), "'global_step' is named by two records"));
    qr_st_close(&f);
    /* a head that is not JSON */
    msg[8] = '[';
    assert_int_equal(qr_st_open_head(&f, msg, head_len, len, SNAPSHOT_NAME), QR_EIO);
    assert_non_null(strstr(qr_last_error(), "not a JSON object"));
    free(msg);
}

static void expect_refused(world *w, const char *path, bool sync, int status, const char *says) {
    qr_store s;
    int64_t counters[2];
    uint64_t pos[WORKERS];
    int rc = restore(w, path, sync, &s, counters, pos);
    qr_store_free(&s);
    if (rc != status || !strstr(qr_last_error(), says))
        fail_msg("expected %s with \"%s\", got %s: %s", qr_status_name(status), says,
                 qr_status_name(rc), qr_last_error());
}

static void copy_file(const char *from, const char *to, off_t keep) {
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    assert_int_equal(system(cmd), 0);
    if (keep >= 0) assert_int_equal(truncate(to, keep), 0);
}

static void poke(const char *path, off_t at, char byte) {
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, &byte, 1, at), 1);
    close(fd);
}

static void test_damaged_shards_refused(void **state) {
    world *w = *state;
    char path[4200], bad[4300];
    qr_ckpt_shard shard;
    write_shard(w, STEP, path, sizeof path, &shard);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    snprintf(bad, sizeof bad, "%s.bad", path);

    /* Cut short: its last tensor lies outside the file. */
    copy_file(path, bad, st.st_size - 10);
    expect_refused(w, bad, false, QR_EIO, "truncated");
    /* Cut inside the header. */
    copy_file(path, bad, 20);
    expect_refused(w, bad, false, QR_EIO, "does not fit the file");
    /* The header's JSON damaged (its opening brace). */
    copy_file(path, bad, -1);
    poke(bad, 8, 'x');
    expect_refused(w, bad, false, QR_EIO, "not a JSON object");
    /* Written in async mode, restored in sync mode. */
    expect_refused(w, path, true, QR_EINVAL, "written in async mode");
    /* Missing. */
    snprintf(bad, sizeof bad, "%s/nothing-here.safetensors", w->dir);
    expect_refused(w, bad, false, QR_ENOTFOUND, "nothing-here");

    /* A flipped byte of a tensor reads as a number: the checkpoint's
     * crc32, in its manifest, is what refuses it. */
    assert_int_equal(shard.bytes, (uint64_t)st.st_size);
    qr_ckpt_info info = {.step = STEP, .mode = "async", .nshards = 1, .shards = &shard,
                         .bytes = shard.bytes, .incarnation = INCARNATION, .checkpoint_id = 1};
    assert_int_equal(qr_ckpt_path(info.path, sizeof info.path, w->dir, STEP), QR_OK);
    assert_int_equal(qr_ckpt_write_manifest(&info), QR_OK);
    /* Read back as a starting ps reads it (qr__ckpt_init). */
    qr_ckpt_info read = {.step = STEP};
    snprintf(read.path, sizeof read.path, "%s", info.path);
    assert_int_equal(qr_ckpt_read_manifest(&read), QR_OK);
    assert_int_equal(qr_ckpt_verify(&read), QR_OK);
    poke(path, st.st_size - 3, 0x55);
    assert_int_equal(qr_ckpt_verify(&read), QR_EIO);
    assert_non_null(strstr(qr_last_error(), shard.file));
    qr_ckpt_info_free(&read);
}

/* The manifest of a one-shard checkpoint at `step` listing `shard`, as a
 * forger would write it: the size and crc32 of whatever file is there. */
static void write_manifest_for(world *w, int64_t step, const char *shard_path, uint64_t id,
                               qr_ckpt_info *read) {
    struct stat st;
    assert_int_equal(stat(shard_path, &st), 0);
    FILE *f = fopen(shard_path, "rb");
    assert_non_null(f);
    uint8_t *buf = malloc((size_t)st.st_size);
    assert_int_equal(fread(buf, 1, (size_t)st.st_size, f), (size_t)st.st_size);
    fclose(f);
    qr_ckpt_shard shard = {.bytes = (uint64_t)st.st_size,
                           .crc32 = (uint32_t)crc32(0L, buf, (uInt)st.st_size), .nvars = 4};
    free(buf);
    qr_ckpt_shard_name(shard.file, sizeof shard.file, 0, 1);
    qr_ckpt_info info = {.step = step, .mode = "async", .nshards = 1, .shards = &shard,
                         .bytes = shard.bytes, .incarnation = INCARNATION, .checkpoint_id = id};
    assert_int_equal(qr_ckpt_path(info.path, sizeof info.path, w->dir, step), QR_OK);
    assert_int_equal(qr_ckpt_write_manifest(&info), QR_OK);
    *read = (qr_ckpt_info){.step = step};
    snprintf(read->path, sizeof read->path, "%s", info.path);
    assert_int_equal(qr_ckpt_read_manifest(read), QR_OK);
}

static void test_mixed_checkpoint_refused(void **state) {
    world *w = *state;
    char old_path[4200], path[4200], cmd[9000];
    /* The shard of step STEP - 10, copied into the checkpoint of STEP. */
    write_shard(w, STEP - 10, old_path, sizeof old_path, NULL);
    write_shard(w, STEP, path, sizeof path, NULL);
    qr_ckpt_info c;
    write_manifest_for(w, STEP, path, 1, &c);
    assert_int_equal(qr_ckpt_verify(&c), QR_OK);
    qr_ckpt_info_free(&c);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", old_path, path);
    assert_int_equal(system(cmd), 0);
    write_manifest_for(w, STEP, path, 1, &c); /* its size and crc32 made to match */
    assert_int_equal(qr_ckpt_verify(&c), QR_EIO);
    assert_non_null(strstr(qr_last_error(), path));
    assert_non_null(strstr(qr_last_error(), "holds global step 32"));
    assert_non_null(strstr(qr_last_error(), "mixed steps"));
    qr_ckpt_info_free(&c);
    /* The same step from another checkpoint (another id: the shards were
     * written with id 1). */
    write_shard(w, STEP, path, sizeof path, NULL);
    write_manifest_for(w, STEP, path, 2, &c);
    assert_int_equal(qr_ckpt_verify(&c), QR_EIO);
    assert_non_null(strstr(qr_last_error(), "mixed checkpoints"));
    qr_ckpt_info_free(&c);
    /* The newest damaged, the one before intact: latest takes that one; all
     * damaged: latest says so (QR_EIO naming the file), not "none". */
    write_shard(w, STEP - 10, old_path, sizeof old_path, NULL);
    write_manifest_for(w, STEP - 10, old_path, 1, &c);
    qr_ckpt_info_free(&c);
    qr_ckpt_info latest;
    assert_int_equal(qr_ckpt_latest(w->dir, &latest), QR_OK);
    assert_int_equal(latest.step, STEP - 10);
    qr_ckpt_info_free(&latest);
    poke(old_path, 9, 'x');
    assert_int_equal(qr_ckpt_latest(w->dir, &latest), QR_EIO);
    assert_non_null(strstr(qr_last_error(), path));
    assert_non_null(strstr(qr_last_error(), old_path));
}

/* A version 1 manifest (no incarnation, no checkpoint id) over a version 1
 * shard is read and checked by step; version 4 is refused naming both. */
static void test_version_1_read(void **state) {
    world *w = *state;
    char path[4200], mpath[4300];
    write_shard(w, STEP, path, sizeof path, NULL);
    /* A version 1 shard: the same header with "version": "1" and none of
     * the checkpoint's names. Rewritten here as an old quorum wrote it. */
    qr_st_file f;
    assert_int_equal(qr_st_open(&f, path), QR_OK);
    cJSON *meta = cJSON_Duplicate(f.metadata, 1);
    cJSON_ReplaceItemInObject(meta, "version", cJSON_CreateString("1"));
    cJSON_DeleteItemFromObject(meta, "checkpoint_incarnation");
    cJSON_DeleteItemFromObject(meta, "checkpoint_id");
    cJSON_DeleteItemFromObject(meta, "incarnation");
    int n = f.n;
    qr_st_tensor *t = calloc((size_t)n, sizeof *t);
    void **data = calloc((size_t)n, sizeof *data);
    for (int i = 0; i < n; i++) {
        t[i] = f.t[i];
        data[i] = malloc(qr_st_bytes(&t[i]) + 1);
        assert_int_equal(qr_st_read(&f, &f.t[i], data[i]), QR_OK);
        t[i].data = data[i];
    }
    uint32_t crc;
    uint64_t bytes;
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.v1", path);
    assert_int_equal(qr_st_write_file(tmp, t, n, meta, &crc, &bytes), QR_OK);
    for (int i = 0; i < n; i++) free(data[i]);
    free(data);
    free(t);
    cJSON_Delete(meta);
    qr_st_close(&f);
    assert_int_equal(rename(tmp, path), 0);
    char dir[4096];
    assert_int_equal(qr_ckpt_path(dir, sizeof dir, w->dir, STEP), QR_OK);
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    FILE *m = fopen(mpath, "w");
    assert_non_null(m);
    fprintf(m, "{\"format\": \"quorum-checkpoint\", \"version\": 1, \"global_step\": %d, "
            "\"unix_time\": 1, \"mode\": \"async\", \"num_shards\": 1, \"shards\": "
            "[{\"file\": \"shard-00000-of-00001.safetensors\", \"bytes\": %llu, "
            "\"crc32\": \"%08x\", \"variables\": 4}]}\n", STEP, (unsigned long long)bytes, crc);
    fclose(m);
    qr_ckpt_info c = {.step = STEP};
    snprintf(c.path, sizeof c.path, "%s", dir);
    assert_int_equal(qr_ckpt_read_manifest(&c), QR_OK);
    assert_int_equal(c.version, 1);
    assert_int_equal(qr_ckpt_verify(&c), QR_OK);
    qr_ckpt_info_free(&c);
    /* and restored */
    qr_store store;
    qr_store_init(&store);
    ckpt_shard_ctx sc = ctx_of(w, &store);
    int64_t counters[2];
    assert_int_equal(qr__ckpt_shard_restore(&sc, path, counters), QR_OK);
    assert_int_equal(counters[0], STEP);
    qr_store_free(&store);
    /* A version this quorum does not know. */
    m = fopen(mpath, "w");
    fprintf(m, "{\"format\": \"quorum-checkpoint\", \"version\": 4}\n");
    fclose(m);
    assert_int_equal(qr_ckpt_read_manifest(&c), QR_EIO);
    assert_non_null(strstr(qr_last_error(), "reads 1 to 3"));
}

/* Incremental: a full shard (checkpoint 1), then changes of every kind,
 * then an increment of it (checkpoint 2). The full shard restored and the
 * increment applied give the live store back bit for bit (rows with their
 * slots and update steps, admission counts, dense values, slots and
 * averages); the increment leaves out the dense variable nothing changed
 * and the table's unchanged rows; ids removed since the full one stay
 * removed, one removed and made again is there. */
static void test_increment_restore(void **state) {
    world *w = *state;
    char full[4200], inc[4200];
    qr_ckpt_shard full_shard, inc_shard;
    write_shard_of(w, STEP - 10, 1, 0, full, sizeof full, &full_shard);
    qr_var *weights = qr_store_get(&w->store, 1), *emb = qr_store_get(&w->store, 3);
    qr_var *adamw = qr_store_get(&w->store, 4);
    /* weights: applied (its version counts it) */
    assert_int_equal(qr__ckpt_before_apply(NULL, weights), QR_OK);
    assert_int_equal(qr_var_prepare_write(weights), QR_OK);
    fill(weights->value->data, weights->n);
    weights->version++;
    /* adamw: a slot written as SLOTS does, the version unchanged */
    assert_int_equal(qr__ckpt_before_apply(NULL, adamw), QR_OK);
    const char *slot;
    float *data;
    int64_t n;
    qr_optim_slot(adamw->slots, 0, &slot, &data, &n);
    fill(data, n);
    /* layer0/biases: untouched. emb: two rows updated, one removed, one
     * removed and made again, a candidate admitted, one sighted anew. */
    qr_table *t = emb->table;
    t->clock = 600;
    for (int k = 0; k < 2; k++) {
        bool added;
        int64_t r = qr_table_row_for_update(t, 1000 + 37 * k, &added);
        assert_true(r >= 0 && !added);
        fill(qr_table_row(t, (uint64_t)r), (int64_t)(1 + t->nslots) * DIM);
    }
    int64_t gone = 1000 + 37 * 4, back = 1000 + 37 * 5, row;
    qr_table_remove(t, (uint64_t)qr_table_find(t, gone));
    qr_table_remove(t, (uint64_t)qr_table_find(t, back));
    bool added;
    for (int seen = 0; seen < 3; seen++)
        assert_int_equal(qr_table_sight(t, back, &row, &added), QR_OK);
    assert_true(row >= 0 && added);
    assert_int_equal(qr_table_sight(t, 5001, &row, &added), QR_OK);
    assert_true(row >= 0 && added); /* seen twice before: admitted */
    assert_int_equal(qr_table_sight(t, 5000, &row, &added), QR_OK);
    assert_int_equal(row, -1);
    /* emb_bloom: an id sighted once, counted in the filter alone (the
     * increment carries the filter whole) */
    qr_table *tb = qr_store_get(&w->store, 5)->table;
    uint8_t before[1000];
    memcpy(before, tb->filter.counters, sizeof before);
    assert_int_equal(qr_table_sight(tb, 7001, &row, &added), QR_OK);
    assert_int_equal(row, -1);
    assert_memory_not_equal(before, tb->filter.counters, sizeof before);
    write_shard_of(w, STEP, 2, 1, inc, sizeof inc, &inc_shard);
    assert_int_equal(inc_shard.nvars, 4); /* the tables, always; not layer0/biases */
    assert_true(inc_shard.bytes < full_shard.bytes);
    printf("full shard %llu bytes, increment %llu bytes\n",
           (unsigned long long)full_shard.bytes, (unsigned long long)inc_shard.bytes);
    qr_st_file f;
    assert_int_equal(qr_st_open(&f, inc), QR_OK);
    const qr_st_tensor *rows = qr_st_find(&f, "emb");
    assert_non_null(rows);
    assert_int_equal(rows->shape[0], 4); /* 2 updated, 1 made again, 1 admitted */
    assert_null(qr_st_find(&f, "layer0/biases"));
    assert_string_equal(qr_st_meta(&f, "kind"), "incremental");
    assert_string_equal(qr_st_meta(&f, "base_checkpoint_id"), "1");
    qr_st_close(&f);

    qr_store got;
    int64_t counters[2];
    uint64_t pos[WORKERS] = {0};
    assert_int_equal(restore(w, full, false, &got, counters, pos), QR_OK);
    assert_int_equal(counters[0], STEP - 10);
    ckpt_shard_ctx c = ctx_of(w, &got);
    c.data_pos = pos;
    if (qr__ckpt_shard_apply_increment(&c, inc, counters))
        fail_msg("applying the increment: %s", qr_last_error());
    assert_int_equal(counters[0], STEP);
    assert_stores_equal(&w->store, &got);
    const qr_table *gt = qr_store_get(&got, 3)->table;
    assert_true(qr_table_find(gt, gone) < 0);
    assert_true(qr_table_find(gt, back) >= 0);
    qr_store_free(&got);
    /* An increment is not a full shard, nor the other way round. */
    expect_refused(w, inc, false, QR_EIO, "an incremental shard where a full one");
    qr_store_init(&got);
    c = ctx_of(w, &got);
    assert_int_equal(qr__ckpt_shard_apply_increment(&c, full, counters), QR_EIO);
    assert_non_null(strstr(qr_last_error(), "a full shard where an incremental one"));
    qr_store_free(&got);
}

/* A manifest alone at `step` (prune reads nothing else): full, or an
 * increment of `base` in the chain from `full`. */
static void manifest_only(world *w, int64_t step, int64_t base, int64_t full) {
    qr_ckpt_shard shard = {.bytes = 8, .nvars = 1};
    qr_ckpt_shard_name(shard.file, sizeof shard.file, 0, 1);
    qr_ckpt_info info = {.step = step, .mode = "async", .nshards = 1, .shards = &shard,
                         .incarnation = INCARNATION, .checkpoint_id = (uint64_t)step,
                         .incremental = base >= 0, .base_step = base,
                         .base_id = (uint64_t)base, .full_step = full};
    assert_int_equal(qr_ckpt_path(info.path, sizeof info.path, w->dir, step), QR_OK);
    assert_int_equal(qr_mkdir(info.path), QR_OK);
    assert_int_equal(qr_ckpt_write_manifest(&info), QR_OK);
}

static bool exists(world *w, int64_t step) {
    char path[4200];
    struct stat st;
    qr_ckpt_path(path, sizeof path, w->dir, step);
    return stat(path, &st) == 0;
}

/* Pruning keeps what the kept increments' chains need: F10 I20 I30 F40
 * I50 with keep 3 keeps 50, 40, 30 and 30's chain (20, 10); keep 2 drops
 * the first chain; keep 1 keeps 50 and its base 40. */
static void test_prune_keeps_chains(void **state) {
    world *w = *state;
    manifest_only(w, 10, -1, 10);
    manifest_only(w, 20, 10, 10);
    manifest_only(w, 30, 20, 10);
    manifest_only(w, 40, -1, 40);
    manifest_only(w, 50, 40, 40);
    assert_int_equal(qr_ckpt_prune(w->dir, 3), QR_OK);
    for (int s = 10; s <= 50; s += 10) assert_true(exists(w, s));
    assert_int_equal(qr_ckpt_prune(w->dir, 2), QR_OK);
    assert_false(exists(w, 10) || exists(w, 20) || exists(w, 30));
    assert_true(exists(w, 40) && exists(w, 50));
    assert_int_equal(qr_ckpt_prune(w->dir, 1), QR_OK);
    assert_true(exists(w, 40) && exists(w, 50));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_snapshot_write_restore, setup, teardown),
        cmocka_unit_test_setup_teardown(test_snapshot_sent_from_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_snapshot_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_shards_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mixed_checkpoint_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_version_1_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_increment_restore, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prune_keeps_chains, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

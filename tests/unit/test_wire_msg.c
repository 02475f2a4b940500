/*
 * test_wire_msg.c - the meta records of wire/msg.h: each put writes the
 * bytes the layout table gives (checked against bytes written out by
 * hand here, so a change of the codec that would change the wire fails),
 * each get reads back what its put wrote (a push's learning rates with
 * QR_PUSH_LR too), the fixed sizes agree with the
 * records, a CREATE record's lengths are checked before the bytes
 * they count are read, and a VIEW of another cluster's size is refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "wire/msg.h"

/* Little-endian bytes of v, n of them, appended at *at. */
static void le(uint8_t *buf, size_t *at, uint64_t v, int n) {
    for (int i = 0; i < n; i++) buf[(*at)++] = (uint8_t)(v >> (8 * i));
}

static void assert_bytes(const qr_wbuf *b, const uint8_t *want, size_t n) {
    assert_false(b->oom);
    assert_int_equal(b->len, n);
    assert_memory_equal(b->data, want, n);
}

static void test_hello_layout(void **state) {
    (void)state;
    qr_wbuf b = {0};
    qr_msg_put_hello(&b, &(qr_msg_hello){.role = QR_ROLE_WORKER, .task_index = 7, .mode = 1});
    uint8_t want[16];
    size_t n = 0;
    le(want, &n, 1, 4);
    le(want, &n, 7, 4);
    le(want, &n, 1, 4);
    assert_int_equal(n, QR_MSG_HELLO_LEN);
    assert_bytes(&b, want, n);
    qr_rbuf r;
    qr_rbuf_init(&r, b.data, b.len);
    qr_msg_hello m;
    qr_msg_get_hello(&r, &m);
    assert_false(r.bad);
    assert_int_equal(r.left, 0);
    assert_int_equal(m.role, QR_ROLE_WORKER);
    assert_int_equal(m.task_index, 7);
    assert_int_equal(m.mode, 1);
    qr_wbuf_free(&b);

    /* The coordinator's HELLO carries its incarnation, restored step and
     * the restarted run that caused its rollback. */
    qr_wbuf c = {0};
    qr_msg_put_hello(&c, &(qr_msg_hello){.role = QR_ROLE_COORDINATOR, .mode = 0,
                                         .incarnation = 0x1122334455667788ull,
                                         .restored_step = -1, .cause = 0x99aabbccddeeff01ull});
    uint8_t want_c[40];
    n = 0;
    le(want_c, &n, 2, 4);
    le(want_c, &n, 0, 4);
    le(want_c, &n, 0, 4);
    le(want_c, &n, 0x1122334455667788ull, 8);
    le(want_c, &n, (uint64_t)-1, 8);
    le(want_c, &n, 0x99aabbccddeeff01ull, 8);
    assert_int_equal(n, QR_MSG_HELLO_COORD_LEN);
    assert_bytes(&c, want_c, n);
    qr_rbuf_init(&r, c.data, c.len);
    qr_msg_get_hello(&r, &m);
    assert_false(r.bad);
    assert_int_equal(r.left, 0);
    assert_true(m.incarnation == 0x1122334455667788ull);
    assert_int_equal(m.restored_step, -1);
    assert_true(m.cause == 0x99aabbccddeeff01ull);
    qr_wbuf_free(&c);

    /* Its answer: the welcome. */
    qr_wbuf w = {0};
    qr_msg_put_welcome(&w, &(qr_msg_welcome){.incarnation = 5, .restored_step = 1200,
                                             .follows = 9, .flags = QR_WELCOME_CHECKPOINTS});
    uint8_t want_w[32];
    n = 0;
    le(want_w, &n, 5, 8);
    le(want_w, &n, 1200, 8);
    le(want_w, &n, 9, 8);
    le(want_w, &n, 1, 4);
    assert_int_equal(n, QR_MSG_WELCOME_LEN);
    assert_bytes(&w, want_w, n);
    qr_msg_welcome got;
    qr_rbuf_init(&r, w.data, w.len);
    qr_msg_get_welcome(&r, &got);
    assert_false(r.bad);
    assert_true(got.incarnation == 5 && got.restored_step == 1200 && got.follows == 9 &&
                got.flags == QR_WELCOME_CHECKPOINTS);
    qr_wbuf_free(&w);
}

static void test_push_layout(void **state) {
    (void)state;
    qr_wbuf b = {0};
    qr_msg_put_push_head(&b, &(qr_msg_push_head){.count = 2, .local_step = -3, .worker = 5,
                                                 .seq = 0x01020304, .nparts = 3,
                                                 .data_pos = 1ull << 50});
    qr_msg_put_var(&b, &(qr_msg_var){.id = 9, .kind = QR_GRAD_SPARSE, .nbytes = 1ull << 40,
                                     .version = 77});
    uint8_t want[64];
    size_t n = 0;
    le(want, &n, 2, 4);
    le(want, &n, (uint64_t)-3, 8);
    le(want, &n, 5, 4);
    le(want, &n, 0x01020304, 4);
    le(want, &n, 3, 4);
    le(want, &n, 1ull << 50, 8);
    assert_int_equal(n, QR_MSG_PUSH_HEAD_LEN);
    le(want, &n, 9, 4);
    le(want, &n, 1, 4);
    le(want, &n, 1ull << 40, 8);
    le(want, &n, 77, 8);
    assert_int_equal(n, QR_MSG_PUSH_HEAD_LEN + QR_MSG_VAR_LEN);
    assert_bytes(&b, want, n);

    qr_rbuf r;
    qr_rbuf_init(&r, b.data, b.len);
    qr_msg_push_head h;
    qr_msg_var v;
    qr_msg_get_push_head(&r, &h);
    qr_msg_get_var(&r, &v);
    assert_false(r.bad);
    assert_int_equal(r.left, 0);
    assert_int_equal(h.count, 2);
    assert_true(h.local_step == -3);
    assert_int_equal(h.worker, 5);
    assert_int_equal(h.seq, 0x01020304);
    assert_true(h.data_pos == 1ull << 50);
    assert_int_equal(h.nparts, 3);
    assert_int_equal(v.id, 9);
    assert_int_equal(v.kind, QR_GRAD_SPARSE);
    assert_true(v.nbytes == 1ull << 40);
    assert_true(v.version == 77);
    /* One byte short: the reader says so, and yields zeros. */
    qr_rbuf_init(&r, b.data, b.len - 1);
    qr_msg_get_push_head(&r, &h);
    qr_msg_get_var(&r, &v);
    assert_true(r.bad);
    qr_wbuf_free(&b);
}

/* QR_PUSH_LR: each item record is followed by its f32 learning rate
 * (IEEE 754 bits, little-endian); -1 is the ps's own. */
static void test_push_lr_layout(void **state) {
    (void)state;
    qr_wbuf b = {0};
    qr_msg_put_push_head(&b, &(qr_msg_push_head){.count = 2, .worker = 1, .seq = 4, .nparts = 1});
    qr_msg_put_var(&b, &(qr_msg_var){.id = 3, .kind = QR_GRAD_DENSE, .nbytes = 16, .version = 2});
    qr_msg_put_push_lr(&b, 0.25f);
    qr_msg_put_var(&b, &(qr_msg_var){.id = 4, .kind = QR_GRAD_SPARSE, .nbytes = 12});
    qr_msg_put_push_lr(&b, QR_MSG_PUSH_LR_NONE);
    uint8_t want[128];
    size_t n = 0;
    le(want, &n, 2, 4);
    le(want, &n, 0, 8);
    le(want, &n, 1, 4);
    le(want, &n, 4, 4);
    le(want, &n, 1, 4);
    le(want, &n, 0, 8);
    le(want, &n, 3, 4);
    le(want, &n, 0, 4);
    le(want, &n, 16, 8);
    le(want, &n, 2, 8);
    le(want, &n, 0x3E800000u, 4); /* 0.25f */
    assert_int_equal(n, QR_MSG_PUSH_HEAD_LEN + QR_MSG_VAR_LEN + QR_MSG_PUSH_LR_LEN);
    le(want, &n, 4, 4);
    le(want, &n, 1, 4);
    le(want, &n, 12, 8);
    le(want, &n, 0, 8);
    le(want, &n, 0xBF800000u, 4); /* -1.0f */
    assert_int_equal(n, QR_MSG_PUSH_HEAD_LEN + 2 * (QR_MSG_VAR_LEN + QR_MSG_PUSH_LR_LEN));
    assert_bytes(&b, want, n);

    qr_rbuf r;
    qr_rbuf_init(&r, b.data, b.len);
    qr_msg_push_head h;
    qr_msg_var v;
    qr_msg_get_push_head(&r, &h);
    qr_msg_get_var(&r, &v);
    assert_true(v.id == 3 && v.nbytes == 16 && v.version == 2);
    assert_true(qr_msg_get_push_lr(&r) == 0.25f);
    qr_msg_get_var(&r, &v);
    assert_true(v.id == 4 && v.kind == QR_GRAD_SPARSE && v.nbytes == 12);
    assert_true(qr_msg_get_push_lr(&r) == QR_MSG_PUSH_LR_NONE);
    assert_false(r.bad);
    assert_int_equal(r.left, 0);
    /* The last learning rate cut short: the reader says so. */
    qr_rbuf_init(&r, b.data, b.len - 1);
    qr_msg_get_push_head(&r, &h);
    qr_msg_get_var(&r, &v);
    (void)qr_msg_get_push_lr(&r);
    qr_msg_get_var(&r, &v);
    (void)qr_msg_get_push_lr(&r);
    assert_true(r.bad);
    /* The flag is its own bit, one of the flags a ps takes, apart from
     * the worker's QR_PUSH_EVERY_PS (which never travels). */
    assert_int_equal(QR_PUSH_LR & (QR_PUSH_STEP | QR_PUSH_SYNC | QR_PUSH_DELTA |
                                   QR_PUSH_REPLY_VALUES | QR_PUSH_EVERY_PS), 0);
    assert_int_equal(QR_PUSH_FLAGS_ALL & QR_PUSH_LR, QR_PUSH_LR);
    assert_int_equal(QR_PUSH_FLAGS_ALL & QR_PUSH_EVERY_PS, 0);
    qr_wbuf_free(&b);
}

static void test_pull_and_small_layouts(void **state) {
    (void)state;
    qr_wbuf b = {0};
    qr_msg_put_count(&b, 3);
    qr_msg_put_id(&b, 11);
    qr_msg_put_ready(&b, &(qr_msg_ready){.set = 1, .step = 500, .data_pos = 501});
    qr_msg_put_commit(&b, &(qr_msg_commit){.worker = 2, .seq = 4, .local_step = 6,
                                           .data_pos = 7});
    qr_msg_put_worker(&b, 8);
    qr_msg_put_clock(&b, &(qr_msg_clock){.worker = 1, .clock = 10});
    qr_msg_put_step(&b, 12);
    qr_msg_put_apply_head(&b, 14, 1);
    qr_msg_put_member(&b, 15, 16);
    uint8_t want[128];
    size_t n = 0;
    le(want, &n, 3, 4);
    le(want, &n, 11, 4);
    size_t ready_at = n;
    le(want, &n, 1, 4);
    le(want, &n, 500, 8);
    le(want, &n, 501, 8);
    assert_int_equal(n - ready_at, QR_MSG_READY_LEN);
    size_t commit_at = n;
    le(want, &n, 2, 4);
    le(want, &n, 4, 4);
    le(want, &n, 6, 8);
    le(want, &n, 7, 8);
    assert_int_equal(n - commit_at, QR_MSG_COMMIT_LEN);
    le(want, &n, 8, 4); /* TOKEN */
    size_t clock_at = n;
    le(want, &n, 1, 4);
    le(want, &n, 10, 8);
    assert_int_equal(n - clock_at, QR_MSG_CLOCK_LEN);
    le(want, &n, 12, 8);
    le(want, &n, 14, 8);
    le(want, &n, 1, 4);
    le(want, &n, 15, 4);
    le(want, &n, 16, 4);
    assert_bytes(&b, want, n);

    qr_rbuf r;
    qr_rbuf_init(&r, b.data, b.len);
    assert_int_equal(qr_msg_get_count(&r), 3);
    assert_int_equal(qr_msg_get_id(&r), 11);
    qr_msg_ready ready;
    qr_msg_get_ready(&r, &ready);
    assert_int_equal(ready.set, 1);
    assert_true(ready.step == 500);
    assert_true(ready.data_pos == 501);
    qr_msg_commit c;
    qr_msg_get_commit(&r, &c);
    assert_int_equal(c.worker, 2);
    assert_int_equal(c.seq, 4);
    assert_true(c.local_step == 6);
    assert_true(c.data_pos == 7);
    assert_int_equal(qr_msg_get_worker(&r), 8);
    qr_msg_clock k;
    qr_msg_get_clock(&r, &k);
    assert_int_equal(k.worker, 1);
    assert_true(k.clock == 10);
    assert_true(qr_msg_get_step(&r) == 12);
    int64_t step;
    uint32_t count, worker, seq;
    qr_msg_get_apply_head(&r, &step, &count);
    qr_msg_get_member(&r, &worker, &seq);
    assert_true(step == 14);
    assert_int_equal(count, 1);
    assert_int_equal(worker, 15);
    assert_int_equal(seq, 16);
    assert_false(r.bad);
    assert_int_equal(r.left, 0);
    qr_wbuf_free(&b);
}

/* CKPT and its reply, the shard written. */
static void test_ckpt_layout(void **state) {
    (void)state;
    qr_wbuf b = {0};
    qr_msg_put_ckpt(&b, &(qr_msg_ckpt){.phase = QR_CKPT_SNAPSHOT, .id = 3, .step = 1200,
                                       .base = 2});
    qr_msg_put_shard(&b, &(qr_msg_shard){.bytes = 1ull << 33, .crc32 = 0xdeadbeef, .nvars = 4});
    uint8_t want[64];
    size_t n = 0;
    le(want, &n, QR_CKPT_SNAPSHOT, 4);
    le(want, &n, 3, 8);
    le(want, &n, 1200, 8);
    le(want, &n, 0, 4);
    le(want, &n, 2, 8); /* base: an increment of checkpoint 2 */
    assert_int_equal(n, QR_MSG_CKPT_LEN);
    le(want, &n, 1ull << 33, 8);
    le(want, &n, 0xdeadbeef, 4);
    le(want, &n, 4, 4);
    assert_bytes(&b, want, n);
    qr_rbuf r;
    qr_rbuf_init(&r, b.data, b.len);
    qr_msg_ckpt m;
    qr_msg_shard s;
    qr_msg_get_ckpt(&r, &m);
    qr_msg_get_shard(&r, &s);
    assert_false(r.bad);
    assert_int_equal(r.left, 0);
    assert_true(m.phase == QR_CKPT_SNAPSHOT && m.id == 3 && m.step == 1200 && m.count == 0 &&
                m.base == 2);
    assert_true(s.bytes == 1ull << 33 && s.crc32 == 0xdeadbeef && s.nvars == 4);
    qr_wbuf_free(&b);

    /* The async cut's records. */
    qr_wbuf c = {0};
    qr_msg_put_cut(&c, &(qr_msg_cut){.include = 1, .seq = 0x80000001u});
    qr_msg_put_mark(&c, &(qr_msg_mark){.worker = 2, .flags = QR_MARK_APPLIED | QR_MARK_CONNECTED,
                                       .seq = 9, .nparts = 3, .data_pos = 1ull << 40});
    n = 0;
    le(want, &n, 1, 4);
    le(want, &n, 0x80000001u, 4);
    assert_int_equal(n, QR_MSG_CUT_LEN);
    le(want, &n, 2, 4);
    le(want, &n, 3, 4);
    le(want, &n, 9, 4);
    le(want, &n, 3, 4);
    le(want, &n, 1ull << 40, 8);
    assert_bytes(&c, want, n);
    qr_rbuf_init(&r, c.data, c.len);
    qr_msg_cut cut;
    qr_msg_mark mark;
    qr_msg_get_cut(&r, &cut);
    qr_msg_get_mark(&r, &mark);
    assert_false(r.bad);
    assert_true(cut.include == 1 && cut.seq == 0x80000001u);
    assert_true(mark.worker == 2 && mark.flags == 3 && mark.seq == 9 && mark.nparts == 3 &&
                mark.data_pos == 1ull << 40);
    qr_wbuf_free(&c);
}

static void test_create_layout(void **state) {
    (void)state;
    qr_msg_create_var rec = {.id = 3, .ndim = 2, .shape = {784, 10}, .lr = 0.5f,
                             .name_len = 2, .name = "w0", .options_len = 3, .options = "a=1",
                             .kind = QR_VAR_TABLE, .init_len = 5, .init = "zeros",
                             .seed = 0x0102030405060708ull};
    qr_wbuf b = {0};
    qr_msg_put_create_var(&b, &rec);
    uint8_t want[96];
    size_t n = 0;
    le(want, &n, 3, 4);
    le(want, &n, 2, 4);
    le(want, &n, 784, 8);
    le(want, &n, 10, 8);
    le(want, &n, 0x3f000000, 4); /* 0.5f */
    le(want, &n, 2, 4);
    memcpy(want + n, "w0", 2);
    n += 2;
    le(want, &n, 3, 4);
    memcpy(want + n, "a=1", 3);
    n += 3;
    le(want, &n, 1, 4); /* kind: table */
    le(want, &n, 5, 4);
    memcpy(want + n, "zeros", 5);
    n += 5;
    le(want, &n, 0x0102030405060708ull, 8);
    assert_bytes(&b, want, n);

    qr_rbuf r;
    qr_rbuf_init(&r, b.data, b.len);
    qr_msg_create_var m;
    assert_int_equal(qr_msg_get_create_var(&r, &m), QR_MSG_CREATE_OK);
    assert_false(r.bad);
    assert_int_equal(r.left, 0);
    assert_int_equal(m.id, 3);
    assert_int_equal(m.ndim, 2);
    assert_true(m.shape[0] == 784 && m.shape[1] == 10 && m.shape[2] == 0);
    assert_true(m.lr == 0.5f);
    assert_int_equal(m.name_len, 2);
    assert_memory_equal(m.name, "w0", 2);
    assert_int_equal(m.options_len, 3);
    assert_memory_equal(m.options, "a=1", 3);
    assert_int_equal(m.kind, QR_VAR_TABLE);
    assert_int_equal(m.init_len, 5);
    assert_memory_equal(m.init, "zeros", 5);
    assert_true(m.seed == 0x0102030405060708ull);
    qr_wbuf_free(&b);

    /* The lookup request. */
    qr_wbuf l = {0};
    qr_msg_put_lookup(&l, &(qr_msg_lookup){.var_id = 9, .count = 1ull << 33});
    n = 0;
    le(want, &n, 9, 4);
    le(want, &n, 0, 4);
    le(want, &n, 1ull << 33, 8);
    assert_int_equal(n, QR_MSG_LOOKUP_LEN);
    assert_bytes(&l, want, n);
    qr_wbuf_free(&l);
}

/* A length out of range stops the reading there, before the bytes it
 * counts: nothing after it is read. */
static void test_create_bad_lengths(void **state) {
    (void)state;
    qr_wbuf b = {0};
    qr_msg_create_var m;
    qr_rbuf r;
    qr_wbuf_u32(&b, 1);
    qr_wbuf_u32(&b, QR_PROTO_MAX_NDIM + 1); /* ndim */
    qr_rbuf_init(&r, b.data, b.len);
    assert_int_equal(qr_msg_get_create_var(&r, &m), QR_MSG_CREATE_BAD_NDIM);
    assert_int_equal(m.ndim, QR_PROTO_MAX_NDIM + 1);
    assert_false(r.bad);

    qr_wbuf_reset(&b);
    qr_wbuf_u32(&b, 1);
    qr_wbuf_u32(&b, 1);
    qr_wbuf_i64(&b, 4);
    qr_wbuf_f32(&b, 0.1f);
    qr_wbuf_u32(&b, QR_PROTO_MAX_NAME + 1); /* name_len */
    qr_rbuf_init(&r, b.data, b.len);
    assert_int_equal(qr_msg_get_create_var(&r, &m), QR_MSG_CREATE_BAD_NAME_LEN);
    assert_int_equal(r.left, 0);
    assert_false(r.bad);

    qr_wbuf_reset(&b);
    qr_wbuf_u32(&b, 1);
    qr_wbuf_u32(&b, 1);
    qr_wbuf_i64(&b, 4);
    qr_wbuf_f32(&b, 0.1f);
    qr_wbuf_u32(&b, 1);
    qr_wbuf_bytes(&b, "x", 1);
    qr_wbuf_u32(&b, QR_MSG_MAX_OPTIONS + 1); /* options_len */
    qr_rbuf_init(&r, b.data, b.len);
    assert_int_equal(qr_msg_get_create_var(&r, &m), QR_MSG_CREATE_BAD_OPTIONS_LEN);
    assert_false(r.bad);

    /* Truncated inside the name: a short record, not a bad length. */
    qr_wbuf_reset(&b);
    qr_wbuf_u32(&b, 1);
    qr_wbuf_u32(&b, 1);
    qr_wbuf_i64(&b, 4);
    qr_wbuf_f32(&b, 0.1f);
    qr_wbuf_u32(&b, 10);
    qr_wbuf_bytes(&b, "abc", 3);
    qr_rbuf_init(&r, b.data, b.len);
    assert_int_equal(qr_msg_get_create_var(&r, &m), QR_MSG_CREATE_OK);
    assert_true(r.bad);
    qr_wbuf_free(&b);
}

/* REPLICATE's head and items, and VIEW (--ps-replicas 2, docs/REPLICATION.md). */
static void test_replicate_and_view_layout(void **state) {
    (void)state;
    qr_wbuf b = {0};
    qr_msg_put_repl_head(&b, &(qr_msg_repl_head){.flags = 3, .worker = 2, .seq = 0x0a0b0c0d,
                                                 .count = 1, .t = -5, .answer = 1ll << 40,
                                                 .fwd = 77, .data_pos = 0x123456789ull});
    qr_msg_put_repl_item(&b, &(qr_msg_repl_item){.id = 9, .kind = QR_REPL_SPARSE,
                                                 .nbytes = 1ull << 33, .lr = 0.5f});
    uint8_t want[72];
    size_t n = 0;
    le(want, &n, 3, 4);
    le(want, &n, 2, 4);
    le(want, &n, 0x0a0b0c0d, 4);
    le(want, &n, 1, 4);
    le(want, &n, (uint64_t)-5, 8);
    le(want, &n, 1ull << 40, 8);
    le(want, &n, 77, 8);
    le(want, &n, 0x123456789ull, 8);
    le(want, &n, 9, 4);
    le(want, &n, QR_REPL_SPARSE, 4);
    le(want, &n, 1ull << 33, 8);
    le(want, &n, 0x3f000000, 4); /* 0.5f */
    assert_bytes(&b, want, n);

    qr_rbuf r;
    qr_rbuf_init(&r, b.data, b.len);
    qr_msg_repl_head h;
    qr_msg_repl_item it;
    qr_msg_get_repl_head(&r, &h);
    qr_msg_get_repl_item(&r, &it);
    assert_false(r.bad);
    assert_int_equal(r.left, 0);
    assert_int_equal(h.flags, 3);
    assert_int_equal(h.worker, 2);
    assert_int_equal(h.seq, 0x0a0b0c0d);
    assert_int_equal(h.count, 1);
    assert_true(h.t == -5 && h.answer == 1ll << 40 && h.fwd == 77 && h.data_pos == 0x123456789ull);
    assert_int_equal(it.id, 9);
    assert_int_equal(it.kind, QR_REPL_SPARSE);
    assert_true(it.nbytes == 1ull << 33 && it.lr == 0.5f);
    qr_rbuf_init(&r, b.data, b.len - 1); /* one byte short */
    qr_msg_get_repl_head(&r, &h);
    qr_msg_get_repl_item(&r, &it);
    assert_true(r.bad);
    qr_wbuf_free(&b);

    /* VIEW: u64 view, u32 nps, a u32 per ps (1: failed). */
    b = (qr_wbuf){0};
    qr_msg_put_view(&b, 4, 3, (const uint8_t[]){0, 1, 0});
    n = 0;
    le(want, &n, 4, 8);
    le(want, &n, 3, 4);
    le(want, &n, 0, 4);
    le(want, &n, 1, 4);
    le(want, &n, 0, 4);
    assert_bytes(&b, want, n);
    uint64_t view;
    uint8_t failed[3];
    qr_rbuf_init(&r, b.data, b.len);
    qr_msg_get_view(&r, 3, &view, failed);
    assert_false(r.bad);
    assert_true(view == 4 && !failed[0] && failed[1] && !failed[2]);
    /* A view of another cluster's size is refused, not read past. */
    uint8_t four[4];
    qr_rbuf_init(&r, b.data, b.len);
    qr_msg_get_view(&r, 4, &view, four);
    assert_true(r.bad);
    qr_wbuf_free(&b);

    /* A re-replication's states travel as they are (2 joining, 3 a
     * replacement holding its copies); above 3 is refused. */
    b = (qr_wbuf){0};
    qr_msg_put_view(&b, 6, 3, (const uint8_t[]){0, 2, 3});
    qr_rbuf_init(&r, b.data, b.len);
    qr_msg_get_view(&r, 3, &view, failed);
    assert_false(r.bad);
    assert_true(view == 6 && failed[0] == 0 && failed[1] == 2 && failed[2] == 3);
    qr_wbuf_free(&b);
    b = (qr_wbuf){0};
    qr_msg_put_view(&b, 7, 3, (const uint8_t[]){0, 4, 0});
    qr_rbuf_init(&r, b.data, b.len);
    qr_msg_get_view(&r, 3, &view, failed);
    assert_true(r.bad);
    qr_wbuf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello_layout),
        cmocka_unit_test(test_push_layout),
        cmocka_unit_test(test_push_lr_layout),
        cmocka_unit_test(test_pull_and_small_layouts),
        cmocka_unit_test(test_ckpt_layout),
        cmocka_unit_test(test_create_layout),
        cmocka_unit_test(test_create_bad_lengths),
        cmocka_unit_test(test_replicate_and_view_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

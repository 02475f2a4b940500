/*
 * proto.h - the quorum wire format: frame header and message metadata,
 * encoded and decoded without any I/O.
 *
 * Every message is
 *   [header 32 bytes][meta meta_len bytes][pad][payload payload_len bytes][pad]
 * where each pad is 0-63 bytes (ignored by the receiver) that bring the
 * payload's start, and the message's end, to a multiple of 64 bytes from
 * the start of the message (QR_PROTO_ALIGN, qr_proto_pad). Why: the kernel
 * copies a payload between the sender's buffer, socket buffers and the
 * receiver's buffer, and those copies run 15-20% slower per byte when
 * source and destination sit at different offsets within a cache line
 * (measured here on Unix sockets: 1 MiB after a 64-byte header 4.3-4.7
 * GB/s, after an 83-byte one 3.6-3.9). Tensors are 64-byte aligned in
 * memory; with every message a multiple of 64 bytes they stay aligned in
 * the byte stream too, TCP's included.
 *
 * Header, little-endian:
 *   off size  field
 *     0    4  magic        0x4D525551 ("QURM" read as bytes Q U R M)
 *     4    1  version      QR_PROTO_VERSION
 *     5    1  type         qr_msg_type; replies have QR_MSG_REPLY set
 *     6    2  flags        per type (QR_PUSH_STEP ...)
 *     8    4  request_id   echoed in the reply
 *    12    4  status       replies: QR_OK or a negative qr_status
 *    16    4  meta_len     <= QR_PROTO_MAX_META
 *    20    4  reserved     must be 0
 *    24    8  payload_len  <= the receiver's max-message option
 *
 * meta holds small fixed-width little-endian records that describe the
 * payload (which variables, how many bytes each); payload holds raw
 * float32 tensors back to back, so they can be written with writev from
 * the variables themselves and read straight into their destinations.
 * An error reply carries its message as meta (UTF-8, not NUL-terminated).
 * The records of every message type are laid out, written and read in
 * one place: wire/msg.h.
 */
#ifndef QR_PROTO_H
#define QR_PROTO_H

#include "common/common.h"
#include "common/limits.h"

#define QR_PROTO_MAGIC 0x4D525551u
/* 3: CKPT carries the increment's base checkpoint (u64 base, incremental
 * checkpoints) and a BEAT's answer the backup's silence (replication):
 * tasks of version 2 would read them wrong, so they are refused by name. */
#define QR_PROTO_VERSION 3
#define QR_PROTO_HEADER_LEN 32
#define QR_PROTO_ALIGN 64

/* Zero bytes that follow `len` bytes of a message to reach a multiple of
 * QR_PROTO_ALIGN: after header + meta (len = 32 + meta_len) and after the
 * payload (len = payload_len). */
static inline uint32_t qr_proto_pad(uint64_t len) {
    return (uint32_t)((QR_PROTO_ALIGN - len % QR_PROTO_ALIGN) % QR_PROTO_ALIGN);
}
#define QR_PROTO_MAX_META (1u << 20)
#define QR_PROTO_MAX_ITEMS 65536
/* QR_PROTO_MAX_NDIM and QR_PROTO_MAX_NAME: common/limits.h. */

/* The message types, one list: it makes the enum (QR_MSG_HELLO = 1, ...),
 * their names (qr_msg_name) and the header's type check
 * (qr_proto_decode_header), as QR_STATUS_MAP does for the status codes.
 * The numbers are the wire format: never renumber one; a new type takes
 * the next number (proto.c checks the numbers run 1..QR_MSG_TYPE_MAX). */
#define QR_MSG_TYPE_MAP(X) \
    X(HELLO, 1)            \
    X(CREATE, 2)           \
    X(READY, 3)            \
    X(PUSH, 4)             \
    X(PULL, 5)             \
    X(STEP, 6)             \
    X(STOP, 7)             \
    X(COMMIT, 8)           \
    X(TOKEN, 9)            \
    X(APPLY, 10)           \
    X(STATS, 11)           \
    X(CLOCK, 12)           \
    X(CKPT, 13)            \
    X(BEAT, 14)            \
    X(LOOKUP, 15)          \
    X(LEAVE, 16)           \
    X(SAVE, 17)            \
    X(SLOTS, 18)           \
    X(HELD, 19)            \
    X(RELEASE, 20)         \
    X(REPLICATE, 21)       \
    X(VIEW, 22)            \
    X(SNAPSHOT, 23)

typedef enum qr_msg_type {
#define QR__MSG_ENUM(name, code) QR_MSG_##name = code,
    QR_MSG_TYPE_MAP(QR__MSG_ENUM)
#undef QR__MSG_ENUM
/* the number of types, which is the largest (they run 1, 2, ...) */
#define QR__MSG_COUNT(name, code) +1
    QR_MSG_TYPE_MAX = 0 QR_MSG_TYPE_MAP(QR__MSG_COUNT),
#undef QR__MSG_COUNT
    QR_MSG_REPLY = 0x80,
} qr_msg_type;

#define QR_CREATE_CHECK_ONLY 1u
#define QR_PULL_AVERAGES 1u
/* Each id of the PULL is followed by the dtype its values come back in
 * (wire/msg.h); without it every variable comes back as float32. */
#define QR_PULL_DTYPES 2u
#define QR_PULL_FLAGS_ALL (QR_PULL_AVERAGES | QR_PULL_DTYPES)
#define QR_LOOKUP_READ_ONLY 1u
/* SLOTS: check the write or the step as if made, change nothing. */
#define QR_SLOTS_CHECK_ONLY 1u
/* PUSH flags: QR_PUSH_STEP (1) and QR_PUSH_DELTA (4) are public, in quorum.h. */
#define QR_PUSH_SYNC 2u
/* Async: the reply carries, after the step, a PULL reply's count and
 * records and values of the push's dense variables as this push left them
 * (a fused push-and-pull: one round trip instead of two). With
 * QR_PUSH_SYNC, a held push (a sync push-and-pull in one round trip,
 * docs/SYNC.md): each ps answers once the push's step is done there, ps 0
 * once the worker's token is granted, with the values (wire/msg.h). */
#define QR_PUSH_REPLY_VALUES 8u
/* Each item record is followed by the learning rate to apply it with
 * (qr_worker_set_lr; wire/msg.h). 16 is QR_PUSH_EVERY_PS, a worker's
 * flag that never travels: skipped, so a stray one is still refused. */
#define QR_PUSH_LR 32u
#define QR_PUSH_FLAGS_ALL \
    (QR_PUSH_STEP | QR_PUSH_SYNC | QR_PUSH_DELTA | QR_PUSH_REPLY_VALUES | QR_PUSH_LR)

#define QR_GRAD_DENSE 0u
#define QR_GRAD_SPARSE 1u
/* An item record's kind holds, above its low byte, the dtype (QR_FLOAT32 ... of
 * quorum.h) of a dense item's elements: 0, float32, leaves the record
 * as it always was (wire/msg.h, qr_msg_kind). */
#define QR_GRAD_KIND_MASK 0xffu
#define QR_GRAD_DTYPE_SHIFT 8

/* The one message a ps sends unasked: when it stops, every worker
 * connected to it gets a STOP reply with this request id (a worker never
 * numbers a request 0), whose status says how the run ended (QR_ESTOPPED,
 * or the abort's status) and whose meta says why. A worker waiting for a
 * lost ps to come back would otherwise wait out restart-wait-ms after
 * the job has ended. */
#define QR_STOP_NOTICE_ID 0u
/* The other one, with --ps-replicas 2: when the placement of the shards
 * changes (a ps failed over, ps/failover.c), ps 0 sends every worker
 * connected to it a VIEW reply with this request id, whose meta is the
 * new view (wire/msg.h, qr_msg_put_view). */
#define QR_VIEW_NOTICE_ID 0xffffffffu

#define QR_ROLE_WORKER 1
#define QR_ROLE_COORDINATOR 2
/* ps k's link to its backup, ps (k+1) mod P (ps/replica.c): its CREATEs
 * and REPLICATEs go to the backup's store of ps k's shard. */
#define QR_ROLE_REPLICA 3
/* A worker's HELLO that names the view it knows and the shard it wants
 * served on this connection (--ps-replicas 2 only; wire/msg.h): read as
 * QR_ROLE_WORKER with qr_msg_hello's with_view set. */
#define QR_ROLE_WORKER_VIEW 4

typedef struct qr_frame {
    uint8_t type;
    uint16_t flags;
    uint32_t request_id;
    int32_t status;
    uint32_t meta_len;
    uint64_t payload_len;
} qr_frame;

/* "PUSH" for QR_MSG_PUSH, with or without QR_MSG_REPLY; "UNKNOWN" for a
 * number that is not a type. */
const char *qr_msg_name(int type);
/* Whether type, without QR_MSG_REPLY, is one of QR_MSG_TYPE_MAP's. */
bool qr_msg_type_known(int type);

/* Encode f into exactly QR_PROTO_HEADER_LEN bytes. */
void qr_proto_encode_header(const qr_frame *f, uint8_t out[QR_PROTO_HEADER_LEN]);
/* Decode and validate a header: magic, version, known type, reserved
 * bits, meta_len <= QR_PROTO_MAX_META, payload_len <= max_payload. */
int qr_proto_decode_header(const uint8_t in[QR_PROTO_HEADER_LEN],
                           uint64_t max_payload, qr_frame *f);

/* A growable byte buffer for building meta. */
typedef struct qr_wbuf {
    uint8_t *data;
    size_t len, cap;
    bool oom; /* set on allocation failure; later writes are dropped */
} qr_wbuf;

void qr_wbuf_reset(qr_wbuf *b);
void qr_wbuf_free(qr_wbuf *b);
void qr_wbuf_u32(qr_wbuf *b, uint32_t v);
void qr_wbuf_i64(qr_wbuf *b, int64_t v);
void qr_wbuf_u64(qr_wbuf *b, uint64_t v);
void qr_wbuf_f32(qr_wbuf *b, float v);
void qr_wbuf_bytes(qr_wbuf *b, const void *p, size_t n);

/* A bounds-checked reader over received meta. A read past the end sets
 * `bad` and yields zeros, so a decoder checks once at the end. */
typedef struct qr_rbuf {
    const uint8_t *p;
    size_t left;
    bool bad;
} qr_rbuf;

void qr_rbuf_init(qr_rbuf *r, const void *p, size_t n);
uint32_t qr_rbuf_u32(qr_rbuf *r);
int64_t qr_rbuf_i64(qr_rbuf *r);
uint64_t qr_rbuf_u64(qr_rbuf *r);
float qr_rbuf_f32(qr_rbuf *r);
const uint8_t *qr_rbuf_bytes(qr_rbuf *r, size_t n);

#endif /* QR_PROTO_H */

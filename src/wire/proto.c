/*
 * proto.c - encode and decode the frame header and the meta records
 * described in proto.h. Pure functions over bytes: no sockets here, which
 * is what lets the unit tests feed it every malformed header there is.
 */
#include "proto.h"

#include <endian.h>
#include <stdlib.h>
#include <string.h>

/* Each type's number lies in 1..QR_MSG_TYPE_MAX (the count of types), and
 * no two are alike (qr_msg_type_known's switch would refuse a duplicate
 * case): so they are exactly 1..QR_MSG_TYPE_MAX, and the names array
 * below, indexed by type, has no hole. */
#define QR__MSG_IN_RANGE(name, code) \
    _Static_assert((code) >= 1 && (code) <= QR_MSG_TYPE_MAX, #name " is out of 1..QR_MSG_TYPE_MAX");
QR_MSG_TYPE_MAP(QR__MSG_IN_RANGE)
#undef QR__MSG_IN_RANGE

bool qr_msg_type_known(int type) {
    switch (type & ~QR_MSG_REPLY) {
#define QR__MSG_CASE(name, code) case code:
        QR_MSG_TYPE_MAP(QR__MSG_CASE)
#undef QR__MSG_CASE
        return true;
    }
    return false;
}

const char *qr_msg_name(int type) {
    static const char *const names[QR_MSG_TYPE_MAX + 1] = {
#define QR__MSG_NAME(name, code) [code] = #name,
        QR_MSG_TYPE_MAP(QR__MSG_NAME)
#undef QR__MSG_NAME
    };
    if (!qr_msg_type_known(type)) return "UNKNOWN";
    return names[type & ~QR_MSG_REPLY];
}

static void put32(uint8_t *p, uint32_t v) {
    v = htole32(v);
    memcpy(p, &v, 4);
}
static void put64(uint8_t *p, uint64_t v) {
    v = htole64(v);
    memcpy(p, &v, 8);
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

void qr_proto_encode_header(const qr_frame *f, uint8_t out[QR_PROTO_HEADER_LEN]) {
    put32(out + 0, QR_PROTO_MAGIC);
    out[4] = QR_PROTO_VERSION;
    out[5] = f->type;
    out[6] = (uint8_t)(f->flags & 0xff);
    out[7] = (uint8_t)(f->flags >> 8);
    put32(out + 8, f->request_id);
    put32(out + 12, (uint32_t)f->status);
    put32(out + 16, f->meta_len);
    put32(out + 20, 0);
    put64(out + 24, f->payload_len);
}

int qr_proto_decode_header(const uint8_t in[QR_PROTO_HEADER_LEN], uint64_t max_payload,
                           qr_frame *f) {
    uint32_t magic = get32(in);
    if (magic != QR_PROTO_MAGIC)
        return qr__fail(QR_EPROTO, "bad magic 0x%08x (not a quorum peer?)", magic);
    if (in[4] != QR_PROTO_VERSION)
        return qr__fail(QR_EPROTO, "unsupported protocol version %u (this build speaks %u)",
                        in[4], QR_PROTO_VERSION);
    f->type = in[5];
    if (!qr_msg_type_known(f->type))
        return qr__fail(QR_EPROTO, "unknown message type %u", f->type);
    f->flags = (uint16_t)(in[6] | (in[7] << 8));
    f->request_id = get32(in + 8);
    f->status = (int32_t)get32(in + 12);
    f->meta_len = get32(in + 16);
    if (get32(in + 20) != 0) return qr__fail(QR_EPROTO, "reserved header field is not zero");
    f->payload_len = get64(in + 24);
    if (f->meta_len > QR_PROTO_MAX_META)
        return qr__fail(QR_ETOOBIG, "meta of %u bytes exceeds the limit of %u", f->meta_len,
                        QR_PROTO_MAX_META);
    if (f->payload_len > max_payload)
        return qr__fail(QR_ETOOBIG, "payload of %llu bytes exceeds the limit of %llu",
                        (unsigned long long)f->payload_len, (unsigned long long)max_payload);
    return QR_OK;
}

void qr_wbuf_reset(qr_wbuf *b) {
    b->len = 0;
    b->oom = false;
}

void qr_wbuf_free(qr_wbuf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

void qr_wbuf_bytes(qr_wbuf *b, const void *p, size_t n) {
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        uint8_t *d = realloc(b->data, cap);
        if (!d) {
            b->oom = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
}

void qr_wbuf_u32(qr_wbuf *b, uint32_t v) {
    uint8_t t[4];
    put32(t, v);
    qr_wbuf_bytes(b, t, 4);
}
void qr_wbuf_u64(qr_wbuf *b, uint64_t v) {
    uint8_t t[8];
    put64(t, v);
    qr_wbuf_bytes(b, t, 8);
}
void qr_wbuf_i64(qr_wbuf *b, int64_t v) {
    qr_wbuf_u64(b, (uint64_t)v);
}
void qr_wbuf_f32(qr_wbuf *b, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    qr_wbuf_u32(b, u);
}

void qr_rbuf_init(qr_rbuf *r, const void *p, size_t n) {
    r->p = p;
    r->left = n;
    r->bad = false;
}

const uint8_t *qr_rbuf_bytes(qr_rbuf *r, size_t n) {
    if (r->bad || r->left < n) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += n;
    r->left -= n;
    return p;
}

uint32_t qr_rbuf_u32(qr_rbuf *r) {
    const uint8_t *p = qr_rbuf_bytes(r, 4);
    return p ? get32(p) : 0;
}
uint64_t qr_rbuf_u64(qr_rbuf *r) {
    const uint8_t *p = qr_rbuf_bytes(r, 8);
    return p ? get64(p) : 0;
}
int64_t qr_rbuf_i64(qr_rbuf *r) {
    return (int64_t)qr_rbuf_u64(r);
}
float qr_rbuf_f32(qr_rbuf *r) {
    uint32_t u = qr_rbuf_u32(r);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

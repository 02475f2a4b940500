/*
 * conn_internal.h - what conn_uv.c (framing, reading, writing) and
 * conn_secure.c (the handshake and sealed records on top of it) share:
 * the connection's state and the calls each makes of the other.
 */
#ifndef QR_WIRE_CONN_INTERNAL_H
#define QR_WIRE_CONN_INTERNAL_H

#include "wire/auth.h"
#include "wire/conn.h"
#include "wire/seal.h"
#include "wire/splice.h"

typedef enum { RX_HEADER, RX_META, RX_PAYLOAD, RX_TRAILER } rx_state;

struct qr_conn {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } h;
    bool is_tcp;
    bool accepted;  /* by a listener (the peer connected to us) */
    bool connected;
    bool closing;
    int close_status;
    uv_loop_t *loop;
    const qr_conn_events *ev;
    void *data;
    qr_conn_options opt;
    uv_connect_t connect_req;
    char peer[160];

    rx_state state;
    /* Bit 0: the last message's payload was large; bit 1: the one before
     * it. Either set: read heads short. */
    uint8_t large_recent;
    uint8_t hdr[QR_PROTO_HEADER_LEN];
    size_t hdr_got;
    qr_frame frame;
    uint8_t *meta; /* meta_len bytes, then its pad */
    size_t meta_cap, meta_got, meta_want;
    qr_iov *iov;
    int niov, iov_cap, iov_idx;
    size_t iov_off;
    bool discard;
    uint64_t payload_got;
    uint32_t trailer_left;
    uint8_t *staging; /* 64-byte aligned, like the payload destinations */
    bool in_place;
    size_t in_place_len; /* bytes the last in-place read asked for */
    bool skip_read;      /* answer the next alloc with no buffer (see on_read) */

    size_t pending_bytes;
    bool paused;
    uint64_t messages_in; /* received whole */

    /* Spliced sends (see "sending"). The socket is watched for room by a
     * poll handle on a dup of its fd, since libuv's stream owns the
     * original's watch. */
    qr_splicer splicer;
    bool splice_ready;
    bool splice_polling;
    uv_poll_t splice_poll;
    int splice_fd;
    struct send_req *splicing, *splicing_tail; /* in order; the head is moving */
    struct send_req *lent, *lent_tail; /* in the socket, pages not read yet */
    size_t lent_bytes; /* of those: in the kernel already, not queued here */
    /* Sends written whole at once whose callbacks have not run: they run
     * from a prepare handle, just before the loop next waits (see
     * qr_conn_send), in order after those of earlier writes. */
    struct send_req *written, *written_tail;
    bool defer_ready;
    uv_prepare_t defer;
    int open_handles; /* the stream, splice_poll, defer and hs_timer once set up */

    /* Authentication (auth.h, conn_secure.c). While hs is set the
     * connection is in its handshake: it reads only into hs_buf, exactly
     * the bytes of the peer's next message, owns no staging buffer yet,
     * and delivers no message; hs_timer is its deadline. */
    qr_handshake *hs;
    uint8_t hs_buf[QR_HS_MAX_LEN];
    size_t hs_got;
    uint8_t hs_plain;   /* server: the peer sent a plain request instead (conn_secure.c) */
    bool hs_failed;     /* refused: waiting for the refusal to be written */
    uint64_t hs_drain;  /* plain request: its bytes still to read and drop */
    bool hs_timer_ready;
    uv_timer_t hs_timer;
    int refusal;        /* why the handshake failed (qr_hs_refusal), or 0 */
    char reason[256];   /* and in words, with the peer's address */
    /* Encrypted sessions: each direction's key and counter, and the
     * record being received (QR_SEAL_OVERHEAD + QR_SEAL_MAX_RECORD). */
    qr_sealer *tx, *rx;
    uint8_t *rec;
    size_t rec_have;
};

typedef struct send_req {
    uv_write_t req;
    qr_conn *c;
    qr_send_cb cb;
    void *ctx;
    size_t bytes;
    /* spliced sends: the buffers, and how far into them */
    struct send_req *next;
    uv_buf_t *bufs;
    int nbufs, cur;
    size_t off;
    uint8_t *sealed; /* encrypted connections: the message as records (seal.h) */
    uint8_t head[];  /* header, a copy of the meta, and the pad: one buffer */
} send_req;

/* conn_uv.c */
void qr__conn_close_with(qr_conn *c, int status);
/* Walk the receive state machine over n plaintext bytes. */
void qr__conn_process_bytes(qr_conn *c, const uint8_t *p, size_t n);
/* Encrypted connections: where the next n payload bytes belong, if they
 * fall wholly into one buffer the owner expects (NULL otherwise), so a
 * record opens straight into it; then the n bytes have landed. */
uint8_t *qr__conn_payload_dest(qr_conn *c, size_t n);
void qr__conn_payload_landed(qr_conn *c, size_t n);
/* The staging buffer, made once the peer is authenticated. */
int qr__conn_alloc_staging(qr_conn *c);
int qr__conn_from_uv(int uv_status);
void qr__conn_release(qr_conn *c);

/* conn_secure.c */
/* Begin the handshake: a client sends its HELLO, a server waits for one.
 * The connection reads only handshake bytes until it is done. */
int qr__conn_handshake_start(qr_conn *c, bool server);
/* The buffer the next read of a connection in its handshake goes to. */
void qr__conn_handshake_alloc(qr_conn *c, uv_buf_t *buf);
/* n handshake bytes are in (at p: hs_buf's free part after a read into it,
 * or elsewhere). */
void qr__conn_handshake_feed(qr_conn *c, const uint8_t *p, size_t n);
/* A server without a secret got a HELLO's first header-sized bytes
 * (hdr): answer it with a refusal the client can read, then close. */
void qr__conn_refuse_hello(qr_conn *c, const uint8_t *first, size_t n);
/* The handshake failed before it was done (peer gone, I/O error). */
void qr__conn_handshake_lost(qr_conn *c, int status);
/* Sealed records: where the next read goes, and n bytes read there. */
void qr__conn_records_alloc(qr_conn *c, uv_buf_t *buf);
void qr__conn_records_read(qr_conn *c, size_t n);
/* Seal a message's buffers into one (r->sealed, r->bytes long); false on
 * no memory. A large message whose connection has nothing queued goes
 * into the socket piece by piece as it is sealed: *sent says how much. */
bool qr__conn_seal_send(qr_conn *c, send_req *r, const uv_buf_t *bufs, int n, size_t *sent);
void qr__conn_secure_free(qr_conn *c);

#endif /* QR_WIRE_CONN_INTERNAL_H */

/*
 * conn_internal.h - what the files of the libuv transport share: the
 * connection's state (struct qr_conn) and the calls between them. Nothing
 * outside src/wire/conn_*.c includes it; the interface is conn.h.
 *
 * Files: conn_uv.c (a connection's life: made, tuned, closed, released;
 * connecting and listening), conn_read.c (the receive state machine,
 * in place or through the staging buffer; pause and resume), conn_write.c
 * (sending: writev, written at once, or spliced), conn_secure.c (the
 * qr_secure_io calls that glue the security layer, secure.h, to the
 * socket), conn_limits.c (the deadlines and the receive budget that bound
 * what one peer can make a listener hold).
 */
#ifndef QR_WIRE_CONN_INTERNAL_H
#define QR_WIRE_CONN_INTERNAL_H

#include "wire/conn.h"
#include "wire/secure.h"
#include "wire/splice.h"

/* Each connection's staging buffer (conn_read.c). */
#define STAGING_BYTES (64 * 1024)

typedef enum { RX_HEADER, RX_META, RX_PAYLOAD, RX_TRAILER } rx_state;

/* A connection: its libuv handle, the receive state machine, the sends
 * under way, and its security state. */
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

    /* Spliced sends (conn_write.c). The socket is watched for room by a
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
    /* Bytes read but not walked yet: the owner paused the connection in the
     * middle of them (a ps parks a push while later requests of the same
     * read wait behind it). They are walked, in order, from the prepare
     * handle after it resumes, before anything more is read, so a paused
     * connection delivers nothing and its replies keep their order. */
    uint8_t *held;
    size_t held_len;
    int open_handles; /* the stream, splice_poll, defer and hs_timer once set up */

    /* Authentication and encryption (secure.h): in its handshake while
     * qr_secure_handshaking, when this holds no staging buffer yet and
     * delivers no message; hs_timer is its deadline. */
    qr_secure sec;
    bool hs_timer_ready;
    uv_timer_t hs_timer;

    /* The bounds on what a peer may hold (conn_limits.c): accepted
     * connections of a listener given any, else lim is NULL. */
    struct qr_conn_limits *lim;
    bool lim_timer_ready, lim_armed;
    uv_timer_t lim_timer;
    uint64_t lim_due;          /* loop ms the timer fires at, while armed */
    uint64_t opened_ms;        /* accepted at (shifted by stalls, as below) */
    uint64_t msg_start_ms;     /* the current message's first byte came at */
    uint64_t msg_window_ms;    /* and it must be complete this long after */
    uint64_t stalled_since;    /* not read from since (paused, waiting); 0: reading */
    uint64_t reserved;         /* bytes of the current message held against the budget */
    bool budget_wait;          /* its header waits for room in the budget */
    bool budget_granted;       /* room given: carry on from the header (on_defer) */
    struct qr_conn *wait_next; /* the budget's queue of waiting connections */
};


/* A message is in progress: some of it has come, not all. */
static inline bool qr__conn_rx_busy(const qr_conn *c) {
    return c->state != RX_HEADER || c->hdr_got > 0;
}

/* Reading is stopped: by the owner (qr_conn_pause) or for the budget. */
static inline bool qr__conn_rx_stopped(const qr_conn *c) {
    return c->paused || c->budget_wait;
}

/* The connection's status for a libuv one. */
static inline int qr__conn_from_uv(int uv_status) {
    switch (uv_status) {
    case 0: return QR_OK;
    case UV_EOF:
    case UV_ECONNRESET:
    case UV_EPIPE:
    case UV_ECONNREFUSED:
    case UV_ENOENT:
    case UV_ECANCELED: return QR_EPEERLOST;
    /* When TCP gives up on a silent peer (keepalive, TCP_USER_TIMEOUT) the
     * kernel reports the last ICMP or neighbour error it saw instead of
     * ETIMEDOUT, if any: a vanished host shows as either. */
    case UV_ETIMEDOUT:
    case UV_EHOSTUNREACH:
    case UV_EHOSTDOWN:
    case UV_ENETUNREACH:
    case UV_ENETDOWN: return QR_ETIMEDOUT;
    case UV_ENOMEM: return QR_ENOMEM;
    default: return QR_EIO;
    }
}

/* conn_uv.c: the connection's life. */
void qr__conn_close_with(qr_conn *c, int status); /* once; `lost` follows */
void qr__conn_release(qr_conn *c); /* one of its handles closed */
void qr__conn_defer(qr_conn *c);   /* run on_defer before the loop next waits */

/* conn_read.c: the read path. */
int qr__conn_alloc_staging(qr_conn *c); /* once the peer may send messages */
int qr__conn_start_reading(qr_conn *c);
/* Walk the state machine over n bytes (read into the staging buffer, held,
 * or plaintext of the security layer). */
void qr__conn_process_bytes(qr_conn *c, const uint8_t *p, size_t n);
/* n bytes of the payload landed in the owner's buffer at iov_idx/iov_off. */
void qr__conn_payload_advance(qr_conn *c, size_t n);
/* From on_defer: the budget made room for the header it stopped at
 * (budget_granted set); the bytes a paused connection held, once resumed. */
void qr__conn_budget_granted(qr_conn *c);
void qr__conn_walk_held(qr_conn *c);

/* conn_write.c: the write path. The callbacks of the sends written at
 * once (from on_defer, and before `lost`); those of the spliced sends, with
 * the close status, before `lost`. */
void qr__conn_finish_written(qr_conn *c);
void qr__conn_fail_spliced(qr_conn *c, int status);

/* conn_secure.c: what this transport does for the security layer. */
extern const qr_secure_io qr__conn_secure_io;

/* conn_limits.c, for the others. A listener's limits are shared by the
 * connections it accepted (reference counted: they may outlive it). */
typedef struct qr_conn_limits qr_conn_limits;
/* The listener's, from its options; NULL (and QR_OK) when it sets none. */
int qr__conn_limits_new(const qr_conn_options *opt, qr_conn_limits **out);
void qr__conn_limits_unref(qr_conn_limits *lim);
/* An accepted connection comes under the listener's limits. */
void qr__conn_limits_attach(qr_conn *c, qr_conn_limits *lim);
/* Hooks of the receive state machine: a message's first byte came; its
 * header came (false: it waits for room in the budget, reading stopped;
 * on_defer carries on once budget_granted); the owner took only `keep`
 * bytes of it (a discarded payload); it is done. */
void qr__conn_limits_begin(qr_conn *c);
bool qr__conn_limits_admit(qr_conn *c);
void qr__conn_limits_keep(qr_conn *c, uint64_t keep);
void qr__conn_limits_done(qr_conn *c);
/* Reading stopped (qr_conn_pause) or started again: a stopped connection's
 * deadlines wait with it. */
void qr__conn_limits_stall(qr_conn *c);
void qr__conn_limits_unstall(qr_conn *c);
/* The connection is closing: out of the queue, its timer closed; and,
 * after its `lost` event, its bytes back. */
void qr__conn_limits_close(qr_conn *c);
void qr__conn_limits_lost(qr_conn *c);

#endif /* QR_WIRE_CONN_INTERNAL_H */

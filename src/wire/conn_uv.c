/*
 * conn_uv.c - the libuv implementation of conn.h over TCP and Unix-domain
 * stream sockets.
 *
 * Receive state machine, one message at a time (META includes the pad
 * after the meta, TRAILER is the pad after the payload; proto.h):
 *
 *     HEADER --32--> META --meta+pad--> PAYLOAD --payload_len--> TRAILER --pad--+
 *       ^                                                                        |
 *       +------------------------------ `message` event <-----------------------+
 *
 * Two ways bytes come in. While a large payload is being received, the
 * alloc callback hands libuv the remaining part of the current destination
 * buffer, so the kernel copies straight into the variable or gradient
 * (no staging copy). Otherwise it hands out the connection's 64 KiB
 * staging buffer, and process_bytes() walks the state machine over it;
 * that lets one read() carry a whole small request (header, meta and
 * payload), which keeps small round trips at raw-socket cost.
 *
 * A connection of a job with a secret is authenticated, and with
 * --encrypt sealed, by the security layer (secure.h), which this file
 * drives as libuv drives it: while the layer owns the reads (its
 * handshake, then sealed records) on_alloc and on_read hand them to it,
 * qr_conn_send hands it each message to seal, and the layer answers
 * through the calls of secure_io ("the security layer's calls", below):
 * write these bytes, open, here is plaintext for the state machine, close.
 *
 * What a listener's peers may hold (a message's deadline, the first
 * message's, the budget of incomplete messages) is conn_limits.c's: the
 * state machine tells it where a message begins, its header and its end,
 * and it may stop reading a connection until there is room.
 */
#include "wire/conn_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* Below this many bytes still to come, a payload goes through the staging
 * buffer: the extra copy is cheaper than another read() call. */
#define IN_PLACE_MIN (16 * 1024)
/* After a message with a payload of STAGING_BYTES or more, the next two
 * reads into the staging buffer ask for only this much. A connection that
 * carries one large tensor usually carries another soon: right after it
 * (pushes in a row), or after one small message in between (a push, then
 * a pull request; a push's small answer, then a pull's large one). A full
 * 64 KiB staging read would pull the tensor's first 64 KiB through the
 * staging buffer and copy it again: at 1 MiB that is 6% more bytes
 * copied. 4 KiB still holds the header and meta of any common request. */
#define HEAD_READ_BYTES (4 * 1024)

/* A message with at least this much payload goes to a Unix socket by
 * splice (splice.h) instead of writev: one copy of the bytes fewer per
 * transfer (measured: push+pull of 1-64 MiB at 0.98 of the raw socket
 * loop on average instead of 0.82). 512 KiB rather than 1 MiB: a 1 MiB
 * tensor over 2 ps tasks travels in 512 KiB messages, and splicing those
 * too lifted the 512 KiB and 1 MiB points of `quorum bench wire` from
 * 0.97 to 1.07 of raw on average (4 alternating rounds). Within one send,
 * buffers of SPLICE_MIN_BUFFER and more are spliced and smaller ones
 * (header, meta, pad) written. */
#define SPLICE_MIN_PAYLOAD (512 * 1024)
#define SPLICE_MIN_BUFFER (64 * 1024)

/* Sends up to this size may be written at once, without a write request
 * (qr_conn_send). */
#define TRY_WRITE_MAX (64 * 1024)

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

struct qr_listener {
    uv_tcp_t tcp;
    uv_pipe_t pipe;
    bool has_tcp, has_pipe;
    int open_handles;
    char unix_path[108];
    uv_loop_t *loop;
    const qr_conn_events *ev;
    void *data;
    qr_conn_options opt;
    qr_conn_limits *lim; /* shared with the connections it accepted; NULL: none */
};

/* Events of a connection that failed before its owner could see it. */
static const qr_conn_events no_events;
/* What this transport does for the security layer ("the security layer's
 * calls", below). */
static const qr_secure_io secure_io;


/* The pad after a payload is written from here. */
static const uint8_t zero_pad[QR_PROTO_ALIGN];

static int from_uv(int uv_status) {
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

/* ---- connection setup and teardown ------------------------------------ */

/* Writing to a socket whose peer is gone raises SIGPIPE, whose default
 * action kills the process: a ps would die with the worker it was
 * answering. libuv writes with writev (no MSG_NOSIGNAL) and Linux has no
 * SO_NOSIGPIPE, so the signal is ignored process-wide, unless the program
 * installed a handler of its own. The failed write then returns EPIPE and
 * closes that one connection. */
static void ignore_sigpipe(void) {
    struct sigaction old;
    if (sigaction(SIGPIPE, NULL, &old) == 0 && old.sa_handler == SIG_DFL)
        signal(SIGPIPE, SIG_IGN);
}

/* The staging buffer, made once the peer is authenticated. */
static int alloc_staging(qr_conn *c) {
    if (c->staging) return QR_OK;
    c->staging = qr__aligned_alloc_uninit(STAGING_BYTES);
    if (!c->staging) return qr__fail(QR_ENOMEM, "out of memory for a connection");
    return QR_OK;
}

static qr_conn *conn_new(uv_loop_t *loop, bool is_tcp, const qr_conn_options *opt,
                         const qr_conn_events *ev, void *data) {
    ignore_sigpipe();
    qr_conn *c = qr__calloc(1, sizeof *c);
    if (!c) return NULL;
    /* A connection that must authenticate gets its staging buffer only
     * once it has: until then it holds a few hundred bytes (hs_buf), so
     * connections opened by someone without the secret cost the ps little. */
    if (!opt->auth && alloc_staging(c)) {
        free(c);
        return NULL;
    }
    c->loop = loop;
    c->is_tcp = is_tcp;
    c->opt = *opt;
    c->ev = ev;
    c->data = data;
    qr_secure_init(&c->sec, &secure_io, c, c->peer, opt->handshake_timeout_ms);
    c->state = RX_HEADER;
    c->splicer.pipe[0] = c->splicer.pipe[1] = -1;
    c->splice_fd = -1;
    c->open_handles = 1;
    if (is_tcp)
        uv_tcp_init(loop, &c->h.tcp);
    else
        uv_pipe_init(loop, &c->h.pipe, 0);
    c->h.handle.data = c;
    return c;
}

static void conn_free(qr_conn *c) {
    qr_secure_free(&c->sec);
    free(c->meta);
    free(c->iov);
    free(c->staging);
    free(c->held);
    free(c);
}

static void conn_release(qr_conn *c) {
    if (--c->open_handles == 0) conn_free(c);
}

void qr__conn_release(qr_conn *c) {
    conn_release(c);
}

/* Run the callbacks of a detached list of sends (spliced, or written at
 * once), and free them. */
static void finish_sends(qr_conn *c, send_req *list, int status) {
    for (send_req *r = list, *next; r; r = next) {
        next = r->next;
        c->pending_bytes -= r->bytes;
        if (r->cb) r->cb(c, status, r->ctx);
        free(r->bufs);
        free(r->sealed);
        free(r);
    }
}

/* Spliced sends end with the connection: their callbacks run (with the
 * close status) before `lost`, as every send's does. */
static void fail_spliced(qr_conn *c, int status) {
    send_req *splicing = c->splicing, *lent = c->lent;
    c->splicing = c->splicing_tail = c->lent = c->lent_tail = NULL;
    c->lent_bytes = 0;
    if (!status) status = QR_EPEERLOST;
    finish_sends(c, splicing, status);
    finish_sends(c, lent, status);
}

/* Run the callbacks of the sends written at once (they were written:
 * QR_OK), including any such a callback adds. */
static void finish_written(qr_conn *c) {
    while (c->written) {
        send_req *list = c->written;
        c->written = c->written_tail = NULL;
        finish_sends(c, list, QR_OK);
    }
}

static void walk_held(qr_conn *c);
static void close_with(qr_conn *c, int status);
static void header_admitted(qr_conn *c);
static int start_reading(qr_conn *c);

/* The budget made room for the header it stopped at (conn_limits.c):
 * carry on from it, then with the bytes held behind it, or read again. */
static void budget_granted(qr_conn *c) {
    c->budget_granted = false;
    if (c->closing) return;
    qr__conn_limits_unstall(c);
    if (c->closing) return;
    header_admitted(c);
    if (!c->held && !qr__conn_rx_stopped(c) && !c->closing && start_reading(c))
        close_with(c, QR_EIO);
}

static void on_defer(uv_prepare_t *h) {
    qr_conn *c = h->data;
    finish_written(c);
    uv_prepare_stop(h);
    if (c->budget_granted) budget_granted(c);
    walk_held(c);
}

static void on_defer_closed(uv_handle_t *h) {
    conn_release(h->data);
}

static void on_close(uv_handle_t *h) {
    qr_conn *c = h->data;
    finish_written(c);
    fail_spliced(c, c->close_status);
    if (c->ev->lost) c->ev->lost(c, c->close_status);
    if (c->lim) qr__conn_limits_lost(c);
    conn_release(c);
}

static void on_splice_poll_closed(uv_handle_t *h) {
    conn_release(h->data);
}

static void on_hs_timer_closed(uv_handle_t *h) {
    conn_release(h->data);
}

static void close_with(qr_conn *c, int status) {
    if (c->closing) return;
    c->closing = true;
    c->close_status = status;
    if (c->lim) qr__conn_limits_close(c);
    if (c->splice_ready) {
        /* Every descriptor of the socket and the pipe is closed before
         * this returns, so the kernel drops the pages lent to them: the
         * buffers of the failed sends may be reused at once. */
        uv_close((uv_handle_t *)&c->splice_poll, on_splice_poll_closed);
        close(c->splice_fd);
        c->splice_fd = -1;
        qr_splicer_close(&c->splicer);
    }
    /* The stream's close callback runs the deferred send callbacks (before
     * `lost`), so this handle's may come after it. */
    if (c->defer_ready) uv_close((uv_handle_t *)&c->defer, on_defer_closed);
    if (c->hs_timer_ready) uv_close((uv_handle_t *)&c->hs_timer, on_hs_timer_closed);
    uv_close(&c->h.handle, on_close);
}

void qr__conn_close_with(qr_conn *c, int status) {
    close_with(c, status);
}

void qr_conn_close(qr_conn *c) {
    if (c) close_with(c, QR_ESTOPPED);
}

/* A TCP peer whose process dies is seen at once (its kernel closes the
 * connection), but one whose machine or network goes away sends nothing:
 * an idle connection would stay open forever, and one with data waiting
 * for an acknowledgement for about 15 minutes of retransmissions. Within
 * peer_timeout_ms either way: keepalive probes start after half of it of
 * silence and a few unanswered ones close the connection; TCP_USER_TIMEOUT
 * bounds how long sent data may stay unacknowledged. A live peer's kernel
 * answers probes even while its process computes, so a slow worker is
 * never mistaken for a dead one. Unix sockets need none of this: a peer on
 * this machine cannot vanish without its end being closed. */
static void set_liveness(qr_conn *c) {
    int ms = c->opt.peer_timeout_ms;
    uv_os_fd_t fd;
    if (!c->is_tcp || ms <= 0 || uv_fileno(&c->h.handle, &fd)) return;
    int total = QR_MAX(ms / 1000, 2); /* keepalive counts whole seconds */
    int idle = total / 2;
    int interval = QR_MAX((total - idle) / 5, 1);
    int probes = QR_MAX((total - idle) / interval, 1);
    int on = 1;
    unsigned int user_timeout = (unsigned int)ms;
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval) ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) ||
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout))
        qr__log(QR_LOG_WARN, "connection to %s: cannot set keepalive (%s); a vanished peer "
                "may go unnoticed", c->peer, strerror(errno));
}

static void tune_socket(qr_conn *c) {
    if (c->is_tcp) uv_tcp_nodelay(&c->h.tcp, 1);
    set_liveness(c);
    int size = c->opt.socket_buffer_bytes;
    if (size > 0) {
        /* Small default buffers made 1 MiB transfers 3-5x slower on Unix
         * sockets when this was measured; the size comes from the
         * socket-buffer-kb option (common/config.c). */
        uv_send_buffer_size(&c->h.handle, &size);
        size = c->opt.socket_buffer_bytes;
        uv_recv_buffer_size(&c->h.handle, &size);
    }
}

/* ---- receiving ---------------------------------------------------------- */

static void rx_reset(qr_conn *c) {
    c->state = RX_HEADER;
    c->hdr_got = 0;
    c->meta_got = 0;
    c->niov = 0;
    c->iov_idx = 0;
    c->iov_off = 0;
    c->discard = false;
    c->payload_got = 0;
    c->trailer_left = 0;
}

int qr_conn_expect(qr_conn *c, const qr_iov *iov, int n) {
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += iov[i].len;
    if (total != c->frame.payload_len)
        return qr__fail(QR_EINTERNAL, "expected buffers hold %llu bytes, payload is %llu",
                        (unsigned long long)total, (unsigned long long)c->frame.payload_len);
    if (n > c->iov_cap) {
        qr_iov *grown = realloc(c->iov, (size_t)n * sizeof *grown);
        if (!grown) return qr__fail(QR_ENOMEM, "out of memory for %d receive buffers", n);
        c->iov = grown;
        c->iov_cap = n;
    }
    if (n) memcpy(c->iov, iov, (size_t)n * sizeof *iov);
    c->niov = n;
    c->discard = false;
    return QR_OK;
}

/* A meta buffer grown beyond this for one message is given back after it:
 * a peer could otherwise make the ps keep up to QR_PROTO_MAX_META (1 MiB)
 * per connection with one message each. */
#define META_KEEP_BYTES 4096

static void message_done(qr_conn *c) {
    qr_frame f = c->frame;
    c->large_recent = (uint8_t)(((c->large_recent << 1) | (f.payload_len >= STAGING_BYTES)) & 3);
    c->messages_in++;
    if (c->ev->message) c->ev->message(c, &f, c->meta);
    if (c->closing) return;
    rx_reset(c);
    if (c->lim) qr__conn_limits_done(c);
    if (c->meta_cap > META_KEEP_BYTES) {
        free(c->meta);
        c->meta = NULL;
        c->meta_cap = 0;
    }
}

/* Skip empty destination buffers so iov_idx names one with room left. */
static void skip_full_iovs(qr_conn *c) {
    while (c->iov_idx < c->niov && c->iov_off == c->iov[c->iov_idx].len) {
        c->iov_idx++;
        c->iov_off = 0;
    }
}

/* The payload is in: skip its pad, if any, before the message is done
 * (the next header starts after it). */
static void payload_done(qr_conn *c) {
    c->trailer_left = qr_proto_pad(c->frame.payload_len);
    if (c->trailer_left) c->state = RX_TRAILER;
    else message_done(c);
}

static void payload_advance(qr_conn *c, size_t n) {
    c->payload_got += n;
    if (!c->discard) {
        c->iov_off += n;
        skip_full_iovs(c);
        if (c->ev->payload) c->ev->payload(c, c->payload_got);
    }
    if (c->payload_got == c->frame.payload_len) payload_done(c);
}

static void start_payload(qr_conn *c) {
    c->state = RX_PAYLOAD;
    c->niov = 0;
    c->discard = true; /* unless the owner calls qr_conn_expect */
    int rc = c->ev->header ? c->ev->header(c, &c->frame, c->meta) : QR_OK;
    if (c->closing) return;
    if (rc) {
        qr__log(QR_LOG_WARN, "closing connection from %s: %s", c->peer, qr_last_error());
        close_with(c, rc);
        return;
    }
    c->iov_idx = 0;
    c->iov_off = 0;
    if (!c->discard) skip_full_iovs(c);
    else if (c->reserved) qr__conn_limits_keep(c, c->meta_want); /* read into staging */
    if (c->frame.payload_len == 0) payload_done(c);
}

static void header_done(qr_conn *c) {
    if (qr_proto_decode_header(c->hdr, c->opt.max_payload, &c->frame)) {
        /* Not a frame: a peer with a secret opens with a HELLO instead,
         * which a ps without one answers with the reason. */
        if (!c->opt.auth && !c->messages_in && qr_handshake_is_hello(c->hdr, sizeof c->hdr)) {
            qr_secure_refuse_hello(&c->sec, c->hdr, sizeof c->hdr);
            return;
        }
        qr__log(QR_LOG_WARN, "closing connection from %s: %s", c->peer, qr_last_error());
        close_with(c, QR_EPROTO);
        return;
    }
    c->meta_want = c->frame.meta_len + qr_proto_pad(QR_PROTO_HEADER_LEN + (uint64_t)c->frame.meta_len);
    /* Nothing is allocated for the message before the budget has room. */
    if (c->lim && !qr__conn_limits_admit(c)) return;
    header_admitted(c);
}

/* The header is in and the budget has room: receive the meta. */
static void header_admitted(qr_conn *c) {
    if (c->meta_want > c->meta_cap) {
        size_t cap = QR_MAX(c->meta_want, 256u);
        uint8_t *m = realloc(c->meta, cap);
        if (!m) {
            close_with(c, QR_ENOMEM);
            return;
        }
        c->meta = m;
        c->meta_cap = cap;
    }
    c->state = RX_META;
    c->meta_got = 0;
    if (c->meta_want == 0) start_payload(c);
}

/* Reading stopped (the owner paused the connection, or the budget has no
 * room for its next message) with n bytes of this read left: keep them
 * for when it goes on (walk_held), after any kept already (the security
 * layer may hand in the plaintext of several records of one read). */
static void hold(qr_conn *c, const uint8_t *p, size_t n) {
    uint8_t *held = realloc(c->held, c->held_len + n);
    if (!held) {
        qr__fail(QR_ENOMEM, "out of memory holding %zu bytes read from %s", n, c->peer);
        close_with(c, QR_ENOMEM);
        return;
    }
    memcpy(held + c->held_len, p, n);
    c->held = held;
    c->held_len += n;
}

/* Walk the state machine over n bytes received into the staging buffer. */
static void process_bytes(qr_conn *c, const uint8_t *p, size_t n) {
    while (n > 0 && !c->closing) {
        if (qr__conn_rx_stopped(c)) {
            hold(c, p, n);
            return;
        }
        if (qr_secure_handshaking(&c->sec)) { /* a plain ps answering a HELLO (header_done) */
            qr_secure_feed(&c->sec, p, n);
            return;
        }
        size_t take;
        switch (c->state) {
        case RX_HEADER:
            if (c->hdr_got == 0 && c->lim) qr__conn_limits_begin(c);
            take = QR_MIN(n, QR_PROTO_HEADER_LEN - c->hdr_got);
            memcpy(c->hdr + c->hdr_got, p, take);
            c->hdr_got += take;
            if (c->hdr_got == QR_PROTO_HEADER_LEN) header_done(c);
            break;
        case RX_META:
            take = QR_MIN(n, c->meta_want - c->meta_got);
            memcpy(c->meta + c->meta_got, p, take);
            c->meta_got += take;
            if (c->meta_got == c->meta_want) start_payload(c);
            break;
        case RX_PAYLOAD:
            take = (size_t)QR_MIN((uint64_t)n, c->frame.payload_len - c->payload_got);
            if (!c->discard) {
                qr_iov *v = &c->iov[c->iov_idx];
                take = QR_MIN(take, v->len - c->iov_off);
                memcpy((uint8_t *)v->base + c->iov_off, p, take);
            }
            payload_advance(c, take);
            break;
        case RX_TRAILER:
            take = QR_MIN(n, c->trailer_left);
            c->trailer_left -= (uint32_t)take;
            if (c->trailer_left == 0) message_done(c);
            break;
        default:
            return;
        }
        p += take;
        n -= take;
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    qr_conn *c = h->data;
    if (qr_secure_owns_reads(&c->sec)) { /* the handshake, or sealed records */
        qr_secure_read_buf(&c->sec, buf);
        return;
    }
    if (c->state == RX_PAYLOAD && !c->discard && c->iov_idx < c->niov) {
        qr_iov *v = &c->iov[c->iov_idx];
        size_t rem = v->len - c->iov_off;
        if (rem >= IN_PLACE_MIN) {
            c->in_place = true;
            c->in_place_len = rem;
            buf->base = (char *)v->base + c->iov_off;
            buf->len = rem;
            return;
        }
    }
    c->in_place = false;
    if (c->skip_read) {
        c->skip_read = false;
        *buf = uv_buf_init(NULL, 0); /* libuv answers UV_ENOBUFS, see on_read */
        return;
    }
    buf->base = (char *)c->staging;
    buf->len = c->large_recent ? HEAD_READ_BYTES : STAGING_BYTES;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    qr_conn *c = s->data;
    if (c->closing) return;
    qr_conn_reclaim(c); /* the peer speaks: it may have read what was lent */
    if (nread == UV_ENOBUFS) return; /* our own skip_read: not an error */
    if (nread < 0) {
        if (nread != UV_EOF)
            qr__log(QR_LOG_DEBUG, "read from %s failed: %s", c->peer, uv_strerror((int)nread));
        if (qr_secure_handshaking(&c->sec)) qr_secure_lost(&c->sec, from_uv((int)nread));
        else close_with(c, from_uv((int)nread));
        return;
    }
    if (nread == 0) return; /* EAGAIN; not end of stream */
    if (qr_secure_owns_reads(&c->sec)) {
        qr_secure_read(&c->sec, (const uint8_t *)buf->base, (size_t)nread);
    } else if (c->in_place) {
        payload_advance(c, (size_t)nread);
        /* A read that filled its buffer makes libuv read again at once.
         * When that read ended a large message, the peer is almost always
         * waiting for our answer and the read would only return EAGAIN:
         * skip it. libuv's epoll watch is level-triggered, so bytes that
         * did arrive are still reported on the next turn of the loop. */
        c->skip_read = (size_t)nread == c->in_place_len && c->state == RX_HEADER;
    } else {
        process_bytes(c, (const uint8_t *)buf->base, (size_t)nread);
    }
}

static int start_reading(qr_conn *c) {
    int rc = uv_read_start(&c->h.stream, on_alloc, on_read);
    if (rc) return qr__fail(QR_EIO, "cannot read from %s: %s", c->peer, uv_strerror(rc));
    return QR_OK;
}

/* A resumed connection's held bytes, walked before it reads again (from
 * the prepare handle, not inside qr_conn_resume: the owner resumes from
 * its own callbacks, which must not run its message callbacks again). The
 * walk may pause it again, holding what is left. */
static void walk_held(qr_conn *c) {
    if (!c->held || qr__conn_rx_stopped(c) || c->closing) return;
    uint8_t *held = c->held;
    size_t len = c->held_len;
    c->held = NULL;
    c->held_len = 0;
    process_bytes(c, held, len);
    free(held);
    if (!qr__conn_rx_stopped(c) && !c->closing && !c->held && start_reading(c))
        close_with(c, QR_EIO);
}

/* ---- sending ------------------------------------------------------------ */

/*
 * Two paths. Most messages go through uv_write (writev from the caller's
 * buffers; libuv queues what the socket cannot take yet). A message with
 * a large payload to a Unix socket is spliced instead (splice.h): its
 * pages are lent to the kernel, so its callback - which frees the caller
 * to change or release the buffers - runs only once the peer has read
 * every byte written so far (the socket's unread count is zero), checked
 * whenever the peer sends something and after each spliced message. For a
 * ps that is when the worker's next request arrives: until then a pull
 * reply keeps its tensor, and an apply copies (store.h).
 *
 * The two paths never interleave: a message is spliced only when libuv's
 * queue is empty, and while spliced messages are still moving every later
 * message of the connection follows them through this path.
 */

static void on_splice_writable(uv_poll_t *h, int status, int events);

/* Give the callbacks of lent sends once the peer has read everything. */
void qr_conn_reclaim(qr_conn *c) {
    if (!c->lent || c->closing || qr_splice_unread(c->splice_fd) != 0) return;
    send_req *lent = c->lent;
    c->lent = c->lent_tail = NULL;
    c->lent_bytes = 0;
    finish_sends(c, lent, QR_OK);
}

/* Write buf[*off, len) to the non-blocking socket: 0 done, 1 full, -errno. */
static int write_some(int fd, const uv_buf_t *b, size_t *off) {
    while (*off < b->len) {
        ssize_t n = write(fd, b->base + *off, b->len - *off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno == EAGAIN ? 1 : -errno;
        *off += (size_t)n;
    }
    return 0;
}

/* Move the spliced sends along as far as the socket lets us. Callbacks
 * of lent sends may run at the end, unless called from qr_conn_send
 * (a send's callback never runs inside the call that made it). */
static void pump_spliced(qr_conn *c, bool may_reclaim) {
    while (c->splicing && !c->closing) {
        send_req *r = c->splicing;
        while (r->cur < r->nbufs) {
            const uv_buf_t *b = &r->bufs[r->cur];
            int rc = b->len >= SPLICE_MIN_BUFFER
                         ? qr_splicer_send(&c->splicer, c->splice_fd, b->base, b->len, &r->off)
                         : write_some(c->splice_fd, b, &r->off);
            if (rc == 1) { /* the socket is full: go on when it has room */
                if (!c->splice_polling) {
                    if (uv_poll_start(&c->splice_poll, UV_WRITABLE, on_splice_writable)) {
                        close_with(c, QR_EIO); /* else nothing would ever wake it */
                        return;
                    }
                    c->splice_polling = true;
                }
                return;
            }
            if (rc < 0) {
                qr__log(QR_LOG_DEBUG, "send to %s failed: %s", c->peer, strerror(-rc));
                close_with(c, rc == -EPIPE || rc == -ECONNRESET ? QR_EPEERLOST : QR_EIO);
                return;
            }
            r->cur++;
            r->off = 0;
        }
        c->splicing = r->next;
        if (!c->splicing) c->splicing_tail = NULL;
        r->next = NULL;
        if (c->lent_tail) c->lent_tail->next = r;
        else c->lent = r;
        c->lent_tail = r;
        c->lent_bytes += r->bytes;
    }
    if (c->splice_polling && !c->closing) {
        uv_poll_stop(&c->splice_poll);
        c->splice_polling = false;
    }
    if (may_reclaim) qr_conn_reclaim(c);
    /* Not from qr_conn_send: an event never runs inside the call that
     * caused it. */
    if (may_reclaim && !c->closing && !c->splicing && c->ev->drained) c->ev->drained(c);
}

static void on_splice_writable(uv_poll_t *h, int status, int events) {
    (void)events;
    qr_conn *c = h->data;
    if (status < 0) {
        close_with(c, from_uv(status));
        return;
    }
    pump_spliced(c, true);
}

/* Set the splice path up on first use; false if it cannot be had (then
 * the connection writes as usual). */
static bool splice_setup(qr_conn *c) {
    if (c->splice_ready) return true;
    uv_os_fd_t fd;
    if (c->is_tcp || !qr_splice_works() || uv_fileno(&c->h.handle, &fd)) return false;
    int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0) return false;
    if (qr_splicer_open(&c->splicer) != QR_OK) {
        close(dup_fd);
        return false;
    }
    if (uv_poll_init(c->loop, &c->splice_poll, dup_fd)) {
        qr_splicer_close(&c->splicer);
        close(dup_fd);
        return false;
    }
    c->splice_poll.data = c;
    c->splice_fd = dup_fd;
    c->splice_ready = true;
    c->open_handles++;
    return true;
}

static void on_write(uv_write_t *req, int status) {
    send_req *r = (send_req *)req;
    qr_conn *c = r->c;
    c->pending_bytes -= r->bytes;
    if (r->cb) r->cb(c, from_uv(status), r->ctx);
    free(r->sealed);
    free(r);
    if (status < 0 && !c->closing) close_with(c, from_uv(status));
}

/* Run on_defer before the loop next waits. */
void qr__conn_defer(qr_conn *c) {
    if (!c->defer_ready) {
        uv_prepare_init(c->loop, &c->defer); /* cannot fail */
        c->defer.data = c;
        c->defer_ready = true;
        c->open_handles++;
    }
    uv_prepare_start(&c->defer, on_defer);
}

/* Queue the callback of a send that is already written. */
static void defer_callback(qr_conn *c, send_req *r) {
    r->next = NULL;
    r->bufs = NULL;
    if (c->written_tail) c->written_tail->next = r;
    else c->written = r;
    c->written_tail = r;
    c->pending_bytes += r->bytes; /* finish_sends takes it off */
    qr__conn_defer(c);
}

int qr_conn_send(qr_conn *c, const qr_frame *f, const void *meta, uint32_t meta_len,
                 const qr_iov *payload, int npayload, qr_send_cb cb, void *ctx) {
    if (c->closing || !c->connected || qr_secure_handshaking(&c->sec))
        return qr__fail(QR_EPEERLOST, "connection to %s is not open", c->peer);
    if (meta_len > QR_PROTO_MAX_META)
        return qr__fail(QR_ETOOBIG, "meta of %u bytes exceeds the limit", meta_len);
    size_t head_len = QR_PROTO_HEADER_LEN + meta_len;
    head_len += qr_proto_pad(head_len);
    send_req *r = malloc(sizeof *r + head_len);
    if (!r) return qr__fail(QR_ENOMEM, "out of memory for a send");
    qr_frame hdr = *f;
    hdr.meta_len = meta_len;
    hdr.payload_len = 0;
    for (int i = 0; i < npayload; i++) hdr.payload_len += payload[i].len;
    uint32_t tail_len = qr_proto_pad(hdr.payload_len);
    qr_proto_encode_header(&hdr, r->head);
    if (meta_len) memcpy(r->head + QR_PROTO_HEADER_LEN, meta, meta_len);
    memset(r->head + QR_PROTO_HEADER_LEN + meta_len, 0, head_len - QR_PROTO_HEADER_LEN - meta_len);
    r->c = c;
    r->cb = cb;
    r->ctx = ctx;
    r->sealed = NULL;
    r->bytes = head_len + hdr.payload_len + tail_len;

    uv_buf_t small[16];
    uv_buf_t *bufs = small;
    int n = 0, cap = 2 + npayload; /* head, payload buffers, pad */
    if (cap > (int)QR_ARRAY_LEN(small)) {
        bufs = malloc((size_t)cap * sizeof *bufs);
        if (!bufs) {
            free(r);
            return qr__fail(QR_ENOMEM, "out of memory for a send");
        }
    }
    bufs[n++] = uv_buf_init((char *)r->head, (unsigned)head_len);
    for (int i = 0; i < npayload; i++)
        if (payload[i].len) bufs[n++] = uv_buf_init(payload[i].base, (unsigned)payload[i].len);
    if (tail_len) bufs[n++] = uv_buf_init((char *)zero_pad, tail_len);
    size_t sent_sealed = 0; /* a large sealed message's bytes already in the socket */
    bool sealing = qr_secure_sealed(&c->sec);
    if (sealing) {
        /* Sealed: the message becomes one buffer of records (r->bytes is
         * its size now), written as any other; never spliced. */
        bool nothing_queued = uv_stream_get_write_queue_size(&c->h.stream) == 0;
        bool sealed = qr_secure_seal(&c->sec, bufs, n, nothing_queued, &r->sealed, &r->bytes,
                                     &sent_sealed);
        if (bufs != small) free(bufs);
        if (!sealed) {
            free(r);
            return qr__fail(QR_ENOMEM, "out of memory to seal a send");
        }
        bufs = small;
        bufs[0] = uv_buf_init((char *)r->sealed + sent_sealed, (unsigned)(r->bytes - sent_sealed));
        n = 1;
        if (sent_sealed == r->bytes) { /* all of it went as it was sealed */
            if (!cb) {
                free(r->sealed);
                free(r);
            } else {
                defer_callback(c, r);
            }
            return QR_OK;
        }
    }
    bool splice = !sealing && ( c->splicing != NULL ||
                  (hdr.payload_len >= SPLICE_MIN_PAYLOAD &&
                   uv_stream_get_write_queue_size(&c->h.stream) == 0 && splice_setup(c)));
    if (splice) {
        r->bufs = malloc((size_t)n * sizeof *bufs);
        if (!r->bufs) {
            if (bufs != small) free(bufs);
            free(r);
            return qr__fail(QR_ENOMEM, "out of memory for a send");
        }
        memcpy(r->bufs, bufs, (size_t)n * sizeof *bufs);
        if (bufs != small) free(bufs);
        r->nbufs = n;
        r->cur = 0;
        r->off = 0;
        r->next = NULL;
        if (c->splicing_tail) c->splicing_tail->next = r;
        else c->splicing = r;
        c->splicing_tail = r;
        c->pending_bytes += r->bytes;
        pump_spliced(c, false);
        return QR_OK;
    }
    /* A small send goes straight into the socket when nothing is queued
     * before it. Through uv_write it would complete a turn of the loop
     * later and then stop its write watcher with an epoll_ctl: on a 64 B
     * round trip, a system call and a loop turn more on the worker's
     * request and on the ps's reply. A callback still runs later, never
     * inside this call (the callers' contract): from the prepare handle,
     * before the loop next waits. Whatever the socket does not take at
     * once follows through uv_write, in order. */
    uv_buf_t *left = bufs;
    int nleft = n;
    if (r->bytes <= TRY_WRITE_MAX && !sent_sealed &&
        uv_stream_get_write_queue_size(&c->h.stream) == 0) {
        int sent = uv_try_write(&c->h.stream, bufs, (unsigned)n);
        if (sent == (int)r->bytes) {
            if (bufs != small) free(bufs);
            if (!cb) {
                free(r->sealed);
                free(r);
                return QR_OK;
            }
            defer_callback(c, r);
            return QR_OK;
        }
        for (size_t skip = sent > 0 ? (size_t)sent : 0; skip > 0;) {
            size_t take = QR_MIN(skip, (size_t)left->len);
            left->base += take;
            left->len -= take;
            skip -= take;
            if (left->len == 0) {
                left++;
                nleft--;
            }
        }
    }
    /* uv_write copies the array of buffers, not the bytes. */
    int rc = uv_write(&r->req, &c->h.stream, left, (unsigned)nleft, on_write);
    if (bufs != small) free(bufs);
    if (rc) {
        free(r->sealed);
        free(r);
        return qr__fail(QR_EPEERLOST, "send to %s failed: %s", c->peer, uv_strerror(rc));
    }
    c->pending_bytes += r->bytes;
    return QR_OK;
}

void qr_conn_pause(qr_conn *c) {
    if (c->paused || c->closing) return;
    c->paused = true;
    uv_read_stop(&c->h.stream);
    if (c->lim) qr__conn_limits_stall(c);
}

void qr_conn_resume(qr_conn *c) {
    if (!c->paused || c->closing) return;
    c->paused = false;
    /* Waiting for the budget, or given room and not on yet (on_defer):
     * that path reads it again. */
    if (c->budget_wait || c->budget_granted) return;
    if (c->lim) qr__conn_limits_unstall(c); /* which may close it: a deadline had passed */
    if (c->closing) return;
    if (c->held) qr__conn_defer(c); /* walk_held, which then reads again */
    else if (start_reading(c)) close_with(c, QR_EIO);
}

bool qr_conn_paused(const qr_conn *c) {
    return c->paused;
}

bool qr_conn_all_written(const qr_conn *c) {
    return uv_stream_get_write_queue_size(&c->h.stream) == 0 && !c->splicing && !c->lent;
}

size_t qr_conn_pending_bytes(const qr_conn *c) {
    /* Lent sends are in the kernel's socket already (their pages are
     * borrowed, not copied), and their callbacks come only once the peer
     * reads and speaks again: counting them would pause a connection
     * that only its own next request could resume (a pull reply over
     * PEER_MAX_PENDING hung the worker's next call for its whole timeout). */
    return c->pending_bytes - c->lent_bytes;
}

/* ---- the security layer's calls (secure.h) ------------------------------- */

/* A handshake message being written: its own copy of the bytes. */
typedef struct hs_write {
    uv_write_t req;
    qr_conn *c;
    bool close_after;
    uint8_t bytes[];
} hs_write;

static void on_hs_written(uv_write_t *req, int status) {
    hs_write *w = (hs_write *)req;
    qr_conn *c = w->c;
    bool close_after = w->close_after;
    free(w);
    if (c->closing) return;
    if (status < 0) qr_secure_lost(&c->sec, from_uv(status));
    else if (close_after) close_with(c, QR_EAUTH);
}

static void secure_send(void *ctx, const void *p, size_t n, bool close_after) {
    qr_conn *c = ctx;
    hs_write *w = malloc(sizeof *w + n);
    if (!w) {
        close_with(c, close_after ? QR_EAUTH : QR_ENOMEM);
        return;
    }
    w->c = c;
    w->close_after = close_after;
    memcpy(w->bytes, p, n);
    uv_buf_t buf = uv_buf_init((char *)w->bytes, (unsigned)n);
    int rc = uv_write(&w->req, &c->h.stream, &buf, 1, on_hs_written);
    if (rc) {
        free(w);
        if (close_after) close_with(c, QR_EAUTH);
        else qr_secure_lost(&c->sec, from_uv(rc));
    }
}

static int secure_try_write(void *ctx, const void *p, size_t n) {
    qr_conn *c = ctx;
    uv_buf_t b = uv_buf_init((char *)p, (unsigned)n);
    return uv_try_write(&c->h.stream, &b, 1);
}

static void on_hs_timeout(uv_timer_t *t) {
    qr_secure_timeout(&((qr_conn *)t->data)->sec);
}

static void secure_deadline(void *ctx, int ms) {
    qr_conn *c = ctx;
    if (!ms) {
        if (c->hs_timer_ready) uv_timer_stop(&c->hs_timer);
        return;
    }
    if (!c->hs_timer_ready) {
        uv_timer_init(c->loop, &c->hs_timer); /* cannot fail */
        c->hs_timer.data = c;
        c->hs_timer_ready = true;
        c->open_handles++;
    }
    uv_timer_start(&c->hs_timer, on_hs_timeout, (uint64_t)ms, 0);
}

static void secure_stop_reading(void *ctx) {
    uv_read_stop(&((qr_conn *)ctx)->h.stream);
}

static int secure_open(void *ctx) {
    return alloc_staging(ctx);
}

static void secure_connected(void *ctx, int status) {
    qr_conn *c = ctx;
    if (c->ev->connected) c->ev->connected(c, status);
}

static uint8_t *secure_payload_dest(void *ctx, size_t n) {
    qr_conn *c = ctx;
    if (c->state != RX_PAYLOAD || c->discard || c->iov_idx >= c->niov ||
        c->frame.payload_len - c->payload_got < n)
        return NULL;
    qr_iov *v = &c->iov[c->iov_idx];
    return v->len - c->iov_off >= n ? (uint8_t *)v->base + c->iov_off : NULL;
}

static void secure_payload_landed(void *ctx, size_t n) {
    payload_advance(ctx, n);
}

static void secure_plaintext(void *ctx, const uint8_t *p, size_t n) {
    process_bytes(ctx, p, n);
}

static void secure_close(void *ctx, int status) {
    close_with(ctx, status);
}

static bool secure_closing(void *ctx) {
    return ((qr_conn *)ctx)->closing;
}

static const qr_secure_io secure_io = {
    .send = secure_send,
    .try_write = secure_try_write,
    .deadline = secure_deadline,
    .stop_reading = secure_stop_reading,
    .open = secure_open,
    .connected = secure_connected,
    .payload_dest = secure_payload_dest,
    .payload_landed = secure_payload_landed,
    .plaintext = secure_plaintext,
    .close = secure_close,
    .closing = secure_closing,
};

/* ---- accessors ------------------------------------------------------------ */

void qr_conn_set_data(qr_conn *c, void *data) {
    c->data = data;
}
void *qr_conn_data(const qr_conn *c) {
    return c->data;
}
const char *qr_conn_kind(const qr_conn *c) {
    return c->is_tcp ? "tcp" : "unix";
}
const char *qr_conn_peer(const qr_conn *c) {
    return c->peer;
}
uint64_t qr_conn_messages_in(const qr_conn *c) {
    return c->messages_in;
}
int qr_conn_refusal(const qr_conn *c) {
    return qr_secure_refusal(&c->sec);
}
const char *qr_conn_cipher(const qr_conn *c) {
    return qr_secure_cipher(&c->sec);
}
const char *qr_conn_refusal_message(const qr_conn *c) {
    return qr_secure_reason(&c->sec);
}
void *qr_listener_data(const qr_listener *l) {
    return l->data;
}

/* ---- connecting ------------------------------------------------------------ */

static int resolve(const qr_addr *a, struct sockaddr_storage *ss) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char port[16];
    snprintf(port, sizeof port, "%d", a->port);
    int rc = getaddrinfo(a->host, port, &hints, &res);
    if (rc || !res)
        return qr__fail(QR_EINVAL, "cannot resolve host '%s': %s", a->host, gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return QR_OK;
}

static void on_connect(uv_connect_t *req, int status) {
    qr_conn *c = req->data;
    if (status == 0) {
        c->connected = true;
        tune_socket(c);
        if (c->opt.auth) {
            /* `connected` comes once the handshake is done (secure.c). */
            int hrc = qr_secure_start(&c->sec, c->opt.auth, false);
            if (!hrc) hrc = start_reading(c);
            if (hrc) qr_secure_lost(&c->sec, hrc);
            return;
        }
        if (start_reading(c)) status = UV_EIO;
    }
    int rc = status ? from_uv(status) : QR_OK;
    if (rc) qr__fail(rc, "cannot connect to %s: %s", c->peer, uv_strerror(status));
    if (c->ev->connected) c->ev->connected(c, rc);
    if (rc) close_with(c, rc);
}

int qr_connect(uv_loop_t *loop, const qr_addr *addr, bool prefer_unix,
               const qr_conn_options *opt, const qr_conn_events *ev, void *data,
               qr_conn **out) {
    char unix_path[108] = "";
    if (addr->kind == QR_ADDR_UNIX) {
        snprintf(unix_path, sizeof unix_path, "%s", addr->path);
    } else if (prefer_unix && addr->loopback) {
        struct stat st;
        if (qr_addr_local_unix_path(addr, unix_path, sizeof unix_path) == QR_OK &&
            (stat(unix_path, &st) != 0 || !S_ISSOCK(st.st_mode)))
            unix_path[0] = 0; /* the ps serves no Unix socket (yet): use TCP */
    }
    struct sockaddr_storage ss;
    if (!unix_path[0]) {
        int rc = resolve(addr, &ss);
        if (rc) return rc;
    }
    qr_conn *c = conn_new(loop, !unix_path[0], opt, ev, data);
    if (!c) return QR_ENOMEM;
    c->connect_req.data = c;
    int rc;
    if (unix_path[0]) {
        snprintf(c->peer, sizeof c->peer, "unix:%s", unix_path);
        uv_pipe_connect(&c->connect_req, &c->h.pipe, unix_path, on_connect);
        rc = 0;
    } else {
        snprintf(c->peer, sizeof c->peer, "%s:%d", addr->host, addr->port);
        rc = uv_tcp_connect(&c->connect_req, &c->h.tcp, (struct sockaddr *)&ss, on_connect);
    }
    if (rc) {
        int status = qr__fail(QR_EIO, "cannot connect to %s: %s", c->peer, uv_strerror(rc));
        c->closing = true;
        c->ev = &no_events;
        uv_close(&c->h.handle, on_close);
        return status;
    }
    *out = c;
    return QR_OK;
}

/* ---- listening ------------------------------------------------------------ */

static void on_connection(uv_stream_t *server, int status) {
    qr_listener *l = server->data;
    if (status < 0) {
        qr__log(QR_LOG_WARN, "accept failed: %s", uv_strerror(status));
        return;
    }
    bool is_tcp = server->type == UV_TCP;
    qr_conn *c = conn_new(l->loop, is_tcp, &l->opt, l->ev, l->data);
    if (!c) return;
    if (uv_accept(server, &c->h.stream)) {
        c->closing = true;
        c->ev = &no_events;
        uv_close(&c->h.handle, on_close);
        return;
    }
    c->connected = true;
    c->accepted = true;
    if (l->lim) qr__conn_limits_attach(c, l->lim);
    if (is_tcp) {
        struct sockaddr_storage ss;
        int len = sizeof ss;
        char host[64] = "?";
        int port = 0;
        if (uv_tcp_getpeername(&c->h.tcp, (struct sockaddr *)&ss, &len) == 0) {
            if (ss.ss_family == AF_INET) {
                uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof host);
                port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
            } else {
                struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
                port = ntohs(sin6->sin6_port);
                if (IN6_IS_ADDR_V4MAPPED(&sin6->sin6_addr)) /* an IPv4 peer of a "::" listener */
                    inet_ntop(AF_INET, &sin6->sin6_addr.s6_addr[12], host, sizeof host);
                else
                    uv_ip6_name(sin6, host, sizeof host);
            }
        }
        snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
    } else {
        /* A Unix socket's peer has no address: its process says who it is. */
        struct ucred cred;
        socklen_t len = sizeof cred;
        uv_os_fd_t fd;
        if (!uv_fileno(&c->h.handle, &fd) &&
            !getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len))
            snprintf(c->peer, sizeof c->peer, "unix:%s (pid %d, uid %u)", l->unix_path,
                     (int)cred.pid, (unsigned)cred.uid);
        else
            snprintf(c->peer, sizeof c->peer, "unix:%s", l->unix_path);
    }
    tune_socket(c);
    /* Accepted at once, before the handshake, so the owner's cap on
     * connections (max-connections) counts those still authenticating. */
    if (l->ev->accepted) l->ev->accepted(l, c);
    if (!c->closing && c->opt.auth && qr_secure_start(&c->sec, c->opt.auth, true)) {
        close_with(c, QR_ENOMEM);
        return;
    }
    /* The owner may have paused or closed it already. */
    if (!c->paused && !c->closing && start_reading(c)) close_with(c, QR_EIO);
}

static void on_listener_close(uv_handle_t *h) {
    qr_listener *l = h->data;
    if (--l->open_handles == 0) {
        qr__conn_limits_unref(l->lim);
        free(l);
    }
}

const char *qr_listener_unix_path(const qr_listener *l) {
    return l && l->has_pipe ? l->unix_path : NULL;
}

void qr_listener_close(qr_listener *l) {
    if (!l) return;
    if (l->has_pipe) {
        unlink(l->unix_path);
        uv_close((uv_handle_t *)&l->pipe, on_listener_close);
    }
    if (l->has_tcp) uv_close((uv_handle_t *)&l->tcp, on_listener_close);
}

/* Make way for a Unix socket at path. A socket file left by a killed
 * (SIGKILLed) process would make bind fail, and is removed: stale when
 * `owned` (the TCP bind of the same address, done first, proved no live
 * process serves it), else when nothing listens on it. A socket a live
 * process listens on, or a file that is no socket, is refused, naming it:
 * removing it would steal another task's address. */
static int clear_stale_socket(const char *path, bool owned) {
    struct stat st;
    if (lstat(path, &st)) return QR_OK;
    if (!S_ISSOCK(st.st_mode))
        return qr__fail(QR_EIO, "cannot listen on unix:%s: it exists and is not a socket", path);
    if (!owned) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int rc = fd < 0 ? -1 : connect(fd, (struct sockaddr *)&sa, sizeof sa);
        int e = errno;
        if (fd >= 0) close(fd);
        if (!rc || e != ECONNREFUSED)
            return qr__fail(QR_EIO, "cannot listen on unix:%s: %s", path,
                            rc ? strerror(e) : "another process listens on it");
    }
    if (unlink(path) && errno != ENOENT)
        return qr__fail(QR_EIO, "cannot remove the stale socket unix:%s: %s", path,
                        strerror(errno));
    return QR_OK;
}

static int listen_unix(qr_listener *l, const char *path, bool owned) {
    snprintf(l->unix_path, sizeof l->unix_path, "%s", path);
    int rc = clear_stale_socket(path, owned);
    if (rc) return rc;
    uv_pipe_init(l->loop, &l->pipe, 0);
    l->pipe.data = l;
    l->has_pipe = true;
    l->open_handles++;
    rc = uv_pipe_bind(&l->pipe, path);
    if (!rc) rc = uv_listen((uv_stream_t *)&l->pipe, 128, on_connection);
    if (rc) return qr__fail(QR_EIO, "cannot listen on unix:%s: %s", path, uv_strerror(rc));
    return QR_OK;
}

/* The address to bind: bind_host (any interface: "0.0.0.0", or "::" for
 * IPv4 and IPv6 together) at addr's port, or addr itself. */
static int resolve_bind(const qr_addr *addr, const char *bind_host,
                        struct sockaddr_storage *ss) {
    if (!bind_host || !*bind_host) return resolve(addr, ss);
    qr_addr at = *addr;
    snprintf(at.host, sizeof at.host, "%s", bind_host);
    return resolve(&at, ss);
}

int qr_listen(uv_loop_t *loop, const qr_addr *addr, const char *bind_host, bool tcp_only,
              const qr_conn_options *opt, const qr_conn_events *ev, void *data,
              qr_listener **out) {
    qr_listener *l = qr__calloc(1, sizeof *l);
    if (!l) return QR_ENOMEM;
    l->loop = loop;
    l->ev = ev;
    l->data = data;
    l->opt = *opt;
    int rc = qr__conn_limits_new(opt, &l->lim);
    if (rc) {
        free(l);
        return rc;
    }
    if (addr->kind == QR_ADDR_UNIX) {
        rc = listen_unix(l, addr->path, false);
    } else {
        struct sockaddr_storage ss;
        rc = resolve_bind(addr, bind_host, &ss);
        if (rc) {
            qr__conn_limits_unref(l->lim);
            free(l);
            return rc;
        }
        uv_tcp_init(loop, &l->tcp);
        l->tcp.data = l;
        l->has_tcp = true;
        l->open_handles++;
        int urc = uv_tcp_bind(&l->tcp, (struct sockaddr *)&ss, 0);
        if (!urc) urc = uv_listen((uv_stream_t *)&l->tcp, 128, on_connection);
        if (urc) {
            rc = qr__fail(QR_EIO, "cannot listen on %s:%d: %s",
                          bind_host && *bind_host ? bind_host : addr->host, addr->port,
                          uv_strerror(urc));
        } else if (addr->loopback) {
            /* TCP only: no Unix socket, but one a killed run of this
             * address left would still draw local peers to it. */
            char path[108];
            rc = qr_addr_local_unix_path(addr, path, sizeof path);
            if (!rc) rc = tcp_only ? clear_stale_socket(path, true) : listen_unix(l, path, true);
        }
    }
    if (rc) {
        if (!l->open_handles) free(l); /* refused before any handle was made */
        else qr_listener_close(l);
        return rc;
    }
    *out = l;
    return QR_OK;
}

/*
 * conn_write.c - the write path of the libuv transport (conn_internal.h):
 * qr_conn_send and what follows a send until its callback runs.
 *
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
#include "wire/conn_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* The pad after a payload is written from here. */
static const uint8_t zero_pad[QR_PROTO_ALIGN];

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
void qr__conn_fail_spliced(qr_conn *c, int status) {
    send_req *splicing = c->splicing, *lent = c->lent;
    c->splicing = c->splicing_tail = c->lent = c->lent_tail = NULL;
    c->lent_bytes = 0;
    if (!status) status = QR_EPEERLOST;
    finish_sends(c, splicing, status);
    finish_sends(c, lent, status);
}

/* Run the callbacks of the sends written at once (they were written:
 * QR_OK), including any such a callback adds. */
void qr__conn_finish_written(qr_conn *c) {
    while (c->written) {
        send_req *list = c->written;
        c->written = c->written_tail = NULL;
        finish_sends(c, list, QR_OK);
    }
}

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
                        qr__conn_close_with(c, QR_EIO); /* else nothing would ever wake it */
                        return;
                    }
                    c->splice_polling = true;
                }
                return;
            }
            if (rc < 0) {
                qr__log(QR_LOG_DEBUG, "send to %s failed: %s", c->peer, strerror(-rc));
                qr__conn_close_with(c, rc == -EPIPE || rc == -ECONNRESET ? QR_EPEERLOST : QR_EIO);
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
        qr__conn_close_with(c, qr__conn_from_uv(status));
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
    if (r->cb) r->cb(c, qr__conn_from_uv(status), r->ctx);
    free(r->sealed);
    free(r);
    if (status < 0 && !c->closing) qr__conn_close_with(c, qr__conn_from_uv(status));
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

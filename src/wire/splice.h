/*
 * splice.h - writing large buffers into a Unix socket without copying
 * them: vmsplice(2) lends the buffer's pages to a pipe, splice(2) moves
 * them from the pipe into the socket, and the reader copies straight out
 * of the writer's pages (Linux 6.5 and later; older kernels copy inside
 * splice, which is no worse than write).
 *
 * The catch is that the pages are lent, not copied: the bytes must stay
 * unchanged, and the memory must not be freed, until the reader has
 * consumed them, which is later than when the write returns. The
 * transport (conn_write.c) holds a send's buffers until the socket's unread
 * queue is empty (qr_splice_unread).
 *
 * Used on non-blocking sockets from the loop thread: every call does what
 * it can now and says whether the socket is full.
 */
#ifndef QR_WIRE_SPLICE_H
#define QR_WIRE_SPLICE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct qr_splicer {
    int pipe[2];    /* -1 when closed */
    size_t in_pipe; /* bytes lent to the pipe, not yet in the socket */
} qr_splicer;

/* Does this kernel splice into a Unix socket? Probed once per process. */
bool qr_splice_works(void);

/* A non-blocking pipe of 1 MiB (QR_OK) or an error. */
int qr_splicer_open(qr_splicer *s);
void qr_splicer_close(qr_splicer *s);

/* Move buf[*off, len) into the non-blocking socket fd, advancing *off as
 * bytes are lent to the pipe; bytes still in the pipe from an earlier call
 * go first. Returns 0 when all of it is in the socket, 1 when the socket
 * is full (call again once it is writable), or -errno. */
int qr_splicer_send(qr_splicer *s, int fd, const void *buf, size_t len, size_t *off);

/* Bytes (in the kernel's accounting) written to socket fd that its peer
 * has not read yet; 0 means every lent page is back. -1 on error. */
long qr_splice_unread(int fd);

#endif /* QR_WIRE_SPLICE_H */

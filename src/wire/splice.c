/*
 * splice.c - zero-copy writes into Unix sockets (see splice.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* vmsplice, splice, pipe2, F_SETPIPE_SZ */
#endif
#include "wire/splice.h"

#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <pthread.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* Lent to the pipe at most this much at a time: the pipe's size, and the
 * largest a pipe may be made without privileges (fs.pipe-max-size). */
#define PIPE_BYTES (1 << 20)

int qr_splicer_open(qr_splicer *s) {
    s->in_pipe = 0;
    if (pipe2(s->pipe, O_NONBLOCK | O_CLOEXEC)) {
        s->pipe[0] = s->pipe[1] = -1;
        return qr__fail(QR_EIO, "pipe: %s", strerror(errno));
    }
    fcntl(s->pipe[1], F_SETPIPE_SZ, PIPE_BYTES); /* a smaller pipe only means more calls */
    return QR_OK;
}

void qr_splicer_close(qr_splicer *s) {
    for (int i = 0; i < 2; i++)
        if (s->pipe[i] >= 0) close(s->pipe[i]);
    s->pipe[0] = s->pipe[1] = -1;
    s->in_pipe = 0;
}

int qr_splicer_send(qr_splicer *s, int fd, const void *buf, size_t len, size_t *off) {
    for (;;) {
        if (s->in_pipe) {
            ssize_t n = splice(s->pipe[0], NULL, fd, NULL, s->in_pipe,
                               SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) return errno == EAGAIN ? 1 : -errno;
            if (n == 0) return -EPIPE;
            s->in_pipe -= (size_t)n;
            continue;
        }
        if (*off >= len) return 0;
        struct iovec iov = {(char *)buf + *off, QR_MIN(len - *off, (size_t)PIPE_BYTES)};
        ssize_t n = vmsplice(s->pipe[1], &iov, 1, SPLICE_F_NONBLOCK);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -errno; /* the pipe was empty: EAGAIN cannot happen */
        *off += (size_t)n;
        s->in_pipe += (size_t)n;
    }
}

long qr_splice_unread(int fd) {
    int unread = 0;
    return ioctl(fd, SIOCOUTQ, &unread) ? -1 : unread;
}

/* Splice 64 KiB through a socket pair and check it arrives intact. */
static bool splice_probe(void) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv)) return false;
    qr_splicer s;
    bool ok = false;
    if (qr_splicer_open(&s) == QR_OK) {
        static unsigned char out[65536], in[65536];
        for (size_t i = 0; i < sizeof out; i++) out[i] = (unsigned char)(i * 7 + 1);
        size_t off = 0, got = 0;
        int rc = qr_splicer_send(&s, sv[0], out, sizeof out, &off);
        while (rc == 0 && got < sizeof in) {
            ssize_t n = read(sv[1], in + got, sizeof in - got);
            if (n <= 0) break;
            got += (size_t)n;
        }
        ok = rc == 0 && got == sizeof in && !memcmp(in, out, sizeof in) &&
             qr_splice_unread(sv[0]) == 0;
        qr_splicer_close(&s);
    }
    close(sv[0]);
    close(sv[1]);
    return ok;
}

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static bool probe_result;

static void run_probe(void) {
    probe_result = splice_probe();
}

bool qr_splice_works(void) {
    pthread_once(&probe_once, run_probe);
    return probe_result;
}

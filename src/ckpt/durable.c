/*
 * durable.c - files that are either wholly written or not there: the
 * bytes go to PATH.tmp-PID, which is fsynced and renamed over PATH, and
 * then PATH's folder is fsynced so that the rename itself survives a
 * crash. A reader therefore never sees half a shard or half a manifest
 * under the real name.
 */
#include "ckpt/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

int qr_durable_open(qr_durable *d, const char *path) {
    memset(d, 0, sizeof *d);
    d->fd = -1;
    d->path = qr__strdup(path);
    size_t len = strlen(path) + 32;
    d->tmp = malloc(len);
    if (!d->path || !d->tmp) {
        free(d->path);
        free(d->tmp);
        return qr__fail(QR_ENOMEM, "out of memory opening '%s'", path);
    }
    snprintf(d->tmp, len, "%s.tmp-%d", path, (int)getpid());
    d->fd = open(d->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (d->fd < 0) {
        int e = errno;
        free(d->path);
        free(d->tmp);
        d->path = d->tmp = NULL;
        return qr__fail(QR_EIO, "cannot create '%s.tmp-%d': %s", path, (int)getpid(), strerror(e));
    }
    d->crc = (uint32_t)crc32(0L, Z_NULL, 0);
    return QR_OK;
}

int qr_durable_write(qr_durable *d, const void *buf, size_t len) {
    const uint8_t *p = buf;
    d->crc = (uint32_t)crc32_z(d->crc, p, len);
    d->bytes += len;
    while (len) {
        ssize_t n = write(d->fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return qr__fail(QR_EIO, "writing '%s': %s", d->tmp, strerror(errno));
        p += n;
        len -= (size_t)n;
    }
    return QR_OK;
}

static void durable_free(qr_durable *d) {
    if (d->fd >= 0) close(d->fd);
    d->fd = -1;
    free(d->path);
    free(d->tmp);
    d->path = d->tmp = NULL;
}

int qr_fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return qr__fail(QR_EIO, "cannot open folder '%s': %s", path, strerror(errno));
    int rc = fsync(fd) && errno != EINVAL ? errno : 0; /* EINVAL: the fs cannot (tmpfs) */
    close(fd);
    return rc ? qr__fail(QR_EIO, "fsync of folder '%s': %s", path, strerror(rc)) : QR_OK;
}

int qr_durable_commit(qr_durable *d) {
    int rc = QR_OK;
    if (fsync(d->fd)) rc = qr__fail(QR_EIO, "fsync of '%s': %s", d->tmp, strerror(errno));
    if (!rc && close(d->fd)) rc = qr__fail(QR_EIO, "closing '%s': %s", d->tmp, strerror(errno));
    d->fd = -1;
    if (!rc && rename(d->tmp, d->path))
        rc = qr__fail(QR_EIO, "renaming '%s' to '%s': %s", d->tmp, d->path, strerror(errno));
    if (rc) {
        qr_durable_abandon(d);
        return rc;
    }
    char *copy = qr__strdup(d->path);
    rc = copy ? qr_fsync_dir(dirname(copy)) : QR_ENOMEM;
    free(copy);
    durable_free(d);
    return rc;
}

void qr_durable_abandon(qr_durable *d) {
    if (d->tmp) unlink(d->tmp);
    durable_free(d);
}

int qr_mkdir(const char *path) {
    if (!mkdir(path, 0755) || errno == EEXIST) {
        struct stat st;
        if (!stat(path, &st) && S_ISDIR(st.st_mode)) return QR_OK;
        return qr__fail(QR_EIO, "'%s' exists and is not a folder", path);
    }
    return qr__fail(QR_EIO, "cannot create folder '%s': %s", path, strerror(errno));
}

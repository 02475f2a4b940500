/*
 * secret.c - the cluster secret from its file, and a task's credentials
 * (secret.h).
 */
#include "wire/secret.h"

#include "common/config.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *qr__secret_path(const qr_config *cfg) {
    const char *path = qr__config_str(cfg, "secret-file");
    if (path && !strcmp(path, "none")) return ""; /* said outright: no secret */
    if (path && *path) return path;
    const char *env = getenv("QUORUM_SECRET_FILE");
    return env ? env : "";
}

int qr__read_secret_file(const char *path, uint8_t *buf, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return qr__fail(QR_EIO, "cannot open the secret file %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return qr__fail(QR_EINVAL, "the secret file %s is not a regular file", path);
    }
    /* Anyone who can read the secret can join the job, and anyone who
     * can write it can lock the job out: only its owner (and, for a
     * Kubernetes Secret mounted with an fsGroup, its group) may read it. */
    if (st.st_mode & (S_IRWXO | S_IWGRP)) {
        close(fd);
        return qr__fail(QR_EINVAL, "the secret file %s has mode %04o: others may read or write "
                        "it; make it readable by its owner only (chmod 600 %s)", path,
                        (unsigned)(st.st_mode & 07777), path);
    }
    size_t got = 0;
    size_t cap = QR_SECRET_MAX_BYTES + 2;
    while (got < cap) {
        ssize_t n = read(fd, buf + got, cap - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            close(fd);
            return qr__fail(QR_EIO, "cannot read the secret file %s: %s", path, strerror(e));
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    close(fd);
    if (got > 0 && buf[got - 1] == '\n') got--;
    if (got > 0 && buf[got - 1] == '\r') got--;
    if (got < QR_SECRET_MIN_BYTES || got > QR_SECRET_MAX_BYTES) {
        sodium_memzero(buf, cap);
        return qr__fail(QR_EINVAL, "the secret file %s holds %zu bytes; a secret has %d to %d "
                        "(`quorum keygen %s` writes one)", path, got, QR_SECRET_MIN_BYTES,
                        QR_SECRET_MAX_BYTES, path);
    }
    *len = got;
    return QR_OK;
}

int qr__write_secret_file(const char *path) {
    if (sodium_init() < 0) return qr__fail(QR_EIO, "libsodium cannot start");
    uint8_t key[32];
    char text[2 * sizeof key + 2];
    randombytes_buf(key, sizeof key);
    sodium_bin2hex(text, sizeof text, key, sizeof key);
    sodium_memzero(key, sizeof key);
    size_t len = strlen(text);
    text[len++] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        sodium_memzero(text, sizeof text);
        return qr__fail(e == EEXIST ? QR_EEXIST : QR_EIO, "cannot create the secret file %s: %s%s",
                        path, strerror(e), e == EEXIST ? " (a secret is never overwritten: "
                        "remove the old one first)" : "");
    }
    ssize_t n = write(fd, text, len);
    sodium_memzero(text, sizeof text);
    if (fchmod(fd, 0600) != 0 || n != (ssize_t)len || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(path);
        return qr__fail(QR_EIO, "cannot write the secret file %s: %s", path, strerror(e));
    }
    close(fd);
    return QR_OK;
}

char *qr__cluster_spec_text(const qr_cluster *cl) {
    size_t n = 32;
    for (int i = 0; i < cl->nps; i++) n += strlen(cl->ps[i]) + 1;
    for (int i = 0; i < cl->nworkers; i++) n += strlen(cl->workers[i]) + 1;
    char *s = qr__calloc(1, n);
    if (!s) return NULL;
    size_t at = (size_t)snprintf(s, n, "ps=");
    for (int i = 0; i < cl->nps; i++)
        at += (size_t)snprintf(s + at, n - at, "%s%s", i ? "," : "", cl->ps[i]);
    at += (size_t)snprintf(s + at, n - at, ";worker=");
    for (int i = 0; i < cl->nworkers; i++)
        at += (size_t)snprintf(s + at, n - at, "%s%s", i ? "," : "", cl->workers[i]);
    return s;
}

int qr__auth_from_config(const qr_config *cfg, const qr_cluster *cl, qr_auth **out) {
    *out = NULL;
    const char *path = qr__secret_path(cfg);
    bool encrypt = qr__config_bool(cfg, "encrypt");
    if (!*path) {
        if (encrypt)
            return qr__fail(QR_EINVAL, "encrypt needs a cluster secret: give --secret-file "
                            "(or QUORUM_SECRET_FILE)");
        return QR_OK;
    }
    uint8_t secret[QR_SECRET_MAX_BYTES + 2];
    size_t len = 0;
    int rc = qr__read_secret_file(path, secret, &len);
    if (rc) return rc;
    char *spec = qr__cluster_spec_text(cl);
    rc = spec ? qr_auth_new(secret, len, spec, encrypt, out) : QR_ENOMEM;
    sodium_memzero(secret, sizeof secret);
    free(spec);
    return rc;
}

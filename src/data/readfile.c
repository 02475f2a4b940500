/*
 * readfile.c - slurp a gzip or plain file. zlib's gzread passes plain files
 * through unchanged, so one path handles "x.csv" and "x.csv.gz" alike.
 */
#include "data/readfile.h"

#include "common/common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

int qr_data_read_file(const char *path, const char *what, char **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    gzFile f = gzopen(path, "rb");
    if (!f) {
        int e = errno;
        return qr__fail(e == ENOENT ? QR_ENOTFOUND : QR_EIO, "%s %s: cannot open: %s",
                        what, path, e ? strerror(e) : "out of memory");
    }
    size_t cap = 1 << 16, n = 0;
    char *data = malloc(cap + 1);
    if (!data) {
        gzclose(f);
        return qr__fail(QR_ENOMEM, "%s %s: out of memory", what, path);
    }
    for (;;) {
        if (n == cap) {
            char *bigger = realloc(data, cap * 2 + 1);
            if (!bigger) {
                free(data);
                gzclose(f);
                return qr__fail(QR_ENOMEM, "%s %s: out of memory after %zu bytes", what, path, n);
            }
            data = bigger;
            cap *= 2;
        }
        size_t want = QR_MIN(cap - n, (size_t)1 << 30);
        int got = gzread(f, data + n, (unsigned)want);
        if (got < 0) {
            int e = errno, zerr;
            const char *msg = gzerror(f, &zerr);
            qr__fail(QR_EIO, "%s %s: read failed after %zu bytes: %s", what, path, n,
                     zerr == Z_ERRNO ? strerror(e) : msg);
            free(data);
            gzclose(f);
            return QR_EIO;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    /* A gzip stream cut short reads as a clean end of file with Z_BUF_ERROR
     * pending; a corrupt one as Z_DATA_ERROR. Either way the data is bad. */
    int zerr;
    const char *msg = gzerror(f, &zerr);
    if (zerr != Z_OK) {
        qr__fail(QR_EIO, "%s %s: corrupt or truncated gzip data after %zu bytes: %s", what,
                 path, n, msg);
        free(data);
        gzclose(f);
        return QR_EIO;
    }
    gzclose(f);
    if (memchr(data, '\0', n)) {
        free(data);
        return qr__fail(QR_EINVAL, "%s %s: contains a NUL byte; not a text file", what, path);
    }
    data[n] = '\0';
    *buf = data;
    *len = n;
    return QR_OK;
}

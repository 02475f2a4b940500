/*
 * idx.c - reader for the IDX files of MNIST and Fashion-MNIST.
 *
 * Format: a 4-byte magic (0, 0, element type, number of dims), the dims as
 * big-endian uint32, then the elements in row-major order. Only unsigned
 * byte elements (type 0x08) occur in these datasets, so only they are
 * accepted. Files may be gzip-compressed or plain (gzread reads both).
 *
 * The payload is read into a buffer that grows as data actually arrives,
 * so a corrupt header claiming billions of elements fails as "truncated"
 * instead of first allocating what it claims.
 */
#include "data/idx.h"

#include "common/common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define IDX_UBYTE 0x08
#define IDX_MAX_ELEMS ((int64_t)1 << 40)

typedef struct idx_file {
    gzFile f;
    const char *path;
    const char *what; /* "IDX images file" */
} idx_file;

static int idx_open(idx_file *in, const char *path, const char *what) {
    in->path = path;
    in->what = what;
    in->f = gzopen(path, "rb");
    if (!in->f) {
        int e = errno;
        return qr__fail(e == ENOENT ? QR_ENOTFOUND : QR_EIO, "%s %s: cannot open: %s", what,
                        path, e ? strerror(e) : "out of memory");
    }
    return QR_OK;
}

/* Read up to `want` bytes; *got is how many arrived before end of file. */
static int idx_read(idx_file *in, void *dst, size_t want, size_t *got) {
    *got = 0;
    while (*got < want) {
        size_t chunk = QR_MIN(want - *got, (size_t)1 << 30);
        int r = gzread(in->f, (char *)dst + *got, (unsigned)chunk);
        if (r < 0) {
            int e = errno, zerr;
            const char *msg = gzerror(in->f, &zerr);
            return qr__fail(QR_EIO, "%s %s: read failed: %s", in->what, in->path,
                            zerr == Z_ERRNO ? strerror(e) : msg);
        }
        if (r == 0) break;
        *got += (size_t)r;
    }
    /* A gzip stream cut short ends "cleanly" with Z_BUF_ERROR pending. */
    int zerr;
    const char *msg = gzerror(in->f, &zerr);
    if (zerr != Z_OK)
        return qr__fail(QR_EIO, "%s %s: corrupt or truncated gzip data: %s", in->what,
                        in->path, msg);
    return QR_OK;
}

/* Read the magic and dims; check the element type and number of dims. */
static int idx_header(idx_file *in, int min_dims, int max_dims, uint32_t expect_magic,
                      int64_t dims[4], int *ndims) {
    unsigned char magic[4];
    size_t got;
    int rc = idx_read(in, magic, 4, &got);
    if (rc) return rc;
    if (got < 4)
        return qr__fail(QR_EIO, "%s %s: truncated: %zu bytes, too short for the magic number",
                        in->what, in->path, got);
    uint32_t m = (uint32_t)magic[0] << 24 | (uint32_t)magic[1] << 16 | (uint32_t)magic[2] << 8 |
                 magic[3];
    if (magic[0] != 0 || magic[1] != 0 || magic[2] != IDX_UBYTE || magic[3] < min_dims ||
        magic[3] > max_dims)
        return qr__fail(QR_EINVAL,
                        "%s %s: bad magic number 0x%08x, expected 0x%08x (unsigned bytes, "
                        "%d dims); not an IDX file of this kind",
                        in->what, in->path, m, expect_magic, expect_magic & 0xff);
    *ndims = magic[3];
    unsigned char raw[16];
    rc = idx_read(in, raw, (size_t)*ndims * 4, &got);
    if (rc) return rc;
    if (got < (size_t)*ndims * 4)
        return qr__fail(QR_EIO, "%s %s: truncated in the header (%d dims need %d bytes)",
                        in->what, in->path, *ndims, 4 + *ndims * 4);
    for (int i = 0; i < *ndims; i++) {
        const unsigned char *b = raw + 4 * i;
        dims[i] = (int64_t)((uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3]);
        if (dims[i] == 0)
            return qr__fail(QR_EINVAL, "%s %s: dimension %d is 0; the file holds no data",
                            in->what, in->path, i);
    }
    return QR_OK;
}

/* Read exactly `total` payload bytes and check nothing follows them. */
static int idx_payload(idx_file *in, int64_t total, unsigned char **out) {
    *out = NULL;
    size_t cap = (size_t)QR_MIN(total, (int64_t)1 << 20), have = 0;
    unsigned char *buf = malloc(cap);
    if (!buf) return qr__fail(QR_ENOMEM, "%s %s: out of memory", in->what, in->path);
    for (;;) {
        size_t got;
        int rc = idx_read(in, buf + have, cap - have, &got);
        if (rc) {
            free(buf);
            return rc;
        }
        have += got;
        if (have < cap || cap == (size_t)total) break;
        size_t bigger = (size_t)QR_MIN((int64_t)cap * 2, total);
        unsigned char *nb = realloc(buf, bigger);
        if (!nb) {
            free(buf);
            return qr__fail(QR_ENOMEM, "%s %s: out of memory at %zu bytes", in->what, in->path,
                            bigger);
        }
        buf = nb;
        cap = bigger;
    }
    if ((int64_t)have < total) {
        free(buf);
        return qr__fail(QR_EIO, "%s %s: truncated: header promises %lld data bytes, file has %zu",
                        in->what, in->path, (long long)total, have);
    }
    unsigned char extra;
    size_t got;
    int rc = idx_read(in, &extra, 1, &got);
    if (rc || got) {
        free(buf);
        return rc ? rc
                  : qr__fail(QR_EINVAL,
                             "%s %s: extra data after the %lld bytes the header promises",
                             in->what, in->path, (long long)total);
    }
    *out = buf;
    return QR_OK;
}

int qr_idx_load_images(const char *path, float **x, int64_t *n, int64_t *dim) {
    *x = NULL;
    *n = *dim = 0;
    idx_file in;
    int rc = idx_open(&in, path, "IDX images file");
    if (rc) return rc;
    int64_t dims[4];
    int ndims;
    unsigned char *raw = NULL;
    rc = idx_header(&in, 2, 4, 0x00000803u, dims, &ndims);
    if (rc) goto done;
    /* Multiply with a bound at each step: three uint32 dims could overflow. */
    int64_t d = 1, total = dims[0];
    for (int i = 1; i < ndims; i++) {
        if (dims[i] > IDX_MAX_ELEMS / total) {
            rc = qr__fail(QR_EINVAL, "%s %s: header claims more than 2^40 bytes of data",
                          in.what, path);
            goto done;
        }
        d *= dims[i];
        total *= dims[i];
    }
    rc = idx_payload(&in, total, &raw);
    if (rc) goto done;
    float *out = malloc((size_t)total * sizeof(float));
    if (!out) {
        rc = qr__fail(QR_ENOMEM, "%s %s: out of memory for %lld floats", in.what, path,
                      (long long)total);
        goto done;
    }
    for (int64_t i = 0; i < total; i++) out[i] = (float)raw[i] / 255.0f;
    *x = out;
    *n = dims[0];
    *dim = d;
done:
    free(raw);
    gzclose(in.f);
    return rc;
}

int qr_idx_load_labels(const char *path, int32_t **y, int64_t *n) {
    *y = NULL;
    *n = 0;
    idx_file in;
    int rc = idx_open(&in, path, "IDX labels file");
    if (rc) return rc;
    int64_t dims[4];
    int ndims;
    unsigned char *raw = NULL;
    rc = idx_header(&in, 1, 1, 0x00000801u, dims, &ndims);
    if (rc) goto done;
    rc = idx_payload(&in, dims[0], &raw);
    if (rc) goto done;
    int32_t *out = malloc((size_t)dims[0] * sizeof(int32_t));
    if (!out) {
        rc = qr__fail(QR_ENOMEM, "%s %s: out of memory", in.what, path);
        goto done;
    }
    for (int64_t i = 0; i < dims[0]; i++) out[i] = raw[i];
    *y = out;
    *n = dims[0];
done:
    free(raw);
    gzclose(in.f);
    return rc;
}

/*
 * safetensors.c - the safetensors file format (Hugging Face), written and
 * read: an 8-byte little-endian header length, a JSON header
 *   {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]},
 *    ..., "__metadata__": {"key": "string", ...}}
 * padded with spaces to a multiple of 8 bytes, then the tensors' raw
 * little-endian bytes, back to back, offsets counted from the end of the
 * header. It is what `safetensors.numpy.load_file` and
 * `safetensors.torch.load_file` read, so a user needs nothing of quorum
 * to open a checkpoint. The format is small enough that writing it here
 * costs less than a dependency (Debian has no C library for it).
 *
 * The reader trusts nothing: the header's size, every offset and every
 * shape are checked against the file before a byte is read.
 */
#include "ckpt/ckpt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoints are written straight from memory: a little-endian machine is assumed"
#endif

/* The safetensors library refuses headers above 100 MB. */
#define ST_MAX_HEADER (100u << 20)
/* Tensor bytes are checksummed and written in pieces of this size, so
 * the write reads what the checksum has just brought into cache. */
#define ST_WRITE_CHUNK ((size_t)1 << 20)

static const char *dtype_names[] = {"F32", "I64", "U8"};

size_t qr_dtype_size(qr_dtype t) {
    return t == QR_DT_I64 ? 8 : t == QR_DT_U8 ? 1 : 4;
}

const char *qr_dtype_st_name(qr_dtype t) {
    return dtype_names[t];
}

uint64_t qr_st_bytes(const qr_st_tensor *t) {
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n * qr_dtype_size(t->dtype);
}

/* ---- writing ---------------------------------------------------------------- */

static char *build_header(const qr_st_tensor *t, int n, const cJSON *metadata, size_t *len) {
    cJSON *h = cJSON_CreateObject();
    uint64_t at = 0;
    if (metadata) cJSON_AddItemToObject(h, "__metadata__", cJSON_Duplicate(metadata, 1));
    for (int i = 0; h && i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(h, t[i].name);
        if (!e) break;
        cJSON_AddStringToObject(e, "dtype", dtype_names[t[i].dtype]);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t[i].ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
        uint64_t bytes = qr_st_bytes(&t[i]);
        cJSON *off = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(at + bytes)));
        at += bytes;
    }
    char *text = h ? cJSON_PrintUnformatted(h) : NULL;
    cJSON_Delete(h);
    if (!text) return NULL;
    size_t raw = strlen(text), padded = (raw + 7) & ~(size_t)7;
    char *out = realloc(text, padded + 1);
    if (!out) {
        free(text);
        return NULL;
    }
    memset(out + raw, ' ', padded - raw);
    out[padded] = '\0';
    *len = padded;
    return out;
}

int qr_st_write_file(const char *path, const qr_st_tensor *t, int n, const cJSON *metadata,
                     uint32_t *crc, uint64_t *bytes) {
    return qr_st_write_file_progress(path, t, n, metadata, NULL, NULL, crc, bytes);
}

static int read_at(int fd, void *buf, size_t len, uint64_t off, const char *path);

static int check_names(const char *path, const qr_st_tensor *t, int n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(t[i].name, t[j].name))
                return qr__fail(QR_EINVAL, "checkpoint '%s': tensor name '%s' used twice", path,
                                t[i].name);
    return QR_OK;
}

int qr_st_head(const char *what, const qr_st_tensor *t, int n, const cJSON *metadata,
               uint8_t **out, size_t *len) {
    int rc = check_names(what, t, n);
    if (rc) return rc;
    size_t hlen = 0;
    char *header = build_header(t, n, metadata, &hlen);
    uint8_t *b = header ? malloc(8 + hlen) : NULL;
    if (!b) {
        free(header);
        return qr__fail(QR_ENOMEM, "out of memory making the header of '%s'", what);
    }
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(b + 8, header, hlen);
    free(header);
    *out = b;
    *len = 8 + hlen;
    return QR_OK;
}

int qr_st_write_file_progress(const char *path, const qr_st_tensor *t, int n,
                              const cJSON *metadata, void (*written)(void *ctx, int i), void *ctx,
                              uint32_t *crc, uint64_t *bytes) {
    int rc = check_names(path, t, n);
    if (rc) return rc;
    size_t hlen = 0;
    char *header = build_header(t, n, metadata, &hlen);
    if (!header) return qr__fail(QR_ENOMEM, "out of memory writing the header of '%s'", path);
    qr_durable d;
    rc = qr_durable_open(&d, path);
    if (rc) {
        free(header);
        return rc;
    }
    uint8_t len_le[8];
    for (int b = 0; b < 8; b++) len_le[b] = (uint8_t)((uint64_t)hlen >> (8 * b));
    rc = qr_durable_write(&d, len_le, sizeof len_le);
    if (!rc) rc = qr_durable_write(&d, header, hlen);
    free(header);
    uint8_t *chunk = NULL; /* a spooled tensor's bytes pass through it */
    for (int i = 0; i < n && !rc; i++) {
        const uint8_t *p = t[i].data;
        uint64_t left = qr_st_bytes(&t[i]), at = t[i].src_off;
        if (t[i].from_fd && !chunk && left && !(chunk = malloc(ST_WRITE_CHUNK)))
            rc = qr__fail(QR_ENOMEM, "out of memory writing '%s'", path);
        while (left && !rc) {
            size_t piece = (size_t)QR_MIN(left, (uint64_t)ST_WRITE_CHUNK);
            if (t[i].from_fd) {
                rc = read_at(t[i].src_fd, chunk, piece, at, "a checkpoint's spool");
                at += piece;
                p = chunk;
            }
            if (!rc) rc = qr_durable_write(&d, p, piece);
            p += piece;
            left -= piece;
        }
        if (!rc && written) written(ctx, i);
    }
    free(chunk);
    uint32_t sum = d.crc;
    uint64_t total = d.bytes;
    if (rc) {
        qr_durable_abandon(&d);
        return rc;
    }
    rc = qr_durable_commit(&d);
    if (!rc && crc) *crc = sum;
    if (!rc && bytes) *bytes = total;
    return rc;
}

/* ---- reading ---------------------------------------------------------------- */

static int read_at(int fd, void *buf, size_t len, uint64_t off, const char *path) {
    if (fd < 0) return qr__fail(QR_EINVAL, "'%s' is not open", path);
    uint8_t *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return qr__fail(QR_EIO, "reading '%s': %s", path, strerror(errno));
        if (n == 0) return qr__fail(QR_EIO, "'%s' is truncated (ends at byte %llu)", path,
                                    (unsigned long long)off);
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return QR_OK;
}

/* A whole JSON number that is an integer in [0, 2^53]. */
static bool json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble > 9007199254740992.0 ||
        j->valuedouble != (double)(uint64_t)j->valuedouble)
        return false;
    *out = (uint64_t)j->valuedouble;
    return true;
}

static int parse_entry(qr_st_file *f, const cJSON *e, qr_st_tensor *t) {
    const char *name = e->string;
    t->name = name;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(off) ||
        cJSON_GetArraySize(off) != 2)
        return qr__fail(QR_EIO, "'%s': the header entry of '%s' lacks dtype, shape or "
                        "data_offsets", f->path, name);
    if (!strcmp(dt->valuestring, "F32")) t->dtype = QR_DT_F32;
    else if (!strcmp(dt->valuestring, "I64")) t->dtype = QR_DT_I64;
    else if (!strcmp(dt->valuestring, "U8")) t->dtype = QR_DT_U8;
    else return qr__fail(QR_EIO, "'%s': tensor '%s' has dtype %s; quorum reads F32, I64 and U8",
                         f->path, name, dt->valuestring);
    t->ndim = cJSON_GetArraySize(shape);
    if (t->ndim > QR_PROTO_MAX_NDIM)
        return qr__fail(QR_EIO, "'%s': tensor '%s' has %d dimensions (at most %d)", f->path, name,
                        t->ndim, QR_PROTO_MAX_NDIM);
    uint64_t elems = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t v;
        if (!json_u64(cJSON_GetArrayItem(shape, d), &v) || v > (1ull << 40) ||
            (v && elems > (1ull << 40) / v))
            return qr__fail(QR_EIO, "'%s': tensor '%s' has a bad shape", f->path, name);
        t->shape[d] = (int64_t)v;
        elems *= v;
    }
    if (!json_u64(cJSON_GetArrayItem(off, 0), &t->begin) ||
        !json_u64(cJSON_GetArrayItem(off, 1), &t->end) || t->end < t->begin ||
        t->end > f->file_bytes - f->data_start)
        return qr__fail(QR_EIO, "'%s': tensor '%s' lies outside the file (is it truncated?)",
                        f->path, name);
    if (t->end - t->begin != elems * qr_dtype_size(t->dtype))
        return qr__fail(QR_EIO, "'%s': tensor '%s' has %llu bytes for its shape's %llu", f->path,
                        name, (unsigned long long)(t->end - t->begin),
                        (unsigned long long)(elems * qr_dtype_size(t->dtype)));
    return QR_OK;
}

static int cmp_begin(const void *a, const void *b) {
    const qr_st_tensor *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

/* The tensors must tile the data section exactly, as the format says. */
static int check_tiling(qr_st_file *f) {
    qr_st_tensor *sorted = qr__calloc((size_t)QR_MAX(f->n, 1), sizeof *sorted);
    if (!sorted) return QR_ENOMEM;
    memcpy(sorted, f->t, (size_t)f->n * sizeof *sorted);
    qsort(sorted, (size_t)f->n, sizeof *sorted, cmp_begin);
    uint64_t at = 0;
    int rc = QR_OK;
    for (int i = 0; i < f->n && !rc; i++) {
        if (sorted[i].begin != at)
            rc = qr__fail(QR_EIO, "'%s': tensor '%s' starts at byte %llu, expected %llu "
                          "(tensors overlap or leave a gap)", f->path, sorted[i].name,
                          (unsigned long long)sorted[i].begin, (unsigned long long)at);
        at = sorted[i].end;
    }
    if (!rc && at != f->file_bytes - f->data_start)
        rc = qr__fail(QR_EIO, "'%s' has %llu bytes after its last tensor", f->path,
                      (unsigned long long)(f->file_bytes - f->data_start - at));
    free(sorted);
    return rc;
}

static int parse_header(qr_st_file *f, const char *text, size_t len) {
    f->header = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(f->header))
        return qr__fail(QR_EIO, "'%s': the safetensors header is not a JSON object", f->path);
    int count = cJSON_GetArraySize(f->header);
    f->t = qr__calloc((size_t)QR_MAX(count, 1), sizeof *f->t);
    if (!f->t) return QR_ENOMEM;
    const cJSON *e;
    cJSON_ArrayForEach(e, f->header) {
        if (!strcmp(e->string, "__metadata__")) {
            f->metadata = (cJSON *)e;
            continue;
        }
        for (int i = 0; i < f->n; i++)
            if (!strcmp(f->t[i].name, e->string))
                return qr__fail(QR_EIO, "'%s': tensor '%s' appears twice", f->path, e->string);
        int rc = parse_entry(f, e, &f->t[f->n]);
        if (rc) return rc;
        f->n++;
    }
    return check_tiling(f);
}

int qr_st_head_length(const void *first8, uint64_t len, uint64_t *head_len) {
    const uint8_t *b = first8;
    uint64_t hlen = 0;
    for (int i = 0; i < 8 && len >= 8; i++) hlen |= (uint64_t)b[i] << (8 * i);
    if (len < 8 || hlen > ST_MAX_HEADER || hlen > len - 8)
        return qr__fail(QR_EIO, "%llu bytes are not a safetensors file (header length %llu)",
                        (unsigned long long)len, (unsigned long long)hlen);
    *head_len = 8 + hlen;
    return QR_OK;
}

int qr_st_open_head(qr_st_file *f, const void *head, uint64_t head_len, uint64_t len,
                    const char *name) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = qr__strdup(name);
    if (!f->path) return QR_ENOMEM;
    f->file_bytes = len;
    uint64_t want = 0;
    int rc = head_len >= 8 ? qr_st_head_length(head, len, &want) : QR_OK;
    if (!rc && (head_len < 8 || want != head_len))
        rc = qr__fail(QR_EIO, "a head of %llu bytes, but its length word says %llu",
                      (unsigned long long)head_len, (unsigned long long)want);
    f->data_start = head_len;
    if (!rc) rc = parse_header(f, (const char *)head + 8, head_len - 8);
    else qr__error_prefix("'%s': ", name);
    if (rc) qr_st_close(f);
    else f->placing = true;
    return rc;
}

int qr_st_place_rest(qr_st_file *f) {
    uint64_t rest = 0;
    for (int i = 0; i < f->n; i++)
        if (!f->t[i].data) rest += f->t[i].end - f->t[i].begin;
    f->placing = false;
    f->rest = malloc(QR_MAX(rest, 1));
    if (!f->rest)
        return qr__fail(QR_ENOMEM, "out of memory for %llu bytes of '%s'",
                        (unsigned long long)rest, f->path);
    uint64_t at = 0;
    for (int i = 0; i < f->n; i++) {
        if (f->t[i].data) continue;
        f->t[i].data = f->rest + at;
        at += f->t[i].end - f->t[i].begin;
    }
    return QR_OK;
}

int qr_st_open(qr_st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = qr__strdup(path);
    if (!f->path) return QR_ENOMEM;
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        int rc = qr__fail(errno == ENOENT ? QR_ENOTFOUND : QR_EIO, "cannot open '%s': %s", path,
                          strerror(errno));
        qr_st_close(f);
        return rc;
    }
    struct stat st;
    uint8_t len_le[8];
    int rc = fstat(f->fd, &st) ? qr__fail(QR_EIO, "stat '%s': %s", path, strerror(errno)) : QR_OK;
    f->file_bytes = (uint64_t)st.st_size;
    if (!rc && f->file_bytes < 8)
        rc = qr__fail(QR_EIO, "'%s' is too short for a safetensors file (%llu bytes)", path,
                      (unsigned long long)f->file_bytes);
    if (!rc) rc = read_at(f->fd, len_le, 8, 0, path);
    uint64_t hlen = 0;
    for (int b = 0; b < 8; b++) hlen |= (uint64_t)len_le[b] << (8 * b);
    if (!rc && (hlen > ST_MAX_HEADER || hlen > f->file_bytes - 8))
        rc = qr__fail(QR_EIO, "'%s': header length %llu does not fit the file (%llu bytes)",
                      path, (unsigned long long)hlen, (unsigned long long)f->file_bytes);
    char *text = rc ? NULL : malloc(hlen + 1);
    if (!rc && !text) rc = qr__fail(QR_ENOMEM, "out of memory reading '%s'", path);
    if (!rc) rc = read_at(f->fd, text, hlen, 8, path);
    f->data_start = 8 + hlen;
    if (!rc) rc = parse_header(f, text, hlen);
    free(text);
    if (rc) qr_st_close(f);
    return rc;
}

const qr_st_tensor *qr_st_find(const qr_st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

int qr_st_read(const qr_st_file *f, const qr_st_tensor *t, void *dst) {
    size_t len = (size_t)(t->end - t->begin);
    if (f->placing) { /* qr_st_open_head: dst is where t's bytes are to land */
        if (t < f->t || t >= f->t + f->n)
            return qr__fail(QR_EINTERNAL, "'%s': tensor '%s' is not one of its own", f->path,
                            t->name);
        qr_st_tensor *own = &f->t[t - f->t]; /* f's array, not f itself */
        if (own->data)
            return qr__fail(QR_EIO, "'%s': tensor '%s' is named by two records", f->path,
                            t->name);
        own->data = dst;
        return QR_OK;
    }
    if (t->data) { /* its bytes landed there: nothing to do if that is dst */
        if (t->data != dst) memcpy(dst, t->data, len);
        return QR_OK;
    }
    if (f->fd < 0)
        return qr__fail(QR_EINTERNAL, "'%s': tensor '%s' was given no place", f->path, t->name);
    return read_at(f->fd, dst, len, f->data_start + t->begin, f->path);
}

int qr_st_read_range(const qr_st_file *f, const qr_st_tensor *t, uint64_t off, size_t len,
                     void *dst) {
    if (off > t->end - t->begin || len > t->end - t->begin - off)
        return qr__fail(QR_EINTERNAL, "'%s': bytes %llu to %llu of tensor '%s' (%llu bytes)",
                        f->path, (unsigned long long)off, (unsigned long long)(off + len),
                        t->name, (unsigned long long)(t->end - t->begin));
    if (t->data) {
        memcpy(dst, (const uint8_t *)t->data + off, len);
        return QR_OK;
    }
    if (f->placing || f->fd < 0)
        return qr__fail(QR_EINTERNAL, "'%s': tensor '%s' was given no place", f->path, t->name);
    return read_at(f->fd, dst, len, f->data_start + t->begin + off, f->path);
}

const char *qr_st_meta(const qr_st_file *f, const char *key) {
    const cJSON *v = f->metadata ? cJSON_GetObjectItemCaseSensitive(f->metadata, key) : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

void qr_st_close(qr_st_file *f) {
    if (f->fd >= 0) close(f->fd);
    cJSON_Delete(f->header);
    free(f->t);
    free(f->rest);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

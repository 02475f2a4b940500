/*
 * summary.c - TensorBoard event files and JSON lines of a run's scalars.
 *
 * An event file is a sequence of TFRecords:
 *     u64 length (LE), u32 masked CRC-32C of those 8 bytes,
 *     the data, u32 masked CRC-32C of the data,
 * with mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. Each record's data
 * is an Event protocol buffer; quorum writes only the fields a scalar needs:
 *     Event   { double wall_time = 1; int64 step = 2;
 *               string file_version = 3;   (first record: "brain.Event:2")
 *               Summary summary = 5; }
 *     Summary { repeated Value value = 1; }
 *     Value   { string tag = 1; float simple_value = 2; }
 * Why by hand: these are five fields, and protobuf-c (Debian's) would need
 * TensorFlow's .proto files and generated code in the tree for them.
 * CRC-32C is not zlib's CRC-32 (another polynomial), hence the small table
 * below; tests check it against the standard vectors.
 */
#include "summary/summary.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

struct qr_summary {
    FILE *events, *jsonl;
    char *events_path;
};

/* ---- CRC-32C ------------------------------------------------------------------ */

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t qr_crc32c(const void *data, size_t len) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
    const uint8_t *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < len; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

uint32_t qr_crc32c_masked(const void *data, size_t len) {
    uint32_t c = qr_crc32c(data, len);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- protocol buffers, the few pieces needed ----------------------------------- */

typedef struct pb {
    uint8_t *p;
    size_t len, cap;
    bool full;
} pb;

static void pb_bytes(pb *b, const void *data, size_t n) {
    if (b->len + n > b->cap) {
        b->full = true;
        return;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void pb_varint(pb *b, uint64_t v) {
    uint8_t buf[10];
    int n = 0;
    do {
        buf[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_bytes(b, buf, (size_t)n);
}

static void pb_le(pb *b, uint64_t v, int n) {
    uint8_t buf[8];
    for (int i = 0; i < n; i++) buf[i] = (uint8_t)(v >> (8 * i));
    pb_bytes(b, buf, (size_t)n);
}

/* Field `field` of wire type 2 (length-delimited). */
static void pb_len(pb *b, int field, const void *data, size_t n) {
    pb_varint(b, (uint64_t)field << 3 | 2);
    pb_varint(b, n);
    pb_bytes(b, data, n);
}

static size_t event_bytes(uint8_t *buf, size_t cap, double wall_time, int64_t step,
                          const char *file_version, int n, const char *const *tags,
                          const double *values) {
    uint8_t summary[8192], value[600];
    pb s = {summary, 0, sizeof summary, false};
    for (int i = 0; i < n; i++) {
        pb v = {value, 0, sizeof value, false};
        pb_len(&v, 1, tags[i], strlen(tags[i]));
        float f = (float)values[i];
        uint32_t bits;
        memcpy(&bits, &f, 4);
        pb_varint(&v, 2 << 3 | 5); /* simple_value: fixed32 */
        pb_le(&v, bits, 4);
        if (v.full) return 0;
        pb_len(&s, 1, value, v.len);
    }
    pb e = {buf, 0, cap, false};
    uint64_t wt;
    memcpy(&wt, &wall_time, 8);
    pb_varint(&e, 1 << 3 | 1); /* wall_time: fixed64 */
    pb_le(&e, wt, 8);
    pb_varint(&e, 2 << 3 | 0); /* step: varint (two's complement, as int64) */
    pb_varint(&e, (uint64_t)step);
    if (file_version) pb_len(&e, 3, file_version, strlen(file_version));
    if (n) pb_len(&e, 5, summary, s.len);
    return e.full || s.full ? 0 : e.len;
}

/* The event's bytes framed as a TFRecord into out. */
static size_t tfrecord(uint8_t *out, size_t cap, const uint8_t *data, size_t n) {
    if (n + 16 > cap) return 0;
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    uint32_t lc = qr_crc32c_masked(len, 8), dc = qr_crc32c_masked(data, n);
    memcpy(out, len, 8);
    for (int i = 0; i < 4; i++) out[8 + i] = (uint8_t)(lc >> (8 * i));
    memmove(out + 12, data, n);
    for (int i = 0; i < 4; i++) out[12 + n + i] = (uint8_t)(dc >> (8 * i));
    return n + 16;
}

size_t qr_summary_event_record(uint8_t *buf, size_t cap, double wall_time, int64_t step, int n,
                               const char *const *tags, const double *values) {
    uint8_t event[16384];
    size_t len = event_bytes(event, sizeof event, wall_time, step, NULL, n, tags, values);
    return len ? tfrecord(buf, cap, event, len) : 0;
}

/* ---- the writer ------------------------------------------------------------------ */

static double wall_now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static int write_record(qr_summary *s, const uint8_t *rec, size_t len) {
    if (!len) return qr__fail(QR_EINVAL, "a summary point too large for one event");
    if (fwrite(rec, 1, len, s->events) != len || fflush(s->events))
        return qr__fail(QR_EIO, "writing '%s': %s", s->events_path, strerror(errno));
    return QR_OK;
}

int qr_summary_open(qr_summary **out, const char *logdir) {
    *out = NULL;
    if (!logdir || !logdir[0]) return qr__fail(QR_EINVAL, "--logdir is empty");
    if (mkdir(logdir, 0755) && errno != EEXIST)
        return qr__fail(QR_EIO, "--logdir %s: cannot create it: %s", logdir, strerror(errno));
    qr_summary *s = qr__calloc(1, sizeof *s);
    if (!s) return QR_ENOMEM;
    char host[128] = "localhost", path[4400];
    gethostname(host, sizeof host - 1);
    snprintf(path, sizeof path, "%s/events.out.tfevents.%lld.%s", logdir, (long long)wall_now(),
             host);
    s->events_path = qr__strdup(path);
    s->events = fopen(path, "ab");
    snprintf(path, sizeof path, "%s/summaries.jsonl", logdir);
    s->jsonl = fopen(path, "a");
    if (!s->events || !s->jsonl || !s->events_path) {
        int rc = qr__fail(QR_EIO, "--logdir %s: cannot write there: %s", logdir, strerror(errno));
        qr_summary_close(s);
        return rc;
    }
    uint8_t event[128], rec[160];
    size_t n = event_bytes(event, sizeof event, wall_now(), 0, "brain.Event:2", 0, NULL, NULL);
    int rc = write_record(s, rec, tfrecord(rec, sizeof rec, event, n));
    if (rc) {
        qr_summary_close(s);
        return rc;
    }
    *out = s;
    return QR_OK;
}

int qr_summary_write(qr_summary *s, int64_t step, int n, const char *const *tags,
                     const double *values) {
    double now = wall_now();
    uint8_t rec[16500];
    int rc = write_record(s, rec, qr_summary_event_record(rec, sizeof rec, now, step, n, tags,
                                                          values));
    if (rc) return rc;
    fprintf(s->jsonl, "{\"wall_time\":%.3f,\"step\":%lld", now, (long long)step);
    for (int i = 0; i < n; i++) fprintf(s->jsonl, ",\"%s\":%.9g", tags[i], values[i]);
    fprintf(s->jsonl, "}\n");
    if (fflush(s->jsonl)) return qr__fail(QR_EIO, "writing summaries.jsonl: %s", strerror(errno));
    return QR_OK;
}

void qr_summary_close(qr_summary *s) {
    if (!s) return;
    if (s->events) fclose(s->events);
    if (s->jsonl) fclose(s->jsonl);
    free(s->events_path);
    free(s);
}

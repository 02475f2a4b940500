/*
 * common.h - helpers every layer of libquorum uses: error recording,
 * logging, time, checked allocation and the seeded random generator.
 *
 * Naming: public API is qr_*, internal functions shared between files are
 * qr__* or a module prefix (qr_proto_*, qr_conn_*), file-local ones static.
 */
#ifndef QR_COMMON_H
#define QR_COMMON_H

#include "quorum.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QR_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define QR_MIN(a, b) ((a) < (b) ? (a) : (b))
#define QR_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Record a failure for the calling thread and return `status`, so that a
 * failing path reads: return qr__fail(QR_EINVAL, "bad shape %d", d); */
int qr__fail(int status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefix the calling thread's last error message with context ("ps 1: "). */
void qr__error_prefix(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* Logging (log.c): to stderr with the time, the task and the pid, or to
 * the qr_set_log_callback of quorum.h. Levels QR_LOG_* (quorum.h). The
 * library logs events an operator must see (a lost peer, a stall, a
 * checkpoint); it never exits. */
void qr__log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
bool qr__log_enabled(int level);
/* A line anyone can make the library log (a refused connection, say)
 * is limited to per_sec lines a second: qr__log_allow says whether this
 * one may be written, and sets *dropped to the lines left out since the
 * last one that was. */
typedef struct qr_log_limit {
    uint64_t second_ns; /* start of the second being counted */
    int lines;          /* written in it */
    uint64_t dropped;
} qr_log_limit;
bool qr__log_allow(qr_log_limit *l, int per_sec, uint64_t *dropped);
/* Tag printed in front of every log line of this process ("ps 0"). */
void qr__log_set_tag(const char *tag);

/* A one-line notice to the process supervising this task (quorum launch),
 * on the datagram socket named by QUORUM_SUPERVISOR_FD when there is one:
 * "hung ps 1 5012" tells launch to kill and restart ps 1 (tools/launch.c).
 * Never blocks, never raises SIGPIPE; nothing happens without a supervisor. */
void qr__tell_supervisor(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Monotonic clock. */
uint64_t qr__now_ns(void);
/* Milliseconds from `then` to `now` (both qr__now_ns), 0 when `then` is
 * later: a watch's `now`, read once per turn of the loop, may be older
 * than a mark set since within the same turn, and the unsigned
 * difference would read as centuries of silence. */
static inline uint64_t qr__ms_since(uint64_t now, uint64_t then) {
    return now > then ? (now - then) / 1000000 : 0;
}
double qr__now_sec(void);

/* Allocation that reports QR_ENOMEM through qr__fail; NULL on failure. */
void *qr__calloc(size_t n, size_t size);
void *qr__aligned_alloc(size_t size); /* 64-byte aligned, zeroed */
/* 64-byte aligned, not zeroed: for buffers about to be overwritten whole
 * (zeroing a large buffer costs as much as the copy that follows). */
void *qr__aligned_alloc_uninit(size_t size);
char *qr__strdup(const char *s);

/* Parsing helpers used by config, flags and the cluster spec: strict
 * (the whole string must be a number in range). */
int qr__parse_int64(const char *s, int64_t lo, int64_t hi, int64_t *out);
int qr__parse_float(const char *s, double *out);

/*
 * Seeded random numbers: splitmix64 to seed, xoshiro256** to draw.
 * Small, fast, and the same sequence on every machine, which is what makes
 * runs reproducible from a seed.
 */
typedef struct qr_rng {
    uint64_t s[4];
} qr_rng;

void qr_rng_seed(qr_rng *rng, uint64_t seed);
uint64_t qr_rng_next(qr_rng *rng);
double qr_rng_uniform(qr_rng *rng);          /* [0, 1) */
double qr_rng_normal(qr_rng *rng);           /* mean 0, std 1 */
uint64_t qr_rng_below(qr_rng *rng, uint64_t n); /* [0, n) */

/* True if `item` is one of the entries of `list` separated by `sep`
 * ("sgd|adam" with '|', "1,2,4" with ','). */
bool qr__list_has(const char *list, char sep, const char *item);

/* 64-bit FNV-1a, used for name hashing and the params digest. */
uint64_t qr__fnv1a(const void *data, size_t len, uint64_t h);
#define QR_FNV_INIT 0xcbf29ce484222325ull

#endif /* QR_COMMON_H */

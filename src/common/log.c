/*
 * log.c - the library's log lines, for a person following a run:
 *
 *   2026-11-24T00:27:01.123Z [ps 0 pid 4242] warn: worker 1 sent no heartbeat ...
 *
 * every line with the time (UTC, milliseconds), the task (qr__log_set_tag)
 * and the pid, so that the lines of a cluster's processes, merged by a
 * launcher or a log collector, still say who said what and when. Level
 * from QUORUM_LOG (error|warn|info|debug, default info) or
 * qr_set_log_level. A program that embeds the library (a Python process)
 * takes the lines itself with qr_set_log_callback: level, task and message,
 * without the prefix.
 */
#include "common.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int log_level = -1;
static char log_tag[64] = "quorum";
/* The callback is set from any thread and read by every one that logs. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static qr_log_fn log_fn;
static void *log_ctx;

static int log_level_from_env(void) {
    const char *s = getenv("QUORUM_LOG");
    if (!s) return QR_LOG_INFO;
    if (!strcasecmp(s, "error")) return QR_LOG_ERROR;
    if (!strcasecmp(s, "warn")) return QR_LOG_WARN;
    if (!strcasecmp(s, "debug")) return QR_LOG_DEBUG;
    return QR_LOG_INFO;
}

bool qr__log_enabled(int level) {
    int l = __atomic_load_n(&log_level, __ATOMIC_RELAXED);
    if (l < 0) {
        l = log_level_from_env();
        __atomic_store_n(&log_level, l, __ATOMIC_RELAXED);
    }
    return level <= l;
}

void qr__log_set_tag(const char *tag) {
    pthread_mutex_lock(&log_mu);
    snprintf(log_tag, sizeof log_tag, "%s", tag);
    pthread_mutex_unlock(&log_mu);
}

int qr_set_log_level(int level) {
    if (level < QR_LOG_ERROR || level > QR_LOG_DEBUG)
        return qr__fail(QR_EINVAL, "qr_set_log_level: level %d is not one of QR_LOG_ERROR (0) "
                        "to QR_LOG_DEBUG (3)", level);
    __atomic_store_n(&log_level, level, __ATOMIC_RELAXED);
    return QR_OK;
}

int qr_set_log_callback(qr_log_fn fn, void *ctx) {
    pthread_mutex_lock(&log_mu);
    log_fn = fn;
    log_ctx = ctx;
    pthread_mutex_unlock(&log_mu);
    return QR_OK;
}

bool qr__log_allow(qr_log_limit *l, int per_sec, uint64_t *dropped) {
    uint64_t now = qr__now_ns();
    if (!l->second_ns || now - l->second_ns >= 1000000000ull) {
        l->second_ns = now;
        l->lines = 0;
    }
    if (l->lines >= per_sec) {
        l->dropped++;
        return false;
    }
    l->lines++;
    *dropped = l->dropped;
    l->dropped = 0;
    return true;
}

void qr__log(int level, const char *fmt, ...) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (!qr__log_enabled(level)) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_mu);
    qr_log_fn fn = log_fn;
    void *ctx = log_ctx;
    char tag[64];
    memcpy(tag, log_tag, sizeof tag);
    pthread_mutex_unlock(&log_mu);
    if (fn) { /* outside the lock: the callback may log, or set another */
        fn(level, tag, line, ctx);
        return;
    }
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char when[32];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    /* One fprintf per line so lines of concurrent processes do not mix. */
    fprintf(stderr, "%s.%03dZ [%s pid %d] %s: %s\n", when, (int)(tv.tv_usec / 1000), tag,
            (int)getpid(), names[level], line);
}

/* ---- notices to a supervisor ----------------------------------------------- */

void qr__tell_supervisor(const char *fmt, ...) {
    const char *env = getenv("QUORUM_SUPERVISOR_FD");
    int64_t fd;
    if (!env || qr__parse_int64(env, 0, 65535, &fd)) return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    /* A datagram: one notice, whole or not at all (launch reads them). */
    size_t len = (size_t)QR_MIN(n, (int)sizeof line - 1);
    if (send((int)fd, line, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        qr__log(QR_LOG_DEBUG, "notice to the supervisor not sent: %s", strerror(errno));
}

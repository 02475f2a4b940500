/*
 * error.c - status codes, their names and messages, and the per-thread
 * detailed message behind qr_last_error().
 *
 * A status code says what kind of failure happened; the message says which
 * thing failed and why ("variable 'w1': shape [784,256] vs [784,128]").
 * Messages live in thread-local storage so a binding can fetch them right
 * after the failing call without any handle.
 */
#include "common.h"

#include <stdio.h>
#include <string.h>

#define QR_ERRMSG_MAX 1024

static _Thread_local char last_error[QR_ERRMSG_MAX];

const char *qr_strerror(int status) {
    switch (status) {
#define QR__CASE(name, code, msg) \
    case code:                    \
        return msg;
        QR_STATUS_MAP(QR__CASE)
#undef QR__CASE
    }
    return "unknown status";
}

const char *qr_status_name(int status) {
    switch (status) {
#define QR__CASE(name, code, msg) \
    case code:                    \
        return "QR_" #name;
        QR_STATUS_MAP(QR__CASE)
#undef QR__CASE
    }
    return "QR_UNKNOWN";
}

const char *qr_last_error(void) {
    return last_error[0] ? last_error : "no error";
}

const char *qr_version(void) {
    return "0.1.0";
}

int qr__fail(int status, const char *fmt, ...) {
    /* Format into a scratch buffer first: callers often pass the previous
     * message as an argument ("%s", qr_last_error()) to add context. */
    char msg[QR_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    return status;
}

void qr__error_prefix(const char *fmt, ...) {
    char prefix[256];
    char old[QR_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* Two layers that name the same task ("worker 0: worker 0: ..."): once. */
    if (!strncmp(last_error, prefix, strlen(prefix))) return;
    memcpy(old, last_error, sizeof old);
    snprintf(last_error, sizeof last_error, "%s%s", prefix, old);
}

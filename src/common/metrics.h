/*
 * metrics.h - Prometheus metrics: a writer of the text exposition format
 * and the HTTP endpoint that serves it (libmicrohttpd), shared by the ps
 * (src/ps/metrics.c) and the training worker (src/train/train.c).
 */
#ifndef QR_COMMON_METRICS_H
#define QR_COMMON_METRICS_H

#include "common/common.h"

#include <stdio.h>

/* ---- the text format ------------------------------------------------------- */

/* "# HELP name help" and "# TYPE name type" (counter, gauge, histogram). */
void qr_prom_family(FILE *f, const char *name, const char *type, const char *help);
/* One sample: name{labels} value. labels: "" or "worker=\"2\"" (already
 * escaped; use qr_prom_label for values from outside). */
void qr_prom_sample(FILE *f, const char *name, const char *labels, double value);
/* A label value escaped as the format wants (\\, \", \n) into buf. */
void qr_prom_label(char *buf, size_t len, const char *value);

/* Latency histogram over fixed buckets, seconds. */
#define QR_PROM_BUCKETS 12
typedef struct qr_prom_hist {
    uint64_t count[QR_PROM_BUCKETS + 1]; /* per bucket; the last is +Inf */
    uint64_t total;
    double sum;
} qr_prom_hist;
extern const double qr_prom_bucket_le[QR_PROM_BUCKETS];
void qr_prom_observe(qr_prom_hist *h, double seconds);
/* name_bucket{labels,le="..."} (cumulative), name_sum, name_count. */
void qr_prom_histogram(FILE *f, const char *name, const char *labels, const qr_prom_hist *h);

/* ---- the endpoint ------------------------------------------------------------- */

/* Writes the page into f; runs on the server's thread. */
typedef void (*qr_metrics_render)(FILE *f, void *ctx);

typedef struct qr_metrics_server qr_metrics_server;

/* Serve GET /metrics on bind_addr:port (an IPv4 address, 127.0.0.1 unless
 * told otherwise: the page is read-only but says much about the run).
 * Anything else gets 404 or 405. QR_EIO naming the port if it cannot bind. */
int qr_metrics_start(qr_metrics_server **out, const char *bind_addr, int port,
                     qr_metrics_render render, void *ctx);
void qr_metrics_stop(qr_metrics_server *s);

/* This process's resident memory in bytes (/proc/self/statm), 0 if unknown. */
uint64_t qr_process_rss_bytes(void);

#endif /* QR_COMMON_METRICS_H */

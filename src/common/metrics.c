/*
 * metrics.c - the Prometheus text exposition format (version 0.0.4) and a
 * read-only HTTP endpoint for it on libmicrohttpd's own thread.
 *
 * The server thread never touches a task's state: it calls the task's
 * render function, which decides how to read it safely (the ps hands the
 * rendering to its loop thread, src/ps/metrics.c; the trainer keeps its
 * figures under a mutex).
 */
#include "common/metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the text format ---------------------------------------------------------- */

const double qr_prom_bucket_le[QR_PROM_BUCKETS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                   0.01,   0.025,   0.05,   0.1,   1,      10};

void qr_prom_family(FILE *f, const char *name, const char *type, const char *help) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void qr_prom_sample(FILE *f, const char *name, const char *labels, double value) {
    if (labels && labels[0]) fprintf(f, "%s{%s} %.17g\n", name, labels, value);
    else fprintf(f, "%s %.17g\n", name, value);
}

void qr_prom_label(char *buf, size_t len, const char *value) {
    size_t o = 0;
    for (const char *p = value; *p && o + 3 < len; p++) {
        if (*p == '\\' || *p == '"') buf[o++] = '\\', buf[o++] = *p;
        else if (*p == '\n') buf[o++] = '\\', buf[o++] = 'n';
        else buf[o++] = *p;
    }
    buf[o] = '\0';
}

void qr_prom_observe(qr_prom_hist *h, double seconds) {
    int b = 0;
    while (b < QR_PROM_BUCKETS && seconds > qr_prom_bucket_le[b]) b++;
    h->count[b]++;
    h->total++;
    h->sum += seconds;
}

void qr_prom_histogram(FILE *f, const char *name, const char *labels, const qr_prom_hist *h) {
    uint64_t cum = 0;
    const char *sep = labels && labels[0] ? "," : "";
    for (int b = 0; b <= QR_PROM_BUCKETS; b++) {
        cum += h->count[b];
        char le[32];
        if (b < QR_PROM_BUCKETS) snprintf(le, sizeof le, "%g", qr_prom_bucket_le[b]);
        else snprintf(le, sizeof le, "+Inf");
        fprintf(f, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, labels ? labels : "", sep, le,
                (unsigned long long)cum);
    }
    char series[160];
    snprintf(series, sizeof series, "%s_sum", name);
    qr_prom_sample(f, series, labels, h->sum);
    snprintf(series, sizeof series, "%s_count", name);
    qr_prom_sample(f, series, labels, (double)h->total);
}

/* ---- the endpoint ------------------------------------------------------------- */

struct qr_metrics_server {
    struct MHD_Daemon *daemon;
    qr_metrics_render render;
    void *ctx;
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type,
                             char *body, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **state) {
    (void)version, (void)upload_data;
    qr_metrics_server *s = cls;
    if (!*state) { /* the headers: answer when the (ignored) body is in */
        *state = s;
        return MHD_YES;
    }
    if (*upload_size) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain",
                     strdup("read-only: GET /metrics\n"), 24);
    if (strcmp(url, "/metrics"))
        return reply(c, MHD_HTTP_NOT_FOUND, "text/plain", strdup("not found: try /metrics\n"), 24);
    char *body = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    if (!f) return MHD_NO;
    s->render(f, s->ctx);
    fclose(f);
    return reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len);
}

int qr_metrics_start(qr_metrics_server **out, const char *bind_addr, int port,
                     qr_metrics_render render, void *ctx) {
    *out = NULL;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (port < 1 || port > 65535 || inet_pton(AF_INET, bind_addr, &sa.sin_addr) != 1)
        return qr__fail(QR_EINVAL, "metrics: '%s' port %d is not an IPv4 address and a port "
                        "1-65535", bind_addr, port);
    qr_metrics_server *s = qr__calloc(1, sizeof *s);
    if (!s) return QR_ENOMEM;
    s->render = render;
    s->ctx = ctx;
    s->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, (uint16_t)port, NULL, NULL,
                                 on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                                 MHD_OPTION_CONNECTION_LIMIT, 16u,
                                 MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (!s->daemon) {
        free(s);
        return qr__fail(QR_EIO, "metrics: cannot serve on %s:%d (is the port in use?)", bind_addr,
                        port);
    }
    *out = s;
    return QR_OK;
}

void qr_metrics_stop(qr_metrics_server *s) {
    if (!s) return;
    MHD_stop_daemon(s->daemon);
    free(s);
}

uint64_t qr_process_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
        fclose(f);
    }
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/*
 * fuzz_config.c - libFuzzer target: the text a user hands quorum.
 *
 * The first byte picks the parser, the rest is its input:
 *   0  a TF_CONFIG document (qr_cluster_from_json);
 *   1  --ps_hosts, --worker_hosts, --job_name lines and a task index byte
 *      (qr_cluster_from_flags);
 *   2  "key=value" lines into qr_config_set, then the last line as a
 *      variable's optimizer options (qr_optim_create_for_var).
 * Each must return a status, never crash, and free what it took.
 */
#include "common/config.h"
#include "optim/optim.h"
#include "quorum.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The input after the first byte as lines (NUL-terminated in place). */
static int split_lines(char *text, char **lines, int max) {
    int n = 0;
    for (char *p = text; n < max;) {
        lines[n++] = p;
        char *nl = strchr(p, '\n');
        if (!nl) break;
        *nl = 0;
        p = nl + 1;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char *text = malloc(size);
    if (!text) abort();
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    qr_cluster *c = NULL;
    char *lines[64];
    switch (data[0] % 3) {
    case 0:
        if (qr_cluster_from_json(&c, text) == QR_OK) qr_cluster_free(c);
        break;
    case 1: {
        int n = split_lines(text, lines, 4);
        const char *ps = lines[0], *workers = n > 1 ? lines[1] : "", *job = n > 2 ? lines[2] : "";
        int index = n > 3 ? (int)(signed char)lines[3][0] : 0;
        if (qr_cluster_from_flags(&c, ps, workers, job, index) == QR_OK) qr_cluster_free(c);
        break;
    }
    case 2: {
        qr_config *cfg = NULL;
        if (qr_config_new(&cfg)) abort();
        int n = split_lines(text, lines, 64);
        for (int i = 0; i + 1 < n; i++) {
            char *eq = strchr(lines[i], '=');
            if (!eq) continue;
            *eq = 0;
            qr_config_set(cfg, lines[i], eq + 1);
        }
        qr_optim *opt = NULL;
        if (qr_optim_create_for_var(&opt, cfg, lines[n - 1]) == QR_OK) qr_optim_free(opt);
        qr_config_free(cfg);
        break;
    }
    }
    free(text);
    return 0;
}

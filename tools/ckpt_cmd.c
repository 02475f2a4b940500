/*
 * ckpt_cmd.c - `quorum ckpt ls|show|verify DIR`: look at a folder of
 * checkpoints without starting a cluster (src/ckpt/ reads the files).
 *
 *   ls      every checkpoint, newest first: step, time, size, shards,
 *           full or incremental (and on which step), complete or not
 *   show    every tensor of one checkpoint (the newest complete one, or
 *           --step N): shard, dtype, shape, and min, max, mean, NaN count
 *   verify  every checkpoint (or --step N) against its manifest: sizes,
 *           crc32, and each shard's header (its global step, shard number,
 *           mode and checkpoint: no shard of another step or run mixed in),
 *           and for an incremental one its chain, every link back to its
 *           full checkpoint; exit status 1 on any damaged checkpoint. Folders newer than the
 *           newest complete checkpoint that have no manifest are writes
 *           interrupted (or under way), and temporary files are writes of
 *           live or dead writers: reported, not failures.
 */
#include "cli.h"

#include "ckpt/ckpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int usage(FILE *f, int status) {
    fprintf(f, "usage: quorum ckpt ls DIR\n"
               "       quorum ckpt show DIR [--step N]\n"
               "       quorum ckpt verify DIR [--step N]\n\n"
               "Look at the checkpoints a cluster wrote with --checkpoint-dir DIR\n"
               "(docs/CHECKPOINTS.md). ls lists them; show prints every tensor of the\n"
               "newest complete one (or step N) with min, max, mean and NaN count; verify\n"
               "checks sizes, crc32 and every shard's header (global step, shard, mode,\n"
               "checkpoint) against the manifests, and an incremental checkpoint's chain\n"
               "back to its full one. Exit status 1 on a damaged checkpoint or chain (a\n"
               "write interrupted after the newest complete one is only reported), 2 on\n"
               "bad usage.\n");
    return status;
}

static void when(double unix_time, char *buf, size_t len) {
    time_t t = (time_t)unix_time;
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
}

/* "full", or "incr of 1100" (the step of its base). */
static void kind_of(const qr_ckpt_info *c, char *buf, size_t len) {
    if (!c->complete) snprintf(buf, len, "-");
    else if (c->incremental) snprintf(buf, len, "incr of %lld", (long long)c->base_step);
    else snprintf(buf, len, "full");
}

static int cmd_ls(const char *dir) {
    qr_ckpt_info *list;
    int n;
    if (qr_ckpt_list(dir, &list, &n)) {
        fprintf(stderr, "quorum ckpt: %s\n", qr_last_error());
        return 1;
    }
    if (!n) printf("no checkpoint in %s\n", dir);
    else printf("%-12s %-19s %12s %7s  %-18s %s\n", "global_step", "time", "bytes", "shards",
                "kind", "state");
    for (int i = 0; i < n; i++) {
        char t[32] = "-", kind[48];
        if (list[i].complete) when(list[i].unix_time, t, sizeof t);
        kind_of(&list[i], kind, sizeof kind);
        printf("%-12lld %-19s %12llu %7d  %-18s %s\n", (long long)list[i].step, t,
               (unsigned long long)list[i].bytes, list[i].nshards, kind,
               list[i].complete       ? "complete"
               : list[i].has_manifest ? "damaged (its manifest does not read)"
                                      : "incomplete (no manifest: a write interrupted or under way)");
    }
    qr_ckpt_list_free(list, n);
    return 0;
}

/* The checkpoint of dir at `step` (-1: the newest complete one). */
static int find(const char *dir, int64_t step, qr_ckpt_info *out) {
    qr_ckpt_info *list;
    int n;
    if (qr_ckpt_list(dir, &list, &n)) {
        fprintf(stderr, "quorum ckpt: %s\n", qr_last_error());
        return 1;
    }
    int rc = 1;
    for (int i = 0; i < n && rc; i++) {
        if (step >= 0 ? list[i].step != step : !list[i].complete) continue;
        if (!list[i].complete) {
            fprintf(stderr, "quorum ckpt: %s is incomplete: %s\n", list[i].path, list[i].problem);
            break;
        }
        *out = list[i];
        list[i].shards = NULL;
        rc = 0;
    }
    if (rc && step < 0) fprintf(stderr, "quorum ckpt: no complete checkpoint in %s\n", dir);
    else if (rc && step >= 0 && n) fprintf(stderr, "quorum ckpt: no checkpoint of step %lld in %s\n",
                                           (long long)step, dir);
    qr_ckpt_list_free(list, n);
    return rc;
}

static void print_tensor(const qr_st_file *f, const qr_st_tensor *t, int shard) {
    char shape[160] = "[";
    size_t off = 1;
    for (int d = 0; d < t->ndim; d++)
        off += (size_t)snprintf(shape + off, sizeof shape - off, "%s%lld", d ? "," : "",
                                (long long)t->shape[d]);
    snprintf(shape + off, sizeof shape - off, "]");
    uint64_t bytes = t->end - t->begin;
    void *data = malloc(bytes ? bytes : 1);
    if (!data || qr_st_read(f, t, data)) {
        printf("%-40s %5d %s %-14s (unreadable: %s)\n", t->name, shard,
               qr_dtype_st_name(t->dtype), shape, data ? qr_last_error() : "memory");
        free(data);
        return;
    }
    uint64_t n = bytes / qr_dtype_size(t->dtype);
    if (t->dtype == QR_DT_U8) { /* an admission filter's counters */
        const uint8_t *v = data;
        uint64_t used = 0, top = 0;
        for (uint64_t i = 0; i < n; i++) {
            used += v[i] != 0;
            top = v[i] > top ? v[i] : top;
        }
        printf("%-40s %5d U8  %-14s nonzero %llu max %llu\n", t->name, shard, shape,
               (unsigned long long)used, (unsigned long long)top);
        free(data);
        return;
    }
    if (t->dtype == QR_DT_I64) {
        const int64_t *v = data;
        if (n == 1) printf("%-40s %5d I64 %-14s value %lld\n", t->name, shard, shape, (long long)v[0]);
        else printf("%-40s %5d I64 %-14s first %lld\n", t->name, shard, shape,
                    n ? (long long)v[0] : 0LL);
        free(data);
        return;
    }
    const float *v = data;
    double lo = INFINITY, hi = -INFINITY, sum = 0;
    uint64_t nans = 0, finite = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (isnan(v[i])) {
            nans++;
            continue;
        }
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
        sum += v[i];
        finite++;
    }
    printf("%-40s %5d F32 %-14s min %-12.6g max %-12.6g mean %-12.6g nan %llu\n", t->name, shard,
           shape, finite ? lo : NAN, finite ? hi : NAN, finite ? sum / (double)finite : NAN,
           (unsigned long long)nans);
    free(data);
}

static int cmd_show(const char *dir, int64_t step) {
    qr_ckpt_info c;
    if (find(dir, step, &c)) return 1;
    char t[32];
    when(c.unix_time, t, sizeof t);
    char kind[200] = "full";
    if (c.incremental)
        snprintf(kind, sizeof kind, "incremental: base step %lld (checkpoint id %llu), chain "
                 "from the full checkpoint of step %lld; its tensors are what changed since the "
                 "base", (long long)c.base_step, (unsigned long long)c.base_id,
                 (long long)c.full_step);
    printf("%s: global step %lld, %s, %s mode, %d shard(s), %llu bytes, %s\n", c.path,
           (long long)c.step, t, c.mode, c.nshards, (unsigned long long)c.bytes, kind);
    printf("%-40s %5s %s %-14s\n", "tensor", "shard", "dtype", "shape");
    int rc = 0;
    for (int s = 0; s < c.nshards; s++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", c.path, c.shards[s].file);
        qr_st_file f;
        if (qr_st_open(&f, path)) {
            fprintf(stderr, "quorum ckpt: %s\n", qr_last_error());
            rc = 1;
            continue;
        }
        for (int i = 0; i < f.n; i++) print_tensor(&f, &f.t[i], s);
        qr_st_close(&f);
    }
    qr_ckpt_info_free(&c);
    return rc;
}

/* The temporary files of interrupted or ongoing writes: reported only (a
 * ps removes a dead writer's once its next checkpoint is complete). */
static void report_tmp(const char *dir) {
    qr_ckpt_tmp *tmp;
    int n;
    if (qr_ckpt_list_tmp(dir, &tmp, &n)) {
        printf("%s: %s\n", dir, qr_last_error());
        return;
    }
    for (int i = 0; i < n; i++) {
        if (tmp[i].alive)
            printf("%s: a temporary file being written (pid %d runs on this machine)\n",
                   tmp[i].path, tmp[i].pid);
        else
            printf("%s: a temporary file left by a writer that died (pid %d is not running "
                   "here); the next checkpoint removes it\n", tmp[i].path, tmp[i].pid);
    }
    free(tmp);
}

static int cmd_verify(const char *dir, int64_t step) {
    qr_ckpt_info *list;
    int n;
    if (qr_ckpt_list(dir, &list, &n)) {
        fprintf(stderr, "quorum ckpt: %s\n", qr_last_error());
        return 1;
    }
    int bad = 0, checked = 0;
    bool seen_complete = false; /* a complete one newer than list[i] */
    for (int i = 0; i < n; i++) {
        bool interrupted = !list[i].complete && !list[i].has_manifest;
        bool asked = step >= 0 && list[i].step == step;
        if (step >= 0 && !asked) continue;
        checked++;
        if (interrupted && !asked && !seen_complete) {
            /* Newer than every complete checkpoint: a write a crash
             * interrupted, or one under way. Not a checkpoint, and no
             * damage to one: the restore skips it. */
            printf("%s: not a checkpoint: %s; skipped\n", list[i].path, list[i].problem);
            continue;
        }
        if (list[i].complete) seen_complete = true;
        qr_ckpt_info *chain;
        int links;
        if (qr_ckpt_chain(&list[i], &chain, &links)) {
            printf("%s: %s\n", list[i].path, qr_last_error());
            bad++;
            continue;
        }
        char kind[160] = "full";
        if (list[i].incremental)
            snprintf(kind, sizeof kind, "incremental on step %lld, a chain of %d from the full "
                     "checkpoint of step %lld", (long long)list[i].base_step, links,
                     (long long)chain[0].step);
        qr_ckpt_list_free(chain, links);
        printf("%s: ok (global step %lld, %d shard(s), %llu bytes, %s)\n", list[i].path,
               (long long)list[i].step, list[i].nshards, (unsigned long long)list[i].bytes, kind);
    }
    qr_ckpt_list_free(list, n);
    if (step < 0) report_tmp(dir);
    if (!checked) {
        fprintf(stderr, "quorum ckpt: nothing to verify in %s%s\n", dir,
                step >= 0 ? " at that step" : "");
        return 1;
    }
    if (step < 0 && !seen_complete) {
        fprintf(stderr, "quorum ckpt: no complete checkpoint in %s\n", dir);
        return 1;
    }
    return bad ? 1 : 0;
}

int cmd_ckpt(int argc, char **argv) {
    if (argc < 1) return usage(stderr, 2);
    if (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) return usage(stdout, 0);
    const char *sub = argv[0], *dir = NULL;
    int64_t step = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout, 0);
        if (!strcmp(argv[i], "--step") && i + 1 < argc) {
            if (qr__parse_int64(argv[++i], 0, INT64_MAX / 2, &step)) {
                fprintf(stderr, "quorum ckpt: --step %s is not a global step\n", argv[i]);
                return 2;
            }
        } else if (!dir && argv[i][0] != '-') {
            dir = argv[i];
        } else {
            fprintf(stderr, "quorum ckpt: unexpected argument '%s'\n", argv[i]);
            return usage(stderr, 2);
        }
    }
    if (!dir) return usage(stderr, 2);
    if (!strcmp(sub, "ls") && step < 0) return cmd_ls(dir);
    if (!strcmp(sub, "show")) return cmd_show(dir, step);
    if (!strcmp(sub, "verify")) return cmd_verify(dir, step);
    fprintf(stderr, "quorum ckpt: unknown subcommand '%s' (ls, show, verify)\n", sub);
    return 2;
}

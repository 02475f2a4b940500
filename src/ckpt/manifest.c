/*
 * manifest.c - the manifest that makes a checkpoint exist, and the folder
 * of checkpoints: list them, verify one, pick the newest that verifies,
 * prune old ones.
 *
 * manifest.json:
 *   {"format": "quorum-checkpoint", "version": 2, "global_step": 1200,
 *    "unix_time": 1795474801.5, "mode": "sync", "num_shards": 2,
 *    "incarnation": "5f0c2a9e11d2b7c4", "checkpoint_id": 7,
 *    "shards": [{"file": "shard-00000-of-00002.safetensors",
 *                "bytes": 1234, "crc32": "9ae0daaf", "variables": 3}, ...]}
 * crc32 is zlib's (the one `zlib.crc32` and `gzip` use) of the whole file.
 * incarnation (ps 0's run, 16 hex digits) and checkpoint_id (that run's
 * count of checkpoints) name the checkpoint; every shard's header names
 * the same ones, with its global step, shard number and mode, and verify
 * checks them (version 1 manifests have neither: checked by step).
 * "kind" is "full" or (version 3) "incremental", which adds its chain:
 *   "base_step": 1100, "base_checkpoint_id": 6, "full_step": 800
 * the checkpoint it is an increment of (of the same incarnation) and the
 * full checkpoint its chain starts from (qr_ckpt_chain follows them).
 */
#include "ckpt/ckpt.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define MANIFEST "manifest.json"
#define MAX_MANIFEST (16u << 20)

int qr_ckpt_path(char *buf, size_t len, const char *dir, int64_t step) {
    int n = snprintf(buf, len, "%s/ckpt-%010lld", dir, (long long)step);
    if (n < 0 || (size_t)n >= len)
        return qr__fail(QR_EINVAL, "checkpoint folder name too long under '%s'", dir);
    return QR_OK;
}

void qr_ckpt_shard_name(char *buf, size_t len, int shard, int nshards) {
    snprintf(buf, len, "shard-%05d-of-%05d.safetensors", shard, nshards);
}

/* Chains longer than this are refused as damaged (a loop of bases). */
#define MAX_CHAIN 100000

void qr_ckpt_info_free(qr_ckpt_info *c) {
    free(c->shards);
    c->shards = NULL;
    c->nshards = 0;
}

void qr_ckpt_list_free(qr_ckpt_info *list, int n) {
    for (int i = 0; list && i < n; i++) qr_ckpt_info_free(&list[i]);
    free(list);
}

/* ---- the manifest ---------------------------------------------------------- */

int qr_ckpt_write_manifest(const qr_ckpt_info *c) {
    cJSON *m = cJSON_CreateObject();
    bool increment = c->incremental;
    cJSON_AddStringToObject(m, "format", QR_CKPT_FORMAT);
    cJSON_AddNumberToObject(m, "version", increment ? QR_CKPT_VERSION : QR_CKPT_FULL_VERSION);
    cJSON_AddStringToObject(m, "kind", increment ? "incremental" : "full");
    if (increment) {
        cJSON_AddNumberToObject(m, "base_step", (double)c->base_step);
        cJSON_AddNumberToObject(m, "base_checkpoint_id", (double)c->base_id);
        cJSON_AddNumberToObject(m, "full_step", (double)c->full_step);
    }
    cJSON_AddNumberToObject(m, "global_step", (double)c->step);
    cJSON_AddNumberToObject(m, "unix_time", c->unix_time);
    cJSON_AddStringToObject(m, "mode", c->mode);
    cJSON_AddNumberToObject(m, "num_shards", c->nshards);
    char incarnation[24];
    snprintf(incarnation, sizeof incarnation, "%016llx", (unsigned long long)c->incarnation);
    cJSON_AddStringToObject(m, "incarnation", incarnation);
    cJSON_AddNumberToObject(m, "checkpoint_id", (double)c->checkpoint_id);
    cJSON *shards = cJSON_AddArrayToObject(m, "shards");
    for (int i = 0; i < c->nshards; i++) {
        cJSON *s = cJSON_CreateObject();
        char crc[16];
        snprintf(crc, sizeof crc, "%08x", c->shards[i].crc32);
        cJSON_AddStringToObject(s, "file", c->shards[i].file);
        cJSON_AddNumberToObject(s, "bytes", (double)c->shards[i].bytes);
        cJSON_AddStringToObject(s, "crc32", crc);
        cJSON_AddNumberToObject(s, "variables", c->shards[i].nvars);
        cJSON_AddItemToArray(shards, s);
    }
    char *text = cJSON_Print(m);
    cJSON_Delete(m);
    if (!text) return qr__fail(QR_ENOMEM, "out of memory writing a manifest");
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", c->path, MANIFEST);
    qr_durable d;
    int rc = qr_durable_open(&d, path);
    if (!rc) rc = qr_durable_write(&d, text, strlen(text));
    if (!rc) rc = qr_durable_write(&d, "\n", 1);
    free(text);
    if (!rc) return qr_durable_commit(&d);
    if (d.tmp) qr_durable_abandon(&d);
    return rc;
}

static char *read_small_file(const char *path, size_t max, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
    fclose(f);
    if (!buf || n > max) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static bool json_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < (double)lo || v->valuedouble > (double)hi ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return false;
    *out = (int64_t)v->valuedouble;
    return true;
}

/* A shard's file name must be a plain name in the checkpoint's folder. */
static bool plain_name(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < sizeof(((qr_ckpt_shard *)0)->file);
}

static int parse_shards(qr_ckpt_info *c, const cJSON *shards, const char *path) {
    c->shards = qr__calloc((size_t)QR_MAX(c->nshards, 1), sizeof *c->shards);
    if (!c->shards) return QR_ENOMEM;
    for (int i = 0; i < c->nshards; i++) {
        const cJSON *s = cJSON_GetArrayItem(shards, i);
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(s, "file");
        const cJSON *crc = cJSON_GetObjectItemCaseSensitive(s, "crc32");
        int64_t bytes, nvars;
        char *end = NULL;
        unsigned long sum = cJSON_IsString(crc) ? strtoul(crc->valuestring, &end, 16) : 0;
        if (!cJSON_IsString(file) || !plain_name(file->valuestring) || !end || *end ||
            strlen(crc->valuestring) != 8 || !json_int(s, "bytes", 8, INT64_MAX / 2, &bytes) ||
            !json_int(s, "variables", 0, 1 << 30, &nvars))
            return qr__fail(QR_EIO, "'%s': shard %d's entry is malformed", path, i);
        snprintf(c->shards[i].file, sizeof c->shards[i].file, "%s", file->valuestring);
        c->shards[i].crc32 = (uint32_t)sum;
        c->shards[i].bytes = (uint64_t)bytes;
        c->shards[i].nvars = (int)nvars;
        c->bytes += (uint64_t)bytes;
    }
    return QR_OK;
}

/* A 64-bit number written as 16 hex digits (JSON numbers are doubles). */
static bool parse_hex64(const char *s, uint64_t *out) {
    char *end;
    if (!s || strlen(s) != 16) return false;
    errno = 0;
    *out = strtoull(s, &end, 16);
    return !*end && !errno;
}

/* The checkpoint's name in a version 2 manifest. */
static bool read_identity(const cJSON *m, qr_ckpt_info *c) {
    const cJSON *inc = cJSON_GetObjectItemCaseSensitive(m, "incarnation");
    int64_t id;
    if (!cJSON_IsString(inc) || !parse_hex64(inc->valuestring, &c->incarnation) ||
        !json_int(m, "checkpoint_id", 0, INT64_MAX / 2, &id))
        return false;
    c->checkpoint_id = (uint64_t)id;
    return true;
}

/* Its kind, and an increment's chain (version 3). */
static bool read_kind(const cJSON *m, int64_t version, qr_ckpt_info *c) {
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(m, "kind");
    c->incremental = false;
    c->base_step = -1;
    c->full_step = c->step;
    c->base_id = 0;
    bool increment = cJSON_IsString(kind) && !strcmp(kind->valuestring, "incremental");
    if (version < 3) return !kind || (cJSON_IsString(kind) && !strcmp(kind->valuestring, "full"));
    if (!increment) return cJSON_IsString(kind) && !strcmp(kind->valuestring, "full");
    int64_t base, id, full;
    if (!json_int(m, "base_step", 0, c->step - 1, &base) ||
        !json_int(m, "base_checkpoint_id", 1, INT64_MAX / 2, &id) ||
        !json_int(m, "full_step", 0, base, &full))
        return false;
    c->incremental = true;
    c->base_step = base;
    c->base_id = (uint64_t)id;
    c->full_step = full;
    return true;
}

int qr_ckpt_read_manifest(qr_ckpt_info *c) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", c->path, MANIFEST);
    size_t len = 0;
    c->has_manifest = false;
    c->problem[0] = '\0';
    errno = 0;
    char *text = read_small_file(path, MAX_MANIFEST, &len);
    if (!text) {
        int e = errno;
        c->complete = false;
        c->has_manifest = e != ENOENT;
        int rc = e == ENOENT
                     ? qr__fail(QR_ENOTFOUND, "'%s' has no %s (a write interrupted, or one under "
                                "way)", c->path, MANIFEST)
                     : qr__fail(QR_EIO, "cannot read '%s'%s%s", path, e ? ": " : " (too large)",
                                e ? strerror(e) : "");
        snprintf(c->problem, sizeof c->problem, "%s", qr_last_error());
        return rc;
    }
    c->has_manifest = true;
    cJSON *m = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(m, "format");
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(m, "mode");
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(m, "shards");
    const cJSON *time = cJSON_GetObjectItemCaseSensitive(m, "unix_time");
    int64_t version = 0, step = 0, nshards = 0;
    int rc = QR_OK;
    if (!cJSON_IsObject(m) || !cJSON_IsString(format) || strcmp(format->valuestring, QR_CKPT_FORMAT))
        rc = qr__fail(QR_EIO, "'%s' is not a quorum checkpoint manifest (torn or foreign)", path);
    else if (!json_int(m, "version", 1, 1 << 20, &version) || version < QR_CKPT_OLDEST_VERSION ||
             version > QR_CKPT_VERSION)
        rc = qr__fail(QR_EIO, "'%s': format version unsupported (this quorum reads %d to %d)",
                      path, QR_CKPT_OLDEST_VERSION, QR_CKPT_VERSION);
    else if (!json_int(m, "global_step", 0, INT64_MAX / 2, &step) ||
             !json_int(m, "num_shards", 1, 1 << 16, &nshards) || !cJSON_IsArray(shards) ||
             cJSON_GetArraySize(shards) != nshards || !cJSON_IsString(mode) ||
             strlen(mode->valuestring) >= sizeof c->mode || !cJSON_IsNumber(time) ||
             (version >= 2 && !read_identity(m, c)))
        rc = qr__fail(QR_EIO, "'%s' is malformed (global_step, num_shards, shards, mode, "
                      "unix_time, incarnation or checkpoint_id missing or wrong)", path);
    else if (step == c->step && !read_kind(m, version, c))
        rc = qr__fail(QR_EIO, "'%s' is malformed (kind, or an increment's base_step, "
                      "base_checkpoint_id or full_step, missing or wrong)", path);
    else if (step != c->step)
        rc = qr__fail(QR_EIO, "'%s' says global step %lld but its folder is named for step "
                      "%lld: the manifest does not belong to this folder", path,
                      (long long)step, (long long)c->step);
    if (!rc) {
        c->version = (int)version;
        c->nshards = (int)nshards;
        c->unix_time = time->valuedouble;
        snprintf(c->mode, sizeof c->mode, "%s", mode->valuestring);
        rc = parse_shards(c, shards, path);
    }
    cJSON_Delete(m);
    if (rc) {
        qr_ckpt_info_free(c);
        snprintf(c->problem, sizeof c->problem, "%s", qr_last_error());
    }
    c->complete = rc == QR_OK;
    return rc;
}

/* ---- the folder ------------------------------------------------------------- */

/* "ckpt-0000001200" -> 1200; -1 for any other name. */
static int64_t step_of_name(const char *name) {
    if (strncmp(name, "ckpt-", 5)) return -1;
    int64_t step;
    return qr__parse_int64(name + 5, 0, INT64_MAX / 2, &step) || strchr(name, '.') ? -1 : step;
}

static int cmp_newest_first(const void *a, const void *b) {
    const qr_ckpt_info *x = a, *y = b;
    return (x->step < y->step) - (x->step > y->step);
}

int qr_ckpt_list(const char *dir, qr_ckpt_info **out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return QR_OK;
        return qr__fail(QR_EIO, "cannot read checkpoint folder '%s': %s", dir, strerror(errno));
    }
    qr_ckpt_info *list = NULL;
    int count = 0, cap = 0, rc = QR_OK;
    struct dirent *e;
    while ((e = readdir(d)) && !rc) {
        int64_t step = step_of_name(e->d_name);
        if (step < 0) continue;
        if (count == cap) {
            cap = cap ? 2 * cap : 16;
            qr_ckpt_info *grown = realloc(list, (size_t)cap * sizeof *grown);
            if (!grown) {
                rc = qr__fail(QR_ENOMEM, "out of memory listing '%s'", dir);
                break;
            }
            list = grown;
        }
        qr_ckpt_info *c = &list[count++];
        memset(c, 0, sizeof *c);
        c->step = step;
        snprintf(c->path, sizeof c->path, "%s/%s", dir, e->d_name);
        qr_ckpt_read_manifest(c); /* complete stays false when it fails */
    }
    closedir(d);
    if (rc) {
        qr_ckpt_list_free(list, count);
        return rc;
    }
    if (count) qsort(list, (size_t)count, sizeof *list, cmp_newest_first);
    *out = list;
    *n = count;
    return QR_OK;
}

/* A metadata string of a shard's header that must read `want`. */
static bool meta_is(const qr_st_file *f, const char *key, const char *want) {
    const char *v = qr_st_meta(f, key);
    return v && !strcmp(v, want);
}

static const char *meta_or(const qr_st_file *f, const char *key, const char *missing) {
    const char *v = qr_st_meta(f, key);
    return v ? v : missing;
}

/* Does the shard's header say it is shard `index` of checkpoint c? The
 * size and crc32 only say the file is the one the manifest was written
 * with; a shard copied from another step, or left from another run's
 * checkpoint of the same step, and the manifest made to match it, must
 * still not pass: its header names its own step and checkpoint. */
static int check_shard_header(const qr_ckpt_info *c, int index, const qr_st_file *f) {
    char want[32];
    const char *step = qr_st_meta(f, "global_step");
    if (!meta_is(f, "format", QR_CKPT_FORMAT))
        return qr__fail(QR_EIO, "checkpoint shard '%s' is not a quorum shard (no format in its "
                        "header)", f->path);
    snprintf(want, sizeof want, "%lld", (long long)c->step);
    if (!step || strcmp(step, want))
        return qr__fail(QR_EIO, "checkpoint shard '%s' holds global step %s, its manifest step "
                        "%lld: a shard of another checkpoint (mixed steps)", f->path,
                        step ? step : "(none)", (long long)c->step);
    int64_t tensor_step = -1;
    const qr_st_tensor *t = qr_st_find(f, "global_step");
    if (!t || t->dtype != QR_DT_I64 || t->ndim != 0 || qr_st_read(f, t, &tensor_step) ||
        tensor_step != c->step)
        return qr__fail(QR_EIO, "checkpoint shard '%s': its global_step tensor is %lld, its "
                        "header and manifest %lld", f->path, (long long)tensor_step,
                        (long long)c->step);
    snprintf(want, sizeof want, "%d", index);
    bool placed = meta_is(f, "shard", want);
    snprintf(want, sizeof want, "%d", c->nshards);
    if (!placed || !meta_is(f, "num_shards", want))
        return qr__fail(QR_EIO, "checkpoint shard '%s' says it is shard %s of %s; the manifest "
                        "lists it as %d of %d", f->path, meta_or(f, "shard", "?"),
                        meta_or(f, "num_shards", "?"), index, c->nshards);
    if (!meta_is(f, "mode", c->mode))
        return qr__fail(QR_EIO, "checkpoint shard '%s' was written in %s mode, its manifest says "
                        "%s", f->path, meta_or(f, "mode", "no"), c->mode);
    snprintf(want, sizeof want, "%d", c->version);
    if (!meta_is(f, "version", want))
        return qr__fail(QR_EIO, "checkpoint shard '%s' has format version %s, its manifest %d",
                        f->path, meta_or(f, "version", "(none)"), c->version);
    if (c->version < 2) return QR_OK;
    uint64_t incarnation = 0, id = 0, writer = 0;
    const char *id_text = qr_st_meta(f, "checkpoint_id");
    char *end = NULL;
    if (id_text && *id_text) id = strtoull(id_text, &end, 10);
    if (!parse_hex64(qr_st_meta(f, "checkpoint_incarnation"), &incarnation) || !end || *end ||
        !parse_hex64(qr_st_meta(f, "incarnation"), &writer) || incarnation != c->incarnation ||
        id != c->checkpoint_id || (index == 0 && writer != incarnation))
        return qr__fail(QR_EIO, "checkpoint shard '%s' belongs to checkpoint %s/%s of ps 0, its "
                        "manifest is checkpoint %016llx/%llu: a shard of the same step from "
                        "another run (mixed checkpoints)", f->path,
                        meta_or(f, "checkpoint_incarnation", "?"), id_text ?: "?",
                        (unsigned long long)c->incarnation,
                        (unsigned long long)c->checkpoint_id);
    if (c->version < 3) return QR_OK;
    bool increment = c->incremental;
    snprintf(want, sizeof want, "%llu", (unsigned long long)c->base_id);
    if (!meta_is(f, "kind", increment ? "incremental" : "full") ||
        (increment && !meta_is(f, "base_checkpoint_id", want)))
        return qr__fail(QR_EIO, "checkpoint shard '%s' is a %s shard of base %s; its manifest "
                        "is %s checkpoint of base %llu (mixed checkpoints)", f->path,
                        meta_or(f, "kind", "?"), meta_or(f, "base_checkpoint_id", "none"),
                        increment ? "an incremental" : "a full",
                        (unsigned long long)c->base_id);
    return QR_OK;
}

static int verify_shard(const qr_ckpt_info *c, int index) {
    const qr_ckpt_shard *s = &c->shards[index];
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", c->path, s->file);
    FILE *f = fopen(path, "rb");
    if (!f) return qr__fail(QR_EIO, "checkpoint shard '%s' cannot be opened: %s", path, strerror(errno));
    static const size_t chunk = 4u << 20;
    uint8_t *buf = malloc(chunk);
    uint32_t crc = (uint32_t)crc32(0L, Z_NULL, 0);
    uint64_t bytes = 0;
    size_t got;
    while (buf && (got = fread(buf, 1, chunk, f)) > 0) {
        crc = (uint32_t)crc32_z(crc, buf, got);
        bytes += got;
    }
    bool read_error = ferror(f);
    fclose(f);
    free(buf);
    if (!buf) return qr__fail(QR_ENOMEM, "out of memory verifying '%s'", path);
    if (read_error) return qr__fail(QR_EIO, "reading checkpoint shard '%s' failed", path);
    if (bytes != s->bytes)
        return qr__fail(QR_EIO, "checkpoint shard '%s' has %llu bytes, the manifest says %llu "
                        "(truncated?)", path, (unsigned long long)bytes,
                        (unsigned long long)s->bytes);
    if (crc != s->crc32)
        return qr__fail(QR_EIO, "checkpoint shard '%s' has crc32 %08x, the manifest says %08x "
                        "(corrupt)", path, crc, s->crc32);
    qr_st_file st;
    int rc = qr_st_open(&st, path);
    if (!rc) {
        rc = check_shard_header(c, index, &st);
        qr_st_close(&st);
    }
    return rc;
}

int qr_ckpt_verify(const qr_ckpt_info *c) {
    if (!c->complete)
        return qr__fail(QR_EIO, "checkpoint '%s' is incomplete: %s", c->path,
                        c->problem[0] ? c->problem : "its manifest was not read");
    for (int i = 0; i < c->nshards; i++) {
        int rc = verify_shard(c, i);
        if (rc) return rc;
    }
    return QR_OK;
}

int qr_ckpt_chain(const qr_ckpt_info *c, qr_ckpt_info **chain, int *n) {
    *chain = NULL;
    *n = 0;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", c->path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    int rc = qr_ckpt_verify(c), count = 1, cap = 8;
    qr_ckpt_info *links = rc ? NULL : qr__calloc((size_t)cap, sizeof *links);
    if (!rc && !links) rc = QR_ENOMEM;
    if (rc) return rc;
    /* Newest first while following the bases; reversed at the end. */
    links[0] = *c;
    links[0].shards = qr__calloc((size_t)QR_MAX(c->nshards, 1), sizeof *c->shards);
    if (!links[0].shards) rc = QR_ENOMEM;
    else memcpy(links[0].shards, c->shards, (size_t)c->nshards * sizeof *c->shards);
    while (!rc && links[count - 1].incremental) {
        const qr_ckpt_info *next = &links[count - 1];
        if (count == MAX_CHAIN) {
            rc = qr__fail(QR_EIO, "checkpoint '%s': its chain is longer than %d", c->path,
                          MAX_CHAIN);
            break;
        }
        if (count == cap) {
            qr_ckpt_info *grown = realloc(links, (size_t)cap * 2 * sizeof *grown);
            if (!grown) {
                rc = QR_ENOMEM;
                break;
            }
            links = grown;
            cap *= 2;
            next = &links[count - 1];
        }
        qr_ckpt_info *b = &links[count];
        memset(b, 0, sizeof *b);
        b->step = next->base_step;
        rc = qr_ckpt_path(b->path, sizeof b->path, dir, b->step);
        if (!rc) rc = qr_ckpt_read_manifest(b);
        count++;
        if (!rc && (b->incarnation != next->incarnation || b->checkpoint_id != next->base_id ||
                    b->full_step != next->full_step || b->mode[0] != next->mode[0] ||
                    b->nshards != next->nshards))
            rc = qr__fail(QR_EIO, "'%s' is checkpoint %016llx/%llu (chain from step %lld), not "
                          "the base %016llx/%llu (chain from step %lld) that '%s' names",
                          b->path, (unsigned long long)b->incarnation,
                          (unsigned long long)b->checkpoint_id, (long long)b->full_step,
                          (unsigned long long)next->incarnation,
                          (unsigned long long)next->base_id, (long long)next->full_step,
                          next->path);
        if (!rc) rc = qr_ckpt_verify(b);
        if (rc) qr__error_prefix("incremental checkpoint '%s': the link of step %lld of its "
                                 "chain: ", c->path, (long long)b->step);
    }
    if (rc) {
        qr_ckpt_list_free(links, count);
        return rc;
    }
    for (int i = 0; i < count / 2; i++) {
        qr_ckpt_info t = links[i];
        links[i] = links[count - 1 - i];
        links[count - 1 - i] = t;
    }
    *chain = links;
    *n = count;
    return QR_OK;
}

int qr_ckpt_latest_chain(const char *dir, qr_ckpt_info **chain, int *nchain) {
    qr_ckpt_info *list;
    int n, rc = qr_ckpt_list(dir, &list, &n);
    if (rc) return rc;
    rc = QR_ENOTFOUND;
    /* What was wrong with each checkpoint that had a manifest, for the
     * error when none verifies. */
    size_t cap = 4096, used = 0;
    char *problems = malloc(cap);
    if (problems) problems[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (!list[i].complete && !list[i].has_manifest) {
            /* The newest may be one being written right now, or one a
             * crash interrupted: either way it is not a checkpoint. */
            qr__log(QR_LOG_WARN, "checkpoint %s skipped: %s", list[i].path, list[i].problem);
            continue;
        }
        if (qr_ckpt_chain(&list[i], chain, nchain)) {
            qr__log(QR_LOG_WARN, "checkpoint skipped: %s", qr_last_error());
            if (problems && used < cap - 1)
                used += (size_t)snprintf(problems + used, cap - used, "%s%s", used ? "; " : "",
                                         qr_last_error());
            used = QR_MIN(used, cap - 1);
            continue;
        }
        rc = QR_OK;
        break;
    }
    if (rc && used)
        rc = qr__fail(QR_EIO, "no checkpoint of %s verifies: %s", dir, problems);
    free(problems);
    qr_ckpt_list_free(list, n);
    return rc;
}

int qr_ckpt_latest(const char *dir, qr_ckpt_info *out) {
    qr_ckpt_info *chain;
    int n, rc = qr_ckpt_latest_chain(dir, &chain, &n);
    if (rc) return rc;
    *out = chain[n - 1];
    chain[n - 1].shards = NULL; /* moved to *out */
    qr_ckpt_list_free(chain, n);
    return QR_OK;
}

/* "shard-00000-of-00002.safetensors.tmp-4242" -> 4242; 0 for any other name. */
static int tmp_pid(const char *name) {
    const char *at = strstr(name, ".tmp-");
    int64_t pid;
    if (!at || qr__parse_int64(at + 5, 1, INT32_MAX, &pid)) return 0;
    return (int)pid;
}

static bool pid_alive(int pid) {
    return kill(pid, 0) == 0 || errno == EPERM;
}

int qr_ckpt_list_tmp(const char *dir, qr_ckpt_tmp **out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? QR_OK
                                   : qr__fail(QR_EIO, "cannot read checkpoint folder '%s': %s",
                                              dir, strerror(errno));
    qr_ckpt_tmp *list = NULL;
    int count = 0, cap = 0, rc = QR_OK;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        if (step_of_name(e->d_name) < 0) continue;
        char folder[4200];
        snprintf(folder, sizeof folder, "%s/%s", dir, e->d_name);
        DIR *f = opendir(folder);
        struct dirent *g;
        while (!rc && f && (g = readdir(f))) {
            int pid = tmp_pid(g->d_name);
            if (!pid) continue;
            if (count == cap) {
                cap = cap ? 2 * cap : 8;
                qr_ckpt_tmp *grown = realloc(list, (size_t)cap * sizeof *grown);
                if (!grown) {
                    rc = qr__fail(QR_ENOMEM, "out of memory listing '%s'", dir);
                    break;
                }
                list = grown;
            }
            qr_ckpt_tmp *t = &list[count++];
            snprintf(t->path, sizeof t->path, "%.4095s/%.100s", folder, g->d_name);
            t->pid = pid;
            t->alive = pid_alive(pid);
        }
        if (f) closedir(f);
    }
    closedir(d);
    if (rc) {
        free(list);
        return rc;
    }
    *out = list;
    *n = count;
    return QR_OK;
}

void qr_ckpt_remove_dead_tmp(const char *dir) {
    qr_ckpt_tmp *list;
    int n;
    if (qr_ckpt_list_tmp(dir, &list, &n)) {
        qr__log(QR_LOG_WARN, "looking for leftover temporary files: %s", qr_last_error());
        return;
    }
    for (int i = 0; i < n; i++) {
        if (list[i].alive) continue;
        if (unlink(list[i].path) && errno != ENOENT)
            qr__log(QR_LOG_WARN, "cannot remove '%s', left by a writer that died (pid %d): %s",
                    list[i].path, list[i].pid, strerror(errno));
        else
            qr__log(QR_LOG_WARN, "removed '%s', left by a checkpoint writer that died (pid %d)",
                    list[i].path, list[i].pid);
    }
    free(list);
}

/* rm -r of a checkpoint folder (it holds files only). */
static int remove_ckpt(const char *path) {
    DIR *d = opendir(path);
    if (!d) return qr__fail(QR_EIO, "cannot open '%s': %s", path, strerror(errno));
    struct dirent *e;
    char file[4400];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(file, sizeof file, "%s/%s", path, e->d_name);
        unlink(file);
    }
    closedir(d);
    if (rmdir(path)) return qr__fail(QR_EIO, "cannot remove '%s': %s", path, strerror(errno));
    return QR_OK;
}

int qr_ckpt_prune(const char *dir, int keep) {
    qr_ckpt_info *list;
    int n, rc = qr_ckpt_list(dir, &list, &n);
    if (rc) return rc;
    /* Kept: the newest `keep` complete ones, and every base in their
     * chains (the list is newest first, so a base comes after its
     * increment and is marked before it is reached). */
    bool *kept = qr__calloc((size_t)QR_MAX(n, 1), sizeof *kept);
    if (!kept) {
        qr_ckpt_list_free(list, n);
        return QR_ENOMEM;
    }
    int complete = 0;
    bool removed = false;
    for (int i = 0; i < n; i++) {
        if (!list[i].complete) continue;
        if (++complete <= keep) kept[i] = true;
        if (!kept[i] || !list[i].incremental) continue;
        for (int k = i + 1; k < n; k++)
            if (list[k].step == list[i].base_step) kept[k] = true;
    }
    complete = 0;
    for (int i = 0; i < n; i++) {
        bool drop = list[i].complete ? !kept[i] : complete > 0;
        complete += list[i].complete;
        if (!drop) continue;
        if (remove_ckpt(list[i].path)) qr__log(QR_LOG_WARN, "pruning checkpoints: %s", qr_last_error());
        else removed = true;
    }
    free(kept);
    qr_ckpt_list_free(list, n);
    return removed ? qr_fsync_dir(dir) : QR_OK;
}

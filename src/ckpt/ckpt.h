/*
 * ckpt.h - quorum's checkpoints on disk: the safetensors shard files, the
 * manifest that makes a checkpoint exist, and the directory that holds
 * them (listing, choosing the newest complete one, pruning).
 *
 * A checkpoint of global step S under DIR is the folder DIR/ckpt-S (S
 * written with 10 digits, so names sort by step) holding one shard per ps
 * task, shard-K-of-P.safetensors, and manifest.json, written last by ps 0:
 * a folder without a manifest is an unfinished checkpoint and is ignored.
 * Every file is written to a temporary name, fsynced, renamed, and its
 * folder fsynced (durable.c), so a crash leaves either the old file or the
 * new one. docs/CHECKPOINTS.md describes the format for users.
 *
 * This layer knows files only; what goes into a shard and when is the
 * ps's business (src/ps/ckpt_shard.c, src/ps/ckpt_coord.c).
 */
#ifndef QR_CKPT_H
#define QR_CKPT_H

#include "common/common.h"
#include "common/limits.h"

struct cJSON;

/* ---- durable files (durable.c) ------------------------------------------ */

/* An open temporary file that becomes `path` on qr_durable_commit. */
typedef struct qr_durable {
    int fd;
    char *path, *tmp;
    uint32_t crc;   /* zlib crc32 of everything written */
    uint64_t bytes;
} qr_durable;

int qr_durable_open(qr_durable *d, const char *path);
/* Write all of buf (retrying short writes); updates crc and bytes. */
int qr_durable_write(qr_durable *d, const void *buf, size_t len);
/* fsync, rename over path, fsync the folder. Closes d either way. */
int qr_durable_commit(qr_durable *d);
/* Close and remove the temporary file (after a failure). */
void qr_durable_abandon(qr_durable *d);
/* mkdir that accepts an existing folder. */
int qr_mkdir(const char *path);
/* fsync a folder, so that a rename or an unlink in it is durable. */
int qr_fsync_dir(const char *path);

/* ---- safetensors (safetensors.c) ----------------------------------------- */

/* The dtypes quorum writes: variables and slots (F32), counters (I64),
 * a table's admission filter of 8-bit counters (U8). */
typedef enum { QR_DT_F32 = 0, QR_DT_I64 = 1, QR_DT_U8 = 2 } qr_dtype;

typedef struct qr_st_tensor {
    const char *name;
    qr_dtype dtype;
    int ndim; /* 0: a scalar */
    int64_t shape[QR_PROTO_MAX_NDIM];
    const void *data; /* writer: the bytes, little-endian; reader: where they
                       * landed (qr_st_open_head), else NULL */
    uint64_t begin, end; /* reader: the bytes' offsets in the data section */
    /* writer, in place of data: the bytes are at offset src_off of the
     * open file src_fd (a spool: a tiered table's rows, streamed out of
     * the ps at the snapshot, ckpt_shard.c), copied a chunk at a time */
    bool from_fd;
    int src_fd;
    uint64_t src_off;
} qr_st_tensor;

/* Bytes of one element, and of the whole tensor. */
size_t qr_dtype_size(qr_dtype t);
/* Its safetensors name: "F32", "I64", "U8". */
const char *qr_dtype_st_name(qr_dtype t);
uint64_t qr_st_bytes(const qr_st_tensor *t);

/* Write tensors t[0..n) (names unique) to `path` as a safetensors file,
 * durably. metadata: a JSON object of string values (the format allows
 * nothing else), or NULL. *crc and *bytes describe the file written. */
int qr_st_write_file(const char *path, const qr_st_tensor *t, int n,
                     const struct cJSON *metadata, uint32_t *crc, uint64_t *bytes);
/* The same, calling written(ctx, i) once tensor i is written (on the
 * calling thread), so that a caller can let go of what it held for it. */
int qr_st_write_file_progress(const char *path, const qr_st_tensor *t, int n,
                              const struct cJSON *metadata,
                              void (*written)(void *ctx, int i), void *ctx, uint32_t *crc,
                              uint64_t *bytes);

/* The bytes of a safetensors file that come before the tensors' (the
 * length and the header) of tensors t[0..n), malloc'd: with each
 * tensor's data after it, in order, they are the file (a re-replication
 * sends them so, from the tensors themselves). what: for messages. */
int qr_st_head(const char *what, const qr_st_tensor *t, int n, const struct cJSON *metadata,
               uint8_t **out, size_t *len);

/* A safetensors file opened for reading: its header parsed and checked
 * (offsets inside the file, contiguous, sizes matching shapes). */
typedef struct qr_st_file {
    int fd;
    char *path;
    uint64_t data_start, file_bytes;
    int n;
    qr_st_tensor *t;        /* names point into header */
    struct cJSON *header;   /* the parsed header */
    struct cJSON *metadata; /* its "__metadata__" object, or NULL */
    bool placing;           /* qr_st_open_head, until qr_st_place_rest */
    uint8_t *rest;          /* qr_st_place_rest's buffer */
} qr_st_file;

int qr_st_open(qr_st_file *f, const char *path);
/* A file whose bytes are still to come (a re-replication's SNAPSHOT,
 * taken from a socket straight into the tensors it fills), in three steps:
 *   qr_st_head_length: from its first 8 bytes (len in all), the length of
 *     its head (the length word and the header);
 *   qr_st_open_head: that head parsed and checked as qr_st_open does,
 *     against len; f is then `placing`: a qr_st_read names where tensor
 *     t's bytes are to land (t->data = dst), reads nothing, and refuses a
 *     second place for one tensor;
 *   qr_st_place_rest: the tensors given no place get one in a buffer of
 *     f's (f->rest); placing ends. The caller receives each tensor's bytes
 *     at its t->data, and a qr_st_read then copies from there (nothing
 *     when dst is that place). */
int qr_st_head_length(const void *first8, uint64_t len, uint64_t *head_len);
int qr_st_open_head(qr_st_file *f, const void *head, uint64_t head_len, uint64_t len,
                    const char *name);
int qr_st_place_rest(qr_st_file *f);
const qr_st_tensor *qr_st_find(const qr_st_file *f, const char *name);
/* Read tensor t's bytes into dst (qr_st_bytes(t) of them); see above for
 * a file opened with qr_st_open_head. */
int qr_st_read(const qr_st_file *f, const qr_st_tensor *t, void *dst);
/* Bytes [off, off + len) of tensor t into dst (a restore read in batches). */
int qr_st_read_range(const qr_st_file *f, const qr_st_tensor *t, uint64_t off, size_t len,
                     void *dst);
/* A metadata string, or NULL. */
const char *qr_st_meta(const qr_st_file *f, const char *key);
void qr_st_close(qr_st_file *f);

/* ---- checkpoints and their folder (manifest.c) ---------------------------- */

#define QR_CKPT_FORMAT "quorum-checkpoint"
/* 2: the manifest and every shard's header name the checkpoint they belong
 * to (ps 0's incarnation and its checkpoint id). Version 1 checkpoints are
 * still read; their shards are matched to the manifest by step, shard
 * number and mode only (docs/CHECKPOINTS.md). */
/* 3: an incremental checkpoint (docs/CHECKPOINTS.md, "Incremental
 * checkpoints"): its manifest and shards name its base, the checkpoint it
 * is an increment of. Full checkpoints are still written as version 2, so
 * a quorum that reads 1 and 2 reads them and refuses increments. */
#define QR_CKPT_VERSION 3
#define QR_CKPT_FULL_VERSION 2
#define QR_CKPT_OLDEST_VERSION 1

/* One shard as the manifest lists it. */
typedef struct qr_ckpt_shard {
    char file[64];
    uint64_t bytes;
    uint32_t crc32;
    int nvars;
} qr_ckpt_shard;

typedef struct qr_ckpt_info {
    char path[4096];  /* the checkpoint's folder */
    int64_t step;     /* from its name; the manifest's when it has one */
    bool complete;    /* a manifest that reads and matches the name */
    bool has_manifest; /* a manifest.json is there (complete or not) */
    char problem[512]; /* not complete: why (no manifest, or what is wrong with it) */
    int version;      /* the manifest's format version */
    /* Which checkpoint this is (version 2): the incarnation of the ps 0
     * that took it, and its id among that run's checkpoints. Every shard's
     * header names the same two. */
    uint64_t incarnation, checkpoint_id;
    /* An incremental checkpoint (version 3): the step and id of its base,
     * the checkpoint it is an increment of (same incarnation), and the
     * step of the full checkpoint its chain starts from (its own when
     * full). Zeroed, a qr_ckpt_info is a full checkpoint's. */
    bool incremental;
    int64_t base_step, full_step;
    uint64_t base_id;
    double unix_time; /* when it was taken (manifest) */
    char mode[8];     /* "sync" or "async" */
    int nshards;
    qr_ckpt_shard *shards;
    uint64_t bytes;   /* of all shards */
} qr_ckpt_info;

void qr_ckpt_info_free(qr_ckpt_info *c);

/* DIR/ckpt-STEP and DIR/ckpt-STEP/shard-K-of-P.safetensors. */
int qr_ckpt_path(char *buf, size_t len, const char *dir, int64_t step);
void qr_ckpt_shard_name(char *buf, size_t len, int shard, int nshards);

/* Every ckpt-* folder of dir, newest first, each with its manifest read
 * (complete = false when it has none or it does not parse). A missing dir
 * is an empty list. */
int qr_ckpt_list(const char *dir, qr_ckpt_info **out, int *n);
void qr_ckpt_list_free(qr_ckpt_info *list, int n);

/* Read c->path's manifest into c (c->path and c->step set). */
int qr_ckpt_read_manifest(qr_ckpt_info *c);

/* Check a complete checkpoint's files: every shard present, of the size
 * and crc32 the manifest says, a safetensors header that parses, and a
 * header that says it is this checkpoint's shard K of P: the manifest's
 * global step, mode and (version 2) ps 0 incarnation and checkpoint id, so
 * that a shard of another step or another run cannot pass for one of
 * this checkpoint even with the size and crc32 made to match. On a
 * problem: QR_EIO with a message naming the file and what is wrong. */
int qr_ckpt_verify(const qr_ckpt_info *c);

/* The chain that restores checkpoint c: the full checkpoint it starts
 * from, then each increment in order, c last (just c when it is full).
 * Every link is read and verified (qr_ckpt_verify) and must be the base
 * its successor names (step, ps 0 incarnation and checkpoint id). On a
 * problem: QR_EIO with a message naming the link and what is wrong. Free
 * *chain with qr_ckpt_list_free(*chain, *n). */
int qr_ckpt_chain(const qr_ckpt_info *c, qr_ckpt_info **chain, int *n);

/* The newest checkpoint of dir whose chain verifies (qr_ckpt_chain), in
 * *chain (*n links, the checkpoint last; free with qr_ckpt_list_free).
 * Newer ones that do not are skipped, each with a warning naming the file
 * (for an increment: the broken link). Errors as qr_ckpt_latest. */
int qr_ckpt_latest_chain(const char *dir, qr_ckpt_info **chain, int *n);

/* The newest checkpoint of dir that verifies, in *out (its folder and
 * manifest). Newer ones that do not verify are skipped, each with a
 * warning naming the file. QR_ENOTFOUND (no message) when there is none
 * and no folder has a manifest either (nothing but interrupted writes: a
 * fresh start is right). QR_EIO when there were checkpoints with a
 * manifest and none verifies, with a message naming each one's problem:
 * starting fresh would throw them away silently. */
int qr_ckpt_latest(const char *dir, qr_ckpt_info *out);

/* Temporary files (NAME.tmp-PID, durable.c) inside the checkpoint
 * folders of dir. A file whose PID runs on this machine is being
 * written; any other is left over by a writer that died. */
typedef struct qr_ckpt_tmp {
    char path[4200];
    int pid;
    bool alive;
} qr_ckpt_tmp;
/* Every one of them, in *out (free() it), *n of them. */
int qr_ckpt_list_tmp(const char *dir, qr_ckpt_tmp **out, int *n);
/* Remove those of dead writers, each with a warning naming it. Called
 * once a checkpoint is complete: no other write of the cluster is under
 * way then, so a file there is one a killed or stopped writer left. */
void qr_ckpt_remove_dead_tmp(const char *dir);

/* Write c's manifest into c->path, durably: the checkpoint now exists. */
int qr_ckpt_write_manifest(const qr_ckpt_info *c);

/* Remove the complete checkpoints of dir beyond the newest `keep` (but
 * not a base that a kept increment's chain needs), and unfinished ones
 * older than the newest complete one. */
int qr_ckpt_prune(const char *dir, int keep);

#endif /* QR_CKPT_H */

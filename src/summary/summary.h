/*
 * summary.h - scalar summaries of a run, written two ways at once:
 * TensorBoard event files (events.out.tfevents.<time>.<host>, what
 * TensorFlow's summary service wrote) and JSON lines (summaries.jsonl,
 * for scripts and `quorum plot`), both in one log folder.
 */
#ifndef QR_SUMMARY_H
#define QR_SUMMARY_H

#include "common/common.h"

typedef struct qr_summary qr_summary;

/* Create logdir if needed and open both files in it (appending a new event
 * file; summaries.jsonl is appended to). QR_EIO naming the path if the
 * folder cannot be made or written. */
int qr_summary_open(qr_summary **out, const char *logdir);
/* One point: n scalars tagged tags[i] at global step `step`, written and
 * flushed to both files. */
int qr_summary_write(qr_summary *s, int64_t step, int n, const char *const *tags,
                     const double *values);
void qr_summary_close(qr_summary *s);

/* The pieces, for tests. CRC-32C (Castagnoli), and TFRecord's masked
 * form of it. */
uint32_t qr_crc32c(const void *data, size_t len);
uint32_t qr_crc32c_masked(const void *data, size_t len);
/* The TFRecord bytes of one Event with scalar values (wall_time, step,
 * n values) into buf (at most cap bytes); returns the length, 0 if it does
 * not fit. */
size_t qr_summary_event_record(uint8_t *buf, size_t cap, double wall_time, int64_t step, int n,
                               const char *const *tags, const double *values);

#endif /* QR_SUMMARY_H */

/*
 * summaries.h - the chief's summary service (summaries.c).
 */
#ifndef QR_TRAIN_SUMMARIES_H
#define QR_TRAIN_SUMMARIES_H

#include "common/common.h"
#include "summary/summary.h"

typedef struct train_summaries {
    qr_summary *out;   /* NULL: no --logdir */
    double every_secs;
    double last_time;
    int64_t last_step;
    double lr, decay_rate;
    int64_t decay_steps;
    bool staircase;
} train_summaries;

/* No logdir: nothing is written, every call returns at once. cfg: the
 * learning rate's schedule (the trainer's); NULL: the caller gives the
 * rate (qr__summaries_write). */
int qr__summaries_open(train_summaries *t, const char *logdir, double every_secs,
                       const qr_config *cfg);
/* The trainer's point: if every_secs have passed since the last one, or
 * if final (with the test split's accuracy and loss). */
int qr__summaries_point(train_summaries *t, qr_worker *w, int64_t step, double loss,
                        int64_t examples_per_step, bool final, double accuracy,
                        double test_loss);
/* every_secs have passed since the last point. */
bool qr__summaries_due(const train_summaries *t);
/* A point now at global step `step`: loss and lr (NAN: left out), the
 * examples since the last point (< 0: left out), the cluster's figures
 * (stale gradients, checkpoint), and nextra scalars of the caller's. */
#define QR_SUMMARIES_MAX_EXTRA 32
int qr__summaries_write(train_summaries *t, qr_worker *w, int64_t step, double loss,
                        double examples, double lr, int nextra, const char *const *extra_tags,
                        const double *extra_values);
void qr__summaries_close(train_summaries *t);

#endif

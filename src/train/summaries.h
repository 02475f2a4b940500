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

/* No logdir: nothing is written, every call returns at once. */
int qr__summaries_open(train_summaries *t, const char *logdir, double every_secs,
                       const qr_config *cfg);
/* A point if every_secs have passed since the last one, or if final. */
int qr__summaries_point(train_summaries *t, qr_worker *w, int64_t step, double loss,
                        int64_t examples_per_step, bool final, double accuracy,
                        double test_loss);
void qr__summaries_close(train_summaries *t);

#endif

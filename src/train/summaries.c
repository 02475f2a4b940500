/*
 * summaries.c - the chief's summary service (TensorFlow's Supervisor wrote
 * one every 120 s): with --logdir, a point of scalars every summary-secs
 * seconds and one at the end, into TensorBoard event files and JSON lines
 * (src/summary/).
 *
 * The scalars (docs/SUMMARIES.md says what each means):
 *   loss               moving average (0.95) of the minibatch loss
 *   global_step/sec    global steps per second since the previous point
 *   examples/sec       examples per second since the previous point
 *   stale_gradients    sync: gradients dropped as stale so far; async:
 *                      pushes computed on weights older than the ps's,
 *                      counted per push (on each ps it reached), not per
 *                      variable
 *   learning_rate      the rate the ps applies at this global step (the
 *                      lr-decay-* schedule)
 *   checkpoint_duration_s  the last checkpoint's, when there is one
 *   accuracy, test_loss    at the end, on the test split
 * A program's own training loop (src/train/monitor.c) reports the loss,
 * the examples and the rate itself, and adds scalars of its own.
 */
#include "train/summaries.h"

#include "common/config.h"
#include "optim/optim.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

int qr__summaries_open(train_summaries *t, const char *logdir, double every_secs,
                       const qr_config *cfg) {
    memset(t, 0, sizeof *t);
    if (!logdir || !logdir[0]) return QR_OK;
    if (cfg) { /* the trainer's: the rate from the options' schedule */
        qr_optim *opt = NULL;
        int rc = qr_optim_create(&opt, cfg);
        if (rc) return rc;
        t->lr = qr_optim_lr(opt);
        qr_optim_free(opt);
        t->decay_rate = qr__config_float(cfg, "lr-decay-rate");
        t->decay_steps = qr__config_int(cfg, "lr-decay-steps");
        t->staircase = qr__config_bool(cfg, "lr-decay-staircase");
    }
    t->every_secs = every_secs;
    t->last_time = qr__now_sec();
    return qr_summary_open(&t->out, logdir);
}

/* Stale gradients and the last checkpoint's duration, from the cluster's
 * statistics; -1 where they say nothing. */
static void from_stats(qr_worker *w, double *stale, double *ckpt_s) {
    char buf[16384];
    *stale = *ckpt_s = -1;
    if (qr_worker_stats(w, buf, sizeof buf)) return;
    cJSON *j = cJSON_Parse(buf);
    const cJSON *dropped = cJSON_GetObjectItemCaseSensitive(j, "stale_dropped");
    const cJSON *stale_pushes = cJSON_GetObjectItemCaseSensitive(j, "stale_pushes_applied");
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(j, "checkpoint");
    const cJSON *dur = cJSON_GetObjectItemCaseSensitive(ck, "last_duration_s");
    const cJSON *written = cJSON_GetObjectItemCaseSensitive(ck, "written");
    /* Pushes, not gradients: the staleness histogram counts a push once
     * per variable in it. */
    if (cJSON_IsNumber(dropped)) *stale = dropped->valuedouble;
    else if (cJSON_IsNumber(stale_pushes)) *stale = stale_pushes->valuedouble;
    if (cJSON_IsNumber(dur) && cJSON_IsNumber(written) && written->valuedouble > 0)
        *ckpt_s = dur->valuedouble;
    cJSON_Delete(j);
}

bool qr__summaries_due(const train_summaries *t) {
    return t->out && qr__now_sec() - t->last_time >= t->every_secs;
}

int qr__summaries_write(train_summaries *t, qr_worker *w, int64_t step, double loss,
                        double examples, double lr, int nextra, const char *const *extra_tags,
                        const double *extra_values) {
    if (!t->out) return QR_OK;
    double now = qr__now_sec();
    double secs = now - t->last_time;
    double steps = (double)(step - t->last_step);
    double stale, ckpt_s;
    from_stats(w, &stale, &ckpt_s);
    enum { OWN = 6, MAX = OWN + QR_SUMMARIES_MAX_EXTRA };
    if (nextra < 0 || nextra > QR_SUMMARIES_MAX_EXTRA)
        return qr__fail(QR_EINVAL, "a summary point of %d scalars of the program's own: at most "
                        "%d", nextra, QR_SUMMARIES_MAX_EXTRA);
    const char *tags[MAX];
    double values[MAX];
    int n = 0;
#define ADD(tag, value) (tags[n] = (tag), values[n++] = (value))
    if (!isnan(loss)) ADD("loss", loss);
    if (secs > 0) {
        ADD("global_step/sec", steps / secs);
        if (examples >= 0) ADD("examples/sec", examples / secs);
    }
    if (stale >= 0) ADD("stale_gradients", stale);
    if (!isnan(lr)) ADD("learning_rate", lr);
    if (ckpt_s >= 0) ADD("checkpoint_duration_s", ckpt_s);
#undef ADD
    for (int i = 0; i < nextra; i++) tags[n] = extra_tags[i], values[n++] = extra_values[i];
    t->last_time = now;
    t->last_step = step;
    return qr_summary_write(t->out, step, n, tags, values);
}

int qr__summaries_point(train_summaries *t, qr_worker *w, int64_t step, double loss,
                        int64_t examples_per_step, bool final, double accuracy,
                        double test_loss) {
    if (!t->out || (!final && !qr__summaries_due(t))) return QR_OK;
    double lr = qr_optim_decayed_lr((float)t->lr, step, t->decay_rate, t->decay_steps,
                                    t->staircase);
    double examples = (double)(step - t->last_step) * (double)examples_per_step;
    const char *tags[2] = {"accuracy", "test_loss"};
    double values[2] = {accuracy, test_loss};
    return qr__summaries_write(t, w, step, loss, examples, lr, final ? 2 : 0, tags, values);
}

void qr__summaries_close(train_summaries *t) {
    qr_summary_close(t->out);
    t->out = NULL;
}

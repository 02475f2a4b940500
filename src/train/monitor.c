/*
 * monitor.c - the summaries, metrics page and progress figures of a
 * training loop of a program's own (include/quorum.h, qr_monitor_*;
 * quorum.torch's optimizer): the trainer's summary service (summaries.c)
 * and metrics page (worker_metrics.c), fed by the program's reports of
 * its steps instead of the trainer's loop.
 *
 * The rates are the trainer's: global steps per second, and examples per
 * second of the whole cluster, which the chief knows only through its own
 * batches: a global step takes replicas-to-aggregate batches in sync mode
 * and one in async mode (a step is one worker's push), so the examples of
 * a step are this worker's mean batch times that (the trainer's batch size
 * times the same). The clocks start at the first step reported, so that
 * the time to declare and initialize, and a restarted worker's join at a
 * later step, count in no rate.
 */
#include "train/summaries.h"
#include "train/worker_metrics.h"
#include "worker/worker.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct qr_monitor {
    qr_worker *w;
    int batches;                /* per global step (qr__worker_batches_per_step) */
    train_summaries summaries;  /* out NULL: no summaries */
    bool summaries_opened;
    worker_metrics metrics;     /* on: the page is served */
    double start;               /* the first step's report (0: none yet) */
    int64_t first_step, step;   /* global steps */
    double examples;            /* this worker's, since the first step */
    int64_t steps;              /* this worker's steps, since the first */
    double point_examples;      /* the same since the last summary point */
    int64_t point_steps;
    double loss_avg, lr;        /* NAN: none reported */
    int nextra;                 /* the program's own scalars */
    char *tags[QR_SUMMARIES_MAX_EXTRA];
    double values[QR_SUMMARIES_MAX_EXTRA];
};

/* The summary service's own tags: a scalar of the program's may not take one. */
static const char *const own_tags[] = {"global_step/sec", "examples/sec", "stale_gradients",
                                       "learning_rate", "checkpoint_duration_s"};

int qr_monitor_create(qr_monitor **out, qr_worker *w) {
    if (!out) return qr__fail(QR_EINVAL, "qr_monitor_create: out is NULL");
    *out = NULL;
    if (!w) return qr__fail(QR_EINVAL, "qr_monitor_create: worker is NULL");
    qr_monitor *m = qr__calloc(1, sizeof *m);
    if (!m) return QR_ENOMEM;
    m->w = w;
    m->batches = qr__worker_batches_per_step(w);
    m->loss_avg = m->lr = NAN;
    *out = m;
    return QR_OK;
}

int qr_monitor_open_summaries(qr_monitor *m, const char *logdir, double every_secs) {
    if (!m) return qr__fail(QR_EINVAL, "qr_monitor_open_summaries: monitor is NULL");
    if (!logdir || !logdir[0])
        return qr__fail(QR_EINVAL, "qr_monitor_open_summaries: logdir is empty");
    if (!(every_secs > 0) || isinf(every_secs))
        return qr__fail(QR_EINVAL, "qr_monitor_open_summaries: every_secs must be a number of "
                        "seconds > 0, not %g", every_secs);
    if (m->summaries_opened)
        return qr__fail(QR_EEXIST, "qr_monitor_open_summaries: this monitor writes summaries "
                        "already");
    int rc = qr__summaries_open(&m->summaries, logdir, every_secs, NULL);
    m->summaries_opened = !rc;
    return rc;
}

int qr_monitor_serve_metrics(qr_monitor *m, const char *bind, int port) {
    if (!m) return qr__fail(QR_EINVAL, "qr_monitor_serve_metrics: monitor is NULL");
    if (m->metrics.on)
        return qr__fail(QR_EEXIST, "qr_monitor_serve_metrics: this monitor serves its page "
                        "already");
    return qr__worker_metrics_serve(&m->metrics, bind && bind[0] ? bind : "127.0.0.1", port);
}

/* The examples of the global steps since the last point (< 0: not known). */
static double point_examples(const qr_monitor *m) {
    double per_step = m->point_steps ? m->point_examples / (double)m->point_steps
                                     : m->steps ? m->examples / (double)m->steps : 0;
    if (!(per_step > 0)) return -1;
    return (double)(m->step - m->summaries.last_step) * per_step * m->batches;
}

static int write_point(qr_monitor *m) {
    int rc = qr__summaries_write(&m->summaries, m->w, m->step, m->loss_avg, point_examples(m),
                                 m->lr, m->nextra, (const char *const *)m->tags, m->values);
    m->point_examples = 0;
    m->point_steps = 0;
    return rc;
}

static void add_loss(qr_monitor *m, double loss) {
    if (isfinite(loss)) m->loss_avg = isnan(m->loss_avg) ? loss : 0.95 * m->loss_avg + 0.05 * loss;
}

int qr_monitor_step(qr_monitor *m, int64_t global_step, int64_t examples, double loss,
                    double lr) {
    if (!m) return qr__fail(QR_EINVAL, "qr_monitor_step: monitor is NULL");
    if (global_step < 0 || examples < 0)
        return qr__fail(QR_EINVAL, "qr_monitor_step: global step %lld and examples %lld must "
                        "be >= 0", (long long)global_step, (long long)examples);
    if (!isnan(lr) && !(lr >= 0 && isfinite(lr)))
        return qr__fail(QR_EINVAL, "qr_monitor_step: learning rate %g is not a rate", lr);
    double now = qr__now_sec();
    if (!m->start) { /* the clocks start here (see the top of the file) */
        m->start = now;
        m->first_step = global_step;
        m->summaries.last_time = now;
        m->summaries.last_step = global_step;
    } else {
        m->examples += (double)examples;
        m->steps++;
        m->point_examples += (double)examples;
        m->point_steps++;
    }
    m->step = global_step;
    add_loss(m, loss);
    if (!isnan(lr)) m->lr = lr;
    if (m->metrics.on) {
        qr_worker_calls calls;
        qr__worker_calls(m->w, &calls);
        double steps_per_sec = 0, examples_per_sec = 0;
        qr_monitor_progress(m, NULL, NULL, &examples_per_sec);
        if (now > m->start) steps_per_sec = (double)(global_step - m->first_step) / (now - m->start);
        qr__worker_metrics_step(&m->metrics, global_step, m->loss_avg, steps_per_sec,
                                examples_per_sec, (int64_t)calls.stale_pushes);
        qr__worker_metrics_calls(&m->metrics, &calls.push, &calls.pull);
    }
    return qr__summaries_due(&m->summaries) ? write_point(m) : QR_OK;
}

static int check_tag(const char *tag) {
    size_t n = tag ? strlen(tag) : 0;
    if (n < 1 || n > 128)
        return qr__fail(QR_EINVAL, "qr_monitor_scalar: a tag is 1 to 128 characters, not %zu", n);
    for (const char *p = tag; *p; p++)
        if (*p < 0x20 || *p == 0x7f || *p == '"' || *p == '\\')
            return qr__fail(QR_EINVAL, "qr_monitor_scalar: tag '%s' has a quote, a backslash "
                            "or a control character", tag);
    for (size_t i = 0; i < sizeof own_tags / sizeof *own_tags; i++)
        if (!strcmp(tag, own_tags[i]))
            return qr__fail(QR_EINVAL, "qr_monitor_scalar: '%s' is a scalar of the summary "
                            "service's own", tag);
    return QR_OK;
}

int qr_monitor_scalar(qr_monitor *m, const char *tag, double value) {
    if (!m) return qr__fail(QR_EINVAL, "qr_monitor_scalar: monitor is NULL");
    int rc = check_tag(tag);
    if (rc) return rc;
    if (!isfinite(value))
        return qr__fail(QR_ENONFINITE, "qr_monitor_scalar: '%s' = %g is not a finite number",
                        tag, value);
    if (!strcmp(tag, "loss")) {
        add_loss(m, value);
        return QR_OK;
    }
    for (int i = 0; i < m->nextra; i++)
        if (!strcmp(m->tags[i], tag)) {
            m->values[i] = value;
            return QR_OK;
        }
    if (m->nextra == QR_SUMMARIES_MAX_EXTRA)
        return qr__fail(QR_EINVAL, "qr_monitor_scalar: '%s' would be a %dth tag: at most %d",
                        tag, QR_SUMMARIES_MAX_EXTRA + 1, QR_SUMMARIES_MAX_EXTRA);
    if (!(m->tags[m->nextra] = qr__strdup(tag))) return QR_ENOMEM;
    m->values[m->nextra++] = value;
    return QR_OK;
}

int qr_monitor_progress(const qr_monitor *m, int64_t *global_step, double *loss,
                        double *examples_per_sec) {
    if (!m) return qr__fail(QR_EINVAL, "qr_monitor_progress: monitor is NULL");
    double secs = m->start ? qr__now_sec() - m->start : 0;
    double per_step = m->steps ? m->examples / (double)m->steps : 0;
    if (global_step) *global_step = m->step;
    if (loss) *loss = m->loss_avg;
    if (examples_per_sec)
        *examples_per_sec = secs > 0 ? (double)(m->step - m->first_step) * per_step *
                                           m->batches / secs
                                     : 0;
    return QR_OK;
}

int qr_monitor_flush(qr_monitor *m) {
    if (!m) return qr__fail(QR_EINVAL, "qr_monitor_flush: monitor is NULL");
    return m->start ? write_point(m) : QR_OK;
}

void qr_monitor_free(qr_monitor *m) {
    if (!m) return;
    qr__summaries_close(&m->summaries);
    qr__worker_metrics_stop(&m->metrics);
    for (int i = 0; i < m->nextra; i++) free(m->tags[i]);
    free(m);
}

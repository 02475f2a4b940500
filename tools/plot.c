/*
 * plot.c - `quorum plot LOGDIR -o FILE.png`: the loss and the throughput
 * of a run against the global step, for people without TensorBoard. Reads
 * LOGDIR/summaries.jsonl (src/summary/) and has gnuplot (Debian's
 * gnuplot-nox) draw them: the points go to gnuplot's stdin as inline data,
 * so nothing is left behind but the picture.
 */
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static int usage(FILE *f, int status) {
    fprintf(f, "usage: quorum plot LOGDIR -o FILE.png\n\n"
               "Draw the loss and examples/sec of a run (LOGDIR/summaries.jsonl, written by\n"
               "the chief with --logdir, quorum's or a program's) against the global step\n"
               "into a PNG, with gnuplot; a run that recorded no loss gets examples/sec alone.\n");
    return status;
}

typedef struct point {
    double step, loss, examples_per_sec; /* NAN: not in the point */
} point;

/* The points of summaries.jsonl that have a loss or examples/sec (a
 * program's job gives no loss unless told it), in file order. */
static int read_points(const char *logdir, point **out, int *n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/summaries.jsonl", logdir);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "quorum plot: cannot read %s: %s (was the run given --logdir %s?)\n", path,
                strerror(errno), logdir);
        return 1;
    }
    point *pts = NULL;
    int count = 0, cap = 0, bad = 0;
    char *line = NULL;
    size_t len = 0;
    while (getline(&line, &len, f) > 0) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(j, "step");
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
        const cJSON *eps = cJSON_GetObjectItemCaseSensitive(j, "examples/sec");
        if (!cJSON_IsNumber(step) || (!cJSON_IsNumber(loss) && !cJSON_IsNumber(eps))) {
            bad++;
        } else {
            if (count == cap) {
                cap = cap ? 2 * cap : 256;
                point *grown = realloc(pts, (size_t)cap * sizeof *grown);
                if (!grown) break;
                pts = grown;
            }
            pts[count++] = (point){step->valuedouble,
                                   cJSON_IsNumber(loss) ? loss->valuedouble : NAN,
                                   cJSON_IsNumber(eps) ? eps->valuedouble : NAN};
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    if (bad) fprintf(stderr, "quorum plot: %d line(s) of %s are not summary points; skipped\n",
                     bad, path);
    if (!count) {
        fprintf(stderr, "quorum plot: %s has no summary points yet\n", path);
        free(pts);
        return 1;
    }
    *out = pts;
    *n = count;
    return 0;
}

/* One panel: the points that have the value (gnuplot refuses a plot of none). */
static void panel(FILE *g, const point *p, int n, bool loss) {
    const char *title = loss ? "loss" : "examples/sec";
    fprintf(g, "set ylabel '%s'\nplot '-' using 1:2 with linespoints title '%s'\n", title, title);
    for (int i = 0; i < n; i++) {
        double v = loss ? p[i].loss : p[i].examples_per_sec;
        if (!isnan(v)) fprintf(g, "%.0f %.9g\n", p[i].step, v);
    }
    fprintf(g, "e\n");
}

static int draw(const point *p, int n, const char *logdir, const char *png) {
    int with_loss = 0, with_rate = 0;
    for (int i = 0; i < n; i++) {
        with_loss += !isnan(p[i].loss);
        with_rate += !isnan(p[i].examples_per_sec);
    }
    FILE *g = popen("gnuplot", "w");
    if (!g) {
        fprintf(stderr, "quorum plot: cannot run gnuplot: %s (apt-get install gnuplot-nox)\n",
                strerror(errno));
        return 1;
    }
    /* The data go inline once per plot ("-"), as gnuplot wants. */
    fprintf(g, "set terminal pngcairo size 1000,700\nset output '%s'\n"
               "set multiplot layout %d,1 title \"%s\"\nset grid\nset xlabel 'global step'\n",
            png, (with_loss > 0) + (with_rate > 0), logdir);
    if (with_loss) panel(g, p, n, true);
    if (with_rate) panel(g, p, n, false);
    fprintf(g, "unset multiplot\n");
    int status = pclose(g);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "quorum plot: gnuplot failed%s (is gnuplot-nox installed? can %s be "
                "written?)\n", WIFEXITED(status) && WEXITSTATUS(status) == 127 ?
                               ": not found" : "", png);
        return 1;
    }
    printf("quorum plot: %d points of %s drawn into %s\n", n, logdir, png);
    return 0;
}

int cmd_plot(int argc, char **argv) {
    const char *logdir = NULL, *png = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout, 0);
        if (!strcmp(argv[i], "-o") && i + 1 < argc) png = argv[++i];
        else if (!logdir && argv[i][0] != '-') logdir = argv[i];
        else return usage(stderr, 2);
    }
    if (!logdir || !png) return usage(stderr, 2);
    if (strchr(png, '\'') || strchr(logdir, '"')) {
        fprintf(stderr, "quorum plot: quotes in file names are not supported\n");
        return 2;
    }
    point *p;
    int n;
    if (read_points(logdir, &p, &n)) return 1;
    int rc = draw(p, n, logdir, png);
    free(p);
    return rc;
}

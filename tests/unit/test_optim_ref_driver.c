/*
 * test_optim_ref_driver.c - runs optimizer steps given in a file, for the
 * reference test tests/optim_ref/check_optim.py (which writes the input,
 * computes the same steps with PyTorch or its own formulas and compares).
 *
 *   test_optim_ref_driver IN OUT
 *
 * IN, little-endian (written by check_optim.py):
 *   "QROPTIN1"
 *   u32 npairs, npairs x (u32 len, len bytes "key=value")   qr_config options
 *   i64 rows, dim, steps
 *   f32 var[rows*dim]                                        initial value
 *   steps x (i64 kind: 0 dense, 1 sparse; f32 lr (< 0: optimizer's);
 *            i64 global_step; i64 nidx (sparse only) and i64 idx[nidx];
 *            f32 grad[(dense: rows, sparse: nidx) * dim])
 * OUT:
 *   "QROPTOUT"
 *   steps x f32 var[rows*dim]                                var after each step
 *   u32 nslots, nslots x (u32 len, name, i64 n, f32 data[n]) final slots
 * Exit status 0, or 1 with a message on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim.h"

static FILE *in;

static void die(const char *what) {
    fprintf(stderr, "test_optim_ref_driver: %s: %s\n", what, qr_last_error());
    exit(1);
}

static void rd(void *p, size_t size, size_t n) {
    if (n && fread(p, size, n, in) != n) die("short input");
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory");
    return p;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s IN OUT\n", argv[0]);
        return 2;
    }
    in = fopen(argv[1], "rb");
    if (!in) die("cannot open input");
    char magic[8];
    rd(magic, 1, 8);
    if (memcmp(magic, "QROPTIN1", 8)) die("bad magic");
    qr_config *cfg;
    if (qr_config_new(&cfg)) die("config");
    uint32_t npairs;
    rd(&npairs, 4, 1);
    for (uint32_t i = 0; i < npairs; i++) {
        uint32_t len;
        rd(&len, 4, 1);
        char *kv = xmalloc(len + 1);
        rd(kv, 1, len);
        kv[len] = 0;
        char *eq = strchr(kv, '=');
        if (!eq) die("option without '='");
        *eq = 0;
        if (qr_config_set(cfg, kv, eq + 1)) die(kv);
        free(kv);
    }
    qr_optim *opt;
    if (qr_optim_create(&opt, cfg)) die("qr_optim_create");
    int64_t rows, dim, steps;
    rd(&rows, 8, 1);
    rd(&dim, 8, 1);
    rd(&steps, 8, 1);
    int64_t n = rows * dim;
    float *var = xmalloc((size_t)n * 4), *grad = xmalloc((size_t)n * 4);
    rd(var, 4, (size_t)n);
    qr_optim_slots *s;
    if (qr_optim_slots_create(opt, rows, dim, &s)) die("qr_optim_slots_create");

    FILE *out = fopen(argv[2], "wb");
    if (!out) die("cannot open output");
    fwrite("QROPTOUT", 1, 8, out);
    for (int64_t step = 0; step < steps; step++) {
        int64_t kind, gstep, nidx = 0;
        float lr;
        rd(&kind, 8, 1);
        rd(&lr, 4, 1);
        rd(&gstep, 8, 1);
        if (kind == 0) {
            rd(grad, 4, (size_t)n);
            if (qr_optim_apply_dense(opt, s, var, grad, n, lr, gstep)) die("apply_dense");
        } else {
            rd(&nidx, 8, 1);
            int64_t *idx = xmalloc((size_t)nidx * 8);
            float *g = xmalloc((size_t)(nidx * dim) * 4);
            rd(idx, 8, (size_t)nidx);
            rd(g, 4, (size_t)(nidx * dim));
            if (qr_optim_apply_sparse(opt, s, var, rows, dim, idx, g, nidx, lr, gstep))
                die("apply_sparse");
            free(idx);
            free(g);
        }
        fwrite(var, 4, (size_t)n, out);
    }
    uint32_t nslots = (uint32_t)qr_optim_slots_count(s);
    fwrite(&nslots, 4, 1, out);
    for (int i = 0; i < (int)nslots; i++) {
        const char *name;
        float *data;
        int64_t len;
        qr_optim_slot(s, i, &name, &data, &len);
        uint32_t nl = (uint32_t)strlen(name);
        fwrite(&nl, 4, 1, out);
        fwrite(name, 1, nl, out);
        fwrite(&len, 8, 1, out);
        fwrite(data, 4, (size_t)len, out);
    }
    if (fclose(out)) die("write error");
    fclose(in);
    free(var);
    free(grad);
    qr_optim_slots_free(s);
    qr_optim_free(opt);
    qr_config_free(cfg);
    return 0;
}

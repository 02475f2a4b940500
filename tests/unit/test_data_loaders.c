/*
 * test_data_loaders.c - dataset loaders and initializers: the real data
 * loads with the right sizes, and every kind of bad file (written here to a
 * temporary directory) gives its own status and a message naming the file.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/common.h"
#include "data/data.h"
#include "data/digits.h"
#include "data/idx.h"
#include "data/libsvm.h"
#include "common/init.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"
#define HEART_SCALE "/usr/share/doc/liblinear-tools/examples/heart_scale"

static char tmpdir[256];
static char paths[64][512];
static int npaths;

/* Path of `name` in the temporary directory, remembered for cleanup. */
static const char *tmp_path(const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    for (int i = 0; i < npaths; i++)
        if (!strcmp(paths[i], p)) return paths[i];
    assert_true(npaths < 64);
    strcpy(paths[npaths], p);
    return paths[npaths++];
}

static const char *write_file(const char *name, const void *data, size_t len) {
    const char *p = tmp_path(name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
    return p;
}

static const char *write_text(const char *name, const char *text) {
    return write_file(name, text, strlen(text));
}

static const char *write_gz(const char *name, const void *data, size_t len) {
    const char *p = tmp_path(name);
    gzFile f = gzopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, data, (unsigned)len), (int)len);
    gzclose(f);
    return p;
}

/* A valid IDX images file: n images of rows x cols, pixel value = index. */
static size_t make_images(unsigned char *buf, int n, int rows, int cols) {
    unsigned char hdr[16] = {0, 0, 8, 3, 0, 0, 0, (unsigned char)n, 0, 0, 0,
                             (unsigned char)rows, 0, 0, 0, (unsigned char)cols};
    memcpy(buf, hdr, 16);
    for (int i = 0; i < n * rows * cols; i++) buf[16 + i] = (unsigned char)(i * 17);
    return 16 + (size_t)(n * rows * cols);
}

static size_t make_labels(unsigned char *buf, int n, int start) {
    unsigned char hdr[8] = {0, 0, 8, 1, 0, 0, 0, (unsigned char)n};
    memcpy(buf, hdr, 8);
    for (int i = 0; i < n; i++) buf[8 + i] = (unsigned char)(start + i);
    return 8 + (size_t)n;
}

/* The failure has `status` and its message mentions `needle`. */
static void expect_error(int rc, int status, const char *needle) {
    if (rc != status || !strstr(qr_last_error(), needle))
        print_error("got %s '%s', expected %s mentioning '%s'\n", qr_status_name(rc),
                    qr_last_error(), qr_status_name(status), needle);
    assert_int_equal(rc, status);
    assert_non_null(strstr(qr_last_error(), needle));
}

static int setup(void **state) {
    (void)state;
    strcpy(tmpdir, "/tmp/qr_test_data_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < npaths; i++) unlink(paths[i]);
    char sub[512];
    snprintf(sub, sizeof sub, "%s/idx", tmpdir);
    rmdir(sub);
    rmdir(tmpdir);
    return 0;
}

/* ---- digits ------------------------------------------------------------ */

static void check_digits_split(const qr_dataset *train, const qr_dataset *test) {
    assert_int_equal(train->n + test->n, 1797);
    assert_int_equal(test->n, 359); /* round(0.2 * 1797) */
    assert_int_equal(train->dim, 64);
    assert_int_equal(test->dim, 64);
    assert_int_equal(train->nclasses, 10);
    assert_int_equal(test->nclasses, 10);
    const qr_dataset *ds[2] = {train, test};
    float maxpix = 0, minpix = 1;
    int seen[10] = {0};
    for (int s = 0; s < 2; s++) {
        for (int64_t i = 0; i < ds[s]->n; i++) {
            assert_true(ds[s]->y[i] >= 0 && ds[s]->y[i] < 10);
            seen[ds[s]->y[i]]++;
        }
        for (int64_t i = 0; i < ds[s]->n * 64; i++) {
            maxpix = fmaxf(maxpix, ds[s]->x[i]);
            minpix = fminf(minpix, ds[s]->x[i]);
        }
    }
    assert_true(maxpix == 1.0f);
    assert_true(minpix == 0.0f);
    for (int c = 0; c < 10; c++) assert_in_range(seen[c], 170, 190); /* ~180 each */
}

static void test_digits_load_and_split(void **state) {
    (void)state;
    qr_dataset train, test, train2, test2, all;
    /* Found through the compiled-in source path (QR_DATA_DIR unset). */
    unsetenv("QR_DATA_DIR");
    assert_int_equal(qr_data_load("digits", NULL, &train, &test), QR_OK);
    check_digits_split(&train, &test);

    /* The split is the same on every load (fixed seed, not a training seed). */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/data", getenv("QR_SOURCE_DIR"));
    assert_int_equal(qr_data_load("digits", dir, &train2, &test2), QR_OK);
    assert_int_equal(train2.n, train.n);
    assert_memory_equal(train.x, train2.x, (size_t)(train.n * 64) * sizeof(float));
    assert_memory_equal(test.y, test2.y, (size_t)test.n * sizeof(int32_t));
    qr_dataset_free(&train2);
    qr_dataset_free(&test2);

    /* train and test partition the file, each keeping file order. */
    char path[600];
    snprintf(path, sizeof path, "%s/digits.csv.gz", dir);
    assert_int_equal(qr_digits_load_csv(path, 65, &all), QR_OK);
    assert_int_equal(all.n, 1797);
    assert_int_equal(all.nclasses, 10);
    /* First row of the file: 0,0,5,13,9,1,0,0,... label 0. */
    assert_true(all.x[2] == 5.0f / 16 && all.x[3] == 13.0f / 16 && all.y[0] == 0);
    int64_t a = 0, b = 0;
    for (int64_t i = 0; i < all.n; i++) {
        const float *row = all.x + i * 64;
        if (a < train.n && !memcmp(row, train.x + a * 64, 64 * sizeof(float)) &&
            all.y[i] == train.y[a])
            a++;
        else if (b < test.n && !memcmp(row, test.x + b * 64, 64 * sizeof(float)) &&
                 all.y[i] == test.y[b])
            b++;
        else
            fail_msg("row %lld of the file is in neither split", (long long)i);
    }
    assert_int_equal(a, train.n);
    assert_int_equal(b, test.n);
    qr_dataset_free(&all);
    qr_dataset_free(&train);
    qr_dataset_free(&test);
    qr_dataset_free(&train); /* freeing twice is harmless: the struct was zeroed */
    qr_dataset_free(NULL);

    /* QR_DATA_DIR is used when data_dir is not given; data_dir wins over it. */
    setenv("QR_DATA_DIR", tmpdir, 1);
    expect_error(qr_data_load("digits", NULL, &train, &test), QR_ENOTFOUND, tmpdir);
    assert_null(train.x);
    assert_int_equal(qr_data_load("digits", dir, &train, &test), QR_OK);
    qr_dataset_free(&train);
    qr_dataset_free(&test);
    unsetenv("QR_DATA_DIR");
}

static void test_csv_errors(void **state) {
    (void)state;
    qr_dataset d, train, test;
    /* A small valid file with CRLF and a blank line, loaded as a PATH spec. */
    const char *ok = write_text("small.csv", "0,16,8,1\r\n\r\n4,4,4,0\n16,0,0,2\n1,2,3,1\n2,2,2,0\n");
    assert_int_equal(qr_digits_load_csv(ok, 0, &d), QR_OK);
    assert_int_equal(d.n, 5);
    assert_int_equal(d.dim, 3);
    assert_int_equal(d.nclasses, 3);
    assert_true(d.x[1] == 1.0f && d.x[2] == 0.5f && d.y[2] == 2);
    qr_dataset_free(&d);
    assert_int_equal(qr_data_load(ok, NULL, &train, &test), QR_OK);
    assert_int_equal(train.n, 4);
    assert_int_equal(test.n, 1);
    assert_int_equal(train.nclasses, 3);
    qr_dataset_free(&train);
    qr_dataset_free(&test);

    const char *p = write_text("bad_field.csv", "0,1,2,1\n0,x1,2,1\n");
    expect_error(qr_digits_load_csv(p, 0, &d), QR_EINVAL, "line 2 column 2");
    assert_non_null(strstr(qr_last_error(), p));
    assert_null(d.x);
    p = write_text("empty_field.csv", "0,,2,1\n");
    expect_error(qr_digits_load_csv(p, 0, &d), QR_EINVAL, "line 1 column 2");
    p = write_text("columns.csv", "0,1,2,1\n0,1,2\n");
    expect_error(qr_digits_load_csv(p, 0, &d), QR_ESHAPE, "line 2 has 3 columns, expected 4");
    expect_error(qr_digits_load_csv(p, 65, &d), QR_ESHAPE, "line 1 has 4 columns, expected 65");
    p = write_text("pixel.csv", "0,17,2,1\n");
    expect_error(qr_digits_load_csv(p, 0, &d), QR_EINVAL, "outside [0, 16]");
    p = write_text("label.csv", "0,1,2,1.5\n");
    expect_error(qr_digits_load_csv(p, 0, &d), QR_EINVAL, "label 1.5");
    p = write_text("neglabel.csv", "0,1,2,-1\n");
    expect_error(qr_digits_load_csv(p, 0, &d), QR_EINVAL, "label -1");
    p = write_text("nan.csv", "0,nan,2,1\n");
    expect_error(qr_digits_load_csv(p, 0, &d), QR_EINVAL, "not a number");
    p = write_text("empty.csv", "\n\n");
    expect_error(qr_digits_load_csv(p, 0, &d), QR_EINVAL, "no examples");
    p = write_file("nul.csv", "0,1\0,2,1\n", 9);
    expect_error(qr_digits_load_csv(p, 0, &d), QR_EINVAL, "NUL");
    expect_error(qr_digits_load_csv(tmp_path("missing.csv"), 0, &d), QR_ENOTFOUND, "missing.csv");
    /* digits needs labels below 10; a generic csv infers the classes. */
    char dir[300];
    snprintf(dir, sizeof dir, "%s", tmpdir);
    char row[200] = "";
    for (int i = 0; i < 64; i++) strcat(row, "1,");
    strcat(row, "10\n");
    write_text("digits.csv", row);
    expect_error(qr_data_load("digits", dir, &train, &test), QR_EINVAL, "label 10");
    /* A single example cannot be split. */
    p = write_text("one.csv", "1,2,0\n");
    expect_error(qr_data_load(p, NULL, &train, &test), QR_EINVAL, "one.csv");
    expect_error(qr_data_load("nonsense", NULL, &train, &test), QR_EINVAL, "nonsense");
}

/* ---- IDX ----------------------------------------------------------------- */

static void test_idx_valid(void **state) {
    (void)state;
    unsigned char img[256], lab[64];
    size_t ni = make_images(img, 3, 2, 2), nl = make_labels(lab, 3, 0);
    float *x;
    int32_t *y;
    int64_t n, dim;
    const char *pi = write_file("ok-images", img, ni);
    assert_int_equal(qr_idx_load_images(pi, &x, &n, &dim), QR_OK);
    assert_int_equal(n, 3);
    assert_int_equal(dim, 4);
    for (int i = 0; i < 12; i++) assert_true(x[i] == (float)(unsigned char)(i * 17) / 255.0f);
    assert_true(x[11] > 0.7f);
    free(x);
    /* gzip-compressed, same content */
    pi = write_gz("ok-images.gz", img, ni);
    assert_int_equal(qr_idx_load_images(pi, &x, &n, &dim), QR_OK);
    assert_int_equal(n * dim, 12);
    free(x);
    const char *pl = write_gz("ok-labels.gz", lab, nl);
    assert_int_equal(qr_idx_load_labels(pl, &y, &n), QR_OK);
    assert_int_equal(n, 3);
    assert_int_equal(y[2], 2);
    free(y);

    /* A directory as a PATH spec: train-/t10k- files, gz or not. */
    char dir[300];
    snprintf(dir, sizeof dir, "%s/idx", tmpdir);
    assert_int_equal(mkdir(dir, 0700), 0);
    write_gz("idx/train-images-idx3-ubyte.gz", img, ni);
    write_gz("idx/train-labels-idx1-ubyte.gz", lab, nl);
    ni = make_images(img, 2, 2, 2);
    write_file("idx/t10k-images-idx3-ubyte", img, ni);
    nl = make_labels(lab, 2, 4);
    write_file("idx/t10k-labels-idx1-ubyte", lab, nl);
    qr_dataset train, test;
    assert_int_equal(qr_data_load(dir, NULL, &train, &test), QR_OK);
    assert_int_equal(train.n, 3);
    assert_int_equal(test.n, 2);
    assert_int_equal(train.dim, 4);
    assert_int_equal(train.nclasses, 6); /* largest label 5 */
    assert_int_equal(test.nclasses, 6);
    qr_dataset_free(&train);
    qr_dataset_free(&test);
    /* As "fashion-mnist" (10 classes) the label 5 is fine... */
    assert_int_equal(qr_data_load("fashion-mnist", dir, &train, &test), QR_OK);
    assert_int_equal(train.nclasses, 10);
    qr_dataset_free(&train);
    qr_dataset_free(&test);
    /* ...but 10 is not. */
    nl = make_labels(lab, 2, 9);
    write_file("idx/t10k-labels-idx1-ubyte", lab, nl);
    expect_error(qr_data_load("fashion-mnist", dir, &train, &test), QR_EINVAL, "label 10");
    assert_null(train.x);
    /* Label and image counts must match. */
    nl = make_labels(lab, 3, 0);
    write_file("idx/t10k-labels-idx1-ubyte", lab, nl);
    expect_error(qr_data_load(dir, NULL, &train, &test), QR_ESHAPE, "2 images but 3 labels");
    unlink(tmp_path("idx/t10k-labels-idx1-ubyte"));
    expect_error(qr_data_load(dir, NULL, &train, &test), QR_ENOTFOUND, "t10k-labels-idx1-ubyte");
}

static void test_idx_errors(void **state) {
    (void)state;
    unsigned char img[256], lab[64];
    size_t ni = make_images(img, 3, 2, 2), nl = make_labels(lab, 3, 0);
    float *x = (float *)1;
    int32_t *y;
    int64_t n, dim;

    unsigned char bad[256];
    memcpy(bad, img, ni);
    bad[3] = 0x04; /* 4 dims: the header no longer describes the data */
    bad[2] = 0x09; /* and signed bytes */
    const char *p = write_file("badmagic", bad, ni);
    expect_error(qr_idx_load_images(p, &x, &n, &dim), QR_EINVAL, "bad magic number 0x00000904");
    assert_non_null(strstr(qr_last_error(), p));
    assert_null(x);
    /* A labels file is not an images file, and the other way round. */
    p = write_file("labels-as-images", lab, nl);
    expect_error(qr_idx_load_images(p, &x, &n, &dim), QR_EINVAL, "bad magic");
    p = write_file("images-as-labels", img, ni);
    expect_error(qr_idx_load_labels(p, &y, &n), QR_EINVAL, "bad magic");
    /* Truncated: payload, header, magic; and a cut gzip stream. */
    p = write_file("trunc-payload", img, ni - 1);
    expect_error(qr_idx_load_images(p, &x, &n, &dim), QR_EIO, "truncated");
    p = write_file("trunc-labels", lab, nl - 2);
    expect_error(qr_idx_load_labels(p, &y, &n), QR_EIO, "truncated");
    p = write_file("trunc-header", img, 10);
    expect_error(qr_idx_load_images(p, &x, &n, &dim), QR_EIO, "truncated");
    p = write_file("trunc-magic", img, 3);
    expect_error(qr_idx_load_images(p, &x, &n, &dim), QR_EIO, "truncated");
    p = write_file("empty", img, 0);
    expect_error(qr_idx_load_images(p, &x, &n, &dim), QR_EIO, "truncated");
    {
        /* gzip a larger file, then cut the compressed stream in half */
        static unsigned char big[16 + 200 * 28 * 28];
        size_t nb = 16 + 200 * 28 * 28;
        memcpy(big, (unsigned char[16]){0, 0, 8, 3, 0, 0, 0, 200, 0, 0, 0, 28, 0, 0, 0, 28}, 16);
        qr_rng rng;
        qr_rng_seed(&rng, 1);
        for (size_t i = 16; i < nb; i++) big[i] = (unsigned char)qr_rng_below(&rng, 256);
        const char *gz = write_gz("big.gz", big, nb);
        assert_int_equal(qr_idx_load_images(gz, &x, &n, &dim), QR_OK);
        assert_int_equal(n, 200);
        assert_int_equal(dim, 784);
        free(x);
        FILE *f = fopen(gz, "rb");
        static unsigned char comp[16 + 200 * 28 * 28 + 1024];
        size_t nc = fread(comp, 1, sizeof comp, f);
        fclose(f);
        p = write_file("cut.gz", comp, nc / 2);
        expect_error(qr_idx_load_images(p, &x, &n, &dim), QR_EIO, "cut.gz");
        comp[nc / 2] ^= 0xff; /* corrupt the middle: CRC or inflate error */
        p = write_file("corrupt.gz", comp, nc);
        expect_error(qr_idx_load_images(p, &x, &n, &dim), QR_EIO, "corrupt.gz");
    }
    /* Extra data after what the header promises. */
    memcpy(bad, img, ni);
    bad[ni] = 7;
    p = write_file("extra", bad, ni + 1);
    expect_error(qr_idx_load_images(p, &x, &n, &dim), QR_EINVAL, "extra data");
    /* A zero dimension, and a header claiming far more than the file holds:
     * fails as truncated without allocating the claimed size first. */
    memcpy(bad, img, ni);
    bad[11] = 0;
    p = write_file("zerodim", bad, ni);
    expect_error(qr_idx_load_images(p, &x, &n, &dim), QR_EINVAL, "dimension 1 is 0");
    memcpy(bad, img, ni);
    memset(bad + 4, 0xff, 4); /* 2^24 - 1 images of 255 x 255: just under 2^40 bytes */
    bad[4] = 0;
    bad[11] = 0xff;
    bad[15] = 0xff;
    p = write_file("huge", bad, ni);
    expect_error(qr_idx_load_images(p, &x, &n, &dim), QR_EIO, "truncated");
    memset(bad + 8, 0xff, 8);
    p = write_file("huger", bad, ni);
    expect_error(qr_idx_load_images(p, &x, &n, &dim), QR_EINVAL, "2^40");
    expect_error(qr_idx_load_labels(tmp_path("nope"), &y, &n), QR_ENOTFOUND, "nope");
    expect_error(qr_idx_load_labels(tmpdir, &y, &n), QR_EIO, tmpdir);
}

static void test_fashion_mnist(void **state) {
    (void)state;
    if (access(FASHION_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0) {
        print_message("note: %s absent (package dataset-fashion-mnist); fashion-mnist load "
                      "not tested\n", FASHION_DIR);
        return;
    }
    qr_dataset train, test;
    assert_int_equal(qr_data_load("fashion-mnist", NULL, &train, &test), QR_OK);
    assert_int_equal(train.n, 60000);
    assert_int_equal(test.n, 10000);
    assert_int_equal(train.dim, 784);
    assert_int_equal(test.dim, 784);
    assert_int_equal(train.nclasses, 10);
    assert_int_equal(train.y[0], 9); /* the first image is an ankle boot */
    assert_int_equal(test.y[0], 9);
    int counts[10] = {0};
    for (int64_t i = 0; i < train.n; i++) {
        assert_true(train.y[i] >= 0 && train.y[i] < 10);
        counts[train.y[i]]++;
    }
    for (int c = 0; c < 10; c++) assert_int_equal(counts[c], 6000);
    float mx = 0, mn = 1;
    for (int64_t i = 0; i < train.n * train.dim; i++) {
        mx = fmaxf(mx, train.x[i]);
        mn = fminf(mn, train.x[i]);
    }
    assert_true(mx == 1.0f && mn == 0.0f);
    qr_dataset_free(&train);
    qr_dataset_free(&test);
}

/* ---- libsvm -------------------------------------------------------------- */

static void test_libsvm(void **state) {
    (void)state;
    qr_sparse_dataset d;
    const char *p = write_text("small.svm",
                               "+1 1:0.5 3:-2 \n"
                               "\n"
                               "-1\t2:1e-1\t10:4\r\n"
                               "0\n"
                               "2.5 7:3");
    assert_int_equal(qr_libsvm_load(p, &d), QR_OK);
    assert_int_equal(d.n, 4);
    assert_int_equal(d.dim, 10);
    assert_int_equal(d.nnz, 5);
    const int64_t row_ptr[] = {0, 2, 4, 4, 5};
    const int32_t col[] = {0, 2, 1, 9, 6};
    const float val[] = {0.5f, -2, 0.1f, 4, 3};
    const float label[] = {1, -1, 0, 2.5f};
    assert_memory_equal(d.row_ptr, row_ptr, sizeof row_ptr);
    assert_memory_equal(d.col, col, sizeof col);
    assert_memory_equal(d.val, val, sizeof val);
    assert_memory_equal(d.label, label, sizeof label);
    qr_sparse_dataset_free(&d);
    qr_sparse_dataset_free(&d);
    qr_sparse_dataset_free(NULL);

    /* Each error names the file and the line (blank lines count). */
    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"1 1:1 3:2 2:5\n", "line 1: feature index 2 after 3"},
        {"1 1:1\n\n1 2:1 2:1\n", "line 3: feature index 2 after 2"},
        {"1 0:1\n", "line 1: feature index 0 is out of range"},
        {"1 -3:1\n", "line 1: feature index -3"},
        {"1 99999999999:1\n", "out of range"},
        {"1 1:\n", "line 1: value of feature 1"},
        {"1 1:abc\n", "value of feature 1 'abc'"},
        {"1 1:inf\n", "not a finite float32 number"},
        {"1 1:1e39\n", "'1e39' is not a finite float32 number"},
        {"1e39 1:1\n", "label '1e39'"},
        {"yes 1:1\n", "line 1: label 'yes"},
        {"1 1:1\n2 x:1\n", "line 2: 'x:1' is not idx:value"},
        {"1 1 2\n", "is not idx:value"},
        {"1 1:2:3\n", "value of feature 1"},
        {"\n \n", "no examples"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "bad%zu.svm", i);
        p = write_text(name, bad[i].text);
        expect_error(qr_libsvm_load(p, &d), QR_EINVAL, bad[i].needle);
        assert_non_null(strstr(qr_last_error(), p));
        assert_null(d.row_ptr);
    }
    expect_error(qr_libsvm_load(tmp_path("absent.svm"), &d), QR_ENOTFOUND, "absent.svm");

    /* gzip works too. */
    const char *text = "1 4:1\n-1 1:2\n";
    p = write_gz("small.svm.gz", text, strlen(text));
    assert_int_equal(qr_libsvm_load(p, &d), QR_OK);
    assert_int_equal(d.n, 2);
    assert_int_equal(d.dim, 4);
    qr_sparse_dataset_free(&d);

    if (access(HEART_SCALE, R_OK) != 0) {
        print_message("note: %s absent (package liblinear-tools); not tested\n", HEART_SCALE);
        return;
    }
    assert_int_equal(qr_libsvm_load(HEART_SCALE, &d), QR_OK);
    assert_int_equal(d.n, 270);
    assert_int_equal(d.dim, 13);
    assert_true(d.label[0] == 1.0f && d.label[1] == -1.0f);
    assert_int_equal(d.row_ptr[1], 12); /* the first line lists features 1-10, 12, 13 */
    assert_true(fabsf(d.val[0] - 0.708333f) < 1e-6f);
    for (int64_t i = 0; i < d.n; i++) assert_true(d.label[i] == 1.0f || d.label[i] == -1.0f);
    qr_sparse_dataset_free(&d);
}

/* ---- initializers -------------------------------------------------------- */

static void moments(const float *v, int64_t n, double *mean, double *std, float *lo, float *hi) {
    double s = 0, ss = 0;
    *lo = INFINITY;
    *hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        s += v[i];
        *lo = fminf(*lo, v[i]);
        *hi = fmaxf(*hi, v[i]);
    }
    *mean = s / (double)n;
    for (int64_t i = 0; i < n; i++) ss += (v[i] - *mean) * (v[i] - *mean);
    *std = sqrt(ss / (double)n);
}

static void test_init(void **state) {
    (void)state;
    enum { N = 100000 };
    float *v = malloc(N * sizeof(float)), *w = malloc(N * sizeof(float));
    int64_t shape1[1] = {N};
    double mean, std;
    float lo, hi;

    assert_int_equal(qr_init_fill(v, N, 1, shape1, "constant:1", 1), QR_OK);
    assert_int_equal(qr_init_fill(v, N, 1, shape1, "zeros", 1), QR_OK);
    moments(v, N, &mean, &std, &lo, &hi);
    assert_true(lo == 0 && hi == 0);
    assert_int_equal(qr_init_fill(v, N, 0, NULL, "constant:-2.5", 1), QR_OK);
    moments(v, N, &mean, &std, &lo, &hi);
    assert_true(lo == -2.5f && hi == -2.5f);

    assert_int_equal(qr_init_fill(v, N, 1, shape1, "uniform:-0.5,1.5", 7), QR_OK);
    moments(v, N, &mean, &std, &lo, &hi);
    assert_true(lo >= -0.5f && hi < 1.5f);
    assert_true(lo < -0.49f && hi > 1.49f); /* fills the range */
    assert_true(fabs(mean - 0.5) < 0.01);
    assert_true(fabs(std - 2 / sqrt(12.0)) < 0.01);

    assert_int_equal(qr_init_fill(v, N, 1, shape1, "normal:1,2", 7), QR_OK);
    moments(v, N, &mean, &std, &lo, &hi);
    assert_true(fabs(mean - 1) < 0.03);  /* std error 2/sqrt(1e5) = 0.006 */
    assert_true(fabs(std - 2) < 0.03);
    assert_true(lo < 1 - 2 * 3 && hi > 1 + 2 * 3); /* tails present: not truncated */

    assert_int_equal(qr_init_fill(v, N, 1, shape1, "truncated_normal:0.5,0.1", 7), QR_OK);
    moments(v, N, &mean, &std, &lo, &hi);
    assert_true(lo >= 0.5f - 0.2f - 1e-6f && hi <= 0.5f + 0.2f + 1e-6f);
    assert_true(fabs(mean - 0.5) < 0.002);
    /* std of a standard normal truncated at +-2 is 0.8796 */
    assert_true(fabs(std - 0.1 * 0.8796) < 0.002);

    int64_t shape2[2] = {400, 250};
    double limit = sqrt(6.0 / 650);
    assert_int_equal(qr_init_fill(v, N, 2, shape2, "glorot_uniform", 3), QR_OK);
    moments(v, N, &mean, &std, &lo, &hi);
    assert_true(lo >= -limit && hi < limit);
    assert_true(lo < -0.99 * limit && hi > 0.99 * limit);
    assert_true(fabs(mean) < 0.01 * limit);
    limit = sqrt(6.0 / (2.0 * N)); /* 1-D: fan_in = fan_out = shape[0] */
    assert_int_equal(qr_init_fill(v, N, 1, shape1, "glorot_uniform", 3), QR_OK);
    moments(v, N, &mean, &std, &lo, &hi);
    assert_true(lo >= -limit && hi < limit && hi > 0.99 * limit);

    /* Same seed, same values; another seed, other values. */
    assert_int_equal(qr_init_fill(v, N, 1, shape1, "normal:0,1", 42), QR_OK);
    assert_int_equal(qr_init_fill(w, N, 1, shape1, "normal:0,1", 42), QR_OK);
    assert_memory_equal(v, w, N * sizeof(float));
    assert_int_equal(qr_init_fill(w, N, 1, shape1, "normal:0,1", 43), QR_OK);
    assert_memory_not_equal(v, w, N * sizeof(float));

    /* Valid and invalid specs. */
    static const char *good[] = {"zeros", "constant:3", "constant:-1e-3", "uniform:-1,1",
                                 "uniform: -1, 1", "normal:0,0.01", "normal:0,0",
                                 "truncated_normal:0,0.1", "glorot_uniform"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        assert_int_equal(qr_init_validate(good[i]), QR_OK);
    static const struct {
        const char *spec, *needle;
    } bad[] = {
        {"uniform:3,1", "LO must be less than HI"},
        {"uniform:1,1", "LO must be less than HI"},
        {"normal:0,-1", "STD must not be negative"},
        {"truncated_normal:0,-0.1", "STD must not be negative"},
        {"glorot", "unknown"},
        {"he_normal", "unknown"},
        {"", "empty"},
        {"constant", "expected constant:C"},
        {"constant:x", "expected constant:C"},
        {"constant:1,2", "expected constant:C"},
        {"zeros:1", "expected zeros"},
        {"uniform:1", "expected uniform:LO,HI"},
        {"uniform:1,2,3", "expected uniform:LO,HI"},
        {"uniform:1,", "expected uniform:LO,HI"},
        {"normal:nan,1", "expected normal:MEAN,STD"},
        {"glorot_uniform:1", "expected glorot_uniform"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        expect_error(qr_init_validate(bad[i].spec), QR_EINVAL, bad[i].needle);
        if (*bad[i].spec) assert_non_null(strstr(qr_last_error(), bad[i].spec));
        expect_error(qr_init_fill(v, 4, 0, NULL, bad[i].spec, 1), QR_EINVAL, bad[i].needle);
    }
    assert_int_equal(qr_init_validate(NULL), QR_EINVAL);
    /* The shape must describe n values. */
    int64_t wrong[2] = {3, 3};
    expect_error(qr_init_fill(v, 10, 2, wrong, "zeros", 1), QR_ESHAPE, "9");
    free(v);
    free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_digits_load_and_split),
        cmocka_unit_test(test_csv_errors),
        cmocka_unit_test(test_idx_valid),
        cmocka_unit_test(test_idx_errors),
        cmocka_unit_test(test_fashion_mnist),
        cmocka_unit_test(test_libsvm),
        cmocka_unit_test(test_init),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

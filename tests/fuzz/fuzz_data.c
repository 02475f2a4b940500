/*
 * fuzz_data.c - libFuzzer target: the dataset loaders on arbitrary files.
 *
 * The first byte picks the loader (libsvm text, digits csv with the
 * column count taken from the file or fixed at 65, IDX images, IDX
 * labels); the rest is the file, handed over as /proc/self/fd/N of a
 * memfd. A loader must return a status (and free what it took), never
 * crash or read out of bounds; gz input is tried too, since every loader
 * sniffs for gzip.
 */
#include "data/digits.h"
#include "data/idx.h"
#include "data/libsvm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int fd = memfd_create("fuzz_data", 0);
    if (fd < 0) abort();
    if (size > 1 && write(fd, data + 1, size - 1) != (ssize_t)(size - 1)) abort();
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    switch (data[0] % 5) {
    case 0: {
        qr_sparse_dataset d;
        if (qr_libsvm_load(path, &d) == 0) qr_sparse_dataset_free(&d);
        break;
    }
    case 1:
    case 2: {
        qr_dataset d;
        if (qr_digits_load_csv(path, data[0] % 5 == 1 ? 0 : 65, &d) == 0) qr_dataset_free(&d);
        break;
    }
    case 3: {
        float *x = NULL;
        int64_t n, dim;
        if (qr_idx_load_images(path, &x, &n, &dim) == 0) free(x);
        break;
    }
    case 4: {
        int32_t *y = NULL;
        int64_t n;
        if (qr_idx_load_labels(path, &y, &n) == 0) free(y);
        break;
    }
    }
    close(fd);
    return 0;
}

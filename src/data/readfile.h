/*
 * readfile.h - read a whole file, gzip-compressed or plain, into memory.
 * Shared by the text loaders (digits csv, libsvm), which parse in place.
 */
#ifndef QR_DATA_READFILE_H
#define QR_DATA_READFILE_H

#include <stddef.h>

/* Read all of `path` (gunzipped if it is gzip) into a malloc'ed buffer with
 * a NUL byte appended; *len excludes that NUL. `what` names the file's role
 * in error messages ("digits file"). A NUL byte inside the data is refused,
 * since the text parsers would silently stop at it. */
int qr_data_read_file(const char *path, const char *what, char **buf, size_t *len);

#endif /* QR_DATA_READFILE_H */

/*
 * config.h - typed access to a qr_config for library code. Values were
 * validated when set, so these getters cannot fail on a known key.
 */
#ifndef QR_CONFIG_H
#define QR_CONFIG_H

#include "common.h"

int64_t qr__config_int(const qr_config *cfg, const char *key);
double qr__config_float(const qr_config *cfg, const char *key);
bool qr__config_bool(const qr_config *cfg, const char *key);
/* The value, or "" when unset and without default. cfg may be NULL. */
const char *qr__config_str(const qr_config *cfg, const char *key);
/* True if the user set key explicitly. */
bool qr__config_is_set(const qr_config *cfg, const char *key);
/* Copy every explicitly set key of src into dst. */
int qr__config_merge(qr_config *dst, const qr_config *src);

/* Check the synchronous-replica options against the number of workers
 * (R >= 1, init-tokens >= R - N) and resolve R and init-tokens (either
 * output may be NULL). Defined in ps/sync.c, which resolves them when a
 * ps starts; declared here so that `quorum launch` can refuse a bad setup
 * before it starts any process. It reads only options, so its body could
 * move to config.c. */
int qr_sync_check_config(const qr_config *cfg, int nworkers, int *R, int *init_tokens);

/* Iterate the known keys (for --help and docs): returns false past the end. */
bool qr__config_key_at(int i, const char **name, const char **def,
                       const char **help);

#endif

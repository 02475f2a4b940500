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

/* Check ps-replicas against the number of ps tasks (a copy per ps at
 * most) and the options it cannot go with yet (sync mode, checkpoints),
 * and resolve it (copies may be NULL). The ps checks it when it starts
 * (ps/replica.c), and `quorum launch` before it starts any process. */
int qr_replicas_check_config(const qr_config *cfg, int nps, int *copies);

/* Check the synchronous-replica options against the number of workers
 * (R >= 1, init-tokens >= R - N) and resolve R and init-tokens (either
 * output may be NULL). A ps resolves them with it when it starts (ps/sync.c),
 * and `quorum launch` refuses a bad setup with it before it starts any
 * process. */
int qr_sync_check_config(const qr_config *cfg, int nworkers, int *R, int *init_tokens);

/* The choices ("a|b|c") and the default of an enum key whose list belongs
 * to a layer above this one, which cannot be included here: the option
 * table marks such a key (PROVIDED in config.c) and the owner gives the
 * list when the library is loaded, before any option is set (optim.c gives
 * the optimizer names). qr_config_set then checks values against it, and
 * --help prints it. Until it is given, the key takes any value and its
 * default is "" (a program without that layer does not read the key). The
 * strings must outlive the library. Unknown or not-provided keys: ignored. */
void qr__config_provide_choices(const char *key, const char *choices, const char *def);

/* One known key, for --help, docs and suggestions. */
typedef struct qr__config_key {
    const char *name;    /* "max-staleness" */
    const char *def;     /* the default, "" if the consumer picks */
    const char *help;
    const char *choices; /* "async|sync" for a key with a fixed set of values, else NULL;
                          * qr_config_set validates against this same list */
    const char *mode;    /* "sync" or "async" if it applies to that mode only, else NULL */
    bool is_bool;        /* true/false: "--key" alone on a command line means true */
} qr__config_key;

/* Key i of the table (0, 1, ...): returns false past the end. */
bool qr__config_key_info(int i, qr__config_key *out);

/* The first key set explicitly in cfg that applies only to the other
 * training mode than `mode` ("sync"/"async"), or NULL: such a key would be
 * silently ignored. Defaults never count. */
const char *qr__config_misplaced_key(const qr_config *cfg, const char *mode);
/* QR_EINVAL, naming the key and the mode, if cfg sets a key that does not
 * apply to its own "mode"; QR_OK otherwise. */
int qr__config_check_mode(const qr_config *cfg);

#endif

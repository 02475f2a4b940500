/*
 * var_options.c - a variable's own optimizer settings.
 *
 * A variable may be declared with "key=value,key=value" options for its
 * optimizer ("optimizer=adagrad,lr=0.05", "beta1=0.8"). Naming an
 * optimizer starts a fresh configuration for that variable, so the global
 * options of another optimizer do not apply. Otherwise the variable's
 * options override the global ones. Either way the result is validated as
 * a whole, as qr_optim_create validates the global configuration.
 *
 * "trainable=false" declares a variable no optimizer touches (a torch
 * module's buffer, BatchNorm's running statistics): a push carries its
 * new value, which the ps assigns (src/ps/push.c, sync.c). It takes no
 * other optimizer setting, and gets a slotless SGD only so that every
 * variable has an optimizer object.
 */
#include "common/config.h"
#include "common/table_options.h"
#include "optim/optim_internal.h"

#include <stdlib.h>
#include <string.h>

/* Keys a variable may set: the optimizer's, nothing about transport. */
static const char *const var_keys = "optimizer|" QR__OPTIM_KEYS;

/* The value of key "trainable" in options: "true" (or absent) or "false". */
int qr_var_options_trainable(const char *options, bool *trainable) {
    *trainable = true;
    for (const char *item = options; *item;) {
        size_t len = strcspn(item, ",");
        static const char key[] = "trainable=";
        if (len >= sizeof key - 1 && !strncmp(item, key, sizeof key - 1)) {
            const char *value = item + sizeof key - 1;
            size_t vlen = len - (sizeof key - 1);
            if (vlen == 4 && !strncmp(value, "true", 4)) *trainable = true;
            else if (vlen == 5 && !strncmp(value, "false", 5)) *trainable = false;
            else
                return qr__fail(QR_EINVAL, "variable options: trainable=%.*s: want true or false",
                                (int)vlen, value);
        }
        item += len + (item[len] == ',');
    }
    return QR_OK;
}

/* A non-trainable variable: "trainable=false" and no optimizer setting. */
static int create_non_trainable(qr_optim **out, const char *options) {
    for (const char *item = options; *item;) {
        size_t len = strcspn(item, ",");
        size_t klen = strcspn(item, "=");
        if (len && strncmp(item, "trainable=", 10))
            return qr__fail(QR_EINVAL, "variable options: '%.*s' is an optimizer setting, but "
                            "the variable is declared trainable=false (no optimizer touches it)",
                            (int)QR_MIN(len, klen), item);
        item += len + (item[len] == ',');
    }
    qr_config *cfg = NULL;
    int rc = qr_config_new(&cfg);
    if (!rc) rc = qr_config_set(cfg, "optimizer", "sgd");
    if (!rc) rc = qr_optim_create(out, cfg);
    qr_config_free(cfg);
    return rc;
}

int qr_optim_create_for_var(qr_optim **out, const qr_config *global, const char *options) {
    *out = NULL;
    if (strlen(options) > 1024)
        return qr__fail(QR_EINVAL, "variable options are longer than 1024 bytes");
    bool trainable;
    int trc = qr_var_options_trainable(options, &trainable);
    if (trc) return trc;
    if (!trainable) return create_non_trainable(out, options);
    char *copy = qr__strdup(options);
    qr_config *cfg = NULL;
    int rc = copy ? qr_config_new(&cfg) : QR_ENOMEM;
    bool own_optimizer = strstr(options, "optimizer=") != NULL;
    if (!rc && global && !own_optimizer) rc = qr__config_merge(cfg, global);
    /* A variable's own optimizer applies on the ps's loop thread: a thread
     * pool per such variable would multiply threads for little gain. */
    if (!rc) rc = qr_config_set(cfg, "apply-threads", "1");
    for (char *save = NULL, *item = copy ? strtok_r(copy, ",", &save) : NULL; !rc && item;
         item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq || eq == item) {
            rc = qr__fail(QR_EINVAL, "variable options: '%s' is not key=value", item);
            break;
        }
        *eq = 0;
        for (char *c = item; *c; c++)
            if (*c == '_') *c = '-';
        if (qr__list_has(QR_TABLE_OPTION_KEYS, '|', item)) continue; /* the table's */
        if (!strcmp(item, "trainable")) continue; /* "true": checked above */
        if (!qr__list_has(var_keys, '|', item)) {
            rc = qr__fail(QR_EINVAL, "variable options: '%s' is not an optimizer option "
                          "(one of %s)", item, var_keys);
            break;
        }
        rc = qr_config_set(cfg, item, eq + 1);
    }
    if (!rc) rc = qr_optim_create(out, cfg);
    qr_config_free(cfg);
    free(copy);
    return rc;
}

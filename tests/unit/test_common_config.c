/*
 * test_common_config.c - the option table: defaults, validation of every
 * kind of value, unknown keys, '-'/'_' spelling, merging; the options of
 * one training mode refused in the other; the choices the table lists.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/config.h"

static void expect_refused(qr_config *c, const char *key, const char *value, int status,
                           const char *phrase) {
    assert_int_equal(qr_config_set(c, key, value), status);
    assert_non_null(strstr(qr_last_error(), phrase));
}

static void test_defaults_and_set(void **state) {
    (void)state;
    qr_config *c;
    assert_int_equal(qr_config_new(&c), QR_OK);
    assert_string_equal(qr_config_get(c, "optimizer"), "sgd");
    assert_string_equal(qr_config_get(c, "lr"), "");
    assert_false(qr__config_is_set(c, "lr"));
    assert_int_equal(qr_config_set(c, "lr", "0.25"), QR_OK);
    assert_true(qr__config_is_set(c, "lr"));
    assert_true(qr__config_float(c, "lr") == 0.25);
    assert_int_equal(qr_config_set(c, "timeout_ms", "1500"), QR_OK); /* '_' == '-' */
    assert_int_equal(qr__config_int(c, "timeout-ms"), 1500);
    assert_int_equal(qr_config_set(c, "nesterov", "yes"), QR_OK);
    assert_true(qr__config_bool(c, "nesterov"));
    assert_null(qr_config_get(c, "no-such-key"));
    assert_string_equal(qr_config_get(NULL, "transport"), "auto");
    qr_config_free(c);
    qr_config_free(NULL);
}

static void test_validation(void **state) {
    (void)state;
    qr_config *c;
    assert_int_equal(qr_config_new(&c), QR_OK);
    expect_refused(c, "optimzer", "adam", QR_EINVAL, "unknown option 'optimzer'");
    expect_refused(c, "optimizer", "adamax", QR_EINVAL, "not one of sgd|momentum");
    expect_refused(c, "lr", "-1", QR_EINVAL, "option lr: -1 is out of range: must be > 0");
    expect_refused(c, "lr", "0", QR_EINVAL, "option lr: 0 is out of range");
    expect_refused(c, "lr", "fast", QR_EINVAL, "not a finite number");
    expect_refused(c, "lr", "nan", QR_EINVAL, "not a finite number");
    expect_refused(c, "epsilon", "0", QR_EINVAL, "option epsilon");
    expect_refused(c, "timeout-ms", "0", QR_EINVAL, "out of range");
    expect_refused(c, "timeout-ms", "12x", QR_EINVAL, "not an integer");
    expect_refused(c, "centered", "maybe", QR_EINVAL, "not true or false");
    expect_refused(c, "transport", "udp", QR_EINVAL, "auto|tcp|unix");
    assert_int_equal(qr_config_set(c, NULL, "1"), QR_EINVAL);
    /* A refused value leaves the old one in place. */
    assert_int_equal(qr_config_set(c, "lr", "0.5"), QR_OK);
    expect_refused(c, "lr", "-3", QR_EINVAL, "out of range");
    assert_string_equal(qr_config_get(c, "lr"), "0.5");
    qr_config_free(c);
}

static void test_merge(void **state) {
    (void)state;
    qr_config *a, *b;
    assert_int_equal(qr_config_new(&a), QR_OK);
    assert_int_equal(qr_config_new(&b), QR_OK);
    assert_int_equal(qr_config_set(a, "optimizer", "adam"), QR_OK);
    assert_int_equal(qr_config_set(b, "lr", "0.1"), QR_OK);
    assert_int_equal(qr__config_merge(b, a), QR_OK);
    assert_string_equal(qr_config_get(b, "optimizer"), "adam");
    assert_string_equal(qr_config_get(b, "lr"), "0.1");
    qr_config_free(a);
    qr_config_free(b);
}

static void test_mode_check(void **state) {
    (void)state;
    qr_config *c;
    assert_int_equal(qr_config_new(&c), QR_OK);
    /* Defaults never count, in either mode. */
    assert_int_equal(qr__config_check_mode(c), QR_OK);
    assert_int_equal(qr_config_set(c, "mode", "sync"), QR_OK);
    assert_int_equal(qr__config_check_mode(c), QR_OK);
    /* An async option set in sync mode, even to its default value. */
    assert_int_equal(qr_config_set(c, "max_staleness", "-1"), QR_OK);
    assert_string_equal(qr__config_misplaced_key(c, "sync"), "max-staleness");
    assert_null(qr__config_misplaced_key(c, "async"));
    assert_int_equal(qr__config_check_mode(c), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "max-staleness applies to mode async only"));
    assert_non_null(strstr(qr_last_error(), "mode is sync"));
    qr_config_free(c);

    /* Sync options in async mode; options of both modes pass. */
    assert_int_equal(qr_config_new(&c), QR_OK);
    assert_int_equal(qr_config_set(c, "stall-report-ms", "500"), QR_OK);
    assert_int_equal(qr_config_set(c, "moving-average-decay", "0.9"), QR_OK);
    assert_int_equal(qr__config_check_mode(c), QR_OK);
    static const char *sync_only[] = {"replicas-to-aggregate", "reduction", "init-tokens",
                                      "sync-timeout-ms", "sync-stats-file"};
    static const char *values[] = {"1", "sum", "0", "1000", "/tmp/x"};
    for (int i = 0; i < 5; i++) {
        qr_config *d;
        assert_int_equal(qr_config_new(&d), QR_OK);
        assert_int_equal(qr_config_set(d, sync_only[i], values[i]), QR_OK);
        assert_int_equal(qr__config_check_mode(d), QR_EINVAL);
        assert_non_null(strstr(qr_last_error(), sync_only[i]));
        assert_int_equal(qr_config_set(d, "mode", "sync"), QR_OK);
        assert_int_equal(qr__config_check_mode(d), QR_OK);
        qr_config_free(d);
    }
    qr_config_free(c);
}

/* replication-lag: async only, and only with a second copy to lag. */
static void test_replication_lag(void **state) {
    (void)state;
    qr_config *c;
    assert_int_equal(qr_config_new(&c), QR_OK);
    int copies = 0;
    assert_int_equal(qr_replicas_check_config(c, 3, &copies), QR_OK);
    assert_int_equal(copies, 1);
    expect_refused(c, "replication-lag", "-1", QR_EINVAL, "replication-lag");
    assert_int_equal(qr_config_set(c, "replication-lag", "8"), QR_OK);
    assert_int_equal(qr_replicas_check_config(c, 3, &copies), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "needs --ps-replicas 2"));
    assert_int_equal(qr_config_set(c, "ps-replicas", "2"), QR_OK);
    assert_int_equal(qr_replicas_check_config(c, 3, &copies), QR_OK);
    assert_int_equal(copies, 2);
    assert_int_equal(qr__config_check_mode(c), QR_OK);
    assert_int_equal(qr_config_set(c, "mode", "sync"), QR_OK);
    assert_int_equal(qr__config_check_mode(c), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "replication-lag applies to mode async only"));
    qr_config_free(c);
}

/* The choices --help prints are those qr_config_set accepts. */
static void test_choices(void **state) {
    (void)state;
    qr_config *c;
    assert_int_equal(qr_config_new(&c), QR_OK);
    qr__config_key k;
    int nenum = 0;
    for (int i = 0; qr__config_key_info(i, &k); i++) {
        if (!k.choices) continue;
        nenum++;
        char buf[256];
        snprintf(buf, sizeof buf, "%s", k.choices);
        for (char *tok = strtok(buf, "|"); tok; tok = strtok(NULL, "|"))
            assert_int_equal(qr_config_set(c, k.name, tok), QR_OK);
        assert_int_equal(qr_config_set(c, k.name, "no-such-choice"), QR_EINVAL);
        assert_non_null(strstr(qr_last_error(), k.choices));
    }
    /* transport, mode, reduction, sparse-reduction, optimizer, nonfinite */
    assert_int_equal(nenum, 6);
    qr_config_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_set),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_mode_check),
        cmocka_unit_test(test_replication_lag),
        cmocka_unit_test(test_choices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

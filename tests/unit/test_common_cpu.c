/*
 * test_common_cpu.c - the choice of OpenBLAS kernels (common/cpu.h): when
 * quorum sets OPENBLAS_CORETYPE (OpenBLAS chose narrower kernels than the
 * CPU runs, and nothing set the variable) and when it leaves it alone (a
 * value someone set, a CPU OpenBLAS knows, a name it does not know); and
 * what this CPU is, checked against /proc/cpuinfo's flags, read here.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cpu.h"

static void weaker_kernels_are_replaced(void **state) {
    (void)state;
    /* Debian 12's OpenBLAS on a Sapphire Rapids Xeon */
    assert_string_equal(qr__blas_coretype_to_set("SkylakeX", NULL, "Prescott"), "SkylakeX");
    assert_string_equal(qr__blas_coretype_to_set("SkylakeX", "", "Prescott"), "SkylakeX");
    assert_string_equal(qr__blas_coretype_to_set("SkylakeX", NULL, "Haswell"), "SkylakeX");
    assert_string_equal(qr__blas_coretype_to_set("Haswell", NULL, "Nehalem"), "Haswell");
    assert_string_equal(qr__blas_coretype_to_set("Haswell", NULL, "core2"), "Haswell");
    assert_string_equal(qr__blas_coretype_to_set("Sandybridge", NULL, "Atom"), "Sandybridge");
    assert_string_equal(qr__blas_coretype_to_set("Haswell", NULL, "Katmai"), "Haswell");
}

static void good_or_chosen_kernels_are_kept(void **state) {
    (void)state;
    /* someone set it: kept, whatever it is */
    assert_null(qr__blas_coretype_to_set("SkylakeX", "Prescott", "Prescott"));
    assert_null(qr__blas_coretype_to_set("SkylakeX", "Haswell", "Haswell"));
    /* OpenBLAS knows the CPU: its own choice, as good or better, stands */
    assert_null(qr__blas_coretype_to_set("SkylakeX", NULL, "Cooperlake"));
    assert_null(qr__blas_coretype_to_set("SkylakeX", NULL, "SkylakeX"));
    assert_null(qr__blas_coretype_to_set("SkylakeX", NULL, "SapphireRapids"));
    assert_null(qr__blas_coretype_to_set("Haswell", NULL, "Zen"));
    assert_null(qr__blas_coretype_to_set("Sandybridge", NULL, "Piledriver"));
    /* a name this file does not know (a newer OpenBLAS): never overridden */
    assert_null(qr__blas_coretype_to_set("SkylakeX", NULL, "GraniteRapids"));
    /* no AVX, or not x86-64: OpenBLAS's own detection */
    assert_null(qr__blas_coretype_to_set(NULL, NULL, "Prescott"));
    assert_false(qr__blas_kernel_weaker("Prescott", "Neoversen1"));
    assert_true(qr__blas_kernel_weaker("sandybridge", "haswell"));
}

/* The coretype /proc/cpuinfo's flags allow, worked out here. */
static const char *coretype_from_proc(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return NULL;
    static char line[8192];
    const char *found = NULL;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5)) continue;
        char padded[sizeof line + 2];
        snprintf(padded, sizeof padded, " %s ", strchr(line, ':') + 1);
        padded[strcspn(padded, "\n")] = ' ';
#define HAS(flag) (strstr(padded, " " flag " ") != NULL)
        if (HAS("avx512f") && HAS("avx512bw") && HAS("avx512vl") && HAS("avx512dq") &&
            HAS("avx2") && HAS("fma"))
            found = "SkylakeX";
        else if (HAS("avx2") && HAS("fma"))
            found = "Haswell";
        else if (HAS("avx"))
            found = "Sandybridge";
#undef HAS
        break;
    }
    fclose(f);
    return found;
}

static void this_cpu(void **state) {
    (void)state;
    qr_cpu cpu;
    qr__cpu_describe(&cpu);
    assert_true(cpu.cores >= 1);
    assert_true(strlen(cpu.model) > 0);
    const char *want = coretype_from_proc();
#if defined(__x86_64__)
    if (want)
        assert_string_equal(cpu.coretype, want);
    else
        assert_null(cpu.coretype);
#else
    (void)want;
    assert_null(cpu.coretype);
#endif
    char line[256];
    qr__cpu_summary(line, sizeof line);
    assert_non_null(strstr(line, cpu.model));
    assert_non_null(strstr(line, qr__blas_kernel()));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(weaker_kernels_are_replaced),
        cmocka_unit_test(good_or_chosen_kernels_are_kept),
        cmocka_unit_test(this_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

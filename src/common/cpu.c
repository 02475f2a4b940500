/*
 * cpu.c - the processor this process runs on (its name, its logical CPUs,
 * the widest vector instructions it and its OS support, from cpuid) and
 * the OpenBLAS kernels that suit it. See cpu.h for why.
 */
#include "common/cpu.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>

/* XCR0: which register state the OS saves on a context switch. A CPU
 * with AVX-512 under an OS that does not save the zmm registers cannot
 * run AVX-512 code. Read only when cpuid says OSXSAVE. */
static uint64_t xgetbv0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

#define XCR0_AVX 0x06u    /* xmm and ymm state */
#define XCR0_AVX512 0xe6u /* and opmask, zmm0-15 upper halves, zmm16-31 */

static const char *x86_coretype(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return NULL;
    if (!(c & bit_OSXSAVE) || !(c & bit_AVX)) return NULL;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & XCR0_AVX) != XCR0_AVX) return NULL;
    bool fma = c & bit_FMA, avx2 = false, avx512 = false;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        avx2 = b & bit_AVX2;
        unsigned want = bit_AVX512F | bit_AVX512BW | bit_AVX512VL | bit_AVX512DQ;
        avx512 = (b & want) == want && (xcr0 & XCR0_AVX512) == XCR0_AVX512;
    }
    if (avx512 && avx2 && fma) return "SkylakeX";
    if (avx2 && fma) return "Haswell";
    return "Sandybridge";
}

/* The brand string of cpuid's extended leaves, blanks trimmed. */
static bool x86_model(char *buf, size_t len) {
    unsigned regs[12];
    if (__get_cpuid_max(0x80000000, NULL) < 0x80000004) return false;
    for (unsigned i = 0; i < 3; i++)
        __get_cpuid(0x80000002 + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2],
                    &regs[4 * i + 3]);
    char brand[49];
    memcpy(brand, regs, 48);
    brand[48] = '\0';
    char *s = brand;
    while (*s == ' ') s++;
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == ' ') s[--n] = '\0';
    if (!*s) return false;
    snprintf(buf, len, "%s", s);
    return true;
}
#endif

/* Elsewhere, the first "model name" (or "Processor", "cpu model") line of
 * /proc/cpuinfo, as lscpu shows. */
static bool proc_model(char *buf, size_t len) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[256];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        if (strncasecmp(line, "model name", 10) && strncasecmp(line, "Processor", 9) &&
            strncasecmp(line, "cpu model", 9))
            continue;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        v[strcspn(v, "\n")] = '\0';
        if (*v) {
            snprintf(buf, len, "%s", v);
            found = true;
        }
    }
    fclose(f);
    return found;
}

void qr__cpu_describe(qr_cpu *out) {
    memset(out, 0, sizeof *out);
    bool named = false;
#if defined(__x86_64__)
    named = x86_model(out->model, sizeof out->model);
    out->coretype = x86_coretype();
#endif
    if (!named && !proc_model(out->model, sizeof out->model))
        snprintf(out->model, sizeof out->model, "unknown");
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    out->cores = n > 0 ? (int)n : 1;
}

const char *qr__blas_kernel(void) {
    const char *name = openblas_get_corename();
    return name && *name ? name : "unknown";
}

/* How wide the vectors of OpenBLAS's x86-64 kernel sets are: 3 AVX-512,
 * 2 AVX2 and FMA, 1 AVX, 0 SSE only; -1 for a name not listed here. */
static int kernel_level(const char *name) {
    static const struct {
        const char *name;
        int level;
    } levels[] = {
        {"SkylakeX", 3},   {"Cooperlake", 3},  {"SapphireRapids", 3}, {"Haswell", 2},
        {"Zen", 2},        {"Excavator", 2},   {"Sandybridge", 1},    {"Bulldozer", 1},
        {"Piledriver", 1}, {"Steamroller", 1}, {"Prescott", 0},       {"Core2", 0},
        {"Penryn", 0},     {"Dunnington", 0},  {"Nehalem", 0},        {"Atom", 0},
        {"Katmai", 0},     {"Coppermine", 0},  {"Northwood", 0},      {"Banias", 0},
        {"Athlon", 0},     {"Opteron", 0},     {"Opteron_SSE3", 0},   {"Barcelona", 0},
        {"Nano", 0},       {"Bobcat", 0},      {"Unknown", 0},
    };
    for (size_t i = 0; name && i < sizeof levels / sizeof levels[0]; i++)
        if (!strcasecmp(name, levels[i].name)) return levels[i].level;
    return -1;
}

bool qr__blas_kernel_weaker(const char *kernel, const char *coretype) {
    int have = kernel_level(kernel), can = kernel_level(coretype);
    return have >= 0 && can >= 0 && have < can;
}

const char *qr__blas_coretype_to_set(const char *cpu_coretype, const char *env_value,
                                     const char *kernel) {
    if (env_value && *env_value) return NULL; /* the user's, or the environment's */
    if (!cpu_coretype || !qr__blas_kernel_weaker(kernel, cpu_coretype)) return NULL;
    return cpu_coretype;
}

const char *qr__blas_kernel_chosen_by(void) {
    const char *set = getenv("OPENBLAS_CORETYPE");
    if (!set || !*set) return "openblas";
    const char *chosen = getenv(QR_CPU_CHOSEN_ENV);
    return chosen && !strcmp(chosen, set) ? "quorum" : "OPENBLAS_CORETYPE";
}

void qr__cpu_summary(char *buf, size_t len) {
    qr_cpu cpu;
    qr__cpu_describe(&cpu);
    snprintf(buf, len, "%s, %d cores, BLAS kernel %s (chosen by %s)", cpu.model, cpu.cores,
             qr__blas_kernel(), qr__blas_kernel_chosen_by());
}

cJSON *qr__cpu_json(void) {
    qr_cpu cpu;
    qr__cpu_describe(&cpu);
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON_AddStringToObject(j, "model", cpu.model);
    cJSON_AddNumberToObject(j, "cores", cpu.cores);
    cJSON_AddStringToObject(j, "blas_kernel", qr__blas_kernel());
    cJSON_AddStringToObject(j, "blas_kernel_chosen_by", qr__blas_kernel_chosen_by());
    if (cpu.coretype) cJSON_AddStringToObject(j, "cpu_coretype", cpu.coretype);
    return j;
}

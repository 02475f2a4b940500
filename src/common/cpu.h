/*
 * cpu.h - the processor a task runs on and the OpenBLAS kernels it can
 * run (cpu.c): what a benchmark prints beside its figures, and what the
 * quorum tool needs to choose OPENBLAS_CORETYPE before OpenBLAS does.
 *
 * Why: an OpenBLAS older than the CPU (Debian 12's 0.3.21 on a Sapphire
 * Rapids Xeon) does not know its model number and falls back to its SSE3
 * kernels (Prescott), a third of the speed. The CPU's features (cpuid)
 * say which kernels it can run whatever its model number is. The library
 * only describes and decides; the tool sets the variable, runs itself
 * again and logs (tools/quorum.c).
 */
#ifndef QR_COMMON_CPU_H
#define QR_COMMON_CPU_H

#include <stdbool.h>
#include <stddef.h>

/* The variable quorum sets beside OPENBLAS_CORETYPE when it chose the
 * value itself, holding the same value: a value that differs from it was
 * set by someone else (tasks started by `quorum launch` inherit both). */
#define QR_CPU_CHOSEN_ENV "QUORUM_OPENBLAS_CORETYPE_CHOSEN"

typedef struct qr_cpu {
    char model[96];       /* "Intel(R) Xeon(R) Platinum 8480+", or "unknown" */
    int cores;            /* logical CPUs online */
    /* The OPENBLAS_CORETYPE whose kernels use the widest vectors this CPU
     * and its OS support: "SkylakeX" (AVX-512 F, BW, VL and DQ),
     * "Haswell" (AVX2 and FMA), "Sandybridge" (AVX); NULL on a CPU without
     * AVX or that is not x86-64, where OpenBLAS's own choice stands. */
    const char *coretype;
} qr_cpu;

/* Fill *out for the CPU this process runs on (cpuid, sysconf). */
void qr__cpu_describe(qr_cpu *out);

/* The kernels OpenBLAS runs in this process: openblas_get_corename(). */
const char *qr__blas_kernel(void);

/* Whether OpenBLAS's kernel set `kernel` (a corename) uses narrower vector
 * instructions than the coretype `coretype` (one of qr_cpu's). Names this
 * file does not know are never weaker: a newer OpenBLAS's own choice
 * stands. */
bool qr__blas_kernel_weaker(const char *kernel, const char *coretype);

/* The OPENBLAS_CORETYPE to run with, or NULL to keep things as they are:
 * NULL when `env_value` (the variable as the process found it) is set and
 * not empty, when cpu_coretype is NULL, or when `kernel` (what OpenBLAS
 * chose by itself) is not weaker than cpu_coretype. */
const char *qr__blas_coretype_to_set(const char *cpu_coretype, const char *env_value,
                                     const char *kernel);

/* Who chose the kernels in use: "OPENBLAS_CORETYPE" (a value the user or
 * the environment set), "quorum" (the value quorum chose, QR_CPU_CHOSEN_ENV)
 * or "openblas" (its own detection, the variable unset). */
const char *qr__blas_kernel_chosen_by(void);

/* The same as a JSON object, for a benchmark's or a run's summary:
 * {"model", "cores", "blas_kernel", "blas_kernel_chosen_by", and
 * "cpu_coretype" where cpuid gives one}. NULL if out of memory. */
struct cJSON *qr__cpu_json(void);

/* One line for a person: "AMD EPYC, 2 cores, BLAS kernel Cooperlake
 * (chosen by openblas)". */
void qr__cpu_summary(char *buf, size_t len);

#endif /* QR_COMMON_CPU_H */

/*
 * fake_openblas_corename.c - an LD_PRELOAD library for test_blas_kernel.py
 * that plays an OpenBLAS older than the CPU: with OPENBLAS_CORETYPE unset,
 * openblas_get_corename() says "Prescott" (SSE3), as Debian 12's 0.3.21
 * says on a Sapphire Rapids Xeon; once the variable is set, it answers what
 * the real OpenBLAS runs. So the test sees quorum choose, run itself again
 * and log on any x86-64 machine with AVX, whatever OpenBLAS knows of it.
 */
#include <dlfcn.h>
#include <stdlib.h>

char *openblas_get_corename(void) {
    const char *set = getenv("OPENBLAS_CORETYPE");
    if (!set || !*set) return "Prescott";
    char *(*real)(void) = (char *(*)(void))dlsym(RTLD_NEXT, "openblas_get_corename");
    return real ? real() : "unknown";
}

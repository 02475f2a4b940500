/*
 * main_wire.c - the standalone quorum-bench-wire executable: the same
 * program as `quorum bench wire`, whose arguments it passes on.
 */
#include "bench/bench.h"

int main(int argc, char **argv) {
    char name[] = "wire";
    argv[0] = name; /* the benchmark sees argv[0] == "wire", as under `quorum bench` */
    return qr_bench_wire_main(argc, argv);
}

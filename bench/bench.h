/*
 * bench.h - entry points of the benchmarks. Each is a whole program behind
 * one function, called by `quorum bench NAME` and by the standalone
 * quorum-bench-NAME executables. argv[0] is the benchmark's name.
 */
#ifndef QR_BENCH_H
#define QR_BENCH_H

int qr_bench_wire_main(int argc, char **argv);
int qr_bench_optim_main(int argc, char **argv);
int qr_bench_ckpt_main(int argc, char **argv);
int qr_bench_embed_main(int argc, char **argv);
int qr_bench_mlp_main(int argc, char **argv);
int qr_bench_tier_main(int argc, char **argv);

#endif

#!/usr/bin/env bash
# fuzz.sh [SECONDS] - build the libFuzzer targets with clang (into
# build-fuzz) and throw fuzzed bytes at a live ps (tests/fuzz/fuzz_ps.c):
# fuzz_ps against an async ps, then fuzz_ps_sync against a sync one, for
# SECONDS each (default 300); 0 only replays the corpus (CI does that).
# The corpus: what tests/fuzz/seeds.py writes, the inputs of past findings
# (tests/fuzz/regressions) and whatever earlier runs kept in
# build-fuzz/corpus-TARGET. A crash, hang or memory blow-up is saved as
# build-fuzz/crash-* (oom-*, timeout-*) and fails the run; replay one with
# build-fuzz/tests/fuzz/TARGET FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
targets="fuzz_ps fuzz_ps_sync"
export QR_BUILD_DIR=build-fuzz QR_EXTRA_PACKAGES="clang libclang-rt-14-dev" CC=clang
QR_BUILD_TARGETS="$targets" scripts/setup.sh -DQR_FUZZ=ON
if [ "$seconds" = 0 ]; then limit=(-runs=0); else limit=(-max_total_time="$seconds"); fi
for target in $targets; do
    corpus=build-fuzz/corpus-$target
    mkdir -p "$corpus"
    /usr/bin/python3 tests/fuzz/seeds.py "$corpus"
    cp tests/fuzz/regressions/* "$corpus"/
    # allocator_may_return_null: a refused huge allocation is the ps's to
    # handle (it answers ENOMEM), not a finding.
    (cd build-fuzz &&
     ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=0 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
         tests/fuzz/$target "corpus-$target" "${limit[@]}" -max_len=4096 -rss_limit_mb=4096 \
         -print_final_stats=1)
done

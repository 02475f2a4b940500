#!/usr/bin/env bash
# fuzz.sh [SECONDS] - build the libFuzzer target with clang (into
# build-fuzz) and throw fuzzed bytes at a live ps (tests/fuzz/fuzz_ps.c)
# for SECONDS (default 300); 0 only replays the corpus (CI does that).
# The corpus: what tests/fuzz/seeds.py writes, the inputs of past findings
# (tests/fuzz/regressions) and whatever earlier runs kept in
# build-fuzz/corpus. A crash, hang or memory blow-up is saved as
# build-fuzz/crash-* (oom-*, timeout-*) and fails the run; replay one with
# build-fuzz/tests/fuzz/fuzz_ps FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
export QR_BUILD_DIR=build-fuzz QR_EXTRA_PACKAGES="clang libclang-rt-14-dev" CC=clang
QR_BUILD_TARGETS=fuzz_ps scripts/setup.sh -DQR_FUZZ=ON
mkdir -p build-fuzz/corpus
/usr/bin/python3 tests/fuzz/seeds.py build-fuzz/corpus
cp tests/fuzz/regressions/* build-fuzz/corpus/
if [ "$seconds" = 0 ]; then limit=(-runs=0); else limit=(-max_total_time="$seconds"); fi
cd build-fuzz
# allocator_may_return_null: a refused huge allocation is the ps's to
# handle (it answers ENOMEM), not a finding.
ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=0 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    tests/fuzz/fuzz_ps corpus "${limit[@]}" -max_len=4096 -rss_limit_mb=4096 \
    -print_final_stats=1

#!/usr/bin/env bash
# fuzz.sh [SECONDS] - build the libFuzzer targets with clang (into
# build-fuzz) and run each for SECONDS (default 300); 0 only replays the
# corpus (CI does that). fuzz_ps throws bytes at a live async ps,
# fuzz_ps_sync at a sync one (tests/fuzz/fuzz_ps.c); fuzz_worker answers a
# real worker's requests with them (fuzz_worker.c); fuzz_data feeds the
# dataset loaders arbitrary files (fuzz_data.c); fuzz_config the cluster
# spec and option parsers arbitrary text (fuzz_config.c); fuzz_handshake
# both sides of the handshake and the sealed records arbitrary peer
# messages (fuzz_handshake.c); fuzz_ps_auth throws bytes at a live ps that
# has a cluster secret and encrypts, raw or after a genuine handshake
# (fuzz_ps.c built with FUZZ_AUTH).
# The corpus: what tests/fuzz/seeds.py writes, the inputs of past findings
# against the ps (tests/fuzz/regressions) and whatever earlier runs kept in
# build-fuzz/corpus-TARGET. A crash, hang or memory blow-up is saved as
# build-fuzz/crash-* (oom-*, timeout-*) and fails the run; replay one with
# build-fuzz/tests/fuzz/TARGET FILE (with the ASAN_OPTIONS and UBSAN_OPTIONS
# below). The ps targets give every input a ps of its own, just started, so
# a crash file replays alone; that costs a ps start per input (measured on
# the 2-core VM, fuzz_ps_sync, 30 s each: 274 inputs/s against 1698 with
# one ps kept across inputs, and more coverage: 1656 edges against 1226).
# FUZZ_KEEP_STATE=1 keeps one ps across inputs (tests/fuzz/fuzz_ps.c).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
targets="fuzz_ps fuzz_ps_sync fuzz_worker fuzz_data fuzz_config fuzz_handshake fuzz_ps_auth"
export QR_BUILD_DIR=build-fuzz QR_EXTRA_PACKAGES="clang libclang-rt-14-dev" CC=clang
QR_BUILD_TARGETS="$targets" scripts/setup.sh -DQR_FUZZ=ON
if [ "$seconds" = 0 ]; then limit=(-runs=0); else limit=(-max_total_time="$seconds"); fi
for target in $targets; do
    corpus=build-fuzz/corpus-$target
    mkdir -p "$corpus"
    case $target in
    fuzz_data) /usr/bin/python3 tests/fuzz/seeds.py "$corpus" data ;;
    fuzz_worker) /usr/bin/python3 tests/fuzz/seeds.py "$corpus" worker ;;
    fuzz_config) /usr/bin/python3 tests/fuzz/seeds.py "$corpus" config ;;
    fuzz_handshake) /usr/bin/python3 tests/fuzz/seeds.py "$corpus" handshake ;;
    fuzz_ps_auth) /usr/bin/python3 tests/fuzz/seeds.py "$corpus" ps_auth ;;
    *) /usr/bin/python3 tests/fuzz/seeds.py "$corpus" ps
       cp tests/fuzz/regressions/* "$corpus"/ ;;
    esac
    # allocator_may_return_null: a refused huge allocation is the ps's to
    # handle (it answers ENOMEM), not a finding.
    (cd build-fuzz &&
     ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=0 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
         tests/fuzz/$target "corpus-$target" "${limit[@]}" -max_len=4096 -rss_limit_mb=4096 \
         -print_final_stats=1)
done

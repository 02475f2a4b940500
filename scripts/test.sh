#!/usr/bin/env bash
# test.sh - set up, build and run every test (unit and multi-process
# integration tests). With --sanitize, builds into build-asan with
# AddressSanitizer and UndefinedBehaviorSanitizer and runs the tests there.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sanitize" ]; then
    export QR_BUILD_DIR=build-asan
    scripts/setup.sh -DQR_SANITIZE=ON
    # detect_leaks: every test frees what it allocates.
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    # The slow tests repeat, many times over, code the other tests cover.
    ctest_args=(-LE slow)
else
    export QR_BUILD_DIR=build
    scripts/setup.sh
    ctest_args=()
fi
cd "$QR_BUILD_DIR"
ctest --output-on-failure --timeout 900 -j1 "${ctest_args[@]}"

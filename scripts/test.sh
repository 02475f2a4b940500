#!/usr/bin/env bash
# test.sh - set up, build and run every test (unit and multi-process
# integration tests). With --sanitize, builds into build-asan with
# AddressSanitizer and UndefinedBehaviorSanitizer and runs the tests there.
# Makes the Python environment .venv the torch and Python tests need, once,
# and installs the Python package into it (pip install .) every time.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sanitize" ]; then
    export QR_BUILD_DIR=build-asan
    scripts/setup.sh -DQR_SANITIZE=ON
    # detect_leaks: every test frees what it allocates.
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    # The slow tests repeat, many times over, code the other tests cover;
    # the unsanitized ones (the pip-built Python package) run no code of
    # this build.
    ctest_args=(-LE 'slow|unsanitized')
else
    export QR_BUILD_DIR=build
    scripts/setup.sh
    ctest_args=()
fi
# The Python environment of the tests that need more than Debian's numpy
# (tests/unit/optim.cmake runs them with it):
# torch 2.x CPU (Debian's python3-torch is 1.13) for the optimizer reference
# test; safetensors and tensorboard read checkpoints and event files back.
# pip takes torch 2.13.0 from the wheel this machine kind keeps on
# disk; an unpinned torch would download a multi-GB CUDA build.
venv=.venv
if ! "$venv/bin/python" -c 'import numpy, torch, safetensors, tensorboard' 2>/dev/null; then
    echo "setup: creating the Python environment $venv (torch 2.13.0 CPU, numpy, safetensors, tensorboard)"
    /usr/bin/python3 -m venv "$venv"
    if ! "$venv/bin/pip" install -q torch==2.13.0 numpy safetensors tensorboard > "$venv/pip.log" 2>&1; then
        cat "$venv/pip.log" >&2
        exit 1
    fi
fi

if ! "$venv/bin/python" -c 'import pytest, mypy' 2>/dev/null; then
    "$venv/bin/pip" install -q pytest mypy > "$venv/pip.log" 2>&1 || { cat "$venv/pip.log" >&2; exit 1; }
fi
# The Python package, as a user installs it: its build (scikit-build-core,
# pyproject.toml) compiles the C library with this CMake project. tests/
# integration/python.cmake runs its pytest suite and mypy against it.
echo "setup: installing the Python package into $venv (pip install .)"
if ! "$venv/bin/pip" install -q . > "$venv/pip-quorum.log" 2>&1; then
    cat "$venv/pip-quorum.log" >&2
    exit 1
fi

cd "$QR_BUILD_DIR"
ctest --output-on-failure --timeout 900 -j1 "${ctest_args[@]}"

#!/usr/bin/env bash
# setup.sh - install what quorum needs on Debian 12 (only what is missing)
# and build it into ./build (or $QR_BUILD_DIR). Extra arguments go to cmake;
# $QR_EXTRA_PACKAGES are installed too, and $QR_BUILD_TARGETS (if set) are
# the only targets built.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config libuv1-dev libcjson-dev libopenblas-dev
          libmicrohttpd-dev libsodium-dev libcmocka-dev zlib1g-dev liblmdb-dev
          dataset-fashion-mnist liblinear-tools prometheus gnuplot-nox
          python3 python3-dev python3-numpy python3-venv iproute2 ${QR_EXTRA_PACKAGES:-})
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build_dir=${QR_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
targets=()
[ -z "${QR_BUILD_TARGETS:-}" ] || targets=(--target ${QR_BUILD_TARGETS})
cmake --build "$build_dir" -j"$(nproc)" "${targets[@]}"

#!/usr/bin/env bash
# demo.sh - set up, build, and train the MLP on Fashion-MNIST with a local
# cluster of 2 ps tasks and 3 workers, asynchronously; prints the test
# accuracy. Extra arguments are passed to `quorum launch`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/tools/quorum launch --ps 2 --workers 3 --model mlp --hidden 256,128 \
    --data fashion-mnist --epochs 10 --batch-size 64 --lr 0.1 --mode async "$@"

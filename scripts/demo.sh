#!/usr/bin/env bash
# demo.sh - set up, build, and train the MLP on Fashion-MNIST with a local
# cluster of 2 ps tasks and 3 workers, asynchronously; prints the test
# accuracy. The learning rate decays from 0.1 to a tenth of it over the
# run's ~9,400 steps, which steadies the last iterate that is evaluated.
# Extra arguments are passed to `quorum launch`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/tools/quorum launch --ps 2 --workers 3 --model mlp --hidden 256,128 \
    --data fashion-mnist --epochs 10 --batch-size 64 --lr 0.1 \
    --lr-decay-rate 0.1 --lr-decay-steps 9400 --mode async "$@"

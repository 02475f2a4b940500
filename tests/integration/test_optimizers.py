"""test_optimizers.py - every optimizer trains the MLP in a real
multi-process run (2 ps, 3 workers, async) to the accuracy issue 4 asks
for: >= 0.95 on digits, >= 0.85 on Fashion-MNIST.
Usage: test_optimizers.py QUORUM_BINARY digits|fashion-mnist [OPTIMIZER...]"""

import sys

from qrtest import Proc, last_json

# Per-optimizer settings for the MLP: TF's default learning rates are
# tuned for other models; these are what a user would pass.
SETTINGS = {
    # 15 epochs of Fashion-MNIST are ~14,000 steps: the lr decays to a
    # tenth over them (a constant 0.1 leaves a noisy last iterate).
    "sgd": ["--lr", "0.1", "--lr-decay-rate", "0.1", "--lr-decay-steps", "14000"],
    "momentum": ["--lr", "0.01"],
    "adagrad": ["--lr", "0.05"],
    "rmsprop": ["--lr", "0.0005"],
    "adam": ["--lr", "0.0005"],
    "adam_async": ["--lr", "0.0005"],
    # A tiny initial accumulator keeps the random initialization (see
    # docs/OPTIMIZERS.md, "FTRL on deep networks").
    "ftrl": ["--lr", "0.05", "--initial-accumulator", "1e-6"],
    # torch's AdamW, its default weight decay (0.01)
    "adamw": ["--lr", "0.0005"],
}
# Async runs are not reproducible (arrival order varies), so each setting
# was chosen to clear the target by about 0.02 over repeated runs.
# FTRL at 10 epochs ended at 0.858-0.875 over 6 runs (beside a CPU hog);
# 15 epochs gave 0.878-0.882. Decaying FTRL's lr does not help: its
# accumulators decay it already (0.839 with a tenfold decay).
EPOCHS = {"digits": {}, "fashion-mnist": {"sgd": "15", "ftrl": "15"}}
DEFAULT_EPOCHS = {"digits": "60", "fashion-mnist": "10"}
TARGET = {"digits": 0.95, "fashion-mnist": 0.85}

quorum, data = sys.argv[1], sys.argv[2]
names = sys.argv[3:] or list(SETTINGS)
failures = []

def train(name, seed):
    """One async run of optimizer `name`: its test accuracy, or None (a
    failure is recorded)."""
    epochs = EPOCHS[data].get(name, DEFAULT_EPOCHS[data])
    proc = Proc([quorum, "launch", "--ps", "2", "--workers", "3", "--data", data,
                 "--epochs", epochs, "--optimizer", name, "--seed", str(seed), "--json",
                 "--quiet"] + SETTINGS[name])
    rc, out, err = proc.wait(timeout=600)
    if rc != 0:
        failures.append("%s: launch exited %d: %s" % (name, rc, err[-2000:]))
        return None
    summary = last_json(out)
    assert summary["optimizer"] == name, summary
    acc = summary["test_accuracy"]
    print("%-10s %s seed %d: test accuracy %.4f in %.1f s" % (name, data, seed, acc,
                                                             summary["wall_seconds"]))
    return acc


for name in names:
    acc = train(name, 3)
    # Async arrival order differs from run to run, and so does the last
    # iterate: momentum on digits ended at 0.928 once in CI where it
    # usually gives 0.964-0.981. A miss is run once more with another
    # seed; an optimizer that is broken misses both times.
    if acc is not None and acc < TARGET[data]:
        print("%-10s %s: %.4f is under %.2f; once more with seed 4" % (name, data, acc,
                                                                      TARGET[data]))
        acc = train(name, 4)
    if acc is not None and acc < TARGET[data]:
        failures.append("%s: accuracy %.4f < %.2f (twice)" % (name, acc, TARGET[data]))
if data == "digits" and len(names) == len(SETTINGS):
    # Per-variable optimizers: Adagrad on the first layer, Adam on the
    # output bias, the ps's momentum with weight decay on the rest but the
    # hidden bias (no decay on a bias, as torch users write param groups).
    proc = Proc([quorum, "launch", "--ps", "2", "--workers", "3", "--data", data, "--epochs",
                 "40", "--optimizer", "momentum", "--lr", "0.01", "--weight-decay", "1e-4",
                 "--seed", "3", "--json",
                 "--quiet", "--var-opt", "layer0/weights:optimizer=adagrad,lr=0.05",
                 "--var-opt", "layer1/bias:weight-decay=0",
                 "--var-opt", "layer2/bias:optimizer=adam,lr=0.001"])
    rc, out, err = proc.wait(timeout=600)
    assert rc == 0, err[-2000:]
    acc = last_json(out)["test_accuracy"]
    print("mixed per-variable optimizers: test accuracy %.4f" % acc)
    if acc < TARGET[data]:
        failures.append("mixed: accuracy %.4f" % acc)
assert not failures, "\n".join(failures)
print("PASS: %d optimizers reach %.2f on %s" % (len(names), TARGET[data], data))

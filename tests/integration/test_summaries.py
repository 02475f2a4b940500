"""test_summaries.py - the chief's summaries (--logdir), read back with
TensorBoard's own reader, and `quorum plot`.

A sync run writes a point every 0.1 s and one at the end. TensorBoard's
EventAccumulator must find every scalar, steps that only go forward, and a
last point whose accuracy, test loss and step are the run's JSON summary's;
summaries.jsonl must hold the same points as the event file. `quorum plot`
draws a PNG from it. An async run's stale_gradients counts pushes, not
their variables (docs/SUMMARIES.md): the mlp's 6 variables are in every
push, so the staleness histogram holds 6 stale gradients per stale push.
A --logdir that cannot be created stops the chief with a message naming it.
Usage: test_summaries.py QUORUM_BINARY VENV_PYTHON"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from qrtest import Proc, last_json

quorum, venv_python = sys.argv[1], sys.argv[2]
work = tempfile.mkdtemp(prefix="qr-summaries-")
READ = r"""
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
a = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
a.Reload()
print(json.dumps({t: [[e.step, e.value] for e in a.Scalars(t)] for t in a.Tags()["scalars"]}))
"""
try:
    logdir = os.path.join(work, "logs")
    rc, out, err = Proc([quorum, "launch", "--ps", "2", "--workers", "2", "--mode", "sync",
                         "--steps", "800", "--logdir", logdir, "--summary-secs", "0.1",
                         "--json", "--quiet"]).wait(300)
    assert rc == 0, err[-3000:]
    run = last_json(out)
    files = os.listdir(logdir)
    assert "summaries.jsonl" in files and any(f.startswith("events.out.tfevents.") for f in files), files
    tb = json.loads(subprocess.run([venv_python, "-c", READ, logdir], capture_output=True,
                                   text=True, check=True, timeout=300).stdout)
    for tag in ("loss", "global_step/sec", "examples/sec", "stale_gradients", "learning_rate",
                "accuracy", "test_loss"):
        assert tag in tb, (tag, sorted(tb))
    steps = [s for s, _ in tb["loss"]]
    assert len(steps) >= 3 and steps == sorted(steps) and len(set(steps)) == len(steps), steps
    assert steps[-1] == run["global_step"] == 800, (steps[-1], run["global_step"])
    (acc_step, acc), = tb["accuracy"]
    assert acc_step == 800 and abs(acc - run["test_accuracy"]) < 1e-6, (acc, run["test_accuracy"])
    assert abs(tb["test_loss"][0][1] - run["test_loss"]) < 1e-5 * max(1, run["test_loss"])
    assert all(v == 0 for _, v in tb["stale_gradients"]), tb["stale_gradients"]  # R = N
    assert all(abs(v - 0.05) < 1e-7 for _, v in tb["learning_rate"])  # sgd's default, no decay
    lines = [json.loads(l) for l in open(os.path.join(logdir, "summaries.jsonl"))]
    assert [l["step"] for l in lines] == steps, ([l["step"] for l in lines], steps)
    for l, (_, v) in zip(lines, tb["loss"]):
        assert abs(l["loss"] - v) <= 1e-6 * max(1, abs(v)), (l["loss"], v)
    print("ok: %d points read back by TensorBoard; the last one is the run's summary "
          "(accuracy %.4f at step %d); summaries.jsonl agrees" % (len(steps), acc, acc_step))

    alogdir = os.path.join(work, "async-logs")
    rc, out, err = Proc([quorum, "launch", "--ps", "1", "--workers", "3", "--mode", "async",
                         "--model", "mlp", "--steps", "600", "--logdir", alogdir,
                         "--summary-secs", "0.1", "--json", "--quiet"]).wait(300)
    assert rc == 0, err[-3000:]
    arun = last_json(out)
    counts, pushes = arun["staleness"]["counts"], arun["staleness"]["stale_pushes"]
    assert sum(counts) % 6 == 0 and sum(counts[1:]) == 6 * pushes, arun["staleness"]
    assert pushes > 0, arun["staleness"]  # 3 async workers: some pushes are stale
    stale = [json.loads(l)["stale_gradients"] for l in open(os.path.join(alogdir,
                                                                          "summaries.jsonl"))]
    assert stale == sorted(stale), stale  # a count so far
    # the last point is read just after the JSON's statistics (other
    # workers may push in between); counted per variable it would be 6x
    slack = 20 + arun["global_step"] // 10
    assert pushes <= stale[-1] <= pushes + slack, (stale[-1], pushes, arun["global_step"])
    print("ok: async stale_gradients counts pushes (%d), not gradients (%d)"
          % (stale[-1], sum(counts[1:])))

    png = os.path.join(work, "run.png")
    p = subprocess.run([quorum, "plot", logdir, "-o", png], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    data = open(png, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10000, len(data)
    p = subprocess.run([quorum, "plot", os.path.join(work, "none"), "-o", png],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "summaries.jsonl" in p.stderr, p.stderr
    print("ok: quorum plot draws a %d-byte PNG; a folder without summaries is refused" % len(data))

    bad = "/proc/qr-no-such-dir/logs"
    rc, out, err = Proc([quorum, "launch", "--ps", "1", "--workers", "1", "--steps", "5",
                         "--logdir", bad, "--quiet"]).wait(120)
    assert rc == 1 and bad in err, (rc, err[-2000:])
    print("ok: a --logdir that cannot be created stops the run, naming it")
finally:
    shutil.rmtree(work, ignore_errors=True)

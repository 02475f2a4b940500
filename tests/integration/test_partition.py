"""test_partition.py - dense variables partitioned over the ps tasks, end
to end: `quorum launch` trains the digits MLP, 2 ps and 2 workers, with
--partition-min-mb small enough that every weight matrix is split in two.
Usage:
    test_partition.py QUORUM_BINARY VENV_PYTHON
  - sync: the run ends with exactly the parameters (params_digest) of the
    same run unpartitioned: the workers see one tensor;
  - async with --var-opt layer1/weights:partitions=2 trains to accuracy;
  - a checkpoint holds NAME/part_0 on one ps's shard and NAME/part_1 on the
    other (read by the safetensors library), whose rows make the whole
    variable; `quorum ckpt verify` accepts it and a second run restores it."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from qrtest import Proc, last_json

quorum, venv_python = sys.argv[1], sys.argv[2]
work = tempfile.mkdtemp(prefix="qr-partition-")


def launch(args, timeout=300):
    proc = Proc([quorum, "launch", "--ps", "2", "--workers", "2", "--data", "digits",
                 "--json"] + args)
    rc, out, err = proc.wait(timeout=timeout)
    assert rc == 0, "launch %s exited %d\n%s" % (args, rc, err[-4000:])
    return last_json(out), err


try:
    sync = ["--mode", "sync", "--steps", "300", "--optimizer", "adam", "--lr", "0.01"]
    plain, _ = launch(sync)
    split, log = launch(sync + ["--partition-min-mb", "0.001"])
    for name in ("layer0/weights", "layer1/weights"):
        assert "'%s' (" % name in log and "partitioned in 2 shards" in log, log[-3000:]
    print("sync: unpartitioned %s (accuracy %.4f), partitioned %s (accuracy %.4f)" % (
        plain["params_digest"], plain["test_accuracy"], split["params_digest"],
        split["test_accuracy"]))
    assert split["params_digest"] == plain["params_digest"], (plain, split)

    run, _ = launch(["--steps", "1500", "--var-opt", "layer1/weights:partitions=2,lr=0.05"])
    print("async, layer1/weights in 2 shards: accuracy %.4f" % run["test_accuracy"])
    assert run["test_accuracy"] > 0.9, run

    ckpt = os.path.join(work, "ckpt")
    first, _ = launch(sync + ["--partition-min-mb", "0.001", "--checkpoint-dir", ckpt])
    step_dir = os.path.join(ckpt, sorted(d for d in os.listdir(ckpt) if d.startswith("ckpt-"))[-1])
    check = subprocess.run([quorum, "ckpt", "verify", ckpt], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    script = r'''
import glob, json, sys
import numpy as np
from safetensors.numpy import load_file
shards = sorted(glob.glob(sys.argv[1] + "/shard-*.safetensors"))
assert len(shards) == 2, shards
held = [load_file(p) for p in shards]
out = {}
for name in ("layer0/weights", "layer1/weights"):
    parts = []
    for k in range(2):
        where = [i for i, t in enumerate(held) if "%s/part_%d" % (name, k) in t]
        assert len(where) == 1, (name, k, [sorted(t) for t in held])
        parts.append((where[0], held[where[0]]["%s/part_%d" % (name, k)]))
        assert name not in held[where[0]]
    assert parts[0][0] != parts[1][0], "both shards of %s on one ps" % name
    whole = np.concatenate([p for _, p in parts])
    assert parts[0][1].shape[1:] == parts[1][1].shape[1:]
    out[name] = list(whole.shape)
print(json.dumps(out))
'''
    res = subprocess.run([venv_python, "-c", script, step_dir], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    shapes = json.loads(res.stdout.strip().splitlines()[-1])
    print("shards in the checkpoint make:", shapes)
    assert shapes["layer0/weights"][0] == 64, shapes
    second, _ = launch(sync[:2] + ["--steps", "400"] + sync[4:] +
                       ["--partition-min-mb", "0.001", "--checkpoint-dir", ckpt])
    assert second["global_step"] == 400 and second["test_accuracy"] >= first["test_accuracy"] - 0.02, \
        (first, second)
    print("PASS: partitioned sync run equals the unpartitioned one (%s); async trained; shards "
          "checkpointed, verified and restored (step %d -> %d)" % (
              plain["params_digest"], first["global_step"], second["global_step"]))
finally:
    shutil.rmtree(work, ignore_errors=True)

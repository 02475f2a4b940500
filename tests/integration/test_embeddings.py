"""test_embeddings.py - embedding tables end to end: quorum gen-ctr writes
its default click set, and `quorum launch` trains the click models on it
with their tables sharded over 2 ps, each to within 0.01 of the hidden
model's test AUC (meta.json). Usage:
    test_embeddings.py QUORUM_BINARY VENV_PYTHON train|checkpoint
train       logreg and wide-deep, async and sync, and with the click
            models' defaults (no flag but --model)
checkpoint  a run with --checkpoint-dir: the tables are in the shards
            (read back with the safetensors library), `quorum ckpt verify`
            accepts them, and a second run restores them and goes on"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from qrtest import Proc, last_json

quorum, venv_python, case = sys.argv[1], sys.argv[2], sys.argv[3]
work = tempfile.mkdtemp(prefix="qr-embed-")


def launch(args, timeout=300, defaults=False):
    """A run with Adagrad at batch 256 given (the click models' defaults
    since; defaults=True gives nothing but args)."""
    given = [] if defaults else ["--optimizer", "adagrad", "--batch-size", "256"]
    proc = Proc([quorum, "launch", "--ps", "2", "--workers", "2", "--data", data, "--json",
                 "--quiet"] + given + args)
    rc, out, err = proc.wait(timeout=timeout)
    assert rc == 0, "launch %s exited %d\n%s" % (args, rc, err[-4000:])
    return last_json(out)


try:
    data = os.path.join(work, "ctr")
    rows = [] if case == "train" else ["--rows", "20000", "--fields", "8"]
    out = subprocess.run([quorum, "gen-ctr", "--out", data] + rows, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    print(out.strip())
    with open(os.path.join(data, "meta.json")) as f:
        meta = json.load(f)
    hidden = meta["hidden_auc"]
    assert meta["fields"] == (26 if case == "train" else 8)
    assert max(meta["vocabularies"]) == 1000000

    if case == "train":
        runs = {
            "logreg async": ["--model", "logreg", "--lr", "0.3", "--epochs", "3"],
            "logreg sync": ["--model", "logreg", "--lr", "0.3", "--epochs", "3",
                            "--mode", "sync"],
            "wide-deep async": ["--model", "wide-deep", "--hidden", "64,32", "--lr", "0.3",
                                "--epochs", "2", "--var-opt", "embedding:lr=0.05"],
            "wide-deep sync": ["--model", "wide-deep", "--hidden", "64,32", "--lr", "0.3",
                               "--epochs", "2", "--var-opt", "embedding:lr=0.05",
                               "--mode", "sync"],
            # each push the mean of 2 batches' gradients, rows summed by id
            "logreg accum 2": ["--model", "logreg", "--lr", "0.6", "--epochs", "3",
                               "--accumulate", "2"],
        }
        # The click models' own defaults (cli_click_defaults): the model
        # and the data only.
        runs["logreg defaults"] = ["--model", "logreg"]
        runs["wide-deep defaults"] = ["--model", "wide-deep"]
        for name, args in runs.items():
            s = launch(args, defaults=name.endswith("defaults"))
            if name.endswith("defaults"):
                assert s["optimizer"] == "adagrad" and s["batch_size"] == 256, s
            print("%-16s test AUC %.4f (hidden %.4f), log loss %.4f, %.0f examples/s" %
                  (name, s["test_auc"], hidden, s["test_logloss"], s["examples_per_sec"]))
            assert s["ps"] == 2 and "test_logloss" in s
            assert s["test_auc"] >= hidden - 0.01, \
                "%s: test AUC %.4f is more than 0.01 below the hidden model's %.4f" % (
                    name, s["test_auc"], hidden)
        print("PASS: every click model within 0.01 of the hidden AUC %.4f" % hidden)

    elif case == "checkpoint":
        ckpt = os.path.join(work, "ckpt")
        first = launch(["--model", "wide-deep", "--hidden", "16", "--lr", "0.2", "--steps", "60",
                        "--checkpoint-dir", ckpt])
        latest = sorted(d for d in os.listdir(ckpt) if d.startswith("ckpt-"))[-1]
        step_dir = os.path.join(ckpt, latest)
        check = subprocess.run([quorum, "ckpt", "verify", ckpt], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        # The shards, read by the safetensors library itself.
        script = r'''
import glob, json, sys, numpy as np
from safetensors.numpy import load_file
from safetensors import safe_open
total = {}
shards = sorted(glob.glob(sys.argv[1] + "/shard-*.safetensors"))
assert len(shards) == 2, shards
for path in shards:
    t = load_file(path)
    for name in ("wide", "embedding"):
        ids, rows = t[name + "/ids"], t[name]
        assert ids.dtype == np.int64 and rows.dtype == np.float32, (ids.dtype, rows.dtype)
        assert rows.shape == (ids.shape[0], 1 if name == "wide" else 8), rows.shape
        assert len(set(ids.tolist())) == ids.shape[0], "an id twice"
        acc = t[name + "/Adagrad"]
        assert acc.shape == rows.shape and (acc > 0).all()
        total[name] = total.get(name, 0) + ids.shape[0]
    with safe_open(path, "np") as f:
        tables = [v for v in json.loads(f.metadata()["quorum.variables"]) if "table" in v]
    assert {v["name"] for v in tables} == {"wide", "embedding"}, tables
print(json.dumps(total))
'''
        res = subprocess.run([venv_python, "-c", script, step_dir], capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        total = json.loads(res.stdout.strip().splitlines()[-1])
        print("rows in the checkpoint:", total)
        assert total["wide"] == total["embedding"] > 1000, total
        second = launch(["--model", "wide-deep", "--hidden", "16", "--lr", "0.2", "--steps",
                         "120", "--checkpoint-dir", ckpt])
        # Async: both workers may push the last step, so one more may count.
        assert 120 <= second["global_step"] <= 121, second
        print("PASS: tables checkpointed (%d rows each), verified, read by safetensors, and "
              "restored (step %d -> %d)" % (total["wide"], first["global_step"],
                                            second["global_step"]))
finally:
    shutil.rmtree(work, ignore_errors=True)

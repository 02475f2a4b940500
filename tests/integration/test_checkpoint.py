"""test_checkpoint.py - checkpoints and restore with real clusters
(`quorum launch`), and the shards read back with the safetensors library.

  resume     sync, 2 ps, 2 workers, Adam, --init-tokens 0: a run stopped at
             step 40 (its final checkpoint) and resumed to step 80 ends with
             the params_digest of an uninterrupted 80-step run; every shard
             of every checkpoint holds the same global step, Adam's slots
             under TensorFlow's names, and safetensors.numpy and
             safetensors.torch read them; periodic checkpoints every 20
             steps, pruned to --keep-checkpoints
  fallback   the newest checkpoint corrupted (one byte of a shard), torn
             (a manifest cut short) or incomplete (a shard missing): each
             time the restore warns naming the file and takes the previous
             complete one
  mismatch   a checkpoint restored into a model of other shapes is refused,
             naming the variable and both shapes; a different number of ps
             tasks is refused, naming both counts
  async      async with one ps and with two: resumed runs continue at the
             checkpoint's global step (the cut itself is tested with a
             workload where a torn one shows: tests/unit/test_ckpt_cut.c)
  mixed      the newest checkpoint's shard 0 replaced by the shard of an
             older step, and by the shard of the same step from another run,
             the manifest's size and crc32 rewritten to match: `ckpt verify`
             fails naming the shard and why, and the resume falls back to the
             previous checkpoint on every ps
  leftovers  a dead writer's .tmp-PID files are reported by `ckpt verify` and
             removed once the next checkpoint is complete; a newer write
             interrupted (no manifest) is reported and verify still exits 0;
             a manifest of another step is named as such; when every
             checkpoint is damaged the ps refuses to start fresh, naming the
             files, unless --allow-fresh-start
Usage: test_checkpoint.py QUORUM_BINARY VENV_PYTHON CASE"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib

from qrtest import Proc, last_json

quorum, venv_python, case = sys.argv[1], sys.argv[2], sys.argv[3]
work = tempfile.mkdtemp(prefix="qr-ckpt-test-")


def launch(args, expect_ok=True, timeout=180):
    p = Proc([quorum, "launch", "--quiet", "--json"] + args)
    rc, out, err = p.wait(timeout)
    if expect_ok:
        assert rc == 0, "launch %s failed (%d):\n%s" % (" ".join(args), rc, err[-3000:])
        return last_json(out), err
    return rc, err


def ckpts(d):
    return sorted(glob.glob(os.path.join(d, "ckpt-*")))


def manifest(path):
    with open(os.path.join(path, "manifest.json")) as f:
        return json.load(f)


def read_shards(path):
    """{file: {tensor: (dtype, shape, first value)}} with safetensors."""
    code = r"""
import json, sys
from safetensors.numpy import load_file
from safetensors.torch import load_file as load_torch
out = {}
for f in sys.argv[1:]:
    arrays = load_file(f)
    torch_keys = set(load_torch(f).keys())
    assert torch_keys == set(arrays), "torch and numpy disagree on " + f
    out[f] = {k: [str(v.dtype), list(v.shape), float(v.reshape(-1)[0]) if v.size else None]
              for k, v in arrays.items()}
print(json.dumps(out))
"""
    files = sorted(glob.glob(os.path.join(path, "shard-*.safetensors")))
    res = subprocess.run([venv_python, "-c", code] + files, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def verify(d):
    p = subprocess.run([quorum, "ckpt", "verify", d], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def forge(folder, shard_from, index):
    """Put shard_from in place of shard `index` of folder, and rewrite the
    manifest's size and crc32 to match it, as a hand or a bad copy would."""
    name = "shard-%05d-of-00002.safetensors" % index
    target = os.path.join(folder, name)
    shutil.copyfile(shard_from, target)
    data = open(target, "rb").read()
    m = manifest(folder)
    entry = [e for e in m["shards"] if e["file"] == name][0]
    entry["bytes"], entry["crc32"] = len(data), "%08x" % zlib.crc32(data)
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(m, f)
    return target


def flip(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 3)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xff]))


def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


SYNC = ["--ps", "2", "--workers", "2", "--mode", "sync", "--init-tokens", "0",
        "--optimizer", "adam", "--hidden", "32"]

try:
    if case == "resume":
        whole, _ = launch(SYNC + ["--steps", "80"])
        d = os.path.join(work, "ckpt")
        first, err = launch(SYNC + ["--steps", "40", "--checkpoint-dir", d,
                                    "--checkpoint-steps", "20", "--keep-checkpoints", "5"])
        assert "no checkpoint in" in err, err
        assert first["global_step"] == 40
        names = [os.path.basename(c) for c in ckpts(d)]
        assert names == ["ckpt-0000000020", "ckpt-0000000040"], names
        second, err = launch(SYNC + ["--steps", "80", "--checkpoint-dir", d,
                                     "--checkpoint-steps", "20", "--keep-checkpoints", "2"])
        assert "(global step 40)" in err and "restored" in err, err
        assert second["global_step"] == 80
        assert second["params_digest"] == whole["params_digest"], \
            "resumed %s, uninterrupted %s" % (second["params_digest"], whole["params_digest"])
        assert second["params_digest"] != first["params_digest"]
        # keep 2: the two newest stay
        names = [os.path.basename(c) for c in ckpts(d)]
        assert names == ["ckpt-0000000060", "ckpt-0000000080"], names
        for c in ckpts(d):
            m = manifest(c)
            step = int(c.rsplit("-", 1)[1])
            assert m["global_step"] == step and m["num_shards"] == 2 and m["mode"] == "sync"
            shards = read_shards(c)
            assert len(shards) == 2
            tensors = {}
            for f, t in shards.items():
                assert t["global_step"][:2] == ["int64", []], t["global_step"]
                assert t["global_step"][2] == step, (f, t["global_step"])
                tensors.update(t)
            for var in ("layer0/weights", "layer0/bias", "layer1/weights", "layer1/bias"):
                assert var in tensors, sorted(tensors)
                assert tensors[var + "/Adam"][1] == tensors[var][1]    # m
                assert tensors[var + "/Adam_1"][1] == tensors[var][1]  # v
            assert tensors["layer0/weights"][1] == [64, 32]
            positions = [t for t in shards.values() if "quorum/worker_data_position" in t]
            assert len(positions) == 1  # on ps 0's shard
        print("ok: resumed at 40 -> 80 has the uninterrupted digest %s; shards at one step, "
              "Adam slots named as TensorFlow's, read by safetensors numpy and torch"
              % whole["params_digest"])

    elif case == "fallback":
        d = os.path.join(work, "ckpt")
        launch(SYNC + ["--steps", "30", "--checkpoint-dir", d, "--checkpoint-steps", "10"])
        assert len(ckpts(d)) >= 2, ckpts(d)  # one may still be written at the next multiple
        previous = "(global step %d)" % int(ckpts(d)[-2].rsplit("-", 1)[1])

        def resume_from():
            res, err = launch(SYNC + ["--steps", "31", "--checkpoint-dir", d,
                                      "--checkpoint-steps", "1000", "--checkpoint-secs", "0"])
            return err

        newest = ckpts(d)[-1]
        shard = os.path.join(newest, "shard-00001-of-00002.safetensors")
        with open(shard, "r+b") as f:
            f.seek(os.path.getsize(shard) - 3)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0xff]))
        err = resume_from()
        assert "crc32" in err and shard in err, err
        assert previous in err, (previous, err)
        print("ok: a corrupt shard is named (crc32) and the previous checkpoint restored "
              "instead " + previous)
        # The run just wrote ckpt-31; tear its manifest.
        newest = ckpts(d)[-1]
        assert newest.endswith("0000000031"), ckpts(d)
        mpath = os.path.join(newest, "manifest.json")
        text = open(mpath).read()
        with open(mpath, "w") as f:
            f.write(text[:len(text) // 2])
        err = resume_from()
        assert mpath.rsplit("/", 1)[0] in err and "incomplete" in err, err
        assert previous in err, (previous, err)
        print("ok: a torn manifest is skipped with a warning naming it")
        # a missing shard
        shutil.rmtree(ckpts(d)[-1])  # the one just written at 31 again
        newest = ckpts(d)[-1]
        os.unlink(os.path.join(newest, "shard-00000-of-00002.safetensors"))
        err = resume_from()
        assert "shard-00000-of-00002.safetensors" in err and "cannot be opened" in err, err
        print("ok: a missing shard is named, and the previous checkpoint used")

    elif case == "mismatch":
        d = os.path.join(work, "ckpt")
        launch(SYNC + ["--steps", "10", "--checkpoint-dir", d])
        other = [a if a != "32" else "48" for a in SYNC]
        rc, err = launch(other + ["--steps", "20", "--checkpoint-dir", d], expect_ok=False)
        assert rc != 0
        assert "layer0/weights" in err and "[64,48]" in err and "[64,32]" in err, err
        print("ok: other shapes are refused naming the variable and both shapes")
        three = [a if a != "2" else "3" for a in SYNC[:2]] + SYNC[2:]
        rc, err = launch(three + ["--steps", "20", "--checkpoint-dir", d], expect_ok=False)
        assert rc != 0 and "has 2 shards" in err and "3 ps tasks" in err, err
        print("ok: another number of ps tasks is refused naming both")

    elif case == "async":
        d = os.path.join(work, "ckpt")
        base = ["--ps", "1", "--workers", "2", "--mode", "async", "--optimizer", "adam_async",
                "--checkpoint-dir", d, "--checkpoint-steps", "25"]
        first, err = launch(base + ["--steps", "50"])
        assert first["global_step"] >= 50
        last = ckpts(d)[-1]
        step = manifest(last)["global_step"]
        assert step >= first["global_step"], (step, first["global_step"])  # the final one
        tensors = read_shards(last)[os.path.join(last, "shard-00000-of-00001.safetensors")]
        # AdamAsync keeps its powers per variable: scalar slots
        assert tensors["layer0/weights/AdamAsync_2"][1] == [], tensors["layer0/weights/AdamAsync_2"]
        second, err = launch(base + ["--steps", "100"])
        assert "(global step %d)" % step in err, err
        assert second["global_step"] >= 100
        print("ok: async on one ps resumes at global step %d" % step)
        d2 = os.path.join(work, "ckpt2")
        two = ["--ps", "2", "--workers", "3", "--mode", "async", "--optimizer", "adam_async",
               "--checkpoint-dir", d2, "--checkpoint-steps", "40"]
        first, err = launch(two + ["--steps", "120"])
        last = ckpts(d2)[-1]
        step = manifest(last)["global_step"]
        assert step >= 120 and manifest(last)["num_shards"] == 2, manifest(last)
        shards = read_shards(last)
        assert all(t["global_step"][2] == step for t in shards.values()), shards
        # Long enough for workers 1 and 2 to start and join before the chief
        # ends the run (a worker that starts after its ps tasks have gone
        # waits for them until the launcher stops it: exit status 3).
        second, err = launch(two + ["--steps", "1000"])
        assert "(global step %d)" % step in err, err
        assert second["global_step"] >= 1000
        print("ok: async on two ps checkpoints at one global step and resumes at %d" % step)
    elif case == "mixed":
        d = os.path.join(work, "ckpt")
        args = SYNC + ["--checkpoint-dir", d, "--checkpoint-steps", "10"]
        launch(args + ["--steps", "30"])
        # (the one of step 20 may have been taken a few steps late)
        newest, older = ckpts(d)[-1], ckpts(d)[-2]
        assert newest.endswith("0000000030"), ckpts(d)
        old_step = int(older.rsplit("-", 1)[1])
        rc, out = verify(d)
        assert rc == 0, out
        # The same step from another run of the cluster (its own incarnation).
        d2 = os.path.join(work, "other")
        launch(SYNC + ["--checkpoint-dir", d2, "--checkpoint-steps", "10", "--steps", "30"])
        keep = open(os.path.join(newest, "shard-00000-of-00002.safetensors"), "rb").read()
        keep_manifest = open(os.path.join(newest, "manifest.json")).read()
        shard = forge(newest, os.path.join(d2, "ckpt-0000000030",
                                           "shard-00000-of-00002.safetensors"), 0)
        rc, out = verify(d)
        assert rc == 1 and shard + "' belongs to checkpoint" in out, out
        assert "mixed checkpoints" in out, out
        print("ok: a shard of the same step from another run fails verify, named")
        # Shard 0 of an older step in the checkpoint of step 30.
        shard = forge(newest, os.path.join(older, "shard-00000-of-00002.safetensors"), 0)
        rc, out = verify(d)
        assert rc == 1, out
        assert shard + "' holds global step %d" % old_step in out and "mixed steps" in out, out
        assert older + ": ok" in out, out
        print("ok: verify fails naming the shard of step %d in the checkpoint of step 30"
              % old_step)
        res, err = launch(SYNC + ["--checkpoint-dir", d, "--checkpoint-steps", "1000",
                                  "--checkpoint-secs", "0", "--steps", "31"])
        assert shard in err and "mixed steps" in err, err
        restored = [l for l in err.splitlines() if "restored" in l]
        assert len(restored) == 2, restored
        assert all("(global step %d)" % old_step in l for l in restored), restored
        assert res["global_step"] == 31, res
        print("ok: the resume skips it with a warning naming the shard; both ps restore step %d"
              % old_step)
        # With the shard put back, the checkpoint is whole again.
        with open(os.path.join(newest, "shard-00000-of-00002.safetensors"), "wb") as f:
            f.write(keep)
        with open(os.path.join(newest, "manifest.json"), "w") as f:
            f.write(keep_manifest)
        rc, out = verify(d)
        assert rc == 0 and "ckpt-0000000030: ok" in out, out

    elif case == "leftovers":
        d = os.path.join(work, "ckpt")
        base = SYNC + ["--checkpoint-dir", d, "--checkpoint-secs", "0"]
        launch(base + ["--steps", "20", "--checkpoint-steps", "10"])
        first, second = os.path.join(d, "ckpt-0000000010"), os.path.join(d, "ckpt-0000000020")
        assert ckpts(d) == [first, second], ckpts(d)
        pid = dead_pid()
        stale = os.path.join(first, "shard-00001-of-00002.safetensors.tmp-%d" % pid)
        open(stale, "wb").write(b"half a shard")
        interrupted = os.path.join(d, "ckpt-0000000025")
        os.mkdir(interrupted)
        stale2 = os.path.join(interrupted, "shard-00000-of-00002.safetensors.tmp-%d" % pid)
        open(stale2, "wb").write(b"half a shard")
        rc, out = verify(d)
        assert rc == 0, out
        assert interrupted + ": not a checkpoint" in out and "no manifest.json" in out, out
        assert stale + ": a temporary file left by a writer that died (pid %d" % pid in out, out
        assert stale2 + ": a temporary file left by a writer that died" in out, out
        assert second + ": ok" in out and first + ": ok" in out, out
        print("ok: verify exits 0 with a newer write interrupted, and reports the dead "
              "writers' temporary files")
        # A manifest of another step in a folder: named as such.
        saved = open(os.path.join(first, "manifest.json")).read()
        shutil.copyfile(os.path.join(second, "manifest.json"), os.path.join(first, "manifest.json"))
        rc, out = verify(d)
        assert rc == 1 and "says global step 20 but its folder is named for step 10" in out, out
        assert "no readable manifest" not in out, out
        print("ok: a manifest of step 20 in the folder of step 10 is named as such")
        open(os.path.join(first, "manifest.json"), "w").write(saved)
        # The next checkpoint removes the dead writers' files.
        res, err = launch(base + ["--steps", "22", "--checkpoint-steps", "1000"])
        assert not os.path.exists(stale) and not os.path.exists(stale2), os.listdir(first)
        assert "removed '%s'" % stale in err, err
        print("ok: the next checkpoint removes them, naming each")
        # Every checkpoint damaged: no fresh start unless asked.
        for c in ckpts(d):
            if os.path.exists(os.path.join(c, "manifest.json")):
                flip(os.path.join(c, "shard-00001-of-00002.safetensors"))
        rc, err = launch(base + ["--steps", "24"], expect_ok=False, timeout=120)
        assert rc != 0, err
        assert "refusing to start fresh" in err and "--allow-fresh-start" in err, err
        for step in (10, 20, 22):
            assert os.path.join(d, "ckpt-%010d" % step, "shard-00001-of-00002.safetensors") \
                in err, (step, err)
        print("ok: with every checkpoint damaged the ps refuses to start, naming each file")
        res, err = launch(base + ["--steps", "4", "--allow-fresh-start"])
        assert "as --allow-fresh-start says" in err and res["global_step"] == 4, err
        print("ok: --allow-fresh-start starts from scratch, with a warning")
    else:
        raise SystemExit("unknown case " + case)
finally:
    shutil.rmtree(work, ignore_errors=True)

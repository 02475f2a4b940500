"""test_ckpt_incremental.py - incremental checkpoints end to end: real
clusters (2 ps, 2 workers, sync, --init-tokens 0, so that runs of the same
seed are equal bit for bit) train the click model wide-deep with admission
and eviction on its embedding table and write checkpoints every 10 steps.
Usage:
    test_ckpt_incremental.py QUORUM_BINARY VENV_PYTHON READ_CHECKPOINT_PY equal|corrupt|tiered

equal    run A writes chains (--checkpoint-full-every 4) for 60 steps; run B,
         the same run with only full checkpoints (--checkpoint-full-every
         1), stops at the step of A's newest increment. read_checkpoint.py
         merges A's chain there into a full state equal row for row (rows
         by id with their Adagrad slots and update steps, admission counts,
         dense variables and slots, counters) to B's final checkpoint, and
         `quorum ckpt verify` accepts the merged folder. Ids the chain
         removed (evicted) and did not make again are absent. Then both
         runs resume to step 90, A from its newest checkpoint (a chain when
         it is an increment) and B from its full one: they end with the
         same params_digest and the same final checkpoint, row for row. The
         bytes of each incremental checkpoint and of B's full one of the
         same step are printed.
corrupt  a chain with a byte of one increment's shard flipped: `quorum ckpt
         verify` exits 1 naming that shard for it and the broken link for
         each later one; a restart restores the newest restorable state, the
         link before the damaged one (logged), not a partial chain;
         read_checkpoint.py refuses the damaged chain. Then a link removed:
         the same fallback, naming the missing checkpoint.
tiered   a table with a disk tier (--table-memory-mb 1, embedding dim 32:
         the embedding table about four times what each ps keeps in
         memory): run A writes a chain (a checkpoint every 2 steps, a full
         one every 100) while rows move between memory and disk all along;
         rows changed and then spilled before the next checkpoint must be
         in its increment (read from disk), moves must not be written as
         changes, and rows evicted on either tier are in removed_ids. The
         chain merged equals row for row (ids, values, Adagrad slots,
         update steps, admission counts) the full checkpoint of the same
         step of run B, the same run all in memory with full checkpoints
         only; `quorum ckpt verify` accepts the chain; the newest increment
         is under a third of B's full checkpoint in bytes. Then A resumes
         from that chain (tiered) and B from its full checkpoint of the same
         step: the same params_digest and final state."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from qrtest import Proc, last_json

quorum, venv_python, reader, case = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
work = tempfile.mkdtemp(prefix="qr-incr-")
EMB_OPTS = "embedding:optimizer=adagrad,lr=0.05,admit_after=2,evict_after_steps=8"


def launch(ckpt, steps, full_every, every=10, emb=EMB_OPTS, extra=()):
    proc = Proc([quorum, "launch", "--ps", "2", "--workers", "2", "--mode", "sync",
                 "--init-tokens", "0", "--data", data, "--model", "wide-deep", "--hidden", "16",
                 "--optimizer", "adagrad", "--batch-size", "256", "--lr", "0.2", "--seed", "5",
                 "--steps", str(steps), "--checkpoint-dir", ckpt, "--checkpoint-steps",
                 str(every), "--checkpoint-full-every", str(full_every), "--var-opt", emb,
                 "--json", "--quiet"] + list(extra))
    rc, out, err = proc.wait(timeout=300)
    assert rc == 0, "launch exited %d\n%s" % (rc, err[-4000:])
    return last_json(out), err


def manifest(folder):
    with open(os.path.join(folder, "manifest.json")) as f:
        return json.load(f)


def folders(ckpt):
    return sorted(glob.glob(os.path.join(ckpt, "ckpt-*")))


def verify(ckpt):
    r = subprocess.run([quorum, "ckpt", "verify", ckpt], capture_output=True, text=True,
                       timeout=120)
    return r.returncode, r.stdout + r.stderr


# Two full checkpoint folders, compared row for row by the safetensors
# library: every tensor of every shard, a table's rows (and per-row slots
# and update steps) matched by id, its admission candidates by id.
COMPARE = r'''
import json, sys, numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file
a_dir, b_dir = sys.argv[1], sys.argv[2]
checked = 0
for k in range(2):
    name = "shard-%05d-of-00002.safetensors" % k
    a, b = load_file(a_dir + "/" + name), load_file(b_dir + "/" + name)
    with safe_open(a_dir + "/" + name, "np") as f:
        recs = json.loads(f.metadata()["quorum.variables"])
    per_row, cands = set(), set()
    for r in recs:
        if "table" in r:
            n = r["name"]
            rows = [n] + [s for s in r["slots"] if a[s].ndim == 2] + [n + "/update_steps"]
            oa, ob = np.argsort(a[n + "/ids"]), np.argsort(b[n + "/ids"])
            assert np.array_equal(a[n + "/ids"][oa], b[n + "/ids"][ob]), "table %s: ids" % n
            for t in rows:
                if t in a or t in b:
                    assert np.array_equal(a[t][oa], b[t][ob]), "table %s: %s differs" % (n, t)
                    per_row.add(t)
            ca, cb = a.get(n + "/admission_ids"), b.get(n + "/admission_ids")
            if ca is not None or cb is not None:
                pa, pb = np.argsort(ca), np.argsort(cb)
                assert np.array_equal(ca[pa], cb[pb]), "table %s: other candidates" % n
                assert np.array_equal(a[n + "/admission_counts"][pa],
                                      b[n + "/admission_counts"][pb]), "%s: counts" % n
                cands |= {n + "/admission_ids", n + "/admission_counts"}
            per_row.add(n + "/ids")
            checked += len(oa)
    assert set(a) == set(b) - {t for t in b if t.endswith("/removed_ids")}, \
        (sorted(set(a) ^ set(b)))
    for t in a:
        if t in per_row or t in cands:
            continue
        assert a[t].dtype == b[t].dtype and np.array_equal(a[t], b[t]), "%s differs" % t
print(json.dumps({"rows": checked}))
'''


def same_state(a_dir, b_dir):
    r = subprocess.run([venv_python, "-c", COMPARE, a_dir, b_dir], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, "%s and %s differ:\n%s" % (a_dir, b_dir, r.stdout + r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])["rows"]


def removed_ids(folder, made_again=False):
    """The ids increment `folder` lists as removed and does not make again
    (or all it lists, made_again)."""
    r = subprocess.run([venv_python, "-c", r'''
import json, sys
from safetensors.numpy import load_file
gone = set()
for k in range(2):
    t = load_file(sys.argv[1] + "/shard-%05d-of-00002.safetensors" % k)
    gone |= set(t["embedding/removed_ids"].tolist()) - (
        set() if sys.argv[2] == "1" else set(t["embedding/ids"].tolist()))
print(json.dumps(sorted(gone)))
''', folder, "1" if made_again else "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return set(json.loads(r.stdout))


def ids_in(folder):
    r = subprocess.run([venv_python, "-c", r'''
import json, sys
from safetensors.numpy import load_file
ids = set()
for k in range(2):
    t = load_file(sys.argv[1] + "/shard-%05d-of-00002.safetensors" % k)
    ids |= set(t["embedding/ids"].tolist())
print(json.dumps(sorted(ids)))
''', folder], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return set(json.loads(r.stdout))


def restored_step(err):
    m = re.findall(r"ps 0 pid \d+\] info: restored .*\(global step (\d+)\)", err)
    assert m, "no restore logged:\n" + err[-3000:]
    return int(m[0])


try:
    data = os.path.join(work, "ctr")
    subprocess.run([quorum, "gen-ctr", "--out", data, "--rows", "20000", "--fields", "8"],
                   check=True, capture_output=True, text=True, timeout=120)
    a, b = os.path.join(work, "A"), os.path.join(work, "B")

    if case == "equal":
        first_a, _ = launch(a, 60, 4)
        # A's newest increment (normally step 60; on a loaded machine a
        # checkpoint that waits for its predecessor's write starts some
        # steps late, which shifts the chain). B is the same run with full
        # checkpoints only, stopped at that step: runs of this seed are
        # equal step for step (lockstep), so B's final checkpoint is A's
        # state there.
        tip = manifest(os.path.join(a, "ckpt-0000000060"))
        incs = [manifest(f) for f in folders(a) if manifest(f)["kind"] == "incremental"]
        assert incs, "run A wrote no increment: %s" % [
            (manifest(f)["global_step"], manifest(f)["kind"]) for f in folders(a)]
        inc = incs[-1]
        step = inc["global_step"]
        folder = "ckpt-%010d" % step
        launch(b, step, 1)
        assert manifest(os.path.join(b, folder))["kind"] == "full"
        assert inc["version"] == 3, inc
        rc, out = verify(a)
        assert rc == 0 and "incremental on step" in out, out
        print(out.strip())
        assert all(manifest(f)["kind"] == "full" for f in folders(b))
        # ls and show say which kind, and an increment's base
        r = subprocess.run([quorum, "ckpt", "ls", a], capture_output=True, text=True, timeout=60)
        lines = {int(l.split()[0]): l for l in r.stdout.splitlines()[1:]}
        assert "incr of %d" % inc["base_step"] in lines[step] and "full" in lines[10], r.stdout
        r = subprocess.run([quorum, "ckpt", "show", a, "--step", str(step)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 and ("incremental: base step %d" % inc["base_step"]) in \
            r.stdout.splitlines()[0], r.stdout[:2000]
        # bytes written: each increment beside the full one of the same step
        for f in folders(a):
            m = manifest(f)
            full = os.path.join(b, os.path.basename(f))
            if m["kind"] == "incremental" and os.path.exists(full):
                fb = sum(s["bytes"] for s in manifest(full)["shards"])
                ib = sum(s["bytes"] for s in m["shards"])
                print("step %d: incremental %d bytes, full %d bytes: %.2fx fewer"
                      % (m["global_step"], ib, fb, fb / ib))
        # read_checkpoint.py merges the chain: B's full state, row for row
        merged = os.path.join(work, "M", folder)
        r = subprocess.run([venv_python, reader, os.path.join(a, folder), "--merge", merged],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "merged from the full checkpoint of step %d" % inc["full_step"] in r.stdout, \
            r.stdout
        rows = same_state(merged, os.path.join(b, folder))
        rc, out = verify(os.path.join(work, "M"))
        assert rc == 0, out
        print("ok: the merged chain equals the full checkpoint, %d rows compared" % rows)
        # ids the last increment removed (evicted) stay removed
        gone = removed_ids(os.path.join(a, folder))
        assert gone, "no id was evicted in the last interval: the test does not test removal"
        assert not gone & ids_in(merged), "a removed id came back"
        print("ok: %d ids removed in the last interval stay removed" % len(gone))
        # quorum's own restore: A from its chain, B from its full checkpoint
        # (A resumes at step 60, B at `step`: both end at 90, equal if each
        # restore put back exactly the state of that step.)
        second_a, err_a = launch(a, 90, 4)
        second_b, err_b = launch(b, 90, 1)
        assert restored_step(err_a) == 60 and restored_step(err_b) == step
        if tip["kind"] == "incremental":
            assert re.search(r"increment\(s\) after step %d" % tip["full_step"], err_a), \
                err_a[-3000:]
        assert second_a["params_digest"] == second_b["params_digest"], (second_a, second_b)
        # the first checkpoint after a restart is full
        after = [manifest(f) for f in folders(a) if manifest(f)["global_step"] > 60]
        assert after and after[0]["kind"] == "full", after[:1]
        merged = os.path.join(work, "M", "ckpt-0000000090")
        r = subprocess.run([venv_python, reader, os.path.join(a, "ckpt-0000000090"), "--merge",
                            merged], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        rows = same_state(merged, os.path.join(b, "ckpt-0000000090"))
        print("PASS: restored from a chain == restored from a full checkpoint (digest %s, "
              "%d rows at step 90)" % (second_a["params_digest"], rows))

    elif case == "tiered":
        tier_emb = "embedding:optimizer=adagrad,lr=0.05,admit_after=2,evict_after_steps=40"
        tiered = ["--embedding-dim", "32", "--table-memory-mb", "1", "--keep-checkpoints", "100"]
        # Worker 0 sleeps 30 ms a step (the same results, slower steps): a
        # checkpoint every 2 steps is then not held back by its
        # predecessor's write on a loaded machine.
        first_a, _ = launch(a, 110, 100, 2, tier_emb, tiered + ["--slow-worker", "0:30"])
        emb = first_a["sync"]["tables"]["embedding"]
        # the table several times what memory holds, rows moving all along
        assert emb["rows_disk"] > 2 * emb["rows_memory"] and emb["rows_spilled"] > emb["rows"] \
            and emb["disk_hits"] > 0, emb
        incs = [manifest(f) for f in folders(a) if manifest(f)["kind"] == "incremental"]
        assert len(incs) >= 5, [(manifest(f)["global_step"], manifest(f)["kind"])
                                for f in folders(a)]
        # The increment compared: of the second epoch (the table made),
        # the one of the shortest interval (a checkpoint that waits for
        # its predecessor's write on a loaded machine starts late).
        late = [m for m in incs if m["global_step"] >= 80] or incs
        inc = min(late, key=lambda m: (m["global_step"] - m["base_step"], -m["global_step"]))
        step = inc["global_step"]
        folder = "ckpt-%010d" % step
        chain = [f for f in folders(a) if inc["full_step"] <= manifest(f)["global_step"] <= step]
        gone = set()
        for f in chain[1:]:
            gone |= removed_ids(f, made_again=True)
        assert gone, "no id was evicted along the chain: the test does not test removal " \
            "(%s)" % [(manifest(f)["global_step"], manifest(f)["kind"]) for f in chain]
        launch(b, step, 1, 2, tier_emb, ["--embedding-dim", "32", "--keep-checkpoints", "100"])
        assert manifest(os.path.join(b, folder))["kind"] == "full"
        rc, out = verify(a)
        assert rc == 0 and "incremental on step" in out, out
        fb = sum(s["bytes"] for s in manifest(os.path.join(b, folder))["shards"])
        ib = sum(s["bytes"] for s in inc["shards"])
        print("step %d: incremental (of %d steps) %d bytes, full %d bytes: %.2fx fewer (%d "
              "links after the full checkpoint of step %d)"
              % (step, step - inc["base_step"], ib, fb, fb / ib, len(chain) - 1,
                 inc["full_step"]))
        assert 3 * ib < fb, "the increment is not much smaller than a full checkpoint"
        merged = os.path.join(work, "M", folder)
        r = subprocess.run([venv_python, reader, os.path.join(a, folder), "--merge", merged],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        rows = same_state(merged, os.path.join(b, folder))
        rc, out = verify(os.path.join(work, "M"))
        assert rc == 0, out
        print("ok: a tiered table's chain (%d ids removed along it) merged equals the full "
              "checkpoint of the run all in memory, %d rows compared" % (len(gone), rows))
        # Both resume from `step` (eviction's sweeps keep time from the
        # restart: the same step for both), A from its chain (tiered).
        for f in folders(a):
            if manifest(f)["global_step"] > step:
                shutil.rmtree(f)
        second_a, err_a = launch(a, 140, 100, 2, tier_emb, tiered)
        second_b, err_b = launch(b, 140, 1, 2, tier_emb,
                                 ["--embedding-dim", "32", "--keep-checkpoints", "100"])
        assert restored_step(err_a) == step and restored_step(err_b) == step
        assert second_a["params_digest"] == second_b["params_digest"], (second_a, second_b)
        merged = os.path.join(work, "M", "ckpt-0000000140")
        r = subprocess.run([venv_python, reader, os.path.join(a, "ckpt-0000000140"), "--merge",
                            merged], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        rows = same_state(merged, os.path.join(b, "ckpt-0000000140"))
        print("PASS: a tiered table's chain restored == a full checkpoint restored all in memory "
              "(digest %s, %d rows at step 140)" % (second_a["params_digest"], rows))

    elif case == "corrupt":
        # Worker 0 sleeps 10 ms a step: on a loaded machine a run this
        # short otherwise writes few checkpoints (the multiples of 10
        # reached while one is being written collapse into one, taken when
        # it is done), leaving too short a chain.
        slow = ["--slow-worker", "0:10"]
        launch(a, 120, 20, extra=slow)
        chain = folders(a)
        kinds = [manifest(f)["kind"] for f in chain]
        assert kinds[0] == "full" and all(k == "incremental" for k in kinds[1:]) \
            and len(chain) >= 3, list(zip(chain, kinds))
        spare = os.path.join(work, "A2")
        shutil.copytree(a, spare)
        damaged = chain[-2]  # the tip's base
        shard = os.path.join(damaged, "shard-00001-of-00002.safetensors")
        with open(shard, "r+b") as f:
            f.seek(os.path.getsize(shard) - 5)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0x40]))
        rc, out = verify(a)
        print(out.strip())
        assert rc == 1, out
        assert "%s: checkpoint shard '%s' has crc32" % (damaged, shard) in out, out
        for later in chain[-1:]:
            assert re.search(re.escape(later) + r": incremental checkpoint .*the link of step "
                             + str(int(damaged[-10:])), out), out
        for good in chain[:-2]:
            assert good + ": ok" in out, out
        r = subprocess.run([venv_python, reader, a], capture_output=True, text=True, timeout=300)
        assert r.returncode != 0 and "corrupt" in r.stdout + r.stderr, r.stdout + r.stderr
        _, err = launch(a, 130, 20, extra=slow)
        want = int(chain[-3][-10:])
        assert restored_step(err) == want, err[-3000:]
        assert "checkpoint skipped" in err and shard in err, err[-3000:]
        print("ok: a damaged increment: verify names it, the restart restores step %d" % want)
        # a missing link: the same fallback
        shutil.rmtree(os.path.join(spare, os.path.basename(damaged)))
        rc, out = verify(spare)
        assert rc == 1 and "has no manifest.json" in out, out
        _, err = launch(spare, 130, 20, extra=slow)
        assert restored_step(err) == want, err[-3000:]
        print("PASS: a damaged or missing link of a chain: verify fails, the restore falls back "
              "to step %d, the newest whole chain" % want)
finally:
    shutil.rmtree(work, ignore_errors=True)

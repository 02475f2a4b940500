"""test_table_tier_ckpt.py - a full checkpoint and a restore of a table
several times --table-memory-mb, streamed: the ps's anonymous resident
memory (RssAnon of /proc/PID/status, sampled every 20 ms) stays within the
cap plus a fixed overhead (OVERHEAD_MB) while it restores the table and
while it takes a full checkpoint of it, and both are exact.

The click model (wide-deep, dim 8, Adagrad, sync, 1 ps) trains 2 steps and
writes a full checkpoint; its `embedding` table is grown to ROWS rows (ids
the data never draws, as scripts/bench_ckpt_incremental.py does), about
ROWS x 81 bytes in memory, several times CAP_MB. Then:
  A: resumed with --table-memory-mb CAP_MB, 2 steps, a full checkpoint
     (the restore and the checkpoint both streamed: docs/EMBEDDINGS.md);
  B: resumed all in memory, the same 2 steps and checkpoint;
  A's checkpoint equals B's row for row (the safetensors library: ids,
  rows, Adagrad's accumulators), the rows only on disk were read by the
  checkpoint's writer thread from the tier's snapshot (the ps's
  checkpoint.disk_rows_off_loop), not on the loop at the cut,
  `quorum ckpt verify` accepts it, and A's
  ps stayed within CAP_MB + OVERHEAD_MB (B's did not: the table is large
  enough to tell). Then A2 resumes from A's streamed checkpoint, tiered,
  2 more steps, and B2 from B's all in memory: equal row for row again, A2
  within the bound. Usage:
    test_table_tier_ckpt.py QUORUM_BINARY VENV_PYTHON READ_CHECKPOINT_PY"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

from qrtest import Proc, last_json, sanitized, wait_sampling_ps_rss

ROWS = int(os.environ.get("QR_TIER_CKPT_ROWS", "1000000"))
CAP_MB = 16
OVERHEAD_MB = 32

quorum, venv_python, reader = sys.argv[1], sys.argv[2], sys.argv[3]
work = tempfile.mkdtemp(prefix="qr-tier-ckpt-")


def launch(ckpt, steps, extra=()):
    """A sync launch (1 ps, 2 workers) to global step `steps`, a checkpoint
    every 2 steps; its JSON and its ps's peak RssAnon (MiB)."""
    proc = Proc([quorum, "launch", "--ps", "1", "--workers", "2", "--mode", "sync",
                 "--data", data, "--model", "wide-deep", "--optimizer", "adagrad",
                 "--batch-size", "256", "--seed", "5", "--steps", str(steps),
                 "--checkpoint-dir", ckpt, "--checkpoint-steps", "2", "--keep-checkpoints", "10",
                 "--json", "--quiet"] + list(extra))
    rc, out, err, peak_mb = wait_sampling_ps_rss(proc, 600, 0.02)
    assert rc == 0, "launch %s exited %d\n%s" % (extra, rc, err[-4000:])
    return last_json(out), peak_mb


def newest(ckpt):
    return sorted(glob.glob(os.path.join(ckpt, "ckpt-*")))[-1]


def venv(code, *args):
    r = subprocess.run([venv_python, "-c", code, reader] + list(args), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


GROW = r'''
import importlib.util, json, shutil, sys, numpy as np
spec = importlib.util.spec_from_file_location("read_checkpoint", sys.argv[1])
reader = importlib.util.module_from_spec(spec); spec.loader.exec_module(reader)
folder, rows = sys.argv[2], int(sys.argv[3])
manifest, shards = reader.read_chain(folder)
state, meta = shards[0]
n = state["embedding/ids"].shape[0]
grow = rows - n
rng = np.random.default_rng(1)
records = json.loads(meta["quorum.variables"])
rec = next(r for r in records if r["name"] == "embedding")
state["embedding"] = np.concatenate(
    [state["embedding"], rng.normal(0, 0.01, (grow, state["embedding"].shape[1])).astype(np.float32)])
state["embedding/ids"] = np.concatenate(
    [state["embedding/ids"], (np.int64(1) << 40) + np.arange(grow, dtype=np.int64)])
for s in rec["slots"]:
    if state[s].ndim == 2:
        state[s] = np.concatenate([state[s], rng.uniform(0.1, 1, (grow, state[s].shape[1])).astype(np.float32)])
rec["table"]["rows"] = int(state["embedding/ids"].shape[0])
meta["quorum.variables"] = json.dumps(records)
shutil.rmtree(folder)
reader.write_merged(folder, manifest, shards)
print(json.dumps({"trained": int(n), "rows": int(rows)}))
'''

# Two full checkpoints of one shard, equal row for row (tables matched by
# id: the tiered one writes its rows in memory first, then the disk's in
# key order), every other tensor byte for byte.
COMPARE = r'''
import json, sys, numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file
name = "shard-00000-of-00001.safetensors"
a, b = load_file(sys.argv[2] + "/" + name), load_file(sys.argv[3] + "/" + name)
with safe_open(sys.argv[2] + "/" + name, "np") as f:
    recs = json.loads(f.metadata()["quorum.variables"])
assert set(a) == set(b), sorted(set(a) ^ set(b))
done, rows = set(), {}
for r in recs:
    if "table" not in r:
        continue
    n = r["name"]
    oa, ob = np.argsort(a[n + "/ids"]), np.argsort(b[n + "/ids"])
    assert np.array_equal(a[n + "/ids"][oa], b[n + "/ids"][ob]), "table %s: ids" % n
    for t in [n, n + "/ids", n + "/update_steps"] + [s for s in r["slots"] if a[s].ndim == 2]:
        if t in a:
            assert np.array_equal(a[t][oa], b[t][ob]), "table %s: %s differs" % (n, t)
            done.add(t)
    rows[n] = len(oa)
for t in set(a) - done:
    assert a[t].dtype == b[t].dtype and np.array_equal(a[t], b[t]), "%s differs" % t
print(json.dumps(rows))
'''

try:
    data = os.path.join(work, "ctr")
    subprocess.run([quorum, "gen-ctr", "--out", data, "--rows", "20000"], check=True,
                   capture_output=True, text=True, timeout=120)
    base = os.path.join(work, "base")
    launch(base, 2)
    grown = newest(base)
    print("grown:", venv(GROW, grown, str(ROWS)).strip())
    start = json.load(open(os.path.join(grown, "manifest.json")))["global_step"]
    a_dir, b_dir = os.path.join(work, "a"), os.path.join(work, "b")
    shutil.copytree(base, a_dir)
    shutil.copytree(base, b_dir)
    tier = ["--table-memory-mb", str(CAP_MB)]
    a_run, a_mb = launch(a_dir, start + 2, tier)
    b_run, b_mb = launch(b_dir, start + 2)
    # The rows only on disk were read by the checkpoint's writer thread
    # from the tier's snapshot, not on the loop at the cut (at most the
    # cap's rows, under 200,000 here, are spooled there).
    a_ck_stats, b_ck_stats = a_run["sync"]["checkpoint"], b_run["sync"]["checkpoint"]
    assert a_ck_stats["disk_rows_off_loop"] >= ROWS * 3 // 4, a_ck_stats
    assert b_ck_stats["disk_rows_off_loop"] == 0, b_ck_stats
    print("ok: the cut left %d rows on disk to the writer (its snapshot); the loop's longest cut "
          "%.1f ms tiered, %.1f ms all in memory" % (a_ck_stats["disk_rows_off_loop"],
                                                    a_ck_stats["max_snapshot_ms"],
                                                    b_ck_stats["max_snapshot_ms"]))
    a_ck, b_ck = newest(a_dir), newest(b_dir)
    assert json.load(open(os.path.join(a_ck, "manifest.json"))).get("kind", "full") == "full"
    r = subprocess.run([quorum, "ckpt", "verify", a_dir], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(venv(COMPARE, a_ck, b_ck))
    assert rows["embedding"] >= ROWS, rows
    print("ok: restored and checkpointed tiered == all in memory, row for row (%s); "
          "ps RssAnon %.1f MiB tiered, %.1f MiB all in memory" % (rows, a_mb, b_mb))
    # again, from the streamed checkpoint
    _, a2_mb = launch(a_dir, start + 4, tier)
    _, b2_mb = launch(b_dir, start + 4)
    rows = json.loads(venv(COMPARE, newest(a_dir), newest(b_dir)))
    print("ok: resumed from the streamed checkpoint == from the all-in-memory one (%s); "
          "ps RssAnon %.1f MiB tiered, %.1f MiB all in memory" % (rows, a2_mb, b2_mb))
    bound = CAP_MB + OVERHEAD_MB
    print(json.dumps({"rows": ROWS, "cap_mb": CAP_MB, "bound_mb": bound,
                      "tiered_rss_anon_mb": [round(a_mb, 1), round(a2_mb, 1)],
                      "all_in_memory_rss_anon_mb": [round(b_mb, 1), round(b2_mb, 1)]}))
    if sanitized(quorum):
        print("(a sanitizer build: the memory bound is checked by the plain build)")
    else:
        assert max(a_mb, a2_mb) <= bound, "ps RssAnon %.1f MiB over the cap + overhead %d MiB" % (
            max(a_mb, a2_mb), bound)
        assert b_mb > bound, "the all-in-memory run (%.1f MiB) is within %d MiB: the table " \
            "is too small to tell" % (b_mb, bound)
    print("PASS: a table of %d rows restored and checkpointed under --table-memory-mb %d: "
          "ps RssAnon at most %.1f MiB (bound %d), %.1f MiB all in memory; equal row for row"
          % (ROWS, CAP_MB, max(a_mb, a2_mb), bound, max(b_mb, b2_mb)))
finally:
    shutil.rmtree(work, ignore_errors=True)

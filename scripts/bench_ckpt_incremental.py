#!/usr/bin/env python3
"""bench_ckpt_incremental.py - bytes written per incremental checkpoint
against per full one, on the click model with a large embedding table (the
goal of docs/CHECKPOINTS.md, "Incremental checkpoints": at 10 million rows,
with an interval that touches under 10% of them, at least 10x fewer bytes).

    scripts/bench_ckpt_incremental.py [--rows 10000000] [--interval 200]
        [--quorum build/tools/quorum] [--table-memory-mb N] [--keep]

1. `quorum gen-ctr` writes the click set; `quorum launch --model wide-deep`
   (1 ps, 2 workers, async) trains 20 steps and writes a full checkpoint.
2. Its `embedding` table (dim 8, Adagrad: a row and its accumulator) is
   grown to --rows rows with rows of ids the data never draws (the rows
   quorum would hold after a long run over a wide id space), and written
   back as a full checkpoint with examples/read_checkpoint.py's writer.
3. The same launch resumes from it (the ps restores the whole table) and
   trains to the second multiple of --interval after it, with
   --checkpoint-steps --interval: the first checkpoint after a restart is
   full, the next (one interval later) an increment. With
   --table-memory-mb N (default 0: no tier) the resumed launch passes it to
   its ps: the restore reads the whole table, then the disk tier
   (docs/EMBEDDINGS.md, "Tables larger than memory") writes out what exceeds
   N MiB, so most of the table lives on disk while it trains and both
   checkpoints read their rows from both tiers.
4. Printed: both checkpoints' bytes, the rows the increment holds (the rows
   the interval touched) against the table's, the ratio, and the resumed
   ps's peak resident memory (VmHWM, and the largest RssAnon sampled: the
   tier's LMDB map counts in VmHWM as file pages), read from /proc, and its
   own memory while it trains (the least RssAnon sample after the restore,
   and the last: the restore's peak is brief, a full checkpoint's copy of
   the table another).

A benchmark, not a test: figures vary with the machine; the ratio depends
on the fraction of rows an interval touches, not on the machine.
"""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def poll_ps_peak(launch_pid, stop, box):
    """Reads launch_pid's ps child's /proc status every 0.1 s until stop: its
    VmHWM (peak resident set, the disk tier's LMDB map's pages included: they
    are file pages, the kernel's to drop) and the largest RssAnon sampled (its
    own memory, to within the 0.1 s between samples), every RssAnon sample
    kept in box["anon_samples"] (the restore's peak passes; what it keeps
    while it trains is the least sample after it and the last)."""
    while not stop.wait(0.1):
        try:
            pids = os.listdir("/proc")
        except OSError:
            return
        for pid in pids:
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % pid) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) != launch_pid:
                        continue
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    if b"\0--job_name\0ps\0" not in f.read():
                        continue
                with open("/proc/%s/status" % pid) as f:
                    for line in f:
                        for key, field in (("VmHWM:", "hwm"), ("RssAnon:", "anon")):
                            if line.startswith(key):
                                value = int(line.split()[1]) * 1024
                                box[field] = max(box[field], value)
                                if field == "anon":
                                    box["anon_samples"].append(value)
            except (OSError, ValueError, IndexError):
                continue


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="rows of the embedding table")
    ap.add_argument("--interval", type=int, default=200, help="global steps between checkpoints")
    ap.add_argument("--quorum", default=os.path.join(ROOT, "build", "tools", "quorum"))
    ap.add_argument("--table-memory-mb", type=int, default=0,
                    help="the resumed ps's --table-memory-mb (0: no disk tier)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    a = ap.parse_args()
    if a.rows < 1 or a.interval < 1:
        ap.error("--rows and --interval must be positive")
    if a.table_memory_mb < 0:
        ap.error("--table-memory-mb must be 0 or positive")
    import numpy as np
    spec = importlib.util.spec_from_file_location(
        "read_checkpoint", os.path.join(ROOT, "examples", "read_checkpoint.py"))
    reader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader)

    work = tempfile.mkdtemp(prefix="qr-bench-incr-")
    try:
        data, ckpt = os.path.join(work, "ctr"), os.path.join(work, "ckpt")
        subprocess.run([a.quorum, "gen-ctr", "--out", data], check=True, capture_output=True)

        def launch(steps, extra=()):
            """Runs a launch; returns its seconds and its ps's memory in
            bytes, {"hwm", "anon", "anon_samples"} (poll_ps_peak: 0 and none
            where /proc could not be read)."""
            t0 = time.time()
            p = subprocess.Popen([a.quorum, "launch", "--ps", "1", "--workers", "2", "--data",
                                  data, "--model", "wide-deep", "--steps", str(steps),
                                  "--checkpoint-dir", ckpt, "--checkpoint-steps",
                                  str(a.interval), "--keep-checkpoints", "10", "--json",
                                  "--quiet", *extra], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            box = {"hwm": 0, "anon": 0, "anon_samples": []}
            stop = threading.Event()
            poller = threading.Thread(target=poll_ps_peak, args=(p.pid, stop, box))
            poller.start()
            _, err = p.communicate()
            stop.set()
            poller.join()
            if p.returncode:
                sys.exit("launch failed:\n" + err[-4000:])
            return time.time() - t0, box

        launch(20)
        first = reader.newest_complete(ckpt)
        manifest, shards = reader.read_chain(first)
        state, meta = shards[0]
        n = state["embedding/ids"].shape[0]
        grow = a.rows - n
        if grow > 0:
            rng = np.random.default_rng(1)
            extra_ids = (np.int64(1) << 40) + np.arange(grow, dtype=np.int64)
            records = json.loads(meta["quorum.variables"])
            rec = next(r for r in records if r["name"] == "embedding")
            rows = rng.normal(0, 0.01, (grow, state["embedding"].shape[1])).astype(np.float32)
            state["embedding"] = np.concatenate([state["embedding"], rows])
            state["embedding/ids"] = np.concatenate([state["embedding/ids"], extra_ids])
            for s in rec["slots"]:
                if state[s].ndim == 2:  # a per-row slot: Adagrad's accumulator
                    fill = np.full((grow, state[s].shape[1]), 0.1, np.float32)
                    state[s] = np.concatenate([state[s], fill])
            rec["table"]["rows"] = int(state["embedding/ids"].shape[0])
            meta["quorum.variables"] = json.dumps(records)
            shutil.rmtree(first)
            reader.write_merged(first, manifest, shards)
            del state, shards, rows
        print("table 'embedding': %d rows (%d trained, %d added)" % (max(n, a.rows), n,
                                                                     max(grow, 0)))
        before = set(os.listdir(ckpt))
        start = manifest["global_step"]
        # ends at a multiple of the interval: the increment after the full
        # checkpoint covers one whole interval
        extra = ("--table-memory-mb", str(a.table_memory_mb)) if a.table_memory_mb else ()
        seconds, peak = launch((start // a.interval + 2) * a.interval, extra)
        new = sorted(set(os.listdir(ckpt)) - before)
        found = []
        for f in new:
            m = reader.read_manifest(os.path.join(ckpt, f))
            found.append((m["global_step"], m.get("kind", "full"),
                          sum(s["bytes"] for s in m["shards"]), f))
        for step, kind, size, _ in found:
            print("checkpoint of step %-6d %-12s %14d bytes" % (step, kind, size))
        fulls = [x for x in found if x[1] == "full"]
        incs = [x for x in found if x[1] == "incremental"]
        if not fulls or not incs:
            sys.exit("expected a full and an incremental checkpoint after the restart, got %s"
                     % found)
        from safetensors import safe_open
        inc = incs[0]  # the increment right after the full checkpoint: one interval
        path = os.path.join(ckpt, inc[3], "shard-00000-of-00001.safetensors")
        with safe_open(path, "np") as f:
            touched = f.get_slice("embedding/ids").get_shape()[0]
        ratio = fulls[0][2] / inc[2]
        # the restore ends where RssAnon first falls by a quarter from its
        # peak so far (its buffers freed); the least sample after that is
        # the ps training between the spill and a checkpoint's copy
        samples = peak["anon_samples"]
        end, top = len(samples), 0
        for i, value in enumerate(samples):
            if value < 0.75 * top:
                end = i
                break
            top = max(top, value)
        floor = min(samples[end:]) if samples[end:] else 0
        last = samples[-1] if samples else 0
        print("the increment holds %d of %d rows (%.2f%%): %.1fx fewer bytes than the full "
              "checkpoint (resumed run %.1f s, %s; its ps's peak RSS %.0f MiB, of its own "
              "memory %.0f MiB at its peak, %.0f MiB the least after the restore, %.0f MiB the "
              "last)"
              % (touched, max(n, a.rows), 100.0 * touched / max(n, a.rows), ratio, seconds,
                 "--table-memory-mb %d" % a.table_memory_mb if a.table_memory_mb
                 else "no disk tier", peak["hwm"] / 2**20, peak["anon"] / 2**20,
                 floor / 2**20, last / 2**20))
        print(json.dumps({"rows": max(n, a.rows), "touched": int(touched),
                          "full_bytes": fulls[0][2], "incremental_bytes": inc[2],
                          "ratio": ratio, "table_memory_mb": a.table_memory_mb,
                          "resumed_seconds": round(seconds, 1), "ps_peak_rss_bytes": peak["hwm"],
                          "ps_peak_anon_bytes": peak["anon"], "ps_floor_anon_bytes": floor,
                          "ps_last_anon_bytes": last}))
    finally:
        if a.keep:
            print("work folder kept:", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

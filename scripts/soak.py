#!/usr/bin/env python3
"""soak.py - kill a random task of a training run at a random moment, many
times in a row, and count what went wrong. Not part of CI (it takes as
long as you ask); run it before a release or after touching the fault
paths:

    python3 scripts/soak.py build/tools/quorum --runs 50

Each run is `quorum launch --ps 2 --workers 3` (sync or async, drawn at
random; --sync-timeout-ms only for sync, which async refuses) with
checkpoints every 50 steps, --max-restarts 2 and --heartbeat-timeout-ms
2000. Between 0.5 and 3 s in, one fault from this menu, drawn at random:
  SIGKILL        a task (a ps or a worker)
  SIGSTOP        a worker, never continued (a hung worker)
  SIGSTOP ps     a ps, never continued: ps 0 (or ps 1, for ps 0) names it
                 hung, launch kills and restarts it, the cluster rolls back
  SIGSTOP+CONT   a ps, continued 1 to 6 s later: before heartbeat-timeout-ms
                 it goes on; after, launch has killed it already (or, if it
                 wakes first, it fences itself and exits, and is restarted)
Afterwards it checks:
  hung       the launcher did not end within --timeout seconds
  failed     it ended with a status other than 0 (or 3, when the task hit
             was a SIGSTOPped worker that launch had to stop at the end,
             or a ps stopped through the end of the run that launch names
             as the one task that did not end well)
  lost data  the run did not reach its global step, or its newest
             checkpoint is not whole (a shard missing, a size or crc32 that
             differs from the manifest, shards at different global steps)
  left       a process of the run's session still alive after the launcher
             ended (every task is killed then, by process group)
and prints one line per run and the totals. Exit status 1 if anything went
wrong. --mode, --fault and --task narrow the draw to one case (e.g.
--mode async --fault SIGSTOP+CONT --task "ps 1"); --logs DIR keeps the
launcher's stderr of every run that went wrong. Processes are found and killed by pid and process group only.
"""

import argparse
import glob
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib


def children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def task_of(pid):
    try:
        with open("/proc/%d/cmdline" % pid) as f:
            args = f.read().split("\0")
        return "%s %s" % (args[1], args[args.index("--task_index") + 1])
    except (OSError, ValueError, IndexError):
        return None


def session_alive(sid):
    alive = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":  # session id, state
                alive.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return alive


def shard_step(path):
    """The global_step scalar of a safetensors shard, read by hand."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        begin, _ = header["global_step"]["data_offsets"]
        f.seek(8 + n + begin)
        return struct.unpack("<q", f.read(8))[0]


def newest_checkpoint_problem(d):
    done = [c for c in sorted(glob.glob(os.path.join(d, "ckpt-*")))
            if os.path.exists(os.path.join(c, "manifest.json"))]
    if not done:
        return "no complete checkpoint"
    c = done[-1]
    with open(os.path.join(c, "manifest.json")) as f:
        m = json.load(f)
    steps = set()
    for s in m["shards"]:
        path = os.path.join(c, s["file"])
        try:
            data = open(path, "rb").read()
        except OSError:
            return "%s missing" % path
        if len(data) != s["bytes"] or "%08x" % zlib.crc32(data) != s["crc32"]:
            return "%s does not match the manifest" % path
        steps.add(shard_step(path))
    if steps != {m["global_step"]}:
        return "%s: shards at steps %s, manifest %d" % (c, sorted(steps), m["global_step"])
    return None


FAULTS = ["SIGKILL", "SIGKILL", "SIGSTOP", "SIGSTOP ps", "SIGSTOP+CONT"]


def one_run(quorum, i, timeout, rng, steps, only):
    mode = only.mode or rng.choice(["sync", "async"])
    work = tempfile.mkdtemp(prefix="qr-soak-")
    args = [quorum, "launch", "--ps", "2", "--workers", "3", "--mode", mode, "--data", "digits",
            "--steps", str(steps), "--checkpoint-dir", os.path.join(work, "ckpt"),
            "--checkpoint-steps", "50", "--max-restarts", "2", "--heartbeat-timeout-ms", "2000",
            "--json", "--quiet"]
    if mode == "sync":
        args += ["--replicas-to-aggregate", "2", "--sync-timeout-ms", "20000"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    time.sleep(rng.uniform(0.5, 3.0))
    kids = [(pid, task_of(pid)) for pid in children(p.pid)]
    kids = [(pid, name) for pid, name in kids if name]
    fault = only.fault or rng.choice(FAULTS)
    if fault == "SIGSTOP":
        kids = [k for k in kids if k[1].startswith("worker")]
    elif fault != "SIGKILL":
        kids = [k for k in kids if k[1].startswith("ps")]
    if only.task:
        kids = [k for k in kids if k[1] == only.task]
    sig = signal.SIGKILL if fault == "SIGKILL" else signal.SIGSTOP
    victim = rng.choice(kids) if kids else (None, "nothing (the run had ended)")
    if victim[0]:
        try:
            os.kill(victim[0], sig)
        except ProcessLookupError:
            pass
    problems = []
    deadline = time.time() + timeout
    if fault == "SIGSTOP+CONT" and victim[0]:
        time.sleep(rng.uniform(1.0, 6.0))
        try:
            os.kill(victim[0], signal.SIGCONT)
        except ProcessLookupError:
            pass
    try:
        out, err = p.communicate(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        problems.append("hung")
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
    ok_status = {0, 3} if fault == "SIGSTOP" else {0}
    last = (err.strip().splitlines() or [""])[-1]
    if fault == "SIGSTOP+CONT" and victim[0] and last.endswith("did not end well: " + victim[1]):
        # Stopped through the end of the run and continued after
        # heartbeat-timeout-ms: it fenced itself once ps 0 had stopped the
        # cluster, and launch names it (test_launch_tasks.py ps_after_end).
        ok_status = {0, 3}
    if "hung" not in problems and p.returncode not in ok_status:
        problems.append("failed (exit %d: %s)" % (p.returncode,
                                                  err.strip().splitlines()[-1:] or ""))
    try:
        final = json.loads(out.strip().splitlines()[-1])
        if final["global_step"] < steps:
            problems.append("lost data (global step %d of %d)" % (final["global_step"], steps))
    except (ValueError, IndexError, KeyError):
        if "hung" not in problems:
            problems.append("lost data (no summary)")
    bad = newest_checkpoint_problem(os.path.join(work, "ckpt"))
    if bad:
        problems.append("lost data (%s)" % bad)
    left = session_alive(p.pid)
    if left:
        problems.append("left %d process(es) behind" % len(left))
        os.killpg(p.pid, signal.SIGKILL)
    shutil.rmtree(work, ignore_errors=True)
    if problems and only.logs:
        path = os.path.join(only.logs, "run-%03d.log" % i)
        with open(path, "w") as f:
            f.write("%s %s %s (pid %s): %s\n%s" % (mode, fault, victim[1], victim[0],
                                                   "; ".join(problems), err))
        problems[-1] += " (log: %s)" % path
    print("run %3d: %-5s %-12s %-9s -> %s" % (i, mode, fault, victim[1],
                                             "; ".join(problems) or "ok"), flush=True)
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("quorum", help="the quorum binary")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=180, help="seconds before a run is hung")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--steps", type=int, default=3000, help="global steps of each run")
    ap.add_argument("--mode", choices=["sync", "async"], help="only this mode (default: drawn)")
    ap.add_argument("--fault", choices=sorted(set(FAULTS)),
                    help="only this fault (default: drawn)")
    ap.add_argument("--task", help="only this victim, e.g. 'ps 1' (default: drawn among those "
                    "the fault hits)")
    ap.add_argument("--logs", help="a folder where the stderr of each run with a problem is "
                    "kept (default: none kept)")
    a = ap.parse_args()
    if a.logs:
        os.makedirs(a.logs, exist_ok=True)
    seed = a.seed if a.seed is not None else int(time.time())
    rng = random.Random(seed)
    print("soak: %d runs, seed %d" % (a.runs, seed))
    totals = {"hung": 0, "failed": 0, "lost data": 0, "left": 0}
    for i in range(a.runs):
        for problem in one_run(a.quorum, i, a.timeout, rng, a.steps, a):
            for k in totals:
                if problem.startswith(k):
                    totals[k] += 1
    print("soak: %d runs: %d hung, %d failed, %d lost data, %d left processes behind"
          % (a.runs, totals["hung"], totals["failed"], totals["lost data"], totals["left"]))
    return 1 if any(totals.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

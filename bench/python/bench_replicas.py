"""bench_replicas.py - what two copies of every shard cost a training run
(issue 29, item 7), measured in one run: `quorum launch --ps 2 --workers 3
--mode async --model mlp` with `--ps-replicas 1` and `--ps-replicas 2`,
alternated round by round (1, 2, 1, 2, ...; --rounds of each), so that a
slow moment of the machine falls on both. Each figure is the median of its
rounds; the ratio compares the medians of this run (goal: two copies at
most 15% slower, a ratio of 0.85 or more).

Per run: global steps/s and examples/s from launch's JSON (the training
steps only, start-up and the test pass left out), the test accuracy, and
the peak resident memory (VmHWM) of each ps task, sampled from /proc while
the run goes on: with two copies a ps holds its shard and its neighbour's.

--mode sync runs the same way (`--init-tokens 0`); a launch that refuses
a combination has its rounds skipped with launch's message.

    python3 bench/python/bench_replicas.py [--quick] [--json PATH]
        [--rounds R] [--steps N] [--mode async|sync|both] [--ps P]
        [--workers W] [--model mlp] [--data digits] [--extra "--hidden 512"]
        [--replication-lag N]

No torch needed (plain python3). The quorum binary: --quorum, else
$QUORUM_BINARY or $QUORUM, else `quorum` on PATH. Processes are run in a
process group of their own and killed by pid on a deadline (benchlib).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import LIVE, kill_group  # noqa: E402

GOAL = 0.85  # two copies at this much of one copy's steps/s at least


def ps_children(pid: int) -> Dict[int, int]:
    """{ps task index: pid} of launch's children now."""
    found: Dict[int, int] = {}
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            kids = [int(p) for p in f.read().split()]
    except OSError:
        return found
    for k in kids:
        try:
            with open("/proc/%d/cmdline" % k) as f:
                args = f.read().split("\0")
            if len(args) > 1 and args[1] == "ps":
                found[int(args[args.index("--task_index") + 1])] = k
        except (OSError, ValueError, IndexError):
            pass
    return found


def peak_rss_kib(pid: int) -> Optional[int]:
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def one_run(quorum: str, args: List[str], timeout: float) -> Dict[str, Any]:
    """One launch: its JSON summary plus "ps_peak_rss_mib" (per ps), or
    {"refused": message} when launch refuses the flags."""
    p = subprocess.Popen([quorum, "launch", "--json", "--quiet"] + args, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    LIVE.append(p)
    peak: Dict[int, int] = {}
    deadline = time.monotonic() + timeout
    try:
        while p.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError("launch %s: no end after %.0f s (killed)" % (args, timeout))
            for index, pid in ps_children(p.pid).items():
                kib = peak_rss_kib(pid)
                if kib:
                    peak[index] = max(peak.get(index, 0), kib)
            time.sleep(0.02)
        out, err = p.communicate()
    finally:
        kill_group(p)
        LIVE.remove(p)
    if p.returncode == 2 and "not built yet" in err:
        return {"refused": err.strip().splitlines()[-1]}
    if p.returncode != 0:
        raise RuntimeError("launch %s failed (%d): %s" % (args, p.returncode, err[-2000:]))
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError("launch %s printed no JSON summary: %s" % (args, err[-2000:]))
    s: Dict[str, Any] = json.loads(lines[-1])
    s["ps_peak_rss_mib"] = [peak[i] / 1024 for i in sorted(peak)]
    return s


def measure_mode(a: argparse.Namespace, mode: str) -> Dict[str, Any]:
    base = ["--ps", str(a.ps), "--workers", str(a.workers), "--mode", mode, "--model", a.model,
            "--data", a.data, "--steps", str(a.steps), "--seed", "11"] + shlex.split(a.extra)
    if mode == "sync":
        base += ["--init-tokens", "0"]
    runs: Dict[int, List[Dict[str, Any]]] = {1: [], 2: []}
    for r in range(a.rounds):
        for copies in (1, 2):
            two = ["--replication-lag", str(a.replication_lag)] if copies == 2 and \
                mode == "async" and a.replication_lag else []
            s = one_run(a.quorum, base + ["--ps-replicas", str(copies)] + two, a.timeout)
            if "refused" in s:
                print("  %s: --ps-replicas %d refused, skipped: %s" % (mode, copies, s["refused"]),
                      flush=True)
                return {"mode": mode, "skipped": s["refused"]}
            runs[copies].append(s)
            print("  %s round %d, %d cop%s: %8.1f steps/s, accuracy %.4f, ps peak RSS %s MiB"
                  % (mode, r + 1, copies, "y" if copies == 1 else "ies",
                     s["global_steps_per_sec"], s["test_accuracy"],
                     "/".join("%.1f" % m for m in s["ps_peak_rss_mib"])), flush=True)
    res: Dict[str, Any] = {"mode": mode, "rounds": a.rounds, "steps": a.steps}
    for copies in (1, 2):
        rs = runs[copies]
        res["copies_%d" % copies] = {
            "steps_per_s": [s["global_steps_per_sec"] for s in rs],
            "median_steps_per_s": statistics.median(s["global_steps_per_sec"] for s in rs),
            "median_examples_per_s": statistics.median(s["examples_per_sec"] for s in rs),
            "median_accuracy": statistics.median(s["test_accuracy"] for s in rs),
            "median_ps_peak_rss_mib": statistics.median(
                statistics.mean(s["ps_peak_rss_mib"]) for s in rs if s["ps_peak_rss_mib"]),
        }
    one, two = res["copies_1"], res["copies_2"]
    res["ratio"] = two["median_steps_per_s"] / one["median_steps_per_s"]
    res["goal"] = GOAL
    res["goal_met"] = res["ratio"] >= GOAL
    res["memory_ratio"] = two["median_ps_peak_rss_mib"] / one["median_ps_peak_rss_mib"]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quorum", default=os.environ.get("QUORUM_BINARY") or
                    os.environ.get("QUORUM") or shutil.which("quorum") or "quorum")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each (default 3)")
    ap.add_argument("--steps", type=int, default=3000, help="global steps a run (default 3000)")
    ap.add_argument("--mode", choices=("async", "sync", "both"), default="both")
    ap.add_argument("--ps", type=int, default=2)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--data", default="digits")
    ap.add_argument("--extra", default="", help="more launch flags, one string")
    ap.add_argument("--replication-lag", type=int, default=0, metavar="N",
                    help="async runs with two copies: --replication-lag N (default 0: none)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a run may take")
    ap.add_argument("--quick", action="store_true", help="1 round of 200 steps (a smoke test)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON there")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.steps = 1, 200
    if a.rounds < 1 or a.steps < 1:
        ap.error("--rounds and --steps must be at least 1")
    if a.ps < 2:
        ap.error("--ps must be at least 2: a shard's backup is on another ps")
    if a.workers < 1:
        ap.error("--workers must be at least 1")
    print("bench_replicas: quorum launch --ps %d --workers %d --model %s --data %s --steps %d, "
          "--ps-replicas 1 and 2 alternated, %d round(s) each; cpu: %d logical CPUs"
          % (a.ps, a.workers, a.model, a.data, a.steps, a.rounds, os.cpu_count() or 0),
          flush=True)
    modes = ["async", "sync"] if a.mode == "both" else [a.mode]
    results = []
    try:
        for mode in modes:
            results.append(measure_mode(a, mode))
    except (RuntimeError, subprocess.SubprocessError, OSError) as e:
        print("bench_replicas: %s" % e, file=sys.stderr)
        return 1
    print("\n| mode | steps/s, 1 copy | steps/s, 2 copies | ratio (goal >= %.2f) | accuracy 1 / 2 "
          "| ps peak RSS MiB 1 / 2 |" % GOAL)
    print("|---|---|---|---|---|---|")
    for res in results:
        if "skipped" in res:
            print("| %s | skipped: %s |||||" % (res["mode"], res["skipped"]))
            continue
        one, two = res["copies_1"], res["copies_2"]
        print("| %s | %.1f | %.1f | %.2f (%s) | %.4f / %.4f | %.1f / %.1f (%.2fx) |" % (
            res["mode"], one["median_steps_per_s"], two["median_steps_per_s"], res["ratio"],
            "met" if res["goal_met"] else "NOT met", one["median_accuracy"],
            two["median_accuracy"], one["median_ps_peak_rss_mib"],
            two["median_ps_peak_rss_mib"], res["memory_ratio"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "replicas", "cpus": os.cpu_count(), "ps": a.ps,
                       "workers": a.workers, "model": a.model, "data": a.data,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bench_sync_step.py - a synchronous step without compute against gloo's
allreduce of the same floats, measured in one run (issue 27, item 5).

Two worker processes train in sync mode (R = N = 2) with 1 and 2 ps tasks,
over Unix sockets and over TCP on loopback; a step is every worker's
gradient of `size` floats (split in one variable per ps) pushed and the
step's values pulled back:

  one trip   Worker.push_pull: one request per ps, each answered after the
             step (ps 0 with the next token; docs/SYNC.md, "One round trip")
  3 trips    Worker.push, take_token, pull: the push, the token barrier and
             the pull, one after the other (what push_pull did before)

Beside them, two processes of torch.distributed (gloo, TCP on loopback)
allreduce a tensor of the same size. Each figure is the median over
rounds of the mean milliseconds per step of a round; the ratios compare
figures of this run (goal: one trip at most 0.5x gloo at 1K and 64K
floats, at most 1.0x at 1M floats over TCP with 2 ps). The machine's CPU
and core count are printed beside them: on a shared machine the figures
are noisy, the ratios less so.

    python bench/python/bench_sync_step.py [--quick] [--json]
        [--sizes 1024,65536,1048576] [--steps 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))
import bench_env  # noqa: E402  (beside this file)
from benchlib import free_port, run_all, start_ps_tasks, stop_ps_tasks  # noqa: E402

QUORUM = (shutil.which("quorum") if os.environ.get("QUORUM_LIBRARY") else None) or \
    shutil.which("quorum", path=os.path.dirname(sys.executable)) or "quorum"


def rounds_of(fn: Any, steps: int, rounds: int) -> float:
    """Median over rounds of the mean milliseconds per call of fn."""
    means = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        means.append((time.perf_counter() - t0) / steps * 1e3)
    return statistics.median(means)


# ---- the worker processes ---------------------------------------------------------------

def quorum_worker(rank: int, ps_hosts: str, worker_hosts: str, transport: str, size: int,
                  steps: int, rounds: int) -> None:
    import quorum

    ps = ps_hosts.split(",")
    cluster = quorum.Cluster(ps, worker_hosts.split(","), "worker", rank)
    w = quorum.Worker(cluster, rank, mode="sync", transport=transport, lr=0.01)
    per = size // len(ps)
    names = ["v%d" % k for k in range(len(ps))]
    for name in names:
        w.declare(name, per)
    w.initialize()
    grads = {n: np.full(per, 1e-6, np.float32) for n in names}
    into = {n: np.empty(per, np.float32) for n in names}

    def one_trip() -> None:
        w.push_pull(grads, into=into)

    def three_trips() -> None:
        w.push(grads)
        w.take_token()
        w.pull(into)

    for _ in range(10):
        one_trip()
        three_trips()
    res: Dict[str, float] = {}
    for _ in range(2):  # alternated: both see the same machine
        for key, fn in (("one_trip_ms", one_trip), ("three_trips_ms", three_trips)):
            ms = rounds_of(fn, steps, rounds)
            res[key] = min(res.get(key, float("inf")), ms)
    one_trip()  # the last step: both are done with the others when it is
    if rank == 0:
        print(json.dumps(res), flush=True)
        w.stop_cluster()
    os._exit(0)


def gloo_worker(rank: int, port: int, size: int, steps: int, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=2)
    t = torch.full((size,), 1e-6)
    for _ in range(10):
        dist.all_reduce(t)
    ms = min(rounds_of(lambda: dist.all_reduce(t), steps, rounds) for _ in range(2))
    dist.barrier()
    if rank == 0:
        print(json.dumps({"gloo_ms": ms}), flush=True)
    os._exit(0)  # gloo's teardown at exit aborts now and then


# ---- the runs ---------------------------------------------------------------------------

def run_pair(cmds: List[List[str]], timeout: float) -> Dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    outs = run_all(cmds, env, timeout)
    return json.loads(outs[0].strip().splitlines()[-1])


def quorum_step(nps: int, transport: str, size: int, steps: int, rounds: int) -> Dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="quorum-sync-step-")
    if transport == "unix":
        ps_hosts = ["unix:%s/ps%d.sock" % (folder, i) for i in range(nps)]
    else:
        ps_hosts = ["127.0.0.1:%d" % free_port() for _ in range(nps)]
    worker_hosts = ["127.0.0.1:%d" % free_port() for _ in range(2)]
    ps = start_ps_tasks(QUORUM, ps_hosts, worker_hosts,
                        ["--mode", "sync", "--lr", "0.01", "--transport", transport])
    try:
        return run_pair([[sys.executable, HERE, "--quorum-worker", str(r), ",".join(ps_hosts),
                          ",".join(worker_hosts), transport, str(size), str(steps), str(rounds)]
                         for r in range(2)], timeout=900)
    finally:
        stop_ps_tasks(ps)
        shutil.rmtree(folder, ignore_errors=True)


def gloo_step(size: int, steps: int, rounds: int) -> float:
    port = free_port()
    res = run_pair([[sys.executable, HERE, "--gloo-worker", str(r), str(port), str(size),
                     str(steps), str(rounds)] for r in range(2)], timeout=900)
    return float(res["gloo_ms"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few steps of each (a smoke test)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    ap.add_argument("--sizes", default="1024,65536,1048576", help="floats per step")
    ap.add_argument("--steps", type=int, default=200, help="steps per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (the median is kept)")
    ap.add_argument("--quorum-worker", nargs=7, help=argparse.SUPPRESS)
    ap.add_argument("--gloo-worker", nargs=5, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.quorum_worker:
        r, ps, wk, tr, size, steps, rounds = a.quorum_worker
        quorum_worker(int(r), ps, wk, tr, int(size), int(steps), int(rounds))
        return
    if a.gloo_worker:
        gloo_worker(*a.gloo_worker)
        return
    sizes = [int(s) for s in a.sizes.split(",")]
    steps, rounds = (20, 1) if a.quick else (a.steps, a.rounds)
    report: Dict[str, Any] = {"cpu": bench_env.cpu_model(), "cores": os.cpu_count(), "rows": []}
    for size in sizes:
        gloo = gloo_step(size, steps, rounds)
        for transport in ("unix", "tcp"):
            for nps in (1, 2):
                q = quorum_step(nps, transport, size, steps, rounds)
                report["rows"].append(dict(q, floats=size, ps=nps, transport=transport,
                                           gloo_ms=gloo,
                                           one_trip_vs_gloo=q["one_trip_ms"] / gloo,
                                           three_trips_vs_gloo=q["three_trips_ms"] / gloo))
    if a.json:
        print(json.dumps(report))
        return
    print("sync step without compute, 2 workers (R = N = 2), beside gloo's allreduce "
          "(2 processes, TCP on loopback)")
    print("%s, %s cores; medians of %d rounds of %d steps" % (report["cpu"], report["cores"],
                                                             rounds, steps))
    print("%9s %4s %9s %9s %10s %9s %12s %12s" % ("floats", "ps", "transport", "gloo ms",
                                                 "1 trip ms", "3 trips ms", "1 trip/gloo",
                                                 "3 trips/gloo"))
    for r in report["rows"]:
        print("%9d %4d %9s %9.3f %10.3f %9.3f %11.2fx %11.2fx" % (
            r["floats"], r["ps"], r["transport"], r["gloo_ms"], r["one_trip_ms"],
            r["three_trips_ms"], r["one_trip_vs_gloo"], r["three_trips_vs_gloo"]))


if __name__ == "__main__":
    main()

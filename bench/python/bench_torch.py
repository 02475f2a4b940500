"""bench_torch.py - quorum from PyTorch, measured in one run beside its
baselines (issue 17):

  1. the Python layer's cost per push+pull beyond the C API's: the same
     push-then-pull of one variable, one at a time, 1 ps on a Unix socket,
     through quorum.Worker and through the C calls themselves (ctypes with
     every argument made beforehand), each C call paired with a Worker
     call beside it, the median of the pairs' differences; beside them `quorum bench wire`'s figure from a C program;
  2. an async step of a PyTorch model (an MLP of 1.07 M parameters, 2 ps)
     beside its compute alone and its communication alone, their sum and
     their maximum: without overlap, and with quorum.torch's overlap
     (each gradient pushed as backward produces it);
  3. training throughput, sync with W workers and P ps (`quorum launch
     --ps P --workers W --mode sync`), against torch.nn.parallel.
     DistributedDataParallel (gloo) on the same model, batch and cores
     (one torch thread per process), with float32 and with bf16 on the
     wire (qt.Optimizer(..., wire_dtype="bf16"));
  4. the README's script (examples/python/digits_quorum.py, "From
     PyTorch") under `quorum launch --ps P --workers W`, async and sync,
     its workers' examples/s summed, against the plain script
     (digits_torch.py) run alone, one torch thread per process. Both run
     unchanged (runpy, inside this file): global torch hooks count the
     examples of the forward passes under grad and time them from the first
     one to the end of the last optimizer step, so start-up, data loading
     and the test pass are left out; the whole runs' wall times (start-up
     and the ps tasks included) are given beside them.

Every figure is measured in this run; ratios compare figures of this run.
Each timed figure is the median of --rounds rounds (default 3) of --steps
steps (default 500), and in each round a figure and its baseline run one
after the other, so both see the same machine. The machine's CPU, cores
and the BLAS kernels in use (bench_env.py) are printed above the figures
and kept in the JSON ("machine").

    python bench/python/bench_torch.py [--workers W] [--ps P] [--steps S]
        [--rounds R] [--batch B] [--quick] [--json]

The worker modes (--quorum-worker, --ddp-worker) are run by this file and
by bench_scaling.py, once per worker, under `quorum launch` or side by
side.

(run with the Python environment that has quorum installed: .venv/bin/python)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import ctypes

import numpy as np
import torch

import quorum
import quorum.torch as qt
from quorum._native import lib

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))
import bench_env  # noqa: E402  (beside this file)
from benchlib import free_port, run_all, start_ps_tasks, stop_ps_tasks  # noqa: E402

# Against a build tree (QUORUM_LIBRARY set, its tools on PATH) the quorum on
# PATH is that tree's; otherwise the one installed beside this Python
# ($QUORUM_BINARY names one outright).
QUORUM = os.environ.get("QUORUM_BINARY") or \
    (shutil.which("quorum") if os.environ.get("QUORUM_LIBRARY") else None) or \
    shutil.which("quorum", path=os.path.dirname(sys.executable)) or "quorum"
EXAMPLES = os.path.join(os.path.dirname(HERE), "..", "..", "examples", "python")
BATCH = 128  # examples per worker step; --batch sets it (the worker modes too)


def mlp() -> torch.nn.Module:
    """784-1024-256-10: 1.07 M parameters, the C trainer's MLP."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


def batches(n: int, seed: int) -> List[Any]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, 784, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
            for _ in range(n)]


# ---- 1. the Python layer's cost -----------------------------------------------------

def size_label(nbytes: int) -> str:
    return "%d B" % nbytes if nbytes < 1024 else \
        "%d KiB" % (nbytes >> 10) if nbytes < 1 << 20 else "%d MiB" % (nbytes >> 20)


def python_overhead(sizes: List[int], seconds: float, rounds: int) -> List[Dict[str, Any]]:
    wire = subprocess.run(
        [QUORUM, "bench", "wire", "--ops", "pushpull", "--ps", "1", "--workers", "1",
         "--transports", "unix", "--sizes", ",".join(str(s) for s in sizes), "--repeat",
         str(rounds), "--seconds", str(seconds), "--json"],
        check=True, capture_output=True, text=True, timeout=600)
    c_us = {r["size_bytes"]: r["latency_us"] for r in json.loads(wire.stdout)["results"]}
    folder = tempfile.mkdtemp(prefix="quorum-bench-")
    ps_hosts, workers = ["unix:%s/ps0.sock" % folder], ["unix:%s/w0.sock" % folder]
    ps = quorum.PS(quorum.Cluster(ps_hosts, workers, "ps", 0), None, lr=1e-9)
    out = []

    try:
        w = quorum.Worker(quorum.Cluster(ps_hosts, workers, "worker", 0), lr=1e-9)
        for s in sizes:
            w.declare("v%d" % s, s // 4)
        w.initialize()
        for s in sizes:
            name = "v%d" % s
            g = np.full(s // 4, 1e-3, dtype=np.float32)
            dst = np.empty(s // 4, dtype=np.float32)
            ids = (ctypes.c_int * 1)(w.id(name))
            gp = (ctypes.c_void_p * 1)(g.ctypes.data)
            dp = (ctypes.c_void_p * 1)(dst.ctypes.data)
            handle = w._handle

            def direct() -> None:
                lib.qr_worker_push(handle, 1, ids, gp, 0, None)
                lib.qr_worker_pull(handle, 1, ids, dp)

            def through_worker() -> None:
                w.push({name: g}, step=False)
                w.pull({name: dst})

            for _ in range(20):  # warm: connections, caches, allocations
                direct()
                through_worker()
            # Round trips here wander by tens of microseconds between runs
            # and within one, more than the Python layer costs: each C call
            # is paired with a Worker call made right beside it (in turns,
            # first one then the other first), and the cost is the median
            # of the pairs' differences, so drift cancels. Wall time, and
            # the calling thread's CPU time: the Python layer's own work,
            # without what its delay does to the wake-ups of the ps.
            wall: Dict[Any, List[int]] = {direct: [], through_worker: []}
            cpu: Dict[Any, List[int]] = {direct: [], through_worker: []}
            clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
            for _ in range(rounds):
                t_end = time.perf_counter() + seconds
                while len(wall[direct]) < 8 or time.perf_counter() < t_end:
                    pair = ((direct, through_worker) if len(wall[direct]) % 2
                            else (through_worker, direct))
                    for op in pair:
                        c0, t0 = cpu_clock(), clock()
                        op()
                        t1, c1 = clock(), cpu_clock()
                        wall[op].append(t1 - t0)
                        cpu[op].append(c1 - c0)

            def extra_us(times: Dict[Any, List[int]]) -> float:
                return float(np.median(np.subtract(times[through_worker], times[direct]))) / 1e3

            median_c = float(np.median(wall[direct])) / 1e3
            median_py = float(np.median(wall[through_worker])) / 1e3
            extra = extra_us(wall)
            out.append({"size_bytes": s, "python_us": median_py, "c_api_us": median_c,
                        "c_program_us": c_us[s], "overhead_us": extra,
                        "overhead_cpu_us": extra_us(cpu),
                        "overhead_fraction": extra / median_c})
        w.stop_cluster()
        w.close()
    finally:
        ps.join(30)
        ps.close()
        shutil.rmtree(folder, ignore_errors=True)
    return out


# ---- 2. step time against compute and communication -----------------------------------

def timed_rounds(fn: Any, steps: int, rounds: int) -> List[float]:
    """Mean milliseconds per call of fn in each of rounds of `steps` calls."""
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for k in range(steps):
            fn(k)
        out.append((time.perf_counter() - t0) / steps * 1e3)
    return out


def timed_steps(fn: Any, steps: int, rounds: int) -> float:
    """Median over rounds of the mean milliseconds per call of fn."""
    return float(np.median(timed_rounds(fn, steps, rounds)))


def step_time(steps: int, rounds: int) -> Dict[str, Any]:
    torch.set_num_threads(1)
    data = batches(8, 0)
    loss_fn = torch.nn.functional.cross_entropy
    folder = tempfile.mkdtemp(prefix="quorum-bench-")
    ps_hosts = ["unix:%s/ps%d.sock" % (folder, i) for i in range(2)]
    worker_hosts = ["unix:%s/w0.sock" % folder]
    procs = start_ps_tasks(QUORUM, ps_hosts, worker_hosts, ["--mode", "async", "--lr", "0.01"])
    res: Dict[str, Any] = {}
    try:
        cluster = quorum.Cluster(ps_hosts, worker_hosts, "worker", 0)
        model = mlp()

        def compute(k: int) -> None:
            model.zero_grad()
            x, y = data[k % len(data)]
            loss_fn(model(x), y).backward()

        for _ in range(3):
            compute(0)
        res["compute_ms"] = timed_steps(compute, steps, rounds)
        opt = qt.Optimizer(model, "SGD", lr=0.01, overlap=True,
                           worker=quorum.Worker(cluster, 0, mode="async"))

        def train(k: int) -> None:
            opt.zero_grad()
            x, y = data[k % len(data)]
            loss_fn(model(x), y).backward()
            opt.step()

        # Communication alone: the same push and pull of every parameter,
        # gradients ready, no compute (one fused request per ps).
        grads = {i: torch.full_like(p, 1e-6) for _, p, i in opt.params}
        into = {i: p.data for _, p, i in opt.params}

        def comm(k: int) -> None:
            opt.worker.push_pull(grads, into=into)

        res["comm_ms"] = timed_steps(comm, steps, rounds)
        seen: Dict[str, List[float]] = {"step_ms": [], "step_ms_overlap": []}
        for _ in range(rounds):  # alternated round by round: both see the same machine
            for overlap in (False, True):
                opt.overlap = overlap
                for _ in range(2):
                    train(0)
                seen["step_ms_overlap" if overlap else "step_ms"] += \
                    timed_rounds(train, steps, 1)
        for key, times in seen.items():
            res[key] = float(np.median(times))
        opt.worker.stop_cluster()
        opt.close(finished=False)
    finally:
        stop_ps_tasks(procs)
        shutil.rmtree(folder, ignore_errors=True)
    c, m = res["compute_ms"], res["comm_ms"]
    res["sum_ms"], res["max_ms"] = c + m, max(c, m)
    # 0: no better than one after the other; 1: all of the smaller hidden.
    span = res["sum_ms"] - res["max_ms"]
    res["overlap_efficiency"] = (res["sum_ms"] - res["step_ms_overlap"]) / span if span > 0 else 0
    return res


# ---- 3. sync throughput against DDP -----------------------------------------------------

def report_training(model: torch.nn.Module, opt: Any, rank: int, steps: int) -> None:
    """5 warm-up steps, then `steps` timed ones; prints samples/s."""
    data = batches(8, rank + 1)

    def one(k: int) -> None:
        opt.zero_grad()
        x, y = data[k % len(data)]
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for k in range(5):
        one(k)
    # The optimizer's step timed apart: for quorum it is the push, the wait
    # for the step's quorum and the pull; for DDP (whose allreduce runs in
    # backward) a local SGD step.
    step_s = 0.0
    compute_ms: List[float] = []  # each step's time outside step(): its spread is a sync
    wall0 = time.time()           # step's straggler wait (step_model.expected_max)
    t0 = time.perf_counter()
    for k in range(steps):
        ta = time.perf_counter()
        opt.zero_grad()
        x, y = data[k % len(data)]
        torch.nn.functional.cross_entropy(model(x), y).backward()
        t1 = time.perf_counter()
        opt.step()
        step_s += time.perf_counter() - t1
        compute_ms.append((t1 - ta) * 1e3)
    dt = time.perf_counter() - t0
    # One write: the workers share the launcher's stdout. The compute's
    # quantiles (0, 5, ..., 100%) in a flat list: a report is one flat
    # object (readers find it by its braces).
    quantiles = [round(float(q), 4) for q in np.quantile(compute_ms, np.linspace(0, 1, 21))]
    sys.stdout.write(json.dumps({"rank": rank, "samples_per_s": steps * BATCH / dt,
                                 "step_ms": dt / steps * 1e3,
                                 "loop": [wall0, time.time()],
                                 "opt_step_ms": step_s / steps * 1e3,
                                 "compute_ms_quantiles": quantiles}) + "\n")
    sys.stdout.flush()


def worker_quorum(steps: int, wire_dtype: str, overlap: Optional[bool] = None) -> None:
    """Run by `quorum launch` once per worker: SGD in the launch's mode,
    overlap as asked (None: quorum.torch's default)."""
    torch.set_num_threads(1)
    model = mlp()
    opt = qt.Optimizer(model, "SGD", lr=0.01, wire_dtype=wire_dtype, overlap=overlap)
    report_training(model, opt, qt.worker_rank()[0], steps)
    opt.close()


def worker_alone(steps: int) -> None:
    """The same model, batch and steps trained in one process by torch alone
    (torch.optim.SGD): the compute a worker does, without communication."""
    torch.set_num_threads(1)
    model = mlp()
    report_training(model, torch.optim.SGD(model.parameters(), lr=0.01), 0, steps)


def worker_ddp(rank: int, world: int, port: int, steps: int) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                                         rank=rank, world_size=world)
    model = torch.nn.parallel.DistributedDataParallel(mlp())
    report_training(model, torch.optim.SGD(model.parameters(), lr=0.01), rank, steps)
    torch.distributed.barrier()  # neither leaves while the other still needs it
    # Exit without tearing gloo down: its threads' teardown at interpreter
    # exit aborts now and then ("terminate called without an active
    # exception"), after the figure is out.
    os._exit(0)


def worker_reports(out: str) -> List[Dict[str, Any]]:
    """The workers' JSON reports in their output (their lines may share a line)."""
    return [json.loads(m) for m in re.findall(r'\{"rank"[^}]*\}', out)]


def rates(out: str) -> float:
    """The workers' samples/s, summed."""
    return sum(r["samples_per_s"] for r in worker_reports(out))


def launch(mode: str, command: List[str], env: Dict[str, str], workers: int, ps: int) -> str:
    """`quorum launch --ps PS --workers WORKERS --mode MODE -- COMMAND`'s stdout."""
    q = subprocess.run([QUORUM, "launch", "--ps", str(ps), "--workers", str(workers), "--mode",
                        mode, "--lr", "0.01", "--"] + command, capture_output=True, text=True,
                       env=env, timeout=900)
    if q.returncode:
        raise RuntimeError("quorum launch failed: " + q.stderr[-2000:])
    return q.stdout


def worker_command(steps: int, wire_dtype: str = "float32") -> List[str]:
    """The command `quorum launch -- ...` runs once per worker (quorum.torch,
    the launch's --mode), at this run's batch."""
    return [sys.executable, HERE, "--batch", str(BATCH), "--quorum-worker", str(steps), wire_dtype]


def ddp_run(workers: int, steps: int, env: Dict[str, str], timeout: float = 900) -> float:
    """DDP (gloo) with `workers` processes side by side: their samples/s, summed."""
    port = free_port()
    outs = run_all([[sys.executable, HERE, "--batch", str(BATCH), "--ddp-worker", str(r),
                     str(workers), str(port), str(steps)] for r in range(workers)], env, timeout)
    return sum(rates(o) for o in outs)


def throughput(steps: int, rounds: int, workers: int, ps: int) -> Dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    seen: Dict[str, List[float]] = {"q": [], "b": [], "d": []}
    for _ in range(rounds):  # each round: float32, bf16, DDP, one after the other
        seen["q"].append(rates(launch("sync", worker_command(steps), env, workers, ps)))
        seen["b"].append(rates(launch("sync", worker_command(steps, "bf16"), env,
                                      workers, ps)))
        seen["d"].append(ddp_run(workers, steps, env))
    q, b, d = (float(np.median(seen[k])) for k in ("q", "b", "d"))
    return {"workers": workers, "ps": ps, "steps": steps, "rounds": rounds,
            "quorum_samples_per_s": q, "quorum_bf16_samples_per_s": b,
            "ddp_samples_per_s": d, "ratio": q / d if d else 0.0,
            "ratio_bf16": b / d if d else 0.0,
            "rounds_samples_per_s": {"quorum": seen["q"], "quorum_bf16": seen["b"],
                                     "ddp": seen["d"]}}


# ---- 4. the README's script under launch against the plain script alone ----------------

def script_worker(script: str) -> None:
    """Runs a training script unchanged, as `python SCRIPT` would, and
    prints its training examples/s: the examples of the top-level forward
    passes under grad (the test pass runs under no_grad), timed from the
    first of them to the end of the last optimizer step."""
    torch.set_num_threads(1)
    count = {"examples": 0, "depth": 0}
    first: List[float] = []
    last: List[float] = []

    def before_forward(module: torch.nn.Module, args: Any) -> None:
        if count["depth"] == 0 and torch.is_grad_enabled() and args and \
                isinstance(args[0], torch.Tensor):
            if not first:
                first.append(time.perf_counter())
            count["examples"] += int(args[0].shape[0])
        count["depth"] += 1  # a submodule's forward is inside its parent's

    def after_forward(module: torch.nn.Module, args: Any, out: Any) -> None:
        count["depth"] -= 1

    def after_step(opt: Any, args: Any, kwargs: Any) -> None:
        last[:] = [time.perf_counter()]

    from torch.nn.modules.module import (register_module_forward_hook,
                                         register_module_forward_pre_hook)
    from torch.optim.optimizer import register_optimizer_step_post_hook
    hooks = [register_module_forward_pre_hook(before_forward),
             register_module_forward_hook(after_forward),
             register_optimizer_step_post_hook(after_step)]
    sys.argv = [script]
    runpy.run_path(script, run_name="__main__")
    for h in hooks:
        h.remove()
    if not first or not last or last[0] <= first[0]:
        raise RuntimeError("%s: no training step was seen" % script)
    rank = int(os.environ.get("RANK", "0"))
    sys.stdout.write(json.dumps({"rank": rank, "examples": count["examples"],
                                 "samples_per_s": count["examples"] / (last[0] - first[0])})
                     + "\n")
    sys.stdout.flush()


def examples(out: str) -> int:
    """The workers' training examples, summed."""
    return sum(r["examples"] for r in worker_reports(out))


def readme_script(rounds: int, workers: int, ps: int) -> Dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TF_CONFIG", None)
    plain = os.path.join(EXAMPLES, "digits_torch.py")
    distributed = os.path.join(EXAMPLES, "digits_quorum.py")
    figures: Dict[str, List[float]] = {}
    seen: Dict[str, int] = {}

    def keep(key: str, out: str, wall: float) -> None:
        seen[key] = examples(out)  # the same every round: epochs x training rows
        figures.setdefault(key, []).append(rates(out))
        figures.setdefault(key + "_wall", []).append(seen[key] / wall)

    for _ in range(rounds):  # each round: alone, async, sync, one after the other
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, HERE, "--script-worker", plain],
                           capture_output=True, text=True, env=env, timeout=900)
        if p.returncode:
            raise RuntimeError("digits_torch.py failed: " + p.stderr[-2000:])
        keep("alone", p.stdout, time.perf_counter() - t0)
        for mode in ("async", "sync"):
            t0 = time.perf_counter()
            out = launch(mode, [sys.executable, HERE, "--script-worker", distributed], env,
                         workers, ps)
            keep(mode, out, time.perf_counter() - t0)
    best = {key: float(np.median(v)) for key, v in figures.items()}  # medians of the rounds
    res: Dict[str, Any] = {"workers": workers, "ps": ps, "examples_alone": seen["alone"], "examples_async": seen["async"],
                           "examples_sync": seen["sync"]}
    for key in ("alone", "async", "sync"):
        res[key + "_samples_per_s"] = best[key]
        res[key + "_wall_samples_per_s"] = best[key + "_wall"]
    for mode in ("async", "sync"):
        res["ratio_" + mode] = best[mode] / best["alone"]
        res["ratio_" + mode + "_wall"] = best[mode + "_wall"] / best["alone_wall"]
    return res


# ---- the run -------------------------------------------------------------------------

def print_tables(report: Dict[str, Any]) -> None:
    """The report as a reader takes it in: a line or a table per figure."""
    if "machine" in report:
        print(bench_env.header(report["machine"]))
    print("1. Python layer per push+pull (1 ps, Unix socket, one at a time), medians of "
          "paired calls")
    print("   %-8s %10s %10s %10s %8s %12s %14s" % ("size", "Worker_us", "C_API_us", "extra_us",
                                                  "extra", "extra_cpu_us", "C_program_us"))
    for r in report["python_overhead"]:
        print("   %-8s %10.1f %10.1f %10.1f %7.1f%% %12.1f %14.1f" % (
            size_label(r["size_bytes"]), r["python_us"], r["c_api_us"], r["overhead_us"],
            100 * r["overhead_fraction"], r["overhead_cpu_us"], r["c_program_us"]))
    print("   goals: under 10 us for small tensors, under 3% from 1 MiB")
    s = report["step"]
    print("2. async step of the 1.07 M-parameter MLP, batch %d, 2 ps (ms, medians of "
          "rounds)" % BATCH)
    print("   compute %.2f, communication %.2f: sum %.2f, max %.2f" % (
        s["compute_ms"], s["comm_ms"], s["sum_ms"], s["max_ms"]))
    print("   step without overlap %.2f, with overlap %.2f (%.0f%% of the smaller hidden)" % (
        s["step_ms"], s["step_ms_overlap"], 100 * s["overlap_efficiency"]))
    t = report["throughput"]
    print("3. sync, %d workers (%d ps), batch %d each, medians of %d rounds of %d steps: "
          "quorum %.0f samples/s, DDP (gloo) %.0f: %.2fx (goal 1.2x)" % (
              t["workers"], t["ps"], BATCH, t["rounds"], t["steps"], t["quorum_samples_per_s"],
              t["ddp_samples_per_s"], t["ratio"]))
    print("   bf16 on the wire: quorum %.0f samples/s: %.2fx DDP's" % (
        t["quorum_bf16_samples_per_s"], t["ratio_bf16"]))
    r = report["readme_script"]
    print("4. the README's script (digits, batch 32, %d examples), examples/s in training, "
          "and (in brackets) over the whole run, medians of the rounds" % r["examples_alone"])
    print("   alone (digits_torch.py) %.0f (%.0f)" % (r["alone_samples_per_s"],
                                                     r["alone_wall_samples_per_s"]))
    for mode in ("async", "sync"):
        print("   launch --ps %d --workers %d --mode %-5s %.0f summed: %.2fx (%.0f: %.2fx) "
              "(goal 1.0x)" % (r["ps"], r["workers"], mode, r[mode + "_samples_per_s"],
                               r["ratio_" + mode],
                               r[mode + "_wall_samples_per_s"], r["ratio_" + mode + "_wall"]))


def main() -> None:
    global BATCH
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="a few steps of each, one round (a smoke test)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the tables")
    ap.add_argument("--workers", type=int, default=2,
                    help="workers of the throughput runs and the README's script (default 2)")
    ap.add_argument("--ps", type=int, default=2, help="their ps tasks (default 2)")
    ap.add_argument("--steps", type=int, default=500,
                    help="timed steps of each round of a timed figure (default 500)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of each figure; the median is reported (default 3)")
    ap.add_argument("--batch", type=int, default=BATCH,
                    help="examples per worker step (default %d)" % BATCH)
    ap.add_argument("--quorum-worker", nargs=2, metavar=("STEPS", "WIRE_DTYPE"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--ddp-worker", nargs=4, type=int, metavar="N", help=argparse.SUPPRESS)
    ap.add_argument("--script-worker", metavar="SCRIPT", help=argparse.SUPPRESS)
    ap.add_argument("--alone-worker", type=int, metavar="STEPS", help=argparse.SUPPRESS)
    ap.add_argument("--worker-overlap", choices=["default", "on", "off"], default="default",
                    help=argparse.SUPPRESS)  # a --quorum-worker's Optimizer(overlap=...)
    a = ap.parse_args()
    if a.batch < 1 or a.workers < 1 or a.ps < 1 or a.steps < 1 or a.rounds < 1:
        ap.error("--batch, --workers, --ps, --steps and --rounds must be at least 1 (got %d, %d, "
                 "%d, %d, %d)" % (a.batch, a.workers, a.ps, a.steps, a.rounds))
    BATCH = a.batch
    if a.quorum_worker is not None:
        overlap = {"default": None, "on": True, "off": False}[a.worker_overlap]
        return worker_quorum(int(a.quorum_worker[0]), a.quorum_worker[1], overlap)
    if a.alone_worker is not None:
        return worker_alone(a.alone_worker)
    if a.ddp_worker is not None:
        return worker_ddp(*a.ddp_worker)
    if a.script_worker is not None:
        return script_worker(a.script_worker)
    quick = a.quick
    steps, rounds = (10, 1) if quick else (a.steps, a.rounds)
    sizes = [64, 4096, 1 << 20] if quick else [64, 4096, 65536, 1 << 20, 4 << 20]
    report = {
        "machine": bench_env.machine(library=os.environ.get("QUORUM_LIBRARY") or
                                     getattr(lib, "_name", None)),
        "python_overhead": python_overhead(sizes, 0.02 if quick else 0.2, 1 if quick else 5),
        "step": step_time(steps, rounds),
        "throughput": throughput(steps, rounds, a.workers, a.ps),
        "readme_script": readme_script(rounds, a.workers, a.ps),
    }
    if a.json:
        print(json.dumps(report))
    else:
        print_tables(report)


if __name__ == "__main__":
    main()

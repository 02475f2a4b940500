"""bench_scaling.py - data-parallel training throughput from 1 to N workers,
quorum beside torch's DistributedDataParallel (gloo) in one run (issue 27,
item 7), on one machine: the same MLP (784-1024-256-10, 1.07 M
parameters), one thread per process, the same cores.

For each worker count W, with the ps count quorum recommends
(step_model.recommend_ps: one ps per worker, at most twice the cores the
workers leave, since a sync ps is busy a third of a step or less) and the
model's variables partitioned over them (--partition-min-mb), each round runs, in an order rotated round by round:

  ddp       W torch processes, DDP (gloo) over loopback TCP, batch B
  qt_sync   `quorum launch --mode sync -- bench_torch.py --quorum-worker`
            (quorum.torch), batch B
  qt_async  the same, --mode async
  c_sync    `quorum launch --mode sync --model mlp --hidden 1024,256`
            (quorum's C trainer), batch --c-batch (by default B, so that
            DDP's figure is the baseline of both), on synthetic 28x28 IDX
            data written for the run
  c_async   the same, --mode async (W x --steps global steps: --steps each)
  qt_sync_ov  (only when --modes names it) qt_sync with
            Optimizer(overlap=True): the pull lands under the next forward

and reports each figure's median over the rounds (examples/s summed over
the workers, their training loop timed by themselves) and its ratio to
DDP's at the same W. Beside them it measures, once, what the step model
(step_model.py, docs/PERFORMANCE.md) needs: the compute of a step alone
(torch in one process; `quorum train --local`), the round trip and
bandwidth of quorum's transport (`quorum bench wire`, 1 worker, 1 ps,
fused) and the ps's apply rate (`quorum bench optim`, dense SGD, 1
thread), then prints the model's predictions beside the measurements and
its figures for 100 and 1,000 workers on a 25 Gbit/s network.

Every run has a deadline (--timeout) and is started in a process group of
its own, killed by its pid when late or at exit; the run's temporary
directory is removed at the end.

    python bench/python/bench_scaling.py [--workers 2,4,8,12] [--steps 300]
        [--rounds 3] [--json OUT.json] [--quick]

Paths: the quorum binary is $QUORUM_BINARY or `quorum` on PATH, its
library $QUORUM_LIBRARY (or found beside the binary); torch and numpy
come from the Python that runs this file."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import struct
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_env  # noqa: E402
import step_model  # noqa: E402
from benchlib import LIVE, CpuSampler, free_port, kill_group, run_all  # noqa: E402

BENCH_TORCH = os.path.join(HERE, "bench_torch.py")
MODES = ("ddp", "qt_sync", "qt_async", "c_sync", "c_async", "qt_sync_ov")
DEFAULT_MODES = MODES[:5]  # qt_sync_ov on request (--modes): one more torch start per count


def worker_reports(out: str) -> List[Dict[str, Any]]:
    """bench_torch.py's workers' reports in an output."""
    found = [json.loads(m) for m in re.findall(r'\{"rank"[^}]*\}', out)]
    if not found:
        raise RuntimeError("no worker report in the output: %r" % out[-500:])
    return found


def worker_rates(out: str) -> float:
    """bench_torch.py's workers' samples/s in an output, summed."""
    return float(sum(r["samples_per_s"] for r in worker_reports(out)))


def wait_share(reports: List[Dict[str, Any]]) -> Optional[float]:
    """The workers' mean share of a step spent in the optimizer's step
    (quorum: push, the wait for the quorum, pull)."""
    shares = [r["opt_step_ms"] / r["step_ms"] for r in reports if r.get("step_ms")]
    return float(np.mean(shares)) if shares else None


def last_json(out: str) -> Dict[str, Any]:
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise RuntimeError("no JSON line in the output: %r" % out[-500:])


def write_idx(folder: str, n_train: int, n_test: int, seed: int) -> None:
    """Synthetic 28x28 images (IDX, as Fashion-MNIST's files) with labels:
    the C trainer's MLP then has the 784 inputs of the torch model."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("t10k", n_test)):
        with open(os.path.join(folder, "%s-images-idx3-ubyte" % split), "wb") as f:
            f.write(struct.pack(">IIII", 0x803, n, 28, 28))
            f.write(rng.integers(0, 256, size=(n, 784), dtype=np.uint8).tobytes())
        with open(os.path.join(folder, "%s-labels-idx1-ubyte" % split), "wb") as f:
            f.write(struct.pack(">II", 0x801, n))
            f.write(rng.integers(0, 10, size=n, dtype=np.uint8).tobytes())


class Bench:
    def __init__(self, a: argparse.Namespace, folder: str):
        self.a, self.folder = a, folder
        self.quorum = bench_env.quorum_binary()
        self.env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                        OPENBLAS_NUM_THREADS="1")
        self.env.pop("TF_CONFIG", None)
        self.data = os.path.join(folder, "data")
        os.mkdir(self.data)
        write_idx(self.data, 2048 if a.quick else 8192, 256 if a.quick else 1024, 1)
        self.c_model = ["--model", "mlp", "--hidden", ",".join(map(str, a.dims[1:-1])),
                        "--data", self.data]

    def torch_worker(self, *mode: str) -> List[str]:
        return [sys.executable, BENCH_TORCH, "--batch", str(self.a.batch)] + list(mode)

    def launch(self, mode: str, workers: int, ps: int, tail: List[str],
               cpu: Optional[CpuSampler] = None) -> str:
        cmd = [self.quorum, "launch", "--ps", str(ps), "--workers", str(workers), "--mode", mode,
               "--lr", "0.01", "--quiet", "--partition-min-mb", str(self.a.partition_min_mb)]
        return run_all([cmd + tail], self.env, self.a.timeout, cpu)[0]

    def run(self, mode: str, workers: int, ps: int) -> float:
        """One round of one mode: examples/s summed over the workers. With
        --profile, self.profile holds where the round's time went."""
        a = self.a
        cpu = CpuSampler() if a.profile else None
        self.profile: Dict[str, Any] = {}
        reports: List[Dict[str, Any]] = []
        gather: Optional[float] = None  # c_sync: ps 0's share of a step before its last gradient
        if mode == "ddp":
            port = str(free_port())
            outs = run_all([self.torch_worker("--ddp-worker", str(r), str(workers), port,
                                              str(a.steps)) for r in range(workers)],
                           self.env, a.timeout, cpu)
            reports = [r for o in outs for r in worker_reports(o)]
            rate = float(sum(r["samples_per_s"] for r in reports))
        elif mode.startswith("qt_"):
            overlap = ["--worker-overlap", "on"] if mode == "qt_sync_ov" else []
            reports = worker_reports(self.launch(mode.split("_")[1], workers, ps, ["--"] +
                                                 self.torch_worker("--quorum-worker", str(a.steps),
                                                                   "float32", *overlap), cpu))
            rate = float(sum(r["samples_per_s"] for r in reports))
        else:
            sync = mode == "c_sync"
            steps = a.steps if sync else a.steps * workers  # global steps: async counts every push
            doc = last_json(self.launch(mode[2:], workers, ps, self.c_model + [
                "--batch-size", str(a.c_batch), "--steps", str(steps), "--overlap", a.c_overlap,
                "--json"], cpu))
            rate = float(doc["examples_per_sec"])
            if sync and doc.get("sync"):
                # ps 0's mean time from a step's start to its last gradient
                # (the rest of the step: the apply and the answers)
                step_ms = 1e3 * doc["wall_seconds"] / max(1, doc["global_step"])
                gather = doc["sync"]["mean_wait_ms"] / step_ms
        if cpu:
            use = cpu.stop()
            wall = max(use["wall_s"], 1e-9)
            self.profile = {
                "wait_share": wait_share(reports),
                # every worker's compute quantiles, pooled: a sample of the
                # step compute the run's workers drew (step_model.compare)
                "compute_ms_sample": sorted(q for r in reports
                                            for q in r.get("compute_ms_quantiles", [])),
                "gather_share": gather,
                "cores_busy": {role: sec / wall for role, sec in use["cpu_s"].items()},
                "wall_s": wall}
            # The window every worker was in its timed loop, where they say.
            loops = [r["loop"] for r in reports if "loop" in r]
            busy = cpu.window(max(t for t, _ in loops), min(t for _, t in loops)) \
                if loops else {}
            if busy:
                self.profile["cores_busy"] = busy
                self.profile["window_s"] = min(t for _, t in loops) - max(t for t, _ in loops)
            self.profile["busy_per_task"] = {role: n / use["tasks"][role] for role, n in
                                             self.profile["cores_busy"].items()}
        return rate

    def params(self) -> Dict[str, Any]:
        """What the step model needs, measured here: compute alone (torch,
        quorum's C trainer), the transport's round trip and bandwidth, the
        ps's apply rate."""
        a, q = self.a, self.quorum
        torch_rates, c_rates = [], []
        for _ in range(a.rounds):
            torch_rates.append(worker_rates(run_all([self.torch_worker(
                "--alone-worker", str(a.steps))], self.env, a.timeout)[0]))
            out = run_all([[q, "train", "--local", "--steps", str(a.steps), "--batch-size",
                            str(a.c_batch), "--lr", "0.01", "--quiet", "--json"] + self.c_model],
                          self.env, a.timeout)[0]
            c_rates.append(float(last_json(out)["examples_per_sec"]))
        floats = sum(v for v, _ in step_model.mlp_variables(a.dims)) // 4
        optim = step_model.load_text(run_all([[q, "bench", "optim", "--optim", "sgd", "--no-sparse",
                                    "--threads", "1", "--n", str(floats), "--reps",
                                    "2" if a.quick else "5", "--json"]],
                                  self.env, a.timeout)[0])
        apply_rate = step_model.apply_from_optim(optim)
        big = 1 << 20 if a.quick else 4 << 20
        wire = step_model.load_text(run_all([[q, "bench", "wire", "--ops", "fused", "--ps", "1", "--workers",
                                   "1", "--transports", "unix", "--sizes", "64,%d" % big,
                                   "--repeat", "1" if a.quick else "5", "--seconds",
                                   "0.02" if a.quick else "0.2", "--json"]],
                                 self.env, a.timeout)[0])
        link = step_model.link_from_wire(wire, apply_rate)
        t_rate, c_rate = float(np.median(torch_rates)), float(np.median(c_rates))
        return {"apply_rate": apply_rate, "rtt_s": link["rtt_s"], "bandwidth": link["bandwidth"],
                "transport": link["transport"],
                "alone_examples_per_s": {"torch": t_rate, "c": c_rate},
                "compute_s": {"torch": a.batch / t_rate, "c": a.c_batch / c_rate}}


def parse_counts(text: str) -> List[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("not a list of worker counts: %r" % text) from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("worker counts must be at least 1: %r" % text)
    return counts


def print_tables(doc: Dict[str, Any]) -> None:
    print(bench_env.header(doc["machine"]))
    cfg = doc["config"]
    print("MLP %s, batch %d (torch) and %d (C trainer), medians of %d rounds of %d steps; "
          "partition-min-mb %g" % ("-".join(map(str, cfg["mlp_dims"])), cfg["batch"]["torch"],
                                   cfg["batch"]["c"], cfg["rounds"], cfg["steps"],
                                   cfg["partition_min_mb"]))
    modes = [m for m in MODES if m in cfg["modes"]]
    med = {(p["workers"], p["mode"]): p for p in doc["points"]}
    names = {"ddp": "DDP", "qt_sync": "quorum.torch sync", "qt_async": "async",
             "c_sync": "C trainer sync", "c_async": "async", "qt_sync_ov": "qt sync overlap"}
    print("| workers (ps) | " + " | ".join(names[m] for m in modes) + " |")
    print("|---" * (len(modes) + 1) + "|")
    for w, ps in cfg["counts"]:
        cells = []
        for m in modes:
            p = med.get((w, m))
            cells.append("failed" if not p or not p.get("examples_per_s") else
                         "1.00" if m == "ddp" else "%.2fx" % p["ratio_to_ddp"]
                         if p.get("ratio_to_ddp") else "-")
        print("| %d (%d) | %s |" % (w, ps, " | ".join(cells)))
    print("examples/s (medians; per round in the JSON):")
    print("  %-12s " % "workers (ps)" + " ".join("%12s" % m for m in modes))
    for w, ps in cfg["counts"]:
        print("  %-12s " % ("%d (%d)" % (w, ps)) + " ".join(
            "%12.0f" % med[(w, m)]["examples_per_s"] if med.get((w, m)) and
            med[(w, m)].get("examples_per_s") else "%12s" % "failed" for m in modes))
    profiled = [p for p in doc["points"] if p.get("profile")]
    if profiled:
        print("where the time went (medians over the rounds): cores busy per task by role "
              "(torch: while every worker was in its timed loop; C: the whole run); 'step wait': the workers' share of a step in the "
              "optimizer's step (push, wait, pull); 'gather': C sync, ps 0's share of a step "
              "from its start to its last gradient (the rest is the apply and the answers)")
        print("  %-12s %-9s %8s %8s %8s %10s %8s" % ("workers (ps)", "mode", "ps", "worker",
                                                   "launch", "step wait", "gather"))
        for pt in profiled:
            def mid(f: Any) -> str:
                vals = [v for v in (f(r) for r in pt["profile"]) if v is not None]
                return "%.2f" % float(np.median(vals)) if vals else "-"
            print("  %-12s %-9s %8s %8s %8s %10s %8s" % (
                "%d (%d)" % (pt["workers"], pt["ps"]), pt["mode"],
                mid(lambda r: r["busy_per_task"].get("ps")),
                mid(lambda r: r["busy_per_task"].get("worker")),
                mid(lambda r: r["busy_per_task"].get("launch")),
                mid(lambda r: r["wait_share"]), mid(lambda r: r["gather_share"])))
    p = doc.get("params")
    if p:
        print("alone (one process): torch %.0f examples/s (%.2f ms a step), C trainer %.0f "
              "(%.2f ms); %s round trip %.1f us, bandwidth %.2f GB/s each way; ps apply "
              "(SGD, 1 thread) %.2f GB/s" % (
                  p["alone_examples_per_s"]["torch"], p["compute_s"]["torch"] * 1e3,
                  p["alone_examples_per_s"]["c"], p["compute_s"]["c"] * 1e3, p["transport"],
                  p["rtt_s"] * 1e6, p["bandwidth"] / 1e9, p["apply_rate"] / 1e9))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cores = bench_env.cores()
    default_counts = [w for w in (2, 4, 8, 12) if w < cores] or [1]
    ap.add_argument("--workers", type=parse_counts, default=default_counts,
                    help="worker counts, e.g. 1,2,4,8,12 (default: 2,4,8,12 below the %d cores)"
                    % cores)
    ap.add_argument("--ps", type=int, default=0,
                    help="ps tasks at every count (default 0: step_model.recommend_ps)")
    ap.add_argument("--partition-min-mb", type=float, default=0.25,
                    help="split variables into shards of at least this (MiB) over the ps tasks "
                    "(default 0.25: the MLP's large layers over every ps; 0: no split)")
    ap.add_argument("--steps", type=int, default=300, help="timed steps per worker (default 300)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; medians reported (default 3)")
    ap.add_argument("--batch", type=int, default=128, help="torch batch per worker (default 128)")
    ap.add_argument("--c-batch", type=int, default=0,
                    help="C trainer batch (default 0: --batch, DDP's, so that one DDP figure "
                    "is the baseline of both)")
    ap.add_argument("--c-overlap", choices=["auto", "on", "off"], default="auto",
                    help="the C trainer's --overlap (default auto: on where the tasks leave a "
                    "core spare)")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES),
                    help="of %s (default all but qt_sync_ov)" % ",".join(MODES))
    ap.add_argument("--timeout", type=float, default=180, help="seconds a run may take "
                    "(default 180)")
    ap.add_argument("--json", metavar="PATH", help="write the run's JSON here too (after "
                    "every worker count, \"partial\": true until the run ends)")
    ap.add_argument("--no-model", action="store_true",
                    help="skip the step model's measurements and predictions")
    ap.add_argument("--profile", action="store_true",
                    help="where each run's time went: every task's CPU by role (ps, worker, "
                    "launch; read from /proc) and the workers' share of a step spent in the "
                    "optimizer's step (push, wait, pull)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one round (a smoke test)")
    a = ap.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        ap.error("--modes: unknown %s (known: %s)" % (",".join(bad), ",".join(MODES)))
    a.c_batch = a.c_batch or a.batch
    for name in ("steps", "rounds", "batch", "c_batch"):
        if getattr(a, name) < 1:
            ap.error("--%s must be at least 1, got %d" % (name.replace("_", "-"),
                                                          getattr(a, name)))
    if a.ps < 0 or a.partition_min_mb < 0 or a.timeout <= 0:
        ap.error("--ps and --partition-min-mb must be >= 0 and --timeout > 0")
    if a.quick:
        a.steps, a.rounds, a.batch, a.c_batch = 5, 1, 16, 16
    a.dims = list(step_model.MLP_DIMS)
    counts = [(w, a.ps or step_model.recommend_ps(w, cores)) for w in a.workers]
    folder = tempfile.mkdtemp(prefix="quorum-scaling-")

    def stop(signum: int, frame: Any) -> None:
        for p in list(LIVE):
            kill_group(p)
        shutil.rmtree(folder, ignore_errors=True)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    t_start = time.monotonic()
    try:
        bench = Bench(a, folder)
        doc: Dict[str, Any] = {
            "benchmark": "scaling",
            "machine": bench_env.machine(),
            "config": {"mlp_dims": a.dims, "batch": {"torch": a.batch, "c": a.c_batch},
                       "steps": a.steps, "rounds": a.rounds, "modes": modes,
                       "partition_min_mb": a.partition_min_mb,
                       "counts": counts, "quorum": bench.quorum, "c_overlap": a.c_overlap},
            "points": []}
        print(bench_env.header(doc["machine"]), flush=True)
        if not a.no_model:
            doc["params"] = bench.params()
        for w, ps in counts:
            if w + ps > cores:
                print("note: %d workers and %d ps tasks on %d cores: they share cores"
                      % (w, ps, cores), file=sys.stderr)
            seen: Dict[str, List[float]] = {m: [] for m in modes}
            profiles: Dict[str, List[Dict[str, Any]]] = {m: [] for m in modes}
            errors: Dict[str, str] = {}
            for r in range(a.rounds):
                order = modes[r % len(modes):] + modes[:r % len(modes)]  # rotated each round
                for m in order:
                    t0 = time.monotonic()
                    try:
                        seen[m].append(bench.run(m, w, ps))
                        if bench.profile:
                            profiles[m].append(bench.profile)
                    except RuntimeError as e:
                        errors[m] = str(e)
                        print("%s at %d workers failed: %s" % (m, w, e), file=sys.stderr)
                    print("  [%4.0f s] %d workers, %d ps, round %d: %-8s %s (%.1f s)" % (
                        time.monotonic() - t_start, w, ps, r + 1, m,
                        "%.0f examples/s" % seen[m][-1] if m not in errors else "failed",
                        time.monotonic() - t0), file=sys.stderr, flush=True)
            ddp = float(np.median(seen["ddp"])) if seen.get("ddp") else 0.0
            for m in modes:
                v = float(np.median(seen[m])) if seen[m] else 0.0
                pt: Dict[str, Any] = {"workers": w, "ps": ps, "mode": m, "examples_per_s": v,
                                      "rounds": seen[m], "ratio_to_ddp": v / ddp if ddp else None}
                if profiles[m]:
                    pt["profile"] = profiles[m]
                if m in errors:
                    pt["error"] = errors[m][-500:]
                doc["points"].append(pt)
            if a.json:  # after every count: a run cut short keeps what it measured
                with open(a.json, "w") as f:
                    json.dump(dict(doc, partial=True), f, indent=1)
        doc["seconds"] = time.monotonic() - t_start
    finally:
        for p in list(LIVE):
            kill_group(p)
        shutil.rmtree(folder, ignore_errors=True)
    print_tables(doc)
    if "params" in doc:
        step_model.print_compare(step_model.compare(doc))
        p = doc["params"]
        rows = step_model.extrapolate(p["apply_rate"], p["compute_s"]["torch"], a.batch)
        doc["extrapolation_25gbit"] = rows
        step_model.print_extrapolation(rows, 25.0, 50e-6, p["apply_rate"],
                                       p["compute_s"]["torch"], a.batch,
                                       float(sum(v for v, _ in step_model.mlp_variables())))
    print("(%.0f s in all)" % doc["seconds"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    print(json.dumps(doc))
    failed = [p for p in doc["points"] if "error" in p]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

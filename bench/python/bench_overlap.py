#!/usr/bin/env python3
"""bench_overlap.py - one worker with one ps against the same model trained
in one process, in one run (issue 27, item 2: goal at least 0.9x on a
machine with a core to spare), with the worker's overlap on and off.

  C trainer:    `quorum launch --ps 1 --workers 1 --model mlp` (async and
                sync, --overlap on and off; async --overlap pipeline) against `quorum train --local
                --model mlp`, the same model, data and batch
  quorum.torch: one worker with its ps (run alone: the ps in the same
                process, on threads of its own) against a plain torch loop
                (torch.optim.SGD), the same MLP and batch: overlap off and
                on, and async with overlap="pipeline" (each step's push
                and pull under the next step's compute)

Rounds alternate the variants so that all see the same machine; each
figure is the median over the rounds. The ratios are examples/s against
the single-process run of the same round. Usage:
    bench_overlap.py [--quorum BIN] [--rounds 3] [--steps 300] [--quick]
(python: QUORUM_LIBRARY / PYTHONPATH as for the tests, OMP_NUM_THREADS=1)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Tuple, Union

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import cpu_model  # noqa: E402  (beside this file)


def c_run(quorum: str, args: List[str]) -> float:
    out = subprocess.run([quorum] + args + ["--json", "--quiet"], capture_output=True, text=True,
                         timeout=900)
    if out.returncode:
        sys.exit("%s failed:\n%s" % (" ".join(args), out.stderr[-3000:]))
    return float(json.loads(out.stdout.strip().splitlines()[-1])["examples_per_sec"])


def c_bench(quorum: str, rounds: int, steps: int, data: str) -> Dict[str, List[float]]:
    model = ["--model", "mlp", "--hidden", "1024,256", "--data", data, "--batch-size", "64",
             "--steps", str(steps), "--seed", "1", "--lr", "0.01"]
    variants = {"local": ["train", "--local"] + model}
    for mode, ov in (("async", "off"), ("async", "on"), ("async", "pipeline"), ("sync", "off"),
                     ("sync", "on")):
        name = "%s overlap %s" % (mode, ov) if ov != "pipeline" else "async pipeline"
        variants[name] = ["launch", "--ps", "1", "--workers", "1", "--mode", mode,
                          "--overlap", ov] + model
    got: Dict[str, List[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for k, args in variants.items():
            got[k].append(c_run(quorum, args))
    return got


def torch_bench(rounds: int, steps: int) -> Dict[str, List[float]]:
    import torch
    import quorum.torch as qt
    torch.set_num_threads(1)
    batch = 64
    g = torch.Generator().manual_seed(0)
    X = torch.randn(batch * 16, 784, generator=g)
    y = torch.randint(0, 10, (batch * 16,), generator=g)

    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, 10))

    def loop(model: torch.nn.Module, opt: torch.optim.Optimizer) -> float:
        loss_fn = torch.nn.CrossEntropyLoss()
        for s in range(steps + 10):
            if s == 10:  # warm-up left out
                start = time.perf_counter()
            k = (s % 16) * batch
            xb, yb = X[k:k + batch].clone(), y[k:k + batch].clone()  # the data's loading
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()
        return steps * batch / (time.perf_counter() - start)

    variants: Dict[str, Tuple[str, Union[bool, str]]] = {
        "%s overlap %s" % (mode, "on" if ov else "off"): (mode, ov)
        for mode in ("async", "sync") for ov in (False, True)}
    variants["async pipeline"] = ("async", "pipeline")  # the step under the next one
    got: Dict[str, List[float]] = {"torch": []}
    got.update({k: [] for k in variants})
    for _ in range(rounds):
        m = make()
        got["torch"].append(loop(m, torch.optim.SGD(m.parameters(), lr=0.01)))
        for k, (mode, ov) in variants.items():
            m = make()
            opt = qt.Optimizer(m, "SGD", lr=0.01, overlap=ov, mode=mode)
            got[k].append(loop(m, opt))
            opt.close()
    return got


def report(title: str, base: str, got: Dict[str, List[float]]) -> Dict[str, float]:
    med = {k: statistics.median(v) for k, v in got.items()}
    print("%s (medians of %d rounds, examples/s; ratio to %s):" % (title, len(got[base]), base))
    ratios = {}
    for k, v in med.items():
        ratios[k] = v / med[base]
        print("  %-18s %10.0f  %.2fx" % (k, v, ratios[k]))
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quorum", default="quorum", help="the quorum binary")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--data", default="fashion-mnist", help="the C trainer's data")
    ap.add_argument("--quick", action="store_true", help="1 round of 40 steps (a smoke test)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--json", action="store_true", help="the ratios as JSON, last line")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.steps = 1, 40
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print("cpu: %s, %s cores for this process; BLAS: %s; one worker + one ps need 2 (a core "
          "to spare from 3)" % (cpu_model(), cores, os.environ.get("OPENBLAS_CORETYPE",
                                                                   "OpenBLAS's own choice")))
    out = {"cores": cores,
           "c": report("C trainer, mlp 1024,256, batch 64", "local",
                       c_bench(a.quorum, a.rounds, a.steps, a.data))}
    if not a.no_torch:
        out["torch"] = report("quorum.torch, MLP 784-1024-256-10, batch 64", "torch",
                              torch_bench(a.rounds, a.steps))
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()

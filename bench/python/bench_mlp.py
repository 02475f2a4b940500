"""bench_mlp.py - quorum's compute against torch's, in one run (issue 27):

  1. the MLP's forward, and its forward and backward, per step: `quorum
     bench mlp` (model/model.c on OpenBLAS sgemm) against torch
     (nn.Sequential of Linear and ReLU, cross_entropy, the gradients of
     every parameter) on the same shapes, 784-1024-256-10 at batch 64 and
     128 by default, one thread each. Goal: quorum within 1.1x of torch.
  2. training throughput: `quorum train --local --model mlp` against a
     plain single-process torch loop on the same data, model, batch and
     optimizer (SGD at the same learning rate; batches drawn at random, as
     quorum draws them), examples/s over the training steps (start-up, data
     loading and the test pass left out on both sides). Goal: quorum at
     least 0.9x of torch.

Rounds alternate (quorum, then torch, then quorum...), so a slow moment of
the machine falls on both; each figure is the median of its rounds, and
the ratios compare medians of this run. Beside the figures: the CPU, its
logical CPUs, the BLAS kernel quorum ran (and who chose it, see the README's
"BLAS kernels") and torch's BLAS and CPU capability.

    python bench/python/bench_mlp.py [--quick] [--json] [--rounds R]
        [--steps N] [--train-steps N] [--batch 64,128] [--hidden 1024,256]
        [--data fashion-mnist|digits]

(run with the Python environment that has torch: .venv/bin/python; the
quorum binary is found on PATH, or set QUORUM=path/to/quorum)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time
from typing import Any, Dict, List, Tuple

import numpy as np
import torch
import torch.nn.functional as F

QUORUM = os.environ.get("QUORUM") or shutil.which("quorum") or "quorum"
FASHION_DIR = "/usr/share/datasets/fashion-mnist"
HERE = os.path.dirname(os.path.abspath(__file__))
DIGITS = os.path.join(HERE, "..", "..", "data", "digits.csv.gz")


def quorum_json(args: List[str], timeout: float = 900) -> List[Dict[str, Any]]:
    """Run `quorum ARGS` and parse the JSON lines of its stdout."""
    p = subprocess.run([QUORUM] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout, text=True)
    if p.returncode != 0:
        sys.exit("bench_mlp: quorum %s failed (%d): %s" % (" ".join(args), p.returncode,
                                                          p.stderr[-2000:]))
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def make_mlp(dims: List[int]) -> torch.nn.Sequential:
    layers: List[torch.nn.Module] = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def torch_step_us(dims: List[int], batch: int, steps: int, model: torch.nn.Sequential,
                  ) -> Tuple[float, float]:
    """Microseconds a step of torch's forward (with the loss, no grad), and
    of its forward and backward (every parameter's gradient), as `quorum
    bench mlp` times model/model.c."""
    g = torch.Generator().manual_seed(7)
    x = torch.rand(batch, dims[0], generator=g)
    y = torch.randint(0, dims[-1], (batch,), generator=g)
    params = list(model.parameters())
    for _ in range(max(steps // 4, 2)):  # warm-up, as the C side's
        torch.autograd.grad(F.cross_entropy(model(x), y), params)
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            F.cross_entropy(model(x), y)
    forward = (time.perf_counter() - start) / steps * 1e6
    start = time.perf_counter()
    for _ in range(steps):
        torch.autograd.grad(F.cross_entropy(model(x), y), params)
    both = (time.perf_counter() - start) / steps * 1e6
    return forward, both


def kernels(o: argparse.Namespace) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    dims = [784] + o.hidden + [10]
    models = {b: make_mlp(dims) for b in o.batch}
    q: Dict[int, Dict[str, List[float]]] = {b: {"fwd": [], "both": []} for b in o.batch}
    t: Dict[int, Dict[str, List[float]]] = {b: {"fwd": [], "both": []} for b in o.batch}
    cpu: Dict[str, Any] = {}
    hidden = ",".join(map(str, o.hidden))
    batches = ",".join(map(str, o.batch))
    for _ in range(o.rounds):
        for point in quorum_json(["bench", "mlp", "--json", "--hidden", hidden, "--batch",
                                  batches, "--steps", str(o.steps), "--rounds", "1"]):
            q[point["batch"]]["fwd"].append(point["forward_us"])
            q[point["batch"]]["both"].append(point["forward_backward_us"])
            cpu = point["cpu"]
        for b in o.batch:
            f, both = torch_step_us(dims, b, o.steps, models[b])
            t[b]["fwd"].append(f)
            t[b]["both"].append(both)
    rows = []
    for b in o.batch:
        row = {"batch": b, "dims": dims}
        for what in ("fwd", "both"):
            qm, tm = statistics.median(q[b][what]), statistics.median(t[b][what])
            name = "forward" if what == "fwd" else "forward_backward"
            row.update({name + "_us_quorum": qm, name + "_us_torch": tm,
                        name + "_ratio": qm / tm})
        rows.append(row)
    return cpu, rows


def load_data(name: str) -> Tuple[np.ndarray, np.ndarray]:
    """The training examples quorum trains on, scaled as quorum scales them
    (src/data: IDX pixels / 255, digits counts / 16). The test examples
    are left out of quorum's training set; here every example is, which
    changes only which rows batches are drawn from."""
    if name == "fashion-mnist":
        with gzip.open(os.path.join(FASHION_DIR, "train-images-idx3-ubyte.gz")) as f:
            raw = f.read()
        n, rows, cols = struct.unpack(">III", raw[4:16])
        x = np.frombuffer(raw, np.uint8, offset=16).reshape(n, rows * cols) / np.float32(255)
        with gzip.open(os.path.join(FASHION_DIR, "train-labels-idx1-ubyte.gz")) as f:
            y = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
        return x.astype(np.float32), y
    table = np.loadtxt(DIGITS, delimiter=",", dtype=np.float32)
    return table[:, :-1] / np.float32(16), table[:, -1].astype(np.int64)


def torch_train(x: torch.Tensor, y: torch.Tensor, dims: List[int], batch: int, steps: int,
                lr: float) -> float:
    """examples/s of a plain torch training loop: SGD, batches drawn at
    random with replacement (as quorum's trainer draws them)."""
    torch.manual_seed(1)
    model = make_mlp(dims)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    start = time.perf_counter()
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (batch,))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return steps * batch / (time.perf_counter() - start)


def training(o: argparse.Namespace) -> List[Dict[str, Any]]:
    xs, ys = load_data(o.data)
    x, y = torch.from_numpy(np.ascontiguousarray(xs)), torch.from_numpy(ys)
    dims = [x.shape[1]] + o.hidden + [10]
    hidden = ",".join(map(str, o.hidden))
    rows = []
    for b in o.batch:
        q, t = [], []
        for r in range(o.rounds):
            out = quorum_json(["train", "--local", "--model", "mlp", "--hidden", hidden,
                               "--data", o.data, "--batch-size", str(b), "--steps",
                               str(o.train_steps), "--optimizer", "sgd", "--lr", "0.05",
                               "--seed", str(r + 1), "--json", "--quiet"])
            q.append(out[-1]["examples_per_sec"])
            t.append(torch_train(x, y, dims, b, o.train_steps, 0.05))
        qm, tm = statistics.median(q), statistics.median(t)
        rows.append({"batch": b, "dims": dims, "data": o.data, "steps": o.train_steps,
                     "examples_per_sec_quorum": qm, "examples_per_sec_torch": tm,
                     "ratio": qm / tm})
    return rows


def int_list(s: str) -> List[int]:
    try:
        v = [int(p) for p in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("expected numbers like 64,128, got %r" % s)
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError("expected positive numbers like 64,128, got %r" % s)
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few steps of a small model")
    ap.add_argument("--json", action="store_true", help="one JSON object at the end")
    ap.add_argument("--rounds", type=int, default=5, help="alternated rounds (default 5)")
    ap.add_argument("--steps", type=int, default=200, help="steps a kernel round (default 200)")
    ap.add_argument("--train-steps", type=int, default=500,
                    help="steps a training round (default 500)")
    ap.add_argument("--batch", type=int_list, default=[64, 128])
    ap.add_argument("--hidden", type=int_list, default=[1024, 256])
    ap.add_argument("--data", choices=["fashion-mnist", "digits"],
                    default="fashion-mnist" if os.path.isdir(FASHION_DIR) else "digits")
    o = ap.parse_args()
    if o.rounds < 1 or o.steps < 1 or o.train_steps < 1:
        ap.error("--rounds, --steps and --train-steps must be at least 1")
    if o.quick:
        o.rounds, o.steps, o.train_steps, o.batch, o.hidden = 2, 5, 10, [16], [32]
        o.data = "digits"
    torch.set_num_threads(1)  # quorum computes on one BLAS thread
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cpu, kernel_rows = kernels(o)
    train_rows = training(o)
    torch_info = {"version": torch.__version__,
                  "blas": torch.backends.mkl.is_available() and "mkl" or "other",
                  "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if o.json:
        print(json.dumps({"cpu": cpu, "torch": torch_info, "kernels": kernel_rows,
                          "training": train_rows, "rounds": o.rounds}))
        return
    print("cpu: %s, %d logical CPUs; quorum's BLAS kernel %s (chosen by %s); torch %s, %s, %s"
          % (cpu.get("model"), cpu.get("cores", 0), cpu.get("blas_kernel"),
             cpu.get("blas_kernel_chosen_by"), torch_info["version"], torch_info["blas"],
             torch_info["cpu_capability"]))
    print("\n1. MLP %s, microseconds a step, medians of %d alternated rounds of %d steps"
          % ("-".join(map(str, kernel_rows[0]["dims"])), o.rounds, o.steps))
    print("%6s %10s %10s %7s   %10s %10s %7s" % ("batch", "fwd quorum", "torch", "ratio",
                                                 "f+b quorum", "torch", "ratio"))
    for r in kernel_rows:
        print("%6d %10.1f %10.1f %6.2fx   %10.1f %10.1f %6.2fx" % (
            r["batch"], r["forward_us_quorum"], r["forward_us_torch"], r["forward_ratio"],
            r["forward_backward_us_quorum"], r["forward_backward_us_torch"],
            r["forward_backward_ratio"]))
    print("   (ratio: quorum's time / torch's; goal: at most 1.1x)")
    print("\n2. training, %s, MLP %s, SGD, examples/s, medians of %d alternated rounds of %d steps"
          % (o.data, "-".join(map(str, train_rows[0]["dims"])), o.rounds, o.train_steps))
    print("%6s %14s %14s %7s" % ("batch", "quorum --local", "torch", "ratio"))
    for r in train_rows:
        print("%6d %14.0f %14.0f %6.2fx" % (r["batch"], r["examples_per_sec_quorum"],
                                            r["examples_per_sec_torch"], r["ratio"]))
    print("   (ratio: quorum's examples/s / torch's; goal: at least 0.9x)")


if __name__ == "__main__":
    main()

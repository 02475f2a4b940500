"""Mixed precision on the wire: a variable whose gradients and values
travel as bf16 or fp16 (Worker.set_dtype) while the ps keeps float32.
Narrowing and widening are checked against torch's own conversions
(.to(torch.bfloat16), .to(torch.float16)) through the whole path: worker,
wire, ps, and back; a bf16 model and a torch.autocast(bf16) one train
under quorum.torch as under torch; the bytes on the wire are halved."""

from __future__ import annotations

import gzip
import os
import threading

import numpy as np
import pytest
import torch

import quorum
import quorum.torch as qt

torch.set_num_threads(1)


def edge_values(n: int = 1001) -> torch.Tensor:
    """Random values over many magnitudes, ties of both types' rounding,
    half's subnormals and overflow, signed zeros (no NaN: a NaN is
    refused as a gradient and has no single right bit pattern)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-30, 20, (n,), generator=g).float())
    special = torch.tensor([0.0, -0.0, 1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8,  # bf16 ties
                            1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11,                 # fp16 ties
                            65504.0, 65519.0, 65520.0, 1e6, -1e6, 3.4e38,        # fp16 overflow
                            2 ** -24, 2 ** -25, 1.5 * 2 ** -24, 1023.5 * 2 ** -24, 1e-30])
    x[:len(special)] = special
    return x


@pytest.mark.parametrize("wire", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("partitions", [1, 2])
def test_pulled_values_are_torch_conversions(make_cluster, wire, partitions):  # type: ignore[no-untyped-def]
    """A float32 master pulled on a narrow wire equals torch's rounding of
    it, into float32 arrays (converted by the worker) and into arrays of
    the wire's dtype (as they came); an odd length pads each part."""
    c = make_cluster(2, 1, lr=1.0, timeout_ms=10000)
    w = c.worker(0)
    x = edge_values()
    var = w.declare_values("x", x.clone(), options="partitions=%d" % partitions)
    w.initialize()
    assert len(w.placement(var)) == partitions
    w.set_dtype(var, wire)  # float32 arrays
    out32 = torch.empty_like(x)
    w.pull({var: out32})
    assert torch.equal(out32.view(torch.int32), x.to(wire).float().view(torch.int32))
    w.set_dtype(var, wire, wire)  # arrays of the wire's dtype
    out16 = torch.empty(x.shape, dtype=wire)
    w.pull({var: out16})
    assert torch.equal(out16.view(torch.int16), x.to(wire).view(torch.int16))


@pytest.mark.parametrize("wire", [torch.bfloat16, torch.float16])
def test_pushed_gradient_widened_master_float32(make_cluster, wire):  # type: ignore[no-untyped-def]
    """A bf16/fp16 gradient is applied to the float32 master exactly as its
    float32 widening (SGD lr=1, async): another worker pulling float32
    sees values no half could hold."""
    c = make_cluster(1, 2, lr=1.0, timeout_ms=10000)
    w = c.worker(0)
    x = torch.linspace(-3, 3, 257) + 1e-4  # not representable in half types
    var = w.declare_values("x", x.clone())
    w.initialize()
    w.set_dtype(var, wire, wire)
    g = (torch.randn(257, generator=torch.Generator().manual_seed(5)) * 0.01).to(wire)
    w.push({var: g})
    other = c.worker(1)
    other.declare_values("x", x.clone())
    other.initialize()
    master = torch.empty(257)
    other.pull({0: master})
    assert torch.equal(master, x - g.float())
    # the fused push-and-pull brings the values back in the wire's dtype
    back = torch.empty(257, dtype=wire)
    w.push_pull({var: g}, into={var: back})
    assert torch.equal(back, (x - 2 * g.float()).to(wire))
    # NumPy: float16 arrays as they are, bf16 as uint16 bits
    np_grad = g.float().numpy().astype(np.float16) if wire is torch.float16 else \
        g.view(torch.int16).numpy().view(np.uint16)
    w.push({var: np_grad})
    other.pull({0: master})
    assert torch.equal(master, x - 3 * g.float())


def test_nonfinite_half_gradient_refused(make_cluster):  # type: ignore[no-untyped-def]
    c = make_cluster(1, 1, lr=1.0, timeout_ms=10000)
    w = c.worker(0)
    var = w.declare_values("x", torch.zeros(9))
    w.initialize()
    w.set_dtype(var, "bf16", "bf16")
    g = torch.zeros(9, dtype=torch.bfloat16)
    g[8] = float("inf")
    with pytest.raises(quorum.QuorumError, match="NaN or Inf"):
        w.push({var: g})
    w.set_dtype(var, "fp16")  # float32 arrays: 1e6 overflows half to inf
    with pytest.raises(quorum.QuorumError, match="NaN or Inf"):
        w.push({var: torch.full((9,), 1e6)})
    out = torch.ones(9)
    w.pull({var: out})
    assert torch.equal(out, torch.zeros(9))  # nothing was applied


def test_bad_dtypes_named(make_cluster):  # type: ignore[no-untyped-def]
    c = make_cluster(1, 1, timeout_ms=10000)
    w = c.worker(0)
    var = w.declare_values("x", torch.zeros(4))
    w.initialize()
    with pytest.raises(ValueError, match="float32, bfloat16"):
        w.set_dtype(var, "int8")
    with pytest.raises(quorum.QuorumError, match="converts only float32"):
        w.set_dtype(var, "bf16", "fp16")
    w.set_dtype(var, "bf16", "bf16")
    with pytest.raises(TypeError, match="bfloat16"):
        w.push({var: torch.zeros(4)})  # a float32 array for a bf16 one
    with pytest.raises(TypeError, match="NumPy has no bfloat16"):
        w.push({var: np.zeros(4, np.float32)})


def digits() -> tuple:  # type: ignore[type-arg]
    root = os.path.join(os.path.dirname(__file__), "..", "..", "data", "digits.csv.gz")
    with gzip.open(root, "rt") as f:
        a = np.loadtxt(f, delimiter=",", dtype=np.float32)
    X, y = torch.from_numpy(a[:, :64] / 16.0), torch.from_numpy(a[:, 64]).long()
    return X[:1500], y[:1500], X[1500:], y[1500:]


def net(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 10)).to(dtype)


def train_sync(make_cluster, dtype, autocast=False, wire_dtype=None, epochs=8):  # type: ignore[no-untyped-def]
    """Two sync workers, each on half of every batch; the test accuracy
    and the bytes pushed and pulled."""
    c = make_cluster(2, 2, mode="sync", timeout_ms=30000)
    X, y, Xt, yt = digits()
    models = [net(dtype), net(dtype)]
    opts: list = [None, None]
    errors: list = []

    def run(k: int) -> None:
        try:
            opts[k] = qt.Optimizer(models[k], "SGD", worker=c.worker(k), lr=0.1,
                                   momentum=0.9, wire_dtype=wire_dtype)
            for _ in range(epochs):
                for b in range(0, 1500, 100):
                    xb, yb = X[b + 50 * k:b + 50 * k + 50], y[b + 50 * k:b + 50 * k + 50]
                    opts[k].zero_grad()
                    if autocast:
                        with torch.autocast("cpu", dtype=torch.bfloat16):
                            out = models[k](xb)
                    else:
                        out = models[k](xb.to(dtype))
                    torch.nn.functional.cross_entropy(out.float(), yb).backward()
                    opts[k].step()
        except Exception as e:  # noqa: B902 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert a.dtype is dtype and torch.equal(a, b)  # one model, in its own dtype
    stats = opts[0].worker.stats()
    with torch.no_grad():
        acc = float((models[0](Xt.to(dtype)).argmax(1) == yt).float().mean())
    for o in opts:
        o.close()
    return acc, stats["push_bytes"], stats["pull_bytes"]


def test_bf16_and_fp16_models_train_like_float32(make_cluster):  # type: ignore[no-untyped-def]
    """Sync, 2 workers, digits: bf16 and fp16 models reach the float32
    model's test accuracy within 0.03, with half the bytes on the wire;
    a float32 model on a bf16 wire too."""
    acc32, push32, pull32 = train_sync(make_cluster, torch.float32)
    assert acc32 > 0.8
    for dtype in (torch.bfloat16, torch.float16):
        acc, push, pull = train_sync(make_cluster, dtype)
        assert acc > acc32 - 0.03, (dtype, acc, acc32)
        assert push == push32 // 2 and pull == pull32 // 2, (push, push32, pull, pull32)
    acc, push, pull = train_sync(make_cluster, torch.float32, wire_dtype="bf16")
    assert acc > acc32 - 0.03
    assert push == push32 // 2 and pull == pull32 // 2


def test_autocast_bf16_trains(make_cluster):  # type: ignore[no-untyped-def]
    """torch.autocast(bf16) on the CPU: float32 parameters, bf16 matmuls;
    quorum.torch trains it as torch would (a GradScaler's calls go through)."""
    acc, _, _ = train_sync(make_cluster, torch.float32, autocast=True)
    assert acc > 0.8

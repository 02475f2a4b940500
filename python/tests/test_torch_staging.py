"""Staging through host buffers (quorum/torch/staging.py), the path of GPU
models, run on the CPU: ``Optimizer(staging=True)`` (or
QUORUM_TORCH_FORCE_STAGING=1) copies every gradient into a host buffer of
its own as autograd produces it and pulls into host buffers copied back
into the parameters. A model trained so must end bit for bit where the
same training without staging ends: parameters and BatchNorm buffers, sync
and async, one worker and two, SGD with momentum and AdamW, gradients
clipped in place after backward, accumulate=2. The CUDA path itself is run
on a GPU by hand (docs/PYTHON.md, "GPU models")."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

import pytest
import torch

import quorum.torch as qt

FEATURES, CLASSES, STEPS = 6, 3, 12


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.BatchNorm1d(16),
                               torch.nn.ReLU(), torch.nn.Linear(16, CLASSES))


def batches(rank: int) -> List[Any]:
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(STEPS):
        x = torch.randn(8, FEATURES, generator=g)
        out.append((x, (x[:, 0] > 0).long() + (x[:, 1] > 1).long()))
    return out


def train(staging: Optional[bool], rank: int = 0, worker: Any = None, clip: bool = False,
          optimizer: str = "SGD", accumulate: int = 1, m: Optional[torch.nn.Module] = None,
          **settings: Any) -> Dict[str, torch.Tensor]:
    m = m if m is not None else model()
    hyper = dict(lr=0.05, momentum=0.9) if optimizer == "SGD" else \
        dict(lr=0.01, weight_decay=0.01)
    opt = qt.Optimizer(m, optimizer, worker=worker, staging=staging, accumulate=accumulate,
                       **hyper, **settings)
    assert (opt._staging is not None) == bool(staging)
    try:
        for x, y in batches(rank):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            if clip:  # in place, after the hooks copied the gradients
                torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1)
            opt.step()
        return {k: v.clone() for k, v in m.state_dict().items()}
    finally:
        opt.close(stop_cluster=worker is None)


def assert_same(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), "%s differs: %s" % (k, (a[k] - b[k]).abs().max())


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
def test_staged_alone_is_bit_identical(mode: str, optimizer: str) -> None:
    torch.set_num_threads(1)
    plain = train(False, optimizer=optimizer, mode=mode)
    staged = train(True, optimizer=optimizer, mode=mode)
    assert not torch.equal(plain["0.weight"], model().state_dict()["0.weight"])  # it trained
    assert_same(plain, staged)


def test_staged_clipped_and_accumulated() -> None:
    """A gradient changed in place after its hook copied it is copied
    again at step(); accumulate sums the host copies."""
    torch.set_num_threads(1)
    assert_same(train(False, clip=True, mode="sync"), train(True, clip=True, mode="sync"))
    assert_same(train(False, accumulate=2, mode="async"), train(True, accumulate=2, mode="async"))


def test_staged_two_workers_sync(make_cluster: Any) -> None:
    torch.set_num_threads(1)
    results: Dict[bool, List[Dict[str, torch.Tensor]]] = {}
    for staging in (False, True):
        c = make_cluster(1, 2, mode="sync", timeout_ms=20000)
        out: List[Any] = [None, None]
        models = [model(), model()]  # torch's seed is global: not in the threads

        def run(rank: int) -> None:
            try:
                out[rank] = train(staging, rank=rank, worker=c.worker(rank), m=models[rank])
            except BaseException as e:  # noqa: B902 - reported below
                out[rank] = e
        threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for r in out:
            assert isinstance(r, dict), r
        results[staging] = out
    for rank in (0, 1):
        assert_same(results[False][rank], results[True][rank])


def test_force_staging_by_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv("QUORUM_TORCH_FORCE_STAGING", "1")
    m = model()
    opt = qt.Optimizer(m, lr=0.1)
    try:
        assert opt._staging is not None
        assert all(e.value.data_ptr() != e.param.data_ptr() for e in opt._staging.entries)
    finally:
        opt.close()
    monkeypatch.setenv("QUORUM_TORCH_FORCE_STAGING", "0")
    opt = qt.Optimizer(m, lr=0.1)
    try:
        assert opt._staging is None  # CPU parameters are read in place
    finally:
        opt.close()


def test_staging_refusals() -> None:
    with pytest.raises(ValueError, match="overlap=True with staged parameters"):
        qt.Optimizer(model(), lr=0.1, staging=True, overlap=True)
    with pytest.raises(ValueError, match="local_steps with staged parameters"):
        qt.Optimizer(model(), lr=0.1, staging=True, local_steps=2)
    bad = torch.nn.Linear(2, 2).to(torch.float64)
    with pytest.raises(TypeError, match="on the CPU or a CUDA device"):
        qt.Optimizer(bad, lr=0.1)

"""Pipelined async steps (Optimizer(overlap="pipeline"), pipeline.py): each
step's push and pull run on a thread under the next step's compute. One
worker alone must train exactly as SGD whose gradient of step t is taken on
the values of two steps back (computed here with torch itself), which
differs from the unpipelined run; every call of the optimizer waits for
the step in flight; the settings it cannot serve are refused by name; the
default turns it on only where a core is spare and several workers train;
two workers train through it and stop in order."""

from __future__ import annotations

import os
import threading
from typing import Any, List

import pytest
import torch

import quorum.torch as qt

STEPS, LR = 10, 0.1


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def batches(seed: int = 1) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(16, 4, generator=g) for _ in range(STEPS)]


def loss_of(m: torch.nn.Module, X: torch.Tensor) -> torch.Tensor:
    return ((m(X) - (X[:, :1] * 2 - X[:, 1:2])) ** 2).mean()


def sgd_reference(delay: int) -> List[torch.Tensor]:
    """torch's own SGD, the gradient of step t taken on the values after
    t - delay steps (delay 1: plain SGD; 2: one step staler)."""
    ref = mlp()
    history = [[p.detach().clone() for p in ref.parameters()]]
    for t, X in enumerate(batches(), 1):
        with torch.no_grad():
            for p, v in zip(ref.parameters(), history[max(t - delay, 0)]):
                p.copy_(v)
        ref.zero_grad()
        loss_of(ref, X).backward()
        history.append([v - LR * p.grad for v, p in zip(history[-1], ref.parameters())])
    return history[-1]


def train(overlap: Any) -> List[torch.Tensor]:
    m = mlp()
    opt = qt.Optimizer(m, "SGD", lr=LR, overlap=overlap)
    assert opt.pipelined is (overlap == "pipeline")
    for X in batches():
        opt.zero_grad()
        loss_of(m, X).backward()
        opt.step()
        if overlap == "pipeline":
            assert all(p.grad is None for p in m.parameters())  # handed to the thread
    opt.close()  # waits for the last step: its values are the parameters'
    return [p.detach().clone() for p in m.parameters()]


def test_one_worker_is_sgd_one_step_staler() -> None:
    torch.set_num_threads(1)
    piped, plain = train("pipeline"), train(False)
    for got, want in zip(piped, sgd_reference(2)):
        assert torch.equal(got, want), (got - want).abs().max()
    for got, want in zip(plain, sgd_reference(1)):
        assert torch.equal(got, want), (got - want).abs().max()
    assert any(not torch.equal(a, b) for a, b in zip(piped, plain))


def test_every_call_waits_for_the_step_in_flight(tmp_path: Any) -> None:
    torch.set_num_threads(1)
    m = mlp()
    opt = qt.Optimizer(m, "SGD", lr=LR, momentum=0.9, overlap="pipeline",
                       checkpoint_dir=str(tmp_path))
    for X in batches()[:3]:
        opt.zero_grad()
        loss_of(m, X).backward()
        opt.step()
    assert opt._pipeline is not None and opt._pipeline.busy
    state = opt.state_dict()  # waits: the ps's slots after all three pushes
    assert not opt._pipeline.busy and opt.global_step == 3
    assert state["state"][0]["momentum_buffer"].shape == m[0].weight.shape
    after = [p.detach().clone() for p in m.parameters()]
    pulled = {i: torch.empty_like(p) for _, p, i in opt.params}
    opt.worker.pull(pulled)  # the ps's values: what synchronize() put in place
    for (_, p, i), a in zip(opt.params, after):
        assert torch.equal(pulled[i], a)
    opt.zero_grad()
    loss_of(m, batches()[3]).backward()
    opt.step()
    assert opt.checkpoint() == 4 and not opt._pipeline.busy  # waits too: all four pushes in
    opt.close()
    assert opt.global_step == 4


def test_refusals_name_the_setting(make_cluster: Any) -> None:
    with pytest.raises(ValueError, match="async training"):
        qt.Optimizer(mlp(), "SGD", lr=LR, overlap="pipeline", mode="sync")
    with pytest.raises(ValueError, match="accumulate or local_steps"):
        qt.Optimizer(mlp(), "SGD", lr=LR, overlap="pipeline", accumulate=2)
    torch.manual_seed(0)
    bn = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    with pytest.raises(ValueError, match="buffers=\"local\""):
        qt.Optimizer(bn, "SGD", lr=LR, overlap="pipeline")
    opt = qt.Optimizer(bn, "SGD", lr=LR, overlap="pipeline", buffers="local")
    assert opt.pipelined
    opt.close()
    with pytest.raises(ValueError, match="overlap='later'"):
        qt.Optimizer(mlp(), "SGD", lr=LR, overlap="later")


def test_default_needs_a_spare_core_and_several_workers(make_cluster: Any,
                                                         monkeypatch: Any) -> None:
    torch.set_num_threads(1)
    for cores, nworkers, on in ((8, 1, False), (8, 2, True), (3, 2, False)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        c = make_cluster(1, nworkers, mode="async")
        opt = qt.Optimizer(mlp(), "SGD", lr=LR, worker=c.worker(0))
        assert opt.pipelined is on, (cores, nworkers)
        opt.close(stop_cluster=True)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    c = make_cluster(1, 2, mode="async")
    opt = qt.Optimizer(mlp(), "SGD", lr=LR, worker=c.worker(0), overlap=False)
    assert not opt.pipelined
    opt.close(stop_cluster=True)


def test_two_workers_train_and_stop_in_order(make_cluster: Any) -> None:
    torch.set_num_threads(1)
    c = make_cluster(1, 2, mode="async", timeout_ms=20000)
    models = [mlp(), mlp()]
    losses: List[Any] = [None, None]

    def run(rank: int) -> None:
        try:
            m = models[rank]
            opt = qt.Optimizer(m, "SGD", lr=0.05, worker=c.worker(rank), overlap="pipeline")
            first = float(loss_of(m, batches(rank + 5)[0]).detach())
            for _ in range(15):
                for X in batches(rank + 5):
                    opt.zero_grad()
                    loss_of(m, X).backward()
                    opt.step()
            opt.close(stop_cluster=False)
            losses[rank] = (first, float(loss_of(m, batches(rank + 5)[0]).detach()), opt.global_step)
        except BaseException as e:  # noqa: B902 - reported below
            losses[rank] = e
    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for r in losses:
        assert isinstance(r, tuple), r
        first, last, step = r
        assert last < first / 2, r  # it trained (a 3.8x to 5x drop seen)
    assert max(r[2] for r in losses) >= 2 * 15 * STEPS - 2  # every push counted

"""quorum.torch's overlap: in sync mode the step's pull lands under the
next batch's loading (the values equal those without overlap, bit for
bit), in async mode each gradient is pushed as backward produces it (the
last layer's before the first layer's backward is done), a gradient
changed after its push is an error, and spare_core counts the cores as
quorum's own --overlap auto does."""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List

import pytest
import torch

import quorum
import quorum.torch as qt
from quorum.torch.overlap import spare_core


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                               torch.nn.ReLU(), torch.nn.Linear(8, 1))


def batch(rank: int, step: int) -> tuple:  # type: ignore[type-arg]
    g = torch.Generator().manual_seed(1000 * rank + step)
    X = torch.randn(16, 4, generator=g)
    return X, X[:, :1] * 2 - X[:, 1:2]


def sync_run(make_cluster: Any, overlap: bool) -> List[Dict[str, torch.Tensor]]:
    torch.set_num_threads(1)
    c = make_cluster(2, 2, mode="sync", timeout_ms=20000)
    models = [mlp(), mlp()]  # torch's seed is global: not in the threads
    out: List[Any] = [None, None]

    def run(rank: int) -> None:
        try:
            m = models[rank]
            opt = qt.Optimizer(m, "Adam", worker=c.worker(rank), lr=0.01, overlap=overlap)
            assert opt.overlap is overlap
            for step in range(8):
                X, y = batch(rank, step)  # loaded while the last step's pull is in flight
                opt.zero_grad()
                ((m(X) - y) ** 2).mean().backward()
                opt.step()
                assert bool(opt._landing) is overlap  # the pull lands later with overlap
            assert opt.global_step == 8
            out[rank] = m.state_dict()  # lands the last pull first
            assert not opt._landing
            opt.close()
        except BaseException as e:  # noqa: B902 - reported below
            out[rank] = e
    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for o in out:
        if isinstance(o, BaseException):
            raise o
    return out


def test_sync_overlap_equals_without(make_cluster: Any) -> None:
    on, off = sync_run(make_cluster, True), sync_run(make_cluster, False)
    for rank in (0, 1):
        assert on[rank].keys() == off[rank].keys()
        for k in on[rank]:
            assert torch.equal(on[rank][k], off[rank][k]), k
    assert not torch.equal(on[0]["0.weight"], mlp().state_dict()["0.weight"])  # it trained


def test_async_overlap_pushes_the_last_layer_first() -> None:
    torch.set_num_threads(1)
    model = mlp()
    opt = qt.Optimizer(model, "SGD", lr=0.1, overlap=True)
    names = {i: n for n, _, i in opt.params}
    events: List[str] = []
    start = opt.worker.push_pull_start

    def traced(grads: Any, **kw: Any) -> Any:
        events.extend("push " + names[i] for i in grads)
        return start(grads, **kw)
    opt.worker.push_pull_start = traced  # type: ignore[method-assign]
    # registered after the optimizer's hook: runs once 0.weight's is pushed
    first = model[0].weight  # type: ignore[index]
    first.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
        lambda p: events.append("first layer's weight done"))
    X, y = batch(0, 0)
    ((model(X) - y) ** 2).mean().backward()
    done = events.index("first layer's weight done")
    assert events.index("push 4.weight") < done and events.index("push 4.bias") < done
    assert events.index("push 2.weight") < done
    assert events.index("push 4.weight") < events.index("push 0.weight")
    assert len([e for e in events if e.startswith("push")]) == 6
    opt.step()
    assert opt.global_step == 1
    # a gradient changed after its push: the ps applied it unchanged
    opt.zero_grad()
    ((model(X) - y) ** 2).mean().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    with pytest.raises(RuntimeError, match="changed after backward pushed it"):
        opt.step()
    opt.close()


def test_default_follows_the_cores(monkeypatch: Any) -> None:
    torch.set_num_threads(1)
    for cores in (2, 3):
        # alone: this worker (1 thread) and its ps in this process use 2;
        # overlap changes what a script sees between step() and the next
        # forward, so it is asked for, never chosen
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        for settings, on in (({"mode": "sync"}, False), ({}, False),
                             ({"mode": "sync", "overlap": True}, True),
                             ({"overlap": True}, True)):
            opt = qt.Optimizer(mlp(), "SGD", lr=0.1, **settings)
            assert opt.overlap is on, (cores, settings)
            opt.close()
        assert spare_core(qt.Optimizer(mlp(), "SGD", lr=0.1).worker.cluster, True) == \
            (cores > 2, cores, 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    # tasks elsewhere do not count; local ones (Unix sockets, loopback) do
    remote = quorum.Cluster(["10.0.0.1:2222"], ["10.0.0.2:2222", "10.0.0.3:2222"], "worker", 0)
    assert spare_core(remote) == (True, 8, 1)
    here = quorum.Cluster(["unix:/tmp/x-ps0.sock", "127.0.0.1:2223"],
                          ["localhost:2224"] * 1 + ["[::1]:2225", "10.0.0.9:1"], "worker", 2)
    assert spare_core(here) == (True, 8, 5)
    torch.set_num_threads(2)
    assert spare_core(here) == (False, 8, 8)
    torch.set_num_threads(1)

"""The worker API against real ps tasks: declarations (with a torch
module's own values), dense and sparse training, sync steps, exceptions
by status family with the C message, the GIL released while waiting, log
lines in Python's logging, the cluster spec from TF_CONFIG."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import quorum


def test_declare_from_torch_module(cluster):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    w = cluster.worker()
    ids = {name: w.declare_values(name, p.detach()) for name, p in model.named_parameters()}
    w.initialize()
    w.pull()
    for name, p in model.named_parameters():
        assert np.array_equal(w.value(name), p.detach().numpy())
    assert w.shape("weight") == (3, 5) and w.size(ids["bias"]) == 3


def test_partitioned_and_placement(cluster):  # type: ignore[no-untyped-def]
    w = cluster.worker()
    w.declare("big", (10, 4), init="normal:0,1", seed=3, options="partitions=2")
    w.declare("small", 3)
    w.initialize()
    assert w.placement("big") == [(0, 0, 20), (1, 20, 20)]
    assert len(w.placement("small")) == 1


def test_push_pull_fused(cluster):  # type: ignore[no-untyped-def]
    """Async, lr 0.5 over 2 ps: the fused call returns the values after its
    own push, into a given tensor or the worker's copy; bad arrays are
    refused before C sees them."""
    w = cluster.worker()
    w.declare("big", (4, 2), options="partitions=2")
    w.declare("b", 3)
    w.initialize()
    out = torch.zeros(4, 2)
    g_big = np.ones((4, 2), dtype=np.float32)
    g_b = np.full(3, 2.0, dtype=np.float32)
    step = w.push_pull({"big": g_big, "b": g_b}, into={"big": out})
    assert step == 1
    assert torch.equal(out, torch.full((4, 2), -0.5))
    assert np.array_equal(w.value("b"), np.full(3, -1.0, dtype=np.float32))
    assert np.array_equal(w.value("big"), np.zeros((4, 2), dtype=np.float32))  # went to `out`
    with pytest.raises(TypeError, match="float64"):
        w.push_pull({"b": np.ones(3)})
    with pytest.raises(ValueError):
        w.push_pull({"b": g_b}, into={"b": np.zeros(2, dtype=np.float32)})
    for call in (w.push, w.push_pull, w.push_start, w.push_pull_start):
        with pytest.raises(TypeError, match=call.__name__ + ": a gradient is None"):
            call({"b": None})
    with pytest.raises(ValueError, match="pull of 'b': the array is read-only"):
        ro = np.zeros(3, dtype=np.float32)
        ro.flags.writeable = False
        w.pull({"b": ro})
    ro = np.full(3, 2.0, dtype=np.float32)  # a read-only gradient is fine
    ro.flags.writeable = False
    w.push({"b": ro}, step=False)
    w.pull({"b": out.numpy().reshape(-1)[:3]})
    assert np.array_equal(w.value("b"), np.full(3, -1.0, dtype=np.float32))  # not the copy
    assert torch.equal(out.reshape(-1)[:3], torch.full((3,), -2.0))


def test_exceptions_carry_the_message(cluster):  # type: ignore[no-untyped-def]
    with pytest.raises(quorum.InvalidArgumentError, match="optimizer") as e:
        quorum.Config(optimizer="adamax")
    assert isinstance(e.value, ValueError) and e.value.status_name == "QR_EINVAL"
    w = cluster.worker()
    w.declare("v", 2)
    with pytest.raises(quorum.InvalidArgumentError, match="declared twice"):
        w.declare("v", 2)
    with pytest.raises(KeyError):
        w.id("nope")


def test_timeout_when_no_ps(make_cluster):  # type: ignore[no-untyped-def]
    c = make_cluster(1, 1, timeout_ms=300, init_timeout_ms=300)
    spec = quorum.Cluster(["unix:%s/nobody.sock" % c.dir], c.worker_hosts, "worker", 0)
    w = quorum.Worker(spec, timeout_ms=300, init_timeout_ms=300)
    w.declare("v", 2)
    with pytest.raises(quorum.QuorumTimeoutError, match="no CREATE reply within 300 ms") as e:
        w.initialize()
    assert isinstance(e.value, TimeoutError)
    w.close()


def test_stopped(make_cluster):  # type: ignore[no-untyped-def]
    c = make_cluster(1, 2)
    chief, other = c.worker(0), c.worker(1)
    for w in (chief, other):
        w.declare("v", 2)
    chief.initialize()
    other.initialize()
    chief.stop_cluster()
    with pytest.raises(quorum.StoppedError, match="stop"):
        other.push({"v": np.ones(2, dtype=np.float32)})


def test_async_sparse_training(cluster):  # type: ignore[no-untyped-def]
    """Least squares on a table: rows of 3 ids learn their targets."""
    w = cluster.worker()
    t = w.declare_table("emb", 2, init="zeros")
    w.initialize()
    target = {3: np.array([1.0, -1.0]), 1 << 40: np.array([0.5, 2.0]), -7: np.array([0, 3.0])}
    ids = np.array(list(target), dtype=np.int64)
    goal = np.stack([target[i] for i in target]).astype(np.float32)
    for _ in range(40):
        rows = w.pull_rows(t, ids)
        w.push_sparse(t, ids, (rows - goal) * 0.5)
    assert np.allclose(w.pull_rows(t, ids), goal, atol=1e-3)
    assert w.global_step() == 40


def sync_worker(w, grads, steps, out):  # type: ignore[no-untyped-def]
    try:
        for _ in range(steps):
            w.sync_step(grads)
        out.append(w.value("v").copy())
    except Exception as e:  # reported by the test
        out.append(e)


def runs_while_blocked(target) -> threading.Thread:  # type: ignore[no-untyped-def]
    """Starts target on a thread and checks that, while it is blocked in a
    call for half a second, this thread keeps running (the GIL is free)."""
    t = threading.Thread(target=target)
    t.start()
    ticks = 0
    deadline = time.time() + 0.5
    while time.time() < deadline:
        ticks += 1
    assert t.is_alive() and ticks > 1000, ticks
    return t


def test_sync_steps_and_gil(make_cluster):  # type: ignore[no-untyped-def]
    """Two sync workers; while worker 0 waits for its token (worker 1 is
    late), a Python thread keeps running: the GIL is released."""
    c = make_cluster(2, 2, mode="sync", lr=1.0)
    ws = [c.worker(0), c.worker(1)]
    for w in ws:
        w.declare("v", 4)
    threads = []
    for w in ws:  # initialize together (the others wait for the chief)
        threads.append(threading.Thread(target=w.initialize))
        threads[-1].start()
    for t in threads:
        t.join()
    out0: list = []
    # worker 0 is blocked in take_token meanwhile
    t0 = runs_while_blocked(lambda: sync_worker(ws[0], {"v": np.full(4, 1.0, np.float32)}, 1,
                                                out0))
    out1: list = []
    sync_worker(ws[1], {"v": np.full(4, 3.0, np.float32)}, 1, out1)
    t0.join(10)
    for got in (out0[0], out1[0]):
        assert not isinstance(got, Exception), got
        assert np.array_equal(got, np.full(4, -2.0, np.float32))  # mean of 1 and 3
    stats = ws[0].stats()
    assert stats["steps"] == 1 and stats["in_quorum"] == [1, 1], stats


def test_fast_path_releases_the_gil(make_cluster):  # type: ignore[no-untyped-def]
    """The common dense calls (a dict of float32 arrays) go through the C
    extension (_fastcall.c): it is built, gives what the ctypes path gives
    (names or ids, NumPy or torch), and releases the GIL: worker 0's sync
    push_pull waits for worker 1's gradient while a Python thread runs."""
    from quorum._native import fastcall

    assert fastcall is not None, "the package was built without its C fast path"
    c = make_cluster(2, 2, mode="sync", lr=1.0)
    ws = [c.worker(0), c.worker(1)]
    for w in ws:
        w.declare("v", 4)
        w.declare("b", (2, 3))
    threads = [threading.Thread(target=w.initialize) for w in ws]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outs = [np.zeros(4, np.float32), torch.zeros(4)]
    done: list = []

    def chief() -> None:
        done.append(ws[0].push_pull({"v": np.full(4, 1.0, np.float32),
                                     1: np.zeros((2, 3), np.float32)},
                                    into={"v": outs[0], 1: None}))

    t0 = runs_while_blocked(chief)  # worker 0 waits for the step meanwhile
    step = ws[1].push_pull({"v": torch.full((4,), 3.0), "b": torch.ones(2, 3)},
                           into={"v": outs[1], "b": None})
    t0.join(10)
    assert done == [1] and step == 1
    assert np.array_equal(outs[0], np.full(4, -2.0, np.float32))  # the mean, 2, at lr 1
    assert torch.equal(outs[1], torch.full((4,), -2.0))
    assert np.array_equal(ws[0].value("b"), np.full((2, 3), -0.5, np.float32))
    pulled = np.zeros((2, 3), np.float32)
    ws[1].pull({1: pulled, "v": None})
    assert np.array_equal(pulled, ws[0].value("b"))
    assert np.array_equal(ws[1].value("v"), np.full(4, -2.0, np.float32))


def test_log_lines_in_logging(make_cluster, caplog):  # type: ignore[no-untyped-def]
    with caplog.at_level(logging.INFO, logger="quorum"):
        c = make_cluster(1, 1)
        time.sleep(0.1)
    assert any("listening on" in r.getMessage() for r in caplog.records), caplog.records


def test_cluster_from_tf_config(monkeypatch):  # type: ignore[no-untyped-def]
    spec = {"cluster": {"ps": ["127.0.0.1:2222", "127.0.0.1:2223"],
                        "worker": ["127.0.0.1:2224"]},
            "task": {"type": "ps", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(spec))
    c = quorum.Cluster.from_env()
    assert (c.job, c.task_index, c.num_ps, c.num_workers) == ("ps", 1, 2, 1)
    assert c.addresses("ps") == spec["cluster"]["ps"]
    assert json.loads(c.to_tf_config()) == spec
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(quorum.QuorumError):
        quorum.Cluster.from_env()


def test_secret_file_passes_through(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    """A job with a secret (docs/SECURITY.md): the secret_file option reaches
    the C library, encrypted sessions train, and a worker with another
    job's secret gets AuthenticationError naming the reason, at once."""
    secret, other = str(tmp_path / "secret"), str(tmp_path / "other")
    tool = shutil.which("quorum", path=os.path.dirname(sys.executable)) or "quorum"
    for path in (secret, other):
        subprocess.run([tool, "keygen", path], check=True, capture_output=True)
    c = make_cluster(1, 1, secret_file=secret, encrypt=True, timeout_ms=20000)
    w = c.worker(0)
    w.declare("v", 3)
    w.initialize()
    w.push({"v": np.ones(3, dtype=np.float32)})
    w.pull()
    assert (w.value("v") < 0).all()  # the push went through the sealed session
    intruder = quorum.Worker(c.spec("worker", 0), secret_file=other, encrypt=True,
                             timeout_ms=20000)
    intruder.declare("v", 3)
    t0 = time.time()
    with pytest.raises(quorum.AuthenticationError, match="different secrets") as e:
        intruder.initialize()
    assert isinstance(e.value, PermissionError)
    assert time.time() - t0 < 10  # refused at once, not after the timeout
    intruder.close()
    with pytest.raises(quorum.InvalidArgumentError, match="encrypt needs a cluster secret"):
        quorum.Worker(c.spec("worker", 0), encrypt=True, secret_file="none")

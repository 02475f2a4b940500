"""Module buffers and data positions under `quorum launch`, against torch:

- a model with BatchNorm trained by 2 workers (programs/bn_buffers.py):
  with buffers="chief" (the default) every worker's running statistics
  after each step are the chief's of that step (sync), or one the chief
  pushed (async); with buffers="average", the mean of the two workers'
  (sync), or every worker's update added (async: num_batches_tracked
  counts every batch of the cluster). The chief's checkpoint holds them
  (read with safetensors), qt.load_checkpoint restores them into a fresh
  module, and its test accuracy equals the chief's.
- a worker killed mid-run and restarted by --max-restarts
  (programs/restart_torch.py) goes on where its data stream was: the
  run's global steps are the planned count, sync and async."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List

import pytest
import torch

import quorum.torch as qt

PROGRAMS = os.path.join(os.path.dirname(__file__), "programs")
# The installed quorum beside this Python; against a build tree (the
# package run with QUORUM_LIBRARY), the tree's, first on PATH.
QUORUM = (shutil.which("quorum") if os.environ.get("QUORUM_LIBRARY") else None) or \
    shutil.which("quorum", path=os.path.dirname(sys.executable)) or "quorum"
sys.path.insert(0, PROGRAMS)
import bn_buffers  # noqa: E402


def launch(args: List[str], program: List[str], timeout: int = 240) -> "subprocess.CompletedProcess[str]":
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([QUORUM, "launch", "--ps", "2", "--workers", "2"] + args +
                       ["--", sys.executable] + program, capture_output=True, text=True,
                       timeout=timeout, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    return p


def same(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("buffers", ["chief", "average"])
def test_batchnorm_buffers(tmp_path, mode, buffers):  # type: ignore[no-untyped-def]
    ckpt = tmp_path / "ckpt"
    out = str(tmp_path / "run")
    launch(["--mode", mode, "--lr", "0.05", "--checkpoint-dir", str(ckpt)],
           [os.path.join(PROGRAMS, "bn_buffers.py"), buffers, out])
    chief, other = (torch.load("%s.%d.pt" % (out, k)) for k in (0, 1))
    n = len(chief["steps"])
    assert n == len(other["steps"]) == 24, (n, len(other["steps"]))  # 3 epochs of 8 batches
    nbt = "1.num_batches_tracked"
    if mode == "sync" and buffers == "chief":
        for k in range(n):  # after each step: the chief's, from its own forward
            assert same(other["after"][k], chief["before"][k]), k
            assert same(chief["after"][k], chief["before"][k]), k
    elif mode == "sync":
        for k in range(n):  # the mean over the step's two workers
            for name, mine in other["after"][k].items():
                both = (chief["before"][k][name].float() + other["before"][k][name].float()) / 2
                assert torch.allclose(mine.float(), both, rtol=1e-6, atol=1e-7), (k, name)
                assert torch.equal(mine, chief["after"][k][name]), (k, name)
        assert int(other["after"][-1][nbt]) == n
    elif buffers == "chief":  # async: what the chief pushed, one step or another
        pushed = [bn_buffers.bn(bn_buffers.model())] + chief["before"]  # (or the initial)
        # Each buffer is one the chief pushed; in async mode buffers on
        # different ps tasks may come from different pushes of it (a pull
        # may land between its push reaching one ps and the other).
        for k in range(n):
            for name, mine in other["after"][k].items():
                assert any(torch.equal(mine, b[name]) for b in pushed), (k, name)
        assert any(same(other["after"][-1], b) for b in chief["before"])
        assert same(chief["after"][-1], chief["before"][-1])
    else:  # async average: every push adds its worker's update
        assert int(other["after"][-1][nbt]) <= 2 * n and int(chief["after"][-1][nbt]) <= 2 * n
    # The chief's checkpoint holds the buffers the chief ended with
    # (average, async: the cluster's, every one of the 2 n batches counted).
    # Read merged from its chain: an incremental checkpoint holds only the
    # variables that changed since the one before.
    folder = sorted(glob.glob(str(ckpt / "ckpt-*")))[-1]
    tensors: Dict[str, torch.Tensor] = qt.checkpoint_state_dict(folder)
    for name in ("1.running_mean", "1.running_var"):
        assert tensors[name].dtype == torch.float32
        if not (mode == "async" and buffers == "average"):
            assert torch.equal(tensors[name], chief["state"][name]), name
    if mode == "async" and buffers == "average":
        assert float(tensors[nbt]) == 2 * n
    else:
        assert float(tensors[nbt]) == float(chief["state"][nbt])
    # ... and qt.load_checkpoint restores them into a fresh module.
    fresh = bn_buffers.model()
    loaded = qt.load_checkpoint(fresh, str(ckpt))
    assert {"1.running_mean", "1.running_var", nbt} <= set(loaded)
    assert fresh.state_dict()[nbt].dtype == torch.int64
    if mode == "sync":  # the checkpoint is the chief's model: the same accuracy
        assert same(fresh.state_dict(), chief["state"])
        tx, ty = bn_buffers.data(512, 2)
        assert bn_buffers.accuracy(fresh, tx, ty) == chief["accuracy"] > 0.6, chief["accuracy"]


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_restarted_worker_resumes_its_data(tmp_path, mode):  # type: ignore[no-untyped-def]
    """Worker 1 dies after 8 of its 18 steps; restarted, its sampler goes on
    from its 8th batch: 36 pushes in all (async), 18 steps (sync), as
    planned. Without the position it would redo 8 batches (44 and 26)."""
    p = launch(["--mode", mode, "--lr", "0.05", "--max-restarts", "1"],
               [os.path.join(PROGRAMS, "restart_torch.py"), str(tmp_path / "marker")])
    assert "worker 1 (pid" in p.stderr and "restarting it (restart 1 of 1)" in p.stderr, \
        p.stderr[-3000:]
    found: Dict[int, Any] = {}
    for text in re.findall(r"\{[^{}]*\}", p.stdout):  # two workers' lines may meet
        r = json.loads(text)
        found[r["task"]] = r
    assert sorted(found) == [0, 1], p.stdout + p.stderr[-3000:]
    assert found[0]["calls"] == 18 and found[0]["restored"] == 0, found
    assert found[1]["restored"] == 8 * 8, found  # 8 batches of 8 examples
    assert found[1]["calls"] == 18 - 8, found
    planned = 3 * 6 * (2 if mode == "async" else 1)
    final = max(r["global_step"] for r in found.values())
    assert abs(final - planned) <= 1, (final, planned, found)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_restarted_worker_after_coordinator_failover(tmp_path, mode):  # type: ignore[no-untyped-def]
    """--ps-replicas 2: ps 0 is SIGKILLed while worker 1 waits at its 8th
    step; ps 1 takes the coordinator's role over. Then worker 1 kills
    itself and launch restarts it after the failover: its QUORUM_OPTIONS
    name ps 1 the coordinator ("coordinator": "1"), so it goes to ps 1 for
    shard 0, resumes its data and ends the run as planned. (Without it,
    the restarted worker waits for ps 0 to the end.)"""
    go = str(tmp_path / "go")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    log = open(tmp_path / "launch.err", "w+")
    p = subprocess.Popen([QUORUM, "launch", "--ps", "2", "--workers", "2", "--mode", mode,
                          "--lr", "0.05", "--ps-replicas", "2", "--max-restarts", "2", "--",
                          sys.executable, os.path.join(PROGRAMS, "restart_torch.py"),
                          str(tmp_path / "marker"), go],
                         stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        deadline = time.time() + 120
        while not os.path.exists(go + ".ready"):
            assert p.poll() is None and time.time() < deadline, open(tmp_path / "launch.err").read()
            time.sleep(0.05)
        # async: worker 0 finishes its 18 steps meanwhile, and tells ps 0
        # (LEAVE), which its backup is told too (sync: it waits for worker 1)
        while mode == "async" and "info: worker 0 has finished" not in \
                open(tmp_path / "launch.err").read():
            assert p.poll() is None and time.time() < deadline, open(tmp_path / "launch.err").read()
            time.sleep(0.05)
        ps0 = [c for c in children(p.pid) if "--task_index\x000\x00" in cmdline(c) and
               cmdline(c).split("\x00")[1] == "ps"]
        assert len(ps0) == 1, ps0
        os.kill(ps0[0], signal.SIGKILL)
        while "was failed over by ps 1" not in open(tmp_path / "launch.err").read():
            assert p.poll() is None and time.time() < deadline, open(tmp_path / "launch.err").read()
            time.sleep(0.05)
        open(go, "w").close()
        out, _ = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    err = open(tmp_path / "launch.err").read()
    assert p.returncode == 0, err[-4000:]
    assert "quorum launch: ps 0 (pid %d) was failed over by ps 1" % ps0[0] in err, err[-3000:]
    assert "worker 1 (pid" in err and "restarting it" in err, err[-3000:]
    found: Dict[int, Any] = {}
    for text in re.findall(r"\{[^{}]*\}", out):
        r = json.loads(text)
        found[r["task"]] = r
    assert sorted(found) == [0, 1], out + err[-3000:]
    assert found[1]["restored"] == 8 * 8 and found[1]["calls"] == 18 - 8, found
    planned = 3 * 6 * (2 if mode == "async" else 1)
    final = max(r["global_step"] for r in found.values())
    assert abs(final - planned) <= 1, (final, planned, found)
    # ps 1 knew worker 0 had finished (from ps 0's forward): it waited for
    # no new run of the chief, and ended the run when worker 1 finished.
    assert "the chief (worker 0) was lost" not in err, err[-3000:]
    if mode == "async":
        assert re.search(r"\[ps 1 pid \d+\] info: worker 1 has finished at global step \d+ "
                         r"\(2 of 2 workers have\)", err), err[-3000:]


def children(pid: int) -> List[int]:
    with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
        return [int(c) for c in f.read().split()]


def cmdline(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid) as f:
            return f.read()
    except OSError:
        return ""

"""Summaries and metrics of a PyTorch job (docs/PYTHON.md, "Summaries and
metrics"): under `quorum launch --logdir DIR --metrics-port-base N --
python script.py`, the chief's optimizer writes the TensorBoard events and
summaries.jsonl that quorum's own trainer writes (read back with
TensorBoard's reader), `quorum plot DIR` draws them, every worker serves
its Prometheus page on the port the launcher listed (promtool accepts it),
and the chief shows a progress line. examples/sec is the whole cluster's:
a global step is one batch in async mode and R batches in sync mode."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, List

import pytest

# free_base, shared with the integration tests (as scripts/soak.py shares
# their parser): tests/integration/qrtest.py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "integration"))
from qrtest import free_base  # type: ignore[import-not-found]  # noqa: E402

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "summaries_torch.py")
QUORUM = shutil.which("quorum") or shutil.which("quorum", path=os.path.dirname(sys.executable)) \
    or "quorum"
BATCH = 16  # the program's
READ = r"""
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
a = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
a.Reload()
print(json.dumps({t: [[e.step, e.value] for e in a.Scalars(t)] for t in a.Tags()["scalars"]}))
"""


def tensorboard(logdir: str) -> Dict[str, List[List[float]]]:
    out = subprocess.run([sys.executable, "-c", READ, logdir], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    return json.loads(out)  # type: ignore[no-any-return]


def value(page: str, name: str) -> float:
    for line in page.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("%s not in the page:\n%s" % (name, page))


def launch(tmp_path: Any, mode: str, steps: int, *extra: str) -> "subprocess.Popen[str]":
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen([QUORUM, "launch", "--ps", "1", "--workers", "2", "--mode", mode,
                             "--logdir", str(tmp_path / "logs"), "--summary-secs", "0.2",
                             *extra, "--", sys.executable, PROGRAM, str(tmp_path), str(steps)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_async_job_summaries_metrics_plot(tmp_path: Any) -> None:
    base = free_base(3)
    p = launch(tmp_path, "async", 100000, "--metrics-port-base", str(base))
    try:
        deadline = time.time() + 180
        while not all(os.path.exists(tmp_path / ("ready.%d" % r)) for r in (0, 1)):
            assert p.poll() is None, p.communicate()[1][-3000:]
            assert time.time() < deadline, "the workers never got to step 20"
            time.sleep(0.2)
        ports = json.load(open(tmp_path / "logs" / "metrics_ports.json"))
        assert ports == {"ps 0": base, "worker 0": base + 1, "worker 1": base + 2}, ports
        for task in ("worker 0", "worker 1"):
            url = "http://127.0.0.1:%d/metrics" % ports[task]
            with urllib.request.urlopen(url, timeout=10) as r:
                assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                page = r.read().decode()
            assert value(page, "quorum_worker_global_step") > 0, page
            assert value(page, "quorum_worker_pushes_total") >= 20, page
            assert value(page, "quorum_worker_examples_per_second") > 0, page
            assert 0 < value(page, "quorum_worker_loss") < 100, page
            assert 'quorum_worker_call_seconds_count{op="push"}' in page, page
            if shutil.which("promtool"):
                check = subprocess.run(["promtool", "check", "metrics"], input=page,
                                       capture_output=True, text=True, timeout=60)
                assert check.returncode == 0, (task, check.stdout, check.stderr)
        time.sleep(1.0)  # a few more summary points
        open(tmp_path / "stop", "w").close()
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err[-3000:]
    assert "quorum launch: metrics at ps 0 http://127.0.0.1:%d/metrics, worker 0 " \
           "http://127.0.0.1:%d/metrics, worker 1 http://127.0.0.1:%d/metrics" \
           % (base, base + 1, base + 2) in err, err[-3000:]
    # the chief's progress line, rate-limited: a handful, not one per step
    progress = re.findall(r"^step \d+  loss [0-9.]+  \d+ examples/s$", err, re.M)
    assert 1 <= len(progress) <= 20, err[-3000:]

    logdir = str(tmp_path / "logs")
    assert any(f.startswith("events.out.tfevents.") for f in os.listdir(logdir))
    tb = tensorboard(logdir)
    for tag in ("loss", "global_step/sec", "examples/sec", "stale_gradients", "learning_rate",
                "my/scalar"):
        assert tag in tb, (tag, sorted(tb))
    steps = [s for s, _ in tb["loss"]]
    assert len(steps) >= 3 and steps == sorted(steps), steps
    assert all(abs(v - 0.05) < 1e-7 for _, v in tb["learning_rate"]), tb["learning_rate"]
    assert all(0 < v < 100 for _, v in tb["loss"]), tb["loss"]
    stale = [v for _, v in tb["stale_gradients"]]
    assert stale == sorted(stale), stale  # a count so far
    # async: one batch per global step, whichever worker pushed it
    for (_, eps), (_, sps) in zip(tb["examples/sec"], tb["global_step/sec"]):
        assert abs(eps - BATCH * sps) <= 1e-3 * eps, (eps, sps)
    lines = [json.loads(l) for l in open(os.path.join(logdir, "summaries.jsonl"))]
    assert [l["step"] for l in lines] == steps
    for l, (_, v) in zip(lines, tb["loss"]):
        assert abs(l["loss"] - v) <= 1e-6 * max(1, abs(v)), (l["loss"], v)
    assert lines[-1]["my/scalar"] >= 20, lines[-1]  # its latest value

    if not shutil.which("gnuplot"):
        pytest.skip("gnuplot (gnuplot-nox) is not installed: quorum plot is not checked")
    png = str(tmp_path / "run.png")
    r = subprocess.run([QUORUM, "plot", logdir, "-o", png], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    data = open(png, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10000, len(data)


def test_sync_job_counts_every_replica_and_quiet(tmp_path: Any) -> None:
    """Sync, R = N = 2: a global step takes both workers' batches. No
    metrics port: none is listed, none is served. --quiet: no progress line."""
    open(tmp_path / "stop", "w").close()  # 60 steps, then stop
    p = launch(tmp_path, "sync", 60, "--quiet")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    assert "metrics at" not in err and not re.search(r"^step \d+", err, re.M), err[-3000:]
    tb = tensorboard(str(tmp_path / "logs"))
    assert tb["loss"][-1][0] >= 20, tb["loss"]  # the last point, at close()
    for (_, eps), (_, sps) in zip(tb["examples/sec"], tb["global_step/sec"]):
        assert abs(eps - 2 * BATCH * sps) <= 1e-3 * eps, (eps, sps)
    assert all(v == 0 for _, v in tb["stale_gradients"]), tb["stale_gradients"]


def test_step_arguments_are_checked() -> None:
    import torch

    import quorum.torch as qt

    model = torch.nn.Linear(2, 1)
    opt = qt.Optimizer(model, "SGD", lr=0.1)
    try:
        with pytest.raises(TypeError, match="loss"):
            opt.step(loss="high")
        with pytest.raises(ValueError, match="examples"):
            opt.step(examples=-1)
        with pytest.raises(TypeError, match="one-element"):
            opt.step(loss=torch.ones(3))
        with pytest.raises(ValueError, match="finite"):
            qt.log_scalar("x", float("nan"))
        with pytest.raises(TypeError, match="name"):
            qt.log_scalar("", 1.0)
        model(torch.ones(4, 2)).sum().backward()
        assert opt.step(loss=torch.tensor(0.5), examples=4) == 1
    finally:
        opt.close()


def test_plot_without_loss(tmp_path: Any) -> None:
    """A job that gave no loss: `quorum plot` draws examples/sec alone."""
    if not shutil.which("gnuplot"):
        pytest.skip("gnuplot (gnuplot-nox) is not installed")
    with open(tmp_path / "summaries.jsonl", "w") as f:
        for step in range(10, 60, 10):
            f.write(json.dumps({"wall_time": 1.0 * step, "step": step, "global_step/sec": 5.0,
                                "examples/sec": 80.0 + step}) + "\n")
    png = str(tmp_path / "run.png")
    r = subprocess.run([QUORUM, "plot", str(tmp_path), "-o", png], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "5 points" in r.stdout, r.stderr
    assert open(png, "rb").read()[:8] == b"\x89PNG\r\n\x1a\n"


def test_monitor_calls_check_their_arguments(cluster: Any, tmp_path: Any) -> None:
    """The C calls under summaries.py (qr_monitor_*) refuse what they cannot
    write, naming it."""
    import ctypes

    from quorum._native import lib

    w = cluster.worker()
    w.declare("v", 2)
    w.initialize()
    m = ctypes.c_void_p()
    assert lib.qr_monitor_create(ctypes.byref(m), None) != 0
    assert b"worker is NULL" in lib.qr_last_error()
    assert lib.qr_monitor_create(ctypes.byref(m), w._handle) == 0
    try:
        logdir = str(tmp_path / "logs").encode()
        assert lib.qr_monitor_open_summaries(m, logdir, 0.0) != 0
        assert b"every_secs" in lib.qr_last_error()
        assert lib.qr_monitor_open_summaries(m, b"", 1.0) != 0
        assert lib.qr_monitor_open_summaries(m, logdir, 1.0) == 0
        assert lib.qr_monitor_open_summaries(m, logdir, 1.0) != 0
        assert b"already" in lib.qr_last_error()
        assert lib.qr_monitor_serve_metrics(m, b"127.0.0.1", 0) != 0
        assert b"port" in lib.qr_last_error()
        for tag, words in ((b"", b"1 to 128"), (b'a"b', b"quote"), (b"x" * 129, b"1 to 128"),
                           (b"learning_rate", b"summary service's own")):
            assert lib.qr_monitor_scalar(m, tag, 1.0) != 0, tag
            assert words in lib.qr_last_error(), lib.qr_last_error()
        assert lib.qr_monitor_scalar(m, b"x", float("inf")) != 0
        assert b"finite" in lib.qr_last_error()
        for i in range(32):
            assert lib.qr_monitor_scalar(m, b"t%d" % i, 1.0) == 0
        assert lib.qr_monitor_scalar(m, b"t0", 2.0) == 0  # a new value, not a new tag
        assert lib.qr_monitor_scalar(m, b"t32", 1.0) != 0
        assert b"at most 32" in lib.qr_last_error()
        assert lib.qr_monitor_step(m, -1, 0, 0.5, 0.1) != 0
        assert lib.qr_monitor_step(m, 1, 4, 0.5, -0.1) != 0
        assert b"learning rate" in lib.qr_last_error()
        assert lib.qr_monitor_step(m, 1, 4, 0.5, 0.1) == 0
        assert lib.qr_monitor_step(m, 2, 4, float("nan"), float("nan")) == 0
        assert lib.qr_monitor_flush(m) == 0
    finally:
        lib.qr_monitor_free(m)
    point = json.loads(open(tmp_path / "logs" / "summaries.jsonl").readlines()[-1])
    assert point["step"] == 2 and point["loss"] == 0.5 and point["learning_rate"] == 0.1, point
    assert point["t0"] == 2.0 and point["t31"] == 1.0 and point["examples/sec"] > 0, point

"""`quorum launch -- COMMAND`: any program as the workers, with TF_CONFIG and
the launcher's options, supervised: a sync run of a Python program, the ps
tasks stopped when the workers are done (or by the program), and Ctrl-C in
the middle leaving no process behind."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "sync_sgd.py")
QUORUM = shutil.which("quorum", path=os.path.dirname(sys.executable)) or "quorum"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose (its parent, the launcher, reaps it)
    with open("/proc/%d/stat" % pid) as f:
        return f.read().split()[2] != "Z"


# The chief stops the cluster itself in sync mode (where it cannot finish
# before the other worker has joined); in async mode the launcher does.
@pytest.mark.parametrize("mode,stop", [("sync", True), ("async", False)])
def test_program_as_workers(tmp_path, mode, stop):  # type: ignore[no-untyped-def]
    args = [QUORUM, "launch", "--ps", "2", "--workers", "2", "--mode", mode, "--lr", "0.1",
            "--", sys.executable, PROGRAM, "60", str(tmp_path / "pid")]
    if stop:
        args.append("--stop")
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    results = [json.load(open(f)) for f in sorted(glob.glob(str(tmp_path / "pid.result.*")))]
    assert [r["task"] for r in results] == [0, 1], p.stderr[-3000:]
    for r in results:
        assert abs(r["theta"][0] - 1.0) < 0.1 and abs(r["theta"][1] + 2.0) < 0.1, r
    if mode == "sync":  # every worker ends on the same parameters
        assert results[0]["theta"] == results[1]["theta"]
    assert "running %s" % sys.executable in p.stderr


def test_ctrl_c_leaves_nothing(tmp_path):  # type: ignore[no-untyped-def]
    p = subprocess.Popen([QUORUM, "launch", "--ps", "2", "--workers", "2", "--",
                          sys.executable, PROGRAM, "0", str(tmp_path / "pid")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while len(glob.glob(str(tmp_path / "pid.pid.*"))) < 2 and time.time() < deadline:
            time.sleep(0.05)
        pids = [int(open(f).read()) for f in glob.glob(str(tmp_path / "pid.pid.*"))]
        assert len(pids) == 2
        time.sleep(0.5)  # training
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=30)
        err = p.stderr.read() if p.stderr else ""
        assert rc == 130, err[-3000:]
        assert "interrupted: stopping all tasks" in err
        for pid in pids:
            assert not alive(pid), "worker pid %d outlived the launcher" % pid
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_nothing_after_dashes():  # type: ignore[no-untyped-def]
    p = subprocess.run([QUORUM, "launch", "--ps", "1", "--workers", "1", "--"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "nothing after" in p.stderr

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
import socket
import subprocess
import sys
import tempfile
import time

import pytest

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "sync_sgd.py")
UNEVEN = os.path.join(os.path.dirname(__file__), "programs", "uneven_torch.py")
QUORUM = shutil.which("quorum", path=os.path.dirname(sys.executable)) or "quorum"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose (its parent, the launcher, reaps it)
    with open("/proc/%d/stat" % pid) as f:
        return f.read().split()[2] != "Z"


# In sync mode the workers say they have finished and ps 0 ends the run
# once both have; in async mode the launcher stops the ps tasks.
@pytest.mark.parametrize("mode,leave", [("sync", True), ("async", False)])
def test_program_as_workers(tmp_path, mode, leave):  # type: ignore[no-untyped-def]
    args = [QUORUM, "launch", "--ps", "2", "--workers", "2", "--mode", mode, "--lr", "0.1",
            "--", sys.executable, PROGRAM, "60", str(tmp_path / "pid")]
    if leave:
        args.append("--leave")
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    results = [json.load(open(f)) for f in sorted(glob.glob(str(tmp_path / "pid.result.*")))]
    assert [r["task"] for r in results] == [0, 1], p.stderr[-3000:]
    for r in results:
        assert abs(r["theta"][0] - 1.0) < 0.1 and abs(r["theta"][1] + 2.0) < 0.1, r
    if mode == "sync":  # every worker ends on the same parameters
        assert results[0]["theta"] == results[1]["theta"]
    assert "running %s" % sys.executable in p.stderr
    if leave:
        assert "every worker has finished (global step 60)" in p.stderr, p.stderr[-3000:]


def test_uneven_data_sync_ends_in_order():  # type: ignore[no-untyped-def]
    """R = N = 2, worker 0 has 10 batches and worker 1 has 20: worker 0
    finishes and says so; ps 0 ends the run in order at once, and worker 1's
    later steps do nothing (should_stop). Without the LEAVE, worker 1 would
    wait restart-wait-ms (60 s) for worker 0 and the run would abort."""
    p = subprocess.run([QUORUM, "launch", "--ps", "2", "--workers", "2", "--mode", "sync",
                        "--", sys.executable, UNEVEN], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    found = {r["task"]: r for r in map(json.loads, [l for l in p.stdout.splitlines()
                                                     if l.startswith("{")])}
    assert sorted(found) == [0, 1], p.stdout + p.stderr[-3000:]
    assert found[0]["calls"] == 10 and not found[0]["should_stop"], found
    assert found[1]["calls"] == 20 and found[1]["should_stop"], found
    assert found[1]["global_step"] == 10, found  # 10 steps of 2 gradients, then the end
    assert ("worker 0 finished, and the 1 still training cannot make a step of 2 gradients"
            in p.stderr), p.stderr[-3000:]
    assert "restart-wait-ms" not in p.stderr, p.stderr[-3000:]


def test_workers_finished_stop_the_ps_tasks(tmp_path):  # type: ignore[no-untyped-def]
    """No launcher (an orchestrator starts each task): async workers that
    finish say so, and the ps tasks then stop by themselves with status 0,
    though no step limit was set and no one sent STOP."""
    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    ps_hosts = ["127.0.0.1:%d" % port() for _ in range(2)]
    worker_hosts = ["127.0.0.1:%d" % port() for _ in range(2)]
    spec = ["--ps_hosts", ",".join(ps_hosts), "--worker_hosts", ",".join(worker_hosts),
            "--restart-wait-ms", "60000"]
    ps = [subprocess.Popen([QUORUM, "ps"] + spec + ["--job_name", "ps", "--task_index",
                                                    str(i)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
          for i in range(2)]
    try:
        workers = []
        for i in range(2):
            env = dict(os.environ, TF_CONFIG=json.dumps({
                "cluster": {"ps": ps_hosts, "worker": worker_hosts},
                "task": {"type": "worker", "index": i}}))
            env.pop("QUORUM_OPTIONS", None)
            workers.append(subprocess.Popen([sys.executable, UNEVEN], env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            text=True))
        for w in workers:
            out, err = w.communicate(timeout=120)
            assert w.returncode == 0, err[-3000:]
            assert json.loads(out.splitlines()[-1])["should_stop"] is False, out
        errs = [p.communicate(timeout=30)[1] for p in ps]
        for i, p in enumerate(ps):
            assert p.returncode == 0, "ps %d: %s" % (i, errs[i][-3000:])
        assert "every worker has finished" in errs[0], errs[0][-3000:]
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.wait()


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

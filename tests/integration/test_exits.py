"""test_exits.py - how every task of a hand-started cluster ends after a
fault (docs/SYNC.md, "How a job ends"): its exit status, and its last line
of stderr, which must say what happened to the job and why, so that an
orchestrator never counts a pod of a failed job as succeeded.

  ps_lost_sync    sync, 2 ps and 3 workers: ps 1 SIGKILLed for good. ps 0
                  aborts the job after restart-wait-ms; every task (ps 0 and
                  every worker, those waiting for a token included) exits 1
                  and its last line is "job aborted: ps 1 (...) ..."
  ps_lost_async   the same in async mode
  worker_lost     sync with R = N and no restarts: a worker SIGKILLed, at
                  three moments of the run (tests the one outcome of
                  docs/SYNC.md: the survivors never take its place in a
                  step); every other task exits 1 and its last line is "job
                  aborted: ... worker 2 ..."; both ps tasks exit 1
  restart_digest  sync with R = N and --init-tokens 0: worker 2, and the chief,
                  killed and restarted by launch --max-restarts at several
                  moments: the params_digest of a run nothing killed
Usage: test_exits.py QUORUM_BINARY CASE"""

import os
import signal
import sys
import time

from qrtest import Cluster, Proc, last_json, launch_child_pid

quorum, case = sys.argv[1], sys.argv[2]


def ends_of(c, timeout):
    """Wait for every task of cluster c still running; {(job, i): (status,
    last line)}."""
    deadline = time.time() + timeout
    out = {}
    for key in list(c.tasks):
        rc, _ = c.wait(key[0], key[1], max(1, deadline - time.time()))
        out[key] = (rc, c.last_line(*key))
    return out


def check_ends(ends, status, *words):
    """Every task ended with `status` and a last line holding every word."""
    for key, (rc, line) in sorted(ends.items()):
        assert rc == status and all(w in line for w in words), \
            "%s %d: exit %s, last line %r (expected exit %d and %r)" % (
                key[0], key[1], rc, line, status, words)


def ps_lost(mode):
    c = Cluster(quorum, 2, 3, ["--mode", mode, "--data", "digits", "--steps", "10000000",
                               "--restart-wait-ms", "2000", "--quiet"], prefix="qr-exits-")
    try:
        c.start_all()
        c.wait_log("worker", 2, "connected to ps 1", 30)
        time.sleep(1.0)  # the run is going: some workers wait for a token
        c.kill("ps", 1)
        t0 = time.time()
        ends = ends_of(c, 60)
        check_ends(ends, 1, "job aborted: ps 1 (unix:%s/ps1.sock)" % c.dir)
        print("PASS: %s, ps 1 lost: every task exited 1 within %.1f s, its last line naming "
              "the abort and ps 1: %s" % (mode, time.time() - t0, ends[("worker", 1)][1]))
    finally:
        c.close()


def worker_lost():
    # Worker 0 sleeps 40 ms a step, so workers 1 and 2 spend most of each
    # step waiting for its gradient: a kill lands there, between worker 2's
    # gradient and its token, where its token was left to the survivors.
    for delay in (0.3, 1.0, 2.0):
        c = Cluster(quorum, 2, 3, ["--mode", "sync", "--data", "digits", "--steps", "10000000",
                                   "--restart-wait-ms", "2000", "--slow-worker", "0:40",
                                   "--quiet"], prefix="qr-exits-")
        try:
            c.start_all()
            c.wait_log("worker", 2, "connected to ps 1", 30)
            time.sleep(delay)
            c.kill("worker", 2)
            t0 = time.time()
            ends = ends_of(c, 60)
            check_ends(ends, 1, "job aborted: synchronous training: worker 2 left")
            print("PASS: worker 2 killed %.1f s into the run: every other task exited 1 within "
                  "%.1f s: %s" % (delay, time.time() - t0, ends[("ps", 1)][1]))
        finally:
            c.close()


def restart_digest():
    # Lockstep: a worker or the chief killed and restarted by --max-restarts
    # rejoins without changing a step: the digest of a run nothing killed.
    # A slow worker keeps the victim waiting for its token most of the
    # time, where its restarted self used to take a token left for it and
    # add a second gradient to a step.
    base = ["--ps", "2", "--workers", "3", "--mode", "sync", "--init-tokens", "0", "--data",
            "digits", "--steps", "800", "--seed", "5", "--json", "--quiet"]
    rc, out, err = Proc([quorum, "launch"] + base + ["--slow-worker", "1:10"]).wait(300)
    assert rc == 0, err[-3000:]
    whole = last_json(out)["params_digest"]
    for victim, slow in ((2, "1:10"), (0, "1:10"), (2, "0:10")):
        for delay in (0.5, 1.5):
            p = Proc([quorum, "launch"] + base + ["--slow-worker", slow, "--max-restarts", "1"])
            pid = launch_child_pid(p, "worker", victim)
            time.sleep(delay)
            os.kill(pid, signal.SIGKILL)
            rc, out, err = p.wait(300)
            assert rc == 0 and "restarting it" in err, err[-3000:]
            s = last_json(out)
            assert s["params_digest"] == whole, (victim, delay, s, whole)
    print("PASS: worker 2 and the chief killed and restarted at six moments: every run ended "
          "with the digest of a run nothing killed (%s)" % whole)


if case == "ps_lost_sync":
    ps_lost("sync")
elif case == "ps_lost_async":
    ps_lost("async")
elif case == "worker_lost":
    worker_lost()
elif case == "restart_digest":
    restart_digest()
else:
    sys.exit("unknown case " + case)

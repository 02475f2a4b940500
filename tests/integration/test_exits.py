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
  chief_lost_async  async, 2 ps and 3 workers: the chief SIGKILLed for good,
                  mid-run, and in a run the others finish first (they then
                  wait for the chief to end it): every other task exits 3
                  after restart-wait-ms, its last line "job ended without
                  its chief: worker 0 (...) was lost at global step N and not
                  restarted within restart-wait-ms (...); nobody evaluated
                  the model ..."
  chief_lost_sync the same in sync mode with a backup worker (R = 2 of 3), where
                  the others could go on without the chief; with R = N they
                  cannot: the run aborts naming it (exit 1), worker_lost's
                  outcome
  chief_back      async, and sync with R = 2 of 3: the chief SIGKILLed and
                  started again by hand within restart-wait-ms: every task
                  exits 0 and the chief evaluates the model
  chief_lost_launch  under quorum launch without --max-restarts: launch
                  exits 1 at once, naming the killed chief
Usage: test_exits.py QUORUM_BINARY CASE"""

import os
import re
import signal
import sys
import time

from qrtest import Cluster, Proc, last_json, launch_child_pid

quorum, case = sys.argv[1], sys.argv[2]


def hand_cluster(nps, nworkers, opts):
    return Cluster(quorum, nps, nworkers, opts, prefix="qr-exits-")


def check_ends(ends, status, *words):
    """Every task ended with `status` and a last line holding every word."""
    for key, (rc, line, _) in sorted(ends.items()):
        assert rc == status and all(w in line for w in words), \
            "%s %d: exit %s, last line %r (expected exit %d and %r)" % (
                key[0], key[1], rc, line, status, words)


def ps_lost(mode):
    c = hand_cluster(2, 3, ["--mode", mode, "--data", "digits", "--steps", "10000000",
                       "--restart-wait-ms", "2000", "--quiet"])
    try:
        c.start_all()
        c.wait_log("worker", 2, "connected to ps 1", 30)
        time.sleep(1.0)  # the run is going: some workers wait for a token
        c.kill("ps", 1)
        t0 = time.time()
        ends = c.ends(60)
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
        c = hand_cluster(2, 3, ["--mode", "sync", "--data", "digits", "--steps", "10000000",
                           "--restart-wait-ms", "2000", "--slow-worker", "0:40", "--quiet"])
        try:
            c.start_all()
            c.wait_log("worker", 2, "connected to ps 1", 30)
            time.sleep(delay)
            c.kill("worker", 2)
            t0 = time.time()
            ends = c.ends(60)
            check_ends(ends, 1, "job aborted: synchronous training: worker 2 left")
            print("PASS: worker 2 killed %.1f s into the run: every other task exited 1 within "
                  "%.1f s: %s" % (delay, time.time() - t0, ends[("ps", 1)][1]))
        finally:
            c.close()


CHIEF_LOST = 3  # a task's exit status when the job ended without its chief (tools/quorum.c)


def chief_lost(mode, extra, steps, wait_ms, aborts=False):
    """The chief SIGKILLed for good: every other task exits 3, its last line
    saying the job ended without its chief and nobody evaluated the model;
    the global step ps 0 reports then. aborts: sync with R = N, where the
    others cannot go on: they exit 1, the run aborted naming the chief as
    any worker a step needs (worker_lost)."""
    c = hand_cluster(2, 3, ["--mode", mode, "--data", "digits", "--steps", str(steps),
                            "--restart-wait-ms", str(wait_ms), "--heartbeat-ms", "200",
                            "--heartbeat-timeout-ms", "1000", "--quiet"] + extra)
    try:
        c.start_all()
        c.wait_log("worker", 2, "connected to ps 1", 30)
        time.sleep(0.5)  # the run is going
        c.kill("worker", 0)
        t0 = time.time()
        ends = c.ends(60)
        took = time.time() - t0
        assert wait_ms / 1e3 - 0.5 < took < wait_ms / 1e3 + 20, took
        if aborts:
            check_ends(ends, 1, "job aborted: synchronous training: worker 0 left")
            print("PASS: sync with R = N, the chief killed for good: every other task exited 1 "
                  "%.1f s later: %s" % (took, ends[("worker", 1)][1][:160]))
            return None
        check_ends(ends, CHIEF_LOST, "job ended without its chief: worker 0 (unix:%s/w0.sock) "
                   "was lost at global step" % c.dir, "not restarted within restart-wait-ms "
                   "(%d ms); nobody evaluated the model" % wait_ms)
        # Killed, its sockets closed at once: lost, never "hung" (its
        # heartbeat clock stops with its last connection).
        assert "worker 0 sent no heartbeat" not in c.log("ps", 0), c.log("ps", 0)[-3000:]
        step = int(re.search(r"the run was at global step (\d+)", ends[("ps", 0)][1]).group(1))
        print("PASS: %s %s, the chief killed for good: every other task exited %d %.1f s later "
              "(restart-wait-ms %d) at global step %d of %d: %s" % (
                  mode, " ".join(extra), CHIEF_LOST, took, wait_ms, step, steps,
                  ends[("worker", 1)][1]))
        return step
    finally:
        c.close()


def chief_back(mode, extra):
    """The chief SIGKILLed and started again by hand within restart-wait-ms:
    the run ends as one nothing killed, every task with exit 0, the chief
    with its evaluation."""
    c = hand_cluster(2, 3, ["--mode", mode, "--data", "digits", "--steps", "4000",
                            "--restart-wait-ms", "10000", "--heartbeat-ms", "200",
                            "--heartbeat-timeout-ms", "1000", "--json", "--quiet"] + extra)
    try:
        c.start_all()
        c.wait_log("worker", 2, "connected to ps 1", 30)
        time.sleep(0.5)
        c.kill("worker", 0)
        time.sleep(1.0)
        c.start("worker", 0)
        ends = c.ends(90)
        for key, (rc, line, _) in sorted(ends.items()):
            assert rc == 0, "%s %d: exit %s, last line %r" % (key[0], key[1], rc, line)
        summary = last_json(ends[("worker", 0)][2])
        assert summary["global_step"] >= 4000 and summary["test_accuracy"] > 0.5, summary
        assert "the chief (worker 0) is back" in c.log("ps", 0), c.log("ps", 0)[-3000:]
        print("PASS: %s %s, the chief killed and started again by hand within restart-wait-ms: "
              "every task exited 0, the chief evaluated (accuracy %.3f at step %d)" % (
                  mode, " ".join(extra), summary["test_accuracy"], summary["global_step"]))
    finally:
        c.close()


def chief_lost_launch():
    """Under launch without --max-restarts a killed chief fails the run at
    once: launch exits 1 naming it (README, exit statuses)."""
    p = Proc([quorum, "launch", "--ps", "2", "--workers", "3", "--data", "digits", "--steps",
              "10000000", "--quiet"])
    pid = launch_child_pid(p, "worker", 0)
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    rc, _, err = p.wait(60)
    said = "quorum launch: worker 0 (pid %d) was killed by signal 9 (Killed): stopping the " \
           "other tasks" % pid
    assert rc == 1 and said in err, (rc, err[-3000:])
    print("PASS: launch, the chief killed: exit 1 and %r" % said)


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
elif case == "chief_lost_async":
    # Killed mid-run: the others are still training when ps 0 gives up on
    # the chief. Then a run short enough that they do every step first and
    # wait for the chief's end of the run (on a machine this slow it may
    # not be: said, not failed).
    chief_lost("async", [], 10000000, 2000)
    step = chief_lost("async", [], 6000, 8000)
    if step < 6000:
        print("note: the survivors had not done their 6000 steps within restart-wait-ms")
elif case == "chief_lost_sync":
    chief_lost("sync", ["--replicas-to-aggregate", "2"], 10000000, 2000)
    chief_lost("sync", [], 10000000, 2000, aborts=True)
elif case == "chief_back":
    chief_back("async", [])
    chief_back("sync", ["--replicas-to-aggregate", "2"])
elif case == "chief_lost_launch":
    chief_lost_launch()
else:
    sys.exit("unknown case " + case)

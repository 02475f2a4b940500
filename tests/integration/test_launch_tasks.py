"""test_launch_tasks.py - what `quorum launch` says about the tasks it
started:
  many        120 workers (their host list is over 5,000 bytes) all take
              part: synchronous replicas with R = N = 120 make every step
              wait for every one of them, and each is in every quorum
  lost        a worker killed in an async run: training goes on, and the
              exit status (3) and the last line name it
  needed      a worker killed in a sync run with R = N: launch does not say
              training goes on; it says a step that waits for the worker
              waits up to sync-timeout-ms for a restart, then the run aborts
  hung_chief  the chief SIGSTOPped under --max-restarts 1: ps 0 names it
              hung, launch kills and restarts it (a hung chief would end
              the job unevaluated), it rejoins and the run ends well
  straggler   a worker still running after the run ended (SIGSTOPped) is
              stopped within a bounded time and named (exit 3)
  late        a worker that starts only after the run has done its steps
              (it never reaches ps 0) is stopped and named, but the run
              succeeded (exit 0)
  orphaned    a launcher killed outright leaves no task and no socket
              directory behind
  sigterm     a worker stopped by SIGTERM says so before it goes
  restart_worker  --max-restarts: a worker killed in a sync run with R = N
              is started again, rejoins, and the run finishes (exit 0)
  restart_chief   the chief killed in an async run is started again and does
              not re-initialize the variables (each is created once)
  restart_ps  a ps killed in a sync run with --init-tokens 0 is restarted
              alone and restores its newest checkpoint; ps 0 and the workers
              roll back to it in place: the run finishes with the
              params_digest of a run nothing killed
  hung        a SIGSTOPped worker (its connections open, silent) is caught by
              its missing heartbeats within heartbeat-timeout-ms and treated
              as lost, so a bounded-staleness run goes on without it (with
              heartbeats off the others wait for it forever)
  hung_ps     a ps SIGSTOPped in a sync run under --max-restarts 1: ps 0
              names it hung within heartbeat-timeout-ms, launch kills and
              restarts it (and nothing else), the cluster rolls back once,
              and the run ends with the params_digest of a run nothing
              stopped
  rollbacks_once  ps 1 SIGKILLed four times in one sync run (--max-restarts
              4): each restart is one rollback (the chief's JSON rollbacks
              == 4), ps 1 never rolls back a second time for its own restart
  ps_after_end  ps 1 SIGSTOPped through the end of a run (--max-restarts 1):
              once continued it fences itself and exits 1 after ps 0 has
              stopped the cluster in order; launch does not restart it (a
              new run of it would wait for the gone ps 0 without end, and
              launch with it: a soak hang) and ends with 3 naming it
  hosts       a host list over 4 KiB reaches quorum ps and worker whole (its
              301st address is refused by name); a TMPDIR too long for
              socket paths is refused by launch, once
Usage: test_launch_tasks.py QUORUM_BINARY CASE"""

import os
import shutil
import signal
import sys
import tempfile
import time

from qrtest import Proc, last_json, launch_child_pid, wait_catches, wait_loop_turned

quorum, case = sys.argv[1], sys.argv[2]


def signal_worker_mid_run(args, index, sig, env=None, job="worker"):
    """Start `quorum launch ARGS`, and a second into the run send task
    `index` of `job` the signal; return (the launcher, the task's pid)."""
    p = Proc([quorum, "launch"] + args, env=env)
    pid = launch_child_pid(p, job, index)
    time.sleep(1.0)
    assert p.alive(), "the run ended before the signal"
    if sig:
        os.kill(pid, sig)
    return p, pid


if case == "many":
    n, steps = 120, 3
    t0 = time.time()
    rc, out, err = Proc([quorum, "launch", "--ps", "1", "--workers", str(n), "--mode", "sync",
                         "--model", "softmax", "--data", "digits", "--batch-size", "8",
                         "--steps", str(steps), "--json", "--quiet"]).wait(400)
    assert rc == 0, "launch of %d workers exited %d:\n%s" % (n, rc, err[-3000:])
    hosts = [l for l in err.splitlines() if l.startswith("quorum launch: 1 ps")]
    assert hosts and "and %d workers" % n in hosts[0], err[:2000]
    s = last_json(out)
    assert s["global_step"] == steps, s
    in_quorum = s["sync"]["in_quorum"]
    assert in_quorum == [steps] * n, in_quorum
    print("PASS: %d workers, every one in each of the %d quorums (%.1f s)" %
          (n, steps, time.time() - t0))

elif case == "lost":
    p, victim = signal_worker_mid_run(["--ps", "1", "--workers", "3", "--data", "digits",
                                       "--steps", "6000", "--json", "--quiet"], 2,
                                      signal.SIGKILL)
    rc, out, err = p.wait(300)
    assert rc == 3, "launch exited %d after a worker was killed:\n%s" % (rc, err[-3000:])
    assert "worker 2 (pid %d) was killed by signal 9" % victim in err, err[-2000:]
    assert "training goes on without it" in err, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last == "quorum launch: training finished, but 1 of 4 tasks did not end well: " \
        "worker 2", last
    assert last_json(out)["global_step"] >= 6000
    # A run where nothing fails ends with 0.
    rc, out, err = Proc([quorum, "launch", "--ps", "1", "--workers", "2", "--data", "digits",
                         "--steps", "50", "--json", "--quiet"]).wait(120)
    assert rc == 0, err[-2000:]
    assert "did not end well" not in err
    print("PASS: a lost worker makes the exit status 3 and is named")

elif case == "needed":
    # Tokens are not tied to workers: the survivor may take up the lost
    # one's share and finish, or a step waits and the run aborts. Either
    # way launch must not promise that training goes on.
    p, victim = signal_worker_mid_run(["--ps", "1", "--workers", "2", "--mode", "sync",
                                       "--data", "digits", "--steps", "6000",
                                       "--restart-wait-ms", "2000", "--json", "--quiet"], 1,
                                      signal.SIGKILL)
    rc, out, err = p.wait(120)
    assert rc in (1, 3), "launch exited %d:\n%s" % (rc, err[-3000:])
    lost = [l for l in err.splitlines() if "worker 1 (pid %d) was killed" % victim in l]
    assert lost, err[-3000:]
    assert "training goes on without it" not in lost[0], lost[0]
    assert "a step needs 2 gradients" in lost[0] and "1 of 2 workers are left" in lost[0], lost[0]
    assert "waits up to restart-wait-ms (2000 ms) for a restart" in lost[0], lost[0]
    if rc == 1:  # the step waited: it says why, naming the worker, not after ten minutes
        assert "worker 1 left" in err and "restart-wait-ms (2000 ms)" in err, err[-3000:]
    print("PASS: with R = N, launch says the step waits for the lost worker: " + lost[0])

elif case == "restart_worker":
    p, victim = signal_worker_mid_run(["--ps", "1", "--workers", "2", "--mode", "sync",
                                       "--data", "digits", "--steps", "6000",
                                       "--max-restarts", "1", "--json", "--quiet"], 1,
                                      signal.SIGKILL)
    rc, out, err = p.wait(300)
    assert rc == 0, "launch exited %d:\n%s" % (rc, err[-3000:])
    assert "worker 1 (pid %d) was killed by signal 9 (Killed); restarting it (restart 1 of 1)" \
        % victim in err, err[-3000:]
    s = last_json(out)
    assert s["global_step"] == 6000, s
    print("PASS: a killed worker is restarted, rejoins, and the run ends well")

elif case == "restart_chief":
    env = dict(os.environ, QUORUM_LOG="debug")
    p, victim = signal_worker_mid_run(["--ps", "1", "--workers", "2", "--data", "digits",
                                       "--steps", "8000", "--max-restarts", "1", "--json",
                                       "--quiet"], 0, signal.SIGKILL, env=env)
    rc, out, err = p.wait(300)
    assert rc == 0, "launch exited %d:\n%s" % (rc, err[-3000:])
    assert "worker 0 (pid %d) was killed by signal 9 (Killed); restarting it" % victim in err, \
        err[-3000:]
    created = [l for l in err.splitlines() if "created variable 'layer0/weights'" in l]
    assert len(created) == 1, created  # the restarted chief kept what the ps held
    s = last_json(out)
    assert s["global_step"] >= 8000 and s["test_accuracy"] > 0.9, s
    print("PASS: a restarted chief rejoins without re-initializing (accuracy %.4f)"
          % s["test_accuracy"])

elif case == "restart_ps":
    base = ["--ps", "2", "--workers", "2", "--mode", "sync", "--init-tokens", "0",
            "--data", "digits", "--steps", "4000", "--json", "--quiet"]
    rc, out, err = Proc([quorum, "launch"] + base).wait(300)
    assert rc == 0, err[-3000:]
    whole = last_json(out)
    d = tempfile.mkdtemp(prefix="qr-restart-ps-")
    try:
        p, victim = signal_worker_mid_run(base + ["--checkpoint-dir", d, "--checkpoint-steps",
                                                  "100", "--max-restarts", "1"], 1,
                                          signal.SIGKILL, job="ps")
        rc, out, err = p.wait(300)
        assert rc == 0, "launch exited %d:\n%s" % (rc, err[-3000:])
        assert "ps 1 (pid %d) was killed by signal 9 (Killed); restarting it" % victim \
            in err, err[-3000:]
        # ps 1 alone restarts and restores; ps 0 rolls back to the same
        # step in place, and so does the new ps 1 after it (rollback.c).
        restored = [l for l in err.splitlines() if "restored" in l and "global step" in l]
        steps = set(l.rsplit("(", 1)[1] for l in restored)
        assert len(restored) >= 2 and len(steps) == 1, restored
        assert any("[ps 0 pid" in l for l in restored), restored
        assert "was restarted: rolling back to the checkpoint of step" in err, err[-3000:]
        s = last_json(out)
        assert s["global_step"] == 4000, s
        assert s["params_digest"] == whole["params_digest"], (s["params_digest"],
                                                              whole["params_digest"])
        s = last_json(out)
        assert s["rollbacks"] >= 1, s
        print("PASS: a killed ps rolls the cluster back to %s; it ends with the digest of a "
              "run nothing killed (%s)" % (restored[0].rsplit("(", 1)[1].rstrip(")"),
                                          whole["params_digest"]))
    finally:
        shutil.rmtree(d, ignore_errors=True)

elif case == "hung_ps":
    base = ["--ps", "2", "--workers", "2", "--mode", "sync", "--init-tokens", "0",
            "--data", "digits", "--steps", "6000", "--json", "--quiet"]
    rc, out, err = Proc([quorum, "launch"] + base).wait(300)
    assert rc == 0, err[-3000:]
    whole = last_json(out)
    d = tempfile.mkdtemp(prefix="qr-hung-ps-")
    try:
        p, victim = signal_worker_mid_run(base + ["--checkpoint-dir", d, "--checkpoint-steps",
                                                  "100", "--max-restarts", "1",
                                                  "--heartbeat-timeout-ms", "2000"], 1,
                                          signal.SIGSTOP, job="ps")
        rc, out, err = p.wait(300)
        assert rc == 0, "launch exited %d:\n%s" % (rc, err[-3000:])
        hung = [l for l in err.splitlines() if "[ps 0 pid" in l and "ps 1 (" in l and
                "answered nothing for" in l]
        assert hung and "hung or stopped" in hung[0], err[-3000:]
        silent = int(hung[0].split("answered nothing for ")[1].split(" ms")[0])
        assert 2000 <= silent < 4000, hung[0]
        assert "quorum launch: ps 1 (pid %d) is hung" % victim in err, err[-3000:]
        restarts = [l for l in err.splitlines() if "restarting it (restart" in l]
        assert len(restarts) == 1 and restarts[0].startswith(
            "quorum launch: ps 1 (pid %d) was hung (" % victim), restarts
        assert not os.path.exists("/proc/%d" % victim) or \
            open("/proc/%d/stat" % victim).read().split()[2] == "Z", "the hung ps is left"
        s = last_json(out)
        assert s["global_step"] == 6000 and s["rollbacks"] == 1, s
        assert s["params_digest"] == whole["params_digest"], (s["params_digest"],
                                                              whole["params_digest"])
        print("PASS: a SIGSTOPped ps is named after %d ms of silence, killed and restarted "
              "alone; one rollback, the digest of a run nothing stopped (%s)"
              % (silent, whole["params_digest"]))
    finally:
        shutil.rmtree(d, ignore_errors=True)

elif case == "rollbacks_once":
    d = tempfile.mkdtemp(prefix="qr-rollbacks-")
    kills = 4
    try:
        p, victim = signal_worker_mid_run(["--ps", "2", "--workers", "2", "--mode", "sync",
                                           "--data", "digits", "--steps", "20000",
                                           "--checkpoint-dir", d, "--checkpoint-steps", "50",
                                           "--max-restarts", str(kills), "--json", "--quiet"],
                                          1, None, job="ps")
        pids = []
        for k in range(kills):
            pid = launch_child_pid(p, "ps", 1)
            while pid in pids:  # the restarted one
                time.sleep(0.1)
                pid = launch_child_pid(p, "ps", 1)
            time.sleep(1.5)  # trained past a checkpoint again
            assert p.alive(), "the run ended before kill %d" % (k + 1)
            os.kill(pid, signal.SIGKILL)
            pids.append(pid)
        rc, out, err = p.wait(300)
        assert rc == 0, "launch exited %d:\n%s" % (rc, err[-3000:])
        restarts = [l for l in err.splitlines() if "restarting it (restart" in l]
        assert len(restarts) == kills, (restarts, err[-3000:])
        # ps 1 follows the rollback its restart caused, never making a
        # second one (issue 28, item 7: a restarted chief's CREATE reached it
        # before ps 0's rolled-back run did, and counted as a change).
        ps1_rollbacks = [l for l in err.splitlines() if "[ps 1 pid" in l and "rolling back" in l]
        assert not ps1_rollbacks, (ps1_rollbacks, err[-3000:])
        s = last_json(out)
        assert s["rollbacks"] == kills, (s["rollbacks"], err[-3000:])
        print("PASS: %d restarts of ps 1, %d rollbacks" % (kills, s["rollbacks"]))
    finally:
        shutil.rmtree(d, ignore_errors=True)

elif case == "ps_after_end":
    d = tempfile.mkdtemp(prefix="qr-after-end-")
    try:
        # The worker is a program that ends once ps 1 is stopped (the test
        # makes a file); launch then stops the ps tasks (SIGTERM), ps 0
        # first to end, ps 1 being stopped.
        go = os.path.join(d, "go")
        p = Proc([quorum, "launch", "--ps", "2", "--workers", "1", "--checkpoint-dir", d,
                  "--max-restarts", "1", "--heartbeat-timeout-ms", "3000", "--linger-ms", "300",
                  "--", "sh", "-c", "while [ ! -e %s ]; do sleep 0.05; done" % go])
        ps0, ps1 = launch_child_pid(p, "ps", 0), launch_child_pid(p, "ps", 1)
        wait_catches(ps1, signal.SIGTERM)  # else launch's SIGTERM would kill it outright
        # A ps stopped before its loop first turned has no clock to find its
        # own stall by: it would take launch's SIGTERM and end well (the
        # sanitizer build's slow start did that in CI).
        wait_loop_turned(ps1)
        os.kill(ps1, signal.SIGSTOP)
        stopped = time.time()
        open(go, "w").close()

        def ended(pid):
            try:
                return open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0] == "Z"
            except OSError:
                return True
        while not ended(ps0):
            assert time.time() - stopped < 60, "ps 0 did not end"
            time.sleep(0.05)
        time.sleep(max(0.0, 3.5 - (time.time() - stopped)))  # past heartbeat-timeout-ms
        os.kill(ps1, signal.SIGCONT)
        rc, out, err = p.wait(60)
        assert "restarting it" not in err, err[-3000:]
        assert "ps 1 (pid %d) exited with status 1 after ps 0 had stopped the cluster in order: " \
            "training is over; not restarted" % ps1 in err, err[-3000:]
        assert rc == 3, "launch exited %d:\n%s" % (rc, err[-3000:])
        last = err.strip().splitlines()[-1]
        assert last.endswith("did not end well: ps 1"), last
        print("PASS: a ps failing after ps 0 stopped the cluster is not restarted; launch "
              "ends with 3 naming it")
    finally:
        shutil.rmtree(d, ignore_errors=True)

elif case == "hung":
    p, stopped = signal_worker_mid_run(["--ps", "1", "--workers", "2", "--data", "digits",
                                        "--steps", "12000", "--max-staleness", "2",
                                        "--heartbeat-timeout-ms", "2000", "--json",
                                        "--quiet"], 1, signal.SIGSTOP)
    t0 = time.time()
    rc, out, err = p.wait(300)
    assert rc == 3, "launch exited %d:\n%s" % (rc, err[-3000:])
    hung = [l for l in err.splitlines() if "worker 1 sent no heartbeat for" in l]
    assert hung and "treated as lost" in hung[0], err[-3000:]
    silent = int(hung[0].split("for ")[1].split(" ms")[0])
    assert 2000 <= silent < 4000, hung[0]
    assert last_json(out)["global_step"] >= 12000
    assert err.strip().splitlines()[-1].endswith("did not end well: worker 1"), err[-500:]
    print("PASS: a SIGSTOPped worker is caught after %d ms of silence; the run goes on "
          "(%.1f s)" % (silent, time.time() - t0))

elif case == "hung_chief":
    p, chief = signal_worker_mid_run(["--ps", "1", "--workers", "2", "--data", "digits",
                                      "--steps", "20000", "--max-restarts", "1",
                                      "--heartbeat-timeout-ms", "1500", "--json", "--quiet"],
                                     0, signal.SIGSTOP)
    rc, out, err = p.wait(300)
    assert rc == 0, "launch exited %d:\n%s" % (rc, err[-3000:])
    assert "quorum launch: worker 0 (pid %d) is hung: no answer to heartbeats" % chief in err, \
        err[-3000:]
    assert "worker 0 (pid %d) was hung" % chief in err and "restarting it (restart 1 of 1)" \
        in err, err[-3000:]
    s = last_json(out)
    assert s["global_step"] >= 20000 and s["test_accuracy"] > 0.5, s
    print("PASS: a SIGSTOPped chief is named hung, killed and restarted; the run ends well "
          "(accuracy %.3f)" % s["test_accuracy"])

elif case == "straggler":
    p, sleeper = signal_worker_mid_run(["--ps", "1", "--workers", "2", "--data", "digits",
                                        "--steps", "8000", "--linger-ms", "500", "--json",
                                        "--quiet"], 1, signal.SIGSTOP)
    t0 = time.time()
    rc, out, err = p.wait(120)
    waited = time.time() - t0
    assert rc == 3, "launch exited %d:\n%s" % (rc, err[-3000:])
    assert "worker 1 (pid %d) was still running 5000 ms after the run ended: stopping it" \
        % sleeper in err, err[-3000:]
    assert err.strip().splitlines()[-1].endswith("did not end well: worker 1"), err[-500:]
    assert not os.path.exists("/proc/%d" % sleeper) or \
        open("/proc/%d/stat" % sleeper).read().split()[2] == "Z", "the straggler is left"
    print("PASS: a worker still running after the run is stopped and named (%.1f s)" % waited)

elif case == "late":
    # Worker 1 starts only once ps 0's socket is gone (the run has ended),
    # as a pod scheduled late would: it never reaches ps 0.
    wrapper = r"""
import json, os, sys, time
tf = json.loads(os.environ["TF_CONFIG"])
if tf["task"]["index"] == 1:
    sock = tf["cluster"]["ps"][0].split("unix:", 1)[1]
    deadline = time.time() + 60
    while not os.path.exists(sock) and time.time() < deadline:
        time.sleep(0.02)
    while os.path.exists(sock) and time.time() < deadline:
        time.sleep(0.02)
os.execv(sys.argv[1], sys.argv[1:])
"""
    p = Proc([quorum, "launch", "--ps", "1", "--workers", "2", "--transport", "unix", "--",
              sys.executable, "-c", wrapper, quorum, "worker", "--data", "digits", "--steps",
              "30", "--quiet", "--json"])
    rc, out, err = p.wait(120)
    assert rc == 0, "launch exited %d:\n%s" % (rc, err[-3000:])
    late = [l for l in err.splitlines() if "worker 1 (pid" in l and "had not joined" in l]
    assert len(late) == 1 and late[0].endswith("stopping it; not a failure"), err[-3000:]
    assert "did not end well" not in err, err[-3000:]
    assert last_json(out)["global_step"] >= 30
    print("PASS: a worker that came after the run ended is named, not counted: %s" % late[0])

elif case == "hosts":
    # 300 addresses (about 5 KiB), the last one bad: a list cut short would
    # lose it, and the task would start instead of refusing it.
    good = ",".join("127.0.0.1:%d" % (20000 + i) for i in range(300))
    long_list = good + ",127.0.0.1:99999"
    assert len(long_list) > 4096
    for job, flag in (("worker", "--worker_hosts"), ("ps", "--ps_hosts")):
        hosts = {"--ps_hosts": "127.0.0.1:19999", "--worker_hosts": "127.0.0.1:19998"}
        hosts[flag] = long_list
        cmd = [quorum, job, "--job_name", job, "--task_index", "0"]
        for k, v in hosts.items():
            cmd += [k, v]
        rc, out, err = Proc(cmd).wait(30)
        assert rc == 2 and "%s: address 301" % flag in err, (job, rc, err)
    # A TMPDIR too long for Unix socket paths is refused once, by launch,
    # before any task starts, with the way out; nothing is left in it.
    tmp = "/tmp/quorum-test-%d-%s" % (os.getpid(), "d" * 100)
    os.mkdir(tmp)
    try:
        rc, out, err = Proc([quorum, "launch", "--ps", "1", "--workers", "1", "--data",
                             "digits", "--steps", "5"],
                            env=dict(os.environ, TMPDIR=tmp)).wait(60)
        assert rc == 1, (rc, err)
        assert "socket path is" in err and "a shorter TMPDIR, or --transport tcp" in err, err
        assert "quorum ps:" not in err and "quorum worker:" not in err, err
        assert os.listdir(tmp) == [], os.listdir(tmp)
    finally:
        os.rmdir(tmp)
    print("PASS: host lists over 4 KiB are read whole; a long TMPDIR is refused once")

elif case == "orphaned":
    # A launcher killed outright: its tasks stop (they get SIGTERM when it
    # dies) and leave nothing behind, not even the socket directory.
    tmp = tempfile.mkdtemp(prefix="quorum-test-")
    p, _ = signal_worker_mid_run(["--ps", "2", "--workers", "2", "--data", "digits",
                                  "--steps", "100000", "--quiet"], 1, None,
                                 env=dict(os.environ, TMPDIR=tmp))
    children = [int(x) for x in
                open("/proc/%d/task/%d/children" % (p.p.pid, p.p.pid)).read().split()]
    assert len(children) == 4 and os.listdir(tmp), (children, os.listdir(tmp))
    os.kill(p.p.pid, signal.SIGKILL)
    p.wait(30)
    deadline = time.time() + 30
    while time.time() < deadline and (os.listdir(tmp) or any(
            os.path.exists("/proc/%d" % c) and
            open("/proc/%d/stat" % c).read().split()[2] != "Z" for c in children)):
        time.sleep(0.2)
    left = os.listdir(tmp)
    running = [c for c in children if os.path.exists("/proc/%d" % c) and
               open("/proc/%d/stat" % c).read().split()[2] != "Z"]
    for c in running:
        os.kill(c, signal.SIGKILL)
    os.rmdir(tmp) if not left else None
    assert not running, "tasks left running: %s" % running
    assert not left, "left behind in TMPDIR: %s" % left
    print("PASS: a killed launcher leaves no task and no directory behind")

elif case == "sigterm":
    p, victim = signal_worker_mid_run(["--ps", "1", "--workers", "2", "--data", "digits",
                                       "--steps", "6000", "--json", "--quiet"], 1,
                                      signal.SIGTERM)
    rc, out, err = p.wait(300)
    assert "quorum worker 1: stopped by SIGTERM" in err, err[-2000:]
    assert "worker 1 (pid %d) was killed by signal 15" % victim in err, err[-2000:]
    assert rc == 3, err[-2000:]
    print("PASS: a worker stopped by SIGTERM says so")

else:
    sys.exit("unknown case " + case)

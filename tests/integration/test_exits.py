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
import shutil
import signal
import sys
import tempfile
import time

from qrtest import Proc, last_json

quorum, case = sys.argv[1], sys.argv[2]


class Cluster:
    """ps and worker tasks started one by one on Unix sockets in a private
    directory, each with its stderr in a file."""

    def __init__(self, nps, nworkers, opts):
        self.dir = tempfile.mkdtemp(prefix="qr-exits-")
        self.spec = ["--ps_hosts", ",".join("unix:%s/ps%d.sock" % (self.dir, i)
                                            for i in range(nps)),
                     "--worker_hosts", ",".join("unix:%s/w%d.sock" % (self.dir, i)
                                                for i in range(nworkers))]
        self.opts = opts
        self.nps, self.nworkers = nps, nworkers
        self.tasks = {}

    def start_all(self):
        for job, n in (("ps", self.nps), ("worker", self.nworkers)):
            for i in range(n):
                log = open(os.path.join(self.dir, "%s%d.log" % (job, i)), "w")
                p = Proc([quorum, job] + self.spec + ["--job_name", job, "--task_index", str(i)]
                         + self.opts, stderr=log)
                self.tasks[(job, i)] = p

    def log(self, job, i):
        with open(os.path.join(self.dir, "%s%d.log" % (job, i))) as f:
            return f.read()

    def last_line(self, job, i):
        lines = [l for l in self.log(job, i).splitlines() if l.strip()]
        return lines[-1] if lines else ""

    def kill(self, job, i):
        p = self.tasks.pop((job, i))
        os.kill(p.p.pid, signal.SIGKILL)
        p.p.wait()

    def wait_log(self, job, i, text, timeout):
        deadline = time.time() + timeout
        while text not in self.log(job, i):
            assert time.time() < deadline, "timed out waiting for %r in %s %d:\n%s" % (
                text, job, i, self.log(job, i)[-3000:])
            time.sleep(0.05)

    def ends(self, timeout):
        """Wait for every task still running; {(job, i): (status, last line)}."""
        deadline = time.time() + timeout
        out = {}
        for key, p in self.tasks.items():
            rc, _, _ = p.wait(max(1, deadline - time.time()))
            out[key] = (rc, self.last_line(*key))
        return out

    def close(self):
        for p in self.tasks.values():
            p.kill()
        if sys.exc_info()[0] is not None:  # failing: show what every task said
            for name in sorted(os.listdir(self.dir)):
                if name.endswith(".log"):
                    with open(os.path.join(self.dir, name)) as f:
                        print("---- %s\n%s" % (name, f.read()[-2500:]))
        shutil.rmtree(self.dir, ignore_errors=True)


def check_ends(ends, status, *words):
    """Every task ended with `status` and a last line holding every word."""
    for key, (rc, line) in sorted(ends.items()):
        assert rc == status and all(w in line for w in words), \
            "%s %d: exit %s, last line %r (expected exit %d and %r)" % (
                key[0], key[1], rc, line, status, words)


def ps_lost(mode):
    c = Cluster(2, 3, ["--mode", mode, "--data", "digits", "--steps", "10000000",
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
        c = Cluster(2, 3, ["--mode", "sync", "--data", "digits", "--steps", "10000000",
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


def launch_pid(p, job, index):
    """The pid of task `index` of `job` among launch's children."""
    deadline = time.time() + 30
    while time.time() < deadline:
        for pid in open("/proc/%d/task/%d/children" % (p.p.pid, p.p.pid)).read().split():
            try:
                args = open("/proc/%s/cmdline" % pid).read().split("\0")
            except OSError:
                continue
            if len(args) > 1 and args[1] == job and \
                    args[args.index("--task_index") + 1] == str(index):
                return int(pid)
        time.sleep(0.05)
    raise AssertionError("%s %d not found" % (job, index))


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
            pid = launch_pid(p, "worker", victim)
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

"""test_async_modes.py - asynchronous training's modes in real runs:
gradient accumulation, local SGD, bounded staleness (0 = bulk synchronous,
and 2) and the staleness learning-rate scale each train the MLP on digits to
>= 0.95; local SGD's steps follow the learning-rate schedule; under a
staleness bound a SIGKILLed worker holds nobody back, and a
SIGSTOPped one is named in ps 0's stall reports until it goes on.
Usage: test_async_modes.py QUORUM_BINARY"""

import os
import signal
import sys
import time

from qrtest import Proc, last_json

quorum = sys.argv[1]
base = ["launch", "--ps", "2", "--workers", "3", "--data", "digits", "--epochs", "60",
        "--seed", "4", "--json", "--quiet"]
modes = {
    # The ps applies the sum of K gradients: K times the step of one. A step
    # consumes K batches, so K times fewer steps make an epoch.
    "accumulate": ["--accumulate", "4", "--lr", "0.05", "--epochs", "160"],
    "local-sgd": ["--local-steps", "4", "--lr", "0.1", "--epochs", "160"],
    "bulk-synchronous": ["--max-staleness", "0", "--lr", "0.1"],
    "bounded-staleness": ["--max-staleness", "2", "--lr", "0.1"],
    "staleness-lr-scale": ["--staleness-lr-scale", "--lr", "0.1"],
}
for name, extra in modes.items():
    rc, out, err = Proc([quorum] + base + extra).wait(300)
    assert rc == 0, "%s: launch exited %d\n%s" % (name, rc, err[-3000:])
    s = last_json(out)
    counts = s["staleness"]["counts"]
    print("%-19s accuracy %.4f, %d steps, staleness histogram %s" % (
        name, s["test_accuracy"], s["global_step"], counts))
    assert s["test_accuracy"] >= 0.95, (name, s)
    assert sum(counts) > 0
    if name == "bulk-synchronous":
        # Nobody starts step c+1 before everybody finished step c; a push
        # can only miss the other workers' pushes of about one round.
        assert sum(counts[5:]) == 0, counts

# Local SGD follows the learning-rate schedule: the ps adds deltas as they
# come, so the workers decay their local lr by the global step. With a
# schedule that divides lr by 10^6 every 5 steps, learning stops after the
# first few steps (accuracy 0.42-0.61 over seeds 4-6); a worker that
# ignored it reaches 0.97 as in the local-sgd run above.
rc, out, err = Proc([quorum] + base + modes["local-sgd"] + [
    "--lr-decay-rate", "0.000001", "--lr-decay-steps", "5"]).wait(300)
assert rc == 0, err[-3000:]
s = last_json(out)
print("local-sgd, lr decayed away: accuracy %.4f, %d steps" % (s["test_accuracy"], s["global_step"]))
assert s["test_accuracy"] < 0.8, s


def bounded_run_with_worker_1(extra=()):
    """Start a launch under a staleness bound of 1; a second into it,
    return (the launcher, worker 1's pid)."""
    p = Proc([quorum] + base[:-2] + ["--steps", str(steps), "--max-staleness", "1",
                                     "--lr", "0.1", "--json", "--quiet"] + list(extra))
    time.sleep(1.0)
    assert p.alive(), "the run ended within a second"
    for pid in open("/proc/%d/task/%d/children" % (p.p.pid, p.p.pid)).read().split():
        args = open("/proc/%s/cmdline" % pid).read().split("\0")
        if args[1] == "worker" and args[args.index("--task_index") + 1] == "1":
            return p, int(pid)
    raise AssertionError("worker 1 not found")


# A bound of 1 with a worker killed mid-run: the others finish.
steps = 12000
p, victim = bounded_run_with_worker_1()
os.kill(victim, 9)
rc, out, err = p.wait(300)
assert rc == 3, err[-3000:]  # training finished; not every task ended well
assert "worker 1 (pid %d) was killed by signal 9" % victim in err
# Async: the chief stops at its first push that sees the limit reached;
# the others may have pushed in the same moment.
assert last_json(out)["global_step"] >= steps
print("ok: a killed worker holds nobody back")

# A bound of 1 with a worker stopped (SIGSTOP: connected, silent) for 2.5 s:
# the others wait for it, ps 0 says so every stall-report-ms naming it, and
# once it goes on the run finishes.
p, sleeper = bounded_run_with_worker_1(["--stall-report-ms", "500"])
os.kill(sleeper, signal.SIGSTOP)
time.sleep(2.5)
os.kill(sleeper, signal.SIGCONT)
rc, out, err = p.wait(300)
assert rc == 0, err[-3000:]
reports = [l for l in err.splitlines() if "bounded staleness: worker" in l]
assert reports, "no stall report while worker 1 was stopped:\n" + err[-3000:]
assert all("for worker 1 (step" in l for l in reports), reports
assert last_json(out)["global_step"] >= steps
print("ok: %d stall report(s) named the stopped worker, e.g. %s" % (len(reports), reports[0]))
print("PASS: async modes train; a dead worker does not hold a staleness bound; a stalled one "
      "is reported")

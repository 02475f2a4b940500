"""test_replication_ckpt.py - checkpoints with two copies of every shard
(--ps-replicas 2 --checkpoint-dir, docs/REPLICATION.md "Checkpoints",
src/ps/ckpt_coord.c): each shard written once, by the ps that serves it.

Case "failover": `quorum launch --ps 3 --workers 3 --ps-replicas 2
--checkpoint-dir D --max-restarts 1` on digits (Adam), checkpoints every 500
steps, ps 1 SIGKILLed mid-run: exit 0, no rollback; checkpoints written
after the failover (shard 1 then written by ps 2, from its promoted copy)
are complete, `quorum ckpt verify D` passes, and the newest holds every
variable once, on the shard it held before the failover. Then the whole
cluster is started again from D: every ps restores its shard and its
backup the same shard of its primary, and the run ends with every
backup's digest equal to its primary's.
Case "kill_during": the same with a checkpoint always being written
(--checkpoint-steps 1: the next starts as soon as one ends) and ps 2
(whose copy is on ps 0) SIGKILLed: the checkpoint under way is given up
(ps 0 says so), the run goes on and finishes with no rollback, checkpoints
after the failover are complete (shard 2 written by ps 0) and the newest
verifies.

Case "resume": sync, R = N with --init-tokens 0, Adam, two copies: a run
stopped at step 500 (its final checkpoint) and started again on the same
--checkpoint-dir ends with the params_digest of a run never stopped, and
every backup's digest equals its primary's: the backups were restored
from the same files as their primaries. Then the same with a run whose
ps 2 was SIGKILLed (its shard then written by ps 0, from its promoted
copy): resumed from its final checkpoint, it ends with the digest of a
run never stopped.

Usage: test_replication_ckpt.py QUORUM_BINARY failover|kill_during|resume"""

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from qrtest import Proc, ReplicaReport, last_json, launch_child_pid

quorum, case = sys.argv[1], sys.argv[2]
DIGITS = ["--ps", "3", "--workers", "3", "--data", "digits", "--batch-size", "32", "--seed",
          "11", "--lr", "0.1", "--ps-replicas", "2", "--max-restarts", "1"]
WRITTEN = re.compile(r"\[ps 0 pid \d+\] info: checkpoint (\S+) written: global step (\d+)")
TENSOR = re.compile(r"^(\S+)\s+(\d+)\s+(F32|I64)\s", re.M)


def launch_and_kill(args, victim, after, mode="async", ready=None):
    """A launch run with ps `victim` SIGKILLed `after` seconds in (after
    ready() holds, if given: polled up to 120 s): its summary and stderr."""
    p = Proc([quorum, "launch", "--json", "--quiet", "--mode", mode] + args)
    try:
        pid = launch_child_pid(p, "ps", victim)
        deadline = time.time() + 120
        while ready and not ready() and p.alive() and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(after)
        assert p.alive(), "the run ended before ps %d was killed" % victim
        os.kill(pid, signal.SIGKILL)
        rc, out, err = p.wait(300)
    finally:
        p.kill()
    assert rc == 0, "launch %s exited %d\n%s" % (args, rc, err[-4000:])
    s = last_json(out)
    assert s["rollbacks"] == 0 and "rolling back" not in err, (s, err[-3000:])
    assert "quorum launch: ps %d (pid %d) was failed over by ps 0 (view 1)" % (victim, pid) \
        in err, err[-3000:]
    return s, err


def after_failover(err):
    """The checkpoints ps 0 wrote once it had failed a ps over: [(path, step)]."""
    at = err.index("failed over in place")
    return [(m[1], int(m[2])) for m in WRITTEN.finditer(err, at)]


def verify(d):
    v = subprocess.run([quorum, "ckpt", "verify", d], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
    assert v.returncode == 0, "quorum ckpt verify %s exited %d\n%s" % (d, v.returncode, v.stdout)


def placement(d, step):
    """{variable: shard} of the checkpoint at `step`; each variable once."""
    show = subprocess.run([quorum, "ckpt", "show", d, "--step", str(step)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=120)
    assert show.returncode == 0, show.stdout
    where, counters = {}, {}
    for name, shard, _ in TENSOR.findall(show.stdout):
        if name == "global_step" or name.startswith("quorum/"):
            counters.setdefault(name, set()).add(int(shard))
            continue
        assert name not in where, "%s is in the checkpoint of step %d twice\n%s" % (
            name, step, show.stdout)
        where[name] = int(shard)
    assert counters.get("global_step") == {0, 1, 2}, show.stdout  # every shard's file
    return where


def check_copies(err, nps, what):
    """Every shard's backup digest equals its primary's (the ps's last lines)."""
    primary, backup = {}, {}
    for c in ReplicaReport(err, nps).copies:
        (primary if c["own"] else backup)[c["shard"]] = c["digest"]
    assert sorted(primary) == list(range(nps)) and primary == backup, \
        "%s: primaries %s, backups %s\n%s" % (what, primary, backup, err[-3000:])


def failover_case():
    d = tempfile.mkdtemp(prefix="qr-repl-ckpt-")
    try:
        # Adam: a backup restored with its primary's values but not its
        # slots and step (the CREATE's forward) would drift from it.
        adam = ["--optimizer", "adam", "--lr", "0.001"]
        args = DIGITS + adam + ["--steps", "12000", "--checkpoint-dir", d,
                                "--checkpoint-steps", "500"]
        s, err = launch_and_kill(args, 1, 1.0)
        assert s["global_step"] >= 12000, s
        assert "this ps serves ps 1's shard now" in err, err[-3000:]
        before = [(m[1], int(m[2])) for m in WRITTEN.finditer(err[:err.index("failed over in "
                                                                              "place")])]
        after = after_failover(err)
        assert before and after, "checkpoints before the failover %s, after %s\n%s" % (
            before, after, err[-3000:])
        verify(d)
        newest = max(step for _, step in after)
        first = placement(d, before[0][1]) if os.path.isdir(before[0][0]) else None
        where = placement(d, newest)
        if first is not None:  # pruned otherwise (keep-checkpoints)
            assert where == first, "variables moved between shards: %s, then %s" % (first, where)
        assert set(where.values()) == {0, 1, 2}, where
        print("ok: %d checkpoint(s) written after ps 1 failed over (the newest at step %d: %s), "
              "verified" % (len(after), newest, ", ".join(
                  "%s on %d" % kv for kv in sorted(where.items()))))
        # The whole cluster again from the newest checkpoint: both copies
        # of every shard restored from the same file.
        p = Proc([quorum, "launch", "--json", "--quiet", "--mode", "async"] + DIGITS + adam +
                 ["--steps", str(newest + 2000), "--checkpoint-dir", d, "--checkpoint-steps",
                  "500"])
        rc, out, err = p.wait(300)
        assert rc == 0, "the restart exited %d\n%s" % (rc, err[-4000:])
        for k in range(3):
            assert re.search(r"\[ps %d pid \d+\] info: restored the copy of ps %d's shard: .* "
                             r"\(global step %d\)" % (k, (k + 2) % 3, newest), err), err[-3000:]
        check_copies(err, 3, "restarted from step %d" % newest)
        s2 = last_json(out)
        assert s2["rollbacks"] == 0 and s2["global_step"] >= newest + 2000, s2
        print("PASS: failover: checkpoints after the failover complete and verified, every "
              "variable once; a restart from step %d restored both copies of every shard, "
              "equal at the end" % newest)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def kill_during_case():
    # A kill lands inside ps 2's part of a checkpoint about one time in
    # three (fewer under the sanitizers), so up to ten runs, each killing at
    # a random moment once checkpoints are being written.
    for attempt in range(10):
        d = tempfile.mkdtemp(prefix="qr-repl-ckpt-")

        def writing():
            # two checkpoints written: the next is under way (they follow
            # one another), however slow the start (the sanitizer build)
            return sum(n.startswith("ckpt-") for n in os.listdir(d)) >= 2
        try:
            args = DIGITS + ["--steps", "6000", "--checkpoint-dir", d, "--checkpoint-steps", "1"]
            s, err = launch_and_kill(args, 2, random.uniform(0, 0.02), ready=writing)
            assert s["global_step"] >= 6000, s
            lost = re.search(r"\[ps 0 pid \d+\] (warn|error): checkpoint at step (\d+) (given "
                             r"up|not taken): .*(ps 2|link)", err)
            after = after_failover(err)
            assert after, "no checkpoint after ps 2 failed over\n%s" % err[-3000:]
            verify(d)
            newest = max(step for _, step in after)
            where = placement(d, newest)
            assert set(where.values()) == {0, 1, 2}, where
            if not lost:  # the kill fell between two checkpoints: again
                print("note: attempt %d: ps 2 was killed between two checkpoints" % attempt)
                continue
            print("PASS: kill_during: ps 2 killed while the checkpoint of step %s was being "
                  "taken (%s), the run finished without a rollback, %d checkpoint(s) after the "
                  "failover, the newest (step %d) verified, every variable once" % (
                      lost[2], lost[0][:200], len(after), newest))
            return
        finally:
            shutil.rmtree(d, ignore_errors=True)
    sys.exit("FAIL: ps 2 was never killed during a checkpoint in 10 runs")


def resume_case():
    sync = ["--init-tokens", "0", "--ps", "3", "--workers", "3", "--data",
            "digits", "--batch-size", "32", "--seed", "11", "--optimizer", "adam", "--lr",
            "0.001", "--ps-replicas", "2"]
    d = tempfile.mkdtemp(prefix="qr-repl-ckpt-")

    def run(steps, ckpt):
        p = Proc([quorum, "launch", "--json", "--quiet", "--mode", "sync"] + sync +
                 ["--steps", str(steps)] +
                 (["--checkpoint-dir", d] if ckpt else []))
        rc, out, err = p.wait(300)
        assert rc == 0, "launch exited %d\n%s" % (rc, err[-4000:])
        return last_json(out), err

    try:
        whole, _ = run(1000, False)
        half, _ = run(500, True)
        assert half["global_step"] == 500, half
        resumed, err = run(1000, True)
        assert "restored the copy of ps 1's shard" in err, err[-3000:]
        check_copies(err, 3, "resumed")
        assert resumed["params_digest"] == whole["params_digest"], (resumed, whole)
        # A checkpoint written after ps 2 failed over (shard 2 from ps 0's
        # promoted copy, with the copy's own step count) resumes as exactly.
        shutil.rmtree(d)
        killed, err = launch_and_kill(sync + ["--steps", "4000", "--checkpoint-dir", d],
                                      2, 0.8, mode="sync")
        after = after_failover(err)
        assert killed["global_step"] == 4000 and after and after[-1][1] == 4000, \
            (killed, after, err[-3000:])
        verify(d)
        whole2, _ = run(5000, False)
        resumed2, err = run(5000, True)
        check_copies(err, 3, "resumed after a failover")
        assert resumed2["params_digest"] == whole2["params_digest"], (resumed2, whole2)
        print("PASS: resume: a sync run on two copies stopped at step 500 and resumed from its "
              "checkpoint ends with the digest of the run never stopped (%s); one whose last "
              "checkpoint was written after ps 2 failed over (shard 2 from ps 0's copy) "
              "resumed to step 5000 with the digest of a run never stopped (%s); every backup "
              "equal to its primary" % (whole["params_digest"], whole2["params_digest"]))
    finally:
        shutil.rmtree(d, ignore_errors=True)


cases = {"failover": failover_case, "kill_during": kill_during_case, "resume": resume_case}
if case not in cases:
    sys.exit("unknown case %r (%s)" % (case, ", ".join(cases)))
cases[case]()

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

Case "stop_during": the same with ps 2 SIGSTOPped for 1.8 s (heartbeat-
timeout-ms 1000), sync and async: failed over as hung with its link up,
the checkpoint that asked it is given up rather than waited for, and
checkpoints go on after (before, the run could hang at its final one).

Case "resume": sync, R = N with --init-tokens 0, Adam, two copies: a run
stopped at step 500 (its final checkpoint) and started again on the same
--checkpoint-dir ends with the params_digest of a run never stopped, and
every backup's digest equals its primary's: the backups were restored
from the same files as their primaries. Then the same with a run whose
ps 2 was SIGKILLed (its shard then written by ps 0, from its promoted
copy): resumed from its final checkpoint, it ends with the digest of a
run never stopped.

Case "coordinator": ps 0, the coordinator, SIGKILLed with --checkpoint-dir
(docs/REPLICATION.md, "ps 0's coordinator failover"): in sync mode (R =
N, --init-tokens 0, Adam, checkpoints every 250 steps) ps 1 takes over
and writes the checkpoints from then on, the first full; they verify,
and the last, resumed to step 5000, ends with the params_digest of a run
never stopped. In async mode, ps 0 dying during a cut (the fault
QUORUM_TEST_COORDINATOR_DIES_AT_STEP): ps 1 and ps 2 apply the pushes
they held for it, ps 1 writes checkpoints after, and the newest verifies
with every variable once.

Case "both_lost": both copies of a shard lost together (docs/REPLICATION.md,
"Both copies of a shard lost"): `quorum launch --ps 3 --workers 2
--ps-replicas 2 --checkpoint-dir D --checkpoint-steps 200 --max-restarts 2`,
async and then sync, ps 1 and ps 2 SIGKILLed together mid-run (shard 1's
primary and backup), and once more in async with both SIGSTOPped (hung:
launch kills them for the rollback): ps 0 says shard 1 lost both its copies and rolls back to the
checkpoint of a step it wrote, launch restarts both, the run ends with
exit 0 and exactly one rollback, every ps's last view is after the views
of before (never back), and every backup's digest equals its primary's.
Case "both_lost_abort": the same kill without --checkpoint-dir: the run
aborts at once (not after restart-wait-ms) with a message naming shard 1
and why.

Case "coordinator_backup": ps 1 killed and replaced (a BACKUP), then ps 0
killed, with --checkpoint-dir: ps 1's replacement takes over though it
serves no shard of its own and writes the checkpoints (shard 0 alone);
sync ends on the unkilled digest and its last checkpoint resumes to the
digest of a run never stopped; async gives no cut up. Then 4 ps, ps 2
replaced and ps 1 killed: ps 2, a BACKUP serving shard 1, is asked for
it, and no cut is given up.
Case "restored_positions": the workers' data positions of a restored
checkpoint reach the copy of shard 0 (docs/REPLICATION.md, "ps 0's
coordinator failover"): an async launch on 2 ps with two copies writes its
final checkpoint; two ps are then started by hand on it, ps 0 is
SIGKILLed before any worker pushes, ps 1 takes over, and a worker asking
ps 1 where its data is (READY) gets the checkpoint's position, not 0.

Usage: test_replication_ckpt.py QUORUM_BINARY
failover|kill_during|stop_during|resume|coordinator|both_lost|both_lost_abort|
restored_positions|coordinator_backup"""

import os
import json
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

from qrtest import (HELLO, READY, STATS, PS_COPIES, Proc, ReplicaReport, connect, end_launch,
                    frame, free_ports, last_json, launch_child_pid, read_reply, ready_meta,
                    sanitized)

quorum, case = sys.argv[1], sys.argv[2]
DIGITS = ["--ps", "3", "--workers", "3", "--data", "digits", "--batch-size", "32", "--seed",
          "11", "--lr", "0.1", "--ps-replicas", "2", "--max-restarts", "1"]
WRITTEN = re.compile(r"\[ps 0 pid \d+\] info: checkpoint (\S+) written: global step (\d+)")
TENSOR = re.compile(r"^(\S+)\s+(\d+)\s+(F32|I64)\s", re.M)


def launch_and_kill(args, victim, after, mode="async", ready=None, sig=signal.SIGKILL, hold=0):
    """A launch run with ps `victim` SIGKILLed `after` seconds in (after
    ready() holds, if given: polled up to 120 s): its summary and stderr.
    sig SIGSTOP: stopped instead, and continued `hold` seconds later."""
    p = Proc([quorum, "launch", "--json", "--quiet", "--mode", mode] + args)
    try:
        pid = launch_child_pid(p, "ps", victim)
        deadline = time.time() + 120
        while ready and not ready() and p.alive() and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(after)
        assert p.alive(), "the run ended before ps %d was killed" % victim
        os.kill(pid, sig)
        if hold:
            time.sleep(hold)
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:  # launch killed it as hung meanwhile
                pass
        rc, out, err = p.wait(300)
    finally:
        p.kill()
    assert rc == 0, "launch %s exited %d\n%s" % (args, rc, err[-4000:])
    s = last_json(out)
    assert s["rollbacks"] == 0 and "rolling back" not in err, (s, err[-3000:])
    # ps 0 fails the others over; ps 0 itself, ps 1 (taking its role)
    assert "quorum launch: ps %d (pid %d) was failed over by ps %d (view 1)" % (
        victim, pid, 1 if victim == 0 else 0) in err, err[-3000:]
    return s, err


def after_failover(err):
    """The checkpoints ps 0 wrote once it had failed a ps over: [(path, step)]."""
    at = err.index("failed over in place")
    return [(m[1], int(m[2])) for m in WRITTEN.finditer(err, at)]


def verify(d):
    v = subprocess.run([quorum, "ckpt", "verify", d], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
    assert v.returncode == 0, "quorum ckpt verify %s exited %d\n%s" % (d, v.returncode, v.stdout)


def placement(d, step, nps=3):
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
    assert counters.get("global_step") == set(range(nps)), show.stdout  # every shard's file
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
        # Killed once a checkpoint is on disk (a fixed moment came before
        # the first one under the sanitizer build's slower start).
        s, err = launch_and_kill(args, 1, 0.3,
                                 ready=lambda: any(n.startswith("ckpt-") for n in os.listdir(d)))
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


def stop_during_case():
    """ps 2 SIGSTOPped for 1.8 s (heartbeat-timeout-ms 1000) while
    checkpoints are always being written: ps 0 fails it over as hung with
    its link up, and the checkpoint that had asked ps 2 for its shard (or
    for its part of an async cut) is given up. It used to wait for good: a
    dropped link's loss told nobody, so no checkpoint was written after,
    and the final one never ended (the run hung, 1 run in 3 in sync).
    Sync and async; up to 6 runs each, until a stop lands inside ps 2's
    part of a checkpoint."""
    for mode, extra in (("sync", ["--init-tokens", "0", "--steps", "3000"]),
                        ("async", ["--steps", "8000"])):
        for attempt in range(6):
            d = tempfile.mkdtemp(prefix="qr-repl-ckpt-")
            try:
                args = DIGITS + extra + ["--checkpoint-dir", d, "--checkpoint-steps", "1",
                                         "--heartbeat-ms", "200", "--heartbeat-timeout-ms",
                                         "1000"]
                s, err = launch_and_kill(args, 2, random.uniform(0, 0.05), mode=mode,
                                         ready=lambda: sum(n.startswith("ckpt-")
                                                           for n in os.listdir(d)) >= 2,
                                         sig=signal.SIGSTOP, hold=1.8)
                failed_over = err.index("failed over in place")
                lost = re.search(r"\[ps 0 pid \d+\] (warn|error): checkpoint at step (\d+) "
                                 r"(given up|not taken): .*(ps 2|link)", err[failed_over:])
                after = after_failover(err)
                assert after, "no checkpoint after ps 2 failed over\n%s" % err[-3000:]
                verify(d)
                newest = max(step for _, step in after)
                assert set(placement(d, newest).values()) == {0, 1, 2}
                if not lost:
                    print("note: %s: attempt %d: ps 2 was stopped between two checkpoints" % (
                        mode, attempt))
                    continue
                print("ok: %s: ps 2 stopped while the checkpoint of step %s asked it (%s): the "
                      "run finished, %d checkpoint(s) after the failover, the newest (step %d) "
                      "verified, every variable once" % (mode, lost[2], lost[0][:160],
                                                         len(after), newest))
                break
            finally:
                shutil.rmtree(d, ignore_errors=True)
        else:
            # Under the sanitizers a sync step takes most of the time, and
            # the stop often lands in a step, not in a checkpoint (0 of 6 once):
            # every run still ended well; the plain build's run is the check.
            if sanitized(quorum):
                print("note: %s: ps 2 was never stopped during a checkpoint in 6 runs of this "
                      "sanitizer build; each run ended well" % mode)
                continue
            sys.exit("FAIL: %s: ps 2 was never stopped during a checkpoint in 6 runs" % mode)
    print("PASS: stop_during")


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


WRITTEN_BY_1 = re.compile(r"\[ps 1 pid \d+\] info: checkpoint (\S+) written: global step (\d+)")


def coordinator_case():
    """ps 0, the coordinator, SIGKILLed with --checkpoint-dir: ps 1 takes
    the checkpoints over too."""
    sync = ["--init-tokens", "0", "--ps", "3", "--workers", "3", "--data",
            "digits", "--batch-size", "32", "--seed", "11", "--optimizer", "adam", "--lr",
            "0.001", "--ps-replicas", "2", "--checkpoint-steps", "250"]
    d = tempfile.mkdtemp(prefix="qr-repl-ckpt-")

    def run(steps, mode="sync", extra=()):
        p = Proc([quorum, "launch", "--json", "--quiet", "--mode", mode] + sync +
                 ["--steps", str(steps), "--checkpoint-dir", d] + list(extra))
        rc, out, err = p.wait(300)
        assert rc == 0, "launch exited %d\n%s" % (rc, err[-4000:])
        return last_json(out), err

    try:
        # Sync: the checkpoints after the takeover are ps 1's (a full one
        # first, then increments), they verify, and the last resumes to the
        # digest of a run never stopped: its variables and the workers'
        # data positions (which ps 1 learns from their commits) are exact.
        whole, _ = run(5000)
        shutil.rmtree(d)
        killed, err = launch_and_kill(sync + ["--steps", "4000", "--checkpoint-dir", d], 0, 0.8,
                                      mode="sync")
        after = [(m[1], int(m[2])) for m in WRITTEN_BY_1.finditer(err)]
        assert killed["global_step"] == 4000 and after and after[-1][1] == 4000, \
            (killed, after, err[-3000:])
        assert "(full)" in err[err.index(after[0][0]):].split("\n")[0], err[-3000:]
        verify(d)
        resumed, err = run(5000)
        check_copies(err, 3, "resumed after ps 0's failover")
        assert resumed["params_digest"] == whole["params_digest"], (resumed, whole)
        print("ok: sync: ps 0 killed, ps 1 wrote %d checkpoints after taking over (the first "
              "full), they verify, and the last resumed to step 5000 with the digest of a run "
              "never stopped (%s)" % (len(after), whole["params_digest"]))
        # Async: ps 0 dies halfway through a checkpoint's cut, once it has
        # asked every ps to hold (a fault the ps takes from the
        # environment: a random kill lands there one time in four). The
        # other ps hold pushes for it; they apply them once ps 1 takes
        # over, and ps 1 writes checkpoints of its own.
        shutil.rmtree(d)
        p = Proc([quorum, "launch", "--json", "--quiet", "--mode", "async"] + DIGITS +
                 ["--steps", "6000", "--checkpoint-dir", d, "--checkpoint-steps", "500"],
                 env=dict(os.environ, QUORUM_TEST_COORDINATOR_DIES_AT_STEP="2000"))
        rc, out, err = p.wait(300)
        assert rc == 0, err[-4000:]
        s = last_json(out)
        assert s["rollbacks"] == 0 and s["global_step"] >= 6000, (s, err[-3000:])
        assert "every ps asked to hold for the cut at step" in err, err[-3000:]
        for k in (1, 2):
            assert re.search(r"\[ps %d pid \d+\] info: the coordinator that held pushes for a "
                             r"checkpoint's cut is gone: they are applied now" % k, err), \
                err[-3000:]
        after = [(m[1], int(m[2])) for m in WRITTEN_BY_1.finditer(err)]
        assert after, "no checkpoint written by ps 1\n%s" % err[-3000:]
        verify(d)
        newest = max(step for _, step in after)
        assert newest >= 6000 and set(placement(d, newest).values()) == {0, 1, 2}, after
        print("ok: async: ps 0 died during a checkpoint's cut: ps 1 and ps 2 applied the pushes "
              "they held for it once ps 1 took over, %d checkpoints by ps 1 after, the newest "
              "(step %d) verified, every variable once" % (len(after), newest))
        print("PASS: coordinator: ps 0 killed with --checkpoint-dir, sync and async: ps 1 took "
              "the checkpoints over")
    finally:
        shutil.rmtree(d, ignore_errors=True)


BOTH_LOST = re.compile(r"\[ps 0 pid \d+\] warn: shard 1 has lost both its copies: ps 1 \(\S+\) "
                       r"and ps 2 \(\S+\) are lost together \(dead or hung\), which no failover "
                       r"covers: rolling back to (the checkpoint of step (\d+)|a fresh start)")


def kill_both(args, ready, timeout=180, sig=signal.SIGKILL, replaced=False):
    """A launch run with ps 1 and ps 2 sent `sig` together (or, replaced:
    ps 2 as soon as launch has started ps 1's replacement) once ready()
    holds (polled up to 120 s): (exit status, summary lines, stderr, the
    seconds from the kill to the end, their pids)."""
    p = Proc([quorum, "launch", "--json", "--quiet"] + args)
    stopped = None
    try:
        pids = [launch_child_pid(p, "ps", k) for k in (1, 2)]
        deadline = time.time() + 120
        while not ready() and p.alive() and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(random.uniform(0, 0.05))
        assert p.alive(), "the run ended before ps 1 and ps 2 were killed"
        if replaced:
            # ps 2 is stopped before ps 1 dies, so that it cannot copy
            # shard 1 to ps 1's replacement: the replacement holds no copy
            # of it when ps 2 dies, whatever the timing (holding the
            # replacement stopped once it was seen lost that race: it had
            # been copied within the poll's few ms). ps 0 fails ps 1 over
            # without ps 2's answer (failover.c), and finds ps 2 dead long
            # before heartbeat-timeout-ms (5 s) would call it hung.
            stopped = pids[1]
            os.kill(stopped, signal.SIGSTOP)
        os.kill(pids[0], sig)
        if replaced:
            while launch_child_pid(p, "ps", 1) == pids[0]:
                assert p.alive() and time.time() < deadline + 60, "ps 1 was not replaced"
                time.sleep(0.01)
        os.kill(pids[1], sig)
        killed = time.time()
        rc, out, err = p.wait(timeout)
        return rc, out, err, time.time() - killed, pids
    finally:
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.kill()


def both_lost_case():
    # SIGSTOP: both hung, found so after heartbeat-timeout-ms; launch
    # kills them for the rollback (the run ps 0 lost, still there).
    # Sync, ps 2 (stopped first) killed as soon as launch has started ps
    # 1's replacement (ps 1 failed over, its exit seen): the replacement
    # holds no copy of shard 1, so ps 2's death loses it, and the
    # replacement takes part in the rollback.
    # (Killed 0.5 s apart, ps 2's death once came while ps 1 was left
    # unreplaced, before sync mode re-replicated: launch had to restart it
    # for the rollback; now its replacement is often copied within 0.5 s,
    # and the second death survived: test_replication.py sync_rerep.)
    for mode, sig, after_replacement in (
            ("async", signal.SIGKILL, False), ("sync", signal.SIGKILL, False),
            ("async", signal.SIGSTOP, False), ("sync", signal.SIGKILL, True)):
        d = tempfile.mkdtemp(prefix="qr-repl-ckpt-")
        try:
            args = ["--mode", mode, "--ps", "3", "--workers", "2", "--data", "digits",
                    "--batch-size", "32", "--seed", "11", "--lr", "0.1", "--ps-replicas", "2",
                    "--max-restarts", "2", "--steps", "6000", "--checkpoint-dir", d,
                    "--checkpoint-steps", "200", "--restart-wait-ms", "20000"]
            if mode == "sync":
                args += ["--init-tokens", "0"]
            if sig == signal.SIGSTOP:
                args += ["--heartbeat-timeout-ms", "1500", "--heartbeat-ms", "200"]
            rc, out, err, _, pids = kill_both(
                args, lambda: sum(n.startswith("ckpt-") for n in os.listdir(d)) >= 2, sig=sig,
                replaced=after_replacement)
            mode += "" if sig == signal.SIGKILL else " (SIGSTOP)"
            mode += ", ps 2 once ps 1 is replaced" if after_replacement else ""
            assert rc == 0, "%s: launch exited %d\n%s" % (mode, rc, err[-5000:])
            s = last_json(out)
            assert s["rollbacks"] == 1 and s["global_step"] >= 6000, (mode, s)
            m = BOTH_LOST.search(err)
            assert m and m[2], "%s: no rollback message\n%s" % (mode, err[-5000:])
            step = int(m[2])
            written = [int(w[2]) for w in WRITTEN.finditer(err, 0, m.start())]
            assert step in written, (mode, step, written)
            # Each is restarted for the rollback; or, when ps 0 had failed
            # it over and launch had seen it exit before the rollback's
            # notice (async: more likely under the sanitizer build), its
            # replacement was started already and restores the checkpoint
            # as a restart does (the restored copies below show it).
            # ps 1's replacement, there before ps 2 died, takes part as
            # it runs.
            for k, pid in zip((1, 2), pids):
                restarted = re.search(r"quorum launch: ps %d \(pid %d\) was killed by signal 9 "
                                      r"\(Killed\); restarting it" % (k, pid), err)
                replaced = "quorum launch: ps %d (failed over) has exited; starting a " \
                    "replacement" % k in err and "quorum launch: ps %d (pid %d) was failed over" \
                    % (k, pid) in err
                # A replacement ps 0 had seen join (JOINING) is alive and
                # follows the rollback: ps 0 names only the lost ps to
                # launch (rollback.c).
                named = re.search(r"quorum launch: ps %d \(pid \d+\) is lost with a "
                                  r"neighbour" % k, err)
                assert (restarted or replaced) and (named or replaced and after_replacement), \
                    "%s: ps %d not restarted for the rollback\n%s" % (mode, k, "\n".join(
                        l for l in err.splitlines() if l.startswith("quorum launch")))
            # every ps followed ps 0 to that checkpoint, both copies
            for k in (1, 2):
                assert re.search(r"\[ps %d pid \d+\] info: restored the copy of ps %d's shard: "
                                 r".* \(global step %d\)" % (k, k - 1, step), err, re.S), \
                    (mode, k, err[-5000:])
            # views never go back: every ps's last view (its last line) is
            # after every view of before the rollback (failovers, ps 0's
            # line as its run ended)
            last, earlier = {}, [int(v) for v in re.findall(
                r"failed over in place, view (\d+)", err[:m.start()])]
            for c in PS_COPIES.finditer(err):
                if c[1] in last:
                    earlier.append(int(last[c[1]][11]))
                last[c[1]] = c
            views = {int(c[11]) for c in last.values()}
            assert sorted(last) == ["0", "1", "2"] and min(views) > max(earlier + [0]), \
                (mode, views, earlier)
            check_copies("\n".join(c[0] for c in last.values()), 3,
                         "%s, after the rollback" % mode)
            print("ok: %s: ps 1 and ps 2 lost, shard 1's both copies: rolled back "
                  "once to the checkpoint of step %d, both restarted, ended at step %d; views "
                  "%s before, %s at the end; every backup equal to its primary" % (
                      mode, step, s["global_step"], sorted(set(earlier)), sorted(views)))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    print("PASS: both_lost: both copies of shard 1 lost together roll the cluster back to the "
          "last checkpoint, once, in async and sync mode, killed or stopped")


def both_lost_abort_case():
    started = time.time()
    args = ["--mode", "async", "--ps", "3", "--workers", "2", "--data", "digits",
            "--batch-size", "32", "--seed", "11", "--lr", "0.1", "--ps-replicas", "2",
            "--max-restarts", "2", "--steps", "100000", "--restart-wait-ms", "30000"]
    rc, out, err, took, _ = kill_both(args, lambda: time.time() - started > 1.5, timeout=120)
    assert rc != 0, "launch exited 0 with both copies of shard 1 lost\n%s" % err[-5000:]
    want = ("shard 1 has lost both its copies: ps 1 (unix:", "are lost together (dead or hung), "
            "which no failover covers; without --checkpoint-dir there is no checkpoint to roll "
            "the cluster back to: the run aborts")
    assert all(w in err for w in want), err[-5000:]
    assert took < 20, "the abort took %.1f s after the kill (restart-wait-ms 30 s)" % took
    print("PASS: both_lost_abort: without --checkpoint-dir the run aborted %.1f s after the "
          "kill, exit %d, naming shard 1 and why" % (took, rc))


def kill_then(args, mode, first, second, nps=3):
    """`quorum launch --max-restarts 3 ARGS`: ps `first` SIGKILLed once ps
    0 has linked to every ps, then, once its replacement holds its copies
    again (a BACKUP: its shard stays on the next ps), ps `second`. Returns
    the summary, the log and the pid of the first's replacement."""
    log = tempfile.NamedTemporaryFile("w+", prefix="qr-backup-coordinator-", suffix=".log")
    p = Proc([quorum, "launch", "--json", "--quiet", "--mode", mode, "--max-restarts", "3"] +
             args, stderr=log)

    def wait_log(pattern):
        deadline = time.time() + 120
        while not re.search(pattern, open(log.name).read(), re.M):
            assert time.time() < deadline and p.alive(), "no '%s'\n%s" % (
                pattern, open(log.name).read()[-4000:])
            time.sleep(0.02)
    try:
        wait_log(r"\[ps 0 pid \d+\] info: linked to ps %d" % (nps - 1))
        time.sleep(0.3)
        os.kill(launch_child_pid(p, "ps", first), signal.SIGKILL)
        wait_log(re.escape("quorum launch: ps %d holds copies of its shards again" % first))
        replacement = launch_child_pid(p, "ps", first)
        os.kill(launch_child_pid(p, "ps", second), signal.SIGKILL)
    except BaseException:
        p.kill()
        log.close()
        raise
    s, err = end_launch(p, log, mode)
    return s, err, replacement


def took_over(err, pid):
    """ps 1's run `pid` took the coordinator's role over (its match)."""
    return re.search(r"\[ps 1 pid %d\] warn: ps 0 \([^)]*\), the coordinator, is gone" % pid,
                     err)


def written_by(err, pid):
    """The global steps of the checkpoints the coordinator of pid wrote."""
    return [int(m) for m in re.findall(r"\[ps \d pid %d\] info: checkpoint \S+ written: "
                                       r"global step (\d+)" % pid, err)]


def coordinator_backup_case():
    """ps 1 killed and replaced (a BACKUP: shard 1 stays on ps 2), then ps
    0 killed, with --checkpoint-dir: ps 1's replacement takes the
    coordinator's role over though it serves no shard of its own, and
    writes the checkpoints from then on, shard 0 from its promoted copy
    alone (its own store is a copy of shard 1, which ps 2 writes). Before,
    it did not take over with checkpoints, and the cluster rolled back.
    Sync (R = N, --init-tokens 0): no rollback, the params_digest of the
    run unkilled, the checkpoints verify, and the last resumes to step 5000
    with the digest of a run never stopped. Async: no cut given up after
    the takeover, and the newest checkpoint verifies with every variable
    once."""
    sync = ["--init-tokens", "0", "--ps", "3", "--workers", "3", "--data", "digits",
            "--batch-size", "32", "--seed", "11", "--lr", "0.1", "--ps-replicas", "2"]
    d = tempfile.mkdtemp(prefix="qr-repl-ckpt-")

    def run(steps, ckpt):
        p = Proc([quorum, "launch", "--json", "--quiet", "--mode", "sync"] + sync +
                 ["--steps", str(steps)] + (["--checkpoint-dir", d] if ckpt else []))
        rc, out, err = p.wait(300)
        assert rc == 0, "launch exited %d\n%s" % (rc, err[-4000:])
        return last_json(out)

    try:
        whole = run(4000, False)
        s, err, replacement = kill_then(sync + ["--steps", "4000", "--checkpoint-dir", d,
                                                "--checkpoint-steps", "300"], "sync", 1, 0)
        assert s["params_digest"] == whole["params_digest"], (s, whole["params_digest"])
        assert took_over(err, replacement), err[-3000:]
        mine = written_by(err, replacement)
        assert mine and mine[-1] == 4000, (mine, err[-3000:])
        verify(d)
        assert set(placement(d, 4000).values()) == {0, 1, 2}
        resumed, again = run(5000, True), run(5000, False)
        assert resumed["params_digest"] == again["params_digest"], (resumed, again)
        print("ok: sync: ps 1 replaced, then ps 0 killed: ps 1's replacement took over and "
              "wrote %d checkpoints, the digest of the run unkilled (%s), and the last resumed "
              "to step 5000 with the digest of a run never stopped (%s)" % (
                  len(mine), whole["params_digest"], again["params_digest"]))
        shutil.rmtree(d)
        args = ["--steps", "20000", "--checkpoint-dir", d, "--checkpoint-steps", "500"]
        s, err, replacement = kill_then(DIGITS[:-2] + args, "async", 1, 0)
        at = took_over(err, replacement)
        assert at and "given up" not in err[at.start():], err[-3000:]
        mine = written_by(err, replacement)
        assert mine and mine[-1] >= 20000, (mine, err[-3000:])
        verify(d)
        assert set(placement(d, mine[-1]).values()) == {0, 1, 2}
        print("ok: async: ps 1's replacement took over and wrote %d checkpoints, none given up, "
              "the newest (step %d) verified with every variable once" % (len(mine), mine[-1]))
        # 4 ps: ps 2 replaced, then ps 1 killed: ps 2, a BACKUP, serves
        # shard 1 from its promoted copy and is asked for it (before, it
        # was not, and every cut after was given up: 0 checkpoints).
        shutil.rmtree(d)
        four = ["--ps", "4"] + DIGITS[2:-2]
        s, err, replacement = kill_then(four + args, "async", 2, 1, nps=4)
        second = err.index("was failed over by ps 0 (view 4)")
        assert "given up" not in err[second:], err[second:][-3000:]
        after = [int(m) for m in re.findall(r"info: checkpoint \S+ written: global step (\d+)",
                                            err[second:])]
        assert after and after[-1] >= 20000, (after, err[-3000:])
        verify(d)
        assert set(placement(d, after[-1], 4).values()) == {0, 1, 2, 3}
        print("ok: async, 4 ps: ps 2 replaced, then ps 1 killed: %d checkpoints after, none "
              "given up, the newest (step %d) verified with every variable once" % (
                  len(after), after[-1]))
        print("PASS: coordinator_backup")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def positions_in(shard_path):
    """quorum/worker_data_position of a checkpoint shard, read from the
    safetensors layout (an 8-byte header length, the JSON header, the data)."""
    with open(shard_path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    rec = json.loads(blob[8:8 + n])["quorum/worker_data_position"]
    start, end = rec["data_offsets"]
    return list(struct.unpack("<%dq" % rec["shape"][0], blob[8 + n + start:8 + n + end]))


def ask_ready(port, worker, set_ready=0):
    """A worker's HELLO and READY on ps `port`: (set, global step, data position)."""
    s = connect(port)
    try:
        s.sendall(frame(HELLO, 1, struct.pack("<III", 1, worker, 0)))  # role: worker
        status, meta = read_reply(s)[2:4]
        assert status == 0, (status, meta)
        s.sendall(frame(READY, 2, ready_meta(set_ready)))
        status, meta = read_reply(s)[2:4]
        assert status == 0, (status, meta)
        return struct.unpack("<IqQ", meta[:20])
    finally:
        s.close()


def coordinates(port):
    s = connect(port)
    try:
        s.sendall(frame(STATS, 1))
        status, meta = read_reply(s)[2:4]
        assert status == 0, (status, meta)
        return "checkpoint" in json.loads(meta)
    finally:
        s.close()


def restored_positions_case():
    d = tempfile.mkdtemp(prefix="qr-repl-ckpt-")
    ps = []
    try:
        p = Proc([quorum, "launch", "--json", "--quiet", "--mode", "async", "--ps", "2",
                  "--workers", "2", "--ps-replicas", "2", "--checkpoint-dir", d, "--steps",
                  "300", "--data", "digits", "--batch-size", "32", "--seed", "11"])
        rc, out, err = p.wait(300)
        assert rc == 0, err[-4000:]
        newest = max(x for x in os.listdir(d) if x.startswith("ckpt-"))
        step = int(newest[5:])
        shard0 = os.path.join(d, newest, "shard-00000-of-00002.safetensors")
        want = positions_in(shard0)
        assert all(x > 0 for x in want), want
        ports = free_ports(4)
        spec = ["--ps_hosts", "127.0.0.1:%d,127.0.0.1:%d" % tuple(ports[:2]),
                "--worker_hosts", "127.0.0.1:%d,127.0.0.1:%d" % tuple(ports[2:]),
                "--ps-replicas", "2", "--checkpoint-dir", d, "--heartbeat-ms", "100",
                "--heartbeat-timeout-ms", "1000"]
        ps = [Proc([quorum, "ps"] + spec + ["--job_name", "ps", "--task_index", str(i)])
              for i in range(2)]
        # The chief's READY: set once ps 0 is linked to ps 1 (a ps 0 that
        # never met every ps is waited for, not succeeded).
        deadline = time.time() + 60
        while ask_ready(ports[0], 0, 1)[0] != 1:
            assert time.time() < deadline, "ps 0 never linked to ps 1"
            time.sleep(0.05)
        assert ask_ready(ports[0], 1)[2] == want[1], "ps 0 restored other positions"
        ps[0].kill()
        deadline = time.time() + 60
        while not coordinates(ports[1]):  # its STATS carry the checkpoints' figures then
            assert time.time() < deadline and ps[1].alive(), "ps 1 never took over"
            time.sleep(0.05)
        got = [ask_ready(ports[1], w)[2] for w in range(2)]
        assert got == want, "ps 1, coordinating, answers the workers' data positions %s; " \
            "the checkpoint of step %d has %s" % (got, step, want)
        print("PASS: restored_positions: ps 0 killed before any push after a restore: ps 1 "
              "took over and answers each worker with the checkpoint's data position %s" % want)
    finally:
        for x in ps:
            x.kill()
        shutil.rmtree(d, ignore_errors=True)


cases = {"failover": failover_case, "kill_during": kill_during_case, "resume": resume_case,
         "coordinator": coordinator_case, "both_lost": both_lost_case, "both_lost_abort": both_lost_abort_case,
         "restored_positions": restored_positions_case,
         "coordinator_backup": coordinator_backup_case, "stop_during": stop_during_case}
if case not in cases:
    sys.exit("unknown case %r (%s)" % (case, ", ".join(cases)))
cases[case]()

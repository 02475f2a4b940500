#!/usr/bin/env python3
"""soak.py - kill a random task of a training run at a random moment, many
times in a row, and count what went wrong. Not part of CI (it takes as
long as you ask; CI runs 2 --replication runs, tests/integration/soak.cmake);
run it before a release or after touching the fault paths:

    python3 scripts/soak.py build/tools/quorum --runs 50

Each run is `quorum launch --ps 2 --workers 3` (sync or async, drawn at
random; --sync-timeout-ms only for sync, which async refuses) with
checkpoints every 50 steps, --max-restarts 2 and --heartbeat-timeout-ms
2000. Between 0.5 and 3 s in, one fault from this menu, drawn at random:
  SIGKILL        a task (a ps or a worker)
  SIGSTOP        a worker, never continued (a hung worker)
  SIGSTOP ps     a ps, never continued: ps 0 (or ps 1, for ps 0) names it
                 hung, launch kills and restarts it, the cluster rolls back
  SIGSTOP+CONT   a ps, continued 1 to 6 s later: before heartbeat-timeout-ms
                 it goes on; after, launch has killed it already (or, if it
                 wakes first, it fences itself and exits, and is restarted)
Afterwards it checks:
  hung       the launcher did not end within --timeout seconds
  failed     it ended with a status other than 0 (or 3, when the task hit
             was a SIGSTOPped worker that launch had to stop at the end,
             or a ps stopped through the end of the run that launch names
             as the one task that did not end well)
  lost data  the run did not reach its global step, or its newest
             checkpoint is not whole (a shard missing, a size or crc32 that
             differs from the manifest, shards at different global steps)
  left       a process of the run's session still alive after the launcher
             ended (every task is killed then, by process group)
and prints one line per run and the totals. Exit status 1 if anything went
wrong. --mode, --fault and --task narrow the draw to one case (e.g.
--mode async --fault SIGSTOP+CONT --task "ps 1"); --logs DIR keeps the
launcher's stderr of every run that went wrong. Processes are found and killed by pid and process group only.

--replication: the proof of issue 29 (docs/REPLICATION.md) that a ps
death loses nothing with two copies of every shard. Each run is `quorum
launch --ps 3 --workers 3 --mode async (or sync) --ps-replicas 2` on
digits (--steps, --heartbeat-ms 200 --heartbeat-timeout-ms 1000 by
default) and, at a random
moment 0.3 s to --kill-window s in (at most 0.7 of the reference run's
training time, so that the fault comes while training goes on), one
fault on a random ps, ps 0 included in both modes, drawn from:
  SIGKILL        the ps dies: ps 0 fails it over (its backup serves its
                 shard); ps 0 itself is failed over by ps 1, which takes
                 the coordinator's role
  SIGSTOP+CONT   the ps hangs 0.3 to 3 s: past heartbeat-timeout-ms it is
                 failed over and, once continued, fences itself and exits
                 (ps 0: reported hung, killed by launch, then failed over
                 by ps 1); continued sooner, it goes on and nothing fails
                 over
(--faults kill or stop keeps one of them). --rejoin adds --max-restarts 1
and SIGKILLs only: the killed ps's replacement (ps 0's, started with
--coordinator 1, too) must rejoin as a backup, every shard on two equal
copies at the end and the workers in view 3, unless the run ended while
it was being copied. --double adds --max-restarts 2 and SIGKILLs
only: once the first victim's replacement has rejoined, a second random
ps (that replacement, or the coordinator of the moment, included) is
SIGKILLed 0.05 to 0.5 s later; both must fail over, the second's
replacement rejoin unless the run ended first, and the checks below hold
for both (--steps 12000 async, 4000 sync by default, so that both come
while training goes on). --checkpoints gives every run a --checkpoint-dir of its own
(checkpoints every 200 steps), and `quorum ckpt verify` must pass on it
afterwards. A first run without a fault is
the reference. Every run must:
  end        within --timeout, with exit status 0
  no rollback  JSON rollbacks 0, the global step reached
  failover   view 1 and launch's "was failed over" line for the victim
             after a SIGKILL (view 0 when a stopped ps was continued in time)
  copies     every shard that still has two copies: the primary's digest
             equals the backup's (the ps's last log line "replica digests")
  exactly once  per shard, the pushes acknowledged to the workers (their
             last log line) equal the pushes applied on each surviving copy
  accuracy   within 0.03 of the reference run
  left       no process of the run left behind
and it prints the counts at the end: runs, kills, stops, failovers, pushes
resent after a lost connection, pushes answered as duplicates (applied
once, acknowledged twice), and the longest push a worker waited for (the
stall around a failover). With --mode sync each run is `--mode sync
--init-tokens 0` (R = N, 2000 steps by default), deterministic, and must
also end on the reference run's params_digest: a fault changes no bit.

    python3 scripts/soak.py build/tools/quorum --replication --runs 20
    python3 scripts/soak.py build/tools/quorum --replication --mode sync --runs 50
    python3 scripts/soak.py build/tools/quorum --replication --double --runs 20
"""

import argparse
import datetime
import glob
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib

# The parser of a replicated run's last log lines, shared with
# tests/integration/test_replication.py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from qrtest import ReplicaReport  # noqa: E402


def children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def task_of(pid):
    try:
        with open("/proc/%d/cmdline" % pid) as f:
            args = f.read().split("\0")
        return "%s %s" % (args[1], args[args.index("--task_index") + 1])
    except (OSError, ValueError, IndexError):
        return None


def session_alive(sid):
    alive = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":  # session id, state
                alive.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return alive


def shard_step(path):
    """The global_step scalar of a safetensors shard, read by hand."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        begin, _ = header["global_step"]["data_offsets"]
        f.seek(8 + n + begin)
        return struct.unpack("<q", f.read(8))[0]


def newest_checkpoint_problem(d):
    done = [c for c in sorted(glob.glob(os.path.join(d, "ckpt-*")))
            if os.path.exists(os.path.join(c, "manifest.json"))]
    if not done:
        return "no complete checkpoint"
    c = done[-1]
    with open(os.path.join(c, "manifest.json")) as f:
        m = json.load(f)
    steps = set()
    for s in m["shards"]:
        path = os.path.join(c, s["file"])
        try:
            data = open(path, "rb").read()
        except OSError:
            return "%s missing" % path
        if len(data) != s["bytes"] or "%08x" % zlib.crc32(data) != s["crc32"]:
            return "%s does not match the manifest" % path
        steps.add(shard_step(path))
    if steps != {m["global_step"]}:
        return "%s: shards at steps %s, manifest %d" % (c, sorted(steps), m["global_step"])
    return None


FAULTS = ["SIGKILL", "SIGKILL", "SIGSTOP", "SIGSTOP ps", "SIGSTOP+CONT"]


def wait_run(p, deadline, problems):
    """The launcher's (stdout, stderr) once it ends; one still running at
    the deadline is hung: its whole process group is killed."""
    try:
        return p.communicate(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        problems.append("hung")
        os.killpg(p.pid, signal.SIGKILL)
        return p.communicate()


def one_run(quorum, i, timeout, rng, steps, only):
    mode = only.mode or rng.choice(["sync", "async"])
    work = tempfile.mkdtemp(prefix="qr-soak-")
    args = [quorum, "launch", "--ps", "2", "--workers", "3", "--mode", mode, "--data", "digits",
            "--steps", str(steps), "--checkpoint-dir", os.path.join(work, "ckpt"),
            "--checkpoint-steps", "50", "--max-restarts", "2", "--heartbeat-timeout-ms", "2000",
            "--json", "--quiet"]
    if mode == "sync":
        args += ["--replicas-to-aggregate", "2", "--sync-timeout-ms", "20000"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    time.sleep(rng.uniform(0.5, 3.0))
    kids = [(pid, task_of(pid)) for pid in children(p.pid)]
    kids = [(pid, name) for pid, name in kids if name]
    fault = only.fault or rng.choice(FAULTS)
    if fault == "SIGSTOP":
        kids = [k for k in kids if k[1].startswith("worker")]
    elif fault != "SIGKILL":
        kids = [k for k in kids if k[1].startswith("ps")]
    if only.task:
        kids = [k for k in kids if k[1] == only.task]
    sig = signal.SIGKILL if fault == "SIGKILL" else signal.SIGSTOP
    victim = rng.choice(kids) if kids else (None, "nothing (the run had ended)")
    if victim[0]:
        try:
            os.kill(victim[0], sig)
        except ProcessLookupError:
            pass
    problems = []
    deadline = time.time() + timeout
    if fault == "SIGSTOP+CONT" and victim[0]:
        time.sleep(rng.uniform(1.0, 6.0))
        try:
            os.kill(victim[0], signal.SIGCONT)
        except ProcessLookupError:
            pass
    out, err = wait_run(p, deadline, problems)
    ok_status = {0, 3} if fault == "SIGSTOP" else {0}
    last = (err.strip().splitlines() or [""])[-1]
    if fault == "SIGSTOP+CONT" and victim[0] and last.endswith("did not end well: " + victim[1]):
        # Stopped through the end of the run and continued after
        # heartbeat-timeout-ms: it fenced itself once ps 0 had stopped the
        # cluster, and launch names it (test_launch_tasks.py ps_after_end).
        ok_status = {0, 3}
    if "hung" not in problems and p.returncode not in ok_status:
        problems.append("failed (exit %d: %s)" % (p.returncode,
                                                  err.strip().splitlines()[-1:] or ""))
    try:
        final = json.loads(out.strip().splitlines()[-1])
        if final["global_step"] < steps:
            problems.append("lost data (global step %d of %d)" % (final["global_step"], steps))
    except (ValueError, IndexError, KeyError):
        if "hung" not in problems:
            problems.append("lost data (no summary)")
    bad = newest_checkpoint_problem(os.path.join(work, "ckpt"))
    if bad:
        problems.append("lost data (%s)" % bad)
    left = session_alive(p.pid)
    if left:
        problems.append("left %d process(es) behind" % len(left))
        os.killpg(p.pid, signal.SIGKILL)
    shutil.rmtree(work, ignore_errors=True)
    if problems and only.logs:
        path = os.path.join(only.logs, "run-%03d.log" % i)
        with open(path, "w") as f:
            f.write("%s %s %s (pid %s): %s\n%s" % (mode, fault, victim[1], victim[0],
                                                   "; ".join(problems), err))
        problems[-1] += " (log: %s)" % path
    print("run %3d: %-5s %-12s %-9s -> %s" % (i, mode, fault, victim[1],
                                             "; ".join(problems) or "ok"), flush=True)
    return problems


REPLICATION_PS = 3
REPLICATION_FAULTS = {"kill": ["SIGKILL"], "stop": ["SIGSTOP+CONT"],
                      "both": ["SIGKILL", "SIGSTOP+CONT"]}


def ps_pid(launcher, index, deadline):
    """The pid of ps `index` among launch's children (None once it ended)."""
    while time.time() < deadline and launcher.poll() is None:
        for pid in children(launcher.pid):
            if task_of(pid) == "ps %d" % index:
                return pid
        time.sleep(0.02)
    return None


def replication_problems(err, nps, failed):
    """What the last log lines say against the guarantees, and the counts
    (resent, duplicates, longest push, view)."""
    problems = []
    report = ReplicaReport(err, nps)
    if report.workers != 3:
        problems.append("counts: %d workers reported their pushes" % report.workers)
    skip = () if failed is None else (failed,)  # a fenced ps's last words: not a copy any more
    for k in range(nps):
        held = report.held(k, skip)
        if not held:
            problems.append("lost data (no surviving copy of shard %d)" % k)
            continue
        for c in held:
            if c["applied"] != report.acked[k]:
                problems.append("counts: shard %d: %d pushes acknowledged, %d applied on ps %d"
                                % (k, report.acked[k], c["applied"], c["ps"]))
        digests = [c["digest"] for c in held
                   if c["own"] or c["role"] in ("backup", "promoted")]
        two = failed is None or (k != failed and (k + 1) % nps != failed)
        if two and (len(digests) != 2 or len(set(digests)) != 1):
            problems.append("copies: shard %d: primary and backup digests %s" % (k, digests))
    return problems, report.resent, report.duplicates(skip), report.stall, report.views


def stop_requested_at(err):
    """When ps 0 logged that a worker asked it to stop the cluster (the end
    of training), in seconds since the epoch; None if it did not."""
    m = re.search(r"^(\S+) \[ps \d+ pid \d+\] info: stop requested", err, re.M)
    if not m:
        return None
    try:
        return datetime.datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
    except ValueError:
        return None


def with_checkpoints(args, on):
    """--checkpoints: ARGS with a fresh --checkpoint-dir (checkpoints every
    200 steps) and that folder; else ARGS and None."""
    if not on:
        return args, None
    d = tempfile.mkdtemp(prefix="qr-soak-ckpt-")
    return args + ["--checkpoint-dir", d, "--checkpoint-steps", "200"], d


def checkpoints_problem(quorum, d, problems):
    """`quorum ckpt verify` of a run's --checkpoint-dir (every checkpoint
    and chain whole), appended to problems as lost data; the folder is
    removed."""
    if d is None:
        return
    v = subprocess.run([quorum, "ckpt", "verify", d], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    if v.returncode != 0:
        bad = [l for l in v.stdout.splitlines() if ": ok (" not in l]
        problems.append("lost data (ckpt verify: %s)" % (bad[:1] or ["exit %d" % v.returncode])[0])
    shutil.rmtree(d, ignore_errors=True)


def check_end(p, out, err, problems, through_end, steps, reference, mode):
    """The launcher's exit and its summary against a replicated run's
    guarantees (problems appended); returns the summary (None: none)."""
    if "hung" not in problems and p.returncode != 0 and not through_end:
        problems.append("failed (exit %d: %s)" % (p.returncode,
                                                 err.strip().splitlines()[-1:] or ""))
    try:
        final = json.loads(out.strip().splitlines()[-1])
        if final["rollbacks"] != 0:
            problems.append("rollback (%d)" % final["rollbacks"])
        if final["global_step"] < steps:
            problems.append("lost data (global step %d of %d)" % (final["global_step"], steps))
        if reference and final["test_accuracy"] < reference["test_accuracy"] - 0.03:
            problems.append("accuracy %.4f, %.4f unkilled" % (final["test_accuracy"],
                                                             reference["test_accuracy"]))
        # Sync with R = N and --init-tokens 0 is deterministic: a fault
        # must change no bit of the result (issue 29, item 6).
        if reference and mode == "sync" and final["params_digest"] != reference["params_digest"]:
            problems.append("digest %s, %s unkilled" % (final["params_digest"],
                                                       reference["params_digest"]))
        return final
    except (ValueError, IndexError, KeyError):
        if "hung" not in problems:
            problems.append("lost data (no summary)")
        return None


def replication_run(quorum, i, timeout, rng, steps, faults, window, reference, hb_timeout_ms,
                    mode="async", rejoin=False, checkpoints=False):
    """One run of --replication (fault None: the reference). Returns
    (problems, counts, summary). rejoin: --max-restarts 1, and the killed
    ps's replacement must rejoin unless the run ended first."""
    args = [quorum, "launch", "--ps", str(REPLICATION_PS), "--workers", "3", "--mode", mode,
            "--ps-replicas", "2", "--data", "digits", "--batch-size", "32", "--seed", "11",
            "--lr", "0.1", "--steps", str(steps), "--heartbeat-ms", "200",
            "--heartbeat-timeout-ms", str(hb_timeout_ms), "--json", "--quiet"]
    if mode == "sync":  # R = N, every step's tokens from its own quorum: a deterministic run
        args += ["--init-tokens", "0"]
    if rejoin:
        args += ["--max-restarts", "1"]
    args, ckpt_dir = with_checkpoints(args, checkpoints)
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.time() + timeout
    fault = rng.choice(faults) if faults else None
    # ps 0 too (ps 1 takes its role over), in both modes
    victim = rng.randrange(0, REPLICATION_PS)
    after = rng.uniform(0.3, window)
    hold = rng.uniform(0.3, 3.0) if fault == "SIGSTOP+CONT" else 0.0
    pid, sent, sent_at = None, False, 0.0
    if fault:
        pid = ps_pid(p, victim, deadline)
        time.sleep(after)
        if pid and p.poll() is None:
            try:
                os.kill(pid, signal.SIGKILL if fault == "SIGKILL" else signal.SIGSTOP)
                sent, sent_at = True, time.time()
            except ProcessLookupError:
                pass
        if sent and hold:
            time.sleep(hold)
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    problems = []
    out, err = wait_run(p, deadline, problems)
    last = (err.strip().splitlines() or [""])[-1]
    # Stopped through the end of the run and continued after
    # heartbeat-timeout-ms: it fenced itself once ps 0 had stopped the
    # cluster in order, and launch ends with 3 naming it (as without
    # replicas: one_run, test_launch_tasks.py ps_after_end). Its shard was
    # served to the end; nothing is lost, and its last words are no copy.
    through_end = (fault == "SIGSTOP+CONT" and sent and p.returncode == 3 and
                   last.endswith("did not end well: ps %d" % victim) and
                   re.search(r"ps %d \(pid %d\) exited with status 1 after ps \d had stopped the "
                             r"cluster in order" % (victim, pid), err) is not None)
    # Killed as training ended (a run faster than the reference): ps 0
    # may have begun its orderly stop, which fails nothing over, and
    # launch ends with 3 naming the killed ps. Nothing was lost, and the
    # run proved nothing: it is not counted a kill.
    stop = stop_requested_at(err)
    late = fault == "SIGKILL" and sent and stop is not None and sent_at > stop - 0.1
    if late and p.returncode == 3 and last.endswith("did not end well: ps %d" % victim):
        through_end = True
    final = check_end(p, out, err, problems, through_end, steps, reference, mode)
    checkpoints_problem(quorum, ckpt_dir, problems)
    failed_over = sent and "quorum launch: ps %d (pid %d) was failed over by ps %d" % (
        victim, pid, 1 if victim == 0 else 0) in err
    if sent and fault == "SIGKILL" and not failed_over and not late:
        problems.append("failover: no failover of the killed ps %d" % victim)
    # --rejoin: the killed ps's replacement (ps 0's told --coordinator 1)
    # was copied its shards (view 3: every shard on two copies again), or
    # the run ended while it was being started or copied (views 1, 2).
    rejoined = failed_over and rejoin and \
        "quorum launch: ps %d holds copies of its shards again (view 3)" % victim in err
    found, resent, duplicates, stall, views = replication_problems(
        err, REPLICATION_PS, victim if (failed_over or through_end) and not rejoined else None)
    problems += found
    if rejoined and views != {3}:
        problems.append("rejoin: the workers ended in views %s, not 3" % sorted(views))
    elif not rejoined and views and not views <= ({1, 2} if failed_over and rejoin else
                                                  {1 if failed_over else 0}):
        problems.append("failover: the workers ended in views %s" % sorted(views))
    if "rolling back" in err or "restarting it" in err:
        problems.append("rollback (launch restarted a task)")
    left = session_alive(p.pid)
    if left:
        problems.append("left %d process(es) behind" % len(left))
        os.killpg(p.pid, signal.SIGKILL)
    what = "no fault (reference)" if not fault else (
        "%s ps %d at %.2f s%s%s" % (fault, victim, after, " for %.2f s" % hold if hold else "",
                                    ", as training ended" if late and not failed_over
                                    else ", through the end" if through_end else "")
        if sent else "%s: the run had ended" % fault)
    print("run %3d: %-36s -> %s%s" % (i, what, "; ".join(problems) or "ok",
                                      "" if problems else ", failed over and rejoined" if rejoined
                                      else ", failed over" if failed_over else ""), flush=True)
    if problems:  # launch's output kept for the post-mortem, its path printed
        fd, path = tempfile.mkstemp(prefix="qr-soak-run%d-" % i, suffix=".log")
        with os.fdopen(fd, "w") as f:
            f.write("%s\n%s\n--- stdout ---\n%s--- stderr ---\n%s" % (
                " ".join(args), what, out, err))
        print("         launch's output: %s" % path, flush=True)
    counts = {"kills": int(sent and fault == "SIGKILL" and (failed_over or not late)),
              "stops": int(sent and fault == "SIGSTOP+CONT"),
              "failovers": int(bool(failed_over)), "rejoins": int(bool(rejoined)),
              "resent": resent, "duplicates": duplicates, "stall": stall}
    return problems, counts, final


def wait_line(path, pattern, p, deadline):
    """Wait until the log file at `path` has a line matching `pattern`
    (True), or the run p has ended or the deadline passed (False)."""
    while time.time() < deadline and p.poll() is None:
        with open(path) as f:
            if re.search(pattern, f.read(), re.M):
                return True
        time.sleep(0.01)
    return False


def double_run(quorum, i, timeout, rng, steps, window, reference, hb_timeout_ms, mode,
               checkpoints=False):
    """One run of --double: a random ps SIGKILLed, then, once its
    replacement holds its copies again, a second random ps (the first's
    replacement, or the coordinator of the moment, included) SIGKILLed
    0.05 to 0.5 s later, under launch --max-restarts 2. Returns (problems,
    counts, summary) as replication_run does."""
    args = [quorum, "launch", "--ps", str(REPLICATION_PS), "--workers", "3", "--mode", mode,
            "--ps-replicas", "2", "--data", "digits", "--batch-size", "32", "--seed", "11",
            "--lr", "0.1", "--steps", str(steps), "--heartbeat-ms", "200",
            "--heartbeat-timeout-ms", str(hb_timeout_ms), "--max-restarts", "2", "--json",
            "--quiet"]
    if mode == "sync":
        args += ["--init-tokens", "0"]
    args, ckpt_dir = with_checkpoints(args, checkpoints)
    log = tempfile.NamedTemporaryFile("w+", prefix="qr-soak-double-", suffix=".log")
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True,
                         start_new_session=True)
    deadline = time.time() + timeout
    victims = [rng.randrange(0, REPLICATION_PS), rng.randrange(0, REPLICATION_PS)]
    after = [rng.uniform(0.3, window), rng.uniform(0.05, 0.5)]
    pids, sent = [None, None], [0.0, 0.0]
    rejoined_first = False
    for n in range(2):
        if n == 1:
            rejoined_first = wait_line(
                log.name, r"^quorum launch: ps %d holds copies of its shards again" % victims[0],
                p, deadline)
            if not rejoined_first:
                break
        pids[n] = ps_pid(p, victims[n], deadline)
        time.sleep(after[n])
        if not pids[n] or p.poll() is not None:
            break
        try:
            os.kill(pids[n], signal.SIGKILL)
            sent[n] = time.time()
        except ProcessLookupError:
            break
    problems = []
    out, _ = wait_run(p, deadline, problems)
    err = open(log.name).read()
    log.close()
    last = (err.strip().splitlines() or [""])[-1]
    # The second kill as training ended: launch ends with 3 naming it (see
    # replication_run); nothing was lost, and it proved nothing.
    stop = stop_requested_at(err)
    late = bool(sent[1]) and stop is not None and sent[1] > stop - 0.1
    through_end = late and p.returncode == 3 and \
        last.endswith("did not end well: ps %d" % victims[1])
    final = check_end(p, out, err, problems, through_end, steps, reference, mode)
    checkpoints_problem(quorum, ckpt_dir, problems)
    failed_over = [bool(sent[n]) and re.search(
        r"quorum launch: ps %d \(pid %d\) was failed over by ps \d" % (victims[n], pids[n]),
        err) is not None for n in range(2)]
    for n in range(2):
        if sent[n] and not failed_over[n] and not (n == 1 and late):
            problems.append("failover: no failover of the killed ps %d (kill %d)" % (
                victims[n], n + 1))
    # The second victim's replacement rejoined (its copies again), or the
    # run ended while it was being started or copied: its shards then
    # ended on one copy, and its last words are no copy.
    rejoined = failed_over[1] and len(re.findall(
        r"^quorum launch: ps %d holds copies of its shards again" % victims[1], err,
        re.M)) == (2 if victims[1] == victims[0] else 1)
    found, resent, duplicates, stall, views = replication_problems(
        err, REPLICATION_PS, victims[1] if (failed_over[1] or through_end) and not rejoined
        else None)
    problems += found
    if len(views) > 1:
        problems.append("failover: the workers ended in views %s" % sorted(views))
    if "rolling back" in err or "restarting it" in err or "starting the cluster again" in err:
        problems.append("rollback (launch restarted a task)")
    left = session_alive(p.pid)
    if left:
        problems.append("left %d process(es) behind" % len(left))
        os.killpg(p.pid, signal.SIGKILL)
    if not sent[0]:
        what = "SIGKILL: the run had ended"
    elif not sent[1]:
        what = "SIGKILL ps %d at %.2f s, %s" % (
            victims[0], after[0], "the run ended before the second" if rejoined_first else
            "the run ended before it rejoined")
    else:
        what = "SIGKILL ps %d at %.2f s, ps %d %.2f s after it rejoined%s" % (
            victims[0], after[0], victims[1], after[1], ", as training ended" if late else "")
    print("run %3d: %-52s -> %s%s" % (i, what, "; ".join(problems) or "ok",
                                      "" if problems else ", both failed over and rejoined"
                                      if rejoined else ", both failed over"
                                      if all(failed_over) else ""), flush=True)
    if problems:
        fd, path = tempfile.mkstemp(prefix="qr-soak-run%d-" % i, suffix=".log")
        with os.fdopen(fd, "w") as f:
            f.write("%s\n%s\n--- stdout ---\n%s--- stderr ---\n%s" % (
                " ".join(args), what, out, err))
        print("         launch's output: %s" % path, flush=True)
    counts = {"kills": sum(1 for n in range(2) if sent[n] and (failed_over[n] or n == 0 or
                                                               not late)),
              "stops": 0, "failovers": sum(failed_over), "rejoins":
              int(rejoined_first) + int(bool(rejoined)), "resent": resent,
              "duplicates": duplicates, "stall": stall,
              "doubles": int(all(failed_over))}
    return problems, counts, final


def replication_soak(a, rng):
    faults = REPLICATION_FAULTS["kill" if a.rejoin or a.double else a.faults]
    print("soak --replication: %d runs after a reference run, launch --ps %d --workers 3 --mode "
          "%s%s --ps-replicas 2%s%s, --steps %d, faults %s on ps %s..%d%s" % (
              a.runs, REPLICATION_PS, a.mode, " --init-tokens 0" if a.mode == "sync" else "",
              " --max-restarts 2 (a second kill once the first's replacement has rejoined)"
              if a.double else
              " --max-restarts 1 (the killed ps's replacement rejoins)" if a.rejoin else "",
              " --checkpoint-dir (every 200 steps, verified after each run)"
              if a.checkpoints else "",
              a.steps, "/".join(faults), 0, REPLICATION_PS - 1,
              " (ps 0: ps 1 takes over as the coordinator)"), flush=True)
    problems, _, reference = replication_run(a.quorum, 0, a.timeout, rng, a.steps, None,
                                             a.kill_window, None, a.heartbeat_timeout_ms,
                                             a.mode, checkpoints=a.checkpoints)
    if problems or not reference:
        print("soak: the reference run (no fault) failed: %s" % "; ".join(problems))
        return 1
    # A fault must come while training goes on: a faulted run takes about
    # the reference's time (on a fast machine, 4000 steps took 1.15 s, and
    # a kill at 1.17 s came as the cluster was being stopped).
    window = min(a.kill_window, max(0.35, 0.7 * reference["wall_seconds"]))
    totals = {"kills": 0, "stops": 0, "failovers": 0, "rejoins": 0, "resent": 0,
              "duplicates": 0, "doubles": 0}
    stalls, bad = [], {}
    for i in range(1, a.runs + 1):
        if a.double:
            found, counts, _ = double_run(a.quorum, i, a.timeout, rng, a.steps, window,
                                          reference, a.heartbeat_timeout_ms, a.mode,
                                          a.checkpoints)
        else:
            found, counts, _ = replication_run(a.quorum, i, a.timeout, rng, a.steps, faults,
                                               window, reference, a.heartbeat_timeout_ms,
                                               a.mode, a.rejoin, a.checkpoints)
            counts["doubles"] = 0
        for k in totals:
            totals[k] += counts[k]
        if counts["failovers"]:
            stalls.append(counts["stall"])
        for problem in found:
            kind = problem.split(" (")[0].split(":")[0]
            bad[kind] = bad.get(kind, 0) + 1
    stalls.sort()
    print("soak --replication: %d runs, %d kills, %d stops, %d failovers, %d rejoins, %d pushes "
          "resent, %d answered as duplicates; longest push over the failovers: max %.3f s, "
          "median %.3f s; reference accuracy %.4f%s%s" % (
              a.runs, totals["kills"], totals["stops"], totals["failovers"], totals["rejoins"],
              totals["resent"],
              totals["duplicates"], stalls[-1] if stalls else 0.0,
              stalls[len(stalls) // 2] if stalls else 0.0, reference["test_accuracy"],
              ", digest %s" % reference["params_digest"] if a.mode == "sync" else "",
              "; %d runs with both kills failed over" % totals["doubles"] if a.double else ""))
    print("soak --replication: problems: %s" % (", ".join(
        "%s %d" % kv for kv in sorted(bad.items())) or "none"))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("quorum", help="the quorum binary")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=180, help="seconds before a run is hung")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--mode", choices=["sync", "async"],
                    help="only this mode (default: drawn; with --replication: async)")
    ap.add_argument("--fault", choices=sorted(set(FAULTS)),
                    help="only this fault (default: drawn)")
    ap.add_argument("--task", help="only this victim, e.g. 'ps 1' (default: drawn among those "
                    "the fault hits)")
    ap.add_argument("--logs", help="a folder where the stderr of each run with a problem is "
                    "kept (default: none kept)")
    ap.add_argument("--steps", type=int, default=None,
                    help="global steps of each run (default 3000; with --replication 6000 "
                    "async, 2000 sync)")
    ap.add_argument("--replication", action="store_true",
                    help="two copies of every shard (--ps-replicas 2; --mode async by "
                    "default, or sync): kill or stop a random ps, ps 0 included (ps 1 "
                    "takes its role over), and check that nothing is lost (see the top of "
                    "this file)")
    ap.add_argument("--faults", choices=sorted(REPLICATION_FAULTS), default="both",
                    help="--replication: SIGKILLs, SIGSTOP+CONTs or both (default)")
    ap.add_argument("--rejoin", action="store_true",
                    help="--replication: SIGKILLs only, under launch --max-restarts 1: the "
                    "killed ps's replacement (ps 0's too) must rejoin as a backup, every shard "
                    "on two equal copies at the end")
    ap.add_argument("--double", action="store_true",
                    help="--replication: SIGKILLs only, under launch --max-restarts 2: a random "
                    "ps killed, then, once its replacement has rejoined, a second random ps "
                    "(ps 0's successor as the coordinator included); the checks of a single "
                    "kill, for both")
    ap.add_argument("--checkpoints", action="store_true",
                    help="--replication: every run (the reference too) with a --checkpoint-dir "
                    "of its own, checkpoints every 200 steps; `quorum ckpt verify` must pass "
                    "on it after the run")
    ap.add_argument("--kill-window", type=float, default=2.0,
                    help="--replication: the fault comes 0.3 to this many s into a run")
    ap.add_argument("--heartbeat-timeout-ms", type=int, default=1000,
                    help="--replication: launch's and the ps tasks' (a stopped ps is failed "
                    "over after it; default 1000, with --heartbeat-ms 200)")
    a = ap.parse_args()
    if a.runs < 1 or (a.steps is not None and a.steps < 1) or a.kill_window <= 0.3 or \
            a.heartbeat_timeout_ms < 400:
        ap.error("--runs and --steps must be at least 1, --kill-window above 0.3, "
                 "--heartbeat-timeout-ms 400 or more")
    if a.logs:
        os.makedirs(a.logs, exist_ok=True)
    seed = a.seed if a.seed is not None else int(time.time())
    rng = random.Random(seed)
    if a.replication:
        a.mode = a.mode or "async"
        a.steps = a.steps or ((12000 if a.double else 6000) if a.mode == "async" else
                              (4000 if a.double else 2000))
        print("soak: seed %d" % seed)
        return replication_soak(a, rng)
    a.steps = a.steps or 3000
    print("soak: %d runs, seed %d" % (a.runs, seed))
    totals = {"hung": 0, "failed": 0, "lost data": 0, "left": 0}
    for i in range(a.runs):
        for problem in one_run(a.quorum, i, a.timeout, rng, a.steps, a):
            for k in totals:
                if problem.startswith(k):
                    totals[k] += 1
    print("soak: %d runs: %d hung, %d failed, %d lost data, %d left processes behind"
          % (a.runs, totals["hung"], totals["failed"], totals["lost data"], totals["left"]))
    return 1 if any(totals.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

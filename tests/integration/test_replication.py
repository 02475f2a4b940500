"""test_replication.py - two copies of every shard (--ps-replicas 2,
src/ps/replica.c, docs/REPLICATION.md).

Case "wire": two ps tasks started by hand (no secret), spoken to over the
raw wire as test_hostile.py does:
  - a push applied on ps 0 is on its backup, ps 1, bit for bit (STATS:
    shard 0's primary digest on ps 0 equals its backup digest on ps 1);
  - the same push sent again with the same (worker, seq) is answered as
    applied, changes nothing on either copy, and counts duplicate_pushes;
  - a REPLICATE from a worker's connection, a replica link from the wrong
    ps, a REPLICATE naming an unknown id or with the wrong size are
    refused with the problem named, and the backup's copy is unchanged;
  - so are SNAPSHOTs (a re-replication's) whose shard is malformed: a
    head that is not JSON, a header longer than the payload, two records
    naming one tensor (found once the head is in, while the tensors are
    still to come: refused after them, the link still in step); one cut
    short by its connection's end leaves the copy as it was too.
Case "train": `quorum launch --mode async --ps-replicas 2` on digits
(2 and 3 ps, SGD and Adam) and on click data with embedding tables trains
as --ps-replicas 1 does, and as the run ends each shard's primary digest
equals its backup's (each ps logs both: "replica digests: ...").
Case "sync_train": `quorum launch --mode sync --ps-replicas 2` (2 and 3 ps,
SGD and Adam, R = N with --init-tokens 0 and R < N; wide-deep on click
data): every shard's backup digest equals its primary's, and an R = N run
ends with the params_digest of the same run on one copy (checked stable
first: the seeded digests).
Failover in place (--ps-replicas 2, async, a ps other than ps 0):
Case "failover_wire": three ps by hand, a raw worker: a push to shard 1
is on ps 1 and its backup ps 2; ps 1 SIGKILLed: ps 0 moves to view 1
and tells the worker unasked (VIEW notice); ps 2 refuses a HELLO of view
0 and one for a shard it does not serve (QR_EVIEW), and the old primary's
replica link; the push resent to ps 2 is answered and applied nowhere
(duplicate_pushes 1, the copy's digest unchanged); the next is applied.
Case "failover_kill": `quorum launch --ps 3 --workers 3 --ps-replicas 2`
on digits, ps 1 SIGKILLed mid-run: exit 0, no rollback, the step target
reached, the accuracy of an unkilled run, and for every shard the pushes
acknowledged to the workers equal those applied on each surviving copy;
the longest stall a worker saw is printed.
Case "failover_stop": the same with ps 1 SIGSTOPped (hung: failed over
after heartbeat-timeout-ms), then SIGCONTed: it fences itself and exits
without serving.
Case "failover_loop": five runs, ps 1 and ps 2 in turn SIGKILLed at a
random moment of each (ps 2's shard then served by ps 0): the counts equal in every run (resent pushes answered by
the duplicate record or applied once).
Case "sync_failover_loop": sync (R = N, --init-tokens 0), ps 0, 1 or 2
SIGKILLed at a random moment of eight runs (3 ps: SGD, Adam, three round
trips; 2 ps: Adam; ps 0 in four of them, its role then taken over by ps
1; four runs, one of each victim, under a sanitizer): exit 0, no
rollback, the params_digest of the same run unkilled; ps 1 SIGSTOPped
(hung) the same, and ps 0; and with 4 ps, ps 0 dying with a step's APPLY
sent to ps 2 and ps 3 only (QUORUM_TEST_COORDINATOR_DIES_AT_STEP): ps 1
learns the step from their answers to its links; and the mirror (sent to
ps 1 alone): ps 1 sends ps 2 and ps 3 the step they missed.
Case "sync_worker_stop": sync, R = N, --init-tokens 0: workers 2 then 1
SIGSTOPped past heartbeat-timeout-ms while worker 1's push-and-pull waits on
ps 0 (2 ps, 3 ps, and three round trips): ps 0 closes their connections,
worker 1 sends its push again; ps 0 answers it as the original (a
duplicate, not "pushed twice"): exit 0, the params_digest of the run unpaused.
Case "rerep": ps 1 killed under `launch --max-restarts 1 --ps-replicas 2`:
its replacement joins as the backup of shards 1 and 0 (re-replication
while training goes on); at the end every shard has two copies with
equal digests, each having applied the pushes acknowledged for it.
Case "rerep_second": then ps 2 killed too, after re-replication: shard 1
is served by the replacement's copy, no rollback.
Case "rerep_chain": 4 ps; ps 2, ps 1 and ps 3 killed in turn, each once
the replacement before holds its copies (ps 1's next, ps 2, is then a
replacement serving shard 1 from its copy, which copies it on). Sync (the
digest of the run unkilled) and async; no rollback, equal copies.
Case "coordinator_backup": ps 1 killed and re-replicated, then ps 0: ps
1's replacement, which serves no shard of its own, takes over (sync and
async), and ps 0's replacement rejoins.
Case "rerep_killed": the replacement killed while its shards are being
copied to it; the next one is copied both, no rollback.
Case "sync_rerep": sync (R = N, --init-tokens 0), ps 1 killed and replaced
(re-replicated with the step in flight: the pushes kept for it forwarded
behind the snapshot), then ps 2 killed once launch says the replacement
holds its copies; SGD and Adam; and ps 2 then ps 1: no rollback, the
params_digest of the same run unkilled, every surviving copy equal.
Case "coordinator_rerep": ps 0 killed under `launch --max-restarts 3`: ps 1
takes its role over and ps 0's replacement, started with --coordinator 1,
rejoins as the backup of shards 0 and 2; it is killed and replaced again,
then worker 1 is killed and restarted (it goes to ps 1 for shard 0). Sync
(the params_digest of the run unkilled) and async; every shard on two
equal copies at the end.
Case "coordinator_second": async; ps 0 killed, ps 1 takes over, ps 0's
replacement rejoins; then ps 1, the coordinator, killed: ps 0's
replacement, which holds shard 0's copy, takes the role back (view 4) and
ps 1's replacement (no --coordinator) rejoins. Sync (the params_digest of
the run unkilled) and async; then async with ps 1 SIGSTOPped: reported
hung by the others, killed by launch, then the same. No rollback, two
equal copies of every shard.
Case "coordinator_both_lost": ps 0 killed, ps 1 takes over, ps 0's
replacement rejoins; then it and ps 2 are killed together (shard 2's both
copies) while ps 1 coordinates: ps 1 stops the run at once, saying why,
and launch starts every task again from the newest checkpoint. Sync (the
params_digest of the run unkilled) and async (its accuracy).
Case "coordinator_lost_joining": ps 0 killed, ps 1 takes over; ps 1
killed while ps 0's replacement is still being copied (ps 2 stopped
meanwhile): nobody can take the role over, and launch starts every task
again from the newest checkpoint. Sync (the params_digest of the run
unkilled) and async (its accuracy).
Case "rerep_rate" (a measurement, not registered in ctest): the copy of
a shard holding a 256 MiB variable, against an AF_UNIX socket's rate
measured in the same run (QR_VICTIM: the ps killed), in a training run;
bench/python/bench_rerep.py measures it at any size, on both transports.

Usage: test_replication.py QUORUM_BINARY wire|train|sync_train|failover_wire|failover_kill|coordinator_kill|coordinator_rerep|coordinator_second|failover_stop|failover_loop|sync_failover_loop|sync_worker_stop|rerep|rerep_second|rerep_killed|rerep_chain|coordinator_backup|sync_rerep|coordinator_both_lost|coordinator_lost_joining|rerep_rate"""

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

from qrtest import (CREATE, HELLO, PULL, PUSH, PUSH_STEP, READY, REPLY, STATS, STATUS, Proc,
                    ReplicaReport, connect, create_meta, end_launch, floats, frame, free_ports,
                    last_json, launch_child_pid, push_meta, read_reply, ready_meta, sanitized,
                    unfloats)

quorum, case = sys.argv[1], sys.argv[2]
REPLICATE, VIEW, SNAPSHOT = 21, 22, 23
SYNC_PUSH, SYNC_STEP = 0x10000, 0x20000
ROLE_WORKER, ROLE_REPLICA, ROLE_WORKER_VIEW = 1, 3, 4
EVIEW = -20
VIEW_NOTICE_ID = 0xffffffff


def request(s, data):
    s.sendall(data)
    return read_reply(s)


def stats(port):
    s = connect(port)
    mtype, _, status, meta, _ = request(s, frame(STATS, 1))
    s.close()
    assert mtype == STATS | REPLY and status == 0, (mtype, status, meta)
    return json.loads(meta)


def shard_digests(port):
    """{(shard, role): digest} of one ps."""
    return {(d["shard"], d["role"]): d["params_digest"] for d in stats(port)["shards"]}


def expect_error(s, data, status_name, text, what):
    mtype, _, status, meta, _ = request(s, data)
    got = STATUS.get(status, status)
    assert str(got) in status_name.split("|") and text in meta.decode(errors="replace"), \
        "%s: got %s %r, wanted %s with %r" % (what, got, meta, status_name, text)
    print("ok: %s refused: %s" % (what, meta.decode(errors="replace")[:160]))


def hello(kind, index, incarnation=7, view=0, shard=0):
    if kind == ROLE_WORKER_VIEW:
        return struct.pack("<IIIQI", ROLE_WORKER_VIEW, index, 0, view, shard)
    if kind == ROLE_REPLICA:
        return struct.pack("<IIIQqQ", ROLE_REPLICA, index, 0, incarnation, -1, 0)
    return struct.pack("<III", kind, index, 0)


def repl_meta(items, fwd, flags=PUSH_STEP, worker=0, seq=1, t=1):
    """items: (var_id, kind, nbytes, lr) records of a REPLICATE."""
    meta = struct.pack("<IIIIqqQQ", flags, worker, seq, len(items), t, 0, fwd, 0)
    for var_id, kind, nbytes, lr in items:
        meta += struct.pack("<IIQf", var_id, kind, nbytes, lr)
    return meta


REPL_LAST_BYTES = 64 * 4 + 64 * 8 + 16 + 8  # repl_last (src/ps/replica.h): one per worker


def snapshot_meta(shard, workers=1):
    return struct.pack("<QIqQI", 1, shard, 0, 0, workers) + bytes(REPL_LAST_BYTES * workers)


def safetensors(header, data=b""):
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def malformed_snapshots_refused(r, p1, rid):
    """SNAPSHOTs of shard 0 on replica link r to p1 that must be refused,
    p1's copy of shard 0 unchanged."""
    backup = shard_digests(p1)[(0, "backup")]
    meta = snapshot_meta(0)
    expect_error(r, frame(SNAPSHOT, rid, meta, struct.pack("<Q", 8) + b"[1,2,3] " + floats([1] * 4)),
                 "EIO", "not a JSON object", "a SNAPSHOT whose head is not JSON")
    expect_error(r, frame(SNAPSHOT, rid + 1, meta, struct.pack("<Q", 1 << 20) + bytes(64)),
                 "EIO", "are not a safetensors file", "a SNAPSHOT whose header outruns it")
    rec = {"name": "w", "id": 1, "lr": 0.1, "options": "", "version": 1, "slots": {}}
    twice = safetensors({"__metadata__": {"quorum.variables": json.dumps([rec, rec]),
                                          "mode": "async"},
                         "w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
                        floats([5, 6, 7, 8]))
    expect_error(r, frame(SNAPSHOT, rid + 2, meta, twice), "EIO",
                 "tensor 'w' is named by two records", "a SNAPSHOT naming one tensor twice")
    assert shard_digests(p1)[(0, "backup")] == backup, "a refused SNAPSHOT changed the copy"
    # cut short: the connection ends in the middle of the tensors
    c = connect(p1)
    assert request(c, frame(HELLO, 1, hello(ROLE_REPLICA, 0)))[2] == 0
    once = safetensors({"__metadata__": {"quorum.variables": json.dumps([rec]),
                                         "mode": "async"},
                        "w": {"dtype": "F32", "shape": [1 << 16], "data_offsets": [0, 1 << 18]}},
                       bytes(1 << 18))
    c.sendall(frame(SNAPSHOT, 2, meta, once)[:-(1 << 17)])
    time.sleep(0.3)
    c.close()
    time.sleep(0.3)
    assert shard_digests(p1)[(0, "backup")] == backup, "a SNAPSHOT cut short changed the copy"
    print("ok: refused or cut short, SNAPSHOTs left the backup's copy unchanged")


def wire_case():
    p0, p1, w0 = free_ports(3)
    cluster = ["--ps_hosts", "127.0.0.1:%d,127.0.0.1:%d" % (p0, p1),
               "--worker_hosts", "127.0.0.1:%d" % w0, "--ps-replicas", "2", "--lr", "0.1",
               "--linger-ms", "500"]
    ps = [Proc([quorum, "ps"] + cluster + ["--job_name", "ps", "--task_index", str(i)])
          for i in range(2)]
    try:
        s = connect(p0)
        assert request(s, frame(HELLO, 1, hello(ROLE_WORKER, 0)))[2] == 0
        status, meta = request(s, frame(CREATE, 2, create_meta([(1, [4], -1.0, "w")]),
                                        floats([1, 2, 3, 4])))[2:4]
        assert status == 0, meta
        assert request(s, frame(READY, 3, ready_meta(1)))[2] == 0

        def pull():
            status, meta, payload = request(s, frame(PULL, 9, struct.pack("<II", 1, 1)))[2:5]
            assert status == 0, meta
            return unfloats(payload)

        def push(seq, rid):
            mtype, _, status, meta, _ = request(
                s, frame(PUSH, rid, push_meta([(1, 16)], worker=0, seq=seq),
                         floats([1, 1, 1, 1]), flags=PUSH_STEP))
            assert mtype == PUSH | REPLY and status == 0, (status, meta)
            return struct.unpack("<q", meta)[0]

        first = push(41, 10)
        after = pull()
        d0, d1 = shard_digests(p0), shard_digests(p1)
        assert d0[(0, "primary")] == d1[(0, "backup")], (d0, d1)
        assert d1[(1, "primary")] == d0[(1, "backup")], (d0, d1)
        print("ok: a push is on both copies: shard 0 %s" % d0[(0, "primary")])

        again = push(41, 11)  # resent: its answer was "lost"
        assert again == first, (again, first)
        assert pull() == after, "a duplicate push was applied again"
        d0b, d1b = shard_digests(p0), shard_digests(p1)
        assert d0b == d0 and d1b == d1, "a duplicate push changed a copy"
        st = stats(p0)
        assert st["duplicate_pushes"] == 1, st
        print("ok: the push resent with the same (worker, seq) was answered with step %d and "
              "applied nowhere; duplicate_pushes 1" % again)
        push(42, 12)
        assert pull() != after, "the next push was not applied"
        assert shard_digests(p0)[(0, "primary")] == shard_digests(p1)[(0, "backup")]
        backup = shard_digests(p1)[(0, "backup")]

        # The backup checks what it gets like any request.
        expect_error(s, frame(REPLICATE, 20, repl_meta([(1, 0, 16, 0.1)], fwd=99),
                              floats([1, 1, 1, 1])),
                     "EINVAL", "REPLICATE comes only on a primary's replica link",
                     "a REPLICATE from a worker")
        h = connect(p1)
        expect_error(h, frame(HELLO, 21, hello(ROLE_REPLICA, 1)), "EINVAL",
                     "this ps backs up ps 0's shard", "a replica link from the wrong ps")
        h.close()
        r = connect(p1)
        assert request(r, frame(HELLO, 22, hello(ROLE_REPLICA, 0)))[2] == 0
        expect_error(r, frame(REPLICATE, 23, repl_meta([(999, 0, 16, 0.1)], fwd=1),
                              floats([1, 1, 1, 1])),
                     "ENOTFOUND|ENOTREADY", "no variable with id 999", "a REPLICATE of an unknown id")
        expect_error(r, frame(REPLICATE, 24, repl_meta([(1, 0, 12, 0.1)], fwd=1),
                              floats([1, 1, 1])),
                     "ESHAPE", "variable 'w' has 4 floats but the item has 12 bytes",
                     "a REPLICATE of the wrong size")
        expect_error(r, frame(REPLICATE, 25, repl_meta([(1, 0, 16, 0.1)], fwd=1),
                              floats([1, float("nan"), 1, 1])),
                     "ENONFINITE", "nothing was applied", "a REPLICATE with NaN")
        # Sync forwards (docs/REPLICATION.md, "A sync step with two copies").
        expect_error(r, frame(REPLICATE, 27, repl_meta([(1, 0, 16, -1.0)], fwd=1,
                                                       flags=SYNC_PUSH | PUSH_STEP),
                              floats([1, 1, 1, 1])),
                     "EINVAL", "unknown flags", "a sync push's REPLICATE with a push's flags")
        expect_error(r, frame(REPLICATE, 28, repl_meta([(1, 0, 16, 0.0)], fwd=1,
                                                       flags=SYNC_STEP),
                              floats([1, 1, 1, 1])),
                     "EINVAL", "a sync step carries one item of kind 3",
                     "a sync step's REPLICATE whose item is a gradient")
        expect_error(r, frame(REPLICATE, 29, repl_meta([(0, 3, 8, 0.0)], fwd=1, flags=SYNC_STEP,
                                                       worker=0, seq=0, t=0),
                              struct.pack("<II", 0, 41)),
                     "EINVAL", "a sync step, but this ps trains in async mode",
                     "a sync step's REPLICATE to an async ps")
        expect_error(r, frame(REPLICATE, 30, repl_meta([(1, 0, 16, -1.0)], fwd=1,
                                                       flags=SYNC_PUSH, t=0),
                              floats([1, 1, 1, 1])),
                     "EINVAL", "a sync push, but this ps trains in async mode",
                     "a sync push's REPLICATE to an async ps")
        expect_error(r, frame(PUSH, 26, push_meta([(1, 16)]), floats([1, 1, 1, 1]),
                              flags=PUSH_STEP),
                     "EPROTO", "a replica link carries CREATE and REPLICATE",
                     "a PUSH on a replica link")
        malformed_snapshots_refused(r, p1, 40)
        r.close()
        assert shard_digests(p1)[(0, "backup")] == backup, "a refused REPLICATE changed the copy"
        print("ok: refused REPLICATEs left the backup's copy unchanged")
        s.close()
    finally:
        for p in ps:
            p.kill()
    print("PASS: wire")


def launch(args, timeout=300, mode="async"):
    proc = Proc([quorum, "launch", "--json", "--quiet", "--mode", mode] + args)
    rc, out, err = proc.wait(timeout=timeout)
    assert rc == 0, "launch %s exited %d\n%s" % (args, rc, err[-4000:])
    return last_json(out), err


def check_copies(err, nps, what):
    """Every shard's primary digest equals its backup's, from the ps's
    last lines."""
    report = ReplicaReport(err, nps)
    primary, backup = {}, {}
    for c in report.copies:
        if c["own"]:
            assert c["shard"] == c["ps"] and c["role"] == "primary", c["line"]
            primary[c["shard"]] = c["digest"]
        else:
            assert c["shard"] == (c["ps"] - 1) % nps and c["role"] == "backup", c["line"]
            backup[c["shard"]] = c["digest"]
    assert sorted(primary) == list(range(nps)) and sorted(backup) == list(range(nps)), \
        "%s: digests of %s / %s\n%s" % (what, primary, backup, err[-3000:])
    for k in range(nps):
        assert primary[k] == backup[k], "%s: shard %d: primary %s, backup %s" % (
            what, k, primary[k], backup[k])
    print("ok: %s: every shard's backup equals its primary (%s)" % (
        what, ", ".join("%d:%s" % (k, primary[k]) for k in range(nps))))


def check_coordinator_copy(err, what):
    """Async: the global step ps 1 holds in its copy of shard 0 (from
    the step pushes forwarded to it) is ps 0's: what a successor
    coordinator would go on from."""
    own = re.findall(r"\[ps 0 pid \d+\] info: the coordinator's global step: (\d+)$", err,
                     re.MULTILINE)
    copy = re.findall(r"\[ps 1 pid \d+\] info: the coordinator's global step, as its shard's "
                      r"forwards tell this copy: (\d+)$", err, re.MULTILINE)
    assert len(own) == 1 and len(copy) == 1, (what, own, copy, err[-3000:])
    assert own == copy and int(own[0]) > 0, (what, own, copy)
    print("ok: %s: ps 1's copy of shard 0 holds ps 0's global step (%s)" % (what, own[0]))


def train_case():
    # The rate decays to 0.3 of itself over the run (about 450 steps), as
    # in test_train.py: at a constant rate an async run ends where its
    # last pushes left it (0.84 once, on a loaded machine).
    digits = ["--data", "digits", "--batch-size", "32", "--seed", "11", "--lr-decay-rate", "0.3",
              "--lr-decay-steps", "450"]
    # Long enough (about 450 steps) that an async run's accuracy no longer
    # swings with the order its pushes happened to take (at 2 epochs Adam
    # gave 0.886 one run and 0.955 the next).
    runs = [("sgd, 2 ps", ["--ps", "2", "--workers", "3", "--lr", "0.1", "--epochs", "10"], 2),
            ("sgd, 3 ps", ["--ps", "3", "--workers", "3", "--lr", "0.1", "--epochs", "10"], 3),
            ("adam, 2 ps", ["--ps", "2", "--workers", "3", "--optimizer", "adam", "--lr",
                            "0.001", "--epochs", "10"], 2)]
    for what, args, nps in runs:
        one, _ = launch(digits + args)
        two, err = launch(digits + args + ["--ps-replicas", "2"])
        check_copies(err, nps, what)
        check_coordinator_copy(err, what)
        # Async runs at a constant rate end where their last pushes left
        # them (0.919 to 0.970 over runs of the same one-copy job): two
        # copies train as well as one, within that spread.
        assert two["test_accuracy"] >= max(0.9, one["test_accuracy"] - 0.08), (
            what, one["test_accuracy"], two["test_accuracy"])
        print("ok: %s: accuracy %.4f with two copies, %.4f with one" % (
            what, two["test_accuracy"], one["test_accuracy"]))
    work = tempfile.mkdtemp(prefix="qr-repl-")
    try:
        data = os.path.join(work, "ctr")
        subprocess.run([quorum, "gen-ctr", "--out", data, "--rows", "20000", "--fields", "8"],
                       check=True, capture_output=True, text=True, timeout=120)
        for model in ("logreg", "wide-deep"):
            args = ["--ps", "2", "--workers", "2", "--data", data, "--model", model,
                    "--optimizer", "adagrad", "--batch-size", "256", "--lr", "0.3",
                    "--epochs", "1"]
            if model == "wide-deep":
                args += ["--hidden", "16"]
            one, _ = launch(args)
            two, err = launch(args + ["--ps-replicas", "2"])
            check_copies(err, 2, model + " (embedding tables)")
            assert abs(two["test_auc"] - one["test_auc"]) < 0.02, (one["test_auc"],
                                                                   two["test_auc"])
            print("ok: %s: AUC %.4f with two copies, %.4f with one" % (
                model, two["test_auc"], one["test_auc"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("PASS: train")


def sync_train_case():
    """Sync steps on two copies: every shard's backup equals its primary,
    and a deterministic run (R = N, --init-tokens 0) ends with the digest of
    the same run on one copy (the seeded digests of docs/SYNC.md)."""
    digits = ["--data", "digits", "--batch-size", "32", "--seed", "11", "--steps", "60"]
    lockstep = ["--init-tokens", "0"]
    runs = [("sgd, 2 ps, R = N", ["--ps", "2", "--workers", "3", "--lr", "0.1"] + lockstep, 2,
             "9f88dbcfbf434da1"),
            ("sgd, 3 ps, R = N", ["--ps", "3", "--workers", "3", "--lr", "0.1"] + lockstep, 3,
             "9f88dbcfbf434da1"),
            ("adam, 2 ps, R = N", ["--ps", "2", "--workers", "3", "--optimizer", "adam", "--lr",
                                   "0.001"] + lockstep, 2, "20388ed0375f08df"),
            ("adam, 3 ps, R = N", ["--ps", "3", "--workers", "3", "--optimizer", "adam", "--lr",
                                   "0.001"] + lockstep, 3, "20388ed0375f08df"),
            # --overlap on: push, token, pull in three round trips (the
            # push's answer waits for the backup), not the held one-trip push.
            ("sgd, 3 ps, R = N, three round trips", ["--ps", "3", "--workers", "3", "--lr",
                                                      "0.1", "--overlap", "on"] + lockstep, 3,
             "9f88dbcfbf434da1"),
            ("sgd, 3 ps, R = 2 of 3", ["--ps", "3", "--workers", "3", "--lr", "0.1",
                                       "--replicas-to-aggregate", "2"], 3, None),
            ("adam, 2 ps, R = 2 of 3", ["--ps", "2", "--workers", "3", "--optimizer", "adam",
                                        "--lr", "0.001", "--replicas-to-aggregate", "2"], 2, None)]
    for what, args, nps, seeded in runs:
        two, err = launch(digits + args + ["--ps-replicas", "2"], mode="sync")
        assert two["global_step"] >= 60, (what, two)
        check_copies(err, nps, what)
        if seeded is None:
            continue  # R < N: which pushes make a step depends on timing
        ones = [launch(digits + args, mode="sync")[0]["params_digest"] for _ in range(2)]
        assert ones == [seeded, seeded], "%s: one copy is not deterministic: %s" % (what, ones)
        assert two["params_digest"] == seeded, "%s: two copies %s, one copy %s" % (
            what, two["params_digest"], seeded)
        print("ok: %s: params_digest %s with two copies, as with one (twice)" % (what, seeded))
    # Sparse rows and embedding tables (reduce_rows on both copies).
    work = tempfile.mkdtemp(prefix="qr-repl-")
    try:
        data = os.path.join(work, "ctr")
        subprocess.run([quorum, "gen-ctr", "--out", data, "--rows", "20000", "--fields", "8"],
                       check=True, capture_output=True, text=True, timeout=120)
        args = ["--ps", "2", "--workers", "2", "--data", data, "--model", "wide-deep",
                "--hidden", "16", "--optimizer", "adagrad", "--batch-size", "256", "--lr", "0.3",
                "--epochs", "1", "--seed", "5", "--init-tokens", "0"]
        one, _ = launch(args, mode="sync")
        two, err = launch(args + ["--ps-replicas", "2"], mode="sync")
        check_copies(err, 2, "wide-deep (embedding tables), sync")
        assert two["params_digest"] == one["params_digest"], (one["params_digest"],
                                                              two["params_digest"])
        print("ok: wide-deep, sync: params_digest %s with two copies, as with one" %
              one["params_digest"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("PASS: sync_train")


def view_record(meta):
    view, nps = struct.unpack("<QI", meta[:12])
    return view, list(struct.unpack("<%dI" % nps, meta[12:12 + 4 * nps]))


def failover_wire_case():
    ports = free_ports(4)
    p = ports[:3]
    cluster = ["--ps_hosts", ",".join("127.0.0.1:%d" % x for x in p),
               "--worker_hosts", "127.0.0.1:%d" % ports[3], "--ps-replicas", "2", "--lr", "0.1",
               "--linger-ms", "500", "--heartbeat-ms", "100", "--heartbeat-timeout-ms", "1000"]
    ps = [Proc([quorum, "ps"] + cluster + ["--job_name", "ps", "--task_index", str(i)])
          for i in range(3)]
    try:
        s0 = connect(p[0])
        assert request(s0, frame(HELLO, 1, hello(ROLE_WORKER_VIEW, 0, view=0, shard=0)))[2] == 0
        s1 = connect(p[1])
        assert request(s1, frame(HELLO, 1, hello(ROLE_WORKER_VIEW, 0, view=0, shard=1)))[2] == 0
        status, meta = request(s1, frame(CREATE, 2, create_meta([(2, [4], -1.0, "v")]),
                                         floats([1, 2, 3, 4])))[2:4]
        assert status == 0, meta
        # READY is answered set only once ps 0 is linked to every ps (as a
        # worker waits for before it trains): a ps killed before ps 0's
        # link has met it is waited for as a restart, not failed over
        deadline = time.time() + 30
        while True:
            status, meta = request(s0, frame(READY, 3, ready_meta(1)))[2:4]
            assert status == 0, meta
            if struct.unpack("<I", meta[:4])[0] or time.time() > deadline:
                break
            time.sleep(0.02)
        assert struct.unpack("<I", meta[:4])[0] == 1, "ps 0 never linked to every ps"

        def push(s, seq, rid):
            mtype, _, status, meta, _ = request(
                s, frame(PUSH, rid, push_meta([(2, 16)], worker=0, seq=seq),
                         floats([1, 1, 1, 1]), flags=PUSH_STEP))
            assert mtype == PUSH | REPLY and status == 0, (status, meta)
            return struct.unpack("<q", meta)[0]

        def pull(s):
            status, meta, payload = request(s, frame(PULL, 9, struct.pack("<II", 1, 2)))[2:5]
            assert status == 0, meta
            return unfloats(payload)

        first = push(s1, 41, 10)
        after = pull(s1)
        copy = shard_digests(p[2])[(1, "backup")]
        assert copy == shard_digests(p[1])[(1, "primary")]
        # ps 1 dies after the push was on both copies and before the
        # worker has its answer (as far as the worker knows).
        ps[1].kill()
        mtype, rid, status, meta, _ = read_reply(s0)  # ps 0 tells the worker unasked
        assert mtype == VIEW | REPLY and rid == VIEW_NOTICE_ID and status == 0, (mtype, rid)
        assert view_record(meta) == (1, [0, 1, 0]), view_record(meta)
        print("ok: ps 1 killed: ps 0 sent the worker view 1 (ps 1 failed) unasked")
        deadline = time.time() + 10
        while stats(p[2]).get("view") != 1:
            assert time.time() < deadline, stats(p[2])
            time.sleep(0.05)
        h = connect(p[2])
        expect_error(h, frame(HELLO, 1, hello(ROLE_WORKER_VIEW, 0, view=0, shard=1)), "-20",
                     "old view 0, now 1", "a worker's HELLO of view 0")
        h.close()
        h = connect(p[2])
        expect_error(h, frame(HELLO, 1, hello(ROLE_WORKER_VIEW, 0, view=1, shard=0)), "-20",
                     "does not serve shard 0", "a HELLO for a shard ps 2 does not serve")
        h.close()
        h = connect(p[2])
        expect_error(h, frame(HELLO, 1, hello(ROLE_REPLICA, 1)), "-20",
                     "its forwards are refused", "the old primary's replica link")
        h.close()
        s2 = connect(p[2])
        mtype, _, status, meta, _ = request(s2, frame(VIEW, 1))
        assert status == 0 and view_record(meta) == (1, [0, 1, 0]), (status, meta)
        assert request(s2, frame(HELLO, 2, hello(ROLE_WORKER_VIEW, 0, view=1, shard=1)))[2] == 0
        again = push(s2, 41, 11)  # the answer was lost with ps 1: resent to the new primary
        assert again == first, (again, first)
        assert pull(s2) == after, "a resent push was applied again on the promoted copy"
        st = stats(p[2])
        shards = {(d["shard"], d["role"]): d for d in st["shards"]}
        assert shards[(1, "promoted")]["params_digest"] == copy, shards
        assert st["duplicate_pushes"] == 1 and shards[(1, "promoted")]["pushes_applied"] == 1, st
        print("ok: the push resent to the promoted ps 2 was answered (step %d) and applied "
              "nowhere: duplicate_pushes 1, the copy's digest %s unchanged" % (again, copy))
        push(s2, 42, 12)
        now = pull(s2)
        assert all(abs(x - (a - 0.1)) < 1e-6 for x, a in zip(now, after)), (now, after)
        st = stats(p[2])
        shards = {(d["shard"], d["role"]): d for d in st["shards"]}
        assert shards[(1, "promoted")]["pushes_applied"] == 2, st
        assert stats(p[0])["backup_failed"] is True
        print("ok: the next push is applied once on the promoted copy; ps 0's shard goes on "
              "without its backup")
        for x in (s0, s1, s2):
            x.close()
    finally:
        for x in ps:
            x.kill()
    print("PASS: failover_wire")


DIGITS = ["--ps", "3", "--workers", "3", "--data", "digits", "--batch-size", "32", "--seed",
          "11", "--lr", "0.1"]


def check_counts(err, nps, failed, what, lost_at_most=0):
    """For every shard, the pushes acknowledged to the workers equal
    those applied on each surviving copy (with --replication-lag, the
    failed shard's copy may lack up to lost_at_most of them). Returns
    (resent, duplicates, the longest stall)."""
    report = ReplicaReport(err, nps)
    assert report.workers == 3, "%s: %d workers reported\n%s" % (what, report.workers,
                                                                err[-3000:])
    assert report.views == {1 if failed is not None else 0}, (report.views, err[-3000:])
    skip = () if failed is None else (failed,)  # a fenced run's last words: not a copy any more
    copies = {}
    for c in report.copies:
        if c["ps"] in skip:
            continue
        copies.setdefault(c["shard"], []).append((c["ps"], c["applied"]))
        if not c["own"]:
            assert (c["role"] == "promoted") == (failed is not None and c["shard"] == failed), \
                c["line"]
    acked = report.acked
    for k in range(nps):
        assert copies.get(k), "%s: no surviving copy of shard %d\n%s" % (what, k, err[-3000:])
        lost = lost_at_most if k == failed else 0
        for ps, applied in copies[k]:
            assert acked[k] - lost <= applied <= acked[k], "%s: shard %d: %d pushes " \
                "acknowledged, %d applied on ps %d (at most %d lost)" % (
                    what, k, acked[k], applied, ps, lost)
    duplicates = report.duplicates(skip)
    print("ok: %s: pushes acknowledged = applied on every surviving copy%s (%s); %d resent, %d "
          "answered as duplicates" % (what, lost_at_most and " (shard %d: up to %d fewer)" % (
              failed, lost_at_most) or "", ", ".join(
              "shard %d: %d on %s" % (k, acked[k], "+".join("ps %d" % ps for ps, _ in copies[k]))
              for k in range(nps)), report.resent, duplicates))
    return report.resent, duplicates, report.stall


class KilledBeforeMet(Exception):
    """The victim died before ps 0's link had ever reached it (the first
    moments of a run, slower under load): ps 0 then waits for it as for a
    ps not started yet, a restart and not a failover (docs/REPLICATION.md,
    "Failover in place"); nothing was trained. A test that draws its
    moment at random draws again."""


def launch_and_signal(args, victim, sig, after, then=None, mode="async"):
    p = Proc([quorum, "launch", "--json", "--quiet", "--mode", mode] + args)
    pid = launch_child_pid(p, "ps", victim)
    time.sleep(after)
    assert p.alive(), "the run ended before the signal"
    t = time.time()
    os.kill(pid, sig)
    if then:
        then(pid)
    rc, out, err = p.wait(300)
    met = re.search(r"^\S+ \[ps 0 pid \d+\] info: linked to ps %d \([^)]*\)$" % (victim or 1),
                    err, re.MULTILINE)
    if rc != 0 and not met:
        raise KilledBeforeMet("ps %d signalled at %.2f s, before ps 0 linked to it" %
                              (victim, after))
    assert rc == 0, "launch %s exited %d\n%s" % (args, rc, err[-4000:])
    # ps 0 fails the others over; ps 0 itself, ps 1 (taking its role)
    assert "quorum launch: ps %d (pid %d) was failed over by ps %d (view 1)" % (
        victim, pid, 1 if victim == 0 else 0) in err, err[-3000:]
    assert "rolling back" not in err and "restarting it" not in err, err[-3000:]
    return last_json(out), err, pid, t


def signal_once_met(args, victim, sig, after):
    """launch_and_signal, with the moment drawn again (up to three times)
    when the signal came before ps 0 had met the victim. `after`: seconds,
    or a function that draws them. Returns its result and the moment."""
    for _ in range(3):
        t = after() if callable(after) else after
        try:
            return launch_and_signal(args, victim, sig, t) + (t,)
        except KilledBeforeMet as e:
            print("again: %s" % e)
    raise AssertionError("three signals in a row came before ps 0 linked to ps %d" % victim)


def failover_kill_case():
    steps = ["--steps", "6000"]
    whole, err = launch(DIGITS + steps + ["--ps-replicas", "2"])
    _, _, calm = check_counts(err, 3, None, "unkilled")
    s, err, pid, _ = launch_and_signal(DIGITS + steps + ["--ps-replicas", "2"], 1, signal.SIGKILL,
                                       1.0)
    assert s["rollbacks"] == 0 and s["global_step"] >= 6000, s
    assert s["test_accuracy"] >= whole["test_accuracy"] - 0.03, (s, whole)
    assert "[ps 2 pid" in err and "this ps serves ps 1's shard now" in err, err[-3000:]
    _, _, stall = check_counts(err, 3, 1, "ps 1 killed")
    print("STALL: ps 1 SIGKILLed: the longest push a worker waited for was %.3f s (%.3f s in "
          "the unkilled run)" % (stall, calm))
    print("PASS: failover_kill: ps 1 killed, no rollback, step %d, accuracy %.4f (unkilled "
          "%.4f)" % (s["global_step"], s["test_accuracy"], whole["test_accuracy"]))


def coordinator_kill_case():
    """ps 0, the coordinator, SIGKILLed mid-run (async, no
    --checkpoint-dir): ps 1, which holds the copy of its shard and with it
    the global step, takes the coordinator's role (links to the other ps,
    the view, the workers' heartbeats, the stop): no rollback, no restart,
    the run ends in order, every acknowledged push is on every surviving
    copy, and the accuracy is an unkilled run's."""
    steps = ["--steps", "6000"]
    args = DIGITS + steps + ["--ps-replicas", "2"]
    whole, err = launch(args)
    _, _, calm = check_counts(err, 3, None, "unkilled")
    moments = iter((1.0, 2.0, 3.0))  # later each time ps 0 dies before it met every ps
    s, err, pid, _, _ = signal_once_met(args, 0, signal.SIGKILL, lambda: next(moments))
    took = re.findall(r"\[ps 1 pid \d+\] warn: ps 0 \([^)]*\), the coordinator, is gone .*"
                      r"coordinates the cluster from now on, at global step (\d+)$", err,
                      re.MULTILINE)
    assert len(took) == 1 and int(took[0]) > 0, err[-3000:]
    assert "ps 1 (" in err and "coordinates the cluster from now on: ps 0" in err, err[-3000:]
    # The chief tells the new coordinator the run's last step (READY again).
    assert re.search(r"\[ps 1 pid \d+\] info: the chief says the run ends at global step "
                     r"6000$", err, re.MULTILINE), err[-3000:]
    assert "rolling back" not in err and "restarting it" not in err, err[-3000:]
    assert s["rollbacks"] == 0 and s["global_step"] >= 6000, s
    assert s["test_accuracy"] >= whole["test_accuracy"] - 0.03, (s, whole)
    _, _, stall = check_counts(err, 3, 0, "ps 0 killed")
    print("STALL: ps 0 SIGKILLed: the longest push a worker waited for was %.3f s (%.3f s in "
          "the unkilled run)" % (stall, calm))
    print("ok: ps 0 killed at global step %s, ps 1 coordinated the rest: no rollback, step %d, "
          "accuracy %.4f (unkilled %.4f)" % (took[0], s["global_step"], s["test_accuracy"],
                                             whole["test_accuracy"]))
    # A stopped ps 0 still accepts connections, so ps 1 does not take it
    # for dead; the other ps report it hung, `quorum launch` kills it, and
    # the takeover follows.
    timeout = 1500
    s, err, pid, _ = launch_and_signal(args + ["--heartbeat-timeout-ms", str(timeout)], 0,
                                       signal.SIGSTOP, 1.0)
    assert "quorum launch: ps 0 (pid %d) is hung" % pid in err, err[-3000:]
    assert s["rollbacks"] == 0 and s["global_step"] >= 6000, s
    assert s["test_accuracy"] >= whole["test_accuracy"] - 0.03, (s, whole)
    _, _, stopped = check_counts(err, 3, 0, "ps 0 stopped")
    print("STALL: ps 0 SIGSTOPped (heartbeat-timeout-ms %d): the longest push a worker waited "
          "for was %.3f s" % (timeout, stopped))
    print("PASS: coordinator_kill: ps 0 killed, then stopped: ps 1 took over both times, no "
          "rollback")


def lag_case():
    """--replication-lag: a push is answered before its backup has it
    (counted by each ps), the copies still end equal, and a primary
    killed mid-run loses at most that many acknowledged pushes of its
    shard: no rollback, training goes on."""
    lag = 16
    args = DIGITS + ["--steps", "6000", "--ps-replicas", "2", "--replication-lag", str(lag)]
    whole, err = launch(args)
    check_copies(err, 3, "lag %d, unkilled" % lag)
    check_counts(err, 3, None, "lag %d, unkilled" % lag)
    ahead = re.findall(r"\[ps \d+ pid \d+\] info: replication-lag %d: (\d+) pushes answered "
                       r"before the backup had applied them, at most (\d+) forwards behind" % lag,
                       err)
    assert len(ahead) == 3, err[-3000:]
    assert sum(int(n) for n, _ in ahead) > 0, "no push was answered ahead of its backup: %s" % (
        ahead,)
    assert all(int(behind) <= lag for _, behind in ahead), ahead
    print("ok: lag %d, unkilled: %s pushes answered before the backup had them (at most %s "
          "forwards behind)" % (lag, "+".join(n for n, _ in ahead),
                                max(int(b) for _, b in ahead)))
    s, err, _, _, _ = signal_once_met(args, 1, signal.SIGKILL, 1.0)
    assert s["rollbacks"] == 0 and s["global_step"] >= 6000, s
    assert s["test_accuracy"] >= whole["test_accuracy"] - 0.03, (s, whole)
    assert "replication-lag %d: ps 1 may have acknowledged up to %d pushes" % (lag, lag) in err, \
        err[-3000:]
    report = ReplicaReport(err, 3)
    survivor = [c["applied"] for c in report.held(1, skip=(1,))]
    check_counts(err, 3, 1, "lag %d, ps 1 killed" % lag, lost_at_most=lag)
    print("ok: lag: ps 1 killed, no rollback, step %d, accuracy %.4f (unkilled %.4f); shard 1: "
          "%d pushes acknowledged, %s applied on its surviving copy" % (
              s["global_step"], s["test_accuracy"], whole["test_accuracy"], report.acked[1],
              survivor))
    # ps 1 killed while its backup, ps 2, is stopped: ps 1 answers pushes
    # ahead of a backup that takes none (until ps 2's own shard, stopped
    # too, holds the workers up), and its forwards of them (the first
    # layer partitioned over the 3 ps: about 85 KB a shard, more than the
    # socket holds) die with it: acknowledged pushes may be lost (0 to 2
    # in runs here), and the bound must hold.
    wide = args + ["--hidden", "1024", "--partition-min-mb", "0.05"]
    for _ in range(3):
        p = Proc([quorum, "launch", "--json", "--quiet", "--mode", "async"] + wide)
        victim, backup = launch_child_pid(p, "ps", 1), launch_child_pid(p, "ps", 2)
        time.sleep(1.0)
        os.kill(backup, signal.SIGSTOP)
        time.sleep(0.3)
        os.kill(victim, signal.SIGKILL)
        time.sleep(0.1)
        os.kill(backup, signal.SIGCONT)
        rc, out, err = p.wait(300)
        if rc == 0 or re.search(r"\[ps 0 pid \d+\] info: linked to ps 1 \(", err):
            break
        print("again: ps 1 was killed before ps 0 linked to it")
    assert rc == 0, "launch exited %d\n%s" % (rc, err[-4000:])
    s = last_json(out)
    assert s["rollbacks"] == 0 and s["global_step"] >= 6000, s
    check_counts(err, 3, 1, "lag %d, ps 1 killed, its backup stopped" % lag, lost_at_most=lag)
    report = ReplicaReport(err, 3)
    survivor = [c["applied"] for c in report.held(1, skip=(1,))]
    print("PASS: lag: ps 1 killed while its backup was stopped: shard 1: %d pushes acknowledged, "
          "%s applied on its surviving copy (%d lost; at most %d may be); accuracy %.4f" % (
              report.acked[1], survivor, report.acked[1] - min(survivor), lag,
              s["test_accuracy"]))


def failover_stop_case():
    timeout_ms = 1000
    # Long enough that ps 1 is resumed while the others still train (8000
    # steps once ended 1.5 s after the failover, before the resume, on a
    # quiet machine: the resumed ps then had nothing left to fence itself for).
    args = DIGITS + ["--steps", "30000", "--ps-replicas", "2", "--heartbeat-ms", "200",
                     "--heartbeat-timeout-ms", str(timeout_ms)]

    def resume(pid):
        time.sleep(timeout_ms / 1e3 + 1.5)  # declared hung and failed over meanwhile
        os.kill(pid, signal.SIGCONT)

    s, err, pid, _ = launch_and_signal(args, 1, signal.SIGSTOP, 1.0, resume)
    assert s["rollbacks"] == 0 and s["global_step"] >= 30000, s
    assert "ps 1 (" in err and "is hung (no answer to heartbeats" in err, err[-3000:]
    assert "[ps 1 pid %d] error: ps 1 did not run for" % pid in err, err[-3000:]
    assert "is hung: " not in err, "launch killed the failed-over ps"
    assert not os.path.exists("/proc/%d" % pid) or \
        open("/proc/%d/stat" % pid).read().split()[2] == "Z", "the fenced ps still runs"
    _, _, stall = check_counts(err, 3, 1, "ps 1 stopped")
    print("STALL: ps 1 SIGSTOPped (heartbeat-timeout-ms %d): the longest push a worker waited "
          "for was %.3f s" % (timeout_ms, stall))
    print("PASS: failover_stop: the stopped ps was failed over, and once resumed it fenced "
          "itself and exited without serving")


def failover_loop_case(runs=5):
    rng = random.Random(int(os.environ.get("QR_SEED", time.time())))
    resent = duplicates = 0
    stalls = []
    for i in range(runs):
        # (12000 steps: about 4 s of training here, so that a kill drawn
        # up to 1.5 s in lands while the workers still push; at 4000 a run
        # once ended first and nothing was failed over)
        victim = 1 + i % 2  # ps 2's copy is on ps 0
        s, err, _, _, after = signal_once_met(
            DIGITS + ["--steps", "12000", "--ps-replicas", "2"], victim, signal.SIGKILL,
            lambda: rng.uniform(0.3, 1.5))
        assert s["rollbacks"] == 0 and s["global_step"] >= 12000, s
        r, d, stall = check_counts(err, 3, victim, "run %d, ps %d killed at %.2f s" % (
            i + 1, victim, after))
        resent += r
        duplicates += d
        stalls.append(stall)
    print("STALL: longest pushes over %d kills: %s s" % (runs, ", ".join(
        "%.3f" % x for x in stalls)))
    print("PASS: failover_loop: %d kills, counts equal in each; %d pushes resent, %d answered "
          "as duplicates" % (runs, resent, duplicates))


def sync_failover_loop_case():
    """Sync, R = N, --init-tokens 0: ps 0, 1 or 2 SIGKILLed at a random
    moment of each run; its copy takes over the step in flight (ps 1 the
    coordinator's role too, for ps 0): exit 0, no rollback, and the
    params_digest of the same run unkilled."""
    rng = random.Random(int(os.environ.get("QR_SEED", time.time())))
    base = ["--workers", "3", "--init-tokens", "0", "--data", "digits", "--batch-size", "32",
            "--seed", "11", "--steps", "3000", "--ps-replicas", "2"]
    # The one-trip push (held: HELD after the backup has it) with SGD and
    # Adam, and the three round trips (--overlap on: the push's answer
    # waits for the backup, then the commit); 3 ps, and 2 (ps 1's copy on
    # ps 0).
    kinds = [("sgd, 3 ps", ["--ps", "3", "--lr", "0.1"]),
             ("adam, 3 ps", ["--ps", "3", "--optimizer", "adam", "--lr", "0.001"]),
             ("sgd, 3 ps, three round trips", ["--ps", "3", "--lr", "0.1", "--overlap", "on"]),
             ("adam, 2 ps", ["--ps", "2", "--optimizer", "adam", "--lr", "0.001"])]
    # ps 2's copy, and ps 1's of 2, are on ps 0; ps 0's is on ps 1, which
    # then coordinates (both the one-trip push and the three round trips,
    # whose worker commits again when its TOKEN's connection is lost)
    plan = [(0, 1), (1, 2), (2, 0), (3, 0), (0, 0), (1, 0), (2, 1), (3, 1)]
    if sanitized(quorum):
        # Under the sanitizers each run takes three times as long: one
        # kill of each victim, ps 0 with both push protocols (the plain
        # build runs the whole plan).
        plan = [(0, 1), (3, 0), (2, 0), (1, 2)]
    whole = {}
    for what, extra in [kinds[k] for k in sorted({k for k, _ in plan})]:
        runs_whole = [launch(base + extra, mode="sync")[0]["params_digest"]
                      for _ in range(1 if sanitized(quorum) else 2)]
        assert len(set(runs_whole)) == 1, (what, runs_whole)
        whole[what] = runs_whole[0]
    runs = len(plan)
    for i, (kind, victim) in enumerate(plan):
        what, extra = kinds[kind]
        for _ in range(3):
            after = rng.uniform(0.1, 2.5)
            try:
                s, err, pid, _ = launch_and_signal(base + extra, victim, signal.SIGKILL, after,
                                                   mode="sync")
                break
            except KilledBeforeMet as e:
                print("again: %s" % e)
        else:
            raise AssertionError("three kills in a row came before ps 0 linked to the victim")
        assert s["rollbacks"] == 0 and s["global_step"] == 3000, s
        assert s["params_digest"] == whole[what], "run %d (%s), ps %d killed at %.2f s: " \
            "digest %s, unkilled %s\n%s" % (i + 1, what, victim, after, s["params_digest"],
                                            whole[what], err[-3000:])
        assert "this ps serves ps %d's shard now" % victim in err, err[-3000:]
        if victim == 0:
            assert re.search(r"\[ps 1 pid \d+\] warn: ps 0 \([^)]*\), the coordinator, is "
                             r"gone .* coordinates the cluster from now on", err), err[-3000:]
        print("ok: run %d (%s): ps %d killed at %.2f s: params_digest %s as unkilled, no "
              "rollback" % (i + 1, what, victim, after, s["params_digest"]))
    # Hung, not dead: ps 1 SIGSTOPped is failed over at heartbeat-timeout-ms,
    # and fences itself once resumed.
    what, extra = kinds[0]

    def resume(pid):
        time.sleep(2.5)
        os.kill(pid, signal.SIGCONT)

    s, err, pid, _ = launch_and_signal(base + extra + ["--heartbeat-ms", "200",
                                                       "--heartbeat-timeout-ms", "1000"],
                                       1, signal.SIGSTOP, 0.3, resume, mode="sync")
    assert s["rollbacks"] == 0 and s["params_digest"] == whole[what], (s, whole[what],
                                                                      err[-3000:])
    assert "is hung (no answer to heartbeats" in err, err[-3000:]
    print("ok: ps 1 SIGSTOPped: failed over when hung, params_digest %s as unkilled" %
          s["params_digest"])
    # ps 0 hung: the other ps report it, `quorum launch` kills it, and ps 1
    # takes its role over with the step in flight.
    s, err, pid, _ = launch_and_signal(base + extra + ["--heartbeat-ms", "200",
                                                       "--heartbeat-timeout-ms", "1000"],
                                       0, signal.SIGSTOP, 0.8, mode="sync")
    assert "quorum launch: ps 0 (pid %d) is hung" % pid in err, err[-3000:]
    assert s["rollbacks"] == 0 and s["params_digest"] == whole[what], (s, whole[what],
                                                                      err[-3000:])
    print("ok: ps 0 SIGSTOPped: killed by launch when hung, ps 1 took its role over, "
          "params_digest %s as unkilled" % s["params_digest"])
    # The race a random kill rarely hits: ps 0 sends a step's APPLY to ps 2
    # and ps 3 but not yet to ps 1, its successor, and dies (a fault the
    # ps takes from the environment). ps 2 applies the step and answers
    # its pushes (its backup, ps 3, has it), so no HELD of them comes
    # again; its answer to ps 1's link names the step and its members,
    # and ps 1 applies it everywhere rather than wait for them.
    four = base + ["--ps", "4", "--lr", "0.1"]
    unkilled = launch(four, mode="sync")[0]["params_digest"]
    p = Proc([quorum, "launch", "--json", "--quiet", "--mode", "sync", "--sync-timeout-ms",
              "60000"] + four, env=dict(os.environ, QUORUM_TEST_COORDINATOR_DIES_AT_STEP="500"))
    rc, out, err = p.wait(300)
    assert rc == 0, err[-4000:]
    assert "step 500's APPLY sent to every ps but ps 1; this ps dies now" in err, err[-3000:]
    assert re.search(r"\[ps 1 pid \d+\] warn: ps [23] has applied step 500, which the shards "
                     r"here had not: applying it everywhere", err), err[-3000:]
    s = last_json(out)
    assert s["rollbacks"] == 0 and s["params_digest"] == unkilled, (s, unkilled)
    print("ok: ps 0 died with step 500's APPLY sent to ps 2 and 3 only: ps 1 learnt the step "
          "from them, params_digest %s as unkilled" % unkilled)
    # The mirror: ps 0 sends step 500's APPLY to ps 1 alone and dies once
    # ps 1 has both its shards at 501. ps 2 and 3 are still at 500, their
    # pushes of it held; ps 1, gathering 501, sends each the APPLY of 500
    # with its members (before, the run stalled at step 501 until
    # sync-timeout-ms).
    p = Proc([quorum, "launch", "--json", "--quiet", "--mode", "sync", "--sync-timeout-ms",
              "60000"] + four, env=dict(os.environ, QUORUM_TEST_COORDINATOR_DIES_AT_STEP="500:mirror"))
    rc, out, err = p.wait(300)
    assert rc == 0, err[-4000:]
    assert "step 500 applied on ps 1's shards, its APPLY sent to no other ps" in err, err[-3000:]
    for k in (2, 3):
        assert re.search(r"\[ps 1 pid \d+\] warn: ps %d's shard has not applied step 500, which "
                         r"the shards here have" % k, err), err[-3000:]
        assert re.search(r"\[ps 1 pid \d+\] info: ps %d has applied step 500, which its shard "
                         r"had missed" % k, err), err[-3000:]
    s = last_json(out)
    assert s["rollbacks"] == 0 and s["params_digest"] == unkilled, (s, unkilled)
    print("ok: ps 0 died with step 500's APPLY sent to ps 1 only: ps 1 sent it to ps 2 and 3, "
          "params_digest %s as unkilled" % unkilled)
    print("PASS: sync_failover_loop: %d kills at random moments, two stops and the APPLY race "
          "both ways, the digest of an unkilled run in each" % runs)


def sync_worker_stop_case():
    """Sync, R = N, --init-tokens 0, two copies and one: worker 1 SIGSTOPped past
    heartbeat-timeout-ms while its push-and-pull waits on ps 0 (worker 2
    stopped 0.3 s before it, so that the step cannot complete meanwhile):
    ps 0 declares both hung and closes their connections; resumed, worker 1
    sends its push again to ps 0, which keeps it already: answered as the
    original (a duplicate), not refused as pushed twice. The run ends with
    the params_digest of the same run unpaused."""
    base = ["--workers", "3", "--init-tokens", "0", "--data", "digits", "--batch-size", "32",
            "--seed", "11", "--steps", "4000", "--heartbeat-ms", "200",
            "--heartbeat-timeout-ms", "1000", "--sync-timeout-ms", "60000"]
    # Not the three round trips (--overlap on): there what waits on ps 0 is
    # the TOKEN request, sent again as any request is; a token ps 0 had
    # answered on the connection it closed is lost with it, and the
    # request sent again waits for the next step's, which needs this
    # worker's gradient: the step stalls until sync-timeout-ms (once in a
    # few runs here). Not built yet: ps 0 would answer a repeated TOKEN with
    # the token it last gave that worker (docs/REPLICATION.md).
    # One copy (--ps-replicas 1): the worker sends its sync push again as
    # well (link.c), and the ps knows it the same way; before, the push was
    # dropped ("push of step N lost") and the step waited for it until
    # sync-timeout-ms ended the run. One copy logs no push counts.
    two = ["--ps-replicas", "2"]
    kinds = [("sgd, 2 ps", ["--ps", "2", "--lr", "0.1"] + two, True),
             ("sgd, 3 ps", ["--ps", "3", "--lr", "0.1"] + two, True),
             ("sgd, 2 ps, one copy", ["--ps", "2", "--lr", "0.1", "--ps-replicas", "1"], False)]
    for what, extra, held in kinds:
        whole = launch(base + extra, mode="sync")[0]["params_digest"]
        p = Proc([quorum, "launch", "--json", "--quiet", "--mode", "sync"] + base + extra)
        stopped = []
        try:
            stopped = [launch_child_pid(p, "worker", 2), launch_child_pid(p, "worker", 1)]
            time.sleep(1.5)
            assert p.alive(), "%s: the run ended before the stop" % what
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.3)
            time.sleep(1.7)  # worker 1 silent 2 s: past heartbeat-timeout-ms
        except BaseException:
            p.kill()
            raise
        finally:
            for pid in stopped:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        rc, out, err = p.wait(timeout=240)
        assert rc == 0, "%s: launch exited %d\n%s" % (what, rc, err[-4000:])
        s = last_json(out)
        assert "worker 1 sent no heartbeat" in err and "its connections closed" in err, \
            "%s: worker 1 was not declared hung\n%s" % (what, err[-3000:])
        assert "pushed twice" not in err and "held already" not in err, err[-3000:]
        assert not re.search(r"push of step \d+ lost", err), "%s: a push dropped\n%s" % (
            what, err[-3000:])
        resent = sum(int(n) for n in re.findall(r"resent after a lost connection: (\d+)", err))
        duplicates = sum(int(n) for n in re.findall(r"(\d+) duplicate pushes", err))
        assert not held or (resent >= 1 and duplicates >= 1), "%s: %d resent, %d duplicates\n%s" % (
            what, resent, duplicates, err[-3000:])
        assert s["global_step"] == 4000 and s["rollbacks"] == 0, (what, s)
        assert s["params_digest"] == whole, "%s: digest %s, unpaused %s\n%s" % (
            what, s["params_digest"], whole, err[-3000:])
        print("ok: %s: workers 2 and 1 declared hung, %d push(es) resent, %d answered as "
              "duplicates, params_digest %s as unpaused" % (what, resent, duplicates, whole))
    print("PASS: sync_worker_stop")


def check_rereplicated(err, nps, gone, what, worker_killed=False):
    """Every shard has two copies on the ps still running (none on the
    `gone` ps), their digests equal, and each copy applied the pushes
    the workers were acknowledged for that shard (worker_killed: at
    least those the workers that ended reported, and the same number on
    both copies: a killed worker's acknowledged pushes die with it)."""
    report = ReplicaReport(err, nps)
    acked = report.acked
    copies = {k: [(c["ps"], c["role"], c["digest"], c["applied"]) for c in report.held(k, gone)]
              for k in range(nps)}
    for k in range(nps):
        held = copies[k]
        serving = [c for c in held if c[1] in ("primary", "promoted")]
        assert len(serving) == 1, "%s: shard %d served by %s\n%s" % (what, k, held, err[-3000:])
        assert len({c[2] for c in held}) == 1, "%s: shard %d: digests differ: %s" % (
            what, k, held)
        assert len({c[3] for c in held}) == 1, "%s: shard %d: applied counts differ: %s" % (
            what, k, held)
        for ps, role, digest, applied in held:
            assert applied == acked[k] or (worker_killed and applied > acked[k]), \
                "%s: shard %d: %d pushes acknowledged, %d applied on ps %d (%s)" % (
                    what, k, acked[k], applied, ps, role)
    print("ok: %s: %s" % (what, "; ".join(
        "shard %d: %s, digest %s, %d pushes" % (
            k, " + ".join("ps %d %s" % (c[0], c[1]) for c in copies[k]), copies[k][0][2],
            acked[k]) for k in range(nps))))
    return {k: len(copies[k]) for k in range(nps)}


def launch_and_kill(args, kills):
    """A launch run; kills: [(ps, seconds after the previous kill, or
    after the start)]. The pids killed."""
    p = Proc([quorum, "launch", "--json", "--quiet", "--mode", "async"] + args)
    pids = []
    for victim, after in kills:
        pid = launch_child_pid(p, "ps", victim)
        while pid in pids:  # the replacement is not started yet
            time.sleep(0.05)
            pid = launch_child_pid(p, "ps", victim)
        time.sleep(after)
        assert p.alive(), "the run ended before ps %d was killed" % victim
        os.kill(pid, signal.SIGKILL)
        pids.append(pid)
    rc, out, err = p.wait(300)
    assert rc == 0, "launch %s exited %d\n%s" % (args, rc, err[-4000:])
    return last_json(out), err, pids


def rerep_case():
    args = DIGITS + ["--steps", "20000", "--ps-replicas", "2", "--max-restarts", "1"]
    s, err, (pid,) = launch_and_kill(args, [(1, 1.0)])
    assert s["rollbacks"] == 0 and s["global_step"] >= 20000, s
    assert "rolling back" not in err, err[-3000:]
    assert "quorum launch: ps 1 (pid %d) was failed over by ps 0 (view 1)" % pid in err, \
        err[-3000:]
    assert "quorum launch: ps 1 (failed over) has exited; starting a replacement" in err, \
        err[-3000:]
    assert "it rejoins as a backup (view 2)" in err, err[-3000:]
    assert "re-replication complete: ps 1 holds copies of shard 1 (served by ps 2) and of " \
        "shard 0: both on two copies again (view 3)" in err, err[-3000:]
    assert "quorum launch: ps 1 holds copies of its shards again (view 3)" in err, err[-3000:]
    held = check_rereplicated(err, 3, set(), "ps 1 killed and replaced")
    assert held == {0: 2, 1: 2, 2: 2}, held
    print("PASS: rerep: the replacement of ps 1 was copied shards 1 and 0 while training went "
          "on; every shard on two equal copies at the end, no rollback")


def rerep_second_case():
    """After re-replication, a second failure (ps 2, which serves shard 1
    and its own) is survived as the first: shard 1 is served by its copy
    on the replacement, shard 2 by ps 0."""
    args = DIGITS + ["--steps", "24000", "--ps-replicas", "2", "--max-restarts", "1"]
    s, err, (_, pid2) = launch_and_kill(args, [(1, 1.0), (2, 2.5)])
    assert s["rollbacks"] == 0 and s["global_step"] >= 24000, s
    assert "rolling back" not in err, err[-3000:]
    done = err.find("re-replication complete: ps 1 holds")
    second = err.find("quorum launch: ps 2 (pid %d) was failed over by ps 0" % pid2)
    assert 0 <= done < second, "re-replication was not complete before the second kill\n" + \
        err[-4000:]
    assert "view 4: this ps serves ps 2's shard now" in err, err[-3000:]
    assert "view 4: shard 1 is served by ps 1" in err, err[-3000:]
    held = check_rereplicated(err, 3, {2}, "ps 1 replaced, then ps 2 killed")
    assert held == {0: 2, 1: 1, 2: 1}, held
    print("PASS: rerep_second: after re-replication, ps 2's failure was survived as the first "
          "(shard 1 served by the replacement's copy), no rollback")


@contextlib.contextmanager
def killed_on_error(p, log):
    """The launcher p (its log file `log`) killed, and the log closed, if
    what the block does to its tasks fails."""
    try:
        yield
    except BaseException:
        p.kill()
        log.close()
        raise


def kill_in_turn(nps, victims, what):
    """`quorum launch --ps NPS --max-restarts 3`, sync (R = N,
    --init-tokens 0) then async: each ps of `victims` SIGKILLed in turn,
    each once the replacement before holds its copies. Sync ends on the
    params_digest of the run unkilled, async at its accuracy; no rollback,
    every shard on two equal copies with the pushes acknowledged for it.
    Returns each mode's log."""
    base = ["--ps", str(nps), "--workers", "3", "--data", "digits", "--batch-size", "32",
            "--seed", "11", "--lr", "0.1", "--ps-replicas", "2"]
    logs = {}
    for mode, extra in (("sync", ["--init-tokens", "0", "--steps", "3000"]),
                        ("async", ["--steps", "40000"])):
        whole, _ = launch(base + extra, mode=mode)
        log = tempfile.NamedTemporaryFile("w+", prefix="qr-kill-in-turn-", suffix=".log")
        p = Proc([quorum, "launch", "--json", "--quiet", "--mode", mode, "--max-restarts", "3"] +
                 base + extra, stderr=log)
        wait_log = log_waiter(p, log.name, mode)
        killed, coordinator, by, times = {}, 0, {}, {}
        with killed_on_error(p, log):
            wait_log(r"\[ps 0 pid \d+\] info: linked to ps %d" % (nps - 1))
            time.sleep(0.3)
            for k in victims:
                killed[k] = launch_child_pid(p, "ps", k)
                # The coordinator is failed over by the ps holding shard 0's copy.
                if k == coordinator:
                    coordinator = 1 - coordinator
                by[k] = coordinator
                os.kill(killed[k], signal.SIGKILL)
                times[k] = times.get(k, 0) + 1
                wait_log(re.escape("quorum launch: ps %d holds copies of its shards again" % k),
                         times[k])
        s, err = end_launch(p, log, mode)
        assert "does not hold its copies" not in err, err[-3000:]
        for k in victims:
            assert "quorum launch: ps %d (pid %d) was failed over by ps %d" % (
                k, killed[k], by[k]) in err, err[-3000:]
        held = check_rereplicated(err, nps, set(), "%s: %s" % (mode, what))
        assert held == {k: 2 for k in range(nps)}, held
        print("ok: %s: %s, each re-replicated: no rollback, %s" % (
            mode, what, check_as_unkilled(mode, s, whole)))
        logs[mode] = err
    return logs


def rerep_chain_case():
    """4 ps: ps 2 killed and replaced (a BACKUP: shard 2 is served by ps
    3); ps 1 killed: ps 2, a replacement itself, serves shard 1 from its
    copy and copies it to ps 1's replacement (before, ps 0 did not take a
    replacement whose next ps was a BACKUP: it waited restart-wait-ms for
    nothing, and once ps 0 had ended the run it took the coordinator's
    role over with an empty copy of shard 0); then ps 3 killed: ps 2
    serves its own shard again, ps 0 shard 3."""
    logs = kill_in_turn(4, [2, 1, 3], "ps 2, then ps 1 (its next a replacement), then ps 3 "
                        "killed")
    for err in logs.values():
        assert re.search(r"view 4: this ps serves ps 1's shard now", err), err[-3000:]
        assert re.search(r"\[ps 2 pid \d+\] info: re-replication of shard 1 to ps 1: snapshot "
                         r"taken", err), err[-3000:]
    print("PASS: rerep_chain")


def coordinator_backup_case():
    """3 ps: ps 1 killed and replaced (a BACKUP: shard 1 is served by ps
    2, shard 0's copy is on the replacement); then ps 0, the coordinator,
    killed: ps 1's replacement takes the role over though it serves no
    shard of its own (sync: its steps' own part applied by ps 2 and
    forwarded to it, coord.c start_apply; before, it did not take over in
    sync mode and the run ended with an error, 2 runs of 12 in a
    double-kill trial), and ps 0's replacement rejoins."""
    logs = kill_in_turn(3, [1, 0], "ps 1, then ps 0 (ps 1's replacement took over) killed")
    for err in logs.values():
        assert re.search(r"\[ps 1 pid \d+\] warn: ps 0 \([^)]*\), the coordinator, is gone",
                         err), err[-3000:]
    print("PASS: coordinator_backup")


def rerep_killed_case():
    """The replacement of ps 1 killed while its shards are being copied to
    it (its snapshot taken, not yet loaded: a 4 MB layer makes that take
    a while): nothing is lost, ps 0 takes the next run at that address as
    a new replacement, and the copy starts over; at the end every shard
    is on two equal copies, each holding every acknowledged push, with no
    rollback."""
    args = DIGITS + ["--hidden", "1024,1024", "--lr", "0.01", "--steps", "4000",
                     "--ps-replicas", "2", "--max-restarts", "2"]
    log = tempfile.NamedTemporaryFile("w+", prefix="qr-rerep-killed-", suffix=".log")
    p = Proc([quorum, "launch", "--json", "--quiet", "--mode", "async"] + args, stderr=log)
    try:
        first = launch_child_pid(p, "ps", 1)
        time.sleep(1.5)
        os.kill(first, signal.SIGKILL)
        deadline = time.time() + 120
        while "re-replication of shard" not in open(log.name).read():  # a source took its snapshot
            assert time.time() < deadline and p.alive(), open(log.name).read()[-3000:]
            time.sleep(0.005)
        second = launch_child_pid(p, "ps", 1)
        assert second != first
        os.kill(second, signal.SIGKILL)
        loaded_before_kill = open(log.name).read().count("has loaded the snapshot")
        try:  # (under a sanitizer on 2 loaded cores this run took 195 s)
            rc, out, _ = p.wait(450)
        except AssertionError as e:  # its stderr is the log: show where it stopped
            raise AssertionError("%s\nlog:\n%s" % (e, open(log.name).read()[-6000:])) from None
    finally:
        p.kill()
    err = open(log.name).read()
    log.close()
    assert rc == 0, "launch exited %d\n%s" % (rc, err[-4000:])
    s = last_json(out)
    assert s["rollbacks"] == 0 and "rolling back" not in err, (s, err[-3000:])
    assert err.count("it rejoins as a backup") >= 2, err[-4000:]
    assert "re-replication complete: ps 1 holds copies of shard 1 (served by ps 2) and of " \
        "shard 0: both on two copies again" in err, err[-3000:]
    held = check_rereplicated(err, 3, set(), "ps 1's replacement killed while being copied")
    assert held == {0: 2, 1: 2, 2: 2}, held
    print("PASS: rerep_killed: the replacement killed with %d of 2 snapshots loaded; the next "
          "one was copied both shards, every shard on two equal copies, no rollback"
          % loaded_before_kill)


def log_waiter(p, path, what):
    """wait_log(pattern, n=1): wait until launch's log at `path` has n lines
    matching `pattern` (p, its Proc, still running)."""
    def wait_log(pattern, n=1, timeout=120):
        deadline = time.time() + timeout
        while len(re.findall(pattern, open(path).read(), re.MULTILINE)) < n:
            assert time.time() < deadline and p.alive(), "%s: no '%s'\n%s" % (
                what, pattern, open(path).read()[-4000:])
            time.sleep(0.02)
    return wait_log


def sync_rerep_case():
    """Sync, R = N, --init-tokens 0, 3 ps: ps 1 SIGKILLed mid-run; launch
    starts a replacement, which is copied shard 1 (from ps 2's promoted
    copy, with the pushes kept for the step in flight) and shard 0 (from
    ps 0) while training goes on; once re-replication is complete (read
    from the log, not timed), ps 2, which serves shards 1 and 2, is
    SIGKILLed: shard 1 is served by the replacement, shard 2 by ps 0. The
    run ends without a rollback, with the params_digest of the same run
    unkilled (SGD and Adam)."""
    base = ["--ps", "3", "--workers", "3", "--init-tokens", "0", "--data", "digits",
            "--batch-size", "32", "--seed", "11", "--steps", "4000", "--ps-replicas", "2"]
    whole = {}
    # ps 1 then ps 2 (shard 1 then served by the replacement); ps 2 then
    # ps 1 (ps 0 serves shard 2 and copies it to ps 2's replacement, which
    # then serves shard 1 from its copy while it holds its own).
    for what, extra, first_k, second_k in (
            ("sgd", ["--lr", "0.1"], 1, 2),
            ("adam", ["--optimizer", "adam", "--lr", "0.001"], 1, 2),
            ("sgd", ["--lr", "0.1"], 2, 1)):
        if what not in whole:
            whole[what] = launch(base + extra, mode="sync")[0]["params_digest"]
        log = tempfile.NamedTemporaryFile("w+", prefix="qr-sync-rerep-", suffix=".log")
        p = Proc([quorum, "launch", "--json", "--quiet", "--mode", "sync", "--max-restarts",
                  "1"] + base + extra, stderr=log)
        wait_log = log_waiter(p, log.name, what)

        try:
            first = launch_child_pid(p, "ps", first_k)
            for k in (1, 2):  # ps 0 met them: a failover, not a restart
                wait_log(r"^\S+ \[ps 0 pid \d+\] info: linked to ps %d \([^)]*\)$" % k)
            time.sleep(0.5)  # (a moment into training; any moment would do)
            os.kill(first, signal.SIGKILL)
            wait_log(re.escape("quorum launch: ps %d holds copies of its shards again" % first_k))
            second = launch_child_pid(p, "ps", second_k)
            os.kill(second, signal.SIGKILL)
            rc, out, _ = p.wait(300)
        finally:
            p.kill()
        err = open(log.name).read()
        log.close()
        run = "%s, ps %d then ps %d" % (what, first_k, second_k)
        assert rc == 0, "%s: launch exited %d\n%s" % (run, rc, err[-4000:])
        s = last_json(out)
        assert s["rollbacks"] == 0 and "rolling back" not in err, (s, err[-3000:])
        assert s["global_step"] == 4000, s
        assert "quorum launch: ps %d (failed over) has exited; starting a replacement" % \
            first_k in err, err[-3000:]
        assert "re-replication complete: ps %d holds copies of shard %d (served by ps %d) and " \
            "of shard %d: both on two copies again (view 3)" % (
                first_k, first_k, (first_k + 1) % 3, first_k - 1) in err, err[-3000:]
        assert "quorum launch: ps %d (pid %d) was failed over by ps 0 (view 4)" % (
            second_k, second) in err, err[-3000:]
        served = 1 if second_k == 2 else 2
        assert "view 4: shard 1 is served by ps %d" % served in err, err[-3000:]
        assert s["params_digest"] == whole[what], "%s: digest %s, unkilled %s\n%s" % (
            run, s["params_digest"], whole[what], err[-4000:])
        held = check_rereplicated(err, 3, {second_k}, run)
        assert held == ({0: 2, 1: 1, 2: 1} if second_k == 2 else {0: 1, 1: 1, 2: 2}), held
        print("ok: %s killed, the first replaced and re-replicated before the second: "
              "params_digest %s as unkilled, no rollback" % (run, whole[what]))
    print("PASS: sync_rerep: a sync run's replacement was copied its shards with the step in "
          "flight; a second failure after it was survived; the digest of an unkilled run")


TAKEN = re.compile(r"(\S+) \[ps (\d+) pid \d+\] info: re-replication of shard (\d+) to ps \d+: "
                   r"snapshot taken")
WRITTEN = re.compile(r"\[ps (\d+) pid \d+\] info: re-replication of shard (\d+) to ps \d+: "
                     r"snapshot made \(\d+ bytes, ([\d.]+) MB")
LOADED = re.compile(r"(\S+) \[ps (\d+) pid \d+\] info: re-replication of shard (\d+): ps \d+ "
                    r"has loaded the snapshot")


def stamp(text):
    t = time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")
    return time.mktime(t) + float("0" + text[19:-1])


def socket_rate(nbytes):
    """Bytes/s of one AF_UNIX socket on this machine, measured now: the
    loopback baseline of a re-replication (launch's default transport)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    block = b"\0" * (4 << 20)

    def send():
        left = nbytes
        while left > 0:
            left -= a.send(block[:min(left, len(block))])
    t = threading.Thread(target=send)
    start = time.time()
    t.start()
    got = 0
    while got < nbytes:
        got += len(b.recv(4 << 20))
    t.join()
    a.close()
    b.close()
    return nbytes / (time.time() - start)


COORDINATOR_MODES = (("sync", ["--init-tokens", "0", "--steps", "3000"]),
                     ("async", ["--steps", "20000"]))


def coordinator_option(pid):
    """The --coordinator that launch gave task `pid` (None: not given)."""
    args = open("/proc/%d/cmdline" % pid).read().split("\0")
    return args[args.index("--coordinator") + 1] if "--coordinator" in args else None


def kill_ps0_until_replaced(args, mode):
    """`quorum launch --max-restarts 3 ARGS` started with its log in a file;
    ps 0 SIGKILLed once it has met ps 1 and ps 2 (so ps 1 takes over
    rather than waits), and waited for until launch says its replacement
    holds copies of its shards again. Returns the launcher's Proc, the
    log file, its waiter and the first ps 0's pid; the caller kills the
    Proc and closes the log."""
    log = tempfile.NamedTemporaryFile("w+", prefix="qr-coordinator-", suffix=".log")
    p = Proc([quorum, "launch", "--json", "--quiet", "--mode", mode, "--max-restarts", "3"] +
             args, stderr=log)
    wait_log = log_waiter(p, log.name, mode)
    with killed_on_error(p, log):
        first = launch_child_pid(p, "ps", 0)
        for k in (1, 2):
            wait_log(r"^\S+ \[ps 0 pid \d+\] info: linked to ps %d \([^)]*\)$" % k)
        time.sleep(0.5)
        os.kill(first, signal.SIGKILL)
        wait_log(re.escape("quorum launch: ps 0 holds copies of its shards again"))
    return p, log, wait_log, first


def check_as_unkilled_at(mode, s, whole, steps):
    """Sync: the params_digest and last step (`steps`) of the run unkilled;
    async: its accuracy. Returns what to print."""
    if mode == "sync":
        assert s["params_digest"] == whole["params_digest"] and s["global_step"] == steps, \
            (s, whole["params_digest"])
        return "params_digest %s as unkilled" % s["params_digest"]
    assert s["test_accuracy"] >= whole["test_accuracy"] - 0.03, (s, whole)
    return "accuracy %.4f (unkilled %.4f)" % (s["test_accuracy"], whole["test_accuracy"])


def check_as_unkilled(mode, s, whole):
    """check_as_unkilled_at COORDINATOR_MODES' 3000 steps."""
    return check_as_unkilled_at(mode, s, whole, 3000)


def coordinator_rerep_case():
    """ps 0, the coordinator, SIGKILLed mid-run under `launch --max-restarts
    3`: ps 1 takes its role over, and launch starts a replacement of ps 0
    told so (--coordinator 1), which rejoins as the backup of shards 0 and
    2 (copied from ps 1 and ps 2 while training goes on). That replacement
    is SIGKILLed in turn and replaced again; then worker 1 is SIGKILLed and
    restarted, and goes to ps 1 for shard 0 and the coordinator's calls.
    Sync (R = N, --init-tokens 0): the params_digest of the same run
    unkilled; async: an unkilled run's accuracy. Both: no rollback, every
    shard on two equal copies at the end, each having applied the pushes
    acknowledged for it, and the restarted worker trained."""
    base = DIGITS + ["--ps-replicas", "2"]
    rejoined = re.escape("quorum launch: ps 0 holds copies of its shards again")
    for mode, extra in COORDINATOR_MODES:
        whole, _ = launch(base + extra, mode=mode)
        p, log, wait_log, first = kill_ps0_until_replaced(base + extra, mode)
        with killed_on_error(p, log):
            second = launch_child_pid(p, "ps", 0)
            assert second != first and coordinator_option(second) == "1", second
            os.kill(second, signal.SIGKILL)  # a backup now: ps 1 fails it over
            wait_log(rejoined, 2)
            worker = launch_child_pid(p, "worker", 1)
            os.kill(worker, signal.SIGKILL)
        s, err = end_launch(p, log, mode)
        assert "quorum launch: ps 0 (pid %d) was failed over by ps 1 (view 1)" % first in err
        assert "quorum launch: ps 0 (pid %d) was failed over by ps 1 (view 4)" % second in err, \
            err[-3000:]
        for view in (3, 6):
            assert re.search(r"\[ps 1 pid \d+\] warn: re-replication complete: ps 0 holds "
                             r"copies of shard 0 \(served by ps 1\) and of shard 2: both on two "
                             r"copies again \(view %d\)$" % view, err, re.MULTILINE), err[-3000:]
        # The restarted worker, told --coordinator 1, trained: without it,
        # it waits for ps 0 (a backup, serving no worker) to the run's end.
        restarted = re.findall(r"\[worker 1 pid (\d+)\] info: worker 1: pushes acknowledged "
                               r"per shard: 0:(\d+) .*view 6$", err, re.MULTILINE)
        assert len(restarted) == 1 and int(restarted[0][0]) != worker and \
            int(restarted[0][1]) > 0, (restarted, err[-3000:])
        assert "had not joined the run" not in err, err[-3000:]
        held = check_rereplicated(err, 3, set(), "%s: ps 0 killed and replaced twice" % mode,
                                  worker_killed=True)
        assert held == {0: 2, 1: 2, 2: 2}, held
        print("ok: %s: ps 0 killed (ps 1 took over), its replacement re-replicated, killed and "
              "replaced again, worker 1 restarted (%s pushes to shard 0): no rollback, %s" % (
                  mode, restarted[0][1], check_as_unkilled(mode, s, whole)))
    print("PASS: coordinator_rerep")


def coordinator_second_case():
    """ps 0 SIGKILLed under `launch --max-restarts 3`: ps 1 takes the
    coordinator's role over, and ps 0's replacement (told --coordinator 1)
    rejoins as the copy of shards 0 and 2. Then ps 1, the coordinator now,
    is SIGKILLed: ps 0's replacement, which holds shard 0's copy, takes the
    role back (view 4, the second coordinator failover), serves shard 0
    again, and ps 2 serves shard 1; launch starts a replacement of ps 1
    (no --coordinator: ps 0 coordinates), which rejoins in turn. Sync (R =
    N, --init-tokens 0): the params_digest of the same run unkilled;
    async: an unkilled run's accuracy. Both: no rollback, every shard on
    two equal copies at the end, each having applied the pushes
    acknowledged for it, every worker at the last view. In both runs,
    once ps 1's replacement holds its copies, ps 0 (coordinating again) is
    killed a second time: ps 1's replacement, a BACKUP that serves no
    shard of its own, takes over (view 7) and ps 0's next replacement
    rejoins. Then async again with ps 1 SIGSTOPped rather than killed (heartbeat-timeout-ms 1500):
    the other ps report the coordinator, ps 1, hung; launch kills it (not
    ps 0's replacement, as when the notice named ps 0), and the same
    follows."""
    base = DIGITS + ["--ps-replicas", "2"]
    runs = [(mode, extra, signal.SIGKILL, True) for mode, extra in COORDINATOR_MODES]
    runs.append(("async", ["--steps", "30000", "--heartbeat-timeout-ms", "1500"], signal.SIGSTOP,
                 False))
    for mode, extra, how, third in runs:
        whole, _ = launch(base + extra, mode=mode)
        p, log, wait_log, first = kill_ps0_until_replaced(base + extra, mode)
        with killed_on_error(p, log):
            coordinator = launch_child_pid(p, "ps", 1)
            os.kill(coordinator, how)
            wait_log(re.escape("quorum launch: ps 1 holds copies of its shards again"))
            replacement = launch_child_pid(p, "ps", 1)
            assert replacement != coordinator and coordinator_option(replacement) is None
            if third:  # ps 0 again: ps 1's replacement, a BACKUP, succeeds it
                again = launch_child_pid(p, "ps", 0)
                os.kill(again, signal.SIGKILL)
                wait_log(re.escape("quorum launch: ps 0 holds copies of its shards again"), 2)
                assert coordinator_option(launch_child_pid(p, "ps", 0)) == "1"
        s, err = end_launch(p, log, mode)
        assert "quorum launch: ps 0 (pid %d) was failed over by ps 1 (view 1)" % first in err
        assert "quorum launch: ps 1 (pid %d) was failed over by ps 0 (view 4)" % coordinator \
            in err, err[-3000:]
        assert re.search(r"\[ps 0 pid \d+\] warn: ps 1 \([^)]*\), the coordinator, is gone .*"
                         r"coordinates the cluster from now on", err), err[-3000:]
        assert re.search(r"\[ps 2 pid \d+\] warn: ps 0 \([^)]*\) coordinates the cluster from "
                         r"now on", err), err[-3000:]
        if third:
            assert "quorum launch: ps 0 (pid %d) was failed over by ps 1 (view 7)" % again \
                in err, err[-3000:]
        # Every worker ended at the last view.
        views = re.findall(r"\[worker \d pid \d+\] info: worker \d: pushes acknowledged per "
                           r"shard: .*view (\d+)$", err, re.MULTILINE)
        assert len(views) == 3 and len(set(views)) == 1 and int(views[0]) >= 6, \
            (views, err[-3000:])
        if how == signal.SIGSTOP:
            assert "quorum launch: ps 1 (pid %d) is hung: no answer to heartbeats" % coordinator \
                in err, err[-3000:]
            assert not re.search(r"quorum launch: ps 0 \(pid \d+\) is hung", err), err[-3000:]
        what = "ps 0 killed, then ps 1, the coordinator, %s (ps 0's replacement took over)%s" % (
            "stopped" if how == signal.SIGSTOP else "killed",
            ", then ps 0 again (ps 1's replacement took over)" if third else "")
        held = check_rereplicated(err, 3, set(), "%s: %s" % (mode, what))
        assert held == {0: 2, 1: 2, 2: 2}, held
        print("ok: %s: %s, each replaced: no rollback, %s" % (
            mode, what, check_as_unkilled(mode, s, whole)))
    print("PASS: coordinator_second")


def coordinator_both_lost_case():
    """ps 0 SIGKILLed under `launch --max-restarts 3 --checkpoint-dir`: ps 1
    takes over and ps 0's replacement rejoins; then that replacement and
    ps 2 are SIGKILLed together, so shard 2 loses both its copies while ps
    1 coordinates. A rollback in place would give ps 0 shard 0 back while
    ps 1 coordinates, which no worker follows (the chief waited out
    restart-wait-ms on refused HELLOs, then the run failed): ps 1 stops the
    run at once, saying why, and launch starts every task again, ps 0
    coordinating, from the newest checkpoint (one restart). Sync (R = N,
    --init-tokens 0): the params_digest of the same run unkilled (every
    shard and each worker's data position come back from the checkpoint);
    async: an unkilled run's accuracy."""
    for mode, extra in (("sync", ["--init-tokens", "0"]), ("async", [])):
        d = tempfile.mkdtemp(prefix="qr-both-lost-")
        try:
            args = DIGITS + ["--ps-replicas", "2", "--steps", "8000"] + extra
            whole, _ = launch(args, mode=mode)
            p, log, _, _ = kill_ps0_until_replaced(
                args + ["--checkpoint-dir", d, "--checkpoint-steps", "300"], mode)
            with killed_on_error(p, log):
                pids = [launch_child_pid(p, "ps", k) for k in (0, 2)]
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
            s, err = end_launch(p, log, mode)  # no rollback: a new run of the chief
            # (From a fresh start when no checkpoint was complete yet: the
            # kill comes early under a sanitizer.)
            stopped = re.search(r"\[ps 1 pid \d+\] error: job aborted: shard 2 has lost both its "
                                r"copies: .*ps 1 coordinates since ps 0 failed over, so the "
                                r"cluster cannot roll back in place: the run stops, to be started "
                                r"again whole .* from (its newest checkpoint \(step \d+\)|a "
                                r"fresh start: no checkpoint was written yet); quorum launch "
                                r"does so", err)
            assert stopped, err[-4000:]
            assert re.search(r"quorum launch: both copies of a shard are lost while ps 1 "
                             r"coordinates \(ps 0 failed over\): stopping every task and starting "
                             r"the cluster again, ps 0 coordinating \(restart [23] of 3\)", err), \
                err[-4000:]
            after = err[err.index("starting the cluster again"):]
            restored = re.findall(r"\[ps (\d) pid \d+\] info: restored \d+ variable", after)
            fresh = stopped.group(1).startswith("a fresh")
            assert sorted(set(restored)) == ([] if fresh else ["0", "1", "2"]), \
                (restored, err[-4000:])
            assert s["global_step"] >= 8000, s
            said = check_as_unkilled_at(mode, s, whole, 8000)
            print("ok: %s: ps 0 killed (ps 1 took over), then its replacement and ps 2 together: "
                  "ps 1 stopped the run, launch started the cluster again from %s, %s" % (
                      mode, stopped.group(1), said))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    print("PASS: coordinator_both_lost")


def coordinator_lost_joining_case():
    """ps 1, coordinating since ps 0 failed over, SIGKILLed while ps 0's
    replacement is still being copied (ps 2, which copies it shard 2, is
    SIGSTOPped meanwhile): nobody holds a full copy of shard 0, so nobody
    takes the role over. A new run of ps 1 alone (launch started it with
    --coordinator 1) took itself for the coordinator of a run that had
    none; now launch, once heartbeat-timeout-ms has passed without a
    failover notice, starts every task again from the newest checkpoint,
    ps 0 coordinating (one restart). Sync (R = N, --init-tokens 0): the
    params_digest of the same run unkilled; async: its accuracy."""
    for mode, extra in (("sync", ["--init-tokens", "0"]), ("async", [])):
        d = tempfile.mkdtemp(prefix="qr-lost-joining-")
        stopped = None
        try:
            args = DIGITS + ["--ps-replicas", "2", "--steps", "8000"] + extra
            whole, _ = launch(args, mode=mode)
            log = tempfile.NamedTemporaryFile("w+", prefix="qr-lost-joining-", suffix=".log")
            p = Proc([quorum, "launch", "--json", "--quiet", "--mode", mode, "--max-restarts",
                      "3", "--checkpoint-dir", d, "--checkpoint-steps", "300"] + args,
                     stderr=log)
            wait_log = log_waiter(p, log.name, mode)
            with killed_on_error(p, log):
                first = launch_child_pid(p, "ps", 0)
                coordinator = launch_child_pid(p, "ps", 1)
                wait_log(r"\[ps 0 pid \d+\] info: checkpoint \S+ written")
                stopped = launch_child_pid(p, "ps", 2)
                os.kill(stopped, signal.SIGSTOP)
                os.kill(first, signal.SIGKILL)
                wait_log(r"\[ps 1 pid \d+\] warn: ps 0 \(\S+\) is back, a new run: it rejoins "
                         r"as a backup")
                os.kill(coordinator, signal.SIGKILL)
                time.sleep(0.2)
                os.kill(stopped, signal.SIGCONT)
                stopped = None
            s, err = end_launch(p, log, mode)
            assert not re.search(r"re-replication complete: ps 0 holds", err), \
                "ps 0's replacement was copied before ps 1 died\n" + err[-4000:]
            assert "quorum launch: ps 1 (pid %d) was killed by signal 9 (Killed); it coordinated " \
                "since ps 0 failed over, and no ps holding a full copy of shard 0 took its role " \
                "over: stopping every task and starting the cluster again, ps 0 coordinating " \
                "(restart 2 of 3)" % coordinator in err, err[-4000:]
            assert s["global_step"] >= 8000, s
            said = check_as_unkilled_at(mode, s, whole, 8000)
            print("ok: %s: ps 0 killed (ps 1 took over), then ps 1 while ps 0's replacement was "
                  "being copied: launch started the cluster again, %s" % (mode, said))
        finally:
            if stopped is not None:
                os.kill(stopped, signal.SIGCONT)
            shutil.rmtree(d, ignore_errors=True)
    print("PASS: coordinator_lost_joining")


def rerep_rate_case():
    """Not a test (no figure is asserted): the re-replication rate of a
    shard with one 256 MiB dense variable (MLP hidden 8192,8192: the
    second layer), against an AF_UNIX socket's rate measured in the same
    run. QR_VICTIM picks the ps killed (the one holding the large shard,
    or the next)."""
    victim = int(os.environ.get("QR_VICTIM", "1"))
    args = ["--ps", "3", "--workers", "2", "--data", "digits", "--batch-size", "32", "--seed",
            "11", "--lr", "0.01", "--hidden", "8192,8192", "--steps", "400", "--ps-replicas",
            "2", "--max-restarts", "1", "--heartbeat-timeout-ms", "60000"]
    s, err, _ = launch_and_kill(args, [(victim, float(os.environ.get("QR_AFTER", "15")))])
    for line in err.splitlines():  # the copy's phases, as the ps tasks logged them
        if "re-replication" in line or "loaded the snapshot" in line:
            print("LOG: " + line[:300])
    sizes = {int(m[2]): float(m[3]) * 1e6 for m in WRITTEN.finditer(err)}
    taken = {int(m[3]): stamp(m[1]) for m in TAKEN.finditer(err)}
    for m in LOADED.finditer(err):
        shard = int(m[3])
        secs = stamp(m[1]) - taken[shard]
        base = socket_rate(int(sizes[shard]))
        print("RATE: shard %d, %.0f MB: copied in %.2f s (snapshot, send, load) = %.0f MB/s; "
              "an AF_UNIX socket now %.0f MB/s; ratio %.2f" % (
                  shard, sizes[shard] / 1e6, secs, sizes[shard] / secs / 1e6, base / 1e6,
                  sizes[shard] / secs / base))
    held = check_rereplicated(err, 3, set(), "large shard")
    print("PASS: rerep_rate (a measurement), steps %d, copies %s" % (s["global_step"], held))


cases = {"wire": wire_case, "train": train_case, "sync_train": sync_train_case,
         "failover_wire": failover_wire_case, "failover_kill": failover_kill_case,
         "coordinator_kill": coordinator_kill_case,
         "coordinator_rerep": coordinator_rerep_case,
         "coordinator_second": coordinator_second_case,
         "failover_stop": failover_stop_case, "failover_loop": failover_loop_case,
         "lag": lag_case,
         "sync_failover_loop": sync_failover_loop_case,
         "sync_worker_stop": sync_worker_stop_case, "rerep": rerep_case,
         "rerep_second": rerep_second_case, "rerep_killed": rerep_killed_case,
         "rerep_chain": rerep_chain_case, "coordinator_backup": coordinator_backup_case,
         "sync_rerep": sync_rerep_case,
         "coordinator_both_lost": coordinator_both_lost_case,
         "coordinator_lost_joining": coordinator_lost_joining_case,
         "rerep_rate": rerep_rate_case}
if case not in cases:
    sys.exit("unknown case %r (%s)" % (case, ", ".join(cases)))
cases[case]()

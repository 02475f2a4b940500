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
    refused with the problem named, and the backup's copy is unchanged.
Case "train": `quorum launch --mode async --ps-replicas 2` on digits
(2 and 3 ps, SGD and Adam) and on click data with embedding tables trains
as --ps-replicas 1 does, and as the run ends each shard's primary digest
equals its backup's (each ps logs both: "replica digests: ...").
Usage: test_replication.py QUORUM_BINARY wire|train"""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

from qrtest import (CREATE, HELLO, PULL, PUSH, PUSH_STEP, READY, REPLY, STATS, STATUS, Proc,
                    connect, create_meta, floats, frame, free_ports, last_json, push_meta,
                    read_reply, ready_meta, unfloats)

quorum, case = sys.argv[1], sys.argv[2]
REPLICATE = 21
ROLE_WORKER, ROLE_REPLICA = 1, 3


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
    assert got in status_name.split("|") and text in meta.decode(errors="replace"), \
        "%s: got %s %r, wanted %s with %r" % (what, got, meta, status_name, text)
    print("ok: %s refused: %s" % (what, meta.decode(errors="replace")[:160]))


def hello(kind, index, incarnation=7):
    if kind == ROLE_REPLICA:
        return struct.pack("<IIIQqQ", ROLE_REPLICA, index, 0, incarnation, -1, 0)
    return struct.pack("<III", kind, index, 0)


def repl_meta(items, fwd, flags=PUSH_STEP, worker=0, seq=1, t=1):
    """items: (var_id, kind, nbytes, lr) records of a REPLICATE."""
    meta = struct.pack("<IIIIqqQ", flags, worker, seq, len(items), t, 0, fwd)
    for var_id, kind, nbytes, lr in items:
        meta += struct.pack("<IIQf", var_id, kind, nbytes, lr)
    return meta


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
        expect_error(r, frame(PUSH, 26, push_meta([(1, 16)]), floats([1, 1, 1, 1]),
                              flags=PUSH_STEP),
                     "EPROTO", "a replica link carries CREATE and REPLICATE",
                     "a PUSH on a replica link")
        r.close()
        assert shard_digests(p1)[(0, "backup")] == backup, "a refused REPLICATE changed the copy"
        print("ok: refused REPLICATEs left the backup's copy unchanged")
        s.close()
    finally:
        for p in ps:
            p.kill()
    print("PASS: wire")


DIGESTS = re.compile(r"\[ps (\d+) pid \d+\] info: replica digests: shard (\d+) primary "
                     r"([0-9a-f]{16}), shard (\d+) backup ([0-9a-f]{16})")


def launch(args, timeout=300):
    proc = Proc([quorum, "launch", "--json", "--quiet", "--mode", "async"] + args)
    rc, out, err = proc.wait(timeout=timeout)
    assert rc == 0, "launch %s exited %d\n%s" % (args, rc, err[-4000:])
    return last_json(out), err


def check_copies(err, nps, what):
    """Every shard's primary digest equals its backup's, from the ps's
    last lines."""
    primary, backup = {}, {}
    for m in DIGESTS.finditer(err):
        ps, own, own_d, other, other_d = int(m[1]), int(m[2]), m[3], int(m[4]), m[5]
        assert own == ps and other == (ps - 1) % nps, m[0]
        primary[own], backup[other] = own_d, other_d
    assert sorted(primary) == list(range(nps)) and sorted(backup) == list(range(nps)), \
        "%s: digests of %s / %s\n%s" % (what, primary, backup, err[-3000:])
    for k in range(nps):
        assert primary[k] == backup[k], "%s: shard %d: primary %s, backup %s" % (
            what, k, primary[k], backup[k])
    print("ok: %s: every shard's backup equals its primary (%s)" % (
        what, ", ".join("%d:%s" % (k, primary[k]) for k in range(nps))))


def train_case():
    digits = ["--data", "digits", "--batch-size", "32", "--seed", "11"]
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


if case == "wire":
    wire_case()
elif case == "train":
    train_case()
else:
    sys.exit("unknown case %r (wire, train)" % case)

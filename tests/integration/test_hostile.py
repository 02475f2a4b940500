"""test_hostile.py - a live ps against a hostile client, then a real worker.

1. Malformed frames (truncated, bad magic/version/type, oversized meta or
   payload, random bytes) each close only their own connection; malformed
   requests with a sound header get an error reply and the connection
   keeps working. After every attack a fresh client is served.
   Inputs tests/fuzz/fuzz_ps.c found crashing or bloating the ps are
   checked here by name: a HELLO from worker index 2^31 + x, and a CREATE
   that claims 4 GiB of values but carries 8 bytes (peak RSS must stay low).
2. Precise checks: a push with the wrong shape, to an unknown variable,
   with NaN, or naming a variable twice is refused with the right status
   and a message naming the problem, and the variable is unchanged; a good
   push applies SGD exactly. A push with learning rates (PUSH_LR) has them
   checked (finite, >= 0, or -1 for the ps's own) and applies them as given.
3. A normal worker then trains the MLP on digits against the same ps to
   >= 0.95 test accuracy, and the ps exits 0 when the chief stops it.
Usage: test_hostile.py QUORUM_BINARY"""

import random
import socket
import struct
import sys

from qrtest import (CREATE, HELLO, LEAVE, PULL, PUSH, PUSH_LR, READY, REPLY, SAVE, STATUS, STEP,
                    Proc,
                    connect, create_meta, floats, frame, free_port, header, last_json,
                    pad, push_meta, read_reply, ready_meta, recv_exact, request, unfloats)

quorum = sys.argv[1]
ps_port, worker_port = free_port(), free_port()
cluster = ["--ps_hosts", "127.0.0.1:%d" % ps_port,
           "--worker_hosts", "127.0.0.1:%d" % worker_port]
ps = Proc([quorum, "ps"] + cluster + ["--job_name", "ps", "--task_index", "0",
                                      "--lr", "0.1", "--linger-ms", "2000"])
rid = 100


def next_id():
    global rid
    rid += 1
    return rid


def ps_serves():
    """A fresh connection gets a correct STEP reply."""
    assert ps.alive(), "the ps died"
    s = connect(ps_port)
    i = next_id()
    s.sendall(frame(STEP, i))
    mtype, got, status, meta, _ = read_reply(s)
    s.close()
    assert mtype == STEP | REPLY and got == i and status == 0, (mtype, got, status)
    return struct.unpack("<q", meta)[0]


def expect_closed(data, what, hang_up=False):
    s = connect(ps_port)
    s.settimeout(5)
    s.sendall(data)
    if hang_up:  # the message stops short: the ps only learns it at EOF
        s.shutdown(socket.SHUT_WR)
    try:
        rest = s.recv(1)
        assert rest == b"", "%s: the ps answered instead of closing" % what
    except ConnectionResetError:
        pass
    s.close()
    ps_serves()
    print("ok: %s closes the connection" % what)


def peak_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM for pid %d" % pid)


def expect_error(s, data, status, phrase, what):
    mtype, _, got, meta, payload = request(s, data)
    text = meta.decode(errors="replace")
    assert STATUS.get(got) == status, "%s: status %s (%s), wanted %s" % (
        what, STATUS.get(got, got), text, status)
    assert phrase in text, "%s: message %r lacks %r" % (what, text, phrase)
    assert payload == b""
    print("ok: %s -> %s: %s" % (what, status, text))


try:
    assert ps_serves() == 0

    # --- 1. frames that cannot be trusted close their connection -------
    expect_closed(b"QURM\x01\x04", "a truncated header", hang_up=True)
    expect_closed(header(PUSH, 1, 0, 0, magic=0x12345678), "a bad magic")
    expect_closed(header(PUSH, 1, 0, 0, version=7), "an unknown version")
    expect_closed(header(PUSH, 1, 0, 0, version=1), "the unpadded version 1 layout")
    expect_closed(header(0x42, 1, 0, 0), "an unknown message type")
    expect_closed(header(PUSH, 1, 0, 0, reserved=5), "a non-zero reserved field")
    expect_closed(header(PUSH, 1, 1 << 24, 0), "oversized meta")
    expect_closed(header(PUSH, 1, 12, 1 << 50), "an oversized payload")
    # A payload that stops short: the peer hangs up mid-message.
    s = connect(ps_port)
    s.sendall(header(PUSH, 1, 12, 4000) + b"\x00" * 20)
    s.close()
    ps_serves()
    rng = random.Random(1234)
    for i in range(200):
        junk = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))
        if rng.random() < 0.5:   # junk behind a plausible start
            junk = header(rng.randint(1, 7), i, rng.randint(0, 64), rng.randint(0, 64)) + junk
        s = connect(ps_port)
        s.settimeout(2)
        try:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            while s.recv(4096):
                pass
        except OSError:
            pass
        s.close()
    assert ps_serves() == 0
    print("ok: 200 random messages; the ps still serves")

    # --- malformed requests with a sound header get an error reply -------
    s = connect(ps_port)
    expect_error(s, header(PUSH, 5, 4, 0) + struct.pack("<I", 5) + pad(36), "EPROTO",
                 "PUSH meta is truncated", "a truncated PUSH meta")
    expect_error(s, frame(PUSH, 6, push_meta([(1, 16)]), b"\x00" * 16), "ENOTREADY",
                 "no variable with id 1", "a push before initialization")
    expect_error(s, frame(PULL, 7, struct.pack("<I", 0)), "EPROTO",
                 "PULL names 0 variables", "an empty pull")
    expect_error(s, frame(PUSH | REPLY, 8), "EPROTO", "does not accept", "a reply sent to a ps")
    # A LEAVE must come from a worker (after its HELLO): a stranger's would
    # end a run whose workers are all still there.
    expect_error(s, frame(LEAVE, 30), "EINVAL", "after its HELLO", "a LEAVE before HELLO")
    expect_error(s, frame(SAVE, 31), "EINVAL", "without --checkpoint-dir",
                 "a checkpoint asked of a ps without a checkpoint dir")
    expect_error(s, frame(PUSH, 32, push_meta([(1, 16)]), b"\x00" * 16, flags=0x40), "EINVAL",
                 "unknown flags 0x40", "a push with an unknown flag")
    expect_error(s, frame(CREATE, 9, create_meta([(1, [], -1.0, "x")])), "EINVAL",
                 "0 dimensions", "a CREATE with no dimensions")
    expect_error(s, frame(CREATE, 10, create_meta([(1, [1 << 20, 1 << 20], -1.0, "x")])),
                 "EINVAL", "dimension 1", "a CREATE of 2^40 elements")
    expect_error(s, frame(CREATE, 11, create_meta([(1, [4], -1.0, "x")]), floats([1, 2])),
                 "EPROTO", "needs 16 bytes of initial values but the payload has 8",
                 "a CREATE short of values")
    # 4 GiB of values claimed by a 192-byte request: refused before the ps
    # allocates (and zeroes) anything. Found by tests/fuzz/fuzz_ps.c.
    expect_error(s, frame(CREATE, 15, create_meta([(1, [1 << 30], -1.0, "x")]), floats([1, 2])),
                 "EPROTO", "needs 4294967296 bytes", "a CREATE of 4 GiB carrying 8 bytes")
    peak_kb = peak_rss_kb(ps.p.pid)
    assert peak_kb < 512 * 1024, "the ps's peak RSS reached %d KiB" % peak_kb
    print("ok: the ps's peak RSS stayed at %d KiB" % peak_kb)
    # A worker index of 2^31 or more is no negative array index. (It was:
    # the ps crashed. Found by tests/fuzz/fuzz_ps.c.)
    expect_error(s, frame(HELLO, 16, struct.pack("<III", 1, 0x86000000, 0)), "EINVAL",
                 "no such worker index", "a HELLO from worker 2^31 + ...")
    # One identity per connection: a second HELLO is refused. (It was
    # counted as a second live worker, and only one left when the
    # connection closed: the phantom held --max-staleness waits forever.)
    h = connect(ps_port)
    assert request(h, frame(HELLO, 17, struct.pack("<III", 1, 0, 0)))[2] == 0
    expect_error(h, frame(HELLO, 18, struct.pack("<III", 1, 0, 0)), "EINVAL",
                 "has said who it is already", "a second HELLO on one connection")
    h.close()
    expect_error(s, frame(CREATE, 12, create_meta([(1, [2], -1.0, "x")]),
                          floats([1, float("nan")])),
                 "ENONFINITE", "NaN", "a CREATE with NaN values")
    expect_error(s, frame(CREATE, 13, create_meta([(1, [2], -1.0, "x", "beta1=7")]),
                          floats([1, 2])),
                 "EINVAL", "option beta1: 7 is out of range", "a CREATE with bad variable options")
    expect_error(s, frame(CREATE, 14, create_meta([(1, [2], -1.0, "x", "timeout-ms=5")]),
                          floats([1, 2])),
                 "EINVAL", "'timeout-ms' is not an optimizer option", "a CREATE with a foreign option")

    # --- 2. precise checks on a real variable -------------------------------
    probe, big, lrp = 1000, 1001, 1002
    big_n = 40000  # 160,000 bytes: a "large" payload to the transport (>= 64 KiB)
    big_init = [(i % 97) * 0.01 for i in range(big_n)]
    mtype, _, status, meta, _ = request(
        s, frame(CREATE, 20, create_meta([(probe, [4], -1.0, "probe"), (big, [big_n], -1.0, "big"),
                                          (lrp, [2], -1.0, "lrprobe")]),
                 floats([1, 2, 3, 4] + big_init + [0, 0])))
    assert status == 0, meta
    assert request(s, frame(READY, 21, ready_meta(1)))[2] == 0

    def pull_probe():
        mtype, _, status, meta, payload = request(s, frame(PULL, next_id(), struct.pack("<II", 1, probe)))
        assert status == 0, meta
        return unfloats(payload)

    expect_error(s, frame(PUSH, 22, push_meta([(probe, 12)]), floats([1, 1, 1])), "ESHAPE",
                 "variable 'probe' has shape [4] (4 floats) but the gradient has 12 bytes",
                 "a push of the wrong shape")
    assert pull_probe() == [1, 2, 3, 4]
    expect_error(s, frame(PUSH, 23, push_meta([(999, 16)]), floats([1, 1, 1, 1])), "ENOTFOUND",
                 "no variable with id 999", "a push to an unknown variable")
    expect_error(s, frame(PUSH, 24, push_meta([(probe, 16)]), floats([1, float("nan"), 1, 1])),
                 "ENONFINITE", "gradient of variable 'probe' contains NaN or Inf",
                 "a push with NaN")
    expect_error(s, frame(PUSH, 25, push_meta([(probe, 16)]), floats([1, float("inf"), 1, 1])),
                 "ENONFINITE", "nothing was applied", "a push with Inf")
    expect_error(s, frame(PUSH, 26, push_meta([(probe, 16), (probe, 16)]),
                          floats([1] * 8)), "EINVAL", "names variable 'probe' twice",
                 "a push naming a variable twice")
    assert pull_probe() == [1, 2, 3, 4], "a refused push changed the variable"
    print("ok: refused pushes left the variable unchanged")
    mtype, _, status, meta, _ = request(s, frame(PUSH, 27, push_meta([(probe, 16)]),
                                                 floats([1, 2, -1, 0])))
    assert status == 0, meta
    got = pull_probe()
    want = [1 - 0.1 * 1, 2 - 0.1 * 2, 3 + 0.1, 4]
    assert all(abs(a - b) < 1e-6 for a, b in zip(got, want)), (got, want)
    print("ok: a good push applied SGD exactly:", got)

    def pull_lrp():
        status, meta, payload = request(s, frame(PULL, next_id(), struct.pack("<II", 1, lrp)))[2:]
        assert status == 0, meta
        return unfloats(payload)

    for lr in (float("nan"), float("inf"), -0.5):
        expect_error(s, frame(PUSH, next_id(), push_meta([(lrp, 8)], lrs=[lr]), floats([1, 1]),
                              flags=PUSH_LR),
                     "EINVAL", "variable 'lrprobe': learning rate %g is not a finite number >= 0"
                     % lr, "a push with learning rate %g" % lr)
    expect_error(s, frame(PUSH, next_id(), push_meta([(lrp, 8)]), floats([1, 1]), flags=PUSH_LR),
                 "EPROTO", "PUSH meta is truncated at item 0", "PUSH_LR without the learning rate")
    assert pull_lrp() == [0, 0], "a refused push changed the variable"
    for lr, g in ((0.5, [1, 2]), (-1.0, [1, 1])):  # as given, then the ps's own (0.1)
        status, meta = request(s, frame(PUSH, next_id(), push_meta([(lrp, 8)], lrs=[lr]),
                                        floats(g), flags=PUSH_LR))[2:4]
        assert status == 0, meta
    applied, want = pull_lrp(), [-0.5 - 0.1, -1.0 - 0.1]
    assert all(abs(a - b) < 1e-6 for a, b in zip(applied, want)), (applied, want)
    print("ok: pushed learning rates checked and applied as given:", applied)

    # Requests that arrive together behind a large one. After a large
    # payload the ps reads the next head with a short read and leaves out
    # the read that usually finds nothing; here every request is already
    # waiting when the one before it completes, and one has a 5 KiB meta
    # (longer than that short read).
    g = [((i % 13) - 6) * 0.5 for i in range(big_n)]
    burst = (frame(PUSH, 40, push_meta([(big, 4 * big_n)]), floats(g)) +
             frame(PULL, 41, struct.pack("<II", 1, big)) +
             frame(PULL, 42, struct.pack("<I", 1300) + struct.pack("<I", probe) * 1300) +
             frame(PULL, 43, struct.pack("<II", 1, probe)) +
             frame(PUSH, 44, push_meta([(big, 4 * big_n)]), floats(g)) +
             frame(PULL, 45, struct.pack("<II", 1, big)))
    s.sendall(burst)
    replies = [read_reply(s) for _ in range(6)]
    assert [r[1] for r in replies] == [40, 41, 42, 43, 44, 45], [r[1] for r in replies]
    assert replies[0][2] == 0 and replies[4][2] == 0, (replies[0][3], replies[4][3])
    assert STATUS.get(replies[2][2]) == "EINVAL", replies[2][2]
    assert b"names variable 'probe' twice" in replies[2][3], replies[2][3]
    assert unfloats(replies[3][4]) == got
    for k, pulled in ((1, 1), (5, 2)):
        values = unfloats(replies[k][4])
        assert len(values) == big_n, len(values)
        bad = [i for i in range(big_n)
               if abs(values[i] - (big_init[i] - pulled * 0.1 * g[i])) > 1e-4]
        assert not bad, "big[%d] = %r after %d pushes" % (bad[0], values[bad[0]], pulled)
    print("ok: six pipelined requests behind large payloads answered in order and exactly")
    s.close()

    # --- 3. a normal worker still trains correctly --------------------------
    worker = Proc([quorum, "worker"] + cluster + [
        "--job_name", "worker", "--task_index", "0", "--data", "digits", "--epochs", "20",
        "--lr", "0.1", "--json", "--quiet"])
    rc, out, err = worker.wait(timeout=300)
    assert rc == 0, "worker exited %d: %s" % (rc, err[-3000:])
    summary = last_json(out)
    assert summary["test_accuracy"] >= 0.95, summary
    print("ok: worker trained to test accuracy %.4f" % summary["test_accuracy"])
    rc, _, err = ps.wait(timeout=30)
    assert rc == 0, "ps exited %d: %s" % (rc, err[-3000:])
    print("PASS: ps survived every attack, refused bad pushes, and served training")
finally:
    ps.kill()

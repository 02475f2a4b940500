"""test_fused_apply.py - large async pushes applied as they arrive.

A ps applies an async SGD (or delta) push of a variable of 8 MiB or more
while its payload arrives: the gradient's buffer becomes the next value
(src/ps/fused_apply.c). Against a real ps process, over the wire, with
values whose arithmetic is exact (so every check is bit-for-bit):
1. one push, a push of a large and a small variable, a delta push: each
   gives exactly var - lr * g (var + g), and the ps's STATS count them as
   applied on arrival;
2. a dense push, and then a sparse one with a repeated row, completing
   while a fused push of the same variable is half in: each is visible
   to its own worker at once, and once the fused push completes the
   variable holds both updates (the fused push's finished part rebased);
3. a fused push with a NaN near its end is refused and changes nothing;
   one cut off halfway changes nothing; the next push is fused again;
4. a pull reply still queued while two fused pushes complete goes out
   with the values it was queued with, not torn.
Usage: test_fused_apply.py QUORUM_BINARY"""

import json
import socket
import struct
import sys
import time

import numpy as np

from qrtest import (CREATE, PULL, PUSH, READY, REPLY, STATS, STATUS, STOP, Proc, connect,
                    create_meta, frame, free_port, push_meta, read_reply, ready_meta,
                    request)

PUSH_DELTA = 4
ROWS, DIM = 3072, 1024          # 12 MiB of float32: over the 8 MiB threshold
BIG, SMALL = 1, 2
LR = 0.5
quorum = sys.argv[1]
ps_port = free_port()
ps = Proc([quorum, "ps", "--ps_hosts", "127.0.0.1:%d" % ps_port,
           "--worker_hosts", "127.0.0.1:%d" % free_port(), "--job_name", "ps",
           "--task_index", "0", "--lr", str(LR), "--linger-ms", "500"])
rid = 100


def next_id():
    global rid
    rid += 1
    return rid


def ok(reply, what):
    mtype, _, status, meta, _ = reply
    assert status == 0, "%s: %s %s" % (what, STATUS.get(status, status), meta)
    return reply


def pull(s, var):
    reply = ok(request(s, frame(PULL, next_id(), struct.pack("<II", 1, var))), "pull")
    return np.frombuffer(reply[4], dtype="<f4")


def stats(s):
    reply = ok(request(s, frame(STATS, next_id())), "stats")
    return json.loads(reply[3])


def push_frame(items, payload, flags=0):
    """items: [(var, nbytes)] or [(var, nbytes, kind)]."""
    return frame(PUSH, next_id(), push_meta(items), payload.tobytes(), flags)


def grad(seed):
    """Small integers: w - 0.5 * g stays exact in float32."""
    i = np.arange(ROWS * DIM, dtype=np.int64)
    return (((i * seed) % 7) - 3).astype("<f4")


def same(got, want, what):
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, "%s: element %d is %r, expected %r (%d differ)" % (
        what, bad[0], got[bad[0]], want[bad[0]], bad.size)
    print("ok: %s" % what)


def applied(s, what, expect_fused, expect_rebased):
    st = stats(s)
    assert st["applied_on_arrival"] == expect_fused, (what, st)
    assert st["rebased_on_arrival"] == expect_rebased, (what, st)


def split_send(s, data, cut):
    """Send data[:cut] and give the ps time to take it in."""
    s.sendall(data[:cut])
    time.sleep(0.5)


try:
    s = connect(ps_port)
    s.settimeout(30)
    w = (np.arange(ROWS * DIM) % 1000).astype("<f4")
    small = np.arange(10, dtype="<f4")
    ok(request(s, frame(CREATE, next_id(),
                        create_meta([(BIG, [ROWS, DIM], -1.0, "big"), (SMALL, [10], -1.0, "small")]),
                        np.concatenate([w, small]).tobytes())), "create")
    ok(request(s, frame(READY, next_id(), ready_meta(1))), "ready")
    fused = rebased = 0

    # --- 1. whole pushes ----------------------------------------------------
    g = grad(1)
    ok(request(s, push_frame([(BIG, g.nbytes)], g)), "push")
    w = w - np.float32(LR) * g
    fused += 1
    same(pull(s, BIG), w, "one fused push applied SGD exactly")
    applied(s, "one push", fused, rebased)

    g, gs = grad(3), np.full(10, 2, dtype="<f4")
    ok(request(s, push_frame([(SMALL, gs.nbytes), (BIG, g.nbytes)], np.concatenate([gs, g]))),
       "two-variable push")
    w, small = w - np.float32(LR) * g, small - np.float32(LR) * gs
    fused += 1
    same(pull(s, BIG), w, "the large variable of a two-variable push")
    same(pull(s, SMALL), small, "the small variable of a two-variable push")
    applied(s, "two-variable push", fused, rebased)

    g = grad(5)
    ok(request(s, push_frame([(BIG, g.nbytes)], g, PUSH_DELTA)), "delta push")
    w = w + g
    fused += 1
    same(pull(s, BIG), w, "a fused delta push added exactly")
    applied(s, "delta push", fused, rebased)

    # --- 2. another push completes while a fused one is half in ---------------
    a = connect(ps_port)
    a.settimeout(30)

    def overtaken(seed, other, apply_other, what):
        """A fused push on `a` is half in when `other` completes on `s`."""
        global w
        ga = grad(seed)
        data_a = push_frame([(BIG, ga.nbytes)], ga)
        split_send(a, data_a, len(data_a) // 2)
        ok(request(s, other), what)
        w = apply_other(w)
        same(pull(s, BIG), w, "a %s completing first is visible at once" % what)
        a.sendall(data_a[len(data_a) // 2:])
        ok(read_reply(a), "the fused push")
        w = w - np.float32(LR) * ga
        same(pull(s, BIG), w, "the fused push completing second holds the %s's update too" % what)

    gb = grad(4)
    overtaken(2, push_frame([(BIG, gb.nbytes)], gb), lambda w: w - np.float32(LR) * gb,
              "dense push")
    fused, rebased = fused + 1, rebased + 1
    applied(s, "dense push during a fused one", fused, rebased)

    rows = np.array([0, 5, ROWS - 1, 5], dtype="<i8")
    vals = np.tile(np.array([1, -2, 3, 1], dtype="<f4")[:, None], (1, DIM))
    sparse = np.frombuffer(rows.tobytes() + vals.tobytes(), dtype=np.uint8)

    def apply_sparse(w):
        w2 = w.reshape(ROWS, DIM).copy()
        for r, v in zip(rows, vals):  # row 5 twice
            w2[r] -= np.float32(LR) * v
        return w2.reshape(-1)

    overtaken(6, push_frame([(BIG, sparse.nbytes, 1)], sparse), apply_sparse, "sparse push")
    fused, rebased = fused + 1, rebased + 1
    applied(s, "sparse push during a fused one", fused, rebased)

    # --- 3. refused and cut-off fused pushes change nothing -------------------
    g = grad(1)
    g[-5] = np.nan
    _, _, status, meta, _ = request(a, push_frame([(BIG, g.nbytes)], g))
    assert STATUS.get(status) == "ENONFINITE" and b"nothing was applied" in meta, (status, meta)
    same(pull(s, BIG), w, "a fused push with NaN near its end is refused and changes nothing")
    a.close()

    cut = connect(ps_port)
    g = grad(2)
    data = push_frame([(BIG, g.nbytes)], g)
    split_send(cut, data, len(data) // 2)
    cut.close()
    time.sleep(0.3)
    same(pull(s, BIG), w, "a fused push cut off halfway changes nothing")
    g = grad(3)
    ok(request(s, push_frame([(BIG, g.nbytes)], g)), "push after the cut")
    w = w - np.float32(LR) * g
    fused += 1
    same(pull(s, BIG), w, "the next push is applied on arrival again")
    applied(s, "refused and cut-off pushes", fused, rebased)

    # --- 4. a queued pull reply keeps its values ----------------------------------
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    reader.connect(("127.0.0.1", ps_port))
    reader.settimeout(30)
    before = w.copy()
    reader.sendall(frame(PULL, 900, struct.pack("<II", 1, BIG)))
    time.sleep(0.3)  # the reply fills the socket buffers and waits
    g = grad(5)
    ok(request(s, push_frame([(BIG, g.nbytes)], g)), "push while a pull reply waits")
    w = w - np.float32(LR) * g
    # A second push lands in whatever storage the first one freed: it must
    # not be the storage the waiting reply reads.
    g = grad(6)
    ok(request(s, push_frame([(BIG, g.nbytes)], g)), "second push while a pull reply waits")
    w = w - np.float32(LR) * g
    fused += 2
    reply = ok(read_reply(reader), "the waiting pull")
    same(np.frombuffer(reply[4], dtype="<f4"), before,
         "a pull reply queued before a fused push goes out unchanged")
    same(pull(s, BIG), w, "the fused pushes behind it applied exactly")
    applied(s, "push while a pull reply waits", fused, rebased)
    reader.close()

    ok(request(s, frame(STOP, next_id())), "stop")
    s.close()
    rc, _, err = ps.wait(timeout=30)
    assert rc == 0, "ps exited %d: %s" % (rc, err[-3000:])
    print("PASS: fused pushes are exact, rebased under concurrency, and never corrupt")
finally:
    ps.kill()

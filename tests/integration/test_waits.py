"""test_waits.py - requests a ps answers later are bounded per connection.

A TOKEN (synchronous replicas) or CLOCK (bounded staleness) request waits
on ps 0 until a token or the slowest worker comes. A worker's calls block,
so it has one or two such requests waiting; a client that keeps sending
them must not grow the ps's memory without end. For each kind this test
fills one connection up to the limit (16), checks that the next request
is refused with a message naming the limit, that the connection and the
ps still serve (a STEP request), that the waits already queued are still
answered when the ps stops, and that the ps exits 0.
Usage: test_waits.py QUORUM_BINARY"""

import struct
import sys

from qrtest import (HELLO, REPLY, STATUS, STEP, STOP, TOKEN, Proc, connect, frame,
                    free_port, read_reply)

CLOCK = 12
LIMIT = 16  # PEER_MAX_WAITS in src/ps/ps_internal.h
quorum = sys.argv[1]


def start_ps(extra):
    ps_port = free_port()
    workers = ["127.0.0.1:%d" % free_port() for _ in range(2)]
    ps = Proc([quorum, "ps", "--ps_hosts", "127.0.0.1:%d" % ps_port,
               "--worker_hosts", ",".join(workers), "--job_name", "ps", "--task_index", "0",
               "--linger-ms", "500"] + extra)
    return ps, ps_port


def hello(port, worker, mode):
    s = connect(port)
    s.settimeout(10)
    s.sendall(frame(HELLO, 1, struct.pack("<III", 1, worker, mode)))
    mtype, _, status, meta, _ = read_reply(s)
    assert mtype == HELLO | REPLY and status == 0, (status, meta)
    return s


def step_served(s):
    s.sendall(frame(STEP, 999))
    mtype, rid, status, _, _ = read_reply(s)
    assert mtype == STEP | REPLY and rid == 999 and status == 0, (mtype, rid, status)


def fill_and_overflow(s, mtype, meta, what):
    """LIMIT requests that wait (no reply yet), then one that is refused."""
    for i in range(LIMIT):
        s.sendall(frame(mtype, 100 + i, meta))
    s.sendall(frame(mtype, 500, meta))
    got_type, rid, status, text, _ = read_reply(s)
    text = text.decode(errors="replace")
    assert rid == 500 and got_type == mtype | REPLY, (
        "%s: the first reply is for request %d, not the one over the limit" % (what, rid))
    assert STATUS.get(status) == "EINVAL" and "(at most %d)" % LIMIT in text, (status, text)
    print("ok: %s number %d is refused: %s" % (what, LIMIT + 1, text))
    step_served(s)
    print("ok: the connection still serves")


def stop_and_collect(ps, port, s, mtype, what):
    """STOP the ps: every queued wait is answered (ESTOPPED), the ps exits 0."""
    c = connect(port)
    c.settimeout(10)
    c.sendall(frame(STOP, 7))
    read_reply(c)
    answered = set()
    while len(answered) < LIMIT:
        got_type, rid, status, _, _ = read_reply(s)
        assert got_type == mtype | REPLY and status != 0, (got_type, rid, status)
        answered.add(rid)
    assert answered == set(range(100, 100 + LIMIT)), answered
    print("ok: the %d waiting %s requests are answered when the ps stops" % (LIMIT, what))
    rc, _, err = ps.wait(30)
    assert rc == 0, "the ps exited %s:\n%s" % (rc, err[-3000:])
    s.close()
    c.close()


procs = []
try:
    # Bounded staleness: worker 1 stays at clock 0, so worker 0 asking to
    # start step 5 with max-staleness 1 waits.
    ps, port = start_ps(["--max-staleness", "1"])
    procs.append(ps)
    w1 = hello(port, 1, 0)
    w0 = hello(port, 0, 0)
    fill_and_overflow(w0, CLOCK, struct.pack("<Iq", 0, 5), "CLOCK")
    stop_and_collect(ps, port, w0, CLOCK, "CLOCK")
    w1.close()

    # Synchronous replicas with no initial tokens: a TOKEN waits until a
    # step is applied, which never happens here.
    ps, port = start_ps(["--mode", "sync", "--init-tokens", "0"])
    procs.append(ps)
    w0 = hello(port, 0, 1)
    fill_and_overflow(w0, TOKEN, struct.pack("<I", 0), "TOKEN")
    stop_and_collect(ps, port, w0, TOKEN, "TOKEN")
    print("PASS: waiting requests are bounded per connection")
finally:
    for p in procs:
        p.kill()

"""test_connections.py - what idle connections cost a ps, and its cap.

1. max-connections: a ps started with --max-connections 40 keeps 40
   connections of a worker (each said HELLO) and closes the next 20 at
   once; the refusal is logged with the peer's address (once a second at
   most) and counted on the metrics page; once some close, a new client is
   served again. Connections that have not said who they are make room
   instead: with 30 of the 40 silent, 20 new ones close the 20 oldest
   silent ones (logged, counted) and are served.
2. Memory: 300 connections (TCP, then the ps's Unix socket, which local
   workers use) that each made one request and then stay idle cost the ps
   under 64 KiB apiece (measured: its resident set before and after).
Usage: test_connections.py QUORUM_BINARY"""

import socket
import struct
import sys
import time
import urllib.request

from qrtest import (HELLO, STEP, REPLY, closed_by_peer, connect, frame, free_ports, lone_ps,
                    read_reply, rss_kb, serving, stop_ps)

quorum = sys.argv[1]


def start_ps(*extra):
    port, metrics, worker = free_ports(3)
    ps = lone_ps(quorum, port, worker, ["--metrics-port", str(metrics)] + list(extra))
    serving(port).close()
    return ps, port, metrics


def step(s, rid):
    s.sendall(frame(STEP, rid))
    mtype, got, status, meta, _ = read_reply(s)
    assert mtype == STEP | REPLY and got == rid and status == 0, (mtype, got, status)


# --- 1. the cap -------------------------------------------------------------
ps, port, metrics = start_ps("--max-connections", "40")
time.sleep(0.5)  # the ps has seen start_ps's probe connection close
kept = [connect(port) for _ in range(40)]
for i, s in enumerate(kept):
    s.sendall(frame(HELLO, 500 + i, struct.pack("<III", 1, 0, 0)))  # worker 0
    assert read_reply(s)[2] == 0
    step(s, i + 1)  # each is one the ps serves
extra = [connect(port) for _ in range(20)]
refused = sum(closed_by_peer(s) for s in extra)
assert refused == 20, "%d of 20 connections beyond the cap were closed" % refused
page = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics, timeout=10).read().decode()
assert "quorum_connections_refused_total 20" in page, page[-2000:]
for s in kept[:5]:
    s.close()
time.sleep(0.3)
s = connect(port)
step(s, 100)  # room again
s.close()
for s in kept[5:] + extra:
    s.close()
rc, _, err = stop_ps(ps, port)
assert rc == 0, err[-2000:]
refusal = [l for l in err.splitlines() if "refused a connection from" in l]
assert refusal and "127.0.0.1:" in refusal[0] and "(max-connections)" in refusal[0], err[-2000:]
print("ok: 20 connections beyond max-connections 40 closed, logged and counted; room again "
      "after some closed")

ps, port, metrics = start_ps("--max-connections", "40", "--first-message-timeout-ms", "0")
time.sleep(0.5)
workers = [connect(port) for _ in range(10)]
for i, s in enumerate(workers):
    s.sendall(frame(HELLO, 500 + i, struct.pack("<III", 1, 0, 0)))
    assert read_reply(s)[2] == 0
silent = [connect(port) for _ in range(30)]
time.sleep(0.3)
fresh = [connect(port) for _ in range(20)]
for i, s in enumerate(fresh):
    step(s, 200 + i)  # served: room was made for it
closed = sum(closed_by_peer(s, 0.5) for s in silent)
assert closed == 20, "%d of the 30 silent connections were closed" % closed
assert all(closed_by_peer(s, 2.0) for s in silent[:20]), "not the oldest silent ones"
for i, s in enumerate(workers):
    step(s, 300 + i)  # the workers' connections were left alone
page = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics, timeout=10).read().decode()
assert "quorum_connections_evicted_total 20" in page, page[-2000:]
for s in workers + silent + fresh:
    s.close()
rc, _, err = stop_ps(ps, port)
assert rc == 0, err[-2000:]
assert "to make room for one from" in err, err[-2000:]
print("ok: at max-connections 40, 20 new connections closed the 20 oldest silent ones and were "
      "served; the workers' connections were left alone")

# --- 2. memory of idle connections ------------------------------------------
ps, port, _ = start_ps()
time.sleep(0.3)


def unix_connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    return s


for kind, open_one in (("TCP", lambda: connect(port)),
                       ("Unix", lambda: unix_connect("/tmp/quorum-127.0.0.1-%d.sock" % port))):
    before = rss_kb(ps.p.pid)
    idle = []
    for i in range(300):
        s = open_one()
        step(s, i + 1)
        idle.append(s)
    time.sleep(0.5)
    after = rss_kb(ps.p.pid)
    per = (after - before) / 300.0
    print("ok: 300 idle %s connections: %.1f KiB each (resident set %d -> %d KiB)"
          % (kind, per, before, after))
    assert per < 64, "an idle %s connection costs the ps %.1f KiB" % (kind, per)
    for s in idle:
        s.close()
    time.sleep(0.3)
rc, _, err = stop_ps(ps, port)
assert rc == 0, err[-2000:]

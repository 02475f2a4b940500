"""bench_rerep.py - the re-replication rate of a large shard against the
loopback socket's own rate, measured in one run (issue 29, item 7; goal:
a ratio of at least 0.5). docs/REPLICATION.md, "Re-replication" and "Cost".

Each copy is the real path: three `quorum ps` tasks with `--ps-replicas
2` (started here, each logging to a file), this script as worker 0
creating on ps 1 one dense variable of --shard-mib MiB (the shard) and a
small one (what pushes land on), and on ps 0 a tiny one; ps 1 is killed
(SIGKILL), ps 0 fails it over (ps 2 serves shard 1 from its copy), and a
replacement ps 1 is started at its address: ps 2 snapshots shard 1 and
streams it to the replacement, which loads it and then applies the
pushes made since. The copy's time is taken from ps 2's own log lines:
"snapshot taken" to "has loaded the snapshot" (the copy), and to "holds
it now" (caught up with the pushes made meanwhile).

Mode "idle": nothing else happens meanwhile. Mode "busy": a thread pushes
to the small variable of shard 1 on ps 2 (--push-kib per push, at most
--push-rate pushes/s) from the replacement's start until it holds the
shard: training going on, each push forwarded behind the snapshot.

The baseline, per transport, in the same run: the same number of bytes
through one socket of that transport (AF_UNIX socketpair, or a TCP
connection on 127.0.0.1), a sender thread and a receiver, 4 MiB at a
time; best of --baseline-tries.

    python3 bench/python/bench_rerep.py [--shard-mib 1024]
        [--transports unix,tcp] [--modes idle,busy] [--rounds 1]
        [--push-kib 64] [--push-rate 500] [--json PATH] [--logs DIR]
        [--quorum BIN]

Prints one table row per copy (bytes, seconds, GB/s, the socket's GB/s,
the ratio) and per transport and mode the best round. Memory: the shard
once in ps 2 (its copy; the snapshot is sent from it), once in the
replacement (received straight into its variables), twice in ps 1
before its kill, once in this process while it sends the CREATE; each
copy's row prints the peak RSS of ps 2 and of the replacement (1033 and
1032 MiB measured for --shard-mib 1024: under 5 GiB held at once).
Plain python3; the quorum binary: --quorum, else
$QUORUM_BINARY, else `quorum` on PATH. Every process it starts is killed
by pid at the end.
"""

from __future__ import annotations

import argparse
import json
import os
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
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import quorum_binary  # noqa: E402
from benchlib import free_port  # noqa: E402

# The loopback connect with retries that the integration tests use (as
# scripts/soak.py takes their log parser).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "integration"))
import qrtest  # noqa: E402

GOAL = 0.5
MAGIC, VERSION, ALIGN = 0x4D525551, 3, 64  # src/wire/proto.h
HELLO, CREATE, READY, PUSH = 1, 2, 3, 4
REPLY, PUSH_STEP = 0x80, 1
ROLE_WORKER_VIEW = 4
BIG, SMALL, TINY = 2, 3, 1  # variable ids: the shard's large one, its pushed one, ps 0's
CHUNK = 4 << 20


# ---- the wire, as a worker speaks it (tests/integration/qrtest.py has the same) ----

def pad(n: int) -> bytes:
    return b"\0" * (-n % ALIGN)


def send_frame(s: socket.socket, mtype: int, rid: int, meta: bytes = b"",
               payload_len: int = 0, payload: Optional[bytes] = None, flags: int = 0) -> None:
    """One message; a payload of payload_len zero bytes when payload is None."""
    s.sendall(struct.pack("<IBBHIiIIQ", MAGIC, VERSION, mtype, flags, rid, 0, len(meta), 0,
                          payload_len) + meta + pad(32 + len(meta)))
    if payload is not None:
        s.sendall(payload)
    else:
        zeros = memoryview(bytearray(min(payload_len, CHUNK)))
        left = payload_len
        while left:
            n = min(left, len(zeros))
            s.sendall(zeros[:n])
            left -= n
    s.sendall(pad(payload_len))


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = s.recv(n - len(buf))
        if not got:
            raise ConnectionError("connection closed after %d of %d bytes" % (len(buf), n))
        buf += got
    return bytes(buf)


def read_reply(s: socket.socket) -> Tuple[int, int, bytes]:
    """(type, status, meta) of the next message; its payload is skipped."""
    _, _, mtype, _, _, status, meta_len, _, payload_len = struct.unpack(
        "<IBBHIiIIQ", recv_exact(s, 32))
    meta = recv_exact(s, meta_len + len(pad(32 + meta_len)))[:meta_len]
    recv_exact(s, payload_len + len(pad(payload_len)))
    return mtype, status, meta


def request(s: socket.socket, mtype: int, rid: int, meta: bytes = b"", payload_len: int = 0,
            payload: Optional[bytes] = None, flags: int = 0) -> bytes:
    send_frame(s, mtype, rid, meta, payload_len, payload, flags)
    while True:
        got, status, rmeta = read_reply(s)
        if got == mtype | REPLY:
            break  # (a VIEW ps 0 sends unasked is skipped)
    if status:
        raise RuntimeError("%d answered %d: %s" % (mtype, status, rmeta.decode(errors="replace")))
    return rmeta


def connect(port: int, timeout: float = 30.0) -> socket.socket:
    """qrtest's connect, then a long timeout: a 1 GiB shard's requests
    take more than the connect's."""
    s: socket.socket = qrtest.connect(port, timeout)
    s.settimeout(600)
    return s


def worker_hello(port: int, shard: int, view: int) -> socket.socket:
    s = connect(port)
    request(s, HELLO, 1, struct.pack("<IIIQI", ROLE_WORKER_VIEW, 0, 0, view, shard))
    return s


def create_meta(items: List[Tuple[int, int, str]]) -> bytes:
    """Dense variables (id, floats, name) at the ps's learning rate."""
    meta = struct.pack("<I", len(items))
    for var_id, n, name in items:
        meta += struct.pack("<IIq", var_id, 1, n) + struct.pack("<fI", -1.0, len(name))
        meta += name.encode() + struct.pack("<I", 0) + struct.pack("<II", 0, 0)
        meta += struct.pack("<Q", 0)
    return meta


def push_meta(var_id: int, nbytes: int, seq: int) -> bytes:
    return struct.pack("<IqIIIQ", 1, 0, 0, seq, 1, 0) + struct.pack("<IIQQ", var_id, 0, nbytes, 0)


# ---- one copy ---------------------------------------------------------------------

STAMP = r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z \[ps 2 pid \d+\] info: "
TAKEN = re.compile(STAMP + r"re-replication of shard 1 to ps 1: snapshot taken")
SENT = re.compile(STAMP + r"re-replication of shard 1 to ps 1: snapshot made "
                  r"\((\d+) bytes")
LOADED = re.compile(STAMP + r"re-replication of shard 1: ps 1 has loaded the snapshot; "
                    r"(\d+) forwards")
HOLDS = re.compile(STAMP + r"re-replication of shard 1: ps 1 holds it now")


def stamp(text: str) -> float:
    return time.mktime(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")) + float(text[19:])


def peak_mib(pid: int) -> float:
    """A process's peak resident memory (VmHWM), MiB; 0 where /proc has none."""
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Cluster:
    """Three ps tasks of two copies on loopback, each logging to a file."""

    def __init__(self, quorum: str, transport: str, tmp: str) -> None:
        self.quorum, self.tmp = quorum, tmp
        self.ports = [free_port() for _ in range(3)]
        worker = free_port()
        self.flags = ["--ps_hosts", ",".join("127.0.0.1:%d" % p for p in self.ports),
                      "--worker_hosts", "127.0.0.1:%d" % worker, "--ps-replicas", "2",
                      "--transport", transport, "--lr", "0.001", "--linger-ms", "500",
                      "--heartbeat-ms", "100", "--heartbeat-timeout-ms", "60000",
                      "--restart-wait-ms", "600000"]
        self.procs: List[subprocess.Popen[bytes]] = []
        self.logs: List[str] = []
        for i in range(3):
            self.start(i)

    def start(self, i: int) -> subprocess.Popen[bytes]:
        log = os.path.join(self.tmp, "ps%d-%d.log" % (i, len(self.procs)))
        with open(log, "wb") as f:
            p = subprocess.Popen([self.quorum, "ps"] + self.flags +
                                 ["--job_name", "ps", "--task_index", str(i)],
                                 stdout=subprocess.DEVNULL, stderr=f)
        self.procs.append(p)
        self.logs.append(log)
        return p

    def log(self, i: int) -> str:
        """ps i's log (every run at that index, in order)."""
        return "".join(open(path, errors="replace").read() for path in self.logs
                       if os.path.basename(path).startswith("ps%d-" % i))

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def wait_for(what: str, cond: Any, timeout: float, cluster: Cluster) -> Any:
    deadline = time.time() + timeout
    while True:
        got = cond()
        if got:
            return got
        for i, p in enumerate(cluster.procs):
            if p.poll() is not None and i != 1:  # (ps 1's first run is killed)
                raise RuntimeError("%s: a ps exited (%d)\n%s" % (what, p.returncode,
                                                                  cluster.log(i % 3)[-3000:]))
        if time.time() > deadline:
            raise RuntimeError("%s: not within %.0f s\n%s" % (what, timeout,
                                                             cluster.log(2)[-3000:]))
        time.sleep(0.02)


def pusher(port: int, nbytes: int, rate: float, stop: threading.Event,
           count: List[int]) -> None:
    """Pushes to shard 1's small variable on ps 2 (view 1 on) until stop."""
    s = worker_hello(port, 1, 1)
    grad = b"\0" * (nbytes - 4) + struct.pack("<f", 1.0)
    seq, gap = 1000, 1.0 / rate
    try:
        while not stop.is_set():
            t = time.time()
            request(s, PUSH, seq, push_meta(SMALL, nbytes, seq), payload=grad, payload_len=nbytes,
                    flags=PUSH_STEP)
            seq += 1
            count[0] += 1
            time.sleep(max(0.0, gap - (time.time() - t)))
    finally:
        s.close()


def one_copy(quorum: str, transport: str, mode: str, args: argparse.Namespace) -> Dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="qr-bench-rerep-")
    c = Cluster(quorum, transport, tmp)
    stop = threading.Event()
    count = [0]
    t: Optional[threading.Thread] = None
    try:
        s0 = worker_hello(c.ports[0], 0, 0)
        s1 = worker_hello(c.ports[1], 1, 0)
        request(s0, CREATE, 2, create_meta([(TINY, 16, "tiny")]), payload_len=64)
        n = args.shard_mib << 18
        push_floats = args.push_kib << 8
        request(s1, CREATE, 2, create_meta([(BIG, n, "shard"), (SMALL, push_floats, "pushed")]),
                payload_len=4 * (n + push_floats))
        # READY is answered set once ps 0 is linked to every ps: a ps killed
        # before that is waited for as a restart, not failed over.
        wait_for("ps 0 linked to every ps", lambda: struct.unpack(
            "<I", request(s0, READY, 3, struct.pack("<IqQ", 1, 0, 0))[:4])[0], 60, c)
        s1.close()
        c.procs[1].send_signal(signal.SIGKILL)
        c.procs[1].wait()
        # (from ps 2's log, not STATS: STATS reads every byte of the shard
        # for its digest)
        wait_for("ps 1 failed over", lambda: "this ps serves ps 1's shard now" in c.log(2), 60, c)
        started = time.time()
        c.start(1)
        if mode == "busy":
            t = threading.Thread(target=pusher, args=(c.ports[2], push_floats * 4,
                                                       args.push_rate, stop, count))
            t.start()
        wait_for("shard 1 copied", lambda: HOLDS.search(c.log(2)), args.timeout, c)
        stop.set()
        if t:
            t.join()
        wait_for("re-replication complete", lambda: "re-replication complete" in c.log(0),
                 60, c)
        log = c.log(2)
        taken, sent, loaded = TAKEN.search(log), SENT.search(log), LOADED.search(log)
        holds = HOLDS.search(log)
        if not (taken and sent and loaded and holds):
            raise RuntimeError("ps 2's log lacks the copy's lines\n" + log[-3000:])
        copy_s = max(stamp(loaded[1]) - stamp(taken[1]), 0.001)
        source_mib, replacement_mib = peak_mib(c.procs[2].pid), peak_mib(c.procs[-1].pid)
        s0.close()
        return {"transport": transport, "mode": mode, "bytes": int(sent[2]),
                "copy_s": copy_s, "caught_up_s": stamp(holds[1]) - stamp(taken[1]),
                "joined_to_copied_s": stamp(holds[1]) - started,
                "pushes_meanwhile": count[0], "forwards_after_snapshot": int(loaded[2]),
                "source_peak_rss_mib": source_mib, "replacement_peak_rss_mib": replacement_mib}
    except (OSError, RuntimeError) as e:
        raise RuntimeError("%s\n%s" % (e, "".join("ps %d's log ends:\n%s\n" % (
            i, c.log(i)[-1500:]) for i in range(3)))) from e
    finally:
        stop.set()
        if t:
            t.join()
        c.close()
        if args.logs:  # each ps's log, for the copy's phases
            os.makedirs(args.logs, exist_ok=True)
            for path in c.logs:
                shutil.copy(path, os.path.join(args.logs, "%s-%s-%s" % (
                    transport, mode, os.path.basename(path))))
        shutil.rmtree(tmp, ignore_errors=True)


# ---- the loopback socket's own rate -------------------------------------------------

def socket_pair(transport: str) -> Tuple[socket.socket, socket.socket]:
    if transport == "unix":
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    listener = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(listener.getsockname())
    b, _ = listener.accept()
    listener.close()
    return a, b


def socket_seconds(transport: str, nbytes: int) -> float:
    """Seconds to move nbytes through one socket of `transport`, a sender
    thread and a receiver, CHUNK bytes at a time."""
    a, b = socket_pair(transport)
    block = memoryview(bytearray(CHUNK))
    into = memoryview(bytearray(CHUNK))

    def send() -> None:
        left = nbytes
        while left > 0:
            left -= a.send(block[:min(left, CHUNK)])
    sender = threading.Thread(target=send)
    start = time.perf_counter()
    sender.start()
    got = 0
    while got < nbytes:
        n = b.recv_into(into, min(CHUNK, nbytes - got))
        if not n:
            raise ConnectionError("the socket closed early")
        got += n
    seconds = time.perf_counter() - start
    sender.join()
    a.close()
    b.close()
    return seconds


# ---- the run --------------------------------------------------------------------------

def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def parse_list(text: str, allowed: Tuple[str, ...], flag: str) -> List[str]:
    got = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in got if x not in allowed]
    if not got or bad:
        raise SystemExit("bench_rerep.py: %s: %r is not a list of %s" % (
            flag, text, ", ".join(allowed)))
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shard-mib", type=int, default=1024,
                    help="the shard's large variable, MiB (default 1024)")
    ap.add_argument("--transports", default="unix,tcp", help="unix,tcp (default both)")
    ap.add_argument("--modes", default="idle,busy", help="idle,busy (default both)")
    ap.add_argument("--rounds", type=int, default=1, help="copies per transport and mode")
    ap.add_argument("--push-kib", type=int, default=64, help="busy: each push's size, KiB")
    ap.add_argument("--push-rate", type=float, default=500, help="busy: pushes/s at most")
    ap.add_argument("--baseline-tries", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600, help="s a copy may take")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--logs", help="keep the ps tasks' logs in this folder")
    ap.add_argument("--quorum", help="the quorum binary")
    a = ap.parse_args()
    def check(ok: bool, what: str) -> None:
        if not ok:
            print("bench_rerep.py: %s" % what, file=sys.stderr)
            raise SystemExit(2)
    check(1 <= a.shard_mib <= 1536, "--shard-mib must be 1 to 1536 (a snapshot travels as "
          "one message, under max-message-mb 2048), got %d" % a.shard_mib)
    check(a.rounds >= 1, "--rounds must be at least 1, got %d" % a.rounds)
    check(1 <= a.push_kib <= 4096, "--push-kib must be 1 to 4096, got %d" % a.push_kib)
    check(a.push_rate > 0, "--push-rate must be above 0, got %g" % a.push_rate)
    check(a.baseline_tries >= 1, "--baseline-tries must be at least 1")
    transports = parse_list(a.transports, ("unix", "tcp"), "--transports")
    modes = parse_list(a.modes, ("idle", "busy"), "--modes")
    quorum = a.quorum or quorum_binary()
    check(shutil.which(quorum) is not None, "no quorum binary at %r (--quorum or "
          "$QUORUM_BINARY)" % quorum)

    print("re-replication of a %d MiB shard (ps 2 to a replacement ps 1) against the loopback "
          "socket's rate; goal: a ratio of %.1f or more" % (a.shard_mib, GOAL))
    print("| transport | mode | bytes | copy s | copy GB/s | socket s | socket GB/s | ratio | "
          "caught up s | pushes meanwhile | peak RSS MiB source / replacement |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows: List[Dict[str, Any]] = []
    socket_best: Dict[str, float] = {}
    for transport in transports:
        for mode in modes:
            for _ in range(a.rounds):
                r = one_copy(quorum, transport, mode, a)
                # the socket measured now, for the same bytes: best of a few
                tries = [socket_seconds(transport, r["bytes"]) for _ in range(a.baseline_tries)]
                r["socket_s"] = min(tries)
                r["copy_gbps"] = gbps(r["bytes"], r["copy_s"])
                r["socket_gbps"] = gbps(r["bytes"], r["socket_s"])
                r["ratio"] = r["copy_gbps"] / r["socket_gbps"]
                socket_best[transport] = max(socket_best.get(transport, 0), r["socket_gbps"])
                rows.append(r)
                print("| %s | %s | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %d | %.0f / %.0f |"
                      % (transport, mode, r["bytes"], r["copy_s"], r["copy_gbps"], r["socket_s"],
                         r["socket_gbps"], r["ratio"], r["caught_up_s"], r["pushes_meanwhile"],
                         r["source_peak_rss_mib"], r["replacement_peak_rss_mib"]), flush=True)
    best = []
    for transport in transports:
        for mode in modes:
            mine = [r for r in rows if r["transport"] == transport and r["mode"] == mode]
            top = max(mine, key=lambda r: r["ratio"])
            best.append({"transport": transport, "mode": mode, "ratio": top["ratio"],
                         "copy_gbps": top["copy_gbps"], "socket_gbps": top["socket_gbps"]})
            print("best %s %s: copy %.3f GB/s, socket %.3f GB/s, ratio %.3f (%s)" % (
                transport, mode, top["copy_gbps"], top["socket_gbps"], top["ratio"],
                "met" if top["ratio"] >= GOAL else "NOT met"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"shard_mib": a.shard_mib, "goal": GOAL, "rows": rows, "best": best}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bench_netns.py - a worker and a ps on either side of a link with a set
bandwidth and latency, not loopback: the step model (step_model.py,
docs/PERFORMANCE.md) checked on a network (issue 27, item 6).

It makes two network namespaces of its own (named after its pid) joined by
a veth pair, runs `quorum ps` in one and a quorum.Worker timing push_pull
of one variable of each size in the other (async: one fused round trip;
sync with one worker: one round trip too, the push answered once its step
is applied, docs/SYNC.md "One round trip"), and prints each step's median
time beside the model's: R x RTT + 2 x S x wire overhead / bandwidth +
the ps's apply time, with RTT = the set round trip + the transport's own
(`quorum bench wire` over loopback TCP), the apply rate from `quorum bench
optim`, and the bytes TCP/IP and Ethernet add (1514 on the wire per 1448
of payload).

The link: `tc qdisc ... netem delay D rate R` on both ends where the kernel
has netem. Where it has not (sch_netem missing: "Specified qdisc kind is
unknown"), the rate is set with a token bucket (tbf) on both ends, and the
latency by a relay of this file's own in the ps's namespace: the worker
connects to it, and it forwards each chunk it reads to the ps (on
127.0.0.1) only once half the round trip has passed since it arrived, in
both directions (bounded: at most 64 MiB held per direction). The output
says which was used.

Needs root and iproute2; exits 77 (skipped) with the reason otherwise.
Namespaces, the relay and the ps are removed/killed (by pid) at the end,
whatever happens.

    bench_netns.py [--gbit 1] [--rtt-ms 2] [--sizes 4K,256K,1M,4M]
                   [--seconds 1] [--modes async,sync] [--json] [--quick]

Paths as bench_env.py: $QUORUM_BINARY or `quorum` on PATH, and
$QUORUM_LIBRARY for the worker's Python package."""

from __future__ import annotations

import argparse
import collections
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_env  # noqa: E402
import step_model  # noqa: E402

SKIP = 77
PS_IP, WORKER_IP = "10.216.0.1", "10.216.0.2"
PS_PORT, WORKER_PORT = 7300, 7301
WIRE_OVERHEAD = 1514.0 / 1448.0  # Ethernet + IP + TCP (timestamps) per full segment
RELAY_HOLD = 64 << 20            # bytes the relay holds per direction at most


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    t = text.strip().upper()
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t[-1:] in units else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError("not a size: %r" % text) from None


# ---- the relay (run in the ps's namespace) ---------------------------------------------------

def relay_pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """Forward src to dst, each chunk once `delay` has passed since it was
    read. A reader and a writer thread share a queue of (due, bytes)."""
    queue: collections.deque = collections.deque()
    cond = threading.Condition()
    held = [0, False]  # bytes held, src closed

    def reader() -> None:
        while True:
            try:
                data = src.recv(1 << 18)
            except OSError:
                data = b""
            with cond:
                if not data:
                    held[1] = True
                    cond.notify_all()
                    return
                while held[0] > RELAY_HOLD:
                    cond.wait()
                queue.append((time.monotonic() + delay, data))
                held[0] += len(data)
                cond.notify_all()

    threading.Thread(target=reader, daemon=True).start()
    while True:
        with cond:
            while not queue and not held[1]:
                cond.wait()
            if not queue:
                break
            due, data = queue.popleft()
            held[0] -= len(data)
            cond.notify_all()
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        try:
            dst.sendall(data)
        except OSError:
            break
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def tune(s: socket.socket) -> None:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        s.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)


def relay(listen: str, target: str, delay: float) -> None:
    """Accept on `listen`, connect each to `target`, delay both directions."""
    host, port = listen.rsplit(":", 1)
    thost, tport = target.rsplit(":", 1)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(64)
    print("relay ready", flush=True)
    while True:
        a, _ = srv.accept()
        try:
            b = socket.create_connection((thost, int(tport)), timeout=10)
        except OSError:
            a.close()
            continue
        b.settimeout(None)
        for s in (a, b):
            tune(s)
        threading.Thread(target=relay_pump, args=(a, b, delay), daemon=True).start()
        threading.Thread(target=relay_pump, args=(b, a, delay), daemon=True).start()


# ---- the worker side (run in the worker's namespace) -----------------------------------------

def worker_side(ps_addr: str, mode: str, sizes: List[int], seconds: float, min_steps: int) -> None:
    """Time push_pull of each variable; print one JSON line of medians."""
    import numpy as np
    import quorum
    cluster = quorum.Cluster([ps_addr], ["%s:%d" % (WORKER_IP, WORKER_PORT)], "worker", 0)
    w = quorum.Worker(cluster, mode=mode, lr=1e-9, transport="tcp", timeout_ms=60000)
    for s in sizes:
        w.declare("v%d" % s, s // 4)
    w.initialize()
    out = []
    for s in sizes:
        name = "v%d" % s
        g = {name: np.full(s // 4, 1e-6, dtype=np.float32)}
        into = {name: np.empty(s // 4, dtype=np.float32)}
        for _ in range(3):
            w.push_pull(g, into=into)
        times = []
        t_end = time.perf_counter() + seconds
        while len(times) < min_steps or time.perf_counter() < t_end:
            t0 = time.perf_counter()
            w.push_pull(g, into=into)
            times.append(time.perf_counter() - t0)
        out.append({"size_bytes": s, "steps": len(times), "median_s": float(np.median(times))})
    w.stop_cluster()
    w.close()
    print(json.dumps({"mode": mode, "points": out}), flush=True)


# ---- the namespaces ------------------------------------------------------------------------

class Link:
    """Two namespaces and a veth pair, shaped; removed by close()."""

    def __init__(self, tag: str):
        self.ps_ns, self.w_ns = tag + "p", tag + "w"
        self.made: List[str] = []
        self.shaping = ""

    def sh(self, *args: str, ns: Optional[str] = None, check: bool = True) -> Any:
        cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)

    def make(self) -> None:
        for ns in (self.ps_ns, self.w_ns):
            self.sh("ip", "netns", "add", ns)
            self.made.append(ns)
        self.sh("ip", "link", "add", "eth0", "netns", self.ps_ns, "type", "veth", "peer", "name",
                "eth0", "netns", self.w_ns)
        for ns, addr in ((self.ps_ns, PS_IP), (self.w_ns, WORKER_IP)):
            self.sh("ip", "addr", "add", addr + "/24", "dev", "eth0", ns=ns)
            self.sh("ip", "link", "set", "eth0", "up", ns=ns)
            self.sh("ip", "link", "set", "lo", "up", ns=ns)

    def shape(self, gbit: float, rtt: float, use_netem: bool) -> bool:
        """Rate and latency on both ends; True if netem does the latency."""
        rate = "%dkbit" % int(gbit * 1e6)
        if use_netem:
            ok = all(self.sh("tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay",
                             "%dus" % int(rtt / 2 * 1e6), "rate", rate, "limit", "100000",
                             ns=ns, check=False).returncode == 0
                     for ns in (self.ps_ns, self.w_ns))
            if ok:
                self.shaping = "netem delay %.0f us each way, rate %s" % (rtt / 2 * 1e6, rate)
                return True
            for ns in (self.ps_ns, self.w_ns):
                self.sh("tc", "qdisc", "del", "dev", "eth0", "root", ns=ns, check=False)
        # burst: 100 us of bytes at the rate (16 KiB at least): a larger bucket
        # refills while a step waits on the round trip and lets a whole
        # message through at the veth's own speed.
        burst = max(16 << 10, int(gbit * 1e9 / 8 * 100e-6))
        for ns in (self.ps_ns, self.w_ns):
            self.sh("tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst",
                    str(burst), "latency", "200ms", ns=ns)
        self.shaping = "tbf rate %s (burst %d B) + relay delay %.0f us each way" % (
            rate, burst, rtt / 2 * 1e6)
        return False

    def close(self) -> None:
        for ns in self.made:
            self.sh("ip", "netns", "del", ns, check=False)
        self.made = []


def netem_available() -> bool:
    """Whether this kernel has sch_netem, tried on a throwaway namespace's lo."""
    ns = "qrnetem%d" % os.getpid()
    try:
        if subprocess.run(["ip", "netns", "add", ns], capture_output=True, timeout=30).returncode:
            return False
        return subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo",
                               "root", "netem", "delay", "1ms"], capture_output=True,
                              timeout=30).returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def can_run() -> Optional[str]:
    """None, or why namespaces cannot be made here."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "iproute2 (ip, tc) is not installed"
    ns = "qrprobe%d" % os.getpid()
    p = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True, timeout=30)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    if p.returncode:
        return "cannot create a network namespace here: %s" % p.stderr.strip()
    return None


def measured_params(quorum: str, quick: bool) -> Dict[str, float]:
    """The transport's own round trip (loopback TCP, fused, 64 B) and the ps's
    dense SGD apply rate, from quorum's benchmarks."""
    optim = step_model.load_text(subprocess.run(
        [quorum, "bench", "optim", "--optim", "sgd", "--no-sparse", "--threads", "1", "--n",
         str(1 << 20), "--reps", "2" if quick else "5", "--json"],
        check=True, capture_output=True, text=True, timeout=120).stdout)
    wire = step_model.load_text(subprocess.run(
        [quorum, "bench", "wire", "--ops", "fused", "--ps", "1", "--workers", "1", "--transports",
         "tcp", "--sizes", "64", "--repeat", "1" if quick else "3", "--seconds",
         "0.02" if quick else "0.2", "--json"],
        check=True, capture_output=True, text=True, timeout=120).stdout)
    return {"apply_rate": step_model.apply_from_optim(optim),
            "base_rtt_s": wire["results"][0]["latency_us"] * 1e-6}


def predict(size: int, mode: str, gbit: float, rtt: float, apply_rate: float,
            rtts: int) -> float:
    """step_model's step for one worker, one ps, one variable, no compute."""
    s = step_model.Step(model_bytes=float(size), workers=1, ps=1,
                        bandwidth=gbit * step_model.GBIT / WIRE_OVERHEAD, rtt=rtt,
                        apply_rate=apply_rate, compute=0.0, batch=1, sync_rtts=rtts)
    return (step_model.sync_step(s) if mode == "sync" else step_model.async_step(s))["step_s"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gbit", type=float, default=1.0, help="link rate, Gbit/s (default 1)")
    ap.add_argument("--rtt-ms", type=float, default=2.0, help="added round trip (default 2)")
    ap.add_argument("--sizes", default="4K,256K,1M,4M", help="bytes of the variable")
    ap.add_argument("--seconds", type=float, default=1.0, help="timing per size (default 1)")
    ap.add_argument("--modes", default="async,sync")
    ap.add_argument("--no-netem", action="store_true", help="tbf and the relay even with netem")
    ap.add_argument("--json", action="store_true", help="one JSON object last")
    ap.add_argument("--quick", action="store_true", help="small sizes, short (a smoke test)")
    ap.add_argument("--relay", nargs=3, metavar=("LISTEN", "TARGET", "DELAY_S"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--worker-side", nargs=3, metavar=("PS", "MODE", "SIZES"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.relay:
        relay(a.relay[0], a.relay[1], float(a.relay[2]))
        return 0
    if a.worker_side:
        worker_side(a.worker_side[0], a.worker_side[1],
                    [int(x) for x in a.worker_side[2].split(",")], a.seconds,
                    3 if a.quick else 10)
        return 0
    sizes = [parse_size(x) for x in a.sizes.split(",") if x]
    modes = [m for m in a.modes.split(",") if m]
    if a.quick:
        sizes, a.seconds = [4096, 256 << 10], 0.2
    if not sizes or any(s < 4 or s % 4 for s in sizes):
        ap.error("--sizes: positive multiples of 4 bytes, got %r" % a.sizes)
    if not modes or any(m not in ("async", "sync") for m in modes):
        ap.error("--modes: async and/or sync, got %r" % a.modes)
    if not (a.gbit > 0 and a.rtt_ms >= 0 and a.seconds > 0):
        ap.error("--gbit and --seconds must be positive and --rtt-ms >= 0")
    why = can_run()
    if why:
        print("SKIP: %s" % why)
        return SKIP
    quorum = bench_env.quorum_binary()
    rtt = a.rtt_ms / 1e3
    m = bench_env.machine(with_torch=False)
    print(bench_env.header(m), flush=True)
    params = measured_params(quorum, a.quick)
    link = Link("qn%d" % os.getpid())
    procs: List[subprocess.Popen] = []

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    results: List[Dict[str, Any]] = []
    try:
        link.make()
        netem = link.shape(a.gbit, rtt, not a.no_netem and netem_available())
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        ps_addr = "%s:%d" % (PS_IP, PS_PORT)
        for mode in modes:
            bind = []
            if not netem:  # the ps on 127.0.0.1, the relay on the link's address
                bind = ["--bind", "127.0.0.1"]
                r = subprocess.Popen(["ip", "netns", "exec", link.ps_ns, sys.executable,
                                      os.path.abspath(__file__), "--relay", ps_addr,
                                      "127.0.0.1:%d" % PS_PORT, str(rtt / 2)],
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
                procs.append(r)
                if r.stdout is None or not select.select([r.stdout], [], [], 30)[0] or \
                        "ready" not in r.stdout.readline():
                    raise RuntimeError("the relay did not start")
            ps = subprocess.Popen(["ip", "netns", "exec", link.ps_ns, quorum, "ps", "--ps_hosts",
                                   ps_addr, "--worker_hosts", "%s:%d" % (WORKER_IP, WORKER_PORT),
                                   "--job_name", "ps", "--task_index", "0", "--mode", mode,
                                   "--lr", "1e-9", "--transport", "tcp"] + bind,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env=env, start_new_session=True)
            procs.append(ps)
            cmd = ["ip", "netns", "exec", link.w_ns, sys.executable, os.path.abspath(__file__),
                   "--seconds", str(a.seconds), "--worker-side", ps_addr, mode,
                   ",".join(map(str, sizes))] + (["--quick"] if a.quick else [])
            w = subprocess.run(cmd, capture_output=True, text=True, env=env,
                               timeout=120 + 4 * a.seconds * len(sizes))
            if w.returncode:
                raise RuntimeError("the worker failed: " + w.stderr[-2000:])
            doc = step_model.load_text(w.stdout)
            for pt in doc["points"]:
                full_rtt = rtt + params["base_rtt_s"]
                pt.update({"mode": mode,
                           "predicted_s": predict(pt["size_bytes"], mode, a.gbit, full_rtt,
                                                  params["apply_rate"], 3),
                           "predicted_1rtt_s": predict(pt["size_bytes"], mode, a.gbit, full_rtt,
                                                       params["apply_rate"], 1)})
                results.append(pt)
            try:
                ps.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            for p in procs:  # the ps and the relay of this mode, by pid
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            procs = []
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        link.close()
    print("link: %.3g Gbit/s, %.3g ms round trip set (%s); transport's own round trip %.1f us, "
          "ps apply %.1f GB/s" % (a.gbit, a.rtt_ms, link.shaping, params["base_rtt_s"] * 1e6,
                                  params["apply_rate"] / 1e9))
    print("  model: R x RTT + 2 x size x %.3f / rate + apply; R = 3 (a sync step as push, token, "
          "pull) or 1 (async and sync push_pull: one trip); 'RTTs seen': (measured - the rest of the model) / RTT"
          % WIRE_OVERHEAD)
    print("  %-6s %9s %12s %12s %12s %9s %10s" % ("mode", "size", "measured ms", "model ms",
                                                  "model 1 RTT", "meas/mod", "RTTs seen"))
    full_rtt = rtt + params["base_rtt_s"]
    for pt in results:
        pt["rtts_seen"] = (pt["median_s"] - (pt["predicted_1rtt_s"] - full_rtt)) / full_rtt
        print("  %-6s %9d %12.3f %12.3f %12.3f %8.2fx %10.2f" % (
            pt["mode"], pt["size_bytes"], pt["median_s"] * 1e3, pt["predicted_s"] * 1e3,
            pt["predicted_1rtt_s"] * 1e3, pt["median_s"] / pt["predicted_s"], pt["rtts_seen"]))
    if a.json:
        print(json.dumps({"benchmark": "netns", "machine": m, "gbit": a.gbit, "rtt_ms": a.rtt_ms,
                          "shaping": link.shaping, "netem": netem,
                          "namespaces": [link.ps_ns, link.w_ns], "params": params,
                          "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

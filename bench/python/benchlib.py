"""benchlib.py - how the end-to-end benchmarks under bench/python run the
processes they measure: free ports, ps tasks started by hand and waited
for, and commands run side by side, each in a process group of its own,
with a deadline, killed by pid (never by name) when late, when one fails
or when the benchmark is stopped. Shared by bench_scaling.py,
bench_sync_step.py and bench_torch.py, which import it from beside
themselves; what the figures were measured on is bench_env.py's."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

LIVE: List[subprocess.Popen[str]] = []  # process groups to kill if this one is stopped


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_group(p: subprocess.Popen[Any]) -> None:
    """Kill the process group this run started (its leader's pid is its id)."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def task_role(cmdline: List[str]) -> str:
    """What a process of a run is, from its argv: `quorum ps ...` is "ps",
    `quorum launch ...` "launch", anything else (`quorum worker`, a Python
    worker) "worker"."""
    if len(cmdline) > 1 and os.path.basename(cmdline[0]).startswith("quorum"):
        if cmdline[1] in ("ps", "launch"):
            return cmdline[1]
    return "worker"


class CpuSampler:
    """The CPU time (user + system) of every process in some process
    groups, by role (task_role), read from /proc every `period` seconds
    while they run: a profile of where a run's cores went without a
    profiler (the device machines have no perf). A process's last sample
    stands for its total, so up to `period` of its end is missed; the
    share of a run that is wall time spent waiting is 1 - cpu / wall."""

    def __init__(self, period: float = 0.2):
        self.period = period
        self.groups: List[int] = []
        self.seen: Dict[int, Any] = {}  # pid -> (role, cpu seconds)
        self.series: List[Any] = []  # (time.time(), {role: cpu seconds so far}) per sample
        self.t0 = time.monotonic()
        self.t1: Optional[float] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def start(self, groups: List[int]) -> None:
        self.groups = list(groups)
        self.t0 = time.monotonic()
        self._thread.start()

    def _sample(self) -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % name) as f:
                    stat = f.read()
                fields = stat[stat.rindex(")") + 2:].split()
                if int(fields[2]) not in self.groups:  # pgrp
                    continue
                cpu = (int(fields[11]) + int(fields[12])) / self._tick  # utime + stime
                pid = int(name)
                # The role is read again at every sample: a process caught
                # between its fork and its exec still shows its parent's
                # argv (the benchmark's Python), which task_role takes
                # for a worker.
                # (A zombie's argv is empty: it keeps the role it had.)
                with open("/proc/%s/cmdline" % name) as f:
                    argv = f.read().split("\0")
                role = task_role(argv) if argv[0] or pid not in self.seen else self.seen[pid][0]
                self.seen[pid] = (role, cpu)
            except (OSError, ValueError, IndexError):
                continue  # ended between listdir and read
        totals: Dict[str, float] = {}
        for role, seconds in self.seen.values():
            totals[role] = totals.get(role, 0.0) + seconds
        self.series.append((time.time(), totals))

    def _run(self) -> None:
        # The first samples come closer together (10, 20, 40 ms ... up to
        # `period`): a short run (a smoke test's, under 0.1 s) is still
        # seen past the moment between its fork and its exec.
        wait = min(0.01, self.period)
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(wait)
            wait = min(2 * wait, self.period)

    def window(self, t_from: float, t_to: float) -> Dict[str, float]:
        """Cores busy by role between two time.time() moments (the samples
        nearest inside them): a window that leaves start-up out."""
        inside = [x for x in self.series if t_from <= x[0] <= t_to]
        if len(inside) < 2:
            return {}
        (ta, a), (tb, b) = inside[0], inside[-1]
        return {role: (b[role] - a.get(role, 0.0)) / (tb - ta) for role in b if tb > ta}

    def stop(self) -> Dict[str, Any]:
        """{"wall_s", "cpu_s": {role: seconds}, "tasks": {role: count}}."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.t1 is None:
            self.t1 = time.monotonic()
        cpu: Dict[str, float] = {}
        tasks: Dict[str, int] = {}
        for role, seconds in self.seen.values():
            cpu[role] = cpu.get(role, 0.0) + seconds
            tasks[role] = tasks.get(role, 0) + 1
        return {"wall_s": self.t1 - self.t0, "cpu_s": cpu, "tasks": tasks}


def run_all(cmds: Sequence[List[str]], env: Dict[str, str], timeout: float,
            cpu: Optional[CpuSampler] = None) -> List[str]:
    """Run commands side by side, each in a process group of its own; their
    stdouts. Raises RuntimeError (with the stderr's tail) if one fails or
    the deadline passes; every group is killed before returning. With
    `cpu`, its sampler follows their process groups until they end."""
    procs = []
    try:
        for c in cmds:
            procs.append(subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=env, start_new_session=True))
            LIVE.append(procs[-1])
        if cpu:
            cpu.start([p.pid for p in procs])
        deadline = time.monotonic() + timeout
        outs = []
        for p, c in zip(procs, cmds):
            try:
                out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError("%s: no end after %.0f s (killed)" % (" ".join(c[:4]), timeout))
            if p.returncode:
                raise RuntimeError("%s failed (%d): %s" % (" ".join(c[:4]), p.returncode,
                                                           err[-1500:]))
            outs.append(out)
        return outs
    finally:
        if cpu:
            cpu.stop()
        for p in procs:
            kill_group(p)
            LIVE.remove(p)


def start_ps_tasks(quorum: str, ps_hosts: List[str], worker_hosts: List[str],
                   args: List[str]) -> List[subprocess.Popen[bytes]]:
    """`quorum ps` for every address of ps_hosts (the cluster's workers at
    worker_hosts, started by the caller), with `args` flags, their output
    discarded. They end once the chief stops the cluster: stop_ps_tasks."""
    return [subprocess.Popen([quorum, "ps", "--ps_hosts", ",".join(ps_hosts), "--worker_hosts",
                              ",".join(worker_hosts), "--job_name", "ps", "--task_index", str(i)]
                             + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for i in range(len(ps_hosts))]


def stop_ps_tasks(procs: List[subprocess.Popen[bytes]]) -> None:
    """Wait for ps tasks to end (30 s each), killing one that does not."""
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

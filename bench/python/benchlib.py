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
import time
from typing import Any, Dict, List, Sequence

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


def run_all(cmds: Sequence[List[str]], env: Dict[str, str], timeout: float) -> List[str]:
    """Run commands side by side, each in a process group of its own; their
    stdouts. Raises RuntimeError (with the stderr's tail) if one fails or
    the deadline passes; every group is killed before returning."""
    procs = []
    try:
        for c in cmds:
            procs.append(subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=env, start_new_session=True))
            LIVE.append(procs[-1])
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

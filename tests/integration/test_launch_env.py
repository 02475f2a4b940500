"""test_launch_env.py - `quorum launch -- COMMAND` prepares each worker as
torchrun does: RANK and LOCAL_RANK its task index (TF_CONFIG's), WORLD_SIZE
and LOCAL_WORLD_SIZE the number of workers (every task runs on this
machine), no MASTER_ADDR/MASTER_PORT (nothing serves a torch.distributed
rendezvous), and OMP_NUM_THREADS=1 for every task, ps tasks included,
said once on the launcher's stderr; an OMP_NUM_THREADS the user set is
kept, and then nothing is said. OPENBLAS_NUM_THREADS is 1 for every task
unless set. Usage: test_launch_env.py QUORUM_BINARY"""

import json
import os
import sys

from qrtest import Proc

quorum = sys.argv[1]

# Each worker prints one line: its environment's torchrun variables, its
# TF_CONFIG task, and (worker 0) those of its sibling ps task, read from
# /proc while the ps runs (the launcher stops it once the workers are done).
PROGRAM = r"""
import json, os, sys
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT"]
out = {k: os.environ.get(k) for k in keys}
out["task"] = json.loads(os.environ["TF_CONFIG"])["task"]
ps = []
parent = os.getppid()
for pid in open("/proc/%d/task/%d/children" % (parent, parent)).read().split():
    try:
        argv = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
        env = open("/proc/%s/environ" % pid, "rb").read().split(b"\0")
    except OSError:
        continue
    if len(argv) > 1 and argv[1] == b"ps":
        env = dict(e.decode().split("=", 1) for e in env if b"=" in e)
        ps.append({k: env.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RANK")})
out["ps"] = ps
sys.stdout.write("ENV " + json.dumps(out) + "\n")
sys.stdout.flush()
"""

NOTICE = "quorum launch: setting OMP_NUM_THREADS=1 for every task, as torchrun does"


def launch(extra_env):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT",
                        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(extra_env)
    rc, out, err = Proc([quorum, "launch", "--ps", "1", "--workers", "3", "--",
                         sys.executable, "-c", PROGRAM], env=env).wait(120)
    assert rc == 0, (rc, err[-3000:])
    found = [json.loads(l[4:]) for l in out.splitlines() if l.startswith("ENV ")]
    assert len(found) == 3, (out, err[-3000:])
    return sorted(found, key=lambda e: e["task"]["index"]), err


# Defaults: torchrun's variables per worker, one thread per task, said once.
workers, err = launch({})
for index, e in enumerate(workers):
    assert e["task"] == {"type": "worker", "index": index}, e
    assert (e["RANK"], e["WORLD_SIZE"]) == (str(index), "3"), e
    assert (e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) == (str(index), "3"), e
    assert e["OMP_NUM_THREADS"] == "1" and e["OPENBLAS_NUM_THREADS"] == "1", e
    assert e["MASTER_ADDR"] is None and e["MASTER_PORT"] is None, e
ps = [p for e in workers for p in e["ps"]]
assert ps, "no worker saw the ps task running: %r" % workers
for p in ps:  # the ps tasks get the thread counts, not the workers' ranks
    assert p == {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "RANK": None}, p
assert err.count(NOTICE) == 1, err
notice = [l for l in err.splitlines() if NOTICE in l][0]
assert "1 ps task and 3 workers" in notice and "set OMP_NUM_THREADS to tune it" in notice, notice
print("ok: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE per worker; OMP_NUM_THREADS=1, said once")

# The user's values are kept, for every task, and nothing is said.
workers, err = launch({"OMP_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "2"})
for e in workers:
    assert e["OMP_NUM_THREADS"] == "3" and e["OPENBLAS_NUM_THREADS"] == "2", e
    for p in e["ps"]:
        assert p["OMP_NUM_THREADS"] == "3" and p["OPENBLAS_NUM_THREADS"] == "2", p
assert "OMP_NUM_THREADS" not in err, err
print("ok: a user's OMP_NUM_THREADS=3 (and OPENBLAS_NUM_THREADS=2) kept, nothing said")
print("PASS: launch prepares workers as torchrun does")

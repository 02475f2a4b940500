"""test_launch.py - the launcher's supervision and the CLI's validation:
bad options are refused before any process starts; a failing task stops
the whole cluster, with the failure reported and nothing left running;
--help works for every subcommand. Usage: test_launch.py QUORUM_BINARY"""

import os
import sys
import time

from qrtest import Proc

quorum = sys.argv[1]


def run(args, timeout=60):
    return Proc([quorum] + args).wait(timeout)


for cmd in (["--help"], ["ps", "--help"], ["worker", "--help"], ["launch", "--help"],
            ["bench", "--help"]):
    rc, out, err = run(cmd)
    assert rc == 0 and "usage" in out, (cmd, rc, out, err)
print("ok: --help")

cases = [
    (["launch", "--ps", "0"], "--ps 0"),
    (["launch", "--optimzer", "adam"], "unknown option --optimzer"),
    (["launch", "--lr", "-1"], "option lr: -1 is out of range: must be > 0"),
    (["launch", "--model", "cnn"], "expected softmax, mlp, logreg or wide-deep"),
    (["launch", "--hidden", "12,x"], "expected widths like 256,128"),
    (["worker", "--ps_hosts", "", "--worker_hosts", "127.0.0.1:1", "--job_name", "worker",
      "--task_index", "0"], "ps_hosts is empty"),
    (["worker", "--ps_hosts", "127.0.0.1:99999", "--worker_hosts", "127.0.0.1:1",
      "--job_name", "worker", "--task_index", "0"], "out of range"),
    (["ps", "--ps_hosts", "127.0.0.1:5000", "--worker_hosts", "127.0.0.1:5001",
      "--job_name", "chef", "--task_index", "0"], "unknown job name 'chef'"),
    (["worker", "--ps_hosts", "127.0.0.1:5000", "--worker_hosts", "127.0.0.1:5001",
      "--job_name", "worker", "--task_index", "3"], "out of range"),
]
for args, phrase in cases:
    rc, out, err = run(args)
    assert rc == 2, (args, rc, err)
    assert phrase in err, "%s: %r not in %r" % (args, phrase, err)
print("ok: bad options refused with clear errors")

env = dict(os.environ, TF_CONFIG='{"cluster": {"ps": ["127.0.0.1:1"]}, oops}')
rc, out, err = Proc([quorum, "worker"], env=env).wait(30)
assert rc == 2 and "TF_CONFIG" in err, err
print("ok: malformed TF_CONFIG refused")

# A task that fails (no such data) stops the cluster, and is named.
start = time.time()
rc, out, err = run(["launch", "--ps", "2", "--workers", "2", "--data", "/no/such/data",
                    "--timeout-ms", "3000"], timeout=120)
assert rc == 1, (rc, err)
assert "exited with status 1" in err and "stopping the other tasks" in err, err
print("ok: a failing task stops the cluster (%.1f s)" % (time.time() - start))

# A launcher stopped with SIGTERM stops its children.
p = Proc([quorum, "launch", "--ps", "1", "--workers", "2", "--data", "digits",
          "--steps", "100000000", "--quiet"])
time.sleep(3)
assert p.alive(), "launch ended early"
children = [int(x) for x in open("/proc/%d/task/%d/children" % (p.p.pid, p.p.pid)).read().split()]
assert len(children) == 3, children
for pid in children:
    # No OpenBLAS thread pool spinning in the tasks (launch.c).
    env = open("/proc/%d/environ" % pid, "rb").read().split(b"\0")
    assert b"OPENBLAS_NUM_THREADS=1" in env, "child %d: OpenBLAS threads not set to 1" % pid
p.p.terminate()
rc, out, err = p.wait(60)
assert rc == 130, (rc, err)
time.sleep(0.2)
for pid in children:
    assert not os.path.exists("/proc/%d" % pid) or \
        open("/proc/%d/stat" % pid).read().split()[2] == "Z", "child %d still running" % pid
print("PASS: launcher supervision")

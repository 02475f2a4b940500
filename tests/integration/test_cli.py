"""test_cli.py - what a new user meets on the command line: --help
describes and exits 0 everywhere and lists the choices of the enumerated
options; quorum train --local calls itself sync; an error names its worker
once; options the run would ignore (the other mode's, a --slow-worker with
no such worker) are refused, naming the option; a typo gets a "did you
mean". Usage: test_cli.py QUORUM_BINARY"""

import json
import sys

from qrtest import Proc, last_json, free_port

quorum = sys.argv[1]


def run(args, timeout=60):
    return Proc([quorum] + args).wait(timeout)


# --help everywhere: exit 0, a description on stdout, nothing on stderr.
helps = [["--help"], ["-h"], ["help"], ["version", "--help"], ["ps", "--help"],
         ["worker", "--help"], ["launch", "--help"], ["train", "--help"], ["bench", "--help"],
         ["bench", "wire", "--help"], ["bench", "optim", "--help"], ["bench", "optim", "-h"]]
for cmd in helps:
    rc, out, err = run(cmd)
    assert rc == 0, (cmd, rc, out, err)
    assert "usage" in out and len(out.splitlines()) >= 3 and len(out) > 60, (cmd, out)
    assert err == "", (cmd, err)
rc, out, err = run(["bench", "optim", "--help"])
for flag in ("--quick", "--json", "--threads", "--optim", "bandwidth"):
    assert flag in out, (flag, out)
print("ok: --help describes and exits 0 for every command")

# The choices of every enumerated option, in every command that takes it.
choices = ["sgd|momentum|adagrad|rmsprop|adam|adam_async|ftrl", "async|sync", "mean|sum",
           "auto|tcp|unix", "error|skip", "softmax|mlp"]
for cmd in ("ps", "worker", "launch", "train"):
    rc, out, err = run([cmd, "--help"])
    for c in choices:
        if c == "softmax|mlp" and cmd == "ps":
            continue  # a ps takes the training flags but lists only its own
        assert c in out, "%s --help lacks %s" % (cmd, c)
print("ok: --help lists the choices")

# quorum train --local is the synchronous reference, and says so.
common = ["--virtual-workers", "2", "--data", "digits", "--steps", "5", "--json", "--quiet"]
rc, out, err = run(["train", "--local"] + common)
assert rc == 0, err
assert "(sync)" in err and "(async)" not in err, err
plain = last_json(out)
assert plain["mode"] == "sync", plain
rc, out, err = run(["train", "--local", "--mode", "sync"] + common)
assert rc == 0, err
assert last_json(out)["params_digest"] == plain["params_digest"]
print("ok: train --local says sync")

# One prefix per error: the worker is named once.
ps, w0, w1 = free_port(), free_port(), free_port()
cluster = ["--ps_hosts", "127.0.0.1:%d" % ps, "--worker_hosts",
           "127.0.0.1:%d,127.0.0.1:%d" % (w0, w1), "--job_name", "worker"]
rc, out, err = run(["worker"] + cluster + ["--task_index", "1", "--init-timeout-ms", "300",
                                           "--timeout-ms", "200"])
assert rc == 1, (rc, err)
# ps 0 is not there at all: the error names it, not the chief.
assert err.count("worker 1: ") == 1 and "ps 0 (127.0.0.1:%d) could not be reached" % ps in err \
    and "chief" not in err, err
rc, out, err = run(["worker"] + cluster + ["--task_index", "0", "--timeout-ms", "200"])
assert rc == 1, (rc, err)
assert err.count("worker 0: ") == 1 and err.count("initialize: ") == 1, err
print("ok: each error prefix once")

# Options the run would ignore are refused, naming the option and the mode.
refused = [
    (["launch", "--mode", "sync", "--max-staleness", "2"], "--max-staleness", "--mode sync"),
    (["launch", "--mode", "sync", "--staleness-lr-scale"], "--staleness-lr-scale", "--mode sync"),
    (["launch", "--mode", "sync", "--accumulate", "2"], "--accumulate", "--mode sync"),
    (["launch", "--mode", "sync", "--local-steps", "1"], "--local-steps", "--mode sync"),
    (["launch", "--replicas-to-aggregate", "1"], "--replicas-to-aggregate", "--mode async"),
    (["launch", "--mode", "async", "--reduction", "sum"], "--reduction", "--mode async"),
    (["launch", "--init-tokens", "0"], "--init-tokens", "--mode async"),
    (["launch", "--sync-timeout-ms", "1000"], "--sync-timeout-ms", "--mode async"),
    (["launch", "--sync-stats-file", "/tmp/x"], "--sync-stats-file", "--mode async"),
    (["worker", "--max-staleness", "1", "--mode", "sync"] + cluster + ["--task_index", "0"],
     "--max-staleness", "--mode sync"),
    (["ps", "--reduction", "sum"] + cluster[:4] + ["--job_name", "ps", "--task_index", "0"],
     "--reduction", "--mode async"),
    (["train", "--local", "--max-staleness", "1"], "--max-staleness", "train --local"),
    (["train", "--local", "--mode", "async"], "--mode async", "train --local"),
    (["train", "--local", "--local-steps", "2"], "--local-steps", "train --local"),
    (["train", "--local", "--slow-worker", "0:5"], "--slow-worker", "train --local"),
    (["launch", "--workers", "2", "--slow-worker", "5:10"], "--slow-worker", "no worker 5"),
    (["launch", "--slow-worker", "1:10"], "--slow-worker", "no worker 1"),
    (["worker", "--slow-worker", "2:10"] + cluster + ["--task_index", "0"], "--slow-worker",
     "no worker 2"),
]
for args, option, why in refused:
    rc, out, err = run(args)
    assert rc == 2, (args, rc, err)
    assert option in err and why in err, "%s: %r" % (args, err)
print("ok: options the run would ignore are refused")

# Defaults and options of the run's own mode never trigger it.
rc, out, err = run(["launch", "--ps", "1", "--workers", "2", "--mode", "sync", "--reduction",
                    "sum", "--init-tokens", "0", "--slow-worker", "1:1", "--data", "digits",
                    "--steps", "3", "--json", "--quiet"], timeout=120)
assert rc == 0, err
assert last_json(out)["mode"] == "sync"
print("ok: the options of the run's mode pass")

# A typo gets the nearest option; garbage gets none; a bool library option
# stands alone.
typos = [(["launch", "--epoch", "3"], "did you mean --epochs?"),
         (["launch", "--optimzer", "adam"], "did you mean --optimizer?"),
         (["launch", "--worker", "2"], "did you mean --workers?"),
         (["worker", "--ps-host", "x"], "did you mean --ps_hosts?"),
         (["ps", "--max-stalenes", "3"], "did you mean --max-staleness?"),
         (["train", "--local", "--vitual-workers", "2"], "did you mean --virtual-workers?"),
         (["launch", "--lr-decay-staircase", "--steps", "2", "--workrs", "3"],
          "did you mean --workers?"),
         (["worker", "--local"], "not an option of quorum worker")]
for args, phrase in typos:
    rc, out, err = run(args)
    assert rc == 2 and phrase in err, (args, rc, err)
rc, out, err = run(["launch", "--zqxjkv", "1"])
assert rc == 2 and "unknown option --zqxjkv" in err and "did you mean" not in err, err

# --coordinator names ps 0's successor to the tasks started after its
# failover (quorum launch gives it): ps 1 alone, with two copies; never
# the ps itself, nor given to launch.
two = ["--ps_hosts", "127.0.0.1:%d,127.0.0.1:%d" % (ps, free_port()), "--worker_hosts",
       "127.0.0.1:%d" % w0]
coordinator_refused = [
    (["ps"] + two + ["--job_name", "ps", "--task_index", "0", "--coordinator", "1"], 1,
     "ps 0: coordinator 1: a cluster is coordinated by ps 0, or by ps 1 once ps 0 has been "
     "failed over, which needs --ps-replicas 2"),
    (["ps"] + two + ["--job_name", "ps", "--task_index", "1", "--coordinator", "1",
                     "--ps-replicas", "2"], 1, "ps 1: --coordinator 1 names this ps"),
    (["worker"] + two + ["--job_name", "worker", "--task_index", "0", "--coordinator", "2",
                         "--ps-replicas", "2"], 1, "worker 0: coordinator 2: a cluster is "
     "coordinated by ps 0, or by ps 1"),
    (["launch", "--ps", "2", "--ps-replicas", "2", "--coordinator", "1"], 2,
     "--coordinator is launch's own"),
]
for args, want_rc, phrase in coordinator_refused:
    rc, out, err = run(args)
    assert rc == want_rc and phrase in err and err.count("worker 0: ") <= 1, (args, rc, err)
print("ok: --coordinator is checked")
print("PASS: command line")

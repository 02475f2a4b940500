"""test_netns.py - a cluster spread over network namespaces, the way separate
hosts would be: each task in a namespace of its own with a real IP address
(10.213.0.1, .2, ...) on a veth link to a bridge in a hub namespace, the
tasks talking TCP across them. Needs root and iproute2 (scripts/setup.sh
installs it); exits 77 (skipped) without. The namespaces are this test's
own (named by its pid) and removed at the end.

Case "sync" (the default): 2 ps and 2 workers, worker 1's link
rate-limited (tc tbf, 100 Mbit/s); a sync run of the digits MLP trains to
accuracy and every task ends well.

Case "replica_partition": 3 ps with --ps-replicas 2 and 2 workers, async;
mid-run ps 1 and ps 2 stop reaching each other (a blackhole route each
way), while ps 0 and the workers reach both: a partition between shard
1's primary (ps 1) and its backup (ps 2) that no link to ps 0 shows. ps 1
reports its silent backup in its heartbeat answers; ps 0 fails ps 2 over
(docs/REPLICATION.md, "A partition between a primary and its backup"):
the run goes on and ends well without a rollback, every push acknowledged
to a worker is applied on each surviving copy, and ps 2 ends, told by
ps 0's view that it is failed over.

Usage: test_netns.py QUORUM_BINARY [sync|replica_partition]"""

import os
import subprocess
import sys
import tempfile
import time

from qrtest import Proc, ReplicaReport, last_json

quorum = os.path.abspath(sys.argv[1])
case = sys.argv[2] if len(sys.argv) > 2 else "sync"
tag = "qr%d" % os.getpid()
hub = tag + "h"
namespaces = [hub]


def ip(*args, ns=None):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def cleanup():
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def hosts(tasks):
    """A namespace per task on the hub's bridge: (names, addresses)."""
    names = ["%s%s%d" % (tag, job[0], i) for job, i in tasks]
    ips = ["10.213.0.%d" % (k + 1) for k in range(len(tasks))]
    ip("ip", "link", "add", "br0", "type", "bridge", ns=hub)
    ip("ip", "link", "set", "br0", "up", ns=hub)
    for k, ns in enumerate(names):
        ip("ip", "netns", "add", ns)
        namespaces.append(ns)
        outside = "%sv%d" % (tag, k)
        ip("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("ip", "link", "set", outside, "netns", hub)
        ip("ip", "link", "set", outside, "master", "br0", "up", ns=hub)
        ip("ip", "addr", "add", ips[k] + "/24", "dev", "eth0", ns=ns)
        ip("ip", "link", "set", "eth0", "up", ns=ns)
        ip("ip", "link", "set", "lo", "up", ns=ns)
    return names, ips


def cluster_spec(tasks, ips):
    ps = ",".join("%s:7000" % a for (job, _), a in zip(tasks, ips) if job == "ps")
    workers = ",".join("%s:7000" % a for (job, _), a in zip(tasks, ips) if job == "worker")
    return ["--ps_hosts", ps, "--worker_hosts", workers]


def sync_case(procs):
    tasks = [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)]
    names, ips = hosts(tasks)
    # worker 1 on a slow link (token bucket: 100 Mbit/s both ways out of it)
    ip("tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "100mbit", "burst", "64kb",
       "latency", "50ms", ns=names[3])
    common = ["--mode", "sync", "--data", "digits", "--steps", "200", "--transport", "tcp",
              "--json"]
    for (job, i), ns in zip(tasks, names):
        procs.append(Proc(["ip", "netns", "exec", ns, quorum, job] + cluster_spec(tasks, ips) +
                          ["--job_name", job, "--task_index", str(i)] + common))
    rc, out, err = procs[2].wait(120)
    assert rc == 0, err[-3000:]
    summary = last_json(out)
    for p in procs:
        prc, _, perr = p.wait(60)
        assert prc == 0, perr[-3000:]
    assert summary["global_step"] == 200 and summary["test_accuracy"] > 0.85, summary
    print("PASS: 2 ps and 2 workers in 4 namespaces over veth links (one at 100 Mbit/s): "
          "sync digits, accuracy %.4f, %.0f steps/s"
          % (summary["test_accuracy"], summary["global_steps_per_sec"]))


def replica_partition_case(procs):
    tasks = [("ps", 0), ("ps", 1), ("ps", 2), ("worker", 0), ("worker", 1)]
    names, ips = hosts(tasks)
    timeout_ms = 1500
    common = ["--mode", "async", "--ps-replicas", "2", "--data", "digits", "--steps", "30000",
              "--batch-size", "32", "--lr", "0.1", "--seed", "11", "--transport", "tcp",
              "--heartbeat-ms", "200", "--heartbeat-timeout-ms", str(timeout_ms),
              "--restart-wait-ms", "3000", "--json"]
    logs = []
    for (job, i), ns in zip(tasks, names):
        log = tempfile.NamedTemporaryFile("w+", prefix="qr-netns-%s%d-" % (job, i))
        logs.append(log)
        procs.append(Proc(["ip", "netns", "exec", ns, quorum, job] + cluster_spec(tasks, ips) +
                          ["--job_name", job, "--task_index", str(i)] + common, stderr=log))
    deadline = time.time() + 60
    while "linked to ps 2" not in open(logs[1].name).read() or \
            "connected to ps 2" not in open(logs[4].name).read():
        assert time.time() < deadline, open(logs[1].name).read()[-3000:]
        time.sleep(0.05)
    time.sleep(1.0)  # training
    assert all(p.alive() for p in procs), "a task ended before the partition"
    ip("ip", "route", "add", "blackhole", ips[2] + "/32", ns=names[1])
    ip("ip", "route", "add", "blackhole", ips[1] + "/32", ns=names[2])
    cut = time.time()
    ends = {}
    for (job, i), p in zip(tasks, procs):
        rc, out, _ = p.wait(120)
        ends[(job, i)] = (rc, out)
    err = "".join(open(log.name).read() for log in logs)
    lines = {key: open(log.name).read().strip().splitlines() for key, log in zip(tasks, logs)}
    for key in tasks:
        if key != ("ps", 2):
            assert ends[key][0] == 0, "%s %d exited %d: %s" % (key + (ends[key][0],
                                                                lines[key][-5:]))
    assert ends[("ps", 2)][0] != 0 and "view 1 names this ps failed" in lines[("ps", 2)][-1], \
        lines[("ps", 2)][-5:]
    assert "ps 1 (%s:7000) has not reached its backup ps 2 (%s:7000) for" % (ips[1], ips[2]) \
        in err and "while ps 0 reaches both: a partition between them" in err, err[-4000:]
    assert "is cut off from its primary (a partition): failed over in place, view 1" in err, \
        err[-4000:]
    summary = last_json(ends[("worker", 0)][1])
    assert summary["rollbacks"] == 0 and "rolling back" not in err, summary
    assert summary["test_accuracy"] > 0.9, summary
    report = ReplicaReport(err, 3)
    assert report.workers == 2 and report.views == {1}, (report.workers, report.views)
    for k in range(3):
        held = report.held(k, skip=(2,))
        assert held, "no surviving copy of shard %d" % k
        for c in held:
            assert c["applied"] == report.acked[k], (k, c, report.acked)
    print("PASS: ps 1 and ps 2 cut off from each other %.1f s into the run, ps 0 reaching both: "
          "ps 2 failed over (view 1) on ps 1's report, ps 2 ended (%s); pushes acknowledged = "
          "applied on every surviving copy (%s); longest push %.2f s (heartbeat-timeout-ms %d); "
          "accuracy %.4f, no rollback" % (
              cut - deadline + 60, lines[("ps", 2)][-1][-120:],
              ", ".join("shard %d: %d" % (k, report.acked[k]) for k in range(3)),
              report.stall, timeout_ms, summary["test_accuracy"]))


if os.geteuid() != 0:
    print("SKIP: network namespaces need root")
    sys.exit(77)
try:
    ip("ip", "netns", "add", hub)
except (subprocess.CalledProcessError, FileNotFoundError) as e:
    print("SKIP: cannot create a network namespace here: %s" % e)
    cleanup()
    sys.exit(77)

cases = {"sync": sync_case, "replica_partition": replica_partition_case}
if case not in cases:
    cleanup()
    sys.exit("unknown case %r (%s)" % (case, ", ".join(cases)))
running = []
try:
    cases[case](running)
finally:
    for p in running:
        p.kill()
    cleanup()

"""test_netns.py - a cluster spread over network namespaces, the way separate
hosts would be: each task (2 ps, 2 workers) in a namespace of its own with a
real IP address (10.213.0.1-4) on a veth link to a bridge in a hub
namespace, worker 1's link rate-limited (tc tbf, 100 Mbit/s), the tasks
talking TCP across them. A sync run
of the digits MLP trains to accuracy and every task ends well. Needs root
and iproute2 (scripts/setup.sh installs it); exits 77 (skipped) without.
The namespaces are this test's own (named by its pid) and removed at the
end. Usage: test_netns.py QUORUM_BINARY"""

import os
import subprocess
import sys

from qrtest import Proc, last_json

quorum = os.path.abspath(sys.argv[1])
tag = "qr%d" % os.getpid()
hub = tag + "h"
tasks = [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)]
names = ["%s%s%d" % (tag, job[0], i) for job, i in tasks]
ips = ["10.213.0.%d" % (k + 1) for k in range(len(tasks))]


def ip(*args, ns=None):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def cleanup():
    for ns in names + [hub]:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


if os.geteuid() != 0:
    print("SKIP: network namespaces need root")
    sys.exit(77)
try:
    ip("ip", "netns", "add", hub)
except (subprocess.CalledProcessError, FileNotFoundError) as e:
    print("SKIP: cannot create a network namespace here: %s" % e)
    cleanup()
    sys.exit(77)

procs = []
try:
    ip("ip", "link", "add", "br0", "type", "bridge", ns=hub)
    ip("ip", "link", "set", "br0", "up", ns=hub)
    for k, ns in enumerate(names):
        ip("ip", "netns", "add", ns)
        outside = "%sv%d" % (tag, k)
        ip("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("ip", "link", "set", outside, "netns", hub)
        ip("ip", "link", "set", outside, "master", "br0", "up", ns=hub)
        ip("ip", "addr", "add", ips[k] + "/24", "dev", "eth0", ns=ns)
        ip("ip", "link", "set", "eth0", "up", ns=ns)
        ip("ip", "link", "set", "lo", "up", ns=ns)
    # worker 1 on a slow link (token bucket: 100 Mbit/s both ways out of it)
    ip("tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "100mbit", "burst", "64kb",
       "latency", "50ms", ns=names[3])
    spec = ["--ps_hosts", "%s:7000,%s:7000" % (ips[0], ips[1]),
            "--worker_hosts", "%s:7000,%s:7000" % (ips[2], ips[3])]
    common = ["--mode", "sync", "--data", "digits", "--steps", "200", "--transport", "tcp",
              "--json"]
    for (job, i), ns in zip(tasks, names):
        procs.append(Proc(["ip", "netns", "exec", ns, quorum, job] + spec +
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
finally:
    for p in procs:
        p.kill()
    cleanup()

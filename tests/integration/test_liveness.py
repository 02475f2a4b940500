"""test_liveness.py - a worker whose machine vanishes (no FIN, no RST: its
network link goes down) is noticed within peer-timeout-ms, and under a
staleness bound it then holds nobody back.

Two network namespaces this test creates, joined by a veth pair: ps 0 and
worker 0 (the chief) in one, worker 1 in the other, over TCP. Mid-run the
test takes worker 1's link down: its process lives on, but nothing it sends
arrives and nothing reaches it, as when a machine loses power. With
max-staleness 1 the chief soon waits for worker 1's clock; only the ps
deciding that worker 1 is gone lets it finish. Without keepalive the ps
would never decide (an idle TCP connection stays open forever) and the
chief's wait would fail at its request deadline instead.

Needs root (network namespaces); exits 77 (CTest: skipped) without it.
Usage: test_liveness.py QUORUM_BINARY"""

import os
import subprocess
import sys
import time

from qrtest import Proc, last_json

quorum = sys.argv[1]
if os.geteuid() != 0:
    print("SKIP: network namespaces need root")
    sys.exit(77)

tag = "qrl%d" % os.getpid()  # names of our namespaces and links: ours alone
ns_a, ns_b = tag + "a", tag + "b"
link_a, link_b = tag + "x", tag + "y"
addr_a, addr_b = "10.213.0.1", "10.213.0.2"


def ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), check=check, capture_output=True, text=True)


def set_up():
    ip("netns", "add", ns_a)
    ip("netns", "add", ns_b)
    ip("link", "add", link_a, "type", "veth", "peer", "name", link_b)
    for ns, link, addr in ((ns_a, link_a, addr_a), (ns_b, link_b, addr_b)):
        ip("link", "set", link, "netns", ns)
        ip("-n", ns, "addr", "add", addr + "/24", "dev", link)
        ip("-n", ns, "link", "set", link, "up")
        ip("-n", ns, "link", "set", "lo", "up")


def connected(ns, peer):
    """Has ns an established TCP connection with address peer?"""
    out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Htn", "state", "established",
                          "dst", peer], capture_output=True, text=True).stdout
    return bool(out.strip())


def tear_down():
    for ns in (ns_a, ns_b):
        ip("netns", "del", ns, check=False)  # takes its end of the veth pair along


procs = []
try:
    try:
        set_up()
    except subprocess.CalledProcessError as e:
        print("FAIL: cannot create network namespaces: %s" % e.stderr.strip())
        sys.exit(1)
    steps = 20000
    spec = ["--ps_hosts", addr_a + ":7411",
            "--worker_hosts", "%s:7412,%s:7413" % (addr_a, addr_b)]
    train = ["--data", "digits", "--steps", str(steps), "--max-staleness", "1",
             "--lr", "0.1", "--seed", "5", "--peer-timeout-ms", "3000", "--quiet"]

    def start(ns, job, index, extra=()):
        p = Proc(["ip", "netns", "exec", ns, quorum, job] + spec +
                 ["--job_name", job, "--task_index", str(index)] + train + list(extra))
        procs.append(p)
        return p

    # Worker 1 first, and the chief only once worker 1 is connected (it
    # waits for the chief's initialization meanwhile). A worker not yet
    # connected holds nobody back: started together, a slow-starting
    # worker 1 let the chief train most of the steps alone, the run ended
    # before the ps could notice the cut, and the check below failed.
    ps = start(ns_a, "ps", 0)
    other = start(ns_b, "worker", 1)
    deadline = time.time() + 60
    while not connected(ns_a, addr_b):
        assert other.alive(), "worker 1 ended before connecting"
        assert time.time() < deadline, "worker 1 never connected to the ps"
        time.sleep(0.1)
    chief = start(ns_a, "worker", 0, ["--json"])
    time.sleep(1.5)  # both train, in step (max-staleness 1)
    assert chief.alive() and other.alive(), "training ended before the link went down"
    ip("-n", ns_b, "link", "set", link_b, "down")
    cut = time.time()
    assert other.alive()

    rc, out, err = chief.wait(120)
    waited = time.time() - cut
    assert rc == 0, "the chief exited %d after worker 1 vanished:\n%s" % (rc, err[-3000:])
    summary = last_json(out)
    assert summary["global_step"] >= steps, summary
    assert summary["test_accuracy"] >= 0.9, summary
    rc, _, ps_err = ps.wait(60)
    assert rc == 0, "ps exited %d:\n%s" % (rc, ps_err[-3000:])
    assert "worker 1" in ps_err and "stopped answering" in ps_err, ps_err[-3000:]
    print("ok: worker 1's link went down; the ps let it go, the chief finished %d steps "
          "%.1f s later (accuracy %.4f)" % (summary["global_step"], waited,
                                            summary["test_accuracy"]))
    print("PASS: a vanished worker is noticed and holds nobody back")
finally:
    for p in procs:
        p.kill()
    tear_down()

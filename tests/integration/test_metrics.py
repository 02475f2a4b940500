"""test_metrics.py - every task's Prometheus endpoint while a cluster trains
(`quorum launch --metrics-port-base`): promtool accepts each page, values
move between two scrapes, the endpoint refuses anything but GET /metrics
and keeps serving, and a port in use is refused at start, naming it.
Usage: test_metrics.py QUORUM_BINARY"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from qrtest import Proc, free_base

quorum = sys.argv[1]
work = tempfile.mkdtemp(prefix="qr-metrics-")


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        return r.read().decode()


def value(page, name):
    for line in page.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("%s not in the page" % name)


try:
    base = free_base(4)
    logdir = os.path.join(work, "logs")
    p = Proc([quorum, "launch", "--ps", "2", "--workers", "2", "--mode", "sync", "--steps",
              "1000000", "--metrics-port-base", str(base), "--logdir", logdir, "--quiet"])
    deadline = time.time() + 60
    while True:
        try:
            scrape(base + 2)
            break
        except (urllib.error.URLError, ConnectionError):
            assert time.time() < deadline and p.alive(), "no metrics endpoint came up"
            time.sleep(0.2)
    time.sleep(1)
    first = [scrape(base + i) for i in range(4)]
    time.sleep(1)
    second = [scrape(base + i) for i in range(4)]
    for i, page in enumerate(second):
        r = subprocess.run(["promtool", "check", "metrics"], input=page, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, "task %d: %s%s" % (i, r.stdout, r.stderr)
    assert value(second[0], "quorum_global_step") > value(first[0], "quorum_global_step")
    assert value(second[1], "quorum_pushes_total") > value(first[1], "quorum_pushes_total")
    assert value(second[2], "quorum_worker_global_step") > value(first[2], "quorum_worker_global_step")
    assert 'quorum_request_seconds_bucket{op="push",le="+Inf"}' in second[0]
    assert 'quorum_worker_last_push_global_step{worker="1"}' in second[0]
    print("ok: 4 endpoints pass promtool; the global step went %d -> %d"
          % (value(first[0], "quorum_global_step"), value(second[0], "quorum_global_step")))
    req = urllib.request.Request("http://127.0.0.1:%d/metrics" % base, data=b"x", method="POST")
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("POST accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 405, e.code
    try:
        urllib.request.urlopen("http://127.0.0.1:%d/other" % base, timeout=10)
        raise AssertionError("/other served")
    except urllib.error.HTTPError as e:
        assert e.code == 404, e.code
    assert "quorum_global_step" in scrape(base)
    ports = json.load(open(os.path.join(logdir, "metrics_ports.json")))
    assert ports == {"ps 0": base, "ps 1": base + 1, "worker 0": base + 2, "worker 1": base + 3}
    print("ok: POST 405, other paths 404, still serving; ports listed in metrics_ports.json")
    # A port in use: a ps started on it refuses to start, naming it.
    rc, out, err = Proc([quorum, "ps", "--ps_hosts", "127.0.0.1:%d" % free_base(1),
                         "--worker_hosts", "127.0.0.1:1", "--job_name", "ps", "--task_index", "0",
                         "--metrics-port", str(base)]).wait(60)
    assert rc != 0 and str(base) in err and "in use" in err, (rc, err)
    print("ok: a metrics port in use is refused, naming it")
    p.kill()
finally:
    shutil.rmtree(work, ignore_errors=True)

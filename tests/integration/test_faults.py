"""test_faults.py - tasks killed and restarted by hand (no launcher, as a
container orchestrator would), and the end of a job seen by every task.

  bind            a ps listens on every interface by default (reached at
                  127.0.0.2 although its spec says 127.0.0.1, and started
                  with a spec address that is not local at all, as behind
                  NAT); --bind 127.0.0.1 restricts it
  ps_restart_async  async, 2 ps: ps 1 SIGKILLed and started again by hand
                  restores the newest checkpoint; ps 0 rolls back to the same
                  step in place, the workers rejoin, the run finishes
  chief_first     sync, 2 ps: while ps 0 is SIGSTOPped, ps 1 and the chief are
                  SIGKILLed and started again by hand, so the chief's CREATE
                  (of variables ps 1 restored) reaches the new ps 1 before ps
                  0 links to it; SIGCONTed, ps 0 rolls back to ps 1's
                  checkpoint and ps 1 follows it without rolling back a
                  second time (issue 28, item 7: one restart, one rollback)
  ps0_restart     sync with --init-tokens 0: ps 0 SIGKILLed and started again;
                  ps 1 rolls back to ps 0's checkpoint in place and the run
                  ends with the params_digest of a run nothing killed
  no_checkpoint   sync without --checkpoint-dir: a restarted ps has lost its
                  variables; the run stops with an error that says so rather
                  than training on a mix, and every task ends
  ps_gone         a ps killed and never restarted: the workers say at once
                  that it is gone, and every task ends with an error naming
                  it once restart-wait-ms has passed
  stop_notice     ps 0 gives up on a lost ps long before the workers would:
                  its stop notice ends them at once, saying why
  job_ended       the chief gone for restart-wait-ms: ps 0 ends the run saying
                  nobody evaluated (exit 3, the other worker too); and ps 0
                  exits with an error when every worker has been gone for
                  restart-wait-ms
  slow_start      a ps that comes up long after the others (pods start minutes
                  apart) is waited for: restart-wait-ms bounds only the wait
                  for a ps that was up and went
  hung_ps         async, 2 ps, by hand: ps 1 SIGSTOPped is named hung by ps 0
                  within heartbeat-timeout-ms (and by the workers' wait
                  reports); SIGCONTed after that, it is fenced: it says this
                  run of it is over, exits with an error, and writes no
                  checkpoint shard
  paused_ps       async, 2 ps, by hand: ps 1 SIGSTOPped for 0.85 s eight times
                  (under heartbeat-timeout-ms 1000): back from each pause,
                  it never names the healthy ps 0 hung for the beats that
                  waited unread in its socket (it once did, half the time,
                  and launch killed ps 0)
  late_worker     a worker started after the job ended says every few seconds
                  what it waits for, and gives up at init-timeout-ms naming
                  ps 0, not the chief
  stale_socket    a SIGKILLed ps's Unix socket file (the fast path to a
                  loopback address) is removed when the address is served
                  again, also by a TCP-only restart; on a unix: address a
                  stale socket is replaced but a live ps's is not taken: the
                  second ps is refused, naming it
Usage: test_faults.py QUORUM_BINARY CASE"""

import os
import re
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time

from qrtest import HELLO, REPLY, Cluster, Proc, frame, free_port, last_json, read_reply

quorum, case = sys.argv[1], sys.argv[2]


class FaultCluster(Cluster):
    """A hand-started cluster (qrtest.Cluster) in which a task is killed
    and started again mid-run."""

    def __init__(self, nps, nworkers, opts):
        super().__init__(quorum, nps, nworkers, opts, prefix="qr-faults-")

    def restart_mid_run(self, job, i, min_step):
        """Once ps 0 has written a checkpoint of global step min_step or
        later, SIGKILL task (job, i) and start it again by hand; then every
        task must end well. The chief's JSON. (In async mode a checkpoint
        due at step 400 may be cut at 437: a CI run under the sanitizers
        waited in vain for the text "global step 400".)"""
        def written():
            steps = re.findall(r"written: global step (\d+)", self.log("ps", 0))
            return any(int(n) >= min_step for n in steps)
        wait_for(written, 60, "a checkpoint of step %d or later" % min_step)
        self.kill(job, i)
        self.start(job, i)
        return self.finish_ok()

    def finish_ok(self):
        """Every task must end well, the chief first; the chief's JSON."""
        rc, out = self.wait("worker", 0, 120)
        assert rc == 0, self.log("worker", 0)[-3000:]
        for key in self.tasks:
            if key != ("worker", 0):
                rc, _ = self.wait(key[0], key[1], 30)
                assert rc == 0, (key, self.log(*key)[-3000:])
        return last_json(out)


def wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def hello(host, port):
    """A worker's HELLO to host:port; the ps's answer (status, meta)."""
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(frame(HELLO, 1, struct.pack("<III", 1, 0, 0)))
    mtype, _, status, meta, _ = read_reply(s)
    s.close()
    assert mtype == HELLO | REPLY, mtype
    return status, meta


def serve_ps(spec_host, extra=()):
    port = free_port()
    p = Proc([quorum, "ps", "--ps_hosts", "%s:%d" % (spec_host, port), "--worker_hosts",
              "127.0.0.1:%d" % free_port(), "--job_name", "ps", "--task_index", "0",
              "--transport", "tcp", "--linger-ms", "100"] + list(extra))
    return p, port


def reachable(host, port, timeout=10):
    deadline = time.time() + timeout
    while True:
        try:
            return hello(host, port)
        except ConnectionRefusedError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)


if case == "bind":
    p, port = serve_ps("127.0.0.1")
    status, meta = reachable("127.0.0.2", port)
    assert status == 0 and len(meta) == 28, (status, meta)  # the welcome: incarnation, ...
    incarnation, restored, follows, flags = struct.unpack("<QqQI", meta)
    assert incarnation and restored == -1 and follows == 0 and flags == 0, meta
    p.kill()
    p.wait(10)
    p, port = serve_ps("127.0.0.1", ["--bind", "127.0.0.1"])
    assert reachable("127.0.0.1", port)[0] == 0
    try:
        hello("127.0.0.2", port)
        raise AssertionError("--bind 127.0.0.1 still answers at 127.0.0.2")
    except ConnectionRefusedError:
        pass
    p.kill()
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: before, the ps
    # could not bind it; listening on every interface it serves at its port.
    p, port = serve_ps("192.0.2.1")
    assert reachable("127.0.0.1", port)[0] == 0
    p.kill()
    rc, _, err = p.wait(10)
    assert "listening on 192.0.2.1:%d (port %d on every interface)" % (port, port) in err, err
    print("PASS: every interface by default, --bind restricts, a non-local spec address serves")

elif case == "stale_socket":
    sockets = tempfile.mkdtemp(prefix="qr-sockets-")
    env = dict(os.environ, QUORUM_SOCKET_DIR=sockets)
    try:
        port = free_port()
        path = os.path.join(sockets, "quorum-127.0.0.1-%d.sock" % port)

        def ps_at(hosts, extra=()):
            return Proc([quorum, "ps", "--ps_hosts", hosts, "--worker_hosts",
                         "127.0.0.1:%d" % free_port(), "--job_name", "ps", "--task_index", "0",
                         "--linger-ms", "100"] + list(extra), env=env)

        p = ps_at("127.0.0.1:%d" % port)
        reachable("127.0.0.1", port)
        wait_for(lambda: os.path.exists(path), 10, path)
        p.kill()
        p.wait(10)
        assert os.path.exists(path), "SIGKILL leaves the socket file (nothing else can remove it)"
        p = ps_at("127.0.0.1:%d" % port, ["--transport", "tcp"])
        reachable("127.0.0.1", port)
        assert not os.path.exists(path), "a TCP-only restart left the stale " + path
        p.kill()
        p.wait(10)
        print("PASS: a killed ps's socket file is removed by the next ps at its address, "
              "TCP-only too")
        unix = os.path.join(sockets, "ps0.sock")
        a = ps_at("unix:" + unix)
        wait_for(lambda: os.path.exists(unix), 10, unix)
        b = ps_at("unix:" + unix)
        rc, _, err = b.wait(20)
        assert rc != 0 and "cannot listen on unix:%s: another process listens on it" % unix \
            in err, (rc, err[-2000:])
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(unix)  # still a's
        probe.close()
        a.kill()
        a.wait(10)
        assert os.path.exists(unix)
        a = ps_at("unix:" + unix)
        deadline = time.time() + 10
        while True:
            try:
                probe = socket.socket(socket.AF_UNIX)
                probe.connect(unix)
                probe.close()
                break
            except (ConnectionRefusedError, FileNotFoundError):
                assert time.time() < deadline and a.alive(), "the restarted ps does not listen"
                time.sleep(0.05)
        a.kill()
        a.wait(10)
        print("PASS: on a unix: address a live ps's socket is refused to a second ps, naming it; "
              "a killed one's is replaced")
    finally:
        shutil.rmtree(sockets, ignore_errors=True)

elif case == "ps_restart_async":
    c = FaultCluster(2, 2, ["--data", "digits", "--steps", "8000", "--checkpoint-dir", "CKPT",
                       "--checkpoint-steps", "200", "--json", "--quiet"])
    c.opts[c.opts.index("CKPT")] = os.path.join(c.dir, "ckpt")
    try:
        c.start_all()
        s = c.restart_mid_run("ps", 1, 400)
        restored = [l for l in c.log("ps", 1).splitlines() if "restored" in l]
        step = restored[0].rsplit("(global step ", 1)[1].rstrip(")")
        ps0 = c.log("ps", 0)
        assert "was restarted: rolling back to the checkpoint of step %s" % step in ps0, ps0[-3000:]
        assert "(global step %s)" % step in ps0, ps0[-3000:]
        assert s["rollbacks"] >= 1 and s["global_step"] >= 8000, s
        assert s["test_accuracy"] > 0.9, s
        print("PASS: async, ps 1 restarted by hand at its checkpoint of step %s; ps 0 rolled "
              "back to it; the run finished at accuracy %.4f" % (step, s["test_accuracy"]))
    finally:
        c.close()

elif case == "paused_ps":
    c = FaultCluster(2, 2, ["--data", "digits", "--steps", "100000000", "--heartbeat-ms", "200",
                            "--heartbeat-timeout-ms", "1000", "--quiet"])
    try:
        c.start_all()
        c.wait_log("worker", 1, "connected to ps 1", 30)
        ps1 = c.tasks[("ps", 1)].p
        pauses = 0
        # (A loaded machine may stretch a pause past heartbeat-timeout-ms:
        # ps 1 then fences itself, rightly, and the pauses end there.)
        while pauses < 8 and ps1.poll() is None:
            os.kill(ps1.pid, signal.SIGSTOP)
            time.sleep(0.85)
            os.kill(ps1.pid, signal.SIGCONT)
            pauses += 1
            time.sleep(1.5)
        blamed = [l for l in c.log("ps", 1).splitlines() if "sent nothing for" in l]
        assert not blamed, blamed
        print("PASS: ps 1 paused 0.85 s %d times never named ps 0 hung" % pauses)
    finally:
        c.close()

elif case == "hung_ps":
    c = FaultCluster(2, 2, ["--data", "digits", "--steps", "2000000", "--checkpoint-dir", "CKPT",
                       "--checkpoint-steps", "200", "--heartbeat-timeout-ms", "1500",
                       "--json", "--quiet"])
    c.opts[c.opts.index("CKPT")] = os.path.join(c.dir, "ckpt")
    try:
        c.start_all()
        wait_for(lambda: "written: global step 400" in c.log("ps", 0), 60, "a checkpoint")
        ps1 = c.tasks[("ps", 1)].p
        os.kill(ps1.pid, signal.SIGSTOP)
        t0 = time.time()
        wait_for(lambda: "answered nothing for" in c.log("ps", 0), 10, "ps 0 naming ps 1")
        named = time.time() - t0
        line = [l for l in c.log("ps", 0).splitlines() if "answered nothing for" in l][0]
        assert "ps 1 (unix:" in line and "hung or stopped" in line, line
        silent = int(line.split("answered nothing for ")[1].split(" ms")[0])
        assert 1500 <= silent < 3500 and named < 4.0, (silent, named)
        wait_for(lambda: all("for ps 1 (" in c.log("worker", w) for w in (0, 1)), 15,
                 "the workers' wait reports naming ps 1")
        before = len(c.log("ps", 1))
        os.kill(ps1.pid, signal.SIGCONT)
        rc, _ = c.wait("ps", 1, 20)
        after = c.log("ps", 1)[before:]
        assert rc != 0, after
        assert "this run is over: it serves nothing more, writes no checkpoint" in after, after
        others = [l for l in after.splitlines() if l and "this run is over" not in l]
        assert not others, others  # it served, wrote and said nothing else
        print("PASS: a SIGSTOPped ps is named by ps 0 after %d ms of silence (%.1f s); "
              "SIGCONTed, its run is fenced and ends (exit %d)" % (silent, named, rc))
    finally:
        c.close()

elif case == "chief_first":
    c = FaultCluster(2, 2, ["--mode", "sync", "--data", "digits", "--steps", "3000",
                            "--checkpoint-dir", "CKPT", "--checkpoint-steps", "100",
                            "--heartbeat-timeout-ms", "30000", "--json", "--quiet"])
    c.opts[c.opts.index("CKPT")] = os.path.join(c.dir, "ckpt")
    try:
        c.start_all()
        wait_for(lambda: re.search(r"written: global step [2-9]\d\d", c.log("ps", 0)), 60,
                 "a checkpoint of step 200 or later")
        ps0 = c.tasks[("ps", 0)].p
        os.kill(ps0.pid, signal.SIGSTOP)  # it links to the new ps 1 only once continued
        try:
            c.kill("ps", 1)
            c.kill("worker", 0)
            c.start("ps", 1)
            wait_for(lambda: "listening on" in c.log("ps", 1), 30, "the new ps 1")
            c.start("worker", 0)
            # The chief's CREATE goes to every ps at once: ps 1 answers it,
            # ps 0 (stopped) not yet.
            wait_for(lambda: "connected to ps 1" in c.log("worker", 0), 30,
                     "the new chief reaching the new ps 1")
            time.sleep(0.5)
        finally:
            os.kill(ps0.pid, signal.SIGCONT)
        s = c.finish_ok()
        step = re.search(r"\(global step (\d+)\)", c.log("ps", 1)).group(1)
        rolled = [l for l in c.log("ps", 0).splitlines() if "rolling back" in l]
        assert len(rolled) == 1 and "ps 1 (unix:" in rolled[0] and \
            rolled[0].endswith("checkpoint of step %s" % step), rolled
        ps1 = c.log("ps", 1)
        assert "rolling back" not in ps1, ps1[-3000:]
        assert "following it" in ps1, ps1[-3000:]
        assert s["global_step"] >= 3000, s
        print("PASS: the restarted chief reached the restarted ps 1 before ps 0 did; ps 0 "
              "rolled back to its checkpoint of step %s, ps 1 followed without a second "
              "rollback" % step)
    finally:
        c.close()

elif case == "ps0_restart":
    base = ["--mode", "sync", "--init-tokens", "0", "--data", "digits", "--steps", "4000",
            "--json", "--quiet"]
    rc, out, err = Proc([quorum, "launch", "--ps", "2", "--workers", "2"] + base).wait(300)
    assert rc == 0, err[-3000:]
    whole = last_json(out)
    c = FaultCluster(2, 2, base + ["--checkpoint-dir", "CKPT", "--checkpoint-steps", "100"])
    c.opts[c.opts.index("CKPT")] = os.path.join(c.dir, "ckpt")
    try:
        c.start_all()
        s = c.restart_mid_run("ps", 0, 500)
        ps1 = c.log("ps", 1)
        assert "ps 0 is a new run (restarted, or rolled back): rolling back" in ps1, ps1[-3000:]
        # It saw ps 0 go: refusing, under its push, or already back as a new run.
        w1 = c.log("worker", 1)
        assert any(m % c.dir in w1 for m in ("ps 0 (unix:%s/ps0.sock) is gone",
                                             "lost: ps 0 (unix:%s/ps0.sock): connection lost",
                                             "ps 0 (unix:%s/ps0.sock) is a new run")), w1
        assert s["rollbacks"] >= 1, s
        assert s["params_digest"] == whole["params_digest"], (s, whole)
        print("PASS: ps 0 restarted by hand; ps 1 rolled back with it; the digest is the one of "
              "a run nothing killed (%s)" % whole["params_digest"])
    finally:
        c.close()

elif case == "no_checkpoint":
    c = FaultCluster(2, 2, ["--mode", "sync", "--data", "digits", "--steps", "100000"])
    try:
        c.start_all()
        wait_for(lambda: "connected to ps 1" in c.log("worker", 1), 30, "the workers")
        time.sleep(0.5)
        c.kill("ps", 1)
        c.start("ps", 1)
        t0 = time.time()
        rc, _ = c.wait("ps", 0, 30)
        assert rc != 0, c.log("ps", 0)[-3000:]
        assert "ps 1 (unix:%s/ps1.sock) was restarted and has lost its variables: without " \
            "--checkpoint-dir" % c.dir in c.log("ps", 0), c.log("ps", 0)[-3000:]
        for job, i in (("ps", 1), ("worker", 0), ("worker", 1)):
            c.wait(job, i, 30)
        rc, _ = c.wait("worker", 0, 1)
        assert rc != 0, c.log("worker", 0)[-3000:]
        print("PASS: a restart that lost its variables stops the run (%.1f s), saying why"
              % (time.time() - t0))
    finally:
        c.close()

elif case == "ps_gone":
    # Async: both workers push to ps 1 all the time, so both meet its death
    # at once (in sync mode one may sit in a token wait on ps 0 meanwhile).
    c = FaultCluster(2, 2, ["--data", "digits", "--steps", "10000000", "--restart-wait-ms", "3000"])
    try:
        c.start_all()
        wait_for(lambda: "connected to ps 1" in c.log("worker", 1), 30, "the workers")
        time.sleep(0.5)
        c.kill("ps", 1)
        t0 = time.time()
        gone = "ps 1 (unix:%s/ps1.sock) is gone" % c.dir
        lost = "lost: ps 1 (unix:%s/ps1.sock): connection lost" % c.dir
        wait_for(lambda: all(gone in c.log("worker", i) or lost in c.log("worker", i)
                             for i in (0, 1)), 2, "the workers to say ps 1 is gone")
        said = time.time() - t0
        rc, _ = c.wait("ps", 0, 30)
        ps0 = c.log("ps", 0)
        assert rc != 0 and "ps 1 (unix:%s/ps1.sock) has been unreachable" % c.dir in ps0 and \
            "did not come back within restart-wait-ms" in ps0, ps0[-3000:]
        for job, i in (("worker", 0), ("worker", 1)):
            c.wait(job, i, 30)
        ended = time.time() - t0
        assert ended < 20, ended
        print("PASS: ps 1 gone said after %.2f s; every task ended %.1f s after the kill"
              % (said, ended))
    finally:
        c.close()

elif case == "stop_notice":
    # ps 0 gives up on a lost ps 1 after 1.5 s, the workers would wait a
    # minute for it: ps 0's stop notice ends them at once, with its reason.
    c = FaultCluster(2, 2, ["--data", "digits", "--steps", "10000000"])
    try:
        for i in range(2):
            c.start("ps", i, ["--restart-wait-ms", "1500"])
        for i in range(2):
            c.start("worker", i, ["--restart-wait-ms", "60000"])
        wait_for(lambda: "connected to ps 1" in c.log("worker", 1), 30, "the workers")
        time.sleep(0.5)
        c.kill("ps", 1)
        t0 = time.time()
        rc, _ = c.wait("ps", 0, 30)
        assert rc != 0 and "has been unreachable" in c.log("ps", 0), c.log("ps", 0)[-3000:]
        for i in (0, 1):
            rc, _ = c.wait("worker", i, 20)
            log = c.log("worker", i)
            assert rc != 0 and "ps 1 (unix:%s/ps1.sock) has been unreachable" % c.dir in log, \
                log[-3000:]
        ended = time.time() - t0
        assert ended < 15, ended
        print("PASS: ps 0 stopped on a lost ps 1; its notice ended both workers %.1f s after "
              "the kill (they would have waited 60 s)" % ended)
    finally:
        c.close()

elif case == "job_ended":
    c = FaultCluster(1, 2, ["--data", "digits", "--steps", "6000", "--restart-wait-ms", "2000"])
    try:
        c.start_all()
        wait_for(lambda: "connected to ps 0" in c.log("worker", 1), 30, "the workers")
        time.sleep(0.3)
        c.kill("worker", 0)  # the chief: nobody will evaluate or send STOP
        t0 = time.time()
        # The other worker does its steps and waits for the end of the run,
        # which ps 0 declares once the chief has been gone restart-wait-ms:
        # both exit 3 saying nobody evaluated (test_exits.py, chief_lost_*).
        rc, _ = c.wait("worker", 1, 120)
        said = "job ended without its chief: worker 0"
        assert rc == 3 and said in c.log("worker", 1), c.log("worker", 1)[-3000:]
        rc, _ = c.wait("ps", 0, 30)
        ps0 = c.log("ps", 0)
        assert rc == 3 and said in ps0 and "nobody evaluated the model" in ps0, ps0[-3000:]
        print("PASS: with the chief gone, ps 0 ended the run %.1f s after the kill "
              "(restart-wait-ms 2 s), saying nobody evaluated" % (time.time() - t0))
    finally:
        c.close()
    c = FaultCluster(1, 2, ["--data", "digits", "--steps", "1000000", "--restart-wait-ms", "2000"])
    try:
        c.start_all()
        wait_for(lambda: "connected to ps 0" in c.log("worker", 1), 30, "the workers")
        c.kill("worker", 0)
        c.kill("worker", 1)
        t0 = time.time()
        rc, _ = c.wait("ps", 0, 30)
        ps0 = c.log("ps", 0)
        assert rc != 0 and "no worker has been connected for" in ps0, ps0[-3000:]
        print("PASS: every worker gone: ps 0 ended %.1f s later (restart-wait-ms 2 s), exit %d"
              % (time.time() - t0, rc))
    finally:
        c.close()

elif case == "slow_start":
    c = FaultCluster(2, 2, ["--data", "digits", "--steps", "300", "--restart-wait-ms", "1000",
                       "--json", "--quiet"])
    try:
        for job, i in (("ps", 0), ("worker", 0), ("worker", 1)):
            c.start(job, i)
        time.sleep(2.5)  # past restart-wait-ms
        assert c.tasks[("ps", 0)].alive(), c.log("ps", 0)
        c.start("ps", 1)
        assert c.finish_ok()["global_step"] >= 300
        print("PASS: ps 1 started 2.5 s after the others (restart-wait-ms 1 s); the run finished")
    finally:
        c.close()

elif case == "late_worker":
    c = FaultCluster(1, 2, ["--data", "digits", "--steps", "100", "--init-timeout-ms", "7000"])
    try:
        t0 = time.time()
        c.start("worker", 1)
        rc, _ = c.wait("worker", 1, 60)
        took = time.time() - t0
        log = c.log("worker", 1)
        waits = [l for l in log.splitlines() if "waiting for ps 0" in l]
        assert rc != 0 and len(waits) >= 1, log
        assert "could not be reached within 7000 ms (init-timeout-ms)" in log, log
        assert "chief" not in log, log
        assert took < 20, took
        print("PASS: a late worker said what it waited for (%d lines) and gave up after %.1f s"
              % (len(waits), took))
    finally:
        c.close()

else:
    sys.exit("unknown case " + case)

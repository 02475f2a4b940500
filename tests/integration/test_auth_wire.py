"""test_auth_wire.py - what crosses the wire in a job with a secret, and
what its connections cost a ps.

1. Reading the traffic: a worker trains through a recording proxy (a Unix
   socket at the path a local worker tries first, relaying to the ps's
   TCP port), once authenticated only and once with --encrypt. Without
   --encrypt the messages are readable after the handshake (the frame
   magic, the variable names); with it, nothing but the handshake is: no
   frame magic and no name in either direction. Both runs reach the same
   accuracy, bit for bit (encryption changes no value).
2. Memory: 300 connections that opened and sent nothing (still in their
   handshake) and 300 authenticated connections that made one request and
   stay idle each cost the ps under 64 KiB (its resident set before and
   after); the figures are printed.
Usage: test_auth_wire.py QUORUM_BINARY"""

import atexit
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib

from qrtest import (REPLY, STEP, STOP, Credentials, Proc, connect, frame, free_ports, handshake,
                    lone_ps, read_reply, read_secret, rss_kb, serving, spec_text)

quorum = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="qr-test-auth-wire-")
atexit.register(shutil.rmtree, tmp, True)  # passed or not
secret_path = os.path.join(tmp, "secret")
subprocess.run([quorum, "keygen", secret_path], check=True, capture_output=True, timeout=30)
secret = read_secret(secret_path)


class Recorder:
    """Listens on the Unix socket path a local worker tries before TCP
    (/tmp/quorum-HOST-PORT.sock; the ps itself serves TCP only here) and
    relays each connection to the ps's TCP port, keeping every byte."""

    def __init__(self, port):
        self.path = "/tmp/quorum-127.0.0.1-%d.sock" % port
        self.port = port
        self.up = bytearray()    # worker -> ps
        self.down = bytearray()  # ps -> worker
        self.lock = threading.Lock()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.server.bind(self.path)
        atexit.register(lambda: os.path.exists(self.path) and os.unlink(self.path))
        self.server.listen(16)
        self.server.settimeout(0.2)
        self.stopped = False
        self.threads = [threading.Thread(target=self.accept_loop, daemon=True)]
        self.threads[0].start()

    def pump(self, src, dst, into):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                with self.lock:
                    into.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def accept_loop(self):
        while not self.stopped:
            try:
                client, _ = self.server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            ps = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            client.settimeout(None)
            ps.settimeout(None)
            for a, b, into in ((client, ps, self.up), (ps, client, self.down)):
                t = threading.Thread(target=self.pump, args=(a, b, into), daemon=True)
                t.start()
                self.threads.append(t)

    def close(self):
        self.stopped = True
        self.server.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


def run_through_proxy(encrypt):
    ps_port, worker_port = free_ports(2)
    cluster = ["--ps_hosts", "127.0.0.1:%d" % ps_port, "--worker_hosts",
               "127.0.0.1:%d" % worker_port]
    common = ["--secret-file", secret_path] + (["--encrypt"] if encrypt else [])
    ps = Proc([quorum, "ps"] + cluster + ["--job_name", "ps", "--task_index", "0",
                                          "--transport", "tcp"] + common)
    connect(ps_port).close()
    rec = Recorder(ps_port)
    worker = Proc([quorum, "worker"] + cluster + ["--job_name", "worker", "--task_index", "0",
                                                  "--model", "mlp", "--hidden", "32", "--data",
                                                  "digits", "--epochs", "2", "--batch-size",
                                                  "64", "--lr", "0.1"] + common)
    rc, out, err = worker.wait(300)
    assert rc == 0, err[-3000:]
    assert "over unix" in err or "unix:" in err, "the worker did not go through the proxy"
    rc, _, ps_err = ps.wait(60)
    assert rc == 0, ps_err[-3000:]
    rec.close()
    acc = re.search(r"test accuracy ([0-9.]+) \(loss ([0-9.]+)\)", out + err).groups()
    return bytes(rec.up), bytes(rec.down), acc


# --- 1. reading the traffic --------------------------------------------------
FRAME_MAGIC = b"QURM"  # the first bytes of every message (proto.h)
up, down, acc_plain = run_through_proxy(encrypt=False)
assert up.startswith(b"QRAU") and down.startswith(b"QRAU"), (up[:8], down[:8])
names = sorted(set(re.findall(rb"layer\d+/\w+", up)))
assert names and FRAME_MAGIC in up[88:] and FRAME_MAGIC in down[72:], \
    "the authenticated (unencrypted) traffic should be readable"
print("ok: authenticated only: %d bytes up, %d down; readable (frames, names %s)"
      % (len(up), len(down), b", ".join(names).decode()))

up_e, down_e, acc_encrypted = run_through_proxy(encrypt=True)
assert up_e.startswith(b"QRAU") and down_e.startswith(b"QRAU")
# After the handshake (HELLO and PROOF up, CHALLENGE and RESULT down):
sealed_up, sealed_down = up_e[88 + 40:], down_e[72 + 8:]
assert len(sealed_up) > 100000 and len(sealed_down) > 100000, (len(sealed_up), len(sealed_down))
assert FRAME_MAGIC not in sealed_up and FRAME_MAGIC not in sealed_down, \
    "a frame header crossed the wire in the clear"
for name in names:
    assert name not in up_e and name not in down_e, name
# Float data is near-random already; a frame of zeros is not: the plain
# stream compresses, the sealed one does not.

ratio_plain = len(zlib.compress(up)) / len(up)
ratio_sealed = len(zlib.compress(sealed_up)) / len(sealed_up)
assert ratio_sealed > 0.99, ratio_sealed
assert acc_plain == acc_encrypted, (acc_plain, acc_encrypted)
print("ok: --encrypt: %d bytes up, %d down, no frame or name readable (zlib ratio %.3f vs %.3f "
      "plain); the same accuracy and loss %s" % (len(up_e), len(down_e), ratio_sealed,
                                                  ratio_plain, acc_encrypted))

# --- 2. memory of connections ---------------------------------------------------


ps_port, worker_port = free_ports(2)
ps_hosts, worker_hosts = "127.0.0.1:%d" % ps_port, "127.0.0.1:%d" % worker_port
cred = Credentials(secret, spec_text(ps_hosts, worker_hosts))
ps = lone_ps(quorum, ps_port, worker_port, ["--secret-file", secret_path,
                                            "--handshake-timeout-ms", "60000"])
serving(ps_port).close()
time.sleep(0.3)


def authenticated(rid):
    s = connect(ps_port)
    assert handshake(s, cred)[0] == 0
    s.sendall(frame(STEP, rid))
    mtype, got, status, _, _ = read_reply(s)
    assert (mtype, got, status) == (STEP | REPLY, rid, 0)
    return s


figures = {}
for kind, open_one in (("in their handshake", lambda i: connect(ps_port)),
                       ("authenticated and idle", authenticated)):
    before = rss_kb(ps.p.pid)
    held = [open_one(i + 1) for i in range(300)]
    time.sleep(0.5)
    after = rss_kb(ps.p.pid)
    per = (after - before) / 300.0
    figures[kind] = per
    print("ok: 300 connections %s: %.1f KiB each (resident set %d -> %d KiB)"
          % (kind, per, before, after))
    assert per < 64, "a connection %s costs the ps %.1f KiB" % (kind, per)
    for s in held:
        s.close()
    time.sleep(0.3)
s = authenticated(9998)
s.sendall(frame(STOP, 9999))
read_reply(s)
s.close()
rc, _, err = ps.wait(60)
assert rc == 0, err[-2000:]
shutil.rmtree(tmp, ignore_errors=True)

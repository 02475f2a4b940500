"""test_auth.py - a job with a cluster secret (docs/SECURITY.md) against
clients that do not hold it, while its own worker trains.

1. The secret file: `quorum keygen` writes one (mode 0600) and never
   overwrites; a ps refuses a secret others may read, or a short one.
2. A ps with a secret, its chief connected and waiting in a synchronous
   step for worker 1 (R = N = 2), and meanwhile on fresh connections: a plain request (answered with the reason, then closed),
   another job's secret, another cluster spec, --encrypt on one side only,
   a handshake recorded and replayed, the handshake truncated at every
   byte, bytes that are no handshake, and silence past
   handshake-timeout-ms. Each is refused, logged with the peer's address
   and counted by reason on the metrics page (promtool checks the page);
   a genuine client is served between them. Then worker 1 joins and the
   two train to their accuracy.
3. Real workers told why: one without a secret, one with another job's
   (they stop at once with the reason, not after restart-wait-ms), and one
   with a secret against a ps that has none.
4. `quorum launch` makes a secret for its run and removes it at the end;
   `--secret-file none` goes without.
Usage: test_auth.py QUORUM_BINARY"""

import atexit
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request

from qrtest import (HS_HELLO, HS_MAGIC, HS_PROOF, HS_REFUSAL, REPLY, STEP, STOP, Credentials,
                    Proc, closed_by_peer, connect, frame, free_ports, handshake, hs_hello,
                    read_reply, read_secret, recv_exact, spec_text)

quorum = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="qr-test-auth-")
atexit.register(shutil.rmtree, tmp, True)  # passed or not
QR_EAUTH = -18


def served(s, rid):
    s.sendall(frame(STEP, rid))
    mtype, got, status, _, _ = read_reply(s)
    return mtype == STEP | REPLY and got == rid and status == 0


def metrics(port):
    return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()


def refused_counts(page):
    counts = {}
    for m in re.finditer(r'quorum_handshakes_refused_total\{reason="(\w+)"\} (\d+)', page):
        counts[m.group(1)] = int(m.group(2))
    return counts


# --- 1. the secret file -------------------------------------------------------
secret_path = os.path.join(tmp, "secret")
out = subprocess.run([quorum, "keygen", secret_path], capture_output=True, text=True, timeout=30)
assert out.returncode == 0, out.stderr
assert stat.S_IMODE(os.stat(secret_path).st_mode) == 0o600
secret = read_secret(secret_path)
assert len(secret) == 64 and all(c in b"0123456789abcdef" for c in secret), secret
again = subprocess.run([quorum, "keygen", secret_path], capture_output=True, text=True, timeout=30)
assert again.returncode != 0 and "never overwritten" in again.stderr, again.stderr
assert read_secret(secret_path) == secret
other_path = os.path.join(tmp, "other")
subprocess.run([quorum, "keygen", other_path], check=True, capture_output=True, timeout=30)

ps_port, worker_port, worker1_port, metrics_port = free_ports(4)
ps_hosts = "127.0.0.1:%d" % ps_port
worker_hosts = "127.0.0.1:%d,127.0.0.1:%d" % (worker_port, worker1_port)
spec = spec_text(ps_hosts, worker_hosts)
cluster = ["--ps_hosts", ps_hosts, "--worker_hosts", worker_hosts]

loose = os.path.join(tmp, "loose")
shutil.copy(secret_path, loose)
os.chmod(loose, 0o644)
short = os.path.join(tmp, "short")
with open(short, "wb") as f:
    f.write(b"too short\n")
os.chmod(short, 0o600)
for path, words in ((loose, "chmod 600"), (short, "holds 9 bytes")):
    rc, _, err = Proc([quorum, "ps"] + cluster + ["--job_name", "ps", "--task_index", "0",
                                                  "--secret-file", path]).wait(60)
    assert rc != 0 and words in err, (path, rc, err[-2000:])
helptext = subprocess.run([quorum, "ps", "--help"], capture_output=True, text=True,
                          timeout=30).stdout
metrics_help = [l for l in helptext.splitlines() if l.strip().startswith("--metrics-port")]
assert metrics_help and "read-only" in metrics_help[0] and "loopback" in metrics_help[0], \
    metrics_help
assert "--secret-file" in helptext and "--encrypt" in helptext
print("ok: keygen writes a 0600 secret and never overwrites one; a ps refuses a secret others "
      "may read, or a short one; --help says the metrics page is read-only, on loopback")

# --- 2. a ps with a secret, its worker training, and clients without it -------
ps = Proc([quorum, "ps"] + cluster + ["--job_name", "ps", "--task_index", "0", "--mode", "sync",
                                      "--secret-file", secret_path, "--metrics-port",
                                      str(metrics_port), "--handshake-timeout-ms", "1000"])
cred = Credentials(secret, spec)
deadline = time.time() + 30
while True:  # up once a genuine client is served (probes that fail count as refusals)
    try:
        s = connect(ps_port)
        if handshake(s, cred)[0] == 0 and served(s, 1):
            s.close()
            break
    except (OSError, ConnectionError):
        pass
    assert time.time() < deadline and ps.alive(), "the ps did not come up"
    time.sleep(0.1)
before = refused_counts(metrics(metrics_port))

# The job's own workers: the chief connects, creates the variables and
# waits in its first step for worker 1, which joins after the attacks.
training = ["--mode", "sync", "--secret-file", secret_path, "--model", "mlp", "--hidden", "64",
            "--data", "digits", "--epochs", "5", "--batch-size", "32", "--lr", "0.1"]


def start_worker(index):
    return Proc([quorum, "worker"] + cluster + ["--job_name", "worker", "--task_index",
                                                str(index)] + training)


chief = start_worker(0)
deadline = time.time() + 60
while 'quorum_worker_connected{worker="0"} 1' not in metrics(metrics_port):
    assert time.time() < deadline and chief.alive(), "the chief did not connect"
    time.sleep(0.2)


def fresh():
    return connect(ps_port)


def genuine_served(rid):
    s = fresh()
    assert handshake(s, cred)[0] == 0
    assert served(s, rid), "a genuine client was not served"
    s.close()


# a. A plain request, as a worker without the secret sends: the reason comes
#    back as the reply to that request, then the connection closes.
s = fresh()
s.sendall(frame(STEP, 77))
mtype, rid, status, meta, _ = read_reply(s)
assert (mtype, rid, status) == (STEP | REPLY, 77, QR_EAUTH), (mtype, rid, status)
assert b"requires authentication" in meta, meta
assert closed_by_peer(s)
s.close()

# b-d. Another job's secret, another spec, --encrypt on one side: refused at
#      the HELLO with that reason (the CHALLENGE's status byte), then closed.
for name, other in (("other_secret", Credentials(read_secret(other_path), spec)),
                    ("other_spec", Credentials(secret, spec_text(ps_hosts, worker_hosts +
                                                                 ",127.0.0.1:1")))
                    , ("encrypt_mismatch", Credentials(secret, spec, encrypt=True))):
    s = fresh()
    refusal, _ = handshake(s, other)
    assert HS_REFUSAL.get(refusal) == name, (name, refusal)
    assert closed_by_peer(s)
    s.close()
genuine_served(2)
time.sleep(1.1)  # the ps logs 5 refusals a second: let the next ones be said

# e. A recorded handshake replayed: the ps's fresh nonce makes the recorded
#    proof wrong.
s = fresh()
refusal, recorded = handshake(s, cred)
assert refusal == 0 and served(s, 3)
s.close()
s = fresh()
s.sendall(recorded[:HS_HELLO])
challenge = recv_exact(s, 72)
assert challenge[6] == 0  # a fresh challenge, which the replay cannot answer
s.sendall(recorded[HS_HELLO:])
result = recv_exact(s, 8)
assert result[:4] == HS_MAGIC and HS_REFUSAL.get(result[6]) == "bad_proof", result
assert closed_by_peer(s)
s.close()

# f. Truncated at every byte: a HELLO cut after k bytes, a PROOF after j.
hello = hs_hello(cred)
for k in range(HS_HELLO):
    s = fresh()
    if k:
        s.sendall(hello[:k])
    s.close()
proof = HS_MAGIC + b"\x01\x00\x00\x00" + bytes(32)
for j in range(HS_PROOF):
    s = fresh()
    s.sendall(hs_hello(cred))
    recv_exact(s, 72)
    if j:
        s.sendall(proof[:j])
    s.close()
truncations = HS_HELLO + HS_PROOF
# g. Bytes that are neither a handshake nor a request.
s = fresh()
s.sendall(b"GET / HTTP/1.1\r\n\r\n")
assert closed_by_peer(s)
s.close()
# h. Silence past handshake-timeout-ms (1 s here).
s = fresh()
t0 = time.time()
assert closed_by_peer(s, timeout=10), "a silent connection was not closed"
silent_for = time.time() - t0
s.close()
genuine_served(4)

time.sleep(0.5)
page = metrics(metrics_port)
after = refused_counts(page)
grew = {k: after.get(k, 0) - before.get(k, 0) for k in after}
for name in ("no_handshake", "other_secret", "other_spec", "encrypt_mismatch", "bad_proof",
             "timeout"):
    assert grew.get(name, 0) >= 1, (name, grew)
assert grew["malformed"] >= truncations + 1, grew
assert "quorum_authenticated 1" in page, page[-3000:]
promtool = shutil.which("promtool")
assert promtool, "promtool (Debian's prometheus) is needed"
check = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True,
                       text=True, timeout=60)
assert check.returncode == 0, check.stdout + check.stderr
assert chief.alive(), "the chief died during the attacks"
print("ok: refused and counted by reason %s; a silent connection closed after %.1f s; "
      "genuine clients served between them" % (
          {k: v for k, v in sorted(grew.items()) if v}, silent_for))

# 3. Real workers refused, told why at once.
for extra, words in (([], "requires authentication"),
                     (["--secret-file", other_path], "different secrets")):
    t0 = time.time()
    rc, _, err = Proc([quorum, "worker"] + cluster + ["--job_name", "worker", "--task_index",
                                                      "1", "--mode", "sync", "--model", "mlp",
                                                      "--data", "digits", "--epochs", "1"] +
                      extra).wait(60)
    took = time.time() - t0
    assert rc != 0 and words in err, (extra, rc, err[-2000:])
    assert took < 20, "a refused worker took %.1f s to stop" % took

worker1 = start_worker(1)
rc, out, err = chief.wait(600)
assert rc == 0, err[-3000:]
acc = float(re.search(r"test accuracy ([0-9.]+)", out + err).group(1))
assert acc > 0.8, out + err[-2000:]
rc, _, err = worker1.wait(120)
assert rc == 0, err[-3000:]
rc, _, ps_err = ps.wait(60)
assert rc == 0, ps_err[-3000:]
said = [l for l in ps_err.splitlines() if "refused connection from 127.0.0.1:" in l]
for words in ("without authenticating", "different secrets", "different cluster specs",
              "encrypts", "replayed or forged"):
    assert any(words in l for l in said), (words, ps_err[-3000:])
print("ok: the job's two workers trained to accuracy %.3f after the attacks, the chief "
      "connected throughout; refusals logged with the peer's address; workers without the "
      "secret or with another job's stopped at once with the reason" % acc)

# A worker with a secret against a ps with none: both ends say so.
ps_port2, worker_port2 = free_ports(2)
cluster2 = ["--ps_hosts", "127.0.0.1:%d" % ps_port2, "--worker_hosts",
            "127.0.0.1:%d" % worker_port2]
plain_ps = Proc([quorum, "ps"] + cluster2 + ["--job_name", "ps", "--task_index", "0"])
connect(ps_port2).close()
rc, _, err = Proc([quorum, "worker"] + cluster2 + ["--job_name", "worker", "--task_index", "0",
                                                   "--model", "mlp", "--data", "digits",
                                                   "--epochs", "1", "--secret-file",
                                                   secret_path]).wait(60)
assert rc != 0 and "has none" in err, err[-2000:]
s = connect(ps_port2)
s.sendall(frame(STOP, 1))
read_reply(s)
s.close()
rc, _, err = plain_ps.wait(60)
assert rc == 0 and "this ps has no secret" in err, err[-2000:]
print("ok: a worker with a secret and a ps without one: both name the mismatch")

# --- 4. quorum launch makes a secret for its run ---------------------------------
launch_tmp = tempfile.mkdtemp(prefix="qr-launch-", dir=tmp)
env = dict(os.environ, TMPDIR=launch_tmp)
env.pop("QUORUM_SECRET_FILE", None)
args = [quorum, "launch", "--ps", "2", "--workers", "2", "--model", "mlp", "--hidden", "32",
        "--data", "digits", "--epochs", "2", "--mode", "sync"]
for transport in ("unix", "tcp"):
    rc, out, err = Proc(args + ["--transport", transport], env=env).wait(300)
    assert rc == 0, err[-3000:]
    assert "a secret made for this run" in err and "connections authenticated" in err, err[-3000:]
    assert os.listdir(launch_tmp) == [], os.listdir(launch_tmp)  # the secret went with the run
rc, out, err = Proc(args + ["--secret-file", "none"], env=env).wait(300)
assert rc == 0, err[-3000:]
assert "a secret made for this run" not in err and "not authenticated" in err, err[-3000:]
print("ok: quorum launch authenticates its run with a secret of its own, removed at the end; "
      "--secret-file none goes without")
shutil.rmtree(tmp, ignore_errors=True)

"""qrtest.py - helpers shared by the integration tests: free ports, the
quorum wire format (to play a hostile or precise client), a lone ps to
talk to, and running quorum processes with a deadline (one at a time, or
a hand-started cluster of them), killing only our own children (by pid or
by the process group we created), never by name."""

import atexit
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

MAGIC = 0x4D525551
VERSION = 3  # QR_PROTO_VERSION (src/wire/proto.h)
ALIGN = 64  # payload start and message end fall on multiples of this
HELLO, CREATE, READY, PUSH, PULL, STEP, STOP = 1, 2, 3, 4, 5, 6, 7
LEAVE, SAVE = 16, 17
COMMIT, TOKEN, APPLY, STATS = 8, 9, 10, 11
REPLY = 0x80
PUSH_STEP = 1
PUSH_LR = 0x20  # the items carry their learning rates (push_meta's lrs)

STATUS = {0: "OK", -1: "EINVAL", -3: "EIO", -4: "EPROTO", -5: "ENOTFOUND", -6: "EEXIST",
          -7: "ESHAPE", -10: "ESTOPPED", -11: "ENOTREADY", -14: "ENONFINITE",
          -15: "ETOOBIG"}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def header(mtype, request_id, meta_len, payload_len, flags=0, status=0,
           magic=MAGIC, version=VERSION, reserved=0):
    return struct.pack("<IBBHIiIIQ", magic, version, mtype, flags, request_id,
                       status, meta_len, reserved, payload_len)


def pad(length):
    """The zero bytes that follow `length` bytes of a message (proto.h)."""
    return b"\x00" * (-length % ALIGN)


def frame(mtype, request_id, meta=b"", payload=b"", flags=0):
    return (header(mtype, request_id, len(meta), len(payload), flags) + meta +
            pad(32 + len(meta)) + payload + pad(len(payload)))


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def read_reply(sock):
    """Returns (type, request_id, status, meta, payload)."""
    h = recv_exact(sock, 32)
    magic, version, mtype, flags, rid, status, meta_len, reserved, payload_len = \
        struct.unpack("<IBBHIiIIQ", h)
    assert magic == MAGIC and version == VERSION, "bad reply header"
    meta = recv_exact(sock, meta_len + len(pad(32 + meta_len)))[:meta_len]
    payload = recv_exact(sock, payload_len + len(pad(payload_len)))[:payload_len]
    return mtype, rid, status, meta, payload


def create_meta(items):
    """items: list of (var_id, shape, lr, name[, options[, (init, seed)]]):
    a dense variable, or with (init, seed) an embedding table of shape
    [dim]."""
    meta = struct.pack("<I", len(items))
    for item in items:
        var_id, shape, lr, name = item[:4]
        options = (item[4] if len(item) > 4 else "").encode()
        table = item[5] if len(item) > 5 else None
        meta += struct.pack("<II", var_id, len(shape))
        meta += b"".join(struct.pack("<q", d) for d in shape)
        meta += struct.pack("<fI", lr, len(name)) + name.encode()
        meta += struct.pack("<I", len(options)) + options
        init, seed = table if table else ("", 0)
        meta += struct.pack("<II", 1 if table else 0, len(init)) + init.encode()
        meta += struct.pack("<Q", seed)
    return meta


def push_meta(items, local_step=0, worker=0, seq=0, lrs=None):
    """items: list of (var_id, nbytes) or (var_id, nbytes, kind): kind 0
    dense (the default), 1 sparse rows. lrs: each item's learning rate
    after its record (a push with flag PUSH_LR; -1: the ps's own)."""
    meta = struct.pack("<IqIIIQ", len(items), local_step, worker, seq, 1, 0)
    for k, item in enumerate(items):
        var_id, nbytes = item[:2]
        kind = item[2] if len(item) > 2 else 0
        meta += struct.pack("<IIQQ", var_id, kind, nbytes, 0)
        if lrs is not None:
            meta += struct.pack("<f", lrs[k])
    return meta


def ready_meta(set_ready, step_limit=0):
    return struct.pack("<IqQ", set_ready, step_limit, 0)


def floats(values):
    return struct.pack("<%df" % len(values), *values)


def unfloats(data):
    return list(struct.unpack("<%df" % (len(data) // 4), data))


def free_ports(n):
    """n distinct free ports (free_port may hand out one twice in a row)."""
    got = []
    while len(got) < n:
        p = free_port()
        if p not in got:
            got.append(p)
    return got


def free_base(n):
    """A port p with p .. p+n-1 free on 127.0.0.1, drawn below the kernel's
    ephemeral range: a port from bind(0) is one the cluster's own outgoing
    connections (or the launcher's bind(0) for a ps) may take before the
    task that was told to listen on it binds it."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    for _ in range(200):
        base = random.randrange(10000, max(10001, low - n))
        ok = True
        for p in range(base, base + n):
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", p))
            except OSError:
                ok = False
            t.close()
        if ok:
            return base
    raise AssertionError("no free ports")


def closed_by_peer(s, timeout=5.0):
    """True once the peer has closed s (within timeout)."""
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def status_kb(pid, key):
    """A figure of /proc/PID/status in KiB (VmRSS, VmHWM, ...)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s for pid %d" % (key, pid))


def rss_kb(pid):
    """A process's resident set, in KiB."""
    return status_kb(pid, "VmRSS")


def connect(port, timeout=10.0):
    deadline = time.time() + timeout
    while True:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)


def request(s, data):
    """Send one message on s; its reply (read_reply's tuple)."""
    s.sendall(data)
    return read_reply(s)


def serving(port, timeout=30.0):
    """A connection to the ps at 127.0.0.1:port once it accepts one (it
    may be starting): the socket."""
    deadline = time.time() + timeout
    while True:
        try:
            return connect(port)
        except OSError:
            assert time.time() < deadline, "the ps did not come up"
            time.sleep(0.05)


_started = []


def _kill_started():
    for proc in _started:
        proc.kill()


# A test that fails (an assert, an exception) between starting a process
# and waiting for it must not leave it running: every Proc still alive when
# the test's interpreter exits is killed, with its process group.
atexit.register(_kill_started)


class Proc:
    """A child process in its own session, so that it and anything it
    starts can be killed together by process group at the end."""

    def __init__(self, args, env=None, stdout=subprocess.PIPE, stderr=subprocess.PIPE):
        self.args = args
        self.p = subprocess.Popen(args, stdout=stdout, stderr=stderr,
                                  text=True, env=env, start_new_session=True)
        _started.append(self)

    def wait(self, timeout):
        try:
            out, err = self.p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.p.communicate()
            # The start of a hung run says as much as its end (whose
            # tail is often one task saying what it waits for, again).
            err = err or ""
            if len(err) > 16000:
                err = err[:8000] + "\n[...]\n" + err[-8000:]
            raise AssertionError("timed out after %ss: %s\nstderr:\n%s"
                                 % (timeout, " ".join(self.args), err))
        return self.p.returncode, out or "", err or ""

    def alive(self):
        return self.p.poll() is None

    def kill(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def children(pid):
    """Every descendant of pid."""
    out = []
    try:
        for task in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, task)) as f:
                for c in f.read().split():
                    out += [int(c)] + children(int(c))
    except OSError:
        pass
    return out


def rss_anon_kb(pid):
    """A process's anonymous resident memory, in KiB; 0 once it is gone."""
    try:
        return status_kb(pid, "RssAnon")
    except (OSError, AssertionError):
        return 0


def is_ps(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")[1:2] == [b"ps"]
    except OSError:
        return False


def wait_sampling_ps_rss(proc, timeout, period):
    """proc.wait(timeout) while the RssAnon of every ps task among proc's
    descendants is sampled every `period` s: (rc, out, err, the highest
    sample in MiB)."""
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            for c in children(proc.p.pid):
                if is_ps(c):
                    peak[0] = max(peak[0], rss_anon_kb(c))
            time.sleep(period)

    t = threading.Thread(target=sample)
    t.start()
    try:
        rc, out, err = proc.wait(timeout=timeout)
    finally:
        done.set()
        t.join()
    return rc, out, err, peak[0] / 1024.0


def last_json(stdout):
    lines = [l for l in stdout.strip().splitlines() if l.strip()]
    assert lines, "no output on stdout"
    return json.loads(lines[-1])


def lone_ps(quorum, port, worker_port, extra=(), **popen):
    """`quorum ps` alone at 127.0.0.1:port, for one worker at worker_port
    (nobody serves it: the test plays the worker), with `extra` flags; a
    Proc (popen: Proc's stdout, stderr)."""
    return Proc([quorum, "ps", "--ps_hosts", "127.0.0.1:%d" % port, "--worker_hosts",
                 "127.0.0.1:%d" % worker_port, "--job_name", "ps", "--task_index", "0"] +
                list(extra), **popen)


def stop_ps(ps, port, timeout=60):
    """Stop the ps at port as the chief does (STOP) and wait for it to end:
    Proc.wait's (status, stdout, stderr)."""
    s = connect(port)
    s.sendall(frame(STOP, 9999))
    read_reply(s)
    s.close()
    return ps.wait(timeout)


def end_launch(p, log, mode):
    """Wait for the launcher (p, its Proc, logging to the file `log`),
    killed if it outlives 300 s; it must exit 0 with no rollback. Returns
    its summary and its log; the log file is closed."""
    try:
        rc, out, _ = p.wait(300)
    finally:
        p.kill()
    err = open(log.name).read()
    log.close()
    assert rc == 0, "%s: launch exited %d\n%s" % (mode, rc, err[-4000:])
    s = last_json(out)
    assert s["rollbacks"] == 0 and "rolling back" not in err, (s, err[-3000:])
    return s, err

def launch_child_pid(launcher, job, index):
    """The pid of task `index` of `job` among `quorum launch`'s children
    (launcher: its Proc), once it has started it."""
    deadline = time.time() + 30
    while time.time() < deadline:
        pid = launcher.p.pid
        for child in open("/proc/%d/task/%d/children" % (pid, pid)).read().split():
            try:
                args = open("/proc/%s/cmdline" % child).read().split("\0")
            except OSError:
                continue
            if len(args) > 1 and args[1] == job and \
                    args[args.index("--task_index") + 1] == str(index):
                return int(child)
        time.sleep(0.05)
    raise AssertionError("%s %d not found" % (job, index))


def sanitized(binary):
    """Whether a binary is a sanitizer build (links libasan): its memory
    figures (RSS, mallinfo) are ASan's shadow and quarantine, not its own."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30).stdout
    return "libasan" in out


def wait_catches(pid, signo, timeout=30):
    """Waits until process `pid` has a handler for signal `signo`, read from
    /proc's SigCgt mask. A task stopped (SIGSTOP) before it installs its
    handlers would take a later SIGTERM's default action and die by it,
    which a slow start (the sanitizer build) makes likely."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            for line in open("/proc/%d/status" % pid):
                if line.startswith("SigCgt:") and int(line.split()[1], 16) >> (signo - 1) & 1:
                    return
        except OSError:
            raise AssertionError("pid %d ended before it caught signal %d" % (pid, signo))
        time.sleep(0.02)
    raise AssertionError("pid %d did not catch signal %d within %ds" % (pid, signo, timeout))


def wait_loop_turned(pid, timeout=30):
    """Waits until process `pid`'s main thread sleeps in epoll_wait: its
    event loop has turned at least once (a ps sets its liveness clock in a
    prepare callback, before each poll). A ps stopped before that has no
    clock to judge its own stall by. Where the kernel hides wchan (it reads
    "0"), waits a second instead."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            wchan = open("/proc/%d/wchan" % pid).read().strip()
        except OSError:
            raise AssertionError("pid %d ended before its loop turned" % pid)
        if wchan == "0":
            time.sleep(1.0)
            return
        if "epoll_wait" in wchan:
            return
        time.sleep(0.02)
    raise AssertionError("pid %d did not reach its event loop within %ds" % (pid, timeout))


# A replicated run's last log lines (--ps-replicas 2, docs/REPLICATION.md):
# each worker's pushes acknowledged per shard, each ps's two copies
# (src/ps/replica.c log_digests). Read by tests/integration/
# test_replication.py and scripts/soak.py --replication.
WORKER_ACKS = re.compile(
    r"\[worker (\d+) pid \d+\] info: worker \d+: pushes acknowledged per shard: ([\d: ]+); "
    r"resent after a lost connection: (\d+); longest push \(a failover's stall\): ([\d.]+) s; "
    r"view (\d+)")
PS_COPIES = re.compile(
    r"\[ps (\d+) pid \d+\] info: replica digests: shard (\d+) (primary|backup) (\w+), "
    r"shard (\d+) (backup|promoted) (\w+) \(\d+ forwards sent, \d+ applied here, (\d+) "
    r"duplicate pushes; pushes applied: shard \d+ (\d+), shard \d+ (\d+); view (\d+)")


class ReplicaReport:
    """What those lines say. acked[k]: pushes to shard k acknowledged to
    the workers; workers: how many reported; resent, stall (the longest
    push, s), views (the workers' last views); copies: one dict per copy a
    ps held (ps, shard, role: primary, backup or promoted, digest,
    applied: pushes applied to it, own: the ps's own shard, duplicates:
    pushes the ps answered as duplicates, on its own copy's record), two
    per ps line."""

    def __init__(self, err, nps):
        self.acked, self.workers, self.resent, self.stall = [0] * nps, 0, 0, 0.0
        self.views = set()
        for m in WORKER_ACKS.finditer(err):
            self.workers += 1
            for part in m[2].split():
                k, n = part.split(":")
                self.acked[int(k)] += int(n)
            self.resent += int(m[3])
            self.stall = max(self.stall, float(m[4]))
            self.views.add(int(m[5]))
        self.copies = []
        for m in PS_COPIES.finditer(err):
            ps = int(m[1])
            self.copies.append(dict(ps=ps, shard=int(m[2]), role=m[3], digest=m[4],
                                    applied=int(m[9]), own=True, duplicates=int(m[8]),
                                    line=m[0]))
            self.copies.append(dict(ps=ps, shard=int(m[5]), role=m[6], digest=m[7],
                                    applied=int(m[10]), own=False, duplicates=0, line=m[0]))

    def held(self, shard, skip=()):
        """The copies of `shard` on ps tasks not in `skip`."""
        return [c for c in self.copies if c["shard"] == shard and c["ps"] not in skip]

    def duplicates(self, skip=()):
        """Pushes answered as duplicates by the ps tasks not in `skip`."""
        return sum(c["duplicates"] for c in self.copies if c["ps"] not in skip)


class Cluster:
    """ps and worker tasks started one by one, by hand (no launcher, as a
    container orchestrator would), on Unix sockets in a private directory;
    each run of a task has its stderr in a file of its own (they log a
    lot). tasks: (job, index) -> the Proc of its current run; a killed task
    leaves it until started again."""

    def __init__(self, quorum, nps, nworkers, opts, prefix="qr-cluster-"):
        self.quorum = quorum
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.spec = ["--ps_hosts", ",".join("unix:%s/ps%d.sock" % (self.dir, i)
                                            for i in range(nps)),
                     "--worker_hosts", ",".join("unix:%s/w%d.sock" % (self.dir, i)
                                                for i in range(nworkers))]
        self.opts = opts
        self.nps, self.nworkers = nps, nworkers
        self.tasks = {}
        self.runs = {}

    def start(self, job, i, extra=()):
        key = (job, i)
        self.runs[key] = self.runs.get(key, 0) + 1
        with open(os.path.join(self.dir, "%s%d.%d.log" % (job, i, self.runs[key])), "w") as log:
            p = Proc([self.quorum, job] + self.spec + ["--job_name", job, "--task_index", str(i)]
                     + self.opts + list(extra), stderr=log)
        self.tasks[key] = p
        return p

    def start_all(self):
        for job, n in (("ps", self.nps), ("worker", self.nworkers)):
            for i in range(n):
                self.start(job, i)

    def log(self, job, i, run=None):
        """What task (job, i) wrote to stderr in its run `run` (default: the latest)."""
        run = run or self.runs[(job, i)]
        with open(os.path.join(self.dir, "%s%d.%d.log" % (job, i, run))) as f:
            return f.read()

    def last_line(self, job, i):
        lines = [l for l in self.log(job, i).splitlines() if l.strip()]
        return lines[-1] if lines else ""

    def wait_log(self, job, i, text, timeout):
        deadline = time.time() + timeout
        while text not in self.log(job, i):
            assert time.time() < deadline, "timed out waiting for %r in %s %d:\n%s" % (
                text, job, i, self.log(job, i)[-3000:])
            time.sleep(0.05)

    def kill(self, job, i):
        """SIGKILL task (job, i) and reap it."""
        p = self.tasks.pop((job, i))
        os.kill(p.p.pid, signal.SIGKILL)
        p.p.wait()

    def wait(self, job, i, timeout):
        """Wait for task (job, i) to end: (its status, its stdout)."""
        rc, out, _ = self.tasks[(job, i)].wait(timeout)
        return rc, out

    def ends(self, timeout):
        """Wait for every task still running (within timeout, together):
        {(job, i): (exit status, last line of stderr, stdout)}."""
        deadline = time.time() + timeout
        out = {}
        for key, p in self.tasks.items():
            rc, stdout, _ = p.wait(max(1, deadline - time.time()))
            out[key] = (rc, self.last_line(*key), stdout)
        return out

    def close(self):
        for p in self.tasks.values():
            p.kill()
        if sys.exc_info()[0] is not None:  # failing: show what every task said
            for name in sorted(os.listdir(self.dir)):
                if name.endswith(".log"):
                    with open(os.path.join(self.dir, name)) as f:
                        print("---- %s\n%s" % (name, f.read()[-2500:]))
        shutil.rmtree(self.dir, ignore_errors=True)


# --- the handshake of a job with a secret (src/wire/auth.h) -------------------
# Played here from the byte layout and the key derivation, so the tests
# check the C code against an independent reading of the protocol.
HS_MAGIC = b"QRAU"
HS_VERSION = 1
HS_HELLO, HS_CHALLENGE, HS_PROOF, HS_RESULT = 88, 72, 40, 8
# The refusals (qr_hs_refusal) and their metrics labels.
HS_REFUSAL = {1: "version", 2: "other_secret", 3: "other_spec", 4: "bad_proof",
              5: "no_secret", 6: "encrypt_mismatch", 7: "malformed", 8: "no_handshake",
              9: "timeout"}


def _blake(label, *parts, key=b""):
    h = hashlib.blake2b(digest_size=32, key=key)
    h.update(label.encode() + b"\0")
    for p in parts:
        h.update(p)
    return h.digest()


class Credentials:
    """What a task of a job holds: its secret (the file's bytes less a
    trailing newline) bound to the cluster spec's text."""

    def __init__(self, secret, spec, encrypt=False):
        master = hashlib.blake2b(secret, digest_size=32).digest()
        self.key_id = _blake("quorum key id v1", key=master)[:16]
        self.spec_hash = _blake("quorum cluster spec v1", spec.encode())
        self.job_key = _blake("quorum job key v1", self.spec_hash, key=master)
        self.encrypt = encrypt


def read_secret(path):
    data = open(path, "rb").read()
    return data[:-1] if data.endswith(b"\n") else data


def spec_text(ps_hosts, worker_hosts):
    return "ps=%s;worker=%s" % (ps_hosts, worker_hosts)


def hs_hello(cred, nonce=None):
    nonce = nonce or os.urandom(32)
    return (HS_MAGIC + bytes([HS_VERSION, 1 if cred.encrypt else 0, 0, 0]) + cred.key_id +
            cred.spec_hash + nonce)


def handshake(sock, cred, hello=None):
    """Authenticate sock as a client of cred's job. Returns (refusal, sent):
    refusal 0 when accepted (or the status byte of the refusing message),
    sent the bytes this side wrote (HELLO, then PROOF), for replays."""
    hello = hello or hs_hello(cred)
    sock.sendall(hello)
    challenge = recv_exact(sock, HS_CHALLENGE)
    assert challenge[:4] == HS_MAGIC, challenge
    if challenge[6]:
        return challenge[6], hello
    transcript = hello + challenge[:40]
    proof_s = _blake("quorum server proof v1", transcript, key=cred.job_key)
    assert challenge[40:] == proof_s, "the ps's proof of the secret is wrong"
    proof_c = _blake("quorum client proof v1", transcript, proof_s, key=cred.job_key)
    proof = HS_MAGIC + bytes([HS_VERSION, 0, 0, 0]) + proof_c
    sock.sendall(proof)
    result = recv_exact(sock, HS_RESULT)
    assert result[:4] == HS_MAGIC, result
    return result[6], hello + proof

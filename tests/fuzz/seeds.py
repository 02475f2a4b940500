"""seeds.py - writes the starting corpus of a fuzz target into DIR.

ps (fuzz_ps, fuzz_ps_sync): one well-formed request of every kind a ps
serves, async and sync, against the variables fuzz_ps.c creates (ids
0 "dense" [4, 3], 1 "table" [8, 2], 2 "adam" [5], 3 the embedding table
"emb" of dim 2), and inputs with several
requests back to back, so libFuzzer starts past the header checks.
data (fuzz_data): a small valid file for each loader, behind the byte that
picks it (0 libsvm, 1 and 2 digits csv, 3 IDX images, 4 IDX labels).
worker (fuzz_worker): a correct reply to each request fuzz_worker.c makes,
behind the byte that picks the request (0 pull, 1 push, 2 step, 3 stats,
4 sparse push), and an error reply.
config (fuzz_config): a TF_CONFIG document, cluster flags, and option lines
ending in a variable's optimizer options.
handshake (fuzz_handshake): whole valid handshakes made of input bytes alone
(the proofs computed here with hashlib's BLAKE2b, from the secret, spec and
fixed nonces fuzz_handshake.c uses), as server and as client, plain and
encrypted; the same with genuine peers spliced in; peers of other jobs,
refusals, altered and short messages; and sealed-record operations after
them and on their own.
ps_auth (fuzz_ps_auth): the ps seeds sent raw (refused: no handshake), and
after a genuine handshake sealed in records (byte 1 then a record size;
9: without AES), behind the byte that picks how fuzz_ps.c sends them; the
past findings against the ps (tests/fuzz/regressions) sealed the same way;
a few handshake-shaped ones.
Usage: seeds.py DIR [ps|data|worker|config|handshake|ps_auth]"""

import gzip
import hashlib
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from qrtest import (CREATE, HELLO, PULL, PUSH, READY, STATS, STEP, create_meta, floats,  # noqa: E402
                    frame, header, pad, push_meta, ready_meta)

COMMIT, TOKEN, APPLY, CLOCK, LOOKUP, SLOTS = 8, 9, 10, 12, 15, 18
SLOTS_NAMES, SLOTS_READ, SLOTS_WRITE, SLOTS_STEP, SLOTS_CHECK_ONLY = 1, 2, 3, 4, 1
PUSH_STEP, PUSH_SYNC, PUSH_DELTA, PUSH_LR, CREATE_CHECK_ONLY = 1, 2, 4, 0x20, 1
PULL_DTYPES = 2
# a dense item's kind with a dtype in bits 8..15 (src/wire/msg.h)
KIND_BF16, KIND_F16 = 1 << 8, 2 << 8


def halves(values, fmt="<H"):
    """2-byte elements, zero-padded to a multiple of 4 as the wire wants."""
    data = b"".join(struct.pack(fmt, v) for v in values)
    return data + b"\0" * (-len(data) % 4)


def slots_meta(op, var_id, name=b"", count=0, step=0):
    return struct.pack("<IIqQI", op, var_id, step, count, len(name)) + name


def sparse_push(var_id, rows, dim):
    meta = push_meta([(var_id, len(rows) * (8 + 4 * dim), 1)])
    payload = b"".join(struct.pack("<q", r) for r in rows)
    payload += floats([0.5] * (len(rows) * dim))
    return frame(PUSH, 6, meta, payload, flags=PUSH_STEP)


seeds = {
    "step": frame(STEP, 1),
    "hello": frame(HELLO, 2, struct.pack("<III", 1, 0, 0)),
    "ready": frame(READY, 3, ready_meta(0)),
    "pull": frame(PULL, 4, struct.pack("<IIII", 3, 0, 1, 2)),
    "push_dense": frame(PUSH, 5, push_meta([(0, 48)]), floats([0.25] * 12), flags=PUSH_STEP),
    "push_sparse": sparse_push(1, [3, 0, 3], 2),
    "push_adam": frame(PUSH, 7, push_meta([(2, 20)]), floats([1.0] * 5)),
    # each item with its learning rate (-1: the ps's own); rows of a table too
    "push_lr": frame(PUSH, 20, push_meta([(0, 48), (2, 20), (3, 32, 1)], lrs=[0.05, -1.0, 0.5]),
                     floats([0.25] * 17) + b"".join(struct.pack("<q", i) for i in (5, 9)) +
                     floats([0.5] * 4), flags=PUSH_STEP | PUSH_LR),
    "push_delta": frame(PUSH, 8, push_meta([(0, 48), (2, 20)]), floats([0.1] * 17),
                        flags=PUSH_DELTA),
    "create": frame(CREATE, 9, create_meta([(4, [2], -1.0, "fresh", "optimizer=momentum")]),
                    floats([1.0, 2.0])),
    "create_table": frame(CREATE, 18, create_meta([(5, [4], -1.0, "emb2", "",
                                                    ("uniform:-1,1", 9))])),
    "lookup": frame(LOOKUP, 19, struct.pack("<IIQ", 3, 0, 3),
                    b"".join(struct.pack("<q", i) for i in (5, -7, 1 << 40))),
    "push_table": sparse_push(3, [5, 5, -7], 2),
    "create_check": frame(CREATE, 10, create_meta([(0, [4, 3], -1.0, "dense")]),
                          floats([0.0] * 12), flags=CREATE_CHECK_ONLY),
    "stats": frame(STATS, 11),
    "clock": frame(CLOCK, 12, struct.pack("<Iq", 0, 1)),
    "slots_names": frame(SLOTS, 20, slots_meta(SLOTS_NAMES, 2)),
    "slots_read": frame(SLOTS, 21, slots_meta(SLOTS_READ, 2, b"m", 5)),
    "slots_write": frame(SLOTS, 22, slots_meta(SLOTS_WRITE, 2, b"v", 5), floats([0.5] * 5)),
    "slots_value": frame(SLOTS, 23, slots_meta(SLOTS_WRITE, 0, b"", 12), floats([1.0] * 12)),
    "slots_check": frame(SLOTS, 24, slots_meta(SLOTS_WRITE, 2, b"m", 5),
                         flags=SLOTS_CHECK_ONLY),
    "slots_step": frame(SLOTS, 25, slots_meta(SLOTS_STEP, 0, step=7)),
    # sync mode
    "hello_sync": frame(HELLO, 13, struct.pack("<III", 1, 0, 1)),
    "push_sync": frame(PUSH, 14, push_meta([(0, 48)], local_step=0, worker=0, seq=1),
                       floats([0.25] * 12), flags=PUSH_SYNC),
    "push_sync_lr": frame(PUSH, 21, push_meta([(0, 48)], local_step=0, worker=0, seq=2,
                                              lrs=[0.125]),
                          floats([0.25] * 12), flags=PUSH_SYNC | PUSH_LR),
    # bf16 and fp16 gradients (fp16 "adam" [5]: 10 bytes padded to 12)
    "push_bf16": frame(PUSH, 22, push_meta([(0, 24, KIND_BF16), (2, 12, KIND_F16)]),
                       halves([0x3e80] * 12) + halves([0x3400] * 5), flags=PUSH_STEP),
    "push_sync_bf16": frame(PUSH, 23, push_meta([(0, 24, KIND_BF16)], local_step=0, worker=0,
                                                seq=3),
                            halves([0x3e80] * 12), flags=PUSH_SYNC),
    # values asked for in bf16 and fp16
    "pull_typed": frame(PULL, 24, struct.pack("<IIIII", 2, 0, 1, 2, 2), flags=PULL_DTYPES),
    "commit": frame(COMMIT, 15, struct.pack("<IIqQ", 0, 1, 0, 0)),
    "token": frame(TOKEN, 16, struct.pack("<I", 0)),
    "apply": frame(APPLY, 17, struct.pack("<qIII", 0, 1, 0, 1)),
}
seeds["pipelined"] = seeds["hello"] + seeds["push_dense"] + seeds["pull"] + seeds["step"]
seeds["sync_step"] = (seeds["hello_sync"] + seeds["push_sync"] + seeds["commit"] +
                      seeds["token"] + seeds["pull"])

data_seeds = {
    "libsvm": b"\x00+1 1:0.5 3:1\n-1 2:0.25 7:-3e-2\n\n+1 4:1\n",
    "libsvm_gz": b"\x00" + gzip.compress(b"+1 1:0.5 3:1\n-1 2:0.25\n"),
    "digits": b"\x010,1,2,16,3\n4,5,6,7,1\n",
    "digits65": b"\x02" + (",".join(["3"] * 64) + ",7\n").encode() * 2,
    "idx_images": b"\x03" + struct.pack(">IIII", 0x803, 2, 2, 2) + bytes([0, 255, 3, 4, 5, 6, 7, 8]),
    "idx_labels": b"\x04" + struct.pack(">II", 0x801, 3) + bytes([1, 2, 9]),
}
REPLY_BIT = 0x80
pull_reply_meta = struct.pack("<IIIQQ", 1, 0, 0, 48, 1)
worker_seeds = {
    "pull": b"\x00" + frame(PULL | REPLY_BIT, 1, pull_reply_meta, floats([0.5] * 12)),
    "push": b"\x01" + frame(PUSH | REPLY_BIT, 1, struct.pack("<q", 5)),
    "step": b"\x02" + frame(STEP | REPLY_BIT, 1, struct.pack("<q", 5)),
    "stats": b"\x03" + frame(STATS | REPLY_BIT, 1, b'{"staleness":[1,0,0,0,0,0,0,0,0]}'),
    "sparse": b"\x04" + frame(PUSH | REPLY_BIT, 1, struct.pack("<q", 5)),
    "error": b"\x00" + header(PULL | REPLY_BIT, 1, 9, 0, status=-1) + b"bad thing" + pad(41),
    # a bf16 reply to a float32 pull: refused as a bad record
    "pull_bf16": b"\x00" + frame(PULL | REPLY_BIT, 1, struct.pack("<IIIQQ", 1, 0, 1 << 8, 24, 1),
                                 halves([0x3f00] * 12)),
}
config_seeds = {
    "tf_config": b'\x00{"cluster":{"ps":["127.0.0.1:2222"],"worker":["127.0.0.1:2223",'
                 b'"unix:/tmp/x.sock"]},"task":{"type":"worker","index":1}}',
    "flags": b"\x01127.0.0.1:1,127.0.0.1:2\nlocalhost:3\nworker\n\x00",
    "options": b"\x02lr=0.5\noptimizer=adam\nbeta1=0.8\noptimizer=ftrl,l1=0.1,lr-power=-0.5",
}


# fuzz_handshake: src/wire/auth.h's derivations. BLAKE2b-256, keyed where a
# key is given; each label hashed with its terminating NUL.
def blake(data, key=b""):
    return hashlib.blake2b(data, digest_size=32, key=key).digest()


def hs_hash(key, label, *parts):
    return blake(label.encode() + b"\0" + b"".join(parts), key)


class Job:
    def __init__(self, secret, spec):
        master = blake(secret)
        self.key_id = hs_hash(master, "quorum key id v1")[:16]
        self.spec_hash = hs_hash(b"", "quorum cluster spec v1", spec)
        self.job_key = hs_hash(master, "quorum job key v1", self.spec_hash)


HS_SECRET = b"fuzz_handshake: the cluster secret of this job"  # as in fuzz_handshake.c
HS_SPEC = b"ps=127.0.0.1:2222;worker=127.0.0.1:2223"
NONCE_C, NONCE_S = bytes(range(0x00, 0x20)), bytes(range(0x80, 0xa0))
job = Job(HS_SECRET, HS_SPEC)


def hs_head(flags=0, status=0):
    return b"QRAU" + bytes([1, flags, status, 0])


def hs_hello(flags, key_id=job.key_id, spec_hash=job.spec_hash):
    return hs_head(flags) + key_id + spec_hash + NONCE_C


def hs_transcript(hello, challenge_flags):
    """The CHALLENGE and PROOF answering hello."""
    t = hello + hs_head(challenge_flags) + NONCE_S
    proof_s = hs_hash(job.job_key, "quorum server proof v1", t)
    proof_c = hs_hash(job.job_key, "quorum client proof v1", t, proof_s)
    return t[88:] + proof_s, hs_head() + proof_c


RESULT_OK = hs_head()
# Sealed-record operations (records() in fuzz_handshake.c): genuine
# records, a big payload split in several, an altered one, one out of
# place, and one of arbitrary bytes.
RECORD_OPS = (b"\x01\x0f" + b"sixteen bytes!!!" + b"\x01\xff\x20\x4e" +
              b"\x02\x1f\x05\x00\x40" + b"x" * 32 + b"\x03\x01\x00\x07" + b"eight b." +
              b"\x00" + struct.pack("<I", 8) + b"\x00" * 24)
MODE_SERVER, MODE_CLIENT, MODE_RECORDS, ENCRYPT = 0, 1, 2, 4
GENUINE_BOTH = 0x11
hs_seeds = {}
for enc in (0, ENCRYPT):
    e = "_enc" if enc else ""
    f = 1 if enc else 0
    # As a server, from input bytes alone: the HELLO does not offer AES, so
    # the CHALLENGE (flags f) is the same on any CPU.
    hello = hs_hello(f)
    challenge, proof = hs_transcript(hello, f)
    hs_seeds["server" + e] = bytes([MODE_SERVER | enc, 0]) + hello + proof + RECORD_OPS
    # Offering AES: the proof holds where the CPU has it (the ps chooses it).
    hello = hs_hello(f | 2)
    challenge, proof = hs_transcript(hello, f | (2 if enc else 0))
    hs_seeds["server_aes" + e] = bytes([MODE_SERVER | enc, 0]) + hello + proof + RECORD_OPS
    # As a client: its HELLO offers AES where the CPU has it, so one seed
    # for either CPU; the CHALLENGE does not pick AES.
    for aes in (0, 2):
        challenge, proof = hs_transcript(hs_hello(f | aes), f)
        hs_seeds["client%s%s" % ("_aescpu" if aes else "", e)] = (
            bytes([MODE_CLIENT | enc, 0]) + challenge + RESULT_OK + RECORD_OPS)
    for mode, name in ((MODE_SERVER, "server"), (MODE_CLIENT, "client")):
        sel = bytes([mode | enc])
        hs_seeds[name + "_genuine" + e] = sel + bytes([GENUINE_BOTH]) + RECORD_OPS
        for i, other in enumerate(("secret", "spec", "encrypt", "no_secret")):
            hs_seeds["%s_other_%s%s" % (name, other, e)] = sel + b"\x03" + bytes([i])
        hs_seeds[name + "_refused" + e] = sel + b"\x31" + b"\x04"  # bad_proof
        hs_seeds[name + "_changed" + e] = sel + b"\x21" + b"\x09\x10"
        hs_seeds[name + "_short" + e] = sel + b"\x04" + b"\x05QRAU\x01"
hs_seeds["server_version"] = b"\x00\x00" + hs_head(0)[:4] + b"\x02" + hs_hello(0)[5:]
hs_seeds["server_other_spec"] = (b"\x00\x00" +
                                 hs_hello(0, spec_hash=hs_hash(b"", "quorum cluster spec v1",
                                                               b"ps=elsewhere:1;worker=")))
hs_seeds["records"] = bytes([MODE_RECORDS]) + RECORD_OPS
hs_seeds["records_aes"] = bytes([MODE_RECORDS | ENCRYPT]) + RECORD_OPS

# fuzz_ps_auth: the first byte picks how fuzz_ps.c sends the rest (0 raw,
# 1 sealed after a handshake, in records of byte 2 + 1 bytes, 2 raw after
# a handshake, 3 raw after a genuine HELLO, 4 raw, the connection held
# open until the ps's handshake deadline closes it).
ps_auth_seeds = {}
for name, data in seeds.items():
    ps_auth_seeds["raw_" + name] = b"\x00" + data
    ps_auth_seeds["sealed_" + name] = b"\x01\xff" + data
regressions = os.path.join(os.path.dirname(os.path.abspath(__file__)), "regressions")
for name in sorted(os.listdir(regressions)):
    with open(os.path.join(regressions, name), "rb") as f:
        ps_auth_seeds["sealed_regression_" + name] = b"\x01\xff" + f.read()
ps_auth_seeds["sealed_pipelined_small_records"] = b"\x01\x07" + seeds["pipelined"]
ps_auth_seeds["sealed_xchacha_pipelined"] = b"\x09\x3f" + seeds["pipelined"]
ps_auth_seeds["sealed_xchacha_sync_step"] = b"\x09\xff" + seeds["sync_step"]
ps_auth_seeds["records_garbage"] = b"\x02" + struct.pack("<I", 8) + b"\x00" * 24
ps_auth_seeds["records_too_long"] = b"\x02" + struct.pack("<I", 1 << 20)
ps_auth_seeds["hello_then_proof"] = b"\x03" + hs_head() + b"\x00" * 32
ps_auth_seeds["hello_then_refusal"] = b"\x03" + hs_head(0, 4) + b"\x00" * 32
ps_auth_seeds["foreign_hello"] = b"\x00" + hs_hello(1)
ps_auth_seeds["held_half_hello"] = b"\x04" + hs_hello(1)[:40]
ps_auth_seeds["held_half_request"] = b"\x04" + seeds["push_dense"][:40]

kind = sys.argv[2] if len(sys.argv) > 2 else "ps"
seeds = {"ps": seeds, "data": data_seeds, "worker": worker_seeds, "config": config_seeds,
         "handshake": hs_seeds, "ps_auth": ps_auth_seeds}[kind]

os.makedirs(sys.argv[1], exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        f.write(data)

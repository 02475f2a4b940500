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
Usage: seeds.py DIR [ps|data|worker|config]"""

import gzip
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from qrtest import (CREATE, HELLO, PULL, PUSH, READY, STATS, STEP, create_meta, floats,  # noqa: E402
                    frame, header, pad, push_meta, ready_meta)

COMMIT, TOKEN, APPLY, CLOCK, LOOKUP = 8, 9, 10, 12, 15
PUSH_STEP, PUSH_SYNC, PUSH_DELTA, CREATE_CHECK_ONLY = 1, 2, 4, 1


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
    # sync mode
    "hello_sync": frame(HELLO, 13, struct.pack("<III", 1, 0, 1)),
    "push_sync": frame(PUSH, 14, push_meta([(0, 48)], local_step=0, worker=0, seq=1),
                       floats([0.25] * 12), flags=PUSH_SYNC),
    "commit": frame(COMMIT, 15, struct.pack("<IIq", 0, 1, 0)),
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
}
config_seeds = {
    "tf_config": b'\x00{"cluster":{"ps":["127.0.0.1:2222"],"worker":["127.0.0.1:2223",'
                 b'"unix:/tmp/x.sock"]},"task":{"type":"worker","index":1}}',
    "flags": b"\x01127.0.0.1:1,127.0.0.1:2\nlocalhost:3\nworker\n\x00",
    "options": b"\x02lr=0.5\noptimizer=adam\nbeta1=0.8\noptimizer=ftrl,l1=0.1,lr-power=-0.5",
}
kind = sys.argv[2] if len(sys.argv) > 2 else "ps"
seeds = {"ps": seeds, "data": data_seeds, "worker": worker_seeds, "config": config_seeds}[kind]

os.makedirs(sys.argv[1], exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        f.write(data)

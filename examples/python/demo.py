"""demo.py - quorum from Python through ctypes: a ps on a thread and a
worker that fits least squares with numpy gradients. Also shows a refused
option raising QuorumError with the library's message.
Usage: demo.py PATH/TO/libquorum.so"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quorum_ctypes import PS, Config, Library, QuorumError, Worker, cluster  # noqa: E402

q = Library(sys.argv[1])
print("libquorum", q.lib.qr_version().decode())
try:
    Config(q, optimizer="adamw")
    raise SystemExit("an unknown optimizer was accepted")
except QuorumError as e:
    print("refused as expected:", e)
    assert "not one of sgd" in str(e)

ps_addr = "unix:/tmp/quorum-py-demo-%d.sock" % os.getpid()
worker_addr = "unix:/tmp/quorum-py-demo-w-%d.sock" % os.getpid()
cfg = Config(q, optimizer="adam", lr=0.05)
ps_spec = cluster(q, ps_addr, worker_addr, "ps", 0)
worker_spec = cluster(q, ps_addr, worker_addr, "worker", 0)
ps = PS(q, ps_spec, cfg)
w = Worker(q, worker_spec, cfg)
theta_id = w.declare("theta", [3], init="zeros")
w.initialize()

rng = np.random.default_rng(0)
X = rng.normal(size=(256, 3)).astype(np.float32)
true = np.array([1.5, -2.0, 0.5], dtype=np.float32)
y = X @ true
theta = np.zeros(3, dtype=np.float32)
for step in range(400):
    w.pull([theta_id], [theta])
    grad = (2.0 / len(X) * X.T @ (X @ theta - y)).astype(np.float32)
    w.push([theta_id], [grad])
w.pull([theta_id], [theta])
print("theta =", theta)
w.stop_cluster()
w.close()
ps.join()
q.lib.qr_cluster_free(ps_spec)
q.lib.qr_cluster_free(worker_spec)
cfg.close()
assert np.allclose(theta, true, atol=1e-2), theta
print("PASS: trained through the ctypes binding")

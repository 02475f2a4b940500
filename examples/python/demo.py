"""demo.py - quorum from Python: two ps tasks on threads of this process and
a worker that fits least squares with NumPy gradients, then shows a
float64 array refused (NumPy's default dtype: quorum never converts) and a
bad option refused with the library's message.
Usage (after `pip install .`): python examples/python/demo.py"""

import os
import tempfile

import numpy as np

import quorum

tmp = tempfile.mkdtemp(prefix="quorum-demo-")
ps_hosts = ["unix:%s/ps%d.sock" % (tmp, i) for i in range(2)]
worker_hosts = ["unix:%s/w0.sock" % tmp]
ps = [quorum.PS(quorum.Cluster(ps_hosts, worker_hosts, "ps", i), optimizer="adam", lr=0.05)
      for i in range(2)]
w = quorum.Worker(quorum.Cluster(ps_hosts, worker_hosts, "worker", 0))
w.declare("theta", 3, init="zeros")
w.declare_values("bias", np.array([0.25], dtype=np.float32))
w.initialize()

rng = np.random.default_rng(0)
X = rng.normal(size=(256, 3)).astype(np.float32)
true = np.array([1.5, -2.0, 0.5], dtype=np.float32)
y = X @ true + 0.75
for step in range(400):
    w.pull()
    theta, bias = w.value("theta"), w.value("bias")
    err = X @ theta + bias - y
    w.push({"theta": (2.0 / len(X) * X.T @ err).astype(np.float32),
            "bias": np.array([2.0 * err.mean()], dtype=np.float32)})
w.pull()
print("theta =", w.value("theta"), "bias =", w.value("bias"), "global step", w.global_step())
try:
    w.push({"theta": np.ones(3)})
except TypeError as e:
    print("refused as expected:", e)
try:
    quorum.Config(optimizer="adamax")
except quorum.InvalidArgumentError as e:
    print("refused as expected:", e)
w.stop_cluster()
w.close()
for p in ps:
    p.join(10)
    p.close()
os.rmdir(tmp)
assert np.allclose(theta, true, atol=2e-2) and abs(bias[0] - 0.75) < 2e-2, (theta, bias)
print("PASS: trained through the Python package")

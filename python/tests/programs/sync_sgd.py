"""A worker program for `quorum launch -- python sync_sgd.py STEPS PIDFILE`:
least squares on fixed data, sync or async as the launcher's options say;
writes the final parameters as JSON to PIDFILE.result.TASK. With --leave each
worker says it has finished and ps 0 ends the run once all have; otherwise
the launcher stops the ps tasks once every worker is done. With
STEPS 0 it trains until killed (for the Ctrl-C test), writing its pid."""

import json
import os
import sys

import numpy as np

import quorum

steps, pidfile = int(sys.argv[1]), sys.argv[2]
with open("%s.pid.%d" % (pidfile, os.getpid()), "w") as f:
    f.write(str(os.getpid()))
w = quorum.Worker()  # TF_CONFIG and QUORUM_OPTIONS from the launcher
w.declare("theta", 3)
w.initialize()
rng = np.random.default_rng(w.cluster.task_index)
X = rng.normal(size=(64, 3)).astype(np.float32)
y = X @ np.array([1.0, -2.0, 0.5], dtype=np.float32)
sync = json.loads(os.environ["QUORUM_OPTIONS"]).get("mode") == "sync"
step = 0
while steps == 0 or step < steps:
    w.pull()
    theta = w.value("theta")
    grad = (2.0 / len(X) * X.T @ (X @ theta - y)).astype(np.float32)
    if sync:
        step = w.sync_step({"theta": grad}, pull=False)
    else:
        w.push({"theta": grad})
        step += 1
w.pull()
with open("%s.result.%d" % (pidfile, w.cluster.task_index), "w") as f:
    json.dump({"task": w.cluster.task_index, "theta": w.value("theta").tolist()}, f)
if "--leave" in sys.argv:
    w.leave()

"""quorum: a parameter server for distributed training, from Python.

The C library does the work (networking, the optimizers on the ps tasks,
synchronous replicas, checkpoints); this package binds it with checked,
zero-copy arrays (NumPy float32 arrays and CPU torch tensors), exceptions
that carry the library's messages, and its log lines in ``logging``.

    import quorum
    cluster = quorum.Cluster.from_env()          # TF_CONFIG
    if cluster.job == "ps":
        quorum.serve_ps(cluster, optimizer="adam", lr=0.001)
    w = quorum.Worker(cluster)
    wid = w.declare("w", (784, 10), init="glorot_uniform")
    w.initialize()
    w.pull()                                      # into w.value("w")
    w.push({wid: grad})                           # float32, 7840 elements
"""

from ._native import version
from .cluster import Cluster, Config
from .errors import (AuthenticationError, InvalidArgumentError, QuorumError,
                     QuorumTimeoutError, StaleError, StoppedError)
from .ps import PS, serve_ps
from .worker import Request, Worker

__all__ = ["AuthenticationError", "Cluster", "Config", "InvalidArgumentError", "PS",
           "QuorumError", "QuorumTimeoutError", "Request", "StaleError", "StoppedError", "Worker", "serve_ps",
           "version"]
__version__ = "0.1.0"

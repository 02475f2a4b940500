"""The cluster of a script run alone (no TF_CONFIG): one ps in this
process and this worker, on Unix sockets of a private folder, so that the
same training script runs single-process and under `quorum launch`. The
ps takes the launcher's options (QUORUM_OPTIONS) and the worker's own."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any, Dict, Tuple

from ..cluster import Cluster, launcher_options
from ..ps import PS
from ..worker import Worker

__all__ = ["start_local"]


def start_local(settings: Dict[str, Any]) -> Tuple[str, PS, Worker]:
    """(the sockets' folder, the ps, the worker): the caller removes the
    folder once both are closed."""
    folder = tempfile.mkdtemp(prefix="quorum-local-")
    ps_hosts = ["unix:%s/ps0.sock" % folder]
    worker_hosts = ["unix:%s/w0.sock" % folder]
    options = dict(launcher_options())
    options.update(settings)
    ps = None
    try:
        ps = PS(Cluster(ps_hosts, worker_hosts, "ps", 0), None, **options)
        return folder, ps, Worker(Cluster(ps_hosts, worker_hosts, "worker", 0), **settings)
    except BaseException:
        if ps is not None:
            ps.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise

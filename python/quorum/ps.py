"""A ps task run from Python: the C ps's event loop on a thread of its own
(the GIL released for as long as it runs), stopped by ``stop()``, by a
worker's stop request, or by Ctrl-C in ``serve_ps``."""

from __future__ import annotations

import ctypes
import threading
from typing import Optional

from ._native import check, lib
from .cluster import Cluster, Config
from .errors import error_for


class PS:
    """ps task ``task_index`` of ``cluster`` (this process's task if None),
    serving on a thread from construction until it is stopped."""

    def __init__(self, cluster: Optional[Cluster] = None, task_index: Optional[int] = None,
                 **options: object):
        self.cluster = cluster if cluster is not None else Cluster.from_env()
        if task_index is not None and self.cluster.job != "ps":
            raise ValueError("the cluster spec names job %r: build it for job 'ps'"
                             % self.cluster.job)
        if task_index is not None and task_index != self.cluster.task_index:
            raise ValueError("task_index %d, but the cluster spec is of ps %d"
                             % (task_index, self.cluster.task_index))
        self._config = Config(from_launcher=True, **options)
        self._handle = ctypes.c_void_p()
        check(lib.qr_ps_create(ctypes.byref(self._handle), self.cluster.handle,
                               self._config.handle))
        self._status: Optional[int] = None
        self._message = ""
        self._thread = threading.Thread(target=self._run, name="quorum-ps", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        status = lib.qr_ps_run(self._handle)
        if status:
            self._message = lib.qr_last_error().decode(errors="replace")
        self._status = status

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Ask the ps to stop (safe from any thread); ``join`` waits for it."""
        if self._handle:
            lib.qr_ps_stop(self._handle)

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait until the ps has stopped; raise if it ended with an error."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("the ps is still running after %s s" % timeout)
        if self._status:
            raise error_for(self._status, lib.qr_status_name(self._status).decode(),
                            self._message)

    def close(self) -> None:
        if self._handle:
            self.stop()
            self._thread.join()
            lib.qr_ps_free(self._handle)
            self._handle = ctypes.c_void_p()

    def __enter__(self) -> "PS":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_ps(cluster: Optional[Cluster] = None, **options: object) -> None:
    """Run this process's ps task until the cluster stops (a worker's stop
    request, or Ctrl-C here); raise if the ps ended with an error."""
    ps = PS(cluster, None, **options)
    try:
        while ps.running:
            ps._thread.join(0.2)  # wake up for KeyboardInterrupt
    except KeyboardInterrupt:
        ps.stop()
        ps._thread.join()
        raise
    finally:
        if not ps.running:
            try:
                ps.join()
            finally:
                ps.close()

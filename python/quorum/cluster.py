"""The cluster spec: which ps and worker tasks there are, and which one this
process is. From TF_CONFIG (the convention of TensorFlow and Kubeflow's
TFJob, and what `quorum launch` sets for each task), from TensorFlow-style
flags, or from lists given here."""

from __future__ import annotations

import ctypes
import json
import os
from typing import Dict, List, Optional, Sequence

from ._native import STATUS, check, lib
from .errors import error_for


class Cluster:
    """A parsed, validated cluster spec (the C library's qr_cluster)."""

    def __init__(self, ps: Sequence[str], workers: Sequence[str], job: str = "worker",
                 task_index: int = 0):
        if not ps or not workers:
            raise ValueError("a cluster needs at least one ps and one worker address")
        if job not in ("ps", "worker"):
            raise ValueError("job must be 'ps' or 'worker', not %r" % (job,))
        for a in list(ps) + list(workers):
            if not isinstance(a, str) or "," in a or not a:
                raise ValueError("bad task address %r" % (a,))
        self._handle = ctypes.c_void_p()
        check(lib.qr_cluster_from_flags(ctypes.byref(self._handle), ",".join(ps).encode(),
                                        ",".join(workers).encode(), job.encode(),
                                        int(task_index)))

    @classmethod
    def from_tf_config(cls, tf_config: Optional[str] = None) -> "Cluster":
        """From a TF_CONFIG document (the environment variable if None):
        {"cluster": {"ps": [...], "worker": [...]}, "task": {"type": "worker",
        "index": 0}}."""
        text = os.environ.get("TF_CONFIG") if tf_config is None else tf_config
        if not text:
            raise error_for(STATUS["QR_ENOTFOUND"], "QR_ENOTFOUND", "TF_CONFIG is not set")
        self = cls.__new__(cls)
        self._handle = ctypes.c_void_p()
        check(lib.qr_cluster_from_json(ctypes.byref(self._handle), text.encode()))
        return self

    @classmethod
    def from_env(cls) -> "Cluster":
        """This process's cluster as its launcher describes it: TF_CONFIG
        (set by `quorum launch`, Kubeflow's TFJob, or by hand)."""
        return cls.from_tf_config(None)

    @property
    def handle(self) -> ctypes.c_void_p:
        return self._handle

    @property
    def num_ps(self) -> int:
        return int(lib.qr_cluster_num_ps(self._handle))

    @property
    def num_workers(self) -> int:
        return int(lib.qr_cluster_num_workers(self._handle))

    @property
    def job(self) -> str:
        return str(lib.qr_cluster_job(self._handle).decode())

    @property
    def task_index(self) -> int:
        return int(lib.qr_cluster_task_index(self._handle))

    def addresses(self, job: str) -> List[str]:
        n = self.num_ps if job == "ps" else self.num_workers
        return [lib.qr_cluster_address(self._handle, job.encode(), i).decode() for i in range(n)]

    def to_tf_config(self) -> str:
        return json.dumps({"cluster": {"ps": self.addresses("ps"),
                                       "worker": self.addresses("worker")},
                           "task": {"type": self.job, "index": self.task_index}})

    def __repr__(self) -> str:
        return "Cluster(ps=%r, workers=%r, job=%r, task_index=%d)" % (
            self.addresses("ps"), self.addresses("worker"), self.job, self.task_index)

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle and lib is not None:
            lib.qr_cluster_free(handle)
            self._handle = ctypes.c_void_p()


def launcher_options() -> Dict[str, str]:
    """The options `quorum launch` gave this program (QUORUM_OPTIONS, a JSON
    object), or none."""
    text = os.environ.get("QUORUM_OPTIONS", "")
    if not text:
        return {}
    try:
        options = json.loads(text)
    except ValueError as e:
        raise ValueError("QUORUM_OPTIONS is not a JSON object: %s" % e) from None
    if not isinstance(options, dict):
        raise ValueError("QUORUM_OPTIONS is not a JSON object")
    return {str(k): str(v) for k, v in options.items()}


class Config:
    """Options (the names of the command line without "--": lr, optimizer,
    mode, timeout-ms, ...; '_' and '-' alike), each validated as it is set.
    With from_launcher, the options of `quorum launch` (QUORUM_OPTIONS) come
    first and those given here override them."""

    def __init__(self, from_launcher: bool = False, **options: object):
        self._handle = ctypes.c_void_p()
        check(lib.qr_config_new(ctypes.byref(self._handle)))
        if from_launcher:
            for name, text in launcher_options().items():
                self.set(name, text)
        for key, value in options.items():
            self.set(key, value)

    def set(self, key: str, value: object) -> None:
        if isinstance(value, bool):
            value = "true" if value else "false"
        check(lib.qr_config_set(self._handle, key.replace("_", "-").encode(),
                                str(value).encode()))

    def get(self, key: str) -> Optional[str]:
        v = lib.qr_config_get(self._handle, key.replace("_", "-").encode())
        return None if v is None else str(v.decode())

    @property
    def handle(self) -> ctypes.c_void_p:
        return self._handle

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle and lib is not None:
            lib.qr_config_free(handle)
            self._handle = ctypes.c_void_p()

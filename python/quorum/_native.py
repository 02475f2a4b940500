"""The C library, loaded with ctypes: where it is found, the signature of
every function the package calls, the check that turns a failing status
into an exception with the library's message, and the route of its log
lines into Python's ``logging`` (logger "quorum").

Why ctypes: the C API was made to be bound this way (opaque handles, plain
C types, a status from every call, the message kept per thread), ctypes
releases the GIL for the whole of every foreign call (a worker waiting for
a token leaves a data-loading thread running), and it needs no compiler at
install time beyond the one that builds the library. Arrays cross as raw
pointers: no copy (see _arrays.py for the checks made first)."""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
from typing import Any, Dict, List, Optional, Tuple

from .errors import BY_NAME, error_for

c_int, c_int64, c_uint64, c_float = ctypes.c_int, ctypes.c_int64, ctypes.c_uint64, ctypes.c_float
c_uint, c_size_t, c_char_p, c_void_p = ctypes.c_uint, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p
P = ctypes.POINTER

_SIGNATURES: Dict[str, Tuple[Any, List[Any]]] = {
    "qr_last_error": (c_char_p, []),
    "qr_status_name": (c_char_p, [c_int]),
    "qr_strerror": (c_char_p, [c_int]),
    "qr_version": (c_char_p, []),
    "qr_set_log_callback": (c_int, [c_void_p, c_void_p]),
    "qr_set_log_level": (c_int, [c_int]),
    "qr_config_new": (c_int, [P(c_void_p)]),
    "qr_config_free": (None, [c_void_p]),
    "qr_config_set": (c_int, [c_void_p, c_char_p, c_char_p]),
    "qr_config_get": (c_char_p, [c_void_p, c_char_p]),
    "qr_cluster_from_flags": (c_int, [P(c_void_p), c_char_p, c_char_p, c_char_p, c_int]),
    "qr_cluster_from_json": (c_int, [P(c_void_p), c_char_p]),
    "qr_cluster_free": (None, [c_void_p]),
    "qr_cluster_num_ps": (c_int, [c_void_p]),
    "qr_cluster_num_workers": (c_int, [c_void_p]),
    "qr_cluster_address": (c_char_p, [c_void_p, c_char_p, c_int]),
    "qr_cluster_job": (c_char_p, [c_void_p]),
    "qr_cluster_task_index": (c_int, [c_void_p]),
    "qr_ps_create": (c_int, [P(c_void_p), c_void_p, c_void_p]),
    "qr_ps_run": (c_int, [c_void_p]),
    "qr_ps_stop": (c_int, [c_void_p]),
    "qr_ps_free": (None, [c_void_p]),
    "qr_worker_create": (c_int, [P(c_void_p), c_void_p, c_int, c_void_p]),
    "qr_worker_free": (None, [c_void_p]),
    "qr_worker_declare_opts": (c_int, [c_void_p, c_char_p, c_int, P(c_int64), c_char_p, c_uint64,
                                       c_char_p, P(c_int)]),
    "qr_worker_declare_values": (c_int, [c_void_p, c_char_p, c_int, P(c_int64), c_void_p, c_int64,
                                         c_char_p, P(c_int)]),
    "qr_worker_declare_table": (c_int, [c_void_p, c_char_p, c_int64, c_char_p, c_uint64, c_char_p,
                                        P(c_int)]),
    "qr_worker_initialize": (c_int, [c_void_p]),
    "qr_worker_var_size": (c_int64, [c_void_p, c_int]),
    "qr_worker_var_data": (c_void_p, [c_void_p, c_int]),
    "qr_worker_var_placement": (c_int, [c_void_p, c_int, c_int, P(c_int), P(c_int64), P(c_int64)]),
    "qr_worker_pull": (c_int, [c_void_p, c_int, P(c_int), P(c_void_p)]),
    "qr_worker_pull_averages": (c_int, [c_void_p, c_int, P(c_int), P(c_void_p)]),
    "qr_worker_slot_names": (c_int, [c_void_p, c_int, c_char_p, c_size_t]),
    "qr_worker_pull_slot": (c_int, [c_void_p, c_int, c_char_p, c_void_p, c_int64]),
    "qr_worker_set_slot": (c_int, [c_void_p, c_int, c_char_p, c_void_p, c_int64]),
    "qr_worker_set_step": (c_int, [c_void_p, c_int64]),
    "qr_worker_push": (c_int, [c_void_p, c_int, P(c_int), P(c_void_p), c_uint, P(c_int64)]),
    "qr_worker_checkpoint": (c_int, [c_void_p, P(c_int64)]),
    "qr_worker_push_pull": (c_int, [c_void_p, c_int, P(c_int), P(c_void_p), P(c_void_p), c_uint,
                                    P(c_int64)]),
    "qr_worker_push_start": (c_int, [c_void_p, c_int, P(c_int), P(c_void_p), c_uint,
                                     P(c_void_p)]),
    "qr_worker_push_pull_start": (c_int, [c_void_p, c_int, P(c_int), P(c_void_p), P(c_void_p),
                                          c_uint, P(c_void_p)]),
    "qr_worker_pull_start": (c_int, [c_void_p, c_int, P(c_int), P(c_void_p), P(c_void_p)]),
    "qr_request_wait": (c_int, [c_void_p, P(c_int64)]),
    "qr_worker_take_token": (c_int, [c_void_p, P(c_int64)]),
    "qr_worker_local_step": (c_int, [c_void_p, P(c_int64)]),
    "qr_worker_global_step": (c_int, [c_void_p, P(c_int64)]),
    "qr_worker_set_step_limit": (c_int, [c_void_p, c_int64]),
    "qr_worker_set_data_position": (c_int, [c_void_p, c_uint64]),
    "qr_worker_set_lr": (c_int, [c_void_p, c_int, c_float]),
    "qr_worker_set_dtype": (c_int, [c_void_p, c_int, c_int, c_int]),
    "qr_worker_data_position": (c_int, [c_void_p, P(c_uint64)]),
    "qr_worker_stats": (c_int, [c_void_p, c_char_p, c_size_t]),
    "qr_worker_wait_bound": (c_int, [c_void_p]),
    "qr_worker_pull_rows": (c_int, [c_void_p, c_int, c_int64, c_void_p, c_void_p, c_uint]),
    "qr_worker_add_rows": (c_int, [c_void_p, c_int, c_int64, c_void_p, c_void_p]),
    "qr_worker_push_sparse": (c_int, [c_void_p, c_int, c_int64, c_void_p, c_void_p, c_uint,
                                      P(c_int64)]),
    "qr_worker_stop_cluster": (c_int, [c_void_p]),
    "qr_worker_leave": (c_int, [c_void_p]),
    "qr_monitor_create": (c_int, [P(c_void_p), c_void_p]),
    "qr_monitor_open_summaries": (c_int, [c_void_p, c_char_p, ctypes.c_double]),
    "qr_monitor_serve_metrics": (c_int, [c_void_p, c_char_p, c_int]),
    "qr_monitor_step": (c_int, [c_void_p, c_int64, c_int64, ctypes.c_double, ctypes.c_double]),
    "qr_monitor_scalar": (c_int, [c_void_p, c_char_p, ctypes.c_double]),
    "qr_monitor_progress": (c_int, [c_void_p, P(c_int64), P(ctypes.c_double),
                                    P(ctypes.c_double)]),
    "qr_monitor_flush": (c_int, [c_void_p]),
    "qr_monitor_free": (None, [c_void_p]),
}

PUSH_STEP = 1
PUSH_DELTA = 4
PUSH_EVERY_PS = 16
ROWS_READ_ONLY = 1


def _candidates() -> List[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    found = [os.environ.get("QUORUM_LIBRARY", "")]
    found += [os.path.join(here, name) for name in ("libquorum.so", "libquorum.so.0")]
    return [p for p in found if p]


def _load() -> ctypes.CDLL:
    # OPENBLAS_CORETYPE is left as it is here, unlike the quorum command
    # (tools/quorum.c, the README's "BLAS kernels"): nothing the package
    # calls runs the library's sgemm (torch computes), and the variable,
    # read by every OpenBLAS when it loads, would steer numpy's too.
    tried = []
    for path in _candidates():
        if os.path.exists(path):
            lib = ctypes.CDLL(path)
            break
        tried.append(path)
    else:
        raise ImportError("quorum: the C library was not found (looked at %s); install the "
                          "package with `pip install .` from a clone, or set QUORUM_LIBRARY to "
                          "a libquorum.so" % ", ".join(tried))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


lib = _load()


def _status_codes() -> Dict[str, int]:
    """The library's status codes by name ({"QR_OK": 0, "QR_EINVAL": -1,
    ...}), asked of the library itself: its codes run 0, -1, -2, ... to the
    first one it has no name for (qr_status_name: "QR_UNKNOWN")."""
    codes: Dict[str, int] = {}
    while True:
        name = lib.qr_status_name(-len(codes)).decode()
        if name == "QR_UNKNOWN":
            break
        codes[name] = -len(codes)
    missing = sorted(set(BY_NAME) - set(codes))
    if missing:
        raise ImportError("quorum: the C library has no status %s (errors.py names it): a "
                          "libquorum.so of another version?" % ", ".join(missing))
    return codes


# Status codes by name, for the few places that test for one
# (STATUS["QR_ETOOBIG"]); exceptions are chosen by name (errors.py).
STATUS = _status_codes()

# The common dense push and pull in C (_fastcall.c), bound to this library;
# None if the package was built without Python's headers (ctypes alone).
fastcall: Any
try:
    from . import _fastcall as fastcall
except ImportError:
    fastcall = None
else:
    import numpy

    fastcall.bind(*[ctypes.cast(getattr(lib, name), c_void_p).value for name in (
        "qr_worker_pull", "qr_worker_pull_averages", "qr_worker_push", "qr_worker_push_pull")],
        numpy.ndarray)


def bind_torch() -> None:
    """Lets the C path take torch tensors, once torch is imported."""
    import sys

    torch = sys.modules.get("torch")
    if fastcall is not None and torch is not None:
        fastcall.bind_torch((torch.Tensor, torch.nn.Parameter), torch.float32)


def check(status: int) -> None:
    """Raise the exception for a failing status, with the calling thread's
    last error message (the library keeps one per thread, and ctypes makes
    the call and this one on the same thread)."""
    if status != 0:
        name = lib.qr_status_name(status).decode()
        raise error_for(status, name, lib.qr_last_error().decode(errors="replace"))


def version() -> str:
    """The C library's version."""
    return str(lib.qr_version().decode())


# ---- log lines into Python's logging ---------------------------------------

_logger = logging.getLogger("quorum")
_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}
_LogFn = ctypes.CFUNCTYPE(None, c_int, c_char_p, c_char_p, c_void_p)


def _on_log(level: int, task: bytes, message: bytes, ctx: Optional[int]) -> None:
    # Called from any thread the library runs (ctypes takes the GIL).
    try:
        _logger.log(_LEVELS.get(level, logging.INFO), "[%s] %s", task.decode(errors="replace"),
                    message.decode(errors="replace"))
    except Exception:  # a log line must never raise into C
        pass


_log_callback: Any = _LogFn(_on_log)  # kept alive: C holds its address
check(lib.qr_set_log_callback(ctypes.cast(_log_callback, c_void_p), None))


@atexit.register
def _stop_logging() -> None:
    # The interpreter is going away: later lines go to stderr, not into it.
    lib.qr_set_log_callback(None, None)

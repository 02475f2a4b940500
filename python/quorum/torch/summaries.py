"""Summaries, metrics and a progress line for a PyTorch job: what quorum's
own trainer writes and serves, fed by the optimizer's steps (the C
library's qr_monitor_*, include/quorum.h).

Under ``quorum launch`` the launcher says what to do in the environment
(docs/PYTHON.md): the chief (worker 0) writes TensorBoard events and
summaries.jsonl into QUORUM_LOGDIR (--logdir) every QUORUM_SUMMARY_SECS
seconds (--summary-secs, default 120) and once at ``close()``, and shows a
progress line on stderr at most every PROGRESS_SECS seconds unless
QUORUM_QUIET=1 (--quiet); every worker serves its Prometheus metrics on
QUORUM_METRICS_PORT (--metrics-port-base). Without any of them nothing is
made and a step costs nothing more.

The scalars: loss, a moving average (0.95) of the losses given to
``opt.step(loss=...)`` (or returned by its closure) or to
``log_scalar("loss", v)``; global_step/sec; examples/sec of the whole
cluster, from this worker's batches: those given as ``opt.step(examples=n)``,
else counted as the model's forward passes see them (the first dimension
of the first tensor argument of a forward in training mode with
gradients on: pass examples= where that is not the batch); learning_rate,
the first parameter group's lr at the step; stale_gradients, from the ps
tasks; and the script's own scalars (``log_scalar``), their latest value at
each point."""

from __future__ import annotations

import ctypes
import math
import numbers
import os
import sys
import time
import weakref
from typing import Any, Dict, Optional

import torch

from .._native import check, lib

__all__ = ["log_scalar", "Monitor"]

PROGRESS_SECS = 5.0  # between two progress lines, as quorum's trainer off a terminal

# The monitor log_scalar feeds (the latest optimizer's), and scalars logged
# while there is none, which the next one takes.
_current: Optional["weakref.ReferenceType[Monitor]"] = None
_pending: Dict[str, float] = {}


def _number(what: str, value: Any) -> float:
    """A Python number or a one-element tensor as a float, or TypeError naming it."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError("%s: a number or a one-element tensor, not a tensor of shape %s"
                            % (what, tuple(value.shape)))
        return float(value.detach().float().item())
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise TypeError("%s: a number or a one-element tensor, not %s" % (what, type(value).__name__))


def check_step_args(loss: Any, examples: Any) -> None:
    """opt.step's loss= and examples=, checked when nothing records them."""
    if loss is not None:
        _number("step(loss=...)", loss)
    if examples is not None and (not isinstance(examples, numbers.Integral)
                                 or isinstance(examples, bool) or examples < 0):
        raise ValueError("step(examples=...): the examples of this step, an integer >= 0, "
                         "not %r" % (examples,))


def log_scalar(name: str, value: Any) -> None:
    """A scalar of the script's own, written with the chief's next summary
    point (its latest value) beside quorum's; "loss" is a loss, averaged
    as opt.step(loss=...)'s. A no-op where nothing records (no
    QUORUM_LOGDIR, or not the chief), so a script calls it unconditionally."""
    if not isinstance(name, str) or not name:
        raise TypeError("log_scalar: the name is a non-empty string, not %r" % (name,))
    v = _number("log_scalar(%r)" % name, value)
    if not math.isfinite(v):
        raise ValueError("log_scalar(%r): %r is not a finite number" % (name, v))
    monitor = _current() if _current is not None else None
    if monitor is None or not monitor.open:
        _pending[name] = v
        return
    monitor.scalar(name, v)


def _env_number(name: str, cast: Any, low: float, high: float) -> Any:
    text = os.environ.get(name, "")
    try:
        v = cast(text)
    except ValueError:
        v = None
    if v is None or not (low <= v <= high):
        raise ValueError("%s=%r: expected a number from %g to %g" % (name, text, low, high))
    return v


class Monitor:
    """The qr_monitor of one optimizer's worker (made by ``for_optimizer``)."""

    def __init__(self, worker: Any, module: Optional[torch.nn.Module], logdir: Optional[str],
                 every_secs: float, port: int, progress: bool):
        self._worker = worker  # kept alive: the monitor borrows its handle
        self._handle = ctypes.c_void_p()
        check(lib.qr_monitor_create(ctypes.byref(self._handle), worker._handle))
        self.open = True
        self.chief = worker.cluster.task_index == 0
        self._hook: Any = None
        try:
            if logdir:
                check(lib.qr_monitor_open_summaries(self._handle, logdir.encode(), every_secs))
            if port:
                bind = worker._config.get("metrics-bind") or "127.0.0.1"
                check(lib.qr_monitor_serve_metrics(self._handle, bind.encode(), port))
        except BaseException:
            self.close(flush=False)
            raise
        self._progress = progress
        self._last_line = time.monotonic()
        self._seen = 0       # examples counted by the forward hook since the last step
        self._examples = 0   # since the last push (accumulate, local_steps)
        if module is not None:
            self._hook = module.register_forward_pre_hook(self._count)
        global _current
        _current = weakref.ref(self)
        for name, v in list(_pending.items()):
            self.scalar(name, v)
        _pending.clear()

    @classmethod
    def for_optimizer(cls, opt: Any) -> Optional["Monitor"]:
        """What the launcher's environment asks of this worker, or None."""
        worker = opt.worker
        chief = worker.cluster.task_index == 0
        logdir = os.environ.get("QUORUM_LOGDIR") if chief else None
        every = _env_number("QUORUM_SUMMARY_SECS", float, 0.05, 86400) \
            if logdir and os.environ.get("QUORUM_SUMMARY_SECS") else 120.0
        port = _env_number("QUORUM_METRICS_PORT", int, 1, 65535) \
            if os.environ.get("QUORUM_METRICS_PORT") else 0
        # A progress line in a cluster's chief (alone, a script prints its own).
        progress = chief and bool(os.environ.get("TF_CONFIG")) and \
            os.environ.get("QUORUM_QUIET", "") not in ("1", "true", "yes")
        if not (logdir or port or progress):
            return None
        return cls(worker, opt.module, logdir, every, port, progress)

    def _count(self, module: torch.nn.Module, args: Any) -> None:
        if module.training and torch.is_grad_enabled() and args and \
                isinstance(args[0], torch.Tensor) and args[0].dim() > 0:
            self._seen += int(args[0].shape[0])

    def scalar(self, name: str, value: float) -> None:
        check(lib.qr_monitor_scalar(self._handle, name.encode(), value))

    def step(self, opt: Any, loss: Any, examples: Optional[int]) -> None:
        """After opt.step(): the step's loss and examples; reported as a
        step of this worker once it pushed (every accumulate or local_steps
        calls), with the learning rate it was applied with."""
        check_step_args(loss, examples)
        self._examples += self._seen if examples is None else int(examples)
        self._seen = 0
        value = math.nan if loss is None else _number("step(loss=...)", loss)
        if opt.calls % (opt.accumulate * opt.local_steps):
            if loss is not None and math.isfinite(value):
                self.scalar("loss", value)
            return
        if not self._worker._handle:
            return
        check(lib.qr_monitor_step(self._handle, int(opt.global_step), self._examples, value,
                                  float(opt.param_groups[0]["lr"])))
        self._examples = 0
        if self._progress and time.monotonic() - self._last_line >= PROGRESS_SECS:
            self._show()

    def _show(self) -> None:
        step, loss, rate = ctypes.c_int64(), ctypes.c_double(), ctypes.c_double()
        check(lib.qr_monitor_progress(self._handle, ctypes.byref(step), ctypes.byref(loss),
                                      ctypes.byref(rate)))
        line = "step %d" % step.value
        if not math.isnan(loss.value):
            line += "  loss %.4f" % loss.value
        if rate.value > 0:
            line += "  %.0f examples/s" % rate.value
        print(line, file=sys.stderr, flush=True)
        self._last_line = time.monotonic()

    def close(self, flush: bool = True) -> None:
        """The run's last point (the chief's, while the ps tasks answer) and
        a last progress line; then the page and the files are closed."""
        if not self.open:
            return
        self.open = False
        if self._hook is not None:
            self._hook.remove()
        try:
            if flush and self._worker._handle:
                check(lib.qr_monitor_flush(self._handle))
                if self._progress:
                    self._show()
        finally:
            lib.qr_monitor_free(self._handle)
            self._handle = ctypes.c_void_p()

"""A module's buffers (BatchNorm's ``running_mean``, ``running_var``,
``num_batches_tracked``) on the ps tier, beside its parameters: each is a
non-trainable variable there (option ``trainable=false``: a push carries
its value, which the ps assigns, never touched by an optimizer), so it is
in the cluster's checkpoints and a worker that joins late gets the current
one. The optimizer (optimizer.py) exchanges them with each push:

- ``"chief"`` (the default, as DDP's ``broadcast_buffers``): the chief's
  are the cluster's; it pushes them with its gradients, every other worker
  receives them with its parameters at each step.
- ``"average"``: every worker's count. Sync: the mean over the step's
  workers (each pushes its buffers with its gradients; the ps assigns their
  mean). Async: each push adds the worker's change since its last pull (a
  delta push), as if one module had seen every worker's batches in turn.
- ``"local"``: not shared (each worker keeps its own), nor checkpointed.

float32 CPU buffers travel as they are; integer, bool, float16 and
bfloat16 ones, those on a GPU (and every one when the optimizer stages
its parameters, staging.py) through a float32 host copy (pinned for a
GPU's), exact below 2**24 (a count past that is refused by name);
float64 ones are refused (float32 would round them)."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from ..worker import Request, Worker
from .staging import host_like

__all__ = ["Buffers", "BUFFER_MODES", "wait_all"]

BUFFER_MODES = ("chief", "average", "local")
_EXACT = 2 ** 24  # every integer below it is a float32


class _Buffer:
    """One buffer: where it lives in the module (it may be replaced there,
    so it is looked up at each use), its variable, and its float32 copy
    when it does not travel as it is (None then)."""

    __slots__ = ("name", "owner", "attr", "var", "stage", "base")

    def __init__(self, name: str, owner: torch.nn.Module, attr: str, var: int,
                 stage: Optional[torch.Tensor]):
        self.name, self.owner, self.attr, self.var, self.stage = name, owner, attr, var, stage
        self.base: Optional[torch.Tensor] = None  # as last pulled (average, async)

    def tensor(self) -> torch.Tensor:
        t = self.owner._buffers.get(self.attr)
        if t is None:
            raise RuntimeError("buffer %r was removed from the module after the optimizer was "
                               "made" % self.name)
        return t

    def values(self) -> torch.Tensor:
        """Its value as the float32 array that travels."""
        t = self.tensor()
        if self.stage is None:
            return t
        if not (t.is_floating_point() or t.dtype == torch.bool) and t.numel() and \
                int(t.abs().max()) >= _EXACT:
            raise OverflowError("buffer %r holds %d, past 2**24: float32 on the ps would round "
                                "it (use buffers='local')" % (self.name, int(t.abs().max())))
        self.stage.copy_(t.detach().reshape(self.stage.shape))
        return self.stage

    def target(self) -> torch.Tensor:
        """Where a pull lands: the buffer itself, or its float32 copy."""
        return self.tensor() if self.stage is None else self.stage

    def land(self) -> None:
        """After a pull: a staged value into the buffer."""
        if self.stage is not None:
            t = self.tensor()
            with torch.no_grad():
                t.copy_(self.stage.reshape(t.shape))


def _travels_as_is(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() and t.dim() > 0


class Buffers:
    """The buffers of module on the ps tasks, shared as mode says (see the
    module's docstring); made by the optimizer before the worker is
    initialized."""

    def __init__(self, module: Optional[torch.nn.Module], worker: Worker, mode: str,
                 staged: bool = False):
        if mode not in BUFFER_MODES:
            raise ValueError("buffers=%r: one of %s" % (mode, ", ".join(repr(m) for m in
                                                                           BUFFER_MODES)))
        self.mode = mode
        self.worker = worker
        self.entries: List[_Buffer] = []
        if mode == "local" or module is None:
            return
        self.chief = worker.cluster.task_index == 0
        self.sync = (worker._config.get("mode") or "async") == "sync"
        owners = dict(module.named_modules())
        for name, t in module.named_buffers():
            if t is None or t.numel() == 0:
                continue
            if t.dtype == torch.float64:
                raise TypeError("buffer %r is float64: the ps keeps float32, which would round "
                                "it; make it float32, or keep buffers local (buffers='local')"
                                % name)
            if t.is_complex():
                raise TypeError("buffer %r is %s: the ps keeps float32 (buffers='local' keeps "
                                "it on each worker)" % (name, t.dtype))
            path, _, attr = name.rpartition(".")
            stage = None if _travels_as_is(t) and not staged else \
                host_like(t.reshape(tuple(t.shape) or (1,)), torch.float32)
            entry = _Buffer(name, owners[path], attr, -1, stage)
            entry.var = worker.declare_values(name, entry.values().detach(),
                                              options="trainable=false")
            self.entries.append(entry)

    def __bool__(self) -> bool:
        return bool(self.entries)

    @property
    def pushes(self) -> bool:
        """Does this worker push its buffers?"""
        return bool(self.entries) and (self.mode == "average" or self.chief)

    def values(self) -> Dict[int, torch.Tensor]:
        """Sync: the buffers to push with this step's gradients (none from
        a worker other than the chief in "chief" mode)."""
        return {b.var: b.values() for b in self.entries} if self.pushes else {}

    def targets(self) -> Dict[int, torch.Tensor]:
        """Where a pull of the buffers lands (after a sync step, or at start)."""
        return {b.var: b.target() for b in self.entries}

    def pulled(self) -> None:
        """After a pull of targets(): staged values into the buffers, and
        the pulled values kept as the base of the next delta (average,
        async)."""
        for b in self.entries:
            b.land()
            if self.mode == "average" and not self.sync:
                b.base = b.target().detach().clone()

    def start_async(self) -> Tuple[List[Request], bool]:
        """Async, before a step's push: this worker's part of the exchange
        started (its buffers pushed, or the chief's asked for), so it
        travels beside the gradients; the requests to wait for, and
        whether a pull is among them (then call pulled() after)."""
        if not self.entries:
            return [], False
        out: List[Request] = []
        if self.mode == "average":
            deltas = {}
            for b in self.entries:
                now = b.values()
                base = b.base if b.base is not None else now
                deltas[b.var] = (now - base).contiguous()
            out.append(self.worker.push_start(deltas, step=False, delta=True))
        elif self.chief:
            # Its own values, assigned at once: nothing to pull back.
            out.append(self.worker.push_start({b.var: b.values() for b in self.entries},
                                              step=False))
            return out, False
        out.append(self.worker.pull_start(self.targets()))
        return out, True


def wait_all(requests: List[Request]) -> None:
    """Wait for every request, whatever fails; the first error raised."""
    error: Optional[BaseException] = None
    for r in requests:
        try:
            r.wait()
        except BaseException as e:  # noqa: B902 - re-raised below
            error = error or e
    if error is not None:
        raise error


"""Staging: parameters that the library cannot read in place (on a CUDA
device) travel through host buffers of their own, pinned where a GPU is
there, so the copies run asynchronously (docs/PYTHON.md, "GPU models").

- Gradients: a hook on each parameter (``register_post_accumulate_grad_hook``)
  copies its gradient to its host buffer as soon as autograd has produced
  it, non-blocking on a side stream that first waits for the stream that
  made the gradient, so the copies run under the rest of the backward
  pass; ``gradients()`` (at step()) copies any gradient no hook saw (set
  by hand, say) or that changed since (clipped, or unscaled by a
  ``GradScaler``, in place: its version counter moved), then waits for
  the side stream, and hands the host buffers to the push.
- Values: pulls land in host buffers; ``land()`` copies them back into the
  parameters, non-blocking on the current stream, so the next forward (on
  that stream) sees them, and records an event that the next pull into
  the same buffers waits for first.

``force=True`` (``Optimizer(staging=True)`` or QUORUM_TORCH_FORCE_STAGING=1)
stages CPU parameters too, through the same code without streams: the
tests check that this path trains bit for bit as the unstaged one. Without
staging (CPU parameters, by default) none of this runs: the library reads
and writes the parameters' own memory."""

from __future__ import annotations

import os
import weakref
from typing import Any, Dict, List, Optional, Set, Tuple

import torch

__all__ = ["Staging", "wants_staging"]


def wants_staging(params: List[Tuple[str, torch.Tensor, int]], staging: Optional[bool]) -> bool:
    """Whether these parameters are staged: asked for (staging=True, or the
    environment's QUORUM_TORCH_FORCE_STAGING=1), or needed (one is not on
    the CPU). staging=False with a parameter off the CPU is refused."""
    off_cpu = [name for name, p, _ in params if p.device.type != "cpu"]
    if staging is None:
        staging = os.environ.get("QUORUM_TORCH_FORCE_STAGING", "") not in ("", "0") or \
            bool(off_cpu)
    elif not staging and off_cpu:
        raise ValueError("staging=False, but parameter %r is on %s: quorum reads only host "
                         "memory, so such a parameter is staged through host buffers"
                         % (off_cpu[0], params[[n for n, _, _ in params].index(off_cpu[0])]
                            [1].device))
    return bool(staging)


def host_like(t: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A contiguous host tensor of t's shape (and dtype), pinned when t is
    on a CUDA device (asynchronous copies need pinned memory)."""
    return torch.empty(tuple(t.shape), dtype=dtype or t.dtype, device="cpu",
                       pin_memory=t.device.type == "cuda")


class _Staged:
    """One parameter's host buffers."""

    __slots__ = ("param", "var", "grad", "value", "cuda", "seen")

    def __init__(self, param: torch.Tensor, var: int):
        self.param, self.var = param, var
        self.cuda = param.device.type == "cuda"
        self.grad = host_like(param)   # the gradient, as the push reads it
        self.value = host_like(param)  # where pulls land
        # the gradient copied in this step, as (tensor id, version): one
        # changed since (clipped or unscaled in place, or replaced) is
        # copied again at step()
        self.seen: Optional[Tuple[int, int]] = None


class Staging:
    """The host buffers of the parameters (name, parameter, variable id),
    and the copies between them and the parameters (see the module's
    docstring). hooks=False copies every gradient at step() instead of as
    autograd produces it (for measuring what the overlap saves)."""

    def __init__(self, params: List[Tuple[str, torch.Tensor, int]], hooks: bool = True):
        self.entries = [_Staged(p, var) for _, p, var in params]
        self.by_var = {e.var: e for e in self.entries}
        cuda = [e.param.device for e in self.entries if e.cuda]
        self.device = cuda[0] if cuda else None
        for e in self.entries:
            if e.cuda and e.param.device != self.device:
                raise ValueError("parameters on %s and %s: quorum.torch stages one device's "
                                 "parameters" % (self.device, e.param.device))
        # The side stream of the gradients' copies, and the event of the
        # last copies into the parameters.
        self.stream: Optional[torch.cuda.Stream] = None
        if self.device is not None:
            self.stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        self.landed: Optional[torch.cuda.Event] = None
        self.handles: List[Any] = []
        if hooks:
            ref = weakref.ref(self)
            for e in self.entries:
                self.handles.append(e.param.register_post_accumulate_grad_hook(
                    _hook(ref, e)))  # type: ignore[no-untyped-call]

    def remove_hooks(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def copy_grad(self, e: _Staged) -> None:
        """e's gradient into its host buffer: on the side stream, after the
        work that produced it, for a CUDA one; at once for a CPU one."""
        g = e.param.grad
        if g is None:
            return
        e.seen = (id(g), g._version)
        if g.is_sparse:
            g = g.to_dense()
        if e.cuda:
            assert self.stream is not None
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                e.grad.copy_(g.detach(), non_blocking=True)
            # the gradient's memory is not reused before the copy is done
            g.record_stream(self.stream)
        else:
            e.grad.copy_(g.detach())

    def gradients(self) -> Dict[int, torch.Tensor]:
        """At step(): every gradient in its host buffer (those no hook saw
        copied now), the copies done; variable id -> host buffer for each
        parameter with a gradient."""
        out: Dict[int, torch.Tensor] = {}
        for e in self.entries:
            g = e.param.grad
            if g is None:
                e.seen = None
                continue
            if e.seen != (id(g), g._version):
                self.copy_grad(e)
            e.seen = None
            out[e.var] = e.grad
        if self.stream is not None:
            self.stream.synchronize()
        return out

    def targets(self, vars: Optional[Set[int]] = None) -> Dict[int, torch.Tensor]:
        """Where a pull of the parameters (all, or those of vars) lands: their
        host buffers, once the last copies out of them are done."""
        if self.landed is not None:
            self.landed.synchronize()
            self.landed = None
        return {e.var: e.value for e in self.entries if vars is None or e.var in vars}

    def land(self, vars: Optional[Set[int]] = None) -> None:
        """After a pull of targets(vars): the values into the parameters."""
        with torch.no_grad():
            for e in self.entries:
                if vars is None or e.var in vars:
                    e.param.copy_(e.value, non_blocking=e.cuda)
        if self.device is not None:
            self.landed = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self.landed.record(torch.cuda.current_stream(self.device))

    def wait(self) -> None:
        """Every copy done (before the parameters are read from the host)."""
        if self.stream is not None:
            self.stream.synchronize()
        if self.landed is not None:
            self.landed.synchronize()
            self.landed = None


def _hook(ref: "weakref.ReferenceType[Staging]", e: _Staged) -> Any:
    def hook(p: torch.Tensor) -> None:
        staging = ref()
        if staging is not None:
            staging.copy_grad(e)
    return hook

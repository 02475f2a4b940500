"""Communication overlapped with compute (Optimizer(overlap=...)): the
hook that pushes each parameter's gradient as backward produces it
(async), the hooks that land a sync step's pulled values before the
module is next used, and the rule that says when overlap pays
(spare_core, the one of quorum's own trainer: src/train/train_common.c).
docs/PYTHON.md, "Overlap", says what each form changes for a script."""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Any, Callable, Tuple

import torch

from ..cluster import Cluster
from ..errors import StoppedError

if TYPE_CHECKING:
    from .optimizer import Optimizer

__all__ = ["spare_core", "grad_ready_hook", "land_before_use"]


def _local_address(address: str) -> bool:
    """A task at this address runs on this machine: a Unix socket, or a
    loopback TCP address."""
    if address.startswith("unix:"):
        return True
    host = address.rsplit(":", 1)[0].strip("[]").lower()
    return host in ("localhost", "localhost.", "::1") or host.startswith("127.")


def spare_core(cluster: Cluster, local_ps: bool = False) -> Tuple[bool, int, int]:
    """The overlap's default (overlap=None), the rule of quorum's own
    trainer (--overlap auto, src/train/train_common.c): on when the cores
    this process may run on outnumber what the cluster's tasks on this
    machine use, each local worker torch's thread count (this worker's),
    each local ps one. A task is local when its address is a Unix socket or
    a loopback one; this worker always is, and so is a ps run in this
    process (local_ps). Returns (on, cores, needed)."""
    workers = cluster.addresses("worker")
    me = cluster.task_index if cluster.job == "worker" else -1
    nworkers = sum(1 for i, a in enumerate(workers) if _local_address(a) or i == me)
    nps = sum(1 for a in cluster.addresses("ps") if _local_address(a))
    if local_ps:
        nps = max(nps, 1)
    needed = max(nworkers, 1) * max(torch.get_num_threads(), 1) + nps
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    return cores > needed, cores, needed


def _stopped_quietly(opt: "Optimizer", e: StoppedError) -> None:
    """A hook that finds the job over records it for the next step();
    any other stop (an abort, a rollback) is raised."""
    if e.status_name != "QR_ESTOPPED":
        raise e
    opt.stopped, opt.stop_reason = True, str(e)


def grad_ready_hook(opt: "Optimizer", var_id: int) -> Callable[[torch.Tensor], None]:
    """Async overlap: the hook that pushes one parameter's gradient as
    backprop has it, its new value coming back into the parameter in the
    same request. It holds the optimizer weakly (the optimizer may go
    away first)."""
    ref = weakref.ref(opt)

    def hook(p: torch.Tensor) -> None:
        o = ref()
        if o is None or not o.overlap or o.stopped or p.grad is None:  # off for now
            return
        o._send_lrs()  # a scheduler's lr of this step, before its first push
        if var_id in o._pushed:
            # refused, not pushed again: the step keeps the first push
            o._pushed[var_id] = (id(p.grad), p.grad._version)
            raise RuntimeError("quorum.torch.Optimizer(overlap=True) pushes each gradient as "
                               "backward produces it: call step() after each backward (or "
                               "use accumulate=k, or overlap=False)")
        o._pushed[var_id] = (id(p.grad), p.grad._version)
        g = p.grad if not p.grad.is_sparse else p.grad.to_dense()
        try:
            o._inflight.append(o.worker.push_pull_start(
                {var_id: g.contiguous()}, into={var_id: p}, step=False))
        except StoppedError as e:
            _stopped_quietly(o, e)
    return hook


def land_before_use(opt: "Optimizer", module: torch.nn.Module) -> None:
    """Sync overlap: the values pulled after a step land before the
    module's next forward and its state_dict() (hooks that hold the
    optimizer weakly)."""
    ref = weakref.ref(opt)

    def land(*_: Any) -> None:
        o = ref()
        if o is None or not o._landing:
            return
        try:
            o.synchronize()
        except StoppedError as e:
            _stopped_quietly(o, e)
    module.register_forward_pre_hook(land)
    module.register_state_dict_pre_hook(land)  # type: ignore[no-untyped-call]

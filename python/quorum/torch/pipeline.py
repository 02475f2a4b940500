"""Async training with the communication of a step under the compute of the
next (Optimizer(overlap="pipeline")): the step's fused push-and-pull runs
on a thread of its own while the script computes the next batch on the
values it has, and the values it brings replace the parameters at the
next step() (docs/PYTHON.md, "Pipelined async steps").

Why a thread: the worker's library has no I/O thread of its own
(src/worker/inflight.c): a request started before the forward pass sends
what its sockets take at once (a few hundred KiB), and the rest of it and
its answer move only while some call of the worker waits, so little of a
step's exchange happens under the forward and backward passes. A blocking push_pull on a second thread
releases the GIL for its whole round trip, so the socket copies and the
ps's apply run on another core beside the compute.

What it changes: the gradient of step t is computed on the values that
step t-2's push brought back, one step older than without it (async
training is stale by design; this adds one step). Nothing touches the
worker's handle while the thread has it: step() and every other call of
the optimizer first wait for it (Optimizer.synchronize). The step's
gradients are handed to the thread (step() leaves ``p.grad`` None, so the
next backward makes new ones instead of writing into tensors still being
sent), and the values land in buffers of their own, swapped with the
parameters' storage at the next step() (no copy: ``p.data`` is the other
buffer from then on)."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import torch

if TYPE_CHECKING:
    from ..worker import Worker

__all__ = ["Pipeline", "pipeline_refusal"]


class Pipeline:
    """One step's push-and-pull in flight at a time, on one thread."""

    def __init__(self, params: List[Tuple[str, torch.Tensor, int]]):
        # Where the thread's pull lands: a buffer per parameter, the other
        # half of a double buffer whose first half is the parameter itself.
        self.back: Dict[int, torch.Tensor] = {i: torch.empty_like(p.detach())
                                              for _, p, i in params}
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="quorum-pipeline")
        self._inflight: Optional["Future[int]"] = None

    @property
    def busy(self) -> bool:
        return self._inflight is not None

    def start(self, worker: "Worker", grads: Dict[int, torch.Tensor]) -> None:
        """Push `grads` (owned by the pipeline from now on) and pull every
        parameter's new values into the back buffers, on the thread."""
        assert self._inflight is None, "a pipelined step is already in flight"
        self._inflight = self._thread.submit(worker.push_pull, grads, dict(self.back))

    def finish(self, params: List[Tuple[str, torch.Tensor, int]]) -> Optional[int]:
        """Wait for the step in flight, if any; its values become the
        parameters' (their storage swapped with the back buffers). The
        global step its push was counted at; None if none was in flight.
        An error of the push (a stop, an abort) is raised here, and the
        parameters keep the values they had."""
        if self._inflight is None:
            return None
        inflight, self._inflight = self._inflight, None
        step = inflight.result()
        with torch.no_grad():
            for _, p, i in params:
                landed = self.back[i]
                self.back[i] = p.data
                p.data = landed
        return int(step)

    def close(self) -> None:
        """Wait for the step in flight (its error, if any, is dropped: the
        caller is closing) and end the thread."""
        if self._inflight is not None:
            self._inflight.exception()
            self._inflight = None
        self._thread.shutdown(wait=True)


def pipeline_refusal(sync: bool, plain: bool, staged: bool, shared_buffers: bool,
                     embeddings: bool) -> Optional[str]:
    """Why overlap="pipeline" cannot run with these settings (None: it can)."""
    reasons: List[Tuple[bool, str]] = [
        (sync, "it is for async training (a sync step's values exist only after its "
               "quorum: overlap=True pulls them under the next batch's loading)"),
        (not plain, "it does not combine with accumulate or local_steps"),
        (staged, "parameters on a GPU (or staging=True) already copy their gradients "
                 "under the backward pass"),
        (shared_buffers, "the module's buffers (BatchNorm's statistics) are shared, and "
                         "the next forward writes them while the step would send them: "
                         "use buffers=\"local\""),
        (embeddings, "a qt.Embedding's rows go with the step's push"),
    ]
    for refused, why in reasons:
        if refused:
            return why
    return None

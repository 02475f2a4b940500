"""``Optimizer``: trains a ``torch.nn.Module`` on the ps tier.

It declares every parameter by its name in the module, with the module's
own initial values (the chief's), and the optimizer as the parameters' own
options (options.py), so the ps tasks apply it whatever they were started
with. ``step()`` pushes the gradients (and the rows of the model's
``Embedding`` tables), and in sync mode takes the step's token, then pulls
the new values into the parameters' own memory (no copy). Run alone (no
TF_CONFIG), it starts a ps in this process, so the same script runs
single-process; under ``quorum launch --ps P --workers W -- python
train.py`` every worker trains one cluster's model."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
import weakref
from typing import Any, Dict, List, Optional, Set, Tuple, Union

import torch

from ..cluster import Cluster, launcher_options
from ..errors import StaleError, StoppedError
from ..ps import PS
from ..worker import Request, Worker
from .embedding import Embedding
from .options import optimizer_options

__all__ = ["Optimizer"]

_log = logging.getLogger("quorum")

def _close_at_exit(ref: "weakref.ReferenceType[Optimizer]") -> None:
    opt = ref()
    if opt is not None:
        # An uncaught exception ended the script if sys.last_value is set
        # (CPython sets it as it prints the traceback, before atexit runs):
        # a worker that died so has not finished its work, so it does not
        # say LEAVE, and the ps tasks wait for it to come back.
        opt.close(finished=not hasattr(sys, "last_value"))


def _float_param(name: str, p: torch.Tensor) -> None:
    if p.dtype != torch.float32 or p.device.type != "cpu" or not p.is_contiguous():
        raise TypeError("parameter %r: quorum trains contiguous float32 CPU tensors, not %s on "
                        "%s%s" % (name, p.dtype, p.device,
                                  "" if p.is_contiguous() else " (non-contiguous)"))


class Optimizer:
    """Trains ``module`` on the ps tier (see the module's docstring).

    optimizer: a name ("SGD", "Adam", "Adagrad", "RMSprop", "AdamAsync",
    "FTRL") or a torch.optim class, with its settings (lr=, momentum=,
    betas=, eps=, ...). worker: a ``quorum.Worker`` to use; by default one is
    made from TF_CONFIG, or, without it, a one-ps cluster in this process.
    accumulate=k pushes the mean of k steps' gradients; local_steps=k
    (async) takes k local SGD steps with lr, then pushes their sum as a
    delta. overlap=True (async): each parameter's gradient is pushed, and
    its new value fetched in the same request, as soon as backpropagation
    has produced it, so communication runs under the rest of the backward
    pass; step() then waits for them and sends the step's tick (one
    backward per step: use accumulate=k to sum several). Off by default: it
    pays when communication is a large part of a step and the ps tasks do
    not share the worker's cores (bench/python/bench_torch.py). Other
    keyword options (mode="sync", replicas_to_aggregate=...) are the
    worker's (and the local ps's)."""

    def __init__(self, module: torch.nn.Module, optimizer: Union[str, type] = "SGD",
                 worker: Optional[Worker] = None, accumulate: int = 1, local_steps: int = 1,
                 overlap: bool = False, **settings: Any):
        hyper = {k: settings.pop(k) for k in list(settings)
                 if k in ("lr", "momentum", "nesterov", "betas", "eps", "alpha", "centered",
                          "initial_accumulator_value", "weight_decay", "dampening", "l1", "l2",
                          "lr_power", "beta1", "beta2", "epsilon", "decay",
                          "apply_sparse_rmsprop")}
        if accumulate < 1 or local_steps < 1:
            raise ValueError("accumulate and local_steps must be >= 1")
        self.module = module
        self.options = optimizer_options(optimizer, hyper)
        self.lr = float(hyper.get("lr", 0.01))
        self.accumulate, self.local_steps = accumulate, local_steps
        self._local_dir: Optional[str] = None
        self._local_ps: Optional[PS] = None
        if worker is None:
            worker = self._make_worker(settings)
        self.worker = worker
        self.sync = (worker._config.get("mode") or "async") == "sync"
        if local_steps > 1 and self.sync:
            raise ValueError("local_steps is for async training")
        plain = not self.sync and accumulate == 1 and local_steps == 1
        if overlap and not plain:
            raise ValueError("overlap is for async training without accumulate or local_steps")
        # May be turned off (and on again, if it was on) between steps.
        self.overlap = bool(overlap)
        self._inflight: List[Request] = []
        self._pushed: Set[int] = set()
        # (name, parameter, variable id). Pulls write into the parameters
        # themselves, in place and outside autograd as p.data would be (the
        # library reads only the address), without the new tensor object
        # that p.data makes on every access.
        self.params: List[Tuple[str, torch.Tensor, int]] = []
        for name, p in module.named_parameters():
            _float_param(name, p)
            self.params.append((name, p, worker.declare_values(name, p.detach(),
                                                              options=self.options)))
        self.embeddings: List[Embedding] = []
        for name, m in module.named_modules():
            if isinstance(m, Embedding):
                m._worker = worker
                options = ",".join(o for o in (self.options, m.options) if o)
                m._table = worker.declare_table(name or "embedding", m.dim, m.init, m.seed,
                                                options)
                self.embeddings.append(m)
        worker.initialize()
        self._pull()
        # close() is optional: a script that ends without it still says it
        # has finished and stops its local ps cleanly (weakly held: the
        # optimizer may go away first). One that dies of an exception does
        # not say it has finished (_close_at_exit).
        ref = weakref.ref(self)
        atexit.register(_close_at_exit, ref)
        self.calls = 0
        self.stale = 0
        self.global_step = 0
        self.stopped = False
        self.stop_reason = ""
        self._sums: Optional[List[torch.Tensor]] = None
        self._start: Optional[List[torch.Tensor]] = None
        self._hooked = self.overlap
        if self.overlap:
            for _, param, i in self.params:
                param.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                    self._grad_ready(i))

    def _grad_ready(self, var_id: int) -> Any:
        """The hook that pushes one parameter's gradient as backprop has it,
        its new value coming back into the parameter in the same request."""
        ref = weakref.ref(self)

        def hook(p: torch.Tensor) -> None:
            opt = ref()
            if opt is None or not opt.overlap or opt.stopped or p.grad is None:  # off for now
                return
            if var_id in opt._pushed:
                raise RuntimeError("quorum.torch.Optimizer(overlap=True) pushes each gradient as "
                                   "backward produces it: call step() after each backward (or "
                                   "use accumulate=k, or overlap=False)")
            opt._pushed.add(var_id)
            g = p.grad if not p.grad.is_sparse else p.grad.to_dense()
            try:
                opt._inflight.append(opt.worker.push_pull_start(
                    {var_id: g.contiguous()}, into={var_id: p}, step=False))
            except StoppedError as e:
                if e.status_name != "QR_ESTOPPED":
                    raise
                opt.stopped, opt.stop_reason = True, str(e)
        return hook

    def _make_worker(self, settings: Dict[str, Any]) -> Worker:
        if os.environ.get("TF_CONFIG"):
            return Worker(**settings)
        # Alone: one ps in this process, on a Unix socket of a private folder.
        self._local_dir = tempfile.mkdtemp(prefix="quorum-local-")
        ps_hosts = ["unix:%s/ps0.sock" % self._local_dir]
        worker_hosts = ["unix:%s/w0.sock" % self._local_dir]
        options = dict(launcher_options())
        options.update(settings)
        self._local_ps = PS(Cluster(ps_hosts, worker_hosts, "ps", 0), None, **options)
        return Worker(Cluster(ps_hosts, worker_hosts, "worker", 0), **settings)

    def _pull(self) -> None:
        self.worker.pull({i: p for _, p, i in self.params})

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.module.zero_grad(set_to_none=set_to_none)

    def _grads(self) -> Dict[int, torch.Tensor]:
        grads = {}
        for name, p, i in self.params:
            if p.grad is None:
                continue
            g = p.grad
            if g.is_sparse:
                g = g.to_dense()
            grads[i] = g.contiguous()
        return grads

    @property
    def should_stop(self) -> bool:
        """True once the cluster has ended the run in order (the chief
        stopped it, or in sync mode the other workers finished and too few
        are left for a step): step() does nothing from then on and the
        parameters keep their last pulled values. A loop may end early on it."""
        return self.stopped

    def step(self) -> int:
        """Push this step's gradients (and the embeddings' rows), take the
        token in sync mode, pull the new parameters; the global step. Once
        the run has ended in order (should_stop), it does nothing."""
        if self.stopped:
            return self.global_step
        try:
            return self._step()
        except StoppedError as e:
            if e.status_name != "QR_ESTOPPED":
                raise  # aborted or rolled back: not an orderly end
            self.stopped, self.stop_reason = True, str(e)
            _log.info("training is over for this worker at global step %d: %s",
                      self.global_step, e)
            return self.global_step

    def _overlapped_step(self) -> int:
        inflight, self._inflight = self._inflight, []
        pushed, self._pushed = self._pushed, set()
        error: Optional[BaseException] = None
        for r in inflight:  # every one is waited for, whatever fails
            try:
                r.wait()
            except BaseException as e:  # noqa: B902 - re-raised below
                error = error or e
        if error is not None:
            raise error
        for emb in self.embeddings:
            for ids, rows in emb._take_rows():
                self.worker.add_rows(emb._table, ids, rows.contiguous())
        self.global_step = self.worker.push({}, step=True, every_ps=True)
        rest = {i: p for _, p, i in self.params if i not in pushed}
        if rest:
            self.worker.pull(rest)
        return self.global_step

    def _step(self) -> int:
        self.calls += 1
        if self.overlap and self._hooked:
            return self._overlapped_step()
        grads = self._grads()
        if self.local_steps > 1:
            return self._local_step(grads)
        if self.accumulate > 1:
            if self._sums is None:
                self._sums = [torch.zeros_like(p) for _, p, _ in self.params]
            for k, (_, p, i) in enumerate(self.params):
                if i in grads:
                    self._sums[k] += grads[i]
            if self.calls % self.accumulate:
                return self.global_step
            grads = {i: self._sums[k] / self.accumulate for k, (_, _, i) in enumerate(self.params)}
            self._sums = None
        for emb in self.embeddings:
            for ids, rows in emb._take_rows():
                self.worker.add_rows(emb._table, ids, rows.contiguous())
        if not self.sync and len(grads) == len(self.params):
            # One round trip per ps: the push's reply brings the new values
            # straight into the parameters.
            self.global_step = self.worker.push_pull(
                grads, into={i: p for _, p, i in self.params})
            return self.global_step
        try:
            self.global_step = self.worker.push(grads)
        except StaleError:
            self.stale += 1  # a late gradient of a backup worker: dropped, go on
        if self.sync:
            self.global_step = self.worker.take_token()
        self._pull()
        return self.global_step

    def _local_step(self, grads: Dict[int, torch.Tensor]) -> int:
        if self._start is None:
            self._start = [p.detach().clone() for _, p, _ in self.params]
        with torch.no_grad():
            for _, p, i in self.params:
                if i in grads:
                    p -= self.lr * grads[i]
        if self.calls % self.local_steps:
            return self.global_step
        deltas = {i: (p.detach() - s).contiguous()
                  for (_, p, i), s in zip(self.params, self._start)}
        self.global_step = self.worker.push(deltas, delta=True)
        self._start = None
        self._pull()
        return self.global_step

    def checkpoint(self) -> int:
        """A checkpoint of the whole cluster now (its global step), with the
        gradients pushed so far; see Worker.checkpoint."""
        for r in self._inflight:  # an overlapped step's pushes first
            r.wait()
        self._inflight = []
        return self.worker.checkpoint()

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """The module's parameters as the ps tasks hold them now (a pull)."""
        out = {name: torch.empty_like(p) for name, p, _ in self.params}
        self.worker.pull({i: out[name] for name, _, i in self.params})
        return out

    def close(self, stop_cluster: Optional[bool] = None, finished: bool = True) -> None:
        """Done training. This worker tells ps 0 it has finished (unless
        finished=False), so the others go on without it and the run ends in
        order once every worker has finished (in sync mode: once too few are
        left to make a step). The chief stops the cluster when run alone, or
        when asked (stop_cluster=True)."""
        if not self.worker._handle:
            return  # closed already
        if stop_cluster is None:
            stop_cluster = self._local_ps is not None
        try:
            if stop_cluster and self.worker.cluster.task_index == 0:
                self.worker.stop_cluster()
            elif finished and not self.stopped:
                self.worker.leave()
        except StoppedError:
            pass  # the cluster has ended already: nothing to leave
        self.worker.close()
        if self._local_ps is not None:
            self._local_ps.join(30)
            self._local_ps.close()
            self._local_ps = None
        if self._local_dir:
            shutil.rmtree(self._local_dir, ignore_errors=True)
            self._local_dir = None

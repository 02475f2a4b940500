"""quorum for PyTorch: train any ``torch.nn.Module`` on the ps tier.

    import quorum.torch as qt
    model = Net()
    opt = qt.Optimizer(model, "SGD", lr=0.1)   # was torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()                              # push the gradients, pull fresh parameters
    opt.close()

``Optimizer`` declares every parameter by its name in the module, with the
module's own initial values (the chief's), and the optimizer as the
parameters' own options, so the ps tasks apply it whatever they were started
with. ``step()`` pushes the gradients, and in sync mode takes the step's
token, then pulls the new values into the parameters' own memory (no copy).
Run alone (no TF_CONFIG), it starts a ps in this process, so the same script
runs single-process; under ``quorum launch --ps P --workers W -- python
train.py`` every worker trains one cluster's model.

``Embedding`` is an embedding table on the ps tasks: its forward pulls the
rows of the batch's distinct ids, and the next ``step()`` pushes their
gradients as sparse rows (one quorum with the dense gradients in sync mode).

``load_checkpoint`` / ``checkpoint_state_dict`` read a quorum checkpoint
(safetensors shards) back into a module or a dict of tensors."""

from __future__ import annotations

import atexit
import glob
import logging
import os
import shutil
import sys
import tempfile
import types
import weakref
from typing import Any, Dict, List, Optional, Set, Tuple, Type, Union

import torch

from .cluster import Cluster, launcher_options
from .errors import StaleError, StoppedError
from .ps import PS
from .worker import Request, Worker

__all__ = ["Optimizer", "Embedding", "shard", "load_checkpoint", "checkpoint_state_dict"]

_log = logging.getLogger("quorum")

# Set when the script dies of an uncaught exception (sys.excepthook runs
# before atexit): a worker closed then has not finished its work, so it does
# not say LEAVE, and the ps tasks wait for it to come back.
_script_failed = False


def _note_failure() -> None:
    previous = sys.excepthook
    if getattr(previous, "_quorum", False):
        return

    def hook(kind: Type[BaseException], value: BaseException,
             tb: Optional[types.TracebackType]) -> None:
        global _script_failed
        _script_failed = True
        previous(kind, value, tb)

    setattr(hook, "_quorum", True)
    sys.excepthook = hook


def _close_at_exit(ref: "weakref.ReferenceType[Optimizer]") -> None:
    opt = ref()
    if opt is not None:
        opt.close(finished=not _script_failed)


def worker_rank() -> Tuple[int, int]:
    """(this worker's index, the number of workers) from TF_CONFIG; (0, 1)
    when run alone."""
    text = os.environ.get("TF_CONFIG")
    if not text:
        return 0, 1
    c = Cluster.from_tf_config(text)
    return (c.task_index if c.job == "worker" else 0), c.num_workers


def shard(items: Any) -> Any:
    """This worker's part of items (every num_workers-th, from its index):
    a tensor, an array or a list; all of it when run alone."""
    rank, size = worker_rank()
    return items[rank::size]

# torch.optim names -> quorum's optimizers, and their hyper-parameters ->
# quorum's options. Where the two differ in a detail, docs/PYTHON.md says.
_NAMES = {"sgd": "sgd", "adam": "adam", "adagrad": "adagrad", "rmsprop": "rmsprop",
          "adamasync": "adam_async", "adam_async": "adam_async", "ftrl": "ftrl",
          "momentum": "momentum"}


def _optimizer_options(optimizer: Union[str, type], hyper: Dict[str, Any]) -> str:
    """The per-variable options string for optimizer and its settings."""
    name = optimizer if isinstance(optimizer, str) else optimizer.__name__
    key = name.lower().replace("-", "_")
    if key not in _NAMES:
        raise ValueError("optimizer %r: quorum has SGD, Adam, Adagrad, RMSprop, AdamAsync, "
                         "FTRL" % (name,))
    opt = _NAMES[key]
    out: Dict[str, Any] = {}
    for k, v in hyper.items():
        if k == "lr":
            out["lr"] = v
        elif k == "momentum":
            if opt == "sgd" and v:
                opt = "momentum"
            if v or opt != "sgd":
                out["momentum"] = v
        elif k == "nesterov":
            out["nesterov"] = bool(v)
        elif k == "betas":
            out["beta1"], out["beta2"] = v
        elif k == "eps" and opt == "adagrad":
            # TensorFlow's Adagrad, quorum's, has none; torch's 1e-10 outside
            # the square root changes nothing a float32 shows.
            if v > 1e-10:
                raise ValueError("Adagrad: quorum's (TensorFlow's) has no eps; eps=%r would "
                                 "be dropped" % (v,))
        elif k == "eps":
            out["epsilon"] = v
        elif k == "alpha" and opt == "rmsprop":
            out["decay"] = v
        elif k == "centered":
            out["centered"] = bool(v)
        elif k == "initial_accumulator_value":
            out["initial-accumulator"] = v
        elif k in ("l1", "l2", "lr_power", "beta1", "beta2", "epsilon", "decay",
                   "apply_sparse_rmsprop", "initial_accumulator"):
            out[k.replace("_", "-")] = v
        elif k in ("weight_decay", "dampening") and not v:
            pass
        else:
            raise ValueError("%s: option %r is not supported by quorum's %s" % (name, k, opt))
    items = ["optimizer=%s" % opt] + ["%s=%s" % (k, str(v).lower() if isinstance(v, bool)
                                                 else v) for k, v in out.items()]
    return ",".join(items)


def _float_param(name: str, p: torch.Tensor) -> None:
    if p.dtype != torch.float32 or p.device.type != "cpu" or not p.is_contiguous():
        raise TypeError("parameter %r: quorum trains contiguous float32 CPU tensors, not %s on "
                        "%s%s" % (name, p.dtype, p.device,
                                  "" if p.is_contiguous() else " (non-contiguous)"))


class Embedding(torch.nn.Module):
    """An embedding table on the ps tasks: ids (any int64, no fixed
    vocabulary) -> rows of ``dim`` floats, made on first use from the seeded
    initializer. Use it inside a model trained by ``Optimizer``.
    ``mode="sum"|"mean"`` pools the last dimension of ids (a bag).
    ``options`` are the table's own, added to the optimizer's: its optimizer
    settings, and admission and eviction ("admit_after=3,
    evict_after_steps=100000", docs/EMBEDDINGS.md)."""

    def __init__(self, dim: int, init: str = "normal:0,0.01", seed: int = 0,
                 options: str = "", mode: Optional[str] = None):
        super().__init__()
        if mode not in (None, "sum", "mean"):
            raise ValueError("mode must be None, 'sum' or 'mean', not %r" % (mode,))
        self.dim, self.init, self.seed, self.options, self.mode = dim, init, seed, options, mode
        self._worker: Optional[Worker] = None
        self._table = -1
        self._pending: List[Tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self._worker is None:
            raise RuntimeError("quorum.torch.Embedding: wrap the model with "
                               "quorum.torch.Optimizer before its first forward")
        if ids.dtype != torch.int64:
            raise TypeError("Embedding: ids of %s, not torch.int64" % ids.dtype)
        uniq, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        rows = torch.empty(uniq.numel(), self.dim)
        self._worker.pull_rows(self._table, uniq, out=rows, read_only=not self.training)
        if self.training and torch.is_grad_enabled():
            rows.requires_grad_(True)
            self._pending.append((uniq, rows))
        out = rows[inverse].reshape(*ids.shape, self.dim)
        if self.mode == "sum":
            out = out.sum(dim=-2)
        elif self.mode == "mean":
            out = out.mean(dim=-2)
        return out

    def _take_rows(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        done = [(ids, rows.grad) for ids, rows in self._pending if rows.grad is not None]
        self._pending = []
        return done


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
        self.options = _optimizer_options(optimizer, hyper)
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
        # not say it has finished.
        _note_failure()
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


# ---- checkpoints ------------------------------------------------------------------


def _newest(path: str) -> str:
    """path itself if it is one checkpoint (has a manifest), else its newest
    complete ckpt-* folder."""
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    done = sorted(d for d in glob.glob(os.path.join(path, "ckpt-*"))
                  if os.path.exists(os.path.join(d, "manifest.json")))
    if not done:
        raise FileNotFoundError("no complete quorum checkpoint in %s" % path)
    return done[-1]


def checkpoint_state_dict(path: str) -> Dict[str, torch.Tensor]:
    """The tensors of a quorum checkpoint (a checkpoint folder, or a
    checkpoint directory: its newest): dense variables by name, their
    partitioned shards (NAME/part_K) joined; tables as NAME (rows) and
    NAME/ids; optimizer slots as NAME/SLOT."""
    from safetensors.torch import load_file

    folder = _newest(path)
    tensors: Dict[str, torch.Tensor] = {}
    for shard in sorted(glob.glob(os.path.join(folder, "shard-*.safetensors"))):
        tensors.update(load_file(shard))
    parts: Dict[str, Dict[int, torch.Tensor]] = {}
    out: Dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        base, _, last = name.rpartition("/part_")
        if base and last.isdigit():
            parts.setdefault(base, {})[int(last)] = t
        else:
            out[name] = t
    for base, shards in parts.items():
        out[base] = torch.cat([shards[k] for k in sorted(shards)])
    return out


def load_checkpoint(module: torch.nn.Module, path: str, strict: bool = True) -> List[str]:
    """Load a quorum checkpoint's values into module's parameters (by name);
    the names loaded. strict: every parameter must be in the checkpoint."""
    state = checkpoint_state_dict(path)
    own = dict(module.named_parameters())
    missing = [n for n in own if n not in state]
    if strict and missing:
        raise KeyError("parameters not in the checkpoint: %s" % ", ".join(missing))
    loaded = []
    with torch.no_grad():
        for name, p in own.items():
            if name in state:
                if tuple(state[name].shape) != tuple(p.shape):
                    raise ValueError("%s: shape %s in the checkpoint, %s in the module"
                                     % (name, tuple(state[name].shape), tuple(p.shape)))
                p.copy_(state[name])
                loaded.append(name)
    return loaded

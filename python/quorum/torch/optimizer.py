"""``Optimizer``: trains a ``torch.nn.Module`` on the ps tier.

It declares every parameter by its name in the module, with the module's
own initial values (the chief's), and the optimizer as the parameters' own
options (options.py), so the ps tasks apply it whatever they were started
with; and the module's buffers as non-trainable variables (buffers.py).
``step()`` pushes the gradients (with the rows of the model's
``Embedding`` tables, and the buffers), and the worker's position in its
data (its sampler's), in sync mode takes the step's token, then pulls
the new values into the parameters' own memory (no copy; a GPU model's
through pinned host buffers, staging.py). A worker
restarted into the running cluster gets its position back, and its
sampler goes on from there. Run alone (no
TF_CONFIG), it starts a ps in this process, so the same script runs
single-process; under ``quorum launch --ps P --workers W -- python
train.py`` every worker trains one cluster's model."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple, Union

import torch

from ..errors import StaleError, StoppedError
from ..ps import PS
from ..worker import Request, Worker, dtype_name
from .buffers import BUFFER_MODES, Buffers, wait_all
from .data import DistributedSampler
from .embedding import Embedding
from .local import start_local
from .options import HYPER, check_keys, group_lr, group_options, resolve, setting_value
from .overlap import grad_ready_hook, land_before_use, spare_core
from .pipeline import Pipeline, pipeline_refusal
from .staging import Staging, wants_staging
from .state import check_state, read_state, write_state
from .summaries import Monitor, check_step_args

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


# The parameter dtypes quorum trains: float32, and bf16/fp16 ones, whose
# gradients travel and values come back in their own dtype while the ps
# tasks keep float32 master weights (Worker.set_dtype).
_PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _float_param(name: str, p: torch.Tensor) -> None:
    if p.dtype not in _PARAM_DTYPES or p.device.type not in ("cpu", "cuda") or \
            not p.is_contiguous():
        raise TypeError("parameter %r: quorum trains contiguous float32, bfloat16 or float16 "
                        "tensors on the CPU or a CUDA device, not %s on %s%s"
                        % (name, p.dtype, p.device,
                           "" if p.is_contiguous() else " (non-contiguous)"))


class Optimizer(torch.optim.Optimizer):
    """Trains ``module`` on the ps tier (see the module's docstring): a
    ``torch.optim.Optimizer``, so torch's schedulers, ``GradScaler`` and
    step hooks take it.

    module: a ``torch.nn.Module`` (every parameter, one group; its
    ``Embedding`` tables), or torch's params argument (tensors, (name,
    tensor) pairs or groups of them). params: groups of the module's
    parameters, as torch's first argument (for example biases with
    weight_decay=0); a parameter of no group is not trained, and is an
    error at step() once it has a gradient. optimizer: a name ("SGD",
    "Adam", "AdamW", "Adagrad", "RMSprop", "AdamAsync", "FTRL") or a
    torch.optim class, with its settings (lr=, momentum=, betas=, eps=,
    weight_decay=, ...; a torch optimizer's defaults are torch's). Each
    group's settings are its variables' own options on the ps. worker: a
    ``quorum.Worker`` to use; by default one is made from TF_CONFIG, or,
    without it, a one-ps cluster in this process. accumulate=k pushes the
    mean of k steps' gradients; local_steps=k (async) takes k local SGD
    steps with lr, then pushes their sum as a delta. overlap=True (async):
    each parameter's gradient is pushed, and its new value fetched in the
    same request, as soon as backpropagation has produced it, so
    communication runs under the rest of the backward pass; step() then
    waits for them and sends the step's tick (one backward per step: use
    accumulate=k to sum several). overlap=True (sync, a module's
    parameters): step() pushes the step whole and takes its token, then
    starts the pull of the new values and returns; they land before the
    module's next forward (the data loading runs under them), its
    state_dict() and any call of this optimizer (read a parameter by hand
    in between after opt.synchronize()). overlap="pipeline" (async):
    step() hands the step's push and pull to a thread and returns; they
    run under the next step's compute and their values replace the
    parameters at the next step() (one step staler; pipeline.py).
    overlap=None (the default): the pipeline in async mode where this
    machine has a core to spare (spare_core, the rule of quorum's own
    --overlap auto) and the cluster has several workers, else off, since
    overlap=True changes what a script sees between step() and the next
    forward (the log says where it would pay).
    Parameters may be
    float32, bfloat16 or float16: a bf16/fp16 parameter's gradient travels
    in its dtype (half the bytes) and its new values come back so, while
    the ps tasks keep float32 master weights and slots. wire_dtype="bf16"
    (or "fp16") sends a float32 model's gradients and values so too,
    converted in C (docs/PYTHON.md, "Mixed precision"). Parameters on a
    CUDA device travel through pinned host buffers (staging.py, docs/PYTHON.md
    "GPU models"); staging=True stages CPU ones so too (the same path, for
    tests; also QUORUM_TORCH_FORCE_STAGING=1). Other keyword
    options (mode="sync", replicas_to_aggregate=...) are the worker's (and
    the local ps's).

    buffers: how the module's buffers (BatchNorm's running statistics) are
    shared: "chief" (the default: the chief's, received by every worker at
    each step, as DDP's broadcast_buffers), "average" (over the workers) or
    "local" (not shared, not checkpointed); see buffers.py. sampler: a
    ``quorum.torch.DistributedSampler`` of the training data: its position
    rides on every push, and a worker restarted into the running cluster
    resumes it where its last push that counted left it. Without one the
    position is the number of step() calls, given back as
    ``data_position``."""

    def __init__(self, module: Any, optimizer: Union[str, type] = "SGD",
                 worker: Optional[Worker] = None, accumulate: int = 1, local_steps: int = 1,
                 overlap: Union[bool, str, None] = None, params: Optional[Iterable[Any]] = None,
                 buffers: str = "chief", sampler: Optional[DistributedSampler] = None,
                 wire_dtype: Optional[str] = None, staging: Optional[bool] = None,
                 **settings: Any):
        self._own_worker: Optional[Worker] = None
        self._pipeline: Optional[Pipeline] = None  # overlap="pipeline" (pipeline.py)
        self._deferred: Optional[Tuple[Any, Optional[int]]] = None  # its step's summary
        if overlap not in (None, True, False, "pipeline"):
            raise ValueError("overlap=%r: True, False, \"pipeline\" (async) or None (chosen "
                             "from the cores, docs/PYTHON.md \"Overlap\")" % (overlap,))
        self._monitor: Optional[Monitor] = None  # summaries, metrics, progress (summaries.py)
        self._local_dir: Optional[str] = None
        self._local_ps: Optional[PS] = None
        if buffers not in BUFFER_MODES:
            raise ValueError("buffers=%r: one of %s"
                             % (buffers, ", ".join(repr(m) for m in BUFFER_MODES)))
        if sampler is not None and not isinstance(sampler, DistributedSampler):
            raise TypeError("sampler: a quorum.torch.DistributedSampler (whose position a "
                            "restarted worker can resume), not %s" % type(sampler).__name__)
        self._buffer_mode, self.sampler = buffers, sampler
        hyper = {k: settings.pop(k) for k in list(settings) if k in HYPER}
        if accumulate < 1 or local_steps < 1:
            raise ValueError("accumulate and local_steps must be >= 1")
        self.wire_dtype = dtype_name(wire_dtype or "float32")
        self._name, self._qname, defaults = resolve(optimizer)
        check_keys(self._name, self._qname, defaults, hyper)
        defaults.update(hyper)
        self.module: Optional[torch.nn.Module] = None
        if isinstance(module, torch.nn.Module):
            self.module = module
            groups: Any = list(module.parameters()) if params is None else params
            names = {id(p): n for n, p in module.named_parameters()}
        elif params is not None:
            raise TypeError("params= is for a module's parameters: the first argument is "
                            "torch's params already")
        else:
            groups, names = module, {}
        self._declared = False
        super().__init__(groups, defaults)  # checks each group (add_param_group)
        self.options = group_options(self._name, self._qname, defaults)
        self.accumulate, self.local_steps = accumulate, local_steps
        # (name, parameter, variable id). Pulls write into the parameters
        # themselves, in place and outside autograd as p.data would be (the
        # library reads only the address), without the new tensor object
        # that p.data makes on every access.
        self.params: List[Tuple[str, torch.Tensor, int]] = []
        # per group: its variables' ids, its settings as declared, and the
        # learning rate the ps tasks apply to its variables
        self._group_vars: List[List[int]] = []
        self._group_options: List[str] = []
        self._group_settings: List[Dict[str, Any]] = []
        self._ps_lr: List[float] = []
        self.embeddings: List[Embedding] = []
        try:
            self._declare(worker, settings, names, overlap, staging)
        except BaseException:
            self._release()  # nothing of a failed construction stays behind
            raise

    def _declare(self, worker: Optional[Worker], settings: Dict[str, Any],
                 names: Dict[int, str], overlap: Union[bool, str, None],
                 staging: Optional[bool]) -> None:
        accumulate, local_steps = self.accumulate, self.local_steps
        if worker is None:
            worker = self._make_worker(settings)
        elif settings:
            raise TypeError("worker options %s with a worker of your own: give them to it"
                            % ", ".join(sorted(settings)))
        self.worker = worker
        self.sync = (worker._config.get("mode") or "async") == "sync"
        if local_steps > 1 and self.sync:
            raise ValueError("local_steps is for async training")
        plain = accumulate == 1 and local_steps == 1
        pipeline_asked = overlap == "pipeline"
        if pipeline_asked:
            overlap = False  # none of the hooks below: the thread hides the whole step
        if overlap and not plain:
            raise ValueError("overlap is for training without accumulate or local_steps")
        if overlap and self.sync and self.module is None:
            raise ValueError("overlap=True in sync mode lands the pulled values before the "
                             "module's next forward: give the optimizer the module")
        overlap_asked = overlap
        spare = False
        if overlap is None:
            # Both forms of overlap change what a script sees between
            # step() and the next forward (async: gradients pushed before
            # clipping or GradScaler could change them; sync: parameters
            # read by hand before the pull has landed), so the default is
            # off; where quorum's own trainer would turn it on (a core to
            # spare, spare_core), the log says so.
            spare, cores, needed = spare_core(worker.cluster, self._local_ps is not None)
            if spare and plain and self.sync:
                _log.info("overlap off (overlap=True turns it on): this machine has a core to "
                          "spare (%d cores for tasks that use %d)", cores, needed)
            overlap = False
        # May be turned off (and on again, if it was on) between steps.
        self.overlap = bool(overlap)
        self._inflight: List[Request] = []
        # sync overlap: the step's pulls in flight, until the next forward
        self._landing: List[Request] = []
        # overlap (async): the variables pushed this step, each with its
        # gradient as pushed (its id and version: an edit after is caught)
        self._pushed: Dict[int, Tuple[int, int]] = {}
        seen: Set[str] = set()
        for g, group in enumerate(self.param_groups):
            options = group_options(self._name, self._qname, group)
            given = group.get("param_names")
            ids = []
            for k, p in enumerate(group["params"]):
                name = (given[k] if given else names.get(id(p))) or \
                    "param%d" % len(self.params)
                if self.module is not None and id(p) not in names:
                    raise ValueError("param_groups[%d][%d] is not a parameter of the module"
                                     % (g, k))
                if name in seen:
                    raise ValueError("parameter %r is in two parameter groups" % name)
                seen.add(name)
                _float_param(name, p)
                # The chief's initial values, widened: the ps keeps float32.
                var = worker.declare_values(name, p.detach().float().cpu(), options=options)
                if p.dtype != torch.float32:
                    worker.set_dtype(var, p.dtype, p.dtype)
                elif self.wire_dtype != "float32":
                    worker.set_dtype(var, self.wire_dtype, "float32")
                self.params.append((name, p, var))
                ids.append(var)
            self._group_vars.append(ids)
            self._group_options.append(options)
            self._group_settings.append({k: setting_value(v) for k, v in group.items()
                                         if k in HYPER and k != "lr"})
            self._ps_lr.append(group_lr(group, g))
        self._declared = True
        self._on_ps = {id(p) for _, p, _ in self.params}
        # Parameters on a GPU (or any, when asked) travel through host
        # buffers (staging.py); CPU ones, by default, are read and written
        # in place.
        self._staging: Optional[Staging] = None
        if wants_staging(self.params, staging):
            self.overlap = self.overlap and overlap_asked is not None  # auto: off here
            if overlap_asked or local_steps > 1:
                raise ValueError("%s with staged parameters (on a GPU, or staging=True): not "
                                 "supported; the gradients' copies to the host already run "
                                 "under the backward pass"
                                 % ("overlap=True" if overlap_asked else "local_steps"))
            self._staging = Staging(self.params)
        self.buffers = Buffers(self.module, worker,
                               self._buffer_mode if self.module is not None else "local",
                               staged=self._staging is not None)
        for name, m in (self.module.named_modules() if self.module is not None else ()):
            if isinstance(m, Embedding):
                m._worker = worker
                options = ",".join(o for o in (self.options, m.options) if o)
                m._table = worker.declare_table(name or "embedding", m.dim, m.init, m.seed,
                                                options)
                self.embeddings.append(m)
        self._choose_pipeline(pipeline_asked, overlap_asked is None and spare, plain)
        worker.initialize()
        # Where this worker's data stream was at its last push that counted
        # (0 unless it was restarted into the running cluster).
        self.data_position = worker.data_position()
        self._batches = self.data_position
        if self.sampler is not None:
            self.sampler.resume(self.data_position)
        self._pull(buffers=True)
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
        self._hooked = self.overlap and not self.sync
        if self._hooked:
            for _, param, i in self.params:
                param.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                    grad_ready_hook(self, i))
        if self.sync and self.module is not None:
            land_before_use(self, self.module)
        self._monitor = Monitor.for_optimizer(self)

    def _choose_pipeline(self, asked: bool, spare: bool, plain: bool) -> None:
        """overlap="pipeline", or by default (overlap=None) in async mode
        where this machine has a core to spare for the thread and the
        cluster has more than one worker: a one-worker async run is
        deterministic and steps as torch's optimizer does, which the
        pipeline's extra step of staleness would change; with several
        workers the order of pushes already varies from run to run."""
        why = pipeline_refusal(self.sync, plain, self._staging is not None, bool(self.buffers),
                               bool(self.embeddings))
        if asked and why:
            raise ValueError("overlap=\"pipeline\": %s" % why)
        workers = len(self.worker.cluster.addresses("worker"))
        if asked or (spare and why is None and workers > 1):
            self._pipeline = Pipeline(self.params)
            if not asked:
                _log.info("pipelined async steps on (overlap=False turns them off): this "
                          "machine has a core to spare, so each step's push and pull run on a "
                          "thread under the next batch's compute, one step staler")

    @property
    def pipelined(self) -> bool:
        """Whether each step's push and pull run under the next step's
        compute (overlap="pipeline", pipeline.py)."""
        return self._pipeline is not None

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """A group, checked as the ps will take it; only while the optimizer
        is made: its variables are declared on the ps tasks then."""
        if getattr(self, "_declared", True):
            raise RuntimeError("quorum.torch.Optimizer: add_param_group after the optimizer "
                               "was made: its variables are on the ps tasks already; give "
                               "every group to the constructor")
        check_keys(self._name, self._qname, self.defaults, param_group)
        super().add_param_group(param_group)
        group_options(self._name, self._qname, self.param_groups[-1])

    @property
    def lr(self) -> float:
        """The first group's learning rate."""
        return float(self.param_groups[0]["lr"])

    def synchronize(self) -> None:
        """The last step's values in the parameters now. Only sync overlap
        leaves them in flight when step() returns (they land by themselves
        before the module's next forward, its state_dict() and any call of
        this optimizer): call it before reading a parameter by hand. With
        overlap="pipeline" it waits for the step in flight and its values
        become the parameters'."""
        if self._pipeline is not None and self._pipeline.busy:
            step = self._pipeline.finish(self.params)
            if step is not None:
                self.global_step = step
            deferred, self._deferred = self._deferred, None
            if deferred is not None and self._monitor is not None:
                self._monitor.step(self, *deferred)
        landing, self._landing = self._landing, []
        if not landing:
            return
        wait_all(landing)
        self._land()
        if self.buffers:
            self.buffers.pulled()

    def _pull_later(self) -> None:
        """Sync overlap: the step's pull (parameters and buffers, as _pull)
        started, to land at synchronize(): the next batch is loaded under it."""
        into = self._into()
        if self.buffers:
            into.update(self.buffers.targets())
        self._landing.append(self.worker.pull_start(into))

    def _make_worker(self, settings: Dict[str, Any]) -> Worker:
        if os.environ.get("TF_CONFIG"):
            self._own_worker = Worker(**settings)
        else:
            self._local_dir, self._local_ps, self._own_worker = start_local(settings)
        return self._own_worker

    def _release(self) -> None:
        """Free what this optimizer made: its worker, its local ps and the
        folder of their sockets."""
        if self._pipeline is not None:
            self._pipeline.close()
        if self._monitor is not None:  # it borrows the worker's handle
            self._monitor.close(flush=False)
            self._monitor = None
        if self._own_worker is not None:
            self._own_worker.close()
            self._own_worker = None
        if self._local_ps is not None:
            self._local_ps.close()
            self._local_ps = None
        if self._local_dir:
            shutil.rmtree(self._local_dir, ignore_errors=True)
            self._local_dir = None

    def _into(self) -> Dict[int, torch.Tensor]:
        """Where a pull of every parameter lands: the parameters, or their
        host buffers (then _land after it)."""
        if self._staging is not None:
            return self._staging.targets()
        return {i: p for _, p, i in self.params}

    def _land(self) -> None:
        """After a pull into _into(): staged values into the parameters."""
        if self._staging is not None:
            self._staging.land()

    def _pull(self, buffers: Optional[bool] = None) -> None:
        """The parameters, and the buffers at the start and after a sync
        step (an async step exchanges them beside its push: _with_buffers)."""
        into = self._into()
        if buffers is None:
            buffers = self.sync
        if buffers and self.buffers:
            into.update(self.buffers.targets())
        self.worker.pull(into)
        self._land()
        if buffers and self.buffers:
            self.buffers.pulled()

    def _with_buffers(self, push: Callable[[], int]) -> int:
        """Async: push() (a step's push) with the buffers' exchange sent
        just before it, so both travel in the same round trip."""
        requests, pulls = self.buffers.start_async()
        try:
            step = push()
        except BaseException:
            for r in requests:
                r.wait(raise_error=False)
            raise
        wait_all(requests)
        if pulls:
            self.buffers.pulled()
        return step

    def _position(self) -> int:
        """Where this worker is in its data: its sampler's position, or the
        steps it has made."""
        return self.sampler.position if self.sampler is not None else self._batches

    def _grads(self) -> Dict[int, torch.Tensor]:
        if self._staging is not None:
            return self._staging.gradients()
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

    def step(self, closure: Optional[Callable[[], Any]] = None, loss: Any = None,
             examples: Optional[int] = None) -> Any:
        """Push this step's gradients (and the embeddings' rows), take the
        token in sync mode, pull the new parameters; the global step (or,
        given a closure, as torch, the loss it returns). Once the run has
        ended in order (should_stop), it does nothing. loss (or the
        closure's) and examples (this step's batch; by default counted by
        the model's forward passes) go to the summaries and metrics
        (summaries.py)."""
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
            self.step(loss=loss, examples=examples)
            return loss
        if self._monitor is None and (loss is not None or examples is not None):
            check_step_args(loss, examples)
        if self.stopped:
            return self.global_step
        try:
            # The last step's values, if still in flight (and the worker's
            # handle back from a pipelined step's thread before any use).
            self.synchronize()
            self._check_groups()
            self._batches += 1
            self.worker.set_data_position(self._position())  # rides on the pushes
            self._step()
            if self._pipeline is not None and self._pipeline.busy:
                self._deferred = (loss, examples)  # summarised once its step is known
            elif self._monitor is not None:
                self._monitor.step(self, loss, examples)
            return self.global_step
        except StoppedError as e:
            if e.status_name != "QR_ESTOPPED":
                raise  # aborted or rolled back: not an orderly end
            self.stopped, self.stop_reason = True, str(e)
            _log.info("training is over for this worker at global step %d: %s",
                      self.global_step, e)
            return self.global_step

    def _overlapped_step(self) -> int:
        inflight, self._inflight = self._inflight, []
        pushed, self._pushed = self._pushed, {}
        wait_all(inflight)  # every one is waited for, whatever fails
        for name, p, i in self.params:
            g = p.grad
            if i in pushed and (g is None or pushed[i] != (id(g), g._version)):
                raise RuntimeError(
                    "parameter %r: its gradient changed after backward pushed it (gradient "
                    "clipping, GradScaler's unscale_, a hook of your own), and the ps has applied "
                    "it as backward left it: with overlap (on by default where this machine has "
                    "a core to spare) each gradient goes out as backward produces it; make the "
                    "optimizer with overlap=False to change gradients before step()" % name)

        def tick() -> int:
            for emb in self.embeddings:
                for ids, rows in emb._take_rows():
                    self.worker.add_rows(emb._table, ids, rows.contiguous())
            step = self.worker.push({}, step=True, every_ps=True)
            rest = {i: p for _, p, i in self.params if i not in pushed}
            if rest:
                self.worker.pull(rest)
            return step
        self.global_step = self._with_buffers(tick)
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
                self._sums = [torch.zeros_like(p, device="cpu") for _, p, _ in self.params]
            for k, (_, p, i) in enumerate(self.params):
                if i in grads:
                    self._sums[k] += grads[i]
            if self.calls % self.accumulate:
                return self.global_step
            grads = {i: self._sums[k] / self.accumulate for k, (_, _, i) in enumerate(self.params)}
            self._sums = None
        if self.sync:  # the buffers go in the step's push, the step's pull brings them
            grads.update(self.buffers.values())
            return self._push(grads)
        return self._with_buffers(lambda: self._push(grads))

    def _push(self, grads: Dict[int, torch.Tensor]) -> int:
        """The step's push (the embeddings' rows with it) and its pull."""
        for emb in self.embeddings:
            for ids, rows in emb._take_rows():
                self.worker.add_rows(emb._table, ids, rows.contiguous())
        if not self.sync and len(grads) == len(self.params) and self._pipeline is not None:
            # Under the next step's compute, on the pipeline's thread; the
            # gradients are the thread's now (the next backward makes new
            # ones: p.grad is None until then).
            for _, p, _ in self.params:
                p.grad = None
            self._pipeline.start(self.worker, grads)
            return self.global_step
        if not self.sync and len(grads) == len(self.params):
            # One round trip per ps: the push's reply brings the new values
            # straight into the parameters.
            self.global_step = self.worker.push_pull(grads, into=self._into())
            self._land()
            return self.global_step
        if (self.sync and not self.overlap
                and len(grads) == len(self.params) + len(self.buffers.targets())):
            # One round trip per ps too: each answers after the step with
            # its values (the buffers' too), ps 0 with the next token. (With
            # overlap the token is taken now and the pull lands under the
            # next batch's loading, below.)
            into = self._into()
            into.update(self.buffers.targets())
            try:
                self.global_step = self.worker.push_pull(grads, into=into)
            except StaleError:
                self.stale += 1  # a late gradient of a backup worker: dropped, go on
                self.global_step = self.worker.local_step
            self._land()
            if self.buffers:
                self.buffers.pulled()
            return self.global_step
        try:
            self.global_step = self.worker.push(grads)
        except StaleError:
            self.stale += 1  # a late gradient of a backup worker: dropped, go on
        if self.sync:
            self.global_step = self.worker.take_token()
        if self.sync and self.overlap and self._staging is None and self.module is not None:
            self._pull_later()
            return self.global_step
        self._pull()
        return self.global_step

    def _local_step(self, grads: Dict[int, torch.Tensor]) -> int:
        if self._start is None:
            self._start = [p.detach().clone() for _, p, _ in self.params]
        lrs = {i: float(group["lr"]) for group, ids in zip(self.param_groups, self._group_vars)
               for i in ids}
        with torch.no_grad():
            for _, p, i in self.params:
                if i in grads:
                    p -= lrs[i] * grads[i]
        if self.calls % self.local_steps:
            return self.global_step
        deltas = {i: (p.detach() - s).contiguous()
                  for (_, p, i), s in zip(self.params, self._start)}
        self.global_step = self._with_buffers(lambda: self.worker.push(deltas, delta=True))
        self._start = None
        self._pull()
        return self.global_step

    def checkpoint(self) -> int:
        """A checkpoint of the whole cluster now (its global step), with the
        gradients pushed so far; see Worker.checkpoint."""
        self.synchronize()
        for r in self._inflight:  # an overlapped step's pushes first
            r.wait()
        self._inflight = []
        return self.worker.checkpoint()

    def _send_lrs(self) -> None:
        """Each group's lr, where it is not what the ps tasks apply, becomes
        its variables' (Worker.set_lr): every later push carries it."""
        for g, group in enumerate(self.param_groups):
            lr = group_lr(group, g)
            if lr == self._ps_lr[g]:
                continue
            for var in self._group_vars[g]:
                self.worker.set_lr(var, lr)
            self._ps_lr[g] = lr

    def _check_groups(self) -> None:
        """Before a step: every parameter with a gradient is on the ps; each
        group's lr (a scheduler's, or set by hand) goes to the ps tasks with
        this step's push; any other setting is the one its variables were
        declared with."""
        if self.module is not None:
            for name, p in self.module.named_parameters():
                if p.grad is not None and id(p) not in self._on_ps:
                    raise RuntimeError(
                        "parameter %r has a gradient but is not on the ps tasks, so it would "
                        "never change: it was added to the module after the optimizer was "
                        "made, or left out of its parameter groups (a frozen parameter to be "
                        "trained later belongs in a group from the start)" % name)
        for g, group in enumerate(self.param_groups):
            declared = self._group_settings[g]
            changed = sorted(k for k in set(declared) | {k for k in group if k in HYPER}
                             if k != "lr" and setting_value(group.get(k)) != declared.get(k))
            if changed:
                raise NotImplementedError(
                    "param_groups[%d]: %s changed (by a scheduler or by hand) from %s to %s, but "
                    "the ps tasks keep the settings a variable was declared with ('%s'): only "
                    "lr may change between steps (for OneCycleLR, cycle_momentum=False)"
                    % (g, ", ".join(changed),
                       ", ".join("%s=%r" % (k, declared.get(k)) for k in changed),
                       ", ".join("%s=%r" % (k, setting_value(group.get(k))) for k in changed),
                       self._group_options[g]))
        self._send_lrs()

    def state_dict(self) -> Dict[str, Any]:
        """torch's layout: "param_groups" (each group's settings, its
        parameters as indices in order) and "state": per parameter index its
        optimizer slots under torch's names (exp_avg, exp_avg_sq for Adam
        and AdamW; momentum_buffer for SGD with momentum; sum for Adagrad;
        square_avg, momentum_buffer, grad_avg for RMSprop), pulled from the
        ps tasks, and "step", the cluster's global step (state.py,
        docs/PYTHON.md). Empty state before the first step, as torch's."""
        self.synchronize()
        groups = []
        start = 0
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            groups.append(packed)
        return {"state": read_state(self), "param_groups": groups}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Each group's settings (the learning rate a scheduler had reached,
        ...; they take effect at the next step) and, on the chief, the
        state: every parameter's values as the module holds them now (load
        the model's state_dict first, as torch's tutorial does), the slots,
        and the step, which a cluster takes only before its first push (a
        new one: the saved run resumes exactly). Everything is checked
        before anything changes: a state of another optimizer, a wrong
        shape, a NaN is a ValueError naming the parameter and the key.
        Other workers check it and take the groups' settings: the chief's
        writes are the cluster's."""
        self.synchronize()
        groups = state_dict.get("param_groups")
        if not isinstance(groups, list) or len(groups) != len(self.param_groups):
            raise ValueError("load_state_dict: %s parameter groups, this optimizer has %d"
                             % (len(groups) if isinstance(groups, list) else "no",
                                len(self.param_groups)))
        for g, (saved, own) in enumerate(zip(groups, self.param_groups)):
            if len(saved.get("params", ())) != len(own["params"]):
                raise ValueError("load_state_dict: group %d has %d parameters, this "
                                 "optimizer's has %d" % (g, len(saved.get("params", ())),
                                                         len(own["params"])))
        lrs = [float(saved.get("lr", own["lr"])) for saved, own in zip(groups, self.param_groups)]
        step, writes = check_state(self, state_dict.get("state", {}), lrs)
        if self.worker.cluster.task_index == 0:
            write_state(self, step, writes)
        for saved, own in zip(groups, self.param_groups):
            own.update({k: v for k, v in saved.items() if k not in ("params", "param_names")})

    def close(self, stop_cluster: Optional[bool] = None, finished: bool = True) -> None:
        """Done training. This worker tells ps 0 it has finished (unless
        finished=False), so the others go on without it and the run ends in
        order once every worker has finished (in sync mode: once too few are
        left to make a step). The chief stops the cluster when run alone, or
        when asked (stop_cluster=True)."""
        if not self.worker._handle:
            return  # closed already
        try:
            self.synchronize()
        except StoppedError:
            pass  # the run ended under the last pull: the values stay as they were
        if stop_cluster is None:
            stop_cluster = self._local_ps is not None
        if self._monitor is not None:  # the last point, while the ps tasks answer
            monitor, self._monitor = self._monitor, None
            monitor.close()
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
        self._release()

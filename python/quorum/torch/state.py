"""The optimizer's state in torch's layout (``Optimizer.state_dict`` and
``load_state_dict``): each parameter's slots, kept by its variable's
optimizer on the ps tasks, under the names torch gives them, read with
``Worker.pull_slot`` and written with ``Worker.set_slot``; torch's
``step`` is the cluster's global step, set with ``Worker.set_step``.

Per quorum optimizer, torch's state key -> quorum's slot, and how they
relate (docs/PYTHON.md, "Optimizer state"):

- adam, adamw: exp_avg = m, exp_avg_sq = v, the same recurrences as
  torch's; step.
- momentum (SGD with momentum): momentum_buffer = momentum, the same
  buffer (buf = momentum * buf + g; TensorFlow's accumulator and torch's
  agree, the learning rate multiplying the update in both). No step:
  torch's SGD keeps none.
- sgd: nothing (torch's plain SGD keeps no state either).
- adagrad: sum = accumulator (sum of squared gradients, from the initial
  accumulator value); step.
- rmsprop: square_avg = rms (TensorFlow's: it starts at 1, torch's at 0),
  grad_avg = mg when centered, momentum_buffer = momentum / lr when
  momentum > 0 (TensorFlow's buffer holds the learning rate, torch's does
  not: converted with the group's lr, so a round trip may differ in the
  last bit); step.
- adam_async, ftrl (quorum's own): quorum's slot names as they are;
  AdamAsync's beta1_power and beta2_power are one float each; step.

Embedding tables' rows keep their slots in the ps tasks' checkpoints
only: they are not in this state."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

import torch

if TYPE_CHECKING:
    from .optimizer import Optimizer

__all__ = ["read_state", "check_state", "write_state"]

_log = logging.getLogger("quorum")

# quorum optimizer -> (torch state key -> quorum slot), and whether torch keeps a step.
_SLOTS: Dict[str, Tuple[Dict[str, str], bool]] = {
    "adam": ({"exp_avg": "m", "exp_avg_sq": "v"}, True),
    "adamw": ({"exp_avg": "m", "exp_avg_sq": "v"}, True),
    "momentum": ({"momentum_buffer": "momentum"}, False),
    "sgd": ({}, False),
    "adagrad": ({"sum": "accumulator"}, True),
    "rmsprop": ({"square_avg": "rms", "momentum_buffer": "momentum", "grad_avg": "mg"}, True),
    "adam_async": ({"m": "m", "v": "v", "beta1_power": "beta1_power",
                    "beta2_power": "beta2_power"}, True),
    "ftrl": ({"accum": "accum", "linear": "linear"}, True),
}
_SCALAR = frozenset({"beta1_power", "beta2_power"})


def _qname(options: str) -> str:
    """The optimizer of a group's options string ("optimizer=adam,...")."""
    return options.split(",", 1)[0].split("=", 1)[1]


def _keys(qname: str, group: Mapping[str, Any]) -> Tuple[Dict[str, str], bool]:
    """The state keys a parameter of this group has in torch, with their
    quorum slots, and whether it has a step."""
    slots, has_step = _SLOTS[qname]
    slots = dict(slots)
    if qname == "rmsprop":
        if not group.get("momentum"):
            del slots["momentum_buffer"]
        if not group.get("centered"):
            del slots["grad_avg"]
    return slots, has_step


def _params(opt: "Optimizer") -> List[Tuple[int, str, torch.Tensor, int, Dict[str, Any], str]]:
    """(index, name, parameter, variable, group, its options on the ps) in
    torch's order: group by group."""
    out = []
    k = 0
    for g, group in enumerate(opt.param_groups):
        for _ in group["params"]:
            name, p, var = opt.params[k]
            out.append((k, name, p, var, group, opt._group_options[g]))
            k += 1
    return out


def read_state(opt: "Optimizer") -> Dict[int, Dict[str, torch.Tensor]]:
    """torch's "state": per parameter index its slots, pulled from the ps
    tasks, and "step" (the global step). Empty before the first step, as
    torch's is."""
    step = opt.worker.global_step()
    state: Dict[int, Dict[str, torch.Tensor]] = {}
    if step == 0:
        return state
    for k, name, p, var, group, options in _params(opt):
        qname = _qname(options)
        slots, has_step = _keys(qname, group)
        if not slots and not has_step:
            continue
        entry: Dict[str, torch.Tensor] = {}
        if has_step:
            entry["step"] = torch.tensor(float(step), dtype=torch.float32)
        for key, slot in slots.items():
            if slot in _SCALAR:
                entry[key] = torch.from_numpy(opt.worker.pull_slot(var, slot, scalar=True))
                continue
            t = torch.empty(p.shape, dtype=torch.float32)
            opt.worker.pull_slot(var, slot, into=t)
            if qname == "rmsprop" and key == "momentum_buffer":
                t /= float(group["lr"])
            entry[key] = t
        state[k] = entry
    return state


def _tensor(value: Any, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError("load_state_dict: %s is %s, not a tensor" % (what, type(value).__name__))
    return value


def _step(value: Any, what: str) -> int:
    v = float(value.item() if isinstance(value, torch.Tensor) else value)
    if not (v >= 0 and v == int(v)):
        raise ValueError("load_state_dict: %s is %r, not a count of steps" % (what, value))
    return int(v)


def check_state(opt: "Optimizer", state: Any, lrs: List[float]
                ) -> Tuple[Optional[int], List[Tuple[int, str, torch.Tensor]]]:
    """Check a state_dict's "state" against this optimizer whole, changing
    nothing: its step (None if it has none) and the writes to make
    (variable, quorum slot, values), or ValueError / TypeError naming the
    parameter, the key and the problem. lrs: each group's learning rate as
    saved (RMSprop's momentum_buffer was divided by it)."""
    if not isinstance(state, Mapping):
        raise TypeError("load_state_dict: 'state' is %s, not a dict" % type(state).__name__)
    params = _params(opt)
    for k in state:
        if not isinstance(k, int) or not 0 <= k < len(params):
            raise ValueError("load_state_dict: 'state' has an entry for parameter %r; this "
                             "optimizer has parameters 0..%d" % (k, len(params) - 1))
    step: Optional[int] = None
    writes: List[Tuple[int, str, torch.Tensor]] = []
    for k, name, p, var, group, options in params:
        qname = _qname(options)
        entry = state.get(k)
        if entry is None:
            continue  # torch makes a parameter's state at its first gradient: none yet
        if not isinstance(entry, Mapping):
            raise TypeError("load_state_dict: the state of parameter %d ('%s') is %s, not a dict"
                            % (k, name, type(entry).__name__))
        slots, has_step = _keys(qname, group)
        want = set(slots) | ({"step"} if has_step else set())
        where = "parameter %d ('%s')" % (k, name)
        unknown = sorted(set(entry) - want)
        missing = sorted(want - set(entry))
        if unknown or missing:
            raise ValueError(
                "load_state_dict: the state of %s has %s; quorum's %s (%s) keeps %s: a state of "
                "another optimizer, or of other settings?"
                % (where, ", ".join(repr(x) for x in sorted(entry)) or "nothing", qname,
                   options, ", ".join(repr(x) for x in sorted(want)) or "no state"))
        for key in sorted(entry):
            if key == "step":
                s = _step(entry[key], "the step of %s" % where)
                if step is not None and s != step:
                    raise ValueError("load_state_dict: parameters have different steps (%d and "
                                     "%d, at %s): quorum's step is the cluster's, one for all"
                                     % (step, s, where))
                step = s
                continue
            t = _tensor(entry[key], "%s of %s" % (key, where)).detach()
            slot = slots[key]
            shape = torch.Size([1]) if slot in _SCALAR else p.shape
            if t.numel() != shape.numel() or (slot not in _SCALAR and t.shape != shape):
                raise ValueError("load_state_dict: %s of %s has shape %s; the parameter's is %s"
                                 % (key, where, tuple(t.shape), tuple(shape)))
            t = t.to("cpu", torch.float32).reshape(-1).contiguous()
            if not bool(torch.isfinite(t).all()):
                raise ValueError("load_state_dict: %s of %s holds a NaN or an infinity"
                                 % (key, where))
            if qname == "rmsprop" and key == "momentum_buffer":
                # TensorFlow's buffer holds the lr
                t = t * lrs[next(g for g, gr in enumerate(opt.param_groups) if gr is group)]
            writes.append((var, slot, t))
    return step, writes


def write_state(opt: "Optimizer", step: Optional[int],
                writes: List[Tuple[int, str, torch.Tensor]]) -> None:
    """The chief: the step first, then each parameter's values as the
    module holds them now (a model.load_state_dict just before reaches the
    ps so), then the slots. The step is set on a new cluster (global step
    0), so that Adam's bias correction goes on from the saved step. A
    cluster that has trained past the saved step (the state of this run,
    reloaded midway while other workers push) keeps its own step, the
    cluster's count of updates, which cannot move back under pushes in
    flight; a state of a later step than a cluster already training is
    refused (the ps says so) before anything changes."""
    if step is not None:
        at = opt.worker.global_step()
        if at == 0 or step > at:
            opt.worker.set_step(step)  # refused if the cluster trained meanwhile
        elif step < at:
            _log.info("load_state_dict: the cluster is at global step %d, the state is of step "
                      "%d: the values and slots are loaded, the step stays %d", at, step, at)
    for _, p, var in opt.params:
        opt.worker.set_slot(var, "", p.detach().cpu())  # a GPU one through the host
    for var, slot, values in writes:
        opt.worker.set_slot(var, slot, values)

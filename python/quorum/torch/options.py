"""torch.optim's names and hyper-parameters as quorum's per-variable
optimizer options ("optimizer=adam,lr=0.01,beta1=0.9"), which the
optimizer declares with each parameter group's variables. A torch
optimizer's defaults are its own (read from its signature), so a group
means on the ps what it means in torch. Where the two differ in a detail,
docs/PYTHON.md says; what quorum cannot do is refused, naming it."""

from __future__ import annotations

import inspect
from typing import Any, Dict, Mapping, Tuple, Union

import torch

__all__ = ["resolve", "group_options", "HYPER", "setting_value", "group_lr"]

# torch.optim names (and quorum's own) -> quorum's optimizers.
_NAMES = {"sgd": "sgd", "adam": "adam", "adamw": "adamw", "adagrad": "adagrad",
          "rmsprop": "rmsprop", "adamasync": "adam_async", "adam_async": "adam_async",
          "ftrl": "ftrl", "momentum": "momentum"}
_TORCH = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
          "adagrad": torch.optim.Adagrad, "rmsprop": torch.optim.RMSprop}
# Where quorum's default is not torch's and torch's cannot be had: Adagrad's
# accumulator must start above 0 (TensorFlow's 0.1; torch's 0 would divide by 0).
_OWN_DEFAULTS: Dict[str, Dict[str, Any]] = {"adagrad": {"initial_accumulator_value": 0.1}}
# quorum's own settings, passed as they are (the optimizers torch lacks).
_PASSED = ("l1", "l2", "lr_power", "beta1", "beta2", "epsilon", "decay",
           "apply_sparse_rmsprop", "initial_accumulator")
# torch settings quorum cannot honour but at their default: name -> defaults.
_ONLY_DEFAULT: Dict[str, Tuple[Any, ...]] = {
    "amsgrad": (False,), "maximize": (False,), "foreach": (None, False), "fused": (None, False),
    "capturable": (False,), "differentiable": (False,), "dampening": (0,), "lr_decay": (0,)}
# The options each of quorum's optimizers takes (src/optim/*.c, .keys),
# with weight-decay for all five of torch's.
_KEYS = {"sgd": {"lr", "weight-decay"},
         "momentum": {"lr", "momentum", "nesterov", "weight-decay"},
         "adam": {"lr", "beta1", "beta2", "epsilon", "nesterov", "weight-decay"},
         "adamw": {"lr", "beta1", "beta2", "epsilon", "weight-decay"},
         "adagrad": {"lr", "initial-accumulator", "weight-decay"},
         "rmsprop": {"lr", "decay", "momentum", "epsilon", "centered", "weight-decay"}}
# Every hyper-parameter name a group may hold (the rest of a constructor's
# keyword arguments are the worker's options).
HYPER = frozenset({"lr", "momentum", "nesterov", "betas", "eps", "alpha", "centered",
                   "initial_accumulator_value", "weight_decay", "decoupled_weight_decay"}
                  | set(_PASSED) | set(_ONLY_DEFAULT))


def resolve(optimizer: Union[str, type]) -> Tuple[str, str, Dict[str, Any]]:
    """(its name as given, quorum's optimizer, the defaults of a group)."""
    if isinstance(optimizer, str):
        name = optimizer
    elif isinstance(optimizer, type):
        name = optimizer.__name__
    else:
        raise TypeError("optimizer: a name or a torch.optim class, not %r" % (optimizer,))
    key = name.lower().replace("-", "_")
    if key not in _NAMES:
        raise ValueError("optimizer %r: quorum has SGD, Adam, AdamW, Adagrad, RMSprop, "
                         "AdamAsync, FTRL" % (name,))
    defaults: Dict[str, Any] = {}
    cls = _TORCH.get(key)
    if cls is not None:
        for p in list(inspect.signature(cls).parameters.values())[1:]:
            if p.default is not inspect.Parameter.empty:
                defaults[p.name] = p.default
        defaults.update(_OWN_DEFAULTS.get(key, {}))
        if key == "adamw":  # in torch's AdamW groups, though not in its signature
            defaults["decoupled_weight_decay"] = True
    else:  # quorum's own: its lr (the rest stays quorum's unless given)
        defaults["lr"] = {"momentum": 0.05}.get(_NAMES[key], 0.001)
    return name, _NAMES[key], defaults


def check_keys(name: str, qname: str, defaults: Mapping[str, Any], given: Mapping[str, Any]) -> None:
    """Refuse a setting that optimizer does not have (a torch one's are its
    signature's)."""
    for k in given:
        if k in ("params", "param_names"):
            continue
        if k not in HYPER:
            raise ValueError("%s: unknown setting %r" % (name, k))
        if qname in ("sgd", "momentum", "adam", "adamw", "adagrad", "rmsprop") and \
                k not in defaults and k not in _PASSED:
            raise ValueError("%s: option %r is not one of %s's (%s)"
                             % (name, k, name, ", ".join(sorted(defaults))))


def group_options(name: str, qname: str, group: Mapping[str, Any]) -> str:
    """The per-variable options string of a parameter group (its keys that
    are hyper-parameters; a scheduler's own, initial_lr and the like, are
    not)."""
    opt = qname
    if group.get("decoupled_weight_decay"):
        opt = "adamw"  # torch's Adam(decoupled_weight_decay=True) is AdamW
    out: Dict[str, Any] = {}
    for k, v in group.items():
        if k not in HYPER or k == "decoupled_weight_decay":
            continue
        if isinstance(v, torch.Tensor):
            v = v.item()
        if k in _ONLY_DEFAULT:
            if v not in _ONLY_DEFAULT[k] or (k == "dampening" and v):
                raise ValueError("%s: %s=%r is not supported by quorum's %s (only %s)"
                                 % (name, k, v, opt, " or ".join(repr(d) for d in
                                                                  _ONLY_DEFAULT[k])))
        elif k == "lr":
            out["lr"] = float(v)
        elif k == "momentum":
            if opt == "sgd" and v:
                opt = "momentum"
            if v or opt != "sgd":
                out["momentum"] = v
        elif k == "nesterov":
            out["nesterov"] = bool(v)
        elif k == "betas":
            b1, b2 = v
            out["beta1"], out["beta2"] = float(b1), float(b2)
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
        elif k == "weight_decay":
            if v or opt == "adamw":  # adamw's own default may not be 0: always said
                out["weight-decay"] = v
        elif k in _PASSED:
            out[k.replace("_", "-")] = v
        else:
            raise ValueError("%s: option %r is not supported by quorum's %s" % (name, k, opt))
    if opt == "momentum" and not out.get("momentum"):
        opt = "sgd"  # a momentum group whose momentum a scheduler set to 0
    keys = _KEYS.get(opt)
    for k in [k for k in out if keys is not None and k not in keys]:
        if out[k]:  # each optimizer takes only its own keys: an unused one at 0 goes
            raise ValueError("%s: %s=%r has no meaning for quorum's %s"
                             % (name, k.replace("-", "_"), out[k], opt))
        del out[k]
    items = ["optimizer=%s" % opt] + ["%s=%s" % (k, str(v).lower() if isinstance(v, bool)
                                                 else v) for k, v in out.items()]
    return ",".join(items)


def setting_value(v: Any) -> Any:
    """A group's setting as compared between steps (a tensor by its value)."""
    if isinstance(v, torch.Tensor):
        return v.item()
    if isinstance(v, list):
        return tuple(setting_value(x) for x in v)
    return v


def group_lr(group: Dict[str, Any], g: int) -> float:
    """A group's lr (a float or a one-element tensor, as torch allows),
    checked: the ps tasks apply it as it is."""
    lr = group["lr"]
    try:
        value = float(lr.item() if isinstance(lr, torch.Tensor) else lr)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError("param_groups[%d]: lr=%r is not a number" % (g, lr)) from None
    if not value >= 0 or value == float("inf"):
        raise ValueError("param_groups[%d]: lr=%r: the ps tasks take a finite learning rate "
                         ">= 0" % (g, lr))
    return value

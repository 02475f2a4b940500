"""torch.optim's names and hyper-parameters as quorum's per-variable
optimizer options ("optimizer=adam,lr=0.01,beta1=0.9"), which the
optimizer declares with each parameter. Where the two differ in a detail,
docs/PYTHON.md says."""

from __future__ import annotations

from typing import Any, Dict, Union

# torch.optim names -> quorum's optimizers.
_NAMES = {"sgd": "sgd", "adam": "adam", "adagrad": "adagrad", "rmsprop": "rmsprop",
          "adamasync": "adam_async", "adam_async": "adam_async", "ftrl": "ftrl",
          "momentum": "momentum"}


def optimizer_options(optimizer: Union[str, type], hyper: Dict[str, Any]) -> str:
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

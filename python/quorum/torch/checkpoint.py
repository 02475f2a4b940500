"""A quorum checkpoint (safetensors shards, docs/CHECKPOINTS.md) read back
as torch tensors: ``checkpoint_state_dict`` gives them by name,
``load_checkpoint`` loads them into a module's parameters and buffers."""

from __future__ import annotations

import glob
import os
from typing import Dict, List

import torch

__all__ = ["checkpoint_state_dict", "load_checkpoint"]


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
    """Load a quorum checkpoint's values into module's parameters and
    buffers (by name; a buffer in its own dtype and shape: the ps keeps
    them as float32, a scalar as one element); the names loaded. strict:
    every parameter and persistent buffer must be in the checkpoint (one
    trained with buffers="local" has none: strict=False loads the rest)."""
    state = checkpoint_state_dict(path)
    own = dict(module.named_parameters())
    persistent = set(module.state_dict().keys())
    buffers = {n: b for n, b in module.named_buffers() if b is not None}
    missing = [n for n in own if n not in state] + \
        [n for n in buffers if n in persistent and n not in state]
    if strict and missing:
        raise KeyError("not in the checkpoint: %s" % ", ".join(missing))
    loaded = []
    with torch.no_grad():
        for name, p in own.items():
            if name in state:
                if tuple(state[name].shape) != tuple(p.shape):
                    raise ValueError("%s: shape %s in the checkpoint, %s in the module"
                                     % (name, tuple(state[name].shape), tuple(p.shape)))
                p.copy_(state[name])
                loaded.append(name)
        for name, b in buffers.items():
            if name in state:
                t = state[name]
                if t.numel() != b.numel():
                    raise ValueError("buffer %s: %d values in the checkpoint, %d in the module"
                                     % (name, t.numel(), b.numel()))
                b.copy_(t.reshape(b.shape))
                loaded.append(name)
    return loaded

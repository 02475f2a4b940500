"""A quorum checkpoint (safetensors shards, docs/CHECKPOINTS.md) read back
as torch tensors: ``checkpoint_state_dict`` gives them by name,
``load_checkpoint`` loads them into a module's parameters and buffers. An
incremental checkpoint is merged from its chain (the full checkpoint it
starts from, then each increment in order), shard by shard, as the ps's
own restore does."""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Dict, List, Set, Tuple

import numpy as np
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


Arrays = Dict[str, Any]  # tensor name -> numpy array


def _manifest(folder: str) -> Dict[str, Any]:
    with open(os.path.join(folder, "manifest.json")) as f:
        m: Dict[str, Any] = json.load(f)
    return m


def _chain(folder: str) -> List[Tuple[str, Dict[str, Any]]]:
    """The checkpoint folders that make `folder`: its full checkpoint, then
    each increment in order. A missing or foreign base raises ValueError
    naming it: a partial chain is never read."""
    links = [(folder, _manifest(folder))]
    while links[-1][1].get("kind") == "incremental":
        later_path, later = links[-1]
        base = os.path.join(os.path.dirname(os.path.abspath(later_path)),
                            "ckpt-%010d" % later["base_step"])
        if not os.path.exists(os.path.join(base, "manifest.json")):
            raise ValueError("%s is an increment of step %d, whose checkpoint %s is missing"
                             % (later_path, later["base_step"], base))
        m = _manifest(base)
        if (m.get("incarnation"), m.get("checkpoint_id")) != \
                (later["incarnation"], later["base_checkpoint_id"]):
            raise ValueError("%s is not the base that %s names" % (base, later_path))
        links.append((base, m))
    return links[::-1]


def _record_tensors(rec: Dict[str, Any]) -> Set[str]:
    name: str = rec["name"]
    names = {name} | set(rec.get("slots", {}))
    if "average" in rec:
        names.add(rec["average"])
    if "table" in rec:
        names |= {name + "/" + k for k in ("ids", "admission_ids", "admission_counts",
                                           "update_steps", "removed_ids")}
    return names


def _merge_table(state: Arrays, inc: Arrays, rec: Dict[str, Any]) -> None:
    """An increment's rows of one table onto the merged state: the ids it
    removed go, its rows replace or join, its candidates' counts replace."""
    name = rec["name"]
    new_ids = inc[name + "/ids"]
    removed = inc.get(name + "/removed_ids", np.zeros(0, np.int64))
    keep = ~np.isin(state[name + "/ids"], np.concatenate([removed, new_ids]))
    per_row = [name, name + "/ids"] + [s for s in rec["slots"] if inc[s].ndim == 2]
    if name + "/update_steps" in inc:
        per_row.append(name + "/update_steps")
    for t in per_row:
        state[t] = np.concatenate([state[t][keep], inc[t]])
    for s in rec["slots"]:
        if inc[s].ndim != 2:
            state[s] = inc[s]
    if name + "/admission_ids" in inc:
        cand = state.get(name + "/admission_ids", np.zeros(0, np.int64))
        counts = state.get(name + "/admission_counts", np.zeros(0, np.int64))
        stay = ~np.isin(cand, np.concatenate([removed, new_ids, inc[name + "/admission_ids"]]))
        state[name + "/admission_ids"] = np.concatenate([cand[stay],
                                                         inc[name + "/admission_ids"]])
        state[name + "/admission_counts"] = np.concatenate([counts[stay],
                                                            inc[name + "/admission_counts"]])


def _merged_shards(folder: str) -> List[Arrays]:
    """Each shard's tensors, its chain merged (numpy arrays)."""
    from safetensors import safe_open
    from safetensors.numpy import load_file

    chain = _chain(folder)
    shards: List[Arrays] = []
    for k in range(int(chain[-1][1]["num_shards"])):
        state: Arrays = dict(load_file(os.path.join(chain[0][0],
                                                    chain[0][1]["shards"][k]["file"])))
        for link, m in chain[1:]:
            file = os.path.join(link, m["shards"][k]["file"])
            inc: Arrays = dict(load_file(file))
            with safe_open(file, "np") as f:
                records = json.loads(f.metadata()["quorum.variables"])
            for rec in records:
                if rec.get("table", {}).get("delta"):
                    _merge_table(state, inc, rec)
                    continue
                for t in _record_tensors(rec):  # written whole: replaces the base's
                    state.pop(t, None)
                    if t in inc:
                        state[t] = inc[t]
            for t in ("global_step", "quorum/applied_steps", "quorum/worker_data_position"):
                if t in inc:
                    state[t] = inc[t]
        shards.append(state)
    return shards


def checkpoint_state_dict(path: str) -> Dict[str, torch.Tensor]:
    """The tensors of a quorum checkpoint (a checkpoint folder, or a
    checkpoint directory: its newest): dense variables by name, their
    partitioned shards (NAME/part_K) joined; tables as NAME (rows) and
    NAME/ids; optimizer slots as NAME/SLOT. An incremental checkpoint is
    merged from its chain; a broken chain raises ValueError."""
    folder = _newest(path)
    tensors: Dict[str, torch.Tensor] = {}
    for shard in _merged_shards(folder):
        tensors.update({n: torch.from_numpy(np.require(a, requirements="C"))
                        for n, a in shard.items()})
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

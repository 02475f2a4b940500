#!/usr/bin/env python3
"""read_checkpoint.py - read a quorum checkpoint with the safetensors
library and NumPy alone, and (with --torch) load it into a PyTorch model.

    python3 examples/read_checkpoint.py CKPT_DIR            # the newest complete one
    python3 examples/read_checkpoint.py CKPT_DIR --torch    # and into torch.nn

A checkpoint is a folder DIR/ckpt-<global step>/ with one safetensors file
per ps task and a manifest.json written last (docs/CHECKPOINTS.md). This
script checks every shard against the manifest (size and zlib crc32), then
prints each variable with its shape and optimizer slots. With --torch, a
checkpoint of the MLP that `quorum train` / `quorum launch` trains
(layer<i>/weights of shape [in, out] and layer<i>/bias) is built as a
torch.nn.Sequential (ReLU between layers), its weights loaded with
strict=True (quorum's weights are [in, out], torch's Linear wants [out, in]:
transposed), and run forward; any other checkpoint (one `quorum.torch`
wrote: variables named as the module's parameters, such as "0.weight")
becomes the module's state dict, partitioned shards (NAME/part_K) joined
and optimizer slots left out, which --save FILE writes with torch.save for
`model.load_state_dict(torch.load(FILE))`.

    python3 examples/read_checkpoint.py CKPT_DIR --torch --save model.pt

An incremental checkpoint (its manifest's "kind": "incremental") holds only
what changed since its base; this script follows the chain back to the full
checkpoint it starts from, checks every link, and merges the increments in
order, shard by shard: the full state, as quorum's own restore builds it.
--merge OUT writes that state as a full checkpoint folder OUT (one
safetensors file per shard and a manifest): read it back with
safetensors.numpy.load_file, or name it DIR/ckpt-<step> for `quorum ckpt
verify` and a restore.

    python3 examples/read_checkpoint.py CKPT_DIR --merge merged/ckpt-0000001200
"""

import argparse
import glob
import json
import os
import re
import sys
import zlib

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file


def newest_complete(folder):
    done = [c for c in sorted(glob.glob(os.path.join(folder, "ckpt-*")))
            if os.path.exists(os.path.join(c, "manifest.json"))]
    if not done:
        sys.exit("no complete checkpoint in %s" % folder)
    return done[-1]


def read_manifest(path):
    with open(os.path.join(path, "manifest.json")) as f:
        return json.load(f)


def read_shard(path, shard):
    """A shard's tensors and header metadata, checked against its manifest entry."""
    file = os.path.join(path, shard["file"])
    with open(file, "rb") as f:
        data = f.read()
    if len(data) != shard["bytes"] or "%08x" % zlib.crc32(data) != shard["crc32"]:
        sys.exit("%s does not match the manifest (size or crc32): corrupt or truncated" % file)
    with safe_open(file, "np") as f:
        meta = f.metadata() or {}
    return load_file(file), meta


def chain_of(path):
    """The folders whose shards make checkpoint `path`: its full checkpoint,
    then each increment in order, `path` last. Every link must be the base
    its successor names (step, ps 0 incarnation, checkpoint id)."""
    chain = [(path, read_manifest(path))]
    while chain[-1][1].get("kind") == "incremental":
        later = chain[-1][1]
        base = os.path.join(os.path.dirname(os.path.abspath(chain[-1][0])),
                            "ckpt-%010d" % later["base_step"])
        if not os.path.exists(os.path.join(base, "manifest.json")):
            sys.exit("%s is an increment of step %d, whose checkpoint %s is missing: the "
                     "chain is broken" % (chain[-1][0], later["base_step"], base))
        m = read_manifest(base)
        if (m.get("incarnation"), m.get("checkpoint_id")) != \
                (later["incarnation"], later["base_checkpoint_id"]):
            sys.exit("%s is not the base that %s names (checkpoint %s/%s): the chain is broken"
                     % (base, chain[-1][0], later["incarnation"], later["base_checkpoint_id"]))
        chain.append((base, m))
    return chain[::-1]


def record_tensors(rec):
    """The tensor names of one variable's record (quorum.variables)."""
    name = rec["name"]
    names = {name} | set(rec.get("slots", {}))
    if "average" in rec:
        names.add(rec["average"])
    if "table" in rec:
        names |= {name + "/" + k for k in ("ids", "admission_ids", "admission_counts",
                                           "update_steps", "removed_ids")}
    return names


def merge_table(state, inc, rec):
    """An incremental table record onto the merged state: the removed ids go,
    the rows it holds replace or join, its candidates' counts replace."""
    name = rec["name"]
    ids = state[name + "/ids"]
    new_ids = inc[name + "/ids"]
    removed = inc.get(name + "/removed_ids", np.zeros(0, np.int64))
    keep = ~np.isin(ids, np.concatenate([removed, new_ids]))
    per_row = [name] + [s for s in rec["slots"] if inc[s].ndim == 2]
    if name + "/update_steps" in inc:
        per_row.append(name + "/update_steps")
    for t in per_row:
        state[t] = np.concatenate([state[t][keep], inc[t]])
    state[name + "/ids"] = np.concatenate([ids[keep], new_ids])
    for s in rec["slots"]:  # per-variable scalar slots
        if inc[s].ndim != 2:
            state[s] = inc[s]
    if name + "/admission_ids" in inc:
        cand = state.get(name + "/admission_ids", np.zeros(0, np.int64))
        counts = state.get(name + "/admission_counts", np.zeros(0, np.int64))
        gone = np.concatenate([removed, new_ids, inc[name + "/admission_ids"]])
        stay = ~np.isin(cand, gone)
        state[name + "/admission_ids"] = np.concatenate([cand[stay],
                                                         inc[name + "/admission_ids"]])
        state[name + "/admission_counts"] = np.concatenate([counts[stay],
                                                            inc[name + "/admission_counts"]])


def merge_increment(state, records, inc, inc_meta):
    """Apply one incremental shard (tensors inc, header inc_meta) to a shard's
    merged state (tensors) and its variable records (by name)."""
    for rec in json.loads(inc_meta["quorum.variables"]):
        table = rec.get("table", {})
        if table.get("delta"):
            if rec["name"] not in records:
                sys.exit("an increment changes table %s, which its base does not hold"
                         % rec["name"])
            merge_table(state, inc, rec)
            table = dict(table, rows=int(state[rec["name"] + "/ids"].shape[0]))
            del table["delta"]
            rec = dict(rec, table=table)
        else:  # written whole: replaces the base's
            for t in record_tensors(records.get(rec["name"], rec)) | record_tensors(rec):
                state.pop(t, None)
            for t in record_tensors(rec):
                if t in inc:
                    state[t] = inc[t]
        records[rec["name"]] = rec
    for t in ("global_step", "quorum/applied_steps", "quorum/worker_data_position"):
        if t in inc:
            state[t] = inc[t]


def read_chain(path):
    """The manifest of checkpoint `path` and, per shard, its full state merged
    from its chain: [(tensors, header metadata with merged records)]."""
    chain = chain_of(path)
    manifest = chain[-1][1]
    shards = []
    for k in range(manifest["num_shards"]):
        state, meta = read_shard(chain[0][0], chain[0][1]["shards"][k])
        records = {r["name"]: r for r in json.loads(meta["quorum.variables"])}
        for folder, m in chain[1:]:
            inc, meta = read_shard(folder, m["shards"][k])
            merge_increment(state, records, inc, meta)
        meta = dict(meta, kind="full", version="2",
                    **{"quorum.variables": json.dumps(list(records.values()))})
        meta.pop("base_checkpoint_id", None)
        shards.append((state, meta))
    return manifest, shards


def write_merged(out, manifest, shards):
    """The merged state as a full checkpoint folder `out`."""
    os.makedirs(out, exist_ok=True)
    entries = []
    for k, (state, meta) in enumerate(shards):
        file = "shard-%05d-of-%05d.safetensors" % (k, len(shards))
        save_file({n: np.require(a, requirements="C") for n, a in state.items()},  # keeps 0-d
                  os.path.join(out, file), metadata=meta)
        with open(os.path.join(out, file), "rb") as f:
            data = f.read()
        entries.append({"file": file, "bytes": len(data), "crc32": "%08x" % zlib.crc32(data),
                        "variables": len(json.loads(meta["quorum.variables"]))})
    full = {k: v for k, v in manifest.items()
            if k not in ("base_step", "base_checkpoint_id", "full_step")}
    full.update(version=2, kind="full", shards=entries)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(full, f, indent=2)
        f.write("\n")


def read_checkpoint(path):
    """{tensor name: numpy array} of every shard, checked against the manifest
    (an incremental checkpoint merged from its chain)."""
    manifest, shards = read_chain(path)
    tensors = {}
    for state, _ in shards:
        for name, array in state.items():
            if name in ("global_step", "quorum/applied_steps") and name in tensors:
                continue  # the same in every shard
            tensors[name] = array
    return manifest, tensors


PART = re.compile(r"^(.+)/part_(\d+)$")


def model_variables(tensors):
    """{name: array} of the model's variables: partitioned shards (NAME/part_K)
    joined, without optimizer slots or averages (NAME/SLOT), embedding ids
    (NAME/ids), the global step or quorum's own records (quorum/...)."""
    parts, whole = {}, {}
    for name, array in tensors.items():
        m = PART.match(name)
        if m:
            parts.setdefault(m.group(1), {})[int(m.group(2))] = array
        else:
            whole[name] = array
    for base, shards in parts.items():
        whole[base] = np.concatenate([shards[k] for k in sorted(shards)])
    return {n: a for n, a in whole.items()
            if n != "global_step" and not n.startswith("quorum/")
            and not ("/" in n and (n.rsplit("/", 1)[0] in whole or n.rsplit("/", 1)[0] in tensors))}


def module_state_dict(tensors, save):
    """A quorum.torch checkpoint as the module's state dict (saved to `save`)."""
    import torch

    state = {n: torch.from_numpy(np.ascontiguousarray(a))
             for n, a in sorted(model_variables(tensors).items())}
    if not state:
        sys.exit("no model variables in this checkpoint")
    print("torch: a state dict of %d tensors named as the module's (quorum.torch): %s"
          % (len(state), ", ".join(state)))
    if save:
        torch.save(state, save)
        print("torch: saved to %s: model.load_state_dict(torch.load(%r))" % (save, save))
    return state


def to_torch(tensors, save=None):
    import torch

    layers = sorted({int(n.split("/")[0][5:]) for n in tensors if n.startswith("layer")
                     and n.endswith("/weights")})
    if not layers:  # not quorum's own MLP
        return module_state_dict(tensors, save)
    modules, state = [], {}
    for k, i in enumerate(layers):
        w = tensors["layer%d/weights" % i]  # [in, out]
        modules.append(torch.nn.Linear(w.shape[0], w.shape[1]))
        state["%d.weight" % (2 * k)] = torch.from_numpy(np.ascontiguousarray(w.T))
        state["%d.bias" % (2 * k)] = torch.from_numpy(tensors["layer%d/bias" % i])
        if k + 1 < len(layers):
            modules.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*modules)
    model.load_state_dict(state, strict=True)
    x = torch.zeros(1, modules[0].in_features)
    print("torch: loaded %d layers (strict); a forward pass gives %d logits"
          % (len(layers), model(x).shape[1]))
    if save:
        torch.save(model.state_dict(), save)
        print("torch: saved to %s" % save)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="the --checkpoint-dir, or one ckpt-* folder in it")
    ap.add_argument("--torch", action="store_true",
                    help="load it into a torch.nn MLP (quorum's own) or a state dict (quorum.torch)")
    ap.add_argument("--save", metavar="FILE", help="with --torch: torch.save the state dict to FILE")
    ap.add_argument("--merge", metavar="OUT",
                    help="write the checkpoint's full state (its chain merged) as a full "
                         "checkpoint folder OUT")
    a = ap.parse_args()
    if a.save and not a.torch:
        ap.error("--save FILE needs --torch")
    path = a.folder if os.path.exists(os.path.join(a.folder, "manifest.json")) \
        else newest_complete(a.folder)
    manifest, tensors = read_checkpoint(path)
    chain = "full" if manifest.get("kind", "full") == "full" else \
        "incremental, merged from the full checkpoint of step %d" % manifest["full_step"]
    print("%s: global step %d, %s mode, %d shard(s), %s"
          % (path, manifest["global_step"], manifest["mode"], manifest["num_shards"], chain))
    if a.merge:
        write_merged(a.merge, *read_chain(path))
        print("merged: the full state written to %s" % a.merge)
    for name in sorted(tensors):
        t = tensors[name]
        if "/" in name and name.rsplit("/", 1)[0] in tensors:
            continue  # a slot or an average: listed with its variable
        slots = [n.rsplit("/", 1)[1] for n in tensors if n.startswith(name + "/")]
        print("  %-24s %-8s %-14s %s" % (name, t.dtype, list(t.shape),
                                         "slots: " + ", ".join(sorted(slots)) if slots else ""))
    if a.torch:
        to_torch(tensors, a.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())

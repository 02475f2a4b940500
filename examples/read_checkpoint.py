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
"""

import argparse
import glob
import json
import os
import re
import sys
import zlib

import numpy as np
from safetensors.numpy import load_file


def newest_complete(folder):
    done = [c for c in sorted(glob.glob(os.path.join(folder, "ckpt-*")))
            if os.path.exists(os.path.join(c, "manifest.json"))]
    if not done:
        sys.exit("no complete checkpoint in %s" % folder)
    return done[-1]


def read_checkpoint(path):
    """{tensor name: numpy array} of every shard, checked against the manifest."""
    with open(os.path.join(path, "manifest.json")) as f:
        manifest = json.load(f)
    tensors = {}
    for shard in manifest["shards"]:
        file = os.path.join(path, shard["file"])
        with open(file, "rb") as f:
            data = f.read()
        if len(data) != shard["bytes"] or "%08x" % zlib.crc32(data) != shard["crc32"]:
            sys.exit("%s does not match the manifest (size or crc32): corrupt or truncated" % file)
        for name, array in load_file(file).items():
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
    a = ap.parse_args()
    if a.save and not a.torch:
        ap.error("--save FILE needs --torch")
    path = a.folder if os.path.exists(os.path.join(a.folder, "manifest.json")) \
        else newest_complete(a.folder)
    manifest, tensors = read_checkpoint(path)
    print("%s: global step %d, %s mode, %d shard(s)"
          % (path, manifest["global_step"], manifest["mode"], manifest["num_shards"]))
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

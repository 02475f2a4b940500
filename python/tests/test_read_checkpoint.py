"""examples/read_checkpoint.py --torch on a checkpoint quorum.torch wrote
(variables named as the module's parameters, no layer<i>/weights): it once
failed with IndexError; it now gives the module's state dict, which loads
into the same module with strict=True and equals the trained one's."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
EXAMPLE = os.path.join(ROOT, "examples", "read_checkpoint.py")
QUORUM = (shutil.which("quorum") or shutil.which("quorum", path=os.path.dirname(sys.executable))
          or "quorum")

# A worker trains a small MLP with quorum.torch (Adam: slots in the
# checkpoint) and saves its own state dict; when it is done, ps 0 writes the
# final checkpoint (the values after the last step, which the worker pulled).
TRAIN = r"""
import sys, torch, quorum.torch as qt
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
opt = qt.Optimizer(model, "Adam", lr=0.01)
X, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
for i in range(20):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(X), y).backward()
    opt.step()
torch.save(model.state_dict(), sys.argv[1])
"""


def test_torch_checkpoint_loads_into_its_module(tmp_path):  # type: ignore[no-untyped-def]
    ckpt, trained, saved = tmp_path / "ckpt", tmp_path / "trained.pt", tmp_path / "saved.pt"
    p = subprocess.run([QUORUM, "launch", "--ps", "2", "--workers", "1", "--checkpoint-dir",
                        str(ckpt), "--", sys.executable, "-c", TRAIN, str(trained)],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    r = subprocess.run([sys.executable, EXAMPLE, str(ckpt), "--torch", "--save", str(saved)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "a state dict of 4 tensors" in r.stdout, r.stdout
    state = torch.load(str(saved))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model.load_state_dict(state, strict=True)  # every parameter, no slot, no extra
    want = torch.load(str(trained))
    for name, value in model.state_dict().items():
        assert torch.equal(value, want[name]), name


def test_model_variables_joins_parts_and_leaves_slots_out() -> None:
    spec = importlib.util.spec_from_file_location("read_checkpoint", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    a, b = np.ones((2, 3), np.float32), np.zeros((1, 3), np.float32)
    tensors = {"w/part_1": b, "w/part_0": a, "w/part_0/Adam": a, "w/part_1/Adam": b,
               "bias": a[0], "bias/Adam": a[0], "table": a, "table/ids": np.arange(2),
               "global_step": np.int64(3), "quorum/applied_steps": np.int64(3)}
    got = example.model_variables(tensors)
    assert sorted(got) == ["bias", "table", "w"], sorted(got)
    assert np.array_equal(got["w"], np.concatenate([a, b]))

"""A worker program with BatchNorm: a small classifier on a seeded
synthetic data set, trained with quorum.torch and its data split by
qt.DistributedSampler. Usage: bn_buffers.py BUFFERS OUT (BUFFERS: chief or
average). Each worker records, at every step, its BatchNorm buffers
before the push (its own forward's) and after the step (as the cluster
left them), and at the end its module's state_dict and its accuracy on
the test set; the chief then takes a checkpoint. Everything goes to
OUT.TASK.pt. Run by `quorum launch --checkpoint-dir DIR`
(tests/test_torch_buffers.py)."""

import os
import sys
import time
from typing import Dict, List, Tuple

import torch

import quorum
import quorum.torch as qt

FEATURES, CLASSES = 6, 3


def data(n: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g) * 3 + 1
    y = (x[:, 0] + x[:, 1] > x[:, 2] * 0.5 + 2).long() + (x[:, 3] > 2).long()
    return x, y


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.BatchNorm1d(16),
                               torch.nn.ReLU(), torch.nn.Linear(16, CLASSES))


def accuracy(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    m.eval()
    with torch.no_grad():
        return float((m(x).argmax(1) == y).float().mean())


def bn(m: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in m.state_dict().items()
            if k.startswith("1.") and not k.endswith(("weight", "bias"))}


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode, out = sys.argv[1], sys.argv[2]
    rank, _ = qt.worker_rank()
    x, y = data(256, 1)
    ds = torch.utils.data.TensorDataset(x, y)
    sampler = qt.DistributedSampler(ds, shuffle=True, seed=3)
    loader = torch.utils.data.DataLoader(ds, batch_size=16, sampler=sampler)
    net = model()
    opt = qt.Optimizer(net, "SGD", lr=0.05, buffers=mode, sampler=sampler)
    before: List[Dict[str, torch.Tensor]] = []
    after: List[Dict[str, torch.Tensor]] = []
    steps: List[int] = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            net.train()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(xb), yb).backward()
            before.append(bn(net))
            steps.append(opt.step())
            after.append(bn(net))
    tx, ty = data(512, 2)
    result = {"task": rank, "before": before, "after": after, "steps": steps,
              "state": {k: v.clone() for k, v in net.state_dict().items()},
              "accuracy": accuracy(net, tx, ty)}
    if rank == 0:
        # An async checkpoint whose cut a slow push held up past its wait
        # is given up ("no checkpoint rather than a torn one"): ask again.
        for attempt in range(3):
            try:
                result["checkpoint_step"] = opt.checkpoint()
                break
            except quorum.QuorumError as e:
                if attempt == 2 or "was not written" not in str(e):
                    raise
    torch.save(result, "%s.%d.pt.part" % (out, rank))
    os.rename("%s.%d.pt.part" % (out, rank), "%s.%d.pt" % (out, rank))
    # The others finish after the chief's checkpoint: in sync mode the run
    # ends once too few workers are left for a step.
    for _ in range(600):
        if rank == 0 or os.path.exists("%s.0.pt" % out):
            break
        time.sleep(0.1)
    opt.close()

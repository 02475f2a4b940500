"""A worker program whose workers have uneven data, as a script that goes
through its own shard does: worker k takes 10 * (k + 1) steps of a small
torch model with quorum.torch, then ends (close() says it has finished).
Prints one JSON line: its task, its step() calls, the global step it saw
last, and should_stop. Run by `quorum launch` or with TF_CONFIG by hand."""

import json

import torch

import quorum.torch as qt

rank, _ = qt.worker_rank()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = qt.Optimizer(model, "SGD", lr=0.05)
gen = torch.Generator().manual_seed(rank)
calls = 0
for _ in range(10 * (rank + 1)):
    x = torch.randn(16, 4, generator=gen)
    y = x.sum(1, keepdim=True)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    calls += 1
print(json.dumps({"task": rank, "calls": calls, "global_step": opt.global_step,
                  "should_stop": opt.should_stop}), flush=True)
opt.close()

"""A worker program that dies once: 3 epochs of a seeded data set split
by qt.DistributedSampler (given to the optimizer, so its position rides on
every push), 6 batches per worker and epoch. Worker 1 kills itself with
SIGKILL after its 8th step the first time it runs (the marker file MARKER
says it did); `quorum launch --max-restarts 1` starts it again, and its
sampler resumes where its last push that counted left it. With GO, worker
1 writes GO.ready after its 8th step and waits for the file GO before it
kills itself (the test kills ps 0 meanwhile: every push of its first run
went to ps 0, and the restarted worker starts after ps 0's failover). Usage: restart_torch.py MARKER [GO]. Prints one JSON line per worker: its task, the
global step it saw last, its step() calls and its restored position
(tests/test_torch_buffers.py)."""

import json
import os
import signal
import sys
import time

import torch

import quorum.torch as qt

torch.set_num_threads(1)
marker = sys.argv[1]
go = sys.argv[2] if len(sys.argv) > 2 else None
rank, _ = qt.worker_rank()
g = torch.Generator().manual_seed(1)
x = torch.randn(96, 4, generator=g)
ds = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
sampler = qt.DistributedSampler(ds, shuffle=True, seed=5)
loader = torch.utils.data.DataLoader(ds, batch_size=8, sampler=sampler)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = qt.Optimizer(model, "SGD", lr=0.05, sampler=sampler)
calls = 0
for epoch in range(3):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
        calls += 1
        if rank == 1 and go and calls == 8 and not os.path.exists(marker):
            open(go + ".ready", "w").close()
            deadline = time.time() + 120
            while not os.path.exists(go) and time.time() < deadline:
                time.sleep(0.05)
        if rank == 1 and calls == 8 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
print(json.dumps({"task": rank, "global_step": opt.global_step, "calls": calls,
                  "restored": opt.data_position}), flush=True)
opt.close()

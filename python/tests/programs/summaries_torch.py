"""A PyTorch job under `quorum launch --logdir ... --metrics-port-base ...`
for test_summaries_torch.py: a linear model, batches of BATCH examples, the
loss given to opt.step(loss=...), a StepLR scheduler, a scalar of its own
(qt.log_scalar). Each worker writes DIR/ready.<rank> after 20 steps and
trains until DIR/stop exists (or STEPS steps), so that the test reads its
metrics page while it trains. Usage: summaries_torch.py DIR STEPS"""

import os
import sys
import time

import torch

import quorum.torch as qt

BATCH = 16
torch.set_num_threads(1)
out, steps = sys.argv[1], int(sys.argv[2])
rank = int(os.environ["RANK"])
torch.manual_seed(rank)
model = torch.nn.Linear(8, 1)
opt = qt.Optimizer(model, torch.optim.SGD, lr=0.05)
true_w = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
for i in range(steps):
    x = torch.randn(BATCH, 8)
    y = x @ true_w
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    qt.log_scalar("my/scalar", float(i))
    opt.step(loss=loss)
    if opt.should_stop:
        break
    if i == 20:
        open(os.path.join(out, "ready.%d" % rank), "w").close()
    if i >= 20 and os.path.exists(os.path.join(out, "stop")):
        break
    time.sleep(0.01)
opt.close()

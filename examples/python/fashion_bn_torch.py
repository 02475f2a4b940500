"""fashion_bn_torch.py and fashion_bn_quorum.py - a PyTorch training
script as users write them, and the same script trained on the ps tier
with quorum.torch; they differ by the lines that
python/tests/test_real_scripts.py counts. A CNN with BatchNorm on
Fashion-MNIST, AdamW with weight decay (none on biases and BatchNorm), a
cosine learning-rate schedule, torch's DistributedSampler (its rank and
size from the environment, which `quorum launch` sets as torchrun does),
and the model, optimizer and scheduler saved with torch.save after the
first epoch and loaded back before the second, as a job resumed from its
checkpoint would. --bf16 runs the forward pass under torch.autocast in
bfloat16.

    python examples/python/fashion_bn_torch.py
    quorum launch --ps 2 --workers 2 -- python examples/python/fashion_bn_quorum.py

The quorum script alone (no launcher) starts a ps in its own process. Both
read the IDX files themselves (Debian's dataset-fashion-mnist package puts
them in /usr/share/datasets/fashion-mnist) and print the test accuracy."""

import argparse
import gzip
import os
import struct
import tempfile
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load(data, split, limit):
    images = read_idx(os.path.join(data, "%s-images-idx3-ubyte.gz" % split))[:limit]
    labels = read_idx(os.path.join(data, "%s-labels-idx1-ubyte.gz" % split))[:limit]
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return TensorDataset(x, torch.from_numpy(labels.astype(np.int64)))


parser = argparse.ArgumentParser()
parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
parser.add_argument("--limit", type=int, default=8000, help="train on the first N images")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--bf16", action="store_true", help="autocast the forward pass to bfloat16")
parser.add_argument("--save", default=os.path.join(tempfile.gettempdir(), "fashion_bn"))
args = parser.parse_args()

train_set, test_set = load(args.data, "train", args.limit), load(args.data, "t10k", 2000)
rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, seed=0)
loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(1, 16, 5, padding=2), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
    torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(16, 32, 5, padding=2), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
    torch.nn.MaxPool2d(2),
    torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 10))
decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
no_decay = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() > 1)]
groups = [{"params": decay, "weight_decay": 1e-2}, {"params": no_decay, "weight_decay": 0.0}]
opt = torch.optim.AdamW(groups, lr=args.lr)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs * len(loader))
checkpoint = "%s-%d.pt" % (args.save, rank)

for epoch in range(args.epochs):
    if epoch == 1:  # resume from what the first epoch saved
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        scheduler.load_state_dict(state["scheduler"])
    sampler.set_epoch(epoch)
    model.train()
    for x, y in loader:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        scheduler.step()
    if epoch == 0:
        torch.save({"model": model.state_dict(), "optim": opt.state_dict(),
                    "scheduler": scheduler.state_dict()}, checkpoint)

model.eval()
with torch.no_grad():
    x, y = test_set.tensors
    accuracy = (model(x).argmax(1) == y).float().mean().item()
os.remove(checkpoint)
# One write for the whole line: the workers share one stdout (launch's or
# torchrun's), and under PYTHONUNBUFFERED print writes the text and its
# newline apart, so two workers' lines could run together.
sys.stdout.write("rank %d: test accuracy %.4f\n" % (rank, accuracy))
sys.stdout.flush()

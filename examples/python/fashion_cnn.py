"""fashion_cnn.py - a small CNN on Fashion-MNIST with PyTorch, trained on
the ps tier with quorum.torch. It reads the IDX files itself (Debian's
dataset-fashion-mnist package puts them in /usr/share/datasets/
fashion-mnist; no download). Meant to run under the launcher, synchronous
with a backup worker: 3 workers, a step made of the first 2 gradients,
the late one dropped (TensorFlow's SyncReplicasOptimizer):

    quorum launch --ps 2 --workers 3 --mode sync --replicas-to-aggregate 2 \\
        -- python examples/python/fashion_cnn.py --limit 12000 --epochs 1

Prints, per worker, its index, the global step, the dropped stale
gradients and the test accuracy."""

import argparse
import gzip
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

import quorum.torch as qt


def read_idx(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    if magic >> 8 != 0x08 or ndim not in (1, 3):
        raise ValueError("%s: not an IDX file of bytes" % path)
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


parser = argparse.ArgumentParser()
parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
parser.add_argument("--limit", type=int, default=0, help="train on the first N images (0: all)")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()
torch.set_num_threads(1)  # several workers share this machine's cores

images = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))
labels = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz"))
test_images = read_idx(os.path.join(args.data, "t10k-images-idx3-ubyte.gz"))[:2000]
test_labels = read_idx(os.path.join(args.data, "t10k-labels-idx1-ubyte.gz"))[:2000]
if args.limit:
    images, labels = images[:args.limit], labels[:args.limit]
X = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
y = torch.from_numpy(labels.astype(np.int64))
Xt = torch.from_numpy(test_images.astype(np.float32) / 255.0).unsqueeze(1)
yt = torch.from_numpy(test_labels.astype(np.int64))

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(1, 8, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(8, 16, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Flatten(), torch.nn.Linear(16 * 7 * 7, 10))
opt = qt.Optimizer(model, "SGD", lr=args.lr, momentum=0.9)
train = qt.shard(torch.arange(len(y)))
for epoch in range(args.epochs):
    order = train[torch.randperm(len(train))]
    for i in range(0, len(order) - 63, 64):
        if opt.should_stop:  # the others finished and too few are left for a step
            break
        batch = order[i:i + 64]
        opt.zero_grad()
        F.cross_entropy(model(X[batch]), y[batch]).backward()
        opt.step()
model.eval()
with torch.no_grad():
    accuracy = (model(Xt).argmax(1) == yt).float().mean().item()
rank, _ = qt.worker_rank()
# One write for the whole line: the workers share one stdout (launch's or
# torchrun's), and under PYTHONUNBUFFERED print writes the text and its
# newline apart, so two workers' lines could run together.
sys.stdout.write("worker %d: global step %d, %d stale gradients dropped, test accuracy %.4f\n"
                 % (rank, opt.global_step, opt.stale, accuracy))
sys.stdout.flush()
opt.close()

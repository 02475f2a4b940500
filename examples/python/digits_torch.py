"""An MLP on the digits set kept in this repository (data/digits.csv.gz)
with PyTorch, SGD, 40 epochs, then the test accuracy. digits_torch.py is a
plain single-process script; digits_quorum.py is the same script made
distributed with quorum, four lines changed (README.md, "From PyTorch"):
    python digits_quorum.py                       # alone: a ps in this process
    quorum launch --ps 2 --workers 2 --mode sync -- python digits_quorum.py
Usage: python digits_torch.py [PATH/TO/digits.csv.gz]"""

import gzip
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "digits.csv.gz")
with gzip.open(path, "rt") as f:
    rows = np.loadtxt(f, delimiter=",", dtype=np.float32)
X, y = torch.from_numpy(rows[:, :64] / 16.0), torch.from_numpy(rows[:, 64]).long()
train, test = torch.arange(0, 1500), torch.arange(1500, len(rows))

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.3)
for epoch in range(40):
    order = train[torch.randperm(len(train))]
    for i in range(0, len(order), 32):
        batch = order[i:i + 32]
        opt.zero_grad()
        F.cross_entropy(model(X[batch]), y[batch]).backward()
        opt.step()
with torch.no_grad():
    accuracy = (model(X[test]).argmax(1) == y[test]).float().mean().item()
print("test accuracy %.4f" % accuracy)

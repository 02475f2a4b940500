"""dlrm_ctr.py - a recommendation model in the DLRM style on click data from
`quorum gen-ctr`: every categorical field's id looks up a row of an
embedding table held by the ps tasks (quorum.torch.Embedding: no fixed
vocabulary, rows made on first use), the pairwise dot products of the
fields' embeddings (DLRM's feature interaction) and the embeddings feed an
MLP, trained asynchronously with AdamAsync, its sparse applies as RMSProp
(apply_sparse_rmsprop). Prints the test AUC beside the generator's hidden
AUC (the best a model can do).

    quorum gen-ctr --out /tmp/ctr --rows 20000 --fields 8
    quorum launch --ps 2 --workers 2 -- python examples/python/dlrm_ctr.py /tmp/ctr"""

import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import quorum.torch as qt


def read_ffm(path: str):  # type: ignore[no-untyped-def]
    labels, ids = [], []
    with open(path) as f:
        for line in f:
            parts = line.split()
            labels.append(float(parts[0]))
            ids.append([int(p.split(":")[1]) for p in parts[1:]])
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(labels).unsqueeze(1)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The area under the ROC curve: the chance a positive outranks a negative."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    pos = labels > 0.5
    npos, nneg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - npos * (npos + 1) / 2) / (npos * nneg))


class DLRM(torch.nn.Module):
    def __init__(self, fields: int, dim: int, hidden: int):
        super().__init__()
        self.embedding = qt.Embedding(dim, init="normal:0,0.05", seed=1)
        self.pairs = torch.triu_indices(fields, fields, offset=1)
        self.top = torch.nn.Sequential(
            torch.nn.Linear(fields * dim + self.pairs.shape[1], hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.embedding(ids)                      # batch x fields x dim
        dots = torch.bmm(e, e.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([e.flatten(1), dots], dim=1))


parser = argparse.ArgumentParser()
parser.add_argument("data", help="a folder written by quorum gen-ctr")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--dim", type=int, default=8)
parser.add_argument("--hidden", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()
torch.set_num_threads(1)

ids, labels = read_ffm(os.path.join(args.data, "train.ffm"))
test_ids, test_labels = read_ffm(os.path.join(args.data, "test.ffm"))
with open(os.path.join(args.data, "meta.json")) as f:
    hidden_auc = json.load(f)["hidden_auc"]
torch.manual_seed(0)
model = DLRM(ids.shape[1], args.dim, args.hidden)
opt = qt.Optimizer(model, "AdamAsync", lr=args.lr, apply_sparse_rmsprop=True)
train = qt.shard(torch.arange(len(labels)))
for epoch in range(args.epochs):
    order = train[torch.randperm(len(train))]
    for i in range(0, len(order), 256):
        batch = order[i:i + 256]
        opt.zero_grad()
        F.binary_cross_entropy_with_logits(model(ids[batch]), labels[batch]).backward()
        opt.step()
model.eval()  # evaluation reads rows without adding unseen ids
with torch.no_grad():
    scores = torch.cat([model(test_ids[i:i + 4096]) for i in range(0, len(test_ids), 4096)])
rank, _ = qt.worker_rank()
# One write for the whole line: the workers share one stdout (launch's or
# torchrun's), and under PYTHONUNBUFFERED print writes the text and its
# newline apart, so two workers' lines could run together.
sys.stdout.write(json.dumps({"worker": rank, "test_auc": auc(scores.numpy().ravel(),
                                                             test_labels.numpy().ravel()),
                             "hidden_auc": hidden_auc, "global_step": opt.global_step}) + "\n")
sys.stdout.flush()
opt.close()

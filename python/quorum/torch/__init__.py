"""quorum for PyTorch: train any ``torch.nn.Module`` on the ps tier.

    import quorum.torch as qt
    model = Net()
    opt = qt.Optimizer(model, "SGD", lr=0.1)   # was torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()                              # push the gradients, pull fresh parameters
    opt.close()

A file each: optimizer.py (``Optimizer``: declares the parameters on the
ps tasks and steps them there), overlap.py (its communication under the
backward pass and the data loading, and when that pays), pipeline.py (an
async step's push and pull on a thread under the next step), local.py (the
one-ps cluster of a script run alone), options.py (torch.optim's names and
hyper-parameters as quorum's per-variable options), embedding.py
(``Embedding``, a table on the ps tasks), buffers.py (a module's
buffers, BatchNorm's statistics, shared on the ps tasks), data.py
(``worker_rank``, ``shard``, ``DistributedSampler``: this worker's part of
the data, resumed where it was after a restart),
checkpoint.py (``checkpoint_state_dict``, ``load_checkpoint``: a quorum
checkpoint back into a module) and summaries.py (``log_scalar``; the
summaries, metrics page and progress line the optimizer keeps under
``quorum launch --logdir``). docs/PYTHON.md describes them."""

from .checkpoint import checkpoint_state_dict, load_checkpoint
from .data import DistributedSampler, shard, worker_rank
from .embedding import Embedding
from .optimizer import Optimizer
from .summaries import log_scalar

__all__ = ["DistributedSampler", "Embedding", "Optimizer", "checkpoint_state_dict",
           "load_checkpoint", "log_scalar", "shard", "worker_rank"]

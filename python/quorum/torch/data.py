"""This worker's part of the data: ``worker_rank`` (its index and the
number of workers, from TF_CONFIG), ``shard`` (every num_workers-th item
of a tensor, list or Dataset) and ``DistributedSampler`` (torch's, with
the cluster's rank and size)."""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

import torch.utils.data

from ..cluster import Cluster

__all__ = ["DistributedSampler", "shard", "worker_rank"]


def worker_rank() -> Tuple[int, int]:
    """(this worker's index, the number of workers) from TF_CONFIG; (0, 1)
    when run alone."""
    text = os.environ.get("TF_CONFIG")
    if not text:
        return 0, 1
    c = Cluster.from_tf_config(text)
    return (c.task_index if c.job == "worker" else 0), c.num_workers


def shard(items: Any) -> Any:
    """This worker's part of items (every num_workers-th, from its index):
    of a tensor, an array or a list, the same kind; of a torch Dataset, a
    ``torch.utils.data.Subset``; all of it when run alone."""
    rank, size = worker_rank()
    if isinstance(items, torch.utils.data.Dataset) and not isinstance(items, torch.Tensor):
        try:
            n = len(items)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError("shard: a Dataset without len() (an IterableDataset?) cannot be "
                            "split by index; split its stream by worker_rank() instead") from None
        return torch.utils.data.Subset(items, range(rank, n, size))
    if not hasattr(items, "__getitem__"):
        raise TypeError("shard: a tensor, an array, a list or a Dataset, not %s"
                        % type(items).__name__)
    return items[rank::size]


class DistributedSampler(torch.utils.data.DistributedSampler):  # type: ignore[type-arg]
    """torch's ``DistributedSampler`` with ``num_replicas`` and ``rank``
    from the cluster (``worker_rank()``), so no process group is needed;
    the other arguments are torch's (call ``set_epoch`` each epoch)."""

    def __init__(self, dataset: Any, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False):
        own_rank, size = worker_rank()
        super().__init__(dataset, num_replicas=size if num_replicas is None else num_replicas,
                         rank=own_rank if rank is None else rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)

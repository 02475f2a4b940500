"""This worker's part of the data: ``worker_rank`` (its index and the
number of workers, from TF_CONFIG), ``shard`` (every num_workers-th item
of a tensor, list or Dataset) and ``DistributedSampler`` (torch's, with
the cluster's rank and size, and a position a restarted worker resumes
from)."""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional, Tuple

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
    the other arguments are torch's (call ``set_epoch`` each epoch).

    It knows where it is: ``position`` is the indices handed out so far,
    ``epoch * len(self)`` plus those of the current epoch (an epoch is the
    one ``set_epoch`` gave; without ``set_epoch``, the count of passes).
    Given to the optimizer (``Optimizer(..., sampler=s)``), its position
    rides on every push, and a worker restarted into the running cluster
    resumes it (``resume``): the epochs it had finished yield nothing, the
    one it was in yields the rest. A DataLoader with worker processes
    takes indices ahead of the batches trained (its prefetch), which a
    restart skips."""

    def __init__(self, dataset: Any, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False):
        own_rank, size = worker_rank()
        super().__init__(dataset, num_replicas=size if num_replicas is None else num_replicas,
                         rank=own_rank if rank is None else rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self._resume = 0        # the position to go on from (resume)
        self._epoch_set = False
        self._passes = 0        # passes started, the epoch when set_epoch is not called
        self._pass = 0          # the current pass's epoch
        self._handed = 0        # indices handed out in it

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self._epoch_set = True

    def resume(self, position: int) -> None:
        """Go on from position (as ``position`` gave it): the next passes
        skip what it had handed out."""
        if position < 0:
            raise ValueError("resume: position %d is negative" % position)
        self._resume = int(position)

    @property
    def position(self) -> int:
        """Indices handed out: epoch * len(self) + those of this epoch."""
        return self._pass * self.num_samples + self._handed

    def __iter__(self) -> Iterator[int]:
        self._pass = self.epoch if self._epoch_set else self._passes
        self._passes += 1
        indices = list(super().__iter__())
        start = min(max(self._resume - self._pass * self.num_samples, 0), len(indices))
        self._handed = start
        return self._hand_out(indices, start)

    def _hand_out(self, indices: Any, start: int) -> Iterator[int]:
        for i in indices[start:]:
            self._handed += 1  # counted as handed out: its batch is this step's
            yield i

"""This worker's part of the data: ``worker_rank`` (its index and the
number of workers, from TF_CONFIG) and ``shard`` (every num_workers-th
item)."""

from __future__ import annotations

import os
from typing import Any, Tuple

from ..cluster import Cluster

__all__ = ["shard", "worker_rank"]


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
    a tensor, an array or a list; all of it when run alone."""
    rank, size = worker_rank()
    return items[rank::size]

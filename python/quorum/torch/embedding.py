"""``Embedding``: an embedding table held by the ps tasks inside a torch
model. Its forward pulls the rows of the batch's distinct ids; the
optimizer's next ``step()`` pushes their gradients as sparse rows (one
quorum with the dense gradients in sync mode). The optimizer declares the
table (optimizer.py) and hands it its worker."""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ..worker import Worker

__all__ = ["Embedding"]


class Embedding(torch.nn.Module):
    """An embedding table on the ps tasks: ids (any int64, no fixed
    vocabulary) -> rows of ``dim`` floats, made on first use from the seeded
    initializer. Use it inside a model trained by ``Optimizer``.
    ``mode="sum"|"mean"`` pools the last dimension of ids (a bag).
    ``options`` are the table's own, added to the optimizer's: its optimizer
    settings, and admission and eviction ("admit_after=3,
    evict_after_steps=100000", with "admit_filter=bloom,
    admit_filter_bytes=N" for admission counts of fixed memory,
    docs/EMBEDDINGS.md)."""

    def __init__(self, dim: int, init: str = "normal:0,0.01", seed: int = 0,
                 options: str = "", mode: Optional[str] = None):
        super().__init__()
        if mode not in (None, "sum", "mean"):
            raise ValueError("mode must be None, 'sum' or 'mean', not %r" % (mode,))
        self.dim, self.init, self.seed, self.options, self.mode = dim, init, seed, options, mode
        self._worker: Optional[Worker] = None
        self._table = -1
        self._pending: List[Tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self._worker is None:
            raise RuntimeError("quorum.torch.Embedding: wrap the model with "
                               "quorum.torch.Optimizer before its first forward")
        if ids.dtype != torch.int64:
            raise TypeError("Embedding: ids of %s, not torch.int64" % ids.dtype)
        device = ids.device
        uniq, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        if device.type != "cpu":
            # ids on a GPU: the rows come through pinned host memory
            # (staging.py), their gradients go back to it at step()
            uniq = uniq.cpu()
            rows = torch.empty(uniq.numel(), self.dim, pin_memory=device.type == "cuda")
        else:
            rows = torch.empty(uniq.numel(), self.dim)
        self._worker.pull_rows(self._table, uniq, out=rows, read_only=not self.training)
        if device.type != "cpu":
            rows = rows.to(device, non_blocking=True)
        if self.training and torch.is_grad_enabled():
            rows.requires_grad_(True)
            self._pending.append((uniq, rows))
        out = rows[inverse].reshape(*ids.shape, self.dim)
        if self.mode == "sum":
            out = out.sum(dim=-2)
        elif self.mode == "mean":
            out = out.mean(dim=-2)
        return out

    def _take_rows(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        done = [(ids, rows.grad.cpu()) for ids, rows in self._pending if rows.grad is not None]
        self._pending = []
        return done

"""Async staleness counted two ways in qr_worker_stats (Worker.stats()):
"staleness", a histogram with one count per variable of a push, and
"stale_pushes_applied", one count per push (on each ps it reached), which
the chief's stale_gradients summary plots (docs/SUMMARIES.md)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

NAMES = ("a", "b", "c")


@pytest.mark.parametrize("nps", [1, 2])
def test_a_stale_push_counts_once(make_cluster, nps):  # type: ignore[no-untyped-def]
    c = make_cluster(nps, 2, lr=0.1)
    ws = [c.worker(0), c.worker(1)]
    for w in ws:
        for name in NAMES:
            w.declare(name, 4)
    threads = [threading.Thread(target=w.initialize) for w in ws]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reached = len({ps for name in NAMES for ps, _, _ in ws[0].placement(name)})
    assert reached == nps  # three variables over every ps
    grads = {name: np.ones(4, np.float32) for name in NAMES}
    for w in ws:
        w.pull()
    ws[0].push(grads)  # fresh
    ws[1].push(grads)  # computed before worker 0's update: every gradient stale
    stats = ws[0].stats()
    assert sum(stats["staleness"][1:]) == len(NAMES), stats  # per variable
    assert stats["stale_pushes_applied"] == nps, stats  # per push, on each ps
    ws[1].pull()
    ws[1].push(grads)  # fresh again
    stats = ws[0].stats()
    assert sum(stats["staleness"][1:]) == len(NAMES) and stats["stale_pushes_applied"] == nps
    assert sum(stats["staleness"]) == 3 * len(NAMES), stats

"""A real cluster in the test process: ps tasks on threads (quorum.PS), on
Unix sockets in a private directory, and workers made on demand."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterator, List

import pytest

import quorum


class LocalCluster:
    def __init__(self, nps: int, nworkers: int, **options: object):
        self.dir = tempfile.mkdtemp(prefix="qr-py-")
        self.ps_hosts = ["unix:%s/ps%d.sock" % (self.dir, i) for i in range(nps)]
        self.worker_hosts = ["unix:%s/w%d.sock" % (self.dir, i) for i in range(nworkers)]
        self.options = dict(options)
        self.ps = [quorum.PS(self.spec("ps", i), **self.options) for i in range(nps)]
        self.workers: List[quorum.Worker] = []

    def spec(self, job: str, index: int) -> quorum.Cluster:
        return quorum.Cluster(self.ps_hosts, self.worker_hosts, job, index)

    def worker(self, index: int = 0, **options: object) -> quorum.Worker:
        opts = dict(self.options)
        opts.update(options)
        w = quorum.Worker(self.spec("worker", index), **opts)
        self.workers.append(w)
        return w

    def close(self) -> None:
        for w in self.workers:
            w.close()
        for p in self.ps:
            p.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    c = LocalCluster(2, 1, lr=0.5, timeout_ms=5000)
    yield c
    c.close()


@pytest.fixture
def make_cluster() -> Iterator[object]:
    made: List[LocalCluster] = []

    def make(nps: int, nworkers: int, **options: object) -> LocalCluster:
        c = LocalCluster(nps, nworkers, **options)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()

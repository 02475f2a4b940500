"""torch's own DistributedSampler, unchanged, under `quorum launch -- python`:
the launcher sets RANK and WORLD_SIZE as torchrun does, so the workers'
shards are disjoint and cover the dataset in every epoch; and
OMP_NUM_THREADS=1 gives each worker one torch thread (tools/launch.c)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

# `quorum` from PATH (a build's tools/ put first), else the one installed
# beside this Python.
QUORUM = (shutil.which("quorum") or shutil.which("quorum", path=os.path.dirname(sys.executable))
          or "quorum")

N = 30  # items; divisible by the 3 workers, so torch pads nothing

PROGRAM = r"""
import json, os, torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
ds = TensorDataset(torch.arange(%d))
sampler = DistributedSampler(ds, num_replicas=int(os.environ["WORLD_SIZE"]),
                             rank=int(os.environ["RANK"]), shuffle=True, seed=7)
loader = DataLoader(ds, batch_size=4, sampler=sampler)
epochs = []
for epoch in range(2):
    sampler.set_epoch(epoch)
    epochs.append([int(i) for (batch,) in loader for i in batch])
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
print("SHARD " + json.dumps({"task": task, "rank": int(os.environ["RANK"]),
                             "threads": torch.get_num_threads(), "epochs": epochs}), flush=True)
""" % N


def test_distributed_sampler_shards_disjoint_and_covering() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RANK",
                                                            "WORLD_SIZE")}
    p = subprocess.run([QUORUM, "launch", "--ps", "1", "--workers", "3", "--",
                        sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                       timeout=180, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    shards = sorted((json.loads(l[6:]) for l in p.stdout.splitlines() if l.startswith("SHARD ")),
                    key=lambda s: s["rank"])
    assert [s["rank"] for s in shards] == [0, 1, 2], p.stdout + p.stderr[-3000:]
    for s in shards:
        assert s["task"] == s["rank"], s  # RANK is the TF_CONFIG task index
        assert s["threads"] == 1, s  # OMP_NUM_THREADS=1 reached torch
    for epoch in range(2):
        parts = [s["epochs"][epoch] for s in shards]
        assert [len(x) for x in parts] == [N // 3] * 3, parts
        together = [i for x in parts for i in x]
        assert sorted(together) == list(range(N)), parts  # disjoint, and covering
    # set_epoch reshuffles, the same way on every worker (one seed)
    assert any(s["epochs"][0] != s["epochs"][1] for s in shards), shards
    assert "setting OMP_NUM_THREADS=1" in p.stderr, p.stderr[-3000:]

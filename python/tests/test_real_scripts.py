"""A real PyTorch training script, unchanged but for a few lines, trains on
the ps tier to the accuracy it reaches alone. examples/python/
fashion_bn_torch.py is such a script (a CNN with BatchNorm on
Fashion-MNIST, AdamW with weight-decay groups, CosineAnnealingLR, torch's
DistributedSampler, the model, optimizer and scheduler saved and reloaded
midway); fashion_bn_quorum.py is the same with quorum.torch. Each runs
alone, and the quorum one under `quorum launch --ps 2 --workers 2`, sync
and async, in float32 and under bf16 autocast: the cluster's workers reach
the plain script's test accuracy within 0.02 (sync) and 0.04 (async).
Registered apart from the package's suite (python_real_scripts, labelled
slow): it trains twelve times."""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import sys
from typing import Dict, List

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python")
PLAIN = os.path.join(EXAMPLES, "fashion_bn_torch.py")
QUORUM_SCRIPT = os.path.join(EXAMPLES, "fashion_bn_quorum.py")
# The quorum that comes with the interpreter's package, unless the tests
# run against a build tree (QUORUM_LIBRARY set, quorum on PATH).
QUORUM = (shutil.which("quorum") if os.environ.get("QUORUM_LIBRARY") else None) or \
    shutil.which("quorum", path=os.path.dirname(sys.executable)) or "quorum"
DATA = "/usr/share/datasets/fashion-mnist"
ARGS = ["--limit", "12000", "--epochs", "3"]

pytestmark = pytest.mark.skipif(not os.path.isdir(DATA),
                                reason="Debian's dataset-fashion-mnist is not installed")


def accuracies(out: str) -> List[float]:
    return [float(a) for a in re.findall(r"test accuracy ([0-9.]+)", out)]


def run(cmd: List[str], tmp: str) -> List[float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TF_CONFIG", None)
    p = subprocess.run(cmd + ARGS + ["--save", os.path.join(tmp, "state")], capture_output=True,
                       text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    return accuracies(p.stdout)


def test_few_changed_lines() -> None:
    a, b = open(PLAIN).read().splitlines(), open(QUORUM_SCRIPT).read().splitlines()
    changed = [l for l in difflib.unified_diff(a, b, lineterm="", n=0)
               if l[:1] in "+-" and not l.startswith(("+++", "---"))]
    added = sum(l.startswith("+") for l in changed)
    assert 0 < added <= 5 and len(changed) - added <= 5, changed


_plain: Dict[bool, float] = {}


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_cluster_reaches_the_plain_accuracy(tmp_path, mode, bf16):  # type: ignore[no-untyped-def]
    flag = ["--bf16"] if bf16 else []
    if bf16 not in _plain:
        alone = run([sys.executable, PLAIN] + flag, str(tmp_path))
        assert len(alone) == 1, alone
        _plain[bf16] = alone[0]
    acc = run([QUORUM, "launch", "--ps", "2", "--workers", "2", "--mode", mode, "--quiet", "--",
               sys.executable, QUORUM_SCRIPT] + flag, str(tmp_path))
    assert len(acc) == 2, acc
    print("%s %s: alone %.4f, workers %s" % (mode, "bf16" if bf16 else "float32",
                                            _plain[bf16], acc))
    assert _plain[bf16] > 0.85, _plain  # the plain script trains
    for a in acc:
        assert a >= _plain[bf16] - (0.02 if mode == "sync" else 0.04), (mode, _plain[bf16], acc)
    if mode == "sync":
        assert acc[0] == acc[1]  # the replicas end on the same parameters and statistics

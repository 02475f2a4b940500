"""bench/python/bench_torch.py runs end to end (--quick) and reports every
figure: the Python layer's cost beside the C API's, the step time beside
compute and communication, sync throughput beside DDP (gloo). Timings are
not checked: the machine is shared and noisy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "python", "bench_torch.py")


def test_bench_torch_quick():  # type: ignore[no-untyped-def]
    p = subprocess.run([sys.executable, SCRIPT, "--quick", "--json"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(p.stdout.splitlines()[-1])
    sizes = [r["size_bytes"] for r in report["python_overhead"]]
    assert sizes == [64, 4096, 1 << 20], sizes
    for r in report["python_overhead"]:
        assert r["python_us"] > 0 and r["c_api_us"] > 0 and r["c_program_us"] > 0, r
    step = report["step"]
    for key in ("compute_ms", "comm_ms", "sum_ms", "max_ms", "step_ms", "step_ms_overlap"):
        assert step[key] > 0, (key, step)
    t = report["throughput"]
    assert t["quorum_samples_per_s"] > 0 and t["ddp_samples_per_s"] > 0, t

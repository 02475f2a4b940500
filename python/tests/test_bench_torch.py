"""bench/python/bench_torch.py runs end to end (--quick) and reports every
figure: the Python layer's cost beside the C API's, the step time beside
compute and communication, sync throughput beside DDP (gloo) with float32
and bf16 on the wire, and the README's script under `quorum launch` (async
and sync) beside the plain script alone. Timings are not checked: the
machine is shared and noisy."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "python", "bench_torch.py")


def test_bench_torch_quick(capsys):  # type: ignore[no-untyped-def]
    p = subprocess.run([sys.executable, SCRIPT, "--quick", "--json"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(p.stdout.splitlines()[-1])
    # What the figures were measured on (bench_env.py): CPU, cores, kernels.
    machine = report["machine"]
    assert machine["cpu_model"] and machine["cores"] >= 1, machine
    assert machine["quorum_blas"]["kernel"] and machine["torch"]["kernel"], machine
    sizes = [r["size_bytes"] for r in report["python_overhead"]]
    assert sizes == [64, 4096, 1 << 20], sizes
    for r in report["python_overhead"]:
        assert r["python_us"] > 0 and r["c_api_us"] > 0 and r["c_program_us"] > 0, r
    step = report["step"]
    for key in ("compute_ms", "comm_ms", "sum_ms", "max_ms", "step_ms", "step_ms_overlap"):
        assert step[key] > 0, (key, step)
    t = report["throughput"]
    assert (t["workers"], t["ps"]) == (2, 2), t  # the defaults of --workers and --ps
    assert t["quorum_samples_per_s"] > 0 and t["ddp_samples_per_s"] > 0, t
    assert t["quorum_bf16_samples_per_s"] > 0 and t["ratio_bf16"] > 0, t
    r = report["readme_script"]
    # Every training example of the digits scripts is counted, once: 40
    # epochs of 1500 rows, alone and summed over the two workers.
    for how in ("alone", "async", "sync"):
        assert r["examples_" + how] == 40 * 1500, r
        assert r[how + "_samples_per_s"] > r[how + "_wall_samples_per_s"] > 0, r
    for key in ("ratio_async", "ratio_sync", "ratio_async_wall", "ratio_sync_wall"):
        assert r[key] > 0, (key, r)

    # The tables (printed without --json) name every figure, the new ones too.
    spec = importlib.util.spec_from_file_location("bench_torch", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.print_tables(report)
    out = capsys.readouterr().out
    for line in ("machine: ", "quorum BLAS kernel: ", "torch BLAS kernel: ", "3. sync, 2 workers (2 ps)", "bf16 on the wire: quorum", "4. the README's script",
                 "alone (digits_torch.py)", "--mode async", "--mode sync"):
        assert line in out, (line, out)

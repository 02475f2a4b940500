"""bench_env.py - what a benchmark's figures were measured on, printed
beside them (issue 27): the CPU model, the cores this process may use, the
BLAS kernel quorum's C side runs (OpenBLAS's corename) and torch's
(its BLAS and CPU capability). Shared by the end-to-end benchmarks under
bench/python (bench_torch.py, bench_scaling.py, bench_netns.py, and the
CPU's name for bench_overlap.py and bench_sync_step.py); how they run
their processes is benchlib.py's.

quorum's kernel: `quorum train/launch/bench --json` may carry a "cpu"
object of its own (the CLI chooses OPENBLAS_CORETYPE for itself and its
children); when a caller has such a document, machine(quorum_doc=...)
takes it as is. Otherwise the corename is asked of the libopenblas that
libquorum links, in a child Python (ctypes, the caller's environment), so
that this process does not start OpenBLAS's thread pool.

Paths: the quorum binary is $QUORUM_BINARY, else `quorum` on PATH; the
library is $QUORUM_LIBRARY, else the one beside the binary (a build tree's
tools/../libquorum.so, an install's ../lib/libquorum.so), else the one in
the installed package."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Optional


def quorum_binary() -> str:
    """The quorum CLI to run: $QUORUM_BINARY, else the one on PATH, else
    the one beside this Python (a venv's bin/)."""
    named = os.environ.get("QUORUM_BINARY")
    if named:
        return named
    return shutil.which("quorum") or \
        shutil.which("quorum", path=os.path.dirname(sys.executable)) or "quorum"


def quorum_library(binary: Optional[str] = None) -> Optional[str]:
    """libquorum.so: $QUORUM_LIBRARY, else beside the binary, else the
    installed package's; None if none is found."""
    named = os.environ.get("QUORUM_LIBRARY")
    if named:
        return named
    found = shutil.which(binary or quorum_binary())
    if found:
        tools = os.path.dirname(os.path.realpath(found))
        for rel in ("../libquorum.so", "../lib/libquorum.so", "libquorum.so"):
            path = os.path.normpath(os.path.join(tools, rel))
            if os.path.exists(path):
                return path
    try:
        import importlib.util
        spec = importlib.util.find_spec("quorum")
        if spec and spec.origin:
            path = os.path.join(os.path.dirname(spec.origin), "libquorum.so")
            if os.path.exists(path):
                return path
    except (ImportError, ValueError):
        pass
    return None


def cpu_model() -> str:
    """The CPU's name as /proc/cpuinfo gives it (x86: "model name"; Arm:
    the implementer and part), else what the platform module knows."""
    fields: Dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() not in fields:
                    fields[key.strip()] = value.strip()
    except OSError:
        pass
    if "model name" in fields:
        return fields["model name"]
    if "CPU part" in fields:
        return "%s implementer %s part %s" % (platform.machine(), fields.get("CPU implementer", "?"),
                                              fields["CPU part"])
    return platform.processor() or platform.machine() or "unknown"


def cpu_flags() -> List[str]:
    """The vector extensions the CPU reports that decide a BLAS kernel."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags") or line.startswith("Features"):
                    have = set(line.partition(":")[2].split())
                    return [x for x in ("sse3", "avx", "avx2", "fma", "avx512f", "avx512bw",
                                        "avx512_bf16", "amx_tile", "asimd", "sve") if x in have]
    except OSError:
        pass
    return []


def cores() -> int:
    """The cores this process may run on (its affinity), as the runs use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_OPENBLAS_PROBE = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
out = {}
for name in ("openblas_get_corename", "openblas_get_config"):
    try:
        fn = getattr(lib, name)
    except AttributeError:
        continue
    fn.restype = ctypes.c_char_p
    out[name[len("openblas_get_"):]] = fn().decode()
try:
    fn = lib.openblas_get_num_threads
    fn.restype = ctypes.c_int
    out["threads"] = fn()
except AttributeError:
    pass
with open("/proc/self/maps") as f:
    libs = sorted({l.split()[-1] for l in f if "blas" in l.lower() and "/" in l})
out["libraries"] = libs
print(json.dumps(out))
"""


def quorum_blas(library: Optional[str] = None) -> Dict[str, Any]:
    """The BLAS kernel libquorum gets in this environment: OpenBLAS's
    corename and config, asked in a child Python that loads the library
    (the environment's OPENBLAS_CORETYPE applies, as it does to quorum's
    own processes started from here)."""
    import json
    lib = library or quorum_library()
    res: Dict[str, Any] = {"source": "ctypes", "library": lib,
                           "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE")}
    if not lib:
        res["error"] = "libquorum.so not found (set QUORUM_LIBRARY)"
        return res
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    try:
        p = subprocess.run([sys.executable, "-c", _OPENBLAS_PROBE, lib], capture_output=True,
                           text=True, timeout=60, env=env)
        if p.returncode:
            res["error"] = p.stderr.strip()[-300:]
        else:
            res.update(json.loads(p.stdout))
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        res["error"] = str(e)
    res["kernel"] = res.get("corename", "unknown (not OpenBLAS?)")
    return res


def torch_blas() -> Dict[str, Any]:
    """torch's BLAS and the vector kernels it dispatches to (without
    importing torch when the caller has not)."""
    if "torch" not in sys.modules:
        try:
            import torch  # noqa: F401
        except ImportError:
            return {"error": "torch not importable"}
    import torch
    cfg = torch.__config__.show()
    import re
    found = re.search(r"BLAS_INFO=([^,\s]+)", cfg)
    blas = found.group(1) if found else ""
    cap = torch.backends.cpu.get_cpu_capability()
    return {"version": torch.__version__, "blas": blas or "unknown", "cpu_capability": cap,
            "mkldnn": bool(torch.backends.mkldnn.is_available()),
            "mkl": bool(torch.backends.mkl.is_available()),
            "kernel": "%s, %s" % (blas or "blas?", cap)}


def machine(quorum_doc: Optional[Dict[str, Any]] = None, with_torch: bool = True,
            library: Optional[str] = None) -> Dict[str, Any]:
    """Everything the header names, as one JSON-able object. quorum_doc: a
    `quorum ... --json` document; its "cpu" object, when it has one, is
    quorum's own word on its kernel and is kept as is."""
    m: Dict[str, Any] = {"cpu_model": cpu_model(), "cores": cores(),
                         "cpu_count": os.cpu_count(), "flags": cpu_flags(),
                         "machine": platform.machine()}
    if quorum_doc and isinstance(quorum_doc.get("cpu"), dict):
        q = dict(quorum_doc["cpu"])
        q["source"] = "quorum --json"
        q.setdefault("kernel", q.get("blas_kernel") or q.get("corename") or
                     q.get("openblas_coretype") or "see cpu object")
        m["quorum_blas"] = q
    else:
        m["quorum_blas"] = quorum_blas(library)
    if with_torch:
        m["torch"] = torch_blas()
    return m


def header(m: Dict[str, Any]) -> str:
    """The lines a benchmark prints above its figures."""
    q = m.get("quorum_blas", {})
    lines = ["machine: %s, %d cores usable (%s of the machine), %s" % (
        m["cpu_model"], m["cores"], m.get("cpu_count"), " ".join(m.get("flags", [])))]
    coretype = q.get("OPENBLAS_CORETYPE")
    lines.append("quorum BLAS kernel: %s (%s%s)" % (
        q.get("kernel", "?"), q.get("source", "?"),
        ", OPENBLAS_CORETYPE=%s" % coretype if coretype else ""))
    t = m.get("torch")
    if t:
        lines.append("torch BLAS kernel: %s (torch %s)" % (t.get("kernel", t.get("error", "?")),
                                                           t.get("version", "?")))
    return "\n".join(lines)


if __name__ == "__main__":
    print(header(machine()))

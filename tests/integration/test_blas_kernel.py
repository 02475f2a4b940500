"""test_blas_kernel.py - the OpenBLAS kernels quorum runs, as a run's JSON
summary reports them ("cpu": blas_kernel, blas_kernel_chosen_by):

  - OPENBLAS_CORETYPE unset: the kernels are the best this CPU's features
    allow, worked out here from /proc/cpuinfo's flags (AVX-512 F, BW, VL
    and DQ: SkylakeX; AVX2 and FMA: Haswell; AVX: Sandybridge), or ones
    OpenBLAS chose itself that are as wide (Cooperlake on a Zen 4, say);
  - a value the user set (Prescott) is kept and reported as theirs, and
    nothing is said;
  - with an OpenBLAS that chooses SSE3 kernels (an LD_PRELOAD library
    plays one: Debian 12's on a Sapphire Rapids), quorum sets the variable
    from cpuid, says so once at info level, naming the CPU, the kernels
    and how to override, and `quorum launch`'s tasks inherit it.

Usage: test_blas_kernel.py QUORUM_BINARY FAKE_CORENAME_LIBRARY"""

import os
import platform
import subprocess
import sys

from qrtest import Proc, last_json

quorum, fake = sys.argv[1], sys.argv[2]

# How wide each kernel set's vectors are (OpenBLAS's x86-64 corenames).
LEVEL = {"skylakex": 3, "cooperlake": 3, "sapphirerapids": 3, "haswell": 2, "zen": 2,
         "excavator": 2, "sandybridge": 1, "bulldozer": 1, "piledriver": 1, "steamroller": 1}
CORETYPE = {3: "SkylakeX", 2: "Haswell", 1: "Sandybridge"}
CHOICE = "OPENBLAS_CORETYPE="


def cpu_level():
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma"} <= flags:
                return 3
            if {"avx2", "fma"} <= flags:
                return 2
            return 1 if "avx" in flags else 0
    return 0


def asan_runtime():
    """The AddressSanitizer runtime a sanitizer build links, or None: it must
    come first in LD_PRELOAD, before the stand-in OpenBLAS below."""
    try:
        out = subprocess.run(["ldd", quorum], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return None
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("libasan.so") and len(parts) >= 3:
            return parts[2]
    return None


ASAN = asan_runtime()


def run(args, **env_set):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "QUORUM_OPENBLAS_CORETYPE_CHOSEN", "LD_PRELOAD",
                        "QUORUM_LOG")}
    env.update(env_set)
    if "LD_PRELOAD" in env_set and ASAN:
        env["LD_PRELOAD"] = ASAN + " " + env_set["LD_PRELOAD"]
    rc, out, err = Proc([quorum] + args + ["--data", "digits", "--steps", "5", "--json",
                                           "--quiet"], env=env).wait(120)
    assert rc == 0, (args, rc, err[-3000:])
    return last_json(out)["cpu"], err


TRAIN = ["train", "--local", "--model", "mlp"]
x86 = platform.machine() in ("x86_64", "AMD64")
level = cpu_level() if x86 else 0
cpu, err = run(TRAIN)
assert cpu["cores"] >= 1 and cpu["model"], cpu
kernel = cpu["blas_kernel"]
print("cpu: %s, %d cores, OpenBLAS runs %s (chosen by %s)"
      % (cpu["model"], cpu["cores"], kernel, cpu["blas_kernel_chosen_by"]))
if level:
    assert cpu.get("cpu_coretype") == CORETYPE[level], (cpu, level)
    assert LEVEL.get(kernel.lower(), 0) >= level, \
        "OpenBLAS runs %s on a CPU that runs %s" % (kernel, CORETYPE[level])
    if cpu["blas_kernel_chosen_by"] == "quorum":
        assert kernel.lower() == CORETYPE[level].lower(), cpu
        assert err.count(CHOICE) == 1, err
    else:
        assert cpu["blas_kernel_chosen_by"] == "openblas" and CHOICE not in err, (cpu, err)
    print("ok: OPENBLAS_CORETYPE unset: %s, as wide as this CPU's %s" % (kernel, CORETYPE[level]))
else:
    # No AVX, or not x86-64: OpenBLAS's own detection, untouched.
    assert cpu["blas_kernel_chosen_by"] == "openblas" and "cpu_coretype" not in cpu, cpu
    print("ok: no AVX or not x86-64: OpenBLAS's own choice, %s" % kernel)

cpu, err = run(TRAIN, OPENBLAS_CORETYPE="Prescott")
assert cpu["blas_kernel"] == "Prescott", cpu
assert cpu["blas_kernel_chosen_by"] == "OPENBLAS_CORETYPE", cpu
assert CHOICE not in err, err
print("ok: a user's OPENBLAS_CORETYPE=Prescott is kept, and nothing is said")

if not level:
    print("PASS: (the choice itself needs an x86-64 CPU with AVX)")
    sys.exit(0)

# An OpenBLAS that chose SSE3 kernels: quorum chooses, once, and says so.
want = CORETYPE[level]
cpu, err = run(TRAIN, LD_PRELOAD=fake)
assert cpu["blas_kernel"].lower() == want.lower(), (cpu, err)
assert cpu["blas_kernel_chosen_by"] == "quorum", cpu
lines = [l for l in err.splitlines() if CHOICE in l]
assert len(lines) == 1, err
line = lines[0]
assert " info: " in line and "Prescott" in line and cpu["model"] in line, line
assert "%s%s" % (CHOICE, want) in line and "set OPENBLAS_CORETYPE yourself" in line, line
assert "warn" not in err, err
print("ok: OpenBLAS chose Prescott: quorum runs %s, said once: %s" % (want, line))

# The user's value still wins over such an OpenBLAS.
cpu, err = run(TRAIN, LD_PRELOAD=fake, OPENBLAS_CORETYPE="Prescott")
assert (cpu["blas_kernel"], cpu["blas_kernel_chosen_by"]) == ("Prescott", "OPENBLAS_CORETYPE"), cpu
assert CHOICE not in err, err
print("ok: ... unless the user set OPENBLAS_CORETYPE")

# quorum launch: the launcher chooses once, its tasks inherit the choice.
cpu, err = run(["launch", "--ps", "1", "--workers", "2", "--mode", "sync"], LD_PRELOAD=fake)
assert cpu["blas_kernel"].lower() == want.lower(), (cpu, err)
assert cpu["blas_kernel_chosen_by"] == "quorum", cpu
assert sum(CHOICE in l for l in err.splitlines()) == 1, err
assert "warn" not in err, err
print("ok: quorum launch: chosen once, the chief (a child) runs %s" % want)
print("PASS: the BLAS kernels suit the CPU")

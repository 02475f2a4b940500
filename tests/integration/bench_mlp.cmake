# Smoke tests of the MLP benchmark: `quorum bench mlp --quick --json` runs
# end to end and prints one complete JSON line a point, with the CPU and
# the BLAS kernel beside the figures; bench/python/bench_mlp.py --quick
# sets torch beside it. Timings are not checked: the machine is shared and
# noisy. (The Python below must not contain ';', which CMake would split on.)
set(qr_bench_mlp_check [=[
import json, subprocess, sys
out = subprocess.run([sys.argv[1], "bench", "mlp", "--quick", "--json"], check=True,
                     stdout=subprocess.PIPE, timeout=100).stdout
points = [json.loads(l) for l in out.splitlines()]
assert [(p["dims"], p["batch"]) for p in points] == [([64, 32, 10], 16)], points
p = points[0]
assert p["params"] == 64 * 32 + 32 + 32 * 10 + 10, p
for key in ("forward_us", "forward_us_min", "forward_backward_us", "forward_backward_us_min"):
    assert p[key] > 0, (key, p)
assert p["forward_us_min"] <= p["forward_us"] and p["forward_backward_us"] > p["forward_us_min"], p
cpu = p["cpu"]
assert cpu["cores"] >= 1 and cpu["model"] and cpu["blas_kernel"], cpu
assert cpu["blas_kernel_chosen_by"] in ("openblas", "quorum", "OPENBLAS_CORETYPE"), cpu
bad = subprocess.run([sys.argv[1], "bench", "mlp", "--batch", "0"], stderr=subprocess.PIPE)
assert bad.returncode == 2 and b"--batch 0" in bad.stderr, bad
print("bench_mlp_smoke: %.1f us a step on %s" % (p["forward_backward_us"], cpu["blas_kernel"]))
]=])
add_test(NAME bench_mlp_smoke
         COMMAND ${QR_PYTHON} -c "${qr_bench_mlp_check}" $<TARGET_FILE:quorum>)
set_tests_properties(bench_mlp_smoke PROPERTIES TIMEOUT 120)

set(qr_bench_mlp_torch_check [=[
import json, os, subprocess, sys
env = dict(os.environ, QUORUM=sys.argv[1])
out = subprocess.run([sys.executable, sys.argv[2], "--quick", "--json"], check=True, env=env,
                     stdout=subprocess.PIPE, timeout=280).stdout
r = json.loads(out.splitlines()[-1])
assert r["cpu"]["blas_kernel"] and r["torch"]["version"], r
(k,) = r["kernels"]
assert k["forward_backward_us_quorum"] > 0 and k["forward_backward_us_torch"] > 0, k
(t,) = r["training"]
assert t["examples_per_sec_quorum"] > 0 and t["examples_per_sec_torch"] > 0, t
print("bench_mlp_torch_smoke: fwd+bwd %.2fx torch, training %.2fx torch (quick, noisy)"
      % (k["forward_backward_ratio"], t["ratio"]))
]=])
add_test(NAME bench_mlp_torch_smoke
         COMMAND ${QR_VENV_PYTHON} -c "${qr_bench_mlp_torch_check}" $<TARGET_FILE:quorum>
                 ${PROJECT_SOURCE_DIR}/bench/python/bench_mlp.py)
set_tests_properties(bench_mlp_torch_smoke PROPERTIES TIMEOUT 300)

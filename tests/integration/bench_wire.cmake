# Smoke test of the wire benchmark: the --quick grid runs end to end over
# Unix sockets and TCP and prints one JSON object with a complete result per
# point. Timings are not checked: the machine is shared and noisy.
# (The Python below must not contain ';', which CMake would split on.)
set(qr_bench_wire_check [=[
import json, subprocess, sys
out = subprocess.run([sys.argv[1], "--quick", "--json"], check=True,
                     stdout=subprocess.PIPE, timeout=110).stdout
doc = json.loads(out)
results = doc["results"]
assert results, "no results"
keys = ("transport", "op", "size_bytes", "ps", "workers", "gbps", "baseline_gbps",
        "latency_us", "baseline_latency_us")
for r in results:
    missing = [k for k in keys if k not in r]
    assert not missing, "result %r lacks %r" % (r, missing)
    assert r["gbps"] > 0 and r["baseline_gbps"] > 0, r
    assert r["latency_us"] > 0 and r["baseline_latency_us"] > 0, r
assert {r["transport"] for r in results} == {"unix", "tcp"}, "both transports"
assert {r["op"] for r in results} == {"push", "pull", "pushpull", "fused", "pipelined"}, "all five ops"
assert "summary" in doc
assert doc["baseline"] == "raw", doc["baseline"]
# --baseline-apply: the raw server applies SGD too. The targets are set
# against plain raw sockets, so this run must not claim them.
out = subprocess.run([sys.argv[1], "--baseline-apply", "--transports", "unix", "--ps", "1",
                      "--workers", "1", "--sizes", "1M", "--ops", "pushpull", "--repeat", "1",
                      "--seconds", "0.01", "--json"],
                     check=True, stdout=subprocess.PIPE, timeout=60).stdout
doc = json.loads(out)
assert doc["baseline"] == "raw+apply", doc["baseline"]
assert doc["results"][0]["baseline_gbps"] > 0, doc["results"]
assert "pushpull_target_met" not in doc["summary"]["transports"]["unix"], doc["summary"]
print("bench_wire_smoke: %d points ok, --baseline-apply ok" % len(results))
]=])
add_test(NAME bench_wire_smoke
         COMMAND ${QR_PYTHON} -c "${qr_bench_wire_check}" $<TARGET_FILE:quorum-bench-wire>)
set_tests_properties(bench_wire_smoke PROPERTIES TIMEOUT 120)

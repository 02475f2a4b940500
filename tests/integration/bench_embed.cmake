# Smoke test of the embedding benchmark: the --quick grid runs end to end
# (1 and 2 ps, dims 8/64/256, Zipf and uniform ids, pull and push) and
# prints one complete JSON line per point and one for the memory. Timings
# are not checked: the machine is shared and noisy.
# (The Python below must not contain ';', which CMake would split on.)
set(qr_bench_embed_check [=[
import json, subprocess, sys
out = subprocess.run([sys.argv[1], "bench", "embed", "--quick", "--json"], check=True,
                     stdout=subprocess.PIPE, timeout=280).stdout
lines = [json.loads(l) for l in out.splitlines()]
points = [p for p in lines if p["kind"] != "memory"]
want = {(k, d, i, n) for k in ("pull", "pull_distinct", "push") for d in (8, 64, 256)
        for i in ("zipf", "uniform") for n in (1, 2)}
assert {(p["kind"], p["dim"], p["ids"], p["nps"]) for p in points} == want, points
for p in points:
    assert p["rows_per_s"] > 0 and p["gb_per_s"] > 0 and p["dense_gb_per_s"] > 0, p
    assert 1 <= p["distinct_rows"] <= p["batch"], p
mem = [p for p in lines if p["kind"] == "memory"]
assert len(mem) == 1 and mem[0]["rows"] == 200000 and mem[0]["bytes_per_row"] > 64, mem
print("bench_embed_smoke: %d points, memory %.1f bytes a row" % (len(points), mem[0]["bytes_per_row"]))
]=])
add_test(NAME bench_embed_smoke
         COMMAND ${QR_PYTHON} -c "${qr_bench_embed_check}" $<TARGET_FILE:quorum>)
set_tests_properties(bench_embed_smoke PROPERTIES TIMEOUT 300)

# --ps-replicas 2: every 2-ps point also carries the sparse call's rows/s
# on a cluster with two copies of every shard and its ratio to one copy,
# and a last line the median ratio per op; --ps 1 is refused. Shape only.
set(qr_bench_embed_replicas_check [=[
import json, subprocess, sys
out = subprocess.run([sys.argv[1], "bench", "embed", "--quick", "--ps-replicas", "2", "--dims", "8",
                      "--memory-rows", "0", "--json"], check=True, stdout=subprocess.PIPE,
                     timeout=280).stdout
lines = [json.loads(l) for l in out.splitlines()]
points = [p for p in lines if p["kind"] != "replicas"]
assert {(p["kind"], p["ids"], p["nps"]) for p in points} == {
    (k, i, 2) for k in ("pull", "pull_distinct", "push") for i in ("zipf", "uniform")}, points
for p in points:
    assert p["replicas_rows_per_s"] > 0 and p["replicas_ratio"] > 0, p
summary = [p for p in lines if p["kind"] == "replicas"]
assert len(summary) == 1 and summary[0]["goal"] == 0.85, summary
assert all(summary[0][k] > 0 for k in ("pull", "pull_distinct", "push")), summary
bad = subprocess.run([sys.argv[1], "bench", "embed", "--ps-replicas", "2", "--ps", "1"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
assert bad.returncode == 2 and b"needs 2 ps" in bad.stderr, bad
print("bench_embed_replicas_smoke: %d points with two copies, medians %s" % (len(points), summary[0]))
]=])
add_test(NAME bench_embed_replicas_smoke
         COMMAND ${QR_PYTHON} -c "${qr_bench_embed_replicas_check}" $<TARGET_FILE:quorum>)
set_tests_properties(bench_embed_replicas_smoke PROPERTIES TIMEOUT 300)

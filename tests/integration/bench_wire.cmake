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

# --auth --encrypt: with the --quick grid, every point also shows quorum with
# a cluster secret (authenticated, and encrypted) beside plain quorum, and
# the summary gives the handshake's cost per connection and the encrypted
# push+pull ratio against its goal. The text output is checked line by
# line, the secret file made for the run must be gone at the end, and a
# tiny --json run must carry the same figures. Timings are not checked.
set(qr_bench_wire_secure_check [=[
import json, os, re, subprocess, sys
out = subprocess.run([sys.argv[1], "--quick", "--auth", "--encrypt"], check=True,
                     stdout=subprocess.PIPE, timeout=110).stdout.decode()
lines = out.splitlines()
secret = re.search(r"with the secret (\S+) \(removed at the end\)", out)
assert secret, "no secret file named:\n" + out
assert not os.path.exists(secret.group(1)), "the secret file was left behind"
assert not os.path.exists(os.path.dirname(secret.group(1))), "its directory was left behind"
header = [l for l in lines if l.startswith("transport ")]
assert len(header) == 1 and "auth GB/s" in header[0] and "enc GB/s" in header[0], header
points = [l for l in lines if re.match(r"(unix|tcp) ", l)]
assert len(points) == 60, "%d points, not 2 transports x 2 workers x 3 sizes x 5 ops" % len(points)
for l in points:
    cols = l.split("|")
    assert len(cols) == 5, l
    for c in cols[3:]:
        gbps, ratio = (float(x) for x in c.split())
        assert gbps >= 0 and ratio >= 0, l
for t in ("unix", "tcp "):
    for pat in (r"auth: GB/s with a secret / plain quorum: median \d+\.\d+ ",
                r"auth: a fresh connection .* the handshake costs -?\d+\.\d+ us per connection",
                r"encrypt: a fresh connection \d+\.\d+ us vs \d+\.\d+ us plain",
                r"encrypt: push\+pull >= 1 MiB at \d+\.\d+ of plain \(goal 0\.5\): (met|NOT met)"):
        assert re.search(r"^  " + t + " ?" + pat, out, re.M), "no line %r for %s:\n%s" % (pat, t, out)
out = subprocess.run([sys.argv[1], "--auth", "--encrypt", "--transports", "tcp", "--ps", "1",
                      "--workers", "1", "--sizes", "1M", "--ops", "pull,pushpull", "--repeat", "1",
                      "--seconds", "0.01", "--json"],
                     check=True, stdout=subprocess.PIPE, timeout=60).stdout
doc = json.loads(out)
assert doc["auth"] and doc["encrypt"], doc
for r in doc["results"]:
    for k in ("auth_gbps", "auth_ratio", "encrypt_gbps", "encrypt_ratio"):
        assert r[k] > 0, (k, r)
tcp = doc["summary"]["transports"]["tcp"]
for k in ("connection_plain_us", "connection_auth_us", "connection_encrypt_us",
          "handshake_compute_us"):
    assert tcp[k] > 0, (k, tcp)
assert "handshake_us" in tcp and "encrypt_goal_met" in tcp, tcp
assert tcp["encrypt_pushpull_min_ratio_1mib_up"] > 0, tcp
print("bench_wire_secure_smoke: %d points with --auth --encrypt ok, --json ok" % len(points))
]=])
add_test(NAME bench_wire_secure_smoke
         COMMAND ${QR_PYTHON} -c "${qr_bench_wire_secure_check}" $<TARGET_FILE:quorum-bench-wire>)
set_tests_properties(bench_wire_secure_smoke PROPERTIES TIMEOUT 120)

# --ps-replicas 2: every point also shows quorum with two copies of every
# shard beside one copy (GB/s, ratio, latency), the summary gives the
# ratios per transport and per op, and the ps tasks' memory with one copy
# and two is printed per topology. A 1 in --ps is refused. The text and
# --json outputs are checked for their shape; timings are not checked.
set(qr_bench_wire_replicas_check [=[
import json, re, subprocess, sys
out = subprocess.run([sys.argv[1], "--quick", "--ps-replicas", "2", "--ops", "push,pull,pushpull"],
                     check=True, stdout=subprocess.PIPE, timeout=110).stdout.decode()
header = [l for l in out.splitlines() if l.startswith("transport ")]
assert len(header) == 1 and "2cp GB/s" in header[0] and "/1cp" in header[0], header
points = [l for l in out.splitlines() if re.match(r"(unix|tcp) ", l)]
assert len(points) == 36, "%d points, not 2 transports x 2 workers x 3 sizes x 3 ops" % len(points)
for l in points:
    cols = l.split("|")
    assert len(cols) == 4, l
    gbps, ratio, us = (float(x) for x in cols[3].split())
    # (a 64 B point under load may print 0.000 GB/s: three decimals)
    assert gbps >= 0 and ratio > 0 and us > 0, l
    assert re.match(r"\S+ +\S+ +\S+ +\S+ +2 ", l), "not 2 ps: " + l
for t in ("unix", "tcp "):
    for pat in (r"replicas: GB/s with two copies / one copy: median \d+\.\d+ \(min \d+\.\d+\) "
                r"over 18 points",
                r"replicas: median per op: push \d+\.\d+ pull \d+\.\d+ pushpull \d+\.\d+",
                r"replicas: a 64 B push \(1 worker\) \d+\.\d+ us with two copies"):
        assert re.search(r"^  " + t + " ?" + pat, out, re.M), "no line %r for %s:\n%s" % (pat, t, out)
mem = re.findall(r"^  (unix|tcp) +2 ps (\d) workers: one copy (\d+\.\d) MiB, two copies (\d+\.\d) MiB", out, re.M)
assert len(mem) == 4, "memory lines: %r\n%s" % (mem, out)
for m in mem:  # (small variables: which is larger is noise; under ASan glibc's
    # mallinfo2 sees nothing, 0.0)
    assert float(m[3]) >= 0 and float(m[2]) >= 0, m
out = subprocess.run([sys.argv[1], "--ps-replicas", "2", "--transports", "unix", "--workers", "1",
                      "--sizes", "64K", "--ops", "push", "--repeat", "1", "--seconds", "0.01",
                      "--json"], check=True, stdout=subprocess.PIPE, timeout=60).stdout
doc = json.loads(out)
assert doc["ps_replicas"] == 2, doc
r = doc["results"][0]
assert r["ps"] == 2 and r["replicas_gbps"] > 0 and r["replicas_ratio"] > 0, r
assert r["replicas_latency_us"] > 0 and r["replicas_ops"] >= 3, r
unix = doc["summary"]["transports"]["unix"]
assert unix["replicas_points"] == 1 and unix["replicas_ratio_median"] > 0, unix
m = doc["memory"][0]
assert m["ps"] == 2 and m["ps_bytes_two_copies"] >= 0 and m["ps_bytes_one_copy"] >= 0, m
bad = subprocess.run([sys.argv[1], "--ps-replicas", "2", "--ps", "1,2"], stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, timeout=30)
assert bad.returncode == 2 and b"needs 2 ps at least" in bad.stderr, bad
print("bench_wire_replicas_smoke: %d points with two copies beside one, memory %s, --json ok"
      % (len(points), ", ".join("%s %s workers %s/%s MiB" % m for m in mem)))
]=])
add_test(NAME bench_wire_replicas_smoke
         COMMAND ${QR_PYTHON} -c "${qr_bench_wire_replicas_check}" $<TARGET_FILE:quorum-bench-wire>)
set_tests_properties(bench_wire_replicas_smoke PROPERTIES TIMEOUT 120)

# Smoke tests of the end-to-end benchmarks under bench/python, against this
# build tree (its quorum binary and libquorum.so, the package from
# python/, the .venv's torch): each runs tiny and its JSON is checked for
# every figure, never a timing (the machine is shared and noisy).
# (The Python below must not contain ';', which CMake would split on.)
set(qr_bench_python_env
    "QUORUM_BINARY=$<TARGET_FILE:quorum>"
    "QUORUM_LIBRARY=$<TARGET_FILE:quorum_shared>"
    "PYTHONPATH=${PROJECT_SOURCE_DIR}/python")

# bench_scaling.py --quick --profile at 1 and 2 workers: every mode (DDP,
# quorum.torch and the C trainer, sync and async) at every count with the
# ps count recommend_ps gives, and quorum.torch sync with overlap=True,
# each with its profile (the cores its tasks kept busy, by role), the
# model's measured parameters, its comparison (also from the compute the
# torch workers timed in the run) and
# the 25 Gbit/s table; then step_model.py's command line on the JSON it
# wrote.
set(qr_bench_scaling_check [=[
import json, os, subprocess, sys, tempfile
bench = os.path.join(sys.argv[1], "bench", "python")
out_json = os.path.join(tempfile.mkdtemp(prefix="qr-scaling-"), "scaling.json")
p = subprocess.run([sys.executable, os.path.join(bench, "bench_scaling.py"), "--quick",
                    "--profile", "--workers", "1,2", "--json", out_json, "--modes",
                    "ddp,qt_sync,qt_async,c_sync,c_async,qt_sync_ov"], capture_output=True,
                   text=True, timeout=500)
assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
doc = json.load(open(out_json))
m = doc["machine"]
assert m["cpu_model"] and m["cores"] >= 1 and m["quorum_blas"]["kernel"], m
assert m["torch"]["kernel"], m
modes = ("ddp", "qt_sync", "qt_async", "c_sync", "c_async", "qt_sync_ov")
got = {(pt["workers"], pt["mode"]): pt for pt in doc["points"]}
assert set(got) == {(w, md) for w in (1, 2) for md in modes}, sorted(got)
sys.path.insert(0, bench)
import step_model
for pt in doc["points"]:
    assert pt["examples_per_s"] > 0 and "error" not in pt, pt
    assert pt["ps"] == step_model.recommend_ps(pt["workers"], m["cores"]), (pt, m["cores"])
    assert pt["ratio_to_ddp"] > 0, pt
    prof = pt["profile"][0]
    assert prof["wall_s"] > 0 and set(prof["busy_per_task"]) <= {"ps", "worker", "launch"}, prof
    if pt["mode"] != "ddp":
        assert "launch" in prof["cores_busy"], prof  # quorum launch's tasks were followed
assert "where the time went" in p.stdout, p.stdout[-3000:]
assert "partial" not in doc, "the finished run's JSON is marked partial"
par = doc["params"]
for k in ("apply_rate", "rtt_s", "bandwidth"):
    assert par[k] > 0, (k, par)
assert par["compute_s"]["torch"] > 0 and par["compute_s"]["c"] > 0, par
assert len(doc["extrapolation_25gbit"]) == 6, doc["extrapolation_25gbit"]
for line in ("machine: ", "quorum BLAS kernel: ", "torch BLAS kernel: ", "| workers (ps) | DDP",
             "| 1 (1) | 1.00 |", "| 2 (%d) | 1.00 |" % step_model.recommend_ps(2, m["cores"]),
             "model vs measurement", "model: 4.28 MB"):
    assert line in p.stdout, (line, p.stdout[-3000:])
model = os.path.join(bench, "step_model.py")
c = json.loads(subprocess.run([sys.executable, model, "compare", out_json, "--json"],
                              check=True, capture_output=True, text=True, timeout=60).stdout)
assert len(c["rows"]) == 8 and all(r["predicted_3rtt"] > 0 for r in c["rows"]), c
# the torch workers timed their step(): the model is also run on that compute
# and a sync point also on the expected slowest of its workers' compute
for r in c["rows"]:
    assert (r.get("predicted_in_run", 0) > 0) == r["mode"].startswith("qt_"), r
    assert (r.get("predicted_straggler", 0) > 0) == (r["mode"] == "qt_sync"), r
e = json.loads(subprocess.run([sys.executable, model, "extrapolate", out_json, "--json"],
                              check=True, capture_output=True, text=True, timeout=60).stdout)
assert {(r["workers"], r["ps"]) for r in e["rows"]} == {(w, p) for w in (100, 1000)
                                                       for p in (10, 20, 50)}, e
r = subprocess.run([sys.executable, model, "recommend", "--workers", "12", "--cores", "16"],
                   check=True, capture_output=True, text=True, timeout=60).stdout
assert r.strip() == "8", r  # one ps per worker, at most two per core the workers leave
bad = subprocess.run([sys.executable, os.path.join(bench, "bench_scaling.py"), "--workers", "0"],
                     capture_output=True, text=True, timeout=60)
assert bad.returncode == 2 and "at least 1" in bad.stderr, bad.stderr
os.remove(out_json)
os.rmdir(os.path.dirname(out_json))
print("bench_scaling_smoke: %d points, model compare and extrapolation ok" % len(doc["points"]))
]=])
add_test(NAME bench_scaling_smoke
         COMMAND ${QR_VENV_PYTHON} -c "${qr_bench_scaling_check}" ${PROJECT_SOURCE_DIR})
# Python loads this build's libquorum.so here (QUORUM_LIBRARY): a sanitizer
# build's cannot be loaded into a Python built without ASan (its runtime must
# come first), so both are labelled slow, which the sanitizer pass skips.
set_tests_properties(bench_scaling_smoke PROPERTIES TIMEOUT 600 LABELS slow
                     ENVIRONMENT "${qr_bench_python_env}")

# bench_netns.py --quick: a ps and a worker in two namespaces of their own
# over a shaped veth link (netem, or tbf and the relay), both modes, each
# point beside the model's; skipped (77, the reason printed) only where
# namespaces cannot be made. Its namespaces are gone afterwards.
set(qr_bench_netns_check [=[
import json, os, subprocess, sys
bench = os.path.join(sys.argv[1], "bench", "python", "bench_netns.py")
p = subprocess.run([sys.executable, bench, "--quick", "--json"], capture_output=True, text=True,
                   timeout=280)
if p.returncode == 77:
    print(p.stdout.strip())
    sys.exit(77)
assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
doc = json.loads(p.stdout.splitlines()[-1])
assert doc["shaping"] and doc["params"]["apply_rate"] > 0, doc
got = {(r["mode"], r["size_bytes"]) for r in doc["results"]}
assert got == {(m, s) for m in ("async", "sync") for s in (4096, 262144)}, got
for r in doc["results"]:
    assert r["median_s"] > 0 and r["predicted_s"] > 0 and r["steps"] >= 3, r
    # the set round trip (2 ms) is on every step: the link was really shaped
    assert r["median_s"] > 0.002, r
left = [l.split()[0] for l in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                             text=True).stdout.splitlines() if l.strip()]
assert len(doc["namespaces"]) == 2 and not set(doc["namespaces"]) & set(left), (doc, left)
bad = subprocess.run([sys.executable, bench, "--sizes", "7"], capture_output=True, text=True,
                     timeout=60)
assert bad.returncode == 2 and "multiples of 4" in bad.stderr, bad.stderr
print("bench_netns_smoke: %s, %d points" % (doc["shaping"], len(doc["results"])))
]=])
add_test(NAME bench_netns_smoke
         COMMAND ${QR_VENV_PYTHON} -c "${qr_bench_netns_check}" ${PROJECT_SOURCE_DIR})
set_tests_properties(bench_netns_smoke PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS slow
                     ENVIRONMENT "${qr_bench_python_env}")

# bench_replicas.py --quick (issue 29, item 7): a training run with one
# copy and one with two (--ps-replicas 1, 2) in the same run, async, and
# sync tried: a table of steps/s, their ratio against the goal, accuracy
# and the ps tasks' peak RSS; sync either measured the same way or skipped
# with launch's refusal. Plain python3 (no torch). Timings not checked.
set(qr_bench_replicas_check [=[
import json, os, re, subprocess, sys, tempfile
bench = os.path.join(sys.argv[1], "bench", "python", "bench_replicas.py")
out_json = os.path.join(tempfile.mkdtemp(prefix="qr-replicas-"), "replicas.json")
p = subprocess.run([sys.executable, bench, "--quorum", sys.argv[2], "--quick", "--json", out_json],
                   capture_output=True, text=True, timeout=250)
assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
row = re.search(r"^\| async \| (\d+\.\d) \| (\d+\.\d) \| (\d+\.\d\d) \((met|NOT met)\) \| "
                r"(\d\.\d{4}) / (\d\.\d{4}) \| (\d+\.\d) / (\d+\.\d) \(\d+\.\d\dx\) \|$", p.stdout, re.M)
assert row, p.stdout
assert re.search(r"^\| sync \| (\d+\.\d \||skipped: .*not built yet)", p.stdout, re.M), p.stdout
doc = json.load(open(out_json))
res = {r["mode"]: r for r in doc["results"]}
a = res["async"]
for c in ("copies_1", "copies_2"):
    assert a[c]["median_steps_per_s"] > 0 and a[c]["median_accuracy"] > 0.5, a
    assert a[c]["median_ps_peak_rss_mib"] > 1, a
assert a["ratio"] > 0 and a["goal"] == 0.85 and "memory_ratio" in a, a
assert "skipped" in res["sync"] or res["sync"]["ratio"] > 0, res["sync"]
bad = subprocess.run([sys.executable, bench, "--quorum", sys.argv[2], "--ps", "1"],
                     capture_output=True, text=True, timeout=60)
assert bad.returncode == 2 and "at least 2" in bad.stderr, bad.stderr
os.remove(out_json)
os.rmdir(os.path.dirname(out_json))
print("bench_replicas_smoke: async ratio %.2f, sync %s" % (
    a["ratio"], res["sync"].get("skipped") or "%.2f" % res["sync"]["ratio"]))
]=])
add_test(NAME bench_replicas_smoke
         COMMAND ${QR_PYTHON} -c "${qr_bench_replicas_check}" ${PROJECT_SOURCE_DIR}
                 $<TARGET_FILE:quorum>)
set_tests_properties(bench_replicas_smoke PROPERTIES TIMEOUT 300)

# bench_rerep.py at 8 MiB (issue 29, item 7): a shard's re-replication to
# a replacement ps over each transport, idle and with pushes meanwhile,
# against the same bytes through one socket of that transport: a table of
# bytes, seconds, GB/s and the ratio, the best per transport and mode, and
# the JSON. Plain python3. Timings not checked.
set(qr_bench_rerep_check [=[
import json, os, re, subprocess, sys, tempfile
bench = os.path.join(sys.argv[1], "bench", "python", "bench_rerep.py")
out_json = os.path.join(tempfile.mkdtemp(prefix="qr-rerep-"), "rerep.json")
p = subprocess.run([sys.executable, bench, "--quorum", sys.argv[2], "--shard-mib", "8",
                    "--push-rate", "200", "--json", out_json], capture_output=True, text=True,
                   timeout=280)
assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
rows = re.findall(r"^\| (unix|tcp) \| (idle|busy) \| (\d+) \| (\d+\.\d{3}) \| (\d+\.\d{3}) \| "
                  r"(\d+\.\d{3}) \| (\d+\.\d{3}) \| (\d+\.\d{3}) \| (\d+\.\d{3}) \| (\d+) \| "
                  r"(\d+) / (\d+) \|$",
                  p.stdout, re.M)
assert sorted((r[0], r[1]) for r in rows) == sorted(
    (t, m) for t in ("unix", "tcp") for m in ("idle", "busy")), p.stdout
for r in rows:
    assert int(r[2]) > 8 << 20, r  # the shard's 8 MiB and the snapshot's head
for t in ("unix", "tcp"):
    for m in ("idle", "busy"):
        assert re.search(r"^best %s %s: copy \d+\.\d{3} GB/s, socket \d+\.\d{3} GB/s, ratio "
                         r"\d+\.\d{3} \((met|NOT met)\)$" % (t, m), p.stdout, re.M), p.stdout
doc = json.load(open(out_json))
assert doc["shard_mib"] == 8 and doc["goal"] == 0.5 and len(doc["rows"]) == 4, doc
for r in doc["rows"]:
    assert r["copy_s"] > 0 and r["socket_s"] > 0 and r["ratio"] > 0, r
    assert r["caught_up_s"] >= r["copy_s"] - 0.002, r
    assert (r["pushes_meanwhile"] > 0) == (r["mode"] == "busy"), r
    assert r["source_peak_rss_mib"] > 8 and r["replacement_peak_rss_mib"] > 8, r
bad = subprocess.run([sys.executable, bench, "--quorum", sys.argv[2], "--shard-mib", "0"],
                     capture_output=True, text=True, timeout=60)
assert bad.returncode == 2 and "--shard-mib must be 1 to" in bad.stderr, bad.stderr
bad = subprocess.run([sys.executable, bench, "--quorum", sys.argv[2], "--transports", "udp"],
                     capture_output=True, text=True, timeout=60)
assert bad.returncode != 0 and "--transports" in bad.stderr, bad.stderr
os.remove(out_json)
os.rmdir(os.path.dirname(out_json))
print("bench_rerep_smoke: " + " | ".join(p.stdout.strip().splitlines()[-4:]))
]=])
add_test(NAME bench_rerep_smoke
         COMMAND ${QR_PYTHON} -c "${qr_bench_rerep_check}" ${PROJECT_SOURCE_DIR}
                 $<TARGET_FILE:quorum>)
set_tests_properties(bench_rerep_smoke PROPERTIES TIMEOUT 300)

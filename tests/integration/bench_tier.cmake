# Smoke test of `quorum bench tier`: a small table four times its cap and
# the same all in memory run end to end; both tiers hold rows, and the
# rows in memory fit the cap. Figures printed, not checked.
set(qr_bench_tier_check [=[
import json, subprocess, sys
out = subprocess.run([sys.argv[1], "bench", "tier", "--rows", "200000", "--dim", "16",
                      "--memory-mb", "7", "--seconds", "0.5", "--baseline", "--json"],
                     check=True, capture_output=True, text=True, timeout=240).stdout
lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
capped, whole, ratio = lines
assert capped["rows_disk"] > 2 * capped["rows_memory"] > 0, capped
assert capped["rows_memory"] * (16 * 8 + 17) <= 7 << 20, capped
assert capped["rows_memory"] + capped["rows_disk"] == 200000, capped
assert whole["rows_memory"] == 200000 and whole["rows_disk"] == 0, whole
print("bench_tier_smoke: Zipf ratio %.2f, RssAnon %.1f vs %.1f MiB" % (
    ratio["zipf_ratio"], capped["rss_anon_mb"], whole["rss_anon_mb"]))
]=])
add_test(NAME bench_tier_smoke
         COMMAND ${QR_PYTHON} -c "${qr_bench_tier_check}" $<TARGET_FILE:quorum>)
set_tests_properties(bench_tier_smoke PROPERTIES TIMEOUT 300)

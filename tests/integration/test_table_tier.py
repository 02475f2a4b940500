"""test_table_tier.py - a table larger than memory, measured from outside:
`quorum launch` trains the wide-deep click model (embedding dim 64,
Adagrad) on a click set whose tables hold about four times what
--table-memory-mb lets the ps keep in memory, and the ps's anonymous
resident memory (RssAnon of /proc/PID/status, sampled every 50 ms) must
stay within the cap plus a fixed overhead (OVERHEAD_MB: the ps's own
buffers and the request in flight; docs/EMBEDDINGS.md). The same run
without the cap is measured beside it: it must exceed that bound (the test
tells the two apart) and reach the same test AUC within 0.01 (async
training is not bit for bit). And in sync mode over 2 ps, where training
is deterministic, a run with each ps's tables about four times its cap
ends with the parameters of the all-in-memory run bit for bit (the same
params_digest). Usage:
    test_table_tier.py QUORUM_BINARY"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from qrtest import Proc, last_json, sanitized, wait_sampling_ps_rss

OVERHEAD_MB = 24
CAP_MB = 24

quorum = sys.argv[1]
work = tempfile.mkdtemp(prefix="qr-tier-")


def run(extra, nps=1):
    """A launch with nps ps, 2 workers; its JSON and the peak RssAnon (MiB)
    of a ps."""
    proc = Proc([quorum, "launch", "--ps", str(nps), "--workers", "2", "--model", "wide-deep",
                 "--embedding-dim", "64", "--data", data, "--json", "--quiet"] + extra)
    rc, out, err, peak_mb = wait_sampling_ps_rss(proc, 900, 0.05)
    assert rc == 0, "launch %s exited %d\n%s" % (extra, rc, err[-4000:])
    return last_json(out), peak_mb


try:
    data = os.path.join(work, "ctr")
    subprocess.run([quorum, "gen-ctr", "--out", data, "--rows", "100000"], check=True,
                   capture_output=True, text=True, timeout=120)
    whole, whole_mb = run(["--epochs", "1"])
    tiered, tiered_mb = run(["--epochs", "1", "--table-memory-mb", str(CAP_MB)])
    bound = CAP_MB + OVERHEAD_MB
    print(json.dumps({"all_in_memory": {"rss_anon_mb": round(whole_mb, 1),
                                        "test_auc": whole["test_auc"],
                                        "examples_per_sec": whole["examples_per_sec"]},
                      "tiered": {"rss_anon_mb": round(tiered_mb, 1),
                                 "test_auc": tiered["test_auc"],
                                 "examples_per_sec": tiered["examples_per_sec"]},
                      "cap_mb": CAP_MB, "bound_mb": bound,
                      "throughput_ratio": tiered["examples_per_sec"] / whole["examples_per_sec"]}))
    if sanitized(quorum):
        # ASan's shadow memory and quarantine are most of the RSS: the bound
        # is checked by the plain build.
        print("(a sanitizer build: the memory bound is checked by the plain build)")
    else:
        assert tiered_mb <= bound, "ps RssAnon %.1f MiB over the cap + overhead %d MiB" % (
            tiered_mb, bound)
        assert whole_mb > bound, "the all-in-memory run (%.1f MiB) is within %d MiB: the " \
            "table is too small to tell" % (whole_mb, bound)
    assert abs(tiered["test_auc"] - whole["test_auc"]) < 0.01, (tiered, whole)
    sync = ["--mode", "sync", "--epochs", "1"]
    whole_sync, _ = run(sync, nps=2)
    tiered_sync, _ = run(sync + ["--table-memory-mb", "12"], nps=2)
    assert tiered_sync["params_digest"] == whole_sync["params_digest"], (tiered_sync, whole_sync)
    print("PASS: ps RssAnon %.1f MiB with --table-memory-mb %d (bound %d), %.1f MiB without; "
          "sync over 2 ps with tables 4x the cap: params_digest %s as all in memory"
          % (tiered_mb, CAP_MB, bound, whole_mb, tiered_sync["params_digest"]))
finally:
    shutil.rmtree(work, ignore_errors=True)

"""test_overlap.py - a worker's communication under its compute (--overlap,
src/train/train.c) changes when values move, never what they are.
Usage: test_overlap.py QUORUM_BINARY CASE, CASE one of:
  sync      seeded sync runs end with the same params_digest with overlap on
            and off, and the same as the single-process reference
  async     one async worker (2 ps) ends with the same params_digest with
            overlap on and off (SGD and Adam: every apply of a step uses
            the step number one push would give it), and 3 async workers
            with overlap on reach the accuracy of test_train.py
  pipeline  --overlap pipeline (async: a step's push and pull on a thread
            under the next step's compute, src/train/pipeline.c): one worker
            ends on the same params_digest in two runs, a different one from
            overlap off (its gradients are one step staler), at the
            accuracy of off; 3 workers reach test_train.py's accuracy
  flags     --overlap takes auto|on|off|pipeline, on and pipeline are refused
            where a step pushes once (--accumulate, the click models),
            pipeline in sync mode, and auto decides by the rule of the
            README: on when this machine's cores outnumber what its tasks
            use (pipeline for async runs of several workers)"""

import os
import sys

from qrtest import Proc, last_json

quorum, case = sys.argv[1], sys.argv[2]


def run(cmd, args, expect_rc=0):
    rc, out, err = Proc([quorum, cmd] + args + ["--json", "--quiet"]).wait(600)
    assert rc == expect_rc, "%s %s exited %d\n%s" % (cmd, " ".join(args), rc, err[-3000:])
    return (last_json(out) if rc == 0 else None), err


COMMON = ["--data", "digits", "--steps", "60", "--seed", "11", "--batch-size", "32"]

if case == "sync":
    sync = ["--mode", "sync", "--init-tokens", "0", "--ps", "2", "--workers", "3"] + COMMON
    for opt in (["--lr", "0.1"], ["--optimizer", "adam", "--lr", "0.001"]):
        on, _ = run("launch", sync + opt + ["--overlap", "on"])
        off, _ = run("launch", sync + opt + ["--overlap", "off"])
        ref, _ = run("train", ["--local", "--virtual-workers", "3"] + COMMON + opt)
        print(opt, "on:", on["params_digest"], "off:", off["params_digest"],
              "local:", ref["params_digest"])
        assert on["overlap"] is True and off["overlap"] is False, (on["overlap"], off["overlap"])
        assert on["params_digest"] == off["params_digest"] == ref["params_digest"]
        assert on["sync"]["in_quorum"] == [60, 60, 60], on["sync"]
    print("PASS: sync digests equal with overlap on and off")

elif case == "async":
    one = ["--mode", "async", "--ps", "2", "--workers", "1", "--steps", "100",
           "--seed", "5", "--batch-size", "32", "--data", "digits"]
    for opt in (["--lr", "0.1"], ["--optimizer", "adam", "--lr", "0.001"]):
        on, _ = run("launch", one + opt + ["--overlap", "on"])
        off, _ = run("launch", one + opt + ["--overlap", "off"])
        print(opt, "on:", on["params_digest"], "off:", off["params_digest"])
        assert on["overlap"] is True and off["overlap"] is False
        assert on["params_digest"] == off["params_digest"], (on, off)
        assert on["global_step"] == off["global_step"] == 100
    # test_train.py's run, overlapped
    three, _ = run("launch", ["--ps", "2", "--workers", "3", "--model", "mlp", "--hidden",
                              "256,128", "--data", "digits", "--epochs", "60", "--lr", "0.1",
                              "--batch-size", "64", "--seed", "7", "--lr-decay-rate", "0.3",
                              "--lr-decay-steps", "1350", "--overlap", "on"])
    print(three)
    assert three["overlap"] is True
    assert three["test_accuracy"] >= 0.95, three["test_accuracy"]
    print("PASS: async overlap: same values for one worker, accuracy %.4f for three"
          % three["test_accuracy"])

elif case == "pipeline":
    one = ["--mode", "async", "--ps", "1", "--workers", "1", "--steps", "300", "--seed", "5",
           "--batch-size", "32", "--data", "digits", "--model", "mlp", "--lr", "0.1"]
    a, _ = run("launch", one + ["--overlap", "pipeline"])
    b, _ = run("launch", one + ["--overlap", "pipeline"])
    off, _ = run("launch", one + ["--overlap", "off"])
    print("pipeline:", a["params_digest"], b["params_digest"], a["test_accuracy"],
          "off:", off["params_digest"], off["test_accuracy"])
    assert a["pipeline"] is True and a["overlap"] is True and off["pipeline"] is False
    assert a["params_digest"] == b["params_digest"], (a, b)
    assert a["params_digest"] != off["params_digest"]  # one step staler: other values
    assert a["global_step"] == 300
    assert a["test_accuracy"] >= off["test_accuracy"] - 0.02, (a, off)
    three, _ = run("launch", ["--ps", "2", "--workers", "3", "--model", "mlp", "--hidden",
                              "256,128", "--data", "digits", "--epochs", "60", "--lr", "0.1",
                              "--batch-size", "64", "--seed", "7", "--lr-decay-rate", "0.3",
                              "--lr-decay-steps", "1350", "--overlap", "pipeline"])
    assert three["pipeline"] is True
    assert three["test_accuracy"] >= 0.95, three["test_accuracy"]
    print("PASS: pipelined async: one worker deterministic and one step staler, "
          "accuracy %.4f for three" % three["test_accuracy"])

elif case == "flags":
    _, err = run("launch", ["--ps", "1", "--workers", "1", "--overlap", "sometimes"] + COMMON,
                 expect_rc=2)
    assert "expected auto, on, off or pipeline" in err, err[-2000:]
    _, err = run("launch", ["--ps", "1", "--workers", "1", "--mode", "sync", "--overlap",
                            "pipeline"] + COMMON, expect_rc=1)
    assert "--overlap pipeline is for --mode async" in err, err[-2000:]
    _, err = run("launch", ["--ps", "1", "--workers", "1", "--overlap", "pipeline",
                            "--local-steps", "2"] + COMMON, expect_rc=1)
    assert "--overlap pipeline: a step of several batches" in err, err[-2000:]
    _, err = run("launch", ["--ps", "1", "--workers", "1", "--overlap", "on", "--accumulate",
                            "2"] + COMMON, expect_rc=1)
    assert "--overlap on: a step of several batches" in err, err[-2000:]
    _, err = run("train", ["--local", "--overlap", "on"] + COMMON, expect_rc=2)
    assert "overlap" in err, err[-2000:]
    # auto: 2 ps and 1 worker here, one compute thread each (the launcher
    # sets OPENBLAS_NUM_THREADS=1): on with 4 cores or more
    cores = len(os.sched_getaffinity(0))
    auto, err = run("launch", ["--ps", "2", "--workers", "1"] + COMMON)
    assert auto["overlap"] is (cores > 3), (cores, auto["overlap"])
    assert "overlap %s: %d cores for this machine's tasks, which use 3" % (
        "on" if cores > 3 else "off", cores) in err, err[-2000:]
    accumulate, _ = run("launch", ["--ps", "2", "--workers", "1", "--accumulate", "2"] + COMMON)
    assert accumulate["overlap"] is False
    # several async workers: pipeline where a core is spare (1 ps, 2 workers: 4 cores)
    two, err = run("launch", ["--ps", "1", "--workers", "2"] + COMMON)
    assert two["pipeline"] is (cores > 3) and two["overlap"] is (cores > 3), (cores, two)
    assert "overlap %s: %d cores" % ("pipeline" if cores > 3 else "off", cores) in err
    print("PASS: --overlap flags, auto is %s on %d cores" % (auto["overlap"], cores))

else:
    sys.exit("unknown case " + case)

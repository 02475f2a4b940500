"""step_model.py - the cost of a sync and an async step of data-parallel
training on quorum's ps tier, from the model's bytes, the worker and ps
counts, the link's bandwidth and round-trip time, the ps's apply rate and
the worker's compute time (docs/PERFORMANCE.md explains each term), and
the scripts that check it against measurements (issue 27, item 6):

    step_model.py compare SCALING.json [--wire W.json] [--optim O.json]
        predicted vs measured examples/s for every point of a
        bench_scaling.py run (its JSON carries the measured link, apply
        rate and compute times; --wire/--optim replace them with a
        `quorum bench wire --json` / `quorum bench optim --json` run's)
    step_model.py extrapolate [SCALING.json] [--gbit 25] [--rtt-us 50] ...
        what 100 and 1,000 workers with 10 to 50 ps tasks reach on a
        25 Gbit/s network
    step_model.py recommend --workers N [--cores C] ...
        the ps count for N workers (the rule bench_scaling.py uses)

Units inside: bytes, seconds, bytes per second. Nothing here measures;
bench_scaling.py and bench_netns.py do, and import this module."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

MLP_DIMS = (784, 1024, 256, 10)  # the benchmarks' MLP: 1.07 M parameters
GBIT = 1e9 / 8  # bytes/s in one Gbit/s
# The share of a worker's compute time the busiest ps may spend on one
# step's work before sync mode pays for it (its work is on the step's
# critical path): the ps-count rule below keeps the ps's time within it.
PS_BUDGET = 0.3


def mlp_variables(dims: Sequence[int] = MLP_DIMS) -> List[Tuple[int, int]]:
    """(bytes, rows) of each variable in declaration order, as the C trainer
    and torch.nn.Linear declare them: weights then bias, layer by layer."""
    out = []
    for a, b in zip(dims[:-1], dims[1:]):
        out += [(4 * a * b, b), (4 * b, b)]
    return out


def partition_count(nbytes: int, rows: int, nps: int, min_mb: float) -> int:
    """cluster/placement.c's qr_partition_count (TensorFlow's
    min_max_variable_partitioner) for --partition-min-mb."""
    if min_mb <= 0:
        return 1
    return max(1, min(int(math.ceil(nbytes / (min_mb * 1048576.0))), nps, rows))


def busiest_fraction(variables: Sequence[Tuple[int, int]], nps: int,
                     partition_min_mb: float = 0.0) -> float:
    """The share of the model's bytes on the most loaded ps: placement.c's
    greedy least-loaded placement of the variables (their shards each on a
    different ps), in declaration order. 1/P is the ideal; a model with one
    large variable and no partitioning stays at that variable's share."""
    load = [0] * nps
    for nbytes, rows in variables:
        k = partition_count(nbytes, rows, nps, partition_min_mb)
        used: set = set()
        for j in range(k):
            part = rows // k + (1 if j < rows % k else 0)
            best = min((p for p in range(nps) if p not in used), key=lambda p: (load[p], p))
            used.add(best)
            load[best] += nbytes * part // rows
    return max(load) / float(sum(load))


@dataclass
class Step:
    """One configuration. bandwidth: bytes/s each way of one endpoint's link
    (a worker's, a ps's); rtt: a request's round trip without payload;
    apply_rate: bytes/s of gradient a ps reduces or applies (SGD, one
    thread); compute: a worker's forward+backward+step alone, seconds."""
    model_bytes: float
    workers: int
    ps: int
    bandwidth: float
    rtt: float
    apply_rate: float
    compute: float
    batch: int
    busiest: Optional[float] = None  # share of the bytes on the busiest ps (None: 1/ps)
    sync_rtts: int = 3                # push, token, pull; 1 with the one-trip sync push_pull
    overlap: bool = False             # communication hidden behind compute (max, not sum)

    def share(self) -> float:
        return self.busiest if self.busiest is not None else 1.0 / self.ps


def sync_step(s: Step) -> Dict[str, float]:
    """A synchronous step: every worker computes, pushes its gradient (B
    bytes split over the ps tasks), the busiest ps takes N pushes of f*B
    in (its link, or a worker's own link if slower), reduces them and
    applies once, and sends N pulls of f*B out; R round trips of latency.
    The ps's work is on the critical path: nothing else moves meanwhile."""
    b, n, f = s.model_bytes, s.workers, s.share()
    ingress = max(b, n * f * b) / s.bandwidth
    egress = max(b, n * f * b) / s.bandwidth
    ps_cpu = (n + 1) * f * b / s.apply_rate  # N gradients summed, one apply
    latency = s.sync_rtts * s.rtt
    comm = latency + ingress + ps_cpu + egress
    step = max(s.compute, comm) if s.overlap else s.compute + comm
    return {"step_s": step, "compute_s": s.compute, "comm_s": comm, "latency_s": latency,
            "ingress_s": ingress, "ps_apply_s": ps_cpu, "egress_s": egress,
            "examples_per_s": n * s.batch / step,
            "bound": "compute" if s.overlap and s.compute >= comm else
            max((("latency", latency), ("ps link", ingress + egress), ("ps apply", ps_cpu),
                 ("compute", s.compute)), key=lambda kv: kv[1])[0]}


def async_step(s: Step) -> Dict[str, float]:
    """Asynchronous steps: each worker cycles compute, one fused push_pull
    (one round trip, B up and B down over its link, f*B applied by each ps
    as it arrives); the cluster runs at the slower of the workers' cycles
    and the busiest ps's service rate (each push costs it f*B over its link
    each way, full duplex, and f*B of apply on its one thread)."""
    b, n, f = s.model_bytes, s.workers, s.share()
    comm = s.rtt + 2 * b / s.bandwidth + f * b / s.apply_rate
    cycle = max(s.compute, comm) if s.overlap else s.compute + comm
    per_push = f * b * max(1.0 / s.bandwidth, 1.0 / s.apply_rate)
    steps_per_s = min(n / cycle, 1.0 / per_push)
    return {"step_s": n / steps_per_s, "compute_s": s.compute, "comm_s": comm,
            "cycle_s": cycle, "ps_per_push_s": per_push,
            "examples_per_s": steps_per_s * s.batch,
            "bound": "workers" if n / cycle <= 1.0 / per_push else "ps"}


def recommend_ps(workers: int, cores: Optional[int] = None, model_bytes: Optional[float] = None,
                 bandwidth: Optional[float] = None, apply_rate: Optional[float] = None,
                 compute: Optional[float] = None, budget: float = PS_BUDGET) -> int:
    """The ps count for `workers` workers: the fewest ps tasks whose busiest
    one spends at most `budget` of a worker's compute time on a step
    (N*B/P of link each way and (N+1)*B/P of reduce and apply, the model
    partitioned P ways). Without the measured terms: one ps per worker,
    what that rule gives for the benchmarks' MLP on loopback (B 4.3 MB:
    about 1.5 ms of a ps thread's time per worker per step against 5 ms of
    compute at batch 128; docs/PERFORMANCE.md, "How many ps tasks"). On
    one machine of `cores` cores the ps tasks may share cores with the
    workers, since a sync ps is busy a third of a step or less (measured
    0.2-0.45 of a core): at most 2 * (cores - workers) of them, and at
    least 1."""
    if workers < 1:
        raise ValueError("recommend_ps: workers must be at least 1, got %d" % workers)
    if None in (model_bytes, bandwidth, apply_rate, compute):
        want = workers
    else:
        assert model_bytes and bandwidth and apply_rate and compute
        per_worker = model_bytes * (2.0 / bandwidth + 1.0 / apply_rate)
        want = int(math.ceil(workers * per_worker / (budget * compute)))
    if cores is not None:
        want = min(want, 2 * (cores - workers))
    return max(1, want)


# ---- measured parameters -------------------------------------------------------------

def link_from_wire(doc: Dict[str, Any], apply_rate: float,
                   transport: Optional[str] = None) -> Dict[str, float]:
    """Bandwidth and round trip from `quorum bench wire --json` points of
    one worker and one ps: rtt is the fused push_pull's latency at the
    smallest size (1 round trip, a few bytes); bandwidth each way from the
    largest: t = rtt + 2S/bw + S/apply (the bench's ps applies SGD)."""
    pts = [r for r in doc["results"] if r.get("workers") == 1 and r.get("ps") == 1 and
           (transport is None or r["transport"] == transport)]
    fused = sorted((r for r in pts if r["op"] == "fused"), key=lambda r: r["size_bytes"])
    if len(fused) < 2:
        raise ValueError("bench wire JSON: need fused points of 1 worker and 1 ps at two sizes "
                         "at least (--ops fused --ps 1 --workers 1 --sizes 64,4M)")
    rtt = fused[0]["latency_us"] * 1e-6
    big = fused[-1]
    size = float(big["size_bytes"])
    left = big["latency_us"] * 1e-6 - rtt - size / apply_rate
    if left <= 0:
        raise ValueError("bench wire JSON: the largest fused point (%d B, %.1f us) is no slower "
                         "than its round trip and apply: cannot derive a bandwidth"
                         % (size, big["latency_us"]))
    return {"rtt_s": rtt, "bandwidth": 2 * size / left, "transport": big["transport"],
            "size_bytes": size}


def apply_from_optim(doc: Dict[str, Any]) -> float:
    """Bytes of gradient per second of one ps thread's dense SGD apply, from
    `quorum bench optim --json` (elements/s x 4)."""
    for r in doc["results"]:
        if r["optimizer"] == "sgd" and r["kind"] == "dense" and r["threads"] == 1:
            return float(r["elements_per_sec"]) * 4
    raise ValueError("bench optim JSON: no dense sgd point with 1 thread (--optim sgd "
                     "--no-sparse --threads 1)")


# ---- against a bench_scaling.py run ---------------------------------------------------

# bench_scaling.py's modes: (kind, sync, compute key, batch key)
MODES = {"qt_sync": ("torch", True), "qt_async": ("torch", False),
         "c_sync": ("c", True), "c_async": ("c", False)}


def predict_point(doc: Dict[str, Any], mode: str, workers: int, ps: int,
                  sync_rtts: int, overlap: bool = False,
                  compute: Optional[float] = None) -> Dict[str, float]:
    """The model's figure for one point of a bench_scaling.py run, from the
    parameters the run measured (doc["params"]); `compute` replaces the
    compute measured alone."""
    kind, sync = MODES[mode]
    p = doc["params"]
    variables = mlp_variables(doc["config"]["mlp_dims"])
    s = Step(model_bytes=float(sum(v for v, _ in variables)), workers=workers, ps=ps,
             bandwidth=p["bandwidth"], rtt=p["rtt_s"], apply_rate=p["apply_rate"],
             compute=p["compute_s"][kind] if compute is None else compute,
             batch=doc["config"]["batch"][kind],
             busiest=busiest_fraction(variables, ps, doc["config"]["partition_min_mb"]),
             sync_rtts=sync_rtts, overlap=overlap)
    return sync_step(s) if sync else async_step(s)


def compute_in_run(doc: Dict[str, Any], pt: Dict[str, Any]) -> Optional[float]:
    """A worker's compute per step as the run itself measured it, where the
    workers timed their optimizer's step (torch modes, --profile): the
    step's time (workers x batch / examples/s) less the share spent in
    step(). On a machine whose workers share cores, caches and memory
    bandwidth this is slower than the compute measured alone, and the
    difference is no communication's."""
    shares = [r["wait_share"] for r in pt.get("profile", [])
              if r.get("wait_share") is not None]
    if not shares or not pt.get("examples_per_s"):
        return None
    shares.sort()
    wait = shares[len(shares) // 2] if len(shares) % 2 else \
        0.5 * (shares[len(shares) // 2 - 1] + shares[len(shares) // 2])
    batch = doc["config"]["batch"][MODES[pt["mode"]][0]]
    return float(pt["workers"] * batch / pt["examples_per_s"] * (1.0 - wait))


def expected_max(sample: Sequence[float], n: int) -> float:
    """E[max of n independent draws] from the empirical distribution of
    `sample`: sum over the sorted values x_(i) of x_(i) ((i/m)^n -
    ((i-1)/m)^n), each value's probability of being the largest of n. A sync
    step starts its communication when the slowest of its n workers is
    done: this, not the mean compute, is the compute term of a sync step
    whose workers' compute varies from step to step."""
    xs = sorted(sample)
    m = len(xs)
    if m == 0 or n < 1:
        raise ValueError("expected_max: need a sample and n >= 1")
    return sum(x * ((i / m) ** n - ((i - 1) / m) ** n) for i, x in enumerate(xs, 1))


def straggler_compute(pt: Dict[str, Any]) -> Optional[float]:
    """A sync point's compute term with its stragglers (seconds): the
    expected slowest of its workers' compute, from the pooled quantiles of
    the step compute they timed (bench_torch.py), median over the rounds."""
    vals = sorted(expected_max(r["compute_ms_sample"], pt["workers"]) * 1e-3
                  for r in pt.get("profile", []) if r.get("compute_ms_sample"))
    if not vals:
        return None
    k = len(vals)
    return vals[k // 2] if k % 2 else 0.5 * (vals[k // 2 - 1] + vals[k // 2])


def compare(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Every measured point of a bench_scaling.py run beside the model's
    prediction (3 and 1 round trips for sync), and, where the run measured
    its workers' compute (compute_in_run), the prediction from that compute:
    what is left between it and the measurement is the model's
    communication and waiting, with the machine's sharing taken out."""
    rows = []
    for pt in doc["points"]:
        if pt["mode"] not in MODES or not pt.get("examples_per_s"):
            continue
        sync = MODES[pt["mode"]][1]
        p3 = predict_point(doc, pt["mode"], pt["workers"], pt["ps"], 3)
        p1 = predict_point(doc, pt["mode"], pt["workers"], pt["ps"], 1) if sync else p3
        row = {"workers": pt["workers"], "ps": pt["ps"], "mode": pt["mode"],
               "measured": pt["examples_per_s"], "predicted_3rtt": p3["examples_per_s"],
               "predicted_1rtt": p1["examples_per_s"],
               "measured_over_predicted": pt["examples_per_s"] / p3["examples_per_s"],
               "bound": p3["bound"]}
        c = compute_in_run(doc, pt)
        if c is not None:
            pr = predict_point(doc, pt["mode"], pt["workers"], pt["ps"], 3, compute=c)
            row.update(compute_in_run_s=c, predicted_in_run=pr["examples_per_s"],
                       measured_over_in_run=pt["examples_per_s"] / pr["examples_per_s"])
        slow = straggler_compute(pt) if sync else None
        if slow is not None:
            ps_ = predict_point(doc, pt["mode"], pt["workers"], pt["ps"], 3, compute=slow)
            row.update(compute_slowest_s=slow, predicted_straggler=ps_["examples_per_s"],
                       measured_over_straggler=pt["examples_per_s"] / ps_["examples_per_s"])
        rows.append(row)
    return rows


def print_compare(rows: List[Dict[str, Any]], out: Any = sys.stdout) -> None:
    out.write("model vs measurement (examples/s; sync predicted with 3 round trips a step, "
              "and 1; 'run': with the mean compute the workers timed in the run, where they "
              "did; 'slow': sync, with the expected slowest of the workers' compute)\n")
    out.write("  %-8s %7s %3s %10s %12s %12s %9s %9s %9s %9s %9s  %s\n" % (
        "mode", "workers", "ps", "measured", "model 3 RTT", "model 1 RTT", "meas/mod",
        "comp ms", "meas/run", "slowest", "meas/slow", "bound"))
    for r in rows:
        run = ("%9.2f %8.2fx" % (r["compute_in_run_s"] * 1e3, r["measured_over_in_run"])
               if "compute_in_run_s" in r else "%9s %9s" % ("-", "-"))
        slow = ("%9.2f %8.2fx" % (r["compute_slowest_s"] * 1e3, r["measured_over_straggler"])
                if "compute_slowest_s" in r else "%9s %9s" % ("-", "-"))
        out.write("  %-8s %7d %3d %10.0f %12.0f %12.0f %8.2fx %s %s  %s\n" % (
            r["mode"], r["workers"], r["ps"], r["measured"], r["predicted_3rtt"],
            r["predicted_1rtt"], r["measured_over_predicted"], run, slow, r["bound"]))


# ---- 100 and 1,000 workers -------------------------------------------------------------

def extrapolate(apply_rate: float, compute: float, batch: int, gbit: float = 25.0,
                rtt: float = 50e-6, model_bytes: float = float(sum(v for v, _ in mlp_variables())),
                workers: Sequence[int] = (100, 1000), ps: Sequence[int] = (10, 20, 50)
                ) -> List[Dict[str, Any]]:
    """The model's figures for large clusters: every worker and ps on a
    link of `gbit` Gbit/s, the model partitioned evenly over the ps
    tasks (f = 1/P), sync with 3 and 1 round trips, with and without
    overlap; async."""
    rows = []
    for n in workers:
        for p in ps:
            base = Step(model_bytes=model_bytes, workers=n, ps=p, bandwidth=gbit * GBIT, rtt=rtt,
                        apply_rate=apply_rate, compute=compute, batch=batch)
            s3 = sync_step(base)
            s1 = sync_step(replace(base, sync_rtts=1))
            s1o = sync_step(replace(base, sync_rtts=1, overlap=True))
            a = async_step(base)
            rows.append({"workers": n, "ps": p, "sync_3rtt": s3["examples_per_s"],
                         "sync_1rtt": s1["examples_per_s"],
                         "sync_1rtt_overlap": s1o["examples_per_s"],
                         "async": a["examples_per_s"], "sync_step_ms": s1["step_s"] * 1e3,
                         "sync_bound": s1["bound"], "async_bound": a["bound"],
                         "ideal": n * batch / compute})
    return rows


def print_extrapolation(rows: List[Dict[str, Any]], gbit: float, rtt: float, apply_rate: float,
                        compute: float, batch: int, model_bytes: float,
                        out: Any = sys.stdout) -> None:
    out.write("model: %.2f MB of float32 parameters, %.0f Gbit/s links, %.0f us round trip, "
              "ps apply %.1f GB/s, compute %.2f ms per step at batch %d (examples/s)\n" % (
                  model_bytes / 1e6, gbit, rtt * 1e6, apply_rate / 1e9, compute * 1e3, batch))
    out.write("  %7s %3s %10s %10s %12s %10s %10s %9s  %s\n" % (
        "workers", "ps", "sync 3RTT", "sync 1RTT", "1RTT+overlap", "async", "no comm",
        "sync ms", "bound (sync, async)"))
    for r in rows:
        out.write("  %7d %3d %10.0f %10.0f %12.0f %10.0f %10.0f %9.2f  %s, %s\n" % (
            r["workers"], r["ps"], r["sync_3rtt"], r["sync_1rtt"], r["sync_1rtt_overlap"],
            r["async"], r["ideal"], r["sync_step_ms"], r["sync_bound"], r["async_bound"]))


# ---- the command line ---------------------------------------------------------------------

def load_text(text: str, what: str = "the output") -> Dict[str, Any]:
    """A JSON document: the whole text, else its last line that is one (a
    benchmark's stdout with lines of text before its JSON)."""
    try:
        return dict(json.loads(text))
    except ValueError:
        for line in reversed(text.splitlines()):
            if line.startswith("{"):
                return dict(json.loads(line))
        raise ValueError("%s: no JSON object in it" % what) from None


def load(path: str) -> Dict[str, Any]:
    with open(path) as f:
        return load_text(f.read(), path)


def with_measured(doc: Dict[str, Any], wire: Optional[str], optim: Optional[str]) -> None:
    """Replace a run's measured link and apply rate by those of bench runs."""
    p = doc.setdefault("params", {})
    if optim:
        p["apply_rate"] = apply_from_optim(load(optim))
    if wire:
        p.update({k: v for k, v in link_from_wire(load(wire), p["apply_rate"]).items()
                  if k in ("rtt_s", "bandwidth")})


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="predicted vs measured for a bench_scaling.py run")
    c.add_argument("scaling", help="bench_scaling.py's JSON")
    c.add_argument("--wire", help="`quorum bench wire --json` output (1 worker, 1 ps, fused)")
    c.add_argument("--optim", help="`quorum bench optim --json` output (dense sgd, 1 thread)")
    c.add_argument("--json", action="store_true", help="one JSON object")
    e = sub.add_parser("extrapolate", help="100 and 1,000 workers on a fast network")
    e.add_argument("scaling", nargs="?", help="take apply rate and compute time from this run")
    e.add_argument("--gbit", type=float, default=25.0, help="link Gbit/s (default 25)")
    e.add_argument("--rtt-us", type=float, default=50.0, help="round trip, us (default 50)")
    e.add_argument("--apply-gbs", type=float, help="ps apply GB/s (default: the run's, else 10)")
    e.add_argument("--compute-ms", type=float, help="worker compute ms a step (default: the "
                   "run's torch figure, else 10)")
    e.add_argument("--batch", type=int, default=128, help="examples per worker step")
    e.add_argument("--params", type=float, help="model parameters (default: the 1.07 M MLP)")
    e.add_argument("--json", action="store_true", help="one JSON object")
    r = sub.add_parser("recommend", help="the ps count for N workers")
    r.add_argument("--workers", type=int, required=True)
    r.add_argument("--cores", type=int, help="cores of the one machine they share")
    r.add_argument("--params", type=float, help="model parameters")
    r.add_argument("--gbit", type=float, help="link Gbit/s")
    r.add_argument("--apply-gbs", type=float)
    r.add_argument("--compute-ms", type=float)
    a = ap.parse_args(argv)
    if a.cmd == "compare":
        doc = load(a.scaling)
        if "points" not in doc or "params" not in doc:
            ap.error("%s is not a bench_scaling.py JSON (no points/params)" % a.scaling)
        with_measured(doc, a.wire, a.optim)
        rows = compare(doc)
        if a.json:
            print(json.dumps({"params": doc["params"], "rows": rows}))
        else:
            print_compare(rows)
        return 0
    if a.cmd == "extrapolate":
        doc = load(a.scaling) if a.scaling else {}
        p = doc.get("params", {})
        apply_rate = a.apply_gbs * 1e9 if a.apply_gbs else p.get("apply_rate", 10e9)
        compute = a.compute_ms / 1e3 if a.compute_ms else \
            p.get("compute_s", {}).get("torch", 10e-3)
        for name, v in (("--gbit", a.gbit), ("--rtt-us", a.rtt_us), ("--batch", a.batch),
                        ("apply rate", apply_rate), ("compute", compute)):
            if not v > 0:
                ap.error("%s must be positive, got %r" % (name, v))
        model_bytes = 4 * a.params if a.params else float(sum(v for v, _ in mlp_variables()))
        rows = extrapolate(apply_rate, compute, a.batch, a.gbit, a.rtt_us * 1e-6, model_bytes)
        if a.json:
            print(json.dumps({"rows": rows}))
        else:
            print_extrapolation(rows, a.gbit, a.rtt_us * 1e-6, apply_rate, compute, a.batch,
                                model_bytes)
        return 0
    measured = [a.params, a.gbit, a.apply_gbs, a.compute_ms]
    if any(v is not None for v in measured) and None in measured:
        ap.error("recommend: give all of --params, --gbit, --apply-gbs and --compute-ms, or none")
    if a.params is None:
        print(recommend_ps(a.workers, a.cores))
    else:
        print(recommend_ps(a.workers, a.cores, 4 * a.params, a.gbit * GBIT, a.apply_gbs * 1e9,
                           a.compute_ms / 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU check of quorum.torch's staging (staging.py, docs/PYTHON.md "GPU
models"): small models on cuda (an MLP, one with BatchNorm, one with a
qt.Embedding) trained by qt.Optimizer with a ps in the process, and a
BatchNorm one under `quorum launch --ps 1 --workers 2 --mode sync`,
against the same training on the CPU; and the step time of a wider MLP
with the gradients' copies under backward against all at step(). Run by
hand on a machine with a GPU (no CI test): `python3 gpu_check.py`, with
quorum on PATH and the package importable; results go to $OUT (or .)."""
import json
import os
import subprocess
import sys
import time
import traceback

import torch

import quorum.torch as qt

STEPS = 30


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 4))


def bn():
    torch.manual_seed(0)
    # no bias before BatchNorm: its gradient is 0 up to rounding, which Adam
    # would scale up to lr-sized steps, different on each device
    return torch.nn.Sequential(torch.nn.Linear(20, 32, bias=False), torch.nn.BatchNorm1d(32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 4))


class Emb(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = qt.Embedding(8, init="normal:0,0.1", seed=1)
        self.lin = torch.nn.Linear(8 + 20, 4)

    def forward(self, x):
        ids = (x[:, 0].abs() * 10).long() % 50
        return self.lin(torch.cat([self.emb(ids), x], 1))


MODELS = {"mlp": mlp, "bn": bn, "emb": Emb}


def data(rank, device):
    g = torch.Generator().manual_seed(7 + rank)
    out = []
    for _ in range(STEPS):
        x = torch.randn(32, 20, generator=g)
        y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
        out.append((x.to(device), y.to(device)))
    return out


def train(kind, device, rank=0, **kw):
    m = MODELS[kind]().to(device)
    opt = qt.Optimizer(m, "Adam", lr=0.01, **kw)
    staged = opt._staging is not None
    for x, y in data(rank, device):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    sd = {k: v.detach().cpu().clone() for k, v in m.state_dict().items()}
    if kind == "emb":
        m.eval()
        with torch.no_grad():
            sd["emb.out"] = m(data(99, device)[0][0]).cpu()
    opt.close()
    return sd, staged


def maxdiff(a, b):
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def log(*a):
    print(*a, flush=True)


def main():
    out = os.environ.get("OUT", ".")
    log("torch", torch.__version__, "cuda", torch.version.cuda,
        "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    results = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    for kind in MODELS:
        for mode in ("sync", "async"):
            try:
                cpu, s0 = train(kind, "cpu", mode=mode)
                gpu, s1 = train(kind, "cuda", mode=mode)
                d = maxdiff(cpu, gpu)
                log("%-4s %-5s cpu staged=%s cuda staged=%s max|cpu-cuda|=%.3g %s"
                    % (kind, mode, s0, s1, d, "OK" if d < 1e-4 else "FAIL"))
                results["%s_%s" % (kind, mode)] = d
            except Exception:
                log("%s %s FAILED\n%s" % (kind, mode, traceback.format_exc()))
    # timing: a wider MLP, copies under backward (hooks) against all at step()
    try:
        torch.manual_seed(0)
        layers = []
        for _ in range(6):
            layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
        m = torch.nn.Sequential(*layers, torch.nn.Linear(2048, 10)).cuda()
        opt = qt.Optimizer(m, "SGD", lr=0.001, mode="async")
        x = torch.randn(256, 2048, device="cuda")
        y = torch.randint(0, 10, (256,), device="cuda")
        nparams = sum(p.numel() for p in m.parameters())

        def steps(n):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(n):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(m(x), y).backward()
                opt.step()
            torch.cuda.synchronize()
            return (time.perf_counter() - t) / n
        steps(3)
        hooked = min(steps(10), steps(10))
        opt._staging.remove_hooks()
        steps(2)
        at_step = min(steps(10), steps(10))
        log("timing: %d params (%.0f MB f32): step with copies under backward %.2f ms, "
            "copies at step() %.2f ms" % (nparams, nparams * 4 / 1e6, hooked * 1e3, at_step * 1e3))
        results["timing_ms"] = {"hooks": hooked * 1e3, "at_step": at_step * 1e3,
                                "params": nparams}
        opt.close()
    except Exception:
        log("timing FAILED\n" + traceback.format_exc())
    # under the launcher: 2 workers sync, on cuda and on the CPU
    try:
        me = os.path.abspath(__file__)
        runs = {}
        for device in ("cuda", "cpu"):
            prefix = os.path.join(out, "launch_%s" % device)
            p = subprocess.run(["quorum", "launch", "--ps", "1", "--workers", "2", "--mode", "sync",
                                "--", sys.executable, me, "--worker", device, prefix],
                               capture_output=True, text=True, timeout=240)
            log("launch %s rc=%d %s"
                % (device, p.returncode, p.stderr[-1500:] if p.returncode else ""))
            runs[device] = [torch.load("%s.%d.pt" % (prefix, r)) for r in (0, 1)]
        d01 = maxdiff(runs["cuda"][0], runs["cuda"][1])
        dcc = maxdiff(runs["cpu"][0], runs["cuda"][0])
        log("launch 2 workers sync bn: max|w0-w1| cuda=%.3g, max|cpu-cuda| chief=%.3g %s"
            % (d01, dcc, "OK" if dcc < 1e-4 else "FAIL"))
        results["launch"] = {"w0_w1": d01, "cpu_cuda": dcc}
    except Exception:
        log("launch FAILED\n" + traceback.format_exc())
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(results, f, indent=1)


def worker(device, prefix):
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    m = bn().to(device)
    opt = qt.Optimizer(m, "Adam", lr=0.01)
    assert (opt._staging is not None) == (device == "cuda")
    for x, y in data(rank, device):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    torch.save({k: v.detach().cpu() for k, v in m.state_dict().items()},
               "%s.%d.pt" % (prefix, rank))
    opt.close()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        main()

#!/usr/bin/env python3
"""check_optim.py - quorum's optimizers against independent references.

For each case below, this script draws a random variable and >= 100 steps
of random gradients (dense, sparse with duplicate indices, or a mix) from a
fixed seed with numpy, has the C driver (tests/unit/test_optim_ref_driver.c)
run them through libquorum, and recomputes the same steps:

  * with PyTorch's torch.optim (torch 2.x CPU, in the environment
    scripts/test.sh makes: .venv) where PyTorch has the
    same algorithm: SGD, momentum and Nesterov (torch.optim.SGD; TF and
    torch place lr differently, which is the same while lr is constant, so
    these cases keep lr constant), Adagrad (torch.optim.Adagrad with eps=0:
    TF1's ApplyAdagrad has no epsilon; dense and sparse), RMSProp
    (torch.optim.RMSprop with eps=0 and its state started like TF1, rms = 1:
    torch puts eps outside the sqrt and TF inside, so torch runs without eps
    and quorum with its default 1e-10, which is below float resolution
    next to rms ~ 0.01..1), Adam (torch.optim.SparseAdam given every row:
    TF's ApplyAdam form, epsilon after sqrt and not bias-corrected, which
    torch.optim.Adam does differently; and SparseAdam on sparse gradients,
    the lazy Adam quorum implements); weight-decay as torch's weight_decay
    (L2 added to the gradient) in torch.optim.SGD, Adagrad and RMSprop, and
    in torch.optim.Adam for Adam (SparseAdam has no weight_decay; the
    Adam + weight-decay case runs with epsilon 1e-12, where TF's and
    torch's placements of epsilon cannot differ by more than float
    rounding, so torch.optim.Adam itself is the reference); AdamW
    (torch.optim.AdamW, dense, its default weight_decay 0.01 included);
  * with formulas written here, separately from the C code, from the TF /
    DeepRec kernels, in numpy float32, for every optimizer (all slots
    included), and for what torch does not have: AdamAsync (dense, lazy
    sparse, Nesterov, the apply-sparse-rmsprop switch), FTRL, Adam with a
    global step that is not the number of applies, per-call learning rates,
    AdamW's lazy sparse apply (torch refuses sparse gradients in AdamW),
    and weight-decay on sparse applies (only the touched rows get
    g + wd * var: torch would decay every row of a dense parameter).

Every value of var after every step, and every slot at the end, is
compared. Error measure, per value: |quorum - ref| / max(|ref|, FLOOR)
with FLOOR = 0.1 * rms(ref) over that tensor (all steps of var, or one
slot): a plain relative error, except that a value smaller than a tenth of
its tensor's RMS (var passing through 0) is judged against that tenth and
not its own tiny magnitude: there, one float32 rounding of the larger
values it came from (torch uses FMA, we do not) would otherwise count as
a 1e-4 "relative" error. The test fails if any case's maximum exceeds
1e-5. (Against the formulas quorum is in fact bit-identical: same float32
operations in the same order; FTRL with lr-power != -0.5 calls the C
library's powf through ctypes, like the C code.)

Usage: check_optim.py --driver PATH [--case NAME] [--seed N]
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

TOL = 1e-5
FLOOR_FRAC = 0.1
F32 = np.float32


# --------------------------------------------------------------------------
# Driver I/O (format documented in test_optim_ref_driver.c)

def write_input(path, options, var, steps):
    rows, dim = var.shape
    with open(path, "wb") as f:
        f.write(b"QROPTIN1")
        pairs = [f"{k}={v}".encode() for k, v in options.items()]
        f.write(struct.pack("<I", len(pairs)))
        for p in pairs:
            f.write(struct.pack("<I", len(p)) + p)
        f.write(struct.pack("<qqq", rows, dim, len(steps)))
        f.write(var.astype("<f4").tobytes())
        for st in steps:
            if st["kind"] == "dense":
                f.write(struct.pack("<qfq", 0, st["lr"], st["t"]))
                f.write(st["grad"].astype("<f4").tobytes())
            else:
                f.write(struct.pack("<qfq", 1, st["lr"], st["t"]))
                f.write(struct.pack("<q", len(st["idx"])))
                f.write(st["idx"].astype("<i8").tobytes())
                f.write(st["grad"].astype("<f4").tobytes())


def read_output(path, shape, nsteps):
    data = open(path, "rb").read()
    assert data[:8] == b"QROPTOUT", "bad driver output"
    off = 8
    n = shape[0] * shape[1]
    traj = np.frombuffer(data, "<f4", nsteps * n, off).reshape((nsteps,) + shape)
    off += 4 * nsteps * n
    (nslots,) = struct.unpack_from("<I", data, off)
    off += 4
    slots = {}
    for _ in range(nslots):
        (nl,) = struct.unpack_from("<I", data, off)
        off += 4
        name = data[off:off + nl].decode()
        off += nl
        (cnt,) = struct.unpack_from("<q", data, off)
        off += 8
        slots[name] = np.frombuffer(data, "<f4", cnt, off).copy()
        off += 4 * cnt
    return traj, slots


# --------------------------------------------------------------------------
# Formula references, float32, one step on a set of rows.
# Each takes (hp, var, slots, g, lr, t) where var, g and the per-row slots
# are float32 arrays of the touched rows (a copy), and returns nothing
# (updates in place). t: global step (Adam), lr: this call's rate.

def f32(x):
    return F32(x)


_powf = None


def libm_powf(x, p):
    global _powf
    if _powf is None:
        import ctypes
        libm = ctypes.CDLL("libm.so.6")
        libm.powf.restype = ctypes.c_float
        libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]
        _powf = np.frompyfunc(lambda a, b: libm.powf(a, b), 2, 1)
    return _powf(x, F32(p)).astype(F32)


def ref_sgd(hp, var, s, g, lr, t, sparse):
    var -= g * lr


def ref_momentum(hp, var, s, g, lr, t, sparse):
    # TF ApplyMomentum: accum = accum*momentum + g; var -= accum*lr
    # nesterov: var -= g*lr + accum*momentum*lr
    mu = f32(hp["momentum"])
    a = s["momentum"]
    a[:] = a * mu + g
    if hp["nesterov"]:
        var -= g * lr + a * mu * lr
    else:
        var -= a * lr


def ref_adagrad(hp, var, s, g, lr, t, sparse):
    # TF1 ApplyAdagrad: accum += g^2; var -= g*lr/sqrt(accum)
    a = s["accumulator"]
    a += g * g
    var -= g * lr / np.sqrt(a)


def ref_rmsprop(hp, var, s, g, lr, t, sparse):
    # TF ApplyRMSProp / ApplyCenteredRMSProp
    omr = f32(1.0 - hp["decay"])
    ms, mom = s["rms"], s["momentum"]
    ms += (g * g - ms) * omr
    if hp["centered"]:
        mg = s["mg"]
        mg += (g - mg) * omr
        denom = (ms - mg * mg) + f32(hp["epsilon"])
    else:
        denom = ms + f32(hp["epsilon"])
    mom[:] = mom * f32(hp["momentum"]) + g * lr / np.sqrt(denom)
    var -= mom


def ref_adam(hp, var, s, g, lr, t, sparse):
    # TF ApplyAdam with beta^t from the global step (computed in double)
    b1, b2 = hp["beta1"], hp["beta2"]
    alpha = f32(float(lr) * np.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t))
    m, v = s["m"], s["v"]
    m += (g - m) * f32(1.0 - b1)
    v += (g * g - v) * f32(1.0 - b2)
    if hp["nesterov"]:
        var -= (g * f32(1.0 - b1) + m * f32(b1)) * alpha / (np.sqrt(v) + f32(hp["epsilon"]))
    else:
        var -= m * alpha / (np.sqrt(v) + f32(hp["epsilon"]))


def ref_adam_async(hp, var, s, g, lr, t, sparse):
    # DeepRec ApplyAdamAsync / SparseApplyAdamAsync, docs/OPTIMIZERS.md "Adam and AdamAsync"
    b1, b2 = f32(hp["beta1"]), f32(hp["beta2"])
    omb1, omb2 = f32(1.0 - hp["beta1"]), f32(1.0 - hp["beta2"])
    eps = f32(hp["epsilon"])
    m, v = s["m"], s["v"]
    if sparse and hp["apply-sparse-rmsprop"]:
        v[:] = v * b2 + g * g * omb2
        m[:] = m * b1 + lr * g / np.sqrt(v + eps)
        var -= m
        return  # powers untouched
    p1, p2 = float(s["beta1_power"][0]), float(s["beta2_power"][0])
    alpha = f32(float(lr) * np.sqrt(1.0 - p2) / (1.0 - p1))
    m[:] = m * b1 + g * omb1
    v[:] = v * b2 + g * g * omb2
    if hp["nesterov"]:
        var -= (g * omb1 + b1 * m) * alpha / (np.sqrt(v) + eps)
    else:
        var -= m * alpha / (np.sqrt(v) + eps)
    s["beta1_power"][0] = s["beta1_power"][0] * b1
    s["beta2_power"][0] = s["beta2_power"][0] * b2


def ref_adamw(hp, var, s, g, lr, t, sparse):
    # torch.optim.AdamW (decoupled weight decay), t = the global step:
    # var *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
    # var -= lr/(1 - b1^t) * m / (sqrt(v)/sqrt(1 - b2^t) + eps)
    b1, b2 = hp["beta1"], hp["beta2"]
    keep = f32(1.0 - float(lr) * hp["weight-decay"])
    step = f32(float(lr) / (1.0 - b1 ** t))
    bias_c2_sqrt = f32(np.sqrt(1.0 - b2 ** t))
    m, v = s["m"], s["v"]
    w = var * keep
    m += (g - m) * f32(1.0 - b1)
    v[:] = v * f32(b2) + f32(1.0 - b2) * g * g
    var[:] = w - step * m / (np.sqrt(v) / bias_c2_sqrt + f32(hp["epsilon"]))


def ref_ftrl(hp, var, s, g, lr, t, sparse):
    # TF ApplyFtrl, p = -lr_power
    p = -hp["lr-power"]
    accum, linear = s["accum"], s["linear"]
    new_accum = accum + g * g
    if p == 0.5:
        pn, po = np.sqrt(new_accum), np.sqrt(accum)
    else:
        # The C library's powf, as the C code calls: TF's form subtracts two
        # close powers (pn - po), so one ulp of difference in pow (numpy's
        # float32 power is a SIMD approximation) shows as ~1e-5 in linear.
        pn, po = libm_powf(new_accum, p), libm_powf(accum, p)
    linear += g - (pn - po) / lr * var
    quadratic = pn / lr + f32(2.0 * hp["l2"])
    l1 = f32(hp["l1"])
    pre = (np.sign(linear) * l1 - linear) / quadratic
    var[:] = np.where(np.abs(linear) > l1, pre, f32(0))
    accum[:] = new_accum


# name -> (formula, defaults, per-row slots with initial values, scalar slots)
# "weight-decay" (0 but for AdamW) is added to the gradient by formula_run
# for all but AdamW, whose formula decays the variable itself.
OPTIMIZERS = {
    "sgd": (ref_sgd, {"lr": 0.05, "weight-decay": 0.0}, [], []),
    "momentum": (ref_momentum, {"lr": 0.05, "momentum": 0.9, "nesterov": False,
                                "weight-decay": 0.0}, [("momentum", 0.0)], []),
    "adagrad": (ref_adagrad, {"lr": 0.001, "initial-accumulator": 0.1, "weight-decay": 0.0},
                [("accumulator", "initial-accumulator")], []),
    "rmsprop": (ref_rmsprop, {"lr": 0.001, "decay": 0.9, "momentum": 0.0, "epsilon": 1e-10,
                              "centered": False, "weight-decay": 0.0},
                [("rms", 1.0), ("momentum", 0.0), ("mg", 0.0)], []),
    "adam": (ref_adam, {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8,
                        "nesterov": False, "weight-decay": 0.0}, [("m", 0.0), ("v", 0.0)], []),
    "adamw": (ref_adamw, {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8,
                          "weight-decay": 0.01}, [("m", 0.0), ("v", 0.0)], []),
    "adam_async": (ref_adam_async, {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8,
                                    "nesterov": False, "apply-sparse-rmsprop": False,
                                    "weight-decay": 0.0},
                   [("m", 0.0), ("v", 0.0)], [("beta1_power", "beta1"), ("beta2_power", "beta2")]),
    "ftrl": (ref_ftrl, {"lr": 0.001, "lr-power": -0.5, "initial-accumulator": 0.1, "l1": 0.0,
                        "l2": 0.0}, [("accum", "initial-accumulator"), ("linear", 0.0)], []),
}


def parse_bool(v):
    return v in (True, "true", "1", "yes")


def hyper(case):
    name = case["options"]["optimizer"]
    hp = dict(OPTIMIZERS[name][1])
    for k, v in case["options"].items():
        if k == "optimizer":
            continue
        hp[k] = parse_bool(v) if isinstance(hp.get(k), bool) else float(v)
    return hp


def formula_run(case, var0, steps):
    name = case["options"]["optimizer"]
    fn, _, row_slots, scalar_slots = OPTIMIZERS[name]
    hp = hyper(case)
    rows, dim = var0.shape
    var = var0.copy()
    slots = {}
    for sname, init in row_slots:
        if sname == "mg" and not hp.get("centered"):
            continue
        val = hp[init] if isinstance(init, str) else init
        slots[sname] = np.full((rows, dim), f32(val), F32)
    for sname, init in scalar_slots:
        slots[sname] = np.array([f32(hp[init])], F32)
    # weight-decay, coupled (torch's L2): g + wd * var, var before the step
    wd = f32(hp.get("weight-decay", 0.0)) if name != "adamw" else f32(0)
    traj = []
    for st in steps:
        lr = f32(hp["lr"]) if st["lr"] < 0 else f32(st["lr"])
        if st["kind"] == "dense":
            g = st["grad"] + wd * var if wd else st["grad"]
            fn(hp, var, slots, g, lr, st["t"], False)
        elif len(st["idx"]) > 0:
            # duplicates summed in order of appearance, rows in first-occurrence order
            uniq, first = np.unique(st["idx"], return_index=True)
            uniq = uniq[np.argsort(first)]
            pos = {r: k for k, r in enumerate(uniq)}
            gsum = np.zeros((len(uniq), dim), F32)
            for i, r in enumerate(st["idx"]):
                gsum[pos[r]] += st["grad"][i]
            rv = var[uniq]
            if wd:  # only the touched rows are decayed
                gsum = gsum + wd * rv
            rs = {k: (v[uniq] if v.shape == var.shape else v) for k, v in slots.items()}
            fn(hp, rv, rs, gsum, lr, st["t"], True)
            var[uniq] = rv
            for k, v in rs.items():
                if slots[k].shape == var.shape:
                    slots[k][uniq] = v
        traj.append(var.copy())
    return np.stack(traj), {k: v.reshape(-1) for k, v in slots.items()}


# --------------------------------------------------------------------------
# PyTorch references

def torch_run(case, var0, steps):
    import torch
    torch.set_num_threads(1)
    # Checked sparse gradients (torch warns when the checks are left implicit).
    torch.sparse.check_sparse_tensor_invariants.enable()
    name = case["options"]["optimizer"]
    hp = hyper(case)
    p = torch.nn.Parameter(torch.tensor(var0.copy()))
    lr = hp["lr"]
    wd = hp["weight-decay"]
    slot_map = {}
    if name == "sgd":
        opt = torch.optim.SGD([p], lr=lr, weight_decay=wd)
    elif name == "momentum":
        opt = torch.optim.SGD([p], lr=lr, momentum=hp["momentum"], dampening=0,
                              nesterov=hp["nesterov"], weight_decay=wd)
        slot_map = {"momentum": "momentum_buffer"}
    elif name == "adagrad":
        opt = torch.optim.Adagrad([p], lr=lr, eps=0.0, weight_decay=wd,
                                  initial_accumulator_value=hp["initial-accumulator"])
        slot_map = {"accumulator": "sum"}
    elif name == "rmsprop":
        opt = torch.optim.RMSprop([p], lr=lr, alpha=hp["decay"], eps=0.0, weight_decay=wd,
                                  momentum=hp["momentum"], centered=hp["centered"])
        # TF1 starts "rms" at 1 (torch at 0): start torch's state the same way
        st = {"step": torch.tensor(0.0), "square_avg": torch.ones_like(p)}
        if hp["momentum"] > 0:
            st["momentum_buffer"] = torch.zeros_like(p)
        if hp["centered"]:
            st["grad_avg"] = torch.zeros_like(p)
        opt.state[p] = st
        slot_map = {"rms": "square_avg", "mg": "grad_avg"}
    elif name == "adam" and wd:
        # SparseAdam has no weight_decay; Adam's epsilon sits elsewhere
        # (after the bias correction), which the case makes immaterial
        # with epsilon 1e-12
        assert hp["epsilon"] <= 1e-12, "adam with weight-decay against torch: epsilon 1e-12"
        opt = torch.optim.Adam([p], lr=lr, betas=(hp["beta1"], hp["beta2"]), eps=hp["epsilon"],
                               weight_decay=wd)
        slot_map = {"m": "exp_avg", "v": "exp_avg_sq"}
    elif name == "adam":
        opt = torch.optim.SparseAdam([p], lr=lr, betas=(hp["beta1"], hp["beta2"]),
                                     eps=hp["epsilon"])
        slot_map = {"m": "exp_avg", "v": "exp_avg_sq"}
    elif name == "adamw":
        opt = torch.optim.AdamW([p], lr=lr, betas=(hp["beta1"], hp["beta2"]), eps=hp["epsilon"],
                                weight_decay=wd)
        slot_map = {"m": "exp_avg", "v": "exp_avg_sq"}
    else:
        raise ValueError(name)
    rows, dim = var0.shape
    traj = []
    for st in steps:
        assert st["lr"] < 0, "torch cases keep lr constant"
        if st["kind"] == "dense":
            if name == "adam" and not wd:  # SparseAdam given every row = TF ApplyAdam
                idx = torch.arange(rows).unsqueeze(0)
                p.grad = torch.sparse_coo_tensor(idx, torch.tensor(st["grad"]), (rows, dim))
            else:
                p.grad = torch.tensor(st["grad"])
        else:
            idx = torch.tensor(st["idx"]).unsqueeze(0)
            p.grad = torch.sparse_coo_tensor(idx, torch.tensor(st["grad"]), (rows, dim))
        opt.step()
        traj.append(p.detach().numpy().copy())
    slots = {}
    for ours, theirs in slot_map.items():
        if theirs in opt.state[p]:
            slots[ours] = opt.state[p][theirs].detach().numpy().reshape(-1).copy()
    return np.stack(traj), slots


# --------------------------------------------------------------------------
# Cases

def make_steps(rng, rows, dim, nsteps, pattern, lr_pattern="const", t_scale=1):
    steps = []
    for k in range(nsteps):
        kind = pattern[k % len(pattern)]
        lr = -1.0
        if lr_pattern == "vary" and k % 3 == 1:
            lr = float(F32(0.0005 * (1 + k % 7)))
        t = (k + 1) * t_scale
        if kind == "dense":
            steps.append({"kind": "dense", "lr": lr, "t": t,
                          "grad": (rng.standard_normal((rows, dim)) * 0.5).astype(F32)})
        else:
            nidx = 0 if kind == "empty" else rows * 3 // 4
            idx = rng.integers(0, rows, nidx).astype(np.int64)  # duplicates likely
            steps.append({"kind": "sparse", "lr": lr, "t": t, "idx": idx,
                          "grad": (rng.standard_normal((nidx, dim)) * 0.5).astype(F32)})
    return steps


D, S, E = "dense", "sparse", "empty"
CASES = [
    # name, options, refs, pattern, extra
    ("sgd", {"optimizer": "sgd", "lr": "0.05"}, ["torch", "formula"], [D], {}),
    ("sgd_sparse", {"optimizer": "sgd"}, ["torch", "formula"], [S], {}),
    ("momentum", {"optimizer": "momentum", "lr": "0.01"}, ["torch", "formula"], [D], {}),
    ("nesterov", {"optimizer": "momentum", "lr": "0.01", "nesterov": "true",
                  "momentum": "0.8"}, ["torch", "formula"], [D], {}),
    ("momentum_sparse_varlr", {"optimizer": "momentum", "lr": "0.01", "nesterov": "true"},
     ["formula"], [S, D], {"lr": "vary"}),
    ("adagrad", {"optimizer": "adagrad", "lr": "0.05"}, ["torch", "formula"], [D], {}),
    ("adagrad_sparse", {"optimizer": "adagrad", "lr": "0.05", "initial-accumulator": "0.5"},
     ["torch", "formula"], [S], {}),
    ("rmsprop", {"optimizer": "rmsprop", "lr": "0.01"}, ["torch", "formula"], [D], {}),
    ("rmsprop_momentum", {"optimizer": "rmsprop", "lr": "0.01", "momentum": "0.9",
                          "decay": "0.95"}, ["torch", "formula"], [D], {}),
    ("rmsprop_centered", {"optimizer": "rmsprop", "lr": "0.01", "momentum": "0.5",
                          "centered": "true"}, ["torch", "formula"], [D], {}),
    ("rmsprop_sparse_varlr", {"optimizer": "rmsprop", "centered": "true", "momentum": "0.5"},
     ["formula"], [S, D], {"lr": "vary"}),
    ("adam", {"optimizer": "adam", "lr": "0.01"}, ["torch", "formula"], [D], {}),
    ("adam_sparse_lazy", {"optimizer": "adam", "lr": "0.01"}, ["torch", "formula"], [S], {}),
    ("adam_nesterov_step3", {"optimizer": "adam", "nesterov": "true", "beta1": "0.8"},
     ["formula"], [D, S], {"t_scale": 3, "lr": "vary"}),
    ("adam_async", {"optimizer": "adam_async", "lr": "0.01"}, ["formula"], [D], {}),
    ("adam_async_sparse_lazy", {"optimizer": "adam_async", "lr": "0.01"}, ["formula"],
     [S, S, E, D], {}),
    ("adam_async_nesterov", {"optimizer": "adam_async", "nesterov": "true", "beta2": "0.99"},
     ["formula"], [D, S], {"lr": "vary"}),
    ("adam_async_sparse_rmsprop", {"optimizer": "adam_async", "lr": "0.01",
                                   "apply-sparse-rmsprop": "true"}, ["formula"],
     [S, D, S, E], {}),
    ("ftrl", {"optimizer": "ftrl", "lr": "0.1"}, ["formula"], [D], {}),
    ("ftrl_l1_l2_sparse", {"optimizer": "ftrl", "lr": "0.2", "l1": "0.05", "l2": "0.1"},
     ["formula"], [S, D], {"lr": "vary"}),
    ("ftrl_power", {"optimizer": "ftrl", "lr": "0.1", "lr-power": "-0.7", "l1": "0.01",
                    "initial-accumulator": "0.5"}, ["formula"], [D, S], {}),
    ("ftrl_power0", {"optimizer": "ftrl", "lr": "0.1", "lr-power": "0", "l2": "0.5"},
     ["formula"], [D], {}),
    # weight-decay: torch's weight_decay, L2 added to the gradient
    ("sgd_wd", {"optimizer": "sgd", "lr": "0.05", "weight-decay": "0.1"},
     ["torch", "formula"], [D], {}),
    ("sgd_wd_sparse", {"optimizer": "sgd", "weight-decay": "0.1"}, ["formula"], [S, D], {}),
    ("momentum_wd", {"optimizer": "momentum", "lr": "0.01", "weight-decay": "0.05"},
     ["torch", "formula"], [D], {}),
    ("nesterov_wd", {"optimizer": "momentum", "lr": "0.01", "nesterov": "true",
                     "momentum": "0.8", "weight-decay": "0.05"}, ["torch", "formula"], [D], {}),
    ("adagrad_wd", {"optimizer": "adagrad", "lr": "0.05", "weight-decay": "0.05"},
     ["torch", "formula"], [D], {}),
    ("adagrad_wd_sparse", {"optimizer": "adagrad", "lr": "0.05", "weight-decay": "0.05"},
     ["formula"], [S], {}),
    ("rmsprop_wd", {"optimizer": "rmsprop", "lr": "0.01", "momentum": "0.9",
                    "weight-decay": "0.02"}, ["torch", "formula"], [D], {}),
    ("rmsprop_centered_wd", {"optimizer": "rmsprop", "lr": "0.01", "centered": "true",
                             "weight-decay": "0.02"}, ["torch", "formula"], [D], {}),
    ("adam_wd", {"optimizer": "adam", "lr": "0.01", "epsilon": "1e-12",
                 "weight-decay": "0.05"}, ["torch", "formula"], [D], {}),
    ("adam_wd_sparse_varlr", {"optimizer": "adam", "weight-decay": "0.05"}, ["formula"],
     [S, D], {"lr": "vary", "t_scale": 2}),
    ("adam_async_wd", {"optimizer": "adam_async", "lr": "0.01", "weight-decay": "0.05"},
     ["formula"], [D, S, E], {}),
    # AdamW: decoupled decay, torch.optim.AdamW
    ("adamw", {"optimizer": "adamw", "lr": "0.01", "weight-decay": "0.1"},
     ["torch", "formula"], [D], {}),
    ("adamw_default_wd", {"optimizer": "adamw", "lr": "0.01", "beta2": "0.99"},
     ["torch", "formula"], [D], {}),
    ("adamw_sparse_lazy", {"optimizer": "adamw", "lr": "0.01", "weight-decay": "0.1"},
     ["formula"], [S, S, E, D], {}),
    ("adamw_varlr_step3", {"optimizer": "adamw", "weight-decay": "0.2", "beta1": "0.8"},
     ["formula"], [D, S], {"lr": "vary", "t_scale": 3}),
]


def rel_err(got, ref):
    got = got.astype(np.float64)
    ref = ref.astype(np.float64)
    rms = float(np.sqrt(np.mean(ref * ref))) if ref.size else 0.0
    floor = max(FLOOR_FRAC * rms, 1e-30)
    return float(np.max(np.abs(got - ref) / np.maximum(np.abs(ref), floor))) if ref.size else 0.0


def run_case(driver, tmp, case_tuple, seed):
    name, options, refs, pattern, extra = case_tuple
    rng = np.random.default_rng(seed)
    rows, dim, nsteps = 40, 24, 120
    var0 = rng.standard_normal((rows, dim)).astype(F32)
    if options["optimizer"] == "ftrl":
        var0[:] = 0  # FTRL's var is a function of its slots; TF starts it anywhere
        var0[::3] = rng.standard_normal((len(var0[::3]), dim)).astype(F32)
    steps = make_steps(rng, rows, dim, nsteps, pattern, extra.get("lr", "const"),
                       extra.get("t_scale", 1))
    inp, out = os.path.join(tmp, name + ".in"), os.path.join(tmp, name + ".out")
    write_input(inp, options, var0, steps)
    res = subprocess.run([driver, inp, out], capture_output=True, text=True)
    if res.returncode != 0:
        return [f"{name}: driver failed: {res.stderr.strip()}"], []
    traj, slots = read_output(out, var0.shape, nsteps)
    failures, lines = [], []
    case = {"options": options}
    for ref in refs:
        rtraj, rslots = (torch_run if ref == "torch" else formula_run)(case, var0, steps)
        errs = {"var": rel_err(traj, rtraj)}
        for k, v in rslots.items():
            if k not in slots:
                failures.append(f"{name}: quorum has no slot {k}")
                continue
            errs[k] = rel_err(slots[k], v)
        if ref == "formula" and set(slots) != set(rslots):
            failures.append(f"{name}: slots {sorted(slots)} vs reference {sorted(rslots)}")
        worst = max(errs.values())
        detail = " ".join(f"{k}={v:.1e}" for k, v in errs.items())
        lines.append(f"{name:28s} vs {ref:7s} max rel err {worst:.2e}  ({detail})")
        if not worst <= TOL:
            failures.append(f"{name}: vs {ref}: max relative error {worst:.3e} > {TOL} ({detail})")
    # sanity: the run did move the variable
    if np.array_equal(traj[-1], var0) and options["optimizer"] != "ftrl":
        failures.append(f"{name}: var never changed")
    return failures, lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", required=True)
    ap.add_argument("--case")
    ap.add_argument("--seed", type=int, default=1000, help="seed of the first case")
    args = ap.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, c in enumerate(CASES):
            if args.case and c[0] != args.case:
                continue
            f, lines = run_case(args.driver, tmp, c, args.seed + i)
            for line in lines:
                print(line)
            failures += f
    if failures:
        print("FAILED:")
        for f in failures:
            print("  " + f)
        return 1
    print(f"all {len(CASES) if not args.case else 1} cases within {TOL} "
          "(max |q - ref| / max(|ref|, 0.1 * rms(ref)))")
    return 0


if __name__ == "__main__":
    sys.exit(main())

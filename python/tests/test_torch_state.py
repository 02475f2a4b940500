"""quorum.torch.Optimizer's state_dict and load_state_dict against torch:
the state's layout and values are torch.optim.AdamW's own; a run saved
with torch.save and loaded into a fresh cluster goes on bit for bit as the
run that was never stopped (async and sync, several optimizers, the model
loaded before or after the optimizer is made); torch's own AdamW state
loaded goes on as torch does; a state of another shape, another optimizer,
with a NaN, or with a step on a cluster past its first step is refused,
naming the problem, and changes nothing."""

from __future__ import annotations

import io
from typing import Any, Dict, Tuple

import pytest
import torch

import quorum.torch as qt

torch.set_num_threads(1)


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def batch(i: int) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    X = torch.randn(16, 4, generator=g)
    return X, X[:, :1] * 2 - X[:, 1:2]


def train(model: torch.nn.Module, opt: Any, start: int, steps: int) -> None:
    for i in range(start, start + steps):
        X, y = batch(i)
        opt.zero_grad()
        ((model(X) - y) ** 2).mean().backward()
        opt.step()


def params(model: torch.nn.Module) -> list:  # type: ignore[type-arg]
    return [p.detach().clone() for p in model.parameters()]


def test_adamw_state_is_torchs():  # type: ignore[no-untyped-def]
    ours_model, theirs_model = mlp(), mlp()
    opt = qt.Optimizer(ours_model, torch.optim.AdamW, lr=0.01, weight_decay=0.05)
    ref = torch.optim.AdamW(theirs_model.parameters(), lr=0.01, weight_decay=0.05)
    assert opt.state_dict()["state"] == ref.state_dict()["state"] == {}  # before any step
    train(ours_model, opt, 0, 6)
    train(theirs_model, ref, 0, 6)
    ours, theirs = opt.state_dict(), ref.state_dict()
    assert set(ours) == set(theirs)
    assert set(ours["state"]) == set(theirs["state"])
    for k, entry in theirs["state"].items():
        assert set(ours["state"][k]) == set(entry)
        for key, value in entry.items():
            got = ours["state"][k][key]
            assert got.dtype == value.dtype and got.shape == value.shape, key
            assert torch.allclose(got, value, rtol=0, atol=1e-5), (k, key)
    assert float(ours["state"][0]["step"]) == 6
    for a, b in zip(ours["param_groups"], theirs["param_groups"]):
        assert set(a) == set(b)
        assert a["params"] == b["params"] and a["betas"] == b["betas"]
    opt.close()


CASES = [("AdamW", {"lr": 0.01, "weight_decay": 0.05}, "async"),
         ("AdamW", {"lr": 0.01, "weight_decay": 0.05}, "sync"),
         ("Adam", {"lr": 0.01}, "async"),
         ("SGD", {"lr": 0.05, "momentum": 0.9}, "async"),
         ("Adagrad", {"lr": 0.05}, "async"),
         ("RMSprop", {"lr": 0.01, "centered": True}, "async")]


@pytest.mark.parametrize("name,settings,mode", CASES)
@pytest.mark.parametrize("model_first", [True, False])
def test_saved_run_resumes_bit_for_bit(name, settings, mode, model_first):  # type: ignore[no-untyped-def]
    k, m = 5, 4
    whole = mlp()
    opt = qt.Optimizer(whole, name, mode=mode, **settings)
    train(whole, opt, 0, k + m)
    want = params(whole)
    opt.close()

    first = mlp()
    opt = qt.Optimizer(first, name, mode=mode, **settings)
    train(first, opt, 0, k)
    buf = io.BytesIO()
    torch.save({"model": first.state_dict(), "optim": opt.state_dict()}, buf)
    opt.close()

    buf.seek(0)
    saved = torch.load(buf)
    resumed = mlp(seed=7)  # other initial values: the saved ones must win
    if model_first:  # loaded, then the optimizer made from it
        resumed.load_state_dict(saved["model"])
        opt = qt.Optimizer(resumed, name, mode=mode, **settings)
    else:  # torch's tutorial: the optimizer made, then both loaded
        opt = qt.Optimizer(resumed, name, mode=mode, **settings)
        resumed.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optim"])
    has_step = name != "SGD"  # torch's SGD keeps no step: the cluster counts from 0 again
    assert opt.worker.global_step() == (k if has_step else 0)
    train(resumed, opt, k, m)
    for a, b in zip(params(resumed), want):
        assert torch.equal(a, b)
    assert opt.global_step == (k + m if has_step else m)
    opt.close()


def test_torchs_own_adamw_state_goes_on_as_torch():  # type: ignore[no-untyped-def]
    theirs_model = mlp()
    ref = torch.optim.AdamW(theirs_model.parameters(), lr=0.01, weight_decay=0.05)
    train(theirs_model, ref, 0, 5)
    ours_model = mlp(seed=3)
    ours_model.load_state_dict(theirs_model.state_dict())
    opt = qt.Optimizer(ours_model, torch.optim.AdamW, lr=0.01, weight_decay=0.05)
    opt.load_state_dict(ref.state_dict())
    train(theirs_model, ref, 5, 5)
    train(ours_model, opt, 5, 5)
    for a, b in zip(params(ours_model), params(theirs_model)):
        assert torch.allclose(a, b, rtol=0, atol=1e-5)
    opt.close()


def snapshot(opt: qt.Optimizer) -> Dict[str, Any]:
    return {"state": opt.state_dict()["state"], "values": params(opt.module),
            "ps": [opt.worker.pull_slot(v, "").copy() for _, _, v in opt.params]}


def same(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    if set(a["state"]) != set(b["state"]):
        return False
    for k in a["state"]:
        for key in a["state"][k]:
            if not torch.equal(a["state"][k][key], b["state"][k][key]):
                return False
    return all(torch.equal(x, y) for x, y in zip(a["values"], b["values"])) and \
        all((x == y).all() for x, y in zip(a["ps"], b["ps"]))


def test_refusals_change_nothing():  # type: ignore[no-untyped-def]
    model = mlp()
    opt = qt.Optimizer(model, "Adam", lr=0.01)
    train(model, opt, 0, 3)
    good = opt.state_dict()
    before = snapshot(opt)

    def refused(state: Dict[str, Any], match: str, error: type = ValueError) -> None:
        with pytest.raises(error, match=match):
            opt.load_state_dict(state)
        assert same(before, snapshot(opt))

    wrong_shape = {"state": dict(good["state"]), "param_groups": good["param_groups"]}
    wrong_shape["state"][2] = dict(good["state"][2], exp_avg=torch.zeros(3, 8))
    refused(wrong_shape, r"exp_avg of parameter 2 \('2.weight'\) has shape \(3, 8\)")

    other = torch.optim.SGD(mlp().parameters(), lr=0.1, momentum=0.9)
    for p in other.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    other.step()
    refused(other.state_dict(), "momentum_buffer.*quorum's adam")

    unknown = {"state": {0: dict(good["state"][0], exp_avg_max=torch.zeros(8, 4))},
               "param_groups": good["param_groups"]}
    refused(unknown, "exp_avg_max")

    nan = {"state": {1: dict(good["state"][1], exp_avg_sq=torch.full((8,), float("nan")))},
           "param_groups": good["param_groups"]}
    refused(nan, "NaN")

    refused({"state": {9: {}}, "param_groups": good["param_groups"]}, "parameter 9")

    # The cluster is at step 3: a saved step is taken only by a new cluster.
    later = {"state": {k: dict(v, step=torch.tensor(7.0)) for k, v in good["state"].items()},
             "param_groups": good["param_groups"]}
    refused(later, "before the first push")

    opt.load_state_dict(good)  # the step it is at: taken, nothing changes
    assert same(before, snapshot(opt))
    opt.close()


def test_state_of_this_run_reloaded_midway():  # type: ignore[no-untyped-def]
    """A state saved at step 3 and loaded back at step 5 (what a script that
    saves and reloads midway does while other workers push): the values and
    slots are the saved ones, the cluster keeps its step."""
    import copy
    model = mlp()
    opt = qt.Optimizer(model, "AdamW", lr=0.01)
    train(model, opt, 0, 3)
    saved_model, saved = copy.deepcopy(model.state_dict()), opt.state_dict()
    train(model, opt, 3, 2)
    assert opt.worker.global_step() == 5
    model.load_state_dict(saved_model)
    opt.load_state_dict(saved)
    assert opt.worker.global_step() == 5
    now = opt.state_dict()
    for k, entry in saved["state"].items():
        assert torch.equal(now["state"][k]["exp_avg"], entry["exp_avg"])
        assert torch.equal(now["state"][k]["exp_avg_sq"], entry["exp_avg_sq"])
        assert float(now["state"][k]["step"]) == 5.0
    ps_values = [torch.from_numpy(opt.worker.pull_slot(v, "").copy()).reshape(p.shape)
                 for _, p, v in opt.params]
    assert all(torch.equal(a, b) for a, b in zip(ps_values, saved_model.values()))
    opt.close()

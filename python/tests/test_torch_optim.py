"""quorum.torch.Optimizer as a torch.optim.Optimizer, each checked against
torch itself: isinstance, torch's schedulers, parameter groups with their
own settings, GradScaler and autocast, step hooks, zero_grad, state_dict,
weight decay and AdamW, refusals naming the option, a parameter not on the
ps, and a failed construction leaving nothing behind."""

from __future__ import annotations

import glob
import tempfile
import threading
import warnings

import pytest
import torch

import quorum
import quorum.torch as qt


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def data() -> tuple:  # type: ignore[type-arg]
    g = torch.Generator().manual_seed(1)
    X = torch.randn(64, 4, generator=g)
    return X, (X[:, :1] * 2 - X[:, 1:2]).clone()


def loss_of(model: torch.nn.Module) -> torch.Tensor:
    X, y = data()
    return ((model(X) - y) ** 2).mean()


def train(model, opt, steps=20, scaler=None):  # type: ignore[no-untyped-def]
    for _ in range(steps):
        opt.zero_grad()
        if scaler is None:
            loss_of(model).backward()
            opt.step()
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(model)
            scaler.scale(loss.float()).backward()
            scaler.step(opt)
            scaler.update()


def max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(float((x - y).detach().abs().max()) for x, y in zip(a.parameters(), b.parameters()))


def library_takes(**options: object) -> bool:
    """Whether this build of the C library has an option (weight-decay and
    the adamw optimizer come with issue 26's optimizer work)."""
    try:
        quorum.Config(**options)
        return True
    except quorum.InvalidArgumentError as e:
        if "unknown option" in str(e) or "not one of" in str(e):
            return False
        raise


needs_weight_decay = pytest.mark.skipif(not library_takes(weight_decay=0.1),
                                        reason="the C library has no weight-decay option yet")
needs_adamw = pytest.mark.skipif(not library_takes(optimizer="adamw"),
                                 reason="the C library has no adamw optimizer yet")


def test_is_a_torch_optimizer():  # type: ignore[no-untyped-def]
    model = mlp()
    opt = qt.Optimizer(model, torch.optim.SGD, lr=0.1)
    assert isinstance(opt, torch.optim.Optimizer)
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["lr"] == 0.1
    assert opt.param_groups[0]["params"] == list(model.parameters())
    assert opt.defaults["momentum"] == 0  # torch's own defaults
    calls = []
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))
    train(model, opt, steps=2)
    assert calls == ["pre", "post"] * 2
    loss_of(model).backward()
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    # a closure, as torch's step takes it: its loss comes back
    assert torch.is_tensor(opt.step(lambda: loss_of(model)))
    opt.close()


@pytest.mark.parametrize("make", [
    lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5),
    lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10),
    lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=12,
                                                  cycle_momentum=False),
])
def test_schedulers_drive_the_groups_as_torchs(make):  # type: ignore[no-untyped-def]
    """torch's schedulers take the optimizer and set its groups' lr as they
    set torch.optim.SGD's."""
    opt = qt.Optimizer(mlp(), "SGD", lr=0.1)
    ref = torch.optim.SGD(mlp().parameters(), lr=0.1)
    ours, theirs = make(opt), make(ref)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scheduler.step() before optimizer.step()
        for _ in range(10):
            ours.step()
            theirs.step()
            assert opt.param_groups[0]["lr"] == ref.param_groups[0]["lr"]
    opt.close()


def test_changed_lr_takes_effect_other_settings_refused():  # type: ignore[no-untyped-def]
    """An lr set by hand reaches the ps at the next step (Adam, against
    torch's); a change of any other setting (momentum, betas,
    weight_decay) is an error at step() naming it, never a silent no-op."""
    ours, ref = mlp(), mlp()
    opt = qt.Optimizer(ours, "Adam", lr=0.01)
    ropt = torch.optim.Adam(ref.parameters(), lr=0.01)
    for lr in (0.05, 0.002, torch.tensor(0.02)):  # torch allows a tensor lr
        opt.param_groups[0]["lr"], ropt.param_groups[0]["lr"] = lr, lr
        train(ours, opt, steps=4)
        train(ref, ropt, steps=4)
    assert max_diff(ours, ref) < 2e-4, max_diff(ours, ref)
    for k, v in (("betas", (0.8, 0.999)), ("weight_decay", 0.1)):
        saved = opt.param_groups[0][k]
        opt.param_groups[0][k] = v
        loss_of(ours).backward()
        with pytest.raises(NotImplementedError, match=r"param_groups\[0\]: %s changed" % k):
            opt.step()
        opt.param_groups[0][k] = saved
    for bad, error in ((-0.1, ValueError), (float("nan"), ValueError), ("fast", TypeError)):
        opt.param_groups[0]["lr"] = bad
        with pytest.raises(error, match=r"param_groups\[0\]: lr="):
            opt.step()
    opt.close()


def test_one_cycle_momentum_is_refused_by_name():  # type: ignore[no-untyped-def]
    """OneCycleLR cycles SGD's momentum too by default (cycle_momentum=True):
    it sets momentum to max_momentum as it is made, so the first step()
    raises naming momentum (cycle_momentum=False cycles the lr alone)."""
    model = mlp()
    opt = qt.Optimizer(model, "SGD", lr=0.1, momentum=0.9)
    torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=12)
    loss_of(model).backward()
    with pytest.raises(NotImplementedError, match=r"momentum changed .*from momentum=0.9 to "
                                                  r"momentum=0.95.*cycle_momentum=False"):
        opt.step()
    opt.close()


def test_embedding_keeps_its_declared_lr():  # type: ignore[no-untyped-def]
    """An Embedding is in no parameter group: a scheduler of the groups
    changes the parameters' lr but leaves the table's (the optimizer's lr=)
    as it was; Worker.set_lr sets it."""
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = qt.Embedding(2, init="zeros")
            self.bias = torch.nn.Parameter(torch.zeros(2))

    model = Model()
    opt = qt.Optimizer(model, "SGD", lr=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    ids = torch.tensor([3])
    for table_lr, lr in ((0.5, 0.5), (0.5, 0.05), (0.25, 0.005)):
        if table_lr == 0.25:
            opt.worker.set_lr(model.emb._table, 0.25)
        before, bias = model.emb(ids).detach(), model.bias.detach().clone()
        opt.zero_grad()
        (model.emb(ids) + model.bias).sum().backward()
        opt.step()
        sched.step()
        assert torch.allclose(before - model.emb(ids).detach(), torch.full((1, 2), table_lr))
        assert torch.allclose(bias - model.bias.detach(), torch.full((2,), lr))
    opt.close()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("make", [
    lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5),
    lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10),
    lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=12,
                                                  cycle_momentum=False),
])
def test_ps_applies_the_scheduled_lr(make, overlap):  # type: ignore[no-untyped-def]
    """Plain SGD with a gradient of ones: each step moves the parameter by
    the lr the ps applied, which is torch's scheduled lr of that step (with
    overlap, the gradient pushed by its backward hook carries it too)."""
    w = torch.nn.Parameter(torch.zeros(3))
    opt = qt.Optimizer([("w", w)], "SGD", lr=0.1, overlap=overlap)
    ref = torch.optim.SGD([torch.nn.Parameter(torch.zeros(3))], lr=0.1)
    ours, theirs = make(opt), make(ref)
    for _ in range(10):
        before = w.detach().clone()
        lr = ref.param_groups[0]["lr"]
        if overlap:
            w.sum().backward()  # a gradient of ones, pushed by its hook
        else:
            w.grad = torch.ones(3)
        opt.step()
        opt.zero_grad()
        assert torch.allclose(before - w.detach(), torch.full((3,), lr), atol=1e-6)
        ref.step()
        ours.step()
        theirs.step()
    opt.close()


def test_sync_scheduled_lr_matches_torch(make_cluster):  # type: ignore[no-untyped-def]
    """Sync, two workers, each running StepLR on its optimizer: the lr
    halves mid-run, and the trained parameters equal one torch SGD
    (momentum 0.9) with the same schedule on the mean of the two halves'
    gradients."""
    c = make_cluster(2, 2, mode="sync")
    models = [mlp(0), mlp(1)]  # the chief's initial values win
    errors: list = []

    def run(k: int) -> None:
        try:
            opt = qt.Optimizer(models[k], "SGD", worker=c.worker(k), lr=0.1, momentum=0.9)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
            X, y = data()
            half = slice(0, 32) if k == 0 else slice(32, 64)
            for _ in range(10):
                opt.zero_grad()
                ((models[k](X[half]) - y[half]) ** 2).mean().backward()
                opt.step()
                sched.step()
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    ref = mlp(0)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    rsched = torch.optim.lr_scheduler.StepLR(ropt, step_size=3, gamma=0.5)
    X, y = data()
    for _ in range(10):
        ropt.zero_grad()
        g0 = torch.autograd.grad(((ref(X[:32]) - y[:32]) ** 2).mean(), list(ref.parameters()))
        g1 = torch.autograd.grad(((ref(X[32:]) - y[32:]) ** 2).mean(), list(ref.parameters()))
        for p, a, b in zip(ref.parameters(), g0, g1):
            p.grad = (a + b) / 2
        ropt.step()
        rsched.step()
    assert ropt.param_groups[0]["lr"] == 0.1 * 0.5 ** 3
    for model in models:
        assert max_diff(model, ref) < 1e-5, max_diff(model, ref)
    # the same run at a constant lr ends elsewhere: the schedule counted
    flat = mlp(0)
    fopt = torch.optim.SGD(flat.parameters(), lr=0.1, momentum=0.9)
    for _ in range(10):
        fopt.zero_grad()
        loss_of(flat).backward()
        fopt.step()
    assert max_diff(models[0], flat) > 1e-3


def test_param_groups_have_their_own_settings():  # type: ignore[no-untyped-def]
    """Two groups with their own lr and momentum train as torch's do."""
    def groups(m):  # type: ignore[no-untyped-def]
        return [{"params": [m[0].weight, m[2].weight]},
                {"params": [m[0].bias, m[2].bias], "lr": 0.01, "momentum": 0.5}]
    ours, ref = mlp(), mlp()
    opt = qt.Optimizer(ours, "SGD", params=groups(ours), lr=0.1, momentum=0.9)
    ropt = torch.optim.SGD(groups(ref), lr=0.1, momentum=0.9)
    assert "optimizer=momentum,lr=0.01,momentum=0.5" in opt._group_options[1]
    train(ours, opt)
    train(ref, ropt)
    assert max_diff(ours, ref) < 1e-5
    with pytest.raises(RuntimeError, match="add_param_group"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    opt.close()


def test_grad_scaler_and_autocast():  # type: ignore[no-untyped-def]
    """torch.amp.GradScaler(...).step(opt) goes through (scaled gradients
    unscaled before the push) under bf16 autocast, as with torch's SGD."""
    ours, ref = mlp(), mlp()
    opt = qt.Optimizer(ours, "SGD", lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    train(ours, opt, steps=10, scaler=torch.amp.GradScaler("cpu", init_scale=1024.0))
    train(ref, ropt, steps=10, scaler=torch.amp.GradScaler("cpu", init_scale=1024.0))
    assert opt.global_step == 10
    assert max_diff(ours, ref) < 1e-5
    opt.close()


def test_state_dict_in_torchs_layout():  # type: ignore[no-untyped-def]
    model = mlp()
    opt = qt.Optimizer(model, "Adam", lr=0.01)
    ref = torch.optim.Adam(mlp().parameters(), lr=0.01)
    ours, theirs = opt.state_dict(), ref.state_dict()
    assert set(ours) == set(theirs) == {"state", "param_groups"}
    assert ours["param_groups"][0]["params"] == theirs["param_groups"][0]["params"]
    assert ours["param_groups"][0]["betas"] == theirs["param_groups"][0]["betas"]
    saved = opt.state_dict()
    opt.param_groups[0]["lr"] = 0.5
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["lr"] == 0.01
    train(model, opt, steps=2)  # the same settings as declared: steps go on
    with pytest.raises(ValueError, match="exp_avg"):  # a step alone is not an Adam state
        opt.load_state_dict(ref.state_dict() | {"state": {0: {"step": torch.tensor(1.0)}}})
    with pytest.raises(ValueError, match="parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": []})
    opt.close()


@pytest.mark.parametrize("setting", [{"amsgrad": True}, {"maximize": True}, {"foreach": True},
                                     {"fused": True}, {"capturable": True},
                                     {"differentiable": True}])
def test_refused_torch_options_are_named(setting):  # type: ignore[no-untyped-def]
    name = next(iter(setting))
    with pytest.raises(ValueError, match=name):
        qt.Optimizer(mlp(), torch.optim.Adam, lr=0.01, **setting)


def test_other_optimizers_settings_refused():  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="betas"):
        qt.Optimizer(mlp(), "SGD", lr=0.1, betas=(0.9, 0.99))
    with pytest.raises(TypeError, match="not a Module|params"):
        qt.Optimizer(list(mlp().parameters()), "SGD", params=[], lr=0.1)


def test_parameter_not_on_the_ps_is_an_error():  # type: ignore[no-untyped-def]
    model = mlp()
    opt = qt.Optimizer(model, "SGD", lr=0.1)
    model.add_module("extra", torch.nn.Linear(1, 1))
    X, y = data()
    opt.zero_grad()
    ((model.extra(model(X)) - y) ** 2).mean().backward()
    with pytest.raises(RuntimeError, match="'extra.weight'.*not on the ps"):
        opt.step()
    opt.close()


def test_failed_construction_leaves_nothing():  # type: ignore[no-untyped-def]
    """The optimizer's local ps, worker and socket folder are freed when
    its construction fails after making them."""
    pattern = tempfile.gettempdir() + "/quorum-local-*"
    dirs, threads = set(glob.glob(pattern)), threading.active_count()
    with pytest.raises(TypeError, match="float64"):
        qt.Optimizer(torch.nn.Linear(2, 1).double(), "SGD", lr=0.1)
    with pytest.raises(quorum.InvalidArgumentError):
        qt.Optimizer(mlp(), "SGD", lr=0.1, timeout_ms=-5)
    assert set(glob.glob(pattern)) == dirs
    assert threading.active_count() == threads


@needs_weight_decay
@pytest.mark.parametrize("name,settings,tol", [
    ("SGD", {"lr": 0.1, "weight_decay": 0.05}, 1e-5),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.05}, 1e-5),
    ("Adam", {"lr": 0.01, "weight_decay": 0.05}, 2e-4),
    ("Adagrad", {"lr": 0.1, "initial_accumulator_value": 0.1, "weight_decay": 0.05}, 1e-4),
])
def test_weight_decay_matches_torch(name, settings, tol):  # type: ignore[no-untyped-def]
    ours, ref = mlp(), mlp()
    opt = qt.Optimizer(ours, name, **settings)
    ropt = getattr(torch.optim, name)(ref.parameters(), **settings)
    train(ours, opt, steps=30)
    train(ref, ropt, steps=30)
    assert max_diff(ours, ref) < tol, (name, max_diff(ours, ref))
    opt.close()


@needs_adamw
def test_adamw_with_groups_matches_torch():  # type: ignore[no-untyped-def]
    """torch.optim.AdamW by class, no decay on the biases (a group of its
    own), over 30 steps."""
    def groups(m):  # type: ignore[no-untyped-def]
        return [{"params": [m[0].weight, m[2].weight]},
                {"params": [m[0].bias, m[2].bias], "weight_decay": 0.0}]
    ours, ref = mlp(), mlp()
    opt = qt.Optimizer(ours, torch.optim.AdamW, params=groups(ours), lr=0.01, weight_decay=0.1)
    ropt = torch.optim.AdamW(groups(ref), lr=0.01, weight_decay=0.1)
    train(ours, opt, steps=30)
    train(ref, ropt, steps=30)
    assert max_diff(ours, ref) < 2e-4
    opt.close()


def test_shard_and_sampler(monkeypatch):  # type: ignore[no-untyped-def]
    """shard of a Dataset is a Subset of every num_workers-th item; the
    sampler is torch's with the cluster's rank and size."""
    c = quorum.Cluster(["localhost:1"], ["localhost:2", "localhost:3", "localhost:4"],
                       "worker", 1)
    monkeypatch.setenv("TF_CONFIG", c.to_tf_config())
    ds = torch.utils.data.TensorDataset(torch.arange(10))
    part = qt.shard(ds)
    assert isinstance(part, torch.utils.data.Subset)
    assert [int(x) for (x,) in part] == [1, 4, 7]
    assert qt.shard(list(range(10))) == [1, 4, 7]
    assert torch.equal(qt.shard(torch.arange(10)), torch.tensor([1, 4, 7]))
    sampler = qt.DistributedSampler(ds, shuffle=False)
    ref = torch.utils.data.DistributedSampler(ds, num_replicas=3, rank=1, shuffle=False)
    assert isinstance(sampler, torch.utils.data.DistributedSampler)
    assert list(sampler) == list(ref)
    sampler.set_epoch(2)

    class Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(3))

    with pytest.raises(TypeError, match="without len"):
        qt.shard(Stream())

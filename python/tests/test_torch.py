"""quorum.torch: a torch module trained on the ps tier matches torch.optim
(SGD exactly, momentum and Adam closely), embedding tables train like
torch.nn.Embedding, sync replicas keep every worker's module equal,
accumulation and local SGD, checkpoints read back into a module, bad input."""

from __future__ import annotations

import json
import os
import shutil
import threading

import numpy as np
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


def train(model, opt, steps=30):  # type: ignore[no-untyped-def]
    """The loss of the last step, and of the first."""
    X, y = data()
    first = None
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(X) - y) ** 2).mean()
        first = float(loss.detach()) if first is None else first
        loss.backward()
        opt.step()
    return float(loss.detach()), first


def test_overlap_equals_one_push_per_step():  # type: ignore[no-untyped-def]
    """Async Adam: pushing each parameter's gradient as backward produces
    it (overlap, the async default) and then a tick gives the very values of
    one push per step (overlap=False): Adam's t is the same. A second
    backward before step() is refused, not double-counted."""
    runs = []
    for overlap in (True, False):
        model = mlp()
        opt = qt.Optimizer(model, "Adam", lr=0.01, overlap=overlap)
        assert opt.overlap is overlap
        train(model, opt, steps=10)
        assert opt.global_step == 10
        runs.append([p.detach().clone() for p in model.parameters()])
        if overlap:
            X, y = data()
            ((model(X) - y) ** 2).mean().backward()
            with pytest.raises(RuntimeError, match="after each backward"):
                ((model(X) - y) ** 2).mean().backward()
            opt.step()
        opt.close()
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="overlap"):
        qt.Optimizer(mlp(), "SGD", lr=0.1, accumulate=2, overlap=True)


@pytest.mark.parametrize("name,settings,tol", [
    ("SGD", {"lr": 0.1}, 1e-5),
    ("SGD", {"lr": 0.05, "momentum": 0.9}, 1e-5),
    ("Adam", {"lr": 0.01}, 2e-4),
    ("Adagrad", {"lr": 0.1, "initial_accumulator_value": 0.1}, 1e-4),
])
def test_matches_torch_optim(name, settings, tol):  # type: ignore[no-untyped-def]
    ours, ref = mlp(), mlp()
    opt = qt.Optimizer(ours, name, **settings)
    ref_settings = dict(settings)
    ropt = getattr(torch.optim, name)(ref.parameters(), **ref_settings)
    loss, first = train(ours, opt)
    ref_loss, _ = train(ref, ropt)
    diff = max(float((a - b).detach().abs().max()) for a, b in zip(ours.parameters(), ref.parameters()))
    assert diff < tol, (name, diff)
    assert abs(loss - ref_loss) < 10 * tol and loss < 0.9 * first
    assert opt.global_step == 30
    opt.close()


class Ctr(torch.nn.Module):
    def __init__(self, emb: torch.nn.Module):
        super().__init__()
        self.emb = emb
        self.out = torch.nn.Linear(3, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(ids).sum(dim=1))


@pytest.mark.parametrize("options,counted_in", [
    ("admit_after=2", "exact"),
    ("admit_after=2,admit_filter=bloom,admit_filter_bytes=4096", "bloom"),
])
def test_embedding_admission_counted(options, counted_in):  # type: ignore[no-untyped-def]
    """Embedding(options="admit_after=2") reaches the ps with the
    optimizer's options: rows are made at an id's second lookup, the first
    step's gradients are dropped, and the statistics count both; the same
    with the lookups counted in a counting Bloom filter."""
    torch.manual_seed(0)
    model = Ctr(qt.Embedding(3, init="normal:0,0.5", seed=7, options=options))
    opt = qt.Optimizer(model, "Adagrad", lr=0.2)
    ids = torch.tensor([[1, 5, 9]], dtype=torch.int64)
    for _ in range(3):
        opt.zero_grad()
        (model(ids) ** 2).mean().backward()
        opt.step()
    t = opt.worker.stats()["tables"]["emb"]
    assert t["admitted"] == 3 and t["rows"] == 3 and t["unadmitted_reads"] == 3, t
    assert t["dropped_rows"] == 3, t  # the first step's rows, not admitted then
    assert t["admission_filter"] == counted_in, t
    filter_bytes = t["admission_filter_bytes"]  # 4096 on each ps
    assert (filter_bytes > 0 and filter_bytes % 4096 == 0) if counted_in == "bloom" \
        else filter_bytes == 0, t
    assert "optimizer=adagrad" in opt.options
    opt.close()


def test_embedding_matches_torch():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = Ctr(qt.Embedding(3, init="normal:0,0.5", seed=7))
    opt = qt.Optimizer(model, "SGD", lr=0.2)
    ids = torch.tensor([[1, 5, 1 << 40], [5, 9, 2], [3, 1, 7]], dtype=torch.int64)
    y = torch.tensor([[1.0], [-1.0], [0.5]])
    vocab = sorted(set(ids.reshape(-1).tolist()))
    start = opt.worker.pull_rows(model.emb._table, vocab, read_only=True)
    ref = torch.nn.Embedding(len(vocab), 3)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(start))
    index = {v: k for k, v in enumerate(vocab)}
    ref_ids = torch.tensor([[index[int(v)] for v in row] for row in ids])
    torch.manual_seed(0)
    ref_model = Ctr(ref)
    ref_model.out.load_state_dict(model.out.state_dict())
    ropt = torch.optim.SGD(ref_model.parameters(), lr=0.2)
    for _ in range(20):
        for m, o, x in ((model, opt, ids), (ref_model, ropt, ref_ids)):
            o.zero_grad()
            ((m(x) - y) ** 2).mean().backward()
            o.step()
    rows = opt.worker.pull_rows(model.emb._table, vocab, read_only=True)
    assert np.allclose(rows, ref.weight.detach().numpy(), atol=1e-5)
    assert not np.allclose(rows, start)
    model.eval()  # evaluation reads rows without adding: an unseen id is its initial value
    with torch.no_grad():
        model(torch.tensor([[123456, 5, 1]]))
    opt.close()


def test_sync_workers_stay_equal(make_cluster):  # type: ignore[no-untyped-def]
    c = make_cluster(2, 2, mode="sync")
    models = [mlp(0), mlp(1)]  # different initial values: the chief's win
    opts: list = [None, None]
    errors: list = []

    def run(k: int) -> None:
        try:
            opts[k] = qt.Optimizer(models[k], "SGD", worker=c.worker(k), lr=0.1)

            def three_trips(*args: object, **kwargs: object) -> int:
                raise AssertionError("a sync step took a token or pulled: not one round trip")

            # a step is one push_pull: its answers bring the values and the token
            opts[k].worker.take_token = three_trips
            opts[k].worker.pull = three_trips
            X, y = data()
            half = slice(0, 32) if k == 0 else slice(32, 64)
            for _ in range(10):
                opts[k].zero_grad()
                ((models[k](X[half]) - y[half]) ** 2).mean().backward()
                opts[k].step()
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)
    # and they equal one model trained on the whole batch's mean gradient
    ref = mlp(0)
    rtrain = torch.optim.SGD(ref.parameters(), lr=0.1)
    X, y = data()
    for _ in range(10):
        rtrain.zero_grad()
        g0 = torch.autograd.grad(((ref(X[:32]) - y[:32]) ** 2).mean(), list(ref.parameters()))
        g1 = torch.autograd.grad(((ref(X[32:]) - y[32:]) ** 2).mean(), list(ref.parameters()))
        for p, a, b in zip(ref.parameters(), g0, g1):
            p.grad = (a + b) / 2
        rtrain.step()
    for a, b in zip(models[0].parameters(), ref.parameters()):
        assert float((a - b).detach().abs().max()) < 1e-5
    assert opts[0].global_step == 10
    assert opts[0].worker.local_step == opts[1].worker.local_step == 10


def test_accumulate_and_local_steps():  # type: ignore[no-untyped-def]
    model = mlp()
    opt = qt.Optimizer(model, "SGD", lr=0.1, accumulate=3)
    train(model, opt, steps=9)
    assert opt.global_step == 3 and opt.worker.global_step() == 3
    opt.close()
    model = mlp()
    opt = qt.Optimizer(model, "SGD", lr=0.1, local_steps=4)
    loss, first = train(model, opt, steps=40)
    assert opt.worker.global_step() == 10 and loss < 0.5 * first
    opt.close()


def test_checkpoint_state_dict_merges_a_chain(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    """An incremental checkpoint holds only what changed: a variable no push
    touched since the full one is read from the chain's full checkpoint, and
    a chain whose base is gone is refused rather than read in part."""
    c = make_cluster(1, 1, checkpoint_dir=str(tmp_path), checkpoint_full_every=10)
    w = c.worker(0)
    frozen, moving = torch.arange(6.0).reshape(2, 3), torch.zeros(4)
    w.declare_values("frozen", frozen, options="optimizer=sgd,lr=0.1")
    w.declare_values("moving", moving, options="optimizer=sgd,lr=0.1")
    w.initialize()
    first = w.checkpoint()
    for _ in range(3):
        w.push({"moving": torch.ones(4)})
    second = w.checkpoint()
    assert second > first
    with open(os.path.join(str(tmp_path), "ckpt-%010d" % second, "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["kind"] == "incremental" and manifest["base_step"] == first, manifest
    got = torch.zeros(4)
    w.pull({"moving": got})
    state = qt.checkpoint_state_dict(str(tmp_path))
    assert torch.equal(state["frozen"], frozen)  # from the full checkpoint
    assert torch.equal(state["moving"], got)  # from the increment
    w.stop_cluster()
    for ps in c.ps:
        ps.join(30)
    shutil.rmtree(os.path.join(str(tmp_path), "ckpt-%010d" % first))
    with pytest.raises(ValueError, match="missing"):
        qt.checkpoint_state_dict(os.path.join(str(tmp_path), "ckpt-%010d" % second))


def test_checkpoint_into_module(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    c = make_cluster(2, 1, checkpoint_dir=str(tmp_path))
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 1))
    w = c.worker(0)
    w.declare_values("0.weight", model[0].weight.detach(), options="optimizer=sgd,lr=0.1,"
                     "partitions=2")
    for name in ("0.bias", "1.weight", "1.bias"):
        w.declare_values(name, dict(model.named_parameters())[name].detach())
    w.initialize()
    X, y = data()
    params = dict(model.named_parameters())
    for k in range(5):
        model.zero_grad()
        ((model(X) - y) ** 2).mean().backward()
        w.push({n: p.grad for n, p in params.items()})
        w.pull({n: p.data for n, p in params.items()})
        if k == 2:  # one on demand, mid-run: the state after 3 steps
            assert w.checkpoint() == 3
            mid = qt.checkpoint_state_dict(str(tmp_path))
            assert torch.equal(mid["1.bias"], model[1].bias.detach())
    w.stop_cluster()  # writes the final checkpoint
    for ps in c.ps:
        ps.join(30)
    state = qt.checkpoint_state_dict(str(tmp_path))
    assert state["0.weight"].shape == (6, 4)  # its two shards joined
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 1))
    assert sorted(qt.load_checkpoint(fresh, str(tmp_path))) == sorted(params)
    for a, b in zip(fresh.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_bad_input():  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match="float64"):
        qt.Optimizer(torch.nn.Linear(2, 1).double(), "SGD", lr=0.1)
    with pytest.raises(ValueError, match="dampening"):  # weight_decay is taken now (issue 26)
        qt.Optimizer(torch.nn.Linear(2, 1), "SGD", lr=0.1, momentum=0.9, dampening=0.1)
    with pytest.raises(ValueError, match="quorum has"):
        qt.Optimizer(torch.nn.Linear(2, 1), "LBFGS", lr=0.1)
    emb = qt.Embedding(4)
    with pytest.raises(RuntimeError, match="wrap the model"):
        emb(torch.tensor([1]))

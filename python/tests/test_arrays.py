"""Every array is checked before its address reaches C: dtype, contiguity,
size, writability; nothing is converted. A refused call changes nothing on
the ps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import quorum


def setup_worker(cluster):  # type: ignore[no-untyped-def]
    w = cluster.worker()
    w.declare_values("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.declare_table("t", 4, init="constant:1")
    w.initialize()
    return w


BAD = [
    (np.ones(6), TypeError, "float64"),                       # NumPy's default dtype
    (np.ones(6, dtype=np.float16), TypeError, "float16"),
    (np.ones(6, dtype=np.int32), TypeError, "int32"),
    (np.ones(6, dtype=">f4"), TypeError, ">f4"),                # float32, not in this byte order
    (np.ones(5, dtype=np.float32), ValueError, "5 elements, 6 expected"),
    (np.ones(7, dtype=np.float32), ValueError, "7 elements, 6 expected"),
    (np.ones((3, 4), dtype=np.float32)[:, :2], ValueError, "not C-contiguous"),
    (np.ones((6, 2), dtype=np.float32)[:, 0], ValueError, "not C-contiguous"),
    (torch.ones(6, dtype=torch.float64), TypeError, "torch.float64"),
    (torch.ones(3, 2).t(), ValueError, "not contiguous"),
    (torch.ones(5), ValueError, "5 elements"),
    ([1.0] * 6, TypeError, "list"),
]


@pytest.mark.parametrize("bad,exc,text", BAD)
def test_push_refuses(cluster, bad, exc, text):  # type: ignore[no-untyped-def]
    w = setup_worker(cluster)
    with pytest.raises(exc, match=text):
        w.push({"w": bad})
    w.pull()
    assert (w.value("w").ravel() == np.arange(6)).all()  # nothing applied
    assert w.global_step() == 0


@pytest.mark.parametrize("bad,exc,text", BAD)
def test_pull_refuses(cluster, bad, exc, text):  # type: ignore[no-untyped-def]
    w = setup_worker(cluster)
    with pytest.raises(exc, match=text):
        w.pull({"w": bad})


def test_pull_refuses_read_only(cluster):  # type: ignore[no-untyped-def]
    w = setup_worker(cluster)
    out = np.zeros(6, dtype=np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        w.pull({"w": out})


def test_rows_refuse(cluster):  # type: ignore[no-untyped-def]
    w = setup_worker(cluster)
    with pytest.raises(TypeError, match="int32"):
        w.pull_rows("t", np.array([1, 2], dtype=np.int32))
    with pytest.raises(TypeError, match="list of ints"):
        w.pull_rows("t", [1.5, 2])
    with pytest.raises(ValueError, match="8 elements, 12 expected"):
        w.pull_rows("t", [1, 2, 3], out=np.zeros(8, dtype=np.float32))
    with pytest.raises(TypeError, match="float64"):
        w.add_rows("t", [1], np.ones(4))
    with pytest.raises(ValueError, match="4 elements, 8 expected"):
        w.add_rows("t", [1, 2], np.ones(4, dtype=np.float32))
    with pytest.raises(TypeError, match="float64"):
        w.declare_values("x", np.ones(3))
    # and the table is untouched
    assert (w.pull_rows("t", [1, 2], read_only=True) == 1).all()


def test_zero_copy_numpy_and_torch(cluster):  # type: ignore[no-untyped-def]
    w = setup_worker(cluster)
    grad = torch.full((2, 3), 2.0)
    step = w.push({"w": grad})
    assert step == 1
    into = torch.zeros(2, 3)
    before = into.data_ptr()
    w.pull({"w": into})
    assert into.data_ptr() == before  # written in place
    assert torch.equal(into, torch.arange(6, dtype=torch.float32).reshape(2, 3) - 1.0)
    w.pull()
    copy = w.value("w")
    assert (copy.ravel() == np.arange(6) - 1.0).all()
    copy[:] = 42  # a copy: the worker's own is untouched
    assert (w.value("w").ravel() == np.arange(6) - 1.0).all()
    rows = torch.empty(3, 4)
    w.pull_rows("t", torch.tensor([9, 8, 9]), out=rows)
    assert torch.equal(rows, torch.ones(3, 4))

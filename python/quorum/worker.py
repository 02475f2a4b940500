"""A worker: declares the variables, pulls them, pushes gradients (dense
and sparse rows), and in sync mode takes part in the steps. A thin layer
over the C worker handle: every array is checked (_arrays.py) and passed
by address, and every call releases the GIL while it waits. The common
dense push and pull (a dict of float32 arrays) go through _fastcall.c,
which makes the same checks in C; anything else comes back to the
Python path, which names what is wrong.

Variables are named by the id ``declare`` returns or by their name.
A variable's arrays are float32 unless ``set_dtype`` says otherwise (a
bf16 or fp16 model's tensors, or a float32 model on a bf16 wire)."""

from __future__ import annotations

import ctypes
import json
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ._arrays import ArrayLike, address, ids_array
from ._native import (PUSH_DELTA, PUSH_EVERY_PS, PUSH_STEP, ROWS_READ_ONLY, STATUS, bind_torch,
                      check, fastcall, lib)
from .cluster import Cluster, Config

Var = Union[int, str]

# The element types set_dtype takes, by every name it accepts, and their
# numbers in quorum.h (QR_FLOAT32, QR_BFLOAT16, QR_FLOAT16).
_DTYPES = {"float32": "float32", "f32": "float32", "fp32": "float32",
           "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "f16": "float16", "fp16": "float16", "half": "float16"}
_DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}


def dtype_name(dtype: Any) -> str:
    """"float32", "bfloat16" or "float16" for any name of one of them (a
    string, a torch dtype, a NumPy float16/float32 dtype); ValueError
    naming the choices for anything else."""
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch."):]
    if name not in _DTYPES:
        raise ValueError("dtype %r: quorum's wire takes float32, bfloat16 (bf16) or float16 "
                         "(fp16)" % (dtype,))
    return _DTYPES[name]


class Request:
    """A push or pull in flight (``Worker.push_start``, ``pull_start``,
    ``push_pull_start``). It keeps the arrays it reads or fills alive until
    ``wait()``, which returns the global step of a push (-1 for a pull)."""

    def __init__(self, worker: "Worker", handle: ctypes.c_void_p, arrays: List[Any]):
        self._worker = worker
        self._handle: Optional[ctypes.c_void_p] = handle
        self._arrays = arrays
        worker._inflight.append(self)

    @property
    def done(self) -> bool:
        """Waited for already."""
        return self._handle is None

    def wait(self, raise_error: bool = True) -> int:
        if self._handle is None:
            raise RuntimeError("this request was waited for already")
        step = ctypes.c_int64(-1)
        handle, self._handle = self._handle, None
        self._worker._inflight.remove(self)
        status = lib.qr_request_wait(handle, ctypes.byref(step))
        self._arrays = []
        if raise_error:
            check(status)
        return int(step.value)


class Worker:
    """Worker ``task_index`` of ``cluster`` (this process's task if None).

    ``options`` are the worker's options (mode="sync", timeout_ms=..., the
    optimizer's options for the ps's checks); they must agree with the ps
    tasks' where the documentation says so (mode, for one). Under `quorum
    launch`, the launcher's options (QUORUM_OPTIONS) are the defaults."""

    def __init__(self, cluster: Optional[Cluster] = None, task_index: Optional[int] = None,
                 **options: object):
        self.cluster = cluster if cluster is not None else Cluster.from_env()
        self._config = Config(from_launcher=True, **options)
        self._handle = ctypes.c_void_p()
        check(lib.qr_worker_create(ctypes.byref(self._handle), self.cluster.handle,
                                   -1 if task_index is None else int(task_index),
                                   self._config.handle))
        self._names: Dict[str, int] = {}
        self._name_list: List[str] = []  # by id
        self._sizes: List[int] = []
        self._shapes: List[Tuple[int, ...]] = []
        self._tables: Dict[int, int] = {}  # id -> dim
        self._dtypes: List[str] = []  # by id: the dtype of the caller's arrays
        self._typed = False  # some variable's arrays are not float32
        self._inflight: List["Request"] = []
        bind_torch()

    # ---- declarations ------------------------------------------------------

    def _declared(self, name: str, var_id: int, shape: Tuple[int, ...], table_dim: int = 0) -> int:
        self._names[name] = var_id
        self._name_list.append(name)
        self._sizes.append(int(lib.qr_worker_var_size(self._handle, var_id)))
        self._shapes.append(shape)
        self._dtypes.append("float32")
        if table_dim:
            self._tables[var_id] = table_dim
        return var_id

    @staticmethod
    def _shape(shape: Union[int, Sequence[int]]) -> Tuple[int, ...]:
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        if not dims or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool)
                               for d in dims):
            raise TypeError("shape must be an int or a sequence of ints, not %r" % (shape,))
        return tuple(int(d) for d in dims)

    def declare(self, name: str, shape: Union[int, Sequence[int]], init: str = "zeros",
                seed: int = 0, options: str = "") -> int:
        """A dense float32 variable with a quorum initializer ("zeros",
        "normal:0,0.1", "glorot_uniform", ...); options are its own optimizer
        options and "partitions=N". Every worker declares the same variables
        in the same order. Returns its id."""
        dims = self._shape(shape)
        arr = (ctypes.c_int64 * len(dims))(*dims)
        var_id = ctypes.c_int()
        check(lib.qr_worker_declare_opts(self._handle, name.encode(), len(dims), arr,
                                         init.encode(), int(seed) & (2**64 - 1),
                                         options.encode(), ctypes.byref(var_id)))
        return self._declared(name, var_id.value, dims)

    def declare_values(self, name: str, values: ArrayLike, options: str = "") -> int:
        """A dense variable that starts from ``values`` (its shape too), e.g.
        a torch parameter: the chief's values are used, copied at once."""
        shape = tuple(int(d) for d in values.shape)
        if not shape:
            shape = (1,)
        ptr, n = address(values, "values of '%s'" % name)
        arr = (ctypes.c_int64 * len(shape))(*shape)
        var_id = ctypes.c_int()
        check(lib.qr_worker_declare_values(self._handle, name.encode(), len(shape), arr,
                                           ctypes.c_void_p(ptr), n, options.encode(),
                                           ctypes.byref(var_id)))
        return self._declared(name, var_id.value, shape)

    def declare_table(self, name: str, dim: int, init: str = "zeros", seed: int = 0,
                      options: str = "") -> int:
        """An embedding table: int64 id -> float32[dim], rows made on first
        pull from the seeded initializer, spread over every ps by id.
        options: the optimizer's, and "admit_after=k" (a row made at an id's
        k-th lookup; "admit_filter=bloom,admit_filter_bytes=N" counts the
        lookups in a counting Bloom filter of N bytes a ps instead of an
        index of every id seen) and "evict_after_steps=T" (rows idle for T
        steps removed); stats()["tables"] counts what they did."""
        var_id = ctypes.c_int()
        check(lib.qr_worker_declare_table(self._handle, name.encode(), int(dim), init.encode(),
                                          int(seed) & (2**64 - 1), options.encode(),
                                          ctypes.byref(var_id)))
        return self._declared(name, var_id.value, (int(dim),), int(dim))

    def initialize(self) -> None:
        """The chief creates the variables on the ps tasks; the others wait
        for it and check their declarations against what it made."""
        check(lib.qr_worker_initialize(self._handle))

    # ---- variables ------------------------------------------------------------

    def id(self, var: Var) -> int:
        if isinstance(var, str):
            if var not in self._names:
                raise KeyError("no variable named %r was declared" % var)
            return self._names[var]
        if not isinstance(var, (int, np.integer)) or not 0 <= int(var) < len(self._sizes):
            raise KeyError("no variable with id %r (%d declared)" % (var, len(self._sizes)))
        return int(var)

    def names(self) -> List[str]:
        return list(self._name_list)

    def size(self, var: Var) -> int:
        return self._sizes[self.id(var)]

    def shape(self, var: Var) -> Tuple[int, ...]:
        return self._shapes[self.id(var)]

    def value(self, var: Var) -> np.ndarray:
        """A copy of the worker's copy of a dense variable (what the last
        ``pull`` with no destination fetched). A copy, because the memory
        is the C handle's and goes with ``close``; to read values without a
        copy, pull into arrays of your own (``pull({var: array})``)."""
        i = self.id(var)
        if i in self._tables:
            raise ValueError("'%s' is an embedding table: use pull_rows" % self.names()[i])
        ptr = lib.qr_worker_var_data(self._handle, i)
        buf = (ctypes.c_float * self._sizes[i]).from_address(ptr)
        flat: np.ndarray = np.frombuffer(memoryview(buf).cast("B"), dtype=np.float32)
        return flat.reshape(self._shapes[i]).copy()

    def set_dtype(self, var: Var, wire: Any, array: Any = "float32") -> None:
        """Mixed precision (qr_worker_set_dtype): ``var``'s gradients and
        values travel as ``wire`` ("bfloat16"/"bf16", "float16"/"fp16", or
        "float32"; a torch dtype too), half the bytes of float32, and the
        arrays given for it to push and pull hold ``array`` elements:
        float32 (converted to and from the wire in C, rounding to nearest
        even) or the wire's own (a bf16 model's tensors, sent as they are).
        The ps tasks keep the variable and its optimizer's slots in
        float32. ``value()`` (the worker's copy) stays float32."""
        i = self.id(var)
        wire_name, array_name = dtype_name(wire), dtype_name(array)
        check(lib.qr_worker_set_dtype(self._handle, i, _DTYPE_CODES[wire_name],
                                      _DTYPE_CODES[array_name]))
        self._dtypes[i] = array_name
        self._typed = any(d != "float32" for d in self._dtypes)

    def dtype(self, var: Var) -> str:
        """The dtype of the arrays ``var`` is pushed and pulled with."""
        return self._dtypes[self.id(var)]

    def placement(self, var: Var) -> List[Tuple[int, int, int]]:
        """(ps, first element, elements) of each shard of a dense variable."""
        i = self.id(var)
        n = lib.qr_worker_var_placement(self._handle, i, 0, None, None, None)
        if n < 0:
            check(n)
        ps, off, cnt = (ctypes.c_int * n)(), (ctypes.c_int64 * n)(), (ctypes.c_int64 * n)()
        check(min(0, lib.qr_worker_var_placement(self._handle, i, n, ps, off, cnt)))
        return [(ps[k], off[k], cnt[k]) for k in range(n)]

    # ---- optimizer state -------------------------------------------------------------

    def _dense_id(self, what: str, var: Var) -> int:
        i = self.id(var)
        if i in self._tables:
            raise ValueError("%s: '%s' is an embedding table: its slots are kept only in the ps "
                             "tasks' checkpoints" % (what, self._name_list[i]))
        return i

    def slot_names(self, var: Var) -> List[str]:
        """The names of a dense variable's optimizer slots as its optimizer
        on the ps keeps them (["m", "v"] for Adam; [] for SGD)."""
        i = self._dense_id("slot_names", var)
        buf = ctypes.create_string_buffer(1024)
        check(lib.qr_worker_slot_names(self._handle, i, buf, len(buf)))
        text = buf.value.decode()
        return text.split(",") if text else []

    def pull_slot(self, var: Var, slot: str, into: Optional[ArrayLike] = None,
                  scalar: bool = False) -> ArrayLike:
        """A dense variable's optimizer slot on the ps tasks (all of its
        parts), into ``into`` (the variable's size, float32) or a new array
        of its shape; scalar=True for a per-variable scalar slot
        (AdamAsync's beta1_power): one float. slot "" is the variable's
        values."""
        i = self._dense_id("pull_slot", var)
        n = 1 if scalar else self._sizes[i]
        out: ArrayLike = np.empty(self._shapes[i] if not scalar else (1,), np.float32) \
            if into is None else into
        ptr = address(out, ("slot %r of '%s'", slot, self._name_list[i]), count=n,
                      writable=True)[0]
        check(lib.qr_worker_pull_slot(self._handle, i, slot.encode(), ptr, n))
        return out

    def set_slot(self, var: Var, slot: str, values: ArrayLike) -> None:
        """Write a dense variable's optimizer slot (slot "": its values) on
        every ps holding a part: the variable's size of finite float32
        values, or one for a scalar slot. Every ps checks the write before
        any changes (an unknown slot, a size, a NaN: nothing changes)."""
        i = self._dense_id("set_slot", var)
        what = ("slot %r of '%s'", slot, self._name_list[i])
        ptr, n = address(values, what)[:2]
        check(lib.qr_worker_set_slot(self._handle, i, slot.encode(), ptr, n))

    def set_step(self, step: int) -> None:
        """The chief, on a cluster that has applied no step yet: the global
        step, and on every ps the steps applied there (Adam's t, the
        learning-rate schedule), become ``step``, so a saved run resumes in
        a new cluster. Refused (InvalidArgumentError, saying at which step
        the cluster is) past step 0 unless it is at ``step`` already."""
        check(lib.qr_worker_set_step(self._handle, int(step)))

    # ---- dense pull and push ------------------------------------------------------

    def _targets(self, what: str, items: Iterable[Tuple[Var, Optional[ArrayLike]]],
                 writable: bool, caller: str = "") -> Tuple[Any, Any, int]:
        """The C arrays of variable ids and data addresses for items
        (variable, array or None: the worker's copy). caller, if given,
        names a call for which every array is required."""
        # The ctypes path: the calls _fastcall.c leaves (the non-blocking
        # ones, a list of variables, any array it does not take), and
        # every call when the package was built without it.
        names, sizes, tables, dtypes = self._names, self._sizes, self._tables, self._dtypes
        ids: List[int] = []
        ptrs: List[Optional[int]] = []
        for var, arr in items:
            i = names.get(var) if isinstance(var, str) else None
            if i is None:
                i = self.id(var)
            if i in tables:
                raise ValueError("%s: '%s' is an embedding table" % (what, self._name_list[i]))
            ids.append(i)
            if arr is None:
                if caller:
                    raise TypeError("%s: a gradient is None" % caller)
                ptrs.append(None)
            else:
                ptrs.append(address(arr, ("%s of '%s'", what, self._name_list[i]),
                                    dtypes[i], count=sizes[i], writable=writable)[0])
        n = len(ids)
        return (ctypes.c_int * n)(*ids), (ctypes.c_void_p * n)(*ptrs), n

    def pull(self, into: Union[None, Mapping[Any, Optional[ArrayLike]], Sequence[Var]] = None,
             averages: bool = False) -> None:
        """Pull dense variables: every one (into the worker's copies, read by
        ``value``) if ``into`` is None; else a list of variables, or a mapping
        variable -> destination array (None: the worker's copy)."""
        items: Iterable[Tuple[Var, Optional[ArrayLike]]]
        if type(into) is dict:  # the common case, first
            if fastcall is not None and not self._typed:  # it takes float32 only
                status = fastcall.pull(self._handle.value, into, self._names, self._sizes,
                                       self._tables, averages)
                if status is not NotImplemented:
                    if status:
                        check(status)
                    return
            items = into.items()
        elif into is None:
            items = [(i, None) for i in range(len(self._sizes)) if i not in self._tables]
        elif isinstance(into, Mapping):
            items = list(into.items())
        else:
            items = [(v, None) for v in into]
        ids, ptrs, n = self._targets("pull", items, writable=True)
        fn = lib.qr_worker_pull_averages if averages else lib.qr_worker_pull
        status = fn(self._handle, n, ids, ptrs)
        if status:
            check(status)

    def push(self, grads: Mapping[Any, ArrayLike], step: bool = True, delta: bool = False,
             every_ps: bool = False) -> int:
        """Push gradients (variable -> float32 array of its size) and the rows
        added since the last push; returns the global step (sync: after
        the commit). ``delta``: the values are added as they are (async).
        ``every_ps`` (async): reach every ps; with no gradients and step, a
        step's tick after its variables were pushed apart without step."""
        flags = ((PUSH_STEP if step else 0) | (PUSH_DELTA if delta else 0) |
                 (PUSH_EVERY_PS if every_ps else 0))
        if fastcall is not None and type(grads) is dict and not self._typed:
            done = fastcall.push(self._handle.value, grads, self._names, self._sizes,
                                 self._tables, flags)
            if done is not NotImplemented:
                if done[0]:
                    check(done[0])
                return int(done[1])
        ids, ptrs, n = self._targets("gradient", grads.items(), writable=False, caller="push")
        out = ctypes.c_int64(-1)
        status = lib.qr_worker_push(self._handle, n, ids, ptrs, flags, ctypes.byref(out))
        if status:
            check(status)
        return out.value

    def push_pull(self, grads: Mapping[Any, ArrayLike],
                  into: Optional[Mapping[Any, Optional[ArrayLike]]] = None,
                  step: bool = True) -> int:
        """Push gradients and get the variables' new values in the same call
        (``into``: variable -> destination array, None or absent: the
        worker's copy). One round trip per ps. Async: the values as this
        push left them. Sync: each ps answers once the push's step is done
        there, ps 0 with the next token (the worker's local step), so the
        call is the push, the token barrier and the pull of the step's
        result at once; a stale gradient raises StaleError after the values
        and the token have come. Returns the global step (sync: the
        token's)."""
        if fastcall is not None and type(grads) is dict and not self._typed and \
                (into is None or type(into) is dict):
            done = fastcall.push_pull(self._handle.value, grads, into, self._names, self._sizes,
                                      self._tables, PUSH_STEP if step else 0)
            if done is not NotImplemented:
                if done[0]:
                    check(done[0])
                return int(done[1])
        ids, ptrs, n = self._targets("gradient", grads.items(), writable=False, caller="push_pull")
        dst = {self.id(k): a for k, a in (into or {}).items()}
        _, outs, _ = self._targets("push_pull values",
                                   [(v, dst.get(self.id(v))) for v in grads.keys()],
                                   writable=True)
        out = ctypes.c_int64(-1)
        check(lib.qr_worker_push_pull(self._handle, n, ids, ptrs, outs,
                                      PUSH_STEP if step else 0, ctypes.byref(out)))
        return int(out.value)

    # ---- non-blocking -----------------------------------------------------------------

    def push_start(self, grads: Mapping[Any, ArrayLike], step: bool = True,
                   delta: bool = False) -> "Request":
        """Start a push and return at once (async mode); ``wait()`` on the
        returned Request gives the global step. The arrays must not change
        until then (the Request keeps them alive). Several may be in flight."""
        ids, ptrs, n = self._targets("gradient", grads.items(), writable=False, caller="push_start")
        flags = (PUSH_STEP if step else 0) | (PUSH_DELTA if delta else 0)
        handle = ctypes.c_void_p()
        check(lib.qr_worker_push_start(self._handle, n, ids, ptrs, flags, ctypes.byref(handle)))
        return Request(self, handle, list(grads.values()))

    def push_pull_start(self, grads: Mapping[Any, ArrayLike],
                        into: Optional[Mapping[Any, Optional[ArrayLike]]] = None,
                        step: bool = True) -> "Request":
        """``push_pull`` without waiting: the values are in ``into`` (or the
        worker's copies) once ``wait()`` returns (sync: with the step's
        token; compute what does not need them meanwhile)."""
        ids, ptrs, n = self._targets("gradient", grads.items(), writable=False, caller="push_pull_start")
        dst = {self.id(k): a for k, a in (into or {}).items()}
        _, outs, _ = self._targets("push_pull values",
                                   [(v, dst.get(self.id(v))) for v in grads.keys()],
                                   writable=True)
        handle = ctypes.c_void_p()
        check(lib.qr_worker_push_pull_start(self._handle, n, ids, ptrs, outs,
                                            PUSH_STEP if step else 0, ctypes.byref(handle)))
        return Request(self, handle, list(grads.values()) + list(dst.values()))

    def pull_start(self, into: Mapping[Any, Optional[ArrayLike]]) -> "Request":
        """Start a pull of the mapped variables (destination array, or None:
        the worker's copy); they are filled once ``wait()`` returns."""
        ids, ptrs, n = self._targets("pull", list(into.items()), writable=True)
        handle = ctypes.c_void_p()
        check(lib.qr_worker_pull_start(self._handle, n, ids, ptrs, ctypes.byref(handle)))
        return Request(self, handle, list(into.values()))

    # ---- sparse rows ------------------------------------------------------------------

    def _dim(self, var: Var) -> Tuple[int, int]:
        i = self.id(var)
        if i in self._tables:
            return i, self._tables[i]
        return i, self._shapes[i][-1]

    def pull_rows(self, var: Var, ids: Union[ArrayLike, Sequence[int]],
                  out: Optional[ArrayLike] = None, read_only: bool = False) -> ArrayLike:
        """The rows of a table for ids (n x dim), into ``out`` if given, else
        into a new NumPy array. ``read_only``: absent ids read as their
        initial value and are not added (evaluation)."""
        i, dim = self._dim(var)
        keep, ids_ptr, n = ids_array(ids, "ids")
        if out is None:
            out = np.empty((n, dim), dtype=np.float32)
        ptr, _ = address(out, ("rows of '%s'", self._name_list[i]), count=n * dim, writable=True)
        check(lib.qr_worker_pull_rows(self._handle, i, n, ctypes.c_void_p(ids_ptr),
                                      ctypes.c_void_p(ptr), ROWS_READ_ONLY if read_only else 0))
        del keep
        return out

    def add_rows(self, var: Var, ids: Union[ArrayLike, Sequence[int]], rows: ArrayLike) -> None:
        """Sparse gradient rows (n x dim) for ids, summed by id and sent with
        the next push (the arrays are free once this returns)."""
        i, dim = self._dim(var)
        keep, ids_ptr, n = ids_array(ids, "ids")
        ptr, _ = address(rows, ("rows of '%s'", self._name_list[i]), count=n * dim)
        check(lib.qr_worker_add_rows(self._handle, i, n, ctypes.c_void_p(ids_ptr),
                                     ctypes.c_void_p(ptr)))
        del keep

    def push_sparse(self, var: Var, ids: Union[ArrayLike, Sequence[int]], rows: ArrayLike,
                    step: bool = True) -> int:
        """add_rows then push of no dense gradient; the global step."""
        self.add_rows(var, ids, rows)
        return self.push({}, step=step)

    # ---- steps ----------------------------------------------------------------------------

    def take_token(self) -> int:
        """Sync: wait for the token of the next step; its step number."""
        out = ctypes.c_int64()
        check(lib.qr_worker_take_token(self._handle, ctypes.byref(out)))
        return int(out.value)

    def sync_step(self, grads: Mapping[Any, ArrayLike], pull: bool = True) -> int:
        """Sync: push this step's gradients, take the next token, pull the new
        values into the worker's copies; the step now to compute."""
        self.push(grads)
        step = self.take_token()
        if pull:
            self.pull()
        return step

    @property
    def local_step(self) -> int:
        out = ctypes.c_int64()
        check(lib.qr_worker_local_step(self._handle, ctypes.byref(out)))
        return int(out.value)

    def global_step(self) -> int:
        out = ctypes.c_int64()
        check(lib.qr_worker_global_step(self._handle, ctypes.byref(out)))
        return int(out.value)

    def set_step_limit(self, last_step: int) -> None:
        check(lib.qr_worker_set_step_limit(self._handle, int(last_step)))

    def set_data_position(self, position: int) -> None:
        check(lib.qr_worker_set_data_position(self._handle, int(position)))

    def set_lr(self, var: Var, lr: Optional[float]) -> None:
        """The learning rate the ps tasks apply ``var``'s gradients with,
        from this worker's next push on, in place of the variable's own
        and the ps's lr-decay schedule: a schedule run by the worker (torch's
        lr_scheduler, through quorum.torch.Optimizer). None (or a negative
        number) returns to the ps's own. Sync: a step takes the rate of
        its first member (by worker), so every worker sets the same."""
        i = self.id(var)
        if lr is None:
            lr = -1.0
        if isinstance(lr, bool) or not isinstance(lr, (int, float, np.floating, np.integer)):
            raise TypeError("set_lr(%r): the learning rate is a number, not %r" % (var, lr))
        check(lib.qr_worker_set_lr(self._handle, i, float(lr)))

    def data_position(self) -> int:
        out = ctypes.c_uint64()
        check(lib.qr_worker_data_position(self._handle, ctypes.byref(out)))
        return int(out.value)

    def wait_bound(self) -> None:
        """Async with max-staleness: wait while this worker is too far ahead."""
        check(lib.qr_worker_wait_bound(self._handle))

    def stats(self) -> Dict[str, Any]:
        """The cluster's training statistics (qr_worker_stats), as a dict."""
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            status = lib.qr_worker_stats(self._handle, buf, size)
            if status == STATUS["QR_ETOOBIG"] and size < (1 << 26):  # a larger buffer
                size *= 4
                continue
            check(status)
            return dict(json.loads(buf.value.decode()))

    def stop_cluster(self) -> None:
        """Stop every ps (the chief does, when training is over)."""
        check(lib.qr_worker_stop_cluster(self._handle))

    def checkpoint(self) -> int:
        """Ask for a checkpoint now (the ps tasks need a checkpoint dir) and
        wait until one taken after this call is written; its global step.
        Training goes on meanwhile. ``quorum.torch.load_checkpoint`` reads
        it into a module."""
        out = ctypes.c_int64(-1)
        check(lib.qr_worker_checkpoint(self._handle, ctypes.byref(out)))
        return int(out.value)

    def leave(self) -> None:
        """This worker has finished its work and will not push again: ps 0
        stops counting on it, and ends the run in order once every worker
        has finished (or, in sync mode, once too few are left for a step;
        their calls then raise StoppedError saying so). Without it, a worker
        that goes is taken for lost and waited for. Raises StoppedError if
        the cluster has stopped already."""
        check(lib.qr_worker_leave(self._handle))

    def close(self) -> None:
        for r in list(self._inflight):
            r.wait(raise_error=False)  # the C side must not outlive its handles
        if self._handle:
            lib.qr_worker_free(self._handle)
            self._handle = ctypes.c_void_p()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None):
            self.close()

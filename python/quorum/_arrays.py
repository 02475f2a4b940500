"""The checks every array passes before its address reaches C, and the
address itself: no copy is ever made of tensor data.

An array is a NumPy ndarray or a CPU torch.Tensor (torch is not imported
here: a tensor is recognized by its type's module). Values must be
float32, ids int64, both C-contiguous with exactly the expected number of
elements, and an array the library writes into must be writable. Anything
else raises TypeError or ValueError naming the argument and what is wrong:
nothing is ever converted or reinterpreted silently (NumPy's default
float64 passed as float32 would be garbage, not an error)."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

ArrayLike = Any  # a numpy.ndarray or a torch.Tensor (torch is optional)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _describe(x: Any) -> str:
    if isinstance(x, np.ndarray) or _is_torch(x):
        return "%s of %s" % (type(x).__name__, x.dtype)
    return type(x).__name__


def address(x: ArrayLike, what: str, dtype: str = "float32", count: Optional[int] = None,
            writable: bool = False) -> Tuple[int, int]:
    """The data address and element count of x, after the checks.

    what names the argument in messages ("gradient for 'layer0/weights'");
    dtype is "float32" or "int64"; count, if given, is the exact number of
    elements x must have."""
    if isinstance(x, np.ndarray):
        if x.dtype != np.dtype(dtype):
            raise TypeError("%s: an array of %s, not %s (convert it first, e.g. "
                            "x.astype(np.%s); quorum never converts silently)"
                            % (what, x.dtype, dtype, dtype))
        if not x.flags.c_contiguous:
            raise ValueError("%s: the array is not C-contiguous (use np.ascontiguousarray)"
                             % what)
        if writable and not x.flags.writeable:
            raise ValueError("%s: the array is read-only, and quorum writes into it" % what)
        n, ptr = int(x.size), int(x.ctypes.data)
    elif _is_torch(x):
        want = "torch.float32" if dtype == "float32" else "torch.int64"
        if str(x.dtype) != want:
            raise TypeError("%s: a tensor of %s, not %s (convert it first; quorum never "
                            "converts silently)" % (what, x.dtype, want))
        if x.device.type != "cpu":
            raise ValueError("%s: the tensor is on %s; quorum reads and writes CPU tensors"
                             % (what, x.device))
        if not x.is_contiguous():
            raise ValueError("%s: the tensor is not contiguous (use .contiguous())" % what)
        n, ptr = int(x.numel()), int(x.data_ptr())
    else:
        raise TypeError("%s: a numpy.ndarray or a torch.Tensor of %s is needed, not %s"
                        % (what, dtype, _describe(x)))
    if count is not None and n != count:
        raise ValueError("%s: %d elements, %d expected" % (what, n, count))
    return ptr, n


def ids_array(ids: Union[ArrayLike, Sequence[int]], what: str) -> Tuple[Any, int, int]:
    """ids as (keep-alive object, address, count): an int64 array or tensor
    as it is, or a list of Python ints made into one (ints, not floats or
    an array of another dtype, which are refused)."""
    if isinstance(ids, (list, tuple)):
        if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in ids):
            raise TypeError("%s: a list of ints is needed" % what)
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    ptr, n = address(ids, what, "int64")
    return ids, ptr, n

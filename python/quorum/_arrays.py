"""The checks every array passes before its address reaches C, and the
address itself: no copy is ever made of tensor data.

An array is a NumPy ndarray or a CPU torch.Tensor (torch is not imported
here: a tensor is recognized by its type's module). Values must be
float32 (or, for a variable set so with ``Worker.set_dtype``, bfloat16 or
float16: a torch tensor of that dtype, or a NumPy float16 array; NumPy
has no bfloat16, so its bf16 values are a uint16 array of their bits),
ids int64, both C-contiguous with exactly the expected number of
elements, and an array the library writes into must be writable. Anything
else raises TypeError or ValueError naming the argument and what is wrong:
nothing is ever converted or reinterpreted silently (NumPy's default
float64 passed as float32 would be garbage, not an error)."""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Optional, Sequence, Tuple, Union, cast

import numpy as np

ArrayLike = Any  # a numpy.ndarray or a torch.Tensor (torch is optional)

# What an argument is called in a message: a string, or a (format, values)
# pair formatted only when there is a message to write. Every push and pull
# names its arrays, and formatting the names on every call cost more than
# the checks themselves.
What = Union[str, Tuple[Any, ...]]

_NUMPY_DTYPES = {"float32": np.dtype(np.float32), "int64": np.dtype(np.int64),
                 "float16": np.dtype(np.float16), "bfloat16": np.dtype(np.uint16)}


def _name(what: What) -> str:
    return what if isinstance(what, str) else what[0] % what[1:]


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _torch_dtype(dtype: str) -> Any:
    # A tensor exists, so torch is imported; this module never imports it.
    return getattr(sys.modules["torch"], dtype)


def _describe(x: Any) -> str:
    if isinstance(x, np.ndarray) or _is_torch(x):
        return "%s of %s" % (type(x).__name__, x.dtype)
    return type(x).__name__


def _numpy_address(x: np.ndarray) -> int:
    # ctypes' view of the buffer finds the address in well under half the
    # time of x.ctypes.data, which builds a helper object on every call; it
    # needs a writable, non-empty buffer.
    if x.flags.writeable and x.size:
        return ctypes.addressof(ctypes.c_char.from_buffer(cast(Any, x)))
    return int(x.ctypes.data)


def address(x: ArrayLike, what: What, dtype: str = "float32", count: Optional[int] = None,
            writable: bool = False) -> Tuple[int, int]:
    """The data address and element count of x, after the checks.

    what names the argument in messages ("gradient for 'layer0/weights'",
    or ("gradient for '%s'", name) to format it only for a message);
    dtype is "float32", "bfloat16", "float16" or "int64"; count, if given, is the exact number of
    elements x must have."""
    if isinstance(x, np.ndarray):
        if x.dtype != _NUMPY_DTYPES[dtype]:
            if dtype == "bfloat16":
                raise TypeError("%s: bfloat16 values, and NumPy has no bfloat16: a uint16 "
                                "array of their bits, or a torch.bfloat16 tensor, not an "
                                "array of %s" % (_name(what), x.dtype))
            raise TypeError("%s: an array of %s, not %s (convert it first, e.g. "
                            "x.astype(np.%s); quorum never converts silently)"
                            % (_name(what), x.dtype, dtype, dtype))
        if not x.flags.c_contiguous:
            raise ValueError("%s: the array is not C-contiguous (use np.ascontiguousarray)"
                             % _name(what))
        if writable and not x.flags.writeable:
            raise ValueError("%s: the array is read-only, and quorum writes into it"
                             % _name(what))
        n, ptr = int(x.size), _numpy_address(x)
    elif _is_torch(x):
        if x.dtype is not _torch_dtype(dtype):
            raise TypeError("%s: a tensor of %s, not torch.%s (convert it first; quorum never "
                            "converts silently)" % (_name(what), x.dtype, dtype))
        if not x.is_cpu:
            raise ValueError("%s: the tensor is on %s; quorum reads and writes CPU tensors"
                             % (_name(what), x.device))
        if not x.is_contiguous():
            raise ValueError("%s: the tensor is not contiguous (use .contiguous())"
                             % _name(what))
        n, ptr = x.numel(), x.data_ptr()
    else:
        raise TypeError("%s: a numpy.ndarray or a torch.Tensor of %s is needed, not %s"
                        % (_name(what), dtype, _describe(x)))
    if count is not None and n != count:
        raise ValueError("%s: %d elements, %d expected" % (_name(what), n, count))
    return ptr, n


def ids_array(ids: Union[ArrayLike, Sequence[int]], what: What) -> Tuple[Any, int, int]:
    """ids as (keep-alive object, address, count): an int64 array or tensor
    as it is, or a list of Python ints made into one (ints, not floats or
    an array of another dtype, which are refused)."""
    if isinstance(ids, (list, tuple)):
        if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in ids):
            raise TypeError("%s: a list of ints is needed" % _name(what))
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    ptr, n = address(ids, what, "int64")
    return ids, ptr, n

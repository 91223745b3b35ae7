"""Turning user objects into contiguous numpy views the engine can read and write, without copies.

Accepted: numpy arrays, any object with ``__dlpack__`` (torch CPU tensors, jax arrays, ...), and any
buffer-protocol object. bfloat16 (which numpy lacks) travels as its 2-byte storage with an explicit
dtype, as do ml_dtypes' bfloat16 arrays.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _core

DataType = _core.DataType

# ml_dtypes is a declared dependency, yet `import nezha` works without it (no numpy bfloat16).
try:
    import ml_dtypes
    BFLOAT16: Optional[np.dtype] = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BFLOAT16 = None


def as_array(x: Any, what: str = "tensor") -> Tuple[np.ndarray, Optional[DataType]]:
    """Returns (numpy view of x, dtype override or None). Raises TypeError/ValueError on bad input.

    For bfloat16 the view is the uint16 storage; ``present()`` turns results back.
    """
    if isinstance(x, np.ndarray):
        arr = x
    elif hasattr(x, "__dlpack__"):
        try:
            arr = np.from_dlpack(x)
        except (TypeError, RuntimeError, BufferError) as exc:
            raise TypeError(f"{what}: cannot view {type(x).__name__} through DLPack ({exc}); "
                            "pass a CPU, contiguous array of a supported dtype") from exc
    else:
        try:
            arr = np.asarray(memoryview(x))
        except TypeError as exc:
            raise TypeError(f"{what}: expected a numpy array, a DLPack or buffer-protocol object, "
                            f"got {type(x).__name__}") from exc
    if not arr.flags.c_contiguous:
        raise ValueError(f"{what} is not C-contiguous (strides {arr.strides}); "
                         "pass numpy.ascontiguousarray(x)")
    override = None
    # ml_dtypes' bfloat16 is a kind-'V' dtype; `kind` first because `dtype.name` costs ~10 us a call.
    if arr.dtype.kind == "V" and arr.dtype.name == "bfloat16":
        arr, override = arr.view(np.uint16), DataType.bfloat16
    return arr, override


def numpy_dtype_for(dtype: DataType) -> np.dtype:
    """The numpy dtype that stores one element of `dtype` (uint16 storage for bfloat16)."""
    return np.dtype({
        DataType.uint8: np.uint8, DataType.int8: np.int8, DataType.int16: np.int16,
        DataType.uint16: np.uint16,
        DataType.int32: np.int32,
        DataType.int64: np.int64, DataType.float16: np.float16, DataType.bfloat16: np.uint16,
        DataType.float32: np.float32, DataType.float64: np.float64, DataType.bool: np.bool_,
    }[dtype])


def present(result: np.ndarray, override: Optional[DataType]) -> np.ndarray:
    """Views an engine result in the user's dtype (bfloat16 results come back as uint16 storage)."""
    if override is not None and override == DataType.bfloat16 and result.dtype == np.uint16:
        return result.view(BFLOAT16)
    return result

"""Gradient compression around allreduce: Horovod's Compressor interface, for every framework.

A compressor's ``compress(tensor)`` returns ``(tensor_to_send, ctx)`` and ``decompress(received,
ctx)`` the tensor to use. The cast compressors (fp16, bf16) need three things of a framework: is a
tensor floating-point, what is its dtype, and a cast. ``CastCompressor`` answers them for numpy
arrays; an adapter overrides those three hooks for its tensors and sets ``wire_dtype`` to its own
dtype object (``nezha.torch.compression``).
"""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from ._buffers import BFLOAT16


class Compressor:
    """compress(tensor) -> (tensor_to_send, ctx); decompress(received, ctx) -> tensor."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class CastCompressor(Compressor):
    """Sends floating-point tensors as `wire_dtype` and casts results back; other dtypes pass."""

    wire_dtype: Any = None

    @staticmethod
    def is_floating(tensor: Any) -> bool:
        return tensor.dtype.kind == "f" or (BFLOAT16 is not None and tensor.dtype == BFLOAT16)

    @staticmethod
    def dtype_of(tensor: Any) -> Any:
        return tensor.dtype

    @staticmethod
    def cast(tensor: Any, dtype: Any) -> Any:
        return tensor.astype(dtype)

    @classmethod
    def compress(cls, tensor: Any) -> Tuple[Any, Any]:
        if cls.wire_dtype is None:  # numpy's bfloat16 without ml_dtypes
            raise TypeError("%s has no wire dtype here; install ml_dtypes" % cls.__name__)
        dtype = cls.dtype_of(tensor)
        if cls.is_floating(tensor) and dtype != cls.wire_dtype:
            return cls.cast(tensor, cls.wire_dtype), dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:
        return tensor if ctx is None else cls.cast(tensor, ctx)


class FP16Compressor(CastCompressor):
    wire_dtype = np.dtype(np.float16)


class BF16Compressor(CastCompressor):
    """Like fp16 with float32's exponent range: no overflow of large gradients, fewer mantissa bits.
    On numpy arrays it needs ml_dtypes (nezha's dependency) for the bfloat16 dtype."""

    wire_dtype = BFLOAT16


class Compression:
    """Horovod's names for the compressors: `Compression.none`, `.fp16`, and Nezha's `.bf16`."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def compress_all(compression: Compressor, tensors: Sequence[Any]) -> Tuple[List[Any], List[Any]]:
    """Compresses each tensor: (tensors to send, their contexts for `decompress_all`)."""
    pairs = [compression.compress(t) for t in tensors]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def decompress_all(compression: Compressor, tensors: Sequence[Any],
                   ctxs: Sequence[Any]) -> List[Any]:
    """Undoes `compress_all` on the received tensors."""
    return [compression.decompress(t, c) for t, c in zip(tensors, ctxs)]

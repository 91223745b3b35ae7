"""Gradient compression applied around allreduce (Horovod's `Compression.none/fp16`, plus bf16):
nezha.compression's compressors with torch's dtype hooks."""

import torch

from nezha.compression import CastCompressor, Compressor, NoneCompressor


class _TorchCastCompressor(CastCompressor):
    """Casts torch tensors (`tensor.dtype` serves as `dtype_of`, as for numpy)."""

    @staticmethod
    def is_floating(tensor):
        return tensor.dtype.is_floating_point

    @staticmethod
    def cast(tensor, dtype):
        return tensor.type(dtype)


class FP16Compressor(_TorchCastCompressor):
    wire_dtype = torch.float16


class BF16Compressor(_TorchCastCompressor):
    """Like fp16 with float32's exponent range: no overflow of large gradients, fewer mantissa
    bits."""

    wire_dtype = torch.bfloat16


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]

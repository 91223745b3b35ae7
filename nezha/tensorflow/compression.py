"""Horovod's `Compression` for TensorFlow tensors: nezha.compression's compressors with TF's
dtype and cast hooks (casts run as TF ops, so they work eagerly and inside tf.function)."""
import tensorflow as tf

from nezha import compression as _neutral


class _TFCast(_neutral.CastCompressor):
    @staticmethod
    def is_floating(tensor):
        return tensor.dtype.is_floating

    @staticmethod
    def dtype_of(tensor):
        return tensor.dtype

    @staticmethod
    def cast(tensor, dtype):
        return tf.cast(tensor, dtype)


class FP16Compressor(_TFCast):
    wire_dtype = tf.float16


class BF16Compressor(_TFCast):
    wire_dtype = tf.bfloat16


Compressor = _neutral.Compressor
NoneCompressor = _neutral.NoneCompressor


class Compression:
    """`Compression.none`, `.fp16` (Horovod's) and `.bf16` (Nezha's)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

"""Horovod's SyncBatchNormalization for TensorFlow: Keras' BatchNormalization whose batch
statistics in training are those of every rank's batch together (count, sum and sum of squares
summed over ranks in one differentiable allreduce)."""
import keras
import tensorflow as tf

from nezha.horovod_api import Sum
from nezha.tensorflow import mpi_ops


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization over the global batch (all ranks) in training; as Keras' otherwise."""

    def _moments(self, inputs, mask):
        if mask is not None:
            raise NotImplementedError("SyncBatchNormalization does not support masks")
        x = tf.cast(inputs, tf.float32) if inputs.dtype in (tf.float16, tf.bfloat16) else inputs
        axes = list(self._reduction_axes)
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
        local_sum = tf.reduce_sum(x, axis=axes)
        local_sq = tf.reduce_sum(tf.square(x), axis=axes)
        total_count, total_sum, total_sq = mpi_ops.grouped_allreduce_raw(
            [tf.reshape(count, [1]), local_sum, local_sq], None, Sum, 1.0, 1.0)
        mean = total_sum / total_count
        variance = tf.maximum(total_sq / total_count - tf.square(mean), 0.0)
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)

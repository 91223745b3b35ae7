"""Horovod's TensorFlow functions around the collectives: allreduce with compression and sparse
gradients, reducescatter, in-place and variable broadcasts, object collectives."""
import tensorflow as tf

from nezha import objects
from nezha.horovod_api import Average, Sum, resolve_op
from nezha.process_sets import global_process_set, process_set_id
from nezha.tensorflow import mpi_ops
from nezha.tensorflow.compression import Compression


def _sparse_allreduce(slices, op, name, prescale_factor, postscale_factor, process_set):
    """Horovod's IndexedSlices reduction: every rank's values and indices are allgathered."""
    if op not in (Average, Sum):
        raise NotImplementedError("allreduce of IndexedSlices supports Sum and Average, got %s"
                                  % (op,))
    values, indices = mpi_ops.grouped_allgather([slices.values, slices.indices], name=name,
                                                process_set=process_set)
    scale = prescale_factor * postscale_factor / (process_set.size() if op == Average else 1)
    if scale != 1.0:
        values = values * tf.cast(scale, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(tensor, average=None, device_dense='', device_sparse='',
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=global_process_set, ignore_name_scope=False):
    """Reduces `tensor` over all ranks (Average by default); IndexedSlices are allgathered."""
    process_set_id(process_set)
    op = resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse_allreduce(tensor, op, name, prescale_factor, postscale_factor, process_set)
    tensor = tf.convert_to_tensor(tensor)
    sent, ctx = compression.compress(tensor)
    reduced = mpi_ops.allreduce_raw(sent, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='',
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Reduces a list of tensors as one operation (fused); returns the list of results."""
    process_set_id(process_set)
    op = resolve_op(op, average)
    tensors = list(tensors)
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        raise NotImplementedError("grouped_allreduce of IndexedSlices: convert them with "
                                  "tf.convert_to_tensor or use allreduce")
    pairs = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    reduced = mpi_ops.grouped_allreduce_raw([p[0] for p in pairs], name, op, prescale_factor,
                                            postscale_factor, process_set)
    return [compression.decompress(r, p[1]) for r, p in zip(reduced, pairs)]


def reducescatter(tensor, device_dense='', compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces over all ranks; rank r gets block r of dim 0 (lower ranks get the extra rows)."""
    return grouped_reducescatter([tensor], device_dense, compression, op, process_set,
                                 ignore_name_scope, prescale_factor, postscale_factor,
                                 name=name)[0]


def grouped_reducescatter(tensors, device_dense='', compression=Compression.none, op=Average,
                          process_set=global_process_set, ignore_name_scope=False,
                          prescale_factor=1.0, postscale_factor=1.0, name=None):
    """reducescatter of several tensors in one host call; returns this rank's blocks."""
    process_set_id(process_set)
    op = resolve_op(op, None)
    pairs = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    outs = mpi_ops.grouped_reducescatter_raw([p[0] for p in pairs], name, op, prescale_factor,
                                             postscale_factor, process_set)
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Broadcasts root_rank's values into `variables` in place; returns their new values."""
    process_set_id(process_set)
    variables = list(variables)
    values = mpi_ops.grouped_broadcast_raw([tf.convert_to_tensor(v) for v in variables],
                                           root_rank, name, process_set)
    assigns = [v.assign(x) for v, x in zip(variables, values)]
    with tf.control_dependencies(assigns):
        return [tf.identity(x) for x in values]


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assigns root_rank's values to `variables` on every rank (one host call for all)."""
    process_set_id(process_set)
    variables = list(variables)
    if not variables:
        return tf.no_op() if not tf.executing_eagerly() else None
    # tf.convert_to_tensor reads tf.Variables and Keras 3 variables alike.
    values = mpi_ops.grouped_broadcast_raw([tf.convert_to_tensor(v) for v in variables],
                                           root_rank, None, process_set)
    assigns = [v.assign(x) for v, x in zip(variables, values)]
    return None if tf.executing_eagerly() else tf.group(*assigns)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """root_rank's picklable `obj` on every rank (eager; `session` is TF1's and ignored)."""
    return objects.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """The list of every rank's picklable `obj`, in rank order."""
    return objects.allgather_object(obj, name, process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Horovod's factory: a function that broadcasts its argument from root_rank."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)

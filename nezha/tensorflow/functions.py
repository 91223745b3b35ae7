"""Horovod's TensorFlow functions around the collectives: allreduce with compression and sparse
gradients, reducescatter, in-place and variable broadcasts, object collectives, and the ops that
read the job's layout when a graph runs."""
import numpy as np
import tensorflow as tf

import nezha
from nezha import objects
from nezha.horovod_api import Average, Sum, resolve_op
from nezha.process_sets import by_id, global_process_set, process_set_id
from nezha.tensorflow import mpi_ops
from nezha.tensorflow._host import grad_name
from nezha.tensorflow.compression import Compression


def _check_sparse(op, prescale_factor, postscale_factor):
    if op not in (Average, Sum):
        raise NotImplementedError("allreduce of IndexedSlices supports Sum and Average, got %s"
                                  % (op,))
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("pre/postscale factors are not supported with IndexedSlices")


def _sparse_allreduce(slices, op, name, process_set):
    """Horovod's IndexedSlices reduction: every rank's values and indices are allgathered (one
    group per call); Average divides the values by the set's size (true division, as Horovod)."""
    values = mpi_ops.grouped_allgather([s.values for s in slices], name=name,
                                       process_set=process_set)
    indices = mpi_ops.grouped_allgather([s.indices for s in slices], name=grad_name(
        name, "indices"), process_set=process_set)
    if op == Average:
        values = [v / tf.cast(process_set.size(), v.dtype) for v in values]
    return [tf.IndexedSlices(v, i, dense_shape=s.dense_shape)
            for v, i, s in zip(values, indices, slices)]


def allreduce(tensor, average=None, device_dense='', device_sparse='',
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=global_process_set, ignore_name_scope=False):
    """Reduces `tensor` over all ranks (Average by default); IndexedSlices are allgathered."""
    process_set_id(process_set)
    op = resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        _check_sparse(op, prescale_factor, postscale_factor)
        return _sparse_allreduce([tensor], op, name, process_set)[0]
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
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    results = [None] * len(tensors)
    if sparse:  # allgathered, as Horovod's; the dense ones are reduced as one group
        _check_sparse(op, prescale_factor, postscale_factor)
        sparse_name = None if name is None else name + ".sparse"
        for i, r in zip(sparse, _sparse_allreduce([tensors[i] for i in sparse], op, sparse_name,
                                                  process_set)):
            results[i] = r
    if dense:
        pairs = [compression.compress(tf.convert_to_tensor(tensors[i])) for i in dense]
        reduced = mpi_ops.grouped_allreduce_raw([p[0] for p in pairs], name, op,
                                                prescale_factor, postscale_factor, process_set)
        for i, r, p in zip(dense, reduced, pairs):
            results[i] = compression.decompress(r, p[1])
    return results


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


def broadcast_global_variables(root_rank):
    """TF1 graphs: an op assigning root_rank's values to every global variable (Horovod's)."""
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution: "
                           "use hvd.broadcast_variables(<model/optimizer variables>)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def _int_read_when_run(read, name, what):
    """An int32 scalar whose value `read()` is taken when the graph runs, not when it is built (as
    Horovod's *_op), so a graph may be built before init(); eagerly the value itself."""
    if tf.executing_eagerly():
        return tf.constant(read(), tf.int32)
    out = tf.numpy_function(lambda: np.int32(read()), [], tf.int32, stateful=True,
                            name=name or what)
    out.set_shape([])
    return out


def size_op(process_set_id=0, name=None):
    """The number of ranks (of the process set of that id) when the graph runs."""
    return _int_read_when_run(lambda: by_id(process_set_id).size(), name, "NezhaSize")


def local_size_op(name=None):
    return _int_read_when_run(nezha.local_size, name, "NezhaLocalSize")


def rank_op(name=None):
    return _int_read_when_run(nezha.rank, name, "NezhaRank")


def local_rank_op(name=None):
    return _int_read_when_run(nezha.local_rank, name, "NezhaLocalRank")


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """root_rank's picklable `obj` on every rank (eager; `session` is TF1's and ignored)."""
    return objects.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """The list of every rank's picklable `obj`, in rank order."""
    return objects.allgather_object(obj, name, process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Horovod's factory: a function that broadcasts its argument from root_rank."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)

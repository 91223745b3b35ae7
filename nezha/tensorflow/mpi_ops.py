"""Horovod's TensorFlow collectives, eager and inside tf.function, with Horovod's gradients.

Gradients (as horovod/tensorflow/mpi_ops.py registers them):
  allreduce, grouped_allreduce -> the gradient is allreduced with the same op and scale factors;
  allgather, grouped_allgather -> averaged over ranks, then this rank's rows are sliced out;
  broadcast                    -> averaged over ranks on the root, zero elsewhere;
  alltoall                     -> sent back with alltoall using the received splits;
  reducescatter                -> allgathered, times size for Sum, times the scale factors.
"""
import functools

import numpy as np
import tensorflow as tf

import nezha
from nezha.handle import Handle
from nezha.horovod_api import Average, Sum
from nezha.ops import started_together_by_waiter
from nezha.process_sets import global_process_set, process_set_id
from nezha.tensorflow._host import check_dtype, grad_name, host_call, op_name, scales


try:  # what TensorFlow's own eager py_func asks before it records a gradient (script_ops.py)
    from tensorflow.python.eager.record import could_possibly_record as _could_record
except ImportError:  # moved in some TensorFlow: record always, as custom_gradient would
    def _could_record():
        return True


def _differentiable(tensors, forward, backward):
    """forward(list of tensors) -> list; backward(list of output grads) -> list of input grads.
    Wrapped in tf.custom_gradient when every input is floating (others have no gradient) and,
    when eager, a GradientTape or ForwardAccumulator is recording: in eager mode the wrapper costs
    ~0.2 ms a call (it inspects the function's signature each time), more than a small collective."""
    if not all(t.dtype.is_floating for t in tensors) or (tf.executing_eagerly() and not _could_record()):
        return forward(tensors)

    @tf.custom_gradient
    def op(*xs):
        ys = forward(list(xs))

        def grad(*dys):
            return backward(list(dys))
        return ys, grad
    return list(op(*tensors))


def _with_shapes(outs, shapes):
    for out, shape in zip(outs, shapes):
        out.set_shape(shape)
    return outs


def _rows_shape(tensor):
    shape = tensor.shape
    return tf.TensorShape([None]).concatenate(shape[1:]) if shape.rank else tf.TensorShape([None])


# --- allreduce --------------------------------------------------------------------------------

def grouped_allreduce_raw(tensors, name, op, prescale_factor, postscale_factor,
                          process_set=global_process_set):
    """One host call reducing every tensor (mixed dtypes allowed) over the process set's ranks;
    differentiable."""
    set_id = process_set_id(process_set)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    for t in tensors:
        check_dtype(t, "allreduce")
    engine_name = op_name("allreduce", name)

    # One group of every tensor, whatever their dtypes (the engine fuses members of one dtype):
    # member names never depend on a dtype, so ranks that disagree on one get a mismatch error.
    def reduce_arrays(*arrays):
        return nezha.grouped_allreduce(arrays, op=op, name=engine_name,
                                       prescale_factor=prescale_factor,
                                       postscale_factor=postscale_factor, process_set=process_set)

    def reduce_in_graph(lib, xs):
        return lib.nezha_allreduce(xs, scales(prescale_factor, postscale_factor),
                                   tensor_name=engine_name, reduce_op=int(op), process_set=set_id)

    def forward(xs):
        outs = host_call(reduce_arrays, xs, [x.dtype for x in xs], "NezhaAllreduce",
                         reduce_in_graph)
        return _with_shapes(outs, [x.shape for x in xs])

    def backward(dys):
        return grouped_allreduce_raw(dys, grad_name(name), op, prescale_factor, postscale_factor,
                                     process_set)

    return _differentiable(tensors, forward, backward)


def allreduce_raw(tensor, name, op, prescale_factor, postscale_factor,
                  process_set=global_process_set):
    return grouped_allreduce_raw([tensor], name, op, prescale_factor, postscale_factor,
                                 process_set)[0]


# --- allgather --------------------------------------------------------------------------------

def _row_counts(tensors, name, process_set):
    """Every rank's (of the set) dim 0 of each tensor: a list of int64 [set size] tensors."""
    counts = [tf.reshape(tf.cast(tf.shape(t)[0], tf.int64), [1]) for t in tensors]
    return grouped_allgather(counts, name=grad_name(name, "rows"), process_set=process_set)


def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """Concatenates every rank's tensors along dim 0 (dim 0 may differ per rank); one host call."""
    set_id = process_set_id(process_set)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    for t in tensors:
        check_dtype(t, "allgather")
    engine_name = op_name("allgather", name)

    def gather_arrays(*arrays):  # one unit: fused into one operation on the rails
        return nezha.grouped_allgather(arrays, name=engine_name, process_set=process_set)

    def forward(xs):
        outs = host_call(gather_arrays, xs, [x.dtype for x in xs], "NezhaAllgather",
                         lambda lib, ts: lib.nezha_allgather(ts, tensor_name=engine_name,
                                                             process_set=set_id))
        return _with_shapes(outs, [_rows_shape(x) for x in xs])

    def backward(dys):
        grads = [allreduce_raw(d, grad_name(name, "grad.%d" % i), Average, 1.0, 1.0, process_set)
                 for i, d in enumerate(dys)]
        counts = _row_counts(tensors, name, process_set)
        me = process_set.rank()
        sliced = []
        for g, c, x in zip(grads, counts, tensors):
            start = tf.reduce_sum(c[:me])
            piece = g[start:start + c[me]]
            sliced.append(tf.reshape(piece, tf.shape(x)))
        return sliced

    return _differentiable(tensors, forward, backward)


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Horovod's allgather: every rank's `tensor` concatenated along dim 0."""
    return grouped_allgather([tensor], name, ignore_name_scope, process_set)[0]


# --- broadcast --------------------------------------------------------------------------------

def _check_root(root_rank):
    n = nezha.size()
    if not isinstance(root_rank, (int, np.integer)) or not 0 <= int(root_rank) < n:
        raise ValueError("root_rank %r is out of range for %d ranks" % (root_rank, n))
    return int(root_rank)


def grouped_broadcast_raw(tensors, root_rank, name, process_set=global_process_set):
    """Broadcasts several tensors from root_rank in one host call (not differentiable)."""
    set_id = process_set_id(process_set)
    root_rank = _check_root(root_rank)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    for t in tensors:
        check_dtype(t, "broadcast")
    engine_name = op_name("broadcast", name)

    def broadcast_arrays(*arrays):
        return Handle.gather(started_together_by_waiter(
            [functools.partial(nezha.broadcast_async, a, root_rank, name="%s.%d" % (engine_name, i),
                               process_set=process_set)
             for i, a in enumerate(arrays)])).wait()

    outs = host_call(broadcast_arrays, tensors, [t.dtype for t in tensors], "NezhaBroadcast",
                     lambda lib, ts: lib.nezha_broadcast(ts, tensor_name=engine_name,
                                                         root_rank=root_rank, process_set=set_id))
    return _with_shapes(outs, [t.shape for t in tensors])


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """Horovod's broadcast: root_rank's `tensor` on every rank."""
    process_set_id(process_set)
    tensor = tf.convert_to_tensor(tensor)
    root_rank = _check_root(root_rank)

    def forward(xs):
        return grouped_broadcast_raw(xs, root_rank, name, process_set)

    def backward(dys):
        reduced = allreduce_raw(dys[0], grad_name(name), Average, 1.0, 1.0, process_set)
        # Times 0 rather than zeros_like, which drops its input when the shape is known: a session
        # would then prune this rank's allreduce while the root waits for it (Horovod does so too).
        return [reduced if nezha.rank() == root_rank else reduced * tf.cast(0, reduced.dtype)]

    return _differentiable([tensor], forward, backward)[0]


# --- alltoall ---------------------------------------------------------------------------------

def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Horovod's alltoall: `splits[r]` rows of dim 0 go to rank r (equal parts by default).
    Returns the received rows, and the rows received from each rank when `splits` is given."""
    set_id = process_set_id(process_set)
    tensor = tf.convert_to_tensor(tensor)
    check_dtype(tensor, "alltoall")
    if tensor.shape.rank == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    engine_name = op_name("alltoall", name)
    splits_t = (tf.zeros([0], tf.int64) if splits is None
                else tf.cast(tf.reshape(tf.convert_to_tensor(splits), [-1]), tf.int64))
    received = []

    def exchange(array, split_array):
        out, got = nezha.alltoall(array, splits=None if split_array.size == 0
                                  else split_array.tolist(), name=engine_name,
                                  process_set=process_set)
        return [out, got.astype(np.int32)]

    def forward(xs):
        out, got = host_call(exchange, [xs[0], splits_t], [xs[0].dtype, tf.int32],
                             "NezhaAlltoall",
                             lambda lib, ts: lib.nezha_alltoall(
                                 ts[0], ts[1], tensor_name=engine_name, process_set=set_id,
                                 set_size=process_set.size()))
        got.set_shape([process_set.size()])
        received.append(got)
        return _with_shapes([out], [_rows_shape(xs[0])])

    def backward(dys):
        return [alltoall(dys[0], splits=received[0], name=grad_name(name),
                         process_set=process_set)[0]]

    out = _differentiable([tensor], forward, backward)[0]
    return (out, received[0]) if splits is not None else out


# --- reducescatter ----------------------------------------------------------------------------

def grouped_reducescatter_raw(tensors, name, op, prescale_factor, postscale_factor,
                              process_set=global_process_set):
    set_id = process_set_id(process_set)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    for t in tensors:
        check_dtype(t, "reducescatter")
        if t.shape.rank == 0:
            raise ValueError("reducescatter does not support scalar inputs: a 0-d tensor has no "
                             "dimension 0 to scatter")
    if op not in (Sum, Average) and any(t.dtype.is_floating for t in tensors):
        raise NotImplementedError("reducescatter is differentiable only for Sum and Average")
    engine_name = op_name("reducescatter", name)

    def scatter_arrays(*arrays):  # one unit: fused into one operation on the rails
        return nezha.grouped_reducescatter(arrays, op=op, name=engine_name,
                                           prescale_factor=prescale_factor,
                                           postscale_factor=postscale_factor,
                                           process_set=process_set)

    def forward(xs):
        outs = host_call(scatter_arrays, xs, [x.dtype for x in xs], "NezhaReducescatter",
                         lambda lib, ts: lib.nezha_reducescatter(
                             ts, scales(prescale_factor, postscale_factor),
                             tensor_name=engine_name, reduce_op=int(op), process_set=set_id))
        return _with_shapes(outs, [_rows_shape(x) for x in xs])

    def backward(dys):
        factor = (process_set.size() if op == Sum else 1) * prescale_factor * postscale_factor
        dys = [d * tf.cast(factor, d.dtype) if factor != 1 else d for d in dys]
        return grouped_allgather(dys, name=grad_name(name), process_set=process_set)

    return _differentiable(tensors, forward, backward)


# --- join, barrier ----------------------------------------------------------------------------

def join():
    """Horovod's join: this rank is out of data; returns the rank that joined last (an int32
    tensor)."""
    return host_call(lambda: [np.asarray(nezha.join(), np.int32)], [], [tf.int32],
                     "NezhaJoin", lambda lib, _: [lib.nezha_join()])[0]

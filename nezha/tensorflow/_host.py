"""How TensorFlow tensors reach the engine: one host call per collective call site.

Eagerly the call runs at once on the tensors' numpy views. Inside a graph (tf.function, Keras'
train step) it is one stateful `tf.numpy_function`: TensorFlow runs it on one inter-op thread,
which submits every tensor of the call to the engine before it waits for any (a grouped call
fuses a whole step's gradients) and releases the GIL while it waits. Stateful host calls of one
function run in program order (TensorFlow's automatic control dependencies), so every rank
reaches the engine in the same order and no two calls of a step hold two inter-op threads.

Why not an AsyncOpKernel: it binds to the exact TensorFlow build; this path works with any
TensorFlow 2 wheel. Its cost is one Python call per call site per step.
"""
import itertools

import numpy as np
import tensorflow as tf

SUPPORTED_DTYPES = (tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
                    tf.float32, tf.float64, tf.bool)

# Unnamed collectives get names from these counters, in call order eagerly and in trace order in a
# graph (a traced name is then reused by every run of that graph, as Horovod names graph ops).
_eager_names = itertools.count()
_graph_names = itertools.count()


def check_dtype(tensor, what):
    """Raises TypeError naming the op unless the engine carries `tensor`'s dtype."""
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError("%s: dtype %s is not supported (supported: %s)"
                        % (what, tensor.dtype.name, ", ".join(d.name for d in SUPPORTED_DTYPES)))


def op_name(kind, name):
    """The engine name of one call of a `kind` collective (Horovod prefixes names by op kind)."""
    if name is not None:
        return "%s.%s" % (kind, name)
    if tf.executing_eagerly():
        return "%s.tf.eager.%d" % (kind, next(_eager_names))
    return "%s.tf.graph.%d" % (kind, next(_graph_names))


def grad_name(name, suffix="grad"):
    """The name of a backward collective: `<forward name>.grad` when the forward was named."""
    return None if name is None else "%s.%s" % (name, suffix)


def host_call(fn, tensors, out_dtypes, what):
    """Runs `fn(*numpy arrays) -> list of numpy arrays` on `tensors` and returns TF tensors of
    `out_dtypes`: directly when eager (a NezhaError propagates as itself), else as one stateful
    numpy_function (an error reaches the caller as a tf.errors exception carrying its message)."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if tf.executing_eagerly():
        results = fn(*[np.asarray(t.numpy()) for t in tensors])
        return [tf.convert_to_tensor(r, dtype=d) for r, d in zip(results, out_dtypes)]

    def graph_fn(*arrays):
        return tuple(fn(*[np.asarray(a) for a in arrays]))

    outs = tf.numpy_function(graph_fn, tensors, list(out_dtypes), stateful=True, name=what)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]

"""How TensorFlow tensors reach the engine: one call per collective call site.

Eagerly the call runs at once on the tensors' numpy views. Inside a graph (tf.function, Keras'
train step, a tf.compat.v1 session) it is one op of nezha's op library (_ops): an asynchronous
kernel that submits every tensor of the call and returns, completed by nezha._core when the
operation is done, so no TensorFlow thread waits on a peer and ranks may run a graph's collectives
in any order. Stateful, so tf.function's automatic control dependencies still run one function's
collectives in program order. Where the library is unavailable the call is one stateful blocking
`tf.numpy_function` instead (with a warning: see _ops).
"""
import itertools

import numpy as np
import tensorflow as tf

from nezha import NezhaError
from nezha.tensorflow import _ops

SUPPORTED_DTYPES = (tf.uint8, tf.int8, tf.int16, tf.uint16, tf.int32, tf.int64, tf.float16,
                    tf.bfloat16, tf.float32, tf.float64, tf.bool)

# Unnamed collectives get names from these counters, in call order eagerly and in trace order in a
# graph (a traced name is then reused by every run of that graph, as Horovod names graph ops).
_eager_names = itertools.count()
_graph_names = itertools.count()


class CollectiveError(NezhaError, tf.errors.FailedPreconditionError):
    """A collective that failed eagerly: nezha's NezhaError, and also the
    tf.errors.FailedPreconditionError the same call raises inside a graph (as Horovod's ops do)."""

    def __init__(self, message):
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class CollectiveArgumentError(ValueError, tf.errors.InvalidArgumentError):
    """A collective whose arguments were refused eagerly (e.g. alltoall splits that do not add up):
    the ValueError nezha raises, and the tf.errors.InvalidArgumentError the same call raises inside
    a graph (as Horovod's ops do)."""

    def __init__(self, message):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


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


def host_call(fn, tensors, out_dtypes, what, graph_op=None):
    """Runs `fn(*numpy arrays) -> list of numpy arrays` on `tensors` and returns TF tensors of
    `out_dtypes`: directly when eager (an engine error raised as a CollectiveError); in a graph as
    `graph_op(op library, tensors) -> list of tensors` (an error reaches the caller as a
    tf.errors exception carrying the engine's message), or, without the library, as one stateful
    numpy_function running `fn`."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if tf.executing_eagerly():
        try:
            results = fn(*[np.asarray(t.numpy()) for t in tensors])
        except (NezhaError, ValueError) as exc:  # subclasses (NotInitializedError) keep theirs
            if type(exc) is NezhaError:
                raise CollectiveError(str(exc)) from exc
            if type(exc) is ValueError:
                raise CollectiveArgumentError(str(exc)) from exc
            raise
        return [tf.convert_to_tensor(r, dtype=d) for r, d in zip(results, out_dtypes)]
    lib = _ops.library()
    if lib is not None and graph_op is not None:
        return list(graph_op(lib, tensors))
    _ops.warn_host_call_fallback()

    def graph_fn(*arrays):
        return tuple(fn(*[np.asarray(a) for a in arrays]))

    outs = tf.numpy_function(graph_fn, tensors, list(out_dtypes), stateful=True, name=what)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def scales(prescale_factor, postscale_factor):
    """The scale factors as the ops take them: float64, since TensorFlow's float attributes are
    float32 and the engine scales in double precision."""
    return tf.constant([prescale_factor, postscale_factor], tf.float64)

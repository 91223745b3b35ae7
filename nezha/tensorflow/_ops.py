"""nezha.tensorflow's op library: the collectives as TensorFlow ops with asynchronous kernels.

Inside a graph (a tf.compat.v1 session, tf.function) TensorFlow runs ready ops on a few inter-op
threads, in an order that differs between ranks. A kernel that held its thread until its
collective finished could hold every thread of one rank on collectives that another rank has not
submitted yet, because that rank's threads are held the same way. These kernels (core/src/tf_ops)
submit their tensors to the engine and return; the engine matches collectives across ranks by name,
in any order, and a thread of nezha._core's completes each op when its operation is done
(core/src/bindings/tf_engine.cc). No TensorFlow thread waits on a peer, so a graph with any number
of collectives in any order completes.

The library is built with nezha when TensorFlow's C headers are found (CMakeLists.txt), is loaded
with tf.load_op_library and calls the engine nezha._core already runs (a C table, never a second
engine). Where it is missing or does not load, graphs fall back to one blocking numpy_function per
call site, and the first such graph warns with the reason and the risk.
"""
import os
import warnings

import tensorflow as tf

from nezha import _core

LIBRARY_FILE = "_tf_ops.so"  # installed beside nezha._core (CMakeLists.txt)

_state = {"loaded": False, "lib": None, "why_missing": None, "warned": False}


def library_path():
    return os.path.join(os.path.dirname(os.path.abspath(_core.__file__)), LIBRARY_FILE)


def library():
    """The op module (its functions: nezha_allreduce, ...), or None where it is unavailable."""
    if not _state["loaded"]:
        _state["loaded"] = True
        path = library_path()
        if not os.path.exists(path):
            _state["why_missing"] = ("%s was not built (TensorFlow's C headers were not found when "
                                     "nezha was built)" % path)
        else:
            try:
                lib = tf.load_op_library(path)
                _core.tf_bind_ops(path)
                _state["lib"] = lib
            except Exception as exc:  # any reason it cannot load: fall back, and say why
                _state["why_missing"] = "%s did not load: %s" % (path, exc)
    return _state["lib"]


def why_missing():
    """Why library() is None (None when it loaded)."""
    library()
    return _state["why_missing"]


def warn_host_call_fallback():
    """Warns once that graphs run collectives as blocking host calls, and what that risks."""
    if _state["warned"]:
        return
    _state["warned"] = True
    warnings.warn(
        "nezha.tensorflow: %s. Collectives in graphs run as blocking numpy_function host calls: "
        "a graph whose independent collectives outnumber TensorFlow's inter-op threads can "
        "deadlock when ranks run them in different orders (tf.function orders them; a "
        "tf.compat.v1 session does not). Reinstall nezha with TensorFlow installed to build the "
        "op library." % why_missing(), RuntimeWarning, stacklevel=3)

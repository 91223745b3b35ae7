"""nezha.tensorflow on 2 real ranks: collectives x dtypes eagerly and in tf.function against numpy,
Horovod's gradients, DistributedGradientTape, compression, SyncBatchNormalization, a shape
mismatch raising on every rank. One launch runs every check (TensorFlow's import costs seconds)."""
import os

import pytest

pytest.importorskip("tensorflow")

from torch_workers.harness import assert_every_rank_passed, run_workers  # noqa: E402

TF_WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf_workers")

EXPECTED = {"collectives eager", "collectives in tf.function", "gradients", "gradient tape",
            "fp16 compression", "sync batch norm", "broadcast_variables and objects",
            "shape mismatch raises", "api surface"}


@pytest.mark.timeout(200)
def test_tensorflow_ops_and_gradients():
    output = run_workers("w_tf_ops.py", num_ranks=2, timeout_s=180, workers_dir=TF_WORKERS)
    assert_every_rank_passed(output, 2, EXPECTED)


@pytest.mark.timeout(200)
def test_horovod_api_beyond_the_collectives():
    """rank_op and its siblings read when a session runs, broadcast_global_variables,
    IndexedSlices in (grouped) allreduce, PartialDistributedGradientTape, refused arguments
    raising TensorFlow's InvalidArgumentError eagerly, and elastic.TensorFlowState."""
    expected = {"layout ops", "broadcast_global_variables", "IndexedSlices",
                "PartialDistributedGradientTape", "argument errors", "elastic state"}
    output = run_workers("w_tf_horovod_api.py", num_ranks=2, timeout_s=180,
                         workers_dir=TF_WORKERS)
    assert_every_rank_passed(output, 2, expected)


def test_nezha_imports_without_tensorflow_or_keras():
    import subprocess
    import sys
    code = ("import sys, nezha; bad = [m for m in ('tensorflow', 'keras') if m in sys.modules]; "
            "sys.exit('imported %s' % bad if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.timeout(240)
def test_tensorflow_and_keras_process_sets():
    expected = {"collectives eager", "collectives in tf.function", "gradients", "gradient tape",
                "keras optimizer", "gradient reducers outside their set", "errors"}
    output = run_workers("w_tf_process_sets.py", num_ranks=3, timeout_s=220, workers_dir=TF_WORKERS)
    assert_every_rank_passed(output, 3, expected)


@pytest.mark.timeout(200)
def test_graph_collectives_in_any_order_complete():
    """A tf.compat.v1 session and a function without control dependencies, each with 30
    collectives (2 inter-op threads) reached in a different order on each of 3 ranks, complete with
    numpy's results; so do 24 allreduces in a tf.function, and a mismatch fails every rank with a
    TensorFlow error. With kernels that block a thread per collective the first graph hangs."""
    expected = {"collectives in any order complete",
                "function without control dependencies completes",
                "tf.function with 24 allreduces", "independent collectives complete",
                "mismatch in a graph raises", "broadcast gradient in a session"}
    output = run_workers("w_tf_graph_order.py", num_ranks=3, timeout_s=150, workers_dir=TF_WORKERS)
    assert_every_rank_passed(output, 3, expected)


def test_op_library_loads_and_graphs_fall_back_with_a_warning_without_it():
    """The op library is built beside nezha._core and loads; where it is missing, a graph still
    runs its collectives (as blocking host calls) and the first one warns why and what it risks."""
    import subprocess
    import sys
    code = """if True:
        import os, warnings
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        import tensorflow as tf
        import nezha.tensorflow as hvd
        from nezha.tensorflow import _ops
        hvd.init()
        assert _ops.library() is not None, _ops.why_missing()
        _ops._state.update(loaded=False, lib=None, why_missing=None)
        _ops.library_path = lambda: "/nonexistent/" + _ops.LIBRARY_FILE
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum))(tf.constant([1.0, 2.0]))
        assert got.numpy().tolist() == [1.0, 2.0], got
        messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert any("was not built" in m and "deadlock" in m for m in messages), messages
        print("ok")
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr

"""nezha.keras on 2 real ranks, per Keras backend: model.fit with DistributedOptimizer equals one
process training on the concatenated batches, and every callback's effect (tf_workers/
w_keras_fit.py). The JAX backend runs once nezha.jax (its in-jit grouped allreduce) exists."""
import importlib.util
import os

import pytest

pytest.importorskip("keras")

from torch_workers.harness import assert_every_rank_passed, run_workers  # noqa: E402

TF_WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf_workers")
CHECKS = {"fit equals one process", "loss scale optimizer", "fp16 compression",
          "backward_passes_per_step", "warmup learning rate", "metric average",
          "best model checkpoint", "load_model", "keras tensors"}


def _needs(backend):
    if backend == "tensorflow":
        pytest.importorskip("tensorflow")
    elif backend == "torch":
        pytest.importorskip("torch")
    elif importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    else:
        try:
            import nezha.jax  # noqa: F401
        except ImportError as exc:
            pytest.skip("nezha.jax is not importable (%s)" % exc)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["tensorflow", "torch", "jax"])
def test_keras_fit_on_backend(backend, tmp_path):
    _needs(backend)
    expected = set(CHECKS)
    output = run_workers("w_keras_fit.py", num_ranks=2, timeout_s=280,
                         args=(backend, str(tmp_path)), workers_dir=TF_WORKERS)
    assert_every_rank_passed(output, 2, expected)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["tensorflow", "torch", "jax"])
def test_keras_learning_rate_callbacks_follow_horovod(backend):
    """Horovod's warmup case (3 ranks, 6 steps per epoch, warmup over 2 epochs): every batch's rate is
    Horovod's, the last warmup batch runs at initial_lr; momentum correction is applied where the
    step runs eagerly and refused with a warning where Keras compiles it (tf_workers/w_keras_lr.py)."""
    _needs(backend)
    output = run_workers("w_keras_lr.py", num_ranks=3, timeout_s=280, args=(backend,),
                         workers_dir=TF_WORKERS)
    assert_every_rank_passed(output, 3, {
        "warmup rate per batch", "schedule callback",
        "momentum correction where the step runs eagerly",
        "momentum correction refused where the step is compiled"})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_keras_optimizer_of_a_process_set_on_backend(backend):
    """DistributedOptimizer(process_set=...) on the torch and JAX backends (the TensorFlow backend's
    is in test_tensorflow.py): members reduce over the set, a rank outside steps on its own."""
    _needs(backend)
    output = run_workers("w_keras_process_sets.py", num_ranks=3, timeout_s=280, args=(backend,),
                         workers_dir=TF_WORKERS)
    assert_every_rank_passed(output, 3, {"keras optimizer of a set"})

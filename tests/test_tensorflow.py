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

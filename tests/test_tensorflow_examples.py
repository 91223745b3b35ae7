"""The TensorFlow/Keras examples run as a user would run them (nezharun, 2 ranks): the Keras
example learns, and the TF2 synthetic benchmark trains with fp16 compression (compression
itself is checked against numpy in test_tensorflow.py and test_keras.py)."""
import json
import re

import pytest

from conftest import REPO, run_example

pytest.importorskip("tensorflow")

SMALL = ["--model", "mlp", "--image-size", "32", "--batch-size", "8", "--num-warmup-batches", "1",
         "--num-batches-per-iter", "2", "--num-iters", "2"]


@pytest.mark.timeout(180)
def test_keras_example_learns():
    out = run_example(REPO / "examples/keras_mnist_like.py", "--epochs", "2", "--train-samples",
                      "1024", "--test-samples", "256", env={"KERAS_BACKEND": "tensorflow"})
    before = re.search(r"before training: test loss ([\d.]+), accuracy ([\d.]+)%", out)
    epochs = re.findall(r"epoch \d+: train loss [\d.]+, test loss ([\d.]+), "
                        r"test accuracy ([\d.]+)%", out)
    assert before and len(epochs) == 2, out
    last_loss, last_accuracy = (float(v) for v in epochs[-1])
    assert last_loss < 0.5 * float(before.group(1)), out
    assert last_accuracy >= 60.0, out  # chance is 10%


@pytest.mark.timeout(180)
def test_tf2_synthetic_benchmark_trains_with_fp16(tmp_path):
    run_example(REPO / "examples/tensorflow2_synthetic_benchmark.py", *SMALL, "--num-threads", "1",
                "--fp16-allreduce", "--json", tmp_path / "fp16.json")
    result = json.loads((tmp_path / "fp16.json").read_text())
    assert len(result["losses"]) == 1 + 1 + 2 * 2 and result["img_sec_per_rank"] > 0
    assert result["losses"][-1] < result["losses"][0]  # it trains (same batch every step)

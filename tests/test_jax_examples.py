"""The JAX examples run as a user would run them (nezharun, 2 ranks) and do what they say."""
import json
import re

import pytest

from conftest import REPO, run_example

pytest.importorskip("jax")
pytest.importorskip("flax")


@pytest.mark.timeout(180)
def test_flax_mlp_example_learns():
    out = run_example(REPO / "examples/jax_flax_mlp.py", "--epochs", "2", "--train-samples", "2048")
    before = re.search(r"before training: test loss ([\d.]+), accuracy ([\d.]+)%", out)
    epochs = re.findall(r"epoch \d+: train loss [\d.]+, test loss ([\d.]+), accuracy ([\d.]+)%", out)
    assert before and len(epochs) == 2, out
    assert float(epochs[-1][0]) < 0.5 * float(before.group(1)), out
    assert float(epochs[-1][1]) >= 60.0, out  # chance is 20%


@pytest.mark.timeout(180)
def test_jax_synthetic_benchmark_runs(tmp_path):
    out = run_example(REPO / "examples/jax_synthetic_benchmark.py", "--model", "mlp", "--batch-size", "8",
                      "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "2",
                      "--fp16-allreduce", "--json", tmp_path / "fp16.json")
    assert "Total img/sec on 2 rank(s)" in out, out
    result = json.loads((tmp_path / "fp16.json").read_text())
    assert result["ranks"] == 2 and len(result["losses"]) == 1 + 2 * 2
    assert all(l == l and l < 50 for l in result["losses"]), result  # finite
    assert result["losses"][-1] < result["losses"][0], result  # trains on its fixed batch

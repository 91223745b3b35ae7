"""The examples run as a user would run them (nezharun, 2 ranks) and do what they say: the MNIST-like
example learns, and the synthetic benchmark trains exactly like torch DDP (Gloo) on the same data."""

import json
import re

import pytest

from conftest import REPO, run_example

from nezha.bench.gloo_baseline import pick_free_port

pytest.importorskip("torch")

SYNTHETIC = ["--model", "mlp", "--batch-size", "8", "--num-warmup-batches", "1",
             "--num-batches-per-iter", "2", "--num-iters", "2", "--num-threads", "1"]


@pytest.mark.timeout(180)
def test_mnist_like_example_learns():
    out = run_example(REPO / "examples/pytorch_mnist_like.py", "--epochs", "3", "--train-samples", "2048",
                      "--test-samples", "512")
    before = re.search(r"before training: test loss ([\d.]+), accuracy ([\d.]+)%", out)
    epochs = re.findall(r"epoch \d+: train loss [\d.]+, test loss ([\d.]+), test accuracy ([\d.]+)%", out)
    assert before and len(epochs) == 3, out
    first_loss = float(before.group(1))
    last_loss, last_accuracy = (float(v) for v in epochs[-1])
    assert last_loss < 0.9 * first_loss, out
    assert last_accuracy >= 30.0, out  # chance is 10%


@pytest.mark.timeout(240)
def test_synthetic_benchmark_trains_like_torch_ddp(tmp_path):
    run_example(REPO / "examples/pytorch_synthetic_benchmark.py", *SYNTHETIC, "--json", tmp_path / "nezha.json")
    run_example(REPO / "examples/pytorch_synthetic_benchmark.py", *SYNTHETIC, "--fp16-allreduce",
                "--json", tmp_path / "fp16.json")
    run_example(REPO / "benchmarks/ddp_synthetic_benchmark.py", *SYNTHETIC, "--master-addr", "127.0.0.1",
                "--master-port", pick_free_port("127.0.0.1"), "--gloo-ifname", "lo",
                "--json", tmp_path / "ddp.json")
    nezha, fp16, ddp = (json.loads((tmp_path / n).read_text())["losses"] for n in ("nezha.json", "fp16.json", "ddp.json"))
    assert len(nezha) == len(ddp) == 1 + 2 * 2
    assert nezha == pytest.approx(ddp, rel=1e-5)  # the same averaged gradients, summed in another order
    assert fp16 == pytest.approx(ddp, rel=1e-2)   # gradients rounded to fp16 on the wire
    assert fp16 != nezha

"""nezha.torch with tensors on a device: results stay there, equal the CPU references, and CUDA
tensors are staged through pinned host memory in stream order. The CUDA case runs where a GPU is."""

import pytest

from torch_workers.harness import assert_every_rank_passed, run_workers

torch = pytest.importorskip("torch")

CHECKS = ["allreduce on %s", "other ops on %s", "stream order on %s", "DistributedOptimizer on %s"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
])
def test_ops_and_training_on_device(device):
    output = run_workers("w_device.py", num_ranks=2, timeout_s=150, args=(device,))
    extra = {"Horovod's CUDA semantics on cuda"} if device == "cuda" else set()
    assert_every_rank_passed(output, 2, {c % device for c in CHECKS} | extra)

"""Horovod's semantics for CUDA tensors (issue 39) where no GPU is needed to check them: tensors
flagged as a GPU's through nezha.torch's device decision scale float16 in half precision (bits
against torch computed as Horovod's GPU kernels compute), a CPU/GPU mismatch raises on every rank,
a group mixing devices is refused, alltoall's received_splits follow the splits' device, and
DistributedOptimizer._parameter_names (torch_workers/w_gpu_semantics.py). The same with real CUDA
tensors is tests/test_torch_device.py's, on a GPU machine."""

import pytest

from torch_workers.harness import assert_every_rank_passed, run_workers

pytest.importorskip("torch")

EXPECTED = {"float16 scaled as on a GPU", "CPU/GPU mismatch raises on every rank",
            "alltoall received_splits on the splits' device", "_parameter_names"}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("num_ranks", [2, 3])
def test_gpu_semantics_on_the_cpu(num_ranks):
    output = run_workers("w_gpu_semantics.py", num_ranks=num_ranks, timeout_s=200)
    assert_every_rank_passed(output, num_ranks, EXPECTED)
